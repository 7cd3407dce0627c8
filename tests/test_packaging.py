"""The wheel and the sdist users install (issue 25): metadata without a torch cap, the license,
py.typed, the console script, and an sdist that holds what its tests read."""
import email
import subprocess
import sys
import tarfile
import zipfile

import pytest

from _repo import ROOT

pytestmark = pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(),
                                reason="no pyproject.toml beside tests/ (an installed package)")

BUILD = """
import sys
from setuptools import build_meta
out = sys.argv[2]
print(build_meta.build_wheel(out) if sys.argv[1] == "wheel" else build_meta.build_sdist(out))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The wheel and the sdist, built from this tree by setuptools (what ``python -m build``
    runs, without its isolated environment)."""
    pytest.importorskip("setuptools", minversion="77", reason="building needs setuptools >= 77")
    out = tmp_path_factory.mktemp("dist")
    paths = {}
    for kind in ("wheel", "sdist"):
        res = subprocess.run([sys.executable, "-c", BUILD, kind, str(out)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        paths[kind] = out / res.stdout.strip().splitlines()[-1]
    return paths


def _metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        return names, email.message_from_string(zf.read(meta).decode()), zf.read(entry).decode()


def test_wheel_metadata_lets_users_keep_their_torch(built):
    names, meta, entry_points = _metadata(built["wheel"])
    requires = meta.get_all("Requires-Dist")
    torch_req = [r for r in requires if r.split(">")[0].split("<")[0].split("=")[0].strip() == "torch"]
    assert torch_req == ["torch>=2.6"], torch_req  # no upper bound: torch 2.15 resolves
    assert meta["License-Expression"] == "MIT"
    assert "LICENSE" in meta.get_all("License-File")
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    urls = {u.split(",")[0] for u in meta.get_all("Project-URL")}
    assert urls >= {"Homepage", "Documentation", "Issues"}
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and any("Python :: 3.11" in c for c in classifiers)
    assert "snnquant/py.typed" in names
    assert "snnquant/__main__.py" in names and "snnquant/cli/train.py" in names
    assert any(n.startswith("snnquant/kernels/") and n.endswith(".cu") for n in names)
    assert "[console_scripts]" in entry_points and "snnquant = snnquant.cli:main" in entry_points


def test_sdist_holds_what_its_tests_read(built):
    with tarfile.open(built["sdist"]) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the sdist is compared with git's file list")
    for path in tracked.stdout.split():
        if path.split("/")[0] in ("tests", "docs", "examples", "benchmarks", ".ci", "snnquant"):
            assert path in names, f"{path} is not in the sdist"
    assert {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in"} <= names
