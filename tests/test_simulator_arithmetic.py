"""IntegerSNN's synapse arithmetic: float32 where the proven bound makes it exact ('auto'),
identical results to integer tensors only ('integer'), and the integer path wherever the bound or
PyTorch's float32 settings do not prove float32 exact."""
import dataclasses

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer
from _dtype_recorder import RecordDtypes

import snnquant.export.backends.simulator as simulator_module
from snnquant import QuantConfig, quantize_model
from snnquant.export.backends import compiled_neuron
from snnquant.export import (FlattenOp, IntegerSNN, JoinOp, NeuronOp, fold_batchnorm,
                             round_half_even_shift, to_integer)
from snnquant.export.ir.program import neuron_program
from snnquant.export.backends.simulator import float32_sums_are_exact
from test_export import inputs, quantized, random_net
from test_export_graph import _deployable
from test_export_leak import grid_net
from snnquant.kernels import cpp_backend


def _run(desc, x, arithmetic):
    with RecordDtypes() as rec:
        out, layers = IntegerSNN(desc, synapse_arithmetic=arithmetic)(x, record=True)
    return out, layers, rec.dtypes


def _float_synapses(dtypes):
    return [f for f, d in dtypes if d == torch.float32 and ("convolution" in f or "mm" in f)]


def assert_auto_equals_integer(desc, x, float_expected=True):
    """'auto' and 'integer' give identical outputs and spikes; 'integer' computes no float."""
    out, layers, dtypes = _run(desc, x, "auto")
    ref, ref_layers, ref_dtypes = _run(desc, x, "integer")
    assert not [(f, d) for f, d in ref_dtypes if d.is_floating_point]
    assert bool(_float_synapses(dtypes)) == float_expected
    assert out.dtype == ref.dtype and torch.equal(out, ref)
    assert set(layers) == set(ref_layers)
    assert all(torch.equal(layers[k], ref_layers[k]) for k in layers)
    return out, layers


CONFIGS = [
    dict(seed=2, arch="conv", kind="lif", tau=2.0, soft=False, decay_input=True, bias=True,
         pool="avg", weight_bits=4, v_bits=8, gain=3.0),
    dict(seed=5, arch="conv", kind="if", tau=2.0, soft=True, decay_input=False, bias=True,
         pool="max", weight_bits=8, v_bits=16, gain=8.0),
    dict(seed=9, arch="mlp", kind="lif", tau=4.0, soft=True, decay_input=False, bias=False,
         pool=None, weight_bits=6, v_bits=12, gain=8.0, per_channel=True),
    dict(seed=11, arch="conv", kind="lif", tau=4.0, soft=False, decay_input=True, bias=True,
         pool=None, weight_bits=2, v_bits=4, gain=1.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['arch']}-{c['kind']}-{c['pool']}")
def test_auto_equals_integer_on_random_mixed_sign_networks(cfg):
    net, shape = random_net(cfg)
    x = inputs(shape, 5, 3, cfg["seed"], 3)
    desc = to_integer(fold_batchnorm(quantized(net, cfg, x, train_steps=2)))
    weights = torch.cat([op.weight.flatten() for op in desc.ops if hasattr(op, "weight")])
    assert int(weights.min()) < 0 < int(weights.max())
    _, layers = assert_auto_equals_integer(desc, x.to(torch.int64))
    assert any(int(s.sum()) for s in layers.values())


@pytest.mark.parametrize("weights", ["binary", "ternary"])
def test_auto_equals_integer_with_binary_and_ternary_weights(weights):
    cfg = dict(seed=7, arch="conv", kind="lif", tau=2.0, soft=False, decay_input=True, bias=True,
               pool="max", gain=3.0)
    net, shape = random_net(cfg)
    config = (QuantConfig(weight_bits=1, v_bits=8, bias_bits=8) if weights == "binary" else
              QuantConfig(weight_quantizer="ternary", weight_bits=2, v_bits=8, bias_bits=8))
    q, _ = quantize_model(net, config)
    x = inputs(shape, 4, 4, 7, 2)
    with torch.no_grad():
        q(x)
    sjf.reset_net(q.eval())
    desc = to_integer(fold_batchnorm(q))
    assert_auto_equals_integer(desc, x.to(torch.int64))


def test_auto_equals_integer_with_a_leak_multiplier():
    desc = to_integer(grid_net(weight_step=2.0 ** -4), leak_bits=12)
    assert any(isinstance(op, NeuronOp) and op.leak_multiplier != 1 for op in desc.ops)
    assert_auto_equals_integer(desc, inputs((16,), 6, 3, 0, 1).to(torch.int64))


@pytest.mark.parametrize("name", ["sew_resnet_IAND", "spiking_resnet18", "NMNISTNet"])
def test_auto_equals_integer_on_residual_and_zoo_graphs(name):
    model, x, shape = _deployable(name)
    desc = to_integer(model, input_shape=shape)
    assert_auto_equals_integer(desc, x.to(torch.int64))


def _current_net(in_channels, weight_bits, input_max):
    """One convolution whose integer current is the network output."""
    torch.manual_seed(4)
    net = nn.Sequential(layer.Conv2d(in_channels, 6, 3, padding=1, bias=True))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=weight_bits, v_bits=8, bias_bits=8))
    x = torch.randn(2, 4, in_channels, 5, 5)
    with torch.no_grad():
        q(x)
    desc = to_integer(fold_batchnorm(q.eval()), input_max=input_max)
    assert desc.output_kind == "current"
    return desc


