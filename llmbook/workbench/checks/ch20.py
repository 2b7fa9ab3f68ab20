"""Checks of chapter 20's exercises (notebooks/20_grpo), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's majority-vote probability
(:func:`llmbook.alignment.repeated_sampling.majority_probability_symbolic`), the plug-in
estimator's expectation computed independently with fractions, the vote's probability
summed over the count of right votes, the group weights written
here in SymPy, and the per-token weights measured from the gradients of the
micro-batch means (``torch.testing.assert_close``).
"""

from __future__ import annotations

import sympy as sp
import torch

from llmbook.alignment.repeated_sampling import majority_probability_symbolic

p = sp.Symbol("p", positive=True)


def exercise_1_even_votes_gain_nothing(solutions) -> None:
    for m in range(1, 7):
        gain = solutions.even_votes_gain_nothing(m)
        assert gain == 0, f"expected the vote of {2 * m} (ties by a coin) to gain nothing over {2 * m - 1}, got {gain}"
    # without the coin (a tie is a loss) an even vote is worse than the odd one before it
    loss_on_tie = sp.expand(majority_probability_symbolic(4).doit() - majority_probability_symbolic(3).doit())
    at_seven_tenths = loss_on_tie.subs(p, sp.Rational(7, 10))
    assert at_seven_tenths < 0, (
        f"expected a vote of 4 (a tie loses) to be worse than a vote of 3 at p = 7/10, got the change {at_seven_tenths}")
    got = solutions.majority_with_coin_ties_symbolic(2).subs(p, sp.Rational(1, 3))
    assert got == sp.Rational(1, 3), f"expected a vote of 2 with coin ties to be right with p = 1/3 at p = 1/3, got {got}"
    # the whole polynomial, summed here over the count c of right votes: a strict majority
    # wins, a tie (c = n/2) wins half the time
    for n in range(1, 7):
        want = sum(sp.binomial(n, c) * p**c * (1 - p) ** (n - c)
                   * (1 if 2 * c > n else sp.Rational(1, 2) if 2 * c == n else 0)
                   for c in range(n + 1))
        got = solutions.majority_with_coin_ties_symbolic(n)
        difference = sp.expand(sp.sympify(got).doit() - want)
        assert difference == 0, (
            f"expected the vote of {n} with coin ties to be right with probability {sp.expand(want)}, "
            f"got {sp.expand(sp.sympify(got).doit())}")


def exercise_2_plugin_estimator_is_biased_low(solutions) -> None:
    one = solutions.plugin_bias(10, 1)
    assert one == 0, f"expected no bias at k = 1 (the plug-in is then unbiased), got {one}"
    for k in (2, 5, 10):
        bias = solutions.plugin_bias(10, k)
        values = [bias.subs(p, sp.Rational(j, 10)) for j in range(1, 10)]
        assert all(v < 0 for v in values), (
            f"expected a negative bias at n = 10, k = {k} for p = 0.1 ... 0.9, got {values}")
        ends = (bias.subs(p, 0), bias.subs(p, 1))
        assert ends == (0, 0), f"expected no bias at p = 0 and p = 1 (n = 10, k = {k}), got {ends}"
    # the size of it at n = 10, k = 5, p = 0.1: E[plug-in] = 0.348516424 against 1 - 0.9^5 = 0.40951
    # (the expectation computed independently with fractions: sum_c C(10,c) p^c q^(10-c) (...))
    got, want = solutions.plugin_bias(10, 5).subs(p, sp.Rational(1, 10)), sp.Rational(-60993576, 10**9)
    assert got == want, f"expected the bias {want} at n = 10, k = 5, p = 1/10, got {got}"


def exercise_3_difficulty_bias_of_the_std(solutions) -> None:
    G, q = sp.symbols("G q", positive=True)
    with_std, without = solutions.group_weight_symbolic(True), solutions.group_weight_symbolic(False)
    # both sides are positive (G > 1, 0 < q < 1), so comparing squares suffices
    want = 4 * G * (G - 1) * q * (1 - q)
    assert sp.simplify(with_std**2 - want) == 0, f"expected the square of the weight with the std {want}, got {with_std**2}"
    want = 2 * G * q * (1 - q)
    assert sp.simplify(without - want) == 0, f"expected the weight without the std {want}, got {without}"
    for c in range(1, 8):
        for normalize, expr in ((True, with_std), (False, without)):
            expected = float(expr.subs({G: 8, q: sp.Rational(c, 8)}))
            got = solutions.group_weight(c, 8, normalize)
            assert abs(got - expected) <= max(1e-12 * abs(expected), 1e-12), (
                f"expected group_weight({c}, 8, {normalize}) = {expected!r} (to 1e-12 relative), got {got!r}")
    # relative to a 4-of-8 group, a 1-of-8 group weighs sqrt(7)/4 with the std, 7/16 without
    for normalize, want in ((True, 7**0.5 / 4), (False, 7 / 16)):
        ratio = solutions.group_weight(1, 8, normalize) / solutions.group_weight(4, 8, normalize)
        assert abs(ratio - want) <= max(1e-6 * abs(want), 1e-12), (
            f"expected a 1-of-8 group to weigh {want!r} x a 4-of-8 group (normalize={normalize}, "
            f"to 1e-6 relative), got {ratio!r}")
    ends = (solutions.group_weight(0, 8, True), solutions.group_weight(8, 8, False))
    assert ends == (0, 0), f"expected no weight for a group all wrong (with the std) or all right (without), got {ends}"


def exercise_4_naive_accumulation_reweights_tokens(solutions) -> None:
    lengths = [1, 2, 2, 5, 5, 5, 3, 1]
    predicted = solutions.naive_token_weight_ratio(lengths, 3)
    measured = solutions.measured_token_weight_ratio(lengths, 3)
    torch.testing.assert_close(measured, predicted, rtol=0, atol=1e-12,
                               msg=lambda m: f"expected the measured token weights to be the predicted ones: {m}")
    short, long = float(predicted[0]), float(predicted[3])
    assert short > 1 > long, (  # short micro-batches weigh more per token
        f"expected a token of a short micro-batch to weigh more than 1 and one of a long one less, "
        f"got {short!r} and {long!r}")
    equal = solutions.naive_token_weight_ratio([2, 3, 3, 2], 2)  # equal token counts: exact
    torch.testing.assert_close(equal, torch.ones(4, dtype=torch.float64),
                               msg=lambda m: f"expected every weight 1 with equal token counts per micro-batch: {m}")
