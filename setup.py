"""Build hook: the wheel carries the book's data as ``llmbook/_data/``.

Everything else about the package is in ``pyproject.toml``. The repository keeps its data
in one place, ``data/`` at the root (the notebooks, ``make models`` and the tests use it
there); a non-editable build copies the files a reader's code loads into the package, where
:func:`llmbook.paths.data_dir` finds them once the repository is gone. The scripts that
rebuild the data (``data/make_*.py``) stay in the repository. The exercises' reference
solutions (``notebooks/solutions/NN_slug.py``) go in as ``llmbook/workbench/_solutions/``,
where the grader (``llmbook grade``, :mod:`llmbook.workbench.solutions`) finds them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = Path(__file__).resolve().parent / "data"
SOLUTIONS = Path(__file__).resolve().parent / "notebooks" / "solutions"


def shipped_solutions(solutions: Path = SOLUTIONS) -> list[Path]:
    """The reference solutions that go into the wheel: ``notebooks/solutions/NN_slug.py``."""
    return sorted(solutions.glob("[0-9][0-9]*_*.py"))


def shipped_files(data: Path = DATA) -> list[Path]:
    """The files under ``data/`` that go into the wheel: all but the scripts and caches."""
    return sorted(p for p in data.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts
                  and not (p.suffix == ".py" and p.name.startswith("make_")))


class BuildWithData(build_py):
    """``build_py`` that also copies ``data/`` into ``<build>/llmbook/_data/`` and the
    reference solutions into ``<build>/llmbook/workbench/_solutions/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads data/ in the checkout itself
        target = Path(self.build_lib) / "llmbook" / "_data"
        for src in shipped_files():
            dst = target / src.relative_to(DATA)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        solutions = Path(self.build_lib) / "llmbook" / "workbench" / "_solutions"
        solutions.mkdir(parents=True, exist_ok=True)
        for src in shipped_solutions():
            shutil.copyfile(src, solutions / src.name)


if __name__ == "__main__":  # as pip and setuptools run it; tests import shipped_files
    setup(cmdclass={"build_py": BuildWithData})
