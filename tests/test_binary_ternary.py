"""Binary and ternary weights: values, gradients, configuration and exact integer export."""
import pytest
import torch
import torch.nn as nn
from spikingjelly.activation_based import functional as sjf
from spikingjelly.activation_based import layer, neuron, surrogate

import snnquant
from snnquant import QuantConfig, quantize_model
from snnquant import functional as QF
from snnquant.nn import BinaryQuantizer, QuantLinear, TernaryQuantizer


def test_binary_values_and_sign_of_zero():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.5])
    assert torch.equal(QF.binary_quantize(x, 0.5), torch.tensor([-0.5, -0.5, 0.5, 0.5, 0.5]))


def test_binary_gradients():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.5], requires_grad=True)
    alpha = torch.tensor(1.0, requires_grad=True)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    (QF.binary_quantize(x, alpha, grad_scale=0.5, clip=None) * g).sum().backward()
    # clip=None: straight-through inside [-alpha, alpha], zero outside
    assert torch.equal(x.grad, torch.tensor([0.0, 2.0, 3.0, 4.0, 0.0]))
    # LSQ step gradient with sign as the rounding: sign(v) - v inside, sign(v) outside
    d = torch.tensor([-1.0, -1.0 + 0.5, 1.0 - 0.0, 1.0 - 0.3, 1.0])
    assert alpha.grad.item() == pytest.approx(0.5 * float((g * d).sum()))


def test_default_clip_range_is_one_whatever_alpha():
    x = torch.tensor([-1.5, -0.9, 0.2, 1.0, 1.2], requires_grad=True)
    QF.binary_quantize(x, 0.1).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))
    x.grad = None
    QF.ternary_quantize(x, 0.1, 0.05, clip=0.5).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="clip"):
        QF.binary_quantize(x, 0.1, clip=0)


def test_ternary_values_and_gradients():
    x = torch.tensor([-2.0, -0.5, 0.1, 0.3, 0.9], requires_grad=True)
    alpha = torch.tensor(1.0, requires_grad=True)
    y = QF.ternary_quantize(x, alpha, 0.35, clip=None)
    assert torch.equal(y.detach(), torch.tensor([-1.0, -1.0, 0.0, 0.0, 1.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0]))
    t = torch.tensor([-1.0, -1.0, 0.0, 0.0, 1.0])
    v = x.detach()
    expected = torch.where(v.abs() <= 1, t - v, torch.sign(v)).sum()
    assert alpha.grad.item() == pytest.approx(float(expected))


def test_binary_quantizer_per_channel_alpha_is_mean_abs():
    w = torch.randn(6, 10)
    q = BinaryQuantizer(alpha="mean", per_channel=True)
    y = q.quantize(w)
    alpha = w.abs().mean(dim=1, keepdim=True)
    assert torch.allclose(y, alpha * torch.where(w >= 0, 1.0, -1.0))
    per_layer = BinaryQuantizer(alpha="mean", per_channel=False).quantize(w)
    assert torch.allclose(per_layer.abs(), w.abs().mean().expand_as(w))
    grid = q.grid()
    assert (grid.qmin, grid.qmax, grid.channel_dim) == (-1, 1, 0) and q.num_bits == 1


def test_learned_alpha_starts_at_mean_abs_and_learns():
    torch.manual_seed(0)
    w = torch.randn(4, 16, requires_grad=True)
    q = BinaryQuantizer(per_channel=True, num_channels=4)
    y = q.quantize(w)
    assert torch.allclose(q.alpha.detach(), w.detach().abs().mean(dim=1))
    y.pow(2).sum().backward()
    assert q.alpha.grad is not None and q.alpha.grad.shape == (4,) and w.grad is not None
    pow2 = BinaryQuantizer(per_channel=True, power_of_two=True)
    a = pow2.grid() if pow2.is_initialized else None
    assert a is None
    pow2.quantize(w)
    s = pow2.grid().step.detach()
    assert torch.equal(s, torch.exp2(torch.round(torch.log2(s))))


