r"""Files that survive killed runs, full disks and bit flips.

:func:`atomic_write` is the one way snnquant writes a file: a temporary file in the same folder,
flushed to the disk (``fsync``), renamed over the target, and the folder synced. A killed run
leaves either the old file or the new one, never a mixture; the temporaries a killed run leaves
behind (``<name>.tmp-<host>-<pid>-<token>``) are removed by the next write of the same file. The
file gets the permissions of any new file (``0666`` minus the umask, typically ``0644``).

:func:`save_checkpoint` / :func:`load_checkpoint` store PyTorch objects (state dicts, training
checkpoints) with a SHA-256 checksum of the whole file and load them without pickle
(``torch.load(..., weights_only=True)``). The file stays an ordinary ``torch.save`` archive: the
checksum lives in the zip comment, which ``torch.load`` ignores.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import secrets
import socket
import struct
from typing import Callable, Union

__all__ = ["atomic_write", "atomic_write_files", "host_name", "pid_alive",
           "remove_stale_temporaries", "save_checkpoint", "load_checkpoint", "check_writable",
           "read_bounded", "loads_strict", "MAX_FILE_BYTES", "MAX_JSON_BYTES"]

PathLike = Union[str, os.PathLike]

_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# errors of fsync on a folder that mean "not supported here", not "the data is lost"
_DIR_SYNC_UNSUPPORTED = {errno.EINVAL, errno.EBADF, errno.EISDIR, errno.EACCES, errno.EPERM,
                         getattr(errno, "ENOTSUP", errno.EINVAL),
                         getattr(errno, "EOPNOTSUPP", errno.EINVAL)}


def host_name() -> str:
    """This machine's host name with every character other than letters, digits and ``.``
    replaced by ``_`` (the form temporary file names carry)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _temporary_path(path: str) -> str:
    return f"{path}.tmp-{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"


def check_writable(folder: PathLike) -> None:
    """Check that files can be created in ``folder`` (or, when it does not exist yet, in its
    nearest existing parent, where it would be created) by creating and removing one empty
    temporary file there: permission bits, read-only mounts and ``root`` are all answered by
    the file system itself.

    Raises:
        OSError: the folder (or that parent) cannot be written; ``strerror`` says why.
    """
    target = os.path.abspath(os.fspath(folder))
    while not os.path.exists(target) and os.path.dirname(target) != target:
        target = os.path.dirname(target)
    if not os.path.isdir(target):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), target)
    probe = _temporary_path(os.path.join(target, ".snnquant-write-check"))
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    os.remove(probe)


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this machine (this process counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: the process exists (another user's)
        return True
    return True


def remove_stale_temporaries(path: PathLike) -> list:
    """Remove the temporaries of ``path`` that killed runs left behind; return their paths.

    A temporary of ``path`` is ``<path>.tmp-<host>-<pid>-<token>`` (or ``<path>.tmp-<pid>``, as
    older versions wrote). It is stale when it was written on this machine by a process that no
    longer runs. Temporaries of live processes and of other machines (shared folders) are kept.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    pattern = re.compile(re.escape(base) + r"\.tmp-(?:(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]{8}"
                                           r"|(?P<old_pid>\d+))")
    if os.name == "nt":  # no cheap way to ask whether a pid runs
        return []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or m.group("host") not in (None, host_name()) or \
                pid_alive(int(m.group("pid") or m.group("old_pid"))):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(os.path.join(folder, name))
        except OSError:
            pass
    return removed


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _explained(exc: OSError, path: str) -> OSError:
    if exc.errno in _NO_SPACE:
        msg = (f"cannot write {path!r}: no space left on the device. The previous file (if any) is "
               f"unchanged and the partial temporary file was removed; free some space and run "
               f"again")
    else:
        msg = f"cannot write {path!r}: {exc.strerror or exc}"
    if exc.errno is None:
        return OSError(msg)
    try:
        return type(exc)(exc.errno, msg)
    except TypeError:
        return OSError(exc.errno, msg)


def _sync_folder(folder: str) -> None:
    if os.name == "nt":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_SYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


Data = Union[bytes, bytearray, memoryview, str, Callable[[str], None]]


def _write_temporary(path: str, data: Data) -> str:
    """Write ``data`` to a new temporary of ``path``, fsynced; return its path (removed on error)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not callable(data) and not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, str or a function of a path, got "
                        f"{type(data).__name__}")
    remove_stale_temporaries(path)
    tmp = _temporary_path(path)
    try:
        if callable(data):
            data(tmp)
            fd = os.open(tmp, os.O_RDONLY)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
            try:
                view = memoryview(data).cast("B")
                while len(view):
                    view = view[os.write(fd, view[:1 << 24]):]
            except BaseException:
                os.close(fd)
                raise
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        _remove_quietly(tmp)
        if isinstance(exc, OSError):
            raise _explained(exc, path) from exc
        raise
    return tmp


def atomic_write(path: PathLike, data: Data) -> None:
    r"""Write ``data`` to ``path`` so that a crash leaves the old file or the new one, whole.

    The data goes to a temporary ``<path>.tmp-<host>-<pid>-<token>`` in the same folder, which is
    ``fsync``-ed and renamed over ``path`` (``os.replace``); then the folder is synced so that
    the rename itself is on the disk. Stale temporaries of ``path`` left by killed runs are removed
    first (:func:`remove_stale_temporaries`). The new file gets the permissions of any new file
    (``0666`` minus the umask).

    Args:
        path: the destination file.
        data: the bytes (a ``str`` is written as UTF-8), or a function that writes the file whose
            path it is given (for writers that want a path, such as ``nir.write``).

    Raises:
        OSError: the file could not be written; the message names ``path`` (on a full disk:
            "no space left on the device"), the temporary file is removed and a previous file at
            ``path`` is untouched.
    """
    atomic_write_files([(path, data)])


def atomic_write_files(files) -> None:
    r"""Write several files as :func:`atomic_write` does, none of them when one cannot be written.

    Every file's temporary is written and ``fsync``-ed before the first rename, so an error while
    writing any of them (a full disk) renames nothing: every earlier file stays as it was and the
    temporaries are removed. Only the renames themselves (``os.replace``, no data written) follow
    one another; a reader that looks between two renames can see a new file beside an old one, so
    files that must match carry a check of their own (as the pair of
    :func:`~snnquant.export.to_c` does).

    Args:
        files: ``(path, data)`` pairs, ``data`` as for :func:`atomic_write`.

    Raises:
        OSError: naming the path that could not be written.
    """
    files = [(os.fspath(path), data) for path, data in files]
    pending = []
    try:
        for path, data in files:
            pending.append((_write_temporary(path, data), path))
        while pending:
            tmp, path = pending[0]
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise _explained(exc, path) from exc
            pending.pop(0)
    finally:
        for tmp, _ in pending:
            _remove_quietly(tmp)
    for folder in dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path, _ in files):
        try:
            _sync_folder(folder)
        except OSError as exc:
            raise _explained(exc, folder) from exc


