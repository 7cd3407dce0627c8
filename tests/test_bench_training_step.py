"""The logic of benchmarks/bench_training_step.py and bench_neuron_processes.py (arguments, the
folded layer before issue 46, targets, tables); the timings themselves are never run here."""
import copy

import pytest
import torch
from conftest import csnn, load_script
from spikingjelly.activation_based import functional as sjf

from _repo import needs
from snnquant import QuantConfig, quantize_model

pytestmark = needs("benchmarks")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_training_step.py")


@pytest.fixture(scope="module")
def processes():
    return load_script("benchmarks/bench_neuron_processes.py")


def test_arguments(bench):
    args = bench.parse_args([])
    assert (args.threads, args.runs, args.csnn_T, args.csnn_batch, args.sdt_T, args.sdt_batch,
            args.embed, args.depth) == (2, 3, 10, 32, 4, 16, 64, 2)
    assert args.network_list == ["csnn", "sdt"]
    for bad in (["--runs", "0"], ["--networks", "resnet"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_the_layer_before_issue_46_trains_the_same_values_up_to_rounding(bench):
    """The reference the benchmark profiles (the output divided by s) and today's layer (the
    weight divided by s): the same currents and gradients up to float rounding."""
    torch.manual_seed(0)
    q, _ = quantize_model(csnn(8, head_batchnorm=True), QuantConfig(weight_bits=4, v_bits=8))
    before = bench.with_output_division(copy.deepcopy(q))
    x = (torch.rand(4, 2, 2, 16, 16, generator=torch.Generator().manual_seed(1)) > 0.7).float()
    outs = []
    for net in (q.train(), before.train()):
        sjf.reset_net(net)
        current = net[0](x)
        (current * torch.linspace(-1, 1, current.numel()).reshape(current.shape)).sum().backward()
        outs.append((current.detach(), net[0].weight.grad.clone(), net[1].weight.grad.clone()))
    for now, then in zip(*outs):   # sums of T * N * H * W terms: rounding relative to their size
        torch.testing.assert_close(now, then, rtol=1e-4, atol=1e-4 * float(then.abs().max()))


def test_targets_and_table(bench, tmp_path):
    def s(v):
        return {"median": v, "spread": 0.1, "runs": [v] * 3}
    group = {"input": [10, 32, 2, 34, 34], "ms": {"unquantized": s(100.0), "W4/V8": s(55.0)},
             "ratio_to_unquantized": {"W4/V8": s(0.55)},
             "profile": {"W4/V8": {"self_cpu_ms_per_step": 50.0, "division_ops_share": 0.01,
                                   "top": [{"op": "aten::mkldnn_convolution", "share": 0.3}]}}}
    env = {k: "x" for k in ("cpu", "logical_cpus", "threads", "torch", "spikingjelly",
                            "snnquant", "default_backend", "python", "date_utc", "command")}
    result = {"quick": False, "runs": 3, "repeats": 7, "environment": env,
              "networks": {"csnn": group, "sdt": dict(group, ratio_to_unquantized={
                  "W4/V8": s(0.95)})}}
    result["targets"] = bench.targets(result)
    assert result["targets"]["csnn"]["pass"] is True and result["targets"]["sdt"]["pass"] is False
    text = bench.format_markdown(result)
    assert "0.55 (±10%)" in text and "aten::mkldnn_convolution 30%" in text
    json_path, md_path = bench.write_results(result, str(tmp_path), quick=False)
    assert md_path.endswith("bench_training_step.md")


def test_processes_summary_names_the_slow_ones(processes, tmp_path):
    args = processes.parse_args(["--env", "OMP_WAIT_POLICY=PASSIVE"])
    assert args.processes == 20 and args.env_pairs == {"OMP_WAIT_POLICY": "PASSIVE"}
    with pytest.raises(SystemExit):
        processes.parse_args(["--env", "NOVALUE"])
    rows = [{"ms": {processes.CPP: v, processes.LIF: 30.0}, "ratio_to_lif": v / 30.0,
             "openmp_libraries": ["/x/libgomp.so.1"], "affinity": [0, 1]}
            for v in (8.0, 9.0, 10.0, 29.0)]
    s = processes.summarise(rows)
    assert s["slow_processes"] == [3] and not s["targets"]["no_process_above_1.5x_median"]
    assert s["ratio_to_lif_median"] == pytest.approx(9.5 / 30.0)
    result = {"quick": False, "shape": "16x64x4096", "threads": 2, "repeats": 11, "cpu": "x",
              "logical_cpus": 2, "child_environment": {}, "command": "c", "date_utc": "d",
              "processes": rows, "summary": s}
    text = processes.format_markdown(result)
    assert "| 3 (slow) | 29.0 | 30.0 | 0.97 | libgomp.so.1 | [0, 1] |" in text
