"""The deployability report at quantize time (issue 44): what the export would refuse after
training is said before it, with the fix, by the export's own checks; the input_max default;
the one-call float output of the integer network."""

import functools
import warnings

import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from snnquant import QuantConfig, quantize_model
from snnquant.deployability import DeployabilityWarning, deployability_report
from snnquant.export import (ExportError, FoldWarning, IntegerSNN, compare_integer,
                             fold_batchnorm, input_max_of, to_c, to_integer)

T, N = 4, 2
CONFIG = dict(weight_bits=4, v_bits=8)


def _zoo():
    """SpikingJelly's four zoo networks at their defaults (MS-ResNet's T = 6 and tau = 4/3), at
    the small sizes of benchmarks/zoo_deploy.py; ``build(**fixes)`` takes the report's fixes."""
    from spikingjelly.activation_based.model import (ms_resnet, qkformer,
                                                     spike_driven_transformer, spikformer)
    return {
        "SpikeDrivenTransformer": (lambda **kw: spike_driven_transformer.SpikeDrivenTransformer(
            num_classes=10, embed_dims=32, num_heads=2, depths=1, **kw), (3, 32, 32)),
        "Spikformer": (lambda **kw: spikformer.Spikformer(
            img_size_h=16, img_size_w=16, patch_size=4, num_classes=10, embed_dims=32,
            num_heads=2, depths=1, **kw), (3, 16, 16)),
        "QKFormer": (lambda **kw: qkformer.QKFormer(
            num_classes=10, embed_dims=32, num_heads=(1, 2, 2), depths=(1, 1, 1), **kw),
            (3, 32, 32)),
        "MSResNet": (lambda **kw: ms_resnet.MSResNet(
            num_classes=10, layers=(1, 1, 1), base_channels=16, stem_kernel_size=3,
            stem_stride=1, **kw), (3, 16, 16)),
    }


@functools.lru_cache(maxsize=None)
def _zoo_deploy():
    from conftest import load_script
    return load_script("benchmarks/zoo_deploy.py", "zoo_deploy_deployability")


def _keep_spiking(net):
    """Kaiming weights and BatchNorm statistics of one batch (benchmarks/zoo_deploy.py's
    keep_spiking), so that every layer spikes and the agreement checks something."""
    return _zoo_deploy().keep_spiking(net)


def _build(build, **fixes):
    torch.manual_seed(0)
    net = _keep_spiking(build(**fixes))
    sjf.set_step_mode(net, "m")
    return net


def _input(net, shape):
    g = torch.Generator().manual_seed(1)
    steps = getattr(net, "T", T)
    return (torch.rand((steps, N) + shape, generator=g) * 3).floor()   # counts 0..2


def _quantize(net, x, config=CONFIG):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeployabilityWarning)
        return quantize_model(net, QuantConfig(**config), example_input=x)


def _train(q, x):
    """Two Adam steps, then the BatchNorm statistics of the batch."""
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    q.train()
    for _ in range(2):
        sjf.reset_net(q)
        out = q(x)
        loss = (out[0] if isinstance(out, (tuple, list)) else out).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    sjf.reset_net(q)
    with torch.no_grad():
        q(x)
    sjf.reset_net(q)
    return q.eval()


def _fixes(report):
    """The constructor arguments and reference dtype the report's fixes name."""
    kwargs, dtype = {}, torch.float32
    for b in report.blockers:
        if b.check == "tau":
            kwargs["tau"] = float(b.fix.split("tau=")[1].split(" ")[0])
        elif b.check == "accumulator":
            assert "reference_dtype=torch.float64" in b.fix
            dtype = torch.float64
        elif b.check == "time_mean":
            kwargs["T"] = int(b.fix.split("T=")[1].split(" ")[0])
        else:
            raise AssertionError(f"a blocker the walk has no fix for: {b}")
    return kwargs, dtype


