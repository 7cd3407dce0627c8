"""Quantizer modules: step-mode contract, learned/observed quantizers, state_dict behaviour."""
import copy
import math

import pytest
import torch
from spikingjelly.activation_based import functional as sjf

import snnquant.functional as QF
from snnquant import nn as qnn


def _all_quantizers():
    return [
        qnn.Round(), qnn.Clamp(-0.5, 0.7), qnn.StepQuantize(0.25), qnn.KBitQuantize(3),
        qnn.AffineKBitQuantize(3, w=2.0, b=-1.0), qnn.ClampByLinear(), qnn.StochasticRound(0.5),
        qnn.QuantizedBits(4, integer=1), qnn.StateQuant(num_bits=4), qnn.UniformQuantizer(4, 0.125),
        qnn.Quantize(QF.clamp_by_linear),
        qnn.LSQQuantizer(4), qnn.LSQQuantizer(4, per_channel=True, channel_dim=1, num_channels=6),
        qnn.MinMaxQuantizer(4), qnn.Quantize(QF.step_quantize, step=0.5),
    ]


@pytest.mark.parametrize("q", _all_quantizers(), ids=lambda q: type(q).__name__)
def test_multi_step_equals_stacked_single_steps(q):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 6) * 2
    q_s, q_m = copy.deepcopy(q), copy.deepcopy(q)
    if isinstance(q, qnn.StochasticRound):
        q_s.eval(), q_m.eval()
    sjf.set_step_mode(q_m, "m")
    assert q_m.step_mode == "m"
    y_m = q_m(x)
    y_s = torch.stack([q_s(x[t]) for t in range(x.shape[0])])
    torch.testing.assert_close(y_m, y_s, rtol=0, atol=0)
    if isinstance(q, (qnn.LSQQuantizer, qnn.MinMaxQuantizer)):
        torch.testing.assert_close(dict(q_m.state_dict()), dict(q_s.state_dict()), rtol=0, atol=0)


def test_multi_step_needs_time_dimension():
    q = qnn.UniformQuantizer(4, 0.125, step_mode="m")
    with pytest.raises(ValueError, match=r"\[T, N, \.\.\.\]"):
        q(torch.randn(7))


def test_clamp_by_linear_per_step_and_per_sequence():
    x = torch.stack([torch.linspace(0, 1, 10), torch.linspace(0, 4, 10)])
    per_step = qnn.ClampByLinear(step_mode="m")(x)
    assert torch.allclose(per_step[1].max(), per_step[0].max())
    per_seq = qnn.ClampByLinear(per_sequence=True, step_mode="m")(x)
    assert per_seq[0].max() < 0.3


def test_stochastic_round_training_is_random_eval_is_nearest():
    q = qnn.StochasticRound(1.0)
    x = torch.full((10000,), 0.25)
    y = q(x)
    assert 0.2 < y.mean() < 0.3 and set(y.unique().tolist()) == {0.0, 1.0}
    q.eval()
    assert torch.equal(q(x), torch.zeros_like(x))


def test_lsq_init_and_grad_scale():
    torch.manual_seed(0)
    x = torch.randn(1000)
    q = qnn.LSQQuantizer(4)
    assert not bool(q.initialized)
    y = q(x)
    expected = 2 * x.abs().mean() / math.sqrt(7)
    torch.testing.assert_close(q.step.detach(), expected)
    assert bool(q.initialized)
    # the step gradient is the LSQ gradient times 1/sqrt(numel * qmax)
    xr = x.clone().requires_grad_(True)
    step = q.step.detach().clone().requires_grad_(True)
    ref = QF.lsq_quantize(xr, step, -8, 7, grad_scale=1 / math.sqrt(1000 * 7))
    ref.sum().backward()
    q.zero_grad()
    q(x).sum().backward()
    torch.testing.assert_close(q.step.grad, step.grad)
    assert torch.equal(y, ref.detach())


def test_lsq_per_channel_init():
    w = torch.randn(4, 10) * torch.tensor([[0.1], [1.0], [3.0], [10.0]])
    q = qnn.LSQQuantizer(8, per_channel=True, num_channels=4)
    q(w)
    torch.testing.assert_close(q.step.detach(), 2 * w.abs().mean(1) / math.sqrt(127))


def test_lsq_power_of_two_step():
    q = qnn.LSQQuantizer(4, power_of_two=True)
    y = q(torch.randn(100))
    s = float(q.effective_step().detach())
    assert math.log2(s) == round(math.log2(s))
    assert torch.equal(y / s, torch.round(y / s))


def test_state_dict_loads_into_fresh_model_and_marks_initialized():
    q = qnn.LSQQuantizer(4)
    q(torch.randn(50) * 3)
    fresh = qnn.LSQQuantizer(4)
    fresh.load_state_dict(q.state_dict())
    assert bool(fresh.initialized)
    x = torch.randn(20)
    assert torch.equal(fresh(x), q(x))  # no re-initialisation from x
    pc = qnn.LSQQuantizer(4, per_channel=True)  # step sized at load time
    src = qnn.LSQQuantizer(4, per_channel=True)
    src(torch.randn(3, 5))
    pc.load_state_dict(src.state_dict())
    assert pc.step.shape == (3,)


