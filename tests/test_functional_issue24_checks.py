"""Issue 24, item 6: step checks of stochastic_round, clamp_by_linear with eps=0, empty steps,
the neurons' constants in state_dict, and QuantConv2d given a sequence in step mode 's'."""

import pytest
import torch

from snnquant import functional as Q
from snnquant.nn import QuantConv1d, QuantConv2d, QuantIFNode, QuantLIFNode, QuantParametricLIFNode


# --- stochastic_round / round_through: the step checks of step_quantize ---------------------------

@pytest.mark.parametrize("fn", [
    lambda x, s: Q.stochastic_round(x, s),
    lambda x, s: Q.round_through(x, True, s),
    lambda x, s: Q.round_through(x, False, s),
], ids=["stochastic_round", "round_through_stochastic", "round_through"])
@pytest.mark.parametrize("step", [1e300, 1e-45, torch.tensor(1e-45), torch.tensor(1e300, dtype=torch.float64)])
def test_stochastic_round_step_not_representable(fn, step):
    with pytest.raises(ValueError, match=r"step=.*float32"):
        fn(torch.randn(8), step)


def test_stochastic_round_half_precision_checks_in_float32():
    # float16 x is computed in float32: 1e-6 is a normal float32 step, accepted and finite
    y = Q.stochastic_round(torch.tensor([0.5], dtype=torch.float16), 1e-6)
    assert torch.isfinite(y).all() and y.dtype == torch.float16


def test_stochastic_round_quotient_overflow():
    x = torch.tensor([0.5, 1e30, float("inf")])
    with pytest.raises(ValueError, match=r"x / step overflows torch.float32"):
        Q.stochastic_round(x, 1e-10)
    y = Q.stochastic_round(torch.tensor([0.5, float("-inf")]), 1e-10)
    assert y[1] == float("-inf") and torch.isfinite(y[0])


@pytest.mark.parametrize("fn", [
    lambda x, s: Q.step_quantize(x, s),
    lambda x, s: Q.stochastic_round(x, s),
    lambda x, s: Q.lsq_quantize(x, s, -8, 7),
], ids=["step_quantize", "stochastic_round", "lsq_quantize"])
@pytest.mark.parametrize("shape", [(3, 1), (3,)])
def test_empty_step_tensor_is_our_error(fn, shape):
    with pytest.raises(ValueError, match=r"step .*(empty|broadcast)"):
        fn(torch.randn(*shape), torch.tensor([]))


def test_empty_step_with_empty_x_stays_empty():
    assert Q.step_quantize(torch.randn(0), torch.tensor([])).shape == (0,)


# --- clamp_by_linear --------------------------------------------------------------------------

@pytest.mark.parametrize("x,eps", [(torch.zeros(4), 0.0), (torch.full((4,), 1000.0), 1e-5)],
                         ids=["eps0", "eps_lost_in_rounding"])
def test_clamp_by_linear_constant_input_gives_zero_not_nan(x, eps):
    x = x.clone().requires_grad_(True)
    y = Q.clamp_by_linear(x, eps=eps)
    assert torch.equal(y, torch.zeros(4))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_clamp_by_linear_eps0_varying_input_unchanged():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(Q.clamp_by_linear(x, eps=0), (x - 1) / 2)


# --- the neurons' constants in state_dict ----------------------------------------------------------

@pytest.mark.parametrize("saved_kwargs,field", [
    (dict(tau=4.0), "tau"),
    (dict(v_threshold=0.5), "v_threshold"),
    (dict(v_reset=None), "v_reset"),
    (dict(v_reset=-0.25), "v_reset"),
    (dict(decay_input=False), "decay_input"),
])
@pytest.mark.parametrize("v_quant", [None, 4])
def test_lif_refuses_state_with_other_constants(saved_kwargs, field, v_quant):
    saved = QuantLIFNode(v_quant=v_quant, **saved_kwargs).state_dict()
    for strict in (True, False):
        with pytest.raises(ValueError, match=field) as info:
            QuantLIFNode(tau=2.0, v_quant=v_quant).load_state_dict(saved, strict=strict)
        assert "saved" in str(info.value)


def test_neuron_constants_same_values_load_and_spike_alike():
    torch.manual_seed(0)
    a = QuantLIFNode(tau=4.0, v_quant=4, step_mode="m")
    b = QuantLIFNode(tau=4.0, v_quant=4, step_mode="m")
    b.load_state_dict(a.state_dict())
    x = torch.rand(6, 2, 16) * 2
    assert torch.equal(a(x), b(x))


def test_if_and_plif_constants_checked():
    with pytest.raises(ValueError, match="v_threshold"):
        QuantIFNode().load_state_dict(QuantIFNode(v_threshold=2.0).state_dict())
    with pytest.raises(ValueError, match="decay_input"):
        QuantParametricLIFNode().load_state_dict(
            QuantParametricLIFNode(decay_input=False).state_dict())
    # an IF state in a LIF: tau differs (absent against 2.0)
    with pytest.raises(ValueError, match="tau"):
        QuantLIFNode().load_state_dict(QuantIFNode().state_dict())


def test_state_without_constants_loads():
    # older files (and SpikingJelly's neurons) have no neuron_config: nothing to check
    QuantLIFNode(tau=2.0).load_state_dict({}, strict=True)


# --- QuantConv in step mode 's' given a sequence ---------------------------------------------------

def test_quant_conv2d_single_step_given_sequence_says_use_m():
    conv = QuantConv2d(2, 3, 3)
    with pytest.raises(ValueError, match=r"step_mode='m'") as info:
        conv(torch.randn(4, 1, 2, 8, 8))
    assert "(4, 1, 2, 8, 8)" in str(info.value)
    assert conv(torch.randn(1, 2, 8, 8)).shape == (1, 3, 6, 6)
    assert conv(torch.randn(2, 8, 8)).shape == (3, 6, 6)


def test_quant_conv1d_single_step_given_sequence_says_use_m():
    with pytest.raises(ValueError, match=r"step_mode='m'"):
        QuantConv1d(2, 3, 3)(torch.randn(4, 1, 2, 8))
