"""Corrupt cache files of SpikingJelly datasets, reported by name.

SpikingJelly stores converted events (``events_np/``) and integrated frames
(``frames_number_<T>_split_by_<how>/``) as ``.npz`` files and reads them with ``numpy.load``; a
truncated or damaged file surfaces as ``zipfile.BadZipFile`` or ``EOFError`` from inside a
DataLoader worker, without the file's path. :class:`CheckedLoader` wraps SpikingJelly's per-sample
loader so that the error names the file and says how to rebuild it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

__all__ = ["CorruptDatasetFileError", "CheckedLoader", "find_unreadable_npz", "LOAD_ERRORS"]

PathLike = Union[str, "os.PathLike[str]"]

LOAD_ERRORS = (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError)
"""What ``numpy.load`` raises on a damaged ``.npz``/``.npy`` file."""


class CorruptDatasetFileError(ValueError):
    """A dataset file that cannot be read; the message names it and how to rebuild it.

    Args:
        path: the file.
        reason: what reading it raised.
        rebuild: what to delete (or do) so that it is made again.
    """

    def __init__(self, path: PathLike, reason: Optional[str] = None, rebuild: Optional[str] = None):
        if reason is None and rebuild is None:  # re-created from its message (DataLoader workers)
            self.path, self.reason, self.rebuild = None, None, None
            super().__init__(str(path))
            return
        self.path = Path(path)
        self.reason = reason
        self.rebuild = rebuild
        super().__init__(f"corrupt dataset file {str(self.path)!r} ({reason}); {rebuild}")


class CheckedLoader:
    """A per-sample loader that turns a read error into :class:`CorruptDatasetFileError`.

    Picklable (DataLoader workers), so it is a class, not a closure.

    Args:
        loader: SpikingJelly's loader, called with the file's path.
        rebuild: the rebuild instruction put in the error, e.g. ``'delete /data/frames_number_8_split_by_number
            to have it rebuilt'``.
    """

    def __init__(self, loader: Callable, rebuild: str):
        self.loader = loader
        self.rebuild = rebuild

    def __call__(self, path):
        try:
            return self.loader(path)
        except LOAD_ERRORS as error:
            raise CorruptDatasetFileError(path, f"{type(error).__name__}: {error}", self.rebuild) from error


def find_unreadable_npz(folders: Iterable[Path]) -> Optional[Path]:
    """The first ``.npz``/``.npy`` file under ``folders`` (sorted walk) that ``numpy.load`` cannot read."""
    import numpy as np

    for folder in folders:
        if not Path(folder).is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith((".npz", ".npy")):
                    continue
                path = Path(dirpath) / name
                try:
                    data = np.load(path)
                    if isinstance(data, np.lib.npyio.NpzFile):
                        with data:
                            for key in data.files:
                                data[key]
                except LOAD_ERRORS:
                    return path
    return None


def wrap_dataset_loader(dataset, rebuild: str):
    """Replace ``dataset.loader`` (a torchvision ``DatasetFolder``) by a :class:`CheckedLoader`."""
    if hasattr(dataset, "loader") and not isinstance(dataset.loader, CheckedLoader):
        dataset.loader = CheckedLoader(dataset.loader, rebuild)
    return dataset


#: CPython before 3.13 can fail ``ast.parse`` run from several threads at once with "SystemError:
#: AST constructor recursion depth mismatch" (CPython issue 106905); numpy parses every ``.npy``
#: header with ``ast.literal_eval``, and SpikingJelly converts events to frames in a thread pool.
PREPROCESS_THREADS_SAFE = sys.version_info >= (3, 13)


@contextlib.contextmanager
def spikingjelly_preprocessing():
    """Run SpikingJelly's dataset preparation (events to frames) safely on this Python.

    Where :data:`PREPROCESS_THREADS_SAFE` is false, SpikingJelly's
    ``configure.max_threads_number_for_datasets_preprocess`` is 1 inside the block (restored after
    it), so that its thread pool never parses ``.npy`` headers concurrently; elsewhere nothing
    changes.
    """
    if PREPROCESS_THREADS_SAFE:
        yield
        return
    from spikingjelly import configure

    saved = configure.max_threads_number_for_datasets_preprocess
    configure.max_threads_number_for_datasets_preprocess = 1
    try:
        yield
    finally:
        configure.max_threads_number_for_datasets_preprocess = saved
