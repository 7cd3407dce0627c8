"""CPU benchmark of the quantized neurons (issue 14): backends against SpikingJelly's LIFNode,
the example's CSNN training step, and the deployed integer network's throughput.

All timings use ``--threads`` threads (default 2; PyTorch's and the cpp backend's OpenMP), float32.
Every figure is the median over ``--runs`` complete runs (default 3) of the per-run median of
``--repeats`` timed calls, after ``--warmup`` untimed calls; inside a run the compared cases are
interleaved call by call, so that machine noise hits all of them. The spread written next to a
median is (max - min) / median over the runs.

Groups:

* ``neuron``: shapes ``[T, N, features]`` = [16, 64, 4096] (the target shape), [64, 64, 4096] and
  [16, 256, 4096] (2^20 neurons); forward+backward (backward from a fixed gradient of the
  spikes, learnable LSQ-free uniform membrane step as in ``v_quant=8``) and forward alone (under
  ``torch.no_grad``) of

  - ``QuantLIFNode(v_quant=8, backend='cpp')`` (target: <= 0.5x LIFNode, forward+backward and
    forward),
  - ``QuantLIFNode(v_quant=8, backend='torch')`` (target: <= 1.25x LIFNode),
  - ``torch.compile`` of the torch-backend neuron (reference; ``--no-compile`` leaves it out),
  - SpikingJelly 2.0 ``neuron.LIFNode`` (unquantized, the baseline),

  and the bytes each saves for backward (autograd's saved tensors, counted with
  ``torch.autograd.graph.saved_tensors_hooks``).
* ``train_step``: one training step (forward, loss, backward, Adam) of the example's CSNN
  (``examples/train_nmnist.py``'s ``build_csnn``: 16 channels, 34 x 34 x 2 input) quantized by
  ``quantize_model(QuantConfig(weight_bits=4, v_bits=8))`` with the default backend (target:
  <= 1.1x the unquantized network), with ``backend='cpp'`` and ``'torch'`` (when not the
  default), and unquantized.
* ``deploy``: samples per second of the BN-folded, integer-exported network run by
  ``snnquant.export.IntegerSNN`` (the C runtime ``snnquant.export.to_c`` is timed by ``benchmarks/bench_c_runtime.py``).

Writes ``benchmarks/results/bench_neuron_cpu.json`` and ``.md`` (with ``--quick``:
``bench_neuron_cpu_quick.*``, tiny sizes, for a smoke test only) and prints the table.

Run on a quiet machine::

    python benchmarks/bench_neuron_cpu.py --threads 2
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_name, package_version, use_checkout  # noqa: E402
from _tables import RESULTS, target_rows, write_result  # noqa: E402

use_checkout()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import _nmnist_common  # noqa: E402  (the example module, loaded in one place)

TARGETS = {
    "cpp_fwd_bwd_over_lif": 0.5,
    "cpp_fwd_over_lif": 0.5,
    "torch_fwd_bwd_over_lif": 1.25,
    "csnn_default_over_unquantized": 1.1,
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads")
    ap.add_argument("--shapes", default="16x64x4096,64x64x4096,16x256x4096",
                    help="neuron shapes T x N x features, comma separated (first = target shape)")
    ap.add_argument("--runs", type=int, default=3, help="complete runs (median over runs)")
    ap.add_argument("--repeats", type=int, default=11, help="timed calls per case and run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per case and run")
    ap.add_argument("--train-T", type=int, default=16, help="time steps of the CSNN step")
    ap.add_argument("--batch", type=int, default=32, help="batch of the CSNN step")
    ap.add_argument("--channels", type=int, default=16, help="CSNN channels (the example's)")
    ap.add_argument("--deploy-batch", type=int, default=64, help="batch of the integer network")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, 1 run x 2 repeats: a smoke test, not a measurement")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.shapes, args.runs, args.repeats, args.warmup = "4x2x256,8x2x256", 1, 2, 1
        args.train_T, args.batch, args.channels, args.deploy_batch = 4, 2, 4, 2
    for name in ("threads", "runs", "repeats", "train_T", "batch", "channels", "deploy_batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    try:
        args.shape_list = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        assert all(len(s) == 3 and min(s) >= 1 for s in args.shape_list)
    except (ValueError, AssertionError):
        ap.error(f"--shapes must be T x N x features triples like 16x64x4096, got {args.shapes!r}")
    return args


# ---- measurement ---------------------------------------------------------------------------------

def interleaved(cases: Dict[str, Callable[[], None]], runs: int, repeats: int, warmup: int
                ) -> Dict[str, List[float]]:
    """Per case, the median seconds of each complete run (cases interleaved call by call)."""
    per_run = {name: [] for name in cases}
    for _ in range(runs):
        for _ in range(warmup):
            for fn in cases.values():
                fn()
        times = {name: [] for name in cases}
        for _ in range(repeats):
            for name, fn in cases.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        for name in cases:
            per_run[name].append(statistics.median(times[name]))
    return per_run


def summary(values: List[float], scale: float = 1.0) -> dict:
    """Median over runs and the spread (max - min) / median."""
    med = statistics.median(values)
    return {"median": med * scale, "spread": (max(values) - min(values)) / med if med else 0.0,
            "runs": [v * scale for v in values]}


def ratio(per_run: Dict[str, List[float]], a: str, b: str) -> Optional[dict]:
    if a not in per_run or b not in per_run:
        return None
    return summary([x / y for x, y in zip(per_run[a], per_run[b])])


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves for backward during ``fn()`` (distinct storages)."""
    seen = {}

    def pack(t):
        try:
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            seen[key] = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            seen[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


# ---- neuron group --------------------------------------------------------------------------------

def make_neuron(case: str):
    from spikingjelly.activation_based import neuron

    from snnquant.nn import QuantLIFNode
    if case == "spikingjelly LIFNode":
        return neuron.LIFNode(tau=2.0, step_mode="m")
    backend = "cpp" if "cpp" in case else "torch"
    node = QuantLIFNode(tau=2.0, step_mode="m", v_quant=8, backend=backend)
    if "compile" in case:
        return torch.compile(node)
    return node


NEURON_CASES = ("snnquant cpp", "snnquant torch", "snnquant torch + torch.compile",
                "spikingjelly LIFNode")


def neuron_group(args) -> list:
    from spikingjelly.activation_based import functional as sjf

    rows = []
    cases = [c for c in NEURON_CASES if not (args.no_compile and "compile" in c)]
    for T, N, F in args.shape_list:
        generator = torch.Generator().manual_seed(0)
        x = (torch.rand((T, N, F), generator=generator) * 2).requires_grad_()
        grad = torch.randn((T, N, F), generator=generator)
        nodes, errors = {}, {}
        for case in cases:
            try:
                node = make_neuron(case)
                sjf.reset_net(node)
                node(x.detach())  # compiles (torch.compile, cpp) outside the timing
                nodes[case] = node
            except Exception as error:  # torch.compile may be unavailable: record, go on
                errors[case] = f"{type(error).__name__}: {error}"[:300]

        def fwd_bwd(node):
            def run():
                sjf.reset_net(node)
                (gx,) = torch.autograd.grad(node(x), x, grad)
            return run

        def fwd(node):
            def run():
                sjf.reset_net(node)
                with torch.no_grad():
                    node(x)
            return run

        timed = {}
        for mode, make in (("forward_backward", fwd_bwd), ("forward", fwd)):
            fns = {case: make(node) for case, node in nodes.items()}
            timed[mode] = interleaved(fns, args.runs, args.repeats, args.warmup)
        saved = {}
        for case, node in nodes.items():
            sjf.reset_net(node)
            saved[case] = saved_bytes(lambda: node(x))
        base = "spikingjelly LIFNode"
        row = {"T": T, "N": N, "features": F, "neurons": N * F, "errors": errors,
               "saved_for_backward_bytes": saved}
        for mode, per_run in timed.items():
            row[mode] = {case: summary(v, 1e3) for case, v in per_run.items()}  # ms
            row[mode + "_ratio_to_lif"] = {case: ratio(per_run, case, base)
                                           for case in per_run if case != base}
        rows.append(row)
        print(f"  neuron [T={T}, N={N}, features={F}] done", flush=True)
    return rows


# ---- CSNN training step and deployment ------------------------------------------------------------

def train_group(args) -> dict:
    from spikingjelly.activation_based import functional as sjf

    from snnquant import QuantConfig, quantize_model
    from snnquant.kernels import DEFAULT_BACKEND
    example = _nmnist_common.example()
    torch.manual_seed(0)
    base = example.build_csnn(args.channels, 2.0)
    nets = {"unquantized": base}
    for label, backend in ((f"W4/V8 default backend ({DEFAULT_BACKEND})", None),
                           ("W4/V8 backend='cpp'", "cpp"), ("W4/V8 backend='torch'", "torch")):
        if backend == DEFAULT_BACKEND:
            continue
        cfg = QuantConfig(weight_bits=4, v_bits=8) if backend is None else \
            QuantConfig(weight_bits=4, v_bits=8, backend=backend)
        nets[label] = quantize_model(base, cfg)[0]
    generator = torch.Generator().manual_seed(1)
    x = (torch.rand((args.train_T, args.batch, 2, 34, 34), generator=generator) > 0.8).float()
    y = torch.randint(0, 10, (args.batch,), generator=generator)
    opts = {k: torch.optim.Adam(n.parameters(), 1e-3) for k, n in nets.items()}

    def step(name):
        net, opt = nets[name], opts[name]

        def run():
            sjf.reset_net(net)
            loss = nn.functional.cross_entropy(net(x).mean(0), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return run

    per_run = interleaved({k: step(k) for k in nets}, args.runs, max(3, args.repeats // 2),
                          args.warmup)
    default_label = next(k for k in nets if "default" in k)
    return {"T": args.train_T, "batch": args.batch, "channels": args.channels,
            "input": [2, 34, 34], "default_backend": DEFAULT_BACKEND,
            "ms": {k: summary(v, 1e3) for k, v in per_run.items()},
            "ratio_to_unquantized": {k: ratio(per_run, k, "unquantized") for k in per_run
                                     if k != "unquantized"},
            "default_label": default_label, "nets": nets, "x": x}


def c_runtime_case(desc, x_int):
    """The C runtime's throughput is measured by ``benchmarks/bench_c_runtime.py`` (one home)."""
    return None, ("measured by benchmarks/bench_c_runtime.py (compiled C model, gcc -O2, one core, "
                  "vs IntegerSNN): see benchmarks/results/bench_c_runtime.md")


def deploy_group(args, train) -> dict:
    from spikingjelly.activation_based import functional as sjf

    from snnquant.export import IntegerSNN, fold_batchnorm, to_integer
    net = train["nets"][train["default_label"]]
    folded = fold_batchnorm(net.eval())
    sjf.reset_net(folded)
    desc = to_integer(folded)
    sim = IntegerSNN(desc)
    generator = torch.Generator().manual_seed(2)
    x = (torch.rand((args.train_T, args.deploy_batch, 2, 34, 34), generator=generator) > 0.8)
    x = x.to(torch.int64)
    cases = {"IntegerSNN": lambda: sim(x)}
    per_run = interleaved(cases, args.runs, max(3, args.repeats // 2), args.warmup)
    result = {"T": args.train_T, "batch": args.deploy_batch,
              "samples_per_second": {k: summary([args.deploy_batch / t for t in v])
                                     for k, v in per_run.items()}}
    c_result, note = c_runtime_case(desc, x)
    result["c_runtime"] = c_result if c_result is not None else {"skipped": note}
    return result


# ---- environment, tables, files ---------------------------------------------------------------------

def environment(args) -> dict:
    import snnquant
    from snnquant.kernels import cpp_backend
    compiler = cpp_backend.cpp_compiler()
    version = None
    if compiler:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True
                                 ).stdout.splitlines()[0]
    try:
        from spikingjelly.activation_based import functional as sjf
        lif_impl = str(sjf.neuron_implementation("lif", torch.device("cpu")))
    except Exception as error:  # not in every SpikingJelly version
        lif_impl = f"unknown ({type(error).__name__})"
    return {
        "cpu": cpu_name(), "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": torch.get_num_threads(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__,
        "spikingjelly": package_version("spikingjelly"),
        "spikingjelly_lif_implementation": lif_impl,
        "snnquant": snnquant.__version__, "compiler": version,
        "cpp_flags": list(cpp_backend._compiler_identity(compiler)[0]) if compiler else None,
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _fmt(s: Optional[dict], digits: int = 2) -> str:
    if s is None:
        return "n/a"
    return f"{s['median']:.{digits}f} (±{100 * s['spread']:.0f}%)"


def targets(result) -> dict:
    out = {}
    first = result["neuron"][0] if result["neuron"] else None
    if first is not None:
        for key, mode, case in (("cpp_fwd_bwd_over_lif", "forward_backward", "snnquant cpp"),
                                ("cpp_fwd_over_lif", "forward", "snnquant cpp"),
                                ("torch_fwd_bwd_over_lif", "forward_backward", "snnquant torch")):
            r = first[mode + "_ratio_to_lif"].get(case)
            out[key] = {"value": None if r is None else r["median"], "target": TARGETS[key],
                        "pass": None if r is None else r["median"] <= TARGETS[key]}
    train = result["train_step"]
    r = train["ratio_to_unquantized"].get(train["default_label"])
    out["csnn_default_over_unquantized"] = {
        "value": None if r is None else r["median"], "target": TARGETS["csnn_default_over_unquantized"],
        "pass": None if r is None else r["median"] <= TARGETS["csnn_default_over_unquantized"]}
    return out


def format_markdown(result) -> str:
    env = result["environment"]
    lines = [f"# CPU neuron benchmark{' (QUICK SMOKE TEST, not a measurement)' if result['quick'] else ''}",
             "",
             f"Machine: {env['cpu']}, {env['logical_cpus']} logical CPUs, {env['threads']} threads; "
             f"torch {env['torch']}, SpikingJelly {env['spikingjelly']} (LIF: "
             f"{env['spikingjelly_lif_implementation']}), snnquant {env['snnquant']}, "
             f"Python {env['python']}, {env['compiler']}; {env['date_utc']}.",
             "",
             f"Command: `{env['command']}`",
             "",
             f"Median over {result['runs']} complete runs of the per-run median of "
             f"{result['repeats']} interleaved calls; (±x%) = (max - min) / median over the runs.",
             "", "## Neuron (float32)", "",
             "| T x N x features | case | fwd+bwd ms | fwd ms | fwd+bwd / LIFNode | fwd / LIFNode "
             "| saved for backward (MiB) |",
             "|---|---|---|---|---|---|---|"]
    for row in result["neuron"]:
        shape = f"{row['T']} x {row['N']} x {row['features']}"
        for case, fb in row["forward_backward"].items():
            rfb = row["forward_backward_ratio_to_lif"].get(case)
            rf = row["forward_ratio_to_lif"].get(case)
            saved = row["saved_for_backward_bytes"].get(case)
            lines.append(f"| {shape} | {case} | {_fmt(fb, 1)} | {_fmt(row['forward'][case], 1)} "
                         f"| {_fmt(rfb) if rfb else '1'} | {_fmt(rf) if rf else '1'} "
                         f"| {saved / 2 ** 20:.1f} |")
        for case, error in row["errors"].items():
            lines.append(f"| {shape} | {case} | failed: {error} | | | | |")
    train = result["train_step"]
    lines += ["", f"## CSNN training step (the example's network, T={train['T']}, batch "
                  f"{train['batch']}, {train['channels']} channels)", "",
              "| network | ms | / unquantized |", "|---|---|---|"]
    for name, s in train["ms"].items():
        r = train["ratio_to_unquantized"].get(name)
        lines.append(f"| {name} | {_fmt(s, 1)} | {_fmt(r) if r else '1'} |")
    deploy = result["deploy"]
    lines += ["", f"## Deployed integer network (T={deploy['T']}, batch {deploy['batch']})", "",
              "| runtime | samples / s |", "|---|---|"]
    for name, s in deploy["samples_per_second"].items():
        lines.append(f"| {name} | {_fmt(s, 1)} |")
    c = deploy["c_runtime"]
    lines.append(f"| C runtime | {c['skipped'] if 'skipped' in c else _fmt(c, 1)} |")
    lines += ["", "## Targets (first shape)", "", "| target | value | limit | pass |",
              "|---|---|---|---|"]
    lines += target_rows(result["targets"])
    return "\n".join(lines) + "\n"


def write_results(result, out_dir: str, quick: bool):
    """Write ``bench_neuron_cpu.json`` and ``.md`` (``_quick`` with ``--quick``) atomically into
    ``out_dir``; return their paths."""
    stem = "bench_neuron_cpu_quick" if quick else "bench_neuron_cpu"
    return write_result(out_dir, stem, result, format_markdown(result))


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads={torch.get_num_threads()} shapes={args.shape_list} runs={args.runs} "
          f"repeats={args.repeats}", flush=True)
    result = {"quick": args.quick, "runs": args.runs, "repeats": args.repeats,
              "warmup": args.warmup, "dtype": "float32"}
    result["environment"] = environment(args)
    result["neuron"] = neuron_group(args)
    train = train_group(args)
    print("  train step done", flush=True)
    result["deploy"] = deploy_group(args, train)
    result["train_step"] = {k: v for k, v in train.items() if k not in ("nets", "x")}
    result["targets"] = targets(result)
    markdown = format_markdown(result)
    print(markdown)
    for path in write_results(result, args.out, args.quick):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
