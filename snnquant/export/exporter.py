r"""Integer export of a fake-quantized spiking network: :func:`to_integer`.

Why the result is exact. Every value the fake-quantized float model computes is an exact binary
fraction as long as the quantization steps are (a power of two times a small odd integer) and no
intermediate needs more significand bits than the float type has (:math:`p = 24` for float32,
53 for float64). Then the float model computes the same numbers as exact rational arithmetic,
and the integer network below computes them on a fixed-point grid:

* synaptic layer: weights :math:`\hat W = q\, s` with :math:`s = m\,2^{E}` (:math:`m = 1` for a
  power-of-two step); the integer accumulator :math:`A = \sum q x` and the current
  :math:`X = (A m) \ll \sigma + b` on the grid :math:`2^{-F}`;
* neuron: membrane integers on :math:`s_v = 2^{E_v}`, currents and membrane on the shared grid
  :math:`2^{-F_0}`, the leak :math:`1/\tau = 2^{-k}` as :math:`k` extra fractional bits, and the
  rounding to the membrane grid with :func:`~snnquant.export.round_half_even_shift` (ties to even,
  as ``torch.round``).

Bounds checked at export (each refusal names the layer and the numbers):

* accumulator: for every output channel :math:`c`,
  :math:`\lVert q_c \rVert_1\, m_c\, x_{max}\, 2^{E_c - F_{in} - u_c} + |b_c|\, 2^{-u_c} \le 2^p`
  with :math:`u_c` the finest binary unit of the channel's weights and bias. It bounds every
  partial sum in any summation order (and fused multiply-adds), so the float convolution is exact
  whatever kernel computes it. :math:`x_{max}` is 1 for spikes and ``input_max`` for the network
  input; without an ``input_max`` the largest one that satisfies the bound is taken and the
  simulator refuses larger inputs;
* neuron: :math:`(2^{k+2} + 4)\, R\, 2^{d} \le 2^p` with
  :math:`R = \max(|v_{min}|, |v_{max}|) + |\theta| + 1` and :math:`d` the grid shift (the membrane
  step in units of the shared grid is :math:`2^d`): every intermediate of the charge is then exact
  whenever the result lies inside the membrane range; outside it both models saturate to the same
  end of the range, since float rounding is monotone and the rounding boundaries are
  representable.

The one exception is opt-in: ``to_integer(..., leak_bits=F)`` exports a :math:`\tau` that is not
a power of two with a fixed-point leak :math:`M / 2^F` (see :func:`to_integer`); such a layer has
``exact=False``, its float-exactness bound is not checked (the int64 bound is), and its agreement
with the float model is measured, not guaranteed.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..nn import registry
from ..utils import copy_model
from ..utils import is_multi_step as _is_multi_step
from ..utils import model_walk as _model_walk
from ..capture import CaptureError, capture, connect_functions, is_sequence, node_origin
from .ir.integer_ops import narrowest_int, pow2_exponent
from .ir.program import adaptive_windows
from .ir.validation import check_network
from .backends.simulator import op_shapes
from .deploy_checks import (accumulator_fix, exact_leak_shift, mean_refusal, tagged, tau_refusal,
                            time_mean_refusal)

from .ir.description import (NETWORK_INPUT, ExportError, FlattenOp, GatherOp, IntegerNetwork,
                              JoinOp, MatMulOp, NeuronOp, PoolOp, ReduceOp, ScaleOp, SynapseOp,
                              check_input_shape)

__all__ = ["to_integer"]


def __getattr__(name):
    # Deprecated: model_walk and is_multi_step live in snnquant.utils; reached only by the old
    # spelling `from snnquant.export.exporter import is_multi_step`.
    if name in ("model_walk", "is_multi_step"):
        import warnings
        warnings.warn(f"snnquant.export.exporter.{name} is deprecated: import it from "
                      f"snnquant.utils (from snnquant.utils import {name})", DeprecationWarning,
                      stacklevel=2)
        return _model_walk if name == "model_walk" else _is_multi_step
    raise AttributeError(f"module 'snnquant.export.exporter' has no attribute {name!r}")

_MANTISSA_BITS = {torch.float32: 24, torch.float64: 53}
_INT64_LIMIT_BITS = 62


def _fail(name: str, module, reason: str, check: str = "other"):
    raise tagged(ExportError(f"layer {name!r} ({type(module).__name__}): {reason}"), check)


# --------------------------------------------------------------------------------------------------
# structure

def _sj():
    from spikingjelly.activation_based import base, layer, neuron
    return base, layer, neuron


# --------------------------------------------------------------------------------------------------
# numbers

def _mantissa_exponent(x: float) -> Tuple[int, int]:
    """``(m, e)`` with ``x = m * 2**e`` and ``m`` odd (``x`` finite and nonzero)."""
    num, den = Fraction(x).as_integer_ratio()
    e = -(den.bit_length() - 1)
    while num % 2 == 0:
        num //= 2
        e += 1
    return num, e


def _frac_bits(x: float) -> int:
    """Fractional bits of the float ``x``: the smallest ``f >= 0`` with ``x * 2**f`` an integer."""
    return Fraction(x).denominator.bit_length() - 1


def _as_dtype_float(value: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(float(value), dtype=dtype))


# --------------------------------------------------------------------------------------------------
# synaptic layers

def _weight_integers(name, layer, dtype):
    """Integer weights ``q``, per-channel steps (floats) and bit width of a quantized layer."""
    wq = layer.weight_quant
    if wq is None:
        _fail(name, layer, "the weights are not quantized (weight_quant is None); quantize the "
                           "layer with quantize_model / QuantConfig(weight_bits=...)")
    probe = copy_model(layer).eval()
    pq = probe.weight_quant
    W = probe.weight.detach()
    c_out = W.shape[0]
    try:
        with torch.no_grad():
            Wq = probe.quantized_weight().detach()
    except RuntimeError as exc:
        _fail(name, layer, f"the weight quantizer cannot quantize yet: {exc}")
    grid = pq.grid()
    if grid is None or grid.step is None:
        _fail(name, layer, f"the weight quantizer {pq!r} has no uniform integer grid (its grid() "
                           f"is {grid!r}), so the weights are not integers times one step")
    step, qmin, qmax = grid.step.detach().to(dtype), grid.qmin, grid.qmax
    step_c = step.reshape(-1)
    if step_c.numel() == 1:
        step_c = step_c.expand(c_out)
    if step_c.numel() != c_out:
        _fail(name, layer, f"weight step has {step_c.numel()} values for {c_out} output channels")
    shape = [c_out] + [1] * (W.dim() - 1)
    s = step_c.reshape(shape)
    q = torch.round(Wq.double() / s.double()).to(torch.int64)
    lo = torch.as_tensor(qmin).reshape(-1).to(torch.int64)
    hi = torch.as_tensor(qmax).reshape(-1).to(torch.int64)
    q_lo, q_hi = int(lo.min()), int(hi.max())
    steps = [float(v) for v in step_c.double()]
    if any(not (math.isfinite(v) and v > 0) for v in steps):
        _fail(name, layer, f"weight step must be finite and > 0, got {steps[:4]}")
    parts = [_mantissa_exponent(v) for v in steps]
    max_m = max(m for m, _ in parts)
    # the fewest bits of a two's-complement range holding [q_lo, q_hi] (5 for [-16, 15])
    bits = grid.bits or max((-q_lo - 1).bit_length(), q_hi.bit_length()) + 1
    if max_m.bit_length() + max(abs(q_lo), abs(q_hi)).bit_length() > 52:
        _fail(name, layer, f"weight step {steps[0]!r} has {max_m.bit_length()} significant bits, so "
                           f"integer * step is rounded even in float64 (a min/max range step "
                           f"r / (2^(b-1) - 1) is such a step); use weight_quantizer='lsq_pow2'")
    exact = torch.equal(Wq.double(), q.double() * s.double()) and bool(
        (q.reshape(c_out, -1) >= lo.reshape(-1, 1)).all() and (q.reshape(c_out, -1) <= hi.reshape(-1, 1)).all())
    if not exact:
        _fail(name, layer, _non_pow2_advice(steps, dtype, "its quantized weights are not exactly "
                                                          "integer * step in " + str(dtype)))
    return q, steps, parts, int(bits), (q_lo, q_hi)


def _non_pow2_advice(steps, dtype, what):
    pow2 = all(pow2_exponent(v) is not None for v in steps)
    text = what
    if not pow2:
        text += (f" (weight step {steps[0]:.6g} is not a power of two, so the {dtype} products and "
                 f"sums of the fake-quantized model are rounded and no integer network reproduces "
                 f"them exactly). Train with QuantConfig(weight_quantizer='lsq_pow2') for an exact "
                 f"float32 export, or export with reference_dtype=torch.float64 and compare with "
                 f"the model run in float64")
    return text


def _export_synapse(name, layer, dtype, p, in_frac, x_bound, input_max):
    """Build a SynapseOp; returns (op, out_frac, current_log2_bound, allowed_input_max)."""
    layer_kind = registry.layer_kind(layer)
    if layer_kind is None or not isinstance(layer, layer_kind.quant_cls):
        _fail(name, layer, "unquantized synaptic layer; quantize it with quantize_model (whose "
                           "report's skipped list says why it left a layer float, e.g. a "
                           "subclass with its own forward such as WSConv2d)")
    if layer_kind.spatial_dims and layer.padding_mode != "zeros":
        _fail(name, layer, f"padding_mode={layer.padding_mode!r} is not supported (only 'zeros')")
    q, steps, parts, bits, (q_lo, q_hi) = _weight_integers(name, layer, dtype)
    c_out = q.shape[0]
    probe = copy_model(layer).eval()
    with torch.no_grad():
        bias = probe.quantized_bias()
    bias_vals = None
    f_b = None
    if bias is not None:
        bias_vals = [float(v) for v in bias.detach().to(dtype).double()]
        if any(not math.isfinite(v) for v in bias_vals):
            _fail(name, layer, "the bias is not finite")
        f_b = max(_frac_bits(v) for v in bias_vals)
    l1 = q.abs().reshape(c_out, -1).sum(dim=1).tolist()
    out_frac = max(in_frac - e for _, e in parts)
    if f_b is not None:
        out_frac = max(out_frac, f_b)
    limit = 1 << p
    terms = []
    for c in range(c_out):
        m, e = parts[c]
        u = e - in_frac if f_b is None else min(e - in_frac, -f_b)
        w_term = l1[c] * m * (1 << (e - in_frac - u))
        b_term = 0 if bias_vals is None else int(abs(Fraction(bias_vals[c])) * Fraction(2) ** (-u))
        if b_term > limit and any(mm != 1 for mm, _ in parts):
            _fail(name, layer, _non_pow2_advice(
                steps, dtype, f"the bias of output channel {c} cannot be added exactly on the "
                              f"grid 2^{u} that the weight step imposes"))
        if b_term > limit:
            _fail(name, layer, f"the bias of output channel {c} ({bias_vals[c]!r}) needs more than "
                               f"{p} significand bits on the grid 2^{u}: it is not quantized to a "
                               f"grid the {dtype} model adds exactly; quantize it "
                               f"(QuantConfig(bias_bits=...) with a power-of-two step, or "
                               f"fold_batchnorm, which snaps it to the membrane grid)")
        terms.append((w_term, b_term, u))
    allowed = None
    if x_bound[0] == "input":
        for w_term, b_term, _ in terms:
            if w_term:
                a_c = (limit - b_term) // (w_term * x_bound[1])
                allowed = a_c if allowed is None else min(allowed, a_c)
        if allowed is not None and allowed < 1:
            why = (f"even an input of magnitude 1 makes the accumulator bound exceed 2^{p} "
                   f"(largest sum|w_int| * m = {max(t[0] for t in terms)})")
            if any(mm != 1 for mm, _ in parts):
                why = _non_pow2_advice(steps, dtype, why)
            _fail(name, layer, why, "accumulator")
        if input_max is not None and allowed is not None and input_max > allowed:
            _fail(name, layer, f"input_max={input_max} is too large: inputs above {allowed} make "
                               f"the accumulator bound exceed 2^{p}; "
                               + accumulator_fix(dtype, input_max, True), "accumulator")
        x_eff = x_bound[1] * (input_max if input_max is not None
                              else min(allowed if allowed is not None else 1, (1 << 31) - 1))
    else:
        x_eff = x_bound[1]
    log2_cur = 0.0
    for c, (w_term, b_term, u) in enumerate(terms):
        total = w_term * x_eff + b_term
        if total > limit:
            why = (f"the accumulator bound sum|w_int| * max|x| + |bias| = {total} (in units of "
                   f"2^{u}) of output channel {c} exceeds 2^{p}: the {dtype} sum of the "
                   f"fake-quantized model is not exact")
            if parts[c][0] != 1:
                why = _non_pow2_advice(steps, dtype, why)
            else:
                why += ". Fix: " + accumulator_fix(dtype, input_max, x_bound[0] == "input")
            _fail(name, layer, why, "accumulator")
        log2_cur = max(log2_cur, math.log2(max(total, 1)) + (out_frac + u))
    shift = [out_frac + e - in_frac for _, e in parts]
    bias_int = None
    if bias_vals is not None:
        bias_int = torch.tensor([int(Fraction(v) * (Fraction(2) ** out_frac)) for v in bias_vals],
                                dtype=torch.int64)
    kind = layer_kind.name
    conv = {}
    if layer_kind.spatial_dims:
        padding = layer.padding if isinstance(layer.padding, str) else tuple(int(v) for v in layer.padding)
        conv = dict(stride=tuple(int(v) for v in layer.stride), padding=padding,
                    dilation=tuple(int(v) for v in layer.dilation), groups=int(layer.groups))
    op = SynapseOp(
        name=name, kind=kind, weight=q.to(narrowest_int(q_lo, q_hi) or torch.int64),
        weight_bits=bits,
        weight_scale=torch.tensor(steps, dtype=torch.float64),
        multiplier=torch.tensor([m for m, _ in parts], dtype=torch.int64),
        shift=torch.tensor(shift, dtype=torch.int64), bias=bias_int,
        bias_bits=layer.bias_quant.num_bits if bias_int is not None and layer.bias_quant is not None
        else None,
        in_frac_bits=in_frac, out_frac_bits=out_frac, **conv)
    return op, out_frac, log2_cur, allowed


# --------------------------------------------------------------------------------------------------
# neurons

def _export_neuron(name, module, dtype, p, in_frac, cur_log2, leak_bits=None):
    neuron_kind = registry.neuron_kind(module)
    if neuron_kind is None:
        supported = ", ".join(k.float_cls.__name__ for k in registry.NEURON_KINDS)
        _fail(name, module, f"this neuron type has no integer form; the supported neurons are "
                            f"{supported} (quantized with quantize_model / "
                            f"QuantConfig(v_bits=...))")
    if not isinstance(module, neuron_kind.quant_cls):
        _fail(name, module, "unquantized neuron; quantize it with quantize_model / "
                            "QuantConfig(v_bits=...)")
    vq = module.v_quant
    if vq is None:
        _fail(name, module, "the membrane is not quantized (v_quant is None)")
    if not vq.is_initialized:
        _fail(name, module, f"the membrane quantizer {type(vq).__name__} was never initialised; "
                            f"run the model on data first (or load a trained state_dict)")
    grid = vq.grid()
    if grid is None or grid.step is None:
        _fail(name, module, f"the membrane quantizer {type(vq).__name__} has no uniform grid "
                            f"(its levels are not equally spaced), so the membrane is not an "
                            f"integer times one scale; use membrane_quantizer='uniform'")
    if not grid.per_tensor:
        _fail(name, module, "the membrane step is not one scalar (per-channel membrane grid)")
    step, qmin, qmax = grid.step, grid.qmin, grid.qmax
    s_v = float(step.detach().to(dtype))
    e_v = pow2_exponent(s_v)
    if e_v is None:
        if grid.power_of_two:
            hint = ""
        elif any(p.requires_grad for p in vq.parameters()):
            hint = (f"; the step of {type(vq).__name__} is learned: restrict it to powers of two "
                    f"(e.g. LSQQuantizer(..., power_of_two=True)) or use "
                    f"membrane_quantizer='uniform', whose step is always a power of two")
        else:
            hint = (f"; give {type(vq).__name__} a power-of-two step, or use v_quant=b / "
                    f"membrane_quantizer='uniform', whose step is always a power of two")
        _fail(name, module, f"the membrane step {s_v!r} is not a power of two, so the float "
                            f"model's division by it rounds{hint}")
    # leak
    multiplier, round_shift, exact, tau_src = 1, 0, True, None
    kind = neuron_kind.name
    if neuron_kind.leak is None:
        k, decay_input = 0, True
    else:
        decay_input = bool(module.decay_input)
        if neuron_kind.leak == "sigmoid_w":
            kval = float(torch.sigmoid(module.w.detach()).to(dtype))
            tau_src = 1.0 / kval
            inv = pow2_exponent(kval)
            if inv is None or inv > 0:
                if leak_bits is None:
                    _fail(name, module, tau_refusal(1 / kval, learned=True), "tau")
                k, multiplier = leak_bits, _leak_multiplier(name, module, Fraction(kval), leak_bits,
                                                            f"sigmoid(w) = {kval!r}")
                exact, round_shift = False, leak_bits - leak_bits // 2
            else:
                k = -inv
        else:
            tau_src = float(module.tau)
            e = exact_leak_shift(module.tau, dtype)
            if e is None:
                if leak_bits is None:
                    _fail(name, module, tau_refusal(module.tau), "tau")
                if not (math.isfinite(tau_src) and tau_src > 0):
                    _fail(name, module, f"tau = {module.tau!r} must be finite and > 0")
                k, multiplier = leak_bits, _leak_multiplier(name, module, 1 / Fraction(tau_src),
                                                            leak_bits, f"1/tau = 1/{tau_src!r}")
                exact, round_shift = False, leak_bits - leak_bits // 2
            else:
                k = e
    # threshold and reset, in membrane units, as the float model computes them
    step_f = Fraction(s_v)
    vth_values = {_as_dtype_float(module.v_threshold, dtype), float(module.v_threshold)}
    ths = {math.ceil(Fraction(v) / step_f) for v in vth_values}
    if len(ths) != 1:
        _fail(name, module, f"v_threshold={module.v_threshold!r} is not representable in {dtype} "
                            f"and a membrane level lies between its two roundings")
    threshold = ths.pop()
    if module.v_reset is None:
        reset_mode, v_reset = "soft", 0
    else:
        vr_values = {_as_dtype_float(module.v_reset, dtype), float(module.v_reset)}
        vrs = {min(max(round(Fraction(v) / step_f), qmin), qmax) for v in vr_values}
        if len(vrs) != 1:
            _fail(name, module, f"v_reset={module.v_reset!r} is not representable in {dtype} and "
                                f"its two roundings snap to different levels")
        reset_mode, v_reset = "hard", vrs.pop()
    grid_frac = max(in_frac, -e_v)
    input_shift = grid_frac - in_frac
    d = grid_frac + e_v
    R = max(abs(qmin), abs(qmax)) + abs(threshold) + 1
    need = ((1 << (k + 2)) + 4) * R * (1 << d)
    if exact and need > (1 << p):
        _fail(name, module, f"the charge of a {qmax - qmin + 1}-level membrane on the shared grid "
                            f"2^-{grid_frac} (membrane step 2^{e_v}, currents with {in_frac} "
                            f"fractional bits, leak shift {k}) needs {math.log2(need):.1f} "
                            f"significand bits, more than {dtype}'s {p}: the float model's charge "
                            f"is not exact. Use fewer v_bits or a coarser weight/bias step")
    lm = max(k, math.log2(multiplier))  # |M * y| <= 2^lm |y|
    h_bits = max(cur_log2 + input_shift + lm, math.log2(R) + d + lm) + 2
    if h_bits > _INT64_LIMIT_BITS:
        _fail(name, module, f"the integer charge needs {h_bits:.0f} bits, more than int64 holds")
    return NeuronOp(name=name, kind=kind, v_bits=int(grid.bits or (qmax - qmin).bit_length()),
                    v_min=qmin, v_max=qmax, membrane_scale=s_v, threshold=int(threshold),
                    reset_mode=reset_mode, v_reset=int(v_reset),
                    v_init=int(v_reset) if reset_mode == "hard" else 0, leak_shift=int(k),
                    decay_input=decay_input, input_shift=int(input_shift), grid_shift=int(d),
                    in_frac_bits=int(in_frac), grid_frac_bits=int(grid_frac),
                    leak_multiplier=int(multiplier), leak_round_shift=int(round_shift),
                    exact=exact, tau=tau_src)


def _leak_multiplier(name, module, decay: Fraction, leak_bits: int, what: str) -> int:
    r"""``M = round(2^F * decay)``, half to even on the exact rational; refused when it is 0."""
    m = round(decay * (1 << leak_bits))
    if m < 1:
        _fail(name, module, f"{what} rounds to the multiplier 0 on leak_bits={leak_bits} "
                            f"fractional bits (round(2^{leak_bits} * {float(decay):.6g}) = 0): "
                            f"use more leak_bits")
    return int(m)


# --------------------------------------------------------------------------------------------------
# pooling / flatten

def _tuple(v, n):
    if isinstance(v, int):
        return (int(v),) * n
    return tuple(int(x) for x in v)


def _export_pool(name, module, domain):
    dims = 2 if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)) else 1
    ks = _tuple(module.kernel_size, dims)
    stride = _tuple(module.stride if module.stride is not None else module.kernel_size, dims)
    padding = _tuple(module.padding, dims)
    if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)):
        if module.return_indices:
            _fail(name, module, "return_indices=True is not supported")
        return PoolOp(name=name, kind="max", dims=dims, kernel_size=ks, stride=stride,
                      padding=padding, dilation=_tuple(module.dilation, dims),
                      ceil_mode=bool(module.ceil_mode), frac_bits_added=0), 1
    if domain != "event":
        _fail(name, module, "average pooling of synaptic currents is not supported; pool the "
                            "spikes after the neuron instead")
    if module.ceil_mode:
        _fail(name, module, "ceil_mode=True changes the divisor at the border; not exact")
    if any(padding) and not module.count_include_pad:
        _fail(name, module, "padding with count_include_pad=False changes the divisor at the "
                            "border; not exact")
    area = 1
    for v in ks:
        area *= v
    divisor = getattr(module, "divisor_override", None) or area
    a = pow2_exponent(float(divisor))
    if a is None:
        _fail(name, module, f"average pooling divides by {divisor}, not a power of two, so the "
                            f"pooled value is not an exact binary fraction")
    return PoolOp(name=name, kind="sum", dims=dims, kernel_size=ks, stride=stride, padding=padding,
                  dilation=(1,) * dims, ceil_mode=False, frac_bits_added=int(a)), area


def _export_voting(name, module, domain):
    """SpikingJelly's ``VotingLayer``: the average of ``voting_size`` features, as a sum pool."""
    if domain != "event":
        _fail(name, module, "a VotingLayer of synaptic currents is not supported; vote with the "
                            "spikes after the neuron")
    size = int(module.voting_size)
    a = pow2_exponent(float(size))
    return PoolOp(name=name, kind="sum", dims=1, kernel_size=(size,), stride=(size,),
                  padding=(0,), dilation=(1,), ceil_mode=False, frac_bits_added=int(a or 0),
                  divisor=1 if a is not None else size), size


