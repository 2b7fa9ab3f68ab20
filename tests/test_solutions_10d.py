"""The exercise solutions of notebooks/10d_data_mixtures hold."""

import json

import numpy as np
import pytest
from solution_loader import load_solutions

from llmbook.paths import data_path
from llmbook.training.mixtures import (
    epochs_per_source,
    fit_mixing_law,
    mixing_law,
    temperature_weights,
)

solutions = load_solutions("10d_data_mixtures")


def test_alpha_for_max_epochs():
    sizes, budget = [1e6, 1e8, 1e9], 2e8
    a = solutions.alpha_for_max_epochs(sizes, budget, 4.0)
    assert 0 < a < 1
    worst = epochs_per_source(temperature_weights(sizes, a), sizes, budget).max()
    assert worst == pytest.approx(4.0, rel=1e-6)
    assert epochs_per_source(temperature_weights(sizes, a - 1e-3), sizes, budget).max() > 4.0
    # a budget larger than the data read max_epochs times: no alpha works
    assert solutions.alpha_for_max_epochs(sizes, 1e10, 4.0) is None
    # a generous limit is met already by uniform sampling
    assert solutions.alpha_for_max_epochs(sizes, budget, 1e3) == 0.0
    with pytest.raises(ValueError, match="max_epochs"):
        solutions.alpha_for_max_epochs(sizes, budget, 0)


def test_simplex_grid():
    grid = solutions.simplex_grid(3, 10)
    assert grid.shape == (66, 3)  # C(12, 2) points
    np.testing.assert_allclose(grid.sum(1), 1.0)
    assert grid.min() >= 0


def test_best_mixture_finds_the_known_optimum():
    # L_1 falls with r_1, L_2 with r_2, symmetric: the best equal-importance mixture is even
    c, k = np.array([1.0, 1.0]), np.array([1.0, 1.0])
    t = np.array([[-2.0, 0.0], [0.0, -2.0]])
    r = solutions.simplex_grid(2, 20)
    fit = fit_mixing_law(r, mixing_law(r, c, k, t))
    best, value = solutions.best_mixture(fit, [1.0, 1.0], r)
    np.testing.assert_allclose(best, [0.5, 0.5], atol=1e-12)
    assert value == pytest.approx(2 + 2 * np.exp(-1.0), rel=1e-6)
    # all importance on source 1: put everything on source 1
    best1, _ = solutions.best_mixture(fit, [1.0, 0.0], r)
    np.testing.assert_allclose(best1, [1.0, 0.0])
    with pytest.raises(ValueError, match="importance"):
        solutions.best_mixture(fit, [1.0], r)


def test_best_mixture_on_the_book_sweep():
    sweep = json.loads(data_path("mixtures", "sweep.json").read_text())
    R = np.array([run["weights"] for run in sweep["runs"]])
    L = np.array([run["val_loss"] for run in sweep["runs"]])
    fit = fit_mixing_law(R, L)
    grid = solutions.simplex_grid(3, 20)
    best, value = solutions.best_mixture(fit, [1.0, 1.0, 1.0], grid)
    assert abs(best.sum() - 1) < 1e-12
    assert value <= (fit.predict(R) @ np.ones(3)).min() + 1e-9  # no worse than any measured mixture


def test_redundancy_and_canonical_law():
    assert solutions.redundancy_identity()
    rng = np.random.default_rng(0)
    r = rng.dirichlet(np.ones(3), size=9)
    c, k, t = np.array([1.5, 2.0]), np.array([0.9, 1.2]), np.array([[-2.0, 0.5, 0.3], [0.2, -1.5, 0.4]])
    fit = fit_mixing_law(r, mixing_law(r, c, k, t))
    can = solutions.canonical_law(fit)
    np.testing.assert_allclose(can.t[:, -1], 0.0, atol=1e-15)
    np.testing.assert_allclose(can.predict(r), fit.predict(r), rtol=1e-12)
    np.testing.assert_allclose(can.t, t - t[:, -1:], atol=1e-5)
    np.testing.assert_allclose(can.k, k * np.exp(t[:, -1]), rtol=1e-5)
