"""Integer export: exactness of the integer network against the fake-quantized float model."""
import math

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron
from _dtype_recorder import RecordDtypes
from conftest import csnn

import snnquant.export.backends.simulator as simulator_module
from snnquant import QuantConfig, quantize_model
from snnquant import nn as qnn
from snnquant.export import (ExportError, IntegerSNN, compare_integer, fold_batchnorm,
                             integer_agreement, pack_int, round_half_even_shift, to_integer,
                             unpack_int)


# ------------------------------------------------------------------------------------------------
# helpers

def _neuron(kind, tau, soft, decay_input, step_mode="m", **kw):
    v_reset = None if soft else 0.0
    if kind == "if":
        return neuron.IFNode(v_reset=v_reset, step_mode=step_mode, **kw)
    return neuron.LIFNode(tau=tau, decay_input=decay_input, v_reset=v_reset, step_mode=step_mode, **kw)


def random_net(cfg):
    """A small random network: MLP or conv, with the neuron and pooling choices of ``cfg``."""
    torch.manual_seed(cfg["seed"])
    nrn = lambda: _neuron(cfg["kind"], cfg["tau"], cfg["soft"], cfg["decay_input"])  # noqa: E731
    if cfg["arch"] == "conv":
        pool = {"max": [layer.MaxPool2d(2)], "avg": [layer.AvgPool2d(2)], None: []}[cfg["pool"]]
        side = 3 if cfg["pool"] else 6
        mods = [layer.Conv2d(2, 4, 3, padding=1, bias=cfg["bias"]), nrn(), *pool, layer.Flatten(),
                layer.Linear(4 * side * side, 5, bias=cfg["bias"]), nrn()]
        shape = (2, 6, 6)
    else:
        mods = [layer.Linear(12, 10, bias=cfg["bias"]), nrn(), layer.Linear(10, 5, bias=cfg["bias"]),
                nrn()]
        shape = (12,)
    net = nn.Sequential(*mods)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                m.weight.mul_(cfg["gain"])
                if m.bias is not None:
                    m.bias.mul_(cfg["gain"])
    sjf.set_step_mode(net, "m")
    return net, shape


def quantized(net, cfg, x, train_steps=0):
    q, _ = quantize_model(net, QuantConfig(weight_bits=cfg["weight_bits"],
                                           weight_quantizer=cfg.get("weight_quantizer", "lsq_pow2"),
                                           per_channel=cfg.get("per_channel", False),
                                           v_bits=cfg["v_bits"]))
    if train_steps:
        opt = torch.optim.Adam(q.parameters(), lr=2e-3)
        target = torch.randint(0, 5, (x.shape[1],))
        for _ in range(train_steps):
            sjf.reset_net(q)
            loss = nn.functional.cross_entropy(q(x).mean(0) * 4, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    q.eval()
    sjf.reset_net(q)
    return q


def inputs(shape, T, N, seed, max_count):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, max_count + 1, (T, N) + shape, generator=g).float()


config = st.fixed_dictionaries({
    "seed": st.integers(0, 10_000),
    "arch": st.sampled_from(["mlp", "conv"]),
    "kind": st.sampled_from(["if", "lif"]),
    "tau": st.sampled_from([2.0, 4.0]),
    "soft": st.booleans(),
    "decay_input": st.booleans(),
    "bias": st.booleans(),
    "pool": st.sampled_from([None, "max", "avg"]),
    "weight_bits": st.integers(2, 8),
    "v_bits": st.integers(4, 16),
    "per_channel": st.booleans(),
    "gain": st.sampled_from([1.0, 3.0, 8.0]),
    "T": st.integers(1, 6),
    "N": st.integers(1, 3),
    "max_count": st.sampled_from([1, 3]),
    "train_steps": st.sampled_from([0, 0, 2]),
})


# ------------------------------------------------------------------------------------------------
# the tie rule

@given(st.integers(-(2 ** 40), 2 ** 40), st.integers(0, 12))
@settings(max_examples=300, deadline=None)
def test_round_half_even_shift_matches_torch_round(d, k):
    expected = int(torch.round(torch.tensor(d, dtype=torch.float64) / 2 ** k))
    assert round_half_even_shift(d, k) == expected
    assert int(round_half_even_shift(torch.tensor([d]), k)[0]) == expected


