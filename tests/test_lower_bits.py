"""Progressive lowering of the weight bits (issue 48 §2): a network trained at 4 bits, narrowed to
2 and trained on, holds 2-bit codes and still folds and runs exactly in integers."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from spikingjelly.activation_based import functional as sjf

from conftest import csnn
from snnquant import QuantConfig, quantize_model
from snnquant.export import FoldWarning, compare_integer, fold_batchnorm, to_integer
from snnquant.lower_bits import lower_weight_bits


def _train(q, x, y, steps):
    opt = torch.optim.Adam(q.parameters(), lr=5e-3)
    q.train()
    for _ in range(steps):
        sjf.reset_net(q)
        loss = F.mse_loss(q(x).mean(0), F.one_hot(y, 10).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    sjf.reset_net(q)


def test_lowered_network_has_narrow_codes_and_deploys_exactly():
    torch.manual_seed(0)
    net = csnn(8)
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
    q, _ = quantize_model(net, QuantConfig(weight_bits=4, v_bits=4))
    x = (torch.rand(4, 6, 2, 16, 16, generator=torch.Generator().manual_seed(2)) > 0.6).float()
    y = torch.arange(6) % 10
    _train(q, x, y, 2)
    changed = lower_weight_bits(q, 2)
    assert changed == ["0", "4", "9"]
    _train(q, x, y, 2)
    for name in changed:
        layer = dict(q.named_modules())[name]
        grid = layer.weight_quant.grid()
        assert (grid.qmin, grid.qmax) == (-2, 1)
        assert int(layer.weight_quant.bit_width) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldWarning)
        folded = fold_batchnorm(q.eval(), data=x)
    desc = to_integer(folded, input_shape=(2, 16, 16))
    for op in desc.ops:
        w = getattr(op, "weight", None)
        if w is not None:
            assert int(w.min()) >= -2 and int(w.max()) <= 1
    assert compare_integer(folded, x, desc).exact


def test_lower_weight_bits_refuses_bad_arguments():
    q, _ = quantize_model(csnn(4), QuantConfig(weight_bits=2, v_bits=4))
    with pytest.raises(ValueError, match=r"weight_bits must be an int >= 2, got 1"):
        lower_weight_bits(q, 1)
    with pytest.raises(ValueError, match=r"no LSQ weight quantizer .* wider than 2 bits"):
        lower_weight_bits(q, 2)
    with pytest.raises(TypeError, match=r"model must be an nn.Module"):
        lower_weight_bits("net", 2)
