r"""One step of each neuromorphic chip's neuron layer, written once: what the chip layers of
:mod:`snnquant.targets` train with and what :class:`~snnquant.export.IntegerSNN` runs for the
chip operations of an exported network.

Each function takes the layer's state (``None`` at the first step: zeros), the step's input and
the integer weights as the chip applies them, and returns the output spike counts and the new
state. Every value is an integer held in a floating-point tensor: the rules are the pure
functions of :mod:`snnquant.functional.bitshift` (read from the vendors' simulators and tested
against them), and every intermediate is below :math:`2^{53}` in magnitude (the chips' states
are 16 or 24 bits, their weights 8), so float64 computes them exactly. On tensors that carry a
gradient (a chip layer in training), the roundings pass the gradient straight through and the
spike count takes the gradient of ``fire``; the forward values do not depend on it.

``fire(v, count, threshold)`` returns the spike count to use: a chip layer passes its surrogate
(the exact ``count`` forward, a surrogate gradient backward); the default returns ``count``.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from .bitshift import (bitshift_decay_ste, multi_spike_count, saturating_accumulate,
                       truncated_decay_ste, wrap_signed)

__all__ = ["xylo_lif_step", "loihi_lif_step", "loihi_dense", "lava_weight", "speck_synapse",
           "speck_iaf_step", "surrogate_count"]

Fire = Optional[Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]]


def surrogate_count(surrogate_function, v: torch.Tensor, count: torch.Tensor,
                    threshold: float) -> torch.Tensor:
    r"""The spike count ``count`` with the gradient of a surrogate: what the chip layers pass as
    ``fire``.

    Forward: ``count``. Gradient:
    :math:`\partial n/\partial v = \sigma'((v - \theta)/\theta)/\theta` with :math:`\sigma`
    the SpikingJelly ``surrogate_function`` and :math:`\theta` = ``threshold``.
    """
    first = surrogate_function((v - threshold) / threshold)
    return count + (first - first.detach())


def _count(fire: Fire, v: torch.Tensor, count: torch.Tensor, threshold: float) -> torch.Tensor:
    return count if fire is None else fire(v, count, threshold)


def xylo_lif_step(state, counts: torch.Tensor, weight: torch.Tensor, bias, *, threshold: int,
                  dash_syn: int, dash_mem: int, max_spikes: int, state_bits: int = 16,
                  fire: Fire = None) -> Tuple[torch.Tensor, tuple]:
    r"""One step of a layer of Xylo neurons (SynSense ``xylosim``'s rules, see
    :mod:`snnquant.targets.xylo`).

    .. math::

        I &\leftarrow d_{I}(\mathrm{sat\_acc}(I,\ c,\ W))\\
        V &\leftarrow \mathrm{sat}(V + \mathrm{sat}(\mathrm{sat}(I - (V - d_{V}(V))) + b))\\
        n &= \min(\lfloor V/\theta \rfloor, n_{max})\,[V \ge \theta],\qquad
        V \leftarrow V - n\theta

    with :math:`d` the bit-shift decays, :math:`\mathrm{sat\_acc}` the event-ordered saturating
    accumulation and :math:`\mathrm{sat}` the saturation to ``state_bits`` signed bits.

    Gradient (when the inputs carry one): :math:`\partial A/\partial I = 1`,
    :math:`\partial A/\partial c = W`, :math:`\partial d(x)/\partial x = 1 - 2^{-\mathrm{dash}}`,
    each saturation 1 inside and 0 outside, the count through ``fire``.

    Args:
        state: ``(I, V)`` (``[N, out]`` each) or ``None`` (zeros).
        counts: ``[N, in]`` input event counts (already delayed where the chip delays them).
        weight: ``[out, in]`` integer weights as applied (the 8-bit weights shifted left by the
            layer's weight shift).
        bias: ``[out]`` integer membrane bias, or ``None``.
        threshold, dash_syn, dash_mem, max_spikes, state_bits: the layer's integers.
        fire: see the module documentation.

    Returns:
        ``(n, (I, V))``.
    """
    lo, hi = -(2 ** (state_bits - 1)), 2 ** (state_bits - 1) - 1
    if state is None:
        zeros = torch.zeros((counts.shape[0], weight.shape[0]), dtype=counts.dtype,
                            device=counts.device)
        state = (zeros, zeros)
    isyn, vmem = state
    smooth = isyn + counts @ weight.t()
    exact = saturating_accumulate(isyn, counts, weight, lo, hi).to(smooth.dtype)
    isyn = bitshift_decay_ste(exact + (smooth - smooth.detach()), dash_syn)
    leak = vmem - bitshift_decay_ste(vmem, dash_mem)
    delta = (isyn - leak).clamp(lo, hi)
    if bias is not None:
        delta = (delta + bias).clamp(lo, hi)
    v = (vmem + delta).clamp(lo, hi)
    th = float(threshold)
    n = _count(fire, v, multi_spike_count(v.detach(), th, max_spikes), th)
    return n, (isyn, v - n * th)


def loihi_lif_step(state, spikes: torch.Tensor, weight: torch.Tensor, bias, *, vth: int, du: int,
                   dv: int, weight_exp: int, bias_exp: int, state_bits: int = 24,
                   fire: Fire = None) -> Tuple[torch.Tensor, tuple]:
    r"""One step of a Lava ``Dense`` + ``LIF`` pair in Lava's fixed point (``fixed_pt``; see
    :mod:`snnquant.targets.loihi`), in float64.

    .. math::

        a &= (W s) \ll e\quad(\lfloor W s / 2^{-e} \rfloor \text{ for } e < 0)\\
        u &\leftarrow \mathrm{wrap}_{b}(\mathrm{sign}(u)\lfloor |u(4095 - d_u)| / 4096\rfloor
            + 64 a)\\
        v &\leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v(4096 - d_v)| / 4096\rfloor + u
            + \beta 2^{\beta_e},\ -2^{b-1}+1,\ 2^{b-1}-1)\\
        S &= [v > 64\vartheta],\qquad v \leftarrow v(1 - S)

    Gradient (when the inputs carry one): the decays :math:`(4095 - d_u)/4096` and
    :math:`(4096 - d_v)/4096`, the shift :math:`2^{e}`, the wrap 1, the clip 1 inside and 0
    outside, the spike through ``fire`` (called with the threshold :math:`\max(64\vartheta, 1)`).

    Args:
        state: ``(u, v)`` (``[N, out]`` float64 each) or ``None`` (zeros).
        spikes: ``[N, in]`` input spikes of the previous step (Lava's ``Dense`` delays by one).
        weight: ``[out, in]`` Lava weights :math:`W` (twice the 8-bit integers).
        bias: ``[out]`` bias mantissas :math:`\beta`, or ``None``.
        vth, du, dv, weight_exp, bias_exp, state_bits: the layer's integers.
        fire: see the module documentation.

    Returns:
        ``(S, (u, v))``, ``S`` float64.
    """
    half = 2.0 ** (state_bits - 1)
    if state is None:
        zeros = torch.zeros((spikes.shape[0], weight.shape[0]), dtype=torch.float64,
                            device=spikes.device)
        state = (zeros, zeros)
    u, v = state
    a = loihi_dense(spikes, weight, weight_exp)
    u = wrap_signed(truncated_decay_ste(u, 4096 - du - 1) + 64.0 * a, state_bits)
    v = truncated_decay_ste(v, 4096 - dv) + u
    if bias is not None:
        v = v + bias.to(torch.float64) * 2.0 ** bias_exp
    v = v.clamp(-half + 1, half - 1)
    th = 64.0 * vth
    s = _count(fire, v, (v.detach() > th).to(v.dtype), max(th, 1.0))
    return s, (u, v * (1.0 - s))


def lava_weight(weight: torch.Tensor) -> torch.Tensor:
    r"""The weights a Lava ``Dense`` applies for the 8-bit integer weights :math:`W` of one layer:
    :math:`2W`, in the sign mode Lava 0.10 picks from them (``determine_sign_mode``,
    ``clip_weights``).

    .. math::

        w = \begin{cases} \max(2W, -255) & \text{all } W \le 0 \text{ and some } W < 0
        \ (\text{inhibitory})\\ 2W & \text{otherwise (mixed, excitatory)} \end{cases}

    Gradient: 2 where the weight is not clipped, 0 where it is (a weight of -128 in an
    inhibitory layer).

    Args:
        weight: ``[out, in]`` integer weights :math:`W` (any float or integer dtype).
    """
    w = 2.0 * weight.to(torch.float64)
    if w.numel() == 0:
        return w
    with torch.no_grad():
        inhibitory = (w.max() <= 0) & (w.min() < 0)
    return torch.where(inhibitory, w.clamp(min=-255.0), w)


def loihi_dense(spikes: torch.Tensor, weight: torch.Tensor, weight_exp: int) -> torch.Tensor:
    r"""The output of a Lava ``Dense`` in fixed point, in float64.

    .. math::

        a = (W s) \cdot 2^{e}\ (e \ge 0),\qquad a = \lfloor W s \cdot 2^{e} \rfloor\ (e < 0)

    Gradient: that of :math:`W s \cdot 2^{e}` (the floor passes it straight through).

    Args:
        spikes: ``[..., in]`` input spikes.
        weight: ``[out, in]`` Lava weights.
        weight_exp: :math:`e`.
    """
    a = spikes.to(torch.float64) @ weight.to(torch.float64).t()
    if weight_exp >= 0:
        return a * 2.0 ** weight_exp
    smooth = a * 2.0 ** weight_exp
    return torch.floor(a.detach() * 2.0 ** weight_exp) + (smooth - smooth.detach())


def speck_synapse(x: torch.Tensor, weight: torch.Tensor, bias, *, stride: int, padding: int,
                  linear: bool) -> torch.Tensor:
    r"""The input current of a Speck core, in float64: :math:`W * x + b`.

    .. math::

        y = \mathrm{conv2d}(x, W) + b\quad\text{or, for a Linear,}\quad
        y = W\,\mathrm{flatten}(x) + b \ \ (\text{shape } [N, \mathrm{out}, 1, 1])

    Gradient: that of the convolution (or matrix product).

    Args:
        x: ``[N, C, H, W]`` input event counts (``[N, features]`` or any ``[N, ...]`` for a
            Linear).
        weight: ``[out, C, k, k]`` integer weights (``[out, in]`` for a Linear).
        bias: ``[out]`` integer bias or ``None``.
        stride, padding: of the convolution.
        linear: whether the layer is a Linear.
    """
    x = x.to(torch.float64)
    if linear:
        y = (x.flatten(1) @ weight.to(torch.float64).t())[:, :, None, None]
    else:
        y = F.conv2d(x, weight.to(torch.float64), stride=stride, padding=padding)
    if bias is not None:
        y = y + bias.to(torch.float64)[None, :, None, None]
    return y


def speck_iaf_step(v, current: torch.Tensor, *, threshold: int, spike: str, v_min: int,
                   pool: int = 1, fire: Fire = None) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""One step of a Speck core's integrate-and-fire neurons (Sinabs' ``IAFSqueeze`` with its
    ``MultiSpike`` or ``SingleSpike``, ``MembraneSubtract`` and ``min_v_mem``; see
    :mod:`snnquant.targets.speck`), then its sum pooling.

    .. math::

        v &\leftarrow v + y\\
        n &= [v > 0]\,\lfloor v/\theta \rfloor\ (\text{multi})\quad\text{or}\quad
            [v \ge \theta]\ (\text{single})\\
        v &\leftarrow \max(v - n\theta,\ v_{min}),\qquad
        \text{out} = \mathrm{sumpool}_{k}(n)

    Gradient (when the inputs carry one): the count through ``fire``, the lower bound 1 above
    it and 0 below.

    Args:
        v: ``[N, C, H, W]`` membrane or ``None`` (zeros).
        current: ``[N, C, H, W]`` the step's input current (:func:`speck_synapse`).
        threshold: :math:`\theta`.
        spike: ``'multi'`` or ``'single'``.
        v_min: the membrane's lower bound.
        pool: the sum pooling's window and stride :math:`k` (1: none).
        fire: see the module documentation.

    Returns:
        ``(out, v)``.
    """
    v = current if v is None else v + current
    th = float(threshold)
    if spike == "multi":
        count = torch.where(v.detach() > 0, torch.floor(v.detach() / th), 0.0)
    else:
        count = (v.detach() >= th).to(v.dtype)
    n = _count(fire, v, count, th)
    v = torch.clamp(v - n * th, min=float(v_min))
    if pool > 1:
        n = F.avg_pool2d(n, pool, divisor_override=1)
    return n, v
