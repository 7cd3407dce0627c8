r"""Integer helpers of the export: the one rounding rule, the narrowest integer type for a range,
and bit packing of low-bit weights.

:func:`round_half_even_shift` is the only rounding the integer network uses. It is the integer
form of ``torch.round`` (round half to even) applied to :math:`d / 2^k`, which is what the
fake-quantized model computes when it rounds a charge to its membrane grid, so both models break
ties the same way.
"""

from __future__ import annotations

import torch

from ...functional.int_limits import weight_range

__all__ = ["round_half_even_shift", "pack_int", "unpack_int", "fits_packed", "PACKABLE_BITS"]

#: Bit widths whose weights are also stored packed, several values to a byte (1 bit: the signs
#: of binary weights, -1 or +1).
PACKABLE_BITS = (1, 2, 4)

#: The signed integer types a value range may be stored in, narrowest first.
_SIGNED_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)


def narrowest_int(lo: int, hi: int, narrowest: torch.dtype = torch.int8, unsigned: bool = False):
    """The narrowest integer dtype that holds every integer in ``[lo, hi]``, or ``None`` when not
    even ``int64`` does: the one rule by which the exporter, the simulator, the C code and the NIR
    import size their integers.

    Args:
        lo, hi: the range (Python ints).
        narrowest: the narrowest signed dtype considered (``torch.int16`` skips ``int8``).
        unsigned: consider ``torch.uint8`` first.
    """
    candidates = _SIGNED_DTYPES[_SIGNED_DTYPES.index(narrowest):]
    if unsigned:
        candidates = (torch.uint8,) + candidates
    for dtype in candidates:
        info = torch.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return None


