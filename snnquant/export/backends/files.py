r"""One-file storage of an integer network: :func:`save_integer` and :func:`load_integer`.

The file is a `safetensors <https://github.com/huggingface/safetensors>`_ file (no pickle): the
integer tensors (2- and 4-bit weights packed), and in its metadata a JSON description with
``format_version``, every layer's bit widths and scales, and a SHA-256 checksum of the whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import warnings
from typing import Union

import torch

from ..._io import atomic_write
from ..ir.network import (FORMAT_VERSION, READABLE_FORMAT_VERSIONS, IntegerNetworkError,
                          IntegerNetwork)
from ..ir.shapes import SHAPE_DEPENDENT_OPS
from ..ir.transformer_ops import GatherOp, MatMulOp, ReduceOp, ScaleOp
from ..ir.validation import check_network

__all__ = ["save_integer", "load_integer", "FILE_FORMAT"]

#: Value of the ``format`` metadata key that marks an snnquant integer network file.
FILE_FORMAT = "snnquant-integer-network"

PathLike = Union[str, os.PathLike]

_CHECKSUM_KEY = "file_sha256"
_KEYS = {"format", "format_version", "bits", "description", _CHECKSUM_KEY}


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as exc:  # pragma: no cover - safetensors is in the 'export' extra
        raise ImportError("save_integer/load_integer need safetensors: pip install safetensors "
                          "(or snnquant[export])") from exc
    return st


def _tensor_checksum(tensors) -> str:
    # format 1 and 2 files written before the whole-file checksum: tensors only
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


_DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
           torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.float32: "F32", torch.float64: "F64"}
_PLACEHOLDER = "0" * 64


def _serialize(tensors: dict, metadata: dict) -> bytes:
    """A safetensors file, byte for byte the same for the same input, whole-file checksummed."""
    header = {"__metadata__": dict(metadata, **{_CHECKSUM_KEY: _PLACEHOLDER})}
    # largest items first keeps every tensor aligned to its item size, as safetensors does
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    chunks, offset = [], 0
    for key in order:
        t = tensors[key].detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[key] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                       "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    data = bytearray(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    marker = _marker(_PLACEHOLDER)
    at = data.index(marker) + len(marker) - 65
    data[at:at + 64] = hashlib.sha256(data).hexdigest().encode("ascii")
    return bytes(data)


def _marker(value: str) -> bytes:
    return f'"{_CHECKSUM_KEY}":"{value}"'.encode("ascii")


def save_integer(desc: IntegerNetwork, path: PathLike) -> None:
    r"""Write ``desc`` to ``path`` atomically (:func:`snnquant._io.atomic_write`).

    Tensors are stored as they are (``int8`` weights, ``uint8`` packed 2-/4-bit weights,
    ``int64`` multipliers, shifts and biases, ``float64`` weight scales); everything else is JSON
    in the safetensors metadata under ``"description"``, with ``"format"``,
    ``"format_version"`` (:data:`~snnquant.export.FORMAT_VERSION`), ``"bits"`` and
    ``"file_sha256"``: the SHA-256 of the whole file with these 64 hexadecimal digits written as
    zeros, so that a change of any byte (header or tensors), a truncation or an appended byte is
    found by :func:`load_integer`. The same network gives the same bytes (sorted keys, fixed
    layout); the file has the permissions of any new file (``0666`` minus the umask).

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
    newer = [op.name for op in desc.ops if isinstance(op, (GatherOp, ReduceOp, MatMulOp, ScaleOp))]
    if (newer or desc.output_time_mean) and desc.format_version < 4:
        what = f"the operations {newer[:3]}" if newer else "output_time_mean"
        raise ValueError(f"desc has {what}, which format_version {desc.format_version} cannot "
                         f"hold; set desc.format_version = {FORMAT_VERSION}")
    if desc.chip is not None and desc.format_version < 5:
        raise ValueError(f"desc is a {desc.chip} network, which format_version "
                         f"{desc.format_version} cannot hold; set desc.format_version = "
                         f"{FORMAT_VERSION}")
    check_network(desc)
    _needs_input_shape(desc, os.fspath(path), "cannot be written")
    meta, tensors = desc.to_record()
    metadata = {
        "format": FILE_FORMAT,
        "format_version": str(desc.format_version),
        "bits": json.dumps(meta["bits"], sort_keys=True),
        "description": json.dumps(meta, sort_keys=True),
    }
    atomic_write(path, _serialize(tensors, metadata))


