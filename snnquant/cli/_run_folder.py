"""The run folder of ``snnquant train``: one run's files, locked while it runs, with a manifest.

Every file in a run folder belongs to the run that wrote it last. A new run starts from an absent
or empty folder; ``--resume`` continues the run whose checkpoint is there (its configuration is
checked by the caller) after removing that run's end-of-run files, which the resumed run writes
again; anything else is refused with one line. While a run works, it holds an exclusive ``flock``
on the folder itself, so that a second process on the same folder is refused at once. The
manifest ``run.json`` is written last, atomically: the command, the configuration, the result and
the SHA-256 of every other file in the folder.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Optional

from snnquant._io import MAX_JSON_BYTES, loads_strict, read_bounded

MANIFEST = "run.json"
# rewritten every epoch: a resumed run continues them
EPOCH_FILES = ("checkpoint.pt", "metrics.json", "accuracy.png", "firing_rates.png", "tensorboard")
# written once at the end of a run (or by --ptq): a resumed run removes them and writes them again
END_OF_RUN_FILES = ("model.pt", "summary.txt", "model_folded.pt", "model_int.safetensors",
                    "model_int.h", "model_int.c", "ptq.json", MANIFEST)
# the full-precision teacher that --train-teacher trains first: a run folder of its own
TEACHER_FOLDER = "teacher"
RUN_FILES = EPOCH_FILES + END_OF_RUN_FILES + (TEACHER_FOLDER,)


class RunFolderError(Exception):
    """The run folder cannot be used as asked; the message is one line saying why and what to do."""


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file ``path`` (hex), read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _describe(folder: Path, names: list) -> str:
    try:
        manifest = read_manifest(folder)
        return f"the outputs of `{manifest['command']}` ({len(names)} entries)"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    if "checkpoint.pt" in names:
        return f"an unfinished run without {MANIFEST}: {shown}"
    return shown


class RunFolder:
    """The folder ``path`` of one run: :meth:`open` checks and locks it, :meth:`write_manifest`
    closes the run, :meth:`close` releases the lock.

    Args:
        path: the run folder (``--out``); created when absent.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: Optional[int] = None

    def open(self, resume: bool) -> None:
        """Create and lock the folder, then check that a new run (``resume=False``) finds it empty
        and a resumed one finds only a run's files.

        Raises:
            RunFolderError: ``path`` is a file or cannot be written (nothing is created then),
                another process holds the folder, a new run finds files, or a resumed run
                finds files no run writes.
        """
        from snnquant._io import check_writable

        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"--out {self.path} is a file, not a folder: give a folder")
        try:
            check_writable(self.path)   # before anything is created or written
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock()
        except OSError as exc:
            self.close()
            raise RunFolderError(f"--out {self.path}: cannot use this folder "
                                 f"({exc.strerror or exc})") from None
        try:
            self._check(resume)
        except RunFolderError:
            self.close()
            raise

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # Windows: no lock
            return
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise RunFolderError(f"--out {self.path} is in use by another run right now (it holds "
                                 f"the folder's lock): wait for it to finish or give another "
                                 f"--out") from None

    def _check(self, resume: bool) -> None:
        from snnquant._io import remove_stale_temporaries

        for name in os.listdir(self.path):  # temporaries of killed runs are not a run's files
            if ".tmp-" in name:
                remove_stale_temporaries(self.path / name.split(".tmp-")[0])
        names = sorted(os.listdir(self.path))
        if not names:
            return
        if not resume:
            raise RunFolderError(
                f"--out {self.path} is not empty (it holds {_describe(self.path, names)}): give a "
                f"new or empty --out, remove what is there, or add --resume to continue the run "
                f"whose checkpoint.pt is there")
        foreign = [n for n in names if n not in RUN_FILES]
        if foreign:
            raise RunFolderError(
                f"--resume: --out {self.path} holds files no run writes ({', '.join(foreign[:4])}"
                f"{' ...' if len(foreign) > 4 else ''}): move them away and resume again")

    def remove_end_of_run_files(self) -> None:
        """Remove the files the end of a run writes (the manifest first): a resumed run writes
        them again, and none of an earlier end is left beside the new one."""
        for name in END_OF_RUN_FILES:
            try:
                (self.path / name).unlink()
            except FileNotFoundError:
                pass

    def write_manifest(self, command: str, configuration: dict, result) -> dict:
        """Write ``run.json`` (atomically): the command, the configuration, the result and the
        SHA-256 and size of every other file in the folder; return what was written."""
        from snnquant._io import atomic_write
        from snnquant._version import __version__

        files = {}
        for path in sorted(self.path.rglob("*")):
            rel = path.relative_to(self.path).as_posix()
            if path.is_file() and rel != MANIFEST and ".tmp-" not in path.name:
                files[rel] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
        manifest = dict(command=command, configuration=configuration, result=result, files=files,
                        snnquant_version=__version__,
                        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        manifest = _seal(json.loads(json.dumps(manifest, default=str)))
        atomic_write(self.path / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        return manifest

    def close(self) -> None:
        """Release the folder's lock (the kernel also releases it when the process ends)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_SEAL_KEYS = ("sha256", "field_sha256")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _fields(manifest: dict) -> dict:
    """``{field: value}`` of the manifest's top-level fields and, one level down, its
    ``configuration``'s (``configuration.T``, ...): what its seal names when one changed."""
    fields = {k: v for k, v in manifest.items() if k not in _SEAL_KEYS}
    if isinstance(manifest.get("configuration"), dict):
        fields.update({f"configuration.{k}": v for k, v in manifest["configuration"].items()})
    return fields


def _seal(manifest: dict) -> dict:
    """``manifest`` with its seal: the SHA-256 of its content (``sha256``) and of each field
    (``field_sha256``), so that an edit is refused naming the field that changed."""
    body = {k: v for k, v in manifest.items() if k not in _SEAL_KEYS}
    body["field_sha256"] = {k: _digest(v) for k, v in _fields(body).items()}
    body["sha256"] = _digest({k: v for k, v in body.items() if k != "sha256"})
    return body


def _check_seal(manifest: dict, path: Path) -> None:
    if "sha256" not in manifest:   # written before run.json was sealed: checked field by field
        return
    fields = manifest.get("field_sha256")
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: field 'field_sha256' was changed after the run wrote it")
    current = {k: _digest(v) for k, v in _fields(manifest).items()}
    changed = [n for n in set(fields) | set(current) if fields.get(n) != current.get(n)]
    if changed:   # the most specific field that is still there
        name = min([n for n in changed if n in current] or changed,
                   key=lambda n: (-n.count("."), n))
        raise ValueError(f"{path}: field {name!r} was changed after the run wrote it (its "
                         f"SHA-256 differs from the one the run sealed)")
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    if _digest(body) != manifest["sha256"]:
        raise ValueError(f"{path}: field 'sha256' does not match the content (changed after "
                         f"the run wrote it)")


def _check_files(files, path: Path) -> None:
    """The ``files`` of a manifest: relative paths inside the folder, each with a SHA-256."""
    if not isinstance(files, dict):
        raise ValueError(f"{path}: field 'files' must be an object, got {type(files).__name__}")
    for rel, entry in files.items():
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts or "\\" in rel:
            raise ValueError(f"{path}: field 'files' entry {rel!r} points outside the run folder")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or len(entry["sha256"]) != 64:
            raise ValueError(f"{path}: field 'files' entry {rel!r} must hold a sha256 of 64 "
                             f"hexadecimal digits, got {entry!r:.80}")


def _check_configuration(config, path: Path) -> None:
    """Each field of ``configuration`` of the type and choices of its ``snnquant train`` flag
    (the flags' own parser), and the sizes a network is built from at least 1."""
    if not isinstance(config, dict):
        raise ValueError(f"{path}: field 'configuration' must be an object, got "
                         f"{type(config).__name__}")
    from snnquant.cli.args import train_parser

    actions = {a.dest: a for a in train_parser("snnquant train")._actions}
    for key, value in config.items():
        action = actions.get(key)
        name = f"configuration.{key}"
        if action is None:
            continue
        repeated = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*") \
            or isinstance(action.nargs, int)
        if repeated and isinstance(value, list):
            # a flag given several times (--model-arg K=V ...): a list of the flag's values
            checked = [_flag_value_ok(action, item) for item in value]
            ok = all(item_ok for item_ok, _ in checked)
            want = "a list of " + next((w for item_ok, w in checked if not item_ok), "values")
        else:
            ok, want = _flag_value_ok(action, value)
        if ok and action.type is int and key in _SIZES and not 1 <= value <= _SIZES[key]:
            ok, want = False, f"an int in [1, {_SIZES[key]}]"
        if not ok:
            raise ValueError(f"{path}: field {name!r} must be {want}, got {value!r:.80}")


def _flag_value_ok(action, value):
    """``(ok, what it must be)`` of one value of the ``snnquant train`` flag ``action``."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return isinstance(value, bool), "a bool"
    if value is None:
        return True, ""
    ok, want = isinstance(value, str), "a string"
    if action.type in (int, float):
        ok = isinstance(value, (int, float) if action.type is float else int) \
            and not isinstance(value, bool) and math.isfinite(value)
        want = "an int" if action.type is int else "a number"
    if ok and action.choices is not None and value not in action.choices:
        ok, want = False, f"one of {list(action.choices)}"
    return ok, want


#: the sizes a run folder's network is rebuilt from, and their bounds
_SIZES = {"channels": 4096, "T": 100000}


def read_manifest(folder: Path) -> dict:
    """``<folder>/run.json`` as a dict, checked: a regular file under the JSON size bound,
    strict JSON (no NaN, no duplicate keys, no nesting beyond the recursion limit), its seal
    (an edit is refused naming the field that changed), ``files`` inside the folder and each
    ``configuration`` field of its flag's type; a ``ValueError`` naming the file and the field
    otherwise."""
    path = Path(folder) / MANIFEST
    manifest = loads_strict(read_bounded(path, MAX_JSON_BYTES, MANIFEST), str(path))
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(manifest).__name__}")
    _check_seal(manifest, path)
    for key in ("configuration", "files"):
        if key not in manifest:
            raise ValueError(f"{path}: field {key!r} is missing")
    _check_files(manifest["files"], path)
    _check_configuration(manifest["configuration"], path)
    return manifest


def verify_manifest(folder: Path) -> dict:
    """Read ``<folder>/run.json`` and check every file it lists against its SHA-256.

    Raises:
        ValueError: no readable manifest, or a listed file is missing or differs (named).
    """
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
        files = manifest["files"]
    except OSError as exc:
        raise ValueError(f"{folder} has no readable {MANIFEST} (not a finished run folder of "
                         f"snnquant train): {exc}") from None
    for rel, entry in files.items():
        path = folder / rel
        if not path.is_file():
            raise ValueError(f"{path} is listed in {folder / MANIFEST} but missing")
        if file_sha256(path) != entry["sha256"]:
            raise ValueError(f"{path} differs from the SHA-256 in {folder / MANIFEST} (changed "
                             f"after the run wrote it)")
    return manifest
