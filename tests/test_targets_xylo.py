"""The Xylo profile (snnquant.targets.xylo): its arithmetic against SynSense's own simulator
(xylosim, through Rockpool's XyloSim), training in that arithmetic, the limits and the file."""

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from _chip_nets import dense_float_net, xylo_network
from _repo import ROOT, shared_recordings
from conftest import integer_layers, load_script, real_split_bench
from snnquant.functional.bitshift import (bitshift_decay, multi_spike_count,
                                          saturating_accumulate)
from snnquant.targets import (XYLO_AUDIO2, XyloLIFLayer, check_xylo, load_xylo,
                              quantize_for_xylo, run_xylosim, save_xylo, to_xylo)

LO, HI = XYLO_AUDIO2.state_range


def _vendor():
    pytest.importorskip("xylosim", reason="SynSense's xylosim is not installed "
                                          "(pip install 'snnquant[xylo]')")
    pytest.importorskip("rockpool", reason="Rockpool is not installed "
                                           "(pip install 'snnquant[xylo]')")


# ---- the arithmetic, one rule at a time ---------------------------------------------------------
def test_bitshift_decay_rules():
    x = torch.tensor([100., 3., 1., 0., -1., -3., -100., -32768., 32767.])
    # dash 2: x - (x >> 2), at least 1 for a positive x; floor shift for a negative one
    assert bitshift_decay(x, 2).tolist() == [75., 2., 0., 0., 0., -2., -75., -24576., 24576.]
    assert bitshift_decay(x, 15).tolist() == [99., 2., 0., 0., 0., -2., -99., -32767., 32766.]
    assert bitshift_decay(x, 0).tolist() == [0.] * 9


def _sequential(state, counts, weight, lo, hi):
    out = state.clone().double()
    for n in range(counts.shape[0]):
        for j in range(weight.shape[0]):
            a = float(state[n, j])
            for i in range(counts.shape[1]):
                for _ in range(int(counts[n, i])):
                    a = min(max(a + float(weight[j, i]), lo), hi)
            out[n, j] = a
    return out


def test_saturating_accumulate_is_event_by_event():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        state = torch.randint(LO, HI, (3, 5), generator=g).float()
        counts = torch.randint(0, 4, (3, 6), generator=g).float()
        weight = torch.randint(-128, 128, (5, 6), generator=g).float() * 2 ** (trial % 8 + 3)
        got = saturating_accumulate(state, counts, weight, LO, HI)
        assert torch.equal(got, _sequential(state, counts, weight, LO, HI))
    # the order matters, and it is the sources' order
    state = torch.zeros(1, 1)
    w = torch.tensor([[127., 127., 127., -128.]]) * 128
    assert saturating_accumulate(state, torch.ones(1, 4), w, LO, HI).item() == HI - 16384
    assert saturating_accumulate(state, torch.ones(1, 4), w.flip(1), LO, HI).item() == 32384


def test_multi_spike_count():
    v = torch.tensor([0., 6., 7., 50., 10000., -5.])
    assert multi_spike_count(v, 7, 31).tolist() == [0., 0., 1., 7., 31., 0.]
    assert multi_spike_count(v, 7, 1).tolist() == [0., 0., 1., 1., 1., 0.]


# ---- against SynSense's simulator ---------------------------------------------------------------
def _ours(net, x):
    """Every layer's spikes [N, T, n] for input counts x [T, N, in], and whether any synaptic
    current or membrane reached a bound."""
    sjf.reset_net(net)
    outs, hit = [], False
    h = x
    with torch.no_grad():
        for m in net:
            m.step_mode = "s"
            steps = []
            src = torch.cat([torch.zeros_like(h[:1]), h[:-1]]) if m.delay else h
            delay, m.delay = m.delay, 0
            for t in range(x.shape[0]):
                steps.append(m(src[t]))
                hit |= bool(((m.isyn == LO) | (m.isyn == HI) | (m.vmem == LO)
                             | (m.vmem >= HI - m.threshold)).any())
            m.delay, m.step_mode = delay, "m"
            h = torch.stack(steps)
            outs.append(h.permute(1, 0, 2).numpy())
    return outs, hit


