r"""The operations of an :class:`~snnquant.export.IntegerNetwork` exported from a chip's network
(:mod:`snnquant.targets`): one per chip layer, computing in the chip's own integers.

A chip layer is one operation, its synapses and its neurons together, because a chip's
arithmetic does not split where snnquant's does: Xylo adds a step's input events to the synaptic
current one event at a time, saturating after each; Lava's ``Dense`` delays its output by one
step into a 24-bit wrapped current; a Speck core pools its neurons' spikes. Each operation holds
the integers the chip is configured with (weights, shifts, decays, thresholds) and runs them with
the one step function of :mod:`snnquant.functional.chip_neurons` that the chip layer trained
with, so the exported network computes what was trained, and the vendor's simulator is checked
against it (``tests/test_targets_*.py``).

A chip network is a sequence of operations of one chip (no branches, nothing else between
them). Its values are event counts: non-negative integers. Each operation refuses an input
count above its ``input_max`` (what the chip carries per step) or below 0, naming the
operation and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ...functional.int_limits import as_int
from ...functional.chip_neurons import (lava_weight, loihi_lif_step, speck_iaf_step,
                                        speck_synapse,
                                        xylo_lif_step)

__all__ = ["XyloLayerOp", "LoihiLayerOp", "SpeckLayerOp", "CHIP_OP_TYPES"]

Problem = Tuple[str, object, str]


def _is_int(v) -> bool:
    return as_int(v, numpy=False) is not None


def _int_problems(op, fields) -> List[Problem]:
    return [(name, getattr(op, name), f"it must be an int in [{lo}, {hi}]")
            for name, lo, hi in fields
            if not _is_int(getattr(op, name)) or not lo <= getattr(op, name) <= hi]


def _tensor_problems(op, name: str, shape, lo: int, hi: int) -> List[Problem]:
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


def _bias_problems(op, out: int, lo: int, hi: int) -> List[Problem]:
    return [] if op.bias is None else _tensor_problems(op, "bias", (out,), lo, hi)


def _counts(op, x_seq: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """``x_seq`` ``[T, N, *shape]`` as float64 after checking its counts against the op."""
    if tuple(x_seq.shape[2:]) != tuple(shape) and not (
            getattr(op, "linear", False) and _prod(x_seq.shape[2:]) == _prod(shape)):
        raise ValueError(f"its input must be [T, N, *{tuple(shape)}], got {tuple(x_seq.shape)}")
    if x_seq.numel():
        lo, hi = int(x_seq.min()), int(x_seq.max())
        if lo < 0 or hi > op.input_max:
            raise ValueError(f"its input event counts must be in [0, {op.input_max}] (what the "
                             f"chip carries per step), got {lo if lo < 0 else hi}")
    return x_seq.to(torch.float64)


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _delayed(x_seq: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(x_seq[:1]), x_seq[:-1]])


class _DenseLayer:
    """What the chip layers with ``[out, in]`` weights share: their shapes and weight check."""

    @property
    def in_shape(self) -> Tuple[int, ...]:
        """One sample's input shape: ``(in,)``."""
        return (int(self.weight.shape[1]),)

    @property
    def out_shape(self) -> Tuple[int, ...]:
        """One sample's output shape: ``(out,)``."""
        return (int(self.weight.shape[0]),)

    def _weight_problems(self) -> List[Problem]:
        found = _tensor_problems(self, "weight", None, -128, 127)
        if not found and self.weight.dim() != 2:
            found.append(("weight", tuple(self.weight.shape), "it must be [out, in]"))
        return found


