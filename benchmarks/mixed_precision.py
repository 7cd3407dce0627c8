"""Mixed precision from ``snnquant.assign_bits`` against uniform bit widths at the same memory
budget, on the N-MNIST example's CSNN, 3 seeds.

Per seed: a full-precision network is trained for ``--epochs`` epochs;
``snnquant.sensitivity`` measures each layer's weights at 2 and 4 bits (post-training, membranes
at 8 bits, ``--sens-batches`` training batches); ``snnquant.assign_bits`` picks 2 or 4 bits per
layer within the budget of uniform 3-bit weights (weights + biases + 8-bit membrane state, as
``snnquant.summary`` counts them). Then the mixed configuration and every uniform configuration
that fits the same budget (W2 and W3) are trained from scratch with the same training
(``--epochs`` epochs, same seed). Seeds are the outer loop (interleaved cases).

    OMP_NUM_THREADS=1 python benchmarks/mixed_precision.py [--epochs 4]

Target (issue 15): mixed precision at least as accurate as the best uniform configuration that
fits the budget.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402


def model_bytes(model, x) -> float:
    import snnquant
    s = snnquant.summary(model, x)
    return s.total_quant_bytes + s.total_state_quant_bytes


def main():
    ap = common.common_args(__doc__, default_epochs=4)
    ap.add_argument("--sens-batches", type=int, default=4)
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.seeds, args.sens_batches = 1, args.seeds[:1], 1
    import snnquant

    bench = common.Bench(args.epochs, args.data_root, quick=args.quick)
    template = snnquant.QuantConfig(per_channel=True, v_bits=8)
    x1 = bench.batches(1)[0][0][:, :1]
    rows = {"mixed (assign_bits, 2/4-bit)": [], "uniform W3": [], "uniform W2": []}
    assignments = []
    for seed in args.seeds:
        fp, fp_acc = bench.train(None, seed)
        res = snnquant.sensitivity(fp, bench.batches(args.sens_batches, seed), candidates=(2, 4),
                                   config=template, membranes=False)
        print(res, flush=True)
        uniform3 = snnquant.QuantConfig(weight_bits=3, per_channel=True, v_bits=8)
        probe, _ = snnquant.quantize_model(bench.ex.build_csnn(bench.args.channels, bench.args.tau),
                                           uniform3)
        budget = model_bytes(probe, x1)
        mixed = snnquant.assign_bits(res, budget_bytes=budget)
        assignments.append(dict(seed=seed, fp_acc=fp_acc, budget_bytes=budget,
                                bits=mixed.assignment["bits"], bytes=mixed.assignment["bytes"],
                                predicted_delta_loss=mixed.assignment["predicted_delta_loss"],
                                sensitivity=[e._asdict() for e in res.entries]))
        for name, cfg in (("mixed (assign_bits, 2/4-bit)", mixed), ("uniform W3", uniform3),
                          ("uniform W2", snnquant.QuantConfig(weight_bits=2, per_channel=True,
                                                              v_bits=8))):
            model, acc = bench.train(cfg, seed)
            size = model_bytes(model, x1)
            assert size <= budget + 1e-6, (name, size, budget)
            rows[name].append(acc)
            print(f"seed {seed} {name}: {100 * acc:.2f}% ({size:.0f} of {budget:.0f} bytes)",
                  flush=True)
        report(args, rows, assignments, args.seeds[:args.seeds.index(seed) + 1])


def report(args, rows, assignments, seeds_done):
    """Print the table and (unless --quick) write the results, after every seed."""
    data = "built-in digits (N-MNIST format)" if args.data_root is None else args.data_root
    best_uniform = max(("uniform W3", "uniform W2"), key=lambda k: common.spread(rows[k])[0])
    lines = [f"Data: {data}; every configuration trained {args.epochs} epochs from scratch "
             f"(quantization-aware), seeds {seeds_done} (of {args.seeds} asked); budget = uniform "
             f"3-bit weights + 16-bit biases + 8-bit membrane state = "
             f"{assignments[0]['budget_bytes']:.0f} bytes; median (min..max).", "",
             "| configuration | test accuracy | vs best uniform (median) |", "|---|---|---|"]
    best = common.spread(rows[best_uniform])[0]
    for name, values in rows.items():
        lines.append(f"| {name} | {common.fmt(values)} | "
                     f"{100 * (common.spread(values)[0] - best):+.2f} |")
    lines += ["", "Bits chosen per seed: " + "; ".join(
        f"seed {a['seed']}: " + ", ".join(f"{k.split(' ')[0]}={b}" for k, b in a["bits"].items())
        for a in assignments)]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        common.write_results("mixed_precision", dict(
            epochs=args.epochs, seeds=seeds_done, seeds_asked=args.seeds, data=data, rows=rows,
            assignments=assignments), table, args.out)


if __name__ == "__main__":
    main()
