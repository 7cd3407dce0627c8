"""Inputs that would allocate before they are checked (issue 47, C): files are refused by size
and kind before they are read, JSON nesting is a ValueError naming the file, and a declared flag
is read as a bool only when it is one. Peak memory is bounded with ``resource`` in a subprocess,
so an implementation that reads first and checks later fails with a MemoryError instead of
passing slowly."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from _repo import ROOT

BOUNDED = textwrap.dedent("""
    import resource, sys, traceback
    import torch, numpy, snnquant, snnquant.export, snnquant.targets, snnquant.cli._run_folder
    def vm():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    extra = 256 * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (vm() + extra, resource.RLIM_INFINITY))
    try:
        exec(sys.argv[1])
    except MemoryError:
        print("MemoryError"); sys.exit(3)
    except ValueError as exc:
        print("ValueError:", exc); sys.exit(0)
    except Exception as exc:
        traceback.print_exc(); print(type(exc).__name__, exc); sys.exit(4)
    print("no error"); sys.exit(5)
""")


def _bounded(code: str, timeout: float = 120) -> str:
    """Run ``code`` with at most 256 MiB more address space than the imports took; its
    ValueError's message (the test fails on anything else, a MemoryError included)."""
    done = subprocess.run([sys.executable, "-c", BOUNDED, code], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT), env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status") or os.name != "posix",
                                reason="the memory bound reads /proc (Linux)")


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


LOADERS = ["snnquant.targets.load_xylo", "snnquant.targets.load_loihi",
           "snnquant.targets.load_speck", "snnquant.export.load_integer"]


@pytest.mark.parametrize("loader", LOADERS)
def test_a_large_sparse_file_is_refused_before_it_is_read(tmp_path, loader):
    path = _sparse(tmp_path / "big", (1 << 30) + 1)
    out = _bounded(f"import snnquant.targets, snnquant.export; {loader}({str(path)!r})")
    assert str(path) in out


@pytest.mark.parametrize("loader", LOADERS)
def test_a_sparse_file_under_the_bound_is_refused_without_reading_it_whole(tmp_path, loader):
    """1 GiB of zeros, a size the bound of an integer file allows: its safetensors header
    declares 0 bytes and is refused before the rest is read; a chip file's bound is smaller."""
    path = _sparse(tmp_path / "big", 1 << 30)
    out = _bounded(f"import snnquant.targets, snnquant.export; {loader}({str(path)!r})")
    assert str(path) in out


@pytest.mark.parametrize("loader", LOADERS)
def test_dev_zero_and_a_fifo_are_refused_by_kind(tmp_path, loader):
    out = _bounded(f"import snnquant.targets, snnquant.export; {loader}('/dev/zero')")
    assert "/dev/zero" in out and "not a regular file" in out
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = _bounded(f"import snnquant.targets, snnquant.export; {loader}({str(fifo)!r})",
                   timeout=60)
    assert "not a regular file" in out


def _integer_file(tmp_path):
    from test_export_io import conv_net
    from snnquant.export import save_integer, to_integer

    path = tmp_path / "net.safetensors"
    save_integer(to_integer(conv_net()), path)
    return path


def _rewrite_metadata(path, edit):
    """Rewrite the file's metadata with ``edit(meta)`` and a recomputed checksum (what anyone
    can do)."""
    from snnquant.export.backends import files

    data = path.read_bytes()
    meta, _ = files._read_header(data, str(path))
    meta = dict(meta)
    edit(meta)
    st = files._safetensors()
    tensors = st.load(data)
    meta.pop(files._CHECKSUM_KEY)
    path.write_bytes(files._serialize(tensors, meta))


def test_nested_json_in_an_integer_files_description_is_a_value_error(tmp_path):
    from snnquant.export import load_integer

    path = _integer_file(tmp_path)

    def nest(meta):
        meta["description"] = "[" * 50000 + "]" * 50000
    _rewrite_metadata(path, nest)
    with pytest.raises(ValueError, match=str(path)):
        load_integer(path)


def test_nested_json_in_a_safetensors_header_is_a_value_error(tmp_path):
    from snnquant.export import load_integer

    path = tmp_path / "nested.safetensors"
    header = ("[" * 50000 + "]" * 50000).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ValueError, match=str(path)):
        load_integer(path)


def test_nested_json_in_run_json_is_a_value_error(tmp_path):
    from snnquant.cli._run_folder import verify_manifest

    (tmp_path / "run.json").write_text("[" * 50000 + "]" * 50000)
    with pytest.raises(ValueError, match="run.json"):
        verify_manifest(tmp_path)


@pytest.mark.parametrize("value", ["false", 7, None])
def test_output_time_mean_must_be_a_bool(tmp_path, value):
    from snnquant.export import load_integer

    path = _integer_file(tmp_path)

    def edit(meta):
        desc = json.loads(meta["description"])
        desc["output_time_mean"] = value
        meta["description"] = json.dumps(desc, sort_keys=True)
    _rewrite_metadata(path, edit)
    with pytest.raises(ValueError, match="output_time_mean"):
        load_integer(path)
