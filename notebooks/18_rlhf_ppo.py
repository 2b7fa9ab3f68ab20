# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 18 RLHF with PPO
#
# Chapter 17 turned preferences into a reward. This chapter trains a policy to *earn* it:
# reinforcement learning from human feedback as in Ziegler et al. (2019, "Fine-Tuning
# Language Models from Human Preferences") and InstructGPT (Ouyang et al., 2022), with
# Proximal Policy Optimization (PPO; Schulman et al., 2017). To see exactly what the method
# does, the reward here is the *true* reward of the book's alignment task (chapter 17): the
# number of Python-value keywords (" value", " None", " list", ...) in a 24-token continuation
# of a docstring prompt. This chapter:
#
# 1. states the **KL-regularised objective** and turns it into a per-token reward;
# 2. derives the **policy-gradient theorem** in SymPy and checks it by Monte Carlo, error
#    shrinking like $1/\sqrt N$ and a baseline cutting the variance;
# 3. derives the bias and variance of the three **KL estimators** $k_1, k_2, k_3$, samples
#    them, finds where $k_3$ spreads *more* than $k_1$, and derives what each one's gradient
#    estimates when it is used as a loss;
# 4. proves the telescoping sum behind **GAE** and its two limits;
# 5. finds where the **clipped surrogate** has zero gradient, checked with autograd;
# 6. runs **PPO on the book's text model**, shipped as two runs;
# 7. shows **reward hacking** when the KL coefficient is too small.

# %%
import copy
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import display
from torchrl.objectives.value.functional import generalized_advantage_estimate

from llmbook.alignment.losses import (
    gae,
    kl_estimator_loss_gradients,
    kl_estimator_variances,
    ppo_policy_loss,
    ppo_value_loss,
)
from llmbook.alignment.policy_gradient import (
    clipped_surrogate_grad,
    exact_policy_gradient,
    gae_symbolic,
    kl_estimator_moments,
    sample_kl_estimators,
    score_function_samples,
    softmax_policy_gradient_symbolic,
)
from llmbook.alignment.ppo import (
    PPO_RECIPE,
    ValueModel,
    kl_shaped_rewards,
    load_ppo_policy,
    make_policy,
    ppo_update,
    rollout,
    sampler_logprobs,
)
from llmbook.alignment.preferences import (
    evaluate_policy,
    keyword_ids,
    keyword_reward,
    preference_data,
    sample_responses,
)
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.training.pretrained import book_model

g = seed_everything(0)
torch.set_num_threads(1)  # a small model: one thread is steadier
f64 = torch.float64

# %% [markdown]
# ## 18.1 The KL-regularised objective
#
# A prompt $x$ is continued by a response $y = (y_1, \dots, y_R)$ drawn from the policy
# $\pi_\theta(\cdot \mid x)$. RLHF maximises the reward while staying close to the reference
# model $\pi_{\text{ref}}$ it started from:
#
# $$ J(\pi) = \mathbb E_{x}\Big[\ \mathbb E_{y\sim\pi(\cdot|x)}\big[r(x, y)\big]
#    - \beta\, \mathrm{KL}\big(\pi(\cdot|x)\,\|\,\pi_{\text{ref}}(\cdot|x)\big)\Big]. $$
#
# The KL term keeps the policy where the reward can be trusted: a learned reward is only a
# proxy, and pushing it far from the data it was fitted on finds its flaws (Gao et al.,
# 2023, "Scaling Laws for Reward Model Overoptimization"). Section 18.7 shows what happens
# without enough of it, and chapter 18b measures the flaws of chapter 17's learned reward.
#
# Because $\log \pi(y|x) = \sum_t \log \pi(y_t \mid s_t)$ with the *state*
# $s_t = (x, y_{<t})$, the KL of whole responses is the expected sum of per-token log-ratios,
#
# $$ \mathrm{KL}\big(\pi(\cdot|x)\|\pi_{\text{ref}}(\cdot|x)\big)
#    = \mathbb E_{y\sim\pi}\Big[\sum_{t=1}^{R} \log\frac{\pi(y_t|s_t)}{\pi_{\text{ref}}(y_t|s_t)}\Big], $$
#
# so $J$ is the expected *return* of an episode with one reward per token,
#
# $$ r_t = -\beta\,\big(\log\pi(y_t|s_t) - \log\pi_{\text{ref}}(y_t|s_t)\big) + [t = R]\; r(x, y). $$
#
# SymPy checks the first identity on the smallest case with structure: a two-token response
# over the vocabulary $\{a, b\}$, where the second token's distribution depends on the first.

# %%
u, va, vb, U, Va, Vb = sp.symbols("u v_a v_b u' v'_a v'_b", positive=True)


def two_token(first, second_a, second_b):
    """Probability of each response (y1, y2) and of each of its two tokens."""
    p1 = {"a": first, "b": 1 - first}
    p2 = {("a", "a"): second_a, ("a", "b"): 1 - second_a, ("b", "a"): second_b, ("b", "b"): 1 - second_b}
    return {(y1, y2): (p1[y1] * p2[(y1, y2)], p1[y1], p2[(y1, y2)]) for y1 in "ab" for y2 in "ab"}


pi, ref = two_token(u, va, vb), two_token(U, Va, Vb)
kl_sequences = sum(pi[y][0] * sp.log(pi[y][0] / ref[y][0]) for y in pi)
kl_tokens = sum(pi[y][0] * (sp.log(pi[y][1] / ref[y][1]) + sp.log(pi[y][2] / ref[y][2])) for y in pi)
assert sp.simplify(sp.expand_log(kl_sequences - kl_tokens, force=True)) == 0
print("KL of 2-token responses = E[sum of per-token log-ratios]: True")

# %% [markdown]
# `kl_shaped_rewards` builds the per-token rewards, with the score on the last response
# token (or the last unmasked one, for right-padded batches); summed over a response they
# are $r(x, y) - \beta \log\frac{\pi(y|x)}{\pi_{\text{ref}}(y|x)}$.

# %%
show_source(kl_shaped_rewards)

# %%
logp, logp_ref = torch.randn(3, 24, generator=g, dtype=f64), torch.randn(3, 24, generator=g, dtype=f64)
scores = torch.tensor([2.0, 0.0, 5.0], dtype=f64)
shaped = kl_shaped_rewards(scores, logp, logp_ref, beta=0.3)
checks = Checks("per-token rewards")
checks.close("sum over tokens = r - β log π(y|x)/π_ref(y|x)", scores - 0.3 * (logp - logp_ref).sum(1),
             shaped.sum(1), tol=1e-13)
checks.close("tokens before the last: -β log-ratio only", -0.3 * (logp - logp_ref)[:, :-1], shaped[:, :-1], tol=1e-15)
checks

# %% [markdown]
# ## 18.2 The policy-gradient theorem
#
# To climb $J$ one needs its gradient, but $J$ is an expectation over samples from the very
# distribution being changed. The **score-function identity** moves the gradient inside:
# for a distribution $\pi_\theta$ over a finite set,
#
# $$ \nabla_\theta\, \mathbb E_{a\sim\pi_\theta}[f(a)] = \sum_a f(a)\,\nabla_\theta \pi_\theta(a)
#    = \sum_a \pi_\theta(a)\, f(a)\,\nabla_\theta \log\pi_\theta(a)
#    = \mathbb E_{a\sim\pi_\theta}\big[f(a)\,\nabla_\theta\log\pi_\theta(a)\big], $$
#
# using $\nabla\pi = \pi\,\nabla\log\pi$. The right-hand side can be estimated from samples of
# the current policy alone (REINFORCE; Williams, 1992). Subtracting a constant *baseline* $b$
# from $f$ changes nothing in expectation, because
# $\mathbb E[\nabla\log\pi] = \sum_a \nabla\pi(a) = \nabla 1 = 0$, but it can shrink the
# variance a lot.
#
# For a softmax policy $\pi = \mathrm{softmax}(\theta)$ both sides have the closed form
# $\partial J/\partial\theta_j = \pi_j (f_j - J)$. SymPy derives all three forms for $K = 3$
# actions, and the baseline term:

