r"""Integer export: run a quantization-aware-trained spiking network in integers, exactly.

* :func:`fold_batchnorm`: fold BatchNorm into the preceding quantized layer;
* :func:`to_integer`: the integer network description (:class:`IntegerNetwork`), checked by
  :func:`check_network` in every consumer (:class:`IntegerNetworkError`);
* :class:`IntegerSNN`: exact integer simulator of a description;
* :func:`compare_integer` / :func:`integer_agreement`: spike-by-spike comparison with the float model;
* :func:`save_integer` / :func:`load_integer`: one safetensors file, no pickle;
* :func:`to_nir` / :func:`from_nir`: the Neuromorphic Intermediate Representation and back
  (``pip install snnquant[export]``); :func:`simulate_nir` runs a graph by NIR's equations.
* :func:`shift_flatten_dims`, :func:`narrow_registers`: what NIR consumers need (the Flatten
  fix-up of snnTorch and Norse; membrane registers narrower than a grid, as Lava's);
* :func:`saturation_report`: per layer, how often membranes sit at ``v_min`` / ``v_max``;
  :func:`widen_membrane_range` gives them headroom;
* :func:`to_c`: a bit-exact, portable C99 model of the integer network (``<name>.h``/``.c``).
"""

from .ir.network import (FORMAT_VERSION, NETWORK_INPUT, IntegerNetworkError, ExportError,
                         FlattenOp, IntegerNetwork, JoinOp, NeuronOp, PoolOp, SynapseOp,
                         check_input_shape)
from .ir.transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp
from ..targets import LoihiLayerOp, SpeckLayerOp, XyloLayerOp
from .ir.integer_ops import pack_int, round_half_even_shift, unpack_int
from .frontend.torch_model import input_max_of, to_integer
from .backends.simulator import IntegerSNN
from .verification.agreement import IntegerAgreement, SilentNetworkWarning, compare_integer, integer_agreement
from .passes.fold import FoldedLayer, FoldReport, FoldWarning, fold_batchnorm
from .backends.files import load_integer, save_integer
from .pipeline import to_nir
from .verification.saturation import (LayerSaturation, SaturationReport, SaturationWarning,
                                      nir_out_of_bounds, saturation_report)
from .passes.widen import widen_membrane_range
from .frontend.nir_import import NIRImportError, from_nir
from .verification.nir_reference import simulate_nir
from .backends.c_runtime import CMemory, c_memory, to_c
from .ir.validation import check_network
from .backends.nir_consumers import ConsumerRegisterWarning, narrow_registers, shift_flatten_dims

__all__ = [
    "FORMAT_VERSION", "ExportError", "IntegerNetwork", "SynapseOp", "NeuronOp", "PoolOp",
    "FlattenOp", "JoinOp", "GatherOp", "ReduceOp", "MatMulOp", "ScaleOp", "NETWORK_INPUT", "round_half_even_shift", "pack_int", "unpack_int",
    "to_integer", "input_max_of", "IntegerSNN",
    "IntegerAgreement", "SilentNetworkWarning", "compare_integer", "integer_agreement",
    "fold_batchnorm", "save_integer",
    "load_integer", "to_nir", "from_nir", "simulate_nir", "NIRImportError", "to_c",
    "c_memory", "CMemory", "saturation_report", "SaturationReport", "LayerSaturation",
    "SaturationWarning", "widen_membrane_range", "FoldWarning", "FoldReport", "FoldedLayer",
    "check_input_shape", "nir_out_of_bounds", "IntegerNetworkError", "check_network",
    "shift_flatten_dims", "narrow_registers", "ConsumerRegisterWarning",
    "XyloLayerOp", "LoihiLayerOp", "SpeckLayerOp",
]
