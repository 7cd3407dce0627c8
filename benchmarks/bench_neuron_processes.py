"""The fused CPU neuron in many fresh processes (issue 46 §3): is any process slow?

``QuantLIFNode(v_quant=8, backend='cpp')`` against SpikingJelly's ``LIFNode``, forward+backward,
``[T, N, features]`` = 16 x 64 x 4096 by default, ``--threads`` threads, timed in
``--processes`` fresh Python processes one after the other (default 20). In each process the two
cases are interleaved call by call (``--repeats`` timed calls after ``--warmup``), as
``bench_neuron_cpu.py`` times them; the process reports the median of each case, their ratio,
and what might explain a slow process: the OpenMP runtimes mapped into it (``/proc/self/maps``),
its CPU affinity, torch's thread settings and the OpenMP variables of its environment.

``--env NAME=VALUE`` (repeatable) sets a variable in every child (``OMP_WAIT_POLICY=PASSIVE``,
``OMP_PROC_BIND=close``, ``GOMP_SPINCOUNT=...``): run once without and once with, on the same quiet
machine, to compare.

Targets (issue 46): of the processes, none above 1.5x the median time of the cpp neuron, and the
median ratio to ``LIFNode`` at most 0.35.

What was found so far (2026-12-08, on a loaded 2-core machine, so no timing here is a result):

* one OpenMP runtime per process: the kernel library (built with the system's g++ and
  ``-fopenmp``, ``NEEDED libgomp.so.1``) binds at load time to the ``libgomp.so.1`` torch ships
  (``torch/lib``), already loaded under that soname; ``/proc/self/maps`` holds no second runtime,
  so two thread pools spinning against each other are ruled out (each process here reports its
  runtimes, to confirm on the slow ones);
* under load the kernel's OpenMP regions (two threads from 32,768 elements) wait for the
  worker thread to get a CPU: 38 ms instead of 0.35 ms per forward+backward at 4 x 2 x 4096 when
  interleaved with torch's operations, erratically (fast again after a few calls); one thread
  does not show it. A quiet machine with an idle second core should not either;
* not yet tested: the per-block state arrays on the stack sit at an offset from the streamed
  tensors that ASLR changes per process; an offset equal modulo 4096 (4K aliasing of loads and
  stores) would slow a whole process, in some processes only. Compare ``--threads 1`` runs
  across processes on a quiet machine: a bimodal single-thread time points there, a unimodal one
  to the thread pool (then try ``--env OMP_PROC_BIND=close --env OMP_PLACES=cores``).

Writes ``benchmarks/results/bench_neuron_processes.json`` and ``.md`` (``--tag`` appends to the
name; ``_quick`` with ``--quick``). Timings need a quiet machine::

    python benchmarks/bench_neuron_processes.py --processes 20 --threads 2
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import ROOT, cpu_name  # noqa: E402
from _tables import RESULTS, write_files  # noqa: E402

TARGET_MAX_OVER_MEDIAN = 1.5
TARGET_RATIO_TO_LIF = 0.35
CPP = "snnquant cpp"
LIF = "spikingjelly LIFNode"
OMP_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES",
                 "GOMP_SPINCOUNT", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "KMP_BLOCKTIME",
                 "MKL_NUM_THREADS")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=20, help="fresh processes, one at a time")
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads per process")
    ap.add_argument("--shape", default="16x64x4096", help="T x N x features")
    ap.add_argument("--repeats", type=int, default=11, help="timed calls per case")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per case")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for every child (repeatable)")
    ap.add_argument("--tag", default="", help="appended to the results' file names")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="3 processes, a tiny shape: a smoke test, not a measurement")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.processes, args.shape, args.repeats, args.warmup = 3, "4x2x4096", 3, 1
    for name in ("processes", "threads", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    try:
        args.shape_tuple = tuple(int(v) for v in args.shape.split("x"))
        assert len(args.shape_tuple) == 3 and min(args.shape_tuple) >= 1
    except (ValueError, AssertionError):
        ap.error(f"--shape must be T x N x features like 16x64x4096, got {args.shape!r}")
    args.env_pairs = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error(f"--env must be NAME=VALUE, got {item!r}")
        args.env_pairs[name] = value
    return args


# ---- one process ---------------------------------------------------------------------------------

def openmp_libraries() -> list:
    """The OpenMP runtimes (libgomp, libiomp, libomp) mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps
                           if any(k in line for k in ("libgomp", "libiomp", "libomp"))})
    except OSError:
        return []


