"""Mixed precision from ``snnquant.assign_bits`` against every uniform bit width that fits the same
memory budget, on the N-MNIST example's CSNN, fake-quantized and deployed (issue 27 §1).

Budgets: ``--budgets`` fractions (default 1/3 and 2/3) of the way from the bytes of uniform W2/V4
to those of uniform W4/V8 (weights + biases + membrane state per sample, as ``snnquant.summary``
counts them). Uniform configurations: weights 2, 3, 4 bits x membranes 4, 6, 8 bits, each listed
under every budget it fits.

Per seed: a full-precision network is trained for ``--epochs`` epochs (or read from
``--fp-cache``); two sensitivities of it are taken on ``--sens-batches`` training batches, weights
at 2, 3, 4, 8 bits and membranes at 4, 6, 8 bits: ``measured`` (``snnquant.sensitivity``, one
layer quantized post-training at a time) and ``hessian`` (``method='hessian'``: the weights from
the Hessian trace, HAWQ-V2, ``--hessian-samples`` Hutchinson vectors per batch; the membranes
measured). ``snnquant.assign_bits`` picks one width per layer and kind within each budget. Every
configuration (uniform and mixed) is then trained from scratch with the same training
(``--epochs`` epochs, same seed; or, with ``--qat-epochs N``, ``N`` epochs of quantization-aware
fine-tuning that start from the seed's full-precision network) and its test accuracy taken (fake-quantized), and deployed:
BatchNorm folded (``fold_batchnorm``), fine-tuned ``--finetune-epochs`` epochs at a tenth of the
learning rate, exported (``to_integer``) and run by ``IntegerSNN`` on the test set (deployed
accuracy). Seeds are the outer loop (interleaved cases).

    OMP_NUM_THREADS=1 python benchmarks/mixed_precision.py \\
        --real-split ../shared/data/nmnist-real-1k --seeds 0 1 2 3 4 [--fp-cache runs/fp_cache]

Per seed it trains the full-precision network and ten quantized ones (six uniform, four mixed)
for ``--epochs`` (30) epochs each, plus one fine-tuning epoch each: an estimated ten minutes per network on one
CPU thread (17 s per full-precision epoch on a loaded 2-core machine), so run the seeds in parallel processes and ``--combine`` them.

Seeds can run in separate processes (``--seeds 3 4 --out DIR``) and be reported together:
``--combine A.json B.json ...`` reads the results of earlier runs (same epochs, data and
configurations, no seed twice) and writes the table of all their seeds, without training.

Target (issue 27): at each budget, a mixed assignment beats the best uniform configuration that
fits it by at least 1.0 point, median over the seeds, deployed accuracy, on the real split.
"""
from __future__ import annotations

import copy
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt  # noqa: E402

WEIGHT_CANDIDATES = (2, 3, 4, 8)
MEMBRANE_CANDIDATES = (4, 6, 8)
UNIFORM = [(w, v) for w in (2, 3, 4) for v in (4, 6, 8)]
METHODS = ("measured", "hessian")
UNIFORM_BITS = {f"uniform W{w}/V{v}": (w, v) for w, v in UNIFORM}
TARGET_POINTS = 1.0


def model_bytes(model, x) -> float:
    import snnquant
    s = snnquant.summary(model, x)
    return s.total_quant_bytes + s.total_state_quant_bytes


def uniform_name(w: int, v: int) -> str:
    return f"uniform W{w}/V{v}"  # the keys of UNIFORM_BITS


def mixed_name(method: str, budget: int) -> str:
    return f"mixed {method} @ budget {budget}"


