r"""The integer arithmetic of an exported network, written once: what :class:`IntegerSNN` runs and
what :func:`~snnquant.export.to_c` prints.

A neuron layer's step is an operation list (:class:`NeuronProgram`, built by
:func:`neuron_program` from a :class:`~snnquant.export.NeuronOp`): instructions such as
``h = add(shl(v, d), x)``, ``q = rhe(h, d)``, ``q = clamp(q, v_min, v_max)``. Every opcode is
defined once in :data:`OPCODES`, with its three readings side by side:

* ``torch``: the tensor operation :class:`~snnquant.export.IntegerSNN` executes;
* ``c``: the C99 expression :func:`~snnquant.export.to_c` writes;
* ``interval``: the range of the result given the ranges of the arguments, from which the C
  generator proves every intermediate fits ``int64_t`` and picks the membrane's C type.

A synaptic layer is two parts: the accumulation :math:`A = \mathrm{conv}(x, w)` (dense in
PyTorch and in C today; a backend may emit it event-driven, one weight column per nonzero input,
without touching the rest), then the rescale :class:`SynapseRescale`
:math:`X_c = A_c f_c + b_c` with :math:`f_c = m_c 2^{\sigma_c}`, also defined once here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...functional.int_limits import INT64_HEADROOM_BITS
from . import integer_ops
from .network import JoinOp, NeuronOp, PoolOp, SynapseOp
from .transformer_ops import MatMulOp, ReduceOp, ScaleOp

__all__ = ["Instr", "NeuronProgram", "neuron_program", "SynapseRescale", "OPCODES",
           "c_literal", "c_rhe_helper", "SynapseBounds", "synapse_bounds", "pool_range",
           "join_range", "join_bound", "reduce_range", "matmul_range", "scale_range",
           "adaptive_windows"]

Arg = Union[str, int]
Interval = Tuple[int, int]


def c_literal(v: int) -> str:
    """A C literal of ``v`` that keeps its value in every integer context."""
    v = int(v)
    if -(1 << 31) < v < (1 << 31):
        return str(v)
    if v == -(1 << 63):
        return "INT64_MIN"
    return f"INT64_C({v})"


#: The C register types a :class:`NeuronProgram` is printed with: ``(type, helper suffix, bits
#: of the offset that makes the rounded number non-negative)``.
_C_WIDTHS = {"int64_t": ("", INT64_HEADROOM_BITS), "int32_t": ("_i32", INT64_HEADROOM_BITS - 32),
             "int16_t": ("_i16", INT64_HEADROOM_BITS - 48)}


def c_rhe_helper(prefix: str, c_type: str = "int64_t") -> str:
    """The C99 function ``<prefix>_rhe(d, k)`` (``int64_t``), ``<prefix>_i32_rhe(d, k)``
    (``int32_t``) or ``<prefix>_i16_rhe(d, k)`` (``int16_t``): the C reading of the ``rhe``
    opcode (:func:`~snnquant.export.round_half_even_shift`)."""
    suffix, b = _C_WIDTHS[c_type]
    u = "u" + c_type
    return f"""/* round(d / 2^k), ties to even (1 <= k <= {b - 1}, |d| < 2^{b}), as torch.round and IntegerSNN:
 * (e + 2^(k-1) - 1 + floor(e / 2^k) mod 2) >> k on e = d + 2^{b} >= 0, in {u} (no shift of a
 * negative number, no overflow); 2^{b} is a multiple of 2^(k+1), so ties go the same way;
 * every step cast back to {u}, so that compilers keep {u} lanes when they vectorise */
