r"""Fold BatchNorm into the preceding synaptic layer, anywhere in a module tree.

:func:`fold_batchnorm` is the entry point; where each BatchNorm sits and whether it folds comes
from :mod:`snnquant.capture` (the capture :func:`~snnquant.quantize_model` also uses, so that
the pairs trained folded are the pairs folded here).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ...capture import FoldPlan, charged_neuron, is_synapse, plan_folding
from ...capture.plan import NEEDS_EXAMPLE_INPUT
from ...utils import copy_model

from ..ir.network import ExportError
from ...functional.int_limits import pow2_exponent

__all__ = ["fold_batchnorm", "FoldWarning", "FoldReport", "FoldedLayer"]

_FOLD_HINT = "model = snnquant.export.fold_batchnorm(model)"


class FoldWarning(UserWarning):
    """:func:`fold_batchnorm` left a BatchNorm in place (``on_unfoldable="warn"``), or folding
    changed what a quantized layer computes (its weight codes, bias or output); the message names
    the layers."""


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


def _next_membrane_step(plan: FoldPlan, modules, name: str) -> Optional[float]:
    """The membrane step of the neuron that ``name``'s output charges, if a chain leads to one."""
    neuron_module = charged_neuron(plan, modules, name)
    return None if neuron_module is None else _membrane_step(neuron_module)


def _grid_bias_quantizer(name: str, layer, membrane_step: Optional[float], bias_bits):
    """Give ``layer`` a bias quantizer on the power-of-two grid min(s_w, s_v)."""
    from ...nn.quantizers import UniformQuantizer
    candidates = [s for s in (_weight_step(layer), membrane_step) if s is not None]
    if not candidates:
        layer.bias_quant = None
        return
    s_b = min(candidates)
    peak = float(layer.bias.detach().abs().max()) if layer.bias.numel() else 0.0
    if not math.isfinite(peak):
        raise ExportError(f"layer {name!r}: its folded bias is not finite ({peak}): the layer's "
                          f"parameters or its BatchNorm's statistics hold NaN or infinity (a "
                          f"training that diverged)")
    bits = bias_bits
    if bits is None:
        bits = max(8, (math.ceil(peak / s_b) + 1).bit_length() + 1)
        if bits > 32:
            raise ExportError(f"layer {name!r}: its folded bias (largest magnitude {peak:.6g}) "
                              f"needs {bits} bits on the step {s_b:.6g} of the grid it is added "
                              f"to (at most 32); give the layer's weights or membrane a larger "
                              f"step, or pass bias_bits")
    layer.bias_quant = UniformQuantizer(bits, step=s_b).to(layer.weight.device)


def _fold_pair(name: str, layer, bn, plan: FoldPlan, modules, bias_bits, reinit_weight_step):
    """Fold ``bn`` into ``layer`` after training (the weights were quantized before ``bn``)."""
    with torch.no_grad():
        dtype = layer.weight.dtype
        scale = _bn_scale(bn)
        w = layer.weight.double() * scale.reshape([-1] + [1] * (layer.weight.dim() - 1))
        b = _bn_output_bias(layer.bias.double() if layer.bias is not None else None, bn)
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
        _grid_bias_quantizer(name, layer, _next_membrane_step(plan, modules, name), bias_bits)


def _fold_trained_pair(name: str, layer, plan: FoldPlan, modules, bias_bits):
    """Fold a BatchNorm that was folded into ``layer`` during training: the layer's weight and
    bias become the folded ones the trained layer computed, and its quantizers keep their state,
    so the quantized weight and bias stay exactly what they were."""
    with torch.no_grad():
        weight = layer.effective_weight().detach().clone()
        bias = layer.quantized_bias().detach().clone()
    trained_bias_quant = layer.batchnorm.folded_bias_quant
    layer.detach_batchnorm()
    layer.weight.data = weight
    if layer.bias is None:
        layer.bias = nn.Parameter(bias)
    else:
        layer.bias.data = bias
    _grid_bias_quantizer(name, layer, _next_membrane_step(plan, modules, name), bias_bits)
    with torch.no_grad():
        if not torch.equal(layer.quantized_bias(), bias) and trained_bias_quant is not None:
            layer.bias_quant = trained_bias_quant  # the grid it was trained on keeps it exact


