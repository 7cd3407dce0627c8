r"""A portable C99 runtime of an integer network: :func:`to_c`.

The generated code computes exactly what :class:`~snnquant.export.IntegerSNN` computes, one time
step of one sample per call, with integer arithmetic only (no floating point, no ``malloc``, only
``<stdint.h>`` and ``<string.h>``). Every intermediate value has a bound that is worked out here,
from the description, when the code is written:

* the input of the network lies in :math:`[-x_{max}, x_{max}]` (``input_max``), spikes in
  :math:`\{0, 1\}`, a sum pool of values in :math:`[l, h]` in :math:`[a\,l, a\,h]`
  (:func:`~snnquant.export.ir.program.pool_range`), a join and its partial sums by
  :math:`\sum_i \max|x_i|\, 2^{\sigma_i}` (:func:`~snnquant.export.ir.program.join_bound`);
* a synaptic layer's accumulator and current are bounded by
  :math:`|X_c| \le \lVert w_c \rVert_1\, |x|_{max}\, m_c 2^{\sigma_c} + |b_c|`;
* a neuron's charge by the bounds of every register of its operation list
  (:meth:`~snnquant.export.ir.program.NeuronProgram.intervals`), the same list
  :class:`~snnquant.export.IntegerSNN` runs and this module prints as C.

The partial sums of an accumulator are bounded by the same :math:`\lVert w_c \rVert_1 |x|_{max}`
in any order and over any subset of the inputs, so the event-driven form (only the nonzero inputs,
see :func:`to_c`) and the dense form need the same types. From these bounds each layer picks the
narrowest C type that holds it (``int32_t`` accumulators where :math:`2^{31}` is never reached,
``int64_t`` otherwise; a neuron layer's registers in ``int16_t`` or ``int32_t`` where every
one stays below :math:`2^{14}` or :math:`2^{30}`,
:meth:`~snnquant.export.ir.program.NeuronProgram.c_type`, after its current is clamped to the
range beyond which the charge saturates for every membrane,
:meth:`~snnquant.export.ir.program.NeuronProgram.saturating_range`, where that makes the type
narrower), and a network whose bound reaches :math:`2^{62}` is refused: C signed overflow is
undefined behaviour, so the code never relies on it. Shifts of negative numbers are written as
multiplications by :math:`2^k` (left) and as ``~(~d >> k)`` (floor right shift), so the code does
not depend on implementation-defined behaviour either.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ..._io import atomic_write_files
from ..ir.description import (NETWORK_INPUT, ExportError, FlattenOp, GatherOp, IntegerNetwork,
                              JoinOp, MatMulOp, NeuronOp, PoolOp, ReduceOp, ScaleOp, SynapseOp,
                              check_input_shape)
from ..ir.integer_ops import narrowest_int
from ..ir.program import (SynapseRescale, adaptive_windows, c_literal, c_rhe_helper, join_bound,
                          join_range, matmul_range, neuron_program, pool_range, reduce_range,
                          scale_range, synapse_bounds)
from .simulator import op_shapes

__all__ = ["to_c", "c_memory", "CMemory", "check_c_name", "C_HEADER_NAMES",
           "C_SIZE_NOTICE_BYTES", "LargeCSourceWarning"]

#: Largest magnitude any intermediate may reach (bits): int64 with a margin, no overflow.
_LIMIT_BITS = 62
#: Elements of a weight tensor formatted at a time (a 16 x 4096 block of the C text).
_CONST_BLOCK = 1 << 16

_C_KEYWORDS = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "_Bool", "_Complex", "_Imaginary",
}

_C_TYPES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t",
            torch.int32: "int32_t", torch.int64: "int64_t"}
_TYPES_BYTES = {name: dtype.itemsize for dtype, name in _C_TYPES.items()}


def _ctype(lo: int, hi: int, signed: bool = False) -> Tuple[str, int]:
    """Narrowest C integer type (name, bytes) that holds every integer in ``[lo, hi]``
    (``uint8_t`` too unless ``signed``)."""
    dtype = narrowest_int(lo, hi, unsigned=not signed)
    if dtype is None:
        raise ExportError(f"no C integer type holds [{lo}, {hi}]")
    return _C_TYPES[dtype], dtype.itemsize


_lit = c_literal


def _quote(text) -> str:
    """A layer name quoted for a C comment: ASCII only (``ascii()`` escapes the rest), and neither
    ``/*`` nor ``*/`` nor a trigraph survives (every ``?`` is escaped), so no name can end the
    comment or make the compiler warn."""
    return (ascii(str(text)).replace("*/", "*\\/").replace("/*", "/\\*")
            .replace("?", "\\?"))


@dataclass
class CMemory:
    """Memory of a generated C model.

    Attributes:
        rom_bytes: constant data (weights, biases, rescale factors), code not included.
        ram_bytes: ``sizeof(<name>_state)``: the membranes of one sample, the buffers between
            layers and the sums of the event-driven layers.
        state_bytes: the membranes alone.
        input_size: ``<NAME>_INPUT_SIZE``; ``output_size``: ``<NAME>_OUTPUT_SIZE``.
        scratch_bytes: the sums of the event-driven synaptic layers and the spikes of the
            neuron layers they feed (one layer's at a time; 0 with ``synapses='dense'``),
            included in ``ram_bytes``.
        list_bytes: what the index lists of spikes (``synapses='events'``: the spikes of a
            neuron layer that only synaptic layers read travel as the count and the indices of
            the neurons that fired) add to the buffers between layers over the one byte per
            neuron of ``synapses='dense'``; included in ``ram_bytes``, so that
            ``ram_bytes`` = dense ``ram_bytes`` + ``scratch_bytes`` + ``list_bytes``.
    """

    rom_bytes: int
    ram_bytes: int
    state_bytes: int
    input_size: int
    output_size: int
    scratch_bytes: int = 0
    list_bytes: int = 0


# ------------------------------------------------------------------------------------------------
# validation and shapes

#: The standard headers of C (C89 to C23) and POSIX (issue 8) that a bare ``#include <x.h>``
#: names. :func:`to_c` refuses them as ``name`` (compared case-insensitively, for
#: case-insensitive file systems): ``<name>.h`` in a folder given with ``-I`` would hide the
#: system header from every file compiled with that flag.
C_HEADER_NAMES = frozenset((
    # C
    "assert", "complex", "ctype", "errno", "fenv", "float", "inttypes", "iso646", "limits",
    "locale", "math", "setjmp", "signal", "stdalign", "stdarg", "stdatomic", "stdbit", "stdbool",
    "stdckdint", "stddef", "stdint", "stdio", "stdlib", "stdnoreturn", "string", "tgmath",
    "threads", "time", "uchar", "wchar", "wctype",
    # POSIX
    "aio", "cpio", "devctl", "dirent", "dlfcn", "endian", "fcntl", "fmtmsg", "fnmatch", "ftw",
    "glob", "grp", "iconv", "langinfo", "libgen", "libintl", "monetary", "mqueue", "ndbm",
    "netdb", "nl_types", "poll", "pthread", "pwd", "regex", "sched", "search", "semaphore",
    "spawn", "strings", "stropts", "syslog", "tar", "termios", "trace", "ulimit", "unistd",
    "utime", "utmpx", "wordexp",
))


def check_c_name(name) -> str:
    """``name`` as the C model's name: a C identifier of at most 31 characters that is not a C
    keyword, does not start with ``__`` and is not a standard C or POSIX header name
    (:data:`C_HEADER_NAMES`, case-insensitively: ``<name>.h`` would hide that header).

    Raises:
        ValueError: naming ``name``, its value and the rule it breaks.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"name must be a C identifier (letters, digits, '_', not starting with a "
                         f"digit), got {name!r}")
    if name in _C_KEYWORDS or name.startswith("__") or len(name) > 31:
        raise ValueError(f"name must not be a C keyword, start with '__' or exceed 31 characters, "
                         f"got {name!r}")
    if name.lower() in C_HEADER_NAMES:
        raise ValueError(f"name must not be a standard C or POSIX header name, got {name!r}: "
                         f"{name}.h would hide <{name.lower()}.h> from every file compiled with "
                         f"-I on its folder; choose another, e.g. {name}_snn")
    return name


def _infer_input_shape(desc: IntegerNetwork) -> Tuple[int, ...]:
    first = next((op for op in desc.ops if not isinstance(op, FlattenOp)), None)
    if isinstance(first, SynapseOp) and first.kind == "linear" and not any(
            isinstance(op, FlattenOp) for op in desc.ops[:desc.ops.index(first)]):
        return (int(first.weight.shape[1]),)
    kind = "an empty network" if first is None else f"{type(first).__name__} {first.name!r}"
    raise ValueError(f"input_shape is required: the network starts with {kind}, whose input size "
                     f"the description does not hold; pass the per-sample input shape, e.g. "
                     f"input_shape=(2, 34, 34)")


