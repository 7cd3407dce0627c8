"""Fused kernels for multi-step neurons with a quantized membrane: CUDA (CuPy) and CPU (C++).

One CUDA C source (``neuron.cu``) holds a forward kernel that runs all ``T`` steps of a neuron
(charge, quantize, fire, reset) and a backward kernel that runs its gradient in reverse time.
CuPy compiles it at run time (NVRTC), once per configuration (the ``cupy`` backend);
:mod:`snnquant.kernels.cpp_backend` compiles the same source for the CPU with optimisation and
OpenMP, once per configuration and machine, cached on disk (the ``cpp`` backend);
:mod:`snnquant.kernels.host` is the same build's test mode (every configuration, the GPU kernels
run once per neuron). :mod:`snnquant.kernels.dispatch` decides what ``backend='auto'`` runs and
gives the step function of the chosen backend. Importing this package
never imports CuPy and never compiles anything.

Public names:

* :func:`fused_quant_neuron_multi_step`: the fused counterpart of
  ``snnquant.functional.neuron.quant_neuron_multi_step`` for CUDA tensors.
* :func:`cpp_quant_neuron_multi_step`: the same for CPU tensors (the cpp backend).
* :func:`cupy_available`: whether CuPy imports (``backend='auto'`` uses it).
* :func:`cpp_available`: whether a C++ compiler is found (``backend='auto'`` uses it).
* :func:`resolve_backend`: the backend that runs for a requested one and an input.
* :func:`select_backend`: the same, checked, as the step function to call.
* :class:`KernelCacheError`: the kernel cache folder cannot be written (``backend='cpp'``).
* :func:`supports`: whether a surrogate function and dtype are implemented by the kernels.

The chip neurons of :mod:`snnquant.targets` (Xylo, Loihi, Speck) have their own kernels in the
same source, run by :mod:`snnquant.kernels.chip` (not imported by this package).
"""

from ._fused import SUPPORTED_SURROGATES, supports
from .cpp_backend import (CppBuildError, CppCompilerUnavailableError, KernelCacheError,
                          cpp_available, cpp_quant_neuron_multi_step)
from .cupy_backend import (CUDATensorsRequiredError, CuPyUnavailableError, cupy_available,
                           fused_quant_neuron_multi_step)
from .dispatch import BACKENDS, DEFAULT_BACKEND, resolve_backend, select_backend

__all__ = [
    "BACKENDS",
    "CppBuildError",
    "CppCompilerUnavailableError",
    "DEFAULT_BACKEND",
    "KernelCacheError",
    "cpp_available",
    "cpp_quant_neuron_multi_step",
    "resolve_backend",
    "select_backend",
    "CUDATensorsRequiredError",
    "CuPyUnavailableError",
    "SUPPORTED_SURROGATES",
    "cupy_available",
    "fused_quant_neuron_multi_step",
    "supports",
]
