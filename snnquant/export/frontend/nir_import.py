r"""Reading NIR: :func:`from_nir`, snnquant's own graphs back to an integer network.

:func:`from_nir` reads the metadata schema that :func:`~snnquant.export.to_nir` writes
(``snnquant_schema`` 1): the integer weights, bias, membrane range, threshold, reset, leak and grid
shifts of every layer, checked against the node's NIR parameters, so the returned
:class:`~snnquant.export.IntegerNetwork` runs in :class:`~snnquant.export.IntegerSNN` with the
spikes of the network that was exported. A graph without that metadata (written by another tool,
or stripped) is refused with an error naming what is missing: NIR alone does not say how to round
or saturate the membrane. Every field's type and shape is checked first (:mod:`.nir_checks`),
before anything is allocated; the operations built from the nodes then go through the IR's
:func:`~snnquant.export.ir.validation.check_network` (the fields' ranges, the fractional bits
along the edges), whose errors name the node and its metadata field, and last the NIR parameters
are checked against them.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
import torch

from ..ir.network import (NETWORK_INPUT, FlattenOp, IntegerNetwork, IntegerNetworkError, JoinOp,
                          NeuronOp, PoolOp, SynapseOp)
from ..ir.integer_ops import narrowest_int
from ..backends.nir_schema import SCHEMA_VERSION, import_nir, voting_weight
from ..ir.validation import check_network
from .nir_checks import (MAX_BYTES, MAX_ELEMENTS, NEURON_KEYS, OP_ROLES, POOL_KEYS, SYNAPSE_KEYS,
                         NIRImportError, bad_field, check_array, check_int_field, check_real,
                         check_text, int_tuple, int_value, missing_keys, node_meta, node_where,
                         prescan_file, require_keys, scalar_int, translate, validate_graph)

__all__ = ["from_nir", "NIRImportError", "MAX_ELEMENTS", "MAX_BYTES"]


_GRAPH_KEYS = ("producer", "snnquant_schema", "dt", "input_max", "output_kind", "output_frac_bits",
               "reference_dtype", "mantissa_bits", "format_version")


def _chain(graph) -> List[str]:
    """Node names from ``input`` to ``output`` of a sequential graph (one written before graphs
    carried ``snnquant_index``)."""
    succ: Dict[str, List[str]] = {}
    for a, b in graph.edges:
        succ.setdefault(a, []).append(b)
    order, node = [], "input"
    while node != "output":
        nxt = succ.get(node, [])
        if len(nxt) != 1:
            raise NIRImportError(f"node {node!r} has {len(nxt)} outgoing edges {nxt} and no "
                                 f"node holds 'snnquant_index': only a sequential graph "
                                 f"(input -> ... -> output) can be read without it")
        node = nxt[0]
        order.append(node)
    if len(order) + 1 != len(graph.nodes):
        extra = sorted(set(graph.nodes) - set(order) - {"input"})
        raise NIRImportError(f"nodes {extra} are not on the path from 'input' to 'output'")
    return order[:-1]


def check_edges(graph) -> Dict[str, List[str]]:
    """Every edge joins two nodes of the graph, none enters ``input`` or leaves ``output``, and
    there is no cycle; returns each node's predecessors (in edge order)."""
    for end in ("input", "output"):
        if end not in graph.nodes:
            raise NIRImportError(f"the graph needs nodes named 'input' and 'output', it has "
                                 f"{sorted(graph.nodes)}")
    pred: Dict[str, List[str]] = {name: [] for name in graph.nodes}
    for edge in graph.edges:
        a, b = edge
        for end in (a, b):
            if end not in graph.nodes:
                raise NIRImportError(f"edge {tuple(edge)!r}: node {end!r} does not exist")
        if b == "input" or a == "output":
            raise NIRImportError(f"edge {tuple(edge)!r}: nothing may enter 'input' or leave "
                                 f"'output'")
        pred[b].append(a)
    indegree = {k: len(set(v)) for k, v in pred.items()}
    succ: Dict[str, set] = {}
    for b, sources in pred.items():
        for a in set(sources):
            succ.setdefault(a, set()).add(b)
    todo = [k for k, d in indegree.items() if d == 0]
    while todo:
        for b in succ.get(todo.pop(), ()):
            indegree[b] -= 1
            if indegree[b] == 0:
                todo.append(b)
    cycle = sorted(k for k, d in indegree.items() if d > 0)
    if cycle:
        raise NIRImportError(f"the graph has a cycle through the nodes {cycle}; snnquant writes "
                             f"no recurrent edges")
    return pred