def _aliases(op) -> bool:
    """Operations that move no data in C: their output is their input's buffer (in C order)."""
    return isinstance(op, FlattenOp) or (isinstance(op, GatherOp) and op.index is None) or (
        isinstance(op, ScaleOp) and op.exponent <= 0)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# ------------------------------------------------------------------------------------------------
# code generation

class _Gen:
    """Writes the C source of one network; ``self.rom``/``self.ram`` collect the memory."""

    def __init__(self, desc: IntegerNetwork, name: str, input_shape, synapses: str = "events"):
        self.desc, self.name, self.NAME = desc, name, name.upper()
        self.synapses = synapses
        self.const_types: dict = {}
        self.scratch: List[Tuple[str, int, int]] = []   # (struct members, bytes, op index)
        self.input_shape = tuple(int(v) for v in input_shape)
        self.shapes = op_shapes(desc, self.input_shape)
        self.consts: List[str] = []
        self.funcs: List[str] = []
        self.rom = 0
        self.state_members: List[Tuple[int, str]] = []   # (element bytes, declaration)
        self.state_bytes = 0
        self.rhe_types: set = set()   # the C types a rounding helper is written for
        self.fire: dict = {}   # neuron layer -> the event-driven sums it reads (_fire_function)
        self.protos: List[str] = []

    # -- helpers --------------------------------------------------------------------------------
    def const_array(self, label: str, values: Union[Sequence[int], torch.Tensor],
                    signed: bool = False) -> str:
        """Declare ``values`` (a sequence or an integer tensor, read in C order) as a
        ``static const`` array of the narrowest type; return its name. A tensor is formatted
        a block at a time, never as one list of Python ints."""
        if isinstance(values, torch.Tensor):
            flat = values.reshape(-1)
            lo, hi = (int(v) for v in torch.aminmax(flat)) if flat.numel() else (0, 0)
            blocks = (flat[i:i + _CONST_BLOCK].tolist() for i in range(0, flat.numel(),
                                                                       _CONST_BLOCK))
            count = flat.numel()
        else:
            values = [int(v) for v in values]
            lo, hi, blocks, count = min(values), max(values), (values,), len(values)
        ctype, size = _ctype(lo, hi, signed)
        ident = f"{self.name}_{label}"
        rows = [",\n".join("    " + ", ".join(_lit(v) for v in block[i:i + 16])
                           for i in range(0, len(block), 16)) for block in blocks]
        self.consts.append(f"static const {ctype} {ident}[{count}] = {{\n" + ",\n".join(rows)
                           + "\n};")
        self.rom += size * count
        self.const_types[ident] = ctype
        return ident

    def scratch_arrays(self, i: int, sum_t: str, n: int, fired: bool) -> str:
        """The sums (``n`` ``sum_t``) of event-driven layer ``i`` and, where it feeds a neuron
        layer (``fired``), that layer's spikes (``n`` bytes), as a struct in the state's scratch
        union (one layer uses it at a time); returns the C expression that names the struct."""
        size = _TYPES_BYTES[sum_t]
        members = f"{sum_t} sum[{n}];" + (f" uint8_t fired[{n}];" if fired else "")
        nbytes = size * n + (n if fired else 0)
        self.scratch.append((members, -(-nbytes // size) * size, i))
        return f"s->scratch.s{i}"

    # -- operations -----------------------------------------------------------------------------
    def synapse(self, i: int, op: SynapseOp, in_shape, out_shape, in_range, in_t, out_t_fixed,
                fuse_with=None, in_list=False, out_list=False):
        """Write synaptic layer ``i`` (fused with neuron layer ``fuse_with``: its spikes are the
        output); ``in_list``/``out_list``: the input/output is an index list
        (:meth:`_spike_store`), else a buffer."""
        w = op.weight.to(torch.int64)
        c_out = int(w.shape[0])
        rescale_def = SynapseRescale.of(op)
        factor = rescale_def.factor
        bound = synapse_bounds(op, rescale_def, in_range)
        for c in range(c_out):
            if max(bound.current[c], bound.accumulator[c], abs(factor[c])) >= (1 << _LIMIT_BITS):
                raise ExportError(f"layer {op.name!r}: the current of output channel {c} is bounded "
                                  f"only by {bound.current[c]} (sum|w| = {bound.l1[c]}, max|x| = "
                                  f"{max(map(abs, in_range))}, rescale {factor[c]}), which reaches "
                                  f"2^{_LIMIT_BITS}: the C code would overflow int64")
        wide = max([bound.widest] + [abs(f) for f in factor])
        acc_t = "int32_t" if wide < (1 << 31) else "int64_t"
        out_range = bound.out_range
        out_t = out_t_fixed or _ctype(*out_range)[0]
        rescale = rescale_def.c_lines("acc", acc_t, self.const_array, i)
        events = self.synapses == "events"
        if fuse_with is None:
            rescale.append(f"out[o] = ({out_t})acc;")
        elif not events:   # event-driven: the neuron layer's _fire_function charges it
            rescale += self._spike_store(out_list, out_t,
                                         f"{self.name}_n{fuse_with}(s, o, (int64_t)acc)")

        def rescale_code(indent):
            return "\n".join(" " * indent + line for line in rescale)

        state = "" if fuse_with is None and not events else f"{self.name}_state *s, "
        sig = f"static void {self.name}_op{i}({state}const {in_t} *in, {out_t} *out)"
        # the sums of the event-driven form: the accumulator's bound alone (no rescale yet)
        sum_t = _ctype(-max(bound.accumulator + (1,)), max(bound.accumulator + (1,)), signed=True)[0]
        # an event of a spike (0/1) adds the weight itself
        # a value that fits int16_t is multiplied as one (SIMD units multiply 16-bit lanes cheaply)
        x16 = ("(int16_t)" if in_t in ("int32_t", "int64_t")
               and max(map(abs, in_range)) < (1 << 15) else "")
        times_x = "" if (in_range[0] >= 0 and in_range[1] <= 1) else f" * ({acc_t}){x16}x"
        if op.kind == "linear":
            if len(in_shape) != 1:
                raise ExportError(f"layer {op.name!r}: a linear layer on a per-sample input of "
                                  f"shape {in_shape} (not flattened) is not supported by to_c")
            n_in = int(w.shape[1])
            if events:
                # a weight column per nonzero input: weights stored [in][out]
                wname = self.const_array(f"w{i}", w.t())
                sums = self.scratch_arrays(i, sum_t, c_out, fuse_with is not None)
                column = [f"const {self.const_types[wname]} *wj = {wname} + j * {c_out};",
                          f"for (oc = 0; oc < {c_out}; oc++) {{",
                          f"    sum[oc] = ({sum_t})(sum[oc] + ({acc_t})wj[oc]{times_x});", "}"]
                body = f"""{{
    {sum_t} *sum = {sums}.sum;
    int32_t oc;
{self._events(4, in_list, in_t, n_in, column)}
{self._event_outputs(sums, sum_t, 1, c_out, acc_t, rescale, fuse_with, out_list, out_t)}
}}"""
            else:
                wname = self.const_array(f"w{i}", w)
                body = f"""{{
    int32_t oc, j;
    for (oc = 0; oc < {c_out}; oc++) {{
        const int32_t o = oc;
        {acc_t} acc = 0;
        for (j = 0; j < {n_in}; j++) {{
            acc += ({acc_t}){wname}[oc * {n_in} + j] * ({acc_t})in[j];
        }}
        {{
{rescale_code(12)}
        }}
    }}
}}"""
        else:
            if op.kind == "conv1d":
                ci, hi_, wi = in_shape[0], 1, in_shape[1]
                co, ho_, wo = out_shape[0], 1, out_shape[1]
                kh, kw = 1, int(w.shape[2])
                sh, sw = 1, op.stride[0]
                dh, dw = 1, op.dilation[0]
                pads = self._conv_pads(op, (kw,))
                ph, pw = 0, pads[0]
            else:
                ci, hi_, wi = in_shape
                co, ho_, wo = out_shape
                kh, kw = int(w.shape[2]), int(w.shape[3])
                sh, sw = op.stride
                dh, dw = op.dilation
                ph, pw = self._conv_pads(op, (kh, kw))
            cig = int(w.shape[1])
            cog = c_out // op.groups
            if events:
                # a kernel stamp per nonzero input: weights stored [c_in][ky][kx][out of group],
                # sums [oy][ox][oc]; the columns the stamp reaches are clipped once per event
                wt = w.reshape(op.groups, cog, cig, kh, kw).permute(0, 2, 3, 4, 1)
                wname = self.const_array(f"w{i}", wt)
                sums = self.scratch_arrays(i, sum_t, co * ho_ * wo, fuse_with is not None)

                def target(axis, stride, size):
                    """The condition that input row/column t<axis> reaches no output, and the
                    output's index."""
                    cond = (f"t{axis} < 0 || t{axis} >= {size}" if stride == 1 else
                            f"t{axis} < 0 || t{axis} % {stride} != 0 || t{axis} / {stride} >= {size}")
                    return cond, (f"t{axis}" if stride == 1 else f"t{axis} / {stride}")
                miss_y, oy_expr = target("y", sh, ho_)
                miss_x, ox_expr = target("x", sw, wo)
                stamp = [
                    f"const int32_t c = j / {hi_ * wi};",
                    f"const int32_t iy = (j - c * {hi_ * wi}) / {wi};",
                    f"const int32_t ix = j - (c * {hi_} + iy) * {wi};",
                    f"const int32_t g = c / {cig};",
                    "int32_t reach = 0;",
                    f"for (kx = 0; kx < {kw}; kx++) {{",
                    f"    const int32_t tx = ix + {pw} - kx * {dw};",
                    f"    if (!({miss_x})) {{",
                    f"        sum_at[reach] = ({ox_expr}) * {co} + g * {cog};",
                    f"        w_at[reach] = kx * {cog};",
                    "        reach++;",
                    "    }",
                    "}",
                    f"for (ky = 0; ky < {kh}; ky++) {{",
                    f"    const int32_t ty = iy + {ph} - ky * {dh};",
                    f"    {sum_t} *row;",
                    f"    const {self.const_types[wname]} *wrow;",
                    f"    if ({miss_y}) {{",
                    "        continue;",
                    "    }",
                    f"    row = sum + ({oy_expr}) * {wo * co};",
                    f"    wrow = {wname} + (c * {kh} + ky) * {kw * cog};",
                    "    for (r = 0; r < reach; r++) {",
                    f"        {sum_t} *dst = row + sum_at[r];",
                    f"        const {self.const_types[wname]} *wk = wrow + w_at[r];",
                    f"        for (oc = 0; oc < {cog}; oc++) {{",
                    f"            dst[oc] = ({sum_t})(dst[oc] + ({acc_t})wk[oc]{times_x});",
                    "        }",
                    "    }",
                    "}"]
                body = f"""{{
    {sum_t} *sum = {sums}.sum;
    int32_t ky, kx, r, oc;
    int32_t sum_at[{kw}] = {{0}}, w_at[{kw}] = {{0}};
{self._events(4, in_list, in_t, ci * hi_ * wi, stamp)}
{self._event_outputs(sums, sum_t, ho_ * wo, co, acc_t, rescale, fuse_with, out_list, out_t)}
}}"""
            else:
                wname = self.const_array(f"w{i}", w)

                def window(indent, *inner):
                    return self._window(indent, kh, kw, f"oy * {sh} - {ph}", f"ox * {sw} - {pw}",
                                        dh, dw, hi_, wi, *inner)
                body = f"""{{
    int32_t oc, oy, ox, ic, ky, kx;
    for (oc = 0; oc < {co}; oc++) {{
        const int32_t g = oc / {cog};
        for (oy = 0; oy < {ho_}; oy++) {{
            for (ox = 0; ox < {wo}; ox++) {{
                const int32_t o = (oc * {ho_} + oy) * {wo} + ox;
                {acc_t} acc = 0;
                for (ic = 0; ic < {cig}; ic++) {{
                    const int32_t c = g * {cig} + ic;
{window(20, f"acc += ({acc_t}){wname}[((oc * {cig} + ic) * {kh} + ky) * {kw} + kx]",
        f"    * ({acc_t})in[(c * {hi_} + iy) * {wi} + ix];")}
                }}
                {{
{rescale_code(20)}
                }}
            }}
        }}
    }}
}}"""
        fused = "" if fuse_with is None else f", currents straight into neuron layer {_quote(self.desc.ops[fuse_with].name)}"
        self.funcs.append(f"/* {_quote(op.name)}: {op.kind}, {op.weight_bits}-bit weights, "
                          f"{acc_t} accumulator{fused} */\n{sig}\n{body}")
        return out_range, out_t

    @staticmethod
    def _window(indent: int, kh, kw, y0, x0, dh, dw, hi_, wi, *inner: str) -> str:
        """C loops over the window of output (oy, ox), whose first input row and column are the
        C expressions ``y0`` and ``x0``: ``ky``/``kx`` with the input row ``iy`` and column
        ``ix`` inside the input; ``inner`` lines run for each."""
        pad = " " * indent
        lines = [f"for (ky = 0; ky < {kh}; ky++) {{",
                 f"    const int32_t iy = {y0} + ky * {dh};",
                 f"    if (iy < 0 || iy >= {hi_}) {{", "        continue;", "    }",
                 f"    for (kx = 0; kx < {kw}; kx++) {{",
                 f"        const int32_t ix = {x0} + kx * {dw};",
                 f"        if (ix < 0 || ix >= {wi}) {{", "            continue;", "        }"]
        lines += ["        " + ln for ln in inner] + ["    }", "}"]
        return "\n".join(pad + ln for ln in lines)

    def _event_outputs(self, sums: str, sum_t: str, positions: int, co: int, acc_t: str,
                       rescale: Sequence[str], fuse_with, out_list: bool, out_t: str) -> str:
        """C text (indent 4) that turns the sums ``[position][channel]`` of an event-driven layer
        into its output, leaving every sum 0 for the next step (so that no step clears them:
        ``<name>_reset`` zeroes the state): the currents, in C order; or, fused with a neuron
        layer, its spikes. The neuron layer's membranes are then kept in the sums' order, so that
        the loop reads, updates and writes contiguous memory without a branch, and the spike
        bytes (``spiked``) are emitted afterwards a 64-bit word at a time, without a branch per
        neuron: as an index list, or into the output buffer (``sum_t``: the sums' C type)."""
        if fuse_with is None:
            lines = ["int32_t p;"] + self._sum_loop(positions, co, acc_t, rescale, [
                f"const int32_t o = oc * {positions} + p;"])
        else:
            # the neuron layer writes <name>_fire<j> (sums, spike bytes, its membranes)
            self.fire[fuse_with] = (sum_t, positions, co, acc_t, list(rescale))
            lines = [f"uint8_t *spiked = {sums}.fired;",
                     f"{self.name}_fire{fuse_with}(sum, spiked, s->v{fuse_with});"]
            n = positions * co
            o_expr = "j" if positions == 1 else f"(j % {co}) * {positions} + j / {co}"
            emit = (["const int32_t o = " + o_expr + ";"]
                    + self._spike_store(out_list, out_t, "x"))
            fired_decl, fired_end = self._spike_list_ends(out_list, out_t)
            lines += [ln.strip() for ln in fired_decl.split("\n") if ln.strip()]
            if not out_list:
                lines.append(f"memset(out, 0, sizeof({out_t}) * {n});")
            lines += self._events(0, False, "uint8_t", n, emit, src="spiked", clear=True,
                                  every=True).split("\n")
            lines += [ln.strip() for ln in fired_end.split("\n") if ln.strip()]
        return "\n".join("    " + ln for ln in lines)

    @staticmethod
    def _sum_loop(positions: int, co: int, acc_t: str, rescale: Sequence[str],
                  head: Sequence[str] = ()) -> List[str]:
        """C lines: for every sum ``k`` (position ``p``, channel ``oc``), ``acc`` = the sum,
        the sum set to 0, then ``head`` and the rescale's lines; ``p`` and ``oc`` declared by
        the caller."""
        lines = [f"for (p = 0; p < {positions}; p++) {{",
                 f"    for (oc = 0; oc < {co}; oc++) {{",
                 f"        const int32_t k = p * {co} + oc;"]
        lines += ["        " + ln for ln in head]
        lines += [f"        {acc_t} acc = sum[k];", "        sum[k] = 0;"]
        lines += ["        " + ln for ln in rescale]
        return lines + ["    }", "}"]

    def _fire_function(self, j: int, v_t: str, step: Sequence[str], about: str) -> None:
        """Write ``<name>_fire<j>``: neuron layer ``j`` fed by event-driven layer's sums
        (recorded in ``self.fire[j]``): every sum, rescaled, charges its neuron, whose spike
        goes to a byte. The three arrays are distinct objects (``restrict``), and the loop has
        no call and no branch, so compilers vectorise it."""
        sum_t, positions, co, acc_t, rescale = self.fire.pop(j)
        body = (rescale + ["{"] + ["    " + ln for ln in step]
                + ["    spiked[k] = (uint8_t)spike;", "}"])
        proto = (f"static void {self.name}_fire{j}({sum_t} *restrict sum, "
                 f"uint8_t *restrict spiked, {v_t} *restrict membrane)")
        self.protos.append(proto + ";")
        text = "\n".join("    " + ln for ln in ["int32_t p, oc;"]
                         + self._sum_loop(positions, co, acc_t, body))
        self.funcs.append(f"/* {about}\n * Every neuron, with the current of its sum (the "
                          f"sums' order: position, then channel), to a spike byte. */\n"
                          f"{proto}\n{{\n{text}\n}}")

    @staticmethod
    def _spike_store(out_list: bool, out_t: str, spike: str) -> List[str]:
        """C statements that emit the spike ``spike`` (a C expression, 0 or 1) of neuron ``o``:
        ``out[o] = spike`` into a buffer, or into an index list (``out[0]`` the number of
        neurons that fired, ``out[1..]`` their indices, in the order the neurons are visited):
        the index is written always and kept by advancing the count, without a branch (at most
        ``n`` indices after the count: in bounds)."""
        if out_list:
            return [f"out[1 + fired] = ({out_t})o;", f"fired += {spike};"]
        return [f"out[o] = ({out_t}){spike};"]

    @staticmethod
    def _spike_list_ends(out_list: bool, out_t: str) -> Tuple[str, str]:
        """The declaration of the count of an index list and the statement that stores it (both
        empty text for a buffer), for :meth:`_spike_store`."""
        if not out_list:
            return "", ""
        return "\n    int32_t fired = 0;", f"\n    out[0] = ({out_t})fired;"

    @staticmethod
    def _events(indent: int, in_list: bool, in_t: str, n: int, body: Sequence[str],
                src: str = "in", clear: bool = False, every: bool = False) -> str:
        """C loops that run ``body`` for every nonzero input ``j`` (value ``x``): from an index
        list ``src`` (every listed input is a spike, ``x`` = 1, not declared), or scanning the
        buffer ``src`` of ``n`` elements a 64-bit word at a time (``memcpy``: no alignment or
        aliasing assumption) and skipping the words that are 0; ``clear``: setting the nonzero
        ones to 0 once read; ``every``: running ``body`` for every element of a nonzero word,
        zeros included (a branch-free body)."""
        inner = [" " * 4 + ln for ln in body]
        if in_list:
            lines = ["{", f"    const int32_t count = (int32_t){src}[0];", "    int32_t e;",
                     "    for (e = 1; e <= count; e++) {",
                     f"        const int32_t j = (int32_t){src}[e];"]
            lines += ["    " + ln for ln in inner] + ["    }", "}"]
        else:
            per_word = max(1, 8 // _TYPES_BYTES[in_t])
            lines = ["{", "    int32_t j0, j;", f"    for (j0 = 0; j0 < {n}; j0 += {per_word}) {{"]
            if per_word > 1:
                if n % per_word:
                    lines += [f"        const int32_t j1 = j0 + {per_word} < {n} ? j0 + {per_word}"
                              f" : {n};",
                              f"        if (j1 - j0 == {per_word}) {{"]
                else:
                    lines += [f"        const int32_t j1 = j0 + {per_word};", "        {"]
                lines += ["            uint64_t word;",
                          f"            memcpy(&word, {src} + j0, sizeof(word));",
                          "            if (word == 0) {", "                continue;", "            }",
                          "        }"]
            else:
                lines.append("        const int32_t j1 = j0 + 1;")
            lines += ["        for (j = j0; j < j1; j++) {",
                      f"            const {in_t} x = {src}[j];"]
            if not every:
                lines += ["            if (x == 0) {", "                continue;", "            }"]
            lines += ["        " + ln for ln in inner] + ["        }"]
            if clear:
                lines.append(f"        memset({src} + j0, 0, sizeof({in_t}) * (size_t)(j1 - j0));")
            lines += ["    }", "}"]
        return "\n".join(" " * indent + ln for ln in lines)

    @staticmethod
    def _conv_pads(op: SynapseOp, kernel) -> Tuple[int, ...]:
        if isinstance(op.padding, str):
            if op.padding == "valid":
                return (0,) * len(kernel)
            if op.padding == "same":
                # torch: total padding d*(k-1), the odd one on the right (end), left = total // 2
                return tuple((d * (k - 1)) // 2 for d, k in zip(op.dilation, kernel))
            raise ExportError(f"layer {op.name!r}: padding={op.padding!r} is not supported")
        return tuple(int(p) for p in op.padding)

    def pool(self, i: int, op: PoolOp, in_shape, out_shape, in_range, in_t, out_t_fixed,
             out_list=False):
        """Write pooling ``i``; ``out_list``: its output (spikes: a max pool of spikes) goes
        out as an index list (:meth:`_spike_store`)."""
        if op.dims == 1:
            # [C, L], or the features [F] of a VotingLayer as one channel
            c, wi, wo = (1, in_shape[0], out_shape[0]) if len(in_shape) == 1 else \
                (in_shape[0], in_shape[1], out_shape[1])
            hi_, ho_ = 1, 1
            kh, kw = 1, op.kernel_size[0]
            sh, sw = 1, op.stride[0]
            ph, pw = 0, op.padding[0]
            dh, dw = 1, (op.dilation[0] if op.kind == "max" else 1)
        else:
            c, hi_, wi = in_shape
            ho_, wo = out_shape[1], out_shape[2]
            kh, kw = op.kernel_size
            sh, sw = op.stride
            ph, pw = op.padding
            dh, dw = op.dilation if op.kind == "max" else (1, 1)
        y0, x0 = f"oy * {sh} - {ph}", f"ox * {sw} - {pw}"
        if op.output_size:
            # PyTorch's adaptive windows (each of kernel_size elements, checked by op_shapes)
            # start where adaptive_windows says: one table per pooled dimension
            starts = [self.const_array(f"p{i}_{axis}", [a for a, _ in adaptive_windows(n, m)])
                      for axis, (n, m) in enumerate(zip((hi_, wi)[2 - op.dims:],
                                                        (ho_, wo)[2 - op.dims:]))]
            x0 = f"{starts[-1]}[ox]"
            if op.dims == 2:
                y0 = f"{starts[0]}[oy]"
        if op.kind == "max" and in_range[0] >= 0:
            # every window holds an element (PyTorch's padding is at most half the kernel), so
            # the maximum of values >= 0 starts from 0: no flag, no branch
            out_range = in_range
            update = "best = in[j] > best ? in[j] : best;"
            acc_t = in_t
            start = f"{acc_t} best = 0;"
            result = "best"
        elif op.kind == "max":
            out_range = in_range
            init = "int first = 1;"
            update = "if (first || in[j] > best) {\n    best = in[j];\n    first = 0;\n}"
            acc_t = in_t
            start = f"{acc_t} best = 0;\n                {init}"
            result = "best"
        else:
            out_range = pool_range(op, in_range)
            acc_t = "int32_t" if max(map(abs, out_range)) < (1 << 31) else "int64_t"
            start = f"{acc_t} best = 0;"
            update = f"best += ({acc_t})in[j];"
            result = "best"
        out_t = out_t_fixed or _ctype(*out_range)[0]

        def window(indent, *inner):
            return self._window(indent, kh, kw, y0, x0, dh, dw, hi_, wi, *inner)
        store = "\n".join(" " * 16 + ln for ln in self._spike_store(out_list, out_t, result))
        fired_decl, fired_end = self._spike_list_ends(out_list, out_t)
        body = f"""static void {self.name}_op{i}(const {in_t} *in, {out_t} *out)
{{
    int32_t ch, oy, ox, ky, kx, j;{fired_decl}
    for (ch = 0; ch < {c}; ch++) {{
        for (oy = 0; oy < {ho_}; oy++) {{
            for (ox = 0; ox < {wo}; ox++) {{
                const int32_t o = (ch * {ho_} + oy) * {wo} + ox;
                {start}
{window(16, f"j = (ch * {hi_} + iy) * {wi} + ix;", *update.split(chr(10)))}
{store}
            }}
        }}
    }}{fired_end}
}}"""
        adaptive = f", adaptive to {tuple(op.output_size)}" if op.output_size else ""
        self.funcs.append(f"/* {_quote(op.name)}: {op.kind} pooling {tuple(op.kernel_size)}"
                          f"{adaptive} */\n{body}")
        return out_range, out_t

    def neuron(self, i: int, op: NeuronOp, shape, in_range, in_t, out_t_fixed, fused=False,
               out_list=False):
        """Write neuron layer ``i`` (``fused``: its synaptic layer calls it per neuron);
        ``out_list``: its spikes go out as an index list (:meth:`_spike_store`)."""
        n = _numel(shape)
        program = neuron_program(op)
        # currents beyond the saturating range charge the membrane to its bound all the same:
        # clamped to it, every register's bound (and so its C type) shrinks
        x_lo, x_hi = program.saturating_range(in_range)
        if program.c_type((x_lo, x_hi)) == program.c_type(in_range):
            x_lo, x_hi = in_range       # no narrower type: no clamp to pay for
        regs, (v_lo, v_hi) = program.intervals((x_lo, x_hi))
        big = max(max(abs(lo), abs(hi)) for lo, hi in regs.values())
        shift = max(program.shifts() + [0])
        if big >= (1 << _LIMIT_BITS) or shift >= _LIMIT_BITS:
            raise ExportError(f"layer {op.name!r}: the charge is bounded only by {big} (grid shift "
                              f"{op.grid_shift}, leak shift {op.leak_shift}), which reaches "
                              f"2^{_LIMIT_BITS}: the C code would overflow int64")
        reg_t = program.c_type((x_lo, x_hi))
        if any(ins.code == "rhe" for ins in program.instrs):
            self.rhe_types.add(reg_t)
        v_t, v_size = _ctype(v_lo, v_hi, signed=True)
        self.state_members.append((v_size, f"{v_t} v{i}[{n}];"))
        self.state_bytes += v_size * n
        out_t = out_t_fixed or "uint8_t"
        def step(membrane, index, current):
            if (x_lo, x_hi) != tuple(in_range):
                current = (f"({current} < {_lit(x_lo)} ? {_lit(x_lo)} : ({current} > {_lit(x_hi)}"
                           f" ? {_lit(x_hi)} : {current}))")
            return ([f"const {reg_t} v = ({reg_t}){membrane}[{index}];",
                     f"const {reg_t} xin = ({reg_t}){current};"]
                    + program.c_lines(self.name, reg_t)
                    + [f"{membrane}[{index}] = ({v_t})v_next;"])
        about = (f"{_quote(op.name)}: {op.kind.upper()}, {op.v_bits}-bit membrane [{op.v_min}, "
                 f"{op.v_max}], threshold {op.threshold}, {op.reset_mode} reset, leak: "
                 f"{op.leak_text()}.")
        if i in self.fire:
            self._fire_function(i, v_t, step("membrane", "k", "acc"), about)
        else:
            body = "\n".join("    " + ln for ln in step(f"s->v{i}", "j", "current")
                              + ["return spike;"])
            proto = f"static int {self.name}_n{i}({self.name}_state *s, int32_t j, int64_t current)"
            self.protos.append(proto + ";")
            self.funcs.append(
                f"/* {about}\n * One neuron j with input current xin: update the membrane, return "
                f"the spike. */\n{proto}\n{{\n{body}\n}}")
        if not fused:
            store = self._spike_store(out_list, out_t, f"{self.name}_n{i}(s, o, (int64_t)in[o])")
            fired_decl, fired_end = self._spike_list_ends(out_list, out_t)
            self.funcs.append(
                f"static void {self.name}_op{i}({self.name}_state *s, const {in_t} *in, {out_t} *out)\n"
                f"{{\n    int32_t o;{fired_decl}\n    for (o = 0; o < {n}; o++) {{\n"
                + "".join(f"        {ln}\n" for ln in store) + f"    }}{fired_end}\n}}")
        self.reset_lines.append(f"for (j = 0; j < {n}; j++) {{\n        s->v{i}[j] = ({v_t}){_lit(op.v_init)};\n    }}")
        return (0, 1), out_t

    # -- joins and elementwise, layout and reduction operations ---------------------------------
    def join(self, i: int, op: JoinOp, shape, in_ranges, in_ts, out_t_fixed):
        n = _numel(shape)
        out_range = join_range(op, in_ranges)
        if op.kind == "add":
            wide = join_bound(op, in_ranges)
            if wide >= (1 << _LIMIT_BITS):
                raise ExportError(f"layer {op.name!r}: the add join is bounded only by {wide} "
                                  f"(shifts {list(op.shifts)}), which reaches 2^{_LIMIT_BITS}: the "
                                  f"C code would overflow int64")
            acc_t = "int32_t" if wide < (1 << 31) else "int64_t"
            value = " + ".join(f"({acc_t})in{k}[j]" + (f" * {_lit(1 << s)}" if s else "")
                               for k, s in enumerate(op.shifts))
        else:
            for r in in_ranges:
                if r[0] < 0 or r[1] > 1:
                    raise ExportError(f"layer {op.name!r}: the {op.kind} join reads values in "
                                      f"[{r[0]}, {r[1]}], not spikes (0/1)")
            value = ("(int32_t)in0[j] * (int32_t)in1[j]" if op.kind == "and" else
                     "(int32_t)in0[j] * (1 - (int32_t)in1[j])")
        out_t = out_t_fixed or _ctype(*out_range)[0]
        self._elementwise(i, op, f"{op.kind} join, shifts {list(op.shifts)}", n,
                          [f"const {t} *in{k}" for k, t in enumerate(in_ts)], out_t, f"({value})")
        return out_range, out_t

    def gather(self, i: int, op: GatherOp, n: int, in_range, in_t, out_t_fixed):
        """``out[j] = in[index[j]]`` (a layout operation with a table; a reshape is no call)."""
        table = self.const_array(f"g{i}", op.index)
        out_t = out_t_fixed or in_t
        self._elementwise(i, op, f"gather to {list(op.shape)}", n, [f"const {in_t} *in"], out_t,
                          f"in[{table}[j]]")
        return in_range, out_t

    def scale(self, i: int, op: ScaleOp, n: int, in_range, in_t, out_t_fixed):
        """``out[j] = in[j] * 2^k`` (``k > 0``; a ``k <= 0`` is no call)."""
        out_range = scale_range(op, in_range)
        out_t = out_t_fixed or _ctype(*out_range)[0]
        self._elementwise(i, op, f"times 2^{op.exponent}", n, [f"const {in_t} *in"], out_t,
                          f"((int64_t)in[j] * {_lit(1 << op.exponent)})")
        return out_range, out_t

    def _elementwise(self, i: int, op, about: str, n: int, params: Sequence[str], out_t: str,
                     value: str) -> None:
        """Write operation ``i`` as one loop, ``out[j] = (out_t)value`` for ``j < n``; ``value``
        is a C expression of ``j`` and the inputs ``params``."""
        self.funcs.append(
            f"/* {_quote(op.name)}: {about} */\n"
            f"static void {self.name}_op{i}({', '.join(params)}, {out_t} *out)\n"
            f"{{\n    int32_t j;\n    for (j = 0; j < {n}; j++) {{\n"
            f"        out[j] = ({out_t}){value};\n    }}\n}}")

    @staticmethod
    def _strides(shape) -> List[int]:
        out, acc = [], 1
        for size in reversed(list(shape)):
            out.append(acc)
            acc *= int(size)
        return out[::-1]

    @staticmethod
    def _loops(sizes, names, body: Sequence[str], indent: int = 4) -> List[str]:
        """Nested ``for`` loops over ``sizes`` with counters ``names`` around ``body``."""
        lines = []
        for depth, (size, v) in enumerate(zip(sizes, names)):
            lines.append(" " * (indent + 4 * depth) + f"for ({v} = 0; {v} < {size}; {v}++) {{")
        inner = " " * (indent + 4 * len(sizes))
        lines += [inner + b for b in body]
        for depth in reversed(range(len(sizes))):
            lines.append(" " * (indent + 4 * depth) + "}")
        return lines

    def reduce(self, i: int, op: ReduceOp, in_shape, out_shape, in_range, in_t, out_t_fixed):
        """The sum over ``op.dims``: every input position adds into its output position (every
        partial sum lies in the output's range, so the output's type holds it)."""
        out_range = reduce_range(op, in_range)
        out_t = out_t_fixed or _ctype(*out_range)[0]
        kept = [d for d in range(len(in_shape)) if d not in op.dims]
        out_strides = self._strides([in_shape[d] for d in kept])
        names = [f"i{d}" for d in range(len(in_shape))]
        src = " + ".join(f"{v} * {st}" for v, st in zip(names, self._strides(in_shape))) or "0"
        dst = " + ".join(f"i{d} * {st}" for d, st in zip(kept, out_strides)) or "0"
        n_out = _numel(out_shape)
        lines = [f"static void {self.name}_op{i}(const {in_t} *in, {out_t} *out)", "{",
                 f"    int32_t j, {', '.join(names)};",
                 f"    for (j = 0; j < {n_out}; j++) {{", "        out[j] = 0;", "    }"]
        lines += self._loops(in_shape, names, [
            f"out[{dst}] = ({out_t})(out[{dst}] + ({out_t})in[{src}]);"])
        lines.append("}")
        self.funcs.append(f"/* {_quote(op.name)}: sum over dims {list(op.dims)} */\n"
                          + "\n".join(lines))
        return out_range, out_t

    def matmul(self, i: int, op: MatMulOp, shapes, out_shape, in_ranges, in_ts, out_t_fixed):
        """``out[..., m, l] = sum_k a[..., m, k] b[..., k, l]``, leading dimensions broadcast."""
        out_range = matmul_range(op, *in_ranges)
        out_t = out_t_fixed or _ctype(*out_range)[0]
        batch = list(out_shape[:-2])
        m, l_, k = out_shape[-2], out_shape[-1], op.inner
        names = [f"b{d}" for d in range(len(batch))]

        def offset(shape):
            """The offset of operand ``shape``'s matrix for the batch counters (broadcast)."""
            lead = list(shape[:-2])
            lead = [1] * (len(batch) - len(lead)) + lead
            strides = self._strides(lead + list(shape[-2:]))[:len(batch)]
            terms = [f"{v} * {st}" for v, size, st in zip(names, lead, strides) if size != 1]
            return " + ".join(terms) or "0"

        a_off, b_off = offset(shapes[0]), offset(shapes[1])
        o_off = " + ".join(f"{v} * {st}" for v, st in
                           zip(names, self._strides(batch + [m, l_])[:len(batch)])) or "0"
        body = [f"const int32_t ao = {a_off}, bo = {b_off}, oo = {o_off};",
                f"for (r = 0; r < {m}; r++) {{",
                f"    for (c = 0; c < {l_}; c++) {{",
                "        int64_t acc = 0;",
                f"        for (q = 0; q < {k}; q++) {{",
                f"            acc += (int64_t)a[ao + r * {k} + q] * (int64_t)b[bo + q * {l_} + c];",
                "        }",
                f"        out[oo + r * {l_} + c] = ({out_t})acc;",
                "    }", "}"]
        decl = ", ".join(names + ["r", "c", "q"])
        lines = [f"static void {self.name}_op{i}(const {in_ts[0]} *a, const {in_ts[1]} *b, "
                 f"{out_t} *out)", "{", f"    int32_t {decl};"]
        lines += self._loops(batch, names, body)
        lines.append("}")
        self.funcs.append(f"/* {_quote(op.name)}: matmul over {k} */\n" + "\n".join(lines))
        return out_range, out_t

    # -- whole network --------------------------------------------------------------------------
    def _schedule(self):
        """The C calls in order: ``(steps, source, out_src, last_read, readers)``. A step is ``(i, j)``:
        operation ``i``, or synapse ``i`` fused with neuron ``j`` (its current goes straight into
        the neurons when nothing else reads it). ``source[k]`` is the operation whose buffer holds
        value ``k`` (a flatten is its input's buffer in C order); ``last_read[k]``: the last step
        that reads buffer ``k``; ``readers[k]``: the operations that read it."""
        desc = self.desc
        source = {NETWORK_INPUT: NETWORK_INPUT}
        for i, op in enumerate(desc.ops):
            source[i] = source[desc.op_inputs(i)[0]] if _aliases(op) else i
        compute = [i for i, op in enumerate(desc.ops) if not _aliases(op)]
        out_src = source[len(desc.ops) - 1] if desc.ops else NETWORK_INPUT
        readers: dict = {}
        for i in compute:
            for k in desc.op_inputs(i):
                readers.setdefault(source[k], set()).add(i)
        steps = []
        pos = 0
        while pos < len(compute):
            i = compute[pos]
            nxt = compute[pos + 1] if pos + 1 < len(compute) else None
            if (nxt is not None and isinstance(desc.ops[i], SynapseOp)
                    and isinstance(desc.ops[nxt], NeuronOp) and readers.get(i) == {nxt}
                    and i != out_src):
                steps.append((i, nxt))      # current straight into the neurons, no buffer
                pos += 2
            else:
                steps.append((i, i))
                pos += 1
        last_read = {}
        for pos, (i, j) in enumerate(steps):
            for k in desc.op_inputs(j):
                last_read[source[k]] = pos
            if j != i:
                for k in desc.op_inputs(i):
                    last_read[source[k]] = pos
        return steps, source, out_src, last_read, readers

    def build(self):
        desc = self.desc
        self.reset_lines: List[str] = []
        if desc.input_max >= (1 << 31):
            raise ExportError(f"input_max={desc.input_max} does not fit the int32_t input of the C "
                              f"model")
        steps, source, out_src, last_read, readers = self._schedule()
        # spikes (of a neuron layer, or a max pool of spikes) that only event-driven synaptic
        # layers read travel as index lists
        listable = {j for _, j in steps
                    if self.synapses == "events" and isinstance(desc.ops[j], (NeuronOp, PoolOp))
                    and j != out_src and readers.get(j)
                    and all(isinstance(desc.ops[r], SynapseOp) for r in readers[j])}
        lists = set()
        # per buffer (operation index, or the input): range, C type and C expression
        ranges = {NETWORK_INPUT: (-int(desc.input_max), int(desc.input_max))}
        types = {NETWORK_INPUT: "int32_t"}
        exprs = {NETWORK_INPUT: "input"}
        # buffers between operations: slots (unions) reused once every reader has run
        # per slot: (ctype, n, bytes, op index, bytes of the dense form's buffer)
        slots: List[List[Tuple[str, int, int, int, int]]] = []
        slot_busy: List[int] = []                            # per slot: last step reading it
        calls = []
        out_size = _numel(self.shapes[-1][1]) if self.shapes else _numel(self.input_shape)
        for pos, (i, j) in enumerate(steps):
            op = desc.ops[i]
            in_shape, out_shape = self.shapes[i]
            srcs = [source[k] for k in desc.op_inputs(i)]
            in_range, in_t = ranges[srcs[0]], types[srcs[0]]
            in_list = srcs[0] in lists
            out_list = j in listable and (isinstance(desc.ops[j], NeuronOp) or (
                op.kind == "max" and in_range[0] >= 0 and in_range[1] <= 1))
            if out_list:
                lists.add(j)
            n_out = _numel(self.shapes[j][1])
            # an index list holds its count and up to every neuron's index
            fixed = ("int64_t" if j == out_src else
                     _ctype(0, n_out)[0] if out_list else None)
            if j != i:
                n_fixed = fixed or "uint8_t"
                cur_range, _ = self.synapse(i, op, in_shape, out_shape, in_range, in_t, n_fixed,
                                            fuse_with=j, in_list=in_list, out_list=out_list)
                rng, t = self.neuron(j, desc.ops[j], self.shapes[j][0], cur_range, "int64_t",
                                     n_fixed, fused=True)
                out_shape = self.shapes[j][1]
            elif isinstance(op, SynapseOp):
                rng, t = self.synapse(i, op, in_shape, out_shape, in_range, in_t, fixed,
                                      in_list=in_list)
            elif isinstance(op, PoolOp):
                rng, t = self.pool(i, op, in_shape, out_shape, in_range, in_t, fixed,
                                   out_list=out_list)
            elif isinstance(op, JoinOp):
                rng, t = self.join(i, op, out_shape, [ranges[k] for k in srcs],
                                   [types[k] for k in srcs], fixed)
            elif isinstance(op, GatherOp):
                rng, t = self.gather(i, op, _numel(out_shape), in_range, in_t, fixed)
            elif isinstance(op, ScaleOp):
                rng, t = self.scale(i, op, _numel(out_shape), in_range, in_t, fixed)
            elif isinstance(op, ReduceOp):
                rng, t = self.reduce(i, op, in_shape, out_shape, in_range, in_t, fixed)
            elif isinstance(op, MatMulOp):
                operand_shapes = [self.shapes[k][1] if k != NETWORK_INPUT else self.input_shape
                                  for k in desc.op_inputs(i)]
                rng, t = self.matmul(i, op, operand_shapes, out_shape,
                                     [ranges[k] for k in srcs], [types[k] for k in srcs], fixed)
            else:
                rng, t = self.neuron(i, op, in_shape, in_range, in_t, fixed, out_list=out_list)
            if j == out_src:
                dst = "output"
            else:
                n = _numel(out_shape)
                free = [u for u, busy in enumerate(slot_busy) if busy < pos]
                if free:
                    u = free[0]
                else:
                    u = len(slots)
                    slots.append([])
                    slot_busy.append(pos)
                dense_bytes = n if out_list else _TYPES_BYTES[t] * n   # uint8_t spikes
                n += 1 if out_list else 0
                slots[u].append((t, n, _TYPES_BYTES[t] * n, j, dense_bytes))
                slot_busy[u] = last_read.get(j, pos)
                dst = f"s->buf{u}.a{j}"
            ranges[j], types[j], exprs[j] = rng, t, dst
            args = ", ".join([exprs[k] for k in srcs] + [dst])
            if isinstance(op, NeuronOp) or j != i or (isinstance(op, SynapseOp)
                                                      and self.synapses == "events"):
                args = f"s, {args}"
            calls.append(f"{self.name}_op{i}({args});")
        if out_src == NETWORK_INPUT:
            calls.append(f"for (j = 0; j < {out_size}; j++) {{\n        output[j] = (int64_t)input[j];\n    }}")
        members = []
        ram = 0
        self.list_bytes = 0
        for u, bufs in enumerate(slots):
            size = max(b for _, _, b, _, _ in bufs)
            size8 = -(-size // 8) * 8
            decl = "".join(f"        {t} a{i}[{n}];\n" for t, n, _, i, _ in bufs)
            members.append(f"    union {{\n{decl}        uint8_t bytes[{size8}];\n    }} buf{u};")
            ram += size8
            self.list_bytes += size8 - -(-max(d for _, _, _, _, d in bufs) // 8) * 8
        self.scratch_bytes = 0
        if self.scratch:
            size8 = -(-max(b for _, b, _ in self.scratch) // 8) * 8
            self.scratch_bytes = size8
            decl = "".join(f"        struct {{ {m} }} s{i};\n" for m, _, i in self.scratch)
            members.append(f"    union {{\n{decl}        uint8_t bytes[{size8}];\n    }} scratch;")
            ram += size8
        for _, decl in sorted(self.state_members, key=lambda e: -e[0]):
            members.append("    " + decl)
        ram += self.state_bytes
        pad = (-ram) % 8
        if pad or not members:
            pad = pad or 8
            members.append(f"    uint8_t pad_[{pad}];")
            ram += pad
        self.ram = ram
        self.out_size = out_size
        self.members = members
        self.calls = calls
        return self

    def header(self, pair_id: str = "") -> str:
        N, n, desc = self.NAME, self.name, self.desc
        guard = f"{N}_H_INCLUDED"
        if desc.output_kind == "current":
            out_desc = f"integer currents in units of 2^-{desc.output_frac_bits}"
        elif desc.output_divisor != 1:   # a sum pool (VotingLayer, average pool) at the end
            out_desc = (f"integer sums of spikes;\n * the float model's output is them divided by "
                        f"{desc.output_divisor:g}")
        else:
            out_desc = "spikes 0/1"
        if desc.output_time_mean:
            out_desc += (";\n * the model averages its output over the time steps: sum the "
                         "outputs of the T steps and divide by T")
        approximate = ("" if desc.exact else
                       f"\n * APPROXIMATE: the fixed-point leak of "
                       f"{', '.join(desc.approximate_layers)} (to_integer(..., leak_bits=...))"
                       f"\n * approximates the float model's tau: agreement with it is not "
                       f"guaranteed.")
        return f"""/* {n}.h: integer spiking network generated by snnquant.export.to_c.
 * Bit-exact with snnquant.export.IntegerSNN. C99, integer only, no dynamic memory.{approximate}
 * Input: {_numel(self.input_shape)} int32 values per step, per-sample shape {list(self.input_shape)}
 * (C order), each |x| <= {N}_INPUT_MAX. Output: {self.out_size} values per step, {out_desc}.
 */
#ifndef {guard}
#define {guard}

#include <stdint.h>

#define {N}_INPUT_SIZE {_numel(self.input_shape)}
#define {N}_OUTPUT_SIZE {self.out_size}
#define {N}_INPUT_MAX {_lit(desc.input_max)}
/* bytes of constant data (weights, biases, rescale factors; code not included) */
#define {N}_ROM_BYTES {self.rom}
/* bytes of one {n}_state: membranes of one sample and the buffers between layers */
#define {N}_RAM_BYTES {self.ram}
/* this header's pair: {n}.c refuses to compile beside a header written by another to_c call */
#define {N}_PAIR_ID 0x{pair_id}ULL

/* The state of one sample: membranes of every neuron layer and buffers between layers. */
typedef struct {{
{chr(10).join(self.members)}
}} {n}_state;

/* Membranes to their initial values (as IntegerSNN starts every call). */
void {n}_reset({n}_state *s);

/* One time step: input[{N}_INPUT_SIZE] in, output[{N}_OUTPUT_SIZE] out. */
void {n}_step({n}_state *s, const int32_t *input, int64_t *output);

#endif /* {guard} */
"""

    def source(self, pair_id: str = "") -> str:
        n, N = self.name, self.NAME
        rhe = ""
        for c_type in sorted(self.rhe_types):
            rhe += c_rhe_helper(n, c_type) + "\n"
        reset_body = "\n    ".join(self.reset_lines)
        step_body = "\n    ".join(self.calls)
        needs_j_reset = bool(self.reset_lines)
        needs_j_step = any(c.startswith("for (j") for c in self.calls)
        return f"""/* {n}.c: integer spiking network generated by snnquant.export.to_c (see {n}.h). */
#include <stdint.h>
#include <string.h>

#include "{n}.h"

#if !defined({N}_PAIR_ID) || {N}_PAIR_ID != 0x{pair_id}ULL
#error "{n}.h was not written together with {n}.c (to_c writes both; copy both)"
#endif

/* sizeof({n}_state) must equal {N}_RAM_BYTES */
typedef char {n}_ram_bytes_check[(sizeof({n}_state) == {N}_RAM_BYTES) ? 1 : -1];

{chr(10).join(self.consts)}

{chr(10).join(self.protos)}

{rhe}{(chr(10) + chr(10)).join(self.funcs)}

void {n}_reset({n}_state *s)
{{
{"    int32_t j;" + chr(10) if needs_j_reset else ""}    memset(s, 0, sizeof(*s));
    {reset_body}
}}

void {n}_step({n}_state *s, const int32_t *input, int64_t *output)
{{
{"    int32_t j;" + chr(10) if needs_j_step else ""}    {"(void)s;" + chr(10) + "    " if not self.state_members else ""}{step_body}
}}
"""


# ------------------------------------------------------------------------------------------------
# public API

#: Above this many bytes of C (header and source together, ``16 * 2**20``), :func:`to_c` says
#: how much it is about to write with a :class:`LargeCSourceWarning` (a weight takes 2 to 5
#: bytes of text: a 16.8 M-weight layer is about 55 MB).
C_SIZE_NOTICE_BYTES = 16 << 20


class LargeCSourceWarning(UserWarning):
    """:func:`to_c` is about to write more than :data:`C_SIZE_NOTICE_BYTES` bytes of C; the
    message says how many, and where."""


#: The forms of a synaptic layer's accumulation that :func:`to_c` writes.
SYNAPSE_FORMS = ("events", "dense")


def _prepare(desc, name, input_shape, synapses="events") -> _Gen:
    if not isinstance(desc, IntegerNetwork):
        raise TypeError(f"desc must be an IntegerNetwork (from to_integer or load_integer), got "
                        f"{type(desc).__name__}")
    if desc.chip is not None:
        raise ExportError(f"desc is a {desc.chip} network (the chip's own layer operations); "
                          f"the C runtime runs snnquant's operations only: run it on "
                          f"IntegerSNN, and deploy it with snnquant.targets.to_{desc.chip}")
    name = check_c_name(name)
    if not isinstance(synapses, str) or synapses not in SYNAPSE_FORMS:
        raise ValueError(f"synapses must be one of {SYNAPSE_FORMS}, got {synapses!r}")
    if input_shape is None:
        input_shape = _infer_input_shape(desc)
    input_shape = check_input_shape(input_shape)
    return _Gen(desc, name, input_shape, synapses).build()


def c_memory(desc: IntegerNetwork, input_shape: Optional[Sequence[int]] = None, *,
             synapses: str = "events") -> CMemory:
    r"""ROM and RAM of the C model :func:`to_c` writes for ``desc``, without writing it.

    Args:
        desc: the integer network.
        input_shape: per-sample input shape, as for :func:`to_c`.
        synapses: ``'events'`` or ``'dense'``, as for :func:`to_c`.

    Returns:
        A :class:`CMemory` (``rom_bytes`` = ``<NAME>_ROM_BYTES``, ``ram_bytes`` =
        ``<NAME>_RAM_BYTES``).
    """
    g = _prepare(desc, "snn", input_shape, synapses)
    return CMemory(rom_bytes=g.rom, ram_bytes=g.ram, state_bytes=g.state_bytes,
                   input_size=_numel(g.input_shape), output_size=g.out_size,
                   scratch_bytes=g.scratch_bytes, list_bytes=g.list_bytes)


def _pair_texts(gen: "_Gen") -> Tuple[bytes, bytes]:
    """The header and source as ASCII bytes, tied by a pair id: the first 64 bits of the SHA-256
    of both texts (written without the id)."""
    digest = hashlib.sha256((gen.header("0") + "\0" + gen.source("0")).encode("utf-8"))
    pair_id = digest.hexdigest()[:16]
    texts = []
    for text in (gen.header(pair_id), gen.source(pair_id)):
        try:
            texts.append(text.encode("ascii"))
        except UnicodeEncodeError as exc:  # a bug of this module: every name is escaped
            raise ExportError(f"the generated C is not ASCII ({exc}); nothing was written") from None
    return texts[0], texts[1]


def to_c(desc: IntegerNetwork, out_dir: Union[str, os.PathLike], name: str = "snn", *,
         input_shape: Optional[Sequence[int]] = None, synapses: str = "events"
         ) -> Tuple[Path, Path]:
    r"""Write a bit-exact, portable C99 model of an integer network: ``<name>.h`` and ``<name>.c``.

    The C model computes, one time step of one sample per call, exactly what
    :class:`~snnquant.export.IntegerSNN` computes (same accumulator values, ties-to-even
    rounding, saturation, leak shift or fixed-point multiplier, hard or soft reset, pooling,
    flatten order): every layer of :class:`~snnquant.export.NeuronOp` and
    :class:`~snnquant.export.SynapseOp`, including ``exact=False`` layers from
    ``to_integer(..., leak_bits=F)``, and graphs: branches, residual joins
    (:class:`~snnquant.export.JoinOp`: ``'add'`` with the operands aligned by shifts,
    ``'and'``/``'iand'`` of spikes), adaptive average pools and SpikingJelly's ``VotingLayer``. The code uses integers only, no ``malloc``, includes only
    ``<stdint.h>`` and ``<string.h>``, and compiles warning-free with
    ``gcc -std=c99 -Wall -Wextra -Werror -pedantic``. Weights are ``static const`` arrays of the
    narrowest integer type that holds them.

    API of ``<name>.h`` (``NAME`` is ``name`` in capitals):

    * ``NAME_INPUT_SIZE``, ``NAME_OUTPUT_SIZE``: elements of one time step of one sample, in C
      order of the per-sample shape (``input_shape``, e.g. ``[C, H, W]``, and the output shape
      :class:`~snnquant.export.IntegerSNN` returns); ``NAME_INPUT_MAX``: the largest input
      magnitude (``desc.input_max``; larger inputs are not checked by the C code);
    * ``NAME_ROM_BYTES``: bytes of constant data (weights, biases, rescale factors; not code);
      ``NAME_RAM_BYTES``: ``sizeof(name_state)``;
    * ``name_state``: one sample's membranes (and the buffers between layers; its layout is
      private to the generated code);
    * ``void name_reset(name_state *s)``: membranes to their initial values;
    * ``void name_step(name_state *s, const int32_t *input, int64_t *output)``: one step;
      ``output`` receives what :class:`~snnquant.export.IntegerSNN` returns: the spikes (0/1);
      for a network ending in a synaptic layer, the integer currents in units of :math:`2^{-F}`
      (``desc.output_frac_bits``); for a network ending in a sum pool of spikes (a
      ``VotingLayer`` over :math:`D` neurons, an average pool), the integer sums, which
      divided by :attr:`~snnquant.export.IntegerNetwork.output_divisor` (:math:`D` for a
      ``VotingLayer``) give the float model's output (``<name>.h`` says which).

    Graphs. Every operation reads the buffers of the operations named in its ``inputs`` (a
    flatten is its input's buffer, read in C order); a synaptic layer whose current only one
    neuron layer reads feeds it directly, without a buffer. A buffer lives from the operation
    that writes it to the last one that reads it; buffers whose lives do not overlap share
    memory (one union per slot in ``name_state``; a sequence needs two), and every slot is
    counted in ``NAME_RAM_BYTES``, which the source checks equals ``sizeof(name_state)``.

    Synapses. With ``synapses='events'`` (the default) a synaptic layer adds only what its
    nonzero inputs contribute: a weight column per nonzero input of a linear layer, a kernel
    stamp per nonzero input of a convolution (weights stored input-major; the columns a stamp
    reaches are clipped at the borders once per event), into sums kept in the state
    (``scratch``, counted in ``NAME_RAM_BYTES``); its time then grows with the synaptic
    operations (nonzero inputs times fan-out), not with the layer size. The spikes of a neuron
    layer (or of a max pool of spikes) that only synaptic layers read travel as an index list: the count of neurons that
    fired, then their indices (C order of the layer's output, in no particular order), written
    without a branch per neuron, so the next layer reads its events without scanning for them;
    other inputs (the network's, a sum pool's) are scanned a 64-bit word at a time, skipping
    words of zeros. Each layer leaves its sums at 0 for the next step (``name_reset`` zeroes the
    state), and a neuron layer fed by an event-driven layer keeps its membranes in the order of
    the sums (position, then channel), so its update is one branch-free loop over contiguous
    memory. The RAM this takes beyond ``synapses='dense'`` is
    :attr:`CMemory.scratch_bytes` (sums, and one byte per neuron of the layers they feed) plus
    :attr:`CMemory.list_bytes` (an index list of :math:`n + 1` entries where the dense form has
    :math:`n` bytes of spikes). Every synaptic input of an exported network is spikes or event
    counts, so this is the faster form for SNN activity; ``synapses='dense'`` writes the dense
    loops (every input times every weight), which need no scratch, have constant trip counts
    (for HLS tools) and win only for inputs that are mostly nonzero. Both compute the same
    integers.

    Layer names. The source model's module names (any text: ``'capa_oculta_ñ'``, spaces,
    quotes, ``'fc/*hidden*/'``) never become C identifiers: every generated symbol is
    ``<name>_<kind><position>`` (``snn_w0``, ``snn_n1``), unique by construction, and a module name
    appears only inside comments, escaped to ASCII with every ``/*``, ``*/`` and ``?`` defused.

    Writing. Both texts are generated (and checked to be ASCII) before anything is written (a
    :class:`LargeCSourceWarning` says their size when it exceeds :data:`C_SIZE_NOTICE_BYTES`;
    weights are formatted a block at a time, so the texts are what memory holds); then
    both files are written to temporaries in ``out_dir``, ``fsync``-ed, and renamed over the old
    pair (:func:`snnquant._io.atomic_write_files`), with the umask's permissions like every other
    output. An error while writing (a full disk) leaves the earlier pair as it was and names the
    path. Between the two renames a reader could see a new header beside an old source, so the
    pair also carries its own check: ``<NAME>_PAIR_ID`` in the header (the first 64 bits of a
    SHA-256 of both texts) must equal the value written into the source, which otherwise stops
    compiling with an ``#error`` naming both files.

    Args:
        desc: the integer network (:func:`~snnquant.export.to_integer` or
            :func:`~snnquant.export.load_integer`).
        out_dir: folder for the two files (created if missing).
        name: C identifier prefixing every public symbol and naming the files (checked before
            anything is written by :func:`check_c_name`; not a standard header's name).
        input_shape: per-sample input shape without time and batch. Needed when the network does
            not start with a linear layer (the description holds no image size); by default
            ``(in_features,)`` of the first linear layer.
        synapses: ``'events'`` (default) or ``'dense'``: the form of every synaptic layer's
            accumulation (see above).

    Returns:
        ``(header_path, source_path)``.

    Raises:
        TypeError: ``desc`` is not an :class:`~snnquant.export.IntegerNetwork`.
        ValueError: a bad ``name`` (see :func:`check_c_name`: not a C identifier, a keyword, or
            a standard C or POSIX header name such as ``stdint``), ``input_shape`` or
            ``synapses``.
        OSError: a file could not be written (the message names it; the earlier pair is kept).
        ExportError: a bound of an intermediate value reaches :math:`2^{62}` (the C code would
            overflow; a join's too), an ``'and'``/``'iand'`` join of values that are not spikes,
            or a layer form the C runtime does not implement.
    """
    gen = _prepare(desc, name, input_shape, synapses)
    texts = _pair_texts(gen)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir={str(out_dir)!r} exists and is not a folder")
    header, source = out / f"{gen.name}.h", out / f"{gen.name}.c"
    size = sum(map(len, texts))
    if size > C_SIZE_NOTICE_BYTES:
        warnings.warn(f"to_c is writing {size / 2 ** 20:.1f} MiB of C ({header.name} and "
                      f"{source.name}, {gen.rom} bytes of constant data) into {out}",
                      LargeCSourceWarning, stacklevel=2)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_files(zip((header, source), texts))
    return header, source
