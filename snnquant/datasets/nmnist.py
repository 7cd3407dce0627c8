"""Checking an N-MNIST dataset root and loading it as frames with SpikingJelly.

SpikingJelly's :class:`spikingjelly.datasets.n_mnist.NMNIST` trusts whatever it finds under its
root: a class folder that is missing shifts every later label, a zip whose md5 sum differs from the
real N-MNIST one is deleted, and an interrupted preparation leaves a ``*.building`` marker that makes
every later load fail. :func:`load_nmnist_frames` checks the root first and says what is wrong.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Union

from .checked import (LOAD_ERRORS, CorruptDatasetFileError, find_unreadable_npz,
                      spikingjelly_preprocessing, wrap_dataset_loader)
from .._paths import user_cache_home
from .nmnist_format import EVENT_BYTES

__all__ = [
    "NMNIST_URL",
    "NMNIST_CLASSES",
    "NMNIST_LAYOUTS",
    "DatasetRootError",
    "check_nmnist_root",
    "prepare_nmnist_root",
    "convert_extracted",
    "load_nmnist_frames",
]

NMNIST_URL = "https://www.garrickorchard.com/datasets/n-mnist"
"""Where the N-MNIST recordings (``Train.zip``, ``Test.zip``) are published."""

NMNIST_CLASSES = tuple(str(c) for c in range(10))
"""The class folder names, ``'0'`` .. ``'9'``; SpikingJelly's labels are their sorted positions."""

_SPLITS = {"events_np": ("train", "test"), "extract": ("Train", "Test"), "extracted": ("Train", "Test")}
_EXTENSIONS = {"events_np": (".npz", ".npy"), "extract": (".bin",), "extracted": (".bin",)}

PathLike = Union[str, "os.PathLike[str]"]


class DatasetRootError(FileNotFoundError):
    """A dataset root that cannot be loaded as it is: missing or empty class folders, missing
    downloads, a download whose checksum is wrong, or an unfinished preparation.

    The message names every file or folder concerned and what to do; nothing is deleted.
    """


def _download_instructions(root: Path) -> str:
    return (
        f"Download Train.zip and Test.zip from {NMNIST_URL} and put them in {root / 'download'} "
        f"(that is, {root / 'download' / 'Train.zip'} and {root / 'download' / 'Test.zip'}); "
        "SpikingJelly extracts and converts them on the first load. Or call "
        "snnquant.datasets.make_digits_nmnist() for the built-in dataset in the same format."
    )


NMNIST_LAYOUTS = (
    "events_np/{train,test}/<0..9>/*.npz (SpikingJelly's converted events)",
    "download/Train.zip + download/Test.zip (SpikingJelly's layout of N-MNIST's zips)",
    "download/train.zip + download/test.zip (tonic's lowercase names, same files)",
    "extract/{Train,Test}/<0..9>/*.bin (SpikingJelly's extracted zips)",
    "Train/<0..9>/*.bin + Test/<0..9>/*.bin (the zips extracted into the root)",
)
"""The N-MNIST root layouts :func:`check_nmnist_root` accepts, in the order it looks for them."""


