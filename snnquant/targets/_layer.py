"""What every chip layer shares: latent float weights on a power-of-two grid of signed integers,
an optional integer bias, the input delay, the input check, the step modes, and the pieces the
chips' checks and conversions share (:class:`Violation`, the int check, the power-of-two step)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import torch.nn as nn
from spikingjelly.activation_based import base, layer as sj_layer, neuron, surrogate

from .._io import MAX_JSON_BYTES, atomic_write, loads_strict, read_bounded
from ..functional.chip_neurons import surrogate_count
from ..functional.int_limits import check_int  # noqa: F401  (the chip modules' range check)
from ..functional.rounding import round as round_ste
from ..kernels.dispatch import DEFAULT_BACKEND, check_backend_name


def field_violations(layer: str, obj, rules) -> List["Violation"]:
    """A :class:`Violation` for each ``(field, lo, hi)`` of ``rules`` whose value on ``obj`` is
    not an int in ``[lo, hi]`` (the rule :func:`check_int` applies when a layer is built)."""
    found = []
    for field_name, lo, hi in rules:
        value = getattr(obj, field_name, None)
        try:
            check_int(value, lo, hi, field_name)
        except (TypeError, ValueError):
            found.append(Violation(layer, f"{field_name} an int in [{lo}, {hi}]", value))
    return found


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class FileFields:
    """Reads the fields of a chip file's payload (or a spec about to be saved), each by the rule
    the layer applies, refusing the first bad one with a ``ValueError`` that names ``where`` (the
    file) and the field.

    Args:
        where: what to name in the errors (the file's path).
    """

    def __init__(self, where: str):
        self.where = where

    def fail(self, field_name: str, why: str, value) -> None:
        """Raise the ``ValueError`` of ``field_name``."""
        raise ValueError(f"{self.where}: field {field_name!r} {why}, got {_shown(value)}")

    def keys(self, payload, fields, where: str = "") -> dict:
        """``payload`` after checking it is an object with exactly the keys ``fields``."""
        name = where or "<file>"
        if not isinstance(payload, dict):
            self.fail(name, "must be a JSON object", type(payload).__name__)
        missing = [k for k in fields if k not in payload]
        unknown = [k for k in payload if k not in fields]
        if missing:
            self.fail(f"{where}{'.' if where else ''}{missing[0]}", "is missing", sorted(payload))
        if unknown:
            self.fail(f"{where}{'.' if where else ''}{unknown[0]}", "is not a field of this "
                      f"file", payload[unknown[0]])
        return payload

    def int(self, field_name: str, value, lo: int, hi: int) -> int:
        """``value`` as an int in ``[lo, hi]`` (not a bool, a float or a string)."""
        try:
            return check_int(value, lo, hi, field_name)
        except (TypeError, ValueError):
            self.fail(field_name, f"must be an int in [{lo}, {hi}]", value)

    def choice(self, field_name: str, value, options):
        """``value`` when it is one of ``options``."""
        if not isinstance(value, str) or value not in options:
            self.fail(field_name, f"must be one of {list(options)}", value)
        return value

    def array(self, field_name: str, value, lo: int, hi: int, shape=None,
              dtype=np.int64) -> np.ndarray:
        """``value`` (nested lists of ints, or an integer array) as a ``dtype`` array whose
        values are in ``[lo, hi]`` and whose shape is ``shape`` (``None``: any; an entry
        ``None``: any size there)."""
        why = "must be an array of ints (not floats, bools or strings)"
        if isinstance(value, (np.ndarray, torch.Tensor)):
            arr = np.asarray(value)
            if arr.dtype.kind not in "iu":
                self.fail(field_name, why, arr.dtype)
        else:
            try:
                items = np.asarray(value, dtype=object)
            except (ValueError, TypeError):
                self.fail(field_name, why, value)
            if not all(type(v) is int for v in items.ravel()):
                self.fail(field_name, why, value)
            if items.size and not all(-2 ** 63 <= v < 2 ** 63 for v in items.ravel()):
                self.fail(field_name, f"values must be in [{lo}, {hi}]", value)
            arr = items.astype(np.int64)
        if shape is not None and (arr.ndim != len(shape) or any(
                s is not None and s != n for s, n in zip(shape, arr.shape))):
            want = tuple("any" if s is None else s for s in shape)
            self.fail(field_name, f"must have the shape {want}", tuple(arr.shape))
        if arr.size:
            bad = (arr < lo) | (arr > hi)
            if bad.any():
                self.fail(field_name, f"values must be in [{lo}, {hi}]", arr[bad].flat[0].item())
        return arr.astype(dtype)


def pow2_step(w: torch.Tensor, hi: int) -> float:
    r"""The power-of-two step :math:`2^{\lceil \log_2(\max|w| / hi)\rceil}` (1 for zero weights)."""
    m = float(w.detach().abs().max())
    if m == 0.0:
        return 1.0
    return 2.0 ** math.ceil(math.log2(m / hi))


@dataclass(frozen=True)
class Violation:
    """One way a network exceeds a chip's limits.

    Attributes:
        layer: the layer's name in the model (``''`` for the whole network).
        limit: what the chip allows (e.g. ``'hidden neurons <= 1000'``).
        value: what the network has.
    """

    layer: str
    limit: str
    value: object

    def __str__(self) -> str:
        return f"{self.layer or '<network>'}: {self.limit}, got {self.value}"


def refuse(found: List[Violation], what: str) -> None:
    """Raise a ``ValueError`` listing ``found`` (nothing when it is empty)."""
    if found:
        raise ValueError(f"{what}: the network does not fit the chip:\n  "
                         + "\n  ".join(str(v) for v in found))


def chip_layers(model: nn.Module, cls: type, chip: str) -> List[tuple]:
    """``(name, layer)`` of every ``cls`` in ``model``; a ``ValueError`` naming any other module."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, cls)]
    others = [n for n, m in model.named_modules()
              if n and not isinstance(m, (cls, nn.Sequential, nn.Identity))
              and not any(n.startswith(x + ".") for x, _ in layers)]
    if others:
        raise ValueError(f"model: a {chip} network holds only {cls.__name__} modules in one "
                         f"nn.Sequential; found {others}")
    return layers


class ChipLayer(base.MemoryModule):
    """Base of a chip's layer: weights and neurons in one module, stepping in the chip's integers.

    Subclasses define ``_step(c, w, b)`` (one step from the delayed input ``c``, the integer
    weights ``w`` as the chip applies them and the integer bias ``b`` or ``None``),
    ``_multi_step(c_seq, w, b)`` (all steps, through :mod:`snnquant.kernels.chip` with the
    layer's ``backend``) and ``_chip_weight(w)`` (the integer weights as the chip applies them).
    """

    def __init__(self, in_features: int, out_features: int, weight_step: float,
                 weight_range: tuple, bias_range: Optional[tuple], delay: int, input_max: int,
                 surrogate_function, step_mode: str, backend: str = DEFAULT_BACKEND):
        super().__init__()
        #: what runs the ``'m'`` step (:mod:`snnquant.kernels.chip`): ``'auto'``, ``'cpp'``,
        #: ``'cupy'`` or ``'torch'``
        self.backend = check_backend_name(backend)
        self.in_features = check_int(in_features, 1, 2 ** 31, "in_features")
        self.out_features = check_int(out_features, 1, 2 ** 31, "out_features")
        self.delay = check_int(delay, 0, 1, "delay")
        self.input_max = check_int(input_max, 1, 2 ** 15, "input_max")
        if not (isinstance(weight_step, (int, float)) and not isinstance(weight_step, bool)
                and weight_step > 0 and math.log2(weight_step).is_integer()):
            raise ValueError(f"weight_step must be a power of two, got {weight_step!r}")
        self.weight_step = float(weight_step)
        self.weight_range = weight_range
        self.bias_range = bias_range
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        bound = 1.0 / math.sqrt(in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias_range is not None else None
        self.surrogate_function = surrogate_function or surrogate.Sigmoid()
        self.step_mode = step_mode
        #: ``((name, type name), ...)``: the modules of the source network this layer was
        #: converted from (set by the chip's ``quantize_for_*``; empty for a layer built directly).
        self.converted_from: tuple = ()
        self.register_memory("last_input", None)

    def integer_weight(self) -> torch.Tensor:
        r""":math:`W = \mathrm{clamp}(\mathrm{round}(w/\Delta), w_{min}, w_{max})`, the integer
        weights (a float tensor; the rounding passes the gradient straight through inside the
        range, 0 outside)."""
        return round_ste(self.weight / self.weight_step).clamp(*self.weight_range)

    def integer_bias(self) -> Optional[torch.Tensor]:
        """The integer bias (rounded, straight-through; ``None`` without a bias)."""
        if self.bias is None:
            return None
        return round_ste(self.bias).clamp(*self.bias_range)

    def _check_counts(self, x: torch.Tensor) -> None:
        bad = (x < 0) | (x > self.input_max) | (x != torch.floor(x))
        if bool(bad.any()):
            value = x[bad].flatten()[0].item()
            raise ValueError(f"{type(self).__name__}: input event counts must be integers in "
                             f"[0, {self.input_max}] (what the chip carries per step), got "
                             f"{value}")

    def _fire(self, v: torch.Tensor, count: torch.Tensor, threshold: float) -> torch.Tensor:
        """Spikes with the exact ``count`` forward and the surrogate gradient
        :math:`\\sigma'((V - \\theta)/\\theta)/\\theta` backward."""
        return surrogate_count(self.surrogate_function, v, count, threshold)

    def integer_op(self, name: str):
        """The layer as an operation of an :class:`~snnquant.export.IntegerNetwork`
        (:mod:`snnquant.targets`), named ``name``: what
        :func:`~snnquant.export.to_integer` exports a chip network to."""
        raise NotImplementedError

    def _integers(self) -> tuple:
        """``(weight, bias)``: the integer weights (``int8``) and bias (``int64`` or ``None``)."""
        with torch.no_grad():
            w = self.integer_weight().detach().cpu().to(torch.int8)
            b = None if self.bias is None else \
                self.integer_bias().detach().cpu().to(torch.int64)
        return w, b

    def _chip_weight(self, w: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _step(self, c: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        raise NotImplementedError

    def single_step_forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_counts(x)
        if self.delay:
            previous = self.last_input if self.last_input is not None else torch.zeros_like(x)
            self.last_input = x
            x = previous
        return self._step(x, self._chip_weight(self.integer_weight()), self.integer_bias())

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        self._check_counts(x_seq)
        if self.delay and x_seq.shape[0]:
            first = self.last_input if self.last_input is not None else torch.zeros_like(x_seq[0])
            self.last_input = x_seq[-1]
            x_seq = torch.cat([first.unsqueeze(0), x_seq[:-1]])
        return self._multi_step(x_seq, self._chip_weight(self.integer_weight()),
                                self.integer_bias())

    def _multi_step(self, x_seq: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        """All steps from the delayed input; subclasses run :mod:`snnquant.kernels.chip`."""
        raise NotImplementedError


def sources(*modules) -> tuple:
    """``((name, type name), ...)`` of ``(name, module)`` pairs, for
    :attr:`ChipLayer.converted_from`."""
    return tuple((name, type(m).__name__) for name, m in modules)


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, allow_nan=False)
                          .encode()).hexdigest()


def write_checked_json(path, payload: dict, fmt: str) -> None:
    """Write ``payload`` (JSON types only) to ``path`` atomically, with ``"format"`` = ``fmt``,
    ``"format_version"`` 1 and the SHA-256 of the content under ``"sha256"``."""
    payload = dict(payload, format=fmt, format_version=1)
    payload["sha256"] = _digest(payload)
    atomic_write(path, json.dumps(payload, sort_keys=True, allow_nan=False))


def read_checked_json(path, fmt: str) -> dict:
    """The payload of a file written by :func:`write_checked_json` with ``fmt`` (without
    ``format`` and ``format_version``), after verifying its checksum; a ``ValueError`` naming the
    file otherwise (also for a file that is not a regular file, is larger than
    :data:`~snnquant._io.MAX_JSON_BYTES` (64 MiB) or is not strict JSON)."""
    path_s = os.fspath(path)
    what = f"a snnquant {fmt} file of format_version 1"
    try:
        payload = loads_strict(read_bounded(path_s, MAX_JSON_BYTES, f"{fmt} file"), path_s)
        digest = payload.pop("sha256")
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ValueError(f"{path_s}: not {what} ({exc})") from None
    if payload.get("format") != fmt or payload.get("format_version") != 1:
        raise ValueError(f"{path_s}: not {what}")
    if _digest(payload) != digest:
        raise ValueError(f"{path_s}: the content does not match its checksum (changed or corrupt)")
    del payload["format"], payload["format_version"]
    return payload


def linear_neuron_pairs(model: nn.Module, chip: str, v_reset,
                        reset_rule: str) -> List[tuple]:
    """``[((name, Linear), (name, neuron)), ...]`` of an ``nn.Sequential`` of ``Linear`` +
    ``LIFNode``/``IFNode`` pairs (``Flatten``/``Identity`` before the first are skipped).

    Raises:
        TypeError: ``model`` is not an ``nn.Sequential``.
        ValueError: naming the module: any other module, a neuron whose ``v_reset`` is not
            ``v_reset`` (the chip's reset, explained by ``reset_rule``), ``decay_input=False``, a
            network that does not end with a neuron.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential, got {type(model).__name__}")
    pairs, pending, started = [], None, False
    for name, m in model.named_children():
        if isinstance(m, (nn.Flatten, sj_layer.Flatten, nn.Identity)) and not started:
            continue
        if isinstance(m, nn.Linear) and pending is None:
            pending, started = (name, m), True
        elif type(m) in (neuron.LIFNode, neuron.IFNode) and pending is not None:
            if m.v_reset != v_reset:
                raise ValueError(f"model.{name}: {reset_rule}; build the neuron with "
                                 f"v_reset={v_reset}, got v_reset={m.v_reset}")
            if isinstance(m, neuron.LIFNode) and not m.decay_input:
                raise ValueError(f"model.{name}: decay_input=False has no {chip} equivalent")
            pairs.append((pending, (name, m)))
            pending = None
        else:
            raise ValueError(f"model.{name}: a {chip} network is Linear + LIFNode/IFNode pairs; "
                             f"{type(m).__name__} here has no place on the chip")
    if pending is not None or not pairs:
        raise ValueError(f"model: a {chip} network is Linear + LIFNode/IFNode pairs, ending with "
                         f"a neuron")
    return pairs