# %%
pg = softmax_policy_gradient_symbolic(3)
for j in range(3):
    assert sp.simplify(pg["direct"][j] - pg["closed"][j]) == 0  # d/dθ_j of sum_k π_k f_k
    assert sp.simplify(pg["score"][j] - pg["closed"][j]) == 0  # E[f ∂ log π / ∂θ_j]
    assert sp.simplify(pg["baseline_term"][j]) == 0  # E[∂ log π / ∂θ_j] = 0
display(sp.Eq(sp.Symbol(r"\partial J/\partial\theta_0"), sp.factor(sp.simplify(pg["direct"][0]))))

# %% [markdown]
# **Checked by Monte Carlo.** A policy over $K = 5$ actions with positive rewards (like
# keyword counts). The exact gradient comes from autograd of $\sum_k \pi_k f_k$ and from the
# SymPy closed form; the estimate is the mean of $N$ single-sample estimates
# $(f(a) - b)\,\nabla\log\pi(a)$ with $\nabla_\theta\log\pi(a) = e_a - \pi$. Its error is that
# of a mean of $N$ independent terms: root-mean-square $\sqrt{\sigma^2_b / N}$, with the total
# variance of one term
#
# $$ \sigma_b^2 = \mathbb E\big[(f(a)-b)^2\,\|e_a - \pi\|^2\big] - \|\nabla J\|^2 , $$
#
# computed exactly below and compared with 100 independent estimates at each $N$.

# %%
theta = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0], dtype=f64)
f = torch.tensor([3.0, 1.0, 4.0, 1.5, 2.0], dtype=f64)
exact = exact_policy_gradient(theta, f)
pg5 = softmax_policy_gradient_symbolic(5)
closed = sp.lambdify([*pg5["theta"], *pg5["f"]], pg5["closed"])(*theta.tolist(), *f.tolist())
probs = torch.softmax(theta, 0)
J_value = float(probs @ f)
scores_sq = ((torch.eye(5, dtype=f64) - probs) ** 2).sum(1)  # ||e_a - π||², one per action


def total_variance(b):
    return float((probs * (f - b) ** 2 * scores_sq).sum() - exact.pow(2).sum())


checks = Checks("the exact policy gradient")
checks.close("autograd = SymPy closed form π_j (f_j - J)", torch.tensor(closed), exact, tol=1e-15)
checks.true("a baseline b = J cuts the variance σ² more than 3-fold",
            total_variance(J_value) < total_variance(0.0) / 3, got=total_variance(0.0) / total_variance(J_value))
checks

# %%
Ns, reps = np.array([10, 100, 1000, 10000]), 100
rms = {}
for b, name in ((0.0, "no baseline"), (J_value, "baseline b = J")):
    rms[name] = np.array([np.sqrt(np.mean([float((score_function_samples(theta, f, int(n), g, b).mean(0)
                                                    - exact).pow(2).sum()) for _ in range(reps)]))
                          for n in Ns])
slopes = {name: np.polyfit(np.log(Ns), np.log(err), 1)[0] for name, err in rms.items()}
checks = Checks("Monte Carlo policy gradient (100 estimates per N)")
for (name, err), b in zip(rms.items(), (0.0, J_value), strict=True):
    checks.close(f"{name}: slope of log RMS error against log N", -0.5, slopes[name], tol=0.05)
    predicted = np.sqrt(total_variance(b) / Ns)
    checks.true(f"{name}: RMS error within 15 % of sqrt(σ²/N) at every N",
                bool(np.all(np.abs(err / predicted - 1) < 0.15)))
checks

# %%
fig, ax = plt.subplots(figsize=(6, 4))
for (name, err), b, marker in zip(rms.items(), (0.0, J_value), "os", strict=True):
    ax.loglog(Ns, err, marker, label=f"{name}: measured")
    ax.loglog(Ns, np.sqrt(total_variance(b) / Ns), "--", color=ax.lines[-1].get_color(),
              label=f"{name}: √(σ²/N)")
ax.set(xlabel="samples N", ylabel="RMS error of the gradient estimate",
       title="REINFORCE on a 5-action softmax policy")
ax.legend()
fig.tight_layout()
save_figure(fig, "18_rlhf_ppo_policy_gradient")
plt.show()

# %% [markdown]
# Both lines fall with slope $-\tfrac12$: ten times the samples for a $\sqrt{10}$ smaller
# error. The baseline moves the whole line down, as if it had multiplied the samples by
# $\sigma_0^2/\sigma_J^2$. (The best constant baseline is not quite $J$; exercise 1 finds it.)
#
# **From actions to responses.** For a response, $\nabla\log\pi(y|x) = \sum_t\nabla\log\pi(y_t|s_t)$,
# so the gradient of $J$ is $\mathbb E\big[\sum_t G\,\nabla\log\pi(y_t|s_t)\big]$ with the
# return $G = \sum_{t'} r_{t'}$. Two refinements keep it unbiased and lower its variance: a
# token cannot change the rewards before it, so $G$ can be replaced by the *return-to-go*
# $G_t = \sum_{t'\ge t} r_{t'}$; and any baseline $V(s_t)$ that depends only on the state can be
# subtracted, leaving the **advantage** $G_t - V(s_t)$. A learned value function $V$ (the
# *critic*) provides it.
#
# One subtle point: the per-token KL reward depends on $\theta$ itself. Its gradient has an
# extra term $-\beta\,\mathbb E[\nabla\log\pi(y_t|s_t)]$, which is the baseline term above and
# vanishes. So treating $-\beta\log(\pi/\pi_{\text{ref}})$ as an ordinary reward, as PPO for
# RLHF does, follows the exact gradient of $J$.
#
# ## 18.3 Estimating the KL
#
# The KL of whole responses cannot be summed over all $V^R$ responses; it is estimated at the
# sampled ones. J. Schulman ("Approximating KL Divergence", 2020) compares three
# single-sample estimators of $\mathrm{KL}(p\|q)$ for $x\sim p$, with $\rho = q(x)/p(x)$
# (here $p = \pi$ the policy, $q = \pi_{\text{ref}}$):
#
# $$ k_1 = -\log\rho, \qquad k_2 = \tfrac12(\log\rho)^2, \qquad k_3 = (\rho - 1) - \log\rho. $$
#
# $k_1$ is unbiased by definition. $k_3$ adds $\rho - 1$, whose mean is
# $\sum_x p(x)\big(q(x)/p(x) - 1\big) = 0$, so it is unbiased too. SymPy checks both for a
# general pair of two-outcome distributions $p = (a, 1-a)$, $q = (b, 1-b)$, and finds $k_2$
# biased:

# %%
a, b = sp.symbols("a b", positive=True)
moments = kl_estimator_moments([a, 1 - a], [b, 1 - b])
kl_ab = moments["kl"][0]
assert sp.simplify(moments["k1"][0] - kl_ab) == 0 and sp.simplify(moments["k3"][0] - kl_ab) == 0
bias_k2 = moments["k2"][0] - kl_ab
assert sp.simplify(bias_k2) != 0
print("E[k1] = E[k3] = KL exactly; bias of k2 at a = 1/2, b = 1/10:",
      sp.N(bias_k2.subs({a: sp.Rational(1, 2), b: sp.Rational(1, 10)}), 4))

# %% [markdown]
# $k_3$ is also never negative, unlike $k_1$: $g(\rho) = \rho - 1 - \log\rho$ has $g(1) = 0$,
# $g'(1) = 0$ and $g'' = 1/\rho^2 > 0$, so it is convex with its minimum $0$ at $\rho = 1$
# (the inequality $\log\rho \le \rho - 1$).

