"""Integer export of graphs (issue 22 §2): residual joins, SpikingJelly's model zoo, files."""
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron
from spikingjelly.activation_based.model import sew_resnet

import snnquant.nn as qnn
import _zoo as zoo
from conftest import assert_spikes_equal
from snnquant import QuantConfig, quantize_model
from snnquant.export import (FORMAT_VERSION, NETWORK_INPUT, ExportError, IntegerNetwork,
                             IntegerSNN, JoinOp, PoolOp, compare_integer, fold_batchnorm, load_integer, save_integer,
                             to_integer)

T, N = 4, 2


def _sew(cnf, blocks):
    return lambda: sew_resnet.SEWResNet(sew_resnet.BasicBlock, blocks, cnf=cnf, num_classes=10,
                                        spiking_neuron=neuron.IFNode)


ZOO = {
    "spiking_resnet18": (zoo.spiking_resnet18, (3, 32, 32)),
    "sew_resnet18_ADD": (zoo.sew_resnet18_add, (3, 32, 32)),
    # sew_resnet18's own blocks and connect function, one block per stage (test size)
    "sew_resnet_IAND": (_sew("IAND", [1, 1, 1, 1]), (3, 32, 32)),
    "sew_resnet_AND": (_sew("AND", [1, 1, 1, 1]), (3, 32, 32)),
    "spiking_vgg11_bn": (zoo.vgg11_bn, (3, 32, 32)),
    "NMNISTNet": (zoo.nmnist_net, (2, 34, 34)),
}


def _active(net: nn.Module) -> nn.Module:
    """``net`` with Kaiming-normal weights (fan-in, ReLU gain) in every convolution and linear
    layer, and every BatchNorm's ``momentum=None``, so that the one training-mode pass sets its
    running statistics to that batch's. Why: with PyTorch's default initialisation and
    ``momentum=0.1`` the folded networks fall silent after two or three layers (measured: every
    neuron layer from ``layer2.1`` of spiking_resnet18 and NMNISTNet's read-out spike 0 times),
    and the C model would then be checked on the biases alone."""
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = None
    return net


def _deployable(name, transform=None):
    """quantize_model (4-bit weights, 8-bit membranes), one training-mode pass, fold_batchnorm;
    ``transform(net)`` (if given) changes the built network first."""
    torch.manual_seed(0)
    build, shape = ZOO[name]
    net = build() if transform is None else transform(build())
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = (torch.rand(T, N, *shape) > 0.7).float()
    sjf.reset_net(q)
    q.train()(x)
    return fold_batchnorm(q.eval()), x, shape


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_network_runs_exactly_in_integers(name):
    model, x, shape = _deployable(name, _active)
    desc = to_integer(model, input_shape=shape)
    out, y = assert_spikes_equal(desc, model, x)
    if desc.output_kind == "current":  # the linear head
        assert torch.equal(out.double() * 2.0 ** -desc.output_frac_bits, y.double())
    else:  # NMNISTNet's VotingLayer: the sum of 10 spikes, the model rounds sum / 10
        voting = desc.ops[-1]
        assert isinstance(voting, PoolOp) and voting.divisor == 10
        assert torch.equal((out.double() / 10).float(), y)
    joins = [op for op in desc.ops if isinstance(op, JoinOp)]
    expected = {"spiking_resnet18": ("add", 8), "sew_resnet18_ADD": ("add", 8),
                "sew_resnet_IAND": ("iand", 4), "sew_resnet_AND": ("and", 4)}.get(name)
    assert desc.is_graph == (expected is not None)
    if expected:
        assert {op.kind for op in joins} == {expected[0]} and len(joins) == expected[1]


