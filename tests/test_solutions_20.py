"""The exercise solutions of notebooks/20_grpo hold."""

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

solutions = load_solutions("20_grpo")

pytestmark = pytest.mark.usefixtures("one_thread")

p = sp.Symbol("p", positive=True)


def test_exercise_1_even_votes_gain_nothing():
    for m in range(1, 7):
        assert solutions.even_votes_gain_nothing(m) == 0
    # without the coin (a tie is a loss) an even vote is worse than the odd one before it
    from llmbook.alignment.repeated_sampling import majority_probability_symbolic
    loss_on_tie = sp.expand(majority_probability_symbolic(4).doit() - majority_probability_symbolic(3).doit())
    assert loss_on_tie.subs(p, sp.Rational(7, 10)) < 0
    assert solutions.majority_with_coin_ties_symbolic(2).subs(p, sp.Rational(1, 3)) == sp.Rational(1, 3)


def test_exercise_2_plugin_estimator_is_biased_low():
    assert solutions.plugin_bias(10, 1) == 0
    for k in (2, 5, 10):
        bias = solutions.plugin_bias(10, k)
        values = [bias.subs(p, sp.Rational(j, 10)) for j in range(1, 10)]
        assert all(v < 0 for v in values)
        assert bias.subs(p, 0) == 0 and bias.subs(p, 1) == 0
    # the size of it at n = 10, k = 5, p = 0.1: E[plug-in] = 0.348516424 against 1 - 0.9^5 = 0.40951
    # (the expectation computed independently with fractions: sum_c C(10,c) p^c q^(10-c) (...))
    assert solutions.plugin_bias(10, 5).subs(p, sp.Rational(1, 10)) == sp.Rational(-60993576, 10**9)


def test_exercise_3_difficulty_bias_of_the_std():
    G, q = sp.symbols("G q", positive=True)
    with_std, without = solutions.group_weight_symbolic(True), solutions.group_weight_symbolic(False)
    # both sides are positive (G > 1, 0 < q < 1), so comparing squares suffices
    assert sp.simplify(with_std**2 - 4 * G * (G - 1) * q * (1 - q)) == 0
    assert sp.simplify(without - 2 * G * q * (1 - q)) == 0
    for c in range(1, 8):
        for normalize, expr in ((True, with_std), (False, without)):
            expected = float(expr.subs({G: 8, q: sp.Rational(c, 8)}))
            assert solutions.group_weight(c, 8, normalize) == pytest.approx(expected, rel=1e-12)
    # relative to a 4-of-8 group, a 1-of-8 group weighs sqrt(7)/4 with the std, 7/16 without
    assert solutions.group_weight(1, 8, True) / solutions.group_weight(4, 8, True) == pytest.approx(7**0.5 / 4)
    assert solutions.group_weight(1, 8, False) / solutions.group_weight(4, 8, False) == pytest.approx(7 / 16)
    assert solutions.group_weight(0, 8, True) == 0 and solutions.group_weight(8, 8, False) == 0


def test_exercise_4_naive_accumulation_reweights_tokens():
    lengths = [1, 2, 2, 5, 5, 5, 3, 1]
    predicted = solutions.naive_token_weight_ratio(lengths, 3)
    measured = solutions.measured_token_weight_ratio(lengths, 3)
    torch.testing.assert_close(measured, predicted, rtol=0, atol=1e-12)
    assert predicted[0] > 1 > predicted[3]  # short micro-batches weigh more per token
    equal = solutions.naive_token_weight_ratio([2, 3, 3, 2], 2)  # equal token counts: exact
    torch.testing.assert_close(equal, torch.ones(4, dtype=torch.float64))
