"""A small Spike-driven Transformer on N-MNIST, trained and deployed as integers (issue 32 §4),
beside the example's CSNN at about the same weight bytes.

Per seed (the outer loop) and configuration (``--configs``, default W4/V8 and W2/V4), trained
``--epochs`` epochs from scratch with BatchNorm folded in the loop (``quantize_model(...,
example_input=x)``, the last quarter of the epochs with frozen BatchNorm statistics), on the
example's frames cropped to 32 x 32 (``x[..., 1:33, 1:33]``: four stride-2 poolings then leave
2 x 2 = 4 tokens, whose mean is an exact binary fraction; 34 x 34 leaves 9):

* ``SDT``: SpikingJelly's ``SpikeDrivenTransformer(T, in_channels=2, num_classes=10,
  embed_dims=32, num_heads=2, depths=1)``; trained accuracy (eval), then deployed:
  ``fold_batchnorm`` (no fine-tuning), ``to_integer(..., example_input=x)``, ``IntegerSNN`` on the
  test set; integer agreement (``integer_agreement`` on 64 test samples: whole output
  identical); weight bytes (``summary``) and the C model's ROM and RAM (``c_memory``);
* ``CSNN``: the example's network with the channel count whose weight bytes at this
  configuration are closest to the transformer's, trained and deployed the same way.

Prints a table and writes ``benchmarks/results/transformer_nmnist[_real].json``, ``.md`` and
``_table.rst`` (which the deploy guide includes)::

    OMP_NUM_THREADS=1 python benchmarks/transformer_nmnist.py \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2 --epochs 20
    python benchmarks/transformer_nmnist.py --quick      # smoke test (results not written)
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt, write_rst_table  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

CONFIGS = {"W4/V8": (4, 8), "W2/V4": (2, 4)}
LR = 1e-3


class Cropped(nn.Module):
    """The transformer on the central 32 x 32 of the frames, its output ``[N, 10]`` (already
    averaged over time) as one step, so that the example's loop (the mean over dim 0) reads it."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(crop(x)).unsqueeze(0)


def crop(x):
    """The central 32 x 32 of a ``[..., 34, 34]`` frame."""
    return x[..., 1:33, 1:33]


def transformer(T: int) -> nn.Module:
    from spikingjelly.activation_based.model import spike_driven_transformer
    return spike_driven_transformer.SpikeDrivenTransformer(
        T=T, in_channels=2, num_classes=10, embed_dims=32, num_heads=2, depths=1)


def weight_bytes(model) -> float:
    import snnquant
    return snnquant.summary(model).total_quant_bytes


def csnn_channels(bench, config, target: float) -> int:
    """The example CSNN's channel count whose quantized weight bytes are closest to ``target``."""
    import snnquant
    best = None
    for c in range(2, 65):
        q, _ = snnquant.quantize_model(bench.ex.build_csnn(c, bench.args.tau), config)
        gap = abs(weight_bytes(q) - target)
        if best is None or gap < best[0]:
            best = (gap, c)
    return best[1]


def deploy(bench, model, x_example, seed: int, crop_input: bool) -> dict:
    """Fold (no fine-tuning), export from a run, and measure ``IntegerSNN`` on the test set."""
    from spikingjelly.activation_based import functional
    from snnquant.export import (IntegerSNN, c_memory, fold_batchnorm, integer_agreement,
                                 to_integer)
    prep = crop if crop_input else (lambda t: t)
    x = prep(x_example)
    folded = fold_batchnorm(model.eval(), example_input=x)
    functional.reset_net(folded)
    # exact up to the largest count of the data (uncropped: at least the cropped one); the
    # default from example_input would be that of these few samples, and the simulator refuses
    # larger inputs
    from snnquant.cli.zoo import data_input_max
    largest = max(data_input_max(bench.train_set), data_input_max(bench.test_set))
    desc = to_integer(folded, example_input=x, input_max=largest)
    sim = IntegerSNN(desc, synapse_arithmetic="auto")
    args = bench.args_for(seed)
    _, loader = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1, 0)
    correct = count = 0
    first = None
    for frames, y in loader:
        xt = prep(frames.transpose(0, 1)).to(torch.int64)
        first = xt if first is None else first
        out = sim(xt)
        score = out if desc.output_time_mean else out.float().mean(0)
        correct += int((score.float().argmax(-1) == y).sum())
        count += int(y.numel())
    sample = first[:, :64].float()
    mem = c_memory(desc, tuple(sample.shape[2:]))
    return {"deployed": correct / count,
            "agreement": integer_agreement(folded, sample, desc),
            "weight bytes": weight_bytes(folded), "C ROM": mem.rom_bytes, "C RAM": mem.ram_bytes}


