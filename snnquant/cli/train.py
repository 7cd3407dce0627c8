"""Train a low-bit spiking CNN on N-MNIST (or, with no data root, on the built-in N-MNIST-format
digits dataset), DVS128 Gesture, CIFAR10-DVS or SHD with quantization in the loop.

``snnquant train`` (also ``python -m snnquant train``) and ``python examples/train_nmnist.py`` run
this code with the same flags:

    snnquant train                                                   # built-in data, 4-bit/8-bit
    snnquant train --weight-bits 2 --v-bits 4 --out runs/w2v4
    snnquant train --weight-bits 1 --out runs/binary                 # binary weights
    snnquant train --weight-bits 0 --v-bits 0 --out runs/fp          # full precision baseline
    snnquant train --ptq runs/fp/model.pt --finetune-epochs 3 --out runs/ptq  # PTQ of it
    snnquant train --data-root /data/N-MNIST --device cuda --backend auto
    snnquant train --dataset dvs128_gesture --data-root /data/DVS128Gesture
    snnquant train --dataset shd --data-root /data/SHD
    torchrun --nproc_per_node=2 examples/train_nmnist.py --epochs 2  # DDP (gloo on CPU, nccl on GPU)

The network is SpikingJelly's CSNN (conv-BN-LIF blocks, multi-step; fully connected for SHD, see
``snnquant.datasets.default_network``), quantized with ``snnquant.quantize_model``. Outputs under
``--out``: TensorBoard scalars, ``metrics.json``, ``accuracy.png``, ``firing_rates.png``,
``checkpoint.pt`` (every epoch; ``--resume`` continues from it, and refuses a checkpoint made with
other settings, listing them) and ``model.pt`` (the trained state_dict), plus ``summary.txt``.
After the integer check: ``model_folded.pt``, ``model_int.safetensors`` and the C model
``model_int.h``/``model_int.c``; with ``--ptq``: ``ptq.json`` and ``model_int.safetensors``.
Every file is written atomically (``snnquant._io.atomic_write``); ``checkpoint.pt`` and
``model.pt`` carry a SHA-256 checksum (``snnquant.save_checkpoint``) and load, verified and
without pickle, with ``snnquant.load_checkpoint`` (plain ``torch.load`` reads them too).

The run folder (``--out``) belongs to one run: a new run needs an empty (or absent) folder and
refuses any other (exit 2, one line saying what is there); ``--resume`` continues the run whose
checkpoint is there, with its configuration, and first removes that run's end-of-run files; a
second process on the same folder is refused at once (a lock on the folder). The last file written
is ``run.json``: the command, the configuration and the SHA-256 of every file in the folder.
``snnquant summary <out>`` and ``snnquant export <out>`` read a finished run folder.

Exit status: 0 done; 2 a bad argument, dataset root or run folder (one line on stderr); 1 a
missing optional dependency (the line names the extra to install) or a refused ``--resume``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# Flags that do not change what the training epochs compute: a run may resume with other values.
# Every other flag (and the world size and device type) is part of the run configuration stored
# in the checkpoint, and --resume refuses a checkpoint made with another configuration.
RESUMABLE_FLAGS = ("out", "resume", "workers", "stop_after", "no_integer_check", "finetune_epochs",
                   "device")


def parse_args(argv=None, prog=None):
    """The flags of a training run (``snnquant train --help``); errors exit with status 2."""
    from snnquant.convert import MEMBRANE_QUANTIZERS, WEIGHT_QUANTIZERS
    from snnquant.datasets import DATASETS, DATA_ROOT_HELP, dataset_info
    from snnquant.kernels import BACKENDS, DEFAULT_BACKEND

    ap = argparse.ArgumentParser(prog=prog, description=__doc__ + DATA_ROOT_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="nmnist", choices=DATASETS,
                    help="dataset, loaded with SpikingJelly's own class (default: nmnist)")
    ap.add_argument("--data-root", default=None,
                    help="dataset root in one of the layouts listed below (nmnist without it: the "
                         "built-in digits dataset in N-MNIST format)")
    ap.add_argument("--weight-bits", type=int, default=4,
                    help="0 = full-precision weights, 1 = binary (alpha * sign(w)); ternary "
                         "weights: --weight-bits 2 --weight-quantizer ternary")
    ap.add_argument("--v-bits", type=int, default=8, help="0 = full-precision membrane")
    ap.add_argument("--weight-quantizer", default="lsq_pow2", choices=WEIGHT_QUANTIZERS)
    ap.add_argument("--membrane-quantizer", default="uniform", choices=MEMBRANE_QUANTIZERS)
    ap.add_argument("--per-tensor", action="store_true",
                    help="one weight step per layer instead of one per output channel")
    ap.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS,
                    help="neuron backend: cpp = fused kernels compiled for the CPU, cupy = "
                         "fused CUDA kernels, auto = cpp on CPU / cupy on CUDA when available")
    ap.add_argument("-T", type=int, default=None,
                    help="frames (time steps) per sample (default: nmnist 8, dvs128_gesture 16, "
                         "cifar10_dvs 10, shd 20)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=None,
                    help=f"Adam learning rate (default {DEFAULT_LR}; {BINARY_LR} for binary and "
                         f"ternary weights, whose latent weights must move further to flip)")
    ap.add_argument("--amp", action="store_true", help="automatic mixed precision")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--out", default="runs/nmnist",
                    help="the run folder: absent or empty for a new run (see above)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its checkpoint.pt, with its configuration")
    ap.add_argument("--channels", type=int, default=16,
                    help="channels of the conv blocks (shd: 8 x channels hidden units)")
    ap.add_argument("--tau", type=float, default=2.0, help="LIF time constant")
    ap.add_argument("--samples-per-class", type=int, default=None,
                    help="a small subset: this many samples of every class in each split, "
                         "stratified and chosen by --seed (the built-in digits: a fixed subset)")
    ap.add_argument("--no-integer-check", action="store_true",
                    help="skip BN folding, integer export and the agreement check at the end")
    ap.add_argument("--finetune-epochs", type=int, default=0,
                    help="epochs of fine-tuning after folding BN, before integer export (default "
                         "0: BN is folded into the quantized weights during training, so the "
                         "folded network is the trained one, spike for spike); with --ptq, after "
                         "calibration")
    ap.add_argument("--no-fold-bn-training", action="store_true",
                    help="quantize the weights before BN during training (QuantConfig("
                         "fold_batchnorm=False)); folding then changes the network at low bits "
                         "and --finetune-epochs recovers some of it")
    ap.add_argument("--freeze-bn-epochs", type=int, default=None,
                    help="train the last N epochs with the BN statistics frozen, exactly the "
                         "deployed network (snnquant.freeze_batchnorm; default: a quarter of "
                         "--epochs, rounded down)")
    ap.add_argument("--ptq", metavar="CHECKPOINT", default=None,
                    help="post-training quantization: load the full-precision model.pt (or "
                         "checkpoint.pt) of a --weight-bits 0 --v-bits 0 run, fold BN, quantize "
                         "to --weight-bits/--v-bits, calibrate on --calib-batches training "
                         "batches, evaluate, fine-tune --finetune-epochs epochs, export")
    ap.add_argument("--calib-batches", type=int, default=8, help="--ptq: calibration batches")
    ap.add_argument("--calib-method", default="mse", choices=("minmax", "percentile", "mse"),
                    help="--ptq: snnquant.calibrate method")
    ap.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)  # tests: simulate an interruption
    args = ap.parse_args(argv)
    if args.dataset != "nmnist" and args.data_root is None:
        ap.error(f"--dataset {args.dataset} needs --data-root (only nmnist has built-in data)")
    if args.T is None:
        args.T = dataset_info(args.dataset).default_T
    if args.samples_per_class is not None and args.samples_per_class < 1:
        ap.error(f"--samples-per-class must be >= 1, got {args.samples_per_class}")
    if args.weight_bits != 0 and not 1 <= args.weight_bits <= 32:
        ap.error(f"--weight-bits must be 0 (full precision), 1 (binary) or in [2, 32], got "
                 f"{args.weight_bits}")
    if args.v_bits != 0 and not 2 <= args.v_bits <= 32:
        ap.error(f"--v-bits must be 0 (full precision) or in [2, 32], got {args.v_bits}")
    if args.weight_bits:
        import snnquant
        try:  # the combinations QuantConfig refuses (ternary needs 2 bits, binary an LSQ alpha)
            snnquant.QuantConfig(weight_bits=args.weight_bits, weight_quantizer=args.weight_quantizer)
        except ValueError as e:
            ap.error(f"--weight-bits {args.weight_bits} --weight-quantizer "
                     f"{args.weight_quantizer}: {e}")
    for name in ("T", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lr is None:
        args.lr = default_lr(args.weight_bits, args.weight_quantizer)
    if not math.isfinite(args.lr) or args.lr <= 0:
        ap.error(f"--lr must be a finite number > 0, got {args.lr}")
    for flag, value, low in (("--channels", args.channels, 1), ("--workers", args.workers, 0)):
        if value < low:
            ap.error(f"{flag} must be >= {low}, got {value}")
    _check_tau(ap, args)
    _check_device(ap, args.device)
    if args.freeze_bn_epochs is None:
        args.freeze_bn_epochs = args.epochs // 4
    if not 0 <= args.freeze_bn_epochs <= args.epochs:
        ap.error(f"--freeze-bn-epochs must be in [0, --epochs = {args.epochs}], got "
                 f"{args.freeze_bn_epochs}")
    if args.finetune_epochs < 0 or args.calib_batches < 1:
        ap.error(f"--finetune-epochs must be >= 0 and --calib-batches >= 1, got "
                 f"{args.finetune_epochs} and {args.calib_batches}")
    if args.ptq and (args.weight_bits == 0 or args.v_bits == 0):
        ap.error("--ptq quantizes a full-precision model: give --weight-bits and --v-bits > 0")
    if args.ptq and args.resume:
        ap.error("--resume continues a training run from its checkpoint; a --ptq run has none: "
                 "run --ptq again into an empty --out")
    if args.ptq and not Path(args.ptq).is_file():
        ap.error(f"--ptq: no checkpoint file at {args.ptq}")
    if args.ptq:
        try:
            ptq_network(args)
        except ValueError as exc:
            ap.error(str(exc))
    return args


def _check_tau(ap, args) -> None:
    """``--tau``: > 1 (SpikingJelly's LIF), and a power of two when the run ends in the integer
    export (which writes the leak as a right shift), refused before any training."""
    tau = args.tau
    if not math.isfinite(tau) or tau <= 1:
        ap.error(f"--tau must be a finite number > 1 (the LIF time constant), got {tau}")
    exports = (not args.no_integer_check and args.weight_bits != 0 and args.v_bits != 0
               and args.membrane_quantizer == "uniform"   # what deploy_check and run_ptq export
               and args.weight_quantizer in ("lsq_pow2", "quantized_bits"))
    if exports and math.frexp(tau)[0] != 0.5:
        ap.error(f"--tau must be a power of two (2, 4, 8, ...) for the run's integer export, "
                 f"got {tau}: pick one, or pass --no-integer-check to train without the export")


def _check_device(ap, device: str) -> None:
    """``--device``: a device that exists here (``cpu``, ``cuda``, ``cuda:N``, ``mps``)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        ap.error(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            ap.error(f"--device {device}: this machine has {count} CUDA device(s)"
                     + (f" (cuda:0 to cuda:{count - 1})" if count else "; use --device cpu"))
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        ap.error(f"--device {device}: this machine has no MPS device; use --device cpu")
    elif dev.type not in ("cpu", "mps"):
        ap.error(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}")


def ptq_network(args):
    """``--ptq``: the full-precision network of the flags with the checkpoint's weights loaded.

    Raises:
        ValueError: one line naming ``--ptq``, the file and why (unreadable, damaged, quantized,
            or a network of other flags such as ``--channels``).
    """
    import snnquant

    try:  # checksum verified, no pickle
        state = snnquant.load_checkpoint(args.ptq, map_location="cpu")
    except (OSError, ValueError) as exc:
        raise ValueError(f"--ptq {args.ptq}: {exc}") from None
    state = state.get("model", state) if isinstance(state.get("model"), dict) else state
    net = build_network(args)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in why[1:3])
        raise ValueError(f"--ptq {args.ptq} is not the full-precision model (a --weight-bits 0 "
                         f"--v-bits 0 run) of this network (--dataset {args.dataset}, --channels "
                         f"{args.channels}): {detail}") from None
    return net


# --------------------------------------------------------------------------------------------------
# distributed helpers


def dist_setup(device: str):
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA); return
    ``(rank, world size, local rank)`` ((0, 1, 0) without torchrun)."""
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return rank, world, local_rank


def barrier():
    """Wait for every rank (nothing without a process group)."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()


