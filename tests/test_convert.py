"""quantize_model / QuantConfig / summary."""
import re
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

import snnquant
from snnquant import QuantConfig, quantize_model
from snnquant import nn as qnn
from conftest import csnn as conftest_csnn


def csnn(channels=8):
    """SpikingJelly's N-MNIST/Fashion-MNIST style CSNN (conv-BN-LIF blocks, multi-step)."""
    return conftest_csnn(channels)


def test_replaces_and_keeps_everything():
    net = csnn()
    net[0].weight.requires_grad_(False)
    q, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert [r.name for r in report.replaced] == ["0", "2", "4", "6", "9", "10"]
    assert report.replaced[0].old_type == "Conv2d" and report.replaced[0].new_type == "QuantConv2d"
    name, old, new = report.replaced[0]
    assert (name, old, new) == ("0", "Conv2d", "QuantConv2d")
    assert isinstance(q[2], qnn.QuantLIFNode) and isinstance(q[9], qnn.QuantLinear)
    assert torch.equal(q[0].weight, net[0].weight) and not q[0].weight.requires_grad
    assert q[2].surrogate_function is not net[2].surrogate_function  # deep copy by default
    assert isinstance(q[2].surrogate_function, surrogate.ATan)
    assert q[2].tau == 2.0 and q[2].detach_reset and q[2].step_mode == "m" and q[0].step_mode == "m"
    assert q[0].weight_quant.bits == 4 and q[2].v_quant.bits == 8
    assert isinstance(net[0], layer.Conv2d) and not isinstance(net[0], qnn.QuantConv2d)  # not inplace


def test_inplace_and_dtype():
    net = csnn().double()
    q, _ = quantize_model(net, QuantConfig(weight_bits=8, v_bits=8, membrane_quantizer="lsq"),
                          inplace=True)
    assert q is net and q[0].weight.dtype == torch.float64
    assert q[0].weight_quant.step.dtype == torch.float64 and q[2].v_quant.step.dtype == torch.float64
    y = q(torch.rand(2, 1, 2, 16, 16, dtype=torch.float64))
    assert y.dtype == torch.float64


def test_containers_and_custom_modules():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = layer.SeqToANNContainer(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4))
            self.sn = neuron.IFNode(step_mode="m")
            self.head = layer.MultiStepContainer(nn.Flatten(), nn.Linear(4 * 6 * 6, 3))

        def forward(self, x):
            return self.head(self.sn(self.conv(x)))

    net = Block()
    q, report = quantize_model(net, QuantConfig(weight_bits=6, v_bits=6))
    assert {r.name for r in report.replaced} == {"conv.0", "sn", "head.1"}
    assert isinstance(q.conv[0], qnn.QuantConv2d) and isinstance(q.head[1], qnn.QuantLinear)
    assert q(torch.rand(3, 2, 2, 8, 8)).shape == (3, 2, 3)


def test_unsupported_neuron_is_named():
    net = nn.Sequential(nn.Linear(4, 4), neuron.IzhikevichNode(step_mode="s"))
    _, report = quantize_model(net, QuantConfig(weight_bits=8, v_bits=8))
    assert report.skipped[0].name == "1" and "IzhikevichNode" in report.skipped[0].reason


def test_skip_and_overrides():
    net = csnn()
    cfg = QuantConfig(weight_bits=4, v_bits=8, skip=["9"], overrides={"0": {"weight_bits": 8},
                                                                     "1*": {"v_bits": 16}})
    q, report = quantize_model(net, cfg)
    assert not isinstance(q[9], qnn.QuantLinear)
    assert ("9", "matches a skip pattern") in [(s.name, s.reason) for s in report.skipped]
    assert q[0].weight_quant.bits == 8 and q[4].weight_quant.bits == 4
    assert q[10].v_quant.bits == 16 and q[2].v_quant.bits == 8


@pytest.mark.parametrize("wq", ["lsq", "lsq_pow2", "minmax", "quantized_bits"])
@pytest.mark.parametrize("mq", ["uniform", "threshold_centered", "lsq"])
def test_every_quantizer_choice_runs(wq, mq):
    q, _ = quantize_model(csnn(4), QuantConfig(weight_bits=4, weight_quantizer=wq, v_bits=8,
                                               membrane_quantizer=mq, per_channel=wq != "quantized_bits"))
    y = q(torch.rand(2, 2, 2, 16, 16))
    y.sum().backward()
    assert y.shape == (2, 2, 10)


