"""Real N-MNIST recordings: readers, the accepted root layouts, stratified subsets, corrupt caches,
and the training example on a real root. Uses the shared recordings (skipped where absent)."""
import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import snnquant.datasets as D
from _repo import shared_recordings

REPO = pathlib.Path(__file__).resolve().parents[1]
REAL = shared_recordings()
needs_real = pytest.mark.skipif(
    REAL is None, reason="the shared real N-MNIST recordings (../shared/data/nmnist-real-1k or "
    "$SNNQUANT_SHARED_DATA/nmnist-real-1k) are not on this machine"
)


def _real_files():
    return sorted((REAL / "Train").glob("*/*.bin"))


def _lay_out(root, train_per_class, test_per_class, under=""):
    """<root>/<under>/Train/<c>/ and Test/<c>/ with symbolic links to real recordings (disjoint)."""
    by_class = {}
    for path in _real_files():
        by_class.setdefault(path.parent.name, []).append(path)
    for c, files in by_class.items():
        for split, chosen in (("Train", files[:train_per_class]),
                              ("Test", files[train_per_class:train_per_class + test_per_class])):
            for f in chosen:
                link = pathlib.Path(root) / under / split / c / f.name
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(f)
    return pathlib.Path(root)


def _zip_split(source_root, zip_path, split):
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zip_path, "w") as z:
        for f in sorted((source_root / split).rglob("*.bin")):
            z.write(f, f.relative_to(source_root).as_posix())
    return hashlib.md5(zip_path.read_bytes()).hexdigest()


@needs_real
def test_snnquant_and_spikingjelly_read_every_real_recording_identically():
    from spikingjelly.datasets.utils import load_ATIS_bin

    files = _real_files()
    assert len(files) == 1000
    differ = []
    for path in files:
        ours = D.read_nmnist_bin(path, sensor_size=(34, 34))
        theirs = load_ATIS_bin(str(path))
        if ours["t"].size == 0 or not all(np.array_equal(ours[k], theirs[k]) for k in "xypt"):
            differ.append(path)
    assert differ == []


@needs_real
@pytest.mark.parametrize("layout", ["extracted", "extract"])
def test_extracted_real_roots_load_with_the_right_labels(tmp_path, layout):
    root = _lay_out(tmp_path / "nmnist", 2, 1, under="extract" if layout == "extract" else "")
    assert D.check_nmnist_root(root) == layout
    train, test, info = D.load_dataset("nmnist", root, 4)
    assert (len(train), len(test), info.num_classes) == (20, 10, 10)
    assert tuple(train.classes) == D.NMNIST_CLASSES
    # each sample's label is the folder its recording came from
    for path, label in train.samples:
        assert pathlib.Path(path).parent.name == str(label)
    assert D.check_nmnist_root(root) == "events_np"  # converted once, atomically


@needs_real
@pytest.mark.parametrize("names", [("train.zip", "test.zip"), ("Train.zip", "Test.zip")], ids=["tonic", "spikingjelly"])
def test_zip_roots_are_md5_checked_then_extracted(tmp_path, monkeypatch, names):
    from spikingjelly.datasets.n_mnist import NMNIST

    source = _lay_out(tmp_path / "source", 2, 1)
    root = tmp_path / "nmnist"
    md5 = {split: _zip_split(source, root / "download" / name, split) for split, name in zip(("Train", "Test"), names)}
    # our zips are not N-MNIST's: refused by name, nothing deleted
    with pytest.raises(D.DatasetRootError, match=names[0].replace(".", r"\.") + " has md5"):
        D.check_nmnist_root(root)
    assert (root / "download" / names[0]).exists()
    # with N-MNIST's md5 sums swapped for ours, the root is accepted and loads
    monkeypatch.setattr(NMNIST, "resource_url_md5", classmethod(
        lambda cls: [("Train.zip", "url", md5["Train"]), ("Test.zip", "url", md5["Test"])]))
    assert D.check_nmnist_root(root) == ("tonic" if names[0] == "train.zip" else "download")
    train, test, _ = D.load_dataset("nmnist", root, 4)
    assert (len(train), len(test)) == (20, 10)


def test_a_root_that_fits_no_layout_gets_one_line_listing_what_was_looked_for_and_found(tmp_path):
    root = tmp_path / "nmnist"
    (root / "train").mkdir(parents=True)
    (root / "download").mkdir()
    (root / "download" / "nmnist.tar").write_bytes(b"x")
    with pytest.raises(D.DatasetRootError) as info:
        D.check_nmnist_root(root)
    message = str(info.value)
    assert "\n" not in message
    for looked_for in ("events_np/", "download/Train.zip", "download/train.zip", "extract/", "Train/<0..9>/*.bin"):
        assert looked_for in message
    assert "Found: download/ (nmnist.tar), train/" in message


