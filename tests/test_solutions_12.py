"""The exercise solutions of notebooks/12_decoding hold.

The checks live in the package (``llmbook/workbench/checks/ch12.py``), where ``llmbook
grade 12`` runs them on a reader's answers; here they run on the reference solutions.
"""

from solution_loader import reference_tests

test_the_reference_solutions_pass, test_every_exercise_has_a_check = reference_tests("12_decoding")
