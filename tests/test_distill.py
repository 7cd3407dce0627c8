"""Distillation from the full-precision network (issue 48 §1, §5): the loss, the frozen teacher,
exact deployment of the distilled student, and every kind of network quantize_model handles."""
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron

from conftest import csnn, load_script
from snnquant import QuantConfig, quantize_model
from snnquant.distill import Distiller, distillation_loss, freeze_teacher, rate_readout
from snnquant.export import FoldWarning, compare_integer, fold_batchnorm, to_integer


def _kaiming(net):
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
    return net


def _pair(bits=(2, 4)):
    torch.manual_seed(0)
    teacher = _kaiming(csnn(8))
    student, _ = quantize_model(teacher, QuantConfig(weight_bits=bits[0], v_bits=bits[1]))
    x = (torch.rand(4, 6, 2, 16, 16, generator=torch.Generator().manual_seed(2)) > 0.6).float()
    y = torch.arange(6) % 10
    return teacher, student, x, y


def _step(distiller, opt, x, y):
    out = distiller(x)
    rate = rate_readout(out)
    loss = distiller.loss(out, F.mse_loss(rate, F.one_hot(y, rate.shape[-1]).float()))
    opt.zero_grad()
    loss.backward()
    opt.step()
    sjf.reset_net(distiller.student)
    return loss


def test_distillation_loss_is_the_hand_computed_hinton_loss():
    s = torch.tensor([[0.2, 0.5, 0.1], [0.9, 0.0, 0.3]])
    t = torch.tensor([[0.1, 0.8, 0.0], [0.7, 0.2, 0.2]])
    tau = 0.5
    total = 0.0
    for n in range(2):
        zs = [math.exp(v / tau) for v in s[n].tolist()]
        zt = [math.exp(v / tau) for v in t[n].tolist()]
        q = [v / sum(zs) for v in zs]
        p = [v / sum(zt) for v in zt]
        total += sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q))
    expected = tau ** 2 * total / 2
    assert distillation_loss(s, t, tau).item() == pytest.approx(expected, rel=1e-6)
    assert distillation_loss(t, t, tau).item() == pytest.approx(0.0, abs=1e-7)
    # the gradient: tau / N * (q - p)
    s.requires_grad_(True)
    distillation_loss(s, t, tau).backward()
    q, p = F.softmax(s.detach() / tau, -1), F.softmax(t / tau, -1)
    assert torch.allclose(s.grad, tau / 2 * (q - p), atol=1e-6)


def test_the_mixed_loss_is_the_weighted_sum_of_its_terms():
    teacher, student, x, y = _pair()
    d = Distiller(student, teacher, temperature=0.3, kd_weight=0.25, align="firing_rate",
                  align_weight=2.0)
    out = d(x)
    task = F.mse_loss(out.mean(0), F.one_hot(y, 10).float())
    loss = d.loss(out, task)
    kd = distillation_loss(out.mean(0), d.teacher_output.mean(0), 0.3)
    rates = []
    for name in ("2", "6", "10"):          # the three LIF neurons of the CSNN, by name
        s = d._student_rec[("firing_rate", name)]
        t = d._teacher_rec[("firing_rate", name)]
        rates.append(float((s.detach().mean(0) - t.mean(0)).pow(2).mean()))
    expected = 0.75 * float(task) + 0.25 * float(kd) + 2.0 * sum(rates) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert set(d.pairs["firing_rate"]) == {"2", "6", "10"}
    assert d.last["kd"] == pytest.approx(float(kd), rel=1e-6)


@pytest.mark.parametrize("align", [None, "firing_rate", "membrane"])
def test_the_teacher_stays_bit_identical_through_a_training_step(align):
    teacher, student, x, y = _pair()
    teacher.train()   # the distiller must put it in eval mode itself
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    d = Distiller(student, teacher, temperature=0.2, kd_weight=0.5, align=align)
    opt = torch.optim.Adam(student.parameters(), lr=1e-2)
    student_before = {k: v.clone() for k, v in student.state_dict().items()}
    for _ in range(2):
        _step(d, opt, x, y)
    after = teacher.state_dict()
    assert before.keys() == after.keys()
    bn_buffers = [k for k in before if "running" in k or "num_batches" in k]
    assert bn_buffers
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    changed = [k for k, v in student.state_dict().items()
               if v.is_floating_point() and not torch.equal(v, student_before[k])]
    assert changed, "the student did not train"


