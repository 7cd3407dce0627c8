"""DVS128 Gesture, CIFAR10-DVS and SHD through SpikingJelly 2.0's own classes, checked first.

SpikingJelly's dataset classes trust their root: a download whose md5 differs is deleted, a dataset
that cannot be downloaded raises ``NotImplementedError``, a class with no sample shifts or breaks
the labels, an interrupted preparation leaves a ``*.building`` marker, and a truncated recording
fails inside a worker thread without its file name. The functions here check a root in
SpikingJelly's layout, prepare it atomically (extract to a temporary folder, convert with the
class's own ``create_raw_from_extracted`` into a temporary folder, rename when complete), and then
let SpikingJelly's class integrate and load the frames.

Layouts (``<root>`` is what ``--data-root`` names):

================  ===================================================  ===========================================
dataset           downloaded (md5-checked)                             extracted
================  ===================================================  ===========================================
dvs128_gesture    ``download/DvsGesture.tar.gz``                       ``extract/DvsGesture/*.aedat``, ``*_labels.csv``,
                                                                       ``trials_to_train.txt``, ``trials_to_test.txt``
cifar10_dvs       ``download/<class>.zip`` (10 zips)                   ``extract/<class>/*.aedat`` (10 class folders)
shd               ``download/shd_train.h5.zip``, ``shd_test.h5.zip``   ``extract/shd_train.h5``, ``extract/shd_test.h5``
================  ===================================================  ===========================================

A root that SpikingJelly has already prepared (``events_np/`` for the DVS datasets, ``events_h5/``
for SHD) is used as it is, after its class folders are checked.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import struct
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .checked import (LOAD_ERRORS, CorruptDatasetFileError, spikingjelly_preprocessing,
                      wrap_dataset_loader)
from .nmnist import (DatasetRootError, _describe_folder, build_lock, frames_cache_dir, raise_corrupt_cache,
                     unfinished_marker_message)

__all__ = [
    "DVS128_GESTURE_URL",
    "CIFAR10_DVS_URL",
    "SHD_URL",
    "check_neuromorphic_root",
    "prepare_neuromorphic_root",
    "load_neuromorphic_frames",
    "read_aedat31_polarity",
]

DVS128_GESTURE_URL = "https://research.ibm.com/interactive/dvsgesture/"
CIFAR10_DVS_URL = "https://figshare.com/articles/dataset/CIFAR10-DVS_New/4724671"
SHD_URL = "https://zenkelab.org/resources/spiking-heidelberg-datasets-shd/"

CIFAR10_DVS_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


class _Spec:
    def __init__(self, name, title, url, classes, raw_dir, downloads, extracted_what, needs_train_flag):
        self.name = name
        self.title = title
        self.url = url
        self.classes = classes  # folder names SpikingJelly writes
        self.raw_dir = raw_dir
        self.downloads = downloads  # the files of download/ we need (others are optional)
        self.extracted_what = extracted_what
        self.needs_train_flag = needs_train_flag

    def sj_class(self):
        if self.name == "dvs128_gesture":
            from spikingjelly.datasets.dvs128_gesture import DVS128Gesture

            return DVS128Gesture
        if self.name == "cifar10_dvs":
            from spikingjelly.datasets.cifar10_dvs import CIFAR10DVS

            return CIFAR10DVS
        from spikingjelly.datasets.shd import SpikingHeidelbergDigits

        return SpikingHeidelbergDigits


_SPECS = {
    "dvs128_gesture": _Spec(
        "dvs128_gesture", "DVS128 Gesture", DVS128_GESTURE_URL, tuple(str(c) for c in range(11)), "events_np",
        ("DvsGesture.tar.gz",),
        "extract/DvsGesture/ with trials_to_train.txt, trials_to_test.txt, <user>_<lighting>.aedat and "
        "<user>_<lighting>_labels.csv", True,
    ),
    "cifar10_dvs": _Spec(
        "cifar10_dvs", "CIFAR10-DVS", CIFAR10_DVS_URL, CIFAR10_DVS_CLASSES, "events_np",
        tuple(f"{c}.zip" for c in CIFAR10_DVS_CLASSES),
        "extract/<class>/*.aedat for the classes " + ", ".join(CIFAR10_DVS_CLASSES), False,
    ),
    "shd": _Spec(
        "shd", "SHD", SHD_URL, tuple(str(c) for c in range(20)), "events_h5",
        ("shd_train.h5.zip", "shd_test.h5.zip"), "extract/shd_train.h5 and extract/shd_test.h5", True,
    ),
}


def _spec(name: str) -> _Spec:
    if name not in _SPECS:
        raise ValueError(f"dataset must be one of {sorted(_SPECS)}, got {name!r}")
    return _SPECS[name]


def _instructions(spec: _Spec, root: Path) -> str:
    return (
        f"Download {' and '.join(spec.downloads) if len(spec.downloads) < 4 else 'the ten class zips (airplane.zip .. truck.zip)'} "
        f"from {spec.url} into {root / 'download'}, or put the extracted files in {spec.extracted_what} "
        f"(see the snnquant guide page for {spec.title})."
    )


def check_neuromorphic_root(name: str, root) -> str:
    """Check a DVS128 Gesture, CIFAR10-DVS or SHD root in SpikingJelly's layout; say which form it has.

    Accepted, in this order: SpikingJelly's prepared raw folder (``events_np/`` or, for SHD,
    ``events_h5/``) with every class present; ``download/`` holding the published archives with
    SpikingJelly's md5 sums; ``extract/`` holding the published files (see the module's table),
    each read and checked here, so that a damaged recording is named before SpikingJelly meets it.

    Args:
        name: ``'dvs128_gesture'``, ``'cifar10_dvs'`` or ``'shd'``.
        root: the dataset root.

    Returns:
        ``'raw'``, ``'download'`` or ``'extract'``.

    Raises:
        DatasetRootError: the root fits none, or an unfinished-preparation marker exists; one line
            listing what was looked for and what was found.
        CorruptDatasetFileError: an extracted recording or label file cannot be read.
    """
    spec = _spec(name)
    root = Path(root)
    if not root.is_dir():
        raise DatasetRootError(f"{spec.title} root {str(root)!r} is not a directory. " + _instructions(spec, root))
    raw = root / spec.raw_dir
    marker = raw.with_name(raw.name + ".building")
    if marker.exists():
        raise DatasetRootError(unfinished_marker_message(
            marker, f"SpikingJelly preparation of {root}", [raw]))
    if raw.exists():
        problems = _raw_problems(spec, raw)
        if problems:
            raise DatasetRootError(
                f"{spec.title} root {root} cannot be loaded with the right labels: " + "; ".join(problems)
                + f". Delete {raw} to have it rebuilt from download/ or extract/ (nothing was deleted)."
            )
        return "raw"
    download = root / "download"
    if download.is_dir() and any(download.iterdir()):
        missing = [n for n in spec.downloads if not (download / n).is_file()]
        if missing:
            raise DatasetRootError(
                f"{spec.title} root {root}: download/ lacks {', '.join(missing)} (found {_describe_folder(download)}). "
                + _instructions(spec, root)
            )
        _check_md5(spec, download)
        return "download"
    extract = root / "extract"
    if extract.is_dir():
        _check_extract(spec, extract, root)
        return "extract"
    raise DatasetRootError(
        f"{spec.title} root {root} fits none of SpikingJelly's layouts. Looked for: {spec.raw_dir}/ "
        f"(prepared by SpikingJelly); download/{', download/'.join(spec.downloads[:2])}"
        + (" ..." if len(spec.downloads) > 2 else "")
        + f" (the published archives); {spec.extracted_what}. Found: {_describe_folder(root)}. "
        + _instructions(spec, root)
    )


def prepare_neuromorphic_root(name: str, root) -> str:
    """Check ``root`` and bring it to SpikingJelly's prepared raw folder, atomically.

    ``download/`` is extracted with the class's ``extract_downloaded_files`` into a temporary
    folder renamed to ``extract/`` when complete; ``extract/`` is converted with the class's
    ``create_raw_from_extracted`` into a temporary folder renamed to ``events_np/`` (``events_h5/``
    for SHD) when complete and when every class has at least one sample in every split.
    :func:`load_neuromorphic_frames` runs it under :func:`snnquant.datasets.build_lock`, so
    processes that load the same root wait for each other; call it yourself inside
    ``with build_lock(root):``.

    Args:
        name: ``'dvs128_gesture'``, ``'cifar10_dvs'`` or ``'shd'``.
        root: the dataset root.

    Returns:
        the form :func:`check_neuromorphic_root` found before the preparation.
    """
    spec = _spec(name)
    root = Path(root).resolve()
    form = check_neuromorphic_root(name, root)
    if form == "download":
        tmp = _tmp_dir(root, "extract")
        try:
            spec.sj_class().extract_downloaded_files(root / "download", tmp)
            _rename_into_place(tmp, root / "extract")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _check_extract(spec, root / "extract", root)
        form = "download"
    if form in ("download", "extract"):
        tmp = _tmp_dir(root, spec.raw_dir)
        try:
            spec.sj_class().create_raw_from_extracted(root / "extract", tmp)
            problems = _raw_problems(spec, tmp)
            if problems:
                raise DatasetRootError(
                    f"{spec.title} root {root}: SpikingJelly's conversion of {root / 'extract'} gives "
                    + "; ".join(p.replace(str(tmp), spec.raw_dir) for p in problems)
                    + ": every class needs samples in both splits (nothing was kept)"
                )
            _rename_into_place(tmp, root / spec.raw_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return form


def load_neuromorphic_frames(name: str, root, train: bool, frames_number: int, split_by: str = "number"):
    """Load a checked, prepared root as frames with SpikingJelly's own class.

    ``frames_number`` frames per sample with SpikingJelly's integration (``split_by='number'``:
    equal event counts; ``'time'``: equal durations), cached by SpikingJelly in
    ``<root>/frames_number_<T>_split_by_<split_by>/``. DVS128 Gesture and SHD come with their own
    train/test split; CIFAR10-DVS has none, so its frames are returned whole (``train`` is then
    ignored; see :func:`snnquant.datasets.load_dataset` for the split).

    Args:
        name: ``'dvs128_gesture'``, ``'cifar10_dvs'`` or ``'shd'``.
        root: the dataset root.
        train: the training (True) or test (False) split.
        frames_number: :math:`T \\ge 1`.
        split_by: ``'number'`` or ``'time'``.

    Returns:
        SpikingJelly's dataset object (``data_type='frame'``); items are ``(frames, label)`` with
        frames ``[T, 2, 128, 128]`` (DVS) or ``[T, 700]`` (SHD).

    Raises:
        DatasetRootError, CorruptDatasetFileError: see :func:`check_neuromorphic_root`; also an
            unfinished frames cache, or a corrupt cached file (named, with how to rebuild it).
    """
    spec = _spec(name)
    root = Path(root).resolve()
    kwargs = dict(data_type="frame", frames_number=frames_number, split_by=split_by)
    if spec.needs_train_flag:
        kwargs["train"] = train
    with build_lock(root):
        prepare_neuromorphic_root(name, root)
        frames_dir = frames_cache_dir(root, frames_number, split_by)
        try:
            with spikingjelly_preprocessing():
                dataset = spec.sj_class()(str(root), **kwargs)
        except LOAD_ERRORS as error:
            raise_corrupt_cache(root, frames_dir, error, raw_dir=spec.raw_dir)
            raise
    classes = tuple(sorted(dataset.classes, key=_natural))
    if classes != spec.classes:
        raise DatasetRootError(
            f"{frames_dir} has class folders {list(dataset.classes)}, expected {list(spec.classes)}; "
            f"delete {frames_dir} to have it rebuilt (nothing was deleted)"
        )
    wrap_dataset_loader(dataset, f"delete it (or all of {frames_dir}) to have the frames rebuilt from {root / spec.raw_dir}")
    return dataset


def _natural(name: str):
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _tmp_dir(root: Path, name: str) -> Path:
    tmp = root / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def _rename_into_place(tmp: Path, target: Path) -> None:
    try:
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
        shutil.rmtree(tmp)  # another process prepared the same root first


def _raw_problems(spec: _Spec, raw: Path) -> List[str]:
    if spec.name == "shd":
        problems = []
        for split in ("train", "test"):
            path = raw / f"shd_{split}.h5"
            if not path.exists():
                problems.append(f"{path} is missing")
            else:
                problems.extend(_shd_file_problems(spec, path))
        return problems
    splits = ("train", "test") if spec.needs_train_flag else (None,)
    problems = []
    for split in splits:
        split_dir = raw / split if split else raw
        if not split_dir.is_dir():
            problems.append(f"{split_dir} is missing")
            continue
        folders = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
        missing = [c for c in spec.classes if c not in folders]
        extra = [f for f in folders if f not in spec.classes and f not in ("train", "test")]
        empty = [c for c in spec.classes if c in folders and not any(
            e.is_file() and e.name.endswith((".npz", ".npy")) for e in os.scandir(split_dir / c))]
        if missing:
            problems.append(f"{split_dir} lacks the class folder(s) {', '.join(missing)}")
        if empty:
            problems.append(f"{split_dir} has no sample of class(es) {', '.join(empty)}")
        if extra:
            problems.append(f"{split_dir} has folder(s) {', '.join(extra)} that are not classes")
    return problems


def _check_md5(spec: _Spec, download: Path) -> None:
    expected = {name: md5 for name, _, md5 in spec.sj_class().resource_url_md5()}
    for name in spec.downloads:
        path = download / name
        digest = hashlib.md5()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != expected[name]:
            raise DatasetRootError(
                f"{path} has md5 {digest.hexdigest()}, but {spec.title}'s {name} has {expected[name]}: the "
                f"download is incomplete or not the published file (SpikingJelly would delete it; nothing was "
                f"deleted). Download it again from {spec.url}, or put the extracted files in {spec.extracted_what}."
            )


def _check_extract(spec: _Spec, extract: Path, root: Path) -> None:
    if spec.name == "dvs128_gesture":
        _check_dvs128_extract(spec, extract, root)
    elif spec.name == "cifar10_dvs":
        _check_cifar10_extract(spec, extract, root)
    else:
        for split in ("train", "test"):
            path = extract / f"shd_{split}.h5"
            if not path.is_file():
                raise DatasetRootError(
                    f"{spec.title} root {root}: {path} is missing (found in extract/: {_describe_folder(extract)}). "
                    + _instructions(spec, root)
                )
            problems = _shd_file_problems(spec, path)
            if problems:
                raise DatasetRootError(f"{spec.title} root {root}: " + "; ".join(problems))


def _check_dvs128_extract(spec: _Spec, extract: Path, root: Path) -> None:
    folder = extract / "DvsGesture"
    lists = [folder / "trials_to_train.txt", folder / "trials_to_test.txt"]
    missing = [str(p) for p in lists if not p.is_file()]
    if missing:
        found = _describe_folder(folder) if folder.is_dir() else _describe_folder(extract)
        raise DatasetRootError(
            f"{spec.title} root {root}: missing {', '.join(missing)} (found: {found}). " + _instructions(spec, root)
        )
    for trials in lists:
        seen = set()
        names = [line.strip() for line in trials.read_text().splitlines() if line.strip()]
        if not names:
            raise DatasetRootError(f"{trials} lists no recording")
        for name in names:
            aedat = folder / name
            csv = folder / f"{os.path.splitext(name)[0]}_labels.csv"
            for path in (aedat, csv):
                if not path.is_file():
                    raise DatasetRootError(f"{trials} lists {name}, but {path} is missing. " + _instructions(spec, root))
            read_aedat31_polarity(aedat)  # raises CorruptDatasetFileError naming the file
            try:
                rows = np.loadtxt(csv, dtype=np.int64, delimiter=",", skiprows=1, ndmin=2)
            except ValueError as error:
                raise CorruptDatasetFileError(csv, f"not 'class,startTime_usec,endTime_usec' rows: {error}",
                                              "replace it with the published file") from None
            if rows.shape[1] != 3 or rows.size == 0 or rows[:, 0].min() < 1 or rows[:, 0].max() > 11:
                raise CorruptDatasetFileError(csv, "needs rows 'class,start,end' with class in 1..11",
                                              "replace it with the published file")
            seen.update(int(c) - 1 for c in rows[:, 0])
        absent = [str(c) for c in range(11) if c not in seen]
        if absent:
            raise DatasetRootError(
                f"the recordings listed in {trials} have no sample of class(es) {', '.join(absent)} "
                f"(labels 0..10 are the CSV classes 1..11): SpikingJelly would shift or break the labels"
            )


def _check_cifar10_extract(spec: _Spec, extract: Path, root: Path) -> None:
    entries = sorted(os.scandir(extract), key=lambda e: e.name)
    names = [e.name for e in entries]
    missing = [c for c in spec.classes if c not in names]
    extra = [n for n in names if n not in spec.classes]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks the class folder(s) {', '.join(missing)}")
        if extra:
            parts.append(f"has entries {', '.join(extra)} that are not class folders (SpikingJelly converts every entry)")
        raise DatasetRootError(f"{spec.title} root {root}: {extract} " + " and ".join(parts) + ". " + _instructions(spec, root))
    for c in spec.classes:
        files = sorted(os.scandir(extract / c), key=lambda e: e.name)
        if not files:
            raise DatasetRootError(f"{spec.title} root {root}: {extract / c} holds no recording")
        for entry in files:
            if not entry.name.endswith(".aedat"):
                raise DatasetRootError(f"{entry.path} is not an .aedat recording (SpikingJelly converts every file)")
            _check_aedat2(Path(entry.path))


def _check_aedat2(path: Path) -> None:
    with open(path, "rb") as f:
        data = f.read()
    position = 0
    while data.startswith(b"#", position):
        end = data.find(b"\n", position)
        if end < 0:
            raise CorruptDatasetFileError(path, "the header never ends", "replace it with the published recording")
        position = end + 1
    if (len(data) - position) % 8:
        raise CorruptDatasetFileError(
            path, f"truncated: {len(data) - position} bytes of events is not a multiple of 8 (address, timestamp)",
            "replace it with the published recording",
        )


def read_aedat31_polarity(path) -> Dict[str, np.ndarray]:
    """Read the polarity events of an AEDAT 3.1 file (DVS128 Gesture's format), checking every packet.

    The file is text header lines starting with ``#`` up to ``#!END-HEADER\\r\\n``, then packets:
    a 28-byte little-endian header (``eventType`` int16, ``eventSource`` int16, ``eventSize``,
    ``eventTSOffset``, ``eventTSOverflow``, ``eventCapacity``, ``eventNumber``, ``eventValid``,
    int32 each) and ``eventCapacity * eventSize`` bytes of events. A polarity event (type 1,
    8 bytes) is a 32-bit word (bit 0 valid, bit 1 polarity, bits 2-16 y, bits 17-31 x) and a
    32-bit timestamp in microseconds, extended by ``eventTSOverflow << 31``; other packet types are
    skipped. The values equal those of :func:`spikingjelly.datasets.utils.load_aedat_v3`.

    Args:
        path: the ``.aedat`` file.

    Returns:
        dict of ``int64`` arrays ``'t'``, ``'x'``, ``'y'``, ``'p'``.

    Raises:
        CorruptDatasetFileError: no end of header, a truncated packet, or a polarity packet whose
            event size is not 8; the message names the file and the byte offset.
    """
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read()
    end = data.find(b"#!END-HEADER\r\n")
    if not data.startswith(b"#!AER-DAT3") or end < 0:
        raise CorruptDatasetFileError(path, "not an AEDAT 3.x file (no '#!AER-DAT3' ... '#!END-HEADER' header)",
                                      "replace it with the published recording")
    position = end + len(b"#!END-HEADER\r\n")
    parts = {k: [] for k in "txyp"}
    while position < len(data):
        if position + 28 > len(data):
            raise CorruptDatasetFileError(path, f"truncated packet header at byte offset {position}",
                                          "replace it with the published recording")
        e_type, _source, e_size, _offset, overflow, capacity, _number, _valid = struct.unpack_from("<hhiiiiii", data, position)
        position += 28
        length = capacity * e_size
        if e_size <= 0 or capacity < 0 or position + length > len(data):
            raise CorruptDatasetFileError(
                path, f"truncated packet at byte offset {position - 28} (needs {length} bytes of events)",
                "replace it with the published recording",
            )
        if e_type == 1:
            if e_size != 8:
                raise CorruptDatasetFileError(path, f"polarity packet at byte offset {position - 28} has event size {e_size}, not 8",
                                              "replace it with the published recording")
            words = np.frombuffer(data, dtype="<u4", count=2 * capacity, offset=position).reshape(-1, 2).astype(np.int64)
            parts["x"].append((words[:, 0] >> 17) & 0x7FFF)
            parts["y"].append((words[:, 0] >> 2) & 0x7FFF)
            parts["p"].append((words[:, 0] >> 1) & 1)
            parts["t"].append(words[:, 1] | (int(overflow) << 31))
        position += length
    return {k: (np.concatenate(v) if v else np.empty(0, np.int64)) for k, v in parts.items()}


def _shd_file_problems(spec: _Spec, path: Path) -> List[str]:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            times, units, labels = f["spikes"]["times"], f["spikes"]["units"], f["labels"]
            n = len(labels)
            if len(times) != n or len(units) != n:
                return [f"{path}: spikes/times, spikes/units and labels have {len(times)}, {len(units)} and {n} entries"]
            values = np.asarray(labels[:]).astype(np.int64)
            for i in range(n):
                if len(times[i]) != len(units[i]):
                    return [f"{path}: sample {i} has {len(times[i])} spike times and {len(units[i])} units"]
                if len(units[i]) and (int(np.max(units[i])) >= 700 or int(np.min(units[i])) < 0):
                    return [f"{path}: sample {i} has a unit outside 0..699"]
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise CorruptDatasetFileError(path, f"{type(error).__name__}: {error}",
                                      "replace it with the published file (spikes/times, spikes/units, labels)") from None
    bad = sorted(set(values[(values < 0) | (values >= len(spec.classes))].tolist()))
    if bad:
        return [f"{path}: labels {bad} are outside 0..{len(spec.classes) - 1}"]
    absent = [str(c) for c in range(len(spec.classes)) if c not in set(values.tolist())]
    if absent:
        return [f"{path} has no sample of class(es) {', '.join(absent)}"]
    return []
