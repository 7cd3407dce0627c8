"""LSQ (Esser et al., ICLR 2020) as the paper defines it, eq. 3: the step gradient.

.. math::

    \\frac{\\partial \\hat v}{\\partial s} = \\begin{cases}
        -v/s + \\lfloor v/s \\rceil & -Q_N < v/s < Q_P \\\\
        -Q_N & v/s \\le -Q_N \\\\
        Q_P & v/s \\ge Q_P \\end{cases}

The end points belong to the clamped cases: an input already on the grid's ends (a re-quantized
tensor) gets the step gradient :math:`Q_P` or :math:`-Q_N`, not 0. The input gradient stays
straight-through on the closed interval :math:`[-Q_N, Q_P]`.
"""

import pytest
import torch

from snnquant import functional as Q


def _eq3(v, q_n, q_p):
    return torch.where(v <= -q_n, -float(q_n), torch.where(v >= q_p, float(q_p), torch.round(v) - v))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("signed", [True, False])
def test_step_gradient_follows_eq_3_including_the_end_points(bits, signed):
    q_n, q_p = (2 ** (bits - 1), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    v = torch.tensor([-q_n - 3.0, -q_n - 0.25, -q_n, -q_n + 0.3, 0.4, q_p - 0.7, q_p, q_p + 0.25,
                      q_p + 5.0], dtype=torch.float64)
    s = 0.125
    x = (v * s).requires_grad_(True)
    step = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    for i in range(v.numel()):
        step.grad = None
        x.grad = None
        Q.lsq_quantize(x[i:i + 1], step, -q_n, q_p).sum().backward()
        assert float(step.grad) == pytest.approx(float(_eq3(v[i:i + 1], q_n, q_p)), abs=1e-12), \
            f"v/s = {float(v[i])}"
        inside = -q_n <= float(v[i]) <= q_p
        assert float(x.grad[i]) == (1.0 if inside else 0.0), f"v/s = {float(v[i])}"


def test_requantizing_a_quantized_tensor_gives_the_end_point_gradient():
    s = torch.tensor(0.25, requires_grad=True)
    x = torch.tensor([-2.0, -1.0, 0.0, 1.75])  # v = x / s = -Q_N, -4, 0, Q_P for 4 signed bits
    y = Q.lsq_quantize(x, s, -8, 7)
    assert torch.equal(y.detach(), x)
    y.sum().backward()
    # v = [-8, -4, 0, 7]: -Q_N + 0 + 0 + Q_P
    assert float(s.grad) == pytest.approx(-8.0 + 7.0)


def test_grad_scale_multiplies_the_end_point_gradient():
    s = torch.tensor(0.5, requires_grad=True)
    Q.lsq_quantize(torch.tensor([1.5]), s, -4, 3, grad_scale=0.1).sum().backward()
    assert float(s.grad) == pytest.approx(0.3)
