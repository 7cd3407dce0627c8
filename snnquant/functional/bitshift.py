r"""The integer arithmetic of neuromorphic chips' neurons, as pure functions on integer-valued
tensors: SynSense Xylo's bit-shift decays, event-ordered saturating accumulation and multi-spike
firing; Loihi's fixed-point decays rounded toward zero and its wrapped 24-bit current (as Lava's
``fixed_pt`` models compute them).

Every function takes and returns floating-point tensors whose values are integers (float32 holds
the 16-bit states exactly; the accumulation is computed in float64). The rules were read from
SynSense's simulator ``xylosim`` 0.1.3 (the C++ core that Rockpool's ``XyloSim`` wraps) and from
Lava 0.10's ``lava/proc/lif/models.py``, and are tested against them in
``tests/test_targets_xylo.py`` and ``tests/test_targets_loihi.py``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["bitshift_decay", "bitshift_decay_ste", "saturating_accumulate", "multi_spike_count",
           "truncated_decay", "truncated_decay_ste", "wrap_signed"]


def bitshift_decay(x: torch.Tensor, dash) -> torch.Tensor:
    r"""One bit-shift decay step of an integer state.

    .. math::

        d(x) = x - \max(x \gg \mathrm{dash},\ 1) \quad (x > 0),\qquad
        d(x) = x - (x \gg \mathrm{dash}) \quad (x \le 0)

    where :math:`\gg` is the arithmetic right shift (:math:`\lfloor x / 2^{\mathrm{dash}}\rfloor`).
    A positive state decays by at least 1 per step; a negative one reaches 0 through the floor of
    the shift. ``dash = 0`` empties the state in one step. No gradient (see
    :func:`bitshift_decay_ste`).

    Args:
        x: integer-valued state.
        dash: the decay shift, an int or a tensor broadcastable to ``x`` (integer values >= 0).
    """
    shifted = torch.floor(x / torch.pow(2.0, torch.as_tensor(dash, dtype=x.dtype, device=x.device)))
    shifted = torch.where((x > 0) & (shifted == 0), torch.ones_like(shifted), shifted)
    return x - shifted


def bitshift_decay_ste(x: torch.Tensor, dash) -> torch.Tensor:
    r""":func:`bitshift_decay` with the gradient of the real decay it rounds.

    Forward: :math:`d(x)`. Gradient: :math:`\partial d / \partial x = 1 - 2^{-\mathrm{dash}}`.
    """
    factor = 1.0 - torch.pow(2.0, -torch.as_tensor(dash, dtype=x.dtype, device=x.device))
    smooth = x * factor
    return bitshift_decay(x.detach(), dash) + (smooth - smooth.detach())


def saturating_accumulate(state: torch.Tensor, counts: torch.Tensor, weight: torch.Tensor,
                          lo: int, hi: int) -> torch.Tensor:
    r"""Add weighted input events to a state one event at a time, saturating after each.

    For each sample :math:`n` and target :math:`j`, the presynaptic sources :math:`i` are taken in
    ascending order, each :math:`c_{ni}` times:

    .. math::

        a \leftarrow \mathrm{clamp}(a + w_{ji},\ lo,\ hi)

    starting from :math:`a = \mathrm{state}_{nj}`. Repeated events of one source add one weight
    of one sign, so they are one clamp of :math:`a + c_{ni} w_{ji}`. When no partial sum can
    leave :math:`[lo, hi]` (checked from the sums of the positive and of the negative terms) the
    result is the plain sum. For the other entries, each source is the function
    :math:`a \mapsto \mathrm{clamp}(a + b, l, h)`; two such functions compose into one of the same
    form, so the sources are composed pairwise in :math:`\lceil \log_2 \mathrm{in} \rceil`
    vectorised rounds. No gradient: the caller attaches one.

    Args:
        state: ``[N, out]`` integer-valued start values, within ``[lo, hi]``.
        counts: ``[N, in]`` non-negative integer event counts.
        weight: ``[out, in]`` integer weights (already shifted).
        lo, hi: the saturation bounds.

    Returns:
        ``[N, out]`` float64 tensor.
    """
    state = state.detach().to(torch.float64)
    counts = counts.detach().to(torch.float64)
    weight = weight.detach().to(torch.float64)
    total = state + counts @ weight.t()
    up = state + counts @ weight.clamp(min=0).t()
    down = state + counts @ weight.clamp(max=0).t()
    need = (up > hi) | (down < lo)
    if not bool(need.any()):
        return total
    rows, cols = need.nonzero(as_tuple=True)
    b = counts[rows] * weight[cols]  # [K, in]: each source's events, in source order
    low = torch.full_like(b, float(lo))
    high = torch.full_like(b, float(hi))
    # f_i(a) = clamp(a + b_i, low_i, high_i); compose neighbours (f then g) in a tree:
    # clamp(clamp(a + b1, l1, h1) + b2, l2, h2) = clamp(a + b1 + b2, min(max(l1 + b2, l2), h2),
    #                                                               max(min(h1 + b2, h2), l2))
    while b.shape[1] > 1:
        if b.shape[1] % 2:  # pad with the identity (b = 0, no bounds)
            pad = b.new_zeros(b.shape[0], 1)
            b = torch.cat([b, pad], 1)
            low = torch.cat([low, pad - math.inf], 1)
            high = torch.cat([high, pad + math.inf], 1)
        b1, b2 = b[:, 0::2], b[:, 1::2]
        l1, l2, h1, h2 = low[:, 0::2], low[:, 1::2], high[:, 0::2], high[:, 1::2]
        low = torch.minimum(torch.maximum(l1 + b2, l2), h2)
        high = torch.maximum(torch.minimum(h1 + b2, h2), l2)
        b = b1 + b2
    acc = torch.minimum(torch.maximum(state[rows, cols] + b[:, 0], low[:, 0]), high[:, 0])
    out = total.clone()
    out[rows, cols] = acc
    return out


def multi_spike_count(v: torch.Tensor, threshold, max_spikes: int) -> torch.Tensor:
    r"""Spikes of a multi-spike neuron with subtractive reset.

    .. math::

        n = \min(\lfloor v / \theta \rfloor,\ n_{max}) \ \ (v \ge \theta),\qquad
        n = 0 \ \ (v < \theta)

    and the caller subtracts :math:`n\theta` from the membrane. No gradient.

    Args:
        v: integer-valued membrane.
        threshold: :math:`\theta` (> 0), an int or a tensor broadcastable to ``v``.
        max_spikes: :math:`n_{max}`.
    """
    th = torch.as_tensor(threshold, dtype=v.dtype, device=v.device)
    n = torch.floor(v / th).clamp(0, max_spikes)
    return torch.where(v >= th, n, torch.zeros_like(n))


def truncated_decay(x: torch.Tensor, multiplier, shift: int = 12) -> torch.Tensor:
    r"""A fixed-point decay rounded toward zero (Loihi's, as Lava's ``fixed_pt`` LIF computes it).

    .. math::

        d(x) = \mathrm{sign}(x)\,\lfloor |x\,m| / 2^{s} \rfloor

    with the multiplier :math:`m` (Lava: :math:`2^{12} - d_u - 1` for the current,
    :math:`2^{12} - d_v` for the voltage) and :math:`s` = ``shift``. Computed in float64 (exact
    for :math:`|x\,m| < 2^{53}`). No gradient (see :func:`truncated_decay_ste`).
    """
    prod = x.detach().to(torch.float64) * float(multiplier)
    return (torch.sign(prod) * torch.floor(prod.abs() / 2.0 ** shift)).to(x.dtype)


def truncated_decay_ste(x: torch.Tensor, multiplier, shift: int = 12) -> torch.Tensor:
    r""":func:`truncated_decay` with the gradient of the real decay:
    :math:`\partial d/\partial x = m / 2^{s}`."""
    smooth = x * (float(multiplier) / 2.0 ** shift)
    return truncated_decay(x, multiplier, shift) + (smooth - smooth.detach())


def wrap_signed(x: torch.Tensor, bits: int) -> torch.Tensor:
    r"""Lava's wrap of a ``bits``-bit state: :math:`x - 2^{b}` where :math:`x > 2^{b-1}`,
    :math:`x + 2^{b}` where :math:`x \le -2^{b-1}`, else :math:`x` (one wrap, as Lava's
    ``AbstractPyLifModelFixed.subthr_dynamics`` does). The gradient is 1."""
    half = 2.0 ** (bits - 1)
    shift = torch.where(x > half, torch.full_like(x, -2 * half),
                        torch.where(x <= -half, torch.full_like(x, 2 * half), torch.zeros_like(x)))
    return x + shift.detach()
