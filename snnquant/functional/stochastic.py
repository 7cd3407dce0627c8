r"""Stochastic rounding, and QKeras's straight-through ``_round_through``."""

from __future__ import annotations

import torch

from ._validation import (
    as_tensor_input,
    check_flag,
    check_float_tensor,
    check_positive,
    check_quotient_finite,
    check_step_fits_dtype,
    check_step_shape,
    compute_dtype,
)
from .rounding import CheckedStepQuantizeSTE

__all__ = ["stochastic_round", "round_through"]


def stochastic_round_integers(v: torch.Tensor, generator) -> torch.Tensor:
    r"""Round ``v`` down or up to an integer, up with probability :math:`v - \lfloor v \rfloor`.

    Inner helper (no checks, no autograd): ``v`` is in its compute dtype (float32 or float64), so
    the uniform samples have enough resolution for the expectation to be ``v``. NaN stays NaN and
    :math:`\pm\infty` stays :math:`\pm\infty`.
    """
    low = torch.floor(v)
    fraction = v - low
    uniform = torch.rand(v.shape, generator=generator, dtype=v.dtype, device=v.device)
    # P(uniform < fraction) = fraction; an integer (fraction 0) never moves, an infinity gives a NaN
    # fraction, which compares False and keeps the infinity.
    return low + (uniform < fraction).to(v.dtype)


def _sum_to(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return grad if grad.shape == shape else grad.sum_to_size(shape)


class _StochasticRoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, step, generator, fn):
        ctx.x_shape = x.shape
        ctx.x_dtype = x.dtype
        work = x.to(compute_dtype(x.dtype))
        if isinstance(step, torch.Tensor):
            step = step.to(work.dtype)
        quotient = work / step
        check_quotient_finite(fn, "step", work, quotient, step, work.dtype)
        out = stochastic_round_integers(quotient, generator) * step
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return _sum_to(grad_output, ctx.x_shape).to(ctx.x_dtype), None, None, None


def _check_step(fn: str, x: torch.Tensor, step, stochastic: bool):
    """The step checks of :func:`step_quantize`, in the dtype the computation runs in: float32
    for float16/bfloat16 ``x`` on the stochastic path, the promoted dtype on the deterministic one.
    Returns ``step`` (a Python number as ``float``)."""
    step = check_positive(fn, "step", step)
    check_step_shape(fn, "step", step, x)
    dtype = compute_dtype(x.dtype) if stochastic else torch.result_type(x, step)
    check_step_fits_dtype(fn, "step", step, dtype)
    return step


def stochastic_round(x: torch.Tensor, step=1.0, generator=None) -> torch.Tensor:
    r"""Round down or up to a multiple of ``step`` at random, unbiased; straight-through gradient.

    .. math::

        v = x / s, \qquad
        y = s \cdot \begin{cases} \lfloor v \rfloor + 1 & \text{with probability } v - \lfloor v \rfloor
            \\ \lfloor v \rfloor & \text{otherwise} \end{cases}, \qquad
        \mathbb{E}[y] = x, \qquad \frac{\partial y}{\partial x} = 1

    with :math:`s` = ``step``. Multiples of ``step`` are returned unchanged. ``step`` must be a
    normal number of the dtype the computation runs in (``1e300`` or ``1e-45`` for float32 would
    give NaN or infinity), and :math:`x / s` must not overflow it for a finite element of ``x``. The uniform samples
    come from :func:`torch.rand` with ``generator``, so a seeded :class:`torch.Generator` (on the
    device of ``x``) makes the result reproducible. float16 and bfloat16 inputs are computed in
    float32 and cast back. NaN stays NaN, :math:`\pm\infty` stays :math:`\pm\infty`.

    Args:
        x: Floating-point input tensor.
        step: Grid spacing, a number or a floating-point tensor broadcastable to ``x``, finite and
            ``> 0``. A tensor ``step`` gets no gradient.
        generator: Optional :class:`torch.Generator` for the random draws.

    Returns:
        A new tensor with the dtype of ``x``.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``step`` is not finite and positive, not representable in the dtype of the
            computation, empty or not broadcastable to ``x``, or makes ``x / step`` overflow;
            the message names ``step``.
    """
    fn = "stochastic_round"
    x = as_tensor_input(x)
    check_float_tensor(fn, x)
    step = _check_step(fn, x, step, stochastic=True)
    return _StochasticRoundSTE.apply(x, step, generator, fn)


def round_through(x: torch.Tensor, stochastic=False, step=1.0, generator=None) -> torch.Tensor:
    r"""QKeras's ``_round_through``: round to a multiple of ``step`` with a straight-through gradient.

    .. math::

        y = s \cdot \operatorname{round}(x / s) \ \text{(deterministic, half to even)}, \qquad
        y = \texttt{stochastic\_round}(x, s) \ \text{(stochastic)}, \qquad
        \frac{\partial y}{\partial x} = 1

    Differences from QKeras, on purpose: QKeras's deterministic path always rounds to integers and
    its stochastic path rounds to multiples of ``precision`` (default 0.5); here one ``step``
    (default 1.0) serves both, so the defaults round to integers either way. QKeras switches to the
    deterministic path outside its training phase; here ``stochastic`` decides.

    Args:
        x: Floating-point input tensor.
        stochastic: Round at random (see :func:`stochastic_round`) instead of to the nearest.
        step: Grid spacing, a number or a floating-point tensor, finite and ``> 0``.
        generator: Optional :class:`torch.Generator`, used only when ``stochastic`` is true.

    Returns:
        A new tensor with the dtype of ``x``.

    Raises:
        TypeError: ``x`` is not a floating-point tensor or ``stochastic`` is not a bool.
        ValueError: ``step`` fails the checks of :func:`stochastic_round`.
    """
    fn = "round_through"
    x = as_tensor_input(x)
    check_float_tensor(fn, x)
    stochastic = check_flag(fn, "stochastic", stochastic)
    step = _check_step(fn, x, step, stochastic)
    if stochastic:
        return _StochasticRoundSTE.apply(x, step, generator, fn)
    return CheckedStepQuantizeSTE.apply(x, step, fn)
