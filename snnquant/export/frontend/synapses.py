"""The torch front end's synaptic layers (linear, convolutions): integer weights, bias and
rescale of a quantized layer, with the float-exactness bound of its accumulator."""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from ...nn import registry
from ...utils import copy_model
from ...functional.int_limits import pow2_exponent
from ..ir.integer_ops import narrowest_int
from ..ir.network import SynapseOp
from .common import fail_layer, float_frac_bits, mantissa_exponent
from .deploy_checks import accumulator_fix

__all__ = ["export_synapse"]


# --------------------------------------------------------------------------------------------------
# synaptic layers

def _weight_integers(name, layer, dtype):
    """Integer weights ``q``, per-channel steps (floats) and bit width of a quantized layer."""
    wq = layer.weight_quant
    if wq is None:
        fail_layer(name, layer, "the weights are not quantized (weight_quant is None); quantize the "
                           "layer with quantize_model / QuantConfig(weight_bits=...)")
    probe = copy_model(layer).eval()
    pq = probe.weight_quant
    W = probe.weight.detach()
    c_out = W.shape[0]
    try:
        with torch.no_grad():
            Wq = probe.quantized_weight().detach()
    except RuntimeError as exc:
        fail_layer(name, layer, f"the weight quantizer cannot quantize yet: {exc}")
    grid = pq.grid()
    if grid is None or grid.step is None:
        fail_layer(name, layer, f"the weight quantizer {pq!r} has no uniform integer grid (its grid() "
                           f"is {grid!r}), so the weights are not integers times one step")
    step, qmin, qmax = grid.step.detach().to(dtype), grid.qmin, grid.qmax
    step_c = step.reshape(-1)
    if step_c.numel() == 1:
        step_c = step_c.expand(c_out)
    if step_c.numel() != c_out:
        fail_layer(name, layer, f"weight step has {step_c.numel()} values for {c_out} output channels")
    shape = [c_out] + [1] * (W.dim() - 1)
    s = step_c.reshape(shape)
    q = torch.round(Wq.double() / s.double()).to(torch.int64)
    lo = torch.as_tensor(qmin).reshape(-1).to(torch.int64)
    hi = torch.as_tensor(qmax).reshape(-1).to(torch.int64)
    q_lo, q_hi = int(lo.min()), int(hi.max())
    steps = [float(v) for v in step_c.double()]
    if any(not (math.isfinite(v) and v > 0) for v in steps):
        fail_layer(name, layer, f"weight step must be finite and > 0, got {steps[:4]}")
    parts = [mantissa_exponent(v) for v in steps]
    max_m = max(m for m, _ in parts)
    # the fewest bits of a two's-complement range holding [q_lo, q_hi] (5 for [-16, 15])
    bits = grid.bits or max((-q_lo - 1).bit_length(), q_hi.bit_length()) + 1
    if max_m.bit_length() + max(abs(q_lo), abs(q_hi)).bit_length() > 52:
        fail_layer(name, layer, f"weight step {steps[0]!r} has {max_m.bit_length()} significant bits, so "
                           f"integer * step is rounded even in float64 (a min/max range step "
                           f"r / (2^(b-1) - 1) is such a step); use weight_quantizer='lsq_pow2'")
    exact = torch.equal(Wq.double(), q.double() * s.double()) and bool(
        (q.reshape(c_out, -1) >= lo.reshape(-1, 1)).all() and (q.reshape(c_out, -1) <= hi.reshape(-1, 1)).all())
    if not exact:
        fail_layer(name, layer, _non_pow2_advice(steps, dtype, "its quantized weights are not exactly "
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


def export_synapse(name, layer, dtype, p, in_frac, x_bound, input_max):
    """Build a SynapseOp; returns (op, out_frac, current_log2_bound, allowed_input_max)."""
    layer_kind = registry.layer_kind(layer)
    if layer_kind is None or not isinstance(layer, layer_kind.quant_cls):
        fail_layer(name, layer, "unquantized synaptic layer; quantize it with quantize_model (whose "
                           "report's skipped list says why it left a layer float, e.g. a "
                           "subclass with its own forward such as WSConv2d)")
    if layer_kind.spatial_dims and layer.padding_mode != "zeros":
        fail_layer(name, layer, f"padding_mode={layer.padding_mode!r} is not supported (only 'zeros')")
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
            fail_layer(name, layer, "the bias is not finite")
        f_b = max(float_frac_bits(v) for v in bias_vals)
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
            fail_layer(name, layer, _non_pow2_advice(
                steps, dtype, f"the bias of output channel {c} cannot be added exactly on the "
                              f"grid 2^{u} that the weight step imposes"))
        if b_term > limit:
            fail_layer(name, layer, f"the bias of output channel {c} ({bias_vals[c]!r}) needs more than "
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
            fail_layer(name, layer, why, "accumulator")
        if input_max is not None and allowed is not None and input_max > allowed:
            fail_layer(name, layer, f"input_max={input_max} is too large: inputs above {allowed} make "
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
            fail_layer(name, layer, why, "accumulator")
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