@dataclass
class FoldedLayer:
    """What :func:`fold_batchnorm` did to one quantized synaptic layer.

    Attributes:
        name: the layer's qualified name.
        batchnorm: the BatchNorm folded into it, or ``None`` (a bias snapped onto a grid).
        codes: number of quantized weights.
        codes_changed: how many of them changed their integer code (value / grid step).
        bias_change: the largest change of the bias that charges the next layer (the
            BatchNorm's output bias before, the quantized folded bias after).
        output_change: the largest change of the layer's output (after its BatchNorm) on the
            data given to :func:`fold_batchnorm`, or ``None`` without data.
    """

    name: str
    batchnorm: Optional[str]
    codes: int
    codes_changed: int
    bias_change: float
    output_change: Optional[float] = None

    @property
    def changed(self) -> bool:
        """Whether folding changed what this layer computes."""
        return self.codes_changed > 0 or self.bias_change > 0 or bool(self.output_change)


@dataclass
class FoldReport:
    """What :func:`fold_batchnorm` changed, per quantized synaptic layer.

    Attributes:
        layers: one :class:`FoldedLayer` per quantized layer that has a BatchNorm folded into it
            or a bias snapped onto a grid.
        measured: why no output change was measured (no ``data`` given), or ``""``.
    """

    layers: List[FoldedLayer] = field(default_factory=list)
    measured: str = ""

    def changed(self) -> List[str]:
        """One phrase per layer whose computation folding changed."""
        out = []
        for f in self.layers:
            if not f.changed:
                continue
            parts = [f"{f.codes_changed} of {f.codes} weight codes"]
            if f.bias_change > 0:
                parts.append(f"bias by up to {f.bias_change:.3g}")
            if f.output_change:
                parts.append(f"output by up to {f.output_change:.3g}")
            out.append(f"layer {f.name!r} ({', '.join(parts)})")
        return out

    def __str__(self):
        lines = [f"{'layer':<24} {'BatchNorm':<24} {'codes changed':>16} {'bias change':>12} "
                 f"{'output change':>14}"]
        for f in self.layers:
            out = "-" if f.output_change is None else f"{f.output_change:.3g}"
            lines.append(f"{f.name:<24} {f.batchnorm or '-':<24} "
                         f"{f'{f.codes_changed}/{f.codes}':>16} {f.bias_change:>12.3g} {out:>14}")
        if self.measured:
            lines.append(f"output change not measured: {self.measured}")
        return "\n".join(lines)


def _codes(layer) -> Optional[torch.Tensor]:
    """The integer codes of ``layer``'s quantized weight (value / grid step), or None."""
    wq = getattr(layer, "weight_quant", None)
    if wq is None:
        return None
    with torch.no_grad():
        weight = layer.quantized_weight().detach().double()
        grid = wq.grid()
        if grid is None or grid.step is None:
            return weight
        step = grid.step.detach().double()
        if step.numel() > 1:
            step = step.reshape([-1] + [1] * (weight.dim() - 1))
        return torch.round(weight / step)


def _weight_codes(modules) -> Dict[str, Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]:
    """``{layer: (codes, the bias that charges the next layer)}`` before folding."""
    found = {}
    for name, layer in modules.items():
        if is_synapse(layer) and hasattr(layer, "weight_quant"):
            with torch.no_grad():
                bias = layer.quantized_bias()
            found[name] = (_codes(layer), None if bias is None else bias.detach().double())
    return found


def _bn_scale(bn) -> torch.Tensor:
    r""":math:`\gamma / \sqrt{\sigma^2 + \epsilon}` of ``bn`` (eval statistics; :math:`\gamma`
    = 1 without affine parameters), in float64."""
    scale = 1.0 / torch.sqrt(bn.running_var.double() + bn.eps)
    return scale * bn.weight.detach().double() if bn.affine else scale


