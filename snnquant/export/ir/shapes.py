r"""The shapes along every edge of an :class:`~snnquant.export.IntegerNetwork`, from one sample's
input shape, in integer arithmetic only: :func:`infer_shapes`.

Nothing is allocated: each operation's output shape is computed from its fields and its input's
shape by the rule PyTorch applies when :class:`~snnquant.export.IntegerSNN` runs it (a synapse's
features or channels, a convolution's and a pooling's output size, an adaptive pool's windows,
a flatten's dimensions, a gather's input positions, a sum's dimensions and ``count``, a matrix
product's ``inner`` length, a join's operands), and every value's size is checked against
:data:`MAX_SAMPLE_ELEMENTS` before the next operation is looked at. It is what
:func:`~snnquant.export.check_network` runs when the network holds its ``input_shape`` (so
:func:`~snnquant.export.load_integer` refuses an inconsistent file before anything runs), and
what :func:`~snnquant.export.backends.simulator.op_shapes` runs before it sends one sample
through the layers.
"""

from __future__ import annotations

import math
from typing import List, Tuple

from ...targets import CHIP_OP_TYPES
from .network import (NETWORK_INPUT, FlattenOp, IntegerNetworkError, JoinOp, NeuronOp, PoolOp,
                      SynapseOp, check_input_shape)
from .transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp

__all__ = ["infer_shapes", "MAX_SAMPLE_ELEMENTS", "SHAPE_DEPENDENT_OPS"]

#: The largest number of values of one sample, for the input and for every value a network
#: computes (``2^28``): a shape that implies more is refused before anything is allocated.
MAX_SAMPLE_ELEMENTS = 1 << 28

#: The operations whose consistency needs one sample's input shape to be checked (a gather's
#: input positions, a sum's dimensions and count, a matrix product's inner length): a file that
#: holds one of them must hold its ``input_shape`` (:func:`~snnquant.export.load_integer`).
SHAPE_DEPENDENT_OPS = (GatherOp, ReduceOp, MatMulOp)

Shape = Tuple[int, ...]


def _refuse(i: int, op, field: str, before, why: str) -> IntegerNetworkError:
    value = getattr(op, field, None)
    shown = f"<tensor of shape {tuple(value.shape)}>" if hasattr(value, "shape") else repr(value)
    inputs = " and ".join(str(tuple(s)) for s in before)
    err = IntegerNetworkError(f"operation {i} ({op.name!r}) has {field}={shown}: it does not fit "
                              f"its input of shape {inputs} (per sample): {why}")
    # what op_shapes words its own way: (index, name, its input, field=value: why)
    err.shape_detail = (i, op.name, tuple(before[0]), f"{field}={shown}: {why}")
    return err


