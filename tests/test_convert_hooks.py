"""quantize_model keeps what the user attached (issue 24, item 5): hooks move to the
replacement module, and pruned or parametrized weights are quantized as their effective weight
with the pruning/parametrization kept."""

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, monitor, neuron
from torch.nn.utils import parametrize, prune

from snnquant import QuantConfig, quantize_model
from snnquant.nn import QuantIFNode, QuantLinear


def _net():
    torch.manual_seed(0)
    return nn.Sequential(layer.Linear(8, 6), neuron.IFNode(), layer.Linear(6, 4))


def test_forward_hooks_and_pre_hooks_move_in_order_and_are_reported():
    net = _net()
    calls = []
    net[0].register_forward_pre_hook(lambda m, i: calls.append("pre-a"))
    net[0].register_forward_pre_hook(lambda m, a, k: calls.append("pre-kw"), with_kwargs=True)
    net[0].register_forward_hook(lambda m, i, o: calls.append("fwd-a"))
    handle = net[0].register_forward_hook(lambda m, i, o: calls.append("fwd-b"))
    net[0].register_forward_hook(lambda m, i, o: calls.append("fwd-always"), always_call=True)
    q, report = quantize_model(net, inplace=True)
    assert isinstance(q[0], QuantLinear)
    q(torch.rand(2, 8))
    assert calls == ["pre-a", "pre-kw", "fwd-a", "fwd-b", "fwd-always"]
    assert any(line.startswith("0: 2 forward pre-hooks") for line in report.hooks), report.hooks
    assert any(line.startswith("0: 3 forward hooks") and "QuantLinear" in line
               for line in report.hooks), report.hooks
    assert "hooks: 0: 3 forward hooks" in str(report)
    # the user's handle still removes its hook from the replacement
    handle.remove()
    calls.clear()
    q(torch.rand(2, 8))
    assert calls == ["pre-a", "pre-kw", "fwd-a", "fwd-always"]


def test_hooks_also_move_on_a_copy():
    net = _net()
    seen = []
    net[0].register_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    q, _ = quantize_model(net)  # a deep copy: the copied hook moves to the copy's replacement
    q(torch.rand(2, 8))
    assert seen == ["QuantLinear"]


def test_spikingjelly_monitor_keeps_recording_neurons():
    net = _net()
    sjf.set_step_mode(net, "m")
    mon = monitor.OutputMonitor(net, neuron.IFNode)
    q, report = quantize_model(net, QuantConfig(v_bits=8), inplace=True)
    assert isinstance(q[1], QuantIFNode)
    q(torch.rand(3, 2, 8))
    assert len(mon.records) == 1 and mon.records[0].shape == (3, 2, 6)
    assert any(line.startswith("1: 1 forward hook") for line in report.hooks)


def test_backward_hook_moves():
    net = _net()
    grads = []
    net[2].register_full_backward_hook(lambda m, gi, go: grads.append(go[0].shape))
    q, report = quantize_model(net, inplace=True)
    q(torch.rand(2, 8, requires_grad=True)).sum().backward()
    assert grads == [torch.Size([2, 4])]
    assert any("backward hook" in line for line in report.hooks)


def test_pruned_layer_quantized_on_effective_weight_and_stays_pruned():
    net = _net()
    prune.l1_unstructured(net[0], "weight", amount=0.5)
    mask = net[0].weight_mask.clone()
    q, report = quantize_model(net, inplace=True)
    new = q[0]
    assert isinstance(new, QuantLinear)
    assert torch.equal(new.weight_mask, mask)
    assert bool((new.quantized_weight()[mask == 0] == 0).all())
    assert any("prune" in line for line in report.hooks), report.hooks
    # fine-tuning: the gradient reaches weight_orig only where the mask keeps the weight
    q(torch.rand(2, 8)).sum().backward()
    assert new.weight_orig.grad is not None
    assert bool((new.weight_orig.grad[mask == 0] == 0).all())
    with torch.no_grad():
        new.weight_orig.add_(1.0)
    q(torch.rand(2, 8))  # the pruning pre-hook recomputes the effective weight
    assert bool((new.weight[mask == 0] == 0).all()) and bool((new.weight[mask == 1] != 0).any())
    prune.remove(new, "weight")
    assert isinstance(new.weight, nn.Parameter) and "weight_orig" not in dict(new.named_parameters())


def test_pruned_bias_kept():
    net = _net()
    prune.l1_unstructured(net[2], "bias", amount=0.5)
    q, _ = quantize_model(net)
    assert torch.equal(q[2].bias == 0, q[2].bias_mask == 0)


class _Symmetric(nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).transpose(-1, -2)


def test_parametrized_layer_quantized_on_effective_weight():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 2))
    parametrize.register_parametrization(net[0], "weight", _Symmetric())
    original = net[0].parametrizations.weight.original
    q, report = quantize_model(net, inplace=True)
    assert isinstance(q[0], QuantLinear) and parametrize.is_parametrized(q[0], "weight")
    assert q[0].parametrizations.weight.original is original
    w = q[0].quantized_weight()
    assert torch.equal(w, w.T)  # the quantizer sees the effective (symmetric) weight
    assert [r.name for r in report.replaced] == ["0", "1"] and not report.skipped
    q(torch.rand(3, 5)).sum().backward()
    assert original.grad is not None