def _needs_input_shape(desc: IntegerNetwork, path, what: str) -> None:
    """A network with an operation whose shapes need the input's
    (:data:`~snnquant.export.ir.shapes.SHAPE_DEPENDENT_OPS`) must hold its ``input_shape``."""
    if desc.input_shape is not None:
        return
    dependent = [op.name for op in desc.ops if isinstance(op, SHAPE_DEPENDENT_OPS)]
    if dependent:
        where = f"{path!r} {what}" if path is not None else f"it {what}"
        raise IntegerNetworkError(
            f"{where}: the network has no input_shape, and its operations "
            f"{dependent[:3]} (gathers, sums over dimensions, matrix products) can be checked "
            f"only against one sample's input shape. Re-export it with "
            f"to_integer(model, example_input=x) (or input_shape=...), set desc.input_shape, or "
            f"load it with load_integer(path, input_shape=...)")


def _read_header(data: bytes, path: str):
    if len(data) < 8:
        raise ValueError(f"{path!r} is not an snnquant integer network file: it is too short "
                         f"({len(data)} bytes; corrupt or truncated)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path!r} is not an snnquant integer network file (corrupt or "
                         f"truncated safetensors header)")
    raw = data[8:8 + n]
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path!r} is not an snnquant integer network file (corrupt: its "
                         f"header's JSON is nested too deeply)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path!r} is not an snnquant integer network file (corrupt: unreadable "
                         f"header: {exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise _not_ours(path, raw)
    return meta, raw


def _not_ours(path: str, raw_header: bytes) -> ValueError:
    if FILE_FORMAT.encode() in raw_header or _CHECKSUM_KEY.encode() in raw_header:
        return ValueError(f"{path!r} is corrupt: it looks like an snnquant integer network file, "
                          f"but its header is damaged (no readable format={FILE_FORMAT!r} "
                          f"metadata)")
    return ValueError(f"{path!r} is a safetensors file but not an snnquant integer network "
                      f"(no format={FILE_FORMAT!r} metadata)")


def _verify_file(data: bytes, raw_header: bytes, meta: dict, path: str) -> None:
    value = meta[_CHECKSUM_KEY]
    keys = set(meta)
    if keys != _KEYS:
        raise ValueError(f"{path!r} is corrupt: its metadata keys are {sorted(keys)}, expected "
                         f"{sorted(_KEYS)}")
    if not isinstance(value, str) or re.fullmatch(r"[0-9a-f]{64}", value) is None:
        raise ValueError(f"{path!r} is corrupt: its {_CHECKSUM_KEY} is not 64 hexadecimal digits")
    marker = _marker(value)
    if raw_header.count(marker) != 1:
        raise ValueError(f"{path!r} is corrupt: its header does not hold {_CHECKSUM_KEY} as "
                         f"save_integer writes it")
    at = 8 + raw_header.index(marker) + len(marker) - 65
    blank = data[:at] + _PLACEHOLDER.encode("ascii") + data[at + 64:]
    if hashlib.sha256(blank).hexdigest() != value:
        raise ValueError(f"{path!r} is corrupt: the SHA-256 checksum of the file does not match "
                         f"(a changed byte, a truncation or appended bytes)")


def load_integer(path: PathLike, *, input_shape=None) -> IntegerNetwork:
    r"""Read an integer network written by :func:`save_integer`, after verifying the checksum of
    the whole file, and check it (:func:`~snnquant.export.check_network`) before anything is
    allocated in proportion to a size the file declares.

    Where the network holds its input shape
    (:attr:`~snnquant.export.IntegerNetwork.input_shape`, written by :func:`save_integer` for
    every network exported with an ``example_input`` or an ``input_shape``), the shapes along
    every edge are checked with it at load (:func:`~snnquant.export.ir.shapes.infer_shapes`, in
    integers, at most :data:`~snnquant.export.ir.shapes.MAX_SAMPLE_ELEMENTS` values per sample).
    A file without it loads when its shapes follow from the input alone (synapses, neurons,
    pools, flattens, joins: checked for each input shape at the first run); one that holds a
    gather, a sum over dimensions or a matrix product is refused: give its ``input_shape``.

    Args:
        path: the file.
        input_shape: one sample's input shape, for a file that does not hold it (checked like
            the one a file holds; refused when the file holds a different one).

    Returns:
        The :class:`~snnquant.export.IntegerNetwork` (packed weights unpacked to ``int8``).

    Raises:
        ValueError: naming the file, when it is not such a file, is corrupt (any changed byte of
            the header or the tensors, a truncation, appended bytes), or has a ``format_version``
            this snnquant does not read
            (:data:`~snnquant.export.ir.network.READABLE_FORMAT_VERSIONS`: 1 to 5; a
            version-1 file has no fixed-point leak and loads with every layer exact; a version-1
            or -2 file is a sequence; the operations of spiking transformers need version 4,
            a chip network version 5).

    Files written by older snnquant versions (their ``"checksum"`` covers the tensors only) still
    load, with a ``UserWarning`` that their header is not verified: save them again.
    """
    path_s = os.fspath(path)
    if input_shape is not None:
        from ..ir.network import check_input_shape
        input_shape = check_input_shape(input_shape)
    return _from_bytes(_read_bounded_file(path_s), path_s, input_shape)


def _read_bounded_file(path_s: str) -> bytes:
    """The bytes of the integer network file ``path_s``: a regular file of at most
    :data:`~snnquant._io.MAX_FILE_BYTES` bytes whose safetensors header is read and checked
    (:func:`_read_header`) before the tensors are read, so that nothing proportional to a
    declared size is allocated before it is checked."""
    from ..._io import MAX_FILE_BYTES, open_bounded, read_rest_bounded

    what = "integer network file"
    f, size = open_bounded(path_s, MAX_FILE_BYTES, what)
    with f:
        head = f.read(8)
        if len(head) == 8:
            (n,) = struct.unpack("<Q", head)
            if n <= size - 8:
                head += f.read(n)
            _read_header(head, path_s)
        return read_rest_bounded(f, path_s, head, MAX_FILE_BYTES, what)


def _from_bytes(data: bytes, path_s: str, input_shape=None) -> IntegerNetwork:
    st = _safetensors()
    meta, raw_header = _read_header(data, path_s)
    legacy = _CHECKSUM_KEY not in meta and "checksum" in meta
    if not legacy:
        if _CHECKSUM_KEY not in meta:
            if meta.get("format") == FILE_FORMAT:
                raise ValueError(f"{path_s!r} is corrupt: its metadata has no {_CHECKSUM_KEY}")
            raise _not_ours(path_s, raw_header)
        _verify_file(data, raw_header, meta, path_s)
    if meta.get("format") != FILE_FORMAT:
        raise _not_ours(path_s, raw_header)
    version = meta.get("format_version")
    readable = [str(v) for v in READABLE_FORMAT_VERSIONS]
    if version not in readable:
        listed = f"{', '.join(readable[:-1])} and {readable[-1]}"
        raise ValueError(f"{path_s!r} has format_version {version!r}; this snnquant reads "
                         f"format_version {listed}. Re-export the model with this version")
    try:
        tensors = st.load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"{path_s!r} is corrupt: its tensors cannot be read ({exc})") from None
    if legacy:
        if _tensor_checksum(tensors) != meta.get("checksum"):
            raise ValueError(f"{path_s!r} is corrupt: the checksum of its tensors does not match")
        warnings.warn(f"{path_s!r} was written by an older snnquant whose checksum covers the "
                      f"tensors only, so its header (thresholds, shifts, bit widths) is not "
                      f"verified; save it again with save_integer", UserWarning, stacklevel=3)
    try:
        record = json.loads(meta["description"])
        desc = IntegerNetwork.from_record(record, tensors)
        if input_shape is not None:
            if desc.input_shape not in (None, input_shape):
                raise IntegerNetworkError(f"it holds input_shape={desc.input_shape}, not the "
                                          f"given input_shape={input_shape}")
            desc.input_shape = input_shape
        check_network(desc)
        _needs_input_shape(desc, None, "cannot be checked")
    except IntegerNetworkError as exc:
        raise IntegerNetworkError(f"{path_s!r}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path_s!r} is corrupt: its description's JSON is nested too "
                         f"deeply") from None
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path_s!r} is corrupt: its description cannot be read "
                         f"({exc!r})") from None
    if str(desc.format_version) != version:
        raise ValueError(f"{path_s!r} is corrupt: its description cannot be read (the "
                         f"description says format_version {desc.format_version}, the file "
                         f"metadata {version!r})")
    return desc
