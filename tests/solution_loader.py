"""Load the reference solutions of a chapter's exercises (``notebooks/solutions/NN_slug.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions"


def load_solutions(stem: str) -> ModuleType:
    """Import ``notebooks/solutions/<stem>.py`` (a plain module, not a package) by path."""
    spec = importlib.util.spec_from_file_location(f"solutions_{stem.split('_')[0]}", SOLUTIONS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
