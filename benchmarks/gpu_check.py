"""One prepared check of snnquant's CUDA path on a lent GPU, with a dry run for the CPU.

On a CUDA machine, in one call of under 8 minutes with the installation (``gpu_check.sh``):

1. records the GPU, driver, CUDA, torch, CuPy, Triton and SpikingJelly versions;
2. runs the CUDA-marked tests (``pytest -m cuda`` over the test files that carry the marker, in
   ``--test-shards`` parallel processes so that CuPy's compilations overlap) and counts
   passed / failed / skipped from their JUnit files (merged into ``junit_cuda.xml``);
3. trains the example's CSNN (``examples/train_nmnist.py``'s ``build_csnn``, W4/V8) a few steps
   with ``backend='cupy'``, ``'auto'`` and ``'torch'`` from the same seed and data, and checks
   what the tests check between backends: the first step's output spikes identical, its
   gradients within the documented tolerance (rtol = atol = 2e-5); then folds BN, exports each
   with ``to_integer`` and requires 100% integer agreement (the float model on the GPU);
4. times ``QuantLIFNode(v_quant=8, backend='cupy')`` forward + backward against SpikingJelly's
   ``LIFNode`` at T in {4, 16, 64}, 2**22 neurons per step, float32 and float16 (CUDA events,
   warm-up, medians; ``bench_neuron_gpu.make_case`` and ``cuda_time``). SpikingJelly 2.0's
   neurons have no ``backend`` argument: its LIF kernel is chosen by the environment variable
   ``SJ_LIF_CUDA_IMPLEMENTATION`` (auto | cuda | triton | torch), read once per process, so each
   of 'torch', 'triton' and 'cuda' (its native extension, absent from the PyPI wheel) is timed
   in its own process with the variable set; set explicitly, a profile that implementation
   cannot run raises instead of falling back, and ``functional.neuron_implementation`` is
   recorded. SpikingJelly 2.0 has no CuPy backend; the last SpikingJelly that has one
   (0.0.0.0.14, ``LIFNode(backend='cupy')``) is timed too where its wheel was carried
   (``gpu_check.sh --prepare`` puts it in ``.whl/legacy/``; installed apart, in ``--legacy-site``).

It writes ``bench_neuron_gpu.md`` and ``bench_neuron_gpu.json`` into ``--out`` (default
``benchmarks/results``) after every part, so a run cut short still leaves what it measured, with
the pass/fail counts and the targets at T = 16, float32 (QuantLIFNode(v8, cupy) time at most 1.0x
SpikingJelly's cupy LIFNode and at most 1.3x its triton one) stated as met, missed (by how much,
with the kernel profile of QuantLIFNode) or not measured (why).

Dry run (``--dry-run``, chosen by itself, saying so, where ``torch.cuda.is_available()`` is
False; a GPU that is there is hidden from its subprocesses): everything that needs no CUDA runs
on the CPU (the same pytest invocation, where every CUDA test skips and the skips are counted;
the short training and integer export with ``'auto'`` and ``'torch'``; one timing worker process
at tiny sizes, QuantLIFNode with ``backend='torch'`` and SpikingJelly's torch reference, plus the
legacy SpikingJelly's where it is installed) and every part that needed CUDA is listed with the
reason. It writes ``gpu_check_dry_run.md``/``.json`` into ``--out`` (default: a new temporary
folder) and refuses ``benchmarks/results``, so that no CPU figure passes for a GPU one.

Usage here (no GPU): ``python benchmarks/gpu_check.py --dry-run``. On the lent GPU, from a
checkout prepared with ``bash benchmarks/gpu_check.sh --prepare`` (copies ``../shared/wheels``
into ``.whl/`` and downloads the legacy SpikingJelly wheel into ``.whl/legacy/``), one call of
the device tool::

    run(command="set -o pipefail; bash benchmarks/gpu_check.sh --out $OUT 2>&1 | tee $OUT/gpu_check.log",
        carry=[".whl"], timeout_s=480)

then copy ``bench_neuron_gpu.md`` and ``.json`` from the returned files into
``benchmarks/results/`` (``junit_cuda.xml`` and ``gpu_check.log`` hold the details).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside it
from _machine import cpu_name, package_version  # noqa: E402
from _tables import write_atomic  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

#: the issue's timing grid on the GPU, and the tiny one of the dry run
GPU_TIMING = {"T": [4, 16, 64], "N": 2 ** 22, "dtypes": ["float32", "float16"], "warmup": 3,
              "repeats": 15, "max_seconds": 2.0}
DRY_TIMING = {"T": [4, 16], "N": 4096, "dtypes": ["float32", "float16"], "warmup": 1,
              "repeats": 2, "max_seconds": 0.5}
#: the targets at T = 16, float32: QuantLIFNode(v8, cupy) time / baseline time at most this
LEGACY_SPIKINGJELLY = "0.0.0.0.14"
LEGACY_LABEL = f"spikingjelly {LEGACY_SPIKINGJELLY} cupy"
TARGETS = {LEGACY_LABEL: 1.0, "spikingjelly triton": 1.3}
TARGET_T, TARGET_DTYPE = 16, "float32"
#: the tolerance the tests use between backends for gradients (tests/test_kernels_cuda.py)
GRAD_RTOL = GRAD_ATOL = 2e-5
CUDA_MARKER = "pytest.mark." + "cuda"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None,
                        help="folder for the results (default: benchmarks/results on a GPU, a new "
                             "temporary folder in a dry run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU what needs no CUDA and list what was skipped")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="seconds the whole check may take; later parts are cut to fit")
    parser.add_argument("--test-shards", type=int, default=None,
                        help="parallel pytest processes (default: 8 on a GPU, 1 in a dry run)")
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--legacy-site", default=os.environ.get("SNNQUANT_SJ_LEGACY_SITE",
                                                                "/tmp/site_sj_legacy"),
                        help="folder where SpikingJelly 0.0.0.0.14 is installed (pip --target)")
    parser.add_argument("--skip", nargs="+", default=[], choices=("tests", "training", "timing"),
                        help="parts not to run (listed as skipped)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s}")
    if args.test_shards is not None and args.test_shards < 1:
        parser.error(f"--test-shards must be >= 1, got {args.test_shards}")
    if args.train_steps < 1:
        parser.error(f"--train-steps must be >= 1, got {args.train_steps}")
    return args


def _bench_module():
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_neuron_gpu

    return bench_neuron_gpu


class Budget:
    """Seconds left of ``--budget-s``, so that every part ends before the call's limit."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ------------------------------------------------------------------------------------------------