def _export_adaptive_pool(name, module, domain, in_shape):
    r"""An adaptive average pool whose windows all hold :math:`2^a` elements, as a sum pool."""
    dims = 2 if isinstance(module, nn.AdaptiveAvgPool2d) else 1
    if domain != "event":
        _fail(name, module, "average pooling of synaptic currents is not supported; pool the "
                            "spikes after the neuron instead")
    size_in = tuple(int(v) for v in in_shape[-dims:])
    size_out = module.output_size
    size_out = (size_out,) * dims if isinstance(size_out, int) else tuple(size_out)
    size_out = tuple(int(o) if o is not None else i for o, i in zip(size_out, size_in))
    kernel = []
    for i, o in zip(size_in, size_out):
        widths = {b - a for a, b in adaptive_windows(i, o)}
        if len(widths) != 1:
            _fail(name, module, f"adaptive pooling from {size_in} to {size_out} has windows of "
                                f"{sorted(widths)} elements, so its divisor is not one number; "
                                f"use an input size that the output size divides")
        kernel.append(widths.pop())
    area = math.prod(kernel)
    a = pow2_exponent(float(area))
    if a is None:
        _fail(name, module, f"adaptive average pooling from {size_in} to {size_out} divides by "
                            f"{area}, not a power of two, so the pooled value is not an exact "
                            f"binary fraction")
    return PoolOp(name=name, kind="sum", dims=dims, kernel_size=tuple(kernel),
                  stride=tuple(kernel), padding=(0,) * dims, dilation=(1,) * dims,
                  ceil_mode=False, frac_bits_added=int(a), output_size=size_out), area


