r"""Speck's profile, its core (a convolution or Linear, integrate-and-fire neurons and a sum
pooling, training in Sinabs' integers), the core mapping, the check of a network against the
chip's limits and the conversion of a float network (the arithmetic:
:mod:`snnquant.targets.speck`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
from spikingjelly.activation_based import layer as sj_layer, neuron

from ...functional.chip_neurons import speck_iaf_step, speck_synapse
from ...functional.int_limits import int_range
from ...kernels.chip import speck_iaf_multi_step
from .._layer import (ChipLayer, Violation, check_int, chip_layers, field_violations, pow2_step,
                      refuse, sources)
from .op import (BIAS_RANGE, KERNEL_RANGE, PADDING_RANGE, POOL_RANGE, SPIKES, STATE_BITS,
                 STRIDE_RANGE, WEIGHT_BITS, SpeckLayerOp)

__all__ = ["SpeckProfile", "SPECK2F", "SpeckIAFLayer", "check_speck", "quantize_for_speck",
           "speck_cores", "field_rules", "speck_layers", "conv_out"]


@dataclass(frozen=True)
class SpeckProfile:
    """What Speck (as Sinabs' ``DynapcnnNetwork`` maps and simulates it) fixes.

    Attributes:
        name: ``'speck2f'``.
        device: the device name Sinabs' ``ChipFactory`` takes (``'speck2fmodule'``).
        weight_bits: signed weight width (``DYNAPCNN_WEIGHT_PRECISION_BITS``).
        bias_range: the bias (Sinabs discretises it with the weight precision, 8 bits).
        threshold_range: the spike threshold (16-bit state, ``DYNAPCNN_STATE_PRECISION_BITS``).
        state_bits: the membrane (16).
        kernel_memory, neuron_memory, bias_memory: each core's memory, in Sinabs' units
            (``chips/dynapcnn.py`` ``get_constraints``; 9 cores).
    """

    name: str = "speck2f"
    device: str = "speck2fmodule"
    weight_bits: int = WEIGHT_BITS
    bias_range: tuple = BIAS_RANGE
    threshold_range: tuple = (1, int_range(STATE_BITS, True)[1])
    state_bits: int = STATE_BITS
    kernel_memory: tuple = (16384, 16384, 16384, 32768, 32768, 65536, 65536, 16384, 16384)
    neuron_memory: tuple = (65536, 65536, 65536, 32768, 32768, 16384, 16384, 16384, 16384)
    bias_memory: tuple = (1024,) * 9

    def quantize_network(self, model: nn.Module, example_input=None) -> nn.Sequential:
        """:func:`~snnquant.quantize_model`'s route for this chip: :func:`quantize_for_speck`
        with this profile, the input shape of ``example_input`` (``[T, N, C, H, W]`` event
        counts) and its largest count as ``input_max`` (larger counts are refused at run time).

        Raises:
            ValueError: without ``example_input``, or when it is not 5-D.
        """
        if example_input is None or getattr(example_input, "ndim", 0) != 5:
            raise ValueError(f"example_input: a Speck network needs one input batch [T, N, C, H, "
                             f"W] of event counts (its shape and its largest count), got "
                             f"{None if example_input is None else tuple(example_input.shape)}")
        top = max(1, int(torch.as_tensor(example_input).max()))
        return quantize_for_speck(model, tuple(example_input.shape[2:]), self, input_max=top)

    @property
    def weight_range(self) -> tuple:
        """The range of the integer weights."""
        return int_range(self.weight_bits, True)

    @property
    def v_min(self) -> int:
        """The membrane's lower bound, :math:`-2^{15}` (Sinabs' default ``min_v_mem``)."""
        return int_range(self.state_bits, True)[0]


def field_rules(profile: SpeckProfile) -> tuple:
    """``(field, lo, hi)`` of a layer's integers: the one rule the layer's constructor,
    :func:`check_speck` and the file checks apply (``kernel_size`` of a convolution only)."""
    return (("threshold", *profile.threshold_range), ("stride", *STRIDE_RANGE),
            ("padding", *PADDING_RANGE), ("pool", *POOL_RANGE))


#: Speck 2f through Sinabs 3.1's ``DynapcnnNetwork``.
SPECK2F = SpeckProfile()


def conv_out(size: int, k: int, stride: int, padding: int) -> int:
    """The output size of a convolution over ``size`` values."""
    return (size + 2 * padding - k) // stride + 1


class SpeckIAFLayer(ChipLayer):
    r"""A Speck core: a convolution (or a ``Linear``, a convolution over its whole input),
    integrate-and-fire neurons and a sum pooling, computing in Sinabs' integers, in training too.

    Forward, per step, with :math:`W` the 8-bit integer weights of the latent float weights on the
    power-of-two step :math:`\Delta` and the input event counts :math:`x`:

    .. math::

        v &\leftarrow v + W * x + b\\
        n &= [v > 0]\,\lfloor v/\theta \rfloor\\
        v &\leftarrow \max(v - n\theta,\ -2^{15})\\
        y &= \mathrm{sumpool}_k(n)

    (:math:`n = [v \ge \theta]` with ``spike='single'``). Gradients: the weight rounding passes
    :math:`1/\Delta` inside the range (0 outside), the bias rounding 1; the spike count has the
    surrogate gradient :math:`\sigma'((v - \theta)/\theta)/\theta`; the lower bound passes 0
    below it, 1 above.

    Args:
        in_shape: the input's ``(channels, height, width)`` (``(features,)`` for a ``Linear``
            after a ``Linear``).
        out_channels: output channels (features of a ``Linear``).
        kernel_size: the square kernel; ``None`` for a ``Linear`` (the input flattened, the
            output ``[N, out_channels]``).
        stride, padding: of the convolution.
        pool: the sum pooling's square window and stride (1: none; a convolution only).
        threshold: :math:`\theta` (int, 1 to :math:`2^{15}-1`).
        bias: whether the neurons have an integer bias (in ``profile.bias_range``).
        weight_step: :math:`\Delta`, a power of two.
        spike: ``'multi'`` (Sinabs' ``MultiSpike``) or ``'single'`` (``SingleSpike``).
        input_max: the largest input event count per step the layer accepts.
        profile: :data:`SPECK2F`.
        surrogate_function: default ``surrogate.Sigmoid()``.
        step_mode: ``'s'`` or ``'m'`` (input ``[N, *in_shape]`` or ``[T, N, *in_shape]``).
        backend: what runs the ``'m'`` step: ``'auto'`` (the fused kernels of
            :mod:`snnquant.kernels.chip` where they can run, else the torch loop), ``'cpp'``,
            ``'cupy'`` or ``'torch'``; the spikes and states are the same.
    """

    def __init__(self, in_shape: Sequence[int], out_channels: int, kernel_size: Optional[int],
                 threshold: int, stride: int = 1, padding: int = 0, pool: int = 1,
                 bias: bool = False, weight_step: float = 2.0 ** -7, spike: str = "multi",
                 input_max: int = 1, profile: SpeckProfile = SPECK2F, surrogate_function=None,
                 step_mode: str = "s", backend: str = "auto"):
        in_shape = tuple(in_shape)
        if len(in_shape) == 1:
            in_shape = (in_shape[0], 1, 1)
        if len(in_shape) != 3:
            raise ValueError(f"in_shape must be (channels, height, width) or (features,), got "
                             f"{in_shape}")
        for i, v in enumerate(in_shape):
            check_int(v, 1, 2 ** 16, f"in_shape[{i}]")
        self.linear = kernel_size is None
        k = None if self.linear else check_int(kernel_size, *KERNEL_RANGE, "kernel_size")
        fan_in = in_shape[0] * (in_shape[1] * in_shape[2] if self.linear else k * k)
        super().__init__(fan_in, out_channels, weight_step, profile.weight_range,
                         profile.bias_range if bias else None, 0, input_max, surrogate_function,
                         step_mode, backend)
        if spike not in SPIKES:
            raise ValueError(f"spike must be 'multi' or 'single', got {spike!r}")
        self.in_shape, self.kernel_size, self.spike, self.profile = in_shape, k, spike, profile
        given = dict(threshold=threshold, stride=stride, padding=padding, pool=pool)
        for name, lo, hi in field_rules(profile):
            setattr(self, name, check_int(given[name], lo, hi, name))
        if self.linear and (stride != 1 or padding != 0 or pool != 1):
            raise ValueError("stride, padding and pool: a Linear layer (kernel_size=None) has "
                             f"none, got stride={stride}, padding={padding}, pool={pool}")
        if not self.linear:
            h, w = (conv_out(s, k, self.stride, self.padding) for s in in_shape[1:])
            if h < 1 or w < 1:
                raise ValueError(f"kernel_size {k} with padding {padding} does not fit the input "
                                 f"{in_shape[1:]}")
            if h % self.pool or w % self.pool:
                raise ValueError(f"pool {pool} does not divide the convolution's output {h}x{w} "
                                 f"(the chip drops no rows)")
            self.weight = nn.Parameter(torch.empty(out_channels, in_shape[0], k, k))
            nn.init.uniform_(self.weight, -1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in))
        self.register_memory("v", 0.0)

    @property
    def neuron_shape(self) -> tuple:
        """``(channels, height, width)`` of the neurons (before the pooling)."""
        if self.linear:
            return (self.out_features, 1, 1)
        return (self.out_features,) + tuple(
            conv_out(s, self.kernel_size, self.stride, self.padding) for s in self.in_shape[1:])

    @property
    def out_shape(self) -> tuple:
        """What the layer sends: ``(channels, height, width)`` after the pooling
        (``(features,)`` for a ``Linear``)."""
        if self.linear:
            return (self.out_features,)
        c, h, w = self.neuron_shape
        return (c, h // self.pool, w // self.pool)

    def memory(self) -> dict:
        r"""The layer's memory as Sinabs counts it (``DynapcnnLayer.memory_summary``):
        kernel :math:`c\,2^{\lceil\log_2 k^2\rceil + \lceil\log_2 f\rceil}`, neuron
        :math:`f\,2^{\lceil\log_2 h\rceil + \lceil\log_2 w\rceil}`, bias :math:`f` (0 without)."""
        c = self.in_shape[0]
        kh, kw = self.in_shape[1:] if self.linear else (self.kernel_size, self.kernel_size)
        f, h, w = self.neuron_shape
        lg = lambda n: math.ceil(math.log2(n))  # noqa: E731
        return {"kernel": c * 2 ** (lg(kh * kw) + lg(f)), "neuron": f * 2 ** (lg(h) + lg(w)),
                "bias": f if self.bias is not None else 0}

    def extra_repr(self) -> str:
        kind = "linear" if self.linear else (f"kernel_size={self.kernel_size}, stride="
                                             f"{self.stride}, padding={self.padding}, "
                                             f"pool={self.pool}")
        return (f"{self.in_shape}, {self.out_features}, {kind}, threshold={self.threshold}, "
                f"weight_step=2**{int(math.log2(self.weight_step))}, "
                f"bias={self.bias is not None}, spike={self.spike}, step_mode={self.step_mode}, "
                f"backend={self.backend}")

    def _synapse(self, x: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        if x.shape[1:] != self.in_shape and not (self.linear and x[0].numel() == self.in_features):
            raise ValueError(f"{type(self).__name__}: input must be [N, *{self.in_shape}], got "
                             f"{tuple(x.shape)}")
        return speck_synapse(x, w, b, stride=self.stride, padding=self.padding,
                             linear=self.linear)

    def _neuron(self, y: torch.Tensor) -> torch.Tensor:
        n, self.v = speck_iaf_step(self.v if isinstance(self.v, torch.Tensor) else None, y,
                                   threshold=self.threshold, spike=self.spike,
                                   v_min=self.profile.v_min, pool=self.pool, fire=self._fire)
        return n.flatten(1) if self.linear else n

    def integer_op(self, name: str) -> SpeckLayerOp:
        """The layer as a :class:`~snnquant.targets.speck.op.SpeckLayerOp` named ``name``."""
        w, b = self._integers()
        return SpeckLayerOp(name=name, weight=w, bias=b, in_shape=tuple(self.in_shape),
                            linear=self.linear, stride=self.stride, padding=self.padding,
                            pool=self.pool, threshold=self.threshold, spike=self.spike,
                            v_min=self.profile.v_min, input_max=self.input_max)

    def _chip_weight(self, w: torch.Tensor) -> torch.Tensor:
        return w

    def _step(self, c: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        return self._neuron(self._synapse(c, w, b)).to(torch.float32)

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        self._check_counts(x_seq)
        t, n = x_seq.shape[:2]
        y = self._synapse(x_seq.flatten(0, 1), self.integer_weight(), self.integer_bias())
        y = y.reshape(t, n, *y.shape[1:])
        out, v = speck_iaf_multi_step(
            self.v if isinstance(self.v, torch.Tensor) else None, y, threshold=self.threshold,
            spike=self.spike, v_min=self.profile.v_min, pool=self.pool,
            surrogate_function=self.surrogate_function, backend=self.backend)
        if v is not None:   # None: no step was run on a fresh layer
            self.v = v
        return (out.flatten(2) if self.linear else out).to(torch.float32)


def speck_layers(model: nn.Module) -> List[tuple]:
    """``(name, layer)`` of every :class:`SpeckIAFLayer` of ``model``, in order."""
    return chip_layers(model, SpeckIAFLayer, "Speck")


def _match(fits: List[List[int]]) -> Optional[List[int]]:
    """One core per layer (``fits[i]``: the cores layer ``i`` fits), or ``None`` (augmenting
    paths: a bipartite matching, as Sinabs' ``get_valid_mapping`` finds with a max flow)."""
    owner: dict = {}

    def place(i, seen):
        for c in fits[i]:
            if c not in seen:
                seen.add(c)
                if c not in owner or place(owner[c], seen):
                    owner[c] = i
                    return True
        return False

    if not all(place(i, set()) for i in range(len(fits))):
        return None
    core = [0] * len(fits)
    for c, i in owner.items():
        core[i] = c
    return core


def speck_cores(model: nn.Module, profile: Optional[SpeckProfile] = None) -> Optional[List[int]]:
    """A core for each layer of ``model`` under ``profile``'s memory per core (Sinabs' rule), or
    ``None`` when there is none."""
    layers = speck_layers(model)
    profile = profile or (layers[0][1].profile if layers else SPECK2F)
    fits = []
    for _, m in layers:
        mem = m.memory()
        fits.append([c for c in range(len(profile.kernel_memory))
                     if mem["kernel"] <= profile.kernel_memory[c]
                     and mem["neuron"] <= profile.neuron_memory[c]
                     and mem["bias"] <= profile.bias_memory[c]])
    return _match(fits)


def _layer_field_violations(name: str, m: "SpeckIAFLayer", profile: SpeckProfile) -> list:
    """The layer's integers and choices as they are now, by its constructor's rules."""
    found = field_violations(name, m, field_rules(profile))
    if m.spike not in SPIKES:
        found.append(Violation(name, f"spike one of {list(SPIKES)}", m.spike))
    if found or m.linear:
        if not found and (m.stride, m.padding, m.pool) != (1, 0, 1):
            found.append(Violation(name, "stride 1, padding 0, pool 1 (a Linear layer)",
                                   (m.stride, m.padding, m.pool)))
        return found
    found += field_violations(name, m, (("kernel_size", *KERNEL_RANGE),))
    if not found:
        _, h, w = m.neuron_shape
        if h < 1 or w < 1 or h % m.pool or w % m.pool:
            found.append(Violation(name, f"a convolution output ({h}x{w}) of at least 1x1 that "
                                         f"pool divides", m.pool))
    return found


#: Sinabs computes in float32, which holds every integer up to this magnitude
FLOAT32_EXACT = 2 ** 24


def _float32_violation(name: str, m: "SpeckIAFLayer", x_max: float,
                       steps: Optional[int] = None) -> tuple:
    r"""``(violations, largest count the layer sends per step)`` for input counts up to
    ``x_max``: the partial sums of a neuron's current lie in :math:`[-\sum_j W^-_j x_{max} -
    b^-,\ \sum_j W^+_j x_{max} + b^+]`, and with multi-spike neurons the membrane before firing
    is at most :math:`\theta - 1` plus the positive end; both must stay within :math:`2^{24}`
    (Sinabs adds in float32). A neuron then sends at most :math:`\lfloor(\theta - 1 +
    \sum_j W^+_j x_{max} + b^+)/\theta\rfloor` spikes (1 with single spikes), times
    :math:`k^2` after a :math:`k \times k` sum pooling. A single-spike neuron keeps what is
    above the threshold (one spike a step), so with the largest current :math:`P > \theta` its
    membrane before firing grows to at most :math:`P + (T - 1)(P - \theta)` over ``steps``
    :math:`T`: that must stay within :math:`2^{24}` too (not checked without ``steps``)."""
    with torch.no_grad():
        w = m.integer_weight().detach().to(torch.float64).flatten(1)
        pos, neg = w.clamp(min=0).sum(1) * x_max, (-w).clamp(min=0).sum(1) * x_max
        if m.bias is not None:
            b = m.integer_bias().detach().to(torch.float64)
            pos, neg = pos + b.clamp(min=0), neg + (-b).clamp(min=0)
    top = m.threshold - 1 + float(pos.max())
    sent = (top // m.threshold if m.spike == "multi" else 1) * m.pool ** 2
    reach = max(top, float(neg.max()))
    p = float(pos.max())
    if m.spike == "single" and steps is not None and p > m.threshold:
        grown = p + (steps - 1) * (p - m.threshold)
        if grown > FLOAT32_EXACT:
            longest = int((FLOAT32_EXACT - p) // (p - m.threshold)) + 1
            return [Violation(name, f"a single-spike membrane within 2^24 = {FLOAT32_EXACT} "
                                    f"over {steps} steps (it keeps what is above the threshold, "
                                    f"up to {p - m.threshold:.0f} more a step: at most "
                                    f"{max(longest, 0)} steps for input counts up to "
                                    f"{x_max:.0f}; Sinabs computes in float32)",
                              f"{grown:.0f}")], sent
    if reach <= FLOAT32_EXACT:
        return [], sent
    return [Violation(name, f"input current and membrane within 2^24 = {FLOAT32_EXACT} for "
                            f"input counts up to {x_max:.0f} (Sinabs computes in float32; "
                            f"lower input_max or the weights)", f"{reach:.0f}")], sent


def check_speck(model: nn.Module, profile: Optional[SpeckProfile] = None, *,
                steps: Optional[int] = None) -> List[Violation]:
    r"""Every way ``model`` (a stack of :class:`SpeckIAFLayer`) exceeds ``profile``'s limits: a
    layer's profile, consecutive shapes, a layer larger than every core's memory, more layers than
    cores or no assignment of layers to distinct cores, and a threshold too close to the 16-bit
    membrane's top: the chip updates a neuron event by event and fires as soon as
    :math:`v \ge \theta`, so its membrane reaches at most :math:`\theta - 1` plus one event's
    weight (and the bias), which must stay within :math:`2^{15}-1` (below, the membrane is bounded
    at :math:`-2^{15}`); and a layer whose input current could leave :math:`\pm 2^{24}`, where
    Sinabs' float32 stops holding every integer (:func:`_float32_violation`). Each layer's
    threshold, stride, padding, pool, kernel and spike are checked as they are now, by the rules
    its constructor applies.

    With ``spike='single'`` a neuron fires at most once a step and keeps what is above the
    threshold, so its membrane can grow over the run; given the run's ``steps`` :math:`T`, a layer
    whose membrane could leave :math:`2^{24}` within them is listed too (without ``steps``,
    :class:`~snnquant.export.IntegerSNN` refuses the step of a run at which it does).

    Args:
        model: the stack of :class:`SpeckIAFLayer`.
        profile: default: the first layer's.
        steps: the number of time steps :math:`T` of a run (an int >= 1), or ``None``.

    Returns:
        The list of :class:`Violation` (empty when the network fits).
    """
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps < 1):
        raise ValueError(f"steps must be None or the number of time steps (an int >= 1), got "
                         f"{steps!r}")
    layers = speck_layers(model)
    if not layers:
        return [Violation("", "at least one SpeckIAFLayer", "none")]
    profile = profile or layers[0][1].profile
    found, previous, sent_max = [], None, 0
    top = 2 ** (profile.state_bits - 1) - 1
    n_cores = len(profile.kernel_memory)
    for name, m in layers:
        if m.profile != profile:
            found.append(Violation(name, f"profile {profile.name}", m.profile.name))
        bad = _layer_field_violations(name, m, profile)
        if bad:
            found += bad
            previous = m
            continue
        if previous is not None:
            want = previous.out_shape
            got = (m.in_features,) if m.linear and len(want) == 1 else m.in_shape
            if tuple(want) != tuple(got) and not (m.linear and math.prod(want) == m.in_features):
                found.append(Violation(name, f"input shape {tuple(want)} (what the previous "
                                             f"layer sends)", m.in_shape))
        mem = m.memory()
        for key, caps in (("kernel", profile.kernel_memory), ("neuron", profile.neuron_memory),
                          ("bias", profile.bias_memory)):
            if mem[key] > max(caps):
                found.append(Violation(name, f"{key} memory <= {max(caps)} (the largest core)",
                                       mem[key]))
        x_max = m.input_max if previous is None else min(m.input_max, sent_max)
        bad, sent_max = _float32_violation(name, m, x_max, steps)
        found += bad
        with torch.no_grad():
            reach = max(float(m.integer_weight().max()), 0.0)
            if m.bias is not None:
                reach += max(float(m.integer_bias().max()), 0.0)
        if m.threshold - 1 + reach > top:
            found.append(Violation(name, f"threshold - 1 + the largest weight and bias <= {top} "
                                         f"(the 16-bit membrane, updated event by event)",
                                   f"{m.threshold - 1 + reach:.0f}"))
        previous = m
    if len(layers) > n_cores:
        found.append(Violation("", f"layers <= {n_cores} (cores)", len(layers)))
    elif not found and speck_cores(model, profile) is None:
        found.append(Violation("", "each layer on its own core with enough memory",
                               [m.memory() for _, m in layers]))
    return found


def _speck_units(model: nn.Module, chip: str) -> List[dict]:
    """The layers of an ``nn.Sequential`` of ``Conv2d``/``Linear`` + ``IFNode`` (+ ``AvgPool2d``)
    units, ``Flatten``/``Identity`` between them."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential, got {type(model).__name__}")
    units, pending = [], None
    for name, m in model.named_children():
        if isinstance(m, (nn.Flatten, sj_layer.Flatten, nn.Identity)) and pending is None:
            continue
        if isinstance(m, (nn.Conv2d, nn.Linear)) and pending is None:
            pending = {"syn": (name, m)}
        elif isinstance(m, neuron.IFNode) and type(m) is neuron.IFNode and pending is not None:
            if m.v_reset is not None:
                raise ValueError(f"model.{name}: {chip}'s neurons reset by subtracting the "
                                 f"threshold; build the IFNode with v_reset=None, got "
                                 f"v_reset={m.v_reset}")
            pending["neuron"] = (name, m)
            units.append(pending)
            pending = None
        elif isinstance(m, nn.AvgPool2d) and pending is None and units and "pool" not in units[-1]:
            k = m.kernel_size if isinstance(m.kernel_size, int) else m.kernel_size[0]
            stride = m.stride if isinstance(m.stride, int) else m.stride[0]
            if m.kernel_size not in (k, (k, k)) or stride != k or m.padding not in (0, (0, 0)) \
                    or m.ceil_mode:
                raise ValueError(f"model.{name}: {chip} pools k x k windows with stride k, no "
                                 f"padding; got {m}")
            units[-1]["pool"] = (name, k)
        elif isinstance(m, neuron.BaseNode):
            raise ValueError(f"model.{name}: {chip}'s neurons are integrate-and-fire without "
                             f"leak (IFNode); {type(m).__name__} has no {chip} equivalent")
        else:
            raise ValueError(f"model.{name}: a {chip} network is Conv2d/Linear + IFNode units "
                             f"(each optionally followed by AvgPool2d); {type(m).__name__} here "
                             f"has no place on the chip")
    if pending is not None or not units:
        raise ValueError(f"model: a {chip} network is Conv2d/Linear + IFNode units, ending with "
                         f"a neuron")
    return units


def quantize_for_speck(model: nn.Module, input_shape: Sequence[int],
                       profile: SpeckProfile = SPECK2F, input_max: int = 1,
                       spike: str = "multi", surrogate_function=None,
                       step_mode: str = "m", backend: str = "auto") -> nn.Sequential:
    r"""A SpikingJelly network of ``Conv2d``/``Linear`` + ``IFNode`` units (each optionally
    followed by an ``AvgPool2d``) as a stack of :class:`SpeckIAFLayer` that trains in Sinabs'
    Speck arithmetic.

    Each unit becomes one layer with the weights on the power-of-two step
    :math:`\Delta = 2^{\lceil\log_2(\max|w|/127)\rceil}`, :math:`\theta =
    \mathrm{round}(V_{th}/\Delta)` and the bias :math:`\mathrm{round}(b/\Delta)`. A
    :math:`k \times k` average pooling becomes the layer's sum pooling, and its :math:`1/k^2`
    moves into the next layer's weights (before they are put on the grid). The result computes
    a different network (Sinabs' multi-spike neurons, integer roundings): train (or fine-tune) it.

    Args:
        model: the ``nn.Sequential``.
        input_shape: ``(channels, height, width)`` of the input.
        profile: :data:`SPECK2F`.
        input_max: the largest input event count per step (the first layer's ``input_max``;
            the later layers take up to :math:`2^{15}`).
        spike: ``'multi'`` or ``'single'`` (see :class:`SpeckIAFLayer`).
        surrogate_function, step_mode: of every layer.
        backend: of every layer (what runs its ``'m'`` step, see :class:`SpeckIAFLayer`).

    Raises:
        ValueError: naming the module, for any other module, a neuron that leaks or resets to a
            value (``v_reset`` not ``None``), a pooling that is not k x k with stride k, a
            threshold or bias beyond the chip's ranges, and listing every limit the result
            exceeds.
    """
    units = _speck_units(model, "Speck")
    lo, hi = profile.weight_range
    shape, scale, layers = tuple(input_shape), 1.0, []
    for i, unit in enumerate(units):
        sname, syn = unit["syn"]
        nname, neu = unit["neuron"]
        w = syn.weight.detach() * scale
        step = pow2_step(w, hi)
        threshold = round(float(neu.v_threshold) / step)
        if not profile.threshold_range[0] <= threshold <= profile.threshold_range[1]:
            raise ValueError(f"model.{nname}: v_threshold {neu.v_threshold} is threshold="
                             f"{threshold} for the weight step of model.{sname}, beyond "
                             f"{profile.threshold_range}")
        if syn.bias is not None:
            big = float(syn.bias.detach().abs().max()) / step
            if round(big) > profile.bias_range[1]:
                raise ValueError(f"model.{sname}: bias {big * step:g} is {round(big)} weight "
                                 f"steps, beyond the chip's {profile.bias_range} (train with a "
                                 f"smaller bias, or bias=False)")
        pool = unit["pool"][1] if "pool" in unit else 1
        common = dict(threshold=threshold, bias=syn.bias is not None, weight_step=step,
                      spike=spike, input_max=input_max if i == 0 else 2 ** 15, profile=profile,
                      surrogate_function=surrogate_function, step_mode=step_mode,
                      backend=backend)
        if isinstance(syn, nn.Conv2d):
            k, st, pad = syn.kernel_size, syn.stride, syn.padding
            if k[0] != k[1] or st[0] != st[1] or pad[0] != pad[1] or syn.groups != 1 \
                    or syn.dilation != (1, 1) or syn.padding_mode != "zeros":
                raise ValueError(f"model.{sname}: Speck convolutions are square, ungrouped, "
                                 f"undilated, zero-padded, with one stride; got {syn}")
            new = SpeckIAFLayer(shape, syn.out_channels, k[0], stride=st[0], padding=pad[0],
                                pool=pool, **common)
        else:
            if pool != 1:
                raise ValueError(f"model.{unit['pool'][0]}: Speck pools after a convolution only")
            if math.prod(shape) != syn.in_features:
                raise ValueError(f"model.{sname}: in_features {syn.in_features}, but its input is "
                                 f"{shape}")
            new = SpeckIAFLayer(shape, syn.out_features, None, **common)
        with torch.no_grad():
            new.weight.copy_(w.reshape(new.weight.shape).clamp(lo * step, hi * step))
            if syn.bias is not None:
                new.bias.copy_(syn.bias / step)
        new.converted_from = sources(unit["syn"], unit["neuron"], *(
            [(unit["pool"][0], model.get_submodule(unit["pool"][0]))] if "pool" in unit else []))
        layers.append(new)
        shape, scale = new.out_shape, 1.0 / (pool * pool)
    out = nn.Sequential(*layers)
    refuse(check_speck(out, profile), "quantize_for_speck")
    return out
