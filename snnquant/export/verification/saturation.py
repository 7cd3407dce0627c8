r"""How often membranes sit at the ends of their range: :func:`saturation_report`.

snnquant clamps every quantized membrane to its grid :math:`[v_{min}, v_{max}] = [q_{min} s,
q_{max} s]`, the same clamp in the fake-quantized model and in the integer network. NIR has no
saturation, so a consumer of :func:`~snnquant.export.to_nir`'s graph computes a different membrane
from the first step on which a membrane is held at :math:`v_{min}` (or at :math:`v_{max}`
without a spike resetting it), and often different spikes afterwards.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Tuple

import torch
import torch.nn as nn

from ..passes.widen import quantized_neurons

__all__ = ["LayerSaturation", "SaturationReport", "saturation_report", "SaturationWarning",
           "nir_out_of_bounds"]


class SaturationWarning(UserWarning):
    """Membranes saturate on the data given to :func:`~snnquant.export.to_nir`."""


@dataclass(frozen=True)
class LayerSaturation:
    """One neuron layer's saturation on the data.

    Attributes:
        layer: the module name.
        neuron_steps: neurons times time steps times samples observed.
        at_min: fraction of neuron steps whose quantized charge :math:`H_q` is :math:`v_{min}`.
        at_max: fraction of neuron steps whose quantized charge is :math:`v_{max}`.
        v_min, v_max: the ends of the membrane grid (float values).
    """

    layer: str
    neuron_steps: int
    at_min: float
    at_max: float
    v_min: float
    v_max: float

    @property
    def saturated(self) -> float:
        """Fraction of neuron steps at :math:`v_{min}` or :math:`v_{max}`."""
        return self.at_min + self.at_max


@dataclass(frozen=True)
class SaturationReport:
    """Per-layer saturation (:class:`LayerSaturation`) and the samples that never saturate.

    Attributes:
        layers: one entry per quantized neuron layer, in the order they ran.
        samples: number of samples (the data's second dimension).
        samples_in_bounds: fraction of samples on which no membrane of any layer reaches
            :math:`v_{min}` or :math:`v_{max}`.
    """

    layers: Tuple[LayerSaturation, ...]
    samples: int
    samples_in_bounds: float

    def saturated_layers(self) -> List[str]:
        """The layers with at least one neuron step at :math:`v_{min}` or :math:`v_{max}`."""
        return [r.layer for r in self.layers if r.saturated > 0]

    def __str__(self) -> str:
        lines = [f"{'layer':24s} {'neuron steps':>12s} {'at v_min':>9s} {'at v_max':>9s}"]
        lines += [f"{r.layer:24s} {r.neuron_steps:12d} {100 * r.at_min:8.2f}% "
                  f"{100 * r.at_max:8.2f}%" for r in self.layers]
        lines.append(f"samples in bounds: {100 * self.samples_in_bounds:.1f}% of {self.samples}")
        return "\n".join(lines)


def _charge(module, prev, xs, vr_q):
    """The float charge :math:`H` of a quantized neuron layer, its leak read as the registry's
    neuron kind says (as :func:`~snnquant.export.to_integer` reads it)."""
    from ...functional.neuron import neuron_charge
    from ...nn import registry
    kind = registry.neuron_kind(module)
    if kind.leak is None:
        return neuron_charge("if", prev, xs, None, None, True, vr_q)
    if kind.leak == "sigmoid_w":
        k = torch.sigmoid(module.w).to(xs.dtype)
        return neuron_charge("plif", prev, xs, None, k, bool(module.decay_input), vr_q)
    return neuron_charge("lif", prev, xs, module.tau, None, bool(module.decay_input), vr_q)


@torch.no_grad()
def saturation_report(model: nn.Module, data: torch.Tensor) -> SaturationReport:
    r"""Run ``model`` (eval mode, a copy) on ``data`` and count, per quantized neuron layer, the
    neuron steps whose quantized charge sits at an end of the membrane grid.

    .. math::

        H_q = s\,\mathrm{clamp}(\mathrm{round}(H / s), q_{min}, q_{max}),\qquad
        \text{at } v_{min} \Leftrightarrow H_q = q_{min} s,\qquad
        \text{at } v_{max} \Leftrightarrow H_q = q_{max} s

    with the charge :math:`H = f(V[t-1], X[t])` of the neuron (the reference
    :func:`~snnquant.functional.neuron.neuron_charge`), its input :math:`X` and its stored membrane
    :math:`V` observed through forward hooks. The integer network
    (:func:`~snnquant.export.to_integer`) clamps at the same points, so this is also its
    saturation. Neurons without a membrane quantizer are not counted.

    Args:
        model: a quantized network (its membrane quantizers have a uniform per-tensor grid and are
            initialised: run one forward pass in training mode first, or calibrate).
        data: input ``[T, N, ...]`` (the model's own input; multi-step models get it whole,
            single-step models one step at a time).

    Returns:
        A :class:`SaturationReport`.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``data`` not a floating-point or integer
            tensor.
        ValueError: ``data`` is not ``[T, N, ...]``; the model has no quantized neuron; a membrane
            quantizer has no uniform per-tensor grid (the layer is named).
    """
    from spikingjelly.activation_based import functional as sjf
    from ...functional.neuron import membrane_reset_values
    from ...nn import registry
    from ...utils import copy_model, is_multi_step

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(data, torch.Tensor) or data.dtype == torch.bool:
        raise TypeError(f"data must be a tensor of numbers, got {type(data).__name__}"
                        + (f" of {data.dtype}" if isinstance(data, torch.Tensor) else ""))
    if data.dim() < 2:
        raise ValueError(f"data must have shape [T, N, ...], got shape {tuple(data.shape)}")
    work = copy_model(model).eval()
    if not data.is_floating_point():
        fp = [t.dtype for t in work.parameters() if t.is_floating_point()]
        data = data.to(fp[0] if fp else torch.get_default_dtype())
    neurons = quantized_neurons(work)
    if not neurons:
        raise ValueError("model has no quantized neuron (a neuron with a membrane quantizer)")
    for name, m in neurons:
        if registry.neuron_kind(m) is None:
            raise ValueError(f"layer {name!r}: {type(m).__name__} is not a neuron kind of "
                             f"snnquant.nn.registry, so its charge is unknown here")
        grid = m.v_quant.grid()
        if grid is None or not grid.per_tensor or grid.step is None:
            raise ValueError(f"layer {name!r}: its membrane quantizer "
                             f"{type(m.v_quant).__name__} has no uniform per-tensor grid")
    n_samples = data.shape[1]
    counts = {name: [0, 0, 0] for name, _ in neurons}       # neuron steps, at v_min, at v_max
    bad = torch.zeros(n_samples, dtype=torch.bool)
    before = {}

    def pre_hook(name):
        def hook(module, inputs):
            v = module.v
            before[name] = v.clone() if isinstance(v, torch.Tensor) else None
        return hook

    def post_hook(name):
        def hook(module, inputs, output):
            x = inputs[0]
            multi = module.step_mode == "m"
            xs = x if multi else x.unsqueeze(0)
            vs = module.v_seq if multi else module.v.unsqueeze(0)
            grid = module.v_quant.grid()
            step = grid.step.detach().to(device=xs.device, dtype=xs.dtype)
            vr_q, _ = membrane_reset_values(step, grid.qmin, grid.qmax, module.v_threshold,
                                            module.v_reset)
            v0 = before[name]
            if v0 is None or v0.shape != xs.shape[1:]:
                v0 = vr_q.expand_as(xs[0])
            prev = torch.cat([v0.unsqueeze(0).to(xs.dtype), vs[:-1].to(xs.dtype)])
            h = _charge(module, prev, xs, vr_q)
            level = torch.clamp(torch.round(h / step), grid.qmin, grid.qmax)
            low, high = level == grid.qmin, level == grid.qmax
            c = counts[name]
            c[0] += level.numel()
            c[1] += int(low.sum())
            c[2] += int(high.sum())
            per_sample = (low | high).reshape(xs.shape[0], xs.shape[1], -1).any(dim=2).any(dim=0)
            bad[:] |= per_sample.cpu()
        return hook

    handles = []
    for name, m in neurons:
        if m.step_mode == "m":
            m.store_v_seq = True
        handles.append(m.register_forward_pre_hook(pre_hook(name)))
        handles.append(m.register_forward_hook(post_hook(name)))
    try:
        sjf.reset_net(work)
        if is_multi_step(work):
            work(data)
        else:
            for t in range(data.shape[0]):
                work(data[t])
    finally:
        for h in handles:
            h.remove()
    layers = []
    for name, m in neurons:
        steps, low, high = counts[name]
        grid = m.v_quant.grid()
        s = float(grid.step.detach())
        layers.append(LayerSaturation(layer=name, neuron_steps=steps,
                                      at_min=low / steps if steps else 0.0,
                                      at_max=high / steps if steps else 0.0,
                                      v_min=grid.qmin * s, v_max=grid.qmax * s))
    return SaturationReport(layers=tuple(layers), samples=n_samples,
                            samples_in_bounds=float((~bad).double().mean()) if n_samples else 1.0)


def nir_saturation_warning(source, graph, data) -> None:
    """Warn (:class:`SaturationWarning`) naming the layers that saturate on ``data``.

    For a model, the layers of :func:`saturation_report`; for an integer network (no float model
    to observe), the neuron layers whose membrane under NIR's own equations
    (:func:`~snnquant.export.simulate_nir`) leaves :math:`[v_{min}, v_{max}]` (above
    :math:`v_{max}` only without firing): exactly where snnquant's membrane saturated.
    """
    if isinstance(source, nn.Module):
        report = saturation_report(source, data)
        layers = [f"{r.layer} ({100 * r.saturated:.2f}% of neuron steps)"
                  for r in report.layers if r.saturated > 0]
        in_bounds = report.samples_in_bounds
    else:
        layers, samples = nir_out_of_bounds(graph, data)
        in_bounds = float(samples.double().mean())
    if layers:
        warnings.warn(
            f"membranes saturate at v_min or v_max on the data given to to_nir in layers "
            f"{', '.join(layers)} ({100 * in_bounds:.1f}% of samples in bounds): NIR has no "
            f"saturation, so NIR consumers cannot reproduce these steps and their spikes may "
            f"differ; widen the membrane range (more v_bits, or a grid with headroom below zero) "
            f"or see snnquant.export.saturation_report", SaturationWarning, stacklevel=3)


def nir_out_of_bounds(graph, data: torch.Tensor):
    r"""Where NIR's own equations (:func:`~snnquant.export.simulate_nir`) take a neuron's membrane
    out of snnquant's bounds on ``data``: below :math:`v_{min}`, or above :math:`v_{max}` without
    firing (exactly the steps snnquant's membrane saturated at).

    Args:
        graph: a NIR graph written by :func:`~snnquant.export.to_nir`.
        data: input ``[T, N, ...]``.

    Returns:
        ``(layers, in_bounds)``: the saturating layers in words (name and % of neuron steps),
        and a bool tensor ``[N]``, True for the samples that stay in bounds everywhere.
    """
    from .nir_reference import simulate_nir
    if not isinstance(data, torch.Tensor) or data.dim() < 2:
        got = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
        raise ValueError(f"data must be a tensor [T, N, ...], got {got}")
    _, rec = simulate_nir(graph, data, record=True)
    layers = []
    bad = torch.zeros(data.shape[1], dtype=torch.bool)
    for key, r in rec.items():
        meta = graph.nodes[key].metadata
        if meta.get("snnquant_op") != "neuron":
            continue
        u = float(meta["membrane_unit"])
        out = (r["v"] < float(meta["v_min"]) * u) | ((r["v"] > float(meta["v_max"]) * u)
                                                    & (r["spikes"] == 0))
        if bool(out.any()):
            layers.append(f"{meta.get('snnquant_name', key)} "
                          f"({100 * float(out.double().mean()):.2f}% of neuron steps)")
            bad |= out.reshape(out.shape[0], out.shape[1], -1).any(dim=2).any(dim=0)
    return layers, ~bad
