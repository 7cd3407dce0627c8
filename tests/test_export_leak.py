"""Integer export: the opt-in fixed-point leak (``to_integer(..., leak_bits=F)``) for a tau that is
not a power of two."""
import dataclasses
import json

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron
from _dtype_recorder import RecordDtypes

from snnquant import QuantConfig, quantize_model
from snnquant import nn as qnn
from snnquant.export import (FORMAT_VERSION, ExportError, IntegerSNN, compare_integer,
                             fold_batchnorm, integer_agreement, load_integer, save_integer,
                             to_integer, to_nir)


def inputs(shape, T, N, seed, max_count=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, max_count + 1, (T, N) + shape, generator=g).float()


def grid_net(tau=3.0, weight_step=2.0 ** -2, v_step=2.0 ** -2, plif=False, decay_input=True,
             out=32):
    """Linear + LIF with fixed grids: grid shift d = log2(v_step / weight_step)."""
    torch.manual_seed(1)
    lin = qnn.QuantLinear(16, out, bias=False, step_mode="m",
                          weight_quant=qnn.UniformQuantizer(8, step=weight_step))
    vq = qnn.UniformQuantizer(8, step=v_step)
    if plif:
        nrn = qnn.QuantParametricLIFNode(init_tau=tau, decay_input=decay_input, v_quant=vq,
                                         step_mode="m")
    else:
        nrn = qnn.QuantLIFNode(tau=tau, decay_input=decay_input, v_quant=vq, step_mode="m")
    with torch.no_grad():
        lin.weight.uniform_(-0.5, 0.5)
    return nn.Sequential(lin, nrn).eval()


def mlp(tau=3.0, decay_input=True):
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(20, 16), neuron.LIFNode(tau=tau, decay_input=decay_input),
                        layer.Linear(16, 10), neuron.LIFNode(tau=tau, decay_input=decay_input))
    sjf.set_step_mode(net, "m")
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(3)
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    return fold_batchnorm(q.eval())


# ------------------------------------------------------------------------------------------------
# default refusal, argument checks

def test_default_refuses_and_mentions_leak_bits():
    with pytest.raises(ExportError, match=r"layer '1' \(QuantLIFNode\): tau = 3.0 is not a power "
                                          r"of two.*leak_bits"):
        to_integer(grid_net())
    with pytest.raises(ExportError, match=r"layer '1' \(QuantParametricLIFNode\).*learned tau.*"
                                          r"not a power of two.*leak_bits"):
        to_integer(grid_net(plif=True))


@pytest.mark.parametrize("bad", [0, 33, -4, 12.0, True, "12"])
def test_leak_bits_validation(bad):
    with pytest.raises(ValueError, match=r"leak_bits must be None or an int in \[1, 32\], got "
                                         + repr(bad).replace(".", r"\.")):
        to_integer(grid_net(), leak_bits=bad)


def test_multiplier_rounding_to_zero_is_refused():
    with pytest.raises(ExportError, match=r"layer '1'.*multiplier 0.*leak_bits=8"):
        to_integer(grid_net(tau=1000.0), leak_bits=8)  # round(256 / 1000) = 0
    assert to_integer(grid_net(tau=1000.0), leak_bits=12).layer("1").leak_multiplier == 4


# ------------------------------------------------------------------------------------------------
# the description

def test_fixed_point_leak_description():
    net = grid_net()
    desc = to_integer(net, leak_bits=12)
    op = desc.layer("1")
    assert op.leak_multiplier == round(2 ** 12 / 3) == 1365
    assert op.leak_shift == 12 and op.leak_round_shift == 6 and op.tau == 3.0
    assert op.exact is False and desc.exact is False and desc.approximate_layers == ["1"]
    assert op.effective_tau == 4096 / 1365
    assert "APPROXIMATE" in str(desc) and "1365 / 2^12" in str(desc)
    assert any("not exact" in n for n in desc.notes)
    # nearest, not floor or ceil: 2^3 / 2.5 = 3.2 -> 3, 2^4 / 1.5 = 10.67 -> 11
    assert to_integer(grid_net(tau=2.5), leak_bits=3).layer("1").leak_multiplier == 3
    assert to_integer(grid_net(tau=1.5), leak_bits=4).layer("1").leak_multiplier == 11


