"""One entry point for the datasets the training example takes: N-MNIST, DVS128 Gesture,
CIFAR10-DVS and SHD, each with its default time steps and network.

:func:`load_dataset` returns checked SpikingJelly frame datasets for a root in SpikingJelly's
layout (or, for N-MNIST without a root, the built-in digits dataset); :func:`default_network`
builds the network the example trains on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["DATASETS", "DATASET_ERRORS", "DATA_ROOT_HELP", "DatasetInfo", "dataset_info", "load_dataset", "default_network"]

DATASETS = ("nmnist", "dvs128_gesture", "cifar10_dvs", "shd")
"""The names :func:`load_dataset` and the example's ``--dataset`` accept."""

DATA_ROOT_HELP = """
Dataset roots (--data-root), each in SpikingJelly's layout; a root that fits none is refused with
one line saying what was looked for and what was found (exit status 2):
  nmnist          any of: events_np/{train,test}/<0..9>/*.npz (prepared by SpikingJelly);
                  download/Train.zip + download/Test.zip (SpikingJelly's names);
                  download/train.zip + download/test.zip (tonic's lowercase names, same files);
                  extract/{Train,Test}/<0..9>/*.bin; Train/<0..9>/*.bin + Test/<0..9>/*.bin
                  (the zips from https://www.garrickorchard.com/datasets/n-mnist extracted in place)
  dvs128_gesture  download/DvsGesture.tar.gz, or extract/DvsGesture/ (*.aedat, *_labels.csv,
                  trials_to_train.txt, trials_to_test.txt), or events_np/ (prepared)
  cifar10_dvs     download/<class>.zip (10 zips), or extract/<class>/*.aedat, or events_np/;
                  test split: the first 10 % of each class by recording index (TEBN's split)
  shd             download/shd_train.h5.zip + shd_test.h5.zip, or extract/shd_train.h5 +
                  extract/shd_test.h5, or events_h5/ (prepared)
Downloads are checked against SpikingJelly's md5 sums; nothing is deleted.
"""
"""The example's ``--help`` text on dataset roots."""


def _dataset_errors():
    from .checked import CorruptDatasetFileError
    from .nmnist import DatasetRootError
    from .nmnist_format import CorruptEventFileError

    return (DatasetRootError, CorruptDatasetFileError, CorruptEventFileError)


DATASET_ERRORS = _dataset_errors()
"""The errors that mean a root or a file cannot be loaded (the example reports them in one line)."""


class DatasetInfo(NamedTuple):
    """What a training loop needs to know about a dataset.

    Attributes:
        name: one of :data:`DATASETS`.
        title: its usual name.
        num_classes: number of classes (the network's outputs).
        frame_shape: shape of one frame (one time step) of a sample.
        default_T: time steps (frames) per sample the example uses by default.
        test_split: how the test split is defined.
    """

    name: str
    title: str
    num_classes: int
    frame_shape: Tuple[int, ...]
    default_T: int
    test_split: str


