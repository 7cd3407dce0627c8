"""The torch front end's neuron layers: a quantized IF/LIF neuron (any kind of the neuron
registry) as a :class:`~snnquant.export.NeuronOp`, with its leak and grid."""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from ...nn import registry
from ...functional.int_limits import INT64_HEADROOM_BITS
from ...functional.int_limits import pow2_exponent
from ..ir.network import NeuronOp
from .common import as_dtype_float, fail_layer
from .deploy_checks import exact_leak_shift, tau_refusal

__all__ = ["export_neuron"]


# --------------------------------------------------------------------------------------------------
# neurons

def export_neuron(name, module, dtype, p, in_frac, cur_log2, leak_bits=None):
    neuron_kind = registry.neuron_kind(module)
    if neuron_kind is None:
        supported = ", ".join(k.float_cls.__name__ for k in registry.NEURON_KINDS)
        fail_layer(name, module, f"this neuron type has no integer form; the supported neurons are "
                            f"{supported} (quantized with quantize_model / "
                            f"QuantConfig(v_bits=...))")
    if not isinstance(module, neuron_kind.quant_cls):
        fail_layer(name, module, "unquantized neuron; quantize it with quantize_model / "
                            "QuantConfig(v_bits=...)")
    vq = module.v_quant
    if vq is None:
        fail_layer(name, module, "the membrane is not quantized (v_quant is None)")
    if not vq.is_initialized:
        fail_layer(name, module, f"the membrane quantizer {type(vq).__name__} was never initialised; "
                            f"run the model on data first (or load a trained state_dict)")
    grid = vq.grid()
    if grid is None or grid.step is None:
        fail_layer(name, module, f"the membrane quantizer {type(vq).__name__} has no uniform grid "
                            f"(its levels are not equally spaced), so the membrane is not an "
                            f"integer times one scale; use membrane_quantizer='uniform'")
    if not grid.per_tensor:
        fail_layer(name, module, "the membrane step is not one scalar (per-channel membrane grid)")
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
        fail_layer(name, module, f"the membrane step {s_v!r} is not a power of two, so the float "
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
                    fail_layer(name, module, tau_refusal(1 / kval, learned=True), "tau")
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
                    fail_layer(name, module, tau_refusal(module.tau), "tau")
                if not (math.isfinite(tau_src) and tau_src > 0):
                    fail_layer(name, module, f"tau = {module.tau!r} must be finite and > 0")
                k, multiplier = leak_bits, _leak_multiplier(name, module, 1 / Fraction(tau_src),
                                                            leak_bits, f"1/tau = 1/{tau_src!r}")
                exact, round_shift = False, leak_bits - leak_bits // 2
            else:
                k = e
    # threshold and reset, in membrane units, as the float model computes them
    step_f = Fraction(s_v)
    vth_values = {as_dtype_float(module.v_threshold, dtype), float(module.v_threshold)}
    ths = {math.ceil(Fraction(v) / step_f) for v in vth_values}
    if len(ths) != 1:
        fail_layer(name, module, f"v_threshold={module.v_threshold!r} is not representable in {dtype} "
                            f"and a membrane level lies between its two roundings")
    threshold = ths.pop()
    if module.v_reset is None:
        reset_mode, v_reset = "soft", 0
    else:
        vr_values = {as_dtype_float(module.v_reset, dtype), float(module.v_reset)}
        vrs = {min(max(round(Fraction(v) / step_f), qmin), qmax) for v in vr_values}
        if len(vrs) != 1:
            fail_layer(name, module, f"v_reset={module.v_reset!r} is not representable in {dtype} and "
                                f"its two roundings snap to different levels")
        reset_mode, v_reset = "hard", vrs.pop()
    grid_frac = max(in_frac, -e_v)
    input_shift = grid_frac - in_frac
    d = grid_frac + e_v
    R = max(abs(qmin), abs(qmax)) + abs(threshold) + 1
    need = ((1 << (k + 2)) + 4) * R * (1 << d)
    if exact and need > (1 << p):
        fail_layer(name, module, f"the charge of a {qmax - qmin + 1}-level membrane on the shared grid "
                            f"2^-{grid_frac} (membrane step 2^{e_v}, currents with {in_frac} "
                            f"fractional bits, leak shift {k}) needs {math.log2(need):.1f} "
                            f"significand bits, more than {dtype}'s {p}: the float model's charge "
                            f"is not exact. Use fewer v_bits or a coarser weight/bias step")
    lm = max(k, math.log2(multiplier))  # |M * y| <= 2^lm |y|
    h_bits = max(cur_log2 + input_shift + lm, math.log2(R) + d + lm) + 2
    if h_bits > INT64_HEADROOM_BITS:
        fail_layer(name, module, f"the integer charge needs {h_bits:.0f} bits, more than int64 holds")
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
        fail_layer(name, module, f"{what} rounds to the multiplier 0 on leak_bits={leak_bits} "
                            f"fractional bits (round(2^{leak_bits} * {float(decay):.6g}) = 0): "
                            f"use more leak_bits")
    return int(m)
