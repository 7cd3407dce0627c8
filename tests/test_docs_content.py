"""Docs that were wrong (issue 11, section 7): the default weight quantizer, quantize_model's
docstring, the order of the guides and the installation page."""

import pathlib
import re

import pytest

import snnquant

from _repo import needs

pytestmark = needs("docs", "README.md", "examples")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quantize_guide_names_the_default_weight_quantizer_of_the_code():
    default = snnquant.QuantConfig().weight_quantizer
    text = (ROOT / "docs" / "guide" / "quantize.rst").read_text()
    said = re.findall(r"``'(\w+)'`` \([^)]*?the default", text)
    assert said == [default], said


def test_quantize_model_docstring_states_the_real_defaults():
    doc = snnquant.quantize_model.__doc__
    assert "8-bit LSQ weights" not in doc
    assert "lsq_pow2" in doc
    assert re.search(r"neurons stay float unless\s+``v_bits``\s+is set", doc)


def _toctree_entries(text):
    entries = []
    for block in re.split(r"\n(?=\.\. toctree::)", text)[1:]:
        for line in block.splitlines()[1:]:
            line = line.strip()
            if line and not line.startswith(":"):
                entries.append(line)
    return entries


def test_entry_guide_comes_first_and_the_installation_page_is_in_the_toctree():
    index = (ROOT / "docs" / "index.rst").read_text()
    entries = [e for e in _toctree_entries(index) if not e.startswith("api/")]
    guides = [e for e in entries if e.startswith("guide/")]
    assert guides[0] == "guide/quantize"
    assert "install" in entries and entries.index("install") < entries.index("guide/quantize")
    install = (ROOT / "docs" / "install.rst").read_text()
    for needle in ("cuda12", "cuda13", "CuPy", "CPU", "examples", "export", "dev", "datasets"):
        assert needle in install, needle


# --------------------------------------------------------------------------------------------------
# issue 25: the order a user works, the install page, the links, the defaults the pages name

USER_ORDER = ["install", "guide/quantize", "guide/nmnist", "guide/dvs128_gesture",
              "guide/cifar10_dvs", "guide/shd", "guide/ptq", "guide/deploy", "guide/deploy_mcu",
              "guide/nir"]


def test_the_pages_come_in_the_order_a_user_works_and_the_architecture_last():
    entries = _toctree_entries((ROOT / "docs" / "index.rst").read_text())
    positions = [entries.index(page) for page in USER_ORDER]
    assert positions == sorted(positions), [entries[i] for i in sorted(positions)]
    assert entries[-1] == "architecture"
    for path in (ROOT / "docs" / "guide").glob("*.rst"):  # a new guide gets its place in the order
        assert f"guide/{path.stem}" in entries, path.name


def test_install_page_and_readme_cover_wheel_sdist_and_every_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = (ROOT / "docs" / "install.rst").read_text()
    readme = (ROOT / "README.md").read_text()
    for text in (install, readme):
        for words in ("wheel", "sdist", "python -m build", "snnquant train", "torch==2.13.0",
                      "torch==2.14.1"):
            assert words in text, words
        for extra in extras:
            assert f"``{extra}``" in text or f"`{extra}`" in text, extra


def test_quickstart_is_linked_from_the_readme_and_the_quantize_guide():
    assert "examples/quickstart.py" in (ROOT / "README.md").read_text()
    quantize = (ROOT / "docs" / "guide" / "quantize.rst").read_text()
    assert ":download:`examples/quickstart.py\n<../../examples/quickstart.py>`" in quantize
    assert (ROOT / "examples" / "quickstart.py").is_file()


