"""Quantizer functions: pure functions and ``torch.autograd.Function`` classes, no state.

``from snnquant import functional as Q`` replaces ``spikingjelly.activation_based.quantize``:
the same names (``round``, ``ceil``, ``floor``, ``clamp``, ``step_quantize``,
``multi_level_spike_count``, ``k_bit_quantize``, ``affine_k_bit_quantize``, ``clamp_by_linear`` and
the ``*ATGF`` autograd classes) with the same arguments, forward values and gradients. It also holds
shok's rounding functions, smooth and stochastic rounding, QKeras's ``quantized_bits``, LSQ and
snntorch's state quantization.
"""

from .clamping import (
    ClampSTE,
    MultiLevelSpikeCountSTE,
    clamp,
    clamp_by_linear,
    multi_level_spike_count,
)
from ._validation import check_bit_width, compute_dtype
from .binary import binary_quantize, ternary_quantize
from .lsq import lsq_quantize, lsq_quantize_unchecked
from .rounding import (
    CeilSTE,
    FloorSTE,
    PassRound,
    RoundSTE,
    ScaleGrad,
    SoftRound,
    StepQuantizeSTE,
    ceil,
    floor,
    pass_round,
    round,
    round_decimals,
    scale_grad,
    smooth_round,
    soft_round,
    step_quantize,
)
from .state import StateQuantizer, state_quant
from .stochastic import round_through, stochastic_round
from .uniform import KBitQuantizeSTE, affine_k_bit_quantize, k_bit_quantize, quantized_bits

# SpikingJelly's names for the autograd classes (spikingjelly.activation_based.quantize).
RoundATGF = RoundSTE
CeilATGF = CeilSTE
FloorATGF = FloorSTE
ClampATGF = ClampSTE
StepQuantizeATGF = StepQuantizeSTE
MultiLevelSpikeCountATGF = MultiLevelSpikeCountSTE
KBitQuantizeATGF = KBitQuantizeSTE

__all__ = [
    # spikingjelly.activation_based.quantize
    "round",
    "ceil",
    "floor",
    "clamp",
    "step_quantize",
    "multi_level_spike_count",
    "k_bit_quantize",
    "affine_k_bit_quantize",
    "clamp_by_linear",
    "RoundATGF",
    "CeilATGF",
    "FloorATGF",
    "ClampATGF",
    "StepQuantizeATGF",
    "MultiLevelSpikeCountATGF",
    "KBitQuantizeATGF",
    # our names for the same autograd classes
    "RoundSTE",
    "CeilSTE",
    "FloorSTE",
    "ClampSTE",
    "StepQuantizeSTE",
    "MultiLevelSpikeCountSTE",
    "KBitQuantizeSTE",
    # shok
    "PassRound",
    "SoftRound",
    "ScaleGrad",
    "pass_round",
    "soft_round",
    "scale_grad",
    # more rounding
    "smooth_round",
    "round_decimals",
    "stochastic_round",
    "round_through",
    # QKeras, LSQ, snntorch
    "quantized_bits",
    "lsq_quantize",
    "lsq_quantize_unchecked",
    "check_bit_width",
    "compute_dtype",
    "binary_quantize",
    "ternary_quantize",
    "state_quant",
    "StateQuantizer",
]

from .neuron import (  # noqa: E402
    QuantNeuronFunction,
    membrane_reset_values,
    quant_neuron_multi_step,
    quant_neuron_step_reference,
    surrogate_derivative,
)

__all__ += [
    "QuantNeuronFunction",
    "membrane_reset_values",
    "quant_neuron_multi_step",
    "quant_neuron_step_reference",
    "surrogate_derivative",
]
