r"""Progressive lowering of the weight bits during training (e.g. 4 -> 2 bits): train at a wider
grid first, then narrow the learned-step weight quantizers of a quantized network in place and
train on.

When a quantizer narrows, its step is initialised again from the current weights by the LSQ rule
on the next forward (:math:`s_0 = 2\,\mathrm{mean}|w| / \sqrt{q_{max}}`, per channel), rounded to a
power of two by ``lsq_pow2``; the network stays exactly exportable.
"""
from __future__ import annotations

from typing import List

import torch.nn as nn

__all__ = ["lower_weight_bits"]


def lower_weight_bits(model: nn.Module, weight_bits: int) -> List[str]:
    r"""Narrow every learned-step (LSQ) weight quantizer of ``model`` wider than ``weight_bits``
    to ``weight_bits``; return the names of the layers changed.

    .. math::

        [q_{min}, q_{max}] \leftarrow [-2^{b-1}, 2^{b-1} - 1], \qquad
        s \leftarrow 2\,\mathrm{mean}|w| / \sqrt{q_{max}} \text{ at the next forward}

    Call it between epochs and keep training (the optimizer keeps the same step parameters).

    Args:
        model: a network quantized by :func:`~snnquant.quantize_model` with ``'lsq'`` or
            ``'lsq_pow2'`` weights.
        weight_bits: the new width, >= 2 (a narrower grid than binary needs another quantizer).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(weight_bits, bool) or not isinstance(weight_bits, int) or weight_bits < 2:
        raise ValueError(f"weight_bits must be an int >= 2, got {weight_bits!r}")
    changed = []
    for name, module in model.named_modules():
        q = getattr(module, "weight_quant", None)
        if not callable(getattr(q, "set_bits", None)) or q.bits <= weight_bits:
            continue  # only the learned-step quantizers change their width in place
        q.set_bits(weight_bits)
        changed.append(name)
    if not changed:
        raise ValueError(f"lower_weight_bits: no LSQ weight quantizer of {type(model).__name__} "
                         f"is wider than {weight_bits} bits")
    return changed
