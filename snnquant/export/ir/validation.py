r"""One check of an :class:`~snnquant.export.IntegerNetwork`: :func:`check_network`.

An :class:`~snnquant.export.IntegerNetwork` is a plain dataclass that users may edit and save;
every entry (:class:`~snnquant.export.IntegerSNN`, :func:`~snnquant.export.to_c`,
:func:`~snnquant.export.to_nir`, :func:`~snnquant.export.save_integer`,
:func:`~snnquant.export.load_integer`, :func:`~snnquant.export.from_nir`) runs this check
(construction checks only that every operation reads earlier ones). It follows every edge
from the input to the output and checks, per operation:

* the types and ranges of its fields (bit widths, shifts in :math:`[0, 62]`, kinds, tensor
  dtypes and shapes per output channel, integer weights inside ``weight_bits``);
* the fractional bits along the edges: a synapse's and a neuron's ``in_frac_bits`` are those of
  the value they read, and an ``'add'`` join's shifts put every operand on its
  ``out_frac_bits`` (:math:`F_i + \sigma_i = F`);
* a neuron's grid (:math:`F_0 = F +` ``input_shift``, :math:`d = F_0 + \log_2 s_v`) and bounds
  (:math:`v_{min} < v_{max}` inside ``v_bits``, ``v_reset`` and ``v_init`` inside them, the
  threshold in :math:`[v_{min}, v_{max} + 1]`: :math:`v_{max} + 1` is a layer that never fires);
* what a join reads: ``'and'``/``'iand'`` join spikes (values in :math:`[0, 1]`);
* the value bounds proven from the description (the same as the C runtime's): every value and
  every register of a neuron's step stays below :math:`2^{62}`, so int64 arithmetic is exact;
* a chip network (:mod:`~snnquant.targets`): a sequence of one chip's layer
  operations, each field in its range, the weights' inputs those of the layer before;
* the sizes that would allocate in proportion at the first run, against documented bounds:
  pooling kernels, strides, dilations and adaptive output sizes, and convolution strides and
  dilations up to :data:`MAX_EXTENT`, a convolution's padding up to what its kernel reaches, a
  gather's input positions up to :data:`MAX_INDEX`;
* the channels (features) along the edges where the description alone says them: a synapse
  reads what the synapse before it writes, the operands of a join have the same; the whole
  shapes need one sample's input shape: checked here when the network holds it
  (:func:`~snnquant.export.ir.shapes.infer_shapes`, at most
  :data:`~snnquant.export.ir.shapes.MAX_SAMPLE_ELEMENTS` values per sample), and by
  :func:`~snnquant.export.backends.simulator.op_shapes` in every entry that has an input.

Errors are :class:`IntegerNetworkError` and name the operation's index and name, the field and the
value: ``operation 3 ('sn1') has threshold=300: it must be in [v_min, v_max + 1] = [-128, 128]``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from ...functional.int_limits import (FRAC_LIMIT, INT64_HEADROOM_BITS, as_int,
                                     weight_range)
from ...targets import CHIP_OP_TYPES, SpeckLayerOp
from .network import (JOIN_KINDS, NETWORK_INPUT, OP_TYPES, IntegerNetworkError, FlattenOp,
                      IntegerNetwork, JoinOp, NeuronOp, PoolOp, SynapseOp, check_inputs)
from .shapes import infer_shapes
from .transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp
from .program import (SynapseRescale, join_bound, join_range, matmul_range, neuron_program,
                      pool_range, reduce_range, scale_range, synapse_bounds)

__all__ = ["IntegerNetworkError", "check_network", "VALUE_LIMIT_BITS", "MAX_EXTENT",
           "MAX_INDEX"]

#: Every value of a valid network, and every register of a neuron's step, is below
#: ``2**VALUE_LIMIT_BITS`` in magnitude (head room below int64, as the C runtime keeps).
VALUE_LIMIT_BITS = INT64_HEADROOM_BITS
#: The largest kernel, stride, dilation and adaptive output size of a pooling, and the largest
#: stride and dilation of a convolution, per dimension: a description that loads is refused
#: before it is run when one is larger (a size allocates in proportion at the first run). A
#: convolution's padding is at most what its kernel reaches, ``dilation * (kernel - 1)``.
MAX_EXTENT = 1 << 10
#: The largest input position a gather's ``index`` may name (``2^32 - 1``).
MAX_INDEX = (1 << 32) - 1


def _fail(i: int, op, field: str, value, why: str) -> IntegerNetworkError:
    if isinstance(value, torch.Tensor):
        shown = repr(value.tolist()) if value.numel() <= 6 else \
            f"<tensor of shape {tuple(value.shape)}>"
    else:
        shown = repr(value)
    where = "the network" if i is None else f"operation {i} ({op.name!r})"
    error = IntegerNetworkError(f"{where} has {field}={shown}: {why}")
    error.index, error.field, error.why = i, field, why
    return error


def _is_int(v) -> bool:
    return as_int(v, numpy=False) is not None


def _int(i, op, field: str, low: int, high: int) -> int:
    v = getattr(op, field)
    if not _is_int(v) or not low <= v <= high:
        raise _fail(i, op, field, v, f"it must be an int in [{low}, {high}]")
    return v


def _ints(i, op, field: str, n: Optional[int], low: int, high: int) -> Tuple[int, ...]:
    v = getattr(op, field)
    if not isinstance(v, (tuple, list)) or (n is not None and len(v) != n) or not all(
            _is_int(k) and low <= k <= high for k in v):
        count = "" if n is None else f"{n} "
        raise _fail(i, op, field, v, f"it must be a tuple of {count}ints in [{low}, {high}]")
    return tuple(v)


def _int_tensor(i, op, field: str, length: int, low: int, high: int,
                allow_one: bool = False) -> torch.Tensor:
    t = getattr(op, field)
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() \
            or t.dtype == torch.bool:
        raise _fail(i, op, field, type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype,
                    "it must be an integer tensor")
    if tuple(t.shape) != (length,) and not (allow_one and t.numel() == 1):
        raise _fail(i, op, field, t, f"it must have shape ({length},) (one per output channel), "
                                     f"not {tuple(t.shape)}")
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < low or hi > high:
            raise _fail(i, op, field, t, f"it holds {lo if lo < low else hi}, outside "
                                         f"[{low}, {high}]")
    return t


def _check_synapse(i: int, op: SynapseOp, frac: int) -> None:
    n = {"linear": 0, "conv1d": 1, "conv2d": 2}.get(op.kind)
    if n is None:
        raise _fail(i, op, "kind", op.kind, "it must be 'linear', 'conv1d' or 'conv2d'")
    w = op.weight
    if not isinstance(w, torch.Tensor) or w.is_floating_point() or w.is_complex() \
            or w.dim() != n + 2 or w.numel() == 0:
        shown = w if isinstance(w, torch.Tensor) else type(w).__name__
        raise _fail(i, op, "weight", shown, f"it must be a non-empty integer tensor of "
                                            f"{n + 2} dimensions for a {op.kind} layer")
    bits = _int(i, op, "weight_bits", 1, 32)
    lo, hi = weight_range(bits, bool(w.numel()) and int(w.min()) < 0)
    w_lo, w_hi = int(w.min()), int(w.max())
    if w_lo < lo or w_hi > hi:
        raise _fail(i, op, "weight", w, f"it holds {w_lo if w_lo < lo else w_hi}, outside the "
                                        f"{bits}-bit range [{lo}, {hi}] of weight_bits")
    c_out = int(w.shape[0])
    scale = op.weight_scale
    # read in Python: a float tensor operation here would show in IntegerSNN's integer-only runs
    values = scale.tolist() if isinstance(scale, torch.Tensor) and scale.dim() <= 1 else None
    values = [values] if isinstance(values, float) else values
    if not values or len(values) not in (1, c_out) or not all(
            isinstance(v, float) and math.isfinite(v) and v > 0 for v in values):
        raise _fail(i, op, "weight_scale", scale, f"it must hold {c_out} finite numbers > 0")
    _int_tensor(i, op, "multiplier", c_out, 1, 1 << 52, allow_one=True)
    _int_tensor(i, op, "shift", c_out, 0, VALUE_LIMIT_BITS, allow_one=True)
    if op.bias is not None:
        _int_tensor(i, op, "bias", c_out, -(1 << VALUE_LIMIT_BITS), 1 << VALUE_LIMIT_BITS)
    if op.bias_bits is not None:
        _int(i, op, "bias_bits", 1, 64)
    if _int(i, op, "in_frac_bits", -FRAC_LIMIT, FRAC_LIMIT) != frac:
        raise _fail(i, op, "in_frac_bits", op.in_frac_bits,
                    f"it must be {frac}, the fractional bits of the value it reads")
    _int(i, op, "out_frac_bits", -FRAC_LIMIT, FRAC_LIMIT)
    if n:
        _ints(i, op, "stride", n, 1, MAX_EXTENT)
        dilation = _ints(i, op, "dilation", n, 1, MAX_EXTENT)
        if not (isinstance(op.padding, str) and op.padding in ("same", "valid")):
            padding = _ints(i, op, "padding", n, 0, MAX_EXTENT)
            reach = tuple(d * (k - 1) for d, k in zip(dilation, w.shape[2:]))
            if any(p > r for p, r in zip(padding, reach)):
                raise _fail(i, op, "padding", padding, f"it must be at most what the kernel "
                                                       f"reaches, dilation * (kernel - 1) = "
                                                       f"{reach}")
        groups = _int(i, op, "groups", 1, c_out)
        if c_out % groups:
            raise _fail(i, op, "groups", groups, f"it must divide the {c_out} output channels")


def _check_neuron(i: int, op: NeuronOp, frac: int) -> None:
    if op.kind not in ("if", "lif"):
        raise _fail(i, op, "kind", op.kind, "it must be 'if' or 'lif'")
    if op.reset_mode not in ("hard", "soft"):
        raise _fail(i, op, "reset_mode", op.reset_mode, "it must be 'hard' or 'soft'")
    if not isinstance(op.decay_input, bool):
        raise _fail(i, op, "decay_input", op.decay_input, "it must be a bool")
    bits = _int(i, op, "v_bits", 1, 32)
    v_min = _int(i, op, "v_min", -(1 << (bits - 1)), (1 << bits) - 1)
    v_max = _int(i, op, "v_max", -(1 << (bits - 1)), (1 << bits) - 1)
    if v_min >= v_max or (v_min < 0 and v_max >= 1 << (bits - 1)):
        raise _fail(i, op, "v_max", v_max, f"with v_min={v_min} it is not a range of "
                                           f"{bits}-bit integers (v_min < v_max)")
    _int(i, op, "v_reset", v_min, v_max)
    _int(i, op, "v_init", v_min, v_max)
    _int(i, op, "threshold", v_min, v_max + 1)
    k = _int(i, op, "leak_shift", 0, VALUE_LIMIT_BITS)
    m = _int(i, op, "leak_multiplier", 1, 1 << k)
    r = _int(i, op, "leak_round_shift", 0, k)
    if op.kind == "if" and (k, m) != (0, 1):
        raise _fail(i, op, "leak_shift", k, f"with leak_multiplier={m}: an IF layer has no leak "
                                            f"(0 and 1)")
    if op.exact is True and (m, r) != (1, 0):
        raise _fail(i, op, "exact", op.exact, f"an exact leak has leak_multiplier 1 and "
                                              f"leak_round_shift 0, not {m} and {r}")
    if _int(i, op, "in_frac_bits", -FRAC_LIMIT, FRAC_LIMIT) != frac:
        raise _fail(i, op, "in_frac_bits", op.in_frac_bits,
                    f"it must be {frac}, the fractional bits of the current it reads")
    input_shift = _int(i, op, "input_shift", 0, VALUE_LIMIT_BITS)
    grid_frac = _int(i, op, "grid_frac_bits", -FRAC_LIMIT, FRAC_LIMIT)
    if grid_frac != frac + input_shift:
        raise _fail(i, op, "input_shift", input_shift,
                    f"it must be grid_frac_bits - in_frac_bits = {grid_frac - frac}")
    d = _int(i, op, "grid_shift", 0, VALUE_LIMIT_BITS)
    s_v = op.membrane_scale
    real = isinstance(s_v, (int, float)) and not isinstance(s_v, bool) and math.isfinite(s_v)
    mantissa, e_v = math.frexp(s_v) if real and s_v > 0 else (None, None)
    if mantissa != 0.5:
        raise _fail(i, op, "membrane_scale", s_v, "it must be a power of two")
    if d != grid_frac + e_v - 1:
        raise _fail(i, op, "grid_shift", d, f"it must be grid_frac_bits + log2(membrane_scale) "
                                            f"= {grid_frac + e_v - 1}")


def _check_pool(i: int, op: PoolOp, last: bool) -> None:
    if op.kind not in ("max", "sum"):
        raise _fail(i, op, "kind", op.kind, "it must be 'max' or 'sum'")
    dims = _int(i, op, "dims", 1, 2)
    kernel = _ints(i, op, "kernel_size", dims, 1, MAX_EXTENT)
    _ints(i, op, "stride", dims, 1, MAX_EXTENT)
    padding = _ints(i, op, "padding", dims, 0, MAX_EXTENT)
    _ints(i, op, "dilation", dims, 1, MAX_EXTENT)
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise _fail(i, op, "padding", padding, f"it must be at most half the kernel {kernel}")
    if op.output_size:
        _ints(i, op, "output_size", dims, 1, MAX_EXTENT)
    added = _int(i, op, "frac_bits_added", 0, VALUE_LIMIT_BITS)
    divisor = _int(i, op, "divisor", 1, 1 << 30)
    if divisor != 1 and not last:
        raise _fail(i, op, "divisor", divisor, "an average over a number of values that is not "
                                               "a power of two must be the last operation")
    area = math.prod(kernel)
    if (op.kind == "max" and (added, divisor) != (0, 1)) or (
            op.kind == "sum" and (1 << added) * divisor != area):
        raise _fail(i, op, "frac_bits_added", added,
                    f"with divisor={divisor} it does not match {op.kind} pooling over "
                    f"{area} elements")


def _check_join(i: int, op: JoinOp, fracs, ranges) -> None:
    if op.kind not in JOIN_KINDS:
        raise _fail(i, op, "kind", op.kind, f"it must be one of {JOIN_KINDS}")
    shifts = _ints(i, op, "shifts", len(op.inputs), 0, VALUE_LIMIT_BITS)
    out_frac = _int(i, op, "out_frac_bits", -FRAC_LIMIT, FRAC_LIMIT)
    if op.kind == "add":
        operand_fracs = [fracs[j] for j in op.inputs]
        if any(f + k != out_frac for f, k in zip(operand_fracs, shifts)):
            raise _fail(i, op, "shifts", shifts,
                        f"they must put the operands' fractional bits {operand_fracs} on "
                        f"out_frac_bits={out_frac}")
        return
    for j in op.inputs:
        lo, hi = ranges[j]
        if lo < 0 or hi > 1:
            raise _fail(i, op, "kind", op.kind, f"it joins spikes (0/1), but operand {j} holds "
                                                f"values in [{lo}, {hi}]")


def _check_gather(i: int, op: GatherOp) -> None:
    shape = _ints(i, op, "shape", None, 1, 1 << 40)
    if not shape:
        raise _fail(i, op, "shape", op.shape, "it must have at least one dimension")
    if op.index is None:
        return
    size = math.prod(shape)
    index = op.index
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or \
            tuple(index.shape) != (size,):
        raise _fail(i, op, "index", index, f"it must be an int64 tensor of shape ({size},)")
    if size and (int(index.min()) < 0 or int(index.max()) > MAX_INDEX):
        raise _fail(i, op, "index", index, f"its entries must be >= 0 and <= {MAX_INDEX} "
                                           f"(input positions)")


def _check_bounds(i: int, op, field: str, bound: int, what: str) -> None:
    if bound >= 1 << VALUE_LIMIT_BITS:
        raise _fail(i, op, field, getattr(op, field), f"{what} is bounded only by {bound}, "
                                                      f"which reaches 2^{VALUE_LIMIT_BITS}: int64 "
                                                      f"arithmetic would overflow")


def _channels_in(i: int, op: SynapseOp, layout) -> None:
    """The channels (a convolution) or features (a linear layer) a synapse reads agree with
    what the value it reads is known to have (``layout``: ``('first', C)`` for ``[C, ...]``,
    ``('last', F)`` for ``[..., F]``, ``None`` when unknown without an input shape)."""
    need = int(op.weight.shape[1]) * (op.groups if op.kind != "linear" else 1)
    side = "last" if op.kind == "linear" else "first"
    if layout is not None and layout[0] == side and layout[1] != need:
        what = "features" if op.kind == "linear" else "channels"
        raise _fail(i, op, "weight", op.weight, f"of shape {tuple(op.weight.shape)} reads {need} "
                                                f"{what}, the value it reads has {layout[1]}")


def _layout_after(op, layout):
    """What is known of an operation's output channels or features without an input shape."""
    if isinstance(op, SynapseOp):
        return ("last" if op.kind == "linear" else "first", int(op.weight.shape[0]))
    if isinstance(op, NeuronOp) or (isinstance(op, PoolOp) and op.dims == 2):
        return layout
    return None