def _export_flatten(name, module, lead, refuse=None):
    """A FlattenOp; a refusal goes to ``refuse(reason)`` (default: names layer ``name``)."""
    refuse = refuse or (lambda reason: _fail(name, module, reason))
    start, end = int(module.start_dim), int(module.end_dim)
    if start >= 0:
        start -= lead
        if start < 0:
            refuse(f"it flattens the time or batch dimension (start_dim={module.start_dim} on "
                   f"an input with {lead} leading dimensions)")
    if end >= 0:
        end -= lead
        if end < 0:
            refuse(f"end_dim={module.end_dim} lies in the time/batch dimensions")
    return FlattenOp(name=name, start_dim=start, end_dim=end)


# --------------------------------------------------------------------------------------------------
# graphs

_POOL_TYPES = (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)
_ADAPTIVE_TYPES = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)
_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__iadd__"}
_MUL_FUNCTIONS = {operator.mul, operator.imul, torch.mul, "mul", "mul_"}
_FLATTEN_FUNCTIONS = {torch.flatten, "flatten"}
_TRUEDIV_FUNCTIONS = {operator.truediv, torch.div, "div", "__truediv__"}
_MATMUL_FUNCTIONS = {operator.matmul, torch.matmul, "matmul", "__matmul__"}
#: layout operations: replayed on index maps (:meth:`_GraphBuilder.layout`)
_LAYOUT_FUNCTIONS = {torch.flatten, "flatten", torch.reshape, "reshape", "view", torch.transpose,
                     "transpose", torch.permute, "permute", "contiguous", torch.chunk, "chunk",
                     torch.split, "split", torch.unflatten, "unflatten", torch.squeeze, "squeeze",
                     torch.unsqueeze, "unsqueeze", "expand", torch.movedim, "movedim",
                     torch.swapaxes, "swapaxes", torch.narrow, "narrow", torch.unbind, "unbind",
                     "clone", torch.clone, "t", torch.t}
_CONNECT_KINDS = {"ADD": "add", "AND": "and", "IAND": "iand"}


