"""The exercise solutions of notebooks/18b_reward_overoptimisation hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.alignment.overoptimisation import best_of_n_kl, best_of_n_kl_exact

solutions = load_solutions("18b_reward_overoptimisation")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_gaussian_proxy_is_nearly_linear_in_d():
    rows = solutions.gaussian_proxy_over_d([2, 16, 1024, 2**20])
    assert rows[0][2] == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)  # E[max of 2 normals]
    ratios = [row[3] for row in rows]
    assert all(a < b for a, b in zip(ratios, ratios[1:], strict=False))  # rising ...
    assert 1.28 < ratios[0] and ratios[-1] < 1.37 < math.sqrt(2)  # ... slowly, towards sqrt(2)


def test_exercise_2_gap_formula():
    g0, g1, h = sp.symbols("g0 g1 h", positive=True)
    assert sp.simplify(solutions.jensen_gap_leading_term() - g1**2 * h**3 / (24 * g0)) == 0
    n, K = sp.Symbol("n", positive=True), sp.Symbol("K", positive=True)
    formula = solutions.discrete_gap_formula()
    assert sp.simplify(formula - n * (n - 1) ** 2 / (24 * (n - 2) * K**2)) == 0
    f64 = torch.float64
    rel = []
    for k in (10, 100, 1000):
        gap = best_of_n_kl(16) - best_of_n_kl_exact(torch.full((k,), 1 / k, dtype=f64), torch.arange(k, dtype=f64), 16)
        rel.append(abs(float(formula.subs({n: 16, K: k})) / gap - 1))
    assert rel[0] < 0.06 and rel[2] < 1e-3 and rel[2] < rel[1] < rel[0]


def test_exercise_3_gaussian_noise_never_overoptimises_heavy_tails_do():
    s = sp.Symbol("s", positive=True)
    assert sp.simplify(solutions.gaussian_noise_shrinkage() - 1 / (1 + s**2)) == 0
    ns = [1, 2, 4, 8, 32]
    for scale in (0.5, 2.0):
        golds, proxies = solutions.simulated_best_of_n("gaussian", scale, ns, 2000, 32)
        shrink = 1 / (1 + scale**2)
        for gl, px in zip(golds[1:], proxies[1:], strict=True):
            assert gl == pytest.approx(shrink * px, abs=0.08)  # gold gain = shrink x proxy gain (4 se)
        assert all(a < b for a, b in zip(golds[1:], golds[2:], strict=False))  # gold keeps rising
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    golds, proxies = solutions.simulated_best_of_n("cauchy", 0.3, ns, 200, 1024)
    peak = max(range(len(ns)), key=golds.__getitem__)
    assert 0 < peak < len(ns) - 1 and golds[peak] > 0.5  # gold rises, peaks ...
    assert golds[-1] < golds[peak] / 4  # ... and falls back
    assert all(a < b for a, b in zip(proxies, proxies[1:], strict=False))  # while the proxy climbs
    with pytest.raises(ValueError, match="noise"):
        solutions.simulated_best_of_n("uniform", 1.0, ns, 2, 4)
