"""quantize_model with a chip profile of snnquant.targets: the chip's network, trained in its
arithmetic, as its quantize_for_* builds it, with the report of what each layer came from."""

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import layer, neuron

from _chip_nets import dense_float_net
from snnquant import quantize_model
from snnquant.targets import (LOIHI2, SPECK2F, XYLO_AUDIO2, LoihiLIFLayer, SpeckIAFLayer,
                              XyloLIFLayer, quantize_for_loihi, quantize_for_speck,
                              quantize_for_xylo)


def _dense(v_reset):
    return dense_float_net(16, v_reset, widths=(24, 4))


def _conv():
    torch.manual_seed(0)
    return nn.Sequential(layer.Conv2d(2, 4, 3, padding=1, bias=False, step_mode="m"),
                         neuron.IFNode(v_reset=None, step_mode="m"),
                         layer.AvgPool2d(2, step_mode="m"),
                         layer.Flatten(step_mode="m"),
                         layer.Linear(4 * 4 * 4, 3, bias=False, step_mode="m"),
                         neuron.IFNode(v_reset=None, step_mode="m"))


def _same(a, b):
    assert [type(m) for m in a] == [type(m) for m in b]
    for x, y in zip(a.state_dict().items(), b.state_dict().items()):
        assert x[0] == y[0]
        torch.testing.assert_close(x[1], y[1], rtol=0, atol=0)


@pytest.mark.parametrize("profile, v_reset, convert, cls", [
    (XYLO_AUDIO2, None, quantize_for_xylo, XyloLIFLayer),
    (LOIHI2, 0.0, quantize_for_loihi, LoihiLIFLayer)], ids=["xylo", "loihi"])
def test_quantize_model_with_a_profile_is_the_chips_conversion(profile, v_reset, convert, cls):
    source = _dense(v_reset)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    net, report = quantize_model(source, profile)
    _same(net, convert(_dense(v_reset), profile))
    assert all(isinstance(m, cls) for m in net)
    assert [tuple(r) for r in report.replaced] == [
        ("1+2", "Linear+LIFNode", cls.__name__), ("3+4", "Linear+IFNode", cls.__name__)]
    assert report.skipped == [] and profile.name in report.notes[0]
    # the source network is left as it was
    assert [type(m) for m in source] == [type(m) for m in _dense(v_reset)]
    for k, v in source.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_quantize_model_with_speck_takes_shape_and_largest_count_from_the_example():
    x = torch.randint(0, 5, (4, 3, 2, 8, 8)).float()
    net, report = quantize_model(_conv(), SPECK2F, example_input=x)
    _same(net, quantize_for_speck(_conv(), (2, 8, 8), input_max=int(x.max())))
    assert all(isinstance(m, SpeckIAFLayer) for m in net) and net[0].input_max == int(x.max())
    assert [tuple(r) for r in report.replaced] == [
        ("0+1+2", "Conv2d+IFNode+AvgPool2d", "SpeckIAFLayer"),
        ("4+5", "Linear+IFNode", "SpeckIAFLayer")]
    with pytest.raises(ValueError, match=r"example_input: a Speck network needs .* got None"):
        quantize_model(_conv(), SPECK2F)


def test_quantize_model_with_a_profile_refuses_inplace_and_other_configs():
    with pytest.raises(ValueError, match="inplace=True: a chip profile"):
        quantize_model(_dense(None), XYLO_AUDIO2, inplace=True)
    with pytest.raises(TypeError, match="a QuantConfig or a chip profile .* got str"):
        quantize_model(_dense(None), "xylo")
