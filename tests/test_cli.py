"""The ``snnquant`` command line (``python -m snnquant``) and the run folder of ``snnquant train``.

Runs the installed (or, in a clone, the source) package through ``python -m snnquant``; nothing
here reads the repository's other folders except the example tests, which skip without them.
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from _repo import ROOT, needs

TINY = ["--samples-per-class", "3", "-T", "4", "--batch-size", "8", "--channels", "4"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = dict(os.environ, SNNQUANT_DATA=str(tmp_path_factory.mktemp("data")), OMP_NUM_THREADS="1")
    if (ROOT / "snnquant").is_dir():  # a clone: the source under test, not another install
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def snnquant(env, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "snnquant", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(res, status=2):
    lines = res.stderr.strip().splitlines()
    assert res.returncode == status, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    return lines[-1]


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run_folder(env, tmp_path_factory):
    """One finished tiny run, through the command line."""
    out = tmp_path_factory.mktemp("runs") / "w4v8"
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--finetune-epochs", "1", "--out", out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "integer model agreement: 100.00%" in res.stdout
    return out


def test_help_lists_the_commands(env):
    res = snnquant(env, "--help")
    assert res.returncode == 0
    for command in ("train", "summary", "export"):
        assert command in res.stdout
    bad = snnquant(env, "fly")
    assert bad.returncode == 2 and "invalid choice: 'fly'" in bad.stderr
    assert snnquant(env).returncode == 2


def test_console_script_is_declared():
    import importlib.metadata
    import snnquant.cli

    try:
        scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")
                   if e.value.startswith("snnquant")}
    except Exception:  # pragma: no cover - metadata of an unusual install
        scripts = {}
    if (ROOT / "pyproject.toml").is_file():
        import tomllib
        scripts.update(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    assert scripts.get("snnquant") == "snnquant.cli:main"
    assert callable(snnquant.cli.main)


def test_train_help_states_the_run_folder_rule(env):
    res = snnquant(env, "train", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for words in ("belongs to one run", "empty (or absent) folder", "--resume", "run.json",
                  "SHA-256", "lock"):
        assert words in text, words


def test_run_json_lists_every_file_with_its_sha256(run_folder):
    manifest = json.loads((run_folder / "run.json").read_text())
    files = {p.relative_to(run_folder).as_posix() for p in run_folder.rglob("*")
             if p.is_file() and p.name != "run.json"}
    assert set(manifest["files"]) == files
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(run_folder / name), name
    assert manifest["command"].startswith("snnquant train ") and "--channels 4" in manifest["command"]
    assert manifest["configuration"]["weight_bits"] == 4
    assert manifest["configuration"]["channels"] == 4
    assert 0 <= manifest["result"]["test_acc"] <= 1


def test_a_second_run_on_a_used_folder_is_refused_and_changes_nothing(env, run_folder, tmp_path):
    from snnquant import save_checkpoint
    from snnquant.cli.train import build_csnn
    full_precision = tmp_path / "fp.pt"     # a model --ptq takes (the run's own is quantized)
    save_checkpoint(build_csnn(4, 2.0).state_dict(), full_precision)
    before = {p: sha256(p) for p in run_folder.rglob("*") if p.is_file()}
    for args in (["--epochs", "1", "--weight-bits", "0", "--v-bits", "0"],
                 ["--weight-bits", "4", "--ptq", full_precision]):
        line = one_error_line(snnquant(env, "train", *TINY, "--out", run_folder, *args))
        assert f"--out {run_folder} is not empty" in line and "snnquant train" in line, line
        assert "--resume" in line
    assert {p: sha256(p) for p in run_folder.rglob("*") if p.is_file()} == before


def test_a_folder_in_use_is_refused_at_once(env, tmp_path):
    from snnquant.cli._run_folder import RunFolder

    held = RunFolder(tmp_path / "busy")
    held.open(resume=False)
    try:
        res = snnquant(env, "train", *TINY, "--epochs", "1", "--out", tmp_path / "busy", timeout=120)
        assert "in use by another run" in one_error_line(res)
    finally:
        held.close()
    assert list((tmp_path / "busy").iterdir()) == []


@pytest.mark.heavy
def test_resume_removes_what_the_resumed_run_does_not_write(env, tmp_path):
    out = tmp_path / "run"
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--finetune-epochs", "0", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "model_int.c").is_file()
    # resumed after its last epoch, without the integer check: no C model of the earlier end is left
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--finetune-epochs", "0", "--out", out,
                   "--resume", "--no-integer-check")
    assert res.returncode == 0, res.stderr[-3000:]
    left = {p.name for p in out.iterdir()}
    assert not left & {"model_int.c", "model_int.h", "model_int.safetensors", "model_folded.pt"}
    manifest = json.loads((out / "run.json").read_text())
    assert "model_int.c" not in manifest["files"] and "model.pt" in manifest["files"]
    assert manifest["configuration"]["no_integer_check"] is True


def test_resume_refuses_files_no_run_writes(env, tmp_path):
    out = tmp_path / "mixed"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")
    (out / "notes.txt").write_text("mine")
    line = one_error_line(snnquant(env, "train", *TINY, "--out", out, "--resume", timeout=120))
    assert "notes.txt" in line and "no run writes" in line
    assert (out / "notes.txt").read_text() == "mine"
    line = one_error_line(snnquant(env, "train", *TINY, "--out", out / "notes.txt", timeout=120))
    assert "is a file" in line


def test_a_missing_optional_dependency_names_the_extra(env, tmp_path):
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'sklearn':\n"
            "            raise ModuleNotFoundError(\"No module named 'sklearn'\", name='sklearn')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from snnquant.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    res = subprocess.run([sys.executable, "-c", code, "train", *TINY, "--out", tmp_path / "o"],
                         env=env, capture_output=True, text=True, timeout=120)
    line = one_error_line(res, status=1)
    assert "'sklearn'" in line and 'pip install "snnquant[datasets]"' in line, line
    assert not (tmp_path / "o").exists()  # refused before any work


def test_a_module_missing_mid_run_is_explained_or_reraised():
    from snnquant.cli._errors import MissingDependency

    text = MissingDependency.explain(ModuleNotFoundError("No module named 'nir'", name="nir"))
    assert 'snnquant[export]' in text
    with pytest.raises(ModuleNotFoundError):
        MissingDependency.explain(ModuleNotFoundError("No module named 'typo'", name="typo"))


def test_summary_of_a_run_folder_and_of_an_integer_file(env, run_folder, tmp_path):
    res = snnquant(env, "summary", run_folder)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compression ratio" in res.stdout and "QuantLIFNode" in res.stdout
    assert "IntegerNetwork" in res.stdout and "C model: ROM" in res.stdout
    res = snnquant(env, "summary", run_folder / "model_int.safetensors", "--input-shape", "2,34,34")
    assert res.returncode == 0 and "IntegerNetwork" in res.stdout
    assert "no run folder or integer file" in one_error_line(snnquant(env, "summary", tmp_path / "x"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "run.json" in one_error_line(snnquant(env, "summary", empty))


def test_summary_refuses_a_run_folder_changed_after_the_run(env, run_folder, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(run_folder, copy)
    blob = bytearray((copy / "model.pt").read_bytes())
    blob[len(blob) // 2] ^= 1
    (copy / "model.pt").write_bytes(bytes(blob))
    line = one_error_line(snnquant(env, "summary", copy))
    assert "model.pt" in line and "SHA-256" in line


def test_export_writes_the_integer_file_c_and_nir(env, run_folder, tmp_path):
    pytest.importorskip("nir", reason="NIR export needs the 'export' extra")
    from snnquant.export import IntegerSNN, from_nir, load_integer

    res = snnquant(env, "export", run_folder, "--to", "int", "--to", "c", "--to", "nir",
                   "--out", tmp_path / "exp", "--name", "digits")
    assert res.returncode == 0, res.stderr[-3000:]
    names = {p.name for p in (tmp_path / "exp").iterdir()}
    assert names == {"digits.safetensors", "digits.h", "digits.c", "digits.nir"}
    original = load_integer(run_folder / "model_int.safetensors")
    exported = load_integer(tmp_path / "exp" / "digits.safetensors")
    x = (torch.rand(4, 2, 2, 34, 34) < 0.2).to(torch.int64)
    assert torch.equal(IntegerSNN(original)(x), IntegerSNN(exported)(x))
    assert torch.equal(IntegerSNN(from_nir(tmp_path / "exp" / "digits.nir"))(x), IntegerSNN(original)(x))
    assert "DIGITS_INPUT_SIZE" in (tmp_path / "exp" / "digits.h").read_text()


@pytest.mark.heavy
def test_export_of_a_run_without_integer_check_folds_model_pt(env, tmp_path):
    out = tmp_path / "plain"
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--no-integer-check", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    res = snnquant(env, "export", out, "--to", "c", "--out", tmp_path / "c")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "c" / "snn.c").is_file()
    fp = tmp_path / "fp"
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--weight-bits", "0", "--v-bits", "0",
                   "--out", fp)
    assert res.returncode == 0, res.stderr[-3000:]
    line = one_error_line(snnquant(env, "export", fp, "--to", "int", "--out", tmp_path / "fp_int"))
    assert "cannot be exported as integers" in line


def test_export_bad_arguments_exit_2_with_one_line(env, run_folder, tmp_path):
    cases = [(["--to", "c", "--name", "a b"], "--name must be a C identifier"),
             (["--to", "nir", "--input-shape", "2,x"], "--input-shape"),
             (["--to", "pdf"], "invalid choice: 'pdf'")]
    for extra, words in cases:
        res = snnquant(env, "export", run_folder, "--out", tmp_path / "e", *extra)
        assert res.returncode == 2 and words in res.stderr.strip().splitlines()[-1], (extra, res.stderr)


def test_train_bad_arguments_and_roots_exit_2_with_one_line(env, tmp_path):
    res = snnquant(env, "train", "--epochs", "0", "--out", tmp_path / "o")
    assert "--epochs must be >= 1, got 0" in one_error_line(res)
    res = snnquant(env, "train", "--dataset", "shd", "--out", tmp_path / "o")
    assert "--dataset shd needs --data-root" in one_error_line(res)
    res = snnquant(env, "train", *TINY, "--data-root", tmp_path / "nowhere", "--out", tmp_path / "o")
    assert "Train.zip" in one_error_line(res)


@needs("examples")
def test_the_issue_commands_on_one_folder(env, tmp_path):
    """Issue 24's three commands: the second and the third refuse, the first run's files stay."""
    out = tmp_path / "x"
    flags = ["--samples-per-class", "5", "-T", "4", "--channels", "4", "--out", str(out)]

    def example(*args):
        return subprocess.run([sys.executable, str(ROOT / "examples" / "train_nmnist.py"), *flags,
                               *map(str, args)], env=env, capture_output=True, text=True, timeout=600)

    first = example("--epochs", "2", "--finetune-epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    manifest = json.loads((out / "run.json").read_text())
    second = example("--epochs", "2", "--weight-bits", "0", "--v-bits", "0")
    assert "not empty" in one_error_line(second)
    third = example("--weight-bits", "4", "--ptq", out / "model.pt")
    # refused as a flag before the folder is looked at (issue 35: the run's model is quantized)
    assert "is not the full-precision model" in one_error_line(third)
    for name, entry in manifest["files"].items():
        assert sha256(out / name) == entry["sha256"], name


def test_train_deploys_the_trained_network_without_fine_tuning(env, tmp_path):
    """Issue 31: BatchNorm is folded during training (the last quarter of the epochs frozen), the
    default --finetune-epochs is 0, and the deployed network is the trained one."""
    out = tmp_path / "deploy"
    res = snnquant(env, "train", *TINY, "--epochs", "4", "--out", out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "epoch 4: BN statistics frozen" in res.stdout
    assert "fine-tuned 0 epochs" in res.stdout and "folding changed no weight" in res.stdout
    assert "FoldWarning" not in res.stderr and "warning: fold_batchnorm" not in res.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flags"]["finetune_epochs"] == 0 and metrics["flags"]["freeze_bn_epochs"] == 1
    result = metrics["result"]
    assert result["integer"]["folded_test_acc"] == result["test_acc"]
    assert result["integer"]["agreement"] == 1.0
    # the previous behaviour on request: folding changes the network and says so
    old = tmp_path / "old"
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--weight-bits", "2", "--v-bits", "4",
                   "--no-fold-bn-training", "--out", old)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "warning: fold_batchnorm changed the network: layer '0'" in res.stdout


# issue 35 §3: every bad value is one line and exit 2, before anything is written
BAD_TRAIN_FLAGS = [
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["--tau", "0"], "--tau must be a finite number > 1 (the LIF time constant), got 0.0"),
    (["--tau", "-2"], "--tau must be a finite number > 1 (the LIF time constant), got -2.0"),
    (["--tau", "1.0"], "--tau must be a finite number > 1 (the LIF time constant), got 1.0"),
    (["--tau", "3"], "--tau must be a power of two (2, 4, 8, ...) for the run's integer export, "
                     "got 3.0"),
    (["--channels", "0"], "--channels must be >= 1, got 0"),
    (["--channels", "-1"], "--channels must be >= 1, got -1"),
    (["--workers", "-1"], "--workers must be >= 0, got -1"),
    (["--device", "cuda:7"], "--device cuda:7: this machine has"),
    (["--device", "tpu"], "--device must be cpu, cuda, cuda:N or mps, got 'tpu'"),
]


@pytest.mark.parametrize("flags, words", BAD_TRAIN_FLAGS, ids=[" ".join(f) for f, _ in BAD_TRAIN_FLAGS])
def test_train_bad_values_exit_2_with_one_line_before_anything_is_written(env, tmp_path, flags,
                                                                         words):
    if flags == ["--device", "cuda:7"] and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    out = tmp_path / "o"
    line = one_error_line(snnquant(env, "train", *TINY, *flags, "--out", out))
    assert words in line, line
    assert not out.exists()


def test_train_tau_3_trains_without_the_integer_export(env, tmp_path):
    out = tmp_path / "o"
    res = snnquant(env, "train", *TINY, "--epochs", "1", "--tau", "3", "--no-integer-check",
                   "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "run.json").is_file()


def test_ptq_of_a_quantized_or_other_model_is_refused_before_anything_is_written(
        env, run_folder, tmp_path):
    from snnquant import save_checkpoint
    from snnquant.cli.train import build_csnn
    out = tmp_path / "o"
    line = one_error_line(snnquant(env, "train", *TINY, "--ptq", run_folder / "model.pt",
                                   "--out", out))
    assert f"--ptq {run_folder / 'model.pt'} is not the full-precision model" in line, line
    assert "--channels 4" in line and not out.exists()
    wide = tmp_path / "wide.pt"
    save_checkpoint(build_csnn(8, 2.0).state_dict(), wide)
    line = one_error_line(snnquant(env, "train", *TINY, "--ptq", wide, "--out", out))
    assert f"--ptq {wide} is not the full-precision model" in line and "size mismatch" in line
    assert not out.exists()


@pytest.mark.skipif(not os.path.isdir("/proc/sys"), reason="needs Linux's /proc/sys")
def test_an_out_folder_that_cannot_be_written_is_refused(env, run_folder, tmp_path):
    """/proc/sys exists and refuses new files, also to root (chmod does not bind root)."""
    line = one_error_line(snnquant(env, "train", *TINY, "--out", "/proc/sys"))
    assert line.startswith("snnquant train: error: --out /proc/sys: cannot use this folder"), line
    line = one_error_line(snnquant(env, "export", run_folder, "--to", "int", "--out",
                                   "/proc/sys/snnquant_export"))
    assert "--out /proc/sys/snnquant_export: cannot write there" in line, line


def test_export_checks_name_and_shape_before_creating_out(env, run_folder, tmp_path):
    cases = [(["--to", "c", "--name", "stdint"], "--name must not be a standard C or POSIX header "
                                                 "name, got 'stdint'"),
             (["--to", "c", "--name", "int"], "--name must not be a C keyword"),
             (["--to", "c", "--input-shape", "2,20,20"], "--input-shape 2,20,20: input_shape="
                                                         "(2, 20, 20) does not fit operation"),
             (["--to", "nir", "--input-shape", "3,34,34"], "--input-shape 3,34,34: input_shape="
                                                          "(3, 34, 34) does not fit operation 0")]
    for extra, words in cases:
        out = tmp_path / "e"
        line = one_error_line(snnquant(env, "export", run_folder, "--out", out, *extra))
        assert words in line, (extra, line)
        assert not out.exists(), extra


def test_progress_in_a_redirected_log_is_one_line_per_epoch(env, tmp_path):
    """Issue 35 §6: progress bars wrote a carriage-return line per batch into a redirected log;
    without a terminal each epoch (and each fine-tuning or evaluation pass) is one line."""
    res = snnquant(env, "train", *TINY, "--epochs", "2", "--finetune-epochs", "1", "--out",
                   tmp_path / "o")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "\r" not in res.stdout and "\r" not in res.stderr
    lines = res.stdout.splitlines()
    assert sum(line.startswith("epoch ") for line in lines) == 2, res.stdout
    assert sum(line.startswith("fine-tune folded: loss ") for line in lines) == 1, res.stdout
    assert "it/s" not in res.stdout + res.stderr


# ---- issue 47, E: the command line's cases ------------------------------------------------------
def _chip_integer_file(tmp_path):
    import torch.nn as nn
    from snnquant.export import save_integer, to_integer
    from snnquant.targets import XyloLIFLayer

    net = nn.Sequential(XyloLIFLayer(3, 4, threshold=50),
                        XyloLIFLayer(4, 2, threshold=60, delay=1, max_spikes=1, input_max=31))
    path = tmp_path / "chip.safetensors"
    save_integer(to_integer(net), path)
    return path


@pytest.mark.parametrize("targets", [["int", "nir"], ["nir"], ["int", "c"]],
                         ids=["int+nir", "nir", "int+c"])
def test_export_checks_every_target_before_writing_any(env, tmp_path, targets):
    path = _chip_integer_file(tmp_path)
    out = tmp_path / "deploy"
    flags = [f for t in targets for f in ("--to", t)]
    line = one_error_line(snnquant(env, "export", path, *flags, "--input-shape", "3",
                                   "--out", out))
    assert str(path) in line, line
    assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_summary_of_a_chip_file_has_no_c_figures(env, tmp_path):
    path = _chip_integer_file(tmp_path)
    res = snnquant(env, "summary", path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Xylo" in res.stdout and "C model: ROM" not in res.stdout
    assert "no C model for a chip network" in res.stdout


@pytest.mark.parametrize("flags", [["--no-fold-bn-training"], ["--freeze-bn-epochs", "1"]])
def test_ptq_refuses_the_training_only_options(env, run_folder, tmp_path, flags):
    out = tmp_path / "o"
    line = one_error_line(snnquant(env, "train", *TINY, "--ptq", run_folder / "model.pt",
                                   *flags, "--out", out))
    assert flags[0] in line and "--ptq" in line, line
    assert not out.exists()


def test_train_refusals_are_one_line_without_the_usage_block(env, tmp_path):
    res = snnquant(env, "train", "--epochs", "0", "--out", tmp_path / "o")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = snnquant(env, "train", "--dataset", "mnist", "--out", tmp_path / "o")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "invalid choice: 'mnist'" in res.stderr


def _copy_run(run_folder, tmp_path):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    return folder


def _edit_manifest(folder, edit):
    manifest = json.loads((folder / "run.json").read_text())
    edit(manifest)
    (folder / "run.json").write_text(json.dumps(manifest))


RUN_JSON_EDITS = {
    "channels": (lambda m: m["configuration"].update(channels=20000), "configuration.channels"),
    "T": (lambda m: m["configuration"].update(T="2; rm -rf /"), "configuration.T"),
    "configuration": (lambda m: m.update(configuration=[]), "configuration"),
    "files": (lambda m: m.update(files={"x": 1}), "files"),
}


@pytest.mark.parametrize("case", sorted(RUN_JSON_EDITS))
def test_run_json_is_sealed_and_an_edit_is_refused_naming_the_field(env, run_folder, tmp_path,
                                                                     case):
    folder = _copy_run(run_folder, tmp_path)
    edit, field = RUN_JSON_EDITS[case]
    _edit_manifest(folder, edit)
    for command in (["summary", folder], ["export", folder, "--to", "int", "--out",
                                          tmp_path / "e"]):
        line = one_error_line(snnquant(env, *command, timeout=120))
        assert "run.json" in line and f"'{field}'" in line, line
    assert not (tmp_path / "e").exists()


def test_run_json_entries_outside_the_folder_are_refused(env, run_folder, tmp_path):
    from snnquant.cli._run_folder import _seal

    folder = _copy_run(run_folder, tmp_path)
    (tmp_path / "outside.txt").write_text("x")
    manifest = json.loads((folder / "run.json").read_text())
    manifest["files"]["../outside.txt"] = {"sha256": sha256(tmp_path / "outside.txt"),
                                           "bytes": 1}
    (folder / "run.json").write_text(json.dumps(_seal(manifest)))
    line = one_error_line(snnquant(env, "export", folder, "--to", "int", "--out",
                                   tmp_path / "e"))
    assert "../outside.txt" in line and "outside" in line, line
    assert not (tmp_path / "e").exists()


def test_a_resealed_run_json_is_still_checked_field_by_field(env, run_folder, tmp_path):
    from snnquant.cli._run_folder import _seal

    folder = _copy_run(run_folder, tmp_path)
    manifest = json.loads((folder / "run.json").read_text())
    manifest["configuration"]["T"] = "2; rm -rf /"
    (folder / "run.json").write_text(json.dumps(_seal(manifest)))
    line = one_error_line(snnquant(env, "summary", folder))
    assert "'configuration.T'" in line and "int" in line, line


@needs("benchmarks")   # the transformer comes from benchmarks/zoo_deploy.py's builders
def test_export_of_a_transformer_file_to_int_and_nir_writes_nothing(env, tmp_path):
    """NIR has no node for a spiking transformer's operations: the NIR graph is built before
    any file is written, so --to int --to nir leaves no integer file behind."""
    from test_export_transformers import deployed
    from snnquant.export import save_integer

    _, x, desc = deployed("spikformer")
    path = tmp_path / "spikformer.safetensors"
    save_integer(desc, path)
    out = tmp_path / "deploy"
    shape = ",".join(map(str, x.shape[2:]))
    line = one_error_line(snnquant(env, "export", path, "--to", "int", "--to", "nir",
                                   "--input-shape", shape, "--out", out))
    assert "NIR has no node" in line and "nothing was written" in line, line
    assert not out.exists()


def test_a_repeated_flag_is_a_list_in_the_run_configuration(tmp_path):
    """``--model-arg K=V`` given several times is stored as a list: the configuration check
    takes a list of the flag's values (a zoo run's export was refused naming
    ``configuration.model_arg``) and still refuses an item of another type."""
    from snnquant.cli._run_folder import _check_configuration

    path = tmp_path / "run.json"
    _check_configuration({"model_arg": ["embed_dims=32", "depths=1"], "T": 4}, path)
    with pytest.raises(ValueError, match=r"'configuration.model_arg' must be a list of a string"):
        _check_configuration({"model_arg": ["embed_dims=32", 7]}, path)
    with pytest.raises(ValueError, match=r"'configuration.T' must be an int"):
        _check_configuration({"T": [4]}, path)
