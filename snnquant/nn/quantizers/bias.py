r"""Bias quantization on the grid of the layer weight step."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ... import functional as QF
from .base import ConfigCheckMixin, Grid, QuantizerBase, check_bits, signed_range

__all__ = ['WeightGridBiasQuantizer']


class WeightGridBiasQuantizer(ConfigCheckMixin, QuantizerBase):
    r"""Bias quantizer on the grid of its layer's weight step (the accumulator unit of binary
    spike inputs), as integer SNN hardware stores biases.

    .. math::

        \hat b = s_w\,\mathrm{clamp}(\mathrm{round}(b / s_w), -2^{B-1}, 2^{B-1} - 1),\qquad
        \frac{\partial \hat b}{\partial b} = [-2^{B-1} \le b/s_w \le 2^{B-1} - 1]

    with :math:`s_w = 2^{\lfloor \log_2 s \rfloor}`, :math:`s` the layer's current weight step
    (the smallest one with per-channel steps; no gradient flows to it): the weight step itself
    when it is a power of two, else the power of two just below it, so that the bias is always an
    integer on a binary grid (exact integer export). Bound with a neuron as well, :math:`s_w` is
    the smaller of that and the neuron's power-of-two membrane step. It has no parameter of its
    own, so no optimizer can push its step to zero.
    The layer binds itself with :meth:`bind`.

    Args:
        bits: bit width :math:`B` of the integer bias (2..32).
    """

    def __init__(self, bits: int = 16, step_mode: str = "s"):
        super().__init__(step_mode)
        self.bits = check_bits(bits, "bits", 2)
        self.qmin, self.qmax = signed_range(bits, True)
        self._register_bits(bits)
        self.__dict__["_layer"] = None  # a plain reference, not a submodule

    def bind(self, layer: nn.Module, neuron: Optional[nn.Module] = None
             ) -> "WeightGridBiasQuantizer":
        """Use the weight quantizer of ``layer`` (a quantized layer: its ``weight_quant`` and the
        weight that quantizer sees, ``effective_weight()``); with ``neuron``, the quantized
        neuron whose membrane the layer charges, the step is the finer of the weight step and
        that neuron's power-of-two membrane step (the grid ``fold_batchnorm`` gives a folded
        bias)."""
        self.__dict__["_layer"] = layer
        self.__dict__["_neuron"] = neuron
        return self

    def weight_step(self) -> torch.Tensor:
        """:math:`s_w`, detached (initialising the weight quantizer from the weight if needed)."""
        layer = self.__dict__["_layer"]
        if layer is None or getattr(layer, "weight_quant", None) is None:
            raise RuntimeError("WeightGridBiasQuantizer is not bound to a layer with a weight "
                               "quantizer (call .bind(layer))")
        wq = layer.weight_quant
        wq.ensure_initialized(layer.effective_weight())
        grid = wq.grid()
        if grid is None or grid.step is None:
            raise ValueError(f"bias on the weight grid needs a weight quantizer with a uniform "
                             f"grid, got {type(wq).__name__}")
        step = torch.exp2(torch.floor(torch.log2(grid.step.detach().min())))
        membrane = self.__dict__.get("_neuron")
        vq = None if membrane is None else getattr(membrane, "v_quant", None)
        if vq is not None and vq.is_initialized:
            v_grid = vq.grid()
            if v_grid is not None and v_grid.per_tensor and v_grid.step is not None:
                v_step = v_grid.step.detach().to(step)
                # a learned membrane step that is not a power of two is left out; chosen with
                # tensor arithmetic, not a branch on its value (no host read, no graph break)
                power_of_two = torch.exp2(torch.round(torch.log2(v_step))) == v_step
                step = torch.where(power_of_two, torch.minimum(step, v_step), step)
        return step

    def quantize(self, x):
        step = self.weight_step().to(device=x.device, dtype=x.dtype)
        return QF.lsq_quantize_unchecked(x, step, self.qmin, self.qmax)

    def grid(self) -> Grid:
        r"""The power-of-two grid :math:`s_w \cdot [q_{min}, q_{max}]`."""
        return Grid(self.weight_step(), self.qmin, self.qmax, None, True, bits=self.bits)

    def config(self):
        return dict(super().config(), bits=self.bits, signed=True, per_channel=False,
                    power_of_two=True)

    def extra_repr(self):
        return f"bits={self.bits}, {super().extra_repr()}"
