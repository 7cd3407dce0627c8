"""Drop-in compatibility with SpikingJelly's *current* ``activation_based.quantize`` (after 2.0.0).

The current module (fangwei123456/spikingjelly, ``spikingjelly/activation_based/quantize.py``)
renames the autograd classes (``round_atgf``, ...), adds ``clamp_backward``,
``step_quantize_forward`` and ``k_bit_quantize_forward``, and its functions accept integer tensors
(the arithmetic promotes them to the default float dtype) and a 0-dim integer tensor ``k``.
The references below restate its forward and backward in a few lines (the installed 2.0.0 has
none of these names); the tests at the end are ported from its own test suite
(``test/activation_based/test_noisy_and_misc.py``).
"""

import inspect

import pytest
import torch

from snnquant import functional as Q

sj200 = pytest.importorskip("spikingjelly.activation_based.quantize")


# --- the current SpikingJelly definitions, restated --------------------------------------------------

def _sj_clamp_backward(grad_output, x, min_value, max_value):
    return grad_output * ((x >= min_value) & (x <= max_value))


def _sj_step_quantize_forward(x, step):
    return torch.round(x / step) * step


def _sj_k_bit_quantize_forward(x, k):
    levels = float(1 << k) - 1.0
    return torch.round(x * levels) / levels


def _sj_clamp_by_linear(x, eps=1e-5):
    x_max = torch.max(x) + eps
    x_min = torch.min(x)
    return (x - x_min) / (x_max - x_min)


