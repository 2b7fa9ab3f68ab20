"""The exercise solutions of notebooks/24_induction_heads hold."""

import pytest
import sympy as sp
from solution_loader import load_solutions

from llmbook.scale.induction import previous_token_score
from llmbook.transformer.attention import causal_mask

solutions = load_solutions("24_induction_heads")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_positional_copier_works_for_its_length_only():
    model = solutions.positional_copier(16, 12)
    assert solutions.repeat_accuracy(model, 12, 16) == 1.0
    assert solutions.repeat_accuracy(model, 10, 16) < 0.2  # another L: the shortcut fails
    assert model.n_layers == 1


def test_exercise_2_uniform_previous_token_score():
    T = sp.Symbol("T", integer=True, positive=True)
    closed = solutions.uniform_previous_token_score()
    for n in (2, 3, 7, 48):
        assert closed.subs(T, n) == solutions.uniform_previous_token_score_sum(n)
        assert solutions.uniform_previous_token_score(n) == closed.subs(T, n)
    assert solutions.uniform_previous_token_score(2) == sp.Rational(1, 2)
    mask = causal_mask(48).double()
    uniform = (mask / mask.sum(-1, keepdim=True))[None, None]  # (1, 1, T, T)
    got = float(previous_token_score(uniform)[0])
    assert got == pytest.approx(float(solutions.uniform_previous_token_score(48)), abs=1e-14)
    assert 0.07 < got < 0.08


def test_exercise_3_min_beta_is_the_threshold():
    beta = solutions.min_beta(1e-2)
    assert solutions.hand_circuit_repeat_loss(beta) <= 1e-2
    assert solutions.hand_circuit_repeat_loss(0.95 * beta) > 1e-2
    assert 3 < beta < 15
    with pytest.raises(ValueError, match="does not reach"):
        solutions.min_beta(1e-30, hi=5.0)
