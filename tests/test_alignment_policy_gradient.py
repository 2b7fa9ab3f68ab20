"""Tests for llmbook.alignment.policy_gradient: the exact examples behind PPO (chapter 18).

The symbolic results are checked against independent numerics (finite differences,
direct sums in float64), the Monte Carlo estimators against the exact values within a
few standard errors, and the hand-derived clipped-surrogate gradient against autograd
through :func:`llmbook.alignment.losses.ppo_policy_loss`.
"""

import math

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.losses import gae, ppo_policy_loss
from llmbook.alignment.policy_gradient import (
    clipped_surrogate_grad,
    exact_policy_gradient,
    gae_symbolic,
    kl_estimator_moments,
    sample_kl_estimators,
    score_function_samples,
    softmax_policy_gradient_symbolic,
)

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64


# ---------------------------------------------------------------- policy gradient


@pytest.mark.parametrize("K", [2, 3, 4])
def test_symbolic_policy_gradient_forms_agree(K):
    d = softmax_policy_gradient_symbolic(K)
    for direct, score, closed, base in zip(d["direct"], d["score"], d["closed"], d["baseline_term"], strict=True):
        assert sp.simplify(direct - closed) == 0
        assert sp.simplify(score - closed) == 0
        assert sp.simplify(base) == 0
    # numeric check of the closed form at a point, against a finite difference of J
    point = {t: v for t, v in zip(d["theta"], [0.3, -1.2, 0.7, 0.1][:K], strict=True)}
    point.update({f: v for f, v in zip(d["f"], [2.0, -1.0, 0.5, 3.0][:K], strict=True)})
    J = sp.lambdify(list(point), d["J"])
    h = 1e-6
    args = list(point.values())
    for j in range(K):
        up, down = args.copy(), args.copy()
        up[j] += h
        down[j] -= h
        fd = (J(*up) - J(*down)) / (2 * h)
        assert float(d["closed"][j].subs(point)) == pytest.approx(fd, abs=1e-8)


def test_symbolic_policy_gradient_rejects_bad_k():
    with pytest.raises(ValueError, match="two actions"):
        softmax_policy_gradient_symbolic(1)
    with pytest.raises(TypeError, match="^K must be an int"):
        softmax_policy_gradient_symbolic(2.5)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 7), st.integers(0, 10**6))
def test_exact_policy_gradient_is_pi_times_f_minus_J(K, seed):
    g = gen(seed)
    theta, f = torch.randn(K, generator=g, dtype=D), torch.randn(K, generator=g, dtype=D)
    pi = torch.softmax(theta, 0)
    torch.testing.assert_close(exact_policy_gradient(theta, f), pi * (f - (pi * f).sum()))
    assert float(exact_policy_gradient(theta, f).sum()).__abs__() < 1e-12  # shift invariance of softmax


def test_score_function_estimate_is_unbiased_and_a_baseline_lowers_its_variance():
    theta = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0], dtype=D)
    f = torch.tensor([3.0, 1.0, 4.0, 1.5, 2.0], dtype=D) + 10  # a large offset: the baseline's case
    exact = exact_policy_gradient(theta, f)
    J = float((torch.softmax(theta, 0) * f).sum())
    N = 100_000
    for b in (0.0, J):
        samples = score_function_samples(theta, f, N, gen(1), baseline=b)
        assert samples.shape == (N, 5)
        stderr = samples.std(0) / math.sqrt(N)
        assert bool(((samples.mean(0) - exact).abs() < 5 * stderr).all())
    var_plain = score_function_samples(theta, f, N, gen(2)).var(0).sum()
    var_base = score_function_samples(theta, f, N, gen(2), baseline=torch.tensor(J)).var(0).sum()
    assert var_base < var_plain / 20


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.floats(-3, 3), st.integers(0, 10**6))
def test_each_score_function_sample_sums_to_zero(K, b, seed):
    g = gen(seed)
    theta, f = torch.randn(K, generator=g, dtype=D), torch.randn(K, generator=g, dtype=D)
    samples = score_function_samples(theta, f, 50, g, baseline=b)
    torch.testing.assert_close(samples.sum(1), torch.zeros(50, dtype=D))  # sum_k (e_a - pi)_k = 0


