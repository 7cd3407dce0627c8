"""Reading and writing event streams in the N-MNIST binary format (``.bin``, 5 bytes per event).

The format is the one of the N-MNIST and N-Caltech101 recordings (Orchard et al., 2015) and of
SpikingJelly's :func:`spikingjelly.datasets.utils.load_ATIS_bin`: a file is a flat sequence of
40-bit events, most significant byte first::

    byte 0   x                        (bits 39-32, pixels, 0..255)
    byte 1   y                        (bits 31-24, pixels, 0..255)
    byte 2   p << 7 | (t >> 16)       (bit 23 polarity, 1 = ON, 0 = OFF; bits 22-16 of t)
    byte 3   (t >> 8) & 255           (bits 15-8 of t)
    byte 4   t & 255                  (bits 7-0 of t, t in microseconds, 0..2**23 - 1)

There is no header: an empty file holds zero events.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Tuple, Union

import numpy as np

from .._io import atomic_write

__all__ = [
    "EVENT_BYTES",
    "MAX_TIMESTAMP_US",
    "CorruptEventFileError",
    "read_nmnist_bin",
    "write_nmnist_bin",
]

EVENT_BYTES = 5
"""Bytes per event in an N-MNIST ``.bin`` file."""

MAX_TIMESTAMP_US = 2**23 - 1
"""Largest timestamp (microseconds) the 23-bit field can hold."""

_FIELDS = ("x", "y", "p", "t")
_LIMITS = {"x": 255, "y": 255, "p": 1, "t": MAX_TIMESTAMP_US}

PathLike = Union[str, "os.PathLike[str]"]


class CorruptEventFileError(ValueError):
    """An N-MNIST ``.bin`` file that is truncated or whose content breaks the format's rules.

    The message names the file and the byte offset of the first bad event; both are also kept as
    attributes.

    Args:
        path: the file.
        offset: byte offset, from the start of the file, of the first event that is bad.
        reason: what is wrong there.
    """

    def __init__(self, path: PathLike, offset: int, reason: str):
        self.path = Path(path)
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"corrupt N-MNIST event file {str(self.path)!r} at byte offset {self.offset}: {reason}")


def read_nmnist_bin(
    path: PathLike,
    *,
    sensor_size: Optional[Tuple[int, int]] = None,
    check_time_order: bool = True,
) -> dict:
    r"""Read the events of one N-MNIST ``.bin`` file.

    With the five bytes :math:`b_0 \dots b_4` of event :math:`i` (most significant first):

    .. math::

        x_i = b_0, \qquad y_i = b_1, \qquad p_i = \lfloor b_2 / 128 \rfloor, \qquad
        t_i = (b_2 \bmod 128)\, 2^{16} + b_3\, 2^{8} + b_4 \;[\mu s]

    which is exactly what :func:`spikingjelly.datasets.utils.load_ATIS_bin` computes (the arrays
    have the same values; the dtypes differ: SpikingJelly returns ``uint32`` everywhere).

    A file is refused with :class:`CorruptEventFileError` (a :class:`ValueError`) naming the file
    and the byte offset of the first bad event when

    * its size is not a multiple of 5 bytes (truncated: the offset is that of the incomplete last
      event);
    * ``check_time_order`` is true and a timestamp is smaller than the one before it. The N-MNIST
      recordings, and every file :func:`write_nmnist_bin` writes, are sorted by time (equal
      timestamps are allowed), and a byte inserted into or dropped from the middle of a file shifts
      every later event so that its timestamps jump backwards almost at once. Pass
      ``check_time_order=False`` for other ATIS recordings that are not sorted;
    * ``sensor_size`` is given and an event lies outside it.

    The original N-MNIST reader treats ``y == 240`` as a timestamp-overflow marker; such events
    cannot occur in N-MNIST's 34 x 34 recordings (all shorter than :math:`2^{23}\,\mu s`), and
    neither this reader nor SpikingJelly's gives them a special meaning.

    Args:
        path: the ``.bin`` file.
        sensor_size: optional ``(width, height)``; when given, every ``x < width`` and
            ``y < height`` is checked (N-MNIST: ``(34, 34)``).
        check_time_order: refuse files whose timestamps go backwards (default ``True``).

    Returns:
        dict with keys ``'x'``, ``'y'``, ``'p'``, ``'t'``: 1-D ``numpy.int64`` arrays of equal length
        (x, y in pixels, p in {0, 1} with 1 = ON, t in microseconds), the same keys as SpikingJelly's
        event dicts.
    """
    path = Path(path)
    if sensor_size is not None:
        sensor_size = _check_sensor_size(sensor_size)
    raw = np.fromfile(path, dtype=np.uint8)
    extra = raw.size % EVENT_BYTES
    if extra:
        raise CorruptEventFileError(
            path,
            raw.size - extra,
            f"truncated: {raw.size} bytes is not a multiple of {EVENT_BYTES} "
            f"({extra} trailing byte(s) of an incomplete event)",
        )
    raw = raw.reshape(-1, EVENT_BYTES).astype(np.int64)
    events = {
        "x": raw[:, 0].copy(),
        "y": raw[:, 1].copy(),
        "p": raw[:, 2] >> 7,
        "t": ((raw[:, 2] & 127) << 16) | (raw[:, 3] << 8) | raw[:, 4],
    }
    if check_time_order and raw.shape[0] > 1:
        backwards = np.flatnonzero(np.diff(events["t"]) < 0)
        if backwards.size:
            i = int(backwards[0]) + 1
            raise CorruptEventFileError(
                path,
                i * EVENT_BYTES,
                f"timestamp goes backwards at event {i}: t={int(events['t'][i])} us after "
                f"t={int(events['t'][i - 1])} us (N-MNIST files are sorted by time; "
                "pass check_time_order=False for unsorted recordings)",
            )
    if sensor_size is not None:
        for field, limit in (("x", sensor_size[0]), ("y", sensor_size[1])):
            outside = np.flatnonzero(events[field] >= limit)
            if outside.size:
                i = int(outside[0])
                raise CorruptEventFileError(
                    path,
                    i * EVENT_BYTES,
                    f"event {i} has {field}={int(events[field][i])}, outside the sensor "
                    f"(width, height)={sensor_size}",
                )
    return events


def write_nmnist_bin(path: PathLike, events: Mapping) -> None:
    r"""Write events to one N-MNIST ``.bin`` file, atomically (a temporary file, synced and renamed
    over ``path``).

    Event :math:`i` becomes the five bytes

    .. math::

        b_0 = x_i, \quad b_1 = y_i, \quad b_2 = 128\, p_i + \lfloor t_i / 2^{16} \rfloor, \quad
        b_3 = \lfloor t_i / 2^{8} \rfloor \bmod 256, \quad b_4 = t_i \bmod 256

    so that :func:`read_nmnist_bin` (and SpikingJelly's ``load_ATIS_bin``) give back exactly the
    same values.

    Args:
        path: the file to write (its folder must exist); an existing file is replaced.
        events: a mapping (dict, or numpy structured array) with fields ``'x'``, ``'y'``, ``'p'``,
            ``'t'``: 1-D integer arrays of one length (``p`` may also be boolean). Each value must
            fit its field: ``0 <= x, y <= 255``, ``p`` in {0, 1}, ``0 <= t <= 2**23 - 1``
            microseconds, and ``t`` must not decrease (N-MNIST files are sorted by time).

    Raises:
        TypeError: a field is missing or not an integer array.
        ValueError: the fields' shapes differ, or a value cannot be represented; the message names
            the field, the event index and the value.
    """
    arrays = _validated_fields(events)
    packed = np.empty((arrays["t"].size, EVENT_BYTES), dtype=np.uint8)
    t = arrays["t"]
    packed[:, 0] = arrays["x"]
    packed[:, 1] = arrays["y"]
    packed[:, 2] = (arrays["p"] << 7) | (t >> 16)
    packed[:, 3] = (t >> 8) & 255
    packed[:, 4] = t & 255
    atomic_write(path, packed.tobytes())


def _validated_fields(events: Mapping) -> dict:
    arrays = {}
    for field in _FIELDS:
        try:
            value = events[field]
        except (KeyError, ValueError, IndexError, TypeError):
            raise TypeError(
                f"events must have the fields 'x', 'y', 'p', 't'; field {field!r} is missing"
            ) from None
        value = np.asarray(value)
        if value.dtype == np.bool_ and field == "p":
            value = value.astype(np.int64)
        if not np.issubdtype(value.dtype, np.integer):
            raise TypeError(
                f"events[{field!r}] must be an integer array, got dtype {value.dtype}"
            )
        if value.ndim != 1:
            raise ValueError(f"events[{field!r}] must be 1-D, got shape {value.shape}")
        arrays[field] = value
    lengths = {field: arrays[field].size for field in _FIELDS}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"events' fields must have one length, got lengths {lengths}")
    for field in _FIELDS:
        value = arrays[field]
        bad = np.flatnonzero((value < 0) | (value > _LIMITS[field]))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"events[{field!r}][{i}] = {int(value[i])} cannot be written to an N-MNIST file: "
                f"{field} must be in 0..{_LIMITS[field]}"
            )
        arrays[field] = value.astype(np.int64)
    if arrays["t"].size > 1:
        backwards = np.flatnonzero(np.diff(arrays["t"]) < 0)
        if backwards.size:
            i = int(backwards[0]) + 1
            raise ValueError(
                f"events['t'][{i}] = {int(arrays['t'][i])} is smaller than events['t'][{i - 1}] = "
                f"{int(arrays['t'][i - 1])}: N-MNIST files are sorted by time"
            )
    return arrays


def _check_sensor_size(sensor_size) -> Tuple[int, int]:
    try:
        width, height = sensor_size
    except (TypeError, ValueError):
        raise ValueError(f"sensor_size must be (width, height), got {sensor_size!r}") from None
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= 256:
            raise ValueError(f"sensor_size {name} must be an integer in 1..256, got {value!r}")
    return int(width), int(height)
