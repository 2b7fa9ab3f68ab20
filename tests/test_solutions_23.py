"""The exercise solutions of notebooks/23_beyond_attention hold.

The checks live in the package (``llmbook/workbench/checks/ch23.py``), where ``llmbook
grade 23`` runs them on a reader's answers; here they run on the reference solutions.
"""

import pytest
from solution_loader import reference_tests

pytestmark = pytest.mark.usefixtures("one_thread")
test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("23_beyond_attention")
