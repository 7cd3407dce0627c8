"""The results files of the benchmarks: JSON and Markdown written atomically (into
``benchmarks/results/`` by default), the median (min..max) cells of their tables, and the Markdown
as reStructuredText for the guides to include (``.. include::``).

A benchmark writes its table once, as Markdown (``<name>.md``, from its JSON); :func:`md_to_rst`
turns that file into ``<name>_table.rst`` word for word, so that no figure in the docs is typed
by hand. tests/test_docs_figures.py checks every ``*_table.rst`` against its ``.md``.
"""
from __future__ import annotations

import os
import re
import statistics

#: where the benchmarks write their results by default (and the guides include them from)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the top folders an absolute path of a machine starts with; the checkout's own is added to them
#: (a CI machine clones into a folder of its choosing, e.g. ``/check/work/main``)
_TOP_FOLDERS = ("work", "tmp", "root", "home", "usr", "opt", "var", "mnt", "srv", "scratch")


def absolute_path_pattern(checkout: str = _CHECKOUT):
    """The regular expression of an absolute path of this machine in a results file (where it ran,
    its interpreter, scratch folders): one under a usual top folder or under ``checkout``'s. The
    files are read on other machines, so none may stay (:func:`portable`)."""
    top = set(_TOP_FOLDERS) | {checkout.strip("/").split("/")[0]}
    return re.compile(r"(?<![\w.~<>$-])/(?:" + "|".join(sorted(map(re.escape, top - {""})))
                      + r")(?![\w.-])(?:/[^\s\"'`,;)\]|]+)*")


#: the absolute paths of this machine in this checkout (:func:`absolute_path_pattern`)
ABSOLUTE_PATH = absolute_path_pattern()


def _portable_path(path: str, checkout: str) -> str:
    if re.search(r"/bin/python[\d.]*$", path):
        return "python"
    if path == checkout or path.startswith(checkout + "/"):
        return os.path.relpath(path, checkout)
    if "/shared/data/" in path:
        return "../shared/data/" + path.split("/shared/data/", 1)[1]
    if path.startswith("/tmp"):
        return "$TMPDIR" + path[len("/tmp"):]
    parts = path.strip("/").split("/")
    return "/".join(parts[1:]) or parts[0]  # a scratch folder beside a checkout: its own name


def portable(text: str, checkout: str = _CHECKOUT) -> str:
    """``text`` with every absolute path of this machine made portable: the paths of ``checkout``
    (this one by default) relative to it, the shared recordings as ``../shared/data/...``, an
    interpreter as ``python``, ``/tmp/x`` as ``$TMPDIR/x`` and another folder by its path below the
    top folder."""
    pattern = ABSOLUTE_PATH if checkout == _CHECKOUT else absolute_path_pattern(checkout)
    return pattern.sub(lambda m: _portable_path(m.group(0), checkout), text)


def write_atomic(path, text: str) -> str:
    """Write ``text`` to ``path`` through ``<path>.tmp`` and a rename, so that a reader (or a run
    cut short) never leaves half a file; return the path. Absolute paths of this machine in
    ``text`` are written portable (:func:`portable`)."""
    path = str(path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(portable(text))
    os.replace(tmp, path)
    return path


def write_files(out_dir, files: dict) -> list:
    """Create ``out_dir`` and write ``{file name: text}`` into it, each atomically
    (:func:`write_atomic`); return the paths in that order."""
    os.makedirs(out_dir, exist_ok=True)
    return [write_atomic(os.path.join(out_dir, name), text) for name, text in files.items()]


def write_result(out_dir, stem: str, result: dict, markdown: str) -> list:
    """Write ``<stem>.json`` (``result``) and ``<stem>.md`` (``markdown``) into ``out_dir``
    atomically (:func:`write_files`); return their paths."""
    import json

    return write_files(out_dir, {stem + ".json": json.dumps(result, indent=2) + "\n",
                                 stem + ".md": markdown})


def target_rows(targets: dict) -> list:
    """Markdown rows ``| name | value | <= limit | pass |`` of a benchmark's targets
    (``{name: {"value", "target", "pass"}}``; a value of None shows as n/a)."""
    rows = []
    for name, t in targets.items():
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        rows.append(f"| {name} | {value} | <= {t['target']} | {t['pass']} |")
    return rows


def spread(values):
    """``(median, min, max)`` of a list of values (accuracies of several seeds, times of several
    runs)."""
    return statistics.median(values), min(values), max(values)


def fmt(values) -> str:
    """An accuracy cell: median (min..max) in percent."""
    med, lo, hi = spread(values)
    return f"{100 * med:.2f}% ({100 * lo:.2f}..{100 * hi:.2f})"


EMPTY = "\\ "  # an empty list-table cell


def _inline(text: str) -> str:
    if text.strip() == "-":
        return "\\-"  # not an empty bullet list
    return re.sub(r"`([^`]+)`", r"``\1``", text.strip())


def md_to_rst(md: str) -> str:
    """The Markdown ``md`` (paragraphs and pipe tables) as reStructuredText: each table a
    ``list-table`` with a header row, each paragraph as it is, inline code in double backticks."""
    out, rows = [], []

    def flush():
        if rows:
            out.extend([".. list-table::", "   :header-rows: 1", ""])
            for row in rows:
                for i, cell in enumerate(row):
                    out.append(f"   {'* -' if i == 0 else '  -'} {_inline(cell) or EMPTY}")
            out.append("")
            rows.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            cells = line.strip().strip("|").split("|")
            if not all(re.fullmatch(r"\s*:?-+:?\s*", c) for c in cells):
                rows.append(cells)
            continue
        flush()
        out.append(_inline(line) if line.strip() else "")
    flush()
    return "\n".join(out).strip() + "\n"


def write_rst_table(results_dir: str, name: str) -> str:
    """Write ``<results_dir>/<name>_table.rst`` from ``<name>.md``; return its path."""
    with open(os.path.join(results_dir, name + ".md")) as f:
        text = md_to_rst(f.read())
    return write_atomic(os.path.join(results_dir, name + "_table.rst"), text)


if __name__ == "__main__":
    # python benchmarks/_tables.py NAME...: rewrite the tables of results/;
    # python benchmarks/_tables.py --portable: make every results file's paths portable
    import sys
    if sys.argv[1:] == ["--portable"]:
        for folder, _, names in os.walk(RESULTS):
            for name in names:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    text = f.read()
                if portable(text) != text:
                    print(write_atomic(os.path.join(folder, name), text))
    else:
        for name in sys.argv[1:]:
            print(write_rst_table(RESULTS, name))
