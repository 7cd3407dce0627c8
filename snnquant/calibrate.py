r"""Post-training quantization: set the steps of a quantized network from data, without training.

:func:`calibrate` takes a network from :func:`~snnquant.quantize_model` (typically a trained
full-precision SpikingJelly network that was just converted) and a few batches of inputs. It

1. sets every weight step from the weights themselves (per output channel with per-channel
   quantizers);
2. runs the network in eval mode over the batches with float membranes and records, for every
   quantized neuron, the charge :math:`H[t]` of every step (the membrane before fire and reset);
3. sets every membrane step from that distribution, with a range that always reaches the
   threshold and the reset value (the neuron must still be able to fire);
4. freezes the steps (``freeze=True``): learned steps stop receiving gradients and observed ranges
   stop following data.

No weight, bias, BatchNorm statistic or neuron parameter changes, no optimizer is created and no
gradient is computed.

For a range :math:`r` of the values :math:`x` on a signed grid :math:`[q_{min}, q_{max}]` the step is

.. math::

    s = \max\Big(\frac{r_+}{q_{max}}, \frac{r_-}{-q_{min}}\Big)

with :math:`r_\pm` the largest positive / negative magnitude kept, and for a power-of-two grid
:math:`s \leftarrow 2^{\lceil \log_2 s \rceil}` (the range is never shortened). The methods choose
:math:`r`:

* ``'minmax'``: the observed extremes;
* ``'percentile'``: the ``percentile``-th percentile of :math:`|x|` (outliers are clipped);
* ``'mse'``: the candidate that minimises :math:`\sum (Q_s(x) - x)^2` over
  :math:`r = \frac{k}{K} \max|x|`, :math:`k = 1..K` (or over the powers of two near the
  min/max step for a power-of-two grid).
* ``'firing'``: starts from the ``'mse'`` steps and from the ``'minmax'`` steps, then matches
  the float network's spikes layer by layer, front to back. For neuron layer :math:`l` it tries
  the steps :math:`2^{j} s_w` of the weight quantizer that feeds it and :math:`2^{k} s_v` of its
  membrane, with :math:`s_w` and :math:`s_v` each the ``'mse'`` or the ``'minmax'`` step
  (:math:`j, k` in :data:`FIRING_SEARCH_EXPONENTS`; membrane steps that no longer reach the
  threshold are left out), with the layers before it fixed, and keeps the pair whose output
  spikes :math:`S^q_l` differ least from the float network's :math:`S^f_l` on the batches (on a
  tie: the ``'mse'`` start, then the smallest :math:`|j| + |k|`):

  .. math::

      (j, k)^* = \arg\min_{j, k} \frac{1}{|S_l|} \sum_{b, t, n} \big|S^q_{l}[t, n] - S^f_{l}[t, n]\big|

  Powers of two keep a power-of-two grid on the ladder, so the result still exports exactly.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Iterable, List, NamedTuple, Optional

import torch
import torch.nn as nn

from .nn.quantizers.base import QuantizerBase
from .utils import batch_input, run_batches

__all__ = ["calibrate", "CalibrationReport", "CalibratedQuantizer", "SkippedQuantizer", "run_batches",
           "batch_input", "FiringRate", "FiringRateWarning", "firing_rates",
           "CALIBRATION_METHODS", "SILENT_RATE_FRACTION", "EXCESS_RATE_FACTOR",
           "FIRING_SEARCH_EXPONENTS"]

CALIBRATION_METHODS = ("minmax", "percentile", "mse", "firing")

#: The factors :math:`2^k` by which ``method='firing'`` scales the ``'mse'`` and ``'minmax'`` steps.
FIRING_SEARCH_EXPONENTS = (-2, -1, 0, 1, 2)

#: Values of the charge kept per neuron layer for the percentile and MSE methods.
_SAMPLE_LIMIT = 1 << 20

#: :func:`calibrate` warns where a neuron layer of the quantized network fires at less than this
#: fraction of the float network's rate ...
SILENT_RATE_FRACTION = 0.1
#: ... or at more than this multiple of it.
EXCESS_RATE_FACTOR = 2.0


class CalibratedQuantizer(NamedTuple):
    """One quantizer that :func:`calibrate` set.

    ``name`` is the module's qualified name, ``kind`` ``'weight'`` or ``'membrane'``, ``step``
    the chosen step (a float, or a list with one step per channel), ``qmin``/``qmax`` the integer
    range, ``observed`` the observed ``(min, max)`` of the values and ``covered`` the range
    ``(qmin * step, qmax * step)`` the grid now covers (per channel: the widest).
    ``clipped_fraction`` is the fraction of the observed values outside that range (with
    ``method='firing'``: outside the range of the ``'mse'`` step the search started from).
    """
    name: str
    kind: str
    quantizer: str
    method: str
    step: object
    qmin: int
    qmax: int
    observed: tuple
    covered: tuple
    clipped_fraction: float


class FiringRate(NamedTuple):
    """The firing rate of one neuron layer: spikes per neuron and time step, averaged over the
    batches, in the float network (every quantizer bypassed) and in the quantized network.

    ``warning`` is ``''`` when the quantized rate is within
    ``[SILENT_RATE_FRACTION, EXCESS_RATE_FACTOR]`` times the float rate, else the reason.
    """
    name: str
    float_rate: float
    quantized_rate: float
    warning: str

    @property
    def ratio(self) -> float:
        """``quantized_rate / float_rate`` (``inf`` where only the quantized layer fires, ``1.0``
        where neither fires)."""
        if self.float_rate == 0.0:
            return 1.0 if self.quantized_rate == 0.0 else math.inf
        return self.quantized_rate / self.float_rate


class FiringRateWarning(UserWarning):
    """A neuron layer of a calibrated network fires far less or far more than in the float
    network (see :func:`calibrate`)."""


class SkippedQuantizer(NamedTuple):
    """A quantizer that :func:`calibrate` left as it is, and why."""
    name: str
    kind: str
    quantizer: str
    reason: str


@dataclass
class CalibrationReport:
    """What :func:`calibrate` chose, per quantizer; ``str()`` is a table."""
    method: str
    num_batches: int
    calibrated: List[CalibratedQuantizer] = field(default_factory=list)
    skipped: List[SkippedQuantizer] = field(default_factory=list)
    firing: List[FiringRate] = field(default_factory=list)

    def __getitem__(self, key):
        """The entry of ``(name, kind)`` (``kind`` ``'weight'`` or ``'membrane'``)."""
        name, kind = key
        for entry in self.calibrated:
            if entry.name == name and entry.kind == kind:
                return entry
        raise KeyError(f"no calibrated {kind} quantizer named {name!r}; calibrated: "
                       f"{[(e.name, e.kind) for e in self.calibrated]}")

    def __str__(self):
        def step_text(step):
            if isinstance(step, list):
                return f"{min(step):.4g}..{max(step):.4g} ({len(step)} ch)"
            return f"{step:.4g}"

        head = ["layer", "kind", "quantizer", "step", "grid", "observed", "covered", "clipped"]
        rows = [[e.name, e.kind, e.quantizer, step_text(e.step), f"[{e.qmin}, {e.qmax}]",
                 f"[{e.observed[0]:.4g}, {e.observed[1]:.4g}]",
                 f"[{e.covered[0]:.4g}, {e.covered[1]:.4g}]", f"{100 * e.clipped_fraction:.3f}%"]
                for e in self.calibrated]
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        lines = [f"calibration ({self.method}, {self.num_batches} batches): "
                 f"{len(self.calibrated)} quantizers set, {len(self.skipped)} left as they are",
                 fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
        lines += [f"  {s.name} ({s.kind}, {s.quantizer}): not calibrated ({s.reason})"
                  for s in self.skipped]
        if self.firing:
            lines.append("firing rate per neuron layer (spikes per neuron and step), float -> "
                         "quantized:")
            lines += [f"  {f.name}: {f.float_rate:.4f} -> {f.quantized_rate:.4f} (x{f.ratio:.3g})"
                      + (f"  WARNING: {f.warning}" if f.warning else "") for f in self.firing]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# the quantizer interface calibrate uses: ensure_initialized, grid, can_set_step/set_step,
# calibration_step, freeze (snnquant.nn.quantizers.base.QuantizerBase)


def _settable(q) -> Optional[str]:
    """None when ``calibrate`` can set the step of ``q``, else the reason why not."""
    if not getattr(q, "can_set_step", False):
        return "its levels are fixed: no step to set"
    return None


# --------------------------------------------------------------------------------------------------
# statistics and step choice


def _power_of_two_up(step: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(step)))


def _step_for_range(pos: torch.Tensor, neg: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """The smallest step whose grid covers ``[-neg, pos]`` (elementwise)."""
    step = pos / max(qmax, 1e-30)
    if qmin < 0:
        step = torch.maximum(step, neg / -qmin)
    return torch.clamp(step, min=torch.finfo(torch.float32).tiny)


def _fake_quant(x: torch.Tensor, step: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    return torch.clamp(torch.round(x / step), qmin, qmax) * step


def _choose_step(x: torch.Tensor, *, method: str, qmin: int, qmax: int, power_of_two: bool,
                 percentile: float, mse_candidates: int, floor: Optional[torch.Tensor] = None):
    """Step(s) for the rows of ``x`` (``[C, n]``, one step per row), float64."""
    x = x.double()
    pos = torch.clamp(x.amax(dim=1), min=0.0)
    neg = torch.clamp(-x.amin(dim=1), min=0.0)
    if method == "percentile":
        mag = x.abs()
        if mag.shape[1] > 1:
            r = torch.quantile(mag, percentile / 100.0, dim=1, interpolation="linear")
            pos, neg = torch.minimum(pos, r), torch.minimum(neg, r)
    step = _step_for_range(pos, neg, qmin, qmax)
    if floor is not None:
        floor = floor.double()
        if power_of_two:  # the smallest allowed step must itself be on the power-of-two ladder
            floor = _power_of_two_up(floor)
        step = torch.maximum(step, floor)
    if power_of_two:
        step = _power_of_two_up(step)
    if method not in ("mse", "firing"):  # 'firing' starts from the 'mse' steps
        return step
    # candidate steps: fractions of the min/max step, or powers of two at and below it
    if power_of_two:
        cands = torch.stack([step / 2.0 ** k for k in range(0, 9)])
    else:
        fr = torch.arange(1, mse_candidates + 1, dtype=torch.float64) / mse_candidates
        cands = fr.reshape(-1, 1) * step.reshape(1, -1)
    if floor is not None:
        cands = torch.maximum(cands, floor.reshape(1, -1).expand_as(cands))
    errors = torch.stack([((_fake_quant(x, c.reshape(-1, 1), qmin, qmax) - x) ** 2).sum(dim=1)
                          for c in cands])
    best = errors.argmin(dim=0)
    return cands.gather(0, best.reshape(1, -1)).reshape(-1)


class _Reservoir:
    """Running min/max of every value, and a uniform random sample of at most ``limit`` values."""

    def __init__(self, limit: int, generator: torch.Generator):
        self.limit, self.generator = limit, generator
        self.low, self.high, self.seen = math.inf, -math.inf, 0
        self.sample = torch.empty(0, dtype=torch.float32)

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1).cpu()
        x = x[torch.isfinite(x)]
        if not x.numel():
            return
        self.low, self.high = min(self.low, float(x.min())), max(self.high, float(x.max()))
        self.seen += x.numel()
        pool = torch.cat([self.sample, x])
        if pool.numel() > self.limit:
            keep = torch.randperm(pool.numel(), generator=self.generator)[:self.limit]
            pool = pool[keep]
        self.sample = pool


# --------------------------------------------------------------------------------------------------


def _quantized_modules(model: nn.Module):
    """``(name, module, kind, quantizer)`` for every weight and membrane quantizer of ``model``."""
    out = []
    for name, m in model.named_modules():
        wq = getattr(m, "weight_quant", None)
        if wq is not None and isinstance(getattr(m, "weight", None), torch.Tensor):
            out.append((name, m, "weight", wq))
        vq = getattr(m, "v_quant", None)
        if vq is not None and hasattr(m, "v_threshold"):
            out.append((name, m, "membrane", vq))
    return out


def calibrate(model: nn.Module, batches: Iterable, *, method: str = "minmax",
              percentile: float = 99.99, num_batches: Optional[int] = None,
              power_of_two: Optional[bool] = None, freeze: bool = True,
              weights: bool = True, membranes: bool = True, mse_candidates: int = 100,
              seed: int = 0, check_firing: bool = True) -> CalibrationReport:
    r"""Set every weight and membrane step of a quantized network from data (post-training).

    See :mod:`snnquant.calibrate` for the rule of each ``method``. Weight steps come from the
    weights (per output channel with per-channel quantizers); membrane steps from the charge
    :math:`H[t]` of every neuron at every step, observed while the network runs over ``batches``
    in eval mode with quantized weights and float membranes (one pass, all neuron layers at once).
    A membrane grid always reaches :math:`V_{th}` and :math:`V_{reset}`:

    .. math::

        s_v \ge \frac{|V_{th}|}{q_{max}}

    The model keeps its weights, biases, BatchNorm statistics and neuron parameters (nothing is
    trained); its training/eval flags are restored at the end and its neuron states reset.
    Quantizers with fixed levels and no step (for example ``StateQuant``, QKeras
    ``quantized_bits``) are listed in ``report.skipped`` with the reason.

    With ``check_firing`` (the default), the calibrated network and the float network (every
    quantizer bypassed) then run over the same batches, and ``report.firing`` holds the firing
    rate of every neuron layer in both (:func:`firing_rates`). A layer whose quantized rate falls
    below :data:`SILENT_RATE_FRACTION` (10%) of its float rate, or exceeds
    :data:`EXCESS_RATE_FACTOR` (2x) times it, is named in a :class:`FiringRateWarning`: a
    post-training quantization that silences a layer shows here, before any accuracy is measured.
    A one-shot iterator of batches is kept in memory for this second pass.

    Args:
        model: a network from :func:`~snnquant.quantize_model` (modified in place).
        batches: an iterable of input tensors ``[T, N, ...]``, or of ``(input, target)`` pairs
            whose input is used (a ``DataLoader`` of such pairs with the time dimension first).
        method: ``'minmax'``, ``'percentile'``, ``'mse'`` or ``'firing'``.
        percentile: for ``'percentile'``: the percentile of :math:`|x|` kept, in ``(0, 100]``.
        num_batches: use at most this many batches (default: all).
        power_of_two: restrict steps to powers of two; default (``None``): where the quantizer's
            grid is a power of two (``lsq_pow2`` weights, the default uniform membrane with a
            power-of-two threshold), so a network that exported exactly still does.
        freeze: freeze the calibrated steps: learned steps get ``requires_grad=False`` and
            observed ranges stop following data (set ``False`` to fine-tune them afterwards).
        weights: calibrate the weight quantizers.
        membranes: calibrate the membrane quantizers.
        mse_candidates: number :math:`K` of candidate ranges of ``'mse'``.
        seed: seed of the subsample of the charge used by ``'percentile'`` and ``'mse'``.
        check_firing: compare the firing rate of every neuron layer with the float network's
            on the batches, and warn where it is out of range (see above).

    Returns:
        A :class:`CalibrationReport`: per quantizer the step, the integer range, the observed and
        covered ranges and the fraction of observed values clipped.

    Raises:
        ValueError: a bad argument (naming it), or ``batches`` yields no batch while membranes
            need calibrating.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if method not in CALIBRATION_METHODS:
        raise ValueError(f"method must be one of {CALIBRATION_METHODS}, got {method!r}")
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) \
            or not 0 < percentile <= 100:
        raise ValueError(f"percentile must be a number in (0, 100], got {percentile!r}")
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, int)
                                    or num_batches < 1):
        raise ValueError(f"num_batches must be None or an int >= 1, got {num_batches!r}")
    if power_of_two not in (None, True, False):
        raise ValueError(f"power_of_two must be None, True or False, got {power_of_two!r}")
    if isinstance(mse_candidates, bool) or not isinstance(mse_candidates, int) or mse_candidates < 1:
        raise ValueError(f"mse_candidates must be an int >= 1, got {mse_candidates!r}")
    if check_firing not in (True, False):
        raise ValueError(f"check_firing must be True or False, got {check_firing!r}")
    entries = _quantized_modules(model)
    if not entries:
        raise ValueError(f"model ({type(model).__name__}) has no quantized layer or neuron; "
                         f"convert it with snnquant.quantize_model first")
    if (check_firing or method == "firing") and iter(batches) is batches:  # kept for more passes
        batches = list(batches if num_batches is None else itertools.islice(batches, num_batches))
    report = CalibrationReport(method=method, num_batches=0)
    settings = dict(method=method, percentile=float(percentile), mse_candidates=mse_candidates)
    starts = {} if method == "firing" else None  # the min/max steps, the search's second start
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        todo = []
        for name, module, kind, q in entries:
            reason = _settable(q)
            if reason is not None:
                report.skipped.append(SkippedQuantizer(name, kind, type(q).__name__, reason))
            elif (kind == "weight" and weights) or (kind == "membrane" and membranes):
                todo.append((name, module, kind, q))
        for name, module, kind, q in todo:
            if kind == "weight":
                # the weight the quantizer sees: folded with its BatchNorm where one is
                entry = _calibrate_tensor(name, kind, q, module.effective_weight().detach(),
                                          power_of_two, settings, starts=starts)
                (report.calibrated if isinstance(entry, CalibratedQuantizer)
                 else report.skipped).append(entry)
        membrane_todo = [t for t in todo if t[2] == "membrane"]
        if membrane_todo:
            report.num_batches = _calibrate_membranes(model, membrane_todo, batches, num_batches,
                                                      power_of_two, settings, seed, report,
                                                      starts)
        if method == "firing" and membrane_todo:
            _match_firing(model, todo, batches, num_batches, report, starts)
        if freeze:
            for _, _, _, q in todo:
                q.freeze()
        if check_firing and _neuron_layers(model):
            report.firing, _ = _measure_rates(model, batches, num_batches)
    finally:
        for m, mode in modes.items():
            m.training = mode
    for entry in report.firing:
        if entry.warning:
            warnings.warn(f"calibrate: layer {entry.name!r} {entry.warning}", FiringRateWarning,
                          stacklevel=2)
    return report


