r"""Intel Loihi 2 through Lava: the fixed-point LIF and Dense arithmetic of Lava's ``fixed_pt``
process models, training in it, and export to Lava processes checked on Lava's CPU simulation.

**The arithmetic** (Lava 0.10, ``lava/proc/lif/models.py`` ``AbstractPyLifModelFixed`` and
``PyLifModelBitAcc``, ``lava/proc/dense/models.py`` ``AbstractPyDenseModelBitAcc``,
``lava/utils/weightutils.py``; tested against Lava's own run in ``tests/test_targets_loihi.py``).
Per step, for a ``Dense`` layer with Lava weights :math:`w` (``num_weight_bits=8``, mixed signs:
even integers in :math:`[-256, 254]`, i.e. :math:`w = 2W` with an 8-bit :math:`W`, except that
a layer whose weights are all :math:`\le 0` runs in Lava's inhibitory sign mode, where
:math:`-256` becomes :math:`-255`: :func:`~snnquant.functional.chip_neurons.lava_weight`), weight
exponent :math:`e`, and its ``LIF`` neurons with current :math:`u`, voltage :math:`v` (24-bit),
decays :math:`d_u, d_v` (12-bit), threshold mantissa :math:`\vartheta` (17-bit), bias
:math:`b` (``bias_mant << bias_exp``):

* ``Dense`` sends the activation it computed on the previous step, :math:`a = (w\,s) \ll e`
  (:math:`\gg -e`, an arithmetic shift, for :math:`e < 0`), from the spikes :math:`s` it received
  then: every layer delivers one step later;
* :math:`u \leftarrow \mathrm{wrap}_{24}(\mathrm{sign}(u)\lfloor |u (4096 - d_u - 1)| / 4096
  \rfloor + (a \ll 6))` (``ds_offset`` = 1; one wrap modulo :math:`2^{24}`);
* :math:`v \leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v (4096 - d_v)| / 4096 \rfloor + u
  + b,\ -2^{23} + 1,\ 2^{23} - 1)`;
* spike where :math:`v > \vartheta \ll 6`, then :math:`v \leftarrow 0` (:math:`u` is kept).

Lava's docstring states that ``PyLifModelBitAcc`` "mimics Loihi behaviour bit-by-bit"; it runs on
the CPU with ``Loihi2SimCfg(select_tag="fixed_pt")``. Refractory periods and axonal delays (which
that model lacks) are not used.

**The network snnquant maps onto it**: a stack of :class:`LoihiLIFLayer` (a ``Dense`` and its
``LIF``), spikes in, spikes out, each layer one step of delay. Lava needs Python <= 3.10
(lava-nc 0.10); :func:`run_lava` runs the exported network in such a Python
(``SNNQUANT_LAVA_PYTHON`` or its ``python`` argument) through ``snnquant/targets/lava_runner.py``.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
import torch.nn as nn
from spikingjelly.activation_based import neuron

from ..export.ir.chip_ops import LoihiLayerOp
from ..functional.chip_neurons import lava_weight, loihi_lif_step
from ..kernels.chip import loihi_lif_multi_step
from ..functional.int_limits import int_range
from ._layer import (ChipLayer, FileFields, Violation, check_int, chip_layers,
                     field_violations, linear_neuron_pairs, pow2_step, read_checked_json, refuse,
                     sources, write_checked_json)

__all__ = ["LoihiProfile", "LOIHI2", "LoihiLIFLayer", "check_loihi", "quantize_for_loihi",
           "LoihiSpec", "to_loihi", "save_loihi", "load_loihi", "run_lava"]


@dataclass(frozen=True)
class LoihiProfile:
    """What Loihi 2 (as Lava's fixed-point models compute it) fixes.

    Attributes:
        name: ``'loihi2'``.
        weight_bits: the signed weight width :math:`W` (Lava's weight :math:`2W`,
            ``num_weight_bits=8`` with mixed signs).
        weight_exp_range: ``Dense``'s ``weight_exp``.
        decay_range: ``du``, ``dv`` (12-bit unsigned, ``PyLifModelBitAcc``'s docstring).
        vth_range: the threshold mantissa (17-bit unsigned).
        bias_range: ``bias_mant`` (13-bit signed).
        bias_exp_range: ``bias_exp`` (3-bit unsigned): the bias is ``bias_mant << bias_exp``.
        state_bits: :math:`u` and :math:`v` (24).
        max_neurons: neurons of one Loihi 2 chip (Intel's Loihi 2 brief: about one million, 128
            cores of up to 8,192).
    """

    name: str = "loihi2"
    weight_bits: int = 8
    weight_exp_range: tuple = (-8, 7)
    decay_range: tuple = (0, 4095)
    vth_range: tuple = (0, 2 ** 17 - 1)
    bias_range: tuple = (-4096, 4095)
    bias_exp_range: tuple = (0, 7)
    state_bits: int = 24
    max_neurons: int = 128 * 8192

    def quantize_network(self, model: nn.Module, example_input=None) -> nn.Sequential:
        """:func:`~snnquant.quantize_model`'s route for this chip: :func:`quantize_for_loihi`
        with this profile and its defaults (``example_input`` is not needed)."""
        return quantize_for_loihi(model, self)

    @property
    def weight_range(self) -> tuple:
        """The range of :math:`W`."""
        return int_range(self.weight_bits, True)


def _field_rules(profile: LoihiProfile) -> tuple:
    """``(field, lo, hi)`` of a layer's integers: the one rule the layer's constructor,
    :func:`check_loihi` and the file checks apply."""
    return (("vth", *profile.vth_range), ("du", *profile.decay_range),
            ("dv", *profile.decay_range), ("weight_exp", *profile.weight_exp_range),
            ("bias_exp", *profile.bias_exp_range))


#: Loihi 2 through Lava 0.10's fixed-point CPU models.
LOIHI2 = LoihiProfile()


class LoihiLIFLayer(ChipLayer):
    r"""A Lava ``Dense`` + ``LIF`` pair computing in Lava's fixed point, in training too.

    Forward, per step (see :mod:`snnquant.targets.loihi` for the rules), with the input spikes
    :math:`s` of the previous step, :math:`W` the 8-bit integer weights of the latent float
    weights on the power-of-two step :math:`\Delta`:

    .. math::

        a &= (2W s) \ll e\\
        u &\leftarrow \mathrm{wrap}_{24}(\mathrm{sign}(u)\lfloor |u(4095 - d_u)| / 4096\rfloor
            + 64 a)\\
        v &\leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v(4096 - d_v)| / 4096\rfloor + u + b,
            \ -2^{23}+1,\ 2^{23}-1)\\
        S &= [v > 64\vartheta],\qquad v \leftarrow v(1 - S)

    Gradients: the roundings pass the gradient of the real values (:math:`\partial W/\partial w =
    1/\Delta` inside the range; the decays :math:`(4095 - d_u)/4096` and
    :math:`(4096 - d_v)/4096`; the right shift of a negative ``weight_exp`` :math:`2^{e}`); the
    wrap and the clip pass 1 (the clip 0 outside); the spike has the surrogate gradient
    :math:`\sigma'((v - 64\vartheta)/(64\vartheta))/(64\vartheta)`.

    Args:
        in_features, out_features: sizes.
        vth: :math:`\vartheta` (int, 17-bit).
        du, dv: decays (ints, 0 to 4095).
        weight_step: :math:`\Delta`, a power of two.
        weight_exp: :math:`e` (int, -8 to 7).
        bias: whether the neurons have a bias :math:`b` = ``bias_mant << bias_exp`` (the
            mantissa learned, integer).
        bias_exp: the layer's ``bias_exp`` (0 to 7).
        profile: :data:`LOIHI2`.
        surrogate_function: default ``surrogate.Sigmoid()``.
        step_mode: ``'s'`` or ``'m'``; the input is 0/1 spikes (``[N, in]`` or ``[T, N, in]``).
        backend: what runs the ``'m'`` step: ``'auto'`` (the fused kernels of
            :mod:`snnquant.kernels.chip` where they can run, else the torch loop), ``'cpp'``,
            ``'cupy'`` or ``'torch'``; the spikes and states are the same.
    """

    def __init__(self, in_features: int, out_features: int, vth: int, du: int = 4095,
                 dv: int = 2048, weight_step: float = 2.0 ** -7, weight_exp: int = 0,
                 bias: bool = False, bias_exp: int = 0, profile: LoihiProfile = LOIHI2,
                 surrogate_function=None, step_mode: str = "s",
                 backend: str = "auto"):
        super().__init__(in_features, out_features, weight_step, profile.weight_range,
                         profile.bias_range if bias else None, 1, 1, surrogate_function,
                         step_mode, backend)
        self.profile = profile
        given = dict(vth=vth, du=du, dv=dv, weight_exp=weight_exp, bias_exp=bias_exp)
        for name, lo, hi in _field_rules(profile):
            setattr(self, name, check_int(given[name], lo, hi, name))
        self.register_memory("u", 0.0)
        self.register_memory("v", 0.0)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, vth={self.vth}, du={self.du}, "
                f"dv={self.dv}, weight_step=2**{int(math.log2(self.weight_step))}, "
                f"weight_exp={self.weight_exp}, bias={self.bias is not None}, "
                f"step_mode={self.step_mode}, backend={self.backend}")

    def integer_op(self, name: str) -> LoihiLayerOp:
        """The layer as a :class:`~snnquant.export.ir.chip_ops.LoihiLayerOp` named ``name``."""
        w, b = self._integers()
        return LoihiLayerOp(name=name, weight=w, weight_exp=self.weight_exp, bias=b,
                            bias_exp=self.bias_exp, vth=self.vth, du=self.du, dv=self.dv,
                            state_bits=self.profile.state_bits)

    def _chip_weight(self, w: torch.Tensor) -> torch.Tensor:
        return lava_weight(w)

    def _step(self, c: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        state = None if not isinstance(self.u, torch.Tensor) else (self.u, self.v)
        s, (self.u, self.v) = loihi_lif_step(
            state, c, w, b, vth=self.vth, du=self.du, dv=self.dv, weight_exp=self.weight_exp,
            bias_exp=self.bias_exp, state_bits=self.profile.state_bits, fire=self._fire)
        return s.to(c.dtype)

    def _multi_step(self, c_seq: torch.Tensor, w: torch.Tensor, b) -> torch.Tensor:
        state = None if not isinstance(self.u, torch.Tensor) else (self.u, self.v)
        s, state = loihi_lif_multi_step(
            state, c_seq, w, b, vth=self.vth, du=self.du, dv=self.dv, weight_exp=self.weight_exp,
            bias_exp=self.bias_exp, state_bits=self.profile.state_bits,
            surrogate_function=self.surrogate_function, backend=self.backend)
        if state is not None:   # None: no step was run on a fresh layer
            self.u, self.v = state
        return s.to(c_seq.dtype)


def _loihi_layers(model: nn.Module) -> List[tuple]:
    return chip_layers(model, LoihiLIFLayer, "Loihi")


def check_loihi(model: nn.Module, profile: Optional[LoihiProfile] = None) -> List[Violation]:
    """Every way ``model`` (a stack of :class:`LoihiLIFLayer`) exceeds ``profile``'s limits:
    a layer's profile, consecutive sizes, the chip's neuron count, and an activation that could
    overflow Lava's int32 arithmetic (the largest sum of a neuron's :math:`|2W| 2^{e}`, shifted
    left by 6 and added to a 24-bit current), and each layer's threshold, decays and exponents
    as they are now, by the rules its constructor applies.

    Returns:
        The list of :class:`Violation` (empty when the network fits).
    """
    layers = _loihi_layers(model)
    if not layers:
        return [Violation("", "at least one LoihiLIFLayer", "none")]
    profile = profile or layers[0][1].profile
    found, previous = [], None
    for name, m in layers:
        if m.profile != profile:
            found.append(Violation(name, f"profile {profile.name}", m.profile.name))
        found += field_violations(name, m, _field_rules(profile))
        if previous is not None and m.in_features != previous.out_features:
            found.append(Violation(name, f"in_features == {previous.out_features} (the previous "
                                         f"layer's out_features)", m.in_features))
        previous = m
    for name, m in layers:
        if not isinstance(m.weight_exp, int):
            continue
        with torch.no_grad():
            reach = float((2 * m.integer_weight()).abs().sum(1).max()) * 2.0 ** max(m.weight_exp, 0)
        if reach * 64 + 2 ** (profile.state_bits - 1) > 2 ** 31 - 1:
            found.append(Violation(name, "largest input sum << 6 plus the current within int32 "
                                         "(Lava adds them in int32)", f"{reach * 64:.0f}"))
    neurons = sum(m.out_features for _, m in layers)
    if neurons > profile.max_neurons:
        found.append(Violation("", f"neurons <= {profile.max_neurons}", neurons))
    return found


def quantize_for_loihi(model: nn.Module, profile: LoihiProfile = LOIHI2,
                       surrogate_function=None, step_mode: str = "m",
                       backend: str = "auto") -> nn.Sequential:
    r"""A SpikingJelly network of ``Linear`` + ``LIFNode``/``IFNode`` pairs as a stack of
    :class:`LoihiLIFLayer` that trains in Lava's fixed point.

    Each pair becomes one layer with the weights on the power-of-two step
    :math:`\Delta = 2^{\lceil\log_2(\max|w|/127)\rceil}` (``weight_exp`` 0), ``du`` = 4095 (the
    current lasts one step, as SpikingJelly's neurons take their input), and, for a LIF with
    :math:`\tau` (``decay_input=True``), ``dv`` :math:`= \mathrm{round}(4096/\tau)` and
    :math:`\vartheta = \mathrm{round}(2\tau V_{th}/\Delta)` (Lava integrates the whole input
    where SpikingJelly integrates :math:`X/\tau`: the voltage is :math:`128\tau/\Delta` times
    SpikingJelly's); for an IF ``dv`` = 0 and :math:`\vartheta = \mathrm{round}(2V_{th}/\Delta)`;
    the ``Linear`` bias :math:`b` becomes :math:`128 b / \Delta` current units, as ``bias_mant``
    with the smallest ``bias_exp`` that fits the 13-bit mantissa. The
    result computes a different network (one step of delay per layer, Lava's roundings and
    reset): train (or fine-tune) it.

    Args:
        model: the ``nn.Sequential``.
        profile: :data:`LOIHI2`.
        surrogate_function, step_mode: of every layer.
        backend: of every layer (what runs its ``'m'`` step, see :class:`LoihiLIFLayer`).

    Raises:
        ValueError: naming the module, for any other module, a reset other than to 0
            (``v_reset=0.0``), ``decay_input=False``, a threshold or bias beyond Lava's ranges,
            and listing every limit the result exceeds.
    """
    pairs = linear_neuron_pairs(model, "Loihi", 0.0, "Lava's LIF resets the voltage to 0")
    lo, hi = profile.weight_range
    layers = []
    for (lname, lin), (nname, neu) in pairs:
        step = pow2_step(lin.weight, hi)
        tau = float(neu.tau) if isinstance(neu, neuron.LIFNode) else 1.0
        dv = round(4096 / tau) if isinstance(neu, neuron.LIFNode) else 0
        vth = round(2 * tau * float(neu.v_threshold) / step)
        if not profile.vth_range[0] <= vth <= profile.vth_range[1]:
            raise ValueError(f"model.{nname}: v_threshold {neu.v_threshold} is vth={vth} for the "
                             f"weight step of model.{lname}, beyond {profile.vth_range}")
        bias_exp = 0
        if lin.bias is not None:
            big = float(lin.bias.detach().abs().max()) * 128 / step
            bias_exp = max(0, math.ceil(math.log2(big / profile.bias_range[1]))) if big else 0
            if bias_exp > profile.bias_exp_range[1]:
                raise ValueError(f"model.{lname}: bias {big * step / 128:g} is {big:.0f} current "
                                 f"units, beyond bias_mant {profile.bias_range[1]} << "
                                 f"{profile.bias_exp_range[1]}")
        new = LoihiLIFLayer(lin.in_features, lin.out_features, vth=vth, du=4095,
                            dv=min(dv, profile.decay_range[1]), weight_step=step, weight_exp=0,
                            bias=lin.bias is not None, bias_exp=bias_exp, profile=profile,
                            surrogate_function=surrogate_function, step_mode=step_mode,
                            backend=backend)
        with torch.no_grad():
            new.weight.copy_(lin.weight.clamp(lo * step, hi * step))
            if lin.bias is not None:
                new.bias.copy_(lin.bias * 128 / step / 2.0 ** new.bias_exp)
        new.converted_from = sources((lname, lin), (nname, neu))
        layers.append(new)
    out = nn.Sequential(*layers)
    refuse(check_loihi(out, profile), "quantize_for_loihi")
    return out


@dataclass
class LoihiSpec:
    """A Loihi network as the arguments of Lava's ``Dense`` and ``LIF`` processes, one entry per
    layer: ``weights`` (``[out, in]`` Lava weights :math:`2W`, int16), ``weight_exp``, ``du``,
    ``dv``, ``vth``, ``bias_mant`` (``[out]``) and ``bias_exp`` (``[out]``, the layer's).
    """

    layers: List[dict] = field(default_factory=list)
    profile: str = LOIHI2.name


def to_loihi(model: nn.Module, profile: Optional[LoihiProfile] = None) -> LoihiSpec:
    """The :class:`LoihiSpec` of a stack of :class:`LoihiLIFLayer` (after :func:`check_loihi`)."""
    refuse(check_loihi(model, profile), "to_loihi")
    out = []
    for _, m in _loihi_layers(model):
        with torch.no_grad():
            w = (2 * m.integer_weight()).cpu().numpy().astype(np.int16)
            b = (m.integer_bias().cpu().numpy().astype(np.int16) if m.bias is not None
                 else np.zeros(m.out_features, np.int16))
        out.append({"weights": w, "weight_exp": m.weight_exp, "du": m.du, "dv": m.dv,
                    "vth": m.vth, "bias_mant": b,
                    "bias_exp": np.full(m.out_features, m.bias_exp, np.int16)})
    return LoihiSpec(out, profile=_loihi_layers(model)[0][1].profile.name)


_ARRAYS = ("weights", "bias_mant", "bias_exp")
_INTS = ("weight_exp", "du", "dv", "vth")


def _checked_spec(payload: dict, where: str) -> LoihiSpec:
    """The :class:`LoihiSpec` of a file's ``payload`` (or of a spec's fields), every field checked
    by the rules the layers apply (:func:`_field_rules`, the profile's ranges) and each layer's
    shape against the one before; a ``ValueError`` naming ``where`` and the first bad field."""
    f = FileFields(where)
    f.keys(payload, ("layers", "profile"))
    if payload["profile"] != LOIHI2.name:
        f.fail("profile", f"must be {LOIHI2.name!r}", payload["profile"])
    p, rules = LOIHI2, {name: (lo, hi) for name, lo, hi in _field_rules(LOIHI2)}
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


