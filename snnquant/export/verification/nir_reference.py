r"""NIR's equations as NIR states them: :func:`simulate_nir`, the reference any NIR consumer
(and snnquant's own integer network) is checked against.

:func:`simulate_nir` integrates the graph's primitives with Euler steps in float64, exactly as the
NIR equations read, with no rounding or saturation:

.. math::

    \text{IF:}\quad & v \leftarrow v + dt\, r\, I\\
    \text{LIF:}\quad & v \leftarrow v + \frac{dt}{\tau}\big((v_{leak} - v) + r\, I\big)\\
    & z = [v > v_{threshold}],\qquad v \leftarrow v_{reset}\ \text{where}\ z = 1\\
    \text{Threshold:}\quad & z = [x > \text{threshold}]
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..backends.nir_schema import import_nir
from ..frontend.nir_checks import int_tuple
from ..frontend.nir_import import check_edges, read_graph

__all__ = ["simulate_nir"]


def _t(v) -> torch.Tensor:
    return torch.as_tensor(np.asarray(v, dtype=np.float64))


def _pad(p):
    if isinstance(p, bytes):
        p = p.decode()
    return p if isinstance(p, str) else int_tuple(p) if np.asarray(p).size > 1 else int(np.asarray(p))


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
        return F.conv2d(h, _t(n.weight), _t(n.bias), int_tuple(n.stride) if np.asarray(
            n.stride).size > 1 else int(np.asarray(n.stride)), _pad(n.padding),
            int_tuple(n.dilation) if np.asarray(n.dilation).size > 1 else
            int(np.asarray(n.dilation)), int(np.asarray(n.groups)))
    if isinstance(n, nir.Conv1d):
        return F.conv1d(h, _t(n.weight), _t(n.bias), int(np.asarray(n.stride).reshape(-1)[0]),
                        _pad(n.padding), int(np.asarray(n.dilation).reshape(-1)[0]),
                        int(np.asarray(n.groups)))
    if isinstance(n, nir.SumPool2d):
        return F.avg_pool2d(h, int_tuple(n.kernel_size), int_tuple(n.stride), int_tuple(n.padding),
                            divisor_override=1)
    if isinstance(n, nir.AvgPool2d):
        return F.avg_pool2d(h, int_tuple(n.kernel_size), int_tuple(n.stride), int_tuple(n.padding))
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
    graph = read_graph(graph_or_path, nir)
    if dt is None:
        if "dt" not in (graph.metadata or {}):
            raise ValueError("dt is None and the graph has no 'dt' in its metadata; pass dt=")
        dt = float(graph.metadata["dt"])
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not dt > 0:
        raise ValueError(f"dt must be a positive number, got {dt!r}")
    if not isinstance(x_seq, torch.Tensor) or x_seq.dim() < 3:
        raise ValueError(f"x_seq must be a tensor [T, N, ...], got "
                         f"{getattr(x_seq, 'shape', type(x_seq).__name__)}")
    pred = check_edges(graph)
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
