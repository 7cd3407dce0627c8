r"""Learned step size quantization (LSQ) as a module: :class:`LSQQuantizer`."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn

from ... import functional as QF
from .base import (ConfigCheckMixin, Grid, InitFlagMixin, QuantizerBase, check_bits,
                   check_step_mode_input, signed_range)

__all__ = ['LSQQuantizer']


def _dist_mean_(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return t


class LSQQuantizer(InitFlagMixin, ConfigCheckMixin, QuantizerBase):
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
        self.qmin, self.qmax = signed_range(bits, signed)
        # with per_channel, give num_channels so that the parameter has its final shape before
        # DDP or an optimizer sees it
        shape = (num_channels,) if per_channel and num_channels else ()
        self.step = nn.Parameter(torch.ones(shape))
        self._register_init_flag()
        self._register_bits(bits)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "step"
        if key in state_dict and (state_dict[key].dim() != 0) != self.per_channel:
            layer = prefix[:-1] if prefix else "<root>"
            saved = "per_channel=True" if state_dict[key].dim() else "per_channel=False"
            raise ValueError(f"state_dict for {layer!r} holds an LSQ step of shape "
                             f"{tuple(state_dict[key].shape)} ({saved}), but this model's {layer!r} "
                             f"is configured as ({', '.join(f'{k}={v!r}' for k, v in sorted(self.config().items()))})")
        if key in state_dict and state_dict[key].shape != self.step.shape:
            with torch.no_grad():
                self.step.data = torch.empty_like(state_dict[key], dtype=self.step.dtype,
                                                  device=self.step.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if key in state_dict:
            self.set_initialized(True)

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
        self.set_initialized(True)

    def set_bits(self, bits: int) -> None:
        """Change the bit width in place (progressive lowering,
        :func:`snnquant.lower_bits.lower_weight_bits`): the range becomes that of ``bits`` and
        the step is initialised again from the next input."""
        self.bits = check_bits(bits, "bits", 2 if self.signed else 1)
        self.qmin, self.qmax = signed_range(bits, self.signed)
        self.bit_width.fill_(bits)
        self.mark_uninitialized()

    def effective_step(self) -> torch.Tensor:
        r"""The step used in forward (rounded to a power of two when ``power_of_two``).

        .. math::

            s_{eff} = \max(s, 2^{-100}),\qquad s_{eff} \leftarrow 2^{\mathrm{round}(\log_2 s_{eff})}
            \ \text{(power\_of\_two)},\qquad \frac{\partial s_{eff}}{\partial s} = 1

        A learned step that an optimizer pushed to zero or below is used as the smallest
        positive step :math:`2^{-100}`, so the forward pass never divides by a non-positive step.
        Both are computed by arithmetic, without reading the step on the host.
        """
        step = self.step
        floor = 2.0 ** -100
        step = step + (torch.clamp(step.detach(), min=floor) - step.detach())
        if not self.power_of_two:
            return step
        pow2 = torch.exp2(torch.round(torch.log2(step.detach())))
        return step + (pow2 - step).detach()

    def grid(self) -> Grid:
        """The current grid: the effective step (with its gradient path), ``[qmin, qmax]``."""
        return Grid(self.effective_step(), self.qmin, self.qmax,
                    self.channel_dim if self.per_channel else None, self.power_of_two,
                    bits=self.bits)

    def ensure_initialized(self, x: torch.Tensor) -> None:
        """Initialise the step from ``x`` (see :meth:`initialize`) unless it already is."""
        if not self.is_initialized:
            self.initialize(x)

    @property
    def can_set_step(self) -> bool:
        """True: post-training calibration sets the learned step."""
        return True

    @torch.no_grad()
    def set_step(self, step: torch.Tensor) -> None:
        """Set the learned step (one value, or one per channel with ``per_channel``)."""
        step = torch.as_tensor(step).to(device=self.step.device, dtype=self.step.dtype)
        if not self.per_channel:
            step = step.reshape(())
        if step.shape == self.step.shape:
            self.step.copy_(step)
        else:
            self.step.data = step.clone()
        self.set_initialized(True)

    def freeze(self) -> None:
        """Stop learning the step (``requires_grad=False``)."""
        self.step.requires_grad_(False)

    def step_grad_scale(self, x: torch.Tensor) -> float:
        """LSQ's gradient scale :math:`g` for input ``x`` (see :meth:`grad_scale`)."""
        return self.grad_scale(x)

    def config(self):
        return dict(super().config(), bits=self.bits, signed=self.signed,
                    per_channel=self.per_channel,
                    channel_dim=self.channel_dim if self.per_channel else None,
                    power_of_two=self.power_of_two)

    def grad_scale(self, x: torch.Tensor) -> float:
        r""":math:`g = 1/\sqrt{n\,q_{max}}` with :math:`n` the elements per step value of ``x``."""
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
        return QF.lsq_quantize_unchecked(x, step, self.qmin, self.qmax, self.grad_scale(x))

    def forward(self, x):
        if self.step_mode == "m":
            check_step_mode_input(x, type(self).__name__)
            if not self.is_initialized:
                self.initialize(x[0])
            # the step is shared by all time steps; the gradient scale is the single-step one
            return torch.stack([self.quantize(x[t]) for t in range(x.shape[0])])
        return self.quantize(x)

    def extra_repr(self):
        return (f"bits={self.bits}, signed={self.signed}, per_channel={self.per_channel}, "
                f"power_of_two={self.power_of_two}, {super().extra_repr()}")
