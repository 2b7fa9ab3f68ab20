"""The exercise solutions of notebooks/09_optimisers hold.

The checks live in the package (``llmbook/workbench/checks/ch09.py``), where ``llmbook
grade 09`` runs them on a reader's answers; here they run on the reference solutions.
"""

import pytest
from solution_loader import reference_tests

pytestmark = pytest.mark.usefixtures("one_thread")
test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("09_optimisers")