def test_a_distilled_student_folds_unchanged_and_runs_exactly_in_integers():
    teacher, student, x, y = _pair()
    d = Distiller(student, teacher, temperature=0.2, kd_weight=0.5,
                  align=["firing_rate", "membrane"], align_weight=0.5)
    opt = torch.optim.Adam(student.parameters(), lr=5e-3)
    for _ in range(3):
        _step(d, opt, x, y)
    d.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldWarning)
        folded, report = fold_batchnorm(student.eval(), data=x, return_report=True)
    assert report.layers and not report.changed()
    desc = to_integer(folded, input_shape=(2, 16, 16))
    agreement = compare_integer(folded, x, desc)
    assert agreement.exact and agreement.samples == 1.0 and not agreement.silent_layers


def test_bad_options_are_refused_by_name():
    teacher, student, _, _ = _pair()
    with pytest.raises(ValueError, match=r"temperature must be a number > 0, got 0"):
        Distiller(student, teacher, temperature=0)
    with pytest.raises(ValueError, match=r"kd_weight must be in \[0, 1\], got 1.5"):
        Distiller(student, teacher, kd_weight=1.5)
    with pytest.raises(ValueError, match=r"align must be None or one of .* got 'rates'"):
        Distiller(student, teacher, align="rates")
    with pytest.raises(ValueError, match=r"align='attention': no spiking self-attention"):
        Distiller(student, teacher, align="attention")
    with pytest.raises(ValueError, match=r"layers: the teacher has no module 'nope'"):
        Distiller(student, teacher, align="firing_rate", layers={"2": "nope"})
    with pytest.raises(ValueError, match=r"same module"):
        Distiller(teacher, teacher)
    with pytest.raises(ValueError, match=r"temperature must be a number > 0"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 3), -1.0)
    with pytest.raises(TypeError, match=r"teacher must be an nn.Module"):
        freeze_teacher("run")


ZOO = load_script("benchmarks/zoo_deploy.py")


@pytest.mark.parametrize("name, align", [
    ("parametric_lif_net.NMNISTNet", "firing_rate"),
    ("spikformer.Spikformer", "attention"),
    ("spike_driven_transformer.SpikeDrivenTransformer", "attention"),
])
def test_distillation_trains_zoo_networks_and_transformers(name, align):
    """The model zoo and both spiking self-attentions: the teacher is untouched, the student's
    parameters get gradients, and the attention maps are matched by name."""
    torch.manual_seed(0)
    build, shape, _ = ZOO.networks()[name]
    teacher = ZOO.keep_spiking(build())
    sjf.set_step_mode(teacher, "m")
    x = (torch.rand((ZOO.T, 2) + shape, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    student, _ = quantize_model(teacher, QuantConfig(weight_bits=4, v_bits=8), example_input=x)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    d = Distiller(student, teacher, temperature=2.0, kd_weight=0.5, align=align)
    if align == "attention":
        assert d.pairs["attention"] and all(s == t for s, t in d.pairs["attention"].items())
        assert all("attn" in s for s in d.pairs["attention"])
    student.train()
    out = d(x)
    logits = out.float().mean(0) if out.dim() == 3 else out.float()
    loss = d.loss(out, F.cross_entropy(logits, torch.tensor([1, 2])))
    assert d.last[align] > 0
    loss.backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0)
               for p in student.parameters())
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]), k
    sjf.reset_net(student)


def test_distillation_into_chip_layers_matches_their_source_neurons():
    from snnquant.targets import quantize_for_xylo
    torch.manual_seed(0)
    teacher = nn.Sequential(layer.Flatten(step_mode="m"), layer.Linear(16, 24, step_mode="m"),
                            neuron.LIFNode(tau=2.0, v_reset=None, step_mode="m"),
                            layer.Linear(24, 4, step_mode="m"),
                            neuron.LIFNode(tau=4.0, v_reset=None, step_mode="m"))
    student = quantize_for_xylo(teacher)
    d = Distiller(student, teacher, temperature=1.0, kd_weight=0.5, align="firing_rate")
    assert list(d.pairs["firing_rate"].values()) == ["2", "4"]
    x = torch.randint(0, 4, (6, 3, 16), generator=torch.Generator().manual_seed(3)).float()
    out = d(x)
    loss = d.loss(out, F.cross_entropy(out.float().mean(0), torch.tensor([0, 1, 2])))
    loss.backward()
    assert any(p.grad is not None for p in student.parameters())
    with pytest.raises(ValueError, match=r"align='membrane': the student's '0' is a chip layer"):
        Distiller(student, teacher, align="membrane")
