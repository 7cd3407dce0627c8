"""The repository's folders that some tests read (docs/, examples/, benchmarks/, .ci/).

A clone and the sdist hold them; a copy of tests/ run against an installed wheel does not, and the
tests that read them skip there, saying which folder is missing. Tests that scan snnquant's own
source never skip this way (see tests/test_architecture.py).
"""
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def needs(*names: str):
    """A ``pytest.mark.skipif`` for a test module that reads ``ROOT / name`` for each name."""
    missing = [n for n in names if not (ROOT / n).exists()]
    return pytest.mark.skipif(
        bool(missing), reason=f"{', '.join(missing)} not beside tests/ (an installed package with "
                              f"a copy of the tests): these tests read the repository's files")


def shared_recordings():
    """The shared real N-MNIST recordings (``nmnist-real-1k``: ``$SNNQUANT_SHARED_DATA``, then
    ``../shared/data`` beside the repository), or ``None`` where this machine has none."""
    import os
    for base in (os.environ.get("SNNQUANT_SHARED_DATA"), ROOT.parent / "shared" / "data",
                 "/work/shared/data"):
        if base and (pathlib.Path(base) / "nmnist-real-1k" / "Train").is_dir():
            return pathlib.Path(base) / "nmnist-real-1k"
    return None