@dataclass
class XyloLayerOp(_DenseLayer):
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

    def problems(self) -> List[Problem]:
        """``(field, value, why)`` of the fields out of their ranges (empty when valid)."""
        found = _int_problems(self, [("state_bits", 2, 24), ("weight_shift", 0, 7),
                                     ("dash_syn", 0, 15), ("dash_mem", 0, 15),
                                     ("max_spikes", 1, 1 << 15), ("delay", 0, 1),
                                     ("input_max", 1, 1 << 15)])
        if found:
            return found
        half = 1 << (self.state_bits - 1)
        found = _int_problems(self, [("threshold", 1, half - 1)])
        found += self._weight_problems()
        return found or _bias_problems(self, self.out_shape[0], -half, half - 1)

    def run(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The output counts ``[T, N, out]`` (``int64``) of the input counts ``[T, N, in]``."""
        counts = _counts(self, x_seq, self.in_shape)
        if self.delay:
            counts = _delayed(counts)
        weight = self.weight.to(torch.float64) * 2.0 ** self.weight_shift
        bias = None if self.bias is None else self.bias.to(torch.float64)
        state, out = None, []
        for t in range(counts.shape[0]):
            n, state = xylo_lif_step(state, counts[t], weight, bias, threshold=self.threshold,
                                     dash_syn=self.dash_syn, dash_mem=self.dash_mem,
                                     max_spikes=self.max_spikes, state_bits=self.state_bits)
            out.append(n)
        return _stack(out, counts, self.out_shape)

    def bits(self) -> dict:
        """Bit widths: ``{'weight': 8, 'bias': state_bits or None, 'v': state_bits}``."""
        return {"weight": 8, "bias": self.state_bits if self.bias is not None else None,
                "v": self.state_bits}

    def text(self) -> str:
        """One line for :class:`~snnquant.export.IntegerNetwork`'s ``str``."""
        return (f"Xylo layer {tuple(self.weight.shape)}, weight_shift {self.weight_shift}, "
                f"threshold {self.threshold}, dash_syn {self.dash_syn}, dash_mem "
                f"{self.dash_mem}, max_spikes {self.max_spikes}, delay {self.delay}, "
                f"{'bias' if self.bias is not None else 'no bias'}")


@dataclass
class LoihiLayerOp(_DenseLayer):
    r"""A Lava ``Dense`` + ``LIF`` pair (a :class:`~snnquant.targets.LoihiLIFLayer`), in Lava's
    fixed point.

    Per step, with the input spikes :math:`s` of the step before (``Dense`` delays by one) and
    the Lava weights :math:`2W`, it computes
    :func:`~snnquant.functional.chip_neurons.loihi_lif_step`:

    .. math::

        a &= (2W s) \ll e\\
        u &\leftarrow \mathrm{wrap}_{b}(\mathrm{sign}(u)\lfloor |u(4095 - d_u)| / 4096\rfloor
            + 64 a)\\
        v &\leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v(4096 - d_v)| / 4096\rfloor + u
            + \beta 2^{\beta_e},\ -2^{b-1}+1,\ 2^{b-1}-1)\\
        S &= [v > 64\vartheta],\qquad v \leftarrow v(1 - S)

    and outputs the spikes :math:`S`. :math:`u` and :math:`v` start at 0 on every call.

    Attributes:
        name: the layer's name in the chip network.
        weight: ``[out, in]`` 8-bit integer weights :math:`W` (Lava's weights are :math:`2W`).
        weight_exp: :math:`e` (-8 to 7).
        bias: ``[out]`` bias mantissas :math:`\beta` (13-bit signed), or ``None``.
        bias_exp: :math:`\beta_e` (0 to 7).
        vth: :math:`\vartheta` (17-bit unsigned).
        du, dv: the decays (0 to 4095).
        state_bits: :math:`b`, the width of :math:`u` and :math:`v` (24).
        inputs: as every operation's.
    """

    name: str
    weight: torch.Tensor
    weight_exp: int
    bias: Optional[torch.Tensor]
    bias_exp: int
    vth: int
    du: int
    dv: int
    state_bits: int = 24
    inputs: Tuple[int, ...] = ()

    op_type = "loihi_layer"
    chip = "loihi"
    input_max = 1

    def problems(self) -> List[Problem]:
        """``(field, value, why)`` of the fields out of their ranges (empty when valid)."""
        found = _int_problems(self, [("state_bits", 2, 32), ("weight_exp", -8, 7),
                                     ("bias_exp", 0, 7), ("vth", 0, (1 << 17) - 1),
                                     ("du", 0, 4095), ("dv", 0, 4095)])
        found += self._weight_problems()
        return found or _bias_problems(self, self.out_shape[0], -4096, 4095)

    def run(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The output spikes ``[T, N, out]`` (``int64``) of the input spikes ``[T, N, in]``."""
        spikes = _delayed(_counts(self, x_seq, self.in_shape))
        weight = lava_weight(self.weight)
        bias = None if self.bias is None else self.bias.to(torch.float64)
        state, out = None, []
        for t in range(spikes.shape[0]):
            s, state = loihi_lif_step(state, spikes[t], weight, bias, vth=self.vth, du=self.du,
                                      dv=self.dv, weight_exp=self.weight_exp,
                                      bias_exp=self.bias_exp, state_bits=self.state_bits)
            out.append(s)
        return _stack(out, spikes, self.out_shape)

    def bits(self) -> dict:
        """Bit widths: ``{'weight': 8, 'bias': 13 or None, 'v': state_bits}``."""
        return {"weight": 8, "bias": 13 if self.bias is not None else None,
                "v": self.state_bits}

    def text(self) -> str:
        """One line for :class:`~snnquant.export.IntegerNetwork`'s ``str``."""
        return (f"Loihi Dense+LIF {tuple(self.weight.shape)}, weight_exp {self.weight_exp}, "
                f"vth {self.vth}, du {self.du}, dv {self.dv}, "
                f"{'bias' if self.bias is not None else 'no bias'}")


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
        found = _int_problems(self, [("stride", 1, 64), ("padding", 0, 64), ("pool", 1, 64),
                                     ("threshold", 1, (1 << 15) - 1),
                                     ("v_min", -(1 << 31), 0), ("input_max", 1, 1 << 15)])
        if not isinstance(self.linear, bool):
            found.append(("linear", self.linear, "it must be a bool"))
        if self.spike not in ("multi", "single"):
            found.append(("spike", self.spike, "it must be 'multi' or 'single'"))
        shape = self.in_shape
        if not isinstance(shape, tuple) or len(shape) != 3 or not all(
                _is_int(s) and 1 <= s <= 1 << 16 for s in shape):
            found.append(("in_shape", shape, "it must be (C, H, W), ints in [1, 65536]"))
        found += _tensor_problems(self, "weight", None, -128, 127)
        if found:
            return found
        if self.linear:
            if tuple(self.weight.shape) != (self.weight.shape[0], _prod(shape)) or (
                    self.stride, self.padding, self.pool) != (1, 0, 1):
                return [("weight", tuple(self.weight.shape),
                         f"a Linear reads all {_prod(shape)} inputs, with stride 1, padding 0 "
                         f"and pool 1")]
        else:
            w = self.weight.shape
            if self.weight.dim() != 4 or w[1] != shape[0] or w[2] != w[3]:
                return [("weight", tuple(w), f"it must be [out, {shape[0]}, k, k]")]
            h, wd = ((s + 2 * self.padding - w[2]) // self.stride + 1 for s in shape[1:])
            if h < 1 or wd < 1 or h % self.pool or wd % self.pool:
                return [("pool", self.pool, f"the convolution's output {h}x{wd} must be "
                                            f"non-empty and a multiple of it")]
        return _bias_problems(self, int(self.weight.shape[0]), -128, 127)

    def run(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The output counts ``[T, N, *out_shape]`` (``int64``) of the input counts
        ``[T, N, *in_shape]`` (any ``[T, N, ...]`` of as many values for a Linear)."""
        x = _counts(self, x_seq, self.in_shape)
        t, n = x.shape[:2]
        y = speck_synapse(x.flatten(0, 1), self.weight, self.bias, stride=self.stride,
                          padding=self.padding, linear=self.linear)
        y = y.reshape((t, n) + tuple(y.shape[1:]))
        v, out = None, []
        for i in range(t):
            s, v = speck_iaf_step(v, y[i], threshold=self.threshold, spike=self.spike,
                                  v_min=self.v_min, pool=self.pool)
            out.append(s.flatten(1) if self.linear else s)
        return _stack(out, x, self.out_shape)

    def bits(self) -> dict:
        """Bit widths: ``{'weight': 8, 'bias': 8 or None, 'v': 16}``."""
        return {"weight": 8, "bias": 8 if self.bias is not None else None, "v": 16}

    def text(self) -> str:
        """One line for :class:`~snnquant.export.IntegerNetwork`'s ``str``."""
        kind = "linear" if self.linear else (f"conv {int(self.weight.shape[-1])}x"
                                             f"{int(self.weight.shape[-1])} stride {self.stride} "
                                             f"padding {self.padding} pool {self.pool}")
        return (f"Speck core {self.in_shape} -> {self.out_shape}, {kind}, threshold "
                f"{self.threshold}, {self.spike}-spike, v_min {self.v_min}, "
                f"{'bias' if self.bias is not None else 'no bias'}")


def _stack(out: list, x: torch.Tensor, shape) -> torch.Tensor:
    if not out:
        return torch.zeros((0,) + tuple(x.shape[1:2]) + tuple(shape), dtype=torch.int64)
    return torch.stack(out).to(torch.int64)


#: The chip operation types.
CHIP_OP_TYPES = (XyloLayerOp, LoihiLayerOp, SpeckLayerOp)