def round_half_even_shift(d, k: int, out=None):
    r"""Divide an integer by :math:`2^k` and round to the nearest integer, ties to even.

    .. math::

        \mathrm{rhe}(d, k) = \begin{cases} f + 1 & r > 2^{k-1}\ \text{or}\ (r = 2^{k-1}
            \text{ and } f \text{ odd})\\ f & \text{otherwise}\end{cases},\qquad
        f = \lfloor d / 2^k \rfloor = d \gg k,\quad r = d - f\,2^k

    and :math:`\mathrm{rhe}(d, 0) = d`, computed as :math:`(d + 2^{k-1} - 1 + (f \bmod 2)) \gg k`.
    It equals ``torch.round(d / 2**k)`` for every integer :math:`d` (exactly, with no float
    arithmetic). A bare ``d >> k`` would be floor and
    ``(d + 2**(k-1)) >> k`` round-half-up; both differ from ``torch.round`` on ties.

    Args:
        d: an integer tensor (any signed integer dtype) or a Python int.
        k: the shift, a Python int :math:`\ge 0`.
        out: a tensor of ``d``'s shape and dtype (not ``d`` itself) that receives the result,
            computed in place step by step (no temporary tensor); ``None`` allocates.

    Returns:
        The rounded quotient, same type (and dtype) as ``d`` (``out`` when given).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    if isinstance(d, torch.Tensor) and (d.is_floating_point() or d.is_complex()
                                        or d.dtype == torch.bool):
        raise TypeError(f"d must be an integer tensor or int, got dtype {d.dtype}")
    if k == 0:
        return d if out is None else out.copy_(d)
    # (d + 2^(k-1) - 1 + f_0) >> k with f_0 the lowest bit of f: the remainder r plus
    # 2^(k-1) - 1 + f_0 reaches 2^k exactly when r > 2^(k-1), or r = 2^(k-1) and f is odd;
    # four integer operations (d + 2^(k-1) must fit the dtype)
    if out is None:
        return (d + (((d >> k) & 1) + ((1 << (k - 1)) - 1))) >> k
    torch.bitwise_right_shift(d, k, out=out).bitwise_and_(1)
    if k > 1:
        out.add_((1 << (k - 1)) - 1)
    return out.add_(d).bitwise_right_shift_(k)


def _check_pack_bits(bits) -> int:
    if bits not in PACKABLE_BITS:
        raise ValueError(f"bits must be one of {PACKABLE_BITS}, got {bits!r}")
    return bits


def fits_packed(values: torch.Tensor, bits: int) -> bool:
    """Whether :func:`pack_int` can pack ``values`` into ``bits`` bits (1: only -1 and +1)."""
    if bits not in PACKABLE_BITS:
        return False
    if values.numel() == 0:
        return True
    lo, hi = weight_range(bits, True)
    if int(values.min()) < lo or int(values.max()) > hi:
        return False
    return bits != 1 or not bool((values == 0).any())


def pack_int(values: torch.Tensor, bits: int) -> torch.Tensor:
    r"""Pack signed ``bits``-bit integers, :math:`8/b` to a byte, first value in the low bits.

    .. math::

        \mathrm{byte}_j = \sum_{i=0}^{8/b - 1} c(v_{j\,8/b + i})\, 2^{i b},\qquad
        c(v) = v \bmod 2^b\ (b = 2, 4),\qquad c(v) = [v > 0]\ (b = 1)

    (two's complement in :math:`b` bits; for :math:`b = 1` the bit is the sign of a binary weight
    :math:`\pm 1`, 1 for +1 and 0 for -1; the codes are padded with zeros to a whole number of
    bytes).

    Args:
        values: integer tensor with every value in :math:`[-2^{b-1}, 2^{b-1} - 1]`, or -1 and +1
            for :math:`b = 1`.
        bits: 1, 2 or 4.

    Returns:
        A 1-d ``torch.uint8`` tensor of :math:`\lceil n b / 8 \rceil` bytes.
    """
    bits = _check_pack_bits(bits)
    if not isinstance(values, torch.Tensor) or values.is_floating_point() or values.dtype == torch.bool:
        raise TypeError(f"values must be an integer tensor, got {getattr(values, 'dtype', type(values))}")
    flat = values.detach().reshape(-1).to(torch.int64)
    lo, hi = weight_range(bits, True)
    if flat.numel() and (int(flat.min()) < lo or int(flat.max()) > hi):
        raise ValueError(f"values must lie in [{lo}, {hi}] to pack into {bits} bits, got range "
                         f"[{int(flat.min())}, {int(flat.max())}]")
    if bits == 1 and bool((flat == 0).any()):
        raise ValueError("values must be -1 or +1 to pack into 1 bit (binary weights), got a 0")
    codes = (flat > 0).to(torch.int64) if bits == 1 else flat & ((1 << bits) - 1)
    per_byte = 8 // bits
    pad = (-codes.numel()) % per_byte
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    groups = codes.reshape(-1, per_byte)
    shifts = torch.arange(per_byte, dtype=torch.int64) * bits
    return (groups << shifts).sum(dim=1).to(torch.uint8)


def unpack_int(packed: torch.Tensor, bits: int, shape) -> torch.Tensor:
    r"""Inverse of :func:`pack_int`: signed ``bits``-bit values as an ``int8`` tensor of ``shape``.

    .. math::

        u = (\mathrm{byte} \gg i b) \bmod 2^b,\qquad v = u - 2^b\,[u \ge 2^{b-1}]\ (b = 2, 4),
        \qquad v = 2u - 1\ (b = 1)

    Args:
        packed: 1-d ``torch.uint8`` tensor from :func:`pack_int`.
        bits: 1, 2 or 4.
        shape: shape of the unpacked tensor.

    Returns:
        ``torch.int8`` tensor of ``shape``.
    """
    bits = _check_pack_bits(bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError("packed must be a 1-d torch.uint8 tensor")
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        n *= s
    per_byte = 8 // bits
    if packed.numel() != -(-n // per_byte):
        raise ValueError(f"packed has {packed.numel()} bytes, but shape {shape} at {bits} bits "
                         f"needs {-(-n // per_byte)}")
    shifts = torch.arange(per_byte, dtype=torch.int64) * bits
    u = (packed.to(torch.int64).unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    if bits == 1:
        v = 2 * u - 1
    else:
        v = u - ((u >= (1 << (bits - 1))).to(torch.int64) << bits)
    return v.reshape(-1)[:n].reshape(shape).to(torch.int8)