def test_an_incomplete_extracted_root_names_the_missing_class(tmp_path):
    root = tmp_path / "nmnist"
    for split in ("Train", "Test"):
        for c in range(10):
            if (split, c) != ("Test", 3):
                (root / split / str(c)).mkdir(parents=True)
                D.write_nmnist_bin(root / split / str(c) / "1.bin", {k: np.array([1]) for k in "xypt"})
    with pytest.raises(D.DatasetRootError, match=r"Test lacks the class folder\(s\) 3"):
        D.check_nmnist_root(root)


@needs_real
def test_samples_per_class_with_a_root_is_stratified_and_deterministic_by_seed(tmp_path):
    root = _lay_out(tmp_path / "nmnist", 6, 4)

    def chosen(seed, k=3):
        train, test, _ = D.load_dataset("nmnist", root, 4, samples_per_class=k, seed=seed)
        labels = [train.dataset.targets[i] for i in train.indices]
        assert np.bincount(labels, minlength=10).tolist() == [k] * 10
        assert np.bincount([test.dataset.targets[i] for i in test.indices], minlength=10).tolist() == [k] * 10
        return list(train.indices), list(test.indices)

    assert chosen(0) == chosen(0)
    assert chosen(0) != chosen(1)
    with pytest.raises(D.DatasetRootError, match=r"samples_per_class=5 .*test split.*class 0: 4"):
        D.load_dataset("nmnist", root, 4, samples_per_class=5)


def test_stratified_split_has_exact_totals_and_class_proportions():
    labels = np.repeat(np.arange(10), [97, 116, 99, 93, 105, 92, 94, 117, 87, 100])
    split = D.stratified_split(labels, test_count=200, seed=0)
    assert (split["train"].size, split["test"].size) == (800, 200)
    assert np.intersect1d(split["train"], split["test"]).size == 0
    assert np.bincount(labels[split["test"]]).tolist() == [20, 23, 20, 19, 21, 18, 19, 23, 17, 20]
    np.testing.assert_array_equal(split["test"], D.stratified_split(labels, test_count=200, seed=0)["test"])


@needs_real
def test_corrupt_npz_in_events_np_or_frames_is_named_with_how_to_rebuild(tmp_path):
    import shutil

    root = _lay_out(tmp_path / "nmnist", 2, 1)
    train = D.load_nmnist_frames(root, True, 4)
    # a frames file damaged after the cache was built: the error names it (not BadZipFile)
    frame_file = pathlib.Path(train.samples[5][0])
    frame_file.write_bytes(frame_file.read_bytes()[:50])
    train = D.load_nmnist_frames(root, True, 4)
    with pytest.raises(D.CorruptDatasetFileError, match="frames_number_4_split_by_number.*rebuilt") as info:
        train[5]
    assert info.value.path == frame_file
    # a damaged events_np file, met while SpikingJelly integrates new frames
    shutil.rmtree(root / "frames_number_4_split_by_number")
    events = sorted((root / "events_np" / "train" / "7").glob("*.npz"))[0]
    events.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(D.CorruptDatasetFileError) as info:
        D.load_nmnist_frames(root, True, 4)
    assert info.value.path == events and "delete" in str(info.value) and "events_np" in info.value.rebuild


def _example(*args, env_extra=None, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, str(REPO / "examples" / "train_nmnist.py"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_example_refuses_a_bad_root_in_one_line_with_exit_status_2(tmp_path):
    (tmp_path / "nmnist" / "stuff").mkdir(parents=True)
    res = _example("--data-root", str(tmp_path / "nmnist"), "--out", str(tmp_path / "o"), "--epochs", "1")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train_nmnist.py: error: N-MNIST root")
    assert "Looked for" in lines[0] and "Found: stuff/" in lines[0]


@needs_real
@pytest.mark.slow
def test_example_trains_an_epoch_on_a_real_root_and_exports_exactly(tmp_path):
    root = _lay_out(tmp_path / "nmnist", 4, 2)
    res = _example("--data-root", str(root), "--samples-per-class", "2", "-T", "4", "--batch-size", "8",
                   "--channels", "4", "--epochs", "1", "--finetune-epochs", "1", "--out", str(tmp_path / "o"),
                   "--device", "cpu")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"data: nmnist at {root}" in res.stdout
    assert "integer model agreement: 100.00%" in res.stdout
