"""The exercise solutions of notebooks/14_flash_attention hold.

The checks live in the package (``llmbook/workbench/checks/ch14.py``), where ``llmbook
grade 14`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("14_flash_attention")
