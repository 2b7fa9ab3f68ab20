"""The exercises of every chapter: number, star rating and title, read from the chapters.

Each chapter's ``## Exercises`` markdown cell (in ``notebooks/NN_slug.py``) lists them as
``1. (★★) **Title.** text...``; the rating is optional. :func:`parse_exercises` reads that
list. A wheel does not carry the chapters, so the list is shipped as ``exercises.json``
beside this module, written from the chapters by ``python -m llmbook.workbench.catalogue``
in a source checkout; ``tests/test_workbench.py`` fails when it differs from the chapters.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from llmbook.paths import source_checkout

__all__ = ["CATALOGUE", "Exercise", "catalogue", "exercises_from_notebooks", "exercises_of",
           "main", "parse_exercises"]

#: The shipped list, ``{stem: [Exercise as a dict, ...]}``.
CATALOGUE = Path(__file__).resolve().parent / "exercises.json"

_ITEM = re.compile(r"^# (\d+)\. (?:\((★+)\) )?\*\*(.+?)\*\*", re.MULTILINE)


@dataclass(frozen=True)
class Exercise:
    """One exercise: its number in the chapter, its rating (1-3 stars; None if unrated), title."""

    number: int
    stars: int | None
    title: str

    @property
    def plain_title(self) -> str:
        """The title for a terminal: inline TeX without its dollars and backslashes
        (``The spread of $\\cos^2$`` -> ``The spread of cos^2``), markdown's ``**`` and backticks dropped."""
        def plain(m: re.Match[str]) -> str:
            tex = re.sub(r"\\(?:mathrm|text|operatorname|mathbf|mathcal)\{([^}]*)\}", r"\1", m.group(1))
            return re.sub(r"\\([A-Za-z]+)", r"\1", tex).replace("{", "").replace("}", "")

        text = re.sub(r"\$([^$]*)\$", plain, self.title)
        return text.replace("**", "").replace("`", "").replace("\\", "")


def parse_exercises(notebook_source: str) -> list[Exercise]:
    """The exercises listed in a py:percent chapter's ``## Exercises`` cell, in order.

    The section runs from its heading to the next cell (``# %%``) or heading; a chapter
    without one has no exercises (an empty list).
    """
    if not isinstance(notebook_source, str):
        raise TypeError(f"notebook_source must be a str, got {type(notebook_source).__name__}")
    start = re.search(r"^# ## Exercises\s*$", notebook_source, re.MULTILINE)
    if start is None:
        return []
    rest = notebook_source[start.end():]
    end = re.search(r"^# %%|^# #{1,3} ", rest, re.MULTILINE)
    section = rest[: end.start()] if end else rest
    return [Exercise(int(n), len(stars) if stars else None, title.strip().rstrip(".").strip())
            for n, stars, title in _ITEM.findall(section)]


def exercises_from_notebooks(notebooks: Path) -> dict[str, list[Exercise]]:
    """:func:`parse_exercises` of every chapter ``NN_slug.py`` in the folder ``notebooks``."""
    found = {}
    for path in sorted(notebooks.glob("[0-9][0-9]*_*.py")):
        found[path.stem] = parse_exercises(path.read_text(encoding="utf-8"))
    return found


def _chapters() -> dict[str, list[Exercise]]:
    raw = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    return {stem: [Exercise(**e) for e in items] for stem, items in raw["chapters"].items()}


def exercises_of(stem: str) -> list[Exercise]:
    """The exercises of one chapter, or of one build-it-yourself unit (its checks module's
    ``EXERCISES``), without reading any other unit's; [] for a stem with none."""
    from llmbook.workbench.checks import build_exercises
    from llmbook.workbench.solutions import is_build

    if is_build(stem):
        try:
            listed = build_exercises(stem)
        except ValueError:
            return []
        return [Exercise(n, stars, title) for n, (stars, title) in listed.items()]
    return _chapters().get(stem, [])


def catalogue() -> dict[str, list[Exercise]]:
    """The shipped list of every chapter's exercises, ``{stem: [Exercise, ...]}``, followed by
    the build-it-yourself units' (``build2_transformer``), read from their checks modules."""
    from llmbook.workbench.solutions import build_stems

    found = _chapters()
    for stem in build_stems():
        listed = exercises_of(stem)
        if listed:
            found[stem] = listed
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m llmbook.workbench.catalogue``: rewrite ``exercises.json`` from the chapters."""
    parser = argparse.ArgumentParser(
        prog="python -m llmbook.workbench.catalogue",
        description="Rewrite llmbook/workbench/exercises.json from the chapters' Exercises "
                    "sections (a source checkout only; takes a second).")
    parser.parse_args(argv)
    root = source_checkout()
    if root is None:
        print("the chapters live in a source checkout; this is an installed package")
        return 1
    chapters = exercises_from_notebooks(root / "notebooks")
    text = json.dumps({"about": "written by python -m llmbook.workbench.catalogue from "
                                "notebooks/NN_slug.py",
                       "chapters": {s: [asdict(e) for e in items] for s, items in chapters.items()}},
                      indent=1, ensure_ascii=False)
    CATALOGUE.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {CATALOGUE} ({sum(map(len, chapters.values()))} exercises, "
          f"{len(chapters)} chapters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
