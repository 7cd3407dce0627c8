"""Capture from a run (issue 32, section 1): shape checks, blocks in an nn.ModuleList, errors
that name the innermost submodule and the line."""
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from conftest import neuron_outputs
from snnquant import QuantConfig, quantize_model
from snnquant.export import ExportError, compare_integer, fold_batchnorm, to_integer
from snnquant.capture import CaptureError, capture
from snnquant.capture import plan_folding

HERE = r"tests/test_capture\.py:\d+"


class _Block(nn.Module):
    """conv -> BN -> IF with an identity shortcut, behind a SpikingJelly-style shape check."""

    def __init__(self, channels):
        super().__init__()
        self.conv = layer.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = layer.BatchNorm2d(channels)
        self.sn = neuron.IFNode()

    def forward(self, x):
        if x.ndim != 5:  # what spikformer.py:523 does: torch.fx stops here
            raise ValueError(f"expected [T, N, C, H, W], got {tuple(x.shape)}")
        return self.sn(self.bn(self.conv(x))) + x


class _Net(nn.Module):
    def __init__(self, channels=4, blocks=2):
        super().__init__()
        self.stem = nn.Sequential(layer.Conv2d(2, channels, 3, padding=1, bias=False),
                                  layer.BatchNorm2d(channels), neuron.IFNode())
        self.blocks = nn.ModuleList(_Block(channels) for _ in range(blocks))
        self.head = nn.Sequential(layer.Linear(channels * 6 * 6, 5), neuron.IFNode())

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(2))


def _net():
    torch.manual_seed(0)
    net = _Net()
    sjf.set_step_mode(net, "m")
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
    return net


def _input(seed=0):
    return torch.randint(0, 2, (4, 2, 2, 6, 6), generator=torch.Generator().manual_seed(seed)).float()


def test_symbolic_capture_names_the_block_the_line_and_what_to_change():
    net = _net()
    plan = plan_folding(net)  # callable with the model alone, as quantize_model calls it
    assert plan.pairs == [("stem.0", "stem.1")]
    reason = plan.refused["blocks.0.bn"]
    assert reason.startswith("it sits in 'blocks.0', whose forward was not captured: torch.fx "
                             "cannot trace the forward() of layer 'blocks.0' (_Block) at ")
    with pytest.raises(ExportError, match=r"layer 'blocks\.0\.bn' \(BatchNorm2d\): it sits in "
                                          r"'blocks\.0'.*\(_Block\) at " + HERE +
                                          r" \(TraceError.*pass example_input=x"):
        fold_batchnorm(net)