@dataclass(frozen=True)
class _Value:
    """What the export knows about one value of the graph (the input or an operation's output).

    ``domain``: ``'event'`` (spikes, event counts, their sums and sum pools) or ``'current'``
    (a synaptic current); ``frac``: its fractional bits; ``x_bound``: ``('input', factor)``
    (a multiple of the network input) or ``('abs', m)`` (``|value| <= m`` integer units);
    ``cur_log2``: log2 of the largest integer of a current; ``binary``: values are 0 or 1.
    """

    domain: str
    frac: int
    x_bound: Tuple[str, int]
    cur_log2: float = 0.0
    binary: bool = False
    time_mean: bool = False

    def magnitude(self, input_max) -> Optional[int]:
        """The largest integer magnitude (``None``: it depends on an unknown ``input_max``)."""
        if self.domain == "current":
            return int(math.ceil(2.0 ** self.cur_log2))
        if self.x_bound[0] == "input":
            return None if input_max is None else self.x_bound[1] * input_max
        return self.x_bound[1]


_SPIKES = _Value("event", 0, ("abs", 1), 0.0, True)


class _View:
    """A pending layout: one sample of value ``src`` read through ``index`` (a tensor of the
    output's shape holding positions in the source sample, row-major). Materialised as a
    :class:`GatherOp` only where a computing operation reads it (``emitted``)."""

    def __init__(self, src: int, index: torch.Tensor):
        self.src, self.index, self.emitted = src, index, None


def _flat_args(args, kwargs):
    """Every argument of a call, nested tuples and lists opened."""
    stack = list(args) + list(kwargs.values())
    while stack:
        a = stack.pop()
        if isinstance(a, (tuple, list)):
            stack.extend(a)
        else:
            yield a


class _FlattenCall:
    """``torch.flatten(x, start_dim, end_dim)`` as the module :func:`_export_flatten` reads."""

    def __init__(self, start_dim=0, end_dim=-1):
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)


def _lead(module, multi: bool, default: int) -> int:
    """Leading (time/batch) dimensions ``module`` sees, as :func:`model_walk` counts them."""
    base, _, _ = _sj()
    if not multi:
        return 1
    if isinstance(module, base.StepModule) and getattr(module, "step_mode", "s") == "m":
        return 1
    return default


def _arg_text(arg) -> str:
    """An operation's argument as an error shows it: a tensor by the node that computes it."""
    if isinstance(arg, torch.fx.Node):
        return "a tensor"
    if isinstance(arg, (tuple, list)):
        return "(" + ", ".join(_arg_text(a) for a in arg) + ")"
    return repr(arg)


def _spiking_part_hint(name, module) -> str:
    """``; or export one of its parts that has neurons: model.body`` (never a part without one)."""
    _, _, sj_neuron = _sj()
    parts = [n for n, c in module.named_children()
             if any(isinstance(m, sj_neuron.BaseNode) for m in c.modules())
             and any(registry.layer_kind(m) is not None for m in c.modules())]
    if not parts:
        return ""
    where = f"model.{name}." if name else "model."
    return f"; or export a part of it that has synaptic layers and neurons, e.g. {where}{parts[0]}"


