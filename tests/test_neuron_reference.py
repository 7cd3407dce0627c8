"""The fused torch neuron (one autograd node) against the plain autograd reference step."""
import itertools

import pytest
import torch
from spikingjelly.activation_based import surrogate

from snnquant.functional.neuron import (quant_neuron_multi_step, quant_neuron_step_reference,
                                        membrane_reset_values)

CONFIGS = list(itertools.product(
    ["if", "lif", "plif"], [True, False], [0.0, -0.25, None], [False, True], ["sigmoid", "atan"]))


def _run_reference(x_seq, v0, step, w, **kw):
    v = v0.expand_as(x_seq[0])
    spikes, vs = [], []
    for t in range(x_seq.shape[0]):
        s, v = quant_neuron_step_reference(x_seq[t], v, step=step, w=w, **kw)
        spikes.append(s)
        vs.append(v)
    return torch.stack(spikes), v, torch.stack(vs)


@pytest.mark.parametrize("learn_step,block", [(True, None), (False, None), (True, 2 * 257),
                                              (False, 257)])
@pytest.mark.parametrize("neuron,decay_input,v_reset,detach_reset,sg", CONFIGS)
def test_fused_torch_matches_reference(neuron, decay_input, v_reset, detach_reset, sg, learn_step,
                                       block, monkeypatch):
    if block is not None:  # backward in blocks of 2 (1) time steps instead of one block
        import snnquant.functional.neuron as fn
        monkeypatch.setattr(fn, "_BLOCK_VALUES", block)
    torch.manual_seed(0)
    T, N = 6, 257
    dtype = torch.float64
    # inputs on a fine grid so the membrane regularly lands on quantisation ties and range limits
    x = (torch.randint(-24, 40, (T, N)).to(dtype) / 16).requires_grad_(True)
    v0 = torch.zeros((), dtype=dtype, requires_grad=True)
    step = torch.tensor(0.125, dtype=dtype, requires_grad=learn_step)
    w = torch.tensor(-0.3, dtype=dtype, requires_grad=True)
    surrogate_function = surrogate.Sigmoid(alpha=3.0) if sg == "sigmoid" else surrogate.ATan(alpha=2.5)
    kw = dict(neuron=neuron, tau=2.0, decay_input=decay_input, v_threshold=1.0, v_reset=v_reset,
              surrogate_function=surrogate_function, detach_reset=detach_reset, qmin=-16, qmax=15,
              step_grad_scale=0.5)
    s_ref, v_ref, vseq_ref = _run_reference(x, v0, step, w, **kw)
    s_f, v_f, vseq_f = quant_neuron_multi_step(x, v0, step=step, w=w, store_v_seq=True, **kw)
    assert torch.equal(s_ref, s_f)
    torch.testing.assert_close(v_ref, v_f, rtol=0, atol=1e-12)
    torch.testing.assert_close(vseq_ref, vseq_f, rtol=0, atol=1e-12)
    assert 0 < s_f.mean() < 1
    gs = torch.randn_like(s_f)
    gv = torch.randn_like(v_f)
    gvs = torch.randn_like(vseq_f)
    inputs = [x, v0] + ([step] if learn_step else []) + ([w] if neuron == "plif" else [])
    g_ref = torch.autograd.grad((s_ref * gs).sum() + (v_ref * gv).sum() + (vseq_ref * gvs).sum(), inputs)
    g_f = torch.autograd.grad((s_f * gs).sum() + (v_f * gv).sum() + (vseq_f * gvs).sum(), inputs)
    for a, b in zip(g_ref, g_f):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    if learn_step:
        assert g_f[2].abs() > 0
    # without autograd (eval), the same values, and nothing kept for backward
    with torch.no_grad():
        s_n, v_n, vseq_n = quant_neuron_multi_step(x, v0, step=step, w=w, store_v_seq=True, **kw)
        s_n2, v_n2, _ = quant_neuron_multi_step(x, v0, step=step, w=w, **kw)
    assert s_n.grad_fn is None
    assert torch.equal(s_n, s_f) and torch.equal(v_n, v_f) and torch.equal(vseq_n, vseq_f)
    assert torch.equal(s_n2, s_f) and torch.equal(v_n2, v_f)


def test_membrane_stays_on_grid_and_in_range():
    torch.manual_seed(1)
    x = torch.rand(20, 1000) * 3 - 1
    step = torch.tensor(0.25)
    for v_reset in (0.0, None):
        _, _, v_seq = quant_neuron_multi_step(x, torch.tensor(0.0), neuron="lif", tau=2.0, v_threshold=1.0,
                                              v_reset=v_reset, step=step, qmin=-8, qmax=7,
                                              store_v_seq=True)
        k = v_seq / step
        assert torch.equal(k, torch.round(k))
        assert k.min() >= -8 and k.max() <= 7