def test_power_of_two_tau_keeps_the_exact_shift():
    for tau in (2.0, 4.0):
        net = grid_net(tau=tau, weight_step=2.0 ** -4)
        plain, opted = to_integer(net), to_integer(net, leak_bits=12)
        op = opted.layer("1")
        assert op.leak_multiplier == 1 and op.leak_round_shift == 0 and op.exact
        assert op.leak_shift == int(tau).bit_length() - 1
        assert opted.exact and str(opted) == str(plain)
        report = compare_integer(net, inputs((16,), 12, 20, 4), opted)
        assert report.exact and report.samples == 1.0 and report.approximate_layers == []


def test_simulator_uses_integer_ops_only_with_multiplier():
    net = grid_net(weight_step=2.0 ** -4)
    desc = to_integer(net, leak_bits=12)
    x = inputs((16,), 6, 3, 0).to(torch.int64)

    with RecordDtypes() as rec:
        IntegerSNN(desc)(x)
    bad = [(f, d) for f, d in rec.dtypes if d.is_floating_point or d.is_complex]
    assert not bad, bad
    assert any("mul" in f and d == torch.int64 for f, d in rec.dtypes)  # the multiplier M


# ------------------------------------------------------------------------------------------------
# agreement with the float model (measured, not guaranteed)

def test_agreement_when_the_rounding_cannot_differ():
    # membrane grid = current grid (d = 0): the float charge v + D/3 (D integer) has fractional
    # part 0, 1/3 or 2/3, at least 1/6 from a rounding boundary, and the multiplier error
    # |D| * |1365/4096 - 1/3| = |D| / 12288 stays below 1/6 for |D| < 2048: identical spikes.
    for decay_input in (True, False):
        net = grid_net(decay_input=decay_input)
        desc = to_integer(net, leak_bits=12)
        assert desc.layer("1").grid_shift == 0
        report = compare_integer(net, inputs((16,), 16, 64, 3), desc)
        assert report.exact and report.samples == 1.0, str(report)
        assert "not guaranteed" in str(report)


@pytest.mark.parametrize("tau,weight_step", [(3.0, 2.0 ** -4), (3.0, 2.0 ** -6), (6.0, 2.0 ** -4),
                                             (1.5, 2.0 ** -6)])
def test_agreement_is_high_on_a_finer_current_grid(tau, weight_step):
    net = grid_net(tau=tau, weight_step=weight_step)
    desc = to_integer(net, leak_bits=12)
    assert desc.layer("1").grid_shift > 0
    x = inputs((16,), 16, 100, 3)
    report = compare_integer(net, x, desc)
    assert report.layers["1"] >= 0.999 and report.samples >= 0.9, str(report)
    assert integer_agreement(net, x, desc) == report.samples


def test_rounding_the_leak_product_first_keeps_exact_quotients():
    # tau = 6 on d = 0: D/6 is a tie (k + 1/2) whenever D is an odd multiple of 3. The float model
    # rounds it to even; rounding M*D with guard bits first restores the exact tie, while a single
    # rounding at the end sends it to the side of the multiplier error (683/4096 > 1/6).
    net = grid_net(tau=6.0)
    desc = to_integer(net, leak_bits=12)
    x = inputs((16,), 16, 100, 3)
    assert compare_integer(net, x, desc).samples == 1.0
    op = desc.layer("1")
    single = dataclasses.replace(desc, ops=[desc.ops[0], dataclasses.replace(op, leak_round_shift=0)])
    assert compare_integer(net, x, single).samples < 0.5


def test_quantize_model_network_tau_3():
    for decay_input in (True, False):
        q = mlp(decay_input=decay_input)
        with pytest.raises(ExportError, match=r"layer '1'.*leak_bits"):
            to_integer(q)
        desc = to_integer(q, leak_bits=12)
        assert desc.approximate_layers == ["1", "3"]
        x = inputs((20,), 16, 128, 5, 2)
        report = compare_integer(q, x, leak_bits=12)  # exported inside
        assert report.approximate_layers == ["1", "3"]
        assert report.samples >= 0.9 and report.predictions >= 0.9, str(report)


