r"""One call to quantize a SpikingJelly network: :func:`quantize_model`, :class:`QuantConfig`."""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf

from .functional import check_bit_width, pow2_exponent
from .functional.state import STATE_QUANT_MAX_BITS
from .kernels.dispatch import DEFAULT_BACKEND
from .nn.neurons import BACKENDS, QuantParametricLIFNode
from .nn.quantizers import (MEMBRANE_QUANTIZERS, BinaryQuantizer, LSQQuantizer, MinMaxQuantizer,
                            QuantizedBits, TernaryQuantizer, WeightGridBiasQuantizer,
                            make_membrane_quantizer)
from .capture import charged_neuron, plan_folding
from .capture.plan import NEEDS_EXAMPLE_INPUT
from .nn import registry
from .nn.batchnorm import foldable_batchnorm
from .utils import copy_model

__all__ = ["QuantConfig", "QuantConfigTypeError", "QuantReport", "ReplacedModule", "SkippedModule", "quantize_model",
           "WEIGHT_QUANTIZERS", "MEMBRANE_QUANTIZERS"]

WEIGHT_QUANTIZERS = ("lsq", "lsq_pow2", "minmax", "quantized_bits", "ternary")


def _or_none(error: Exception) -> str:
    """A bit-width error of :func:`check_bit_width` for a field that may also be None."""
    return str(error).replace(" must be an int ", " must be None or an int ", 1)


class QuantConfigTypeError(TypeError, ValueError):
    """A :class:`QuantConfig` field of the wrong type (both a ``TypeError`` and a ``ValueError``)."""


