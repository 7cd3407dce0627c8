r"""The integer network description that :func:`~snnquant.export.to_integer` returns.

An :class:`IntegerNetwork` is a list of operations applied in order to a sequence ``[T, N, ...]``:
:class:`SynapseOp` (linear / convolution with integer weights), :class:`NeuronOp` (integer
membrane), :class:`PoolOp` (max or sum pooling), :class:`FlattenOp` and :class:`JoinOp` (the
exact integer join of two branches: sum, AND, AND-NOT). Every operation reads the outputs of
earlier operations named by ``inputs`` (indices into the list, :data:`NETWORK_INPUT` for the
network input); the default ``()`` reads the operation just before it, so a sequence is the
special case in which no operation names its inputs, and a residual network is a graph in
topological order. The network's output is the last operation's. Every value the network
computes is an integer; each integer has a stated scale (a power of two, or for weights the
quantizer's step) that maps it back to the real value of the fake-quantized model.

Grids. A current (the output of a synaptic layer) is an integer :math:`X` in units of
:math:`2^{-F}` (``out_frac_bits`` :math:`F`). A membrane potential is an integer :math:`v` in units
of the membrane step :math:`s_v = 2^{E_v}`, with ``v_bits`` bits. Inside a neuron update both live
on the shared grid :math:`2^{-F_0}` (MINT-style: one scale for currents and membrane, so the update
needs shifts only): :math:`F_0 = F + ` ``input_shift`` and :math:`v 2^{d}` with ``grid_shift``
:math:`d = F_0 + E_v`.

Exactness. By default every layer is exact (the integer network reproduces the float model bit
for bit). A LIF layer whose :math:`\tau` is not a power of two can be exported only on request
(``to_integer(..., leak_bits=F)``), with its leak as a fixed-point multiplier
:math:`M / 2^F \approx 1/\tau`; such a layer has ``exact=False``, and so has the network
(:attr:`IntegerNetwork.exact`): agreement with the float model is then not guaranteed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import torch

from ...capture.graph import ExportError  # noqa: F401 (defined with the capture, which raises it)
from ...targets import CHIP_OP_TYPES, LoihiLayerOp, SpeckLayerOp, XyloLayerOp
from .integer_ops import fits_packed, pack_int
from .transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp

__all__ = ["FORMAT_VERSION", "READABLE_FORMAT_VERSIONS", "NETWORK_INPUT", "SynapseOp", "NeuronOp",
           "PoolOp", "FlattenOp", "JoinOp", "OP_TYPES", "IntegerNetwork", "ExportError",
           "IntegerNetworkError", "check_inputs", "check_input_shape"]

#: Version of the description and of the file format of :func:`~snnquant.export.save_integer`.
#: Version 2 adds the neuron fields ``leak_multiplier``, ``leak_round_shift``, ``exact`` and
#: ``tau`` (fixed-point leak);
#: a version-1 file is read with their defaults (1, 0, ``True``, ``None``): every layer exact.
#: Version 3 adds graphs: every operation's ``inputs`` and the :class:`JoinOp`; a version-1 or -2
#: file is read with ``inputs=()`` (a sequence).
#: Version 4 adds the operations of spiking transformers (:class:`GatherOp`, :class:`ReduceOp`,
#: :class:`MatMulOp`, :class:`ScaleOp`) and ``output_time_mean``; an earlier file is read with
#: ``output_time_mean=False``.
#: Version 5 adds the chip operations (:class:`~snnquant.targets.xylo.op.XyloLayerOp`,
#: :class:`~snnquant.targets.loihi.op.LoihiLayerOp`,
#: :class:`~snnquant.targets.speck.op.SpeckLayerOp`); an earlier file has none.
#: A version-5 description may also hold the network's ``input_shape``
#: (:attr:`IntegerNetwork.input_shape`; an optional key, which a reader that does not know it
#: skips, so the version stays 5).
FORMAT_VERSION = 5

#: Format versions that :func:`~snnquant.export.load_integer` reads.
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4, 5)

#: The index that stands for the network input in an operation's ``inputs``.
NETWORK_INPUT = -1


def check_input_shape(input_shape, name: str = "input_shape") -> Tuple[int, ...]:
    """One sample's input shape (without time and batch) as a tuple of ints >= 1; an int ``n``
    means ``(n,)``. Anything else (a float, a bool, a string, zero, an empty tuple) raises
    ``ValueError`` naming ``name`` and the value."""
    shape = (input_shape,) if isinstance(input_shape, int) and not isinstance(input_shape, bool) \
        else input_shape
    try:
        items = tuple(shape)
    except TypeError:
        items = None
    if isinstance(shape, (str, bytes)) or not items or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in items):
        raise ValueError(f"{name} must be a non-empty tuple of ints >= 1 (one sample's shape, "
                         f"without time and batch), got {input_shape!r}")
    return tuple(int(v) for v in items)


class IntegerNetworkError(ExportError):
    """An :class:`IntegerNetwork` disagrees with itself (see
    :func:`~snnquant.export.check_network`); the message names the operation's index and name,
    the field and the value. Raised by a field's check, it also holds them apart: ``index`` (the
    operation's, ``None`` for a field of the network), ``field`` and ``why`` (what the value must
    be), so that a reader of another format (:func:`~snnquant.export.from_nir`) can name its own
    field; ``None`` where the error is not one field's."""

    index: Optional[int] = None
    field: Optional[str] = None
    why: Optional[str] = None