def test_ternary_quantizer_twn_threshold_and_alpha():
    torch.manual_seed(0)
    w = torch.randn(3, 50)
    q = TernaryQuantizer(alpha="mean", per_channel=True)
    y = q.quantize(w)
    delta = 0.7 * w.abs().mean(dim=1, keepdim=True)
    keep = w.abs() > delta
    alpha = (w.abs() * keep).sum(dim=1, keepdim=True) / keep.sum(dim=1, keepdim=True)
    assert torch.allclose(y, alpha * torch.sign(w) * keep)
    learned_threshold = TernaryQuantizer(threshold=None, per_channel=False)
    z = learned_threshold.quantize(w)
    a = float(learned_threshold.grid().step.detach())
    assert set(torch.unique(z / a).tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.equal(z == 0, w.abs() <= a / 2)
    with pytest.raises(ValueError, match="threshold"):
        TernaryQuantizer(threshold=-1)
    with pytest.raises(ValueError, match="alpha"):
        BinaryQuantizer(alpha="max")


def test_config_and_layer_level_equivalents():
    net = nn.Sequential(layer.Linear(8, 4), neuron.LIFNode())
    q, _ = quantize_model(net, QuantConfig(weight_bits=1, per_channel=True))
    assert isinstance(q[0].weight_quant, BinaryQuantizer) and q[0].weight_quant.power_of_two
    q, _ = quantize_model(net, QuantConfig(weight_bits=1, weight_quantizer="lsq"))
    assert not q[0].weight_quant.power_of_two and not q[0].weight_quant.per_channel
    q, _ = quantize_model(net, QuantConfig(weight_quantizer="ternary", weight_bits=2))
    assert isinstance(q[0].weight_quant, TernaryQuantizer) and q[0].weight_quant.num_bits == 2
    assert snnquant.summary(q).rows[0]["weight_bits"] == 2
    assert isinstance(QuantLinear(8, 4, weight_quant=1).weight_quant, BinaryQuantizer)
    with pytest.raises(ValueError, match="ternary.*weight_bits must be 2"):
        QuantConfig(weight_quantizer="ternary", weight_bits=4)
    with pytest.raises(ValueError, match="weight_bits=1"):
        QuantConfig(weight_bits=1, weight_quantizer="minmax")
    with pytest.raises(ValueError, match="weight_bits"):
        QuantConfig(weight_bits=0)


def csnn():
    torch.manual_seed(0)
    net = nn.Sequential(
        layer.Conv2d(2, 4, 3, padding=1), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()),
        layer.MaxPool2d(2), layer.Flatten(),
        layer.Linear(4 * 4 * 4, 5), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.ATan()))
    sjf.set_step_mode(net, "m")
    return net