def _export_exactly(q, x, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FoldWarning)
        folded = fold_batchnorm(q, example_input=x)
    folded = folded.to(dtype)
    desc = to_integer(folded, example_input=x.to(dtype), reference_dtype=dtype)
    agreement = compare_integer(folded, x.to(dtype), desc)
    return folded, desc, agreement


@pytest.mark.parametrize("bits", [(4, 8), (2, 4)], ids=["W4V8", "W2V4"])
@pytest.mark.parametrize("name", ["SpikeDrivenTransformer", "Spikformer", "QKFormer", "MSResNet"])
def test_zoo_walk_report_predicts_every_refusal_and_its_fixes_deploy(name, bits):
    build, shape = _zoo()[name]
    net = _build(build)
    x = _input(net, shape)
    config = dict(weight_bits=bits[0], v_bits=bits[1])
    q, rep = _quantize(net, x, config)
    report = rep.deployability
    assert report is not None and report.input_max == int(x.max())
    if report.ok:
        folded, desc, agreement = _export_exactly(_train(q, x), x, torch.float32)
        assert agreement.exact and desc.exact, (name, str(agreement))
        return
    # the trained network is refused by one of the checks the report named before training
    with pytest.raises(ExportError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore", FoldWarning)
        trained = fold_batchnorm(_train(q, x), example_input=x)
        to_integer(trained, example_input=x)
    assert getattr(err.value, "check", None) in report.checks(), (str(err.value), str(report))
    # applying the fixes the report names deploys it exactly
    kwargs, dtype = _fixes(report)
    net = _build(build, **kwargs)
    x = _input(net, shape)
    q, rep = _quantize(net, x, config)
    again = deployability_report(q, x, reference_dtype=dtype, quant_report=rep)
    assert again.ok, str(again)
    folded, desc, agreement = _export_exactly(_train(q, x), x, dtype)
    assert agreement.exact and desc.exact, (name, str(agreement))


def test_msresnet_defaults_name_the_exact_tau_and_float64():
    build, shape = _zoo()["MSResNet"]
    net = _build(build)
    x = _input(net, shape)
    with pytest.warns(DeployabilityWarning, match=r"tau=2\.0"):
        _, rep = quantize_model(net, QuantConfig(**CONFIG), example_input=x)
    report = rep.deployability
    taus = [b for b in report.blockers if b.check == "tau"]
    assert taus and all("tau=2.0" in b.fix and "leak_bits" in b.fix for b in taus)
    assert "MSResNet(..., tau=2.0)" in taus[0].reason
    assert str(report) in str(rep)


def test_nir_destination_names_every_operation_nir_lacks():
    build, shape = _zoo()["Spikformer"]
    net = _build(build)
    x = _input(net, shape)
    with pytest.warns(DeployabilityWarning):
        _, rep = quantize_model(net, QuantConfig(**CONFIG), example_input=x, destination="nir")
    nir = [b for b in rep.deployability.blockers if b.check == "nir"]
    assert any("MatMulOp" in b.reason for b in nir) and len(nir) > 1
    with pytest.raises(ValueError, match="destination"):
        quantize_model(net, QuantConfig(**CONFIG), example_input=x, destination="fpga")


def test_nmnist_frames_report_the_mean_and_the_crop():
    build, _ = _zoo()["SpikeDrivenTransformer"]
    net = _build(build, in_channels=2)
    x = _input(net, (2, 34, 34))
    _, rep = _quantize(net, x)
    means = [b for b in rep.deployability.blockers if b.check == "mean"]
    assert means and "9 values" in means[0].reason and "32x32" in means[0].fix
    q, rep = _quantize(_build(build, in_channels=2), x[..., 1:33, 1:33])
    assert rep.deployability.ok, str(rep.deployability)


def test_quantize_model_warns_without_example_input_and_fold_names_that_step():
    build, shape = _zoo()["SpikeDrivenTransformer"]
    net = _build(build)
    x = _input(net, shape)
    with pytest.warns(UserWarning, match=r"example_input=x") as caught:
        q, rep = quantize_model(net, QuantConfig(weight_bits=2, v_bits=4))
    text = " ".join(str(w.message) for w in caught if "will not train folded" in str(w.message))
    assert "'blocks.0.attn.q_conv' -> 'blocks.0.attn.q_bn'" in text
    assert rep.deployability is None
    q = _train(q, x)
    with pytest.warns(FoldWarning) as caught:
        fold_batchnorm(q, example_input=x)
    changed = [str(w.message) for w in caught if "changed the network" in str(w.message)]
    assert changed, [str(w.message) for w in caught]
    assert "pass example_input=x to quantize_model" in changed[0]
    assert "QuantConfig(fold_batchnorm=True)" not in changed[0]


def _counting_net():
    return nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), neuron.IFNode(),
                         layer.Flatten(), layer.Linear(4 * 8 * 8, 10), neuron.IFNode())


