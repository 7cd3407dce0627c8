"""The quantized training step with BatchNorm folded in the loop against the unquantized network
(issue 46 §1), CPU.

Networks (one training step: forward, cross-entropy, backward, Adam; float32):

* ``csnn``: the N-MNIST example's CSNN (``snnquant.cli.network.build_csnn``: 16 channels,
  2 x 34 x 34 spike input), T 10, batch 32;
* ``sdt``: SpikingJelly's ``SpikeDrivenTransformer(T=4, in_channels=2, embed_dims=64,
  num_heads=4, depths=2)``, 2 x 32 x 32 spike input, batch 16.

Cases of each network, interleaved call by call inside every run:

* ``unquantized``: the float network (SpikingJelly's own neurons), the baseline;
* ``W4/V8`` and ``W2/V4``: ``quantize_model(QuantConfig(weight_bits=w, v_bits=v))``, its defaults:
  every BatchNorm folded into its layer in the training loop, the default neuron backend;
* ``W4/V8 not folded``: ``QuantConfig(fold_batchnorm=False)`` (the BatchNorm trained apart, folded
  after training);
* ``W4/V8 folded, output division``: the folded layer as it was before issue 46, which divided
  the layer's output by the BatchNorm scale :math:`s` instead of the quantized folded weight
  (``--no-before`` leaves it out); the same values up to float rounding.

Every figure is the median over ``--runs`` complete runs (default 3) of the per-run median of
``--repeats`` timed steps after ``--warmup`` untimed ones; the spread next to it is
(max - min) / median over the runs, and a ratio is taken run by run. ``--profile`` adds, per
network, the share of each operation in the self CPU time of ``torch.profiler`` over a few steps
of the folded cases and the unfolded one (shares, which a loaded machine changes less than times).

Targets (issue 46): the W4/V8 step at most 0.6x the unquantized one for the CSNN and 0.9x for
the Spike-driven Transformer, 2 threads.

Writes ``benchmarks/results/bench_training_step.json`` and ``.md`` (``_quick`` with ``--quick``,
tiny sizes: a smoke test, not a measurement) and prints the table. On a quiet machine::

    python benchmarks/bench_training_step.py --threads 2 --profile
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import types
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_name, package_version, use_checkout  # noqa: E402
from _tables import RESULTS, target_rows, write_result  # noqa: E402

use_checkout()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from bench_neuron_cpu import interleaved, ratio, summary  # noqa: E402

TARGETS = {"csnn": 0.6, "sdt": 0.9}
BITS = {"W4/V8": (4, 8), "W2/V4": (2, 4)}
UNFOLDED = "W4/V8 not folded"
BEFORE = "W4/V8 folded, output division"
#: operations of the output division and its backward (the cost issue 46 removed)
DIVISION_OPS = ("aten::div", "aten::mul", "aten::neg", "aten::sum")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads")
    ap.add_argument("--networks", default="csnn,sdt", help="csnn, sdt or both (comma separated)")
    ap.add_argument("--runs", type=int, default=3, help="complete runs (median over runs)")
    ap.add_argument("--repeats", type=int, default=7, help="timed steps per case and run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per case and run")
    ap.add_argument("--csnn-T", type=int, default=10)
    ap.add_argument("--csnn-batch", type=int, default=32)
    ap.add_argument("--channels", type=int, default=16, help="CSNN channels (the example's)")
    ap.add_argument("--sdt-T", type=int, default=4)
    ap.add_argument("--sdt-batch", type=int, default=16)
    ap.add_argument("--embed", type=int, default=64, help="SDT embedding dimensions")
    ap.add_argument("--depth", type=int, default=2, help="SDT blocks")
    ap.add_argument("--no-before", action="store_true",
                    help="leave out the folded layer as it was before issue 46")
    ap.add_argument("--profile", action="store_true",
                    help="add torch.profiler's shares of self CPU time per operation")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, 1 run x 2 repeats: a smoke test, not a measurement")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.repeats, args.warmup = 1, 2, 1
        args.csnn_T, args.csnn_batch, args.channels = 2, 2, 4
        args.sdt_T, args.sdt_batch, args.embed, args.depth = 2, 2, 16, 1
    for name in ("threads", "runs", "repeats", "csnn_T", "csnn_batch", "channels", "sdt_T",
                 "sdt_batch", "embed", "depth"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")
    args.network_list = [n.strip() for n in args.networks.split(",") if n.strip()]
    unknown = [n for n in args.network_list if n not in TARGETS]
    if unknown or not args.network_list:
        ap.error(f"--networks must name csnn and/or sdt, got {args.networks!r}")
    return args


# ---- the folded layer before issue 46 (reference for the profile) -------------------------------

def _apply_with_output_division(self, run, x):
    """The training form of a folded layer before issue 46: :math:`Q_w(W') * x` divided by
    :math:`s` on the output (three output-sized operations forward and backward, and a host read
    of ``dead.any()``)."""
    bn = self.batchnorm
    if bn is None or bn.folded_form:
        return run(x, *self._quantized_parameters())
    if not bn.__dict__.get("_started", False):
        with torch.no_grad():
            bn.start_statistics(run(x, self.weight, self.bias), -1 - self._spatial_dims)

    def channels(t):
        return t.reshape((-1,) + (1,) * self._spatial_dims)

    scale = self.batchnorm_scale()
    dead = scale == 0
    y = run(x, self.quantized_weight(), None) / channels(torch.where(dead, 1.0, scale))
    if bool(dead.any()):
        y = torch.where(channels(dead), run(x, self.weight, None), y)
    return y if self.bias is None else y + channels(self.bias)


def with_output_division(model: nn.Module) -> nn.Module:
    """``model`` with every folded layer computing its training form as before issue 46."""
    for m in model.modules():
        if getattr(m, "batchnorm", None) is not None:
            m._apply_parameters = types.MethodType(_apply_with_output_division, m)
    return model


# ---- networks and steps --------------------------------------------------------------------------

def build(name: str, args):
    """``(float network, input, labels)`` of ``name``."""
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "csnn":
        from snnquant.cli.network import build_csnn
        net = build_csnn(args.channels, 2.0)
        x = (torch.rand((args.csnn_T, args.csnn_batch, 2, 34, 34), generator=generator) > 0.8)
        batch = args.csnn_batch
    else:
        from spikingjelly.activation_based.model import spike_driven_transformer
        net = spike_driven_transformer.SpikeDrivenTransformer(
            T=args.sdt_T, in_channels=2, num_classes=10, embed_dims=args.embed,
            num_heads=4 if args.embed % 4 == 0 else 1, depths=args.depth)
        x = (torch.rand((args.sdt_T, args.sdt_batch, 2, 32, 32), generator=generator) > 0.8)
        batch = args.sdt_batch
    y = torch.randint(0, 10, (batch,), generator=generator)
    return net, x.float(), y


def networks(name: str, args) -> dict:
    """``{case: quantized or float network}`` of ``name``, all from one float network."""
    from snnquant import QuantConfig, quantize_model
    base, x, _ = build(name, args)
    example = x if name == "sdt" else None  # torch.fx stops at the transformer's shape checks
    nets = {"unquantized": base}
    for label, (w, v) in BITS.items():
        nets[label] = quantize_model(base, QuantConfig(weight_bits=w, v_bits=v),
                                     example_input=example)[0]
    nets[UNFOLDED] = quantize_model(base, QuantConfig(weight_bits=4, v_bits=8,
                                                      fold_batchnorm=False),
                                    example_input=example)[0]
    if not args.no_before:
        nets[BEFORE] = with_output_division(quantize_model(
            base, QuantConfig(weight_bits=4, v_bits=8), example_input=example)[0])
    return nets


def step_function(net: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """One training step of ``net`` (reset, forward, loss, backward, Adam) as a function."""
    from spikingjelly.activation_based import functional as sjf
    net.train()
    opt = torch.optim.Adam(net.parameters(), 1e-3)

    def run():
        sjf.reset_net(net)
        out = net(x)
        loss = nn.functional.cross_entropy(out.mean(0) if out.dim() == 3 else out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return run


def profile_shares(fn, steps: int = 3, top: int = 10) -> dict:
    """Self CPU time of ``fn`` per operation under ``torch.profiler`` (``steps`` calls): the
    total in ms, the ``top`` operations' shares, and the share of :data:`DIVISION_OPS`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    events = [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
    total = sum(t for _, t in events) or 1.0
    events.sort(key=lambda e: -e[1])
    return {"self_cpu_ms_per_step": total / steps / 1e3,
            "top": [{"op": k, "share": t / total} for k, t in events[:top]],
            "division_ops_share": sum(t for k, t in events if k in DIVISION_OPS) / total}


