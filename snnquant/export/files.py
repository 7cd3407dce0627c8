r"""One-file storage of an integer network: :func:`save_integer` and :func:`load_integer`.

The file is a `safetensors <https://github.com/huggingface/safetensors>`_ file (no pickle): the
integer tensors (2- and 4-bit weights packed), and in its metadata a JSON description with
``format_version``, every layer's bit widths and scales, and a SHA-256 checksum of the tensor data.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from typing import Union

import torch

from .description import FORMAT_VERSION, READABLE_FORMAT_VERSIONS, IntegerNetwork

__all__ = ["save_integer", "load_integer", "FILE_FORMAT"]

#: Value of the ``format`` metadata key that marks an snnquant integer network file.
FILE_FORMAT = "snnquant-integer-network"

PathLike = Union[str, os.PathLike]


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as exc:  # pragma: no cover - safetensors is in the 'export' extra
        raise ImportError("save_integer/load_integer need safetensors: pip install safetensors "
                          "(or snnquant[export])") from exc
    return st


def _checksum(tensors) -> str:
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_integer(desc: IntegerNetwork, path: PathLike) -> None:
    r"""Write ``desc`` to ``path`` atomically (temporary file in the same folder, then rename).

    Tensors are stored as they are (``int8`` weights, ``uint8`` packed 2-/4-bit weights,
    ``int64`` multipliers, shifts and biases, ``float64`` weight scales); everything else is JSON
    in the safetensors metadata under ``"description"``, with ``"format"``,
    ``"format_version"`` (:data:`~snnquant.export.FORMAT_VERSION`), ``"bits"`` and a SHA-256
    ``"checksum"`` of the tensors.

    Args:
        desc: the integer network.
        path: destination file (conventionally ``*.safetensors``).
    """
    if not isinstance(desc, IntegerNetwork):
        raise TypeError(f"desc must be an IntegerNetwork, got {type(desc).__name__}")
    if not desc.exact and desc.format_version < 2:
        raise ValueError(f"desc has layers with a fixed-point leak ({desc.approximate_layers}), "
                         f"which format_version {desc.format_version} cannot hold; set "
                         f"desc.format_version = {FORMAT_VERSION}")
    st = _safetensors()
    meta, tensors = desc.to_record()
    tensors = {k: v.clone() for k, v in tensors.items()}
    metadata = {
        "format": FILE_FORMAT,
        "format_version": str(desc.format_version),
        "bits": json.dumps(meta["bits"]),
        "description": json.dumps(meta),
        "checksum": _checksum(tensors),
    }
    data = st.save(tensors, metadata=metadata)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _read_header(data: bytes, path: str) -> dict:
    if len(data) < 8:
        raise ValueError(f"{path!r} is not an snnquant integer network file: it is too short "
                         f"({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path!r} is not an snnquant integer network file (corrupt or "
                         f"truncated safetensors header)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path!r} is not an snnquant integer network file (unreadable header: "
                         f"{exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FILE_FORMAT:
        raise ValueError(f"{path!r} is a safetensors file but not an snnquant integer network "
                         f"(no format={FILE_FORMAT!r} metadata)")
    return meta


def load_integer(path: PathLike) -> IntegerNetwork:
    r"""Read an integer network written by :func:`save_integer`.

    Args:
        path: the file.

    Returns:
        The :class:`~snnquant.export.IntegerNetwork` (packed weights unpacked to ``int8``).

    Raises:
        ValueError: the file is not such a file, is corrupt (header, tensors or checksum), or
            has a ``format_version`` this snnquant does not read
            (:data:`~snnquant.export.description.READABLE_FORMAT_VERSIONS`: 1 and 2; a
            version-1 file has no fixed-point leak and loads with every layer exact).
    """
    st = _safetensors()
    path_s = os.fspath(path)
    with open(path_s, "rb") as f:
        data = f.read()
    meta = _read_header(data, path_s)
    version = meta.get("format_version")
    readable = [str(v) for v in READABLE_FORMAT_VERSIONS]
    if version not in readable:
        raise ValueError(f"{path_s!r} has format_version {version!r}; this snnquant reads "
                         f"format_version {' and '.join(readable)}. Re-export the model with "
                         f"this version")
    try:
        tensors = st.load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"{path_s!r} is corrupt: its tensors cannot be read ({exc})") from None
    if _checksum(tensors) != meta.get("checksum"):
        raise ValueError(f"{path_s!r} is corrupt: the checksum of its tensors does not match")
    try:
        record = json.loads(meta["description"])
        desc = IntegerNetwork.from_record(record, tensors)
        if str(desc.format_version) != version:
            raise ValueError(f"the description says format_version {desc.format_version}, the "
                             f"file metadata {version!r}")
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path_s!r} is corrupt: its description cannot be read ({exc!r})") from None
    return desc
