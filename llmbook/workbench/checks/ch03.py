"""Checks of chapter 3's exercises (notebooks/03_language_modelling), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the package's own ``logsumexp``/``softmax``, ``torch.logsumexp``,
``torch.nn.functional.cross_entropy``, SymPy and the fitted n-gram models.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F

from llmbook.text.data import default_source
from llmbook.text.functional import logsumexp, softmax
from llmbook.text.ngram import NGramModel


def exercise_1_the_shift_needs_no_gradient(solutions) -> None:
    gradient, softmax_sym = solutions.shift_gradient_symbolic(3)
    assert len(gradient) == 3, f"expected 3 derivatives for V = 3, got {len(gradient)}"
    for i, (g_i, p_i) in enumerate(zip(gradient, softmax_sym, strict=True)):
        assert g_i.has(sp.Derivative), (
            f"gradient[{i}] = {g_i} contains no Derivative of m: the shift m must be an "
            "undefined sympy.Function of the logits")
        assert sp.simplify(g_i - p_i) == 0, (
            f"expected gradient[{i}] - softmax[{i}] to simplify to 0, got {sp.simplify(g_i - p_i)}")
    for z in (torch.tensor([[0.3, -1.2, 2.0, 0.1, -0.4], [1.0, 5.0, -3.0, 0.0, 2.5]], dtype=torch.float64),
              torch.tensor([[2.0, 2.0, -1.0, 0.5, 2.0]], dtype=torch.float64)):  # a three-way tie
        z = z.requires_grad_()
        (g_attached,) = torch.autograd.grad(solutions.logsumexp_attached(z).sum(), z)
        (g_detached,) = torch.autograd.grad(logsumexp(z).sum(), z)
        p = softmax(z.detach())
        err = float((g_attached - p).abs().max())
        assert err < 1e-15, (f"expected the gradient of logsumexp_attached to be softmax(z) to "
                             f"1e-15, got a largest difference of {err:.3g} for z = {z.tolist()}")
        own = float((g_detached - p).abs().max())  # the book's own logsumexp, detached
        assert own < 1e-15, f"the book's logsumexp gradient differs from softmax by {own:.3g}"
        value, ref = solutions.logsumexp_attached(z), torch.logsumexp(z, -1)
        assert torch.allclose(value, ref, rtol=0, atol=1e-14), (
            f"expected logsumexp_attached(z) = torch.logsumexp(z, -1) = {ref.tolist()}, "
            f"got {value.tolist()}")
    # at the tie the max's own gradient is split, so the cancellation is not trivial there
    tied = torch.tensor([2.0, 2.0, -1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    (g_max,) = torch.autograd.grad(tied.amax(), tied)
    assert torch.allclose(g_max, torch.tensor([1, 1, 0, 0, 1], dtype=torch.float64) / 3), (
        f"torch no longer splits the gradient of a tied max evenly: {g_max.tolist()}")


def exercise_2_label_smoothing_matches_torch(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 9, generator=g, dtype=torch.float64)
    y = torch.randint(0, 9, (3, 4), generator=g)
    for eps in (0.0, 0.1, 0.5):
        ref = F.cross_entropy(z.reshape(-1, 9), y.reshape(-1), label_smoothing=eps)
        got = solutions.label_smoothed_cross_entropy(z, y, eps)
        assert abs(float(got - ref)) < 1e-13, (
            f"expected label_smoothed_cross_entropy(logits, targets, {eps}) = "
            f"F.cross_entropy(..., label_smoothing={eps}) = {float(ref):.15g} (to 1e-13), "
            f"got {float(got):.15g}")


def exercise_3_ngram_limits(solutions) -> None:
    source = default_source()
    h = source.entropy_rate()
    limits = {n: solutions.ngram_limit(source, n) for n in (1, 2, 3, 4)}
    assert limits[3] == limits[4] == h, (
        f"expected orders 3 and 4 to reach the entropy rate {h!r} exactly (the source has "
        f"order {source.order}), got {limits[3]!r} and {limits[4]!r}")
    assert limits[1] > limits[2] > limits[3], (
        f"expected the limits to fall with the order, got {limits}")
    # the unigram limit is the entropy of the stationary token distribution
    marginal = source.stationary.reshape(16, 16).sum(0).numpy()
    unigram = float(-(marginal * np.log(marginal)).sum())
    assert math.isclose(limits[1], unigram, abs_tol=1e-12), (
        f"expected the unigram limit to be the entropy of the stationary token distribution, "
        f"{unigram:.12f}, got {limits[1]:.12f}")
    # and the fitted models approach those limits
    train, val = source.train_val(500_000, 200_000, seed=11)
    for n in (1, 2):
        ce = NGramModel(n, 16, add_k=0.2).fit(train).cross_entropy(val)
        assert abs(ce - limits[n]) < 0.01, (
            f"expected the order-{n} limit within 0.01 nats of a model fitted on 500,000 "
            f"tokens ({ce:.4f}), got {limits[n]:.4f}")


def exercise_4_cross_entropy_is_entropy_plus_kl(solutions) -> None:
    cross, entropy, kl = solutions.cross_entropy_decomposition()
    residual = sp.simplify(sp.expand_log(cross - entropy - kl, force=True))
    assert residual == 0, f"expected cross - entropy - kl to simplify to 0, got {residual}"
    names = sorted(s.name for s in kl.free_symbols)
    assert names == ["p1", "p2", "q1", "q2"], (
        f"expected kl to be an expression in p1, p2, q1, q2, got one in {names}")
    p1, p2, q1, q2 = sorted(kl.free_symbols, key=lambda s: s.name)
    values = {q1: sp.Rational(1, 5), q2: sp.Rational(1, 2)}
    at_q = kl.subs({**values, p1: values[q1], p2: values[q2]})
    assert at_q == 0, f"expected KL(q || q) = 0, got {at_q}"
    # and positive elsewhere (Gibbs' inequality), on a grid
    f = sp.lambdify((p1, p2), kl.subs(values))
    grid = [(a, b) for a in np.linspace(0.05, 0.9, 12) for b in np.linspace(0.05, 0.9, 12)
            if a + b < 0.95]
    lowest = min(f(a, b) for a, b in grid)
    assert lowest >= 0, f"expected KL(q || p) >= 0 on the grid, got a minimum of {lowest:.3g}"
