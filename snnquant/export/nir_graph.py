r"""Export to NIR, the Neuromorphic Intermediate Representation: :func:`to_nir`.

NIR describes continuous-time dynamics with real parameters; it has no quantized membrane. The
graph therefore carries the network's exact quantized weights and neuron parameters, either in
real units or in the integer units of each layer's shared grid (every weight, bias, threshold and
reset value an integer), and each node's ``metadata`` holds what NIR cannot say: bit widths,
integer membrane range, membrane scale, the rounding rule and the firing condition.

Mapping (as SpikingJelly's own NIR export, with time step ``dt``):

* synaptic layer: ``Affine``/``Linear``, ``Conv1d``, ``Conv2d`` with weights :math:`c\,\hat W`
  and bias :math:`c\,\hat b`, :math:`c = 2^{F_0}` of the next neuron layer (integer units) or 1;
* IF: ``IF(r = 1/dt, v_threshold, v_reset)``; LIF with :math:`\tau = 2^k`:
  ``LIF(tau = tau * dt, r = 1 if decay_input else tau, v_leak = v_reset, v_threshold, v_reset)``;
  a fixed-point leak :math:`M / 2^F` (``exact=False``) gives the :math:`\tau` the integer layer
  implements, :math:`\tau_{eff} = 2^F / M`, and the metadata records ``leak_multiplier``,
  ``leak_shift``, ``exact`` and the float model's ``source_tau``;
  all membrane values times :math:`c`; ``v_threshold`` is the smallest membrane level that fires
  (the model fires at :math:`v \ge \theta`);
* max pooling of spikes: ``SumPool2d`` then ``Threshold(0)`` (the maximum of binary spikes is
  1 exactly when their sum is positive); average pooling: ``AvgPool2d``; flatten: ``Flatten``.

Refused (``ExportError``): soft reset (NIR has no subtractive reset), max pooling of non-binary
values, 1-d pooling and pooling with dilation or ``ceil_mode``.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from .description import ExportError, FlattenOp, IntegerNetwork, NeuronOp, PoolOp, SynapseOp
from .simulator import IntegerSNN

__all__ = ["to_nir", "UNITS"]

UNITS = ("integer", "real")


def _shapes(desc: IntegerNetwork, input_shape):
    """Per-sample input shape of every operation, by running zeros through the simulator."""
    sim = IntegerSNN(desc)
    x = torch.zeros((1,) + tuple(input_shape), dtype=torch.int64)
    shapes = []
    for op, prm in zip(desc.ops, sim._params):
        shapes.append(tuple(x.shape[1:]))
        if isinstance(op, SynapseOp):
            x = sim._synapse(op, prm, x)
        elif isinstance(op, PoolOp):
            x = sim._pool(op, x)
        elif isinstance(op, FlattenOp):
            start = op.start_dim + 1 if op.start_dim >= 0 else op.start_dim
            end = op.end_dim + 1 if op.end_dim >= 0 else op.end_dim
            x = torch.flatten(x, start, end)
    return shapes, tuple(x.shape[1:])


def _layer_scales(desc: IntegerNetwork, units: str):
    """Factor c of every op: 2^F0 of the neuron the op feeds (integer units), else 1."""
    scales = [1.0] * len(desc.ops)
    if units == "real":
        return scales
    c = 2.0 ** desc.output_frac_bits if desc.output_kind == "current" else 1.0
    for i in range(len(desc.ops) - 1, -1, -1):
        op = desc.ops[i]
        if isinstance(op, NeuronOp):
            scales[i] = 2.0 ** op.grid_frac_bits
            c = 2.0 ** op.grid_frac_bits
        elif isinstance(op, SynapseOp):
            scales[i] = c
            c = 1.0
        else:
            scales[i] = c
    return scales


def to_nir(source: Union[IntegerNetwork, nn.Module], input_shape: Sequence[int], *,
           units: str = "integer", dt: float = 1e-4, path: Optional[Union[str, os.PathLike]] = None):
    r"""Build a NIR graph of a quantized network (and optionally write it to ``path``).

    .. math::

        W_{nir} = c\, w\, s_w,\quad b_{nir} = c\, b\, 2^{-F},\quad
        V_{th,nir} = c\, \theta\, s_v,\quad V_{r,nir} = c\, v_r\, s_v,\qquad
        c = \begin{cases} 2^{F_0} & \text{units='integer'}\\ 1 & \text{units='real'}\end{cases}

    In integer units every weight, bias, threshold and reset value is an integer: the numbers an
    integer back-end stores; the dynamics are the same up to the per-layer factor :math:`c`.

    Args:
        source: an :class:`~snnquant.export.IntegerNetwork` or a quantized model (exported with
            :func:`~snnquant.export.to_integer` first).
        input_shape: shape of one input sample, without time and batch (``(C, H, W)`` or
            ``(features,)``).
        units: ``'integer'`` or ``'real'``.
        dt: time step in seconds for the time constants (:math:`\tau_{nir} = \tau\,dt`).
        path: if given, write the graph there (``nir.write``, atomically).

    Returns:
        The ``nir.NIRGraph`` with nodes named after the source layers (dots replaced by ``_``),
        ``input`` and ``output``.
    """
    try:
        import nir
    except ImportError as exc:  # pragma: no cover - nir is in the 'export' extra
        raise ImportError("to_nir needs the nir package: pip install nir (or snnquant[export])") from exc
    if units not in UNITS:
        raise ValueError(f"units must be one of {UNITS}, got {units!r}")
    if not (isinstance(dt, (int, float)) and dt > 0):
        raise ValueError(f"dt must be a positive number, got {dt!r}")
    if isinstance(source, nn.Module):
        from .exporter import to_integer
        desc = to_integer(source)
    elif isinstance(source, IntegerNetwork):
        desc = source
    else:
        raise TypeError(f"source must be an IntegerNetwork or an nn.Module, got {type(source).__name__}")
    if isinstance(input_shape, int):
        input_shape = (input_shape,)
    input_shape = tuple(int(v) for v in input_shape)
    if not input_shape or any(v <= 0 for v in input_shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
    shapes, out_shape = _shapes(desc, input_shape)
    scales = _layer_scales(desc, units)

    nodes = {"input": nir.Input(input_type={"input": np.array(input_shape)})}
    edges = []
    last = "input"
    binary = False
    for op, shape, c in zip(desc.ops, shapes, scales):
        key = op.name.replace(".", "_").replace("/", "_")
        if key in nodes:
            key = f"{key}_{len(nodes)}"
        new = []
        if isinstance(op, SynapseOp):
            w = (op.weight.double() * op.weight_scale.reshape([-1] + [1] * (op.weight.dim() - 1))
                 * c).numpy()
            b = None if op.bias is None else (op.bias.double() * (2.0 ** -op.out_frac_bits) * c).numpy()
            meta = {"weight_bits": op.weight_bits, "weight_int": op.weight.numpy().astype(np.int32),
                    "weight_scale": op.weight_scale.numpy(), "units": units, "unit_factor": c}
            if op.bias_bits is not None:
                meta["bias_bits"] = op.bias_bits
            if op.kind == "linear":
                node = (nir.Linear(weight=w, metadata=meta) if b is None
                        else nir.Affine(weight=w, bias=b, metadata=meta))
            else:
                bias = b if b is not None else np.zeros(w.shape[0])
                padding = op.padding if isinstance(op.padding, str) else (
                    op.padding[0] if op.kind == "conv1d" else tuple(op.padding))
                if op.kind == "conv1d":
                    node = nir.Conv1d(input_shape=shape[-1], weight=w, stride=op.stride[0],
                                      padding=padding, dilation=op.dilation[0], groups=op.groups,
                                      bias=bias, metadata=meta)
                else:
                    node = nir.Conv2d(input_shape=tuple(shape[-2:]), weight=w, stride=op.stride,
                                      padding=padding, dilation=op.dilation, groups=op.groups,
                                      bias=bias, metadata=meta)
            new.append((key, node))
            binary = False
        elif isinstance(op, NeuronOp):
            if op.reset_mode != "hard":
                raise ExportError(f"layer {op.name!r}: soft reset (v_reset=None) has no NIR "
                                  f"equivalent (NIR neurons reset to v_reset)")
            unit = op.membrane_scale * c
            full = lambda v: np.full(shape, float(v))  # noqa: E731
            meta = {"v_bits": op.v_bits, "v_min": op.v_min, "v_max": op.v_max,
                    "membrane_scale": op.membrane_scale, "threshold_int": op.threshold,
                    "v_reset_int": op.v_reset, "rounding": "half_to_even",
                    "fire_condition": "v >= v_threshold", "units": units, "unit_factor": c}
            if op.kind == "if":
                node = nir.IF(r=full(1.0 / dt), v_threshold=full(op.threshold * unit),
                              v_reset=full(op.v_reset * unit), metadata=meta)
            else:
                # the time constant the integer layer implements: 2^k / M (= 2^k when exact)
                tau = float(op.effective_tau)
                meta["leak_shift"] = op.leak_shift
                meta["leak_multiplier"] = op.leak_multiplier
                meta["exact"] = op.exact
                if op.tau is not None:
                    meta["source_tau"] = op.tau
                node = nir.LIF(tau=full(tau * dt), r=full(1.0 if op.decay_input else tau),
                               v_leak=full(op.v_reset * unit), v_threshold=full(op.threshold * unit),
                               v_reset=full(op.v_reset * unit), metadata=meta)
            new.append((key, node))
            binary = True
        elif isinstance(op, PoolOp):
            if op.dims != 2 or any(v != 1 for v in op.dilation) or op.ceil_mode:
                raise ExportError(f"layer {op.name!r}: NIR has only 2-d pooling without dilation "
                                  f"or ceil_mode")
            args = dict(kernel_size=np.array(op.kernel_size), stride=np.array(op.stride),
                        padding=np.array(op.padding))
            if op.kind == "max":
                if not binary:
                    raise ExportError(f"layer {op.name!r}: max pooling of non-binary values has no "
                                      f"NIR equivalent (only of spikes: SumPool2d + Threshold)")
                pooled = _pool_shape(shape, op)
                new.append((key, nir.SumPool2d(**args, metadata={"source": "MaxPool2d of spikes"})))
                new.append((key + "_threshold", nir.Threshold(threshold=np.zeros(pooled))))
            else:
                new.append((key, nir.AvgPool2d(**args)))
                binary = False
        else:
            new.append((key, nir.Flatten(input_type={"input": np.array(shape)},
                                         start_dim=op.start_dim, end_dim=op.end_dim)))
        for k, node in new:
            nodes[k] = node
            edges.append((last, k))
            last = k
    nodes["output"] = nir.Output(output_type={"output": np.array(out_shape)})
    edges.append((last, "output"))
    meta = {"producer": "snnquant", "units": units, "dt": float(dt),
            "reference_dtype": desc.reference_dtype, "format_version": desc.format_version,
            "exact": desc.exact}
    graph = nir.NIRGraph(nodes=nodes, edges=edges, metadata=meta, type_check=False)
    if path is not None:
        from .._io import atomic_write
        atomic_write(path, lambda tmp: nir.write(tmp, graph))
    return graph


def _pool_shape(shape, op: PoolOp):
    x = torch.zeros((1,) + tuple(shape), dtype=torch.int64)
    return tuple(IntegerSNN._pool(op, x).shape[1:])
