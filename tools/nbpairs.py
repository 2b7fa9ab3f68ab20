"""Shared plumbing for the notebook tools: find the pairs, read them, execute them.

Every chapter is a pair ``notebooks/NN_slug.py`` (py:percent, the source) and
``notebooks/NN_slug.ipynb`` (executed, with outputs). The ``.py`` is the truth.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
TIMEOUT_S = 600


#: The pairing each ``.ipynb`` carries (as ``notebooks/jupytext.toml`` says). The filters
#: matter to JupyterLab: opening a chapter's ``.py`` when its ``.ipynb`` is newer (as after
#: every ``make sync``), jupytext compares the two, and without them it renders the
#: ``.ipynb`` with a metadata header the ``.py`` lacks and refuses to open it.
JUPYTEXT = {"formats": "ipynb,py:percent", "notebook_metadata_filter": "-all",
            "cell_metadata_filter": "tags,-all"}


def chapter_sources(names: list[str] | None = None) -> list[Path]:
    """The chapter sources ``notebooks/NN_*.py``, all of them or the ones named."""
    if not names:
        return sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.py"))
    paths = []
    for name in names:
        p = Path(name)
        p = p if p.suffix == ".py" else p.with_suffix(".py")
        if not p.is_absolute():
            p = (Path.cwd() / p) if (Path.cwd() / p).exists() else NOTEBOOKS / p.name
        if not p.exists():
            raise SystemExit(f"no such notebook source: {name}")
        paths.append(p.resolve())
    return paths


def read_source(py: Path) -> nbformat.NotebookNode:
    """Read a py:percent source as a notebook with the book's kernelspec."""
    nb = jupytext.read(py, fmt="py:percent")
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "jupytext": dict(JUPYTEXT)}
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path = NOTEBOOKS) -> float:
    """Execute ``nb`` in place, top to bottom, in a fresh kernel; return the seconds taken."""
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("PYTHONWARNINGS", "ignore:IProgress not found")  # see the Makefile
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def tidy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Make an executed notebook's file depend only on its cells and their outputs.

    Cell ids become ``cell-<index>`` (jupytext would draw random ones) and the execution
    timestamps nbclient records are dropped, so re-executing an unchanged chapter
    rewrites an identical file and a diff shows only what changed in its outputs.
    """
    nb.metadata.pop("widgets", None)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
        cell.metadata.pop("execution", None)
    return nb


def cell_sources(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]
