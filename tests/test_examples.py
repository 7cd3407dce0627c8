"""Every example runs in a reduced form, so that none can silently rot."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import load_script

from _repo import needs

pytestmark = needs("examples")

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _load(name):
    return load_script(f"examples/{name}.py")


def test_every_example_is_tested():
    tested = {"quickstart", "custom_neuron", "train_nmnist"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_quickstart():
    losses = _load("quickstart").main(["--steps", "8"])
    assert losses[-1] < losses[0]


def test_custom_neuron():
    losses = _load("custom_neuron").main(["--steps", "12"])
    assert losses[-1] < losses[0]


@pytest.fixture(scope="module")
def data_env(tmp_path_factory):
    env = dict(os.environ)
    env["SNNQUANT_DATA"] = str(tmp_path_factory.mktemp("data"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


SMALL = ["--samples-per-class", "3", "-T", "4", "--batch-size", "8", "--channels", "4"]


def _train(env, out, *extra, check=True):
    cmd = [sys.executable, str(EXAMPLES / "train_nmnist.py"), *SMALL, "--out", str(out), *extra]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@pytest.mark.heavy
def test_train_nmnist_outputs_and_resume(data_env, tmp_path):
    full = _train(data_env, tmp_path / "full", "--epochs", "2", "--finetune-epochs", "1")
    assert "built-in digits dataset" in full.stdout
    assert "test accuracy:" in full.stdout and "compression ratio" in full.stdout
    assert "integer model agreement: 100.00%" in full.stdout
    assert (tmp_path / "full" / "model_int.safetensors").stat().st_size > 0
    assert "C model:" in full.stdout and "ROM" in full.stdout and "RAM" in full.stdout
    assert (tmp_path / "full" / "model_int.c").stat().st_size > 0
    out = tmp_path / "full"
    for name in ("metrics.json", "accuracy.png", "firing_rates.png", "checkpoint.pt", "model.pt",
                 "summary.txt"):
        assert (out / name).stat().st_size > 0, name
    assert any((out / "tensorboard").iterdir())
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2
    # model.pt: the state dict, checksummed; a flipped bit is an error naming the file
    import snnquant
    state = snnquant.load_checkpoint(out / "model.pt")
    assert set(state) == set(torch.load(out / "model.pt", weights_only=True))
    _flip(out / "model.pt", (out / "model.pt").stat().st_size // 3)
    with pytest.raises(ValueError, match=r"model\.pt.*corrupt"):
        snnquant.load_checkpoint(out / "model.pt")
    _flip(out / "model_int.safetensors", 20)
    from snnquant.export import load_integer
    with pytest.raises(ValueError, match=r"model_int\.safetensors.*corrupt"):
        load_integer(out / "model_int.safetensors")
    # interrupted after epoch 1, resumed: the same history as the uninterrupted run
    part = tmp_path / "part"
    _train(data_env, part, "--epochs", "2", "--stop-after", "1", "--no-integer-check")
    assert torch.load(part / "checkpoint.pt", weights_only=True)["epoch"] == 1
    _train(data_env, part, "--epochs", "2", "--resume", "--no-integer-check")
    h_full = json.loads((out / "metrics.json").read_text())["history"]
    h_part = json.loads((part / "metrics.json").read_text())["history"]
    for a, b in zip(h_full, h_part):
        for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
            assert a[key] == b[key], (key, a, b)
    # resuming with other flags lists them
    bad = _train(data_env, part, "--epochs", "2", "--resume", "--lr", "0.5", "--v-bits", "6",
                 check=False)
    assert bad.returncode != 0
    assert "--lr" in bad.stderr and "--v-bits" in bad.stderr


def _flip(path, byte, bit=0):
    blob = bytearray(path.read_bytes())
    blob[byte] ^= 1 << bit
    path.write_bytes(bytes(blob))


def test_train_nmnist_files_are_checksummed_atomic_and_resume_checks_the_run(data_env, tmp_path,
                                                                            monkeypatch):
    import snnquant
    monkeypatch.setenv("SNNQUANT_DATA", data_env["SNNQUANT_DATA"])
    train = _load("train_nmnist")

    def run(*extra):  # in this process: a refused --resume stops before any data is loaded
        with torch.random.fork_rng():
            return train.main([*SMALL, "--out", str(out), "--epochs", "1", *extra])

    def refused(*extra):
        with pytest.raises(SystemExit) as info:
            run("--resume", *extra)
        return str(info.value.code)

    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / f"checkpoint.pt.tmp-{dead.pid}").write_bytes(b"left by a killed run")
    run("--stop-after", "1", "--no-integer-check")
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]
    umask = os.umask(0o022)
    os.umask(umask)
    for name in ("checkpoint.pt", "metrics.json", "accuracy.png"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    ckpt = snnquant.load_checkpoint(out / "checkpoint.pt")
    assert ckpt["epoch"] == 1 and ckpt["config"]["world_size"] == 1
    assert ckpt["config"]["lr"] == 2e-3 and "out" not in ckpt["config"]
    # a checkpoint made with another world size (or any other setting) is refused, with the list
    other = dict(ckpt, config=dict(ckpt["config"], world_size=2, seed=5))
    snnquant.save_checkpoint(other, out / "checkpoint.pt")
    message = refused()
    assert "world size (number of processes): checkpoint 2, now 1" in message, message
    assert "--seed: checkpoint 5, now 0" in message and "--lr" not in message
    snnquant.save_checkpoint(ckpt, out / "checkpoint.pt")
    assert "--batch-size: checkpoint 8, now 4" in refused("--batch-size", "4")
    # a flipped bit, a truncated or an empty checkpoint: one clear error naming the file
    good = (out / "checkpoint.pt").read_bytes()
    for damaged in (good[: len(good) // 2] + bytes([good[len(good) // 2] ^ 8]) + good[len(good) // 2 + 1:],
                    good[:-100], b""):
        (out / "checkpoint.pt").write_bytes(damaged)
        message = refused()
        assert str(out / "checkpoint.pt") in message and "corrupt" in message, message
    # the same checks through the command line: no traceback, the message on stderr
    res = _train(data_env, out, "--epochs", "1", "--resume", check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert str(out / "checkpoint.pt") in res.stderr and "empty" in res.stderr, res.stderr


def test_train_nmnist_missing_real_root_says_what_to_download(data_env, tmp_path):
    res = _train(data_env, tmp_path / "o", "--data-root", str(tmp_path / "nmnist"), "--epochs", "1",
                 check=False)
    assert res.returncode != 0
    assert "Train.zip" in res.stderr and "Test.zip" in res.stderr


@pytest.mark.slow
def test_train_nmnist_ddp_two_processes_gloo(data_env, tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun, "torchrun is installed with torch"
    out = tmp_path / "ddp"
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", str(EXAMPLES / "train_nmnist.py"),
           *SMALL, "--epochs", "1", "--finetune-epochs", "1", "--out", str(out), "--device", "cpu"]
    res = subprocess.run(cmd, env=data_env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("test accuracy:") == 1  # only rank 0 reports and writes
    assert "integer model agreement: 100.00%" in res.stdout
    hist = json.loads((out / "metrics.json").read_text())["history"]
    assert len(hist) == 1 and 0.0 <= hist[0]["test_acc"] <= 1.0


def test_train_nmnist_binary_weights_export_one_bit(data_env, tmp_path):
    res = _train(data_env, tmp_path / "bin", "--weight-bits", "1", "--epochs", "1",
                 "--finetune-epochs", "1")
    assert "integer model agreement: 100.00%" in res.stdout
    from snnquant.export import load_integer
    desc = load_integer(tmp_path / "bin" / "model_int.safetensors")
    assert {op.weight_bits for op in desc.ops if getattr(op, "weight_bits", None)} == {1}
    bad = _train(data_env, tmp_path / "bad", "--weight-bits", "1", "--weight-quantizer", "ternary",
                 "--epochs", "1", check=False)
    assert bad.returncode == 2 and "--weight-bits 1 --weight-quantizer ternary" in bad.stderr
    bad = _train(data_env, tmp_path / "bad", "--v-bits", "1", "--epochs", "1", check=False)
    assert bad.returncode == 2 and "--v-bits must be" in bad.stderr
