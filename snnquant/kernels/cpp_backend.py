"""The cpp backend: ``neuron.cu`` compiled for the CPU with optimisation and OpenMP, at first use.

The same kernel source as the GPU's (``neuron.cu``, behind ``host_shim.h``) is compiled with the
C++ compiler (``$CXX``, else ``g++``, ``c++`` or ``clang++``) together with ``cpu_entry.h``, which
runs the kernels' per-step functions in a CPU loop nest: OpenMP threads
(``torch.get_num_threads()`` of them) share blocks of 256 neighbouring neurons, and inside a block
time is the outer loop and the block's neurons the inner, vectorised one. One shared library is
built per :class:`~snnquant.kernels._fused.KernelConfig` (one template instantiation, about a
second) and loaded with :mod:`ctypes`; tensors are passed as raw data pointers, so nothing is
copied and there is no Python loop over neurons or steps.

Built libraries are cached on disk, per user, in :func:`cache_dir`, under a name that hashes the
kernel sources, the compiler's identity (``--version`` and what ``-march=native`` means on this
machine), the flags and the configuration. Several processes (DDP ranks) may build at once: a
build holds a file lock and writes to a temporary file that is renamed into place, so a library is
either absent or complete.

Flags (:data:`CXX_FLAGS`): ``-O3 -march=native -fopenmp`` (without ``-fopenmp`` when the
compiler has no OpenMP, e.g. Apple's clang: then one thread), no fast math and
``-ffp-contract=off`` (no FMA contraction), so that spikes and membranes are bit-identical to the
torch backend; ``-fno-math-errno -fno-trapping-math`` let the compiler vectorise ``rint`` and the
comparisons without changing any result. ``-march=native`` is what makes ``rint`` a vector
instruction on x86-64 (SSE4.1 and later); it is part of the cache key, so a home directory shared
by machines of different kinds gets one library per kind.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Optional

import torch

from .._filelock import file_lock
from ._fused import KernelConfig, KernelScalars, run_fused

#: compiler flags of every build (``-march=native`` is added when the compiler accepts it)
CXX_FLAGS = ("-std=c++14", "-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off",
             "-fno-fast-math", "-fno-math-errno", "-fno-trapping-math")
NATIVE_FLAG = "-march=native"
#: left out (the kernels then run on one thread) when the compiler has no OpenMP
OPENMP_FLAG = "-fopenmp"

#: sources compiled into every library, in this order
SOURCES = ("host_shim.h", "neuron.cu", "cpu_entry.h")

INSTALL_HINT = ("the cpp backend compiles snnquant's neuron kernels for the CPU at first use and "
                "needs a C++ compiler with OpenMP: install g++ (Debian/Ubuntu: apt-get install "
                "g++; Fedora: dnf install gcc-c++; conda: conda install gxx_linux-64) or set $CXX "
                "to one; or use backend='torch'")

_SCALAR_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "snq_half",
                 torch.bfloat16: "snq_bfloat16"}


class CppCompilerUnavailableError(RuntimeError):
    """Raised when the cpp backend is asked for but no C++ compiler is found.

    Args:
        message: what is missing and what to install.
    """


class CppBuildError(RuntimeError):
    """Raised when the compiler fails on the kernel source; the message holds its output.

    Args:
        message: the command and the compiler's output.
    """


def cpp_compiler() -> Optional[str]:
    """Path of the C++ compiler the cpp backend uses, or ``None`` when there is none.

    ``$CXX`` when set (and then only it), else the first of ``g++``, ``c++``, ``clang++`` on the
    ``PATH``.


    Returns:
        The compiler's path, or ``None``.
    """
    return _find_compiler(os.environ.get("CXX"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=16)
def _find_compiler(cxx: Optional[str], search_path: Optional[str]) -> Optional[str]:
    # cached per ($CXX, $PATH): backend='auto' asks on every forward
    if cxx:
        return shutil.which(cxx, path=search_path)
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name, path=search_path)
        if path:
            return path
    return None


def cpp_available() -> bool:
    """Whether a C++ compiler is there, i.e. whether the cpp backend can run on CPU tensors.

    ``backend='auto'`` picks ``'cpp'`` for CPU tensors when this is ``True``.


    Returns:
        ``True`` when :func:`cpp_compiler` finds a compiler.
    """
    return cpp_compiler() is not None


def cache_dir() -> Path:
    """The per-user directory of built kernel libraries.

    ``$SNNQUANT_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/snnquant/kernels``, else
    ``~/.cache/snnquant/kernels``.


    Returns:
        The directory (not created here).
    """
    explicit = os.environ.get("SNNQUANT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "snnquant" / "kernels"


def _run(command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, **kwargs)


@functools.lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> tuple[tuple[str, ...], str]:
    """``(flags, identity)``: the flags this compiler accepts and a text naming it exactly."""
    version = _run([compiler, "--version"])
    identity = version.stdout + version.stderr
    flags = CXX_FLAGS
    # a compiler without OpenMP (Apple's clang): build single-threaded rather than fail
    openmp = subprocess.run([compiler, OPENMP_FLAG, "-E", "-x", "c++", "-"],
                            input="#include <omp.h>\n", capture_output=True, text=True,
                            check=False)
    if openmp.returncode != 0:
        flags = tuple(f for f in flags if f != OPENMP_FLAG)
        identity += "\nno OpenMP"
    native = _run([compiler, NATIVE_FLAG, "-###", "-E", "-x", "c++", "-"])
    if native.returncode == 0:
        # what -march=native expands to on this machine (-march=znver3 -mavx2 ...)
        return (*flags, NATIVE_FLAG), identity + native.stderr
    return flags, identity


def _config_defines(config: KernelConfig) -> list[str]:
    return [f"-DSNQ_SCALAR={_SCALAR_NAMES[config.dtype]}", f"-DSNQ_NEURON={config.neuron}",
            f"-DSNQ_DECAY_INPUT={int(config.decay_input)}",
            f"-DSNQ_HARD_RESET={int(config.hard_reset)}",
            f"-DSNQ_DETACH_RESET={int(config.detach_reset)}",
            f"-DSNQ_SURROGATE={config.surrogate}", f"-DSNQ_STORE_V_SEQ={int(config.store_v_seq)}"]


def _config_tag(config: KernelConfig) -> str:
    return (f"{_SCALAR_NAMES[config.dtype]}_n{config.neuron}d{int(config.decay_input)}"
            f"h{int(config.hard_reset)}r{int(config.detach_reset)}s{config.surrogate}"
            f"v{int(config.store_v_seq)}")


def _sources() -> dict[str, bytes]:
    kernel_dir = Path(__file__).resolve().parent
    return {name: (kernel_dir / name).read_bytes() for name in SOURCES}


def library_path(config: KernelConfig, compiler: Optional[str] = None,
                 directory: Optional[Path] = None) -> Path:
    """Where the library of ``config`` is (or will be) cached.

    Args:
        config: the kernel configuration.
        compiler: the C++ compiler (default: :func:`cpp_compiler`).
        directory: the cache directory (default: :func:`cache_dir`).

    Returns:
        The path of the shared library.

    Raises:
        CppCompilerUnavailableError: no compiler.
    """
    compiler = compiler or cpp_compiler()
    if compiler is None:
        raise CppCompilerUnavailableError(f"no C++ compiler found: {INSTALL_HINT}")
    flags, identity = _compiler_identity(compiler)
    digest = hashlib.sha256()
    for name, text in sorted(_sources().items()):
        digest.update(name.encode() + b"\0" + text + b"\0")
    for part in (compiler, identity, *flags, *_config_defines(config)):
        digest.update(part.encode() + b"\0")
    directory = cache_dir() if directory is None else Path(directory)
    return directory / f"snnquant_neuron_{_config_tag(config)}_{digest.hexdigest()[:24]}.so"


def build_library(config: KernelConfig, compiler: Optional[str] = None,
                  directory: Optional[Path] = None) -> Path:
    """Compile the library of ``config`` into the cache unless it is there already.

    Safe when several processes call it at once: the build runs under a lock file next to the
    library, into a temporary file that is then renamed into place.


    Args:
        config: the kernel configuration.
        compiler: the C++ compiler (default: :func:`cpp_compiler`).
        directory: the cache directory (default: :func:`cache_dir`).

    Returns:
        The path of the library.

    Raises:
        CppCompilerUnavailableError: no compiler.
        CppBuildError: the compilation failed (with the compiler's output).
    """
    compiler = compiler or cpp_compiler()
    target = library_path(config, compiler, directory)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # without flock (Windows) the atomic rename alone keeps concurrent builds safe
    with file_lock(target.with_name(target.name + ".lock")):
        if target.exists():  # another process built it while this one waited
            return target
        flags, _ = _compiler_identity(compiler)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
            work = Path(work)
            # compile exactly the sources that were hashed into the name
            for name, text in _sources().items():
                (work / name).write_bytes(text)
            entry = work / "entry.cpp"
            entry.write_text("".join(f'#include "{name}"\n' for name in SOURCES),
                             encoding="utf-8")
            partial = work / "library.so"
            command = [compiler, *flags, *_config_defines(config), "-I", str(work), str(entry),
                       "-o", str(partial)]
            result = _run(command)
            if result.returncode != 0:
                raise CppBuildError(f"the cpp backend could not compile neuron.cu ({compiler}, "
                                    f"exit {result.returncode}): {' '.join(command)}\n"
                                    f"{result.stderr}")
            os.replace(partial, target)
    return target


class _CppLibrary:
    """One loaded library: the forward and backward entry points of one configuration."""

    def __init__(self, path: Path):
        self.path = path
        lib = ctypes.CDLL(str(path))
        p, d, i, ll = ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_longlong
        lib.snq_cpu_forward.argtypes = [p] * 8 + [d] * 5 + [i, ll, i]
        lib.snq_cpu_forward.restype = None
        lib.snq_cpu_backward.argtypes = [p] * 12 + [d] * 6 + [i, ll, i]
        lib.snq_cpu_backward.restype = None
        self.forward = lib.snq_cpu_forward
        self.backward = lib.snq_cpu_backward
        self._lib = lib


class _LibraryCache:
    """Loaded libraries of this process, one per :class:`KernelConfig`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._libraries: dict[KernelConfig, _CppLibrary] = {}

    def get(self, config: KernelConfig) -> _CppLibrary:
        library = self._libraries.get(config)
        if library is None:
            with self._lock:
                library = self._libraries.get(config)
                if library is None:
                    library = _CppLibrary(build_library(config))
                    self._libraries[config] = library
        return library

    def __len__(self) -> int:
        return len(self._libraries)

    def clear(self) -> None:
        with self._lock:
            self._libraries.clear()


#: the libraries loaded by this process
LIBRARY_CACHE = _LibraryCache()


def _pointer(tensor: Optional[torch.Tensor]) -> Optional[int]:
    return None if tensor is None else tensor.data_ptr()


def check_cpu(name: str, tensor: torch.Tensor) -> None:
    """Raise ValueError naming ``name`` and the device unless ``tensor`` is on the CPU."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} is on {tensor.device}: the cpp backend runs on CPU tensors only; "
                         "use backend='cupy' (or 'auto') for CUDA tensors, or 'torch'")


class CppLauncher:
    """Runs the CPU build of ``neuron.cu`` for :func:`~snnquant.kernels._fused.run_fused`.

    Each launch is one call into the library of its configuration, with
    ``torch.get_num_threads()`` OpenMP threads (one thread for fewer than 32,768 elements).
    """

    def __init__(self, cache: Optional[_LibraryCache] = None):
        self._cache = LIBRARY_CACHE if cache is None else cache

    def check_device(self, name: str, tensor: torch.Tensor) -> None:
        """Raise ValueError unless ``tensor`` is on the CPU.

        Args:
            name: argument name for the message.
            tensor: the tensor to check.
        """
        check_cpu(name, tensor)

    def forward(self, config: KernelConfig, T: int, N: int, x_seq, v_init, step, k, spike_seq,
                v_last, v_seq, h_seq, scalars: KernelScalars) -> None:
        """Run the forward of ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        self._cache.get(config).forward(
            _pointer(x_seq), _pointer(v_init), _pointer(step), _pointer(k), _pointer(spike_seq),
            _pointer(v_last), _pointer(v_seq), _pointer(h_seq), scalars.tau, scalars.v_threshold,
            scalars.v_reset, scalars.qmin, scalars.qmax, T, N, torch.get_num_threads())

    def backward(self, config: KernelConfig, T: int, N: int, h_seq, x_seq, v_init, step, k,
                 grad_spike_seq, grad_v_seq, grad_v_last, grad_x_seq, grad_v_init,
                 grad_step_partial, grad_k_partial, scalars: KernelScalars) -> None:
        """Run the backward of ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        self._cache.get(config).backward(
            _pointer(h_seq), _pointer(x_seq), _pointer(v_init), _pointer(step), _pointer(k),
            _pointer(grad_spike_seq), _pointer(grad_v_seq), _pointer(grad_v_last),
            _pointer(grad_x_seq), _pointer(grad_v_init), _pointer(grad_step_partial),
            _pointer(grad_k_partial), scalars.tau, scalars.v_threshold, scalars.v_reset,
            scalars.qmin, scalars.qmax, scalars.alpha, T, N, torch.get_num_threads())


def require_cpp() -> str:
    """Return the compiler's path, or raise :class:`CppCompilerUnavailableError` saying what to
    install.


    Returns:
        The path of the C++ compiler.
    """
    compiler = cpp_compiler()
    if compiler is None:
        cxx = os.environ.get("CXX")
        found = f"$CXX={cxx!r} is not an executable" if cxx else \
            "none of g++, c++, clang++ is on the PATH"
        raise CppCompilerUnavailableError(f"{INSTALL_HINT} ({found})")
    return compiler


def cpp_quant_neuron_multi_step(x_seq: torch.Tensor, v_init, *, neuron: str, tau: float = 2.0,
                                w: Optional[torch.Tensor] = None, decay_input: bool = True,
                                v_threshold: float = 1.0, v_reset: Optional[float] = 0.0,
                                surrogate_function=None, detach_reset: bool = False, step,
                                qmin: int, qmax: int, step_grad_scale: float = 1.0,
                                store_v_seq: bool = False):
    """Multi-step IF/LIF/PLIF neurons with a quantized membrane, fused, on CPU tensors.

    The CPU counterpart of :func:`snnquant.kernels.fused_quant_neuron_multi_step`: same
    signature, dynamics and gradients (see there and
    ``snnquant.functional.neuron.quant_neuron_multi_step``), run by the CPU build of the same
    kernels. With :math:`Q(h) = \\mathrm{clamp}(\\mathrm{round}(h/s), q_{min}, q_{max})\\,s`:

    .. math::
        \\hat H_t = Q(f(V_{t-1}, X_t)),\\quad S_t = \\Theta(\\hat H_t - v_{th}),\\quad
        V_t = \\mathrm{reset}(\\hat H_t, S_t)

    Spikes and membranes are bit-identical to the torch backend for float32 and float64; float16
    and bfloat16 are loaded, computed in float32 and rounded on store.

    Args:
        x_seq: input ``[T, N, ...]`` on the CPU; float16, bfloat16, float32 or float64.
        v_init: initial membrane, a tensor broadcastable to ``x_seq[0]`` or a number.
        neuron: ``'if'``, ``'lif'`` or ``'plif'``.
        tau: LIF time constant.
        w: PLIF parameter (one-element tensor).
        decay_input: LIF/PLIF input decay.
        v_threshold: firing threshold.
        v_reset: hard reset value or ``None`` (soft reset).
        surrogate_function: ``surrogate.Sigmoid`` or ``surrogate.ATan`` (``None``: Sigmoid()).
        detach_reset: no gradient through the reset.
        step: quantization step (positive float or one-element tensor).
        qmin: lowest grid index.
        qmax: highest grid index.
        step_grad_scale: factor on the step's gradient.
        store_v_seq: also return the membrane after every step.

    Returns:
        ``(spike_seq, v_last, v_seq or None)``.

    Raises:
        CppCompilerUnavailableError: no C++ compiler (the message says what to install).
        CppBuildError: the compiler failed.
        ValueError: a tensor not on the CPU, an unsupported surrogate or another bad argument.
    """
    for name, tensor in (("x_seq", x_seq), ("v_init", v_init), ("step", step),
                         ("w", w if neuron == "plif" else None)):
        if isinstance(tensor, torch.Tensor):
            check_cpu(name, tensor)
    require_cpp()
    return run_fused(CppLauncher(), x_seq, v_init, neuron=neuron, tau=tau, w=w,
                     decay_input=decay_input, v_threshold=v_threshold, v_reset=v_reset,
                     surrogate_function=surrogate_function, detach_reset=detach_reset,
                     step=step, qmin=qmin, qmax=qmax, step_grad_scale=step_grad_scale,
                     store_v_seq=store_v_seq)
