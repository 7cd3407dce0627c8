"""What every function in snnquant.functional promises: all four float dtypes on CPU and CUDA, no
in-place modification of the input, NaN in gives NaN out, clear errors for bad arguments."""

import math

import pytest
import torch

from snnquant import functional as Q

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not torch.cuda.is_available(),
                reason="needs a CUDA GPU: torch.cuda.is_available() is False",
            ),
        ],
    ),
]

_STATE = {}


def _state_quant(x):
    # Built once per test session; StateQuantizer caches its level table per dtype and device.
    if "q" not in _STATE:
        _STATE["q"] = Q.state_quant(num_bits=4, uniform=False)
    return _STATE["q"](x)


def _generator(x):
    return torch.Generator(device=x.device).manual_seed(0)


# name -> call; each returns a tensor computed from x (with the dtype of x).
FUNCTIONS = {
    "round": Q.round,
    "ceil": Q.ceil,
    "floor": Q.floor,
    "clamp": lambda x: Q.clamp(x, -1.0, 1.5),
    "step_quantize": lambda x: Q.step_quantize(x, 0.25),
    "multi_level_spike_count": lambda x: Q.multi_level_spike_count(x, 3),
    "k_bit_quantize": lambda x: Q.k_bit_quantize(x, 4),
    "affine_k_bit_quantize": lambda x: Q.affine_k_bit_quantize(x, 4, 2.0, -1.0),
    "clamp_by_linear": Q.clamp_by_linear,
    "pass_round": Q.pass_round,
    "soft_round": Q.soft_round,
    "scale_grad": Q.scale_grad,
    "smooth_round": lambda x: Q.smooth_round(x, 4.0),
    "round_decimals": lambda x: Q.round_decimals(x, 1),
    "stochastic_round": lambda x: Q.stochastic_round(x, 0.5, _generator(x)),
    "round_through": lambda x: Q.round_through(x, step=0.5),
    "round_through_stochastic": lambda x: Q.round_through(x, True, 0.5, _generator(x)),
    "quantized_bits": lambda x: Q.quantized_bits(x, 4, 1),
    "quantized_bits_1bit": lambda x: Q.quantized_bits(x, 1, alpha=0.5),
    "quantized_bits_stochastic": lambda x: Q.quantized_bits(
        x, 6, stochastic=True, generator=_generator(x)
    ),
    "lsq_quantize": lambda x: Q.lsq_quantize(x, 0.25, -8, 7),
    "lsq_quantize_tensor_step": lambda x: Q.lsq_quantize(
        x, torch.tensor(0.25, dtype=x.dtype, device=x.device, requires_grad=True), -8, 7
    ),
    "state_quant": _state_quant,
}

# Functions whose output can be fractional: integer and bool tensors are refused.
FRACTIONAL = {
    "step_quantize": lambda x: Q.step_quantize(x, 0.5),
    "k_bit_quantize": lambda x: Q.k_bit_quantize(x, 4),
    "affine_k_bit_quantize": lambda x: Q.affine_k_bit_quantize(x, 4, 2.0, 1.0),
    "clamp_by_linear": Q.clamp_by_linear,
    "smooth_round": lambda x: Q.smooth_round(x, 2.0),
    "round_decimals": lambda x: Q.round_decimals(x, 1),
    "stochastic_round": Q.stochastic_round,
    "round_through": Q.round_through,
    "quantized_bits": Q.quantized_bits,
    "lsq_quantize": lambda x: Q.lsq_quantize(x, 0.5, -2, 1),
    "state_quant": Q.state_quant(num_bits=2),
}