def test_round_half_even_shift_ties_and_errors():
    d = torch.tensor([-6, -5, -3, -1, 1, 3, 5, 6])
    assert round_half_even_shift(d, 1).tolist() == [-3, -2, -2, 0, 0, 2, 2, 3]
    assert round_half_even_shift(d, 0) is d
    with pytest.raises(ValueError, match="k must be"):
        round_half_even_shift(d, -1)
    with pytest.raises(TypeError, match="integer tensor"):
        round_half_even_shift(d.float(), 1)


@pytest.mark.parametrize("bits", [2, 4])
def test_pack_unpack_round_trip(bits):
    v = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (5, 3, 7))
    packed = pack_int(v, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(v.numel() * bits / 8)
    assert torch.equal(unpack_int(packed, bits, v.shape).long(), v)
    with pytest.raises(ValueError, match="lie in"):
        pack_int(torch.tensor([1 << (bits - 1)]), bits)
    with pytest.raises(ValueError, match="bits must be one of"):
        pack_int(v, 3)


# ------------------------------------------------------------------------------------------------
# exactness

@given(config)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_networks_spike_identically(cfg):
    net, shape = random_net(cfg)
    x = inputs(shape, cfg["T"], cfg["N"], cfg["seed"], cfg["max_count"])
    model = fold_batchnorm(quantized(net, cfg, x, cfg["train_steps"]))
    desc = to_integer(model)
    report = compare_integer(model, x, desc)
    assert report.exact, str(report)
    assert all(v == 1.0 for v in report.layers.values())
    assert report.samples == report.predictions == report.output == 1.0
    # the comparison covers every neuron layer
    assert list(report.layers) == [n for n in desc.neuron_names]


def _tie_network(rounding_steps=4):
    """LIF tau=2 whose weights lie on the membrane grid: (x - v) / 2 is a tie half the time."""
    torch.manual_seed(1)
    step = 2.0 ** -2
    lin = qnn.QuantLinear(16, 8, bias=False, step_mode="m",
                          weight_quant=qnn.UniformQuantizer(4, step=step))
    lif = qnn.QuantLIFNode(tau=2.0, v_quant=qnn.UniformQuantizer(6, step=step), step_mode="m")
    with torch.no_grad():
        lin.weight.uniform_(-1.5, 1.5)
    net = nn.Sequential(lin, lif).eval()
    x = inputs((16,), 12, 6, 3, 1)
    return net, x


def test_ties_follow_torch_round(monkeypatch):
    net, x = _tie_network()
    desc = to_integer(net)
    assert desc.layer("1").grid_shift == 0 and desc.layer("1").leak_shift == 1
    assert compare_integer(net, x, desc).exact
    # the same network with round-half-up (a common hardware choice) disagrees: ties do occur
    half_up = lambda d, k: (d + (1 << (k - 1))) >> k if k else d  # noqa: E731
    monkeypatch.setattr(simulator_module, "round_half_even_shift", half_up)
    assert not compare_integer(net, x, desc).exact


def test_simulator_uses_integer_ops_only():
    cfg = dict(seed=2, arch="conv", kind="lif", tau=2.0, soft=False, decay_input=True, bias=True,
               pool="avg", weight_bits=4, v_bits=8, gain=3.0)
    net, shape = random_net(cfg)
    x = inputs(shape, 4, 2, 0, 3)
    desc = to_integer(fold_batchnorm(quantized(net, cfg, x)))
    sim = IntegerSNN(desc)
    x_int = x.to(torch.int64)

    with RecordDtypes() as rec:
        out, layers = sim(x_int, record=True)
    assert len(rec.dtypes) > 20
    bad = [(f, d) for f, d in rec.dtypes if d.is_floating_point or d.is_complex]
    assert not bad, bad
    assert any("convolution" in f for f, _ in rec.dtypes)
    assert out.dtype == torch.int8 and set(layers) == {"1", "5"}


def test_int32_where_the_bounds_allow_gives_the_int64_results(monkeypatch):
    """IntegerSNN runs in int16/int32 where the proven bounds stay below 2^15/2^31 (int16: the
    synapses' accumulation only) and in int64 elsewhere; forcing int64 everywhere changes no
    spike."""
    cfg = dict(seed=2, arch="conv", kind="lif", tau=2.0, soft=True, decay_input=False, bias=True,
               pool="avg", weight_bits=4, v_bits=8, gain=3.0)
    net, shape = random_net(cfg)
    x = inputs(shape, 5, 3, 1, 3)
    desc = to_integer(fold_batchnorm(quantized(net, cfg, x)))
    x_int = x.to(torch.int64)
    with RecordDtypes() as rec:
        out, layers = IntegerSNN(desc)(x_int, record=True)
    assert any("convolution" in f and d in (torch.int16, torch.int32) for f, d in rec.dtypes)
    monkeypatch.setattr(simulator_module, "_dtype_for", lambda magnitude, narrowest=None:
                        torch.int64)
    with RecordDtypes() as rec:
        out64, layers64 = IntegerSNN(desc)(x_int, record=True)
    assert not any(d in (torch.int16, torch.int32) for _, d in rec.dtypes)
    assert torch.equal(out, out64)
    assert all(torch.equal(layers[k], layers64[k]) for k in layers)
    assert out.dtype == torch.int8 and any(int(s.sum()) for s in layers.values())


def test_trained_nmnist_style_network():
    """conv-BN-LIF-maxpool blocks + linear + LIF (the N-MNIST example's shape), trained briefly."""
    torch.manual_seed(0)
    net = csnn(8)
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    x = inputs((2, 16, 16), 6, 8, 5, 4)
    y = torch.randint(0, 10, (8,))
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    for _ in range(5):
        sjf.reset_net(q)
        loss = nn.functional.cross_entropy(q(x).mean(0) * 10, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    q.eval()
    with pytest.raises(ExportError, match=r"layer '1' \(\w*BatchNorm2d\).*fold_batchnorm"):
        to_integer(q)
    folded = fold_batchnorm(q)
    assert isinstance(folded[1], nn.Identity) and folded[0].bias is not None
    assert float(folded[0].bias_quant.step) == min(float(folded[0].weight_quant.effective_step().detach()),
                                                   float(folded[2].v_quant.step))
    assert folded[9].bias_quant is not None  # the unquantized linear bias was snapped to the grid
    desc = to_integer(folded)
    report = compare_integer(folded, x, desc)
    assert report.exact, str(report)
    sim_out, layers = IntegerSNN(desc)(x.long(), record=True)
    assert 0 < float(layers["2"].float().mean()) < 1  # the network does spike
    assert integer_agreement(folded, x) == 1.0
    w = desc.layer("0")
    assert w.weight.dtype == torch.int8 and w.weight_packed is not None
    assert bool((w.multiplier == 1).all())


def test_fold_batchnorm_preserves_float_output():
    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(2, 4, 3, bias=True), layer.BatchNorm2d(4),
                        layer.Flatten(), layer.Linear(4 * 4 * 4, 3, bias=False), layer.BatchNorm1d(3))
    sjf.set_step_mode(net, "m")
    for bn in (net[1], net[4]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(0.5, 2)
        bn.bias.data.uniform_(-1, 1)
    net.eval()
    x = torch.rand(3, 2, 2, 6, 6)
    folded = fold_batchnorm(net)
    assert isinstance(folded[1], nn.Identity) and isinstance(folded[4], nn.Identity)
    torch.testing.assert_close(folded(x), net(x), rtol=1e-5, atol=1e-5)
    assert isinstance(net[1], layer.BatchNorm2d)  # not modified


def test_fold_batchnorm_refusals():
    bad = nn.Sequential(layer.Conv2d(2, 4, 3), layer.MaxPool2d(2), layer.BatchNorm2d(4))
    with pytest.raises(ExportError, match=r"layer '2'.*directly follows"):
        fold_batchnorm(bad)
    no_stats = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False))
    with pytest.raises(ExportError, match="batch statistics"):
        fold_batchnorm(no_stats)
    with pytest.raises(ValueError, match="bias_bits"):
        fold_batchnorm(nn.Sequential(nn.Linear(3, 4)), bias_bits=1)