# %%
x = sp.Symbol("x", positive=True)
g3 = x - 1 - sp.log(x)
assert sp.solve(sp.diff(g3, x), x) == [1] and g3.subs(x, 1) == 0 and sp.diff(g3, x, 2) == 1 / x**2
display(sp.Eq(sp.Function("g")(x), g3), sp.Eq(sp.Derivative(sp.Function("g")(x), (x, 2)), sp.diff(g3, x, 2)))

# %% [markdown]
# Exactly, on a three-outcome pair (the policy $p$ has moved away from the reference $q$),
# and then by sampling $10^5$ draws from $p$ through `losses.kl_estimators`:

# %%
p_sym = [sp.Rational(1, 2), sp.Rational(1, 3), sp.Rational(1, 6)]
q_sym = [sp.Rational(1, 5), sp.Rational(2, 5), sp.Rational(2, 5)]
exact_m = kl_estimator_moments(p_sym, q_sym)
kl_exact = exact_m["kl"][0]
print(f"KL(p || q) = {sp.N(kl_exact, 4)}")
print(f"{'':4s} {'mean':>8s} {'bias':>8s} {'variance':>9s}")
for name in ("k1", "k2", "k3"):
    mean, var = exact_m[name]
    print(f"{name:4s} {float(sp.N(mean, 15)):8.4f} {float(sp.N(mean - kl_exact, 15)):8.4f} {float(sp.N(var, 15)):9.4f}")

# %%
N = 100_000
p_t = torch.tensor([float(v) for v in p_sym], dtype=f64)
q_t = torch.tensor([float(v) for v in q_sym], dtype=f64)
est = sample_kl_estimators(p_t, q_t, N, g)
checks = Checks(f"KL estimators, {N} samples from p")
for name in ("k1", "k2", "k3"):
    xs, (mean, var) = getattr(est, name), exact_m[name]
    checks.true(f"{name}: sample mean within 4 standard errors of the exact mean",
                abs(float(xs.mean()) - float(mean)) < 4 * float(xs.std()) / N**0.5)
    checks.close(f"{name}: sample variance / exact variance", 1.0, float(xs.var()) / float(var), tol=0.03)
checks.true("k3 >= 0 on every sample; k1 < 0 on some", bool((est.k3 >= 0).all() and (est.k1 < 0).any()))
checks

# %% [markdown]
# Here $k_3$ has a fifteenth of $k_1$'s variance at no bias, and $k_2$, biased upwards by 11 %,
# does not even spread less. Exercise 2 shows why: for $q$ close to $p$, $k_1$'s spread is of the order of
# $\sqrt{\mathrm{KL}}$, far larger than the KL itself, while $k_2$ and $k_3$ spread on the
# order of the KL.
#
# **But $k_3$ does not always spread less.** Since $k_3 = k_1 + (\rho - 1)$,
#
# $$ \mathrm{Var}[k_3] - \mathrm{Var}[k_1] = \mathrm{Var}[\rho] - 2\,\mathrm{Cov}(\rho, \log\rho),
#    \qquad \mathrm{Var}[\rho] = \sum_x \frac{q(x)^2}{p(x)} - 1 = \chi^2(q\,\|\,p). $$
#
# Near $\rho = 1$, $\log\rho \approx \rho - 1$, the covariance is about $\mathrm{Var}[\rho]$ and
# the difference about $-\mathrm{Var}[\rho] < 0$: $k_3$ wins. But $\rho$ is unbounded above and
# $\log\rho$ grows slowly, so where $q$ puts far more mass than $p$ on an outcome that $p$
# still draws now and then, $\mathrm{Var}[\rho]$ outgrows the covariance and $k_3$ loses. With
# two outcomes the whole story is one number: each estimator takes two values, its variance
# is $p_1p_2$ times the squared gap between them, and
#
# $$ \frac{\mathrm{Var}[k_3]}{\mathrm{Var}[k_1]} = \big(L(\rho_1, \rho_2) - 1\big)^2, \qquad
#    L(\rho_1, \rho_2) = \frac{\rho_2 - \rho_1}{\log\rho_2 - \log\rho_1}, $$
#
# the squared distance from 1 of the *logarithmic mean* of the two ratios: $k_3$ is the worse
# estimator exactly when $L > 2$. SymPy confirms it on the general two-outcome pair above:

# %%
var_k1, var_k3 = moments["k1"][1], moments["k3"][1]
rho1, rho2 = b / a, (1 - b) / (1 - a)
log_mean = (rho2 - rho1) / (sp.log(rho2) - sp.log(rho1))
assert sp.simplify(sp.expand_log(var_k3 - var_k1 * (log_mean - 1) ** 2, force=True)) == 0
print("Var[k3] = Var[k1] (L - 1)^2 for every two-outcome pair: True")

# %% [markdown]
# A policy that has pushed a token the reference gives even odds down to 2 %, $p = (0.98, 0.02)$
# against $q = (\tfrac12, \tfrac12)$, is only 0.6 nats away, yet on the rare draw of
# that token $\rho = 25$. `losses.kl_estimator_variances` sums the exact variances over the
# outcomes; the table also has the symmetric pair $p = (0.9, 0.1)$, $q = (0.1, 0.9)$ (where
# $k_2$ does not vary at all, since $(\log\rho)^2$ is the same at both outcomes) and the
# three-outcome pair from before:

# %%
show_source(kl_estimator_variances)

# %%
pairs = {"p = (0.98, 0.02), q = (1/2, 1/2)": ([sp.Rational(49, 50), sp.Rational(1, 50)], [sp.Rational(1, 2)] * 2),
         "p = (0.9, 0.1), q = (0.1, 0.9)": ([sp.Rational(9, 10), sp.Rational(1, 10)], [sp.Rational(1, 10), sp.Rational(9, 10)]),
         "3-outcome pair above": (p_sym, q_sym)}
checks = Checks("exact variances: kl_estimator_variances against SymPy")
print(f"{'':34s} {'KL':>6s} {'Var k1':>8s} {'Var k2':>8s} {'Var k3':>8s} {'Var k3 / Var k1':>16s}")
for name, (pp, qq) in pairs.items():
    var = kl_estimator_variances(torch.tensor([float(v) for v in pp], dtype=f64).log(),
                                 torch.tensor([float(v) for v in qq], dtype=f64).log())
    exact_pair = kl_estimator_moments(pp, qq)
    checks.close(f"{name}: the three variances", [float(sp.N(exact_pair[k][1], 20)) for k in ("k1", "k2", "k3")],
                 torch.stack(list(var)), tol=1e-12)
    print(f"{name:34s} {float(sp.N(exact_pair['kl'][0])):6.3f} {float(var.k1):8.4f} {float(var.k2):8.4f}"
          f" {float(var.k3):8.4f} {float(var.k3 / var.k1):16.2f}")
checks

# %% [markdown]
# The first pair is not a corner case: it is what RL does to a token it learns to avoid.
# Sampling agrees: $10^5$ draws from $p = (0.98, 0.02)$.

# %%
p_far = torch.tensor([0.98, 0.02], dtype=f64)
q_far = torch.tensor([0.5, 0.5], dtype=f64)
var_far = kl_estimator_variances(p_far.log(), q_far.log())
draws = sample_kl_estimators(p_far, q_far, N, g)
print(f"ρ = q/p at the suppressed token: {float(q_far[1] / p_far[1]):.0f}; KL(p || q) = {float(draws.k1.mean()):.1f} nats (k1's sample mean)")
checks = Checks(f"k3 against k1 far from the reference, {N} samples")
for name in ("k1", "k3"):
    checks.close(f"{name}: sample variance / exact variance", 1.0,
                 float(getattr(draws, name).var()) / float(getattr(var_far, name)), tol=0.1)
