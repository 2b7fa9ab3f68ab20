"""Checks of chapter 18b's exercises (notebooks/18b_reward_overoptimisation), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the expected maximum of two standard normals, 1/sqrt(pi), the closed forms
written here in SymPy, the book's best-of-n KL (:mod:`llmbook.alignment.overoptimisation`),
exact on a uniform discrete reward and as the continuous formula, and the shrinkage
1/(1 + s^2) of a Gaussian proxy's gain.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.alignment.overoptimisation import best_of_n_kl, best_of_n_kl_exact
from llmbook.workbench.checks import raises


def exercise_1_gaussian_proxy_is_nearly_linear_in_d(solutions) -> None:
    rows = solutions.gaussian_proxy_over_d([2, 16, 1024, 2**20])
    got, want = rows[0][2], 1 / math.sqrt(math.pi)
    assert abs(got - want) <= 1e-9, (
        f"expected E[max of 2 standard normals] = 1/sqrt(pi) = {want!r} (to 1e-9) in row 0, got {got!r}")
    ratios = [row[3] for row in rows]
    assert all(a < b for a, b in zip(ratios, ratios[1:], strict=False)), (
        f"expected the ratio (column 3) to rise with n, got {ratios}")
    assert 1.28 < ratios[0] and ratios[-1] < 1.37 < math.sqrt(2), (
        f"expected the ratio to rise slowly towards sqrt(2): above 1.28 at n = 2, below 1.37 at "
        f"n = 2^20, got {ratios[0]!r} and {ratios[-1]!r}")


def exercise_2_gap_formula(solutions) -> None:
    g0, g1, h = sp.symbols("g0 g1 h", positive=True)
    leading = solutions.jensen_gap_leading_term()
    want = g1**2 * h**3 / (24 * g0)
    assert sp.simplify(leading - want) == 0, f"expected the Jensen gap's leading term {want}, got {leading}"
    n, K = sp.Symbol("n", positive=True), sp.Symbol("K", positive=True)
    formula = solutions.discrete_gap_formula()
    want = n * (n - 1) ** 2 / (24 * (n - 2) * K**2)
    assert sp.simplify(formula - want) == 0, f"expected the discrete gap {want}, got {formula}"
    f64 = torch.float64
    rel = []
    for k in (10, 100, 1000):
        gap = best_of_n_kl(16) - best_of_n_kl_exact(torch.full((k,), 1 / k, dtype=f64), torch.arange(k, dtype=f64), 16)
        rel.append(abs(float(formula.subs({n: 16, K: k})) / gap - 1))
    assert rel[0] < 0.06 and rel[2] < 1e-3 and rel[2] < rel[1] < rel[0], (
        f"expected the formula's relative error at n = 16 to fall with K = 10, 100, 1000, below 0.06 "
        f"at K = 10 and 1e-3 at K = 1000, got {rel}")


def exercise_3_gaussian_noise_never_overoptimises_heavy_tails_do(solutions) -> None:
    s = sp.Symbol("s", positive=True)
    shrinkage = solutions.gaussian_noise_shrinkage()
    assert sp.simplify(shrinkage - 1 / (1 + s**2)) == 0, f"expected the shrinkage 1/(1 + s^2), got {shrinkage}"
    ns = [1, 2, 4, 8, 32]
    for scale in (0.5, 2.0):
        golds, proxies = solutions.simulated_best_of_n("gaussian", scale, ns, 2000, 32)
        shrink = 1 / (1 + scale**2)
        for n_, gl, px in zip(ns[1:], golds[1:], proxies[1:], strict=True):
            assert abs(gl - shrink * px) <= 0.08, (  # gold gain = shrink x proxy gain (4 standard errors)
                f"expected the gold gain {shrink!r} x the proxy gain {px!r} (to 0.08) at n = {n_}, "
                f"scale {scale}, got {gl!r}")
        assert all(a < b for a, b in zip(golds[1:], golds[2:], strict=False)), (
            f"expected the gold reward to keep rising with Gaussian noise (scale {scale}), got {golds}")
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    golds, proxies = solutions.simulated_best_of_n("cauchy", 0.3, ns, 200, 1024)
    peak = max(range(len(ns)), key=golds.__getitem__)
    assert 0 < peak < len(ns) - 1 and golds[peak] > 0.5, (
        f"expected the gold reward under Cauchy noise to peak above 0.5 strictly inside n = 1..1024, "
        f"got its largest {golds[peak]!r} at n = {ns[peak]}")
    assert golds[-1] < golds[peak] / 4, (
        f"expected the gold reward at n = 1024 to fall below a quarter of its peak {golds[peak]!r}, "
        f"got {golds[-1]!r}")
    assert all(a < b for a, b in zip(proxies, proxies[1:], strict=False)), (
        f"expected the proxy reward to climb with n under Cauchy noise, got {proxies}")
    with raises(ValueError, match="noise", what='simulated_best_of_n("uniform", ...)'):
        solutions.simulated_best_of_n("uniform", 1.0, ns, 2, 4)
