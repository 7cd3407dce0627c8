r"""Reading NIR: :func:`from_nir` (snnquant's own graphs back to an integer network) and
:func:`simulate_nir` (NIR's equations as NIR states them, for any consumer to be checked against).

:func:`from_nir` reads the metadata schema that :func:`~snnquant.export.to_nir` writes
(``snnquant_schema`` 1): the integer weights, bias, membrane range, threshold, reset, leak and grid
shifts of every layer, checked against the node's NIR parameters, so the returned
:class:`~snnquant.export.IntegerNetwork` runs in :class:`~snnquant.export.IntegerSNN` with the
spikes of the network that was exported. A graph without that metadata (written by another tool,
or stripped) is refused with an error naming what is missing: NIR alone does not say how to round
or saturate the membrane.

:func:`simulate_nir` integrates the graph's primitives with Euler steps in float64, exactly as the
NIR equations read, with no rounding or saturation:

.. math::

    \text{IF:}\quad & v \leftarrow v + dt\, r\, I\\
    \text{LIF:}\quad & v \leftarrow v + \frac{dt}{\tau}\big((v_{leak} - v) + r\, I\big)\\
    & z = [v > v_{threshold}],\qquad v \leftarrow v_{reset}\ \text{where}\ z = 1\\
    \text{Threshold:}\quad & z = [x > \text{threshold}]
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ...functional.int_limits import FRAC_LIMIT, INT64_HEADROOM_BITS, as_int, weight_range
from ..ir.description import (NETWORK_INPUT, FlattenOp, IntegerNetwork, JoinOp, NeuronOp, PoolOp,
                               SynapseOp)
from ..ir.integer_ops import narrowest_int
from .nir_schema import SCHEMA_VERSION, import_nir, voting_weight
from ..ir.validation import check_network

__all__ = ["from_nir", "simulate_nir", "NIRImportError"]

_GRAPH_KEYS = ("producer", "snnquant_schema", "dt", "input_max", "output_kind", "output_frac_bits",
               "reference_dtype", "mantissa_bits", "format_version")
_SYNAPSE_KEYS = ("weight_bits", "weight_int", "weight_scale", "weight_multiplier", "weight_shift",
                 "in_frac_bits", "out_frac_bits", "unit_factor")
_NEURON_KEYS = ("v_bits", "v_min", "v_max", "membrane_scale", "membrane_unit", "threshold_int",
                "v_reset_int", "v_init_int", "reset_mode", "leak_shift", "leak_multiplier",
                "leak_round_shift", "decay_input", "input_shift", "grid_shift", "in_frac_bits",
                "grid_frac_bits", "exact", "rounding")
_POOL_KEYS = ("pool_kind", "frac_bits_added", "kernel_size", "stride", "padding")


class NIRImportError(ValueError):
    """A NIR graph cannot be read as an snnquant integer network; the message says what is missing
    or inconsistent, and in which node."""


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


_OP_ROLES = ("synapse", "neuron", "pool", "flatten", "join")


def _check_edges(graph) -> Dict[str, List[str]]:
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
    pred = _check_edges(graph)
    indexed = "snnquant_joins" in gmeta or any(
        "snnquant_index" in (getattr(node, "metadata", None) or {})
        for node in graph.nodes.values())
    entries: Dict[int, _Entry] = {}
    parts = []
    if not indexed:  # a sequence written before graphs: the chain's order is the index
        for name in _chain(graph):
            meta, role = _node_meta(name, graph.nodes[name])
            if role in _OP_ROLES:
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
            meta, role = _node_meta(name, node)
            if role == "scale":
                continue
            if "snnquant_index" not in meta:
                raise NIRImportError(f"node {name!r} ({role}) lacks the snnquant metadata "
                                     f"['snnquant_index'] that the graph's other nodes hold")
            index = _int(name, "snnquant_index", meta["snnquant_index"], 0, MAX_ELEMENTS)
            if role == "part":
                parts.append((name, index))
                continue
            if index in entries:
                raise _bad(name, "snnquant_index", meta["snnquant_index"],
                           f"is also node {entries[index].name!r}'s")
            entries[index] = _Entry(index, name, meta, role, _recorded(name, meta, index))
        joins = gmeta.get("snnquant_joins", {})
        if not isinstance(joins, dict):
            raise _bad(None, "snnquant_joins", joins, "must be a dict {index: join}")
        for key, meta in joins.items():
            where = f"snnquant_joins[{key!r}]"
            index = _int(None, "snnquant_joins key", int(key) if str(key).isdigit() else key,
                         0, MAX_ELEMENTS)
            if not isinstance(meta, dict):
                raise _bad(None, where, meta, "must be a dict")
            meta = {**meta, "snnquant_op": "join"}
            if index in entries:
                raise _bad(None, where, key, f"is also node {entries[index].name!r}'s index")
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
    a = _array(name, where, raw, integer=True)
    if a.ndim != 1 or any(not -1 <= int(j) < index for j in a):
        raise _bad(name, where, raw, f"must list earlier operations (indices below {index}) or "
                                     f"-1 (the network input)")
    return tuple(int(j) for j in a)


def _check_wiring(graph, entries: List[_Entry], desc: IntegerNetwork, units: str) -> None:
    """The graph's edges are the ones :func:`~snnquant.export.to_nir` writes for ``desc``
    (:func:`~snnquant.export.backends.nir_schema.nir_wiring`): each node reads the operations that its
    metadata names, through ``Scale`` nodes of the right factor, and no other node exists."""
    from .nir_schema import nir_factors, nir_wiring

    out, need, _ = nir_factors(desc, units)
    for e, op in zip(entries, desc.ops):
        if e.name is not None and "unit_factor" in e.meta:
            expected = need[e.index] if isinstance(op, NeuronOp) else out[e.index]
            if float(_real(e.name, "unit_factor", e.meta["unit_factor"])) != expected:
                raise _bad(e.name, "unit_factor", e.meta["unit_factor"],
                           f"must be {expected:g}, the factor of its edges in units={units!r}")
    pred = _check_edges(graph)
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


def _missing(meta, keys) -> List[str]:
    return [k for k in keys if k not in meta]


def _require(name: str, meta, keys, what: str):
    miss = _missing(meta, keys)
    if miss:
        raise NIRImportError(f"node {name!r} ({what}) lacks the snnquant metadata {miss}; "
                             f"from_nir reads graphs written by snnquant.export.to_nir")


def _check_close(name: str, what: str, nir_value, expected):
    a = np.asarray(nir_value, dtype=np.float64)
    b = np.broadcast_to(np.asarray(expected, dtype=np.float64), a.shape)
    if a.shape != b.shape or not np.allclose(a, b, rtol=1e-12, atol=0.0):
        diff = float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else float("nan")
        raise NIRImportError(f"node {name!r}: the NIR {what} disagrees with its snnquant "
                             f"metadata (largest difference {diff:.3g}); the graph was changed "
                             f"after export")


def _ints(v) -> Tuple[int, ...]:
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


def _synapse(name, node, meta, nir) -> SynapseOp:
    _require(name, meta, _SYNAPSE_KEYS, "synapse")
    w_int = torch.as_tensor(np.asarray(meta["weight_int"]).astype(np.int64))
    scale = torch.as_tensor(np.asarray(meta["weight_scale"], dtype=np.float64).reshape(-1))
    c = float(meta["unit_factor"])
    out_frac = int(meta["out_frac_bits"])
    if tuple(w_int.shape) != tuple(np.asarray(node.weight).shape):
        raise NIRImportError(f"node {name!r}: weight_int has shape {tuple(w_int.shape)}, the NIR "
                             f"weight {tuple(np.asarray(node.weight).shape)}")
    view = [-1] + [1] * (w_int.dim() - 1)
    _check_close(name, "weight", node.weight,
                 (w_int.double() * scale.reshape(view) * c).numpy())
    bias = None
    if "bias_int" in meta:
        bias = torch.as_tensor(np.asarray(meta["bias_int"]).astype(np.int64)).reshape(-1)
        _check_close(name, "bias", node.bias, bias.double().numpy() * 2.0 ** -out_frac * c)
    elif isinstance(node, nir.Affine) or (hasattr(node, "bias") and np.any(np.asarray(node.bias))):
        raise NIRImportError(f"node {name!r} has a NIR bias but no bias_int in its metadata")
    bits = int(meta["weight_bits"])
    conv = {}
    if isinstance(node, (nir.Affine, nir.Linear)):
        kind = "linear"
    elif isinstance(node, (nir.Conv1d, nir.Conv2d)):
        kind = "conv1d" if isinstance(node, nir.Conv1d) else "conv2d"
        n = 1 if kind == "conv1d" else 2
        rep = lambda v: _ints(v) * n if np.asarray(v).size == 1 else _ints(v)  # noqa: E731
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
                     multiplier=torch.as_tensor(_ints(meta["weight_multiplier"]), dtype=torch.int64),
                     shift=torch.as_tensor(_ints(meta["weight_shift"]), dtype=torch.int64),
                     bias=bias, bias_bits=int(meta["bias_bits"]) if "bias_bits" in meta else None,
                     in_frac_bits=int(meta["in_frac_bits"]), out_frac_bits=out_frac, **conv)


def _neuron(name, node, meta, nir, dt: float) -> NeuronOp:
    _require(name, meta, _NEURON_KEYS, "neuron")
    if not isinstance(node, (nir.IF, nir.LIF)):
        raise NIRImportError(f"node {name!r}: a neuron must be IF or LIF, got {type(node).__name__}")
    if str(meta["reset_mode"]) != "hard":
        raise NIRImportError(f"node {name!r}: reset_mode {meta['reset_mode']!r} (NIR neurons "
                             f"reset to v_reset; only 'hard' is written by to_nir)")
    if str(meta["rounding"]) != "half_to_even":
        raise NIRImportError(f"node {name!r}: rounding {meta['rounding']!r} is unknown (snnquant "
                             f"rounds half to even)")
    unit = float(meta["membrane_unit"])
    theta, v_reset = int(meta["threshold_int"]), int(meta["v_reset_int"])
    _check_close(name, "v_threshold", node.v_threshold, (theta - 0.5) * unit)
    _check_close(name, "v_reset", node.v_reset, v_reset * unit)
    kind = "if" if isinstance(node, nir.IF) else "lif"
    k, m = int(meta["leak_shift"]), int(meta["leak_multiplier"])
    decay_input = bool(meta["decay_input"])
    if kind == "if":
        _check_close(name, "r", node.r, 1.0 / dt)
    else:
        tau = (1 << k) / m
        _check_close(name, "tau", node.tau, tau * dt)
        _check_close(name, "r", node.r, 1.0 if decay_input else tau)
        _check_close(name, "v_leak", node.v_leak, v_reset * unit)
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
    except ValueError as exc:
        raise NIRImportError(f"node {name!r}: {exc}") from exc


def _pool(name, node, meta, nir) -> PoolOp:
    _require(name, meta, _POOL_KEYS, "pool")
    kind = str(meta["pool_kind"])
    ks, stride, padding = _ints(meta["kernel_size"]), _ints(meta["stride"]), _ints(meta["padding"])
    if kind == "max":
        form = str(meta.get("max_pool_form", "threshold"))
        expected = nir.SumPool2d if form == "threshold" else nir.Conv2d
        if not isinstance(node, expected):
            raise NIRImportError(f"node {name!r}: max pooling in form {form!r} must be a "
                                 f"{expected.__name__}, got {type(node).__name__}")
    elif kind == "sum" and "dims" in meta:  # VotingLayer: a Linear of 1 / divisor blocks
        if not isinstance(node, nir.Linear) or _as_int(meta["dims"]) != 1:
            raise NIRImportError(f"node {name!r}: a 1-d average (dims 1) must be a Linear, got "
                                 f"{type(node).__name__} with dims={meta['dims']!r}")
        divisor = _int(name, "divisor", meta.get("divisor", 1), 1, MAX_ELEMENTS)
        op = PoolOp(name=str(meta.get("snnquant_name", name)), kind=kind, dims=1,
                    kernel_size=ks, stride=stride, padding=padding, dilation=(1,),
                    ceil_mode=False, frac_bits_added=int(meta["frac_bits_added"]),
                    divisor=divisor)
        features = int(np.asarray(node.weight).shape[1])
        _check_close(name, "weight", node.weight,
                     voting_weight(op, features, float(meta["unit_factor"])))
        return op
    elif kind == "sum":
        if not isinstance(node, nir.AvgPool2d):
            raise NIRImportError(f"node {name!r}: average pooling must be an AvgPool2d, got "
                                 f"{type(node).__name__}")
    else:
        raise NIRImportError(f"node {name!r}: unknown pool_kind {kind!r}")
    if isinstance(node, (nir.SumPool2d, nir.AvgPool2d)) and (
            _ints(node.kernel_size) != ks or _ints(node.stride) != stride
            or _ints(node.padding) != padding):
        raise NIRImportError(f"node {name!r}: the NIR kernel_size/stride/padding disagree with "
                             f"its snnquant metadata")
    output_size = _ints(meta["output_size"]) if "output_size" in meta else ()
    return PoolOp(name=str(meta.get("snnquant_name", name)), kind=kind, dims=2, kernel_size=ks,
                  stride=stride, padding=padding, dilation=(1, 1), ceil_mode=False,
                  frac_bits_added=int(meta["frac_bits_added"]), output_size=output_size)


def _read(graph_or_path, nir, max_bytes: Optional[int] = None):
    if isinstance(graph_or_path, (str, os.PathLike)):
        path = os.fspath(graph_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no NIR file at {path!r}")
        _prescan(path, nir, MAX_BYTES if max_bytes is None else max_bytes)
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
            disagree with its metadata; or a field fails its check. Every
            field is checked, before anything is allocated, against its type, its range and the
            others: bit widths (each integer weight fits ``weight_bits``, the membrane range
            ``v_bits``), shifts (``0 <= shift <= 62``, the charge fits int64), bounds
            (``v_min < v_max``, reset and initial value inside), the fractional bits along the
            edges, ``dt > 0``, and every shape against the shapes the graph's edges carry, with
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
    graph = _read(graph_or_path, nir, max_bytes)
    gmeta = dict(graph.metadata or {})
    miss = _missing(gmeta, _GRAPH_KEYS)
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
    units = _text(None, "units", gmeta.get("units", "integer"), ("integer", "real"))
    _validate(graph, nir, entries)
    dt = float(gmeta["dt"])
    ops = []
    for e in entries:
        node = None if e.name is None else graph.nodes[e.name]
        if e.role == "synapse":
            op = _synapse(e.name, node, e.meta, nir)
        elif e.role == "neuron":
            op = _neuron(e.name, node, e.meta, nir, dt)
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
    _check_wiring(graph, entries, desc, units)
    check_network(desc)
    return desc


def _join(e: "_Entry", node) -> JoinOp:
    """An ``'add'`` join from the graph metadata, or an ``'and'``/``'iand'`` join's Threshold
    node (:math:`x_0 + x_1 > 3/2`, :math:`x_0 - x_1 > 1/2`)."""
    meta = e.meta
    for key in ("join_kind", "shifts", "out_frac_bits"):
        if key not in meta:
            raise NIRImportError(f"{_where(e.name) if e.name else e.where} (join) lacks the "
                                 f"snnquant metadata [{key!r}]")
    kind = _text(e.name, "join_kind", meta["join_kind"], ("add",) if node is None
                 else ("and", "iand"))
    if node is not None:
        _check_close(e.name, "threshold", node.threshold, 1.5 if kind == "and" else 0.5)
    shifts = _array(e.name, "shifts", meta["shifts"], integer=True, low=0,
                    high=INT64_HEADROOM_BITS)
    try:
        return JoinOp(name=str(meta.get("snnquant_name", e.name)), kind=kind,
                      shifts=tuple(int(v) for v in shifts.reshape(-1)),
                      out_frac_bits=_int(e.name, "out_frac_bits", meta["out_frac_bits"],
                                         -FRAC_LIMIT, FRAC_LIMIT),
                      inputs=e.inputs)
    except ValueError as exc:
        raise NIRImportError(f"{e.where}: {exc}") from exc


# --- Validation: every field of the graph, before anything is allocated --------------------------

#: The most elements one array of a graph (a weight, a layer's activation) may hold; a file that
#: declares more is refused before it is read (about 512 MiB of float64).
MAX_ELEMENTS = 1 << 26
#: The most bytes all datasets of a ``.nir`` file may hold together, each element counted at
#: ``max(itemsize, 8)`` bytes (``from_nir(..., max_bytes=...)`` raises it): 1 GiB.
MAX_BYTES = 1 << 30
_SCALAR = object()


def _where(name: Optional[str]) -> str:
    return "graph metadata" if name is None else f"node {name!r}"


def _bad(name: Optional[str], field: str, value, why: str) -> NIRImportError:
    return NIRImportError(f"{_where(name)}: {field}={_show(value)} {why}")


def _show(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.ndim > 0:
        if value.size > 6:
            return f"array of shape {tuple(value.shape)}"
        return repr(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _as_int(value) -> Optional[int]:
    """``value`` as a Python int if it is one integral scalar (not a bool), else ``None``."""
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            return None
        value = value[()]
    if isinstance(value, np.bool_):
        return None
    return as_int(value, integral_float=True)


def _int(name, field, value, low: int, high: int) -> int:
    v = _as_int(value)
    if v is None or not low <= v <= high:
        raise _bad(name, field, value, f"must be an integer in [{low}, {high}]")
    return v


def _real(name, field, value, positive: bool = False) -> float:
    v = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not np.isfinite(v) or (positive and not v > 0):
        raise _bad(name, field, value, "must be a finite number" + (" > 0" if positive else ""))
    return float(v)


def _flag(name, field, value) -> bool:
    v = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if _as_int(v) in (0, 1):
        return bool(_as_int(v))
    raise _bad(name, field, value, "must be a bool")


def _text(name, field, value, allowed) -> str:
    v = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if not isinstance(v, str) or v not in allowed:
        raise _bad(name, field, value, f"must be one of {list(allowed)}")
    return v


def _array(name, field, value, *, integer: bool, shape=None, low=None, high=None,
           positive: bool = False) -> np.ndarray:
    """A numeric array (int64 when ``integer``), checked for size, shape, finiteness and range."""
    try:
        a = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is not an array is refused below
        a = np.asarray(None, dtype=object)
    if a.dtype.kind not in "biuf":
        raise _bad(name, field, value, "must be a numeric array")
    if a.size > MAX_ELEMENTS:
        raise _bad(name, field, value, f"has {a.size} elements, more than the {MAX_ELEMENTS} a "
                                       f"snnquant graph may hold")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise _bad(name, field, value, f"has shape {tuple(a.shape)}, expected {tuple(shape)}")
    a = a.astype(np.float64) if a.dtype.kind in "bf" else a
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a)
        if integer:
            bad |= np.isfinite(a) & ((a != np.round(a)) | (np.abs(a) >= 2.0 ** 63))
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise _bad(name, field, value, f"holds {a[i]!r} at index {i}: it must hold finite "
                                           f"{'integers' if integer else 'numbers'}")
        if integer:
            a = a.astype(np.int64)
    elif a.dtype.kind == "u" and a.size and int(a.max()) >= 2 ** 63:
        raise _bad(name, field, value, "holds values beyond int64")
    else:
        a = a.astype(np.int64) if integer else a.astype(np.float64)
    for limit, out in ((low, a < low if low is not None else None),
                       (high, a > high if high is not None else None)):
        if out is not None and out.any():
            i = tuple(int(j) for j in np.argwhere(out)[0])
            raise _bad(name, field, value, f"holds {a[i].item()!r} at index {i}, outside "
                                           f"[{low}, {high}]")
    if positive and a.size and not (a > 0).all():
        i = tuple(int(j) for j in np.argwhere(~(a > 0))[0])
        raise _bad(name, field, value, f"holds {a[i].item()!r} at index {i}: it must be > 0")
    return a


def _node_meta(name: str, node) -> Tuple[dict, str]:
    """A node's snnquant metadata and its role (``snnquant_op``), or an error naming the node."""
    meta = dict(getattr(node, "metadata", None) or {})
    if "snnquant_op" not in meta:
        raise NIRImportError(f"node {name!r} ({type(node).__name__}) lacks the snnquant "
                             f"metadata ['snnquant_op', ...]; from_nir reads graphs written "
                             f"by snnquant.export.to_nir")
    role = meta["snnquant_op"]
    role = role.decode("utf-8", "replace") if isinstance(role, bytes) else str(role)
    if role not in _OP_ROLES + ("part", "scale"):
        raise _bad(name, "snnquant_op", role, "is unknown (synapse, neuron, pool, flatten, join, "
                                              "part or scale)")
    return meta, role


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _shape(name, field, value) -> Tuple[int, ...]:
    a = _array(name, field, value, integer=True, low=1)
    if a.ndim != 1 or not 1 <= a.size <= 8:
        raise _bad(name, field, value, "must be a per-sample shape (1 to 8 positive sizes)")
    shape = tuple(int(v) for v in a)
    if _size(shape) > MAX_ELEMENTS:
        raise _bad(name, field, value, f"has {_size(shape)} elements per sample, more than "
                                       f"{MAX_ELEMENTS}")
    return shape


