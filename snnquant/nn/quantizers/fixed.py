r"""Quantizers on fixed level sets: a uniform grid, QKeras bits, snnTorch state levels."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ... import functional as QF
from .base import ConfigCheckMixin, Grid, QuantizerBase, check_bits, signed_range

__all__ = ['UniformQuantizer', 'QuantizedBits', 'StateQuant']


class UniformQuantizer(ConfigCheckMixin, QuantizerBase):
    r"""Fixed uniform grid with a masked straight-through gradient.

    .. math::

        y = s\,\mathrm{clamp}(\mathrm{round}(x / s), q_{min}, q_{max}),\qquad
        \frac{\partial y}{\partial x} = [q_{min} \le x/s \le q_{max}]

    with :math:`q_{min} = -2^{b-1}, q_{max} = 2^{b-1} - 1` (signed) or :math:`0, 2^b - 1`.
    This is the default membrane quantizer of the quantized neurons: ``v_quant=b`` means
    ``UniformQuantizer(b, step=uniform_membrane_step(v_threshold, b))``, a power-of-two step whose
    range covers :math:`[-2V_{th}, 2V_{th})` (exactly that range, with :math:`2^{b-2}` levels per
    threshold, when :math:`V_{th}` is a power of two); see
    :func:`~snnquant.nn.neurons.uniform_membrane_step`.

    Args:
        bits: bit width :math:`b` (2..32).
        step: the step :math:`s > 0`.
        signed: signed or unsigned integer range.
    """

    def __init__(self, bits: int, step: float, signed: bool = True, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(bits, "bits", 2 if signed else 1)
        if not (isinstance(step, (int, float)) and step > 0):
            raise ValueError(f"step must be a positive number, got {step!r}")
        self.signed = signed
        self.qmin, self.qmax = signed_range(bits, signed)
        self.register_buffer("step", torch.tensor(float(step)))
        self._step_is_pow2 = QF.pow2_exponent(float(step)) is not None
        self._register_bits(bits)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "step"
        if key in state_dict:
            value = state_dict[key]
            if value.dim() != 0 or not (math.isfinite(float(value)) and float(value) > 0):
                layer = prefix[:-1] if prefix else "<root>"
                raise ValueError(f"state_dict for {layer!r}: step must be a positive finite "
                                 f"scalar, got {value.tolist()!r}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._step_is_pow2 = QF.pow2_exponent(float(self.step)) is not None

    def quantize(self, x):
        return QF.lsq_quantize_unchecked(x, self.step.to(x.dtype), self.qmin, self.qmax)

    def value_range(self):
        s = float(self.step)
        return self.qmin * s, self.qmax * s

    def grid(self) -> Grid:
        """The fixed grid ``step * [qmin, qmax]``."""
        return Grid(self.step, self.qmin, self.qmax, None, self._step_is_pow2, bits=self.bits)

    @property
    def can_set_step(self) -> bool:
        """True: post-training calibration may move the (otherwise fixed) step."""
        return True

    @torch.no_grad()
    def set_step(self, step: torch.Tensor) -> None:
        """Replace the step (a positive scalar)."""
        step = torch.as_tensor(step, dtype=self.step.dtype, device=self.step.device)
        if step.numel() != 1 or not bool(step.reshape(()) > 0):
            raise ValueError(f"step must be one positive value, got {step!r}")
        self.step.copy_(step.reshape(()))

    def config(self):
        return dict(super().config(), bits=self.bits, signed=self.signed, per_channel=False,
                    power_of_two=self._step_is_pow2)

    def extra_repr(self):
        return (f"bits={self.bits}, step={float(self.step):g}, signed={self.signed}, "
                f"{super().extra_repr()}")


class QuantizedBits(ConfigCheckMixin, QuantizerBase):
    r"""QKeras ``quantized_bits`` as a module; see :func:`snnquant.functional.quantized_bits`.

    .. math::

        y = \alpha\, m_i\, \mathrm{clip}(\mathrm{round}(x\, m / m_i),
            k(-m + \mathrm{sym}), m - 1) / m,\quad m = 2^{bits - k},\ m_i = 2^{integer}

    with :math:`k` = ``keep_negative``.
    """

    def __init__(self, bits: int = 8, integer: int = 0, symmetric: bool = False,
                 keep_negative: bool = True, alpha: Optional[float] = None,
                 stochastic: bool = False, generator: Optional[torch.Generator] = None,
                 masked_grad: bool = False, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(bits)
        # the functional checks every argument: run it once so bad arguments fail here
        QF.quantized_bits(torch.zeros(1), bits=bits, integer=integer, symmetric=symmetric,
                          keep_negative=keep_negative, alpha=alpha, masked_grad=masked_grad)
        self._register_bits(bits)
        self.integer = integer
        self.symmetric = symmetric
        self.keep_negative = keep_negative
        self.alpha = alpha
        self.stochastic = stochastic
        self.masked_grad = masked_grad
        self.generator = generator

    def quantize(self, x):
        return QF.quantized_bits(x, bits=self.bits, integer=self.integer, symmetric=self.symmetric,
                                 keep_negative=self.keep_negative, alpha=self.alpha,
                                 stochastic=self.stochastic and self.training,
                                 generator=self.generator, masked_grad=self.masked_grad)

    def grid(self) -> Optional[Grid]:
        """The power-of-two grid of ``quantized_bits`` (None with 1 bit or an ``alpha``)."""
        if self.bits == 1 or self.alpha is not None:
            return None
        m = 2 ** (self.bits - int(self.keep_negative))
        step = 2.0 ** self.integer / m
        qmin = int(self.keep_negative) * (-m + int(self.symmetric))
        return Grid(torch.tensor(step), qmin, m - 1, None, True, bits=self.bits)

    def value_range(self):
        g = self.grid()
        if g is None:
            return None
        s = float(g.step)
        return g.qmin * s, g.qmax * s

    def config(self):
        return dict(super().config(), bits=self.bits, integer=self.integer,
                    symmetric=self.symmetric, keep_negative=self.keep_negative,
                    signed=self.keep_negative, per_channel=False, power_of_two=self.alpha is None)

    def extra_repr(self):
        return (f"bits={self.bits}, integer={self.integer}, symmetric={self.symmetric}, "
                f"keep_negative={self.keep_negative}, alpha={self.alpha}, {super().extra_repr()}")


class StateQuant(ConfigCheckMixin, QuantizerBase):
    r"""snnTorch-style membrane quantizer over a fixed level set; see :func:`snnquant.functional.state_quant`.

    :math:`y` is the level nearest to :math:`x` (uniform, or threshold-centred exponential levels),
    straight-through gradient.
    """

    def __init__(self, num_bits: int = 8, uniform: bool = True, thr_centered: bool = True,
                 threshold: float = 1.0, lower_limit: float = 0.0, upper_limit: float = 0.2,
                 multiplier: Optional[float] = None, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(num_bits, "num_bits")
        self.uniform = uniform
        self.thr_centered = thr_centered
        self.threshold = threshold
        self.lower_limit = lower_limit
        self.upper_limit = upper_limit
        self.multiplier = multiplier
        self._fn = QF.state_quant(num_bits=num_bits, uniform=uniform, thr_centered=thr_centered,
                                  threshold=threshold, lower_limit=lower_limit,
                                  upper_limit=upper_limit, multiplier=multiplier)
        self._register_bits(num_bits)

    @property
    def levels(self) -> torch.Tensor:
        """The sorted level values (float64)."""
        return self._fn.levels

    def quantize(self, x):
        return self._fn(x)

    def grid(self) -> Grid:
        """The level table (not a uniform grid): ``Grid(step=None, levels=...)``."""
        lv = self.levels
        return Grid(None, 0, lv.numel() - 1, None, False, levels=lv, bits=self.bits)

    def value_range(self):
        lv = self.levels
        return float(lv.min()), float(lv.max())

    def config(self):
        return dict(super().config(), bits=self.bits, uniform=self.uniform,
                    thr_centered=self.thr_centered, signed=True, per_channel=False,
                    power_of_two=False)

    def extra_repr(self):
        return (f"num_bits={self.bits}, uniform={self.uniform}, thr_centered={self.thr_centered}, "
                f"threshold={self.threshold}, {super().extra_repr()}")