def all_sum(values, device):
    """``values`` summed over all ranks (as they are on one process), as a list of floats."""
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


# --------------------------------------------------------------------------------------------------
# model


DEFAULT_LR = 2e-3
BINARY_LR = 5e-3


def default_lr(weight_bits, weight_quantizer) -> float:
    """The default learning rate: 5e-3 for binary (1-bit) and ternary weights, else 2e-3.

    On the built-in data (30 epochs, seed 0) binary weights reach 95.5% at 2e-3 and 97.5% at
    5e-3, ternary 96.4% and 98.6%, while full precision drops from 98.6% to 97.8% at 5e-3."""
    if weight_bits == 1 or (weight_bits and weight_quantizer == "ternary"):
        return BINARY_LR
    return DEFAULT_LR


def build_csnn(channels: int, tau: float):
    """SpikingJelly-style N-MNIST CSNN: conv-BN-LIF blocks (the first with stride 2, so that the
    34 x 34 input costs little on a CPU), max pooling and a linear LIF read-out."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    def lif(detach):
        return neuron.LIFNode(tau=tau, surrogate_function=surrogate.ATan(), detach_reset=detach)

    net = nn.Sequential(
        layer.Conv2d(2, channels, 3, stride=2, padding=1, bias=False), layer.BatchNorm2d(channels),
        lif(True),                                                          # [C, 17, 17]
        layer.Conv2d(channels, channels, 3, padding=1, bias=False), layer.BatchNorm2d(channels),
        lif(True), layer.MaxPool2d(2),                                      # [C, 8, 8]
        layer.Flatten(),
        layer.Linear(channels * 8 * 8, 10, bias=False), lif(False),
    )
    functional.set_step_mode(net, "m")
    return net


def build_network(args):
    """The example's float network for ``args.dataset`` (``--channels``, ``--tau``)."""
    if args.dataset == "nmnist":
        return build_csnn(args.channels, args.tau)
    from snnquant.datasets import default_network
    return default_network(args.dataset, args.channels, args.tau)