def _window_out(size: int, kernel: int, stride: int, padding: int, dilation: int,
                ceil: bool) -> int:
    """PyTorch's output length of a convolution or pooling window along one dimension."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    if span < 0:
        return 0
    out = (span + (stride - 1 if ceil else 0)) // stride + 1
    if ceil and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _synapse(i: int, op: SynapseOp, x: Shape) -> Shape:
    c_in = int(op.weight.shape[1])
    if op.kind == "linear":
        if not x or x[-1] != c_in:
            raise _refuse(i, op, "weight", [x], f"a linear layer of {c_in} input features "
                                                f"reads the last dimension")
        return x[:-1] + (int(op.weight.shape[0]),)
    n = 1 if op.kind == "conv1d" else 2
    need = c_in * op.groups
    if len(x) != n + 1 or x[0] != need:
        raise _refuse(i, op, "weight", [x], f"a {op.kind} layer reads ({need}, ...) with "
                                            f"{n} spatial dimensions")
    kernel = tuple(int(k) for k in op.weight.shape[2:])
    if isinstance(op.padding, str):
        if op.padding == "same":
            if any(s != 1 for s in op.stride):
                raise _refuse(i, op, "stride", [x], "padding='same' needs stride 1")
            return (int(op.weight.shape[0]),) + x[1:]
        padding = (0,) * n
    else:
        padding = tuple(op.padding)
    out = tuple(_window_out(s, k, st, p, d, False) for s, k, st, p, d in
                zip(x[1:], kernel, op.stride, padding, op.dilation))
    if min(out) < 1:
        raise _refuse(i, op, "weight", [x], f"its kernel {kernel} (padding {padding}, dilation "
                                            f"{tuple(op.dilation)}) is larger than the input")
    return (int(op.weight.shape[0]),) + out


def _pool(i: int, op: PoolOp, x: Shape) -> Shape:
    dims = op.dims
    if not isinstance(op.ceil_mode, bool):
        raise _refuse(i, op, "ceil_mode", [x], "it must be a bool")
    if op.output_size:
        if len(x) < dims:
            raise _refuse(i, op, "output_size", [x], f"it pools the last {dims} dimensions")
        for size, out, width in zip(x[-dims:], op.output_size, op.kernel_size):
            # PyTorch's adaptive windows [floor(j n / m), ceil((j + 1) n / m)), each `width` long
            if any(-((-(j + 1) * size) // out) - (j * size) // out != width for j in range(out)):
                raise _refuse(i, op, "output_size", [x],
                              f"layer {op.name!r}: adaptive pooling of size {size} to {out} has "
                              f"windows other than the {width} elements (kernel_size) it was "
                              f"exported for; use the input size given to to_integer")
        return x[:-dims] + tuple(op.output_size)
    if dims == 1 and len(x) == 1:    # the features of [N, F] (VotingLayer)
        return _pool(i, op, (1,) + x)[1:]
    ranks = (dims, dims + 1) if op.kind == "max" else (dims + 1,)
    if len(x) not in ranks:
        raise _refuse(i, op, "dims", [x], f"a {dims}-d {op.kind} pooling reads "
                                          f"{' or '.join(map(str, ranks))} dimensions")
    if op.kind == "max":
        ceil, dilation = op.ceil_mode, op.dilation
    else:     # the simulator sums as a convolution with a kernel of ones
        ceil, dilation = False, (1,) * dims
    out = tuple(_window_out(s, k, st, p, d, ceil) for s, k, st, p, d in
                zip(x[-dims:], op.kernel_size, op.stride, op.padding, dilation))
    if min(out) < 1:
        raise _refuse(i, op, "kernel_size", [x], "the window is larger than the input")
    return x[:-dims] + out


def _flatten(i: int, op: FlattenOp, x: Shape) -> Shape:
    rank = len(x) + 1     # the simulator flattens [T*N, ...]
    start = op.start_dim + 1 if op.start_dim >= 0 else op.start_dim + rank
    end = op.end_dim + 1 if op.end_dim >= 0 else op.end_dim + rank
    if not 1 <= start < rank:
        raise _refuse(i, op, "start_dim", [x], f"it must name a dimension of the sample "
                                               f"(the batch stays)")
    if not start <= end < rank:
        raise _refuse(i, op, "end_dim", [x], f"it must name a dimension of the sample from "
                                             f"start_dim on")
    return x[:start - 1] + (math.prod(x[start - 1:end]),) + x[end:]


def _gather(i: int, op: GatherOp, x: Shape) -> Shape:
    size = math.prod(x)
    if op.index is None:
        if math.prod(op.shape) != size:
            raise _refuse(i, op, "shape", [x], f"a reshape keeps the {size} values, this one "
                                               f"has {math.prod(op.shape)}")
    elif op.index.numel() and int(op.index.max()) >= size:
        raise _refuse(i, op, "index", [x], f"it reads position {int(op.index.max())} of a "
                                           f"sample of {size} values")
    return tuple(op.shape)


def _reduce(i: int, op: ReduceOp, x: Shape) -> Shape:
    if any(d >= len(x) for d in op.dims):
        raise _refuse(i, op, "dims", [x], f"a sample has {len(x)} dimensions")
    count = math.prod(x[d] for d in op.dims)
    if count != op.count:
        raise _refuse(i, op, "count", [x], f"dims {list(op.dims)} sum {count} values, not "
                                           f"{op.count} values")
    if op.keepdim:
        return tuple(1 if d in op.dims else s for d, s in enumerate(x))
    return tuple(s for d, s in enumerate(x) if d not in op.dims)


def _matmul(i: int, op: MatMulOp, a: Shape, b: Shape) -> Shape:
    if len(a) < 2 or len(b) < 2 or len(a) != len(b):
        raise _refuse(i, op, "inputs", [a, b], "a matmul reads two samples of one rank, at "
                                               "least 2")
    if a[-1] != op.inner or b[-2] != op.inner:
        raise _refuse(i, op, "inner", [a, b], f"it multiplies over {a[-1]} and {b[-2]} values")
    lead = []
    for p, q in zip(a[:-2], b[:-2]):
        if p != q and 1 not in (p, q):
            raise _refuse(i, op, "inputs", [a, b], "their leading dimensions do not broadcast")
        lead.append(max(p, q))
    return tuple(lead) + (a[-2], b[-1])


def _chip(i: int, op, x: Shape) -> Shape:
    want = tuple(int(v) for v in op.in_shape)
    if x != want and not (getattr(op, "linear", False) and math.prod(x) == math.prod(want)):
        raise _refuse(i, op, "in_shape" if hasattr(type(op), "__dataclass_fields__") and
                      "in_shape" in type(op).__dataclass_fields__ else "weight", [x],
                      f"the layer reads {want}")
    return tuple(int(v) for v in op.out_shape)


def infer_shapes(desc, input_shape) -> List[Tuple[Shape, Shape]]:
    """Per operation of ``desc``, one sample's ``(input shape, output shape)`` for the input
    shape ``input_shape``, computed without allocating (see the module documentation). The
    fields ``desc`` holds are assumed valid (:func:`~snnquant.export.check_network` checks them
    first).

    Raises:
        ValueError: ``input_shape`` is not a tuple of ints >= 1.
        IntegerNetworkError: a shape holds more than :data:`MAX_SAMPLE_ELEMENTS` values, or an
            operation does not fit its input, naming the operation's index and name, the field
            and its value.
    """
    shape = check_input_shape(input_shape)
    if math.prod(shape) > MAX_SAMPLE_ELEMENTS:
        raise IntegerNetworkError(f"the network has input_shape={shape}: {math.prod(shape)} values "
                                  f"per sample, more than MAX_SAMPLE_ELEMENTS = "
                                  f"{MAX_SAMPLE_ELEMENTS}")
    shapes = {NETWORK_INPUT: shape}
    out = []
    for i, op in enumerate(desc.ops):
        xs = [shapes[j] for j in desc.op_inputs(i)]
        x = xs[0]
        if isinstance(op, SynapseOp):
            y = _synapse(i, op, x)
        elif isinstance(op, PoolOp):
            y = _pool(i, op, x)
        elif isinstance(op, FlattenOp):
            y = _flatten(i, op, x)
        elif isinstance(op, GatherOp):
            y = _gather(i, op, x)
        elif isinstance(op, ReduceOp):
            y = _reduce(i, op, x)
        elif isinstance(op, MatMulOp):
            y = _matmul(i, op, x, xs[1])
        elif isinstance(op, JoinOp):
            if len(set(xs)) != 1:
                raise _refuse(i, op, "inputs", xs, f"the operands have the shapes {xs}, a "
                                                   f"join's have one")
            y = x
        elif isinstance(op, CHIP_OP_TYPES):
            y = _chip(i, op, x)
        elif isinstance(op, (NeuronOp, ScaleOp)):
            y = x
        else:
            raise IntegerNetworkError(f"operation {i} is a {type(op).__name__}, not an operation "
                                      f"of an IntegerNetwork")
        if math.prod(y) > MAX_SAMPLE_ELEMENTS:
            raise _refuse(i, op, _size_field(op), xs,
                          f"its output {y} holds {math.prod(y)} values per sample, more than "
                          f"MAX_SAMPLE_ELEMENTS = {MAX_SAMPLE_ELEMENTS}")
        shapes[i] = y
        out.append((x, y))
    return out


def _size_field(op) -> str:
    """The field that sets an operation's output size."""
    return {GatherOp: "shape", MatMulOp: "inputs", PoolOp: "output_size",
            SynapseOp: "weight"}.get(type(op), "inputs")
