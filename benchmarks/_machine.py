"""Where and with what a benchmark runs, for its results files: the checkout it runs from, the
processor and the versions (no torch import at import time: every benchmark can use it before it
imports anything heavy).

A script finds this module through its own folder (``sys.path.insert(0, <benchmarks/>)``, the one
line of preamble every script keeps), then puts the checkout on the path with
:func:`use_checkout`."""
from __future__ import annotations

import os
import platform
import sys

#: the repository root: the folder that holds ``benchmarks/`` and ``snnquant/``
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout() -> str:
    """Put the repository root first on ``sys.path``, so that a benchmark imports this checkout's
    ``snnquant`` (installed or not) and the package ``benchmarks``; return the root."""
    sys.path.insert(0, ROOT)
    return ROOT


def cpu_name() -> str:
    """The CPU model from ``/proc/cpuinfo`` (``platform.processor()`` where there is none; it is
    empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def package_version(name: str) -> str:
    """The installed version of the distribution ``name``, ``"not installed"`` without one
    (snnquant run from a checkout without an install: its ``__version__``). SpikingJelly 2.0.0
    has no ``__version__``: its version is the installed distribution's."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        if name == "snnquant":
            import snnquant

            return snnquant.__version__
        return "not installed"


def machine() -> dict:
    """The machine and versions a result was measured with: platform, CPU, Python, torch,
    SpikingJelly, CPU count and threads."""
    import torch
    from importlib.metadata import version

    return dict(platform=platform.platform(), cpu=cpu_name(),
                python=platform.python_version(), torch=torch.__version__,
                spikingjelly=version("spikingjelly"), cpu_count=os.cpu_count(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                torch_threads=torch.get_num_threads())
