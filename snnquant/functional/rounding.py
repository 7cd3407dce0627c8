r"""Rounding with redefined gradients.

Straight-through rounding (``round``, ``ceil``, ``floor``) as in
``spikingjelly.activation_based.quantize``; the rounding functions of the shok library
(``PassRound``, ``SoftRound``, ``ScaleGrad``); the differentiable soft rounding of Agustsson & Theis
(``smooth_round``); rounding to a multiple of a step (``step_quantize``) and to decimal places
(``round_decimals``).
"""

from __future__ import annotations

import math
import numbers

import torch

from ._validation import (
    PRECISION_BITS,
    as_tensor_input,
    check_float_tensor,
    check_positive,
    check_quotient_finite,
    check_real_tensor,
    check_step_fits_dtype,
    check_step_shape,
    float_from_integer,
)

__all__ = [
    "round",
    "ceil",
    "floor",
    "step_quantize",
    "pass_round",
    "soft_round",
    "scale_grad",
    "smooth_round",
    "round_decimals",
    "RoundSTE",
    "CeilSTE",
    "FloorSTE",
    "StepQuantizeSTE",
    "step_quantize_forward",
    "PassRound",
    "SoftRound",
    "ScaleGrad",
]


class RoundSTE(torch.autograd.Function):
    r"""Round to the nearest integer (half to even) with a straight-through gradient.

    .. math::

        y = \operatorname{round}(x), \qquad \frac{\partial y}{\partial x} = 1

    Used as ``RoundSTE.apply(x)``. Also exported as ``RoundATGF`` (SpikingJelly's name) and
    ``PassRound`` (shok's name).
    """

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class CeilSTE(torch.autograd.Function):
    r"""Round up with a straight-through gradient.

    .. math::

        y = \lceil x \rceil, \qquad \frac{\partial y}{\partial x} = 1

    Used as ``CeilSTE.apply(x)``. Also exported as ``CeilATGF`` (SpikingJelly's name).
    """

    @staticmethod
    def forward(ctx, x):
        return torch.ceil(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class FloorSTE(torch.autograd.Function):
    r"""Round down with a straight-through gradient.

    .. math::

        y = \lfloor x \rfloor, \qquad \frac{\partial y}{\partial x} = 1

    Used as ``FloorSTE.apply(x)``. Also exported as ``FloorATGF`` (SpikingJelly's name).
    """

    @staticmethod
    def forward(ctx, x):
        return torch.floor(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


PassRound = RoundSTE


def round(x: torch.Tensor) -> torch.Tensor:  # noqa: A001 - SpikingJelly's name
    r"""Round to the nearest integer with a straight-through gradient.

    Drop-in for ``spikingjelly.activation_based.quantize.round``. Ties go to the even integer, as in
    :func:`torch.round`.

    .. math::

        y = \operatorname{round}(x), \qquad \frac{\partial y}{\partial x} = 1

    Args:
        x: Input tensor. Integer tensors are accepted (returned rounded, i.e. unchanged), as in
            SpikingJelly; a Python number becomes a 0-dim tensor of the default dtype. NaN stays
            NaN and :math:`\pm\infty` stays :math:`\pm\infty`.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        TypeError: ``x`` is a bool or complex tensor, or neither a tensor nor a number.
    """
    x = as_tensor_input(x)
    check_real_tensor("round", x)
    return RoundSTE.apply(x)


def ceil(x: torch.Tensor) -> torch.Tensor:
    r"""Round up with a straight-through gradient.

    Drop-in for ``spikingjelly.activation_based.quantize.ceil``.

    .. math::

        y = \lceil x \rceil, \qquad \frac{\partial y}{\partial x} = 1

    Args:
        x: Input tensor. Integer tensors are accepted, as in SpikingJelly; a Python number becomes
            a 0-dim tensor of the default dtype.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        TypeError: ``x`` is a bool or complex tensor, or neither a tensor nor a number.
    """
    x = as_tensor_input(x)
    check_real_tensor("ceil", x)
    return CeilSTE.apply(x)


def floor(x: torch.Tensor) -> torch.Tensor:
    r"""Round down with a straight-through gradient.

    Drop-in for ``spikingjelly.activation_based.quantize.floor``.

    .. math::

        y = \lfloor x \rfloor, \qquad \frac{\partial y}{\partial x} = 1

    Args:
        x: Input tensor. Integer tensors are accepted, as in SpikingJelly; a Python number becomes
            a 0-dim tensor of the default dtype.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        TypeError: ``x`` is a bool or complex tensor, or neither a tensor nor a number.
    """
    x = as_tensor_input(x)
    check_real_tensor("floor", x)
    return FloorSTE.apply(x)



class StepQuantizeSTE(torch.autograd.Function):
    r"""Round to the nearest multiple of ``step`` with a straight-through gradient.

    .. math::

        y = s \cdot \operatorname{round}(x / s), \qquad \frac{\partial y}{\partial x} = 1

    Used as ``StepQuantizeSTE.apply(x, step)`` (no argument checks). Also exported as
    ``StepQuantizeATGF`` (SpikingJelly's name).
    """

    @staticmethod
    def forward(ctx, x, step):
        return step_quantize_forward(x, step)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def step_quantize_forward(x: torch.Tensor, step) -> torch.Tensor:
    r"""The forward value of :func:`step_quantize`, without autograd rules or argument checks.

    Drop-in for ``spikingjelly.activation_based.quantize.step_quantize_forward``.

    .. math::

        y = s \cdot \operatorname{round}(x / s)

    Args:
        x: Input tensor.
        step: Grid spacing :math:`s`, a number or a tensor broadcastable to ``x``.

    Returns:
        A new tensor.
    """
    return torch.round(x / step) * step


def step_quantize(x: torch.Tensor, step=1.0) -> torch.Tensor:
    r"""Round to the nearest multiple of ``step`` with a straight-through gradient.

    Drop-in for ``spikingjelly.activation_based.quantize.step_quantize``.

    .. math::

        y = s \cdot \operatorname{round}(x / s), \qquad \frac{\partial y}{\partial x} = 1

    with :math:`s` = ``step``; ties go to the even multiple. NaN stays NaN, :math:`\pm\infty` stays
    :math:`\pm\infty`.

    ``step`` must fit the dtype the computation runs in (``x``'s dtype, or the promoted dtype for a
    tensor ``step``): a normal number of that dtype (``1e300`` for float32 x would become
    infinity, ``1e-45`` a subnormal), and, for a step below 1, small enough that :math:`x / s` does
    not overflow for any finite element of ``x`` (checked on the quotient the function computes
    anyway, with one read-only reduction).

    Args:
        x: Input tensor, floating point or integer. Integer tensors give a floating-point result
            of the default dtype (the promoted dtype for a tensor ``step``), as in SpikingJelly.
            A Python number becomes a 0-dim tensor of the default dtype.
        step: Grid spacing, a number or a floating-point tensor broadcastable to ``x`` (which then
            gets no gradient), finite and ``> 0``.

    Returns:
        A new tensor.

    Raises:
        TypeError: ``x`` is a bool or complex tensor.
        ValueError: ``step`` is not finite and positive, is not representable in the dtype, or
            makes ``x / step`` overflow; the message names ``step`` and the dtype. A tensor
            ``step`` that is empty (for a non-empty ``x``) or does not broadcast to ``x``.
    """
    fn = "step_quantize"
    x = as_tensor_input(x)
    step = check_positive(fn, "step", step)
    x = float_from_integer(fn, x, step)
    check_step_shape(fn, "step", step, x)
    check_step_fits_dtype(fn, "step", step, torch.result_type(x, step))
    return CheckedStepQuantizeSTE.apply(x, step, fn)


class CheckedStepQuantizeSTE(torch.autograd.Function):
    """:class:`StepQuantizeSTE` that checks its own quotient for overflow (see
    :func:`check_quotient_finite`) and rounds and scales it in place: the check reads the
    quotient once, and the two tensors the in-place steps do not allocate pay for it.

    Used as ``CheckedStepQuantizeSTE.apply(x, step, fn)``, ``fn`` the public function's name for
    the error message; the other checks of :func:`step_quantize` are the caller's.
    """

    @staticmethod
    def forward(ctx, x, step, fn):
        quotient = x / step
        # Only a step below 1 can make a finite x overflow; a tensor step is not looked at here.
        if isinstance(step, torch.Tensor) or step < 1.0:
            check_quotient_finite(fn, "step", x, quotient, step, quotient.dtype)
        torch.round(quotient, out=quotient)
        return quotient.mul_(step)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None, None


def pass_round(x: torch.Tensor) -> torch.Tensor:
    r"""Round to the nearest integer and pass the gradient unchanged (shok's ``PassRound``).

    .. math::

        y = \operatorname{round}(x), \qquad \frac{\partial y}{\partial x} = 1

    Args:
        x: Input tensor (floating point or integer); a Python number becomes a 0-dim tensor of
            the default dtype.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        TypeError: ``x`` is a bool or complex tensor, or neither a tensor nor a number.
    """
    x = as_tensor_input(x)
    check_real_tensor("pass_round", x)
    return RoundSTE.apply(x)


class SoftRound(torch.autograd.Function):
    r"""Round to the nearest integer; scale the gradient by the ratio of input to output (shok).

    .. math::

        y = \operatorname{round}(x), \qquad
        \frac{\partial y}{\partial x} = r = \begin{cases}
            x / \operatorname{round}(x) & \operatorname{round}(x) \ne 0 \\
            0 & \operatorname{round}(x) = 0,\ x \ne 0 \\
            1 & x = 0
        \end{cases}

    Used as ``SoftRound.apply(x)``; :func:`soft_round` is the function form. The ratio is saved
    only when ``x`` requires a gradient (decided from ``x.requires_grad``, as shok does, so that
    ``SoftRound.forward(ctx, x)`` also works with a context that only has ``save_for_backward``).
    """

    @staticmethod
    def forward(ctx, x):
        with torch.no_grad():
            rounded = torch.round(x)
        if x.requires_grad:
            nonzero = rounded != 0
            ratio = torch.where(nonzero, x / torch.where(nonzero, rounded, 1), 0)
            ratio = torch.where(x == 0, 1, ratio).to(x.dtype)
            ctx.save_for_backward(ratio)
        return rounded

    @staticmethod
    def backward(ctx, grad_output):
        (ratio,) = ctx.saved_tensors
        return grad_output * ratio


def soft_round(x: torch.Tensor) -> torch.Tensor:
    r"""Round to the nearest integer with shok's ratio-scaled gradient (see :class:`SoftRound`).

    .. math::

        y = \operatorname{round}(x), \qquad
        \frac{\partial y}{\partial x} = \begin{cases}
            x / \operatorname{round}(x) & \operatorname{round}(x) \ne 0 \\
            0 & \operatorname{round}(x) = 0,\ x \ne 0 \\
            1 & x = 0
        \end{cases}

    Args:
        x: Input tensor (floating point or integer); a Python number becomes a 0-dim tensor of
            the default dtype.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        TypeError: ``x`` is a bool or complex tensor, or neither a tensor nor a number.
    """
    x = as_tensor_input(x)
    check_real_tensor("soft_round", x)
    return SoftRound.apply(x)


class ScaleGrad(torch.autograd.Function):
    r"""Identity forward; the backward divides the gradient by its largest magnitude (shok).

    .. math::

        y = x, \qquad
        \frac{\partial L}{\partial x} = \begin{cases}
            g / \max|g| & \max|g| > 0 \\
            g & \text{otherwise}
        \end{cases}, \quad g = \frac{\partial L}{\partial y}

    The maximum is over the whole gradient tensor. Used as ``ScaleGrad.apply(x)``;
    :func:`scale_grad` is the function form. The forward returns a view of ``x`` (no copy).
    """

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output.numel() == 0:
            return grad_output
        grad_max = grad_output.abs().amax()
        # torch.where instead of `if grad_max > 0` avoids a device synchronisation on CUDA.
        return torch.where(grad_max > 0, grad_output / grad_max, grad_output)


def scale_grad(x: torch.Tensor) -> torch.Tensor:
    r"""Identity whose gradient is normalised by its largest magnitude (see :class:`ScaleGrad`).

    .. math::

        y = x, \qquad
        \frac{\partial L}{\partial x} = \begin{cases}
            g / \max|g| & \max|g| > 0 \\
            g & \text{otherwise}
        \end{cases}

    Args:
        x: Input tensor.

    Returns:
        A view of ``x``.
    """
    return ScaleGrad.apply(as_tensor_input(x))


def smooth_round(x: torch.Tensor, alpha) -> torch.Tensor:
    r"""Differentiable soft rounding of Agustsson & Theis (2020), with its true gradient.

    .. math::

        y = \lfloor x \rfloor + \frac{1}{2}\,\frac{\tanh(\alpha r)}{\tanh(\alpha / 2)} + \frac{1}{2},
        \qquad r = x - \lfloor x \rfloor - \frac{1}{2}

    .. math::

        \frac{\partial y}{\partial x} = \frac{\alpha}{2}\,
            \frac{1 - \tanh^2(\alpha r)}{\tanh(\alpha / 2)}

    The function is continuous and increasing; it tends to the identity as
    :math:`\alpha \to 0` and to :func:`torch.round` as :math:`\alpha \to \infty`. The gradient is
    computed by autograd (no straight-through estimator), also with respect to ``alpha`` when it is
    a tensor that requires a gradient.

    NaN stays NaN; :math:`\pm\infty` maps to :math:`\pm\infty` (as ``round`` does) with gradient 1.

    Args:
        x: Floating-point input tensor.
        alpha: Sharpness, a Python number or a floating-point tensor (broadcast against ``x``),
            finite and ``> 0``.

    Returns:
        A new tensor (shape of ``x`` broadcast against ``alpha``).

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``alpha`` is not finite and positive.
    """
    x = as_tensor_input(x)
    check_float_tensor("smooth_round", x)
    alpha = check_positive("smooth_round", "alpha", alpha)
    infinite = torch.isinf(x)
    # Zero the infinite entries before the formula so that no NaN reaches the backward pass.
    finite_x = torch.where(infinite, 0, x)
    floor_x = torch.floor(finite_x).detach()
    r = finite_x - floor_x - 0.5
    if isinstance(alpha, torch.Tensor):
        half_range = torch.tanh(alpha / 2)
    else:
        half_range = math.tanh(alpha / 2)
    y = floor_x + 0.5 * torch.tanh(alpha * r) / half_range + 0.5
    return torch.where(infinite, x, y)


class _RoundDecimalsSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, decimals):
        rounded = torch.round(x, decimals=decimals)
        if decimals > 0:
            # Beyond this magnitude every value of x's dtype already has no digit finer than
            # 10**-decimals, while x * 10**decimals may overflow: return x there.
            limit = 2.0 ** PRECISION_BITS[x.dtype] / 10.0**decimals
            rounded = torch.where(x.abs() >= limit, x, rounded)
        return rounded

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def round_decimals(x: torch.Tensor, decimals: int) -> torch.Tensor:
    r"""Round to ``decimals`` decimal places with a straight-through gradient.

    .. math::

        y = \frac{\operatorname{round}(10^{d} x)}{10^{d}}, \qquad
        \frac{\partial y}{\partial x} = 1

    with :math:`d` = ``decimals`` (negative values round to tens, hundreds, ...). Values so large
    that they have no digit finer than :math:`10^{-d}` are returned unchanged (where
    :math:`10^{d} x` would overflow).

    A common hand-written "differentiable round" scales by :math:`s = 10^d`, computes
    ``diff = 1.01 * (s * x) - floor(s * x)`` and returns
    ``(s * x - diff + floor(s * x) + (diff >= 0.5)) / s``: its forward value is not a rounding at all
    and its gradient is :math:`-0.01` per element (for ``g = [0.99, 1.54, 1.9]`` and ``d = 1`` the
    gradient sums to ``-0.03``). This function returns ``[1.0, 1.5, 1.9]`` and a gradient of ones:

    >>> g = torch.tensor([0.99, 1.54, 1.9], requires_grad=True)
    >>> y = round_decimals(g, 1)
    >>> y.sum().backward()
    >>> y.detach(), g.grad
    (tensor([1.0000, 1.5000, 1.9000]), tensor([1., 1., 1.]))

    Args:
        x: Floating-point input tensor.
        decimals: Number of decimal places, an ``int`` with :math:`10^{|d|}` finite in the
            compute dtype: :math:`|d| \le 38` for float16/bfloat16/float32 (computed in float32)
            and :math:`|d| \le 308` for float64.

    Returns:
        A new tensor of the same shape and dtype. NaN stays NaN, :math:`\pm\infty` stays
        :math:`\pm\infty`.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``decimals`` is not an int or is out of range for the dtype.
    """
    x = as_tensor_input(x)
    check_float_tensor("round_decimals", x)
    if isinstance(decimals, bool) or not isinstance(decimals, numbers.Integral):
        raise ValueError(f"round_decimals: decimals must be an int, got {decimals!r}")
    decimals = int(decimals)
    limit = 308 if x.dtype == torch.float64 else 38
    if abs(decimals) > limit:
        raise ValueError(
            f"round_decimals: decimals must be in [-{limit}, {limit}] for {x.dtype} input "
            f"(10**|decimals| must be finite), got {decimals}"
        )
    return _RoundDecimalsSTE.apply(x, decimals)