class _Entry:
    """One operation of the graph: its node (``None`` for an ``'add'`` join), metadata, role,
    the node of its output (a max pooling's second node) and the inputs it records."""

    def __init__(self, index, name, meta, role, inputs):
        self.index, self.name, self.meta, self.role = index, name, meta, role
        self.recorded = inputs                      # the ``inputs`` field as written
        self.inputs = inputs or (index - 1,)        # IntegerNetwork.op_inputs
        self.tail = name
        self.parts: List[str] = []

    @property
    def where(self) -> str:
        return self.name if self.name is not None else f"snnquant_joins[{self.index}]"


def _structure(graph, gmeta) -> List[_Entry]:
    """The operations of a graph written by :func:`~snnquant.export.to_nir`, in index order,
    with the inputs each records (checked: earlier operations or the network input)."""
    pred = check_edges(graph)
    indexed = "snnquant_joins" in gmeta or any(
        "snnquant_index" in (getattr(node, "metadata", None) or {})
        for node in graph.nodes.values())
    entries: Dict[int, _Entry] = {}
    parts = []
    if not indexed:  # a sequence written before graphs: the chain's order is the index
        for name in _chain(graph):
            meta, role = node_meta(name, graph.nodes[name])
            if role in OP_ROLES:
                entries[len(entries)] = _Entry(len(entries), name, meta, role, ())
            elif role == "part" and entries:
                parts.append((name, len(entries) - 1))
            else:
                raise NIRImportError(f"node {name!r}: a {role!r} node must follow the operation "
                                     f"it belongs to")
    else:
        for name, node in graph.nodes.items():
            if name in ("input", "output"):
                continue
            meta, role = node_meta(name, node)
            if role == "scale":
                continue
            if "snnquant_index" not in meta:
                raise NIRImportError(f"node {name!r} ({role}) lacks the snnquant metadata "
                                     f"['snnquant_index'] that the graph's other nodes hold")
            index = check_int_field(name, "snnquant_index", meta["snnquant_index"], 0, MAX_ELEMENTS)
            if role == "part":
                parts.append((name, index))
                continue
            if index in entries:
                raise bad_field(name, "snnquant_index", meta["snnquant_index"],
                                f"is also node {entries[index].name!r}'s")
            entries[index] = _Entry(index, name, meta, role, _recorded(name, meta, index))
        joins = gmeta.get("snnquant_joins", {})
        if not isinstance(joins, dict):
            raise bad_field(None, "snnquant_joins", joins, "must be a dict {index: join}")
        for key, meta in joins.items():
            where = f"snnquant_joins[{key!r}]"
            index = check_int_field(None, "snnquant_joins key", int(key) if str(key).isdigit() else key,
                                    0, MAX_ELEMENTS)
            if not isinstance(meta, dict):
                raise bad_field(None, where, meta, "must be a dict")
            meta = {**meta, "snnquant_op": "join"}
            if index in entries:
                raise bad_field(None, where, key, f"is also node {entries[index].name!r}'s index")
            entries[index] = _Entry(index, None, meta, "join",
                                    _recorded(None, meta, index, where))
    missing = sorted(set(range(len(entries))) - set(entries))
    if missing:
        raise NIRImportError(f"the graph's operations are numbered {sorted(entries)}: index "
                             f"{missing[0]} is missing (snnquant_index must run from 0)")
    for name, index in parts:
        entry = entries.get(index)
        if entry is None or entry.role != "pool" or pred[name] != [entry.tail]:
            raise NIRImportError(f"node {name!r}: a 'part' node must follow the max pooling "
                                 f"it belongs to (snnquant_index {index}), with one edge from it")
        entry.parts.append(name)
        entry.tail = name
    return [entries[i] for i in range(len(entries))]


