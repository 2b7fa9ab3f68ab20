"""Check every notebook pair (``make check-notebooks``, part of ``make test``).

A chapter passes when ``NN_slug.py`` and ``NN_slug.ipynb`` both exist, their
cells are the same, and the ``.ipynb`` was executed top to bottom (execution
counts 1, 2, 3, ... with no errors in the outputs). Two slips of the source are
caught too: a markdown heading left in a code cell (a missing ``# %% [markdown]``
marker, so the heading shows as a comment) and a control character in a cell (a
non-raw string's ``\b`` or ``\f`` where ``\binom`` or ``\frac`` was meant).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jupytext
from nbpairs import JUPYTEXT, NOTEBOOKS, cell_sources

HEADING_IN_CODE = re.compile(r"^# #{1,6} \S", re.MULTILINE)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def output_texts(out: dict) -> list[str]:
    """The text an output shows: a stream's, and each text/* form of a result or display."""
    texts = [out["text"]] if isinstance(out.get("text"), str) else []
    for mime, value in out.get("data", {}).items():
        if mime.startswith("text/"):
            texts.append(value if isinstance(value, str) else "".join(value))
    return texts


def problems(nb_dir: Path = NOTEBOOKS) -> list[str]:
    """Every problem with the notebook pairs in ``nb_dir``, as readable sentences."""
    found = []
    pys = {p.stem for p in nb_dir.glob("[0-9][0-9]*_*.py")}
    ipynbs = {p.stem for p in nb_dir.glob("[0-9][0-9]*_*.ipynb")}
    if not pys:
        found.append("no notebooks found under notebooks/")
    for stem in sorted(pys ^ ipynbs):
        found.append(f"{stem}: has only one half of its .py/.ipynb pair")
    for stem in sorted(pys & ipynbs):
        src = jupytext.read(nb_dir / f"{stem}.py", fmt="py:percent")
        nb = jupytext.read(nb_dir / f"{stem}.ipynb")
        if cell_sources(src) != cell_sources(nb):
            found.append(f"{stem}: .py and .ipynb cells differ (run `make sync NB={stem}`)")
            continue
        if nb.metadata.get("jupytext") != JUPYTEXT:
            found.append(f"{stem}.ipynb: its jupytext metadata is {nb.metadata.get('jupytext')}, "
                         f"not the book's pairing {JUPYTEXT} (run `make sync NB={stem}`)")
        counts = [c.get("execution_count") for c in nb.cells if c.cell_type == "code"]
        if counts != list(range(1, len(counts) + 1)):
            found.append(f"{stem}.ipynb: not executed top to bottom in one run "
                         f"(execution counts {counts[:8]}...; run `make sync NB={stem}`)")
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code" and HEADING_IN_CODE.search(c.source):
                found.append(f"{stem}: cell {i} is code but holds a markdown heading "
                             f"(a missing '# %% [markdown]' marker?)")
            if CONTROL.search(c.source):
                found.append(f"{stem}: cell {i} holds a control character "
                             f"({CONTROL.search(c.source).group()!r}: a non-raw \\b or \\f?)")
            for out in c.get("outputs", []) if c.cell_type == "code" else []:
                if out.get("output_type") == "error":
                    found.append(f"{stem}.ipynb: a cell raised {out.get('ename')}")
                for text in output_texts(out):
                    if CONTROL.search(text):
                        found.append(f"{stem}.ipynb: an output of cell {i} holds a control character "
                                     f"({CONTROL.search(text).group()!r}: a non-raw \\b or \\f?)")
    return found


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    found = problems()
    for p in found:
        print("notebook check:", p)
    n = len(list(NOTEBOOKS.glob("[0-9][0-9]*_*.py")))
    print(f"checked {n} notebook pairs: {'OK' if not found else f'{len(found)} problem(s)'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
