"""The ``snnquant`` command line (also ``python -m snnquant``).

* ``snnquant train``: train (or post-training quantize) the example network on N-MNIST, the
  built-in digits, DVS128 Gesture, CIFAR10-DVS or SHD (:mod:`snnquant.cli.train`; the flags of
  ``examples/train_nmnist.py``);
* ``snnquant summary``: bits, bytes and layers of a saved model (a run folder or an integer file);
* ``snnquant export``: a saved model to the integer file, C and NIR.

Exit status: 0 done; 2 a bad argument, dataset root, run folder or model file (one line on
stderr saying why); 1 a missing optional dependency (the line names the extra to install).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["main", "COMMANDS"]

# name -> (module under snnquant.cli, one line of help)
COMMANDS = {
    "train": ("train", "train a quantized spiking network on a supported dataset (the example)"),
    "summary": ("models", "bits, bytes and layers of a saved model (run folder or integer file)"),
    "export": ("models", "export a saved model to the integer file (.safetensors), C and NIR"),
}


def _top_parser() -> argparse.ArgumentParser:
    from snnquant._version import __version__

    listing = "\n".join(f"  {name:<9} {text}" for name, (_, text) in COMMANDS.items())
    ap = argparse.ArgumentParser(
        prog="snnquant", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantization for spiking neural networks: the jobs that need no Python.",
        epilog=f"commands:\n{listing}\n\n'snnquant COMMAND --help' lists a command's flags.\n"
               f"Exit status: 0 done; 2 a bad argument, dataset root, run folder or model file "
               f"(one line on stderr); 1 a missing optional dependency (the line names the extra).")
    ap.add_argument("--version", action="version", version=f"snnquant {__version__}")
    ap.add_argument("command", choices=list(COMMANDS), metavar="COMMAND",
                    help="one of: " + ", ".join(COMMANDS))
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``snnquant COMMAND ...`` with ``argv`` (default ``sys.argv[1:]``); return the exit
    status (argument errors exit with status 2 through ``argparse``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = _top_parser().parse_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    rest = argv[1:]
    prog = f"snnquant {ns.command}"
    if ns.command == "train":
        from snnquant.cli.train import run
        return run(rest, prog)
    from snnquant.cli import models
    return models.run(ns.command, rest, prog)