def check_nmnist_root(root: PathLike) -> str:
    r"""Check that ``root`` can be loaded as N-MNIST with the right labels; say which layout it has.

    Accepted, in this order (:data:`NMNIST_LAYOUTS`):

    1. ``<root>/events_np/{train,test}/<0..9>/`` with at least one ``.npz``/``.npy`` file in each
       of the ten class folders and no other folder (SpikingJelly loads such a root at once and
       never looks at ``download/``); result ``'events_np'``;
    2. ``<root>/download/Train.zip`` and ``Test.zip`` with the md5 sums of the real N-MNIST files
       (checked here, so that SpikingJelly never deletes a differing zip); result ``'download'``;
    3. ``<root>/download/train.zip`` and ``test.zip``, tonic's names for the same two files (same
       md5 sums); result ``'tonic'`` (:func:`prepare_nmnist_root` extracts them to ``extract/``);
    4. ``<root>/extract/{Train,Test}/<0..9>/*.bin`` complete, every file a whole number of 5-byte
       events; result ``'extract'`` (:func:`prepare_nmnist_root` converts it with SpikingJelly's
       ``NMNIST.create_raw_from_extracted``);
    5. ``<root>/Train/<0..9>/*.bin`` and ``<root>/Test/<0..9>/*.bin``: the zips extracted straight
       into the root; result ``'extracted'`` (converted like ``'extract'``).

    A class folder that is missing matters because SpikingJelly numbers the classes by the sorted
    folder names: without ``'3'``, the digit 4 would silently get label 3.

    Args:
        root: the dataset root.

    Returns:
        which form was found: ``'events_np'``, ``'download'``, ``'tonic'``, ``'extract'`` or
        ``'extracted'``.

    Raises:
        DatasetRootError: the root is none of these. The message is one line: for a root that
            starts one layout but is incomplete, every missing or empty class folder, extra
            folder, missing or corrupt download, or unfinished-preparation marker; for a root
            that fits none, every layout looked for and what the root holds; and what to
            download from where.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetRootError(f"N-MNIST root {str(root)!r} is not a directory. " + _download_instructions(root))
    marker = root / "events_np.building"
    if marker.exists():
        raise DatasetRootError(unfinished_marker_message(
            marker, f"SpikingJelly preparation of {root}", [root / "events_np", root / "extract"]))
    if (root / "events_np").exists():
        problems = _class_folder_problems(root, "events_np")
        if problems:
            raise DatasetRootError(
                f"N-MNIST root {root} cannot be loaded with the right labels: " + "; ".join(problems)
                + ". Delete events_np/ to have it rebuilt from download/ or extract/ (nothing was deleted)."
            )
        return "events_np"
    download = root / "download"
    for names, form in ((("Train.zip", "Test.zip"), "download"), (("train.zip", "test.zip"), "tonic")):
        zips = [download / name for name in names]
        present = [z for z in zips if z.is_file()]
        if present:
            missing = [z for z in zips if not z.is_file()]
            if missing:
                raise DatasetRootError(
                    "missing " + ", ".join(map(str, missing)) + " (found " + ", ".join(map(str, present))
                    + "). " + _download_instructions(root)
                )
            _check_download_md5(zips)
            return form
    if (root / "extract").exists():
        problems = _class_folder_problems(root, "extract")
        if problems:
            raise DatasetRootError(
                f"N-MNIST root {root} has no events_np/ and no download/, and its extract/ is incomplete: "
                + "; ".join(problems) + ". " + _download_instructions(root)
            )
        _check_bin_sizes(root / "extract")
        return "extract"
    if (root / "Train").exists() or (root / "Test").exists():
        problems = _class_folder_problems(root, "extracted")
        if problems:
            raise DatasetRootError(
                f"N-MNIST root {root} holds extracted recordings but they are incomplete: "
                + "; ".join(problems) + ". " + _download_instructions(root)
            )
        _check_bin_sizes(root)
        return "extracted"
    raise DatasetRootError(
        f"N-MNIST root {root} fits none of the accepted layouts. Looked for: "
        + "; ".join(f"({i}) {layout}" for i, layout in enumerate(NMNIST_LAYOUTS, 1))
        + f". Found: {_describe_folder(root)}. " + _download_instructions(root)
    )


def prepare_nmnist_root(root: PathLike) -> str:
    """Check ``root`` and bring it to the layout SpikingJelly loads at once (``events_np/``).

    ``'tonic'`` roots have their zips extracted to ``<root>/extract/`` (a temporary folder renamed
    when complete); ``'extract'`` and ``'extracted'`` roots are converted by
    :func:`convert_extracted`. ``'events_np'`` and ``'download'`` roots are left to SpikingJelly.
    :func:`load_nmnist_frames` runs it under :func:`build_lock`, so processes that load the same
    root wait for each other; call it yourself inside ``with build_lock(root):``.

    Args:
        root: the dataset root.

    Returns:
        the layout :func:`check_nmnist_root` found before the preparation.
    """
    root = Path(root)
    form = check_nmnist_root(root)
    if form == "tonic":
        _extract_zips(root, [root / "download" / "train.zip", root / "download" / "test.zip"])
        convert_extracted(root)
    elif form == "extract":
        convert_extracted(root)
    elif form == "extracted":
        convert_extracted(root, extract_dir=root)
    return form


def load_nmnist_frames(
    root: PathLike,
    train: bool,
    frames_number: int,
    split_by: str = "number",
    *,
    transform: Optional[Callable] = None,
    target_transform: Optional[Callable] = None,
):
    r"""Load an N-MNIST root (real or built-in) as SpikingJelly frames, after checking it.

    Each sample's events :math:`(x_i, y_i, p_i, t_i)_{i<N}` become ``frames_number`` frames
    :math:`F \in \mathbb{N}^{T \times 2 \times 34 \times 34}` (SpikingJelly's integration): with
    ``split_by='number'`` frame :math:`j` counts events :math:`j \lfloor N/T \rfloor` to
    :math:`(j+1) \lfloor N/T \rfloor - 1` (the last frame takes the rest),

    .. math::

        F_j[p, y, x] = \#\{\, i \in \text{segment } j : p_i = p,\ y_i = y,\ x_i = x \,\}

    and with ``split_by='time'`` the segments are equal time spans instead.

    The root is checked with :func:`check_nmnist_root` first. A root that has only ``extract/``
    is converted with SpikingJelly's ``NMNIST.create_raw_from_extracted`` into a temporary folder
    renamed to ``events_np/`` when complete. The first load with a given ``frames_number`` and
    ``split_by`` writes ``<root>/frames_number_<T>_split_by_<split_by>/`` (SpikingJelly's cache);
    a leftover ``.building`` marker of an interrupted run is reported, not removed. Processes that
    load the same root at once (DistributedDataParallel ranks, parallel runs) wait for each other
    under :func:`build_lock` while one of them prepares it.

    Args:
        root: the dataset root, e.g. the result of :func:`make_digits_nmnist`, or a folder with
            ``download/Train.zip`` and ``download/Test.zip`` from N-MNIST's site.
        train: ``True`` for the training split, ``False`` for the test split.
        frames_number: :math:`T`, number of frames per sample, >= 1.
        split_by: ``'number'`` (equal event counts) or ``'time'`` (equal durations).
        transform: applied to each sample's frames (numpy ``float32`` array ``[T, 2, 34, 34]``).
        target_transform: applied to each label.

    Returns:
        ``spikingjelly.datasets.n_mnist.NMNIST`` with ``data_type='frame'``; its items are
        ``(frames, label)`` and its ``classes`` are ``'0'`` .. ``'9'``.

    Raises:
        DatasetRootError: see :func:`check_nmnist_root`; also a leftover frames ``.building``
            marker, or a frames folder that does not hold one file per sample.
        TypeError, ValueError: a bad ``train``, ``frames_number`` or ``split_by``.
    """
    if not isinstance(train, bool):
        raise TypeError(f"train must be True or False, got {train!r}")
    if isinstance(frames_number, bool) or not isinstance(frames_number, int):
        raise TypeError(f"frames_number must be an int, got {frames_number!r}")
    if frames_number < 1:
        raise ValueError(f"frames_number must be >= 1, got {frames_number!r}")
    if split_by not in ("number", "time"):
        raise ValueError(f"split_by must be 'number' or 'time', got {split_by!r}")
    root = Path(root)
    from spikingjelly.datasets.n_mnist import NMNIST

    with build_lock(root):
        prepare_nmnist_root(root)
        frames_dir = frames_cache_dir(root, frames_number, split_by)
        try:
            with spikingjelly_preprocessing():
                dataset = NMNIST(
                    root=str(root),
                    train=train,
                    data_type="frame",
                    frames_number=frames_number,
                    split_by=split_by,
                    transform=transform,
                    target_transform=target_transform,
                )
        except LOAD_ERRORS as error:
            raise_corrupt_cache(root, frames_dir, error)
            raise
    wrap_dataset_loader(dataset, f"delete it (or all of {frames_dir}) to have the frames rebuilt from {root / 'events_np'}")
    split = "train" if train else "test"
    if tuple(dataset.classes) != NMNIST_CLASSES:
        raise DatasetRootError(
            f"{frames_dir / split} has class folders {dataset.classes}, expected {list(NMNIST_CLASSES)}; "
            f"delete {frames_dir} to have it rebuilt (nothing was deleted)"
        )
    expected = _count_files(root / "events_np" / split, (".npz", ".npy"))
    if len(dataset) != expected:
        raise DatasetRootError(
            f"{frames_dir / split} holds {len(dataset)} samples but {root / 'events_np' / split} holds "
            f"{expected}; delete {frames_dir} to have it rebuilt (nothing was deleted)"
        )
    return dataset


def convert_extracted(root: PathLike, extract_dir: Optional[PathLike] = None) -> Path:
    """Convert ``<root>/extract/`` (or ``extract_dir``) to ``<root>/events_np/`` with SpikingJelly, atomically.

    Every ``.bin`` file is read first with :func:`read_nmnist_bin` (34 x 34 sensor, time order),
    so a corrupt file is reported by name and byte offset before SpikingJelly sees it. Then runs
    ``NMNIST.create_raw_from_extracted(<root>/extract, <tmp>)`` into a temporary folder next
    to ``events_np/`` and renames it to ``events_np/`` only when complete, so an interrupted run
    never leaves a folder that SpikingJelly would later load. When another process finished first,
    its result is kept and ours discarded.

    Args:
        root: a root with complete ``extract/Train`` and ``extract/Test`` folders.
        extract_dir: the folder that holds ``Train/`` and ``Test/`` instead of ``<root>/extract``
            (the root itself for the ``'extracted'`` layout).

    Returns:
        the path of ``events_np/``.
    """
    from spikingjelly.datasets.n_mnist import NMNIST

    from .nmnist_format import read_nmnist_bin

    root = Path(root)
    extract = root / "extract" if extract_dir is None else Path(extract_dir)
    for split in ("Train", "Test"):
        for path in sorted((extract / split).rglob("*.bin")):
            read_nmnist_bin(path, sensor_size=(34, 34))  # raises CorruptEventFileError(path, offset)
    target = root / "events_np"
    tmp = root / f".events_np.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        NMNIST.create_raw_from_extracted(extract, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp)  # another process converted the same root first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _class_folder_problems(root: Path, kind: str) -> List[str]:
    problems = []
    for split in _SPLITS[kind]:
        split_dir = root / split if kind == "extracted" else root / kind / split
        if not split_dir.is_dir():
            problems.append(f"{split_dir} is missing")
            continue
        folders = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
        missing = [c for c in NMNIST_CLASSES if c not in folders]
        extra = [f for f in folders if f not in NMNIST_CLASSES]
        empty = [
            c for c in NMNIST_CLASSES if c in folders and not _has_file(split_dir / c, _EXTENSIONS[kind])
        ]
        if missing:
            problems.append(f"{split_dir} lacks the class folder(s) {', '.join(missing)}")
        if empty:
            exts = "/".join(_EXTENSIONS[kind])
            problems.append(f"{split_dir} has empty class folder(s) {', '.join(empty)} (no {exts} files)")
        if extra:
            problems.append(f"{split_dir} has folder(s) {', '.join(extra)} that are not classes 0..9 (they would shift the labels)")
    return problems


def _has_file(folder: Path, extensions: Sequence[str]) -> bool:
    return any(e.is_file() and e.name.endswith(tuple(extensions)) for e in os.scandir(folder))


def _count_files(split_dir: Path, extensions: Sequence[str]) -> int:
    count = 0
    for class_dir in os.scandir(split_dir):
        if class_dir.is_dir():
            count += sum(1 for e in os.scandir(class_dir) if e.is_file() and e.name.endswith(tuple(extensions)))
    return count


def _check_download_md5(zips: Sequence[Path]) -> None:
    from spikingjelly.datasets.n_mnist import NMNIST

    expected = {name: md5 for name, _, md5 in NMNIST.resource_url_md5()}
    expected.update({name.lower(): md5 for name, md5 in list(expected.items())})  # tonic's names
    for path in zips:
        digest = hashlib.md5()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != expected[path.name]:
            raise DatasetRootError(
                f"{path} has md5 {digest.hexdigest()}, but N-MNIST's {path.name} has {expected[path.name]}: "
                f"the download is incomplete or not the N-MNIST file (SpikingJelly would delete it; "
                f"nothing was deleted). Download it again from {NMNIST_URL}."
            )


def _check_bin_sizes(extract: Path) -> None:
    from .nmnist_format import CorruptEventFileError

    for split in _SPLITS["extract"]:
        for class_dir in sorted(p for p in (extract / split).iterdir() if p.is_dir()):
            for entry in os.scandir(class_dir):
                if entry.name.endswith(".bin"):
                    size = entry.stat().st_size
                    if size % EVENT_BYTES:
                        raise CorruptEventFileError(
                            entry.path,
                            size - size % EVENT_BYTES,
                            f"truncated: {size} bytes is not a multiple of {EVENT_BYTES}",
                        )


def _describe_folder(root: Path, limit: int = 12) -> str:
    entries = sorted(os.scandir(root), key=lambda e: e.name)
    if not entries:
        return "an empty folder"
    names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    download = root / "download"
    if download.is_dir():
        inside = sorted(e.name for e in os.scandir(download))
        names[names.index("download/")] = "download/ (" + (", ".join(inside[:limit]) or "empty") + ")"
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _extract_zips(root: Path, zips: Sequence[Path]) -> Path:
    """Extract the zips into a temporary folder renamed to ``<root>/extract`` when complete."""
    import zipfile

    target = root / "extract"
    tmp = root / f".extract.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        for path in zips:
            try:
                with zipfile.ZipFile(path) as archive:
                    archive.extractall(tmp)
            except (zipfile.BadZipFile, EOFError, OSError) as error:
                raise DatasetRootError(f"cannot extract {path} ({error}); download it again from {NMNIST_URL}") from None
        missing = [str(tmp / split) for split in ("Train", "Test") if not (tmp / split).is_dir()]
        if missing:
            raise DatasetRootError(
                f"{', '.join(map(str, zips))} did not extract to Train/ and Test/ folders; download them again from {NMNIST_URL}"
            )
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp)  # another process extracted the same root first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def unfinished_marker_message(marker: Path, what: str, delete: Sequence[Path]) -> str:
    """The message for a SpikingJelly ``.building`` marker found at ``marker``: ``what`` is either
    under way in another process or was interrupted, which the marker alone cannot tell; the
    marker's age is given so the user can, and ``delete`` (with the marker) is what to delete in
    the second case. Nothing is deleted here."""
    try:
        age = max(0.0, time.time() - marker.stat().st_mtime)
        when = f"last modified {age:.0f} s ago" if age < 120 else \
            f"last modified {age / 60:.0f} min ago" if age < 7200 else \
            f"last modified {age / 3600:.0f} h ago"
    except OSError:  # removed meanwhile: the other process has just finished
        when = "removed while this message was written"
    paths = " and ".join(str(p) for p in delete)
    return (f"found {marker} ({when}): a {what} is under way in another process, or an earlier one "
            f"did not finish; SpikingJelly refuses to load while the marker exists. If another process "
            f"is building it, wait until the marker is gone and load again; if no process is, delete "
            f"{paths} (those that exist) and the marker, then load again. Nothing was deleted.")


def default_data_dir() -> Path:
    """The cache folder: ``$SNNQUANT_DATA`` when set and not empty, else
    ``$XDG_CACHE_HOME/snnquant`` (``~/.cache/snnquant`` without it), as the kernel cache."""
    value = os.environ.get("SNNQUANT_DATA", "")
    return Path(value).expanduser() if value else user_cache_home() / "snnquant"


@contextlib.contextmanager
def build_lock(root: PathLike):
    """Let one process at a time prepare and load ``root``; the others wait for it.

    SpikingJelly builds a root's ``events_np/`` and frames folders in place behind a ``.building``
    marker and refuses to load while a marker exists, so two processes that load a root not yet
    built (two benchmarks started at once, a second training run) would make one of them fail.
    Inside this block no other snnquant process is preparing ``root``: a marker found there was
    left by an interrupted build or by another program. The lock is a file in
    ``<data cache>/locks/`` (:func:`snnquant.datasets.default_data_dir`), named by a hash of the
    resolved root, so read-only roots are locked too; where that folder cannot be created, the
    block runs without a lock. The lock is not reentrant: inside the block, do not call the
    functions that take it (:func:`load_nmnist_frames`, :func:`snnquant.datasets.make_digits_nmnist`,
    :func:`snnquant.datasets.load_neuromorphic_frames`) for the same root.

    Args:
        root: the dataset root.
    """
    from .._filelock import file_lock

    resolved = str(Path(root).expanduser().resolve())
    locks = default_data_dir() / "locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield
        return
    path = locks / (hashlib.sha256(resolved.encode()).hexdigest()[:24] + ".lock")
    with file_lock(path, waiting=f"snnquant: waiting for another process that is preparing or loading "
                                 f"{resolved} (lock {path})"):
        yield


def frames_cache_dir(root: Path, frames_number: int, split_by: str) -> Path:
    """SpikingJelly's frames folder under ``root``; raises DatasetRootError when a frame
    integration's ``.building`` marker is there (under way elsewhere, or interrupted; nothing is
    deleted)."""
    frames_dir = root / f"frames_number_{frames_number}_split_by_{split_by}"
    frames_marker = frames_dir.with_name(frames_dir.name + ".building")
    if frames_marker.exists():
        raise DatasetRootError(unfinished_marker_message(
            frames_marker, "SpikingJelly frame integration", [frames_dir]))
    return frames_dir


def raise_corrupt_cache(root: Path, frames_dir: Path, error: BaseException, raw_dir: str = "events_np") -> None:
    """After SpikingJelly failed to read its cache: raise a :class:`CorruptDatasetFileError` naming
    the first unreadable file under ``<root>/<raw_dir>`` or ``frames_dir``; return if none is found."""
    raw = root / raw_dir
    bad = find_unreadable_npz([raw, frames_dir])
    if bad is None:
        return
    marker = frames_dir.with_name(frames_dir.name + ".building")
    if raw in bad.parents:
        rebuild = (
            f"delete {raw}, {frames_dir} and {marker} (those that exist) to have them rebuilt from "
            f"{root / 'download'} or the extracted recordings"
        )
    else:
        rebuild = f"delete {frames_dir} (and {marker} if it exists) to have the frames rebuilt from {raw}"
    raise CorruptDatasetFileError(bad, f"{type(error).__name__}: {error}", rebuild) from error
