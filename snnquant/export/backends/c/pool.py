"""The C generator's pooling layers."""

from __future__ import annotations

from ...ir.network import PoolOp
from ...ir.program import adaptive_windows, pool_range
from .common import c_int_type, quote

__all__ = ["PoolEmitter"]


class PoolEmitter:
    """The C of pooling layers (:class:`~snnquant.export.PoolOp`)."""

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
            # of spikes (0/1), the maximum is the OR
            update = ("best |= in[j];" if tuple(in_range) == (0, 1)
                      else "best = in[j] > best ? in[j] : best;")
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
        out_t = out_t_fixed or c_int_type(*out_range)[0]

        inside = (not op.output_size and ph == 0 and pw == 0 and (ho_ - 1) * sh + (kh - 1) * dh < hi_
                  and (wo - 1) * sw + (kw - 1) * dw < wi and kh * kw <= 16)

        def window(indent, *inner):
            if inside:   # every window lies inside the input: its elements in line, no test
                lines = [f"const int32_t j0 = (ch * {hi_} + oy * {sh}) * {wi} + ox * {sw};"]
                for ky in range(kh):
                    for kx in range(kw):
                        lines += [f"j = j0 + {ky * dh * wi + kx * dw};"] + [
                            ln for ln in inner[1:]]
                return "\n".join(" " * indent + ln for ln in lines)
            return self.window_loops(indent, kh, kw, y0, x0, dh, dw, hi_, wi, *inner)
        store = "\n".join(" " * 16 + ln for ln in self.spike_store(out_list, out_t, result))
        fired_decl, fired_end = self.spike_list_ends(out_list, out_t)
        body = f"""static void {self.name}_op{i}(const {in_t} *in, {out_t} *out)
{{
    int32_t ch, oy, ox, {"" if inside else "ky, kx, "}j;{fired_decl}
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
        self.funcs.append(f"/* {quote(op.name)}: {op.kind} pooling {tuple(op.kernel_size)}"
                          f"{adaptive} */\n{body}")
        return out_range, out_t
