"""The exercise solutions of notebooks/11_scaling_laws hold.

The checks live in the package (``llmbook/workbench/checks/ch11.py``), where ``llmbook
grade 11`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("11_scaling_laws")
