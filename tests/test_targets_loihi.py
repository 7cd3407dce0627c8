"""The Loihi 2 profile (snnquant.targets.loihi): its arithmetic against Lava's own fixed-point
CPU simulation, training in it, the limits and the file.

Lava (lava-nc 0.10) needs Python <= 3.10: the tests that run it need a Python with Lava in
``$SNNQUANT_LAVA_PYTHON`` (``.ci/run`` builds one with pyenv's 3.10) and skip, saying so,
without it."""

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import neuron

import snnquant.functional.chip_neurons as chip_neurons
from _chip_nets import dense_float_net, loihi_network
from _repo import ROOT, shared_recordings
from conftest import integer_layers, real_split_bench
from snnquant.functional.bitshift import truncated_decay, wrap_signed
from snnquant.targets.loihi import (LoihiLIFLayer, check_loihi, lava_python, load_loihi,
                                    quantize_for_loihi, run_lava, save_loihi, to_loihi)

needs_lava = pytest.mark.skipif(
    lava_python() is None, reason="no Python with Lava: set SNNQUANT_LAVA_PYTHON to a Python "
    "<= 3.10 with lava-nc installed (.ci/run builds one with pyenv's 3.10)")


def test_truncated_decay_rounds_toward_zero():
    x = torch.tensor([4096., 100., -100., 1., -1., 8388607., -8388607.], dtype=torch.float64)
    # multiplier 4095 (du = 0 with Lava's ds_offset 1): |x| * 4095 / 4096, truncated
    assert truncated_decay(x, 4095).tolist() == [4095., 99., -99., 0., 0., 8386559., -8386559.]
    assert truncated_decay(x, 0).tolist() == [0.] * 7
    assert truncated_decay(x, 2048).tolist() == [2048., 50., -50., 0., 0., 4194303., -4194303.]


def test_wrap_signed_is_lavas_single_wrap():
    half = 2.0 ** 23
    x = torch.tensor([half, half + 1, -half, -half + 1, 3 * half, -3 * half - 5],
                     dtype=torch.float64)
    assert wrap_signed(x, 24).tolist() == [half, -half + 1, half, -half + 1, half, -half - 5]


