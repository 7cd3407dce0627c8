"""What ``benchmarks/gpu_check.py`` runs on the device: the environment it records, the
CUDA-marked tests, the example's network trained with each backend and exported to integers, and
the timing workers (one process per SpikingJelly implementation). torch is imported where used,
so that the entry can set the environment (cuBLAS, CuPy cache) before anything touches CUDA."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _gpu_check_report import (LEGACY_LABEL, LEGACY_SPIKINGJELLY, TARGET_DTYPE, TARGET_T,
                               evaluate_targets, junit_counts, merge_junit)
from _machine import cpu_name, package_version
from _tables import write_atomic

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the entry a timing worker process runs (``gpu_check.py --worker SPEC``)
ENTRY = HERE / "gpu_check.py"

#: the issue's timing grid on the GPU, and the tiny one of the dry run
GPU_TIMING = {"T": [4, 16, 64], "N": 2 ** 22, "dtypes": ["float32", "float16"], "warmup": 3,
              "repeats": 15, "max_seconds": 2.0}
DRY_TIMING = {"T": [4, 16], "N": 4096, "dtypes": ["float32", "float16"], "warmup": 1,
              "repeats": 2, "max_seconds": 0.5}
#: the tolerance the tests use between backends for gradients (tests/test_kernels_cuda.py)
GRAD_RTOL = GRAD_ATOL = 2e-5
#: what marks a test that needs CUDA (spelled apart, so that this file does not carry it)
CUDA_MARKER = "pytest.mark." + "cuda"


def _bench_module():
    """``benchmarks/bench_neuron_gpu.py``, whose cases and timers the check uses."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_neuron_gpu

    return bench_neuron_gpu


class Budget:
    """Seconds left of ``--budget-s``, so that every part ends before the call's limit."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds until the end of the budget (negative once it is spent)."""
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
        command = [sys.executable, str(ENTRY), "--worker", str(spec_path)]
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