def _calibrate_tensor(name, kind, q, x, power_of_two, settings, floor=None, starts=None):
    q.ensure_initialized(x)
    grid = q.grid()
    if grid is None or grid.step is None:
        return SkippedQuantizer(name, kind, type(q).__name__, "it has no uniform grid")
    qmin, qmax = int(grid.qmin), int(grid.qmax)
    pow2 = bool(grid.power_of_two) if power_of_two is None else power_of_two
    cdim = grid.channel_dim
    if cdim is not None and x.dim() > 0:
        rows = x.movedim(cdim % x.dim(), 0).reshape(x.shape[cdim % x.dim()], -1)
    else:
        rows = x.reshape(1, -1)
    method = settings["method"]
    own = q.calibration_step(x.detach())
    if own is not None:  # the quantizer's own closed form (binary/ternary alpha)
        step = own.detach().double().reshape(-1)
        if pow2:
            step = torch.exp2(torch.round(torch.log2(step)))
        method = "own rule"
    else:
        step = _choose_step(rows, qmin=qmin, qmax=qmax, power_of_two=pow2, floor=floor,
                            **settings)
    as_step = (lambda st: st.to(torch.float32) if cdim is not None
               else st.reshape(()).to(torch.float32))
    if starts is not None:  # 'firing' also searches from the min/max steps (see _match_firing)
        starts[(name, kind)] = as_step(_choose_step(rows, qmin=qmin, qmax=qmax,
                                                    power_of_two=pow2, floor=floor,
                                                    **dict(settings, method="minmax")))
    q.set_step(as_step(step))
    new = q.grid().step.detach().double().reshape(-1).expand(rows.shape[0]).reshape(-1, 1)
    clipped = ((rows.double() > qmax * new) | (rows.double() < qmin * new)).double().mean()
    steps = [float(v) for v in new.reshape(-1)]
    if kind == "weight" and qmin == -1 and qmax == 1 and own is not None:
        clipped = torch.zeros(())  # binary/ternary: every weight maps to a level by design
    return CalibratedQuantizer(
        name, kind, type(q).__name__, method, steps if cdim is not None else steps[0],
        qmin, qmax, (float(rows.min()), float(rows.max())),
        (qmin * max(steps), qmax * max(steps)), float(clipped))


