"""Tests for llmbook.alignment.overoptimisation: best-of-n's KL, the subset estimator, the fits, the runs.

The best-of-n distribution is checked against brute-force enumeration of all K^n draws and
against Monte Carlo; the KL formula against SymPy and numerical quadrature (scipy); the
subset-averaging estimator against enumeration of every n-subset; the fits against
``scipy.optimize.curve_fit``; the runs on one or two iterations of the real models.
"""

import copy
import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad
from scipy.optimize import curve_fit
from seeded import gen

from llmbook.alignment.overoptimisation import (
    OVEROPTIMISATION_RECIPE,
    GaoFit,
    best_of_n_distribution,
    best_of_n_estimate,
    best_of_n_kl,
    best_of_n_kl_exact,
    best_of_n_kl_symbolic,
    best_of_n_pool,
    best_of_n_weights,
    evaluate_against_proxy,
    gao_curve,
    gao_fit,
    gao_peak,
    load_overoptimisation,
    plug_in_kl,
    reward_model_scorer,
    sample_best_of_n,
    train_proxy_grpo,
    train_proxy_ppo,
)

pytestmark = pytest.mark.usefixtures("one_thread")

f64 = torch.float64


def brute_force_best_of_n(probs, rewards, n):
    """Enumerate all K^n draws; the winner is uniform among the draws with the top reward."""
    K = len(probs)
    out = [0.0] * K
    for draw in itertools.product(range(K), repeat=n):
        p = math.prod(probs[i] for i in draw)
        top = max(rewards[i] for i in draw)
        winners = [i for i in draw if rewards[i] == top]
        for i in winners:
            out[i] += p / len(winners)
    return out


def brute_force_subsets(proxy, value, n):
    """Mean over all n-subsets of the value of the highest-proxy member (ties: mean over them)."""
    total, count = 0.0, 0
    for subset in itertools.combinations(range(len(proxy)), n):
        top = max(proxy[i] for i in subset)
        winners = [i for i in subset if proxy[i] == top]
        total += sum(value[i] for i in winners) / len(winners)
        count += 1
    return total / count


# ---------------------------------------------------------------- the KL formula


def test_symbolic_density_and_kl():
    out = best_of_n_kl_symbolic()
    n = sp.Symbol("n", positive=True, integer=True)
    t = sp.Symbol("t", positive=True)
    F = sp.Function("F")
    assert sp.simplify(out["density"] - n * F(t) ** (n - 1) * sp.diff(F(t), t)) == 0
    assert sp.simplify(out["kl"] - (sp.log(n) - (n - 1) / n)) == 0
    for k in (1, 2, 5, 64):
        assert float(out["kl"].subs(n, k)) == pytest.approx(best_of_n_kl(k), abs=1e-14)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_kl_formula_against_quadrature(n):
    integrand = lambda u: n * u ** (n - 1) * (math.log(n) + (n - 1) * math.log(u)) if u > 0 else 0.0  # noqa: E731
    value, _ = quad(integrand, 0, 1, limit=200)
    assert best_of_n_kl(n) == pytest.approx(value, abs=1e-9)


def test_kl_formula_worked_values():
    assert best_of_n_kl(1) == 0.0
    assert best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5, abs=1e-15)  # 0.1931...
    assert best_of_n_kl(64) == pytest.approx(3.1745, abs=1e-4)


# ---------------------------------------------------------------- the exact discrete best-of-n


def test_distribution_worked_example():
    # sorted by reward: (0: .4), (1: .2), (2: .3), (3: .1); F = .4, .6, .9, 1
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=f64)
    r = torch.tensor([3.0, 1.0, 2.0, 0.0], dtype=f64)
    q = best_of_n_distribution(p, r, 3)
    expected = [1 - 0.9**3, 0.6**3 - 0.4**3, 0.9**3 - 0.6**3, 0.4**3]  # .271, .152, .513, .064
    assert q.tolist() == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_distribution_equals_enumeration_with_ties(n):
    p = torch.softmax(torch.randn(5, generator=gen(3), dtype=f64), 0)
    r = torch.tensor([1.0, 0.0, 1.0, 2.0, 0.0], dtype=f64)  # two tied pairs
    want = brute_force_best_of_n(p.tolist(), r.tolist(), n)
    assert best_of_n_distribution(p, r, n).tolist() == pytest.approx(want, abs=1e-14)


