r"""BatchNorm folded into the synaptic layer before it during quantization-aware training.

A quantized ``Linear`` / ``Conv1d`` / ``Conv2d`` layer followed by a BatchNorm is trained as the
layer that is deployed, the folded one (Jacob et al. 2018, section 3.2; Krishnamoorthi 2018).
With :math:`s = \gamma / \sqrt{\sigma^2 + \epsilon}` from the running statistics, the layer's
weight quantizer sees the folded weight, and the folded layer is

.. math::

    W' = W\,s,\qquad b' = (b - \mu)\,s + \beta,\qquad
    y = Q_w(W') * x + Q_b(b')

per output channel, with :math:`\mu, \sigma^2` the running mean and variance. Three forms:

* evaluation (``eval()``), and training once the statistics are frozen
  (:func:`freeze_batchnorm`): exactly the folded layer above, and the BatchNorm passes its input
  through. This is what :func:`~snnquant.export.fold_batchnorm` writes into the layer's weights:
  it changes no quantized weight and no spike;
* training with batch statistics (the default while training): the layer computes
  :math:`Q_w(W') * x / s + b` and the BatchNorm normalises that with the batch's mean and
  variance (and updates its running statistics), so the weights are quantized as they will be
  deployed while the batch statistics still normalise (the correction of Jacob et al.; PyTorch's
  ``torch.ao.nn.intrinsic.qat`` ConvBn modules compute the same).

Gradients flow to :math:`W`, :math:`b`, :math:`\gamma` and :math:`\beta` through these formulas
(straight-through estimators inside the quantizers); :math:`\mu` and :math:`\sigma^2` are
statistics, not trained.

:func:`~snnquant.quantize_model` attaches every pair that
:func:`~snnquant.export.fold_batchnorm` can fold (``QuantConfig(fold_batchnorm=False)`` turns
this off); :meth:`~snnquant.nn.QuantLinear.attach_batchnorm` attaches one pair by hand. The
BatchNorm keeps its class's parameters and statistics (its ``state_dict`` keys stay), and gains
the buffer ``fold_frozen`` and the folded bias's quantizer ``folded_bias_quant``; a state dict
saved without them (by a network quantized before BatchNorm was folded during training) detaches
the pair when it is loaded, so it loads and folds as it was trained.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import layer as sj_layer

from .quantizers import WeightGridBiasQuantizer, check_bits

__all__ = ["FoldedBatchNorm1d", "FoldedBatchNorm2d", "FoldedStepBatchNorm1d",
           "FoldedStepBatchNorm2d", "foldable_batchnorm", "freeze_batchnorm",
           "folded_batchnorms"]


class _FoldedBatchNormMixin:
    """What a BatchNorm attached to the synaptic layer before it does (see the module docstring).
    """

    def _fold_attach(self, synapse: nn.Module, bias_bits: Optional[int],
                     neuron: Optional[nn.Module]) -> None:
        self.__dict__["_synapse"] = synapse  # a plain reference, not a submodule
        self.register_buffer("fold_frozen", torch.zeros((), dtype=torch.bool,
                                                        device=self.running_mean.device))
        self.__dict__["_frozen_cache"] = False
        quant = None
        if bias_bits is not None:
            quant = WeightGridBiasQuantizer(bias_bits).bind(synapse, neuron)
        self.add_module("folded_bias_quant", quant)  # registered also when None

    @property
    def synapse(self) -> nn.Module:
        """The synaptic layer this BatchNorm is folded into."""
        return self.__dict__["_synapse"]

    @property
    def frozen(self) -> bool:
        """Whether the statistics are frozen: training then uses the folded layer as deployed."""
        return self.__dict__.get("_frozen_cache", False)

    def set_frozen(self, frozen: bool) -> None:
        """Freeze (or unfreeze) the running statistics; see :func:`freeze_batchnorm`."""
        self.fold_frozen.fill_(bool(frozen))
        self.__dict__["_frozen_cache"] = bool(frozen)

    @property
    def folded_form(self) -> bool:
        """Whether the folded layer runs (evaluation, or frozen statistics)."""
        return not self.training or self.frozen

    @torch.no_grad()
    def start_statistics(self, y: torch.Tensor, channel_dim: int) -> None:
        r"""Before the first training batch ever (``num_batches_tracked == 0``), set the running
        statistics to those of ``y``, the layer's unquantized output on that batch, so that the
        weight quantizer's first step is chosen for the folded weight it will see, not for
        :math:`W\gamma/\sqrt{1 + \epsilon}` of the initial statistics. Reads the counter once."""
        if self.__dict__.get("_started", False):
            return
        self.__dict__["_started"] = True
        if self.num_batches_tracked is None or int(self.num_batches_tracked) > 0:
            return
        dims = [d for d in range(y.dim()) if d != channel_dim % y.dim()]
        self.running_mean.copy_(y.mean(dims).to(self.running_mean.dtype))
        self.running_var.copy_(y.var(dims).to(self.running_var.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded_form:  # the synaptic layer already computed the folded layer
            return x
        return super().forward(x)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if prefix + "fold_frozen" not in state_dict:
            # saved before this pair was folded during training: train and fold it as it was
            self.synapse.detach_batchnorm()
            type(self)._load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                                             missing_keys, unexpected_keys, error_msgs)
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self.__dict__["_frozen_cache"] = bool(self.fold_frozen)

    def detach_from_layer(self) -> None:
        """Become the plain BatchNorm again (its parameters and statistics unchanged)."""
        del self._buffers["fold_frozen"]
        del self._modules["folded_bias_quant"]
        for key in ("_synapse", "_frozen_cache", "_started"):
            self.__dict__.pop(key, None)
        self.__class__ = _PLAIN[type(self)]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", folded into the layer before it, frozen={self.frozen}"


class FoldedBatchNorm1d(_FoldedBatchNormMixin, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` folded into the layer before it during training (module docstring)."""