def network_group(name: str, args) -> dict:
    nets = networks(name, args)
    _, x, y = build(name, args)
    steps = {case: step_function(net, x, y) for case, net in nets.items()}
    for fn in steps.values():  # initialises the quantizers outside the timing
        fn()
    per_run = interleaved(steps, args.runs, args.repeats, args.warmup)
    result = {"input": list(x.shape), "ms": {k: summary(v, 1e3) for k, v in per_run.items()},
              "ratio_to_unquantized": {k: ratio(per_run, k, "unquantized") for k in per_run
                                       if k != "unquantized"}}
    if args.profile:
        result["profile"] = {case: profile_shares(steps[case])
                             for case in ("W4/V8", UNFOLDED, BEFORE) if case in steps}
    print(f"  {name} done", flush=True)
    return result


# ---- environment, targets, tables, files ---------------------------------------------------------

def environment(args) -> dict:
    import snnquant
    from snnquant.kernels import DEFAULT_BACKEND
    return {"cpu": cpu_name(), "logical_cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "spikingjelly": package_version("spikingjelly"), "snnquant": snnquant.__version__,
            "default_backend": DEFAULT_BACKEND,
            "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")}


def targets(result) -> dict:
    out = {}
    for name, group in result["networks"].items():
        r = group["ratio_to_unquantized"].get("W4/V8")
        out[name] = {"value": None if r is None else r["median"], "target": TARGETS[name],
                     "pass": None if r is None else r["median"] <= TARGETS[name]}
    return out