def test_n_one_is_the_base_policy_and_large_n_the_best_outcome():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=f64)
    r = torch.tensor([0.0, 2.0, 1.0], dtype=f64)
    assert torch.allclose(best_of_n_distribution(p, r, 1), p, atol=0)
    assert best_of_n_kl_exact(p, r, 1) == pytest.approx(0.0, abs=1e-15)
    q = best_of_n_distribution(p, r, 200)
    assert q[1] == pytest.approx(1.0, abs=1e-30 + 0.7**200 * 2)
    assert best_of_n_kl_exact(p, r, 200) == pytest.approx(-math.log(0.3), abs=1e-12)  # < formula


@settings(max_examples=60, deadline=None)
@given(K=st.integers(1, 12), n=st.integers(1, 40), seed=st.integers(0, 10_000), levels=st.integers(1, 12))
def test_exact_kl_never_above_formula(K, n, seed, levels):
    g = gen(seed)
    p = torch.softmax(3 * torch.randn(K, generator=g, dtype=f64), 0)
    r = torch.randint(0, levels, (K,), generator=g).double()  # ties when levels < K
    q = best_of_n_distribution(p, r, n)
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-12) and bool((q >= 0).all())
    assert best_of_n_kl_exact(p, r, n) <= best_of_n_kl(n) + 1e-12


def test_exact_kl_converges_to_formula_as_outcomes_shrink():
    gaps = []
    for K in (10, 100, 1000, 10000):
        u = torch.full((K,), 1 / K, dtype=f64)
        gaps.append(best_of_n_kl(16) - best_of_n_kl_exact(u, torch.arange(K, dtype=f64), 16))
    assert all(g > 0 for g in gaps)
    assert all(b < a / 5 for a, b in zip(gaps, gaps[1:], strict=False))  # falls faster than 1/K
    assert gaps[-1] < 1e-6


def test_monte_carlo_matches_exact_distribution():
    K = 30
    p = torch.softmax(torch.randn(K, generator=gen(0), dtype=f64), 0)
    r = torch.randn(K, generator=gen(1), dtype=f64)
    draws = sample_best_of_n(p, r, 4, 400_000, gen(2))
    freq = torch.bincount(draws, minlength=K).double() / draws.numel()
    q = best_of_n_distribution(p, r, 4)
    assert (freq - q).abs().max() < 5 * math.sqrt(0.25 / 400_000)
    assert plug_in_kl(draws, p) == pytest.approx(best_of_n_kl_exact(p, r, 4), abs=3e-3)


def test_monte_carlo_tie_break_is_uniform():
    p = torch.tensor([0.25, 0.25, 0.5], dtype=f64)
    r = torch.tensor([1.0, 1.0, 0.0], dtype=f64)  # outcomes 0 and 1 tie at the top
    draws = sample_best_of_n(p, r, 2, 200_000, gen(5))
    freq = torch.bincount(draws, minlength=3).double() / draws.numel()
    assert freq.tolist() == pytest.approx(best_of_n_distribution(p, r, 2).tolist(), abs=5e-3)
    assert float(freq[0]) == pytest.approx(float(freq[1]), abs=5e-3)


def test_plug_in_kl_worked_example():
    p = torch.tensor([0.5, 0.5], dtype=f64)
    samples = torch.tensor([0, 0, 0, 1])
    assert plug_in_kl(samples, p) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-15)


# ---------------------------------------------------------------- the subset estimator


def test_weights_worked_example():
    # N = 4, n = 2: ranks 1..4 are the max of C(k - 1, 1) = 0, 1, 2, 3 of the 6 pairs
    w = best_of_n_weights(torch.tensor([[0.3, -1.0, 2.0, 0.5]], dtype=f64), 2)
    assert w[0].tolist() == pytest.approx([1 / 6, 0.0, 3 / 6, 2 / 6], abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 8), data=st.data(), seed=st.integers(0, 10_000), ties=st.booleans())
def test_estimate_equals_enumeration_of_subsets(N, data, seed, ties):
    n = data.draw(st.integers(1, N))
    g = gen(seed)
    proxy = torch.randint(0, 3, (3, N), generator=g).double() if ties else torch.randn(3, N, generator=g, dtype=f64)
    value = torch.randint(0, 5, (3, N), generator=g).double()
    got = best_of_n_estimate(proxy, value, n)
    want = [brute_force_subsets(proxy[b].tolist(), value[b].tolist(), n) for b in range(3)]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert best_of_n_weights(proxy, n).sum(1).tolist() == pytest.approx([1.0] * 3, abs=1e-12)