def test_float64_reference_makes_plain_lsq_exact():
    cfg = dict(seed=4, arch="conv", kind="lif", tau=2.0, soft=False, decay_input=True, bias=True,
               pool="max", weight_bits=4, v_bits=8, gain=3.0, weight_quantizer="lsq")
    net, shape = random_net(cfg)
    x = inputs(shape, 5, 3, 1, 2)
    model = fold_batchnorm(quantized(net, cfg, x, train_steps=2))
    with pytest.raises(ExportError, match=r"layer '0'.*not a power of two.*lsq_pow2.*float64"):
        to_integer(model)
    desc = to_integer(model, reference_dtype=torch.float64)
    assert desc.reference_dtype == "float64" and bool((desc.layer("0").multiplier > 1).any())
    assert compare_integer(model, x, desc).exact


@pytest.mark.parametrize("weight_quantizer", ["quantized_bits", "minmax"])
def test_other_weight_quantizers(weight_quantizer):
    cfg = dict(seed=4, arch="conv", kind="lif", tau=2.0, soft=False, decay_input=True, bias=True,
               pool="max", weight_bits=4, v_bits=8, gain=0.5, weight_quantizer=weight_quantizer)
    net, shape = random_net(cfg)
    x = inputs(shape, 5, 3, 1, 2)
    model = quantized(net, cfg, x)
    if weight_quantizer == "minmax":  # observe a range first
        model.train()
        model(x)
        model.eval()
        sjf.reset_net(model)
    model = fold_batchnorm(model)
    if weight_quantizer == "quantized_bits":  # fixed power-of-two grid: exact
        assert compare_integer(model, x, to_integer(model)).exact
    else:
        with pytest.raises(ExportError, match=r"layer '0'.*not a power of two.*lsq_pow2"):
            to_integer(model)
        with pytest.raises(ExportError, match=r"layer '0'.*rounded even in float64"):
            to_integer(model, reference_dtype=torch.float64)