def run_seed(bench, seed: int, names) -> dict:
    import snnquant
    rows = {}
    T = bench.args.T
    x_example = bench.batches(1, seed, with_labels=False)[0]
    for name in names:
        w, v = CONFIGS[name]
        cfg = snnquant.QuantConfig(weight_bits=w, v_bits=v)
        torch.manual_seed(seed)
        sdt, _ = snnquant.quantize_model(transformer(T), cfg, example_input=crop(x_example))
        model, acc = bench.train(None, seed, model=Cropped(sdt), lr=LR,
                                 freeze_bn_epochs=bench.epochs // 4)
        row = {"SDT trained": acc}
        row.update({f"SDT {k}": val for k, val in deploy(bench, model.net, x_example, seed,
                                                          True).items()})
        c = csnn_channels(bench, cfg, row["SDT weight bytes"])
        torch.manual_seed(seed)
        csnn, _ = snnquant.quantize_model(bench.ex.build_csnn(c, bench.args.tau), cfg)
        csnn, acc = bench.train(None, seed, model=csnn, lr=bench.ex.default_lr(w, None),
                                freeze_bn_epochs=bench.epochs // 4)
        row["CSNN channels"] = c
        row["CSNN trained"] = acc
        row.update({f"CSNN {k}": val for k, val in deploy(bench, csnn, x_example, seed,
                                                           False).items()})
        print(f"seed {seed} {name}: " + ", ".join(
            f"{k} {val:.4g}" for k, val in row.items()), flush=True)
        rows[name] = row
    return rows


def table(results, names) -> str:
    lines = ["| configuration | network | weight bytes | C ROM / RAM (B) | trained | "
             "deployed (IntegerSNN) | integer agreement |", "|---|---|---|---|---|---|---|"]
    for name in names:
        per = [results[s][name] for s in sorted(results)]
        for net in ("SDT", "CSNN"):
            label = "Spike-driven Transformer (embed 32, 1 block)" if net == "SDT" else \
                f"example CSNN ({per[0]['CSNN channels']} channels)"
            lines.append(
                f"| {name} | {label} | {statistics.median(r[f'{net} weight bytes'] for r in per):.0f}"
                f" | {statistics.median(r[f'{net} C ROM'] for r in per):.0f} / "
                f"{statistics.median(r[f'{net} C RAM'] for r in per):.0f} | "
                f"{fmt([r[f'{net} trained'] for r in per])} | "
                f"{fmt([r[f'{net} deployed'] for r in per])} | "
                f"{fmt([r[f'{net} agreement'] for r in per])} |")
    return "\n".join(lines)


def main():
    ap = common.common_args(__doc__.splitlines()[0], default_epochs=20)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args, bench = common.parse_and_bench(ap)
    results = {}
    for seed in args.seeds:
        results[seed] = run_seed(bench, seed, args.configs)
        text = table(results, args.configs)
        print(text, flush=True)
        if not args.quick:
            common.write_results(
                common.results_name(args, "transformer_nmnist"),
                {"epochs": args.epochs, "seeds": common.seeds_done(args, seed),
                 "T": bench.args.T, "data": common.data_label(args, args.root),
                 "data_sha256": args.data_sha256, "results": results},
                f"Data: {common.data_label(args, args.root)}; {args.epochs} epochs, T = "
                f"{bench.args.T}, median (min..max) over seeds "
                f"{common.seeds_done(args, seed)}.\n\n{text}", args.out)
            # the deploy guide includes it
            write_rst_table(args.out, common.results_name(args, "transformer_nmnist"))


if __name__ == "__main__":
    main()
