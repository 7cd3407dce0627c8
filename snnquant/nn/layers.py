r"""Quantized synaptic layers: drop-in replacements for SpikingJelly's ``layer.Linear/Conv1d/Conv2d``.

The forward pass uses the quantized weight :math:`\hat W = Q_w(W)` and bias :math:`\hat b = Q_b(b)`:

.. math::

    Y = X \hat W^{\top} + \hat b \quad\text{(linear)},\qquad Y = \hat W * X + \hat b\quad\text{(conv)}

In ``step_mode='m'`` the time dimension is folded into the batch (``[T, N, ...] -> [T*N, ...]``),
exactly as SpikingJelly's layers do.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from spikingjelly.activation_based import layer

from .quantizers import (BinaryQuantizer, LSQQuantizer, QuantizerBase, WeightGridBiasQuantizer,
                         check_bits)

__all__ = ["QuantLinear", "QuantConv1d", "QuantConv2d", "make_weight_quantizer",
           "make_bias_quantizer", "DEFAULT_BIAS_BITS"]

QuantArg = Union[QuantizerBase, int, None]

#: Bit width of the bias that a layer built with ``bias_quant='auto'`` gets (as ``QuantConfig``).
DEFAULT_BIAS_BITS = 16


def make_weight_quantizer(spec: QuantArg, name: str, num_channels: Optional[int] = None,
                          per_channel: bool = False) -> Optional[QuantizerBase]:
    r"""Turn a ``weight_quant``/``bias_quant`` argument into a quantizer module.

    A module is used as is; an int ``b`` means ``LSQQuantizer(b, power_of_two=True)`` (signed,
    per tensor unless ``per_channel``), the default of :class:`~snnquant.QuantConfig`
    (``weight_quantizer='lsq_pow2'``), so that a layer built by hand exports to integers like one
    made by :func:`~snnquant.quantize_model`; ``1`` means binary weights
    (:class:`~snnquant.nn.BinaryQuantizer`, learned power-of-two :math:`\alpha`, as
    ``QuantConfig(weight_bits=1)``); ``None`` means no quantization.
    """
    if spec is None or isinstance(spec, QuantizerBase):
        return spec
    if isinstance(spec, nn.Module):
        raise TypeError(f"{name} must be a snnquant quantizer module, a bit width or None, got "
                        f"{type(spec).__name__}")
    bits = check_bits(spec, name, 1, 32)
    if bits == 1:  # binary weights, learned power-of-two alpha (as QuantConfig(weight_bits=1))
        return BinaryQuantizer(alpha="learned", per_channel=per_channel, channel_dim=0,
                               power_of_two=True, num_channels=num_channels)
    return LSQQuantizer(bits, signed=True, per_channel=per_channel, channel_dim=0,
                        power_of_two=True, num_channels=num_channels)


def make_bias_quantizer(spec, weight_quant: Optional[QuantizerBase], has_bias: bool):
    """Turn a ``bias_quant`` argument into a quantizer module.

    ``'auto'`` (the layers' default) means a :data:`DEFAULT_BIAS_BITS`-bit bias on the weight grid
    (:class:`~snnquant.nn.WeightGridBiasQuantizer`) when the layer has a bias and quantized
    weights, else none (as :class:`~snnquant.QuantConfig`'s ``bias_bits=16``); an int ``b`` means
    a ``b``-bit bias on the weight grid; a module is used as is; ``None`` keeps a float bias.
    """
    if isinstance(spec, str):
        if spec != "auto":
            raise ValueError(f"bias_quant must be 'auto', a quantizer module, a bit width or None, "
                             f"got {spec!r}")
        if not has_bias or weight_quant is None:
            return None
        spec = DEFAULT_BIAS_BITS
    if not has_bias and spec is not None:
        raise ValueError(f"bias_quant={spec!r} was given but the layer has bias=False")
    if isinstance(spec, int) and not isinstance(spec, bool):
        if weight_quant is None:
            raise ValueError(f"bias_quant={spec} (bits on the weight grid) needs a weight "
                             "quantizer; pass a quantizer module instead")
        return WeightGridBiasQuantizer(check_bits(spec, "bias_quant", 2, 32))
    return make_weight_quantizer(spec, "bias_quant")


class _QuantLayerMixin:
    """Shared quantized-weight machinery of the layers."""

    _spatial_dims = 0  # dimensions after the channel one in the output (0: channels last)

    def _init_quant(self, weight_quant: QuantArg, bias_quant: QuantArg):
        out_channels = self.weight.shape[0]
        self.weight_quant = make_weight_quantizer(weight_quant, "weight_quant", out_channels)
        self.bias_quant = make_bias_quantizer(bias_quant, self.weight_quant, self.bias is not None)
        bind = getattr(self.bias_quant, "bind", None)
        if callable(bind):  # a bias quantizer that reads the layer (its weight grid)
            bind(self)
        # quantizers must follow the layer's device/dtype
        for q in (self.weight_quant, self.bias_quant):
            if q is not None:
                q.to(device=self.weight.device, dtype=self.weight.dtype)

    def _cache_key(self):
        """Identity and version counter of every tensor the quantized weight and bias depend on."""
        key = []
        for module in (self.weight_quant, self.bias_quant):
            if module is not None:
                for t in list(module.parameters()) + list(module.buffers()):
                    key.append((t.data_ptr(), t._version, t.device, t.dtype))
        tensors = [self.weight, self.bias]
        bn = self.batchnorm
        if bn is not None:
            tensors += list(bn.parameters()) + list(bn.buffers())
        for t in tensors:
            if t is not None:
                key.append((t.data_ptr(), t._version, t.device, t.dtype))
        return tuple(key)

    def _quantized_parameters(self):
        """``(Q_w(W), Q_b(b))``, computed once per forward; in eval mode without autograd the
        result is kept until the weight, the bias or a quantizer's state changes (checked with
        the tensors' version counters, no device read)."""
        cacheable = not self.training and not torch.is_grad_enabled() and \
            not torch.compiler.is_compiling()
        if cacheable:
            key = self._cache_key()
            cached = self.__dict__.get("_qparam_cache")
            if cached is not None and cached[0] == key:
                return cached[1]
        result = (self.quantized_weight(), self.quantized_bias())
        if cacheable:
            self.__dict__["_qparam_cache"] = (self._cache_key(), result)
        else:
            self.__dict__.pop("_qparam_cache", None)
        return result

    def quantized_weight(self) -> torch.Tensor:
        """The weight used in forward: :math:`Q_w(W)` (or :math:`W` without a weight quantizer);
        with a BatchNorm folded in during training, :math:`Q_w(W')` of the folded weight."""
        w = self.effective_weight()
        if self.weight_quant is None:
            return w
        return self.weight_quant.quantize(w)

    def quantized_bias(self) -> Optional[torch.Tensor]:
        """The bias used in forward: :math:`Q_b(b)`, :math:`b`, or ``None``; with a BatchNorm
        folded in during training, the folded bias :math:`Q_b(b')` (quantized by the
        BatchNorm's ``folded_bias_quant``, or float without one)."""
        bn = self.batchnorm
        if bn is not None:
            b = self.effective_bias()
            return b if bn.folded_bias_quant is None else bn.folded_bias_quant.quantize(b)
        if self.bias is None or self.bias_quant is None:
            return self.bias
        return self.bias_quant.quantize(self.bias)

    # --- BatchNorm folded in during training (snnquant.nn.batchnorm) ----------------------------

    @property
    def batchnorm(self):
        """The BatchNorm folded into this layer during training, or ``None``."""
        return self.__dict__.get("_folded_bn")

    def attach_batchnorm(self, bn: nn.Module, bias_bits: Optional[int] = DEFAULT_BIAS_BITS,
                         neuron: Optional[nn.Module] = None):
        r"""Train this layer as the folded layer of itself and ``bn``, the BatchNorm right after it.

        .. math::

            s = \frac{\gamma}{\sqrt{\sigma^2 + \epsilon}},\qquad W' = W\,s,\qquad
            b' = (b - \mu)\,s + \beta

        In evaluation, and in training once :func:`~snnquant.nn.freeze_batchnorm` froze the
        statistics, the layer computes :math:`Q_w(W') * x + Q_b(b')` and ``bn`` passes its input
        through; in training with batch statistics it computes :math:`Q_w(W') * x / s + b` and
        ``bn`` normalises that (see :mod:`snnquant.nn.batchnorm`). ``bn`` keeps its parameters
        and statistics and becomes a ``Folded*BatchNorm*`` of the same base class.

        Args:
            bn: ``nn.BatchNorm1d/2d`` or SpikingJelly's ``layer.BatchNorm1d/2d`` with running
                statistics and one feature per output of this layer.
            bias_bits: bit width of the folded bias on the weight grid
                (:class:`~snnquant.nn.WeightGridBiasQuantizer`), or ``None`` for a float folded
                bias (which the integer export later puts on a grid).
            neuron: the quantized neuron the layer charges: the folded bias then lies on the
                finer of the weight grid and its membrane grid, as ``fold_batchnorm`` puts it.
        """
        from .batchnorm import attach
        if self.batchnorm is not None:
            raise ValueError("a BatchNorm is already folded into this layer")
        attach(self, bn, bias_bits, neuron)

    def detach_batchnorm(self) -> None:
        """Undo :meth:`attach_batchnorm`: the BatchNorm becomes its plain class again (parameters
        and statistics unchanged) and this layer quantizes its own weight. The weight quantizer
        keeps its statistics, learned for the folded weight (``weight_quant.mark_uninitialized()``
        re-initialises them from :math:`W` at the next call)."""
        bn = self.__dict__.pop("_folded_bn", None)
        if bn is not None:
            bn.detach_from_layer()

    def _channels(self, t: torch.Tensor) -> torch.Tensor:
        """A per-output-channel vector shaped to broadcast over this layer's output."""
        return t.reshape((-1,) + (1,) * self._spatial_dims)

    def batchnorm_scale(self) -> torch.Tensor:
        r""":math:`s = \gamma / \sqrt{\sigma^2 + \epsilon}` of the folded BatchNorm (running
        statistics), one value per output channel."""
        bn = self.batchnorm
        scale = torch.rsqrt(bn.running_var + bn.eps)
        return scale * bn.weight if bn.affine else scale

    def effective_weight(self) -> torch.Tensor:
        """The weight the weight quantizer sees: :math:`W`, or the folded :math:`W' = W s`."""
        if self.batchnorm is None:
            return self.weight
        scale = self.batchnorm_scale()
        return self.weight * scale.reshape((-1,) + (1,) * (self.weight.dim() - 1))

    def effective_bias(self) -> Optional[torch.Tensor]:
        r"""The bias before its quantizer: :math:`b`, or the folded
        :math:`b' = (b - \mu)\,s + \beta`."""
        bn = self.batchnorm
        if bn is None:
            return self.bias
        b = -bn.running_mean if self.bias is None else self.bias - bn.running_mean
        b = b * self.batchnorm_scale()
        return b + bn.bias if bn.affine else b

    def _apply_parameters(self, run, x):
        """``run(x, weight, bias)`` with the quantized parameters; with a BatchNorm folded in
        and batch statistics in use, :math:`Q_w(W') * x / s + b` for the BatchNorm to normalise.
        """
        bn = self.batchnorm
        if bn is None or bn.folded_form:
            return run(x, *self._quantized_parameters())
        if not bn.__dict__.get("_started", False):
            with torch.no_grad():
                bn.start_statistics(run(x, self.weight, self.bias), -1 - self._spatial_dims)
        scale = self.batchnorm_scale()
        dead = scale == 0  # gamma = 0 (zero-initialised residual BatchNorms): W' = 0
        y = run(x, self.quantized_weight(), None) / self._channels(torch.where(dead, 1.0, scale))
        if bool(dead.any()):
            # the BatchNorm outputs beta there whatever it normalises; the float W x gives it
            # the statistics and gamma the gradient of the float network
            y = torch.where(self._channels(dead), run(x, self.weight, None), y)
        return y if self.bias is None else y + self._channels(self.bias)

    def _quant_extra_repr(self) -> str:
        wb = None if self.weight_quant is None else self.weight_quant.num_bits
        bb = None if self.bias_quant is None else self.bias_quant.num_bits
        return f", weight_bits={wb}, bias_bits={bb}"


class QuantLinear(_QuantLayerMixin, layer.Linear):
    r"""Linear layer with quantized weight and bias; drop-in for ``layer.Linear``/``nn.Linear``.

    .. math::

        Y = X\, Q_w(W)^{\top} + Q_b(b)

    Gradients flow to :math:`W` and :math:`b` through the quantizers' straight-through estimators.

    Args:
        in_features: as ``layer.Linear`` (and so are ``out_features``, ``bias``, ``step_mode``).
        weight_quant: a quantizer module, a bit width (``LSQQuantizer(bits, power_of_two=True)``,
            as ``quantize_model``'s default) or ``None``.
        bias_quant: ``'auto'`` (a 16-bit bias on the weight grid when the weights are
            quantized, as ``quantize_model``), a quantizer module, a bit width (the bias on the
            weight grid, :class:`~snnquant.nn.WeightGridBiasQuantizer`) or ``None`` (float bias).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, step_mode="s",
                 weight_quant: QuantArg = 8, bias_quant: QuantArg = "auto", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, step_mode=step_mode)
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)
        self._init_quant(weight_quant, bias_quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "m" and x.dim() < 2:
            raise ValueError(f"QuantLinear in step_mode='m' expects x with shape [T, N, ...] "
                             f"(last dimension in_features), got shape {tuple(x.shape)}")
        return self._apply_parameters(F.linear, x)

    def extra_repr(self):
        return super().extra_repr() + self._quant_extra_repr()


class _QuantConvNd(_QuantLayerMixin):
    _expected_dim = 0
    _shape_text = ""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", step_mode="s",
                 weight_quant: QuantArg = 8, bias_quant: QuantArg = "auto", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                         bias, padding_mode, step_mode=step_mode)
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)
        self._init_quant(weight_quant, bias_quant)

    def _conv(self, x):
        return self._apply_parameters(self._conv_forward, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "s":
            self._check_single_step_input(x)
            return self._conv(x)
        if x.dim() != self._expected_dim:
            raise ValueError(f"{type(self).__name__} in step_mode='m' expects x with shape "
                             f"[T, N, ...] ({self._shape_text} here), got shape {tuple(x.shape)}")
        T, N = x.shape[0], x.shape[1]
        y = self._conv(x.flatten(0, 1))
        return y.view(T, N, *y.shape[1:])

    def _check_single_step_input(self, x: torch.Tensor) -> None:
        """Refuse an input that is neither ``[N, C, ...]`` nor ``[C, ...]`` in step mode 's',
        pointing a ``[T, N, C, ...]`` sequence to step mode 'm' (shapes only, no data read)."""
        if x.dim() in (self._expected_dim - 1, self._expected_dim - 2):
            return
        name = type(self).__name__
        batched = "[N, " + self._shape_text[len("[T, N, "):]
        hint = (f"; a sequence {self._shape_text} needs step_mode='m' (for example "
                f"spikingjelly's functional.set_step_mode(net, 'm'))"
                if x.dim() == self._expected_dim else "")
        raise ValueError(f"{name} in step_mode='s' expects x with shape {batched} (or without "
                         f"N), got shape {tuple(x.shape)}{hint}")

    def extra_repr(self):
        return super().extra_repr() + self._quant_extra_repr()


class QuantConv1d(_QuantConvNd, layer.Conv1d):
    r"""1-d convolution with quantized weight and bias; drop-in for ``layer.Conv1d``/``nn.Conv1d``.

    .. math::

        Y = Q_w(W) * X + Q_b(b)

    Args:
        in_channels: as ``layer.Conv1d`` (and so are the other arguments up to ``step_mode``).
        weight_quant: a quantizer module, a bit width (``LSQQuantizer(bits, power_of_two=True)``,
            as ``quantize_model``'s default) or ``None``.
        bias_quant: ``'auto'`` (a 16-bit bias on the weight grid when the weights are
            quantized, as ``quantize_model``), a quantizer module, a bit width (the bias on the
            weight grid, :class:`~snnquant.nn.WeightGridBiasQuantizer`) or ``None`` (float bias).
    """

    _expected_dim = 4
    _spatial_dims = 1
    _shape_text = "[T, N, C, L]"


class QuantConv2d(_QuantConvNd, layer.Conv2d):
    r"""2-d convolution with quantized weight and bias; drop-in for ``layer.Conv2d``/``nn.Conv2d``.

    .. math::

        Y = Q_w(W) * X + Q_b(b)

    Args:
        in_channels: as ``layer.Conv2d`` (and so are the other arguments up to ``step_mode``).
        weight_quant: a quantizer module, a bit width (``LSQQuantizer(bits, power_of_two=True)``,
            as ``quantize_model``'s default) or ``None``.
        bias_quant: ``'auto'`` (a 16-bit bias on the weight grid when the weights are
            quantized, as ``quantize_model``), a quantizer module, a bit width (the bias on the
            weight grid, :class:`~snnquant.nn.WeightGridBiasQuantizer`) or ``None`` (float bias).
    """

    _expected_dim = 5
    _spatial_dims = 2
    _shape_text = "[T, N, C, H, W]"
