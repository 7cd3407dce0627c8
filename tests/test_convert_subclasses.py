"""quantize_model on every Conv*/Linear subclass of SpikingJelly's ``layer`` module (issue 32).

Each is either quantized faithfully (at 16 bits its output equals the float layer's within the
quantization error) or left float and listed in the report's ``skipped`` with a reason. A
subclass with its own ``forward`` (``WSConv2d``, ``WSLinear``: weight standardisation and a
``gain``) must never become a plain quantized layer.
"""
import inspect

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import layer

from snnquant import QuantConfig, quantize_model


def _synaptic_classes():
    found = []
    for name, cls in sorted(vars(layer).items()):
        if inspect.isclass(cls) and issubclass(cls, (nn.Linear, nn.modules.conv._ConvNd)):
            found.append(cls)
    return found


def _instance_and_input(cls):
    torch.manual_seed(0)
    if issubclass(cls, nn.Linear):
        return cls(8, 4), torch.randn(3, 8)
    module = cls(3, 4, 3)
    dims = len(module.kernel_size)
    return module, torch.randn((2, 3) + (6,) * dims)


def test_enumerates_the_weight_standardised_layers():
    names = {cls.__name__ for cls in _synaptic_classes()}
    assert {"Linear", "Conv1d", "Conv2d", "WSConv2d", "WSLinear"} <= names


@pytest.mark.parametrize("cls", _synaptic_classes(), ids=lambda c: c.__name__)
def test_quantized_faithfully_or_skipped_with_a_reason(cls):
    module, x = _instance_and_input(cls)
    with torch.no_grad():
        for p in module.parameters():  # a gain that is not 1 must survive too
            if p.dim() == 4 or p.shape[-1:] == (1,):
                p.mul_(1.5)
    net = nn.Sequential(module)
    q, report = quantize_model(net, QuantConfig(weight_bits=16, bias_bits=None))
    replaced = {r.name: r for r in report.replaced}
    skipped = {s.name: s for s in report.skipped}
    assert ("0" in replaced) != ("0" in skipped), (replaced, skipped)
    if "0" in skipped:
        assert skipped["0"].old_type == cls.__name__ and len(skipped["0"].reason) > 20
        assert q[0] is not None and type(q[0]) is cls
        return
    with torch.no_grad():
        want = net.eval()(x)
        got = q.eval()(x)
    # each weight is rounded by at most half a step and none is clipped at 16 bits
    step = float(q[0].weight_quant.grid().step.max())
    bound = 0.5 * step * module.weight[0].numel() * float(x.abs().max())
    error = float((got - want).abs().max())
    assert error <= bound, (cls.__name__, error, bound)


def test_weight_standardised_conv_is_named_with_its_reason():
    net = nn.Sequential(layer.WSConv2d(3, 4, 3), layer.WSLinear(4, 2))
    q, report = quantize_model(net, QuantConfig(weight_bits=8))
    skipped = {s.name: s for s in report.skipped}
    assert not report.replaced or all(r.name not in ("0", "1") for r in report.replaced)
    assert "own forward" in skipped["0"].reason and "WSConv2d" in skipped["0"].reason
    assert "gain" in skipped["0"].reason
    assert type(q[0]) is layer.WSConv2d and type(q[1]) is layer.WSLinear
