"""Reference solutions to the exercises of notebooks/18b_reward_overoptimisation.

Checked by tests/test_solutions_18b.py.
"""

from __future__ import annotations

import math

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.overoptimisation import best_of_n_estimate, best_of_n_kl
from llmbook.alignment.repeated_sampling import expected_max_gaussian

# ---------------------------------------------------------------- exercise 1


def gaussian_proxy_over_d(ns: list[int]) -> list[tuple[int, float, float, float]]:
    """(n, d, E[max of n normals], their ratio) for each n: best-of-n of a standard normal proxy.

    E[max] grows like sqrt(2 log n) and d = sqrt(log n - (n - 1)/n) like sqrt(log n), so the
    ratio tends to sqrt(2) = 1.414, but only logarithmically slowly: it rises from 1.28 at n = 2
    to only 1.36 at n = 2^20, so the proxy is close to linear in d throughout.
    """
    rows = []
    for n in ns:
        d = math.sqrt(best_of_n_kl(n))
        top = expected_max_gaussian(n)
        rows.append((n, d, top, top / d))
    return rows


# ---------------------------------------------------------------- exercise 2


def jensen_gap_leading_term() -> sp.Expr:
    """The second-order Jensen gap of one interval of width h, in the Taylor coefficients of g.

    With g(c + x) = g0 + g1 x + g2 x^2 / 2 on [c - h/2, c + h/2] and phi(t) = t log t, the
    gap int phi(g) - h phi(mean g) expanded in h starts at h^3 g1^2 / (24 g0): returned as
    that leading term (SymPy finds it from the series).
    """
    g0, g1, g2, x, h = sp.symbols("g0 g1 g2 x h", positive=True)
    g = g0 + g1 * x + g2 * x**2 / 2
    phi_g = sp.series(g * sp.log(g), x, 0, 4).removeO()
    integral = sp.integrate(phi_g, (x, -h / 2, h / 2))
    mean = sp.integrate(g, (x, -h / 2, h / 2)) / h
    gap = sp.series(integral - h * mean * sp.log(mean), h, 0, 4).removeO()
    return sp.simplify(gap)


def discrete_gap_formula() -> sp.Expr:
    """Total gap for K equal intervals: (1/(24 K^2)) int_0^1 g'^2 / g du with g = n u^(n-1).

    Summing h^3 g'^2 / (24 g) over the K intervals of width h = 1/K is a Riemann sum for
    h^2 / 24 times the integral; for g = n u^(n-1) the integral is n (n - 1)^2 / (n - 2)
    (n > 2). Returned in the symbols n and K.
    """
    k, K, u = sp.Symbol("k", positive=True), sp.Symbol("K", positive=True), sp.Symbol("u", positive=True)
    n = k + 2  # n > 2: the integral of u^(n-3) converges at 0
    g = n * u ** (n - 1)
    integrand = sp.powsimp(sp.simplify(sp.diff(g, u) ** 2 / g))
    integral = sp.integrate(integrand, (u, 0, 1))
    return sp.simplify((integral / (24 * K**2)).subs(k, sp.Symbol("n", positive=True) - 2))


# ---------------------------------------------------------------- exercise 3


def gaussian_noise_shrinkage() -> sp.Expr:
    """E[G | P] / P for G ~ N(0, 1), P = G + noise ~ N(0, s^2): Cov(G, P) / Var(P) = 1 / (1 + s^2).

    (G, P) are jointly Gaussian, so the conditional mean is linear in P with the regression
    coefficient.
    """
    s = sp.Symbol("s", positive=True)
    cov_gp, var_p = sp.Integer(1), 1 + s**2
    return sp.simplify(cov_gp / var_p)


def simulated_best_of_n(noise: str, scale: float, ns: list[int], prompts: int, samples: int,
                        seed: int = 0) -> tuple[list[float], list[float]]:
    """Best-of-n by a noisy proxy on simulated pools: (gold gains, proxy gains), one per n.

    Gold G ~ N(0, 1); proxy P = G + scale * noise, the noise ``"gaussian"`` (standard normal)
    or ``"cauchy"`` (standard Cauchy, heavy-tailed). ``prompts`` x ``samples`` draws form the
    pool; the gains are :func:`~llmbook.alignment.overoptimisation.best_of_n_estimate`
    averaged over prompts (the base policy's mean is 0 in expectation).
    """
    if noise not in ("gaussian", "cauchy"):
        raise ValueError(f"noise must be 'gaussian' or 'cauchy', got {noise!r}")
    g = torch.Generator().manual_seed(seed)
    gold = torch.randn(prompts, samples, generator=g, dtype=torch.float64)
    if noise == "gaussian":
        err = torch.randn(prompts, samples, generator=g, dtype=torch.float64)
    else:
        u = torch.rand(prompts, samples, generator=g, dtype=torch.float64)
        err = torch.tan(math.pi * (u - 0.5))
    proxy: Tensor = gold + scale * err
    golds = [float(best_of_n_estimate(proxy, gold, n).mean()) for n in ns]
    proxies = [float(best_of_n_estimate(proxy, proxy, n).mean()) for n in ns]
    return golds, proxies
