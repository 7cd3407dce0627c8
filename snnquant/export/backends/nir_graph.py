r"""Export to NIR, the Neuromorphic Intermediate Representation: :func:`nir_graph`, the writer
behind :func:`~snnquant.export.to_nir`.

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
  and Norse read); average pooling over :math:`2^a` elements (and an adaptive one whose windows
  lie one stride apart): ``AvgPool2d``; SpikingJelly's ``VotingLayer``: a ``Linear`` of
  :math:`c/D` blocks; flatten: ``Flatten`` (per-sample dimensions, as NIR defines them);
* graphs: a residual ``'add'`` join has no node, since NIR sums the edges into a node: each
  operand feeds each of the join's consumers, through a ``Scale`` node where the operand's
  factor :math:`c` differs from the consumer's (:func:`~snnquant.export.backends.nir_schema.nir_factors`,
  :func:`~snnquant.export.backends.nir_schema.nir_wiring`); SEW's
  ``'and'``/``'iand'`` join of spikes is ``Threshold(3/2)`` on :math:`x_0 + x_1` or
  ``Threshold(1/2)`` on :math:`x_0 - x_1` (a ``Scale(-1)`` node negates :math:`x_1`), exact on
  binary spikes. Every node carries its operation's index (``snnquant_index``) and, where it
  reads anything but the operation before it, its ``inputs`` (``snnquant_inputs``); ``'add'``
  joins travel in ``graph.metadata['snnquant_joins']``.

Why :math:`\theta - 1/2`: snnquant fires when the integer membrane reaches the threshold,
:math:`v \ge \theta`; NIR's IF, LIF and Threshold fire when :math:`v > v_{threshold}`. On the
membrane grid both hold for the same :math:`v` exactly when the NIR threshold lies strictly between
:math:`\theta - 1` and :math:`\theta`; the midpoint also fires as snnquant's rounding does when a
consumer's unrounded membrane falls between two grid levels (except on the tie itself).

Refused (``ExportError``): soft reset (NIR neurons reset to ``v_reset``), max pooling of
non-binary values, 1-d pooling other than ``VotingLayer``, pooling with dilation or
``ceil_mode``, and adaptive pooling whose windows overlap or repeat the input.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..ir.network import (NETWORK_INPUT, ExportError, IntegerNetwork, JoinOp, NeuronOp, PoolOp,
                          SynapseOp)
from ..ir.transformer_ops import ScaleOp
from .nir_schema import (NIR_MIN_VERSION, SCHEMA_VERSION, import_nir, is_add_join, nir_factors,
                         nir_wiring, voting_weight)
from ..ir.program import adaptive_windows
from .simulator import IntegerSNN, op_shapes

__all__ = ["nir_graph", "refuse_beyond_nir", "nir_refusals", "UNITS", "MAX_POOL_FORMS",
           "SCHEMA_VERSION", "NIR_MIN_VERSION"]

#: Units of the exported values: ``'integer'`` (each layer on its integer grid) or ``'real'``.
UNITS = ("integer", "real")

#: How max pooling of spikes is written: ``'threshold'`` (``SumPool2d`` + ``Threshold(0)``) or
#: ``'conv_if'`` (channel-identity ``Conv2d`` + ``IF`` with threshold 1/2 and reset 0).
MAX_POOL_FORMS = ("threshold", "conv_if")

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


#: What NIR 1.0 has no node for, per operation type of a spiking transformer.
_BEYOND_NIR = {
    "GatherOp": "a layout operation (reshape, transpose, permute, chunk, a broadcast): NIR's "
                "only layout node is Flatten",
    "ReduceOp": "a sum over dimensions (a token sum or mean): NIR has no reduction node",
    "MatMulOp": "a matrix product of two computed tensors (attention): NIR's Affine and Linear "
                "multiply by constant weights only",
    "ScaleOp": "a multiplication by a power of two of a value that is not a synaptic input",
}


def refuse_beyond_nir(desc: IntegerNetwork) -> None:
    """Refuse a description that NIR cannot express: the first operation NIR has no node for
    (named, with its index, type and why), or a mean over time of the output.

    Raises:
        ExportError: naming the operation.
    """
    if desc.chip is not None:
        raise ExportError(f"desc is a {desc.chip} network: its layers compute in the chip's own "
                          f"arithmetic (saturations, decays by shifts, delays), which NIR's "
                          f"equations cannot carry; deploy it with snnquant.targets.to_"
                          f"{desc.chip}")
    found = nir_refusals(desc)
    if found:
        raise ExportError(found[0])


def nir_refusals(desc: IntegerNetwork) -> List[str]:
    """Every operation of ``desc`` that NIR has no node for (one line each: name, index, type
    and why), and the output's mean over time; empty when NIR can say the network
    (:func:`refuse_beyond_nir` raises the first; the deployability report lists them all)."""
    found = []
    last = len(desc.ops) - 1
    for i, op in enumerate(desc.ops):
        why = _BEYOND_NIR.get(type(op).__name__)
        if desc.output_time_mean and i == last and isinstance(op, ScaleOp) and op.exponent == 0:
            break   # the mean over time itself, below
        if why is not None:
            found.append(f"layer {op.name!r} (operation {i}, {type(op).__name__}): NIR has "
                         f"no node for it: {why}. Deploy such a network with to_c or "
                         f"IntegerSNN")
    if desc.output_time_mean:
        found.append("the network's output is a mean over time steps (output_time_mean), "
                     "which NIR's per-step graphs cannot say; export the model without its "
                     "final mean over time, and average the NIR graph's outputs")
    return found


def nir_graph(desc: IntegerNetwork, input_shape: Tuple[int, ...], *, units: str, dt: float,
              max_pool: str, consumers: Optional[Sequence[str]]):
    """The ``nir.NIRGraph`` of ``desc``: the NIR writer behind :func:`~snnquant.export.to_nir`,
    which checks its arguments (``input_shape`` as :func:`~snnquant.export.check_input_shape`
    returns it, ``dt`` a float) and documents the mapping.

    Warns (:class:`~snnquant.export.ConsumerRegisterWarning`, at the caller of the caller) where a
    consumer's register does not hold a layer's grid.
    """
    nir = import_nir("to_nir")
    from .nir_consumers import narrow_registers, warn_narrow_registers
    narrow_registers(desc, consumers)   # an unknown consumer is refused before any work
    refuse_beyond_nir(desc)
    in_out = op_shapes(desc, input_shape)
    shapes = [before for before, _ in in_out]
    out_shape = in_out[-1][1] if in_out else tuple(input_shape)
    out_factor, need, _ = nir_factors(desc, units)
    wiring = nir_wiring(desc, units)

    nodes = {"input": nir.Input(input_type={"input": np.array(input_shape)})}
    edges = []
    head, tail = {}, {NETWORK_INPUT: "input"}   # an op's first and last NIR node
    binary = {NETWORK_INPUT: False}
    joins = {}
    for i, (op, shape) in enumerate(zip(desc.ops, shapes)):
        src = desc.op_inputs(i)
        if is_add_join(op):  # no node: NIR sums the edges into each consumer (nir_wiring)
            joins[str(i)] = {"snnquant_name": op.name, "join_kind": op.kind,
                             "shifts": np.array(op.shifts, dtype=np.int64),
                             "out_frac_bits": int(op.out_frac_bits),
                             "snnquant_inputs": np.array(op.inputs, dtype=np.int64)}
            binary[i] = False
            continue
        c = need[i] if isinstance(op, NeuronOp) else out_factor[i]
        key = _node_key(op.name, nodes)
        common = {"snnquant_schema": SCHEMA_VERSION, "snnquant_name": op.name, "units": units,
                  "unit_factor": float(c), "snnquant_index": i}
        if op.inputs:
            common["snnquant_inputs"] = np.array(op.inputs, dtype=np.int64)
        new = []
        is_binary = False
        if isinstance(op, SynapseOp):
            new.append((key, _synapse_node(nir, op, shape, c, common)))
        elif isinstance(op, NeuronOp):
            new.append((key, _neuron_node(nir, op, shape, c, dt, common)))
            is_binary = True
        elif isinstance(op, PoolOp):
            new += _pool_nodes(nir, op, key, shape, c, dt, max_pool, binary[src[0]], common)
            is_binary = op.kind == "max"
        elif isinstance(op, JoinOp):  # 'and' / 'iand' of spikes: a step function of their sum
            if not all(binary[j] for j in src):
                raise ExportError(f"layer {op.name!r}: the {op.kind!r} join has no NIR "
                                  f"equivalent for operands that are not spikes")
            level = 1.5 if op.kind == "and" else 0.5  # x0 + x1 > 3/2; x0 - x1 > 1/2
            meta = {**common, "snnquant_op": "join", "join_kind": op.kind,
                    "shifts": np.array(op.shifts, dtype=np.int64),
                    "out_frac_bits": int(op.out_frac_bits)}
            new.append((key, nir.Threshold(threshold=np.full(shape, level), metadata=meta)))
            is_binary = True
        else:
            meta = {**common, "snnquant_op": "flatten"}
            new.append((key, nir.Flatten(input_type={"input": np.array(shape)},
                                         start_dim=op.start_dim, end_dim=op.end_dim,
                                         metadata=meta)))
            is_binary = binary[src[0]]
        for k, node in new:
            nodes[k] = node
        for (a, _), (b, _) in zip(new, new[1:]):
            edges.append((a, b))
        head[i], tail[i], binary[i] = new[0][0], new[-1][0], is_binary
    shape_of = {NETWORK_INPUT: tuple(input_shape), **{i: after for i, (_, after) in
                                                      enumerate(in_out)}}
    for dst, sources in wiring.items():
        dst_key = "output" if dst == "output" else head[dst]
        for j, m in sorted(sources.items()):
            if m == 1.0:
                edges.append((tail[j], dst_key))
                continue
            name = _node_key(f"{dst_key}_scale_{tail[j]}", nodes)
            part_of = "the network output" if dst == "output" else repr(desc.ops[dst].name)
            nodes[name] = nir.Scale(scale=np.full(shape_of[j], m), metadata={
                "snnquant_schema": SCHEMA_VERSION, "snnquant_op": "scale",
                "part_of": f"the grid of an operand of {part_of}"})
            edges += [(tail[j], name), (name, dst_key)]
    nodes["output"] = nir.Output(output_type={"output": np.array(out_shape)})
    from ..._version import __version__
    meta = {"producer": "snnquant", "snnquant_schema": SCHEMA_VERSION,
            "snnquant_version": __version__, "units": units, "dt": dt,
            "max_pool_form": max_pool, "input_shape": np.array(input_shape, dtype=np.int64),
            "input_max": int(desc.input_max), "output_kind": desc.output_kind,
            "output_frac_bits": int(desc.output_frac_bits),
            "reference_dtype": desc.reference_dtype, "mantissa_bits": int(desc.mantissa_bits),
            "format_version": int(desc.format_version), "exact": bool(desc.exact),
            "notes": "\n".join(desc.notes),
            "fire_condition": "v > v_threshold (NIR), equal to snnquant's v_int >= threshold_int"}
    if joins:
        meta["snnquant_joins"] = joins
    graph = nir.NIRGraph(nodes=nodes, edges=edges, metadata=meta, type_check=False)
    warn_narrow_registers(desc, consumers, stacklevel=3)
    return graph


def _node_key(name: str, nodes) -> str:
    key = name.replace(".", "_").replace("/", "_")
    return f"{key}_{len(nodes)}" if key in nodes else key


def _synapse_node(nir, op: SynapseOp, shape, c: float, common):
    w = (op.weight.double() * op.weight_scale.reshape([-1] + [1] * (op.weight.dim() - 1))
         * c).numpy()
    b = None if op.bias is None else (op.bias.double() * (2.0 ** -op.out_frac_bits) * c).numpy()
    meta = {**common, **_synapse_meta(op)}
    if op.kind == "linear":
        return (nir.Linear(weight=w, metadata=meta) if b is None
                else nir.Affine(weight=w, bias=b, metadata=meta))
    bias = b if b is not None else np.zeros(w.shape[0])
    padding = op.padding if isinstance(op.padding, str) else (
        op.padding[0] if op.kind == "conv1d" else tuple(op.padding))
    if op.kind == "conv1d":
        return nir.Conv1d(input_shape=shape[-1], weight=w, stride=op.stride[0], padding=padding,
                          dilation=op.dilation[0], groups=op.groups, bias=bias, metadata=meta)
    return nir.Conv2d(input_shape=tuple(shape[-2:]), weight=w, stride=op.stride, padding=padding,
                      dilation=op.dilation, groups=op.groups, bias=bias, metadata=meta)


def _neuron_node(nir, op: NeuronOp, shape, c: float, dt: float, common):
    if op.reset_mode != "hard":
        raise ExportError(f"layer {op.name!r}: soft reset (v_reset=None) has no NIR "
                          f"equivalent (NIR neurons reset to v_reset)")
    unit = op.membrane_scale * c
    meta = {**common, **_neuron_meta(op, unit, dt)}
    v_th = np.full(shape, (op.threshold - 0.5) * unit)
    v_r = np.full(shape, float(op.v_reset * unit))
    if op.kind == "if":
        return nir.IF(r=np.full(shape, 1.0 / dt), v_threshold=v_th, v_reset=v_r, metadata=meta)
    tau = float(op.effective_tau)  # 2^k, or 2^F / M for a fixed-point leak
    return nir.LIF(tau=np.full(shape, tau * dt), r=np.full(shape, 1.0 if op.decay_input else tau),
                   v_leak=v_r.copy(), v_threshold=v_th, v_reset=v_r, metadata=meta)


def _pool_nodes(nir, op: PoolOp, key: str, shape, c: float, dt: float, max_pool: str, binary,
                common):
    """The NIR nodes of one pooling operation (two for max pooling of spikes)."""
    meta = {**common, "snnquant_op": "pool", "pool_kind": op.kind,
            "frac_bits_added": int(op.frac_bits_added),
            "kernel_size": np.array(op.kernel_size, dtype=np.int64),
            "stride": np.array(op.stride, dtype=np.int64),
            "padding": np.array(op.padding, dtype=np.int64)}
    if op.divisor != 1 or (op.dims == 1 and len(shape) == 1):
        if not (op.kind == "sum" and len(shape) == 1 and op.stride == op.kernel_size
                and op.padding == (0,) and shape[0] % op.kernel_size[0] == 0):
            raise ExportError(f"layer {op.name!r}: a 1-d pooling has a NIR equivalent only as "
                              f"an average over groups of features (VotingLayer)")
        meta.update(dims=1, divisor=int(op.divisor))
        return [(key, nir.Linear(weight=voting_weight(op, shape[0], c), metadata=meta))]
    if op.dims != 2 or any(v != 1 for v in op.dilation) or op.ceil_mode:
        raise ExportError(f"layer {op.name!r}: NIR has only 2-d pooling without dilation "
                          f"or ceil_mode")
    if op.output_size:
        for size_in, size_out, k in zip(shape[-2:], op.output_size, op.kernel_size):
            if adaptive_windows(size_in, size_out) != [(i * k, i * k + k) for i in range(size_out)]:
                raise ExportError(
                    f"layer {op.name!r}: the adaptive pooling from {tuple(shape[-2:])} to "
                    f"{op.output_size} has windows that overlap or repeat its input, which no NIR "
                    f"pooling (windows one stride apart) expresses; export with an input size "
                    f"that the output size divides")
        meta["output_size"] = np.array(op.output_size, dtype=np.int64)
    args = dict(kernel_size=np.array(op.kernel_size), stride=np.array(op.stride),
                padding=np.array(op.padding))
    if op.kind != "max":
        return [(key, nir.AvgPool2d(**args, metadata=meta))]
    if not binary:
        raise ExportError(f"layer {op.name!r}: max pooling of non-binary values has no "
                          f"NIR equivalent (only of spikes: SumPool2d + Threshold)")
    pooled = _pool_shape(shape, op)
    part = {**common, "snnquant_op": "part", "part_of": "max pooling of spikes"}
    part.pop("snnquant_inputs", None)
    meta["max_pool_form"] = max_pool
    if max_pool == "threshold":
        return [(key, nir.SumPool2d(**args, metadata=meta)),
                (key + "_threshold", nir.Threshold(threshold=np.zeros(pooled), metadata=part))]
    channels = shape[0]
    ones = np.zeros((channels, channels) + tuple(op.kernel_size))
    ones[np.arange(channels), np.arange(channels)] = 1.0
    return [(key, nir.Conv2d(input_shape=tuple(shape[-2:]), weight=ones, stride=op.stride,
                             padding=op.padding, dilation=(1, 1), groups=1,
                             bias=np.zeros(channels), metadata=meta)),
            (key + "_if", nir.IF(r=np.full(pooled, 1.0 / dt), v_threshold=np.full(pooled, 0.5),
                                 v_reset=np.zeros(pooled), metadata=part))]


def _pool_shape(shape, op: PoolOp):
    x = torch.zeros((1,) + tuple(shape), dtype=torch.int64)
    return tuple(IntegerSNN.pool(op, x).shape[1:])