def _per_dim(name, field, value, n: int, low: int) -> Tuple[int, ...]:
    a = _array(name, field, value, integer=True, low=low, high=MAX_ELEMENTS)
    if a.size == 1:
        return (int(a.reshape(-1)[0]),) * n
    if a.shape != (n,):
        raise _bad(name, field, value, f"must hold 1 or {n} values")
    return tuple(int(v) for v in a)


def _window(name, shape, kernel, stride, padding, dilation, what: str) -> Tuple[int, ...]:
    """Output sizes of a convolution or pooling window over ``shape``'s spatial sizes."""
    out = []
    for size, k, s, p, d in zip(shape, kernel, stride, padding, dilation):
        o = (size + 2 * p - d * (k - 1) - 1) // s + 1
        if o < 1:
            raise NIRImportError(f"{_where(name)}: the {what} kernel_size={kernel} (stride "
                                 f"{stride}, padding {padding}, dilation {dilation}) does not fit "
                                 f"its input of spatial size {tuple(shape)}")
        out.append(o)
    return tuple(out)


def _check_graph_metadata(gmeta) -> None:
    from ..ir.description import READABLE_FORMAT_VERSIONS

    _real(None, "dt", gmeta["dt"], positive=True)
    _int(None, "input_max", gmeta["input_max"], 0, 1 << INT64_HEADROOM_BITS)
    _text(None, "output_kind", gmeta["output_kind"], ("spikes", "current"))
    _int(None, "output_frac_bits", gmeta["output_frac_bits"], -FRAC_LIMIT, FRAC_LIMIT)
    ref = _text(None, "reference_dtype", gmeta["reference_dtype"], ("float32", "float64"))
    mantissa = {"float32": 24, "float64": 53}[ref]
    if _as_int(gmeta["mantissa_bits"]) != mantissa:
        raise _bad(None, "mantissa_bits", gmeta["mantissa_bits"],
                   f"must be {mantissa}, the significand of reference_dtype {ref!r}")
    if _as_int(gmeta["format_version"]) not in READABLE_FORMAT_VERSIONS:
        raise _bad(None, "format_version", gmeta["format_version"],
                   f"must be one of {list(READABLE_FORMAT_VERSIONS)}")