@pytest.mark.parametrize("kind", ["binary", "ternary"])
def test_exact_integer_export_packed_weights(kind, tmp_path):
    from snnquant.export import integer_agreement, load_integer, save_integer, to_integer
    cfg = QuantConfig(weight_bits=1, per_channel=True, v_bits=8) if kind == "binary" else \
        QuantConfig(weight_quantizer="ternary", weight_bits=2, per_channel=True, v_bits=8)
    q, _ = quantize_model(csnn(), cfg)
    x = (torch.rand(6, 8, 2, 8, 8) < 0.4).float() * 2
    snnquant.calibrate(q, [x], freeze=False)  # alpha by its own rule, then trainable
    opt = torch.optim.SGD(q.parameters(), lr=0.05)  # a training step moves alpha off mean|w|
    sjf.reset_net(q)
    q.train()
    q(x).sum().backward()
    opt.step()
    sjf.reset_net(q)
    q.eval()
    desc = to_integer(q)
    op = desc.ops[0]
    bits = 1 if kind == "binary" else 2
    assert op.weight_bits == bits and op.weight_packed is not None
    values = set(torch.unique(op.weight).tolist())
    assert values <= ({-1, 1} if kind == "binary" else {-1, 0, 1})
    assert op.weight_packed.numel() == -(-op.weight.numel() * bits // 8)
    assert float(integer_agreement(q, x, desc)) == 1.0
    save_integer(desc, tmp_path / "net.safetensors")
    back = load_integer(tmp_path / "net.safetensors")
    assert torch.equal(back.ops[0].weight, op.weight)
    assert float(integer_agreement(q, x, back)) == 1.0


def test_pack_one_bit_round_trip_and_refuses_zero():
    from snnquant.export import pack_int, unpack_int
    v = torch.tensor([1, -1, -1, 1, 1, 1, -1, 1, -1, 1], dtype=torch.int8)
    packed = pack_int(v, 1)
    assert packed.numel() == 2 and int(packed[0]) == 0b10111001
    assert torch.equal(unpack_int(packed, 1, (10,)), v)
    with pytest.raises(ValueError, match="-1 or \\+1"):
        pack_int(torch.tensor([1, 0, -1]), 1)


def test_calibrate_sets_binary_alpha_by_its_own_rule():
    q, _ = quantize_model(csnn(), QuantConfig(weight_bits=1, weight_quantizer="lsq",
                                              per_channel=True, v_bits=8))
    with torch.no_grad():
        q[0].weight_quant.alpha.fill_(3.0)
    report = snnquant.calibrate(q, [torch.rand(4, 2, 2, 8, 8)], method="minmax")
    w = q[0].weight.detach()
    assert torch.allclose(q[0].weight_quant.alpha, w.abs().mean(dim=(1, 2, 3)))
    assert report["0", "weight"].method == "own rule"
    assert not q[0].weight_quant.alpha.requires_grad


def test_nir_export_of_binary_weights():
    import numpy as np
    from snnquant.export import to_nir
    net = nn.Sequential(layer.Linear(8, 4), neuron.LIFNode(tau=2.0))
    sjf.set_step_mode(net, "m")
    q, _ = quantize_model(net, QuantConfig(weight_bits=1, per_channel=True, v_bits=8))
    graph = to_nir(q.eval(), input_shape=(8,))
    w = np.asarray(graph.nodes["0"].weight)
    # one magnitude per output channel (alpha_c, in whatever unit NIR gets), the signs of w
    assert np.allclose(np.abs(w), np.abs(w[:, :1])) and np.all(np.abs(w) > 0)
    assert np.array_equal(np.sign(w), np.where(net[0].weight.detach().numpy() >= 0, 1, -1))


@pytest.mark.parametrize("kind", ["binary", "ternary"])
def test_fold_batchnorm_scales_learned_alpha(kind):
    # folding BN multiplies each channel's weights by a = gamma / sqrt(var + eps); a learned alpha
    # must follow (alpha' = |a| alpha), not be re-estimated from the folded weights
    from snnquant.export import fold_batchnorm
    torch.manual_seed(1)
    net = nn.Sequential(layer.Conv2d(2, 4, 3, padding=1, bias=False), layer.BatchNorm2d(4),
                        neuron.LIFNode(tau=2.0))
    sjf.set_step_mode(net, "m")
    # quantized before the BatchNorm (the post-training fold): alpha follows the BN scale
    cfg = QuantConfig(weight_bits=1, per_channel=True, weight_quantizer="lsq",
                      fold_batchnorm=False) if kind == "binary" \
        else QuantConfig(weight_quantizer="ternary", weight_bits=2, per_channel=True,
                         fold_batchnorm=False)
    q, _ = quantize_model(net, cfg)
    x = torch.rand(3, 2, 2, 6, 6)
    q.train()
    q(x)
    sjf.reset_net(q)
    wq = q[0].weight_quant
    wq.power_of_two = False  # exact in float: no rounding of alpha'
    with torch.no_grad():
        wq.alpha.mul_(torch.tensor([0.5, 2.0, 1.5, 0.7]))  # as if trained away from mean|w|
        bn = q[1]
        bn.weight.copy_(torch.tensor([1.5, -0.5, 2.0, 0.25]))
        bn.running_var.copy_(torch.tensor([0.5, 2.0, 1.0, 4.0]))
        bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3]))
    q.eval()
    before = q[0].quantized_weight() if hasattr(q[0], "quantized_weight") else wq(q[0].weight)
    folded = fold_batchnorm(q)
    a = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    fq = folded[0].weight_quant
    assert torch.allclose(fq.alpha, wq.alpha * a.abs())
    after = fq(folded[0].weight)
    assert torch.allclose(after, before * a.reshape(-1, 1, 1, 1), atol=1e-6)
    # and the folded network computes what the unfolded one does
    sjf.reset_net(q)
    sjf.reset_net(folded)
    assert torch.equal(q(x), folded(x))
