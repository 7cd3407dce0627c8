"""Every figure in the docs comes from benchmarks/results/, never retyped (issue 25).

The guides include the tables the benchmarks write (``<name>_table.rst``, made from the committed
``<name>.md`` by ``benchmarks/_tables.py``); every percentage in the README and the docs is one
that a results file holds, except published figures the pages cite from papers and tutorials.
"""
import re

import pytest
from conftest import load_script

from _repo import ROOT, needs

pytestmark = needs("docs", "benchmarks")

RESULTS = ROOT / "benchmarks" / "results"
# figures the pages cite from elsewhere, not measured here: (file, figure) -> where from
CITED = {
    ("cifar10_dvs.rst", "74.8"): "the published CIFAR10-DVS result the guide cites",
    ("dvs128_gesture.rst", "93.75"): "SpikingJelly's DVS Gesture tutorial",
    ("dvs128_gesture.rst", "97.57"): "the PLIF paper",
    ("shd.rst", "1.6"): "the SHD paper's spread",
    ("shd.rst", "1.9"): "the SHD paper's spread",
    ("deploy.rst", "99.98"): "a bound the guide states, checked by the export tests",
    ("nmnist.rst", "99.5"): "SpikingJelly's full-precision N-MNIST result",
    ("xylo.rst", "92.1"): "the NIR paper (Pedersen et al., 2024), Xylo",
    ("xylo.rst", "85.7"): "the NIR paper (Pedersen et al., 2024), Xylo",
    ("ptq.rst", "0.6"): "events changed between two OpenBLAS kernels (a measurement of the data)",
}
PERCENT = re.compile(r"(?<![\d.])(\d+\.\d+)(?= ?%)")


def _tables():
    return load_script("benchmarks/_tables.py", "bench_tables")


def test_every_included_table_is_its_results_file():
    tables = sorted(RESULTS.glob("*_table.rst"))
    assert {p.name for p in tables} >= {"accuracy_nmnist_table.rst", "accuracy_nmnist_real_table.rst"}
    md_to_rst = _tables().md_to_rst
    for table in tables:
        md = RESULTS / (table.name[:-len("_table.rst")] + ".md")
        assert table.read_text() == md_to_rst(md.read_text()), (
            f"{table.name} differs from {md.name}: run python benchmarks/_tables.py "
            f"{md.stem}")


def test_md_to_rst_keeps_every_cell():
    rst = _tables().md_to_rst("A `x`.\n\n| a | b |\n|---|---|\n| 1.5% | - |\n")
    assert rst.splitlines()[0] == "A ``x``."
    assert "   * - a" in rst and "     - b" in rst and "   * - 1.5%" in rst and "     - \\-" in rst


def test_the_nmnist_guide_includes_its_tables_and_retypes_no_figure():
    text = (ROOT / "docs" / "guide" / "nmnist.rst").read_text()
    for name in ("accuracy_nmnist_table.rst", "accuracy_nmnist_real_table.rst"):
        assert f".. include:: ../../benchmarks/results/{name}" in text
    text = text.replace("``integer model agreement: 100.00%``", "")  # what the run prints
    retyped = [f for f in PERCENT.findall(text) if ("nmnist.rst", f) not in CITED]
    assert retyped == [], "figures belong in the included results tables"


@pytest.mark.parametrize("name", ["README.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.rst")))
def test_every_percentage_in_the_docs_is_in_the_results(name):
    measured = set()
    for path in RESULTS.rglob("*"):
        if path.suffix in (".md", ".rst"):
            measured |= set(PERCENT.findall(path.read_text()))
    path = ROOT / name
    for figure in PERCENT.findall(path.read_text()):
        if (path.name, figure) in CITED:
            continue
        assert figure in measured, f"{name}: {figure}% is in no file of benchmarks/results/"


def test_no_results_file_holds_an_absolute_path_of_the_machine_that_wrote_it():
    tables = _tables()
    found = [f"{path.relative_to(RESULTS)}: {m.group(0)}" for path in sorted(RESULTS.rglob("*"))
             if path.is_file() for m in tables.ABSOLUTE_PATH.finditer(path.read_text())]
    assert found == [], "run python benchmarks/_tables.py --portable"


def test_results_are_written_with_portable_paths(tmp_path):
    tables = _tables()
    checkout = str(ROOT)
    text = (f"`{checkout}/.venv/bin/python {checkout}/benchmarks/x.py --real-split "
            f"/work/shared/data/nmnist-real-1k --out /tmp/run1 --fp-cache /work/runs/fp_cache`")
    path = tables.write_atomic(tmp_path / "r.md", text)
    assert open(path).read() == ("`python benchmarks/x.py --real-split ../shared/data/"
                                 "nmnist-real-1k --out $TMPDIR/run1 --fp-cache runs/fp_cache`")
    assert tables.portable("W2/V4 at 0.5 ms, 10/20 (min..max)") == "W2/V4 at 0.5 ms, 10/20 (min..max)"


def test_paths_of_a_checkout_under_any_top_folder_are_made_portable():
    # CI clones into a folder of its choosing (/check/work/main): its interpreter and scripts
    # must come out as `python benchmarks/...` as they do here
    tables = _tables()
    checkout = "/check/work/main"
    text = (f"`{checkout}/.venv/bin/python {checkout}/benchmarks/x.py --out {checkout}/runs/a` "
            "and /checkpoint/x, W2/V4")
    assert tables.portable(text, checkout=checkout) == (
        "`python benchmarks/x.py --out runs/a` and /checkpoint/x, W2/V4")
