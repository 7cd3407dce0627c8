"""Tests of snnquant.datasets: N-MNIST .bin files, the saccade/DVS emulation, the built-in digits
dataset and the checked loader. Small subsets only (2 or 3 samples per class)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snnquant import datasets as D
from snnquant.datasets import digits as digits_module

SENSOR = 34
SACCADE_US = 100_000


def _events(n, rng, t_max=D.MAX_TIMESTAMP_US):
    return {
        "x": rng.integers(0, 256, n),
        "y": rng.integers(0, 256, n),
        "p": rng.integers(0, 2, n),
        "t": np.sort(rng.integers(0, t_max + 1, n)),
    }


def _bins(root, folder):
    return sorted((Path(root) / "extract" / folder).glob("*/*.bin"))


# ---------------------------------------------------------------- the .bin format


def test_bytes_follow_the_nmnist_layout(tmp_path):
    # x=1, y=2, ON, t=0x123456 -> 01 02 (0x80 | 0x12) 34 56; x=255, y=0, OFF, t=2**23-1 -> ff 00 7f ff ff
    path = tmp_path / "a.bin"
    D.write_nmnist_bin(path, {"x": [1, 255], "y": [2, 0], "p": [1, 0], "t": [0x123456, 2**23 - 1]})
    assert path.read_bytes() == bytes([1, 2, 0x92, 0x34, 0x56, 255, 0, 0x7F, 0xFF, 0xFF])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_write_read_round_trip_exact(tmp_path_factory, n, seed):
    events = _events(n, np.random.default_rng(seed))
    path = tmp_path_factory.mktemp("rt") / "e.bin"
    D.write_nmnist_bin(path, events)
    assert path.stat().st_size == 5 * n
    back = D.read_nmnist_bin(path)
    for key in "xypt":
        np.testing.assert_array_equal(back[key], events[key])
        assert back[key].dtype == np.int64


def test_structured_array_and_bool_polarity_accepted(tmp_path):
    arr = np.zeros(3, dtype=[("x", "u1"), ("y", "u1"), ("p", "?"), ("t", "<u4")])
    arr["x"], arr["y"], arr["p"], arr["t"] = [3, 4, 5], [6, 7, 8], [True, False, True], [10, 10, 11]
    D.write_nmnist_bin(tmp_path / "s.bin", arr)
    back = D.read_nmnist_bin(tmp_path / "s.bin")
    np.testing.assert_array_equal(back["p"], [1, 0, 1])
    np.testing.assert_array_equal(back["t"], [10, 10, 11])


@pytest.mark.parametrize(
    "field,value",
    [("x", 256), ("x", -1), ("y", 300), ("y", -2), ("p", 2), ("p", -1), ("t", 2**23), ("t", -5)],
)
def test_write_rejects_unrepresentable_values(tmp_path, field, value):
    events = {"x": [0, 0], "y": [0, 0], "p": [0, 1], "t": [0, 1]}
    events[field] = [events[field][0], value] if field != "t" or value > 0 else [value, 1]
    with pytest.raises(ValueError, match=rf"{field}.*{value}"):
        D.write_nmnist_bin(tmp_path / "bad.bin", events)
    assert not (tmp_path / "bad.bin").exists()


def test_write_rejects_bad_types_and_order(tmp_path):
    ok = {"x": [0, 1], "y": [0, 1], "p": [0, 1], "t": [0, 1]}
    with pytest.raises(TypeError, match="'t'.*integer"):
        D.write_nmnist_bin(tmp_path / "f.bin", {**ok, "t": [0.0, 1.5]})
    with pytest.raises(TypeError, match="'p'.*missing"):
        D.write_nmnist_bin(tmp_path / "f.bin", {k: v for k, v in ok.items() if k != "p"})
    with pytest.raises(ValueError, match="length"):
        D.write_nmnist_bin(tmp_path / "f.bin", {**ok, "x": [0]})
    with pytest.raises(ValueError, match=r"events\['t'\]\[1\] = 3 is smaller"):
        D.write_nmnist_bin(tmp_path / "f.bin", {**ok, "t": [7, 3]})


def test_read_empty_file_gives_no_events(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    events = D.read_nmnist_bin(tmp_path / "e.bin")
    assert all(events[k].size == 0 for k in "xypt")


def test_truncated_file_error_names_file_and_offset(tmp_path):
    path = tmp_path / "trunc.bin"
    D.write_nmnist_bin(path, _events(7, np.random.default_rng(0)))
    path.write_bytes(path.read_bytes()[:-2])  # 33 bytes: 6 events and 3 bytes of the 7th
    with pytest.raises(D.CorruptEventFileError, match=r"trunc\.bin.*byte offset 30.*truncated") as info:
        D.read_nmnist_bin(path)
    assert info.value.offset == 30 and info.value.path == path
    assert isinstance(info.value, ValueError)


def test_timestamps_going_backwards_are_corrupt(tmp_path):
    path = tmp_path / "shifted.bin"
    n = np.arange(10)
    events = {"x": n + 3, "y": n + 5, "p": n % 2, "t": n * 30_000 + 777}  # 0.3 s, like a recording
    D.write_nmnist_bin(path, events)
    data = bytearray(path.read_bytes())
    del data[17]  # a byte lost in event 3: every later event is misaligned
    path.write_bytes(bytes(data) + b"\x00")
    with pytest.raises(D.CorruptEventFileError, match=r"shifted\.bin.*byte offset (\d+).*backwards") as info:
        D.read_nmnist_bin(path)
    assert info.value.offset % 5 == 0 and 15 <= info.value.offset <= 25
    assert D.read_nmnist_bin(path, check_time_order=False)["t"].size == 10


def test_sensor_size_check(tmp_path):
    path = tmp_path / "wide.bin"
    D.write_nmnist_bin(path, {"x": [3, 40], "y": [1, 1], "p": [0, 0], "t": [0, 1]})
    with pytest.raises(D.CorruptEventFileError, match=r"byte offset 5.*x=40"):
        D.read_nmnist_bin(path, sensor_size=(34, 34))
    assert D.read_nmnist_bin(path)["x"][1] == 40


# ---------------------------------------------------------------- the emulation


def test_saccade_offsets_close_the_triangle():
    t = np.arange(0, 3 * SACCADE_US + 1, SACCADE_US // 2)
    o = D.saccade_offsets(t)
    np.testing.assert_allclose(o[[0, 2, 4, 6]], [[3, 0], [6, 6], [0, 6], [3, 0]], atol=1e-12)
    assert o.min() >= 0 and o.max() <= 6


def test_black_image_gives_no_events_and_noise_is_poisson_like():
    black = np.zeros((2, 8, 8))
    assert all(e["t"].size == 0 for e in D.saccade_events(black, noise_rate_hz=0.0))
    noisy = D.saccade_events(black, noise_rate_hz=10.0)
    expected = 10.0 * 0.3 * SENSOR * SENSOR  # 3468 per recording
    for e in noisy:
        assert abs(e["t"].size - expected) < 6 * np.sqrt(expected)
        assert np.all(np.diff(e["t"]) >= 0)


def test_net_events_per_pixel_follow_the_closed_path():
    # The image comes back where it started, so with R = 0 and equal thresholds each pixel's
    # reference moves by exactly +-theta per event and ends within theta of where it began:
    # |#ON - #OFF| <= 1 at every pixel.
    from sklearn.datasets import load_digits

    images = load_digits().images[:6] / 16.0
    events = D.saccade_events(images, image_size=20.0, refractory_us=0, threshold_mismatch=0.0, noise_rate_hz=0.0)
    for e in events:
        net = np.zeros((SENSOR, SENSOR), np.int64)
        np.add.at(net, (e["y"], e["x"]), 2 * e["p"] - 1)
        assert np.abs(net).max() <= 1
        assert e["t"].size > 500


def test_refractory_period_separates_events_of_a_pixel():
    from sklearn.datasets import load_digits

    images = load_digits().images[:4] / 16.0
    for e in D.saccade_events(images, image_size=20.0, refractory_us=5000, noise_rate_hz=0.0):
        pixel = e["y"] * SENSOR + e["x"]
        order = np.lexsort((e["t"], pixel))
        same = pixel[order][1:] == pixel[order][:-1]
        gaps = np.diff(e["t"][order])[same]
        assert gaps.size > 0 and gaps.min() >= 5000


def test_polarity_follows_the_motion():
    # Saccade 1 moves the bright digit right and down: ON events on its leading (right, lower)
    # edges. Saccade 2 moves it left: ON events on the left.
    from sklearn.datasets import load_digits

    images = load_digits().images[:10] / 16.0
    for e in D.saccade_events(images, image_size=20.0, noise_rate_hz=0.0):
        first = e["t"] < SACCADE_US
        second = (e["t"] >= SACCADE_US) & (e["t"] < 2 * SACCADE_US)
        on, off = e["p"] == 1, e["p"] == 0
        assert e["x"][first & on].mean() > e["x"][first & off].mean()
        assert e["y"][first & on].mean() > e["y"][first & off].mean()
        assert e["x"][second & on].mean() < e["x"][second & off].mean()


def test_events_of_an_image_do_not_depend_on_its_batch():
    from sklearn.datasets import load_digits

    images = load_digits().images[:5] / 16.0
    together = D.saccade_events(images, seed=3, image_ids=[10, 11, 12, 13, 14])
    alone = D.saccade_events(images[3:4], seed=3, image_ids=[13])
    for key in "xypt":
        np.testing.assert_array_equal(together[3][key], alone[0][key])


@pytest.mark.parametrize("batch,position", [(2, 1), (7, 6), (19, 11)])
def test_events_of_an_image_are_the_same_in_every_batch_size_and_position(batch, position):
    # Regression: a batched BLAS product gave an image last-bit differences that depended on the
    # batch, moving events that sit on a threshold by 1 us.
    from sklearn.datasets import load_digits

    digits = load_digits().images / 16.0
    target = digits[100]
    others = digits[:batch]
    images = np.concatenate([others[:position], target[None], others[position + 1 :]])
    ids = list(range(500, 500 + batch))
    ids[position] = 42
    together = D.saccade_events(images, seed=1, image_ids=ids)[position]
    alone = D.saccade_events(target[None], seed=1, image_ids=[42])[0]
    for key in "xypt":
        np.testing.assert_array_equal(together[key], alone[key])


_EVENTS_DIGEST = """
import hashlib, sys
from sklearn.datasets import load_digits
from snnquant.datasets import DIGITS_NMNIST_EMULATION, saccade_events
events = saccade_events(load_digits().images[:40] / 16.0, seed=0, **DIGITS_NMNIST_EMULATION)
digest = hashlib.sha256()
for e in events:
    for key in "xypt":
        digest.update(e[key].tobytes())
