"""The exercise solutions of notebooks/22c_expert_parallelism hold.

The checks live in the package (``llmbook/workbench/checks/ch22c.py``), where ``llmbook
grade 22c`` runs them on a reader's answers; here they run on the reference solutions.
"""

import pytest
from solution_loader import reference_tests

pytestmark = pytest.mark.usefixtures("one_thread")
test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("22c_expert_parallelism")
