"""Rounding: straight-through gradients, shok's PassRound/SoftRound/ScaleGrad, smooth_round,
round_decimals, stochastic_round and round_through."""

import math

import pytest
import torch

from snnquant import functional as Q


def _leaf(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype, requires_grad=True)


# --- straight-through gradients -------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        Q.round,
        Q.ceil,
        Q.floor,
        Q.pass_round,
        Q.PassRound.apply,
        lambda x: Q.step_quantize(x, 0.3),
        lambda x: Q.k_bit_quantize(x, 2),
        lambda x: Q.round_decimals(x, 2),
        lambda x: Q.stochastic_round(x, 0.5, torch.Generator().manual_seed(0)),
        lambda x: Q.round_through(x),
        lambda x: Q.round_through(x, stochastic=True, step=0.25),
    ],
    ids=[
        "round",
        "ceil",
        "floor",
        "pass_round",
        "PassRound",
        "step_quantize",
        "k_bit_quantize",
        "round_decimals",
        "stochastic_round",
        "round_through",
        "round_through_stochastic",
    ],
)
def test_straight_through_gradient_is_upstream(call):
    x = _leaf([-3.7, -0.5, 0.0, 0.5, 0.49, 1.5, 2.2, 10.0, 1e6])
    upstream = torch.linspace(-2, 3, 9, dtype=torch.float64)
    call(x).backward(upstream)
    assert torch.equal(x.grad, upstream)


def test_round_ceil_floor_values():
    x = torch.tensor([-2.5, -1.5, -0.2, 0.5, 1.5, 2.7])
    assert torch.equal(Q.round(x), torch.tensor([-2.0, -2.0, -0.0, 0.0, 2.0, 3.0]))
    assert torch.equal(Q.ceil(x), torch.tensor([-2.0, -1.0, -0.0, 1.0, 2.0, 3.0]))
    assert torch.equal(Q.floor(x), torch.tensor([-3.0, -2.0, -1.0, 0.0, 1.0, 2.0]))


def test_step_quantize_values_and_tensor_step():
    x = torch.tensor([[0.1, 0.26, -0.6], [1.0, 1.1, -0.13]])
    assert torch.allclose(Q.step_quantize(x, 0.25), torch.round(x / 0.25) * 0.25)
    step = torch.tensor([[0.5], [0.2]])
    assert torch.equal(Q.step_quantize(x, step), torch.round(x / step) * step)


# --- shok ------------------------------------------------------------------------------------------


def test_pass_round_class_and_function_agree():
    x = _leaf([-1.4, 0.5, 2.6])
    y = Q.PassRound.apply(x)
    assert torch.equal(y, torch.round(x.detach()))
    assert torch.equal(Q.pass_round(x), y)


@pytest.mark.parametrize("use_class", [True, False])
def test_soft_round_gradient_is_the_saved_ratio(use_class):
    values = [0.0, -0.0, 0.3, -0.4, 2.6, -1.4, 0.5, 1.5, 7.0]
    x = _leaf(values)
    y = Q.SoftRound.apply(x) if use_class else Q.soft_round(x)
    assert torch.equal(y, torch.round(x.detach()))
    upstream = torch.arange(1.0, 10.0, dtype=torch.float64)
    y.backward(upstream)
    expected = []
    for value in values:
        rounded = round(value)  # Python's round is also half to even
        if value == 0:
            expected.append(1.0)
        elif rounded == 0:
            expected.append(0.0)
        else:
            expected.append(value / rounded)
    assert torch.allclose(x.grad, upstream * torch.tensor(expected, dtype=torch.float64))
    # 0.5 rounds to 0 (half to even): ratio 0; 1.5 rounds to 2: ratio 0.75.
    assert x.grad[6] == 0 and x.grad[7] == pytest.approx(8 * 0.75)


