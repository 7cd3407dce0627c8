"""The cpp backend: ``neuron.cu`` compiled for the CPU with optimisation and OpenMP, at first use.

The same kernel source as the GPU's (``neuron.cu``, behind ``host_shim.h``) is compiled with the
C++ compiler (``$CXX``, else ``g++``, ``c++`` or ``clang++``) together with ``cpu_entry.h``, which
runs the kernels' per-step functions in a CPU loop nest: OpenMP threads
(``torch.get_num_threads()`` of them) share blocks of 256 neighbouring neurons, and inside a block
time is the outer loop and the block's neurons the inner, vectorised one. One shared library is
built per :class:`~snnquant.kernels._fused.KernelConfig` (one template instantiation, about a
second) and loaded with :mod:`ctypes`; tensors are passed as raw data pointers, so nothing is
copied and there is no Python loop over neurons or steps.

The same build has a test mode, ``mode='host'`` (:mod:`snnquant.kernels.host`): one library with
every configuration, ``-O1``, ``host_entry.h`` instead of ``cpu_entry.h``, which runs the GPU
kernels themselves once per neuron; both modes have the same compiler, flags and entry points.
A third mode, ``mode='chip'``, builds the chip neurons of :mod:`snnquant.kernels.chip` (the same
source with ``chip_entry.h``: every chip in one library, with its own two entry points).

Built libraries are cached on disk, per user, in :func:`cache_dir`, under a name that hashes the
kernel sources, the compiler's identity (``--version`` and what ``-march=native`` means on this
machine), the flags and the configuration. Several processes (DDP ranks) may build at once: a
build holds a file lock and writes to a temporary file that is fsynced and renamed into place
(:func:`snnquant._io.atomic_write`), then records the library's SHA-256 beside it
(``<library>.sha256``). A library is loaded only when its bytes match that record, so a damaged
(cut) or foreign file is rebuilt, never loaded; what killed builds left behind is removed by the
next build. A library that matches its record but does not load (another library put in its
place together with its ``.sha256``: ``invalid ELF header``, ``undefined symbol``) is rebuilt once
(:func:`open_cached_library`); a second failure is a :class:`KernelCacheError` naming the file.
A cache folder that cannot be written is refused with :class:`KernelCacheError`
(``backend='cpp'``) or makes ``backend='auto'`` run the torch backend, with one warning.

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
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

import torch

from .._filelock import file_lock
from .._io import atomic_write, remove_stale_temporaries
from .._paths import user_cache_home
from ..functional.neuron import NeuronParams
from ._fused import (KernelCache, KernelConfig, KernelScalars, pointer, run_fused,
                     tensor_arguments)

#: compiler flags of every build (``-march=native`` is added when the compiler accepts it); the
#: test mode replaces ``-O3`` by ``-O1`` (see :data:`MODES`)
CXX_FLAGS = ("-std=c++14", "-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off",
             "-fno-fast-math", "-fno-math-errno", "-fno-trapping-math")
NATIVE_FLAG = "-march=native"
#: left out (the kernels then run on one thread) when the compiler has no OpenMP
OPENMP_FLAG = "-fopenmp"

#: per build mode: the optimisation level and the sources compiled into the library, in order.
#: ``'cpp'``: one configuration (the backend); ``'host'``: every configuration in one library,
#: each GPU kernel run once per neuron (the tests of the kernel arithmetic; -O1 keeps the build
#: of all 240 instantiations at a few seconds); ``'chip'``: the chip neurons, every chip and
#: surrogate in one library (:mod:`snnquant.kernels.chip`)
MODES = {"cpp": ("-O3", ("host_shim.h", "neuron.cu", "cpu_entry.h")),
         "host": ("-O1", ("host_shim.h", "neuron.cu", "host_entry.h")),
         "chip": ("-O3", ("host_shim.h", "neuron.cu", "chip_entry.h"))}

#: the modes whose one library holds every configuration (built with no ``KernelConfig``)
_WHOLE_MODES = ("host", "chip")

#: sources compiled into every library of the cpp backend, in this order
SOURCES = MODES["cpp"][1]

#: the environment variable that names the kernel cache folder
CACHE_VARIABLE = "SNNQUANT_CACHE_DIR"

#: a build folder or temporary file older than this (seconds) is a killed build's
STALE_SECONDS = 600.0

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


class KernelCacheError(RuntimeError):
    """Raised when the kernel cache folder cannot be created or written (``backend='cpp'``), or
    a cached library does not load even after it was rebuilt.

    The message names the folder, why it failed and the variable to set
    (:data:`CACHE_VARIABLE`).

    Args:
        message: the folder, the reason and what to do.
    """


def cpp_compiler() -> Optional[str]:
    """Path of the C++ compiler of every CPU build (the cpp backend and its test mode), or
    ``None`` when there is none.

    ``$CXX`` when set (and then only it), else the first of ``g++``, ``c++``, ``clang++`` on the
    ``PATH``.


    Returns:
        The compiler's path, or ``None``.
    """
    return _find_compiler(os.environ.get("CXX"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=16)
def _find_compiler(cxx: Optional[str], search_path: Optional[str]) -> Optional[str]:
    # cached per ($CXX, $PATH): backend='auto' asks whenever it resolves
    if cxx:
        return shutil.which(cxx, path=search_path)
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name, path=search_path)
        if path:
            return path
    return None


def cpp_available() -> bool:
    """Whether a C++ compiler is there, i.e. whether the cpp backend can run on CPU tensors.

    ``backend='auto'`` picks ``'cpp'`` for CPU tensors when this is ``True`` (and the kernel
    cache folder can be written, see :func:`cache_problem`).


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
    explicit = os.environ.get(CACHE_VARIABLE)
    if explicit:
        return Path(explicit)
    return user_cache_home() / "snnquant" / "kernels"


