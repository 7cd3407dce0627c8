"""shok's own tests of ``SoftRound``, ``PassRound`` and ``ScaleGrad``, ported to snnquant.

shok's tests call ``forward`` directly, with a context object that only has ``save_for_backward``
(or with ``None`` where the function needs no context); snnquant's classes must accept that.
"""

import torch

from snnquant.functional import PassRound, ScaleGrad, SoftRound


class DummyCtx:
    def __init__(self):
        self.saved = None

    def save_for_backward(self, *args):
        self.saved = args


def _delta_ratio(x, rounded):
    ratio = torch.where(rounded != 0, x / rounded, torch.zeros_like(x))
    return torch.where(torch.logical_and(x == 0, rounded == 0), torch.ones_like(x), ratio)


# --- SoftRound -----------------------------------------------------------------------------------


def test_soft_round_forward_basic_rounding():
    ctx = DummyCtx()
    x = torch.tensor([0.2, 0.7, 1.5, -1.2, -2.8])
    result = SoftRound.forward(ctx, x)
    assert torch.allclose(result, torch.round(x))


def test_soft_round_forward_requires_grad_delta_ratio():
    ctx = DummyCtx()
    x = torch.tensor([0.0, 1.2, -2.7, 0.0, 2.0], requires_grad=True)
    result = SoftRound.forward(ctx, x)
    expected = torch.round(x)
    assert torch.allclose(result, expected)
    assert ctx.saved is not None
    assert torch.allclose(ctx.saved[0], _delta_ratio(x, expected))


def test_soft_round_forward_zero_handling():
    ctx = DummyCtx()
    x = torch.tensor([0.0, 0.0], requires_grad=True)
    result = SoftRound.forward(ctx, x)
    assert torch.allclose(result, torch.round(x))
    assert torch.allclose(ctx.saved[0], torch.ones_like(x))


def test_soft_round_forward_no_grad_no_ctx_saved():
    ctx = DummyCtx()
    x = torch.tensor([1.1, 2.9, -3.7])
    result = SoftRound.forward(ctx, x)
    assert torch.allclose(result, torch.round(x))
    assert ctx.saved is None


def test_soft_round_apply_gradient_is_the_ratio():
    x = torch.tensor([0.0, 1.2, -2.7, 0.3, 2.0], requires_grad=True)
    SoftRound.apply(x).backward(torch.ones(5))
    assert torch.allclose(x.grad, _delta_ratio(x.detach(), torch.round(x.detach())))


# --- PassRound -----------------------------------------------------------------------------------


def test_pass_round_forward_rounds_floats_integers_and_empty():
    for x in (torch.tensor([0.1, 0.5, 1.4, 2.6, 3.9]), torch.tensor([-0.1, -0.5, -1.4, -2.6, -3.9]),
              torch.tensor([-2.7, -0.5, 0.0, 0.5, 2.7]), torch.tensor([1, 2, 3, 4]),
              torch.tensor([])):
        assert torch.equal(PassRound.forward(None, x), torch.round(x))


# --- ScaleGrad -----------------------------------------------------------------------------------


def test_scale_grad_forward_returns_the_input():
    for x in (torch.randn(5, 3, requires_grad=True), torch.zeros(4, requires_grad=True),
              torch.tensor([1, 2, 3], dtype=torch.float32, requires_grad=True)):
        assert torch.equal(ScaleGrad.forward(None, x), x)
    x = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    out = ScaleGrad.forward(None, x)
    assert out.shape == x.shape and out.dtype == x.dtype
