"""The full-precision teacher of ``snnquant train --teacher RUN_DIR`` / ``--train-teacher``: found
(or trained first, into ``<out>/teacher``), checked against its run folder's manifest, loaded,
and its SHA-256 recorded in the run configuration (``teacher_sha256``)."""
from __future__ import annotations

from pathlib import Path

from snnquant.cli._run_folder import MANIFEST, TEACHER_FOLDER, file_sha256, verify_manifest

# the flags of the student's run that the teacher's run must share (the network and its input)
SHARED_FLAGS = ("dataset", "T", "channels", "tau")
# the flags a --train-teacher run passes on to the teacher's run
_PASSED_ON = ("dataset", "data_root", "T", "epochs", "batch_size", "seed", "device", "workers",
              "channels", "tau", "samples_per_class", "backend", "freeze_bn_epochs")


def teacher_argv(args) -> list:
    """The flags of the full-precision run ``--train-teacher`` trains into ``<out>/teacher``."""
    argv = ["--weight-bits", "0", "--v-bits", "0", "--no-integer-check",
            "--out", str(Path(args.out) / TEACHER_FOLDER)]
    for name in _PASSED_ON:
        value = getattr(args, name)
        if value is not None:
            argv += ["-T" if name == "T" else "--" + name.replace("_", "-"), str(value)]
    return argv


def train_teacher(args, run_main) -> Path:
    """Train (or, after an interruption, resume; or, when finished, keep) the teacher of
    ``--train-teacher`` in ``<out>/teacher`` with ``run_main`` (``snnquant.cli.train.main``, one
    run of the given flags); return that folder."""
    folder = Path(args.out) / TEACHER_FOLDER
    # a run stopped early (--stop-after) writes run.json too, but no model.pt
    if (folder / MANIFEST).is_file() and (folder / "model.pt").is_file():
        print(f"teacher: the finished run in {folder}")
        return folder
    resume = (folder / "checkpoint.pt").is_file()
    print(f"teacher: {'resuming' if resume else 'training'} the full-precision network in "
          f"{folder}", flush=True)
    run_main(teacher_argv(args) + (["--resume"] if resume else []),
             prog="snnquant train (teacher)")
    return folder


def load_teacher(args, folder: Path):
    """The teacher network of the finished run ``folder``, frozen; sets
    ``args.teacher_sha256`` (the SHA-256 of its ``model.pt``).

    Raises:
        SystemExit: the folder is not a finished full-precision run of the same network and data
            (the message names the file or flag).
    """
    import snnquant
    from snnquant.cli.network import build_network
    from snnquant.distill import freeze_teacher

    try:
        manifest = verify_manifest(folder)
    except ValueError as exc:
        raise SystemExit(f"--teacher: {exc}") from None
    if "model.pt" not in manifest.get("files", {}):
        raise SystemExit(f"--teacher {folder}: {folder / MANIFEST} lists no model.pt (the run "
                         f"stopped before its end): finish it with --resume first")
    config = manifest.get("configuration") or {}
    if config.get("weight_bits") != 0 or config.get("v_bits") != 0:
        raise SystemExit(f"--teacher {folder}: {folder / MANIFEST} records --weight-bits "
                         f"{config.get('weight_bits')} --v-bits {config.get('v_bits')}; the "
                         f"teacher must be a full-precision run (--weight-bits 0 --v-bits 0)")
    for name in SHARED_FLAGS:
        if config.get(name) != getattr(args, name):
            flag = "-T" if name == "T" else "--" + name.replace("_", "-")
            raise SystemExit(f"--teacher {folder}: it was trained with {flag} "
                             f"{config.get(name)!r}, this run has {getattr(args, name)!r}; the "
                             f"teacher must be the same network on the same input")
    path = folder / "model.pt"
    args.teacher_sha256 = file_sha256(path)
    teacher = build_network(args)
    teacher.load_state_dict(snnquant.load_checkpoint(path, map_location="cpu"))
    return freeze_teacher(teacher)


def make_distiller(args, model, teacher):
    """The :class:`~snnquant.distill.Distiller` of the flags."""
    from snnquant.distill import Distiller
    return Distiller(model, teacher, temperature=args.kd_temperature, kd_weight=args.kd_weight,
                     align=None if args.align == "none" else args.align,
                     align_weight=args.align_weight)
