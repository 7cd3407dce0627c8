r"""One call to quantize a SpikingJelly network: :func:`quantize_model`, :class:`QuantConfig`.

(:func:`~snnquant.summary.summary` lives in :mod:`snnquant.summary`; it stays importable from here.)
"""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import neuron

from .nn.layers import QuantConv1d, QuantConv2d, QuantLinear
from .nn.neurons import BACKENDS, QuantIFNode, QuantLIFNode, QuantParametricLIFNode
from .nn.quantizers import (BinaryQuantizer, LSQQuantizer, MinMaxQuantizer, QuantizedBits,
                            StateQuant, TernaryQuantizer, UniformQuantizer,
                            WeightGridBiasQuantizer)
from .nn.neurons import uniform_membrane_step
from .summary import Summary, summary  # noqa: F401  (still importable from snnquant.convert)
from .utils import copy_model

__all__ = ["QuantConfig", "QuantReport", "ReplacedModule", "SkippedModule", "quantize_model",
           "WEIGHT_QUANTIZERS", "MEMBRANE_QUANTIZERS"]

WEIGHT_QUANTIZERS = ("lsq", "lsq_pow2", "minmax", "quantized_bits", "ternary")
MEMBRANE_QUANTIZERS = ("uniform", "threshold_centered", "lsq")