def _bn_output_bias(bias: Optional[torch.Tensor], bn) -> torch.Tensor:
    """The bias after ``bn`` (eval statistics) of a layer whose bias is ``bias`` (float64)."""
    mean = bn.running_mean.double()
    b = (torch.zeros_like(mean) if bias is None else bias) - mean
    return b * _bn_scale(bn) + (bn.bias.detach().double() if bn.affine else 0.0)


def _record(model: nn.Module, data: torch.Tensor, names: List[str]) -> Dict[str, torch.Tensor]:
    """The outputs of the modules ``names`` of ``model`` (eval mode) on ``data``."""
    from spikingjelly.activation_based import functional as sjf
    outs: Dict[str, list] = {n: [] for n in names}
    handles = [model.get_submodule(n).register_forward_hook(
        lambda mod, inp, out, n=n: outs[n].append(out.detach().double().reshape(-1)))
        for n in names]
    was = model.training
    model.eval()
    sjf.reset_net(model)
    try:
        with torch.no_grad():
            model(data)
    finally:
        for h in handles:
            h.remove()
        sjf.reset_net(model)
        model.train(was)
    return {n: torch.cat(v) if v else torch.zeros(0, dtype=torch.float64) for n, v in outs.items()}


def _report(original: nn.Module, folded: nn.Module, plan: FoldPlan, before, modules,
            data: Optional[torch.Tensor]) -> FoldReport:
    """Compare every quantized layer of ``original`` and ``folded`` (see :class:`FoldReport`)."""
    bn_of = {syn: bn for syn, bn in plan.pairs}
    old_modules = dict(original.named_modules())
    report = FoldReport(measured="" if data is not None else "no data given")
    for name, (codes, bias) in before.items():
        layer = modules[name]
        bn_name = bn_of.get(name)
        if bn_name is None and getattr(layer, "bias_quant", None) is None:
            continue
        if bn_name is not None and getattr(old_modules[name], "batchnorm", None) is None:
            bias = _bn_output_bias(bias, old_modules[bn_name])
        new_codes = _codes(layer)
        same_shape = codes is not None and new_codes is not None and codes.shape == new_codes.shape
        changed = int((codes != new_codes).sum()) if same_shape else layer.weight.numel()
        with torch.no_grad():
            new_bias = layer.quantized_bias()
        if new_bias is None and bias is None:
            bias_change = 0.0
        else:
            new_bias = torch.zeros_like(bias) if new_bias is None else new_bias.detach().double()
            bias = torch.zeros_like(new_bias) if bias is None else bias
            bias_change = float((new_bias - bias).abs().max()) if bias.numel() else 0.0
        report.layers.append(FoldedLayer(name, bn_name, layer.weight.numel(), changed,
                                         bias_change))
    if data is not None and report.layers:
        names = [f.batchnorm or f.name for f in report.layers]
        old, new = _record(original, data, names), _record(folded, data, names)
        for f, n in zip(report.layers, names):
            a, b = old[n], new[n]
            f.output_change = float((a - b).abs().max()) if a.numel() and a.shape == b.shape \
                else 0.0
    return report