def check_inputs(ops) -> None:
    """Check that every operation of ``ops`` reads earlier operations (or the network input):
    its ``inputs`` a tuple of indices in ``[NETWORK_INPUT, i)``.

    Raises:
        IntegerNetworkError: ``operation i ('name') has inputs=...``.
    """
    for i, op in enumerate(ops):
        if not isinstance(op.inputs, tuple) or any(
                isinstance(j, bool) or not isinstance(j, int) or not NETWORK_INPUT <= j < i
                for j in op.inputs):
            raise IntegerNetworkError(f"operation {i} ({op.name!r}) has inputs={op.inputs!r}: each "
                                      f"must be an earlier operation's index or {NETWORK_INPUT} "
                                      f"(the input)")


@dataclass
class SynapseOp:
    r"""A linear or convolution layer with integer weights.

    .. math::

        A = \mathrm{conv}(x, w) \quad\text{(integer accumulator)},\qquad
        X_c = (A_c\, m_c) \ll \sigma_c + b_c

    with the integer weights :math:`w` (the weight quantizer's integers), per output channel
    multiplier :math:`m_c` (``multiplier``, 1 when the weight step is a power of two) and shift
    :math:`\sigma_c` (``shift``), and the integer bias :math:`b_c` in the output units. The real
    value of :math:`X` is :math:`X\, 2^{-F}` (``out_frac_bits``); the real weight is
    :math:`w_c\, s_c` (``weight_scale``); the input is :math:`x\, 2^{-F_{in}}` (``in_frac_bits``).

    Attributes:
        name: qualified module name in the source model.
        kind: ``'linear'``, ``'conv1d'`` or ``'conv2d'``.
        weight: integer weights (``int8`` storage for up to 8 bits, else ``int16``/``int32``).
        weight_bits: bit width of the weight quantizer.
        weight_scale: ``float64`` ``[C_out]``, real weight = ``weight * weight_scale[c]``.
        multiplier: ``int64`` ``[C_out]``, :math:`m_c`.
        shift: ``int64`` ``[C_out]``, :math:`\sigma_c \ge 0`.
        bias: ``int64`` ``[C_out]`` in units of :math:`2^{-F}`, or ``None``.
        bias_bits: bit width of the bias quantizer (``None`` when the bias was not quantized by a
            quantizer but is exactly on the grid, or there is no bias).
        in_frac_bits: :math:`F_{in}`.
        out_frac_bits: :math:`F`.
        stride, padding, dilation, groups: convolution parameters (per spatial dimension).
        weight_packed: for 1-, 2- and 4-bit weights, the weights packed by
            :func:`~snnquant.export.pack_int` (``uint8``), else ``None``.
        inputs: the operation it reads (see :class:`IntegerNetwork`); ``()`` = the one before.
    """

    name: str
    kind: str
    weight: torch.Tensor
    weight_bits: int
    weight_scale: torch.Tensor
    multiplier: torch.Tensor
    shift: torch.Tensor
    bias: Optional[torch.Tensor]
    bias_bits: Optional[int]
    in_frac_bits: int
    out_frac_bits: int
    stride: Tuple[int, ...] = ()
    padding: Union[Tuple[int, ...], str] = ()
    dilation: Tuple[int, ...] = ()
    groups: int = 1
    weight_packed: Optional[torch.Tensor] = None
    inputs: Tuple[int, ...] = ()

    op_type = "synapse"

    def __post_init__(self):
        if self.weight_packed is None and fits_packed(self.weight, self.weight_bits):
            self.weight_packed = pack_int(self.weight, self.weight_bits)

    @property
    def out_channels(self) -> int:
        """Number of output channels (features)."""
        return int(self.weight.shape[0])

    @property
    def fan_in(self) -> int:
        """Inputs summed into one output: ``in_features`` or ``in_channels/groups * kernel size``."""
        n = 1
        for s in self.weight.shape[1:]:
            n *= int(s)
        return n

    def leak_text(self) -> str:  # pragma: no cover - uniform interface for describe()
        return ""


