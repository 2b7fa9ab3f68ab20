"""The exercise solutions of notebooks/10b_batch_size hold."""

import numpy as np
import pytest
from solution_loader import load_solutions

from llmbook.training.batch_size import TradeoffFit, noise_scale

solutions = load_solutions("10b_batch_size")


def test_weighting_gap():
    right, naive = solutions.weighting_gap([1, 3], [4.0, 2.0])
    assert right == pytest.approx((4.0 + 6.0) / 4, abs=1e-15)  # 2.5
    assert naive == pytest.approx(3.0, abs=1e-15)
    # the short micro-batch has the larger loss: the naive average is larger
    assert naive > right
    assert solutions.weighting_gap([5, 5, 5], [1.0, 2.0, 6.0]) == pytest.approx((3.0, 3.0))
    with pytest.raises(ValueError, match="counts must be positive"):
        solutions.weighting_gap([0, 2], [1.0, 1.0])


def test_optimal_step_halves_at_the_noise_scale():
    rng = np.random.default_rng(0)
    G = rng.standard_normal(4)
    A = rng.standard_normal((4, 6))
    Sigma = A @ A.T
    Hm = np.diag([0.5, 1.0, 2.0, 3.0])
    eps_max = G @ G / (G @ Hm @ G)
    b_noise = noise_scale(G, Sigma, Hm)
    assert solutions.optimal_step(G, Hm, Sigma, b_noise) == pytest.approx(eps_max / 2, rel=1e-12)
    assert solutions.optimal_step(G, Hm, Sigma, 1e12) == pytest.approx(eps_max, rel=1e-9)
    with pytest.raises(ValueError, match="B must be positive"):
        solutions.optimal_step(G, Hm, Sigma, 0)


def test_steps_and_examples_at_the_critical_batch():
    fit = TradeoffFit(s_min=120.0, e_min=6000.0, relative_rms=0.0)
    s, e = solutions.steps_and_examples(fit, fit.b_crit)
    assert s == pytest.approx(2 * fit.s_min, rel=1e-15) and e == pytest.approx(2 * fit.e_min, rel=1e-15)
    s4, e4 = solutions.steps_and_examples(fit, fit.b_crit / 4)
    assert s4 == pytest.approx(5 * fit.s_min) and e4 == pytest.approx(1.25 * fit.e_min)
    s4, e4 = solutions.steps_and_examples(fit, 4 * fit.b_crit)
    assert s4 == pytest.approx(1.25 * fit.s_min) and e4 == pytest.approx(5 * fit.e_min)
    with pytest.raises(TypeError, match="fit must be a TradeoffFit"):
        solutions.steps_and_examples((1, 2), 3)