def quantize(net, args):
    """``net`` quantized by :func:`snnquant.quantize_model` as the flags say; ``(net, None)`` for
    full precision (``--weight-bits 0 --v-bits 0``), else ``(model, report)``."""
    import snnquant
    if args.weight_bits == 0 and args.v_bits == 0:
        return net, None
    cfg = snnquant.QuantConfig(weight_bits=args.weight_bits or None,
                               weight_quantizer=args.weight_quantizer,
                               per_channel=not args.per_tensor,
                               v_bits=args.v_bits or None,
                               membrane_quantizer=args.membrane_quantizer, backend=args.backend,
                               fold_batchnorm=not args.no_fold_bn_training)
    return snnquant.quantize_model(net, cfg)


# --------------------------------------------------------------------------------------------------
# data


def load_data(args, rank):
    """The training and test sets of the run (rank 0 prepares the root, the others wait)."""
    from snnquant.datasets import load_dataset

    if rank == 0:
        if args.data_root is None:
            print("data: no --data-root given, using snnquant's built-in digits dataset in N-MNIST "
                  "format (scikit-learn digits through an emulated DVS saccade recording)")
        else:
            print(f"data: {args.dataset} at {args.data_root}")
    # rank 0 checks and prepares the root; the others wait at the barrier, then load it
    train_set, test_set, _info = load_dataset(args.dataset, args.data_root, args.T,
                                              samples_per_class=args.samples_per_class,
                                              seed=args.seed, rank=rank, barrier=barrier)
    return train_set, test_set