@dataclass
class NeuronOp:
    r"""A layer of integer IF or LIF neurons on the membrane grid :math:`s_v`.

    With the incoming current :math:`X` (units :math:`2^{-F}`), :math:`X_0 = X \ll` ``input_shift``
    (units :math:`2^{-F_0}`), grid shift :math:`d`, leak shift :math:`k`, leak multiplier
    :math:`M` (the leak :math:`1/\tau` is :math:`M / 2^k`), leak rounding shift :math:`r`,
    reset value :math:`v_r` (0 for soft reset) and :math:`\mathrm{rhe}` =
    :func:`~snnquant.export.round_half_even_shift`, each step computes, with
    :math:`D = X_0 - ((v - v_r) \ll d)` (``decay_input``) or :math:`D = (v - v_r) \ll d` (not)
    and :math:`L = \mathrm{rhe}(M D, r)`,

    .. math::

        \text{IF:}\quad & q = \mathrm{rhe}((v \ll d) + X_0,\ d)\\
        \text{LIF, decay\_input:}\quad & q = \mathrm{rhe}((v \ll (d+k-r)) + L,\ d + k - r)\\
        \text{LIF, not decay\_input:}\quad & q = \mathrm{rhe}((v \ll (d+k-r)) - L
            + (X_0 \ll (k - r)),\ d + k - r)\\
        q &\leftarrow \mathrm{clamp}(q, v_{min}, v_{max}),\qquad S = [q \ge \theta]\\
        v &\leftarrow \begin{cases} v_r & S = 1 \text{ (hard reset)}\\ q & S = 0\end{cases}
            \quad\text{or}\quad v \leftarrow q - \theta S \ \text{(soft reset)}

    Exact leak (``exact=True``): :math:`\tau = 2^k`, :math:`M = 1` and :math:`r = 0`, so
    :math:`L = D` and the charge is rounded once, to the membrane grid (ties to even), as the
    float model rounds :math:`H / s_v`. For :math:`d = 0` the LIF update is
    :math:`v + \mathrm{rhe}(X_0 - (v - v_r), k)`: a right shift (``tau = 2``:
    ``v + ((x - v) >> 1)``) with ties to even instead of floor.

    Fixed-point leak (``exact=False``, only with ``to_integer(..., leak_bits=F)``): :math:`k = F`,
    :math:`M = \mathrm{round}(2^F / \tau)` (LIF) or :math:`M = \mathrm{round}(2^F
    \mathrm{sigmoid}(w))` (parametric LIF), rounded half to even from the exact value of the
    float :math:`\tau` (or of :math:`\mathrm{sigmoid}(w)` in the reference dtype), and
    :math:`r = \lceil F/2 \rceil`. Two roundings, both ties to even: the leak product
    :math:`M D / 2^F` is first rounded to :math:`g = \lfloor F/2 \rfloor` guard bits below the
    shared grid (:math:`L`, units :math:`2^{-(F_0 + g)}`), then the charge to the membrane grid.
    The float model also rounds its quotient :math:`D / \tau` (to its significand) before the
    charge is rounded; the first rounding absorbs the multiplier error
    :math:`|D|\,|M/2^F - 1/\tau|` whenever it is below :math:`2^{-(g+1)}` grid units, so a
    quotient that is exactly a grid value, and a tie that follows from it, comes out the same as
    in the float model (a single rounding would send such ties to the side of the multiplier
    error). The integer network implements :math:`\tau_{eff} = 2^F / M`, not the float model's
    :math:`\tau`: its spikes may differ from the float model's.

    Attributes:
        name: qualified module name in the source model.
        kind: ``'if'`` or ``'lif'`` (a parametric LIF is exported as ``'lif'`` with its current
            :math:`1/\tau = \mathrm{sigmoid}(w)`).
        v_bits: membrane bit width; ``v_min``, ``v_max``: integer membrane range.
        membrane_scale: :math:`s_v`, real membrane = ``v * membrane_scale``.
        threshold: :math:`\theta`, the smallest integer with :math:`\theta s_v \ge V_{th}`.
        reset_mode: ``'hard'`` or ``'soft'``.
        v_reset: :math:`v_r` (``'hard'``), 0 for ``'soft'``.
        v_init: membrane before the first step (:math:`v_r`, or 0 for soft reset).
        leak_shift: :math:`k` (0 for IF; :math:`F` of a fixed-point leak).
        decay_input: LIF ``decay_input``.
        input_shift: left shift of the incoming current onto the shared grid.
        grid_shift: :math:`d`.
        in_frac_bits: :math:`F`; ``grid_frac_bits``: :math:`F_0`.
        leak_multiplier: :math:`M` (1 for IF and for the exact shift).
        leak_round_shift: :math:`r` (0 for IF and for the exact shift).
        exact: whether this layer reproduces the float model exactly (``False`` for a
            fixed-point leak).
        tau: the float model's :math:`\tau` (LIF ``tau``, or :math:`1/\mathrm{sigmoid}(w)`), or
            ``None`` (IF, or a version-1 description).
        inputs: the operation it reads (see :class:`IntegerNetwork`); ``()`` = the one before.
    """

    name: str
    kind: str
    v_bits: int
    v_min: int
    v_max: int
    membrane_scale: float
    threshold: int
    reset_mode: str
    v_reset: int
    v_init: int
    leak_shift: int
    decay_input: bool
    input_shift: int
    grid_shift: int
    in_frac_bits: int
    grid_frac_bits: int
    leak_multiplier: int = 1
    leak_round_shift: int = 0
    exact: bool = True
    tau: Optional[float] = None
    inputs: Tuple[int, ...] = ()

    op_type = "neuron"

    def __post_init__(self):
        m = self.leak_multiplier
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"leak_multiplier must be an int >= 1, got {m!r}")
        r = self.leak_round_shift
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= self.leak_shift:
            raise ValueError(f"leak_round_shift must be an int in [0, leak_shift="
                             f"{self.leak_shift}], got {r!r}")
        if not isinstance(self.exact, bool):
            raise ValueError(f"exact must be a bool, got {self.exact!r}")

    @property
    def v_rest(self) -> int:
        r"""The reset value :math:`v_r` of the update: ``v_reset`` for hard reset, 0 for soft."""
        return int(self.v_reset) if self.reset_mode == "hard" else 0

    @property
    def effective_tau(self) -> Optional[float]:
        r"""The time constant the integer layer implements, :math:`2^k / M` (``None`` for IF)."""
        if self.kind == "if":
            return None
        return (1 << self.leak_shift) / self.leak_multiplier

    def leak_text(self) -> str:
        """The leak as an integer operation, in words."""
        if self.kind == "if":
            return "none (IF)"
        di = 'decay_input' if self.decay_input else 'no decay_input'
        if self.leak_multiplier == 1 and self.exact:
            return (f"right shift by {self.leak_shift} (tau = {2 ** self.leak_shift}), ties to "
                    f"even, {di}")
        src = "" if self.tau is None else f" for tau = {self.tau:.6g}"
        return (f"fixed-point multiplier {self.leak_multiplier} / 2^{self.leak_shift}, product "
                f"rounded by {self.leak_round_shift} bits then to the membrane grid (tau_eff = {self.effective_tau:.6g}{src}), ties to even, {di}"
                f"{'' if self.exact else ', APPROXIMATE'}")