def test_policy_gradient_functions_reject_bad_inputs():
    with pytest.raises(ValueError, match="one length"):
        exact_policy_gradient(torch.zeros(3), torch.zeros(4))
    with pytest.raises(TypeError, match="floating"):
        exact_policy_gradient(torch.zeros(3, dtype=torch.long), torch.zeros(3))
    with pytest.raises(ValueError, match="one length"):
        score_function_samples(torch.zeros(3, 2), torch.zeros(3, 2), 5, gen(0))
    with pytest.raises(ValueError, match="num_samples"):
        score_function_samples(torch.zeros(3), torch.zeros(3), 0, gen(0))
    with pytest.raises(ValueError, match="baseline"):
        score_function_samples(torch.zeros(3), torch.zeros(3), 5, gen(0), baseline=torch.zeros(3))


# ---------------------------------------------------------------- KL estimators


def test_kl_estimator_moments_two_categories_symbolic():
    a, b = sp.symbols("a b", positive=True)
    m = kl_estimator_moments([a, 1 - a], [b, 1 - b])
    kl = m["kl"][0]
    assert sp.simplify(m["k1"][0] - kl) == 0
    assert sp.simplify(m["k3"][0] - kl) == 0
    bias_k2 = m["k2"][0] - kl
    assert sp.simplify(bias_k2) != 0
    assert abs(float(bias_k2.subs({a: sp.Rational(1, 2), b: sp.Rational(1, 10)}))) > 0.05


def test_kl_estimator_moments_match_direct_float64_sums():
    p = [sp.Rational(1, 2), sp.Rational(1, 3), sp.Rational(1, 6)]
    q = [sp.Rational(1, 5), sp.Rational(2, 5), sp.Rational(2, 5)]
    m = kl_estimator_moments(p, q)
    pt = torch.tensor([float(v) for v in p], dtype=D)
    qt = torch.tensor([float(v) for v in q], dtype=D)
    lr = torch.log(qt / pt)
    direct = {"k1": -lr, "k2": lr ** 2 / 2, "k3": qt / pt - 1 - lr}
    assert float(m["kl"][0]) == pytest.approx(float((pt * torch.log(pt / qt)).sum()), rel=1e-14)
    for name, values in direct.items():
        mean = float((pt * values).sum())
        assert float(m[name][0]) == pytest.approx(mean, rel=1e-13)
        assert float(m[name][1]) == pytest.approx(float((pt * (values - mean) ** 2).sum()), rel=1e-12)
    assert float(m["k3"][1]) < float(m["k1"][1])  # k3 has lower variance than k1 here


def test_kl_estimator_moments_reject_bad_distributions():
    half = sp.Rational(1, 2)
    with pytest.raises(ValueError, match="sum to 1"):
        kl_estimator_moments([half, half], [half, sp.Rational(1, 3)])
    with pytest.raises(ValueError, match="positive"):
        kl_estimator_moments([sp.Integer(-1), sp.Integer(2)], [half, half])
    with pytest.raises(ValueError, match="one length"):
        kl_estimator_moments([half, half], [1])


def test_sampled_kl_estimators_agree_with_the_exact_moments():
    p = [sp.Rational(1, 2), sp.Rational(1, 4), sp.Rational(1, 8), sp.Rational(1, 8)]
    q = [sp.Rational(1, 4)] * 4
    exact = kl_estimator_moments(p, q)
    est = sample_kl_estimators(torch.tensor([float(v) for v in p], dtype=D),
                               torch.tensor([float(v) for v in q], dtype=D), 200_000, gen(3))
    for name in ("k1", "k2", "k3"):
        x = getattr(est, name)
        assert x.shape == (200_000,)
        assert float(x.mean()) == pytest.approx(float(exact[name][0]), abs=5 * float(x.std()) / math.sqrt(len(x)))
        assert float(x.var()) == pytest.approx(float(exact[name][1]), rel=0.03)
    assert bool((est.k3 >= 0).all()) and bool((est.k1 < 0).any())


