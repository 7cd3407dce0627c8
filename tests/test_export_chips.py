"""Chip networks in the integer description (snnquant.targets.<chip>.op): to_integer of a
Xylo, Loihi or Speck network, IntegerSNN running it equal to the chip layers that trained, the
file, the validation and the refusals. The vendor simulators' agreement with IntegerSNN is tested
in tests/test_targets_{xylo,loihi,speck}.py."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf

from _chip_nets import layer_outputs, loihi_network, speck_network, xylo_network
from conftest import integer_layers
from snnquant.export import (ExportError, IntegerNetworkError, IntegerSNN, c_memory,
                             check_network, compare_integer, load_integer, save_integer, to_c,
                             to_integer, to_nir)
from snnquant.targets import (LoihiLayerOp, LoihiLIFLayer, SpeckIAFLayer, SpeckLayerOp,
                              XyloLayerOp, XyloLIFLayer)


def _xylo(rng):
    net = xylo_network(rng, True, True)
    x = torch.from_numpy(rng.integers(0, 16, (20, 3, net[0].in_features))).float()
    return net, x


def _loihi(rng):
    net = loihi_network(rng, True, True)
    return net, torch.from_numpy((rng.random((20, 3, net[0].in_features)) < 0.5)).float()


def _speck(rng):
    net = speck_network(rng, True, "multi")
    return net, torch.from_numpy(rng.integers(0, 7, (9, 3) + net[0].in_shape)).float()


CHIPS = {"xylo": (_xylo, XyloLayerOp), "loihi": (_loihi, LoihiLayerOp),
         "speck": (_speck, SpeckLayerOp)}


@pytest.mark.parametrize("chip", sorted(CHIPS))
def test_integer_snn_equals_the_chip_layers_on_random_networks(chip):
    """Mixed-sign random weights, biases and parameters (Xylo's saturating, Loihi's wrapping
    ones): every layer of the exported network on IntegerSNN equals the chip layer at every
    step of every sample, and the network is one operation per layer, of the chip's type."""
    make, op_type = CHIPS[chip]
    rng = np.random.default_rng(7)
    spikes = 0
    for trial in range(4):
        net, x = make(rng)
        desc = to_integer(net)
        assert desc.chip == chip and [type(op) for op in desc.ops] == [op_type] * len(net)
        check_network(desc)
        for k, (a, b) in enumerate(zip(layer_outputs(net, x), integer_layers(net, x))):
            np.testing.assert_array_equal(b, a, err_msg=f"trial {trial}, layer {k}")
            spikes += int(a.sum())
        out = IntegerSNN(desc)(x.to(torch.int64))
        assert out.dtype == torch.int64
    assert spikes > 0


def test_multi_spike_counts_above_127_are_kept():
    """Speck's multi-spike counts are not 0/1: the output is int64, not cut to int8."""
    m = SpeckIAFLayer((1, 2, 2), 1, 2, threshold=1, weight_step=1.0, input_max=100,
                      step_mode="m")
    with torch.no_grad():
        m.weight.fill_(100)
    net = nn.Sequential(m)
    x = torch.full((2, 1, 1, 2, 2), 100.0)
    out = IntegerSNN(to_integer(net))(x.to(torch.int64))
    assert out.flatten().tolist() == [40000, 40000]
    sjf.reset_net(net)
    with torch.no_grad():
        assert net(x).flatten().tolist() == [40000, 40000]


@pytest.mark.parametrize("chip", sorted(CHIPS))
def test_file_round_trip(chip, tmp_path):
    net, x = CHIPS[chip][0](np.random.default_rng(3))
    desc = to_integer(net)
    save_integer(desc, tmp_path / "net.safetensors")
    back = load_integer(tmp_path / "net.safetensors")
    assert back.format_version == 5 and back.chip == chip
    for a, b in zip(desc.ops, back.ops):
        for f in dataclasses.fields(a):
            u, v = getattr(a, f.name), getattr(b, f.name)
            assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v, f.name
    assert torch.equal(IntegerSNN(back)(x.to(torch.int64)), IntegerSNN(desc)(x.to(torch.int64)))
    assert str(back).splitlines()[0].startswith(
        f"IntegerNetwork (format 5, {chip} layers in the chip's integers")
    desc.format_version = 4
    with pytest.raises(ValueError, match=f"desc is a {chip} network, which format_version 4 "
                                         f"cannot hold"):
        save_integer(desc, tmp_path / "old.safetensors")


def _xylo_desc():
    net = nn.Sequential(XyloLIFLayer(4, 6, threshold=50, weight_step=1.0, step_mode="m"),
                        XyloLIFLayer(6, 2, threshold=50, weight_step=1.0, delay=1, max_spikes=1,
                                     input_max=31, step_mode="m"))
    return to_integer(net)


