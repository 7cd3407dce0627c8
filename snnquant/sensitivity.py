r"""Which layers tolerate fewer bits: :func:`sensitivity`, and bit widths per layer within a memory
budget: :func:`assign_bits`.

:func:`sensitivity` quantizes one layer at a time of a full-precision network (its weights, or
its membrane), post-training (:func:`~snnquant.calibrate`), at each candidate bit width, and
measures the change of the loss (and of the accuracy when the batches carry labels) against the
full-precision network:

.. math::

    \Delta L_{\ell, b} = L(\text{layer } \ell \text{ at } b \text{ bits}) - L(\text{full precision})

or, with ``method='hessian'``, estimates it for the weights from the curvature of the loss
(HAWQ-V2: the trace of each layer's Hessian block, :func:`hutchinson_trace`, times the squared
quantization error of its weights), which also sees how well a layer will tolerate being trained
at a width.

:func:`assign_bits` then chooses one bit width per layer, minimising the predicted loss change
:math:`\sum_\ell \Delta L_{\ell, b_\ell}` (the changes are assumed to add up) under the memory
budget

.. math::

    \sum_{\ell \in \text{synaptic}} \frac{n_\ell\, b_\ell}{8}
    + \sum_{\ell \in \text{neuron}} \frac{m_\ell\, b_\ell}{8} + F \le B

with :math:`n_\ell` the weights of layer :math:`\ell`, :math:`m_\ell` its neurons per sample
(the membrane state), :math:`F` the bytes not chosen here (biases at ``bias_bits``, layers not
in the sensitivity result at the configuration's bits), all counted as
:func:`~snnquant.summary` counts them. The search is exact (dynamic programming over the Pareto
front of (bytes, loss)).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["sensitivity", "assign_bits", "hutchinson_trace", "SensitivityResult",
           "SensitivityEntry", "LayerCost", "SENSITIVITY_METHODS"]

#: The ``method`` values of :func:`sensitivity`.
SENSITIVITY_METHODS = ("measured", "hessian")


class SensitivityEntry(NamedTuple):
    """One measurement: ``layer`` (qualified name) quantized alone, ``kind`` ``'weight'`` or
    ``'membrane'``, at ``bits``; the loss, its change against full precision, the accuracy and
    its change (``None`` without labels), and the bytes the layer then takes."""
    layer: str
    kind: str
    bits: int
    loss: float
    delta_loss: float
    accuracy: Optional[float]
    delta_accuracy: Optional[float]
    bytes: float


class LayerCost(NamedTuple):
    """Memory of one choosable item: ``count`` values (weights, or neurons per sample) stored at
    the chosen bits, plus ``fixed_bytes`` that do not depend on them (a layer's bias)."""
    layer: str
    kind: str
    count: int
    fixed_bytes: float


@dataclass
class SensitivityResult:
    """The result of :func:`sensitivity`: ``entries`` (one per layer, kind and bit width),
    the full-precision ``baseline_loss`` / ``baseline_accuracy``, the ``costs`` of each layer, the
    ``fixed_bytes`` of what is not chosen, and the ``config`` used as the template; ``method``
    (``'measured'`` or ``'hessian'``), and with ``'hessian'`` the ``hessian_trace`` per weight
    layer and the ``hessian_samples`` per batch it was estimated from.

    ``str()`` is the table; :meth:`plot` draws it.
    """
    entries: List[SensitivityEntry]
    baseline_loss: float
    baseline_accuracy: Optional[float]
    costs: List[LayerCost]
    fixed_bytes: float
    candidates: Tuple[int, ...]
    config: object = None
    num_batches: int = 0
    layers: List[Tuple[str, str]] = field(default_factory=list)
    membrane_candidates: Optional[Tuple[int, ...]] = None
    method: str = "measured"
    hessian_trace: Dict[str, float] = field(default_factory=dict)
    hessian_samples: int = 0

    def candidates_for(self, kind: str) -> Tuple[int, ...]:
        """The bit widths measured for ``kind`` (``'weight'`` or ``'membrane'``)."""
        if kind == "membrane" and self.membrane_candidates is not None:
            return self.membrane_candidates
        return self.candidates

    @property
    def all_bits(self) -> Tuple[int, ...]:
        """Every bit width measured for some layer, ascending (the columns of the table)."""
        kinds = {kind for _, kind in self.layers} or {"weight"}
        return tuple(sorted({b for k in kinds for b in self.candidates_for(k)}))

    def delta(self, layer: str, kind: str, bits: int) -> float:
        """The loss change of ``layer`` (``kind``) at ``bits``."""
        for e in self.entries:
            if e.layer == layer and e.kind == kind and e.bits == bits:
                return e.delta_loss
        raise KeyError(f"no entry for layer={layer!r}, kind={kind!r}, bits={bits!r}")

    def table(self) -> str:
        """The loss change (and accuracy change, in points) per layer and bit width."""
        bits = self.all_bits
        head = ["layer", "kind", "values"] + [f"{b}-bit dloss" for b in bits]
        if self.baseline_accuracy is not None:
            head += [f"{b}-bit dacc" for b in bits]
        counts = {(c.layer, c.kind): c.count for c in self.costs}
        rows = []
        for layer, kind in self.layers:
            by_bits = {e.bits: e for e in self.entries if e.layer == layer and e.kind == kind}
            row = [layer, kind, str(counts[(layer, kind)])]
            row += [f"{by_bits[b].delta_loss:+.4g}" if b in by_bits else "-" for b in bits]
            if self.baseline_accuracy is not None:  # a Hessian estimate has no accuracy
                row += [f"{100 * by_bits[b].delta_accuracy:+.2f}"
                        if b in by_bits and by_bits[b].delta_accuracy is not None else "-"
                        for b in bits]
            rows.append(row)
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        acc = "" if self.baseline_accuracy is None else \
            f", accuracy {100 * self.baseline_accuracy:.2f}% (dacc in points)"
        how = f"one layer quantized at a time (post-training, {self.num_batches} batches)"
        if self.method == "hessian":
            how = (f"weights: Hessian-trace estimate (HAWQ-V2, {self.hessian_samples} Hutchinson "
                   f"samples per batch, {self.num_batches} batches); membranes: " + how)
        return "\n".join([f"full precision: loss {self.baseline_loss:.4g}{acc}; {how}",
                          fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])

    def __str__(self):
        return self.table()

    def plot(self, ax=None, metric: str = "delta_loss"):
        """Heat map of ``metric`` (``'delta_loss'`` or ``'delta_accuracy'``) per layer (rows)
        and bit width (columns), each cell annotated; returns the matplotlib ``Figure``.

        Args:
            ax: a matplotlib ``Axes`` to draw into (default: a new figure).
            metric: which change to show.
        """
        if metric not in ("delta_loss", "delta_accuracy"):
            raise ValueError(f"metric must be 'delta_loss' or 'delta_accuracy', got {metric!r}")
        if metric == "delta_accuracy" and self.baseline_accuracy is None:
            raise ValueError("metric='delta_accuracy' needs batches with labels")
        import matplotlib.pyplot as plt
        import numpy as np

        bits = self.all_bits
        found = {(e.layer, e.kind, e.bits): getattr(e, metric) for e in self.entries}
        values = np.array([[found.get((layer, kind, b), np.nan) for b in bits]
                           for layer, kind in self.layers], dtype=float)
        if metric == "delta_accuracy":
            values = 100 * values
        if ax is None:
            fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(bits),
                                            1.0 + 0.45 * len(self.layers)))
        else:
            fig = ax.figure
        bound = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
        bound = bound or 1.0
        cmap = "Reds" if metric == "delta_loss" else "Reds_r"
        lo, hi = (0.0, bound) if metric == "delta_loss" else (-bound, 0.0)
        im = ax.imshow(values, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(len(bits)), [f"{b} bits" for b in bits])
        ax.set_yticks(range(len(self.layers)), [f"{layer} ({kind[0]})" for layer, kind in self.layers])
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                if np.isnan(values[i, j]):  # not measured for this kind
                    continue
                ax.text(j, i, f"{values[i, j]:+.3g}", ha="center", va="center", fontsize=8)
        label = "loss change" if metric == "delta_loss" else "accuracy change (points)"
        fig.colorbar(im, ax=ax, label=label)
        ax.set_title("sensitivity: one layer quantized at a time\n(w = weights, m = membrane)",
                     fontsize=9)
        fig.tight_layout()
        return fig


