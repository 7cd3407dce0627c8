"""fold_batchnorm on any module tree: nested containers, residual blocks, SpikingJelly's zoo."""
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

import _zoo as zoo
from conftest import neuron_outputs
from snnquant import QuantConfig, quantize_model
from snnquant.export import ExportError, FoldWarning, fold_batchnorm, to_integer
from snnquant.capture import CaptureError


def _batchnorms(model):
    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _randomise_batchnorms(model):
    """Running statistics and affine parameters far from the identity, so folding shows."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
            m.bias.data.uniform_(-1, 1)


ZOO = {
    "spiking_resnet18": (zoo.spiking_resnet18, (3, 32, 32), 20),
    "sew_resnet18": (zoo.sew_resnet18_add, (3, 32, 32), 20),
    "spiking_vgg11_bn": (zoo.vgg11_bn, (3, 32, 32), 8),
    "NMNISTNet": (zoo.nmnist_net, (2, 34, 34), 2),
}


def _zoo_net(name):
    torch.manual_seed(0)
    build, shape, n_bn = ZOO[name]
    net = build()
    sjf.set_step_mode(net, "m")
    assert len(_batchnorms(net)) == n_bn
    return net, shape


def _spike_counts(model, x):
    """The output and every neuron layer's spike count, in eval mode."""
    y, outputs = neuron_outputs(model, x)
    return y, {name: float(o.sum()) for name, o in outputs.items()}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_float_fold_keeps_every_spike(name):
    net, shape = _zoo_net(name)
    _randomise_batchnorms(net)
    net = net.double().eval()
    x = torch.rand(4, 2, *shape, dtype=torch.float64) * 3
    folded = fold_batchnorm(net)
    assert _batchnorms(folded) == []
    assert len(_batchnorms(net)) == ZOO[name][2]  # the model given is not modified
    y0, spikes0 = _spike_counts(net, x)
    y1, spikes1 = _spike_counts(folded, x)
    assert sum(spikes0.values()) > 0
    assert spikes1 == spikes0
    torch.testing.assert_close(y1, y0, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_quantized_fold(name):
    """4-bit weights, 8-bit membranes, quantizers initialised by a training-mode pass."""
    net, shape = _zoo_net(name)
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    x = torch.rand(4, 2, *shape)
    sjf.reset_net(q)
    q.train()(x)
    q.eval()
    before = {n: m.weight.detach().double().clone() for n, m in q.named_modules()
              if hasattr(m, "weight_quant")}
    bns = {n: m for n, m in q.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    folded = fold_batchnorm(q)
    assert _batchnorms(folded) == []
    modules = dict(folded.named_modules())
    for bn_name, bn in bns.items():
        assert isinstance(modules[bn_name], nn.Identity)
    # the float weight is W * gamma / sqrt(var + eps) of the BatchNorm that followed it
    conv_name = {"spiking_resnet18": "layer1.0.conv1", "sew_resnet18": "layer2.0.downsample.0",
                 "spiking_vgg11_bn": "features.0", "NMNISTNet": "conv_fc.0"}[name]
    bn = bns[{"spiking_resnet18": "layer1.0.bn1", "sew_resnet18": "layer2.0.downsample.1",
              "spiking_vgg11_bn": "features.1", "NMNISTNet": "conv_fc.1"}[name]]
    scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    torch.testing.assert_close(modules[conv_name].weight.double(),
                               (before[conv_name] * scale.reshape(-1, 1, 1, 1)).float().double())
    assert modules[conv_name].bias_quant is not None
    sjf.reset_net(folded)
    with torch.no_grad():
        assert folded(x).shape[:2] == (4, 2)


def test_residual_bias_grid_follows_the_add_to_the_neuron():
    """conv2 -> bn2 -> (+ identity) -> sn2: bias step = min(weight step, sn2's membrane step)."""
    net, shape = _zoo_net("spiking_resnet18")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, weight_quantizer="lsq_pow2", v_bits=8))
    sjf.reset_net(q)
    q.train()(torch.rand(4, 2, *shape))
    folded = fold_batchnorm(q.eval())
    block = folded.layer1[0]
    s_w = float(block.conv2.weight_quant.grid().step.detach().reshape(-1).min())
    s_v = float(block.sn2.v_quant.grid().step)
    assert float(block.conv2.bias_quant.step) == min(s_w, s_v)