@dataclass
class PoolOp:
    r"""Max pooling, or sum pooling standing for an average pooling of :math:`2^a` elements.

    ``'max'``: :math:`y = \max_{window} x` (on binary spikes: logical OR). ``'sum'``:
    :math:`y = \sum_{window} x`, and the output units gain :math:`a` fractional bits
    (``frac_bits_added``): the real value is the average :math:`y / 2^a`.

    With ``output_size`` (an adaptive average pool), the windows are PyTorch's adaptive ones,
    :math:`[\lfloor i H / h \rfloor, \lceil (i + 1) H / h \rceil)` for input size :math:`H` and
    output size :math:`h` per dimension, each of ``kernel_size`` elements (checked at export for
    the given input size, and by the simulator on every input).

    ``divisor`` :math:`D \ne 1` (SpikingJelly's ``VotingLayer`` over :math:`D` neurons, not a
    power of two; only as the network's last operation): the integer output is the sum
    :math:`y` and the real value is :math:`y / D`, which the float model rounds. A 1-d pooling
    of a ``[N, F]`` tensor pools the features (as ``VotingLayer`` does).
    """

    name: str
    kind: str
    dims: int
    kernel_size: Tuple[int, ...]
    stride: Tuple[int, ...]
    padding: Tuple[int, ...]
    dilation: Tuple[int, ...]
    ceil_mode: bool
    frac_bits_added: int
    inputs: Tuple[int, ...] = ()
    output_size: Tuple[int, ...] = ()
    divisor: int = 1

    op_type = "pool"

    def leak_text(self) -> str:  # pragma: no cover
        return ""


