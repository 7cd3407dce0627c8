r"""Loihi 2's profile, its layer (a Lava ``Dense`` and ``LIF`` pair, training in Lava's fixed
point), the check of a network against the chip's limits and the conversion of a float network
(the arithmetic: :mod:`snnquant.targets.loihi`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import neuron

from ...functional.chip_neurons import lava_weight, loihi_lif_step
from ...functional.int_limits import int_range
from ...kernels.chip import loihi_lif_multi_step
from .._layer import (ChipLayer, Violation, check_int, chip_layers, field_violations,
                      linear_neuron_pairs, pow2_step, refuse, sources)
from .op import (BIAS_EXP_RANGE, BIAS_RANGE, DECAY_RANGE, STATE_BITS, VTH_RANGE, WEIGHT_BITS,
                 WEIGHT_EXP_RANGE, LoihiLayerOp)

__all__ = ["LoihiProfile", "LOIHI2", "LoihiLIFLayer", "check_loihi", "quantize_for_loihi",
           "field_rules", "loihi_layers"]


@dataclass(frozen=True)
class LoihiProfile:
    """What Loihi 2 (as Lava's fixed-point models compute it) fixes.

    Attributes:
        name: ``'loihi2'``.
        weight_bits: the signed weight width :math:`W` (Lava's weight :math:`2W`,
            ``num_weight_bits=8`` with mixed signs).
        weight_exp_range: ``Dense``'s ``weight_exp``.
        decay_range: ``du``, ``dv`` (12-bit unsigned, ``PyLifModelBitAcc``'s docstring).
        vth_range: the threshold mantissa (17-bit unsigned).
        bias_range: ``bias_mant`` (13-bit signed).
        bias_exp_range: ``bias_exp`` (3-bit unsigned): the bias is ``bias_mant << bias_exp``.
        state_bits: :math:`u` and :math:`v` (24).
        max_neurons: neurons of one Loihi 2 chip (Intel's Loihi 2 brief: about one million, 128
            cores of up to 8,192).
    """

    name: str = "loihi2"
    weight_bits: int = WEIGHT_BITS
    weight_exp_range: tuple = WEIGHT_EXP_RANGE
    decay_range: tuple = DECAY_RANGE
    vth_range: tuple = VTH_RANGE
    bias_range: tuple = BIAS_RANGE
    bias_exp_range: tuple = BIAS_EXP_RANGE
    state_bits: int = STATE_BITS
    max_neurons: int = 128 * 8192

    def quantize_network(self, model: nn.Module, example_input=None) -> nn.Sequential:
        """:func:`~snnquant.quantize_model`'s route for this chip: :func:`quantize_for_loihi`
        with this profile and its defaults (``example_input`` is not needed)."""
        return quantize_for_loihi(model, self)

    @property
    def weight_range(self) -> tuple:
        """The range of :math:`W`."""
        return int_range(self.weight_bits, True)


def field_rules(profile: LoihiProfile) -> tuple:
    """``(field, lo, hi)`` of a layer's integers: the one rule the layer's constructor,
    :func:`check_loihi` and the file checks apply."""
    return (("vth", *profile.vth_range), ("du", *profile.decay_range),
            ("dv", *profile.decay_range), ("weight_exp", *profile.weight_exp_range),
            ("bias_exp", *profile.bias_exp_range))


#: Loihi 2 through Lava 0.10's fixed-point CPU models.
LOIHI2 = LoihiProfile()


class LoihiLIFLayer(ChipLayer):
    r"""A Lava ``Dense`` + ``LIF`` pair computing in Lava's fixed point, in training too.

    Forward, per step (see :mod:`snnquant.targets.loihi` for the rules), with the input spikes
    :math:`s` of the previous step, :math:`W` the 8-bit integer weights of the latent float
    weights on the power-of-two step :math:`\Delta`:

    .. math::

        a &= (2W s) \ll e\\
        u &\leftarrow \mathrm{wrap}_{24}(\mathrm{sign}(u)\lfloor |u(4095 - d_u)| / 4096\rfloor
            + 64 a)\\
        v &\leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v(4096 - d_v)| / 4096\rfloor + u + b,
            \ -2^{23}+1,\ 2^{23}-1)\\
        S &= [v > 64\vartheta],\qquad v \leftarrow v(1 - S)

    Gradients: the roundings pass the gradient of the real values (:math:`\partial W/\partial w =
    1/\Delta` inside the range; the decays :math:`(4095 - d_u)/4096` and
    :math:`(4096 - d_v)/4096`; the right shift of a negative ``weight_exp`` :math:`2^{e}`); the
    wrap and the clip pass 1 (the clip 0 outside); the spike has the surrogate gradient
    :math:`\sigma'((v - 64\vartheta)/(64\vartheta))/(64\vartheta)`.

    Args:
        in_features, out_features: sizes.
        vth: :math:`\vartheta` (int, 17-bit).
        du, dv: decays (ints, 0 to 4095).
        weight_step: :math:`\Delta`, a power of two.
        weight_exp: :math:`e` (int, -8 to 7).
        bias: whether the neurons have a bias :math:`b` = ``bias_mant << bias_exp`` (the
            mantissa learned, integer).
        bias_exp: the layer's ``bias_exp`` (0 to 7).
        profile: :data:`LOIHI2`.
        surrogate_function: default ``surrogate.Sigmoid()``.
        step_mode: ``'s'`` or ``'m'``; the input is 0/1 spikes (``[N, in]`` or ``[T, N, in]``).
        backend: what runs the ``'m'`` step: ``'auto'`` (the fused kernels of
            :mod:`snnquant.kernels.chip` where they can run, else the torch loop), ``'cpp'``,
            ``'cupy'`` or ``'torch'``; the spikes and states are the same.
    """

    def __init__(self, in_features: int, out_features: int, vth: int, du: int = 4095,
                 dv: int = 2048, weight_step: float = 2.0 ** -7, weight_exp: int = 0,
                 bias: bool = False, bias_exp: int = 0, profile: LoihiProfile = LOIHI2,
                 surrogate_function=None, step_mode: str = "s",
                 backend: str = "auto"):
        super().__init__(in_features, out_features, weight_step, profile.weight_range,
                         profile.bias_range if bias else None, 1, 1, surrogate_function,
                         step_mode, backend)
        self.profile = profile
        given = dict(vth=vth, du=du, dv=dv, weight_exp=weight_exp, bias_exp=bias_exp)
        for name, lo, hi in field_rules(profile):
            setattr(self, name, check_int(given[name], lo, hi, name))
        self.register_memory("u", 0.0)
        self.register_memory("v", 0.0)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, vth={self.vth}, du={self.du}, "
                f"dv={self.dv}, weight_step=2**{int(math.log2(self.weight_step))}, "
                f"weight_exp={self.weight_exp}, bias={self.bias is not None}, "
                f"step_mode={self.step_mode}, backend={self.backend}")

    def integer_op(self, name: str) -> LoihiLayerOp:
        """The layer as a :class:`~snnquant.targets.loihi.op.LoihiLayerOp` named ``name``."""
        w, b = self._integers()
        return LoihiLayerOp(name=name, weight=w, weight_exp=self.weight_exp, bias=b,
                            bias_exp=self.bias_exp, vth=self.vth, du=self.du, dv=self.dv,
                            state_bits=self.profile.state_bits)

    def _chip_weight(self, w: torch.Tensor) -> torch.Tensor:
        return lava_weight(w)

    def _step(self, c: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        state = None if not isinstance(self.u, torch.Tensor) else (self.u, self.v)
        s, (self.u, self.v) = loihi_lif_step(
            state, c, w, b, vth=self.vth, du=self.du, dv=self.dv, weight_exp=self.weight_exp,
            bias_exp=self.bias_exp, state_bits=self.profile.state_bits, fire=self._fire)
        return s.to(c.dtype)

    def _multi_step(self, c_seq: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        state = None if not isinstance(self.u, torch.Tensor) else (self.u, self.v)
        s, state = loihi_lif_multi_step(
            state, c_seq, w, b, vth=self.vth, du=self.du, dv=self.dv, weight_exp=self.weight_exp,
            bias_exp=self.bias_exp, state_bits=self.profile.state_bits,
            surrogate_function=self.surrogate_function, backend=self.backend)
        if state is not None:   # None: no step was run on a fresh layer
            self.u, self.v = state
        return s.to(c_seq.dtype)


def loihi_layers(model: nn.Module) -> List[tuple]:
    """``(name, layer)`` of every :class:`LoihiLIFLayer` of ``model``, in order."""
    return chip_layers(model, LoihiLIFLayer, "Loihi")


def check_loihi(model: nn.Module, profile: Optional[LoihiProfile] = None) -> List[Violation]:
    """Every way ``model`` (a stack of :class:`LoihiLIFLayer`) exceeds ``profile``'s limits:
    a layer's profile, consecutive sizes, the chip's neuron count, and an activation that could
    overflow Lava's int32 arithmetic (the largest sum of a neuron's :math:`|2W| 2^{e}`, shifted
    left by 6 and added to a 24-bit current), and each layer's threshold, decays and exponents
    as they are now, by the rules its constructor applies.

    Returns:
        The list of :class:`Violation` (empty when the network fits).
    """
    layers = loihi_layers(model)
    if not layers:
        return [Violation("", "at least one LoihiLIFLayer", "none")]
    profile = profile or layers[0][1].profile
    found, previous = [], None
    for name, m in layers:
        if m.profile != profile:
            found.append(Violation(name, f"profile {profile.name}", m.profile.name))
        found += field_violations(name, m, field_rules(profile))
        if previous is not None and m.in_features != previous.out_features:
            found.append(Violation(name, f"in_features == {previous.out_features} (the previous "
                                         f"layer's out_features)", m.in_features))
        previous = m
    for name, m in layers:
        if not isinstance(m.weight_exp, int):
            continue
        with torch.no_grad():
            reach = float((2 * m.integer_weight()).abs().sum(1).max()) * 2.0 ** max(m.weight_exp, 0)
        if reach * 64 + 2 ** (profile.state_bits - 1) > 2 ** 31 - 1:
            found.append(Violation(name, "largest input sum << 6 plus the current within int32 "
                                         "(Lava adds them in int32)", f"{reach * 64:.0f}"))
    neurons = sum(m.out_features for _, m in layers)
    if neurons > profile.max_neurons:
        found.append(Violation("", f"neurons <= {profile.max_neurons}", neurons))
    return found


def quantize_for_loihi(model: nn.Module, profile: LoihiProfile = LOIHI2,
                       surrogate_function=None, step_mode: str = "m",
                       backend: str = "auto") -> nn.Sequential:
    r"""A SpikingJelly network of ``Linear`` + ``LIFNode``/``IFNode`` pairs as a stack of
    :class:`LoihiLIFLayer` that trains in Lava's fixed point.

    Each pair becomes one layer with the weights on the power-of-two step
    :math:`\Delta = 2^{\lceil\log_2(\max|w|/127)\rceil}` (``weight_exp`` 0), ``du`` = 4095 (the
    current lasts one step, as SpikingJelly's neurons take their input), and, for a LIF with
    :math:`\tau` (``decay_input=True``), ``dv`` :math:`= \mathrm{round}(4096/\tau)` and
    :math:`\vartheta = \mathrm{round}(2\tau V_{th}/\Delta)` (Lava integrates the whole input
    where SpikingJelly integrates :math:`X/\tau`: the voltage is :math:`128\tau/\Delta` times
    SpikingJelly's); for an IF ``dv`` = 0 and :math:`\vartheta = \mathrm{round}(2V_{th}/\Delta)`;
    the ``Linear`` bias :math:`b` becomes :math:`128 b / \Delta` current units, as ``bias_mant``
    with the smallest ``bias_exp`` that fits the 13-bit mantissa. The
    result computes a different network (one step of delay per layer, Lava's roundings and
    reset): train (or fine-tune) it.

    Args:
        model: the ``nn.Sequential``.
        profile: :data:`LOIHI2`.
        surrogate_function, step_mode: of every layer.
        backend: of every layer (what runs its ``'m'`` step, see :class:`LoihiLIFLayer`).

    Raises:
        ValueError: naming the module, for any other module, a reset other than to 0
            (``v_reset=0.0``), ``decay_input=False``, a threshold or bias beyond Lava's ranges,
            and listing every limit the result exceeds.
    """
    pairs = linear_neuron_pairs(model, "Loihi", 0.0, "Lava's LIF resets the voltage to 0")
    lo, hi = profile.weight_range
    layers = []
    for (lname, lin), (nname, neu) in pairs:
        step = pow2_step(lin.weight, hi)
        tau = float(neu.tau) if isinstance(neu, neuron.LIFNode) else 1.0
        dv = round(4096 / tau) if isinstance(neu, neuron.LIFNode) else 0
        vth = round(2 * tau * float(neu.v_threshold) / step)
        if not profile.vth_range[0] <= vth <= profile.vth_range[1]:
            raise ValueError(f"model.{nname}: v_threshold {neu.v_threshold} is vth={vth} for the "
                             f"weight step of model.{lname}, beyond {profile.vth_range}")
        bias_exp = 0
        if lin.bias is not None:
            big = float(lin.bias.detach().abs().max()) * 128 / step
            bias_exp = max(0, math.ceil(math.log2(big / profile.bias_range[1]))) if big else 0
            if bias_exp > profile.bias_exp_range[1]:
                raise ValueError(f"model.{lname}: bias {big * step / 128:g} is {big:.0f} current "
                                 f"units, beyond bias_mant {profile.bias_range[1]} << "
                                 f"{profile.bias_exp_range[1]}")
        new = LoihiLIFLayer(lin.in_features, lin.out_features, vth=vth, du=4095,
                            dv=min(dv, profile.decay_range[1]), weight_step=step, weight_exp=0,
                            bias=lin.bias is not None, bias_exp=bias_exp, profile=profile,
                            surrogate_function=surrogate_function, step_mode=step_mode,
                            backend=backend)
        with torch.no_grad():
            new.weight.copy_(lin.weight.clamp(lo * step, hi * step))
            if lin.bias is not None:
                new.bias.copy_(lin.bias * 128 / step / 2.0 ** new.bias_exp)
        new.converted_from = sources((lname, lin), (nname, neu))
        layers.append(new)
    out = nn.Sequential(*layers)
    refuse(check_loihi(out, profile), "quantize_for_loihi")
    return out
