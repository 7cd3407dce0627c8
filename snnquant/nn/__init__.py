"""Step-compatible modules: quantizers, quantized layers and quantized neurons."""

from .quantizers import (QuantizerBase, Round, Clamp, StepQuantize, KBitQuantize, AffineKBitQuantize,
                         ClampByLinear, StochasticRound, QuantizedBits, StateQuant, Quantize,
                         UniformQuantizer, LSQQuantizer, MinMaxQuantizer, WeightGridBiasQuantizer)
from .layers import QuantLinear, QuantConv1d, QuantConv2d
from .neurons import QuantIFNode, QuantLIFNode, QuantParametricLIFNode
from .custom import CustomIFNode, CustomLIFNode, CustomNode, custom_neuron

__all__ = [
    "QuantizerBase", "Round", "Clamp", "StepQuantize", "KBitQuantize", "AffineKBitQuantize",
    "ClampByLinear", "StochasticRound", "QuantizedBits", "StateQuant", "Quantize",
    "UniformQuantizer", "LSQQuantizer", "MinMaxQuantizer", "WeightGridBiasQuantizer",
    "QuantLinear", "QuantConv1d", "QuantConv2d",
    "QuantIFNode", "QuantLIFNode", "QuantParametricLIFNode",
    "CustomNode", "CustomIFNode", "CustomLIFNode", "custom_neuron",
]
