"""``snnquant train`` (also ``python -m snnquant train`` and ``python examples/train_nmnist.py``):
train, or post-training quantize, the example's low-bit spiking network. ``snnquant train --help``
(:data:`snnquant.cli.args.DESCRIPTION`) says what a run does, what it writes and its exit status.

This module is the entry point, :func:`run` (the command line) and :func:`main` (one run); each
stage of a run lives in a module of its own, in the order a run goes through them:

* :mod:`snnquant.cli.args`: the flags, their checks and the help text; the optional modules a
  run needs;
* :mod:`snnquant.cli.distributed`: the process group of a ``torchrun`` run;
* :mod:`snnquant.cli.resume`: the run configuration a checkpoint records, checked by ``--resume``;
* :mod:`snnquant.cli.data`: the datasets and the loaders of each epoch;
* :mod:`snnquant.cli.network`: the example's network, quantized as the flags say;
* :mod:`snnquant.cli.teacher`: ``--teacher`` / ``--train-teacher``, the full-precision network
  a run distils from;
* :mod:`snnquant.cli.training`: the training loop, a checkpoint after each epoch;
* :mod:`snnquant.cli.integer_check`: BatchNorm folding, integer and C export, integer agreement;
* :mod:`snnquant.cli.ptq`: ``--ptq``, post-training quantization instead of training;
* :mod:`snnquant.cli.report`: what a run prints and writes for the user.

The names this module held before it was split (``__all__``) are importable from here too
(``from snnquant.cli.train import build_csnn``); ``examples/train_nmnist.py`` re-exports them for
the scripts that load it.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import torch

from snnquant.cli.args import check_dependencies, needed_modules, parse_args
from snnquant.cli.data import load_data, make_loaders
from snnquant.cli.distributed import all_sum, barrier, dist_setup
from snnquant.cli.integer_check import deploy_check
from snnquant.cli.network import (BINARY_LR, DEFAULT_LR, build_csnn, build_network, default_lr,
                                  quantize)
from snnquant.cli.ptq import ptq_network, run_ptq
from snnquant.cli.report import (atomic_write_text, print_integer_check, write_metrics,
                                 write_plots, write_summary)
from snnquant.cli.resume import (CHECKPOINT, RESUMABLE_FLAGS, check_resume_config, checkpoint_to_resume,
                                 config_differences, run_configuration)
from snnquant.cli.training import FiringRates, run_epoch, train

__all__ = [
    "run", "main",
    "parse_args", "needed_modules", "check_dependencies",
    "dist_setup", "barrier", "all_sum",
    "RESUMABLE_FLAGS", "run_configuration", "config_differences", "check_resume_config",
    "load_data", "make_loaders",
    "DEFAULT_LR", "BINARY_LR", "default_lr", "build_csnn", "build_network", "quantize",
    "FiringRates", "run_epoch",
    "deploy_check",
    "ptq_network", "run_ptq",
    "atomic_write_text", "write_plots",
]


def _launch_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def main(argv=None, prog=None):
    """Run one training (or ``--ptq``) run as the flags say; return its result.

    Raises:
        RunFolderError: ``--out`` cannot hold this run (see ``snnquant train --help``).
        MissingDependency: an optional module the run needs is not installed.
        SystemExit: a bad flag (status 2) or a refused ``--resume`` (the message says why).
    """
    import shlex

    from snnquant.cli._run_folder import RunFolder

    args = parse_args(argv, prog)
    check_dependencies(args)
    command = " ".join([prog or shlex.quote(Path(sys.argv[0]).name),
                        shlex.join(map(str, sys.argv[1:] if argv is None else argv))])
    folder = RunFolder(Path(args.out)) if _launch_rank() == 0 else None
    if folder is not None:
        folder.open(resume=args.resume)
    try:
        result = _run(args, folder)
        if folder is not None:
            folder.write_manifest(command, dict(vars(args)), result)
        return result
    finally:
        if folder is not None:
            folder.close()


def _run(args, folder):
    """The stages of one run: set-up, (resume,) data, then ``--ptq``, or training and the end of
    the run on rank 0 (summary, ``model.pt``, the integer check, ``metrics.json``)."""
    import snnquant
    from spikingjelly.activation_based import functional

    rank, world, local_rank = dist_setup(args.device)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank if world > 1 else (device.index or 0))
        torch.cuda.set_device(device)
    out = Path(args.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # the teacher first: its checksum is part of the run configuration a checkpoint records
    teacher = None
    if args.teacher is not None or args.train_teacher:
        from snnquant.cli.teacher import load_teacher, train_teacher
        if args.train_teacher and world > 1:
            raise SystemExit("--train-teacher trains the teacher in one process: train it "
                             "first (--weight-bits 0 --v-bits 0), then distil with --teacher")
        teacher_folder = train_teacher(args, main) if args.train_teacher else Path(args.teacher)
        teacher = load_teacher(args, teacher_folder)
        random.seed(args.seed)
        torch.manual_seed(args.seed)

    # the checkpoint is verified (checksum) and its run configuration checked before any work
    ckpt = None
    if args.resume and not (args.train_teacher and not (out / CHECKPOINT).exists()):
        # (a --train-teacher run interrupted while its teacher trained has no checkpoint yet)
        ckpt = checkpoint_to_resume(args, out, world)
        if folder is not None:
            folder.remove_end_of_run_files()

    train_set, test_set = load_data(args, rank)
    if args.ptq:
        return run_ptq(args, train_set, test_set, device, out)
    # the first training samples: BatchNorm pairs found from a run, and the deployability
    # report printed (with the quantize report) before the first epoch
    from snnquant.cli.zoo import example_batch
    example = example_batch(train_set)
    model, report = quantize(build_network(args), args, example)
    model.to(device)
    if rank == 0 and report is not None:
        print(report)
    distiller = None
    if teacher is not None:
        from snnquant.cli.teacher import make_distiller
        distiller = make_distiller(args, model, teacher.to(device))
    history, seconds, stopped_after = train(model, train_set, test_set, args, device, rank, world,
                                            out, ckpt, distiller=distiller)
    if distiller is not None:
        distiller.remove()
    if stopped_after is not None:
        return dict(stopped_after=stopped_after)

    result = dict(test_acc=history[-1]["test_acc"] if history else None, train_seconds=seconds)
    # the end-of-run work (summary, BN folding, fine-tuning, integer export) runs on rank 0 alone:
    # leave the process group first, so that no rank waits in a collective meanwhile
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        write_summary(model, test_set, device, out, result["test_acc"])
        snnquant.save_checkpoint(model.state_dict(), out / "model.pt")
        print(f"saved the trained model to {out / 'model.pt'}")
        if not args.no_integer_check:
            functional.reset_net(model)
            agreement = deploy_check(model, train_set, test_set, args, device, out)
            result["integer"] = agreement
            print_integer_check(agreement, args, result["test_acc"], out)
        write_metrics(out, args, history, result)
    return result


def run(argv=None, prog=None) -> int:
    """The command line: :func:`main` with one line on stderr and an exit status for the errors
    a user makes (2: a bad argument, dataset root or run folder; 1: a missing optional
    dependency); return the status."""
    from snnquant.cli._errors import exit_status
    from snnquant.cli._run_folder import RunFolderError
    from snnquant.datasets import DATASET_ERRORS

    return exit_status(lambda: main(argv, prog), prog or Path(sys.argv[0]).name,
                       (RunFolderError, *DATASET_ERRORS))
