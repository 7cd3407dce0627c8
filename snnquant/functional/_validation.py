"""Argument checks shared by the public functions of :mod:`snnquant.functional`.

Each check runs once at the public boundary and raises an error that names the argument and the
value. The checks look at Python scalars and tensor dtypes only, except where a tensor argument is
a small parameter (a step size or a scale) whose values must be checked to avoid a silent wrong
answer.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOAT_DTYPE_NAMES = "float16, bfloat16, float32 or float64"
MAX_BITS = 32

# Significand precision (bits, including the implicit one) of each accepted dtype.
PRECISION_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def check_float_tensor(fn: str, x, name: str = "x") -> None:
    """Raise ``TypeError`` unless ``x`` is a tensor of one of :data:`FLOAT_DTYPES`."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{fn}: {name} must be a floating-point tensor ({_FLOAT_DTYPE_NAMES}), "
            f"got dtype {x.dtype}"
        )


def is_real_number(value) -> bool:
    """True for Python/NumPy real scalars that are not bools."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_bit_width(value, name: str = "bits", low: int = 1, high: int = MAX_BITS,
                    fn: Optional[str] = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer in ``[low, high]``, else raise
    ``ValueError`` naming ``name`` (and the function ``fn``, when given) and the value.

    The one bit-width check of snnquant: the functional quantizers, the quantizer modules
    (:func:`snnquant.nn.quantizers.check_bits`) and :class:`~snnquant.QuantConfig` use it.
    """
    prefix = f"{fn}: " if fn else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            not low <= int(value) <= high:
        raise ValueError(f"{prefix}{name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def check_bits(fn: str, name: str, value) -> int:
    """:func:`check_bit_width` of ``value`` in ``[1, 32]`` for the function ``fn``."""
    return check_bit_width(value, name, 1, MAX_BITS, fn)


def check_int(fn: str, name: str, value, low=None, high=None) -> int:
    """Return ``value`` as an ``int`` if it is integral (an int or an integral float) and in range."""
    if is_real_number(value) and math.isfinite(value) and float(value).is_integer():
        result = int(value)
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        result = int(value)
    else:
        raise ValueError(f"{fn}: {name} must be an integer, got {value!r}")
    if (low is not None and result < low) or (high is not None and result > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{fn}: {name} must be an integer in [{lo}, {hi}], got {value!r}")
    return result


def check_flag(fn: str, name: str, value) -> bool:
    """Return ``value`` as a ``bool`` if it is a bool or the int 0/1, else raise ``TypeError``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    raise TypeError(f"{fn}: {name} must be a bool, got {value!r}")


def check_finite_real(fn: str, name: str, value) -> float:
    """Return ``value`` as a ``float`` if it is a finite real number, else raise ``ValueError``."""
    if not is_real_number(value) or not math.isfinite(value):
        raise ValueError(f"{fn}: {name} must be a finite real number, got {value!r}")
    return float(value)


def check_positive(fn: str, name: str, value):
    """Check that a scalar or tensor argument is finite and > 0 everywhere.

    Python numbers are checked for free. A tensor (a learned step size or scale, usually a handful
    of values) must be floating point and is scanned once; on CUDA this synchronises.
    Returns the value unchanged (Python numbers as ``float``).
    """
    if isinstance(value, torch.Tensor):
        if value.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{fn}: {name} must be a Python number or a floating-point tensor "
                f"({_FLOAT_DTYPE_NAMES}), got dtype {value.dtype}"
            )
        with torch.no_grad():
            ok = bool(torch.all((value > 0) & torch.isfinite(value)))
        if not ok:
            bad = value.detach().flatten()
            bad = bad[~((bad > 0) & torch.isfinite(bad))][:4].tolist()
            raise ValueError(f"{fn}: {name} must be finite and > 0, got a tensor containing {bad}")
        return value
    if not is_real_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{fn}: {name} must be finite and > 0, got {value!r}")
    return float(value)


def check_bounds(fn: str, min_name: str, min_value, max_name: str, max_value) -> None:
    """Raise ``ValueError`` if ``min_value > max_value`` or either is NaN (scalars or tensors)."""
    for name, value in ((min_name, min_value), (max_name, max_value)):
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            if bool(torch.isnan(value).any()) if value.is_floating_point() else False:
                raise ValueError(f"{fn}: {name} must not be NaN, got {value}")
        elif not is_real_number(value):
            raise TypeError(f"{fn}: {name} must be a real number or a tensor, got {value!r}")
        elif math.isnan(value):
            raise ValueError(f"{fn}: {name} must not be NaN, got {value!r}")
    if min_value is None or max_value is None:
        return
    if isinstance(min_value, torch.Tensor) or isinstance(max_value, torch.Tensor):
        if bool(torch.any(torch.as_tensor(min_value) > torch.as_tensor(max_value))):
            raise ValueError(
                f"{fn}: {min_name} must be <= {max_name} everywhere, "
                f"got {min_name}={min_value} and {max_name}={max_value}"
            )
    elif min_value > max_value:
        raise ValueError(
            f"{fn}: {min_name} must be <= {max_name}, "
            f"got {min_name}={min_value!r} and {max_name}={max_value!r}"
        )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute in for values stored in ``dtype``: float32 for the 16-bit floating
    types (float16, bfloat16), the dtype itself otherwise. The one such rule of snnquant (the
    functional quantizers and the fused kernels use it)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
