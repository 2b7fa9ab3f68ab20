"""Tests for llmbook.alignment.repeated_sampling: voting, pass@k, best-of-N and their formulas.

Each formula is checked three ways where it can be: its SymPy form against its float form,
against an independent computation (exact fractions with ``math.comb``; torch's Binomial
distribution; Monte Carlo draws), and on worked examples with numbers found by hand.
"""

import math
from fractions import Fraction

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.repeated_sampling import (
    expected_max_gaussian,
    expected_max_uniform_symbolic,
    expected_pass_at_k_symbolic,
    hoeffding_majority_bound,
    majority_probability,
    majority_probability_symbolic,
    pass_at_k,
    pass_at_n,
    plurality,
    plurality_vote,
    vote_accuracy,
)

pytestmark = pytest.mark.usefixtures("one_thread")

p = sp.Symbol("p", positive=True)


# ---------------------------------------------------------------- voting


def test_plurality_any_hashable_and_generators():
    assert plurality(["b", "a", "a", None, "b"]) == "a"  # tie: "a" reached two votes first
    assert plurality(iter([(1, 2), None, (1, 2)])) == (1, 2)
    assert plurality([]) is None and plurality([None]) is None
    assert plurality([1.5, 2.5, 2.5]) == 2.5


@given(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=1, max_size=30))
def test_plurality_is_a_mode_reached_first(answers):
    winner = plurality(answers)
    given_ = [a for a in answers if a is not None]
    if not given_:
        assert winner is None
        return
    counts = {a: given_.count(a) for a in given_}
    top = max(counts.values())
    assert counts[winner] == top
    # among the modes, the winner is the one whose top-th occurrence comes first
    def reach(a):
        seen = 0
        for i, x in enumerate(answers):
            seen += x == a
            if seen == top:
                return i
    assert reach(winner) == min(reach(a) for a in counts if counts[a] == top)
    assert plurality_vote(answers) == winner


def test_plurality_vote_examples():
    assert plurality_vote([3, 5, 3]) == 3
    assert plurality_vote([5, None, None, None]) == 5  # "no answer" never wins
    assert plurality_vote([None, None]) is None
    assert plurality_vote([4, 7, 7, 4]) == 7  # tie: 7 reached two votes first
    assert plurality_vote([4, 7, 4, 7]) == 4
    assert plurality_vote([9]) == 9
    with pytest.raises(ValueError, match="empty"):
        plurality_vote([])
    with pytest.raises(TypeError, match="ints or None"):
        plurality_vote([1, "1"])
    with pytest.raises(TypeError, match="sequence"):
        plurality_vote("123")


def test_vote_accuracy_by_hand():
    answers = [[1, 1, 2, 2, 2, 2], [5, 6, 5, None, 6, 6]]
    truths = [2, 5]
    assert vote_accuracy(answers, truths, 1) == pytest.approx(6 / 12)  # 4 of 6 and 2 of 6 right
    # blocks of 3: [1,1,2] -> 1 (no), [2,2,2] -> 2 (yes); [5,6,5] -> 5 (yes), [None,6,6] -> 6 (no)
    assert vote_accuracy(answers, truths, 3) == 0.5
    # blocks of 2: [1,1] no, [2,2] yes, [2,2] yes; [5,6] -> 5 yes, [5,None] yes, [6,6] no
    assert vote_accuracy(answers, truths, 2) == pytest.approx(4 / 6)
    assert vote_accuracy(answers, truths, 4) == 0.5  # [1,1,2,2] -> 1; [5,6,5,None] -> 5
    with pytest.raises(ValueError, match="fewer than num_votes"):
        vote_accuracy(answers, truths, 7)
    with pytest.raises(ValueError, match="one list of answers per truth"):
        vote_accuracy(answers, truths[:1], 1)
    with pytest.raises(ValueError, match="num_votes"):
        vote_accuracy(answers, truths, 0)


