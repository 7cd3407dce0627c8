"""``snnquant train --teacher RUN_DIR`` / ``--train-teacher`` (issue 48 §1, §5): distillation
through the command line, its manifest and its resumption."""
import hashlib
import json

import pytest
import torch

from test_cli import TINY, env, one_error_line, snnquant  # noqa: F401  (env: the fixture)

import snnquant as sq

STUDENT = ["--weight-bits", "2", "--v-bits", "4", "--align", "firing_rate"]


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def teacher_run(env, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "fp"
    res = snnquant(env, "train", *TINY, "--epochs", "2", "--weight-bits", "0", "--v-bits", "0",
                   "--no-integer-check", "--out", out)
    assert res.returncode == 0, res.stderr[-2000:]
    return out


@pytest.mark.heavy  # several subprocess trainings
def test_train_teacher_first_then_distil_end_to_end(env, tmp_path):
    """A tiny run that trains its teacher into <out>/teacher, distils, deploys exactly and
    records the teacher's checksum in run.json."""
    out = tmp_path / "run"
    res = snnquant(env, "train", *TINY, "--epochs", "2", *STUDENT, "--train-teacher",
                   "--out", out)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "teacher: training the full-precision network" in res.stdout
    assert "integer model agreement: 100.00%" in res.stdout
    manifest = json.loads((out / "run.json").read_text())
    teacher_pt = out / "teacher" / "model.pt"
    assert manifest["configuration"]["teacher_sha256"] == _sha256(teacher_pt)
    assert manifest["files"]["teacher/model.pt"]["sha256"] == _sha256(teacher_pt)
    teacher_manifest = json.loads((out / "teacher" / "run.json").read_text())
    assert teacher_manifest["configuration"]["weight_bits"] == 0
    # resuming a finished teacher-first run keeps the teacher and redoes nothing of it
    res = snnquant(env, "train", *TINY, "--epochs", "2", *STUDENT, "--train-teacher",
                   "--out", out, "--resume")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "teacher: the finished run in" in res.stdout
    assert _sha256(teacher_pt) == manifest["configuration"]["teacher_sha256"]


@pytest.mark.heavy  # several subprocess trainings
def test_a_distillation_killed_and_resumed_equals_an_uninterrupted_one(env, tmp_path, teacher_run):
    whole, part = tmp_path / "whole", tmp_path / "part"
    flags = [*TINY, "--epochs", "3", *STUDENT, "--kd-weight", "0.7", "--teacher", teacher_run,
             "--no-integer-check"]
    res = snnquant(env, "train", *flags, "--out", whole)
    assert res.returncode == 0, res.stderr[-2000:]
    res = snnquant(env, "train", *flags, "--out", part, "--stop-after", "1")
    assert res.returncode == 0 and "stopping after epoch 1" in res.stdout, res.stderr[-2000:]
    assert not (part / "model.pt").exists()
    res = snnquant(env, "train", *flags, "--out", part, "--resume")
    assert res.returncode == 0 and "resumed from" in res.stdout, res.stderr[-2000:]
    a = sq.load_checkpoint(whole / "model.pt")
    b = sq.load_checkpoint(part / "model.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for name in ("whole", "part"):
        conf = json.loads((tmp_path / name / "run.json").read_text())["configuration"]
        assert conf["teacher_sha256"] == _sha256(teacher_run / "model.pt")


def test_resume_refuses_another_teacher(env, tmp_path, teacher_run):
    import shutil
    out = tmp_path / "run"
    flags = [*TINY, "--epochs", "2", *STUDENT, "--no-integer-check"]
    res = snnquant(env, "train", *flags, "--teacher", teacher_run, "--out", out, "--stop-after", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    other = tmp_path / "other_teacher"
    shutil.copytree(teacher_run, other)
    state = sq.load_checkpoint(other / "model.pt")
    state = {k: (v + 1 if v.is_floating_point() else v) for k, v in state.items()}
    sq.save_checkpoint(state, other / "model.pt")
    # a file changed after its run wrote it: refused by the teacher's manifest
    line = one_error_line(snnquant(env, "train", *flags, "--teacher", other, "--out", out,
                                   "--resume"), status=1)
    assert "model.pt differs from the SHA-256" in line


def test_bad_teacher_flags_are_refused(env, tmp_path, teacher_run):
    line = one_error_line(snnquant(env, "train", *TINY, *STUDENT, "--teacher", tmp_path,
                                   "--out", tmp_path / "o"))
    assert "--teacher" in line and "no model.pt" in line
    line = one_error_line(snnquant(env, "train", *TINY, *STUDENT, "--teacher", teacher_run,
                                   "--train-teacher", "--out", tmp_path / "o"))
    assert "not both" in line
    line = one_error_line(snnquant(env, "train", *TINY, "--weight-bits", "0", "--v-bits", "0",
                                   "--train-teacher", "--out", tmp_path / "o"))
    assert "quantized network" in line
    line = one_error_line(snnquant(env, "train", *TINY, *STUDENT, "--kd-weight", "2",
                                   "--train-teacher", "--out", tmp_path / "o"))
    assert "--kd-weight must be in [0, 1], got 2.0" in line
    # a teacher of another network
    res = snnquant(env, "train", *[f if f != "4" or i != 7 else "6" for i, f in enumerate(TINY)],
                   *STUDENT, "--teacher", teacher_run, "--out", tmp_path / "o2", "--epochs", "1")
    assert res.returncode == 1 and "--channels" in res.stderr.strip().splitlines()[-1], \
        res.stderr[-2000:]


@pytest.mark.heavy  # several subprocess trainings
def test_a_run_killed_while_its_teacher_trains_resumes_the_teacher(env, tmp_path):
    from snnquant.cli.args import parse_args
    from snnquant.cli.teacher import teacher_argv
    out = tmp_path / "run"
    flags = [*TINY, "--epochs", "2", *STUDENT, "--no-integer-check"]
    # the teacher's own run, stopped after its first epoch, where --train-teacher puts it
    argv = teacher_argv(parse_args([*flags, "--train-teacher", "--out", str(out),
                                    "--device", "cpu"]))
    res = snnquant(env, "train", *argv, "--stop-after", "1")
    assert res.returncode == 0 and "stopping after epoch 1" in res.stdout, res.stderr[-2000:]
    assert not (out / "teacher" / "model.pt").exists()   # (a stopped run writes run.json)
    line = one_error_line(snnquant(env, "train", *flags, "--train-teacher", "--out", out))
    assert "not empty" in line and "--resume" in line
    res = snnquant(env, "train", *flags, "--train-teacher", "--out", out, "--resume")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "teacher: resuming the full-precision network" in res.stdout
    assert "resumed from" in res.stdout
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["configuration"]["teacher_sha256"] == _sha256(out / "teacher" / "model.pt")