def _default_loss(output: torch.Tensor, target: Optional[torch.Tensor],
                  reference: torch.Tensor) -> torch.Tensor:
    rate = output.float().mean(0)
    if target is None:
        return F.mse_loss(rate, reference.float().mean(0), reduction="sum") / rate.shape[0]
    return F.cross_entropy(rate, target.to(rate.device).long())


def _evaluate(model, batches, references, loss_fn):
    from .utils import run_batches
    total, correct, count, labelled = 0.0, 0, 0, True
    outputs = []
    run_batches(model, batches, None, on_output=lambda out, _batch: outputs.append(out))
    for out, batch, ref in zip(outputs, batches, references):
        target = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None
        n = out.shape[1]
        total += float(loss_fn(out, target, ref if ref is not None else out)) * n
        count += n
        if target is None:
            labelled = False
        else:
            correct += int((out.float().mean(0).argmax(-1).cpu() == target.cpu().reshape(-1)).sum())
    return total / count, (correct / count if labelled else None), outputs


def _pattern(name: str) -> str:
    """``name`` as an fnmatch pattern that matches exactly it."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def sensitivity(model: nn.Module, batches: Iterable, candidates: Sequence[int] = (2, 4, 8), *,
                membrane_candidates: Optional[Sequence[int]] = None,
                config=None, weights: bool = True, membranes: bool = True,
                loss_fn: Optional[Callable] = None, calibration: str = "mse",
                num_batches: Optional[int] = None, method: str = "measured",
                hessian_samples: int = 16, seed: int = 0) -> SensitivityResult:
    r"""Per layer and bit width, the loss change when only that layer is quantized: measured
    post-training, or (``method='hessian'``, weights) estimated from the loss curvature.

    For every synaptic layer (weights) and every neuron layer (membrane) that
    :func:`~snnquant.quantize_model` would quantize, and every bit width in ``candidates``, a copy
    of ``model`` with only that layer quantized is calibrated on ``batches``
    (:func:`~snnquant.calibrate`, method ``calibration``) and evaluated on the same batches.

    The loss of an output :math:`O \in \mathbb{R}^{T \times N \times C}` is, by default, the
    cross-entropy of the firing rate :math:`\bar O = \frac{1}{T}\sum_t O_t` with the labels, or
    without labels the squared distance to the full-precision rate:

    .. math::

        L = \mathrm{CE}(\bar O, y)\quad\text{or}\quad
        L = \frac{1}{N} \lVert \bar O - \bar O_{fp} \rVert^2

    With ``method='hessian'`` the weights of a layer are not quantized and evaluated one at a
    time; their loss change is the second-order estimate of HAWQ-V2 (Dong et al., 2020), from
    the trace of the layer's block of the loss Hessian of the full-precision network (estimated
    with :func:`hutchinson_trace`, through the surrogate gradients) and the quantization error of
    its :math:`n_\ell` weights at :math:`b` bits (all layers quantized at :math:`b` and
    calibrated together, ``calibration``):

    .. math::

        \Delta L_{\ell, b} \approx \Omega_{\ell}(b)
        = \frac{1}{2}\,\frac{\operatorname{Tr}(H_\ell)}{n_\ell}\,
          \lVert Q_b(W_\ell) - W_\ell \rVert^2

    (HAWQ-V2 drops the :math:`\tfrac{1}{2}`; it is kept here so that the estimate is a loss
    change, comparable with the membranes, which are still measured one layer at a time).
    The trace sees how flat the loss is around a layer's weights, which is what lets
    quantization-aware training move them onto a coarse grid at little cost; a post-training
    measurement sees only the error of rounding the trained weights as they are.

    Args:
        model: the full-precision network (not modified).
        batches: input tensors ``[T, N, ...]`` or ``(input, target)`` pairs, as for
            :func:`~snnquant.calibrate`; iterated once and kept (use a few batches).
        candidates: bit widths to try (ints in ``[2, 32]``; 1 tries binary weights).
        membrane_candidates: bit widths to try for the membranes (ints in ``[2, 32]``), if they
            differ from ``candidates`` (default: ``candidates``). Membranes usually need more bits
            than weights, for example ``candidates=(2, 4)`` with ``membrane_candidates=(4, 8)``.
        config: a :class:`~snnquant.QuantConfig` giving the quantizers, ``skip`` patterns and bias
            bits (default ``QuantConfig(per_channel=True, v_bits=8)``); its bit widths are
            replaced by each candidate. It is also the template of :func:`assign_bits`.
        weights: measure the weights of the synaptic layers.
        membranes: measure the membranes of the neuron layers.
        loss_fn: ``loss_fn(output [T, N, ...], target or None, full-precision output)`` returning a
            scalar mean over the batch (default: see above).
        calibration: the ``method`` of :func:`~snnquant.calibrate`.
        num_batches: use at most this many batches.
        method: ``'measured'`` (every layer and kind quantized alone and evaluated) or
            ``'hessian'`` (the weights from :math:`\Omega_\ell(b)` above; the membranes
            measured). The Hessian needs double backward through the network (SpikingJelly's
            surrogate functions support it on the PyTorch backend).
        hessian_samples: Rademacher vectors per batch of Hutchinson's estimator
            (``method='hessian'``).
        seed: seed of those vectors.

    Returns:
        A :class:`SensitivityResult` (``str()`` is the table, ``.plot()`` a heat map); with
        ``method='hessian'`` its ``hessian_trace`` holds :math:`\operatorname{Tr}(H_\ell)` per
        layer.
    """
    from .calibrate import CALIBRATION_METHODS, calibrate
    from .convert import QuantConfig, quantize_model
    from .measure import layer_rows
    from .utils import batch_input, copy_model, run_batches

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    cands = _check_candidates(candidates, "candidates", 1)
    mcands = None if membrane_candidates is None else \
        _check_candidates(membrane_candidates, "membrane_candidates", 2)
    if config is None:
        config = QuantConfig(per_channel=True, v_bits=8)
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
    if calibration not in CALIBRATION_METHODS:
        raise ValueError(f"calibration must be one of {CALIBRATION_METHODS}, got {calibration!r}")
    if method not in SENSITIVITY_METHODS:
        raise ValueError(f"method must be one of {SENSITIVITY_METHODS}, got {method!r}")
    if isinstance(hessian_samples, bool) or not isinstance(hessian_samples, int) \
            or hessian_samples < 1:
        raise ValueError(f"hessian_samples must be an int >= 1, got {hessian_samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not (weights or membranes):
        raise ValueError("weights and membranes are both False: nothing to measure")
    if 1 in cands and membranes and mcands is None:
        raise ValueError("candidates contains 1 (binary weights) but membranes need >= 2 bits: "
                         "pass membranes=False, membrane_candidates, or drop 1")
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, int)
                                    or num_batches < 1):
        raise ValueError(f"num_batches must be None or an int >= 1, got {num_batches!r}")
    batch_list = list(itertools.islice(iter(batches), num_batches))
    if not batch_list:
        raise ValueError("batches yielded no batch")
    loss_fn = loss_fn or _default_loss
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")

    fp = copy_model(model).eval()
    fp_outputs = []
    run_batches(fp, batch_list, None, on_output=lambda out, _b: fp_outputs.append(out))
    base_loss, base_acc, _ = _evaluate(fp, batch_list, fp_outputs, loss_fn)

    # which layers quantize_model would touch, and their sizes (as summary counts them)
    probe, report = quantize_model(fp, dataclasses.replace(
        config, weight_bits=8 if weights else config.weight_bits,
        v_bits=8 if membranes else config.v_bits, overrides={}))
    replaced = {r.name for r in report.replaced}
    first = batch_input(batch_list[0], 0)[:, :1]
    rows = {r["name"]: r for r in layer_rows(probe, first)}
    layers, costs = [], []
    fixed = 0.0
    for name, row in rows.items():
        if row["membrane_bits_per_neuron"] is None:  # a synaptic layer
            module = probe.get_submodule(name)
            nw = module.weight.numel()
            nb = 0 if module.bias is None else module.bias.numel()
            bias_quant = getattr(module, "bias_quant", None)  # None on an unquantized layer
            bias_bits = (bias_quant.num_bits if bias_quant is not None else None) or 32
            if weights and name in replaced:
                layers.append((name, "weight"))
                costs.append(LayerCost(name, "weight", nw, nb * bias_bits / 8))
            else:
                fixed += row["quant_bytes"]
        else:
            fixed += row["quant_bytes"]  # a neuron's own parameters (PLIF's w) at fp32
            n = int(row["neurons"] or 0)
            if membranes and name in replaced:
                layers.append((name, "membrane"))
                costs.append(LayerCost(name, "membrane", n, 0.0))
            else:
                fixed += row["state_quant_bytes"] or 0.0
    if not layers:
        raise ValueError(f"quantize_model finds nothing to quantize in {type(model).__name__} "
                         f"with this config (skip={list(config.skip)})")
    # layers not measured are stored at the config's own bits
    entries = []
    traces: Dict[str, float] = {}
    if method == "hessian" and weights:
        names = [name for name, kind in layers if kind == "weight"]
        traces = _weight_traces(fp, batch_list, fp_outputs, names, loss_fn, hessian_samples, seed)
        errors = _weight_errors(fp, batch_list, names, cands, config, calibration)
    for (name, kind), cost in zip(layers, costs):
        if method == "hessian" and kind == "weight":
            n = cost.count
            for bits in cands:
                omega = 0.5 * traces[name] / n * errors[(name, bits)]
                entries.append(SensitivityEntry(name, kind, bits, base_loss + omega, omega, None,
                                                None, n * bits / 8 + cost.fixed_bytes))
            continue
        for bits in (mcands if kind == "membrane" and mcands is not None else cands):
            field_name = "weight_bits" if kind == "weight" else "v_bits"
            cfg = dataclasses.replace(config, weight_bits=None, v_bits=None,
                                      overrides={_pattern(name): {field_name: bits}})
            qmodel, _ = quantize_model(fp, cfg)
            calibrate(qmodel, batch_list, method=calibration)
            loss, acc, _ = _evaluate(qmodel, batch_list, fp_outputs, loss_fn)
            entries.append(SensitivityEntry(
                name, kind, bits, loss, loss - base_loss, acc,
                None if acc is None else acc - base_acc, cost.count * bits / 8 + cost.fixed_bytes))
    return SensitivityResult(entries=entries, baseline_loss=base_loss, baseline_accuracy=base_acc,
                             costs=costs, fixed_bytes=fixed, candidates=cands, config=config,
                             num_batches=len(batch_list), layers=layers,
                             membrane_candidates=mcands, method=method, hessian_trace=traces,
                             hessian_samples=hessian_samples if method == "hessian" else 0)


def hutchinson_trace(loss: torch.Tensor, tensors: Sequence[torch.Tensor], samples: int = 16,
                     generator: Optional[torch.Generator] = None) -> List[float]:
    r"""Hutchinson's estimate of the trace of each tensor's diagonal block of the Hessian of
    ``loss`` (as in HAWQ-V2 and PyHessian), from Hessian-vector products by double backward.

    .. math::

        \operatorname{Tr}(H_\ell) = \mathbb{E}_v\left[v_\ell^\top (H v)_\ell\right]
        \approx \frac{1}{m} \sum_{i=1}^{m} v_{i,\ell}^\top (H v_i)_\ell,
        \qquad H v = \nabla_w \left(\nabla_w L \cdot v\right)

    with :math:`v_i` Rademacher vectors (entries :math:`\pm 1`) over all ``tensors`` at once
    (the off-diagonal blocks average out). The estimate is exact for a diagonal Hessian.

    Args:
        loss: a scalar computed from ``tensors`` with autograd.
        tensors: the tensors (leaves that require grad), one block each.
        samples: :math:`m`, the number of Rademacher vectors.
        generator: for the vectors (drawn on the CPU).

    Returns:
        One float per tensor: :math:`\operatorname{Tr}(H_\ell)` estimated.

    Raises:
        RuntimeError: the graph of ``loss`` cannot be differentiated twice (an operation without
            double backward, such as a fused kernel); the message names the cause.
    """
    tensors = list(tensors)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(f"loss must be a scalar tensor, got {getattr(loss, 'shape', loss)!r}")
    bad = [i for i, t in enumerate(tensors) if not t.requires_grad]
    if not tensors or bad:
        raise ValueError(f"tensors must be a non-empty list of tensors that require grad; "
                         f"tensors {bad} do not")
    grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True)
    totals = [0.0] * len(tensors)
    live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
    for _ in range(samples):
        vs = [(torch.randint(0, 2, t.shape, generator=generator) * 2 - 1).to(t)
              for t in tensors]
        try:
            hv = torch.autograd.grad([grads[i] for i in live], [tensors[i] for i in live],
                                     grad_outputs=[vs[i] for i in live], retain_graph=True,
                                     allow_unused=True)
        except RuntimeError as e:
            raise RuntimeError(f"hutchinson_trace: the Hessian-vector product needs double "
                               f"backward through the network, which failed: {e}") from e
        for i, h in zip(live, hv):
            if h is not None:
                totals[i] += float((vs[i] * h).sum())
    return [t / samples for t in totals]


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model`` on the sequence ``x`` ``[T, N, ...]`` with gradients (states reset first)."""
    from spikingjelly.activation_based import functional as sjf
    from .utils import is_multi_step
    sjf.reset_net(model)
    if is_multi_step(model):
        return model(x)
    return torch.stack([model(x[t]) for t in range(x.shape[0])])