@dataclass
class FlattenOp:
    r"""Flatten of the per-sample dimensions ``start_dim..end_dim`` (0 = first dimension after batch).

    .. math::

        y[n, \ldots, (i_s, \ldots, i_e), \ldots] = x[n, \ldots, i_s, \ldots, i_e, \ldots]
        \quad\text{(row-major)}
    """

    name: str
    start_dim: int
    end_dim: int
    inputs: Tuple[int, ...] = ()

    op_type = "flatten"

    def leak_text(self) -> str:  # pragma: no cover
        return ""


#: The kinds of :class:`JoinOp`.
JOIN_KINDS = ("add", "and", "iand")


@dataclass
class JoinOp:
    r"""The exact integer join of two or more branches (a residual connection).

    ``'add'``: the operands :math:`x_i` are integers in units of :math:`2^{-F_i}`; each is shifted
    onto the finest grid :math:`2^{-F}`, :math:`F = \max_i F_i` (``out_frac_bits``), and summed:

    .. math::

        y = \sum_i x_i \ll \sigma_i,\qquad \sigma_i = F - F_i

    with the ``shifts`` :math:`\sigma_i`: the real sum :math:`\sum_i x_i 2^{-F_i}` exactly (the
    float model's sum is exact when the export's bound holds, see
    :func:`~snnquant.export.to_integer`). ``'and'`` and ``'iand'`` join two spike tensors (SpikingJelly ``sew_resnet``'s ``cnf='AND'``/``'IAND'``):

    .. math::

        \text{and:}\quad y = x_0\, x_1,\qquad \text{iand:}\quad y = x_0\,(1 - x_1)

    Attributes:
        name: the module (or traced operation) the join comes from.
        kind: one of :data:`JOIN_KINDS`.
        shifts: :math:`\sigma_i \ge 0` per operand (all 0 for ``'and'``/``'iand'``).
        out_frac_bits: :math:`F`.
        inputs: indices of the operands (two or more; two for ``'and'``/``'iand'``).
    """

    name: str
    kind: str
    shifts: Tuple[int, ...]
    out_frac_bits: int
    inputs: Tuple[int, ...] = ()

    op_type = "join"

    def __post_init__(self):
        if self.kind not in JOIN_KINDS:
            raise ValueError(f"kind must be one of {JOIN_KINDS}, got {self.kind!r}")
        n = len(self.inputs)
        if n < 2 or (self.kind != "add" and n != 2):
            count = "two or more" if self.kind == "add" else "two"
            raise ValueError(f"a {self.kind!r} join needs {count} inputs, got "
                             f"inputs={self.inputs!r}")
        if len(self.shifts) != n or any(not isinstance(k, int) or k < 0 for k in self.shifts):
            raise ValueError(f"shifts must be {n} ints >= 0 (one per input), got {self.shifts!r}")
        if self.kind != "add" and any(self.shifts):
            raise ValueError(f"a {self.kind!r} join of spikes has no shifts, got {self.shifts!r}")

    def leak_text(self) -> str:  # pragma: no cover
        return ""


Op = Union[SynapseOp, NeuronOp, PoolOp, FlattenOp, JoinOp, GatherOp, ReduceOp, MatMulOp, ScaleOp,
           XyloLayerOp, LoihiLayerOp, SpeckLayerOp]
#: Every operation type of an :class:`IntegerNetwork`.
OP_TYPES = (SynapseOp, NeuronOp, PoolOp, FlattenOp, JoinOp, GatherOp, ReduceOp, MatMulOp,
            ScaleOp) + CHIP_OP_TYPES
_OP_CLASSES = {cls.op_type: cls for cls in OP_TYPES}


