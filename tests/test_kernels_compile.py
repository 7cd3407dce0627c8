"""``neuron.cu`` compiles for the GPU, checked without a GPU.

* NVRTC (the compiler CuPy uses at run time) through ctypes, with the same name expressions the
  launchers ask CuPy for, for every configuration and the chip kernels; libnvrtc ships with PyTorch's CUDA wheels
  (``nvidia/*/lib``) or the CUDA toolkit.
* ``nvcc --ptx`` when nvcc is on PATH, for the float32 and bfloat16 instantiations and the chip
  kernels.

Each is skipped, with the reason, where its compiler is missing.
"""

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snnquant.kernels import _fused, chip

ARCH = "compute_80"  # accepted by NVRTC/nvcc from CUDA 11.1 to 13


def _kernel_names():
    configs = _fused.all_configs()
    return sorted({c.forward_name for c in configs} | {c.backward_name for c in configs})


def _find_nvrtc():
    candidates = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
    for entry in sys.path:
        candidates += sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "libnvrtc.so*")))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for path in candidates:
        if "builtins" in path or ".alt." in path:
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError:
            continue
    return None, None


class _Nvrtc:
    def __init__(self, lib):
        self.lib = lib

    def check(self, status, what):
        if status != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise AssertionError(f"{what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source, names, options):
        lib = self.lib
        program = ctypes.c_void_p()
        self.check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"neuron.cu", 0,
                                          None, None), "nvrtcCreateProgram")
        try:
            for name in names:
                self.check(lib.nvrtcAddNameExpression(program, name.encode()), name)
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = lib.nvrtcCompileProgram(program, len(options), opts)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(program, log)
            log = log.value.decode(errors="replace")
            self.check(status, f"nvrtcCompileProgram\n{log}")
            lowered = {}
            for name in names:
                pointer = ctypes.c_char_p()
                self.check(lib.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(pointer)),
                           name)
                lowered[name] = pointer.value.decode()
            lib.nvrtcGetPTXSize(program, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            self.check(lib.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
            return log, lowered, ptx.value.decode()
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(program))


def test_nvrtc_compiles_every_configuration():
    lib, path = _find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (no CUDA toolkit and no nvidia-cuda-nvrtc wheel)")
    from snnquant.kernels.cupy_backend import NVRTC_OPTIONS

    # the neuron kernels of every configuration and the chip kernels (kernels.chip's names)
    names = _kernel_names() + list(chip.kernel_names())
    assert len(names) == 240 + 9
    log, lowered, ptx = _Nvrtc(lib).compile(_fused.kernel_source(), names,
                                            [*NVRTC_OPTIONS, f"--gpu-architecture={ARCH}"])
    assert "warning" not in log.lower(), log
    entries = {line.split()[-1].rstrip("(") for line in ptx.splitlines() if ".entry" in line}
    missing = [name for name in names if lowered[name] not in entries]
    assert not missing, f"{len(missing)} kernels missing from the PTX ({path}): {missing[:3]}"
    # the forward arithmetic must stay uncontracted (explicit __f*_rn intrinsics): no FMA in any
    # forward kernel, so that it rounds every operation as PyTorch does
    starts = [m.start() for m in re.finditer(r"\.entry ", ptx)] + [len(ptx)]
    bodies = {ptx[a:b].split("(")[0].split()[-1]: ptx[a:b] for a, b in zip(starts, starts[1:])}
    forward = [lowered[name] for name in names if name.startswith("snq_forward")]
    contracted = [name for name in forward if "fma.rn" in bodies[name]]
    assert not contracted, f"fused multiply-adds in forward kernels: {contracted[:3]}"


def test_nvcc_compiles_every_configuration(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    kernel_dir = Path(_fused.__file__).resolve().parent
    # NVRTC above compiles all 240; nvcc (slower) checks the float32 and bfloat16 half of them,
    # and the 9 chip kernels
    names = [name for name in _kernel_names() if "<float," in name or "<snq_bfloat16," in name]
    names += chip.kernel_names()
    assert len(names) == 120 + 9
    # taking each kernel's address instantiates it, as NVRTC's name expressions do
    table = ",\n".join(f"    (const void*)&{name}" for name in names)
    source = tmp_path / "instantiate_all.cu"
    source.write_text(f'#include "neuron.cu"\nextern const void* const snq_kernels[];\n'
                      f'const void* const snq_kernels[] = {{\n{table}\n}};\n', encoding="utf-8")
    result = subprocess.run([nvcc, "--ptx", f"-arch={ARCH}", "-I", str(kernel_dir), str(source),
                             "-o", str(tmp_path / "all.ptx")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    ptx = (tmp_path / "all.ptx").read_text(encoding="utf-8")
    assert ptx.count(".entry") == len(names)

