r"""The operations of spiking transformers in the integer network: layout maps
(:class:`GatherOp`), sums over dimensions (:class:`ReduceOp`), matrix products of two computed
tensors (:class:`MatMulOp`) and multiplications by a power of two (:class:`ScaleOp`). Each is a
value-to-value map with no state; :class:`~snnquant.export.IntegerNetwork` holds them beside
the synapse, neuron, pool, flatten and join operations of
:mod:`snnquant.export.ir.network`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

__all__ = ["GatherOp", "ReduceOp", "MatMulOp", "ScaleOp"]


class Stateless:
    """What these operations share: no membrane, so no leak to describe."""

    def leak_text(self) -> str:  # pragma: no cover
        """The empty text (a neuron operation's says its leak)."""
        return ""


@dataclass
class GatherOp(Stateless):
    r"""A layout operation as an index map: reshape, transpose, permute, a slice (``chunk``,
    ``x[..., a:b]``), a broadcast, and any chain of them, composed into one map at export.

    Per sample, with :math:`x` and :math:`y` read in row-major order:

    .. math::

        y_j = x_{\mathrm{index}_j},\qquad j = 0, \ldots, \textstyle\prod \mathrm{shape} - 1

    ``index`` ``None`` is the identity order (a reshape: no data moves). No arithmetic: the
    values, their bound and their fractional bits are the input's.

    Attributes:
        name: the operation (the last of the chain) it comes from.
        shape: one sample's output shape.
        index: ``int64`` tensor of ``prod(shape)`` input positions, or ``None``.
        inputs: the value it reads.
    """

    name: str
    shape: Tuple[int, ...]
    index: Optional[torch.Tensor] = None
    inputs: Tuple[int, ...] = ()

    op_type = "gather"


@dataclass
class ReduceOp(Stateless):
    r"""The sum over per-sample dimensions ``dims`` (0 = first dimension after batch), standing
    for a sum (``frac_bits_added`` 0) or a mean over :math:`2^a` values (``frac_bits_added``
    :math:`a`: the output units gain :math:`a` fractional bits):

    .. math::

        y = \sum_{i \in \mathrm{dims}} x_i,\qquad \text{real value } y\, 2^{-(F + a)}

    Attributes:
        name: the operation it comes from (``x.sum(dim)``, ``x.mean(dim)``).
        dims: the summed dimensions of one sample, each in ``[0, rank)``, sorted.
        keepdim: they stay as size-1 dimensions.
        count: how many values each output sums (the product of the summed sizes): the bound
            of the sum, checked against the shapes by
            :func:`~snnquant.export.backends.simulator.op_shapes`.
        frac_bits_added: :math:`a`.
        inputs: the value it reads.
    """

    name: str
    dims: Tuple[int, ...]
    keepdim: bool
    count: int
    frac_bits_added: int = 0
    inputs: Tuple[int, ...] = ()

    op_type = "reduce"


@dataclass
class MatMulOp(Stateless):
    r"""The matrix product of two integer tensors (a spiking attention's :math:`Q K^\top` and
    :math:`(Q K^\top) V` as counts), per sample, leading dimensions broadcast as in
    ``torch.matmul``:

    .. math::

        y_{\ldots i j} = \sum_k a_{\ldots i k}\, b_{\ldots k j},\qquad
        F_y = F_a + F_b

    exact in integers; the float model's product is exact when
    :math:`K \max|a| \max|b| \le 2^p` (checked at export).

    Attributes:
        name: the operation it comes from.
        inner: :math:`K`, the length of the summed dimension (the bound of the product, checked
            against the shapes by :func:`~snnquant.export.backends.simulator.op_shapes`).
        out_frac_bits: :math:`F_y`.
        inputs: ``(a, b)``.
    """

    name: str
    inner: int
    out_frac_bits: int
    inputs: Tuple[int, ...] = ()

    op_type = "matmul"

    def __post_init__(self):
        if len(self.inputs) != 2:
            raise ValueError(f"a matmul reads two values, got inputs={self.inputs!r}")


@dataclass
class ScaleOp(Stateless):
    r"""Multiplication by the constant :math:`2^k` (Spikformer's attention scale 0.125 is
    :math:`k = -3`): for :math:`k \le 0` the integers are unchanged and gain :math:`-k`
    fractional bits; for :math:`k > 0` they are shifted left, :math:`y = x \ll k`.

    Attributes:
        name: the operation it comes from.
        exponent: :math:`k`.
        inputs: the value it reads.
    """

    name: str
    exponent: int
    inputs: Tuple[int, ...] = ()

    op_type = "scale"
