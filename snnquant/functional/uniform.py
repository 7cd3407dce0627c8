r"""Uniform k-bit quantizers: DoReFa's ``k_bit_quantize`` (and its affine form) and QKeras's
``quantized_bits``."""

from __future__ import annotations

import numbers

import torch

from .int_limits import check_bit_width
from ._validation import (
    as_tensor_input,
    bits_argument,
    check_flag,
    check_float_tensor,
    check_int,
    check_positive,
    compute_dtype,
    float_from_integer,
)
from .stochastic import stochastic_round_integers

__all__ = [
    "k_bit_quantize",
    "affine_k_bit_quantize",
    "quantized_bits",
    "KBitQuantizeSTE",
    "k_bit_quantize_forward",
]

_FLOAT16_MAX = 65504.0


class KBitQuantizeSTE(torch.autograd.Function):
    r"""DoReFa's k-bit quantizer of ``[0, 1]`` with a straight-through gradient.

    .. math::

        y = \frac{\operatorname{round}\big((2^k - 1)\,x\big)}{2^k - 1}, \qquad
        \frac{\partial y}{\partial x} = 1

    Used as ``KBitQuantizeSTE.apply(x, k)`` (no argument checks). Also exported as
    ``KBitQuantizeATGF`` (SpikingJelly's name).
    """

    @staticmethod
    def forward(ctx, x, k):
        return k_bit_quantize_forward(x, k)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


def k_bit_quantize_forward(x: torch.Tensor, k: int) -> torch.Tensor:
    r"""The forward value of :func:`k_bit_quantize`, without autograd rules or argument checks.

    Drop-in for ``spikingjelly.activation_based.quantize.k_bit_quantize_forward``.

    .. math::

        y = \frac{\operatorname{round}\big((2^k - 1)\,x\big)}{2^k - 1}

    float16 input with :math:`k \ge 16` is computed in float32 and cast back (SpikingJelly's
    float16 arithmetic overflows there).

    Args:
        x: Input tensor.
        k: Number of bits, an int (or a one-element integer tensor).

    Returns:
        A new tensor.
    """
    levels = float(1 << k) - 1.0
    if x.dtype == torch.float16 and levels > _FLOAT16_MAX:
        # (2**k - 1) * x would overflow float16 (k >= 16): compute in float32.
        return (torch.round(x.float() * levels) / levels).to(x.dtype)
    return torch.round(x * levels) / levels


def k_bit_quantize(x: torch.Tensor, k: int) -> torch.Tensor:
    r"""DoReFa-Net's k-bit quantizer: round ``x`` in ``[0, 1]`` to a multiple of :math:`1/(2^k-1)`.

    Drop-in for ``spikingjelly.activation_based.quantize.k_bit_quantize``.

    .. math::

        y = \frac{\operatorname{round}\big((2^k - 1)\,x\big)}{2^k - 1}, \qquad
        \frac{\partial y}{\partial x} = 1

    Inputs outside ``[0, 1]`` are not clamped (as in SpikingJelly): they go to the nearest multiple
    of :math:`1/(2^k-1)` outside the range. Use :func:`clamp`, :func:`clamp_by_linear` or a sigmoid
    first. Ties go to the even multiple. NaN stays NaN. float16 input with :math:`k \ge 16` is
    computed in float32 (SpikingJelly's float16 arithmetic overflows there).

    Args:
        x: Input tensor, floating point or integer (an integer tensor gives a result of the
            default dtype, as in SpikingJelly). A Python number becomes a 0-dim tensor of the
            default dtype.
        k: Number of bits, an int in ``[1, 32]`` or a one-element integer tensor
            (``torch.tensor(2)``), as SpikingJelly accepts.

    Returns:
        A new tensor of the same shape and dtype (default dtype for integer ``x``).

    Raises:
        TypeError: ``x`` is a bool or complex tensor.
        ValueError: ``k`` is not an int in ``[1, 32]``.
    """
    x = float_from_integer("k_bit_quantize", as_tensor_input(x))
    k = check_bit_width(bits_argument(k), "k", fn="k_bit_quantize")
    return KBitQuantizeSTE.apply(x, k)


