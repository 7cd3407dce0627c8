"""The C generator's synaptic layers."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from ....functional.int_limits import INT64_HEADROOM_BITS
from ...ir.network import ExportError, SynapseOp
from ...ir.program import SynapseRescale, synapse_bounds
from .common import TYPES_BYTES, c_int_type, quote

__all__ = ["SynapseEmitter"]


class SynapseEmitter:
    """The C of synaptic layers (:class:`~snnquant.export.SynapseOp`), dense or event-driven, and
    the event loops and sums they share with the layers they feed."""

    def scratch_arrays(self, i: int, sum_t: str, n: int, fired: bool) -> str:
        """The sums (``n`` ``sum_t``) of event-driven layer ``i`` and, where it feeds a neuron
        layer (``fired``), that layer's spikes (``n`` bytes), as a struct in the state's scratch
        union (one layer uses it at a time); returns the C expression that names the struct."""
        size = TYPES_BYTES[sum_t]
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
            if max(bound.current[c], bound.accumulator[c],
                   abs(factor[c])) >= (1 << INT64_HEADROOM_BITS):
                raise ExportError(f"layer {op.name!r}: the current of output channel {c} is bounded "
                                  f"only by {bound.current[c]} (sum|w| = {bound.l1[c]}, max|x| = "
                                  f"{max(map(abs, in_range))}, rescale {factor[c]}), which reaches "
                                  f"2^{INT64_HEADROOM_BITS}: the C code would overflow int64")
        wide = max([bound.widest] + [abs(f) for f in factor])
        acc_t = "int32_t" if wide < (1 << 31) else "int64_t"
        out_range = bound.out_range
        out_t = out_t_fixed or c_int_type(*out_range)[0]
        rescale = rescale_def.c_lines("acc", acc_t, self.const_array, i)
        events = self.synapses == "events"
        if fuse_with is None:
            rescale.append(f"out[o] = ({out_t})acc;")
        elif not events:   # event-driven: the neuron layer's _fire_function charges it
            rescale += self.spike_store(out_list, out_t,
                                        f"{self.name}_n{fuse_with}(s, o, (int64_t)acc)")

        def rescale_code(indent):
            return "\n".join(" " * indent + line for line in rescale)

        state = "" if fuse_with is None and not events else f"{self.name}_state *s, "
        sig = f"static void {self.name}_op{i}({state}const {in_t} *in, {out_t} *out)"
        # the sums of the event-driven form: the accumulator's bound alone (no rescale yet)
        sum_t = c_int_type(-max(bound.accumulator + (1,)), max(bound.accumulator + (1,)), signed=True)[0]
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
                wts = self.weights(i, op, w.t(), run=c_out)
                sums = self.scratch_arrays(i, sum_t, c_out, fuse_with is not None)
                column = [wts.ref("wj", f"j * {c_out}")] + wts.loop(
                    "wj", c_out, lambda wv: f"sum[oc] = ({sum_t})(sum[oc] + ({acc_t}){wv}{times_x});")
                body = f"""{{
    {sum_t} *sum = {sums}.sum;
    int32_t oc{wts.loop_declarations(c_out)};
{self._events(4, in_list, in_t, n_in, column)}
{self._event_outputs(sums, sum_t, 1, c_out, acc_t, rescale, fuse_with, out_list, out_t)}
}}"""
            else:
                wts = self.weights(i, op, w)
                body = f"""{{
    int32_t oc, j;
    for (oc = 0; oc < {c_out}; oc++) {{
        const int32_t o = oc;
        {acc_t} acc = 0;
        for (j = 0; j < {n_in}; j++) {{
            acc += ({acc_t}){wts.at(f"oc * {n_in} + j")} * ({acc_t})in[j];
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
                wts = self.weights(i, op, wt, run=cog)
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
                    "    " + wts.ref("wrow"),
                    f"    if ({miss_y}) {{",
                    "        continue;",
                    "    }",
                    f"    row = sum + ({oy_expr}) * {wo * co};",
                    "    " + wts.set("wrow", f"(c * {kh} + ky) * {kw * cog}"),
                    "    for (r = 0; r < reach; r++) {",
                    f"        {sum_t} *dst = row + sum_at[r];",
                    "        " + wts.ref("wk", "w_at[r]", base="wrow")]
                stamp += ["        " + ln for ln in wts.loop(
                    "wk", cog, lambda wv: f"dst[oc] = ({sum_t})(dst[oc] + ({acc_t}){wv}{times_x});")]
                stamp += ["    }", "}"]
                body = f"""{{
    {sum_t} *sum = {sums}.sum;
    int32_t ky, kx, r, oc{wts.loop_declarations(cog)};
    int32_t sum_at[{kw}] = {{0}}, w_at[{kw}] = {{0}};
{self._events(4, in_list, in_t, ci * hi_ * wi, stamp)}
{self._event_outputs(sums, sum_t, ho_ * wo, co, acc_t, rescale, fuse_with, out_list, out_t)}
}}"""
            else:
                wts = self.weights(i, op, w)

                def window(indent, *inner):
                    return self.window_loops(indent, kh, kw, f"oy * {sh} - {ph}", f"ox * {sw} - {pw}",
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
{window(20, f"acc += ({acc_t}){wts.at(f'((oc * {cig} + ic) * {kh} + ky) * {kw} + kx')}",
        f"    * ({acc_t})in[(c * {hi_} + iy) * {wi} + ix];")}
                }}
                {{
{rescale_code(20)}
                }}
            }}
        }}
    }}
}}"""
        fused = "" if fuse_with is None else f", currents straight into neuron layer {quote(self.desc.ops[fuse_with].name)}"
        self.funcs.append(f"/* {quote(op.name)}: {op.kind}, {op.weight_bits}-bit weights, "
                          f"{acc_t} accumulator{fused} */\n{sig}\n{body}")
        return out_range, out_t

    @staticmethod
    def window_loops(indent: int, kh, kw, y0, x0, dh, dw, hi_, wi, *inner: str) -> str:
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
            lines = ["int32_t p;"] + self.sum_loop(positions, co, acc_t, rescale, [
                f"const int32_t o = oc * {positions} + p;"])
        else:
            # the neuron layer writes <name>_fire<j> (sums, spike bytes, its membranes)
            self.fire[fuse_with] = (sum_t, positions, co, acc_t, list(rescale))
            lines = [f"uint8_t *spiked = {sums}.fired;",
                     f"{self.name}_fire{fuse_with}(sum, spiked, s->v{fuse_with});"]
            n = positions * co
            o_expr = "j" if positions == 1 else f"(j % {co}) * {positions} + j / {co}"
            emit = (["const int32_t o = " + o_expr + ";"]
                    + self.spike_store(out_list, out_t, "x"))
            fired_decl, fired_end = self.spike_list_ends(out_list, out_t)
            lines += [ln.strip() for ln in fired_decl.split("\n") if ln.strip()]
            if not out_list:
                lines.append(f"memset(out, 0, sizeof({out_t}) * {n});")
            lines += self._events(0, False, "uint8_t", n, emit, src="spiked", clear=True,
                                  every=True).split("\n")
            lines += [ln.strip() for ln in fired_end.split("\n") if ln.strip()]
        return "\n".join("    " + ln for ln in lines)

    @staticmethod
    def sum_loop(positions: int, co: int, acc_t: str, rescale: Sequence[str],
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
            per_word = max(1, 8 // TYPES_BYTES[in_t])
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
