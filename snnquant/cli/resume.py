"""``snnquant train --resume``: the run configuration a checkpoint records, and the refusal of a
checkpoint made with another one (a resumed run would then match neither run)."""
from __future__ import annotations

from pathlib import Path

import torch

#: the checkpoint of a run, rewritten after every epoch, in the run folder
CHECKPOINT = "checkpoint.pt"

# Flags that do not change what the training epochs compute: a run may resume with other values.
# Every other flag (and the world size and device type) is part of the run configuration stored
# in the checkpoint, and --resume refuses a checkpoint made with another configuration.
# --teacher is the path of the teacher's run folder: its SHA-256 (teacher_sha256) is what counts.
RESUMABLE_FLAGS = ("out", "resume", "workers", "stop_after", "no_integer_check", "finetune_epochs",
                   "device", "teacher")


# Flags added after checkpoints recorded their configuration (``--model``, ``--model-arg``,
# ``--crop``): recorded only when given, so that a checkpoint made before them still resumes.
_ADDED_FLAGS = ("model", "model_arg", "crop")


def run_configuration(args, world: int) -> dict:
    """Everything that changes what the training epochs compute: all flags but
    ``RESUMABLE_FLAGS``, the device type and the world size (number of processes)."""
    config = {k: v for k, v in sorted(vars(args).items()) if k not in RESUMABLE_FLAGS}
    for flag in _ADDED_FLAGS:   # unused, they leave the configuration as earlier versions wrote it
        if config.get(flag) is None:
            config.pop(flag, None)
    config["device_type"] = torch.device(args.device).type
    config["world_size"] = world
    return config


def config_differences(saved: dict, current: dict) -> list:
    """``["--lr: checkpoint 0.002, now 0.5", ...]``: the settings in which two run configurations
    differ (a setting missing from one of them counts as a difference)."""
    labels = {"world_size": "world size (number of processes)", "device_type": "device type"}
    missing = "<not recorded>"
    diff = []
    for key in sorted(set(saved) | set(current), key=lambda k: (k in labels, k)):
        a, b = saved.get(key, missing), current.get(key, missing)
        if a != b or type(a) is not type(b):
            label = labels.get(key, "--" + key.replace("_", "-"))
            diff.append(f"{label}: checkpoint {a!r}, now {b!r}")
    return diff


def check_resume_config(ckpt: dict, current: dict, path: Path) -> None:
    """Stop (``SystemExit``, listing the differences) when the checkpoint at ``path`` was made
    with another run configuration than ``current``, or records none."""
    saved = ckpt.get("config") if isinstance(ckpt, dict) else None
    if not isinstance(saved, dict):
        raise SystemExit(f"cannot resume from {path}: it records no run configuration (made by an "
                         f"older version of this example); start a new run")
    diff = config_differences(saved, current)
    if diff:
        raise SystemExit(f"cannot resume from {path}: the checkpoint was made with other settings, "
                         f"and a resumed run would match neither run:\n  " + "\n  ".join(diff))


def checkpoint_to_resume(args, out: Path, world: int) -> dict:
    """The checkpoint of the run in ``out``, verified (checksum) and of this run configuration.

    Raises:
        SystemExit: no checkpoint, a damaged one, or one of another configuration (the message
            says which, listing the differences).
    """
    import snnquant

    ckpt_path = out / CHECKPOINT
    if not ckpt_path.exists():
        raise SystemExit(f"--resume: no checkpoint at {ckpt_path}")
    try:
        ckpt = snnquant.load_checkpoint(ckpt_path, map_location="cpu")
    except ValueError as exc:
        raise SystemExit(f"--resume: {exc}") from None
    check_resume_config(ckpt, run_configuration(args, world), ckpt_path)
    return ckpt
