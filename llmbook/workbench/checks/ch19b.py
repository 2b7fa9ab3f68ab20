"""Checks of chapter 19b's exercises (notebooks/19b_constitutional_ai), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the closed forms written here in SymPy (a judge's consistency at p_t = 1/2, with
no bias and with full bias; the information of a true and of a noisy, biased label), the
round trip bias -> consistency -> bias, and the label counts they imply.
"""

from __future__ import annotations

import sympy as sp

from llmbook.workbench.checks import raises


def exercise_1_consistency_of_an_uninformative_judge(solutions) -> None:
    same, (b, pt) = solutions.consistency_probability()
    at_half, want = same.subs(pt, sp.Rational(1, 2)), (1 - b**2) / 2
    assert sp.simplify(at_half - want) == 0, f"expected the consistency {want} at p_t = 1/2, got {at_half}"
    # an unbiased judge is consistent with probability pt^2 + (1 - pt)^2
    unbiased, want = same.subs(b, 0), pt**2 + (1 - pt) ** 2
    assert sp.simplify(unbiased - want) == 0, f"expected the consistency {want} with no bias, got {unbiased}"
    # a judge that always answers by slot is never consistent
    by_slot = sp.simplify(same.subs(b, 1))
    assert by_slot == 0, f"expected the consistency 0 for a judge that answers by slot (b = 1), got {by_slot}"
    for bias in (0.0, 0.3, 0.9, 1.0):
        got = solutions.bias_from_consistency((1 - bias**2) / 2)
        assert abs(got - bias) <= 1e-12, (
            f"expected bias_from_consistency((1 - b^2)/2) to give back b = {bias} (to 1e-12), got {got!r}")
    with raises(ValueError, match="half", what="bias_from_consistency(0.7)"):
        solutions.bias_from_consistency(0.7)


def exercise_2_an_ai_label_is_worth_a_fraction_of_a_true_label(solutions) -> None:
    info, true_info = solutions.label_information()
    s, eps, b = sp.Symbol("s", positive=True), sp.Symbol("epsilon", real=True), sp.Symbol("b", real=True)
    want = s**2 / 4
    assert sp.simplify(true_info - want) == 0, f"expected a true label's information {want}, got {true_info}"
    ratio, want = info / true_info, ((1 - b) * (1 - 2 * eps)) ** 2
    assert sp.simplify(ratio - want) == 0, f"expected an AI label's share of it {want}, got {sp.simplify(ratio)}"
    for args, kwargs, want in (((0.7,), {}, 6.25), ((1.0,), {}, 1.0), ((0.9,), {"bias": 0.5}, 1 / (0.5 * 0.8) ** 2)):
        got = solutions.labels_per_true_label(*args, **kwargs)
        assert abs(got - want) <= 1e-12, (
            f"expected labels_per_true_label({args[0]}, {kwargs}) = {want!r} (to 1e-12), got {got!r}")
