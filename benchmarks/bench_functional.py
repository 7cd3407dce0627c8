"""Benchmark snnquant.functional against the libraries it replaces (CPU, forward + backward).

* Each drop-in for ``spikingjelly.activation_based.quantize`` against SpikingJelly's function
  (target: time ratio ours / SpikingJelly <= 1.1).
* ``state_quant`` at 4 and 8 bits against ``snntorch.functional.quant.state_quant`` (target: >= 10x
  faster and far lower peak memory).

Timing: 2**20 float32 elements, one forward + backward per call; the two implementations of a case
are timed alternately in the same process (A B B A ...); each sample is the mean of ``--inner``
calls, and the table shows the median of ``--repeats`` samples. The time is CPU time of this
process (``time.process_time``, user + system, all threads), not wall time: on a shared machine
another tenant on the same core doubles wall times at random, while CPU time counts only our own
work. Wall-time medians are kept in the JSON too.

Peak memory: each (case, implementation) runs once in a fresh subprocess, which resets the
kernel's peak-RSS counter (``/proc/self/clear_refs``), runs one forward + backward and reads the new
peak (``VmHWM``) minus the resident size just before the call. PyTorch's CPU allocator returns large
blocks to the OS, so this is the peak extra memory of that call. The largest single intermediate
(an analytic size) is reported next to it.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_functional.py            # writes benchmarks/results/
    python benchmarks/bench_functional.py --quick                      # a fast smoke run, no files
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

N = 2**20
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import ROOT, cpu_name, package_version, use_checkout  # noqa: E402
from _tables import RESULTS, write_files  # noqa: E402


def _drop_in_cases():
    """name -> (call(module, x), input kind). Called only after torch is imported."""
    return {
        "round": (lambda m, x: m.round(x), "normal"),
        "ceil": (lambda m, x: m.ceil(x), "normal"),
        "floor": (lambda m, x: m.floor(x), "normal"),
        "clamp": (lambda m, x: m.clamp(x, -1.0, 1.0), "normal"),
        "step_quantize": (lambda m, x: m.step_quantize(x, 0.25), "normal"),
        "multi_level_spike_count": (lambda m, x: m.multi_level_spike_count(x, 4), "normal"),
        "k_bit_quantize": (lambda m, x: m.k_bit_quantize(x, 4), "unit"),
        "affine_k_bit_quantize": (lambda m, x: m.affine_k_bit_quantize(x, 4, 1.5, -0.5), "unit"),
        "clamp_by_linear": (lambda m, x: m.clamp_by_linear(x), "normal"),
    }


def _make_input(kind, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    if kind == "unit":
        return torch.rand(N, generator=gen)
    return torch.randn(N, generator=gen) * 1.5


def _implementations(case):
    """(label, callable(x) -> y) pairs for one case: ours first, the reference second."""
    from snnquant import functional as Q

    if case.startswith("state_quant"):
        from snntorch.functional import quant

        bits = int(case.rsplit("_", 1)[1].rstrip("bit"))
        return [
            ("snnquant", Q.state_quant(num_bits=bits)),
            ("snntorch", quant.state_quant(num_bits=bits)),
        ]
    import spikingjelly.activation_based.quantize as sj

    call, _ = _drop_in_cases()[case]
    return [("snnquant", lambda x: call(Q, x)), ("spikingjelly", lambda x: call(sj, x))]


def _input_kind(case):
    return "normal" if case.startswith("state_quant") else _drop_in_cases()[case][1]


def _forward_backward(fn, x, upstream):
    x.grad = None
    fn(x).backward(upstream)


def time_case(case, repeats, inner):
    import torch

    x = _make_input(_input_kind(case)).requires_grad_(True)
    upstream = torch.ones(N)
    impls = _implementations(case)
    for _, fn in impls:  # warm up (and check the two agree)
        _forward_backward(fn, x, upstream)
    samples = {label: [] for label, _ in impls}
    wall = {label: [] for label, _ in impls}
    for r in range(repeats):
        order = impls if r % 2 == 0 else impls[::-1]
        for label, fn in order:
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            for _ in range(inner):
                _forward_backward(fn, x, upstream)
            samples[label].append((time.process_time() - start_cpu) / inner)
            wall[label].append((time.perf_counter() - start_wall) / inner)
    medians = {label: statistics.median(values) for label, values in samples.items()}
    wall_medians = {label: statistics.median(values) for label, values in wall.items()}
    return medians, {"cpu_s": samples, "wall_s": wall, "wall_median_s": wall_medians}


def _status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _memory_child(case, label):
    """Run in a subprocess: print the peak extra resident memory (bytes) of one call."""
    import torch

    x = _make_input(_input_kind(case)).requires_grad_(True)
    upstream = torch.ones(N)
    fn = dict(_implementations(case))[label]
    # Run once on a small input first so that loading code and lazy initialisation do not count.
    small = x.detach()[:1024].clone().requires_grad_(True)
    _forward_backward(fn, small, upstream[:1024])
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the peak RSS counter (VmHWM) to the current RSS
    before = _status_kib("VmRSS")
    _forward_backward(fn, x, upstream)
    peak = _status_kib("VmHWM")
    print(json.dumps({"peak_extra_bytes": (peak - before) * 1024}))


def measure_memory(case, label):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--memory-child", case, label],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


def _largest_intermediate(case, label):
    """Size in bytes of the largest single tensor the forward allocates (analytic)."""
    if not case.startswith("state_quant"):
        return None
    levels = 2 ** int(case.rsplit("_", 1)[1].rstrip("bit"))
    if label == "snntorch":
        return N * levels * 4  # input repeated to [n, levels] float32
    return N * 4  # n float32 values (each buffer, the int32 index included, holds n 4-byte values)


def _fmt_ms(seconds):
    return f"{seconds * 1e3:.2f}"


def _fmt_mib(n_bytes):
    return "-" if n_bytes is None else f"{n_bytes / 2**20:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=41, help="timing samples per implementation")
    parser.add_argument("--inner", type=int, default=10, help="calls per timing sample (drop-ins)")
    parser.add_argument("--state-repeats", type=int, default=7, help="timing samples for state_quant")
    parser.add_argument("--quick", action="store_true", help="few repeats, no files written")
    parser.add_argument("--memory-child", nargs=2, metavar=("CASE", "LABEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if ROOT not in sys.path:
        use_checkout()  # run from a checkout without installing

    if args.memory_child:
        _memory_child(*args.memory_child)
        return 0

    import torch

    if args.quick:
        args.repeats, args.inner, args.state_repeats = 3, 1, 1

    threads = torch.get_num_threads()
    print(
        f"torch {torch.__version__}, spikingjelly {package_version('spikingjelly')}, "
        f"snntorch {package_version('snntorch')}; CPU threads: {threads} "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); n = 2**20 float32; "
        "forward + backward; CPU time per call, median of alternating samples"
    )
    rows = []
    header = f"{'case':<26}{'snnquant ms':>12}{'reference ms':>14}{'ratio':>8}  target"
    print(header)
    print("-" * len(header))
    for case in _drop_in_cases():
        medians, samples = time_case(case, args.repeats, args.inner)
        ratio = medians["snnquant"] / medians["spikingjelly"]
        ok = ratio <= 1.1
        rows.append(
            {
                "case": case,
                "reference": "spikingjelly",
                "ours_s": medians["snnquant"],
                "reference_s": medians["spikingjelly"],
                "ratio": ratio,
                "target": "ratio <= 1.1",
                "meets_target": ok,
                "samples": samples,
            }
        )
        print(
            f"{case:<26}{_fmt_ms(medians['snnquant']):>12}{_fmt_ms(medians['spikingjelly']):>14}"
            f"{ratio:>8.3f}  {'ok' if ok else 'MISSED'} (<= 1.1)"
        )

    print()
    header = (
        f"{'case':<16}{'snnquant ms':>12}{'snntorch ms':>13}{'speed-up':>10}"
        f"{'peak MiB ours':>15}{'peak MiB snntorch':>19}  target"
    )
    print(header)
    print("-" * len(header))
    for bits in (4, 8):
        case = f"state_quant_{bits}bit"
        medians, samples = time_case(case, args.state_repeats, 1)
        memory = {label: measure_memory(case, label) for label in ("snnquant", "snntorch")}
        speedup = medians["snntorch"] / medians["snnquant"]
        ok = speedup >= 10 and memory["snnquant"] < memory["snntorch"]
        rows.append(
            {
                "case": case,
                "reference": "snntorch",
                "ours_s": medians["snnquant"],
                "reference_s": medians["snntorch"],
                "ratio": medians["snnquant"] / medians["snntorch"],
                "speedup": speedup,
                "peak_extra_bytes": memory,
                "largest_intermediate_bytes": {
                    label: _largest_intermediate(case, label) for label in ("snnquant", "snntorch")
                },
                "target": "speed-up >= 10 and lower peak memory",
                "meets_target": ok,
                "samples": samples,
            }
        )
        print(
            f"{case:<16}{_fmt_ms(medians['snnquant']):>12}{_fmt_ms(medians['snntorch']):>13}"
            f"{speedup:>9.1f}x{_fmt_mib(memory['snnquant']):>15}{_fmt_mib(memory['snntorch']):>19}"
            f"  {'ok' if ok else 'MISSED'} (>= 10x)"
        )

    if args.quick:
        return 0
    meta = {
        "n": N,
        "dtype": "float32",
        "device": "cpu",
        "torch": torch.__version__,
        "spikingjelly": package_version("spikingjelly"),
        "snntorch": package_version("snntorch"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": cpu_name(),
        "torch_num_threads": threads,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "repeats": args.repeats,
        "inner": args.inner,
        "state_repeats": args.state_repeats,
        "timing": "process CPU time (time.process_time: user + system, all threads) per forward + "
        "backward; median of alternating samples; each drop-in sample is the mean of `inner` calls; "
        "wall-time medians under samples.wall_median_s",
        "memory": "peak RSS (VmHWM after /proc/self/clear_refs) minus RSS before one forward + "
        "backward, in a fresh subprocess per case",
    }
    report = json.dumps({"meta": meta, "results": rows}, indent=2) + "\n"
    write_files(RESULTS, {"bench_functional.json": report,
                          "bench_functional.md": _markdown(meta, rows)})
    print(f"\nwrote {os.path.join(RESULTS, 'bench_functional.json')} and bench_functional.md")
    return 0


def _markdown(meta, rows):
    lines = [
        "# snnquant.functional benchmark (CPU, forward + backward)",
        "",
        f"n = 2**20 float32 elements; torch {meta['torch']}; {meta['processor']}; "
        f"torch threads {meta['torch_num_threads']} (OMP_NUM_THREADS={meta['OMP_NUM_THREADS']}). "
        "Times are process CPU time per forward + backward (user + system; wall time on a shared "
        "machine depends on other tenants). "
        f"Median of {meta['repeats']} alternating samples (each the mean of {meta['inner']} calls) "
        f"for the drop-ins, of {meta['state_repeats']} for state_quant. Written by "
        "`benchmarks/bench_functional.py`.",
        "",
        "## Drop-ins for spikingjelly.activation_based.quantize (target: ratio <= 1.1)",
        "",
        "| function | snnquant ms | spikingjelly ms | ratio | target met |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        if row["reference"] == "spikingjelly":
            lines.append(
                f"| {row['case']} | {_fmt_ms(row['ours_s'])} | {_fmt_ms(row['reference_s'])} | "
                f"{row['ratio']:.3f} | {'yes' if row['meets_target'] else 'no'} |"
            )
    lines += [
        "",
        "## state_quant against snntorch (target: >= 10x faster, lower peak memory)",
        "",
        "Peak memory: extra resident memory of one forward + backward in a fresh process "
        "(VmHWM after resetting it, minus VmRSS before). Largest intermediate: analytic size of "
        "the biggest single tensor the forward allocates.",
        "",
        "| case | snnquant ms | snntorch ms | speed-up | peak MiB snnquant | peak MiB snntorch | "
        "largest intermediate MiB snnquant | largest intermediate MiB snntorch | target met |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        if row["reference"] == "snntorch":
            mem, big = row["peak_extra_bytes"], row["largest_intermediate_bytes"]
            lines.append(
                f"| {row['case']} | {_fmt_ms(row['ours_s'])} | {_fmt_ms(row['reference_s'])} | "
                f"{row['speedup']:.1f}x | {_fmt_mib(mem['snnquant'])} | {_fmt_mib(mem['snntorch'])} | "
                f"{_fmt_mib(big['snnquant'])} | {_fmt_mib(big['snntorch'])} | "
                f"{'yes' if row['meets_target'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