def _extreme_inputs(desc, shape, seed):
    """Inputs of +-input_max, random signs, except one receptive field of output channel ``c``
    (the one whose bound is the widest) whose signs follow that channel's weights: that current
    reaches :math:`\\lVert w_c \\rVert_1 x_{max} f_c + b_c`."""
    op = desc.ops[0]
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, 2, (3, 17) + shape, generator=g) * 2 - 1) * desc.input_max
    w = op.weight.to(torch.int64)
    factor = torch.tensor([int(m) << int(s) for m, s in zip(op.multiplier.tolist(),
                                                            op.shift.tolist())])
    c = int((w.abs().reshape(w.shape[0], -1).sum(1) * factor).argmax())
    x[0, 0, :, 1:4, 1:4] = w[c].sign() * desc.input_max
    return x


def test_float32_is_exact_up_to_the_bound_and_integer_above_it():
    # 8-bit weights over 16 x 3 x 3 inputs: the bound l1 * input_max (times the rescale factor,
    # plus the bias) is just below 2^24 for the first input_max and above it for the second
    desc = _current_net(16, 8, 1)
    op = desc.ops[0]
    l1 = op.weight.to(torch.int64).abs().reshape(op.weight.shape[0], -1).sum(1).tolist()
    factor = [int(m) << int(s) for m, s in zip(op.multiplier.tolist(), op.shift.tolist())]
    widest = max(a * f for a, f in zip(l1, factor))
    below = ((1 << 24) - 1 - int(op.bias.abs().max())) // widest
    below = (1 << (below.bit_length() - 1)) - 1    # a call's bound is rounded up to 2^b - 1
    assert below > 100
    for input_max, float_expected in ((below, True), (1 << 24, False)):
        wide = dataclasses.replace(desc, input_max=input_max)
        out, _ = assert_auto_equals_integer(wide, _extreme_inputs(wide, (16, 5, 5), 0),
                                            float_expected)
        assert int(out.abs().max()) >= (1 << 22 if float_expected else 1 << 24)


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_float32_is_refused_where_pytorch_may_round(monkeypatch):
    desc = _current_net(4, 8, 3)
    x = _extreme_inputs(desc, (4, 5, 5), 1)
    assert float32_sums_are_exact()
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert not float32_sums_are_exact()
        assert_auto_equals_integer(desc, x, float_expected=False)
    finally:
        torch.set_float32_matmul_precision(previous)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not float32_sums_are_exact()
        assert_auto_equals_integer(desc, x, float_expected=False)
    assert float32_sums_are_exact()     # the settings are back
    monkeypatch.setenv("ONEDNN_DEFAULT_FPMATH_MODE", "BF16")
    assert not float32_sums_are_exact()
    assert_auto_equals_integer(desc, x, float_expected=False)