@pytest.mark.parametrize("edit, field, says", [
    (lambda d: setattr(d.ops[0], "weight", torch.full((6, 4), 128, dtype=torch.int16)),
     "weight", "[-128, 127]"),
    (lambda d: setattr(d.ops[0], "weight", d.ops[0].weight.float()), "weight", "integer tensor"),
    (lambda d: setattr(d.ops[1], "dash_syn", 16), "dash_syn", "[0, 15]"),
    (lambda d: setattr(d.ops[1], "threshold", 0), "threshold", "[1, 32767]"),
    (lambda d: setattr(d.ops[1], "weight", torch.zeros(2, 5, dtype=torch.int8)), "weight",
     "the 6 outputs of operation 0"),
    (lambda d: setattr(d.ops[1], "inputs", (-1,)), "inputs", "sequence"),
    (lambda d: setattr(d, "input_max", 16), "input_max", "first layer's input_max, 15"),
    (lambda d: setattr(d.ops[1], "bias", torch.zeros(3, dtype=torch.int64)), "bias",
     "shape must be (2,)"),
])
def test_validation_names_the_operation_field_and_value(edit, field, says):
    desc = _xylo_desc()
    edit(desc)
    with pytest.raises(IntegerNetworkError, match=field) as err:
        check_network(desc)
    assert says in str(err.value)


def test_one_chip_per_network():
    desc = _xylo_desc()
    loihi = to_integer(nn.Sequential(LoihiLIFLayer(6, 2, vth=10, step_mode="m")))
    desc.ops[1] = dataclasses.replace(loihi.ops[0], name="mixed")
    with pytest.raises(IntegerNetworkError, match="LoihiLayerOp in a network of xylo layers"):
        check_network(desc)
    with pytest.raises(ExportError, match="one chip's layers"):
        to_integer(nn.Sequential(XyloLIFLayer(4, 6, threshold=50, step_mode="m"),
                                 LoihiLIFLayer(6, 2, vth=10, step_mode="m")))
    with pytest.raises(ExportError, match=r"an nn.Sequential of one chip's layers only; found "
                                          r"\['1'\]"):
        to_integer(nn.Sequential(XyloLIFLayer(4, 6, threshold=50, step_mode="m"), nn.ReLU()))


def test_input_counts_outside_the_chip_are_refused():
    desc = _xylo_desc()
    sim = IntegerSNN(desc)
    with pytest.raises(ValueError, match=r"operation 0 \('0'\): its input event counts must be "
                                         r"in \[0, 15\].*got -1"):
        sim(torch.full((2, 1, 4), -1))
    with pytest.raises(ValueError, match="above input_max=15"):
        sim(torch.full((2, 1, 4), 16))
    with pytest.raises(IntegerNetworkError, match=r"input_shape=\(5,\) does not fit operation 0"):
        sim(torch.zeros((2, 1, 5), dtype=torch.int64))


def test_to_integer_arguments_of_a_chip_network():
    net = nn.Sequential(XyloLIFLayer(4, 6, threshold=50, step_mode="m"))
    with pytest.raises(ValueError, match="input_max=3, leak_bits=8: a chip network's"):
        to_integer(net, input_max=3, leak_bits=8)
    with pytest.raises(IntegerNetworkError, match=r"input_shape=\(5,\)"):
        to_integer(net, input_shape=(5,))
    assert to_integer(net, input_shape=(4,)).chip == "xylo"


def test_c_and_nir_refuse_a_chip_network(tmp_path):
    desc = _xylo_desc()
    with pytest.raises(ExportError, match="xylo network .* the C runtime runs snnquant's "
                                          "operations only"):
        to_c(desc, tmp_path)
    with pytest.raises(ExportError, match="xylo network"):
        c_memory(desc)
    pytest.importorskip("nir")
    with pytest.raises(ExportError, match="NIR's equations cannot carry"):
        to_nir(desc, (4,))


@pytest.mark.parametrize("chip", sorted(CHIPS))
def test_compare_integer_takes_a_chip_network(chip):
    """compare_integer on a chip network compares every chip layer and the output, and finds
    an export whose first layer was silenced (weights and bias zeroed)."""
    net, x = CHIPS[chip][0](np.random.default_rng(5))
    report = compare_integer(net, x)
    assert report.exact and sorted(report.layers) == [str(i) for i in range(len(net))]
    assert "0" not in report.silent_layers
    desc = to_integer(net)
    desc.ops[0].weight = torch.zeros_like(desc.ops[0].weight)
    desc.ops[0].bias = None
    changed = compare_integer(net, x, desc)
    assert not changed.exact and changed.layers["0"] < 1.0


@pytest.mark.parametrize("make, shape, out", [
    (lambda: XyloLIFLayer(4, 3, threshold=5, step_mode="m"), (4,), (3,)),
    (lambda: LoihiLIFLayer(4, 3, vth=5, step_mode="m"), (4,), (3,)),
    (lambda: SpeckIAFLayer((2, 4, 4), 3, 3, threshold=5, step_mode="m"), (2, 4, 4), (3, 2, 2)),
    (lambda: SpeckIAFLayer((2, 4, 4), 3, None, threshold=5, step_mode="m"), (2, 4, 4), (3,)),
    (lambda: SpeckIAFLayer((2, 4, 4), 3, None, threshold=5, step_mode="m"), (32,), (3,)),
], ids=["xylo", "loihi", "speck-conv", "speck-linear", "speck-linear-flat-input"])
def test_no_time_steps_give_an_empty_output(make, shape, out):
    sim = IntegerSNN(to_integer(nn.Sequential(make())))
    assert tuple(sim(torch.zeros((0, 2) + shape, dtype=torch.int64)).shape) == (0, 2) + out
    assert tuple(sim(torch.ones((3, 2) + shape, dtype=torch.int64)).shape) == (3, 2) + out