def child(args) -> dict:
    """Time the two cases in this process; return the figures and the diagnostics."""
    sys.path.insert(0, ROOT)
    import torch
    from spikingjelly.activation_based import functional as sjf

    from bench_neuron_cpu import interleaved, make_neuron
    torch.set_num_threads(args.threads)
    T, N, F = args.shape_tuple
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand((T, N, F), generator=generator) * 2).requires_grad_()
    grad = torch.randn((T, N, F), generator=generator)
    nodes = {case: make_neuron(case) for case in (CPP, LIF)}

    def fwd_bwd(node):
        def run():
            sjf.reset_net(node)
            torch.autograd.grad(node(x), x, grad)
        return run

    for node in nodes.values():   # compiles / loads the kernel outside the timing
        fwd_bwd(node)()
    per_run = interleaved({case: fwd_bwd(node) for case, node in nodes.items()}, 1,
                          args.repeats, args.warmup)
    ms = {case: 1e3 * v[0] for case, v in per_run.items()}
    return {"ms": ms, "ratio_to_lif": ms[CPP] / ms[LIF], "pid": os.getpid(),
            "openmp_libraries": openmp_libraries(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None,
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "environment": {k: os.environ[k] for k in OMP_VARIABLES if k in os.environ}}


# ---- the parent ----------------------------------------------------------------------------------

def summarise(rows) -> dict:
    cpp = [r["ms"][CPP] for r in rows]
    ratios = [r["ratio_to_lif"] for r in rows]
    median = statistics.median(cpp)
    slow = [i for i, v in enumerate(cpp) if v > TARGET_MAX_OVER_MEDIAN * median]
    ratio = statistics.median(ratios)
    return {"cpp_ms_median": median, "cpp_ms_min": min(cpp), "cpp_ms_max": max(cpp),
            "lif_ms_median": statistics.median(r["ms"][LIF] for r in rows),
            "max_over_median": max(cpp) / median, "slow_processes": slow,
            "ratio_to_lif_median": ratio, "ratio_to_lif_min": min(ratios),
            "ratio_to_lif_max": max(ratios),
            "targets": {"no_process_above_1.5x_median": not slow,
                        "median_ratio_to_lif_at_most_0.35": ratio <= TARGET_RATIO_TO_LIF}}


def format_markdown(result) -> str:
    s = result["summary"]
    quick = " (QUICK SMOKE TEST, not a measurement)" if result["quick"] else ""
    env = ", ".join(f"{k}={v}" for k, v in result["child_environment"].items()) or "none"
    lines = [f"# The fused CPU neuron in fresh processes{quick}", "",
             f"Machine: {result['cpu']}, {result['logical_cpus']} logical CPUs; {result['date_utc']}.",
             f"Command: `{result['command']}`", "",
             f"{len(result['processes'])} fresh processes, one at a time; in each, "
             f"`QuantLIFNode(v_quant=8, backend='cpp')` and SpikingJelly's `LIFNode`, forward + "
             f"backward, shape {result['shape']}, {result['threads']} threads, median of "
             f"{result['repeats']} interleaved calls. Extra environment of the children: {env}.",
             "", "| process | cpp ms | LIFNode ms | cpp / LIFNode | OpenMP runtimes | CPUs |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(result["processes"]):
        libs = ", ".join(os.path.basename(p) for p in r["openmp_libraries"]) or "none"
        mark = " (slow)" if i in s["slow_processes"] else ""
        lines.append(f"| {i}{mark} | {r['ms'][CPP]:.1f} | {r['ms'][LIF]:.1f} | "
                     f"{r['ratio_to_lif']:.2f} | {libs} | {r['affinity']} |")
    lines += ["", f"cpp: median {s['cpp_ms_median']:.1f} ms ({s['cpp_ms_min']:.1f}.."
                  f"{s['cpp_ms_max']:.1f}), slowest / median {s['max_over_median']:.2f} "
                  f"(target <= {TARGET_MAX_OVER_MEDIAN}); ratio to LIFNode median "
                  f"{s['ratio_to_lif_median']:.2f} ({s['ratio_to_lif_min']:.2f}.."
                  f"{s['ratio_to_lif_max']:.2f}; target <= {TARGET_RATIO_TO_LIF}).",
              f"Targets: {s['targets']}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    env = dict(os.environ, **args.env_pairs)
    env.setdefault("OMP_NUM_THREADS", str(args.threads))
    command = [sys.executable, os.path.abspath(__file__), "--child", "--threads",
               str(args.threads), "--shape", args.shape, "--repeats", str(args.repeats),
               "--warmup", str(args.warmup)]
    rows = []
    for i in range(args.processes):
        res = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            sys.exit(f"process {i} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"  process {i}: cpp {rows[-1]['ms'][CPP]:.1f} ms, LIFNode "
              f"{rows[-1]['ms'][LIF]:.1f} ms", flush=True)
    result = {"quick": args.quick, "shape": args.shape, "threads": args.threads,
              "repeats": args.repeats, "warmup": args.warmup, "cpu": cpu_name(),
              "logical_cpus": os.cpu_count(), "child_environment": args.env_pairs,
              "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
              "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds"),
              "processes": rows, "summary": summarise(rows)}
    markdown = format_markdown(result)
    print(markdown)
    stem = "bench_neuron_processes" + (f"_{args.tag}" if args.tag else "") + \
        ("_quick" if args.quick else "")
    for path in write_files(args.out, {stem + ".json": json.dumps(result, indent=2) + "\n",
                                       stem + ".md": markdown}):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
