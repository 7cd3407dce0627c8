"""The PTQ guide's code blocks run, in order, in one namespace (they build on each other)."""
import os
import pathlib
import re

from _repo import needs

pytestmark = needs("docs")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ptq_guide_blocks_run(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "guide" / "ptq.rst").read_text()
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for i, block in enumerate(blocks):
        code = "\n".join(line[4:] for line in block.splitlines())
        exec(compile(code, f"ptq.rst block {i}", "exec"), namespace)
    assert os.path.getsize(tmp_path / "sensitivity.png") > 0
    assert namespace["report"].calibrated
    assert namespace["config"].assignment["bytes"] <= namespace["config"].assignment["budget_bytes"]
    assert {op.weight_bits for op in namespace["to_integer"](namespace["binary"].eval()).ops
            if hasattr(op, "weight_bits")} == {1}
