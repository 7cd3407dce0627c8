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

import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .description import FlattenOp, IntegerNetwork, NeuronOp, PoolOp, SynapseOp
from .nir_graph import SCHEMA_VERSION, import_nir

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
    """Node names from ``input`` to ``output`` of a sequential graph."""
    if "input" not in graph.nodes or "output" not in graph.nodes:
        raise NIRImportError(f"the graph needs nodes named 'input' and 'output', it has "
                             f"{sorted(graph.nodes)}")
    succ: Dict[str, List[str]] = {}
    for a, b in graph.edges:
        succ.setdefault(a, []).append(b)
    order, node = [], "input"
    while node != "output":
        nxt = succ.get(node, [])
        if len(nxt) != 1:
            raise NIRImportError(f"node {node!r} has {len(nxt)} outgoing edges {nxt}; only "
                                 f"sequential graphs (input -> ... -> output) are supported")
        node = nxt[0]
        if node in order or node not in graph.nodes:
            raise NIRImportError(f"edge to {node!r}: unknown node or a cycle")
        order.append(node)
    if len(order) + 1 != len(graph.nodes):
        extra = sorted(set(graph.nodes) - set(order) - {"input"})
        raise NIRImportError(f"nodes {extra} are not on the path from 'input' to 'output'")
    return order[:-1]


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


def _int_dtype(bits: int) -> torch.dtype:
    return torch.int8 if bits <= 8 else torch.int16 if bits <= 16 else torch.int32


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
                     weight=w_int.to(_int_dtype(bits)), weight_bits=bits,
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
    return PoolOp(name=str(meta.get("snnquant_name", name)), kind=kind, dims=2, kernel_size=ks,
                  stride=stride, padding=padding, dilation=(1, 1), ceil_mode=False,
                  frac_bits_added=int(meta["frac_bits_added"]))


