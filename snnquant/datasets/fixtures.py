r"""Tiny DVS128 Gesture, CIFAR10-DVS and SHD roots written in each dataset's ORIGINAL file format.

The real recordings cannot be downloaded everywhere (DVS128 Gesture not at all without a login),
so tests and quick trials use these: synthetic recordings, a few per class, written byte for byte
as the published files are, in the ``extract/`` layout SpikingJelly's classes convert from.

Recipe (deterministic for a ``seed``; every sample gets its own generator
``numpy.random.default_rng([seed, dataset, split, class, index])``):

* **DVS events** (DVS128 Gesture, CIFAR10-DVS; 128 x 128 sensor): a bright square of side 12 px
  moves along a straight line through the sensor's centre, at angle
  :math:`\varphi_c = \pi c / C` for class :math:`c` of :math:`C`, for ``duration_us``; ON events on
  its leading edge, OFF events on its trailing edge; plus 5 % uniformly random noise events. Each
  sample has ``events_per_sample`` events, sorted by time; a random start offset and speed jitter
  make the samples of a class differ.
* **SHD spikes** (700 input channels): class :math:`c` fires a chirp that sweeps the units
  :math:`35 c \ldots 35 c + 34` upwards over 0.1-0.9 s, plus a few random spikes.

Formats written:

* DVS128 Gesture: ``extract/DvsGesture/<user>_<lighting>.aedat`` in AEDAT 3.1 (a text header up to
  ``#!END-HEADER``, then packets with a 28-byte header and 8-byte polarity events, plus one
  special-event packet that readers must skip), ``<user>_<lighting>_labels.csv``
  (``class,startTime_usec,endTime_usec``, classes 1..11) and ``trials_to_train.txt`` /
  ``trials_to_test.txt``. Each recording holds one gesture of each of the 11 classes in turn.
* CIFAR10-DVS: ``extract/<class>/cifar10_<class>_<i>.aedat`` in AEDAT 2.0 (jAER's DVS128 format:
  header lines, then big-endian 32-bit address and 32-bit timestamp pairs; address bits 1-7 the
  sensor column, 8-14 the row, bit 0 the polarity; SpikingJelly reads them with the published
  recordings' orientation ``x = 127 - row``, ``y = 127 - column``, ``p = 1 - bit 0``).
* SHD: ``extract/shd_{train,test}.h5`` with ``spikes/times`` (variable-length float32 seconds),
  ``spikes/units`` (variable-length uint16), ``labels`` (uint16), ``extra/speaker`` and
  ``extra/keys``.

Each ``write_*_fixture`` returns the events it wrote, keyed as SpikingJelly names the sample, so a
test can compare SpikingJelly's reading with them.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from .._io import atomic_write

__all__ = [
    "write_aedat31",
    "write_aedat2_dvs128",
    "write_dvs128_gesture_fixture",
    "write_cifar10_dvs_fixture",
    "write_shd_fixture",
]

_DATASET_KEYS = {"dvs128_gesture": 1, "cifar10_dvs": 2, "shd": 3}


def _moving_square(rng, label: int, n_classes: int, events: int, duration_us: int) -> Dict[str, np.ndarray]:
    angle = np.pi * label / n_classes
    direction = np.array([np.cos(angle), np.sin(angle)])
    normal = np.array([-direction[1], direction[0]])
    n_noise = events // 20
    n_edge = events - n_noise
    t = np.sort(rng.integers(0, duration_us, size=n_edge))
    speed = 80.0 * (1.0 + 0.2 * rng.uniform(-1, 1))
    progress = (t / duration_us - 0.5) * speed + rng.uniform(-4, 4)
    on = rng.random(n_edge) < 0.5
    along = progress + np.where(on, 6.0, -6.0)  # leading edge ON, trailing edge OFF
    across = rng.uniform(-6.0, 6.0, size=n_edge)
    xy = 64.0 + along[:, None] * direction + across[:, None] * normal
    x = np.clip(np.rint(xy[:, 0]), 0, 127).astype(np.int64)
    y = np.clip(np.rint(xy[:, 1]), 0, 127).astype(np.int64)
    noise_t = rng.integers(0, duration_us, size=n_noise)
    x = np.concatenate([x, rng.integers(0, 128, size=n_noise)])
    y = np.concatenate([y, rng.integers(0, 128, size=n_noise)])
    p = np.concatenate([on.astype(np.int64), rng.integers(0, 2, size=n_noise)])
    t = np.concatenate([t, noise_t])
    order = np.argsort(t, kind="stable")
    return {"t": t[order].astype(np.int64), "x": x[order], "y": y[order], "p": p[order]}


def write_aedat31(path, events: Dict[str, np.ndarray], *, packet_events: int = 512) -> None:
    """Write polarity events as an AEDAT 3.1 file (the format of DVS128 Gesture's recordings).

    Header lines ``#!AER-DAT3.1``, ``#Format: RAW``, ``#Source 1: DVS128``, ``#!END-HEADER``
    (``\\r\\n`` line ends); one special-event packet (type 0, a timestamp reset); then polarity
    packets (type 1, source 1, size 8, timestamp offset 4) of at most ``packet_events`` events,
    each event the word :math:`(x \\ll 17) | (y \\ll 2) | (p \\ll 1) | 1` and the low 31 bits of its
    timestamp, the packet's ``eventTSOverflow`` holding :math:`t \\gg 31` (a packet never spans two
    overflow values).

    Args:
        path: the file to write.
        events: ``'t'`` (microseconds, non-decreasing, >= 0), ``'x'``, ``'y'`` (0..32767),
            ``'p'`` (0 or 1) arrays of one length.
        packet_events: events per polarity packet, >= 1.
    """
    t, x, y, p = (np.asarray(events[k], dtype=np.int64) for k in "txyp")
    if not (t.shape == x.shape == y.shape == p.shape) or t.ndim != 1:
        raise ValueError("events 't', 'x', 'y', 'p' must be 1-D arrays of one length")
    if t.size and (t.min() < 0 or np.any(np.diff(t) < 0)):
        raise ValueError("events 't' must be non-negative and non-decreasing")
    if t.size and (x.min() < 0 or x.max() > 0x7FFF or y.min() < 0 or y.max() > 0x7FFF or not np.isin(p, (0, 1)).all()):
        raise ValueError("events 'x', 'y' must be in 0..32767 and 'p' in {0, 1}")
    header = (b"#!AER-DAT3.1\r\n#Format: RAW\r\n#Source 1: DVS128\r\n"
              b"#Start-Time: 2017-01-01 00:00:00 (TZ+0000)\r\n#!END-HEADER\r\n")
    chunks = [header]
    special = struct.pack("<hhiiiiii", 0, 1, 8, 4, 0, 1, 1, 1) + struct.pack("<Ii", (1 << 1) | 1, 0)
    chunks.append(special)
    overflow = t >> 31
    start = 0
    while start < t.size:
        stop = min(t.size, start + packet_events)
        stop = start + int(np.searchsorted(overflow[start:stop], overflow[start], side="right"))
        n = stop - start
        words = (x[start:stop] << 17) | (y[start:stop] << 2) | (p[start:stop] << 1) | 1
        body = np.empty((n, 2), dtype="<u4")
        body[:, 0] = words.astype(np.uint32)
        body[:, 1] = (t[start:stop] & 0x7FFFFFFF).astype(np.uint32)
        chunks.append(struct.pack("<hhiiiiii", 1, 1, 8, 4, int(overflow[start]), n, n, n))
        chunks.append(body.tobytes())
        start = stop
    _write(path, b"".join(chunks))


def write_aedat2_dvs128(path, events: Dict[str, np.ndarray]) -> None:
    """Write events as jAER's AEDAT 2.0 DVS128 file in CIFAR10-DVS's orientation.

    Each event is a big-endian 32-bit address :math:`(r \\ll 8) | (c \\ll 1) | b` and a big-endian
    32-bit timestamp, where the sensor row :math:`r = 127 - x`, column :math:`c = 127 - y` and
    bit :math:`b = 1 - p`, the inverse of the orientation SpikingJelly's CIFAR10-DVS reader applies.

    Args:
        path: the file to write.
        events: ``'t'`` (microseconds, 0 .. 2^32 - 1), ``'x'``, ``'y'`` (0..127), ``'p'`` (0 or 1).
    """
    t, x, y, p = (np.asarray(events[k], dtype=np.int64) for k in "txyp")
    if t.size and (x.min() < 0 or x.max() > 127 or y.min() < 0 or y.max() > 127 or t.min() < 0 or t.max() >= 2**32):
        raise ValueError("events must have x, y in 0..127 and t in 0 .. 2^32 - 1")
    address = ((127 - x) << 8) | ((127 - y) << 1) | (1 - p)
    body = np.empty((t.size, 2), dtype=">u4")
    body[:, 0] = address
    body[:, 1] = t
    header = (b"#!AER-DAT2.0\r\n# This is a raw AE data file - do not edit\r\n"
              b"# Data format is int32 address, int32 timestamp (8 bytes total), repeated for each event\r\n"
              b"# Timestamps tick is 1 us\r\n# created by snnquant.datasets.fixtures (synthetic)\r\n")
    _write(path, header + body.tobytes())


def write_dvs128_gesture_fixture(
    root, *, train_recordings: int = 2, test_recordings: int = 1, events_per_sample: int = 300,
    duration_us: int = 200_000, seed: int = 0,
) -> Dict[Tuple[str, int, str], Dict[str, np.ndarray]]:
    """Write a DVS128 Gesture root: ``<root>/extract/DvsGesture/`` in the published format.

    ``train_recordings`` + ``test_recordings`` recordings (users ``user01`` .., lighting
    ``fluorescent``), each with one gesture of each class 1..11 in turn, ``duration_us`` apart
    with a 50 ms gap, listed in ``trials_to_train.txt`` / ``trials_to_test.txt``.

    Returns:
        ``{(split, label, sample_name): events}`` with SpikingJelly's names: label 0..10 (the
        CSV class minus 1), sample ``<user>_<lighting>_0`` (the first sample of that label in that
        recording), split ``'train'`` or ``'test'``.
    """
    folder = Path(root) / "extract" / "DvsGesture"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    lists = {"train": [], "test": []}
    splits = ["train"] * train_recordings + ["test"] * test_recordings
    for r, split in enumerate(splits):
        name = f"user{r + 1:02d}_fluorescent"
        parts, rows, start = [], [], 1_000_000
        for c in range(11):
            rng = np.random.default_rng([seed, 1, r, c])
            ev = _moving_square(rng, c, 11, events_per_sample, duration_us)
            ev["t"] = ev["t"] + start
            parts.append(ev)
            rows.append((c + 1, start, start + duration_us))
            written[(split, c, f"{name}_0")] = ev
            start += duration_us + 50_000
        events = {k: np.concatenate([e[k] for e in parts]) for k in "txyp"}
        write_aedat31(folder / f"{name}.aedat", events)
        csv = "class,startTime_usec,endTime_usec\n" + "".join(f"{c},{a},{b}\n" for c, a, b in rows)
        _write(folder / f"{name}_labels.csv", csv.encode())
        lists[split].append(f"{name}.aedat")
    _write(folder / "trials_to_train.txt", ("\n".join(lists["train"]) + "\n").encode())
    _write(folder / "trials_to_test.txt", ("\n".join(lists["test"]) + "\n").encode())
    return written


def write_cifar10_dvs_fixture(
    root, *, samples_per_class: int = 3, events_per_sample: int = 300, duration_us: int = 300_000, seed: int = 0,
) -> Dict[Tuple[str, str], Dict[str, np.ndarray]]:
    """Write a CIFAR10-DVS root: ``<root>/extract/<class>/cifar10_<class>_<i>.aedat`` (AEDAT 2.0).

    Returns:
        ``{(class_name, sample_name): events}``, ``sample_name`` being ``cifar10_<class>_<i>``.
    """
    from .neuromorphic import CIFAR10_DVS_CLASSES

    written = {}
    for c, class_name in enumerate(CIFAR10_DVS_CLASSES):
        folder = Path(root) / "extract" / class_name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(samples_per_class):
            rng = np.random.default_rng([seed, 2, 0, c, i])
            ev = _moving_square(rng, c, 10, events_per_sample, duration_us)
            write_aedat2_dvs128(folder / f"cifar10_{class_name}_{i}.aedat", ev)
            written[(class_name, f"cifar10_{class_name}_{i}")] = ev
    return written


def write_shd_fixture(
    root, *, train_per_class: int = 2, test_per_class: int = 1, spikes_per_sample: int = 200, seed: int = 0,
) -> Dict[str, List[Tuple[int, Dict[str, np.ndarray]]]]:
    """Write an SHD root: ``<root>/extract/shd_train.h5`` and ``shd_test.h5`` in the published layout.

    Samples are stored class by class (0..19), ``train_per_class`` / ``test_per_class`` of each.

    Returns:
        ``{'train': [(label, {'t': seconds, 'x': units}), ...], 'test': [...]}`` in file order.
    """
    import h5py

    written = {}
    for split, per_class in (("train", train_per_class), ("test", test_per_class)):
        samples = []
        for c in range(20):
            for i in range(per_class):
                rng = np.random.default_rng([seed, 3, 0 if split == "train" else 1, c, i])
                n_chirp = spikes_per_sample - spikes_per_sample // 10
                times = np.sort(rng.uniform(0.1, 0.9, size=n_chirp))
                units = 35 * c + np.clip(np.rint((times - 0.1) / 0.8 * 34 + rng.normal(0, 1, n_chirp)), 0, 34)
                noise_t = rng.uniform(0.0, 1.0, size=spikes_per_sample - n_chirp)
                noise_u = rng.integers(0, 700, size=noise_t.size)
                t = np.concatenate([times, noise_t])
                u = np.concatenate([units, noise_u])
                order = np.argsort(t, kind="stable")
                samples.append((c, {"t": t[order].astype(np.float32), "x": u[order].astype(np.uint16)}))
        path = Path(root) / "extract" / f"shd_{split}.h5"
        path.parent.mkdir(parents=True, exist_ok=True)

        def write_h5(tmp, samples=samples):
            with h5py.File(tmp, "w") as f:
                spikes = f.create_group("spikes")
                times = spikes.create_dataset("times", (len(samples),), dtype=h5py.vlen_dtype(np.float32))
                units = spikes.create_dataset("units", (len(samples),), dtype=h5py.vlen_dtype(np.uint16))
                for k, (_, ev) in enumerate(samples):
                    times[k] = ev["t"]
                    units[k] = ev["x"]
                f.create_dataset("labels", data=np.array([c for c, _ in samples], dtype=np.uint16))
                extra = f.create_group("extra")
                extra.create_dataset("speaker", data=np.zeros(len(samples), dtype=np.uint16))
                extra.create_dataset("keys", data=np.array([f"digit-{c}".encode() for c in range(20)]))

        atomic_write(path, write_h5)
        written[split] = samples
    return written


def _write(path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
