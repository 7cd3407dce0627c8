"""CPU build of the fused neuron kernels, for testing their arithmetic without a GPU.

``neuron.cu`` is compiled unchanged by g++ behind ``host_shim.h`` (``__global__`` and
``__device__`` become plain functions, thread and block indices become a loop over the neurons,
the CUDA ``__f*_rn`` intrinsics become plain IEEE operators) together with ``host_entry.h`` (C
entry points that pick the template instantiation), and loaded with :mod:`ctypes`. The same
:class:`~snnquant.kernels._fused.FusedQuantNeuronFunction` then runs on CPU tensors, so a change to
the kernel source that breaks its arithmetic fails the tests in CI, where there is no GPU.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Union

import torch

from ._fused import KernelConfig, KernelScalars, run_fused

#: g++ flags: no FMA contraction and no fast math, so every operation is rounded separately, as
#: on the GPU (explicit ``__f*_rn`` intrinsics) and in PyTorch's CPU kernels. -O1 keeps the build
#: of all 240 instantiations at a few seconds.
CXX_FLAGS = ("-std=c++14", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")

_ENTRY_SOURCE = '#include "host_shim.h"\n#include "neuron.cu"\n#include "host_entry.h"\n'
_LIBRARY_NAME = "libsnnquant_neuron_host.so"


def host_compiler() -> Optional[str]:
    """Path of the C++ compiler used for the host build (``$CXX`` or ``g++``), or ``None``.

    The compiler is the one named by the ``CXX`` environment variable, or else ``g++`` found on
    the ``PATH``.

    Returns:
        The compiler's path, or ``None`` when there is none.
    """
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return shutil.which("g++")


def _pointer(tensor: Optional[torch.Tensor]) -> Optional[ctypes.c_void_p]:
    return None if tensor is None else ctypes.c_void_p(tensor.data_ptr())


class HostKernels:
    """The fused neuron kernels built for the CPU; a launcher for :func:`~._fused.run_fused`.

    Runs each kernel body once per neuron in a loop (as one GPU thread per neuron would), on
    contiguous CPU tensors. Slow; meant for tests of the kernel arithmetic.

    The host runs, for each neuron :math:`i = 0, \\dots, N - 1` in turn, the code that GPU
    thread :math:`i` runs, so its results are those of the GPU kernels.

    Args:
        library: path of the shared library made by :meth:`build`.
    """

    def __init__(self, library: Union[str, Path]):
        self.library_path = Path(library)
        lib = ctypes.CDLL(str(self.library_path))
        p, d, i, ll = ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_longlong
        lib.snq_host_forward.argtypes = [i, i, i, i, i] + [p] * 8 + [d] * 5 + [i, ll]
        lib.snq_host_forward.restype = i
        lib.snq_host_backward.argtypes = [i] * 6 + [p] * 12 + [d] * 6 + [i, ll]
        lib.snq_host_backward.restype = i
        for name in ("snq_host_float_to_half", "snq_host_half_to_float",
                     "snq_host_float_to_bfloat16", "snq_host_bfloat16_to_float"):
            getattr(lib, name).argtypes = [p, p, ll]
            getattr(lib, name).restype = None
        self._lib = lib

    @classmethod
    def build(cls, build_dir: Union[str, Path], compiler: Optional[str] = None) -> "HostKernels":
        """Compile ``neuron.cu`` for the host into ``build_dir`` and load it.

        The compiler (with the flags in ``CXX_FLAGS``) builds ``host_shim.h``, ``neuron.cu`` and
        ``host_entry.h``, concatenated, into a shared library.

        Args:
            build_dir: an existing directory for the generated source and the library.
            compiler: the C++ compiler (default: :func:`host_compiler`).

        Returns:
            The loaded :class:`HostKernels`.

        Raises:
            RuntimeError: no compiler, or the compilation failed (with the compiler's output).
        """
        compiler = compiler or host_compiler()
        if compiler is None:
            raise RuntimeError("no C++ compiler for the host build of neuron.cu: install g++ or "
                               "set $CXX")
        build_dir = Path(build_dir)
        kernel_dir = Path(__file__).resolve().parent
        from .._io import atomic_write

        entry = build_dir / "snnquant_neuron_host.cpp"
        atomic_write(entry, _ENTRY_SOURCE)
        target = build_dir / _LIBRARY_NAME

        def build(partial: str) -> None:
            result = subprocess.run(
                [compiler, *CXX_FLAGS, "-I", str(kernel_dir), str(entry), "-o", partial],
                capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise RuntimeError(f"host build of neuron.cu failed ({compiler}, exit "
                                   f"{result.returncode}):\n{result.stderr}")

        atomic_write(target, build)
        return cls(target)

    def check_device(self, name: str, tensor: torch.Tensor) -> None:
        """Raise ValueError unless ``tensor`` is on the CPU.

        Args:
            name: argument name for the message.
            tensor: the tensor to check.
        """
        if tensor.device.type != "cpu":
            raise ValueError(f"{name} is on {tensor.device}: the host build of the kernels runs on "
                             "CPU tensors only")

    def forward(self, config: KernelConfig, T: int, N: int, x_seq, v_init, step, k, spike_seq,
                v_last, v_seq, h_seq, scalars: KernelScalars) -> None:
        """Run ``snq_forward`` for ``config`` over all ``N`` neurons."""
        status = self._lib.snq_host_forward(
            config.dtype_code, config.neuron, int(config.decay_input), int(config.hard_reset),
            int(config.store_v_seq), _pointer(x_seq), _pointer(v_init), _pointer(step),
            _pointer(k), _pointer(spike_seq), _pointer(v_last), _pointer(v_seq), _pointer(h_seq),
            scalars.tau, scalars.v_threshold, scalars.v_reset, scalars.qmin, scalars.qmax, T, N)
        if status != 0:
            raise RuntimeError(f"snq_host_forward rejected the configuration {config}")

    def backward(self, config: KernelConfig, T: int, N: int, h_seq, x_seq, v_init, step, k,
                 grad_spike_seq, grad_v_seq, grad_v_last, grad_x_seq, grad_v_init,
                 grad_step_partial, grad_k_partial, scalars: KernelScalars) -> None:
        """Run ``snq_backward`` for ``config`` over all ``N`` neurons."""
        status = self._lib.snq_host_backward(
            config.dtype_code, config.neuron, int(config.decay_input), int(config.hard_reset),
            int(config.detach_reset), config.surrogate, _pointer(h_seq), _pointer(x_seq),
            _pointer(v_init), _pointer(step), _pointer(k), _pointer(grad_spike_seq),
            _pointer(grad_v_seq), _pointer(grad_v_last), _pointer(grad_x_seq),
            _pointer(grad_v_init), _pointer(grad_step_partial), _pointer(grad_k_partial),
            scalars.tau, scalars.v_threshold, scalars.v_reset, scalars.qmin, scalars.qmax,
            scalars.alpha, T, N)
        if status != 0:
            raise RuntimeError(f"snq_host_backward rejected the configuration {config}")

    def quant_neuron_multi_step(self, x_seq: torch.Tensor, v_init, *, neuron: str,
                                tau: float = 2.0, w: Optional[torch.Tensor] = None,
                                decay_input: bool = True, v_threshold: float = 1.0,
                                v_reset: Optional[float] = 0.0,
                                surrogate_function=None,
                                detach_reset: bool = False, step, qmin: int,
                                qmax: int, step_grad_scale: float = 1.0,
                                store_v_seq: bool = False):
        """:func:`snnquant.kernels.fused_quant_neuron_multi_step` on CPU tensors, via the host build.

        The dynamics and gradients are those of the GPU kernels (and of
        :func:`snnquant.functional.neuron.quant_neuron_multi_step`).

        The arguments are those of :func:`snnquant.kernels.fused_quant_neuron_multi_step`, with
        ``x_seq`` (and a tensor ``v_init``, ``step`` or ``w``) on the CPU.

        Returns:
            ``(spike_seq, v_last, v_seq or None)``.
        """
        return run_fused(self, x_seq, v_init, neuron=neuron, tau=tau, w=w,
                         decay_input=decay_input, v_threshold=v_threshold, v_reset=v_reset,
                         surrogate_function=surrogate_function, detach_reset=detach_reset,
                         step=step, qmin=qmin, qmax=qmax, step_grad_scale=step_grad_scale,
                         store_v_seq=store_v_seq)

    def _convert(self, name: str, source: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        source = source.contiguous()
        out = torch.empty(source.shape, dtype=out_dtype)
        getattr(self._lib, name)(_pointer(source), _pointer(out), source.numel())
        return out

    def float_to_half_bits(self, values: torch.Tensor) -> torch.Tensor:
        """The kernels' float32 -> float16 conversion (round to nearest even), as int16 bits.

        .. math::
            \\mathrm{bits}(\\mathrm{fp16}_{rne}(x))

        Args:
            values: float32 CPU tensor.
        """
        return self._convert("snq_host_float_to_half", values.float(), torch.int16)

    def half_bits_to_float(self, bits: torch.Tensor) -> torch.Tensor:
        """The kernels' float16 -> float32 conversion, from int16 bit patterns.

        .. math::
            \\mathrm{fp32}(\\mathrm{fp16}(b))

        Args:
            bits: int16 CPU tensor of float16 bit patterns.
        """
        return self._convert("snq_host_half_to_float", bits.to(torch.int16), torch.float32)

    def float_to_bfloat16_bits(self, values: torch.Tensor) -> torch.Tensor:
        """The kernels' float32 -> bfloat16 conversion (round to nearest even), as int16 bits.

        .. math::
            \\mathrm{bits}(\\mathrm{bf16}_{rne}(x))

        Args:
            values: float32 CPU tensor.
        """
        return self._convert("snq_host_float_to_bfloat16", values.float(), torch.int16)

    def bfloat16_bits_to_float(self, bits: torch.Tensor) -> torch.Tensor:
        """The kernels' bfloat16 -> float32 conversion, from int16 bit patterns.

        .. math::
            \\mathrm{fp32}(\\mathrm{bf16}(b))

        Args:
            bits: int16 CPU tensor of bfloat16 bit patterns.
        """
        return self._convert("snq_host_bfloat16_to_float", bits.to(torch.int16), torch.float32)
