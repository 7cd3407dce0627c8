"""sensitivity(method='hessian'): Hutchinson's trace estimate and the HAWQ-V2 weight sensitivity
(issue 27 §2)."""
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

import snnquant
from snnquant import assign_bits, quantize_model, sensitivity
from snnquant.sensitivity import hutchinson_trace


def test_hutchinson_is_exact_for_a_diagonal_hessian():
    w = torch.randn(7, requires_grad=True)
    d = torch.arange(1.0, 8.0)
    loss = 0.5 * (d * w * w).sum() + w.sum()
    assert hutchinson_trace(loss, [w], samples=1)[0] == pytest.approx(float(d.sum()), rel=1e-6)


def test_hutchinson_matches_the_trace_of_each_block():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(9, 9, generator=g)
    a = m @ m.T / 9 + torch.eye(9)
    w1 = torch.randn(4, requires_grad=True)
    w2 = torch.randn(5, requires_grad=True)
    w = torch.cat([w1, w2])
    loss = 0.5 * w @ a @ w
    t1, t2 = hutchinson_trace(loss, [w1, w2], samples=3000, generator=g)
    assert t1 == pytest.approx(float(a[:4, :4].trace()), rel=0.05)
    assert t2 == pytest.approx(float(a[4:, 4:].trace()), rel=0.05)
    # the off-diagonal blocks do not count: their trace is not the whole trace
    assert t1 + t2 == pytest.approx(float(a.trace()), rel=0.05)


def test_hutchinson_refuses_bad_arguments():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="samples must be an int >= 1, got 0"):
        hutchinson_trace((w * w).sum(), [w], samples=0)
    with pytest.raises(ValueError, match="tensors"):
        hutchinson_trace((w * w).sum(), [torch.randn(3)])
    with pytest.raises(ValueError, match="scalar"):
        hutchinson_trace(w * w, [w])


class Parallel(nn.Module):
    """``A x + k B x`` with A and B initialised alike: B's Hessian block is k^2 times A's."""

    def __init__(self, k_a=1.0, k_b=1.0):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 4, bias=False)
        self.b = nn.Linear(6, 4, bias=False)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight)
        self.k_a, self.k_b = k_a, k_b

    def forward(self, x):
        return self.k_a * self.a(x) + self.k_b * self.b(x)


def batches(n=2, T=3, N=32, features=6, classes=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(T, N, features, generator=g), torch.randint(0, classes, (N,), generator=g))
            for _ in range(n)]


def exact_traces(model, data):
    """Tr of each weight's Hessian block of the mean loss over ``data``, column by column."""
    traces = {}
    for name in ("a", "b"):
        w = getattr(model, name).weight
        total, count = 0.0, 0
        for x, y in data:
            def loss_of(flat):
                out = torch.func.functional_call(model, {f"{name}.weight": flat.view_as(w)}, (x,))
                return nn.functional.cross_entropy(out.mean(0), y)
            h = torch.autograd.functional.hessian(loss_of, w.detach().flatten())
            total += float(h.trace()) * x.shape[1]
            count += x.shape[1]
        traces[name] = total / count
    return traces


def test_hessian_sensitivity_matches_the_exact_trace():
    model, data = Parallel(1.0, 3.0), batches()
    res = sensitivity(model, data, candidates=(2, 4), membranes=False, method="hessian",
                      hessian_samples=400)
    exact = exact_traces(model, data)
    assert res.hessian_trace["a"] == pytest.approx(exact["a"], rel=0.1)
    assert res.hessian_trace["b"] == pytest.approx(exact["b"], rel=0.1)
    assert exact["b"] == pytest.approx(9 * exact["a"], rel=1e-4)
    # Omega = Tr/n * ||Q(W) - W||^2 / 2, the same quantization error for both (same weights)
    ea, eb = (res.delta(n, "weight", 2) for n in ("a", "b"))
    assert eb / ea == pytest.approx(res.hessian_trace["b"] / res.hessian_trace["a"], rel=1e-6)
    assert res.delta("a", "weight", 2) > res.delta("a", "weight", 4) > 0
    assert "Hessian-trace estimate (HAWQ-V2, 400 Hutchinson samples" in str(res)


@pytest.mark.parametrize("k_a,k_b,more", [(1.0, 3.0, "b"), (3.0, 1.0, "a")])
def test_the_layer_with_more_curvature_gets_more_bits(k_a, k_b, more):
    res = sensitivity(Parallel(k_a, k_b), batches(), candidates=(2, 4), membranes=False,
                      method="hessian", hessian_samples=64)
    # room for one layer at 4 bits and the other at 2
    budget = res.fixed_bytes + sum(c.fixed_bytes for c in res.costs) + 24 * (4 + 2) / 8
    cfg = assign_bits(res, budget_bytes=budget)
    less = "a" if more == "b" else "b"
    assert cfg.assignment["bits"] == {f"{more} (weight)": 4, f"{less} (weight)": 2} or \
        cfg.assignment["bits"] == {f"{less} (weight)": 2, f"{more} (weight)": 4}


