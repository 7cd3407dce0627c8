r"""Fold BatchNorm into the preceding synaptic layer: :func:`fold_batchnorm`."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from ..utils import copy_model

from .description import ExportError
from .exporter import model_walk
from .integer_ops import pow2_exponent

__all__ = ["fold_batchnorm"]


def _is_synapse(m) -> bool:
    return isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))


def _is_neuron(m) -> bool:
    from spikingjelly.activation_based import neuron
    return isinstance(m, neuron.BaseNode)


def _passes_through(m) -> bool:
    return isinstance(m, (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.MaxPool1d,
                          nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.Flatten)) or \
        type(m).__name__ in ("Dropout", "Dropout2d")


def _membrane_step(neuron_module) -> Optional[float]:
    """The power-of-two membrane step of a quantized neuron, else None."""
    vq = getattr(neuron_module, "v_quant", None)
    if vq is None:
        return None
    if not vq.is_initialized:
        return None
    grid = vq.grid()
    if grid is None or not grid.per_tensor:
        return None
    s = float(grid.step.detach())
    return s if pow2_exponent(s) is not None else None


def _weight_step(layer) -> Optional[float]:
    """The smallest power-of-two weight step of a quantized layer (after re-initialisation)."""
    wq = getattr(layer, "weight_quant", None)
    if wq is None:
        return None
    if not wq.is_initialized:
        _reinit_weight_quantizer(layer)  # what the first forward pass would do
    grid = wq.grid()
    if grid is None or grid.step is None:
        return None
    vals = [float(v) for v in grid.step.detach().reshape(-1)]
    if all(pow2_exponent(v) is not None for v in vals):
        return min(vals)
    return None


@torch.no_grad()
def _reinit_weight_quantizer(layer) -> str:
    wq = getattr(layer, "weight_quant", None)
    if wq is None:
        return "weight quantizer kept as it is"
    was = wq.training
    wq.mark_uninitialized()
    if wq.is_initialized:  # a quantizer without statistics (a fixed grid)
        return "weight quantizer kept as it is"
    wq.train(False)
    try:
        wq.ensure_initialized(layer.weight.detach())
    finally:
        wq.train(was)
    return f"{type(wq).__name__} statistics re-initialised from the folded weight"


def _grid_bias_quantizer(layer, leaves, i, bias_bits):
    """Give ``layer`` (leaf ``i``) a bias quantizer on the power-of-two grid min(s_w, s_v)."""
    from ..nn.quantizers import UniformQuantizer
    candidates = []
    ws = _weight_step(layer)
    if ws is not None:
        candidates.append(ws)
    for _, nxt, _ in leaves[i + 1:]:
        if _is_neuron(nxt):
            sv = _membrane_step(nxt)
            if sv is not None:
                candidates.append(sv)
            break
        if not _passes_through(nxt):
            break
    if not candidates:
        layer.bias_quant = None
        return
    s_b = min(candidates)
    peak = float(layer.bias.detach().abs().max()) if layer.bias.numel() else 0.0
    bits = bias_bits
    if bits is None:
        bits = min(32, max(8, (math.ceil(peak / s_b) + 1).bit_length() + 1))
    layer.bias_quant = UniformQuantizer(bits, step=s_b).to(layer.weight.device)


def fold_batchnorm(model: nn.Module, *, bias_bits: Optional[int] = None,
                   reinit_weight_step: bool = True, snap_biases: bool = True) -> nn.Module:
    r"""Fold every BatchNorm (eval statistics) into the synaptic layer right before it.

    .. math::

        W' = W\,\frac{\gamma}{\sqrt{\sigma^2 + \epsilon}},\qquad
        b' = (b - \mu)\,\frac{\gamma}{\sqrt{\sigma^2 + \epsilon}} + \beta

    per output channel, computed in float64. The BatchNorm is replaced by ``nn.Identity`` (so
    module names stay the same). For quantized layers:

    * the weight quantizer is kept (bits, per-channel, power-of-two restriction); with
      ``reinit_weight_step`` a learned per-channel binary/ternary :math:`\alpha` is multiplied by
      :math:`|\gamma/\sqrt{\sigma^2+\epsilon}|` (the quantized weights follow the BN scale; with
      ``power_of_two`` it is then rounded to a power of two at use, which is where folding
      changes a binary network), and an LSQ step is re-initialised from the folded weight
      (:math:`2\,\mathrm{mean}|W'|/\sqrt{q_{max}}`, rounded to a power of two for ``lsq_pow2``)
      and a min/max range re-observed, because the trained step was learned for the unfolded
      weight; fixed grids (``UniformQuantizer``, ``QuantizedBits``) are kept;
    * the bias gets a ``UniformQuantizer`` with step :math:`s_b = \min(s_w, s_v)` over the
      power-of-two ones of the layer's weight step :math:`s_w` and the membrane step
      :math:`s_v` of the next neuron layer, so that the bias is an integer on the grid the
      integer network already uses (no extra bits); ``bias_bits`` bits, by default just enough
      for :math:`\max|b'|` (at least 8).

    Accuracy: folding changes what the quantizers see; the folded model should be evaluated (or
    fine-tuned) before deployment. The fake-quantized folded model and its integer export agree
    exactly.

    Args:
        model: the network (not modified; a folded deep copy is returned).
        bias_bits: bit width of the folded bias quantizer (2..32), or ``None`` for automatic.
        reinit_weight_step: re-initialise LSQ steps / min-max ranges from the folded weights.
        snap_biases: also give the same grid bias quantizer to every quantized layer whose bias
            is not quantized (a float bias is not an integer on any grid the integer network
            can use).

    Returns:
        The folded copy of ``model``.

    Raises:
        ExportError: a BatchNorm does not directly follow a synaptic layer, or uses batch
            statistics (``track_running_stats=False``).
    """
    from spikingjelly.activation_based import functional as sjf
    from ..nn.quantizers import check_bits

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if bias_bits is not None:
        check_bits(bias_bits, "bias_bits", 2, 32)
    model = copy_model(model)
    leaves = model_walk(model)
    for i, (name, bn, _) in enumerate(leaves):
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
            continue
        prev_name, layer = (leaves[i - 1][0], leaves[i - 1][1]) if i else (None, None)
        if layer is None or not _is_synapse(layer):
            raise ExportError(f"layer {name!r} ({type(bn).__name__}): BatchNorm can only be folded "
                              f"when it directly follows a Linear/Conv layer")
        if bn.running_mean is None or bn.running_var is None:
            raise ExportError(f"layer {name!r} ({type(bn).__name__}): it has no running statistics "
                              f"(track_running_stats=False), so it normalises with batch "
                              f"statistics and cannot be folded")
        c = layer.weight.shape[0]
        if bn.num_features != c:
            raise ExportError(f"layer {name!r}: {bn.num_features} features after layer "
                              f"{prev_name!r} with {c} outputs")
        with torch.no_grad():
            dtype = layer.weight.dtype
            mean = bn.running_mean.double()
            scale = 1.0 / torch.sqrt(bn.running_var.double() + bn.eps)
            gamma = bn.weight.double() if bn.affine else torch.ones_like(mean)
            beta = bn.bias.double() if bn.affine else torch.zeros_like(mean)
            scale = gamma * scale
            w = layer.weight.double() * scale.reshape([-1] + [1] * (layer.weight.dim() - 1))
            b = layer.bias.double() if layer.bias is not None else torch.zeros_like(mean)
            b = (b - mean) * scale + beta
            layer.weight.data = w.to(dtype)
            if layer.bias is None:
                layer.bias = nn.Parameter(b.to(dtype))
            else:
                layer.bias.data = b.to(dtype)
        wq = getattr(layer, "weight_quant", None)
        if wq is not None and reinit_weight_step:
            # a scale-only quantizer (binary/ternary alpha) follows the BN scale exactly; the
            # others re-initialise their step from the folded weight
            if not wq.rescale_channels(scale.to(layer.weight.dtype)):
                _reinit_weight_quantizer(layer)
        if hasattr(layer, "weight_quant"):
            _grid_bias_quantizer(layer, leaves, i, bias_bits)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, nn.Identity())
    if snap_biases:
        for i, (name, layer, _) in enumerate(leaves):
            if _is_synapse(layer) and hasattr(layer, "weight_quant") and layer.bias is not None \
                    and layer.bias_quant is None:
                _grid_bias_quantizer(layer, leaves, i, bias_bits)
    sjf.invalidate_reset_cache(model)
    return model