def test_single_step_model_and_containers():
    torch.manual_seed(3)
    single = nn.Sequential(nn.Linear(6, 5), neuron.LIFNode(tau=4.0), nn.Linear(5, 3),
                           neuron.IFNode(v_reset=None))
    q, _ = quantize_model(single, QuantConfig(weight_bits=6, weight_quantizer="lsq_pow2", v_bits=10))
    q = fold_batchnorm(q).eval()
    x = inputs((6,), 7, 4, 2, 2)
    assert compare_integer(q, x).exact
    nested = nn.Sequential(
        layer.SeqToANNContainer(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3)),
        neuron.IFNode(step_mode="m"),
        nn.Sequential(layer.SeqToANNContainer(nn.MaxPool2d(2), nn.Flatten()),
                      layer.Linear(3 * 2 * 2, 4, step_mode="m")),
        neuron.LIFNode(step_mode="m", v_reset=None))
    q, _ = quantize_model(nested, QuantConfig(weight_bits=5, weight_quantizer="lsq_pow2", v_bits=7))
    q = fold_batchnorm(q).eval()
    desc = to_integer(q)
    assert desc.neuron_names == ["1", "3"]
    assert [type(op).__name__ for op in desc.ops] == ["SynapseOp", "NeuronOp", "PoolOp",
                                                      "FlattenOp", "SynapseOp", "NeuronOp"]
    assert compare_integer(q, inputs((2, 4, 4), 5, 3, 4, 3), desc).exact


def test_parametric_lif_with_power_of_two_tau():
    lin = qnn.QuantLinear(8, 4, step_mode="m", bias=False,
                          weight_quant=qnn.LSQQuantizer(5, power_of_two=True))
    plif = qnn.QuantParametricLIFNode(init_tau=2.0, v_quant=8, step_mode="m")
    net = nn.Sequential(lin, plif).eval()
    x = inputs((8,), 6, 4, 0, 2)
    desc = to_integer(net)
    assert desc.layer("1").kind == "lif" and desc.layer("1").leak_shift == 1
    assert compare_integer(net, x, desc).exact
    with torch.no_grad():
        plif.w.fill_(0.3)
    with pytest.raises(ExportError, match=r"layer '1'.*learned tau.*not a power of two"):
        to_integer(net)


def test_current_output_readout():
    torch.manual_seed(5)
    net = nn.Sequential(layer.Linear(6, 5), neuron.IFNode(), layer.Linear(5, 3))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    q = fold_batchnorm(q).eval()
    desc = to_integer(q)
    assert desc.output_kind == "current"
    x = inputs((6,), 4, 3, 1, 3)
    assert compare_integer(q, x, desc).exact


# ------------------------------------------------------------------------------------------------
# refusals and argument checks

def _mlp(**cfg_kw):
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(6, 4, bias=False), neuron.LIFNode(), layer.Linear(4, 2, bias=False),
                        neuron.LIFNode())
    sjf.set_step_mode(net, "m")
    kw = dict(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8)
    kw.update(cfg_kw)
    q, _ = quantize_model(net, QuantConfig(**kw))
    return q.eval()


def test_refuses_unquantized_layer_by_name():
    with pytest.raises(ExportError, match=r"layer '2' \(Linear\): unquantized synaptic layer"):
        to_integer(_mlp(skip=["2"]))