def _check_synapse(name, node, meta, nir, shape) -> Tuple[Tuple[int, ...], int]:
    """Check a synapse node against its input ``shape``; return its output shape and the
    fractional bits of its output."""
    _require(name, meta, _SYNAPSE_KEYS, "synapse")
    bits = _int(name, "weight_bits", meta["weight_bits"], 1, 32)
    weight_nir = _array(name, "weight", node.weight, integer=False)
    w = _array(name, "weight_int", meta["weight_int"], integer=True, shape=weight_nir.shape)
    if w.size == 0:
        raise _bad(name, "weight_int", w, "is empty")
    lo, hi = weight_range(bits, bool(w.size) and int(w.min()) < 0)
    _array(name, "weight_int", w, integer=True, low=lo, high=hi)  # names the first one outside
    if isinstance(node, (nir.Affine, nir.Linear)):
        if w.ndim != 2 or len(shape) != 1 or w.shape[1] != shape[0]:
            raise _bad(name, "weight", weight_nir, f"of shape {tuple(w.shape)} does not take the "
                                                   f"input of shape {shape} on its edge")
        out = (int(w.shape[0]),)
    elif isinstance(node, (nir.Conv1d, nir.Conv2d)):
        n = 1 if isinstance(node, nir.Conv1d) else 2
        groups = _int(name, "groups", node.groups, 1, MAX_ELEMENTS)
        if w.ndim != n + 2 or len(shape) != n + 1 or w.shape[1] * groups != shape[0] \
                or w.shape[0] % groups:
            raise _bad(name, "weight", weight_nir, f"of shape {tuple(w.shape)} with groups={groups} "
                                                   f"does not take the input of shape {shape} on "
                                                   f"its edge")
        if getattr(node, "input_shape", None) is not None:
            declared = _array(name, "input_shape", node.input_shape, integer=True)
            if tuple(declared.reshape(-1)) != tuple(shape[1:]):
                raise _bad(name, "input_shape", node.input_shape, f"differs from the spatial "
                                                                  f"size {shape[1:]} on its edge")
        stride = _per_dim(name, "stride", node.stride, n, 1)
        dilation = _per_dim(name, "dilation", node.dilation, n, 1)
        padding = node.padding.decode() if isinstance(node.padding, bytes) else node.padding
        kernel = tuple(int(k) for k in w.shape[2:])
        if isinstance(padding, str):
            _text(name, "padding", padding, ("same", "valid"))
            spatial = shape[1:] if padding == "same" else _window(
                name, shape[1:], kernel, stride, (0,) * n, dilation, "convolution")
        else:
            pad = _per_dim(name, "padding", padding, n, 0)
            spatial = _window(name, shape[1:], kernel, stride, pad, dilation, "convolution")
        out = (int(w.shape[0]),) + tuple(spatial)
    else:
        raise NIRImportError(f"node {name!r}: a synapse must be Affine, Linear, Conv1d or "
                             f"Conv2d, got {type(node).__name__}")
    channels = (int(w.shape[0]),)
    _array(name, "weight_scale", meta["weight_scale"], integer=False, positive=True,
           shape=channels if np.asarray(meta["weight_scale"]).size != 1 else None)
    _array(name, "weight_multiplier", meta["weight_multiplier"], integer=True, low=1,
           high=1 << 52, shape=channels if np.asarray(meta["weight_multiplier"]).size != 1 else None)
    _array(name, "weight_shift", meta["weight_shift"], integer=True, low=0,
           high=INT64_HEADROOM_BITS,
           shape=channels if np.asarray(meta["weight_shift"]).size != 1 else None)
    _real(name, "unit_factor", meta["unit_factor"], positive=True)
    _int(name, "in_frac_bits", meta["in_frac_bits"], -FRAC_LIMIT, FRAC_LIMIT)
    out_frac = _int(name, "out_frac_bits", meta["out_frac_bits"], -FRAC_LIMIT, FRAC_LIMIT)
    if "bias_int" in meta:
        bias_bits = None
        if "bias_bits" in meta:
            bias_bits = _int(name, "bias_bits", meta["bias_bits"], 1, 64)
        high = (1 << INT64_HEADROOM_BITS) if bias_bits is None else (1 << (bias_bits - 1)) - 1
        _array(name, "bias_int", meta["bias_int"], integer=True, shape=channels,
               low=-high - 1, high=high)
        _array(name, "bias", node.bias, integer=False, shape=channels)
    if _size(out) > MAX_ELEMENTS:
        raise NIRImportError(f"node {name!r}: its output of shape {out} has more than "
                             f"{MAX_ELEMENTS} elements")
    return out, out_frac


