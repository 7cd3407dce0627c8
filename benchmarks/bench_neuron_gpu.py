"""GPU benchmark of the fused quantized-membrane neuron kernels.

For T in {4, 16, 64} and N in {2**16, 2**20, 2**22} neurons (float32 by default), times with CUDA
events, after warm-up, the forward (under ``torch.no_grad``) and the forward+backward (backward
from a fixed upstream gradient of the spikes; a learnable step where there is one) of:

  (a) snnquant cupy backend: ``snnquant.kernels.fused_quant_neuron_multi_step`` (LIF, 8-bit
      membrane: step 2**-6, levels [-128, 127], Sigmoid surrogate, learnable step);
  (b) snnquant torch backend: ``snnquant.functional.neuron.quant_neuron_multi_step``, same
      arguments;
  (c) SpikingJelly 2.0 ``neuron.LIFNode(step_mode='m')``, unquantized, with whatever
      implementation SpikingJelly picks on CUDA (recorded from
      ``functional.neuron_implementation('lif', device)``);
  (d) snntorch ``Leaky(beta=0.5, state_quant=quant.state_quant(8))`` stepped over T in Python.

``make_case('quantlif', ...)`` also times the module ``QuantLIFNode(v_quant=8, backend='cupy')``
(used by ``benchmarks/gpu_check.py``, which times it against SpikingJelly's implementations one by
one). It reports milliseconds (median), the ratio of each case's time to (a)'s, and the bandwidth (a)
achieves (bytes it must read and write / time) as a fraction of a device-to-device copy of the
same size on the same GPU. Targets at T=16, N=2**22, float32: (a) >= 10x faster than (b) for
forward+backward, (a) <= 1.15x (c), (a)'s forward >= 60% of copy bandwidth.

Writes ``benchmarks/results/bench_neuron_gpu_<gpu>.json`` and ``.md`` (named after the GPU) and
prints the table. ``--dry-run`` prints the plan and exits without touching a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from typing import Callable, Optional

# the shared modules beside it, also when imported as benchmarks.bench_neuron_gpu (gpu_check.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import package_version, use_checkout  # noqa: E402
from _tables import RESULTS, write_atomic  # noqa: E402

use_checkout()

CASES = ("cupy", "torch", "spikingjelly", "snntorch")
CASE_LABELS = {
    "cupy": "(a) snnquant cupy",
    "torch": "(b) snnquant torch",
    "spikingjelly": "(c) SpikingJelly LIFNode",
    "snntorch": "(d) snntorch Leaky+state_quant",
}
MODES = ("forward", "forward_backward")
DTYPES = ("float32", "float16", "bfloat16", "float64")
TARGET = {"T": 16, "N": 2 ** 22, "dtype": "float32", "speedup_over_torch": 10.0,
          "max_ratio_to_spikingjelly": 1.15, "min_copy_bandwidth_fraction": 0.60}
# the quantized membrane of (a) and (b): 8 bits, range [-2, 2) around the threshold 1.0
STEP, QMIN, QMAX = 2.0 ** -6, -128, 127


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, nargs="+", default=[4, 16, 64], help="time steps")
    parser.add_argument("--neurons", type=int, nargs="+", default=[2 ** 16, 2 ** 20, 2 ** 22],
                        help="neurons per time step")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls (median reported)")
    parser.add_argument("--max-seconds", type=float, default=3.0,
                        help="stop repeating a case after this long (slow baselines)")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit (no GPU needed)")
    args = parser.parse_args(argv)
    for name in ("T", "neurons"):
        bad = [v for v in getattr(args, name) if v <= 0]
        if bad:
            parser.error(f"--{name} must be positive, got {bad}")
    if args.warmup < 0 or args.repeats < 1:
        parser.error(f"--warmup must be >= 0 and --repeats >= 1, got {args.warmup}, "
                     f"{args.repeats}")
    return args


def sanitise(name: str) -> str:
    """A file-name-safe form of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3'."""
    cleaned = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return cleaned or "unknown_gpu"


def result_paths(out_dir: str, gpu_name: str) -> tuple[str, str]:
    stem = os.path.join(out_dir, f"bench_neuron_gpu_{sanitise(gpu_name)}")
    return stem + ".json", stem + ".md"


