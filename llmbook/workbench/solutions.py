"""Where the reference solutions of the exercises are, and loading a module from a file.

Each chapter's reference solutions are one plain module, ``notebooks/solutions/NN_slug.py``
in the repository (``NN`` may carry a letter: ``10b_batch_size``). The names start with
digits, so they are not importable by name: :func:`load_module` executes a file by path.
A wheel carries a copy of the folder as ``llmbook/workbench/_solutions/`` (``setup.py``
copies it at build time, as it copies ``data/``), so grading works without the repository.
:func:`solutions_dir` looks, in order, at the source checkout's ``notebooks/solutions/``
and the wheel's copy.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

from llmbook.paths import source_checkout

__all__ = ["DEFAULT_DIR", "chapter_stems", "load_module", "load_solutions", "resolve_chapter", "solutions_dir"]

#: The reader's workspace when ``llmbook exercises``/``llmbook grade`` get no ``--dir``.
DEFAULT_DIR = Path("llmbook-work")

_PACKAGE = Path(__file__).resolve().parent
_STEM = re.compile(r"(\d\d[a-z]?)_[a-z0-9_]+")


def solutions_dir() -> Path:
    """The folder of the reference solutions: the checkout's, else the wheel's copy."""
    root = source_checkout()
    if root is not None and (root / "notebooks" / "solutions").is_dir():
        return root / "notebooks" / "solutions"
    return _PACKAGE / "_solutions"


def chapter_stems() -> list[str]:
    """Every chapter with reference solutions, in book order: ``["00_preface", ...]``."""
    return sorted(p.stem for p in solutions_dir().glob("*.py") if _STEM.fullmatch(p.stem))


def resolve_chapter(chapter: str | int) -> str:
    """The stem of a chapter given as ``3``, ``"3"``, ``"03"``, ``"10b"`` or its stem.

    Raises ValueError naming the chapters there are when none matches.
    """
    if isinstance(chapter, bool) or not isinstance(chapter, (str, int)):
        raise TypeError(f"chapter must be a number or a name such as '03', got {chapter!r}")
    text = str(chapter).strip().lower()
    m = re.fullmatch(r"(\d{1,2})([a-z]?)", text)
    label = f"{int(m.group(1)):02d}{m.group(2)}" if m else None
    stems = chapter_stems()
    for stem in stems:
        if stem == text or stem.split("_")[0] == label:
            return stem
    labels = ", ".join(s.split("_")[0] for s in stems)
    raise ValueError(f"chapter: no chapter {chapter!r}; the chapters with exercises are {labels}")


def load_module(path: str | Path, name: str) -> ModuleType:
    """Execute the Python file ``path`` as a fresh module called ``name`` and return it.

    The file is only read: no ``__pycache__`` is written beside it. The module is placed in
    ``sys.modules`` while it runs (dataclasses and pickling need that) and stays there.
    """
    path = Path(path)
    source = path.read_bytes()
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_solutions(stem: str) -> ModuleType:
    """Import the reference solutions of chapter ``stem`` (e.g. ``"03_language_modelling"``)."""
    path = solutions_dir() / f"{stem}.py"
    if not path.is_file():
        raise ValueError(f"stem: no reference solutions {path}")
    return load_module(path, f"solutions_{stem.split('_')[0]}")