def _recorded(name, meta, index, where="snnquant_inputs"):
    """The ``inputs`` an operation records: earlier operations' indices or -1 (the input)."""
    if "snnquant_inputs" not in meta:
        return ()
    raw = meta["snnquant_inputs"]
    a = check_array(name, where, raw, integer=True)
    if a.ndim != 1 or any(not -1 <= int(j) < index for j in a):
        raise bad_field(name, where, raw, f"must list earlier operations (indices below {index}) or "
                                     f"-1 (the network input)")
    return tuple(int(j) for j in a)


def _check_wiring(graph, entries: List[_Entry], desc: IntegerNetwork, units: str) -> None:
    """The graph's edges are the ones :func:`~snnquant.export.to_nir` writes for ``desc``
    (:func:`~snnquant.export.backends.nir_schema.nir_wiring`): each node reads the operations that its
    metadata names, through ``Scale`` nodes of the right factor, and no other node exists."""
    from ..backends.nir_schema import nir_factors, nir_wiring

    out, need, _ = nir_factors(desc, units)
    for e, op in zip(entries, desc.ops):
        if e.name is not None and "unit_factor" in e.meta:
            expected = need[e.index] if isinstance(op, NeuronOp) else out[e.index]
            if float(check_real(e.name, "unit_factor", e.meta["unit_factor"])) != expected:
                raise bad_field(e.name, "unit_factor", e.meta["unit_factor"],
                                f"must be {expected:g}, the factor of its edges in units={units!r}")
    pred = check_edges(graph)
    tails = {"input": NETWORK_INPUT, **{e.tail: e.index for e in entries if e.name is not None}}
    used = {"input", "output"} | {e.name for e in entries} | {p for e in entries for p in e.parts}
    heads = {e.index: e.name for e in entries if e.name is not None}
    for dst, want in nir_wiring(desc, units).items():
        node_name = "output" if dst == "output" else heads[dst]
        got: Dict[int, float] = {}
        for p in pred[node_name]:
            factor = 1.0
            if p not in tails and _role(graph, p) == "scale":
                used.add(p)
                scale = np.asarray(getattr(graph.nodes[p], "scale", np.nan), dtype=np.float64)
                succ = [b for b, sources in pred.items() if p in sources]
                if len(pred[p]) != 1 or succ != [node_name] or scale.size == 0 \
                        or not np.all(scale == scale.reshape(-1)[0]):
                    raise NIRImportError(f"node {p!r}: a 'scale' node has one edge in, one out "
                                         f"and one factor")
                factor, p = float(scale.reshape(-1)[0]), pred[p][0]
            if p not in tails:
                raise NIRImportError(f"node {node_name!r} has an edge from {p!r}, which is not "
                                     f"the output of an operation")
            got[tails[p]] = got.get(tails[p], 0.0) + factor
        if got != want:
            show = lambda d: {("input" if j == NETWORK_INPUT else j): m  # noqa: E731
                              for j, m in sorted(d.items())}
            raise NIRImportError(f"node {node_name!r}: its incoming edges carry operations "
                                 f"{show(got)} (operation index: factor), but its snnquant "
                                 f"metadata (snnquant_index, snnquant_inputs) says {show(want)}")
    extra = sorted(set(graph.nodes) - used)
    if extra:
        raise NIRImportError(f"nodes {extra} are not part of the network the metadata describes")


def _role(graph, name: str) -> Optional[str]:
    meta = getattr(graph.nodes[name], "metadata", None) or {}
    role = meta.get("snnquant_op")
    return role.decode() if isinstance(role, bytes) else role


def _check_close(name: str, what: str, nir_value, expected):
    a = np.asarray(nir_value, dtype=np.float64)
    b = np.broadcast_to(np.asarray(expected, dtype=np.float64), a.shape)
    if a.shape != b.shape or not np.allclose(a, b, rtol=1e-12, atol=0.0):
        diff = float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else float("nan")
        raise NIRImportError(f"node {name!r}: the NIR {what} disagrees with its snnquant "
                             f"metadata (largest difference {diff:.3g}); the graph was changed "
                             f"after export")


