"""Quantizers in the user's own neuron code (issue 11, section 6).

Before: a ``neuron.BaseNode`` subclass defining ``neuronal_charge`` raised
``NotImplementedError: MyNode must implement single_step_functional_forward`` in both step modes;
a ``neuron.LIFNode`` subclass overriding ``neuronal_charge`` ran without calling it (SpikingJelly
2.0's fused path); ``Q.step_quantize(self.v, ...)`` failed on the first step, ``self.v`` being a
Python float. Now the documented classes honour every override, in 's' and 'm' modes, and the
quantizer demonstrably runs inside the time loop.
"""

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional, neuron, surrogate

from snnquant import functional as Q
from snnquant.nn import (CustomIFNode, CustomLIFNode, CustomNode, LSQQuantizer, QuantLIFNode,
                         custom_neuron)

STEP = 0.125
T, N, F = 6, 4, 5


def _input(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(T, N, F, generator=gen, dtype=torch.float64) * 1.2 - 0.1


def _on_grid(values, step=STEP):
    values = torch.stack(values) if isinstance(values, list) else values
    return torch.equal(values, torch.round(values / step) * step)


def _reference(x_seq, charge, v_threshold=1.0, v_reset=0.0, sg=None):
    """The same neuron written by hand: charge, Heaviside with surrogate, hard reset, and the
    quantizer written as a straight-through expression."""
    sg = sg or surrogate.Sigmoid()
    v = torch.full_like(x_seq[0], v_reset)
    spikes = []
    for x in x_seq:
        h = charge(v, x)
        h = h + (torch.round(h / STEP) * STEP - h).detach()
        s = sg(h - v_threshold)
        v = (1.0 - s) * h + s * v_reset
        spikes.append(s)
    return torch.stack(spikes)


def _run(node, x_seq, mode):
    node.step_mode = mode
    functional.reset_net(node)
    if mode == "m":
        return node(x_seq)
    return torch.stack([node(x) for x in x_seq])


# --- a CustomNode subclass: the documented way --------------------------------------------------------


class QuantizedIntegrator(CustomNode):
    """IF dynamics with the charge on a 1/8 grid."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.charges = []

    def neuronal_charge(self, x):
        self.v = Q.step_quantize(self.v + x, STEP)
        self.charges.append(self.v.detach())


@pytest.mark.parametrize("mode", ["s", "m"])
def test_custom_node_runs_the_quantizer_inside_the_loop(mode):
    node = QuantizedIntegrator()
    x0 = _input()
    x = x0.clone().requires_grad_(True)
    spikes = _run(node, x, mode)
    assert len(node.charges) == T                       # called once per step
    assert _on_grid(node.charges)                       # every charge on the grid
    assert not _on_grid(x0.cumsum(0))                   # ... which the input alone is not
    assert spikes.shape == (T, N, F) and 0 < spikes.sum() < spikes.numel()

    reference_x = x0.clone().requires_grad_(True)
    expected = _reference(reference_x, lambda v, x: v + x)
    torch.testing.assert_close(spikes, expected, rtol=0, atol=0)
    upstream = torch.randn(T, N, F, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    spikes.backward(upstream)
    expected.backward(upstream)
    torch.testing.assert_close(x.grad, reference_x.grad, rtol=1e-12, atol=1e-12)
    assert x.grad.abs().sum() > 0


def test_custom_node_single_and_multi_step_agree_and_store_v_seq():
    a, b = QuantizedIntegrator(store_v_seq=True), QuantizedIntegrator(store_v_seq=True)
    x = _input(3)
    assert torch.equal(_run(a, x, "s"), _run(b, x, "m"))
    assert torch.equal(a.v, b.v) and torch.equal(a.v_seq, b.v_seq)
    assert a.v_seq.shape == (T, N, F)


def test_custom_node_without_charge_says_what_to_define():
    class Empty(CustomNode):
        pass

    with pytest.raises(NotImplementedError, match="neuronal_charge"):
        Empty()(torch.zeros(2, 3))


def test_custom_node_with_a_learned_quantizer_module_in_multi_step_mode():
    class LearnedStep(CustomNode):
        def __init__(self):
            super().__init__()
            self.v_quant = LSQQuantizer(6)

        def neuronal_charge(self, x):
            self.v = self.v_quant.quantize(self.v + x)

    net = nn.Sequential(nn.Identity(), LearnedStep())
    functional.set_step_mode(net, "m")  # also reaches the quantizer: .quantize keeps 1-step meaning
    x = _input(2).float().requires_grad_(True)
    net(x).sum().backward()
    q = net[1].v_quant
    assert q.step.grad is not None and q.step.grad.abs().sum() > 0
    assert x.grad.abs().sum() > 0
    v = net[1].v
    assert torch.allclose(v / q.step, torch.round(v / q.step), atol=1e-5)


# --- LIF / IF subclasses: the override is honoured --------------------------------------------------


def _quantized_lif_charge(self, x):
    h = self.v + (x - (self.v - self.v_reset)) / self.tau
    self.calls += 1
    self.v = Q.step_quantize(h, STEP)


class QuantChargeLIF(CustomLIFNode):
    calls = 0
    neuronal_charge = _quantized_lif_charge


@custom_neuron
class DecoratedLIF(neuron.LIFNode):
    calls = 0
    neuronal_charge = _quantized_lif_charge


@pytest.mark.parametrize("cls", [QuantChargeLIF, DecoratedLIF])
@pytest.mark.parametrize("mode", ["s", "m"])
def test_lif_subclass_overriding_neuronal_charge_is_honoured(cls, mode):
    node = cls(tau=2.0, store_v_seq=True)
    node.calls = 0
    x0 = _input(4) * 2
    x = x0.clone().requires_grad_(True)
    spikes = _run(node, x, mode)
    assert node.calls == T
    assert 0 < spikes.sum() < spikes.numel()
    assert _on_grid(node.v)
    reference_x = x0.clone().requires_grad_(True)
    expected = _reference(reference_x, lambda v, x: v + (x - v) / 2.0)
    torch.testing.assert_close(spikes, expected, rtol=0, atol=0)
    spikes.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, reference_x.grad, rtol=1e-12, atol=1e-12)
    # the plain LIF neuron's membrane is off the grid on the same input: the override ran
    plain = neuron.LIFNode(tau=2.0)
    _run(plain, x0, mode)
    assert not _on_grid(plain.v)


@pytest.mark.parametrize("cls, plain_cls, kwargs", [
    (CustomLIFNode, neuron.LIFNode, dict(tau=2.0)),
    (CustomLIFNode, neuron.LIFNode, dict(tau=3.0, decay_input=False, v_reset=None)),
    (CustomIFNode, neuron.IFNode, dict(v_reset=-0.25)),
])
@pytest.mark.parametrize("mode", ["s", "m"])
def test_default_charge_equals_the_spikingjelly_neuron(cls, plain_cls, kwargs, mode):
    x = _input(5).float()
    ours, theirs = cls(**kwargs), plain_cls(**kwargs)
    torch.testing.assert_close(_run(ours, x, mode), _run(theirs, x, mode))
    torch.testing.assert_close(ours.v, theirs.v)


@pytest.mark.parametrize("mode", ["s", "m"])
def test_fire_and_reset_overrides_are_honoured(mode):
    class TwoThresholds(CustomIFNode):
        def neuronal_fire(self):
            return self.surrogate_function(self.v - 2 * self.v_threshold)

        def neuronal_reset(self, spike):
            self.v = Q.step_quantize(self.v * (1.0 - spike) - 0.5 * spike, STEP)

    node = TwoThresholds(store_v_seq=True)
    x = torch.full((T, 1), 0.75)
    spikes = _run(node, x, mode)
    # v: 0.75, 1.5, 2.25 -> spike, reset to -0.5; 0.25, 1.0, 1.75
    assert spikes.flatten().tolist() == [0, 0, 1, 0, 0, 0]
    assert node.v_seq.flatten().tolist() == [0.75, 1.5, -0.5, 0.25, 1.0, 1.75]


def test_decorated_base_node_subclass_works_in_both_modes():
    @custom_neuron
    class MyNode(neuron.BaseNode):
        def neuronal_charge(self, x):
            self.v = Q.lsq_quantize(self.v + x, step=STEP, qmin=-16, qmax=15)

    x = _input(6).float()
    s_out = _run(MyNode(), x, "s")
    m_out = _run(MyNode(), x, "m")
    assert torch.equal(s_out, m_out) and s_out.sum() > 0


# --- clear errors instead of silently ignored overrides -----------------------------------------------


def test_quantized_neuron_subclass_overriding_charge_is_refused_with_advice():
    with pytest.raises(TypeError) as info:
        class Bad(QuantLIFNode):
            def neuronal_charge(self, x):
                self.v = self.v + x
    message = str(info.value)
    assert "neuronal_charge" in message and "QuantLIFNode" in message
    assert "CustomLIFNode" in message and "custom_neuron" in message


def test_custom_neuron_refuses_what_it_cannot_honour():
    with pytest.raises(TypeError, match="BaseNode"):
        custom_neuron(nn.Linear)
    with pytest.raises(TypeError, match="library class"):
        custom_neuron(neuron.LIFNode)

    class OwnFunctionalStep(neuron.LIFNode):
        def single_step_functional_forward(self, inputs, states, **kwargs):
            return super().single_step_functional_forward(inputs, states, **kwargs)

        def neuronal_charge(self, x):
            self.v = self.v + x

    with pytest.raises(TypeError, match="single_step_functional_forward"):
        custom_neuron(OwnFunctionalStep)

    class NoCharge(neuron.BaseNode):
        pass

    with pytest.raises(TypeError, match="neuronal_charge"):
        custom_neuron(NoCharge)


# --- SpikingJelly's Simple* neurons: the state starts as a Python float ------------------------------


@pytest.mark.parametrize("mode", ["s", "m"])
def test_quantizer_on_a_float_state_in_a_simple_neuron(mode):
    class Simple(neuron.SimpleIFNode):
        def neuronal_charge(self, x):
            v = Q.step_quantize(self.v, STEP)  # self.v is the float 0.0 on the first step
            self.v = Q.step_quantize(v + x, STEP)

    node = Simple()
    out = _run(node, _input(7), mode)
    assert out.shape == (T, N, F)
    assert _on_grid(node.v)
