"""How the C model stores a synaptic layer's weights: 1-, 2- and 4-bit weights packed eight, four
and two to a byte (:func:`packed_weight_bits`, read through :func:`c_unpack_helper` or in line by
:class:`Weights`), wider ones one to an element of the narrowest integer type."""

from __future__ import annotations

from typing import List, Optional

import torch

from ...ir.network import SynapseOp
from ...ir.integer_ops import PACKABLE_BITS, fits_packed

__all__ = ["packed_weight_bits", "c_unpack_helper", "Weights", "WORD_BYTES", "weights_per_word",
           "word_order"]

#: bytes of the word in which the event-driven loops read packed weights (``uint32_t``: one load
#: on 32-bit microcontrollers and on hosts)
WORD_BYTES = 4


def weights_per_word(bits: int) -> int:
    r"""Packed weights of ``bits`` bits in one word of :data:`WORD_BYTES` bytes.

    .. math::

        P = \frac{8 B}{b}

    (:math:`B` = :data:`WORD_BYTES`, :math:`b` = ``bits``).
    """
    return WORD_BYTES * 8 // bits


def word_order(values: torch.Tensor, bits: int) -> torch.Tensor:
    r"""``values`` (flattened, a whole number of words of :func:`weights_per_word`) reordered so
    that :func:`~snnquant.export.pack_int` puts weight ``m`` of each word in byte
    ``m % WORD_BYTES``, field ``m // WORD_BYTES``: shifting the word by ``f * bits`` and masking
    each byte then gives weights ``f * WORD_BYTES`` to ``f * WORD_BYTES + WORD_BYTES - 1`` in
    the order of the bytes (:meth:`Weights.loop`), whatever the machine's byte order.

    .. math::

        \mathrm{out}_{wP + p(m)} = \mathrm{values}_{wP + m},\qquad
        p(m) = (m \bmod B)\,\frac{8}{b} + \lfloor m / B \rfloor

    (:math:`P` weights per word, :math:`B` bytes per word, :math:`b` bits per weight, word
    :math:`w`).

    Args:
        values: integer tensor of a whole number of words of weights.
        bits: 1, 2 or 4.
    """
    per_word, per_byte = weights_per_word(bits), 8 // bits
    flat = values.reshape(-1, per_word)
    m = torch.arange(per_word)
    out = torch.empty_like(flat)
    out[:, (m % WORD_BYTES) * per_byte + m // WORD_BYTES] = flat
    return out.reshape(-1)


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
                 bits: Optional[int] = None, used: Optional[set] = None, words: bool = False):
        self.array, self.ctype, self.helper, self.bits = array, ctype, helper, bits
        self.used = used   # the widths whose helper the C text calls (written once, if called)
        self.words = words   # packed in word_order: read by loop() a word at a time, never at()

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
        ``statement(w)`` with ``w`` the weight at ``var`` + ``oc``.

        Packed weights stored a word at a time (``words``: the runs of ``count`` weights fill
        whole 32-bit words, in :func:`word_order`) are unpacked a word per load: each field of
        the word's four bytes at once, by a shift, a mask and (two's complement) an XOR, into a
        run of ``uint8_t`` codes, which a loop without a branch then adds, each less the
        code's offset (compilers vectorise it). Other packed runs that start on a byte are read a byte at
        a time, each weight by shifts and masks in line; runs that need not start on a byte (a
        linear layer's column of 10 two-bit weights) are gathered into a 64-bit word first."""
        per_byte = 8 // self.bits if self.bits else 0
        if self.helper is not None and self.words:
            return self._word_loop(var, count, statement)
        if self.helper is None:
            return [f"for (oc = 0; oc < {count}; oc++) {{",
                    "    " + statement(self.at("oc", var)), "}"]
        if count % per_byte:
            return self._stream_loop(var, count, statement)
        shift = {1: 3, 2: 2, 4: 1}[self.bits]
        lines = [f"for (ob = 0; ob < {count // per_byte}; ob++) {{",
                 f"    const int32_t byte = {self.array}[({var} >> {shift}) + ob];"]
        half, mask = 1 << (self.bits - 1), (1 << self.bits) - 1
        for i in range(per_byte):
            u = f"((byte >> {i * self.bits}) & {mask})" if i else f"(byte & {mask})"
            value = f"({u} * 2 - 1)" if self.bits == 1 else f"(({u} ^ {half}) - {half})"
            lines += [f"    oc = ob * {per_byte} + {i};", "    " + statement(value)]
        return lines + ["}"]

    def _stream_loop(self, var: str, count: int, statement) -> List[str]:
        """A run that need not start on a byte, of at most 57 bits: the bytes it touches (and
        no other) gathered into a 64-bit word, shifted to the run's first bit, each weight then
        taken out by a constant shift and mask into a run of ``int8_t`` that a branch-free loop
        adds. Longer such runs read each weight through the unpacking function."""
        bits, mask, half = self.bits, (1 << self.bits) - 1, 1 << (self.bits - 1)
        if count * bits > 57:
            return [f"for (oc = 0; oc < {count}; oc++) {{",
                    "    " + statement(self.at("oc", var)), "}"]
        lines = ["{", f"    int8_t wv[{count}];", f"    const int32_t bit0 = {var} * {bits};",
                 f"    const uint8_t *src = {self.array} + (bit0 >> 3);",
                 f"    const int32_t nb = ((bit0 & 7) + {count * bits + 7}) >> 3;",
                 "    uint64_t run = 0;", "    int32_t b;",
                 "    for (b = 0; b < nb; b++) {", "        run |= (uint64_t)src[b] << (8 * b);",
                 "    }", "    run >>= bit0 & 7;"]
        for m in range(count):
            u = f"(uint32_t)((run >> {m * bits}) & {mask}u)" if m else f"(uint32_t)(run & {mask}u)"
            value = f"(int32_t)({u} << 1) - 1" if bits == 1 else f"(int32_t)({u} ^ {half}u) - {half}"
            lines.append(f"    wv[{m}] = (int8_t)({value});")
        return lines + [f"    for (oc = 0; oc < {count}; oc++) {{",
                        "        " + statement("wv[oc]"), "    }", "}"]

    def _word_loop(self, var: str, count: int, statement) -> List[str]:
        bits = self.bits
        per_byte, per_word = 8 // bits, WORD_BYTES * 8 // bits
        shift = {1: 3, 2: 2, 4: 1}[bits]
        ones = int.from_bytes(b"\x01" * WORD_BYTES, "little")

        def hex_(v):
            return f"0x{v:0{2 * WORD_BYTES}x}u"
        mask, half = hex_(ones * ((1 << bits) - 1)), 1 << (bits - 1)
        lines = ["{", f"    uint8_t wv[{count}];", "    int32_t ob;",
                 f"    for (ob = 0; ob < {count // per_word}; ob++) {{",
                 "        uint32_t word, t;",
                 f"        memcpy(&word, {self.array} + ({var} >> {shift}) + ob * {WORD_BYTES}, "
                 f"sizeof(word));"]
        for i in range(per_byte):
            field = f"(word >> {i * bits})" if i else "word"
            # every byte: the code u (1 bit), or u ^ 2^(b-1) (two's complement in b bits)
            t = (f"{field} & {mask}" if bits == 1
                 else f"({field} & {mask}) ^ {hex_(ones * half)}")
            lines += [f"        t = {t};",
                      f"        memcpy(wv + ob * {per_word} + {i * WORD_BYTES}, &t, sizeof(t));"]
        # -1 (bit 0) or +1 (bit 1): 2u - 1; b bits: (u ^ 2^(b-1)) - 2^(b-1)
        value = "((int32_t)wv[oc] * 2 - 1)" if bits == 1 else f"((int32_t)wv[oc] - {half})"
        lines += ["    }", f"    for (oc = 0; oc < {count}; oc++) {{",
                  "        " + statement(value), "    }", "}"]
        return lines

    def loop_declarations(self, count: int) -> str:
        """What :meth:`loop` needs declared beside ``oc`` (``", ob"`` or nothing)."""
        return (", ob" if self.helper is not None and not self.words
                and count % (8 // self.bits) == 0 else "")
