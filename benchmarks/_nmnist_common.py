"""Shared by the benchmarks that train the N-MNIST example (accuracy of PTQ, mixed precision,
binary/ternary weights, calibration methods, BatchNorm folding; the C runtime and CPU timings):
the example's network, data and training loop (``examples/train_nmnist.py``), run in this
process, and what the accuracy benchmarks have in common (arguments, the seed loop, the results
files)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _machine import ROOT, machine, use_checkout  # noqa: E402
from _tables import write_files  # noqa: E402

use_checkout()


def example():
    """The example module ``examples/train_nmnist.py``."""
    spec = importlib.util.spec_from_file_location("train_nmnist",
                                                  os.path.join(ROOT, "examples", "train_nmnist.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example_args(ex, epochs: int, seed: int, data_root=None, extra=()):
    """The example's flags (``parse_args``) for a CPU run of ``epochs`` epochs with ``seed``."""
    argv = ["--epochs", str(epochs), "--seed", str(seed), "--device", "cpu", *extra]
    if data_root:
        argv += ["--data-root", data_root]
    return ex.parse_args(argv)


class Bench:
    """Data, training and evaluation of the example's CSNN for one data root."""

    def __init__(self, epochs: int, data_root=None, T: int = 8, quick: bool = False,
                 fp_cache=None):
        self.ex = example()
        self.epochs = epochs
        self.data_root = data_root
        self.fp_cache = fp_cache
        self.quick = quick
        extra = ["-T", str(T)] + (["--samples-per-class", "4", "-T", "4"] if quick else [])
        self.args = example_args(self.ex, epochs, 0, data_root, extra)
        self.train_set, self.test_set = self.ex.load_data(self.args, 0)
        self.device = torch.device("cpu")

    def fp_cache_file(self, seed: int, epochs: int, lr: float) -> str:
        """Where ``--fp-cache`` keeps the full-precision network of ``seed``: named by the data
        (their digest: a network trained on other data is never reused), the training and the
        network."""
        args = self.args_for(seed)
        tag = "builtin" if self.data_root is None else os.path.basename(os.path.normpath(self.data_root))
        tag += "_quick" if self.quick else ""
        return os.path.join(self.fp_cache, f"fp_{tag}_{self.data_sha256()[:12]}_T{args.T}_e{epochs}_"
                            f"s{seed}_c{args.channels}_tau{args.tau:g}_lr{lr:g}.pt")

    def data_sha256(self) -> str:
        """SHA-256 of the frames the networks train and test on (labels, shapes, dtypes and
        values, in the loaders' order): two results with the same digest saw the same data,
        wherever the built-in data were generated."""
        if getattr(self, "_data_sha256", None):
            return self._data_sha256
        import hashlib
        import numpy as np
        digest = hashlib.sha256()
        for split, dataset in (("train", self.train_set), ("test", self.test_set)):
            samples = dataset.samples if hasattr(dataset, "samples") else \
                [dataset.dataset.samples[i] for i in dataset.indices]  # a subset (--quick)
            for path, label in samples:
                with np.load(path) as sample:
                    for key in sorted(sample.files):
                        value = np.ascontiguousarray(sample[key])
                        digest.update(f"{split}/{label}/{key}/{value.dtype}/{value.shape}".encode())
                        digest.update(value.tobytes())
        self._data_sha256 = digest.hexdigest()
        return self._data_sha256

    def args_for(self, seed: int):
        a = argparse.Namespace(**vars(self.args))
        a.seed = seed
        return a

    def train(self, config, seed: int, epochs=None, model=None, lr=None, freeze_bn_epochs=0):
        """Train (from scratch unless ``model``) with ``config`` (None: full precision), the last
        ``freeze_bn_epochs`` epochs with the BatchNorm statistics frozen
        (``snnquant.freeze_batchnorm``); return ``(model, test_accuracy)``."""
        import snnquant
        args = self.args_for(seed)
        epochs = self.epochs if epochs is None else epochs
        torch.manual_seed(seed)
        cached = None
        if lr is None:  # the example's default for this configuration
            lr = self.ex.default_lr(*(0, None) if config is None else
                                    (config.weight_bits, config.weight_quantizer))
        if model is None:
            model = self.ex.build_csnn(args.channels, args.tau)
            if config is not None:
                model, _ = snnquant.quantize_model(model, config)
            elif self.fp_cache:  # full precision from scratch: the same in every benchmark
                cached = self.fp_cache_file(seed, epochs, lr)
                if os.path.exists(cached):
                    model.load_state_dict(snnquant.load_checkpoint(cached))
                    print(f"full precision seed {seed}: loaded {cached}", flush=True)
                    return model, self.evaluate(model, seed)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
        args.epochs = epochs
        for epoch in range(epochs):
            if epoch >= epochs - freeze_bn_epochs:
                snnquant.freeze_batchnorm(model)
            loader, _ = self.ex.make_loaders(self.train_set, self.test_set, args, 0, 1, epoch)
            # rank=1: no progress bar
            self.ex.run_epoch(model, loader, opt, None, args, self.device, True, 1, epoch,
                              reduce=False)
            sched.step()
        if cached:
            os.makedirs(self.fp_cache, exist_ok=True)
            snnquant.save_checkpoint(model.state_dict(), cached)
        return model, self.evaluate(model, seed)

    def evaluate(self, model, seed: int = 0) -> float:
        args = self.args_for(seed)
        _, loader = self.ex.make_loaders(self.train_set, self.test_set, args, 0, 1, 0)
        _, acc = self.ex.run_epoch(model, loader, None, None, args, self.device, False, 1, 0,
                                   label="test", reduce=False)
        return acc

    def batches(self, n: int, seed: int = 0, with_labels: bool = True):
        """``n`` training batches as ``([T, N, ...] input, labels)`` pairs."""
        args = self.args_for(seed)
        loader, _ = self.ex.make_loaders(self.train_set, self.test_set, args, 0, 1, 0)
        out = []
        for frames, y in loader:
            x = frames.float().transpose(0, 1)
            out.append((x, y) if with_labels else x)
            if len(out) == n:
                break
        return out


