"""Every code block of README.md and of the Sphinx pages runs (issue 11, section 6).

Files: ``README.md``, every ``docs/guide/*.rst`` (found by glob, so a new guide is picked up
without touching this test) and the other ``docs/*.rst`` pages.

Which blocks run:

* Markdown: fenced blocks tagged ``python``/``py``; untagged fenced blocks and indented blocks are
  classified by the rules below.
* reStructuredText: ``.. code-block::`` / ``.. code::`` / ``.. sourcecode::`` blocks tagged
  ``python``/``py``/``python3`` run; ``pycon``/``doctest`` blocks and blocks that start with
  ``>>>`` run as doctests (the printed output must match); literal blocks introduced by ``::`` are
  classified by the rules below.
* Blocks tagged with another language (``bash``, ``console``, ``text``, ...) never run.

Rules for an untagged block: a block whose first line is a shell command (it starts with
``python``, ``python3``, ``pip``, ``torchrun``, ``git``, ``cd``, ``export``, ``conda``, ...,
optionally after a ``$`` prompt) is a shell set-up command and does not run; a block that parses
as Python and has a statement (an import, an assignment, a definition, ...) or a call runs;
anything else (a directory listing, a file name such as ``model.pt``, printed output) is text and
does not run. Write output that happens to look like a call (``tensor([1., 2.])``) as
``.. code-block:: text``.

The blocks of one file run in order in one namespace (a guide builds on its earlier blocks), in a
temporary working directory with ``SNNQUANT_DATA`` pointing into it, so nothing is written into
the repository or the user's cache.
"""

from __future__ import annotations

import ast
import doctest
import pathlib
import re
import textwrap

import pytest
import torch

from _repo import needs

pytestmark = needs("docs", "README.md")

ROOT = pathlib.Path(__file__).resolve().parents[1]

PYTHON = {"python", "py", "python3"}
DOCTEST = {"pycon", "doctest"}
SHELL_WORDS = ("python", "python3", "pip", "pip3", "torchrun", "git", "cd", "export", "conda",
               "apt", "apt-get", "sudo", "bash", "sh", "source", "curl", "wget", "make",
               "tensorboard", "nvidia-smi", "uv")
SHELL_LINE = re.compile(r"^(\$\s+)?(" + "|".join(re.escape(w) for w in SHELL_WORDS) + r")(\s|$)")


def doc_files():
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs" / "guide").glob("*.rst"))
    files += sorted((ROOT / "docs").glob("*.rst"))
    return [f for f in files if f.exists()]


def classify(lang, code: str) -> str:
    """``'python'``, ``'doctest'``, ``'shell'`` or ``'text'`` for a block tagged ``lang``
    (``None`` when untagged)."""
    if lang is not None:
        lang = lang.lower()
        if lang in PYTHON:
            return "python"
        if lang in DOCTEST:
            return "doctest"
        return "shell" if lang in {"bash", "sh", "shell", "console", "zsh"} else "text"
    first = next((line.strip() for line in code.splitlines() if line.strip()), "")
    if first.startswith(">>>"):
        return "doctest"
    if SHELL_LINE.match(first):
        return "shell"
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return "text"
    for node in tree.body:
        if not isinstance(node, ast.Expr) or isinstance(node.value, ast.Call):
            return "python"
    return "text"  # only bare names, attributes, constants: a file name, a listing


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _indented_body(lines, start, min_indent):
    """The block of lines from ``start`` indented more than ``min_indent`` (blank lines inside
    included); returns ``(first_line_index, code, next_index)``."""
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    first = i
    body = []
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > min_indent):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    return first, textwrap.dedent("\n".join(body)), i


