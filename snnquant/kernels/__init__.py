"""Fused CUDA kernels for multi-step neurons with a quantized membrane (CuPy, optional).

One CUDA C source (``neuron.cu``) holds a forward kernel that runs all ``T`` steps of a neuron
(charge, quantize, fire, reset) and a backward kernel that runs its gradient in reverse time.
CuPy compiles it at run time (NVRTC), once per configuration; :mod:`snnquant.kernels.host` builds
the same source for the CPU with g++ for the tests. Importing this package never imports CuPy.

Public names:

* :func:`fused_quant_neuron_multi_step`: the fused counterpart of
  ``snnquant.functional.neuron.quant_neuron_multi_step`` for CUDA tensors.
* :func:`cupy_available`: whether CuPy imports (``backend='auto'`` uses it).
* :func:`supports`: whether a surrogate function and dtype are implemented by the kernels.
"""

from ._fused import SUPPORTED_SURROGATES, supports
from .cupy_backend import (CUDATensorsRequiredError, CuPyUnavailableError, cupy_available,
                           fused_quant_neuron_multi_step)

__all__ = [
    "CUDATensorsRequiredError",
    "CuPyUnavailableError",
    "SUPPORTED_SURROGATES",
    "cupy_available",
    "fused_quant_neuron_multi_step",
    "supports",
]