def _sample(dtype, device):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(5, 7, generator=gen, dtype=torch.float64) * 3 - 1
    x[0, :5] = torch.tensor([0.0, 0.5, 1.0, -0.25, 1.5])
    return x.to(dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_dtype_and_device_coverage(name, dtype, device):
    fn = FUNCTIONS[name]
    x = _sample(dtype, device)
    leaf = x.clone().requires_grad_(True)
    y = fn(leaf)
    assert y.dtype == dtype and y.device == leaf.device and y.shape == x.shape
    y.backward(torch.ones_like(y))
    assert leaf.grad.dtype == dtype and leaf.grad.shape == x.shape
    assert torch.isfinite(leaf.grad).all()
    # Same values as the float64 computation, up to the dtype's rounding of the result.
    if name not in ("stochastic_round", "round_through_stochastic", "quantized_bits_stochastic"):
        reference = fn(x.double()).to(dtype)
        # 16-bit arithmetic (as SpikingJelly's) can move a value that lies near a rounding boundary
        # by one level: at most 2/15 here (affine_k_bit_quantize, 4 bits, w=2), plus the rounding.
        tolerance = {torch.float16: 2e-2, torch.bfloat16: 0.15}.get(dtype, 1e-6)
        torch.testing.assert_close(y.detach(), reference, rtol=0, atol=tolerance)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_input_is_not_modified_in_place(name, device):
    fn = FUNCTIONS[name]
    for requires_grad in (False, True):
        x = _sample(torch.float32, device).requires_grad_(requires_grad)
        before = x.detach().clone()
        version = x._version
        y = fn(x)
        if requires_grad:
            y.backward(torch.ones_like(y))
        assert x._version == version
        assert torch.equal(x.detach(), before)
        assert y.data_ptr() != x.data_ptr() or name == "scale_grad"


# clamp_by_linear is left out: one NaN makes min(x) and max(x) NaN, so the whole output is NaN
# (test_clamp_by_linear_nan_spreads)
@pytest.mark.parametrize("name", sorted(set(FUNCTIONS) - {"clamp_by_linear"}))
def test_nan_in_gives_nan_out(name):
    x = torch.tensor([0.3, float("nan"), -0.7, 1.2, float("nan")])
    y = FUNCTIONS[name](x)
    assert torch.isnan(y[[1, 4]]).all()
    assert not torch.isnan(y[[0, 2, 3]]).any()


def test_clamp_by_linear_nan_spreads():
    assert torch.isnan(Q.clamp_by_linear(torch.tensor([0.3, float("nan"), 1.0]))).all()


def test_infinities_follow_the_formula_for_clamping_functions():
    inf = float("inf")
    x = torch.tensor([-inf, inf, 0.4])
    assert torch.equal(Q.clamp(x, -1.0, 2.0), torch.tensor([-1.0, 2.0, 0.4]))
    assert torch.equal(Q.multi_level_spike_count(x, 3), torch.tensor([0.0, 3.0, 0.0]))
    assert torch.equal(Q.quantized_bits(x, 4), torch.tensor([-1.0, 0.875, 0.375]))
    assert torch.equal(Q.quantized_bits(x, 1), torch.tensor([-1.0, 1.0, 1.0]))
    assert torch.equal(Q.lsq_quantize(x, 0.5, -4, 3), torch.tensor([-2.0, 1.5, 0.5]))
    levels = Q.state_quant(3).levels_for(torch.float32)
    assert torch.equal(Q.state_quant(3)(x[:2]), levels[[0, -1]])
    leaf = x.clone().requires_grad_(True)
    Q.clamp(leaf, -1.0, 2.0).sum().backward()
    assert torch.equal(leaf.grad, torch.tensor([0.0, 0.0, 1.0]))
    # Unbounded functions keep infinities.
    for fn in (Q.round, Q.step_quantize, Q.stochastic_round, lambda t: Q.round_decimals(t, 2)):
        assert torch.equal(fn(x[:2]), x[:2])


# SpikingJelly's own functions turn integer tensors into a float result (issue 11, section 5);
# see test_functional_spikingjelly.py. Bool stays refused everywhere.
SPIKINGJELLY_FLOAT_RESULT = {"step_quantize", "k_bit_quantize", "affine_k_bit_quantize",
                             "clamp_by_linear"}


@pytest.mark.parametrize("name, dtype", [
    (name, dtype) for name in sorted(FRACTIONAL)
    for dtype in (torch.int32, torch.int64, torch.bool, torch.uint8)
    if name not in SPIKINGJELLY_FLOAT_RESULT or dtype == torch.bool], ids=str)
def test_integer_tensors_refused_where_the_result_can_be_fractional(name, dtype):
    x = torch.tensor([0, 1, 1, 0]).to(dtype)
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64") as info:
        FRACTIONAL[name](x)
    assert str(dtype) in str(info.value)


def test_non_tensor_input_refused():
    with pytest.raises(TypeError, match="torch.Tensor"):
        Q.k_bit_quantize([0.1, 0.2], 2)


BITS_CALLS = {
    "k_bit_quantize": ("k", lambda v: Q.k_bit_quantize(torch.rand(3), v)),
    "affine_k_bit_quantize": ("k", lambda v: Q.affine_k_bit_quantize(torch.rand(3), v, 1.0, 0.0)),
    "quantized_bits": ("bits", lambda v: Q.quantized_bits(torch.rand(3), bits=v)),
    "state_quant": ("num_bits", lambda v: Q.state_quant(num_bits=v)),
}


@pytest.mark.parametrize("bad", [0, -1, 33, 2.5, 8.0, True, "8", None])
@pytest.mark.parametrize("name", sorted(BITS_CALLS))
def test_bad_bits_raise_value_error_naming_argument_and_value(name, bad):
    argument, call = BITS_CALLS[name]
    with pytest.raises(ValueError) as info:
        call(bad)
    message = str(info.value)
    assert argument in message and repr(bad) in message


@pytest.mark.parametrize("good", [1, 32])
def test_bits_bounds_are_accepted(good):
    Q.k_bit_quantize(torch.rand(3), good)
    Q.quantized_bits(torch.rand(3), bits=good)


@pytest.mark.parametrize("bad", [0.0, -0.5, math.inf, math.nan])
def test_bad_step_raises(bad):
    x = torch.rand(3)
    for call in (
        lambda: Q.step_quantize(x, bad),
        lambda: Q.stochastic_round(x, bad),
        lambda: Q.round_through(x, step=bad),
        lambda: Q.lsq_quantize(x, bad, -2, 1),
    ):
        with pytest.raises(ValueError, match=r"step must be finite and > 0, got"):
            call()


def test_bad_tensor_step_raises():
    with pytest.raises(ValueError, match="step"):
        Q.lsq_quantize(torch.rand(3), torch.tensor([0.5, 0.0, 0.1]), -2, 1)
    with pytest.raises(ValueError, match="step"):
        Q.step_quantize(torch.rand(3), torch.tensor([-1.0]))


def test_min_greater_than_max_raises():
    with pytest.raises(ValueError, match=r"min_value.*max_value.*2\.0.*1\.0"):
        Q.clamp(torch.rand(3), 2.0, 1.0)
    with pytest.raises(ValueError, match="min_value"):
        Q.clamp(torch.rand(3), torch.tensor([0.0, 3.0, 0.0]), torch.tensor([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        Q.clamp(torch.rand(3), math.nan, 1.0)
    with pytest.raises(ValueError, match="grad_window"):
        Q.multi_level_spike_count(torch.rand(3), 3, grad_window=(2.0, 1.0))
    with pytest.raises(ValueError, match="max_spike_count"):
        Q.multi_level_spike_count(torch.rand(3), -1)
    with pytest.raises(ValueError, match="max_spike_count"):
        Q.multi_level_spike_count(torch.rand(3), 2.5)


def test_clamp_one_sided_bounds():
    x = torch.tensor([-2.0, 0.5, 3.0], requires_grad=True)
    y = Q.clamp(x, None, 1.0)
    assert torch.equal(y, torch.tensor([-2.0, 0.5, 1.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 1.0, 0.0]))


@pytest.mark.parametrize("qmin,qmax", [(3, 3), (4, -4), (0.5, 3), (-2, 1.5)])
def test_bad_lsq_levels_raise(qmin, qmax):
    with pytest.raises(ValueError, match="qmin|qmax") as info:
        Q.lsq_quantize(torch.rand(3), 0.5, qmin, qmax)
    assert str(qmin) in str(info.value) or str(qmax) in str(info.value)


def test_other_bad_arguments():
    x = torch.rand(3)
    with pytest.raises(ValueError, match="alpha"):
        Q.smooth_round(x, 0.0)
    with pytest.raises(ValueError, match="decimals"):
        Q.round_decimals(x, 1.5)
    with pytest.raises(ValueError, match="decimals"):
        Q.round_decimals(x, 39)
    Q.round_decimals(x.double(), 300)
    with pytest.raises(ValueError, match="eps"):
        Q.clamp_by_linear(x, -1e-3)
    with pytest.raises(ValueError, match="alpha"):
        Q.quantized_bits(x, alpha="auto_po2")
    with pytest.raises(ValueError, match="alpha"):
        Q.quantized_bits(x, alpha=-1.0)
    with pytest.raises(ValueError, match="integer"):
        Q.quantized_bits(x, integer=1.5)
    with pytest.raises(TypeError, match="keep_negative"):
        Q.quantized_bits(x, keep_negative="yes")
    with pytest.raises(ValueError, match="grad_scale"):
        Q.lsq_quantize(x, 0.5, -2, 1, grad_scale=math.inf)
    with pytest.raises(ValueError, match="threshold"):
        Q.state_quant(threshold=0.0)
    with pytest.raises(ValueError, match="range"):
        Q.state_quant(lower_limit=-1.0, upper_limit=-1.0)
    with pytest.raises(ValueError, match="multiplier"):
        Q.state_quant(uniform=False, multiplier=-0.5)


def test_exports_are_documented():
    for name in Q.__all__:
        obj = getattr(Q, name)
        assert obj.__doc__ and obj.__doc__.strip(), name


# --- true gradients: torch.autograd.gradcheck in float64 ------------------------------------------


def test_gradcheck_clamp_by_linear():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Q.clamp_by_linear, (x,))
    assert torch.autograd.gradcheck(lambda t: Q.clamp_by_linear(t, eps=0.3), (x,))


def test_gradcheck_clamp_away_from_the_bounds():
    # Away from the bounds the masked gradient is clamp's true gradient (0 outside, 1 inside).
    x = torch.tensor([-3.0, -1.2, -0.4, 0.0, 0.7, 1.9, 4.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: Q.clamp(t, -1.0, 1.5), (x,))


def test_gradcheck_affine_and_quantized_scales():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(5, generator=gen, dtype=torch.float64)
    w = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w_, b_: Q.affine_k_bit_quantize(x, 4, w_, b_), (w, b))


# --- masked gradients at their boundaries ---------------------------------------------------------


def test_clamp_gradient_is_one_on_both_bounds_and_zero_just_outside():
    low, high = -1.0, 1.5
    x = torch.tensor(
        [math.nextafter(low, -9), low, 0.2, high, math.nextafter(high, 9)],
        dtype=torch.float64,
        requires_grad=True,
    )
    upstream = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    Q.clamp(x, low, high).backward(upstream)
    assert torch.equal(x.grad, torch.tensor([0.0, 2.0, 3.0, 4.0, 0.0], dtype=torch.float64))


def test_multi_level_spike_count_gradient_window_boundaries():
    x = torch.tensor(
        [math.nextafter(0.0, -1), 0.0, 1.4, 3.0, math.nextafter(3.0, 9)],
        dtype=torch.float64,
        requires_grad=True,
    )
    y = Q.multi_level_spike_count(x, 3)
    assert torch.equal(y.detach(), torch.tensor([0.0, 0.0, 1.0, 3.0, 3.0], dtype=torch.float64))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    x.grad = None
    Q.multi_level_spike_count(x, 3, grad_window=(1.4, 3.0)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64))