def test_sample_kl_estimators_rejects_bad_inputs():
    with pytest.raises(ValueError, match="positive"):
        sample_kl_estimators(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), 10, gen(0))
    with pytest.raises(ValueError, match="one length"):
        sample_kl_estimators(torch.tensor([1.0]), torch.tensor([0.5, 0.5]), 10, gen(0))


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("T", [1, 3, 6])
def test_gae_symbolic_recursion_closed_form_and_limits(T):
    d = gae_symbolic(T)
    for t in range(T):
        assert sp.expand(d["recursive"][t] - d["closed"][t]) == 0
        assert sp.expand(d["closed"][t].subs(d["lam"], 0) - d["td"][t]) == 0
        assert sp.expand(d["closed"][t].subs(d["lam"], 1) - d["mc"][t]) == 0


def test_gae_symbolic_equals_losses_gae_numerically():
    T = 5
    d = gae_symbolic(T)
    args = [*d["r"], *d["V"], d["gamma"], d["lam"]]
    fn = sp.lambdify(args, d["closed"])
    g = gen(4)
    r, v = torch.randn(T, generator=g, dtype=D), torch.randn(T, generator=g, dtype=D)
    for gamma, lam in ((0.9, 0.95), (1.0, 0.0), (0.5, 1.0)):
        want = torch.tensor(fn(*r.tolist(), *v.tolist(), gamma, lam), dtype=D)
        torch.testing.assert_close(gae(r, v, gamma, lam)[0], want, rtol=0, atol=1e-13)


def test_gae_symbolic_rejects_bad_t():
    with pytest.raises(ValueError, match="^T must be positive"):
        gae_symbolic(0)


# ---------------------------------------------------------------- clipped surrogate


def test_clipped_surrogate_grad_four_cases():
    ratio = torch.tensor([1.5, 1.1, 0.5, 0.9, 0.5, 1.5, 1.0], dtype=D)
    adv = torch.tensor([2.0, 2.0, 2.0, -1.0, -1.0, -1.0, 0.0], dtype=D)
    want = torch.tensor([0.0, 2.0, 2.0, -1.0, 0.0, -1.0, 0.0], dtype=D)
    torch.testing.assert_close(clipped_surrogate_grad(ratio, adv, 0.2), want)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.floats(0.05, 0.5), st.integers(0, 10**6))
def test_clipped_surrogate_grad_matches_autograd_through_ppo_policy_loss(b, t, eps, seed):
    g = gen(seed)
    old = torch.randn(b, t, generator=g, dtype=D)
    logp = (old + 0.6 * torch.randn(b, t, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.randn(b, t, generator=g, dtype=D)
    mask = torch.ones(b, t, dtype=D)
    loss, _ = ppo_policy_loss(logp, old, adv, mask, eps)
    (grad,) = torch.autograd.grad(loss, logp)
    ratio = torch.exp(logp.detach() - old)
    # loss = -mean(objective): d loss / d logp = -(1/N) * d objective / d rho * rho
    want = -clipped_surrogate_grad(ratio, adv, eps) * ratio / (b * t)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-14)


def test_clipped_surrogate_grad_rejects_bad_inputs():
    x = torch.ones(3, dtype=D)
    with pytest.raises(ValueError, match="one shape"):
        clipped_surrogate_grad(x, torch.ones(2, dtype=D), 0.2)
    for eps in (0.0, 1.0, True):
        with pytest.raises(ValueError, match="clip_eps"):
            clipped_surrogate_grad(x, x, eps)
