r"""Xylo's operation in an :class:`~snnquant.export.IntegerNetwork`: one
:class:`~snnquant.targets.XyloLIFLayer`, in Xylo's integers (what the chip operations share:
:mod:`snnquant.targets._op`).

The widths and ranges of Xylo's registers are written here once: the operation checks its
fields against them, and :class:`~snnquant.targets.XyloProfile`'s defaults are them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ...functional.chip_neurons import xylo_lif_step
from ...functional.int_limits import int_range
from .._op import (DenseLayerOp, Problem, bias_problems, checked_counts, delayed, int_problems,
                   stacked_counts)

__all__ = ["XyloLayerOp", "WEIGHT_BITS", "STATE_BITS", "DASH_RANGE", "WEIGHT_SHIFT_RANGE"]

#: The signed width of a weight (``config_from_specification`` casts to ``int8``).
WEIGHT_BITS = 8
#: The signed width of the synaptic current and the membrane.
STATE_BITS = 16
#: The bit-shift decays ``dash_syn``, ``dash_mem`` (4-bit registers).
DASH_RANGE = (0, 15)
#: The weight left shifts.
WEIGHT_SHIFT_RANGE = (0, 7)


@dataclass
class XyloLayerOp(DenseLayerOp):
    r"""A layer of SynSense Xylo neurons with their input weights (a
    :class:`~snnquant.targets.XyloLIFLayer`), in Xylo's integers.

    Per step, with the input event counts :math:`c` (of the step before with ``delay=1``) and
    the weights :math:`W 2^{s}` (``weight`` shifted left by ``weight_shift``), it computes
    :func:`~snnquant.functional.chip_neurons.xylo_lif_step`:

    .. math::

        I &\leftarrow d_{I}(\mathrm{sat\_acc}(I,\ c,\ W 2^{s}))\\
        V &\leftarrow \mathrm{sat}(V + \mathrm{sat}(\mathrm{sat}(I - (V - d_{V}(V))) + b))\\
        n &= \min(\lfloor V/\theta \rfloor, n_{max})\,[V \ge \theta],\qquad
        V \leftarrow V - n\theta

    and outputs the counts :math:`n`. :math:`I` and :math:`V` start at 0 on every call.

    Attributes:
        name: the layer's name in the chip network.
        weight: ``[out, in]`` 8-bit integer weights.
        weight_shift: :math:`s` (0 to 7).
        bias: ``[out]`` integer membrane bias (``state_bits`` signed), or ``None``.
        threshold: :math:`\theta`.
        dash_syn, dash_mem: the bit-shift decays (0 to 15).
        max_spikes: :math:`n_{max}`.
        delay: 0 (reads the input channels) or 1 (reads another layer, one step later).
        input_max: the largest input event count per step.
        state_bits: the width of :math:`I` and :math:`V` (16).
        inputs: as every operation's (``()``: the one before).
    """

    name: str
    weight: torch.Tensor
    weight_shift: int
    bias: Optional[torch.Tensor]
    threshold: int
    dash_syn: int
    dash_mem: int
    max_spikes: int
    delay: int
    input_max: int
    state_bits: int = 16
    inputs: Tuple[int, ...] = ()

    op_type = "xylo_layer"
    chip = "xylo"

    weight_bits = WEIGHT_BITS

    def problems(self) -> List[Problem]:
        """``(field, value, why)`` of the fields out of their ranges (empty when valid)."""
        found = int_problems(self, [("state_bits", 2, 24),
                                    ("weight_shift", *WEIGHT_SHIFT_RANGE),
                                    ("dash_syn", *DASH_RANGE), ("dash_mem", *DASH_RANGE),
                                    ("max_spikes", 1, 1 << 15), ("delay", 0, 1),
                                    ("input_max", 1, 1 << 15)])
        if found:
            return found
        lo, hi = int_range(self.state_bits, True)
        found = int_problems(self, [("threshold", 1, hi)])
        found += self.weight_problems()
        return found or bias_problems(self, self.out_shape[0], lo, hi)

    def run(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The output counts ``[T, N, out]`` (``int64``) of the input counts ``[T, N, in]``."""
        counts = checked_counts(self, x_seq, self.in_shape)
        if self.delay:
            counts = delayed(counts)
        weight = self.weight.to(torch.float64) * 2.0 ** self.weight_shift
        bias = None if self.bias is None else self.bias.to(torch.float64)
        state, out = None, []
        for t in range(counts.shape[0]):
            n, state = xylo_lif_step(state, counts[t], weight, bias, threshold=self.threshold,
                                     dash_syn=self.dash_syn, dash_mem=self.dash_mem,
                                     max_spikes=self.max_spikes, state_bits=self.state_bits)
            out.append(n)
        return stacked_counts(out, counts, self.out_shape)

    def bits(self) -> dict:
        """Bit widths: ``{'weight': 8, 'bias': state_bits or None, 'v': state_bits}``."""
        return {"weight": WEIGHT_BITS, "bias": self.state_bits if self.bias is not None else None,
                "v": self.state_bits}

    def text(self) -> str:
        """One line for :class:`~snnquant.export.IntegerNetwork`'s ``str``."""
        return (f"Xylo layer {tuple(self.weight.shape)}, weight_shift {self.weight_shift}, "
                f"threshold {self.threshold}, dash_syn {self.dash_syn}, dash_mem "
                f"{self.dash_mem}, max_spikes {self.max_spikes}, delay {self.delay}, "
                f"{'bias' if self.bias is not None else 'no bias'}")
