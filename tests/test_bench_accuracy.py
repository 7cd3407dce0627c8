"""The accuracy benchmarks of PTQ, binary/ternary weights and mixed precision run end to end in
their --quick mode (tiny data, one epoch, results not written); the real numbers are in
benchmarks/results/ and are never produced by the tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

from _repo import needs

pytestmark = needs("benchmarks")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("script,extra,expect", [
    ("accuracy_binary_ternary.py", [], ["| binary W1/V8 |", "| ternary W2/V8 |",
                                        "100.00% (100.00..100.00)"]),
    ("accuracy_ptq.py", ["--skip-qat"], ["| W8/V16 PTQ |", "| W2/V4 PTQ + 3 fine-tuning"]),
    ("mixed_precision.py", [], ["| mixed hessian @ budget 1 |", "| mixed measured @ budget 2 |",
                                "| uniform W4/V4 |", "| uniform W3/V4 |", "Bits chosen",
                                "Verdict, budget 1: best uniform", "Verdict, budget 2:",
                                "deployed | mean (std)"]),
    ("calibration_methods.py", [], ["| W4/V8 PTQ firing |", "| W2/V4 PTQ mse |", "Target: firing"]),
    ("fold_in_training.py", ["--configs", "W2/V4", "FP"],
     ["| W2/V4 |", "| full precision |", "W2/V4: deployed = trained within 0.5 point: met"]),
])
@pytest.mark.heavy
def test_accuracy_benchmark_quick(script, extra, expect, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", SNNQUANT_DATA=str(tmp_path / "data"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "results"
    cache = tmp_path / "fp"
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out),
           "--fp-cache", str(cache), *extra]
    for attempt in range(2):  # the second run loads the full-precision network from the cache
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        for text in expect:
            assert text in res.stdout, text
        if script == "mixed_precision.py":
            break
    assert ("loaded" in res.stdout) == (script != "mixed_precision.py")
    assert len(list(cache.glob("fp_builtin_quick_*.pt"))) == 1
    assert not out.exists()  # --quick writes no results


def _mixed_results(path, seeds, rows, epochs=30, digest="d1"):
    import json
    mixed = "mixed hessian @ budget 1"
    assignments = [dict(seed=s, fp_acc=0.98, mixed={mixed: dict(
        bits={"0 (weight)": 4}, bytes=90.0, predicted_delta_loss=0.0)}) for s in seeds]
    budgets = [dict(index=1, fraction=0.5, bytes=100.0, uniform=["uniform W3/V8"], mixed=[mixed])]
    deployed = {name: [v - 0.1 for v in values] for name, values in rows.items()}
    command = "benchmarks/mixed_precision.py --seeds " + " ".join(map(str, seeds))
    path.write_text(json.dumps(dict(epochs=epochs, seeds=seeds, seeds_asked=seeds,
                                    data="built-in digits (N-MNIST format)", rows=rows,
                                    deployed=deployed, budgets=budgets, finetune_epochs=1,
                                    assignments=assignments, command=command, data_sha256=digest,
                                    machine={"torch": "x"}, finished="then")))
    return str(path)


def test_mixed_precision_combines_seeds_run_apart(tmp_path):
    mixed = "mixed hessian @ budget 1"
    a = _mixed_results(tmp_path / "a.json", [3, 1], {mixed: [0.5, 0.7], "uniform W3/V8": [0.6, 0.6]})
    b = _mixed_results(tmp_path / "b.json", [2], {mixed: [0.6], "uniform W3/V8": [0.6]})
    out = tmp_path / "out"
    script = str(ROOT / "benchmarks" / "mixed_precision.py")
    res = subprocess.run([sys.executable, script, "--combine", a, b, "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    import json
    data = json.loads((out / "mixed_precision.json").read_text())
    assert data["seeds"] == [1, 2, 3]  # in seed order, each row with its own seed
    assert data["rows"][mixed] == [0.7, 0.6, 0.5]
    assert data["deployed"][mixed] == pytest.approx([0.6, 0.5, 0.4])
    assert "| 60.00% (50.00..70.00) | 60.00% (10.00) | +0.00 | 1 / 1 / 1 |" in res.stdout
    # deployed side by side, and the verdict against the target on the deployed medians
    assert ("| 60.00% (50.00..70.00) | 60.00% (10.00) | +0.00 | 1 / 1 / 1 | "
            "50.00% (40.00..60.00) | 50.00% (10.00) | +0.00 | 1 / 1 / 1 |") in res.stdout
    assert "Verdict, budget 1: best uniform W3/V8 50.00% deployed (median)" in res.stdout
    assert "missed by 1.00 points" in res.stdout and data["verdicts"][0]["met"] is False
    # the command each seed was measured with is kept, in the file and under the table
    assert [(p["seeds"], p["command"]) for p in data["parts"]] == [
        ([3, 1], "benchmarks/mixed_precision.py --seeds 3 1"),
        ([2], "benchmarks/mixed_precision.py --seeds 2")]
    assert "`benchmarks/mixed_precision.py --seeds 2` (seed 2)" in res.stdout
    assert "`benchmarks/mixed_precision.py --seeds 3 1` (seeds 3, 1)" in res.stdout
    assert data["data_sha256"] == "d1"
    # the same seed twice, or results of another training length, are refused by name
    res = subprocess.run([sys.executable, script, "--combine", a, a, "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "seed 3 is in both" in res.stderr
    c = _mixed_results(tmp_path / "c.json", [5], {mixed: [0.6], "uniform W3/V8": [0.6]}, epochs=1)
    res = subprocess.run([sys.executable, script, "--combine", a, c, "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "c.json" in res.stderr and "epochs" in res.stderr
    # seeds measured on other data (the built-in data generated differently) are refused
    d = _mixed_results(tmp_path / "d.json", [6], {mixed: [0.6], "uniform W3/V8": [0.6]}, digest="d2")
    res = subprocess.run([sys.executable, script, "--combine", a, d, "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "different data" in res.stderr and "d2 in seeds [6]" in res.stderr


def _benchmark_module(name):
    """A module of benchmarks/."""
    return load_script(f"benchmarks/{name}.py", f"bench_{name}")


@pytest.mark.parametrize("script", ["_nmnist_common.py", "accuracy_nmnist_real.py"])
def test_benchmarks_record_the_installed_spikingjelly_version(script):
    # SpikingJelly 2.0.0 has no __version__: the version comes from the installed distribution
    from importlib.metadata import version
    info = _benchmark_module(script[:-3]).machine()
    assert info["spikingjelly"] == version("spikingjelly")
    assert info["cpu"]  # a rerun on another CPU model need not train bit-identical networks


def test_data_digest_changes_with_one_event_count(tmp_path):
    import numpy as np
    from types import SimpleNamespace
    common = _benchmark_module("_nmnist_common")

    def digest(train, test):  # a fresh Bench each time: a Bench computes its digest once
        return common.Bench.data_sha256(SimpleNamespace(train_set=SimpleNamespace(samples=train),
                                                        test_set=SimpleNamespace(samples=test)))

    samples = []
    for i in range(3):
        np.savez(tmp_path / f"{i}.npz", frames=np.full((2, 2, 3, 3), i, dtype=np.float32))
        samples.append((str(tmp_path / f"{i}.npz"), i))
    first = digest(samples[:2], samples[2:])
    assert first == digest(samples[:2], samples[2:])
    frames = np.full((2, 2, 3, 3), 1, dtype=np.float32)
    frames[1, 0, 2, 2] += 1
    np.savez(tmp_path / "1.npz", frames=frames)
    assert digest(samples[:2], samples[2:]) != first
    # the same frames under another label, or moved from train to test, are other data too
    np.savez(tmp_path / "1.npz", frames=np.full((2, 2, 3, 3), 1, dtype=np.float32))
    relabelled = digest([samples[0], (samples[1][0], 5)], samples[2:])
    moved = digest(samples[:1], samples[1:])
    assert len({first, relabelled, moved}) == 3


def test_full_precision_cache_is_keyed_by_the_data(tmp_path):
    # a network trained on other data (another generator version, another root) is never reused
    common = _benchmark_module("_nmnist_common")
    from types import SimpleNamespace
    names = set()
    for digest in ("a" * 64, "b" * 64):
        bench = object.__new__(common.Bench)
        bench.args = SimpleNamespace(T=8, channels=16, tau=2.0, seed=0)
        bench.data_root, bench.quick, bench.fp_cache, bench._data_sha256 = None, False, str(tmp_path), digest
        names.add(os.path.basename(bench.fp_cache_file(3, 30, 2e-3)))
    assert names == {"fp_builtin_aaaaaaaaaaaa_T8_e30_s3_c16_tau2_lr0.002.pt",
                     "fp_builtin_bbbbbbbbbbbb_T8_e30_s3_c16_tau2_lr0.002.pt"}
