r"""Loihi 2's vendor side: the arguments of Lava's ``Dense`` and ``LIF`` processes, their file, and
the run on Lava's fixed-point CPU simulation (in a Python with Lava, through ``lava_runner.py``)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch.nn as nn

from .._layer import FileFields, read_checked_json, refuse, write_checked_json
from .layer import LOIHI2, LoihiProfile, check_loihi, field_rules, loihi_layers

__all__ = ["LoihiSpec", "to_loihi", "save_loihi", "load_loihi", "lava_python", "run_lava"]


@dataclass
class LoihiSpec:
    """A Loihi network as the arguments of Lava's ``Dense`` and ``LIF`` processes, one entry per
    layer: ``weights`` (``[out, in]`` Lava weights :math:`2W`, int16), ``weight_exp``, ``du``,
    ``dv``, ``vth``, ``bias_mant`` (``[out]``) and ``bias_exp`` (``[out]``, the layer's).
    """

    layers: List[dict] = field(default_factory=list)
    profile: str = LOIHI2.name


def to_loihi(model: nn.Module, profile: Optional[LoihiProfile] = None) -> LoihiSpec:
    """The :class:`LoihiSpec` of a stack of :class:`LoihiLIFLayer` (after :func:`check_loihi`),
    built from the layers' operations (:meth:`LoihiLIFLayer.integer_op`): the integers
    :class:`~snnquant.export.IntegerSNN` runs are the ones written for Lava."""
    refuse(check_loihi(model, profile), "to_loihi")
    layers = loihi_layers(model)
    out = []
    for name, m in layers:
        op = m.integer_op(name)
        w = 2 * op.weight.numpy().astype(np.int16)
        b = (op.bias.numpy().astype(np.int16) if op.bias is not None
             else np.zeros(op.out_shape[0], np.int16))
        out.append({"weights": w, "weight_exp": op.weight_exp, "du": op.du, "dv": op.dv,
                    "vth": op.vth, "bias_mant": b,
                    "bias_exp": np.full(op.out_shape[0], op.bias_exp, np.int16)})
    return LoihiSpec(out, profile=layers[0][1].profile.name)


_ARRAYS = ("weights", "bias_mant", "bias_exp")
_INTS = ("weight_exp", "du", "dv", "vth")


def _checked_spec(payload: dict, where: str) -> LoihiSpec:
    """The :class:`LoihiSpec` of a file's ``payload`` (or of a spec's fields), every field checked
    by the rules the layers apply (:func:`~snnquant.targets.loihi.layer.field_rules`, the
    profile's ranges) and each layer's shape against the one before; a ``ValueError`` naming
    ``where`` and the first bad field."""
    f = FileFields(where)
    f.keys(payload, ("layers", "profile"))
    if payload["profile"] != LOIHI2.name:
        f.fail("profile", f"must be {LOIHI2.name!r}", payload["profile"])
    p, rules = LOIHI2, {name: (lo, hi) for name, lo, hi in field_rules(LOIHI2)}
    if not isinstance(payload["layers"], list) or not payload["layers"]:
        f.fail("layers", "must be a non-empty list of layers", payload["layers"])
    lo, hi = p.weight_range
    layers, n_in, neurons = [], None, 0
    for k, layer in enumerate(payload["layers"]):
        f.keys(layer, _ARRAYS + _INTS, f"layers[{k}]")
        name = f"layers[{k}]."
        w = f.array(name + "weights", layer["weights"], 2 * lo, 2 * hi, (None, n_in), np.int16)
        if w.shape[0] < 1 or w.shape[1] < 1:
            f.fail(name + "weights", "must be [out, in] with out, in >= 1", tuple(w.shape))
        if (w % 2).any():
            f.fail(name + "weights", "must be even (Lava's weights are 2W)", w[w % 2 != 0][0])
        out = w.shape[0]
        neurons += out
        entry = {"weights": w,
                 "bias_mant": f.array(name + "bias_mant", layer["bias_mant"], *p.bias_range,
                                      (out,), np.int16),
                 "bias_exp": f.array(name + "bias_exp", layer["bias_exp"],
                                     *rules["bias_exp"], (out,), np.int16)}
        entry.update({key: f.int(name + key, layer[key], *rules[key]) for key in _INTS})
        layers.append(entry)
        n_in = out
    f.int("layers (their neurons)", neurons, 1, p.max_neurons)
    return LoihiSpec(layers, profile=payload["profile"])


def save_loihi(spec: LoihiSpec, path) -> None:
    """Write ``spec`` to ``path`` as JSON (integers only), atomically, with its SHA-256.

    Raises:
        TypeError: ``spec`` is not a :class:`LoihiSpec`.
        ValueError: naming the file and the field, for a field the chip cannot take (the rules
            of :func:`load_loihi`); nothing is written then.
    """
    if not isinstance(spec, LoihiSpec):
        raise TypeError(f"spec must be a LoihiSpec, got {type(spec).__name__}")
    spec = _checked_spec({"layers": list(spec.layers), "profile": spec.profile},
                         f"save_loihi({os.fspath(path)})")
    layers = [{**{k: np.asarray(l[k]).tolist() for k in _ARRAYS},
               **{k: int(l[k]) for k in _INTS}} for l in spec.layers]
    write_checked_json(path, {"layers": layers, "profile": spec.profile}, "snnquant-loihi")


def load_loihi(path) -> LoihiSpec:
    """Read a file written by :func:`save_loihi`, after verifying its checksum, then every field
    by the rules the layers apply.

    Raises:
        ValueError: naming the file, when it is not such a file (strict JSON, a regular file
            under the size bound) or its content changed, and naming the field, for a value out
            of its range, of the wrong type or of the wrong shape.
    """
    return _checked_spec(read_checked_json(path, "snnquant-loihi"), os.fspath(path))


def lava_python(python: Optional[str] = None) -> Optional[str]:
    """The Python that runs Lava: ``python`` when given (``''`` for none), else
    ``$SNNQUANT_LAVA_PYTHON``; ``None`` when neither names one."""
    exe = python if python is not None else os.environ.get("SNNQUANT_LAVA_PYTHON")
    return exe or None


def run_lava(spec: LoihiSpec, raster, python: Optional[str] = None, timeout: float = 3600) -> dict:
    """Run ``spec`` on Lava's fixed-point CPU simulation (``Loihi2SimCfg(select_tag="fixed_pt")``).

    Args:
        spec: the network.
        raster: 0/1 input spikes ``[T, n_in]`` or ``[N, T, n_in]``; each sample runs from a reset
            state.
        python: a Python with ``lava-nc`` installed (Lava needs Python <= 3.10); default
            ``$SNNQUANT_LAVA_PYTHON``.
        timeout: seconds.

    Returns:
        ``{"layers": [[N, T, n_k] spikes of each layer]}`` (``N`` absent for a 2-D raster): the
        first ``T`` steps of each layer, as :class:`LoihiLIFLayer` computes them over ``T``
        steps (every layer delivers one step later, so the last layers' later spikes need
        steps beyond ``T``, which Lava runs and this drops).

    Raises:
        RuntimeError: without a Lava Python, or when Lava fails (its output in the message).
    """
    exe = lava_python(python)
    if exe is None:
        raise RuntimeError("run_lava needs a Python with Lava (lava-nc needs Python <= 3.10): "
                           "pass python= or set SNNQUANT_LAVA_PYTHON; see the Loihi guide")
    x = np.asarray(raster)
    single = x.ndim == 2
    if single:
        x = x[None]
    n_in = spec.layers[0]["weights"].shape[1]
    if x.ndim != 3 or x.shape[2] != n_in:
        raise ValueError(f"raster must be [T, {n_in}] or [N, T, {n_in}], got shape "
                         f"{np.shape(raster)}")
    if not np.isin(x, (0, 1)).all():
        raise ValueError("raster: Lava's Dense takes 0/1 spikes")
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lava_runner.py")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        arrays = {"raster": x.astype(np.int8), "n_layers": len(spec.layers)}
        for k, l in enumerate(spec.layers):
            arrays.update({f"w{k}": np.asarray(l["weights"], np.int32),
                           f"weight_exp{k}": l["weight_exp"], f"du{k}": l["du"],
                           f"dv{k}": l["dv"], f"vth{k}": l["vth"],
                           f"bias_mant{k}": np.asarray(l["bias_mant"], np.int32),
                           f"bias_exp{k}": np.asarray(l["bias_exp"], np.int32)})
        np.savez(src, **arrays)
        done = subprocess.run([exe, runner, src, dst], capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"Lava ({exe}) failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        with np.load(dst) as out:
            t = x.shape[1]
            layers = [out[f"s{k}"][:, :t].astype(np.int64) for k in range(len(spec.layers))]
    return {"layers": [l[0] for l in layers] if single else layers}