def make_loaders(train_set, test_set, args, rank, world, epoch):
    """The training and test loaders of ``epoch``: the order depends only on ``--seed`` and the
    epoch (a resumed run sees the same batches); under DDP each rank gets its share."""
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    if world > 1:
        train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                           seed=args.seed)
        train_sampler.set_epoch(epoch)
        # every test sample exactly once over all ranks (DistributedSampler would pad)
        test_sampler = list(range(rank, len(test_set), world))
    else:
        # the order of epoch e depends only on (seed, e): a resumed run sees the same batches
        g = torch.Generator().manual_seed(args.seed * 100003 + epoch)
        train_sampler = RandomSampler(train_set, generator=g)
        test_sampler = SequentialSampler(test_set)
    kw = dict(batch_size=args.batch_size, num_workers=args.workers,
              pin_memory=args.device.startswith("cuda"))
    return (DataLoader(train_set, sampler=train_sampler, drop_last=False, **kw),
            DataLoader(test_set, sampler=test_sampler, **kw))


# --------------------------------------------------------------------------------------------------
# training


class FiringRates:
    """Mean firing rate of every neuron layer, accumulated with forward hooks."""

    def __init__(self, model):
        from spikingjelly.activation_based import neuron
        self.sums, self.counts, self.handles = {}, {}, []
        for name, m in model.named_modules():
            if isinstance(m, neuron.BaseNode):
                self.handles.append(m.register_forward_hook(self._hook(name)))
                self.sums[name], self.counts[name] = 0.0, 0

    def _hook(self, name):
        def hook(_m, _inp, out):
            self.sums[name] += float(out.detach().float().mean())
            self.counts[name] += 1
        return hook

    def pop(self):
        """The mean firing rate per layer since the last call; starts counting anew."""
        rates = {k: self.sums[k] / max(1, self.counts[k]) for k in self.sums}
        for k in self.sums:
            self.sums[k], self.counts[k] = 0.0, 0
        return rates