def test_parametric_lif_with_init_tau_3():
    net = grid_net(plif=True, weight_step=2.0 ** -4)
    desc = to_integer(net, leak_bits=12)
    op = desc.layer("1")
    k = float(torch.sigmoid(net[1].w.detach()))
    assert op.kind == "lif" and op.leak_multiplier == round(4096 * k) == 1365 and not op.exact
    assert op.tau == 1 / k
    report = compare_integer(net, inputs((16,), 16, 100, 3), desc)
    assert report.samples >= 0.9, str(report)


# ------------------------------------------------------------------------------------------------
# files and NIR

def test_save_load_round_trip_and_version_1_files(tmp_path):
    import safetensors.torch as st
    from safetensors import safe_open

    net = grid_net(weight_step=2.0 ** -4)
    desc = to_integer(net, leak_bits=12)
    path = tmp_path / "leak.safetensors"
    save_integer(desc, path)
    back = load_integer(path)
    assert str(back) == str(desc) and back.exact is False and back.format_version == FORMAT_VERSION
    assert dataclasses.asdict(back.layer("1")) == dataclasses.asdict(desc.layer("1"))
    x = inputs((16,), 8, 5, 1).long()
    assert torch.equal(IntegerSNN(back)(x), IntegerSNN(desc)(x))

    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert json.loads(meta["description"])["exact"] is False

    def rewrite(name, record, version):
        # as snnquant wrote files before the whole-file checksum: a checksum of the tensors only
        from snnquant.export.backends.files import _tensor_checksum
        meta2 = dict(meta, description=json.dumps(record), format_version=version,
                     checksum=_tensor_checksum(tensors))
        meta2.pop("file_sha256")
        out = tmp_path / name
        out.write_bytes(st.save(tensors, metadata=meta2))
        return out

    # a version-1 file (written before the fixed-point leak existed) loads, every layer exact
    exact = to_integer(grid_net(tau=2.0, weight_step=2.0 ** -4))
    save_integer(exact, path)
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    record = json.loads(meta["description"])
    record["format_version"] = 1
    for entry in record["ops"]:
        for key in ("leak_multiplier", "leak_round_shift", "exact", "tau"):
            entry.pop(key, None)
    with pytest.warns(UserWarning, match="older snnquant"):
        old = load_integer(rewrite("v1.safetensors", record, "1"))
    assert old.format_version == 1 and old.exact and old.layer("1").leak_multiplier == 1
    assert torch.equal(IntegerSNN(old)(x), IntegerSNN(exact)(x))
    with pytest.raises(ValueError, match=r"format_version '6'.*reads format_version 1, 2, 3, 4 "
                                         r"and 5"):
        load_integer(rewrite("v6.safetensors", record, "6"))
    with pytest.raises(ValueError, match="corrupt.*description says format_version 1"), \
            pytest.warns(UserWarning, match="older snnquant"):
        load_integer(rewrite("mixed.safetensors", record, "2"))
    desc.format_version = 1
    with pytest.raises(ValueError, match="fixed-point leak.*format_version 1 cannot hold"):
        save_integer(desc, tmp_path / "bad.safetensors")


def test_to_nir_with_fixed_point_leak():
    pytest.importorskip("nir")
    net = grid_net(weight_step=2.0 ** -4)
    desc = to_integer(net, leak_bits=12)
    graph = to_nir(desc, input_shape=(16,), dt=1.0)
    node = graph.nodes["1"]
    assert type(node).__name__ == "LIF"
    assert float(node.tau.reshape(-1)[0]) == pytest.approx(4096 / 1365)
    assert node.metadata["leak_multiplier"] == 1365 and node.metadata["exact"] is False
    assert node.metadata["source_tau"] == 3.0 and graph.metadata["exact"] is False
