r"""Range observers and the min/max fake-quantizer built on them.

As in ``torch.ao.quantization``, an observer computes a range (:class:`MinMaxObserver`) and a
fake-quantizer holds an observer and applies the grid of its range (:class:`MinMaxQuantizer`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ... import functional as QF
from .base import ConfigCheckMixin, Grid, InitFlagMixin, QuantizerBase, check_bits

__all__ = ["MinMaxObserver", "MinMaxQuantizer"]


class MinMaxObserver(InitFlagMixin, ConfigCheckMixin, nn.Module):
    r"""Observe an exponential moving average of the min and max of its inputs.

    .. math::

        r \leftarrow (1 - m)\,r + m\,r_{batch}\quad(\text{the first input sets } r)

    with :math:`r = (r_{min}, r_{max})`, per channel along ``channel_dim`` with ``per_channel``.
    NaN and infinite values carry no range information and are ignored (an input without any
    finite value leaves the range unchanged). The range and the ``initialized`` flag are buffers
    (``state_dict``, ``.to()``, DDP broadcast) in the dtype of the module.
    ``forward(x)`` observes ``x`` and returns it unchanged; :meth:`calculate_qparams` gives the
    step and the integer range of the grid.

    Args:
        bits: bit width :math:`b` of the grid.
        momentum: EMA momentum :math:`m` in (0, 1].
        symmetric: :math:`r = \max|x|` and the signed range :math:`[-2^{b-1}+1, 2^{b-1}-1]`.
        per_channel: one range per channel along ``channel_dim``.
        channel_dim: the channel dimension.
        include_values: values the range always contains.
    """

    def __init__(self, bits: int = 8, momentum: float = 0.1, symmetric: bool = False,
                 per_channel: bool = False, channel_dim: int = 0,
                 include_values: Optional[tuple] = None, **kwargs):
        super().__init__(**kwargs)
        self.bits = check_bits(bits, "bits", 2 if symmetric else 1)
        self.include_values = None if include_values is None else tuple(float(v) for v in include_values)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 < momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1], got {momentum!r}")
        self.momentum = momentum
        self.symmetric = symmetric
        self.per_channel = per_channel
        self.channel_dim = channel_dim
        self.register_buffer("min_val", torch.zeros(()))
        self.register_buffer("max_val", torch.zeros(()))
        self._register_init_flag()
        self._register_bits(bits)

    def config(self):
        return {"kind": type(self).__name__, "bits": self.bits, "signed": self.symmetric,
                "symmetric": self.symmetric, "per_channel": self.per_channel,
                "channel_dim": self.channel_dim if self.per_channel else None,
                "power_of_two": False}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("min_val", "max_val"):
            key = prefix + name
            if key in state_dict:
                mine = getattr(self, name)
                # the statistics follow the module's dtype, not the saved one
                mine.data = torch.empty(state_dict[key].shape, dtype=mine.dtype, device=mine.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._init_cache = False  # re-read from the loaded buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Observe ``x`` and return it unchanged."""
        self.observe(x)
        return x

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Update the EMA range with the min and max of ``x``.

        After the first input this reads no device tensor on the host (no synchronisation).
        """
        xd = x.detach()
        finite = torch.isfinite(xd)
        if not self.is_initialized and not bool(finite.any()):
            return  # NaN/inf carry no range information: stay uninitialised
        lo_src = torch.where(finite, xd, torch.inf)
        hi_src = torch.where(finite, xd, -torch.inf)
        if self.per_channel:
            dims = [d for d in range(x.dim()) if d != self.channel_dim % x.dim()]
            lo, hi = lo_src.amin(dim=dims), hi_src.amax(dim=dims)
        else:
            lo, hi = lo_src.min(), hi_src.max()
        dtype = self.min_val.dtype
        lo, hi = lo.to(dtype), hi.to(dtype)
        if not self.is_initialized:
            self.min_val.data = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
            self.max_val.data = torch.where(torch.isfinite(hi), hi, torch.zeros_like(hi))
            self.set_initialized(True)
        else:
            m = self.momentum
            # a step (or channel) without finite values leaves its range as it is
            lo = torch.where(torch.isfinite(lo), lo, self.min_val)
            hi = torch.where(torch.isfinite(hi), hi, self.max_val)
            self.min_val.data = (1 - m) * self.min_val + m * lo
            self.max_val.data = (1 - m) * self.max_val + m * hi

    def calculate_qparams(self):
        r"""``(step, qmin, qmax)`` of the current range, as tensors (no host read).

        .. math::

            s = \frac{r_{max} - r_{min}}{2^b - 1},\quad z = \mathrm{round}(-r_{min}/s),\quad
            q_{min} = -z,\ q_{max} = 2^b - 1 - z

        (symmetric: :math:`s = \max(-r_{min}, r_{max}) / (2^{b-1} - 1)`, :math:`q = \pm(2^{b-1}-1)`),
        with the range widened to contain 0 and ``include_values`` and :math:`s \ge 10^{-12}`.
        """
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
        zero = torch.round(-lo / step)
        return step, -zero, levels - zero

    def grid(self) -> Optional[Grid]:
        """The :class:`Grid` of the current range, or None before any data or when per-channel
        zero points differ (no single integer range)."""
        if not self.is_initialized:
            return None
        step, qmin, qmax = self.calculate_qparams()
        if isinstance(qmin, torch.Tensor):
            lo_all = qmin.reshape(-1)
            if lo_all.numel() and not bool((lo_all == lo_all[0]).all()):
                return None
            qmin, qmax = int(lo_all[0]), int(qmax.reshape(-1)[0])
        return Grid(step, qmin, qmax, self.channel_dim if self.per_channel else None, False,
                    bits=self.bits)

    def current_step(self) -> Optional[torch.Tensor]:
        """The step of the current range (tensor arithmetic only), ``None`` per channel."""
        return None if self.per_channel else self.calculate_qparams()[0]

    def ensure_initialized(self, x: torch.Tensor) -> None:
        """Observe ``x`` unless a range was already observed."""
        if not self.is_initialized:
            self.observe(x)

    def extra_repr(self):
        return (f"bits={self.bits}, momentum={self.momentum}, symmetric={self.symmetric}, "
                f"per_channel={self.per_channel}")


def _from_observer(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.observer, name), doc=doc)


class MinMaxQuantizer(ConfigCheckMixin, QuantizerBase):
    r"""Affine fake-quantizer over the min/max range of the :class:`MinMaxObserver` it holds,
    frozen in eval mode.

    In training each call updates the range with the batch's min and max
    (:math:`r \leftarrow (1 - m) r + m\, r_{batch}`, the first batch sets it), then quantizes:

    .. math::

        s = \frac{r_{max} - r_{min}}{2^b - 1},\quad z = \mathrm{round}(-r_{min}/s),\quad
        y = s\,(\mathrm{clamp}(\mathrm{round}(x/s) + z, 0, 2^b - 1) - z)

    with the masked straight-through gradient of :func:`snnquant.functional.lsq_quantize` for
    :math:`x` (the range receives no gradient). As in ``torch.ao.quantization``, the
    fake-quantizer *has* an observer: ``observer`` (a :class:`MinMaxObserver`) keeps the range,
    this class only decides when to observe and applies the grid the observer computes. The range
    always contains 0 so that 0 is exact.
    In eval mode the range is frozen; a quantizer that has never seen data takes its range from
    its first input even in eval mode (so a weight quantizer works on a fresh model). NaN and
    infinite values are ignored by the statistics (and NaN stays NaN in the output).
    ``symmetric=True`` uses :math:`r = \max|x|` and the signed range :math:`[-2^{b-1}+1, 2^{b-1}-1]`.
    In 'm' mode the range is updated once per time step, in order. Ranges are buffers of the
    observer: they are in ``state_dict`` (``observer.min_val``, ``observer.max_val``), move with
    ``.to()`` and are broadcast from rank 0 by DDP. A state dict saved before the observer was a
    child (``min_val``, ``max_val``, ``initialized``, ``bit_width`` at the quantizer's own prefix)
    still loads.

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

    #: Set by :meth:`freeze` (post-training calibration): the range no longer follows data.
    frozen = False

    def __init__(self, bits: int = 8, momentum: float = 0.1, symmetric: bool = False,
                 per_channel: bool = False, channel_dim: int = 0,
                 include_values: Optional[tuple] = None, step_mode: str = "s"):
        super().__init__(step_mode=step_mode)
        self.observer = MinMaxObserver(bits=bits, momentum=momentum, symmetric=symmetric,
                                       per_channel=per_channel, channel_dim=channel_dim,
                                       include_values=include_values)

    # ---- what the observer holds, read through the quantizer ------------------------------------
    bits = _from_observer("bits", "Bit width of the grid.")
    symmetric = _from_observer("symmetric", "Whether the range is symmetric (signed grid).")
    per_channel = _from_observer("per_channel", "Whether there is one range per channel.")
    channel_dim = _from_observer("channel_dim", "The channel dimension of a per-channel range.")
    momentum = _from_observer("momentum", "EMA momentum of the observer.")
    min_val = _from_observer("min_val", "The observed lower end of the range.")
    max_val = _from_observer("max_val", "The observed upper end of the range.")

    @property
    def include_values(self) -> Optional[tuple]:
        """Values the range always contains (``None``: only 0)."""
        return self.observer.include_values

    @include_values.setter
    def include_values(self, values: Optional[tuple]) -> None:
        self.observer.include_values = None if values is None else tuple(float(v) for v in values)

    def config(self):
        return dict(self.observer.config(), kind=type(self).__name__)

    # ---- the quantizer interface ----------------------------------------------------------------
    @property
    def is_initialized(self) -> bool:
        """Whether the observer has a range."""
        return self.observer.is_initialized

    def ensure_initialized(self, x: torch.Tensor) -> None:
        """Observe ``x`` unless a range was already observed."""
        self.observer.ensure_initialized(x)

    def mark_uninitialized(self) -> None:
        """Forget the range: the next call observes again."""
        self.observer.mark_uninitialized()

    def calculate_qparams(self):
        """``(step, qmin, qmax)`` of the observer's range (see :meth:`MinMaxObserver.calculate_qparams`)."""
        return self.observer.calculate_qparams()

    def grid(self) -> Optional[Grid]:
        """The :class:`Grid` of the observed range (see :meth:`MinMaxObserver.grid`)."""
        return self.observer.grid()

    def current_step(self) -> Optional[torch.Tensor]:
        """The step of the observed range (tensor arithmetic only), ``None`` per channel."""
        return self.observer.current_step()

    @property
    def observing(self) -> bool:
        """True in training (unless frozen): every call moves the range."""
        return self.training and not self.frozen

    @property
    def can_set_step(self) -> bool:
        """True: post-training calibration sets the range."""
        return True

    @torch.no_grad()
    def set_step(self, step: torch.Tensor) -> None:
        r"""Set the range to ``[qmin * step, qmax * step]`` of the current integer range
        (symmetric: :math:`\pm (2^{b-1} - 1)\,s`), per channel with ``per_channel``."""
        obs = self.observer
        step = torch.as_tensor(step).to(device=obs.min_val.device, dtype=obs.min_val.dtype)
        if obs.symmetric or not obs.is_initialized:
            n = 2 ** (obs.bits - 1) - 1 if obs.symmetric else 2 ** obs.bits - 1
            lo, hi = (-n * step, n * step) if obs.symmetric else (0 * step, n * step)
        else:
            _, qmin, qmax = obs.calculate_qparams()
            lo, hi = qmin * step, qmax * step
        if not obs.per_channel:
            lo, hi = lo.reshape(()), hi.reshape(())
        obs.min_val.data, obs.max_val.data = lo.clone(), hi.clone()
        obs.set_initialized(True)

    def freeze(self) -> None:
        """Stop following data in training (a Python flag, not saved in ``state_dict``)."""
        self.frozen = True

    def quantize(self, x):
        obs = self.observer
        if self.observing or not obs.is_initialized:
            obs.observe(x)  # in eval mode only the very first batch sets the range (calibration)
        step, qmin, qmax = obs.calculate_qparams()
        step = step.to(x.dtype)
        if obs.per_channel:
            shape = [1] * x.dim()
            shape[obs.channel_dim % x.dim()] = -1
            step = step.reshape(shape)
            if isinstance(qmin, torch.Tensor):
                qmin, qmax = qmin.reshape(shape), qmax.reshape(shape)
        if isinstance(qmin, int):
            return QF.lsq_quantize_unchecked(x, step.detach(), qmin, qmax)
        lo, hi = qmin.to(x.dtype), qmax.to(x.dtype)
        xs = x / step.detach()
        q = torch.clamp(torch.round(xs), lo, hi)
        inside = ((xs >= lo) & (xs <= hi)).to(x.dtype)
        return (q * step).detach() + (x - x.detach()) * inside

    # keys a MinMaxQuantizer saved when it was a subclass of its observer
    _OBSERVER_KEYS = ("min_val", "max_val", "initialized", "bit_width")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "observer.min_val" not in state_dict:
            for name in self._OBSERVER_KEYS:
                if prefix + name in state_dict:
                    state_dict[prefix + "observer." + name] = state_dict.pop(prefix + name)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self):
        return f"{self.observer.extra_repr()}, step_mode={self.step_mode}"