def test_bad_config():
    with pytest.raises(ValueError, match="'lsq'.*'minmax'"):
        QuantConfig(weight_quantizer="dorefa")
    with pytest.raises(ValueError, match="uniform"):
        QuantConfig(membrane_quantizer="log")
    with pytest.raises(ValueError, match=r"v_bits.*\[2, 32\].*40"):
        QuantConfig(v_bits=40)
    with pytest.raises(ValueError, match="weight_bits"):
        QuantConfig(weight_bits=0)  # 1 is binary weights (issue 15)
    with pytest.raises(ValueError, match="weight_bits=1"):
        QuantConfig(weight_bits=1, weight_quantizer="quantized_bits")
    with pytest.raises(ValueError, match="unknown fields"):
        QuantConfig(overrides={"x": {"bits": 3}})
    with pytest.raises(ValueError, match="weight_bits"):
        QuantConfig(overrides={"x": {"weight_bits": 0}})


def test_nothing_to_quantize_warns():
    with pytest.warns(UserWarning, match="nothing to quantize"):
        _, report = quantize_model(nn.Sequential(nn.ReLU()), QuantConfig())
    assert report.replaced == [] and report.skipped == []


def test_reset_cache_invalidated_after_inplace_swap():
    net = csnn()
    sjf.reset_net(net)  # fills SpikingJelly's reset cache with the old neurons
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8), inplace=True)
    q(torch.rand(2, 1, 2, 16, 16))
    sjf.reset_net(q)
    assert all(isinstance(m.v, float) for m in q.modules() if isinstance(m, qnn.QuantLIFNode))


def test_state_dict_with_other_widths_names_layer():
    a, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    b, _ = quantize_model(csnn(), QuantConfig(weight_bits=2, v_bits=8))
    with pytest.raises(ValueError, match=r"'0.weight_quant'.*4-bit.*2 bits"):
        b.load_state_dict(a.state_dict())


def test_summary():
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    s = snnquant.summary(q)
    names = [r["name"] for r in s.rows]
    assert names == ["0", "2", "4", "6", "9", "10"]
    conv = s.rows[0]
    assert conv["weight_bits"] == 4 and conv["fp32_bytes"] == 4 * conv["params"]
    assert conv["quant_bytes"] == conv["params"] * 4 / 8
    assert s.rows[1]["membrane_bits_per_neuron"] == 8
    assert s.compression_ratio == pytest.approx(s.total_fp32_bytes / s.total_quant_bytes)
    assert 4 < s.compression_ratio <= 8
    assert "compression ratio" in str(s) and "QuantConv2d" in str(s)


def test_quantized_csnn_trains():
    torch.manual_seed(0)
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    x = (torch.rand(4, 16, 2, 16, 16) > 0.7).float()
    y = torch.randint(0, 10, (16,))
    losses = []
    for _ in range(12):
        sjf.reset_net(q)
        loss = nn.functional.cross_entropy(q(x).mean(0) * 10, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


# ------------------------------------------------------------------------------------------------
# every network: shared modules, everything not quantized reported, patterns, config types


def test_a_module_used_twice_is_quantized_once_at_both_positions():
    torch.manual_seed(0)
    fc, sn = nn.Linear(4, 4), neuron.IFNode()
    net = nn.Sequential(fc, sn, fc, sn)
    q, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert isinstance(q[2], qnn.QuantLinear) and q[0] is q[2] and q[1] is q[3]
    assert [r.name for r in report.replaced] == ["0", "1", "2", "3"]
    assert sorted(report.shared) == [["0", "2"], ["1", "3"]]
    assert "2: Linear -> QuantLinear (the same module as 0)" in str(report)
    # one weight step, trained by both uses
    q(torch.rand(3, 4)).sum().backward()
    assert len(list(q.parameters())) == len(list(q[0].parameters()))
    assert q[0].weight_quant.step.grad is not None


def test_a_module_under_two_parents_becomes_one_quantized_module():
    class Block(nn.Module):
        def __init__(self, fc):
            super().__init__()
            self.fc, self.sn = fc, neuron.LIFNode(tau=2.0)

        def forward(self, x):
            return self.sn(self.fc(x))

    fc = nn.Linear(4, 4)
    net = nn.Sequential(Block(fc), Block(fc))
    q, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert q[0].fc is q[1].fc and isinstance(q[1].fc, qnn.QuantLinear)
    assert q[0].fc.weight_quant is q[1].fc.weight_quant
    assert {r.name for r in report.replaced} == {"0.fc", "0.sn", "1.fc", "1.sn"}
    assert report.shared == [["0.fc", "1.fc"]]
    # positions of one module that skip/overrides treat differently: a clear error, not a guess
    with pytest.raises(ValueError, match=r"\['0.fc', '1.fc'\].*one module.*0.fc: skipped"):
        quantize_model(net, QuantConfig(weight_bits=4, skip=["0.fc"]))
    with pytest.raises(ValueError, match=r"1.fc: quantized with weight_bits=8"):
        quantize_model(net, QuantConfig(weight_bits=4, overrides={"1.*": {"weight_bits": 8}}))


def test_every_module_left_float_with_weights_or_state_is_reported():
    class MyLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    class MyConv(nn.Conv2d):
        pass

    class MyLIF(neuron.LIFNode):
        pass

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(1))
            self.inner = nn.Linear(2, 2)

    mods = [nn.Linear(2, 2), nn.Conv3d(1, 1, 1), nn.ConvTranspose1d(1, 1, 1), nn.ConvTranspose2d(1, 1, 1),
            nn.ConvTranspose3d(1, 1, 1), MyLinear(2, 2), MyConv(1, 1, 1), neuron.IzhikevichNode(),
            MyLIF(), neuron.SimpleLIFNode(tau=2.0, decay_input=True), nn.BatchNorm2d(2), Scale(), nn.ReLU(),
            nn.Flatten(), layer.MaxPool2d(2), neuron.LIFNode()]
    net = nn.Sequential(*mods)
    _, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    assert [r.name for r in report.replaced] == ["0", "11.inner", "15"]
    skipped = {s.name: s for s in report.skipped}
    assert sorted(skipped, key=int) == [str(i) for i in range(1, 12)]
    for i in (1, 2, 3, 4):
        assert "no quantized version" in skipped[str(i)].reason, skipped[str(i)]
    assert "subclass of nn.Linear" in skipped["5"].reason and skipped["5"].old_type == "MyLinear"
    assert "subclass of nn.Conv2d" in skipped["6"].reason
    for i in (7, 8, 9):
        assert "unsupported neuron" in skipped[str(i)].reason, skipped[str(i)]
    assert "fold_batchnorm" in skipped["10"].reason
    assert "parameters or buffers" in skipped["11"].reason
    # what was said in the docs is now true: nothing left float is missing from the report
    replaced = {r.name for r in report.replaced}
    for name, m in net.named_modules():
        has_state = any(True for _ in m.parameters(recurse=False)) or \
            any(True for _ in m.buffers(recurse=False)) or isinstance(m, neuron.BaseNode)
        if name and has_state:
            assert name in replaced or name in skipped, name


