"""The C generator's joins, gathers, scales, sums and matrix products."""

from __future__ import annotations

from typing import List, Sequence

from ....functional.int_limits import INT64_HEADROOM_BITS
from ...ir.network import ExportError, JoinOp
from ...ir.transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp
from ...ir.program import join_bound, join_range, matmul_range, reduce_range, scale_range
from .common import c_int_type, lit, numel, quote

__all__ = ["ElementwiseEmitter"]


class ElementwiseEmitter:
    """The C of joins, gathers, scales, sums over dimensions and matrix products
    (:class:`~snnquant.export.JoinOp`, :class:`~snnquant.export.GatherOp`,
    :class:`~snnquant.export.ScaleOp`, :class:`~snnquant.export.ReduceOp`,
    :class:`~snnquant.export.MatMulOp`)."""

    # -- joins and elementwise, layout and reduction operations ---------------------------------
    def join(self, i: int, op: JoinOp, shape, in_ranges, in_ts, out_t_fixed):
        n = numel(shape)
        out_range = join_range(op, in_ranges)
        if op.kind == "add":
            wide = join_bound(op, in_ranges)
            if wide >= (1 << INT64_HEADROOM_BITS):
                raise ExportError(f"layer {op.name!r}: the add join is bounded only by {wide} "
                                  f"(shifts {list(op.shifts)}), which reaches "
                                  f"2^{INT64_HEADROOM_BITS}: the C code would overflow int64")
            acc_t = "int32_t" if wide < (1 << 31) else "int64_t"
            value = " + ".join(f"({acc_t})in{k}[j]" + (f" * {lit(1 << s)}" if s else "")
                               for k, s in enumerate(op.shifts))
        else:
            for r in in_ranges:
                if r[0] < 0 or r[1] > 1:
                    raise ExportError(f"layer {op.name!r}: the {op.kind} join reads values in "
                                      f"[{r[0]}, {r[1]}], not spikes (0/1)")
            value = ("(int32_t)in0[j] * (int32_t)in1[j]" if op.kind == "and" else
                     "(int32_t)in0[j] * (1 - (int32_t)in1[j])")
        out_t = out_t_fixed or c_int_type(*out_range)[0]
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
        out_t = out_t_fixed or c_int_type(*out_range)[0]
        self._elementwise(i, op, f"times 2^{op.exponent}", n, [f"const {in_t} *in"], out_t,
                          f"((int64_t)in[j] * {lit(1 << op.exponent)})")
        return out_range, out_t

    def _elementwise(self, i: int, op, about: str, n: int, params: Sequence[str], out_t: str,
                     value: str) -> None:
        """Write operation ``i`` as one loop, ``out[j] = (out_t)value`` for ``j < n``; ``value``
        is a C expression of ``j`` and the inputs ``params``."""
        self.funcs.append(
            f"/* {quote(op.name)}: {about} */\n"
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
        out_t = out_t_fixed or c_int_type(*out_range)[0]
        kept = [d for d in range(len(in_shape)) if d not in op.dims]
        out_strides = self._strides([in_shape[d] for d in kept])
        names = [f"i{d}" for d in range(len(in_shape))]
        src = " + ".join(f"{v} * {st}" for v, st in zip(names, self._strides(in_shape))) or "0"
        dst = " + ".join(f"i{d} * {st}" for d, st in zip(kept, out_strides)) or "0"
        n_out = numel(out_shape)
        lines = [f"static void {self.name}_op{i}(const {in_t} *in, {out_t} *out)", "{",
                 f"    int32_t j, {', '.join(names)};",
                 f"    for (j = 0; j < {n_out}; j++) {{", "        out[j] = 0;", "    }"]
        lines += self._loops(in_shape, names, [
            f"out[{dst}] = ({out_t})(out[{dst}] + ({out_t})in[{src}]);"])
        lines.append("}")
        self.funcs.append(f"/* {quote(op.name)}: sum over dims {list(op.dims)} */\n"
                          + "\n".join(lines))
        return out_range, out_t

    def matmul(self, i: int, op: MatMulOp, shapes, out_shape, in_ranges, in_ts, out_t_fixed):
        """``out[..., m, l] = sum_k a[..., m, k] b[..., k, l]``, leading dimensions broadcast."""
        out_range = matmul_range(op, *in_ranges)
        out_t = out_t_fixed or c_int_type(*out_range)[0]
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
        self.funcs.append(f"/* {quote(op.name)}: matmul over {k} */\n" + "\n".join(lines))
        return out_range, out_t
