"""snnquant._io: atomic writes that survive killed runs and full disks; checksummed checkpoints."""
import errno
import os
import subprocess
import sys

import pytest
import torch

import snnquant
from snnquant import _io


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_atomic_write_bytes_text_and_permissions(tmp_path):
    path = tmp_path / "out.bin"
    _io.atomic_write(path, b"\x00\x01" * 1000)
    assert path.read_bytes() == b"\x00\x01" * 1000
    _io.atomic_write(path, "h\u00e9llo")
    assert path.read_text(encoding="utf-8") == "h\u00e9llo"
    old = os.umask(0o022)
    try:
        _io.atomic_write(tmp_path / "a", b"x")
        os.umask(0o077)
        _io.atomic_write(tmp_path / "b", b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o600
    _io.atomic_write(tmp_path / "c", lambda p: open(p, "w").write("by path"))
    assert (tmp_path / "c").read_text() == "by path"
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c", "out.bin"]
    with pytest.raises(TypeError, match="data"):
        _io.atomic_write(path, 3)


def test_atomic_write_syncs_file_and_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd")
                      else fd)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    _io.atomic_write(tmp_path / "f", b"data")
    if os.path.exists("/proc/self/fd"):
        assert ".tmp-" in synced[0] and synced[-1] == os.path.realpath(tmp_path)
    assert len(synced) == 2


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_full_disk_keeps_the_previous_file_and_removes_the_partial(tmp_path, monkeypatch, where):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"previous")
    real_write = os.write

    def full_write(fd, data):
        real_write(fd, bytes(data[:10]))  # a partial temporary file is on the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, where, full_write if where == "write" else full_fsync)
    with pytest.raises(OSError, match=r"checkpoint\.pt.*no space left on the device") as info:
        _io.atomic_write(path, b"new content " * 100)
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["checkpoint.pt"]
    monkeypatch.undo()
    # the same through save_checkpoint
    monkeypatch.setattr(os, where, full_write if where == "write" else full_fsync)
    with pytest.raises(OSError, match=r"checkpoint\.pt.*no space left"):
        snnquant.save_checkpoint({"w": torch.zeros(100)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["checkpoint.pt"]


def test_stale_temporaries_of_killed_runs_are_removed(tmp_path):
    dead = _dead_pid()
    host = _io.host_name()
    stale = [f"checkpoint.pt.tmp-{dead}", f"checkpoint.pt.tmp-{host}-{dead}-0123abcd",
             f"checkpoint.pt.tmp-{host}-{dead}-01234567"]
    kept = [f"checkpoint.pt.tmp-{host}-{os.getppid()}-0123abcd",     # a live writer
            f"checkpoint.pt.tmp-otherhost-{dead}-0123abcd",          # another machine
            f"metrics.json.tmp-{dead}", "checkpoint.pt.bak"]         # other files
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"partial")
    snnquant.save_checkpoint({"epoch": 1}, tmp_path / "checkpoint.pt")
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["checkpoint.pt"])


def test_checkpoint_round_trip_and_plain_torch_load(tmp_path):
    obj = {"model": {"w": torch.randn(3, 4), "b": torch.arange(5)}, "epoch": 3, "history": "[]"}
    path = tmp_path / "checkpoint.pt"
    snnquant.save_checkpoint(obj, path)
    for back in (snnquant.load_checkpoint(path), torch.load(path, weights_only=True)):
        assert back["epoch"] == 3 and torch.equal(back["model"]["w"], obj["model"]["w"])
    snnquant.save_checkpoint(obj, tmp_path / "again.pt")
    assert (tmp_path / "again.pt").stat().st_mode & 0o777 == path.stat().st_mode & 0o777


def test_checkpoint_every_corruption_is_an_error_naming_the_file(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "model.pt"
    snnquant.save_checkpoint({"w": torch.randn(64, 16), "n": 1}, path)
    data = path.read_bytes()
    g = torch.Generator().manual_seed(1)
    bits = torch.randperm(8 * len(data), generator=g)[:150].tolist() + list(range(8 * len(data) - 200,
                                                                                 8 * len(data)))
    bad = tmp_path / "bad.pt"
    loaded = []
    for bit in bits:
        blob = bytearray(data)
        blob[bit // 8] ^= 1 << (bit % 8)
        bad.write_bytes(bytes(blob))
        try:
            snnquant.load_checkpoint(bad)
            loaded.append(bit)
        except ValueError as exc:
            assert "bad.pt" in str(exc) and "corrupt" in str(exc), str(exc)
    assert loaded == []
    for blob in (data[:-1], data[: len(data) // 2], data[:10], data + b"\0"):
        bad.write_bytes(blob)
        with pytest.raises(ValueError, match=r"bad\.pt.*corrupt"):
            snnquant.load_checkpoint(bad)
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match=r"bad\.pt.*empty.*corrupt or truncated"):
        snnquant.load_checkpoint(bad)
    torch.save({"w": torch.zeros(2)}, bad)
    with pytest.raises(ValueError, match=r"bad\.pt.*no snnquant checksum.*weights_only=True"):
        snnquant.load_checkpoint(bad)
