"""Build hook: the wheel carries the book's data as ``llmbook/_data/``.

Everything else about the package is in ``pyproject.toml``. The repository keeps its data
in one place, ``data/`` at the root (the notebooks, ``make models`` and the tests use it
there); a non-editable build copies the files a reader's code loads into the package, where
:func:`llmbook.paths.data_dir` finds them once the repository is gone. The scripts that
rebuild the data (``data/make_*.py``) stay in the repository.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = Path(__file__).resolve().parent / "data"


def shipped_files(data: Path = DATA) -> list[Path]:
    """The files under ``data/`` that go into the wheel: all but the scripts and caches."""
    return sorted(p for p in data.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts
                  and not (p.suffix == ".py" and p.name.startswith("make_")))


class BuildWithData(build_py):
    """``build_py`` that also copies ``data/`` into ``<build>/llmbook/_data/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads data/ in the checkout itself
        target = Path(self.build_lib) / "llmbook" / "_data"
        for src in shipped_files():
            dst = target / src.relative_to(DATA)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)


if __name__ == "__main__":  # as pip and setuptools run it; tests import shipped_files
    setup(cmdclass={"build_py": BuildWithData})
