r"""The export's refusals that a network can meet, each with its fix, written once.

:func:`~snnquant.export.to_integer` calls these checks while it exports, and
:func:`~snnquant.deployability.deployability_report` (which
:func:`~snnquant.quantize_model` runs before training when it is given ``example_input``) calls
the same ones, so that what the report predicts is what the export refuses. Each refusal that
the export raises carries the name of its check in ``ExportError.check`` (one of
:data:`CHECKS`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...functional.int_limits import pow2_exponent

__all__ = ["CHECKS", "nearest_exact_tau", "exact_leak_shift", "tau_refusal",
           "time_mean_refusal", "mean_refusal", "accumulator_fix", "tagged"]

#: The kinds of refusal: a leak that is not a shift, a mean over time over T that is not a power
#: of two, a mean over a number of values that is not one, a float sum that is not exact, a
#: BatchNorm still in the network, a forward that could not be captured, an operation NIR has no
#: node for, a chip limit, anything else.
CHECKS = ("tau", "time_mean", "mean", "accumulator", "batchnorm", "capture", "nir", "chip",
          "other")


def tagged(error: Exception, check: str) -> Exception:
    """``error`` with ``error.check = check`` (the kind of refusal, one of :data:`CHECKS`)."""
    error.check = check
    return error


def nearest_exact_tau(tau: float) -> float:
    r"""The exact :math:`\tau` to offer for ``tau``: the power of two nearest on a log scale,
    at least 2 (:math:`\tau = 1` forgets the membrane at every step), so ``4/3 -> 2.0``.

    .. math::

        \tau' = 2^{\max(1,\ \mathrm{round}(\log_2 \tau))}
    """
    if not (math.isfinite(tau) and tau > 0):
        return 2.0
    return float(2 ** max(1, round(math.log2(tau))))


def exact_leak_shift(tau, dtype: torch.dtype) -> Optional[int]:
    r"""The shift :math:`k` with :math:`\tau = 2^k` exactly in ``dtype`` (the leak is then the
    exact right shift the integer export uses), or ``None``."""
    value = float(torch.tensor(float(tau), dtype=dtype))
    e = pow2_exponent(value)
    if e is None or e < 0 or value != float(tau):
        return None
    return e


def tau_refusal(tau: float, learned: bool = False) -> str:
    """Why a leak :math:`1/\\tau` is refused, with the exact and the approximate fix."""
    what = (f"the learned tau = 1/sigmoid(w) = {tau:.6g}" if learned
            else f"tau = {tau!r}")
    exact = nearest_exact_tau(tau)
    route = (f"ParametricLIFNode(init_tau={exact!r}) with w.requires_grad_(False), or "
             f"LIFNode(tau={exact!r})" if learned else
             f"tau={exact!r} (the neuron's or the network's constructor argument, e.g. "
             f"MSResNet(..., tau={exact!r}))")
    return (f"{what} is not a power of two >= 1, so the float model's leak rounds and no "
            f"integer shift reproduces it. Exact: train with {route}, the nearest power of two. "
            f"Approximate (fixed-point leak round(2^F / tau) / 2^F, agreement not guaranteed): "
            f"to_integer(..., leak_bits=F), e.g. leak_bits=12")


def time_mean_refusal(steps: int) -> Optional[str]:
    """Why a mean over ``steps`` time steps is refused (``None`` for a power of two)."""
    if steps and pow2_exponent(float(steps)) is not None:
        return None
    lower = 2 ** max(0, int(math.log2(steps))) if steps else 1
    return (f"it reads the mean over {steps} time steps, not a power of two, so the model's "
            f"mean is rounded and no per-step integer layer reproduces it; use a power-of-two T "
            f"(T={lower} or T={2 * lower}: the network's T and the input's time steps)")


def mean_refusal(count: int, shape=None) -> Optional[str]:
    """Why a mean over ``count`` values is refused (``None`` for a power of two); ``shape``:
    the averaged tensor's shape, to name an input size that fixes it."""
    if pow2_exponent(float(count)) is not None:
        return None
    text = (f"it averages {count} values, not a power of two, so the mean is not an exact "
            f"binary fraction; use a sum, or a size that is a power of two")
    if shape is not None and len(shape) >= 2:
        text += (f" (the averaged map is {'x'.join(str(int(s)) for s in shape)}: crop or pad "
                 f"the input so that it has a power-of-two size, e.g. 34x34 frames to 32x32)")
    return text


def accumulator_fix(dtype: torch.dtype, input_max: Optional[int], first_layer: bool,
                    input_max_given: bool = True) -> str:
    """The next step after an accumulator-bound refusal: float64 as the reference, or (for a
    layer that reads the network input) a smaller ``input_max``; says when ``input_max`` was
    the default rather than the user's."""
    steps = []
    if dtype != torch.float64:
        steps.append("export (and compare) with reference_dtype=torch.float64, whose 53-bit sums "
                     "are exact far further")
    if first_layer:
        steps.append("a smaller input_max (the largest event count the input really has)")
        if not input_max_given:
            steps.append(f"input_max was not given, so the export took {input_max}: pass "
                         f"to_integer(..., input_max=<largest count of your data>) or "
                         f"example_input=x")
    steps.append("fewer weight bits or a coarser bias grid")
    return "; ".join(steps)

