r"""Clamping with redefined gradients: ``clamp``, ``multi_level_spike_count``, ``clamp_by_linear``.

Drop-ins for the functions of the same names in ``spikingjelly.activation_based.quantize``.
"""

from __future__ import annotations

import torch

from ._validation import (
    as_tensor_input,
    check_bounds,
    check_finite_real,
    check_int,
    check_real_tensor,
)

__all__ = [
    "clamp",
    "clamp_backward",
    "multi_level_spike_count",
    "clamp_by_linear",
    "ClampSTE",
    "MultiLevelSpikeCountSTE",
]


def _inside(x: torch.Tensor, low, high) -> torch.Tensor:
    """Boolean mask of ``low <= x <= high`` (a ``None`` bound is no bound; NaN is outside)."""
    if low is None:
        return x <= high
    if high is None:
        return x >= low
    return (x >= low) & (x <= high)


def clamp_backward(grad_output: torch.Tensor, x: torch.Tensor, min_value, max_value) -> torch.Tensor:
    r"""The gradient of :func:`clamp`: ``grad_output`` where ``min_value <= x <= max_value``, else 0.

    Drop-in for ``spikingjelly.activation_based.quantize.clamp_backward``.

    .. math::

        \frac{\partial L}{\partial x} = g \cdot \begin{cases} 1 & a \le x \le b \\
            0 & \text{otherwise} \end{cases}, \quad g = \frac{\partial L}{\partial y}

    Args:
        grad_output: The upstream gradient :math:`g`.
        x: The input of the forward pass.
        min_value: Lower bound :math:`a` (a number, a tensor, or ``None`` for no bound).
        max_value: Upper bound :math:`b` (likewise).

    Returns:
        The masked gradient, in ``grad_output``'s dtype (NaN in ``x`` gives 0).
    """
    mask = _inside(x, min_value, max_value)
    return grad_output * mask.to(grad_output.dtype)


class ClampSTE(torch.autograd.Function):
    r"""Clamp whose gradient passes inside the closed interval and is 0 outside.

    .. math::

        y = \min(\max(x, a), b), \qquad
        \frac{\partial y}{\partial x} = \begin{cases} 1 & a \le x \le b \\ 0 & \text{otherwise}
        \end{cases}

    Used as ``ClampSTE.apply(x, min_value, max_value)`` (no argument checks). Also exported as
    ``ClampATGF`` (SpikingJelly's name).
    """

    @staticmethod
    def forward(ctx, x, min_value, max_value):
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(x)
            ctx.min_value = min_value
            ctx.max_value = max_value
        return torch.clamp(x, min_value, max_value)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return clamp_backward(grad_output, x, ctx.min_value, ctx.max_value), None, None


def clamp(x: torch.Tensor, min_value, max_value) -> torch.Tensor:
    r"""Clamp to ``[min_value, max_value]``; the gradient passes inside the closed interval.

    Drop-in for ``spikingjelly.activation_based.quantize.clamp``.

    .. math::

        y = \min(\max(x, a), b), \qquad
        \frac{\partial y}{\partial x} = \begin{cases} 1 & a \le x \le b \\ 0 & \text{otherwise}
        \end{cases}

    with :math:`a` = ``min_value`` and :math:`b` = ``max_value``. Both boundaries are inside (the
    gradient is 1 at :math:`x = a` and at :math:`x = b`). :math:`\pm\infty` clamps to the bounds with
    gradient 0; NaN stays NaN with gradient 0.

    Args:
        x: Input tensor. Integer tensors are accepted, as in SpikingJelly; a Python number becomes
            a 0-dim tensor of the default dtype.
        min_value: Lower bound, a number or a tensor broadcastable to ``x``; ``None`` means no lower
            bound.
        max_value: Upper bound, likewise; ``None`` means no upper bound.

    Returns:
        A new tensor.

    Raises:
        TypeError: ``x`` is a complex tensor, or neither a tensor nor a number.
        ValueError: ``min_value > max_value`` or a bound is NaN.
    """
    x = as_tensor_input(x)
    if not isinstance(x, torch.Tensor) or x.is_complex():
        check_real_tensor("clamp", x)  # raises the TypeError (bool is accepted, as torch does)
    check_bounds("clamp", "min_value", min_value, "max_value", max_value)
    return ClampSTE.apply(x, min_value, max_value)


class MultiLevelSpikeCountSTE(torch.autograd.Function):
    r"""Round a clamped spike count; the gradient passes inside a window.

    .. math::

        y = \operatorname{round}(\min(\max(x, 0), S)), \qquad
        \frac{\partial y}{\partial x} = \begin{cases} 1 & g_0 \le x \le g_1 \\ 0 & \text{otherwise}
        \end{cases}

    Used as ``MultiLevelSpikeCountSTE.apply(x, max_spike_count, grad_min, grad_max)`` (no argument
    checks). Also exported as ``MultiLevelSpikeCountATGF`` (SpikingJelly's name).
    """

    @staticmethod
    def forward(ctx, x, max_spike_count, grad_min, grad_max):
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(x)
            ctx.grad_min = grad_min
            ctx.grad_max = grad_max
        return torch.round(torch.clamp(x, 0, max_spike_count))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        mask = _inside(x, ctx.grad_min, ctx.grad_max)
        return grad_output * mask.to(grad_output.dtype), None, None, None


