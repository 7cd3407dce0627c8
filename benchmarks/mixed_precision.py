"""Mixed precision from ``snnquant.assign_bits`` against uniform bit widths at the same memory
budget, on the N-MNIST example's CSNN, seeds 0, 1, 2 unless ``--seeds`` (the committed table has
ten, run in parallel processes and combined).

Per seed: a full-precision network is trained for ``--epochs`` epochs;
``snnquant.sensitivity`` measures each layer's weights at 2 and 4 bits and each layer's membrane at
4 and 8 bits (post-training, ``--sens-batches`` training batches); ``snnquant.assign_bits`` picks
one width per layer and kind within the budget of uniform 3-bit weights with 8-bit membranes
(weights + biases + membrane state per sample, as ``snnquant.summary`` counts them). Then the
mixed configuration and the uniform configurations that fit the same budget (W3/V8, W2/V8 and
W4/V4: the largest of each kind) are trained from scratch with the same training (``--epochs``
epochs, same seed). Seeds are the outer loop (interleaved cases).

    OMP_NUM_THREADS=1 python benchmarks/mixed_precision.py [--epochs 30] [--fp-cache runs/fp_cache]

Seeds can run in separate processes (``--seeds 3 4 --out DIR``) and be reported together:
``--combine A.json B.json ...`` reads the results of earlier runs (same epochs and data, no seed
twice) and writes the table of all their seeds, without training.

Target (issue 15): mixed precision at least as accurate as the best uniform configuration that
fits the budget.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402


MIXED = "mixed (assign_bits: weights 2/4, membranes 4/8)"
UNIFORM = [(3, 8), (2, 8), (4, 4)]


def model_bytes(model, x) -> float:
    import snnquant
    s = snnquant.summary(model, x)
    return s.total_quant_bytes + s.total_state_quant_bytes


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    ap.add_argument("--sens-batches", type=int, default=4)
    ap.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                    help="report the seeds of these earlier results together (no training)")
    args = ap.parse_args()
    if args.combine:
        return combine(args)
    if args.quick:
        args.epochs, args.seeds, args.sens_batches = 1, args.seeds[:1], 1
    import snnquant

    args.root = common.data_root_of(args)
    bench = common.Bench(args.epochs, args.root, quick=args.quick, fp_cache=args.fp_cache)
    args.data_sha256 = bench.data_sha256()
    template = snnquant.QuantConfig(per_channel=True, v_bits=8)
    x1 = bench.batches(1)[0][0][:, :1]
    uniform = {f"uniform W{w}/V{v}": snnquant.QuantConfig(weight_bits=w, per_channel=True, v_bits=v)
               for w, v in UNIFORM}
    rows = {MIXED: [], **{name: [] for name in uniform}}
    assignments = []
    for seed in args.seeds:
        fp, fp_acc = bench.train(None, seed)
        res = snnquant.sensitivity(fp, bench.batches(args.sens_batches, seed), candidates=(2, 4),
                                   membrane_candidates=(4, 8), config=template)
        print(res, flush=True)
        probe, _ = snnquant.quantize_model(bench.ex.build_csnn(bench.args.channels, bench.args.tau),
                                           uniform["uniform W3/V8"])
        budget = model_bytes(probe, x1)
        mixed = snnquant.assign_bits(res, budget_bytes=budget)
        assignments.append(dict(seed=seed, fp_acc=fp_acc, budget_bytes=budget,
                                bits=mixed.assignment["bits"], bytes=mixed.assignment["bytes"],
                                predicted_delta_loss=mixed.assignment["predicted_delta_loss"],
                                sensitivity=[e._asdict() for e in res.entries]))
        for name, cfg in ((MIXED, mixed), *uniform.items()):
            model, acc = bench.train(cfg, seed)
            size = model_bytes(model, x1)
            assert size <= budget + 1e-6, (name, size, budget)
            rows[name].append(acc)
            print(f"seed {seed} {name}: {100 * acc:.2f}% ({size:.0f} of {budget:.0f} bytes)",
                  flush=True)
        report(args, rows, assignments, args.seeds[:args.seeds.index(seed) + 1])


def combine(args):
    """Report the seeds of earlier results (``--combine``) together, without training."""
    import json
    rows, assignments, seen, first, parts = None, [], {}, None, []
    for path in args.combine:
        try:
            with open(path) as f:
                part = json.load(f)
            part_rows, part_assign = part["rows"], part["assignments"]
            key = (part["epochs"], part["data"], sorted(part_rows))
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--combine: cannot read the results file {path!r}: {e}")
        if first is None:
            first, rows = key, {name: [] for name in part_rows}
        elif key != first:
            raise SystemExit(f"--combine: {path!r} has epochs/data/configurations {key[:2]}, "
                             f"{key[2]}; the first file has {first[:2]}, {first[2]}")
        for i, a in enumerate(part_assign):
            if a["seed"] in seen:
                raise SystemExit(f"--combine: seed {a['seed']} is in both {seen[a['seed']]!r} "
                                 f"and {path!r}")
            seen[a["seed"]] = path
            assignments.append(a)
            for name in rows:
                rows[name].append(part_rows[name][i])
        # each part keeps the command, machine and time it was measured with
        parts.append(dict(seeds=[a["seed"] for a in part_assign], command=part.get("command"),
                          machine=part.get("machine"), finished=part.get("finished"),
                          data_sha256=part.get("data_sha256")))
    digests = {p["data_sha256"] for p in parts} - {None}
    if len(digests) > 1:  # older results have no digest: they cannot be checked, only reported
        raise SystemExit("--combine: the results were measured on different data (data_sha256 "
                         + ", ".join(f"{p['data_sha256']} in seeds {p['seeds']}" for p in parts
                                     if p["data_sha256"]) + ")")
    args.data_sha256 = digests.pop() if digests and all(p["data_sha256"] for p in parts) else None
    order = sorted(range(len(assignments)), key=lambda i: assignments[i]["seed"])
    assignments = [assignments[i] for i in order]
    rows = {name: [values[i] for i in order] for name, values in rows.items()}
    args.epochs = first[0]
    args.seeds = [a["seed"] for a in assignments]
    builtin = common.data_label(args, None)
    report(args, rows, assignments, args.seeds, data=first[1],
           suffix="" if first[1] == builtin else "_real", parts=parts)


def report(args, rows, assignments, seeds_done, data=None, suffix=None, parts=None):
    """Print the table and (unless --quick) write the results, after every seed."""
    import statistics
    data = data or common.data_label(args, args.root)
    best_uniform = max((k for k in rows if k != MIXED), key=lambda k: common.spread(rows[k])[0])
    lines = [f"Data: {data}; every configuration trained {args.epochs} epochs from scratch "
             f"(quantization-aware), seeds {seeds_done} (of {args.seeds} asked); budget = uniform "
             f"3-bit weights + 8-bit membrane state per sample = "
             f"{assignments[0]['budget_bytes']:.0f} bytes (as snnquant.summary counts them); "
             f"median (min..max), mean and standard deviation over the seeds; per seed, "
             f"the configuration against the best uniform one (by median): better / equal / "
             f"worse.", "",
             "| configuration | test accuracy | mean (std) | vs best uniform (median) | "
             "per seed vs best uniform |", "|---|---|---|---|---|"]
    best = common.spread(rows[best_uniform])[0]
    for name, values in rows.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        diff = [v - u for v, u in zip(values, rows[best_uniform])]
        paired = ("-" if name == best_uniform else
                  f"{sum(d > 0 for d in diff)} / {sum(d == 0 for d in diff)} / "
                  f"{sum(d < 0 for d in diff)}")
        lines.append(f"| {name} | {common.fmt(values)} | {100 * statistics.mean(values):.2f}% "
                     f"({100 * std:.2f}) | {100 * (common.spread(values)[0] - best):+.2f} | "
                     f"{paired} |")
    lines += ["", "Bits chosen per seed: " + "; ".join(
        f"seed {a['seed']}: " + ", ".join(
            f"{k.split(' ')[0]}{'w' if '(weight)' in k else 'm'}={b}" for k, b in a["bits"].items())
        + f" ({a['bytes']:.0f} bytes)" for a in assignments),
        "(layer index, w = weights, m = membrane, = bits)"]
    if parts:
        lines += ["", "Seeds measured by: " + "; ".join(
            f"`{p['command']}` (seed{'s' * (len(p['seeds']) > 1)} {', '.join(map(str, p['seeds']))})"
            for p in parts)]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        if suffix is None:
            suffix = "" if args.root is None else "_real"
        common.write_results(f"mixed_precision{suffix}", dict(
            epochs=args.epochs, seeds=seeds_done, seeds_asked=args.seeds, data=data,
            data_sha256=args.data_sha256, rows=rows, assignments=assignments,
            **({"parts": parts} if parts else {})), table, args.out)


if __name__ == "__main__":
    main()
