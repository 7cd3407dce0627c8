"""Docs that were wrong (issue 11, section 7): the default weight quantizer, quantize_model's
docstring, the order of the guides and the installation page."""

import pathlib
import re

import snnquant

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
