"""NIR that follows the NIR specification, checked against the consumers' own importers.

Each exported network is imported with SpikingJelly's ``import_from_nir``, snnTorch's
``import_nir.import_from_nir`` and Norse's ``from_nir``, run on the same integer input, and its
output spikes compared with :class:`~snnquant.export.IntegerSNN`. Where an importer deviates from
NIR, the case is a strict expected failure naming the deviation (docs/guide/nir.rst lists them
with their workarounds).
"""
import functools

import numpy as np
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from _nir_consumers import (ARCHS, CONSUMERS, RUNNERS, build_network, events, nir_exact_layers,
                            run_spikingjelly, saturation_free, samples_identical)
from snnquant import QuantConfig, quantize_model
from snnquant.export import (IntegerSNN, NIRImportError, from_nir, simulate_nir, to_integer,
                             to_nir)

nir = pytest.importorskip("nir")

# Norse 1.1 imports through nirtorch.load (deprecated) and torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:nirtorch.load is being deprecated:DeprecationWarning",
                                        "ignore:`torch.jit.script` is deprecated:FutureWarning")

DT = 1e-4
BITS = (2, 4, 8)
SEEDS = (0, 1)

SJ_NO_THRESHOLD = ("SpikingJelly 2.0 import_from_nir has no Threshold (nor SumPool2d) node, "
                   "which max pooling of spikes uses")
SNNTORCH_IF = ("snnTorch 1.0 import_from_nir asserts r == 1 for IF (NIR's r is 1/dt) and maps IF "
               "to snn.Leaky(beta=0.9) with subtractive reset, a leaky neuron")
FLATTEN = ("{} passes NIR's per-sample Flatten dims to torch.nn.Flatten, which then also "
           "flattens the batch")
NO_THRESHOLD = "{} has no NIR Threshold node, which max pooling of spikes uses"
NORSE_R = "Norse's from_nir ignores NIR's r (LIF with r = tau, i.e. decay_input=False)"
NORSE_V_RESET = "Norse's from_nir ignores NIR's v_reset (its neurons start and reset at 0)"
SNNTORCH_V_LEAK = "snnTorch 1.0 import_from_nir asserts v_leak == 0 and resets LIF to zero"


@functools.lru_cache(maxsize=None)
def net(arch, kind, bits, seed, **kw):
    return build_network(arch, kind, bits, seed, **kw)


def _deviation(consumer, arch, kind, max_pool="threshold", shift_flatten=False):
    """The deviations from NIR that the consumer's importer meets in this network, or None."""
    found = []
    if consumer == "snntorch" and (kind == "if" or (arch == "conv_pool" and max_pool == "conv_if")):
        found.append(SNNTORCH_IF)
    if consumer in ("snntorch", "norse") and arch in ("conv", "conv_pool") and not shift_flatten:
        found.append(FLATTEN.format({"snntorch": "snnTorch 1.0", "norse": "Norse"}[consumer]))
    if arch == "conv_pool" and max_pool == "threshold":
        found.append(SJ_NO_THRESHOLD if consumer == "spikingjelly" else
                     NO_THRESHOLD.format({"snntorch": "snnTorch 1.0", "norse": "Norse"}[consumer]))
    return "; ".join(found) or None


def _cases(kind, max_pool="threshold", shift_flatten=False, bits=BITS, seeds=SEEDS):
    for consumer in CONSUMERS:
        for arch in ARCHS:
            reason = _deviation(consumer, arch, kind, max_pool, shift_flatten)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            # a deviation does not depend on the bit width or the seed: pin it once
            for b in bits[:1] if reason else bits:
                for seed in seeds[:1] if reason else seeds:
                    yield pytest.param(consumer, arch, b, seed, marks=marks,
                                       id=f"{consumer}-{arch}-w{b}-s{seed}")


# ------------------------------------------------------------------------------------------------
# the export itself

