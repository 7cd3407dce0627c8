r"""Integer simulator of an exported network: :class:`IntegerSNN`.

Every value is an integer, held exactly: ``int8`` spikes, ``int16``/``int32`` where the bounds
proven from the description stay below :math:`2^{15}`/:math:`2^{31}` (else ``int64``), and, for the
synapses and sum pooling where the proven bound of every partial sum stays below :math:`2^{24}`,
``float32`` (see :class:`IntegerSNN`'s ``synapse_arithmetic``): the float scales of the description
are never used inside the time loop. Stateless operations (synapses, pooling, flatten) run on all
time steps at once (``[T*N, ...]``); neurons loop over time, exactly as SpikingJelly's multi-step
mode does: large layers as the step's C reading compiled
(:mod:`~snnquant.export.backends.compiled_neuron`), others in integer tensors written in place, with
whatever of their step depends on the input only (its shift onto the shared grid) computed for all
steps at once before the loop. A graph
(branches and :class:`~snnquant.export.JoinOp` joins) runs in the order of its operations, each
reading its inputs from a table of values by operation index.
"""

from __future__ import annotations

import math
import os
import platform
from typing import Dict, Tuple, Union

import torch
import torch.nn.functional as F

from ..ir.network import (NETWORK_INPUT, IntegerNetworkError, FlattenOp, IntegerNetwork, JoinOp,
                          NeuronOp, PoolOp, SynapseOp)
from ..ir.transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp
from . import compiled_neuron
from ...targets import CHIP_OP_TYPES
from ..ir import integer_ops
from ..ir.integer_ops import narrowest_int, round_half_even_shift
from ..ir.program import (SynapseRescale, adaptive_windows, join_range, matmul_range,
                          neuron_program, pool_range, reduce_range, scale_range, synapse_bounds)
from ..ir.shapes import infer_shapes
from ..ir.validation import check_network

__all__ = ["IntegerSNN", "op_shapes", "SYNAPSE_ARITHMETIC", "float32_sums_are_exact"]

#: every integer of magnitude up to 2^24 is a float32
_FLOAT32_LIMIT = 1 << 24
#: neuron layers with this many neuron-steps in a call (or more) run compiled: the one-time build
#: (a fraction of a second, then cached on disk) pays off
_COMPILED_MIN_STEPS = 1 << 15

#: The values of :class:`IntegerSNN`'s ``synapse_arithmetic``.
SYNAPSE_ARITHMETIC = ("auto", "integer")


def _dtype_for(magnitude: int, narrowest: torch.dtype = torch.int32) -> torch.dtype:
    """``int16`` (only where ``narrowest`` allows it) or ``int32`` when every value (and every
    intermediate) stays below :math:`2^{15}` or :math:`2^{31}`, else ``int64``."""
    return narrowest_int(-magnitude, magnitude, narrowest) or torch.int64


def float32_sums_are_exact() -> bool:
    """Whether PyTorch adds float32 convolutions and matrix products on the CPU in IEEE float32
    here, by direct or GEMM algorithms: oneDNN available and enabled (PyTorch then takes its
    direct convolution, never NNPACK's Winograd one), float32 matrix precision ``'highest'``, no
    reduced-precision (``bf16``/``tf32``) ``fp32_precision`` for float32 in
    ``torch.backends``/``torch.backends.mkldnn``, and no lower oneDNN default math mode
    (``ONEDNN_DEFAULT_FPMATH_MODE``/``DNNL_DEFAULT_FPMATH_MODE`` unset or ``STRICT``). Checked on
    every :class:`IntegerSNN` call."""
    mkldnn = torch.backends.mkldnn
    if not (mkldnn.is_available() and mkldnn.enabled):
        return False
    if torch.get_float32_matmul_precision() != "highest":
        return False
    for backend in (torch.backends, mkldnn, getattr(mkldnn, "conv", None),
                    getattr(mkldnn, "matmul", None)):
        if getattr(backend, "fp32_precision", "none") not in ("none", "ieee"):
            return False
    return all(os.environ.get(var, "strict").lower() == "strict"
               for var in ("ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE"))


