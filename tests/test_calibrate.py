"""Post-training quantization: snnquant.calibrate sets steps from data and never trains."""
import math

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

import snnquant
from snnquant import QuantConfig, calibrate, quantize_model


def mlp(seed=0, hidden=16, multi=True):
    torch.manual_seed(seed)
    net = nn.Sequential(
        layer.Linear(20, hidden), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
        layer.Linear(hidden, 4, bias=False), neuron.IFNode(surrogate_function=surrogate.ATan()),
    )
    if multi:
        sjf.set_step_mode(net, "m")
    return net


def batches(n=3, T=6, N=8, scale=1.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(scale * torch.rand(T, N, 20, generator=g) * 2,
             torch.randint(0, 4, (N,), generator=g)) for _ in range(n)]


def not_a_step(name):
    return not (name.endswith("weight_quant.step") or name.endswith("v_quant.step")
                or name.endswith("_val") or "initialized" in name or "bit_width" in name)


def snapshot(model):
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state


def test_sets_ranges_from_data_and_does_not_train(monkeypatch):
    net = mlp()
    q, _ = quantize_model(net, QuantConfig(weight_bits=8, per_channel=True, v_bits=8))
    q.train()
    before = snapshot(q)

    def no_optimizer(*args, **kwargs):
        raise AssertionError("calibrate created an optimizer")
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", no_optimizer)
    report = calibrate(q, batches())
    after = snapshot(q)
    for k, v in before.items():
        if not_a_step(k):
            assert torch.equal(v, after[k]), k
    assert all(p.grad is None for p in q.parameters())
    assert q.training and q[0].training  # the modes are restored
    # weights: per channel, the smallest power of two whose grid covers max |w_c|
    w = net[0].weight.detach()
    step = q[0].weight_quant.grid().step.detach().reshape(-1)
    peak = w.abs().amax(dim=1)
    assert torch.all(step * 127 >= peak) and torch.all(step / 2 * 127 < peak)
    assert torch.equal(step, torch.exp2(torch.round(torch.log2(step))))
    entry = report["0", "weight"]
    assert entry.qmin == -128 and entry.qmax == 127 and len(entry.step) == 16
    # membranes: the grid covers the observed charge and the threshold
    for name in ("1", "3"):
        m = report[name, "membrane"]
        assert m.covered[1] >= max(m.observed[1], 1.0) and m.covered[0] <= m.observed[0]
        assert m.clipped_fraction == 0.0
    assert "calibration (minmax, 3 batches)" in str(report)


def test_membrane_step_follows_the_data():
    steps = []
    for scale in (1.0, 8.0):
        q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=8))
        calibrate(q, batches(scale=scale))
        steps.append(float(q[1].v_quant.grid().step))
    assert steps[1] > steps[0]


def test_threshold_is_always_reachable():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=8))
    # inputs of zero: the charge never leaves 0, yet the grid must reach the threshold 1.0
    report = calibrate(q, [torch.zeros(4, 2, 20)])
    for name in ("1", "3"):
        grid = q.get_submodule(name).v_quant.grid()
        assert float(grid.step) * grid.qmax >= 1.0
        assert report[name, "membrane"].covered[1] >= 1.0


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_power_of_two_membrane_step_stays_one_when_the_threshold_sets_it(method):
    # regression: with 'mse' the threshold floor (1/127) replaced the power-of-two candidates
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=8))
    calibrate(q, [0.01 * torch.rand(4, 2, 20)], method=method)
    for name in ("1", "3"):
        step = float(q.get_submodule(name).v_quant.grid().step)
        assert step == 2.0 ** round(math.log2(step)) and step * 127 >= 1.0


def test_calibrated_w8v16_model_matches_full_precision():
    net = mlp(hidden=32)
    q, _ = quantize_model(net, QuantConfig(weight_bits=8, per_channel=True, v_bits=16))
    data = batches()
    calibrate(q, data)
    x = data[0][0]
    sjf.reset_net(net), sjf.reset_net(q)
    with torch.no_grad():
        ref, out = net.eval()(x), q.eval()(x)
    assert (ref == out).float().mean() > 0.97


