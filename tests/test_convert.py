"""quantize_model / QuantConfig / summary."""
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

import snnquant
from snnquant import QuantConfig, quantize_model
from snnquant import nn as qnn


def csnn(channels=8):
    """SpikingJelly's N-MNIST/Fashion-MNIST style CSNN (conv-BN-LIF blocks, multi-step)."""
    net = nn.Sequential(
        layer.Conv2d(2, channels, 3, padding=1, bias=False), layer.BatchNorm2d(channels),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2),
        layer.Conv2d(channels, channels, 3, padding=1, bias=False), layer.BatchNorm2d(channels),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True),
        layer.MaxPool2d(2), layer.Flatten(),
        layer.Linear(channels * 4 * 4, 10), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
    )
    sjf.set_step_mode(net, "m")
    return net


def test_replaces_and_keeps_everything():
    net = csnn()
    net[0].weight.requires_grad_(False)
    q, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert [r.name for r in report.replaced] == ["0", "2", "4", "6", "9", "10"]
    assert report.replaced[0].old_type == "Conv2d" and report.replaced[0].new_type == "QuantConv2d"
    name, old, new = report.replaced[0]
    assert (name, old, new) == ("0", "Conv2d", "QuantConv2d")
    assert isinstance(q[2], qnn.QuantLIFNode) and isinstance(q[9], qnn.QuantLinear)
    assert torch.equal(q[0].weight, net[0].weight) and not q[0].weight.requires_grad
    assert q[2].surrogate_function is not net[2].surrogate_function  # deep copy by default
    assert isinstance(q[2].surrogate_function, surrogate.ATan)
    assert q[2].tau == 2.0 and q[2].detach_reset and q[2].step_mode == "m" and q[0].step_mode == "m"
    assert q[0].weight_quant.bits == 4 and q[2].v_quant.bits == 8
    assert isinstance(net[0], layer.Conv2d) and not isinstance(net[0], qnn.QuantConv2d)  # not inplace


def test_inplace_and_dtype():
    net = csnn().double()
    q, _ = quantize_model(net, QuantConfig(weight_bits=8, v_bits=8, membrane_quantizer="lsq"),
                          inplace=True)
    assert q is net and q[0].weight.dtype == torch.float64
    assert q[0].weight_quant.step.dtype == torch.float64 and q[2].v_quant.step.dtype == torch.float64
    y = q(torch.rand(2, 1, 2, 16, 16, dtype=torch.float64))
    assert y.dtype == torch.float64


def test_containers_and_custom_modules():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = layer.SeqToANNContainer(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4))
            self.sn = neuron.IFNode(step_mode="m")
            self.head = layer.MultiStepContainer(nn.Flatten(), nn.Linear(4 * 6 * 6, 3))

        def forward(self, x):
            return self.head(self.sn(self.conv(x)))

    net = Block()
    q, report = quantize_model(net, QuantConfig(weight_bits=6, v_bits=6))
    assert {r.name for r in report.replaced} == {"conv.0", "sn", "head.1"}
    assert isinstance(q.conv[0], qnn.QuantConv2d) and isinstance(q.head[1], qnn.QuantLinear)
    assert q(torch.rand(3, 2, 2, 8, 8)).shape == (3, 2, 3)


def test_unsupported_neuron_is_named():
    net = nn.Sequential(nn.Linear(4, 4), neuron.IzhikevichNode(step_mode="s"))
    _, report = quantize_model(net, QuantConfig(weight_bits=8, v_bits=8))
    assert report.skipped[0].name == "1" and "IzhikevichNode" in report.skipped[0].reason