def test_state_dict_with_other_bits_names_layer_and_widths():
    lin4 = qnn.QuantLinear(3, 2, weight_quant=4)
    lin8 = qnn.QuantLinear(3, 2, weight_quant=8)
    model4 = torch.nn.Sequential(lin4)
    model8 = torch.nn.Sequential(lin8)
    with pytest.raises(ValueError, match=r"'0.weight_quant'.*4-bit.*8 bits"):
        model8.load_state_dict(model4.state_dict())


def test_minmax_ema_and_frozen_in_eval():
    q = qnn.MinMaxQuantizer(8, momentum=0.5)
    q(torch.tensor([-1.0, 1.0]))
    q(torch.tensor([-3.0, 3.0]))
    assert float(q.min_val) == -2.0 and float(q.max_val) == 2.0
    q.eval()
    y = q(torch.tensor([-10.0, 0.5, 10.0]))
    assert float(q.min_val) == -2.0 and float(q.max_val) == 2.0
    assert float(y.min()) == pytest.approx(-2.0, abs=0.02) and float(y.max()) == pytest.approx(2.0, abs=0.02)
    # a quantizer that never saw data calibrates on its first input even in eval, then freezes
    fresh = qnn.MinMaxQuantizer(8).eval()
    fresh(torch.tensor([-1.0, 1.0]))
    fresh(torch.tensor([-5.0, 5.0]))
    assert float(fresh.min_val) == -1.0 and float(fresh.max_val) == 1.0


def test_buffers_and_params_move_and_save():
    q = qnn.LSQQuantizer(4)
    q(torch.randn(10))
    sd = q.state_dict()
    assert {"step", "initialized", "bit_width"} <= set(sd)
    q64 = copy.deepcopy(q).to(torch.float64)
    assert q64.step.dtype == torch.float64 and q64.bit_width.dtype == torch.int32
    m = qnn.MinMaxQuantizer(4)
    m(torch.randn(10))
    assert {"observer.min_val", "observer.max_val", "observer.initialized",
            "observer.bit_width"} <= set(m.state_dict())


def test_affine_kbit_learns_w_and_b():
    q = qnn.AffineKBitQuantize(2, w=1.0, b=0.0)
    x = torch.rand(10)
    q(x).sum().backward()
    assert q.w.grad is not None and float(q.b.grad) == 10.0


@pytest.mark.parametrize("bad", [0, 33, 2.5, True, "8"])
def test_bad_bits(bad):
    with pytest.raises(ValueError, match="bits"):
        qnn.LSQQuantizer(bad)


def test_bad_arguments_named():
    with pytest.raises(ValueError, match="min_value"):
        qnn.Clamp(1.0, 0.0)
    with pytest.raises(ValueError, match="step"):
        qnn.StepQuantize(0.0)
    with pytest.raises(ValueError, match="momentum"):
        qnn.MinMaxQuantizer(8, momentum=0.0)
    with pytest.raises(TypeError, match="fn"):
        qnn.Quantize(3)


def test_reset_net_and_set_step_mode_reach_quantizers():
    net = torch.nn.Sequential(qnn.QuantLinear(4, 3, weight_quant=4), qnn.QuantLIFNode(v_quant=6))
    sjf.set_step_mode(net, "m")
    assert net[0].weight_quant.step_mode == "m" and net[1].v_quant.step_mode == "m"
    # a quantizer inside a layer keeps single-step meaning for the weight
    y = net(torch.randn(3, 2, 4))
    assert y.shape == (3, 2, 3)
    sjf.reset_net(net)
    assert net[1].v == 0.0


@pytest.mark.parametrize("power_of_two", [False, True])
def test_lsq_step_pushed_below_zero_stays_usable(power_of_two):
    q = qnn.LSQQuantizer(4, per_channel=True, num_channels=3, power_of_two=power_of_two)
    w = torch.randn(3, 8)
    q(w)
    with torch.no_grad():
        q.step[1] = -0.5  # what a large optimizer step can do
    y = q(w)
    assert torch.isfinite(y).all()
    y.sum().backward()
    assert torch.isfinite(q.step.grad).all()


def test_nan_is_ignored_by_statistics_and_stays_nan():
    m = qnn.MinMaxQuantizer(4)
    y = m(torch.tensor([float("nan"), 0.3, 1.0]))
    assert torch.isnan(y[0]) and torch.isfinite(y[1:]).all()
    assert float(m.max_val) == 1.0
    assert torch.isfinite(m(torch.tensor([0.5]))).all()
    q = qnn.LSQQuantizer(4)
    y = q(torch.tensor([float("nan"), 1.0, -1.0]))
    assert torch.isnan(y[0]) and torch.isfinite(q.step).all() and bool(q.initialized)
    q2 = qnn.LSQQuantizer(4)
    q2(torch.full((3,), float("nan")))
    assert not bool(q2.initialized)


