"""calibrate reports each neuron layer's firing rate against the float network and warns, naming
the layer, where post-training quantization silences it or makes it fire far more."""
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

from snnquant import FiringRateWarning, QuantConfig, calibrate, firing_rates, quantize_model
from snnquant.calibrate import EXCESS_RATE_FACTOR, SILENT_RATE_FRACTION


def mlp(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(
        layer.Linear(20, 32), neuron.IFNode(surrogate_function=surrogate.ATan()),
        layer.Linear(32, 8), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
    )
    with torch.no_grad():  # strong enough that both neuron layers fire on the test inputs
        net[0].weight.mul_(3.0)
        net[2].weight.mul_(4.0)
    sjf.set_step_mode(net, "m")
    return net


def batches(n=3, T=6, N=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(T, N, 20, generator=g) * 2 for _ in range(n)]


def manual_rates(model, data):
    """Spikes per neuron and step of each neuron layer, counted with hooks independently."""
    sums = {}

    def hook(name):
        def f(m, a, out):
            s, n = sums.get(name, (0.0, 0))
            sums[name] = (s + float(out.sum()), n + out.numel())
        return f
    hs = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
          if isinstance(m, neuron.BaseNode)]
    model.eval()
    with torch.no_grad():
        for x in data:
            sjf.reset_net(model)
            model(x)
    for h in hs:
        h.remove()
    sjf.reset_net(model)
    return {k: s / n for k, (s, n) in sums.items()}


def test_rates_match_the_float_and_the_quantized_network():
    net = mlp()
    q, _ = quantize_model(net, QuantConfig(weight_bits=8, v_bits=16))
    data = batches()
    calibrate(q, data, check_firing=False)
    rates = firing_rates(q, data)
    assert [r.name for r in rates] == ["1", "3"]
    float_rates = manual_rates(net, data)
    quant_rates = manual_rates(q, data)
    for r in rates:
        assert r.float_rate == pytest.approx(float_rates[r.name], abs=1e-12)
        assert r.quantized_rate == pytest.approx(quant_rates[r.name], abs=1e-12)
        assert r.float_rate > 0  # the test network fires
    # the quantized network keeps its quantizers after the float pass
    assert manual_rates(q, data) == quant_rates


def test_calibrate_reports_the_rates_and_stays_quiet_when_they_agree():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=16))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FiringRateWarning)
        report = calibrate(q, batches())
    assert [f.name for f in report.firing] == ["1", "3"]
    assert all(f.warning == "" for f in report.firing)
    assert all(0.5 < f.ratio < 2.0 for f in report.firing)
    assert "firing rate per neuron layer" in str(report)


def test_a_silenced_layer_is_named_in_a_warning():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=16))
    data = batches()
    calibrate(q, data, check_firing=False)
    # silence the first neuron layer in the quantized network only (the float pass bypasses the
    # quantizers): its quantized weights and bias become zero
    for quantizer in (q[0].weight_quant, q[0].bias_quant):
        quantizer.quantize = lambda w: torch.zeros_like(w)
    with pytest.warns(FiringRateWarning, match=r"layer '1' .*below 0.1 x its float rate"):
        rates = firing_rates(q, data)
    assert rates[0].quantized_rate == 0.0 and rates[0].warning
    assert rates[0].quantized_rate < SILENT_RATE_FRACTION * rates[0].float_rate


def test_a_layer_firing_far_more_is_named_in_a_warning():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=16))
    data = batches()
    calibrate(q, data, check_firing=False)
    assert not firing_rates(q, data, warn=False)[1].warning
    # the quantized network's layer-2 weights 4x larger (the float pass bypasses the quantizer)
    wq = q[2].weight_quant
    original = wq.quantize
    wq.quantize = lambda w: original(w) * 4.0
    with pytest.warns(FiringRateWarning, match=r"layer '3' .*above 2 x its float rate"):
        rates = firing_rates(q, data)
    assert rates[1].quantized_rate > EXCESS_RATE_FACTOR * rates[1].float_rate


def test_calibrate_warns_when_post_training_quantization_silences_a_layer():
    net = mlp()
    q, _ = quantize_model(net, QuantConfig(weight_bits=2, v_bits=2))
    for quantizer in (q[0].weight_quant, q[0].bias_quant):  # weights that round to zero
        quantizer.quantize = lambda w: torch.zeros_like(w)
    with pytest.warns(FiringRateWarning, match=r"calibrate: layer '1'"):
        report = calibrate(q, batches(), weights=False)
    assert report.firing[0].quantized_rate == 0.0 and report.firing[0].float_rate > 0