def _missed_step(model: nn.Module, plan) -> str:
    """The step that would have trained the folded pairs of ``plan`` folded: what
    :func:`~snnquant.quantize_model` recorded on each BatchNorm it could not attach (the
    ``example_input`` it lacked, or ``fold_batchnorm=False``), else the general advice."""
    modules = dict(model.named_modules())
    steps, traced = {}, None
    for synapse_name, bn_name in plan.pairs:
        bn, layer = modules.get(bn_name), modules.get(synapse_name)
        if bn is None or getattr(layer, "batchnorm", None) is bn:
            continue
        step = getattr(bn, "_snnquant_fold_missed", None)
        if step is None and getattr(layer, "weight_quant", None) is not None:
            # not recorded (a model rebuilt from a state_dict): a pair that torch.fx does not
            # find was missed for want of example_input, one it finds for fold_batchnorm=False
            if traced is None:
                try:
                    traced = set(plan_folding(model).pairs)
                except ExportError:
                    traced = set()
            step = (NEEDS_EXAMPLE_INPUT if (synapse_name, bn_name) not in traced else
                    "train with QuantConfig(fold_batchnorm=True), quantize_model's default, so "
                    "that folding changes nothing")
        if step is not None:
            steps.setdefault(step, []).append(bn_name)
    if steps:
        return "; ".join(f"For {', '.join(repr(n) for n in names)}: {step}"
                         for step, names in steps.items())
    return ("Train with BatchNorm folded in the loop (quantize_model with QuantConfig("
            "fold_batchnorm=True), its default, and example_input=x where the model needs a run "
            "to be traced) so that folding changes nothing")


def batchnorm_refusal(model: nn.Module, name: str, example_input=None) -> str:
    """Why BatchNorm ``name`` of ``model`` is still there: not folded yet, or why it cannot be."""
    reason = plan_folding(model, example_input).refused.get(name)
    if reason is None:
        return f"BatchNorm must be folded into the preceding synaptic layer first: {_FOLD_HINT}"
    return f"fold_batchnorm cannot fold this BatchNorm: {reason}"


def _refusal_text(refused: Dict[str, str], modules) -> str:
    return "; ".join(f"layer {n!r} ({type(modules[n]).__name__}): {r}" for n, r in refused.items())