print(digest.hexdigest())
"""


def test_events_are_the_same_whatever_the_cpu_code_paths():
    # Regression: the blur ran through OpenBLAS and the log through numpy's vectorised code, both
    # chosen by the processor; OpenBLAS's SkylakeX and Prescott kernels (or numpy without its
    # AVX2/AVX-512 loops) gave other events for the same seed, so the "same" built-in data
    # differed from machine to machine
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1])] + sys.path))
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("NPY_DISABLE_CPU_FEATURES", None)
    vector = " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))
    digests = set()
    for extra in ({}, {"OPENBLAS_CORETYPE": "Prescott"}, {"NPY_DISABLE_CPU_FEATURES": vector}):
        out = subprocess.run([sys.executable, "-c", _EVENTS_DIGEST], capture_output=True, text=True,
                             env=dict(env, **extra), timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


def test_portable_log_and_exp_match_the_c_library():
    from snnquant.datasets import saccades

    x = np.exp(np.linspace(-40.0, 40.0, 20001))
    np.testing.assert_allclose(saccades._portable_log(x), np.log(x), rtol=0, atol=1e-14)
    np.testing.assert_allclose(saccades._portable_log(np.float32([0.1, 0.5, 1.0])),
                               np.log([np.float32(0.1), 0.5, 1.0]), rtol=0, atol=1e-15)
    assert saccades._portable_log(np.array([1.0]))[0] == 0.0
    z = np.linspace(-30.0, 30.0, 20001)
    np.testing.assert_allclose(saccades._portable_exp(z), np.exp(z), rtol=1e-14, atol=0)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"images": np.zeros((2, 3, 4, 5))}, ValueError, "shape"),
        ({"images": np.zeros((2, 8, 8), np.uint8)}, TypeError, "float"),
        ({"images": np.full((1, 8, 8), 1.5)}, ValueError, r"\[0, 1\]"),
        ({"contrast_threshold": 0.0}, ValueError, "contrast_threshold"),
        ({"background": 1.0}, ValueError, "background"),
        ({"time_step_us": 300}, ValueError, "multiple of time_step_us"),
        ({"sensor_size": (300, 34)}, ValueError, "sensor_size"),
        ({"seed": -1}, ValueError, "seed"),
        ({"image_ids": [1, 2]}, ValueError, "image_ids"),
    ],
)
def test_saccade_events_rejects_bad_arguments(kwargs, error, match):
    kwargs = {"images": np.zeros((1, 8, 8)), **kwargs}
    with pytest.raises(error, match=match):
        D.saccade_events(**kwargs)


# ---------------------------------------------------------------- the built-in dataset


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("snnquant_data")


@pytest.fixture(scope="module")
def small_root(cache_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SNNQUANT_DATA", str(cache_dir))
        return D.make_digits_nmnist(seed=0, samples_per_class=2)


def test_cache_path_holds_version_seed_and_subset(small_root, cache_dir, monkeypatch):
    assert small_root == cache_dir / "digits_nmnist" / f"v{D.DIGITS_NMNIST_VERSION}_seed0_spc2"
    marker = json.loads((small_root / "snnquant_dataset.json").read_text())
    assert marker["seed"] == 0 and marker["samples_per_class"] == 2
    assert marker["generator_version"] == D.DIGITS_NMNIST_VERSION
    monkeypatch.setenv("SNNQUANT_DATA", str(cache_dir))
    before = {p: p.stat().st_mtime_ns for p in _bins(small_root, "Train")}
    assert D.make_digits_nmnist(seed=0, samples_per_class=2) == small_root  # reused, not rebuilt
    assert {p: p.stat().st_mtime_ns for p in _bins(small_root, "Train")} == before
    # Another generator version must not reuse this cache.
    monkeypatch.setattr(digits_module, "DIGITS_NMNIST_VERSION", "0-test")
    with pytest.raises(ValueError, match="generator_version"):
        D.make_digits_nmnist(small_root, seed=0, samples_per_class=2)


def test_layout_counts_and_events(small_root):
    for folder, split in (("Train", "train"), ("Test", "test")):
        for c in range(10):
            bins = sorted((small_root / "extract" / folder / str(c)).glob("*.bin"))
            npzs = sorted((small_root / "events_np" / split / str(c)).glob("*.npz"))
            assert len(bins) == 2 and [b.stem for b in bins] == [n.stem for n in npzs]
    all_bins = _bins(small_root, "Train") + _bins(small_root, "Test")
    thirds = np.zeros(3)
    for path in all_bins:
        e = D.read_nmnist_bin(path, sensor_size=(SENSOR, SENSOR))
        assert e["x"].max() < SENSOR and e["y"].max() < SENSOR
        assert np.all(np.diff(e["t"]) >= 0) and e["t"].max() <= 3 * SACCADE_US
        assert set(np.unique(e["p"])) == {0, 1}
        per_saccade = np.histogram(e["t"], bins=[0, SACCADE_US, 2 * SACCADE_US, 3 * SACCADE_US + 1])[0]
        assert per_saccade.min() > 0.15 * e["t"].size  # three saccades, each with its share
        # Each saccade is a burst: fast mid-saccade, at rest at the corners.
        for k in (1, 2):
            corner = np.sum(np.abs(e["t"] - k * SACCADE_US) < 5000)
            middle = np.sum(np.abs(e["t"] - (k - 0.5) * SACCADE_US) < 5000)
            thirds[k] += middle / max(corner, 1)
    assert np.all(thirds[1:] / len(all_bins) > 3)


def test_split_is_stratified_disjoint_and_labelled(small_root):
    from sklearn.datasets import load_digits

    labels = load_digits().target
    full = D.digits_nmnist_split(seed=0)
    assert full["train"].size == 1438 and full["test"].size == 359
    assert np.intersect1d(full["train"], full["test"]).size == 0
    assert np.union1d(full["train"], full["test"]).size == 1797
    test_counts = np.bincount(labels[full["test"]], minlength=10)
    assert test_counts.min() >= 34 and test_counts.max() <= 37
    for folder, split in (("Train", "train"), ("Test", "test")):
        indices = [int(p.stem) for p in _bins(small_root, folder)]
        assert set(indices) <= set(full[split].tolist())
        for p in _bins(small_root, folder):
            assert labels[int(p.stem)] == int(p.parent.name)


def test_spikingjelly_reader_and_conversion_agree(small_root):
    from spikingjelly.datasets.utils import load_ATIS_bin

    for path in _bins(small_root, "Train") + _bins(small_root, "Test"):
        ours = D.read_nmnist_bin(path)
        theirs = load_ATIS_bin(path)
        split = "train" if path.parent.parent.name == "Train" else "test"
        with np.load(small_root / "events_np" / split / path.parent.name / (path.stem + ".npz")) as npz:
            for key in "xypt":
                np.testing.assert_array_equal(ours[key], theirs[key])
                np.testing.assert_array_equal(ours[key], npz[key])


def test_spikingjelly_nmnist_loads_the_root(small_root):
    from spikingjelly.datasets.n_mnist import NMNIST

    frames_number = 4
    for train, folder in ((True, "Train"), (False, "Test")):
        ds = NMNIST(str(small_root), train=train, data_type="frame", frames_number=frames_number, split_by="number")
        assert len(ds) == 20 and ds.classes == [str(c) for c in range(10)]
        assert sorted(set(ds.targets)) == list(range(10))
        for (frames, label), (path, target) in zip(ds, ds.samples):
            assert label == target == int(Path(path).parent.name)
            n_events = D.read_nmnist_bin(small_root / "extract" / folder / str(label) / (Path(path).stem + ".bin"))["t"].size
            assert frames.shape == (frames_number, 2, SENSOR, SENSOR) and frames.sum() == n_events
    assert not (small_root / "download").exists()


def test_load_nmnist_frames(small_root):
    train = D.load_nmnist_frames(small_root, train=True, frames_number=5)
    test = D.load_nmnist_frames(small_root, train=False, frames_number=5, split_by="time")
    assert len(train) == len(test) == 20
    assert sorted(set(train.targets)) == sorted(set(test.targets)) == list(range(10))
    frames, label = test[0]
    assert frames.shape == (5, 2, SENSOR, SENSOR) and frames.sum() > 0


def test_same_seed_same_bytes_other_seed_other_bytes(small_root, tmp_path):
    again = D.make_digits_nmnist(tmp_path / "again", seed=0, samples_per_class=2)
    other = D.make_digits_nmnist(tmp_path / "other", seed=1, samples_per_class=2)
    for folder in ("Train", "Test"):
        ours = _bins(small_root, folder)
        assert [p.relative_to(small_root) for p in ours] == [p.relative_to(again) for p in _bins(again, folder)]
        for p in ours:
            assert p.read_bytes() == (again / p.relative_to(small_root)).read_bytes()
    index = int(_bins(small_root, "Train")[0].stem)
    recorded = D.saccade_events(
        (digits_module._load_digits()[0][[index]] / 16.0), seed=1, image_ids=[index], **D.DIGITS_NMNIST_EMULATION
    )[0]
    first = D.read_nmnist_bin(_bins(small_root, "Train")[0])
    assert not all(np.array_equal(first[k], recorded[k]) for k in "xypt")  # seed 1 records differently
    other_bytes = {p.relative_to(other): p.read_bytes() for p in _bins(other, "Train")}
    assert {p.relative_to(small_root): p.read_bytes() for p in _bins(small_root, "Train")} != other_bytes


def test_subset_is_part_of_the_larger_subset(small_root, tmp_path):
    bigger = D.make_digits_nmnist(tmp_path / "spc3", seed=0, samples_per_class=3)
    for folder in ("Train", "Test"):
        for p in _bins(small_root, folder):
            assert (bigger / p.relative_to(small_root)).read_bytes() == p.read_bytes()


def test_explicit_root_refuses_other_contents(small_root, tmp_path):
    with pytest.raises(ValueError, match="seed"):
        D.make_digits_nmnist(small_root, seed=1, samples_per_class=2)
    with pytest.raises(ValueError, match="samples_per_class"):
        D.make_digits_nmnist(small_root, seed=0, samples_per_class=3)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a dataset made by make_digits_nmnist"):
        D.make_digits_nmnist(foreign, samples_per_class=2)
    assert (foreign / "notes.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert D.make_digits_nmnist(empty, samples_per_class=1) == empty
    assert D.check_nmnist_root(empty) == "events_np"
    with pytest.raises(ValueError, match="samples_per_class"):
        D.make_digits_nmnist(tmp_path / "x", samples_per_class=36)
    with pytest.raises(TypeError, match="seed"):
        D.make_digits_nmnist(tmp_path / "x", seed=1.5)


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def crash(root):
        raise KeyboardInterrupt("simulated crash during SpikingJelly's conversion")

    monkeypatch.setattr(digits_module, "convert_extracted", crash)
    with pytest.raises(KeyboardInterrupt):
        D.make_digits_nmnist(tmp_path / "root", samples_per_class=1)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- checking roots


def _copy(root, dest):
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns("frames_number_*"))
    return dest


def test_missing_and_empty_classes_are_named(small_root, tmp_path):
    broken = _copy(small_root, tmp_path / "broken")
    shutil.rmtree(broken / "events_np" / "train" / "3")
    for f in (broken / "events_np" / "test" / "7").iterdir():
        f.unlink()
    (broken / "events_np" / "test" / "extra").mkdir()
    with pytest.raises(D.DatasetRootError) as info:
        D.load_nmnist_frames(broken, train=True, frames_number=4)
    message = str(info.value)
    assert "lacks the class folder(s) 3" in message
    assert "empty class folder(s) 7" in message
    assert "extra" in message
    assert not list(broken.glob("frames_number_*"))  # refused before SpikingJelly wrote anything


def test_empty_root_explains_the_download(tmp_path):
    with pytest.raises(D.DatasetRootError) as info:
        D.load_nmnist_frames(tmp_path, train=True, frames_number=4)
    message = str(info.value)
    for part in (D.NMNIST_URL, "Train.zip", "Test.zip", str(tmp_path / "download")):
        assert part in message
    with pytest.raises(D.DatasetRootError, match="not a directory"):
        D.load_nmnist_frames(tmp_path / "absent", train=True, frames_number=4)


def test_bad_download_is_reported_not_deleted(tmp_path):
    download = tmp_path / "download"
    download.mkdir()
    (download / "Train.zip").write_bytes(b"not the real file")
    with pytest.raises(D.DatasetRootError, match=r"missing .*Test\.zip"):
        D.load_nmnist_frames(tmp_path, train=True, frames_number=4)
    (download / "Test.zip").write_bytes(b"not the real file either")
    with pytest.raises(D.DatasetRootError, match=r"Train\.zip has md5 .* nothing was deleted"):
        D.load_nmnist_frames(tmp_path, train=True, frames_number=4)
    assert (download / "Train.zip").exists() and (download / "Test.zip").exists()
    assert not (tmp_path / "events_np.building").exists()


def test_unfinished_markers_are_reported(small_root, tmp_path):
    root = _copy(small_root, tmp_path / "r")
    (root / "frames_number_4_split_by_number.building").touch()
    with pytest.raises(D.DatasetRootError, match="frames_number_4_split_by_number.building"):
        D.load_nmnist_frames(root, train=True, frames_number=4)
    assert (root / "frames_number_4_split_by_number.building").exists()
    (root / "events_np.building").touch()
    with pytest.raises(D.DatasetRootError, match="events_np.building"):
        D.load_nmnist_frames(root, train=True, frames_number=3)


def test_unfinished_marker_message_covers_a_build_under_way(small_root, tmp_path):
    # the marker is also there while another process builds the same root: the message must not
    # claim that the build failed, and must give the marker's age so the user can tell
    root = _copy(small_root, tmp_path / "r")
    marker = root / "frames_number_4_split_by_number.building"
    marker.touch()
    os.utime(marker, (time.time() - 125, time.time() - 125))
    with pytest.raises(D.DatasetRootError) as info:
        D.load_nmnist_frames(root, train=True, frames_number=4)
    text = str(info.value)
    assert "another process" in text and "last modified 2 min ago" in text
    assert "if no process is" in text and str(root / "frames_number_4_split_by_number") in text


def test_a_load_waits_for_another_process_building_the_root(small_root, tmp_path, monkeypatch, capfd):
    # two runs started at once on a root not yet built: the second used to fail on SpikingJelly's
    # .building marker of the first; now it waits for the first and loads what it built
    root = _copy(small_root, tmp_path / "r")
    monkeypatch.setenv("SNNQUANT_DATA", str(tmp_path / "cache"))
    marker = root / "frames_number_4_split_by_number.building"
    released = tmp_path / "released"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from snnquant.datasets import build_lock\n"
        "root, marker, released = map(Path, sys.argv[1:])\n"
        "with build_lock(root):\n"
        "    marker.touch()\n"
        "    print('building', flush=True)\n"
        "    time.sleep(4)\n"  # longer than the 2 s before the waiting message
        "    marker.unlink()\n"
        "    released.touch()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1])] + sys.path))
    other = subprocess.Popen([sys.executable, "-c", code, str(root), str(marker), str(released)],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert other.stdout.readline().strip() == "building"
        dataset = D.load_nmnist_frames(root, train=True, frames_number=4)
        assert released.exists()  # it loaded only after the other process let go of the root
        assert len(dataset) == 20 and not marker.exists()
        assert "waiting for another process that is preparing" in capfd.readouterr().err
    finally:
        other.wait(timeout=60)
    assert other.returncode == 0


def test_the_built_in_data_are_built_once_when_asked_for_at_once(tmp_path, monkeypatch):
    # two runs started together used to generate the same digits twice, side by side
    import threading
    monkeypatch.setenv("SNNQUANT_DATA", str(tmp_path / "cache"))
    real_build, builds = digits_module._build, []

    def slow_build(*args):
        builds.append(threading.current_thread().name)
        time.sleep(1.0)  # the other caller arrives while this one builds
        real_build(*args)

    monkeypatch.setattr(digits_module, "_build", slow_build)
    roots, errors = [], []

    def make():
        try:
            roots.append(D.make_digits_nmnist(seed=5, samples_per_class=1))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=make, name=f"run{i}") for i in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(120)
    assert not errors and len(builds) == 1 and roots[0] == roots[1]
    assert len(list((roots[0] / "events_np" / "train").rglob("*.npz"))) == 10


def test_root_with_only_extract_is_converted(small_root, tmp_path):
    root = tmp_path / "r"
    shutil.copytree(small_root / "extract", root / "extract")
    assert D.check_nmnist_root(root) == "extract"
    ds = D.load_nmnist_frames(root, train=False, frames_number=2)
    assert len(ds) == 20 and D.check_nmnist_root(root) == "events_np"
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []
    # A truncated .bin in extract/ is named before conversion.
    root2 = tmp_path / "r2"
    shutil.copytree(small_root / "extract", root2 / "extract")
    victim = _bins(root2, "Test")[0]
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(D.CorruptEventFileError, match=victim.name):
        D.load_nmnist_frames(root2, train=False, frames_number=2)
    # A byte lost mid-file, with the size still a multiple of 5, is named with its offset too.
    root3 = tmp_path / "r3"
    shutil.copytree(small_root / "extract", root3 / "extract")
    victim = _bins(root3, "Test")[1]
    data = victim.read_bytes()
    victim.write_bytes(data[:52] + data[53:-4])
    with pytest.raises(D.CorruptEventFileError, match=rf"{victim.name}.*offset"):
        D.load_nmnist_frames(root3, train=False, frames_number=2)
    assert not (root3 / "events_np").exists()


@pytest.mark.parametrize(
    "kwargs,error",
    [({"train": "yes"}, TypeError), ({"frames_number": 0}, ValueError), ({"split_by": "count"}, ValueError)],
)
def test_loader_rejects_bad_arguments(small_root, kwargs, error):
    args = {"train": True, "frames_number": 4, **kwargs}
    with pytest.raises(error):
        D.load_nmnist_frames(small_root, **args)


def test_import_is_light():
    code = (
        "import sys, snnquant.datasets\n"
        "heavy = [m for m in ('torchvision', 'matplotlib', 'spikingjelly.datasets', 'sklearn') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1])] + sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_frames_are_built_without_concurrent_npy_parsing_on_affected_pythons(small_root, tmp_path,
                                                                              monkeypatch):
    # CPython < 3.13 can raise "SystemError: AST constructor recursion depth mismatch" when
    # several threads parse .npy headers at once (seen in this suite); SpikingJelly's frame
    # integration runs in a thread pool, so snnquant runs it with one thread there.
    import spikingjelly.datasets.n_mnist as n_mnist
    from spikingjelly import configure

    from snnquant.datasets.checked import PREPROCESS_THREADS_SAFE

    seen = []
    real = n_mnist.NMNIST

    def recording(*args, **kwargs):
        seen.append(configure.max_threads_number_for_datasets_preprocess)
        return real(*args, **kwargs)

    monkeypatch.setattr(n_mnist, "NMNIST", recording)
    monkeypatch.setattr(configure, "max_threads_number_for_datasets_preprocess", 4)
    root = tmp_path / "root"
    shutil.copytree(small_root, root)
    D.load_nmnist_frames(root, train=True, frames_number=3)
    assert seen == [4 if PREPROCESS_THREADS_SAFE else 1]
    assert configure.max_threads_number_for_datasets_preprocess == 4   # restored


def test_dataset_files_are_written_through_snnquant_io(tmp_path, monkeypatch):
    # synced before the rename, and a full disk keeps the previous file and removes the partial
    import errno

    from snnquant.datasets import fixtures
    path = tmp_path / "s.bin"
    D.write_nmnist_bin(path, {"x": [1], "y": [2], "p": [1], "t": [3]})
    previous = path.read_bytes()
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    fixtures._write(tmp_path / "sub" / "labels.csv", b"0,1\n")
    assert synced and (tmp_path / "sub" / "labels.csv").read_bytes() == b"0,1\n"

    def full_fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_fsync)
    with pytest.raises(OSError, match=r"s\.bin.*no space left"):
        D.write_nmnist_bin(path, {"x": [9, 9], "y": [9, 9], "p": [0, 0], "t": [5, 6]})
    assert path.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin", "sub"]
