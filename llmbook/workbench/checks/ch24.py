"""Checks of chapter 24's exercises (notebooks/24_induction_heads), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the repeat accuracy on another segment length than the one the shortcut was
built for, the explicit sum of the uniform baseline (exact rationals in SymPy) and the
book's :func:`llmbook.scale.induction.previous_token_score` on a uniform causal pattern,
and the hand-built circuit's loss on either side of the threshold.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp
import torch

from llmbook.scale.induction import previous_token_score
from llmbook.transformer.attention import causal_mask
from llmbook.workbench.checks import raises


def exercise_1_positional_copier_works_for_its_length_only(solutions) -> None:
    model = solutions.positional_copier(16, 12)
    own = solutions.repeat_accuracy(model, 12, 16)
    assert own == 1.0, f"expected accuracy 1.0 on repeats of the length it was built for (12), got {own!r}"
    other = solutions.repeat_accuracy(model, 10, 16)
    assert other < 0.2, f"expected accuracy below 0.2 on repeats of another length (10): the shortcut fails, got {other!r}"
    assert model.n_layers == 1, f"expected a one-layer model, got {model.n_layers!r} layers"


def uniform_baseline(closed_form: Callable[[], sp.Expr], explicit_sum: Callable[[int], sp.Expr],
                     at: Callable[[int], sp.Expr], score: Callable[[torch.Tensor], torch.Tensor],
                     sizes: tuple[int, ...], size: int, low: float, high: float, what: str) -> None:
    """The checks of a head score's uniform baseline (chapters 24 and 24b): the closed form
    ``closed_form()`` in ``T`` equals the explicit sum and ``at(n)`` at each of ``sizes``,
    ``at(2) = 1/2``, and the book's ``score`` of a uniform causal pattern of ``size``
    positions matches ``at(size)`` to 1e-14 and lies between ``low`` and ``high``."""
    T = sp.Symbol("T", integer=True, positive=True)
    closed = closed_form()
    for n in sizes:
        at_n, summed = closed.subs(T, n), explicit_sum(n)
        assert at_n == summed, f"expected the closed form at T = {n} to equal the explicit sum {summed}, got {at_n}"
        direct = at(n)
        assert direct == at_n, f"expected the {what} at T = {n} to be the closed form's {at_n}, got {direct}"
    two = at(2)
    assert two == sp.Rational(1, 2), f"expected 1/2 at T = 2, got {two}"
    mask = causal_mask(size).double()
    uniform = (mask / mask.sum(-1, keepdim=True))[None, None]  # (1, 1, T, T)
    got = float(score(uniform)[0])
    want = float(at(size))
    assert abs(got - want) <= 1e-14, (  # pytest.approx(want, abs=1e-14)
        f"expected the book's {what} of a uniform causal pattern (T = {size}), {got!r}, "
        f"to match the answer {want!r} (to 1e-14)")
    assert low < got < high, f"the book's {what} of the uniform pattern moved: {got!r}"


def exercise_2_uniform_previous_token_score(solutions) -> None:
    uniform_baseline(solutions.uniform_previous_token_score, solutions.uniform_previous_token_score_sum,
                     solutions.uniform_previous_token_score, previous_token_score,
                     (2, 3, 7, 48), 48, 0.07, 0.08, "previous-token score")


def exercise_3_min_beta_is_the_threshold(solutions) -> None:
    beta = solutions.min_beta(1e-2)
    at_beta = solutions.hand_circuit_repeat_loss(beta)
    assert at_beta <= 1e-2, f"expected a loss at most 1e-2 at beta = min_beta(1e-2) = {beta!r}, got {at_beta!r}"
    below = solutions.hand_circuit_repeat_loss(0.95 * beta)
    assert below > 1e-2, f"expected a loss above 1e-2 at 0.95 x beta = {0.95 * beta!r}, got {below!r}"
    assert 3 < beta < 15, f"expected beta between 3 and 15, got {beta!r}"
    with raises(ValueError, match="does not reach", what="min_beta(1e-30, hi=5.0)"):
        solutions.min_beta(1e-30, hi=5.0)
