"""DVS128 Gesture, CIFAR10-DVS and SHD: fixtures in the original file formats, read end to end by
SpikingJelly's own classes; checked roots; the training example on each fixture."""
import pathlib
import shutil

import numpy as np
import pytest

import snnquant.datasets as D
from snnquant.datasets import fixtures as FX
from snnquant.datasets.neuromorphic import read_aedat31_polarity


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("neuromorphic")
    written = {
        "dvs128_gesture": FX.write_dvs128_gesture_fixture(base / "dvs128_gesture"),
        "cifar10_dvs": FX.write_cifar10_dvs_fixture(base / "cifar10_dvs"),
        "shd": FX.write_shd_fixture(base / "shd"),
    }
    return base, written


def _fresh_copy(roots, name, tmp_path):
    target = tmp_path / name
    n = 0
    while target.exists():
        n += 1
        target = tmp_path / f"{name}_{n}"
    shutil.copytree(roots[0] / name / "extract", target / "extract")
    return target


def test_aedat31_reader_matches_spikingjelly_and_what_was_written(tmp_path):
    from spikingjelly.datasets.utils import load_aedat_v3

    rng = np.random.default_rng(0)
    t = np.sort(rng.integers(2**31 - 500, 2**31 + 500, size=700))  # crosses a timestamp overflow
    events = {"t": t, "x": rng.integers(0, 128, 700), "y": rng.integers(0, 128, 700), "p": rng.integers(0, 2, 700)}
    FX.write_aedat31(tmp_path / "a.aedat", events, packet_events=100)
    ours = read_aedat31_polarity(tmp_path / "a.aedat")
    theirs = load_aedat_v3(tmp_path / "a.aedat")
    for key in "txyp":
        np.testing.assert_array_equal(ours[key], events[key])
        np.testing.assert_array_equal(theirs[key].astype(np.int64), events[key])


def test_spikingjelly_reads_the_dvs128_gesture_fixture_end_to_end(roots, tmp_path):
    from spikingjelly.datasets.dvs128_gesture import DVS128Gesture

    root = _fresh_copy(roots, "dvs128_gesture", tmp_path)
    written = roots[1]["dvs128_gesture"]
    D.prepare_neuromorphic_root("dvs128_gesture", root)
    seen = 0
    for split in ("train", "test"):
        ds = DVS128Gesture(str(root), train=split == "train", data_type="event")
        for index, (path, _) in enumerate(ds.samples):
            events, _label = ds[index]
            expected = written[(split, int(pathlib.Path(path).parent.name), pathlib.Path(path).stem)]
            for key in "txyp":
                np.testing.assert_array_equal(events[key].astype(np.int64), expected[key])
            seen += 1
    assert seen == len(written) == 33


def test_spikingjelly_reads_the_cifar10_dvs_fixture_end_to_end(roots, tmp_path):
    from spikingjelly.datasets.cifar10_dvs import CIFAR10DVS

    root = _fresh_copy(roots, "cifar10_dvs", tmp_path)
    written = roots[1]["cifar10_dvs"]
    D.prepare_neuromorphic_root("cifar10_dvs", root)
    ds = CIFAR10DVS(str(root), data_type="event")
    assert len(ds) == len(written) == 30
    for index, (path, label) in enumerate(ds.samples):
        events, _ = ds[index]
        expected = written[(ds.classes[label], pathlib.Path(path).stem)]
        for key in "txyp":
            np.testing.assert_array_equal(np.asarray(events[key]).astype(np.int64), expected[key])


def test_spikingjelly_reads_the_shd_fixture_end_to_end(roots, tmp_path):
    from spikingjelly.datasets.shd import SpikingHeidelbergDigits

    root = _fresh_copy(roots, "shd", tmp_path)
    D.prepare_neuromorphic_root("shd", root)
    for split in ("train", "test"):
        ds = SpikingHeidelbergDigits(str(root), train=split == "train", data_type="event")
        written = roots[1]["shd"][split]
        assert len(ds) == len(written)
        for index, (label, expected) in enumerate(written):
            events, got_label = ds[index]
            assert int(got_label) == label
            np.testing.assert_array_equal(events["t"], expected["t"])
            np.testing.assert_array_equal(events["x"], expected["x"])


