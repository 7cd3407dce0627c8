r"""SpikingJelly-style element-wise quantizer modules (wrappers of :mod:`snnquant.functional`)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from ... import functional as QF
from .base import QuantizerBase, check_bits, check_step_mode_input

__all__ = ['Round', 'Clamp', 'StepQuantize', 'KBitQuantize', 'AffineKBitQuantize', 'ClampByLinear', 'StochasticRound', 'Quantize']


class Round(QuantizerBase):
    r"""Round to the nearest integer, straight-through: :math:`y = \mathrm{round}(x)`, :math:`\partial y/\partial x = 1`."""

    def quantize(self, x):
        return QF.round(x)


class Clamp(QuantizerBase):
    r"""Clamp with a masked gradient.

    .. math::

        y = \mathrm{clamp}(x, m, M),\qquad \frac{\partial y}{\partial x} = [m \le x \le M]

    Args:
        min_value: lower bound :math:`m`.
        max_value: upper bound :math:`M`.
    """

    def __init__(self, min_value: float, max_value: float, step_mode: str = "s"):
        super().__init__(step_mode)
        if min_value > max_value:
            raise ValueError(f"min_value must be <= max_value, got min_value={min_value!r}, "
                             f"max_value={max_value!r}")
        self.min_value = min_value
        self.max_value = max_value

    def quantize(self, x):
        return QF.clamp(x, self.min_value, self.max_value)

    def value_range(self):
        return self.min_value, self.max_value

    def extra_repr(self):
        return f"min_value={self.min_value}, max_value={self.max_value}, {super().extra_repr()}"


class StepQuantize(QuantizerBase):
    r"""Round to a multiple of ``step``, straight-through: :math:`y = s\,\mathrm{round}(x / s)`.

    Args:
        step: the step :math:`s > 0`.
    """

    def __init__(self, step: float = 1.0, step_mode: str = "s"):
        super().__init__(step_mode)
        QF.step_quantize(torch.zeros(1), step)  # checks step here, not at the first forward
        self.step = step

    def quantize(self, x):
        return QF.step_quantize(x, self.step)

    def extra_repr(self):
        return f"step={self.step}, {super().extra_repr()}"


class KBitQuantize(QuantizerBase):
    r"""DoReFa k-bit quantization of :math:`x \in [0, 1]`, straight-through.

    .. math::

        y = \frac{\mathrm{round}((2^k - 1) x)}{2^k - 1}

    Args:
        k: bit width.
    """

    def __init__(self, k: int, step_mode: str = "s"):
        super().__init__(step_mode)
        self.k = check_bits(k, "k")

    @property
    def num_bits(self):
        return self.k

    def quantize(self, x):
        return QF.k_bit_quantize(x, self.k)

    def extra_repr(self):
        return f"k={self.k}, {super().extra_repr()}"


class AffineKBitQuantize(QuantizerBase):
    r"""Affine k-bit quantization with learnable scale and offset.

    .. math::

        y = w \cdot \frac{\mathrm{round}((2^k - 1) x)}{2^k - 1} + b

    with straight-through gradient for :math:`x` and true gradients for :math:`w` and :math:`b`.

    Args:
        k: bit width.
        w: initial scale (learnable).
        b: initial offset (learnable).
    """

    def __init__(self, k: int, w: float = 1.0, b: float = 0.0, step_mode: str = "s"):
        super().__init__(step_mode)
        self.k = check_bits(k, "k")
        self.w = nn.Parameter(torch.tensor(float(w)))
        self.b = nn.Parameter(torch.tensor(float(b)))

    @property
    def num_bits(self):
        return self.k

    def quantize(self, x):
        return QF.affine_k_bit_quantize(x, self.k, self.w.to(x.dtype), self.b.to(x.dtype))

    def extra_repr(self):
        return f"k={self.k}, {super().extra_repr()}"


class ClampByLinear(QuantizerBase):
    r"""Linear rescale to :math:`[0, 1)`: :math:`y = (x - \min x) / (\max x + \epsilon - \min x)`.

    The minimum and maximum are taken per time step (over one step's whole tensor). With
    ``per_sequence=True`` and ``step_mode='m'`` they are taken over the whole ``[T, N, ...]``
    sequence instead; then 'm' output no longer equals stacking single steps (documented option).

    Args:
        eps: :math:`\epsilon`.
        per_sequence: use one statistic per sequence in 'm' mode.
    """

    data_dependent = True

    def __init__(self, eps: float = 1e-5, per_sequence: bool = False, step_mode: str = "s"):
        super().__init__(step_mode)
        QF.clamp_by_linear(torch.zeros(2), eps)  # checks eps here, not at the first forward
        self.eps = eps
        self.per_sequence = per_sequence

    def quantize(self, x):
        return QF.clamp_by_linear(x, self.eps)

    def forward(self, x):
        if self.step_mode == "m" and self.per_sequence:
            check_step_mode_input(x, type(self).__name__)
            return self.quantize(x)
        return super().forward(x)

    def extra_repr(self):
        return f"eps={self.eps}, per_sequence={self.per_sequence}, {super().extra_repr()}"


class StochasticRound(QuantizerBase):
    r"""Stochastic rounding to multiples of ``step`` in training, nearest rounding in eval.

    .. math::

        y = s \left(\lfloor x/s \rfloor + [u < x/s - \lfloor x/s \rfloor]\right),\quad
        u \sim U[0, 1)\ \text{(training)};\qquad y = s\,\mathrm{round}(x/s)\ \text{(eval)}

    Straight-through gradient.

    Args:
        step: the step :math:`s > 0`.
        generator: optional ``torch.Generator`` for reproducible draws.
    """

    def __init__(self, step: float = 1.0, generator: Optional[torch.Generator] = None,
                 step_mode: str = "s"):
        super().__init__(step_mode)
        QF.stochastic_round(torch.zeros(1), step)  # checks step here, not at the first forward
        self.step = step
        self.generator = generator

    def quantize(self, x):
        if self.training:
            return QF.stochastic_round(x, self.step, generator=self.generator)
        return QF.step_quantize(x, self.step)

    def extra_repr(self):
        return f"step={self.step}, {super().extra_repr()}"


class Quantize(QuantizerBase):
    r"""Wrap any quantizing function: :math:`y = fn(x, **kwargs)`.

    Args:
        fn: a function of a tensor (for example from :mod:`snnquant.functional`).
        data_dependent: True (default) applies ``fn`` to each time step in 'm' mode, so that
            'm' output equals stacking single steps for any ``fn``; set False for an element-wise
            ``fn`` to apply it to the whole sequence at once (faster, same result).
        **kwargs: extra keyword arguments passed to ``fn``.
    """

    def __init__(self, fn: Callable, *, data_dependent: bool = True, step_mode: str = "s",
                 **kwargs):
        super().__init__(step_mode)
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.kwargs = kwargs
        self.data_dependent = data_dependent

    def quantize(self, x):
        return self.fn(x, **self.kwargs)

    def extra_repr(self):
        name = getattr(self.fn, "__name__", repr(self.fn))
        kw = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"fn={name}{', ' + kw if kw else ''}, {super().extra_repr()}"
