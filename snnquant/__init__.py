"""snnquant: quantization for spiking neural networks on PyTorch and SpikingJelly.

``import snnquant`` is light: it never imports CuPy, Triton, matplotlib or
``spikingjelly.datasets``; those are imported where they are used.
"""

from ._version import __version__
from . import functional
from . import nn
from .convert import QuantConfig, QuantReport, quantize_model
from .nn.batchnorm import freeze_batchnorm
from .summary import Summary, summary
from .utils import copy_model, is_multi_step
from ._io import load_checkpoint, save_checkpoint
from .calibrate import CalibrationReport, FiringRate, FiringRateWarning, calibrate, firing_rates
from .sensitivity import SensitivityResult, assign_bits, sensitivity

__all__ = ["__version__", "functional", "nn", "QuantConfig", "QuantReport", "quantize_model",
           "freeze_batchnorm", "summary", "Summary", "copy_model", "is_multi_step", "save_checkpoint",
           "load_checkpoint", "calibrate", "CalibrationReport", "firing_rates", "FiringRate",
           "FiringRateWarning", "sensitivity",
           "SensitivityResult", "assign_bits", "export", "datasets", "kernels",
           "deployability"]

_LAZY = ("export", "datasets", "kernels", "deployability")


def __getattr__(name):
    # heavy or optional parts load on first use: snnquant.export, snnquant.datasets,
    # snnquant.kernels, snnquant.deployability
    if name in _LAZY:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'snnquant' has no attribute {name!r}")
