"""saturation_report, widen_membrane_range and to_nir's saturation warning."""
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.export import (IntegerSNN, SaturationWarning, saturation_report, to_integer,
                             widen_membrane_range)
from snnquant.nn import QuantIFNode, UniformQuantizer


def _inhibited(step_mode):
    """One IF neuron on a 4-bit grid of step 1/4 ([-2, 1.75]) driven down by 1/2 per input event."""
    fc = layer.Linear(1, 1, bias=False, step_mode=step_mode)
    fc.weight.data.fill_(-0.5)
    return nn.Sequential(fc, QuantIFNode(v_quant=UniformQuantizer(4, step=0.25),
                                         step_mode=step_mode))


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_report_counts_steps_at_v_min(step_mode):
    # sample 0 gets an event every step: H = -0.5, -1, -1.5, -2, then held at -2 (5 of 8 steps);
    # sample 1 gets none and stays at 0
    x = torch.zeros(8, 2, 1)
    x[:, 0] = 1.0
    report = saturation_report(_inhibited(step_mode), x)
    (row,) = report.layers
    assert row.layer == "1" and row.neuron_steps == 16
    assert row.at_min == 5 / 16 and row.at_max == 0.0
    assert (row.v_min, row.v_max) == (-2.0, 1.75)
    assert report.samples_in_bounds == 0.5 and report.saturated_layers() == ["1"]
    assert "at v_min" in str(report)


def test_report_counts_v_max_and_integer_input():
    net = _inhibited("m")
    net[0].weight.data.fill_(3.0)  # H = 3 > 1.75: held at v_max, then fires and resets
    report = saturation_report(net, torch.ones(4, 1, 1, dtype=torch.int64))
    assert report.layers[0].at_max == 1.0 and report.samples_in_bounds == 0.0


def test_report_refuses_bad_input():
    with pytest.raises(ValueError, match=r"data must have shape \[T, N, \.\.\.\]"):
        saturation_report(_inhibited("m"), torch.zeros(3))
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        saturation_report("net", torch.zeros(3, 1, 1))
    with pytest.raises(ValueError, match="no quantized neuron"):
        saturation_report(nn.Sequential(nn.Linear(1, 1)), torch.zeros(3, 1, 1))
    with pytest.raises(ValueError, match="extra_bits"):
        widen_membrane_range(_inhibited("m"), 0)


def _mixed_sign_mlp():
    """PyTorch's default (mixed-sign) initialisation, 4-bit weights, 8-bit membranes."""
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(16, 12), neuron.IFNode(), layer.Linear(12, 6), neuron.IFNode())
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    x = torch.randint(0, 2, (16, 8, 16))
    sjf.reset_net(q)
    q.train()(x.float())
    return q.eval(), x


def test_to_nir_warns_naming_the_saturating_layers():
    pytest.importorskip("nir")
    from snnquant.export import to_nir
    q, x = _mixed_sign_mlp()
    report = saturation_report(q, x)
    assert report.saturated_layers() and report.samples_in_bounds < 1.0
    for source in (q, to_integer(q)):
        with pytest.warns(SaturationWarning) as rec:
            to_nir(source, (16,), data=x)
        text = str(rec[0].message)
        for name in report.saturated_layers():
            assert f"{name} (" in text
        assert "NIR consumers cannot reproduce" in text


def test_widened_membranes_do_not_saturate_and_keep_in_bounds_spikes():
    pytest.importorskip("nir")
    from snnquant.export import simulate_nir, to_nir
    q, x = _mixed_sign_mlp()
    wide = widen_membrane_range(q, 8)
    assert wide[1].v_quant.bits == 16 and float(wide[1].v_quant.step) == float(q[1].v_quant.step)
    report = saturation_report(wide, x)
    assert report.saturated_layers() == [] and report.samples_in_bounds == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", SaturationWarning)
        to_nir(wide, (16,), data=x)
        to_nir(to_integer(wide), (16,), data=x)
    # in bounds, NIR's own equations reproduce the integer IF network on every sample
    out = simulate_nir(to_nir(wide, (16,)), x)
    assert torch.equal(out.to(torch.int8), IntegerSNN(to_integer(wide))(x).to(torch.int8))