def _synapse(name, node, meta, nir) -> SynapseOp:
    require_keys(name, meta, SYNAPSE_KEYS, "synapse")
    w_int = torch.as_tensor(np.asarray(meta["weight_int"]).astype(np.int64))
    scale = torch.as_tensor(np.asarray(meta["weight_scale"], dtype=np.float64).reshape(-1))
    out_frac = int(meta["out_frac_bits"])
    if tuple(w_int.shape) != tuple(np.asarray(node.weight).shape):
        raise NIRImportError(f"node {name!r}: weight_int has shape {tuple(w_int.shape)}, the NIR "
                             f"weight {tuple(np.asarray(node.weight).shape)}")
    bias = None
    if "bias_int" in meta:
        bias = torch.as_tensor(np.asarray(meta["bias_int"]).astype(np.int64)).reshape(-1)
    elif isinstance(node, nir.Affine) or (hasattr(node, "bias") and np.any(np.asarray(node.bias))):
        raise NIRImportError(f"node {name!r} has a NIR bias but no bias_int in its metadata")
    bits = int(meta["weight_bits"])
    conv = {}
    if isinstance(node, (nir.Affine, nir.Linear)):
        kind = "linear"
    elif isinstance(node, (nir.Conv1d, nir.Conv2d)):
        kind = "conv1d" if isinstance(node, nir.Conv1d) else "conv2d"
        n = 1 if kind == "conv1d" else 2
        rep = lambda v: int_tuple(v) * n if np.asarray(v).size == 1 else int_tuple(v)  # noqa: E731
        padding = node.padding
        if isinstance(padding, bytes):
            padding = padding.decode()
        conv = dict(stride=rep(node.stride), dilation=rep(node.dilation),
                    padding=padding if isinstance(padding, str) else rep(padding),
                    groups=int(np.asarray(node.groups)))
    else:
        raise NIRImportError(f"node {name!r}: a synapse must be Affine, Linear, Conv1d or "
                             f"Conv2d, got {type(node).__name__}")
    return SynapseOp(name=str(meta.get("snnquant_name", name)), kind=kind,
                     weight=w_int.to(narrowest_int(int(w_int.min()), int(w_int.max()))),
                     weight_bits=bits,
                     weight_scale=scale.double(),
                     multiplier=torch.as_tensor(int_tuple(meta["weight_multiplier"]), dtype=torch.int64),
                     shift=torch.as_tensor(int_tuple(meta["weight_shift"]), dtype=torch.int64),
                     bias=bias, bias_bits=int(meta["bias_bits"]) if "bias_bits" in meta else None,
                     in_frac_bits=int(meta["in_frac_bits"]), out_frac_bits=out_frac, **conv)


def _synapse_agrees(name, node, meta, op: SynapseOp) -> None:
    """The NIR weight and bias are the integer ones times their scales, and the bias fits
    ``bias_bits`` (read after :func:`check_network` has checked the fields)."""
    c = float(meta["unit_factor"])
    w = op.weight.double()
    view = [-1] + [1] * (w.dim() - 1)
    _check_close(name, "weight", node.weight, (w * op.weight_scale.reshape(view) * c).numpy())
    if op.bias is not None:
        if op.bias_bits is not None:
            high = (1 << (op.bias_bits - 1)) - 1
            lo, hi = int(op.bias.min()), int(op.bias.max())
            if lo < -high - 1 or hi > high:
                raise bad_field(name, "bias_int", meta["bias_int"],
                                f"holds {lo if lo < -high - 1 else hi}, outside the "
                                f"{op.bias_bits}-bit range [{-high - 1}, {high}] of bias_bits")
        _check_close(name, "bias", node.bias,
                     op.bias.double().numpy() * 2.0 ** -op.out_frac_bits * c)


def _neuron_agrees(name, node, meta, op: NeuronOp, dt: float) -> None:
    """The NIR threshold, reset, time constant and resistance are those of the integer
    neuron."""
    unit = float(meta["membrane_unit"])
    _check_close(name, "v_threshold", node.v_threshold, (op.threshold - 0.5) * unit)
    _check_close(name, "v_reset", node.v_reset, op.v_reset * unit)
    if op.kind == "if":
        _check_close(name, "r", node.r, 1.0 / dt)
    else:
        tau = (1 << op.leak_shift) / op.leak_multiplier
        _check_close(name, "tau", node.tau, tau * dt)
        _check_close(name, "r", node.r, 1.0 if op.decay_input else tau)
        _check_close(name, "v_leak", node.v_leak, op.v_reset * unit)


