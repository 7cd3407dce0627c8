r"""Fold BatchNorm into the preceding synaptic layer, anywhere in a module tree.

:func:`fold_batchnorm` is the entry point.

Where a BatchNorm sits is found in two ways, used together:

* the forward pass as :func:`~snnquant.export.capture.capture` records it (from a run on an
  example input, or by torch.fx symbolic tracing without one; SpikingJelly's and snnquant's
  layers, neurons and sequence containers kept whole), which finds ``conv -> bn`` edges in
  residual blocks, transformer blocks in ``nn.ModuleList`` and other hand-written ``forward``
  methods;
* the execution order of sequence containers (``nn.Sequential``, SpikingJelly's
  ``SeqToANNContainer`` / ``MultiStepContainer`` / ``StepModeContainer``), inside which the
  capture does not look, and, without an example input, for modules torch.fx cannot trace.

A BatchNorm is foldable when its input is the output of a ``Linear`` / ``Conv1d`` / ``Conv2d``
layer that feeds nothing else, both are called once, and it has running statistics.
"""

from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..utils import copy_model, model_walk

from .capture import CaptureError, SpikingTracer, capture, is_sequence, node_origin
from .description import ExportError
from .integer_ops import pow2_exponent

__all__ = ["fold_batchnorm", "FoldWarning"]

_FOLD_HINT = "model = snnquant.export.fold_batchnorm(model)"


class FoldWarning(UserWarning):
    """A BatchNorm that :func:`fold_batchnorm` left in place (``on_unfoldable="warn"``)."""


def _is_synapse(m) -> bool:
    return isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))


def _is_neuron(m) -> bool:
    from spikingjelly.activation_based import neuron
    return isinstance(m, neuron.BaseNode)


def _passes_through(m) -> bool:
    return isinstance(m, (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.MaxPool1d,
                          nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.Flatten)) or \
        type(m).__name__ in ("Dropout", "Dropout2d")


def _membrane_step(neuron_module) -> Optional[float]:
    """The power-of-two membrane step of a quantized neuron, else None."""
    vq = getattr(neuron_module, "v_quant", None)
    if vq is None:
        return None
    if not vq.is_initialized:
        return None
    grid = vq.grid()
    if grid is None or not grid.per_tensor:
        return None
    s = float(grid.step.detach())
    return s if pow2_exponent(s) is not None else None


def _weight_step(layer) -> Optional[float]:
    """The smallest power-of-two weight step of a quantized layer (after re-initialisation)."""
    wq = getattr(layer, "weight_quant", None)
    if wq is None:
        return None
    if not wq.is_initialized:
        _reinit_weight_quantizer(layer)  # what the first forward pass would do
    grid = wq.grid()
    if grid is None or grid.step is None:
        return None
    vals = [float(v) for v in grid.step.detach().reshape(-1)]
    if all(pow2_exponent(v) is not None for v in vals):
        return min(vals)
    return None


@torch.no_grad()
def _reinit_weight_quantizer(layer) -> str:
    wq = getattr(layer, "weight_quant", None)
    if wq is None:
        return "weight quantizer kept as it is"
    was = wq.training
    wq.mark_uninitialized()
    if wq.is_initialized:  # a quantizer without statistics (a fixed grid)
        return "weight quantizer kept as it is"
    wq.train(False)
    try:
        wq.ensure_initialized(layer.weight.detach())
    finally:
        wq.train(was)
    return f"{type(wq).__name__} statistics re-initialised from the folded weight"


def _is_batchnorm(m) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


# functions through which a bias still charges the next neuron's membrane
_PASSTHROUGH_FUNCTIONS = {operator.add, operator.iadd, torch.add, torch.flatten, "add", "add_",
                          "flatten", "view", "reshape"}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass
class _FoldPlan:
    """Where every BatchNorm of a model sits: foldable pairs and refusals with their reasons."""

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


def _plan(model: nn.Module, example_input=None) -> _FoldPlan:
    """Capture ``model`` (from a run on ``example_input`` if given, see the module docstring)
    and decide for every BatchNorm."""
    plan = _FoldPlan()
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
        if _is_batchnorm(m):
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


def _describe(plan: _FoldPlan, modules, unit: str) -> str:
    if unit in modules:
        return f"layer {unit!r} ({type(modules[unit]).__name__})"
    if unit in plan.operations:
        return plan.operations[unit]
    owner, _, op = unit.rpartition(":")
    return f"the {op.strip('<>')} of {owner or 'the model'!r}"


