"""Checks of chapter 18's exercises (notebooks/18_rlhf_ppo), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are SymPy (the variance's minimum, series of the KL estimators, a bracketed root),
sampled score-function estimates and the book's GAE (Schulman et al. (2016);
:func:`llmbook.alignment.losses.gae` and its symbolic form in
:mod:`llmbook.alignment.policy_gradient`), and the closed-form KL-regularised optimum.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.alignment.losses import gae
from llmbook.alignment.policy_gradient import gae_symbolic, score_function_samples

f64 = torch.float64

THETA = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0], dtype=f64)  # the policy of section 18.2
F = torch.tensor([3.0, 1.0, 4.0, 1.5, 2.0], dtype=f64)


def _gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def exercise_1_optimal_baseline(solutions) -> None:
    b_star = solutions.optimal_baseline(THETA, F)
    J = float((torch.softmax(THETA, 0) * F).sum())
    assert abs(b_star - J) > 0.05, (  # the best baseline is not the mean reward
        f"expected the best baseline more than 0.05 from the mean reward {J!r}, got {b_star!r}")
    quad, b = solutions.variance_quadratic(THETA, F)
    degree, leading = sp.degree(quad, b), quad.coeff(b, 2)
    assert degree == 2 and leading > 0, (
        f"expected a quadratic in b opening upwards, got degree {degree}, leading coefficient {leading}")
    (root,) = sp.solve(sp.diff(quad, b), b)
    assert math.isclose(float(root), b_star, rel_tol=1e-12, abs_tol=1e-12), (
        f"expected optimal_baseline at the quadratic's minimum {float(root)!r}, got {b_star!r}")
    var = solutions.estimator_variance
    at_best, at_mean = var(THETA, F, b_star), var(THETA, F, J)
    assert at_best < at_mean, (
        f"expected a smaller variance at b* ({at_best!r}) than at the mean reward ({at_mean!r})")
    beaten = [d for d in (-0.3, -0.01, 0.01, 0.3) if not at_best < var(THETA, F, b_star + d)]
    assert not beaten, f"expected b* to beat b* + d for every d, not for d in {beaten}"
    # the exact variance is what sampling measures
    samples = score_function_samples(THETA, F, 200_000, _gen(0), baseline=b_star)
    sampled = float(samples.var(0).sum())
    assert math.isclose(sampled, at_best, rel_tol=0.02, abs_tol=1e-12), (
        f"expected the exact variance {at_best!r} within 2% of the variance of 200,000 samples, "
        f"{sampled!r}")


def exercise_2_kl_estimators_near_the_reference(solutions) -> None:
    s = solutions.kl_estimators_near_reference()
    d = s["delta"]
    residual = sp.simplify(s["kl"] - (sp.Rational(9, 4) * d**2 - sp.Rational(9, 4) * d**3
                                      + sp.Rational(243, 32) * d**4))
    assert residual == 0, f"expected KL = 9/4 d^2 - 9/4 d^3 + 243/32 d^4, off by {residual}"
    ratio = sp.limit(s["var_k1"] / s["kl"], d, 0)
    assert ratio == 2, f"expected Var k1 / KL -> 2 (spread ~ sqrt(KL)), got {ratio}"
    ratio = sp.limit(s["var_k3"] / s["kl"] ** 2, d, 0)
    assert ratio == sp.Rational(1, 2), f"expected Var k3 / KL^2 -> 1/2, got {ratio}"
    ratio = sp.limit(s["var_k2"] / s["kl"] ** 2, d, 0)
    assert ratio == sp.Rational(1, 2), f"expected Var k2 / KL^2 -> 1/2, got {ratio}"
    bias = sp.Poly(sp.expand(s["bias_k2"]), d)
    lowest = min(m[0] for m in bias.monoms())
    assert lowest == 3, f"expected k2's bias to start at delta^3, got delta^{lowest}"
    cubic = bias.coeff_monomial(d**3)
    assert cubic != 0, f"expected a nonzero delta^3 coefficient in k2's bias, got {cubic}"


def exercise_3_gae_is_an_average_of_n_step_advantages(solutions) -> None:
    G = gae_symbolic(5)
    via_n_step = solutions.gae_from_n_step(G["r"], G["V"], G["gamma"], G["lam"])
    for t in range(5):
        residual = sp.expand(via_n_step[t] - G["closed"][t])
        assert residual == 0, f"t={t}: expected the symbolic GAE, off by {residual}"
    g = _gen(1)
    r, v = torch.randn(7, generator=g, dtype=f64), torch.randn(7, generator=g, dtype=f64)
    for gamma, lam in ((1.0, 0.95), (0.9, 0.5), (0.99, 0.0), (0.8, 1.0)):
        want = gae(r, v, gamma, lam)[0]
        got = torch.tensor([float(x) for x in solutions.gae_from_n_step(r.tolist(), v.tolist(), gamma, lam)],
                           dtype=f64)
        # torch.testing.assert_close(got, want, rtol=0, atol=1e-13): same shape, dtype, values
        err = float((got - want).abs().max())
        assert got.shape == want.shape and got.dtype == want.dtype and err <= 1e-13, (
            f"gamma={gamma}, lam={lam}: expected gae_from_n_step to equal the book's gae to 1e-13, "
            f"got shape {tuple(got.shape)} (want {tuple(want.shape)}), largest difference {err:.3g}")
    # n = 1 is the TD error; n = T - t the Monte Carlo advantage
    rl, vl = r.tolist(), v.tolist()
    got, want = solutions.n_step_advantage(rl, vl, 0.9, 2, 1), rl[2] + 0.9 * vl[3] - vl[2]
    assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected the 1-step advantage at t=2 to be the TD error {want!r}, got {got!r}")
    got = solutions.n_step_advantage(rl, vl, 0.9, 4, 3)
    want = rl[4] + 0.9 * rl[5] + 0.81 * rl[6] - vl[4]
    assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected the 3-step advantage at t=4 to be the Monte Carlo advantage {want!r}, got {got!r}")


def exercise_4_ppo_reaches_the_kl_regularised_optimum(solutions) -> None:
    for beta in (0.5, 2.0):
        g = _gen(2)
        ref = torch.randn(6, generator=g, dtype=f64)
        rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.0, 1.5], dtype=f64)
        pi = solutions.bandit_ppo(ref, rewards, beta, _gen(3))
        star = solutions.kl_regularised_optimum(ref, rewards, beta)
        tv = 0.5 * float((pi - star).abs().sum())
        assert tv < 1e-4, (  # not merely close: the noise vanishes at the optimum (see below)
            f"beta={beta}: expected PPO's policy within total variation 1e-4 of the optimum, got {tv:.3g}")
        # it did move: the optimum is far from the reference
        moved = 0.5 * float((torch.softmax(ref, 0) - star).abs().sum())
        assert moved > 0.1, (
            f"beta={beta}: expected the optimum more than 0.1 (total variation) from the "
            f"reference, got {moved:.3g}")
        # at pi* the shaped reward is the same for every action (beta log Z): no advantage left
        shaped = rewards - beta * (torch.log(star) - torch.log_softmax(ref, 0))
        spread = float(shaped.max() - shaped.min())
        assert spread < 1e-12, (
            f"beta={beta}: expected the same shaped reward for every action at the optimum, "
            f"got a spread of {spread:.3g}")
        want = beta * math.log(float(torch.exp(ref + rewards / beta).sum() / torch.exp(ref).sum()))
        got = shaped[0].item()
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (
            f"beta={beta}: expected the shaped reward beta log Z = {want!r}, got {got!r}")


def exercise_5_where_k3_spreads_more_than_k1(solutions) -> None:
    eps_star = solutions.k3_variance_crossover(0.5)
    # independently: SymPy solves L(rho_1, rho_2) = 2 for the logarithmic mean of the ratios
    e = sp.Symbol("e", positive=True)
    r1, r2 = sp.Rational(1, 2) / (1 - e), sp.Rational(1, 2) / e
    log_mean = (r2 - r1) / (sp.log(r2) - sp.log(r1))
    root = float(sp.nsolve(log_mean - 2, e, (0.02, 0.3), solver="bisect"))  # a bracket, not eps_star
    assert math.isclose(eps_star, root, rel_tol=1e-9, abs_tol=1e-12), (
        f"expected k3_variance_crossover(0.5) at SymPy's root {root!r}, got {eps_star!r}")
    below, above = solutions.k3_variance_gap(0.9 * eps_star), solutions.k3_variance_gap(1.1 * eps_star)
    assert below > 0 > above, (
        f"expected the variance gap positive just below the crossover and negative just above, "
        f"got {below!r} and {above!r}")
    # a reference that favours the outcome more moves the threshold up
    moved = solutions.k3_variance_crossover(0.8)
    assert moved > eps_star, (
        f"expected k3_variance_crossover(0.8) above k3_variance_crossover(0.5) = {eps_star!r}, got {moved!r}")