def test_reset_values_on_grid():
    vr, th = membrane_reset_values(torch.tensor(0.3), -8, 7, 1.0, 0.1)
    assert float(vr) == pytest.approx(0.0)
    assert float(th) == pytest.approx(1.2)  # smallest grid value >= 1.0
    vr, _ = membrane_reset_values(torch.tensor(0.25), -8, 7, 1.0, 5.0)
    assert float(vr) == pytest.approx(7 * 0.25)  # clamped to the range


def test_bad_arguments():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="neuron"):
        quant_neuron_multi_step(x, 0.0, neuron="alif", step=0.1, qmin=-2, qmax=1)
    with pytest.raises(ValueError, match="qmin"):
        quant_neuron_multi_step(x, 0.0, neuron="if", step=0.1, qmin=2, qmax=1)
    with pytest.raises(ValueError, match="step"):
        quant_neuron_multi_step(x, 0.0, neuron="if", step=0.0, qmin=-2, qmax=1)
    with pytest.raises(TypeError, match="x_seq"):
        quant_neuron_multi_step(torch.zeros(2, 3, dtype=torch.long), 0.0, neuron="if", step=0.1, qmin=-2, qmax=1)


def test_buffered_charge_fire_reset_equal_the_plain_ones():
    from snnquant.functional.neuron import neuron_charge, neuron_fire, neuron_reset
    torch.manual_seed(2)
    v, x = torch.randn(50), torch.randn(50)
    vr, theta = torch.tensor(-0.25), torch.tensor(1.0)
    k = torch.tensor(0.3)
    for neuron, decay in itertools.product(["if", "lif", "plif"], [True, False]):
        h, tmp = torch.empty(50), torch.empty(50)
        plain = neuron_charge(neuron, v, x, 2.0, k, decay, vr)
        assert torch.equal(neuron_charge(neuron, v, x, 2.0, k, decay, vr, out=(h, tmp)), plain)
    hq = torch.randint(-8, 16, (50,)).float() / 8
    mask = torch.empty(50, dtype=torch.bool)
    spike = neuron_fire(hq, 1.0)
    assert torch.equal(neuron_fire(hq, 1.0, out=mask), spike.bool())
    for v_reset in (-0.25, None):
        plain = neuron_reset(hq, spike, v_reset, vr, theta)
        got = neuron_reset(hq, spike, v_reset, vr, theta, out=torch.empty(50), fired=mask)
        assert torch.equal(got, plain)
    with pytest.raises(ValueError, match="fired"):
        neuron_reset(hq, spike, -0.25, vr, theta, out=torch.empty(50))


def test_neuron_params_are_one_immutable_keyword_object():
    import dataclasses

    from spikingjelly.activation_based import surrogate

    from snnquant.functional.neuron import NeuronParams

    p = NeuronParams(neuron="if", qmin=-8, qmax=7)
    assert isinstance(p.surrogate_function, surrogate.Sigmoid) and p.tau is None
    assert NeuronParams(neuron="lif", tau=3, qmin=-8, qmax=7).tau == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.qmin = 0
    with pytest.raises(TypeError):
        NeuronParams("if", 2.0, True, 1.0, 0.0, None, False, -8, 7)  # keywords only
    with pytest.raises(TypeError, match="unexpected keyword argument 'taux'"):
        quant_neuron_multi_step(torch.zeros(2, 3), 0.0, neuron="lif", taux=2.0, step=0.1,
                                qmin=-2, qmax=1)


@pytest.mark.parametrize("neuron,decay_input", [("if", False), ("lif", True), ("lif", False),
                                                ("plif", True), ("plif", False)])
@pytest.mark.parametrize("vr", [0.0, -0.25])
def test_charge_with_and_without_buffers_is_the_same_arithmetic(neuron, decay_input, vr):
    from snnquant.functional.neuron import neuron_charge

    g = torch.Generator().manual_seed(5)
    v, x = torch.randn(300, generator=g), torch.randn(300, generator=g)
    k = torch.sigmoid(torch.tensor(0.3))
    plain = neuron_charge(neuron, v, x, 3.0, k, decay_input, vr)
    h, tmp = torch.empty_like(v), torch.empty_like(v)
    buffered = neuron_charge(neuron, v, x, 3.0, k, decay_input, vr, out=(h, tmp),
                             vr_zero=vr == 0.0)
    assert buffered is h and torch.equal(plain, buffered)


def test_quantized_threshold_is_the_reset_values_theta():
    from snnquant.functional.neuron import quantized_threshold

    step = torch.tensor(0.024)
    # 0.6 / 0.024 rounds up to 25.000002 in float32: the threshold lands one level higher
    assert quantized_threshold(step, 0.6).item() == pytest.approx(26 * 0.024)
    assert torch.equal(membrane_reset_values(step, -40, 40, 0.6, None)[1],
                       quantized_threshold(step, 0.6))
