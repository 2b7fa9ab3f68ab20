"""Checks of chapter 10d's exercises (notebooks/10d_data_mixtures), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's temperature sampling and epoch counts
(:mod:`llmbook.training.mixtures`), a mixing law with a known optimum, the shipped
mixture sweep (``data/mixtures/sweep.json``) and laws fitted to planted coefficients.
"""

from __future__ import annotations

import json
import math

import numpy as np

from llmbook.paths import data_path
from llmbook.training.mixtures import (
    epochs_per_source,
    fit_mixing_law,
    mixing_law,
    temperature_weights,
)
from llmbook.workbench.checks import raises


def exercise_1_alpha_for_max_epochs(solutions) -> None:
    sizes, budget = [1e6, 1e8, 1e9], 2e8
    a = solutions.alpha_for_max_epochs(sizes, budget, 4.0)
    assert 0 < a < 1, f"expected an alpha strictly between 0 and 1, got {a!r}"
    worst = epochs_per_source(temperature_weights(sizes, a), sizes, budget).max()
    assert math.isclose(worst, 4.0, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected the most-repeated source read 4 times at alpha = {a!r}, got {worst!r}")
    hotter = epochs_per_source(temperature_weights(sizes, a - 1e-3), sizes, budget).max()
    assert hotter > 4.0, (
        f"expected alpha - 1e-3 to read some source more than 4 times (alpha is the smallest "
        f"that works), got {hotter!r}")
    # a budget larger than the data read max_epochs times: no alpha works
    got = solutions.alpha_for_max_epochs(sizes, 1e10, 4.0)
    assert got is None, f"expected None for a budget of 1e10 tokens, more than 4 epochs of all, got {got!r}"
    # a generous limit is met already by uniform sampling
    got = solutions.alpha_for_max_epochs(sizes, budget, 1e3)
    assert got == 0.0, f"expected alpha = 0 (uniform sampling) for a limit of 1000 epochs, got {got!r}"
    with raises(ValueError, match="max_epochs", what="alpha_for_max_epochs(..., max_epochs=0)"):
        solutions.alpha_for_max_epochs(sizes, budget, 0)


def exercise_2_simplex_grid(solutions) -> None:
    grid = solutions.simplex_grid(3, 10)
    assert grid.shape == (66, 3), (  # C(12, 2) points
        f"expected simplex_grid(3, 10) to hold C(12, 2) = 66 points of 3 weights, got shape {grid.shape}")
    sums = grid.sum(1)
    assert np.allclose(sums, 1.0, rtol=1e-7, atol=0), (
        f"expected each point's weights to sum to 1, got sums from {float(sums.min())!r} to {float(sums.max())!r}")
    smallest = grid.min()
    assert smallest >= 0, f"expected no negative weight, got {smallest!r}"


def exercise_2_best_mixture_finds_the_known_optimum(solutions) -> None:
    # L_1 falls with r_1, L_2 with r_2, symmetric: the best equal-importance mixture is even
    c, k = np.array([1.0, 1.0]), np.array([1.0, 1.0])
    t = np.array([[-2.0, 0.0], [0.0, -2.0]])
    r = solutions.simplex_grid(2, 20)
    fit = fit_mixing_law(r, mixing_law(r, c, k, t))
    best, value = solutions.best_mixture(fit, [1.0, 1.0], r)
    assert np.allclose(best, [0.5, 0.5], rtol=1e-7, atol=1e-12), (
        f"expected the symmetric law's best mixture (0.5, 0.5), got {best.tolist()}")
    want = 2 + 2 * np.exp(-1.0)
    assert math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected the best total loss 2 + 2 e^-1 = {want!r}, got {value!r}")
    # all importance on source 1: put everything on source 1
    best1, _ = solutions.best_mixture(fit, [1.0, 0.0], r)
    assert np.allclose(best1, [1.0, 0.0], rtol=1e-7, atol=0), (
        f"expected all weight on source 1 when all importance is on it, got {best1.tolist()}")
    with raises(ValueError, match="importance", what="best_mixture(fit, [1.0], ...) on 2 sources"):
        solutions.best_mixture(fit, [1.0], r)


def exercise_2_best_mixture_on_the_book_sweep(solutions) -> None:
    sweep = json.loads(data_path("mixtures", "sweep.json").read_text())
    R = np.array([run["weights"] for run in sweep["runs"]])
    L = np.array([run["val_loss"] for run in sweep["runs"]])
    fit = fit_mixing_law(R, L)
    grid = solutions.simplex_grid(3, 20)
    best, value = solutions.best_mixture(fit, [1.0, 1.0, 1.0], grid)
    total = best.sum()
    assert abs(total - 1) < 1e-12, f"expected the best mixture's weights to sum to 1, got {total!r}"
    measured = (fit.predict(R) @ np.ones(3)).min()
    assert value <= measured + 1e-9, (  # no worse than any measured mixture
        f"expected the best mixture's predicted loss no worse than the best measured mixture's "
        f"{measured!r}, got {value!r}")


def exercise_3_redundancy_and_canonical_law(solutions) -> None:
    identity = solutions.redundancy_identity()
    assert identity, f"expected redundancy_identity() to hold, got {identity!r}"
    rng = np.random.default_rng(0)
    r = rng.dirichlet(np.ones(3), size=9)
    c, k = np.array([1.5, 2.0]), np.array([0.9, 1.2])
    t = np.array([[-2.0, 0.5, 0.3], [0.2, -1.5, 0.4]])
    fit = fit_mixing_law(r, mixing_law(r, c, k, t))
    can = solutions.canonical_law(fit)
    last = can.t[:, -1]
    assert np.allclose(last, 0.0, rtol=1e-7, atol=1e-15), (
        f"expected the canonical law's last column of t to be 0, got {last.tolist()}")
    ours, theirs = can.predict(r), fit.predict(r)
    assert np.allclose(ours, theirs, rtol=1e-12, atol=0), (
        "expected the canonical law to predict what the fitted law does (to 1e-12), off by up to "
        f"{np.abs(ours - theirs).max():.3g}")
    want_t = t - t[:, -1:]
    assert np.allclose(can.t, want_t, rtol=1e-7, atol=1e-5), (
        f"expected t minus its last column, {want_t.tolist()}, got {can.t.tolist()}")
    want_k = k * np.exp(t[:, -1])
    assert np.allclose(can.k, want_k, rtol=1e-5, atol=0), (
        f"expected k times exp(last column of t), {want_k.tolist()}, got {can.k.tolist()}")