static {c_type} {prefix}{suffix}_rhe({c_type} d, int k)
{{
    const {u} e = ({u})(({u})d + (({u})1 << {b}));
    const {u} odd = ({u})((e >> k) & 1u);
    const {u} r = ({u})(({u})(e + odd + ({u})((({u})1 << (k - 1)) - 1u)) >> k);
    return ({c_type})(({c_type})r - ({c_type})((({c_type})1) << ({b} - k)));
}}
"""


def _hull(*ranges: Interval) -> Interval:
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


def _rhe_interval(a: Interval, k: int) -> Interval:
    rhe = integer_ops.round_half_even_shift
    return rhe(a[0], k), rhe(a[1], k)


def _soft_reset_interval(q: Interval, s: Interval, th: int) -> Interval:
    # a spike means q >= th: the value after subtracting th lies in [max(th, q_lo) - th, q_hi - th]
    fire_lo = max(th, q[0])
    return _hull(q, (fire_lo - th, q[1] - th)) if fire_lo <= q[1] else q


@dataclass(frozen=True)
class Opcode:
    """One integer operation in its three readings (see the module documentation).

    Attributes:
        torch: ``f(rhe, out, *args)`` on tensors (``rhe`` is the rounding function to use,
            called as ``rhe(d, k, out=out)``; ``out`` is a tensor that receives the result, of
            the arguments' shape and integer dtype and none of them, or ``None`` to allocate).
            Spikes are 0/1 in the arguments' integer dtype. Every intermediate stays within
            :meth:`NeuronProgram.torch_bound`.
        c: ``f(prefix, *args)`` -> C expression (arguments already C text; ``prefix`` names the
            generated ``<prefix>_rhe`` helper).
        interval: ``f(*args)`` on ``(lo, hi)`` ranges (constants as ``(c, c)``) -> ``(lo, hi)``.
        c_type: C type of the result.
    """

    torch: Callable
    c: Callable
    interval: Callable
    c_type: str = "int64_t"


def _torch_ge(out, a, b):
    # [a >= b] = clamp(a - b + 1, 0, 1) on integers: two fast integer operations, the result in
    # a's dtype (a comparison writes bool, several times slower on the CPU, and needs a cast)
    if isinstance(b, int):
        return torch.clamp_(torch.sub(a, b - 1, out=out), 0, 1)
    return torch.clamp_(torch.sub(a, b, out=out).add_(1), 0, 1)


def _torch_hard_reset(out, q, s, vr):
    # q - s (q - v_r): q where s = 0, v_r where s = 1 (masked_fill is several times slower)
    d = q if isinstance(vr, int) and vr == 0 else torch.sub(q, vr, out=out)
    return torch.addcmul(q, d, s, value=-1, out=out)


#: The opcodes of a :class:`NeuronProgram`. Arguments are registers (names) or int constants;
#: ``shl``/``rhe`` take a constant shift ``k`` and ``mul`` a constant factor ``m >= 1``.
OPCODES: Dict[str, Opcode] = {
    # a * 2^k; C multiplies, so that no negative number is shifted
    "shl": Opcode(lambda rhe, out, a, k: torch.mul(a, 1 << k, out=out),
                  lambda p, a, k: f"{a} * {c_literal(1 << int(k))}",
                  lambda a, k: (a[0] << k[0], a[1] << k[0])),
    "mul": Opcode(lambda rhe, out, a, m: torch.mul(a, m, out=out),
                  lambda p, a, m: f"{a} * {m}",
                  lambda a, m: (a[0] * m[0], a[1] * m[0])),
    "add": Opcode(lambda rhe, out, a, b: torch.add(a, b, out=out),
                  lambda p, a, b: f"{a} + {b}",
                  lambda a, b: (a[0] + b[0], a[1] + b[1])),
    "sub": Opcode(lambda rhe, out, a, b: torch.sub(a, b, out=out),
                  lambda p, a, b: f"{a} - {b}",
                  lambda a, b: (a[0] - b[1], a[1] - b[0])),
    # round(a / 2^k), ties to even (integer_ops.round_half_even_shift)
    "rhe": Opcode(lambda rhe, out, a, k: rhe(a, k, out=out),
                  lambda p, a, k: f"{p}_rhe({a}, {k})",
                  lambda a, k: _rhe_interval(a, k[0])),
    # the stored membrane's range is the whole clamp range, whatever the charge's bound
    "clamp": Opcode(lambda rhe, out, a, lo, hi: torch.clamp(a, lo, hi, out=out),
                    lambda p, a, lo, hi: f"{a} < {lo} ? {lo} : ({a} > {hi} ? {hi} : {a})",
                    lambda a, lo, hi: (lo[0], hi[0])),
    "ge": Opcode(lambda rhe, out, a, b: _torch_ge(out, a, b),
                 lambda p, a, b: f"{a} >= {b}",
                 lambda a, b: (0, 1), c_type="int"),
    # hard reset: v_reset where s, else q
    "hard_reset": Opcode(lambda rhe, out, q, s, vr: _torch_hard_reset(out, q, s, vr),
                         lambda p, q, s, vr: f"{s} ? {vr} : {q}",
                         lambda q, s, vr: _hull(q, vr)),
    # soft reset: q - theta where s, else q
    "soft_reset": Opcode(lambda rhe, out, q, s, th: torch.add(q, s, alpha=-th, out=out),
                         lambda p, q, s, th: f"{s} ? {q} - {th} : {q}",
                         lambda q, s, th: _soft_reset_interval(q, s, th[0])),
}


@dataclass(frozen=True)
class Instr:
    """``dst = code(*args)``: one instruction of a :class:`NeuronProgram`."""

    dst: str
    code: str
    args: Tuple[Arg, ...]


def _evaluate(instrs, env: dict, rhe: Callable, buffers: Optional[Dict[str, torch.Tensor]] = None
              ) -> None:
    """Run ``instrs`` on the registers ``env`` (torch reading), in place; a register with a
    tensor in ``buffers`` is written into it."""
    buffers = buffers or {}
    for ins in instrs:
        env[ins.dst] = OPCODES[ins.code].torch(
            rhe, buffers.get(ins.dst), *[env[a] if isinstance(a, str) else a for a in ins.args])


@dataclass(frozen=True)
class NeuronProgram:
    r"""The step of one integer neuron layer as an operation list (see :func:`neuron_program`).

    Inputs are the registers ``v`` (membrane before the step) and ``xin`` (synaptic current);
    outputs ``v_next`` (membrane after the step) and ``spike``.

    Attributes:
        instrs: the instructions, in order (each register is assigned once).
        v_init: the membrane before the first step.
        v_min, v_max: the clamp range of the membrane.
    """

    instrs: Tuple[Instr, ...]
    v_init: int
    v_min: int
    v_max: int

    def run(self, v, xin, rhe: Optional[Callable] = None, trace: Optional[dict] = None,
            given: Optional[Dict[str, torch.Tensor]] = None,
            buffers: Optional[Dict[str, torch.Tensor]] = None):
        """One step on integer tensors: ``(v_next, spike)`` (spike 0/1 in the membrane's dtype).

        Args:
            v, xin: the membrane before the step and the input current (same dtype).
            rhe: the rounding of the ``rhe`` opcode, called as ``rhe(d, k, out=...)`` (default
                :func:`~snnquant.export.round_half_even_shift`).
            trace: a dict that receives every register.
            given: registers already computed (from :meth:`precompute`); their instructions
                are skipped.
            buffers: tensors, by register name, that receive those registers (no allocation;
                each distinct from every other register's tensor, ``v``'s and ``xin``'s).
        """
        env = {} if trace is None else trace
        env.update(v=v, xin=xin)
        skip = ()
        if given:
            env.update(given)
            skip = given.keys()
        _evaluate([i for i in self.instrs if i.dst not in skip], env,
                  rhe or integer_ops.round_half_even_shift, buffers)
        return env["v_next"], env["spike"]

    def input_only(self) -> Tuple[str, ...]:
        """The registers that depend on the input current only (not on the membrane)."""
        known = {"xin"}
        for ins in self.instrs:
            if all(not isinstance(a, str) or a in known for a in ins.args):
                known.add(ins.dst)
        return tuple(i.dst for i in self.instrs if i.dst in known)

    def precompute(self, xin_seq, rhe: Optional[Callable] = None) -> Dict[str, torch.Tensor]:
        """The :meth:`input_only` registers for every step at once, from the currents of all
        steps ``xin_seq`` ``[T, ...]``; pass ``{k: v[t]}`` as ``given`` to :meth:`run`."""
        names = set(self.input_only())
        env = {"xin": xin_seq}
        _evaluate([i for i in self.instrs if i.dst in names], env,
                  rhe or integer_ops.round_half_even_shift)
        return {k: env[k] for k in names}

    def c_lines(self, prefix: str, c_type: str = "int64_t") -> List[str]:
        """The step as C99 statements declaring one local per register, of type ``c_type``
        (``int64_t``, or ``int32_t`` where :meth:`c_type` allows it; the spike is an ``int``);
        ``v`` and ``xin`` must be locals of that type already."""
        out = []
        helper = prefix + _C_WIDTHS[c_type][0]
        for ins in self.instrs:
            op = OPCODES[ins.code]
            args = [a if isinstance(a, str) else c_literal(a) for a in ins.args]
            out.append(f"const {c_type if op.c_type == 'int64_t' else op.c_type} {ins.dst} = "
                       f"{op.c(helper, *args)};")
        return out

    def saturating_range(self, x_range: Interval) -> Interval:
        r"""The currents that matter: ``(lo, hi)`` within ``x_range`` such that a current below
        ``lo`` gives the step's result for ``lo``, and one above ``hi`` the result for ``hi``,
        for every membrane the layer can hold. Clamping the current to it changes nothing and
        narrows every register's bound (:meth:`c_type`).

        It holds because the rounded charge ``q`` does not decrease when the current grows (every
        instruction is checked to be non-decreasing in ``xin``; otherwise ``x_range`` itself is
        returned), and it depends on the current only through ``q``: ``hi`` is the smallest
        current whose ``q`` is ``v_max`` for every membrane (interval bounds), ``lo`` the largest
        whose ``q`` is ``v_min``.
        """
        sign = {"xin": 1, "v": 0}           # 1: non-decreasing in xin, 0: independent, None: ?
        for ins in self.instrs:
            s = [sign.get(a, 0) if isinstance(a, str) else 0 for a in ins.args]
            if ins.code == "sub":
                s[1] = -s[1] if s[1] is not None else None
            if ins.code in ("add", "sub", "shl", "mul", "rhe", "clamp"):
                known = [v for v in s if v != 0]
                sign[ins.dst] = (None if None in known or len(set(known)) > 1 else
                                 (known[0] if known else 0))
            else:
                sign[ins.dst] = 0 if all(v == 0 for v in s) else None
        clamp = next(i for i in self.instrs if i.code == "clamp")
        q = clamp.args[0]         # the charge before the clamp (the clamp's interval is its range)
        if sign.get(q) != 1 or any(sign.get(i.dst) is None for i in self.instrs
                                   if i.dst not in ("spike", "v_next")):
            return x_range
        _, v = self.intervals(x_range)

        def q_at(x: int) -> Interval:
            lo, hi = self._interval_pass(v, (x, x))[q]
            return min(max(lo, self.v_min), self.v_max), min(max(hi, self.v_min), self.v_max)

        def search(ok, lo: int, hi: int) -> int:   # the first x in [lo, hi] with ok(x)
            while lo < hi:
                mid = (lo + hi) // 2
                if ok(mid):
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        lo, hi = x_range
        if q_at(hi)[0] == self.v_max:
            hi = search(lambda x: q_at(x)[0] == self.v_max, lo, hi)
        if q_at(lo)[1] == self.v_min:
            lo = -search(lambda x: q_at(-x)[1] == self.v_min, -hi, -lo)
        return lo, hi

    def c_type(self, x_range: Interval) -> str:
        """The narrowest register type :meth:`c_lines` can print the step with for currents in
        ``x_range``: ``int16_t`` when every register (:meth:`intervals`) stays below
        :math:`2^{14}` in magnitude and every shift below 14 (what ``<prefix>_i16_rhe`` needs),
        ``int32_t`` below :math:`2^{30}` and 30, else ``int64_t``. C computes in ``int`` and
        stores each register in its type, which holds it: narrow registers let a compiler put
        more neurons in one SIMD register."""
        regs, _ = self.intervals(x_range)
        big = max(max(abs(lo), abs(hi)) for lo, hi in regs.values())
        shift = max(self.shifts() + [0])
        if big < (1 << 14) and shift < 14:
            return "int16_t"
        return "int32_t" if big < (1 << 30) and shift < 30 else "int64_t"

    def intervals(self, x_range: Interval) -> Tuple[Dict[str, Interval], Interval]:
        """Ranges of every register when the current lies in ``x_range``, for every membrane the
        layer can hold; and that membrane range (initial value, reset values, clamp range)."""
        v = (self.v_init, self.v_init)
        for _ in range(2):  # the output range does not depend on v (clamp): two passes suffice
            env = self._interval_pass(v, x_range)
            v = _hull((self.v_init, self.v_init), env["v_next"])
        return self._interval_pass(v, x_range), v

    def _interval_pass(self, v: Interval, x: Interval) -> Dict[str, Interval]:
        env = {"v": v, "xin": x}
        for ins in self.instrs:
            env[ins.dst] = OPCODES[ins.code].interval(
                *[env[a] if isinstance(a, str) else (a, a) for a in ins.args])
        return env

    def torch_bound(self, x_range: Interval) -> int:
        """A bound on the magnitude of every value the torch reading computes (registers and
        the intermediates inside an opcode: ``rhe`` adds up to :math:`2^{k-1}`, ``ge`` computes
        :math:`a - b + 1`, a reset :math:`s (q - v_r)` or :math:`s \\theta`) when the current
        lies in ``x_range``: the widest register plus the largest constant plus
        :math:`2^{k_{max}} + 1`."""
        regs, v = self.intervals(x_range)
        widest = max(max(abs(lo), abs(hi)) for lo, hi in list(regs.values()) + [v, x_range])
        consts = [abs(int(a)) for i in self.instrs for a in i.args if not isinstance(a, str)]
        # a comparison of two registers computes a - b + 1: one more register's width
        pair = any(i.code == "ge" and isinstance(i.args[1], str) for i in self.instrs)
        return (widest * (2 if pair else 1) + max(consts + [0]) + (1 << max(self.shifts() + [0]))
                + 1)

    def shifts(self) -> List[int]:
        """Every shift amount the program uses (``shl``, ``rhe``)."""
        return [int(i.args[1]) for i in self.instrs if i.code in ("shl", "rhe")]


def neuron_program(op: NeuronOp) -> NeuronProgram:
    r"""The step of :class:`~snnquant.export.NeuronOp` ``op`` as an operation list.

    .. math::

        x &= X \ll \mathrm{input\_shift},\quad D = x - ((v - v_r) \ll d)\ \text{or}\
            (v - v_r) \ll d,\quad L = \mathrm{rhe}(M D, r)\\
        h &= (v \ll d) + x\ \text{(IF)},\quad (v \ll t) + L\ \text{or}\
            (v \ll t) - L + (x \ll (k - r))\ \text{(LIF)},\quad t = d + k - r\\
        q &= \mathrm{clamp}(\mathrm{rhe}(h, t), v_{min}, v_{max}),\quad S = [q \ge \theta],
            \quad v' = \text{reset}(q, S)

    Zero shifts, a multiplier of 1 and :math:`v_r = 0` emit no instruction. The reset value
    :math:`v_r` is :attr:`NeuronOp.v_rest`.
    """
    d, k, m, r = op.grid_shift, op.leak_shift, op.leak_multiplier, op.leak_round_shift
    total = d + k - r
    vr = op.v_rest
    code: List[Instr] = []

    def emit(dst: str, name: str, *args) -> str:
        code.append(Instr(dst, name, tuple(args)))
        return dst

    def shl(dst: str, a: str, s: int) -> str:
        return emit(dst, "shl", a, s) if s else a

    x = shl("x", "xin", op.input_shift)
    if op.kind == "if":
        h = emit("h", "add", shl("v_grid", "v", d), x)
    else:
        vd = emit("v_rel", "sub", "v", vr) if vr else "v"
        vd = shl("v_rel_grid", vd, d)
        leak = emit("leak", "sub", x, vd) if op.decay_input else vd
        if m != 1:
            leak = emit("leak_m", "mul", leak, m)
        if r:
            leak = emit("leak_r", "rhe", leak, r)
        vt = shl("v_charge", "v", total)
        if op.decay_input:
            h = emit("h", "add", vt, leak)
        else:
            h = emit("h", "add", emit("h_kept", "sub", vt, leak), shl("x_charge", x, k - r))
    q = emit("q_round", "rhe", h, total) if total else h
    q = emit("q", "clamp", q, op.v_min, op.v_max)
    emit("spike", "ge", q, op.threshold)
    if op.reset_mode == "hard":
        emit("v_next", "hard_reset", q, "spike", op.v_reset)
    else:
        emit("v_next", "soft_reset", q, "spike", op.threshold)
    return NeuronProgram(tuple(code), int(op.v_init), int(op.v_min), int(op.v_max))


@dataclass(frozen=True)
class SynapseRescale:
    r"""The rescale of a synaptic layer's accumulator: :math:`X_c = A_c f_c + b_c`.

    :math:`f_c = m_c 2^{\sigma_c}` (``multiplier`` times ``2 ** shift`` of the
    :class:`~snnquant.export.SynapseOp`); an output channel whose weights are all zero gets
    :math:`f_c = 0` (its accumulator is 0 whatever the factor, and the bound stays small).

    Attributes:
        factor: :math:`f_c` per output channel (Python ints).
        bias: :math:`b_c` per output channel, or ``None``.
    """

    factor: Tuple[int, ...]
    bias: Optional[Tuple[int, ...]]

    @classmethod
    def of(cls, op: SynapseOp) -> "SynapseRescale":
        """The rescale of ``op``."""
        w = op.weight.to(torch.int64)
        nonzero = (w.reshape(w.shape[0], -1) != 0).any(dim=1).tolist()
        factor = tuple(int(m) << int(s) if nz else 0 for m, s, nz in
                       zip(op.multiplier.tolist(), op.shift.tolist(), nonzero))
        bias = None if op.bias is None else tuple(int(b) for b in op.bias.tolist())
        return cls(factor, bias)

    @property
    def same_factor(self) -> bool:
        """Whether every channel has the same factor."""
        return all(f == self.factor[0] for f in self.factor)

    def apply(self, acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The torch reading on an accumulator ``[B, C, *spatial]`` (or ``[B, C]``): ``X`` in
        ``dtype``."""
        acc = acc.to(dtype)
        shape = [1, -1] + [1] * (acc.dim() - 2)
        if self.same_factor:
            if self.factor and self.factor[0] != 1:
                acc = acc * self.factor[0]
        else:
            acc = acc * torch.tensor(self.factor, dtype=dtype).reshape(shape)
        if self.bias is not None:
            acc = acc + torch.tensor(self.bias, dtype=dtype).reshape(shape)
        return acc

    def folded(self, weight: torch.Tensor, dtype: torch.dtype
               ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        r"""The torch reading: ``(w', b)`` with :math:`w'_c = f_c w_c`, so that
        :math:`\mathrm{conv}(x, w') + b = A f + b` exactly (every partial sum of the folded
        convolution is bounded by :attr:`SynapseBounds.current`), in ``dtype``."""
        factor = torch.tensor(self.factor, dtype=torch.int64)
        w = weight.to(torch.int64) * factor.reshape([-1] + [1] * (weight.dim() - 1))
        bias = None if self.bias is None else torch.tensor(self.bias, dtype=dtype)
        return w.to(dtype), bias

    def c_lines(self, acc: str, acc_t: str, const_array: Callable[[str, Sequence[int]], str],
                index: int, channel: str = "oc") -> List[str]:
        """C statements applying the rescale to the accumulator variable ``acc`` of channel
        ``channel``; ``const_array(label, values)`` declares a table and returns its name."""
        lines = []
        if self.same_factor:
            if self.factor and self.factor[0] != 1:
                lines.append(f"{acc} *= {c_literal(self.factor[0])};")
        else:
            table = const_array(f"rescale{index}", self.factor)
            lines.append(f"{acc} *= ({acc_t}){table}[{channel}];")
        if self.bias is not None:
            table = const_array(f"b{index}", self.bias)
            lines.append(f"{acc} += ({acc_t}){table}[{channel}];")
        return lines


# ------------------------------------------------------------------------------------------------
# bounds of every value, proven from the description

@dataclass(frozen=True)
class SynapseBounds:
    r"""Bounds of a synaptic layer on inputs :math:`|x| \le x_{max}`.

    Attributes:
        l1: :math:`\lVert w_c \rVert_1` per output channel.
        accumulator: per channel :math:`\lVert w_c \rVert_1 x_{max}` (bounds every partial sum of
            :math:`A_c`, in any order).
        current: per channel :math:`\lVert w_c \rVert_1 x_{max} |f_c| + |b_c|` (bounds
            :math:`X_c` and the rescale's intermediate).
    """

    l1: Tuple[int, ...]
    accumulator: Tuple[int, ...]
    current: Tuple[int, ...]

    @property
    def widest(self) -> int:
        """The largest magnitude any value of the layer reaches (at least 1)."""
        return max(self.accumulator + self.current + (1,))

    @property
    def out_range(self) -> Interval:
        """The range of the current :math:`X`."""
        b = max(self.current + (0,))
        return -b, b


def synapse_bounds(op: SynapseOp, rescale: SynapseRescale, in_range: Interval) -> SynapseBounds:
    """The :class:`SynapseBounds` of ``op`` on inputs in ``in_range``."""
    mag = max(abs(in_range[0]), abs(in_range[1]))
    w = op.weight.to(torch.int64)
    l1 = tuple(int(v) for v in w.abs().reshape(w.shape[0], -1).sum(dim=1).tolist())
    bias = rescale.bias or (0,) * len(l1)
    acc = tuple(n * mag for n in l1)
    cur = tuple(a * abs(f) + abs(b) for a, f, b in zip(acc, rescale.factor, bias))
    return SynapseBounds(l1, acc, cur)


def pool_range(op: PoolOp, in_range: Interval) -> Interval:
    """The range of a pooling's output: the input's (max), or :math:`a` times it (sum of
    :math:`a` elements, 0 included for the padding)."""
    if op.kind == "max":
        return in_range
    area = 1
    for k in op.kernel_size:
        area *= int(k)
    return min(0, area * in_range[0]), max(0, area * in_range[1])


def join_range(op: JoinOp, in_ranges: Sequence[Interval]) -> Interval:
    r"""The range of a join's output: :math:`\sum_i x_i 2^{\sigma_i}` (``'add'``), or
    :math:`[0, 1]` (``'and'``/``'iand'`` of spikes)."""
    if op.kind != "add":
        return 0, 1
    return (sum(lo << s for (lo, _), s in zip(in_ranges, op.shifts)),
            sum(hi << s for (_, hi), s in zip(in_ranges, op.shifts)))


def join_bound(op: JoinOp, in_ranges: Sequence[Interval]) -> int:
    r"""The largest magnitude a join's output and every partial sum of its operands reach, in any
    order: :math:`\sum_i \max |x_i|\, 2^{\sigma_i}` (``'add'``), 1 (``'and'``/``'iand'``)."""
    if op.kind != "add":
        return 1
    return sum(max(abs(lo), abs(hi)) << s for (lo, hi), s in zip(in_ranges, op.shifts))


def reduce_range(op: ReduceOp, in_range: Interval) -> Interval:
    """The range of a sum of ``op.count`` values of ``in_range`` (every partial sum inside it)."""
    return min(0, op.count * in_range[0]), max(0, op.count * in_range[1])


def matmul_range(op: MatMulOp, a: Interval, b: Interval) -> Interval:
    r"""The range of a matrix product: :math:`K` times the range of one product
    :math:`a_{ik} b_{kj}`, 0 included (every partial sum inside it)."""
    corners = [x * y for x in a for y in b]
    return min(0, op.inner * min(corners)), max(0, op.inner * max(corners))


def scale_range(op: ScaleOp, in_range: Interval) -> Interval:
    """The range of :math:`x 2^k` as integers: shifted left for :math:`k > 0`, else the input's."""
    k = max(op.exponent, 0)
    return in_range[0] << k, in_range[1] << k


def adaptive_windows(size_in: int, size_out: int) -> List[Tuple[int, int]]:
    r"""``[(start, end), ...]`` of PyTorch's adaptive pooling along one dimension:
    :math:`[\lfloor i\, n / m \rfloor, \lceil (i + 1)\, n / m \rceil)` for input size :math:`n`
    and output size :math:`m`."""
    return [((i * size_in) // size_out, -((-(i + 1) * size_in) // size_out))
            for i in range(size_out)]
