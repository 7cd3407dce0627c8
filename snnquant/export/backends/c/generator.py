"""The C generator: :class:`CGenerator` schedules the buffers of one network and writes its header
and source, one emitter per operation kind (:mod:`.synapse`, :mod:`.neuron`, :mod:`.pool`,
:mod:`.elementwise`)."""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch

from ...ir.network import (ExportError, IntegerNetwork, JoinOp, NETWORK_INPUT, NeuronOp, PoolOp,
                           SynapseOp)
from ...ir.transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp
from ...ir.integer_ops import pack_int
from ...ir.program import c_rhe_helper
from ..simulator import op_shapes
from .common import CONST_BLOCK, TYPES_BYTES, aliases, c_int_type, lit, numel
from .synapse import SynapseEmitter
from .neuron import NeuronEmitter
from .pool import PoolEmitter
from .elementwise import ElementwiseEmitter
from .weights import (Weights, c_unpack_helper, packed_weight_bits, weights_per_word,
                      word_order)

__all__ = ["CGenerator"]


# ------------------------------------------------------------------------------------------------
# code generation

class CGenerator(SynapseEmitter, NeuronEmitter, PoolEmitter, ElementwiseEmitter):
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
        self.unpack_bits: set = set()   # the widths of packed weights an unpack helper reads
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
            blocks = (flat[i:i + CONST_BLOCK].tolist() for i in range(0, flat.numel(),
                                                                      CONST_BLOCK))
            count = flat.numel()
        else:
            values = [int(v) for v in values]
            lo, hi, blocks, count = min(values), max(values), (values,), len(values)
        ctype, size = c_int_type(lo, hi, signed)
        ident = f"{self.name}_{label}"
        rows = [",\n".join("    " + ", ".join(lit(v) for v in block[i:i + 16])
                           for i in range(0, len(block), 16)) for block in blocks]
        self.consts.append(f"static const {ctype} {ident}[{count}] = {{\n" + ",\n".join(rows)
                           + "\n};")
        self.rom += size * count
        self.const_types[ident] = ctype
        return ident

    def weights(self, i: int, op: SynapseOp, values: torch.Tensor, run=None) -> Weights:
        """Declare layer ``i``'s weights ``values`` (``op.weight`` in the order the C text reads
        them), packed where :func:`.weights.packed_weight_bits` says so; return how to read them.
        ``run``: the C text reads them only in runs of ``run`` weights (:meth:`Weights.loop`);
        packed runs that fill whole words are then stored in :func:`.weights.word_order`."""
        bits = packed_weight_bits(op)
        if bits is None:
            array = self.const_array(f"w{i}", values)
            return Weights(array, self.const_types[array])
        words = run is not None and run % weights_per_word(bits) == 0
        array = self.const_array(f"w{i}", pack_int(word_order(values, bits) if words else values,
                                                   bits))
        return Weights(array, self.const_types[array], f"{self.name}_unpack{bits}", bits,
                       self.unpack_bits, words=words)

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
            source[i] = source[desc.op_inputs(i)[0]] if aliases(op) else i
        compute = [i for i, op in enumerate(desc.ops) if not aliases(op)]
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
        out_size = numel(self.shapes[-1][1]) if self.shapes else numel(self.input_shape)
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
            n_out = numel(self.shapes[j][1])
            # an index list holds its count and up to every neuron's index
            fixed = ("int64_t" if j == out_src else
                     c_int_type(0, n_out)[0] if out_list else None)
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
                rng, t = self.gather(i, op, numel(out_shape), in_range, in_t, fixed)
            elif isinstance(op, ScaleOp):
                rng, t = self.scale(i, op, numel(out_shape), in_range, in_t, fixed)
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
                n = numel(out_shape)
                free = [u for u, busy in enumerate(slot_busy) if busy < pos]
                if free:
                    u = free[0]
                else:
                    u = len(slots)
                    slots.append([])
                    slot_busy.append(pos)
                dense_bytes = n if out_list else TYPES_BYTES[t] * n   # uint8_t spikes
                n += 1 if out_list else 0
                slots[u].append((t, n, TYPES_BYTES[t] * n, j, dense_bytes))
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
 * Input: {numel(self.input_shape)} int32 values per step, per-sample shape {list(self.input_shape)}
 * (C order), each |x| <= {N}_INPUT_MAX. Output: {self.out_size} values per step, {out_desc}.
 */
#ifndef {guard}
#define {guard}

#include <stdint.h>

#define {N}_INPUT_SIZE {numel(self.input_shape)}
#define {N}_OUTPUT_SIZE {self.out_size}
#define {N}_INPUT_MAX {lit(desc.input_max)}
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
        for bits in sorted(self.unpack_bits):
            rhe += c_unpack_helper(n, bits) + "\n"
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