def _weight_traces(fp, batch_list, fp_outputs, names, loss_fn, samples, seed) -> Dict[str, float]:
    r""":math:`\operatorname{Tr}(H_\ell)` of the loss averaged over the batches, per layer."""
    from spikingjelly.activation_based import functional as sjf
    from .utils import batch_input
    model = _grad_copy(fp)
    weights = [model.get_submodule(name).weight for name in names]
    for p in model.parameters():
        p.requires_grad_(False)
    for w in weights:
        w.requires_grad_(True)
    ref = weights[0]
    generator = torch.Generator().manual_seed(seed)
    totals, count = [0.0] * len(names), 0
    for i, (batch, reference) in enumerate(zip(batch_list, fp_outputs)):
        x = batch_input(batch, i).to(device=ref.device, dtype=ref.dtype)
        target = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None
        out = _forward(model, x)
        n = out.shape[1]
        traces = hutchinson_trace(loss_fn(out, target, reference), weights, samples, generator)
        totals = [t + n * v for t, v in zip(totals, traces)]
        count += n
    sjf.reset_net(model)
    traces = {name: t / count for name, t in zip(names, totals)}
    negative = {name: t for name, t in traces.items() if t < 0}
    if negative:  # an indefinite Hessian: far from a minimum, or too few samples
        import warnings
        warnings.warn("sensitivity(method='hessian'): the Hessian trace of layer(s) "
                      + ", ".join(f"{n!r} ({t:.3g})" for n, t in negative.items())
                      + " is negative, so their estimated loss change is negative and they get "
                      "the fewest bits; the estimate assumes a trained network (near a minimum) "
                      "- train it further or raise hessian_samples", stacklevel=3)
    return traces