class _ChargeRecorder(QuantizerBase):
    """Stands in for a membrane quantizer during calibration: the identity with no grid (so the
    neuron runs its per-step path with a float membrane), recording the charge it is given.

    The neuron also calls it, in eval mode, for its reset value and a soft reset's re-quantization;
    kept in training mode itself, it records only the charge."""

    data_dependent = True

    def __init__(self, reservoir: _Reservoir):
        super().__init__()
        self.__dict__["reservoir"] = reservoir

    @property
    def observing(self) -> bool:
        return True

    def quantize(self, h):
        if self.training:
            self.reservoir.add(h)
        return h


@contextlib.contextmanager
def _membrane_recorders(pairs):
    """Swap each neuron's ``v_quant`` for a recorder while the block runs."""
    saved = [(m, m.v_quant) for m, _ in pairs]
    try:
        for m, recorder in pairs:
            m.v_quant = recorder.train(True)
        yield
    finally:
        for m, q in saved:
            m.v_quant = q


def _calibrate_membranes(model, todo, batches, num_batches, power_of_two, settings, seed, report,
                         starts=None):
    generator = torch.Generator().manual_seed(seed)
    reservoirs = {}
    with _membrane_recorders([(m, _ChargeRecorder(reservoirs.setdefault(
            name, _Reservoir(_SAMPLE_LIMIT, generator)))) for name, m, _, _ in todo]):
        count = run_batches(model, batches, num_batches)
    if count == 0:
        raise ValueError("batches yielded no batch: calibrating the membranes needs data")
    for name, module, kind, q in todo:
        res = reservoirs[name]
        if res.seen == 0:
            report.skipped.append(SkippedQuantizer(name, kind, type(q).__name__,
                                                   "the neuron saw no finite charge"))
            continue
        vth = abs(float(module.v_threshold))
        vr = 0.0 if module.v_reset is None else float(module.v_reset)
        q.ensure_initialized(torch.tensor([res.low, res.high]))
        grid = q.grid()
        qmin, qmax = int(grid.qmin), int(grid.qmax)
        # the grid must reach the threshold (else the neuron never fires) and the reset value
        need = _step_for_range(torch.tensor([max(vth, vr, 0.0)], dtype=torch.float64),
                               torch.tensor([max(-vr, 0.0)], dtype=torch.float64), qmin, qmax)
        values = res.sample if settings["method"] != "minmax" else torch.tensor([res.low, res.high])
        values = torch.cat([values, torch.tensor([res.low, res.high])])
        entry = _calibrate_tensor(name, kind, q, values, power_of_two, settings, floor=need,
                                  starts=starts)
        if isinstance(entry, CalibratedQuantizer):
            entry = entry._replace(observed=(res.low, res.high))
            report.calibrated.append(entry)
        else:
            report.skipped.append(entry)
    return count


