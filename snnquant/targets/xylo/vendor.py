r"""Xylo's vendor side: the specification that Rockpool's ``XyloSim`` (SynSense's ``xylosim``)
and ``config_from_specification`` take, its file, and the run on SynSense's simulator."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch.nn as nn

from .._layer import FileFields, read_checked_json, refuse, write_checked_json
from .layer import XYLO_AUDIO2, XyloProfile, check_xylo, field_rules, xylo_layers
from .op import XyloLayerOp

__all__ = ["XyloSpec", "to_xylo", "save_xylo", "load_xylo", "run_xylosim"]


# ---- the specification --------------------------------------------------------------------------
_SPEC_ARRAYS = ("weights_in", "weights_rec", "weights_out", "dash_mem", "dash_mem_out",
                "dash_syn", "dash_syn_out", "threshold", "threshold_out", "bias", "bias_out")
_SPEC_INTS = ("weight_shift_in", "weight_shift_rec", "weight_shift_out")


@dataclass
class XyloSpec:
    """A Xylo network as the keyword arguments of Rockpool's
    ``devices.xylo.syns61201.XyloSim.from_specification`` (and, with ``bias`` renamed
    ``bias_hidden``, of ``config_from_specification``): integer arrays, hidden neurons first
    layer first.

    Attributes:
        weights_in: ``[Nin, Nhidden]`` int8.
        weights_rec: ``[Nhidden, Nhidden]`` int8 (the hidden layers after the first).
        weights_out: ``[Nhidden, Nout]`` int8.
        dash_mem, dash_syn, threshold, bias: per hidden neuron.
        dash_mem_out, dash_syn_out, threshold_out, bias_out: per readout neuron.
        weight_shift_in, weight_shift_rec, weight_shift_out: the three weight shifts.
        hidden_sizes: the hidden layers' sizes (how the hidden population is split).
        profile: the chip's name.
    """

    weights_in: np.ndarray
    weights_rec: np.ndarray
    weights_out: np.ndarray
    dash_mem: np.ndarray
    dash_mem_out: np.ndarray
    dash_syn: np.ndarray
    dash_syn_out: np.ndarray
    threshold: np.ndarray
    threshold_out: np.ndarray
    bias: np.ndarray
    bias_out: np.ndarray
    weight_shift_in: int
    weight_shift_rec: int
    weight_shift_out: int
    hidden_sizes: List[int] = field(default_factory=list)
    profile: str = XYLO_AUDIO2.name

    def as_kwargs(self) -> dict:
        """The keyword arguments of Rockpool's ``XyloSim.from_specification``."""
        kw = {k: getattr(self, k) for k in _SPEC_ARRAYS + _SPEC_INTS}
        if not (self.bias.any() or self.bias_out.any()):
            kw["bias"] = kw["bias_out"] = None
        return kw


def to_xylo(model: nn.Module, profile: Optional[XyloProfile] = None) -> XyloSpec:
    """The :class:`XyloSpec` of a stack of :class:`XyloLIFLayer` (after :func:`check_xylo`), built
    from the layers' operations (:meth:`XyloLIFLayer.integer_op`): the integers
    :class:`~snnquant.export.IntegerSNN` runs are the ones written for the chip.

    Raises:
        ValueError: listing every limit the network exceeds.
    """
    refuse(check_xylo(model, profile), "to_xylo")
    layers = xylo_layers(model)
    ops = [m.integer_op(name) for name, m in layers]
    return _spec_of_ops(ops, layers[-1][1].profile.name)


