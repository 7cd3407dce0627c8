"""The contract of the export issue: any network made by quantize_model with
QuantConfig(weight_bits=2..8, v_bits=4..16, membrane_quantizer='uniform') over IF and LIF neurons
(tau a power of two), hard or soft reset, exports exactly: default quantizers, biases included,
trained or not."""
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant import nn as qnn
from snnquant.export import IntegerSNN, compare_integer, to_integer

CASES = [  # weight_bits, v_bits, neuron kind, tau, soft reset, conv
    (2, 4, "lif", 2.0, False, True), (3, 6, "if", None, True, False), (4, 8, "lif", 4.0, True, True),
    (5, 10, "if", None, False, True), (6, 12, "lif", 2.0, True, False), (8, 16, "lif", 8.0, False, False),
]


def _neuron(kind, tau, soft):
    v_reset = None if soft else 0.0
    if kind == "if":
        return neuron.IFNode(v_reset=v_reset)
    return neuron.LIFNode(tau=tau, v_reset=v_reset)


@pytest.mark.parametrize("weight_bits,v_bits,kind,tau,soft,conv", CASES)
@pytest.mark.parametrize("trained", [False, True])
def test_default_config_exports_exactly(weight_bits, v_bits, kind, tau, soft, conv, trained):
    torch.manual_seed(weight_bits * 7 + v_bits)
    if conv:
        net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), _neuron(kind, tau, soft),
                            layer.MaxPool2d(2), layer.Flatten(), layer.Linear(4 * 4 * 4, 6),
                            _neuron(kind, tau, soft))
        x = torch.randint(0, 3, (6, 5, 2, 8, 8)).float()
    else:
        net = nn.Sequential(layer.Linear(20, 16), _neuron(kind, tau, soft), layer.Linear(16, 6),
                            _neuron(kind, tau, soft))
        x = torch.randint(0, 3, (6, 5, 20)).float()
    sjf.set_step_mode(net, "m")
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                m.weight.mul_(3.0)
                m.bias.uniform_(-0.5, 0.5)
    q, _ = quantize_model(net, QuantConfig(weight_bits=weight_bits, v_bits=v_bits,
                                           membrane_quantizer="uniform"))
    assert isinstance(q[0].bias_quant, qnn.WeightGridBiasQuantizer)
    if trained:
        opt = torch.optim.Adam(q.parameters(), lr=5e-3)
        for _ in range(3):
            sjf.reset_net(q)
            loss = nn.functional.cross_entropy(q(x).mean(0) * 4, torch.arange(5) % 6)
            opt.zero_grad()
            loss.backward()
            opt.step()
    q.eval()
    sjf.reset_net(q)
    desc = to_integer(q)
    report = compare_integer(q, x, desc)
    assert report.exact, report
    _, layers = IntegerSNN(desc)(x.to(torch.int64), record=True)
    assert sum(int(v.sum()) for v in layers.values()) > 0  # the comparison is not vacuous


def test_weight_grid_bias_quantizer():
    lin = qnn.QuantLinear(4, 3, weight_quant=qnn.LSQQuantizer(4, power_of_two=True), bias_quant=8)
    assert isinstance(lin.bias_quant, qnn.WeightGridBiasQuantizer)
    with torch.no_grad():
        lin.bias.copy_(torch.tensor([0.3, -100.0, 0.0]))
    b = lin.quantized_bias()
    s = float(lin.weight_quant.effective_step().detach())
    assert torch.equal(b / s, torch.round(b / s))  # on the weight grid
    assert float(b[1].detach()) == -128 * s  # clamped to 8 bits
    b.sum().backward()
    assert lin.bias.grad.tolist() == [1.0, 0.0, 1.0]  # masked straight-through
    with pytest.raises(ValueError, match="bias_quant"):
        qnn.QuantLinear(4, 3, weight_quant=None, bias_quant=8)
