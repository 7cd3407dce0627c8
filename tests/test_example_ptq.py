"""examples/train_nmnist.py --ptq: quantize a trained full-precision checkpoint without retraining."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from _repo import needs

pytestmark = needs("examples")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = ["--samples-per-class", "3", "-T", "4", "--batch-size", "8", "--channels", "4"]


def run(env, *args, check=True):
    cmd = [sys.executable, str(ROOT / "examples" / "train_nmnist.py"), *SMALL, *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@pytest.mark.heavy
@pytest.mark.slow
def test_ptq_flag(tmp_path):
    env = dict(os.environ, SNNQUANT_DATA=str(tmp_path / "data"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run(env, "--weight-bits", "0", "--v-bits", "0", "--epochs", "1", "--out", str(tmp_path / "fp"))
    ckpt = tmp_path / "fp" / "model.pt"
    res = run(env, "--ptq", str(ckpt), "--weight-bits", "4", "--v-bits", "8",
              "--finetune-epochs", "1", "--calib-batches", "2", "--out", str(tmp_path / "ptq"))
    assert "calibration (mse, 2 batches)" in res.stdout
    assert "PTQ W4/V8" in res.stdout and "PTQ + 1 fine-tuning epochs" in res.stdout
    assert "integer model agreement: 100.00%" in res.stdout
    result = json.loads((tmp_path / "ptq" / "ptq.json").read_text())["result"]
    assert 0 <= result["ptq_test_acc"] <= 1 and len(result["finetune"]) == 1
    assert (tmp_path / "ptq" / "model_int.safetensors").stat().st_size > 0
    bad = run(env, "--ptq", str(tmp_path / "missing.pt"), check=False)
    assert bad.returncode != 0 and "missing.pt" in bad.stderr
    bad = run(env, "--ptq", str(ckpt), "--weight-bits", "0", check=False)
    assert bad.returncode != 0 and "--ptq" in bad.stderr
