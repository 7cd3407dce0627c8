"""Accuracy of the N-MNIST example on the built-in digits dataset: full precision, 4-bit weights /
8-bit membrane, 2-bit weights / 4-bit membrane (CPU, fixed seed).

Runs ``examples/train_nmnist.py`` once per configuration, one after the other, with the exact
commands printed in the table, and writes benchmarks/results/accuracy_nmnist.{json,md}.

    python benchmarks/accuracy_nmnist.py [--epochs 30]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import ROOT  # noqa: E402
from _tables import RESULTS, write_files, write_rst_table  # noqa: E402

CONFIGS = [
    ("full precision", ["--weight-bits", "0", "--v-bits", "0"]),
    ("4-bit weights, 8-bit membrane", ["--weight-bits", "4", "--v-bits", "8"]),
    ("2-bit weights, 4-bit membrane", ["--weight-bits", "2", "--v-bits", "4"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs", "accuracy"))
    args = ap.parse_args()
    rows = []
    for name, flags in CONFIGS:
        out = os.path.join(args.runs, name.split(",")[0].replace(" ", "_").replace("-", ""))
        shutil.rmtree(out, ignore_errors=True)  # a run folder holds one run: a rerun starts anew
        cmd = [sys.executable, "examples/train_nmnist.py", *flags, "--epochs", str(args.epochs),
               "--out", out]
        t0 = time.time()
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        seconds = time.time() - t0
        if res.returncode != 0:
            print(res.stdout[-2000:], res.stderr[-2000:])
            raise SystemExit(f"{name}: training failed")
        metrics = json.load(open(os.path.join(out, "metrics.json")))
        result = metrics["result"]
        integer = result.get("integer", {})
        rows.append(dict(config=name, command="python examples/train_nmnist.py " + " ".join(
            flags + ["--epochs", str(args.epochs)]), test_acc=result["test_acc"],
            folded_test_acc=integer.get("folded_test_acc"), integer_agreement=integer.get("agreement"),
            wall_seconds=seconds, train_seconds=result["train_seconds"]))
        print(f"{name}: test accuracy {100 * result['test_acc']:.2f}% in {seconds:.0f} s")
    fp = rows[0]["test_acc"]
    lines = ["| configuration | test accuracy | vs full precision | BN folded (deployed) | integer agreement | wall time (s) | command |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        fold = "-" if r["folded_test_acc"] is None else f"{100 * r['folded_test_acc']:.2f}%"
        agree = "-" if r["integer_agreement"] is None else f"{100 * r['integer_agreement']:.2f}%"
        lines.append(f"| {r['config']} | {100 * r['test_acc']:.2f}% | {100 * (r['test_acc'] - fp):+.2f} | "
                     f"{fold} | {agree} | {r['wall_seconds']:.0f} | `{r['command']}` |")
    table = "\n".join(lines)
    print(table)
    machine = dict(platform=platform.platform(), cpu_count=os.cpu_count(),
                   omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
    write_files(args.out, {"accuracy_nmnist.json": json.dumps(dict(machine=machine, rows=rows),
                                                              indent=2),
                           "accuracy_nmnist.md": table + "\n"})
    write_rst_table(args.out, "accuracy_nmnist")  # the guide includes it


if __name__ == "__main__":
    main()