def run_epoch(model, loader, opt, scaler, args, device, train: bool, rank: int, epoch: int,
              label: str = "", reduce: bool = True):
    """One pass over ``loader`` (training when ``train``): MSE between the output firing rate and
    the one-hot label, an ``opt`` step per batch, ``reset_net`` after each; returns ``(mean loss,
    accuracy)``, summed over ranks when ``reduce``."""
    from spikingjelly.activation_based import functional
    from tqdm import tqdm

    model.train(train)
    total_loss, correct, count = 0.0, 0, 0
    use_amp = args.amp
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    desc = label or f"epoch {epoch + 1}/{args.epochs} {'train' if train else 'test '}"
    # a bar redraws itself with a carriage return per batch: in a terminal only; a redirected
    # log gets one line per epoch (the caller's, or this pass's own below)
    bar = rank == 0 and sys.stdout.isatty()
    phase = label
    for frames, label in tqdm(loader, desc=desc, disable=not bar, leave=False, file=sys.stdout):
        x = frames.to(device, non_blocking=True).float().transpose(0, 1)  # [T, N, 2, 34, 34]
        y = label.to(device, non_blocking=True)
        with torch.set_grad_enabled(train), torch.autocast(device.type, dtype=amp_dtype,
                                                           enabled=use_amp):
            rate = model(x).float().mean(0)
            loss = F.mse_loss(rate, F.one_hot(y, rate.shape[-1]).float())
        if train:
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        functional.reset_net(model)
        total_loss += loss.item() * y.numel()
        correct += int((rate.argmax(1) == y).sum())
        count += y.numel()
    if reduce:
        total_loss, correct, count = all_sum([total_loss, correct, count], device)
    if phase and rank == 0 and not bar:
        print(f"{phase}: loss {total_loss / count:.4f} acc {correct / count:.4f}", flush=True)
    return total_loss / count, correct / count


def atomic_write_text(path: Path, text: str):
    """Write ``text`` to ``path`` atomically (:func:`snnquant._io.atomic_write`)."""
    from snnquant._io import atomic_write
    atomic_write(path, text)


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


def run_configuration(args, world: int) -> dict:
    """Everything that changes what the training epochs compute: all flags but
    ``RESUMABLE_FLAGS``, the device type and the world size (number of processes)."""
    config = {k: v for k, v in sorted(vars(args).items()) if k not in RESUMABLE_FLAGS}
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


