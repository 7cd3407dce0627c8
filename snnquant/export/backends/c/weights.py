"""How the C model stores a synaptic layer's weights: 1-, 2- and 4-bit weights packed eight, four
and two to a byte (:func:`packed_weight_bits`, read through :func:`c_unpack_helper` or in line by
:class:`Weights`), wider ones one to an element of the narrowest integer type."""

from __future__ import annotations

from typing import List, Optional

from ...ir.network import SynapseOp
from ...ir.integer_ops import PACKABLE_BITS, fits_packed

__all__ = ["packed_weight_bits", "c_unpack_helper", "Weights"]


def packed_weight_bits(op: SynapseOp) -> Optional[int]:
    """The bits per weight of layer ``op`` in the C model's ROM: the narrowest of
    ``PACKABLE_BITS`` of the IR (1, 2, 4) that is at least
    ``op.weight_bits`` and holds every weight as :func:`~snnquant.export.pack_int` packs it
    (signed two's complement; 1 bit: -1 and +1 only; so 3-bit weights take 4), or ``None``:
    a weight per byte or wider (8-bit weights, unsigned codes, a 0 among 1-bit weights)."""
    for bits in PACKABLE_BITS:
        if bits >= op.weight_bits and fits_packed(op.weight, bits):
            return bits
    return None


def c_unpack_helper(prefix: str, bits: int) -> str:
    """The C99 function ``<prefix>_unpack<bits>(w, k)``: weight ``k`` (C order of the array the
    layer reads) of a ROM array packed by :func:`~snnquant.export.pack_int`, first weight in
    the low bits of a byte; the inverse of ``pack_int`` as
    :func:`~snnquant.export.unpack_int` computes it."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    shift = {1: 3, 2: 2, 4: 1}[bits]
    where = f"k & {per_byte - 1}" if bits == 1 else f"(k & {per_byte - 1}) * {bits}"
    value = ("2 * u - 1" if bits == 1 else f"u - ((u & {1 << (bits - 1)}) << 1)")
    about = ("-1 (bit 0) or +1 (bit 1)" if bits == 1
             else f"two's complement in {bits} bits")
    return f"""/* weight k of an array packed {per_byte} to a byte, first in the low bits: {about} */
static int32_t {prefix}_unpack{bits}(const uint8_t *w, int32_t k)
{{
    const int32_t u = (w[k >> {shift}] >> ({where})) & {mask};
    return {value};
}}
"""


class Weights:
    """How the C text of a synaptic layer reads its weights: from a ``static const`` array of
    the narrowest integer type (a weight per element: ``w[k]``, through pointers into it), or,
    packed (:func:`packed_weight_bits`), through ``<name>_unpack<bits>(array, k)`` with ``int32_t``
    indices where the other form has pointers."""

    def __init__(self, array: str, ctype: str, helper: Optional[str] = None,
                 bits: Optional[int] = None, used: Optional[set] = None):
        self.array, self.ctype, self.helper, self.bits = array, ctype, helper, bits
        self.used = used   # the widths whose helper the C text calls (written once, if called)

    def ref(self, var: str, offset: Optional[str] = None, base: Optional[str] = None) -> str:
        """Declare ``var``: where the weights at ``base`` (the array by default) plus
        ``offset`` start (no value without ``offset``)."""
        if self.helper is None:
            start = "" if offset is None else f" = {base or self.array} + {offset}"
            return f"const {self.ctype} *{var}{start};"
        if offset is None:
            return f"int32_t {var};"
        return f"const int32_t {var} = {offset if base is None else f'{base} + {offset}'};"

    def set(self, var: str, offset: str) -> str:
        """Point ``var`` (declared by :meth:`ref` without an offset) at the array plus
        ``offset``."""
        return f"{var} = {offset};" if self.helper else f"{var} = {self.array} + {offset};"

    def at(self, index: str, var: Optional[str] = None) -> str:
        """The C expression of the weight at ``index`` from ``var`` (the array by default)."""
        if self.helper is None:
            return f"{var or self.array}[{index}]"
        self.used.add(self.bits)
        return f"{self.helper}({self.array}, {index if var is None else f'{var} + {index}'})"

    def loop(self, var: str, count: int, statement) -> List[str]:
        """C lines: for ``oc`` from 0 to ``count - 1`` (``oc`` declared by the caller),
        ``statement(w)`` with ``w`` the weight at ``var`` + ``oc``. Packed weights whose run
        starts on a byte (``count`` a multiple of the weights per byte, as every run of these
        layers then starts) are read a byte at a time, each weight by shifts and masks in line,
        so that the loop has no call and no per-weight byte index."""
        per_byte = 8 // self.bits if self.bits else 0
        if self.helper is None or count % per_byte:
            return [f"for (oc = 0; oc < {count}; oc++) {{",
                    "    " + statement(self.at("oc", var)), "}"]
        shift = {1: 3, 2: 2, 4: 1}[self.bits]
        lines = [f"for (ob = 0; ob < {count // per_byte}; ob++) {{",
                 f"    const int32_t byte = {self.array}[({var} >> {shift}) + ob];"]
        half, mask = 1 << (self.bits - 1), (1 << self.bits) - 1
        for i in range(per_byte):
            u = f"((byte >> {i * self.bits}) & {mask})" if i else f"(byte & {mask})"
            value = f"({u} * 2 - 1)" if self.bits == 1 else f"(({u} ^ {half}) - {half})"
            lines += [f"    oc = ob * {per_byte} + {i};", "    " + statement(value)]
        return lines + ["}"]

    def loop_declarations(self, count: int) -> str:
        """What :meth:`loop` needs declared beside ``oc`` (``", ob"`` or nothing)."""
        return ", ob" if self.helper is not None and count % (8 // self.bits) == 0 else ""
