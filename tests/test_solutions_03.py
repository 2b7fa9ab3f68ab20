"""The exercise solutions of notebooks/03_language_modelling hold."""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from solution_loader import load_solutions

from llmbook.text.data import default_source
from llmbook.text.functional import logsumexp, softmax
from llmbook.text.ngram import NGramModel

solutions = load_solutions("03_language_modelling")


def test_exercise_1_the_shift_needs_no_gradient() -> None:
    gradient, softmax_sym = solutions.shift_gradient_symbolic(3)
    assert len(gradient) == 3
    for g_i, p_i in zip(gradient, softmax_sym, strict=True):
        assert g_i.has(sp.Derivative)  # the shift really depends on z ...
        assert sp.simplify(g_i - p_i) == 0  # ... and its derivative cancels
    for z in (torch.tensor([[0.3, -1.2, 2.0, 0.1, -0.4], [1.0, 5.0, -3.0, 0.0, 2.5]], dtype=torch.float64),
              torch.tensor([[2.0, 2.0, -1.0, 0.5, 2.0]], dtype=torch.float64)):  # a three-way tie
        z = z.requires_grad_()
        (g_attached,) = torch.autograd.grad(solutions.logsumexp_attached(z).sum(), z)
        (g_detached,) = torch.autograd.grad(logsumexp(z).sum(), z)
        assert (g_attached - softmax(z.detach())).abs().max() < 1e-15
        assert (g_detached - softmax(z.detach())).abs().max() < 1e-15
        assert torch.allclose(solutions.logsumexp_attached(z), torch.logsumexp(z, -1), rtol=0, atol=1e-14)
    # at the tie the max's own gradient is split, so the cancellation is not trivial there
    tied = torch.tensor([2.0, 2.0, -1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    (g_max,) = torch.autograd.grad(tied.amax(), tied)
    assert torch.allclose(g_max, torch.tensor([1, 1, 0, 0, 1], dtype=torch.float64) / 3)


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