def test_soft_round_without_grad_saves_nothing():
    y = Q.soft_round(torch.tensor([1.2, 2.5]))
    assert not y.requires_grad
    assert torch.equal(y, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("use_class", [True, False])
def test_scale_grad_divides_by_the_largest_magnitude(use_class):
    x = _leaf([1.0, 2.0, 3.0, 4.0])
    y = Q.ScaleGrad.apply(x) if use_class else Q.scale_grad(x)
    assert torch.equal(y, x.detach())
    upstream = torch.tensor([0.5, -4.0, 2.0, 1.0], dtype=torch.float64)
    y.backward(upstream)
    assert torch.equal(x.grad, upstream / 4.0)


def test_scale_grad_passes_a_zero_gradient_unchanged():
    x = _leaf([1.0, 2.0])
    Q.scale_grad(x).backward(torch.zeros(2, dtype=torch.float64))
    assert torch.equal(x.grad, torch.zeros(2, dtype=torch.float64))


def test_scale_grad_is_per_tensor_through_a_graph():
    x = _leaf([1.0, -2.0, 0.5])
    (Q.scale_grad(x) * torch.tensor([10.0, 1.0, -20.0], dtype=torch.float64)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.5, 0.05, -1.0], dtype=torch.float64))


# --- smooth_round ----------------------------------------------------------------------------------


def _smooth_round_reference(x, alpha):
    floor = math.floor(x)
    r = x - floor - 0.5
    return floor + 0.5 * math.tanh(alpha * r) / math.tanh(alpha / 2) + 0.5


@pytest.mark.parametrize("alpha", [0.5, 2.0, 10.0])
def test_smooth_round_formula(alpha):
    values = [-2.3, -1.0, -0.5, 0.0, 0.2, 0.5, 0.77, 1.0, 3.49]
    y = Q.smooth_round(torch.tensor(values, dtype=torch.float64), alpha)
    expected = torch.tensor([_smooth_round_reference(v, alpha) for v in values], dtype=torch.float64)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_smooth_round_gradcheck_x_and_alpha():
    gen = torch.Generator().manual_seed(0)
    # Stay away from integers, where floor jumps (the function is continuous but the check's
    # finite differences would straddle the kink of floor's zero gradient only there).
    x = (torch.rand(12, generator=gen, dtype=torch.float64) * 0.8 + 0.1) + torch.arange(-6, 6)
    x.requires_grad_(True)
    alpha = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(Q.smooth_round, (x, alpha))
    assert torch.autograd.gradcheck(lambda t: Q.smooth_round(t, 7.5), (x,))


def test_smooth_round_gradient_formula():
    x = _leaf([0.1, 0.5, 0.9, -1.3])
    alpha = 4.0
    Q.smooth_round(x, alpha).sum().backward()
    r = x.detach() - torch.floor(x.detach()) - 0.5
    expected = 0.5 * alpha * (1 - torch.tanh(alpha * r) ** 2) / math.tanh(alpha / 2)
    torch.testing.assert_close(x.grad, expected)


def test_smooth_round_tends_to_round_and_identity():
    x = torch.tensor([-1.2, -0.7, 0.3, 0.6, 1.45, 2.9], dtype=torch.float64)
    assert torch.allclose(Q.smooth_round(x, 200.0), torch.round(x), atol=1e-12)
    assert torch.allclose(Q.smooth_round(x, 1e-4), x, atol=1e-6)


def test_smooth_round_is_continuous_at_integers():
    for k in [-2.0, 0.0, 3.0]:
        below = Q.smooth_round(torch.tensor([k - 1e-9], dtype=torch.float64), 5.0)
        at = Q.smooth_round(torch.tensor([k], dtype=torch.float64), 5.0)
        assert at.item() == pytest.approx(k, abs=1e-12)
        assert below.item() == pytest.approx(k, abs=1e-6)


def test_smooth_round_non_finite():
    x = _leaf([float("inf"), float("-inf"), float("nan"), 0.2])
    y = Q.smooth_round(x, 3.0)
    assert y[0] == float("inf") and y[1] == float("-inf") and torch.isnan(y[2])
    y.backward(torch.ones(4, dtype=torch.float64))
    assert x.grad[0] == 1 and x.grad[1] == 1
    assert torch.isfinite(x.grad[3])


# --- round_decimals --------------------------------------------------------------------------------


def _hand_written_differentiable_round(x, decimals=1):
    # The common broken snippet quoted in round_decimals' docstring.
    scale = 10**decimals
    x = x * scale
    diff = (1 + 1e-2) * x - torch.floor(x)
    x = x - diff + (torch.floor(x) + torch.where(diff >= 0.5, 1, 0))
    return x / scale