@needs_lava
@pytest.mark.parametrize("saturate", [False, True], ids=["in-range", "wrapping"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_spikes_equal_lava_on_random_networks(saturate, bias, monkeypatch):
    """Mixed-sign random weights, thresholds, decays and weight exponents (negative ones: the
    arithmetic right shift): every layer's spikes equal Lava's fixed-point simulation at every
    step of every sample; the wrapping networks wrap the 24-bit current."""
    wraps = []

    def counting_wrap(x, bits):
        out = wrap_signed(x, bits)
        wraps.append(int((out != x).sum()))
        return out

    monkeypatch.setattr(chip_neurons, "wrap_signed", counting_wrap)
    rng = np.random.default_rng(20 + 2 * saturate + bias)
    spikes = 0
    for trial in range(5):
        net = loihi_network(rng, saturate, bias)
        x = torch.from_numpy((rng.random((16, 2, net[0].in_features)) < 0.5).astype(np.float32))
        sjf.reset_net(net)
        ours, h = [], x
        with torch.no_grad():
            for m in net:
                h = m(h)
                ours.append(h.permute(1, 0, 2).numpy())
        lava = run_lava(to_loihi(net), x.permute(1, 0, 2).numpy())["layers"]
        for k, (a, b, c) in enumerate(zip(ours, lava, integer_layers(net, x))):
            np.testing.assert_array_equal(a, b, err_msg=f"trial {trial}, layer {k}")
            np.testing.assert_array_equal(c, b, err_msg=f"trial {trial}, layer {k}: IntegerSNN")
        spikes += sum(int(a.sum()) for a in ours)
    assert spikes > 100, "the networks hardly spiked: the comparison checks little"
    if saturate:
        assert sum(wraps) > 0, "no current wrapped"


def test_quantize_for_loihi_maps_the_pairs():
    net = quantize_for_loihi(dense_float_net(20, 0.0))
    assert [type(m) for m in net] == [LoihiLIFLayer] * 3
    assert [m.du for m in net] == [4095] * 3
    assert [m.dv for m in net] == [2048, 0, 1024]
    step = net[0].weight_step
    assert 127 * step >= dense_float_net(20, 0.0)[1].weight.abs().max() > 63 * step
    assert net[0].vth == round(2 * 2.0 / step) and net[1].vth == round(2 / net[1].weight_step)
    assert check_loihi(net) == []


@needs_lava
def test_training_in_lavas_arithmetic_then_lava_equals_the_trained_network():
    net = quantize_for_loihi(dense_float_net(20, 0.0))
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(12, 16, 20, generator=g) < 0.6).float()
    y = torch.randint(0, 4, (16,), generator=g)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses, got_grad = [], [False] * len(net)
    for _ in range(30):
        sjf.reset_net(net)
        loss = nn.functional.cross_entropy(net(x).sum(0).float(), y)
        opt.zero_grad()
        loss.backward()
        got_grad = [g or bool(m.weight.grad.abs().sum() > 0) for g, m in zip(got_grad, net)]
        opt.step()
        losses.append(loss.item())
    assert all(got_grad), got_grad  # a layer gets a gradient once its input spikes
    assert min(losses[-5:]) < losses[0]
    sjf.reset_net(net)
    with torch.no_grad():
        trained = net(x).permute(1, 0, 2).numpy()
    assert trained.sum() > 0
    lava = run_lava(to_loihi(net), x.permute(1, 0, 2).numpy())["layers"][-1]
    np.testing.assert_array_equal(trained, lava)
    np.testing.assert_array_equal(integer_layers(net, x)[-1], lava)


def test_refusals_name_the_argument_and_value():
    with pytest.raises(ValueError, match=r"vth must be in \[0, 131071\], got 131072"):
        LoihiLIFLayer(2, 2, vth=131072)
    with pytest.raises(ValueError, match=r"du must be in \[0, 4095\], got 4096"):
        LoihiLIFLayer(2, 2, vth=1, du=4096)
    with pytest.raises(ValueError, match=r"weight_exp must be in \[-8, 7\], got 8"):
        LoihiLIFLayer(2, 2, vth=1, weight_exp=8)
    m = LoihiLIFLayer(2, 2, vth=1)
    with pytest.raises(ValueError, match=r"integers in \[0, 1\].*got 2"):
        m(torch.tensor([[2., 0.]]))
    with pytest.raises(ValueError, match=r"model.1: .*v_reset=0.0, got v_reset=None"):
        quantize_for_loihi(nn.Sequential(nn.Linear(4, 4), neuron.LIFNode(v_reset=None)))
    with pytest.raises(ValueError, match=r"model.0: .*Conv2d here has no place"):
        quantize_for_loihi(nn.Sequential(nn.Conv2d(1, 2, 3), neuron.LIFNode()))
    net = nn.Sequential(LoihiLIFLayer(4, 3, vth=1), LoihiLIFLayer(5, 2, vth=1))
    assert [str(v) for v in check_loihi(net)] == \
        ["1: in_features == 3 (the previous layer's out_features), got 5"]
    with pytest.raises(ValueError, match="in_features == 3"):
        to_loihi(net)
    with pytest.raises(RuntimeError, match="SNNQUANT_LAVA_PYTHON"):
        run_lava(to_loihi(quantize_for_loihi(dense_float_net(20, 0.0))), np.zeros((4, 20)),
                 python="")


def test_file_round_trip_and_corruption(tmp_path):
    spec = to_loihi(quantize_for_loihi(dense_float_net(20, 0.0)))
    path = tmp_path / "net.loihi.json"
    save_loihi(spec, path)
    back = load_loihi(path)
    assert len(back.layers) == 3
    for a, b in zip(spec.layers, back.layers):
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
    payload = json.loads(path.read_text())
    payload["layers"][0]["vth"] += 1
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_loihi(path)


REAL = shared_recordings()


@needs_lava
@pytest.mark.skipif(REAL is None, reason="the shared real N-MNIST recordings "
                    "(../shared/data/nmnist-real-1k) are not on this machine")
@pytest.mark.skipif(not (ROOT / "benchmarks").is_dir(), reason="benchmarks/ not beside tests/")
def test_network_trained_on_the_real_split_equals_lava(tmp_path, monkeypatch):
    """The benchmark's network (578 -> 256 -> 10 on the real 800/200 split), trained 1 epoch in
    float then 1 in Lava's arithmetic: Lava reproduces every output spike of every test sample."""
    bench_mod, bench = real_split_bench("benchmarks/loihi_nmnist.py", REAL, tmp_path,
                                        monkeypatch, 1, 8)
    row = bench_mod.run_seed(bench, 0, 1, 1e-2, 1e-3)
    assert row["test_samples"] == 200
    assert row["trained_agreement"] == 100.0
    assert row["trained_integer_agreement"] == 100.0
    assert row["trained_on_lava"] == row["trained_model"]
    assert row["trained_on_lava"] > 2 * 100 / 10


def test_check_loihi_refuses_an_int32_overflow():
    """Lava adds (activation << 6) to the current in int32: a layer whose largest input sum could
    overflow it is listed."""
    m = LoihiLIFLayer(3000, 2, vth=1, weight_step=1.0, weight_exp=7)
    with torch.no_grad():
        m.weight.fill_(127.0)
    found = check_loihi(nn.Sequential(m))
    assert [v.layer for v in found] == ["0"] and "int32" in found[0].limit
    m.weight_exp = 0
    assert check_loihi(nn.Sequential(m)) == []


def _inhibitory_network():
    """The issue-47 network: Linear(1, 1) with the weight -128 (Lava's -256), bias 2050 << 3,
    du 4095, dv 0, vth 300: every weight <= 0, so Lava's Dense runs in its inhibitory sign mode,
    where the weight -256 is clipped to -255."""
    m = LoihiLIFLayer(1, 1, vth=300, du=4095, dv=0, weight_step=1.0, weight_exp=0, bias=True,
                      bias_exp=3, step_mode="m")
    with torch.no_grad():
        m.weight.fill_(-128.0)
        m.bias.fill_(2050.0)
    return nn.Sequential(m)


def test_inhibitory_sign_mode_is_modelled():
    """Lava's sign mode, modelled exactly (not refused): a layer whose Lava weights are all <= 0
    and some < 0 applies -256 as -255; a mixed-sign layer keeps -256."""
    from snnquant.functional.chip_neurons import lava_weight

    w = torch.tensor([[-128.0, 0.0], [-3.0, -128.0]], dtype=torch.float64)
    assert lava_weight(w).tolist() == [[-255.0, 0.0], [-6.0, -255.0]]
    mixed = torch.tensor([[-128.0, 1.0]], dtype=torch.float64)
    assert lava_weight(mixed).tolist() == [[-256.0, 2.0]]
    net = _inhibitory_network()
    x = torch.ones(50, 1, 1)
    sjf.reset_net(net)
    with torch.no_grad():
        ours = net(x)[:, 0, 0]
    assert ours.sum() > 0 and int(ours.nonzero()[0]) == 36
    assert integer_layers(net, x)[0][0, :, 0].tolist() == ours.tolist()


@needs_lava
def test_inhibitory_sign_mode_equals_lava():
    """The network of issue 47 on Lava: it spikes first at step 36 (the weight -256 applied as
    -255), and snnquant's layer and its IntegerSNN export compute the same spikes."""
    net = _inhibitory_network()
    x = torch.ones(50, 1, 1)
    sjf.reset_net(net)
    with torch.no_grad():
        ours = net(x).permute(1, 0, 2).numpy()
    lava = run_lava(to_loihi(net), x.permute(1, 0, 2).numpy())["layers"][0]
    assert lava.sum() > 0 and int(np.flatnonzero(lava[0, :, 0])[0]) == 36
    np.testing.assert_array_equal(ours, lava)
    np.testing.assert_array_equal(integer_layers(net, x)[0], lava)
