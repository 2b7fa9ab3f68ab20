"""The exercise solutions of notebooks/19b_constitutional_ai hold.

The checks live in the package (``llmbook/workbench/checks/ch19b.py``), where ``llmbook
grade 19b`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("19b_constitutional_ai")