print(f"sample variances: k1 {float(draws.k1.var()):.2f}, k3 {float(draws.k3.var()):.1f}")
checks

# %% [markdown]
# Over all two-outcome pairs: the policy's probability $p_1$ of the first outcome across,
# the reference's $q_1$ up.

# %%
p1 = torch.linspace(0.005, 0.995, 199, dtype=f64)
q1 = torch.linspace(0.005, 0.995, 199, dtype=f64) + 1e-3  # never exactly p1: 0/0 on the diagonal
P1, Q1 = torch.meshgrid(p1, q1, indexing="xy")  # (199, 199): columns p1, rows q1
grid = kl_estimator_variances(torch.stack([P1, 1 - P1], -1).log(), torch.stack([Q1, 1 - Q1], -1).log())
fig, ax = plt.subplots(figsize=(5.6, 4.6))
log_ratio_grid = torch.log10(grid.k3 / grid.k1).numpy()
mesh = ax.pcolormesh(p1.numpy(), q1.numpy(), log_ratio_grid, cmap="RdBu_r", vmin=-3, vmax=3, shading="auto")
ax.contour(p1.numpy(), q1.numpy(), log_ratio_grid, levels=[0.0], colors="k")
ax.plot([0.98, 0.9], [0.5, 0.1], "k*", ms=10)
fig.colorbar(mesh, label="log10 Var[k3] / Var[k1]")
ax.set(xlabel="policy p(x = 1)", ylabel="reference q(x = 1)",
       title="Where k3 spreads more than k1 (red; black line: equal)")
fig.tight_layout()
save_figure(fig, "18_rlhf_ppo_kl_variance")
plt.show()

# %% [markdown]
# Blue, around the diagonal, is where the policy is close to the reference and $k_3$ is far
# better. Red, in the bands along the left and right edges, where the policy all but rules out
# an outcome to which the reference gives a fair share, is where $k_1$ is. The stars are the
# two-outcome pairs of the table, one deep in the red band and one on its edge. So: to
# *monitor* a KL-regularised policy, which stays near its reference, $k_3$ is the better
# unbiased estimator; once the policy has moved far, and above all once it has nearly ruled out
# tokens the reference favours, $k_1$ is, with variance growing only like $(\log\rho)^2$ rather
# than like $\rho^2$ (and where the logits are at hand, the per-token KL can be summed over the
# whole vocabulary, with no single-sample estimator at all). $k_2$ is biased either way.
#
# **Used as a loss, each estimator estimates a different gradient.** GRPO (chapter 20) does not
# only *report* $k_3$: it adds $\beta k_3$ to its loss and differentiates it at the sampled
# tokens, through $\log p(x)$, with the samples held fixed. The expected gradient is
# $\mathbb E_{x\sim p}[\nabla k(x)] = \sum_x p(x)\,\nabla k(x)$, with $\nabla\log\rho = -\nabla\log p$:
#
# * $\nabla k_1 = \nabla\log p$, whose mean is $0$ (the baseline term of 18.2): $k_1$ as a loss
#   does nothing in expectation;
# * $\nabla k_2 = -\log\rho\,\nabla\log p$, whose mean is $\sum_x \nabla p(x)\,\log\frac{p(x)}{q(x)}
#   = \nabla\,\mathrm{KL}(p\|q)$, the gradient of the KL in the objective, although $k_2$'s
#   *value* is biased;
# * $\nabla k_3 = (1 - \rho)\,\nabla\log p$, whose mean is $-\sum_x q(x)\,\nabla\log p(x) =
#   \nabla\,\mathrm{KL}(q\|p)$: the gradient of the **reverse** KL, $\mathrm{KL}(\pi_{\text{ref}}\|\pi)$.
#
# SymPy derives all three for a softmax policy over three outcomes with symbolic logits
# $\theta$ and a general reference $q$:

# %%
th = sp.symbols("theta0:3", real=True)
qs = sp.symbols("q0:3", positive=True)
logp_th = [t - sp.log(sum(sp.exp(u) for u in th)) for t in th]
p_th = [sp.exp(lp) for lp in logp_th]
log_rho = [sp.log(qk) - lp for qk, lp in zip(qs, logp_th, strict=True)]
k_exprs = {"k1": [-lr for lr in log_rho], "k2": [lr**2 / 2 for lr in log_rho],
           "k3": [sp.exp(lr) - 1 - lr for lr in log_rho]}
kl_forward = sum(pk * (lp - sp.log(qk)) for pk, lp, qk in zip(p_th, logp_th, qs, strict=True))
kl_reverse = sum(qk * (sp.log(qk) - lp) for lp, qk in zip(logp_th, qs, strict=True))
targets = {"k1": sp.Integer(0), "k2": kl_forward, "k3": kl_reverse}
for name, ks in k_exprs.items():
    for j in range(3):
        expected_grad = sum(pk * sp.diff(kv, th[j]) for pk, kv in zip(p_th, ks, strict=True))
        diff = (expected_grad - sp.diff(targets[name], th[j])).subs(qs[2], 1 - qs[0] - qs[1])
        assert sp.simplify(diff) == 0
print("E[grad k1] = 0, E[grad k2] = grad KL(p||q), E[grad k3] = grad KL(q||p): True")
for j in range(3):  # in logit space the reverse KL's gradient is p - q
    assert sp.simplify((sp.diff(kl_reverse, th[j]) - (p_th[j] - qs[j])).subs(qs[2], 1 - qs[0] - qs[1])) == 0
display(sp.Eq(sp.Symbol(r"\partial\,\mathrm{KL}(q\|p)/\partial\theta_j"), sp.Symbol("p_j") - sp.Symbol("q_j")))

# %% [markdown]
# So in logit space $\nabla_\theta\mathrm{KL}(q\|p) = p - q$. The package's
# `kl_estimator_loss_gradients` computes the three expected gradients by autograd, with the
# sampling weights $p(x)$ held constant; they must equal autograd through PyTorch's own
# `kl_divergence` in each direction, on the three-outcome pair and on the far pair:

# %%
show_source(kl_estimator_loss_gradients)

# %%
Cat = torch.distributions.Categorical
checks = Checks("expected gradients of the estimators used as losses (d/d logits of p)")
for name, (pp, qq) in (("3-outcome pair", (p_t, q_t)), ("far pair", (p_far, q_far))):
    logits = pp.log().requires_grad_(True)
    grads = kl_estimator_loss_gradients(logits.detach(), qq.log())
    (forward_grad,) = torch.autograd.grad(torch.distributions.kl_divergence(Cat(logits=logits), Cat(probs=qq)), logits)
    (reverse_grad,) = torch.autograd.grad(torch.distributions.kl_divergence(Cat(probs=qq), Cat(logits=logits)), logits)
    checks.close(f"{name}: k1 -> 0", torch.zeros_like(pp), grads.k1, tol=1e-15)
    checks.close(f"{name}: k2 -> grad KL(p || q)", forward_grad, grads.k2, tol=1e-14)
    checks.close(f"{name}: k3 -> grad KL(q || p) = p - q", reverse_grad, grads.k3, tol=1e-14)
    checks.true(f"{name}: the two KLs' gradients differ", (forward_grad - reverse_grad).abs().max() > 0.01)
checks