def _check_neuron(name, node, meta, nir, shape) -> None:
    _require(name, meta, _NEURON_KEYS, "neuron")
    if not isinstance(node, (nir.IF, nir.LIF)):
        raise NIRImportError(f"node {name!r}: a neuron must be IF or LIF, got {type(node).__name__}")
    params = ("r", "v_threshold", "v_reset") + (("tau", "v_leak") if isinstance(node, nir.LIF)
                                                 else ())
    for field in params:
        a = _array(name, field, getattr(node, field), integer=False)
        if a.ndim and tuple(a.shape) != tuple(shape):
            raise _bad(name, field, a, f"has shape {tuple(a.shape)}, but the edge into the node "
                                       f"carries {shape}")
    v_bits = _int(name, "v_bits", meta["v_bits"], 1, 32)
    v_min = _int(name, "v_min", meta["v_min"], -(1 << (v_bits - 1)), (1 << v_bits) - 1)
    v_max = _int(name, "v_max", meta["v_max"], -(1 << (v_bits - 1)), (1 << v_bits) - 1)
    if v_min >= v_max or (v_min < 0 and v_max >= 1 << (v_bits - 1)):
        raise _bad(name, "v_max", meta["v_max"], f"with v_min={v_min} is not a range of "
                                                 f"{v_bits}-bit integers (v_min < v_max)")
    for field in ("v_reset_int", "v_init_int"):
        _int(name, field, meta[field], v_min, v_max)
    theta = _int(name, "threshold_int", meta["threshold_int"], -(1 << 40), 1 << 40)
    _real(name, "membrane_scale", meta["membrane_scale"], positive=True)
    _real(name, "membrane_unit", meta["membrane_unit"], positive=True)
    k = _int(name, "leak_shift", meta["leak_shift"], 0, INT64_HEADROOM_BITS)
    m = _int(name, "leak_multiplier", meta["leak_multiplier"], 1, 1 << k)
    _int(name, "leak_round_shift", meta["leak_round_shift"], 0, k)
    _flag(name, "decay_input", meta["decay_input"])
    exact = _flag(name, "exact", meta["exact"])
    if isinstance(node, nir.IF) and (k, m) != (0, 1):
        raise _bad(name, "leak_shift", meta["leak_shift"], f"and leak_multiplier={m} must be 0 "
                                                           f"and 1 for an IF neuron")
    if exact and (m != 1 or _as_int(meta["leak_round_shift"]) != 0):
        raise _bad(name, "exact", meta["exact"], f"needs leak_multiplier 1 and leak_round_shift "
                                                 f"0 (got {m} and {meta['leak_round_shift']!r})")
    input_shift = _int(name, "input_shift", meta["input_shift"], 0, INT64_HEADROOM_BITS)
    d = _int(name, "grid_shift", meta["grid_shift"], 0, INT64_HEADROOM_BITS)
    in_frac = _int(name, "in_frac_bits", meta["in_frac_bits"], -FRAC_LIMIT, FRAC_LIMIT)
    grid_frac = _int(name, "grid_frac_bits", meta["grid_frac_bits"], -FRAC_LIMIT, FRAC_LIMIT)
    if grid_frac != in_frac + input_shift:
        raise _bad(name, "input_shift", meta["input_shift"], f"must be grid_frac_bits - "
                                                             f"in_frac_bits = {grid_frac - in_frac}")
    # the simulator's bound (the exporter's): the largest charge term fits int64
    reach = max(abs(v_min), abs(v_max)) + abs(theta) + 1
    if math.log2(reach) + d + max(k, math.log2(m)) + 2 > INT64_HEADROOM_BITS:
        raise _bad(name, "grid_shift", meta["grid_shift"], f"with leak_shift={k} and the "
                                                           f"membrane range [{v_min}, {v_max}] "
                                                           f"overflows int64 in the charge")


