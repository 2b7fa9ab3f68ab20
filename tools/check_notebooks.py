"""Check every notebook pair (``make check-notebooks``, part of ``make test``).

A chapter passes when ``NN_slug.py`` and ``NN_slug.ipynb`` both exist, their
cells are the same, and the ``.ipynb`` was executed top to bottom (execution
counts 1, 2, 3, ... with no errors in the outputs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
from nbpairs import NOTEBOOKS, cell_sources


def problems(nb_dir: Path = NOTEBOOKS) -> list[str]:
    """Every problem with the notebook pairs in ``nb_dir``, as readable sentences."""
    found = []
    pys = {p.stem for p in nb_dir.glob("[0-9][0-9]_*.py")}
    ipynbs = {p.stem for p in nb_dir.glob("[0-9][0-9]_*.ipynb")}
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
        counts = [c.get("execution_count") for c in nb.cells if c.cell_type == "code"]
        if counts != list(range(1, len(counts) + 1)):
            found.append(f"{stem}.ipynb: not executed top to bottom in one run "
                         f"(execution counts {counts[:8]}...; run `make sync NB={stem}`)")
        for c in nb.cells:
            for out in c.get("outputs", []) if c.cell_type == "code" else []:
                if out.get("output_type") == "error":
                    found.append(f"{stem}.ipynb: a cell raised {out.get('ename')}")
    return found


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    found = problems()
    for p in found:
        print("notebook check:", p)
    n = len(list(NOTEBOOKS.glob("[0-9][0-9]_*.py")))
    print(f"checked {n} notebook pairs: {'OK' if not found else f'{len(found)} problem(s)'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