@dataclass
class IntegerNetwork:
    r"""An integer spiking network: operations, bit widths and scales.

    Attributes:
        ops: the operations in topological order; operation ``i`` reads
            :meth:`op_inputs` ``(i)`` (its ``inputs``, or ``(i - 1,)`` when they are ``()``;
            :data:`NETWORK_INPUT` is the network input). The output is the last operation's.
        input_max: largest input magnitude for which the exactness bound holds (the simulator
            refuses larger inputs).
        output_kind: ``'spikes'`` (the network ends in a neuron layer, possibly pooled or
            flattened) or ``'current'`` (it ends in a synaptic layer; the output is :math:`X` in
            units of :math:`2^{-F}` with ``output_frac_bits`` :math:`F`).
        output_frac_bits: :math:`F` of a ``'current'`` output (0 for spikes).
        reference_dtype: the float dtype of the fake-quantized model this network reproduces
            exactly (``'float32'`` or ``'float64'``).
        mantissa_bits: significand bits of that dtype (24 or 53), used in the exactness bounds.
        format_version: :data:`FORMAT_VERSION`.
        notes: free text (what was folded, skipped as identity in eval mode, ...).
        output_time_mean: the model averages its output over the time steps (a trailing
            ``x.mean(0)`` of a multi-step network, also one that a last linear layer follows,
            which is exported per step: the mean of :math:`W x_t + b` is :math:`W \bar x + b`).
            The operations still run per step; :class:`~snnquant.export.IntegerSNN` returns
            the sum over the :math:`T` steps, and the model's output is that sum divided by
            :math:`T` and :attr:`output_divisor`.
        input_shape: one sample's input shape (without time and batch) the network was
            exported for, or ``None`` where it is not known (a network traced without an example
            input, built by hand, or read from an older file). When it is known,
            :func:`~snnquant.export.check_network` checks the shapes along every edge with it
            (:func:`~snnquant.export.ir.shapes.infer_shapes`).
    """

    ops: List[Op]
    input_max: int
    output_kind: str
    output_frac_bits: int = 0
    reference_dtype: str = "float32"
    mantissa_bits: int = 24
    format_version: int = FORMAT_VERSION
    notes: List[str] = field(default_factory=list)
    output_time_mean: bool = False
    input_shape: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        check_inputs(self.ops)

    def op_inputs(self, index: int) -> Tuple[int, ...]:
        """The indices of the values operation ``index`` reads (:data:`NETWORK_INPUT` = input)."""
        op = self.ops[index]
        return tuple(op.inputs) if op.inputs else (index - 1,)

    @property
    def output_divisor(self) -> float:
        r"""What each step's integer output is divided by to give that step's float value:
        :math:`2^F` for a ``'current'`` output (``output_frac_bits`` :math:`F`), :math:`2^a D`
        when the network ends in a sum pool of spikes (an average pool of :math:`2^a` elements,
        or ``VotingLayer``'s :math:`D`; the output is then a count, not 0/1), else 1.

        For a network that averages its output over time (:attr:`output_time_mean`),
        :class:`~snnquant.export.IntegerSNN` returns the sum over the :math:`T` steps, so the
        float model's output is that sum divided by :math:`T` times this number.
        :meth:`IntegerSNN.float_output <snnquant.export.IntegerSNN.float_output>` does the
        conversion in one call, whatever the convention."""
        if self.output_kind == "current":
            return 2.0 ** self.output_frac_bits
        last = self.ops[-1]
        if isinstance(last, PoolOp) and last.kind == "sum":
            return 2.0 ** last.frac_bits_added * last.divisor
        return 1.0

    def float_output(self, output: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        r"""The float model's output from the integer network's output ``output`` (as
        :class:`~snnquant.export.IntegerSNN` returns it), whatever the output convention.

        .. math::

            y_t = \frac{Y_t}{D}\ \text{(every step)},\qquad
            y = \frac{\sum_t Y_t}{T D}\ \text{(a model that averages over time)}

        with :math:`D` = :attr:`output_divisor`.

        Args:
            output: the integer output, ``[T, N, ...]``, or for a network that averages over
                time (:attr:`output_time_mean`) the sum over the steps ``[N, ...]``.
            steps: :math:`T`, needed for a network that averages over time.

        Returns:
            A ``float64`` tensor of the shape of ``output``.

        Raises:
            ValueError: ``steps`` missing (or not a positive int) for a time-mean network.
        """
        y = torch.as_tensor(output).to(torch.float64) / self.output_divisor
        if not self.output_time_mean:
            return y
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be the number of time steps T (an int >= 1) for a "
                             f"network whose output is a mean over time, got {steps!r}")
        return y / steps

    @property
    def is_graph(self) -> bool:
        """True when some operation reads anything but the one before it (branches, joins)."""
        return any(self.op_inputs(i) != (i - 1,) for i in range(len(self.ops)))

    def graph_features(self) -> List[str]:
        """What in this network is more than a plain sequence, in words (empty for a sequence of
        synapses, neurons, pools and flattens): joins, branches (an operation that
        reads anything but the one before it), adaptive pools and averages over a number of
        values that is not a power of two."""
        out = []
        for i, op in enumerate(self.ops):
            if isinstance(op, JoinOp):
                out.append(f"the {op.kind} join {op.name!r}")
            elif self.op_inputs(i) != (i - 1,):
                out.append(f"the branch into {op.name!r} (it reads operation "
                           f"{list(self.op_inputs(i))}, not {i - 1})")
            elif isinstance(op, PoolOp) and op.output_size:
                out.append(f"the adaptive pool {op.name!r}")
            elif isinstance(op, PoolOp) and op.divisor != 1:
                out.append(f"the average over {op.divisor} values {op.name!r}")
        return out

    def layer(self, name: str) -> Op:
        """The operation exported from module ``name``."""
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no layer named {name!r}; layers: {[op.name for op in self.ops]}")

    @property
    def chip(self) -> Optional[str]:
        """The chip whose operations the network holds (``'xylo'``, ``'loihi'``, ``'speck'``;
        :mod:`~snnquant.targets`), or ``None`` for a network of snnquant's own
        operations. Only :class:`~snnquant.export.IntegerSNN`, :func:`~snnquant.export.save_integer`
        and :func:`~snnquant.export.load_integer` take a chip network."""
        return next((op.chip for op in self.ops if isinstance(op, CHIP_OP_TYPES)), None)

    @property
    def exact(self) -> bool:
        """True when every layer is exact (no fixed-point leak): the network then reproduces the
        float model bit for bit; ``False`` means agreement is not guaranteed."""
        return all(getattr(op, "exact", True) for op in self.ops)

    @property
    def approximate_layers(self) -> List[str]:
        """Names of the layers with ``exact=False`` (fixed-point leak)."""
        return [op.name for op in self.ops if not getattr(op, "exact", True)]

    @property
    def neuron_names(self) -> List[str]:
        """Names of the neuron layers (a chip network's layers included), in order."""
        return [op.name for op in self.ops if isinstance(op, (NeuronOp,) + CHIP_OP_TYPES)]

    def bits(self) -> Dict[str, Dict[str, Optional[int]]]:
        """Bit widths per layer: ``{'weight', 'bias'}`` of synapses, ``{'v'}`` of neurons and
        ``{'weight', 'bias', 'v'}`` of a chip's layers."""
        out = {}
        for op in self.ops:
            if isinstance(op, SynapseOp):
                out[op.name] = {"weight": op.weight_bits, "bias": op.bias_bits}
            elif isinstance(op, NeuronOp):
                out[op.name] = {"v": op.v_bits}
            elif isinstance(op, CHIP_OP_TYPES):
                out[op.name] = op.bits()
        return out

    def __str__(self) -> str:
        rel = (f"{self.chip} layers in the chip's integers" if self.chip is not None else
               f"exact against the {self.reference_dtype} model" if self.exact else
               f"APPROXIMATE against the {self.reference_dtype} model (fixed-point leak in "
               f"{', '.join(self.approximate_layers)}; agreement not guaranteed)")
        lines = [f"IntegerNetwork (format {self.format_version}, {rel}, input |x| <= "
                 f"{self.input_max}, output: {self.output_kind})"]
        for i, op in enumerate(self.ops):
            if self.is_graph:
                lines.append(f"  [{i}] <- {list(self.op_inputs(i))}")
            if isinstance(op, SynapseOp):
                pow2 = bool((op.multiplier == 1).all())
                lines.append(
                    f"  {op.name}: {op.kind} {tuple(op.weight.shape)}, {op.weight_bits}-bit weights "
                    f"({op.weight.dtype}{', packed' if op.weight_packed is not None else ''}), "
                    f"{'bias' if op.bias is not None else 'no bias'}, output units 2^-"
                    f"{op.out_frac_bits}, rescale: {'shift' if pow2 else 'multiplier + shift'}")
            elif isinstance(op, NeuronOp):
                lines.append(
                    f"  {op.name}: {op.kind} {op.v_bits}-bit membrane [{op.v_min}, {op.v_max}] x "
                    f"{op.membrane_scale:g}, threshold {op.threshold}, {op.reset_mode} reset "
                    f"{op.v_reset if op.reset_mode == 'hard' else ''}, leak: {op.leak_text()}")
            elif isinstance(op, PoolOp):
                lines.append(f"  {op.name}: {op.kind} pool {op.kernel_size}")
            elif isinstance(op, JoinOp):
                lines.append(f"  {op.name}: join {op.kind}, shifts {list(op.shifts)}, output units "
                             f"2^-{op.out_frac_bits}")
            elif isinstance(op, GatherOp):
                lines.append(f"  {op.name}: {'reshape' if op.index is None else 'gather'} to "
                             f"{tuple(op.shape)}")
            elif isinstance(op, ReduceOp):
                lines.append(f"  {op.name}: sum over dims {list(op.dims)}"
                             f"{', keepdim' if op.keepdim else ''}, +{op.frac_bits_added} "
                             f"fractional bits")
            elif isinstance(op, MatMulOp):
                lines.append(f"  {op.name}: matmul, output units 2^-{op.out_frac_bits}")
            elif isinstance(op, ScaleOp):
                lines.append(f"  {op.name}: times 2^{op.exponent}")
            elif isinstance(op, CHIP_OP_TYPES):
                lines.append(f"  {op.name}: {op.text()}")
            else:
                lines.append(f"  {op.name}: flatten {op.start_dim}..{op.end_dim}")
        return "\n".join(lines)

    # ---- (de)serialisation helpers used by save_integer / load_integer ----------------------
    def to_record(self):
        """``(meta, tensors)``: JSON-able metadata and a flat ``{name: tensor}`` dict."""
        meta_ops, tensors = [], {}
        for i, op in enumerate(self.ops):
            entry = {"op_type": op.op_type}
            for f in dataclasses.fields(op):
                value = getattr(op, f.name)
                if isinstance(value, torch.Tensor):
                    key = f"ops.{i}.{f.name}"
                    if f.name == "weight" and getattr(op, "weight_packed", None) is not None:
                        entry["weight_shape"] = list(value.shape)
                        entry["weight_dtype"] = str(value.dtype).replace("torch.", "")
                        continue  # stored packed only
                    tensors[key] = value.detach().cpu().contiguous()
                    entry[f.name] = {"tensor": key}
                elif isinstance(value, tuple):
                    entry[f.name] = list(value)
                else:
                    entry[f.name] = value
            meta_ops.append(entry)
        meta = {k: getattr(self, k) for k in ("input_max", "output_kind", "output_frac_bits",
                                              "reference_dtype", "mantissa_bits",
                                              "format_version", "notes", "output_time_mean")}
        if self.input_shape is not None:    # only then: files without it keep their bytes
            meta["input_shape"] = list(self.input_shape)
        meta["ops"] = meta_ops
        meta["bits"] = self.bits()
        meta["exact"] = self.exact
        return meta, tensors

    @classmethod
    def from_record(cls, meta, tensors) -> "IntegerNetwork":
        """Inverse of :meth:`to_record` (raises ``ValueError`` on inconsistent input)."""
        from .integer_ops import unpack_int

        ops = []
        for i, entry in enumerate(meta["ops"]):
            entry = dict(entry)
            op_cls = _OP_CLASSES.get(entry.pop("op_type", None))
            if op_cls is None:
                raise ValueError(f"operation {i} has an unknown op_type")
            weight_shape = entry.pop("weight_shape", None)
            weight_dtype = entry.pop("weight_dtype", None)
            kwargs = {}
            for f in dataclasses.fields(op_cls):
                if f.name not in entry:
                    continue
                value = entry[f.name]
                if isinstance(value, dict) and "tensor" in value:
                    if value["tensor"] not in tensors:
                        raise ValueError(f"tensor {value['tensor']!r} is missing")
                    value = tensors[value["tensor"]]
                elif isinstance(value, list):
                    value = tuple(value)
                kwargs[f.name] = value
            if weight_shape is not None:
                packed = kwargs.get("weight_packed")
                if packed is None:
                    raise ValueError(f"operation {i} has no weights")
                kwargs["weight"] = unpack_int(packed, kwargs["weight_bits"], weight_shape).to(
                    getattr(torch, weight_dtype))
            ops.append(op_cls(**kwargs))
        time_mean = meta.get("output_time_mean", False)
        if not isinstance(time_mean, bool):
            raise ValueError(f"output_time_mean must be a bool (true or false), got "
                             f"{time_mean!r}")
        input_shape = meta.get("input_shape")
        if input_shape is not None:
            input_shape = check_input_shape(input_shape if isinstance(input_shape, list)
                                            else str(input_shape))
        return cls(ops=ops, input_max=int(meta["input_max"]), output_kind=meta["output_kind"],
                   output_frac_bits=int(meta["output_frac_bits"]),
                   reference_dtype=meta["reference_dtype"], mantissa_bits=int(meta["mantissa_bits"]),
                   format_version=int(meta["format_version"]), notes=list(meta.get("notes", [])),
                   output_time_mean=time_mean, input_shape=input_shape)