def __getattr__(name):
    # Deprecated: summary moved to snnquant.summary, a floor above convert. Reached only by the
    # old spelling `from snnquant.convert import summary`; convert itself never imports it.
    if name in ("summary", "Summary"):
        import importlib
        warnings.warn(f"snnquant.convert.{name} is deprecated: import it from snnquant "
                      f"(from snnquant import {name})", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("snnquant.summary"), name)
    raise AttributeError(f"module 'snnquant.convert' has no attribute {name!r}")


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
        backend: neuron backend, ``'torch'``, ``'cupy'``, ``'cpp'`` or ``'auto'`` (default; see
            :mod:`snnquant.kernels.dispatch`).
        fold_batchnorm: train every quantized ``Linear``/``Conv`` layer followed by a BatchNorm
            that :func:`~snnquant.export.fold_batchnorm` can fold as the folded layer (default
            ``True``; :mod:`snnquant.nn.batchnorm`): the weight quantizer sees
            :math:`W\gamma/\sqrt{\sigma^2+\epsilon}`, evaluation runs exactly the folded
            layer, and folding after training changes no weight and no spike. The folded bias is
            quantized with ``bias_bits`` on the finer of the weight grid and the membrane grid of
            the neuron it charges (where fold_batchnorm puts it). ``False`` quantizes :math:`W`
            before the BatchNorm, as before (folding then changes the network at low bits).
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
    backend: str = DEFAULT_BACKEND
    fold_batchnorm: bool = True
    skip: Sequence[str] = ()
    overrides: Dict[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` (listing the valid choices) for any invalid field.

        A value of the wrong type (``per_channel="per_tensor"``, ``weight_bits=4.0``,
        ``skip="fc"``) raises an error that is both a ``ValueError`` and a ``TypeError``, naming
        the field and the value.
        """
        for name in ("weight_bits", "bias_bits", "v_bits"):
            value = getattr(self, name)
            if value is not None:
                try:  # stored as an int (a NumPy integer is accepted)
                    setattr(self, name, check_bit_width(value, name, 1 if name == "weight_bits"
                                                        else 2, 32))
                except TypeError as exc:
                    raise QuantConfigTypeError(_or_none(exc)) from None
                except ValueError as exc:
                    raise ValueError(_or_none(exc)) from None
        for name in ("per_channel", "fold_batchnorm"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise QuantConfigTypeError(f"{name} must be True or False, got {value!r} "
                                           f"({type(value).__name__})")
        for name, choices in (("weight_quantizer", WEIGHT_QUANTIZERS),
                              ("membrane_quantizer", MEMBRANE_QUANTIZERS), ("backend", BACKENDS)):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise QuantConfigTypeError(f"{name} must be one of {tuple(choices)}, got {value!r} "
                                           f"({type(value).__name__})")
            if value not in choices:
                raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
        if self.weight_quantizer == "ternary" and self.weight_bits not in (None, 2):
            raise ValueError(f"weight_quantizer='ternary' stores -1/0/+1 in 2 bits: weight_bits "
                             f"must be 2 (or None), got {self.weight_bits!r}")
        if self.weight_bits == 1 and self.weight_quantizer not in ("lsq", "lsq_pow2"):
            raise ValueError(f"weight_bits=1 (binary weights, learned alpha) needs "
                             f"weight_quantizer 'lsq_pow2' or 'lsq', got {self.weight_quantizer!r}")
        if self.membrane_quantizer == "threshold_centered" and (self.v_bits or 0) > STATE_QUANT_MAX_BITS:
            raise ValueError(f"v_bits={self.v_bits} is above the limit of {STATE_QUANT_MAX_BITS} bits "
                             "of membrane_quantizer='threshold_centered' (a table of 2**v_bits levels)")
        if isinstance(self.skip, str):
            raise QuantConfigTypeError(f"skip must be a list of glob patterns, got the string "
                                       f"{self.skip!r}")
        if not isinstance(self.skip, (list, tuple)) or \
                not all(isinstance(p, str) for p in self.skip):
            raise QuantConfigTypeError(f"skip must be a list of glob patterns (strings), got "
                                       f"{self.skip!r}")
        if not isinstance(self.overrides, dict):
            raise QuantConfigTypeError(f"overrides must be a dict {{pattern: {{field: value}}}}, "
                                       f"got {self.overrides!r}")
        valid = {f.name for f in dataclasses.fields(self)} - {"skip", "overrides"}
        for pattern, change in self.overrides.items():
            if not isinstance(pattern, str):
                raise QuantConfigTypeError(f"overrides keys must be glob patterns (strings), got "
                                           f"{pattern!r}")
            if not isinstance(change, dict):
                raise QuantConfigTypeError(f"overrides[{pattern!r}] must be a dict, got {change!r}")
            unknown = set(change) - valid
            if unknown:
                raise ValueError(f"overrides[{pattern!r}] has unknown fields {sorted(unknown)}; "
                                 f"valid fields: {sorted(valid)}")
            try:
                dataclasses.replace(self, overrides={}, skip=(), **change)  # validates the values
            except ValueError as exc:
                raise type(exc)(f"overrides[{pattern!r}]: {exc}") from None

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
    r"""What :func:`quantize_model` did.

    Attributes:
        replaced: the replaced modules, one entry per position (a module used at two places
            appears under both names).
        skipped: every module left as it was that carries weights or state (parameters,
            buffers, a membrane), with the reason.
        shared: groups of names that are one module (quantized once, the same quantized module
            at every position).
        notes: what the quantized network still needs before an exact integer export (for
            example a learned :math:`\tau` of a ``ParametricLIFNode``).
        folded: ``(layer name, BatchNorm name)`` of every pair trained as the folded layer
            (``QuantConfig.fold_batchnorm``, :mod:`snnquant.nn.batchnorm`); a BatchNorm not
            folded during training is in ``skipped`` with the reason.
        hooks: the hooks moved from a replaced module to its replacement, one line per module
            and kind (``"0: 2 forward hooks (record, log) moved to QuantLinear"``); forward
            pre-hooks and hooks, and backward pre-hooks and hooks, keep their order and the
            handles that registered them.
        deployability: with ``example_input``, the
            :class:`~snnquant.deployability.DeployReport` for ``destination``: every reason the
            trained network would be refused, each with its fix (``None`` without
            ``example_input`` or with ``destination=None``).
    """
    replaced: List[ReplacedModule] = field(default_factory=list)
    skipped: List[SkippedModule] = field(default_factory=list)
    shared: List[List[str]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    folded: List[tuple] = field(default_factory=list)
    hooks: List[str] = field(default_factory=list)
    deployability: Optional[object] = None

    def __str__(self):
        same = {n: group[0] for group in self.shared for n in group[1:]}
        lines = [f"replaced {len(self.replaced)} modules, skipped {len(self.skipped)}"]
        lines += [f"  {r.name}: {r.old_type} -> {r.new_type}"
                  + (f" (the same module as {same[r.name]})" if r.name in same else "")
                  for r in self.replaced]
        lines += [f"  {s.name}: {s.old_type} skipped ({s.reason})" for s in self.skipped]
        lines += [f"  {bn}: folded into {syn} during training" for syn, bn in self.folded]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"hooks: {h}" for h in self.hooks]
        if self.deployability is not None:
            lines.append(str(self.deployability))
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


_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm,)
_NO_QUANTIZED_VERSION = (nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _layer_target(module) -> Optional[registry.LayerKind]:
    if isinstance(module, registry.quantized_classes()):
        return None
    if _has_parametrized_class(module):
        return _parametrized_layer_target(module)
    for kind in registry.LAYER_KINDS:
        if type(module) is kind.float_cls or (isinstance(module, kind.float_cls) and type(
                module).__module__.startswith(_SJ_LAYER) and not _own_computation(
                module, kind.float_cls)):
            return kind
    return None


_SJ_LAYER = "spikingjelly.activation_based.layer"
# methods through which a subclass changes what the layer computes
_COMPUTING_METHODS = ("forward", "_forward", "_conv_forward", "get_weight")
# a pruned layer's own tensors (torch.nn.utils.prune) are the weight and bias in another form
_LAYER_PARAMETERS = ("weight", "bias", "weight_orig", "bias_orig")


def _own_computation(module, float_cls) -> List[str]:
    """What a subclass of ``float_cls`` adds to the computation: the methods it defines itself
    (``WSConv2d.forward``) and its extra parameters (``gain``); empty for SpikingJelly's step-mode
    wrapper of ``float_cls`` (``layer.Conv2d``), whose forward only folds time into the batch."""
    own = []
    for cls in type(module).__mro__:
        if cls is float_cls:
            break
        if cls.__module__.startswith(_SJ_LAYER) and float_cls in cls.__bases__:
            continue  # the step-mode wrapper
        own += [f"{cls.__name__}.{m}()" for m in _COMPUTING_METHODS if m in vars(cls)]
    own += [f"parameter {n!r}" for n, _ in module.named_parameters(recurse=False)
            if n not in _LAYER_PARAMETERS]
    return own


def _neuron_target(module) -> Optional[registry.NeuronKind]:
    if isinstance(module, registry.quantized_classes()):
        return None
    return next((k for k in registry.NEURON_KINDS if type(module) is k.float_cls), None)


def _is_neuron(module) -> bool:
    from spikingjelly.activation_based.base import MemoryModule
    from spikingjelly.activation_based.neuron import BaseNode, SimpleBaseNode
    return isinstance(module, (BaseNode, SimpleBaseNode)) \
        or type(module).__module__.startswith("spikingjelly.activation_based.neuron") \
        or (isinstance(module, MemoryModule) and "v" in getattr(module, "_memories", {}))


def _carries_weights_or_state(module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or \
        any(True for _ in module.buffers(recurse=False))


def _why_not_quantized(module) -> Optional[str]:
    """The reason a module that is not replaced is left alone, or None (nothing to say)."""
    kind = type(module).__name__
    if type(module).__module__.split(".")[0] == "snnquant":
        if _carries_weights_or_state(module) or _is_neuron(module):
            return f"already an snnquant module ({kind}), left as it is"
        return None
    if _is_neuron(module):
        return (f"unsupported neuron type {kind}; supported: "
                f"{[k.float_cls.__name__ for k in registry.NEURON_KINDS]} (exactly these "
                f"classes: a subclass may "
                f"change the dynamics); its membrane stays float")
    if not _carries_weights_or_state(module):
        return None
    if isinstance(module, _NO_QUANTIZED_VERSION):
        return (f"no quantized version of {kind}: its weights stay float (quantize_model replaces "
                f"Linear, Conv1d and Conv2d)")
    for base_cls in (k.float_cls for k in registry.LAYER_KINDS):
        own = _own_computation(module, base_cls) if isinstance(module, base_cls) else []
        if own and type(module).__module__.startswith(_SJ_LAYER):
            return (f"{kind} is a subclass of nn.{base_cls.__name__} with its own forward "
                    f"({', '.join(own)}): a plain Quant{base_cls.__name__} would drop what that "
                    f"forward computes (SpikingJelly's WSConv2d/WSLinear standardise the weight "
                    f"and scale it by a learned gain), so its weights stay float; use "
                    f"layer.{base_cls.__name__} for a quantized layer")
        if isinstance(module, base_cls):
            return (f"{kind} is a subclass of nn.{base_cls.__name__} that snnquant does not "
                    f"recognise (its forward may differ), so its weights stay float; use "
                    f"nn.{base_cls.__name__} or snnquant.nn.Quant{base_cls.__name__}")
    if isinstance(module, _BATCH_NORMS):
        return ("batch normalization stays float; fold it into the preceding layer "
                "(snnquant.export.fold_batchnorm) before an integer export")
    return (f"{kind} has parameters or buffers that quantize_model does not quantize; they stay "
            f"float")


def _fold_batchnorms_in_training(model: nn.Module, config: QuantConfig, report: QuantReport,
                                 example_input=None):
    """Attach every BatchNorm that :func:`~snnquant.export.fold_batchnorm` can fold to the
    quantized layer before it (``config.fold_batchnorm``); say why for the others."""
    # the capture fold_batchnorm uses: what trains folded, folds
    plan = plan_folding(model, example_input)
    modules = dict(model.named_modules())
    why = dict(plan.refused)
    for synapse_name, bn_name in plan.pairs:
        layer, bn = modules[synapse_name], modules[bn_name]
        cfg = config.for_module(synapse_name)
        if not isinstance(layer, registry.quantized_classes()) or layer.weight_quant is None:
            why[bn_name] = f"layer {synapse_name!r} before it is not quantized"
        elif layer.batchnorm is not None:
            continue  # folded during training already (a model quantized before)
        elif not cfg.fold_batchnorm:
            why[bn_name] = "QuantConfig.fold_batchnorm is False"
        elif not layer.weight_quant.follows_input_scale:
            why[bn_name] = (f"the {type(layer.weight_quant).__name__} of layer {synapse_name!r} "
                            f"outputs +-alpha whatever the scale of the folded weight, so the "
                            f"BatchNorm statistics would feed back into that scale; it folds "
                            f"after training (fold_batchnorm rescales alpha)")
        elif (reason := foldable_batchnorm(bn)) is not None:
            why[bn_name] = reason
        else:
            layer.attach_batchnorm(bn, cfg.bias_bits, charged_neuron(plan, modules, synapse_name))
            report.folded.append((synapse_name, bn_name))
    missed = {}
    for bn_name, reason in why.items():
        if bn_name in modules and config.for_module(bn_name).fold_batchnorm:
            # what fold_batchnorm's FoldWarning names as the step that was missed
            needs_run = example_input is None and "whose forward was not captured" in reason
            modules[bn_name]._snnquant_fold_missed = (
                NEEDS_EXAMPLE_INPUT if needs_run else f"it could not train folded: {reason}")
            if needs_run:
                missed[bn_name] = _layer_before(modules, bn_name)
        elif bn_name in modules:
            modules[bn_name]._snnquant_fold_missed = (
                "train with QuantConfig(fold_batchnorm=True) (the default) so that folding "
                "changes nothing")
    if missed:
        pairs = ", ".join(f"{syn!r} -> {bn!r}" if syn else repr(bn) for bn, syn in missed.items())
        warnings.warn(f"quantize_model: {len(missed)} BatchNorm(s) will not train folded, "
                      f"because torch.fx cannot trace the modules that hold them without a run: "
                      f"{pairs}. Pass example_input=x (one input batch, [T, N, ...] in "
                      f"multi-step mode) to quantize_model so that they are found from a run and "
                      f"train folded; otherwise fold_batchnorm folds them after training, which "
                      f"changes the network at low bits", UserWarning, stacklevel=3)
    folded = {bn for _, bn in report.folded}
    kept = []
    for entry in report.skipped:
        if entry.name in folded:
            continue
        if entry.name in why:
            entry = entry._replace(reason=f"{entry.reason}; it is not folded during training: "
                                          f"{why[entry.name]}")
        kept.append(entry)
    report.skipped[:] = kept


def _layer_before(modules, bn_name: str) -> Optional[str]:
    """The synaptic layer registered right before BatchNorm ``bn_name`` in the same parent (the
    layer it most likely normalises), or None."""
    parent = bn_name.rpartition(".")[0]
    before = None
    for name, m in modules.items():
        if name == bn_name:
            return before
        if name.rpartition(".")[0] == parent and registry.layer_kind(m) is not None:
            before = name
    return None


def _plif_note(name: str, module) -> Optional[str]:
    tau = float(1.0 / torch.sigmoid(module.w.detach().double()))
    if not module.w.requires_grad and pow2_exponent(tau) is not None:
        return None
    what = "learns its tau" if module.w.requires_grad else "has a fixed tau"
    return (f"{name}: ParametricLIFNode {what} (now {tau:.6g}); a learned tau is rarely a power "
            f"of two, so to_integer refuses the trained network unless you choose: an "
            f"approximate fixed-point leak, to_integer(..., leak_bits=12), or a fixed "
            f"power-of-two tau (LIFNode(tau=2.0), or ParametricLIFNode(init_tau=2.0) with "
            f"w.requires_grad_(False))")


def _convert_layer(module, kind: registry.LayerKind, cfg: QuantConfig):
    w = module.weight
    new = kind.from_float(module)
    _carry_parameters(module, new)
    new.weight_quant = _weight_quantizer(cfg, cfg.weight_bits, w.shape[0])
    if cfg.bias_bits is not None and module.bias is not None:
        new.bias_quant = WeightGridBiasQuantizer(cfg.bias_bits).bind(new)
    for q in (new.weight_quant, new.bias_quant):
        if q is not None:  # quantizer parameters and buffers follow the layer's device and dtype
            q.to(device=w.device, dtype=w.dtype if w.is_floating_point() else None)
    new.train(module.training)
    return new


def _convert_neuron(module, kind: registry.NeuronKind, cfg: QuantConfig, device=None, dtype=None):
    kw = dict(v_threshold=module.v_threshold, v_reset=module.v_reset,
              surrogate_function=module.surrogate_function, detach_reset=module.detach_reset,
              step_mode=module.step_mode, store_v_seq=module.store_v_seq,
              v_quant=make_membrane_quantizer(cfg.v_bits, module.v_threshold,
                                              cfg.membrane_quantizer),
              backend=cfg.backend)
    new = kind.from_float(module, **kw)
    new._neuron_precision = getattr(module, "_neuron_precision", None)
    params = list(module.parameters())
    if params:  # PLIF: its own parameter says where it lives
        device, dtype = params[0].device, params[0].dtype
    if device is not None:
        new.to(device=device, dtype=dtype)
    new.train(module.training)
    return new


# --- What the user attached to a replaced module: hooks, pruning, parametrizations ---------------

_HOOK_DICTS = (
    ("_forward_pre_hooks", "forward pre-hook"),
    ("_forward_hooks", "forward hook"),
    ("_backward_pre_hooks", "backward pre-hook"),
    ("_backward_hooks", "backward hook"),
)
# Dicts keyed by the same handle ids that say how a hook is called (with kwargs, always called).
_HOOK_FLAG_DICTS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                    "_forward_hooks_always_called")


def _hook_label(hook) -> str:
    from torch.nn.utils import prune

    if isinstance(hook, prune.BasePruningMethod):
        return f"{type(hook).__name__} (torch.nn.utils.prune of {hook._tensor_name!r})"
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def _move_hooks(old: nn.Module, new: nn.Module) -> List[str]:
    """Move the forward (pre-)hooks and backward (pre-)hooks of ``old`` to its replacement
    ``new``, in their order and with their kwargs/always-called flags; return one line per kind
    that moved, for the report.

    The hook dicts themselves move, so the handles the user holds (``handle.remove()``) keep
    working on ``new``. Hooks that ``new`` registered itself run after the moved ones.
    """
    moved = []
    for attr, label in _HOOK_DICTS:
        hooks = getattr(old, attr)
        if not hooks:
            continue
        own = getattr(new, attr)
        hooks.update(own)  # the replacement's own hooks (none today) after the user's
        setattr(new, attr, hooks)
        setattr(old, attr, type(hooks)())
        names = [_hook_label(h) for h in hooks.values()]
        moved.append(f"{len(names)} {label}{'s' if len(names) > 1 else ''} ({', '.join(names)})")
    for attr in _HOOK_FLAG_DICTS:
        flags = getattr(old, attr, None)
        if flags:
            flags.update(getattr(new, attr))
            setattr(new, attr, flags)
            setattr(old, attr, type(flags)())
    if old._backward_hooks or getattr(new, "_backward_hooks", None):
        new._is_full_backward_hook = old._is_full_backward_hook
    return moved


class _NoParametrization(nn.Module):
    """A placeholder parametrization without ``right_inverse``: registering it leaves the
    original tensor untouched (it is then replaced by the source layer's own list)."""

    def forward(self, x):
        return x


def _carry_tensor(old: nn.Module, new: nn.Module, name: str) -> None:
    """Give ``new`` the tensor ``name`` of ``old`` in the form the user made it:

    * a plain parameter: the very same parameter;
    * pruned with ``torch.nn.utils.prune`` (``<name>_orig`` parameter, ``<name>_mask`` buffer and
      a forward pre-hook that sets ``<name> = <name>_orig * <name>_mask``): the same ``_orig``
      and ``_mask``, and the effective tensor as ``<name>``; the pre-hook moves with
      :func:`_move_hooks`, so the quantizer sees the pruned weight and fine-tuning stays pruned
      (``prune.remove(new, name)`` works as on the source layer);
    * parametrized with ``torch.nn.utils.parametrize``: the same parametrization list (with the
      same original tensor), so ``new.<name>`` is the effective tensor and the quantizer
      quantizes it.
    """
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(old, name):
        plist = old.parametrizations[name]
        original = getattr(plist, "original", None)
        if original is None:  # a right_inverse that returns several tensors (original0, ...)
            raise ValueError(
                f"the {type(old).__name__}'s {name!r} is parametrized into several original "
                f"tensors, which quantize_model cannot carry over; remove the parametrization "
                f"(torch.nn.utils.parametrize.remove_parametrizations(module, {name!r})) first")
        setattr(new, name, original)
        parametrize.register_parametrization(new, name, _NoParametrization(), unsafe=True)
        new.parametrizations[name] = plist
        return
    if name + "_orig" in old._parameters and name + "_mask" in old._buffers:
        del new._parameters[name]
        new.register_parameter(name + "_orig", old._parameters[name + "_orig"])
        new.register_buffer(name + "_mask", old._buffers[name + "_mask"])
        setattr(new, name, getattr(old, name))  # a plain attribute, as prune leaves it
        return
    setattr(new, name, getattr(old, name))


def _carry_parameters(old: nn.Module, new: nn.Module) -> None:
    """:func:`_carry_tensor` for the weight and the bias of a layer."""
    _carry_tensor(old, new, "weight")
    if old.bias is not None:
        _carry_tensor(old, new, "bias")
    else:
        new.bias = None


def _has_parametrized_class(module) -> bool:
    """Whether ``torch.nn.utils.parametrize`` gave ``module`` its generated class (with one
    property per parametrized tensor)."""
    from torch.nn.utils import parametrize

    return parametrize.is_parametrized(module) and any(
        isinstance(type(module).__dict__.get(name), property) for name in module.parametrizations)


def _parametrized_layer_target(module):
    """The layer kind for a layer whose class ``torch.nn.utils.parametrize`` replaced by a
    generated subclass (``ParametrizedLinear``): the kind of the class it was made from."""
    generated = type(module)
    try:
        module.__class__ = generated.__bases__[0]
        return _layer_target(module)
    finally:
        module.__class__ = generated


def _positions(model: nn.Module):
    """Every module under ``model`` with all its names and the slots ``(parent, attr)`` that
    hold it, in the order of a depth-first walk; a module used twice appears once, with both
    names. Also ``{name: position in the walk}``."""
    found: Dict[int, list] = {}
    order: Dict[str, int] = {}

    def walk(parent: nn.Module, prefix: str, path: frozenset):
        for attr, child in parent._modules.items():
            if child is None or id(child) in path:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            entry = found.setdefault(id(child), [child, [], []])
            order.setdefault(name, len(order))
            entry[1].append(name)
            entry[2].append((parent, attr))
            if _descend(child):
                walk(child, name, path | {id(child)})

    walk(model, "", frozenset({id(model)}))
    return list(found.values()), order


def _descend(module) -> bool:
    # quantized layers and neurons hold their quantizers; neurons their surrogate functions
    return type(module).__module__.split(".")[0] != "snnquant" and not _is_neuron(module) \
        and _layer_target(module) is None


def _decide(name: str, layer_cls, config: QuantConfig):
    """``(skip_reason, None)`` or ``(None, cfg)`` for one position of a layer or neuron."""
    if any(fnmatch.fnmatchcase(name, p) for p in config.skip):
        return "matches a skip pattern", None
    cfg = config.for_module(name)
    if layer_cls is not None and cfg.weight_bits is None:
        return "weight_bits is None", None
    if layer_cls is None and cfg.v_bits is None:
        return "v_bits is None", None
    return None, dataclasses.replace(cfg, overrides={}, skip=())


def _warn_unmatched(config: QuantConfig, all_names, target_names, model):
    patterns = [("skip", p) for p in config.skip] + [("overrides", p) for p in config.overrides]
    for kind, p in patterns:
        matched = [n for n in all_names if fnmatch.fnmatchcase(n, p)]
        if not matched:
            some = ", ".join(repr(n) for n in list(all_names)[:8])
            warnings.warn(f"{kind} pattern {p!r} matches no module of {type(model).__name__} "
                          f"(module names: {some}{', ...' if len(all_names) > 8 else ''})",
                          UserWarning, stacklevel=3)
        elif not any(fnmatch.fnmatchcase(n, p) for n in target_names):
            warnings.warn(f"{kind} pattern {p!r} matches only modules that quantize_model does not "
                          f"replace ({', '.join(repr(n) for n in matched[:4])}), so it changes "
                          f"nothing; patterns match the own name of a layer or neuron (for the "
                          f"modules inside a container 'block', write 'block.*')",
                          UserWarning, stacklevel=3)


def _quantize_for_chip(model: nn.Module, profile, inplace: bool, example_input):
    """``quantize_model`` with a chip profile: its ``quantize_network``, and the report of what
    each chip layer was converted from."""
    if inplace:
        raise ValueError(f"inplace=True: a chip profile ({type(profile).__name__}) builds a new "
                         f"network of the chip's layers; call quantize_model without inplace")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    net = profile.quantize_network(model, example_input)
    report = QuantReport()
    for m in net:
        names = [n for n, _ in m.converted_from]
        report.replaced.append(ReplacedModule("+".join(names),
                                              "+".join(t for _, t in m.converted_from),
                                              type(m).__name__))
    report.notes.append(f"a {profile.name} network: check, export and simulate it with "
                        f"snnquant.targets (check_*, to_*, run_*), not snnquant.export")
    return net, report


def quantize_model(model: nn.Module, config: Optional[QuantConfig] = None, inplace: bool = False,
                   example_input=None, destination="c"):
    r"""Replace the supported layers and neurons of ``model`` by quantized ones.

    ``nn.Linear/Conv1d/Conv2d`` (and SpikingJelly's ``layer.*`` versions) become
    :class:`~snnquant.nn.QuantLinear`/``QuantConv1d``/``QuantConv2d`` with a weight quantizer of
    ``config.weight_bits``; ``IFNode``/``LIFNode``/``ParametricLIFNode`` become the quantized neurons
    with a membrane quantizer of ``config.v_bits``. Weights, biases, neuron hyper-parameters,
    surrogate functions, ``step_mode``, device, dtype and ``requires_grad`` are kept (the very same
    parameter tensors are reused). Any ``nn.Module`` tree works, including SpikingJelly containers.

    A module used at several positions (twice in one ``nn.Sequential``, or under two parents) is
    quantized once and the same quantized module is put at every position, so the positions keep
    sharing weights and quantizer parameters; the report lists every name (and ``report.shared``
    the groups). If ``skip``/``overrides`` would treat the positions of one module differently, a
    ``ValueError`` names them.

    What the user attached to a replaced module stays: its forward pre-hooks and forward hooks
    (also those registered ``with_kwargs`` or ``always_call``) and its backward hooks move to the
    replacement in their order, and the handles that registered them still remove them;
    ``report.hooks`` lists what moved (SpikingJelly's monitors rely on such hooks). A weight
    pruned with ``torch.nn.utils.prune`` is quantized as the effective (masked) weight, and the
    pruning stays: the replacement keeps ``weight_orig``, ``weight_mask`` and the pruning
    pre-hook, so fine-tuning updates ``weight_orig`` and the pruned weights stay zero
    (``prune.remove`` works on it as on the source layer). A weight parametrized with
    ``torch.nn.utils.parametrize`` keeps its parametrization (the same original tensor and
    parametrization modules) and is quantized as the effective weight.

    Args:
        model: the network.
        config: a :class:`QuantConfig` (default: ``QuantConfig()``: 8-bit weights with a learned
            power-of-two step (``'lsq_pow2'``), 16-bit biases; neurons stay float unless
            ``v_bits`` is set), or a chip profile of :mod:`snnquant.targets`
            (:data:`~snnquant.targets.xylo.XYLO_AUDIO2`, :data:`~snnquant.targets.loihi.LOIHI2`,
            :data:`~snnquant.targets.speck.SPECK2F`): the network then becomes a new
            ``nn.Sequential`` of the chip's layers, which train in its arithmetic (the profile's
            ``quantize_network``: ``quantize_for_xylo``/``_loihi``/``_speck`` with their
            defaults; Speck takes its input shape and largest count from ``example_input``), and
            ``report.replaced`` names the source modules of each layer.
        inplace: modify ``model`` itself instead of a deep copy.
        example_input: one input batch of the model (``[T, N, ...]`` in multi-step mode): the
            graph that says which ``conv -> BatchNorm`` pairs train folded
            (``QuantConfig.fold_batchnorm``) is then captured from a run
            (:func:`~snnquant.capture.capture`), which follows shape checks in ``forward`` and
            blocks in ``nn.ModuleList`` (spiking transformers); without it, torch.fx symbolic
            tracing, whose refusals are in ``report.skipped``. Pass the same input to
            :func:`~snnquant.export.fold_batchnorm`. With it, ``report.deployability`` says
            before training what the export would refuse after it (below). Without it, on a
            network whose BatchNorms need a run to be found, a ``UserWarning`` names the
            pairs and asks for ``example_input=x``.
        destination: what the deployability report checks for (with ``example_input`` only):
            ``'c'`` (default; the same as ``'integer'``), ``'integer'``, ``'nir'``, ``'xylo'``,
            ``'loihi'``, ``'speck'`` (a chip profile as ``config`` checks its own), or ``None``
            (no report). :func:`~snnquant.deployability.deployability_report` runs the checks
            :func:`~snnquant.export.to_integer`, :func:`~snnquant.export.to_nir` and the chips run
            (leaks, means over time and over values, accumulator bounds at the largest value of
            ``example_input``, BatchNorms that do not train folded, operations NIR has no node
            for, chip limits), each blocker with its fix; a
            :class:`~snnquant.deployability.DeployabilityWarning` lists them.

    Returns:
        ``(quantized_model, report)``, a :class:`QuantReport`. Nothing is silently ignored: every
        module left alone that carries weights or state (``Conv3d``, ``ConvTranspose*``, user
        subclasses of ``nn.Linear``/``nn.Conv2d``, unsupported neurons, batch norm, ...) is in
        ``report.skipped`` with the reason; ``report.notes`` says what an exact integer export
        still needs (a trainable ``ParametricLIFNode``). A model with nothing to quantize gives a
        warning, and so does a ``skip`` or ``overrides`` pattern that matches no module.
    """
    if config is None:
        config = QuantConfig()
    if not isinstance(config, QuantConfig) and callable(getattr(config, "quantize_network", None)):
        return _quantize_for_chip(model, config, inplace, example_input)
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig or a chip profile of snnquant.targets, got "
                        f"{type(config).__name__}")
    config.validate()
    if destination is not None:
        from .deployability import DESTINATIONS
        if not (isinstance(destination, str) and destination in DESTINATIONS) and \
                not hasattr(destination, "quantize_network"):
            raise ValueError(f"destination must be one of {DESTINATIONS}, a chip profile or None, "
                             f"got {destination!r}")
    source = model
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

    positions, order = _positions(model)
    all_names = list(order)
    target_names = []
    if _layer_target(model) is None and _neuron_target(model) is None:
        root_reason = _why_not_quantized(model)
    else:
        root_reason = ("quantize_model replaces the submodules of the model, not the model itself: "
                       "wrap it (nn.Sequential(model))")
    if root_reason is not None and (_carries_weights_or_state(model) or _is_neuron(model)):
        report.skipped.append(SkippedModule("", type(model).__name__, root_reason))
    for module, names, slots in positions:
        old_type = type(module).__name__
        layer_cls, neuron_cls = _layer_target(module), _neuron_target(module)
        if layer_cls is None and neuron_cls is None:
            reason = _why_not_quantized(module)
            if reason is not None:
                report.skipped.extend(SkippedModule(n, old_type, reason) for n in names)
            continue
        target_names.extend(names)
        decisions = [_decide(n, layer_cls, config) for n in names]
        if any(d != decisions[0] for d in decisions[1:]):
            detail = "; ".join(f"{n}: " + (f"skipped ({r})" if r else "quantized with "
                                            + ", ".join(f"{k}={v!r}" for k, v in vars(c).items()
                                                        if k not in ("skip", "overrides")))
                               for n, (r, c) in zip(names, decisions))
            raise ValueError(f"the {old_type} at {names} is one module used at {len(names)} "
                             f"positions, quantized once, but skip/overrides treat the positions "
                             f"differently ({detail}); make the patterns agree")
        reason, cfg = decisions[0]
        if reason is not None:
            report.skipped.extend(SkippedModule(n, old_type, reason) for n in names)
            continue
        new = (_convert_layer(module, layer_cls, cfg) if layer_cls is not None
               else _convert_neuron(module, neuron_cls, cfg, model_device, model_dtype))
        report.hooks.extend(f"{names[0]}: {line} moved to {type(new).__name__}"
                            for line in _move_hooks(module, new))
        for parent, attr in slots:
            setattr(parent, attr, new)
        report.replaced.extend(ReplacedModule(n, old_type, type(new).__name__) for n in names)
        if len(names) > 1:
            report.shared.append(list(names))
        if isinstance(new, QuantParametricLIFNode):
            note = _plif_note(names[0], new)
            if note is not None:
                report.notes.append(note)
    if any(isinstance(m, _BATCH_NORMS) for m in model.modules()):
        _fold_batchnorms_in_training(model, config, report, example_input)
    report.replaced.sort(key=lambda r: order[r.name])
    report.skipped.sort(key=lambda r: order.get(r.name, -1))
    _warn_unmatched(config, all_names, target_names, model)
    if not report.replaced:
        warnings.warn("quantize_model found nothing to quantize in "
                      f"{type(model).__name__}; returning it unchanged", stacklevel=2)
    sjf.invalidate_reset_cache(model)
    if isinstance(example_input, torch.Tensor) and destination is not None and report.replaced:
        from .deployability import deployability_report, warn_if_blocked
        chip = not isinstance(destination, str) or destination in ("xylo", "loihi", "speck")
        report.deployability = deployability_report(source if chip else model, example_input,
                                                    destination, quant_report=report)
        warn_if_blocked(report.deployability)
    return model, report

