"""Argument checks shared by the public functions of :mod:`snnquant.functional`.

Each check runs once at the public boundary and raises an error that names the argument and the
value. The checks look at Python scalars and tensor dtypes only, except where a tensor argument is
a small parameter (a step size or a scale) whose values must be checked to avoid a silent wrong
answer.
"""

from __future__ import annotations

import math
import numbers

import torch

from . import int_limits


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOAT_DTYPE_NAMES = "float16, bfloat16, float32 or float64"

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


def check_int(fn: str, name: str, value, low=None, high=None) -> int:
    """Return ``value`` as an ``int`` if it is integral (an int or an integral float) and in range:
    :func:`~snnquant.functional.int_limits.check_int` naming ``fn`` and ``name``."""
    return int_limits.check_int(value, low, high, f"{fn}: {name}", integral_float=True)


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


# --- Inputs that SpikingJelly also accepts, and step sizes that fit the input's dtype ------------


def as_tensor_input(x):
    """Return a Python real number as a 0-dim tensor of the default dtype; anything else unchanged.

    SpikingJelly's neurons start with the membrane ``v`` as a Python float (``0.0``) and only make
    it a tensor after the first update, so a quantizer called on ``self.v`` in the first step gets
    a float.
    """
    if is_real_number(x):
        return torch.tensor(float(x), dtype=torch.get_default_dtype())
    return x


def check_real_tensor(fn: str, x, name: str = "x") -> None:
    """Raise ``TypeError`` unless ``x`` is a floating-point or integer tensor (not bool, not complex)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype == torch.bool or x.is_complex() or not (x.is_floating_point() or _is_integer(x)):
        raise TypeError(
            f"{fn}: {name} must be a real tensor (floating point: {_FLOAT_DTYPE_NAMES}; or an "
            f"integer dtype), got dtype {x.dtype}"
        )


def _is_integer(x: torch.Tensor) -> bool:
    return x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                       torch.uint16, torch.uint32, torch.uint64)


def float_from_integer(fn: str, x, *others) -> torch.Tensor:
    """Check ``x`` (float or integer tensor) and return it in the dtype SpikingJelly's arithmetic
    gives it: integer tensors become ``torch.result_type(x, *others)`` if that is floating point,
    else the default dtype. Floating-point tensors are returned unchanged (and checked)."""
    check_real_tensor(fn, x)
    if x.is_floating_point():
        check_float_tensor(fn, x)
        return x
    dtype = torch.result_type(x, others[0]) if others else x.dtype
    for other in others[1:]:
        dtype = torch.promote_types(dtype, torch.result_type(x, other))
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return x.to(dtype)


def bits_argument(value):
    """A one-element integer tensor given as a bit width (SpikingJelly accepts ``torch.tensor(2)``)
    becomes a Python int; anything else is returned unchanged for :func:`check_bit_width`."""
    if (isinstance(value, torch.Tensor) and value.numel() == 1 and _is_integer(value)):
        return int(value.item())
    return value


def check_step_shape(fn: str, name: str, step, x: torch.Tensor) -> None:
    """Raise ``ValueError`` unless a tensor ``step`` broadcasts against ``x`` and, for a non-empty
    ``x``, holds at least one value (an empty step would turn ``x`` into an empty result). Looks at
    shapes only."""
    if not isinstance(step, torch.Tensor):
        return
    try:
        shape = torch.broadcast_shapes(x.shape, step.shape)
    except RuntimeError:
        raise ValueError(
            f"{fn}: {name} of shape {tuple(step.shape)} does not broadcast against x of shape "
            f"{tuple(x.shape)}"
        ) from None
    if step.numel() == 0 and x.numel() != 0:
        raise ValueError(
            f"{fn}: {name} is an empty tensor (shape {tuple(step.shape)}); it needs one value, or "
            f"one per channel (x has shape {tuple(x.shape)}, the result would have {tuple(shape)})"
        )


def check_step_fits_dtype(fn: str, name: str, step, dtype: torch.dtype, largest_level=None) -> None:
    """Raise ``ValueError`` unless every ``step`` is a normal number of ``dtype`` (not rounded to
    0, a subnormal or infinity when the computation casts it) and, when given,
    ``step * largest_level`` does not overflow ``dtype``. ``step`` has passed
    :func:`check_positive`."""
    info = torch.finfo(dtype)
    if isinstance(step, torch.Tensor):
        if step.numel() == 0:
            return
        with torch.no_grad():
            low, high = float(step.detach().min()), float(step.detach().max())
    else:
        low = high = float(step)
    if low < info.tiny or high > info.max:
        bad = low if low < info.tiny else high
        raise ValueError(
            f"{fn}: {name}={bad!r} is not representable in {dtype}, the dtype the computation "
            f"runs in: it must lie in [{info.tiny!r}, {info.max!r}] (x / {name} would overflow, "
            f"underflow or give NaN)"
        )
    if largest_level is not None and high * largest_level > info.max:
        raise ValueError(
            f"{fn}: {name}={high!r} times the largest level {largest_level} overflows {dtype} "
            f"(max {info.max!r})"
        )


def check_quotient_finite(fn: str, name: str, x: torch.Tensor, quotient: torch.Tensor, step,
                          dtype: torch.dtype) -> None:
    """Raise ``ValueError`` if ``quotient = x / step`` overflowed ``dtype`` for a finite element of
    ``x``.

    Called on the quotient the operation computes anyway, so the common case costs one read-only
    reduction and no extra tensor: a finite sum proves every element finite (an infinity or NaN
    makes the sum infinite or NaN; float16/bfloat16 sum in float32). Only a non-finite sum (an infinity or NaN in ``x``, or a real
    overflow) looks at the elements.
    """
    if quotient.numel() == 0:
        return
    with torch.no_grad():
        if math.isfinite(float(quotient.sum(dtype=compute_dtype(quotient.dtype)))):
            return
        overflow = torch.isinf(quotient) & torch.isfinite(x)
        if not bool(overflow.any()):
            return
        largest = float(torch.where(torch.isfinite(x), x.abs(), 0).amax())
    low = float(step.detach().min()) if isinstance(step, torch.Tensor) else float(step)
    limit = torch.finfo(dtype).max * low
    raise ValueError(
        f"{fn}: x / {name} overflows {dtype} for {name}={low!r} (|x| up to {largest!r}; "
        f"this {name} allows |x| up to about {limit!r}); use a larger {name} or a wider dtype"
    )
