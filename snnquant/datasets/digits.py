"""The built-in neuromorphic dataset: scikit-learn's handwritten digits recorded N-MNIST style.

scikit-learn ships 1797 real handwritten digits (8 x 8, 16 grey levels, UCI "optical recognition of
handwritten digits"), so this dataset needs no download. Each digit is shown to an emulated event
camera making N-MNIST's three saccades (:func:`~snnquant.datasets.saccade_events`) and written in
N-MNIST's own layout and format, so SpikingJelly's ``NMNIST`` class loads it unchanged.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np

from .nmnist import (DatasetRootError, NMNIST_CLASSES, build_lock, check_nmnist_root, convert_extracted,
                     default_data_dir)
from .._io import atomic_write
from .nmnist_format import write_nmnist_bin
from .saccades import _check_int, saccade_events

__all__ = [
    "DIGITS_NMNIST_VERSION",
    "DIGITS_NMNIST_EMULATION",
    "DIGITS_TEST_FRACTION",
    "default_data_dir",
    "digits_nmnist_split",
    "make_digits_nmnist",
]

DIGITS_NMNIST_VERSION = "3"  # 3: the same events on every CPU (no BLAS, no vectorised log/exp)
"""Version of the generator; part of the cache path and of the marker file. Bump it whenever a
change makes the generated events differ, so that no cache made by the old generator is reused."""

DIGITS_NMNIST_EMULATION = dict(
    sensor_size=(34, 34),
    image_size=20.0,
    saccade_amplitude=6.0,
    saccade_duration_us=100_000,
    time_step_us=1000,
    contrast_threshold=0.3,
    threshold_mismatch=0.1,
    refractory_us=1000,
    background=0.1,
    blur_sigma=1.0,
    noise_rate_hz=0.2,
)
"""Arguments of :func:`~snnquant.datasets.saccade_events` used for the built-in dataset: the
8 x 8 digit drawn 20 pixels wide (2.5 sensor pixels per digit pixel, the size of MNIST's 20 x 20
digit box) and blurred by 1 pixel (0.4 digit pixel) so that its blocks do not show."""

DIGITS_TEST_FRACTION = 0.2
"""Fraction of each class put in the test split."""

MARKER_NAME = "snnquant_dataset.json"
_BLOCK = 512
_DATASET_NAME = "digits-nmnist"


def digits_nmnist_split(seed: int = 0, samples_per_class: Optional[int] = None) -> Dict[str, np.ndarray]:
    r"""Indices into ``sklearn.datasets.load_digits()`` of the train and test samples.

    Stratified and deterministic for ``seed``: the indices of class :math:`c` (:math:`n_c` of them)
    are shuffled with ``numpy.random.default_rng([seed, 2, c])``; the first
    :math:`\mathrm{round}(0.2\, n_c)` go to the test split, the rest to the training split. Over
    the 1797 digits this gives 1438 training and 359 test samples (35 to 37 test samples per
    class). With ``samples_per_class = k`` each split keeps the first :math:`k` of each class in
    that shuffled order, so a small subset is a subset of the full split of the same seed.

    Args:
        seed: non-negative integer.
        samples_per_class: ``None`` for all, or :math:`k` with :math:`1 \le k \le 35`, the smallest
            per-class test count.

    Returns:
        dict with ``'train'`` and ``'test'``: sorted ``int64`` index arrays.
    """
    seed = _check_int("seed", seed, low=0)
    labels = _load_digits()[1]
    counts = np.bincount(labels, minlength=10)
    n_test = np.rint(DIGITS_TEST_FRACTION * counts).astype(np.int64)
    if samples_per_class is not None:
        samples_per_class = _check_int("samples_per_class", samples_per_class, low=1)
        if samples_per_class > n_test.min():
            raise ValueError(
                f"samples_per_class must be None or at most {int(n_test.min())} (the smallest class in "
                f"the test split), got {samples_per_class}"
            )
    train, test = [], []
    for c in range(10):
        members = np.flatnonzero(labels == c)
        order = members[np.random.default_rng([seed, 2, c]).permutation(members.size)]
        test_c, train_c = order[: n_test[c]], order[n_test[c] :]
        if samples_per_class is not None:
            test_c, train_c = test_c[:samples_per_class], train_c[:samples_per_class]
        train.append(train_c)
        test.append(test_c)
    return {"train": np.sort(np.concatenate(train)), "test": np.sort(np.concatenate(test))}


def make_digits_nmnist(
    root: Optional[Union[str, "os.PathLike[str]"]] = None,
    seed: int = 0,
    samples_per_class: Optional[int] = None,
) -> Path:
    r"""Build (once) the digits dataset in N-MNIST's format and layout; return its root.

    Every digit image :math:`D \in \{0..16\}^{8 \times 8}` from scikit-learn becomes
    :math:`D / 16` shown to :func:`~snnquant.datasets.saccade_events` with
    :data:`~snnquant.datasets.digits.DIGITS_NMNIST_EMULATION` (34 x 34 sensor, three saccades of
    100 ms, log-intensity DVS pixels with threshold :math:`\theta = 0.3`) and is written as N-MNIST
    does::

        <root>/extract/Train/<label>/<index>.bin     # 5 bytes per event, write_nmnist_bin
        <root>/extract/Test/<label>/<index>.bin
        <root>/events_np/train/<label>/<index>.npz   # SpikingJelly's own conversion
        <root>/events_np/test/<label>/<index>.npz
        <root>/snnquant_dataset.json                 # generator version, arguments, split

    where ``<index>`` is the digit's index in ``load_digits()``, five digits wide. Because
    ``events_np/`` exists, ``spikingjelly.datasets.n_mnist.NMNIST(root, train=..., data_type='frame',
    frames_number=T, split_by='number')`` loads the root at once (no ``download/`` and no zips, whose
    md5 sums would not match N-MNIST's); so does :func:`load_nmnist_frames`.

    The split is :func:`digits_nmnist_split`. The whole root is built in a temporary sibling folder
    and renamed into place when complete: an interrupted build leaves no half-built root behind.
    An existing root is reused when its marker file names the same generator version, seed and
    ``samples_per_class``; any other existing non-empty folder is refused, never overwritten.

    Args:
        root: where to build. ``None`` uses the cache,
            ``<default_data_dir()>/digits_nmnist/v<version>_seed<seed>_<all|spc<k>>``, whose name
            holds every argument and the generator version.
        seed: non-negative integer; the same seed gives the same bytes.
        samples_per_class: ``None`` for all 1797 digits, or :math:`k` (1..35) samples per class in
            each split, for quick tests.

    Returns:
        the root (:class:`pathlib.Path`).

    Raises:
        ValueError: a bad argument, or ``root`` exists and holds something else (another dataset,
            or one made with other arguments or another generator version).
        DatasetRootError: ``root`` is the matching dataset but damaged (delete it to rebuild).
    """
    seed = _check_int("seed", seed, low=0)
    split = digits_nmnist_split(seed, samples_per_class)
    identity = {
        "dataset": _DATASET_NAME,
        "generator_version": DIGITS_NMNIST_VERSION,
        "seed": seed,
        "samples_per_class": samples_per_class,
    }
    if root is None:
        subset = "all" if samples_per_class is None else f"spc{samples_per_class}"
        root = default_data_dir() / "digits_nmnist" / f"v{DIGITS_NMNIST_VERSION}_seed{seed}_{subset}"
    root = Path(root).expanduser()
    if _reusable(root, identity):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(root):  # processes asking at once: one builds, the others wait and reuse it
        if _reusable(root, identity):
            return root
        tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        tmp.mkdir()
        try:
            _build(tmp, split, seed, identity)
            try:
                os.rename(tmp, root)  # atomic; allowed onto an empty folder, refused onto a full one
            except OSError:
                if not root.is_dir() or not any(root.iterdir()):
                    raise
                shutil.rmtree(tmp)  # another program finished first: check theirs
                if not _reusable(root, identity):
                    raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return root


def _reusable(root: Path, identity: dict) -> bool:
    """True when root holds the dataset described by identity; False when root is absent or empty."""
    if not root.exists():
        return False
    if not root.is_dir():
        raise ValueError(f"root {str(root)!r} exists and is not a directory")
    if not any(root.iterdir()):
        return False
    marker = root / MARKER_NAME
    if not marker.is_file():
        raise ValueError(
            f"root {str(root)!r} is not empty and has no {MARKER_NAME}: it is not a dataset made by "
            "make_digits_nmnist; choose another root (nothing was overwritten)"
        )
    try:
        found = json.loads(marker.read_text())
        found_identity = {key: found[key] for key in identity}
    except (ValueError, KeyError, TypeError) as error:
        raise DatasetRootError(f"{marker} is unreadable ({error}); delete {root} to rebuild it") from None
    if found_identity != identity:
        raise ValueError(
            f"root {str(root)!r} holds a dataset made with {found_identity}, not {identity}; "
            "choose another root or delete this one (nothing was overwritten)"
        )
    try:
        check_nmnist_root(root)
    except DatasetRootError as error:
        raise DatasetRootError(f"{error}. Delete {root} to rebuild it.") from None
    if not (root / "extract").is_dir():
        raise DatasetRootError(f"{root / 'extract'} is missing; delete {root} to rebuild it")
    return True


def _load_digits() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target.astype(np.int64)


def _build(tmp: Path, split: Dict[str, np.ndarray], seed: int, identity: dict) -> None:
    images, labels = _load_digits()
    counts = {}
    for split_name, folder in (("train", "Train"), ("test", "Test")):
        indices = split[split_name]
        for c in NMNIST_CLASSES:
            (tmp / "extract" / folder / c).mkdir(parents=True)
        # Blocks bound the memory; the events of a digit do not depend on the blocks (keyed by index).
        for start in range(0, indices.size, _BLOCK):
            block = indices[start : start + _BLOCK]
            events = saccade_events(images[block] / 16.0, seed=seed, image_ids=block, **DIGITS_NMNIST_EMULATION)
            for index, sample in zip(block, events):
                write_nmnist_bin(tmp / "extract" / folder / str(labels[index]) / f"{index:05d}.bin", sample)
        counts[split_name] = {c: int(np.sum(labels[indices] == int(c))) for c in NMNIST_CLASSES}
    convert_extracted(tmp)
    check_nmnist_root(tmp)
    for split_name in ("train", "test"):
        for c, expected in counts[split_name].items():
            found = sum(1 for e in os.scandir(tmp / "events_np" / split_name / c) if e.name.endswith(".npz"))
            if found != expected:
                raise RuntimeError(
                    f"SpikingJelly's conversion wrote {found} files to events_np/{split_name}/{c}, expected {expected}"
                )
    marker = dict(identity)
    marker.update(
        {
            "source": "sklearn.datasets.load_digits (8x8, values 0..16)",
            "format": "N-MNIST .bin (x, y, p, 23-bit t in us); SpikingJelly events_np .npz",
            "emulation": {k: list(v) if isinstance(v, tuple) else v for k, v in DIGITS_NMNIST_EMULATION.items()},
            "test_fraction": DIGITS_TEST_FRACTION,
            "counts": counts,
            "train_indices": split["train"].tolist(),
            "test_indices": split["test"].tolist(),
        }
    )
    atomic_write(tmp / MARKER_NAME, json.dumps(marker, indent=1) + "\n")
