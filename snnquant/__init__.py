"""snnquant: quantization for spiking neural networks on PyTorch and SpikingJelly.

``import snnquant`` is light: it never imports CuPy, Triton, matplotlib or
``spikingjelly.datasets``; those are imported where they are used.
"""

from ._version import __version__
from . import functional
from . import nn
from .convert import QuantConfig, QuantReport, quantize_model, summary

__all__ = ["__version__", "functional", "nn", "QuantConfig", "QuantReport", "quantize_model",
           "summary"]
