"""Load the reference solutions of a chapter's exercises (``notebooks/solutions/NN_slug.py``),
and the tests that run a chapter's packaged checks on them.

One loader for the tests and the reader's grader: :func:`llmbook.workbench.solutions.load_solutions`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llmbook.workbench.solutions import load_solutions

__all__ = ["SOLUTIONS", "load_solutions", "reference_tests"]

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions"


def reference_tests(stem: str) -> tuple[Callable, Callable]:
    """The two tests of a chapter whose checks live in ``llmbook/workbench/checks/chNN.py``:
    every check passes on the reference solutions (one test per check), and every exercise
    of the chapter's list has a check. A test file binds them to ``test_*`` names."""
    from llmbook.workbench.catalogue import catalogue
    from llmbook.workbench.checks import checks_for

    solutions = load_solutions(stem)
    checks = [c for by_exercise in checks_for(stem).values() for c in by_exercise]

    @pytest.mark.parametrize("check", checks, ids=[c.name for c in checks])
    def the_reference_solutions_pass(check) -> None:
        check.run(solutions)

    def every_exercise_has_a_check() -> None:
        assert sorted({c.exercise for c in checks}) == [e.number for e in catalogue()[stem]]

    return the_reference_solutions_pass, every_exercise_has_a_check
