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
implement (:func:`snnquant.kernels.supports`) and for other devices.

The default (:data:`DEFAULT_BACKEND`) is ``'auto'``: on a CPU with a C++ compiler the quantized
neurons run the fused kernels, several times faster than the torch loop, with the same spikes and
membranes (float32, float64) and gradients equal to rounding. What changes with it: the first
forward of each configuration compiles for about a second (once per machine, cached on disk);
gradients are summed in another order (equal to rounding, not bit for bit); float16 and bfloat16
compute in float32 inside (as on the GPU) where the torch loop computes in the 16-bit type. Pass
``backend='torch'`` for the torch loop.
"""

from __future__ import annotations

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

    ``'auto'`` means ``'cpp'`` for CPU tensors when a C++ compiler is found, ``'cupy'`` for CUDA
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
        from .cpp_backend import cpp_available

        return "cpp" if cpp_available() else "torch"
    if x_seq.device.type == "cuda":
        from .cupy_backend import cupy_available

        return "cupy" if cupy_available() else "torch"
    return "torch"