@dataclass
class QuantConfig:
    r"""What :func:`quantize_model` does to each layer and neuron.

    Args:
        weight_bits: bit width of synaptic weights (1..32), or ``None`` to leave layers as they are.
            1 means binary weights :math:`\alpha\,\mathrm{sign}(w)`
            (:class:`~snnquant.nn.BinaryQuantizer`, learned :math:`\alpha` initialised to
            :math:`\mathrm{mean}|w|`, a power of two with ``'lsq_pow2'``, any with ``'lsq'``; the
            other weight quantizers refuse 1 bit).
        weight_quantizer: ``'lsq_pow2'`` (default: learned step restricted to powers of two, so
            that the network exports to integers exactly, see :mod:`snnquant.export`), ``'lsq'``
            (learned step, Esser et al. 2020, any positive step), ``'minmax'`` (EMA min/max range),
            ``'quantized_bits'`` (QKeras, fixed range :math:`[-1, 1)`) or ``'ternary'``
            (:math:`\{-\alpha, 0, +\alpha\}`, :class:`~snnquant.nn.TernaryQuantizer`: TWN's
            threshold :math:`0.7\,\mathrm{mean}|w|`, learned power-of-two :math:`\alpha`; it
            needs ``weight_bits=2``, the width its values are stored in, and refuses any other).
        per_channel: one step/range per output channel (``'lsq'``, ``'lsq_pow2'``, ``'minmax'``).
        bias_bits: bit width of biases (default 16), quantized on the layer's weight grid
            (:class:`~snnquant.nn.WeightGridBiasQuantizer`: integer biases in accumulator units),
            or ``None`` to keep float biases (which the integer export refuses: a float bias is
            not an integer on any grid).
        v_bits: bit width of membrane potentials (2..32), or ``None`` to leave neurons as they are.
        membrane_quantizer: ``'uniform'`` (:math:`2^b` levels with a power-of-two step covering
            :math:`[-2V_{th}, 2V_{th})`, :func:`~snnquant.nn.neurons.uniform_membrane_step`),
            ``'threshold_centered'`` (snnTorch/SQUAT exponential levels centred on the
            threshold) or ``'lsq'`` (learned step).
        backend: neuron backend, ``'torch'``, ``'cupy'`` or ``'auto'``.
        skip: glob patterns on qualified module names (``'fc.*'``, ``'0'``) left unquantized.
        overrides: ``{pattern: {field: value}}``: per-module changes of the fields above; the first
            matching pattern wins.
    """

    weight_bits: Optional[int] = 8
    weight_quantizer: str = "lsq_pow2"
    per_channel: bool = False
    bias_bits: Optional[int] = 16
    v_bits: Optional[int] = None
    membrane_quantizer: str = "uniform"
    backend: str = "torch"
    skip: Sequence[str] = ()
    overrides: Dict[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` (listing the valid choices) for any invalid field."""
        for name in ("weight_bits", "bias_bits", "v_bits"):
            value = getattr(self, name)
            low = 1 if name == "weight_bits" else 2
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 32:
                    raise ValueError(f"{name} must be None or an int in [{low}, 32], got {value!r}")
        if self.weight_quantizer not in WEIGHT_QUANTIZERS:
            raise ValueError(f"weight_quantizer must be one of {WEIGHT_QUANTIZERS}, got "
                             f"{self.weight_quantizer!r}")
        if self.weight_quantizer == "ternary" and self.weight_bits not in (None, 2):
            raise ValueError(f"weight_quantizer='ternary' stores -1/0/+1 in 2 bits: weight_bits "
                             f"must be 2 (or None), got {self.weight_bits!r}")
        if self.weight_bits == 1 and self.weight_quantizer not in ("lsq", "lsq_pow2"):
            raise ValueError(f"weight_bits=1 (binary weights, learned alpha) needs "
                             f"weight_quantizer 'lsq_pow2' or 'lsq', got {self.weight_quantizer!r}")
        if self.membrane_quantizer not in MEMBRANE_QUANTIZERS:
            raise ValueError(f"membrane_quantizer must be one of {MEMBRANE_QUANTIZERS}, got "
                             f"{self.membrane_quantizer!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if isinstance(self.skip, str):
            raise ValueError(f"skip must be a list of glob patterns, got the string {self.skip!r}")
        valid = {f.name for f in dataclasses.fields(self)} - {"skip", "overrides"}
        for pattern, change in dict(self.overrides).items():
            if not isinstance(change, dict):
                raise ValueError(f"overrides[{pattern!r}] must be a dict, got {change!r}")
            unknown = set(change) - valid
            if unknown:
                raise ValueError(f"overrides[{pattern!r}] has unknown fields {sorted(unknown)}; "
                                 f"valid fields: {sorted(valid)}")
            dataclasses.replace(self, overrides={}, skip=(), **change)  # validates the values

    def for_module(self, name: str) -> "QuantConfig":
        """The configuration that applies to module ``name`` (after ``overrides``)."""
        for pattern, change in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                return dataclasses.replace(self, overrides={}, **change)
        return self


class ReplacedModule(NamedTuple):
    """A module that :func:`quantize_model` replaced: ``(name, old_type, new_type)``."""
    name: str
    old_type: str
    new_type: str


class SkippedModule(NamedTuple):
    """A module that :func:`quantize_model` left alone: ``(name, old_type, reason)``."""
    name: str
    old_type: str
    reason: str


@dataclass
class QuantReport:
    """What :func:`quantize_model` did: ``replaced`` and ``skipped`` modules."""
    replaced: List[ReplacedModule] = field(default_factory=list)
    skipped: List[SkippedModule] = field(default_factory=list)

    def __str__(self):
        lines = [f"replaced {len(self.replaced)} modules, skipped {len(self.skipped)}"]
        lines += [f"  {r.name}: {r.old_type} -> {r.new_type}" for r in self.replaced]
        lines += [f"  {s.name}: {s.old_type} skipped ({s.reason})" for s in self.skipped]
        return "\n".join(lines)


def _weight_quantizer(cfg: QuantConfig, bits: int, num_channels: int):
    kind = cfg.weight_quantizer
    if kind == "ternary":
        return TernaryQuantizer(alpha="learned", threshold=0.7, per_channel=cfg.per_channel,
                                channel_dim=0, power_of_two=True, num_channels=num_channels)
    if bits == 1:
        return BinaryQuantizer(alpha="learned", per_channel=cfg.per_channel, channel_dim=0,
                               power_of_two=kind == "lsq_pow2", num_channels=num_channels)
    if kind in ("lsq", "lsq_pow2"):
        return LSQQuantizer(bits, signed=True, per_channel=cfg.per_channel, channel_dim=0,
                            power_of_two=kind == "lsq_pow2", num_channels=num_channels)
    if kind == "minmax":
        return MinMaxQuantizer(bits, symmetric=True, per_channel=cfg.per_channel, channel_dim=0)
    return QuantizedBits(bits, integer=0, symmetric=True, keep_negative=True)


def _membrane_quantizer(cfg: QuantConfig, v_threshold: float):
    bits = cfg.v_bits
    if cfg.membrane_quantizer == "uniform":
        return UniformQuantizer(bits, step=uniform_membrane_step(v_threshold, bits))
    if cfg.membrane_quantizer == "threshold_centered":
        return StateQuant(num_bits=bits, uniform=False, thr_centered=True, threshold=v_threshold)
    return LSQQuantizer(bits, signed=True)


_LAYER_MAP = {
    nn.Linear: QuantLinear,
    nn.Conv1d: QuantConv1d,
    nn.Conv2d: QuantConv2d,
}
_NEURON_MAP = {
    neuron.IFNode: QuantIFNode,
    neuron.LIFNode: QuantLIFNode,
    neuron.ParametricLIFNode: QuantParametricLIFNode,
}
_QUANT_TYPES = (QuantLinear, QuantConv1d, QuantConv2d, QuantIFNode, QuantLIFNode,
                QuantParametricLIFNode)


def _layer_target(module):
    if isinstance(module, _QUANT_TYPES):
        return None
    for base_cls, q_cls in _LAYER_MAP.items():
        if type(module) is base_cls or (isinstance(module, base_cls) and type(module).__module__
                                        .startswith("spikingjelly.activation_based.layer")):
            return q_cls
    return None


def _neuron_target(module):
    if isinstance(module, _QUANT_TYPES):
        return None
    return _NEURON_MAP.get(type(module))


def _convert_layer(module, q_cls, cfg: QuantConfig):
    w = module.weight
    step_mode = getattr(module, "step_mode", "s")
    if q_cls is QuantLinear:
        new = QuantLinear(module.in_features, module.out_features, bias=module.bias is not None,
                          step_mode=step_mode, weight_quant=None)
    else:
        new = q_cls(module.in_channels, module.out_channels, module.kernel_size,
                    stride=module.stride, padding=module.padding, dilation=module.dilation,
                    groups=module.groups, bias=module.bias is not None,
                    padding_mode=module.padding_mode, step_mode=step_mode, weight_quant=None)
    new.weight = module.weight
    new.bias = module.bias
    new.weight_quant = _weight_quantizer(cfg, cfg.weight_bits, w.shape[0])
    if cfg.bias_bits is not None and module.bias is not None:
        new.bias_quant = WeightGridBiasQuantizer(cfg.bias_bits).bind(new)
    for q in (new.weight_quant, new.bias_quant):
        if q is not None:  # quantizer parameters and buffers follow the layer's device and dtype
            q.to(device=w.device, dtype=w.dtype if w.is_floating_point() else None)
    new.train(module.training)
    return new


def _convert_neuron(module, q_cls, cfg: QuantConfig, device=None, dtype=None):
    kw = dict(v_threshold=module.v_threshold, v_reset=module.v_reset,
              surrogate_function=module.surrogate_function, detach_reset=module.detach_reset,
              step_mode=module.step_mode, store_v_seq=module.store_v_seq,
              v_quant=_membrane_quantizer(cfg, module.v_threshold), backend=cfg.backend)
    if q_cls is QuantLIFNode:
        new = QuantLIFNode(tau=module.tau, decay_input=module.decay_input, **kw)
    elif q_cls is QuantParametricLIFNode:
        new = QuantParametricLIFNode(decay_input=module.decay_input, **kw)
        new.w = module.w
    else:
        new = QuantIFNode(**kw)
    new._neuron_precision = getattr(module, "_neuron_precision", None)
    params = list(module.parameters())
    if params:  # PLIF: its own parameter says where it lives
        device, dtype = params[0].device, params[0].dtype
    if device is not None:
        new.to(device=device, dtype=dtype)
    new.train(module.training)
    return new


def _is_unsupported_neuron(module) -> bool:
    from spikingjelly.activation_based.neuron import BaseNode, SimpleBaseNode
    return isinstance(module, (BaseNode, SimpleBaseNode)) and not isinstance(module, _QUANT_TYPES) \
        and type(module) not in _NEURON_MAP


def quantize_model(model: nn.Module, config: Optional[QuantConfig] = None, inplace: bool = False):
    r"""Replace the supported layers and neurons of ``model`` by quantized ones.

    ``nn.Linear/Conv1d/Conv2d`` (and SpikingJelly's ``layer.*`` versions) become
    :class:`~snnquant.nn.QuantLinear`/``QuantConv1d``/``QuantConv2d`` with a weight quantizer of
    ``config.weight_bits``; ``IFNode``/``LIFNode``/``ParametricLIFNode`` become the quantized neurons
    with a membrane quantizer of ``config.v_bits``. Weights, biases, neuron hyper-parameters,
    surrogate functions, ``step_mode``, device, dtype and ``requires_grad`` are kept (the very same
    parameter tensors are reused). Any ``nn.Module`` tree works, including SpikingJelly containers.

    Args:
        model: the network.
        config: a :class:`QuantConfig` (default: ``QuantConfig()``, 8-bit LSQ weights).
        inplace: modify ``model`` itself instead of a deep copy.

    Returns:
        ``(quantized_model, report)`` with ``report.replaced`` and ``report.skipped``. Neurons of an
        unsupported type are listed in ``report.skipped`` with the reason. A model with nothing to
        quantize gives a warning and an empty report.
    """
    if config is None:
        config = QuantConfig()
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
    config.validate()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not inplace:
        model = copy_model(model)
    report = QuantReport()
    # neurons have no parameters of their own (but PLIF): their quantizers follow the model
    ref = next((t for t in list(model.parameters()) + list(model.buffers())
                if t.is_floating_point()), None)
    model_device = ref.device if ref is not None else None
    model_dtype = ref.dtype if ref is not None else None

    def visit(parent: nn.Module, prefix: str):
        for child_name, child in list(parent.named_children()):
            name = f"{prefix}.{child_name}" if prefix else child_name
            old_type = type(child).__name__
            layer_cls = _layer_target(child)
            neuron_cls = _neuron_target(child)
            target = layer_cls or neuron_cls
            if target is not None:
                if any(fnmatch.fnmatchcase(name, p) for p in config.skip):
                    report.skipped.append(SkippedModule(name, old_type, "matches a skip pattern"))
                    continue
                cfg = config.for_module(name)
                if layer_cls is not None and cfg.weight_bits is None:
                    report.skipped.append(SkippedModule(name, old_type, "weight_bits is None"))
                    continue
                if neuron_cls is not None and cfg.v_bits is None:
                    report.skipped.append(SkippedModule(name, old_type, "v_bits is None"))
                    continue
                new = (_convert_layer(child, layer_cls, cfg) if layer_cls is not None
                       else _convert_neuron(child, neuron_cls, cfg, model_device, model_dtype))
                setattr(parent, child_name, new)
                report.replaced.append(ReplacedModule(name, old_type, type(new).__name__))
                continue
            if _is_unsupported_neuron(child):
                report.skipped.append(SkippedModule(
                    name, old_type, f"unsupported neuron type {old_type}; supported: "
                    f"{[c.__name__ for c in _NEURON_MAP]}"))
                continue
            visit(child, name)

    visit(model, "")
    if not report.replaced:
        warnings.warn("quantize_model found nothing to quantize in "
                      f"{type(model).__name__}; returning it unchanged", stacklevel=2)
    sjf.invalidate_reset_cache(model)
    return model, report

