r"""Speck's operation in an :class:`~snnquant.export.IntegerNetwork`: one Speck core (a
:class:`~snnquant.targets.SpeckIAFLayer`), in Sinabs' integers (what the chip operations share:
:mod:`snnquant.targets._op`).

The widths and ranges of a Speck core (as Sinabs 3.1's ``DynapcnnNetwork`` maps it) are written
here once: the operation checks its fields against them, and
:class:`~snnquant.targets.SpeckProfile`'s defaults and the layer's rules are them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ...functional.chip_neurons import speck_iaf_step, speck_synapse
from ...functional.int_limits import int_range
from .._op import (Problem, bias_problems, checked_counts, int_problems, is_int, prod,
                   stacked_counts, tensor_problems)

__all__ = ["SpeckLayerOp", "WEIGHT_BITS", "BIAS_RANGE", "STATE_BITS", "STRIDE_RANGE",
           "PADDING_RANGE", "POOL_RANGE", "KERNEL_RANGE", "SPIKES"]

#: The signed width of a weight (``DYNAPCNN_WEIGHT_PRECISION_BITS``).
WEIGHT_BITS = 8
#: The bias (Sinabs discretises it with the weight precision, 8 bits).
BIAS_RANGE = int_range(8, True)
#: The signed width of the membrane (``DYNAPCNN_STATE_PRECISION_BITS``).
STATE_BITS = 16
#: A convolution's stride, padding and a core's sum pooling.
STRIDE_RANGE = (1, 64)
PADDING_RANGE = (0, 64)
POOL_RANGE = (1, 64)
#: The kernel sizes a Speck convolution may have.
KERNEL_RANGE = (1, 64)
#: What a layer's ``spike`` may be: several spikes per step, or at most one.
SPIKES = ("multi", "single")


@dataclass
class SpeckLayerOp:
    r"""A Speck core (a :class:`~snnquant.targets.SpeckIAFLayer`): a convolution (or a Linear),
    integrate-and-fire neurons and a sum pooling, in Sinabs' integers.

    Per step, with the input event counts :math:`x`, it computes
    :func:`~snnquant.functional.chip_neurons.speck_synapse` and
    :func:`~snnquant.functional.chip_neurons.speck_iaf_step`:

    .. math::

        v &\leftarrow v + W * x + b\\
        n &= [v > 0]\,\lfloor v/\theta \rfloor\ (\text{multi})\quad\text{or}\quad
            [v \ge \theta]\ (\text{single})\\
        v &\leftarrow \max(v - n\theta,\ v_{min}),\qquad \text{out} = \mathrm{sumpool}_{k}(n)

    :math:`v` starts at 0 on every call.

    Attributes:
        name: the layer's name in the chip network.
        weight: ``[out, C, k, k]`` 8-bit integer weights (``[out, C*H*W]`` for a Linear).
        bias: ``[out]`` 8-bit integer bias, or ``None``.
        in_shape: the input's ``(C, H, W)`` (``(features, 1, 1)`` for a Linear after a Linear).
        linear: whether the layer is a Linear (its output ``[N, out]``).
        stride, padding: of the convolution (1 and 0 for a Linear).
        pool: :math:`k` (1: none).
        threshold: :math:`\theta` (1 to :math:`2^{15}-1`).
        spike: ``'multi'`` or ``'single'``.
        v_min: the membrane's lower bound (:math:`-2^{15}` on Speck).
        input_max: the largest input event count per step.
        inputs: as every operation's.
    """

    name: str
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    in_shape: Tuple[int, ...]
    linear: bool
    stride: int
    padding: int
    pool: int
    threshold: int
    spike: str
    v_min: int
    input_max: int
    inputs: Tuple[int, ...] = ()

    op_type = "speck_layer"
    chip = "speck"

    @property
    def out_shape(self) -> Tuple[int, ...]:
        """One sample's output shape: ``(C', H', W')`` (``(out,)`` for a Linear)."""
        out = int(self.weight.shape[0])
        if self.linear:
            return (out,)
        k = int(self.weight.shape[-1])
        h, w = ((s + 2 * self.padding - k) // self.stride + 1 for s in self.in_shape[1:])
        return (out, h // self.pool, w // self.pool)

    def problems(self) -> List[Problem]:
        """``(field, value, why)`` of the fields out of their ranges (empty when valid)."""
        found = int_problems(self, [("stride", *STRIDE_RANGE), ("padding", *PADDING_RANGE),
                                    ("pool", *POOL_RANGE),
                                    ("threshold", 1, int_range(STATE_BITS, True)[1]),
                                    ("v_min", -(1 << 31), 0), ("input_max", 1, 1 << 15)])
        if not isinstance(self.linear, bool):
            found.append(("linear", self.linear, "it must be a bool"))
        if self.spike not in SPIKES:
            found.append(("spike", self.spike, "it must be 'multi' or 'single'"))
        shape = self.in_shape
        if not isinstance(shape, tuple) or len(shape) != 3 or not all(
                is_int(s) and 1 <= s <= 1 << 16 for s in shape):
            found.append(("in_shape", shape, "it must be (C, H, W), ints in [1, 65536]"))
        found += tensor_problems(self, "weight", None, *int_range(WEIGHT_BITS, True))
        if found:
            return found
        if self.linear:
            if tuple(self.weight.shape) != (self.weight.shape[0], prod(shape)) or (
                    self.stride, self.padding, self.pool) != (1, 0, 1):
                return [("weight", tuple(self.weight.shape),
                         f"a Linear reads all {prod(shape)} inputs, with stride 1, padding 0 "
                         f"and pool 1")]
        else:
            w = self.weight.shape
            if self.weight.dim() != 4 or w[1] != shape[0] or w[2] != w[3]:
                return [("weight", tuple(w), f"it must be [out, {shape[0]}, k, k]")]
            h, wd = ((s + 2 * self.padding - w[2]) // self.stride + 1 for s in shape[1:])
            if h < 1 or wd < 1 or h % self.pool or wd % self.pool:
                return [("pool", self.pool, f"the convolution's output {h}x{wd} must be "
                                            f"non-empty and a multiple of it")]
        return bias_problems(self, int(self.weight.shape[0]), *BIAS_RANGE)

    def run(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The output counts ``[T, N, *out_shape]`` (``int64``) of the input counts
        ``[T, N, *in_shape]`` (any ``[T, N, ...]`` of as many values for a Linear)."""
        x = checked_counts(self, x_seq, self.in_shape)
        t, n = x.shape[:2]
        y = speck_synapse(x.flatten(0, 1), self.weight, self.bias, stride=self.stride,
                          padding=self.padding, linear=self.linear)
        y = y.reshape((t, n) + tuple(y.shape[1:]))
        v, out = None, []
        for i in range(t):
            if self.spike == "single":
                _within_float32(self, i, y[i] if v is None else v + y[i])
            s, v = speck_iaf_step(v, y[i], threshold=self.threshold, spike=self.spike,
                                  v_min=self.v_min, pool=self.pool)
            out.append(s.flatten(1) if self.linear else s)
        return stacked_counts(out, x, self.out_shape)

    def bits(self) -> dict:
        """Bit widths: ``{'weight': 8, 'bias': 8 or None, 'v': 16}``."""
        return {"weight": WEIGHT_BITS, "bias": 8 if self.bias is not None else None,
                "v": STATE_BITS}

    def text(self) -> str:
        """One line for :class:`~snnquant.export.IntegerNetwork`'s ``str``."""
        kind = "linear" if self.linear else (f"conv {int(self.weight.shape[-1])}x"
                                             f"{int(self.weight.shape[-1])} stride {self.stride} "
                                             f"padding {self.padding} pool {self.pool}")
        return (f"Speck core {self.in_shape} -> {self.out_shape}, {kind}, threshold "
                f"{self.threshold}, {self.spike}-spike, v_min {self.v_min}, "
                f"{'bias' if self.bias is not None else 'no bias'}")


def _within_float32(op: "SpeckLayerOp", step: int, v: torch.Tensor) -> None:
    """A single-spike membrane keeps what is above the threshold and can grow over the steps:
    past :math:`2^{24}` Sinabs (float32) rounds it, so the run stops there, naming the step."""
    if v.numel() and float(v.abs().max()) > 1 << 24:
        raise ValueError(f"at step {step} its membrane reaches {float(v.abs().max()):.0f}, beyond "
                         f"2^24 where Sinabs' float32 no longer holds every integer (with "
                         f"spike='single' it keeps what is above the threshold); "
                         f"check_speck(model, steps=T) bounds the run")
