"""Accuracy of the N-MNIST example on 1,000 REAL N-MNIST recordings: full precision, 4-bit weights /
8-bit membrane, 2-bit weights / 4-bit membrane, 3 seeds each (CPU).

The recordings are the shared ``nmnist-real-1k`` set (the first 1,000 samples of N-MNIST's training
set, ``Train/<label>/<id>.bin``; found as ``$SNNQUANT_SHARED_DATA/nmnist-real-1k``, else
``<repo>/../shared/data/nmnist-real-1k``, else ``/work/shared/data/nmnist-real-1k``). They are never
copied: the script lays out a root of symbolic links under ``--runs``.

Split (fixed, stratified, independent of the training seed): the files of each class, sorted by
name, are shuffled with ``numpy.random.default_rng([0, label])``; the first ``n_test[label]`` go to
the test split, the rest to the training split, where ``n_test`` is 20 % of each class rounded by
largest remainder so that the totals are exactly 800 training and 200 test recordings
(:func:`snnquant.datasets.stratified_split` with ``test_count=200, seed=0``).

Each (seed, configuration) runs ``examples/train_nmnist.py --data-root <root>`` once, seeds in the
outer loop and the three configurations interleaved inside it; the table gives the mean and the
sample standard deviation over the seeds of the test accuracy, the accuracy of the network as
deployed (BN folded, fine-tuned, the network that is exported) and the integer agreement
(whole output spike trains identical, integer simulator vs fake-quantized model, 64 test samples).
Writes benchmarks/results/accuracy_nmnist_real.{json,md}.

    OMP_NUM_THREADS=1 python benchmarks/accuracy_nmnist_real.py --epochs 12 --finetune-epochs 3
    python benchmarks/accuracy_nmnist_real.py --quick       # smoke test: 1 epoch, 1 seed, 2 per class
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _machine import machine, use_checkout  # noqa: E402
from _tables import RESULTS, write_files, write_rst_table  # noqa: E402

ROOT = HERE.parent

CONFIGS = [
    ("full precision", ["--weight-bits", "0", "--v-bits", "0"]),
    ("4-bit weights, 8-bit membrane", ["--weight-bits", "4", "--v-bits", "8"]),
    ("2-bit weights, 4-bit membrane", ["--weight-bits", "2", "--v-bits", "4"]),
]
SPLIT_SEED = 0
TEST_COUNT = 200


def shared_recordings() -> Path:
    for base in (os.environ.get("SNNQUANT_SHARED_DATA"), ROOT.parent / "shared" / "data", "/work/shared/data"):
        if base and (Path(base) / "nmnist-real-1k" / "Train").is_dir():
            return Path(base) / "nmnist-real-1k"
    raise SystemExit("nmnist-real-1k not found: set SNNQUANT_SHARED_DATA to the folder that holds it")


def lay_out_split(source: Path, root: Path, quick: bool) -> dict:
    """Symbolic links <root>/Train/<c>/*.bin and <root>/Test/<c>/*.bin for the fixed split."""
    import numpy as np

    use_checkout()
    from snnquant.datasets import stratified_split

    files = sorted(p for p in (source / "Train").glob("*/*.bin"))
    labels = np.array([int(p.parent.name) for p in files])
    split = stratified_split(labels, test_count=TEST_COUNT, seed=SPLIT_SEED)
    if quick:  # two per class in each split
        split = {k: np.concatenate([v[labels[v] == c][:2] for c in range(10)]) for k, v in split.items()}
    listing = {}
    for name, folder in (("train", "Train"), ("test", "Test")):
        listing[name] = [str(files[i].relative_to(source)) for i in split[name]]
        for i in split[name]:
            link = root / folder / files[i].parent.name / files[i].name
            if link.is_symlink() and os.readlink(link) != str(files[i]):
                link.unlink()  # laid out from another source path (a relative one, say)
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(files[i])
    return listing


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--finetune-epochs", type=int, default=3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 epoch, seed 0, 2 samples per class")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--runs", default=str(ROOT / "runs" / "accuracy_nmnist_real"))
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.finetune_epochs, args.seeds = 1, 1, [0]
        args.out = os.path.join(args.runs, "quick_results")
    runs = Path(args.runs)
    source = shared_recordings()
    root = runs / ("root_quick" if args.quick else "root")
    listing = lay_out_split(source, root, args.quick)
    print(f"split: {len(listing['train'])} train / {len(listing['test'])} test recordings of {source}")
    rows = []
    for seed in args.seeds:
        for name, flags in CONFIGS:
            out = runs / f"seed{seed}_{name.split(',')[0].replace(' ', '_').replace('-', '')}"
            shown = [*flags, "--data-root", "<root>", "--epochs", str(args.epochs),
                     "--finetune-epochs", str(args.finetune_epochs), "--seed", str(seed)]
            cmd = [sys.executable, str(ROOT / "examples" / "train_nmnist.py"),
                   *[str(root) if a == "<root>" else a for a in shown], "--out", str(out), "--device", "cpu"]
            shutil.rmtree(out, ignore_errors=True)  # a run folder holds one run: a rerun starts anew
            t0 = time.time()
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
            seconds = time.time() - t0
            if res.returncode != 0:
                print(res.stdout[-2000:], res.stderr[-2000:])
                raise SystemExit(f"{name}, seed {seed}: training failed")
            result = json.loads((out / "metrics.json").read_text())["result"]
            integer = result.get("integer", {})
            rows.append(dict(config=name, seed=seed, test_acc=result["test_acc"],
                             deployed_test_acc=integer.get("folded_test_acc"),
                             integer_agreement=integer.get("agreement"), wall_seconds=seconds,
                             command="python examples/train_nmnist.py " + " ".join(shown)))
            print(f"seed {seed}, {name}: test accuracy {100 * result['test_acc']:.2f}% "
                  f"({seconds:.0f} s)", flush=True)

    def stat(values):
        values = [v for v in values if v is not None]
        if not values:
            return None, None
        return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

    def pct(mean_sd):
        mean, sd = mean_sd
        return "-" if mean is None else f"{100 * mean:.1f} ± {100 * sd:.1f}%"

    summary = []
    lines = [f"Real N-MNIST, {len(listing['train'])} train / {len(listing['test'])} test recordings "
             f"(fixed stratified split, seed {SPLIT_SEED}), {args.epochs} epochs + {args.finetune_epochs} "
             f"fine-tuning epochs after BN folding, seeds {args.seeds}; mean ± sample standard deviation.",
             "",
             "| configuration | test accuracy | deployed (BN folded, fine-tuned) | integer agreement | per seed (test) |",
             "|---|---|---|---|---|"]
    for name, _ in CONFIGS:
        mine = [r for r in rows if r["config"] == name]
        acc, dep, agr = (stat([r[k] for r in mine]) for k in ("test_acc", "deployed_test_acc", "integer_agreement"))
        per_seed = ", ".join(f"{100 * r['test_acc']:.1f}" for r in mine)
        summary.append(dict(config=name, test_acc_mean=acc[0], test_acc_std=acc[1],
                            deployed_test_acc_mean=dep[0], deployed_test_acc_std=dep[1],
                            integer_agreement_mean=agr[0], integer_agreement_min=min(
                                (r["integer_agreement"] for r in mine if r["integer_agreement"] is not None),
                                default=None)))
        lines.append(f"| {name} | {pct(acc)} | {pct(dep)} | {pct(agr)} | {per_seed} |")
    total = sum(r["wall_seconds"] for r in rows)
    lines += ["", f"Wall time {total:.0f} s for the {len(rows)} runs (CPU, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS')}). Command: `OMP_NUM_THREADS=1 python "
              f"benchmarks/accuracy_nmnist_real.py --epochs {args.epochs} --finetune-epochs "
              f"{args.finetune_epochs} --seeds {' '.join(map(str, args.seeds))}`."]
    table = "\n".join(lines)
    print(table)
    report = dict(machine=machine(), command="OMP_NUM_THREADS=1 python benchmarks/accuracy_nmnist_real.py "
                  f"--epochs {args.epochs} --finetune-epochs {args.finetune_epochs} --seeds "
                  + " ".join(map(str, args.seeds)),
                  split=dict(seed=SPLIT_SEED, rule="stratified_split(labels, test_count=200, seed=0)",
                             train=listing["train"], test=listing["test"]),
                  epochs=args.epochs, finetune_epochs=args.finetune_epochs, seeds=args.seeds,
                  summary=summary, runs=rows)
    write_files(args.out, {"accuracy_nmnist_real.json": json.dumps(report, indent=1),
                           "accuracy_nmnist_real.md": table + "\n"})
    write_rst_table(args.out, "accuracy_nmnist_real")  # the guide includes it


if __name__ == "__main__":
    main()