def bytes_moved(case_mode: str, T: int, N: int, itemsize: int, compute_itemsize: int) -> int:
    """Bytes the fused kernels must read and write (the bandwidth model of case (a)).

    forward (no grad): read x, write spikes (T*N each), read v_init, write v_last (N each).
    forward_backward: the forward also writes H (compute dtype); the backward reads H and the
    spike gradient, writes the input gradient, v_init's gradient and the step's per-neuron
    partial sums (no upstream gradient of v_last here). The grad-mode forward also writes
    v_last, counted once in ``forward``.
    """
    seq, state = T * N * itemsize, N * itemsize
    forward = 2 * seq + 2 * state
    if case_mode == "forward":
        return forward
    h_seq = T * N * compute_itemsize
    backward = h_seq + 2 * seq + state + N * compute_itemsize
    return forward + h_seq + backward


def format_markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"# Fused quantized neuron, {env['gpu']} ({result['dtype']})",
        "",
        f"torch {env['torch']}, CUDA {env['torch_cuda']}, CuPy {env['cupy']}, driver "
        f"{env['driver']}, SpikingJelly {env['spikingjelly']} (LIF implementation on CUDA: "
        f"{env['spikingjelly_lif_implementation']}), snntorch {env['snntorch']}.",
        "Times in ms (median, CUDA events, after warm-up); ratios are time / time of (a); "
        "(a) GB/s counts the bytes the fused kernels must read and write; copy GB/s is a "
        "device-to-device copy of the input's size.",
        "",
    ]
    others = [c for c in result["cases"] if c != "cupy"]
    columns = (["T", "neurons", "mode"] + [f"{CASE_LABELS[c]} ms" for c in result["cases"]]
               + [f"{CASE_LABELS[c]} / (a)" for c in others]
               + ["copy GB/s", "(a) GB/s", "(a) / copy"])
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in result["rows"]:
        cells = [str(row["T"]), str(row["N"]), row["mode"]]
        cells += [_fmt(row["ms"].get(c), ".3f") for c in result["cases"]]
        cells += [_fmt(row["ratio_to_cupy"].get(c), ".2f") for c in others]
        cells += [_fmt(row.get("copy_GBps"), ".0f"), _fmt(row.get("cupy_GBps"), ".0f"),
                  _fmt(row.get("cupy_copy_fraction"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Targets (T=16, N=2**22, float32):", ""]
    for name, check in result.get("targets", {}).items():
        status = "n/a" if check["pass"] is None else ("pass" if check["pass"] else "FAIL")
        lines.append(f"- {name}: {_fmt(check['value'], '.3f')} (target {check['target']}): "
                     f"{status}")
    return "\n".join(lines) + "\n"


def _fmt(value, spec: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return format(value, spec)


def evaluate_targets(rows: list, dtype: str) -> dict:
    """The three targets, from the measured rows (``pass`` is None where a number is missing)."""
    def find(mode):
        for row in rows:
            if row["T"] == TARGET["T"] and row["N"] == TARGET["N"] and row["mode"] == mode:
                return row
        return None

    applicable = dtype == TARGET["dtype"]
    fb, fw = find("forward_backward"), find("forward")
    speedup = fb["ratio_to_cupy"].get("torch") if fb and applicable else None
    vs_sj = fb["ratio_to_cupy"].get("spikingjelly") if fb and applicable else None
    vs_sj = 1.0 / vs_sj if isinstance(vs_sj, float) and vs_sj > 0 else None
    fraction = fw.get("cupy_copy_fraction") if fw and applicable else None
    def check(value, target, ok):
        return {"value": value, "target": target, "pass": None if value is None else ok(value)}

    return {
        "(a) fwd+bwd speed-up over (b)": check(speedup, ">= 10",
                                               lambda v: v >= TARGET["speedup_over_torch"]),
        "(a) fwd+bwd time / (c) time": check(vs_sj, "<= 1.15",
                                             lambda v: v <= TARGET["max_ratio_to_spikingjelly"]),
        "(a) forward bandwidth / copy": check(fraction, ">= 0.60",
                                              lambda v: v >= TARGET["min_copy_bandwidth_fraction"]),
    }


def write_results(result: dict, out_dir: str) -> tuple[str, str]:
    """Write the JSON and markdown files atomically; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    json_path, md_path = result_paths(out_dir, result["environment"]["gpu"])
    write_atomic(json_path, json.dumps(result, indent=2))
    write_atomic(md_path, format_markdown(result))
    return json_path, md_path


def plan(args) -> list[tuple[int, int, str]]:
    return [(T, N, mode) for T in args.T for N in args.neurons for mode in MODES]


# ------------------------------------------------------------------------------------------------
# GPU part
# ------------------------------------------------------------------------------------------------

def environment(device) -> dict:
    import torch

    env = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "python": platform.python_version(),
           "platform": platform.platform()}
    try:
        import cupy

        env["cupy"] = cupy.__version__
        env["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        driver = cupy.cuda.runtime.driverGetVersion()
        env["driver_cuda_version"] = driver
    except Exception as error:  # CuPy missing: (a) is skipped, recorded why
        env["cupy"] = f"unavailable ({type(error).__name__}: {error})"
    env["driver"] = _nvidia_driver()
    env["spikingjelly"] = package_version("spikingjelly")
    env["snntorch"] = package_version("snntorch")
    env["snnquant"] = package_version("snnquant")
    env["triton"] = package_version("triton")
    try:
        from spikingjelly.activation_based import functional as sjf

        env["spikingjelly_lif_implementation"] = sjf.neuron_implementation("lif", device)
    except Exception as error:
        env["spikingjelly_lif_implementation"] = f"unknown ({type(error).__name__}: {error})"
    return env


def _nvidia_driver() -> str:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30)
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def cuda_time(fn: Callable[[], None], warmup: int, repeats: int, max_seconds: float) -> float:
    """Median milliseconds of ``fn`` measured with CUDA events, after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    began = time.perf_counter()
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if time.perf_counter() - began > max_seconds and len(times) >= 3:
            break
    return statistics.median(times)


def cpu_time(fn: Callable[[], None], warmup: int, repeats: int, max_seconds: float) -> float:
    """Median milliseconds of ``fn`` by the wall clock, after ``warmup`` calls (CPU tensors)."""
    for _ in range(warmup):
        fn()
    times = []
    began = time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() - began > max_seconds and len(times) >= 3:
            break
    return statistics.median(times)


def time_call(fn: Callable[[], None], device, warmup: int, repeats: int,
              max_seconds: float) -> float:
    """Median milliseconds of ``fn``: CUDA events on a CUDA ``device``, the wall clock on a CPU."""
    timer = cuda_time if str(device).startswith("cuda") else cpu_time
    return timer(fn, warmup, repeats, max_seconds)


def copy_bandwidth(n_bytes: int, device, warmup: int, repeats: int) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write) for a buffer of ``n_bytes``."""
    import torch

    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = cuda_time(lambda: dst.copy_(src), warmup, repeats, 5.0)
    return 2 * n_bytes / (ms * 1e-3) / 1e9  # the buffers go with this frame


def _module_call(node, x, grad, train: bool):
    """One timed call of a neuron module: reset, then forward (and backward when ``train``)."""
    import torch
    from spikingjelly.activation_based import functional as sjf

    def call():
        sjf.reset_net(node)
        if train:
            xi = x.detach().requires_grad_()
            torch.autograd.grad(node(xi), xi, grad)
        else:
            with torch.no_grad():
                node(x)
    return call


def make_case(case: str, mode: str, x, grad, dtype, backend: Optional[str] = None):
    """A closure running one measured call of ``case`` in ``mode`` on input ``x``.

    ``case`` is one of :data:`CASES` or ``'quantlif'``: the module
    ``snnquant.nn.QuantLIFNode(v_quant=8, tau=2, step_mode='m', backend=backend or 'cupy')``.
    For ``'spikingjelly'``, ``backend`` is passed to ``LIFNode`` (SpikingJelly before 2.0, whose
    neurons take one); ``None`` builds SpikingJelly 2.0's ``LIFNode``, which has no such argument.
    """
    import torch

    device = x.device
    train = mode == "forward_backward"
    if case == "quantlif":
        from spikingjelly.activation_based import surrogate

        from snnquant.nn import QuantLIFNode

        node = QuantLIFNode(tau=2.0, v_reset=0.0, surrogate_function=surrogate.Sigmoid(4.0),
                            step_mode="m", v_quant=8, backend=backend or "cupy").to(device)
        return _module_call(node, x, grad, train)
    if case in ("cupy", "torch"):
        if case == "cupy":
            from snnquant.kernels import fused_quant_neuron_multi_step as run
        else:
            from snnquant.functional.neuron import quant_neuron_multi_step as run
        from spikingjelly.activation_based import surrogate

        sg = surrogate.Sigmoid(alpha=4.0)
        step = torch.tensor(STEP, device=device, requires_grad=True)
        v_init = torch.zeros((), dtype=dtype, device=device)

        def call():
            if train:
                xi = x.detach().requires_grad_()
                spikes = run(xi, v_init, neuron="lif", tau=2.0, v_reset=0.0,
                             surrogate_function=sg, step=step, qmin=QMIN, qmax=QMAX)[0]
                torch.autograd.grad(spikes, (xi, step), grad)
            else:
                with torch.no_grad():
                    run(x, v_init, neuron="lif", tau=2.0, v_reset=0.0, surrogate_function=sg,
                        step=step.detach(), qmin=QMIN, qmax=QMAX)
        return call
    if case == "spikingjelly":
        from spikingjelly.activation_based import neuron, surrogate

        extra = {} if backend is None else {"backend": backend}
        node = neuron.LIFNode(tau=2.0, v_reset=0.0, surrogate_function=surrogate.Sigmoid(4.0),
                              step_mode="m", **extra).to(device)
        return _module_call(node, x, grad, train)
    if case == "snntorch":
        import snntorch
        from snntorch.functional import quant

        leaky = snntorch.Leaky(beta=0.5, threshold=1.0,
                               state_quant=quant.state_quant(num_bits=8, uniform=True,
                                                             threshold=1.0)).to(device)

        def run_steps(xi):
            mem = leaky.init_leaky()
            spikes = []
            for t in range(xi.shape[0]):
                spk, mem = leaky(xi[t], mem)
                spikes.append(spk)
            return torch.stack(spikes)

        def call():
            if train:
                xi = x.detach().requires_grad_()
                torch.autograd.grad(run_steps(xi), xi, grad)
            else:
                with torch.no_grad():
                    run_steps(x)
        return call
    raise ValueError(f"unknown case {case!r}")


def measure(args) -> dict:
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, args.dtype)
    compute_itemsize = 8 if dtype == torch.float64 else 4
    itemsize = torch.empty((), dtype=dtype).element_size()
    env = environment(device)
    cases = list(args.cases)
    if "cupy" in cases:
        from snnquant.kernels import cupy_available

        if not cupy_available():
            print("CuPy is not available: case (a) skipped (pip install snnquant[cuda12])")
            cases.remove("cupy")
    rows = []
    generator = torch.Generator(device=device).manual_seed(0)
    for T, N, mode in plan(args):
        x = (torch.rand((T, N), generator=generator, device=device) * 1.5).to(dtype)
        grad = torch.randn((T, N), generator=generator, device=device).to(dtype)
        row = {"T": T, "N": N, "mode": mode, "ms": {}, "ratio_to_cupy": {},
               "copy_GBps": copy_bandwidth(T * N * itemsize, device, args.warmup, args.repeats)}
        for case in cases:
            try:
                row["ms"][case] = cuda_time(make_case(case, mode, x, grad, dtype),
                                            args.warmup, args.repeats, args.max_seconds)
            except torch.cuda.OutOfMemoryError:
                row["ms"][case] = "oom"
            except Exception as error:  # a baseline that cannot run is recorded, not fatal
                row["ms"][case] = f"error: {type(error).__name__}: {error}"[:200]
            torch.cuda.empty_cache()
        cupy_ms = row["ms"].get("cupy")
        if isinstance(cupy_ms, float):
            for case in cases:
                if case != "cupy" and isinstance(row["ms"][case], float):
                    row["ratio_to_cupy"][case] = row["ms"][case] / cupy_ms
            moved = bytes_moved(mode, T, N, itemsize, compute_itemsize)
            row["cupy_bytes"] = moved
            row["cupy_GBps"] = moved / (cupy_ms * 1e-3) / 1e9
            row["cupy_copy_fraction"] = row["cupy_GBps"] / row["copy_GBps"]
        rows.append(row)
        print(f"T={T} N={N} {mode}: " + ", ".join(
            f"{c}={_fmt(v, '.3f')}" for c, v in row["ms"].items()), flush=True)
        del x, grad
    return {"dtype": args.dtype, "cases": cases, "environment": env, "rows": rows,
            "targets": evaluate_targets(rows, args.dtype),
            "settings": {"warmup": args.warmup, "repeats": args.repeats,
                         "max_seconds": args.max_seconds, "step": STEP, "qmin": QMIN,
                         "qmax": QMAX, "tau": 2.0, "surrogate": "Sigmoid(alpha=4)"}}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.dry_run:
        print(f"plan ({args.dtype}): {len(plan(args))} rows x cases {', '.join(args.cases)}")
        for T, N, mode in plan(args):
            print(f"  T={T:<3d} N={N:<8d} {mode}")
        if not torch.cuda.is_available():
            print("dry run: no CUDA device here; the benchmark itself needs a CUDA GPU")
        return 0
    if not torch.cuda.is_available():
        print("bench_neuron_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
              "use --dry-run to see the plan", file=sys.stderr)
        return 2
    result = measure(args)
    json_path, md_path = write_results(result, args.out)
    print(format_markdown(result))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