def affine_k_bit_quantize(x: torch.Tensor, k: int, w, b) -> torch.Tensor:
    r"""Affine map of the k-bit quantizer: ``w * k_bit_quantize(x, k) + b``.

    Drop-in for ``spikingjelly.activation_based.quantize.affine_k_bit_quantize``.

    .. math::

        y = w\,\frac{\operatorname{round}\big((2^k - 1)\,x\big)}{2^k - 1} + b, \qquad
        \frac{\partial y}{\partial x} = w, \quad
        \frac{\partial y}{\partial w} = \frac{\operatorname{round}\big((2^k - 1)\,x\big)}{2^k - 1},
        \quad \frac{\partial y}{\partial b} = 1

    The gradients for ``w`` and ``b`` are true gradients (autograd, summed over broadcast
    dimensions); the one for ``x`` is straight through the rounding.

    Args:
        x: Input tensor meant to lie in ``[0, 1]``, floating point or integer (an integer tensor
            is quantized in the default dtype, as in SpikingJelly).
        k: Number of bits, an int in ``[1, 32]`` or a one-element integer tensor.
        w: Scale, a tensor or a number broadcastable to ``x``.
        b: Offset, a tensor or a number broadcastable to ``x``.

    Returns:
        A new tensor.

    Raises:
        TypeError: ``x`` is a bool or complex tensor.
        ValueError: ``k`` is not an int in ``[1, 32]``.
    """
    x = float_from_integer("affine_k_bit_quantize", as_tensor_input(x))
    k = check_bit_width(bits_argument(k), "k", fn="affine_k_bit_quantize")
    return w * KBitQuantizeSTE.apply(x, k) + b


class _QuantizedBitsSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bits, integer, symmetric, keep_negative, alpha, stochastic, generator,
                masked_grad):
        work = x.to(compute_dtype(x.dtype))
        unsigned_bits = bits - int(keep_negative)
        if unsigned_bits > 0:
            m = 2.0**unsigned_bits
            m_i = 2.0**integer
            low = -m + int(symmetric) if keep_negative else 0.0
            high = m - 1.0
            p = work * m / m_i
            q = stochastic_round_integers(p, generator) if stochastic else torch.round(p)
            out = m_i * torch.clamp(q, low, high) / m
        else:
            # One signed bit: sign(x) with 0 mapped to +1 (QKeras's binary path).
            # torch.sign(NaN) is 0, so NaN is put back explicitly.
            out = torch.where(work < 0, -1.0, 1.0).to(work.dtype)
            out = torch.where(torch.isnan(work), work, out)
            p, low, high = work, -1.0, 1.0
        if alpha is not None:
            out = alpha * out
        if masked_grad and ctx.needs_input_grad[0]:
            ctx.save_for_backward((p >= low) & (p <= high))
        ctx.masked_grad = masked_grad
        ctx.x_dtype = x.dtype
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        if not ctx.needs_input_grad[0]:  # only alpha required a gradient, and gets none
            return (None,) * 9
        grad = grad_output
        if ctx.masked_grad:
            (inside,) = ctx.saved_tensors
            grad = grad * inside.to(grad.dtype)
        return grad.to(ctx.x_dtype), None, None, None, None, None, None, None, None