@pytest.mark.parametrize("method", ["percentile", "mse"])
def test_outliers_are_clipped_by_percentile_and_mse(method):
    torch.manual_seed(0)
    net = mlp()
    with torch.no_grad():  # heavy-tailed weights: a few large values
        net[0].weight.copy_(torch.distributions.StudentT(1.5).sample(net[0].weight.shape) * 0.05)
    q_min, _ = quantize_model(net, QuantConfig(weight_bits=3, weight_quantizer="lsq"))
    q_other, _ = quantize_model(net, QuantConfig(weight_bits=3, weight_quantizer="lsq"))
    calibrate(q_min, batches(), method="minmax")
    rep = calibrate(q_other, batches(), method=method, percentile=99.0)
    s_min = float(q_min[0].weight_quant.grid().step)
    s_other = float(q_other[0].weight_quant.grid().step)
    w = net[0].weight.detach()
    expected = max(float(w.max()) / 3, -float(w.min()) / 4)  # grid [-4, 3]: covers both ends
    assert math.isclose(s_min, expected, rel_tol=1e-6)  # lsq: not restricted to powers of two
    assert s_other < 0.8 * s_min
    assert 0 < rep["0", "weight"].clipped_fraction < 0.2
    assert rep["0", "weight"].method == method


def test_mse_minimises_the_error_among_its_candidates():
    torch.manual_seed(0)
    net = mlp()
    q, _ = quantize_model(net, QuantConfig(weight_bits=3, weight_quantizer="lsq"))
    calibrate(q, batches(), method="mse", membranes=False)
    w = net[0].weight.detach().double()
    best = float(q[0].weight_quant.grid().step)

    def err(s):
        return float(((torch.clamp(torch.round(w / s), -4, 3) * s - w) ** 2).sum())
    for factor in (0.8, 0.9, 1.1, 1.25):
        assert err(best) <= err(best * factor) + 1e-12


def test_freeze():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=4, weight_quantizer="lsq", v_bits=8,
                                             membrane_quantizer="lsq"))
    calibrate(q, batches())
    assert not q[0].weight_quant.step.requires_grad and not q[1].v_quant.step.requires_grad
    q2, _ = quantize_model(mlp(), QuantConfig(weight_bits=4, weight_quantizer="lsq", v_bits=8,
                                              membrane_quantizer="lsq"))
    calibrate(q2, batches(), freeze=False)
    assert q2[0].weight_quant.step.requires_grad and q2[1].v_quant.step.requires_grad


def test_frozen_minmax_range_does_not_follow_training_data():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, weight_quantizer="minmax",
                                             per_channel=True, v_bits=8))
    calibrate(q, batches())
    step = q[0].weight_quant.grid().step.clone()
    q.train()
    with torch.no_grad():
        q[0].weight.mul_(3.0)
    sjf.reset_net(q)
    q(batches()[0][0])
    assert torch.equal(q[0].weight_quant.grid().step, step)


def test_single_step_model_plain_tensors_and_generators():
    q, _ = quantize_model(mlp(multi=False), QuantConfig(weight_bits=8, v_bits=8))
    report = calibrate(q, (x for x, _ in batches()), num_batches=2)
    assert report.num_batches == 2 and len(report.calibrated) == 4


def test_fixed_level_quantizers_are_reported_not_guessed():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=8,
                                             membrane_quantizer="threshold_centered"))
    report = calibrate(q, batches())
    assert {(s.name, s.kind) for s in report.skipped} == {("1", "membrane"), ("3", "membrane")}
    assert "not calibrated" in str(report)


def test_bad_arguments_name_themselves():
    q, _ = quantize_model(mlp(), QuantConfig(weight_bits=8, v_bits=8))
    with pytest.raises(ValueError, match="method"):
        calibrate(q, batches(), method="kl")
    with pytest.raises(ValueError, match="percentile"):
        calibrate(q, batches(), method="percentile", percentile=0)
    with pytest.raises(ValueError, match="num_batches"):
        calibrate(q, batches(), num_batches=0)
    with pytest.raises(ValueError, match=r"batches\[0\]"):
        calibrate(q, [torch.zeros(3, 20)])
    with pytest.raises(ValueError, match="no batch"):
        calibrate(q, [])
    with pytest.raises(ValueError, match="quantize_model"):
        calibrate(mlp(), batches())


def test_minmax_membrane_range_comes_from_the_charge_and_stays():
    from snnquant.nn import MinMaxQuantizer, QuantLIFNode, QuantLinear
    torch.manual_seed(0)
    net = nn.Sequential(QuantLinear(20, 16, weight_quant=8, step_mode="m"),
                        QuantLIFNode(tau=2.0, v_quant=MinMaxQuantizer(8), step_mode="m"))
    report = calibrate(net, batches(scale=3.0))
    entry = report["1", "membrane"]
    vq = net[1].v_quant
    lo, hi = float(vq.min_val), float(vq.max_val)
    assert lo <= entry.observed[0] and hi >= max(entry.observed[1], 1.0)
    assert entry.clipped_fraction == 0.0 and vq.frozen
    net.train()
    sjf.reset_net(net)
    net(batches(scale=10.0)[0][0])
    assert (float(vq.min_val), float(vq.max_val)) == (lo, hi)