def _read(graph_or_path, nir):
    if isinstance(graph_or_path, (str, os.PathLike)):
        path = os.fspath(graph_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no NIR file at {path!r}")
        try:
            return nir.read(path, type_check=False)
        except Exception as exc:
            raise NIRImportError(f"could not read the NIR file {path!r}: {exc}") from exc
    if isinstance(graph_or_path, nir.NIRGraph):
        return graph_or_path
    raise TypeError(f"graph_or_path must be a nir.NIRGraph or a path to a .nir file, got "
                    f"{type(graph_or_path).__name__}")


def from_nir(graph_or_path) -> IntegerNetwork:
    r"""Read a NIR graph written by :func:`~snnquant.export.to_nir` back as an integer network.

    Every layer is rebuilt from its node's snnquant metadata (integer weights and bias, grid
    shifts, membrane range, threshold, reset and leak), and the node's NIR parameters are checked
    against it (:math:`W_{nir} = c\, w\, s_w`, :math:`V_{th,nir} = (\theta - \tfrac12) u`, ...), so
    :class:`~snnquant.export.IntegerSNN` on the result gives the spikes of the exported network.

    Args:
        graph_or_path: a ``nir.NIRGraph`` or the path of a ``.nir`` file.

    Returns:
        The :class:`~snnquant.export.IntegerNetwork`.

    Raises:
        NIRImportError: the graph lacks snnquant's metadata (the message lists the missing keys and
            the node), uses a schema version this snnquant does not read, is not sequential, or
            its NIR parameters disagree with its metadata.
        ImportError: ``nir`` is missing or older than 1.0.6.
    """
    nir = import_nir("from_nir")
    graph = _read(graph_or_path, nir)
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
    dt = float(gmeta["dt"])
    ops = []
    for name in _chain(graph):
        node = graph.nodes[name]
        meta = dict(getattr(node, "metadata", None) or {})
        if "snnquant_op" not in meta:
            raise NIRImportError(f"node {name!r} ({type(node).__name__}) lacks the snnquant "
                                 f"metadata ['snnquant_op', ...]; from_nir reads graphs written "
                                 f"by snnquant.export.to_nir")
        role = str(meta["snnquant_op"])
        if role == "synapse":
            ops.append(_synapse(name, node, meta, nir))
        elif role == "neuron":
            ops.append(_neuron(name, node, meta, nir, dt))
        elif role == "pool":
            ops.append(_pool(name, node, meta, nir))
        elif role == "flatten":
            if not isinstance(node, nir.Flatten):
                raise NIRImportError(f"node {name!r}: flatten must be a Flatten node")
            ops.append(FlattenOp(name=str(meta.get("snnquant_name", name)),
                                 start_dim=int(node.start_dim), end_dim=int(node.end_dim)))
        elif role == "part":
            if not ops or not isinstance(ops[-1], PoolOp) or ops[-1].kind != "max":
                raise NIRImportError(f"node {name!r}: a 'part' node must follow the max pooling "
                                     f"it belongs to")
        else:
            raise NIRImportError(f"node {name!r}: unknown snnquant_op {role!r}")
    if not ops:
        raise NIRImportError("the graph has no operations between 'input' and 'output'")
    notes = [line for line in str(gmeta.get("notes", "")).split("\n") if line]
    return IntegerNetwork(ops=ops, input_max=int(gmeta["input_max"]),
                          output_kind=str(gmeta["output_kind"]),
                          output_frac_bits=int(gmeta["output_frac_bits"]),
                          reference_dtype=str(gmeta["reference_dtype"]),
                          mantissa_bits=int(gmeta["mantissa_bits"]),
                          format_version=int(gmeta["format_version"]), notes=notes)


def _t(v) -> torch.Tensor:
    return torch.as_tensor(np.asarray(v, dtype=np.float64))


def _pad(p):
    if isinstance(p, bytes):
        p = p.decode()
    return p if isinstance(p, str) else _ints(p) if np.asarray(p).size > 1 else int(np.asarray(p))


def simulate_nir(graph_or_path, x_seq: torch.Tensor, *, dt: Optional[float] = None,
                 record: bool = False):
    r"""Run a sequential NIR graph by NIR's equations, in float64, with Euler steps of ``dt``.

    .. math::

        \text{IF:}\ v \leftarrow v + dt\, r\, I,\qquad
        \text{LIF:}\ v \leftarrow v + \tfrac{dt}{\tau}\big((v_{leak} - v) + r I\big),\qquad
        z = [v > v_{threshold}],\qquad v \leftarrow v_{reset}\ \text{where}\ z = 1

    This is what a consumer that implements the primitives as NIR specifies computes (no
    rounding, no saturation). Membranes start at ``v_reset`` (NIR leaves the initial state open;
    snnquant starts there). Supported nodes: ``Affine``, ``Linear``, ``Conv1d``, ``Conv2d``,
    ``SumPool2d``, ``AvgPool2d``, ``Flatten`` (per-sample dimensions), ``IF``, ``LIF``,
    ``Threshold``.

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
    order = _chain(graph)
    x_seq = x_seq.to(torch.float64)
    T, N = x_seq.shape[0], x_seq.shape[1]
    states: Dict[str, torch.Tensor] = {}
    rec: Dict[str, Dict[str, List[torch.Tensor]]] = {}
    outs = []
    for t in range(T):
        h = x_seq[t]
        for name in order:
            n = graph.nodes[name]
            if isinstance(n, nir.Affine):
                h = h @ _t(n.weight).T + _t(n.bias)
            elif isinstance(n, nir.Linear):
                h = h @ _t(n.weight).T
            elif isinstance(n, nir.Conv2d):
                h = F.conv2d(h, _t(n.weight), _t(n.bias), _ints(n.stride) if np.asarray(
                    n.stride).size > 1 else int(np.asarray(n.stride)), _pad(n.padding),
                    _ints(n.dilation) if np.asarray(n.dilation).size > 1 else
                    int(np.asarray(n.dilation)), int(np.asarray(n.groups)))
            elif isinstance(n, nir.Conv1d):
                h = F.conv1d(h, _t(n.weight), _t(n.bias), int(np.asarray(n.stride).reshape(-1)[0]),
                             _pad(n.padding), int(np.asarray(n.dilation).reshape(-1)[0]),
                             int(np.asarray(n.groups)))
            elif isinstance(n, nir.SumPool2d):
                h = F.avg_pool2d(h, _ints(n.kernel_size), _ints(n.stride), _ints(n.padding),
                                 divisor_override=1)
            elif isinstance(n, nir.AvgPool2d):
                h = F.avg_pool2d(h, _ints(n.kernel_size), _ints(n.stride), _ints(n.padding))
            elif isinstance(n, nir.Flatten):
                s, e = int(n.start_dim), int(n.end_dim)
                h = h.flatten(s + 1 if s >= 0 else s, e + 1 if e >= 0 else e)
            elif isinstance(n, nir.Threshold):
                z = h > _t(n.threshold)
                if record:
                    r = rec.setdefault(name, {"spikes": [], "v": []})
                    r["spikes"].append(z.to(torch.int8))
                    r["v"].append(h)
                h = z.to(torch.float64)
            elif isinstance(n, (nir.IF, nir.LIF)):
                v_reset = _t(n.v_reset)
                v = states.get(name)
                if v is None:
                    v = v_reset.expand((N,) + tuple(v_reset.shape)).clone()
                if isinstance(n, nir.IF):
                    v = v + dt * _t(n.r) * h
                else:
                    v = v + (dt / _t(n.tau)) * ((_t(n.v_leak) - v) + _t(n.r) * h)
                z = v > _t(n.v_threshold)
                if record:
                    r = rec.setdefault(name, {"spikes": [], "v": []})
                    r["spikes"].append(z.to(torch.int8))
                    r["v"].append(v)
                states[name] = torch.where(z, v_reset.expand_as(v), v)
                h = z.to(torch.float64)
            else:
                raise NotImplementedError(f"simulate_nir: node {name!r} of type "
                                          f"{type(n).__name__} is not supported")
        outs.append(h)
    out = torch.stack(outs)
    if not record:
        return out
    return out, {k: {kk: torch.stack(vv) for kk, vv in r.items()} for k, r in rec.items()}