def _float_convolution_allowed(depthwise: bool) -> bool:
    # PyTorch builds for 32-bit ARM compute 3x3 depthwise float convolutions by Winograd
    return not depthwise or platform.machine().lower() in ("x86_64", "amd64")


def _matmul(op: MatMulOp, prm, xs) -> torch.Tensor:
    """:math:`a b` per sample (``[T*N, ..., M, K] @ [T*N, ..., K, L]``) in int64."""
    a, b = (x.to(prm["dtype"]) for x in xs)
    if a.dim() < 3 or b.dim() < 3 or a.shape[-1] != op.inner or b.shape[-2] != op.inner:
        raise ValueError(f"it multiplies samples of shapes {tuple(a.shape[1:])} and "
                         f"{tuple(b.shape[1:])}, not over {op.inner} values")
    return torch.matmul(a, b)


def _join(op: JoinOp, prm, xs) -> torch.Tensor:
    r"""``'add'``: :math:`\sum_i x_i 2^{\sigma_i}`; ``'and'``: :math:`x_0 x_1`; ``'iand'``:
    :math:`x_0 (1 - x_1)`."""
    xs = [x.to(prm["dtype"]) for x in xs]
    if op.kind == "and":
        return xs[0] * xs[1]
    if op.kind == "iand":
        return xs[0] * (1 - xs[1])
    out = xs[0] * (1 << op.shifts[0])
    for x, k in zip(xs[1:], op.shifts[1:]):
        out = out + x * (1 << k)
    return out


def _adaptive_sum(op: PoolOp, x: torch.Tensor) -> torch.Tensor:
    """Sum over PyTorch's adaptive windows, one spatial dimension after the other."""
    for axis, (size_out, width) in enumerate(zip(op.output_size, op.kernel_size)):
        dim = x.dim() - op.dims + axis
        size_in = x.shape[dim]
        windows = adaptive_windows(size_in, size_out)
        if any(b - a != width for a, b in windows):
            raise ValueError(f"layer {op.name!r}: adaptive pooling of size {size_in} to "
                             f"{size_out} has windows other than the {width} elements it was "
                             f"exported for; use the input size given to to_integer")
        index = torch.tensor([a for a, _ in windows], dtype=torch.int64, device=x.device)
        x = sum(x.index_select(dim, index + j) for j in range(width))
    return x


