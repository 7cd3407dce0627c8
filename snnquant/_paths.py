"""Where snnquant keeps what it can rebuild (compiled kernels, generated data)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache_home"]


def user_cache_home() -> Path:
    """The user's cache folder: ``$XDG_CACHE_HOME`` when set and not empty, else ``~/.cache``.

    The kernel cache (``<this>/snnquant/kernels``) and the data cache (``<this>/snnquant``) both
    live under it unless their own variables (``SNNQUANT_CACHE_DIR``, ``SNNQUANT_DATA``) say
    otherwise.

    Returns:
        The folder (not created here).
    """
    base = os.environ.get("XDG_CACHE_HOME")
    return Path(base) if base else Path(os.path.expanduser("~")) / ".cache"