def test_refuses_unquantized_neuron():
    with pytest.raises(ExportError, match=r"layer '1' \(LIFNode\): unquantized neuron"):
        to_integer(_mlp(overrides={"1": {"v_bits": None}}))


def test_refuses_state_quant_membrane():
    with pytest.raises(ExportError, match=r"layer '1'.*StateQuant has no uniform grid"):
        to_integer(_mlp(membrane_quantizer="threshold_centered"))


def test_refuses_lsq_membrane_uninitialised_and_non_power_of_two():
    q = _mlp(membrane_quantizer="lsq")
    with pytest.raises(ExportError, match=r"layer '1'.*never initialised"):
        to_integer(q)
    q(inputs((6,), 3, 2, 0, 1))
    with pytest.raises(ExportError, match=r"layer '1'.*membrane step .* not a power of two"):
        to_integer(q)


def test_refuses_tau_not_power_of_two():
    q = _mlp()
    q[3].tau = 3.0
    with pytest.raises(ExportError, match=r"layer '3'.*tau = 3.0 is not a power of two"):
        to_integer(q)


def test_refuses_unknown_module_and_bad_structure():
    q = _mlp()
    q.insert(2, nn.ReLU())
    with pytest.raises(ExportError, match=r"layer '2' \(ReLU\): module type not supported"):
        to_integer(q)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(x)

    # a custom block is traced (torch.fx): its unquantized layer is named inside it
    with pytest.raises(ExportError, match=r"layer '0\.fc' \(Linear\): unquantized synaptic"):
        to_integer(nn.Sequential(Block()))

    class Wrapper(nn.Module):  # SpikingJelly examples' style: forward() calls self.conv_fc
        def __init__(self, body):
            super().__init__()
            self.conv_fc = body

        def forward(self, x):
            return self.conv_fc(x)

    wrapped = to_integer(Wrapper(_mlp()))
    assert str(wrapped).replace("conv_fc.", "") == str(to_integer(Wrapper(_mlp()).conv_fc))
    assert len(to_integer(Wrapper(_mlp()).conv_fc).ops) == 4

    class Untraceable(Wrapper):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                return self.conv_fc(x)
            return x

    with pytest.raises(ExportError, match=r"torch.fx cannot trace the forward\(\) of the model "
                                          r"\(Untraceable\) at tests/test_export.py:\d+ .*"
                                          r"pass example_input.*or export a part of it that has "
                                          r"synaptic layers and neurons, e\.g\. model\.conv_fc"):
        to_integer(Untraceable(_mlp()))

    class Plain(nn.Sequential):  # a Sequential subclass that keeps Sequential.forward
        pass

    assert to_integer(Plain(*_mlp())).neuron_names == ["1", "3"]
    with pytest.raises(ExportError, match="a neuron layer reads the network input directly; put a synaptic layer before it"):
        to_integer(nn.Sequential(qnn.QuantIFNode(v_quant=8)))


def test_refuses_non_power_of_two_average_pool_and_float_bias():
    net = nn.Sequential(layer.Conv2d(2, 3, 3, bias=False), neuron.IFNode(), layer.AvgPool2d(3))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    with pytest.raises(ExportError, match=r"layer '2'.*divides by 9"):
        to_integer(q)
    q2 = _mlp()
    q2[0].bias = nn.Parameter(torch.tensor([0.1, -0.3, 0.7, 0.0123]))
    with pytest.raises(ExportError, match=r"layer '0'.*bias.*not quantized"):
        to_integer(q2)
    assert to_integer(fold_batchnorm(q2)).layer("0").bias is not None


def test_input_bound_and_simulator_input_checks():
    q = _mlp()
    desc = to_integer(q)
    assert desc.input_max >= 1000
    small = to_integer(q, input_max=3)
    sim = IntegerSNN(small)
    with pytest.raises(ValueError, match="above input_max=3"):
        sim(torch.full((2, 1, 6), 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="integer or bool tensor"):
        sim(torch.zeros(2, 1, 6))
    with pytest.raises(ValueError, match=r"shape \[T, N, \.\.\.\]"):
        sim(torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ExportError, match="input_max=.* is too large"):
        to_integer(q, input_max=1 << 30)
    with pytest.raises(ValueError, match="reference_dtype"):
        to_integer(q, reference_dtype=torch.float16)
    with pytest.raises(ValueError, match="integer values"):
        compare_integer(q, torch.full((2, 1, 6), 0.5))
    assert sim(torch.ones(2, 1, 6, dtype=torch.bool)).shape == (2, 1, 2)
