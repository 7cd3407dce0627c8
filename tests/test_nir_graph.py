"""Residual graphs in NIR (issue 22 §2 and §3): to_nir writes branches and joins, from_nir reads
them back exactly and validates them, simulate_nir runs them by NIR's equations.

An 'add' join has no node: NIR sums the edges into a node, so the join's operands feed its
consumers, each through a Scale node where its grid differs from the one the consumer needs (a
spike operand into a neuron in units='integer'; none in units='real'). SEW's 'AND'/'IAND' joins
of spikes are NIR Threshold nodes on the sum x0 + x1 (> 3/2) or x0 - x1 (> 1/2).
"""
import numpy as np
import pytest
import torch

from _nir_consumers import (build_network, events, run_norse, run_spikingjelly,
                            saturation_free, samples_identical)
from test_export_graph import _deployable
from snnquant.export import (ExportError, IntegerSNN, JoinOp, NIRImportError, from_nir,
                             nir_out_of_bounds, simulate_nir, to_integer, to_nir)

nir = pytest.importorskip("nir")
pytestmark = pytest.mark.filterwarnings("ignore:nirtorch.load is being deprecated:DeprecationWarning",
                                        "ignore:`torch.jit.script` is deprecated:FutureWarning")

DT = 1e-4


def _same_network(back, desc, x):
    assert str(back) == str(desc) and back.bits() == desc.bits()
    assert [op.inputs for op in back.ops] == [op.inputs for op in desc.ops]
    out_a, layers_a = IntegerSNN(desc)(x, record=True)
    out_b, layers_b = IntegerSNN(back)(x, record=True)
    assert torch.equal(out_a, out_b)
    assert layers_a.keys() == layers_b.keys()
    for name in layers_a:
        assert torch.equal(layers_a[name], layers_b[name]), name


@pytest.mark.parametrize("name,units", [("spiking_resnet18", "integer"),
                                        ("sew_resnet18_ADD", "real"),
                                        ("sew_resnet_IAND", "integer"),
                                        ("sew_resnet_AND", "real"),
                                        ("NMNISTNet", "integer")])
def test_zoo_network_round_trips_through_nir_exactly(tmp_path, name, units):
    model, x, shape = _deployable(name)
    desc = to_integer(model, input_shape=shape)
    path = tmp_path / f"{name}.nir"
    graph = to_nir(desc, shape, units=units, dt=DT, path=path)
    _same_network(from_nir(path), desc, x.long())
    kinds = {op.kind for op in desc.ops if isinstance(op, JoinOp)}
    if kinds & {"and", "iand"}:  # a Threshold node per join, on x0 + x1 or x0 - x1
        joins = [n for n in graph.nodes.values() if n.metadata.get("snnquant_op") == "join"]
        assert len(joins) == 4 and all(isinstance(n, nir.Threshold) for n in joins)
    if "add" in kinds:
        assert len(graph.metadata["snnquant_joins"]) == 8
        assert not any(n.metadata.get("snnquant_op") == "join" for n in graph.nodes.values())


def test_zoo_vgg_at_test_size_is_refused_by_name():
    """spiking_vgg11_bn's AdaptiveAvgPool2d((7, 7)) repeats a 1 x 1 map at 32 x 32: no NIR pool."""
    model, _, shape = _deployable("spiking_vgg11_bn")
    desc = to_integer(model, input_shape=shape)
    with pytest.raises(ExportError, match=r"layer 'avgpool': the adaptive pooling from \(1, 1\) "
                                          r"to \(7, 7\) has windows that overlap or repeat"):
        to_nir(desc, shape)


def test_voting_layer_and_adaptive_pool_are_nir_nodes():
    model, x, shape = _deployable("NMNISTNet")
    desc = to_integer(model, input_shape=shape)
    graph = to_nir(desc, shape, units="real", dt=DT)
    voting = graph.nodes["conv_fc_15"]
    assert isinstance(voting, nir.Linear) and voting.weight.shape == (10, 100)
    assert np.allclose(voting.weight[0, :10], 0.1) and not voting.weight[0, 10:].any()
    out = simulate_nir(graph, x)  # NIR's output is the real average the model computes
    assert torch.allclose(out, IntegerSNN(desc)(x.long()).double() / 10, rtol=1e-12, atol=0)
    resnet, _, rshape = _deployable("spiking_resnet18")
    pool = to_nir(to_integer(resnet, input_shape=rshape), rshape).nodes["avgpool"]
    assert isinstance(pool, nir.AvgPool2d) and list(pool.metadata["output_size"]) == [1, 1]


