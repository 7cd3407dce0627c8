r"""Speck's vendor side: the layers as Sinabs' ``DynapcnnNetwork`` takes them, their file, and the
run on Sinabs' simulation (in a Python with Sinabs, through ``sinabs_script.py``)."""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch.nn as nn

from .._layer import FileFields, read_checked_json, refuse, write_checked_json
from .layer import SPECK2F, SpeckProfile, check_speck, conv_out, field_rules, speck_layers
from .op import KERNEL_RANGE, SPIKES

__all__ = ["SpeckSpec", "to_speck", "save_speck", "load_speck", "sinabs_python", "run_sinabs",
           "sinabs_runner"]


@dataclass
class SpeckSpec:
    """A Speck network as the layers Sinabs' ``DynapcnnNetwork`` takes, one entry per layer:
    ``kind`` (``'conv'`` or ``'linear'``), ``weight`` (int8: ``[out, c, k, k]`` or
    ``[out, in]``), ``bias`` (``[out]`` int16, or ``None``), ``threshold``, ``min_v_mem``,
    ``stride``, ``padding``, ``pool`` and ``spike``; ``input_shape`` (``(c, h, w)``) and the
    ``device`` Sinabs maps onto.
    """

    layers: List[dict] = field(default_factory=list)
    input_shape: tuple = ()
    profile: str = SPECK2F.name
    device: str = SPECK2F.device


def to_speck(model: nn.Module, profile: Optional[SpeckProfile] = None, *,
             steps: Optional[int] = None) -> SpeckSpec:
    """The :class:`SpeckSpec` of a stack of :class:`SpeckIAFLayer` (after :func:`check_speck`,
    with ``steps``, the run's number of time steps, when given), built from the layers'
    operations (:meth:`SpeckIAFLayer.integer_op`): the integers
    :class:`~snnquant.export.IntegerSNN` runs are the ones written for Sinabs."""
    refuse(check_speck(model, profile, steps=steps), "to_speck")
    layers = speck_layers(model)
    out = []
    for name, m in layers:
        op = m.integer_op(name)
        b = op.bias.numpy().astype(np.int16) if op.bias is not None else None
        out.append({"kind": "linear" if op.linear else "conv",
                    "weight": op.weight.numpy().astype(np.int8), "bias": b,
                    "threshold": op.threshold, "min_v_mem": op.v_min, "stride": op.stride,
                    "padding": op.padding, "pool": op.pool, "spike": op.spike})
    p = layers[0][1].profile
    return SpeckSpec(out, tuple(layers[0][1].in_shape), p.name, p.device)


_SCALARS = ("threshold", "min_v_mem", "stride", "padding", "pool")


_LAYER_KEYS = ("kind", "spike", "weight", "bias") + _SCALARS