def _neuron(name, node, meta, nir) -> NeuronOp:
    require_keys(name, meta, NEURON_KEYS, "neuron")
    if not isinstance(node, (nir.IF, nir.LIF)):
        raise NIRImportError(f"node {name!r}: a neuron must be IF or LIF, got {type(node).__name__}")
    if str(meta["reset_mode"]) != "hard":
        raise NIRImportError(f"node {name!r}: reset_mode {meta['reset_mode']!r} (NIR neurons "
                             f"reset to v_reset; only 'hard' is written by to_nir)")
    if str(meta["rounding"]) != "half_to_even":
        raise NIRImportError(f"node {name!r}: rounding {meta['rounding']!r} is unknown (snnquant "
                             f"rounds half to even)")
    theta, v_reset = int(meta["threshold_int"]), int(meta["v_reset_int"])
    kind = "if" if isinstance(node, nir.IF) else "lif"
    k, m = int(meta["leak_shift"]), int(meta["leak_multiplier"])
    decay_input = bool(meta["decay_input"])
    tau_src = float(meta["source_tau"]) if "source_tau" in meta else None
    try:
        return NeuronOp(name=str(meta.get("snnquant_name", name)), kind=kind,
                        v_bits=int(meta["v_bits"]), v_min=int(meta["v_min"]),
                        v_max=int(meta["v_max"]), membrane_scale=float(meta["membrane_scale"]),
                        threshold=theta, reset_mode="hard", v_reset=v_reset,
                        v_init=int(meta["v_init_int"]), leak_shift=k, decay_input=decay_input,
                        input_shift=int(meta["input_shift"]), grid_shift=int(meta["grid_shift"]),
                        in_frac_bits=int(meta["in_frac_bits"]),
                        grid_frac_bits=int(meta["grid_frac_bits"]), leak_multiplier=m,
                        leak_round_shift=int(meta["leak_round_shift"]),
                        exact=bool(meta["exact"]), tau=tau_src)
    except ValueError as exc:  # NeuronOp's own checks (leak_multiplier, leak_round_shift)
        field = str(exc).split(" ", 1)[0]
        if field in meta:
            raise bad_field(name, field, meta[field], str(exc)[len(field) + 1:]) from exc
        raise NIRImportError(f"node {name!r}: {exc}") from exc


def _pool(name, node, meta, nir) -> PoolOp:
    require_keys(name, meta, POOL_KEYS, "pool")
    kind = str(meta["pool_kind"])
    ks, stride, padding = int_tuple(meta["kernel_size"]), int_tuple(meta["stride"]), int_tuple(meta["padding"])
    if kind == "max":
        form = str(meta.get("max_pool_form", "threshold"))
        expected = nir.SumPool2d if form == "threshold" else nir.Conv2d
        if not isinstance(node, expected):
            raise NIRImportError(f"node {name!r}: max pooling in form {form!r} must be a "
                                 f"{expected.__name__}, got {type(node).__name__}")
    elif kind == "sum" and "dims" in meta:  # VotingLayer: a Linear of 1 / divisor blocks
        if not isinstance(node, nir.Linear) or scalar_int(meta["dims"]) != 1:
            raise NIRImportError(f"node {name!r}: a 1-d average (dims 1) must be a Linear, got "
                                 f"{type(node).__name__} with dims={meta['dims']!r}")
        divisor = int_value(name, "divisor", meta.get("divisor", 1))
        return PoolOp(name=str(meta.get("snnquant_name", name)), kind=kind, dims=1,
                      kernel_size=ks, stride=stride, padding=padding, dilation=(1,),
                      ceil_mode=False, frac_bits_added=int(meta["frac_bits_added"]),
                      divisor=divisor)
    elif kind == "sum":
        if not isinstance(node, nir.AvgPool2d):
            raise NIRImportError(f"node {name!r}: average pooling must be an AvgPool2d, got "
                                 f"{type(node).__name__}")
    else:
        raise NIRImportError(f"node {name!r}: unknown pool_kind {kind!r}")
    if isinstance(node, (nir.SumPool2d, nir.AvgPool2d)) and (
            int_tuple(node.kernel_size) != ks or int_tuple(node.stride) != stride
            or int_tuple(node.padding) != padding):
        raise NIRImportError(f"node {name!r}: the NIR kernel_size/stride/padding disagree with "
                             f"its snnquant metadata")
    output_size = int_tuple(meta["output_size"]) if "output_size" in meta else ()
    return PoolOp(name=str(meta.get("snnquant_name", name)), kind=kind, dims=2, kernel_size=ks,
                  stride=stride, padding=padding, dilation=(1, 1), ceil_mode=False,
                  frac_bits_added=int(meta["frac_bits_added"]), output_size=output_size)


