r"""What the chip operations share (each chip's operation is in its folder: ``xylo/op.py``,
``loihi/op.py``, ``speck/op.py``).

A chip's operation is one layer of an :class:`~snnquant.export.IntegerNetwork` exported from a
chip's network: its synapses and its neurons together, because a chip's arithmetic does not
split where snnquant's does: Xylo adds a step's input events to the synaptic current one event
at a time, saturating after each; Lava's ``Dense`` delays its output by one step into a 24-bit
wrapped current; a Speck core pools its neurons' spikes. Each operation holds the integers the
chip is configured with (weights, shifts, decays, thresholds) and runs them with the one step
function of :mod:`snnquant.functional.chip_neurons` that the chip layer trained with, so the
exported network computes what was trained, and the vendor's simulator is checked against it
(``tests/test_targets_*.py``).

A chip network is a sequence of operations of one chip (no branches, nothing else between
them). Its values are event counts: non-negative integers. Each operation refuses an input
count above its ``input_max`` (what the chip carries per step) or below 0, naming the
operation and the value.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from ..functional.int_limits import as_int, int_range

#: ``(field, value, why)``: a field of an operation out of its range.
Problem = Tuple[str, object, str]


def is_int(v) -> bool:
    """Whether ``v`` is a Python ``int`` (not a ``bool``)."""
    return as_int(v, numpy=False) is not None


def int_problems(op, fields) -> List[Problem]:
    """The problems of ``op``'s integer fields ``(name, lo, hi)``: each an int in ``[lo, hi]``."""
    return [(name, getattr(op, name), f"it must be an int in [{lo}, {hi}]")
            for name, lo, hi in fields
            if not is_int(getattr(op, name)) or not lo <= getattr(op, name) <= hi]


def tensor_problems(op, name: str, shape, lo: int, hi: int) -> List[Problem]:
    """The problem of ``op``'s tensor field ``name``: an integer tensor of ``shape`` (any, when
    ``None``) with values in ``[lo, hi]``."""
    t = getattr(op, name)
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() \
            or t.dtype == torch.bool:
        shown = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        return [(name, shown, "it must be an integer tensor")]
    if shape is not None and tuple(t.shape) != tuple(shape):
        return [(name, tuple(t.shape), f"its shape must be {tuple(shape)}")]
    if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
        return [(name, t, f"its values must be in [{lo}, {hi}]")]
    return []


def bias_problems(op, out: int, lo: int, hi: int) -> List[Problem]:
    """The problem of ``op.bias`` (``None``, or ``[out]`` integers in ``[lo, hi]``)."""
    return [] if op.bias is None else tensor_problems(op, "bias", (out,), lo, hi)


def checked_counts(op, x_seq: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """``x_seq`` ``[T, N, *shape]`` as float64 after checking its counts against the op."""
    if tuple(x_seq.shape[2:]) != tuple(shape) and not (
            getattr(op, "linear", False) and prod(x_seq.shape[2:]) == prod(shape)):
        raise ValueError(f"its input must be [T, N, *{tuple(shape)}], got {tuple(x_seq.shape)}")
    if x_seq.numel():
        lo, hi = int(x_seq.min()), int(x_seq.max())
        if lo < 0 or hi > op.input_max:
            raise ValueError(f"its input event counts must be in [0, {op.input_max}] (what the "
                             f"chip carries per step), got {lo if lo < 0 else hi}")
    return x_seq.to(torch.float64)


def prod(shape) -> int:
    """The number of elements of ``shape``."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


def delayed(x_seq: torch.Tensor) -> torch.Tensor:
    """``x_seq`` ``[T, ...]`` one step later: zeros first, its last step dropped."""
    return torch.cat([torch.zeros_like(x_seq[:1]), x_seq[:-1]])


class DenseLayerOp:
    """What the chip layers with ``[out, in]`` weights share: their shapes and weight check
    (signed ``weight_bits``-bit integers, the chip's width, which each subclass sets)."""

    weight_bits = 8

    @property
    def in_shape(self) -> Tuple[int, ...]:
        """One sample's input shape: ``(in,)``."""
        return (int(self.weight.shape[1]),)

    @property
    def out_shape(self) -> Tuple[int, ...]:
        """One sample's output shape: ``(out,)``."""
        return (int(self.weight.shape[0]),)

    def weight_problems(self) -> List[Problem]:
        found = tensor_problems(self, "weight", None, *int_range(self.weight_bits, True))
        if not found and self.weight.dim() != 2:
            found.append(("weight", tuple(self.weight.shape), "it must be [out, in]"))
        return found


def stacked_counts(out: list, x: torch.Tensor, shape) -> torch.Tensor:
    """The steps' outputs ``out`` as one ``int64`` tensor ``[T, N, *shape]`` (of the input
    ``x``'s ``N``, also for ``T = 0``)."""
    if not out:
        return torch.zeros((0,) + tuple(x.shape[1:2]) + tuple(shape), dtype=torch.int64)
    return torch.stack(out).to(torch.int64)