def test_round_decimals_fixes_the_hand_written_version():
    g = torch.tensor([0.99, 1.54, 1.9], requires_grad=True)
    broken = _hand_written_differentiable_round(g, 1)
    broken.sum().backward()
    assert not torch.allclose(broken.detach(), torch.tensor([1.0, 1.5, 1.9]), atol=1e-3)
    assert g.grad.sum().item() == pytest.approx(-0.03, abs=1e-6)

    g.grad = None
    ours = Q.round_decimals(g, 1)
    ours.sum().backward()
    assert torch.equal(ours.detach(), torch.tensor([1.0, 1.5, 1.9]))
    assert torch.equal(g.grad, torch.ones(3))


@pytest.mark.parametrize("decimals", [-2, -1, 0, 1, 3])
def test_round_decimals_matches_torch_round(decimals):
    x = torch.randn(50, generator=torch.Generator().manual_seed(decimals + 5), dtype=torch.float64) * 500
    assert torch.equal(Q.round_decimals(x, decimals), torch.round(x, decimals=decimals))


def test_round_decimals_large_values_do_not_overflow():
    x = torch.tensor([1e30, -3e38, 123.456, float("inf"), float("nan")], dtype=torch.float32)
    y = Q.round_decimals(x, 10)
    assert y[0] == x[0] and y[1] == x[1] and y[3] == float("inf") and torch.isnan(y[4])
    assert y[2].item() == pytest.approx(123.456, rel=1e-7)
    # torch.round alone overflows here.
    assert torch.isinf(torch.round(x[:1], decimals=10)).all()
    half = torch.tensor([60000.0, 1.5], dtype=torch.float16)
    assert torch.equal(Q.round_decimals(half, 30), half)


# --- stochastic_round and round_through ------------------------------------------------------------


def test_stochastic_round_is_unbiased_and_on_the_grid():
    gen = torch.Generator().manual_seed(123)
    x = torch.tensor([0.1, 0.5, 0.75, -1.3, 2.0, -0.05], dtype=torch.float64)
    samples = Q.stochastic_round(x.expand(40000, 6), 0.5, gen)
    assert torch.equal(samples / 0.5, torch.round(samples / 0.5))
    low = torch.floor(x / 0.5) * 0.5
    assert ((samples == low) | (samples == low + 0.5)).all()
    # Standard error of the mean is at most 0.25 / sqrt(40000) = 0.00125.
    torch.testing.assert_close(samples.mean(0), x, rtol=0, atol=0.006)
    # Multiples of the step never move.
    assert (samples[:, 4] == 2.0).all()


def test_stochastic_round_probability_is_the_fraction():
    gen = torch.Generator().manual_seed(7)
    y = Q.stochastic_round(torch.full((50000,), 0.3), 1.0, gen)
    assert set(torch.unique(y).tolist()) == {0.0, 1.0}
    assert y.mean().item() == pytest.approx(0.3, abs=0.01)


def test_stochastic_round_is_reproducible_with_a_generator():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    a = Q.stochastic_round(x, 0.1, torch.Generator().manual_seed(42))
    b = Q.stochastic_round(x, 0.1, torch.Generator().manual_seed(42))
    c = Q.stochastic_round(x, 0.1, torch.Generator().manual_seed(43))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_stochastic_round_half_precision_stays_unbiased(dtype):
    gen = torch.Generator().manual_seed(5)
    x = torch.full((40000,), 0.3, dtype=dtype)
    y = Q.stochastic_round(x, 1.0, gen)
    assert y.dtype == dtype
    assert y.float().mean().item() == pytest.approx(x[0].item(), abs=0.01)


def test_round_through_deterministic_and_stochastic():
    x = torch.tensor([0.2, 0.5, 1.5, 2.6, -0.74])
    assert torch.equal(Q.round_through(x), torch.round(x))
    assert torch.equal(Q.round_through(x, step=0.5), torch.round(x / 0.5) * 0.5)
    gen = torch.Generator().manual_seed(0)
    y = Q.round_through(x.expand(20000, 5), stochastic=True, step=0.5, generator=gen)
    low = torch.floor(x / 0.5) * 0.5
    assert ((y == low) | (y == low + 0.5)).all()
    torch.testing.assert_close(y.mean(0), x, rtol=0, atol=0.01)