@pytest.mark.parametrize("arch", ["dense", "mlp", "conv", "conv_pool"])
def test_headroom_configuration_makes_importers_reproduce_mixed_sign_if_networks(arch):
    """The guide's configuration (v_bits=14, widen_membrane_range by 6) on PyTorch's default init:
    every sample in bounds, and NIR's equations and SpikingJelly's and Norse's importers (with
    the documented workarounds) reproduce IntegerSNN's spikes on every sample."""
    pytest.importorskip("nir")
    from _nir_consumers import RUNNERS, build_network, events, saturation_free, samples_identical
    from snnquant.export import simulate_nir, to_nir
    narrow, shape = build_network(arch, "if", 4, 0, v_bits=14, init="default")
    desc, _ = build_network(arch, "if", 4, 0, v_bits=14, init="default", headroom_bits=6)
    x = events(shape, T=16, N=32, seed=1000)
    assert not saturation_free(to_nir(narrow, shape), x)[0]  # the default grid saturates
    ref = IntegerSNN(desc)(x)
    assert bool((ref != 0).any())
    graph = to_nir(desc, shape, dt=1e-4, max_pool="conv_if")
    assert saturation_free(graph, x)[0]
    assert samples_identical(simulate_nir(graph, x), ref) == 1.0
    for consumer in ("spikingjelly", "norse"):
        pytest.importorskip({"spikingjelly": "spikingjelly.activation_based.nir_exchange",
                             "norse": "norse"}[consumer])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = RUNNERS[consumer](graph, x, 1e-4, shift_flatten=True)
        assert samples_identical(out, ref) == 1.0, consumer


def test_nir_out_of_bounds_finds_the_samples_that_saturate():
    pytest.importorskip("nir")
    from snnquant.export import nir_out_of_bounds, to_nir
    q, x = _mixed_sign_mlp()
    layers, in_bounds = nir_out_of_bounds(to_nir(q, (16,)), x)
    assert in_bounds.dtype == torch.bool and in_bounds.shape == (x.shape[1],)
    assert layers and not bool(in_bounds.all())
    layers, in_bounds = nir_out_of_bounds(to_nir(widen_membrane_range(q, 8), (16,)), x)
    assert layers == [] and bool(in_bounds.all())
    with pytest.raises(ValueError, match="data must be a tensor"):
        nir_out_of_bounds(to_nir(q, (16,)), [1, 2])


@pytest.mark.parametrize("decay_input", [True, False])
def test_report_reads_the_leak_of_lif_and_parametric_lif(decay_input):
    # input -1 every step on a [-2, 1.75] grid, tau = 2: with decay_input the membrane settles at
    # -1 (never saturates), without it at -2 (saturates); PLIF with w = 0 (tau = 2) reads the same
    from snnquant.nn import QuantLIFNode, QuantParametricLIFNode
    x = torch.zeros(8, 2, 1)
    x[:, 0] = 1.0
    rows = []
    for node in (QuantLIFNode(tau=2.0, decay_input=decay_input, step_mode="m",
                              v_quant=UniformQuantizer(4, step=0.25)),
                 QuantParametricLIFNode(init_tau=2.0, decay_input=decay_input, step_mode="m",
                                        v_quant=UniformQuantizer(4, step=0.25))):
        fc = layer.Linear(1, 1, bias=False, step_mode="m")
        fc.weight.data.fill_(-1.0)
        (row,) = saturation_report(nn.Sequential(fc, node), x).layers
        rows.append(row)
    assert (rows[0].at_min > 0) == (not decay_input)
    assert rows[0].at_min == rows[1].at_min and rows[0].at_max == rows[1].at_max == 0.0
