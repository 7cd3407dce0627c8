"""BatchNorm folded during training against folding after training (issue 31 §3), on the N-MNIST
example's CSNN.

Per seed (the outer loop: cases interleaved) and configuration (``--configs``, default W1/V8,
W2/V4, W3/V4, W4/V8 and full precision), two trainings of ``--epochs`` epochs from scratch:

* ``folded``: ``QuantConfig(fold_batchnorm=True)`` (the default), the last quarter of the epochs
  with frozen BatchNorm statistics; trained accuracy (eval), then deployed: ``fold_batchnorm``,
  no fine-tuning, ``to_integer`` and ``IntegerSNN`` on the test set;
* ``after``: ``QuantConfig(fold_batchnorm=False)`` (before this change); trained accuracy, then
  deployed as the command line did by default: folded, fine-tuned ``--finetune-epochs`` (10)
  epochs at a tenth of the learning rate, ``IntegerSNN``.

Full precision is trained once per seed (no deployment). Targets (issue 31): deployed = trained
within 0.5 point with 0 fine-tuning epochs (median, every configuration); trained accuracy of
``folded`` at most 1 point below ``after`` (median); deployed accuracy of ``folded`` at W2/V4
and W3/V4 at least ``after``'s deployed + fine-tuned accuracy.

    OMP_NUM_THREADS=1 python benchmarks/fold_in_training.py \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2 3 4 --epochs 30
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt  # noqa: E402

CONFIGS = {"W1/V8": (1, 8), "W2/V4": (2, 4), "W3/V4": (3, 4), "W4/V8": (4, 8), "FP": (0, 0)}


def run_seed(bench, seed: int, names, finetune_epochs: int, freeze_bn_epochs: int,
             modes=("folded", "after")) -> dict:
    """``{config: {column: accuracy}}`` of one seed."""
    import snnquant
    rows = {}
    for name in names:
        w, v = CONFIGS[name]
        if w == 0:
            _, acc = bench.train(None, seed)
            rows[name] = {"fp trained": acc}
            print(f"seed {seed} {name}: trained {acc:.4f}", flush=True)
            continue
        row = {}
        for mode in modes:
            cfg = snnquant.QuantConfig(weight_bits=w, v_bits=v, fold_batchnorm=mode == "folded")
            model, acc = bench.train(cfg, seed, freeze_bn_epochs=(
                freeze_bn_epochs if mode == "folded" else 0))
            row[f"{mode} trained"] = acc
            row[f"{mode} deployed"] = common.deployed_accuracy(
                bench, model, seed, 0 if mode == "folded" else finetune_epochs)
            print(f"seed {seed} {name} {mode}: trained {acc:.4f}, deployed "
                  f"{row[f'{mode} deployed']:.4f}", flush=True)
        rows[name] = row
    return rows


def median(values):
    return statistics.median(values) if values else float("nan")


def report(args, per_seed: dict, names) -> str:
    seeds = sorted(per_seed)
    lines = [f"Data: {args.data_label}; {args.epochs} epochs from scratch, seeds {seeds}; "
             f"'folded' = BatchNorm folded during training (last {args.freeze_bn_epochs} epochs "
             f"frozen), deployed with 0 fine-tuning epochs; 'after' = quantized before BatchNorm "
             f"(before issue 31), deployed after folding and {args.finetune_epochs} fine-tuning "
             f"epochs; deployed = to_integer + IntegerSNN on the test set. Median (min..max) over "
             f"the seeds, then per seed.", "",
             "| configuration | folded: trained | folded: deployed (0 ft) | after: trained "
             "| after: deployed (+ft) |", "|---|---|---|---|---|"]
    verdicts = []
    for name in names:
        cols = ["folded trained", "folded deployed", "after trained", "after deployed"]
        if name == "FP":
            vals = [per_seed[s][name]["fp trained"] for s in seeds]
            lines.append(f"| full precision | {fmt(vals)} | - | - | - |")
            continue
        vals = {c: [per_seed[s][name][c] for s in seeds if c in per_seed[s][name]] for c in cols}
        lines.append(f"| {name} | " + " | ".join(fmt(vals[c]) if vals[c] else "-"
                                                 for c in cols) + " |")
        if not all(vals.values()):
            continue
        gap = 100 * (median(vals["folded trained"]) - median(vals["folded deployed"]))
        verdicts.append(f"{name}: deployed = trained within 0.5 point: "
                        f"{'met' if abs(gap) <= 0.5 else 'missed'} ({gap:+.2f} points)")
        drop = 100 * (median(vals["after trained"]) - median(vals["folded trained"]))
        verdicts.append(f"{name}: folded trained at most 1 point below 'after' trained: "
                        f"{'met' if drop <= 1.0 else 'missed'} ({drop:+.2f} points below)")
        if name in ("W2/V4", "W3/V4"):
            gain = 100 * (median(vals["folded deployed"]) - median(vals["after deployed"]))
            verdicts.append(f"{name}: folded deployed >= after deployed + fine-tuned: "
                            f"{'met' if gain >= 0 else 'missed'} ({gain:+.2f} points)")
    lines += ["", "Per seed (accuracy %):", ""]
    for s in seeds:
        parts = [f"{n} " + ", ".join(f"{c} {100 * a:.2f}" for c, a in per_seed[s][n].items())
                 for n in names]
        lines.append(f"- seed {s}: " + "; ".join(parts))
    lines += ["", "Targets:", ""] + [f"- {v}" for v in verdicts]
    return "\n".join(lines) + "\n"


def combine(paths):
    """``((epochs, finetune_epochs, data digest, freeze epochs, data label), {seed: rows},
    [the command of each run])`` of earlier runs (the same training and data; no seed twice)."""
    import json
    per_seed, first, commands = {}, None, []
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        commands.append(f"`{part['command']}` (seeds {sorted(int(k) for k in part['per_seed'])})")
        key = (part["epochs"], part["finetune_epochs"], part["data_sha256"],
               part.get("freeze_bn_epochs", part["epochs"] // 4))
        if first is None:
            first = key + (part["data"],)
        elif key != first[:4]:
            raise SystemExit(f"{path}: another training or data ({key} vs {first[:4]})")
        for seed, rows in part["per_seed"].items():
            if int(seed) in per_seed:
                raise SystemExit(f"{path}: seed {seed} is in two files")
            per_seed[int(seed)] = rows
    return first, per_seed, commands


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    ap.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                    help="report the seeds of these earlier results together (no training)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--finetune-epochs", type=int, default=10,
                    help="fine-tuning epochs of the 'after' deployment (the command line's "
                         "default before issue 31)")
    ap.add_argument("--freeze-bn-epochs", type=int, default=None,
                    help="'folded': epochs at the end with frozen BatchNorm statistics (default: a "
                         "quarter of --epochs, as snnquant train)")
    ap.add_argument("--modes", nargs="+", default=["folded", "after"], choices=["folded", "after"])
    ap.add_argument("--name", default="fold_in_training",
                    help="results file name under --out (without extension)")
    if "--combine" in sys.argv:
        args = ap.parse_args()
        (args.epochs, args.finetune_epochs, args.data_sha256, args.freeze_bn_epochs,
         args.data_label), per_seed, commands = combine(args.combine)
        args.seeds, args.quick = sorted(per_seed), False
        args.configs = [n for n in CONFIGS if all(n in rows for rows in per_seed.values())]
    else:
        commands = []
        args, bench = common.parse_and_bench(ap)
        args.data_label = common.data_label(args, args.root)
        if args.freeze_bn_epochs is None:
            args.freeze_bn_epochs = args.epochs // 4
        per_seed = {seed: run_seed(bench, seed, args.configs, args.finetune_epochs,
                                   args.freeze_bn_epochs, args.modes) for seed in args.seeds}
    table = report(args, per_seed, args.configs)
    if args.combine:
        table += "\nSeeds measured by: " + "; ".join(commands) + "\n"
    print(table)
    if not args.quick:
        common.write_results(args.name, dict(
            machine=common.machine(), epochs=args.epochs, seeds=args.seeds,
            finetune_epochs=args.finetune_epochs, freeze_bn_epochs=args.freeze_bn_epochs,
            modes=args.modes, data=args.data_label,
            data_sha256=args.data_sha256, per_seed=per_seed,
            command="python benchmarks/fold_in_training.py " + " ".join(sys.argv[1:])),
            table, args.out)


if __name__ == "__main__":
    main()
