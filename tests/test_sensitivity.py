"""Sensitivity per layer and bit width; assign_bits within a memory budget."""
import itertools

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

import snnquant
from snnquant import QuantConfig, assign_bits, quantize_model, sensitivity
from snnquant.sensitivity import LayerCost, SensitivityEntry, SensitivityResult


def mlp(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(
        layer.Linear(12, 24), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
        layer.Linear(24, 8), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
        layer.Linear(8, 3, bias=False), neuron.IFNode(surrogate_function=surrogate.ATan()),
    )
    with torch.no_grad():  # strong enough that every layer spikes
        for i in (0, 2, 4):
            net[i].weight.mul_(4.0)
    sjf.set_step_mode(net, "m")
    return net


def data(n=2, T=5, N=16, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(3 * torch.rand(T, N, 12, generator=g), torch.randint(0, 3, (N,), generator=g))
            for _ in range(n)]


@pytest.fixture(scope="module")
def result():
    return sensitivity(mlp(), data(), candidates=(2, 4, 8))


def test_one_entry_per_layer_kind_and_bits(result):
    assert result.layers == [("0", "weight"), ("1", "membrane"), ("2", "weight"),
                             ("3", "membrane"), ("4", "weight"), ("5", "membrane")]
    assert len(result.entries) == 6 * 3
    assert result.baseline_accuracy is not None
    e = next(e for e in result.entries if e.layer == "2" and e.bits == 2)
    assert e.delta_loss == pytest.approx(e.loss - result.baseline_loss)
    assert e.bytes == 24 * 8 * 2 / 8 + 8 * 16 / 8  # weights at 2 bits, bias at 16 bits
    counts = {(c.layer, c.kind): c.count for c in result.costs}
    assert counts[("1", "membrane")] == 24 and counts[("0", "weight")] == 12 * 24
    assert "8-bit dloss" in str(result) and "membrane" in str(result)


def test_only_the_measured_layer_is_quantized(monkeypatch):
    seen = []
    from snnquant import convert
    original = convert.quantize_model

    def spy(model, config=None, inplace=False):
        out = original(model, config, inplace)
        seen.append([r.name for r in out[1].replaced])
        return out
    monkeypatch.setattr(convert, "quantize_model", spy)
    sensitivity(mlp(), data(n=1), candidates=(4,), membranes=False)
    assert seen[1:] == [["0"], ["2"], ["4"]]


def test_without_labels_the_loss_is_the_distance_to_full_precision():
    res = sensitivity(mlp(), [x for x, _ in data()], candidates=(2, 8), membranes=False)
    assert res.baseline_accuracy is None and res.baseline_loss == 0.0
    assert all(e.accuracy is None and e.delta_loss >= 0 for e in res.entries)
    # 2-bit weights move the output further from full precision than 8-bit ones
    d2 = sum(e.delta_loss for e in res.entries if e.bits == 2)
    d8 = sum(e.delta_loss for e in res.entries if e.bits == 8)
    assert d2 > d8


def test_plot(result, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    fig = result.plot()
    fig.savefig(tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 0
    assert len(fig.axes[0].texts) == 18
    with pytest.raises(ValueError, match="metric"):
        result.plot(metric="loss")


def _model_bytes(model, x):
    s = snnquant.summary(model, x)
    return s.total_quant_bytes + s.total_state_quant_bytes


@pytest.mark.parametrize("fraction", [0.0, 0.35, 0.7, 1.0])
def test_assign_bits_fits_the_budget_as_summary_counts_it(result, fraction):
    low = assign_bits(result, budget_bits=2).assignment["bytes"]
    high = assign_bits(result, budget_bits=8).assignment["bytes"]
    budget = low + fraction * (high - low)
    cfg = assign_bits(result, budget_bytes=budget)
    assert isinstance(cfg, QuantConfig) and len(cfg.overrides) == 6
    q, report = quantize_model(mlp(), cfg)
    assert len(report.replaced) == 6
    x = data()[0][0][:, :1]
    measured = _model_bytes(q, x)
    assert measured == pytest.approx(cfg.assignment["bytes"])
    assert measured <= budget + 1e-6
    if fraction == 1.0:  # everything fits: each layer at its own best bit width
        best = sum(min(result.delta(layer, kind, b) for b in result.candidates)
                   for layer, kind in result.layers)
        assert cfg.assignment["predicted_delta_loss"] == pytest.approx(best)
    if fraction == 0.0:
        assert set(b for o in cfg.overrides.values() for b in o.values()) == {2}


def test_assign_bits_is_optimal():
    # a synthetic result: brute force over every assignment must not beat the answer
    costs = [LayerCost("a", "weight", 100, 0.0), LayerCost("b", "weight", 40, 0.0),
             LayerCost("c", "membrane", 10, 0.0), LayerCost("d", "weight", 70, 2.0)]
    g = torch.Generator().manual_seed(0)
    entries = []
    for c in costs:
        d = torch.rand(3, generator=g).sort(descending=True).values
        for bits, delta in zip((2, 4, 8), d.tolist()):
            entries.append(SensitivityEntry(c.layer, c.kind, bits, delta, delta, None, None, 0.0))
    res = SensitivityResult(entries, 0.0, None, costs, 5.0, (2, 4, 8), QuantConfig(),
                            layers=[(c.layer, c.kind) for c in costs])
    for budget in (62.0, 80.0, 100.0, 130.0, 250.0):
        cfg = assign_bits(res, budget_bytes=budget)
        best = min(sum(res.delta(c.layer, c.kind, b) for c, b in zip(costs, choice))
                   for choice in itertools.product((2, 4, 8), repeat=4)
                   if sum(c.count * b for c, b in zip(costs, choice)) / 8 + 7.0 <= budget)
        assert cfg.assignment["predicted_delta_loss"] == pytest.approx(best)
        assert cfg.assignment["bytes"] <= budget


def test_assign_bits_refuses_impossible_or_ambiguous_budgets(result):
    with pytest.raises(ValueError, match="smallest configuration"):
        assign_bits(result, budget_bytes=10)
    with pytest.raises(ValueError, match="exactly one"):
        assign_bits(result)
    with pytest.raises(ValueError, match="exactly one"):
        assign_bits(result, budget_bytes=1000, budget_bits=4)
    with pytest.raises(ValueError, match="budget_bits"):
        assign_bits(result, budget_bits=-1)
    with pytest.raises(ValueError, match="candidates"):
        assign_bits(result, budget_bits=4, candidates=(3,))


def test_bad_sensitivity_arguments():
    with pytest.raises(ValueError, match="candidates"):
        sensitivity(mlp(), data(), candidates=(0, 4))
    with pytest.raises(ValueError, match="no batch"):
        sensitivity(mlp(), [])
    with pytest.raises(ValueError, match="calibration"):
        sensitivity(mlp(), data(), calibration="kl")
    with pytest.raises(ValueError, match="num_batches"):
        sensitivity(mlp(), data(), num_batches=-1)
    with pytest.raises(ValueError, match="membranes"):
        sensitivity(mlp(), data(), candidates=(1, 2))


def test_binary_candidate():
    res = sensitivity(mlp(), data(n=1), candidates=(1, 4), membranes=False)
    assert len(res.entries) == 6 and res.costs[0].count == 12 * 24
    cfg = assign_bits(res, budget_bits=1)
    assert all(o == {"weight_bits": 1} for o in cfg.overrides.values())
    q, _ = quantize_model(mlp(), cfg)
    assert q[0].weight_quant.num_bits == 1


def test_membrane_candidates_differ_from_weight_candidates():
    res = sensitivity(mlp(), data(n=1), candidates=(2, 4), membrane_candidates=(4, 8))
    weights = {e.bits for e in res.entries if e.kind == "weight"}
    membranes = {e.bits for e in res.entries if e.kind == "membrane"}
    assert weights == {2, 4} and membranes == {4, 8}
    assert res.candidates_for("membrane") == (4, 8) and res.all_bits == (2, 4, 8)
    text = str(res)
    assert "8-bit dloss" in text and "2-bit dloss" in text
    # the smallest configuration: weights at 2 bits, membranes at 4 (never 2)
    low = assign_bits(res, budget_bytes=res.fixed_bytes + sum(
        c.fixed_bytes + c.count * (2 if c.kind == "weight" else 4) / 8 for c in res.costs))
    for (layer, kind), b in zip(res.layers, low.overrides.values()):
        assert b == ({"weight_bits": 2} if kind == "weight" else {"v_bits": 4})
    with pytest.raises(ValueError, match="smallest configuration.*'membrane': 4"):
        assign_bits(res, budget_bytes=low.assignment["bytes"] - 1)
    # restricting to 4 bits leaves each kind one width; 8 alone leaves the weights none
    only4 = assign_bits(res, budget_bits=32, candidates=(4,))
    assert {b for o in only4.overrides.values() for b in o.values()} == {4}
    with pytest.raises(ValueError, match="each kind"):
        assign_bits(res, budget_bits=32, candidates=(8,))
    fig = res.plot()  # the cells not measured stay empty
    assert len(fig.axes[0].texts) == len(res.entries)
    with pytest.raises(ValueError, match="membrane_candidates"):
        sensitivity(mlp(), data(n=1), candidates=(2, 4), membrane_candidates=(1, 8))
    # binary weight candidates are fine when the membranes have their own
    res1 = sensitivity(mlp(), data(n=1), candidates=(1, 2), membrane_candidates=(8,),
                       num_batches=1)
    assert {e.bits for e in res1.entries if e.kind == "membrane"} == {8}
