"""The exercise solutions of notebooks/22b_context_parallelism hold.

The checks live in the package (``llmbook/workbench/checks/ch22b.py``), where ``llmbook
grade 22b`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("22b_context_parallelism")