def _check_pool(name, node, meta, nir, shape) -> Tuple[Tuple[int, ...], int]:
    _require(name, meta, _POOL_KEYS, "pool")
    kind = _text(name, "pool_kind", meta["pool_kind"], ("max", "sum"))
    ks = _per_dim(name, "kernel_size", meta["kernel_size"], 2, 1)
    stride = _per_dim(name, "stride", meta["stride"], 2, 1)
    padding = _per_dim(name, "padding", meta["padding"], 2, 0)
    if any(p > k // 2 for p, k in zip(padding, ks)):
        raise _bad(name, "padding", meta["padding"], f"must be at most half the kernel {ks}")
    added = _int(name, "frac_bits_added", meta["frac_bits_added"], 0, INT64_HEADROOM_BITS)
    if (kind == "max" and added) or (kind == "sum" and 1 << added != ks[0] * ks[1]):
        raise _bad(name, "frac_bits_added", meta["frac_bits_added"],
                   f"does not match {kind} pooling over a {ks} window")
    if len(shape) != 3:
        raise NIRImportError(f"node {name!r}: 2-d pooling needs an input [C, H, W], the edge "
                             f"into it carries {shape}")
    if isinstance(node, nir.Conv2d):
        _array(name, "weight", node.weight, integer=False,
               shape=(shape[0], shape[0]) + tuple(ks))
    spatial = _window(name, shape[1:], ks, stride, padding, (1, 1), "pooling")
    if "output_size" in meta and _ints(meta["output_size"]) != spatial:
        raise _bad(name, "output_size", meta["output_size"], f"differs from the {spatial} that "
                                                             f"the pooling gives its input {shape}")
    return (shape[0],) + spatial, added


def _check_flatten(name, node, shape) -> Tuple[int, ...]:
    n = len(shape)
    start = _int(name, "start_dim", node.start_dim, -n, n - 1)
    end = _int(name, "end_dim", node.end_dim, -n, n - 1)
    start, end = start % n, end % n
    if start > end:
        raise _bad(name, "end_dim", node.end_dim, f"is before start_dim={start} for an input "
                                                  f"of shape {shape}")
    return shape[:start] + (_size(shape[start:end + 1]),) + shape[end + 1:]


def _edge_shape(graph, node_name: str, key: str, field: str):
    types = getattr(graph.nodes[node_name], field, None) or {}
    value = types.get(key) if isinstance(types, dict) else None
    return None if value is None else _shape(node_name, f"{field}[{key!r}]", value)


def _validate(graph, nir, entries: List["_Entry"]) -> None:
    """Check every field of the graph against its type, its range and the others (bit widths,
    shifts, bounds, the dtypes that will hold the values, shapes and fractional bits along the
    edges, join operands), raising one :class:`NIRImportError` that names the node, the field
    and the value."""
    gmeta = dict(graph.metadata or {})
    _check_graph_metadata(gmeta)
    shape = _edge_shape(graph, "input", "input", "input_type")
    if shape is None:
        shape = _edge_shape(graph, "input", "output", "output_type")
    if shape is None:
        raise NIRImportError("node 'input': input_type holds no shape")
    shapes, fracs = {NETWORK_INPUT: shape}, {NETWORK_INPUT: 0}
    for e in entries:
        name, meta, role = e.name, e.meta, e.role
        node = None if name is None else graph.nodes[name]
        shape, frac = shapes[e.inputs[0]], fracs[e.inputs[0]]
        if role == "synapse":
            if _as_int(meta.get("in_frac_bits")) != frac and "in_frac_bits" in meta:
                raise _bad(name, "in_frac_bits", meta["in_frac_bits"],
                           f"must be {frac}, the fractional bits of the edge into it")
            shape, frac = _check_synapse(name, node, meta, nir, shape)
        elif role == "neuron":
            _check_neuron(name, node, meta, nir, shape)
            if _as_int(meta["in_frac_bits"]) != frac:
                raise _bad(name, "in_frac_bits", meta["in_frac_bits"],
                           f"must be {frac}, the fractional bits of the edge into it")
            frac = 0
        elif role == "pool":
            shape, added = (_check_voting(name, node, meta, nir, shape) if "dims" in meta
                            else _check_pool(name, node, meta, nir, shape))
            frac += added
        elif role == "flatten":
            if not isinstance(node, nir.Flatten):
                raise NIRImportError(f"node {name!r}: flatten must be a Flatten node")
            shape = _check_flatten(name, node, shape)
        else:
            shape, frac = _check_join(e, shapes, fracs)
        for part in e.parts:
            part_node = graph.nodes[part]
            for field in ("threshold", "v_threshold", "v_reset", "r"):
                if hasattr(part_node, field):
                    a = _array(part, field, getattr(part_node, field), integer=False)
                    if a.ndim and tuple(a.shape) != tuple(shape):
                        raise _bad(part, field, a, f"has shape {tuple(a.shape)}, but the edge "
                                                   f"into the node carries {shape}")
        shapes[e.index], fracs[e.index] = shape, frac
    if not entries:
        raise NIRImportError("the graph has no operations between 'input' and 'output'")
    out = _edge_shape(graph, "output", "output", "output_type")
    if out is not None and out != shape:
        raise NIRImportError(f"node 'output': output_type {out} differs from the shape {shape} "
                             f"that the last node gives")


def _check_join(e: "_Entry", shapes, fracs) -> Tuple[Tuple[int, ...], int]:
    """A join's operands have one shape, and its shifts put them on its grid."""
    meta, where = e.meta, e.where
    operand_shapes = [shapes[j] for j in e.inputs]
    if len(set(operand_shapes)) != 1:
        raise NIRImportError(f"{where}: the join's operands {list(e.inputs)} have the shapes "
                             f"{operand_shapes}; a join needs one shape")
    shifts = _array(e.name, "shifts", meta.get("shifts"), integer=True, low=0,
                    high=INT64_HEADROOM_BITS)
    out_frac = _int(e.name, "out_frac_bits", meta.get("out_frac_bits"), -FRAC_LIMIT,
                    FRAC_LIMIT)
    if shifts.shape != (len(e.inputs),) or any(
            fracs[j] + int(k) != out_frac for j, k in zip(e.inputs, shifts)):
        raise _bad(e.name, "shifts", meta.get("shifts"),
                   f"must put the operands' fractional bits {[fracs[j] for j in e.inputs]} on "
                   f"out_frac_bits={out_frac} ({where})")
    return operand_shapes[0], out_frac


def _check_voting(name, node, meta, nir, shape) -> Tuple[Tuple[int, ...], int]:
    """A 1-d average over groups of ``kernel_size`` features (SpikingJelly's VotingLayer)."""
    ks = _per_dim(name, "kernel_size", meta["kernel_size"], 1, 1)
    added = _int(name, "frac_bits_added", meta["frac_bits_added"], 0, INT64_HEADROOM_BITS)
    divisor = _int(name, "divisor", meta.get("divisor", 1), 1, MAX_ELEMENTS)
    if (1 << added) * divisor != ks[0]:
        raise _bad(name, "divisor", meta.get("divisor", 1), f"times 2^frac_bits_added must be "
                                                            f"the group size {ks[0]}")
    if len(shape) != 1 or shape[0] % ks[0]:
        raise NIRImportError(f"node {name!r}: an average over groups of {ks[0]} features needs "
                             f"an input [F] with F a multiple of {ks[0]}, the edge carries {shape}")
    _array(name, "weight", node.weight, integer=False, shape=(shape[0] // ks[0], shape[0]))
    return (shape[0] // ks[0],), added


def _node_types(nir) -> set:
    todo, seen = [nir.NIRNode], set()
    while todo:
        cls = todo.pop()
        seen.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return seen


def _prescan(path: str, nir, max_bytes: int) -> None:
    """Check a ``.nir`` file's links, declared dataset sizes and node types before ``nir.read``
    reads it: an array declared with a huge shape (stored compressed or as a fill value, the file
    stays small), many large arrays together, or a link to a dataset in another file would
    otherwise be allocated first and fail with ``MemoryError``. Every dataset counts, compressed
    or not, at ``max(itemsize, 8)`` bytes per element (what it takes once converted to int64 or
    float64); links (external or soft) are refused: ``nir.write`` writes none."""
    import h5py

    known = _node_types(nir)
    problems: List[NIRImportError] = []
    total = {"elements": 0, "bytes": 0}

    def walk(group, prefix: str) -> None:
        for key in group:
            if problems:
                return
            link, where = group.get(key, getlink=True), f"{prefix}{key}"
            if isinstance(link, (h5py.ExternalLink, h5py.SoftLink)):
                target = (f"{link.filename}:{link.path}" if isinstance(link, h5py.ExternalLink)
                          else link.path)
                kind = "an external" if isinstance(link, h5py.ExternalLink) else "a soft"
                problems.append(NIRImportError(
                    f"{where!r} is {kind} link to {target!r}; a NIR file holds its arrays "
                    f"itself (nir.write writes no links), so from_nir does not follow it"))
                return
            obj = group[key]
            if isinstance(obj, h5py.Group):
                walk(obj, where + "/")
            else:
                visit(where, obj)

    def visit(key, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        parts = key.split("/")
        name = parts[2] if len(parts) > 3 and parts[1] == "nodes" else None
        field = parts[-1] if name is None else "/".join(parts[3:])
        field = field[len("metadata/"):] if field.startswith("metadata/") else field
        size = int(obj.size or 0)
        total["elements"] += size
        total["bytes"] += size * max(int(obj.dtype.itemsize), 8)
        if size > MAX_ELEMENTS:
            problems.append(NIRImportError(
                f"{_where(name)}: {field} declares shape {tuple(obj.shape)} ({obj.size} "
                f"elements), more than the {MAX_ELEMENTS} a snnquant graph may hold"))
        elif total["bytes"] > max_bytes:
            problems.append(NIRImportError(
                f"the file's datasets up to {key!r} hold {total['elements']} elements "
                f"({total['bytes']} bytes as 64-bit values), more than max_bytes={max_bytes} "
                f"(nir_import.MAX_BYTES by default); pass from_nir(..., max_bytes=...) to read "
                f"a larger graph"))
        elif name is not None and field == "type" and obj.shape == ():
            value = obj[()]
            value = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if value not in known:
                problems.append(_bad(name, "type", value, f"is not a NIR node type (nir "
                                                          f"{nir.__version__} knows "
                                                          f"{sorted(known)})"))

    try:
        with h5py.File(path, "r") as handle:
            walk(handle, "")
    except (OSError, ValueError) as exc:
        raise NIRImportError(f"could not read the NIR file {path!r}: {exc or type(exc).__name__}") \
            from exc
    if problems:
        raise NIRImportError(f"{problems[0]} (in {path!r})")


def _t(v) -> torch.Tensor:
    return torch.as_tensor(np.asarray(v, dtype=np.float64))


def _pad(p):
    if isinstance(p, bytes):
        p = p.decode()
    return p if isinstance(p, str) else _ints(p) if np.asarray(p).size > 1 else int(np.asarray(p))


def _topological(pred: Dict[str, List[str]]) -> List[str]:
    """Node names with every node after its predecessors (the graph has no cycle)."""
    order, seen = [], set()

    def visit(name):
        stack = [(name, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((p, False) for p in pred[node] if p not in seen)

    for name in sorted(pred):
        visit(name)
    return order


def _step(n, name, h, dt, N, states, rec, nir):
    """One time step of one NIR node on its summed input ``h`` (float64)."""
    if isinstance(n, nir.Affine):
        return h @ _t(n.weight).T + _t(n.bias)
    if isinstance(n, nir.Linear):
        return h @ _t(n.weight).T
    if isinstance(n, nir.Scale):
        return h * _t(n.scale)
    if isinstance(n, nir.Conv2d):
        return F.conv2d(h, _t(n.weight), _t(n.bias), _ints(n.stride) if np.asarray(
            n.stride).size > 1 else int(np.asarray(n.stride)), _pad(n.padding),
            _ints(n.dilation) if np.asarray(n.dilation).size > 1 else
            int(np.asarray(n.dilation)), int(np.asarray(n.groups)))
    if isinstance(n, nir.Conv1d):
        return F.conv1d(h, _t(n.weight), _t(n.bias), int(np.asarray(n.stride).reshape(-1)[0]),
                        _pad(n.padding), int(np.asarray(n.dilation).reshape(-1)[0]),
                        int(np.asarray(n.groups)))
    if isinstance(n, nir.SumPool2d):
        return F.avg_pool2d(h, _ints(n.kernel_size), _ints(n.stride), _ints(n.padding),
                            divisor_override=1)
    if isinstance(n, nir.AvgPool2d):
        return F.avg_pool2d(h, _ints(n.kernel_size), _ints(n.stride), _ints(n.padding))
    if isinstance(n, nir.Flatten):
        s, e = int(n.start_dim), int(n.end_dim)
        return h.flatten(s + 1 if s >= 0 else s, e + 1 if e >= 0 else e)
    if isinstance(n, nir.Threshold):
        z = h > _t(n.threshold)
        if rec is not None:
            r = rec.setdefault(name, {"spikes": [], "v": []})
            r["spikes"].append(z.to(torch.int8))
            r["v"].append(h)
        return z.to(torch.float64)
    if isinstance(n, (nir.IF, nir.LIF)):
        v_reset = _t(n.v_reset)
        v = states.get(name)
        if v is None:
            v = v_reset.expand((N,) + tuple(v_reset.shape)).clone()
        if isinstance(n, nir.IF):
            v = v + dt * _t(n.r) * h
        else:
            v = v + (dt / _t(n.tau)) * ((_t(n.v_leak) - v) + _t(n.r) * h)
        z = v > _t(n.v_threshold)
        if rec is not None:
            r = rec.setdefault(name, {"spikes": [], "v": []})
            r["spikes"].append(z.to(torch.int8))
            r["v"].append(v)
        states[name] = torch.where(z, v_reset.expand_as(v), v)
        return z.to(torch.float64)
    raise NotImplementedError(f"simulate_nir: node {name!r} of type {type(n).__name__} is not "
                              f"supported")


def simulate_nir(graph_or_path, x_seq: torch.Tensor, *, dt: Optional[float] = None,
                 record: bool = False):
    r"""Run a NIR graph by NIR's equations, in float64, with Euler steps of ``dt``.

    .. math::

        \text{IF:}\ v \leftarrow v + dt\, r\, I,\qquad
        \text{LIF:}\ v \leftarrow v + \tfrac{dt}{\tau}\big((v_{leak} - v) + r I\big),\qquad
        z = [v > v_{threshold}],\qquad v \leftarrow v_{reset}\ \text{where}\ z = 1

    This is what a consumer that implements the primitives as NIR specifies computes (no
    rounding, no saturation). Membranes start at ``v_reset`` (NIR leaves the initial state open;
    snnquant starts there). A node with several incoming edges reads their sum (NIR's rule; a
    residual ``'add'`` join is written so), nodes run in topological order, and a graph with a
    cycle is refused. Supported nodes: ``Affine``, ``Linear``, ``Scale``, ``Conv1d``,
    ``Conv2d``, ``SumPool2d``, ``AvgPool2d``, ``Flatten`` (per-sample dimensions), ``IF``,
    ``LIF``, ``Threshold``.

    Args:
        graph_or_path: a ``nir.NIRGraph`` or the path of a ``.nir`` file.
        x_seq: input ``[T, N, ...]`` (per-sample shape as the graph's input).
        dt: time step; default: ``graph.metadata['dt']``.
        record: also return, per IF/LIF/Threshold node, ``{'spikes': [T, N, ...] int8,
            'v': [T, N, ...] float64}`` with the membrane after the charge, before the reset
            (the threshold node's input for ``Threshold``).

    Returns:
        The output ``[T, N, ...]`` (float64), and with ``record`` the per-node dict.
    """
    nir = import_nir("simulate_nir")
    graph = _read(graph_or_path, nir)
    if dt is None:
        if "dt" not in (graph.metadata or {}):
            raise ValueError("dt is None and the graph has no 'dt' in its metadata; pass dt=")
        dt = float(graph.metadata["dt"])
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not dt > 0:
        raise ValueError(f"dt must be a positive number, got {dt!r}")
    if not isinstance(x_seq, torch.Tensor) or x_seq.dim() < 3:
        raise ValueError(f"x_seq must be a tensor [T, N, ...], got "
                         f"{getattr(x_seq, 'shape', type(x_seq).__name__)}")
    pred = _check_edges(graph)
    order = _topological(pred)
    x_seq = x_seq.to(torch.float64)
    T, N = x_seq.shape[0], x_seq.shape[1]
    states: Dict[str, torch.Tensor] = {}
    rec: Dict[str, Dict[str, List[torch.Tensor]]] = {}
    outs = []
    for t in range(T):
        values = {"input": x_seq[t]}
        for name in order:
            if name == "input":
                continue
            if not pred[name]:
                raise ValueError(f"simulate_nir: node {name!r} has no incoming edge")
            h = sum(values[p] for p in pred[name])  # NIR sums the edges into a node
            values[name] = h if name == "output" else _step(
                graph.nodes[name], name, h, dt, N, states, rec if record else None, nir)
        outs.append(values["output"])
    out = torch.stack(outs)
    if not record:
        return out
    return out, {k: {kk: torch.stack(vv) for kk, vv in r.items()} for k, r in rec.items()}
