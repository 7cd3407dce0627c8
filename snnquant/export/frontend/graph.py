"""The torch front end's graph walk: :class:`GraphBuilder` lowers a module tree (sequences in
order, any other container from its capture) to the operations of an
:class:`~snnquant.export.IntegerNetwork`."""

from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn as nn

from ...nn import registry
from ...utils import is_multi_step as _is_multi_step, model_walk as _model_walk
from ...capture import CaptureError, is_sequence, node_origin
from ...functional.int_limits import pow2_exponent
from ..ir.network import ExportError, NETWORK_INPUT
from ..ir.transformer_ops import GatherOp
from .common import fail_layer, sj_modules
from .deploy_checks import tagged, time_mean_refusal
from .values import (ADAPTIVE_TYPES, POOL_TYPES, SPIKES, Value, View, arg_text, module_lead,
                     spiking_part_hint)
from .synapses import export_synapse
from .neurons import export_neuron
from .pooling import export_adaptive_pool, export_flatten, export_pool, export_voting
from .functions import FunctionLowering

__all__ = ["GraphBuilder"]


class GraphBuilder(FunctionLowering):
    """Build the operations of an :class:`IntegerNetwork` from a module tree.

    Sequence containers are walked in order (:func:`model_walk`); any other module with children
    is read from the :class:`~snnquant.capture.Capture` (a run on an example input, or
    torch.fx), whose graph gives branches and joins. Every value the graph computes is an index
    into ``values``.
    """

    def __init__(self, work, dtype, p, input_max, leak_bits, input_shape, captured):
        self.work, self.dtype, self.p, self.captured = work, dtype, p, captured
        self.input_max, self.leak_bits, self.input_shape = input_max, leak_bits, input_shape
        self.multi = _is_multi_step(work)
        self.ops, self.notes = [], []
        self.values = {NETWORK_INPUT: Value("event", 0, ("input", 1))}
        self.allowed_input = None
        self.seen_synapse = False
        self.shapes = {}            # value index -> one sample's shape (a capture from a run)
        self.time_steps = None      # T of the example input, once a mean over time is seen
        self.called = {}
        self._pool_sizes = None
        _, sj_layer, _ = sj_modules()
        self.identity_types = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
                               nn.Dropout3d, sj_layer.Dropout)

    def build(self) -> int:
        """Emit every operation; returns the index of the output value."""
        return self.module("", self.work, 1 if not self.multi else 2, NETWORK_INPUT)

    def _emit(self, op, value: Value, src: Tuple[int, ...]) -> int:
        index = len(self.ops)
        op.inputs = () if tuple(src) == (index - 1,) else tuple(src)
        self.ops.append(op)
        self.values[index] = value
        return index

    # ---- modules ----------------------------------------------------------------------------
    def module(self, name, module, lead, src) -> int:
        if is_sequence(module):
            for child_name, child, child_lead in _model_walk(module):
                src = self.module(f"{name}.{child_name}" if name else child_name, child,
                                  child_lead, src)
            return src
        if self._is_known(module):
            label = name or type(module).__name__
            self.called[label] = self.called.get(label, 0) + 1
            _, _, sj_neuron = sj_modules()
            weighted = (registry.layer_kind(module) is not None
                        or registry.neuron_kind(module) is not None
                        or isinstance(module, sj_neuron.BaseNode))
            if self.called[label] > 1 and weighted:
                fail_layer(label, module, f"it is called {self.called[label]} times; the integer "
                                     f"export needs one module per layer (its state and weights "
                                     f"belong to one place in the graph)")
            return self.leaf(label, module, lead, src)
        if next(module.children(), None) is None:
            self._unsupported(name or type(module).__name__, module, "")
        try:
            graph = self.captured.graph(name, module)
        except CaptureError as err:
            raise CaptureError(f"{err}{spiking_part_hint(name, module)}") from None
        return self.traced(name, module, graph, lead, src)

    def _is_known(self, module) -> bool:
        _, sj_layer, sj_neuron = sj_modules()
        return (registry.layer_kind(module) is not None or registry.neuron_kind(module) is not None
                or isinstance(module, (sj_neuron.BaseNode, nn.Flatten, sj_layer.VotingLayer,
                                       nn.modules.batchnorm._BatchNorm) + POOL_TYPES
                              + ADAPTIVE_TYPES + self.identity_types))

    def _unsupported(self, name, module, hint):
        fail_layer(name, module, "module type not supported by the integer export (supported: "
                            "quantized Linear/Conv1d/Conv2d, quantized IF/LIF/PLIF neurons, "
                            "MaxPool, AvgPool and AdaptiveAvgPool of spikes, Flatten, Identity, "
                            "Dropout, in nn.Sequential, SpikingJelly containers or modules "
                            "torch.fx traces, joined by +, and SpikingJelly's sew_function)"
                            + hint)

    def leaf(self, name, module, lead, src) -> int:
        v = self.values[src]
        _, sj_layer, sj_neuron = sj_modules()
        if registry.layer_kind(module) is not None:
            x_bound = v.x_bound if v.domain == "event" else ("abs", v.magnitude(None))
            if v.time_mean:
                # the model applies it to the mean over time, the export to every step: both
                # exact when the float sum over the finer grid of the mean is
                steps = self._time_steps(name, module)
                export_synapse(name, module, self.dtype, self.p, v.frac + steps,
                               ("abs", v.magnitude(self.input_max) << steps), self.input_max)
            op, frac, cur_log2, allowed = export_synapse(name, module, self.dtype, self.p,
                                                         v.frac, x_bound, self.input_max)
            if v.x_bound[0] == "input" and allowed is not None:
                self.allowed_input = (allowed if self.allowed_input is None
                                      else min(self.allowed_input, allowed))
            self.seen_synapse = True
            return self._emit(op, Value("current", frac, ("abs", 0), cur_log2,
                                        time_mean=v.time_mean), (src,))
        if v.time_mean:
            fail_layer(name, module, "it reads the mean over time steps that the model computes "
                                "before it; the integer export runs every layer per step, so "
                                "only synaptic layers may follow a mean over time")
        if registry.neuron_kind(module) is not None or isinstance(module, sj_neuron.BaseNode):
            if v.domain != "current" and v.x_bound[0] == "input":
                fail_layer(name, module, "a neuron layer reads the network input directly; put a "
                                    "synaptic layer before it")
            cur_log2 = v.cur_log2 if v.domain == "current" else math.log2(max(v.x_bound[1], 1))
            op = export_neuron(name, module, self.dtype, self.p, v.frac, cur_log2,
                               self.leak_bits)
            if not op.exact:
                self.notes.append(f"{name}: tau = {op.tau:.6g} approximated by the fixed-point "
                                  f"leak {op.leak_multiplier} / 2^{op.leak_shift} (tau_eff = "
                                  f"{op.effective_tau:.6g}); this layer is not exact")
            return self._emit(op, SPIKES, (src,))
        if isinstance(module, POOL_TYPES + ADAPTIVE_TYPES + (sj_layer.VotingLayer,)):
            if isinstance(module, sj_layer.VotingLayer):
                op, growth = export_voting(name, module, v.domain)
            elif isinstance(module, ADAPTIVE_TYPES):
                op, growth = export_adaptive_pool(name, module, v.domain, self._pool_input(name))
            else:
                op, growth = export_pool(name, module, v.domain)
            if op.kind == "sum":
                v = Value(v.domain, v.frac + op.frac_bits_added,
                          (v.x_bound[0], v.x_bound[1] * growth), v.cur_log2, False)
            return self._emit(op, v, (src,))
        if isinstance(module, nn.Flatten):
            return self._emit(export_flatten(name, module, lead), v, (src,))
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            from ..passes.fold import batchnorm_refusal
            fail_layer(name, module,
                       batchnorm_refusal(self.work, name, self.captured.example_input), "batchnorm")
        self.notes.append(f"{name} ({type(module).__name__}) is the identity in eval mode")
        return src

    def _time_steps(self, name, module) -> int:
        """``log2(T)`` of the example input's time steps (a mean over time divides by T)."""
        why = time_mean_refusal(self.time_steps or 0)
        if why is not None:
            fail_layer(name, module, why, "time_mean")
        return pow2_exponent(float(self.time_steps))

    def _pool_input(self, name) -> Tuple[int, ...]:
        """The spatial input size of the adaptive pool ``name`` (one run on zeros)."""
        if self.input_shape is None:
            module = self.work.get_submodule(name)
            fail_layer(name, module, "adaptive average pooling divides by an area that depends on the "
                                "input size, which the export does not know: pass "
                                "to_integer(model, input_shape=(C, H, W)) (one sample's shape)")
        if self._pool_sizes is None:
            from spikingjelly.activation_based import functional as sjf
            sizes = {}
            hooks = [m.register_forward_pre_hook(
                lambda mod, args, n=n: sizes.__setitem__(n, tuple(args[0].shape)))
                for n, m in self.work.named_modules() if isinstance(m, ADAPTIVE_TYPES)]
            lead = (1, 1) if self.multi else (1,)
            was = self.work.training
            try:
                sjf.reset_net(self.work)
                with torch.no_grad():
                    self.work.eval()(torch.zeros(lead + self.input_shape, dtype=self.dtype))
            except (RuntimeError, ValueError, IndexError) as err:
                raise ValueError(f"input_shape={self.input_shape} does not fit the model: "
                                 f"{err}") from None
            finally:
                for h in hooks:
                    h.remove()
                sjf.reset_net(self.work)
                self.work.train(was)
            self._pool_sizes = sizes
        return self._pool_sizes[name]

    # ---- traced graphs ----------------------------------------------------------------------
    def traced(self, name, module, graph, lead, src) -> int:
        at = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                if at:
                    fail_layer(name or type(module).__name__, module,
                               "its forward() takes more than one input")
                at[node] = src
                self._note_shape(src, node, lead)
            elif node.op == "output":
                out = node.args[0]
                if not isinstance(out, torch.fx.Node) or out not in at:
                    fail_layer(name or type(module).__name__, module,
                               "its forward() returns something other than one tensor")
                return self._arg(name, module, node, at, 0)
            elif node.op == "call_module":
                target = f"{name}.{node.target}" if name else node.target
                sub = self.work.get_submodule(target)
                at[node] = self.module(target, sub, module_lead(sub, self.multi, lead),
                                       self._arg(name, module, node, at, 0))
                self._note_shape(at[node], node, lead)
            elif node.op in ("call_function", "call_method"):
                at[node] = self.function(name, module, node, at, lead)
                if isinstance(at[node], int):
                    self._note_shape(at[node], node, lead)
            elif node.op == "get_attr":
                self._fail_at(name, module, node, f"its forward() reads the tensor "
                                                  f"{node.target!r} directly; only modules, +, "
                                                  f"flatten and sew_function are exported")
        raise ExportError(f"the traced graph of {name!r} has no output")  # pragma: no cover

    @staticmethod
    def _node_label(name, node) -> str:
        """The name of the operation ``node`` makes (a JoinOp's, a FlattenOp's)."""
        return f"{name}.{node.name}" if name else node.name

    def _fail_at(self, name, module, node, reason, check="other"):
        """Refuse ``node`` of the graph of ``module``, naming the innermost submodule it comes
        from (dotted name and class), the operation and its file and line; ``check``: the kind
        of refusal (one of :data:`~snnquant.export.frontend.deploy_checks.CHECKS`)."""
        inner, cls, where = node_origin(node, name, module)
        what = getattr(node.target, "__name__", str(node.target))
        raise tagged(ExportError(f"{'layer ' + repr(inner) if inner else 'the model'} ({cls}), "
                                 f"the operation {what}{' at ' + where if where else ''}: "
                                 f"{reason}"), check)

    def _arg(self, name, module, node, at, i) -> int:
        """The value index of ``node``'s argument ``i`` (a pending layout is materialised)."""
        arg = node.args[i] if i < len(node.args) else None
        if not isinstance(arg, torch.fx.Node) or arg not in at or isinstance(at[arg], tuple):
            self._fail_at(name, module, node, f"its argument {i} is not a tensor the export "
                                              f"computes ({arg_text(arg)})")
        value = at[arg]
        if isinstance(value, View):
            value = self._materialize(value, self._node_label(name, arg))
        return value

    def _note_shape(self, index, node, lead) -> None:
        """Remember one sample's shape of value ``index`` from the capture (a run only)."""
        shape = node.meta.get("shape")
        if isinstance(index, int) and shape is not None and len(shape) >= lead:
            self.shapes.setdefault(index, tuple(shape[lead:]))

    def _view(self, name, module, node, at, arg) -> "View":
        """The pending layout of the value ``arg`` (an identity map over its own value)."""
        value = at.get(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(value, View):
            return value
        if not isinstance(value, int):
            self._fail_at(name, module, node, f"it reads {arg_text(arg)}, not a tensor the "
                                              f"export computes")
        shape = self.shapes.get(value)
        if shape is None:
            self._fail_at(name, module, node, "a layout operation needs the shapes of the "
                                              "values, which only a capture from a run knows: "
                                              "pass to_integer(..., example_input=x)")
        return View(value, torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape))

    def _materialize(self, view: "View", label: str) -> int:
        """A :class:`GatherOp` for ``view`` (nothing for the identity; cached per view)."""
        if view.emitted is not None:
            return view.emitted
        shape = self.shapes.get(view.src)
        flat = view.index.reshape(-1)
        identity = torch.equal(flat, torch.arange(flat.numel(), dtype=torch.int64)) and \
            shape is not None and flat.numel() == math.prod(shape)
        if identity and tuple(view.index.shape) == tuple(shape):
            view.emitted = view.src
            return view.src
        op = GatherOp(name=label, shape=tuple(int(v) for v in view.index.shape),
                      index=None if identity else flat.clone())
        v = self.values[view.src]
        view.emitted = self._emit(op, v, (view.src,))
        self.shapes[view.emitted] = tuple(view.index.shape)
        return view.emitted