def deploy_check(model, train_set, test_set, args, device, out: Path, max_samples: int = 64):
    """Fold BN into the quantized weights, fine-tune the folded network briefly, export it to
    integers and compare the integer simulator with it.

    BN folding changes every weight (and re-initialises the learned weight steps), so the folded
    network is fine-tuned for ``--finetune-epochs`` epochs (quantization in the loop, same data
    order rule, learning rate ``--lr`` with a cosine schedule). Returns the folded network's test accuracy (the
    network that is deployed) and the integer agreement: the fraction of ``max_samples`` test
    samples whose whole output spike train is identical in the integer simulator and in the
    fake-quantized float model (the simulator runs on the CPU). Writes ``model_int.safetensors``
    and ``model_folded.pt``. Runs on one process.
    """
    if args.weight_bits == 0 or args.v_bits == 0 or args.membrane_quantizer != "uniform" \
            or args.weight_quantizer not in ("lsq_pow2", "quantized_bits"):
        return {"skipped": "integer export needs quantized power-of-two weights "
                           "(--weight-quantizer lsq_pow2) and a uniform membrane"}
    from spikingjelly.activation_based import functional

    import snnquant
    from snnquant.export import (FoldWarning, c_memory, fold_batchnorm, integer_agreement,
                                 save_integer, to_c, to_integer)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FoldWarning)
        folded, fold_report = fold_batchnorm(model.eval(), return_report=True)
    for w in caught:  # the fold's own words, once, on the console
        print(f"warning: {w.message}")
    changed = fold_report.changed()
    fold_text = (f"folding changed {len(changed)} layers" if changed else
                 "folding changed no weight")
    folded = folded.to(device)
    functional.reset_net(folded)
    history = []
    if args.finetune_epochs:
        opt = torch.optim.Adam(folded.parameters(), lr=args.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.finetune_epochs)
        for e in range(args.finetune_epochs):
            train_loader, _ = make_loaders(train_set, test_set, args, 0, 1, args.epochs + e)
            loss, acc = run_epoch(folded, train_loader, opt, None, args, device, True, 0, e,
                                  label="fine-tune folded", reduce=False)
            sched.step()
            history.append(dict(epoch=e + 1, train_loss=loss, train_acc=acc))
    _, test_loader = make_loaders(train_set, test_set, args, 0, 1, 0)
    _, folded_acc = run_epoch(folded, test_loader, None, None, args, device, False, 0, 0,
                              label="test folded", reduce=False)
    xs, n = [], 0
    for frames, _label in test_loader:
        xs.append(frames.float().transpose(0, 1))
        n += frames.shape[0]
        if n >= max_samples:
            break
    x_seq = torch.cat(xs, 1)[:, :max_samples]
    folded = folded.cpu().eval()
    desc = to_integer(folded)
    save_integer(desc, out / "model_int.safetensors")
    snnquant.save_checkpoint(folded.state_dict(), out / "model_folded.pt")
    to_c(desc, out, "model_int", input_shape=tuple(x_seq.shape[2:]))   # model_int.h / model_int.c
    mem = c_memory(desc, tuple(x_seq.shape[2:]))
    agreement = integer_agreement(folded, x_seq, desc)
    return {"folded_test_acc": folded_acc, "agreement": float(agreement),
            "samples": int(x_seq.shape[1]), "finetune": history, "fold": fold_text,
            "c_rom_bytes": mem.rom_bytes, "c_ram_bytes": mem.ram_bytes}


def run_ptq(args, train_set, test_set, device, out: Path):
    """``--ptq``: quantize a trained full-precision network without retraining it.

    Fold BN into the full-precision weights, ``snnquant.quantize_model``, ``snnquant.calibrate`` on
    ``--calib-batches`` training batches, evaluate; fine-tune ``--finetune-epochs`` epochs
    (quantization in the loop, steps frozen by the calibration); export to integers and report the
    integer agreement. Writes ``ptq.json`` and ``model_int.safetensors``.
    """
    import itertools

    import snnquant
    from snnquant.export import fold_batchnorm, integer_agreement, save_integer, to_integer

    try:
        net = ptq_network(args)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    net = fold_batchnorm(net.eval()).to(device)
    train_loader, test_loader = make_loaders(train_set, test_set, args, 0, 1, 0)
    _, fp_acc = run_epoch(net, test_loader, None, None, args, device, False, 0, 0,
                          label="test full precision", reduce=False)
    model, _ = quantize(net, args)
    calib = ((frames.float().transpose(0, 1), y)
             for frames, y in itertools.islice(train_loader, args.calib_batches))
    report = snnquant.calibrate(model, calib, method=args.calib_method)
    print(report)
    _, ptq_acc = run_epoch(model, test_loader, None, None, args, device, False, 0, 0,
                           label="test PTQ", reduce=False)
    result = dict(full_precision_test_acc=fp_acc, ptq_test_acc=ptq_acc, finetune=[])
    print(f"full precision {100 * fp_acc:.2f}%, PTQ W{args.weight_bits}/V{args.v_bits} "
          f"({args.calib_method}, {args.calib_batches} batches): {100 * ptq_acc:.2f}%")
    if args.finetune_epochs:
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr / 10)
        for e in range(args.finetune_epochs):
            loader, _ = make_loaders(train_set, test_set, args, 0, 1, e)
            run_epoch(model, loader, opt, None, args, device, True, 0, e, label="fine-tune PTQ",
                      reduce=False)
            _, acc = run_epoch(model, test_loader, None, None, args, device, False, 0, e,
                               label="test PTQ", reduce=False)
            result["finetune"].append(dict(epoch=e + 1, test_acc=acc))
            print(f"PTQ + {e + 1} fine-tuning epochs: {100 * acc:.2f}%")
    result["test_acc"] = result["finetune"][-1]["test_acc"] if result["finetune"] else ptq_acc
    if not args.no_integer_check and args.weight_quantizer == "lsq_pow2" \
            and args.membrane_quantizer == "uniform":
        model = model.cpu().eval()
        x_seq = torch.stack([torch.as_tensor(test_set[i][0]) for i in range(min(64, len(test_set)))])
        desc = to_integer(model)
        save_integer(desc, out / "model_int.safetensors")
        result["agreement"] = float(integer_agreement(model, x_seq.float().transpose(0, 1), desc))
        print(f"integer model agreement: {100 * result['agreement']:.2f}%")
    atomic_write_text(out / "ptq.json", json.dumps(dict(flags=vars(args), result=result), indent=2))
    return result


