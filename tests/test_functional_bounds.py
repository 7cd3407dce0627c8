"""Accepted values never hang, exhaust memory or return NaN (issue 11, section 4).

Each test here failed before the fix: ``state_quant`` allocated 2**num_bits levels (32 GiB at 32
bits), a step outside the dtype's range returned NaN or -inf, bool/complex inputs raised torch's
NotImplementedError, and ``clamp_by_linear`` raised torch's reduction error on an empty tensor.
"""

import pytest
import torch

import snnquant
from snnquant import functional as Q

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


# --- state_quant: a documented bit limit ------------------------------------------------------


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("bits", [21, 26, 32])
def test_state_quant_refuses_bit_widths_above_the_limit_at_once(bits, uniform):
    with pytest.raises(ValueError) as info:
        Q.state_quant(num_bits=bits, uniform=uniform)
    message = str(info.value)
    assert "num_bits" in message and str(bits) in message
    assert str(Q.STATE_QUANT_MAX_BITS) in message


def test_state_quant_at_the_limit_still_works():
    quantizer = Q.state_quant(num_bits=Q.STATE_QUANT_MAX_BITS, uniform=False)
    assert quantizer.levels.numel() == 2**Q.STATE_QUANT_MAX_BITS
    y = quantizer(torch.linspace(-1.5, 1.5, 101))
    assert torch.isfinite(y).all()


def test_threshold_centered_membrane_with_too_many_bits_is_refused_by_quant_config():
    with pytest.raises(ValueError) as info:
        snnquant.QuantConfig(v_bits=32, membrane_quantizer="threshold_centered")
    message = str(info.value)
    assert "v_bits" in message and "32" in message and str(Q.STATE_QUANT_MAX_BITS) in message
    # a uniform membrane has no table and keeps the full range
    snnquant.QuantConfig(v_bits=32, membrane_quantizer="uniform")


def test_state_quant_multiplier_whose_powers_overflow_is_a_value_error():
    with pytest.raises(ValueError, match="multiplier"):
        Q.state_quant(num_bits=12, uniform=False, multiplier=2.0)


# --- steps that do not fit the dtype --------------------------------------------------------------


@pytest.mark.parametrize("step", [1e300, 1e39, 1e-45, 1e-50])
def test_step_quantize_step_not_representable_in_float32(step):
    x = torch.randn(16)
    with pytest.raises(ValueError) as info:
        Q.step_quantize(x, step)
    message = str(info.value)
    assert "step" in message and "float32" in message and repr(step) in message


@pytest.mark.parametrize("step", [1e300, 1e-45])
def test_lsq_quantize_step_not_representable_in_float32(step):
    x = torch.randn(16)
    with pytest.raises(ValueError) as info:
        Q.lsq_quantize(x, step, -8, 7)
    assert "step" in str(info.value) and "float32" in str(info.value)
    with pytest.raises(ValueError, match="float32"):
        Q.lsq_quantize(x, torch.tensor([step], dtype=torch.float64).float().clamp(min=1e-45)
                       if step < 1 else torch.tensor(float("3e38")), -8, 7)


def test_lsq_quantize_largest_level_times_step_must_not_overflow():
    with pytest.raises(ValueError, match="overflows torch.float16"):
        Q.lsq_quantize(torch.zeros(3, dtype=torch.float16), 1000.0, -128, 127)


def test_the_same_steps_are_fine_in_float64():
    x = torch.tensor([1.0, -2.5, 3e-300], dtype=torch.float64)
    assert torch.equal(Q.step_quantize(x, 1e300), torch.zeros(3, dtype=torch.float64))
    y = Q.lsq_quantize(x, 1e300, -8, 7)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_step_quantize_never_returns_nan_or_inf_for_finite_input(dtype):
    info = torch.finfo(dtype)
    x = torch.tensor([0.0, 1.0, -3.0, 100.0], dtype=dtype)
    for step in (info.tiny, 0.5, 1.0, 2.0, info.max / 4):
        try:
            y = Q.step_quantize(x, step)
        except ValueError as error:
            assert "step" in str(error) and str(dtype) in str(error)
            continue
        assert torch.isfinite(y).all(), (step, y)


