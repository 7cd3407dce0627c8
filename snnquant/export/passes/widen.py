r"""The widening pass: :func:`widen_membrane_range` gives quantized membranes head room."""

from __future__ import annotations

import torch.nn as nn

__all__ = ["widen_membrane_range", "quantized_neurons"]


def quantized_neurons(model: nn.Module):
    """``(name, module)`` of every neuron with a membrane quantizer, as calibrate finds them (no
    private class asked for)."""
    return [(n, m) for n, m in model.named_modules()
            if getattr(m, "v_quant", None) is not None and hasattr(m, "v_threshold")]


def widen_membrane_range(model: nn.Module, extra_bits: int) -> nn.Module:
    r"""A copy of ``model`` whose membrane grids keep their step and gain ``extra_bits`` bits.

    .. math::

        s' = s,\qquad [q'_{min}, q'_{max}] = [-2^{b + e - 1}, 2^{b + e - 1} - 1]

    for a neuron whose membrane grid has :math:`2^b` levels of step :math:`s` and
    :math:`e` = ``extra_bits``: the range is :math:`2^e` times wider on both sides (headroom
    below zero for inhibited membranes, above for strongly driven ones) with the same resolution
    and the same power-of-two step, so spikes change only where the old grid saturated. This is
    the configuration with which NIR consumers reproduce the integer network (see the guide
    "NIR: export, import and interoperability"): with enough headroom no membrane reaches
    :math:`v_{min}` or :math:`v_{max}` (check with :func:`~snnquant.export.saturation_report`).

    Args:
        model: a quantized network; every quantized neuron's membrane quantizer must have a
            uniform per-tensor grid (initialised).
        extra_bits: bits to add, an int in ``[1, 24]``; the result may not exceed 32 bits.

    Returns:
        The widened copy (each such membrane quantizer replaced by a
        :class:`~snnquant.nn.UniformQuantizer`).

    Raises:
        ValueError: bad ``extra_bits``; a membrane grid that is not uniform per tensor or would
            exceed 32 bits (the layer is named).
    """
    import math
    from spikingjelly.activation_based import functional as sjf
    from ...nn.quantizers import UniformQuantizer
    from ...utils import copy_model

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(extra_bits, bool) or not isinstance(extra_bits, int) or not 1 <= extra_bits <= 24:
        raise ValueError(f"extra_bits must be an int in [1, 24], got {extra_bits!r}")
    work = copy_model(model)
    for name, m in quantized_neurons(work):
        grid = m.v_quant.grid()
        if grid is None or not grid.per_tensor or grid.step is None:
            raise ValueError(f"layer {name!r}: its membrane quantizer {type(m.v_quant).__name__} "
                             f"has no uniform per-tensor grid to widen")
        bits = math.ceil(math.log2(grid.qmax - grid.qmin + 1)) + extra_bits
        if bits > 32:
            raise ValueError(f"layer {name!r}: {bits - extra_bits}-bit membrane + extra_bits="
                             f"{extra_bits} is over 32 bits")
        m.v_quant = UniformQuantizer(bits, step=float(grid.step.detach())).to(grid.step.device)
    sjf.invalidate_reset_cache(work)
    return work