def rst_blocks(text: str):
    """``(line_number, lang, code)`` for every code-block directive and ``::`` literal block."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        directive = re.match(r"^(\s*)\.\.\s+(code-block|code|sourcecode)::\s*(\S*)\s*$", line)
        if directive:
            indent = len(directive.group(1))
            i += 1
            while i < len(lines) and lines[i].strip().startswith(":") and \
                    _indent(lines[i]) > indent:
                i += 1  # directive options (:caption:, :linenos:, ...)
            first, code, i = _indented_body(lines, i, indent)
            if code.strip():
                blocks.append((first + 1, directive.group(3) or None, code))
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            first, code, end = _indented_body(lines, i + 1, _indent(line))
            if code.strip():
                blocks.append((first + 1, None, code))
                i = end
                continue
        elif stripped.startswith(">>>") and (i == 0 or not lines[i - 1].strip()):
            # a doctest block: a paragraph that starts with >>>
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            blocks.append((i + 1, "pycon", textwrap.dedent("\n".join(lines[i:end]))))
            i = end
            continue
        i += 1
    return blocks


def markdown_blocks(text: str):
    """``(line_number, lang, code)`` for every fenced and every indented code block."""
    lines = text.splitlines()
    blocks = []
    i = 0
    previous_blank = True
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence:
            marker = fence.group(1)
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(marker):
                j += 1
            blocks.append((i + 2, fence.group(2) or None, textwrap.dedent("\n".join(lines[i + 1:j]))))
            i = j + 1
            previous_blank = False
            continue
        if previous_blank and line.startswith("    ") and line.strip():
            first, code, i = _indented_body(lines, i, 3)
            blocks.append((first + 1, None, code))
            previous_blank = False
            continue
        previous_blank = not line.strip()
        i += 1
    return blocks


def blocks_of(path: pathlib.Path):
    text = path.read_text(encoding="utf-8")
    found = markdown_blocks(text) if path.suffix == ".md" else rst_blocks(text)
    return [(line, classify(lang, code), code) for line, lang, code in found]


# --- the extractor itself ------------------------------------------------------------------------


def test_the_rules_classify_blocks_as_stated():
    rst = textwrap.dedent("""\
        Title
        =====

        .. code-block:: python
           :caption: example

            x = 1

        A listing::

            extract/Train/<label>/<index>.bin

        Files::

            model.pt
            runs/nmnist/metrics.json

        Code::

            y = x + 1

        .. code-block:: bash

            pip install snnquant

        ::

            python3 -m venv .venv && . .venv/bin/activate

        >>> x + 1
        2
        """)
    kinds = [(kind, code.strip()) for _, kind, code in
             [(line, classify(lang, code), code) for line, lang, code in rst_blocks(rst)]]
    assert kinds == [("python", "x = 1"), ("text", "extract/Train/<label>/<index>.bin"),
                     ("text", "model.pt\nruns/nmnist/metrics.json"),
                     ("python", "y = x + 1"), ("shell", "pip install snnquant"),
                     ("shell", "python3 -m venv .venv && . .venv/bin/activate"),
                     ("doctest", ">>> x + 1\n2")]
    md = "Intro\n\n```python\na = 2\n```\n\nSet-up:\n\n    python3 -m venv .venv\n\n```\nb = a\n```\n"
    assert [(classify(lang, code), code.strip()) for _, lang, code in markdown_blocks(md)] == [
        ("python", "a = 2"), ("shell", "python3 -m venv .venv"), ("python", "b = a")]


def test_every_guide_is_found_and_the_main_guides_have_python_blocks():
    names = {path.name for path in doc_files()}
    assert "README.md" in names
    assert {p.name for p in (ROOT / "docs" / "guide").glob("*.rst")} <= names
    for name in ("README.md", "quantize.rst", "functional.rst", "deploy.rst"):
        path = next(p for p in doc_files() if p.name == name)
        assert any(kind == "python" for _, kind, _ in blocks_of(path)), name


# --- running them --------------------------------------------------------------------------------


def runnable_doc_files():
    """The documentation files with at least one Python or doctest block (the others have none to run)."""
    return [p for p in doc_files() if any(kind in ("python", "doctest") for _, kind, _ in blocks_of(p))]


#: the guides whose code needs an optional extra: guide name -> (extra, its modules)
GUIDE_EXTRAS = {"xylo.rst": ("xylo", ("rockpool", "xylosim"))}


def missing_extra(path: pathlib.Path):
    """Why ``path``'s code cannot run here (a missing optional extra, named), or ``None``."""
    import importlib.util

    extra, modules = GUIDE_EXTRAS.get(path.name, (None, ()))
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (f"{path.name} runs {module}, of the {extra!r} extra: pip install "
                    f"'snnquant[{extra}]'")
    return None


def test_a_guide_of_a_missing_extra_is_skipped_naming_it(monkeypatch):
    import sys

    xylo = ROOT / "docs" / "guide" / "xylo.rst"
    monkeypatch.setitem(sys.modules, "xylosim", None)
    reason = missing_extra(xylo)
    assert reason is not None and "'xylo' extra" in reason and "snnquant[xylo]" in reason
    assert missing_extra(ROOT / "docs" / "guide" / "quantize.rst") is None


@pytest.mark.parametrize("path", runnable_doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(path, tmp_path, monkeypatch):
    reason = missing_extra(path)
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SNNQUANT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    torch.manual_seed(0)
    namespace = {"__name__": f"docs_{path.stem}"}
    relative = path.relative_to(ROOT)
    ran = 0
    for line, kind, code in blocks_of(path):
        where = f"{relative}:{line}"
        if kind == "python":
            try:
                exec(compile(code, where, "exec"), namespace)
            except Exception as error:  # name the block in the failure
                raise AssertionError(f"the code block at {where} failed: {error!r}") from error
            ran += 1
        elif kind == "doctest":
            test = doctest.DocTestParser().get_doctest(code, namespace, where, str(path), line)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS |
                                           doctest.NORMALIZE_WHITESPACE)
            runner.run(test, clear_globs=False)
            assert runner.failures == 0, f"the doctest block at {where} failed"
            ran += 1
    assert ran > 0, f"{relative}: no block ran"
