r"""Step-compatible quantizer modules.

Every quantizer is an ``nn.Module`` and a SpikingJelly :class:`~spikingjelly.activation_based.base.StepModule`
with ``step_mode`` ``'s'`` or ``'m'``. In ``'m'`` mode the input is ``[T, N, ...]`` and the output
equals stacking the single-step outputs for ``t = 0..T-1``: data-dependent statistics are computed
per time step.

Layers and neurons call :meth:`QuantizerBase.quantize`, which always has single-step meaning (a
weight tensor has no time dimension), whatever ``step_mode`` :func:`functional.set_step_mode` gave
the quantizer.

A quantizer whose levels are a uniform grid :math:`\{q s : q_{min} \le q \le q_{max}\}` returns
``(s, q_{min}, q_{max}, grad\_scale)`` from :meth:`QuantizerBase.uniform_grid`; neurons use it for
their fused membrane path and the integer export reads it.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import base

from .. import functional as QF

__all__ = [
    "QuantizerBase",
    "Round",
    "Clamp",
    "StepQuantize",
    "KBitQuantize",
    "AffineKBitQuantize",
    "ClampByLinear",
    "StochasticRound",
    "QuantizedBits",
    "StateQuant",
    "Quantize",
    "UniformQuantizer",
    "LSQQuantizer",
    "MinMaxQuantizer",
    "WeightGridBiasQuantizer",
    "check_bits",
]


def check_bits(bits, name: str = "bits", low: int = 1, high: int = 32) -> int:
    """Return ``bits`` if it is an int in ``[low, high]``, else raise ``ValueError`` naming it."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not low <= bits <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {bits!r}")
    return bits


def _check_step_mode_input(x: torch.Tensor, who: str) -> None:
    if x.dim() < 2:
        raise ValueError(f"{who} in step_mode='m' expects x with shape [T, N, ...], got shape "
                         f"{tuple(x.shape)}")


class QuantizerBase(nn.Module, base.StepModule):
    r"""Base class of the quantizer modules.

    ``forward`` dispatches on ``step_mode``; subclasses implement :meth:`quantize` (single-step
    meaning). Element-wise quantizers need nothing more: applying them to ``[T, N, ...]`` at once
    equals stacking the per-step results.
    """

    #: True when the quantizer computes statistics from its input (then 'm' mode loops over T).
    data_dependent = False

    def __init__(self, step_mode: str = "s"):
        super().__init__()
        self.step_mode = step_mode

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Quantize ``x`` with single-step meaning (no time dimension)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "s":
            return self.quantize(x)
        _check_step_mode_input(x, type(self).__name__)
        if not self.data_dependent:
            return self.quantize(x)
        return torch.stack([self.quantize(x[t]) for t in range(x.shape[0])])

    def uniform_grid(self):
        """``(step, qmin, qmax, grad_scale)`` when the levels are a uniform grid, else ``None``."""
        return None

    def value_range(self):
        """``(low, high)`` of the output levels when known without data, else ``None``."""
        return None

    @property
    def num_bits(self) -> Optional[int]:
        """Bit width of the quantized values, when defined."""
        return getattr(self, "bits", None)

    def extra_repr(self) -> str:
        return f"step_mode={self.step_mode}"


class _BitsCheckMixin:
    """Stores ``bits`` in the state dict and refuses a state dict with another width."""

    def _register_bits(self, bits: int):
        self.register_buffer("bit_width", torch.tensor(bits, dtype=torch.int32))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "bit_width"
        if key in state_dict:
            saved = int(state_dict[key])
            if saved != int(self.bit_width):
                layer = prefix[:-1] if prefix else "<root>"
                raise ValueError(f"state_dict for {layer!r} was saved with {saved}-bit quantization, "
                                 f"but this model quantizes {layer!r} with {int(self.bit_width)} bits")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


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
            _check_step_mode_input(x, type(self).__name__)
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


class QuantizedBits(_BitsCheckMixin, QuantizerBase):
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

    def uniform_grid(self):
        if self.bits == 1 or self.alpha is not None:
            return None
        m = 2 ** (self.bits - int(self.keep_negative))
        step = 2.0 ** self.integer / m
        qmin = int(self.keep_negative) * (-m + int(self.symmetric))
        return torch.tensor(step), qmin, m - 1, 1.0

    def value_range(self):
        grid = self.uniform_grid()
        if grid is None:
            return None
        s, lo, hi, _ = grid
        return lo * float(s), hi * float(s)

    def extra_repr(self):
        return (f"bits={self.bits}, integer={self.integer}, symmetric={self.symmetric}, "
                f"keep_negative={self.keep_negative}, alpha={self.alpha}, {super().extra_repr()}")


