"""BatchNorm folded into the quantized layer during training (issue 31): the deployed network is
the trained one, spike for spike, with no fine-tuning."""
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer

import snnquant
import _zoo as zoo
from conftest import csnn as conftest_csnn
from conftest import neuron_outputs
from snnquant import QuantConfig, quantize_model
from snnquant.export import (FoldWarning, SilentNetworkWarning, compare_integer, fold_batchnorm,
                             to_integer)


def csnn(c=8):
    """The example's CSNN shape, with a BatchNorm after the read-out's linear layer too."""
    return conftest_csnn(c, head_batchnorm=True)


def _kaiming(net):
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
    return net


def _train(q, x, steps=4, lr=5e-3):
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    q.train()
    for _ in range(steps):
        sjf.reset_net(q)
        out = q(x).mean(0)
        y = torch.randint(0, out.shape[-1], (x.shape[1],),
                          generator=torch.Generator().manual_seed(1))
        loss = nn.functional.cross_entropy(out * 10, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return q.eval()


def _codes(layer_):
    grid = layer_.weight_quant.grid()
    step = grid.step.reshape([-1] + [1] * (layer_.weight.dim() - 1)) if grid.step.numel() > 1 \
        else grid.step
    with torch.no_grad():
        return torch.round(layer_.quantized_weight() / step)


def _example_network():
    from snnquant.datasets import default_network
    return default_network("nmnist", channels=8)


ZOO = {
    "csnn": (lambda: csnn(), (2, 16, 16)),
    "example": (_example_network, (2, 34, 34)),
    "spiking_resnet18": (zoo.spiking_resnet18, (3, 32, 32)),
    "sew_resnet18": (zoo.sew_resnet18_add, (3, 32, 32)),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_folding_a_network_trained_folded_changes_nothing(name):
    torch.manual_seed(0)
    build, shape = ZOO[name]
    net = _kaiming(build())
    sjf.set_step_mode(net, "m")
    q, report = quantize_model(net, QuantConfig(weight_bits=4, v_bits=8))
    bns = [n for n, m in net.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert sorted(bn for _, bn in report.folded) == sorted(bns)   # every pair trains folded
    x = (torch.rand(4, 4, *shape) > 0.7).float()
    _train(q, x, steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldWarning)   # folding must change nothing
        folded, fold_report = fold_batchnorm(q, data=x, return_report=True)
    assert fold_report.layers and not fold_report.changed()
    assert all(f.codes_changed == 0 and f.output_change == 0 for f in fold_report.layers)
    before = dict(q.named_modules())
    for lname, m in folded.named_modules():
        if hasattr(m, "weight_quant") and m.weight_quant is not None:
            assert torch.equal(_codes(m), _codes(before[lname])), lname
    y_trained, spikes_trained = neuron_outputs(q, x)
    y_folded, spikes_folded = neuron_outputs(folded, x)
    silent = [k for k, s in spikes_trained.items() if float(s.sum()) == 0]
    assert not silent, f"layers that never spike check nothing: {silent}"
    assert torch.equal(y_trained, y_folded)
    for k in spikes_trained:
        assert torch.equal(spikes_trained[k], spikes_folded[k]), k
    desc = to_integer(folded, input_shape=shape)
    agreement = compare_integer(folded, x, desc)
    assert agreement.exact and agreement.samples == 1.0 and not agreement.silent_layers


def test_the_three_forms_of_a_folded_layer():
    """Eval = the folded layer; training = batch statistics on Q(W')x/s; frozen = eval form."""
    torch.manual_seed(0)
    conv = snnquant.nn.QuantConv2d(3, 4, 3, padding=1, bias=True, weight_quant=4)
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.3, 0.3)
        bn.running_var.uniform_(0.5, 2.0)
        bn.num_batches_tracked.fill_(5)
    conv.attach_batchnorm(bn, bias_bits=16)
    net = nn.Sequential(conv, bn)
    x = torch.randn(8, 3, 6, 6)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    w_fold = conv.weight * scale.reshape(-1, 1, 1, 1)
    net.eval()
    with torch.no_grad():
        y = net(x)
        expected = conv._conv_forward(x, conv.weight_quant.quantize(w_fold), conv.quantized_bias())
        assert torch.equal(y, expected)
        b_fold = (conv.bias - bn.running_mean) * scale + bn.bias
        assert torch.allclose(conv.quantized_bias(), b_fold, atol=float(
            conv.weight_quant.grid().step))
    # training: batch statistics normalise Q(W') x / s + b
    net.train()
    mean_before = bn.running_mean.clone()
    out = net(x)
    z = conv._conv_forward(x, conv.weight_quant.quantize(w_fold), None) / scale.reshape(-1, 1, 1) \
        + conv.bias.reshape(-1, 1, 1)
    ref = nn.functional.batch_norm(z.detach(), None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
    assert torch.allclose(out, ref, atol=1e-5)
    assert not torch.equal(bn.running_mean, mean_before)   # statistics update
    out.sum().backward()
    assert conv.weight.grad is not None and bn.weight.grad is not None
    # frozen: training runs the deployed layer, statistics stay
    assert snnquant.freeze_batchnorm(net) == 1
    mean_frozen = bn.running_mean.clone()
    with torch.no_grad():
        y_train = net(x)
        net.eval()
        y_eval = net(x)
    assert torch.equal(y_train, y_eval) and torch.equal(bn.running_mean, mean_frozen)


def test_a_state_dict_saved_before_folded_training_loads_and_folds_as_today():
    torch.manual_seed(0)
    old, _ = quantize_model(csnn(), QuantConfig(weight_bits=2, v_bits=4, fold_batchnorm=False))
    x = (torch.rand(4, 4, 2, 16, 16) > 0.7).float()
    _train(old, x, steps=2)
    state = old.state_dict()
    assert not any(k.endswith("fold_frozen") for k in state)
    new, report = quantize_model(csnn(), QuantConfig(weight_bits=2, v_bits=4))
    assert report.folded
    new.load_state_dict(state)          # strict: every key matches
    assert not snnquant.nn.folded_batchnorms(new)
    assert type(new[1]) is layer.BatchNorm2d and new[0].batchnorm is None
    new.eval()
    with pytest.warns(FoldWarning, match=r"layer '0' \(\d+ of 144 weight codes"):
        a = fold_batchnorm(old)
    with pytest.warns(FoldWarning):
        b = fold_batchnorm(new)
    for (n, p), (_, p2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, p2), n


def test_a_state_dict_of_a_network_trained_folded_round_trips(tmp_path):
    torch.manual_seed(0)
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=2, v_bits=4))
    x = (torch.rand(4, 4, 2, 16, 16) > 0.7).float()
    _train(q, x, steps=2)
    snnquant.freeze_batchnorm(q)
    snnquant.save_checkpoint(q.state_dict(), tmp_path / "m.pt")
    again, _ = quantize_model(csnn(), QuantConfig(weight_bits=2, v_bits=4))
    again.load_state_dict(snnquant.load_checkpoint(tmp_path / "m.pt"))
    assert all(bn.frozen for bn in snnquant.nn.folded_batchnorms(again))
    y1, _ = neuron_outputs(q.eval(), x)
    y2, _ = neuron_outputs(again.eval(), x)
    assert torch.equal(y1, y2)


def test_quantize_model_reports_what_is_not_folded_during_training():
    torch.manual_seed(0)
    _, report = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8, fold_batchnorm=False))
    assert not report.folded
    reasons = {s.name: s.reason for s in report.skipped}
    assert "QuantConfig.fold_batchnorm is False" in reasons["1"]
    _, report = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8,
                                                   overrides={"9": {"fold_batchnorm": False}}))
    assert [bn for _, bn in report.folded] == ["1", "5"] and "10" in {s.name for s in report.skipped}
    with pytest.raises(TypeError, match="fold_batchnorm must be True or False, got 'yes'"):
        QuantConfig(fold_batchnorm="yes")