def test_step_quantize_quotient_overflow_is_a_value_error():
    # 1e-37 is a normal float32, but 100 / 1e-37 overflows float32
    x = torch.tensor([0.5, 100.0, float("inf")])
    with pytest.raises(ValueError) as info:
        Q.step_quantize(x, 1e-37)
    assert "step" in str(info.value) and "float32" in str(info.value)
    # infinities alone do not count: they stay infinite as documented
    y = Q.step_quantize(torch.tensor([1e-37, float("-inf")]), 1e-37)
    assert y[0] == torch.tensor(1e-37) and y[1] == float("-inf")


def test_tensor_step_is_checked_in_the_promoted_dtype():
    with pytest.raises(ValueError, match="float32"):
        Q.step_quantize(torch.randn(4), torch.tensor(1e-40))  # a float32 subnormal
    # a float64 step tensor with dims promotes x to float64, where 1e-300 is normal
    y = Q.step_quantize(torch.tensor([0.25]), torch.tensor([1e-300], dtype=torch.float64))
    assert y.dtype == torch.float64


# --- dtypes: the same clear TypeError everywhere -----------------------------------------------------

BOOL = torch.tensor([True, False])
COMPLEX = torch.tensor([1 + 1j, -0.5j])


@pytest.mark.parametrize("name", ["round", "ceil", "floor", "pass_round", "soft_round"])
@pytest.mark.parametrize("x", [BOOL, COMPLEX], ids=["bool", "complex"])
def test_rounding_bool_or_complex_is_a_type_error_naming_the_dtype(name, x):
    with pytest.raises(TypeError) as info:
        getattr(Q, name)(x)
    message = str(info.value)
    assert message.startswith(f"{name}: x must be") and str(x.dtype) in message


@pytest.mark.parametrize("call", [lambda x: Q.clamp(x, -1.0, 1.0),
                                  lambda x: Q.multi_level_spike_count(x, 3)],
                         ids=["clamp", "multi_level_spike_count"])
def test_clamp_complex_is_a_type_error_naming_the_dtype(call):
    with pytest.raises(TypeError) as info:
        call(COMPLEX)
    assert "x must be" in str(info.value) and "complex64" in str(info.value)


def test_rounding_integers_still_accepted():
    x = torch.tensor([-2, 0, 3])
    for name in ("round", "ceil", "floor", "pass_round", "soft_round"):
        assert torch.equal(getattr(Q, name)(x), x), name


# --- clamp_by_linear on an empty tensor ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_clamp_by_linear_empty_tensor_gives_an_empty_tensor(shape, dtype):
    x = torch.empty(shape, dtype=dtype)
    y = Q.clamp_by_linear(x)
    assert y.shape == x.shape and y.numel() == 0
    assert y.dtype == (dtype if dtype.is_floating_point else torch.get_default_dtype())


def test_clamp_by_linear_empty_tensor_backward():
    x = torch.empty(0, 3, requires_grad=True)
    Q.clamp_by_linear(x).sum().backward()
    assert x.grad.shape == (0, 3)


# --- Python floats where SpikingJelly's state starts as one -----------------------------------------


@pytest.mark.parametrize("call", [
    lambda v: Q.step_quantize(v, 0.125),
    lambda v: Q.lsq_quantize(v, 0.125, -16, 15),
    lambda v: Q.round(v),
    lambda v: Q.floor(v),
    lambda v: Q.ceil(v),
    lambda v: Q.clamp(v, -1.0, 1.0),
    lambda v: Q.k_bit_quantize(v, 3),
    lambda v: Q.quantized_bits(v, 4),
    lambda v: Q.state_quant(4)(v),
    lambda v: Q.stochastic_round(v),
    lambda v: Q.pass_round(v),
    lambda v: Q.soft_round(v),
], ids=["step_quantize", "lsq_quantize", "round", "floor", "ceil", "clamp", "k_bit_quantize",
        "quantized_bits", "state_quant", "stochastic_round", "pass_round", "soft_round"])
def test_functional_quantizers_accept_a_python_float_state(call):
    y = call(0.0)
    assert isinstance(y, torch.Tensor) and y.dim() == 0
    assert y.dtype == torch.get_default_dtype()
    assert torch.equal(y, call(torch.tensor(0.0)))
