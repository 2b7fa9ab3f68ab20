"""The exercise solutions of notebooks/17b_chat_finetuning hold.

The checks live in the package (``llmbook/workbench/checks/ch17b.py``), where ``llmbook
grade 17b`` runs them on a reader's answers; here they run on the reference solutions.
"""

import pytest
from solution_loader import reference_tests

pytestmark = pytest.mark.usefixtures("one_thread")
test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("17b_chat_finetuning")
