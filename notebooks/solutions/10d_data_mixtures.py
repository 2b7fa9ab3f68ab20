"""Reference solutions to the exercises of notebooks/10d_data_mixtures (checked by tests/test_solutions_10d.py)."""

from __future__ import annotations

import itertools

import numpy as np
import sympy as sp

from llmbook.training.mixtures import MixingLawFit, epochs_per_source, temperature_weights

# ---------------------------------------------------------------- exercise 1


def alpha_for_max_epochs(sizes, budget: float, max_epochs: float, tol: float = 1e-10) -> float | None:
    """Exercise 1: the smallest alpha in [0, 1] at which no source is read more than ``max_epochs`` times.

    The most-read source is the smallest one for alpha < 1, and its epochs fall as alpha
    grows (its weight does), so the condition is monotone and bisection finds the
    boundary. At alpha = 1 every source gets D / sum n epochs; if that already exceeds
    ``max_epochs`` no alpha works and the answer is None (the budget is too large for
    the data, whatever the mixture).
    """
    if max_epochs <= 0:
        raise ValueError(f"max_epochs must be positive, got {max_epochs!r}")

    def worst(a: float) -> float:
        return float(epochs_per_source(temperature_weights(sizes, a), sizes, budget).max())

    if worst(1.0) > max_epochs:
        return None
    if worst(0.0) <= max_epochs:
        return 0.0
    lo, hi = 0.0, 1.0  # worst(lo) > max_epochs >= worst(hi)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if worst(mid) <= max_epochs else (mid, hi)
    return hi


# ---------------------------------------------------------------- exercise 2


def simplex_grid(k: int, steps: int) -> np.ndarray:
    """All points of the K-simplex with coordinates in multiples of 1/steps: ``(M, K)``."""
    pts = [c for c in itertools.product(range(steps + 1), repeat=k - 1) if sum(c) <= steps]
    return np.array([[*c, steps - sum(c)] for c in pts], dtype=np.float64) / steps


def best_mixture(fit: MixingLawFit, importance, grid: np.ndarray) -> tuple[np.ndarray, float]:
    """Exercise 2: the grid mixture minimising sum_i w_i L_i(r); returns (r, objective)."""
    w = np.asarray(importance, dtype=np.float64)
    if w.shape != fit.c.shape or np.any(w < 0):
        raise ValueError(f"importance must be {fit.c.shape} non-negative weights, got {w}")
    objective = fit.predict(grid) @ w  # (M,)
    best = int(np.argmin(objective))
    return grid[best], float(objective[best])


# ---------------------------------------------------------------- exercise 3


def redundancy_identity() -> bool:
    """Exercise 3: on the simplex, k e^{t.r} = k e^s e^{(t - s).r} for every s (K = 3)."""
    r1, r2, k, s = sp.symbols("r1 r2 k s", positive=True)
    t = sp.symbols("t1:4", real=True)
    r = (r1, r2, 1 - r1 - r2)
    lhs = k * sp.exp(sum(tj * rj for tj, rj in zip(t, r, strict=True)))
    rhs = k * sp.exp(s) * sp.exp(sum((tj - s) * rj for tj, rj in zip(t, r, strict=True)))
    return sp.simplify(lhs - rhs) == 0


def canonical_law(fit: MixingLawFit) -> MixingLawFit:
    """Exercise 3: the same law on the simplex with t_iK = 0 (k_i absorbs e^{t_iK})."""
    shift = fit.t[:, -1:]  # (S, 1)
    return MixingLawFit(fit.c.copy(), fit.k * np.exp(shift[:, 0]), fit.t - shift, fit.rmse.copy())