# --------------------------------------------------------------------------------------------------
# firing rates: the quantized network against the float network


class _Passthrough(QuantizerBase):
    """Stands in for any quantizer while the float network runs: the identity, with no grid."""

    def quantize(self, x):
        return x


def _neuron_layers(model: nn.Module):
    """``(name, module)`` of every neuron layer (a module with a ``v_threshold``)."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "v_threshold") and not isinstance(m, QuantizerBase)]


@contextlib.contextmanager
def _quantizers_bypassed(model: nn.Module):
    """Replace every quantizer held by a layer or neuron with the identity while the block runs."""
    saved = []
    for module in model.modules():
        if isinstance(module, QuantizerBase):
            continue
        for child_name, child in list(module.named_children()):
            if isinstance(child, QuantizerBase):
                saved.append((module, child_name, child))
    # the layers keep their quantized weights between eval calls: the cache must not outlive a swap
    caches = [m for m in model.modules() if "_qparam_cache" in m.__dict__]
    try:
        for m in caches:
            m.__dict__.pop("_qparam_cache", None)
        for module, child_name, child in saved:
            setattr(module, child_name, _Passthrough().train(child.training))
        yield
    finally:
        for module, child_name, child in saved:
            setattr(module, child_name, child)
        for m in model.modules():
            m.__dict__.pop("_qparam_cache", None)


def _rate_check(float_rate: float, quantized_rate: float) -> str:
    if quantized_rate < SILENT_RATE_FRACTION * float_rate:
        return (f"fires at {quantized_rate:.4g} spikes per neuron and step, below "
                f"{SILENT_RATE_FRACTION:g} x its float rate {float_rate:.4g} (its quantized "
                f"charge seldom reaches the threshold)")
    if quantized_rate > EXCESS_RATE_FACTOR * float_rate:
        return (f"fires at {quantized_rate:.4g} spikes per neuron and step, above "
                f"{EXCESS_RATE_FACTOR:g} x its float rate {float_rate:.4g}")
    return ""


def firing_rates(model: nn.Module, batches: Iterable, num_batches: Optional[int] = None,
                 warn: bool = True) -> List[FiringRate]:
    r"""The firing rate of every neuron layer of a quantized network against the float network.

    Each batch runs twice in eval mode without gradients: once with every quantizer of the model
    bypassed (weights, biases and membranes in floating point: the float network) and once as it
    is (the quantized network). The rate of a layer is its spikes divided by the number of its
    neurons times the time steps, summed over the batches:

    .. math::

        r = \frac{\sum_{b,t,n} S_{b}[t, n]}{\sum_b T_b N_b}

    A layer whose quantized rate falls below :data:`SILENT_RATE_FRACTION` of its float rate, or
    exceeds :data:`EXCESS_RATE_FACTOR` times it, gets a ``warning`` text in its entry and, with
    ``warn=True``, a :class:`FiringRateWarning` naming the layer. The model's training flags are
    restored and its neuron states reset at the end.

    Args:
        model: a network from :func:`~snnquant.quantize_model`.
        batches: input tensors ``[T, N, ...]`` or ``(input, target)`` pairs, as for
            :func:`calibrate`; iterated once.
        num_batches: use at most this many batches (default: all).
        warn: issue a :class:`FiringRateWarning` for every layer out of range.

    Returns:
        A list of :class:`FiringRate`, one per neuron layer in the model's module order.

    Raises:
        ValueError: ``model`` has no neuron layer, ``num_batches`` is not ``None`` or an int >= 1,
            or ``batches`` yields no batch.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, int)
                                    or num_batches < 1):
        raise ValueError(f"num_batches must be None or an int >= 1, got {num_batches!r}")
    if not _neuron_layers(model):
        raise ValueError(f"model ({type(model).__name__}) has no neuron layer (no module with a "
                         f"v_threshold): there is no firing rate to report")
    rates, count = _measure_rates(model, batches, num_batches)
    if count == 0:
        raise ValueError("batches yielded no batch: firing rates need data")
    if warn:
        for entry in rates:
            if entry.warning:
                warnings.warn(f"layer {entry.name!r} {entry.warning}", FiringRateWarning,
                              stacklevel=2)
    return rates