def read_graph(graph_or_path, nir, max_bytes: Optional[int] = None):
    if isinstance(graph_or_path, (str, os.PathLike)):
        path = os.fspath(graph_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no NIR file at {path!r}")
        prescan_file(path, nir, MAX_BYTES if max_bytes is None else max_bytes)
        try:
            return nir.read(path, type_check=False)
        except Exception as exc:
            raise NIRImportError(f"could not read the NIR file {path!r}: "
                                 f"{str(exc) or type(exc).__name__}") from exc
    if isinstance(graph_or_path, nir.NIRGraph):
        return graph_or_path
    raise TypeError(f"graph_or_path must be a nir.NIRGraph or a path to a .nir file, got "
                    f"{type(graph_or_path).__name__}")


def from_nir(graph_or_path, *, max_bytes: Optional[int] = None) -> IntegerNetwork:
    r"""Read a NIR graph written by :func:`~snnquant.export.to_nir` back as an integer network.

    Every layer is rebuilt from its node's snnquant metadata (integer weights and bias, grid
    shifts, membrane range, threshold, reset and leak), and the node's NIR parameters are checked
    against it (:math:`W_{nir} = c\, w\, s_w`, :math:`V_{th,nir} = (\theta - \tfrac12) u`, ...), so
    :class:`~snnquant.export.IntegerSNN` on the result gives the spikes of the exported network.

    Args:
        graph_or_path: a ``nir.NIRGraph`` or the path of a ``.nir`` file.
        max_bytes: the most bytes a file's datasets may hold in all, every element counted at
            ``max(itemsize, 8)`` bytes (compressed datasets at their full size), checked before
            anything is read (default ``nir_import.MAX_BYTES``, 2**30: 1 GiB, 2**27 elements);
            raise it to read a larger graph. Not used for a ``nir.NIRGraph`` (already in
            memory).

    Returns:
        The :class:`~snnquant.export.IntegerNetwork`.

    Raises:
        NIRImportError: the graph lacks snnquant's metadata (the message lists the missing keys and
            the node), uses a schema version this snnquant does not read, has edges that are not
            those its metadata implies (an edge to a node that does not exist, a cycle, an
            operation reading a later one, a missing or extra edge or ``Scale`` factor: checked
            against :func:`~snnquant.export.backends.nir_schema.nir_wiring`), or its NIR parameters
            disagree with its metadata; or a field fails its check. Every field is checked
            against its type and shape before anything is allocated, then the network read
            against the IR's rules (:func:`~snnquant.export.ir.validation.check_network`): bit
            widths (each integer weight fits ``weight_bits``, the membrane range ``v_bits``),
            shifts (``0 <= shift <= 62``, the charge fits int64), bounds (``v_min < v_max``,
            reset and initial value inside), the fractional bits along the edges; and, in the
            graph, ``dt > 0`` and every shape against the shapes the graph's edges carry, with
            at most ``nir_import.MAX_ELEMENTS`` (2**26) elements per array and ``max_bytes``
            in all (in a file, checked on the declared shapes before ``nir.read`` reads
            anything; a file with an external or soft HDF5 link is refused). The message names
            the node, the field and the value.
        ImportError: ``nir`` is missing or older than 1.0.6.
    """
    nir = import_nir("from_nir")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):
        raise ValueError(f"max_bytes must be an int >= 1, got {max_bytes!r}")
    graph = read_graph(graph_or_path, nir, max_bytes)
    gmeta = dict(graph.metadata or {})
    miss = missing_keys(gmeta, _GRAPH_KEYS)
    if miss or str(gmeta.get("producer")) != "snnquant":
        raise NIRImportError(
            f"the graph has no snnquant metadata: graph.metadata lacks {miss or ['producer']}"
            f" (producer={gmeta.get('producer')!r}). from_nir reads graphs "
            f"written by snnquant.export.to_nir, whose metadata holds what NIR cannot: integer "
            f"weights, bit widths, membrane range, rounding and firing rule. A graph from another "
            f"tool has no integer network to read: quantize the model with snnquant and export "
            f"it with to_nir")
    schema = int(gmeta["snnquant_schema"])
    if schema != SCHEMA_VERSION:
        raise NIRImportError(f"snnquant_schema {schema} is not readable (this snnquant reads "
                             f"schema {SCHEMA_VERSION})")
    entries = _structure(graph, gmeta)
    units = check_text(None, "units", gmeta.get("units", "integer"), ("integer", "real"))
    validate_graph(graph, nir, entries)
    dt = float(gmeta["dt"])
    ops = []
    for e in entries:
        node = None if e.name is None else graph.nodes[e.name]
        if e.role == "synapse":
            op = _synapse(e.name, node, e.meta, nir)
        elif e.role == "neuron":
            op = _neuron(e.name, node, e.meta, nir)
        elif e.role == "pool":
            op = _pool(e.name, node, e.meta, nir)
        elif e.role == "join":
            op = _join(e, node)
        else:
            if not isinstance(node, nir.Flatten):
                raise NIRImportError(f"node {e.name!r}: flatten must be a Flatten node")
            op = FlattenOp(name=str(e.meta.get("snnquant_name", e.name)),
                           start_dim=int(node.start_dim), end_dim=int(node.end_dim))
        op.inputs = e.recorded
        ops.append(op)
    if not ops:
        raise NIRImportError("the graph has no operations between 'input' and 'output'")
    notes = [line for line in str(gmeta.get("notes", "")).split("\n") if line]
    desc = IntegerNetwork(ops=ops, input_max=int(gmeta["input_max"]),
                          output_kind=str(gmeta["output_kind"]),
                          output_frac_bits=int(gmeta["output_frac_bits"]),
                          reference_dtype=str(gmeta["reference_dtype"]),
                          mantissa_bits=int(gmeta["mantissa_bits"]),
                          format_version=int(gmeta["format_version"]), notes=notes)
    try:
        check_network(desc)  # the fields' ranges and the fractional bits along the edges
    except IntegerNetworkError as exc:
        raise translate(exc, graph, entries) from exc
    for e, op in zip(entries, ops):
        node = None if e.name is None else graph.nodes[e.name]
        if isinstance(op, SynapseOp):
            _synapse_agrees(e.name, node, e.meta, op)
        elif isinstance(op, NeuronOp):
            _neuron_agrees(e.name, node, e.meta, op, dt)
        elif isinstance(op, PoolOp) and op.dims == 1:
            _check_close(e.name, "weight", node.weight,
                         voting_weight(op, int(np.asarray(node.weight).shape[1]),
                                       float(e.meta["unit_factor"])))
    _check_wiring(graph, entries, desc, units)
    return desc


def _join(e: "_Entry", node) -> JoinOp:
    """An ``'add'`` join from the graph metadata, or an ``'and'``/``'iand'`` join's Threshold
    node (:math:`x_0 + x_1 > 3/2`, :math:`x_0 - x_1 > 1/2`)."""
    meta = e.meta
    for key in ("join_kind", "shifts", "out_frac_bits"):
        if key not in meta:
            raise NIRImportError(f"{node_where(e.name) if e.name else e.where} (join) lacks the "
                                 f"snnquant metadata [{key!r}]")
    kind = check_text(e.name, "join_kind", meta["join_kind"], ("add",) if node is None
                      else ("and", "iand"))
    if node is not None:
        _check_close(e.name, "threshold", node.threshold, 1.5 if kind == "and" else 0.5)
    shifts = check_array(e.name, "shifts", meta["shifts"], integer=True)
    try:
        return JoinOp(name=str(meta.get("snnquant_name", e.name)), kind=kind,
                      shifts=tuple(int(v) for v in shifts.reshape(-1)),
                      out_frac_bits=int_value(e.name, "out_frac_bits", meta["out_frac_bits"]),
                      inputs=e.inputs)
    except ValueError as exc:
        raise NIRImportError(f"{e.where}: {exc}") from exc
