"""Post-training quantization (PTQ) against quantization-aware training (QAT) on the N-MNIST
example's CSNN, at W8/V16, W4/V8 and W2/V4; PTQ followed by 1..3 fine-tuning epochs; 3 seeds.

Per seed: the full-precision network is trained for ``--epochs`` epochs and its BatchNorm folded
into the weights (the full-precision accuracy is measured after folding, which does not change
it); PTQ quantizes that network (``quantize_model``, per-channel power-of-two weights, uniform
membrane) and calibrates it (``snnquant.calibrate``, ``--method``, ``--calib-batches`` training
batches; no training); the fine-tuned variant then trains it for up to 3 epochs at a tenth of the
learning rate (steps frozen by the calibration; W4/V8 and W2/V4). QAT trains the same configuration from scratch
for ``--epochs`` epochs. Seeds are the outer loop, so the cases are interleaved.

    OMP_NUM_THREADS=1 python benchmarks/accuracy_ptq.py [--epochs 30] \
        [--real-split ../shared/data/nmnist-real-1k] [--fp-cache runs/fp_cache]

Targets (issue 15, built-in data): PTQ W8/V16 within 0.5 points of full precision with no
training; W4/V8 PTQ + at most 3 fine-tuning epochs within 1 point.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt, spread  # noqa: E402

BITS = [(8, 16), (4, 8), (2, 4)]
FINETUNE_EPOCHS = 3


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    ap.add_argument("--method", default="mse",
                    choices=("minmax", "percentile", "mse", "firing"))
    ap.add_argument("--calib-batches", type=int, default=8)
    ap.add_argument("--skip-qat", action="store_true",
                    help="PTQ and fine-tuning only (no quantization-aware training from scratch)")
    ap.add_argument("--qat-only", action="store_true",
                    help="only the quantization-aware training from scratch (written to "
                         "accuracy_qat.*; the full-precision and PTQ rows come from a --skip-qat "
                         "run with the same seeds and epochs)")
    args, bench = common.parse_and_bench(ap)
    import snnquant
    from snnquant.export import fold_batchnorm

    rows = {"full precision": []}
    for w, v in BITS:
        for kind in ("PTQ", *[f"PTQ + {e} fine-tuning epochs" for e in
                              range(1, FINETUNE_EPOCHS + 1 if w < 8 else 1)], "QAT"):
            rows[f"W{w}/V{v} {kind}"] = []
    if args.qat_only:
        return qat_only(args, bench)
    for seed in args.seeds:
        fp, _ = bench.train(None, seed)
        fp = fold_batchnorm(fp.eval())
        rows["full precision"].append(bench.evaluate(fp))
        calib = bench.batches(args.calib_batches, seed)
        for w, v in BITS:
            cfg = snnquant.QuantConfig(weight_bits=w, per_channel=True, v_bits=v)
            q, _ = snnquant.quantize_model(fp, cfg)
            snnquant.calibrate(q, calib, method=args.method)
            rows[f"W{w}/V{v} PTQ"].append(bench.evaluate(q))
            for e in range(1, FINETUNE_EPOCHS + 1 if w < 8 else 1):  # W8/V16 needs none
                q, acc = bench.train(None, seed * 1000 + e, epochs=1, model=q,
                                     lr=bench.args.lr / 10)
                rows[f"W{w}/V{v} PTQ + {e} fine-tuning epochs"].append(acc)
            if not args.skip_qat:
                _, acc = bench.train(cfg, seed)
                rows[f"W{w}/V{v} QAT"].append(acc)
            print(f"seed {seed} W{w}/V{v}: " + ", ".join(
                f"{k.split(' ', 1)[1]} {vals[-1]:.4f}" for k, vals in rows.items()
                if k.startswith(f"W{w}/V{v} ") and vals), flush=True)
        report(args, rows, seeds_done=common.seeds_done(args, seed))


def qat_only(args, bench):
    import snnquant
    rows = {f"W{w}/V{v} QAT": [] for w, v in BITS}
    for seed in args.seeds:
        for w, v in BITS:
            cfg = snnquant.QuantConfig(weight_bits=w, per_channel=True, v_bits=v)
            _, acc = bench.train(cfg, seed)
            rows[f"W{w}/V{v} QAT"].append(acc)
            print(f"seed {seed} W{w}/V{v} QAT {acc:.4f}", flush=True)
        done = common.seeds_done(args, seed)
        lines = [f"Data: {common.data_label(args, args.root)}; QAT from scratch, {args.epochs} "
                 f"epochs, seeds {done} (of {args.seeds} asked); median (min..max).", "", "| configuration | test accuracy |", "|---|---|"]
        lines += [f"| {k} | {fmt(v)} |" for k, v in rows.items() if v]
        table = "\n".join(lines)
        print(table)
        if not args.quick:
            common.write_results(common.results_name(args, "accuracy_qat"), dict(
                epochs=args.epochs, seeds=done, seeds_asked=args.seeds,
                data_sha256=args.data_sha256, rows=rows), table, args.out)


def report(args, rows, seeds_done):
    """Print the table and (unless --quick) write the results, after every seed."""
    rows = {k: v for k, v in rows.items() if v}
    fp_med = spread(rows["full precision"])[0]
    data = common.data_label(args, args.root)
    lines = [f"Data: {data}; full precision and QAT trained {args.epochs} epochs from scratch; "
             f"PTQ: calibrate(method={args.method!r}, {args.calib_batches} batches) of the folded "
             f"full-precision network, fine-tuning at lr/10; seeds {seeds_done} (of {args.seeds} "
             f"asked); median (min..max).",
             "", "| configuration | test accuracy | vs full precision (median) |", "|---|---|---|"]
    for name, values in rows.items():
        med = spread(values)[0]
        lines.append(f"| {name} | {fmt(values)} | {100 * (med - fp_med):+.2f} |")
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        common.write_results(common.results_name(args, "accuracy_ptq"), dict(
            epochs=args.epochs, seeds=seeds_done, seeds_asked=args.seeds, data=data,
            data_sha256=args.data_sha256, method=args.method, skip_qat=args.skip_qat,
            calib_batches=args.calib_batches, rows=rows), table, args.out)


if __name__ == "__main__":
    main()
