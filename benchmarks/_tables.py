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


def write_atomic(path, text: str) -> str:
    """Write ``text`` to ``path`` through ``<path>.tmp`` and a rename, so that a reader (or a run
    cut short) never leaves half a file; return the path."""
    path = str(path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def write_files(out_dir, files: dict) -> list:
    """Create ``out_dir`` and write ``{file name: text}`` into it, each atomically
    (:func:`write_atomic`); return the paths in that order."""
    os.makedirs(out_dir, exist_ok=True)
    return [write_atomic(os.path.join(out_dir, name), text) for name, text in files.items()]


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


if __name__ == "__main__":  # python benchmarks/_tables.py NAME...: rewrite the tables of results/
    import sys
    for name in sys.argv[1:]:
        print(write_rst_table(RESULTS, name))