def quantized_bits(
    x: torch.Tensor,
    bits=8,
    integer=0,
    symmetric=False,
    keep_negative=True,
    alpha=None,
    stochastic=False,
    generator=None,
    masked_grad=False,
) -> torch.Tensor:
    r"""QKeras's ``quantized_bits``: signed or unsigned fixed point with ``bits`` bits.

    With :math:`m = 2^{\text{bits} - \text{keep\_negative}}`, :math:`m_i = 2^{\text{integer}}`,
    :math:`q_{lo} = \text{keep\_negative} \cdot (-m + \text{symmetric})` and :math:`q_{hi} = m - 1`:

    .. math::

        p = \frac{x\,m}{m_i}, \qquad
        y = \alpha\, m_i\, \frac{\min(\max(\operatorname{round}(p), q_{lo}), q_{hi})}{m}

    (``alpha=None`` means :math:`\alpha = 1`; as in QKeras, ``x`` is not divided by :math:`\alpha`
    first). For ``bits=1, keep_negative=True`` (no magnitude bits) the output is the sign with 0
    mapped to +1, and ``integer`` has no effect:

    .. math::

        y = \alpha \cdot \begin{cases} +1 & x \ge 0 \\ -1 & x < 0 \end{cases}

    Gradient, as QKeras with its default straight-through estimator (``use_ste=True``,
    ``qnoise_factor=1``):

    .. math::

        \frac{\partial y}{\partial x} = 1
        \quad\text{or, with } \texttt{masked\_grad=True},\quad
        \frac{\partial y}{\partial x} = \begin{cases} 1 & q_{lo} \le p \le q_{hi} \\ 0 &
        \text{otherwise} \end{cases}

    For the 1-bit sign case the mask is :math:`-1 \le x \le 1` (the BinaryNet estimator): there
    :math:`m = 1` and the formula's :math:`[q_{lo}, q_{hi}]` would not describe the sign function.
    ``alpha`` gets no gradient (QKeras stops it too). With ``stochastic=True`` the rounding of
    :math:`p` is :func:`stochastic_round` to integers (QKeras ``use_stochastic_rounding`` with
    ``precision=1``).

    float16 and bfloat16 inputs are computed in float32 and cast back. NaN stays NaN (the sign case
    too); :math:`\pm\infty` clamps to the extreme levels.

    Args:
        x: Floating-point input tensor.
        bits: Total number of bits, an int in ``[1, 32]``.
        integer: Bits left of the binary point (excluding the sign), an int in ``[-126, 127]``.
        symmetric: Drop the most negative level so the range is symmetric.
        keep_negative: Signed (one of ``bits`` is the sign) or unsigned (negative inputs clamp
            to 0).
        alpha: ``None``, a positive number, or a positive floating-point tensor broadcastable to
            ``x`` (for example per channel). QKeras's ``"auto"``/``"auto_po2"`` are not supported.
        stochastic: Round :math:`p` at random (unbiased) instead of to the nearest integer.
        generator: Optional :class:`torch.Generator` for ``stochastic``.
        masked_grad: Zero the gradient where :math:`p` lies outside :math:`[q_{lo}, q_{hi}]`.

    Returns:
        A new tensor with the dtype of ``x``.

    Raises:
        TypeError: ``x`` is not a floating-point tensor, or a flag is not a bool.
        ValueError: ``bits``, ``integer`` or ``alpha`` out of range.
    """
    fn = "quantized_bits"
    x = as_tensor_input(x)
    check_float_tensor(fn, x)
    bits = check_bit_width(bits, "bits", fn=fn)
    if isinstance(integer, bool) or not isinstance(integer, numbers.Integral):
        raise ValueError(f"{fn}: integer must be an int in [-126, 127], got {integer!r}")
    integer = check_int(fn, "integer", integer, low=-126, high=127)
    symmetric = check_flag(fn, "symmetric", symmetric)
    keep_negative = check_flag(fn, "keep_negative", keep_negative)
    stochastic = check_flag(fn, "stochastic", stochastic)
    masked_grad = check_flag(fn, "masked_grad", masked_grad)
    if isinstance(alpha, str):
        raise ValueError(
            f"{fn}: alpha={alpha!r} is not supported; pass None, a positive number or a tensor "
            "(compute the scale yourself)"
        )
    if alpha is not None:
        alpha = check_positive(fn, "alpha", alpha)
    return _QuantizedBitsSTE.apply(
        x, bits, integer, symmetric, keep_negative, alpha, stochastic, generator, masked_grad
    )