def test_one_shot_iterators_and_bad_arguments():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=16))
    report = calibrate(q, iter(batches()))  # consumed once, kept for the firing pass
    assert report.num_batches == 3 and len(report.firing) == 2
    assert report.firing[0].float_rate > 0
    with pytest.raises(ValueError, match="check_firing"):
        calibrate(q, batches(), check_firing="yes")
    with pytest.raises(ValueError, match="no batch"):
        firing_rates(q, [])
    with pytest.raises(ValueError, match="num_batches"):
        firing_rates(q, batches(), num_batches=0)
    with pytest.raises(ValueError, match="no neuron layer"):
        firing_rates(nn.Sequential(nn.Linear(2, 2)), batches())
    # weights only, no data: calibration works and reports no rate
    report = calibrate(q, [], membranes=False)
    assert report.firing == [] or all(f.float_rate == 0 for f in report.firing)


def spike_mismatch(qmodel, fmodel, data, layer_name):
    """Mean |S_q - S_f| of one neuron layer's spikes, quantized against float, on the data."""
    def spikes(model):
        out = []
        m = dict(model.named_modules())[layer_name]
        h = m.register_forward_hook(lambda mod, a, o: out.append(o.detach().clone()))
        model.eval()
        with torch.no_grad():
            for x in data:
                sjf.reset_net(model)
                model(x)
        h.remove()
        sjf.reset_net(model)
        return out
    q, f = spikes(qmodel), spikes(fmodel)
    return sum(float((a - b).abs().sum()) for a, b in zip(q, f)) / sum(a.numel() for a in f)


def test_firing_method_matches_the_float_spikes_at_least_as_well_as_mse():
    import copy
    net = mlp()
    data = batches(n=4)
    config = QuantConfig(weight_bits=2, v_bits=4)
    by_mse, _ = quantize_model(copy.deepcopy(net), config)
    by_firing, _ = quantize_model(copy.deepcopy(net), config)
    mse_report = calibrate(by_mse, data, method="mse", check_firing=False)
    report = calibrate(by_firing, data, method="firing", check_firing=False)
    # the first layer's search starts from the same 'mse' pair and keeps it unless a pair is better
    assert spike_mismatch(by_firing, net, data, "1") <= spike_mismatch(by_mse, net, data, "1")
    for entry in report.calibrated:
        assert entry.method.startswith("firing (2^")
        start = entry.method.rsplit(" ", 1)[-1].rstrip(")")
        assert start in ("mse", "minmax")
        if start == "mse":
            base = mse_report[entry.name, entry.kind].step
            ratio = torch.tensor(entry.step) / torch.tensor(base)
            exponent = torch.log2(ratio)
            assert torch.equal(exponent, torch.round(exponent))  # the steps stay on the 2^k ladder
            assert -2 <= float(exponent.min()) and float(exponent.max()) <= 2
    # the membrane grids still reach the thresholds
    for name in ("1", "3"):
        grid = dict(by_firing.named_modules())[name].v_quant.grid()
        assert float(grid.step) * grid.qmax >= 1.0


def test_firing_method_also_searches_from_the_minmax_steps():
    """Per-channel weights: the min/max steps are not one power of two times the 'mse' steps, so
    only a search that starts from them too is sure to match the float spikes at least as well as
    'minmax' does (the first neuron layer: nothing before it differs)."""
    import copy
    net = mlp()
    with torch.no_grad():  # channels of very different ranges: per-channel steps differ
        net[0].weight.mul_(torch.logspace(-1, 1, 32).reshape(-1, 1))
    data = batches(n=4)
    config = QuantConfig(weight_bits=2, v_bits=4, per_channel=True)
    found = {}
    for method in ("minmax", "mse", "firing"):
        q, _ = quantize_model(copy.deepcopy(net), config)
        report = calibrate(q, data, method=method, check_firing=False)
        found[method] = (spike_mismatch(q, net, data, "1"), report)
    assert found["minmax"][0] != found["mse"][0]  # the two starts are different networks
    assert found["firing"][0] <= min(found["minmax"][0], found["mse"][0])
    methods = {(e.name, e.kind): e.method for e in found["firing"][1].calibrated}
    assert all(m.startswith("firing (2^") for m in methods.values())
    # here a multiple of the min/max steps matches the float spikes strictly better than every
    # multiple of the 'mse' steps (a tie would keep the 'mse' start): a search from 'mse' alone
    # could not have found it
    assert methods["0", "weight"].endswith(" x minmax)"), methods