def snn(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(
        layer.Linear(12, 24), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
        layer.Linear(24, 3, bias=False),
        neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan(), detach_reset=True))
    with torch.no_grad():
        net[0].weight.mul_(4.0)
        net[2].weight.mul_(4.0)
    sjf.set_step_mode(net, "m")
    return net


def test_hutchinson_through_surrogate_spikes_matches_the_exact_trace():
    # double backward through SpikingJelly's surrogate: the trace of the spiking network's
    # Hessian block from all unit vectors (exact) against Hutchinson's estimate
    net = snn()
    x, y = batches(1, T=4, N=16, features=12, classes=3)[0]
    w = net[2].weight

    def grad():
        sjf.reset_net(net)
        loss = nn.functional.cross_entropy(net(x).mean(0), y)
        return loss, torch.autograd.grad(loss, [w], create_graph=True)[0]

    _, g = grad()
    columns = []
    for i in range(w.numel()):
        e = torch.zeros(w.numel())
        e[i] = 1.0
        columns.append(torch.autograd.grad(g, [w], grad_outputs=[e.view_as(w)],
                                           retain_graph=True)[0].flatten())
    h = torch.stack(columns)
    exact = float(h.trace())
    assert abs(exact) > 1e-3  # the surrogate network has curvature here
    samples = 2000
    # Rademacher: each sample has variance 2 sum_{i != j} H_ij^2; allow 4 standard errors
    offdiag = float((h * h).sum() - (h.diagonal() ** 2).sum())
    tolerance = 4 * (2 * offdiag / samples) ** 0.5
    loss, _ = grad()
    est = hutchinson_trace(loss, [w], samples=samples,
                           generator=torch.Generator().manual_seed(0))[0]
    assert abs(est - exact) <= tolerance, (est, exact, tolerance)
    assert tolerance < abs(exact)  # the check can fail: the error bound is below the trace


def test_the_returned_config_quantizes_and_runs():
    net = snn()
    data = batches(2, T=4, N=16, features=12, classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an untrained network: negative traces may warn
        res = sensitivity(net, data, candidates=(2, 3, 4, 8), membrane_candidates=(4, 8),
                          method="hessian", hessian_samples=8)
    assert res.method == "hessian" and set(res.hessian_trace) == {"0", "2"}
    assert {e.bits for e in res.entries if e.kind == "weight"} == {2, 3, 4, 8}
    weight_entry = next(e for e in res.entries if e.kind == "weight")
    assert weight_entry.accuracy is None  # estimated, not measured
    membrane_entry = next(e for e in res.entries if e.kind == "membrane")
    assert membrane_entry.accuracy is not None  # the membranes are measured
    cfg = assign_bits(res, budget_bits=4)
    q, _ = quantize_model(net, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", snnquant.FiringRateWarning)
        snnquant.calibrate(q, data)
    for key, bits in cfg.assignment["bits"].items():
        name, kind = key.split(" ")
        if kind == "(weight)":
            assert q.get_submodule(name).weight_quant.num_bits == bits
    sjf.reset_net(q)
    assert q(data[0][0]).shape == (4, 16, 3)
    s = snnquant.summary(q, data[0][0][:, :1])
    assert s.total_quant_bytes + s.total_state_quant_bytes <= cfg.assignment["budget_bytes"] + 1e-6


def test_negative_trace_warns_naming_the_layer():
    net = snn()
    data = batches(2, T=4, N=16, features=12, classes=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sensitivity(net, data, candidates=(2, 4), membranes=False, method="hessian",
                          hessian_samples=8)
    negative = [n for n, t in res.hessian_trace.items() if t < 0]
    messages = [str(w.message) for w in caught if "Hessian trace" in str(w.message)]
    assert bool(negative) == bool(messages)
    for n in negative:
        assert f"{n!r}" in messages[0]


def test_method_and_samples_are_checked():
    with pytest.raises(ValueError, match="method must be one of .*'hessian'.*got 'fisher'"):
        sensitivity(snn(), batches(1, features=12, classes=3), method="fisher")
    with pytest.raises(ValueError, match="hessian_samples must be an int >= 1, got 0"):
        sensitivity(snn(), batches(1, features=12, classes=3), method="hessian",
                    hessian_samples=0)
    with pytest.raises(ValueError, match="seed must be an int, got 0.5"):
        sensitivity(snn(), batches(1, features=12, classes=3), method="hessian", seed=0.5)
