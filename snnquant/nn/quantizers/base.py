r"""The quantizer interface: :class:`QuantizerBase` and :class:`Grid`.

Every quantizer is an ``nn.Module`` and a SpikingJelly :class:`~spikingjelly.activation_based.base.StepModule`
with ``step_mode`` ``'s'`` or ``'m'``. In ``'m'`` mode the input is ``[T, N, ...]`` and the output
equals stacking the single-step outputs for ``t = 0..T-1``: data-dependent statistics are computed
per time step.

Layers and neurons call :meth:`QuantizerBase.quantize`, which always has single-step meaning (a
weight tensor has no time dimension), whatever ``step_mode`` :func:`functional.set_step_mode` gave
the quantizer.

What a quantizer puts its values on is described by one object, :class:`Grid`, returned by
:meth:`QuantizerBase.grid`. Layers, neurons, :func:`~snnquant.quantize_model` and the integer
export read only that (plus :attr:`QuantizerBase.is_initialized` and
:meth:`QuantizerBase.ensure_initialized`); none of them asks for a quantizer's class. A new
quantizer is one subclass that implements :meth:`~QuantizerBase.quantize` and, when its levels
are a uniform grid, :meth:`~QuantizerBase.grid`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from spikingjelly.activation_based import base

from ...functional import check_bit_width
from ...functional.int_limits import int_range

__all__ = ["Grid", "QuantizerBase", "check_bits", "signed_range"]


#: The one bit-width check of snnquant, :func:`snnquant.functional.check_bit_width`, under the
#: name the quantizer modules import: ``check_bits(bits, name="bits", low=1, high=32)``.
check_bits = check_bit_width


#: :func:`snnquant.functional.int_limits.int_range` under the name the quantizer modules import:
#: ``(q_min, q_max)`` of a ``bits``-bit integer.
signed_range = int_range


@dataclass(frozen=True)
class Grid:
    r"""The levels a quantizer's output lies on.

    A uniform grid is :math:`\{q\,s : q_{min} \le q \le q_{max}\}` with :math:`q` an integer and
    :math:`s` = ``step`` (one value, or one per channel along ``channel_dim``). A quantizer whose
    levels are not equally spaced gives its sorted level table in ``levels`` and ``step=None``.

    Attributes:
        step: the step, a 0-dim tensor or a 1-D tensor with one value per channel. A learned step
            keeps its autograd connection to the parameter (detach it to read the value).
        qmin: lowest integer level.
        qmax: highest integer level.
        channel_dim: the dimension of the input that ``step`` runs along, or ``None`` (per tensor).
        power_of_two: whether every step value is a power of two by construction (then integer
            export needs no rescaling).
        levels: the sorted level values of a non-uniform quantizer, else ``None``.
        bits: the bit width the integer levels are stored in (the quantizer's ``num_bits``: 1 for
            binary :math:`\pm 1`, 2 for ternary), or ``None`` when the quantizer has none.
    """

    step: Optional[torch.Tensor]
    qmin: int
    qmax: int
    channel_dim: Optional[int]
    power_of_two: bool
    levels: Optional[torch.Tensor] = None
    bits: Optional[int] = None

    @property
    def is_uniform(self) -> bool:
        """True for a uniform grid (a ``step``), False for a level table."""
        return self.step is not None

    @property
    def per_tensor(self) -> bool:
        """True for a uniform grid with one step for the whole tensor."""
        return self.step is not None and self.channel_dim is None and self.step.dim() == 0


def check_step_mode_input(x: torch.Tensor, who: str) -> None:
    """Refuse an input without the ``[T, N, ...]`` dimensions of ``step_mode='m'``."""
    if x.dim() < 2:
        raise ValueError(f"{who} in step_mode='m' expects x with shape [T, N, ...], got shape "
                         f"{tuple(x.shape)}")


class QuantizerBase(nn.Module, base.StepModule):
    r"""Base class of the quantizer modules.

    ``forward`` dispatches on ``step_mode``; subclasses implement :meth:`quantize` (single-step
    meaning) and, when their output lies on a known grid, :meth:`grid`. Element-wise quantizers
    need nothing more: applying them to ``[T, N, ...]`` at once equals stacking the per-step
    results. Quantizers with statistics (a learned step, an observed range) override
    :attr:`is_initialized`, :meth:`ensure_initialized` and :meth:`mark_uninitialized`.
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
        """Quantize ``x`` (``[T, N, ...]`` in ``step_mode='m'``)."""
        if self.step_mode == "s":
            return self.quantize(x)
        check_step_mode_input(x, type(self).__name__)
        if not self.data_dependent:
            return self.quantize(x)
        return torch.stack([self.quantize(x[t]) for t in range(x.shape[0])])

    def grid(self) -> Optional[Grid]:
        """The :class:`Grid` of the output, or ``None`` when the output is not on a known grid."""
        return None

    @property
    def is_initialized(self) -> bool:
        """Whether the quantizer has its statistics (always True for a quantizer without any)."""
        return True

    def ensure_initialized(self, x: torch.Tensor) -> None:
        """Initialise the statistics from ``x`` (single-step meaning) unless they already are."""

    def mark_uninitialized(self) -> None:
        """Forget the statistics: the next call initialises them again (no-op without any)."""

    @property
    def observing(self) -> bool:
        """True while every call updates the statistics (the grid moves with each input)."""
        return False

    def sequence_grid(self) -> Optional[Grid]:
        """The :class:`Grid` when it holds for a whole sequence of calls: :meth:`grid`, or
        ``None`` while :attr:`observing` (then each call moves the grid, and a neuron reads it
        step by step)."""
        return None if self.observing else self.grid()

    def step_grad_scale(self, x: torch.Tensor) -> float:
        """Factor applied to the gradient of a learned step when quantizing ``x`` (1 by default)."""
        return 1.0

    # ---- post-training calibration (snnquant.calibrate) --------------------------------------------
    @property
    def can_set_step(self) -> bool:
        """True when :meth:`set_step` can move the grid (post-training calibration)."""
        return False

    def set_step(self, step: torch.Tensor) -> None:
        """Put the output on the grid of ``step`` (a 0-dim tensor, or one value per channel) with
        this quantizer's integer range; marks the quantizer initialised."""
        raise TypeError(f"{type(self).__name__} has no step to set (its levels are fixed)")

    def calibration_step(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The step this quantizer's own rule picks for the values ``x``, or ``None`` to let
        :func:`~snnquant.calibrate` pick it from the range of ``x`` (the default)."""
        return None

    def freeze(self) -> None:
        """Stop the grid from moving: a learned step stops receiving gradients, an observed range
        stops following data (no-op for a fixed grid)."""

    def current_step(self) -> Optional[torch.Tensor]:
        """The per-tensor step of the current grid as a 0-dim tensor, computed without reading
        any device value on the host (so it can be called on every training step), or ``None``
        when the grid is not uniform per tensor."""
        g = self.grid()
        return g.step if g is not None and g.per_tensor else None

    def value_range(self):
        """``(low, high)`` of the output levels of a fixed level set, else ``None``."""
        return None

    #: Whether the quantized value follows the scale of its input, :math:`Q(a w) \approx a\,Q(w)`
    #: up to rounding (a step quantizer), so that a layer can train with BatchNorm folded into its
    #: weights (:mod:`snnquant.nn.batchnorm`). Binary and ternary quantizers output
    #: :math:`\pm\alpha` whatever the scale, and do not.
    follows_input_scale: bool = True

    def rescale_channels(self, scale: torch.Tensor) -> bool:
        r"""Follow a per-output-channel rescaling of the weights, :math:`w'_c = a_c w_c` (folding
        BatchNorm into the layer), so that the quantized folded weights are the quantized weights
        rescaled. Returns whether it did; the default returns ``False`` (nothing changed), and
        :func:`~snnquant.export.fold_batchnorm` then re-initialises the step from the folded
        weights.

        Args:
            scale: one factor :math:`a_c` per output channel.
        """
        return False

    def config(self) -> dict:
        """The configuration that gives the meaning of the saved state (checked by
        ``load_state_dict``): ``kind`` (the class name) and, where they apply, ``bits``,
        ``signed``, ``per_channel``, ``channel_dim`` (None per tensor) and ``power_of_two``."""
        return {"kind": type(self).__name__}

    @property
    def num_bits(self) -> Optional[int]:
        """Bit width of the quantized values, when defined."""
        return getattr(self, "bits", None)

    def extra_repr(self) -> str:
        return f"step_mode={self.step_mode}"


def _describe(cfg: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in cfg.items())


_CONFIG_FIELDS = ("bits", "signed", "per_channel", "channel_dim", "power_of_two")


def _kind_code(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def _known_kind(code: int) -> str:
    todo, seen = [QuantizerBase], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if _kind_code(cls.__name__) == code:
            return cls.__name__
        todo.extend(cls.__subclasses__())
    return f"<quantizer kind #{code}>"


def _encode_config(cfg: dict) -> torch.Tensor:
    values = [_kind_code(str(cfg.get("kind")))]
    for name in _CONFIG_FIELDS:
        v = cfg.get(name)
        values.append(-1 if v is None else int(v))
    return torch.tensor(values, dtype=torch.int64)


def _decode_config(t: torch.Tensor) -> dict:
    values = [int(v) for v in t.reshape(-1).tolist()]
    cfg = {"kind": _known_kind(values[0])}
    for name, v in zip(_CONFIG_FIELDS, values[1:]):
        cfg[name] = None if v == -1 else (bool(v) if name in ("signed", "per_channel",
                                                               "power_of_two") else v)
    return cfg


def _normalise(cfg: dict) -> dict:
    return _decode_config(_encode_config(cfg))


class ConfigCheckMixin:
    """Saves the quantizer's :meth:`~QuantizerBase.config` in ``state_dict`` (as the int64 tensor
    ``<prefix>quant_config``: kind, bits, signedness, per-channel and its dimension, power of two)
    and refuses a state dict saved with another configuration, naming the module and both
    configurations. The check also runs under ``strict=False``: that asks for a partial load of
    other keys, never for a silent reinterpretation of this quantizer's values. A state dict saved
    before the configuration was stored loads with the bit-width check only."""

    def _register_bits(self, bits: int):
        self.register_buffer("bit_width", torch.tensor(bits, dtype=torch.int32))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "quant_config"] = _encode_config(self.config())

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        layer = prefix[:-1] if prefix else "<root>"
        key_bits = prefix + "bit_width"
        if key_bits in state_dict and hasattr(self, "bit_width"):
            saved_bits = int(state_dict[key_bits])
            if saved_bits != int(self.bit_width):
                raise ValueError(f"state_dict for {layer!r} was saved with {saved_bits}-bit "
                                 f"quantization, but this model quantizes {layer!r} with "
                                 f"{int(self.bit_width)} bits")
        key = prefix + "quant_config"
        if key in state_dict:
            saved = _decode_config(state_dict[key])
            mine = _normalise(self.config())
            if saved != mine:
                raise ValueError(f"state_dict for {layer!r} was saved with a {saved['kind']} "
                                 f"quantizer configured as ({_describe(saved)}), but this model's "
                                 f"{layer!r} is configured as ({_describe(mine)})")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if key in unexpected_keys:
            unexpected_keys.remove(key)


class InitFlagMixin:
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

    def set_initialized(self, value: bool = True):
        """Record that the quantizer has (or, with ``value=False``, lacks) its statistics."""
        self.initialized.fill_(value)
        self._init_cache = value

    def mark_uninitialized(self) -> None:
        """Forget the statistics: the next call initialises them again from its input."""
        self.set_initialized(False)
