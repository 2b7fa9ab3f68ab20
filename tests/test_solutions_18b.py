"""The exercise solutions of notebooks/18b_reward_overoptimisation hold.

The checks live in the package (``llmbook/workbench/checks/ch18b.py``), where ``llmbook
grade 18b`` runs them on a reader's answers; here they run on the reference solutions.
"""

import pytest
from solution_loader import reference_tests

pytestmark = pytest.mark.usefixtures("one_thread")
test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("18b_reward_overoptimisation")
