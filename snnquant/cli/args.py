"""The flags of ``snnquant train``: parsing and checking them (errors exit with status 2), the
command's help text, and the optional modules a run of those flags needs."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from snnquant.cli.network import BINARY_LR, DEFAULT_LR, default_lr
from snnquant.cli.ptq import ptq_network
from snnquant.distill import ALIGNMENTS

#: ``--kd-temperature``, ``--kd-weight``, ``--align``, ``--align-weight`` by default: chosen for
#: W2/V4 on a validation split of the real N-MNIST training recordings (160 of the 800, 2 seeds;
#: benchmarks/results/distill_low_bits_val_real.md): the output loss plus firing-rate alignment
#: beat either alone and the membrane alignment
KD_TEMPERATURE = 0.2
KD_WEIGHT = 0.5
KD_ALIGN = "firing_rate"
KD_ALIGN_WEIGHT = 1.0

#: ``snnquant train --help``: what the command does, its outputs, its run folder and exit statuses
#: (the description above the flags; the dataset layouts follow it)
DESCRIPTION = """\
Train a low-bit spiking CNN on N-MNIST (or, with no data root, on the built-in N-MNIST-format
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


def train_parser(prog=None):
    """The parser of ``snnquant train``'s flags (their types, choices and defaults), before the
    checks of :func:`parse_args`."""
    from snnquant.cli._errors import OneLineParser
    from snnquant.convert import MEMBRANE_QUANTIZERS, WEIGHT_QUANTIZERS
    from snnquant.datasets import DATASETS, DATA_ROOT_HELP
    from snnquant.kernels import BACKENDS, DEFAULT_BACKEND

    ap = OneLineParser(prog=prog, description=DESCRIPTION + DATA_ROOT_HELP,
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
    ap.add_argument("--model", default=None,
                    help="a network of SpikingJelly's model package instead of the example's "
                         "CSNN: SpikeDrivenTransformer, Spikformer, QKFormer, MSResNet, "
                         "NMNISTNet, ... (or module.Name); its channels, classes, image size and "
                         "T come from --dataset and -T unless --model-arg gives them")
    ap.add_argument("--model-arg", "--model-args", dest="model_arg", action="append",
                    default=None, metavar="KEY=VALUE",
                    help="a constructor argument of --model (repeat), a Python literal: "
                         "--model-arg embed_dims=64 --model-arg tau=2.0; or several as one "
                         "dict: --model-args \"{'embed_dims': 64, 'depths': 2}\"")
    ap.add_argument("--crop", type=int, default=None, metavar="SIZE",
                    help="centre-crop every frame to SIZE x SIZE (e.g. N-MNIST's 34x34 to 32, "
                         "so that a transformer's final means run over powers of two, as the "
                         "deployability report before training asks)")
    kd = ap.add_argument_group(
        "distillation from the full-precision network (snnquant.distill.Distiller)",
        "Use it at 2 to 4 weight bits: on real N-MNIST, training against the full-precision\n"
        "network recovered most of the points the default loses at 2 bits and the last point at\n"
        "3 and 4 bits; with binary weights (--weight-bits 1, BatchNorm folded after training)\n"
        "it lost accuracy (docs: guide/low_bits, measured by\n"
        "benchmarks/distill_low_bits.py). Give a finished --weight-bits 0 --v-bits 0 run with\n"
        "--teacher, or --train-teacher to train it first into <out>/teacher. The student still\n"
        "trains with BatchNorm folded and deploys exactly; an epoch costs one more forward pass\n"
        "of the full-precision network (about 1.6x the time of an epoch on a CPU). The\n"
        "teacher's SHA-256 goes into run.json and the checkpoint.")
    kd.add_argument("--teacher", metavar="RUN_DIR", default=None,
                    help="distil from the full-precision network of this finished run folder "
                         "(its model.pt, checked against its run.json)")
    kd.add_argument("--train-teacher", action="store_true",
                    help="train the full-precision teacher first, into <out>/teacher (same data, "
                         "network, epochs and seed), then distil from it; --resume continues "
                         "whichever of the two was interrupted")
    kd.add_argument("--kd-temperature", type=float, default=KD_TEMPERATURE,
                    help=f"temperature of the output loss on the output firing rates (default "
                         f"{KD_TEMPERATURE}: rates lie in [0, 1], so below 1 sharpens them)")
    kd.add_argument("--kd-weight", type=float, default=KD_WEIGHT,
                    help=f"weight alpha of the output loss; the task loss gets 1 - alpha "
                         f"(default {KD_WEIGHT})")
    kd.add_argument("--align", default=KD_ALIGN,
                    choices=("none",) + tuple(a for a in ALIGNMENTS if a != "attention"),
                    help=f"per-layer alignment with the teacher's neurons, matched by name "
                         f"(default {KD_ALIGN}; the command line's networks have no attention)")
    kd.add_argument("--align-weight", type=float, default=KD_ALIGN_WEIGHT,
                    help=f"weight of the alignment (default {KD_ALIGN_WEIGHT})")
    ap.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)  # tests: simulate an interruption
    return ap


def parse_args(argv=None, prog=None):
    """The flags of a training run (``snnquant train --help``); errors exit with status 2."""
    from snnquant.datasets import dataset_info

    ap = train_parser(prog)
    args = ap.parse_args(argv)
    _check_ptq_options(ap, args)
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
    _check_model(ap, args)
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
    _check_distillation(ap, args)
    if args.ptq and not Path(args.ptq).is_file():
        ap.error(f"--ptq: no checkpoint file at {args.ptq}")
    if args.ptq:
        try:
            ptq_network(args)
        except ValueError as exc:
            ap.error(str(exc))
    return args


def _check_ptq_options(ap, args) -> None:
    """``--ptq`` runs no training: the options that only change training are refused with it
    (before ``--freeze-bn-epochs`` gets its default)."""
    if not args.ptq:
        return
    for flag, given in (("--no-fold-bn-training", args.no_fold_bn_training),
                        ("--freeze-bn-epochs", args.freeze_bn_epochs is not None)):
        if given:
            ap.error(f"{flag} changes training; a --ptq run trains nothing (it calibrates and "
                     f"fine-tunes the folded network): leave {flag} out")
def _check_distillation(ap, args) -> None:
    """``--teacher`` / ``--train-teacher`` and the distillation options."""
    distils = args.teacher is not None or args.train_teacher
    if args.teacher is not None and args.train_teacher:
        ap.error("give --teacher RUN_DIR (a finished full-precision run) or --train-teacher, "
                 "not both")
    if distils and args.ptq:
        ap.error("--teacher/--train-teacher distil during training; --ptq does not train: drop "
                 "one of them")
    if distils and args.weight_bits == 0 and args.v_bits == 0:
        ap.error("--teacher/--train-teacher distil into a quantized network: give --weight-bits "
                 "or --v-bits > 0")
    if args.teacher is not None and not (Path(args.teacher) / "model.pt").is_file():
        ap.error(f"--teacher {args.teacher}: no model.pt there (give the folder of a finished "
                 f"--weight-bits 0 --v-bits 0 run)")
    if not math.isfinite(args.kd_temperature) or args.kd_temperature <= 0:
        ap.error(f"--kd-temperature must be a finite number > 0, got {args.kd_temperature}")
    if not 0 <= args.kd_weight <= 1:
        ap.error(f"--kd-weight must be in [0, 1], got {args.kd_weight}")
    if not math.isfinite(args.align_weight) or args.align_weight < 0:
        ap.error(f"--align-weight must be a finite number >= 0, got {args.align_weight}")


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


def _check_model(ap, args) -> None:
    """``--model``, ``--model-arg`` and ``--crop``: a network of SpikingJelly's model package
    that builds with those arguments, refused before any data is read."""
    crop = getattr(args, "crop", None)
    if crop is not None:
        from snnquant.datasets import dataset_info
        shape = dataset_info(args.dataset).frame_shape
        if len(shape) != 3 or not 1 <= crop <= min(shape[1:]):
            ap.error(f"--crop must be in [1, {min(shape[1:]) if len(shape) == 3 else '-'}] for "
                     f"the {shape} frames of --dataset {args.dataset}, got {crop}")
    if getattr(args, "model", None) is None:
        if getattr(args, "model_arg", None):
            ap.error("--model-arg needs --model")
        return
    if args.ptq:
        ap.error("--ptq quantizes the example's network; it does not take --model")
    from snnquant.cli.zoo import build_zoo
    try:
        build_zoo(args)
    except ValueError as exc:
        ap.error(str(exc))


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
