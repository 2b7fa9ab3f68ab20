"""Re-execute notebook sources into their committed ``.ipynb`` (``make sync [NB=...]``).

For each ``notebooks/NN_slug.py``: read it, execute it top to bottom in a fresh
kernel, and write ``NN_slug.ipynb`` with the outputs. Prints each run time.

``--markdown-only`` executes nothing: it copies the markdown cells of each ``.py`` into its
``.ipynb`` and keeps every code cell and output as committed. It refuses a chapter whose
code cells, or whose sequence of cell types, differ between the two (that needs a run).
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbpairs import ROOT, chapter_sources, execute, read_source, tidy


def sync_markdown(py) -> bool:
    """Copy the markdown cells of ``py`` into its ``.ipynb``; return whether anything changed.

    Raises ``SystemExit`` when the code cells (or the order of cell types) differ, since
    the outputs would then no longer belong to the source.
    """
    ipynb = py.with_suffix(".ipynb")
    src = read_source(py)
    nb = nbformat.read(ipynb, as_version=4)
    kinds = [c.cell_type for c in src.cells], [c.cell_type for c in nb.cells]
    if kinds[0] != kinds[1]:
        raise SystemExit(f"{py.stem}: the cells of .py and .ipynb differ in kind or number; "
                         f"run `make sync NB={py.stem}`")
    for i, (a, b) in enumerate(zip(src.cells, nb.cells, strict=True)):
        if a.cell_type == "code" and a.source.strip() != b.source.strip():
            raise SystemExit(f"{py.stem}: code cell {i} differs between .py and .ipynb; "
                             f"--markdown-only keeps outputs, so run `make sync NB={py.stem}`")
    changed = False
    for a, b in zip(src.cells, nb.cells, strict=True):
        if a.cell_type == "markdown" and a.source != b.source:
            b.source = a.source
            changed = True
    if changed:
        nbformat.write(nb, ipynb)
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapters such as 01_tokens, or one "
                        "space-separated string of them (default: all)")
    parser.add_argument("--markdown-only", action="store_true", help="copy only the markdown "
                        "cells into the .ipynb, executing nothing (refused if code cells differ)")
    args = parser.parse_args(argv)
    names = [a for arg in args.chapters for a in arg.split()]
    if args.markdown_only:
        for py in chapter_sources(names):
            print(f"{py.stem}: {'markdown updated' if sync_markdown(py) else 'unchanged'}")
        return 0
    # updating the book: its kernels write the committed figures (a reader's run does not)
    os.environ.setdefault("LLMBOOK_FIGURES", str(ROOT / "figures"))
    # string hashing is fixed when the kernel starts: the Makefile exports 0, and a direct run
    # of this tool gives its kernels the same
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for py in chapter_sources(names):
        nb = read_source(py)
        seconds = execute(nb)
        nbformat.write(tidy(nb), py.with_suffix(".ipynb"))
        print(f"{py.stem}: executed in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
