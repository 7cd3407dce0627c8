r"""Integer export of a fake-quantized spiking network: :func:`to_integer`.

Why the result is exact. Every value the fake-quantized float model computes is an exact binary
fraction as long as the quantization steps are (a power of two times a small odd integer) and no
intermediate needs more significand bits than the float type has (:math:`p = 24` for float32,
53 for float64). Then the float model computes the same numbers as exact rational arithmetic,
and the integer network below computes them on a fixed-point grid:

* synaptic layer: weights :math:`\hat W = q\, s` with :math:`s = m\,2^{E}` (:math:`m = 1` for a
  power-of-two step); the integer accumulator :math:`A = \sum q x` and the current
  :math:`X = (A m) \ll \sigma + b` on the grid :math:`2^{-F}`;
* neuron: membrane integers on :math:`s_v = 2^{E_v}`, currents and membrane on the shared grid
  :math:`2^{-F_0}`, the leak :math:`1/\tau = 2^{-k}` as :math:`k` extra fractional bits, and the
  rounding to the membrane grid with :func:`~snnquant.export.round_half_even_shift` (ties to even,
  as ``torch.round``).

Bounds checked at export (each refusal names the layer and the numbers):

* accumulator: for every output channel :math:`c`,
  :math:`\lVert q_c \rVert_1\, m_c\, x_{max}\, 2^{E_c - F_{in} - u_c} + |b_c|\, 2^{-u_c} \le 2^p`
  with :math:`u_c` the finest binary unit of the channel's weights and bias. It bounds every
  partial sum in any summation order (and fused multiply-adds), so the float convolution is exact
  whatever kernel computes it. :math:`x_{max}` is 1 for spikes and ``input_max`` for the network
  input; without an ``input_max`` the largest one that satisfies the bound is taken and the
  simulator refuses larger inputs;
* neuron: :math:`(2^{k+2} + 4)\, R\, 2^{d} \le 2^p` with
  :math:`R = \max(|v_{min}|, |v_{max}|) + |\theta| + 1` and :math:`d` the grid shift (the membrane
  step in units of the shared grid is :math:`2^d`): every intermediate of the charge is then exact
  whenever the result lies inside the membrane range; outside it both models saturate to the same
  end of the range, since float rounding is monotone and the rounding boundaries are
  representable.

The one exception is opt-in: ``to_integer(..., leak_bits=F)`` exports a :math:`\tau` that is not
a power of two with a fixed-point leak :math:`M / 2^F` (see :func:`to_integer`); such a layer has
``exact=False``, its float-exactness bound is not checked (the int64 bound is), and its agreement
with the float model is measured, not guaranteed.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ...utils import copy_model, is_multi_step as _is_multi_step
from ...capture import capture
from ..ir.validation import check_network
from ..backends.simulator import op_shapes
from ..ir.network import (ExportError, FlattenOp, IntegerNetwork, JoinOp, PoolOp,
                          check_input_shape)
from .common import MANTISSA_BITS
from .deploy_checks import tagged
from .graph import GraphBuilder

__all__ = ["to_integer", "input_max_of"]


# --------------------------------------------------------------------------------------------------

def input_max_of(example_input: torch.Tensor) -> int:
    """The default ``input_max`` that an example input (or a batch of data) gives: its largest
    magnitude, rounded up to an integer, at least 1 (its largest event count)."""
    if example_input.numel() == 0:
        return 1
    return max(1, int(math.ceil(float(example_input.detach().abs().max()))))


def _input_max_said(input_max, source, graph) -> str:
    """Where the input bound behind an accumulator refusal came from, for its message."""
    if input_max is None:
        allowed = graph.allowed_input
        return (f"input_max was not given and there was no example_input, so the export "
                f"assumed inputs up to {allowed}, the largest the first layer allows; pass "
                f"input_max=<the largest event count of your data> (or example_input=x), or "
                f"reference_dtype=torch.float64")
    if source == "example_input":
        return (f"input_max={input_max}, the largest value of example_input; pass a smaller "
                f"input_max if the data never exceeds it, or reference_dtype=torch.float64")
    return (f"at input_max={input_max}: a smaller input_max, or reference_dtype=torch.float64, "
            f"lowers or lifts the bound")


#: Accepted range of ``leak_bits`` (fractional bits of a fixed-point leak multiplier).
LEAK_BITS_RANGE = (1, 32)


def check_input_max_and_leak_bits(input_max, leak_bits) -> None:
    """Refuse an ``input_max`` other than ``None`` or an int >= 1, and a ``leak_bits`` other than
    ``None`` or an int in :data:`LEAK_BITS_RANGE` (``ValueError`` naming the argument and the
    value): :func:`to_integer`'s checks, which the deployability report makes too."""
    if input_max is not None and (isinstance(input_max, bool) or not isinstance(input_max, int)
                                  or input_max < 1):
        raise ValueError(f"input_max must be None or an int >= 1, got {input_max!r}")
    lo, hi = LEAK_BITS_RANGE
    if leak_bits is not None and (isinstance(leak_bits, bool) or not isinstance(leak_bits, int)
                                  or not lo <= leak_bits <= hi):
        raise ValueError(f"leak_bits must be None or an int in [{lo}, {hi}], got {leak_bits!r}")


