r"""The integer limits of snnquant, written once: a bit width's range, the int64 head room, the
fraction limit and the one "an int in [lo, hi]" rule.

Quantizers, the integer network's validation, the chip operations and profiles, the NIR
importer and the argument checks read these instead of restating them.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

__all__ = ["INT64_HEADROOM_BITS", "FRAC_LIMIT", "MAX_BITS", "int_range", "weight_range", "as_int",
           "check_int", "IntTypeError", "check_bit_width", "BitWidthTypeError", "pow2_exponent"]

#: Every value of an integer network, and every register of a neuron's step, stays below
#: :math:`2^{62}` in magnitude: two bits of head room below ``int64`` (the simulator's and the C
#: runtime's registers), so a sum of two bounded values cannot overflow.
INT64_HEADROOM_BITS = 62

#: The widest bit width a quantizer takes (:func:`check_bit_width`'s default ``high``).
MAX_BITS = 32

#: The largest number of fractional bits :math:`|F|` a value's unit :math:`2^{-F}` may have:
#: :math:`2^{-F}` must be a normal ``float64``.
FRAC_LIMIT = 1022


def int_range(bits: int, signed: bool) -> Tuple[int, int]:
    r"""``(lo, hi)`` of a ``bits``-bit integer.

    .. math::

        \text{signed: } [-2^{b-1},\ 2^{b-1} - 1] \qquad \text{unsigned: } [0,\ 2^b - 1]

    Args:
        bits: the width :math:`b` (>= 1).
        signed: two's complement when true, else unsigned.
    """
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def as_int(value, *, numpy: bool = True, integral_float: bool = False) -> Optional[int]:
    """``value`` as a Python ``int`` when it is an integer, else ``None``.

    A ``bool`` is never an integer here.

    Args:
        value: anything.
        numpy: also take NumPy integer scalars (any :class:`numbers.Integral`); when false, only
            a Python ``int``.
        integral_float: also take a finite real number with no fractional part (``3.0``).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return int(value)
    if numpy and isinstance(value, numbers.Integral):
        return int(value)
    if integral_float and isinstance(value, numbers.Real) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    return None


class IntTypeError(TypeError, ValueError):
    """A value that must be an integer and is not (a float, a bool, a string): both a
    ``TypeError`` and a ``ValueError``, so code that catches either sees it."""


def check_int(value, lo: Optional[int], hi: Optional[int], what: str, *,
              integral_float: bool = False) -> int:
    """``value`` as an ``int`` if it is an integer (a Python or NumPy one, not a ``bool``) in
    ``[lo, hi]``; else an :class:`IntTypeError` (not an integer) or ``ValueError`` (out of range)
    that names ``what`` and the value.

    Args:
        value: the value to check.
        lo: the smallest value allowed, or ``None`` for no lower bound.
        hi: the largest value allowed, or ``None`` for no upper bound.
        what: the name the error gives the value (an argument's or a field's).
        integral_float: also take a finite real number with no fractional part (``3.0``).
    """
    v = as_int(value, integral_float=integral_float)
    if v is None:
        raise IntTypeError(f"{what} must be an int, got {value!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        if hi is None:
            raise ValueError(f"{what} must be >= {lo}, got {value!r}")
        if lo is None:
            raise ValueError(f"{what} must be <= {hi}, got {value!r}")
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {value}")
    return v


def weight_range(bits: int, has_negative: bool) -> Tuple[int, int]:
    r"""``(lo, hi)`` of the ``bits``-bit integers an integer weight tensor may hold.

    One bit holds :math:`\{-1, 0, +1\}` (binary and ternary weights); wider weights are signed
    when one of them is negative (:func:`int_range` ``(bits, True)``), else unsigned (an unsigned
    quantizer's levels).

    Args:
        bits: the weights' width (>= 1).
        has_negative: whether a weight is below 0.
    """
    if bits == 1:
        return -1, 1
    return int_range(bits, has_negative)


class BitWidthTypeError(IntTypeError):
    """A bit width of the wrong type (a float, a bool, a string): an :class:`IntTypeError`, both a
    ``TypeError`` and a ``ValueError``, so code that catches either sees it."""


def check_bit_width(value, name: str = "bits", low: int = 1, high: int = MAX_BITS,
                    fn: Optional[str] = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer in ``[low, high]``, else raise
    ``ValueError`` naming ``name`` (and the function ``fn``, when given) and the value.

    The one bit-width check of snnquant: the functional quantizers, the quantizer modules
    (:func:`snnquant.nn.quantizers.check_bits` is this function) and
    :class:`~snnquant.QuantConfig` use it. A value that is not an integer at all (``4.0``,
    ``True``, ``"8"``) raises :class:`BitWidthTypeError`, which is also a ``TypeError``.
    """
    prefix = f"{fn}: " if fn else ""
    if as_int(value) is None:
        raise BitWidthTypeError(f"{prefix}{name} must be an int in [{low}, {high}], got {value!r} "
                                f"({type(value).__name__})")
    if not low <= int(value) <= high:
        raise ValueError(f"{prefix}{name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def pow2_exponent(x: float) -> Optional[int]:
    """``e`` when the float ``x`` is exactly :math:`2^e`, else ``None`` (also for non-finite or
    non-positive ``x``, and for anything that is not a Python float).

    The one power-of-two test of snnquant (quantizer grids, ``quantize_model``'s notes, the
    integer export).
    """
    if not (isinstance(x, float) and math.isfinite(x) and x > 0):
        return None
    mantissa, exponent = math.frexp(x)
    return exponent - 1 if mantissa == 0.5 else None
