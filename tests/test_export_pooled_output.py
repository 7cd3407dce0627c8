"""A network whose last operation pools spikes by summing (an average pool): the integer output
is the sum, which IntegerSNN must not wrap, and compare_integer must compare it with the float
model's average (regression: the sum was cast to int8 and compared unscaled)."""
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.export import IntegerSNN, compare_integer, to_integer


def test_a_trailing_average_pool_of_many_spikes_is_exact_and_unwrapped():
    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(1, 2, 3, padding=1), neuron.IFNode(v_threshold=0.5),
                        layer.AvgPool2d(16))  # sums of 256 spikes: more than int8 holds
    sjf.set_step_mode(net, "m")
    with torch.no_grad():
        net[0].weight.fill_(0.5)
        net[0].bias.fill_(1.0)  # every neuron fires at every step
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = torch.ones(2, 3, 1, 16, 16)
    sjf.reset_net(q)
    q(x)  # initialise the quantizers
    q.eval()
    desc = to_integer(q)
    out = IntegerSNN(desc)(x.to(torch.int64))
    assert out.dtype != torch.int8
    assert int(out.max()) == 256  # every one of the 16 x 16 neurons fired
    report = compare_integer(q, x, desc)
    assert report.output == 1.0 and report.samples == 1.0, report


def test_input_shape_is_checked_strictly_by_every_export():
    """A float, a bool or a zero in input_shape is refused by name, never truncated."""
    import pytest

    from snnquant.export import check_input_shape, to_c, to_nir

    assert check_input_shape(5) == (5,) and check_input_shape([2, 3]) == (2, 3)
    for bad in ((2.5, 3), (True,), (0, 3), (), "34", None):
        with pytest.raises(ValueError, match="input_shape must be"):
            check_input_shape(bad)
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(4, 3), neuron.IFNode())
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    q(torch.rand(2, 4))
    desc = to_integer(q.eval())
    with pytest.raises(ValueError, match=r"input_shape must be .*got \(4\.5,\)"):
        to_c(desc, "snn_bad", input_shape=(4.5,))
    with pytest.raises(ValueError, match="input_shape must be"):
        to_nir(desc, (4.5,))
    with pytest.raises(ValueError, match="input_shape must be"):
        to_integer(q, input_shape=(4.5,))


def test_quant_config_bit_width_message_says_none_is_allowed():
    import pytest

    with pytest.raises(ValueError, match=r"weight_bits must be None or an int in \[1, 32\], got 99"):
        QuantConfig(weight_bits=99)


def test_a_neuron_type_without_integer_form_is_named_with_the_supported_ones():
    import pytest

    from snnquant.export import ExportError

    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(4, 3), neuron.QIFNode())
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    q(torch.rand(2, 4))
    with pytest.raises(ExportError, match=r"QIFNode.*no integer form.*IFNode, LIFNode"):
        to_integer(q.eval())
