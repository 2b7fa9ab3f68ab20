"""Checks of chapter 10b's exercises (notebooks/10b_batch_size), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are averages worked by hand, the book's noise scale
(:func:`llmbook.training.batch_size.noise_scale`) and McCandlish et al. (2018)'s
trade-off at the critical batch (:class:`llmbook.training.batch_size.TradeoffFit`).
"""

from __future__ import annotations

import math

import numpy as np

from llmbook.training.batch_size import TradeoffFit, noise_scale
from llmbook.workbench.checks import raises


def exercise_1_weighting_gap(solutions) -> None:
    right, naive = solutions.weighting_gap([1, 3], [4.0, 2.0])
    want_right, want_naive = (4.0 + 6.0) / 4, 3.0  # 2.5: the token-weighted mean
    assert abs(right - want_right) <= 1e-15 and abs(naive - want_naive) <= 1e-15, (
        f"expected weighting_gap([1, 3], [4.0, 2.0]) = ({want_right}, {want_naive}), "
        f"got ({right!r}, {naive!r})")
    # the short micro-batch has the larger loss: the naive average is larger
    assert naive > right, f"expected the naive average {naive!r} above the weighted {right!r}"
    equal = solutions.weighting_gap([5, 5, 5], [1.0, 2.0, 6.0])
    assert len(equal) == 2 and all(math.isclose(v, 3.0, rel_tol=1e-6, abs_tol=1e-12) for v in equal), (
        f"expected equal counts to give both averages 3.0, got {equal!r}")
    with raises(ValueError, match="counts must be positive",
                what="weighting_gap([0, 2], [1.0, 1.0])"):
        solutions.weighting_gap([0, 2], [1.0, 1.0])


def exercise_2_optimal_step_halves_at_the_noise_scale(solutions) -> None:
    rng = np.random.default_rng(0)
    G = rng.standard_normal(4)
    A = rng.standard_normal((4, 6))
    Sigma = A @ A.T
    Hm = np.diag([0.5, 1.0, 2.0, 3.0])
    eps_max = G @ G / (G @ Hm @ G)
    b_noise = noise_scale(G, Sigma, Hm)
    half = solutions.optimal_step(G, Hm, Sigma, b_noise)
    assert math.isclose(half, eps_max / 2, rel_tol=1e-12, abs_tol=1e-12), (
        f"expected the best step at B = B_noise to be half of eps_max = {eps_max!r}, got {half!r}")
    big = solutions.optimal_step(G, Hm, Sigma, 1e12)
    assert math.isclose(big, eps_max, rel_tol=1e-9, abs_tol=1e-12), (
        f"expected the best step at B = 1e12 to be eps_max = {eps_max!r}, got {big!r}")
    with raises(ValueError, match="B must be positive", what="optimal_step(..., B=0)"):
        solutions.optimal_step(G, Hm, Sigma, 0)


def exercise_3_steps_and_examples_at_the_critical_batch(solutions) -> None:
    fit = TradeoffFit(s_min=120.0, e_min=6000.0, relative_rms=0.0)
    for batch, steps, examples, rel in ((fit.b_crit, 2, 2, 1e-15), (fit.b_crit / 4, 5, 1.25, 1e-6),
                                        (4 * fit.b_crit, 1.25, 5, 1e-6)):
        s, e = solutions.steps_and_examples(fit, batch)
        want_s, want_e = steps * fit.s_min, examples * fit.e_min
        assert math.isclose(s, want_s, rel_tol=rel, abs_tol=1e-12) and \
            math.isclose(e, want_e, rel_tol=rel, abs_tol=1e-12), (
                f"expected steps_and_examples(fit, {batch / fit.b_crit} B_crit) = "
                f"({want_s}, {want_e}), got ({s!r}, {e!r})")
    with raises(TypeError, match="fit must be a TradeoffFit", what="steps_and_examples((1, 2), 3)"):
        solutions.steps_and_examples((1, 2), 3)
