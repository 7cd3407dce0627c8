r"""Export to NIR, the Neuromorphic Intermediate Representation: :func:`to_nir`.

NIR describes each primitive by continuous-time equations with real parameters and says nothing
of time steps, quantization or rounding. :func:`to_nir` writes the parameters so that a consumer
that integrates NIR's equations with Euler steps of the stated ``dt`` computes snnquant's
dynamics, and everything NIR cannot express travels in each node's ``metadata`` under one schema
(:data:`SCHEMA_VERSION`, documented in the guide "NIR: export, import and interoperability"),
from which :func:`~snnquant.export.from_nir` rebuilds the exact integer network.

Mapping, with :math:`u` the NIR value of one membrane integer (:math:`u = s_v\,c`, membrane step
:math:`s_v`, unit factor :math:`c = 2^{F_0}` in integer units or 1 in real units):

* synaptic layer: ``Affine``/``Linear``, ``Conv1d``, ``Conv2d`` with weights :math:`c\,\hat W`
  and bias :math:`c\,\hat b`;
* IF: ``IF(r = 1/dt, v_threshold = (θ - 1/2) u, v_reset = v_r u)``;
* LIF with :math:`\tau = 2^k` (or the :math:`\tau_{eff} = 2^F / M` of a fixed-point leak):
  ``LIF(tau = τ dt, r = 1 (decay_input) or τ (not), v_leak = v_r u, v_threshold = (θ - 1/2) u,
  v_reset = v_r u)``;
* max pooling of spikes: ``SumPool2d`` then ``Threshold(0)`` (the maximum of binary spikes is 1
  exactly when their sum is positive), or with ``max_pool='conv_if'`` a channel-identity
  ``Conv2d`` of ones then ``IF(r = 1/dt, v_threshold = 1/2, v_reset = 0)`` (a form SpikingJelly
  and Norse read); average pooling over :math:`2^a` elements: ``AvgPool2d``; flatten: ``Flatten``
  (per-sample dimensions, as NIR defines them).

Why :math:`\theta - 1/2`: snnquant fires when the integer membrane reaches the threshold,
:math:`v \ge \theta`; NIR's IF, LIF and Threshold fire when :math:`v > v_{threshold}`. On the
membrane grid both hold for the same :math:`v` exactly when the NIR threshold lies strictly between
:math:`\theta - 1` and :math:`\theta`; the midpoint also fires as snnquant's rounding does when a
consumer's unrounded membrane falls between two grid levels (except on the tie itself).

Refused (``ExportError``): soft reset (NIR neurons reset to ``v_reset``), max pooling of
non-binary values, 1-d pooling and pooling with dilation or ``ceil_mode``.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from .description import (ExportError, FlattenOp, IntegerNetwork, NeuronOp, PoolOp, SynapseOp,
                          check_input_shape)
from .nir_schema import NIR_MIN_VERSION, SCHEMA_VERSION, import_nir
from .simulator import IntegerSNN, op_shapes

__all__ = ["to_nir", "UNITS", "MAX_POOL_FORMS", "SCHEMA_VERSION", "NIR_MIN_VERSION"]

#: Units of the exported values: ``'integer'`` (each layer on its integer grid) or ``'real'``.
UNITS = ("integer", "real")

#: How max pooling of spikes is written: ``'threshold'`` (``SumPool2d`` + ``Threshold(0)``) or
#: ``'conv_if'`` (channel-identity ``Conv2d`` + ``IF`` with threshold 1/2 and reset 0).
MAX_POOL_FORMS = ("threshold", "conv_if")

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


def _synapse_meta(op: SynapseOp):
    meta = {"snnquant_op": "synapse", "weight_bits": int(op.weight_bits),
            "weight_int": op.weight.numpy().astype(np.int32),
            "weight_scale": op.weight_scale.double().numpy(),
            "weight_multiplier": op.multiplier.numpy().astype(np.int64),
            "weight_shift": op.shift.numpy().astype(np.int64),
            "in_frac_bits": int(op.in_frac_bits), "out_frac_bits": int(op.out_frac_bits),
            "current_scale": 2.0 ** -op.out_frac_bits,
            "accumulator": "exact integer sum, X = ((sum w_int x) * weight_multiplier) << "
                           "weight_shift + bias_int"}
    if op.bias is not None:
        meta["bias_int"] = op.bias.numpy().astype(np.int64)
        meta["bias_scale"] = 2.0 ** -op.out_frac_bits
        if op.bias_bits is not None:
            meta["bias_bits"] = int(op.bias_bits)
    return meta


def _neuron_meta(op: NeuronOp, unit: float, dt: float):
    meta = {"snnquant_op": "neuron", "v_bits": int(op.v_bits), "v_min": int(op.v_min),
            "v_max": int(op.v_max), "membrane_scale": float(op.membrane_scale),
            "membrane_unit": float(unit), "threshold_int": int(op.threshold),
            "v_reset_int": int(op.v_reset), "v_init_int": int(op.v_init),
            "reset_mode": op.reset_mode, "leak_shift": int(op.leak_shift),
            "leak_multiplier": int(op.leak_multiplier),
            "leak_round_shift": int(op.leak_round_shift), "decay_input": bool(op.decay_input),
            "input_shift": int(op.input_shift), "grid_shift": int(op.grid_shift),
            "in_frac_bits": int(op.in_frac_bits), "grid_frac_bits": int(op.grid_frac_bits),
            "exact": bool(op.exact), "rounding": "half_to_even",
            "saturation": "clamp to [v_min, v_max] after the charge, before the firing test",
            "fire_condition": "v_int >= threshold_int",
            "nir_threshold": "v_threshold = (threshold_int - 1/2) * membrane_unit",
            "nir_dynamics_exact": bool(op.kind == "if" and op.grid_shift == 0), "dt": float(dt)}
    if op.kind == "lif":
        meta["effective_tau"] = float(op.effective_tau)
        if op.tau is not None:
            meta["source_tau"] = float(op.tau)
    return meta


def to_nir(source: Union[IntegerNetwork, nn.Module], input_shape: Sequence[int], *,
           units: str = "integer", dt: float = 1e-4, max_pool: str = "threshold",
           path: Optional[Union[str, os.PathLike]] = None, data: Optional[torch.Tensor] = None):
    r"""Build a NIR graph of a quantized network (and optionally write it to ``path``).

    .. math::

        W_{nir} = c\, w\, s_w,\quad b_{nir} = c\, b\, 2^{-F},\quad
        V_{th,nir} = (\theta - \tfrac{1}{2})\, u,\quad V_{r,nir} = v_r\, u,\quad u = c\, s_v,

        r_{IF} = \frac{1}{dt},\qquad \tau_{LIF} = \tau\, dt,\qquad
        r_{LIF} = \begin{cases} 1 & \text{decay\_input}\\ \tau & \text{otherwise}\end{cases},
        \qquad c = \begin{cases} 2^{F_0} & \text{units='integer'}\\ 1 &
        \text{units='real'}\end{cases}

    Euler steps of NIR's equations with this ``dt`` then give snnquant's float dynamics: IF
    :math:`v \leftarrow v + dt\, r\, I = v + I`; LIF :math:`v \leftarrow v + \frac{dt}{\tau_{LIF}}
    ((v_{leak} - v) + r I) = v + \frac{1}{\tau}((v_r u - v) + r I)`; and NIR's strict
    :math:`v > V_{th,nir}` fires exactly when snnquant's :math:`v \ge \theta` does. What NIR's
    float dynamics cannot do (round the membrane to its grid after each charge, saturate it to
    :math:`[v_{min}, v_{max}]`) is written in each node's metadata, with the integers, bit widths
    and grid steps (schema :data:`SCHEMA_VERSION`). An IF layer with ``grid_shift`` 0 (currents
    on the membrane grid, ``nir_dynamics_exact`` in its metadata) whose membrane stays inside
    its range is reproduced exactly by NIR's equations; LIF membrane rounding is not expressible.

    A consumer must integrate with the same ``dt`` (it is in ``graph.metadata['dt']``), e.g.
    ``import_from_nir(graph, dt=dt)`` in SpikingJelly or ``norse.torch.from_nir(graph, dt=dt)``.

    Args:
        source: an :class:`~snnquant.export.IntegerNetwork` or a quantized model (exported with
            :func:`~snnquant.export.to_integer` first).
        input_shape: shape of one input sample, without time and batch (``(C, H, W)`` or
            ``(features,)``).
        units: ``'integer'`` (every weight, bias, threshold and reset value an integer or, for
            thresholds, a half-integer times the membrane unit) or ``'real'``.
        dt: time step in seconds of one snnquant step, a positive number; written into the graph
            metadata and every neuron node's.
        max_pool: ``'threshold'`` (``SumPool2d`` + ``Threshold(0)``, NIR's step function) or
            ``'conv_if'`` (channel-identity ``Conv2d`` of ones + stateless
            ``IF(v_threshold=1/2, v_reset=0)``, for consumers without ``SumPool2d`` or
            ``Threshold``); both give the same spikes.
        path: if given, write the graph there (``nir.write``, atomically).
        data: optional input ``[T, N, ...]`` (the user's data) on which to check saturation: a
            :class:`~snnquant.export.SaturationWarning` names every layer whose membrane reaches
            ``v_min`` or ``v_max`` on it (:func:`~snnquant.export.saturation_report`; for an
            :class:`~snnquant.export.IntegerNetwork`, where NIR's membrane leaves that range),
            since NIR has no saturation and consumers cannot reproduce those steps.

    Returns:
        The ``nir.NIRGraph`` with nodes named after the source layers (dots replaced by ``_``),
        ``input`` and ``output``.

    Raises:
        ImportError: ``nir`` is missing or older than 1.0.6.
        ExportError: a layer has no NIR equivalent (soft reset, max pooling of non-binary values,
            1-d or dilated pooling), or the network is a graph (joins, branches, adaptive pools:
            :meth:`~snnquant.export.IntegerNetwork.graph_features`), not supported yet.
    """
    nir = import_nir("to_nir")
    if units not in UNITS:
        raise ValueError(f"units must be one of {UNITS}, got {units!r}")
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not np.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be a positive finite number, got {dt!r}")
    dt = float(dt)
    if max_pool not in MAX_POOL_FORMS:
        raise ValueError(f"max_pool must be one of {MAX_POOL_FORMS}, got {max_pool!r}")
    input_shape = check_input_shape(input_shape)
    if isinstance(source, nn.Module):
        from .exporter import to_integer
        desc = to_integer(source, input_shape=input_shape)
    elif isinstance(source, IntegerNetwork):
        desc = source
    else:
        raise TypeError(f"source must be an IntegerNetwork or an nn.Module, got {type(source).__name__}")
    desc.refuse_graph("to_nir")
    in_out = op_shapes(desc, input_shape)
    shapes = [before for before, _ in in_out]
    out_shape = in_out[-1][1] if in_out else tuple(input_shape)
    scales = _layer_scales(desc, units)

    nodes = {"input": nir.Input(input_type={"input": np.array(input_shape)})}
    edges = []
    last = "input"
    binary = False
    for op, shape, c in zip(desc.ops, shapes, scales):
        key = op.name.replace(".", "_").replace("/", "_")
        if key in nodes:
            key = f"{key}_{len(nodes)}"
        common = {"snnquant_schema": SCHEMA_VERSION, "snnquant_name": op.name, "units": units,
                  "unit_factor": float(c)}
        new = []
        if isinstance(op, SynapseOp):
            w = (op.weight.double() * op.weight_scale.reshape([-1] + [1] * (op.weight.dim() - 1))
                 * c).numpy()
            b = None if op.bias is None else (op.bias.double() * (2.0 ** -op.out_frac_bits) * c).numpy()
            meta = {**common, **_synapse_meta(op)}
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
            meta = {**common, **_neuron_meta(op, unit, dt)}
            v_th = full((op.threshold - 0.5) * unit)
            v_r = full(op.v_reset * unit)
            if op.kind == "if":
                node = nir.IF(r=full(1.0 / dt), v_threshold=v_th, v_reset=v_r, metadata=meta)
            else:
                tau = float(op.effective_tau)  # 2^k, or 2^F / M for a fixed-point leak
                node = nir.LIF(tau=full(tau * dt), r=full(1.0 if op.decay_input else tau),
                               v_leak=v_r.copy(), v_threshold=v_th, v_reset=v_r, metadata=meta)
            new.append((key, node))
            binary = True
        elif isinstance(op, PoolOp):
            if op.dims != 2 or any(v != 1 for v in op.dilation) or op.ceil_mode:
                raise ExportError(f"layer {op.name!r}: NIR has only 2-d pooling without dilation "
                                  f"or ceil_mode")
            meta = {**common, "snnquant_op": "pool", "pool_kind": op.kind,
                    "frac_bits_added": int(op.frac_bits_added),
                    "kernel_size": np.array(op.kernel_size, dtype=np.int64),
                    "stride": np.array(op.stride, dtype=np.int64),
                    "padding": np.array(op.padding, dtype=np.int64)}
            args = dict(kernel_size=np.array(op.kernel_size), stride=np.array(op.stride),
                        padding=np.array(op.padding))
            if op.kind == "max":
                if not binary:
                    raise ExportError(f"layer {op.name!r}: max pooling of non-binary values has no "
                                      f"NIR equivalent (only of spikes: SumPool2d + Threshold)")
                pooled = _pool_shape(shape, op)
                part = {**common, "snnquant_op": "part", "part_of": "max pooling of spikes"}
                meta["max_pool_form"] = max_pool
                if max_pool == "threshold":
                    new.append((key, nir.SumPool2d(**args, metadata=meta)))
                    new.append((key + "_threshold",
                                nir.Threshold(threshold=np.zeros(pooled), metadata=part)))
                else:
                    channels = shape[0]
                    ones = np.zeros((channels, channels) + tuple(op.kernel_size))
                    ones[np.arange(channels), np.arange(channels)] = 1.0
                    new.append((key, nir.Conv2d(input_shape=tuple(shape[-2:]), weight=ones,
                                                stride=op.stride, padding=op.padding,
                                                dilation=(1, 1), groups=1,
                                                bias=np.zeros(channels), metadata=meta)))
                    new.append((key + "_if", nir.IF(r=np.full(pooled, 1.0 / dt),
                                                    v_threshold=np.full(pooled, 0.5),
                                                    v_reset=np.zeros(pooled), metadata=part)))
            else:
                new.append((key, nir.AvgPool2d(**args, metadata=meta)))
                binary = False
        else:
            meta = {**common, "snnquant_op": "flatten"}
            new.append((key, nir.Flatten(input_type={"input": np.array(shape)},
                                         start_dim=op.start_dim, end_dim=op.end_dim,
                                         metadata=meta)))
        for k, node in new:
            nodes[k] = node
            edges.append((last, k))
            last = k
    nodes["output"] = nir.Output(output_type={"output": np.array(out_shape)})
    edges.append((last, "output"))
    from .._version import __version__
    meta = {"producer": "snnquant", "snnquant_schema": SCHEMA_VERSION,
            "snnquant_version": __version__, "units": units, "dt": dt,
            "max_pool_form": max_pool, "input_shape": np.array(input_shape, dtype=np.int64),
            "input_max": int(desc.input_max), "output_kind": desc.output_kind,
            "output_frac_bits": int(desc.output_frac_bits),
            "reference_dtype": desc.reference_dtype, "mantissa_bits": int(desc.mantissa_bits),
            "format_version": int(desc.format_version), "exact": bool(desc.exact),
            "notes": "\n".join(desc.notes),
            "fire_condition": "v > v_threshold (NIR), equal to snnquant's v_int >= threshold_int"}
    graph = nir.NIRGraph(nodes=nodes, edges=edges, metadata=meta, type_check=False)
    if data is not None:
        from .saturation import nir_saturation_warning
        nir_saturation_warning(source, graph, data)
    if path is not None:
        from .._io import atomic_write
        atomic_write(path, lambda tmp: nir.write(tmp, graph))
    return graph


def _pool_shape(shape, op: PoolOp):
    x = torch.zeros((1,) + tuple(shape), dtype=torch.int64)
    return tuple(IntegerSNN._pool(op, x).shape[1:])
