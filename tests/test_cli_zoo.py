"""``snnquant train --model``: a network of SpikingJelly's model package on the command line, its
deployability report before training, ``--crop``, and ``snnquant export`` of the run (issue 44)."""
import os
import subprocess
import sys

import pytest
import torch

from _repo import ROOT

TINY_SDT = ["--samples-per-class", "3", "-T", "4", "--batch-size", "8", "--epochs", "1",
            "--model", "SpikeDrivenTransformer", "--model-arg", "embed_dims=32",
            "--model-arg", "num_heads=2", "--model-arg", "depths=1"]


def _parse(argv):
    from snnquant.cli.args import parse_args
    return parse_args(argv, prog="snnquant train")


@pytest.mark.parametrize("argv, words", [
    (["--model", "NoSuchNet"], ["--model must name one network", "SpikeDrivenTransformer"]),
    (["--model-arg", "tau=2.0"], ["--model-arg needs --model"]),
    (["--model", "MSResNet", "--model-arg", "tau"], ["--model-arg must be KEY=VALUE"]),
    (["--model", "MSResNet", "--model-arg", "no_such_argument=1"], ["--model MSResNet"]),
    (["--crop", "40"], ["--crop must be in [1, 34]"]),
    (["--model", "NMNISTNet", "--model-arg", "spiking_neuron=Nope"], ["spiking_neuron"]),
])
def test_bad_model_flags_exit_2_naming_the_flag(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        _parse(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_model_flags_build_the_zoo_network_for_the_dataset():
    from snnquant.cli.network import build_network
    args = _parse(["--model", "spikformer.Spikformer", "--model-arg", "embed_dims=32",
                   "--model-arg", "num_heads=2", "--model-arg", "depths=1",
                   "--model-arg", "patch_size=4", "--crop", "32", "-T", "4"])
    net = build_network(args)
    assert type(net).__name__ == "Spikformer"
    assert net(torch.zeros(4, 1, 2, 32, 32)).shape[-1] == 10   # N-MNIST: 2 channels, 10 classes
    args = _parse(["--model", "MSResNet", "--model-args", "{'layers': (1, 1, 1), 'tau': 2.0}",
                   "--model-arg", "base_channels=8"])
    net = build_network(args)
    assert len(net.layer1) == 1 and net.layer1[0].spike1.tau == 2.0
    args = _parse(["--model", "NMNISTNet", "--model-arg", "channels=4"])
    kinds = {type(m).__name__ for m in build_network(args).modules()}
    assert "ParametricLIFNode" in kinds   # the parametric-LIF nets' own neuron by default


def test_cropped_dataset_crops_every_frame_at_the_centre():
    from snnquant.cli.zoo import CroppedDataset
    frames = torch.arange(4 * 2 * 34 * 34).reshape(4, 2, 34, 34)
    item, label = CroppedDataset([(frames, 3)], 32)[0]
    assert item.shape == (4, 2, 32, 32) and label == 3
    assert torch.equal(item, frames[..., 1:33, 1:33])


def _snnquant(env, *args):
    return subprocess.run([sys.executable, "-m", "snnquant", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.heavy
def test_a_zoo_transformer_end_to_end_on_the_command_line(tmp_path):
    env = dict(os.environ, SNNQUANT_DATA=str(tmp_path / "data"), OMP_NUM_THREADS="1")
    if (ROOT / "snnquant").is_dir():
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # 34x34 frames: the report before training names the mean over 9 values and the crop
    res = _snnquant(env, "train", *TINY_SDT, "--epochs", "1", "--stop-after", "0",
                    "--out", tmp_path / "uncropped")
    before = res.stdout.split("epoch 1/")[0] if "epoch 1/" in res.stdout else res.stdout
    assert "deployability (c" in before and "averages 9 values" in before, res.stdout[-3000:]
    assert "--crop 32" in before
    # cropped to 32x32: nothing blocks; trained, folded, integer, C; export writes int and C
    # and refuses NIR by name
    out = tmp_path / "run"
    res = _snnquant(env, "train", *TINY_SDT, "--crop", "32", "--out", out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "nothing blocks the export after training" in res.stdout
    assert "integer model agreement: 100.00%" in res.stdout
    # every target is checked before any is written: NIR's refusal leaves nothing behind
    res = _snnquant(env, "export", out, "--to", "int", "--to", "c", "--to", "nir",
                    "--out", tmp_path / "exp")
    assert res.returncode == 2 and "NIR has no node for it" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "exp").exists() or not any((tmp_path / "exp").iterdir())
    res = _snnquant(env, "export", out, "--to", "int", "--to", "c", "--out", tmp_path / "exp")
    assert res.returncode == 0, res.stderr[-2000:]
    assert {p.name for p in (tmp_path / "exp").iterdir()} == {"snn.safetensors", "snn.h",
                                                              "snn.c"}
    from snnquant.export import IntegerSNN, load_integer
    desc = load_integer(tmp_path / "exp" / "snn.safetensors")
    x = (torch.rand(4, 2, 2, 32, 32) < 0.2).to(torch.int64)
    original = load_integer(out / "model_int.safetensors")
    assert torch.equal(IntegerSNN(desc)(x), IntegerSNN(original)(x))


def test_unused_model_flags_leave_the_resume_configuration_as_before():
    from snnquant.cli.resume import run_configuration
    plain = run_configuration(_parse([]), 1)
    assert not {"model", "model_arg", "crop"} & set(plain)
    zoo = run_configuration(_parse(["--model", "MSResNet", "--model-arg", "tau=2.0",
                                    "--crop", "32"]), 1)
    assert zoo["model"] == "MSResNet" and zoo["model_arg"] == ["tau=2.0"] and zoo["crop"] == 32