class _GraphBuilder:
    """Build the operations of an :class:`IntegerNetwork` from a module tree.

    Sequence containers are walked in order (:func:`model_walk`); any other module with children
    is read from the :class:`~snnquant.capture.Capture` (a run on an example input, or
    torch.fx), whose graph gives branches and joins. Every value the graph computes is an index
    into ``values``.
    """

    def __init__(self, work, dtype, p, input_max, leak_bits, input_shape, captured):
        self.work, self.dtype, self.p, self.captured = work, dtype, p, captured
        self.input_max, self.leak_bits, self.input_shape = input_max, leak_bits, input_shape
        self.multi = _is_multi_step(work)
        self.ops, self.notes = [], []
        self.values = {NETWORK_INPUT: _Value("event", 0, ("input", 1))}
        self.allowed_input = None
        self.seen_synapse = False
        self.shapes = {}            # value index -> one sample's shape (a capture from a run)
        self.time_steps = None      # T of the example input, once a mean over time is seen
        self.called = {}
        self._pool_sizes = None
        _, sj_layer, _ = _sj()
        self.identity_types = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
                               nn.Dropout3d, sj_layer.Dropout)

    def build(self) -> int:
        """Emit every operation; returns the index of the output value."""
        return self.module("", self.work, 1 if not self.multi else 2, NETWORK_INPUT)

    def _emit(self, op, value: _Value, src: Tuple[int, ...]) -> int:
        index = len(self.ops)
        op.inputs = () if tuple(src) == (index - 1,) else tuple(src)
        self.ops.append(op)
        self.values[index] = value
        return index

    # ---- modules ----------------------------------------------------------------------------
    def module(self, name, module, lead, src) -> int:
        if is_sequence(module):
            for child_name, child, child_lead in _model_walk(module):
                src = self.module(f"{name}.{child_name}" if name else child_name, child,
                                  child_lead, src)
            return src
        if self._is_known(module):
            label = name or type(module).__name__
            self.called[label] = self.called.get(label, 0) + 1
            _, _, sj_neuron = _sj()
            weighted = (registry.layer_kind(module) is not None
                        or registry.neuron_kind(module) is not None
                        or isinstance(module, sj_neuron.BaseNode))
            if self.called[label] > 1 and weighted:
                _fail(label, module, f"it is called {self.called[label]} times; the integer "
                                     f"export needs one module per layer (its state and weights "
                                     f"belong to one place in the graph)")
            return self.leaf(label, module, lead, src)
        if next(module.children(), None) is None:
            self._unsupported(name or type(module).__name__, module, "")
        try:
            graph = self.captured.graph(name, module)
        except CaptureError as err:
            raise CaptureError(f"{err}{_spiking_part_hint(name, module)}") from None
        return self.traced(name, module, graph, lead, src)

    def _is_known(self, module) -> bool:
        _, sj_layer, sj_neuron = _sj()
        return (registry.layer_kind(module) is not None or registry.neuron_kind(module) is not None
                or isinstance(module, (sj_neuron.BaseNode, nn.Flatten, sj_layer.VotingLayer,
                                       nn.modules.batchnorm._BatchNorm) + _POOL_TYPES
                              + _ADAPTIVE_TYPES + self.identity_types))

    def _unsupported(self, name, module, hint):
        _fail(name, module, "module type not supported by the integer export (supported: "
                            "quantized Linear/Conv1d/Conv2d, quantized IF/LIF/PLIF neurons, "
                            "MaxPool, AvgPool and AdaptiveAvgPool of spikes, Flatten, Identity, "
                            "Dropout, in nn.Sequential, SpikingJelly containers or modules "
                            "torch.fx traces, joined by +, and SpikingJelly's sew_function)"
                            + hint)

    def leaf(self, name, module, lead, src) -> int:
        v = self.values[src]
        _, sj_layer, sj_neuron = _sj()
        if registry.layer_kind(module) is not None:
            x_bound = v.x_bound if v.domain == "event" else ("abs", v.magnitude(None))
            if v.time_mean:
                # the model applies it to the mean over time, the export to every step: both
                # exact when the float sum over the finer grid of the mean is
                steps = self._time_steps(name, module)
                _export_synapse(name, module, self.dtype, self.p, v.frac + steps,
                                ("abs", v.magnitude(self.input_max) << steps), self.input_max)
            op, frac, cur_log2, allowed = _export_synapse(name, module, self.dtype, self.p,
                                                          v.frac, x_bound, self.input_max)
            if v.x_bound[0] == "input" and allowed is not None:
                self.allowed_input = (allowed if self.allowed_input is None
                                      else min(self.allowed_input, allowed))
            self.seen_synapse = True
            return self._emit(op, _Value("current", frac, ("abs", 0), cur_log2,
                                         time_mean=v.time_mean), (src,))
        if v.time_mean:
            _fail(name, module, "it reads the mean over time steps that the model computes "
                                "before it; the integer export runs every layer per step, so "
                                "only synaptic layers may follow a mean over time")
        if registry.neuron_kind(module) is not None or isinstance(module, sj_neuron.BaseNode):
            if v.domain != "current" and v.x_bound[0] == "input":
                _fail(name, module, "a neuron layer reads the network input directly; put a "
                                    "synaptic layer before it")
            cur_log2 = v.cur_log2 if v.domain == "current" else math.log2(max(v.x_bound[1], 1))
            op = _export_neuron(name, module, self.dtype, self.p, v.frac, cur_log2,
                                self.leak_bits)
            if not op.exact:
                self.notes.append(f"{name}: tau = {op.tau:.6g} approximated by the fixed-point "
                                  f"leak {op.leak_multiplier} / 2^{op.leak_shift} (tau_eff = "
                                  f"{op.effective_tau:.6g}); this layer is not exact")
            return self._emit(op, _SPIKES, (src,))
        if isinstance(module, _POOL_TYPES + _ADAPTIVE_TYPES + (sj_layer.VotingLayer,)):
            if isinstance(module, sj_layer.VotingLayer):
                op, growth = _export_voting(name, module, v.domain)
            elif isinstance(module, _ADAPTIVE_TYPES):
                op, growth = _export_adaptive_pool(name, module, v.domain, self._pool_input(name))
            else:
                op, growth = _export_pool(name, module, v.domain)
            if op.kind == "sum":
                v = _Value(v.domain, v.frac + op.frac_bits_added,
                           (v.x_bound[0], v.x_bound[1] * growth), v.cur_log2, False)
            return self._emit(op, v, (src,))
        if isinstance(module, nn.Flatten):
            return self._emit(_export_flatten(name, module, lead), v, (src,))
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            from .fold import batchnorm_refusal
            _fail(name, module, batchnorm_refusal(self.work, name, self.captured.example_input),
                  "batchnorm")
        self.notes.append(f"{name} ({type(module).__name__}) is the identity in eval mode")
        return src

    def _time_steps(self, name, module) -> int:
        """``log2(T)`` of the example input's time steps (a mean over time divides by T)."""
        why = time_mean_refusal(self.time_steps or 0)
        if why is not None:
            _fail(name, module, why, "time_mean")
        return pow2_exponent(float(self.time_steps))

    def _pool_input(self, name) -> Tuple[int, ...]:
        """The spatial input size of the adaptive pool ``name`` (one run on zeros)."""
        if self.input_shape is None:
            module = self.work.get_submodule(name)
            _fail(name, module, "adaptive average pooling divides by an area that depends on the "
                                "input size, which the export does not know: pass "
                                "to_integer(model, input_shape=(C, H, W)) (one sample's shape)")
        if self._pool_sizes is None:
            from spikingjelly.activation_based import functional as sjf
            sizes = {}
            hooks = [m.register_forward_pre_hook(
                lambda mod, args, n=n: sizes.__setitem__(n, tuple(args[0].shape)))
                for n, m in self.work.named_modules() if isinstance(m, _ADAPTIVE_TYPES)]
            lead = (1, 1) if self.multi else (1,)
            was = self.work.training
            try:
                sjf.reset_net(self.work)
                with torch.no_grad():
                    self.work.eval()(torch.zeros(lead + self.input_shape, dtype=self.dtype))
            except (RuntimeError, ValueError, IndexError) as err:
                raise ValueError(f"input_shape={self.input_shape} does not fit the model: "
                                 f"{err}") from None
            finally:
                for h in hooks:
                    h.remove()
                sjf.reset_net(self.work)
                self.work.train(was)
            self._pool_sizes = sizes
        return self._pool_sizes[name]

    # ---- traced graphs ----------------------------------------------------------------------
    def traced(self, name, module, graph, lead, src) -> int:
        at = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                if at:
                    _fail(name or type(module).__name__, module,
                          "its forward() takes more than one input")
                at[node] = src
                self._note_shape(src, node, lead)
            elif node.op == "output":
                out = node.args[0]
                if not isinstance(out, torch.fx.Node) or out not in at:
                    _fail(name or type(module).__name__, module,
                          "its forward() returns something other than one tensor")
                return self._arg(name, module, node, at, 0)
            elif node.op == "call_module":
                target = f"{name}.{node.target}" if name else node.target
                sub = self.work.get_submodule(target)
                at[node] = self.module(target, sub, _lead(sub, self.multi, lead),
                                       self._arg(name, module, node, at, 0))
                self._note_shape(at[node], node, lead)
            elif node.op in ("call_function", "call_method"):
                at[node] = self.function(name, module, node, at, lead)
                if isinstance(at[node], int):
                    self._note_shape(at[node], node, lead)
            elif node.op == "get_attr":
                self._fail_at(name, module, node, f"its forward() reads the tensor "
                                                  f"{node.target!r} directly; only modules, +, "
                                                  f"flatten and sew_function are exported")
        raise ExportError(f"the traced graph of {name!r} has no output")  # pragma: no cover

    @staticmethod
    def _node_label(name, node) -> str:
        """The name of the operation ``node`` makes (a JoinOp's, a FlattenOp's)."""
        return f"{name}.{node.name}" if name else node.name

    def _fail_at(self, name, module, node, reason, check="other"):
        """Refuse ``node`` of the graph of ``module``, naming the innermost submodule it comes
        from (dotted name and class), the operation and its file and line."""
        inner, cls, where = node_origin(node, name, module)
        what = getattr(node.target, "__name__", str(node.target))
        raise tagged(ExportError(f"{'layer ' + repr(inner) if inner else 'the model'} ({cls}), "
                                 f"the operation {what}{' at ' + where if where else ''}: "
                                 f"{reason}"), check)

    def _arg(self, name, module, node, at, i) -> int:
        """The value index of ``node``'s argument ``i`` (a pending layout is materialised)."""
        arg = node.args[i] if i < len(node.args) else None
        if not isinstance(arg, torch.fx.Node) or arg not in at or isinstance(at[arg], tuple):
            self._fail_at(name, module, node, f"its argument {i} is not a tensor the export "
                                              f"computes ({_arg_text(arg)})")
        value = at[arg]
        if isinstance(value, _View):
            value = self._materialize(value, self._node_label(name, arg))
        return value

    def _note_shape(self, index, node, lead) -> None:
        """Remember one sample's shape of value ``index`` from the capture (a run only)."""
        shape = node.meta.get("shape")
        if isinstance(index, int) and shape is not None and len(shape) >= lead:
            self.shapes.setdefault(index, tuple(shape[lead:]))

    def _view(self, name, module, node, at, arg) -> "_View":
        """The pending layout of the value ``arg`` (an identity map over its own value)."""
        value = at.get(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(value, _View):
            return value
        if not isinstance(value, int):
            self._fail_at(name, module, node, f"it reads {_arg_text(arg)}, not a tensor the "
                                              f"export computes")
        shape = self.shapes.get(value)
        if shape is None:
            self._fail_at(name, module, node, "a layout operation needs the shapes of the "
                                              "values, which only a capture from a run knows: "
                                              "pass to_integer(..., example_input=x)")
        return _View(value, torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape))

    def _materialize(self, view: "_View", label: str) -> int:
        """A :class:`GatherOp` for ``view`` (nothing for the identity; cached per view)."""
        if view.emitted is not None:
            return view.emitted
        shape = self.shapes.get(view.src)
        flat = view.index.reshape(-1)
        identity = torch.equal(flat, torch.arange(flat.numel(), dtype=torch.int64)) and \
            shape is not None and flat.numel() == math.prod(shape)
        if identity and tuple(view.index.shape) == tuple(shape):
            view.emitted = view.src
            return view.src
        op = GatherOp(name=label, shape=tuple(int(v) for v in view.index.shape),
                      index=None if identity else flat.clone())
        v = self.values[view.src]
        view.emitted = self._emit(op, v, (view.src,))
        self.shapes[view.emitted] = tuple(view.index.shape)
        return view.emitted

    def layout(self, name, module, node, at, lead):
        """A layout operation (reshape, transpose, ...) applied to the index map of its input,
        found by running it on the example shapes: a :class:`_View` (or a tuple of them)."""
        data = node.args[0] if node.args else None
        view = self._view(name, module, node, at, data)
        if self.values[view.src].time_mean:
            self._fail_at(name, module, node, "a layout operation after a mean over time steps "
                                              "is not supported; only synaptic layers may "
                                              "follow a mean over time")
        full = data.meta.get("shape") if isinstance(data, torch.fx.Node) else None
        if full is None or len(full) < lead:
            self._fail_at(name, module, node, "its input's shape is not known: pass "
                                              "to_integer(..., example_input=x)")
        outer = tuple(full[:lead])
        # ids: position in the source sample; who: which sample (time step, batch)
        ids = view.index.expand(outer + tuple(view.index.shape))
        who = torch.arange(math.prod(outer), dtype=torch.int64).reshape(
            outer + (1,) * view.index.dim()).expand(ids.shape)

        def run(t):
            args = [t] + [a for a in node.args[1:]]
            if any(isinstance(a, torch.fx.Node) for a in _flat_args(args[1:], node.kwargs)):
                self._fail_at(name, module, node, "a layout operation whose arguments are "
                                                  "computed tensors is not supported")
            if node.op == "call_method":
                return getattr(t, node.target)(*args[1:], **node.kwargs)
            return node.target(*args, **node.kwargs)

        try:
            out_ids, out_who = run(ids), run(who)
        except (RuntimeError, TypeError, ValueError, IndexError) as err:
            self._fail_at(name, module, node, f"it could not be replayed on the example shapes "
                                              f"({err})")
        singles = isinstance(out_ids, torch.Tensor)
        items = [out_ids] if singles else list(out_ids)
        whos = [out_who] if singles else list(out_who)
        views = []
        for t, w in zip(items, whos):
            if tuple(t.shape[:lead]) != outer or not torch.equal(
                    w, torch.arange(math.prod(outer)).reshape(outer + (1,) * (t.dim() - lead))
                    .expand(w.shape)):
                self._fail_at(name, module, node, f"it moves values across the time or batch "
                                                  f"dimensions (shape {tuple(full)} to "
                                                  f"{tuple(t.shape)}); the integer export "
                                                  f"computes every sample and step alike")
            first = t[(0,) * lead]
            if not torch.equal(t, first.expand(t.shape)):  # pragma: no cover - follows from who
                self._fail_at(name, module, node, "it treats samples differently")
            views.append(_View(view.src, first.contiguous()))
        return views[0] if singles else tuple(views)

    def function(self, name, module, node, at, lead):
        """The value (index, pending layout, or tuple of layouts) of a call_function or
        call_method node."""
        label = self._node_label(name, node)
        target = node.target
        what = getattr(target, "__name__", str(target))
        first = node.args[0] if node.args else None
        if target is operator.getitem and isinstance(at.get(first), tuple):
            index = node.args[1]
            if not isinstance(index, int) or not -len(at[first]) <= index < len(at[first]):
                self._fail_at(name, module, node, f"it picks item {index!r} of "
                                                  f"{len(at[first])}")
            return at[first][index]
        if target in _FLATTEN_FUNCTIONS and isinstance(at.get(first), int) \
                and len(node.args) + len(node.kwargs) <= 3:
            src = self._arg(name, module, node, at, 0)
            args = [a for a in node.args[1:]]
            start = node.kwargs.get("start_dim", args[0] if args else 0)
            end = node.kwargs.get("end_dim", args[1] if len(args) > 1 else -1)
            op = _export_flatten(label, _FlattenCall(start, end), lead,
                                 lambda reason: self._fail_at(name, module, node, reason))
            return self._emit(op, self.values[src], (src,))
        if target in _LAYOUT_FUNCTIONS or target is operator.getitem:
            return self.layout(name, module, node, at, lead)
        if target in _ADD_FUNCTIONS and len(node.args) == 2 and not node.kwargs:
            srcs = [self._arg(name, module, node, at, i) for i in (0, 1)]
            shapes = [self.shapes.get(j) for j in srcs]
            if None not in shapes and shapes[0] != shapes[1]:
                self._fail_at(name, module, node, f"it adds values of the shapes {shapes} "
                                                  f"(a broadcast); the integer export adds values "
                                                  f"of one shape")
            return self.join(label, (name, module, node), "add", srcs)
        if target in _MUL_FUNCTIONS and len(node.args) == 2 and not node.kwargs:
            constants = [a for a in node.args if isinstance(a, (int, float))]
            if constants:
                return self.scale(name, module, node, at, constants[0])
            operands = [at.get(a) for a in node.args]
            if all(isinstance(v, int) for v in operands) and (
                    any(v not in self.shapes for v in operands)
                    or self.shapes[operands[0]] == self.shapes[operands[1]]):
                srcs = operands     # same shapes (or unknown ones: torch.fx symbolic tracing)
            else:
                srcs = self._broadcast(name, module, node, at, lead)
            return self.join(label, (name, module, node), "and", srcs)
        if target in _TRUEDIV_FUNCTIONS and len(node.args) == 2 and not node.kwargs \
                and isinstance(node.args[1], (int, float)) and node.args[1] != 0:
            return self.scale(name, module, node, at, 1 / node.args[1],
                              f"divides by {node.args[1]!r}")
        if what in ("sum", "mean"):
            return self.reduce(name, module, node, at, lead, what)
        if target in _MATMUL_FUNCTIONS and len(node.args) == 2 and not node.kwargs:
            return self.matmul(name, module, node, at)
        if what == "sew_function" and target in connect_functions():
            cnf = node.args[2] if len(node.args) > 2 else node.kwargs.get("cnf")
            if cnf not in _CONNECT_KINDS:
                self._fail_at(name, module, node, f"sew_function with cnf={cnf!r} is not "
                                                  f"supported (only {sorted(_CONNECT_KINDS)})")
            return self.join(label, (name, module, node), _CONNECT_KINDS[cnf],
                             [self._arg(name, module, node, at, i) for i in (0, 1)])
        args = ", ".join(_arg_text(a) for a in node.args)
        self._fail_at(name, module, node, f"{what}({args}) is not supported by the integer "
                                          f"export (supported: modules, + of two values, * of "
                                          f"spikes or by a power of two, sum and mean, matmul, "
                                          f"layout operations such as reshape, transpose, "
                                          f"permute, chunk, and SpikingJelly's sew_function)")

    def _broadcast(self, name, module, node, at, lead):
        """The two operands of an elementwise operation, broadcast to one shape (a gather)."""
        views = [self._view(name, module, node, at, node.args[i]) for i in (0, 1)]
        shapes = [tuple(v.index.shape) for v in views]
        if len(shapes[0]) != len(shapes[1]):
            self._fail_at(name, module, node, f"its operands have samples of the shapes {shapes}, "
                                              f"of different ranks: PyTorch would align them "
                                              f"with the time and batch dimensions")
        try:
            shape = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError as err:
            self._fail_at(name, module, node, f"its operands' shapes {shapes} do not broadcast "
                                              f"({err})")
        out = []
        for i, v in enumerate(views):
            index = v.index.reshape((1,) * (len(shape) - v.index.dim()) + tuple(v.index.shape))
            out.append(self._materialize(_View(v.src, index.expand(shape).contiguous()),
                                         self._node_label(name, node.args[i])))
        return out

    def scale(self, name, module, node, at, factor, what=None):
        """``x * c`` for a constant ``c = 2^k``: a :class:`ScaleOp` (``c = 1``: nothing)."""
        k = pow2_exponent(abs(float(factor))) if factor else None
        if k is None or factor < 0:
            what = what or f"multiplies by {factor!r}"
            self._fail_at(name, module, node, f"it {what}, which is not a "
                                              f"positive power of two, so the product is not an "
                                              f"exact integer on a binary grid; use a power of "
                                              f"two (e.g. 0.125 for 1/sqrt(64)) or fold the "
                                              f"factor into the layer before it")
        src = self._arg(name, module, node, at, 0 if not isinstance(node.args[0], (int, float))
                        else 1)
        if k == 0:
            return src
        v = self.values[src]
        if v.time_mean:
            self._fail_at(name, module, node, "it scales a mean over time")
        frac = v.frac - min(k, 0)
        bound = (v.x_bound[0], v.x_bound[1] << max(k, 0))
        value = _Value(v.domain, frac, bound, v.cur_log2 + max(k, 0), v.binary and k == 0)
        out = self._emit(ScaleOp(name=self._node_label(name, node), exponent=int(k)), value,
                         (src,))
        if src in self.shapes:
            self.shapes[out] = self.shapes[src]
        return out

    def reduce(self, name, module, node, at, lead, what):
        """``x.sum(dims)`` / ``x.mean(dims)`` over one sample's dimensions (a
        :class:`ReduceOp`), or a mean over the time steps at the end of the network."""
        src = self._arg(name, module, node, at, 0)
        full = node.args[0].meta.get("shape") if isinstance(node.args[0], torch.fx.Node) else None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
        extra = set(node.kwargs) - {"dim", "keepdim"}
        if full is None or dim is None or extra:
            self._fail_at(name, module, node, f"{what} needs the dimensions it reduces (dim=...) "
                                              f"and the shapes of a capture from a run "
                                              f"(to_integer(..., example_input=x))"
                          if not extra else f"{what} with {sorted(extra)} is not supported")
        dims = sorted({d % len(full) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))})
        v = self.values[src]
        count = math.prod(full[d] for d in dims)
        if dims == [0] and self.multi and lead == 2 and what == "mean" and not keepdim:
            if v.time_mean:
                self._fail_at(name, module, node, "it averages over time twice")
            steps = self.time_steps = int(full[0])
            mag = v.magnitude(self.input_max) if src != NETWORK_INPUT else None
            if mag is None:
                self._fail_at(name, module, node, "it averages the network input (or a value "
                                                  "bounded only by it) over time; average the "
                                                  "output of a layer")
            if mag * steps > 1 << self.p:
                self._fail_at(name, module, node, f"the sum over {steps} time steps of values "
                                                  f"up to {mag} can reach {mag * steps}, more "
                                                  f"than 2^{self.p}: the {self.dtype} mean is "
                                                  f"not exact", "accumulator")
            # its own value (an identity: integers and grid unchanged, run per step), so that
            # other readers of the averaged tensor still read it per step
            value = dataclasses.replace(v, time_mean=True, binary=False)
            out = self._emit(ScaleOp(name=self._node_label(name, node), exponent=0), value,
                             (src,))
            if src in self.shapes:
                self.shapes[out] = self.shapes[src]
            return out
        if any(d < lead for d in dims):
            self._fail_at(name, module, node, f"it reduces the time or batch dimension "
                                              f"(dim={dim!r} of shape {tuple(full)}); only a mean "
                                              f"over time (dim=0) at the end of a multi-step "
                                              f"network is exported")
        if v.time_mean:
            self._fail_at(name, module, node, "it reduces a mean over time")
        added = 0
        if what == "mean":
            added = pow2_exponent(float(count))
            if added is None:
                self._fail_at(name, module, node, mean_refusal(
                    count, [full[d] for d in dims]), "mean")
        op = ReduceOp(name=self._node_label(name, node), dims=tuple(d - lead for d in dims),
                      keepdim=keepdim, count=int(count), frac_bits_added=int(added))
        mag = v.magnitude(self.input_max)
        if mag is None:
            self._fail_at(name, module, node, "it sums values whose bound depends on the input: "
                                              "pass to_integer(..., input_max=...)")
        total = mag * count
        if total > 1 << self.p:
            self._fail_at(name, module, node, f"the sum of {count} values of magnitude up to "
                                              f"{mag} can reach {total}, more than 2^{self.p}: "
                                              f"the {self.dtype} sum is not exact", "accumulator")
        value = _Value(v.domain, v.frac + added, ("abs", total), math.log2(max(total, 1)))
        return self._emit(op, value, (src,))

    def matmul(self, name, module, node, at):
        """``a @ b`` of two integer tensors (counts): a :class:`MatMulOp`."""
        srcs = [self._arg(name, module, node, at, i) for i in (0, 1)]
        vals = [self.values[j] for j in srcs]
        shapes = [self.shapes.get(j) for j in srcs]
        if any(sh is None or len(sh) < 2 for sh in shapes):
            self._fail_at(name, module, node, f"a matrix product needs operands of known shapes "
                                              f"with two dimensions or more, got {shapes} "
                                              f"(pass to_integer(..., example_input=x))")
        inner = int(shapes[0][-1])
        if len(shapes[0]) != len(shapes[1]):
            self._fail_at(name, module, node, f"its operands have samples of the shapes {shapes}, "
                                              f"of different ranks: PyTorch would align them "
                                              f"with the time and batch dimensions")
        if shapes[1][-2] != inner:
            self._fail_at(name, module, node, f"the shapes {shapes} do not multiply")
        mags = [v.magnitude(self.input_max) for v in vals]
        if None in mags or any(v.time_mean for v in vals):
            self._fail_at(name, module, node, "a matrix product of the network input or of a "
                                              "mean over time is not supported")
        total = inner * mags[0] * mags[1]
        if total > 1 << self.p:
            self._fail_at(name, module, node, f"the product sums {inner} terms of magnitude up "
                                              f"to {mags[0] * mags[1]}: {total} exceeds "
                                              f"2^{self.p}, so the {self.dtype} product of the "
                                              f"model is not exact", "accumulator")
        frac = vals[0].frac + vals[1].frac
        op = MatMulOp(name=self._node_label(name, node), inner=inner, out_frac_bits=frac,
                      inputs=tuple(srcs))
        return self._emit(op, _Value("event", frac, ("abs", total), math.log2(max(total, 1))),
                          tuple(srcs))

    def join(self, label, at_node, kind, srcs) -> int:
        """A JoinOp named ``label`` of ``srcs``; ``at_node`` = ``(graph owner name, owner,
        node)`` says where a refusal points."""
        def refuse(reason, check="other"):
            self._fail_at(*at_node, reason, check)

        vals = [self.values[i] for i in srcs]
        where = [("the network input" if i == NETWORK_INPUT else repr(self.ops[i].name))
                 for i in srcs]
        if any(v.time_mean for v in vals):
            refuse("it joins a mean over time steps; the integer export runs every operation "
                   "per step, so only synaptic layers may follow a mean over time")
        if kind != "add":
            bad = [w for w, v in zip(where, vals) if not v.binary]
            if bad:
                refuse(f"a {kind.upper()} join needs two spike tensors (0 or 1), but the output "
                       f"of {', '.join(bad)} is not binary spikes; use cnf='ADD' or join the "
                       f"outputs of neuron layers")
            return self._emit(JoinOp(name=label, kind=kind, shifts=(0, 0), out_frac_bits=0,
                                     inputs=tuple(srcs)), _SPIKES, tuple(srcs))
        frac = max(v.frac for v in vals)
        shifts = tuple(frac - v.frac for v in vals)
        mags = []
        for w, v in zip(where, vals):
            if v.domain == "current":
                mags.append(2.0 ** v.cur_log2)
            elif v.x_bound[0] == "input":
                if self.input_max is None:
                    refuse(f"it adds {w}, whose largest value depends on the input: pass "
                           f"to_integer(..., input_max=...)")
                mags.append(float(v.x_bound[1] * self.input_max))
            else:
                mags.append(float(v.x_bound[1]))
        total = sum(m * 2.0 ** s for m, s in zip(mags, shifts))
        if total > 2.0 ** self.p:
            refuse(f"the sum of {' and '.join(where)} on the common grid 2^-{frac} (the "
                   f"operands have {[v.frac for v in vals]} fractional bits) can reach "
                   f"{total:.4g}, more than 2^{self.p}: the {self.dtype} addition of the "
                   f"fake-quantized model is not exact. Use fewer weight/membrane bits on the "
                   f"branches, or power-of-two steps that differ less between them, or "
                   f"reference_dtype=torch.float64", "accumulator")
        if math.log2(max(total, 1.0)) + 2 > _INT64_LIMIT_BITS:
            refuse(f"the integer sum needs {math.log2(total):.0f} bits, more than int64 holds")
        domain = "current" if any(v.domain == "current" for v in vals) else "event"
        value = _Value(domain, frac, ("abs", int(math.ceil(total))), math.log2(max(total, 1.0)))
        return self._emit(JoinOp(name=label, kind="add", shifts=shifts, out_frac_bits=frac,
                                 inputs=tuple(srcs)), value, tuple(srcs))



