"""What every part of the C generator shares: C integer types, literals, quoted names."""

from __future__ import annotations

from typing import Tuple

import torch

from ...ir.network import ExportError, FlattenOp
from ...ir.transformer_ops import GatherOp, ScaleOp
from ...ir.integer_ops import narrowest_int
from ...ir.program import c_literal

__all__ = ["c_int_type", "quote", "aliases", "numel", "CONST_BLOCK", "C_TYPES", "TYPES_BYTES", "lit"]


#: Elements of a weight tensor formatted at a time (a 16 x 4096 block of the C text).
CONST_BLOCK = 1 << 16

C_TYPES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t",
           torch.int32: "int32_t", torch.int64: "int64_t"}
TYPES_BYTES = {name: dtype.itemsize for dtype, name in C_TYPES.items()}


def c_int_type(lo: int, hi: int, signed: bool = False) -> Tuple[str, int]:
    """Narrowest C integer type (name, bytes) that holds every integer in ``[lo, hi]``
    (``uint8_t`` too unless ``signed``)."""
    dtype = narrowest_int(lo, hi, unsigned=not signed)
    if dtype is None:
        raise ExportError(f"no C integer type holds [{lo}, {hi}]")
    return C_TYPES[dtype], dtype.itemsize


lit = c_literal


def quote(text) -> str:
    """A layer name quoted for a C comment: ASCII only (``ascii()`` escapes the rest), and neither
    ``/*`` nor ``*/`` nor a trigraph survives (every ``?`` is escaped), so no name can end the
    comment or make the compiler warn."""
    return (ascii(str(text)).replace("*/", "*\\/").replace("/*", "/\\*")
            .replace("?", "\\?"))


def aliases(op) -> bool:
    """Operations that move no data in C: their output is their input's buffer (in C order)."""
    return isinstance(op, FlattenOp) or (isinstance(op, GatherOp) and op.index is None) or (
        isinstance(op, ScaleOp) and op.exponent <= 0)


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
