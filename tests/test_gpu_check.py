"""benchmarks/gpu_check.py: its CPU dry run end to end, the wrapper's offline install line, and
the logic that turns runs into the report (JUnit counts, targets, where files may go)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
WRAPPER = ROOT / "benchmarks" / "gpu_check.sh"
DEVICE_README = ROOT.parent / "shared" / "device" / "README.md"
#: the install line of the device README (../shared/device/README.md, beside the checkout)
INSTALL_LINE = ("python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "
                ".whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1;")


@pytest.fixture(scope="module")
def check():
    return load_script("benchmarks/gpu_check.py")


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path):
    results_before = sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir())
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path),
                           "--legacy-site", str(tmp_path / "no_legacy")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # only the dry run's files, and none in benchmarks/results
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu_check_dry_run.json", "gpu_check_dry_run.md", "junit_cuda.xml"]
    assert sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir()) == results_before
    report = json.loads((tmp_path / "gpu_check_dry_run.json").read_text())
    assert report["mode"] == "dry-run"
    parts = report["parts"]

    tests = parts["tests"]  # every CUDA-marked test ran through pytest and skipped
    assert "tests/test_kernels_cuda.py" in tests["files"]
    assert tests["tests"] > 250 and tests["skipped"] == tests["tests"]
    assert tests["passed"] == tests["failed"] == tests["errors"] == 0
    assert tests["status"] == "passed" and tests["collected"] == tests["tests"]
    assert sum(tests["skip_reasons"].values()) == tests["tests"]

    training = parts["training"]  # the CPU version of the short training and export
    assert training["status"] == "passed" and training["device"] == "cpu"
    assert sorted(training["backends"]) == ["auto", "torch"]
    auto = training["backends"]["auto"]
    assert auto["step0_spikes_identical"] and auto["step0_grads_within_tolerance"]
    assert len(auto["losses"]) == training["steps"]
    for entry in training["backends"].values():
        assert entry["integer_export"]["agreement"] == 1.0
        assert all(r > 0 for r in entry["integer_export"]["integer_spike_rates"].values())

    timing = parts["timing"]  # the harness at tiny sizes, one process per implementation
    assert timing["status"].startswith("dry run")
    assert [w["env"] for w in timing["workers"]] == [{"SJ_LIF_CUDA_IMPLEMENTATION": "torch"}]
    assert sorted(timing["cases"]) == ["snnquant QuantLIFNode(v8, torch) [CPU stand-in]",
                                       "spikingjelly torch"]
    assert all(w["exit_code"] == 0 for w in timing["workers"])
    for label, entry in timing["cases"].items():
        assert len(entry["rows"]) == len(timing["grid"]["T"]) * len(timing["grid"]["dtypes"])
        assert all(isinstance(row["ms"], float) for row in entry["rows"]), label
    assert timing["cases"]["spikingjelly torch"]["implementation"]["implementation"] == \
        "torch-reference"
    assert all(t["status"] == "not measured" for t in timing["targets"].values())

    skipped = " | ".join(f"{s['part']}: {s['reason']}" for s in report["skipped"])
    for expected in ("running the CUDA-marked tests", "backend='cupy'",
                     "timing of QuantLIFNode(v8, backend='cupy')",
                     "SpikingJelly 2.0 LIF implementations triton and cuda",
                     "SpikingJelly 0.0.0.0.14"):
        assert expected in skipped
    assert skipped.count("no CUDA device") >= 4
    markdown = (tmp_path / "gpu_check_dry_run.md").read_text()
    assert markdown.startswith("# GPU check: DRY RUN on the CPU (no GPU figures)")
    assert f"{tests['skipped']} skipped" in markdown and "## Skipped" in markdown
    if not torch.cuda.is_available():
        assert "no CUDA device" in markdown


def test_wrapper_installs_as_the_device_readme_says():
    if DEVICE_README.exists():
        readme_lines = [line.strip() for line in DEVICE_README.read_text().splitlines()
                        if "pip install" in line]
        assert INSTALL_LINE in readme_lines
    wrapper = WRAPPER.read_text()
    assert INSTALL_LINE in [line.strip() for line in wrapper.splitlines()]
    assert "benchmarks/gpu_check.py" in wrapper.splitlines()[-1]


def test_device_call_in_the_docstring(check):
    command = re.search(r'run\(command="(.+?)",\s*carry=\[(.+?)\], timeout_s=(\d+)\)',
                        check.__doc__, re.S)
    assert command, "the docstring gives the device call"
    assert len(command.group(1)) < 2000 and "gpu_check.sh --out $OUT" in command.group(1)
    assert command.group(2) == '".whl"'
    assert 400 <= int(command.group(3)) <= 600
    assert check.parse_args([]).budget_s + 30 < int(command.group(3))  # install + slack


def test_junit_counts_and_merge(check, tmp_path):
    shard = """<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="4">
    <testcase classname="tests.a" name="ok"/>
    <testcase classname="tests.a" name="bad"><failure message="assert 1 == 2">trace</failure>
    </testcase>
    <testcase classname="tests.a" name="broken"><error message="fixture">trace</error></testcase>
    <testcase classname="tests.a" name="gpu"><skipped message="no CUDA device"/></testcase>
    </testsuite></testsuites>"""
    paths = [tmp_path / "a.xml", tmp_path / "b.xml"]
    for path in paths:
        path.write_text(shard)
    counts = check.junit_counts(paths)
    assert {k: counts[k] for k in ("tests", "passed", "failed", "errors", "skipped")} == {
        "tests": 8, "passed": 2, "failed": 2, "errors": 2, "skipped": 2}
    assert counts["skip_reasons"] == {"no CUDA device": 2}
    assert counts["failures"][0]["test"] == "tests.a::bad"
    check.merge_junit(paths, tmp_path / "merged.xml")
    assert check.junit_counts([tmp_path / "merged.xml"])["tests"] == 8


def test_targets(check):
    def cases(ours, cupy, triton):
        def rows(ms):
            return {"rows": [{"T": 16, "dtype": "float32", "ms": ms}]}
        return {"snnquant QuantLIFNode(v8, cupy)": rows(ours),
                "spikingjelly 0.0.0.0.14 cupy": rows(cupy), "spikingjelly triton": rows(triton)}

    met = check.evaluate_targets(cases(1.0, 1.0, 0.8), cuda=True)
    assert [t["status"] for t in met.values()] == ["met", "met"]  # 1.0 <= 1.0, 1.25 <= 1.3
    missed = check.evaluate_targets(cases(2.0, 1.0, 1.0), cuda=True)
    entry = missed["QuantLIFNode(v8, cupy) / spikingjelly triton"]
    assert entry["status"] == "missed" and entry["missed_by"] == pytest.approx(0.7)
    absent = cases(1.0, 1.0, 1.0)
    absent["spikingjelly 0.0.0.0.14 cupy"] = {"rows": [], "unavailable": "not installed"}
    entry = check.evaluate_targets(absent, cuda=True)[
        "QuantLIFNode(v8, cupy) / spikingjelly 0.0.0.0.14 cupy"]
    assert entry["status"] == "not measured" and "not installed" in entry["reason"]
    assert all(t["reason"] == "dry run: no CUDA device"
               for t in check.evaluate_targets(cases(1.0, 1.0, 1.0), cuda=False).values())


def test_dry_run_never_writes_into_results(check, tmp_path):
    with pytest.raises(SystemExit, match="does not write into benchmarks/results"):
        check.output_folder(str(ROOT / "benchmarks" / "results"), dry=True)
    assert check.output_folder(None, dry=False) == ROOT / "benchmarks" / "results"
    assert check.output_folder(str(tmp_path), dry=True) == tmp_path.resolve()
    for bad in (["--budget-s", "0"], ["--test-shards", "0"], ["--skip", "gpu"]):
        with pytest.raises(SystemExit):
            check.parse_args(bad)


def test_timing_plan(check, tmp_path):
    workers, skipped = check.timing_plan(cuda=True, legacy_site=str(tmp_path))
    assert [w["env"] for w in workers] == [{"SJ_LIF_CUDA_IMPLEMENTATION": name}
                                           for name in ("triton", "torch", "cuda")]
    assert workers[0]["cases"][0] == {"label": "snnquant QuantLIFNode(v8, cupy)",
                                      "case": "quantlif", "backend": "cupy"}
    assert [s["part"] for s in skipped] == ["SpikingJelly 0.0.0.0.14 LIFNode(backend='cupy')"]
    (tmp_path / "spikingjelly").mkdir()
    workers, skipped = check.timing_plan(cuda=True, legacy_site=str(tmp_path))
    assert workers[1]["legacy"] and workers[1]["pythonpath"] == str(tmp_path)
    assert workers[1]["cases"][0] == {"label": "spikingjelly 0.0.0.0.14 cupy",
                                       "case": "spikingjelly", "backend": "cupy"}
    assert not skipped


@pytest.mark.parametrize("mode", ["forward", "forward_backward"])
def test_quantlif_case_runs_on_cpu(check, mode):
    bench = check._bench_module()
    x = torch.rand(4, 32) * 1.5
    bench.make_case("quantlif", mode, x, torch.randn(4, 32), torch.float32, backend="torch")()
    assert bench.time_call(lambda: None, torch.device("cpu"), 1, 3, 1.0) >= 0.0


def test_gpu_report_layout(check, tmp_path):
    # the layout of a GPU report, from a hand-made run (the figures are placeholders of the test)
    rows = [{"T": t, "N": 8, "dtype": d, "ms": 1.0} for d in ("float32", "float16")
            for t in (4, 16, 64)]
    cases = {"snnquant QuantLIFNode(v8, cupy)": {
                 "rows": rows, "backend": "cupy", "copy_GBps": 10.0, "profile_GBps": 5.0,
                 "profile": [{"name": "quant_neuron_forward", "calls": 3,
                              "device_us_per_call": 2.0}]},
             "spikingjelly triton": {"rows": rows, "implementation": {"implementation": "triton"}},
             "spikingjelly cuda (native)": {"rows": [], "unavailable": "RuntimeError: none"},
             "spikingjelly 0.0.0.0.14 cupy": {"rows": rows[:1] + [dict(rows[1], ms=None,
                                                                      error="OOM")]}}
    del cases["spikingjelly 0.0.0.0.14 cupy"]["rows"][1]["ms"]
    timing = {"grid": check.GPU_TIMING, "cases": cases, "status": "measured",
              "targets": check.evaluate_targets(cases, cuda=True)}
    report = {"mode": "gpu", "command": "python benchmarks/gpu_check.py", "skipped": [],
              "environment": {"gpu": "GPU name", "compute_capability": "9.0"},
              "parts": {"tests": {"status": "passed", "tests": 1, "passed": 1, "failed": 0,
                                  "errors": 0, "skipped": 0, "files": ["tests/x.py"]},
                        "training": {"status": "error", "reason": "broken"}, "timing": timing}}
    json_path, md_path = check.write_report(report, tmp_path)
    assert (json_path.name, md_path.name) == ("bench_neuron_gpu.json", "bench_neuron_gpu.md")
    markdown = md_path.read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| spikingjelly")]
    assert len({line.count("|") for line in table}) == 1 and len(table) == 3
    assert "| spikingjelly cuda (native) | unavailable |" in markdown
    assert "**1 passed, 0 failed, 0 errors, 0 skipped**" in markdown
    assert "error: broken" in markdown and "float32 T=16: OOM" in markdown
    assert "quant_neuron_forward" in markdown and "**met**" in markdown
    assert "spikingjelly 0.0.0.0.14 cupy <= 1.0: **not measured**" in markdown
