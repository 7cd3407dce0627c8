"""The processor a benchmark ran on, for the results files (no torch import: every benchmark can
use it before it imports anything heavy)."""
from __future__ import annotations

import platform


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
