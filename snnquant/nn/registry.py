r"""The one list of layer and neuron kinds that :func:`~snnquant.quantize_model` converts and
:func:`~snnquant.export.to_integer` exports.

Each entry ties a float module class (PyTorch's or SpikingJelly's) to its quantized replacement
and to the name the integer network uses for it (``SynapseOp.kind``, ``NeuronOp.kind``).
Both :mod:`snnquant.convert` and :mod:`snnquant.export` read these tables and nothing else, so a
new layer kind is one :class:`LayerKind` entry here (plus, for the integer export, what its
``kind`` means to the simulator and the C runtime).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch.nn as nn
from spikingjelly.activation_based import neuron

from .layers import QuantConv1d, QuantConv2d, QuantLinear
from .neurons import QuantIFNode, QuantLIFNode, QuantParametricLIFNode

__all__ = ["LayerKind", "NeuronKind", "LAYER_KINDS", "NEURON_KINDS", "layer_kind", "neuron_kind",
           "quantized_classes"]


@dataclass(frozen=True)
class LayerKind:
    """A synaptic layer kind.

    Attributes:
        name: ``SynapseOp.kind`` of the exported layer (``'linear'``, ``'conv1d'``, ``'conv2d'``).
        float_cls: the float class :func:`~snnquant.quantize_model` replaces (exactly it, or
            SpikingJelly's ``layer.*`` subclass of it).
        quant_cls: the quantized class that replaces it.
        spatial_dims: spatial dimensions of the kernel (0 for a linear layer).
        from_float: ``f(module)`` -> a ``quant_cls`` of the same shape and hyper-parameters
            (``step_mode`` included), without quantizers; the caller moves the parameters over.
    """

    name: str
    float_cls: type
    quant_cls: type
    spatial_dims: int
    from_float: Callable[[nn.Module], nn.Module]


@dataclass(frozen=True)
class NeuronKind:
    """A neuron kind.

    Attributes:
        name: ``NeuronOp.kind`` of the exported layer (``'if'`` or ``'lif'``).
        float_cls: the SpikingJelly class :func:`~snnquant.quantize_model` replaces (exactly it).
        quant_cls: the quantized class that replaces it.
        leak: where the leak comes from: ``None`` (no leak), ``'tau'`` (the ``tau`` attribute) or
            ``'sigmoid_w'`` (:math:`1/\\tau = \\mathrm{sigmoid}(w)`, learned).
        from_float: ``f(module, **common)`` -> a ``quant_cls`` with the kind's own
            hyper-parameters taken from ``module`` (and its parameters shared) and the keywords
            every neuron takes (threshold, reset, surrogate, ``v_quant``, ...).
    """

    name: str
    float_cls: type
    quant_cls: type
    leak: Optional[str]
    from_float: Callable[..., nn.Module]


def _linear(module: nn.Linear) -> QuantLinear:
    return QuantLinear(module.in_features, module.out_features, bias=module.bias is not None,
                       step_mode=getattr(module, "step_mode", "s"), weight_quant=None)


def _conv(quant_cls: type) -> Callable[[nn.Module], nn.Module]:
    def make(module):
        return quant_cls(module.in_channels, module.out_channels, module.kernel_size,
                         stride=module.stride, padding=module.padding, dilation=module.dilation,
                         groups=module.groups, bias=module.bias is not None,
                         padding_mode=module.padding_mode,
                         step_mode=getattr(module, "step_mode", "s"), weight_quant=None)
    return make


def _plif(module, **common) -> QuantParametricLIFNode:
    new = QuantParametricLIFNode(decay_input=module.decay_input, **common)
    new.w = module.w
    return new


#: The synaptic layer kinds, in the order their classes are tested.
LAYER_KINDS: Tuple[LayerKind, ...] = (
    LayerKind("linear", nn.Linear, QuantLinear, 0, _linear),
    LayerKind("conv1d", nn.Conv1d, QuantConv1d, 1, _conv(QuantConv1d)),
    LayerKind("conv2d", nn.Conv2d, QuantConv2d, 2, _conv(QuantConv2d)),
)

#: The neuron kinds (the parametric LIF exports as ``'lif'`` with its current :math:`\tau`).
NEURON_KINDS: Tuple[NeuronKind, ...] = (
    NeuronKind("if", neuron.IFNode, QuantIFNode, None,
               lambda module, **common: QuantIFNode(**common)),
    NeuronKind("lif", neuron.LIFNode, QuantLIFNode, "tau",
               lambda module, **common: QuantLIFNode(tau=module.tau, decay_input=module.decay_input,
                                                     **common)),
    NeuronKind("lif", neuron.ParametricLIFNode, QuantParametricLIFNode, "sigmoid_w", _plif),
)


def quantized_classes() -> Tuple[type, ...]:
    """The quantized classes of every registered kind."""
    return tuple(k.quant_cls for k in LAYER_KINDS + NEURON_KINDS)


def layer_kind(module) -> Optional[LayerKind]:
    """The :class:`LayerKind` whose quantized class ``module`` is an instance of, else the one
    whose float class it is an instance of (a subclass included), else ``None``."""
    for kind in LAYER_KINDS:
        if isinstance(module, kind.quant_cls):
            return kind
    for kind in LAYER_KINDS:
        if isinstance(module, kind.float_cls):
            return kind
    return None


def neuron_kind(module) -> Optional[NeuronKind]:
    """The :class:`NeuronKind` whose quantized class ``module`` is an instance of, else the one
    whose float class is exactly ``type(module)``, else ``None``."""
    for kind in NEURON_KINDS:
        if isinstance(module, kind.quant_cls):
            return kind
    for kind in NEURON_KINDS:
        if type(module) is kind.float_cls:
            return kind
    return None
