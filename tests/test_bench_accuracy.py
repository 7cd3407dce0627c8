"""The accuracy benchmarks of PTQ, binary/ternary weights and mixed precision run end to end in
their --quick mode (tiny data, one epoch, results not written); the real numbers are in
benchmarks/results/ and are never produced by the tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("script,extra,expect", [
    ("accuracy_binary_ternary.py", [], ["| binary W1/V8 |", "| ternary W2/V8 |",
                                        "100.00% (100.00..100.00)"]),
    ("accuracy_ptq.py", ["--skip-qat"], ["| W8/V16 PTQ |", "| W2/V4 PTQ + 3 fine-tuning"]),
    ("mixed_precision.py", [], ["| mixed (assign_bits", "| uniform W4/V4 |", "Bits chosen"]),
])
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