class _Block(nn.Module):
    def __init__(self, shared_conv_output=False, bn_after_pool=False):
        super().__init__()
        self.conv = layer.Conv2d(2, 4, 3, padding=1)
        self.bn = layer.BatchNorm2d(4)
        self.pool = layer.MaxPool2d(1)
        self.shared_conv_output = shared_conv_output
        self.bn_after_pool = bn_after_pool
        self.sn = neuron.IFNode()

    def forward(self, x):
        y = self.conv(x)
        if self.bn_after_pool:
            return self.sn(self.bn(self.pool(y)))
        z = self.bn(y)
        return self.sn(z + y if self.shared_conv_output else z)


def _block_net(**kw):
    torch.manual_seed(1)
    net = nn.Sequential(layer.SeqToANNContainer(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)),
                        _Block(**kw))
    sjf.set_step_mode(net, "m")
    _randomise_batchnorms(net)
    return net.eval()


def test_nested_containers_and_custom_blocks_fold():
    net = _block_net()
    x = torch.rand(3, 2, 2, 5, 5) * 2
    folded = fold_batchnorm(net)
    assert _batchnorms(folded) == []
    y0, s0 = _spike_counts(net, x)
    y1, s1 = _spike_counts(folded, x)
    assert sum(s0.values()) > 0 and s0 == s1


@pytest.mark.parametrize("kw, reason", [
    (dict(shared_conv_output=True),
     r"the output of layer '1\.conv' \(Conv2d\) also feeds the operation add in layer '1' "
     r"\(_Block, tests/test_fold_any_tree.py:\d+\)"),
    (dict(bn_after_pool=True),
     r"its input comes from layer '1\.pool' \(MaxPool2d\).*directly follows"),
])
def test_unfoldable_batchnorm_is_named_with_its_reason(kw, reason):
    net = _block_net(**kw)
    with pytest.raises(ExportError, match=r"layer '1\.bn' \(BatchNorm2d\): " + reason):
        fold_batchnorm(net)
    with pytest.warns(FoldWarning, match=r"layer '1\.bn' \(BatchNorm2d\): " + reason):
        folded = fold_batchnorm(net, on_unfoldable="warn")
    assert _batchnorms(folded) == ["1.bn"]  # the foldable one in the container was folded
    with pytest.raises(ValueError, match="on_unfoldable"):
        fold_batchnorm(net, on_unfoldable="ignore")


def test_shared_batchnorm_and_untraceable_forward_are_named():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(self.bn(self.fc(x)))

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                return self.bn(self.fc(x))
            return x

    with pytest.raises(ExportError, match=r"layer 'bn' \(BatchNorm1d\): it is called 2 times"):
        fold_batchnorm(Twice())
    with pytest.raises(ExportError, match=r"layer 'bn' \(BatchNorm1d\): it sits in the model, "
                                          r"whose forward was not captured: torch.fx cannot "
                                          r"trace the forward\(\) of the model \(Branchy\) at "
                                          r"tests/test_fold_any_tree.py:\d+ .*pass example_input"):
        fold_batchnorm(Branchy())
    # a run cannot follow a branch on a computed value either, and says so rather than
    # capturing the example input's path
    with pytest.raises(CaptureError, match=r"the model \(Branchy\) at tests/test_fold_any_tree"
                                           r".py:\d+ reads the value of a tensor the network "
                                           r"computes \(__bool__\)"):
        fold_batchnorm(Branchy(), example_input=torch.rand(2, 3))


def test_to_integer_names_why_a_batchnorm_is_left():
    """The refusal does not tell a user who folded to fold: it gives fold_batchnorm's reason."""
    net = nn.Sequential(layer.Conv2d(2, 4, 3), layer.MaxPool2d(2), layer.BatchNorm2d(4),
                        neuron.IFNode())
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    sjf.reset_net(q)
    q.train()(torch.rand(2, 1, 2, 6, 6))
    with pytest.warns(FoldWarning):
        folded = fold_batchnorm(q.eval(), on_unfoldable="warn")
    with pytest.raises(ExportError) as err:
        to_integer(folded)
    text = str(err.value)
    assert "layer '2' (BatchNorm2d)" in text and "MaxPool2d" in text
    assert "model = snnquant.export.fold_batchnorm(model)" not in text