def test_input_max_defaults_to_the_example_input_and_its_refusal_says_so():
    torch.manual_seed(0)
    net = _counting_net()
    sjf.set_step_mode(net, "m")
    x = (torch.rand(T, N, 2, 8, 8) * 7).floor()
    q, _ = quantize_model(net, QuantConfig(**CONFIG))
    with torch.no_grad():
        q(x)
    sjf.reset_net(q)
    q.eval()
    assert to_integer(q, example_input=x).input_max == int(x.max()) == input_max_of(x)
    assert to_integer(q, example_input=x, input_max=3).input_max == 3
    assert to_integer(q).input_max > 1000     # the first layer's bound: documented, large
    # a refusal that input_max causes says so
    with pytest.raises(ExportError, match=r"input_max=\d+ is too large") as err:
        to_integer(q, input_max=2 ** 30)
    assert "input_max" in str(err.value) and err.value.check == "accumulator"


def test_accumulator_refusal_names_input_max_and_float64():
    build, shape = _zoo()["MSResNet"]
    net = _build(build, tau=2.0, T=4)
    x = _input(net, shape)
    q, _ = _quantize(net, x)
    q = fold_batchnorm(_train(q, x), example_input=x)
    with pytest.raises(ExportError) as err:
        to_integer(q, example_input=x * 0 + 1000)
    text = str(err.value)
    assert err.value.check == "accumulator"
    assert "input_max=1000, the largest value of example_input" in text
    assert "reference_dtype=torch.float64" in text


# --- one call from the integer output to the float model's -------------------------------------

class _TimeMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(layer.Linear(6, 8), neuron.LIFNode(tau=2.0),
                                  layer.Linear(8, 3))

    def forward(self, x):
        return self.body(x).mean(0)


@pytest.mark.parametrize("kind", ["per_step", "time_mean", "sum_pool"])
def test_float_output_in_one_call(kind):
    torch.manual_seed(0)
    if kind == "per_step":
        net = nn.Sequential(layer.Linear(6, 8), neuron.IFNode(), layer.Linear(8, 3))
    elif kind == "time_mean":
        net = _TimeMean()
    else:
        net = nn.Sequential(layer.Linear(6, 8), neuron.IFNode(), layer.VotingLayer(4))
    sjf.set_step_mode(net, "m")
    x = (torch.rand(T, N, 6) * 3).floor()
    q, _ = quantize_model(net, QuantConfig(**CONFIG))
    with torch.no_grad():
        q(x)
    sjf.reset_net(q)
    q.eval()
    desc = to_integer(q, example_input=x)
    with torch.no_grad():
        sjf.reset_net(q)
        expected = q(x).double()
    sim = IntegerSNN(desc)
    got = sim.float_output(x.long())
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=0, atol=1e-6), (got - expected).abs().max()
    steps = sim(x.long(), per_step=True)
    assert steps.shape[:2] == (T, N)
    assert torch.equal(desc.float_output(sim(x.long()), steps=T), got)   # from the output
    if kind == "time_mean":
        assert desc.output_time_mean
        per_step = sim.float_output(x.long(), per_step=True)
        assert per_step.shape == (T, N, 3)
        assert torch.allclose(per_step.mean(0), got)
        with pytest.raises(ValueError, match="steps"):
            desc.float_output(sim(x.long()))