def _cache_message(directory: Path, reason: str) -> str:
    return (f"the kernel cache folder {directory} cannot be written ({reason}); set "
            f"{CACHE_VARIABLE} to a writable folder")


def cache_problem(directory: Optional[Path] = None) -> Optional[str]:
    """Why the kernel cache folder cannot be used, or ``None`` when it can.

    Creates the folder when absent and writes (and removes) a file in it. A usable folder is
    remembered for the process, so the check costs nothing after the first time.

    Args:
        directory: the folder (default: :func:`cache_dir`).

    Returns:
        ``None``, or a message naming the folder, the reason and :data:`CACHE_VARIABLE`.
    """
    directory = cache_dir() if directory is None else Path(directory)
    try:
        _writable(str(directory))
    except OSError as error:
        if os.path.lexists(directory) and not directory.is_dir():
            return _cache_message(directory, "it is a file, not a folder")
        return _cache_message(directory, f"{type(error).__name__}: {error.strerror or error}")
    return None


@functools.lru_cache(maxsize=64)
def _writable(directory: str) -> bool:
    # raises OSError when the folder cannot be written; lru_cache keeps only the successes
    Path(directory).mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryFile(dir=directory, prefix=".probe-"):
        pass
    return True


def require_cache(directory: Optional[Path] = None) -> Path:
    """Return the kernel cache folder, or raise :class:`KernelCacheError` saying why it cannot be
    written and which variable to set.

    Args:
        directory: the folder (default: :func:`cache_dir`).

    Returns:
        The folder.
    """
    directory = cache_dir() if directory is None else Path(directory)
    problem = cache_problem(directory)
    if problem is not None:
        raise KernelCacheError(f"backend='cpp': {problem}, or use backend='torch'")
    return directory


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def usable_for_auto() -> bool:
    """Whether ``backend='auto'`` may pick the cpp backend: a compiler is found and the kernel
    cache folder can be written. An unwritable folder gives one warning per process and folder
    (naming the folder and :data:`CACHE_VARIABLE`); a missing compiler is silent.

    Returns:
        ``True`` when the cpp backend can run here.
    """
    if not cpp_available():
        return False
    problem = cache_problem()
    if problem is None:
        return True
    _warn_once(f"snnquant: {problem}; backend='auto' runs the quantized neurons with the torch "
               "backend instead of the cpp kernels")
    return False


