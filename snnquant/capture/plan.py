r"""Which BatchNorms fold into the synaptic layer before them, from the captured graph.

:func:`plan_folding` is shared by :func:`~snnquant.quantize_model` (which pairs train folded,
:mod:`snnquant.nn.batchnorm`) and :func:`~snnquant.export.fold_batchnorm` (which pairs fold), so
the two agree by construction. Where a BatchNorm sits is found in two ways, used together:

* the forward pass as :func:`~snnquant.capture.capture` records it (from a run on an example
  input, or by torch.fx symbolic tracing without one; SpikingJelly's and snnquant's layers,
  neurons, BatchNorms and sequence containers kept whole), which finds ``conv -> bn`` edges in
  residual blocks, transformer blocks in ``nn.ModuleList`` and other hand-written ``forward``
  methods;
* the execution order of sequence containers (``nn.Sequential``, SpikingJelly's
  ``SeqToANNContainer`` / ``MultiStepContainer`` / ``StepModeContainer``), inside which the
  capture does not look, and, without an example input, for modules torch.fx cannot trace.

A BatchNorm is foldable when its input is the output of a ``Linear`` / ``Conv1d`` / ``Conv2d``
layer that feeds nothing else, both are called once, and it has running statistics.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..utils import model_walk
from .graph import CaptureError, SpikingTracer, capture, is_sequence, node_origin

__all__ = ["FoldPlan", "plan_folding", "charged_neuron", "is_synapse", "is_batchnorm",
           "is_neuron", "passes_through"]


#: What the FoldWarning names for a BatchNorm that did not train folded because
#: :func:`~snnquant.quantize_model` had no ``example_input`` (quantize_model records it).
NEEDS_EXAMPLE_INPUT = ("pass example_input=x to quantize_model (torch.fx could not trace the "
                       "module that holds the BatchNorm; a run finds it), then train again")

# functions through which a bias still charges the next neuron's membrane
_PASSTHROUGH_FUNCTIONS = {operator.add, operator.iadd, torch.add, torch.flatten, "add", "add_",
                          "flatten", "view", "reshape"}

def is_synapse(m) -> bool:
    """A synaptic layer BatchNorm folds into: one of the registry's layer kinds (``Linear``,
    ``Conv1d`` or ``Conv2d``, float or quantized)."""
    from ..nn import registry
    return registry.layer_kind(m) is not None


def is_batchnorm(m) -> bool:
    """Any BatchNorm (a subclass of ``torch.nn.modules.batchnorm._BatchNorm``)."""
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass
class FoldPlan:
    """Where every BatchNorm of a model sits: foldable pairs and refusals with their reasons
    (made by :func:`plan_folding`)."""

    pairs: List[Tuple[str, str]] = field(default_factory=list)   # (synapse name, bn name)
    refused: Dict[str, str] = field(default_factory=dict)        # bn name -> reason
    succ: Dict[str, List[str]] = field(default_factory=dict)     # unit -> units fed by it
    pred: Dict[str, List[str]] = field(default_factory=dict)     # unit -> units feeding it
    calls: Dict[str, int] = field(default_factory=dict)          # module name -> times called
    ports: set = field(default_factory=set)                      # a traced module's input/output
    passthrough: set = field(default_factory=set)                # add / flatten function nodes
    untraced: Dict[str, str] = field(default_factory=dict)       # module name -> capture error
    operations: Dict[str, str] = field(default_factory=dict)     # function unit -> description

    def link(self, a: str, b: str):
        self.succ.setdefault(a, []).append(b)
        self.pred.setdefault(b, []).append(a)


def plan_folding(model: nn.Module, example_input=None) -> FoldPlan:
    """Capture ``model`` (from a run on ``example_input`` if given, see the module docstring)
    and decide for every BatchNorm: the pairs ``(synapse name, BatchNorm name)`` that fold, and
    why each other BatchNorm does not."""
    plan = FoldPlan()
    modules = dict(model.named_modules())
    captured = capture(model, example_input)

    def look_inside(name: str, m: nn.Module):
        """The children of a module that was not captured, one by one (through lists of
        blocks, which have no forward of their own)."""
        for n, child in m.named_children():
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                look_inside(_join(name, n), child)
            elif is_sequence(child) or not SpikingTracer().is_leaf_module(child, _join(name, n)):
                unit(_join(name, n), child)

    def unit(name: str, m: nn.Module) -> Tuple[str, str]:
        """Register one more call of ``m``; return the units its input enters, its output leaves."""
        if is_sequence(m):
            ends = [unit(_join(name, n), child) for n, child, _ in model_walk(m)]
            if not ends:
                plan.calls[name] = plan.calls.get(name, 0) + 1
                return name, name
            for (_, a_out), (b_in, _) in zip(ends, ends[1:]):
                plan.link(a_out, b_in)
            return ends[0][0], ends[-1][1]
        if SpikingTracer().is_leaf_module(m, name):
            plan.calls[name] = plan.calls.get(name, 0) + 1
            return name, name
        try:
            graph = captured.graph(name, m)
        except CaptureError as err:  # not captured: its children are looked at one by one
            plan.untraced[name] = str(err)
            plan.calls[name] = plan.calls.get(name, 0) + 1
            look_inside(name, m)
            return name, name
        port_in, port_out = f"{name}:<input>", f"{name}:<output>"
        plan.ports.update((port_in, port_out))
        ends = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                ends[node] = (port_in, port_in)
            elif node.op == "output":
                ends[node] = (port_out, port_out)
            elif node.op == "call_module":
                target = _join(name, node.target)
                ends[node] = unit(target, model.get_submodule(target))
            elif node.op in ("call_function", "call_method"):
                pseudo = f"{name}:<{node.name}>"
                plan.operations[pseudo] = _operation_text(node, name, m)
                if node.target in _PASSTHROUGH_FUNCTIONS:
                    plan.passthrough.add(pseudo)
                ends[node] = (pseudo, pseudo)
            else:
                continue
            for inp in node.all_input_nodes:
                if inp in ends:
                    plan.link(ends[inp][1], ends[node][0])
        return port_in, port_out

    unit("", model)
    for name, m in modules.items():
        if is_batchnorm(m):
            reason, synapse = _decide(plan, modules, name, m)
            if reason is None:
                plan.pairs.append((synapse, name))
            else:
                plan.refused[name] = reason
    return plan


def _operation_text(node, prefix: str, owner: nn.Module) -> str:
    """``the operation matmul in layer 'blocks.0.attn' (SpikingSelfAttention, attention.py:430)``"""
    name, cls, where = node_origin(node, prefix, owner)
    what = getattr(node.target, "__name__", str(node.target))
    inside = f"layer {name!r}" if name else "the model"
    return f"the operation {what} in {inside} ({cls}{', ' + where if where else ''})"


def _describe(plan: FoldPlan, modules, unit: str) -> str:
    if unit in modules:
        return f"layer {unit!r} ({type(modules[unit]).__name__})"
    if unit in plan.operations:
        return plan.operations[unit]
    owner, _, op = unit.rpartition(":")
    return f"the {op.strip('<>')} of {owner or 'the model'!r}"


def _decide(plan: FoldPlan, modules, name: str, bn) -> Tuple[Optional[str], Optional[str]]:
    """``(None, synapse)`` when BatchNorm ``name`` folds into ``synapse``, else ``(reason, None)``.
    """
    calls = plan.calls.get(name, 0)
    if calls == 0:
        owner = next((a for a in _ancestors(name) if a in plan.untraced), None)
        if owner is not None:
            where = repr(owner) if owner else "the model"
            return f"it sits in {where}, whose forward was not captured: {plan.untraced[owner]}", \
                None
        owner = next((a for a in _ancestors(name) if plan.calls.get(a)), None)
        if owner is not None:
            return (f"it sits inside layer {owner!r} ({type(modules[owner]).__name__}), which "
                    f"fold_batchnorm treats as one layer and does not look into", None)
        return "it is never called in the forward pass", None
    if calls > 1:
        return f"it is called {calls} times in the forward pass", None
    node = name
    while True:
        feeding = plan.pred.get(node, [])
        if len(feeding) != 1:
            return ("its input is not the output of one layer: BatchNorm can only be folded "
                    "when it directly follows a Linear/Conv layer"), None
        src = feeding[0]
        if len(plan.succ[src]) != 1:
            others = [u for u in plan.succ[src] if u != node]
            return (f"the output of {_describe(plan, modules, src)} also feeds "
                    f"{_describe(plan, modules, others[0])}, which folding would change"), None
        if src not in plan.ports:
            break
        node = src
    if src not in modules or not is_synapse(modules[src]):
        return (f"its input comes from {_describe(plan, modules, src)}: BatchNorm can only be "
                f"folded when it directly follows a Linear/Conv layer"), None
    if plan.calls.get(src, 0) != 1:
        return (f"layer {src!r} before it is called {plan.calls.get(src, 0)} times in the "
                f"forward pass (its weight is shared)"), None
    if bn.running_mean is None or bn.running_var is None:
        return ("it has no running statistics (track_running_stats=False), so it normalises "
                "with batch statistics and cannot be folded"), None
    c = modules[src].weight.shape[0]
    if bn.num_features != c:
        return f"{bn.num_features} features after layer {src!r} with {c} outputs", None
    return None, src


def _ancestors(name: str) -> List[str]:
    """``'a.b.c'`` -> ``['a.b', 'a', '']``, the innermost first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def is_neuron(m) -> bool:
    """A SpikingJelly spiking neuron (``neuron.BaseNode``, snnquant's quantized ones included)."""
    from spikingjelly.activation_based import neuron
    return isinstance(m, neuron.BaseNode)


def passes_through(m) -> bool:
    """A layer through which a bias still charges the next neuron (pooling, dropout, flatten)."""
    return isinstance(m, (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.MaxPool1d,
                          nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.Flatten)) or \
        type(m).__name__ in ("Dropout", "Dropout2d")


def charged_neuron(plan: FoldPlan, modules, name: str) -> Optional[nn.Module]:
    """The neuron whose membrane the output of layer ``name`` charges (through BatchNorm,
    pooling, dropout, flatten and residual adds), or ``None`` where no single chain leads to one.
    """
    node = name
    while True:
        nxt = plan.succ.get(node, [])
        if len(nxt) != 1:
            return None
        node = nxt[0]
        if node in plan.ports or node in plan.passthrough:
            continue
        m = modules.get(node)
        if m is None:
            return None
        if is_neuron(m):
            return m
        if not (is_batchnorm(m) or passes_through(m)):
            return None
