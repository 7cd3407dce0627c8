"""Event formats and the built-in neuromorphic dataset.

* :func:`read_nmnist_bin` / :func:`write_nmnist_bin`: N-MNIST's 5-bytes-per-event ``.bin`` files.
* :func:`saccade_events`: turn still images into event streams as N-MNIST was recorded (three
  saccades in front of a DVS camera).
* :func:`make_digits_nmnist`: scikit-learn's 1797 handwritten digits converted that way and
  written in N-MNIST's layout, cached; no download.
* :func:`load_nmnist_frames`: check an N-MNIST root (real or built-in, in any of the
  :data:`NMNIST_LAYOUTS`) and load it as SpikingJelly frames.
* :func:`load_dataset`: N-MNIST, DVS128 Gesture, CIFAR10-DVS or SHD through SpikingJelly's own
  classes, checked, as ``(train, test, info)`` for the training example.
* :mod:`snnquant.datasets.fixtures`: tiny recordings written in each dataset's original file format.

Importing this package imports numpy only; scikit-learn and ``spikingjelly.datasets`` (which
imports torchvision) are imported by the functions that need them.
"""

from .digits import (
    DIGITS_NMNIST_EMULATION,
    DIGITS_NMNIST_VERSION,
    DIGITS_TEST_FRACTION,
    default_data_dir,
    digits_nmnist_split,
    make_digits_nmnist,
)
from .checked import CorruptDatasetFileError
from .nmnist import (
    NMNIST_CLASSES,
    NMNIST_LAYOUTS,
    NMNIST_URL,
    DatasetRootError,
    build_lock,
    check_nmnist_root,
    convert_extracted,
    load_nmnist_frames,
    prepare_nmnist_root,
)
from .nmnist_format import EVENT_BYTES, MAX_TIMESTAMP_US, CorruptEventFileError, read_nmnist_bin, write_nmnist_bin
from .neuromorphic import check_neuromorphic_root, load_neuromorphic_frames, prepare_neuromorphic_root
from .registry import DATA_ROOT_HELP, DATASET_ERRORS, DATASETS, DatasetInfo, dataset_info, default_network, load_dataset
from .saccades import saccade_events, saccade_offsets
from .splits import stratified_split, stratified_subset

__all__ = [
    "read_nmnist_bin",
    "write_nmnist_bin",
    "CorruptEventFileError",
    "EVENT_BYTES",
    "MAX_TIMESTAMP_US",
    "saccade_events",
    "saccade_offsets",
    "make_digits_nmnist",
    "digits_nmnist_split",
    "default_data_dir",
    "DIGITS_NMNIST_VERSION",
    "DIGITS_NMNIST_EMULATION",
    "DIGITS_TEST_FRACTION",
    "load_nmnist_frames",
    "check_nmnist_root",
    "prepare_nmnist_root",
    "build_lock",
    "convert_extracted",
    "CorruptDatasetFileError",
    "NMNIST_LAYOUTS",
    "stratified_split",
    "stratified_subset",
    "DATASETS",
    "DATASET_ERRORS",
    "DATA_ROOT_HELP",
    "DatasetInfo",
    "dataset_info",
    "default_network",
    "load_dataset",
    "check_neuromorphic_root",
    "prepare_neuromorphic_root",
    "load_neuromorphic_frames",
    "DatasetRootError",
    "NMNIST_URL",
    "NMNIST_CLASSES",
]