def _spec_of_ops(ops: List[XyloLayerOp], profile: str) -> XyloSpec:
    """The :class:`XyloSpec` of a Xylo network's operations: hidden layers first, the readout
    last."""
    hidden, readout = ops[:-1], ops[-1]
    sizes = [op.out_shape[0] for op in hidden]
    n_h = sum(sizes)
    starts = np.cumsum([0] + sizes)

    def ints(op):
        w = op.weight.numpy().astype(np.int8)
        b = (op.bias.numpy().astype(np.int64) if op.bias is not None
             else np.zeros(op.out_shape[0], np.int64))
        return w, b

    w_in = np.zeros((hidden[0].in_shape[0], n_h), np.int8)
    w_rec = np.zeros((n_h, n_h), np.int8)
    bias = np.zeros(n_h, np.int64)
    for k, op in enumerate(hidden):
        w, b = ints(op)
        cols = slice(starts[k], starts[k + 1])
        if k == 0:
            w_in[:, cols] = w.T
        else:
            w_rec[starts[k - 1]:starts[k], cols] = w.T
        bias[cols] = b
    w_o, b_o = ints(readout)
    w_out = np.zeros((n_h, readout.out_shape[0]), np.int8)
    w_out[starts[-2]:, :] = w_o.T

    def per_neuron(attr, group):
        return np.concatenate([np.full(op.out_shape[0], getattr(op, attr), np.int64)
                               for op in group])

    return XyloSpec(
        weights_in=w_in, weights_rec=w_rec, weights_out=w_out,
        dash_mem=per_neuron("dash_mem", hidden), dash_mem_out=per_neuron("dash_mem", [readout]),
        dash_syn=per_neuron("dash_syn", hidden), dash_syn_out=per_neuron("dash_syn", [readout]),
        threshold=per_neuron("threshold", hidden),
        threshold_out=per_neuron("threshold", [readout]),
        bias=bias, bias_out=b_o,
        weight_shift_in=hidden[0].weight_shift,
        weight_shift_rec=hidden[1].weight_shift if len(hidden) > 1 else 0,
        weight_shift_out=readout.weight_shift, hidden_sizes=sizes, profile=profile)


def _checked_spec(payload: dict, where: str) -> XyloSpec:
    """The :class:`XyloSpec` of a file's ``payload`` (or of a spec's fields), every field checked
    by the rules the layers apply (:func:`~snnquant.targets.xylo.layer.field_rules`, the
    profile's ranges) and every shape against the others; a ``ValueError`` naming ``where`` and
    the first bad field."""
    f = FileFields(where)
    f.keys(payload, _SPEC_ARRAYS + _SPEC_INTS + ("hidden_sizes", "profile"))
    if payload["profile"] != XYLO_AUDIO2.name:
        f.fail("profile", f"must be {XYLO_AUDIO2.name!r}", payload["profile"])
    p = XYLO_AUDIO2
    sizes = payload["hidden_sizes"]
    if not isinstance(sizes, list) or not sizes:
        f.fail("hidden_sizes", "must be a non-empty list of ints", sizes)
    sizes = [f.int(f"hidden_sizes[{i}]", s, 1, p.max_hidden) for i, s in enumerate(sizes)]
    n_h = f.int("hidden_sizes (their sum)", sum(sizes), 1, p.max_hidden)
    rules = {name: (lo, hi) for name, lo, hi in field_rules(p)}
    w_lo, w_hi = p.weight_range
    w_in = f.array("weights_in", payload["weights_in"], w_lo, w_hi, (None, n_h), np.int8)
    f.int("weights_in (its rows: input channels)", w_in.shape[0], 1, p.max_inputs)
    w_out = f.array("weights_out", payload["weights_out"], w_lo, w_hi, (n_h, None), np.int8)
    n_out = f.int("weights_out (its columns: readout neurons)", w_out.shape[1], 1,
                  p.max_outputs)
    arrays = {"weights_in": w_in, "weights_out": w_out,
              "weights_rec": f.array("weights_rec", payload["weights_rec"], w_lo, w_hi,
                                     (n_h, n_h), np.int8)}
    for name, key, lo_hi in (("dash_mem", "dash_mem", rules["dash_mem"]),
                             ("dash_syn", "dash_syn", rules["dash_syn"]),
                             ("threshold", "threshold", rules["threshold"]),
                             ("bias", "bias", p.state_range)):
        arrays[key] = f.array(key, payload[key], *lo_hi, (n_h,))
        arrays[key + "_out"] = f.array(key + "_out", payload[key + "_out"], *lo_hi, (n_out,))
    shifts = {k: f.int(k, payload[k], *rules["weight_shift"]) for k in _SPEC_INTS}
    return XyloSpec(**arrays, **shifts, hidden_sizes=sizes, profile=payload["profile"])