# %% [markdown]
# So "GRPO puts $k_3$ in its loss" hides a switch of direction: as a *value* $k_3$ estimates
# $\mathrm{KL}(\pi\|\pi_{\text{ref}})$, but as a *loss* (on samples from the current policy)
# its gradient is that of $\mathrm{KL}(\pi_{\text{ref}}\|\pi)$. Both KLs equal
# $\tfrac12\sum_x (p - q)^2/p$ to second order, so their gradients agree to first order near the
# reference and part only once the policy has moved (compare the expected values of the far
# pair's k2 and k3 rows). The estimator whose gradient is that of the objective's KL is $k_2$;
# $k_1$ as a loss gives nothing, which is why this chapter's PPO puts $k_1$ in the per-token
# *reward* (its sum over a response is the sequence log-ratio, which the derivation of 18.1
# needs): there the score function of 18.2 turns it into the gradient of
# $\mathrm{KL}(\pi\|\pi_{\text{ref}})$. It reports the KL of whole responses as the mean of
# those sums, as `evaluate_policy` does.
#
# ## 18.4 Generalised advantage estimation
#
# The critic $V$ gives two extreme advantage estimates. The one-step *TD error*
# $\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)$ has little variance (one reward) but all of
# $V$'s bias; the Monte Carlo advantage $\sum_{l}\gamma^l r_{t+l} - V(s_t)$ is unbiased but
# carries the noise of every later reward. Schulman et al. (2016, "High-Dimensional Continuous
# Control Using Generalized Advantage Estimation") interpolate with $\lambda\in[0, 1]$:
#
# $$ \hat A_t = \sum_{l=0}^{T-1-t} (\gamma\lambda)^l\, \delta_{t+l}
#    \quad\Longleftrightarrow\quad \hat A_t = \delta_t + \gamma\lambda\, \hat A_{t+1},\ \ \hat A_T = 0 , $$
#
# with $V(s_T) = 0$ after the last token. At $\lambda = 0$ it is $\delta_t$. At $\lambda = 1$ the
# sum **telescopes**: in $\sum_l \gamma^l\big(r_{t+l} + \gamma V_{t+l+1} - V_{t+l}\big)$ every
# $V_{t+k}$ with $k \ge 1$ appears once with $+\gamma^{k}$ (from $\delta_{t+k-1}$) and once with
# $-\gamma^{k}$ (from $\delta_{t+k}$), leaving $\sum_l\gamma^l r_{t+l} - V_t + \gamma^{T-t}V_T$,
# the Monte Carlo advantage. The argument holds for every $T$; SymPy checks it, the recursion
# and the $\lambda = 0$ limit term by term for an episode of $T = 6$ steps:

# %%
G = gae_symbolic(6)
for t in range(6):
    assert sp.expand(G["recursive"][t] - G["closed"][t]) == 0
    assert sp.expand(G["closed"][t].subs(G["lam"], 0) - G["td"][t]) == 0
    assert sp.expand(G["closed"][t].subs(G["lam"], 1) - G["mc"][t]) == 0
display(sp.Eq(sp.Symbol(r"\hat A_4"), sp.collect(sp.expand(G["closed"][4]), G["gamma"] * G["lam"])),
        sp.Eq(sp.Symbol(r"\hat A_4|_{\lambda=1}"), G["mc"][4]))

# %% [markdown]
# The package's `gae` runs the backward recursion on a batch (with a mask for padding). It
# agrees with the SymPy closed form, evaluated at random rewards and values:

# %%
show_source(gae)

# %%
fn = sp.lambdify([*G["r"], *G["V"], G["gamma"], G["lam"]], G["closed"])
r6, v6 = torch.randn(6, generator=g, dtype=f64), torch.randn(6, generator=g, dtype=f64)
checks = Checks("losses.gae against the SymPy closed form (T = 6)")
for gamma_, lam_ in ((1.0, 0.95), (0.9, 0.0), (0.99, 1.0)):
    want = torch.tensor(fn(*r6.tolist(), *v6.tolist(), gamma_, lam_), dtype=f64)
    checks.close(f"γ = {gamma_}, λ = {lam_}", want, gae(r6, v6, gamma_, lam_)[0], tol=1e-13)
checks

# %% [markdown]
# ## 18.5 The clipped surrogate and the value loss
#
# One rollout costs a generation pass; PPO reuses it for several gradient steps. After the
# first step the samples come from the *old* policy $\pi_{\text{old}}$, so the objective is
# importance-weighted by the ratio $\rho_t = \pi_\theta(y_t|s_t)/\pi_{\text{old}}(y_t|s_t)$, and
# to stop the policy from moving far on stale samples Schulman et al. (2017) clip it:
#
# $$ L^{\text{CLIP}} = \mathbb E_t\Big[\min\big(\rho_t \hat A_t,\ \mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,\hat A_t\big)\Big]. $$
#
# Where is its gradient zero? For $A > 0$ the minimum picks the clipped term once
# $\rho > 1 + \epsilon$; for $A < 0$ once $\rho < 1 - \epsilon$. SymPy, with positive symbols
# $\epsilon, s, a$ placing $\rho$ beyond each edge ($\rho = 1 + \epsilon + s$ or
# $1 - \epsilon - s$) and $A = a$ or $A = -a$:

# %%
rho, A, eps, s, a_ = sp.symbols("rho A epsilon s a", positive=True)
surrogate = sp.Min(rho * A, sp.Max(1 - eps, sp.Min(rho, 1 + eps)) * A)
cases = {"A > 0, ρ > 1+ε": (a_, 1 + eps + s), "A > 0, ρ < 1-ε": (a_, 1 - eps - s),
         "A < 0, ρ > 1+ε": (-a_, 1 + eps + s), "A < 0, ρ < 1-ε": (-a_, 1 - eps - s)}
for name, (adv, ratio_at) in cases.items():
    value = sp.simplify(surrogate.subs(A, adv).subs(rho, ratio_at))
    slope = sp.diff(value, s) * sp.diff(ratio_at, s)  # d/dρ = (d/ds) / (dρ/ds), dρ/ds = ±1
    print(f"{name}:  L = {sp.sstr(value):24s} dL/dρ = {slope}")

# %% [markdown]
# Inside $[1-\epsilon, 1+\epsilon]$ the clip does nothing and $dL/d\rho = A$. So the gradient is
# zero in exactly two of the four outer cases: when the ratio has already moved *in the
# direction the advantage favours* by more than $\epsilon$ (more probable for a good token,
# less probable for a bad one). A ratio that moved the wrong way keeps its full gradient and
# is pulled back. `clipped_surrogate_grad` encodes the cases; autograd through the package's
# `ppo_policy_loss` (the negated mean of $L^{\text{CLIP}}$ over tokens) must agree, with
# $\partial\rho/\partial\log\pi = \rho$:

# %%
ratios = torch.linspace(0.5, 1.5, 41, dtype=f64).repeat(2)
adv = torch.cat([torch.ones(41, dtype=f64), -torch.ones(41, dtype=f64)])
logp = torch.log(ratios).requires_grad_(True)  # old log-probabilities 0, so ρ = exp(logp)
old, mask = torch.zeros_like(ratios), torch.ones_like(ratios)
loss, clip_fraction = ppo_policy_loss(logp[None], old[None], adv[None], mask[None], 0.2)
(grad,) = torch.autograd.grad(loss, logp)
hand = -clipped_surrogate_grad(ratios, adv, 0.2) * ratios / len(ratios)
checks = Checks("clipped surrogate: hand-derived gradient against autograd")
checks.close("d loss / d log π at 82 tokens (A = ±1, ρ in [0.5, 1.5])", hand, grad, tol=1e-15)
checks.equal("zero-gradient tokens = clip_fraction × tokens", int(round(float(clip_fraction) * 82)),
             int((grad == 0).sum()))
checks

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
grid = torch.linspace(0.4, 1.6, 241, dtype=f64)
for ax, sign in zip(axes, (1.0, -1.0), strict=True):
    clipped = torch.minimum(grid * sign, torch.clamp(grid, 0.8, 1.2) * sign)
    ax.plot(grid, grid * sign, "--", color="grey", label="unclipped ρA")
    ax.plot(grid, clipped, lw=2, label="min(ρA, clip(ρ, 1-ε, 1+ε)A)")
    flat = grid > 1.2 if sign > 0 else grid < 0.8
    ax.fill_between(grid, -1.7, 1.7, where=flat.numpy(), color="C1", alpha=0.15, label="zero gradient")
    ax.set(xlabel="ratio ρ = π/π_old", title=f"A = {sign:+.0f}, ε = 0.2", ylim=(-1.7, 1.7))
