"""Where the reference solutions of the exercises are, and loading a module from a file.

Each chapter's reference solutions are one plain module, ``notebooks/solutions/NN_slug.py``
in the repository (``NN`` may carry a letter: ``10b_batch_size``). The names start with
digits, so they are not importable by name: :func:`load_module` executes a file by path.
A wheel carries a copy of the folder as ``llmbook/workbench/_solutions/`` (``setup.py``
copies it at build time, as it copies ``data/``), so grading works without the repository.
:func:`solutions_dir` looks, in order, at the source checkout's ``notebooks/solutions/``
and the wheel's copy.

The build-it-yourself track (one unit per Part of the book, in which the reader writes the
Part's core: a BPE tokenizer, a transformer block, AdamW, ...) is graded the same way. Its
units are named ``buildN_slug`` (``build2_transformer``; ``build-II`` on the command line),
and their references, the book's own implementations plugged in, live in the package
(``llmbook/workbench/units/``), so a wheel has them without a copy.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

from llmbook.paths import source_checkout

__all__ = ["BUILD_PARTS", "DEFAULT_DIR", "build_stems", "chapter_stems", "is_build", "label",
           "load_module", "load_solutions", "resolve_chapter", "solution_path", "solutions_dir",
           "unit_stems"]

#: The reader's workspace when ``llmbook exercises``/``llmbook grade`` get no ``--dir``.
DEFAULT_DIR = Path("llmbook-work")

_PACKAGE = Path(__file__).resolve().parent
_STEM = re.compile(r"(\d\d[a-z]?)_[a-z0-9_]+")
_BUILD = re.compile(r"build([1-9])_[a-z0-9_]+")
_ROMAN = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX")

#: The build-it-yourself track's units, one per Part of the book, in order.
BUILD_PARTS = ("build1_tokenizer", "build2_transformer", "build3_training", "build4_inference",
               "build5_alignment", "build6_distributed")


def solutions_dir() -> Path:
    """The folder of the reference solutions: the checkout's, else the wheel's copy."""
    root = source_checkout()
    if root is not None and (root / "notebooks" / "solutions").is_dir():
        return root / "notebooks" / "solutions"
    return _PACKAGE / "_solutions"


def chapter_stems() -> list[str]:
    """Every chapter with reference solutions, in book order: ``["00_preface", ...]``."""
    return sorted(p.stem for p in solutions_dir().glob("*.py") if _STEM.fullmatch(p.stem))


def is_build(stem: str) -> bool:
    """Whether ``stem`` names a unit of the build-it-yourself track (``build2_transformer``)."""
    return _BUILD.fullmatch(stem) is not None


def build_stems() -> list[str]:
    """The build-it-yourself units whose reference is in the package, in Part order."""
    return [s for s in BUILD_PARTS if (_PACKAGE / "units" / f"{s}.py").is_file()]


def unit_stems() -> list[str]:
    """Everything the grader grades: the chapters, then the build-it-yourself units."""
    return chapter_stems() + build_stems()


def label(stem: str) -> str:
    """What the reader types for ``stem``: ``"03"`` for a chapter, ``"build-II"`` for a unit."""
    m = _BUILD.fullmatch(stem)
    return f"build-{_ROMAN[int(m.group(1)) - 1]}" if m else stem.split("_")[0]


def solution_path(stem: str) -> Path:
    """The file of ``stem``'s reference: ``notebooks/solutions/NN_slug.py`` for a chapter,
    ``llmbook/workbench/units/buildN_slug.py`` for a build-it-yourself unit."""
    return (_PACKAGE / "units" if is_build(stem) else solutions_dir()) / f"{stem}.py"


def resolve_chapter(chapter: str | int) -> str:
    """The stem of a chapter given as ``3``, ``"3"``, ``"03"``, ``"10b"`` or its stem, or of a
    build-it-yourself unit given as ``"build-II"``, ``"build-2"``, ``"build2"`` or its stem.

    Raises ValueError naming the chapters and units there are when none matches.
    """
    if isinstance(chapter, bool) or not isinstance(chapter, (str, int)):
        raise TypeError(f"chapter must be a number or a name such as '03', got {chapter!r}")
    text = str(chapter).strip().lower()
    m = re.fullmatch(r"(\d{1,2})([a-z]?)", text)
    wanted = f"{int(m.group(1)):02d}{m.group(2)}" if m else None
    b = re.fullmatch(r"build[-_ ]?(?:([1-9])|([ivx]+))", text)
    if b is not None:
        roman = [r.lower() for r in _ROMAN]
        part = int(b.group(1)) if b.group(1) else (roman.index(b.group(2)) + 1
                                                   if b.group(2) in roman else 0)
        wanted = f"build{part}"
    stems = unit_stems()
    for stem in stems:
        if stem == text or stem.split("_")[0] == wanted:
            return stem
    labels = ", ".join(label(s) for s in stems)
    raise ValueError(f"chapter: no chapter or build unit {chapter!r}; there are {labels}")


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
    """Import the reference solutions of chapter ``stem`` (e.g. ``"03_language_modelling"``),
    or the reference of a build-it-yourself unit (``"build2_transformer"``)."""
    path = solution_path(stem)
    if not path.is_file():
        raise ValueError(f"stem: no reference solutions {path}")
    return load_module(path, f"solutions_{stem.split('_')[0]}")