def _measure_rates(model, batches, num_batches):
    """``(rates, number of batches)``; see :func:`firing_rates`."""
    layers = _neuron_layers(model)
    counts = {which: {name: [0.0, 0] for name, _ in layers} for which in ("float", "quantized")}
    current = {"which": "float"}

    def hook_for(name):
        def hook(module, args, output):
            if isinstance(output, torch.Tensor):
                cell = counts[current["which"]][name]
                cell[0] += float(output.detach().double().sum())
                cell[1] += output.numel()
        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in layers]
    modes = {m: m.training for m in model.modules()}
    count = 0
    try:
        model.eval()
        for i, batch in enumerate(batches):
            if num_batches is not None and i >= num_batches:
                break
            current["which"] = "float"
            with _quantizers_bypassed(model):
                run_batches(model, [batch_input(batch, i)])
            current["which"] = "quantized"
            run_batches(model, [batch_input(batch, i)])
            count += 1
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    out = []
    for name, _ in layers:
        (fs, fn), (qs, qn) = counts["float"][name], counts["quantized"][name]
        f_rate, q_rate = fs / max(fn, 1), qs / max(qn, 1)
        out.append(FiringRate(name, f_rate, q_rate, _rate_check(f_rate, q_rate)))
    return out, count


# --------------------------------------------------------------------------------------------------
# method='firing': match the float network's spikes, layer by layer


