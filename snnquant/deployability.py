r"""What will keep a network from deploying, known before training: :func:`deployability_report`.

:func:`~snnquant.quantize_model` runs it when it is given ``example_input`` (the result is
``report.deployability``) and the command line prints it before the first epoch. For a chosen
destination (:data:`DESTINATIONS`) it lists every reason the trained network would be refused,
each with its fix, by running the checks the export itself runs
(:mod:`snnquant.export.frontend.deploy_checks`, :func:`~snnquant.export.to_integer`,
:func:`~snnquant.export.backends.nir_graph.nir_refusals`, the chips' ``check_*``) on a copy of
the network:

* every neuron's leak (a :math:`\tau` that is not a power of two, or one that is learned);
* every BatchNorm that will not train folded (``report.skipped``);
* then the export of the copy, with every weight code at the end of its range (the largest
  accumulator any training can reach at the present steps), at ``input_max`` (default: the
  largest value of ``example_input``). After a refusal the copy gets the fix the report names
  (the nearest exact :math:`\tau`, ``reference_dtype=torch.float64``, a power-of-two ``T``, an
  input cropped to a power-of-two size) and the export runs again, so that one report names
  every blocker, not only the first.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn as nn

from .capture import CaptureError, plan_folding
from .export import ExportError, fold_batchnorm, to_integer, to_nir
from .export.backends.nir_graph import nir_refusals
from .export.frontend.deploy_checks import (accumulator_fix, exact_leak_shift,
                                            nearest_exact_tau, tau_refusal)
from .export.frontend.torch_model import check_input_max_and_leak_bits, input_max_of
from .nn import registry
from .utils import copy_model, is_multi_step

__all__ = ["Blocker", "DeployReport", "DeployabilityWarning", "DESTINATIONS",
           "deployability_report"]

#: Where a network can go: the integer network (:class:`~snnquant.export.IntegerSNN`), its C
#: model (the same checks as ``'integer'``), NIR, or a chip (the chip's conversion and limits).
DESTINATIONS = ("integer", "c", "nir", "xylo", "loihi", "speck")

_MAX_ROUNDS = 8


class DeployabilityWarning(UserWarning):
    """The network, as quantized, would be refused by its destination after training; the
    message lists every blocker with its fix (:class:`DeployReport`)."""


@dataclass(frozen=True)
class Blocker:
    """One reason the trained network would be refused.

    Attributes:
        check: the kind of refusal, one of :data:`snnquant.export.frontend.deploy_checks.CHECKS`
            (``'tau'``, ``'time_mean'``, ``'mean'``, ``'accumulator'``, ``'batchnorm'``,
            ``'capture'``, ``'nir'``, ``'chip'``, ``'other'``).
        layer: the module it names (``''``: the network).
        reason: the refusal, as the export words it.
        fix: the step that removes it.
    """
    check: str
    layer: str
    reason: str
    fix: str

    def __str__(self):
        where = f"{self.layer}: " if self.layer else ""
        return f"[{self.check}] {where}{self.reason}\n    fix: {self.fix}"


@dataclass
class DeployReport:
    """What :func:`deployability_report` found.

    Attributes:
        destination: one of :data:`DESTINATIONS`.
        blockers: every reason the trained network would be refused, each with its fix.
        input_max: the largest input the integer checks assumed (``None`` for a chip).
        input_max_from: ``'given'`` or ``'example_input'`` (its largest value).
        reference_dtype: the float type the exactness bounds were checked in.
        notes: what else the user should know (an approximate leak, ...).
    """
    destination: str
    blockers: List[Blocker] = field(default_factory=list)
    input_max: Optional[int] = None
    input_max_from: str = "given"
    reference_dtype: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing blocks the destination."""
        return not self.blockers

    def checks(self) -> List[str]:
        """The kinds of blocker found, in order, each once."""
        return list(dict.fromkeys(b.check for b in self.blockers))

    def __str__(self):
        head = (f"deployability ({self.destination}"
                + (f", input_max={self.input_max} ({self.input_max_from}), "
                   f"{self.reference_dtype}" if self.input_max is not None else "") + "): ")
        if self.ok:
            lines = [head + "nothing blocks the export after training"]
        else:
            lines = [head + f"{len(self.blockers)} blocker(s) the export would refuse after "
                            f"training"]
            groups = {}   # one entry per refusal that several layers share (a tau, ...)
            for b in self.blockers:
                groups.setdefault((b.check, b.reason, b.fix), []).append(b.layer)
            for (check, reason, fix), layers in groups.items():
                where = ", ".join(n for n in layers if n)
                lines.append(f"  [{check}] {where + ': ' if where else ''}{reason}")
                lines.append(f"      fix: {fix}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _check_destination(destination):
    if hasattr(destination, "quantize_network"):  # a chip profile
        return type(destination).__name__.replace("Profile", "").lower(), destination
    if not isinstance(destination, str) or destination.lower() not in DESTINATIONS:
        raise ValueError(f"destination must be one of {DESTINATIONS} or a chip profile of "
                         f"snnquant.targets, got {destination!r}")
    return destination.lower(), None


def _chip_report(model, chip: str, profile, example_input) -> DeployReport:
    """A chip's conversion (``quantize_for_*``) of the float network and its ``check_*``."""
    from . import targets
    report = DeployReport(chip)
    profile = profile or {"xylo": targets.XYLO_AUDIO2, "loihi": targets.LOIHI2,
                          "speck": targets.SPECK2F}[chip]
    check = {"xylo": targets.check_xylo, "loihi": targets.check_loihi,
             "speck": targets.check_speck}[chip]
    try:
        net = profile.quantize_network(copy_model(model), example_input)
    except (ValueError, TypeError, ExportError) as err:
        report.blockers.append(Blocker("chip", "", str(err), f"change the network to what "
                                       f"{chip} runs (the message says what), or deploy it as "
                                       f"C (destination='c')"))
        return report
    for v in check(net, profile):
        report.blockers.append(Blocker("chip", v.layer, str(v),
                                       f"keep the layer within {v.limit}"))
    return report


def _static_leaks(model, dtype, leak_bits, report) -> dict:
    """Blockers of every neuron's leak; ``{name: exact tau}`` to give the copy."""
    fixes = {}
    for name, m in model.named_modules():
        kind = registry.neuron_kind(m)
        if kind is None or kind.leak is None:
            continue
        if kind.leak == "sigmoid_w":
            tau = float(1.0 / torch.sigmoid(m.w.detach().double()))
            learned = bool(m.w.requires_grad)
            if not learned and exact_leak_shift(1 / float(torch.sigmoid(m.w.detach().to(dtype))),
                                                dtype) is not None:
                continue
            reason = tau_refusal(tau, learned=True)
            if learned:
                reason = (f"it learns its tau (now {tau:.6g}); a trained tau is rarely a power "
                          f"of two. " + reason)
        else:
            tau = float(m.tau)
            if exact_leak_shift(tau, dtype) is not None:
                continue
            reason = tau_refusal(tau)
        exact = nearest_exact_tau(tau)
        if leak_bits is not None:
            report.notes.append(f"{name}: tau = {tau:.6g} is exported approximately "
                                f"(leak_bits={leak_bits}); the integer network is not exact")
        else:
            report.blockers.append(Blocker(
                "tau", name, reason, f"tau={exact!r} (exact), or to_integer(..., leak_bits=12) "
                                     f"(approximate)"))
        fixes[name] = exact
    return fixes


def _give_exact_tau(work, fixes):
    for name, tau in fixes.items():
        m = work.get_submodule(name)
        if registry.neuron_kind(m).leak == "sigmoid_w":
            with torch.no_grad():
                m.w.fill_(-math.log(tau - 1.0))   # sigmoid(w) = 1 / tau
            m.w.requires_grad_(False)
        else:
            m.tau = float(tau)


def _widest_weights(work):
    """Every quantized layer's weight codes at the end of their range (the largest accumulator
    any training can reach at the present steps)."""
    for m in work.modules():
        if registry.layer_kind(m) is None or getattr(m, "weight_quant", None) is None:
            continue
        # the tensor the weight is computed from (pruned: weight_orig; parametrized: original)
        plist = getattr(getattr(m, "parametrizations", None), "weight", None)
        latent = getattr(plist, "original", None)
        if latent is None:
            latent = getattr(m, "weight_orig", m.weight)
        with torch.no_grad():
            sign = torch.where(latent >= 0, 1.0, -1.0).to(latent.dtype)
            latent.copy_(sign * 1e6 * (latent.abs().max() + 1))


_BATCHNORM_FIX = ("move it right after a Linear/Conv layer (or remove it); otherwise "
                  "fold_batchnorm refuses it, or changes the network at low bits when it folds "
                  "after training")


def _batchnorm_blockers(quant_report, report):
    if quant_report is None:
        return
    for s in quant_report.skipped:
        if "BatchNorm" not in s.old_type:
            continue
        missed = "example_input=x" in s.reason or "whose forward was not captured" in s.reason
        fix = ("pass example_input=x to quantize_model, so that the BatchNorm is found from a run "
               "and trains folded" if missed else
               "QuantConfig(fold_batchnorm=True)" if "fold_batchnorm is False" in s.reason else
               _BATCHNORM_FIX)
        report.blockers.append(Blocker("batchnorm", s.name, s.reason, fix))


def _crop_pow2(x: torch.Tensor) -> Optional[torch.Tensor]:
    """``x`` cropped (centre) to power-of-two sizes in its last two dimensions, or None."""
    if x.dim() < 2:
        return None
    h, w = x.shape[-2:]
    h2, w2 = 2 ** int(math.log2(h)), 2 ** int(math.log2(w))
    if (h2, w2) == (h, w):
        return None
    top, left = (h - h2) // 2, (w - w2) // 2
    return x[..., top:top + h2, left:left + w2]


def _layer_of(text: str) -> str:
    if text.startswith("layer '"):
        return text[7:text.index("'", 7)]
    return ""


def deployability_report(model: nn.Module, example_input: torch.Tensor,
                         destination="c", *, input_max: Optional[int] = None,
                         reference_dtype: Optional[torch.dtype] = None,
                         leak_bits: Optional[int] = None, quant_report=None) -> DeployReport:
    """Every reason ``model`` would be refused by ``destination`` after training, with its fix.

    Args:
        model: the network quantized by :func:`~snnquant.quantize_model` (for a chip
            destination: the float network, which the chip's ``quantize_for_*`` converts).
            It is not modified.
        example_input: one input batch (``[T, N, ...]`` for a multi-step network).
        destination: ``'integer'``, ``'c'`` (the same checks), ``'nir'``, ``'xylo'``,
            ``'loihi'``, ``'speck'``, or a chip profile of :mod:`snnquant.targets`.
        input_max: the largest input event count to check at (default: the largest value of
            ``example_input``, :func:`~snnquant.export.input_max_of`, as
            :func:`~snnquant.export.to_integer` takes it).
        reference_dtype: the float type the export will be exact against (default: the
            model's).
        leak_bits: the ``leak_bits`` the export will use (a :math:`\\tau` that is not a power of
            two is then a note, not a blocker).
        quant_report: :func:`~snnquant.quantize_model`'s report (its BatchNorms that do not
            train folded are blockers).

    Returns:
        A :class:`DeployReport`.
    """
    chip, profile = _check_destination(destination)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(f"example_input must be a tensor (one input batch), got "
                        f"{type(example_input).__name__}")
    # the report runs the model: the caller's random streams (dropout, initialisation) stay
    # where they were, so that a run with the report trains as one without it
    devices = [example_input.device.index or 0] if example_input.is_cuda else []
    with torch.random.fork_rng(devices=devices):
        return _report(model, example_input, chip, profile, input_max, reference_dtype,
                       leak_bits, quant_report)


def _report(model, example_input, chip, profile, input_max, reference_dtype, leak_bits,
            quant_report) -> DeployReport:
    """:func:`deployability_report` on checked arguments."""
    if chip in ("xylo", "loihi", "speck"):
        return _chip_report(model, chip, profile, example_input)
    check_input_max_and_leak_bits(input_max, leak_bits)
    if reference_dtype is None:
        fp = [t.dtype for t in model.parameters() if t.is_floating_point()]
        reference_dtype = fp[0] if fp else torch.float32
    report = DeployReport(chip, input_max=input_max if input_max is not None
                          else input_max_of(example_input),
                          input_max_from="given" if input_max is not None else "example_input",
                          reference_dtype=str(reference_dtype).replace("torch.", ""))
    fixes = _static_leaks(model, reference_dtype, leak_bits, report)
    _batchnorm_blockers(quant_report, report)

    from spikingjelly.activation_based import functional as sjf
    work = copy_model(model).cpu()
    x = example_input.detach().cpu().to(next((t.dtype for t in work.parameters()
                                             if t.is_floating_point()), torch.float32))
    try:  # a run initialises the quantizers' steps, as the first training step would
        with torch.no_grad():
            sjf.reset_net(work)
            work.train()(x)
            sjf.reset_net(work)
    except Exception as err:  # the forward itself fails: nothing else can be checked
        report.blockers.append(Blocker("other", "", f"the model does not run on example_input: "
                                       f"{type(err).__name__}: {err}", "give an input the model "
                                       "accepts ([T, N, ...] for a multi-step network)"))
        return report
    work.eval()
    if quant_report is None:   # the BatchNorms fold_batchnorm will refuse
        try:
            refused = plan_folding(work, x).refused
        except ExportError:
            refused = {}
        for name, reason in refused.items():
            report.blockers.append(Blocker("batchnorm", name, reason, _BATCHNORM_FIX))
    _give_exact_tau(work, fixes)
    _widest_weights(work)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            work = fold_batchnorm(work, example_input=x, on_unfoldable="warn")
        except Exception:  # noqa: BLE001 - left in place; to_integer names it below
            pass
    for name, m in list(work.named_modules()):  # already blockers: let the export go on
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and name:
            parent, _, child = name.rpartition(".")
            setattr(work.get_submodule(parent), child, nn.Identity())
    sjf.invalidate_reset_cache(work)
    dtype, desc, seen = reference_dtype, None, set()
    for _ in range(_MAX_ROUNDS):
        try:
            desc = to_integer(work, example_input=x, input_max=report.input_max,
                              reference_dtype=dtype, leak_bits=leak_bits)
            break
        except CaptureError as err:
            report.blockers.append(Blocker("capture", "", str(err), "change the forward at the "
                                           "place the message names"))
            break
        except Exception as err:  # noqa: BLE001 - a report never stops quantize_model
            if not isinstance(err, ExportError):
                report.blockers.append(Blocker("other", "", f"the export stopped: "
                                               f"{type(err).__name__}: {err}", "see the message"))
                break
            check, text = getattr(err, "check", "other"), str(err)
            key = (check, _layer_of(text))
            if check == "accumulator":
                report.blockers.append(Blocker(check, key[1], text, accumulator_fix(
                    dtype, report.input_max, "input" in text)))
                if dtype == torch.float64:
                    break
                dtype = torch.float64   # the fix it names first: go on as if it were taken
                work = work.double()
                x = x.double()
                continue
            if key in seen:   # its fix did not remove it: reported once, nothing more to learn
                break
            seen.add(key)
            if check == "time_mean" and is_multi_step(work) and x.dim() > 1:
                steps = x.shape[0]
                lower = 2 ** int(math.log2(steps)) if steps > 1 else 1
                report.blockers.append(Blocker(check, key[1], text, (
                    f"T={lower} (or {2 * lower}): the network's T argument and the input's time "
                    f"steps")))
                if lower == steps:
                    break
                x = x[:lower]
                continue
            if check == "mean":
                cropped = _crop_pow2(x)
                size = "x".join(str(s) for s in (cropped.shape[-2:] if cropped is not None
                                                 else ()))
                report.blockers.append(Blocker(check, key[1], text, (
                    f"an input of a power-of-two size: crop it to {size} (the command line's "
                    f"--crop {cropped.shape[-1]})" if cropped is not None else
                    "an input size or pooling that averages a power of two of values")))
                if cropped is None:
                    break
                x = cropped
                continue
            report.blockers.append(Blocker(check, key[1], text, "see the message"))
            break
    if desc is not None and chip == "nir":
        found = nir_refusals(desc)
        for text in found:
            report.blockers.append(Blocker("nir", _layer_of(text), text,
                                           "deploy it as C (destination='c') or with IntegerSNN"))
        if not found:
            shape = tuple(x.shape[2 if is_multi_step(work) else 1:])
            try:
                to_nir(desc, shape, consumers=())
            except ExportError as err:
                report.blockers.append(Blocker("nir", _layer_of(str(err)), str(err),
                                               "deploy it as C (destination='c')"))
    return report


def warn_if_blocked(report: DeployReport, stacklevel: int = 3) -> None:
    """One :class:`DeployabilityWarning` listing the blockers (nothing when there are none)."""
    if not report.ok:
        warnings.warn(str(report), DeployabilityWarning, stacklevel=stacklevel)