class StateQuant(_BitsCheckMixin, QuantizerBase):
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

    def value_range(self):
        lv = self.levels
        return float(lv.min()), float(lv.max())

    def extra_repr(self):
        return (f"num_bits={self.bits}, uniform={self.uniform}, thr_centered={self.thr_centered}, "
                f"threshold={self.threshold}, {super().extra_repr()}")


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


def _signed_range(bits: int, signed: bool):
    if signed:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2 ** bits - 1


class _InitFlagMixin:
    """An ``initialized`` buffer (saved, broadcast by DDP) mirrored by a Python flag, so that the
    hot path does not read a device tensor (a CUDA synchronisation) on every call."""

    def _register_init_flag(self):
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))
        self._init_cache = False

    @property
    def is_initialized(self) -> bool:
        """Whether the quantizer has its statistics (learned step or observed range)."""
        if not self._init_cache:
            self._init_cache = bool(self.initialized)
        return self._init_cache

    def _set_initialized(self, value: bool = True):
        self.initialized.fill_(value)
        self._init_cache = value

    def mark_uninitialized(self) -> None:
        """Forget the statistics: the next call initialises them again from its input."""
        self._set_initialized(False)


class UniformQuantizer(_BitsCheckMixin, QuantizerBase):
    r"""Fixed uniform grid with a masked straight-through gradient.

    .. math::

        y = s\,\mathrm{clamp}(\mathrm{round}(x / s), q_{min}, q_{max}),\qquad
        \frac{\partial y}{\partial x} = [q_{min} \le x/s \le q_{max}]

    with :math:`q_{min} = -2^{b-1}, q_{max} = 2^{b-1} - 1` (signed) or :math:`0, 2^b - 1`.
    This is the default membrane quantizer of the quantized neurons: ``v_quant=b`` means
    ``UniformQuantizer(b, step=v_threshold * 2 ** (2 - b))``, the range :math:`[-2V_{th}, 2V_{th})`
    with :math:`2^{b-2}` levels per threshold.

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
        self.qmin, self.qmax = _signed_range(bits, signed)
        self.register_buffer("step", torch.tensor(float(step)))
        self._register_bits(bits)

    def quantize(self, x):
        return QF.lsq_quantize(x, self.step.to(x.dtype), self.qmin, self.qmax)

    def uniform_grid(self):
        return self.step, self.qmin, self.qmax, 1.0

    def value_range(self):
        s = float(self.step)
        return self.qmin * s, self.qmax * s

    def extra_repr(self):
        return (f"bits={self.bits}, step={float(self.step):g}, signed={self.signed}, "
                f"{super().extra_repr()}")


def _dist_mean_(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t


class LSQQuantizer(_InitFlagMixin, _BitsCheckMixin, QuantizerBase):
    r"""Learned Step Size Quantization (Esser et al., 2020).

    .. math::

        y = s\,\mathrm{clamp}(\mathrm{round}(x/s), q_{min}, q_{max}),\qquad
        s_0 = \frac{2\,\mathrm{mean}|x|}{\sqrt{q_{max}}},\qquad g = \frac{1}{\sqrt{n\, q_{max}}}

    The step :math:`s` is a parameter initialised from the first batch the quantizer sees (per
    channel along ``channel_dim`` with ``per_channel=True``; :math:`n` is the number of elements
    per step value). Gradients: see :func:`snnquant.functional.lsq_quantize`, with the step gradient
    scaled by :math:`g`. In 'm' mode the initialisation uses the first time step only, so 'm' output
    equals stacking single steps. Under ``torch.distributed`` the initial step is averaged over
    ranks. Loading a ``state_dict`` marks the step initialised.

    With ``power_of_two=True`` the step used is :math:`2^{\mathrm{round}(\log_2 s)}` (gradient passed
    straight through to :math:`s`), which makes exact integer export possible without rescaling.

    Args:
        bits: bit width.
        signed: signed range :math:`[-2^{b-1}, 2^{b-1}-1]`, else :math:`[0, 2^b - 1]`.
        per_channel: one step per channel along ``channel_dim``.
        channel_dim: the channel dimension (for weights, 0).
        power_of_two: restrict the step to powers of two.
        num_channels: number of channels with ``per_channel`` (lets the step parameter have its
            final shape at construction; otherwise it is sized at initialisation).
    """

    data_dependent = True

    def __init__(self, bits: int, signed: bool = True, per_channel: bool = False,
                 channel_dim: int = 0, power_of_two: bool = False,
                 num_channels: Optional[int] = None, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(bits, "bits", 2 if signed else 1)
        self.signed = signed
        self.per_channel = per_channel
        self.channel_dim = channel_dim
        self.power_of_two = power_of_two
        self.qmin, self.qmax = _signed_range(bits, signed)
        # with per_channel, give num_channels so that the parameter has its final shape before
        # DDP or an optimizer sees it
        shape = (num_channels,) if per_channel and num_channels else ()
        self.step = nn.Parameter(torch.ones(shape))
        self._register_init_flag()
        self._register_bits(bits)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "step"
        if key in state_dict and state_dict[key].shape != self.step.shape:
            with torch.no_grad():
                self.step.data = torch.empty_like(state_dict[key], dtype=self.step.dtype,
                                                  device=self.step.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if key in state_dict:
            self._set_initialized(True)

    def _reduce_dims(self, x):
        return [d for d in range(x.dim()) if d != self.channel_dim % x.dim()]

    def _step_shape(self, x):
        shape = [1] * x.dim()
        shape[self.channel_dim % x.dim()] = x.shape[self.channel_dim % x.dim()]
        return shape

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Set the step from ``x``: :math:`2\\,\\mathrm{mean}|x| / \\sqrt{q_{max}}` (per channel)."""
        xa = x.detach().abs().float()
        finite = torch.isfinite(xa)
        if not bool(finite.any()):
            return  # nothing to learn from (all NaN/inf): stay uninitialised
        xa = torch.where(finite, xa, torch.nan)
        if self.per_channel:
            init = 2 * torch.nanmean(xa, dim=self._reduce_dims(x)) / math.sqrt(self.qmax)
            init = torch.nan_to_num(init, nan=1.0)
        else:
            init = 2 * torch.nanmean(xa) / math.sqrt(self.qmax)
        # an all-zero input (e.g. a zero-initialised bias) says nothing about the scale: step 1
        init = torch.where(init > 0, init, torch.ones_like(init))
        if self.training:
            init = _dist_mean_(init)
        init = init.to(device=self.step.device, dtype=self.step.dtype)
        if init.shape == self.step.shape:
            self.step.copy_(init)
        else:
            self.step.data = init
        self._set_initialized(True)

    def effective_step(self) -> torch.Tensor:
        """The step used in forward (rounded to a power of two when ``power_of_two``).

        A learned step that an optimizer pushed to zero or below is used as the smallest
        positive step :math:`2^{-100}` (gradient passed straight through to the parameter), so
        the forward pass never divides by a non-positive step.
        """
        step = self.step
        floor = 2.0 ** -100
        if bool((step.detach() <= floor).any()):
            step = torch.where(step.detach() > floor, step, floor + (step - step.detach()))
        if not self.power_of_two:
            return step
        pow2 = torch.exp2(torch.round(torch.log2(step.detach())))
        return step + (pow2 - step).detach()

    def grad_scale(self, x: torch.Tensor) -> float:
        n = x.numel()
        if self.per_channel:
            n = max(1, n // x.shape[self.channel_dim % x.dim()])
        return 1.0 / math.sqrt(n * self.qmax)

    def quantize(self, x):
        if not self.is_initialized:
            self.initialize(x)
        step = self.effective_step().to(x.dtype)
        if self.per_channel and step.dim() == 0:
            raise ValueError(f"LSQQuantizer(per_channel=True) needs a tensor with a channel "
                             f"dimension {self.channel_dim}, got shape {tuple(x.shape)}")
        if self.per_channel:
            step = step.reshape(self._step_shape(x))
        return QF.lsq_quantize(x, step, self.qmin, self.qmax, grad_scale=self.grad_scale(x))

    def forward(self, x):
        if self.step_mode == "m":
            _check_step_mode_input(x, type(self).__name__)
            if not self.is_initialized:
                self.initialize(x[0])
            # the step is shared by all time steps; the gradient scale is the single-step one
            return torch.stack([self.quantize(x[t]) for t in range(x.shape[0])])
        return self.quantize(x)

    def uniform_grid(self):
        if self.per_channel:
            return None
        return self.effective_step(), self.qmin, self.qmax, None

    def extra_repr(self):
        return (f"bits={self.bits}, signed={self.signed}, per_channel={self.per_channel}, "
                f"power_of_two={self.power_of_two}, {super().extra_repr()}")


class MinMaxQuantizer(_InitFlagMixin, _BitsCheckMixin, QuantizerBase):
    r"""Affine quantizer over an observed min/max range with EMA, frozen in eval mode.

    In training each call updates the range with the batch's min and max
    (:math:`r \leftarrow (1 - m) r + m\, r_{batch}`, the first batch sets it), then quantizes:

    .. math::

        s = \frac{r_{max} - r_{min}}{2^b - 1},\quad z = \mathrm{round}(-r_{min}/s),\quad
        y = s\,(\mathrm{clamp}(\mathrm{round}(x/s) + z, 0, 2^b - 1) - z)

    with the masked straight-through gradient of :func:`snnquant.functional.lsq_quantize` for
    :math:`x` (the range receives no gradient). The range always contains 0 so that 0 is exact.
    In eval mode the range is frozen; a quantizer that has never seen data takes its range from
    its first input even in eval mode (so a weight quantizer works on a fresh model). NaN and
    infinite values are ignored by the statistics (and NaN stays NaN in the output).
    ``symmetric=True`` uses :math:`r = \max|x|` and the signed range :math:`[-2^{b-1}+1, 2^{b-1}-1]`.
    In 'm' mode the range is updated once per time step, in order. Ranges are buffers: they are in
    ``state_dict``, move with ``.to()`` and are broadcast from rank 0 by DDP.

    Args:
        bits: bit width.
        momentum: EMA momentum :math:`m`.
        symmetric: symmetric signed range.
        per_channel: one range per channel along ``channel_dim``.
        channel_dim: the channel dimension.
        include_values: values the range always contains (a quantized neuron sets
            :math:`(V_{reset}, V_{th})` so that its membrane can reach the threshold).
    """

    data_dependent = True

    def __init__(self, bits: int = 8, momentum: float = 0.1, symmetric: bool = False,
                 per_channel: bool = False, channel_dim: int = 0,
                 include_values: Optional[tuple] = None, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(bits, "bits", 2 if symmetric else 1)
        self.include_values = None if include_values is None else tuple(float(v) for v in include_values)
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1], got {momentum!r}")
        self.momentum = momentum
        self.symmetric = symmetric
        self.per_channel = per_channel
        self.channel_dim = channel_dim
        self.register_buffer("min_val", torch.zeros(()))
        self.register_buffer("max_val", torch.zeros(()))
        self._register_init_flag()
        self._register_bits(bits)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("min_val", "max_val"):
            key = prefix + name
            if key in state_dict:
                getattr(self, name).data = torch.empty_like(state_dict[key],
                                                            device=getattr(self, name).device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._init_cache = False  # re-read from the loaded buffer

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Update the EMA range with the min and max of ``x``."""
        xd = x.detach().float()
        finite = torch.isfinite(xd)
        if not bool(finite.any()):
            return  # NaN/inf carry no range information
        lo_src = torch.where(finite, xd, torch.inf)
        hi_src = torch.where(finite, xd, -torch.inf)
        if self.per_channel:
            dims = [d for d in range(x.dim()) if d != self.channel_dim % x.dim()]
            lo, hi = lo_src.amin(dim=dims), hi_src.amax(dim=dims)
            lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
            hi = torch.where(torch.isfinite(hi), hi, torch.zeros_like(hi))
        else:
            lo, hi = lo_src.min(), hi_src.max()
        if not self.is_initialized:
            self.min_val.data, self.max_val.data = lo.clone(), hi.clone()
            self._set_initialized(True)
        else:
            m = self.momentum
            self.min_val.data = (1 - m) * self.min_val + m * lo
            self.max_val.data = (1 - m) * self.max_val + m * hi

    def grid(self, x_dim: Optional[int] = None):
        """``(step, qmin, qmax)`` of the current range (per-channel step reshaped for ``x_dim``)."""
        low_bound, high_bound = 0.0, 0.0
        if self.include_values:
            low_bound = min(0.0, *self.include_values)
            high_bound = max(0.0, *self.include_values)
        lo = torch.clamp(self.min_val, max=low_bound)
        hi = torch.clamp(self.max_val, min=high_bound)
        if self.symmetric:
            r = torch.maximum(-lo, hi)
            n = 2 ** (self.bits - 1) - 1
            step = torch.clamp(r / n, min=1e-12)
            return step, -n, n
        levels = 2 ** self.bits - 1
        step = torch.clamp((hi - lo) / levels, min=1e-12)
        if self.per_channel:
            zero = torch.round(-lo / step)
            return step, -zero, levels - zero
        zero = int(torch.round(-lo / step))
        return step, -zero, levels - zero

    def quantize(self, x):
        if self.training or not self.is_initialized:
            self.observe(x)  # in eval mode only the very first batch sets the range (calibration)
        step, qmin, qmax = self.grid()
        step = step.to(x.dtype)
        if self.per_channel:
            shape = [1] * x.dim()
            shape[self.channel_dim % x.dim()] = -1
            step = step.reshape(shape)
            if isinstance(qmin, torch.Tensor):
                lo = qmin.reshape(shape).to(x.dtype)
                hi = qmax.reshape(shape).to(x.dtype)
                xs = x / step.detach()
                q = torch.clamp(torch.round(xs), lo, hi)
                inside = ((xs >= lo) & (xs <= hi)).to(x.dtype)
                return (q * step).detach() + (x - x.detach()) * inside
        return QF.lsq_quantize(x, step.detach(), qmin, qmax)

    def uniform_grid(self):
        if self.per_channel or not self.is_initialized:
            return None
        step, qmin, qmax = self.grid()
        return step, qmin, qmax, 0.0

    def extra_repr(self):
        return (f"bits={self.bits}, momentum={self.momentum}, symmetric={self.symmetric}, "
                f"per_channel={self.per_channel}, {super().extra_repr()}")


class WeightGridBiasQuantizer(_BitsCheckMixin, QuantizerBase):
    r"""Bias quantizer on the grid of its layer's weight step (the accumulator unit of binary
    spike inputs), as integer SNN hardware stores biases.

    .. math::

        \hat b = s_w\,\mathrm{clamp}(\mathrm{round}(b / s_w), -2^{B-1}, 2^{B-1} - 1),\qquad
        \frac{\partial \hat b}{\partial b} = [-2^{B-1} \le b/s_w \le 2^{B-1} - 1]

    with :math:`s_w = 2^{\lfloor \log_2 s \rfloor}`, :math:`s` the layer's current weight step
    (the smallest one with per-channel steps; no gradient flows to it): the weight step itself
    when it is a power of two, else the power of two just below it, so that the bias is always an
    integer on a binary grid (exact integer export). It has no parameter of its own, so no
    optimizer can push its step to zero.
    The layer binds itself with :meth:`bind`.

    Args:
        bits: bit width :math:`B` of the integer bias (2..32).
    """

    def __init__(self, bits: int = 16, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(bits, "bits", 2)
        self.qmin, self.qmax = _signed_range(bits, True)
        self._register_bits(bits)
        self.__dict__["_layer"] = None  # a plain reference, not a submodule

    def bind(self, layer: nn.Module) -> "WeightGridBiasQuantizer":
        """Use the weight quantizer of ``layer`` (which must have ``weight`` and ``weight_quant``)."""
        self.__dict__["_layer"] = layer
        return self

    def weight_step(self) -> torch.Tensor:
        """:math:`s_w`, detached (initialising the weight quantizer from the weight if needed)."""
        layer = self.__dict__["_layer"]
        if layer is None or getattr(layer, "weight_quant", None) is None:
            raise RuntimeError("WeightGridBiasQuantizer is not bound to a layer with a weight "
                               "quantizer (call .bind(layer))")
        wq = layer.weight_quant
        if isinstance(wq, LSQQuantizer):
            if not wq.is_initialized:
                wq.quantize(layer.weight)
            step = wq.effective_step()
        elif isinstance(wq, MinMaxQuantizer):
            if not wq.is_initialized:
                wq.observe(layer.weight)
            step = wq.grid()[0]
        else:
            grid = wq.uniform_grid()
            if grid is None:
                raise ValueError(f"bias on the weight grid needs a uniform weight quantizer, got "
                                 f"{type(wq).__name__}")
            step = torch.as_tensor(grid[0])
        step = step.detach().min()
        return torch.exp2(torch.floor(torch.log2(step)))

    def quantize(self, x):
        step = self.weight_step().to(device=x.device, dtype=x.dtype)
        return QF.lsq_quantize(x, step, self.qmin, self.qmax)

    def uniform_grid(self):
        return self.weight_step(), self.qmin, self.qmax, 0.0

    def extra_repr(self):
        return f"bits={self.bits}, {super().extra_repr()}"
