"""The exercise solutions of notebooks/03_language_modelling hold."""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from solution_loader import load_solutions

from llmbook.text.data import default_source
from llmbook.text.ngram import NGramModel

solutions = load_solutions("03_language_modelling")


def test_exercise_1_hessian_symbolic_and_autograd() -> None:
    hessian, formula = solutions.cross_entropy_hessian_symbolic(3)
    assert hessian.shape == (3, 3)
    assert sp.simplify(hessian - formula) == sp.zeros(3, 3)
    z = torch.tensor([0.3, -1.2, 2.0, 0.1, -0.4], dtype=torch.float64)
    for y in (0, 3):
        auto = torch.autograd.functional.hessian(
            lambda t, y=y: F.cross_entropy(t[None], torch.tensor([y])), z)
        assert (auto - solutions.cross_entropy_hessian(z)).abs().max() < 1e-14
    h = solutions.cross_entropy_hessian(z)
    assert torch.linalg.eigvalsh(h).min() > -1e-15  # positive semi-definite: CE is convex in z
    assert h.sum(1).abs().max() < 1e-15  # the all-ones direction (a shift) costs nothing


def test_exercise_2_label_smoothing_matches_torch() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 9, generator=g, dtype=torch.float64)
    y = torch.randint(0, 9, (3, 4), generator=g)
    for eps in (0.0, 0.1, 0.5):
        ref = F.cross_entropy(z.reshape(-1, 9), y.reshape(-1), label_smoothing=eps)
        got = solutions.label_smoothed_cross_entropy(z, y, eps)
        assert abs(float(got - ref)) < 1e-13


def test_exercise_3_ngram_limits() -> None:
    source = default_source()
    h = source.entropy_rate()
    limits = {n: solutions.ngram_limit(source, n) for n in (1, 2, 3, 4)}
    assert limits[3] == limits[4] == h
    assert limits[1] > limits[2] > limits[3]
    # the unigram limit is the entropy of the stationary token distribution
    marginal = source.stationary.reshape(16, 16).sum(0).numpy()
    assert math.isclose(limits[1], float(-(marginal * np.log(marginal)).sum()), abs_tol=1e-12)
    # and the fitted models approach those limits
    train, val = source.train_val(500_000, 200_000, seed=11)
    for n in (1, 2):
        ce = NGramModel(n, 16, add_k=0.2).fit(train).cross_entropy(val)
        assert abs(ce - limits[n]) < 0.01


def test_exercise_4_cross_entropy_is_entropy_plus_kl() -> None:
    cross, entropy, kl = solutions.cross_entropy_decomposition()
    assert sp.simplify(sp.expand_log(cross - entropy - kl, force=True)) == 0
    p1, p2, q1, q2 = sorted(kl.free_symbols, key=lambda s: s.name)
    values = {q1: sp.Rational(1, 5), q2: sp.Rational(1, 2)}
    assert kl.subs({**values, p1: values[q1], p2: values[q2]}) == 0  # zero at p = q
    # and positive elsewhere (Gibbs' inequality), on a grid
    f = sp.lambdify((p1, p2), kl.subs(values))
    grid = [(a, b) for a in np.linspace(0.05, 0.9, 12) for b in np.linspace(0.05, 0.9, 12)
            if a + b < 0.95]
    assert min(f(a, b) for a, b in grid) >= 0
