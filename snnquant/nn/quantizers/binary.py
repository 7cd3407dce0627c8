r"""Binary and ternary weights: :class:`BinaryQuantizer` (:math:`\pm\alpha`) and
:class:`TernaryQuantizer` (:math:`\{-\alpha, 0, +\alpha\}`).

Both put their output on the uniform grid :math:`\{q\,\alpha\}` with :math:`q \in \{-1, +1\}`
(binary; :math:`q = 0` never occurs) or :math:`q \in \{-1, 0, +1\}` (ternary), one :math:`\alpha`
per output channel (``per_channel=True``, the default) or per layer. Their :class:`Grid` is
``(alpha, -1, 1, channel_dim, power_of_two)``, so the integer export stores the weights as
:math:`\pm 1` (1 bit each) and :math:`-1/0/+1` (2 bits each) and folds :math:`\alpha` into the
membrane grid as it does a power-of-two weight step.

:math:`\alpha` is either learned (``alpha='learned'``, the default: a parameter initialised from
the first weights it sees, with LSQ's step gradient, see
:func:`~snnquant.functional.binary_quantize`) or the statistic of the current weights
(``alpha='mean'``: :math:`\mathrm{mean}|w|` for binary, as XNOR-Net; TWN's
:math:`\mathrm{mean}_{|w| > \Delta}|w|` for ternary; no gradient). Learned is the default because a
layer whose output is not renormalised (a read-out feeding a neuron with a fixed threshold) needs
its scale to match the threshold, which a statistic of the weights does not know about; with
``power_of_two=True`` :math:`\alpha` is rounded to a power of two (gradient passed straight
through), which exact integer export in float32 needs.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from ... import functional as QF
from .base import ConfigCheckMixin, Grid, InitFlagMixin, QuantizerBase

__all__ = ["BinaryQuantizer", "TernaryQuantizer"]

_ALPHA_MODES = ("learned", "mean")
_FLOOR = 2.0 ** -100


class _ScaledSignQuantizer(InitFlagMixin, ConfigCheckMixin, QuantizerBase):
    """Shared machinery of the binary and ternary quantizers (the scale :math:`\\alpha`)."""

    data_dependent = True
    follows_input_scale = False  # +-alpha (or 0) whatever the scale of the weights
    bits = 1
    _kind = ""

    def __init__(self, alpha: str = "learned", per_channel: bool = True, channel_dim: int = 0,
                 power_of_two: bool = False, num_channels: Optional[int] = None,
                 clip: Optional[float] = 1.0, step_mode: str = "s"):
        super().__init__(step_mode)
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or not 0 < clip < math.inf):
            raise ValueError(f"clip must be None or a finite number > 0, got {clip!r}")
        self.clip = None if clip is None else float(clip)
        if alpha not in _ALPHA_MODES:
            raise ValueError(f"alpha must be one of {_ALPHA_MODES}, got {alpha!r}")
        if not isinstance(per_channel, bool):
            raise ValueError(f"per_channel must be a bool, got {per_channel!r}")
        if isinstance(channel_dim, bool) or not isinstance(channel_dim, int):
            raise ValueError(f"channel_dim must be an int, got {channel_dim!r}")
        if num_channels is not None and (isinstance(num_channels, bool)
                                         or not isinstance(num_channels, int) or num_channels < 1):
            raise ValueError(f"num_channels must be None or an int >= 1, got {num_channels!r}")
        self.alpha_mode = alpha
        self.per_channel = per_channel
        self.channel_dim = channel_dim
        self.power_of_two = bool(power_of_two)
        self.qmin, self.qmax = -1, 1
        shape = (num_channels,) if per_channel and num_channels else ()
        if alpha == "learned":
            self.alpha = nn.Parameter(torch.ones(shape))
        else:
            self.register_buffer("alpha", torch.ones(shape))
        self._register_init_flag()
        self._register_bits(self.bits)

    # ---- statistics ------------------------------------------------------------------------------
    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as ``[C, n]`` (per channel) or ``[1, n]``, detached, float."""
        x = x.detach().float()
        if self.per_channel:
            if x.dim() == 0:
                raise ValueError(f"{type(self).__name__}(per_channel=True) needs a tensor with a "
                                 f"channel dimension {self.channel_dim}, got a scalar")
            d = self.channel_dim % x.dim()
            return x.movedim(d, 0).reshape(x.shape[d], -1)
        return x.reshape(1, -1)

    def _statistic(self, rows: torch.Tensor) -> torch.Tensor:
        """The closed-form :math:`\\alpha` of the rows (one value per row)."""
        raise NotImplementedError

    def _as_alpha_shape(self, values: torch.Tensor) -> torch.Tensor:
        values = values if self.per_channel else values.reshape(())
        # an all-zero channel says nothing about its scale: 1
        values = torch.where(values > 0, values, torch.ones_like(values))
        return values.to(device=self.alpha.device, dtype=self.alpha.dtype)

    @torch.no_grad()
    def _store_alpha(self, values: torch.Tensor) -> None:
        if values.shape == self.alpha.shape:
            self.alpha.copy_(values)
        else:
            self.alpha.data = values.clone()
        self.set_initialized(True)

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Set :math:`\\alpha` from ``x`` by the closed-form statistic (see the class)."""
        self._store_alpha(self._as_alpha_shape(self._statistic(self._rows(x))))

    def ensure_initialized(self, x: torch.Tensor) -> None:
        """Initialise :math:`\\alpha` from ``x`` unless it already is."""
        if not self.is_initialized:
            self.initialize(x)

    def calibration_step(self, x: torch.Tensor) -> torch.Tensor:
        """The :math:`\\alpha` post-training calibration sets for the weights ``x``: the closed-form
        statistic (the least-squares scale for binary weights), whatever range rule is asked."""
        return self._as_alpha_shape(self._statistic(self._rows(x)))

    @property
    def can_set_step(self) -> bool:
        """True: :func:`~snnquant.calibrate` may set :math:`\\alpha` (learned mode only)."""
        return self.alpha_mode == "learned"

    @torch.no_grad()
    def set_step(self, step: torch.Tensor) -> None:
        """Set :math:`\\alpha` (post-training calibration; learned mode only)."""
        if self.alpha_mode != "learned":
            raise TypeError(f"{type(self).__name__}(alpha='mean') recomputes alpha from the weights "
                            f"at every call; there is no alpha to set")
        step = torch.as_tensor(step, dtype=self.alpha.dtype, device=self.alpha.device)
        self._store_alpha(step.reshape(self.alpha.shape) if step.numel() == self.alpha.numel()
                          and self.alpha.numel() else step)

    @torch.no_grad()
    def rescale_channels(self, scale: torch.Tensor) -> bool:
        r"""Follow a per-output-channel rescaling of the weights, :math:`w'_c = a_c w_c` (folding
        BatchNorm): :math:`\alpha'_c = |a_c|\,\alpha_c`, so that the quantized folded weights are
        :math:`|a_c|\,\alpha_c\,\mathrm{sign}(a_c w_c) = a_c\,\alpha_c\,\mathrm{sign}(w_c)`, the
        quantized weights rescaled (the ternary threshold scales with the weights by itself).
        With ``power_of_two`` the rescaled :math:`\alpha'` is rounded at use, as the trained one
        was. Returns False (nothing changed) when this quantizer cannot follow it: per-layer
        :math:`\alpha`, channels not along dimension 0, ``alpha='mean'`` (recomputed from the
        weights anyway) or not initialised.

        Args:
            scale: one factor :math:`a_c` per output channel.
        """
        scale = torch.as_tensor(scale).detach()
        if self.alpha_mode != "learned" or not self.is_initialized or not self.per_channel \
                or self.channel_dim != 0 or scale.numel() != self.alpha.numel():
            return False
        self.alpha.mul_(scale.abs().reshape(self.alpha.shape).to(self.alpha))
        return True

    def freeze(self) -> None:
        """Stop learning :math:`\\alpha` (``requires_grad=False``)."""
        if isinstance(self.alpha, nn.Parameter):
            self.alpha.requires_grad_(False)

    def effective_alpha(self) -> torch.Tensor:
        r""":math:`\alpha` as used in forward.

        .. math::

            \alpha_{eff} = \max(\alpha, 2^{-100}),\qquad
            \alpha_{eff} \leftarrow 2^{\mathrm{round}(\log_2 \alpha_{eff})}\ \text{(power\_of\_two)},
            \qquad \frac{\partial \alpha_{eff}}{\partial \alpha} = 1
        """
        a = self.alpha
        a = a + (torch.clamp(a.detach(), min=_FLOOR) - a.detach())
        if self.power_of_two:
            a = a + (torch.exp2(torch.round(torch.log2(a.detach()))) - a).detach()
        return a

    def grid(self) -> Optional[Grid]:
        """``(alpha, -1, 1, channel_dim, power_of_two)``, or None before :math:`\\alpha` is known."""
        if not self.is_initialized:
            return None
        return Grid(self.effective_alpha(), self.qmin, self.qmax,
                    self.channel_dim if self.per_channel else None, self.power_of_two,
                    bits=self.bits)

    def grad_scale(self, x: torch.Tensor) -> float:
        r"""LSQ's :math:`g = 1/\sqrt{n}` (:math:`q_{max} = 1`), :math:`n` elements per :math:`\alpha`."""
        n = x.numel()
        if self.per_channel:
            n = max(1, n // x.shape[self.channel_dim % x.dim()])
        return 1.0 / math.sqrt(n)

    def step_grad_scale(self, x: torch.Tensor) -> float:
        """The :math:`\\alpha` gradient scale for input ``x`` (see :meth:`grad_scale`)."""
        return self.grad_scale(x)

    def _alpha_for(self, x: torch.Tensor) -> torch.Tensor:
        if self.alpha_mode == "mean" or not self.is_initialized:
            self.initialize(x)  # 'mean': the statistic of the current weights, every call
        a = self.effective_alpha().to(x.dtype)
        if self.per_channel:
            shape = [1] * x.dim()
            shape[self.channel_dim % x.dim()] = -1
            a = a.reshape(shape)
        return a

    def config(self):
        return dict(super().config(), bits=self.bits, alpha=self.alpha_mode, clip=self.clip,
                    per_channel=self.per_channel,
                    channel_dim=self.channel_dim if self.per_channel else None,
                    power_of_two=self.power_of_two)

    def extra_repr(self):
        return (f"alpha={self.alpha_mode!r}, per_channel={self.per_channel}, clip={self.clip}, "
                f"power_of_two={self.power_of_two}, {super().extra_repr()}")


class BinaryQuantizer(_ScaledSignQuantizer):
    r"""Binary weights :math:`\alpha\,\mathrm{sign}(w)` with :math:`\mathrm{sign}(0) = +1`.

    .. math::

        y = \alpha\,\mathrm{sign}(w),\qquad \alpha_0 = \mathrm{mean}|w|\ \text{(per channel)}

    .. math::

        \frac{\partial y}{\partial w} = [\,|w| \le c\,],\qquad
        \frac{\partial y}{\partial \alpha} = g \cdot \begin{cases}
            \mathrm{sign}(w) - w/\alpha & |w| \le \alpha \\
            \mathrm{sign}(w) & |w| > \alpha \end{cases},\qquad g = \frac{1}{\sqrt{n}}

    (see :func:`~snnquant.functional.binary_quantize`; :math:`n` weights per :math:`\alpha`,
    :math:`c` = ``clip``).
    :math:`\mathrm{mean}|w|` is the :math:`\alpha` that minimises :math:`\lVert \alpha\,
    \mathrm{sign}(w) - w \rVert^2`.

    Args:
        alpha: ``'learned'`` (default: a parameter initialised to :math:`\mathrm{mean}|w|` on the
            first call, LSQ gradient) or ``'mean'`` (:math:`\mathrm{mean}|w|` of the current
            weights at every call, no gradient).
        per_channel: one :math:`\alpha` per channel along ``channel_dim`` (default), else one.
        channel_dim: the channel dimension (for weights, 0: output channels).
        power_of_two: round :math:`\alpha` to a power of two (exact integer export in float32).
        num_channels: the number of channels, so that a learned :math:`\alpha` has its final
            shape before an optimizer sees it.
        clip: the clip range :math:`c` of the straight-through weight gradient (default 1: the
            hard tanh of BinaryConnect and XNOR-Net), or ``None`` for :math:`c = \alpha`.
    """

    bits = 1
    _kind = "binary"

    def _statistic(self, rows):
        return rows.abs().mean(dim=1)

    def quantize(self, x):
        return QF.binary_quantize(x, self._alpha_for(x), self.grad_scale(x), self.clip)


class TernaryQuantizer(_ScaledSignQuantizer):
    r"""Ternary weights :math:`\alpha\,t` with :math:`t \in \{-1, 0, +1\}` (Li et al., 2016, TWN).

    .. math::

        t = \mathrm{sign}(w)\,[\,|w| > \Delta\,],\qquad
        \Delta = r\,\mathrm{mean}|w|\ (r = 0.7),\qquad
        \alpha_0 = \mathrm{mean}_{|w| > \Delta} |w|

    per channel; with ``threshold=None`` the threshold is learned with :math:`\alpha` instead,
    :math:`\Delta = \alpha / 2` (rounding to the nearest of the three levels, as a 2-level LSQ).
    Gradients (see :func:`~snnquant.functional.ternary_quantize`):

    .. math::

        \frac{\partial y}{\partial w} = [\,|w| \le c\,],\qquad
        \frac{\partial y}{\partial \alpha} = g \cdot \begin{cases}
            t - w/\alpha & |w| \le \alpha \\
            \mathrm{sign}(w) & |w| > \alpha \end{cases},\qquad
        \frac{\partial y}{\partial \Delta} = 0

    Args:
        alpha: ``'learned'`` (default: a parameter initialised to TWN's :math:`\alpha_0`, LSQ
            gradient) or ``'mean'`` (TWN's :math:`\alpha` of the current weights at every call).
        threshold: the ratio :math:`r` of :math:`\Delta = r\,\mathrm{mean}|w|` (default 0.7, TWN),
            computed from the current weights at every call, or ``None`` for :math:`\Delta =
            \alpha/2`.
        per_channel: one :math:`\alpha` (and :math:`\Delta`) per channel along ``channel_dim``.
        channel_dim: the channel dimension (for weights, 0).
        power_of_two: round :math:`\alpha` to a power of two (exact integer export in float32).
        num_channels: the number of channels (see :class:`BinaryQuantizer`).
        clip: the clip range of the weight gradient (see :class:`BinaryQuantizer`).
    """

    bits = 2
    _kind = "ternary"

    def __init__(self, alpha: str = "learned", threshold: Optional[float] = 0.7,
                 per_channel: bool = True, channel_dim: int = 0, power_of_two: bool = False,
                 num_channels: Optional[int] = None, clip: Optional[float] = 1.0,
                 step_mode: str = "s"):
        if threshold is not None and (isinstance(threshold, bool)
                                      or not isinstance(threshold, (int, float))
                                      or not 0 <= threshold < math.inf):
            raise ValueError(f"threshold must be None or a finite number >= 0, got {threshold!r}")
        self.threshold = None if threshold is None else float(threshold)
        super().__init__(alpha=alpha, per_channel=per_channel, channel_dim=channel_dim,
                         power_of_two=power_of_two, num_channels=num_channels, clip=clip,
                         step_mode=step_mode)

    def _delta_rows(self, rows):
        if self.threshold is None:
            return None
        return self.threshold * rows.abs().mean(dim=1)

    def _statistic(self, rows):
        mag = rows.abs()
        delta = self._delta_rows(rows)
        if delta is None:  # learned threshold: start from TWN's 0.7 mean|w|
            delta = 0.7 * mag.mean(dim=1)
        keep = (mag > delta.reshape(-1, 1)).to(mag.dtype)
        return (mag * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)

    def quantize(self, x):
        alpha = self._alpha_for(x)
        if self.threshold is None:
            delta = alpha.detach() / 2
        else:
            delta = self._delta_rows(self._rows(x)).to(x.dtype)
            if self.per_channel:
                delta = delta.reshape(alpha.shape)
            else:
                delta = delta.reshape(())
        return QF.ternary_quantize(x, alpha, delta, self.grad_scale(x), self.clip)

    def config(self):
        return dict(super().config(), threshold=self.threshold)

    def extra_repr(self):
        return f"threshold={self.threshold}, {super().extra_repr()}"
