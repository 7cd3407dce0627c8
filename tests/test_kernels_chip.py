"""The chip neuron kernels (``neuron.cu``'s chip section, built by the cpp backend's ``'chip'``
mode) against the torch steps of :mod:`snnquant.functional.chip_neurons`.

Spikes and states must be equal exactly (they are integers); the gradients of every input (the
synaptic input's weights and counts, the bias, the initial states) within float64 rounding. The
inputs reach the rules that have a branch: Xylo's saturating accumulation (the event-ordered
path), Loihi's wrapped current and clipped voltage, Speck's lower bound, both spike rules.

There is no skip: without a C++ compiler these tests fail, in CI as anywhere.
"""

import os

import pytest
import torch
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import surrogate

from snnquant.functional.bitshift import saturating_accumulate
from snnquant.functional.chip_neurons import speck_synapse
from snnquant.kernels import chip, cpp_backend, cupy_available
from snnquant.kernels.cupy_backend import CUDATensorsRequiredError
from snnquant.targets.loihi import LoihiLIFLayer
from snnquant.targets.speck import SpeckIAFLayer
from snnquant.targets.xylo import XyloLIFLayer

SURROGATES = {"sigmoid": surrogate.Sigmoid(alpha=4.0), "atan": surrogate.ATan(alpha=2.0)}


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    # a fresh cache: the chip library the tests use is built by them
    directory = tmp_path_factory.mktemp("snnquant_chip_cache")
    previous = os.environ.get("SNNQUANT_CACHE_DIR")
    os.environ["SNNQUANT_CACHE_DIR"] = str(directory)
    yield directory
    if previous is None:
        del os.environ["SNNQUANT_CACHE_DIR"]
    else:
        os.environ["SNNQUANT_CACHE_DIR"] = previous


def _leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]


def _both(run, inputs, device="cpu"):
    """``run(backend, *leaves)`` -> (out, states) for the torch backend and the fused one of
    ``device`` (cpp on the CPU, cupy on CUDA), with the gradients of a loss weighting every output
    and final state by fixed random coefficients."""
    results = {}
    for backend in ("torch", "cpp" if device == "cpu" else "cupy"):
        leaves = _leaves(*(None if t is None else t.to(device) for t in inputs))
        out, states = run(backend, *leaves)
        g = torch.Generator().manual_seed(7)
        def weights(t):
            return torch.randn(t.shape, generator=g, dtype=torch.float64).to(device)
        loss = (out * weights(out)).sum()
        for s in states:
            loss = loss + (s * weights(s)).sum()
        loss.backward()
        grads = [None if t is None else t.grad.cpu() for t in leaves]
        results[backend != "torch"] = (out.detach().cpu(), [s.detach().cpu() for s in states],
                                       grads)
    return results[False], results[True]


def _check(reference, fused):
    out_r, states_r, grads_r = reference
    out_f, states_f, grads_f = fused
    assert out_f.dtype == out_r.dtype and out_f.shape == out_r.shape
    assert torch.equal(out_f, out_r), (out_f - out_r).abs().max()
    for a, b in zip(states_f, states_r):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for i, (a, b) in enumerate(zip(grads_f, grads_r)):
        if b is None:
            assert a is None
            continue
        assert a is not None, f"input {i}: no gradient from the kernels"
        scale = max(float(b.abs().max()), 1e-12)
        assert float((a - b).abs().max()) <= 1e-9 * scale, (i, float((a - b).abs().max()), scale)
        assert float(b.abs().max()) > 0, f"input {i}: the reference gradient is zero everywhere"


def _ints(g, shape, lo, hi):
    return torch.randint(lo, hi + 1, shape, generator=g).to(torch.float64)


