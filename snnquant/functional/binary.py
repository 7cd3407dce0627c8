r"""Binary and ternary weight quantization with a learnable scale :math:`\alpha`."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["binary_quantize", "ternary_quantize"]


def _sign(x: torch.Tensor) -> torch.Tensor:
    """``sign`` with :math:`\\mathrm{sign}(0) = +1`."""
    return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))


class _ScaledCodes(torch.autograd.Function):
    """``alpha * code(x)`` with the straight-through / LSQ-style gradients of the two functions."""

    @staticmethod
    def forward(ctx, x, alpha, delta, grad_scale, clip):
        v = x / alpha
        code = _sign(v) if delta is None else _sign(v) * (x.abs() > delta).to(x.dtype)
        out = alpha * code
        inside = v.abs() <= 1
        passes = inside if clip is None else x.abs() <= clip
        need_alpha = isinstance(alpha, torch.Tensor) and ctx.needs_input_grad[1]
        alpha_grad = torch.where(inside, code - v, _sign(v)) if need_alpha else None
        ctx.save_for_backward(passes, alpha_grad)
        ctx.grad_scale = grad_scale
        ctx.alpha_shape = alpha.shape if isinstance(alpha, torch.Tensor) else None
        ctx.alpha_dtype = alpha.dtype if isinstance(alpha, torch.Tensor) else None
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_output):
        inside, alpha_grad = ctx.saved_tensors
        grad_x = grad_alpha = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_output * inside.to(grad_output.dtype)).sum_to_size(ctx.x_shape)
            grad_x = grad_x.to(ctx.x_dtype)
        if alpha_grad is not None:
            grad_alpha = (grad_output * alpha_grad).sum_to_size(ctx.alpha_shape)
            grad_alpha = (grad_alpha * ctx.grad_scale).to(ctx.alpha_dtype)
        return grad_x, grad_alpha, None, None, None


def _check(x, alpha, grad_scale, clip):
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                             or not clip > 0):
        raise ValueError(f"clip must be None or a positive number, got {clip!r}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if isinstance(alpha, torch.Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"alpha must be a positive float or floating-point tensor, got "
                            f"dtype {alpha.dtype}")
    elif isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"alpha must be a positive number or tensor, got {alpha!r}")
    if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float)):
        raise ValueError(f"grad_scale must be a number, got {grad_scale!r}")


def binary_quantize(x: torch.Tensor, alpha, grad_scale: float = 1.0,
                    clip: Optional[float] = 1.0) -> torch.Tensor:
    r"""Binary quantization :math:`y = \alpha\,\mathrm{sign}(x)` with :math:`\mathrm{sign}(0) = +1`.

    .. math::

        y = \alpha\,\mathrm{sign}(x),\qquad v = x / \alpha

    .. math::

        \frac{\partial y}{\partial x} = [\,|x| \le c\,],\qquad
        \frac{\partial y}{\partial \alpha} = \gamma \cdot \begin{cases}
            \mathrm{sign}(v) - v & |v| \le 1 \\
            \mathrm{sign}(v) & |v| > 1 \end{cases}

    The input gradient is straight-through inside the clip range :math:`[-c, c]` and zero outside
    (:math:`c` = ``clip``, 1 by default: the hard-tanh estimator of BinaryConnect and XNOR-Net;
    ``clip=None`` clips at :math:`c = \alpha` instead, as LSQ clips at its outer levels, which
    leaves every weight above :math:`\alpha` without a gradient and trains markedly worse); the
    :math:`\alpha` gradient is LSQ's step gradient (Esser et al., 2020) with
    :math:`\mathrm{sign}` as the rounding, scaled by :math:`\gamma` = ``grad_scale`` and summed
    over the dimensions :math:`\alpha` was broadcast along (per-channel :math:`\alpha` of shape
    ``[C, 1, ...]``).

    Args:
        x: floating-point tensor.
        alpha: the scale :math:`\alpha > 0`, a number or a tensor broadcastable to ``x``
            (possibly requiring a gradient).
        grad_scale: the factor :math:`\gamma` of the :math:`\alpha` gradient.
        clip: the clip range :math:`c > 0` of the input gradient, or ``None`` for :math:`\alpha`.

    Returns:
        A tensor of :math:`\pm\alpha`.
    """
    _check(x, alpha, grad_scale, clip)
    return _ScaledCodes.apply(x, alpha, None, float(grad_scale), clip)


def ternary_quantize(x: torch.Tensor, alpha, delta, grad_scale: float = 1.0,
                     clip: Optional[float] = 1.0) -> torch.Tensor:
    r"""Ternary quantization to :math:`\{-\alpha, 0, +\alpha\}` with threshold :math:`\Delta`.

    .. math::

        y = \alpha\, t,\qquad t = \mathrm{sign}(x)\,[\,|x| > \Delta\,],\qquad v = x / \alpha

    .. math::

        \frac{\partial y}{\partial x} = [\,|x| \le c\,],\qquad
        \frac{\partial y}{\partial \alpha} = \gamma \cdot \begin{cases}
            t - v & |v| \le 1 \\
            \mathrm{sign}(v) & |v| > 1 \end{cases},\qquad
        \frac{\partial y}{\partial \Delta} = 0

    (Ternary Weight Networks, Li et al. 2016, take :math:`\Delta = 0.7\,\mathrm{mean}|x|`.)
    The clip range :math:`c` is as in :func:`binary_quantize`.

    Args:
        x: floating-point tensor.
        alpha: the scale :math:`\alpha > 0`, a number or a tensor broadcastable to ``x``.
        delta: the threshold :math:`\Delta \ge 0`, a number or a tensor broadcastable to ``x``
            (no gradient).
        grad_scale: the factor :math:`\gamma` of the :math:`\alpha` gradient.
        clip: the clip range :math:`c > 0` of the input gradient, or ``None`` for :math:`\alpha`.

    Returns:
        A tensor of values in :math:`\{-\alpha, 0, \alpha\}`.
    """
    _check(x, alpha, grad_scale, clip)
    if isinstance(delta, torch.Tensor):
        delta = delta.detach()
    elif isinstance(delta, bool) or not isinstance(delta, (int, float)) or not delta >= 0:
        raise ValueError(f"delta must be a number >= 0 or a tensor, got {delta!r}")
    return _ScaledCodes.apply(x, alpha, delta, float(grad_scale), clip)
