"""Learned Step Size Quantization: forward values, straight-through x gradient, step gradient
(scalar and per channel), grad_scale, boundaries."""

import pytest
import torch

from snnquant import functional as Q


def _lsq_by_autograd(x, step, qmin, qmax, grad_scale):
    """The paper's reference implementation, built from differentiable pieces."""
    scaled_step = (step - step * grad_scale).detach() + step * grad_scale
    v = torch.clamp(x / scaled_step, qmin, qmax)
    v = (v.round() - v).detach() + v
    return v * scaled_step


def test_forward_values():
    x = torch.tensor([-10.0, -0.8, -0.26, 0.0, 0.3, 0.76, 10.0], dtype=torch.float64)
    y = Q.lsq_quantize(x, 0.25, -4, 3)
    expected = torch.clamp(torch.round(x / 0.25), -4, 3) * 0.25
    assert torch.equal(y, expected)
    assert y.min() == -1.0 and y.max() == 0.75


@pytest.mark.parametrize("grad_scale", [1.0, 0.1])
@pytest.mark.parametrize("step_shape", [(), (1,), (3, 1)])
def test_gradients_match_the_reference_implementation(step_shape, grad_scale):
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 40, generator=gen, dtype=torch.float64) * 2
    step0 = torch.rand(step_shape, generator=gen, dtype=torch.float64) * 0.3 + 0.1
    upstream = torch.randn(3, 40, generator=gen, dtype=torch.float64)
    results = []
    for fn in (Q.lsq_quantize, _lsq_by_autograd):
        x = x0.clone().requires_grad_(True)
        step = step0.clone().requires_grad_(True)
        y = fn(x, step, -8, 7, grad_scale)
        y.backward(upstream)
        results.append((y.detach(), x.grad, step.grad))
        assert step.grad.shape == step0.shape
    torch.testing.assert_close(results[0], results[1], rtol=1e-12, atol=1e-12)


def test_gradient_at_the_boundaries_is_inside():
    step = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    # x / step = -4 - eps, -4, -3.7, 0.4, 3, 3 + eps, 5
    v = torch.tensor([-4.000001, -4.0, -3.7, 0.4, 3.0, 3.000001, 5.0], dtype=torch.float64)
    x = (v * 0.5).requires_grad_(True)
    Q.lsq_quantize(x, step, -4, 3).backward(torch.ones(7, dtype=torch.float64))
    assert torch.equal(x.grad, torch.tensor([0.0, 1, 1, 1, 1, 0, 0], dtype=torch.float64))
    # Esser et al. 2020, eq. 3: -Q_N where v <= -Q_N and Q_P where v >= Q_P, the end points included.
    per_element = torch.tensor([-4.0, -4.0, -4.0 + 3.7, 0.0 - 0.4, 3.0, 3.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(step.grad, per_element.sum(), rtol=1e-12, atol=1e-12)


def test_per_channel_step_gradient_is_per_channel():
    x = torch.tensor([[0.3, 5.0], [-0.3, -5.0]], dtype=torch.float64, requires_grad=True)
    step = torch.tensor([[1.0], [0.5]], dtype=torch.float64, requires_grad=True)
    Q.lsq_quantize(x, step, -2, 1, grad_scale=2.0).sum().backward()
    # row 0: v = [0.3, 5] -> (0 - 0.3) + qmax 1; row 1: v = [-0.6, -10] -> (-1 + 0.6) + qmin -2
    expected = torch.tensor([[2.0 * (-0.3 + 1.0)], [2.0 * (-0.4 - 2.0)]], dtype=torch.float64)
    torch.testing.assert_close(step.grad, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(x.grad, torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64))


def test_python_float_step_gives_x_gradient_only():
    x = torch.tensor([0.1, 0.6, 9.0], requires_grad=True)
    Q.lsq_quantize(x, 0.5, 0, 3).sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 1.0, 0.0]))


def test_step_gradient_dtype_follows_step():
    x = torch.randn(8, dtype=torch.float16, requires_grad=True)
    step = torch.tensor(0.25, dtype=torch.float32, requires_grad=True)
    y = Q.lsq_quantize(x, step, -4, 3)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float16 and step.grad.dtype == torch.float32


def test_non_finite_inputs():
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.3], requires_grad=True)
    step = torch.tensor(0.5, requires_grad=True)
    y = Q.lsq_quantize(x, step, -4, 3)
    assert torch.isnan(y[0]) and y[1] == 1.5 and y[2] == -2.0
    y.backward(torch.ones(4))
    assert torch.equal(x.grad, torch.tensor([0.0, 0.0, 0.0, 1.0]))
    assert torch.isnan(step.grad)


def test_lsq_integral_float_bounds_accepted():
    x = torch.tensor([0.26, -5.0])
    assert torch.equal(Q.lsq_quantize(x, 0.25, -2.0, 1.0), Q.lsq_quantize(x, 0.25, -2, 1))