def test_synapse_arithmetic_is_checked():
    desc = _current_net(4, 8, 3)
    with pytest.raises(ValueError, match="synapse_arithmetic.*'float'"):
        IntegerSNN(desc, synapse_arithmetic="float")


def test_neuron_step_in_place_equals_the_allocating_step():
    cfg = dict(seed=3, arch="mlp", kind="lif", tau=4.0, soft=False, decay_input=False, bias=True,
               pool=None, weight_bits=4, v_bits=8, gain=3.0)
    net, shape = random_net(cfg)
    desc = to_integer(fold_batchnorm(quantized(net, cfg, inputs(shape, 2, 2, 0, 1))))
    program = neuron_program(desc.ops[1])
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.int16, torch.int32, torch.int64):
        v = torch.randint(-128, 128, (64,), generator=g).to(dtype)
        xin = torch.randint(-300, 300, (64,), generator=g).to(dtype)
        expected = program.run(v, xin)
        buffers = {i.dst: torch.empty_like(v) for i in program.instrs}
        got = program.run(v, xin, buffers=buffers)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert got[0] is buffers["v_next"] and got[0].dtype == dtype


@pytest.mark.parametrize("k", [0, 1, 3, 7])
def test_round_half_even_shift_into_out(k):
    d = torch.arange(-300, 300, dtype=torch.int32)
    out = torch.empty_like(d)
    assert round_half_even_shift(d, k, out=out) is out
    assert torch.equal(out, round_half_even_shift(d, k))


# ------------------------------------------------------------------------------------------------
# the compiled neuron loop

needs_compiler = pytest.mark.skipif(cpp_backend.cpp_compiler() is None,
                                    reason="no C++ compiler for the compiled neuron loop")


def _networks():
    for cfg in CONFIGS:
        net, shape = random_net(cfg)
        x = inputs(shape, 5, 3, cfg["seed"], 3)
        yield to_integer(fold_batchnorm(quantized(net, cfg, x, train_steps=2))), x.to(torch.int64)
    yield (to_integer(grid_net(weight_step=2.0 ** -4), leak_bits=12),
           inputs((16,), 6, 3, 0, 1).to(torch.int64))
    model, x, shape = _deployable("sew_resnet_IAND")
    yield to_integer(model, input_shape=shape), x.to(torch.int64)


@needs_compiler
@pytest.mark.parametrize("arithmetic", ["auto", "integer"])
def test_compiled_neuron_loop_equals_the_torch_step(monkeypatch, arithmetic):
    calls = []
    kernel = compiled_neuron.neuron_kernel

    def counted(program, *dtypes):
        calls.append(dtypes)
        return kernel(program, *dtypes)

    monkeypatch.setattr(compiled_neuron, "neuron_kernel", counted)
    for desc, x in _networks():
        monkeypatch.setattr(simulator_module, "_COMPILED_MIN_STEPS", 1 << 62)
        ref, ref_layers = IntegerSNN(desc, synapse_arithmetic=arithmetic)(x, record=True)
        assert not calls
        monkeypatch.setattr(simulator_module, "_COMPILED_MIN_STEPS", 0)
        out, layers = IntegerSNN(desc, synapse_arithmetic=arithmetic)(x, record=True)
        assert len(calls) == sum(isinstance(op, NeuronOp) for op in desc.ops)
        calls.clear()
        assert torch.equal(out, ref) and out.dtype == ref.dtype
        assert all(torch.equal(layers[k], ref_layers[k]) for k in ref_layers)
        assert any(int(s.sum()) for s in layers.values())


@needs_compiler
def test_compiled_neuron_loop_falls_back_to_torch(monkeypatch, tmp_path):
    desc = to_integer(grid_net(weight_step=2.0 ** -4), leak_bits=12)
    x = inputs((16,), 6, 3, 0, 1).to(torch.int64)
    ref = IntegerSNN(desc)(x)
    monkeypatch.setattr(simulator_module, "_COMPILED_MIN_STEPS", 0)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert compiled_neuron.neuron_kernel(neuron_program(desc.ops[1]), torch.int32) is None
    assert torch.equal(IntegerSNN(desc)(x), ref)
    failing = tmp_path / "failing-compiler"
    failing.write_text("#!/bin/sh\necho 'no such flag' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CXX", str(failing))
    with pytest.warns(RuntimeWarning, match="steps this neuron layer in torch.*did not compile"):
        assert torch.equal(IntegerSNN(desc)(x), ref)