# --------------------------------------------------------------------------------------------------

def input_max_of(example_input: torch.Tensor) -> int:
    """The default ``input_max`` that an example input (or a batch of data) gives: its largest
    magnitude, rounded up to an integer, at least 1 (its largest event count)."""
    if example_input.numel() == 0:
        return 1
    return max(1, int(math.ceil(float(example_input.detach().abs().max()))))


def _input_max_said(input_max, source, graph) -> str:
    """Where the input bound behind an accumulator refusal came from, for its message."""
    if input_max is None:
        allowed = graph.allowed_input
        return (f"input_max was not given and there was no example_input, so the export "
                f"assumed inputs up to {allowed}, the largest the first layer allows; pass "
                f"input_max=<the largest event count of your data> (or example_input=x), or "
                f"reference_dtype=torch.float64")
    if source == "example_input":
        return (f"input_max={input_max}, the largest value of example_input; pass a smaller "
                f"input_max if the data never exceeds it, or reference_dtype=torch.float64")
    return (f"at input_max={input_max}: a smaller input_max, or reference_dtype=torch.float64, "
            f"lowers or lifts the bound")


#: Accepted range of ``leak_bits`` (fractional bits of a fixed-point leak multiplier).
LEAK_BITS_RANGE = (1, 32)


def _chip_network(model: nn.Module) -> IntegerNetwork:
    """The :class:`IntegerNetwork` of a chip network: an ``nn.Sequential`` of chip layers (each
    with an ``integer_op``), one operation per layer (:mod:`~snnquant.export.ir.chip_ops`)."""
    layers = [(n, m) for n, m in model.named_modules() if callable(getattr(m, "integer_op", None))]
    others = [n for n, m in model.named_modules()
              if n and not callable(getattr(m, "integer_op", None))
              and not isinstance(m, (nn.Sequential, nn.Identity))
              and not any(n.startswith(x + ".") for x, _ in layers)]
    if others or not isinstance(model, nn.Sequential) and len(layers) > 1:
        raise ExportError(f"a chip network is an nn.Sequential of one chip's layers only; found "
                          f"{others or type(model).__name__}")
    ops = [m.integer_op(n or type(m).__name__) for n, m in layers]
    chips = sorted({op.chip for op in ops})
    if len(chips) > 1:
        raise ExportError(f"a chip network holds one chip's layers; found {chips}")
    desc = IntegerNetwork(ops=ops, input_max=int(ops[0].input_max), output_kind="spikes",
                          reference_dtype="float64", mantissa_bits=53,
                          notes=[f"{chips[0]} network: {len(ops)} layers in the chip's "
                                 f"arithmetic"])
    check_network(desc)
    return desc


