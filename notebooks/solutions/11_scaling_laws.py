"""Reference solutions to the exercises of notebooks/11_scaling_laws (checked by tests/test_solutions_11.py)."""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from llmbook.training.scaling import (
    MUENNIGHOFF_R_STAR,
    ChinchillaConstants,
    chinchilla_loss,
    compute_optimal,
    effective_data,
    fit_power_law,
    get_constants,
    inference_optimal,
    optimal_exponents,
    tokens_per_parameter,
    training_flops,
)

# ---------------------------------------------------------------- exercise 1


def size_penalty_symbolic() -> tuple[sp.Expr, tuple[sp.Symbol, ...]]:
    """Exercise 1: the excess reducible loss of a model k times the optimal size, as a fraction.

    At the optimum both terms are tied by the balance alpha A / N^alpha = beta B / D^beta =: M,
    so A / N^alpha = M / alpha and B / D^beta = M / beta. With N -> k N and D -> D / k:

        excess = (L - E)(k) / (L - E)(1) - 1 = ((k^-alpha - 1)/alpha + (k^beta - 1)/beta)
                                               / (1/alpha + 1/beta),

    in which M, hence C, A and B, cancel. Derived here from the loss with M eliminated;
    returns the expression and its symbols (k, alpha, beta).
    """
    k, al, be, M = sp.symbols("k alpha beta M", positive=True)
    term_n, term_d = M / al, M / be  # A / N_opt^alpha and B / D_opt^beta at the optimum
    reducible_opt = term_n + term_d
    reducible_k = term_n * k**-al + term_d * k**be  # (k N)^-alpha and (D / k)^-beta
    excess = sp.simplify(reducible_k / reducible_opt - 1)
    assert M not in excess.free_symbols
    return excess, (k, al, be)


def size_penalty(k: float, constants: str | ChinchillaConstants = "hoffmann2022") -> float:
    """Exercise 1: the fraction by which L - E exceeds its optimum for a model k times too large."""
    c = get_constants(constants)
    if not k > 0:
        raise ValueError(f"k must be > 0, got k={k}")
    a, b = c.alpha, c.beta
    return ((k**-a - 1) / a + (k**b - 1) / b) / (1 / a + 1 / b)


# ---------------------------------------------------------------- exercise 2


def isoflop_exponent(constants: str | ChinchillaConstants = "besiroglu2024",
                     budgets: tuple[float, ...] = (1e19, 1e20, 1e21, 1e22, 1e23),
                     noise: float = 0.002, seed: int = 0, points: int = 9,
                     spacing_decades: float = 0.3) -> tuple[float, np.ndarray]:
    """Exercise 2: Hoffmann et al.'s approach 2 on synthetic iso-FLOP profiles.

    For each budget C: ``points`` model sizes ``spacing_decades`` apart, centred on a
    deliberately rough guess (N ~ 0.1 sqrt(C), not the true optimum), each loss
    L(N, C/6N) multiplied by exp(noise * standard normal); a parabola in log N through
    the profile; its vertex is the estimated N_opt. Returns the exponent a of
    N_opt ~ C^a fitted with :func:`fit_power_law` and the vertices, shape (len(budgets),).
    """
    rng = np.random.default_rng(seed)
    vertices = []
    for C in budgets:
        centre = math.log10(0.1 * math.sqrt(C))
        offsets = spacing_decades * (np.arange(points) - (points - 1) / 2)
        N = 10.0 ** (centre + offsets)  # (points,)
        loss = chinchilla_loss(N, C / (6 * N), constants)
        loss = loss * np.exp(noise * rng.standard_normal(points))
        c2, c1, _ = np.polyfit(np.log(N), loss, 2)  # loss ~ c2 u^2 + c1 u + c0, u = log N
        vertices.append(math.exp(-c1 / (2 * c2)))
    vertices = np.array(vertices)
    fit = fit_power_law(np.array(budgets), 1.0 / vertices)  # 1 / N_opt = a' C^(-a)
    return fit.alpha, vertices


# ---------------------------------------------------------------- exercise 3


def agreement_budget(first: str = "hoffmann2022", second: str = "besiroglu2024") -> float:
    """Exercise 3: the budget C at which the two fits recommend the same N_opt.

    G1 (C/6)^a1 = G2 (C/6)^a2  =>  C = 6 (G2 / G1)^(1 / (a1 - a2)).
    At that C, D_opt = C / (6 N_opt) agrees too, and so do the tokens per parameter.
    """
    def G(c: ChinchillaConstants) -> float:
        return (c.alpha * c.A / (c.beta * c.B)) ** (1 / (c.alpha + c.beta))

    c1, c2 = get_constants(first), get_constants(second)
    a1, a2 = optimal_exponents(c1)[0], optimal_exponents(c2)[0]
    if a1 == a2:
        raise ValueError("the two fits have the same exponent: their lines never cross")
    return 6.0 * (G(c2) / G(c1)) ** (1.0 / (a1 - a2))