@needs_compiler
def test_compiled_neuron_loop_is_the_same_on_several_threads():
    desc, x = next(_networks())
    program = neuron_program(next(op for op in desc.ops if isinstance(op, NeuronOp)))
    g = torch.Generator().manual_seed(0)
    currents = torch.randint(-2000, 2000, (6, 3 * compiled_neuron.BLOCK + 5), generator=g)
    kernel = compiled_neuron.neuron_kernel(program, torch.int64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(currents)
        torch.set_num_threads(3)
        assert torch.equal(kernel(currents), one)
    finally:
        torch.set_num_threads(threads)
    v = torch.full((currents.shape[1],), program.v_init, dtype=torch.int64)
    for t in range(currents.shape[0]):
        v, s = program.run(v, currents[t])
        assert torch.equal(one[t], s.to(torch.int8))
    assert 0 < int(one.sum()) < one.numel()


@needs_compiler
def test_spikes_overwrite_currents_only_that_nothing_else_reads(monkeypatch):
    # one current read by two neuron layers, the first through a flatten (a view of the same
    # memory): only the last reader may write its spikes over the current
    base = to_integer(grid_net(tau=2.0, weight_step=2.0 ** -4))
    synapse, neuron = base.ops
    ops = [synapse, FlattenOp("flat", 0, -1, inputs=(0,)),
           dataclasses.replace(neuron, name="first", inputs=(1,)),
           dataclasses.replace(neuron, name="second", inputs=(0,)),
           JoinOp("both", "and", (0, 0), 0, inputs=(2, 3))]
    desc = dataclasses.replace(base, ops=ops, output_kind="spikes")
    x = inputs((16,), 6, 8, 0, 1).to(torch.int64)
    monkeypatch.setattr(simulator_module, "_COMPILED_MIN_STEPS", 0)
    out, layers, _ = _run(desc, x, "auto")
    monkeypatch.setattr(simulator_module, "_COMPILED_MIN_STEPS", 1 << 62)
    ref, ref_layers, _ = _run(desc, x, "integer")
    assert torch.equal(layers["first"], layers["second"]) and int(layers["first"].sum()) > 0
    assert torch.equal(out, ref) and all(torch.equal(layers[k], ref_layers[k]) for k in layers)


def test_one_narrowest_integer_rule_for_every_reader():
    """narrowest_int sizes the exporter's weights, the simulator's registers, the C types and the
    NIR import's weights; the simulator's symmetric bound and C's uint8_t come from it."""
    from snnquant.export import ExportError
    from snnquant.export.backends import simulator
    from snnquant.export.backends.c.common import c_int_type
    from snnquant.export.ir.integer_ops import narrowest_int

    assert narrowest_int(-128, 127) == torch.int8 and narrowest_int(0, 128) == torch.int16
    assert narrowest_int(0, 255, unsigned=True) == torch.uint8
    assert narrowest_int(-1, 255, unsigned=True) == torch.int16
    assert narrowest_int(0, 1, narrowest=torch.int16) == torch.int16
    assert narrowest_int(-(1 << 63), (1 << 63) - 1) == torch.int64
    assert narrowest_int(0, 1 << 63) is None
    assert simulator._dtype_for((1 << 15) - 1, torch.int16) == torch.int16
    assert simulator._dtype_for(1 << 15, torch.int16) == torch.int32
    assert simulator._dtype_for(5) == torch.int32 and simulator._dtype_for(1 << 31) == torch.int64
    assert simulator._dtype_for(1 << 70) == torch.int64
    assert c_int_type(0, 255) == ("uint8_t", 1)
    assert c_int_type(0, 255, signed=True) == ("int16_t", 2)
    assert c_int_type(-(1 << 31), 0) == ("int32_t", 4)
    with pytest.raises(ExportError, match=r"no C integer type holds \[0, 18446744073709551616\]"):
        c_int_type(0, 1 << 64)