def _run(command, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


@functools.lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> tuple[tuple[str, ...], str]:
    """``(flags, identity)``: the flags this compiler accepts and a text naming it exactly."""
    version = _run([compiler, "--version"])
    identity = version.stdout + version.stderr
    flags = CXX_FLAGS
    # a compiler without OpenMP (Apple's clang): build single-threaded rather than fail
    openmp = _run([compiler, OPENMP_FLAG, "-E", "-x", "c++", "-"], input="#include <omp.h>\n",
                  stdin=None)
    if openmp.returncode != 0:
        flags = tuple(f for f in flags if f != OPENMP_FLAG)
        identity += "\nno OpenMP"
    native = _run([compiler, NATIVE_FLAG, "-###", "-E", "-x", "c++", "-"])
    if native.returncode == 0:
        # what -march=native expands to on this machine (-march=znver3 -mavx2 ...)
        return (*flags, NATIVE_FLAG), identity + native.stderr
    return flags, identity


def _mode_flags(compiler: str, mode: str) -> tuple[str, ...]:
    level = MODES[mode][0]
    return tuple(level if flag == "-O3" else flag for flag in _compiler_identity(compiler)[0])


def _config_defines(config: Optional[KernelConfig]) -> list[str]:
    if config is None:  # the test mode: every configuration
        return []
    return [f"-DSNQ_SCALAR={_SCALAR_NAMES[config.dtype]}", f"-DSNQ_DTYPE_CODE={config.dtype_code}",
            f"-DSNQ_NEURON={config.neuron}",
            f"-DSNQ_DECAY_INPUT={int(config.decay_input)}",
            f"-DSNQ_HARD_RESET={int(config.hard_reset)}",
            f"-DSNQ_DETACH_RESET={int(config.detach_reset)}",
            f"-DSNQ_SURROGATE={config.surrogate}", f"-DSNQ_STORE_V_SEQ={int(config.store_v_seq)}"]


def _config_tag(config: Optional[KernelConfig], mode: str) -> str:
    if config is None:
        return mode
    return (f"{_SCALAR_NAMES[config.dtype]}_n{config.neuron}d{int(config.decay_input)}"
            f"h{int(config.hard_reset)}r{int(config.detach_reset)}s{config.surrogate}"
            f"v{int(config.store_v_seq)}")


def _sources(mode: str) -> dict[str, bytes]:
    kernel_dir = Path(__file__).resolve().parent
    return {name: (kernel_dir / name).read_bytes() for name in MODES[mode][1]}


def _check_mode(mode: str, config: Optional[KernelConfig]) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
    whole = mode in _WHOLE_MODES
    if (config is None) != whole:
        raise ValueError(f"mode {mode!r} takes {'no' if whole else 'a'} KernelConfig, "
                         f"got {config!r}")


def library_path(config: Optional[KernelConfig], compiler: Optional[str] = None,
                 directory: Optional[Path] = None, mode: str = "cpp") -> Path:
    """Where the library of ``config`` is (or will be) cached.

    Args:
        config: the kernel configuration (``None`` in the test mode: every configuration).
        compiler: the C++ compiler (default: :func:`cpp_compiler`).
        directory: the cache directory (default: :func:`cache_dir`).
        mode: ``'cpp'``, ``'host'`` or ``'chip'`` (:data:`MODES`).

    Returns:
        The path of the shared library.

    Raises:
        CppCompilerUnavailableError: no compiler.
    """
    _check_mode(mode, config)
    compiler = compiler or cpp_compiler()
    if compiler is None:
        raise CppCompilerUnavailableError(f"no C++ compiler found: {INSTALL_HINT}")
    digest = hashlib.sha256()
    for name, text in sorted(_sources(mode).items()):
        digest.update(name.encode() + b"\0" + text + b"\0")
    identity = _compiler_identity(compiler)[1]
    for part in (compiler, identity, *_mode_flags(compiler, mode), *_config_defines(config)):
        digest.update(part.encode() + b"\0")
    directory = cache_dir() if directory is None else Path(directory)
    return directory / f"snnquant_neuron_{_config_tag(config, mode)}_{digest.hexdigest()[:24]}.so"


def _checksum_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def library_is_intact(library: Path) -> bool:
    """Whether ``library`` exists and its bytes have the SHA-256 recorded when it was built.

    A cut, damaged or foreign file (or one without a record) is not: it is rebuilt, never loaded.

    Args:
        library: the path of a cached library.
    """
    try:
        recorded = _checksum_path(library).read_text(encoding="ascii").strip()
        actual = hashlib.sha256(library.read_bytes()).hexdigest()
    except (OSError, UnicodeDecodeError):
        return False
    return recorded == actual


def remove_stale_builds(directory: Path) -> list:
    """Remove what killed builds left in the cache folder; return the removed paths.

    That is: the temporaries of libraries and checksums (``<file>.tmp-<host>-<pid>-<token>``)
    whose process is gone (:func:`snnquant._io.remove_stale_temporaries`), and build folders
    (``.build-*``, made by earlier versions, which compiled in a folder) older than
    :data:`STALE_SECONDS`.

    Args:
        directory: the cache folder.
    """
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if ".tmp-" in entry.name:
            removed += remove_stale_temporaries(Path(directory) / entry.name.split(".tmp-")[0])
        elif entry.name.startswith(".build-"):
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if age > STALE_SECONDS:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _sources_text(mode: str) -> str:
    # the sources are concatenated on stdin (no build folder to leave behind); #line keeps the
    # compiler's messages pointing at the real files
    return "".join(f'#line 1 "{name}"\n' + text.decode("utf-8") + "\n"
                   for name, text in _sources(mode).items())


def compiler_identity(compiler: str) -> tuple[tuple[str, ...], str]:
    """``(flags, identity)``: the flags the cpp backend builds with on this compiler (OpenMP and
    ``-march=native`` where it takes them) and a text naming the compiler exactly (its version
    and what ``-march=native`` means here), for cache keys."""
    return _compiler_identity(compiler)


def compile_into_cache(target: Path, source: str, flags: Sequence[str], compiler: str,
                       what: str) -> Path:
    """Compile the C++ ``source`` (given on stdin) with ``flags`` into the shared library
    ``target`` in a cache folder, unless an intact one (:func:`library_is_intact`) is there.

    Safe when several processes call it at once: the build runs under a lock file next to the
    library, into a temporary file that is fsynced and renamed into place; then the library's
    SHA-256 is recorded beside it. A library whose bytes do not match the record (cut, damaged,
    foreign, or never recorded) is rebuilt. Stale temporaries of killed builds are removed.

    Args:
        target: the library's path; its name must change with whatever changes the build
            (source, compiler, flags).
        source: the C++ source.
        flags: the compiler flags (:func:`compiler_identity`, plus any defines).
        compiler: the C++ compiler.
        what: what is compiled, for the error message.

    Returns:
        ``target``.

    Raises:
        CppBuildError: the compilation failed (with the compiler's command and output).
        KernelCacheError: the cache folder cannot be created or written.
    """
    if library_is_intact(target):
        return target
    folder = require_cache(target.parent)

    def compile_to(output: str) -> None:
        command = [compiler, *flags, "-x", "c++", "-", "-o", output]
        result = _run(command, input=source, stdin=None)
        if result.returncode != 0:
            raise CppBuildError(f"{what} did not compile ({compiler}, exit {result.returncode}): "
                                f"{' '.join(command)}\n{result.stderr}")
    try:
        # without flock (Windows) the atomic rename alone keeps concurrent builds safe
        with file_lock(target.with_name(target.name + ".lock")):
            if library_is_intact(target):  # another process built it while this one waited
                return target
            remove_stale_builds(folder)
            atomic_write(target, compile_to)
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            atomic_write(_checksum_path(target), digest + "\n")
    except OSError as error:
        raise KernelCacheError(_cache_message(folder, f"{type(error).__name__}: {error}")) \
            from error
    return target


def _close(lib: ctypes.CDLL) -> None:
    """Unload ``lib``, so that a rebuilt file at the same path is loaded afresh (the dynamic
    loader would otherwise hand back the handle it already has for that path)."""
    import _ctypes

    close = getattr(_ctypes, "dlclose", None) or getattr(_ctypes, "FreeLibrary", None)
    try:
        close(lib._handle)
    except (OSError, TypeError):   # pragma: no cover - nothing more to do
        pass


def open_cached_library(target: Path, source: str, flags: Sequence[str], compiler: str,
                        what: str, symbols: Sequence[str]) -> ctypes.CDLL:
    """:func:`compile_into_cache`, then load the library with :mod:`ctypes` and check that it
    has ``symbols``. A library that does not load (``invalid ELF header``) or lacks a symbol
    (another library put in its place together with a matching ``.sha256``) is rebuilt once.

    Args:
        target, source, flags, compiler, what: as for :func:`compile_into_cache`.
        symbols: the functions the library must define.

    Returns:
        The loaded library.

    Raises:
        CppBuildError: the compilation failed.
        KernelCacheError: the library does not load even after the rebuild; the message names
            the file, the loader's error and what to do.
    """
    error: Optional[Exception] = None
    for attempt in range(2):
        compile_into_cache(target, source, flags, compiler, what)
        try:
            lib = ctypes.CDLL(str(target))
        except OSError as exc:
            error = exc
        else:
            missing = [name for name in symbols if not hasattr(lib, name)]
            if not missing:
                return lib
            error = AttributeError(f"undefined symbol: {', '.join(missing)}")
            _close(lib)
        if attempt == 0:   # not to be trusted: its record goes, so the next call rebuilds it
            _checksum_path(target).unlink(missing_ok=True)
    raise KernelCacheError(f"{what}: the cached library {target} does not load even after it "
                           f"was rebuilt ({error}); remove it, or set {CACHE_VARIABLE} to "
                           f"another folder")


def build_library(config: Optional[KernelConfig], compiler: Optional[str] = None,
                  directory: Optional[Path] = None, mode: str = "cpp") -> Path:
    """Compile the library of ``config`` into the cache unless an intact one is there already.

    Safe when several processes call it at once: the build runs under a lock file next to the
    library, into a temporary file that is fsynced and renamed into place; then the library's
    SHA-256 is recorded beside it. A library whose bytes do not match the record (cut, damaged,
    foreign, or never recorded) is rebuilt.

    Args:
        config: the kernel configuration (``None`` in the test mode).
        compiler: the C++ compiler (default: :func:`cpp_compiler`).
        directory: the cache directory (default: :func:`cache_dir`).
        mode: ``'cpp'``, ``'host'`` or ``'chip'`` (:data:`MODES`).

    Returns:
        The path of the library.

    Raises:
        CppCompilerUnavailableError: no compiler.
        CppBuildError: the compilation failed (with the compiler's output).
        KernelCacheError: the cache folder cannot be created or written.
    """
    return compile_into_cache(*build_arguments(config, compiler, directory, mode))


def build_arguments(config, compiler, directory, mode):
    """``(target, source, flags, compiler, what)`` of a build, for :func:`compile_into_cache` and
    :func:`open_cached_library` (``config``, ``compiler``, ``directory``, ``mode`` as for
    :func:`build_library`)."""
    compiler = compiler or cpp_compiler()
    target = library_path(config, compiler, directory, mode)
    return (target, _sources_text(mode), [*_mode_flags(compiler, mode), *_config_defines(config)],
            compiler, "the cpp backend's neuron.cu")

class KernelLibrary:
    """One loaded library of the CPU build: its two entry points, with the one ctypes argument
    list of both modes (the configuration codes, the kernel's arguments, the thread count).

    Args:
        path: the library (from :func:`build_library`).
    """

    #: The functions every library of the CPU build defines.
    SYMBOLS = ("snq_cpu_forward", "snq_cpu_backward")

    def __init__(self, path: Path, lib: Optional[ctypes.CDLL] = None):
        self.path = Path(path)
        lib = ctypes.CDLL(str(self.path)) if lib is None else lib
        p, d, i, ll = ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_longlong
        lib.snq_cpu_forward.argtypes = [i] * 7 + [p] * 8 + [d] * 5 + [i, ll, i]
        lib.snq_cpu_forward.restype = i
        lib.snq_cpu_backward.argtypes = [i] * 7 + [p] * 12 + [d] * 6 + [i, ll, i]
        lib.snq_cpu_backward.restype = i
        self._lib = lib

    @staticmethod
    def _codes(config: KernelConfig) -> tuple[int, ...]:
        return (config.dtype_code, config.neuron, int(config.decay_input), int(config.hard_reset),
                int(config.detach_reset), config.surrogate, int(config.store_v_seq))

    def _check(self, status: int, which: str, config: KernelConfig) -> None:
        if status != 0:
            raise RuntimeError(f"{which} of {self.path.name} rejected the configuration {config}")

    def forward(self, config: KernelConfig, T: int, N: int, x_seq, v_init, step, k, spike_seq,
                v_last, v_seq, h_seq, scalars: KernelScalars) -> None:
        """Run the forward of ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        status = self._lib.snq_cpu_forward(
            *self._codes(config), *map(pointer, (x_seq, v_init, step, k, spike_seq, v_last,
                                                 v_seq, h_seq)),
            scalars.tau, scalars.v_threshold, scalars.v_reset, scalars.qmin, scalars.qmax, T, N,
            torch.get_num_threads())
        self._check(status, "snq_cpu_forward", config)

    def backward(self, config: KernelConfig, T: int, N: int, h_seq, x_seq, v_init, step, k,
                 grad_spike_seq, grad_v_seq, grad_v_last, grad_x_seq, grad_v_init,
                 grad_step_partial, grad_k_partial, scalars: KernelScalars) -> None:
        """Run the backward of ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        status = self._lib.snq_cpu_backward(
            *self._codes(config), *map(pointer, (h_seq, x_seq, v_init, step, k, grad_spike_seq,
                                                 grad_v_seq, grad_v_last, grad_x_seq, grad_v_init,
                                                 grad_step_partial, grad_k_partial)),
            scalars.tau, scalars.v_threshold, scalars.v_reset, scalars.qmin, scalars.qmax,
            scalars.alpha, T, N, torch.get_num_threads())
        self._check(status, "snq_cpu_backward", config)


#: the libraries loaded by this process, one per configuration
LIBRARY_CACHE: KernelCache = KernelCache()


def check_cpu(name: str, tensor: torch.Tensor) -> None:
    """Raise ValueError naming ``name`` and the device unless ``tensor`` is on the CPU."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} is on {tensor.device}: the cpp backend runs on CPU tensors only; "
                         "use backend='cupy' (or 'auto') for CUDA tensors, or 'torch'")


class CppLauncher:
    """Runs the CPU build of ``neuron.cu`` for :func:`~snnquant.kernels._fused.run_fused`.

    Each launch is one call into the library of its configuration, with
    ``torch.get_num_threads()`` OpenMP threads (one thread for fewer than 32,768 elements).

    Args:
        cache: where loaded libraries are kept (default: the process-wide :data:`LIBRARY_CACHE`).
    """

    def __init__(self, cache: Optional[KernelCache] = None):
        self._cache = LIBRARY_CACHE if cache is None else cache

    def library(self, config: KernelConfig) -> KernelLibrary:
        """The loaded library of ``config`` (built first when the cache has none; rebuilt once
        when it does not load, see :func:`open_cached_library`)."""
        def load() -> KernelLibrary:
            arguments = build_arguments(config, None, None, "cpp")
            return KernelLibrary(arguments[0],
                                 open_cached_library(*arguments, KernelLibrary.SYMBOLS))
        return self._cache.get(config, load)

    def forward(self, config: KernelConfig, T: int, N: int, *tensors_and_scalars) -> None:
        """Run the forward of ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        self.library(config).forward(config, T, N, *tensors_and_scalars)

    def backward(self, config: KernelConfig, T: int, N: int, *tensors_and_scalars) -> None:
        """Run the backward of ``config`` (arguments as in :class:`~._fused.Launcher`)."""
        self.library(config).backward(config, T, N, *tensors_and_scalars)


_LAUNCHER = CppLauncher()


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


def cpp_runnable(tensors):
    """:func:`cpp_step` after the one check of what it needs, made by
    :func:`snnquant.kernels.dispatch.select_backend` and :func:`cpp_quant_neuron_multi_step`
    alike: every tensor on the CPU, a C++ compiler, a writable kernel cache folder (in this order).

    Args:
        tensors: ``[(argument name, tensor)]`` whose devices are checked.

    Raises:
        ValueError: a tensor not on the CPU.
        CppCompilerUnavailableError, KernelCacheError: no compiler, or no cache folder.
    """
    for argument, tensor in tensors:
        check_cpu(argument, tensor)
    require_cpp()
    require_cache()
    return cpp_step


def cpp_step(x_seq: torch.Tensor, v_init, step, w: Optional[torch.Tensor],
             params: NeuronParams):
    """The cpp backend's step function (see :func:`snnquant.kernels.dispatch.select_backend`,
    which checks the device, the compiler and the cache first).

    Args:
        x_seq: input ``[T, N, ...]`` on the CPU.
        v_init: initial membrane, a tensor broadcastable to ``x_seq[0]`` or a number.
        step: quantization step (positive float or one-element tensor).
        w: PLIF parameter (one-element tensor).
        params: the neuron's constants.

    Returns:
        ``(spike_seq, v_last, v_seq or None)``.
    """
    return run_fused(_LAUNCHER, x_seq, v_init, step, w, params)


def cpp_quant_neuron_multi_step(x_seq: torch.Tensor, v_init, *, step,
                                w: Optional[torch.Tensor] = None, **params):
    """Multi-step IF/LIF/PLIF neurons with a quantized membrane, fused, on CPU tensors.

    The CPU counterpart of :func:`snnquant.kernels.fused_quant_neuron_multi_step`: same
    arguments, dynamics and gradients (see there and
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
        step: quantization step (positive float or one-element tensor).
        w: PLIF parameter (one-element tensor).
        **params: the fields of :class:`~snnquant.functional.neuron.NeuronParams` (``neuron``,
            ``qmin``, ``qmax``, ``tau``, ``decay_input``, ``v_threshold``, ``v_reset``,
            ``surrogate_function`` (``surrogate.Sigmoid`` or ``surrogate.ATan``),
            ``detach_reset``, ``step_grad_scale``, ``store_v_seq``).

    Returns:
        ``(spike_seq, v_last, v_seq or None)``.

    Raises:
        CppCompilerUnavailableError: no C++ compiler (the message says what to install).
        CppBuildError: the compiler failed.
        KernelCacheError: the kernel cache folder cannot be written.
        ValueError: a tensor not on the CPU, an unsupported surrogate or another bad argument.
    """
    run = cpp_runnable(tensor_arguments(x_seq, v_init, step, w, params.get("neuron")))
    return run(x_seq, v_init, step, w, NeuronParams(**params))