# the optional modules a run imports: (module, pip package, extra that installs it)
def needed_modules(args) -> list:
    """The optional modules this run will import, as ``(module, package, extra)``."""
    needed = [("matplotlib", "matplotlib", "examples")]
    if args.dataset == "nmnist" and args.data_root is None:
        needed.append(("sklearn", "scikit-learn", "datasets"))
    else:  # SpikingJelly's dataset classes import torchvision
        needed.append(("torchvision", "torchvision", "datasets"))
    if args.dataset in ("cifar10_dvs", "shd") and args.data_root is not None:
        needed.append(("h5py", "h5py", "datasets"))
    if not args.no_integer_check:
        needed.append(("safetensors", "safetensors", "export"))
    return needed


def check_dependencies(args) -> None:
    """Stop before any work when an optional module this run needs is missing.

    Raises:
        MissingDependency: names the module, its package and the extra that installs it.
    """
    import importlib.util

    from snnquant.cli._errors import MissingDependency
    for module, package, extra in needed_modules(args):
        if importlib.util.find_spec(module) is None:
            raise MissingDependency(module, package, extra)


def _launch_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def main(argv=None, prog=None):
    """Run one training (or ``--ptq``) run as the flags say; return its result.

    Raises:
        RunFolderError: ``--out`` cannot hold this run (see the module docstring).
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

    # the checkpoint is verified (checksum) and its run configuration checked before any work
    ckpt_path, ckpt = out / "checkpoint.pt", None
    if args.resume:
        if not ckpt_path.exists():
            raise SystemExit(f"--resume: no checkpoint at {ckpt_path}")
        try:
            ckpt = snnquant.load_checkpoint(ckpt_path, map_location="cpu")
        except ValueError as exc:
            raise SystemExit(f"--resume: {exc}") from None
        check_resume_config(ckpt, run_configuration(args, world), ckpt_path)
        if folder is not None:
            folder.remove_end_of_run_files()

    train_set, test_set = load_data(args, rank)
    if args.ptq:
        return run_ptq(args, train_set, test_set, device, out)
    model, report = quantize(build_network(args), args)
    model.to(device)
    if rank == 0 and report is not None:
        print(report)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    scaler = torch.amp.GradScaler("cuda") if args.amp and device.type == "cuda" else None

    start_epoch, history = 0, []
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["torch_rng"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        start_epoch, history = ckpt["epoch"], json.loads(ckpt["history"])
        if rank == 0:
            print(f"resumed from {ckpt_path} after epoch {start_epoch}")

    net = model
    if world > 1:
        ddp_kw = dict(device_ids=[device.index]) if device.type == "cuda" else {}
        net = torch.nn.parallel.DistributedDataParallel(model, **ddp_kw)
    rates = FiringRates(model)
    writer = None
    if rank == 0:
        try:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        except ImportError:
            print("tensorboard is not installed: no TensorBoard scalars (pip install tensorboard)")

    t_start = time.time()
    for epoch in range(start_epoch, args.epochs):
        if epoch >= args.epochs - args.freeze_bn_epochs and snnquant.freeze_batchnorm(model) \
                and rank == 0 and epoch == args.epochs - args.freeze_bn_epochs:
            print(f"epoch {epoch + 1}: BN statistics frozen (the deployed network trains)")
        train_loader, test_loader = make_loaders(train_set, test_set, args, rank, world, epoch)
        t0 = time.time()
        train_loss, train_acc = run_epoch(net, train_loader, opt, scaler, args, device, True, rank, epoch)
        train_rates = rates.pop()
        names = sorted(train_rates)
        train_rates = {k: v / world for k, v in zip(names, all_sum([train_rates[k] for k in names], device))}
        test_loss, test_acc = run_epoch(net, test_loader, None, None, args, device, False, rank, epoch)
        test_rates = rates.pop()
        rate_names = sorted(test_rates)
        rate_vals = all_sum([test_rates[k] for k in rate_names], device)
        test_rates = {k: v / world for k, v in zip(rate_names, rate_vals)}
        sched.step()
        entry = dict(epoch=epoch + 1, train_loss=train_loss, train_acc=train_acc,
                     test_loss=test_loss, test_acc=test_acc, firing_rates=test_rates,
                     train_firing_rates=train_rates, seconds=time.time() - t0)
        history.append(entry)
        if rank == 0:
            print(f"epoch {epoch + 1:3d}/{args.epochs}  train loss {train_loss:.4f} acc "
                  f"{train_acc:.4f}  test loss {test_loss:.4f} acc {test_acc:.4f}  "
                  f"({entry['seconds']:.1f} s)")
            if writer is not None:
                writer.add_scalar("loss/train", train_loss, epoch + 1)
                writer.add_scalar("loss/test", test_loss, epoch + 1)
                writer.add_scalar("accuracy/train", train_acc, epoch + 1)
                writer.add_scalar("accuracy/test", test_acc, epoch + 1)
                for k, v in test_rates.items():
                    writer.add_scalar(f"firing_rate/{k}", v, epoch + 1)
                writer.flush()
            ckpt = dict(model=model.state_dict(), optimizer=opt.state_dict(),
                        scheduler=sched.state_dict(), epoch=epoch + 1,
                        torch_rng=torch.get_rng_state(), history=json.dumps(history),
                        scaler=scaler.state_dict() if scaler is not None else {},
                        config=run_configuration(args, world))
            snnquant.save_checkpoint(ckpt, ckpt_path)
            atomic_write_text(out / "metrics.json", json.dumps(
                dict(flags=vars(args), history=history), indent=2))
            write_plots(out, history)
        barrier()
        if args.stop_after is not None and epoch + 1 >= args.stop_after:
            if rank == 0:
                print(f"stopping after epoch {epoch + 1} (--stop-after)")
            if writer is not None:
                writer.close()
            return dict(stopped_after=epoch + 1)

    result = dict(test_acc=history[-1]["test_acc"] if history else None,
                  train_seconds=time.time() - t_start)
    # the end-of-run work (summary, BN folding, fine-tuning, integer export) runs on rank 0 alone:
    # leave the process group first, so that no rank waits in a collective meanwhile
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"test accuracy: {100 * result['test_acc']:.2f}%")
        frames = torch.stack([torch.as_tensor(test_set[i][0]) for i in range(min(16, len(test_set)))])
        functional.reset_net(model)
        summ = snnquant.summary(model, frames.float().transpose(0, 1).to(device))
        print(summ)
        atomic_write_text(out / "summary.txt", str(summ) + "\n")
        snnquant.save_checkpoint(model.state_dict(), out / "model.pt")
        print(f"saved the trained model to {out / 'model.pt'}")
        if not args.no_integer_check:
            functional.reset_net(model)
            agreement = deploy_check(model, train_set, test_set, args, device, out)
            result["integer"] = agreement
            if "agreement" in agreement:
                print(f"BN folded into the quantized weights, fine-tuned {args.finetune_epochs} "
                      f"epochs: test accuracy {100 * agreement['folded_test_acc']:.2f}% (trained: "
                      f"{100 * result['test_acc']:.2f}%; {agreement['fold']})")
                print(f"integer model agreement: {100 * agreement['agreement']:.2f}% "
                      f"({agreement['samples']} test samples, every output spike)")
                print(f"C model: {out / 'model_int.c'} (.h), ROM {agreement['c_rom_bytes']} bytes, "
                      f"RAM {agreement['c_ram_bytes']} bytes")
            else:
                print(f"integer model check skipped: {agreement.get('skipped')}")
        metrics = dict(flags=vars(args), history=history, result=result)
        atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2, default=str))
        if writer is not None:
            writer.close()
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
