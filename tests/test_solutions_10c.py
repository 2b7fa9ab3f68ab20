"""The exercise solutions of notebooks/10c_data hold.

The checks live in the package (``llmbook/workbench/checks/ch10c.py``), where ``llmbook
grade 10c`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("10c_data")