def test_estimate_n_one_is_the_mean_and_n_N_is_the_argmax():
    proxy = torch.randn(2, 7, generator=gen(0), dtype=f64)
    value = torch.randn(2, 7, generator=gen(1), dtype=f64)
    assert best_of_n_estimate(proxy, value, 1).tolist() == pytest.approx(value.mean(1).tolist(), abs=1e-14)
    top = value.gather(1, proxy.argmax(1, keepdim=True))[:, 0]
    assert best_of_n_estimate(proxy, value, 7).tolist() == pytest.approx(top.tolist(), abs=1e-14)


def test_estimate_large_pool_is_finite():
    proxy = torch.randn(2, 512, generator=gen(0), dtype=f64)
    w = best_of_n_weights(proxy, 64)
    assert bool(torch.isfinite(w).all()) and w.sum(1).tolist() == pytest.approx([1.0, 1.0], abs=1e-10)


# ---------------------------------------------------------------- the fits


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_fit_recovers_exact_coefficients(form):
    d = np.linspace(0, 4, 9)
    y = gao_curve(d, 0.7, 0.2, form)
    fit = gao_fit(d, y, form)
    assert (fit.alpha, fit.beta) == pytest.approx((0.7, 0.2), abs=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12) and fit.rmse < 1e-12


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_fit_equals_scipy_curve_fit(form):
    d = np.array([0.0, 0.3, 0.8, 1.1, 1.5, 2.2, 3.0, 4.1])
    noise = np.array([0.0, 0.05, -0.03, 0.02, -0.06, 0.04, -0.01, 0.03])
    y = gao_curve(d, 1.1, 0.3, form) + noise

    def model(x, a, b):
        return a * x - b * (x * x if form == "bon" else x * np.log(np.where(x > 0, x, 1.0)))

    (a, b), _ = curve_fit(model, d, y, p0=(1.0, 0.1))
    fit = gao_fit(d, y, form)
    assert (fit.alpha, fit.beta) == pytest.approx((a, b), rel=1e-7)
    resid = y - gao_curve(d, fit.alpha, fit.beta, form)
    assert fit.rmse == pytest.approx(float(np.sqrt((resid ** 2).mean())), rel=1e-12)
    assert fit.r2 == pytest.approx(1 - (resid ** 2).sum() / ((y - y.mean()) ** 2).sum(), rel=1e-12)


def test_curve_worked_values_and_peaks():
    assert gao_curve([0.0, 2.0], 1.0, 0.25, "bon").tolist() == pytest.approx([0.0, 1.0], abs=1e-15)
    assert gao_curve([0.0, math.e], 1.0, 0.5, "rl").tolist() == pytest.approx([0.0, math.e / 2], abs=1e-15)
    assert gao_peak(GaoFit("bon", 1.0, 0.25, 1.0, 0.0)) == pytest.approx(2.0)
    assert gao_peak(GaoFit("rl", 1.0, 0.5, 1.0, 0.0)) == pytest.approx(math.e)
    assert gao_peak(GaoFit("rl", 1.0, -0.1, 1.0, 0.0)) == math.inf
    # the peak is where the curve is highest
    for form, peak in (("bon", 2.0), ("rl", math.e)):
        grid = np.linspace(0.01, 6, 2000)
        a, b = (1.0, 0.25) if form == "bon" else (1.0, 0.5)
        assert grid[np.argmax(gao_curve(grid, a, b, form))] == pytest.approx(peak, abs=0.01)


# ---------------------------------------------------------------- bad input


