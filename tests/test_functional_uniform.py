"""Uniform quantizers: k_bit_quantize, affine_k_bit_quantize and QKeras's quantized_bits (checked
against a straightforward numpy implementation of the written formula)."""

import itertools

import numpy as np
import pytest
import torch

from snnquant import functional as Q


def _quantized_bits_numpy(x, bits, integer, symmetric, keep_negative, alpha):
    """QKeras's quantized_bits formula, written out in numpy (np.round is half to even, as
    tf.round)."""
    x = np.asarray(x, dtype=np.float64)
    scale = 1.0 if alpha is None else np.asarray(alpha, dtype=np.float64)
    unsigned_bits = bits - int(keep_negative)
    if unsigned_bits == 0:
        return scale * np.where(x >= 0, 1.0, -1.0)
    m = 2.0**unsigned_bits
    m_i = 2.0**integer
    low = int(keep_negative) * (-m + int(symmetric))
    return scale * m_i * np.clip(np.round(x * m / m_i), low, m - 1) / m


def _x(seed=0, n=257, spread=3.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * spread
    x[:8] = torch.tensor([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 0.125, 100.0])
    return x


@pytest.mark.parametrize(
    "bits,integer,symmetric,keep_negative",
    list(itertools.product([1, 2, 3, 4, 8], [0, 1, 2, -1], [False, True], [True, False])),
)
def test_quantized_bits_matches_the_formula(bits, integer, symmetric, keep_negative):
    x = _x(bits * 10 + integer)
    ours = Q.quantized_bits(x, bits, integer, symmetric, keep_negative)
    expected = _quantized_bits_numpy(x.numpy(), bits, integer, symmetric, keep_negative, None)
    np.testing.assert_array_equal(ours.numpy(), expected)


@pytest.mark.parametrize("bits,keep_negative", [(4, True), (3, False), (1, True), (8, True)])
def test_quantized_bits_with_alpha(bits, keep_negative):
    x = _x(3)
    for alpha in [0.5, 2.0, 0.3]:
        ours = Q.quantized_bits(x, bits, 1, False, keep_negative, alpha)
        expected = _quantized_bits_numpy(x.numpy(), bits, 1, False, keep_negative, alpha)
        np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-15, atol=0)
    per_channel = torch.tensor([[0.5], [1.5], [3.0]], dtype=torch.float64)
    x2 = x[:240].reshape(3, 80)
    ours = Q.quantized_bits(x2, bits, 0, True, keep_negative, per_channel)
    expected = _quantized_bits_numpy(x2.numpy(), bits, 0, True, keep_negative, per_channel.numpy())
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-15, atol=0)


def test_quantized_bits_one_bit_is_sign_with_zero_positive():
    x = torch.tensor([-3.0, -1e-9, -0.0, 0.0, 1e-9, 5.0])
    assert torch.equal(Q.quantized_bits(x, bits=1), torch.tensor([-1.0, -1.0, 1.0, 1.0, 1.0, 1.0]))
    for integer in [0, 3, -2]:
        assert torch.equal(
            Q.quantized_bits(x, bits=1, integer=integer, alpha=0.25),
            torch.tensor([-0.25, -0.25, 0.25, 0.25, 0.25, 0.25]),
        )


def test_quantized_bits_default_grid_and_range():
    x = torch.linspace(-2, 2, 1001, dtype=torch.float64)
    y = Q.quantized_bits(x)  # 8 bits, integer 0, signed: multiples of 1/128 in [-1, 127/128]
    assert torch.equal(y * 128, torch.round(y * 128))
    assert y.min() == -1.0 and y.max() == 127 / 128
    assert Q.quantized_bits(x, symmetric=True).min() == -127 / 128


@pytest.mark.parametrize(
    "bits,keep_negative,symmetric", [(4, True, False), (4, True, True), (3, False, False)]
)
def test_quantized_bits_gradient_is_one_or_masked(bits, keep_negative, symmetric):
    m = 2.0 ** (bits - int(keep_negative))
    m_i = 2.0  # integer=1
    low = int(keep_negative) * (-m + int(symmetric))
    high = m - 1
    p = torch.tensor(
        [low - 1.0, low - 1e-6, low, low + 0.3, 0.0, high - 0.5, high, high + 1e-6, high + 3.0],
        dtype=torch.float64,
    )
    x = (p * m_i / m).requires_grad_(True)
    upstream = torch.arange(1.0, 10.0, dtype=torch.float64)
    Q.quantized_bits(x, bits, 1, symmetric, keep_negative, alpha=0.7).backward(upstream)
    assert torch.equal(x.grad, upstream)
    x.grad = None
    Q.quantized_bits(x, bits, 1, symmetric, keep_negative, masked_grad=True).backward(upstream)
    inside = torch.tensor([0, 0, 1, 1, 1, 1, 1, 0, 0], dtype=torch.float64)
    assert torch.equal(x.grad, upstream * inside)


def test_quantized_bits_masked_grad_one_bit_sign():
    x = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 1.5], dtype=torch.float64, requires_grad=True)
    Q.quantized_bits(x, bits=1, masked_grad=True).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 1, 1, 1, 1, 0], dtype=torch.float64))


def test_quantized_bits_alpha_gets_no_gradient():
    alpha = torch.tensor(0.5, requires_grad=True)
    x = torch.randn(10, requires_grad=True)
    Q.quantized_bits(x, 4, alpha=alpha).sum().backward()
    assert alpha.grad is None
    assert torch.equal(x.grad, torch.ones(10))


def test_quantized_bits_stochastic_is_unbiased_inside_the_range():
    gen = torch.Generator().manual_seed(0)
    x = torch.tensor([0.1, -0.33, 0.52], dtype=torch.float64)
    y = Q.quantized_bits(x.expand(40000, 3), bits=4, stochastic=True, generator=gen)
    # 4 signed bits, integer 0: multiples of 1/8.
    assert torch.equal(y * 8, torch.round(y * 8))
    torch.testing.assert_close(y.mean(0), x, rtol=0, atol=0.005)


# --- k_bit_quantize --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 8, 16, 32])
def test_k_bit_quantize_formula(k):
    x = torch.rand(200, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    levels = 2**k - 1
    expected = torch.round(x * levels) / levels
    assert torch.equal(Q.k_bit_quantize(x, k), expected)


def test_affine_k_bit_quantize_gradcheck_w_and_b():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(3, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w_, b_: Q.affine_k_bit_quantize(x, 3, w_, b_), (w, b))


def test_affine_k_bit_quantize_gradients():
    x = torch.tensor([0.1, 0.4, 0.9], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    y = Q.affine_k_bit_quantize(x, 2, w, b)
    q = torch.round(x.detach() * 3) / 3
    assert torch.equal(y, 2.0 * q - 1.0)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0, dtype=torch.float64))
    assert w.grad == q.sum() and b.grad == 3.0


def test_quantized_bits_alpha_requiring_grad_with_constant_x():
    alpha = torch.tensor([0.5, 2.0], requires_grad=True)
    y = Q.quantized_bits(torch.tensor([0.3, -0.9]), 4, alpha=alpha, masked_grad=True)
    y.sum().backward()
    assert alpha.grad is None