_INFO = {
    "nmnist": DatasetInfo("nmnist", "N-MNIST", 10, (2, 34, 34), 8, "the published Train/Test split"),
    "dvs128_gesture": DatasetInfo(
        "dvs128_gesture", "DVS128 Gesture", 11, (2, 128, 128), 16,
        "the published trials_to_train.txt / trials_to_test.txt split",
    ),
    "cifar10_dvs": DatasetInfo(
        "cifar10_dvs", "CIFAR10-DVS", 10, (2, 128, 128), 10,
        "per class, the recordings with the smallest 10 % of indices (cifar10_<class>_0..99 of 1000, "
        "as TEBN and SpikingJelly's CIFAR10DVSTEBNSplit), at least one",
    ),
    "shd": DatasetInfo("shd", "SHD", 20, (700,), 20, "the published shd_train.h5 / shd_test.h5 split"),
}


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``name`` (one of :data:`DATASETS`)."""
    if name not in _INFO:
        raise ValueError(f"dataset must be one of {list(DATASETS)}, got {name!r}")
    return _INFO[name]


def load_dataset(
    name: str,
    root=None,
    T: Optional[int] = None,
    *,
    samples_per_class: Optional[int] = None,
    seed: int = 0,
    rank: int = 0,
    barrier: Optional[Callable[[], None]] = None,
):
    """Check, prepare and load a dataset as SpikingJelly frames: ``(train_set, test_set, info)``.

    The root is prepared by rank 0 (extraction, SpikingJelly's conversion, frame integration);
    the other ranks wait at ``barrier`` and then load the finished root, so ranks never collide
    on SpikingJelly's ``.building`` markers.

    With ``samples_per_class = k``, each split keeps :math:`k` samples of every class, chosen by
    :func:`~snnquant.datasets.stratified_subset` with ``seed`` (the built-in digits keep their own
    rule, :func:`~snnquant.datasets.digits_nmnist_split`). A class with fewer than :math:`k`
    samples in a split is an error, never a silently smaller subset.

    Args:
        name: one of :data:`DATASETS`.
        root: the dataset root in SpikingJelly's layout (N-MNIST: any of the
            :data:`~snnquant.datasets.NMNIST_LAYOUTS`); ``None`` only for ``'nmnist'``, which then
            uses the built-in digits dataset (:func:`~snnquant.datasets.make_digits_nmnist`).
        T: frames per sample (default :attr:`DatasetInfo.default_T`).
        samples_per_class: ``None`` for all, or :math:`k \\ge 1`.
        seed: seed of the subset.
        rank: this process's rank (0 without DistributedDataParallel).
        barrier: called by every rank between the preparation and the load (``None``: no DDP).

    Returns:
        ``(train_set, test_set, info)``: two datasets whose items are ``(frames, label)`` with
        frames ``[T, *info.frame_shape]``, and the :class:`DatasetInfo`.

    Raises:
        DatasetRootError, CorruptDatasetFileError, CorruptEventFileError: the root cannot be
            loaded; the message is one line naming the file or folder and what to do.
        ValueError: a bad argument, or ``samples_per_class`` larger than a class.
    """
    info = dataset_info(name)
    T = info.default_T if T is None else T
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be an integer >= 1, got {T!r}")
    if root is None and name != "nmnist":
        raise ValueError(f"{info.title} needs a root (--data-root): only N-MNIST has a built-in dataset")
    wait = barrier or (lambda: None)
    if name == "nmnist":
        from .digits import make_digits_nmnist
        from .nmnist import load_nmnist_frames

        builtin = root is None
        if builtin:
            if rank == 0:
                built = make_digits_nmnist(seed=0, samples_per_class=samples_per_class)
                load_nmnist_frames(built, True, T), load_nmnist_frames(built, False, T)
            wait()
            root = make_digits_nmnist(seed=0, samples_per_class=samples_per_class)
        else:
            if rank == 0:
                load_nmnist_frames(root, True, T), load_nmnist_frames(root, False, T)
            wait()
        train, test = load_nmnist_frames(root, True, T), load_nmnist_frames(root, False, T)
        if builtin:
            return train, test, info
    else:
        from .neuromorphic import load_neuromorphic_frames

        if rank == 0:
            load_neuromorphic_frames(name, root, True, T)
            if name != "cifar10_dvs":
                load_neuromorphic_frames(name, root, False, T)
        wait()
        if name == "cifar10_dvs":
            whole = load_neuromorphic_frames(name, root, True, T)
            train, test = _cifar10_dvs_split(whole)
        else:
            train, test = load_neuromorphic_frames(name, root, True, T), load_neuromorphic_frames(name, root, False, T)
    if samples_per_class is not None:
        from .splits import stratified_subset

        train = _subset(train, samples_per_class, seed, f"the training split of {root}", stratified_subset)
        test = _subset(test, samples_per_class, seed, f"the test split of {root}", stratified_subset)
    return train, test, info


def _targets(dataset) -> np.ndarray:
    from torch.utils.data import Subset

    if isinstance(dataset, Subset):
        return _targets(dataset.dataset)[np.asarray(dataset.indices)]
    return np.asarray(dataset.targets, dtype=np.int64)


def _subset(dataset, k, seed, what, stratified_subset):
    from torch.utils.data import Subset

    from .nmnist import DatasetRootError

    try:
        indices = stratified_subset(_targets(dataset), k, seed, what=what)
    except ValueError as error:
        raise DatasetRootError(f"--samples-per-class / {error}") from None
    return Subset(dataset, indices.tolist())


def _cifar10_dvs_split(whole):
    from torch.utils.data import Subset

    targets = np.asarray(whole.targets)
    numbers = np.array([_trailing_number(path) for path, _ in whole.samples])
    test, train = [], []
    for c in np.unique(targets):
        members = np.flatnonzero(targets == c)
        members = members[np.lexsort((members, numbers[members]))]
        n_test = max(1, int(round(0.1 * members.size)))
        if members.size < 2:
            from .nmnist import DatasetRootError

            raise DatasetRootError(f"CIFAR10-DVS class {whole.classes[c]} has {members.size} recording; "
                                   "a training and a test split need at least 2")
        test.extend(members[:n_test].tolist())
        train.extend(members[n_test:].tolist())
    return Subset(whole, sorted(train)), Subset(whole, sorted(test))


def _trailing_number(path) -> int:
    match = re.search(r"(\d+)\.npz$", str(path))
    return int(match.group(1)) if match else -1


def default_network(name: str, channels: int = 16, tau: float = 2.0):
    """The example's default multi-step network for a dataset, with SpikingJelly's layers and LIF neurons.

    * N-MNIST (``[T, N, 2, 34, 34]``): conv(stride 2)-BN-LIF, conv-BN-LIF-maxpool, linear-LIF.
    * DVS128 Gesture and CIFAR10-DVS (``[T, N, 2, 128, 128]``): conv(stride 2)-BN-LIF, then three
      conv-BN-LIF-maxpool blocks (128 -> 64 -> 32 -> 16 -> 8), linear-LIF read-out.
    * SHD (``[T, N, 700]``): fully connected, 700 -> ``8 * channels`` LIF -> 20 LIF.

    Every layer is one that :func:`snnquant.quantize_model` quantizes and
    :func:`snnquant.export.to_integer` exports (after :func:`snnquant.export.fold_batchnorm`).

    Args:
        name: one of :data:`DATASETS`.
        channels: channels of every conv block (SHD: the hidden layer has ``8 * channels`` units).
        tau: the LIF time constant.

    Returns:
        ``torch.nn.Sequential`` in multi-step mode.
    """
    import torch.nn as nn
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    info = dataset_info(name)
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise ValueError(f"channels must be an integer >= 1, got {channels!r}")

    def lif(detach=True):
        return neuron.LIFNode(tau=tau, surrogate_function=surrogate.ATan(), detach_reset=detach)

    def block(c_in, stride=1, pool=False):
        mods = [layer.Conv2d(c_in, channels, 3, stride=stride, padding=1, bias=False),
                layer.BatchNorm2d(channels), lif()]
        return mods + ([layer.MaxPool2d(2)] if pool else [])

    if name == "nmnist":
        mods = block(2, stride=2) + block(channels, pool=True)  # 34 -> 17 -> 8
        mods += [layer.Flatten(), layer.Linear(channels * 8 * 8, info.num_classes, bias=False), lif(False)]
    elif name in ("dvs128_gesture", "cifar10_dvs"):
        mods = block(2, stride=2) + block(channels, pool=True) + block(channels, pool=True) + block(channels, pool=True)
        mods += [layer.Flatten(), layer.Linear(channels * 8 * 8, info.num_classes, bias=False), lif(False)]
    else:
        hidden = 8 * channels
        mods = [layer.Linear(700, hidden, bias=False), lif(), layer.Linear(hidden, info.num_classes, bias=False), lif(False)]
    net = nn.Sequential(*mods)
    functional.set_step_mode(net, "m")
    return net
