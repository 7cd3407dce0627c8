"""Train a low-bit spiking CNN on N-MNIST (or, with no arguments, on the built-in N-MNIST-format
digits dataset) with quantization in the loop: ``snnquant train`` under its old name.

The code lives in ``snnquant.cli.train`` (installed with the package, ``snnquant train --help``);
this file keeps the commands of earlier versions working, with the same flags, outputs and exit
statuses:

    python examples/train_nmnist.py --samples-per-class 5 -T 4 --epochs 1 --out runs/tiny
    torchrun --nproc_per_node=2 examples/train_nmnist.py --epochs 2  # DDP
"""
import sys

from snnquant.cli.train import *  # noqa: F401,F403  (the example's functions, for scripts that load it)
from snnquant.cli.train import run

if __name__ == "__main__":
    sys.exit(run())
