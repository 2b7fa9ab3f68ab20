"""The exercise solutions of notebooks/18_rlhf_ppo hold.

The checks live in the package (``llmbook/workbench/checks/ch18.py``), where ``llmbook
grade 18`` runs them on a reader's answers; here they run on the reference solutions.
"""

import pytest
from solution_loader import reference_tests

pytestmark = pytest.mark.usefixtures("one_thread")
test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("18_rlhf_ppo")