# --------------------------------------------------------------------------------------------------
# checksummed torch files

_SEAL_MAGIC = b"snnquant-sha256:"
_SEAL_LEN = len(_SEAL_MAGIC) + 64
_EOCD = b"PK\x05\x06"
_EOCD_SIZE = 22


def _seal(data: bytes) -> bytes:
    if len(data) < _EOCD_SIZE or data[-_EOCD_SIZE:-_EOCD_SIZE + 4] != _EOCD or data[-2:] != b"\0\0":
        raise RuntimeError("torch.save did not write a zip archive without comment; "
                           "save_checkpoint cannot add its checksum")
    body = data[:-2] + struct.pack("<H", _SEAL_LEN)
    return body + _SEAL_MAGIC + hashlib.sha256(body).hexdigest().encode("ascii")


def save_checkpoint(obj, path: PathLike) -> None:
    r"""Save ``obj`` (a state dict, a training checkpoint) with ``torch.save``, checksummed,
    atomically (:func:`atomic_write`).

    The file is an ordinary ``torch.save`` archive whose zip comment holds the SHA-256 of
    everything before it, so ``torch.load`` still reads it and :func:`load_checkpoint` verifies it.
    Write only what ``torch.load(..., weights_only=True)`` accepts (tensors, numbers, strings,
    lists, dicts, ...): :func:`load_checkpoint` never unpickles arbitrary objects.

    Args:
        obj: the object to save.
        path: the destination file.
    """
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, _seal(buffer.getvalue()))