def _spike_recorder(module):
    """Record the outputs of ``module`` (one list per forward) while the returned handle lives."""
    outputs = []

    def hook(_, args, output):
        outputs.append(output.detach().to(torch.bool if output.dtype == torch.bool
                                          else output.dtype).clone())
    return outputs, module.register_forward_hook(hook)


def _spike_distance(model, neuron_module, batches, num_batches, reference):
    outputs, handle = _spike_recorder(neuron_module)
    try:
        run_batches(model, batches, num_batches)
    finally:
        handle.remove()
    diff = sum(float((a.double() - b.double()).abs().sum()) for a, b in zip(outputs, reference))
    return diff / max(sum(r.numel() for r in reference), 1)


def _match_firing(model, todo, batches, num_batches, report, starts):
    """The search of ``method='firing'`` (see :mod:`snnquant.calibrate`)."""
    by_name = {(e.name, e.kind): i for i, e in enumerate(report.calibrated)}
    order = {id(m): i for i, m in enumerate(model.modules())}
    weights = [(name, m, q) for name, m, kind, q in todo if kind == "weight"]
    for name, neuron_module, kind, vq in todo:
        if kind != "membrane" or (name, "membrane") not in by_name:
            continue
        reference, handle = _spike_recorder(neuron_module)
        try:
            with _quantizers_bypassed(model):
                run_batches(model, batches, num_batches)
        finally:
            handle.remove()
        # the weight quantizer that feeds this neuron: the nearest one before it in module order
        before = [w for w in weights if order[id(w[1])] < order[id(neuron_module)]
                  and (w[0], "weight") in by_name]
        candidates = [(vq, name, "membrane")]
        if before:
            candidates.insert(0, (before[-1][2], before[-1][0], "weight"))
        # every quantizer's starts: its 'mse' step, then its min/max step where that differs
        bases = {}
        for q, qname, qkind in candidates:
            mse = q.grid().step.detach().clone()
            other = starts.get((qname, qkind))
            bases[qkind] = [("mse", mse)] + ([("minmax", other.to(mse))] if other is not None
                                             and not torch.equal(other.to(mse), mse) else [])
        vth = abs(float(neuron_module.v_threshold))
        vr = 0.0 if neuron_module.v_reset is None else abs(float(neuron_module.v_reset))
        vmax = int(vq.grid().qmax)
        w_choices = ([(b, j) for b in range(len(bases["weight"])) for j in FIRING_SEARCH_EXPONENTS]
                     if "weight" in bases else [(0, 0)])
        best = None
        for bw, j in w_choices:
            for bv, (_, v_base) in enumerate(bases["membrane"]):
                for k in FIRING_SEARCH_EXPONENTS:
                    v_step = v_base * 2.0 ** k
                    if float(v_step.max()) * vmax < max(vth, vr):
                        continue  # the membrane grid must still reach the threshold and reset
                    if "weight" in bases:
                        candidates[0][0].set_step(bases["weight"][bw][1] * 2.0 ** j)
                    vq.set_step(v_step)
                    distance = _spike_distance(model, neuron_module, batches, num_batches,
                                               reference)
                    rank = (distance, bw + bv, abs(j) + abs(k))  # ties: the 'mse' start, nearest
                    if best is None or rank < best[0]:
                        best = (rank, {"weight": (bw, j), "membrane": (bv, k)})
        if best is None:  # no candidate reaches the threshold: keep the 'mse' steps as they are
            for q, qname, qkind in candidates:
                q.set_step(bases[qkind][0][1])
            continue
        for q, qname, qkind in candidates:
            b, exponent = best[1][qkind]
            start, base = bases[qkind][b]
            q.set_step(base * 2.0 ** exponent)
            entry = report.calibrated[by_name[(qname, qkind)]]
            step = q.grid().step.detach().double().reshape(-1)
            steps = [float(v) for v in step]
            report.calibrated[by_name[(qname, qkind)]] = entry._replace(
                method=f"firing (2^{exponent} x {start})",
                step=steps if isinstance(entry.step, list) else steps[0],
                covered=(entry.qmin * max(steps), entry.qmax * max(steps)))