def fraction(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


def budgets_of(bench, fractions):
    """The budgets (bytes) and the bytes of every uniform configuration."""
    import snnquant
    x1 = bench.batches(1)[0][0][:, :1]
    sizes = {}
    for w, v in UNIFORM + [(2, 4), (4, 8)]:
        probe, _ = snnquant.quantize_model(
            bench.ex.build_csnn(bench.args.channels, bench.args.tau),
            snnquant.QuantConfig(weight_bits=w, per_channel=True, v_bits=v))
        sizes[(w, v)] = model_bytes(probe, x1)
    low, high = sizes[(2, 4)], sizes[(4, 8)]
    budgets = []
    for i, f in enumerate(fractions, 1):
        limit = low + f * (high - low)
        budgets.append(dict(index=i, fraction=f, bytes=limit,
                            uniform=[uniform_name(w, v) for w, v in UNIFORM
                                     if sizes[(w, v)] <= limit + 1e-6],
                            mixed=[mixed_name(m, i) for m in METHODS]))
    return budgets, {uniform_name(w, v): s for (w, v), s in sizes.items()}


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    ap.add_argument("--sens-batches", type=int, default=4)
    ap.add_argument("--hessian-samples", type=int, default=16)
    ap.add_argument("--finetune-epochs", type=int, default=1,
                    help="epochs of fine-tuning after BatchNorm folding, before the export")
    ap.add_argument("--qat-epochs", type=int, default=None,
                    help="train every quantized configuration this many epochs starting from the "
                         "seed's full-precision network (quantization-aware fine-tuning) instead "
                         "of --epochs epochs from scratch")
    ap.add_argument("--budgets", type=fraction, nargs="+", default=[1 / 3, 2 / 3],
                    help="budgets as fractions of the way from uniform W2/V4 to W4/V8 bytes")
    ap.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                    help="report the seeds of these earlier results together (no training)")
    if "--combine" in sys.argv:
        return combine(ap.parse_args())
    args, bench = common.parse_and_bench(ap)
    if args.quick:
        args.sens_batches, args.hessian_samples = 1, 2
    import snnquant

    template = snnquant.QuantConfig(per_channel=True, v_bits=8)
    x1 = bench.batches(1)[0][0][:, :1]
    budgets, sizes = budgets_of(bench, args.budgets)
    names = sorted({n for b in budgets for n in b["uniform"]},
                   key=lambda n: sizes[n]) + [n for b in budgets for n in b["mixed"]]
    rows = {name: [] for name in names}
    deployed = {name: [] for name in names}
    assignments = []
    for seed in args.seeds:
        fp, fp_acc = bench.train(None, seed)
        sens_batches = bench.batches(args.sens_batches, seed)
        configs = {name: snnquant.QuantConfig(weight_bits=UNIFORM_BITS[name][0], per_channel=True,
                                              v_bits=UNIFORM_BITS[name][1])
                   for name in names if name in UNIFORM_BITS}
        record = dict(seed=seed, fp_acc=fp_acc, mixed={})
        for method in METHODS:
            res = snnquant.sensitivity(fp, sens_batches, candidates=WEIGHT_CANDIDATES,
                                       membrane_candidates=MEMBRANE_CANDIDATES, config=template,
                                       method=method, hessian_samples=args.hessian_samples,
                                       seed=seed)
            print(res, flush=True)
            for b in budgets:
                cfg = snnquant.assign_bits(res, budget_bytes=b["bytes"])
                name = mixed_name(method, b["index"])
                configs[name] = cfg
                record["mixed"][name] = dict(
                    bits=cfg.assignment["bits"], bytes=cfg.assignment["bytes"],
                    predicted_delta_loss=cfg.assignment["predicted_delta_loss"])
            record[f"sensitivity_{method}"] = [e._asdict() for e in res.entries]
            if method == "hessian":
                record["hessian_trace"] = res.hessian_trace
        assignments.append(record)
        for name in names:
            if args.qat_epochs is None:
                model, acc = bench.train(configs[name], seed)
            else:  # quantization-aware fine-tuning of the full-precision network
                start, _ = snnquant.quantize_model(copy.deepcopy(fp), configs[name])
                model, acc = bench.train(configs[name], seed, epochs=args.qat_epochs, model=start)
            size = model_bytes(model, x1)
            limit = max(b["bytes"] for b in budgets if name in b["uniform"] + b["mixed"])
            assert size <= limit + 1e-6, (name, size, limit)
            rows[name].append(acc)
            deployed[name].append(common.deployed_accuracy(bench, model, seed, args.finetune_epochs))
            print(f"seed {seed} {name}: {100 * acc:.2f}% fake-quantized, "
                  f"{100 * deployed[name][-1]:.2f}% deployed ({size:.0f} bytes)", flush=True)
        report(args, rows, deployed, budgets, assignments, common.seeds_done(args, seed))


def combine(args):
    """Report the seeds of earlier results (``--combine``) together, without training."""
    import json
    rows = deployed = None
    assignments, seen, first, parts = [], {}, None, []
    for path in args.combine:
        try:
            with open(path) as f:
                part = json.load(f)
            part_rows, part_dep, part_assign = part["rows"], part["deployed"], part["assignments"]
            key = (part["epochs"], part["data"], sorted(part_rows), part["budgets"],
                   part["finetune_epochs"], part.get("qat_epochs"))
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--combine: cannot read the results file {path!r}: {e}")
        if first is None:
            first = key
            rows, deployed = ({name: [] for name in part_rows} for _ in range(2))
        elif key != first:
            raise SystemExit(f"--combine: {path!r} has epochs/data/configurations/fine-tuning "
                             f"{key[:2]}, {key[2]}, {key[4]} epochs (budgets {key[3]}); the first "
                             f"file has {first[:2]}, {first[2]}, {first[4]} (budgets {first[3]})")
        for i, a in enumerate(part_assign):
            if a["seed"] in seen:
                raise SystemExit(f"--combine: seed {a['seed']} is in both {seen[a['seed']]!r} "
                                 f"and {path!r}")
            seen[a["seed"]] = path
            assignments.append(a)
            for name in rows:
                rows[name].append(part_rows[name][i])
                deployed[name].append(part_dep[name][i])
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
    deployed = {name: [values[i] for i in order] for name, values in deployed.items()}
    args.epochs, args.finetune_epochs, args.qat_epochs = first[0], first[4], first[5]
    args.seeds = [a["seed"] for a in assignments]
    builtin = common.data_label(args, None)
    report(args, rows, deployed, first[3], assignments, args.seeds, data=first[1],
           suffix="" if first[1] == builtin else "_real", parts=parts)