axes[0].set_ylabel("per-token objective")
axes[0].legend(loc="upper left")
fig.tight_layout()
save_figure(fig, "18_rlhf_ppo_clipped_objective")
plt.show()

# %% [markdown]
# The clip removes the *incentive* to move further, not the possibility: other tokens'
# gradients share the same weights and can still push a clipped ratio along. The tests
# (`tests/test_alignment_ppo.py`) measure it on a tiny model: after thirty epochs on one
# rollout the clipped ratios stay within a small factor of 1, while those of the unclipped
# surrogate run off by orders of magnitude.
#
# **The value loss.** The critic regresses on the returns $R_t = \hat A_t + V_{\text{old}}(s_t)$.
# The PPO implementations for RLHF clip it the same way, around the values recorded at rollout
# time: $\tfrac12\max\big((V - R)^2, (V_{\text{clip}} - R)^2\big)$ with
# $V_{\text{clip}} = V_{\text{old}} + \mathrm{clip}(V - V_{\text{old}}, -\epsilon_V, \epsilon_V)$.
# Once $V$ has moved more than $\epsilon_V$ from $V_{\text{old}}$ *towards* the return, the
# clipped term is the larger one and constant in $V$, and the gradient stops; a value that moved
# away keeps its full gradient. It is the same pessimism as the policy's clip:

# %%
values = torch.tensor([[1.4, 1.1, 0.5]], dtype=f64, requires_grad=True)  # V_old = 1, return R = 2
old_v, ret = torch.ones(1, 3, dtype=f64), torch.full((1, 3), 2.0, dtype=f64)
loss, _ = ppo_value_loss(values, old_v, ret, torch.ones(1, 3), clip_eps=0.2)
(grad,) = torch.autograd.grad(loss, values)
checks = Checks("clipped value loss (V_old = 1, R = 2, ε_V = 0.2, 3 tokens)")
checks.close("V = 1.4, moved towards R beyond ε_V: gradient 0", 0.0, grad[0, 0], tol=0)
checks.close("V = 1.1, within ε_V: gradient (V - R)/3", (1.1 - 2) / 3, grad[0, 1], tol=1e-15)
checks.close("V = 0.5, moved away from R: gradient (V - R)/3", (0.5 - 2) / 3, grad[0, 2], tol=1e-15)
checks

# %% [markdown]
# ## 18.6 PPO on the book's text model
#
# Now the whole loop, on the task of chapter 17: the book's text model continues an 8-token
# docstring prompt with 24 tokens, and the reward is the number of keyword tokens. The base
# model scores 0.33 on the 512 test prompts. The pieces, in `llmbook.alignment.ppo`:
#
# * **policy**: the text model with LoRA adapters (chapter 16; $r = 8$, $\alpha = 16$) on all
#   six linear layers of each block, 110 592 trainable parameters. Three reasons: the shipped
#   policy is a 0.4 MB adapter file instead of an 8 MB model; the reference is simply the base
#   model; and with $B = 0$ at the start the policy *is* the reference, so the first rollout has
#   a KL of exactly 0.
# * **critic** (`ValueModel`): a separate copy of the base model, all of it trained, with a
#   linear value head on its final hidden states, so that the value loss never pulls on the
#   policy's weights (InstructGPT also keeps the value model separate).
# * **rollout**: sample a response to each of 32 training prompts at temperature 1, then one
#   forward pass each of the policy, the reference and the critic to record
#   $\log\pi_{\text{old}}$, $\log\pi_{\text{ref}}$, $V_{\text{old}}$ and the entropy.
# * **update** (`ppo_update`): per-token rewards, GAE with $\gamma = 1$, $\lambda = 0.95$,
#   advantages whitened over the batch, then 2 epochs of minibatches of 16 responses, each a
#   step on the clipped surrogate ($\epsilon = 0.2$) and one on the clipped value loss
#   ($\epsilon_V = 0.2$), gradient norms clipped to 1.

# %%
show_source(ppo_update)

# %% [markdown]
# Two iterations live, on 16 prompts each, to see the moving parts (the full runs are shipped):

# %%
reference, info = book_model("text")
tok = info["tokenizer"]
kw = keyword_ids(tok)
train_prompts, test_prompts = preference_data("train").prompts, preference_data("test").prompts
policy = make_policy(reference, PPO_RECIPE["lora_targets"], PPO_RECIPE["lora_r"], PPO_RECIPE["lora_alpha"], g)
critic = ValueModel(copy.deepcopy(reference).requires_grad_(True))
policy_opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=PPO_RECIPE["lr"])
critic_opt = torch.optim.Adam(critic.parameters(), lr=PPO_RECIPE["critic_lr"])


def reward_fn(prompts, responses):
    return keyword_reward(responses, kw)


first = rollout(policy, reference, critic, train_prompts[:16], 24, reward_fn, g)
at_sampling = sampler_logprobs(policy, first.prompts, first.responses)  # the sampler's own view, KV cache
stats = ppo_update(policy, critic, first, policy_opt, critic_opt, beta=0.3, minibatch_size=8, generator=g)
after_update = sampler_logprobs(policy, first.prompts, first.responses)
second = rollout(policy, reference, critic, train_prompts[16:32], 24, reward_fn, g)

# %% [markdown]
# The first minibatch of an update must see $\rho = 1$: the policy has not moved yet, so
# $\pi_\theta = \pi_{\text{old}}$, *provided* the $\log\pi_{\text{old}}$ recorded by the
# rollout is the log-probability of the distribution the tokens were drawn from. The rollout
# records it by one teacher-forced pass over prompt and response; the sampler drew the tokens
# from a prefill and then one token at a time against a KV cache (chapter 12). A shift by one
# position, a temperature applied in one place and not the other, or a cache bug would make
# them differ. `sampler_logprobs` recomputes $\log\pi$ the sampler's way, before the update and
# after it:

# %%
show_source(sampler_logprobs)

# %%
checks = Checks("two PPO iterations on the text model")
checks.equal("trainable policy parameters (LoRA r = 8 on 6 layers × 4 blocks)", 110_592,
             sum(p.numel() for p in policy.parameters() if p.requires_grad))
checks.true("first rollout: log π = log π_ref exactly (KL 0)", torch.equal(first.logprobs, first.ref_logprobs))
checks.true("first rollout: the value head starts at 0", bool((first.values == 0).all()))
checks.close("ρ = π/π_old before the update: the sampler's log π (KV cache) against the recorded one",
             torch.ones_like(first.logprobs), torch.exp(at_sampling - first.logprobs), tol=1e-4)
checks.true("after the update, the same tokens' ρ (sampler's log π) has moved by more than 1 %",
            bool((torch.exp(after_update - first.logprobs) - 1).abs().max() > 0.01))
checks.true("after one update the policy differs from the reference",
            not torch.equal(second.logprobs, second.ref_logprobs))
checks

# %% [markdown]
# **A peer for GAE and the value targets.** torchrl's `generalized_advantage_estimate` is an
# independent implementation of the same recursion, written for a different layout: one stream
# of time steps in which `done` flags mark where an episode ends and the recursion must not
# cross. Here the second rollout's responses are cut short at different lengths, as a stop
# token would end them, so that episodes end inside the batch. The book's `gae` sees them as
# right-padded rows with a mask; torchrl sees the same episodes laid end to end,
# with a `done` flag at the end of each. (The value loss is compared with torchrl's
# `ClipPPOLoss` in `tests/test_alignment_losses.py`.)