def _single_neuron(weight, kind="if", v_reset=0.0):
    """Linear(1, 1) with a power-of-two weight feeding one neuron, threshold 1."""
    lin = layer.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(weight)
    nrn = neuron.IFNode(v_reset=v_reset) if kind == "if" else neuron.LIFNode(tau=2.0, v_reset=v_reset)
    model = nn.Sequential(lin, nrn)
    sjf.set_step_mode(model, "m")
    q, _ = quantize_model(model, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    return to_integer(q.eval())


@pytest.mark.parametrize("units", ["integer", "real"])
def test_membrane_exactly_at_threshold_fires_under_nir_strict_rule(units):
    # input 2 x weight 0.5 puts the membrane exactly on v_threshold = 1.0 = theta * s_v
    desc = _single_neuron(0.5)
    op = desc.ops[1]
    assert op.threshold * op.membrane_scale == 1.0
    x = torch.tensor([[[2]], [[1]], [[0]]])
    ref = IntegerSNN(desc)(x)
    assert ref.reshape(-1).tolist() == [1, 0, 0]
    graph = to_nir(desc, (1,), units=units, dt=DT)
    node = graph.nodes["1"]
    u = float(node.metadata["membrane_unit"])
    assert u == op.membrane_scale * (2.0 ** op.grid_frac_bits if units == "integer" else 1.0)
    assert np.all(node.v_threshold == (op.threshold - 0.5) * u)
    out = simulate_nir(graph, x)             # NIR's v > v_threshold, with Euler steps of dt
    assert torch.equal(out.to(torch.int8), ref)
    assert torch.equal(run_spikingjelly(graph, x, DT).to(torch.int8), ref)


@pytest.mark.parametrize("units", ["integer", "real"])
@pytest.mark.parametrize("arch", ARCHS)
def test_if_networks_follow_nir_equations_exactly(arch, units):
    for bits in BITS:
        desc, shape = net(arch, "if", bits, 0)
        graph = to_nir(desc, shape, units=units, dt=DT)
        x = events(shape, seed=bits)
        ok, why = saturation_free(graph, x)
        assert ok, f"test input saturates the membrane: {why}"
        assert nir_exact_layers(desc)
        ref = IntegerSNN(desc)(x)
        assert 0.05 < float(ref.float().mean()) < 0.95
        assert torch.equal(simulate_nir(graph, x).to(torch.int8), ref)


def test_parameters_follow_nir_reference_equations_for_dt():
    dt = 2.0 ** -10
    desc, shape = net("mlp", "lif", 4, 0)
    graph = to_nir(desc, shape, dt=dt, units="real")
    assert graph.metadata["dt"] == dt and graph.metadata["producer"] == "snnquant"
    for name in ("1", "3"):
        node, op = graph.nodes[name], desc.layer(name)
        assert isinstance(node, nir.LIF) and node.metadata["dt"] == dt
        assert np.all(node.tau == 2.0 * dt) and np.all(node.r == 1.0)
        assert np.all(node.v_leak == node.v_reset) and np.all(node.v_reset == 0.0)
        assert np.all(node.v_threshold == (op.threshold - 0.5) * op.membrane_scale)
    desc_if, _ = net("mlp", "if", 4, 0)
    node = to_nir(desc_if, shape, dt=dt).nodes["1"]
    assert isinstance(node, nir.IF) and np.all(node.r == 1.0 / dt)
    # not decay_input: NIR's r is tau (tau dv/dt = (v_leak - v) + tau I)
    desc_nd, _ = net("dense", "lif", 4, 0, decay_input=False)
    node = to_nir(desc_nd, (16,), dt=dt).nodes["1"]
    assert np.all(node.r == 2.0) and np.all(node.tau == 2.0 * dt)
    x = events((16,), seed=3)
    # a consumer that integrates NIR's equations with the same dt: SpikingJelly in float64
    assert torch.equal(run_spikingjelly(to_nir(desc_nd, (16,), dt=dt), x, dt),
                       simulate_nir(to_nir(desc_nd, (16,), dt=dt), x))
    with pytest.raises(ValueError, match="dt must be a positive"):
        to_nir(desc, shape, dt=0.0)
    with pytest.raises(ValueError, match="max_pool"):
        to_nir(desc, shape, max_pool="avg")


def test_metadata_schema():
    desc, shape = net("conv_pool", "lif", 2, 0)
    graph = to_nir(desc, shape, dt=DT)
    gm = graph.metadata
    for key in ("producer", "snnquant_schema", "dt", "units", "input_max", "output_kind",
                "reference_dtype", "exact", "fire_condition"):
        assert key in gm, key
    conv, lif, pool = graph.nodes["0"], graph.nodes["1"], graph.nodes["2"]
    syn, nop = desc.layer("0"), desc.layer("1")
    m = conv.metadata
    assert m["snnquant_op"] == "synapse" and m["weight_bits"] == 2
    assert np.array_equal(m["weight_int"], syn.weight.numpy())
    assert m["weight_scale"].shape == (4,)                  # one grid step per output channel
    assert np.array_equal(m["bias_int"], syn.bias.numpy()) and m["bias_scale"] == 2.0 ** -syn.out_frac_bits
    assert np.array_equal(conv.weight, m["weight_int"] * m["weight_scale"].reshape(-1, 1, 1, 1)
                          * m["unit_factor"])
    m = lif.metadata
    assert m["snnquant_op"] == "neuron" and m["v_bits"] == 12
    assert (m["v_min"], m["v_max"]) == (nop.v_min, nop.v_max) == (-2048, 2047)
    assert m["membrane_scale"] == nop.membrane_scale and m["threshold_int"] == nop.threshold
    assert m["rounding"] == "half_to_even" and m["fire_condition"] == "v_int >= threshold_int"
    assert m["leak_shift"] == 1 and m["leak_multiplier"] == 1 and m["nir_dynamics_exact"] is False
    assert pool.metadata["pool_kind"] == "max" and isinstance(graph.nodes["2_threshold"], nir.Threshold)
    desc_if, _ = net("mlp", "if", 4, 0)
    assert to_nir(desc_if, (16,)).nodes["1"].metadata["nir_dynamics_exact"] is True


# ------------------------------------------------------------------------------------------------
# from_nir

@pytest.mark.parametrize("units", ["integer", "real"])
@pytest.mark.parametrize("max_pool", ["threshold", "conv_if"])
def test_from_nir_round_trip_gives_identical_spikes(tmp_path, units, max_pool):
    for arch in ARCHS:
        for kind in ("if", "lif"):
            desc, shape = net(arch, kind, 4, 1)
            path = tmp_path / f"{arch}-{kind}.nir"
            to_nir(desc, shape, units=units, dt=DT, max_pool=max_pool, path=path)
            back = from_nir(path)
            assert str(back) == str(desc) and back.bits() == desc.bits()
            assert back.input_max == desc.input_max and back.exact == desc.exact
            x = events(shape, T=10, N=8, seed=5, max_count=2)
            assert torch.equal(IntegerSNN(back)(x), IntegerSNN(desc)(x)), (arch, kind)


def test_from_nir_round_trip_fixed_point_leak_and_bias_bits():
    torch.manual_seed(0)
    model = nn.Sequential(layer.Linear(16, 8), neuron.LIFNode(tau=3.0, v_reset=0.0))
    sjf.set_step_mode(model, "m")
    q, _ = quantize_model(model, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    desc = to_integer(q.eval(), leak_bits=12)
    back = from_nir(to_nir(desc, (16,), dt=DT))
    assert back.exact is False and back.ops[1].leak_multiplier == desc.ops[1].leak_multiplier
    assert back.ops[1].tau == 3.0
    x = events((16,), T=12, N=8, seed=2, max_count=3)
    assert torch.equal(IntegerSNN(back)(x), IntegerSNN(desc)(x))


def test_from_nir_refuses_graphs_without_snnquant_metadata(tmp_path):
    w = np.ones((2, 3))
    foreign = nir.NIRGraph(
        nodes={"input": nir.Input(input_type={"input": np.array([3])}),
               "fc": nir.Affine(weight=w, bias=np.zeros(2)),
               "lif": nir.LIF(tau=np.full(2, 2e-4), r=np.ones(2), v_leak=np.zeros(2),
                              v_threshold=np.ones(2)),
               "output": nir.Output(output_type={"output": np.array([2])})},
        edges=[("input", "fc"), ("fc", "lif"), ("lif", "output")])
    with pytest.raises(NIRImportError, match=r"no snnquant metadata.*lacks \['producer', "
                                             r"'snnquant_schema', 'dt'"):
        from_nir(foreign)
    desc, shape = net("mlp", "if", 4, 0)
    graph = to_nir(desc, shape)
    del graph.nodes["1"].metadata["v_min"], graph.nodes["1"].metadata["rounding"]
    with pytest.raises(NIRImportError, match=r"node '1' \(neuron\) lacks the snnquant metadata "
                                             r"\['v_min', 'rounding'\]"):
        from_nir(graph)
    graph = to_nir(desc, shape)
    graph.nodes["2"].metadata = {}
    with pytest.raises(NIRImportError, match=r"node '2' \(Affine\) lacks.*snnquant_op"):
        from_nir(graph)
    graph = to_nir(desc, shape)
    graph.nodes["2"].weight = graph.nodes["2"].weight * 1.5
    with pytest.raises(NIRImportError, match=r"node '2': the NIR weight disagrees"):
        from_nir(graph)
    graph = to_nir(desc, shape)
    node = graph.nodes["1"]
    node.v_threshold = node.v_threshold + 0.5 * node.metadata["membrane_unit"]  # the old >= form
    with pytest.raises(NIRImportError, match="v_threshold disagrees"):
        from_nir(graph)
    with pytest.raises(FileNotFoundError, match="no NIR file"):
        from_nir(tmp_path / "missing.nir")
    with pytest.raises(TypeError, match="graph_or_path"):
        from_nir(desc)


def test_too_old_nir_is_refused_with_a_clear_error(monkeypatch):
    desc, shape = net("dense", "if", 4, 0)
    monkeypatch.setattr(nir, "__version__", "1.0.4")
    with pytest.raises(ImportError, match=r"to_nir needs nir >= 1\.0\.6.*found nir 1\.0\.4"):
        to_nir(desc, shape)
    with pytest.raises(ImportError, match=r"from_nir needs nir >= 1\.0\.6"):
        from_nir("whatever.nir")


# ------------------------------------------------------------------------------------------------
# the consumers' own importers

@pytest.mark.parametrize("consumer,arch,bits,seed", list(_cases("if")))
def test_if_networks_agree_with_consumer(consumer, arch, bits, seed):
    desc, shape = net(arch, "if", bits, seed)
    graph = to_nir(desc, shape, dt=DT)
    x = events(shape, seed=seed + 10)
    ok, why = saturation_free(graph, x)
    assert ok, f"test input saturates the membrane: {why}"   # a test-design error, not xfail
    ref = IntegerSNN(desc)(x)
    out = RUNNERS[consumer](graph, x, DT)
    assert samples_identical(out, ref) == 1.0


@pytest.mark.parametrize("consumer,arch,bits,seed",
                         list(_cases("if", max_pool="conv_if", shift_flatten=True, bits=(2, 8),
                                     seeds=(0,))))
def test_if_networks_agree_with_documented_workarounds(consumer, arch, bits, seed):
    # max_pool='conv_if' writes max pooling as Conv2d + IF; shift_flatten_dims patches Flatten
    desc, shape = net(arch, "if", bits, seed)
    graph = to_nir(desc, shape, dt=DT, max_pool="conv_if")
    x = events(shape, seed=seed + 20)
    assert saturation_free(graph, x)[0]
    out = RUNNERS[consumer](graph, x, DT, shift_flatten=True)
    assert samples_identical(out, IntegerSNN(desc)(x)) == 1.0


@pytest.mark.parametrize("consumer,arch,bits,seed",
                         list(_cases("lif", max_pool="conv_if", shift_flatten=True, bits=(4,),
                                     seeds=(0,))))
def test_lif_networks_follow_nir_equations_in_consumer(consumer, arch, bits, seed):
    # LIF membrane rounding is not expressible in NIR: the consumer is compared with NIR's own
    # equations (simulate_nir); agreement with IntegerSNN is measured in benchmarks/nir_agreement.py.
    # These inputs put no unrounded membrane exactly on a threshold, where SpikingJelly's >= and
    # NIR's > differ (pinned in test_spikingjelly_firing_rule_on_exact_ties).
    desc, shape = net(arch, "lif", bits, seed)
    graph = to_nir(desc, shape, dt=DT, max_pool="conv_if")
    x = events(shape, seed=seed + 30)
    out = RUNNERS[consumer](graph, x, DT, shift_flatten=True)
    assert samples_identical(out, simulate_nir(graph, x)) == 1.0


@pytest.mark.parametrize("consumer", [
    "spikingjelly",
    pytest.param("snntorch", marks=pytest.mark.xfail(strict=True, reason=SNNTORCH_IF)),
    pytest.param("norse", marks=pytest.mark.xfail(strict=True, reason=NORSE_V_RESET))])
def test_if_reset_to_nonzero_v_reset(consumer):
    desc, shape = net("mlp", "if", 4, 0, v_reset=0.25)
    assert desc.ops[1].v_reset != 0
    graph = to_nir(desc, shape, dt=DT)
    x = events(shape, seed=7)
    assert saturation_free(graph, x)[0]
    assert samples_identical(RUNNERS[consumer](graph, x, DT), IntegerSNN(desc)(x)) == 1.0


@pytest.mark.parametrize("consumer", [
    "spikingjelly", "snntorch",
    pytest.param("norse", marks=pytest.mark.xfail(strict=True, reason=NORSE_R))])
def test_lif_without_decay_input_reads_r(consumer):
    desc, shape = net("dense", "lif", 4, 0, decay_input=False)
    graph = to_nir(desc, shape, dt=DT)
    x = events(shape, seed=8)
    assert samples_identical(RUNNERS[consumer](graph, x, DT), simulate_nir(graph, x)) == 1.0


def _tie_network():
    """One LIF neuron (tau 2, 4-bit membrane: step 1/4, threshold 1 = 4 steps) whose input 7 x 1/4
    charges it to exactly 0.875 = theta - 1/2 step: snnquant rounds 3.5 half to even, to 4."""
    lin = layer.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(0.25)
    model = nn.Sequential(lin, neuron.LIFNode(tau=2.0, v_reset=0.0))
    sjf.set_step_mode(model, "m")
    q, _ = quantize_model(model, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=4))
    desc = to_integer(q.eval())
    assert desc.ops[1].threshold == 4 and desc.ops[1].membrane_scale == 0.25
    return desc, torch.tensor([[[7]]])


def test_lif_membrane_rounding_is_not_expressible_in_nir():
    desc, x = _tie_network()
    graph = to_nir(desc, (1,), dt=DT, units="real")
    _, rec = simulate_nir(graph, x, record=True)
    assert float(rec["1"]["v"].reshape(-1)[0]) == 0.875 == float(graph.nodes["1"].v_threshold[0])
    assert IntegerSNN(desc)(x).reshape(-1).tolist() == [1]     # rhe(3.5) = 4 >= theta
    assert simulate_nir(graph, x).reshape(-1).tolist() == [0]  # NIR: 0.875 > 0.875 is false


@pytest.mark.xfail(strict=True, reason="SpikingJelly 2.0 fires at v >= v_threshold, NIR at "
                                       "v > v_threshold (differs only on exact ties)")
def test_spikingjelly_firing_rule_on_exact_ties():
    desc, x = _tie_network()
    graph = to_nir(desc, (1,), dt=DT, units="real")
    assert torch.equal(run_spikingjelly(graph, x, DT), simulate_nir(graph, x))