def test_bad_input():
    p = torch.tensor([0.5, 0.5], dtype=f64)
    r = torch.tensor([0.0, 1.0], dtype=f64)
    with pytest.raises(ValueError, match="^n must be positive"):
        best_of_n_kl(0)
    with pytest.raises(ValueError, match="probs"):
        best_of_n_distribution(torch.tensor([0.5, 0.6], dtype=f64), r, 2)
    with pytest.raises(ValueError, match="probs and rewards"):
        best_of_n_distribution(p, torch.zeros(3, dtype=f64), 2)
    with pytest.raises(TypeError, match="rewards"):
        best_of_n_kl_exact(p, [0.0, 1.0], 2)
    with pytest.raises(ValueError, match="num"):
        sample_best_of_n(p, r, 2, 0)
    with pytest.raises(ValueError, match="samples"):
        plug_in_kl(torch.tensor([0, 2]), p)
    with pytest.raises(ValueError, match="exceeds"):
        best_of_n_weights(torch.zeros(2, 3, dtype=f64), 4)
    with pytest.raises(ValueError, match=r"proxy must be \(B, N\)"):
        best_of_n_weights(torch.zeros(3, dtype=f64), 1)
    with pytest.raises(ValueError, match="one shape"):
        best_of_n_estimate(torch.zeros(2, 3, dtype=f64), torch.zeros(2, 4, dtype=f64), 1)
    with pytest.raises(ValueError, match="form"):
        gao_fit([1.0, 2.0], [1.0, 2.0], "linear")
    with pytest.raises(ValueError, match="two points"):
        gao_fit([0.0, 1.0], [0.0, 1.0], "bon")
    with pytest.raises(ValueError, match="d must be non-negative"):
        gao_curve([-1.0], 1.0, 1.0, "bon")
    with pytest.raises(TypeError, match="fit"):
        gao_peak((1.0, 2.0))
    with pytest.raises(TypeError, match="reward_model"):
        reward_model_scorer(torch.nn.Linear(2, 1))


# ---------------------------------------------------------------- the runs, on the real models


@pytest.fixture(scope="module")
def models():
    from llmbook.alignment.preferences import keyword_ids, preference_data
    from llmbook.alignment.reward_model import load_reward_model
    from llmbook.training.pretrained import book_model

    base, info = book_model("text")
    rm, _ = load_reward_model()
    return base, rm, keyword_ids(info["tokenizer"]), preference_data("test")


def test_scorer_equals_the_reward_model_in_any_batch_size(models):
    _, rm, _, test = models
    prompts, responses = test.prompts[:5], test.chosen[:5]
    with torch.no_grad():
        direct = rm(prompts, responses)
    assert torch.allclose(reward_model_scorer(rm, batch_size=2)(prompts, responses), direct, atol=1e-5)
    assert reward_model_scorer(rm)(prompts, responses).shape == (5,)


def test_evaluate_against_proxy_at_the_reference(models):
    base, rm, kw, test = models
    out = evaluate_against_proxy(base, base, rm, test.prompts[:6], kw, seed=3)
    assert out["kl"] == 0.0 and out["d"] == 0.0
    assert out["gold"] == out["gold_check"]  # the proxy scored the same responses as the gold


def tiny_recipe():
    r = copy.deepcopy(OVEROPTIMISATION_RECIPE)
    r.update(eval_prompts=4, pool_prompts=3, pool_samples=5)
    r["ppo"].update(iterations=1, eval_every=1, batch_size=4, minibatch_size=4, epochs=1)
    r["grpo"].update(iterations=1, eval_every=1, prompts_per_step=2, group_size=2, updates_per_batch=1)
    return r


def test_pool_shapes(models):
    out = best_of_n_pool(tiny_recipe())
    proxy, gold = np.array(out["proxy"]), np.array(out["gold"])
    assert proxy.shape == gold.shape == (3, 5)
    assert np.all(gold == np.round(gold)) and np.all(gold >= 0) and np.all(gold <= 24)


@pytest.mark.parametrize("trainer", [train_proxy_ppo, train_proxy_grpo])
def test_runs_start_at_the_reference_and_move(trainer, models):
    out = trainer(tiny_recipe())
    c = out["curve"]
    assert c["step"] == [0, 1]
    assert c["kl"][0] == 0.0 and c["d"][0] == 0.0  # LoRA's B = 0: the policy is the reference
    assert c["kl"][1] != 0.0 and c["d"][1] == pytest.approx(math.sqrt(max(c["kl"][1], 0.0)))
    assert len(out["train_proxy"]) == 1


def test_load_shipped_results():
    res = load_overoptimisation()
    assert set(res) >= {"recipe", "pool", "ppo", "grpo", "made"}
    assert res["recipe"] == OVEROPTIMISATION_RECIPE  # the shipped runs used the code's recipe
    B, N = res["recipe"]["pool_prompts"], res["recipe"]["pool_samples"]
    assert np.array(res["pool"]["proxy"]).shape == (B, N)
    for run in ("ppo", "grpo"):
        c = res[run]["curve"]
        assert c["d"][0] == 0.0 and len(c["d"]) == res["recipe"][run]["iterations"] // res["recipe"][run]["eval_every"] + 1


def test_load_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBOOK_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make_overoptimisation"):
        load_overoptimisation()