def _checked_spec(payload: dict, where: str) -> SpeckSpec:
    """The :class:`SpeckSpec` of a file's ``payload`` (or of a spec's fields), every field checked
    by the rules the layers apply (:func:`~snnquant.targets.speck.layer.field_rules`, the
    profile's ranges) and each layer's shape against what the one before sends; a ``ValueError``
    naming ``where`` and the first bad field."""
    f = FileFields(where)
    f.keys(payload, ("layers", "input_shape", "profile", "device"))
    p = SPECK2F
    if payload["profile"] != p.name:
        f.fail("profile", f"must be {p.name!r}", payload["profile"])
    if payload["device"] != p.device:
        f.fail("device", f"must be {p.device!r}", payload["device"])
    shape = f.array("input_shape", payload["input_shape"], 1, 2 ** 16, (3,))
    shape = tuple(int(v) for v in shape)
    if not isinstance(payload["layers"], list) or not payload["layers"]:
        f.fail("layers", "must be a non-empty list of layers", payload["layers"])
    rules = {name: (lo, hi) for name, lo, hi in field_rules(p)}
    lo, hi = p.weight_range
    layers = []
    for k, layer in enumerate(payload["layers"]):
        name = f"layers[{k}]."
        f.keys(layer, _LAYER_KEYS, f"layers[{k}]")
        kind = f.choice(name + "kind", layer["kind"], ("conv", "linear"))
        entry = {"kind": kind, "spike": f.choice(name + "spike", layer["spike"], SPIKES)}
        entry.update({key: f.int(name + key, layer[key], *rules[key]) for key in rules})
        entry["min_v_mem"] = f.int(name + "min_v_mem", layer["min_v_mem"], p.v_min, p.v_min)
        if kind == "linear":
            for key, want in (("stride", 1), ("padding", 0), ("pool", 1)):
                f.int(name + key, entry[key], want, want)
            w = f.array(name + "weight", layer["weight"], lo, hi, (None, math.prod(shape)),
                        np.int8)
            out_shape = (w.shape[0], 1, 1)
        else:
            w = f.array(name + "weight", layer["weight"], lo, hi, (None, shape[0], None, None),
                        np.int8)
            ks = f.int(name + "weight (its kernel size)", w.shape[2], *KERNEL_RANGE)
            f.int(name + "weight (a square kernel)", w.shape[3], ks, ks)
            h, wd = (conv_out(v, ks, entry["stride"], entry["padding"]) for v in shape[1:])
            if h < 1 or wd < 1 or h % entry["pool"] or wd % entry["pool"]:
                f.fail(name + "pool", f"must divide the convolution's output {h}x{wd} (at "
                                      f"least 1x1)", entry["pool"])
            out_shape = (w.shape[0], h // entry["pool"], wd // entry["pool"])
        if w.shape[0] < 1:
            f.fail(name + "weight", "must have at least one output", tuple(w.shape))
        entry["weight"] = w
        entry["bias"] = None if layer["bias"] is None else f.array(
            name + "bias", layer["bias"], *p.bias_range, (w.shape[0],), np.int16)
        layers.append(entry)
        shape = out_shape
    return SpeckSpec(layers, tuple(int(v) for v in payload["input_shape"]), payload["profile"],
                     payload["device"])


def save_speck(spec: SpeckSpec, path) -> None:
    """Write ``spec`` to ``path`` as JSON (integers only), atomically, with its SHA-256.

    Raises:
        TypeError: ``spec`` is not a :class:`SpeckSpec`.
        ValueError: naming the file and the field, for a field the chip cannot take (the rules
            of :func:`load_speck`); nothing is written then.
    """
    if not isinstance(spec, SpeckSpec):
        raise TypeError(f"spec must be a SpeckSpec, got {type(spec).__name__}")
    spec = _checked_spec({"layers": list(spec.layers), "input_shape": list(spec.input_shape),
                          "profile": spec.profile, "device": spec.device},
                         f"save_speck({os.fspath(path)})")
    layers = [{"kind": l["kind"], "spike": l["spike"],
               "weight": np.asarray(l["weight"]).tolist(),
               "bias": None if l["bias"] is None else np.asarray(l["bias"]).tolist(),
               **{k: int(l[k]) for k in _SCALARS}} for l in spec.layers]
    write_checked_json(path, {"layers": layers, "input_shape": list(spec.input_shape),
                              "profile": spec.profile, "device": spec.device}, "snnquant-speck")


def load_speck(path) -> SpeckSpec:
    """Read a file written by :func:`save_speck`, after verifying its checksum, then every field
    by the rules the layers apply.

    Raises:
        ValueError: naming the file, when it is not such a file (strict JSON, a regular file
            under the size bound) or its content changed, and naming the field, for a value out
            of its range, of the wrong type or of the wrong shape.
    """
    return _checked_spec(read_checked_json(path, "snnquant-speck"), os.fspath(path))


def sinabs_python(python: Optional[str] = None) -> Optional[str]:
    """The Python that runs Sinabs: ``python`` when given (``''`` for none), else
    ``$SNNQUANT_SINABS_PYTHON``; ``None`` when neither names one."""
    exe = python if python is not None else os.environ.get("SNNQUANT_SINABS_PYTHON")
    return exe or None


def run_sinabs(spec: SpeckSpec, events, python: Optional[str] = None,
               timeout: float = 3600) -> dict:
    """Run ``spec`` through Sinabs' ``DynapcnnNetwork`` (``discretize=True``): its mapping of the
    layers onto the chip's cores and its simulation.

    Args:
        spec: the network.
        events: input event counts ``[T, c, h, w]`` or ``[N, T, c, h, w]`` (non-negative
            integers); each sample starts from a reset state.
        python: a Python with ``sinabs`` 3.1 installed; default ``$SNNQUANT_SINABS_PYTHON``.
        timeout: seconds.

    Returns:
        A dict: ``"layers"``, what each layer sends (``[N, T, ...]`` spike counts after its
        pooling; ``[N, T, features]`` for a linear layer; ``N`` absent for a 4-D input);
        ``"cores"``, the core Sinabs assigned to each layer; ``"memory"``, each layer's
        ``kernel``, ``neuron`` and ``bias`` memory as Sinabs counts it.

    Raises:
        RuntimeError: without a Sinabs Python, or when Sinabs fails (its output in the message),
            including when its discretisation would change the exported integers or it finds no
            mapping onto the cores.
    """
    exe = sinabs_python(python)
    if exe is None:
        raise RuntimeError("run_sinabs needs a Python with Sinabs (sinabs 3.1 pins nir <= 1.0.4: "
                           "keep it apart): pass python= or set SNNQUANT_SINABS_PYTHON; see the "
                           "Speck guide")
    x = np.asarray(events)
    single = x.ndim == 4
    if single:
        x = x[None]
    if x.ndim != 5 or tuple(x.shape[2:]) != tuple(spec.input_shape):
        raise ValueError(f"events must be [T, {', '.join(map(str, spec.input_shape))}] or "
                         f"[N, T, ...], got shape {np.shape(events)}")
    if (x < 0).any() or (x != np.round(x)).any():
        raise ValueError("events: event counts must be non-negative integers")
    arrays = {"x": x.astype(np.float32), "input_shape": np.asarray(spec.input_shape),
              "n_layers": len(spec.layers), "device": spec.device, "exact": 1}
    for k, l in enumerate(spec.layers):
        arrays.update({f"kind{k}": int(l["kind"] == "linear"),
                       f"w{k}": np.asarray(l["weight"], np.int32),
                       f"multi{k}": int(l["spike"] == "multi"),
                       **{f"{s}{k}": int(l[s]) for s in _SCALARS}})
        if l["bias"] is not None:
            arrays[f"b{k}"] = np.asarray(l["bias"], np.int32)
    out = sinabs_runner(arrays, exe, timeout)
    layers = []
    for k, l in enumerate(spec.layers):
        s = out[f"s{k}"].astype(np.int64)
        layers.append(s.reshape(s.shape[:2] + (-1,)) if l["kind"] == "linear" else s)
    cores = [int(out[f"core{k}"]) for k in range(len(spec.layers))]
    memory = [{key: int(out[f"{key}{k}"]) for key in ("kernel", "neuron", "bias")}
              for k in range(len(spec.layers))]
    return {"layers": [l[0] for l in layers] if single else layers, "cores": cores,
            "memory": memory}


def sinabs_runner(arrays: dict, python: str, timeout: float = 3600) -> dict:
    """Run ``snnquant/targets/speck/sinabs_script.py`` in ``python`` on ``arrays`` (the input file's
    content, see that script) and return its output arrays.

    Raises:
        RuntimeError: when the script fails (its output in the message).
    """
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sinabs_script.py")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, **arrays)
        done = subprocess.run([python, runner, src, dst], capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"Sinabs ({python}) failed:\n{done.stdout[-2000:]}"
                               f"{done.stderr[-4000:]}")
        with np.load(dst) as out:
            return {k: out[k] for k in out.files}