@pytest.mark.parametrize("name,frame_shape,sizes", [
    ("dvs128_gesture", (2, 128, 128), (22, 11)),
    ("cifar10_dvs", (2, 128, 128), (20, 10)),
    ("shd", (700,), (40, 20)),
])
def test_load_dataset_gives_frames_of_every_class(roots, tmp_path, name, frame_shape, sizes):
    root = _fresh_copy(roots, name, tmp_path)
    train, test, info = D.load_dataset(name, root, 3)
    assert (len(train), len(test)) == sizes
    frames, _ = train[0]
    assert frames.shape == (3, *frame_shape) and info.frame_shape == frame_shape
    labels = {int(test[i][1]) for i in range(len(test))}
    assert labels == set(range(info.num_classes))
    assert np.asarray(frames).sum() > 0


def test_cifar10_dvs_test_split_is_the_lowest_recording_indices(roots, tmp_path):
    root = _fresh_copy(roots, "cifar10_dvs", tmp_path)
    _, test, _ = D.load_dataset("cifar10_dvs", root, 2)
    names = sorted(pathlib.Path(test.dataset.samples[i][0]).stem for i in test.indices)
    assert names == sorted(f"cifar10_{c}_0" for c in D.neuromorphic.CIFAR10_DVS_CLASSES)


def test_bad_roots_get_clear_errors(roots, tmp_path):
    # nothing recognisable: one line, what was looked for, what was found
    (tmp_path / "empty" / "stuff").mkdir(parents=True)
    with pytest.raises(D.DatasetRootError) as info:
        D.check_neuromorphic_root("dvs128_gesture", tmp_path / "empty")
    assert "\n" not in str(info.value) and "Looked for" in str(info.value) and "Found: stuff/" in str(info.value)
    # a missing class folder (SpikingJelly would shift every later label)
    root = _fresh_copy(roots, "cifar10_dvs", tmp_path)
    shutil.rmtree(root / "extract" / "cat")
    with pytest.raises(D.DatasetRootError, match=r"lacks the class folder\(s\) cat"):
        D.load_dataset("cifar10_dvs", root, 2)
    # a truncated recording, named
    root = _fresh_copy(roots, "dvs128_gesture", tmp_path)
    aedat = root / "extract" / "DvsGesture" / "user02_fluorescent.aedat"
    aedat.write_bytes(aedat.read_bytes()[:-3])
    with pytest.raises(D.CorruptDatasetFileError, match="user02_fluorescent.aedat.*truncated"):
        D.load_dataset("dvs128_gesture", root, 2)
    # a trial list without some class
    root = _fresh_copy(roots, "dvs128_gesture", tmp_path)
    (root / "extract" / "DvsGesture" / "user03_fluorescent_labels.csv").write_text("class,startTime_usec,endTime_usec\n1,0,10\n")
    with pytest.raises(D.DatasetRootError, match=r"trials_to_test.txt have no sample of class\(es\) 1, 2,"):
        D.load_dataset("dvs128_gesture", root, 2)
    # an SHD file that is not HDF5
    root = _fresh_copy(roots, "shd", tmp_path)
    (root / "extract" / "shd_test.h5").write_bytes(b"not hdf5")
    with pytest.raises(D.CorruptDatasetFileError, match="shd_test.h5"):
        D.load_dataset("shd", root, 2)
    # a download that is not the published archive: refused by name, not deleted
    root = tmp_path / "downloaded"
    (root / "download").mkdir(parents=True)
    for name in ("shd_train.h5.zip", "shd_test.h5.zip"):
        (root / "download" / name).write_bytes(b"zip?")
    with pytest.raises(D.DatasetRootError, match="shd_train.h5.zip has md5"):
        D.load_dataset("shd", root, 2)
    assert (root / "download" / "shd_train.h5.zip").exists()
    # a preparation marker (SpikingJelly's, left while it builds or after an interruption)
    root = _fresh_copy(roots, "dvs128_gesture", tmp_path)
    (root / "events_np.building").touch()
    with pytest.raises(D.DatasetRootError, match=r"events_np.building \(last modified \d+ s ago\): "
                       r"a SpikingJelly preparation .* under way in another process"):
        D.check_neuromorphic_root("dvs128_gesture", root)
    assert (root / "events_np.building").exists()
    # more samples per class than a split has
    root = _fresh_copy(roots, "shd", tmp_path)
    with pytest.raises(D.DatasetRootError, match="samples_per_class=2 .*test split"):
        D.load_dataset("shd", root, 2, samples_per_class=2)