def test_majority_vote_of_two_answers_matches_the_formula_by_simulation():
    """Two possible answers, right with p = 0.6: the vote's accuracy is P_n(p)."""
    g = gen(0)
    for n in (1, 5, 11):
        right = torch.rand(4000, n, generator=g) < 0.6
        answers = [[1 if r else 0 for r in row] for row in right.tolist()]
        measured = vote_accuracy(answers, [1] * 4000, n)
        se = math.sqrt(0.25 / 4000)
        assert abs(measured - majority_probability(0.6, n)) < 4 * se


# ---------------------------------------------------------------- majority formula


def test_majority_probability_closed_forms():
    assert sp.expand(majority_probability_symbolic(1).doit() - p) == 0
    assert sp.expand(majority_probability_symbolic(3).doit() - (3 * p**2 - 2 * p**3)) == 0
    assert sp.expand(majority_probability_symbolic(5).doit() - (10 * p**3 - 15 * p**4 + 6 * p**5)) == 0
    assert sp.expand(majority_probability_symbolic(4).doit() - (4 * p**3 - 3 * p**4)) == 0  # tie = loss
    for n in (1, 3, 7, 9):  # odd n, p = 1/2: a fair coin
        assert majority_probability_symbolic(n).doit().subs(p, sp.Rational(1, 2)) == sp.Rational(1, 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 25), st.floats(0, 1))
def test_majority_probability_matches_torch_binomial(n, prob):
    """Peer: torch.distributions.Binomial's probability mass, summed over k > n/2."""
    pmf = torch.distributions.Binomial(n, torch.tensor(prob, dtype=torch.float64)).log_prob(
        torch.arange(n + 1, dtype=torch.float64)).exp()
    expected = pmf[n // 2 + 1:].sum().item()
    assert majority_probability(prob, n) == pytest.approx(expected, abs=1e-12)


def test_majority_probability_symbolic_and_numeric_agree_and_tensors_work():
    probs = torch.tensor([0.0, 0.2, 0.5, 0.7, 1.0], dtype=torch.float64)
    for n in (2, 6, 9):
        expr = sp.lambdify(p, majority_probability_symbolic(n).doit())
        expected = [float(expr(v)) for v in probs.tolist()]
        got = majority_probability(probs, n)
        assert got.shape == (5,) and got.dtype == torch.float64
        assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-14)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        majority_probability(1.5, 3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        majority_probability(torch.tensor([0.5, -0.1]), 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        majority_probability(0.5, 0)


def test_majority_tends_to_zero_or_one_and_hoeffding_bounds_it():
    for prob in (0.55, 0.7, 0.9):
        values = [majority_probability(prob, n) for n in (1, 11, 51, 201)]
        assert values == sorted(values) and values[-1] > 0.9
        wrong = [majority_probability(1 - prob, n) for n in (1, 11, 51, 201)]
        assert wrong == sorted(wrong, reverse=True) and wrong[-1] < 0.1
        for n in (1, 10, 11, 50, 51, 200):
            assert 1 - majority_probability(prob, n) <= hoeffding_majority_bound(prob, n) + 1e-15
    assert hoeffding_majority_bound(0.5, 10) == 1.0
    # worked values of exp(-2 n (p - 1/2)^2): 2 * 50 * 0.1^2 = 1, 2 * 10 * 0.4^2 = 3.2, and the
    # bound falls to 0 as n grows (e^-100 at n = 5000)
    assert hoeffding_majority_bound(0.6, 50) == pytest.approx(math.exp(-1), rel=1e-13)
    assert hoeffding_majority_bound(0.4, 50) == pytest.approx(math.exp(-1), rel=1e-13)
    assert hoeffding_majority_bound(0.9, 10) == pytest.approx(math.exp(-3.2), rel=1e-13)
    assert hoeffding_majority_bound(0.6, 5000) == pytest.approx(math.exp(-100), rel=1e-11)


# ---------------------------------------------------------------- best-of-N and pass@k


def test_pass_at_n():
    assert pass_at_n(0.5, 3) == pytest.approx(7 / 8)
    assert pass_at_n(0.0, 10) == 0.0 and pass_at_n(1.0, 1) == 1.0
    got = pass_at_n(torch.tensor([0.1, 0.5]), 2)
    assert torch.allclose(got, torch.tensor([0.19, 0.75], dtype=torch.float64), atol=1e-15)
    # against the binomial probability of at least one success, summed term by term by SymPy
    k = sp.Symbol("k", integer=True)
    for n in (1, 5, 12):
        at_least_one = sp.Sum(sp.binomial(n, k) * p**k * (1 - p) ** (n - k), (k, 1, n)).doit()
        for value in (sp.Rational(1, 10), sp.Rational(1, 2), sp.Rational(7, 8)):
            want = float(at_least_one.subs(p, value))
            assert pass_at_n(float(value), n) == pytest.approx(want, rel=1e-14, abs=1e-15)
    with pytest.raises(ValueError, match="n must be >= 1"):
        pass_at_n(0.5, 0)


def exact_pass_at_k(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_equals_the_exact_binomial_ratio():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-14)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # k = 1: the fraction right
    assert pass_at_k(10, 3, 2) == pytest.approx(8 / 15)  # 1 - C(7,2)/C(10,2) = 1 - 21/45
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0
    assert pass_at_k(1000, 1, 1000) == pytest.approx(1.0)  # no overflow for large n


def test_pass_at_k_on_tensors_matches_scalars():
    c = torch.tensor([0, 1, 5, 19, 20])
    for k in (1, 4, 20):
        got = pass_at_k(20, c, k)
        assert got.dtype == torch.float64 and got.shape == (5,)
        expected = [pass_at_k(20, int(ci), k) for ci in c]
        assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-14)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.data())