def save_xylo(spec: XyloSpec, path) -> None:
    """Write ``spec`` to ``path`` as JSON (integers only), atomically, with the SHA-256 of its
    content under ``"sha256"``.

    Raises:
        TypeError: ``spec`` is not a :class:`XyloSpec`.
        ValueError: naming the file and the field, for a field the chip cannot take (the rules
            of :func:`load_xylo`); nothing is written then.
    """
    if not isinstance(spec, XyloSpec):
        raise TypeError(f"spec must be a XyloSpec, got {type(spec).__name__}")
    where = f"save_xylo({os.fspath(path)})"
    fields = {k: getattr(spec, k) for k in _SPEC_ARRAYS + _SPEC_INTS}
    fields.update(hidden_sizes=list(spec.hidden_sizes), profile=spec.profile)
    checked = _checked_spec(fields, where)
    payload = {k: np.asarray(getattr(checked, k)).tolist() for k in _SPEC_ARRAYS}
    payload.update({k: int(getattr(checked, k)) for k in _SPEC_INTS})
    payload.update(hidden_sizes=[int(s) for s in checked.hidden_sizes], profile=checked.profile)
    write_checked_json(path, payload, "snnquant-xylo")


def load_xylo(path) -> XyloSpec:
    """Read a file written by :func:`save_xylo`, after verifying its checksum, then every field
    by the rules the layers apply (a checksum anyone can recompute proves no more than that the
    file is whole).

    Raises:
        ValueError: naming the file, when it is not such a file (strict JSON: no ``NaN``, no
            duplicate keys; a regular file of at most
            :data:`~snnquant._io.MAX_JSON_BYTES` bytes, 64 MiB) or its content changed, and
            naming the field, for a value out of its range, of the wrong type or of the wrong
            shape.
    """
    return _checked_spec(read_checked_json(path, "snnquant-xylo"), os.fspath(path))


# ---- the vendor's simulator ---------------------------------------------------------------------
def _rockpool_xylosim():
    """Rockpool's ``XyloSim`` class for Xylo Audio 2.

    Rockpool 3.1's ``rockpool.devices.xylo`` package imports ``samna`` (SynSense's device
    driver, not on the package index) at import time, for hardware modules that have nothing to
    do with the simulator. The modules the simulator needs (``syns61201.xylo_sim`` and the
    ``syns61300.xylo_sim`` it extends) import only Rockpool, numpy and ``xylosim``, so they are
    imported here with their packages' ``__init__`` files skipped.
    """
    import importlib
    import sys
    import types

    try:
        import rockpool.devices as devices
    except ImportError as exc:
        raise ImportError("run_xylosim needs Rockpool and xylosim: pip install "
                          "'snnquant[xylo]'") from exc
    root = os.path.join(os.path.dirname(devices.__file__), "xylo")
    for name, folder in (("rockpool.devices.xylo", root),
                         ("rockpool.devices.xylo.syns61300", os.path.join(root, "syns61300")),
                         ("rockpool.devices.xylo.syns61201", os.path.join(root, "syns61201"))):
        if name not in sys.modules:
            shell = types.ModuleType(name)
            shell.__path__ = [folder]
            sys.modules[name] = shell
    return importlib.import_module("rockpool.devices.xylo.syns61201.xylo_sim").XyloSim


def run_xylosim(spec: XyloSpec, raster) -> dict:
    """Run ``spec`` on SynSense's simulator through Rockpool's ``XyloSim.from_specification``.

    Args:
        spec: the network.
        raster: input event counts ``[T, Nin]`` or ``[N, T, Nin]`` (integers, 0 to 15); each
            sample starts from a reset state.

    Returns:
        ``{"output": [N, T, Nout] readout spikes, "hidden": [N, T, Nhidden] hidden spike counts}``
        (int64 arrays; ``N`` absent when ``raster`` was 2-D).
    """
    sim_cls = _rockpool_xylosim()
    x = np.asarray(raster)
    single = x.ndim == 2
    if single:
        x = x[None]
    if x.ndim != 3 or x.shape[2] != spec.weights_in.shape[0]:
        raise ValueError(f"raster must be [T, {spec.weights_in.shape[0]}] or "
                         f"[N, T, {spec.weights_in.shape[0]}], got shape {np.shape(raster)}")
    if (x < 0).any() or (x > XYLO_AUDIO2.max_input_events).any() or (x != np.round(x)).any():
        raise ValueError("raster: event counts must be integers in [0, 15]")
    sim = sim_cls.from_specification(**spec.as_kwargs())
    outs, hids = [], []
    for sample in x.astype(np.int64):
        sim.reset_state()
        out, _, rec = sim(sample, record=True)
        outs.append(np.asarray(out, np.int64))
        hids.append(np.asarray(rec["Spikes"], np.int64))
    out, hid = np.stack(outs), np.stack(hids)
    return {"output": out[0], "hidden": hid[0]} if single else {"output": out, "hidden": hid}
