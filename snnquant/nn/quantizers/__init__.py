r"""Step-compatible quantizer modules, one concept per file.

* :mod:`~snnquant.nn.quantizers.base`: :class:`QuantizerBase` and :class:`Grid`, the interface
  every other part of snnquant reads;
* :mod:`~snnquant.nn.quantizers.elementwise`: SpikingJelly-style element-wise wrappers;
* :mod:`~snnquant.nn.quantizers.lsq`: learned step size (:class:`LSQQuantizer`);
* :mod:`~snnquant.nn.quantizers.observers`: range observers and :class:`MinMaxQuantizer`;
* :mod:`~snnquant.nn.quantizers.fixed`: fixed grids (:class:`UniformQuantizer`,
  :class:`QuantizedBits`, :class:`StateQuant`);
* :mod:`~snnquant.nn.quantizers.bias`: :class:`WeightGridBiasQuantizer`;
* :mod:`~snnquant.nn.quantizers.binary`: binary and ternary weights (:class:`BinaryQuantizer`,
  :class:`TernaryQuantizer`);
* :mod:`~snnquant.nn.quantizers.membrane`: the one factory of a neuron's membrane quantizer
  (:func:`make_membrane_quantizer`, :func:`uniform_membrane_step`).
"""

from .base import Grid, QuantizerBase, check_bits, signed_range
from .elementwise import (AffineKBitQuantize, Clamp, ClampByLinear, KBitQuantize, Quantize, Round,
                          StepQuantize, StochasticRound)
from .fixed import QuantizedBits, StateQuant, UniformQuantizer
from .lsq import LSQQuantizer
from .observers import MinMaxObserver, MinMaxQuantizer
from .bias import WeightGridBiasQuantizer
from .binary import BinaryQuantizer, TernaryQuantizer
from .membrane import MEMBRANE_QUANTIZERS, make_membrane_quantizer, uniform_membrane_step

__all__ = [
    "Grid",
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
    "MinMaxObserver",
    "MinMaxQuantizer",
    "WeightGridBiasQuantizer",
    "BinaryQuantizer",
    "TernaryQuantizer",
    "check_bits",
    "signed_range",
    "MEMBRANE_QUANTIZERS",
    "make_membrane_quantizer",
    "uniform_membrane_step",
]