def _fmt(s: Optional[dict], digits: int = 2) -> str:
    if s is None:
        return "n/a"
    return f"{s['median']:.{digits}f} (±{100 * s['spread']:.0f}%)"


TITLES = {"csnn": "CSNN (the N-MNIST example's)", "sdt": "Spike-driven Transformer"}


def format_markdown(result) -> str:
    env = result["environment"]
    quick = " (QUICK SMOKE TEST, not a measurement)" if result["quick"] else ""
    lines = [f"# Training step with BatchNorm folded in the loop{quick}", "",
             f"Machine: {env['cpu']}, {env['logical_cpus']} logical CPUs, {env['threads']} "
             f"threads; torch {env['torch']}, SpikingJelly {env['spikingjelly']}, snnquant "
             f"{env['snnquant']} (neuron backend {env['default_backend']}), Python "
             f"{env['python']}; {env['date_utc']}.", "",
             f"Command: `{env['command']}`", "",
             f"Median over {result['runs']} complete runs of the per-run median of "
             f"{result['repeats']} steps, cases interleaved step by step; (±x%) = (max - min) / "
             "median over the runs; ratios are taken run by run.", ""]
    for name, group in result["networks"].items():
        shape = " x ".join(str(d) for d in group["input"])
        lines += [f"## {TITLES[name]}, input {shape}", "",
                  "| case | ms per step | / unquantized |", "|---|---|---|"]
        for case, s in group["ms"].items():
            r = group["ratio_to_unquantized"].get(case)
            lines.append(f"| {case} | {_fmt(s, 1)} | {_fmt(r) if r else '1'} |")
        lines.append("")
        profile = group.get("profile")
        if profile:
            lines += ["Share of self CPU time (torch.profiler, 3 steps) per operation:", "",
                      "| case | self CPU ms / step | aten::div + mul + neg + sum | top operations |",
                      "|---|---|---|---|"]
            for case, p in profile.items():
                top = ", ".join(f"{t['op']} {100 * t['share']:.0f}%" for t in p["top"][:6])
                lines.append(f"| {case} | {p['self_cpu_ms_per_step']:.1f} | "
                             f"{100 * p['division_ops_share']:.0f}% | {top} |")
            lines.append("")
    lines += ["## Where the cost of folding went", "",
              "Before issue 46, a folded layer trained with batch statistics computed "
              "Q(W s) * x and divided that output by s per channel (s = gamma / sqrt(running "
              "variance + eps)), then checked `dead.any()` on the host for channels with s = 0. "
              "The division is an output-sized operation, and its backward adds two more "
              "(the gradient to the input, and to s: a product with the output and a sum over "
              "it): aten::div, aten::mul, aten::neg and aten::sum in the profile, absent from "
              "the network trained without folding. The layer now divides the quantized folded "
              "weight by s (weight-sized) and convolves once with the result and the bias: the "
              "same values up to float rounding, the same gradients, and no host read. What is "
              "deployed does not change: evaluation, frozen statistics and fold_batchnorm use "
              "the folded layer as before.", "",
              "## Targets (W4/V8 / unquantized)", "", "| network | value | limit | pass |",
              "|---|---|---|---|"]
    lines += target_rows(result["targets"])
    return "\n".join(lines) + "\n"


def write_results(result, out_dir: str, quick: bool):
    """Write ``bench_training_step.json`` and ``.md`` (``_quick`` with ``--quick``) into
    ``out_dir``; return their paths."""
    stem = "bench_training_step_quick" if quick else "bench_training_step"
    return write_result(out_dir, stem, result, format_markdown(result))


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads={torch.get_num_threads()} networks={args.network_list} runs={args.runs} "
          f"repeats={args.repeats}", flush=True)
    result = {"quick": args.quick, "runs": args.runs, "repeats": args.repeats,
              "warmup": args.warmup, "dtype": "float32", "environment": environment(args),
              "networks": {name: network_group(name, args) for name in args.network_list}}
    result["targets"] = targets(result)
    markdown = format_markdown(result)
    print(markdown)
    for path in write_results(result, args.out, args.quick):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