def test_a_corrupt_frames_file_is_named_from_inside_the_dataloader(roots, tmp_path):
    from torch.utils.data import DataLoader

    root = _fresh_copy(roots, "shd", tmp_path)
    train, _, _ = D.load_dataset("shd", root, 2)
    bad = pathlib.Path(train.samples[3][0])
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(D.CorruptDatasetFileError, match=str(bad)):
        for _ in DataLoader(train, batch_size=4):
            pass


def _example():
    import snnquant.cli.train  # the example's code (examples/train_nmnist.py is its thin entry)
    return snnquant.cli.train


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dvs128_gesture", "cifar10_dvs", "shd"])
def test_example_trains_an_epoch_on_each_fixture_quantized_and_exports_exactly(roots, tmp_path, name):
    root = _fresh_copy(roots, name, tmp_path)
    result = _example().main(["--dataset", name, "--data-root", str(root), "-T", "4", "--channels", "4",
                              "--batch-size", "8", "--epochs", "1", "--finetune-epochs", "1",
                              "--weight-bits", "4", "--v-bits", "8", "--out", str(tmp_path / "out"),
                              "--device", "cpu"])
    assert result["integer"]["agreement"] == 1.0
    assert result["integer"]["samples"] == {"dvs128_gesture": 11, "cifar10_dvs": 10, "shd": 20}[name]
    assert (tmp_path / "out" / "model_int.safetensors").stat().st_size > 0


def test_default_networks_quantize_and_export_to_integers():
    import torch
    from spikingjelly.activation_based import functional

    import snnquant
    from snnquant.export import fold_batchnorm, integer_agreement, to_integer

    for name in ("dvs128_gesture", "shd"):
        info = D.dataset_info(name)
        net, _ = snnquant.quantize_model(D.default_network(name, channels=2),
                                         snnquant.QuantConfig(weight_bits=4, v_bits=8))
        x = torch.randint(0, 3, (3, 2, *info.frame_shape)).float()
        assert net(x).shape == (3, 2, info.num_classes)
        functional.reset_net(net)
        folded = fold_batchnorm(net.eval())
        assert integer_agreement(folded, x, to_integer(folded)) == 1.0


def test_example_needs_a_root_for_the_other_datasets(capsys):
    with pytest.raises(SystemExit) as info:
        _example().parse_args(["--dataset", "shd"])
    assert info.value.code == 2
    assert "--dataset shd needs --data-root" in capsys.readouterr().err


def test_a_root_is_prepared_and_loaded_under_the_build_lock(roots, tmp_path, monkeypatch):
    # another process that loads the same root meanwhile waits instead of meeting SpikingJelly's
    # .building markers; here a thread asks for the lock while the root is being prepared
    import threading
    from snnquant.datasets import neuromorphic
    monkeypatch.setenv("SNNQUANT_DATA", str(tmp_path / "cache"))
    root = _fresh_copy(roots, "shd", tmp_path)
    prepare = neuromorphic.prepare_neuromorphic_root
    seen = {}

    def prepare_while_another_asks(name, path):
        def other():
            with D.build_lock(path):
                seen["other got it after preparing"] = seen.get("prepared", False)
        waiting = threading.Thread(target=other)
        waiting.start()
        waiting.join(0.5)
        seen["other waited"] = waiting.is_alive()
        result = prepare(name, path)
        seen["prepared"] = True
        seen["thread"] = waiting
        return result

    monkeypatch.setattr(neuromorphic, "prepare_neuromorphic_root", prepare_while_another_asks)
    dataset = D.load_neuromorphic_frames("shd", root, True, 3)
    seen["thread"].join(30)
    assert seen["other waited"] and seen["other got it after preparing"]
    assert len(dataset) == 40
