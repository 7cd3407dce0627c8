"""Quantizer functions: pure functions and ``torch.autograd.Function`` classes, no state.

``from snnquant import functional as Q`` replaces ``spikingjelly.activation_based.quantize``:
the same names (``round``, ``ceil``, ``floor``, ``clamp``, ``step_quantize``,
``multi_level_spike_count``, ``k_bit_quantize``, ``affine_k_bit_quantize``, ``clamp_by_linear``, the
autograd classes under both SpikingJelly 2.0.0's names (``RoundATGF``, ...) and its current names
(``round_atgf``, ...), and the helpers ``clamp_backward``, ``step_quantize_forward`` and
``k_bit_quantize_forward``) with the same arguments, forward values and gradients. It also holds
shok's rounding functions, smooth and stochastic rounding, QKeras's ``quantized_bits``, LSQ and
snntorch's state quantization.
"""

from .clamping import (
    ClampSTE,
    MultiLevelSpikeCountSTE,
    clamp,
    clamp_backward,
    clamp_by_linear,
    multi_level_spike_count,
)
from ._validation import compute_dtype
from .int_limits import BitWidthTypeError, check_bit_width, pow2_exponent
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
    step_quantize_forward,
)
from .state import STATE_QUANT_MAX_BITS, StateQuantizer, state_quant
from .stochastic import round_through, stochastic_round
from .uniform import (
    KBitQuantizeSTE,
    affine_k_bit_quantize,
    k_bit_quantize,
    k_bit_quantize_forward,
    quantized_bits,
)

# SpikingJelly's names for the autograd classes (spikingjelly.activation_based.quantize).
RoundATGF = RoundSTE
CeilATGF = CeilSTE
FloorATGF = FloorSTE
ClampATGF = ClampSTE
StepQuantizeATGF = StepQuantizeSTE
MultiLevelSpikeCountATGF = MultiLevelSpikeCountSTE
KBitQuantizeATGF = KBitQuantizeSTE

# The same classes under the names of SpikingJelly's current activation_based.quantize (after 2.0.0).
round_atgf = RoundSTE
ceil_atgf = CeilSTE
floor_atgf = FloorSTE
clamp_atgf = ClampSTE
step_quantize_atgf = StepQuantizeSTE
multi_level_spike_count_atgf = MultiLevelSpikeCountSTE
k_bit_quantize_atgf = KBitQuantizeSTE

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
    # SpikingJelly's current names (after 2.0.0)
    "round_atgf",
    "ceil_atgf",
    "floor_atgf",
    "clamp_atgf",
    "clamp_backward",
    "step_quantize_forward",
    "step_quantize_atgf",
    "multi_level_spike_count_atgf",
    "k_bit_quantize_forward",
    "k_bit_quantize_atgf",
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
    "BitWidthTypeError",
    "compute_dtype",
    "pow2_exponent",
    "binary_quantize",
    "ternary_quantize",
    "state_quant",
    "StateQuantizer",
    "STATE_QUANT_MAX_BITS",
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