def multi_level_spike_count(x: torch.Tensor, max_spike_count, grad_window=None) -> torch.Tensor:
    r"""Round to a spike count in ``{0, 1, ..., max_spike_count}``; gradient inside a window.

    Drop-in for ``spikingjelly.activation_based.quantize.multi_level_spike_count``.

    .. math::

        y = \operatorname{round}(\min(\max(x, 0), S)), \qquad
        \frac{\partial y}{\partial x} = \begin{cases} 1 & g_0 \le x \le g_1 \\ 0 & \text{otherwise}
        \end{cases}

    with :math:`S` = ``max_spike_count`` and :math:`(g_0, g_1)` = ``grad_window``, by default
    :math:`(0, S)`. Rounding is half to even. NaN stays NaN with gradient 0.

    Args:
        x: Input tensor. Integer tensors are accepted, as in SpikingJelly.
        max_spike_count: Largest count, an integer (or integral float) ``>= 0``.
        grad_window: ``None`` or a pair ``(g_0, g_1)`` with ``g_0 <= g_1``.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        ValueError: ``max_spike_count`` is negative or not integral, or ``grad_window`` is not an
            ordered pair.
    """
    x = as_tensor_input(x)
    if not isinstance(x, torch.Tensor) or x.is_complex():
        check_real_tensor("multi_level_spike_count", x)
    if isinstance(max_spike_count, torch.Tensor) and max_spike_count.numel() == 1:
        max_spike_count = max_spike_count.item()  # SpikingJelly takes int(max_spike_count) too
    max_spike_count = check_int("multi_level_spike_count", "max_spike_count", max_spike_count, low=0)
    if grad_window is None:
        grad_min, grad_max = 0.0, float(max_spike_count)
    else:
        try:
            grad_min, grad_max = grad_window
        except (TypeError, ValueError):
            raise ValueError(
                f"multi_level_spike_count: grad_window must be None or a pair (min, max), "
                f"got {grad_window!r}"
            ) from None
        check_bounds("multi_level_spike_count", "grad_window[0]", grad_min, "grad_window[1]", grad_max)
    return MultiLevelSpikeCountSTE.apply(x, max_spike_count, grad_min, grad_max)


def clamp_by_linear(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    r"""Map ``x`` linearly onto ``[0, 1)`` using its global minimum and maximum.

    Drop-in for ``spikingjelly.activation_based.quantize.clamp_by_linear``.

    .. math::

        y = \frac{x - \min(x)}{\max(x) + \varepsilon - \min(x)}

    The gradient is the true gradient of this formula (autograd), including the terms through
    :math:`\min(x)` and :math:`\max(x)` (shared evenly between tied extrema, as :func:`torch.max`
    does). Any NaN in ``x`` makes the whole output NaN; an infinite entry makes the output follow the
    formula (NaN or 0). An empty ``x`` gives an empty result. Where the denominator is 0 (a
    constant ``x`` with ``eps=0``, or an ``eps`` lost in rounding next to a large maximum) the
    denominator 1 is used instead, so a constant ``x`` maps to 0, not to NaN.

    Args:
        x: Input tensor, floating point or integer. An integer tensor gives a floating-point result
            of the default dtype, computed with the same operations as SpikingJelly.
        eps: Finite number ``>= 0`` added to the denominator.

    Returns:
        A new tensor of the same shape (and dtype, for floating-point ``x``).

    Raises:
        TypeError: ``x`` is a bool or complex tensor.
        ValueError: ``eps`` is negative or not finite.
    """
    check_real_tensor("clamp_by_linear", x)
    eps = check_finite_real("clamp_by_linear", "eps", eps)
    if eps < 0:
        raise ValueError(f"clamp_by_linear: eps must be >= 0, got {eps!r}")
    if x.numel() == 0:
        # torch.max of an empty tensor raises; the formula maps nothing to nothing.
        return x.clone() if x.is_floating_point() else x.to(torch.get_default_dtype())
    # The same operations in the same order as SpikingJelly, so that values and gradients are
    # bitwise equal (torch.aminmax saves a pass forward but not backward, where the time goes).
    x_max = torch.max(x) + eps
    x_min = torch.min(x)
    denominator = x_max - x_min
    # A 0-dim where: no host synchronisation, and the same value (and gradient) when it is not 0.
    denominator = torch.where(denominator == 0, torch.ones_like(denominator), denominator)
    return (x - x_min) / denominator