class IntegerSNN:
    r"""Run an :class:`~snnquant.export.IntegerNetwork` in exact integer arithmetic.

    Per synaptic layer :math:`X = (\mathrm{conv}(x, w)\, m) \ll \sigma + b`, computed as
    :math:`\mathrm{conv}(x, w\, m 2^{\sigma}) + b` (one operation for all time steps); per neuron
    layer and step :math:`q = \mathrm{clamp}(\mathrm{rhe}(H, d + k), v_{min}, v_{max})`,
    :math:`S = [q \ge \theta]`, then hard or soft reset (see
    :class:`~snnquant.export.NeuronOp`; the leak is :math:`M (\cdot)` with an integer
    multiplication when ``leak_multiplier`` :math:`M \ne 1`), the operation list of
    :func:`~snnquant.export.ir.program.neuron_program`, which :func:`~snnquant.export.to_c` prints
    as C. The membrane starts at ``v_init`` on every call. Each layer computes in the narrowest
    of ``int16`` (a synapse's accumulation and, when it fits too, its rescale; a neuron's step),
    ``int32`` and ``int64`` that the bounds proven from the description (the same ones the C
    runtime uses) allow for the largest magnitude of the call's input; the results do not depend
    on it.

    PyTorch has no fast integer convolution on the CPU, so with ``synapse_arithmetic='auto'``
    a synapse (and a sum pooling) computes in ``float32`` where that is exact: its inputs and
    weights are integers, and every partial sum of :math:`\mathrm{conv}(x, w') + b`, in whatever
    order and grouping a direct or GEMM algorithm adds the products (fused multiply-adds
    included), is bounded by :math:`\lVert w'_c \rVert_1 x_{max} + |b_c| < 2^{24}`
    (:class:`~snnquant.export.ir.program.SynapseBounds`, proven from the description and the call's
    input bound), so every product and sum is an integer that float32 holds exactly and no
    operation rounds; the result is converted back to integers for the neuron. It does so only
    while :func:`float32_sums_are_exact` (no reduced-precision float32 mode, oneDNN's direct
    convolution rather than a Winograd one) and computes in integers otherwise. Its results
    are identical to ``synapse_arithmetic='integer'``, where every torch operation produces an
    integer or bool tensor.

    A neuron layer with at least ``2**15`` neuron-steps in a call runs its step's C reading
    (the C runtime's, in ``int64_t``) compiled on first use with the cpp backend's compiler into
    its kernel cache (:func:`~snnquant.export.backends.compiled_neuron.neuron_kernel`); smaller
    layers, or any layer where no compiler is found, step in integer tensors with the same
    results.

    A chip network (:attr:`~snnquant.export.IntegerNetwork.chip`, exported from a network of
    :mod:`snnquant.targets`) runs each layer with its operation's ``run``
    (:mod:`~snnquant.targets`): the chip's step of
    :mod:`snnquant.functional.chip_neurons`, the one its layer trained with, on integers held in
    float64 (every value of the chips' 8-bit weights and 16- or 24-bit states is below
    :math:`2^{53}`: exact); its output and recorded layers are ``int64`` counts.

    On the same integer input its spikes equal those of the fake-quantized float model in eval
    mode (in the description's ``reference_dtype``), layer by layer and step by step, when the
    description is exact (``desc.exact``); with a fixed-point leak (``exact=False``) they may
    differ.

    Args:
        desc: the exported network.
        device: ``'cpu'`` (PyTorch has no integer convolutions on CUDA). Use more threads
            (``torch.set_num_threads``) for large networks.
        synapse_arithmetic: ``'integer'`` (the default: integer tensors only, every torch
            operation of a call produces an integer or bool tensor) or ``'auto'`` (float32
            where proven exact, as above: the same results, several times faster on CPUs for
            convolutional networks; use it to evaluate a deployed network on a whole test set).
    """

    def __init__(self, desc: IntegerNetwork, device: Union[str, torch.device] = "cpu",
                 synapse_arithmetic: str = "integer"):
        if not isinstance(desc, IntegerNetwork):
            raise TypeError(f"desc must be an IntegerNetwork, got {type(desc).__name__}")
        if synapse_arithmetic not in SYNAPSE_ARITHMETIC:
            raise ValueError(f"synapse_arithmetic must be one of {SYNAPSE_ARITHMETIC}, got "
                             f"{synapse_arithmetic!r}")
        check_network(desc)
        self.desc = desc
        self.synapse_arithmetic = synapse_arithmetic
        self.device = torch.device(device)
        if self.device.type != "cpu":
            raise ValueError(f"device must be 'cpu', got {device!r}: PyTorch implements integer "
                             f"convolutions and matrix products on the CPU only")
        self._plans: Dict[Tuple[int, bool], list] = {}
        self._checked_shapes = set()
        self._params = self._plan(int(desc.input_max))
        # the last operation that reads each value: a call frees the value after that one
        self._last_use = {}
        for i in range(len(desc.ops)):
            for j in desc.op_inputs(i):
                self._last_use[j] = i

    def _plan(self, input_bound: int, float32: bool = False) -> list:
        """Per operation: its tensors and types for inputs with :math:`|x| \\le`
        ``input_bound``, with float32 synapses where proven exact if ``float32`` (cached: a call
        on spikes gets the narrow types of spikes)."""
        key = (input_bound, float32)
        if key in self._plans:
            return self._plans[key]
        plan = []
        ranges = {NETWORK_INPUT: (-input_bound, input_bound)}
        for i, op in enumerate(self.desc.ops):
            rng = ranges[self.desc.op_inputs(i)[0]]
            if isinstance(op, SynapseOp):
                rescale = SynapseRescale.of(op)
                bound = synapse_bounds(op, rescale, rng)
                plan.append(self._synapse_plan(op, rescale, bound, rng, float32))
                rng = bound.out_range
            elif isinstance(op, NeuronOp):
                program = neuron_program(op)
                dtype = _dtype_for(program.torch_bound(rng), torch.int16)
                # spikes for float32 synapses in float32 (0 and 1: exact), saving a conversion
                last = i == len(self.desc.ops) - 1
                plan.append(dict(program=program, dtype=dtype, spike_dtype=torch.float32
                                 if float32 and not last else torch.int8))
                rng = (0, 1)
            elif isinstance(op, PoolOp):
                rng = pool_range(op, rng)
                if op.kind == "max" and not op.output_size:
                    dtype = None    # the maximum of exact values, in the input's own type
                elif (float32 and max(map(abs, rng)) < _FLOAT32_LIMIT
                        and _float_convolution_allowed(depthwise=True)):
                    dtype = torch.float32   # every partial sum bounded by rng: exact
                else:
                    dtype = _dtype_for(max(map(abs, rng)))
                plan.append(dict(dtype=dtype))
            elif isinstance(op, JoinOp):
                operands = [ranges[j] for j in self.desc.op_inputs(i)]
                rng = join_range(op, operands)
                widest = max(max(abs(lo), abs(hi)) << k for (lo, hi), k in zip(operands, op.shifts))
                plan.append(dict(dtype=_dtype_for(max(widest, *map(abs, rng)))))
            elif isinstance(op, (ReduceOp, MatMulOp, ScaleOp)):
                if isinstance(op, ReduceOp):
                    rng = reduce_range(op, rng)
                elif isinstance(op, ScaleOp):
                    rng = scale_range(op, rng)
                else:
                    rng = matmul_range(op, *(ranges[j] for j in self.desc.op_inputs(i)))
                # every partial sum lies in rng; int64 matmul (no int16/int32 kernels on the CPU)
                plan.append(dict(dtype=torch.int64 if isinstance(op, MatMulOp)
                                 else _dtype_for(max(map(abs, rng)))))
            elif isinstance(op, GatherOp):
                plan.append(dict(index=None if op.index is None else op.index.to(self.device)))
            else:
                plan.append(None)
            ranges[i] = rng
        self._plans[key] = plan
        return plan

    def _synapse_plan(self, op: SynapseOp, rescale: SynapseRescale, bound, rng,
                      float32: bool) -> dict:
        """The tensors and types of one synapse (see :meth:`_plan`)."""
        mag = max(map(abs, rng))
        if float32 and max(bound.widest, mag) < _FLOAT32_LIMIT \
                and _float_convolution_allowed(depthwise=op.groups > 1):
            # every partial sum of conv(x, f w) + b is bounded by bound.current < 2^24
            weight, bias = rescale.folded(op.weight, torch.int64)
            return dict(weight=weight.to(torch.float32).to(self.device), dtype=torch.float32,
                        bias=None if bias is None else bias.to(torch.float32).to(self.device),
                        rescale=None, out_dtype=torch.float32)
        # the current's type; the accumulation in int16 where its own bound allows
        # (PyTorch's int16 convolution is the fastest), then the rescale apart
        dtype = _dtype_for(max([bound.widest, mag] + [abs(f) for f in rescale.factor]))
        acc_dtype = _dtype_for(max(bound.accumulator + bound.l1 + (mag,)), torch.int16)
        if any(d != 1 for d in op.dilation):
            dtype = acc_dtype = torch.int64  # no int16/int32 dilated convolution
        if _dtype_for(bound.widest, torch.int16) == acc_dtype:
            dtype = acc_dtype   # the rescale fits the accumulator's type: fold it
        if acc_dtype == dtype:
            weight, bias = rescale.folded(op.weight, dtype)
            rescale = None
        else:
            weight, bias = op.weight.to(acc_dtype), None
        return dict(weight=weight.to(self.device), dtype=acc_dtype,
                    bias=None if bias is None else bias.to(self.device),
                    rescale=rescale, out_dtype=dtype)

    # ---- operations -------------------------------------------------------------------------
    def _stateless(self, op, prm, x: torch.Tensor) -> torch.Tensor:
        """One synapse, pool or flatten op on ``x`` ``[T*N, ...]`` (no state over time)."""
        if isinstance(op, SynapseOp):
            return self._synapse(op, prm, x.to(prm["dtype"]))
        if isinstance(op, PoolOp):
            return self.pool(op, x if prm["dtype"] is None else x.to(prm["dtype"]))
        if isinstance(op, FlattenOp):
            start = op.start_dim + 1 if op.start_dim >= 0 else op.start_dim
            end = op.end_dim + 1 if op.end_dim >= 0 else op.end_dim
            return torch.flatten(x, start, end)
        if isinstance(op, GatherOp):
            flat = x.reshape(x.shape[0], -1)
            if prm["index"] is not None:
                top = int(prm["index"].max()) if prm["index"].numel() else -1
                if flat.shape[1] <= top:
                    raise ValueError(f"its index reads position {top} of a sample of "
                                     f"{flat.shape[1]} values")
                flat = flat.index_select(1, prm["index"])
            return flat.reshape((x.shape[0],) + tuple(op.shape))
        if isinstance(op, ReduceOp):
            dims = tuple(d + 1 for d in op.dims)
            if any(d >= x.dim() for d in dims) or \
                    math.prod(x.shape[d] for d in dims) != op.count:
                raise ValueError(f"it sums dims {list(op.dims)} of a sample of shape "
                                 f"{tuple(x.shape[1:])}, not {op.count} values")
            return x.to(prm["dtype"]).sum(dim=dims, keepdim=op.keepdim, dtype=prm["dtype"])
        if isinstance(op, ScaleOp):
            x = x.to(prm["dtype"])
            return x * (1 << op.exponent) if op.exponent > 0 else x
        raise TypeError(f"unknown operation {type(op).__name__} ({op.name!r})")

    def _synapse(self, op: SynapseOp, prm, x: torch.Tensor) -> torch.Tensor:
        r""":math:`X = \mathrm{conv}(x, f w) + b`: the rescale folded into the weights."""
        w, b = prm["weight"], prm["bias"]
        if op.kind == "linear":
            acc = F.linear(x, w, b)
        else:
            conv = F.conv1d if op.kind == "conv1d" else F.conv2d
            with torch.backends.nnpack.flags(enabled=False):   # no Winograd in float32
                acc = conv(x, w, b, op.stride, op.padding, op.dilation, op.groups)
        if prm["rescale"] is None:
            return acc
        return prm["rescale"].apply(acc, prm["out_dtype"])

    @classmethod
    def pool(cls, op: PoolOp, x: torch.Tensor) -> torch.Tensor:
        """The integer output ``[N, C, ...]`` of the pooling operation ``op`` on ``x``: a max, or
        a sum over each window (adaptive windows included), in ``x``'s integer dtype."""
        if op.output_size:
            return _adaptive_sum(op, x)
        if op.dims == 1 and x.dim() == 2:  # features of [N, F] (VotingLayer)
            return cls.pool(op, x.unsqueeze(1)).squeeze(1)
        if op.kind == "max":
            if op.dims == 2:
                return F.max_pool2d(x, op.kernel_size, op.stride, op.padding, op.dilation,
                                    op.ceil_mode)
            y = F.max_pool2d(x.unsqueeze(-2), (1,) + op.kernel_size, (1,) + op.stride,
                             (0,) + op.padding, (1,) + op.dilation, op.ceil_mode)
            return y.squeeze(-2)
        c = x.shape[1]
        ones = torch.ones((c, 1) + op.kernel_size, dtype=x.dtype, device=x.device)
        conv = F.conv2d if op.dims == 2 else F.conv1d
        with torch.backends.nnpack.flags(enabled=False):
            return conv(x, ones, None, op.stride, op.padding, 1, c)

    @staticmethod
    def _neuron(prm, x_seq: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
        """Run the neuron layer's :class:`~snnquant.export.ir.program.NeuronProgram` over time: as
        compiled C (:mod:`~snnquant.export.backends.compiled_neuron`) for layers of at least
        ``_COMPILED_MIN_STEPS`` neuron-steps where a compiler is found, else in torch, every
        register written in place into a tensor of its own (the membrane into two, in turn).
        With ``overwrite`` (nothing else reads ``x_seq``), compiled spikes of ``x_seq``'s dtype
        are written over it."""
        program, rhe = prm["program"], round_half_even_shift
        if x_seq.numel() >= _COMPILED_MIN_STEPS and rhe is integer_ops.round_half_even_shift:
            kernel = compiled_neuron.neuron_kernel(program, x_seq.dtype, prm["spike_dtype"])
            if kernel is not None:
                reuse = overwrite and x_seq.dtype == prm["spike_dtype"] and x_seq.is_contiguous()
                return kernel(x_seq, x_seq if reuse else None)
        x_seq = x_seq.to(prm["dtype"])
        shape, dtype = x_seq.shape[1:], x_seq.dtype
        spikes = torch.empty(x_seq.shape, dtype=prm["spike_dtype"], device=x_seq.device)
        if rhe is not integer_ops.round_half_even_shift:    # a substitute rounding (tests)
            def rhe(d, k, out=None, substitute=rhe):
                return substitute(d, k) if out is None else out.copy_(substitute(d, k))
        hoisted = program.precompute(x_seq, rhe)
        buffers = {i.dst: torch.empty(shape, dtype=dtype, device=x_seq.device)
                   for i in program.instrs if i.dst not in hoisted}
        v = torch.full(shape, program.v_init, dtype=dtype, device=x_seq.device)
        spare = torch.empty_like(v)
        for t in range(x_seq.shape[0]):
            buffers["v_next"] = spare
            spare, (v, s) = v, program.run(v, x_seq[t], rhe, buffers=buffers,
                                           given={k: h[t] for k, h in hoisted.items()})
            spikes[t].copy_(s)
        return spikes

    # ---- call -------------------------------------------------------------------------------
    def __call__(self, x_seq: torch.Tensor, record: bool = False, per_step: bool = False
                 ) -> Union[torch.Tensor, Tuple[torch.Tensor, Dict[str, torch.Tensor]]]:
        r"""Run the network on integer input ``x_seq`` of shape ``[T, N, ...]``.

        Args:
            x_seq: integer (or bool) tensor of event counts or spikes, ``|x| <= desc.input_max``.
            record: also return the spikes of every neuron layer, ``{name: [T, N, ...] int8}``
                (and, for a ``'current'`` output, the output under the last layer's name).
            per_step: for a network whose output is a mean over time (``output_time_mean``),
                the output of every step ``[T, N, ...]`` instead of their sum.

        Returns:
            The output: ``int8`` spikes ``[T, N, ...]`` (``output_kind='spikes'``), ``int64``
            counts when the network ends in a sum pool of spikes, or ``int64`` currents in units
            of :math:`2^{-F}` (``'current'``); dividing by
            :attr:`~snnquant.export.IntegerNetwork.output_divisor` gives the float model's
            output. With ``output_time_mean``, the ``int64`` sum over the steps ``[N, ...]``
            (divide by :math:`T` too), or with ``per_step`` every step's. With ``record``,
            ``(output, layers)``. :meth:`float_output` gives the float model's output in one
            call.
        """
        if not isinstance(x_seq, torch.Tensor):
            raise TypeError(f"x_seq must be a tensor, got {type(x_seq).__name__}")
        if x_seq.is_floating_point() or x_seq.is_complex():
            raise TypeError(f"x_seq must be an integer or bool tensor of event counts, got "
                            f"{x_seq.dtype}; convert exact integer-valued floats with "
                            f"x.to(torch.int64)")
        if x_seq.dim() < 3:
            raise ValueError(f"x_seq must have shape [T, N, ...], got shape {tuple(x_seq.shape)}")
        x = x_seq.to(self.device)
        if x.dtype == torch.bool or x.dtype == torch.uint8:
            x = x.to(torch.int32)
        float32 = self.synapse_arithmetic == "auto" and float32_sums_are_exact()
        if float32 and self.desc.input_max < _FLOAT32_LIMIT:
            # float32 rounding is monotonic and exact up to 2^24 > input_max: every |x| above
            # input_max stays above it, every other x is exact (and its minimum and maximum are
            # found faster than in int64); the float synapses take this copy
            x = x.to(torch.float32)
        if x.numel():
            lo, hi = torch.aminmax(x)
            peak = max(-int(lo), int(hi))
            if peak > self.desc.input_max:
                lo, hi = torch.aminmax(x_seq.to(torch.int64))
                raise ValueError(f"x_seq has an entry of magnitude {max(-int(lo), int(hi))}, "
                                 f"above input_max={self.desc.input_max} for which the export "
                                 f"is exact")
        T, N = x.shape[0], x.shape[1]
        if tuple(x.shape[2:]) not in self._checked_shapes:
            _op_shapes(self, tuple(x.shape[2:]))    # the shapes along every edge, once per shape
            self._checked_shapes.add(tuple(x.shape[2:]))
        # the types follow the bound of this input, rounded up to 2^b - 1 (few cached plans)
        plan = self._plan((1 << peak.bit_length()) - 1 if x.numel() else 1, float32)
        values = {NETWORK_INPUT: x.reshape((T * N,) + tuple(x.shape[2:]))}
        layers = {}
        for i, (op, prm) in enumerate(zip(self.desc.ops, plan)):
            src = self.desc.op_inputs(i)
            if isinstance(op, JoinOp):
                y = _join(op, prm, [values[j] for j in src])
            elif isinstance(op, MatMulOp):
                y = _matmul(op, prm, [values[j] for j in src])
            elif isinstance(op, CHIP_OP_TYPES):
                x = values[src[0]]
                try:
                    s = op.run(x.reshape((T, N) + tuple(x.shape[1:])))
                except ValueError as err:
                    raise ValueError(f"operation {i} ({op.name!r}): {err}") from None
                if record:
                    layers[op.name] = s
                y = s.reshape((T * N,) + tuple(s.shape[2:]))
            elif isinstance(op, NeuronOp):
                x = values[src[0]]
                # the currents may be overwritten by the spikes when this is their last reader,
                # they are not the caller's input, and no other value shares their memory
                storage = x.untyped_storage().data_ptr()
                overwrite = (self._last_use.get(src[0]) == i and src[0] != NETWORK_INPUT and
                             all(v.untyped_storage().data_ptr() != storage
                                 for j, v in values.items() if j != src[0]))
                s = self._neuron(prm, x.reshape((T, N) + tuple(x.shape[1:])), overwrite)
                if record:
                    layers[op.name] = s.to(torch.int8)
                y = s.reshape((T * N,) + tuple(s.shape[2:]))
            else:
                y = self._stateless(op, prm, values[src[0]])
            values[i] = y
            for j in set(src):  # a join may read one value twice: free it once
                if self._last_use.get(j) == i:
                    del values[j]
        y = values[len(self.desc.ops) - 1]
        out = y.reshape((T, N) + tuple(y.shape[1:]))
        if self.desc.output_kind == "spikes" and self.desc.output_divisor == 1 \
                and self.desc.chip is None:  # 0/1 spikes
            out = out.to(torch.int8)
        else:
            out = out.to(torch.int64)
            if record:
                layers[self.desc.ops[-1].name] = out
        # the model averages over time: the sum, [N, ...]
        if self.desc.output_time_mean and not per_step:
            out = out.to(torch.int64).sum(0)
        return (out, layers) if record else out

    def float_output(self, x_seq: torch.Tensor, per_step: bool = False) -> torch.Tensor:
        r"""The float model's output, from a run of the integer network on ``x_seq``, whatever
        the network's output convention.

        .. math::

            y = \frac{Y}{D}\ \text{(every step)},\qquad
            y = \frac{1}{T D} \sum_{t=1}^{T} Y_t\ \text{(a model that averages over time)}

        with :math:`D` = :attr:`~snnquant.export.IntegerNetwork.output_divisor`.

        Args:
            x_seq: the integer input ``[T, N, ...]`` (as for calling the network).
            per_step: for a network that averages over time, the output of every step
                ``[T, N, ...]`` instead of their mean.

        Returns:
            A ``float64`` tensor: ``[T, N, ...]`` (per-step outputs) or ``[N, ...]`` (a mean
            over time), equal to the float model's output in eval mode for an exact export.
        """
        if per_step or not self.desc.output_time_mean:
            return self(x_seq, per_step=True).to(torch.float64) / self.desc.output_divisor
        return self.desc.float_output(self(x_seq), steps=int(x_seq.shape[0]))

    def __repr__(self):
        return f"IntegerSNN({len(self.desc.ops)} ops, device={self.device})"


def op_shapes(desc: IntegerNetwork, input_shape) -> list:
    """Per-sample ``(input shape, output shape)`` of every operation of ``desc``, computed in
    integers first (:func:`~snnquant.export.ir.shapes.infer_shapes`: every size checked before
    anything is allocated), then found by running
    one all-zero time step of shape ``input_shape`` through :class:`IntegerSNN`'s own layers:
    the check of the shapes along every edge of a description
    (:func:`~snnquant.export.check_network` checks the rest).

    Raises:
        IntegerNetworkError: naming ``input_shape``, the operation's index and name and the shape
            it does not take (a join's operands of different shapes included).
    """
    return _op_shapes(IntegerSNN(desc), input_shape)


def _op_shapes(sim: IntegerSNN, input_shape) -> list:
    """:func:`op_shapes` with the layers of ``sim``."""
    desc = sim.desc
    if all(v >= 1 for v in input_shape):
        # the shapes first, in integers: nothing allocated before every size is checked
        try:
            infer_shapes(desc, input_shape)
        except IntegerNetworkError as err:
            detail = getattr(err, "shape_detail", None)
            if detail is None:
                raise IntegerNetworkError(f"input_shape={tuple(input_shape)}: {err}") from None
            i, name, before, why = detail
            raise IntegerNetworkError(f"input_shape={tuple(input_shape)} does not fit operation "
                                      f"{i} ({name!r}): its input would be {before}: "
                                      f"{why}") from None
    values = {NETWORK_INPUT: torch.zeros((1,) + tuple(input_shape), dtype=torch.int64)}
    out = []
    for i, (op, prm) in enumerate(zip(desc.ops, sim._params)):
        xs = [values[j] for j in desc.op_inputs(i)]
        before = tuple(xs[0].shape[1:])
        try:
            if isinstance(op, JoinOp):
                if len({tuple(x.shape) for x in xs}) != 1:
                    raise ValueError(f"the operands have the shapes "
                                     f"{[tuple(x.shape[1:]) for x in xs]}")
                y = _join(op, prm, xs)
            elif isinstance(op, MatMulOp):
                y = _matmul(op, prm, xs)
            elif isinstance(op, NeuronOp):
                y = xs[0]
            elif isinstance(op, CHIP_OP_TYPES):
                y = op.run(xs[0].unsqueeze(0))[0]
            else:
                y = sim._stateless(op, prm, xs[0])
        except (RuntimeError, IndexError, ValueError) as err:
            raise IntegerNetworkError(f"input_shape={tuple(input_shape)} does not fit operation "
                                      f"{i} ({op.name!r}): its input would be {before}: "
                                      f"{err}") from None
        values[i] = y
        out.append((before, tuple(y.shape[1:])))
    return out