def to_integer(model: nn.Module, *, reference_dtype: Optional[torch.dtype] = None,
               input_max: Optional[int] = None, leak_bits: Optional[int] = None,
               input_shape: Optional[Tuple[int, ...]] = None,
               example_input=None) -> IntegerNetwork:
    r"""Export a quantized spiking network as an exact integer network.

    The network is a sequence (``nn.Sequential``, SpikingJelly ``SeqToANNContainer`` /
    ``MultiStepContainer`` / ``StepModeContainer``, nested freely) or a graph that
    :mod:`torch.fx` traces (layers, neurons and containers kept whole; residual blocks such as
    SpikingJelly's ``spiking_resnet`` and ``sew_resnet``) of:
    :class:`~snnquant.nn.QuantLinear` / ``QuantConv1d`` / ``QuantConv2d`` (weight quantizer with
    a uniform grid; bias quantized or exactly on a binary grid), quantized neurons
    (:class:`~snnquant.nn.QuantIFNode`, :class:`~snnquant.nn.QuantLIFNode` with :math:`\tau = 2^k`,
    :class:`~snnquant.nn.QuantParametricLIFNode` whose :math:`\mathrm{sigmoid}(w)` is a power of
    two; membrane quantizer with a power-of-two step; hard or soft reset), max pooling, average
    pooling of spikes over :math:`2^a` elements (also adaptive, given ``input_shape``; a
    ``VotingLayer`` over any number of neurons as the last layer), flatten (module or
    ``torch.flatten``), identity-in-eval modules (``Identity``, ``Dropout``), and joins
    (:class:`~snnquant.export.JoinOp`): ``+`` of two branches, and ``sew_resnet``'s connect
    function ``sew_function`` with ``cnf='ADD'``, ``'AND'`` (:math:`x y`) or ``'IAND'``
    (:math:`x (1 - y)`) on spikes. A sum of two values on the grids :math:`2^{-F_1}` and
    :math:`2^{-F_2}` is computed on :math:`2^{-\max(F_1, F_2)}`, the coarser operand shifted
    left; it is exported only when the float model's sum is exact,

    .. math::

        \sum_i \max|x_i|\, 2^{\sigma_i} \le 2^p \quad\text{(integer units of the common grid)},

    and refused with the join's name otherwise. BatchNorm must be folded first
    (:func:`~snnquant.export.fold_batchnorm`). Anything else is refused with an
    :class:`~snnquant.export.ExportError` naming the layer and the reason.

    A chip network (an ``nn.Sequential`` of :mod:`snnquant.targets` layers: Xylo, Loihi 2 or
    Speck) is exported layer by layer to the chip's operations
    (:mod:`~snnquant.export.ir.chip_ops`), which compute in the chip's integers with the step
    the layers trained with; ``input_max`` and ``leak_bits`` are the chip's and must not be
    given, ``input_shape`` (if given) must fit the first layer, ``reference_dtype`` and
    ``example_input`` are not used.

    The result reproduces the fake-quantized model *in eval mode*, evaluated in
    ``reference_dtype``, exactly: the same spikes at every layer and step (see the module
    documentation for the grid and the bounds). Per synaptic layer :math:`X = (A m) \ll \sigma + b`
    with the accumulator :math:`A = \sum w x`; per neuron the charge on the shared grid and

    .. math::

        q = \mathrm{clamp}(\mathrm{rhe}(H, d + k), v_{min}, v_{max}),\quad S = [q \ge \theta]

    With power-of-two weight steps (``QuantConfig(weight_quantizer='lsq_pow2')``) every
    multiplier :math:`m` is 1 and the export is exact against the float32 model. A learned step
    that is not a power of two rounds in float32; it is exported only with
    ``reference_dtype=torch.float64`` (exact against the model run in float64, the multiplier
    :math:`m` is the step's odd significand).

    A LIF :math:`\tau` (or parametric LIF :math:`1/\mathrm{sigmoid}(w)`) that is not a power of
    two is refused by default: the float division rounds and no integer operation reproduces it.
    With ``leak_bits=F`` such a layer is exported *approximately* instead, its leak as the
    fixed-point multiplier

    .. math::

        \frac{1}{\tau} \approx \frac{M}{2^F},\qquad M = \mathrm{round}\Big(\frac{2^F}{\tau}
        \Big)\ \text{or}\ \mathrm{round}\big(2^F\,\mathrm{sigmoid}(w)\big)
        \quad\text{(half to even, on the exact value)},

        L = \mathrm{rhe}\big(M\,(X_0 - ((v - v_r) \ll d)),\ r\big),\qquad
        q = \mathrm{clamp}\big(\mathrm{rhe}((v \ll (d + F - r)) + L,\ d + F - r),\
        v_{min}, v_{max}\big),\qquad r = \lceil F/2 \rceil

    (``decay_input``; see :class:`~snnquant.export.NeuronOp` for the other form and why the
    leak product is rounded first, to :math:`\lfloor F/2 \rfloor` guard bits below the shared
    grid): two roundings per step, both with the same tie rule. The layer and the network get ``exact=False``:
    the spikes may differ from the float model's (measure it with
    :func:`~snnquant.export.compare_integer`). A power-of-two :math:`\tau` keeps the exact shift
    even when ``leak_bits`` is given. The float-exactness bound is not checked for such a layer;
    the int64 bound is.

    Args:
        model: the quantized network (from :func:`snnquant.quantize_model`, trained or not). It
            is not modified.
        reference_dtype: ``torch.float32`` or ``torch.float64``; default: the dtype of the
            model's parameters.
        input_max: largest input magnitude the network must accept exactly (event counts per
            pixel and step); default: the largest value of ``example_input`` rounded up
            (:func:`input_max_of`) when one is given, else the largest that the first layer's
            accumulator bound allows (which can be millions, and goes into ``SNN_INPUT_MAX`` of
            the C model: pass the largest count of your data). Inputs of binary spikes need 1.
            A refusal of an accumulator bound says which ``input_max`` it was checked at and
            where that number came from.
        leak_bits: ``None`` (default: refuse a :math:`\tau` that is not a power of two), or the
            fractional bits :math:`F` (an int in ``[1, 32]``, e.g. 8..16) of the fixed-point
            leak multiplier of such layers (approximate export).
        input_shape: one sample's input shape (without time and batch), needed only when the
            network has an adaptive average pool (its divisor depends on the input size);
            default: that of ``example_input``.
        example_input: one input batch (``[T, N, ...]`` for a multi-step network): the graph is
            then captured from a run of the model on it (:func:`~snnquant.capture.capture`),
            which follows Python that depends only on shapes (``if x.ndim != 5: raise``) and
            blocks in an ``nn.ModuleList``. Default ``None``: torch.fx symbolic tracing.

    Returns:
        An :class:`~snnquant.export.IntegerNetwork`.

    Raises:
        ExportError: a layer cannot be represented exactly (the message names it and why);
            a :class:`~snnquant.capture.CaptureError` when the graph cannot be captured
            (it names the innermost submodule, its class, the file and line, and what to change).
        ValueError: a bad argument (``reference_dtype``, ``input_max``, ``leak_bits``,
            ``input_shape``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if any(callable(getattr(m, "integer_op", None)) for m in model.modules()):
        given = {k: v for k, v in (("input_max", input_max), ("leak_bits", leak_bits))
                 if v is not None}
        if given:
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())}: a chip "
                             f"network's input range and arithmetic are the chip's; give none")
        desc = _chip_network(model)
        if input_shape is not None:
            op_shapes(desc, check_input_shape(input_shape))
        return desc
    if reference_dtype is None:
        fp = [t.dtype for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
        reference_dtype = fp[0] if fp else torch.float32
    if reference_dtype not in _MANTISSA_BITS:
        raise ValueError(f"reference_dtype must be torch.float32 or torch.float64, got "
                         f"{reference_dtype!r}")
    if input_max is not None and (isinstance(input_max, bool) or not isinstance(input_max, int)
                                  or input_max < 1):
        raise ValueError(f"input_max must be None or an int >= 1, got {input_max!r}")
    lo, hi = LEAK_BITS_RANGE
    if leak_bits is not None and (isinstance(leak_bits, bool) or not isinstance(leak_bits, int)
                                  or not lo <= leak_bits <= hi):
        raise ValueError(f"leak_bits must be None or an int in [{lo}, {hi}], got {leak_bits!r}")
    if input_shape is not None:
        input_shape = check_input_shape(input_shape)
    p = _MANTISSA_BITS[reference_dtype]
    work = copy_model(model).to(reference_dtype).cpu()
    if isinstance(example_input, torch.Tensor):
        example_input = example_input.to(reference_dtype).cpu()
    captured = capture(work, example_input)
    if input_shape is None and isinstance(example_input, torch.Tensor):
        # one sample's shape, which an adaptive pool's divisor depends on
        input_shape = tuple(example_input.shape[2 if _is_multi_step(work) else 1:])
    input_max_from = "given"
    if input_max is None and isinstance(example_input, torch.Tensor):
        input_max, input_max_from = input_max_of(example_input), "example_input"
    graph = _GraphBuilder(work, reference_dtype, p, input_max, leak_bits, input_shape, captured)
    try:
        out = graph.build()
    except ExportError as err:
        if getattr(err, "check", None) == "accumulator":
            said = _input_max_said(input_max, input_max_from, graph)
            raise tagged(ExportError(f"{err} [{said}]"), "accumulator") from None
        raise
    ops, notes = graph.ops, graph.notes
    if not graph.seen_synapse:
        raise ExportError("the model has no synaptic layer to export")
    if out != len(ops) - 1:
        raise ExportError(f"the model's output is the value of {ops[out].name!r}, not of the last "
                          f"operation {ops[-1].name!r}: operations after it are not used")
    for op in ops[:-1]:
        if getattr(op, "divisor", 1) != 1:
            raise ExportError(f"layer {op.name!r}: it averages {op.divisor} values, not a power "
                              f"of two, so its output is not an exact binary fraction; such an "
                              f"average is exported only as the network's last operation")
    allowed_input = graph.allowed_input
    if input_max is None:
        input_max = min(allowed_input, (1 << 31) - 1) if allowed_input is not None else (1 << 31) - 1
    last = graph.values[out]
    if last.domain == "current" or (not last.binary and not (
            isinstance(ops[out], PoolOp) and ops[out].kind == "sum") and not isinstance(
            ops[out], (FlattenOp, JoinOp))) or (
            isinstance(ops[out], FlattenOp) and last.frac > 0):
        output_kind, output_frac = "current", last.frac
    else:
        output_kind, output_frac = "spikes", 0
    return IntegerNetwork(ops=ops, input_max=int(input_max), output_kind=output_kind,
                          output_frac_bits=int(output_frac),
                          reference_dtype=str(reference_dtype).replace("torch.", ""),
                          mantissa_bits=p, notes=notes, output_time_mean=last.time_mean)
