"""The exercise solutions of notebooks/19b_constitutional_ai hold."""

import pytest
import sympy as sp
from solution_loader import load_solutions

solutions = load_solutions("19b_constitutional_ai")


def test_exercise_1_consistency_of_an_uninformative_judge():
    same, (b, pt) = solutions.consistency_probability()
    assert sp.simplify(same.subs(pt, sp.Rational(1, 2)) - (1 - b**2) / 2) == 0
    # an unbiased judge is consistent with probability pt^2 + (1 - pt)^2
    assert sp.simplify(same.subs(b, 0) - (pt**2 + (1 - pt) ** 2)) == 0
    # a judge that always answers by slot is never consistent
    assert sp.simplify(same.subs(b, 1)) == 0
    for bias in (0.0, 0.3, 0.9, 1.0):
        assert solutions.bias_from_consistency((1 - bias**2) / 2) == pytest.approx(bias, abs=1e-12)
    with pytest.raises(ValueError, match="half"):
        solutions.bias_from_consistency(0.7)


def test_exercise_2_an_ai_label_is_worth_a_fraction_of_a_true_label():
    info, true_info = solutions.label_information()
    s, eps, b = sp.Symbol("s", positive=True), sp.Symbol("epsilon", real=True), sp.Symbol("b", real=True)
    assert sp.simplify(true_info - s**2 / 4) == 0
    assert sp.simplify(info / true_info - ((1 - b) * (1 - 2 * eps)) ** 2) == 0
    assert solutions.labels_per_true_label(0.7) == pytest.approx(6.25, abs=1e-12)
    assert solutions.labels_per_true_label(1.0) == pytest.approx(1.0, abs=1e-12)
    assert solutions.labels_per_true_label(0.9, bias=0.5) == pytest.approx(1 / (0.5 * 0.8) ** 2, abs=1e-12)
