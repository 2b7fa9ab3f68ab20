"""The exercise solutions of notebooks/03_language_modelling hold.

The checks live in the package (``llmbook/workbench/checks/ch03.py``), where ``llmbook
grade 03`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("03_language_modelling")
