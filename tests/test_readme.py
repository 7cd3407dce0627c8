"""The README's set-up commands and .ci/run stay in sync; the package imports lightly."""
import pathlib
import subprocess
import sys

from _repo import needs

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _commands():
    return [line.strip() for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("    python3 -m venv")]


@needs("README.md", ".ci")
def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    cmds = _commands()
    assert len(cmds) == 2
    main_job, tests = cmds
    assert "examples/train_nmnist.py" in main_job and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_import_is_light():
    code = ("import sys, snnquant; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('cupy', 'triton', 'matplotlib', 'torchvision') or m.startswith('spikingjelly.datasets')];"
            "print(bad); assert not bad, bad; print(snnquant.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


@needs("README.md")
def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["rate"].shape == (32, 10)
    assert namespace["report"].replaced