def _check_chip_network(desc: IntegerNetwork) -> None:
    """A chip network: a sequence of valid operations of one chip whose shapes chain."""
    chip = desc.chip
    for i, op in enumerate(desc.ops):
        if not isinstance(op, CHIP_OP_TYPES) or op.chip != chip:
            raise IntegerNetworkError(f"operation {i} ({op.name!r}) is a {type(op).__name__} in a "
                                      f"network of {chip} layers: a chip network holds only its "
                                      f"chip's layer operations")
        if op.inputs not in ((), (i - 1,)):
            raise _fail(i, op, "inputs", op.inputs, "a chip network is a sequence: each layer "
                                                    "reads the one before")
        for field, value, why in op.problems():
            raise _fail(i, op, field, value, why)
        if i and hasattr(op, "weight") and op.weight.dim() == 2 and \
                op.weight.shape[1] != math.prod(desc.ops[i - 1].out_shape):
            raise _fail(i, op, "weight", tuple(op.weight.shape),
                        f"it must read the {math.prod(desc.ops[i - 1].out_shape)} outputs of "
                        f"operation {i - 1}")
        if i and isinstance(op, SpeckLayerOp) and not op.linear and \
                tuple(op.in_shape) != tuple(desc.ops[i - 1].out_shape):
            raise _fail(i, op, "in_shape", op.in_shape,
                        f"it must be the output shape {desc.ops[i - 1].out_shape} of operation "
                        f"{i - 1}")
    if desc.output_kind != "spikes":
        raise _fail(None, desc, "output_kind", desc.output_kind,
                    "a chip network outputs spike counts ('spikes')")
    if desc.input_max != desc.ops[0].input_max:
        raise _fail(None, desc, "input_max", desc.input_max,
                    f"it must be the first layer's input_max, {desc.ops[0].input_max}")