@pytest.mark.parametrize("saturate", [False, True], ids=["in-range", "saturating"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_spikes_equal_xylosim_on_random_networks(saturate, bias):
    """Mixed-sign random weights, thresholds, decays and shifts; random input counts up to 15:
    every hidden neuron's spike count and every readout spike equal SynSense's simulator's at
    every step of every sample."""
    _vendor()
    rng = np.random.default_rng(10 * saturate + bias)
    hits, most = 0, 0
    for trial in range(8):
        net = xylo_network(rng, saturate, bias)
        x = torch.from_numpy(rng.integers(0, 16, (24, 3, net[0].in_features))
                             * (rng.random((24, 3, net[0].in_features)) < 0.5)).float()
        layers, hit = _ours(net, x)
        hits += hit
        # the multi-step forward (training's) is the same computation as the single-step one
        sjf.reset_net(net)
        with torch.no_grad():
            assert np.array_equal(net(x).permute(1, 0, 2).numpy(), layers[-1])
        vendor = run_xylosim(to_xylo(net), x.permute(1, 0, 2).numpy())
        np.testing.assert_array_equal(np.concatenate(layers[:-1], axis=2), vendor["hidden"],
                                      err_msg=f"trial {trial}: hidden spike counts")
        np.testing.assert_array_equal(layers[-1], vendor["output"],
                                      err_msg=f"trial {trial}: readout spikes")
        exported = integer_layers(net, x)
        np.testing.assert_array_equal(np.concatenate(exported[:-1], axis=2), vendor["hidden"],
                                      err_msg=f"trial {trial}: IntegerSNN's hidden counts")
        np.testing.assert_array_equal(exported[-1], vendor["output"],
                                      err_msg=f"trial {trial}: IntegerSNN's readout spikes")
        most = max(most, int(vendor["hidden"].max()))
    assert most > 1, "no hidden neuron fired several spikes in one step"
    if saturate:
        assert hits >= 4, "the saturating networks did not reach the 16-bit bounds"


# ---- from a SpikingJelly network, trained in the chip's arithmetic ------------------------------
def test_quantize_for_xylo_maps_the_pairs():
    net = quantize_for_xylo(dense_float_net(16, None))
    assert [type(m) for m in net] == [XyloLIFLayer] * 3
    assert [m.delay for m in net] == [0, 1, 1]
    assert [m.max_spikes for m in net] == [31, 31, 1]
    assert [m.input_max for m in net] == [15, 31, 31]
    assert [m.dash_mem for m in net] == [1, 15, 2]
    assert check_xylo(net) == []
    first = dense_float_net(16, None)[1]
    step = net[0].weight_step
    assert 127 * step >= first.weight.abs().max() > 63 * step
    assert net[0].threshold == round(1.0 / step)


def test_training_in_the_chip_arithmetic_then_xylosim_equals_the_trained_network():
    _vendor()
    net = quantize_for_xylo(dense_float_net(16, None))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (12, 16, 16), generator=g).float()
    y = torch.randint(0, 4, (16,), generator=g)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    before = [m.integer_weight().detach().clone() for m in net]
    losses = []
    for _ in range(30):
        sjf.reset_net(net)
        out = net(x).sum(0)
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in net)
        opt.step()
        losses.append(loss.item())
    assert min(losses[-5:]) < losses[0]
    assert any(not torch.equal(b, m.integer_weight()) for b, m in zip(before, net))
    sjf.reset_net(net)
    with torch.no_grad():
        trained = net(x).permute(1, 0, 2).numpy()
    vendor = run_xylosim(to_xylo(net), x.permute(1, 0, 2).numpy())
    np.testing.assert_array_equal(trained, vendor["output"])
    np.testing.assert_array_equal(integer_layers(net, x)[-1], vendor["output"])


# ---- limits and refusals ------------------------------------------------------------------------
def _layer(i, o, **kw):
    kw.setdefault("threshold", 100)
    return XyloLIFLayer(i, o, **kw)