@pytest.mark.parametrize("units", ["integer", "real"])
def test_residual_network_follows_nir_equations_exactly(units):
    """An IF residual network whose currents lie on the membrane grids, on input that keeps every
    membrane in bounds: NIR's equations give IntegerSNN's spikes exactly."""
    for bits in (2, 4, 8):
        desc, shape = build_network("residual", "if", bits, 0)
        graph = to_nir(desc, shape, units=units, dt=DT)
        scales = [k for k, n in graph.nodes.items() if isinstance(n, nir.Scale)]
        assert len(scales) == (1 if units == "integer" else 0)  # the shortcut's spikes into sn2
        x = events(shape, seed=bits)
        ok, why = saturation_free(graph, x)
        assert ok, why
        ref = IntegerSNN(desc)(x)
        assert 0.05 < float(ref.float().mean()) < 0.95
        assert torch.equal(simulate_nir(graph, x).to(torch.int8), ref)
        _same_network(from_nir(graph), desc, x)


def test_residual_network_saturation_caveat_and_headroom():
    """Mixed-sign weights drive membranes to v_min, where snnquant saturates and NIR does not;
    the documented headroom (widen_membrane_range) removes every such step."""
    desc, shape = build_network("residual", "if", 4, 0, init="default")
    x = events(shape, N=32, seed=1)
    graph = to_nir(desc, shape, dt=DT)
    layers, in_bounds = nir_out_of_bounds(graph, x)
    assert layers and not bool(in_bounds.all())
    wide, _ = build_network("residual", "if", 4, 0, init="default", v_bits=14, headroom_bits=6)
    graph = to_nir(wide, shape, dt=DT)
    layers, in_bounds = nir_out_of_bounds(graph, x)
    assert layers == [] and bool(in_bounds.all())
    ref = IntegerSNN(wide)(x)
    assert ref.any() and torch.equal(simulate_nir(graph, x).to(torch.int8), ref)


def test_consumers_import_residual_graphs_in_real_units():
    """SpikingJelly and Norse sum the edges into a node; neither maps NIR's Scale node, which
    units='integer' needs for a spike shortcut into a neuron (SpikingJelly refuses it, Norse's
    output is wrong), so units='real' is the form for them."""
    desc, shape = build_network("residual", "if", 4, 0)
    x = events(shape, seed=4)
    ref = IntegerSNN(desc)(x)
    real = to_nir(desc, shape, units="real", dt=DT)
    assert samples_identical(run_spikingjelly(real, x, DT), ref) == 1.0
    assert samples_identical(run_norse(real, x, DT, shift_flatten=True), ref) == 1.0
    with pytest.raises(ValueError, match="Scale"):
        run_spikingjelly(to_nir(desc, shape, units="integer", dt=DT), x, DT)


# ------------------------------------------------------------------------------------------------
# from_nir validates the graph

def _residual_graph():
    desc, shape = build_network("residual", "if", 4, 0)
    return to_nir(desc, shape, dt=DT)


def _refused(graph, *pieces):
    with pytest.raises(NIRImportError) as info:
        from_nir(graph)
    for piece in pieces:
        assert piece in str(info.value), str(info.value)


def test_edge_from_the_wrong_node_is_refused():
    graph = _residual_graph()
    graph.edges = [("sn1", b) if (a, b) == ("conv2", "sn2") else (a, b) for a, b in graph.edges]
    _refused(graph, "node 'sn2': its incoming edges carry operations", "says")


def test_missing_edge_wrong_scale_factor_and_stray_node_are_refused():
    graph = _residual_graph()
    scale = next(k for k, n in graph.nodes.items() if isinstance(n, nir.Scale))
    graph.edges = [e for e in graph.edges if e[1] != scale and e[0] != scale]
    _refused(graph, "node 'sn2'")
    graph = _residual_graph()
    graph.nodes[scale].scale = graph.nodes[scale].scale * 2
    _refused(graph, "node 'sn2'", "factor")
    graph = _residual_graph()
    graph.nodes["stray"] = nir.Scale(scale=np.ones(5), metadata={"snnquant_op": "scale"})
    _refused(graph, "nodes ['stray'] are not part of the network")


def test_inputs_must_name_earlier_operations():
    graph = _residual_graph()
    graph.nodes["conv1"].metadata["snnquant_inputs"] = np.array([5])
    _refused(graph, "node 'conv1': snnquant_inputs=[5] must list earlier operations (indices "
                    "below 2)")


def test_cycle_is_refused_by_name():
    graph = _residual_graph()
    graph.edges = list(graph.edges) + [("sn2", "conv1")]
    _refused(graph, "cycle through the nodes", "'conv1'", "'sn2'")


def test_edge_to_an_unknown_node_and_duplicate_index_are_refused():
    graph = _residual_graph()
    graph.edges = list(graph.edges) + [("sn0", "nowhere")]
    _refused(graph, "node 'nowhere' does not exist")
    graph = _residual_graph()
    graph.nodes["conv1"].metadata["snnquant_index"] = 0
    _refused(graph, "node 'conv1': snnquant_index=0 is also node 'conv0'")


def test_join_shifts_checked():
    desc, shape = build_network("residual", "if", 4, 0)
    graph = to_nir(desc, shape, dt=DT)
    key = next(iter(graph.metadata["snnquant_joins"]))
    graph.metadata["snnquant_joins"][key]["shifts"] = np.array([0, 9])
    _refused(graph, "shifts=[0, 9] must put the operands' fractional bits")
