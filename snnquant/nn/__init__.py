"""Step-compatible modules: quantizers, quantized layers and quantized neurons."""

from .quantizers import (Grid, QuantizerBase, Round, Clamp, StepQuantize, KBitQuantize,
                         AffineKBitQuantize, ClampByLinear, StochasticRound, QuantizedBits,
                         StateQuant, Quantize, UniformQuantizer, LSQQuantizer, MinMaxObserver,
                         MinMaxQuantizer, WeightGridBiasQuantizer, BinaryQuantizer,
                         TernaryQuantizer)
from .layers import QuantLinear, QuantConv1d, QuantConv2d
from .neurons import QuantIFNode, QuantLIFNode, QuantParametricLIFNode, uniform_membrane_step
from .custom import CustomIFNode, CustomLIFNode, CustomNode, custom_neuron
from .batchnorm import (FoldedBatchNorm1d, FoldedBatchNorm2d, FoldedStepBatchNorm1d,
                        FoldedStepBatchNorm2d, foldable_batchnorm, folded_batchnorms,
                        freeze_batchnorm)

__all__ = [
    "Grid", "QuantizerBase", "Round", "Clamp", "StepQuantize", "KBitQuantize", "AffineKBitQuantize",
    "ClampByLinear", "StochasticRound", "QuantizedBits", "StateQuant", "Quantize",
    "UniformQuantizer", "LSQQuantizer", "MinMaxObserver", "MinMaxQuantizer",
    "WeightGridBiasQuantizer", "BinaryQuantizer", "TernaryQuantizer",
    "QuantLinear", "QuantConv1d", "QuantConv2d",
    "QuantIFNode", "QuantLIFNode", "QuantParametricLIFNode", "uniform_membrane_step",
    "CustomNode", "CustomIFNode", "CustomLIFNode", "custom_neuron",
    "FoldedBatchNorm1d", "FoldedBatchNorm2d", "FoldedStepBatchNorm1d", "FoldedStepBatchNorm2d",
    "foldable_batchnorm", "folded_batchnorms", "freeze_batchnorm",
]
