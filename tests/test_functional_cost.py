"""The argument checks of the drop-ins cost nothing on the hot path (issue 24, item 7).

Tests never time: they count the kernels that touch a tensor of the input's size, which is what
the time of these memory-bound functions is made of. SpikingJelly's ``step_quantize`` runs three
(divide, round, multiply); ours may add one read-only reduction for the overflow check, and no
kernel that writes a new input-sized tensor.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from snnquant import functional as Q

N = 4096


class _CountFullSize(TorchDispatchMode):
    """Record the aten ops that read or write a tensor of ``N`` elements, and which allocate one."""

    def __init__(self):
        super().__init__()
        self.ops, self.allocations = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if any(t.numel() == N for t in tensors + [o for o in outs if isinstance(o, torch.Tensor)]):
            self.ops.append(str(func))
            if not func._schema.is_mutable and any(
                    isinstance(o, torch.Tensor) and o.numel() == N for o in outs):
                self.allocations.append(str(func))
        return out


def _count(fn, x):
    with _CountFullSize() as mode:
        fn(x)
    return mode


@pytest.mark.parametrize("step", [0.25, 1e-30, torch.tensor(0.25)], ids=["0.25", "1e-30", "tensor"])
def test_step_quantize_checks_without_extra_passes_over_x(step):
    x = torch.randn(N)
    ours = _count(lambda t: Q.step_quantize(t, step), x)
    reference = _count(lambda t: torch.round(t / step) * step, x)  # SpikingJelly's forward
    assert len(ours.ops) <= len(reference.ops) + 1, ours.ops
    assert len(ours.allocations) <= 1, ours.allocations


def test_step_quantize_overflow_still_caught_on_the_quotient():
    x = torch.randn(N)
    x[17] = 1e30
    with pytest.raises(ValueError, match=r"x / step overflows torch.float32"):
        Q.step_quantize(x, 1e-10)
    x[17] = float("inf")  # an infinity in x is not an overflow: it stays infinite
    y = Q.step_quantize(x, 1e-10)
    assert y[17] == float("inf") and torch.isfinite(y[:17]).all()