# %%
lengths = torch.randint(1, 25, (16,), generator=g)  # each response ends after 1..24 tokens
mask = (torch.arange(24)[None, :] < lengths[:, None]).long()
cut_scores = (torch.isin(second.responses, kw) & mask.bool()).sum(1).double()  # keywords kept
rewards = kl_shaped_rewards(cut_scores, second.logprobs.double(), second.ref_logprobs.double(), beta=0.3, mask=mask)
values = second.values.double() * mask
adv, ret = gae(rewards, values, gamma=1.0, lam=0.95, mask=mask)
on = mask.bool()  # row by row: the episodes end to end, 16 of them in one stream
stream = [x[on][None, :, None] for x in (rewards, values)]  # (1, total tokens, 1)
done = (on & ~torch.cat([on[:, 1:], torch.zeros_like(on[:, :1])], 1))[on][None, :, None]
next_v = torch.cat([stream[1][:, 1:], torch.zeros_like(stream[1][:, :1])], 1)
one, lam64 = torch.tensor(1.0, dtype=f64), torch.tensor(0.95, dtype=f64)  # float64: torchrl keeps its dtype
peer_adv, peer_ret = generalized_advantage_estimate(one, lam64, stream[1], next_v, stream[0], done, done)
checks = Checks(f"losses.gae against torchrl: {int(on.sum())} tokens, 16 episodes ending inside the batch")
checks.close("advantages", peer_adv[0, :, 0], adv[on], tol=1e-12)
checks.close("value targets (returns)", peer_ret[0, :, 0], ret[on], tol=1e-12)
checks

# %% [markdown]
# **The shipped runs.** `train_ppo` runs 60 such iterations of 32 prompts (1 920 prompts from
# the training split, 46 080 generated tokens) with $\beta = 0.3$ (artifact `"ppo"`), and the
# same with $\beta = 0.003$, a hundred times smaller (`"ppo_small_kl"`). Each took a few minutes
# on one CPU core. At the end each policy is scored by chapter 17's `evaluate_policy` on the
# 512 test prompts: mean true reward, and KL to the reference of whole responses (the mean of
# $\sum_t \log\pi/\pi_{\text{ref}}$ over one sampled response per prompt, in nats).

# %%
runs = {name: load_ppo_policy(name) for name in ("ppo", "ppo_small_kl")}
print(f"{'run':13s} {'β':>6s} {'reward: first→last 5 its':>25s} {'KL (nats): first→last':>22s}"
      f" {'test reward':>11s} {'test KL':>14s} {'train s':>8s}")
for name, (_, run) in runs.items():
    h, fin = run["history"], run["final"]
    r0, r1 = np.mean(h["reward_mean"][:5]), np.mean(h["reward_mean"][-5:])
    k0, k1 = np.mean(h["kl_mean"][:5]), np.mean(h["kl_mean"][-5:])
    print(f"{name:13s} {run['recipe']['beta']:6g} {r0:13.2f} → {r1:6.2f} {k0:11.2f} → {k1:7.2f}"
          f" {fin['reward']:11.2f} {fin['kl']:7.2f} ± {fin['kl_stderr']:4.2f} {run['compute']['wall_seconds']:8.0f}")
print(f"{'base model':13s} {'':6s} {'':25s} {'':22s} {runs['ppo'][1]['final']['base']['reward']:11.2f}")

# %% [markdown]
# The shipped adapters reproduce the shipped scores: `evaluate_policy`, run again here on the
# main policy, samples the same responses.

# %%
ppo_policy, ppo_info = runs["ppo"]
score = evaluate_policy(ppo_policy, reference, test_prompts, kw)
checks = Checks("the shipped PPO policy")
checks.true("test reward, re-evaluated: within 0.05 of the shipped score",
            abs(score.reward - ppo_info["final"]["reward"]) < 0.05, got=round(score.reward, 2))
checks.true("test KL (nats per response), re-evaluated: within 0.1",
            abs(score.kl - ppo_info["final"]["kl"]) < 0.1, got=round(score.kl, 1))
checks.true("reward rose from 0.33 by more than 3", score.reward > ppo_info["final"]["base"]["reward"] + 3)
checks.true("at a KL below 15 nats per response", score.kl < 15)
checks

# %%
fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)  # stacked: readable in a narrow column
for name, (_, run) in runs.items():
    h = run["history"]
    label = f"{name} (β = {run['recipe']['beta']:g})"
    axes[0].plot(h["reward_mean"], label=label)
    axes[1].plot(h["kl_mean"], label=label)
    axes[2].plot(h["entropy"], label=label)
axes[0].set(ylabel="keywords per response", title="Reward of the rollouts (keywords in 24 tokens)")
axes[1].set(ylabel="nats per response", title="KL(π ‖ π_ref) to the reference", yscale="symlog")
axes[2].set(xlabel="PPO iteration", ylabel="nats per token", title="Policy entropy")
axes[0].legend(loc="upper left")
fig.tight_layout()
save_figure(fig, "18_rlhf_ppo_training")
plt.show()

# %%
entropy = runs["ppo"][1]["history"]["entropy"]
small_reward = runs["ppo_small_kl"][1]["history"]["reward_mean"]
above = next(i for i in range(len(small_reward)) if min(small_reward[i:]) > 18)  # above 18 from here on
print(f"β = 0.3: entropy {entropy[0]:.1f} → {entropy[-1]:.1f} nats per token (first → last iteration)")
print(f"β = 0.003: reward above 18 at every iteration from {above} on")

# %% [markdown]
# With $\beta = 0.3$ the reward climbs from 0.33 to about 4 keywords per response while the
# KL grows to about 10 nats and the entropy falls only a little, from 2.8 to 2.4 nats per
# token. With $\beta = 0.003$ the reward passes 18 at iteration 25 and stays above it; the KL (note the
# logarithmic axis) passes a hundred nats and the entropy collapses towards 0. Every run also reports its compute, for the
# comparison with DPO in chapter 19 (token passes count the prompt and the response, 32 tokens
# per row; the critic's passes are counted separately):

# %%
for key in ("iterations", "prompts_seen", "generated_tokens", "policy_forward_tokens", "policy_backward_tokens",
            "reference_forward_tokens", "critic_forward_tokens", "critic_backward_tokens"):
    print(f"{key:26s} {ppo_info['compute'][key]:>9,d}")

# %% [markdown]
# ## 18.7 Reward hacking
#
# The keyword reward has a flaw that a person would spot at once: it counts keywords, not
# sense. Nothing in the reward prefers " the value of the key" to " object object object". Only the KL
# term does: a response that the reference model finds unlikely costs
# $\beta\log\pi/\pi_{\text{ref}}$. Chapter 19 derives the policy that maximises $J$ exactly,
# $\pi^*(y|x) \propto \pi_{\text{ref}}(y|x)\,e^{r(x, y)/\beta}$: at $\beta = 0.003$ a single
# extra keyword multiplies a response's probability by $e^{333}$, so the optimum is whatever
# response is all keywords, however absurd. PPO finds it. Responses from the three models to
# three test prompts (sampled at temperature 1; "⏎" marks a line break):

# %%
models = {"reference": reference, "ppo (β = 0.3)": ppo_policy, "ppo_small_kl (β = 0.003)": runs["ppo_small_kl"][0]}
show = test_prompts[[0, 3, 7]]
for i, prompt in enumerate(show):
    print(f"prompt: {tok.decode(prompt.tolist())!r}")
    for name, model in models.items():
        y = sample_responses(model, prompt[None], 24, 1.0, torch.Generator().manual_seed(i))[0]
        print(f"  {name:26s} [{int(torch.isin(y, kw).sum()):2d}] {tok.decode(y.tolist()).replace(chr(10), '⏎')}")

# %% [markdown]
# Two quality signals that do not use the reward, on the 512 test responses of
# `evaluate_policy` (recorded at training time): the fraction of distinct tokens in a response
# (ordinary text repeats few of its 24 tokens), and the mean log-probability per token that
# the *reference* model gives the response (how much it still reads like docstrings).