def test_run_capture_folds_every_batchnorm_and_keeps_every_spike():
    net = _net().double().eval()
    x = _input().double()
    plan = plan_folding(net, x)
    assert plan.pairs == [("stem.0", "stem.1"), ("blocks.0.conv", "blocks.0.bn"),
                          ("blocks.1.conv", "blocks.1.bn")] and not plan.refused
    folded = fold_batchnorm(net, example_input=x)
    assert not [m for m in folded.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    y0, spikes0 = neuron_outputs(net, x * 3)
    y1, spikes1 = neuron_outputs(folded, x * 3)
    assert sum(float(s.sum()) for s in spikes0.values()) > 0
    assert all(torch.equal(spikes0[n], spikes1[n]) for n in spikes0)
    torch.testing.assert_close(y1, y0, rtol=1e-9, atol=1e-9)


def test_capture_leaves_the_model_as_it_was():
    net = _net().train()
    x = _input()
    sjf.reset_net(net)
    mean = net.stem[1].running_mean.clone()
    capture(net, x)
    assert net.training and torch.equal(net.stem[1].running_mean, mean)
    assert isinstance(net.stem[2].v, float)  # no state left behind by the run


def test_quantized_network_exports_from_the_run_exactly():
    net = _net()
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = _input()
    sjf.reset_net(q)
    q.train()(x * 2)
    sjf.reset_net(q)
    folded = fold_batchnorm(q, example_input=x)
    with pytest.raises(CaptureError, match=r"layer 'blocks\.0' \(_Block\) at " + HERE +
                                           r".*pass example_input=x"):
        to_integer(folded, input_max=1)
    desc = to_integer(folded, input_max=1, example_input=x)
    assert desc.neuron_names == ["stem.2", "blocks.0.sn", "blocks.1.sn", "head.1"]
    report = compare_integer(folded, _input(1), desc)
    assert report.output == 1.0 and all(v == 1.0 for v in report.layers.values())


def test_a_failing_run_names_the_innermost_module_and_its_line():
    net = _net()
    with pytest.raises(CaptureError, match=r"the forward pass on the example input \(shape "
                                           r"\(2, 2, 6, 6\)\) failed in layer 'stem\.0' "
                                           r"\(Conv2d\) at layer/stateless_wrapper\.py:\d+: "
                                           r"ValueError: expected x with shape \[T, N, C, H, W\]"):
        fold_batchnorm(net, example_input=_input()[0])
    with pytest.raises(TypeError, match="example_input must be a tensor or a tuple of tensors, "
                                        "got list"):
        capture(net, [[1.0]])


class _Attention(nn.Module):
    """A product that mixes the samples of a batch: what the integer export does not compute."""

    def __init__(self, channels):
        super().__init__()
        self.q = nn.Sequential(layer.Linear(channels, channels), neuron.IFNode())
        self.k = nn.Sequential(layer.Linear(channels, channels), neuron.IFNode())

    def forward(self, x):
        if x.dim() != 3:
            raise ValueError("expected [T, N, C]")
        return self.q(x) @ self.k(x).transpose(-2, -1)


class _Gate(_Attention):
    """An operation the integer export has no integer form of."""

    def forward(self, x):
        return torch.sigmoid(self.q(x))


def test_unsupported_operation_is_named_with_its_module_and_line():
    net = nn.Sequential(layer.Linear(4, 4), neuron.IFNode(), _Attention(4))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = torch.ones(3, 2, 4)
    q.train()(x)
    # [T, N, C] transposed over (N, C) mixes the samples of a batch
    with pytest.raises(ExportError, match=r"^layer '2' \(_Attention\), the operation transpose at "
                                          + HERE + r": it moves values across the time or batch "
                                          r"dimensions \(shape \(3, 2, 4\) to \(3, 4, 2\)\)"):
        to_integer(q, input_max=1, example_input=x)
    q[2].__class__ = _Gate
    with pytest.raises(ExportError, match=r"^layer '2' \(_Gate\), the operation sigmoid at "
                                          + HERE + r": sigmoid\(a tensor\) is not supported by "
                                          r"the integer export"):
        to_integer(q, input_max=1, example_input=x)


def test_run_and_symbolic_capture_agree_where_both_work():
    from spikingjelly.activation_based.model import sew_resnet
    torch.manual_seed(0)
    net = sew_resnet.sew_resnet18(spiking_neuron=neuron.IFNode, cnf="ADD", num_classes=10)
    sjf.set_step_mode(net, "m")
    x = torch.rand(1, 1, 3, 16, 16)
    symbolic, run = plan_folding(net), plan_folding(net, x)
    assert run.pairs == symbolic.pairs and len(run.pairs) == 20 and not run.refused
    graph = capture(net, x).graph("", net)
    assert sum(n.op == "call_function" and n.target.__name__ == "sew_function"
               for n in graph.nodes) == 8  # the connect function stays one call


class _FlattensTime(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(layer.Linear(4, 4), neuron.IFNode())

    def forward(self, x):
        return torch.flatten(self.fc(x), 0)  # folds time into the features


def test_refusals_inside_a_forward_name_the_module_not_an_fx_node():
    net = nn.Sequential(layer.Linear(4, 4), neuron.IFNode(), _FlattensTime())
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    q.train()(torch.ones(3, 2, 4))
    for example in (None, torch.ones(3, 2, 4)):  # both captures
        with pytest.raises(ExportError, match=r"^layer '2' \(_FlattensTime\), the operation "
                                              r"flatten at " + HERE + r": it flattens the time "
                                              r"or batch dimension"):
            to_integer(q, input_max=1, example_input=example)


class _StemThenBody(nn.Module):
    """A stem with no neuron first: the hint must not offer it as a part to export."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(layer.Linear(4, 4))
        self.body = nn.Sequential(layer.Linear(4, 4), neuron.IFNode())

    def forward(self, x):
        if x.shape[-1] != 4:
            raise ValueError("expected 4 features")
        return self.body(self.stem(x))


def test_the_hint_only_offers_a_part_with_layers_and_neurons():
    net = _StemThenBody()
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    q.train()(torch.ones(3, 2, 4))
    with pytest.raises(CaptureError, match=r"the model \(_StemThenBody\) at " + HERE +
                                           r" .*pass example_input=x.*e\.g\. model\.body$"):
        to_integer(q, input_max=1)


class _ViewAddsInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(layer.Linear(4, 4), neuron.IFNode())

    def forward(self, x):
        y = self.fc(x)
        y.flatten(1).add_(1.0)  # changes y through a view
        return y


def test_an_in_place_change_through_a_view_is_refused_not_lost():
    net = _ViewAddsInPlace()
    sjf.set_step_mode(net, "m")
    with pytest.raises(CaptureError, match=r"the model \(_ViewAddsInPlace\) at " + HERE +
                                           r" changes a view of a tensor in place \(add_\)"):
        capture(net, torch.ones(3, 2, 4))


def test_spiking_resnet_adds_in_place_to_a_layer_output_and_is_captured():
    """spiking_resnet's BasicBlock writes ``out += identity`` on a multi-step BatchNorm's output,
    a view of the module's own flattened result that no other operation reads: not refused."""
    from spikingjelly.activation_based.model import spiking_resnet
    torch.manual_seed(0)
    net = spiking_resnet.spiking_resnet18(spiking_neuron=neuron.IFNode, num_classes=10)
    sjf.set_step_mode(net, "m")
    x = torch.rand(2, 1, 3, 32, 32)
    graph = capture(net, x).graph("layer1.0", net.layer1[0])
    assert any(n.target in ("add_", "__iadd__") for n in graph.nodes)
