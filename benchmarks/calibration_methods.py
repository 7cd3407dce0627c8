"""Post-training calibration methods compared on the N-MNIST example's CSNN: ``minmax``,
``percentile``, ``mse`` and ``firing`` (issue 27 §3), at W4/V8 and W2/V4, no fine-tuning.

Per seed: the full-precision network is trained for ``--epochs`` epochs (or taken from
``--fp-cache``) and its BatchNorm folded; each method then quantizes a copy of it
(``quantize_model``, per-channel power-of-two weights, uniform membrane) and calibrates it on the
same ``--calib-batches`` training batches. The table gives the median test accuracy over the seeds
with its range, and per seed how often ``firing`` is better / equal / worse than the best of the
other three methods on that seed. Each row also gives the lowest ratio of a layer's quantized to
float firing rate (``report.firing``), the silencing the firing check reports.

    OMP_NUM_THREADS=1 python benchmarks/calibration_methods.py \
        --real-split ../shared/data/nmnist-real-1k --fp-cache runs/fp_cache [--seeds 0 1 2 3 4]

Target (issue 27): ``firing`` at least as accurate as the best existing method at W4/V8 and
better at W2/V4, median over the seeds, on the real-recordings split.
"""
from __future__ import annotations

import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt, write_rst_table  # noqa: E402

BITS = [(4, 8), (2, 4)]
METHODS = ("minmax", "percentile", "mse", "firing")


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    ap.add_argument("--calib-batches", type=int, default=8)
    args, bench = common.parse_and_bench(ap)
    import snnquant
    from snnquant.export import fold_batchnorm

    rows = {"full precision": []}
    low_rate = {}
    for w, v in BITS:
        for method in METHODS:
            rows[f"W{w}/V{v} {method}"] = []
            low_rate[f"W{w}/V{v} {method}"] = []
    for seed in args.seeds:
        fp, _ = bench.train(None, seed)
        fp = fold_batchnorm(fp.eval())
        rows["full precision"].append(bench.evaluate(fp))
        calib = bench.batches(args.calib_batches, seed)
        for w, v in BITS:
            for method in METHODS:
                cfg = snnquant.QuantConfig(weight_bits=w, per_channel=True, v_bits=v)
                q, _ = snnquant.quantize_model(fp, cfg)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", snnquant.FiringRateWarning)
                    report = snnquant.calibrate(q, calib, method=method)
                key = f"W{w}/V{v} {method}"
                rows[key].append(bench.evaluate(q))
                low_rate[key].append(min(f.ratio for f in report.firing))
                print(f"seed {seed} {key}: {rows[key][-1]:.4f} (lowest rate ratio "
                      f"{low_rate[key][-1]:.3f})", flush=True)
        write(args, rows, low_rate, common.seeds_done(args, seed))


def paired(rows, w, v):
    """Per seed: firing against the best of the other methods: (better, equal, worse)."""
    better = equal = worse = 0
    others = [rows[f"W{w}/V{v} {m}"] for m in METHODS if m != "firing"]
    for i, acc in enumerate(rows[f"W{w}/V{v} firing"]):
        best = max(o[i] for o in others)
        better, equal, worse = (better + (acc > best), equal + (acc == best), worse + (acc < best))
    return better, equal, worse


def write(args, rows, low_rate, seeds_done):
    data = common.data_label(args, args.root)
    lines = [f"Data: {data}; full precision trained {args.epochs} epochs and BatchNorm folded; "
             f"PTQ with calibrate(method=..., {args.calib_batches} batches), no fine-tuning; "
             f"seeds {seeds_done} (of {args.seeds} asked); median (min..max).", "",
             "| configuration | test accuracy | lowest layer rate / float rate (median) | "
             "firing vs best other, per seed (better/equal/worse) |", "|---|---|---|---|"]
    lines.append(f"| full precision | {fmt(rows['full precision'])} | - | - |")
    verdicts = {}
    for w, v in BITS:
        meds = {m: statistics.median(rows[f"W{w}/V{v} {m}"]) for m in METHODS}
        best_other = max(meds[m] for m in METHODS if m != "firing")
        verdicts[f"W{w}/V{v}"] = dict(firing=meds["firing"], best_other=best_other,
                                      difference_points=100 * (meds["firing"] - best_other))
        for m in METHODS:
            key = f"W{w}/V{v} {m}"
            pair = "%d/%d/%d" % paired(rows, w, v) if m == "firing" else "-"
            lines.append(f"| W{w}/V{v} PTQ {m} | {fmt(rows[key])} | "
                         f"{statistics.median(low_rate[key]):.3f} | {pair} |")
    w4, w2 = verdicts["W4/V8"], verdicts["W2/V4"]
    lines += ["", f"Target: firing >= best other at W4/V8: {w4['difference_points']:+.2f} points "
                  f"({'met' if w4['difference_points'] >= 0 else 'missed'}); firing > best other "
                  f"at W2/V4: {w2['difference_points']:+.2f} points "
                  f"({'met' if w2['difference_points'] > 0 else 'missed'})."]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        name = common.results_name(args, "calibration_methods")
        common.write_results(name, dict(
            epochs=args.epochs, seeds=seeds_done, seeds_asked=args.seeds, data=data,
            data_sha256=args.data_sha256, calib_batches=args.calib_batches, rows=rows,
            lowest_rate_ratio=low_rate, verdicts=verdicts), table, args.out)
        write_rst_table(args.out, name)  # the PTQ guide includes it


if __name__ == "__main__":
    main()
