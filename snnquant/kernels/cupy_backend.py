"""CuPy launcher of the fused neuron kernels: run-time compilation, caching, stream handling.

CuPy is optional: nothing here imports it before a kernel is actually launched, and
:func:`cupy_available` answers without raising.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy
import torch

from ..functional.neuron import NeuronParams
from ._fused import (KernelCache, KernelConfig, KernelScalars, kernel_source, pointer, run_fused,
                     tensor_arguments)

#: threads per block; one thread per neuron
BLOCK_SIZE = 256

#: NVRTC options: none on purpose. Without ``--use_fast_math`` divisions are IEEE-rounded, and the
#: forward arithmetic uses the ``__f*_rn`` intrinsics, which are never contracted into FMAs.
NVRTC_OPTIONS: tuple = ()

INSTALL_HINT = ("the cupy backend needs CuPy: pip install snnquant[cuda12] (or snnquant[cuda13]), "
                "i.e. cupy-cuda12x / cupy-cuda13x matching your CUDA driver; or use backend='torch'")


class CuPyUnavailableError(ImportError):
    """Raised when the cupy backend is asked for but CuPy cannot be imported.

    Args:
        message: what failed and what to install.
    """


@functools.lru_cache(maxsize=None)
def _cupy_import_error() -> Optional[str]:
    try:
        import cupy  # noqa: F401
    except Exception as error:  # CuPy raises more than ImportError for a broken CUDA setup
        return f"{type(error).__name__}: {error}"
    return None


def cupy_available() -> bool:
    """Whether CuPy imports, i.e. whether the cupy backend can be used for CUDA tensors.

    ``backend='auto'`` picks ``'cupy'`` for CUDA tensors when this is ``True`` (and the surrogate
    is supported, see :func:`snnquant.kernels.supports`), else ``'torch'``. The answer is computed
    once per process.


    Returns:
        ``True`` when ``import cupy`` succeeds.
    """
    return _cupy_import_error() is None


def import_cupy():
    """Import CuPy or raise :class:`CuPyUnavailableError` saying what to install.

    Returns:
        The ``cupy`` module.
    """
    reason = _cupy_import_error()
    if reason is not None:
        raise CuPyUnavailableError(f"{INSTALL_HINT} (import cupy failed: {reason})")
    import cupy

    return cupy


def _compile(cupy, config: KernelConfig) -> tuple:
    """The forward and backward kernels of ``config``, compiled by NVRTC."""
    module = cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS,
                            name_expressions=(config.forward_name, config.backward_name))
    return module.get_function(config.forward_name), module.get_function(config.backward_name)


#: the process-wide cache of compiled kernels (CuPy compiles per device on first launch there)
KERNEL_CACHE: KernelCache = KernelCache()


def stream_for(cupy, device: torch.device):
    """PyTorch's current stream on ``device`` as a CuPy stream object (no new stream is made)."""
    torch_stream = torch.cuda.current_stream(device)
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None and hasattr(torch_stream, "__cuda_stream__"):
        return from_external(torch_stream)
    return cupy.cuda.ExternalStream(torch_stream.cuda_stream, device.index)


class CUDATensorsRequiredError(ValueError, RuntimeError):
    """Raised when the cupy backend is given a tensor that is not on a CUDA device.

    Both a ``ValueError`` (a bad argument) and a ``RuntimeError`` (what PyTorch raises for tensors
    on the wrong device), so that either ``except`` clause catches it.


    Args:
        message: which argument is where, and to move the tensors to CUDA.
    """


def check_cuda(name: str, tensor: torch.Tensor) -> None:
    """Raise :class:`CUDATensorsRequiredError` naming ``name`` unless ``tensor`` is on CUDA."""
    if tensor.device.type != "cuda":
        raise CUDATensorsRequiredError(f"{name} is on {tensor.device}: the cupy backend runs on CUDA tensors "
                         "only; move the tensors to CUDA (e.g. x_seq.cuda()) or use "
                         "backend='torch'")


def _pointers(*tensors) -> tuple:
    return tuple(pointer(tensor) or 0 for tensor in tensors)  # CuPy takes 0 for a null pointer