def test_check_xylo_lists_every_violation_by_layer():
    net = nn.Sequential(_layer(17, 600), _layer(600, 401, delay=1, input_max=31, weight_shift=1),
                        _layer(401, 10, delay=1, input_max=31, weight_shift=2),
                        _layer(10, 9, delay=0, max_spikes=31, input_max=31))
    found = {(v.layer, v.limit): v.value for v in check_xylo(net)}
    assert found[("0", "input channels <= 16")] == 17
    assert found[("", "hidden neurons <= 1000")] == 1011
    assert found[("3", "readout neurons <= 8")] == 9
    assert found[("3", "delay == 1")] == 0
    assert found[("3", "max_spikes == 1")] == 31
    assert found[("", "one weight_shift for the hidden layers after the first (weights_rec)")] \
        == [1, 2]
    assert len(found) == 6
    with pytest.raises(ValueError, match="input channels <= 16, got 17"):
        to_xylo(net)


def test_refusals_name_the_argument_and_value():
    with pytest.raises(ValueError, match=r"threshold must be in \[1, 32767\], got 0"):
        _layer(2, 2, threshold=0)
    with pytest.raises(ValueError, match=r"dash_mem must be in \[0, 15\], got 16"):
        _layer(2, 2, dash_mem=16)
    with pytest.raises(ValueError, match="weight_step must be a power of two, got 0.3"):
        _layer(2, 2, weight_step=0.3)
    m = _layer(2, 2)
    with pytest.raises(ValueError, match=r"integers in \[0, 15\].*got 16"):
        m(torch.tensor([[16., 0.]]))
    with pytest.raises(ValueError, match="got 0.5"):
        m(torch.tensor([[0.5, 0.]]))
    bad = nn.Sequential(nn.Linear(4, 4), neuron.LIFNode(v_reset=0.0))
    with pytest.raises(ValueError, match=r"model.1: .*v_reset=None, got v_reset=0.0"):
        quantize_for_xylo(bad)
    bad = nn.Sequential(nn.Conv2d(1, 2, 3), neuron.LIFNode(v_reset=None))
    with pytest.raises(ValueError, match=r"model.0: .*Conv2d here has no place on the chip"):
        quantize_for_xylo(bad)
    big = nn.Sequential(nn.Linear(20, 8), neuron.LIFNode(v_reset=None),
                        nn.Linear(8, 2), neuron.LIFNode(v_reset=None))
    with pytest.raises(ValueError, match="input channels <= 16, got 20"):
        quantize_for_xylo(big)