# %%
finals = {"reference": runs["ppo"][1]["final"]["base"], "ppo": runs["ppo"][1]["final"],
          "ppo_small_kl": runs["ppo_small_kl"][1]["final"]}
print(f"{'':13s} {'reward':>7s} {'KL (nats)':>10s} {'distinct tokens':>16s} {'log π_ref per token':>20s}")
for name, fin in finals.items():
    print(f"{name:13s} {fin['reward']:7.2f} {fin['kl']:10.2f} {fin['distinct_fraction']:16.2f}"
          f" {fin['ref_logprob_per_token']:20.2f}")
ratio = math.exp(finals["reference"]["ref_logprob_per_token"] - finals["ppo_small_kl"]["ref_logprob_per_token"])
print(f"per token, π_ref finds the small-KL policy's text {ratio:.0f} times less likely than its own")

# %%
base_f, main_f, hack_f = finals.values()
checks = Checks("reward hacking at β = 0.003")
checks.true("small-KL reward > 15 of a possible 24", hack_f["reward"] > 15)
checks.true("its KL > 10 × the main run's", hack_f["kl"] > 10 * main_f["kl"])
checks.true("distinct tokens: below 0.3 (main run above 0.7)",
            hack_f["distinct_fraction"] < 0.3 < 0.7 < main_f["distinct_fraction"])
checks.true("log π_ref per token: > 2 nats below the reference's own (main run within 0.5)",
            hack_f["ref_logprob_per_token"] < base_f["ref_logprob_per_token"] - 2
            and abs(main_f["ref_logprob_per_token"] - base_f["ref_logprob_per_token"]) < 0.5)
checks

# %% [markdown]
# The small-KL policy earns five times the main policy's reward by writing " object" over and
# over; the reference model finds its text almost 4 nats per token less likely than its own
# (about 45 times less likely, token by token). The main policy's responses are nearly as
# varied as the reference's (0.78 distinct tokens against 0.88) and almost as likely under it;
# it earns its reward by packing keywords into otherwise docstring-like text. The KL coefficient is the one knob between the two: a larger $\beta$
# trusts the reward less. Here the reward is the true one, so reward hacking costs only
# fluency. With a *learned* reward model as the proxy, pushing further also loses true
# reward: chapter 18b runs best-of-n, PPO and GRPO against chapter 17's reward model and
# finds the true reward of the GRPO run peaking and then falling while the proxy still
# climbs, the over-optimisation that Gao et al. (2023) measure, and why RLHF runs watch the
# KL as closely as the reward.
#
# ## Summary
#
# * RLHF maximises $\mathbb E[r] - \beta\,\mathrm{KL}(\pi\|\pi_{\text{ref}})$; the sequence KL is
#   the expected sum of per-token log-ratios, so the objective is a return with per-token
#   rewards $-\beta\log(\pi/\pi_{\text{ref}})$ and the score at the end.
# * The score-function identity $\nabla\mathbb E_\pi[f] = \mathbb E_\pi[f\nabla\log\pi]$ gives an
#   unbiased gradient from samples; its error falls like $1/\sqrt N$ and a baseline lowers it
#   without bias.
# * $k_1$ and $k_3$ estimate the KL without bias, $k_2$ with bias; $k_3 \ge 0$ and has much less
#   variance than $k_1$ near the reference, but more once $q/p$ is large on outcomes $p$ still
#   draws ($\mathrm{Var}[k_3] > \mathrm{Var}[k_1]$ exactly when $\chi^2(q\|p) > 2\,\mathrm{Cov}(\rho, \log\rho)$).
#   Used as losses, their gradients estimate $0$ ($k_1$), $\nabla\mathrm{KL}(\pi\|\pi_{\text{ref}})$
#   ($k_2$) and $\nabla\mathrm{KL}(\pi_{\text{ref}}\|\pi)$ ($k_3$, GRPO's penalty).
# * GAE's advantage is a $\gamma\lambda$-discounted sum of TD errors; $\lambda = 0$ is the TD error
#   and $\lambda = 1$ telescopes to the Monte Carlo advantage.
# * PPO's clipped surrogate has zero gradient exactly where the ratio has moved beyond
#   $1\pm\epsilon$ in the direction the advantage favours.
# * On the book's model, PPO with LoRA raises the keyword reward from 0.33 to about 4.4 at a KL
#   of about 10 nats; with $\beta$ a hundred times smaller it hacks the reward, writing
#   " object object ..." at a KL over a hundred nats.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/18_rlhf_ppo.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 18` writes a stub
# of every function, `llmbook grade 18` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_18.py` runs
# the same checks on the reference.
#
# 1. (★) **The best constant baseline.** For the 5-action policy of 18.2, write the total
#    variance $\sigma_b^2$ of the single-sample estimator as a function of $b$ and show that it is
#    a quadratic minimised at $b^* = \mathbb E[f\,\|e_a-\pi\|^2]/\mathbb E[\|e_a-\pi\|^2]$, not at
#    $J = \mathbb E[f]$. How much lower is $\sigma_{b^*}^2$ than $\sigma_J^2$ here?
# 2. (★★) **KL estimators near the reference.** Take $p = (\tfrac13, \tfrac23)$ and
#    $q = (\tfrac13 + \delta, \tfrac23 - \delta)$. With SymPy, expand in $\delta$ the KL, the bias
#    of $k_2$ and the variances of $k_1$, $k_2$, $k_3$. Show that
#    $\mathrm{Var}[k_1] \approx 2\,\mathrm{KL}$ while $\mathrm{Var}[k_3] \approx \mathrm{KL}^2/2$,
#    and that $k_2$'s bias is of order $\delta^3$.
# 3. (★★) **GAE as an average of n-step advantages.** The $n$-step advantage is
#    $\hat A^{(n)}_t = \sum_{l<n}\gamma^l r_{t+l} + \gamma^n V_{t+n} - V_t$. Show (SymPy, $T = 5$)
#    that GAE is their exponentially weighted average,
#    $\hat A_t = (1-\lambda)\sum_{n=1}^{T-t-1}\lambda^{n-1}\hat A^{(n)}_t + \lambda^{T-t-1}\hat A^{(T-t)}_t$
#    (the last weight collects the tail, where the episode has ended), and check it against
#    `losses.gae` on random numbers.
# 4. (★★★) **PPO finds the KL-regularised optimum.** On a one-step problem (a "bandit") with
#    $K = 6$ actions, reference logits $\theta_{\text{ref}}$ and rewards $r_k$, run PPO with the
#    reward $r_a - \beta\log(\pi(a)/\pi_{\text{ref}}(a))$ and a mean baseline, using
#    `ppo_policy_loss` on the sampled actions. Show that the policy converges to
#    $\pi^* = \mathrm{softmax}(\theta_{\text{ref}} + r/\beta)$ (chapter 19 derives it) for
#    $\beta = 0.5$ and $\beta = 2$, to within a total-variation distance of $10^{-4}$ with a
#    decaying learning rate. Why does the sampled estimate not keep jittering around $\pi^*$?
#    (Look at the shaped reward of each action at $\pi^*$.)
# 5. (★★) **Where $k_3$ loses.** The policy gives probability $\varepsilon$ to a token that the
#    reference gives $\tfrac12$: $p = (1-\varepsilon, \varepsilon)$, $q = (\tfrac12, \tfrac12)$. Find
#    the $\varepsilon^*$ below which $\mathrm{Var}[k_3] > \mathrm{Var}[k_1]$, by bisection on the
#    exact gap from `kl_estimator_variances`, and check it against SymPy's root of $L = 2$. Does
#    a reference that gives the token more than $\tfrac12$ move $\varepsilon^*$ up or down?

# %%
from llmbook.workbench import grade

grade("18", globals())
