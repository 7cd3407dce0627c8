r"""A neuron layer of :class:`~snnquant.export.IntegerSNN` as compiled C: the step's C reading
(:meth:`~snnquant.export.ir.program.NeuronProgram.c_lines`, what :func:`~snnquant.export.to_c` prints)
in a loop over neurons and time (OpenMP threads share the neurons), built with the cpp backend's compiler into its kernel cache on
first use and called through :mod:`ctypes`.

The loop reads the currents of all steps ``[T, n]`` (``float32`` holding exact integers, or an
integer type), converts each to ``int64_t`` and runs the step in ``int64_t`` exactly as the C
runtime does (its bounds are the C runtime's), writing ``int8`` spikes: one pass over memory instead
of a dozen tensor operations per step. Without a compiler, or with a kernel cache that cannot be
written, :func:`neuron_kernel` returns ``None`` and the simulator steps in torch; a failed build
warns once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import warnings
from typing import Callable, Optional

import torch

from ...kernels import cpp_backend
from ..ir.program import NeuronProgram, c_literal, c_rhe_helper

__all__ = ["neuron_source", "neuron_kernel", "C_INPUT_TYPES"]

#: the C type of each dtype the compiled loop reads (currents) or writes (spikes)
C_INPUT_TYPES = {torch.float32: "float", torch.int8: "int8_t", torch.int16: "int16_t",
                 torch.int32: "int32_t", torch.int64: "int64_t"}

_PREFIX = "snq_int"

#: neighbouring neurons per block of the compiled loop (their membranes stay in the L1 cache)
BLOCK = 1024


def neuron_source(program: NeuronProgram, input_dtype: torch.dtype,
                  spike_dtype: torch.dtype = torch.int8) -> str:
    """The C++ source of ``program`` over ``T`` steps of ``n`` neurons: ``extern "C" void
    snq_int_neuron(const X *x_seq, S *spike_seq, long long T, long long n, int threads)``
    with ``X`` and ``S`` the C types of ``input_dtype`` and ``spike_dtype``
    (:data:`C_INPUT_TYPES`; spikes 0 or 1, exact in every one). Blocks of
    :data:`BLOCK` neighbouring neurons (their membranes on the stack) are shared by ``threads``
    OpenMP threads; inside a block time is the outer loop."""
    in_type, spike_type = C_INPUT_TYPES[input_dtype], C_INPUT_TYPES[spike_dtype]
    body = "\n                ".join(program.c_lines(_PREFIX))
    return f"""#include <stdint.h>
{c_rhe_helper(_PREFIX)}
extern "C" void {_PREFIX}_neuron(const {in_type} *snq_x_seq, {spike_type} *snq_spike_seq,
                                 long long snq_T, long long snq_n, int snq_threads)
{{
    const long long snq_blocks = (snq_n + {BLOCK} - 1) / {BLOCK};
#ifdef _OPENMP
#pragma omp parallel for num_threads(snq_threads) schedule(static)
#endif
    for (long long snq_b = 0; snq_b < snq_blocks; snq_b++) {{
        const long long snq_lo = snq_b * {BLOCK};
        const long long snq_m = snq_n - snq_lo < {BLOCK} ? snq_n - snq_lo : {BLOCK};
        int64_t snq_membrane[{BLOCK}];
        for (long long snq_i = 0; snq_i < snq_m; snq_i++) {{
            snq_membrane[snq_i] = {c_literal(program.v_init)};
        }}
        for (long long snq_t = 0; snq_t < snq_T; snq_t++) {{
            const {in_type} *snq_x = snq_x_seq + snq_t * snq_n + snq_lo;
            {spike_type} *snq_s = snq_spike_seq + snq_t * snq_n + snq_lo;
            for (long long snq_i = 0; snq_i < snq_m; snq_i++) {{
                const int64_t v = snq_membrane[snq_i];
                const int64_t xin = (int64_t)snq_x[snq_i];
                {body}
                snq_s[snq_i] = ({spike_type})spike;
                snq_membrane[snq_i] = v_next;
            }}
        }}
    }}
    (void)snq_threads;
}}
"""


def _build(source: str, compiler: str):
    flags, identity = cpp_backend.compiler_identity(compiler)
    digest = hashlib.sha256("\n".join([source, identity, *flags]).encode()).hexdigest()[:24]
    target = cpp_backend.require_cache() / f"snnquant_int_neuron_{digest}.so"
    symbol = f"{_PREFIX}_neuron"
    function = getattr(cpp_backend.open_cached_library(
        target, source, flags, compiler, "the integer neuron kernel", (symbol,)), symbol)
    function.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 2 + [ctypes.c_int]
    function.restype = None
    return function


@functools.lru_cache(maxsize=64)
def _function(source: str, compiler: str):
    try:
        return _build(source, compiler)
    except (cpp_backend.CppBuildError, cpp_backend.KernelCacheError, OSError) as error:
        warnings.warn(f"snnquant: IntegerSNN steps this neuron layer in torch: {error}",
                      RuntimeWarning, stacklevel=4)
        return None


def neuron_kernel(program: NeuronProgram, input_dtype: torch.dtype,
                  spike_dtype: torch.dtype = torch.int8
                  ) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """``run(x_seq, out=None) -> spikes``: ``program`` over the currents ``x_seq`` ``[T, ...]``
    of ``input_dtype`` (on the CPU), spikes of the same shape in ``spike_dtype`` (into ``out``
    when given: a contiguous tensor of that shape and dtype, ``x_seq`` itself allowed, as every
    current is read before its step's spike is written); ``None`` when it cannot be compiled
    here (no compiler, an unwritable kernel cache, a failed build) or a dtype has no C type."""
    compiler = cpp_backend.cpp_compiler()
    if (compiler is None or input_dtype not in C_INPUT_TYPES or spike_dtype not in C_INPUT_TYPES
            or cpp_backend.cache_problem()):
        return None
    function = _function(neuron_source(program, input_dtype, spike_dtype), compiler)
    if function is None:
        return None

    def run(x_seq: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        x_seq = x_seq.contiguous()
        spikes = torch.empty(x_seq.shape, dtype=spike_dtype) if out is None else out
        n = x_seq[0].numel() if x_seq.shape[0] else 0
        function(x_seq.data_ptr(), spikes.data_ptr(), x_seq.shape[0], n,
                 torch.get_num_threads())
        return spikes
    return run
