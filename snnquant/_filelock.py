"""An exclusive lock between processes on one machine, held by a file (``flock``)."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional


@contextlib.contextmanager
def file_lock(path: Path, waiting: Optional[str] = None):
    """Hold an exclusive ``flock`` on ``path`` (created when absent) for the ``with`` block.

    The kernel releases the lock when its holder exits, crashed or not, so a lock never outlives
    the process that took it. Where another process holds it, ``waiting`` (when given) is written
    to stderr once and the call waits. Without ``flock`` (Windows) there is no lock.

    Args:
        path: the lock file; its folder must exist.
        waiting: what to tell the user while another process holds the lock.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