def _chip_network(model: nn.Module) -> IntegerNetwork:
    """The :class:`IntegerNetwork` of a chip network: an ``nn.Sequential`` of chip layers (each
    with an ``integer_op``), one operation per layer (:mod:`~snnquant.targets`)."""
    layers = [(n, m) for n, m in model.named_modules() if callable(getattr(m, "integer_op", None))]
    others = [n for n, m in model.named_modules()
              if n and not callable(getattr(m, "integer_op", None))
              and not isinstance(m, (nn.Sequential, nn.Identity))
              and not any(n.startswith(x + ".") for x, _ in layers)]
    if others or not isinstance(model, nn.Sequential) and len(layers) > 1:
        raise ExportError(f"a chip network is an nn.Sequential of one chip's layers only; found "
                          f"{others or type(model).__name__}")
    ops = [m.integer_op(n or type(m).__name__) for n, m in layers]
    chips = sorted({op.chip for op in ops})
    if len(chips) > 1:
        raise ExportError(f"a chip network holds one chip's layers; found {chips}")
    desc = IntegerNetwork(ops=ops, input_max=int(ops[0].input_max), output_kind="spikes",
                          reference_dtype="float64", mantissa_bits=53,
                          notes=[f"{chips[0]} network: {len(ops)} layers in the chip's "
                                 f"arithmetic"])
    check_network(desc)
    return desc