@pytest.mark.parametrize("surrogate_name", sorted(SURROGATES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("saturating", [True, False], ids=["saturating", "in-range"])
def test_xylo_kernel_equals_the_torch_step(saturating, bias, surrogate_name, device="cpu"):
    g = torch.Generator().manual_seed(1)
    T, N, n_in, n_out = 9, 3, 12, 10
    counts = _ints(g, (T, N, n_in), 0, 15)
    shift = 6 if saturating else 0
    weight = _ints(g, (n_out, n_in), -128, 127) * 2.0 ** shift
    b = _ints(g, (n_out,), -300, 300) if bias else None
    lo, hi = -2 ** 15, 2 ** 15 - 1
    state = (_ints(g, (N, n_out), -2000, 2000), _ints(g, (N, n_out), -500, 500))
    # the event-ordered accumulation differs from the plain sum (or not) at the first step
    plain = state[0] + counts[0] @ weight.t()
    ordered = saturating_accumulate(state[0], counts[0], weight, lo, hi)
    assert bool((ordered != plain).any()) == saturating

    def run(backend, c, w, bb, s0, s1):
        return chip.xylo_lif_multi_step((s0, s1), c, w, bb, threshold=300, dash_syn=2,
                                        dash_mem=3, max_spikes=31,
                                        surrogate_function=SURROGATES[surrogate_name],
                                        backend=backend)
    reference, fused = _both(run, (counts, weight, b, *state), device)
    _check(reference, fused)
    assert float(reference[0].max()) > 1   # multi-spike counts


@pytest.mark.parametrize("surrogate_name", sorted(SURROGATES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("weight_exp", [7, 0, -3])
def test_loihi_kernel_equals_the_torch_step(weight_exp, bias, surrogate_name, device="cpu"):
    g = torch.Generator().manual_seed(2)
    T, N, n_in, n_out = 10, 3, 30, 8
    spikes = (torch.rand((T, N, n_in), generator=g) < 0.5).to(torch.float64)
    weight = 2.0 * _ints(g, (n_out, n_in), -128, 127)
    b = _ints(g, (n_out,), -4096, 4095) if bias else None
    state = (_ints(g, (N, n_out), -10 ** 5, 10 ** 5), _ints(g, (N, n_out), -10 ** 5, 10 ** 5))
    a = spikes @ weight.t() * 2.0 ** weight_exp
    assert bool((64 * a.abs() > 2 ** 23).any()) == (weight_exp == 7)   # the current wraps

    def run(backend, s, w, bb, u0, v0):
        return chip.loihi_lif_multi_step((u0, v0), s, w, bb, vth=40, du=700, dv=300,
                                         weight_exp=weight_exp, bias_exp=2,
                                         surrogate_function=SURROGATES[surrogate_name],
                                         backend=backend)
    reference, fused = _both(run, (spikes, weight, b, *state), device)
    _check(reference, fused)
    assert 0 < float(reference[0].mean()) < 1


@pytest.mark.parametrize("surrogate_name", sorted(SURROGATES))
@pytest.mark.parametrize("spike", ["multi", "single"])
@pytest.mark.parametrize("pool", [1, 2])
def test_speck_kernel_equals_the_torch_step(pool, spike, surrogate_name, device="cpu"):
    g = torch.Generator().manual_seed(3)
    T, N = 8, 2
    x = _ints(g, (T * N, 2, 6, 6), 0, 3)
    weight = _ints(g, (4, 2, 3, 3), -128, 127)
    b = _ints(g, (4,), -20, 20)
    v0 = _ints(g, (N, 4, 6, 6), -100, 100)

    def run(backend, w, bb, v):
        current = speck_synapse(x.to(w.device), w, bb, stride=1, padding=1, linear=False)
        current = current.reshape(T, N, *current.shape[1:])
        out, v_last = chip.speck_iaf_multi_step(v, current, threshold=60, spike=spike,
                                                v_min=-150, pool=pool,
                                                surrogate_function=SURROGATES[surrogate_name],
                                                backend=backend)
        return out, (v_last,)
    reference, fused = _both(run, (weight, b, v0), device)
    _check(reference, fused)
    assert float(reference[0].max()) >= 1
    if spike == "multi" and pool == 1:
        assert float(reference[0].max()) > 1


def test_speck_lower_bound_stops_the_gradient_below_it():
    # a negative current drives every membrane to v_min: the bound is reached and holds
    current = -torch.full((4, 1, 1, 2, 2), 100.0, dtype=torch.float64)
    for backend in ("torch", "cpp"):
        y = current.clone().requires_grad_(True)
        out, v = chip.speck_iaf_multi_step(None, y, threshold=10, spike="multi", v_min=-150,
                                           surrogate_function=SURROGATES["sigmoid"],
                                           backend=backend)
        assert torch.equal(v, torch.full_like(v, -150.0))
        v.sum().backward()
        # the last step is clamped from below (-250 < -150): nothing passes
        assert float(y.grad.abs().sum()) == 0.0, backend


def test_states_carried_over_two_calls_equal_one_call():
    g = torch.Generator().manual_seed(4)
    counts = _ints(g, (10, 2, 8), 0, 15)
    weight = _ints(g, (6, 8), -128, 127) * 8

    def run(backend, w):
        kw = dict(threshold=200, dash_syn=1, dash_mem=2, max_spikes=31,
                  surrogate_function=SURROGATES["sigmoid"], backend=backend)
        first, state = chip.xylo_lif_multi_step(None, counts[:4], w, None, **kw)
        second, state = chip.xylo_lif_multi_step(state, counts[4:], w, None, **kw)
        return torch.cat([first, second]), state

    def whole(backend, w):
        return chip.xylo_lif_multi_step(None, counts, w, None, threshold=200, dash_syn=1,
                                        dash_mem=2, max_spikes=31,
                                        surrogate_function=SURROGATES["sigmoid"],
                                        backend=backend)
    _, split = _both(run, (weight,))
    reference, _ = _both(whole, (weight,))
    _check(reference, split)   # the gradient crosses the call boundary through the states


def _layers():
    return [
        (XyloLIFLayer(12, 9, threshold=30, dash_syn=1, dash_mem=2, bias=True, step_mode="m",
                      weight_step=2 ** -9, weight_shift=2, input_max=15),
         lambda g: torch.randint(0, 16, (7, 3, 12), generator=g).float()),
        (LoihiLIFLayer(12, 9, vth=20, du=900, dv=400, bias=True, bias_exp=3, step_mode="m",
                       weight_step=2 ** -9),
         lambda g: (torch.rand((7, 3, 12), generator=g) < 0.5).float()),
        (SpeckIAFLayer((2, 6, 6), 3, 3, threshold=20, padding=1, pool=2, bias=True,
                       weight_step=2 ** -8, input_max=2, step_mode="m"),
         lambda g: torch.randint(0, 3, (7, 3, 2, 6, 6), generator=g).float()),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["xylo", "loihi", "speck"])
def test_chip_layers_run_the_kernels_by_default_with_the_same_spikes(index, monkeypatch):
    layer, make_input = _layers()[index]
    assert layer.backend == "auto"
    calls = []
    forward = chip._CPP.forward
    monkeypatch.setattr(chip._CPP, "forward", lambda *a: (calls.append(a[0]), forward(*a))[1])
    x = make_input(torch.Generator().manual_seed(5))
    out_auto = layer(x)
    assert calls == [index]
    sjf.reset_net(layer)
    layer.backend = "torch"
    out_torch = layer(x)
    assert len(calls) == 1
    assert torch.equal(out_auto, out_torch) and out_auto.dtype == out_torch.dtype
    # 's' mode steps in torch whatever the backend
    layer.step_mode = "s"
    sjf.reset_net(layer)
    layer.backend = "auto"
    assert torch.equal(torch.stack([layer(x[t]) for t in range(x.shape[0])]), out_torch)


def test_backend_argument_is_checked():
    with pytest.raises(ValueError, match=r"backend must be one of .*'gpu'"):
        XyloLIFLayer(4, 4, threshold=10, backend="gpu")
    with pytest.raises(ValueError, match=r"backend must be one of .*'fast'"):
        chip.speck_iaf_multi_step(None, torch.zeros(2, 1, 1, 2, 2, dtype=torch.float64),
                                  threshold=1, spike="multi", v_min=-1,
                                  surrogate_function=SURROGATES["sigmoid"], backend="fast")


def test_fused_backend_refuses_a_surrogate_it_does_not_implement_and_auto_falls_back():
    other = surrogate.PiecewiseQuadratic()
    spikes = torch.ones(3, 2, 4, dtype=torch.float64)
    weight = torch.full((5, 4), 20.0, dtype=torch.float64)
    kw = dict(vth=1, du=0, dv=0, weight_exp=0, bias_exp=0, surrogate_function=other)
    with pytest.raises(ValueError, match=r"backend='cpp'.*PiecewiseQuadratic"):
        chip.loihi_lif_multi_step(None, spikes, weight, None, backend="cpp", **kw)
    auto = chip.loihi_lif_multi_step(None, spikes, weight, None, backend="auto", **kw)
    torch_ = chip.loihi_lif_multi_step(None, spikes, weight, None, backend="torch", **kw)
    assert torch.equal(auto[0], torch_[0])


def test_cupy_backend_refuses_cpu_tensors():
    with pytest.raises(CUDATensorsRequiredError, match="counts_seq is on cpu"):
        chip.xylo_lif_multi_step(None, torch.zeros(2, 1, 3), torch.zeros(4, 3), None,
                                 threshold=1, dash_syn=1, dash_mem=1, max_spikes=1,
                                 surrogate_function=SURROGATES["sigmoid"], backend="cupy")


def test_state_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"state\[0\] must have the shape \[2, 4\], got \(3, 4\)"):
        chip.loihi_lif_multi_step((torch.zeros(3, 4, dtype=torch.float64),) * 2,
                                  torch.zeros(5, 2, 3), torch.zeros(4, 3), None, vth=1, du=0,
                                  dv=0, weight_exp=0, bias_exp=0,
                                  surrogate_function=SURROGATES["sigmoid"], backend="cpp")


@pytest.mark.parametrize("index", [0, 1, 2], ids=["xylo", "loihi", "speck"])
def test_no_time_steps_give_an_empty_output_on_both_backends(index):
    outs = []
    for backend in ("torch", "cpp"):
        layer, make_input = _layers()[index]
        layer.backend = backend
        x = make_input(torch.Generator().manual_seed(6))[:0]
        outs.append(layer(x))
    assert outs[0].shape == outs[1].shape and outs[0].shape[0] == 0


def test_the_chip_library_is_one_cached_build(private_cache):
    chip._CPP._cache.clear()
    spikes = torch.ones(2, 1, 3, dtype=torch.float64)
    chip.loihi_lif_multi_step(None, spikes, torch.ones(2, 3), None, vth=1, du=0, dv=0,
                              weight_exp=0, bias_exp=0, surrogate_function=SURROGATES["atan"],
                              backend="cpp")
    built = sorted(p.name for p in private_cache.glob("snnquant_neuron_chip_*.so"))
    assert len(built) == 1
    assert built[0] == cpp_backend.library_path(None, directory=private_cache, mode="chip").name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.skipif(not cupy_available(),
                    reason="CuPy is not installed (pip install snnquant[cuda12] or [cuda13])")
def test_cupy_chip_kernels_equal_the_torch_steps_on_cuda():
    test_xylo_kernel_equals_the_torch_step(True, True, "sigmoid", device="cuda")
    test_xylo_kernel_equals_the_torch_step(False, False, "atan", device="cuda")
    test_loihi_kernel_equals_the_torch_step(7, True, "atan", device="cuda")
    test_loihi_kernel_equals_the_torch_step(-3, False, "sigmoid", device="cuda")
    test_speck_kernel_equals_the_torch_step(2, "multi", "sigmoid", device="cuda")
    test_speck_kernel_equals_the_torch_step(1, "single", "atan", device="cuda")


def test_quantize_for_a_chip_passes_the_backend_to_every_layer():
    from spikingjelly.activation_based import layer, neuron
    import torch.nn as nn

    from snnquant.targets import quantize_for_loihi, quantize_for_speck, quantize_for_xylo

    def pairs(v_reset):
        return nn.Sequential(layer.Linear(4, 3, step_mode="m"),
                             neuron.LIFNode(v_reset=v_reset, step_mode="m"),
                             layer.Linear(3, 2, step_mode="m"),
                             neuron.LIFNode(v_reset=v_reset, step_mode="m"))
    speck_net = nn.Sequential(layer.Conv2d(1, 2, 3, bias=False, step_mode="m"),
                              neuron.IFNode(v_reset=None, step_mode="m"))
    nets = [quantize_for_xylo(pairs(None), backend="torch"),
            quantize_for_loihi(pairs(0.0), backend="torch"),
            quantize_for_speck(speck_net, (1, 5, 5), backend="torch")]
    for net in nets:
        assert [m.backend for m in net] == ["torch"] * len(net)
    with pytest.raises(ValueError, match=r"backend must be one of .*'numba'"):
        quantize_for_xylo(pairs(None), backend="numba")


# ---- argument checks, the same for every backend (issue 47, D) ---------------------------------
def _xylo_call(backend, counts=None, weight=None, bias=None, state=None, **kw):
    params = dict(threshold=300, dash_syn=2, dash_mem=3, max_spikes=31, state_bits=16)
    params.update(kw)
    counts = torch.ones(4, 2, 3, dtype=torch.float64) if counts is None else counts
    weight = torch.ones(5, 3, dtype=torch.float64) if weight is None else weight
    return chip.xylo_lif_multi_step(state, counts, weight, bias, **params,
                                    surrogate_function=surrogate.Sigmoid(), backend=backend)


def _loihi_call(backend, spikes=None, weight=None, bias=None, **kw):
    params = dict(vth=40, du=700, dv=300, weight_exp=0, bias_exp=0, state_bits=24)
    params.update(kw)
    spikes = torch.ones(4, 2, 3, dtype=torch.float64) if spikes is None else spikes
    weight = torch.ones(5, 3, dtype=torch.float64) if weight is None else weight
    return chip.loihi_lif_multi_step(None, spikes, weight, bias, **params,
                                     surrogate_function=surrogate.Sigmoid(), backend=backend)


def _speck_call(backend, current=None, **kw):
    params = dict(threshold=3, spike="multi", v_min=-2 ** 15, pool=1)
    params.update(kw)
    current = torch.ones(4, 2, 2, 4, 4, dtype=torch.float64) if current is None else current
    return chip.speck_iaf_multi_step(None, current, **params,
                                     surrogate_function=surrogate.Sigmoid(), backend=backend)


BAD_CALLS = {
    "xylo-short-bias": (_xylo_call, dict(bias=torch.zeros(2, dtype=torch.float64)), "bias"),
    "xylo-bool-counts": (_xylo_call, dict(counts=torch.ones(4, 2, 3, dtype=torch.bool)),
                         "counts_seq"),
    "xylo-float16-weight": (_xylo_call, dict(weight=torch.full((5, 3), -18163.0,
                                                               dtype=torch.float16)), "weight"),
    "xylo-complex-counts": (_xylo_call, dict(counts=torch.ones(4, 2, 3, dtype=torch.complex64)),
                            "counts_seq"),
    "xylo-nan-counts": (_xylo_call, dict(counts=torch.full((4, 2, 3), float("nan"),
                                                           dtype=torch.float64)), "counts_seq"),
    "xylo-inf-weight": (_xylo_call, dict(weight=torch.full((5, 3), float("inf"),
                                                           dtype=torch.float64)), "weight"),
    "xylo-negative-threshold": (_xylo_call, dict(threshold=-5), "threshold"),
    "xylo-nan-max-spikes": (_xylo_call, dict(max_spikes=float("nan")), "max_spikes"),
    "xylo-huge-state-bits": (_xylo_call, dict(state_bits=10 ** 20), "state_bits"),
    "xylo-wrong-in": (_xylo_call, dict(weight=torch.ones(5, 4, dtype=torch.float64)), "weight"),
    "xylo-state-shape": (_xylo_call, dict(state=(torch.zeros(2, 4, dtype=torch.float64),
                                                 torch.zeros(2, 4, dtype=torch.float64))),
                         "state"),
    "loihi-short-bias": (_loihi_call, dict(bias=torch.zeros(1, dtype=torch.float64)), "bias"),
    "loihi-bool-spikes": (_loihi_call, dict(spikes=torch.ones(4, 2, 3, dtype=torch.bool)),
                          "spikes_seq"),
    "loihi-negative-vth": (_loihi_call, dict(vth=-1), "vth"),
    "loihi-du": (_loihi_call, dict(du=5000), "du"),
    "loihi-nan-bias": (_loihi_call, dict(bias=torch.full((5,), float("nan"),
                                                         dtype=torch.float64)), "bias"),
    "speck-pool-0": (_speck_call, dict(pool=0), "pool"),
    "speck-pool-3": (_speck_call, dict(pool=3), "pool"),
    "speck-negative-threshold": (_speck_call, dict(threshold=-1), "threshold"),
    "speck-nan-current": (_speck_call, dict(current=torch.full((4, 2, 2, 4, 4), float("nan"),
                                                               dtype=torch.float64)),
                          "current_seq"),
    "speck-4d-current": (_speck_call, dict(current=torch.ones(4, 2, 4, 4, dtype=torch.float64)),
                         "current_seq"),
    "speck-positive-v-min": (_speck_call, dict(v_min=5), "v_min"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_are_refused_alike_on_every_backend(case):
    """Checked once, before the backend is chosen: the torch loop and the cpp kernels refuse the
    same arguments with the same message naming the argument (also at T = 0)."""
    call, kwargs, name = BAD_CALLS[case]
    messages = []
    for backend in ("torch", "cpp"):
        with pytest.raises((TypeError, ValueError)) as info:
            call(backend, **kwargs)
        messages.append(str(info.value))
        assert name in str(info.value), str(info.value)
    assert messages[0] == messages[1]


def test_speck_pool_0_is_refused_at_zero_steps():
    with pytest.raises(ValueError, match="pool"):
        _speck_call("torch", current=torch.ones(0, 2, 2, 4, 4, dtype=torch.float64), pool=0)