def test_fold_warns_naming_the_layers_it_changes_and_measures_outputs():
    torch.manual_seed(0)
    q, _ = quantize_model(_kaiming(csnn()), QuantConfig(weight_bits=2, v_bits=4,
                                                        fold_batchnorm=False))
    x = (torch.rand(4, 4, 2, 16, 16) > 0.7).float()
    _train(q, x, steps=2)
    with pytest.warns(FoldWarning, match=r"changed the network: layer '0' .*layer '4'"):
        _, report = fold_batchnorm(q, data=x, return_report=True)
    by_name = {f.name: f for f in report.layers}
    assert by_name["0"].batchnorm == "1" and by_name["0"].codes_changed > 0
    assert by_name["0"].output_change > 0 and report.measured == ""
    with pytest.warns(FoldWarning):
        _, report = fold_batchnorm(q, return_report=True)
    assert report.measured == "no data given" and report.layers[0].output_change is None
    assert "codes changed" in str(report)
    with pytest.raises(TypeError, match="data must be a tensor"):
        fold_batchnorm(q, data=[1, 2])


def test_compare_integer_warns_on_a_silent_network():
    torch.manual_seed(0)
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    x = (torch.rand(4, 2, 2, 16, 16) > 0.7).float()
    folded = fold_batchnorm(_train(q, x, steps=1))
    silent = torch.zeros_like(x)
    with pytest.warns(SilentNetworkWarning, match=r"never spiked on these 2 samples.*: 2, 6"):
        report = compare_integer(folded, silent)
    assert report.exact and {"2", "6"} <= set(report.silent_layers)
    # a spiking network: no warning
    active, _ = quantize_model(_kaiming(csnn()), QuantConfig(weight_bits=4, v_bits=8))
    folded = fold_batchnorm(_train(active, x, steps=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SilentNetworkWarning)
        assert not compare_integer(folded, x).silent_layers


def test_ptq_calibrates_the_folded_weights_and_folding_then_changes_nothing():
    """PTQ of a trained float network: calibrate sees W * gamma / sigma, so what is calibrated is
    what fold_batchnorm deploys (no weight code changes, no FoldWarning)."""
    torch.manual_seed(0)
    net = _kaiming(csnn())
    x = (torch.rand(4, 8, 2, 16, 16) > 0.7).float()
    net.train()
    sjf.reset_net(net)
    net(x)                                   # BatchNorm statistics of a "trained" network
    with torch.no_grad():
        net[1].weight.fill_(8.0)             # W' = 8 W / sigma: calibrating W would be 8x off
    q, report = quantize_model(net.eval(), QuantConfig(weight_bits=4, v_bits=8))
    assert report.folded
    snnquant.calibrate(q, [x], method="minmax")
    scale = q[1].weight / torch.sqrt(q[1].running_var + q[1].eps)
    folded_peak = (q[0].weight * scale.reshape(-1, 1, 1, 1)).abs().max()
    step = float(q[0].weight_quant.grid().step.max())
    # the calibrated range covers the folded weight (7 levels of 4-bit signed), not W
    assert 0.5 * float(folded_peak) <= step * 7 <= 2 * float(folded_peak)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldWarning)
        folded = fold_batchnorm(q, data=x)
    y1, _ = neuron_outputs(q, x)
    y2, _ = neuron_outputs(folded, x)
    assert torch.equal(y1, y2)


