r"""Loihi 2's operation in an :class:`~snnquant.export.IntegerNetwork`: one
:class:`~snnquant.targets.LoihiLIFLayer` (a Lava ``Dense`` + ``LIF`` pair), in Lava's fixed point
(what the chip operations share: :mod:`snnquant.targets._op`).

The widths and ranges of Loihi's registers (as Lava 0.10's fixed-point models hold them) are
written here once: the operation checks its fields against them, and
:class:`~snnquant.targets.LoihiProfile`'s defaults are them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ...functional.chip_neurons import lava_weight, loihi_lif_step
from ...functional.int_limits import int_range
from .._op import (DenseLayerOp, Problem, bias_problems, checked_counts, delayed, int_problems,
                   stacked_counts)

__all__ = ["LoihiLayerOp", "WEIGHT_BITS", "WEIGHT_EXP_RANGE", "DECAY_RANGE", "VTH_RANGE",
           "BIAS_RANGE", "BIAS_EXP_RANGE", "STATE_BITS"]

#: The signed width of a weight :math:`W` (Lava's weight :math:`2W`, ``num_weight_bits=8``).
WEIGHT_BITS = 8
#: ``Dense``'s ``weight_exp``.
WEIGHT_EXP_RANGE = (-8, 7)
#: ``du``, ``dv`` (12-bit unsigned, ``PyLifModelBitAcc``'s docstring).
DECAY_RANGE = int_range(12, False)
#: The threshold mantissa ``vth`` (17-bit unsigned).
VTH_RANGE = int_range(17, False)
#: ``bias_mant`` (13-bit signed).
BIAS_RANGE = int_range(13, True)
#: ``bias_exp`` (3-bit unsigned): the bias is ``bias_mant << bias_exp``.
BIAS_EXP_RANGE = int_range(3, False)
#: The signed width of :math:`u` and :math:`v`.
STATE_BITS = 24


@dataclass
class LoihiLayerOp(DenseLayerOp):
    r"""A Lava ``Dense`` + ``LIF`` pair (a :class:`~snnquant.targets.LoihiLIFLayer`), in Lava's
    fixed point.

    Per step, with the input spikes :math:`s` of the step before (``Dense`` delays by one) and
    the Lava weights :math:`2W`, it computes
    :func:`~snnquant.functional.chip_neurons.loihi_lif_step`:

    .. math::

        a &= (2W s) \ll e\\
        u &\leftarrow \mathrm{wrap}_{b}(\mathrm{sign}(u)\lfloor |u(4095 - d_u)| / 4096\rfloor
            + 64 a)\\
        v &\leftarrow \mathrm{clip}(\mathrm{sign}(v)\lfloor |v(4096 - d_v)| / 4096\rfloor + u
            + \beta 2^{\beta_e},\ -2^{b-1}+1,\ 2^{b-1}-1)\\
        S &= [v > 64\vartheta],\qquad v \leftarrow v(1 - S)

    and outputs the spikes :math:`S`. :math:`u` and :math:`v` start at 0 on every call.

    Attributes:
        name: the layer's name in the chip network.
        weight: ``[out, in]`` 8-bit integer weights :math:`W` (Lava's weights are :math:`2W`).
        weight_exp: :math:`e` (-8 to 7).
        bias: ``[out]`` bias mantissas :math:`\beta` (13-bit signed), or ``None``.
        bias_exp: :math:`\beta_e` (0 to 7).
        vth: :math:`\vartheta` (17-bit unsigned).
        du, dv: the decays (0 to 4095).
        state_bits: :math:`b`, the width of :math:`u` and :math:`v` (24).
        inputs: as every operation's.
    """

    name: str
    weight: torch.Tensor
    weight_exp: int
    bias: Optional[torch.Tensor]
    bias_exp: int
    vth: int
    du: int
    dv: int
    state_bits: int = 24
    inputs: Tuple[int, ...] = ()

    op_type = "loihi_layer"
    chip = "loihi"
    input_max = 1

    weight_bits = WEIGHT_BITS

    def problems(self) -> List[Problem]:
        """``(field, value, why)`` of the fields out of their ranges (empty when valid)."""
        found = int_problems(self, [("state_bits", 2, 32), ("weight_exp", *WEIGHT_EXP_RANGE),
                                    ("bias_exp", *BIAS_EXP_RANGE), ("vth", *VTH_RANGE),
                                    ("du", *DECAY_RANGE), ("dv", *DECAY_RANGE)])
        found += self.weight_problems()
        return found or bias_problems(self, self.out_shape[0], *BIAS_RANGE)

    def run(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The output spikes ``[T, N, out]`` (``int64``) of the input spikes ``[T, N, in]``."""
        spikes = delayed(checked_counts(self, x_seq, self.in_shape))
        weight = lava_weight(self.weight)
        bias = None if self.bias is None else self.bias.to(torch.float64)
        state, out = None, []
        for t in range(spikes.shape[0]):
            s, state = loihi_lif_step(state, spikes[t], weight, bias, vth=self.vth, du=self.du,
                                      dv=self.dv, weight_exp=self.weight_exp,
                                      bias_exp=self.bias_exp, state_bits=self.state_bits)
            out.append(s)
        return stacked_counts(out, spikes, self.out_shape)

    def bits(self) -> dict:
        """Bit widths: ``{'weight': 8, 'bias': 13 or None, 'v': state_bits}``."""
        return {"weight": WEIGHT_BITS, "bias": 13 if self.bias is not None else None,
                "v": self.state_bits}

    def text(self) -> str:
        """One line for :class:`~snnquant.export.IntegerNetwork`'s ``str``."""
        return (f"Loihi Dense+LIF {tuple(self.weight.shape)}, weight_exp {self.weight_exp}, "
                f"vth {self.vth}, du {self.du}, dv {self.dv}, "
                f"{'bias' if self.bias is not None else 'no bias'}")
