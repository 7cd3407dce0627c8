r"""Learned Step Size Quantization (LSQ, Esser et al., ICLR 2020)."""

from __future__ import annotations

import torch

from ._validation import (
    as_tensor_input,
    check_finite_real,
    check_float_tensor,
    check_int,
    check_positive,
    check_step_fits_dtype,
    check_step_shape,
)

__all__ = ["lsq_quantize"]


class _LSQQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, step, qmin, qmax, grad_scale):
        v = x / step
        rounded = torch.round(v)
        out = torch.clamp(rounded, qmin, qmax) * step
        step_is_tensor = isinstance(step, torch.Tensor)
        need_x, need_step = ctx.needs_input_grad[0], step_is_tensor and ctx.needs_input_grad[1]
        if need_x or need_step:
            # d out / d step (Esser et al. 2020, eq. 3): qmin where v <= qmin, qmax where
            # v >= qmax (the end points included), round(v) - v between; NaN stays NaN.
            below = v <= qmin
            above = v >= qmax
            step_grad = (
                torch.where(below, qmin, torch.where(above, qmax, rounded - v)) if need_step else None
            )
            inside = (v >= qmin) & (v <= qmax) if need_x else None
            ctx.save_for_backward(inside, step_grad)
        ctx.grad_scale = grad_scale
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.step_shape = step.shape if step_is_tensor else None
        ctx.step_dtype = step.dtype if step_is_tensor else None
        return out

    @staticmethod
    def backward(ctx, grad_output):
        inside, step_grad = ctx.saved_tensors
        grad_x = grad_step = None
        if inside is not None:
            grad_x = grad_output * inside.to(grad_output.dtype)
            if grad_x.shape != ctx.x_shape:
                grad_x = grad_x.sum_to_size(ctx.x_shape)
            grad_x = grad_x.to(ctx.x_dtype)
        if step_grad is not None:
            grad_step = grad_output * step_grad
            if grad_step.shape != ctx.step_shape:
                grad_step = grad_step.sum_to_size(ctx.step_shape)
            grad_step = (grad_step * ctx.grad_scale).to(ctx.step_dtype)
        return grad_x, grad_step, None, None, None


def lsq_quantize(x: torch.Tensor, step, qmin, qmax, grad_scale=1.0) -> torch.Tensor:
    r"""Learned Step Size Quantization (Esser et al., 2020): fake-quantize with a learnable step.

    .. math::

        v = x / s, \qquad y = s \cdot \min(\max(\operatorname{round}(v), Q_n), Q_p)

    .. math::

        \frac{\partial y}{\partial x} = \begin{cases} 1 & Q_n \le v \le Q_p \\ 0 &
            \text{otherwise} \end{cases}, \qquad
        \frac{\partial y}{\partial s} = \gamma \cdot \begin{cases}
            Q_n & v \le Q_n \\
            \operatorname{round}(v) - v & Q_n < v < Q_p \\
            Q_p & v \ge Q_p \end{cases}

    with :math:`s` = ``step``, :math:`Q_n` = ``qmin``, :math:`Q_p` = ``qmax`` and :math:`\gamma` =
    ``grad_scale`` (the paper uses :math:`\gamma = 1/\sqrt{N Q_p}` for :math:`N` weights or
    features). Both bounds are inside for the ``x`` gradient; at the bounds themselves the step
    gradient is :math:`Q_n` or :math:`Q_p`, as in the paper's eq. 3 (there
    :math:`\operatorname{round}(v) - v` would be 0, which matters for inputs already on the grid's
    end points, such as re-quantized tensors). The step gradient is summed over the dimensions along which
    ``step`` was broadcast, so a scalar step gets a scalar gradient and a per-channel step (shape
    ``[C, 1, 1]`` against ``[N, C, H, W]``, say) a per-channel one. Ties in the rounding go to the
    even integer.

    NaN input gives NaN output, a zero ``x`` gradient and a NaN ``step`` gradient;
    :math:`\pm\infty` clamps to :math:`s Q_p` / :math:`s Q_n` with a zero ``x`` gradient.

    ``step`` must be a normal number of the dtype the computation runs in, and
    :math:`s \max(|Q_n|, |Q_p|)` must not overflow it (``step=1e300`` for float32 ``x`` would give
    NaN).

    Args:
        x: Floating-point input tensor (a Python number becomes a 0-dim tensor of the default
            dtype).
        step: Step size :math:`s`, a positive number or a positive floating-point tensor
            broadcastable to ``x``, possibly requiring a gradient. A tensor ``step`` is checked once
            per call (a device synchronisation on CUDA).
        qmin: Lowest integer level :math:`Q_n` (for example :math:`-2^{b-1}`, or 0 unsigned).
        qmax: Highest integer level :math:`Q_p` (for example :math:`2^{b-1} - 1`), ``> qmin``.
        grad_scale: Finite factor :math:`\gamma` applied to the step gradient.

    Returns:
        A new tensor (``x`` broadcast against ``step``).

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``step`` not positive, not representable in the dtype (the message names
            ``step`` and the dtype), empty or not broadcastable to ``x``, ``qmin``/``qmax`` not integers, ``qmin >= qmax``, or
            ``grad_scale`` not finite.
    """
    fn = "lsq_quantize"
    x = as_tensor_input(x)
    check_float_tensor(fn, x)
    step = check_positive(fn, "step", step)
    qmin = check_int(fn, "qmin", qmin)
    qmax = check_int(fn, "qmax", qmax)
    if qmin >= qmax:
        raise ValueError(f"{fn}: qmin must be < qmax, got qmin={qmin} and qmax={qmax}")
    grad_scale = check_finite_real(fn, "grad_scale", grad_scale)
    check_step_shape(fn, "step", step, x)
    check_step_fits_dtype(fn, "step", step, torch.result_type(x, step),
                          largest_level=max(abs(qmin), abs(qmax)))
    return _LSQQuantize.apply(x, step, qmin, qmax, grad_scale)


def lsq_quantize_unchecked(x: torch.Tensor, step, qmin: int, qmax: int,
                           grad_scale: float = 1.0) -> torch.Tensor:
    r""":func:`lsq_quantize` without argument checks, for callers that validated them once.

    Same forward and gradients as :func:`lsq_quantize`. It reads no device tensor, so a module can
    call it on every forward without a host synchronisation (and under ``torch.compile``); the
    caller guarantees a floating-point ``x``, a positive finite ``step`` and int ``qmin < qmax``.
    """
    return _LSQQuantize.apply(x, step, qmin, qmax, grad_scale)
