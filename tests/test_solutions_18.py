"""The exercise solutions of notebooks/18_rlhf_ppo hold."""

import math

import pytest
import sympy as sp
import torch
from seeded import gen
from solution_loader import load_solutions

from llmbook.alignment.losses import gae
from llmbook.alignment.policy_gradient import gae_symbolic, score_function_samples

solutions = load_solutions("18_rlhf_ppo")

f64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")

THETA = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0], dtype=f64)  # the policy of section 18.2
F = torch.tensor([3.0, 1.0, 4.0, 1.5, 2.0], dtype=f64)


def test_exercise_1_optimal_baseline():
    b_star = solutions.optimal_baseline(THETA, F)
    J = float((torch.softmax(THETA, 0) * F).sum())
    assert abs(b_star - J) > 0.05  # the best baseline is not the mean reward
    quad, b = solutions.variance_quadratic(THETA, F)
    assert sp.degree(quad, b) == 2 and quad.coeff(b, 2) > 0
    (root,) = sp.solve(sp.diff(quad, b), b)
    assert float(root) == pytest.approx(b_star, rel=1e-12)
    var = solutions.estimator_variance
    assert var(THETA, F, b_star) < var(THETA, F, J)
    assert all(var(THETA, F, b_star) < var(THETA, F, b_star + d) for d in (-0.3, -0.01, 0.01, 0.3))
    # the exact variance is what sampling measures
    samples = score_function_samples(THETA, F, 200_000, gen(0), baseline=b_star)
    assert float(samples.var(0).sum()) == pytest.approx(var(THETA, F, b_star), rel=0.02)


def test_exercise_2_kl_estimators_near_the_reference():
    s = solutions.kl_estimators_near_reference()
    d = s["delta"]
    assert sp.simplify(s["kl"] - (sp.Rational(9, 4) * d**2 - sp.Rational(9, 4) * d**3
                                  + sp.Rational(243, 32) * d**4)) == 0
    assert sp.limit(s["var_k1"] / s["kl"], d, 0) == 2  # Var k1 ≈ 2 KL: spread ~ sqrt(KL)
    assert sp.limit(s["var_k3"] / s["kl"] ** 2, d, 0) == sp.Rational(1, 2)  # Var k3 ≈ KL² / 2
    assert sp.limit(s["var_k2"] / s["kl"] ** 2, d, 0) == sp.Rational(1, 2)
    bias = sp.Poly(sp.expand(s["bias_k2"]), d)
    assert min(m[0] for m in bias.monoms()) == 3  # k2's bias starts at delta^3
    assert bias.coeff_monomial(d**3) != 0


def test_exercise_3_gae_is_an_average_of_n_step_advantages():
    G = gae_symbolic(5)
    via_n_step = solutions.gae_from_n_step(G["r"], G["V"], G["gamma"], G["lam"])
    for t in range(5):
        assert sp.expand(via_n_step[t] - G["closed"][t]) == 0
    g = gen(1)
    r, v = torch.randn(7, generator=g, dtype=f64), torch.randn(7, generator=g, dtype=f64)
    for gamma, lam in ((1.0, 0.95), (0.9, 0.5), (0.99, 0.0), (0.8, 1.0)):
        want = gae(r, v, gamma, lam)[0]
        got = torch.tensor([float(x) for x in solutions.gae_from_n_step(r.tolist(), v.tolist(), gamma, lam)],
                           dtype=f64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    # n = 1 is the TD error; n = T - t the Monte Carlo advantage
    rl, vl = r.tolist(), v.tolist()
    assert solutions.n_step_advantage(rl, vl, 0.9, 2, 1) == pytest.approx(rl[2] + 0.9 * vl[3] - vl[2])
    assert solutions.n_step_advantage(rl, vl, 0.9, 4, 3) == pytest.approx(
        rl[4] + 0.9 * rl[5] + 0.81 * rl[6] - vl[4])


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_exercise_4_ppo_reaches_the_kl_regularised_optimum(beta):
    g = gen(2)
    ref = torch.randn(6, generator=g, dtype=f64)
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.0, 1.5], dtype=f64)
    pi = solutions.bandit_ppo(ref, rewards, beta, gen(3))
    star = solutions.kl_regularised_optimum(ref, rewards, beta)
    tv = 0.5 * float((pi - star).abs().sum())
    assert tv < 1e-4  # not merely close: the noise vanishes at the optimum (see below)
    # it did move: the optimum is far from the reference
    assert 0.5 * float((torch.softmax(ref, 0) - star).abs().sum()) > 0.1
    # at pi* the shaped reward is the same for every action (beta log Z): no advantage left
    shaped = rewards - beta * (torch.log(star) - torch.log_softmax(ref, 0))
    assert float(shaped.max() - shaped.min()) < 1e-12
    assert shaped[0].item() == pytest.approx(beta * math.log(float(torch.exp(ref + rewards / beta).sum()
                                                                    / torch.exp(ref).sum())))


def test_exercise_5_where_k3_spreads_more_than_k1():
    eps_star = solutions.k3_variance_crossover(0.5)
    # independently: SymPy solves L(rho_1, rho_2) = 2 for the logarithmic mean of the ratios
    e = sp.Symbol("e", positive=True)
    r1, r2 = sp.Rational(1, 2) / (1 - e), sp.Rational(1, 2) / e
    log_mean = (r2 - r1) / (sp.log(r2) - sp.log(r1))
    root = float(sp.nsolve(log_mean - 2, e, (0.02, 0.3), solver="bisect"))  # a bracket, not eps_star
    assert eps_star == pytest.approx(root, rel=1e-9)
    assert solutions.k3_variance_gap(0.9 * eps_star) > 0 > solutions.k3_variance_gap(1.1 * eps_star)
    # a reference that favours the outcome more moves the threshold up
    assert solutions.k3_variance_crossover(0.8) > eps_star
