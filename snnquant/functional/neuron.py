r"""Reference dynamics of spiking neurons with a quantized membrane potential.

This module is the single written definition of the quantized neuron. The torch backend of
:class:`snnquant.nn.QuantLIFNode` and friends runs :func:`quant_neuron_multi_step`; the fused CUDA
kernels and the integer simulator are tested against it.

Notation: :math:`s` is the membrane step, :math:`q_{min} < q_{max}` the integer range,
:math:`Q(h) = s \cdot \mathrm{clamp}(\mathrm{round}(h / s), q_{min}, q_{max})` with ``torch.round``
(round half to even). Per time step :math:`t`, with :math:`V[-1] = V_{init}`:

.. math::

    H[t] &= f(V[t-1], X[t]) \quad\text{(charge)}\\
    H_q[t] &= Q(H[t])\\
    S[t] &= \Theta(H_q[t] - V_{th})\\
    V[t] &= \begin{cases} H_q[t] (1 - S[t]) + V_{r,q} S[t] & \text{hard reset}\\
                          H_q[t] - \theta_q S[t] & \text{soft reset (} V_{reset} = \text{None)}
            \end{cases}

with the charge :math:`f` of the neuron kind

.. math::

    \text{IF:}\quad & H = V + X\\
    \text{LIF, decay\_input:}\quad & H = V + (X - (V - V_r)) / \tau\\
    \text{LIF, not decay\_input:}\quad & H = V - (V - V_r) / \tau + X\\
    \text{PLIF:}\quad & \text{as LIF with } 1/\tau = k = \mathrm{sigmoid}(w)

and the reset values on the grid: :math:`V_{r,q} = Q(V_{reset})` (also used as :math:`V_r` in the
charge; :math:`V_r = 0` for soft reset) and :math:`\theta_q = s \lceil V_{th} / s \rceil`, the
smallest grid value :math:`\ge V_{th}`, so that the membrane stays on the grid after a soft reset.

Gradients: the quantizer is straight-through inside its range and zero outside
(:math:`\partial H_q / \partial H = 1` iff :math:`q_{min} \le H/s \le q_{max}`), with the LSQ step
gradient :math:`\partial H_q / \partial s = \mathrm{round}(H/s) - H/s` strictly inside,
:math:`q_{min}` at and below :math:`q_{min}`, :math:`q_{max}` at and above :math:`q_{max}` (Esser et
al. 2020, eq. 3), times ``step_grad_scale``; the spike uses the derivative of the neuron's
surrogate function at :math:`H_q - V_{th}`; ``detach_reset`` cuts the gradient through :math:`S` in
the reset. :math:`V_{r,q}` and :math:`\theta_q` are constants for autograd.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional

import torch

__all__ = [
    "NEURON_KINDS",
    "NeuronParams",
    "check_real",
    "membrane_reset_values",
    "quantized_threshold",
    "neuron_charge",
    "neuron_fire",
    "neuron_reset",
    "surrogate_derivative",
    "quant_neuron_step_reference",
    "quant_neuron_multi_step",
    "quant_neuron_sequence",
    "QuantNeuronFunction",
]

NEURON_KINDS = ("if", "lif", "plif")


@dataclass(frozen=True, kw_only=True)
class NeuronParams:
    """The constants of a quantized neuron, validated once when built (immutable).

    The module builds one per forward and passes it, with the tensors, to the step function of
    its backend (the torch loop :func:`quant_neuron_sequence` or a fused kernel's); the keyword
    functions (:func:`quant_neuron_multi_step` and the kernels') take these fields as keywords.

    Attributes:
        neuron: ``'if'``, ``'lif'`` or ``'plif'``.
        tau: membrane time constant of ``'lif'`` (``None`` for the others, whatever was given).
        decay_input: whether the input decays with the membrane (LIF/PLIF).
        v_threshold: firing threshold :math:`V_{th}`.
        v_reset: hard-reset value, or ``None`` for soft reset.
        surrogate_function: SpikingJelly surrogate module (``None``: ``surrogate.Sigmoid()``).
        detach_reset: cut the gradient through the spike in the reset.
        qmin: lowest integer level of the membrane grid.
        qmax: highest integer level of the membrane grid.
        step_grad_scale: factor on the membrane step gradient.
        store_v_seq: also return the membrane after reset at every step.
    """

    neuron: str
    tau: Optional[float] = 2.0
    decay_input: bool = True
    v_threshold: float = 1.0
    v_reset: Optional[float] = 0.0
    surrogate_function: Any = None
    detach_reset: bool = False
    qmin: int
    qmax: int
    step_grad_scale: float = 1.0
    store_v_seq: bool = False

    def __post_init__(self):
        # one rule per kind of mistake: a wrong type is a TypeError, a wrong value a ValueError
        if self.neuron not in NEURON_KINDS:
            raise ValueError(f"neuron must be one of {list(NEURON_KINDS)}, got {self.neuron!r}")
        for name in ("decay_input", "detach_reset", "store_v_seq"):
            if not isinstance(getattr(self, name), bool):
                value = getattr(self, name)
                raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
        for name in ("qmin", "qmax"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
            object.__setattr__(self, name, int(value))
        if not self.qmin < self.qmax:
            raise ValueError(f"qmin must be < qmax, got qmin={self.qmin}, qmax={self.qmax}")
        object.__setattr__(self, "v_threshold", check_real("v_threshold", self.v_threshold))
        object.__setattr__(self, "step_grad_scale", check_real("step_grad_scale", self.step_grad_scale))
        if self.v_reset is not None:
            object.__setattr__(self, "v_reset", check_real("v_reset", self.v_reset))
        object.__setattr__(self, "tau", check_real("tau", self.tau, positive=True)
                           if self.neuron == "lif" else None)
        if self.surrogate_function is None:
            from spikingjelly.activation_based import surrogate
            object.__setattr__(self, "surrogate_function", surrogate.Sigmoid())


def check_real(name: str, value, positive: bool = False) -> float:
    """Return ``value`` as a float, or raise TypeError/ValueError naming ``name`` and the value
    (not a real number, not finite, or not > 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0.0):
        kind = "a finite number > 0" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return value


def neuron_fire(hq: torch.Tensor, v_threshold: float,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""The spike :math:`S = \Theta(H_q - V_{th})` (1 where :math:`H_q \ge V_{th}`), in ``hq``'s dtype.

    With ``out`` (a bool tensor of ``hq``'s shape) the spike is written into it as a mask and
    ``out`` is returned (no allocation; :math:`H_q - V_{th} \ge 0` is :math:`H_q \ge V_{th}` for
    finite values).
    """
    if out is not None:
        return torch.ge(hq, v_threshold, out=out)
    return ((hq - v_threshold) >= 0).to(hq.dtype)


def neuron_reset(hq: torch.Tensor, spike: torch.Tensor, v_reset: Optional[float], vr_q,
                 theta_q, out: Optional[torch.Tensor] = None,
                 fired: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""The membrane after the reset.

    .. math::

        V = H_q (1 - S) + V_{r,q} S,\qquad V = H_q - \theta_q S

    for a hard and a soft reset (``v_reset`` None), with gradients
    :math:`\partial V/\partial H_q = 1 - S` (hard) or 1 (soft) and
    :math:`\partial V/\partial S = V_{r,q} - H_q` (hard) or :math:`-\theta_q` (soft). The one
    written reset of the quantized neurons (reference step, one-node forward, per-step path).

    With ``out``, the result is written into it without autograd: the hard reset as the
    selection :math:`V_{r,q}` where ``fired`` (the bool mask of :math:`S`) else :math:`H_q`, and
    the soft reset as :math:`H_q - \theta_q S`; both give the values of the formulas above
    (:math:`S` is 0 or 1).
    """
    if out is not None:
        if v_reset is None:
            return torch.addcmul(hq, spike, theta_q, value=-1.0, out=out)
        if fired is None or fired.dtype != torch.bool:
            raise ValueError(f"neuron_reset(out=...) of a hard reset needs fired, the bool mask of "
                             f"the spikes, got {type(fired).__name__ if fired is None else fired.dtype}")
        return torch.where(fired, vr_q, hq, out=out)
    if v_reset is None:
        return hq - spike * theta_q
    return (1.0 - spike) * hq + spike * vr_q


def membrane_reset_values(step: torch.Tensor, qmin: int, qmax: int, v_threshold: float,
                          v_reset: Optional[float]):
    r"""Reset values of a quantized membrane, on the grid of ``step``.

    .. math::

        V_{r,q} = s \cdot \mathrm{clamp}(\mathrm{round}(V_{reset} / s), q_{min}, q_{max}),\qquad
        \theta_q = s \lceil V_{th} / s \rceil

    Args:
        step: positive scalar tensor (its dtype is the dtype of the results).
        qmin, qmax: integer range of the membrane grid.
        v_threshold: firing threshold :math:`V_{th}`.
        v_reset: hard-reset value, or ``None`` for soft reset (then :math:`V_{r,q} = 0`).

    Returns:
        ``(v_reset_q, theta_q)`` as detached scalar tensors.
    """
    step = step.detach()
    if v_reset is None:
        vr = torch.zeros((), dtype=step.dtype, device=step.device)
    else:
        vr = torch.clamp(torch.round(v_reset / step), qmin, qmax) * step
    return vr, quantized_threshold(step, v_threshold)


def quantized_threshold(step: torch.Tensor, v_threshold: float) -> torch.Tensor:
    r"""The soft-reset amount on the grid: the smallest grid value :math:`\ge V_{th}`.

    .. math::

        \theta_q = s \lceil V_{th} / s \rceil

    computed as the kernels compute it (``float / tensor``, i.e. :math:`(1/s) V_{th}`); the one
    place where the quantized threshold is written.

    Args:
        step: positive step tensor :math:`s` (its dtype and device are the result's).
        v_threshold: firing threshold :math:`V_{th}`.
    """
    return torch.ceil(v_threshold / step) * step



def surrogate_derivative(surrogate_function, x: torch.Tensor, scale: float = 1.0,
                         inplace: bool = False) -> torch.Tensor:
    r"""Derivative :math:`c\,g'(x)` of a SpikingJelly surrogate function at ``x``, times ``scale``
    :math:`c`.

    ``Sigmoid`` and ``ATan`` use their closed forms
    (:math:`\alpha\,\sigma(\alpha x)(1-\sigma(\alpha x))` and
    :math:`\frac{\alpha}{2(1 + (\frac{\pi}{2}\alpha x)^2)}`); any other surrogate module is
    differentiated through its own autograd backward, so every surrogate works.

    Args:
        surrogate_function: the SpikingJelly surrogate module.
        x: where to evaluate it.
        scale: a constant factor on the result (free: it joins the closed forms' own factor).
        inplace: ``x`` may be overwritten (a closed form then reuses its memory).
    """
    from spikingjelly.activation_based import surrogate

    if type(surrogate_function) is surrogate.Sigmoid:
        alpha = surrogate_function.alpha
        sg = x.mul_(alpha) if inplace else x * alpha
        sg.sigmoid_()
        return torch.addcmul(sg, sg, sg, value=-1.0).mul_(alpha * scale)  # s - s^2 = s (1 - s)
    if type(surrogate_function) is surrogate.ATan:
        alpha = surrogate_function.alpha
        t = x.mul_(math.pi / 2 * alpha) if inplace else x * (math.pi / 2 * alpha)
        return t.square_().add_(1.0).reciprocal_().mul_(alpha / 2 * scale)
    with torch.enable_grad():
        xd = x.detach().requires_grad_(True)
        y = surrogate_function(xd)
        (g,) = torch.autograd.grad(y, xd, torch.ones_like(y))
    return g if scale == 1.0 else g * scale


def neuron_charge(neuron: str, v, x, tau, k, decay_input: bool, vr, out=None,
                  vr_zero: bool = False):
    r"""The charge :math:`H = f(V, X)` of a neuron kind (see the module docstring).

    ``k`` is :math:`\mathrm{sigmoid}(w)` for ``'plif'`` (else unused), ``vr`` the reset value
    :math:`V_r` used in the leak. With ``out = (h, scratch)``, two tensors of the result's shape,
    the charge is computed into ``h`` (returned) with the same operations in the same order,
    without allocating; ``vr_zero=True`` says that :math:`V_r = 0`, so :math:`V - V_r = V` is not
    computed.
    """
    # The operation order follows SpikingJelly's torch neurons, so that spikes agree bit for bit;
    # written once: without ``out`` every ``out=`` below is None and each operation allocates
    h, tmp = (None, None) if out is None else out
    if neuron == "if":
        return torch.add(v, x, out=h)
    leak, factor = (torch.div, tau) if neuron == "lif" else (torch.mul, k)
    dv = v if vr_zero else torch.sub(v, vr, out=tmp)                 # V - V_r
    if decay_input:                                                  # V + (X - (V - V_r)) / tau
        return torch.add(v, leak(torch.sub(x, dv, out=tmp), factor, out=tmp), out=h)
    decayed = torch.sub(v, leak(dv, factor, out=tmp), out=h)         # V - (V - V_r) / tau + X
    return torch.add(decayed, x, out=h)


def _check_tensors(x_seq, neuron, w, step):
    if not isinstance(x_seq, torch.Tensor) or not x_seq.is_floating_point():
        raise TypeError(f"x_seq must be a floating-point tensor, got "
                        f"{getattr(x_seq, 'dtype', type(x_seq))}")
    if x_seq.dim() < 1:
        raise ValueError(f"x_seq must have shape [T, ...], got shape {tuple(x_seq.shape)}")
    if neuron == "plif" and not isinstance(w, torch.Tensor):
        raise ValueError(f"w must be a tensor for 'plif', got {type(w).__name__}")
    if not isinstance(step, torch.Tensor):
        if not step > 0:
            raise ValueError(f"step must be > 0, got {step!r}")


def quant_neuron_step_reference(x: torch.Tensor, v: torch.Tensor, *, step,
                                w: Optional[torch.Tensor] = None, **params):
    r"""One time step of the quantized neuron, written with plain differentiable torch operations.

    The dynamics and gradients are those of the module docstring; autograd builds the graph. It is
    the slow, obviously-correct definition that :class:`QuantNeuronFunction` is tested against.

    Args:
        x: input of the step.
        v: membrane before the step.
        step: membrane step :math:`s` (positive float or scalar tensor).
        w: PLIF parameter (scalar tensor).
        **params: the fields of :class:`NeuronParams` (``neuron``, ``qmin``, ``qmax``, ...).

    Returns:
        ``(spike, v_next)``.
    """
    p = NeuronParams(**params)
    step = torch.as_tensor(step, dtype=x.dtype, device=x.device)
    vr_q, theta_q = membrane_reset_values(step, p.qmin, p.qmax, p.v_threshold, p.v_reset)
    vr_q, theta_q = vr_q.to(x.dtype), theta_q.to(x.dtype)
    k = torch.sigmoid(w).to(x.dtype) if p.neuron == "plif" else None
    h = neuron_charge(p.neuron, v, x, p.tau, k, p.decay_input, vr_q)
    hs = h / step
    q = torch.clamp(torch.round(hs), p.qmin, p.qmax)
    inside = ((hs >= p.qmin) & (hs <= p.qmax)).to(x.dtype)
    # Esser et al. 2020, eq. 3: the clamped level at and beyond the end points.
    dstep = torch.where(hs <= p.qmin, float(p.qmin),
                        torch.where(hs >= p.qmax, float(p.qmax), q - hs)).detach()
    # value = q * s; d/dh = inside; d/ds = dstep * step_grad_scale
    hq = (q * step).detach() + (h - h.detach()) * inside + \
        (step - step.detach()) * dstep * p.step_grad_scale
    spike = p.surrogate_function(hq - p.v_threshold)
    spike_r = spike.detach() if p.detach_reset else spike
    return spike, neuron_reset(hq, spike_r, p.v_reset, vr_q, theta_q)


_BLOCK_VALUES = 1 << 20  # values per block of time steps in QuantNeuronFunction.backward


class QuantNeuronFunction(torch.autograd.Function):
    r"""Whole-sequence quantized neuron as one autograd node with a reverse-time backward.

    Forward runs the time loop of the module docstring into preallocated buffers (no allocation
    per step; :func:`neuron_charge`, :func:`neuron_fire` and :func:`neuron_reset` with ``out``). It
    saves the quantized charge :math:`H_q` and the mask :math:`m` of the straight-through range
    (:math:`q_{min} \le H/s \le q_{max}`, one byte per value), plus :math:`H/s` when the step needs
    a gradient and the membrane sequence for PLIF or ``store_v_seq``.

    Backward: with :math:`\sigma'_t` the surrogate derivative at :math:`H_q[t] - V_{th}`,
    :math:`G_S[t]` the incoming spike gradient and :math:`G_V[t]` the gradient of the membrane
    after step :math:`t`,

    .. math::

        \frac{\partial L}{\partial H_q[t]} = \sigma'_t\, G_S[t] + D_t\, G_V[t],\qquad
        \frac{\partial L}{\partial H[t]} = m_t\,\frac{\partial L}{\partial H_q[t]},\qquad
        G_V[t-1] = \frac{\partial H}{\partial V}\,\frac{\partial L}{\partial H[t]}

    where the reset gives, for a hard and a soft reset,

    .. math::

        D_t = 1 - S[t] + (V_{r,q} - H_q[t])\,\sigma'_t,\qquad D_t = 1 - \theta_q\, \sigma'_t

    and ``detach_reset`` gives :math:`D_t = 1 - S[t]` and :math:`D_t = 1`. With ``store_v_seq``
    the gradient of the stored :math:`V[t-1]` is added to :math:`G_V[t-1]`. Everything except the
    recurrence is computed for a block of time steps at once (about 2^20 values, so that the
    temporaries stay in the cache); the recurrence is then two operations per step. The input
    gradient is :math:`\frac{\partial H}{\partial X}\,\partial L / \partial H[t]`; the step
    gradient (LSQ, see the module docstring) and the PLIF gradient are sums over the steps.
    """

    @staticmethod
    def forward(ctx, x_seq, v_init, step, w, cfg, needs_grad=True):
        """Run the time loop; ``cfg`` is the neuron's :class:`NeuronParams`; with ``needs_grad``
        False (no autograd graph will be built) nothing is kept for backward."""
        neuron, tau, decay_input = cfg.neuron, cfg.tau, cfg.decay_input
        v_threshold, v_reset, qmin, qmax = cfg.v_threshold, cfg.v_reset, cfg.qmin, cfg.qmax
        store_v_seq = cfg.store_v_seq
        dtype = x_seq.dtype
        s = step.detach().to(dtype)
        vr_q, theta_q = membrane_reset_values(s, qmin, qmax, v_threshold, v_reset)
        # V_r = 0 exactly for a soft reset or v_reset = 0 (Q(0) = 0 on any grid): V - V_r = V
        vr_zero = v_reset is None or v_reset == 0.0
        k = torch.sigmoid(w.detach()).to(dtype) if neuron == "plif" else None
        T = x_seq.shape[0]
        need_step = needs_grad and ctx.needs_input_grad[2]
        keep_v = store_v_seq or (needs_grad and neuron == "plif")
        spike_seq = torch.empty_like(x_seq)
        v_seq = torch.empty_like(x_seq) if keep_v else None
        hq_seq = torch.empty_like(x_seq) if needs_grad else None
        inside_seq = torch.empty(x_seq.shape, dtype=torch.bool, device=x_seq.device) \
            if needs_grad else None
        hs_seq = torch.empty_like(x_seq) if need_step else None
        shape = x_seq.shape[1:]
        v = v_init.detach().to(dtype).expand(shape)
        tmp = torch.empty(shape, dtype=dtype, device=x_seq.device)
        h = torch.empty_like(tmp)
        hs_buf = None if need_step else torch.empty_like(tmp)   # H/s when it is not kept
        hq_buf = None if needs_grad else torch.empty_like(tmp)  # H_q when it is not kept
        fired = torch.empty(shape, dtype=torch.bool, device=x_seq.device)
        v_bufs = (torch.empty_like(tmp), torch.empty_like(tmp))
        for t in range(T):
            neuron_charge(neuron, v, x_seq[t], tau, k, decay_input, vr_q, out=(h, tmp),
                          vr_zero=vr_zero)
            # quantize: H_q = s * round(clamp(H/s)), clamp first so that the mask costs one pass
            hs = hs_seq[t] if need_step else hs_buf
            torch.div(h, s, out=hs)
            torch.clamp(hs, qmin, qmax, out=tmp)
            if needs_grad:
                torch.eq(tmp, hs, out=inside_seq[t])
            tmp.round_()
            hq = hq_seq[t] if needs_grad else hq_buf
            torch.mul(tmp, s, out=hq)
            neuron_fire(hq, v_threshold, out=fired)
            spike_seq[t].copy_(fired)
            v = neuron_reset(hq, spike_seq[t], v_reset, vr_q, theta_q,
                             out=v_seq[t] if keep_v else v_bufs[t % 2], fired=fired)
        # a private buffer is returned as it is; a view of v_seq is copied
        v_last = v.contiguous() if T == 0 else (v.clone() if keep_v else v)
        ctx.cfg = cfg
        ctx.v_init_shape = v_init.shape
        ctx.step_shape = step.shape
        ctx.step_dtype = step.dtype
        ctx.w_dtype = w.dtype if w is not None else None
        if needs_grad:
            ctx.save_for_backward(hq_seq, inside_seq, hs_seq, v_seq if keep_v else None, v_init,
                                  step, w, x_seq if neuron == "plif" else None)
        out_v_seq = v_seq if store_v_seq else torch.empty(0, dtype=dtype, device=x_seq.device)
        return spike_seq, v_last, out_v_seq

    @staticmethod
    def backward(ctx, g_spike, g_v_last, g_v_seq):
        """Run the time loop in reverse (see the class docstring for the gradients)."""
        cfg = ctx.cfg
        neuron, tau, decay_input = cfg.neuron, cfg.tau, cfg.decay_input
        v_threshold, v_reset, qmin, qmax = cfg.v_threshold, cfg.v_reset, cfg.qmin, cfg.qmax
        surrogate_function, detach_reset = cfg.surrogate_function, cfg.detach_reset
        step_grad_scale, store_v_seq = cfg.step_grad_scale, cfg.store_v_seq
        hq_seq, inside, hs_seq, v_seq, v_init, step, w, x_seq = ctx.saved_tensors
        dtype = hq_seq.dtype
        T = hq_seq.shape[0]
        s = step.detach().to(dtype)
        vr_q, theta_q = membrane_reset_values(s, qmin, qmax, v_threshold, v_reset)
        k = torch.sigmoid(w.detach()).to(dtype) if neuron == "plif" else None
        acc_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        need_step = hs_seq is not None and ctx.needs_input_grad[2]
        if not store_v_seq or g_v_seq is None or g_v_seq.numel() == 0:
            g_v_seq = None
        if neuron == "if":
            dh_dx, dh_dv = 1.0, 1.0
        elif neuron == "lif":
            dh_dx = 1.0 / tau if decay_input else 1.0
            dh_dv = 1.0 - 1.0 / tau
        else:
            dh_dx = k if decay_input else 1.0
            dh_dv = 1.0 - k
        # The terms that do not depend on the recurrence are computed for a block of steps at
        # once (about _BLOCK_VALUES values, so that the block's temporaries stay in the cache),
        # then the recurrence runs through the block. For IF and LIF the constant dH/dX is
        # folded into the surrogate derivative, so that the loop produces dL/dX directly:
        # u[t] = c dL/dH[t], G_V[t-1] = (dH/dV / c) u[t].
        fold = 1.0 if neuron == "plif" else float(dh_dx)
        ratio = dh_dv / fold
        unit = isinstance(ratio, float) and ratio == 1.0
        dev = hq_seq.device
        fold_t = torch.tensor(fold, dtype=dtype, device=dev)
        zero_t = torch.zeros((), dtype=dtype, device=dev)
        per_step = max(1, hq_seq[0].numel()) if T else 1
        block = max(1, min(T, _BLOCK_VALUES // per_step))
        u = torch.empty_like(hq_seq)
        g_v = torch.zeros_like(hq_seq[0]) if g_v_last is None else g_v_last.to(dtype)
        g_step = torch.zeros((), dtype=acc_dtype, device=dev) if need_step else None
        plif_k = neuron == "plif" and ctx.needs_input_grad[3]
        g_k = torch.zeros((), dtype=acc_dtype, device=dev) if plif_k else None
        g_v_blk = torch.empty((block,) + hq_seq.shape[1:], dtype=dtype, device=dev) \
            if need_step else None
        for stop in range(T, 0, -block):
            lo = max(0, stop - block)
            hq, ins = hq_seq[lo:stop], inside[lo:stop]
            fired = hq >= v_threshold
            sg = surrogate_derivative(surrogate_function, hq - v_threshold, scale=fold,
                                      inplace=True)              # c sigma'
            e = torch.zeros_like(hq) if g_spike is None else torch.mul(g_spike[lo:stop].to(dtype), sg)
            if v_reset is None:                                  # c D, see the class docstring
                d = None if detach_reset else torch.mul(sg, -theta_q).add_(fold)
            else:
                d = torch.where(fired, zero_t, fold_t)
                if not detach_reset:
                    d = d.addcmul_(hq, sg, value=-1.0) if v_reset == 0.0 else \
                        d.addcmul_(vr_q - hq, sg)
            del sg, fired
            outside = ~ins
            if need_step:
                bb = e.masked_fill(outside, 0.0)
                cc = torch.where(ins, fold_t, zero_t) if d is None else d.masked_fill(outside, 0.0)
            else:
                bb = e.masked_fill_(outside, 0.0)
                cc = torch.where(ins, fold_t, zero_t) if d is None else d.masked_fill_(outside, 0.0)
            del outside
            for t in range(stop - 1, lo - 1, -1):  # the recurrence
                if g_v_seq is not None:
                    g_v = g_v + g_v_seq[t]
                if need_step:
                    g_v_blk[t - lo].copy_(g_v)
                torch.addcmul(bb[t - lo], cc[t - lo], g_v, out=u[t])
                g_v = u[t] if unit else u[t] * ratio
            del bb, cc
            if need_step:  # LSQ: dHq/ds = round(H/s) - H/s inside, q_min / q_max at and beyond
                hs = hs_seq[lo:stop]
                gv = g_v_blk[:stop - lo]
                q = torch.clamp(hs, qmin, qmax).round_()
                dstep = torch.where(hs <= qmin, float(qmin),
                                    torch.where(hs >= qmax, float(qmax), q - hs))
                g_hq = e.add_(gv, alpha=fold) if d is None else e.addcmul_(d, gv)  # c dL/dHq
                g_step += (g_hq * dstep).sum(dtype=acc_dtype)
            if plif_k:
                v_prev = v_seq[lo - 1:stop - 1] if lo > 0 else torch.cat(
                    [v_init.to(dtype).expand_as(hq_seq[0]).unsqueeze(0), v_seq[:stop - 1]])
                dh_dk = (x_seq[lo:stop] - (v_prev - vr_q)) if decay_input else -(v_prev - vr_q)
                g_k += (u[lo:stop] * dh_dk).sum(dtype=acc_dtype)
            del e, d
        if need_step:
            g_step = g_step / fold
        if neuron == "plif" and decay_input:
            g_x = u.mul_(dh_dx)
        else:
            g_x = u
        g_v_init = None
        if ctx.needs_input_grad[1]:
            g_v_init = g_v.clone() if g_v._base is u or g_v is u else g_v  # not a view of g_x
            if tuple(g_v_init.shape) != tuple(ctx.v_init_shape):
                g_v_init = g_v_init.sum_to_size(ctx.v_init_shape) if len(ctx.v_init_shape) else g_v_init.sum()
            g_v_init = g_v_init.to(v_init.dtype)
        g_step_out = None
        if need_step:
            g_step_out = (g_step * step_grad_scale).to(ctx.step_dtype).reshape(ctx.step_shape)
        g_w = None
        if g_k is not None:
            kk = torch.sigmoid(w.detach().to(g_k.dtype))
            g_w = (g_k * kk * (1 - kk)).to(ctx.w_dtype).reshape(w.shape)
        return g_x, g_v_init, g_step_out, g_w, None, None


def quant_neuron_sequence(x_seq: torch.Tensor, v_init, step, w: Optional[torch.Tensor],
                          params: NeuronParams):
    r"""The torch backend's step function: a quantized neuron over a whole sequence, one autograd
    node (:class:`QuantNeuronFunction`).

    Every backend's step function takes these arguments (see
    :func:`snnquant.kernels.dispatch.select_backend`). Dynamics and gradients: see
    :mod:`snnquant.functional.neuron`.

    Args:
        x_seq: input current, shape ``[T, N, ...]``, floating point.
        v_init: membrane potential before step 0 (tensor or float, broadcastable to ``x_seq[0]``).
        step: membrane step :math:`s` (positive float or scalar tensor).
        w: PLIF parameter (scalar tensor), ``None`` for the others.
        params: the neuron's constants.

    Returns:
        ``(spike_seq, v_last, v_seq)`` with ``v_seq`` ``None`` unless ``params.store_v_seq``.
    """
    _check_tensors(x_seq, params.neuron, w, step)
    dev = x_seq.device
    if not isinstance(step, torch.Tensor):
        step = torch.tensor(float(step), dtype=x_seq.dtype, device=dev)
    if not isinstance(v_init, torch.Tensor):
        v_init = torch.tensor(float(v_init), dtype=x_seq.dtype, device=dev)
    if w is None:
        w = torch.zeros((), device=dev)
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x_seq, v_init, step, w))
    spike_seq, v_last, v_seq = QuantNeuronFunction.apply(x_seq, v_init, step, w, params,
                                                         needs_grad)
    return spike_seq, v_last, (v_seq if params.store_v_seq else None)


def quant_neuron_multi_step(x_seq: torch.Tensor, v_init, *, step,
                            w: Optional[torch.Tensor] = None, **params):
    r"""Run a quantized-membrane neuron over a whole sequence (torch backend, one autograd node).

    Dynamics and gradients: see :mod:`snnquant.functional.neuron`. The keyword form of
    :func:`quant_neuron_sequence`; the fused kernels' keyword functions
    (:func:`snnquant.kernels.cpp_quant_neuron_multi_step`,
    :func:`snnquant.kernels.fused_quant_neuron_multi_step`) take the same arguments.

    Args:
        x_seq: input current, shape ``[T, N, ...]``, floating point.
        v_init: membrane potential before step 0 (tensor or float, broadcastable to ``x_seq[0]``).
        step: membrane step :math:`s` (positive float or scalar tensor; a tensor that requires grad
            receives the LSQ step gradient).
        w: PLIF parameter, :math:`1/\tau = \mathrm{sigmoid}(w)` (scalar tensor).
        **params: the fields of :class:`NeuronParams`: ``neuron`` (``'if'``, ``'lif'`` or
            ``'plif'``), ``qmin``, ``qmax`` (integer range of the membrane grid), and optionally
            ``tau=2.0`` (``'lif'``), ``decay_input=True``, ``v_threshold=1.0``, ``v_reset=0.0``
            (``None``: soft reset), ``surrogate_function`` (default ``surrogate.Sigmoid()``),
            ``detach_reset=False``, ``step_grad_scale=1.0`` (LSQ's :math:`1/\sqrt{N q_{max}}`),
            ``store_v_seq=False`` (also return the membrane after reset at every step).

    Returns:
        ``(spike_seq, v_last, v_seq)`` with ``v_seq`` ``None`` unless ``store_v_seq``.
    """
    return quant_neuron_sequence(x_seq, v_init, step, w, NeuronParams(**params))
