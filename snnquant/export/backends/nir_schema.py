r"""What :func:`~snnquant.export.to_nir` and :func:`~snnquant.export.from_nir` agree on: the version
of snnquant's metadata schema, the ``nir`` package both need (imported only when used), and the
wiring of a graph (the factor of every edge, the edges into every node)."""

from __future__ import annotations

import re

import numpy as np

from ..ir.network import NETWORK_INPUT, IntegerNetwork, JoinOp, NeuronOp, PoolOp, SynapseOp

__all__ = ["SCHEMA_VERSION", "NIR_MIN_VERSION", "import_nir", "nir_factors", "nir_wiring",
           "voting_weight", "is_add_join"]

#: Version of the metadata schema that :func:`~snnquant.export.to_nir` writes and
#: :func:`~snnquant.export.from_nir` reads (key ``snnquant_schema`` of the graph and every node).
SCHEMA_VERSION = 1

#: Oldest ``nir`` release that holds ``v_reset`` on ``IF``/``LIF`` nodes.
NIR_MIN_VERSION = (1, 0, 6)


def _version_tuple(text: str):
    parts = []
    for piece in str(text).split(".")[:3]:
        m = re.match(r"\d+", piece)
        parts.append(int(m.group()) if m else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def import_nir(what: str):
    """The ``nir`` module, or ``ImportError`` naming ``what`` needs it (absent or older than 1.0.6)."""
    need = ".".join(str(v) for v in NIR_MIN_VERSION)
    try:
        import nir
    except ImportError as exc:
        raise ImportError(f"{what} needs the nir package >= {need}: pip install 'nir>={need}' "
                          f"(or snnquant[export])") from exc
    version = getattr(nir, "__version__", None) or getattr(nir, "version", None)
    if version is None or _version_tuple(version) < NIR_MIN_VERSION:
        raise ImportError(f"{what} needs nir >= {need} (IF/LIF nodes with v_reset), found nir "
                          f"{version}: pip install --upgrade 'nir>={need}'. (sinabs and "
                          f"rockpool[nir] pin nir <= 1.0.4; install them in another environment)")
    return nir


def is_add_join(op) -> bool:
    """Whether ``op`` is a residual ``'add'`` join (it has no NIR node of its own)."""
    return isinstance(op, JoinOp) and op.kind == "add"


def nir_factors(desc: IntegerNetwork, units: str):
    r"""``(out, need, output_need)``: per operation, the factor :math:`c` by which its NIR output
    value exceeds the real value (``out``) and the factor its NIR input must carry (``need``),
    and the factor the graph's ``output`` node carries.

    A neuron needs :math:`2^{F_0}` (``units='integer'``: its membrane in units of its shared
    grid) or 1, and outputs spikes (1); a synapse, a max pool and an ``'and'``/``'iand'`` join
    need 1; a synapse, a sum pool, a flatten and an ``'add'`` join output what their first
    consumer needs (a synapse by scaling its weights, the others by passing their input's factor
    on). Every factor is a power of two, so every ratio between them is exact."""
    n = len(desc.ops)
    consumers = [[] for _ in range(n)]
    for i in range(n):
        for j in desc.op_inputs(i):
            if j != NETWORK_INPUT:
                consumers[j].append(i)
    output_need = (2.0 ** desc.output_frac_bits
                   if units == "integer" and desc.output_kind == "current" else 1.0)
    out, need = [1.0] * n, [1.0] * n
    for i in range(n - 1, -1, -1):
        op = desc.ops[i]
        downstream = [need[k] for k in consumers[i]] + ([output_need] if i == n - 1 else [])
        binary = isinstance(op, NeuronOp) or (isinstance(op, PoolOp) and op.kind == "max") or (
            isinstance(op, JoinOp) and op.kind != "add")
        out[i] = 1.0 if binary or not downstream else downstream[0]
        if isinstance(op, NeuronOp):
            need[i] = 2.0 ** op.grid_frac_bits if units == "integer" else 1.0
        elif not (binary or isinstance(op, SynapseOp)):
            need[i] = out[i]
    return out, need, output_need


def _terms(desc: IntegerNetwork, out, j: int, need: float, sign: float = 1.0):
    """``{source: multiplier}``: the NIR edges that carry value ``j`` into a node that needs the
    factor ``need``. An ``'add'`` join has no node of its own (NIR sums the edges into a node):
    its operands' edges go straight to its consumers."""
    if j != NETWORK_INPUT and is_add_join(desc.ops[j]):
        acc = {}
        for k in desc.op_inputs(j):
            for src, m in _terms(desc, out, k, need, sign).items():
                acc[src] = acc.get(src, 0.0) + m
        return acc
    return {j: sign * need / (1.0 if j == NETWORK_INPUT else out[j])}


def nir_wiring(desc: IntegerNetwork, units: str):
    """``{consumer: {source: multiplier}}``: the edges of the NIR graph that
    :func:`~snnquant.export.to_nir` writes for ``desc``, by operation index (``'output'`` for
    the output node, :data:`NETWORK_INPUT` for the input). A multiplier other than 1 is a ``Scale`` node on the edge (an operand's grid
    aligned, or the negated operand of an ``'iand'`` join); ``'add'`` joins have no entry (their
    operands feed their consumers). :func:`~snnquant.export.from_nir` checks a graph's edges
    against this."""
    out, need, output_need = nir_factors(desc, units)
    wiring = {}
    for i, op in enumerate(desc.ops):
        if is_add_join(op):
            continue
        acc = {}
        for k, j in enumerate(desc.op_inputs(i)):
            sign = -1.0 if isinstance(op, JoinOp) and op.kind == "iand" and k == 1 else 1.0
            for src, m in _terms(desc, out, j, need[i], sign).items():
                acc[src] = acc.get(src, 0.0) + m
        wiring[i] = acc
    wiring["output"] = _terms(desc, out, len(desc.ops) - 1, output_need)
    return wiring


def voting_weight(op: PoolOp, features: int, c: float) -> np.ndarray:
    r"""The NIR ``Linear`` weight of SpikingJelly's ``VotingLayer`` (a 1-d sum pool ``op``) over
    ``features`` inputs, with the unit factor ``c``:

    .. math::

        W_{g, j} = \frac{c}{2^a D}\ \text{for}\ g k \le j < (g + 1) k,\ \text{else}\ 0

    for groups of :math:`k` (``kernel_size``) features, :math:`a` = ``frac_bits_added`` and
    :math:`D` = ``divisor``."""
    k = op.kernel_size[0]
    w = np.zeros((features // k, features))
    for g in range(features // k):
        w[g, g * k:(g + 1) * k] = c / (2.0 ** op.frac_bits_added * op.divisor)
    return w
