"""The exercise solutions of notebooks/10d_data_mixtures hold.

The checks live in the package (``llmbook/workbench/checks/ch10d.py``), where ``llmbook
grade 10d`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("10d_data_mixtures")