def test_every_default_a_page_names_is_the_code_default():
    """``--flag`` (default X) / ``--flag``, default X in the README and the guides: X is what
    ``snnquant train`` defaults to."""
    from snnquant.cli.train import parse_args

    defaults = vars(parse_args([]))
    pattern = re.compile(r"``(--[\w-]+)``(?: epochs)?,? \(?default (?:``)?([\w./]+)")
    found = 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.rst"))]:
        text = " ".join(path.read_text().split())
        for flag, value in pattern.findall(text):
            found += 1
            code = defaults[flag[2:].replace("-", "_")]
            assert value == str(code), (path.name, flag, value, code)
    assert found >= 5
    assert defaults["finetune_epochs"] == 0  # the nmnist and deploy guides say so in prose too
    assert defaults["freeze_bn_epochs"] == defaults["epochs"] // 4


# --------------------------------------------------------------------------------------------------
# issue 36 §4: the architecture page names the files as they are


def _architecture_sections():
    """``{heading: text}`` of docs/architecture.rst, in order, the part before the first heading
    under ``""``."""
    lines = (ROOT / "docs" / "architecture.rst").read_text().splitlines()
    sections, heading = {"": []}, ""
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1]) and line.strip() \
                and len(lines[i + 1]) >= len(line):
            heading = line
            sections[heading] = []
        elif not re.fullmatch(r"-{3,}", line):
            sections[heading].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def _current(path):
    """``path`` exists and is not one of the thin modules that keep an old path importable
    (``export/description.py`` and the like, which alias ``sys.modules``)."""
    return path.exists() and not (path.is_file() and "sys.modules[__name__] =" in path.read_text())


def _exists_in_the_repository(name):
    """A path the page names: relative to snnquant/ or to the repository (``export/ir/``,
    ``tests/test_architecture.py``), or a bare file name that some folder of snnquant/ holds."""
    if "/" in name.rstrip("/"):
        return _current(ROOT / "snnquant" / name) or _current(ROOT / name)
    return any(_current(p) for p in (ROOT / "snnquant").rglob(name.rstrip("/")))


def test_every_file_the_architecture_page_names_exists():
    text = (ROOT / "docs" / "architecture.rst").read_text()
    # a file:line (SpikingJelly's spikformer.py:523) points into another package
    names = set(re.findall(r"[\w/]*\w\.(?:py|cu|h)\b(?!:\d)", text))
    names |= set(re.findall(r"``([\w/]+/)``", text))
    assert len(names) > 40, sorted(names)  # the scan found the page's files
    missing = sorted(n for n in names if not _exists_in_the_repository(n))
    assert not missing, missing


@pytest.mark.parametrize("heading", ["Adding a neuron kind",
                                     "Adding an operation to the integer export"])
def test_the_adding_sections_list_each_file_once_with_its_current_path(heading):
    sections = _architecture_sections()
    headings = list(sections)
    # the two recipes stand side by side
    assert headings.index("Adding an operation to the integer export") == \
        headings.index("Adding a neuron kind") + 1
    steps = re.findall(r"^\d+\. ``([\w/.]+)``", sections[heading], flags=re.M)
    if heading == "Adding a neuron kind":   # issue 45 §4: at most 5 files
        assert 5 >= len(steps) >= 4, steps
    else:
        assert len(steps) >= 6, steps
    assert len(steps) == len(set(steps)), steps
    for path in steps:
        assert _current(ROOT / "snnquant" / path), path


def test_the_kernel_codes_of_the_neuron_kinds_are_their_places_in_neuron_kinds():
    """Issue 45 §4: a neuron kind's kernel code is not written in kernels/_fused.py but read from
    its place in NEURON_KINDS, so the kernel source's SNQ_NEURON_* defines must follow that order."""
    from snnquant.functional.neuron import NEURON_KINDS
    from snnquant.kernels import _fused
    source = (ROOT / "snnquant" / "kernels" / "neuron.cu").read_text()
    defined = {name.lower(): int(code)
               for name, code in re.findall(r"#define SNQ_NEURON_(\w+) (\d+)", source)}
    assert defined == {kind: i for i, kind in enumerate(NEURON_KINDS)} == _fused.NEURON_CODES