def test_skip_and_overrides():
    net = csnn()
    cfg = QuantConfig(weight_bits=4, v_bits=8, skip=["9"], overrides={"0": {"weight_bits": 8},
                                                                     "1*": {"v_bits": 16}})
    q, report = quantize_model(net, cfg)
    assert not isinstance(q[9], qnn.QuantLinear)
    assert ("9", "matches a skip pattern") in [(s.name, s.reason) for s in report.skipped]
    assert q[0].weight_quant.bits == 8 and q[4].weight_quant.bits == 4
    assert q[10].v_quant.bits == 16 and q[2].v_quant.bits == 8


@pytest.mark.parametrize("wq", ["lsq", "lsq_pow2", "minmax", "quantized_bits"])
@pytest.mark.parametrize("mq", ["uniform", "threshold_centered", "lsq"])
def test_every_quantizer_choice_runs(wq, mq):
    q, _ = quantize_model(csnn(4), QuantConfig(weight_bits=4, weight_quantizer=wq, v_bits=8,
                                               membrane_quantizer=mq, per_channel=wq != "quantized_bits"))
    y = q(torch.rand(2, 2, 2, 16, 16))
    y.sum().backward()
    assert y.shape == (2, 2, 10)


def test_bad_config():
    with pytest.raises(ValueError, match="'lsq'.*'minmax'"):
        QuantConfig(weight_quantizer="dorefa")
    with pytest.raises(ValueError, match="uniform"):
        QuantConfig(membrane_quantizer="log")
    with pytest.raises(ValueError, match=r"v_bits.*\[2, 32\].*40"):
        QuantConfig(v_bits=40)
    with pytest.raises(ValueError, match="weight_bits"):
        QuantConfig(weight_bits=0)  # 1 is binary weights (issue 15)
    with pytest.raises(ValueError, match="weight_bits=1"):
        QuantConfig(weight_bits=1, weight_quantizer="quantized_bits")
    with pytest.raises(ValueError, match="unknown fields"):
        QuantConfig(overrides={"x": {"bits": 3}})
    with pytest.raises(ValueError, match="weight_bits"):
        QuantConfig(overrides={"x": {"weight_bits": 0}})


def test_nothing_to_quantize_warns():
    with pytest.warns(UserWarning, match="nothing to quantize"):
        _, report = quantize_model(nn.Sequential(nn.ReLU()), QuantConfig())
    assert report.replaced == [] and report.skipped == []


def test_reset_cache_invalidated_after_inplace_swap():
    net = csnn()
    sjf.reset_net(net)  # fills SpikingJelly's reset cache with the old neurons
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8), inplace=True)
    q(torch.rand(2, 1, 2, 16, 16))
    sjf.reset_net(q)
    assert all(isinstance(m.v, float) for m in q.modules() if isinstance(m, qnn.QuantLIFNode))


def test_state_dict_with_other_widths_names_layer():
    a, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    b, _ = quantize_model(csnn(), QuantConfig(weight_bits=2, v_bits=8))
    with pytest.raises(ValueError, match=r"'0.weight_quant'.*4-bit.*2 bits"):
        b.load_state_dict(a.state_dict())


def test_summary():
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    s = snnquant.summary(q)
    names = [r["name"] for r in s.rows]
    assert names == ["0", "2", "4", "6", "9", "10"]
    conv = s.rows[0]
    assert conv["weight_bits"] == 4 and conv["fp32_bytes"] == 4 * conv["params"]
    assert conv["quant_bytes"] == conv["params"] * 4 / 8
    assert s.rows[1]["membrane_bits_per_neuron"] == 8
    assert s.compression_ratio == pytest.approx(s.total_fp32_bytes / s.total_quant_bytes)
    assert 4 < s.compression_ratio <= 8
    assert "compression ratio" in str(s) and "QuantConv2d" in str(s)


def test_quantized_csnn_trains():
    torch.manual_seed(0)
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    x = (torch.rand(4, 16, 2, 16, 16) > 0.7).float()
    y = torch.randint(0, 10, (16,))
    losses = []
    for _ in range(12):
        sjf.reset_net(q)
        loss = nn.functional.cross_entropy(q(x).mean(0) * 10, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