def _decide(plan: _FoldPlan, modules, name: str, bn) -> Tuple[Optional[str], Optional[str]]:
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
    if src not in modules or not _is_synapse(modules[src]):
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


def _next_membrane_step(plan: _FoldPlan, modules, name: str) -> Optional[float]:
    """The membrane step of the neuron that ``name``'s output charges, if a chain leads to one."""
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
        if _is_neuron(m):
            return _membrane_step(m)
        if not (_is_batchnorm(m) or _passes_through(m)):
            return None


def _grid_bias_quantizer(name: str, layer, membrane_step: Optional[float], bias_bits):
    """Give ``layer`` a bias quantizer on the power-of-two grid min(s_w, s_v)."""
    from ..nn.quantizers import UniformQuantizer
    candidates = [s for s in (_weight_step(layer), membrane_step) if s is not None]
    if not candidates:
        layer.bias_quant = None
        return
    s_b = min(candidates)
    peak = float(layer.bias.detach().abs().max()) if layer.bias.numel() else 0.0
    bits = bias_bits
    if bits is None:
        bits = max(8, (math.ceil(peak / s_b) + 1).bit_length() + 1)
        if bits > 32:
            raise ExportError(f"layer {name!r}: its folded bias (largest magnitude {peak:.6g}) "
                              f"needs {bits} bits on the step {s_b:.6g} of the grid it is added "
                              f"to (at most 32); give the layer's weights or membrane a larger "
                              f"step, or pass bias_bits")
    layer.bias_quant = UniformQuantizer(bits, step=s_b).to(layer.weight.device)


def batchnorm_refusal(model: nn.Module, name: str, example_input=None) -> str:
    """Why BatchNorm ``name`` of ``model`` is still there: not folded yet, or why it cannot be."""
    reason = _plan(model, example_input).refused.get(name)
    if reason is None:
        return f"BatchNorm must be folded into the preceding synaptic layer first: {_FOLD_HINT}"
    return f"fold_batchnorm cannot fold this BatchNorm: {reason}"


def _refusal_text(refused: Dict[str, str], modules) -> str:
    return "; ".join(f"layer {n!r} ({type(modules[n]).__name__}): {r}" for n, r in refused.items())