def to_integer(model: nn.Module, *, reference_dtype: Optional[torch.dtype] = None,
               input_max: Optional[int] = None, leak_bits: Optional[int] = None,
               input_shape: Optional[Tuple[int, ...]] = None,
               example_input=None) -> IntegerNetwork:
    r"""Export a quantized spiking network as an exact integer network.

    The network is a sequence (``nn.Sequential``, SpikingJelly ``SeqToANNContainer`` /
    ``MultiStepContainer`` / ``StepModeContainer``, nested freely) or a graph that
    :mod:`torch.fx` traces (layers, neurons and containers kept whole; residual blocks such as
    SpikingJelly's ``spiking_resnet`` and ``sew_resnet``) of:
    :class:`~snnquant.nn.QuantLinear` / ``QuantConv1d`` / ``QuantConv2d`` (weight quantizer with
    a uniform grid; bias quantized or exactly on a binary grid), quantized neurons
    (:class:`~snnquant.nn.QuantIFNode`, :class:`~snnquant.nn.QuantLIFNode` with :math:`\tau = 2^k`,
    :class:`~snnquant.nn.QuantParametricLIFNode` whose :math:`\mathrm{sigmoid}(w)` is a power of
    two; membrane quantizer with a power-of-two step; hard or soft reset), max pooling, average
    pooling of spikes over :math:`2^a` elements (also adaptive, given ``input_shape``; a
    ``VotingLayer`` over any number of neurons as the last layer), flatten (module or
    ``torch.flatten``), identity-in-eval modules (``Identity``, ``Dropout``), and joins
    (:class:`~snnquant.export.JoinOp`): ``+`` of two branches, and ``sew_resnet``'s connect
    function ``sew_function`` with ``cnf='ADD'``, ``'AND'`` (:math:`x y`) or ``'IAND'``
    (:math:`x (1 - y)`) on spikes. A sum of two values on the grids :math:`2^{-F_1}` and
    :math:`2^{-F_2}` is computed on :math:`2^{-\max(F_1, F_2)}`, the coarser operand shifted
    left; it is exported only when the float model's sum is exact,

    .. math::

        \sum_i \max|x_i|\, 2^{\sigma_i} \le 2^p \quad\text{(integer units of the common grid)},

    and refused with the join's name otherwise. BatchNorm must be folded first
    (:func:`~snnquant.export.fold_batchnorm`). Anything else is refused with an
    :class:`~snnquant.export.ExportError` naming the layer and the reason.

    A chip network (an ``nn.Sequential`` of :mod:`snnquant.targets` layers: Xylo, Loihi 2 or
    Speck) is exported layer by layer to the chip's operations
    (:mod:`~snnquant.targets`), which compute in the chip's integers with the step
    the layers trained with; ``input_max`` and ``leak_bits`` are the chip's and must not be
    given, ``input_shape`` (if given) must fit the first layer, ``reference_dtype`` and
    ``example_input`` are not used.

    The result reproduces the fake-quantized model *in eval mode*, evaluated in
    ``reference_dtype``, exactly: the same spikes at every layer and step (see the module
    documentation for the grid and the bounds). Per synaptic layer :math:`X = (A m) \ll \sigma + b`
    with the accumulator :math:`A = \sum w x`; per neuron the charge on the shared grid and

    .. math::

        q = \mathrm{clamp}(\mathrm{rhe}(H, d + k), v_{min}, v_{max}),\quad S = [q \ge \theta]

    With power-of-two weight steps (``QuantConfig(weight_quantizer='lsq_pow2')``) every
    multiplier :math:`m` is 1 and the export is exact against the float32 model. A learned step
    that is not a power of two rounds in float32; it is exported only with
    ``reference_dtype=torch.float64`` (exact against the model run in float64, the multiplier
    :math:`m` is the step's odd significand).

    A LIF :math:`\tau` (or parametric LIF :math:`1/\mathrm{sigmoid}(w)`) that is not a power of
    two is refused by default: the float division rounds and no integer operation reproduces it.
    With ``leak_bits=F`` such a layer is exported *approximately* instead, its leak as the
    fixed-point multiplier

    .. math::

        \frac{1}{\tau} \approx \frac{M}{2^F},\qquad M = \mathrm{round}\Big(\frac{2^F}{\tau}
        \Big)\ \text{or}\ \mathrm{round}\big(2^F\,\mathrm{sigmoid}(w)\big)
        \quad\text{(half to even, on the exact value)},

        L = \mathrm{rhe}\big(M\,(X_0 - ((v - v_r) \ll d)),\ r\big),\qquad
        q = \mathrm{clamp}\big(\mathrm{rhe}((v \ll (d + F - r)) + L,\ d + F - r),\
        v_{min}, v_{max}\big),\qquad r = \lceil F/2 \rceil

    (``decay_input``; see :class:`~snnquant.export.NeuronOp` for the other form and why the
    leak product is rounded first, to :math:`\lfloor F/2 \rfloor` guard bits below the shared
    grid): two roundings per step, both with the same tie rule. The layer and the network get ``exact=False``:
    the spikes may differ from the float model's (measure it with
    :func:`~snnquant.export.compare_integer`). A power-of-two :math:`\tau` keeps the exact shift
    even when ``leak_bits`` is given. The float-exactness bound is not checked for such a layer;
    the int64 bound is.

    Args:
        model: the quantized network (from :func:`snnquant.quantize_model`, trained or not). It
            is not modified.
        reference_dtype: ``torch.float32`` or ``torch.float64``; default: the dtype of the
            model's parameters.
        input_max: largest input magnitude the network must accept exactly (event counts per
            pixel and step); default: the largest value of ``example_input`` rounded up
            (:func:`input_max_of`) when one is given, else the largest that the first layer's
            accumulator bound allows (which can be millions, and goes into ``SNN_INPUT_MAX`` of
            the C model: pass the largest count of your data). Inputs of binary spikes need 1.
            A refusal of an accumulator bound says which ``input_max`` it was checked at and
            where that number came from.
        leak_bits: ``None`` (default: refuse a :math:`\tau` that is not a power of two), or the
            fractional bits :math:`F` (an int in ``[1, 32]``, e.g. 8..16) of the fixed-point
            leak multiplier of such layers (approximate export).
        input_shape: one sample's input shape (without time and batch), needed only when the
            network has an adaptive average pool (its divisor depends on the input size);
            default: that of ``example_input``. The result holds it
            (:attr:`~snnquant.export.IntegerNetwork.input_shape`, ``None`` when neither is
            given), and the shapes along every edge are checked with it.
        example_input: one input batch (``[T, N, ...]`` for a multi-step network): the graph is
            then captured from a run of the model on it (:func:`~snnquant.capture.capture`),
            which follows Python that depends only on shapes (``if x.ndim != 5: raise``) and
            blocks in an ``nn.ModuleList``. Default ``None``: torch.fx symbolic tracing.

    Returns:
        An :class:`~snnquant.export.IntegerNetwork`.

    Raises:
        ExportError: a layer cannot be represented exactly (the message names it and why);
            a :class:`~snnquant.capture.CaptureError` when the graph cannot be captured
            (it names the innermost submodule, its class, the file and line, and what to change).
        ValueError: a bad argument (``reference_dtype``, ``input_max``, ``leak_bits``,
            ``input_shape``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if any(callable(getattr(m, "integer_op", None)) for m in model.modules()):
        given = {k: v for k, v in (("input_max", input_max), ("leak_bits", leak_bits))
                 if v is not None}
        if given:
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())}: a chip "
                             f"network's input range and arithmetic are the chip's; give none")
        desc = _chip_network(model)
        if input_shape is not None:
            op_shapes(desc, check_input_shape(input_shape))
            desc.input_shape = check_input_shape(input_shape)
        return desc
    if reference_dtype is None:
        fp = [t.dtype for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
        reference_dtype = fp[0] if fp else torch.float32
    if reference_dtype not in MANTISSA_BITS:
        raise ValueError(f"reference_dtype must be torch.float32 or torch.float64, got "
                         f"{reference_dtype!r}")
    check_input_max_and_leak_bits(input_max, leak_bits)
    if input_shape is not None:
        input_shape = check_input_shape(input_shape)
    p = MANTISSA_BITS[reference_dtype]
    work = copy_model(model).to(reference_dtype).cpu()
    if isinstance(example_input, torch.Tensor):
        example_input = example_input.to(reference_dtype).cpu()
    captured = capture(work, example_input)
    if input_shape is None and isinstance(example_input, torch.Tensor):
        # one sample's shape, which an adaptive pool's divisor depends on
        input_shape = tuple(example_input.shape[2 if _is_multi_step(work) else 1:])
    input_max_from = "given"
    if input_max is None and isinstance(example_input, torch.Tensor):
        input_max, input_max_from = input_max_of(example_input), "example_input"
    graph = GraphBuilder(work, reference_dtype, p, input_max, leak_bits, input_shape, captured)
    try:
        out = graph.build()
    except ExportError as err:
        if getattr(err, "check", None) == "accumulator":
            said = _input_max_said(input_max, input_max_from, graph)
            raise tagged(ExportError(f"{err} [{said}]"), "accumulator") from None
        raise
    ops, notes = graph.ops, graph.notes
    if not graph.seen_synapse:
        raise ExportError("the model has no synaptic layer to export")
    if out != len(ops) - 1:
        raise ExportError(f"the model's output is the value of {ops[out].name!r}, not of the last "
                          f"operation {ops[-1].name!r}: operations after it are not used")
    for op in ops[:-1]:
        if getattr(op, "divisor", 1) != 1:
            raise ExportError(f"layer {op.name!r}: it averages {op.divisor} values, not a power "
                              f"of two, so its output is not an exact binary fraction; such an "
                              f"average is exported only as the network's last operation")
    allowed_input = graph.allowed_input
    if input_max is None:
        input_max = min(allowed_input, (1 << 31) - 1) if allowed_input is not None else (1 << 31) - 1
    last = graph.values[out]
    if last.domain == "current" or (not last.binary and not (
            isinstance(ops[out], PoolOp) and ops[out].kind == "sum") and not isinstance(
            ops[out], (FlattenOp, JoinOp))) or (
            isinstance(ops[out], FlattenOp) and last.frac > 0):
        output_kind, output_frac = "current", last.frac
    else:
        output_kind, output_frac = "spikes", 0
    return IntegerNetwork(ops=ops, input_max=int(input_max), output_kind=output_kind,
                          output_frac_bits=int(output_frac),
                          reference_dtype=str(reference_dtype).replace("torch.", ""),
                          mantissa_bits=p, notes=notes, output_time_mean=last.time_mean,
                          input_shape=input_shape)
