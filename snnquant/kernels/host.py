"""The test mode of the CPU build of the fused neuron kernels: their arithmetic without a GPU.

``neuron.cu`` is compiled unchanged behind ``host_shim.h`` (``__global__`` and ``__device__``
become plain functions, thread and block indices become a loop over the neurons, the CUDA
``__f*_rn`` intrinsics become plain IEEE operators) together with ``host_entry.h`` (C entry points
that pick the template instantiation and run the GPU kernel once per neuron): the ``'host'`` mode
of :func:`snnquant.kernels.cpp_backend.build_library` (same compiler, flags, entry points and
loader as the cpp backend). The same :class:`~snnquant.kernels._fused.FusedQuantNeuronFunction`
then runs on CPU tensors, so a change to the kernel source that breaks its arithmetic fails the
tests in CI, where there is no GPU.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional, Union

import torch

from ..functional.neuron import NeuronParams
from ._fused import KernelConfig, check_devices, pointer, run_fused
from .cpp_backend import KernelLibrary, build_library, cpp_compiler

__all__ = ["HostKernels", "host_compiler"]


def host_compiler() -> Optional[str]:
    """Path of the C++ compiler of the host build: the cpp backend's
    (:func:`~snnquant.kernels.cpp_backend.cpp_compiler`), or ``None``.

    Returns:
        The compiler's path, or ``None`` when there is none.
    """
    return cpp_compiler()


class HostKernels:
    """The fused neuron kernels built for the CPU in the test mode; a launcher for
    :func:`~._fused.run_fused`.

    Runs each kernel body once per neuron in a loop (as one GPU thread per neuron would), on
    contiguous CPU tensors. Slow; meant for tests of the kernel arithmetic.

    The host runs, for each neuron :math:`i = 0, \\dots, N - 1` in turn, the code that GPU
    thread :math:`i` runs, so its results are those of the GPU kernels.

    Args:
        library: path of the shared library made by :meth:`build`.
    """

    def __init__(self, library: Union[str, Path]):
        self.library_path = Path(library)
        self._library = KernelLibrary(self.library_path)
        p, ll = ctypes.c_void_p, ctypes.c_longlong
        for name in ("snq_host_float_to_half", "snq_host_half_to_float",
                     "snq_host_float_to_bfloat16", "snq_host_bfloat16_to_float"):
            getattr(self._library._lib, name).argtypes = [p, p, ll]
            getattr(self._library._lib, name).restype = None

    @classmethod
    def build(cls, build_dir: Union[str, Path], compiler: Optional[str] = None) -> "HostKernels":
        """Compile ``neuron.cu`` for the host into ``build_dir`` and load it.

        :func:`~snnquant.kernels.cpp_backend.build_library` in the ``'host'`` mode, with
        ``build_dir`` as its cache folder.

        Args:
            build_dir: an existing directory for the library.
            compiler: the C++ compiler (default: :func:`host_compiler`).

        Returns:
            The loaded :class:`HostKernels`.

        Raises:
            RuntimeError: no compiler, or the compilation failed (with the compiler's output).
        """
        return cls(build_library(None, compiler, Path(build_dir), mode="host"))

    def check_device(self, name: str, tensor: torch.Tensor) -> None:
        """Raise ValueError unless ``tensor`` is on the CPU.

        Args:
            name: argument name for the message.
            tensor: the tensor to check.
        """
        if tensor.device.type != "cpu":
            raise ValueError(f"{name} is on {tensor.device}: the host build of the kernels runs on "
                             "CPU tensors only")

    def forward(self, config: KernelConfig, T: int, N: int, *tensors_and_scalars) -> None:
        """Run ``snq_forward`` for ``config`` over all ``N`` neurons."""
        self._library.forward(config, T, N, *tensors_and_scalars)

    def backward(self, config: KernelConfig, T: int, N: int, *tensors_and_scalars) -> None:
        """Run ``snq_backward`` for ``config`` over all ``N`` neurons."""
        self._library.backward(config, T, N, *tensors_and_scalars)

    def quant_neuron_multi_step(self, x_seq: torch.Tensor, v_init, *, step,
                                w: Optional[torch.Tensor] = None, **params):
        """:func:`snnquant.kernels.fused_quant_neuron_multi_step` on CPU tensors, via the host build.

        The dynamics and gradients are those of the GPU kernels (and of
        :func:`snnquant.functional.neuron.quant_neuron_multi_step`).

        The arguments are those of :func:`snnquant.kernels.fused_quant_neuron_multi_step`, with
        ``x_seq`` (and a tensor ``v_init``, ``step`` or ``w``) on the CPU.

        Returns:
            ``(spike_seq, v_last, v_seq or None)``.
        """
        check_devices(self.check_device, x_seq, v_init, step, w, params.get("neuron"))
        return run_fused(self, x_seq, v_init, step, w, NeuronParams(**params))

    def _convert(self, name: str, source: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        source = source.contiguous()
        out = torch.empty(source.shape, dtype=out_dtype)
        getattr(self._library._lib, name)(pointer(source), pointer(out), source.numel())
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