def check_network(desc: IntegerNetwork) -> None:
    """Check that ``desc`` agrees with itself (see the module documentation). The shapes along
    the edges, which need one sample's input shape, are checked here when the network holds it
    (``desc.input_shape``: :func:`~snnquant.export.ir.shapes.infer_shapes`, without allocating),
    and for every input shape by :func:`~snnquant.export.backends.simulator.op_shapes` (run by
    :class:`~snnquant.export.IntegerSNN` once per input shape, :func:`~snnquant.export.to_c` and
    :func:`~snnquant.export.to_nir`).

    Raises:
        IntegerNetworkError: naming the operation's index and name, the field and the value.
    """
    if not isinstance(desc, IntegerNetwork):
        raise TypeError(f"desc must be an IntegerNetwork, got {type(desc).__name__}")
    if not _is_int(desc.input_max) or not 0 <= desc.input_max < 1 << VALUE_LIMIT_BITS:
        raise _fail(None, desc, "input_max", desc.input_max,
                    f"it must be an int in [0, 2^{VALUE_LIMIT_BITS})")
    if desc.output_kind not in ("spikes", "current"):
        raise _fail(None, desc, "output_kind", desc.output_kind, "it must be 'spikes' or 'current'")
    if not desc.ops:
        raise _fail(None, desc, "ops", [], "a network has at least one operation")
    fracs: Dict[int, int] = {NETWORK_INPUT: 0}
    ranges = {NETWORK_INPUT: (-desc.input_max, desc.input_max)}
    layouts = {NETWORK_INPUT: None}
    last = len(desc.ops) - 1
    for i, op in enumerate(desc.ops):
        if not isinstance(op, OP_TYPES):
            raise IntegerNetworkError(f"operation {i} is a {type(op).__name__}, not an operation "
                                      f"of an IntegerNetwork")
    check_inputs(desc.ops)
    if desc.chip is not None:
        _check_chip_network(desc)
        _check_shapes(desc)
        return
    for i, op in enumerate(desc.ops):
        src = desc.op_inputs(i)
        if not isinstance(op, (JoinOp, MatMulOp)) and len(src) != 1:
            raise _fail(i, op, "inputs", op.inputs, "only a join or a matmul reads more than one "
                                                    "value")
        frac, rng = fracs[src[0]], ranges[src[0]]
        if isinstance(op, SynapseOp):
            _check_synapse(i, op, frac)
            _channels_in(i, op, layouts[src[0]])
            bound = synapse_bounds(op, SynapseRescale.of(op), rng)
            _check_bounds(i, op, "shift", bound.widest, "the current")
            frac, rng = op.out_frac_bits, bound.out_range
        elif isinstance(op, NeuronOp):
            _check_neuron(i, op, frac)
            regs, _ = neuron_program(op).intervals(rng)
            _check_bounds(i, op, "grid_shift",
                          max(max(abs(lo), abs(hi)) for lo, hi in regs.values()), "the charge")
            frac, rng = 0, (0, 1)
        elif isinstance(op, PoolOp):
            _check_pool(i, op, i == last)
            frac, rng = frac + op.frac_bits_added, pool_range(op, rng)
            _check_bounds(i, op, "kernel_size", max(map(abs, rng)), "the pooled sum")
        elif isinstance(op, FlattenOp):
            _int(i, op, "start_dim", -64, 64)
            _int(i, op, "end_dim", -64, 64)
        elif isinstance(op, GatherOp):
            _check_gather(i, op)
        elif isinstance(op, ReduceOp):
            _ints(i, op, "dims", None, 0, 64)
            if not op.dims or list(op.dims) != sorted(set(op.dims)):
                raise _fail(i, op, "dims", op.dims, "they must be distinct, sorted and at least one")
            if not isinstance(op.keepdim, bool):
                raise _fail(i, op, "keepdim", op.keepdim, "it must be a bool")
            _int(i, op, "count", 1, 1 << 40)
            frac += _int(i, op, "frac_bits_added", 0, VALUE_LIMIT_BITS)
            rng = reduce_range(op, rng)
            _check_bounds(i, op, "count", max(map(abs, rng)), "the sum")
        elif isinstance(op, MatMulOp):
            if len(src) != 2:
                raise _fail(i, op, "inputs", op.inputs, "a matmul reads two values")
            _int(i, op, "inner", 1, 1 << 40)
            out_frac = _int(i, op, "out_frac_bits", -FRAC_LIMIT, FRAC_LIMIT)
            if out_frac != fracs[src[0]] + fracs[src[1]]:
                raise _fail(i, op, "out_frac_bits", out_frac,
                            f"it must be the operands' {fracs[src[0]]} + {fracs[src[1]]}")
            frac, rng = out_frac, matmul_range(op, ranges[src[0]], ranges[src[1]])
            _check_bounds(i, op, "inner", max(map(abs, rng)), "the matrix product")
        elif isinstance(op, ScaleOp):
            k = _int(i, op, "exponent", -VALUE_LIMIT_BITS, VALUE_LIMIT_BITS)
            frac, rng = frac - min(k, 0), scale_range(op, rng)
            _check_bounds(i, op, "exponent", max(map(abs, rng)), "the scaled value")
        else:
            _check_join(i, op, fracs, ranges)
            known = {layouts[j] for j in src} - {None}
            if len(known) > 1:
                raise _fail(i, op, "inputs", op.inputs, f"its operands have the channels or "
                                                        f"features {[layouts[j] for j in src]}")
            operands = [ranges[j] for j in src]
            _check_bounds(i, op, "shifts", join_bound(op, operands), f"the {op.kind} join")
            frac, rng = op.out_frac_bits, join_range(op, operands)
        fracs[i], ranges[i] = frac, rng
        # a join's operands have one shape: what one of them is known to have, its output has
        layouts[i] = (next(iter(known), None) if isinstance(op, JoinOp)
                      else _layout_after(op, layouts[src[0]]))
    if desc.output_kind == "current" and desc.output_frac_bits != fracs[last]:
        raise _fail(None, desc, "output_frac_bits", desc.output_frac_bits,
                    f"it must be {fracs[last]}, the fractional bits of the last operation's "
                    f"output")
    _check_shapes(desc)


def _check_shapes(desc: IntegerNetwork) -> None:
    """The shapes along every edge, without allocating, where ``desc`` holds its input shape."""
    shape = desc.input_shape
    if shape is None:
        return
    if not isinstance(shape, (tuple, list)) or not shape or not all(
            _is_int(v) and v >= 1 for v in shape):
        raise _fail(None, desc, "input_shape", shape, "it must be None or a non-empty tuple of "
                                                      "ints >= 1 (one sample's shape, without "
                                                      "time and batch)")
    infer_shapes(desc, shape)
