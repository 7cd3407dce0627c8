"""The logic of benchmarks/bench_neuron_cpu.py (arguments, statistics, targets, table, files); the
timings themselves are never run by the tests."""

import json
from pathlib import Path

import pytest
from conftest import load_script

from _repo import needs

pytestmark = needs("benchmarks")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_neuron_cpu.py")


def test_arguments(bench):
    args = bench.parse_args([])
    assert args.threads == 2 and args.runs == 3
    assert args.shape_list == [(16, 64, 4096), (64, 64, 4096), (16, 256, 4096)]
    assert max(n * f for _, n, f in args.shape_list) == 2 ** 20  # a 1 Mi-neuron layer
    quick = bench.parse_args(["--quick"])
    assert quick.runs == 1 and max(t * n * f for t, n, f in quick.shape_list) < 10_000
    for bad in (["--runs", "0"], ["--shapes", "16x64"], ["--shapes", "ax1x1"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_interleaved_median_of_runs_and_ratio(bench):
    calls = []
    per_run = bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                runs=3, repeats=4, warmup=1)
    assert calls[:4] == ["a", "b", "a", "b"]  # interleaved call by call
    assert len(calls) == 3 * (1 + 4) * 2 and all(len(v) == 3 for v in per_run.values())
    s = bench.summary([1.0, 2.0, 4.0], 1e3)
    assert s["median"] == 2000.0 and s["spread"] == pytest.approx(1.5)
    r = bench.ratio({"x": [1.0, 2.0, 3.0], "y": [2.0, 2.0, 2.0]}, "x", "y")
    assert r["median"] == 1.0 and r["runs"] == [0.5, 1.0, 1.5]


def _fake_result(cpp_ratio):
    def s(value):
        return {"median": value, "spread": 0.05, "runs": [value] * 3}
    neuron = {"T": 16, "N": 64, "features": 4096, "neurons": 2 ** 18, "errors": {},
              "saved_for_backward_bytes": {"snnquant cpp": 2 ** 24, "spikingjelly LIFNode": 2 ** 26},
              "forward_backward": {"snnquant cpp": s(10.0), "spikingjelly LIFNode": s(25.0)},
              "forward": {"snnquant cpp": s(2.0), "spikingjelly LIFNode": s(10.0)},
              "forward_backward_ratio_to_lif": {"snnquant cpp": s(cpp_ratio)},
              "forward_ratio_to_lif": {"snnquant cpp": s(0.2)}}
    train = {"T": 16, "batch": 32, "channels": 16, "input": [2, 34, 34], "default_backend": "auto",
             "ms": {"unquantized": s(100.0), "W4/V8 default backend (auto)": s(90.0)},
             "ratio_to_unquantized": {"W4/V8 default backend (auto)": s(0.9)},
             "default_label": "W4/V8 default backend (auto)"}
    env = {k: "x" for k in ("cpu", "logical_cpus", "threads", "torch", "spikingjelly",
                            "spikingjelly_lif_implementation", "snnquant", "python", "compiler",
                            "date_utc", "command")}
    result = {"quick": False, "runs": 3, "repeats": 11, "environment": env, "neuron": [neuron],
              "train_step": train,
              "deploy": {"T": 16, "batch": 64, "samples_per_second": {"IntegerSNN": s(500.0)},
                         "c_runtime": {"skipped": "no to_c"}}}
    return result


def test_targets_table_and_files(bench, tmp_path):
    result = _fake_result(0.4)
    result["targets"] = bench.targets(result)
    assert result["targets"]["cpp_fwd_bwd_over_lif"]["pass"] is True
    assert result["targets"]["torch_fwd_bwd_over_lif"]["pass"] is None  # not measured
    assert result["targets"]["csnn_default_over_unquantized"]["pass"] is True
    slow = _fake_result(0.6)
    assert bench.targets(slow)["cpp_fwd_bwd_over_lif"]["pass"] is False
    markdown = bench.format_markdown(result)
    assert "10.0 (±5%)" in markdown and "no to_c" in markdown and "Command:" in markdown
    json_path, md_path = bench.write_results(result, str(tmp_path), quick=False)
    assert json.loads(Path(json_path).read_text()) == json.loads(json.dumps(result))
    assert Path(md_path).read_text() == markdown
    assert Path(json_path).name == "bench_neuron_cpu.json"
    quick_json, _ = bench.write_results(result, str(tmp_path), quick=True)
    assert Path(quick_json).name == "bench_neuron_cpu_quick.json"
