"""The C generator's neuron layers."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from ....functional.int_limits import INT64_HEADROOM_BITS
from ...ir.network import ExportError, NeuronOp
from ...ir.program import neuron_program
from .common import c_int_type, lit, numel, quote

__all__ = ["NeuronEmitter"]


class NeuronEmitter:
    """The C of neuron layers (:class:`~snnquant.export.NeuronOp`): the step printed from
    :func:`~snnquant.export.ir.program.neuron_program`, and spike stores."""

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
                         + self.sum_loop(positions, co, acc_t, body))
        self.funcs.append(f"/* {about}\n * Every neuron, with the current of its sum (the "
                          f"sums' order: position, then channel), to a spike byte. */\n"
                          f"{proto}\n{{\n{text}\n}}")

    @staticmethod
    def spike_store(out_list: bool, out_t: str, spike: str) -> List[str]:
        """C statements that emit the spike ``spike`` (a C expression, 0 or 1) of neuron ``o``:
        ``out[o] = spike`` into a buffer, or into an index list (``out[0]`` the number of
        neurons that fired, ``out[1..]`` their indices, in the order the neurons are visited):
        the index is written always and kept by advancing the count, without a branch (at most
        ``n`` indices after the count: in bounds)."""
        if out_list:
            return [f"out[1 + fired] = ({out_t})o;", f"fired += {spike};"]
        return [f"out[o] = ({out_t}){spike};"]

    @staticmethod
    def spike_list_ends(out_list: bool, out_t: str) -> Tuple[str, str]:
        """The declaration of the count of an index list and the statement that stores it (both
        empty text for a buffer), for :meth:`_spike_store`."""
        if not out_list:
            return "", ""
        return "\n    int32_t fired = 0;", f"\n    out[0] = ({out_t})fired;"

    def neuron(self, i: int, op: NeuronOp, shape, in_range, in_t, out_t_fixed, fused=False,
               out_list=False):
        """Write neuron layer ``i`` (``fused``: its synaptic layer calls it per neuron);
        ``out_list``: its spikes go out as an index list (:meth:`_spike_store`)."""
        n = numel(shape)
        program = neuron_program(op)
        # currents beyond the saturating range charge the membrane to its bound all the same:
        # clamped to it, every register's bound (and so its C type) shrinks
        x_lo, x_hi = program.saturating_range(in_range)
        if program.c_type((x_lo, x_hi)) == program.c_type(in_range):
            x_lo, x_hi = in_range       # no narrower type: no clamp to pay for
        regs, (v_lo, v_hi) = program.intervals((x_lo, x_hi))
        big = max(max(abs(lo), abs(hi)) for lo, hi in regs.values())
        shift = max(program.shifts() + [0])
        if big >= (1 << INT64_HEADROOM_BITS) or shift >= INT64_HEADROOM_BITS:
            raise ExportError(f"layer {op.name!r}: the charge is bounded only by {big} (grid shift "
                              f"{op.grid_shift}, leak shift {op.leak_shift}), which reaches "
                              f"2^{INT64_HEADROOM_BITS}: the C code would overflow int64")
        reg_t = program.c_type((x_lo, x_hi))
        if any(ins.code == "rhe" for ins in program.instrs):
            self.rhe_types.add(reg_t)
        v_t, v_size = c_int_type(v_lo, v_hi, signed=True)
        self.state_members.append((v_size, f"{v_t} v{i}[{n}];"))
        self.state_bytes += v_size * n
        out_t = out_t_fixed or "uint8_t"
        def step(membrane, index, current):
            if (x_lo, x_hi) != tuple(in_range):
                current = (f"({current} < {lit(x_lo)} ? {lit(x_lo)} : ({current} > {lit(x_hi)}"
                           f" ? {lit(x_hi)} : {current}))")
            return ([f"const {reg_t} v = ({reg_t}){membrane}[{index}];",
                     f"const {reg_t} xin = ({reg_t}){current};"]
                    + program.c_lines(self.name, reg_t)
                    + [f"{membrane}[{index}] = ({v_t})v_next;"])
        about = (f"{quote(op.name)}: {op.kind.upper()}, {op.v_bits}-bit membrane [{op.v_min}, "
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
            store = self.spike_store(out_list, out_t, f"{self.name}_n{i}(s, o, (int64_t)in[o])")
            fired_decl, fired_end = self.spike_list_ends(out_list, out_t)
            self.funcs.append(
                f"static void {self.name}_op{i}({self.name}_state *s, const {in_t} *in, {out_t} *out)\n"
                f"{{\n    int32_t o;{fired_decl}\n    for (o = 0; o < {n}; o++) {{\n"
                + "".join(f"        {ln}\n" for ln in store) + f"    }}{fired_end}\n}}")
        self.reset_lines.append(f"for (j = 0; j < {n}; j++) {{\n        s->v{i}[j] = ({v_t}){lit(op.v_init)};\n    }}")
        return (0, 1), out_t
