"""What every family module of the torch front end shares: the error that names a layer, the
SpikingJelly modules, and the float numbers' binary parts."""

from __future__ import annotations

from fractions import Fraction
from typing import Tuple

import torch

from ..ir.network import ExportError
from .deploy_checks import tagged

__all__ = ["fail_layer", "sj_modules", "mantissa_exponent", "float_frac_bits", "as_dtype_float",
           "MANTISSA_BITS"]


MANTISSA_BITS = {torch.float32: 24, torch.float64: 53}


def fail_layer(name: str, module, reason: str, check: str = "other"):
    """Refuse layer ``name``: an ExportError naming it and its class, tagged with the kind of
    refusal ``check`` (one of :data:`~snnquant.export.frontend.deploy_checks.CHECKS`)."""
    raise tagged(ExportError(f"layer {name!r} ({type(module).__name__}): {reason}"), check)


# --------------------------------------------------------------------------------------------------
# structure

def sj_modules():
    from spikingjelly.activation_based import base, layer, neuron
    return base, layer, neuron


# --------------------------------------------------------------------------------------------------
# numbers

def mantissa_exponent(x: float) -> Tuple[int, int]:
    """``(m, e)`` with ``x = m * 2**e`` and ``m`` odd (``x`` finite and nonzero)."""
    num, den = Fraction(x).as_integer_ratio()
    e = -(den.bit_length() - 1)
    while num % 2 == 0:
        num //= 2
        e += 1
    return num, e


def float_frac_bits(x: float) -> int:
    """Fractional bits of the float ``x``: the smallest ``f >= 0`` with ``x * 2**f`` an integer."""
    return Fraction(x).denominator.bit_length() - 1


def as_dtype_float(value: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(float(value), dtype=dtype))
