"""The README's set-up commands and .ci/run stay in sync; the package imports lightly."""
import pathlib
import re
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


# --------------------------------------------------------------------------------------------------
# The first page's figures: each one from the results file its section names

#: a measured figure: a percentage, a ratio (1.6x), a number of a (min..max) range, bytes
FIGURE = re.compile(r"(?<![\w.])\d+\.\d+(?=%|\.\.\d|x\b)|(?<=\.\.)\d+\.\d+"
                    r"|(?<![\w.,])\d{1,3}(?:,\d{3})+(?= B\b)")


def _sections(text: str):
    """``{heading: body}`` of the README's ``##`` sections."""
    parts = re.split(r"^## ", text, flags=re.M)
    return {part.splitlines()[0]: part for part in parts[1:]}


@needs("README.md", "benchmarks")
def test_every_readme_figure_is_in_a_results_file_its_section_names():
    checked = 0
    for heading, body in _sections((ROOT / "README.md").read_text()).items():
        figures = FIGURE.findall(body)
        if not figures:
            continue
        cited = set(re.findall(r"benchmarks/results/([\w.-]+\.md)", body))
        cited |= {name for name in re.findall(r"`([\w.-]+\.md)`", body)}
        assert cited, f"section {heading!r} has figures and names no results file"
        sources = "\n".join((ROOT / "benchmarks" / "results" / name).read_text()
                            for name in sorted(cited))
        for figure in figures:
            assert figure in sources, f"{heading!r}: {figure} is in none of {sorted(cited)}"
            checked += 1
    assert checked >= 8


@needs("README.md", "benchmarks")
def test_the_readme_deploy_table_is_the_zoo_benchmark_result():
    import json

    from conftest import load_script

    zoo = load_script("benchmarks/zoo_deploy.py", "zoo_deploy_readme")
    rows = json.loads((ROOT / "benchmarks" / "results" / "zoo_deploy.json").read_text())["rows"]
    table = zoo.readme_table(rows)
    assert table in (ROOT / "README.md").read_text(), (
        "the README's table of what deploys where differs from benchmarks/results/"
        "zoo_deploy.json (zoo_deploy.readme_table)")
    assert len(rows) >= 20 and table.count("\n") == len(rows) + 1


@needs("README.md")
def test_the_readme_names_no_issue_numbers_and_no_commit_hashes():
    text = (ROOT / "README.md").read_text()
    assert not re.findall(r"\bissues? #?\d+", text, flags=re.I)
    assert not re.findall(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text)