def columns(name, values, uniform, table):
    """Median (min..max), mean (std), median against the best uniform one, and per seed
    against it (better / equal / worse)."""
    best = max(uniform, key=lambda k: statistics.median(table[k]))
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    diff = [v - u for v, u in zip(values, table[best])]
    paired = ("-" if name == best else
              f"{sum(d > 0 for d in diff)} / {sum(d == 0 for d in diff)} / "
              f"{sum(d < 0 for d in diff)}")
    return (f"{fmt(values)} | {100 * statistics.mean(values):.2f}% ({100 * std:.2f}) | "
            f"{100 * (statistics.median(values) - statistics.median(table[best])):+.2f} | {paired}")


def report(args, rows, deployed, budgets, assignments, seeds_done, data=None, suffix=None,
           parts=None):
    """Print the tables (one per budget) and (unless --quick) write the results, after every
    seed."""
    data = data or common.data_label(args, args.root)
    trained = (f"trained {args.epochs} epochs from scratch" if args.qat_epochs is None else
               f"trained {args.qat_epochs} epochs from the seed's full-precision network "
               f"(itself trained {args.epochs} epochs)")
    lines = [f"Data: {data}; every configuration {trained} "
             f"(quantization-aware), seeds {seeds_done} (of {args.seeds} asked); deployed = "
             f"BatchNorm folded, fine-tuned {args.finetune_epochs} epoch(s), "
             f"exported to integers and run by IntegerSNN; bytes as snnquant.summary counts them "
             f"(weights + biases + membrane state per sample); median (min..max), mean (std) over "
             f"the seeds; against the best uniform configuration that fits the budget (by "
             f"median): the median difference in points and per seed better / equal / worse."]
    verdicts = []
    for b in budgets:
        uniform, mixed = b["uniform"], b["mixed"]
        lines += ["", f"Budget {b['index']}: {b['bytes']:.0f} bytes ({b['fraction']:.2f} of the "
                      f"way from uniform W2/V4 to W4/V8)", "",
                  "| configuration | fake-quantized | mean (std) | vs best uniform | per seed | "
                  "deployed | mean (std) | vs best uniform | per seed |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name in uniform + mixed:
            lines.append(f"| {name} | {columns(name, rows[name], uniform, rows)} | "
                         f"{columns(name, deployed[name], uniform, deployed)} |")
        best = max(uniform, key=lambda k: statistics.median(deployed[k]))
        best_med = statistics.median(deployed[best])
        gains = {m: 100 * (statistics.median(deployed[m]) - best_med) for m in mixed}
        top = max(gains, key=gains.get)
        met = gains[top] >= TARGET_POINTS
        verdicts.append(dict(budget=b["index"], bytes=b["bytes"], best_uniform=best,
                             best_uniform_deployed=best_med, gains_points=gains, met=met))
        lines += ["", f"Verdict, budget {b['index']}: best {best} "
                      f"{100 * best_med:.2f}% deployed (median); "
                  + ", ".join(f"{m} {g:+.2f} points" for m, g in gains.items())
                  + f"; target (a mixed assignment >= +{TARGET_POINTS:.1f} points): "
                  + ("met" if met else f"missed by {TARGET_POINTS - gains[top]:.2f} points")
                  + "."]
    lines += ["", "Bits chosen per seed: " + "; ".join(
        f"seed {a['seed']} {name}: " + ", ".join(
            f"{k.split(' ')[0]}{'w' if '(weight)' in k else 'm'}={bits}"
            for k, bits in m["bits"].items()) + f" ({m['bytes']:.0f} bytes)"
        for a in assignments for name, m in a["mixed"].items()),
        "(layer index, w = weights, m = membrane, = bits)"]
    if parts:
        lines += ["", "Seeds measured by: " + "; ".join(
            f"`{p['command']}` (seed{'s' * (len(p['seeds']) > 1)} {', '.join(map(str, p['seeds']))})"
            for p in parts)]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        name = ("mixed_precision" + suffix if suffix is not None
                else common.results_name(args, "mixed_precision"))
        common.write_results(name, dict(
            epochs=args.epochs, seeds=seeds_done, seeds_asked=args.seeds, data=data,
            data_sha256=args.data_sha256, budgets=budgets, rows=rows, deployed=deployed,
            verdicts=verdicts, assignments=assignments,
            finetune_epochs=args.finetune_epochs, qat_epochs=args.qat_epochs,
            **({"parts": parts} if parts else {})), table, args.out)


if __name__ == "__main__":
    main()