def test_pass_at_k_is_monotone_in_k_and_c(n, data):
    c = data.draw(st.integers(0, n - 1))
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-15 for a, b in zip(values, values[1:], strict=False))
    assert all(pass_at_k(n, c, k) <= pass_at_k(n, c + 1, k) + 1e-15 for k in range(1, n + 1))


def test_pass_at_k_is_unbiased():
    for n in (1, 4, 7):
        for k in range(1, n + 1):
            assert sp.expand(expected_pass_at_k_symbolic(n, k) - (1 - (1 - p) ** k)) == 0
    g = gen(1)  # and by simulation: n = 10 samples with p = 0.3, k = 4
    c = (torch.rand(20000, 10, generator=g) < 0.3).sum(1)
    estimate = pass_at_k(10, c, 4)
    assert abs(estimate.mean().item() - (1 - 0.7**4)) < 4 * estimate.std().item() / math.sqrt(20000)


def test_pass_at_k_bad_inputs():
    with pytest.raises(ValueError, match="exceeds num_samples"):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError, match="num_correct=6 exceeds"):
        pass_at_k(5, 6, 2)
    with pytest.raises(ValueError, match="num_correct must be >= 0"):
        pass_at_k(5, -1, 2)
    with pytest.raises(TypeError, match="integers"):
        pass_at_k(5, torch.tensor([1.0]), 2)
    with pytest.raises(ValueError, match=r"\[0, 5\]"):
        pass_at_k(5, torch.tensor([1, 6]), 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(5, 1, 0)
    with pytest.raises(ValueError, match="exceeds n"):
        expected_pass_at_k_symbolic(3, 4)


def test_expected_max_of_uniforms():
    N = sp.Symbol("N", positive=True)
    assert sp.simplify(expected_max_uniform_symbolic() - N / (N + 1)) == 0
    draws = torch.rand(20000, 5, generator=gen(2), dtype=torch.float64).max(1).values
    assert abs(draws.mean().item() - 5 / 6) < 4 * draws.std().item() / math.sqrt(20000)


def test_expected_max_of_gaussians():
    assert abs(expected_max_gaussian(1)) < 1e-12
    assert expected_max_gaussian(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-12)
    assert expected_max_gaussian(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-12)
    draws = torch.randn(20000, 10, generator=gen(3), dtype=torch.float64).max(1).values
    assert abs(draws.mean().item() - expected_max_gaussian(10)) < 4 * draws.std().item() / math.sqrt(20000)
    ratios = [expected_max_gaussian(n) / math.sqrt(2 * math.log(n)) for n in (10, 100, 10_000)]
    assert ratios == sorted(ratios) and 0.8 < ratios[-1] < 1
    with pytest.raises(TypeError, match="int"):
        expected_max_gaussian(2.0)
