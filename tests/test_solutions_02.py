"""The exercise solutions of notebooks/02_embeddings hold.

The checks live in the package (``llmbook/workbench/checks/ch02.py``), where ``llmbook
grade 02`` runs them on a reader's answers; here they run on the reference solutions.
"""

from __future__ import annotations

import pytest
from solution_loader import load_solutions

from llmbook.workbench.checks import checks_for

STEM = "02_embeddings"
solutions = load_solutions(STEM)
CHECKS = [c for checks in checks_for(STEM).values() for c in checks]


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_the_reference_solutions_pass(check) -> None:
    check.run(solutions)


def test_every_exercise_has_a_check() -> None:
    from llmbook.workbench.catalogue import catalogue

    assert sorted({c.exercise for c in CHECKS}) == [e.number for e in catalogue()[STEM]]