# 1. environment
# ------------------------------------------------------------------------------------------------

def environment(cuda: bool) -> dict:
    """Device, driver and library versions (the GPU's where there is one)."""
    import torch

    bench = _bench_module()
    if cuda:
        env = bench.environment(torch.device("cuda", torch.cuda.current_device()))
        env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    else:
        env = {"gpu": "none (dry run on the CPU)", "cpu": cpu_name(), "torch": torch.__version__,
               "torch_cuda": torch.version.cuda, "python": platform.python_version(),
               "platform": platform.platform(), "driver": bench._nvidia_driver()}
        for name in ("cupy", "triton", "spikingjelly", "snntorch", "snnquant"):
            env[name] = package_version(name)
    env["date_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return env


# ------------------------------------------------------------------------------------------------
# 2. the CUDA-marked tests
# ------------------------------------------------------------------------------------------------

def cuda_test_files() -> list[str]:
    """The test files that carry the CUDA marker (collecting only them keeps the run short)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if CUDA_MARKER in p.read_text(encoding="utf-8"))


def junit_counts(paths) -> dict:
    """Passed / failed / errors / skipped counts, skip reasons and failures from JUnit files."""
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    skip_reasons: dict = {}
    failures = []
    for path in paths:
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            counts["tests"] += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed", "error": "errors"}.get(child.tag, "skipped")
                    message = (child.get("message") or "").strip()
                    if outcome == "skipped":
                        reason = re.sub(r"^Skipped: ", "", message)[:120]
                        skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
                    else:
                        failures.append({"test": name, "message": message[:400],
                                         "output": (child.text or "")[-1500:]})
                    break
            counts[outcome] += 1
    return {**counts, "skip_reasons": skip_reasons, "failures": failures[:30]}


def merge_junit(paths, target: Path) -> None:
    """One JUnit file holding the test suites of all shards."""
    merged = ElementTree.Element("testsuites")
    for path in paths:
        root = ElementTree.parse(path).getroot()
        merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ElementTree.ElementTree(merged).write(target, encoding="utf-8", xml_declaration=True)


def run_cuda_tests(out: Path, shards: int, timeout: float) -> dict:
    """``pytest -m cuda`` over the marked files in ``shards`` processes; counts from JUnit."""
    files = cuda_test_files()
    python = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "cuda"]
    began = time.monotonic()
    if shards == 1:  # one process: no separate collection
        groups, expected = [files], None
    else:  # the test ids dealt round-robin, so that each shard compiles its share of kernels
        collected = subprocess.run(python + ["--collect-only", "-q", *files], cwd=ROOT,
                                   capture_output=True, text=True, timeout=max(timeout, 30))
        ids = [line for line in collected.stdout.splitlines() if "::" in line]
        groups, expected = [ids[k::shards] for k in range(shards)], len(ids)
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_junit_"))
    processes = []
    for k, part in enumerate(groups):
        if not part:
            continue
        log = open(scratch / f"shard{k}.log", "w")
        junit = scratch / f"shard{k}.xml"
        processes.append((subprocess.Popen(python + ["-q", "-rfE", f"--junitxml={junit}", *part],
                                           cwd=ROOT, stdout=log, stderr=subprocess.STDOUT),
                          junit, log))
    timed_out = False
    for process, _junit, log in processes:
        try:
            process.wait(timeout=max(1.0, timeout - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            timed_out = True
            process.kill()
            process.wait()
        log.close()
    junits = [j for _p, j, _l in processes if j.exists()]
    result = junit_counts(junits) if junits else {"tests": 0}
    if junits:
        merge_junit(junits, out / "junit_cuda.xml")
    expected = result["tests"] if expected is None else expected
    result.update(files=files, collected=expected, shards=len(processes),
                  seconds=round(time.monotonic() - began, 1),
                  exit_codes=[p.returncode for p, _j, _l in processes])
    if timed_out or not expected or result["tests"] < expected:
        result["status"] = "incomplete"
        result["reason"] = (f"{result['tests']} of {expected} tests reported within "
                            f"{timeout:.0f} s")
        result["log_tail"] = "".join((scratch / f"shard{k}.log").read_text()[-800:]
                                     for k in range(len(processes)))
    else:
        bad = result["failed"] + result["errors"]
        result["status"] = "failed" if bad else "passed"
    shutil.rmtree(scratch, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------------------------
# 3. the example's network: a few training steps per backend, integer export
# ------------------------------------------------------------------------------------------------

def _event_frames(generator, shape, density):
    import torch

    return ((torch.rand(shape, generator=generator) < density).float()
            * torch.randint(1, 3, shape, generator=generator))


def train_backend(backend: str, device, x, y, steps: int) -> dict:
    """Train the example's W4/V8 CSNN ``steps`` steps with ``backend``; record what is compared."""
    import torch
    import torch.nn.functional as F
    from spikingjelly.activation_based import functional as sjf
    from spikingjelly.activation_based.neuron import BaseNode

    import snnquant

    torch.manual_seed(0)
    import _nmnist_common

    net = _nmnist_common.example().build_csnn(channels=8, tau=2.0)
    model, _ = snnquant.quantize_model(net, snnquant.QuantConfig(weight_bits=4, v_bits=8,
                                                                 backend=backend))
    model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    record = {"losses": [], "spikes": {}}
    def keep_spikes(name):
        def hook(_module, _inputs, out):  # returns None: the output itself is not replaced
            record["spikes"][name] = out.detach().cpu()
        return hook

    hooks = [m.register_forward_hook(keep_spikes(n))  # removed after the first step
             for n, m in model.named_modules() if isinstance(m, BaseNode)]
    for step in range(steps):
        sjf.reset_net(model)
        out = model(x)
        loss = F.mse_loss(out.float().mean(0), F.one_hot(y, 10).float())
        opt.zero_grad()
        loss.backward()
        if step == 0:
            for hook in hooks:
                hook.remove()
            record["grads"] = {n: p.grad.detach().cpu().clone()
                               for n, p in model.named_parameters() if p.grad is not None}
        record["losses"].append(float(loss.detach()))
        opt.step()
    record["step0_rates"] = {n: float(s.float().mean()) for n, s in record["spikes"].items()}
    record["params"] = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    record["model"] = model
    return record


def integer_export_agreement(model, x_calibrate, x_test, device) -> dict:
    """Fold BN (statistics of the data), export with ``to_integer``, compare on ``device``."""
    import torch
    from spikingjelly.activation_based import functional as sjf

    from snnquant.export import IntegerSNN, compare_integer, fold_batchnorm, to_integer

    with torch.no_grad():  # a few steps leave BN's running statistics at their start values
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()
                module.momentum = None
        sjf.reset_net(model)
        model(x_calibrate.to(device))
    model.eval()
    sjf.reset_net(model)
    folded = fold_batchnorm(model.cpu())
    desc = to_integer(folded)
    agreement = compare_integer(folded, x_test, desc, device=device)
    _, layers = IntegerSNN(desc)(x_test.to(torch.int64), record=True)
    return {"agreement": float(agreement.samples), "samples": int(x_test.shape[1]),
            "first_mismatch": agreement.first_mismatch,
            "reference_dtype": str(desc.reference_dtype),
            "integer_spike_rates": {n: float(s.float().mean()) for n, s in layers.items()}}


def check_training(device: str, backends, steps: int) -> dict:
    """Backends against ``'torch'`` on the example's network, and each one's integer export."""
    import torch

    from snnquant.kernels import resolve_backend

    if device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    generator = torch.Generator().manual_seed(0)
    x = _event_frames(generator, (6, 8, 2, 34, 34), 0.3)
    y = torch.arange(8) % 10
    x_test = _event_frames(generator, (6, 16, 2, 34, 34), 0.3)
    runs = {b: train_backend(b, device, x, y, steps) for b in backends}
    reference = runs["torch"]
    result = {"device": device, "steps": steps, "backends": {},
              "network": "the example's build_csnn(channels=8, tau=2), W4/V8, T=6, batch 8, "
                         "Adam(lr=1e-2)"}
    ok = True
    for backend, run in runs.items():
        entry = {"resolves_to": resolve_backend(backend, x.to(device)),
                 "losses": run["losses"], "step0_spike_rates": run["step0_rates"]}
        if backend != "torch":
            entry["step0_spikes_identical"] = all(
                torch.equal(s, reference["spikes"][n]) for n, s in run["spikes"].items())
            grad_bad = []
            worst = 0.0
            for name, grad in run["grads"].items():
                want = reference["grads"][name]
                worst = max(worst, float((grad - want).abs().max()))
                if not torch.allclose(grad, want, rtol=GRAD_RTOL, atol=GRAD_ATOL):
                    grad_bad.append(name)
            entry["step0_grads_within_tolerance"] = not grad_bad
            entry["step0_grads_outside_tolerance"] = grad_bad
            entry["step0_grad_max_abs_diff"] = worst
            entry["params_max_abs_diff_after_steps"] = max(
                float((p - reference["params"][n]).abs().max()) for n, p in run["params"].items())
            ok = ok and entry["step0_spikes_identical"] and not grad_bad
        entry["integer_export"] = integer_export_agreement(run["model"], x, x_test, device)
        ok = ok and entry["integer_export"]["agreement"] == 1.0
        result["backends"][backend] = entry
    result["status"] = "passed" if ok else "failed"
    return result


# ------------------------------------------------------------------------------------------------
# 4. timing: one worker process per SpikingJelly implementation
# ------------------------------------------------------------------------------------------------

def timing_plan(cuda: bool, legacy_site: str) -> tuple[list, list]:
    """The worker processes to start and the timing cases skipped (with the reason)."""
    quantlif = {"label": "snnquant QuantLIFNode(v8, cupy)", "case": "quantlif",
                "backend": "cupy"}
    skipped = []
    if not cuda:
        quantlif = {"label": "snnquant QuantLIFNode(v8, torch) [CPU stand-in]",
                    "case": "quantlif", "backend": "torch"}
        skipped.append({"part": "timing of QuantLIFNode(v8, backend='cupy')",
                        "reason": "no CUDA device: the dry run times backend='torch' instead"})
    workers = [
        {"env": {"SJ_LIF_CUDA_IMPLEMENTATION": "triton"},
         "cases": [quantlif, {"label": "spikingjelly triton", "case": "spikingjelly",
                              "implementation": "triton"}], "profile": True},
        {"env": {"SJ_LIF_CUDA_IMPLEMENTATION": "torch"},
         "cases": [{"label": "spikingjelly torch", "case": "spikingjelly",
                    "implementation": "torch"}]},
        {"env": {"SJ_LIF_CUDA_IMPLEMENTATION": "cuda"},
         "cases": [{"label": "spikingjelly cuda (native)", "case": "spikingjelly",
                    "implementation": "cuda"}]},
    ]
    if not cuda:  # on the CPU, each would run the same torch reference: one process checks it
        workers = [{"env": {"SJ_LIF_CUDA_IMPLEMENTATION": "torch"},
                    "cases": [quantlif, workers[1]["cases"][0]]}]
        skipped.append({"part": "SpikingJelly 2.0 LIF implementations triton and cuda (native), "
                                "each in its own process",
                        "reason": "no CUDA device: on the CPU SpikingJelly always runs its "
                                  "torch reference, whatever SJ_LIF_CUDA_IMPLEMENTATION says"})
    if (Path(legacy_site) / "spikingjelly").is_dir():  # second: the first target needs it
        workers.insert(1, {"env": {}, "pythonpath": legacy_site, "legacy": True,
                        "cases": [{"label": LEGACY_LABEL if cuda else
                                   f"spikingjelly {LEGACY_SPIKINGJELLY} torch [CPU stand-in]",
                                   "case": "spikingjelly",
                                   "backend": "cupy" if cuda else "torch"}]})
        if not cuda:
            skipped.append({"part": f"SpikingJelly {LEGACY_SPIKINGJELLY} LIFNode(backend='cupy')",
                            "reason": "no CUDA device: the dry run times its backend='torch'"})
    else:
        skipped.append({"part": f"SpikingJelly {LEGACY_SPIKINGJELLY} LIFNode(backend='cupy')",
                        "label": LEGACY_LABEL,
                        "reason": f"not installed in --legacy-site {legacy_site} (gpu_check.sh "
                                  "--prepare carries its wheel in .whl/legacy/)"})
    return workers, skipped


def run_worker(spec_path: str) -> int:
    """Inside a timing worker process: time the spec's cases, write the JSON the spec names."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    bench = _bench_module()
    device = torch.device(spec["device"])
    result = {"cases": {}, "spikingjelly_file": None}
    try:
        import spikingjelly

        result["spikingjelly_file"] = spikingjelly.__file__
        result["spikingjelly_version"] = package_version("spikingjelly")
    except Exception as error:
        result["spikingjelly_file"] = f"import failed: {type(error).__name__}: {error}"
    for case in spec["cases"]:
        entry = result["cases"].setdefault(case["label"], {"rows": []})
        if case.get("backend"):
            entry["backend"] = case["backend"]
        if case.get("implementation"):
            entry["requested_implementation"] = case["implementation"]
            try:
                from spikingjelly.activation_based import functional as sjf

                entry["implementation"] = sjf.neuron_implementation("lif", device)
            except Exception as error:
                entry["unavailable"] = f"{type(error).__name__}: {error}"[:600]
                continue
        for dtype_name in spec["dtypes"]:
            dtype = getattr(torch, dtype_name)
            for T in spec["T"]:
                row = {"T": T, "N": spec["N"], "dtype": dtype_name}
                generator = torch.Generator(device=device).manual_seed(0)
                try:
                    x = (torch.rand((T, spec["N"]), generator=generator, device=device)
                         * 1.5).to(dtype)
                    grad = torch.randn((T, spec["N"]), generator=generator,
                                       device=device).to(dtype)
                    call = bench.make_case(case["case"], "forward_backward", x, grad, dtype,
                                           backend=case.get("backend"))
                    row["ms"] = bench.time_call(call, device, spec["warmup"], spec["repeats"],
                                                spec["max_seconds"])
                    if (spec.get("profile") and case["case"] == "quantlif" and T == TARGET_T
                            and dtype_name == TARGET_DTYPE):
                        entry["profile"] = kernel_profile(call)
                        entry["profile_bytes_moved"] = bench.bytes_moved(
                            "forward_backward", T, spec["N"], x.element_size(), 4)
                        entry["copy_GBps"] = bench.copy_bandwidth(
                            T * spec["N"] * x.element_size(), device, 2, 10)
                        entry["profile_GBps"] = entry["profile_bytes_moved"] / (
                            row["ms"] * 1e-3) / 1e9
                except Exception as error:  # recorded with the row, the others still run
                    row["error"] = f"{type(error).__name__}: {error}"[:400]
                entry["rows"].append(row)
                write_atomic(Path(spec["out"]), json.dumps(result, indent=2))  # kept if killed
                print(f"  {case['label']} {dtype_name} T={T}: "
                      f"{row.get('ms', row.get('error'))}", flush=True)
                x = grad = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if case.get("implementation"):
            from spikingjelly.activation_based import functional as sjf

            entry["implementation_after"] = sjf.neuron_implementation("lif", device)
    write_atomic(Path(spec["out"]), json.dumps(result, indent=2))
    return 0


def kernel_profile(call, top: int = 8) -> list:
    """The GPU kernels of three calls, by total device time (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    rows = [{"name": e.key[:90], "calls": e.count,
             "device_us_per_call": e.self_device_time_total / 3}
            for e in kernels or events]  # the kernels themselves where the profiler tells them
    rows.sort(key=lambda r: -r["device_us_per_call"])
    return rows[:top]


def run_timing(cuda: bool, legacy_site: str, budget: Budget) -> dict:
    """Start the timing workers one after the other; merge their rows."""
    grid = GPU_TIMING if cuda else DRY_TIMING
    workers, skipped = timing_plan(cuda, legacy_site)
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_timing_"))
    merged = {"grid": grid, "cases": {}, "workers": []}
    for k, worker in enumerate(workers):  # one at a time: each timing runs alone
        spec = {"device": "cuda" if cuda else "cpu", "cases": worker["cases"],
                "profile": worker.get("profile", False), "out": str(scratch / f"w{k}.json"),
                **{key: grid[key] for key in ("T", "N", "dtypes", "warmup", "repeats",
                                              "max_seconds")}}
        spec_path = scratch / f"w{k}.spec.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, **worker["env"])
        if worker.get("legacy"):  # only the legacy SpikingJelly, not the 2.0 of the main install
            env["PYTHONPATH"] = os.pathsep.join([worker["pythonpath"], str(ROOT)])
        record = {"cases": [c["label"] for c in worker["cases"]], "env": worker["env"],
                  "pythonpath": env.get("PYTHONPATH", "")}
        merged["workers"].append(record)
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
        _finish_worker(record, _start_worker(record, command, env, budget), budget)
        _merge_worker(merged, record, Path(spec["out"]))
    shutil.rmtree(scratch, ignore_errors=True)
    for skip in skipped:
        if cuda and "label" in skip:
            merged["cases"].setdefault(skip["label"], {"rows": [], "unavailable": skip["reason"]})
    merged["targets"] = evaluate_targets(merged["cases"], cuda)
    merged["skipped"] = skipped
    merged["status"] = "measured" if cuda else "dry run (CPU, tiny sizes: not a measurement)"
    return merged


def _start_worker(record: dict, command, env, budget: Budget):
    if budget.left() < 25:
        record["status"] = "not run: the time budget is spent"
        return None
    record["began"] = time.monotonic()
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish_worker(record: dict, process, budget: Budget) -> None:
    if process is None:
        return
    try:
        stdout, stderr = process.communicate(timeout=max(1.0, budget.left() - 5))
        record["exit_code"] = process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        record["exit_code"] = "killed: the time budget is spent"
    print(stdout, end="", flush=True)
    if process.returncode:
        record["stderr_tail"] = stderr[-2000:]
    record["seconds"] = round(time.monotonic() - record.pop("began"), 1)


def _merge_worker(merged: dict, record: dict, out_file: Path) -> None:
    if out_file.exists():  # all rows, or those measured before the worker was stopped
        data = json.loads(out_file.read_text())
        record["spikingjelly_file"] = data.get("spikingjelly_file")
        record["spikingjelly_version"] = data.get("spikingjelly_version")
        merged["cases"].update(data["cases"])
    else:
        why = record.get("status") or (f"the worker ended with {record.get('exit_code')}: "
                                       f"{record.get('stderr_tail', '')[-300:]}")
        for label in record["cases"]:
            merged["cases"][label] = {"rows": [], "unavailable": why}


def _ms(cases: dict, label: str, T: int, dtype: str):
    for row in cases.get(label, {}).get("rows", []):
        if row["T"] == T and row["dtype"] == dtype:
            return row.get("ms")
    return None


def evaluate_targets(cases: dict, cuda: bool) -> dict:
    """Each target: ratio, met / missed (by how much) / not measured (why)."""
    ours = _ms(cases, "snnquant QuantLIFNode(v8, cupy)", TARGET_T, TARGET_DTYPE)
    result = {}
    for baseline, limit in TARGETS.items():
        theirs = _ms(cases, baseline, TARGET_T, TARGET_DTYPE)
        entry = {"limit": limit, "baseline": baseline, "T": TARGET_T, "dtype": TARGET_DTYPE}
        if not cuda:
            entry.update(status="not measured", reason="dry run: no CUDA device")
        elif ours is None or theirs is None:
            missing = [name for name, v in (("QuantLIFNode(v8, cupy)", ours), (baseline, theirs))
                       if v is None]
            reason = cases.get(baseline, {}).get("unavailable")
            entry.update(status="not measured",
                         reason=f"no measurement of {', '.join(missing)}"
                                + (f" ({reason})" if reason else ""))
        else:
            ratio = ours / theirs
            entry.update(ratio=ratio, quantlif_ms=ours, baseline_ms=theirs,
                         status="met" if ratio <= limit else "missed")
            if ratio > limit:
                entry["missed_by"] = ratio - limit
        result[f"QuantLIFNode(v8, cupy) / {baseline}"] = entry
    return result


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------

def format_markdown(report: dict) -> str:
    env = report["environment"]
    dry = report["mode"] == "dry-run"
    title = ("# GPU check: DRY RUN on the CPU (no GPU figures)" if dry
             else f"# GPU check of the CUDA path: {env.get('gpu')}")
    lines = [title, ""]
    if dry:
        lines += ["Nothing here was measured on a GPU: the times are of tiny CPU runs that only "
                  "check the code path.", ""]
    lines += [f"{env.get('date_utc')} UTC; GPU {env.get('gpu')}"
              + (f" (compute capability {env['compute_capability']})"
                 if "compute_capability" in env else "")
              + f", driver {env.get('driver')}, torch {env.get('torch')} (CUDA "
              f"{env.get('torch_cuda')}), CuPy {env.get('cupy')}, Triton {env.get('triton')}, "
              f"SpikingJelly {env.get('spikingjelly')}, snnquant {env.get('snnquant')}, Python "
              f"{env.get('python')}.", "", f"Command: `{report['command']}`", "", "## Tests", ""]
    tests = report["parts"].get("tests", {})
    if "passed" in tests:
        lines.append(f"`pytest -m cuda` ({', '.join(tests.get('files', []))}; "
                     f"{tests.get('shards')} processes, {tests.get('seconds')} s): "
                     f"**{tests['passed']} passed, {tests['failed']} failed, {tests['errors']} "
                     f"errors, {tests['skipped']} skipped** of {tests['tests']} "
                     f"({tests.get('status')}).")
        for reason, n in tests.get("skip_reasons", {}).items():
            lines.append(f"- skipped {n}: {reason}")
        for failure in tests.get("failures", [])[:10]:
            lines.append(f"- FAILED {failure['test']}: {failure['message'][:200]}")
    else:
        lines.append(f"{tests.get('status')}: {tests.get('reason')}")
    lines += ["", "## Training the example's network, integer export", ""]
    training = report["parts"].get("training", {})
    if "backends" in training:
        lines.append(f"{training['network']}, {training['steps']} steps on {training['device']}"
                     f" ({training['status']}); compared with backend='torch'.")
        lines += ["", "| backend | runs as | losses | step-1 spike rates | step-1 spikes identical "
                  "(every LIF layer) | step-1 gradients within 2e-5 | integer agreement |",
                  "|---|---|---|---|---|---|---|"]
        for name, entry in training["backends"].items():
            spikes = entry.get("step0_spikes_identical", "reference")
            grads = entry.get("step0_grads_within_tolerance", "reference")
            if "step0_grad_max_abs_diff" in entry:
                grads = f"{grads} (max diff {entry['step0_grad_max_abs_diff']:.2e})"
            export = entry["integer_export"]
            lines.append(f"| {name} | {entry['resolves_to']} | "
                         f"{', '.join(f'{v:.4f}' for v in entry['losses'])} | "
                         f"{', '.join(f'{v:.3f}' for v in entry['step0_spike_rates'].values())} | "
                         f"{spikes} | "
                         f"{grads} | {export['agreement'] * 100:.2f}% of "
                         f"{export['samples']} (spike rates "
                         f"{', '.join(f'{v:.3f}' for v in export['integer_spike_rates'].values())})"
                         " |")
    else:
        lines.append(f"{training.get('status')}: {training.get('reason')}")
    lines += ["", "## Forward + backward time", ""]
    timing = report["parts"].get("timing", {})
    if "cases" in timing:
        grid = timing["grid"]
        lines.append(f"{timing['status']}; {grid['N']} neurons per step; median ms "
                     f"({'CUDA events' if not dry else 'wall clock'}, {grid['warmup']} warm-up, "
                     f"up to {grid['repeats']} timed calls); each SpikingJelly implementation "
                     "in its own process.")
        lines += ["", "| case | implementation | " + " | ".join(
            f"{d} T={t}" for d in grid["dtypes"] for t in grid["T"]) + " |",
            "|---|---|" + "---|" * (len(grid["dtypes"]) * len(grid["T"]))]
        for label, entry in timing["cases"].items():
            impl = (entry.get("implementation", {}).get("implementation")
                    or (f"backend={entry['backend']}" if "backend" in entry else "-"))
            if "unavailable" in entry:
                impl = "unavailable"
            cells = []
            for d in grid["dtypes"]:
                for t in grid["T"]:
                    row = next((r for r in entry["rows"] if r["T"] == t and r["dtype"] == d),
                               None)
                    cells.append("-" if row is None else
                                 (f"{row['ms']:.3f}" if "ms" in row else "error"))
            lines.append(f"| {label} | {impl} | " + " | ".join(cells) + " |")
        for label, entry in timing["cases"].items():
            if "unavailable" in entry:
                lines.append(f"\n{label}: unavailable: {entry['unavailable'][:300]}")
            for row in entry["rows"]:
                if "error" in row:
                    lines.append(f"\n{label} {row['dtype']} T={row['T']}: {row['error'][:300]}")
        lines += ["", "### Targets (T = 16, float32)", ""]
        for name, target in timing["targets"].items():
            text = f"- {name} <= {target['limit']}: **{target['status']}**"
            if "ratio" in target:
                text += f" ({target['ratio']:.3f}: {target['quantlif_ms']:.3f} ms / " \
                        f"{target['baseline_ms']:.3f} ms)"
            if "missed_by" in target:
                text += f", over the limit by {target['missed_by']:.3f}"
            if "reason" in target:
                text += f": {target['reason']}"
            lines.append(text)
        profile = next((e for e in timing["cases"].values() if "profile" in e), None)
        if profile:
            lines += ["", f"Kernel profile of QuantLIFNode(v8, cupy), T = 16, float32 "
                      f"({profile['profile_GBps']:.0f} GB/s by the fused kernels' byte count, "
                      f"device copy {profile['copy_GBps']:.0f} GB/s):", "",
                      "| kernel | launches per forward + backward | device us per forward + "
                      "backward |", "|---|---|---|"]
            lines += [f"| {r['name']} | {r['calls'] / 3:g} | {r['device_us_per_call']:.1f} |"
                      for r in profile["profile"]]
    else:
        lines.append(f"{timing.get('status')}: {timing.get('reason')}")
    if report["skipped"]:
        lines += ["", "## Skipped", ""]
        lines += [f"- {s['part']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    stem = "gpu_check_dry_run" if report["mode"] == "dry-run" else "bench_neuron_gpu"
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    write_atomic(json_path, json.dumps(report, indent=2, default=str))
    write_atomic(md_path, format_markdown(report))
    return json_path, md_path


def output_folder(requested: Optional[str], dry: bool) -> Path:
    """``--out``, or the default; a dry run never writes into benchmarks/results."""
    if requested is None:
        return Path(tempfile.mkdtemp(prefix="gpu_check_dry_run_")) if dry else RESULTS
    out = Path(requested).resolve()
    if dry and out == RESULTS.resolve():
        raise SystemExit(f"--out {requested}: a dry run does not write into benchmarks/results "
                         "(its CPU times must not pass for GPU figures); give another folder")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(tempfile.gettempdir(), "cupy_cache"))
    import torch

    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    if not cuda and not args.dry_run:
        print("no CUDA device here (torch.cuda.is_available() is False): running the dry run; "
              "nothing is measured on a GPU", flush=True)
    if dry and cuda:  # the subprocesses (tests, timing workers) must not use it either
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    out = output_folder(args.out, dry)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    report = {"mode": "dry-run" if dry else "gpu",
              "command": " ".join(["python", "benchmarks/gpu_check.py", *(argv if argv is not None
                                                                          else sys.argv[1:])]),
              "environment": environment(cuda and not dry), "parts": {}, "skipped": []}
    device = "cuda" if (cuda and not dry) else "cpu"
    write_report(report, out)

    def part(name, run):
        if name in args.skip:
            report["parts"][name] = {"status": "skipped", "reason": "--skip " + name}
            report["skipped"].append({"part": name, "reason": "--skip " + name})
        else:
            print(f"== {name} ({budget.left():.0f} s of the budget left)", flush=True)
            began = time.monotonic()
            try:
                report["parts"][name] = run()
            except Exception as error:  # one broken part must not lose the others' results
                import traceback

                report["parts"][name] = {"status": "error",
                                         "reason": f"{type(error).__name__}: {error}",
                                         "traceback": traceback.format_exc()[-3000:]}
            report["parts"][name]["seconds"] = round(time.monotonic() - began, 1)
            print(f"   {name}: {report['parts'][name].get('status')}", flush=True)
        write_report(report, out)

    shards = args.test_shards or (1 if dry else 8)
    part("tests", lambda: run_cuda_tests(out, shards,
                                         max(30.0, min(240.0, budget.left() - 150))))
    backends = ("torch", "cupy", "auto") if not dry else ("torch", "auto")
    if dry:
        why = "no CUDA device" if not cuda else "--dry-run (the GPU hidden from subprocesses)"
        report["skipped"] += [
            {"part": "running the CUDA-marked tests",
             "reason": f"{why}: pytest skipped each of them (counted under Tests)"},
            {"part": "training with backend='cupy', integer agreement of the float model on CUDA",
             "reason": f"{why}: the dry run trains with 'torch' and 'auto' on the CPU"}]
    part("training", lambda: check_training(device, backends, args.train_steps))
    part("timing", lambda: run_timing(not dry, args.legacy_site, budget))
    report["skipped"].extend(report["parts"]["timing"].get("skipped", []))
    report["seconds"] = round(args.budget_s - budget.left(), 1)
    json_path, md_path = write_report(report, out)
    print(format_markdown(report))
    print(f"wrote {json_path} and {md_path}")
    failed = [n for n, p in report["parts"].items() if p.get("status") in ("failed", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