class FoldedBatchNorm2d(_FoldedBatchNormMixin, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` folded into the layer before it during training (module docstring)."""


class FoldedStepBatchNorm1d(_FoldedBatchNormMixin, sj_layer.BatchNorm1d):
    """SpikingJelly's ``layer.BatchNorm1d`` folded into the layer before it during training."""


class FoldedStepBatchNorm2d(_FoldedBatchNormMixin, sj_layer.BatchNorm2d):
    """SpikingJelly's ``layer.BatchNorm2d`` folded into the layer before it during training."""


_FOLDED = {nn.BatchNorm1d: FoldedBatchNorm1d, nn.BatchNorm2d: FoldedBatchNorm2d,
           sj_layer.BatchNorm1d: FoldedStepBatchNorm1d, sj_layer.BatchNorm2d: FoldedStepBatchNorm2d}
_PLAIN = {folded: plain for plain, folded in _FOLDED.items()}


def foldable_batchnorm(bn: nn.Module) -> Optional[str]:
    """Why ``bn`` cannot be folded into its layer during training, or ``None`` when it can.

    The four classes whose forward is the plain normalisation can (``nn.BatchNorm1d/2d`` and
    SpikingJelly's ``layer.BatchNorm1d/2d``), with running statistics; a subclass with its own
    forward (SpikingJelly's threshold-dependent BatchNorm, ...) cannot.
    """
    if type(bn) not in _FOLDED:
        return (f"{type(bn).__name__} is not one of the BatchNorm classes that fold during "
                f"training ({', '.join(sorted(c.__qualname__ for c in _FOLDED))})")
    if bn.running_mean is None or bn.running_var is None:
        return "it has no running statistics (track_running_stats=False)"
    return None


def attach(synapse: nn.Module, bn: nn.Module, bias_bits: Optional[int],
           neuron: Optional[nn.Module] = None) -> None:
    """Make ``bn`` the BatchNorm folded into ``synapse`` (see ``attach_batchnorm``)."""
    reason = foldable_batchnorm(bn)
    if reason is not None:
        raise ValueError(f"cannot fold this BatchNorm into the layer during training: {reason}")
    if bias_bits is not None:
        bias_bits = check_bits(bias_bits, "bias_bits", 2, 32)
    channels = synapse.weight.shape[0]
    if bn.num_features != channels:
        raise ValueError(f"the BatchNorm has {bn.num_features} features, the layer "
                         f"{channels} outputs")
    bn.__class__ = _FOLDED[type(bn)]
    bn._fold_attach(synapse, bias_bits, neuron)
    synapse.__dict__["_folded_bn"] = bn


def folded_batchnorms(model: nn.Module):
    """The BatchNorms of ``model`` that are folded into their layers during training."""
    return [m for m in model.modules() if isinstance(m, _FoldedBatchNormMixin)]


def freeze_batchnorm(model: nn.Module, frozen: bool = True) -> int:
    """Freeze the statistics of every BatchNorm folded into its layer during training.

    From then on, training runs the folded layer exactly as it is deployed (running statistics,
    quantized folded weight and bias), as Jacob et al. 2018 do late in training; the running
    statistics no longer change. ``frozen=False`` returns to batch statistics. Returns the
    number of BatchNorms changed.
    """
    if not isinstance(frozen, bool):
        raise TypeError(f"frozen must be True or False, got {frozen!r}")
    found = folded_batchnorms(model)
    for bn in found:
        bn.set_frozen(frozen)
    return len(found)
