"""Which backend runs a quantized neuron: the one place where ``backend='auto'`` is decided.

.. list-table::
   :header-rows: 1

   * - ``backend``
     - CPU tensors
     - CUDA tensors
   * - ``'torch'``
     - the torch loop
     - the torch loop
   * - ``'cpp'``
     - the CPU build of the fused kernels
     - error
   * - ``'cupy'``
     - error
     - the fused CUDA kernels
   * - ``'auto'``
     - ``'cpp'`` when a C++ compiler is found, else ``'torch'``
     - ``'cupy'`` when CuPy imports, else ``'torch'``

``'auto'`` also falls back to ``'torch'`` for a surrogate function or dtype the kernels do not
implement (:func:`snnquant.kernels.supports`), for other devices and, on the CPU, when the kernel
cache folder cannot be written (with one warning naming the folder and ``SNNQUANT_CACHE_DIR``).

The choice is made once: :func:`select_backend` turns the requested backend and an input into a
:class:`ResolvedBackend`, whose ``step`` is the function to call, after every check of the
device and of what the backend needs (CuPy, a compiler, a writable cache). A neuron keeps it
until the device, dtype, surrogate function or requested backend changes.

The default (:data:`DEFAULT_BACKEND`) is ``'auto'``: on a CPU with a C++ compiler the quantized
neurons run the fused kernels, several times faster than the torch loop, with the same spikes and
membranes (float32, float64) and gradients equal to rounding. What changes with it: the first
forward of each configuration compiles for about a second (once per machine, cached on disk);
gradients are summed in another order (equal to rounding, not bit for bit); float16 and bfloat16
compute in float32 inside (as on the GPU) where the torch loop computes in the 16-bit type. Pass
``backend='torch'`` for the torch loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

#: the accepted values of ``backend``
BACKENDS = ("torch", "cupy", "cpp", "auto")

#: the default ``backend`` of the quantized neurons, of ``QuantConfig`` and of the example
DEFAULT_BACKEND = "auto"


def check_backend_name(backend) -> str:
    """Return ``backend`` if it is one of :data:`BACKENDS`, else raise ValueError naming it.

    Args:
        backend: the requested backend.
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def resolve_backend(backend: str, x_seq: torch.Tensor, surrogate_function=None) -> str:
    """The backend that runs: ``backend`` itself, or what ``'auto'`` means for ``x_seq``.

    ``'auto'`` means ``'cpp'`` for CPU tensors when a C++ compiler is found (and the kernel cache
    folder can be written), ``'cupy'`` for CUDA
    tensors when CuPy imports, provided the kernels implement the dtype and the surrogate
    function; ``'torch'`` otherwise, and always while ``torch.compile`` traces the model (the
    compiled kernels are opaque to the compiler, the torch backend compiles without graph breaks).

    Args:
        backend: one of :data:`BACKENDS`.
        x_seq: the input sequence (its device and dtype decide ``'auto'``).
        surrogate_function: the neuron's surrogate function (``'auto'`` needs one the kernels
            implement).

    Returns:
        ``'torch'``, ``'cupy'`` or ``'cpp'``.
    """
    if backend != "auto":
        return check_backend_name(backend)
    if torch.compiler.is_compiling():
        return "torch"
    from ._fused import DTYPE_CODES, supports

    if x_seq.dtype not in DTYPE_CODES:
        return "torch"
    if surrogate_function is not None and not supports(surrogate_function, x_seq.dtype):
        return "torch"
    if x_seq.device.type == "cpu":
        from .cpp_backend import usable_for_auto

        return "cpp" if usable_for_auto() else "torch"
    if x_seq.device.type == "cuda":
        from .cupy_backend import cupy_available

        return "cupy" if cupy_available() else "torch"
    return "torch"


#: what a backend's step function is called with: ``step(x_seq, v_init, step, w, params)`` with
#: ``params`` a :class:`~snnquant.functional.neuron.NeuronParams`; it returns
#: ``(spike_seq, v_last, v_seq or None)``
StepFunction = Callable


@dataclass(frozen=True)
class ResolvedBackend:
    """A backend chosen for one device, dtype and surrogate function.

    Attributes:
        name: ``'torch'``, ``'cpp'`` or ``'cupy'``.
        step: its step function (:data:`StepFunction`).
        fused_requested: the fused kernels were asked for by name (``backend='cpp'`` or
            ``'cupy'``): a neuron must refuse what they cannot run instead of falling back.
    """

    name: str
    step: StepFunction
    fused_requested: bool


def select_backend(backend: str, x_seq: torch.Tensor, surrogate_function=None,
                   argument: str = "x_seq") -> ResolvedBackend:
    """Resolve ``backend`` for ``x_seq`` (:func:`resolve_backend`) and check that it can run.

    ``'cpp'`` needs CPU tensors, a C++ compiler and a writable kernel cache folder; ``'cupy'``
    needs CUDA tensors and CuPy. ``'auto'`` never raises: it picks what can run.

    Args:
        backend: one of :data:`BACKENDS`.
        x_seq: the input (its device and dtype decide).
        surrogate_function: the neuron's surrogate function.
        argument: the input's name in error messages.

    Returns:
        The :class:`ResolvedBackend`.

    Raises:
        ValueError: an unknown backend, or a tensor on a device the backend does not run on.
        CppCompilerUnavailableError, KernelCacheError, CuPyUnavailableError: what the requested
            backend needs is missing (the message says what to install or set).
    """
    name = resolve_backend(backend, x_seq, surrogate_function)
    if name == "cpp":
        from .cpp_backend import cpp_runnable

        return ResolvedBackend(name, cpp_runnable([(argument, x_seq)]), backend == name)
    if name == "cupy":
        from .cupy_backend import cupy_runnable

        return ResolvedBackend(name, cupy_runnable([(argument, x_seq)]), backend == name)
    from ..functional.neuron import quant_neuron_sequence

    return ResolvedBackend(name, quant_neuron_sequence, False)

