"""Reference solutions to the exercises of notebooks/10b_batch_size (checked by tests/test_solutions_10b.py)."""

from __future__ import annotations

import numpy as np

from llmbook.training.batch_size import TradeoffFit

# ---------------------------------------------------------------- exercise 1


def weighting_gap(counts: list[int], means: list[float]) -> tuple[float, float]:
    """Exercise 1: (sum_k n_k m_k / N, (1/K) sum_k m_k) for token counts n_k and mean losses m_k.

    The naive loss is larger exactly when the micro-batches with fewer tokens have the
    larger mean losses (the covariance of n_k and m_k is negative): it overweights them.
    """
    n = np.asarray(counts, dtype=np.float64)
    m = np.asarray(means, dtype=np.float64)
    if n.ndim != 1 or n.shape != m.shape or n.size == 0:
        raise ValueError(f"counts and means must be non-empty 1-D of one length, got "
                         f"{n.shape} and {m.shape}")
    if np.any(n <= 0):
        raise ValueError(f"counts must be positive, got {counts}")
    return float(n @ m / n.sum()), float(m.mean())


# ---------------------------------------------------------------- exercise 2


def optimal_step(G: np.ndarray, H: np.ndarray, Sigma: np.ndarray, B: float) -> float:
    """Exercise 2: eps_opt(B) = |G|^2 / (G^T H G + tr(H Sigma) / B); B = inf gives eps_max."""
    G, H, Sigma = (np.asarray(a, dtype=np.float64) for a in (G, H, Sigma))
    if not B > 0:
        raise ValueError(f"B must be positive, got {B}")
    return float(G @ G / (G @ H @ G + np.trace(H @ Sigma) / B))


# ---------------------------------------------------------------- exercise 3


def steps_and_examples(fit: TradeoffFit, B: float) -> tuple[float, float]:
    """Exercise 3: S(B) = S_min + E_min / B and E(B) = B S(B) on the fitted trade-off."""
    if not isinstance(fit, TradeoffFit):
        raise TypeError(f"fit must be a TradeoffFit, got {type(fit).__name__}")
    if not B > 0:
        raise ValueError(f"B must be positive, got {B}")
    return float(fit.steps(B)), float(fit.examples(B))