def test_quantize_model_folds_blocks_torch_fx_cannot_trace_given_an_example_input():
    """A shape check in a block's forward and blocks in an nn.ModuleList (spiking transformers):
    with example_input, quantize_model trains them folded, and fold_batchnorm changes nothing."""
    from test_capture import _input, _net
    x = _input()
    _, report = quantize_model(_net(), QuantConfig(weight_bits=4, v_bits=8))
    assert [bn for _, bn in report.folded] == ["stem.1"]      # torch.fx stops at the blocks
    assert "not captured" in {s.name: s.reason for s in report.skipped}["blocks.0.bn"]
    q, report = quantize_model(_net(), QuantConfig(weight_bits=4, v_bits=8), example_input=x)
    assert [bn for _, bn in report.folded] == ["stem.1", "blocks.0.bn", "blocks.1.bn"]
    _train(q, x, steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldWarning)
        folded = fold_batchnorm(q, example_input=x, data=x)
    y1, _ = neuron_outputs(q, x)
    y2, _ = neuron_outputs(folded, x)
    assert torch.equal(y1, y2)


def test_binary_and_ternary_weights_fold_after_training():
    """+-alpha does not follow the folded weight's scale: such layers are not folded during
    training (the statistics would feed back into the scale and diverge), and say why."""
    for cfg in (QuantConfig(weight_bits=1, v_bits=8),
                QuantConfig(weight_bits=2, weight_quantizer="ternary", v_bits=8)):
        _, report = quantize_model(csnn(), cfg)
        assert not report.folded
        assert "outputs +-alpha whatever the scale" in \
            {s.name: s.reason for s in report.skipped}["1"]


def test_a_diverged_network_is_refused_by_name_when_folded():
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8))
    with torch.no_grad():
        q[5].running_var.fill_(float("nan"))
    with pytest.raises(snnquant.export.ExportError, match=r"layer '4': its folded bias is not "
                                                          r"finite"):
        fold_batchnorm(q.eval())


def test_a_float_folded_bias_trains_and_an_old_state_dict_detaches_it():
    """bias_bits=None: the folded bias trains in float (fold_batchnorm then snaps it to the grid
    and says so), and a state dict saved without folding still detaches the pair."""
    torch.manual_seed(0)
    q, report = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8, bias_bits=None))
    assert report.folded and q[1].folded_bias_quant is None
    old, _ = quantize_model(csnn(), QuantConfig(weight_bits=4, v_bits=8, bias_bits=None,
                                                fold_batchnorm=False))
    q.load_state_dict(old.state_dict())
    assert q[0].batchnorm is None and type(q[1]) is layer.BatchNorm2d


def test_a_batchnorm_whose_gamma_is_zero_trains_folded():
    """A zero-initialised BatchNorm weight (MS-ResNet's last BatchNorm of a block, torchvision's
    zero_init_residual) makes the folded weight 0 and its scale 0: the layer must not divide by
    it. The channel's output is then beta, and gamma gets the gradient of the float network."""
    torch.manual_seed(0)
    q, report = quantize_model(_kaiming(csnn()), QuantConfig(weight_bits=4, v_bits=8))
    assert report.folded
    conv, bn = q[0], q[0].batchnorm
    with torch.no_grad():
        bn.weight[:3].zero_()
    x = (torch.rand(4, 6, 2, 16, 16) > 0.5).float()
    sjf.reset_net(q)
    q.train()
    y = conv(x)
    assert torch.isfinite(y).all()
    out = bn(y)
    assert torch.allclose(out[:, :, :3], bn.bias[:3].reshape(1, 1, 3, 1, 1).expand_as(out[:, :, :3]))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    assert torch.isfinite(bn.weight.grad).all() and (bn.weight.grad[:3] != 0).all()
    _train(q, x, steps=2)
    assert all(torch.isfinite(p).all() for p in q.parameters())
    assert all(torch.isfinite(b).all() for b in q.buffers() if b.is_floating_point())
    fold_batchnorm(q.eval())
