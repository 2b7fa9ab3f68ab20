"""Load the reference solutions of a chapter's exercises (``notebooks/solutions/NN_slug.py``).

One loader for the tests and the reader's grader: :func:`llmbook.workbench.solutions.load_solutions`.
"""

from __future__ import annotations

from pathlib import Path

from llmbook.workbench.solutions import load_solutions

__all__ = ["SOLUTIONS", "load_solutions"]

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions"