def fold_batchnorm(model: nn.Module, *, bias_bits: Optional[int] = None,
                   reinit_weight_step: bool = True, snap_biases: bool = True,
                   on_unfoldable: str = "raise", example_input=None,
                   data: Optional[torch.Tensor] = None, return_report: bool = False):
    r"""Fold every BatchNorm (eval statistics) into the synaptic layer right before it.

    .. math::

        W' = W\,\frac{\gamma}{\sqrt{\sigma^2 + \epsilon}},\qquad
        b' = (b - \mu)\,\frac{\gamma}{\sqrt{\sigma^2 + \epsilon}} + \beta

    per output channel, computed in float64. The BatchNorm is replaced by ``nn.Identity`` (so
    module names stay the same). BatchNorms are found anywhere in the module tree: in
    sequence containers nested freely and in hand-written ``forward`` methods (residual blocks,
    SpikingJelly's ``spiking_resnet`` / ``sew_resnet`` / ``spiking_vgg`` / ``parametric_lif_net``
    models; transformer blocks in an ``nn.ModuleList`` given ``example_input``), through the
    graph :func:`~snnquant.capture.capture` records, with SpikingJelly and snnquant layers,
    neurons and containers kept whole (:mod:`snnquant.capture.plan`). A BatchNorm folds when its
    input is the
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

    A pair trained with the BatchNorm folded in (:mod:`snnquant.nn.batchnorm`, the default of
    :func:`~snnquant.quantize_model`) is folded exactly: the layer's weight and bias become the
    folded ones it computed in evaluation and its quantizers keep their state, so no quantized
    weight, no bias and no spike changes (``reinit_weight_step`` does not apply to it). A pair
    quantized before its BatchNorm (``QuantConfig(fold_batchnorm=False)``, or a state dict saved
    before folding was trained) is folded as above, which changes the network at low bits.

    Every quantized layer with a BatchNorm or a snapped bias is compared before and after: how
    many integer weight codes changed, the largest change of the bias that charges the next
    layer and, with ``data``, the largest change of the layer's output (after its BatchNorm) on
    ``data`` in evaluation mode. Where anything changed, one :class:`FoldWarning` names the
    layers and how much; ``return_report=True`` also returns the :class:`FoldReport`.

    Args:
        model: the network (not modified; a folded deep copy is returned).
        bias_bits: bit width of the folded bias quantizer (2..32), or ``None`` for automatic.
        reinit_weight_step: re-initialise LSQ steps / min-max ranges from the folded weights
            (pairs quantized before their BatchNorm only).
        snap_biases: also give the same grid bias quantizer to every quantized layer whose bias
            is not quantized (a float bias is not an integer on any grid the integer network
            can use).
        on_unfoldable: what to do about BatchNorms that cannot be folded: ``"raise"`` (default,
            nothing is folded) or ``"warn"`` (one :class:`FoldWarning` naming each with its
            reason; the others are folded). Either way every one is named with its reason.
        example_input: one input batch (``[T, N, ...]`` for a multi-step network) to capture
            the graph from a run (:func:`~snnquant.capture.capture`): then Python in a
            ``forward`` that depends only on shapes (``if x.ndim != 5: raise``) and loops over
            ``nn.ModuleList`` blocks are followed. Default ``None``: torch.fx symbolic tracing,
            which stops at such Python (the BatchNorms in that module are then refused, naming
            the module and the line).
        data: an input batch (as the model takes it, e.g. ``[T, N, ...]``) on which the output
            change of every layer is measured, or ``None`` (weights and biases compared only).
        return_report: return ``(folded_model, report)`` instead of the folded model.

    Returns:
        The folded copy of ``model`` (and the :class:`FoldReport` with ``return_report``).

    Raises:
        ExportError: with ``on_unfoldable="raise"``, a BatchNorm cannot be folded: the message
            names each such layer and the reason (it does not directly follow a Linear/Conv
            layer, that layer's output also feeds another, it has no running statistics, ...).
        CaptureError: the model raised when run on ``example_input`` (the message names the
            innermost submodule, its class, and the file and line).
    """
    from spikingjelly.activation_based import functional as sjf
    from ...nn.quantizers import check_bits

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if data is not None and not isinstance(data, torch.Tensor):
        raise TypeError(f"data must be a tensor (an input batch of the model) or None, got "
                        f"{type(data).__name__}")
    if not isinstance(return_report, bool):
        raise TypeError(f"return_report must be True or False, got {return_report!r}")
    if bias_bits is not None:
        check_bits(bias_bits, "bias_bits", 2, 32)
    if on_unfoldable not in ("raise", "warn"):
        raise ValueError(f"on_unfoldable must be 'raise' or 'warn', got {on_unfoldable!r}")
    original, model = model, copy_model(model)
    plan = plan_folding(model, example_input)
    modules = dict(model.named_modules())
    modes = {name: m.training for name, m in modules.items()}
    model.eval()  # eval statistics; observers do not observe while folding
    if plan.refused:
        text = ("BatchNorm layers fold_batchnorm cannot fold: "
                + _refusal_text(plan.refused, modules))
        if on_unfoldable == "raise":
            raise ExportError(text)
        warnings.warn(text, FoldWarning, stacklevel=2)
    before = _weight_codes(modules)
    for synapse_name, bn_name in plan.pairs:
        layer, bn = modules[synapse_name], modules[bn_name]
        if getattr(layer, "batchnorm", None) is bn:
            _fold_trained_pair(synapse_name, layer, plan, modules, bias_bits)
        else:
            _fold_pair(synapse_name, layer, bn, plan, modules, bias_bits, reinit_weight_step)
        parent_name, _, child = bn_name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, nn.Identity())
    if snap_biases:
        for name, layer in modules.items():
            if is_synapse(layer) and hasattr(layer, "weight_quant") and layer.bias is not None \
                    and layer.bias_quant is None:
                _grid_bias_quantizer(name, layer, _next_membrane_step(plan, modules, name),
                                     bias_bits)
    for name, m in model.named_modules():
        m.train(modes.get(name, m.training))
    sjf.invalidate_reset_cache(model)
    report = _report(original, model, plan, before, dict(model.named_modules()), data)
    changed = report.changed()
    if changed:
        warnings.warn(f"fold_batchnorm changed the network: {'; '.join(changed)}. "
                      f"{_missed_step(original, plan)}, or evaluate and fine-tune the folded "
                      f"network", FoldWarning, stacklevel=2)
    return (model, report) if return_report else model