def test_an_already_quantized_model_reports_its_modules():
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    with pytest.warns(UserWarning, match="nothing to quantize"):
        _, report = quantize_model(q, QuantConfig(weight_bits=4, v_bits=8))
    # the BatchNorms '1' and '5' were folded into their layers during training: snnquant modules
    assert {s.name for s in report.skipped if "already an snnquant module" in s.reason} == \
        {"0", "1", "2", "4", "5", "6", "9", "10"}


def test_patterns_that_match_nothing_warn_by_name():
    with pytest.warns(UserWarning, match=r"skip pattern 'head\.\*' matches no module"):
        quantize_model(csnn(), QuantConfig(weight_bits=4, skip=["head.*"]))
    with pytest.warns(UserWarning, match=r"overrides pattern 'features\.0' matches no module"):
        quantize_model(csnn(), QuantConfig(weight_bits=4, overrides={"features.0": {"weight_bits": 8}}))
    with pytest.warns(UserWarning, match=r"skip pattern '3' matches only modules that quantize_model "
                                         r"does not replace"):
        quantize_model(csnn(), QuantConfig(weight_bits=4, skip=["3"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_model(csnn(), QuantConfig(weight_bits=4, skip=["9"], overrides={"0": {"weight_bits": 8}}))


@pytest.mark.parametrize("field, value", [("per_channel", "per_tensor"), ("per_channel", 1),
                                          ("weight_bits", 4.0), ("v_bits", "8"),
                                          ("weight_quantizer", None), ("backend", ["torch"]),
                                          ("skip", [3]), ("overrides", [("0", {})])])
def test_config_field_types_are_checked(field, value):
    with pytest.raises(TypeError, match=rf"{field}.*{re.escape(repr(value))}"):
        QuantConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        QuantConfig(**{field: value})
    if field not in ("skip", "overrides"):
        with pytest.raises(ValueError, match=rf"overrides\['x'\]: {field}"):
            QuantConfig(overrides={"x": {field: value}})


def test_trainable_plif_is_flagged_for_integer_export():
    net = nn.Sequential(nn.Linear(4, 4), neuron.ParametricLIFNode(init_tau=2.0))
    q, report = quantize_model(net, QuantConfig(weight_bits=8, v_bits=8))
    assert len(report.notes) == 1
    note = report.notes[0]
    assert note.startswith("1: ParametricLIFNode learns its tau") and "power of two" in note
    assert "leak_bits" in note and "requires_grad_(False)" in note and note in str(report)
    # a frozen power-of-two tau exports exactly: nothing to say
    frozen = nn.Sequential(nn.Linear(4, 4), neuron.ParametricLIFNode(init_tau=2.0))
    frozen[1].w.requires_grad_(False)
    _, report = quantize_model(frozen, QuantConfig(weight_bits=8, v_bits=8))
    assert report.notes == []