def load_checkpoint(path: PathLike, map_location=None):
    r"""Load a file written by :func:`save_checkpoint`, after verifying its checksum, without
    pickle (``torch.load(..., weights_only=True)``).

    Args:
        path: the file.
        map_location: as in ``torch.load``.

    Raises:
        ValueError: naming the file, when it is empty, truncated or corrupt (its checksum does not
            match), or has no checksum (written by plain ``torch.save``: load such a file with
            ``torch.load(path, weights_only=True)`` if you trust it).
    """
    import torch

    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise ValueError(f"{path!r} is empty: the file is corrupt or truncated (an interrupted "
                         f"write?)")
    n = _SEAL_LEN
    sealed = (len(data) >= n + _EOCD_SIZE and data[-n:-64] == _SEAL_MAGIC
              and data[-n - _EOCD_SIZE:-n - _EOCD_SIZE + 4] == _EOCD
              and data[-n - 2:-n] == struct.pack("<H", n))
    if not sealed:
        if len(data) >= _EOCD_SIZE and data[-_EOCD_SIZE:-_EOCD_SIZE + 4] == _EOCD \
                and data[-2:] == b"\0\0":
            raise ValueError(f"{path!r} has no snnquant checksum (written by torch.save or an "
                             f"older snnquant), so it cannot be verified; load it with "
                             f"torch.load({path!r}, weights_only=True) if you trust it, or save it "
                             f"again with snnquant.save_checkpoint")
        raise ValueError(f"{path!r} is corrupt or truncated: it does not end as a file written by "
                         f"snnquant.save_checkpoint ({len(data)} bytes)")
    expected = data[-64:].decode("ascii", errors="replace")
    if hashlib.sha256(data[:-n]).hexdigest() != expected:
        raise ValueError(f"{path!r} is corrupt: its SHA-256 checksum does not match its content "
                         f"(a flipped bit or a partial write)")
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path!r} passed its checksum but torch.load(weights_only=True) cannot "
                         f"read it: {exc}") from exc


# --------------------------------------------------------------------------------------------------
# reading files that may be hostile: a size bound before reading, strict JSON

#: the largest integer network file snnquant reads (bytes); larger files are refused before
#: anything is read
MAX_FILE_BYTES = 1 << 30
#: the largest JSON file snnquant reads (bytes): a chip file (Xylo's largest network is about
#: 5 MB of JSON) or a run folder's ``run.json``
MAX_JSON_BYTES = 1 << 26


def open_bounded(path: PathLike, limit: int = MAX_FILE_BYTES, what: str = "file"):
    r"""``(binary file object, size)`` of the regular file ``path`` opened for reading, refused
    before anything is read when it is larger than ``limit`` bytes or not a regular file (a FIFO,
    a device such as ``/dev/zero``, a folder). The caller closes the file.

    Raises:
        ValueError: naming the file and its size or kind.
        OSError: the file cannot be opened.
    """
    import stat

    path_s = os.fspath(path)
    fd = os.open(path_s, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    f = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path_s}: not a regular file (a FIFO, a device or a folder); "
                             f"snnquant reads a {what} only from a regular file")
        if info.st_size > limit:
            raise ValueError(f"{path_s}: {info.st_size} bytes, larger than the {limit} bytes a "
                             f"{what} may have")
    except BaseException:
        f.close()
        raise
    return f, info.st_size


def read_rest_bounded(f, path: PathLike, start: bytes = b"", limit: int = MAX_FILE_BYTES,
                      what: str = "file") -> bytes:
    """``start`` and the rest of the open file ``f`` (:func:`open_bounded`), at most ``limit``
    bytes in all: a file that grew past it while read is refused, naming ``path``. It is read
    in blocks of at most 16 MiB, so what is allocated follows the file, not ``limit`` (one
    ``read(limit)`` reserves ``limit`` bytes first)."""
    chunks, total = [start], len(start)
    while total <= limit:
        block = f.read(min(1 << 24, limit + 1 - total))
        if not block:
            break
        chunks.append(block)
        total += len(block)
    data = b"".join(chunks) if len(chunks) > 1 else start
    if len(data) > limit:
        raise ValueError(f"{os.fspath(path)}: larger than the {limit} bytes a {what} may have (it "
                         f"grew while read)")
    return data


def read_bounded(path: PathLike, limit: int = MAX_FILE_BYTES, what: str = "file") -> bytes:
    r"""The bytes of the regular file ``path``, refused before reading when it is larger than
    ``limit`` or not a regular file (:func:`open_bounded`).

    Raises:
        ValueError: naming the file and its size or kind.
        OSError: the file cannot be opened.
    """
    f, _ = open_bounded(path, limit, what)
    with f:
        return read_rest_bounded(f, path, b"", limit, what)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (strict JSON has no NaN or Infinity)")


def _unique_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def loads_strict(text, where: str):
    r"""Parse the JSON ``text`` strictly: no ``NaN``/``Infinity``, no duplicate keys in an object,
    and nesting no deeper than Python's recursion limit (deeper is a ``ValueError``, not a
    ``RecursionError``).

    Raises:
        ValueError: naming ``where`` (a file, or a file and a field) and what is wrong.
    """
    import json

    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: not UTF-8 text ({exc})") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{where}: not strict JSON ({exc})") from None