def deployed_accuracy(bench, model, seed: int, finetune_epochs: int) -> float:
    """Fold BN, fine-tune, export to integers and return ``IntegerSNN``'s test accuracy."""
    import torch
    from spikingjelly.activation_based import functional
    from snnquant.export import IntegerSNN, fold_batchnorm, to_integer
    folded = fold_batchnorm(model.eval())
    functional.reset_net(folded)
    if finetune_epochs:
        folded, _ = bench.train(None, seed * 1000 + 1, epochs=finetune_epochs, model=folded,
                                lr=bench.args.lr / 10)
    folded.eval()
    functional.reset_net(folded)
    sim = IntegerSNN(to_integer(folded))
    args = bench.args_for(seed)
    _, loader = bench.ex.make_loaders(bench.train_set, bench.test_set, args, 0, 1, 0)
    correct = count = 0
    for frames, y in loader:
        x = frames.transpose(0, 1).to(torch.int64)
        out = sim(x)
        correct += int((out.float().mean(0).argmax(-1) == y).sum())
        count += int(y.numel())
    return correct / count


def seeds_done(args, seed: int) -> list:
    """The seeds of ``--seeds`` measured once ``seed`` is (the seeds are the outer loop)."""
    return args.seeds[:args.seeds.index(seed) + 1]


def results_name(args, name: str) -> str:
    """The results file name of a benchmark: ``name`` on the built-in data, ``<name>_real`` on
    a data root."""
    return name + ("" if args.root is None else "_real")


def write_results(name: str, payload: dict, table: str, out_dir: str) -> None:
    """Write ``<name>.json`` (``payload`` with the machine, the command and the time) and
    ``<name>.md`` (``table``) atomically."""
    payload = dict(payload, machine=machine(), command=" ".join([os.path.relpath(sys.argv[0], ROOT)]
                                                                + sys.argv[1:]),
                   finished=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    write_files(out_dir, {f"{name}.json": json.dumps(payload, indent=2, default=str),
                          f"{name}.md": table + "\n"})


def data_root_of(args) -> "str | None":
    """The data root the arguments ask for: ``--data-root``, or a split root laid out (symbolic
    links, under runs/real_split) from ``--real-split``; None for the built-in data."""
    if args.real_split is None:
        return args.data_root
    if args.data_root is not None:
        raise SystemExit("give --data-root or --real-split, not both")
    from pathlib import Path
    import accuracy_nmnist_real as real
    source = Path(args.real_split).resolve()  # the links must not depend on the working folder
    if not (source / "Train").is_dir():
        raise SystemExit(f"--real-split: no Train/ folder in {source}")
    root = Path(ROOT) / "runs" / "real_split" / "nmnist-real-800-200"
    real.lay_out_split(source, root, quick=False)  # --quick subsets it by --samples-per-class
    return str(root)


def data_label(args, root) -> str:
    """How the tables name the data."""
    if root is None:
        return "built-in digits (N-MNIST format)"
    if args.real_split is not None:
        return (f"real N-MNIST recordings {os.path.basename(os.path.normpath(args.real_split))}, "
                f"fixed stratified 800/200 split (seed 0)")
    return root


def common_args(description: str, default_epochs: int):
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=default_epochs)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data-root", default=None,
                    help="real N-MNIST root (default: the built-in digits dataset)")
    ap.add_argument("--real-split", metavar="SOURCE", default=None,
                    help="real N-MNIST recordings laid out as Train/<label>/*.bin (for example "
                         "../shared/data/nmnist-real-1k): train and test on the fixed stratified "
                         "800/200 split of benchmarks/accuracy_nmnist_real.py")
    ap.add_argument("--fp-cache", default=None,
                    help="folder for the trained full-precision networks (per data, T, epochs, "
                         "seed, channels, tau and learning rate), so that the accuracy benchmarks "
                         "train each only once")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 epoch, 1 seed, 4 samples per class, T=4, results not "
                         "written")
    return ap


def parse_and_bench(ap):
    """Parse the arguments of an accuracy benchmark (``--quick``: 1 epoch, the first seed) and
    return ``(args, bench)``; ``args.root`` is the data root and ``args.data_sha256`` its digest."""
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.seeds = 1, args.seeds[:1]
    args.root = data_root_of(args)
    bench = Bench(args.epochs, args.root, quick=args.quick, fp_cache=args.fp_cache)
    args.data_sha256 = bench.data_sha256()
    return args, bench