def agreement_tokens_per_parameter() -> float:
    """Exercise 3: the tokens per parameter at :func:`agreement_budget` (the same for both fits)."""
    return float(tokens_per_parameter(agreement_budget(), "hoffmann2022"))


# ---------------------------------------------------------------- exercise 4


def optimal_loss(C: float, constants: str | ChinchillaConstants) -> float:
    """The loss of the compute-optimal model at budget C."""
    return chinchilla_loss(*compute_optimal(C, constants), constants)


def overtraining(N: float = 7e9, D: float = 2e12,
                 constants: str | ChinchillaConstants = "hoffmann2022") -> dict[str, float]:
    """Exercise 4: a model trained past its compute-optimal point, and what it cost.

    The optimal loss falls monotonically with C, so the budget C* whose optimal model
    matches L(N, D) is found by bisection on log C (to 1e-12 relative). Returns
    ``loss``, ``C`` (= 6 N D), ``C_star``, ``compute_ratio`` = C / C* and ``N_star``.
    The price buys a smaller model for the same loss: cheaper at inference, which for a
    widely used model soon outweighs the extra training.
    """
    target = chinchilla_loss(N, D, constants)
    C = training_flops(N, D)
    lo, hi = math.log(1e10), math.log(C)  # optimal at C is no worse than (N, D): L_opt(C) <= target
    if optimal_loss(math.exp(lo), constants) <= target:
        raise ValueError("the loss is reachable below 1e10 FLOPs; widen the bracket")
    for _ in range(200):
        mid = (lo + hi) / 2
        if optimal_loss(math.exp(mid), constants) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    C_star = math.exp((lo + hi) / 2)
    return {"loss": target, "C": C, "C_star": C_star, "compute_ratio": C / C_star,
            "N_star": compute_optimal(C_star, constants)[0]}


# ---------------------------------------------------------------- exercise 5


def emergence_threshold(c: float, alpha: float, L: int, level: float = 0.5) -> dict[str, float]:
    """Exercise 5: where exact match on ``L``-token answers reaches ``level``.

    With per-token loss ``ell = c N^-alpha`` and ``p = exp(-ell)``, exact match is
    ``p^L = exp(-L c N^-alpha)``. It reaches ``level`` when ``p = level^(1/L)``, that is
    ``ell = -log(level) / L``, at ``N = (L c / -log(level))^(1/alpha)``. Returns ``p`` and ``N``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return {"p": level ** (1 / L), "N": (L * c / -math.log(level)) ** (1 / alpha)}


# ---------------------------------------------------------------- exercise 6


def half_value_epoch(r_star: float = MUENNIGHOFF_R_STAR) -> float:
    """Exercise 6a: the epoch at which one more pass is worth half a pass of fresh tokens.

    The ``k``-th repetition is worth ``exp(-k / R*)`` (Muennighoff et al., 2023); it is one
    half at ``k = R* log 2``, that is in epoch ``1 + R* log 2`` (10.7 repetitions after the
    first pass for ``R* = 15.4``).
    """
    return 1.0 + r_star * math.log(2.0)


def epochs_at_efficiency(q: float = 0.9, r_star: float = MUENNIGHOFF_R_STAR) -> float:
    """Exercise 6a: the number of epochs ``D / U`` at which ``D' / D`` has fallen to ``q``.

    ``D' / D = (1 + R* (1 - exp(-R / R*))) / (1 + R)`` falls from 1 as ``R`` grows, so a
    bisection on ``R`` in ``[0, 1e6]`` finds where it equals ``q`` (to 1e-12).
    """
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    lo, hi = 0.0, 1e6
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        if effective_data(1.0, 1.0 + mid, r_star) / (1.0 + mid) > q:
            lo = mid
        else:
            hi = mid
    return 1.0 + (lo + hi) / 2


def inference_savings(n_ref: float = 7e9, served: tuple[float, ...] = (0.0, 1e12, 1e13, 1e14),
                      constants: str | ChinchillaConstants = "besiroglu2024") -> list[dict[str, float]]:
    """Exercise 6b: reach the loss of the compute-optimal ``n_ref``-parameter model and serve
    ``D_inf`` tokens. For each ``D_inf``, the inference-optimal ``N`` and ``D``
    (:func:`inference_optimal`) and the fraction of lifetime compute ``6 N D + 2 N D_inf``
    saved against the compute-optimal model (which serves the same tokens).
    """
    c = get_constants(constants)
    g = (c.alpha * c.A / (c.beta * c.B)) ** (1.0 / (c.alpha + c.beta))
    a, _ = optimal_exponents(c)
    d_ref = compute_optimal(6.0 * (n_ref / g) ** (1.0 / a), c)[1]  # the budget whose N_opt is n_ref
    target = chinchilla_loss(n_ref, d_ref, c)
    rows = []
    for d_inf in served:
        n, d = inference_optimal(target, d_inf, c)
        ref_cost = 6 * n_ref * d_ref + 2 * n_ref * d_inf
        rows.append({"D_inf": d_inf, "N": n, "D": d,
                     "saving": 1.0 - (6 * n * d + 2 * n * d_inf) / ref_cost})
    return rows


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
