"""The exercise solutions of notebooks/19_dpo hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.alignment.dpo import optimal_policy

solutions = load_solutions("19_dpo")

f64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")


def problem():
    """Six responses with keyword-count rewards and a seeded reference distribution."""
    ref = torch.softmax(torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=f64), -1)
    return ref, torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 3.0], dtype=f64)


def test_exercise_1_dpo_margin_unbounded_ipo_margin_bounded():
    h_dpo, h_ipo = solutions.pair_optima()
    p, beta, tau = sp.symbols("p beta tau", positive=True)
    assert sp.simplify(h_dpo - sp.log(p / (1 - p)) / beta) == 0
    assert sp.simplify(h_ipo - (2 * p - 1) / (2 * tau)) == 0
    assert sp.limit(h_dpo, p, 1, "-") == sp.oo
    assert sp.limit(h_ipo, p, 1, "-") == 1 / (2 * tau)
    assert h_dpo.subs(p, sp.Rational(1, 2)) == 0 and h_ipo.subs(p, sp.Rational(1, 2)) == 0


def test_exercise_2_beta_trades_reward_for_kl():
    ref, r = problem()
    betas = [0.1, 0.2, 0.5, 1.0, 2.0, 10.0]
    points = [solutions.optimum_reward_and_kl(ref, r, b) for b in betas]
    rewards, kls = zip(*points, strict=True)
    assert all(a > b for a, b in zip(rewards, rewards[1:], strict=False))  # reward falls with beta
    assert all(a > b for a, b in zip(kls, kls[1:], strict=False))  # and so does the KL
    assert rewards[0] == pytest.approx(3.0, abs=0.01)  # small beta: (nearly) the best response
    assert rewards[-1] == pytest.approx(float((ref * r).sum()), abs=0.1)  # large beta: the reference
    for b, (_, kl) in zip(betas, points, strict=True):
        assert solutions.kl_from_reward(ref, r, b) == pytest.approx(kl, abs=1e-12)
        auto, closed = solutions.reward_slope(ref, r, b)
        assert auto == pytest.approx(closed, rel=1e-10) and auto < 0


def test_exercise_3_the_weight_keeps_dpo_at_the_optimum():
    ref, r = problem()
    kls, pi = solutions.tabular_descent(ref, r, 0.5, weighted=True, steps=3000, lr=50.0)
    star = optimal_policy(ref, r, 0.5)
    assert torch.allclose(pi, star, atol=1e-10)
    assert kls[-1] == pytest.approx(float((star * (star / ref).log()).sum()), abs=1e-10)
    kls_u, pi_u = solutions.tabular_descent(ref, r, 0.5, weighted=False, steps=3000, lr=50.0)
    # without the weight the policy collapses onto one response: KL -> -log pi_ref(y) ...
    top = int(pi_u.argmax())
    assert pi_u[top] > 1 - 1e-9
    assert kls_u[-1] == pytest.approx(-math.log(ref[top]), abs=1e-6)
    # ... and not onto the best one: the collapse follows win rates under pi_ref, not r
    assert r[top] < r.max()
