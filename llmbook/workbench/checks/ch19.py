"""Checks of chapter 19's exercises (notebooks/19_dpo), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the optima of the pair losses written here in SymPy (and their limits), the
two ends of the beta trade-off (the best response, the reference's mean reward), the
book's closed-form optimum :func:`llmbook.alignment.dpo.optimal_policy` and its KL, and
the collapse of the unweighted descent onto one response, -log pi_ref(y).
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.alignment.dpo import optimal_policy

f64 = torch.float64


def _problem() -> tuple[torch.Tensor, torch.Tensor]:
    """Six responses with keyword-count rewards and a seeded reference distribution."""
    ref = torch.softmax(torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=f64), -1)
    return ref, torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 3.0], dtype=f64)


def exercise_1_dpo_margin_unbounded_ipo_margin_bounded(solutions) -> None:
    h_dpo, h_ipo = solutions.pair_optima()
    p, beta, tau = sp.symbols("p beta tau", positive=True)
    want_dpo, want_ipo = sp.log(p / (1 - p)) / beta, (2 * p - 1) / (2 * tau)
    assert sp.simplify(h_dpo - want_dpo) == 0, f"expected DPO's optimal margin {want_dpo}, got {h_dpo}"
    assert sp.simplify(h_ipo - want_ipo) == 0, f"expected IPO's optimal margin {want_ipo}, got {h_ipo}"
    dpo_limit, ipo_limit = sp.limit(h_dpo, p, 1, "-"), sp.limit(h_ipo, p, 1, "-")
    assert dpo_limit == sp.oo, f"expected DPO's margin to grow without bound as p -> 1, got the limit {dpo_limit}"
    assert ipo_limit == 1 / (2 * tau), f"expected IPO's margin to tend to 1/(2 tau) as p -> 1, got {ipo_limit}"
    at_half = (h_dpo.subs(p, sp.Rational(1, 2)), h_ipo.subs(p, sp.Rational(1, 2)))
    assert at_half == (0, 0), f"expected both margins to be 0 at p = 1/2, got {at_half}"


def exercise_2_beta_trades_reward_for_kl(solutions) -> None:
    ref, r = _problem()
    betas = [0.1, 0.2, 0.5, 1.0, 2.0, 10.0]
    points = [solutions.optimum_reward_and_kl(ref, r, b) for b in betas]
    rewards, kls = zip(*points, strict=True)
    assert all(a > b for a, b in zip(rewards, rewards[1:], strict=False)), (
        f"expected the optimum's reward to fall as beta grows through {betas}, got {rewards}")
    assert all(a > b for a, b in zip(kls, kls[1:], strict=False)), (
        f"expected the optimum's KL to fall as beta grows through {betas}, got {kls}")
    small, best = rewards[0], 3.0
    assert abs(small - best) <= 0.01, (
        f"expected (nearly) the best response's reward 3 at beta = 0.1 (to 0.01), got {small!r}")
    large, reference = rewards[-1], float((ref * r).sum())
    assert abs(large - reference) <= 0.1, (
        f"expected (nearly) the reference's mean reward {reference!r} at beta = 10 (to 0.1), got {large!r}")
    for b, (_, kl) in zip(betas, points, strict=True):
        from_reward = solutions.kl_from_reward(ref, r, b)
        assert abs(from_reward - kl) <= 1e-12, (
            f"expected kl_from_reward at beta = {b} to give the optimum's KL {kl!r} (to 1e-12), got {from_reward!r}")
        auto, closed = solutions.reward_slope(ref, r, b)
        assert abs(auto - closed) <= max(1e-10 * abs(closed), 1e-12) and auto < 0, (
            f"expected the autograd slope to equal the closed form (to 1e-10 relative) and be negative "
            f"at beta = {b}, got {auto!r} and {closed!r}")


def exercise_3_the_weight_keeps_dpo_at_the_optimum(solutions) -> None:
    ref, r = _problem()
    kls, pi = solutions.tabular_descent(ref, r, 0.5, weighted=True, steps=3000, lr=50.0)
    star = optimal_policy(ref, r, 0.5)
    gap = (pi - star).abs().max().item()
    assert torch.allclose(pi, star, atol=1e-10), (
        f"expected the weighted descent to reach the optimal policy (to 1e-10), largest difference {gap:.3g}")
    last, want = kls[-1], float((star * (star / ref).log()).sum())
    assert abs(last - want) <= 1e-10, f"expected the final KL to be the optimum's {want!r} (to 1e-10), got {last!r}"
    kls_u, pi_u = solutions.tabular_descent(ref, r, 0.5, weighted=False, steps=3000, lr=50.0)
    # without the weight the policy collapses onto one response: KL -> -log pi_ref(y) ...
    top = int(pi_u.argmax())
    mass = float(pi_u[top])
    assert mass > 1 - 1e-9, f"expected the unweighted descent to put all its mass on one response, got {mass!r}"
    last, want = kls_u[-1], -math.log(ref[top])
    assert abs(last - want) <= 1e-6, (
        f"expected the collapsed policy's KL -log pi_ref(y) = {want!r} (to 1e-6), got {last!r}")
    # ... and not onto the best one: the collapse follows win rates under pi_ref, not r
    assert r[top] < r.max(), (
        f"expected the collapse onto a response other than the best one, got response {top} of reward {float(r[top])}")