def fold_batchnorm(model: nn.Module, *, bias_bits: Optional[int] = None,
                   reinit_weight_step: bool = True, snap_biases: bool = True,
                   on_unfoldable: str = "raise", example_input=None) -> nn.Module:
    r"""Fold every BatchNorm (eval statistics) into the synaptic layer right before it.

    .. math::

        W' = W\,\frac{\gamma}{\sqrt{\sigma^2 + \epsilon}},\qquad
        b' = (b - \mu)\,\frac{\gamma}{\sqrt{\sigma^2 + \epsilon}} + \beta

    per output channel, computed in float64. The BatchNorm is replaced by ``nn.Identity`` (so
    module names stay the same). BatchNorms are found anywhere in the module tree: in
    sequence containers nested freely and in hand-written ``forward`` methods (residual blocks,
    SpikingJelly's ``spiking_resnet`` / ``sew_resnet`` / ``spiking_vgg`` / ``parametric_lif_net``
    models; transformer blocks in an ``nn.ModuleList`` given ``example_input``), through the
    graph :func:`~snnquant.export.capture.capture` records, with SpikingJelly and snnquant
    layers, neurons and containers kept whole (see the module docstring). A BatchNorm folds when
    its input is the
    output of a ``Linear`` / ``Conv1d`` / ``Conv2d`` layer that feeds nothing else, both are called
    once in the forward pass, and it has running statistics. On a float model the folded model's
    output in eval mode equals the unfolded one's (up to float rounding).

    For quantized layers:

    * the weight quantizer is kept (bits, per-channel, power-of-two restriction); with
      ``reinit_weight_step`` a learned per-channel binary/ternary :math:`\alpha` is multiplied by
      :math:`|\gamma/\sqrt{\sigma^2+\epsilon}|` (the quantized weights follow the BN scale; with
      ``power_of_two`` it is then rounded to a power of two at use, which is where folding
      changes a binary network), and an LSQ step is re-initialised from the folded weight
      (:math:`2\,\mathrm{mean}|W'|/\sqrt{q_{max}}`, rounded to a power of two for ``lsq_pow2``)
      and a min/max range re-observed, because the trained step was learned for the unfolded
      weight; fixed grids (``UniformQuantizer``, ``QuantizedBits``) are kept;
    * the bias gets a ``UniformQuantizer`` with step :math:`s_b = \min(s_w, s_v)` over the
      power-of-two ones of the layer's weight step :math:`s_w` and the membrane step
      :math:`s_v` of the neuron the layer charges (through pooling, flatten and residual adds),
      so that the bias is an integer on the grid the integer network already uses (no extra
      bits); ``bias_bits`` bits, by default just enough for :math:`\max|b'|` (at least 8).

    Accuracy: folding changes what the quantizers see; the folded model should be evaluated (or
    fine-tuned) before deployment. The fake-quantized folded model and its integer export agree
    exactly.

    Args:
        model: the network (not modified; a folded deep copy is returned).
        bias_bits: bit width of the folded bias quantizer (2..32), or ``None`` for automatic.
        reinit_weight_step: re-initialise LSQ steps / min-max ranges from the folded weights.
        snap_biases: also give the same grid bias quantizer to every quantized layer whose bias
            is not quantized (a float bias is not an integer on any grid the integer network
            can use).
        on_unfoldable: what to do about BatchNorms that cannot be folded: ``"raise"`` (default,
            nothing is folded) or ``"warn"`` (one :class:`FoldWarning` naming each with its
            reason; the others are folded). Either way every one is named with its reason.
        example_input: one input batch (``[T, N, ...]`` for a multi-step network) to capture
            the graph from a run (:func:`~snnquant.export.capture.capture`): then Python in a
            ``forward`` that depends only on shapes (``if x.ndim != 5: raise``) and loops over
            ``nn.ModuleList`` blocks are followed. Default ``None``: torch.fx symbolic tracing,
            which stops at such Python (the BatchNorms in that module are then refused, naming
            the module and the line).

    Returns:
        The folded copy of ``model``.

    Raises:
        ExportError: with ``on_unfoldable="raise"``, a BatchNorm cannot be folded: the message
            names each such layer and the reason (it does not directly follow a Linear/Conv
            layer, that layer's output also feeds another, it has no running statistics, ...).
        CaptureError: the model raised when run on ``example_input`` (the message names the
            innermost submodule, its class, and the file and line).
    """
    from spikingjelly.activation_based import functional as sjf
    from ..nn.quantizers import check_bits

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if bias_bits is not None:
        check_bits(bias_bits, "bias_bits", 2, 32)
    if on_unfoldable not in ("raise", "warn"):
        raise ValueError(f"on_unfoldable must be 'raise' or 'warn', got {on_unfoldable!r}")
    model = copy_model(model)
    plan = _plan(model, example_input)
    modules = dict(model.named_modules())
    if plan.refused:
        text = ("BatchNorm layers fold_batchnorm cannot fold: "
                + _refusal_text(plan.refused, modules))
        if on_unfoldable == "raise":
            raise ExportError(text)
        warnings.warn(text, FoldWarning, stacklevel=2)
    for synapse_name, bn_name in plan.pairs:
        layer, bn = modules[synapse_name], modules[bn_name]
        with torch.no_grad():
            dtype = layer.weight.dtype
            mean = bn.running_mean.double()
            scale = 1.0 / torch.sqrt(bn.running_var.double() + bn.eps)
            gamma = bn.weight.double() if bn.affine else torch.ones_like(mean)
            beta = bn.bias.double() if bn.affine else torch.zeros_like(mean)
            scale = gamma * scale
            w = layer.weight.double() * scale.reshape([-1] + [1] * (layer.weight.dim() - 1))
            b = layer.bias.double() if layer.bias is not None else torch.zeros_like(mean)
            b = (b - mean) * scale + beta
            layer.weight.data = w.to(dtype)
            if layer.bias is None:
                layer.bias = nn.Parameter(b.to(dtype))
            else:
                layer.bias.data = b.to(dtype)
        wq = getattr(layer, "weight_quant", None)
        if wq is not None and reinit_weight_step:
            # a scale-only quantizer (binary/ternary alpha) follows the BN scale exactly; the
            # others re-initialise their step from the folded weight
            if not wq.rescale_channels(scale.to(layer.weight.dtype)):
                _reinit_weight_quantizer(layer)
        if hasattr(layer, "weight_quant"):
            _grid_bias_quantizer(synapse_name, layer,
                                 _next_membrane_step(plan, modules, synapse_name), bias_bits)
        parent_name, _, child = bn_name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, nn.Identity())
    if snap_biases:
        for name, layer in modules.items():
            if _is_synapse(layer) and hasattr(layer, "weight_quant") and layer.bias is not None \
                    and layer.bias_quant is None:
                _grid_bias_quantizer(name, layer, _next_membrane_step(plan, modules, name),
                                     bias_bits)
    sjf.invalidate_reset_cache(model)
    return model
