"""Training speed of the chip layers (issue 33): the fused chip kernels (``backend='auto'``, which
runs the cpp backend on a CPU with a C++ compiler) against the torch loop (``backend='torch'``).

The networks are those of the chip benchmarks, converted by the chips' ``quantize_for_*`` from
their float networks (seed 0): Xylo ``xylo_nmnist.SIZES`` (16-256-128-8, T = 32), Loihi
``loihi_nmnist.SIZES`` (578-256-10, T = 8), Speck ``speck_nmnist.float_network`` (two
convolutions and a Linear on 2 x 34 x 34, T = 8). The input is random, at the density and the
count range of each benchmark's encoding (``--batch`` samples). One case is one training step:
forward, cross-entropy of the summed output, backward, Adam.

Before timing, the two backends' outputs on the same input are compared (they must be equal:
the kernels compute the chip's integers exactly). Every figure is the median over ``--runs``
complete runs (default 5) of the per-run median of ``--repeats`` timed steps (default 15), after
``--warmup`` untimed steps; inside a run the two backends are interleaved step by step. The
spread is (max - min) / median over the runs.

Writes ``benchmarks/results/chip_kernels.json``, ``.md`` and ``_table.rst`` (included by the
kernels' API page) and prints the table. Run on a quiet
machine::

    python benchmarks/chip_kernels.py --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import use_checkout  # noqa: E402
from _tables import RESULTS, write_files, write_rst_table  # noqa: E402

use_checkout()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from spikingjelly.activation_based import functional as sjf  # noqa: E402

import _chip_common as common_chip  # noqa: E402
import bench_neuron_cpu as bench  # noqa: E402
import loihi_nmnist  # noqa: E402
import speck_nmnist  # noqa: E402
import xylo_nmnist  # noqa: E402
from snnquant.targets import (XYLO_AUDIO2, quantize_for_loihi, quantize_for_speck,  # noqa: E402
                              quantize_for_xylo)
from snnquant.targets._layer import ChipLayer  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    for name in ("threads", "batch", "runs", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def chips(batch: int) -> dict:
    """``{chip: (model, input, labels, T)}``: each benchmark's network and a random input."""
    g = torch.Generator().manual_seed(0)
    xylo_T, loihi_T, speck_T = 32, 8, 8
    xylo = quantize_for_xylo(common_chip.float_network(0, xylo_nmnist.SIZES))
    xylo_in = torch.randint(0, XYLO_AUDIO2.max_input_events + 1, (xylo_T, batch, 16),
                            generator=g).float()
    loihi = quantize_for_loihi(common_chip.float_network(0, loihi_nmnist.SIZES, v_reset=0.0))
    loihi_in = (torch.rand((loihi_T, batch, 578), generator=g) < 0.1).float()
    speck = quantize_for_speck(speck_nmnist.float_network(0), speck_nmnist.INPUT_SHAPE,
                               input_max=speck_nmnist.INPUT_MAX)
    speck_in = ((torch.rand((speck_T, batch, 2, 34, 34), generator=g) < 0.05).float()
                * torch.randint(1, 4, (speck_T, batch, 2, 34, 34), generator=g))
    return {
        "xylo": (xylo, xylo_in, torch.randint(0, xylo_nmnist.CLASSES, (batch,), generator=g),
                 xylo_T),
        "loihi": (loihi, loihi_in, torch.randint(0, loihi_nmnist.CLASSES, (batch,), generator=g),
                  loihi_T),
        "speck": (speck, speck_in, torch.randint(0, speck_nmnist.CLASSES, (batch,), generator=g),
                  speck_T),
    }


def set_backend(model: nn.Module, backend: str) -> None:
    for m in model.modules():
        if isinstance(m, ChipLayer):
            m.backend = backend


def step_fn(model, x, y, backend: str):
    """One training step of a copy of ``model`` that runs ``backend``."""
    import copy

    model = copy.deepcopy(model)
    set_backend(model, backend)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        sjf.reset_net(model)
        loss = nn.functional.cross_entropy(model(x).sum(0), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def same_output(model, x) -> bool:
    outs = []
    for backend in ("torch", "auto"):
        set_backend(model, backend)
        sjf.reset_net(model)
        with torch.no_grad():
            outs.append(model(x))
    set_backend(model, "auto")
    return bool(torch.equal(outs[0], outs[1]))


def measure(args) -> dict:
    rows = {}
    for name, (model, x, y, T) in chips(args.batch).items():
        equal = same_output(model, x)
        per_run = bench.interleaved({"torch": step_fn(model, x, y, "torch"),
                                     "kernels": step_fn(model, x, y, "auto")},
                                    args.runs, args.repeats, args.warmup)
        rows[name] = {"T": T, "batch": args.batch, "outputs_equal": equal,
                      "torch_ms": bench.summary(per_run["torch"], 1e3),
                      "kernels_ms": bench.summary(per_run["kernels"], 1e3),
                      "speedup": bench.ratio(per_run, "torch", "kernels")}
        print(f"  {name} done", flush=True)
    return rows


def format_markdown(result) -> str:
    env = result["environment"]
    lines = [f"Chip layers, one training step (forward, backward, Adam), batch {result['batch']}, "
             f"{env['threads']} threads, {env['cpu']}; median of {result['runs']} runs "
             f"(spread). torch {env['torch']}, snnquant {env['snnquant']}, "
             f"{env['compiler']}. Command: `{env['command']}`.", "",
             "The times are this invocation's: on a shared 2-core machine they moved by up to "
             "20% from one invocation to the next, while the speedup (the two backends "
             "interleaved step by step) stayed within 10%. Compare speedups.", "",
             "| chip | T | torch loop (ms) | chip kernels (ms) | speedup | outputs equal |",
             "|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        lines.append(f"| {name} | {row['T']} | {bench._fmt(row['torch_ms'], 1)} | "
                     f"{bench._fmt(row['kernels_ms'], 1)} | {bench._fmt(row['speedup'])} | "
                     f"{row['outputs_equal']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {"batch": args.batch, "runs": args.runs, "repeats": args.repeats,
              "warmup": args.warmup, "environment": bench.environment(args)}
    result["rows"] = measure(args)
    text = format_markdown(result)
    print(text)
    for path in write_files(args.out, {"chip_kernels.json": json.dumps(result, indent=2) + "\n",
                                       "chip_kernels.md": text}):
        print("wrote", path)
    print("wrote", write_rst_table(args.out, "chip_kernels"))
    return 0 if all(r["outputs_equal"] for r in result["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