class _TwoBranches(nn.Module):
    """x -> a(x) + b(x) -> sn: two currents on their own grids (weight steps step_a, step_b)."""

    def __init__(self, step_a, step_b, join="add"):
        super().__init__()
        torch.manual_seed(3)
        self.join = join
        self.a = qnn.QuantLinear(8, 6, bias=False, step_mode="m",
                                 weight_quant=qnn.UniformQuantizer(8, step=step_a))
        self.b = qnn.QuantLinear(8, 6, bias=False, step_mode="m",
                                 weight_quant=qnn.UniformQuantizer(8, step=step_b))
        self.sn = qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m")
        self.sn_b = qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m")
        with torch.no_grad():
            self.a.weight.uniform_(-0.3, 0.6)
            self.b.weight.uniform_(-0.3, 0.6)

    def forward(self, x):
        if self.join == "add":
            return self.sn(self.a(x) + self.b(x))
        return self.sn(self.a(x)) * self.b(x)  # AND of spikes with a current: refused


def test_join_of_two_grids_is_aligned_by_shifts_and_exact():
    model = _TwoBranches(2.0 ** -2, 2.0 ** -6).eval()
    desc = to_integer(model, input_max=1)
    join = desc.layer("add")
    a, b = desc.layer("a"), desc.layer("b")
    assert (a.out_frac_bits, b.out_frac_bits) == (2, 6)
    assert join.shifts == (4, 0) and join.out_frac_bits == 6
    assert join.inputs == (desc.ops.index(a), desc.ops.index(b))
    assert a.inputs == () and b.inputs == (NETWORK_INPUT,)  # both read the input
    x = (torch.rand(16, 5, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    sjf.reset_net(model)
    with torch.no_grad():
        y = model(x)
    assert y.sum() > 0
    assert torch.equal(IntegerSNN(desc)(x.long()).float(), y)


def test_inexact_join_is_refused_by_name():
    # 2^-22 and 2^4: the sum on the grid 2^-22 needs more than float32's 24 significand bits
    with pytest.raises(ExportError, match=r"the model \(_TwoBranches\), the operation add at "
                                          r"tests/test_export_graph.py:\d+: the sum of 'a' and 'b' "
                                          r"on the common grid 2\^-22.*more than 2\^24.*not exact"):
        to_integer(_TwoBranches(2.0 ** -22, 2.0 ** 4).eval(), input_max=1)
    with pytest.raises(ExportError, match=r"the model \(_TwoBranches\), the operation mul at "
                                          r"tests/test_export_graph.py:\d+: a AND join needs two "
                                          r"spike tensors.*'b' is not binary"):
        to_integer(_TwoBranches(2.0 ** -2, 2.0 ** -2, join="and").eval(), input_max=1)


def test_adaptive_pool_needs_the_input_shape_and_an_exact_divisor():
    net = nn.Sequential(layer.Conv2d(2, 4, 3), neuron.IFNode(), layer.AdaptiveAvgPool2d((2, 2)),
                        layer.Flatten(), layer.Linear(16, 3))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    sjf.reset_net(q)
    q.train()(torch.rand(T, N, 2, 6, 6))
    q.eval()
    with pytest.raises(ExportError, match=r"layer '2' \(AdaptiveAvgPool2d\).*input_shape"):
        to_integer(q)
    desc = to_integer(q, input_shape=(2, 6, 6))  # 4 x 4 -> 2 x 2: windows of 2 x 2
    assert desc.layer("2").kernel_size == (2, 2) and desc.layer("2").frac_bits_added == 2
    x = (torch.rand(T, N, 2, 6, 6) > 0.5).float()
    sjf.reset_net(q)
    with torch.no_grad():
        y = q(x)
    out = IntegerSNN(desc)(x.long())
    assert torch.equal(out.double() * 2.0 ** -desc.output_frac_bits, y.double())
    with pytest.raises(ExportError, match=r"layer '2'.*from \(5, 5\) to \(2, 2\) divides by 9"):
        to_integer(q, input_shape=(2, 7, 7))  # 5 x 5 -> 2 x 2: windows of 3 x 3
    with pytest.raises(ValueError, match=r"layer '2'.*windows other than the 2 elements"):
        IntegerSNN(desc)(torch.zeros(T, N, 2, 7, 7, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_shape"):
        to_integer(q, input_shape=(2, 0, 6))


def test_graph_file_round_trip(tmp_path):
    model, x, shape = _deployable("sew_resnet_IAND")
    desc = to_integer(model, input_shape=shape)
    path = tmp_path / "sew.safetensors"
    save_integer(desc, path)
    back = load_integer(path)
    assert back.format_version == FORMAT_VERSION and back.is_graph
    assert str(back) == str(desc)
    assert [back.op_inputs(i) for i in range(len(back.ops))] == \
        [desc.op_inputs(i) for i in range(len(desc.ops))]
    assert torch.equal(IntegerSNN(back)(x.long()), IntegerSNN(desc)(x.long()))
    report = compare_integer(model, x, back)  # the user's check works on graphs
    assert report.samples == 1.0 and report.first_mismatch is None and len(report.layers) == 12


def test_format_2_file_of_the_previous_release_still_loads():
    """tests/data/format2_sequence.safetensors: written by save_integer before graphs existed."""
    import pathlib
    desc = load_integer(pathlib.Path(__file__).parent / "data" / "format2_sequence.safetensors")
    assert desc.format_version == 2 and not desc.is_graph and len(desc.ops) == 6
    assert all(op.inputs == () for op in desc.ops)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 3, 2, 6, 6, generator=g) > 0.4).long()
    _, layers = IntegerSNN(desc)(x, record=True)
    # the per-step spike counts the writing version's IntegerSNN gave
    assert layers["1"].sum(dim=(2, 3, 4)).tolist() == [[0, 1, 2], [12, 10, 10], [19, 17, 12],
                                                        [14, 10, 20]]


def test_description_checks_its_graph():
    model = _TwoBranches(2.0 ** -2, 2.0 ** -6).eval()
    desc = to_integer(model, input_max=1)
    with pytest.raises(ValueError, match=r"operation 0 \('a'\) has inputs=\(2,\)"):
        IntegerNetwork(ops=[type(desc.ops[0])(**{**desc.ops[0].__dict__, "inputs": (2,)})]
                       + desc.ops[1:], input_max=1, output_kind="spikes")
    with pytest.raises(ValueError, match="kind must be one of"):
        JoinOp(name="j", kind="or", shifts=(0, 0), out_frac_bits=0, inputs=(0, 1))
    with pytest.raises(ValueError, match="shifts must be 2 ints"):
        JoinOp(name="j", kind="add", shifts=(0,), out_frac_bits=0, inputs=(0, 1))
    assert "add: join add, shifts [4, 0]" in str(desc) and "[2] <- [0, 1]" in str(desc)


def test_to_nir_writes_an_add_join_as_edges_into_its_consumer():
    """The join has no node: NIR sums the edges into the neuron (tests/test_nir_graph.py has the
    model zoo, the consumers and the refusals)."""
    pytest.importorskip("nir")
    from snnquant.export import from_nir, to_nir
    desc = to_integer(_TwoBranches(2.0 ** -2, 2.0 ** -6).eval(), input_max=1)
    graph = to_nir(desc, (8,))
    assert sorted(a for a, b in graph.edges if b == "sn") == ["a", "b"]
    assert "add" not in graph.nodes and graph.metadata["snnquant_joins"]["2"]["snnquant_name"] == "add"
    back = from_nir(graph)
    assert str(back) == str(desc) and back.layer("add").inputs == (0, 1)


class _SharedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = qnn.QuantLinear(8, 8, step_mode="m",
                                  weight_quant=qnn.UniformQuantizer(8, step=0.25))
        self.sn = qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m")

    def forward(self, x):
        return self.sn(self.fc(self.sn(self.fc(x))))


def test_layer_called_twice_is_refused_by_name():
    with pytest.raises(ExportError, match=r"layer 'fc' \(QuantLinear\): it is called 2 times"):
        to_integer(_SharedLayer().eval(), input_max=1)


def test_to_c_refuses_only_joins_it_cannot_bound(tmp_path):
    """to_c writes graphs (joins, branches, adaptive pools, VotingLayer: see
    tests/test_export_c_graph.py); it refuses, by name and before writing anything, a join whose
    bound reaches 2^62 (int64 would overflow) and an AND of values that are not spikes."""
    import dataclasses

    from snnquant.export import c_memory, to_c
    desc = to_integer(_TwoBranches(2.0 ** -2, 2.0 ** -6).eval(), input_max=1)
    assert c_memory(desc, input_shape=(8,)).ram_bytes > 0     # a graph: not refused
    index = desc.ops.index(desc.layer("add"))
    wide = dataclasses.replace(desc.ops[index], shifts=(60, 56), out_frac_bits=62)
    desc.ops[index] = wide
    with pytest.raises(ExportError, match=r"operation 2 \('add'\) has shifts=\(60, 56\): the "
                                          r"add join is bounded only by \d+.*would overflow"):
        to_c(desc, tmp_path, input_shape=(8,))
    desc.ops[index] = dataclasses.replace(wide, kind="and", shifts=(0, 0), out_frac_bits=0)
    with pytest.raises(ExportError, match=r"operation 2 \('add'\) has kind='and': it joins "
                                          r"spikes \(0/1\), but operand 0 holds values in "
                                          r"\[-\d+, \d+\]"):
        c_memory(desc, input_shape=(8,))
    assert not list(tmp_path.iterdir())  # nothing written


class _InputSkip(nn.Module):
    """sn(fc(x) + x): the network input joins a current (event counts on the grid 2^0)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.fc = qnn.QuantLinear(8, 8, step_mode="m",
                                  weight_quant=qnn.UniformQuantizer(8, step=2.0 ** -3),
                                  bias_quant=qnn.UniformQuantizer(8, step=2.0 ** -3))
        self.sn = qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -3), step_mode="m")

    def forward(self, x):
        return self.sn(self.fc(x) + x)


def test_join_with_the_network_input_needs_input_max():
    model = _InputSkip().eval()
    with pytest.raises(ExportError, match=r"the model \(_InputSkip\), the operation add at "
                                          r"tests/test_export_graph.py:\d+: it adds the network input"
                                          r".*input_max"):
        to_integer(model)
    desc = to_integer(model, input_max=3)
    assert desc.layer("add").inputs == (0, NETWORK_INPUT) and desc.layer("add").shifts == (0, 3)
    x = torch.randint(0, 4, (6, 3, 8), generator=torch.Generator().manual_seed(2)).float()
    sjf.reset_net(model)
    with torch.no_grad():
        y = model(x)
    assert y.sum() > 0
    assert torch.equal(IntegerSNN(desc)(x.long()).float(), y)


class _JoinedWithItself(nn.Module):
    """c = fc(x); sn(c + c): one value read twice by one join (issue 35 §2)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc = qnn.QuantLinear(8, 6, bias=False, step_mode="m",
                                  weight_quant=qnn.UniformQuantizer(8, step=2.0 ** -3))
        self.sn = qnn.QuantIFNode(v_quant=qnn.UniformQuantizer(8, step=2.0 ** -4), step_mode="m")
        with torch.no_grad():
            self.fc.weight.uniform_(-0.3, 0.6)

    def forward(self, x):
        c = self.fc(x)
        return self.sn(c + c)


@pytest.mark.parametrize("arithmetic", ["integer", "auto"])
def test_join_reading_one_value_twice_runs_in_the_simulator(arithmetic):
    from snnquant.export import integer_agreement
    model = _JoinedWithItself().eval()
    desc = to_integer(model, input_max=1)
    assert desc.layer("add").inputs == (0, 0)
    x = (torch.rand(16, 5, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    sjf.reset_net(model)
    with torch.no_grad():
        y = model(x)
    assert y.sum() > 0
    assert torch.equal(IntegerSNN(desc, synapse_arithmetic=arithmetic)(x.long()).float(), y)
    assert integer_agreement(model, x, desc) == 1.0
