"""What ``snnquant train`` prints and writes for the user: the line and the TensorBoard scalars of
every epoch, ``metrics.json``, ``accuracy.png`` and ``firing_rates.png``, ``summary.txt`` and the
lines of the end of a run. Every file is written atomically (:func:`snnquant._io.atomic_write`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch


def atomic_write_text(path: Path, text: str):
    """Write ``text`` to ``path`` atomically (:func:`snnquant._io.atomic_write`)."""
    from snnquant._io import atomic_write
    atomic_write(path, text)


class EpochLog:
    """The epochs of a run as rank 0 reports them: one line each on the console and, where
    TensorBoard is installed, its scalars under ``<out>/tensorboard``.

    Args:
        out: the run folder.
    """

    def __init__(self, out: Path):
        self.writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        except ImportError:
            print("tensorboard is not installed: no TensorBoard scalars (pip install tensorboard)")

    def epoch(self, entry: dict, epochs: int) -> None:
        """Report the history entry of one epoch (of ``epochs``): losses, accuracies, seconds
        and the test firing rates."""
        step = entry["epoch"]
        print(f"epoch {step:3d}/{epochs}  train loss {entry['train_loss']:.4f} acc "
              f"{entry['train_acc']:.4f}  test loss {entry['test_loss']:.4f} acc "
              f"{entry['test_acc']:.4f}  ({entry['seconds']:.1f} s)")
        if self.writer is not None:
            self.writer.add_scalar("loss/train", entry["train_loss"], step)
            self.writer.add_scalar("loss/test", entry["test_loss"], step)
            self.writer.add_scalar("accuracy/train", entry["train_acc"], step)
            self.writer.add_scalar("accuracy/test", entry["test_acc"], step)
            for k, v in entry["firing_rates"].items():
                self.writer.add_scalar(f"firing_rate/{k}", v, step)
            self.writer.flush()

    def close(self) -> None:
        """Close the TensorBoard files."""
        if self.writer is not None:
            self.writer.close()


def write_metrics(out: Path, args, history: list, result: Optional[dict] = None) -> None:
    """``metrics.json``: the flags and the history so far, and the run's result once it has one."""
    if result is None:
        text = json.dumps(dict(flags=vars(args), history=history), indent=2)
    else:
        text = json.dumps(dict(flags=vars(args), history=history, result=result), indent=2,
                          default=str)
    atomic_write_text(out / "metrics.json", text)


def write_plots(out: Path, history):
    """``accuracy.png`` and ``firing_rates.png`` of the history so far, written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(epochs, [h["train_acc"] for h in history], label="train")
    ax.plot(epochs, [h["test_acc"] for h in history], label="test")
    ax.set_xlabel("epoch"), ax.set_ylabel("accuracy"), ax.legend(), ax.grid(alpha=0.3)
    fig.tight_layout()
    _save_figure(fig, out / "accuracy.png")
    rates = history[-1]["firing_rates"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name in rates:
        ax.plot(epochs, [h["firing_rates"][name] for h in history], label=f"layer {name}")
    ax.set_xlabel("epoch"), ax.set_ylabel("mean firing rate"), ax.legend(), ax.grid(alpha=0.3)
    fig.tight_layout()
    _save_figure(fig, out / "firing_rates.png")


def _save_figure(fig, path: Path):
    import io

    import matplotlib.pyplot as plt
    from snnquant._io import atomic_write

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, buffer.getvalue())



def write_summary(model, test_set, device, out: Path, test_acc: float) -> None:
    """Print the trained network's test accuracy and its :func:`snnquant.summary` (bits, bytes,
    firing on the first 16 test samples), and write the summary to ``summary.txt``."""
    from spikingjelly.activation_based import functional

    import snnquant

    print(f"test accuracy: {100 * test_acc:.2f}%")
    frames = torch.stack([torch.as_tensor(test_set[i][0]) for i in range(min(16, len(test_set)))])
    functional.reset_net(model)
    summ = snnquant.summary(model, frames.float().transpose(0, 1).to(device))
    print(summ)
    atomic_write_text(out / "summary.txt", str(summ) + "\n")


def print_integer_check(check: dict, args, test_acc: float, out: Path) -> None:
    """The lines of the integer check (:func:`~snnquant.cli.integer_check.deploy_check`): the
    folded network's accuracy against the trained one, the integer agreement and the C model's
    memory, or why the check was skipped."""
    if "agreement" in check:
        print(f"BN folded into the quantized weights, fine-tuned {args.finetune_epochs} "
              f"epochs: test accuracy {100 * check['folded_test_acc']:.2f}% (trained: "
              f"{100 * test_acc:.2f}%; {check['fold']})")
        print(f"integer model agreement: {100 * check['agreement']:.2f}% "
              f"({check['samples']} test samples, every output spike)")
        print(f"C model: {out / 'model_int.c'} (.h), ROM {check['c_rom_bytes']} bytes, "
              f"RAM {check['c_ram_bytes']} bytes")
    else:
        print(f"integer model check skipped: {check.get('skipped')}")
