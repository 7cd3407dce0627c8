"""Shared by the accuracy benchmarks of PTQ, mixed precision and binary/ternary weights: the N-MNIST
example's network, data and training loop (``examples/train_nmnist.py``), run in this process."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def example():
    """The example module ``examples/train_nmnist.py``."""
    spec = importlib.util.spec_from_file_location("train_nmnist",
                                                  os.path.join(ROOT, "examples", "train_nmnist.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example_args(ex, epochs: int, seed: int, data_root=None, extra=()):
    argv = ["--epochs", str(epochs), "--seed", str(seed), "--device", "cpu", *extra]
    if data_root:
        argv += ["--data-root", data_root]
    return ex.parse_args(argv)


class Bench:
    """Data, training and evaluation of the example's CSNN for one data root."""

    def __init__(self, epochs: int, data_root=None, T: int = 8, quick: bool = False):
        self.ex = example()
        self.epochs = epochs
        self.data_root = data_root
        extra = ["-T", str(T)] + (["--samples-per-class", "4", "-T", "4"] if quick else [])
        self.args = example_args(self.ex, epochs, 0, data_root, extra)
        self.train_set, self.test_set = self.ex.load_data(self.args, 0)
        self.device = torch.device("cpu")

    def args_for(self, seed: int):
        a = argparse.Namespace(**vars(self.args))
        a.seed = seed
        return a

    def train(self, config, seed: int, epochs=None, model=None, lr=None):
        """Train (from scratch unless ``model``) with ``config`` (None: full precision); return
        ``(model, test_accuracy)``."""
        import snnquant
        args = self.args_for(seed)
        epochs = self.epochs if epochs is None else epochs
        torch.manual_seed(seed)
        if model is None:
            model = self.ex.build_csnn(args.channels, args.tau)
            if config is not None:
                model, _ = snnquant.quantize_model(model, config)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                               lr=lr or args.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
        args.epochs = epochs
        for epoch in range(epochs):
            loader, _ = self.ex.make_loaders(self.train_set, self.test_set, args, 0, 1, epoch)
            # rank=1: no progress bar
            self.ex.run_epoch(model, loader, opt, None, args, self.device, True, 1, epoch,
                              reduce=False)
            sched.step()
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


def machine():
    import spikingjelly
    return dict(platform=platform.platform(), python=platform.python_version(),
                torch=torch.__version__, spikingjelly=getattr(spikingjelly, "__version__", "?"),
                cpu_count=os.cpu_count(), omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                torch_threads=torch.get_num_threads())


def spread(values):
    """``(median, min, max)`` of a list of accuracies."""
    return statistics.median(values), min(values), max(values)


def fmt(values) -> str:
    med, lo, hi = spread(values)
    return f"{100 * med:.2f}% ({100 * lo:.2f}..{100 * hi:.2f})"


def write_results(name: str, payload: dict, table: str, out_dir: str) -> None:
    """Write ``<name>.json`` and ``<name>.md`` atomically."""
    os.makedirs(out_dir, exist_ok=True)
    payload = dict(payload, machine=machine(), command=" ".join([os.path.relpath(sys.argv[0], ROOT)]
                                                                + sys.argv[1:]),
                   finished=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    for fname, text in ((f"{name}.json", json.dumps(payload, indent=2, default=str)),
                        (f"{name}.md", table + "\n")):
        tmp = os.path.join(out_dir, fname + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, fname))


def common_args(description: str, default_epochs: int):
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=default_epochs)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data-root", default=None,
                    help="real N-MNIST root (default: the built-in digits dataset)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 epoch, 1 seed, 4 samples per class, T=4, results not "
                         "written")
    return ap
