"""The torch front end's functions of a captured graph (merge, reshape, arithmetic): layout
maps, joins, scales, sums and matrix products, lowered by :class:`FunctionLowering`, the part
of :class:`~snnquant.export.frontend.graph.GraphBuilder` that reads ``call_function`` nodes."""

from __future__ import annotations

import dataclasses
import math
import operator

import torch

from ...capture import connect_functions
from ...functional.int_limits import INT64_HEADROOM_BITS
from ...functional.int_limits import pow2_exponent
from ..ir.network import JoinOp, NETWORK_INPUT
from ..ir.transformer_ops import MatMulOp, ReduceOp, ScaleOp
from .values import (ADD_FUNCTIONS, CONNECT_KINDS, FLATTEN_FUNCTIONS, FlattenCall, LAYOUT_FUNCTIONS,
                     MATMUL_FUNCTIONS, MUL_FUNCTIONS, SPIKES, TRUEDIV_FUNCTIONS, Value, View,
                     arg_text, flat_args)
from .pooling import export_flatten
from .deploy_checks import mean_refusal

__all__ = ["FunctionLowering"]


class FunctionLowering:
    """The ``call_function`` nodes of a captured graph, lowered to operations (a mixin of
    :class:`~snnquant.export.frontend.graph.GraphBuilder`, whose state and helpers it uses)."""

    def layout(self, name, module, node, at, lead):
        """A layout operation (reshape, transpose, ...) applied to the index map of its input,
        found by running it on the example shapes: a :class:`View` (or a tuple of them)."""
        data = node.args[0] if node.args else None
        view = self._view(name, module, node, at, data)
        if self.values[view.src].time_mean:
            self._fail_at(name, module, node, "a layout operation after a mean over time steps "
                                              "is not supported; only synaptic layers may "
                                              "follow a mean over time")
        full = data.meta.get("shape") if isinstance(data, torch.fx.Node) else None
        if full is None or len(full) < lead:
            self._fail_at(name, module, node, "its input's shape is not known: pass "
                                              "to_integer(..., example_input=x)")
        outer = tuple(full[:lead])
        # ids: position in the source sample; who: which sample (time step, batch)
        ids = view.index.expand(outer + tuple(view.index.shape))
        who = torch.arange(math.prod(outer), dtype=torch.int64).reshape(
            outer + (1,) * view.index.dim()).expand(ids.shape)

        def run(t):
            args = [t] + [a for a in node.args[1:]]
            if any(isinstance(a, torch.fx.Node) for a in flat_args(args[1:], node.kwargs)):
                self._fail_at(name, module, node, "a layout operation whose arguments are "
                                                  "computed tensors is not supported")
            if node.op == "call_method":
                return getattr(t, node.target)(*args[1:], **node.kwargs)
            return node.target(*args, **node.kwargs)

        try:
            out_ids, out_who = run(ids), run(who)
        except (RuntimeError, TypeError, ValueError, IndexError) as err:
            self._fail_at(name, module, node, f"it could not be replayed on the example shapes "
                                              f"({err})")
        singles = isinstance(out_ids, torch.Tensor)
        items = [out_ids] if singles else list(out_ids)
        whos = [out_who] if singles else list(out_who)
        views = []
        for t, w in zip(items, whos):
            if tuple(t.shape[:lead]) != outer or not torch.equal(
                    w, torch.arange(math.prod(outer)).reshape(outer + (1,) * (t.dim() - lead))
                    .expand(w.shape)):
                self._fail_at(name, module, node, f"it moves values across the time or batch "
                                                  f"dimensions (shape {tuple(full)} to "
                                                  f"{tuple(t.shape)}); the integer export "
                                                  f"computes every sample and step alike")
            first = t[(0,) * lead]
            if not torch.equal(t, first.expand(t.shape)):  # pragma: no cover - follows from who
                self._fail_at(name, module, node, "it treats samples differently")
            views.append(View(view.src, first.contiguous()))
        return views[0] if singles else tuple(views)

    def function(self, name, module, node, at, lead):
        """The value (index, pending layout, or tuple of layouts) of a call_function or
        call_method node."""
        label = self._node_label(name, node)
        target = node.target
        what = getattr(target, "__name__", str(target))
        first = node.args[0] if node.args else None
        if target is operator.getitem and isinstance(at.get(first), tuple):
            index = node.args[1]
            if not isinstance(index, int) or not -len(at[first]) <= index < len(at[first]):
                self._fail_at(name, module, node, f"it picks item {index!r} of "
                                                  f"{len(at[first])}")
            return at[first][index]
        if target in FLATTEN_FUNCTIONS and isinstance(at.get(first), int) \
                and len(node.args) + len(node.kwargs) <= 3:
            src = self._arg(name, module, node, at, 0)
            args = [a for a in node.args[1:]]
            start = node.kwargs.get("start_dim", args[0] if args else 0)
            end = node.kwargs.get("end_dim", args[1] if len(args) > 1 else -1)
            op = export_flatten(label, FlattenCall(start, end), lead,
                                lambda reason: self._fail_at(name, module, node, reason))
            return self._emit(op, self.values[src], (src,))
        if target in LAYOUT_FUNCTIONS or target is operator.getitem:
            return self.layout(name, module, node, at, lead)
        if target in ADD_FUNCTIONS and len(node.args) == 2 and not node.kwargs:
            srcs = [self._arg(name, module, node, at, i) for i in (0, 1)]
            shapes = [self.shapes.get(j) for j in srcs]
            if None not in shapes and shapes[0] != shapes[1]:
                self._fail_at(name, module, node, f"it adds values of the shapes {shapes} "
                                                  f"(a broadcast); the integer export adds values "
                                                  f"of one shape")
            return self.join(label, (name, module, node), "add", srcs)
        if target in MUL_FUNCTIONS and len(node.args) == 2 and not node.kwargs:
            constants = [a for a in node.args if isinstance(a, (int, float))]
            if constants:
                return self.scale(name, module, node, at, constants[0])
            operands = [at.get(a) for a in node.args]
            if all(isinstance(v, int) for v in operands) and (
                    any(v not in self.shapes for v in operands)
                    or self.shapes[operands[0]] == self.shapes[operands[1]]):
                srcs = operands     # same shapes (or unknown ones: torch.fx symbolic tracing)
            else:
                srcs = self._broadcast(name, module, node, at, lead)
            return self.join(label, (name, module, node), "and", srcs)
        if target in TRUEDIV_FUNCTIONS and len(node.args) == 2 and not node.kwargs \
                and isinstance(node.args[1], (int, float)) and node.args[1] != 0:
            return self.scale(name, module, node, at, 1 / node.args[1],
                              f"divides by {node.args[1]!r}")
        if what in ("sum", "mean"):
            return self.reduce(name, module, node, at, lead, what)
        if target in MATMUL_FUNCTIONS and len(node.args) == 2 and not node.kwargs:
            return self.matmul(name, module, node, at)
        if what == "sew_function" and target in connect_functions():
            cnf = node.args[2] if len(node.args) > 2 else node.kwargs.get("cnf")
            if cnf not in CONNECT_KINDS:
                self._fail_at(name, module, node, f"sew_function with cnf={cnf!r} is not "
                                                  f"supported (only {sorted(CONNECT_KINDS)})")
            return self.join(label, (name, module, node), CONNECT_KINDS[cnf],
                             [self._arg(name, module, node, at, i) for i in (0, 1)])
        args = ", ".join(arg_text(a) for a in node.args)
        self._fail_at(name, module, node, f"{what}({args}) is not supported by the integer "
                                          f"export (supported: modules, + of two values, * of "
                                          f"spikes or by a power of two, sum and mean, matmul, "
                                          f"layout operations such as reshape, transpose, "
                                          f"permute, chunk, and SpikingJelly's sew_function)")

    def _broadcast(self, name, module, node, at, lead):
        """The two operands of an elementwise operation, broadcast to one shape (a gather)."""
        views = [self._view(name, module, node, at, node.args[i]) for i in (0, 1)]
        shapes = [tuple(v.index.shape) for v in views]
        if len(shapes[0]) != len(shapes[1]):
            self._fail_at(name, module, node, f"its operands have samples of the shapes {shapes}, "
                                              f"of different ranks: PyTorch would align them "
                                              f"with the time and batch dimensions")
        try:
            shape = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError as err:
            self._fail_at(name, module, node, f"its operands' shapes {shapes} do not broadcast "
                                              f"({err})")
        out = []
        for i, v in enumerate(views):
            index = v.index.reshape((1,) * (len(shape) - v.index.dim()) + tuple(v.index.shape))
            out.append(self._materialize(View(v.src, index.expand(shape).contiguous()),
                                         self._node_label(name, node.args[i])))
        return out

    def scale(self, name, module, node, at, factor, what=None):
        """``x * c`` for a constant ``c = 2^k``: a :class:`ScaleOp` (``c = 1``: nothing)."""
        k = pow2_exponent(abs(float(factor))) if factor else None
        if k is None or factor < 0:
            what = what or f"multiplies by {factor!r}"
            self._fail_at(name, module, node, f"it {what}, which is not a "
                                              f"positive power of two, so the product is not an "
                                              f"exact integer on a binary grid; use a power of "
                                              f"two (e.g. 0.125 for 1/sqrt(64)) or fold the "
                                              f"factor into the layer before it")
        src = self._arg(name, module, node, at, 0 if not isinstance(node.args[0], (int, float))
                        else 1)
        if k == 0:
            return src
        v = self.values[src]
        if v.time_mean:
            self._fail_at(name, module, node, "it scales a mean over time")
        frac = v.frac - min(k, 0)
        bound = (v.x_bound[0], v.x_bound[1] << max(k, 0))
        value = Value(v.domain, frac, bound, v.cur_log2 + max(k, 0), v.binary and k == 0)
        out = self._emit(ScaleOp(name=self._node_label(name, node), exponent=int(k)), value,
                         (src,))
        if src in self.shapes:
            self.shapes[out] = self.shapes[src]
        return out

    def reduce(self, name, module, node, at, lead, what):
        """``x.sum(dims)`` / ``x.mean(dims)`` over one sample's dimensions (a
        :class:`ReduceOp`), or a mean over the time steps at the end of the network."""
        src = self._arg(name, module, node, at, 0)
        full = node.args[0].meta.get("shape") if isinstance(node.args[0], torch.fx.Node) else None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
        extra = set(node.kwargs) - {"dim", "keepdim"}
        if full is None or dim is None or extra:
            self._fail_at(name, module, node, f"{what} needs the dimensions it reduces (dim=...) "
                                              f"and the shapes of a capture from a run "
                                              f"(to_integer(..., example_input=x))"
                          if not extra else f"{what} with {sorted(extra)} is not supported")
        dims = sorted({d % len(full) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))})
        v = self.values[src]
        count = math.prod(full[d] for d in dims)
        if dims == [0] and self.multi and lead == 2 and what == "mean" and not keepdim:
            if v.time_mean:
                self._fail_at(name, module, node, "it averages over time twice")
            steps = self.time_steps = int(full[0])
            mag = v.magnitude(self.input_max) if src != NETWORK_INPUT else None
            if mag is None:
                self._fail_at(name, module, node, "it averages the network input (or a value "
                                                  "bounded only by it) over time; average the "
                                                  "output of a layer")
            if mag * steps > 1 << self.p:
                self._fail_at(name, module, node, f"the sum over {steps} time steps of values "
                                                  f"up to {mag} can reach {mag * steps}, more "
                                                  f"than 2^{self.p}: the {self.dtype} mean is "
                                                  f"not exact", "accumulator")
            # its own value (an identity: integers and grid unchanged, run per step), so that
            # other readers of the averaged tensor still read it per step
            value = dataclasses.replace(v, time_mean=True, binary=False)
            out = self._emit(ScaleOp(name=self._node_label(name, node), exponent=0), value,
                             (src,))
            if src in self.shapes:
                self.shapes[out] = self.shapes[src]
            return out
        if any(d < lead for d in dims):
            self._fail_at(name, module, node, f"it reduces the time or batch dimension "
                                              f"(dim={dim!r} of shape {tuple(full)}); only a mean "
                                              f"over time (dim=0) at the end of a multi-step "
                                              f"network is exported")
        if v.time_mean:
            self._fail_at(name, module, node, "it reduces a mean over time")
        added = 0
        if what == "mean":
            added = pow2_exponent(float(count))
            if added is None:
                self._fail_at(name, module, node, mean_refusal(
                    count, [full[d] for d in dims]), "mean")
        op = ReduceOp(name=self._node_label(name, node), dims=tuple(d - lead for d in dims),
                      keepdim=keepdim, count=int(count), frac_bits_added=int(added))
        mag = v.magnitude(self.input_max)
        if mag is None:
            self._fail_at(name, module, node, "it sums values whose bound depends on the input: "
                                              "pass to_integer(..., input_max=...)")
        total = mag * count
        if total > 1 << self.p:
            self._fail_at(name, module, node, f"the sum of {count} values of magnitude up to "
                                              f"{mag} can reach {total}, more than 2^{self.p}: "
                                              f"the {self.dtype} sum is not exact", "accumulator")
        value = Value(v.domain, v.frac + added, ("abs", total), math.log2(max(total, 1)))
        return self._emit(op, value, (src,))

    def matmul(self, name, module, node, at):
        """``a @ b`` of two integer tensors (counts): a :class:`MatMulOp`."""
        srcs = [self._arg(name, module, node, at, i) for i in (0, 1)]
        vals = [self.values[j] for j in srcs]
        shapes = [self.shapes.get(j) for j in srcs]
        if any(sh is None or len(sh) < 2 for sh in shapes):
            self._fail_at(name, module, node, f"a matrix product needs operands of known shapes "
                                              f"with two dimensions or more, got {shapes} "
                                              f"(pass to_integer(..., example_input=x))")
        inner = int(shapes[0][-1])
        if len(shapes[0]) != len(shapes[1]):
            self._fail_at(name, module, node, f"its operands have samples of the shapes {shapes}, "
                                              f"of different ranks: PyTorch would align them "
                                              f"with the time and batch dimensions")
        if shapes[1][-2] != inner:
            self._fail_at(name, module, node, f"the shapes {shapes} do not multiply")
        mags = [v.magnitude(self.input_max) for v in vals]
        if None in mags or any(v.time_mean for v in vals):
            self._fail_at(name, module, node, "a matrix product of the network input or of a "
                                              "mean over time is not supported")
        total = inner * mags[0] * mags[1]
        if total > 1 << self.p:
            self._fail_at(name, module, node, f"the product sums {inner} terms of magnitude up "
                                              f"to {mags[0] * mags[1]}: {total} exceeds "
                                              f"2^{self.p}, so the {self.dtype} product of the "
                                              f"model is not exact", "accumulator")
        frac = vals[0].frac + vals[1].frac
        op = MatMulOp(name=self._node_label(name, node), inner=inner, out_frac_bits=frac,
                      inputs=tuple(srcs))
        return self._emit(op, Value("event", frac, ("abs", total), math.log2(max(total, 1))),
                          tuple(srcs))

    def join(self, label, at_node, kind, srcs) -> int:
        """A JoinOp named ``label`` of ``srcs``; ``at_node`` = ``(graph owner name, owner,
        node)`` says where a refusal points."""
        def refuse(reason, check="other"):
            self._fail_at(*at_node, reason, check)

        vals = [self.values[i] for i in srcs]
        where = [("the network input" if i == NETWORK_INPUT else repr(self.ops[i].name))
                 for i in srcs]
        if any(v.time_mean for v in vals):
            refuse("it joins a mean over time steps; the integer export runs every operation "
                   "per step, so only synaptic layers may follow a mean over time")
        if kind != "add":
            bad = [w for w, v in zip(where, vals) if not v.binary]
            if bad:
                refuse(f"a {kind.upper()} join needs two spike tensors (0 or 1), but the output "
                       f"of {', '.join(bad)} is not binary spikes; use cnf='ADD' or join the "
                       f"outputs of neuron layers")
            return self._emit(JoinOp(name=label, kind=kind, shifts=(0, 0), out_frac_bits=0,
                                     inputs=tuple(srcs)), SPIKES, tuple(srcs))
        frac = max(v.frac for v in vals)
        shifts = tuple(frac - v.frac for v in vals)
        mags = []
        for w, v in zip(where, vals):
            if v.domain == "current":
                mags.append(2.0 ** v.cur_log2)
            elif v.x_bound[0] == "input":
                if self.input_max is None:
                    refuse(f"it adds {w}, whose largest value depends on the input: pass "
                           f"to_integer(..., input_max=...)")
                mags.append(float(v.x_bound[1] * self.input_max))
            else:
                mags.append(float(v.x_bound[1]))
        total = sum(m * 2.0 ** s for m, s in zip(mags, shifts))
        if total > 2.0 ** self.p:
            refuse(f"the sum of {' and '.join(where)} on the common grid 2^-{frac} (the "
                   f"operands have {[v.frac for v in vals]} fractional bits) can reach "
                   f"{total:.4g}, more than 2^{self.p}: the {self.dtype} addition of the "
                   f"fake-quantized model is not exact. Use fewer weight/membrane bits on the "
                   f"branches, or power-of-two steps that differ less between them, or "
                   f"reference_dtype=torch.float64", "accumulator")
        if math.log2(max(total, 1.0)) + 2 > INT64_HEADROOM_BITS:
            refuse(f"the integer sum needs {math.log2(total):.0f} bits, more than int64 holds")
        domain = "current" if any(v.domain == "current" for v in vals) else "event"
        value = Value(domain, frac, ("abs", int(math.ceil(total))), math.log2(max(total, 1.0)))
        return self._emit(JoinOp(name=label, kind="add", shifts=shifts, out_frac_bits=frac,
                                 inputs=tuple(srcs)), value, tuple(srcs))
