"""Binary (W1) and ternary weights with an 8-bit membrane against full precision: the N-MNIST
example's CSNN trained from scratch with quantization in the loop, 3 seeds, seeds interleaved.

Per run: test accuracy of the trained network; for the quantized ones also after folding BN into
the binary/ternary weights (the per-channel alpha is multiplied by |gamma/sigma| and rounded to a
power of two, which is what changes the network), after one fine-tuning epoch of the folded
network (lr/10), and the agreement of the exact integer export (weights stored 1 and 2 bits each)
of that deployed network with its float model.

    OMP_NUM_THREADS=1 python benchmarks/accuracy_binary_ternary.py [--epochs 30] \
        [--real-split ../shared/data/nmnist-real-1k] [--fp-cache runs/fp_cache]

Target (issue 15): within 2 points of full precision on the built-in data.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nmnist_common as common  # noqa: E402
from _tables import fmt, spread  # noqa: E402


def configs():
    from snnquant import QuantConfig
    return [
        ("full precision", None),
        ("binary W1/V8", QuantConfig(weight_bits=1, per_channel=True, v_bits=8)),
        ("ternary W2/V8", QuantConfig(weight_quantizer="ternary", weight_bits=2, per_channel=True,
                                      v_bits=8)),
    ]


def deploy(bench, model, seed: int, samples: int = 64):
    """Fold BN, evaluate, fine-tune the folded network one epoch, export it to integers."""
    import torch
    from spikingjelly.activation_based import functional
    from snnquant.export import fold_batchnorm, integer_agreement, to_integer
    folded = fold_batchnorm(model.eval())
    functional.reset_net(folded)
    acc = bench.evaluate(folded)
    tuned, tuned_acc = bench.train(None, seed * 1000 + 1, epochs=1, model=folded,
                                   lr=bench.args.lr / 10)
    tuned.eval()
    functional.reset_net(tuned)
    x = torch.stack([torch.as_tensor(bench.test_set[i][0])
                     for i in range(min(samples, len(bench.test_set)))])
    desc = to_integer(tuned)
    bits = sorted({op.weight_bits for op in desc.ops if hasattr(op, "weight_bits")})
    return acc, tuned_acc, float(integer_agreement(tuned, x.float().transpose(0, 1), desc)), bits


def main():
    ap = common.common_args(__doc__, default_epochs=30)
    args, bench = common.parse_and_bench(ap)
    rows = {name: dict(test_acc=[], folded_acc=[], tuned_acc=[], agreement=[], seconds=[],
                       weight_bits=None) for name, _ in configs()}
    for seed in args.seeds:          # seeds outer, configurations inner: interleaved
        for name, cfg in configs():
            t0 = time.time()
            model, acc = bench.train(cfg, seed)
            r = rows[name]
            r["test_acc"].append(acc)
            if cfg is not None:
                folded, tuned, agreement, bits = deploy(bench, model, seed)
                r["folded_acc"].append(folded)
                r["tuned_acc"].append(tuned)
                r["agreement"].append(agreement)
                r["weight_bits"] = bits
            r["seconds"].append(time.time() - t0)
            print(f"seed {seed} {name}: {100 * acc:.2f}%" + (
                f", BN folded {100 * r['folded_acc'][-1]:.2f}%, + 1 epoch "
                f"{100 * r['tuned_acc'][-1]:.2f}%, integer agreement "
                f"{100 * r['agreement'][-1]:.2f}%" if cfg is not None else ""), flush=True)
        report(args, rows, common.seeds_done(args, seed))


def report(args, rows, seeds_done):
    """Print the table and (unless --quick) write the results, after every seed."""
    fp = spread(rows["full precision"]["test_acc"])[0]
    data = common.data_label(args, args.root)
    lines = [f"Data: {data}; {args.epochs} epochs from scratch, seeds {seeds_done} (of "
             f"{args.seeds} asked); median (min..max). BN folded: alpha times |gamma/sigma|, "
             f"rounded to a power of two; deployed: the folded network after 1 fine-tuning epoch "
             f"(lr/10), exported to integers.", "",
             "| configuration | test accuracy | vs full precision (median) | BN folded | "
             "deployed (folded + 1 epoch) | integer agreement | exported weight bits |",
             "|---|---|---|---|---|---|---|"]
    for name, _ in configs():
        r = rows[name]
        if not r["test_acc"]:
            continue
        med = spread(r["test_acc"])[0]
        folded = fmt(r["folded_acc"]) if r["folded_acc"] else "-"
        tuned = fmt(r["tuned_acc"]) if r["tuned_acc"] else "-"
        agree = fmt(r["agreement"]) if r["agreement"] else "-"
        lines.append(f"| {name} | {fmt(r['test_acc'])} | {100 * (med - fp):+.2f} | {folded} "
                     f"| {tuned} | {agree} | {r['weight_bits'] or '-'} |")
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        common.write_results(common.results_name(args, "accuracy_binary_ternary"), dict(
            epochs=args.epochs, seeds=seeds_done, seeds_asked=args.seeds, data=data,
            data_sha256=args.data_sha256, rows=rows),
            table, args.out)


if __name__ == "__main__":
    main()