SIGNATURES = {
    "round_atgf": None,
    "ceil_atgf": None,
    "floor_atgf": None,
    "clamp_atgf": None,
    "step_quantize_atgf": None,
    "k_bit_quantize_atgf": None,
    "multi_level_spike_count_atgf": None,
    "clamp_backward": ["grad_output", "x", "min_value", "max_value"],
    "step_quantize_forward": ["x", "step"],
    "k_bit_quantize_forward": ["x", "k"],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_current_names_exist_with_the_same_signatures(name):
    assert name in Q.__all__
    obj = getattr(Q, name)
    expected = SIGNATURES[name]
    if expected is None:
        assert issubclass(obj, torch.autograd.Function)
    else:
        assert list(inspect.signature(obj).parameters) == expected


def test_2_0_0_names_stay():
    for name in ("RoundATGF", "CeilATGF", "FloorATGF", "ClampATGF", "StepQuantizeATGF",
                 "MultiLevelSpikeCountATGF", "KBitQuantizeATGF"):
        assert name in Q.__all__ and issubclass(getattr(Q, name), torch.autograd.Function)


def _x(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 9, generator=gen, dtype=torch.float64) * 2
    x.view(-1)[:6] = torch.tensor([-1.5, -0.5, 0.5, 1.5, -1.0, 2.0])
    return x.to(dtype)


ATGF_CASES = {
    "round_atgf": (lambda m, x: m.RoundATGF.apply(x), lambda x: Q.round_atgf.apply(x)),
    "ceil_atgf": (lambda m, x: m.CeilATGF.apply(x), lambda x: Q.ceil_atgf.apply(x)),
    "floor_atgf": (lambda m, x: m.FloorATGF.apply(x), lambda x: Q.floor_atgf.apply(x)),
    "clamp_atgf": (lambda m, x: m.ClampATGF.apply(x, -1.0, 1.5),
                   lambda x: Q.clamp_atgf.apply(x, -1.0, 1.5)),
    "step_quantize_atgf": (lambda m, x: m.StepQuantizeATGF.apply(x, 0.5),
                           lambda x: Q.step_quantize_atgf.apply(x, 0.5)),
    "k_bit_quantize_atgf": (lambda m, x: m.KBitQuantizeATGF.apply(x.sigmoid(), 3),
                            lambda x: Q.k_bit_quantize_atgf.apply(x.sigmoid(), 3)),
    "multi_level_spike_count_atgf": (
        lambda m, x: m.MultiLevelSpikeCountATGF.apply(x, 3, 0.0, 3.0),
        lambda x: Q.multi_level_spike_count_atgf.apply(x, 3, 0.0, 3.0)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(ATGF_CASES))
def test_current_autograd_classes_have_the_same_values_and_gradients(name, dtype):
    reference, ours = ATGF_CASES[name]
    x0 = _x(dtype=dtype)
    a = x0.clone().requires_grad_(True)
    b = x0.clone().requires_grad_(True)
    ya, yb = reference(sj200, a), ours(b)
    assert torch.equal(ya, yb)
    upstream = torch.randn(ya.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    ya.backward(upstream)
    yb.backward(upstream)
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("bounds", [(-1.0, 1.5), (0.0, 0.0), (torch.tensor(-0.5), torch.tensor(2.0))])
def test_clamp_backward_matches(bounds):
    x = _x()
    x.view(-1)[-1] = float("nan")
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    ours = Q.clamp_backward(g, x, *bounds)
    assert torch.equal(ours, _sj_clamp_backward(g, x, *bounds))
    assert ours.dtype == g.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_forward_helpers_match(dtype):
    x = _x().to(dtype) if dtype.is_floating_point else torch.arange(-6, 7)
    assert torch.equal(Q.step_quantize_forward(x, 0.25), _sj_step_quantize_forward(x, 0.25))
    unit = x.sigmoid() if dtype.is_floating_point else torch.tensor([0, 1, 1, 0])
    for k in (1, 2, 8):
        assert torch.equal(Q.k_bit_quantize_forward(unit, k), _sj_k_bit_quantize_forward(unit, k))


# --- integer tensors: a float result of the default dtype, as SpikingJelly ----------------------------

INT_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64]

INTEGER_CASES = {
    "step_quantize": (lambda x: Q.step_quantize(x, 0.5), lambda x: _sj_step_quantize_forward(x, 0.5)),
    "step_quantize_int_step": (lambda x: Q.step_quantize(x, 2), lambda x: _sj_step_quantize_forward(x, 2)),
    "k_bit_quantize": (lambda x: Q.k_bit_quantize(x, 2), lambda x: _sj_k_bit_quantize_forward(x, 2)),
    "affine_k_bit_quantize": (
        lambda x: Q.affine_k_bit_quantize(x, 2, torch.tensor(1.5), torch.tensor(-0.25)),
        lambda x: torch.tensor(1.5) * _sj_k_bit_quantize_forward(x, 2) + torch.tensor(-0.25)),
    "clamp_by_linear": (Q.clamp_by_linear, _sj_clamp_by_linear),
}


@pytest.mark.parametrize("default", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(INTEGER_CASES))
def test_integer_tensors_give_a_float_result_like_spikingjelly(name, dtype, default):
    ours, reference = INTEGER_CASES[name]
    x = torch.tensor([0, 1, 3, 2, 7, 1]).to(dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        expected = reference(x)
        got = ours(x)
    finally:
        torch.set_default_dtype(previous)
    assert got.dtype == expected.dtype == default
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", sorted(INTEGER_CASES))
def test_bool_and_complex_stay_type_errors(name):
    ours, _ = INTEGER_CASES[name]
    for x in (torch.tensor([True, False]), torch.tensor([1j, 2.0])):
        with pytest.raises(TypeError, match=str(x.dtype)):
            ours(x)


@pytest.mark.parametrize("k", [torch.tensor(2), torch.tensor(2, dtype=torch.int32),
                               torch.tensor([2])], ids=["int64", "int32", "one-element"])
def test_k_as_integer_tensor(k):
    x = torch.rand(10, generator=torch.Generator().manual_seed(0))
    expected = _sj_k_bit_quantize_forward(x, 2)
    assert torch.equal(Q.k_bit_quantize(x, k), expected)
    assert torch.equal(Q.affine_k_bit_quantize(x, k, 2.0, 1.0), 2.0 * expected + 1.0)


def test_k_as_float_tensor_is_still_refused():
    with pytest.raises(ValueError, match="k"):
        Q.k_bit_quantize(torch.rand(3), torch.tensor(2.0))


# --- ported from SpikingJelly's test/activation_based/test_noisy_and_misc.py ------------------------


def test_quantizers_keep_their_straight_through_gradients():
    x = torch.tensor([-0.1, 0.26, 0.74, 1.1], requires_grad=True)
    step_output = Q.step_quantize(x, 0.25)
    bit_output = Q.k_bit_quantize(x.clamp(0, 1), 2)

    torch.testing.assert_close(step_output, torch.tensor([0.0, 0.25, 0.75, 1.0]))
    torch.testing.assert_close(bit_output, torch.tensor([0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0]))
    (step_output.sum() + bit_output.sum()).backward()
    torch.testing.assert_close(x.grad, torch.tensor([1.0, 2.0, 2.0, 1.0]))


def test_multi_level_spike_count_quantizer_uses_windowed_gradient():
    x = torch.tensor([[-0.25, 0.5, 4.25]], requires_grad=True)

    y = Q.multi_level_spike_count(x, max_spike_count=4)
    y.sum().backward()

    assert torch.equal(y.detach(), torch.tensor([[0.0, 0.0, 4.0]]))
    torch.testing.assert_close(x.grad, torch.tensor([[0.0, 1.0, 0.0]]))

    x.grad = None
    y = Q.multi_level_spike_count(x, max_spike_count=4, grad_window=(-0.5, 4.5))
    y.sum().backward()

    torch.testing.assert_close(x.grad, torch.tensor([[1.0, 1.0, 1.0]]))


def test_k_bit_quantize_refuses_k_below_one():
    # SpikingJelly: "k must be a positive integer"; here a ValueError naming k and the value
    with pytest.raises(ValueError, match="k.*0"):
        Q.k_bit_quantize(torch.rand(3), 0)