def test_file_round_trip_and_corruption(tmp_path):
    net = quantize_for_xylo(dense_float_net(16, None))
    spec = to_xylo(net)
    path = tmp_path / "net.xylo.json"
    save_xylo(spec, path)
    back = load_xylo(path)
    for k, v in spec.as_kwargs().items():
        if v is None:
            assert getattr(back, k).any() == getattr(spec, k).any()
        else:
            np.testing.assert_array_equal(np.asarray(getattr(back, k)), np.asarray(v))
    assert back.hidden_sizes == [24, 12]
    payload = json.loads(path.read_text())
    payload["threshold"][0] += 1
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_xylo(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a snnquant snnquant-xylo file"):
        load_xylo(path)


REAL = shared_recordings()


@pytest.mark.heavy
@pytest.mark.skipif(REAL is None, reason="the shared real N-MNIST recordings "
                    "(../shared/data/nmnist-real-1k) are not on this machine")
@pytest.mark.skipif(not (ROOT / "benchmarks").is_dir(), reason="benchmarks/ not beside tests/")
def test_network_trained_on_the_real_split_equals_xylosim(tmp_path, monkeypatch):
    """The benchmark's network (16 -> 256 -> 128 -> 8, digits 0-7 of the real 800/200 split),
    trained 2 epochs in float then 2 in Xylo's arithmetic: SynSense's simulator reproduces every
    readout spike of every test sample, so its accuracy is the trained network's."""
    _vendor()
    bench_mod, bench = real_split_bench("benchmarks/xylo_nmnist.py", REAL, tmp_path,
                                        monkeypatch, 2, 32)
    row = bench_mod.run_seed(bench, 0, 2, 1e-2, 1e-3)
    assert row["test_samples"] > 150
    assert row["converted_agreement"] == 100.0 and row["trained_agreement"] == 100.0
    assert row["trained_integer_agreement"] == 100.0
    assert row["trained_on_xylosim"] == row["trained_model"]
    assert row["trained_on_xylosim"] > 2 * 100 / 8  # it learned: twice the chance level


def test_a_large_saturating_sum_is_exact_in_float32():
    """1000 inputs of 15 events on weight 127 << 7: the plain sum (2.4e8) is beyond float32's
    exact integers, and the saturated current must still be exactly 32767 (32766 after the
    decay), in training mode too (the straight-through gradient must not move the value)."""
    m = XyloLIFLayer(1000, 1, threshold=32767, dash_syn=15, dash_mem=15, weight_step=1.0,
                     weight_shift=7)
    with torch.no_grad():
        m.weight.fill_(127.0)
    x = torch.full((1, 1000), 15.0)
    for grad in (False, True):
        sjf.reset_net(m)
        with torch.set_grad_enabled(grad):
            m(x)
        assert m.isyn.item() == HI - 1


@pytest.mark.skipif(not (ROOT / "benchmarks").is_dir(), reason="benchmarks/ not beside tests/")
def test_nir_route_is_wired_as_the_network(tmp_path):
    """The benchmark's NIR route (the float network as a NIR graph file, Rockpool's from_nir and
    Xylo mapper, then global_quantize on XyloSim): the mapped weights are the float network's,
    layer by layer, with the synapse and membrane decays the graph asks for (dash 1), and the
    quantised network runs and spikes on XyloSim."""
    _vendor()
    pytest.importorskip("nir")
    bench = load_script("benchmarks/xylo_nmnist.py")
    import nir
    from rockpool.nn.modules.torch.nir import from_nir

    torch.manual_seed(0)
    fnet = nn.Sequential(*[m for a, b in ((16, 24), (24, 12), (12, 4)) for m in (
        layer.Linear(a, b, step_mode="m"), neuron.LIFNode(tau=2.0, v_reset=None, step_mode="m"))])
    nir.write(tmp_path / "g.nir", bench.nir_graph(fnet))
    mapper = bench.rockpool_mapper()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = mapper(from_nir(nir.read(tmp_path / "g.nir")).as_graph(), weight_dtype="float",
                      threshold_dtype="float", dash_dtype="float")
    w = [fnet[i].weight.detach().numpy() for i in (0, 2, 4)]
    w_in, w_rec = (np.asarray(spec[k]).reshape(spec[k].shape[:2]) for k in ("weights_in",
                                                                             "weights_rec"))
    np.testing.assert_allclose(w_in[:, :24], w[0].T, rtol=1e-6)
    np.testing.assert_allclose(w_rec[:24, 24:], w[1].T, rtol=1e-6)
    assert not w_in[:, 24:].any() and not w_rec[:, :24].any() and not w_rec[24:].any()
    np.testing.assert_allclose(spec["weights_out"][24:, :], w[2].T, rtol=1e-6)
    assert set(np.round(spec["dash_syn"]).tolist()) == {1.0}
    assert set(np.round(spec["dash_mem"]).tolist()) == {1.0}
    x = torch.randint(0, 16, (12, 4, 16))
    result = bench.nir_route(fnet, [(x.float(), torch.zeros(4, dtype=torch.int64))], tmp_path)
    assert 0.0 <= result["accuracy"] <= 100.0 and result["dash_syn"] == [1]


@pytest.mark.parametrize("field, value", [("threshold", 40000), ("dash_mem", 16),
                                          ("dash_syn", 20), ("weight_shift", 8),
                                          ("threshold", 2.5), ("max_spikes", 0)])
def test_check_xylo_reads_the_values_the_export_writes(field, value):
    """A field assigned after the layer is built is checked as at build time: check_xylo lists
    it naming the layer and the field, and to_xylo refuses it (xylosim would fail inside its
    constructor)."""
    net = nn.Sequential(_layer(2, 3), _layer(3, 2, delay=1, max_spikes=1, input_max=31))
    assert check_xylo(net) == []
    setattr(net[0], field, value)
    found = [v for v in check_xylo(net) if v.layer == "0"]
    assert [v.value for v in found] == [value] and field in found[0].limit
    with pytest.raises(ValueError, match=f"0: {field}"):
        to_xylo(net)