def test_approximate_export_says_so_in_the_c_header(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(layer.Linear(6, 8), neuron.LIFNode(tau=1.5), layer.Linear(8, 3))
    sjf.set_step_mode(net, "m")
    x = (torch.rand(T, N, 6) * 3).floor()
    q, _ = quantize_model(net, QuantConfig(**CONFIG))
    with torch.no_grad():
        q(x)
    q.eval()
    with pytest.raises(ExportError, match=r"tau=2\.0"):
        to_integer(q, example_input=x)
    desc = to_integer(q, example_input=x, leak_bits=12)
    assert not desc.exact and "APPROXIMATE" in str(desc)
    to_c(desc, tmp_path, "snn", input_shape=(6,))
    assert "APPROXIMATE" in (tmp_path / "snn.h").read_text()
    assert "not guaranteed" in str(compare_integer(q, x, desc))


def test_fold_warning_names_example_input_for_a_model_rebuilt_from_its_state_dict():
    """Without quantize_model's record on the BatchNorms (a model rebuilt and loaded), the
    FoldWarning still names the step that was missed: the pairs torch.fx cannot find."""
    build, shape = _zoo()["SpikeDrivenTransformer"]
    x = _input(_build(build), shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        q, _ = quantize_model(_build(build), QuantConfig(weight_bits=2, v_bits=4))
        state = _train(q, x).state_dict()
        rebuilt, _ = quantize_model(_build(build), QuantConfig(weight_bits=2, v_bits=4))
    rebuilt.load_state_dict(state)
    for m in rebuilt.modules():
        assert not hasattr(m, "_snnquant_fold_missed") or m.__dict__.pop("_snnquant_fold_missed")
    with pytest.warns(FoldWarning) as caught:
        fold_batchnorm(rebuilt.eval(), example_input=x)
    changed = [str(w.message) for w in caught if "changed the network" in str(w.message)]
    assert changed and "pass example_input=x to quantize_model" in changed[0]
    assert "fold_batchnorm=True" not in changed[0]


def test_report_without_quant_report_names_a_batchnorm_fold_batchnorm_refuses():
    torch.manual_seed(0)
    net = nn.Sequential(layer.BatchNorm2d(2), layer.Conv2d(2, 4, 3, padding=1), neuron.IFNode(),
                        layer.Flatten(), layer.Linear(4 * 8 * 8, 10), neuron.IFNode())
    sjf.set_step_mode(net, "m")
    x = (torch.rand(T, N, 2, 8, 8) * 3).floor()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeployabilityWarning)
        q, rep = quantize_model(net, QuantConfig(**CONFIG), example_input=x)
    assert [b.layer for b in rep.deployability.blockers if b.check == "batchnorm"] == ["0"]
    alone = deployability_report(q, x)
    assert [b.layer for b in alone.blockers if b.check == "batchnorm"] == ["0"]
    with pytest.raises(ValueError, match="destination"):
        deployability_report(q, x, "fpga")
    with pytest.raises(TypeError, match="example_input"):
        deployability_report(q, [x])


def test_chip_destination_reports_the_chips_refusal():
    torch.manual_seed(0)
    net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1), neuron.LIFNode(tau=2.0),
                        layer.Flatten(), layer.Linear(4 * 8 * 8, 10), neuron.LIFNode(tau=2.0))
    sjf.set_step_mode(net, "m")
    x = (torch.rand(T, N, 2, 8, 8) * 3).floor()
    with pytest.warns(DeployabilityWarning, match="xylo"):
        _, rep = quantize_model(net, QuantConfig(**CONFIG), example_input=x, destination="xylo")
    assert rep.deployability.destination == "xylo"
    assert rep.deployability.checks() == ["chip"]