class CuPyLauncher:
    """Launches the kernels of ``neuron.cu`` with CuPy on PyTorch's current stream and device.

    Tensors go to the kernels as raw device pointers (``data_ptr()``), scalars as NumPy scalars of
    the kernel's parameter type, so nothing is copied and nothing is read back to the host: the
    launches are asynchronous like any PyTorch operation.


    Args:
        cupy: the imported ``cupy`` module.
        cache: where compiled kernels are kept (default: the process-wide :data:`KERNEL_CACHE`).
    """

    def __init__(self, cupy, cache: Optional[KernelCache] = None):
        self._cupy = cupy
        self._cache = KERNEL_CACHE if cache is None else cache

    def _launch(self, config: KernelConfig, which: int, device: torch.device, n: int,
                args: tuple) -> None:
        if n == 0:
            return
        cupy = self._cupy
        grid = ((n + BLOCK_SIZE - 1) // BLOCK_SIZE,)
        with cupy.cuda.Device(device.index):
            kernel = self._cache.get(config, lambda: _compile(cupy, config))[which]
            kernel(grid, (BLOCK_SIZE,), args, stream=stream_for(cupy, device))

    def forward(self, config: KernelConfig, T: int, N: int, x_seq, v_init, step, k, spike_seq,
                v_last, v_seq, h_seq, scalars: KernelScalars) -> None:
        """Launch ``snq_forward`` for ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        real = numpy.float64 if config.dtype == torch.float64 else numpy.float32
        args = (
            *_pointers(x_seq, v_init, step, k, spike_seq, v_last, v_seq, h_seq),
            real(scalars.tau), real(scalars.v_threshold), real(scalars.v_reset),
            real(scalars.qmin), real(scalars.qmax), numpy.int32(T), numpy.int64(N),
        )
        self._launch(config, 0, x_seq.device, N, args)

    def backward(self, config: KernelConfig, T: int, N: int, h_seq, x_seq, v_init, step, k,
                 grad_spike_seq, grad_v_seq, grad_v_last, grad_x_seq, grad_v_init,
                 grad_step_partial, grad_k_partial, scalars: KernelScalars) -> None:
        """Launch ``snq_backward`` for ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        real = numpy.float64 if config.dtype == torch.float64 else numpy.float32
        args = (
            *_pointers(h_seq, x_seq, v_init, step, k, grad_spike_seq, grad_v_seq, grad_v_last,
                       grad_x_seq, grad_v_init, grad_step_partial, grad_k_partial),
            real(scalars.tau), real(scalars.v_threshold), real(scalars.v_reset),
            real(scalars.qmin), real(scalars.qmax), real(scalars.alpha), numpy.int32(T),
            numpy.int64(N),
        )
        self._launch(config, 1, h_seq.device, N, args)


def cupy_runnable(tensors):
    """:func:`cupy_step` after the one check of what it needs, made by
    :func:`snnquant.kernels.dispatch.select_backend` and :func:`fused_quant_neuron_multi_step`
    alike: every tensor on CUDA, then CuPy.

    Args:
        tensors: ``[(argument name, tensor)]`` whose devices are checked.

    Raises:
        CUDATensorsRequiredError: a tensor not on CUDA.
        CuPyUnavailableError: CuPy cannot be imported.
    """
    for argument, tensor in tensors:
        check_cuda(argument, tensor)
    import_cupy()
    return cupy_step


def cupy_step(x_seq: torch.Tensor, v_init, step, w: Optional[torch.Tensor],
              params: NeuronParams):
    """The cupy backend's step function: :func:`~snnquant.kernels._fused.run_fused` with the CuPy
    launcher, on CUDA tensors (:func:`snnquant.kernels.dispatch.select_backend` checks the device
    and CuPy first). Arguments and result as :func:`~snnquant.kernels._fused.run_fused`'s."""
    return run_fused(CuPyLauncher(import_cupy()), x_seq, v_init, step, w, params)


def fused_quant_neuron_multi_step(x_seq: torch.Tensor, v_init, *, step,
                                  w: Optional[torch.Tensor] = None, **params):
    """Multi-step IF/LIF/PLIF neurons with a quantized membrane, as two fused CUDA kernels.

    Same arguments and semantics as the torch reference
    ``snnquant.functional.neuron.quant_neuron_multi_step``, on CUDA tensors: one kernel runs all
    ``T`` steps forward (charge, quantize, fire, reset), one runs the gradient backwards in time.
    Per step, with :math:`Q(h) = \\mathrm{clamp}(\\mathrm{round}(h/s), q_{min}, q_{max})\\,s`,
    :math:`V_r = Q(v_{reset})` (0 for soft reset in the charge) and
    :math:`\\theta = \\lceil v_{th}/s \\rceil s`:

    .. math::
        H_t &= \\begin{cases} V_{t-1} + X_t & \\text{if} \\\\
               V_{t-1} + (X_t - (V_{t-1} - V_r))/\\tau & \\text{lif, decay\\_input} \\\\
               V_{t-1} - (V_{t-1} - V_r)/\\tau + X_t & \\text{lif} \\\\
               V_{t-1} + (X_t - (V_{t-1} - V_r))\\,k & \\text{plif, decay\\_input},\\ k=\\sigma(w)
               \\\\ V_{t-1} - (V_{t-1} - V_r)\\,k + X_t & \\text{plif}\\end{cases} \\\\
        \\hat H_t &= Q(H_t),\\qquad S_t = \\Theta(\\hat H_t - v_{th}) \\\\
        V_t &= \\hat H_t (1 - S_t) + V_r S_t \\ \\text{(hard)} \\quad\\text{or}\\quad
               \\hat H_t - \\theta S_t \\ \\text{(soft)}

    Gradients (straight-through inside the range, surrogate for the spike):

    .. math::
        \\frac{\\partial \\hat H}{\\partial H} = \\mathbb{1}\\left[q_{min} \\le \\tfrac{H}{s} \\le
        q_{max}\\right],\\quad
        \\frac{\\partial \\hat H}{\\partial s} = \\begin{cases}\\mathrm{round}(H/s) - H/s &
        \\text{inside} \\\\ q_{min} \\text{ or } q_{max} & \\text{outside}\\end{cases}
        \\cdot \\text{step\\_grad\\_scale},\\quad
        \\frac{\\partial S}{\\partial \\hat H} = g'(\\hat H - v_{th})

    The gradient of :math:`V` through :math:`S` is dropped when ``detach_reset``.

    The kernels run on PyTorch's current stream and device and never synchronise: the step and
    ``k`` are read by the kernels from device memory, and the step and ``w`` gradients are
    per-neuron partial sums reduced with ``torch.sum`` on the same stream. Therefore a step given
    as a tensor is not checked for positivity (that would need a host read). float16 and bfloat16
    are loaded, computed in float32 and stored back (the torch reference computes in the 16-bit
    type, so results may differ in the last bits); float32 and float64 compute in their own type
    and reproduce the torch reference's spikes and membranes bit for bit on the CPU build.

    Args:
        x_seq: input ``[T, N, ...]`` on a CUDA device, float16, bfloat16, float32 or float64;
            made contiguous once if it is not.
        v_init: initial membrane, a tensor broadcastable to ``x_seq[0]`` (or a number).
        step: quantization step :math:`s`, a positive float or one-element tensor (may require
            grad); like the reference, it is rounded to ``x_seq.dtype`` (as is ``k``).
        w: PLIF parameter, a one-element tensor; :math:`k = \\sigma(w)` replaces :math:`1/\\tau`.
        **params: the fields of :class:`~snnquant.functional.neuron.NeuronParams`: ``neuron``
            (``'if'``, ``'lif'`` or ``'plif'``), ``qmin``, ``qmax`` (> ``qmin``), ``tau``
            (LIF), ``decay_input``, ``v_threshold``, ``v_reset`` (``None``: soft reset),
            ``surrogate_function`` (SpikingJelly ``surrogate.Sigmoid`` or ``surrogate.ATan``,
            default ``Sigmoid()``; others raise ValueError, see
            :func:`snnquant.kernels.supports`), ``detach_reset``, ``step_grad_scale`` (as in
            LSQ) and ``store_v_seq`` (also return the membrane after every step).

    Returns:
        ``(spike_seq, v_last, v_seq)``: spikes ``[T, N, ...]`` (0/1 in ``x_seq.dtype``), membrane
        after the last step ``[N, ...]``, and the membrane after every step ``[T, N, ...]`` when
        ``store_v_seq`` else ``None``.

    Raises:
        CUDATensorsRequiredError: a tensor not on a CUDA device ("move the tensors to CUDA"); a
            ValueError and a RuntimeError.
        ValueError: unsupported surrogate, or another bad argument (named in the message).
        TypeError: an argument of the wrong type or dtype.
        CuPyUnavailableError: CuPy cannot be imported (an ImportError that says what to install).
    """
    run = cupy_runnable(tensor_arguments(x_seq, v_init, step, w, params.get("neuron")))
    return run(x_seq, v_init, step, w, NeuronParams(**params))
