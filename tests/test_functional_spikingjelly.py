"""snnquant.functional as a drop-in for spikingjelly.activation_based.quantize: same names, same
arguments, same forward values and gradients on the same inputs."""

import inspect

import pytest
import torch

from snnquant import functional as Q

sj = pytest.importorskip("spikingjelly.activation_based.quantize")

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _input(dtype, seed=0, shape=(4, 33)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    # Exact halves and integers exercise the tie rule, bounds exercise the masks.
    x.view(-1)[:12] = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, 1.0, -1.0, 3.0, 2.0, 4.0])
    return x.to(dtype)


def _unit_input(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(4, 33, generator=gen, dtype=torch.float64)
    x.view(-1)[:4] = torch.tensor([0.0, 1.0, 0.5, 1.0 / 3.0])
    return x.to(dtype)


# name -> (how to call it on (module, x), input builder)
CASES = {
    "round": (lambda m, x: m.round(x), _input),
    "ceil": (lambda m, x: m.ceil(x), _input),
    "floor": (lambda m, x: m.floor(x), _input),
    "clamp": (lambda m, x: m.clamp(x, -1.0, 2.0), _input),
    "clamp_tensor_bounds": (
        lambda m, x: m.clamp(x, torch.tensor(-1.0, dtype=x.dtype), torch.tensor(2.0, dtype=x.dtype)),
        _input,
    ),
    "step_quantize": (lambda m, x: m.step_quantize(x, 0.25), _input),
    "step_quantize_default": (lambda m, x: m.step_quantize(x), _input),
    "multi_level_spike_count": (lambda m, x: m.multi_level_spike_count(x, 3), _input),
    "multi_level_spike_count_tensor_count": (
        lambda m, x: m.multi_level_spike_count(x, torch.tensor(2)),
        _input,
    ),
    "multi_level_spike_count_window": (
        lambda m, x: m.multi_level_spike_count(x, 4, grad_window=(-1.0, 2.5)),
        _input,
    ),
    "k_bit_quantize": (lambda m, x: m.k_bit_quantize(x, 3), _unit_input),
    "k_bit_quantize_8": (lambda m, x: m.k_bit_quantize(x, 8), _unit_input),
    "affine_k_bit_quantize": (
        lambda m, x: m.affine_k_bit_quantize(
            x, 2, torch.tensor(1.5, dtype=x.dtype), torch.tensor(-0.25, dtype=x.dtype)
        ),
        _unit_input,
    ),
    "clamp_by_linear": (lambda m, x: m.clamp_by_linear(x), _input),
    "clamp_by_linear_eps": (lambda m, x: m.clamp_by_linear(x, eps=0.1), _input),
    "RoundATGF": (lambda m, x: m.RoundATGF.apply(x), _input),
    "CeilATGF": (lambda m, x: m.CeilATGF.apply(x), _input),
    "FloorATGF": (lambda m, x: m.FloorATGF.apply(x), _input),
    "ClampATGF": (lambda m, x: m.ClampATGF.apply(x, -0.5, 1.0), _input),
    "StepQuantizeATGF": (lambda m, x: m.StepQuantizeATGF.apply(x, 0.5), _input),
    "MultiLevelSpikeCountATGF": (
        lambda m, x: m.MultiLevelSpikeCountATGF.apply(x, 3, 0.0, 3.0),
        _input,
    ),
    "KBitQuantizeATGF": (lambda m, x: m.KBitQuantizeATGF.apply(x, 4), _unit_input),
}


def test_all_names_of_spikingjelly_are_exported():
    assert set(sj.__all__) <= set(Q.__all__)
    for name in sj.__all__:
        assert callable(getattr(Q, name))
    for name in [
        "RoundATGF",
        "CeilATGF",
        "FloorATGF",
        "ClampATGF",
        "StepQuantizeATGF",
        "MultiLevelSpikeCountATGF",
        "KBitQuantizeATGF",
    ]:
        cls = getattr(Q, name)
        assert issubclass(cls, torch.autograd.Function), name
        assert name in Q.__all__


@pytest.mark.parametrize("name", sj.__all__)
def test_same_signature_as_spikingjelly(name):
    ours = inspect.signature(getattr(Q, name))
    theirs = inspect.signature(getattr(sj, name))
    assert list(ours.parameters) == list(theirs.parameters)
    for key, param in theirs.parameters.items():
        assert ours.parameters[key].default == param.default, key
        assert ours.parameters[key].kind == param.kind, key


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_values_and_gradients_as_spikingjelly(name, dtype):
    call, make = CASES[name]
    x = make(dtype)
    x_ours = x.clone().requires_grad_(True)
    x_sj = x.clone().requires_grad_(True)
    y_ours = call(Q, x_ours)
    y_sj = call(sj, x_sj)
    assert y_ours.dtype == y_sj.dtype
    torch.testing.assert_close(y_ours, y_sj, rtol=0, atol=0, equal_nan=True)
    upstream = torch.randn(y_sj.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    y_ours.backward(upstream)
    y_sj.backward(upstream)
    torch.testing.assert_close(x_ours.grad, x_sj.grad, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_affine_k_bit_quantize_parameter_gradients_match(dtype):
    x = _unit_input(dtype)
    grads = []
    for module in (Q, sj):
        w = torch.tensor([1.5, -0.5, 2.0], dtype=dtype).repeat(11).requires_grad_(True)
        b = torch.tensor(0.25, dtype=dtype, requires_grad=True)
        module.affine_k_bit_quantize(x, 3, w, b).pow(2).sum().backward()
        grads.append((w.grad, b.grad))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_clamp_by_linear_gradient_with_tied_extrema_matches():
    x = torch.tensor([3.0, -1.0, 3.0, 0.5, -1.0, 2.0], dtype=torch.float64)
    grads = []
    for module in (Q, sj):
        leaf = x.clone().requires_grad_(True)
        module.clamp_by_linear(leaf).backward(torch.arange(6, dtype=torch.float64))
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x: m.round(x),
        lambda m, x: m.ceil(x),
        lambda m, x: m.floor(x),
        lambda m, x: m.clamp(x, -2, 3),
        lambda m, x: m.multi_level_spike_count(x, 3),
    ],
    ids=["round", "ceil", "floor", "clamp", "multi_level_spike_count"],
)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_tensors_accepted_like_spikingjelly(call, dtype):
    x = torch.tensor([-5, -1, 0, 2, 7], dtype=dtype)
    ours = call(Q, x)
    assert torch.equal(ours, call(sj, x))
    assert ours.dtype == dtype


def test_k_bit_quantize_float16_with_many_bits_does_not_overflow():
    # SpikingJelly computes (2**16 - 1) * x in float16, which overflows to inf and gives NaN at 1.
    x = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float16)
    y = Q.k_bit_quantize(x, 16)
    assert y.dtype == torch.float16
    expected = (torch.round(x.double() * 65535) / 65535).to(torch.float16)
    assert torch.equal(y, expected)
    assert torch.isfinite(y).all()
