"""The CPU-side logic of benchmarks/bench_neuron_gpu.py (arguments, bandwidth model, targets,
table and files); the measurements themselves need a GPU and are never run by the tests."""

import json
from pathlib import Path

import pytest
import torch
from conftest import load_script

from _repo import needs

pytestmark = needs("benchmarks")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_neuron_gpu.py")


def test_arguments(bench):
    args = bench.parse_args([])
    assert args.T == [4, 16, 64] and args.neurons == [2 ** 16, 2 ** 20, 2 ** 22]
    assert args.dtype == "float32" and args.cases == list(bench.CASES)
    assert len(bench.plan(args)) == 18
    args = bench.parse_args(["--T", "8", "--neurons", "1024", "--cases", "cupy", "torch"])
    assert bench.plan(args) == [(8, 1024, "forward"), (8, 1024, "forward_backward")]
    for bad in (["--T", "0"], ["--repeats", "0"], ["--dtype", "int8"], ["--cases", "jax"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_sanitised_file_names(bench, tmp_path):
    assert bench.sanitise("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert bench.sanitise("NVIDIA GeForce RTX 4090 (rev/a)") == "nvidia_geforce_rtx_4090_rev_a"
    assert bench.sanitise("???") == "unknown_gpu"
    json_path, md_path = bench.result_paths(str(tmp_path), "NVIDIA H200")
    assert json_path.endswith("bench_neuron_gpu_nvidia_h200.json")
    assert md_path.endswith("bench_neuron_gpu_nvidia_h200.md")


def test_bandwidth_model(bench):
    T, N = 16, 1000
    # forward: read x, write spikes (4 B each per element), read v_init, write v_last
    assert bench.bytes_moved("forward", T, N, 4, 4) == 2 * T * N * 4 + 2 * N * 4
    # + H written and read back, spike gradient read, input gradient written, v_init gradient
    # and the step partial sums written
    assert bench.bytes_moved("forward_backward", T, N, 4, 4) == (
        2 * T * N * 4 + 2 * N * 4 + T * N * 4 + T * N * 4 + 2 * T * N * 4 + N * 4 + N * 4)
    # 16-bit storage halves the sequences but H stays float32
    assert bench.bytes_moved("forward_backward", T, N, 2, 4) == (
        2 * T * N * 2 + 2 * N * 2 + 2 * T * N * 4 + 2 * T * N * 2 + N * 2 + N * 4)


def _result(bench, cupy_fb=2.0, cupy_fw=0.5, fraction=0.7):
    rows = []
    for mode, ms in (("forward", cupy_fw), ("forward_backward", cupy_fb)):
        times = {"cupy": ms, "torch": 25.0, "spikingjelly": 2.1, "snntorch": "oom"}
        rows.append({"T": 16, "N": 2 ** 22, "mode": mode, "ms": times,
                     "ratio_to_cupy": {c: t / ms for c, t in times.items()
                                       if c != "cupy" and isinstance(t, float)},
                     "copy_GBps": 3000.0, "cupy_GBps": 3000.0 * fraction,
                     "cupy_copy_fraction": fraction})
    env = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.14.1", "torch_cuda": "13.0",
           "cupy": "14.0.0", "driver": "580.00", "spikingjelly": "2.0.0",
           "spikingjelly_lif_implementation": {"implementation": "triton"}, "snntorch": "1.0.0"}
    return {"dtype": "float32", "cases": list(bench.CASES), "environment": env, "rows": rows,
            "targets": bench.evaluate_targets(rows, "float32")}


def test_targets(bench):
    targets = _result(bench)["targets"]
    assert targets["(a) fwd+bwd speed-up over (b)"]["pass"] is True  # 25 / 2 = 12.5
    assert targets["(a) fwd+bwd time / (c) time"]["value"] == pytest.approx(2.0 / 2.1)
    assert targets["(a) fwd+bwd time / (c) time"]["pass"] is True
    assert targets["(a) forward bandwidth / copy"]["pass"] is True
    slow = _result(bench, cupy_fb=3.0, fraction=0.5)["targets"]
    assert slow["(a) fwd+bwd speed-up over (b)"]["pass"] is False  # 25 / 3 < 10
    assert slow["(a) fwd+bwd time / (c) time"]["pass"] is False  # 3 / 2.1 > 1.15
    assert slow["(a) forward bandwidth / copy"]["pass"] is False
    assert bench.evaluate_targets(_result(bench)["rows"], "float16")[
        "(a) forward bandwidth / copy"]["pass"] is None  # targets are for float32


def test_table_and_files(bench, tmp_path):
    result = _result(bench)
    markdown = bench.format_markdown(result)
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # every row has the header's columns
    assert "(a) snnquant cupy ms" in table[0] and "oom" in markdown
    assert "12.50" in markdown  # (b) / (a) fwd+bwd
    assert "triton" in markdown and "pass" in markdown
    json_path, md_path = bench.write_results(result, str(tmp_path / "results"))
    assert json.loads(Path(json_path).read_text()) == json.loads(json.dumps(result))
    assert Path(md_path).read_text() == markdown
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "bench_neuron_gpu_nvidia_h100_80gb_hbm3.json", "bench_neuron_gpu_nvidia_h100_80gb_hbm3.md"]


def test_dry_run_and_missing_gpu(bench, capsys):
    assert bench.main(["--dry-run", "--T", "4", "--neurons", "64"]) == 0
    out = capsys.readouterr().out
    assert "T=4" in out and "forward_backward" in out
    if not torch.cuda.is_available():
        assert bench.main(["--T", "4", "--neurons", "64"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["torch", "spikingjelly", "snntorch"])
@pytest.mark.parametrize("mode", ["forward", "forward_backward"])
def test_baseline_cases_run_on_cpu(bench, case, mode):
    # the measured closures of the baselines are device-agnostic: run each once on a tiny input
    x = torch.rand(4, 32) * 1.5
    grad = torch.randn(4, 32)
    bench.make_case(case, mode, x, grad, torch.float32)()
    assert x.grad is None  # the closures take gradients with autograd.grad, never accumulate