def _grad_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode whose floating parameters can take gradients."""
    from .utils import copy_model
    copy = copy_model(model).eval()
    for p in copy.parameters():
        if p.is_floating_point():
            p.requires_grad_(True)
    return copy


def _weight_errors(fp, batch_list, names, cands, config, calibration):
    r""":math:`\lVert Q_b(W_\ell) - W_\ell \rVert^2` per layer and bit width, every layer at
    :math:`b` bits and calibrated together (as the configuration would quantize it)."""
    import warnings
    from .calibrate import FiringRateWarning, calibrate
    from .convert import quantize_model
    errors = {}
    for bits in cands:
        cfg = dataclasses.replace(config, weight_bits=bits, v_bits=None, overrides={})
        qmodel, _ = quantize_model(fp, cfg)
        with warnings.catch_warnings():  # only the weights' grids are read here
            warnings.simplefilter("ignore", FiringRateWarning)
            calibrate(qmodel, batch_list, method=calibration)
        with torch.no_grad():
            for name in names:
                module = qmodel.get_submodule(name)
                errors[(name, bits)] = float(
                    (module.quantized_weight() - module.effective_weight()).pow(2).sum())
    return errors


def _check_candidates(values, name: str, lowest: int) -> Tuple[int, ...]:
    """``values`` as a sorted tuple of distinct ints in ``[lowest, 32]``, else ValueError."""
    cands = tuple(values) if not isinstance(values, (int, str)) else None
    if not cands or any(isinstance(b, bool) or not isinstance(b, int) or not lowest <= b <= 32
                        for b in cands) or len(set(cands)) != len(cands):
        raise ValueError(f"{name} must be distinct ints in [{lowest}, 32], got {values!r}")
    return tuple(sorted(cands))


def assign_bits(sensitivity_result: SensitivityResult, budget_bytes: Optional[float] = None, *,
                budget_bits: Optional[float] = None, candidates: Optional[Sequence[int]] = None):
    r"""Bit widths per layer that fit a memory budget with the least predicted loss change.

    Chooses one bit width per measured layer (weights and membranes separately) among the
    candidates of ``sensitivity_result``, minimising :math:`\sum_\ell \Delta L_{\ell, b_\ell}`
    under the budget (see :mod:`snnquant.sensitivity`). With ``budget_bits`` the budget is an
    average bit width over the chosen values (weights and membrane states):

    .. math::

        B = \frac{\bar b \sum_\ell n_\ell}{8} + F + \sum_\ell \text{fixed}_\ell

    Args:
        sensitivity_result: from :func:`sensitivity`.
        budget_bytes: the memory budget in bytes (weights plus membrane state per sample, as
            :func:`~snnquant.summary` counts them).
        budget_bits: or the budget as average bits per chosen value.
        candidates: restrict the choice to these bit widths (default: all measured; each kind
            keeps those it was measured at).

    Returns:
        A :class:`~snnquant.QuantConfig`: the sensitivity's template with one entry in
        ``overrides`` per measured layer (``{name: {'weight_bits': b}}`` or
        ``{name: {'v_bits': b}}``), ready for :func:`~snnquant.quantize_model`. Its attribute
        ``assignment`` holds ``predicted_delta_loss``, ``bytes`` and ``budget_bytes``.

    Raises:
        ValueError: no budget, both budgets, or a budget below the smallest possible size (the
            message gives that size).
    """
    res = sensitivity_result
    if not isinstance(res, SensitivityResult):
        raise TypeError(f"sensitivity_result must be a SensitivityResult, got {type(res).__name__}")
    if (budget_bytes is None) == (budget_bits is None):
        raise ValueError(f"give exactly one of budget_bytes and budget_bits, got "
                         f"budget_bytes={budget_bytes!r}, budget_bits={budget_bits!r}")
    for arg, value in (("budget_bytes", budget_bytes), ("budget_bits", budget_bits)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0):
            raise ValueError(f"{arg} must be a positive number, got {value!r}")
    kinds = sorted({c.kind for c in res.costs})
    measured = {k: res.candidates_for(k) for k in kinds}
    if candidates is None:
        allowed = measured
    else:
        asked = tuple(sorted(set(candidates)))
        allowed = {k: tuple(b for b in asked if b in measured[k]) for k in kinds}
        missing = [b for b in asked if not any(b in measured[k] for k in kinds)]
        if missing or not asked or not all(allowed.values()):
            raise ValueError(f"candidates must be a non-empty subset of the measured bit widths "
                             f"{ {k: list(v) for k, v in measured.items()} } with at least one "
                             f"width of each kind, got {candidates!r}")
    fixed = res.fixed_bytes + sum(c.fixed_bytes for c in res.costs)
    total_values = sum(c.count for c in res.costs)
    if budget_bits is not None:
        budget_bytes = budget_bits * total_values / 8 + fixed
    # cost in bits (integers, exact); Pareto front of (bits, loss) over the layers so far
    front: Dict[int, Tuple[float, Tuple[int, ...]]] = {0: (0.0, ())}
    for cost in res.costs:
        nxt: Dict[int, Tuple[float, Tuple[int, ...]]] = {}
        for used, (loss, choice) in front.items():
            for b in allowed[cost.kind]:
                key = used + cost.count * b
                value = loss + res.delta(cost.layer, cost.kind, b)
                if key not in nxt or value < nxt[key][0]:
                    nxt[key] = (value, choice + (b,))
        # keep only states that no cheaper state beats
        front, best = {}, float("inf")
        for key in sorted(nxt):
            if nxt[key][0] < best:
                front[key], best = nxt[key], nxt[key][0]
    limit_bits = (budget_bytes - fixed) * 8
    feasible = [(v[0], k, v[1]) for k, v in front.items() if k <= limit_bits + 1e-9]
    if not feasible:
        smallest = min(front) / 8 + fixed
        raise ValueError(f"the budget of {budget_bytes:.1f} bytes is below the smallest "
                         f"configuration of these candidates ({smallest:.1f} bytes, every layer at "
                         f"its smallest candidate: "
                         f"{ {k: min(v) for k, v in allowed.items()} })")
    loss, used, choice = min(feasible, key=lambda t: (t[0], t[1]))
    overrides = {}
    for cost, b in zip(res.costs, choice):
        overrides[_pattern(cost.layer)] = {"weight_bits" if cost.kind == "weight" else "v_bits": b}
    config = dataclasses.replace(res.config, overrides=overrides)
    config.assignment = dict(predicted_delta_loss=loss, bytes=used / 8 + fixed,
                             budget_bytes=float(budget_bytes),
                             bits={f"{c.layer} ({c.kind})": b for c, b in zip(res.costs, choice)})
    return config
