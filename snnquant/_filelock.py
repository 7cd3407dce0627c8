"""An exclusive lock between processes on one machine, held by a file (``flock``)."""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Optional


@contextlib.contextmanager
def file_lock(path: Path, waiting: Optional[str] = None, quiet_seconds: float = 2.0):
    """Hold an exclusive ``flock`` on ``path`` (created when absent) for the ``with`` block.

    The kernel releases the lock when its holder exits, crashed or not, so a lock never outlives
    the process that took it. Where another process holds it for more than ``quiet_seconds``,
    ``waiting`` (when given) is written to stderr once; the call waits as long as it takes.
    Without ``flock`` (Windows) there is no lock.

    Args:
        path: the lock file; its folder must exist.
        waiting: what to tell the user while another process holds the lock.
        quiet_seconds: how long to wait before saying so (a short load by another process
            is not worth a message).
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as handle:
        deadline = time.monotonic() + quiet_seconds
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    if waiting:
                        print(waiting, file=sys.stderr, flush=True)
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                    break
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