def test_bits_mismatch_for_quantized_bits_and_state_quant():
    for a, b in [(qnn.QuantizedBits(8), qnn.QuantizedBits(4)),
                 (qnn.StateQuant(num_bits=8), qnn.StateQuant(num_bits=4))]:
        with pytest.raises(ValueError, match="8-bit.*4 bits"):
            b.load_state_dict(a.state_dict())


def test_quantized_bits_argument_order_matches_function():
    import inspect
    mod = list(inspect.signature(qnn.QuantizedBits).parameters)
    fn = list(inspect.signature(QF.quantized_bits).parameters)[1:]
    assert mod[:len(fn)] == fn


def test_arguments_checked_at_construction():
    with pytest.raises(ValueError):
        qnn.QuantizedBits(4, alpha=-1.0)
    with pytest.raises(ValueError, match="eps"):
        qnn.ClampByLinear(eps=-1.0)
    with pytest.raises(ValueError, match="step"):
        qnn.StepQuantize(float("inf"))
    with pytest.raises(ValueError, match="step"):
        qnn.StochasticRound(-1.0)


def test_layer_quantizers_follow_layer_dtype():
    lin = qnn.QuantLinear(4, 3, weight_quant=4, bias_quant=8, dtype=torch.float64)
    assert lin.weight.dtype == torch.float64 and lin.weight_quant.step.dtype == torch.float64
    y = lin(torch.rand(2, 4, dtype=torch.float64))
    assert y.dtype == torch.float64


@pytest.mark.parametrize("layer_fn,bad", [
    (lambda: qnn.QuantLinear(4, 3, step_mode="m"), torch.randn(4)),
    (lambda: qnn.QuantConv2d(2, 3, 3, step_mode="m"), torch.randn(2, 8, 8)),
    (lambda: qnn.QuantConv1d(2, 3, 3, step_mode="m"), torch.randn(2, 8)),
])
def test_layers_name_the_expected_sequence_shape(layer_fn, bad):
    with pytest.raises(ValueError, match=r"\[T, N, \.\.\.\]"):
        layer_fn()(bad)


def test_minmax_quantizer_holds_its_observer():
    # as in torch.ao.quantization: the fake-quantizer has an observer, it is not one
    q = qnn.MinMaxQuantizer(4, momentum=0.5, include_values=(1.5,))
    assert isinstance(q.observer, qnn.MinMaxObserver) and not isinstance(q, qnn.MinMaxObserver)
    q(torch.tensor([-1.0, 1.0]))
    assert q.min_val is q.observer.min_val and float(q.max_val) == 1.0
    assert float(q.grid().step) == pytest.approx(2.5 / 15)  # the range holds include_values
    assert q.observing and q.sequence_grid() is None  # training: the grid moves with each call
    q.eval()
    assert not q.observing and q.sequence_grid() == q.grid()
    q.include_values = None
    assert q.observer.include_values is None


def test_minmax_loads_a_state_dict_saved_before_the_observer_was_a_child():
    # the keys main wrote at 69830f8 (MinMaxQuantizer was then a subclass of MinMaxObserver)
    old = {"0.weight": torch.zeros(2, 3), "0.bias": torch.zeros(2),
           "0.weight_quant.min_val": torch.tensor(-1.0),
           "0.weight_quant.max_val": torch.tensor(2.0),
           "0.weight_quant.initialized": torch.tensor(True),
           "0.weight_quant.bit_width": torch.tensor(4, dtype=torch.int32),
           "0.weight_quant.quant_config": torch.tensor([3331189203, 4, 1, 0, -1, 0]),
           "0.bias_quant.bit_width": torch.tensor(16, dtype=torch.int32),
           "0.bias_quant.quant_config": torch.tensor([4115247811, 16, 1, 0, -1, 1])}
    net = torch.nn.Sequential(qnn.QuantLinear(3, 2, weight_quant=qnn.MinMaxQuantizer(
        4, symmetric=True)))
    net.load_state_dict(old)  # strict
    q = net[0].weight_quant
    assert q.is_initialized and (float(q.min_val), float(q.max_val)) == (-1.0, 2.0)
    assert float(q.grid().step) == pytest.approx(2.0 / 7)
    # and the bit-width check still applies to the old keys
    net8 = torch.nn.Sequential(qnn.QuantLinear(3, 2, weight_quant=qnn.MinMaxQuantizer(
        8, symmetric=True)))
    old_bits = {k: v for k, v in old.items() if not k.endswith("weight_quant.quant_config")}
    with pytest.raises(ValueError, match=r"4-bit.*8 bits"):
        net8.load_state_dict(old_bits)
    # the new keys round-trip
    fresh = torch.nn.Sequential(qnn.QuantLinear(3, 2, weight_quant=qnn.MinMaxQuantizer(
        4, symmetric=True)))
    fresh.load_state_dict(net.state_dict())
    assert float(fresh[0].weight_quant.max_val) == 2.0
