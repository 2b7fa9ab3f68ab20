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
# # 18b Over-optimising a learned reward model
#
# Chapter 18's PPO maximised the *true* keyword reward, which no real RLHF run has: it has a
# reward model fitted to a finite set of noisy preferences (chapter 17), and the optimiser
# sees only that model. The harder the policy is pushed to please the model, the more it
# finds responses on which the model is wrong, and past some point the true quality falls
# while the model's score keeps rising: Goodhart's law, measured for RLHF by Stiennon et al.
# (2020, "Learning to summarize from human feedback") and turned into scaling laws by Gao et
# al. (2023, "Scaling Laws for Reward Model Overoptimization"). Gao et al. call the learned
# model the **proxy** and the reward it stands in for the **gold** reward, and plot the gold
# reward against the distance $d = \sqrt{\mathrm{KL}(\pi\,\|\,\pi_{\text{ref}})}$ that the
# optimiser has moved the policy. They find two functional forms,
#
# $$ R_{\text{bon}}(d) = d\,(\alpha_{\text{bon}} - \beta_{\text{bon}}\, d), \qquad
#    R_{\text{RL}}(d) = d\,(\alpha_{\text{RL}} - \beta_{\text{RL}} \log d), $$
#
# with $R(0) = 0$: the gain over the starting policy, for best-of-$n$ sampling and for RL.
# The book has both halves of their set-up: the keyword count is the gold reward, chapter
# 17's reward model is the proxy. This chapter:
#
# 1. **derives** the best-of-$n$ policy of a continuous reward and its distance from the base
#    policy, $\mathrm{KL} = \log n - \frac{n-1}{n}$, with SymPy;
# 2. **derives** the exact best-of-$n$ distribution for a discrete base policy, proves that its
#    KL never exceeds the formula, and checks both against Monte Carlo draws;
# 3. **implements** the estimator that computes best-of-$n$ for every $n$ from one pool of
#    samples, averaging over all subsets by order statistics, and checks it against
#    enumeration;
# 4. **measures** best-of-$n$, PPO and GRPO against the proxy on the book's task: gold and
#    proxy reward against $d$ (runs shipped in `data/overoptimisation/`);
# 5. **fits** Gao et al.'s forms and reports what the data show.
#
# The code is in `llmbook.alignment.overoptimisation`; the runs are made by
# `data/make_overoptimisation.py`.

# %%
import itertools
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import display
from scipy.integrate import quad
from scipy.optimize import curve_fit

from llmbook.alignment.overoptimisation import (
    best_of_n_distribution,
    best_of_n_estimate,
    best_of_n_kl,
    best_of_n_kl_exact,
    best_of_n_kl_symbolic,
    best_of_n_weights,
    gao_curve,
    gao_fit,
    gao_peak,
    load_overoptimisation,
    plug_in_kl,
    sample_best_of_n,
    train_proxy_grpo,
)
from llmbook.alignment.shipped import load_artifact
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64

# %% [markdown]
# ## 18b.1 Proxy and gold
#
# The proxy is chapter 17's reward model $r_\phi$: the book's text model with a scalar head,
# trained on 4096 Bradley–Terry preference pairs of base-model responses. Its scores are on an
# arbitrary scale (only differences enter the Bradley–Terry likelihood), so only *gains* in
# proxy reward are compared below. On the held-out pairs it orders responses about as well as
# any model can from such noisy labels, yet it correlates only moderately with the gold
# keyword count of a response:

# %%
rm_info = load_artifact("reward_model")[1]["test"]
print(f"test accuracy {rm_info['accuracy']:.3f} (Bayes ceiling {rm_info['bayes_accuracy']:.3f}); "
      f"Pearson correlation with gold {rm_info['pearson']:.2f}, Spearman {rm_info['spearman']:.2f}")
results = load_overoptimisation()
recipe = results["recipe"]

# %% [markdown]
# A correlation well below 1 on the responses the model was trained on says nothing yet about
# the responses an optimiser will find: those are the ones where the proxy is *highest*, and
# the question of this chapter is how the gold reward behaves there.
#
# ## 18b.2 The best-of-$n$ policy and its distance from the base
#
# The simplest optimiser needs no training: draw $n$ responses from the base policy $\pi$ and
# keep the one the proxy scores highest (used with a learned reward by Nakano et al., 2021,
# "WebGPT: Browser-assisted question-answering with human feedback"). Let the proxy
# score $r$ of a response drawn from $\pi$ have a continuous CDF $F$. The best of $n$ lies below
# $t$ exactly when all $n$ do, so $P(\max \le t) = F(t)^n$ and the winner's density is
# $\frac{d}{dt}F(t)^n = nF(t)^{n-1}f(t)$: a response $y$ is kept with probability
#
# $$ \pi_{\text{bon}}(y) = n\,F(r(y))^{n-1}\,\pi(y). $$
#
# The KL is the expectation under $\pi_{\text{bon}}$ of the log-ratio $\log(nF^{n-1})$; since
# $u = F(r)$ is uniform on $[0, 1]$ under $\pi$,
#
# $$ \mathrm{KL}(\pi_{\text{bon}}\,\|\,\pi) = \int_0^1 n u^{n-1} \log\!\left(n u^{n-1}\right) du
#    = \log n - \frac{n-1}{n}, $$
#
# whatever $\pi$ and $F$ are: the distance Gao et al. (2023) assign to best-of-$n$. SymPy does
# the derivative and the integral; a numerical quadrature (scipy) checks the result at three
# values of $n$.

# %%
show_source(best_of_n_kl_symbolic)

# %%
bon = best_of_n_kl_symbolic()
n_sym, t_sym = sp.Symbol("n", positive=True, integer=True), sp.Symbol("t", positive=True)
F = sp.Function("F")
display(sp.Eq(sp.Symbol(r"\frac{d}{dt}F(t)^n"), sp.powsimp(bon["density"])),
        sp.Eq(sp.Symbol(r"\mathrm{KL}(\pi_{bon}\|\pi)"), bon["kl"]))
checks = Checks("best-of-n: density and KL")
checks.equal("d/dt F^n - n F^(n-1) F' simplifies to", 0,
             sp.simplify(bon["density"] - n_sym * F(t_sym) ** (n_sym - 1) * sp.diff(F(t_sym), t_sym)))
for n in (2, 8, 64):
    value = quad(lambda u, n=n: n * u ** (n - 1) * math.log(n * u ** (n - 1)) if u > 0 else 0.0, 0, 1,
                 limit=200)[0]
    checks.close(f"SymPy's KL at n = {n} vs quadrature", value, float(bon["kl"].subs(n_sym, n)), tol=1e-8)
checks

# %% [markdown]
# The KL grows like $\log n$, so best-of-$n$ travels a very short distance: $d$ is below 2
# even at $n = 64$.

# %%
for n in (1, 2, 4, 8, 16, 32, 64):
    print(f"n = {n:2d}   KL = {best_of_n_kl(n):.3f} nats   d = {math.sqrt(best_of_n_kl(n)):.3f}")

# %% [markdown]
# ## 18b.3 A discrete base policy: exact, and never above the formula
#
# A language model's responses are discrete, and the formula needs a reward with no ties. For
# a categorical base policy $p_1, \dots, p_K$ with rewards sorted increasingly and
# $F_i = p_1 + \dots + p_i$, outcome $i$ wins when all $n$ draws are at or below it but not
# all strictly below: $\pi_{\text{bon}}(i) = F_i^n - F_{i-1}^n$. Ties are broken uniformly at
# random among the draws with the top reward, so a block of tied outcomes wins
# $F_{\text{hi}}^n - F_{\text{lo}}^n$ in total, shared in proportion to $p$.
#
# **The bound.** With distinct rewards, the ratio $\pi_{\text{bon}}(i)/p_i =
# (F_i^n - F_{i-1}^n)/(F_i - F_{i-1})$ is the *average* of $g(u) = nu^{n-1}$ over the interval
# $[F_{i-1}, F_i]$. The function $\varphi(t) = t\log t$ is convex, so by Jensen's inequality
# $p_i\,\varphi(\bar g_i) \le \int_{F_{i-1}}^{F_i} \varphi(g(u))\,du$; summing over $i$,
#
# $$ \mathrm{KL}(\pi_{\text{bon}}\,\|\,p) = \sum_i p_i\,\varphi(\bar g_i) \;\le\;
#    \int_0^1 \varphi(g(u))\,du = \log n - \frac{n-1}{n}. $$
#
# A tied block is one interval whose winning mass is split in proportion to $p$, which leaves
# its ratio and its term unchanged. Equality needs $g$ constant on every interval, so the
# formula is reached only in the limit where the largest $p_i$ shrinks to zero (the same bound
# is proved by Beirami et al., 2024, "Theoretical guarantees on the best-of-n alignment
# policy"). A worked example, then three checks: the exact distribution against 400,000 Monte
# Carlo draws of best-of-$n$ (a sampler that knows nothing of the formula), the bound on 2,000
# random categoricals with ties, and the limit.

# %%
show_source(best_of_n_distribution)

# %%
p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=f64)
r = torch.tensor([3.0, 1.0, 2.0, 0.0], dtype=f64)
print("best-of-3 of p = (0.1, 0.2, 0.3, 0.4) with rewards (3, 1, 2, 0):",
      [round(x, 4) for x in best_of_n_distribution(p, r, 3).tolist()])
print(f"exact KL {best_of_n_kl_exact(p, r, 3):.4f} nats; the continuous formula {best_of_n_kl(3):.4f}")

# %%
K, n_mc, draws = 40, 8, 400_000
p_mc = torch.softmax(torch.randn(K, generator=g, dtype=f64), 0)
r_mc = torch.randint(0, 25, (K,), generator=g).double()  # 25 reward levels for 40 outcomes: ties
samples = sample_best_of_n(p_mc, r_mc, n_mc, draws, g)
freq = torch.bincount(samples, minlength=K).double() / draws
exact = best_of_n_distribution(p_mc, r_mc, n_mc)
gap = []
for _ in range(2000):
    k = int(torch.randint(1, 30, (1,), generator=g))
    q_rand = torch.softmax(3 * torch.randn(k, generator=g, dtype=f64), 0)
    r_rand = torch.randint(0, 10, (k,), generator=g).double()
    n_rand = int(torch.randint(1, 65, (1,), generator=g))
    gap.append(best_of_n_kl_exact(q_rand, r_rand, n_rand) - best_of_n_kl(n_rand))
checks = Checks("discrete best-of-n")
checks.close(f"frequencies of {draws:,} draws vs exact (max abs)", exact, freq, tol=5 * math.sqrt(0.25 / draws))
checks.close("plug-in KL of the draws vs exact KL", best_of_n_kl_exact(p_mc, r_mc, n_mc),
             plug_in_kl(samples, p_mc), tol=5e-3)
checks.true("exact KL - formula <= 0 on 2,000 random categoricals", max(gap) <= 1e-12, round(max(gap), 4))
checks

# %% [markdown]
# As the outcomes get finer (here $K$ equally likely outcomes with distinct rewards, $n = 16$)
# the exact KL rises to the formula, the gap shrinking like $1/K^2$ (exercise 2 derives the
# constant):

# %%
for K in (10, 100, 1000, 10_000):
    exact_kl = best_of_n_kl_exact(torch.full((K,), 1 / K, dtype=f64), torch.arange(K, dtype=f64), 16)
    print(f"K = {K:6,d}   exact {exact_kl:.6f}   formula {best_of_n_kl(16):.6f}   "
          f"gap {best_of_n_kl(16) - exact_kl:.2e}")

# %% [markdown]
# On the book's text model two responses to a prompt almost never get the same proxy score
# (24 tokens from a 1024-token vocabulary, scored by a float), so the formula applies there;
# section 18b.5 checks that the shipped samples have no ties. What is *measured* in this
# section is the exact distribution against Monte Carlo on a toy categorical. On the text
# model the KL of best-of-$n$ is taken from the formula, not measured: a response's
# probability under $\pi_{\text{bon}}$ has no tractable form beyond the one derived here.
#
# ## 18b.4 Best-of-$n$ for every $n$ from one pool of samples
#
# Drawing fresh groups of $n$ responses for each $n$ would waste samples. Draw instead
# $N \ge n$ responses per prompt once, and average over *all* $\binom{N}{n}$ subsets of size
# $n$ the gold reward of the subset's highest-proxy member. Sort the $N$ samples by proxy
# score: the sample of rank $k$ (1 the lowest) is the best of a subset exactly when the subset
# holds it and $n - 1$ of the $k - 1$ samples below it, in $\binom{k-1}{n-1}$ of the subsets.
# So the average is a weighted sum with weights $w_k = \binom{k-1}{n-1}/\binom{N}{n}$, one pass
# over the sorted pool, and it is an unbiased estimate of best-of-$n$'s expected gold reward,
# since each subset is a sample of $n$ i.i.d. responses. Gao et al. (2023) compute best-of-$n$
# from a larger pool in this spirit; the weights share equally among tied scores.

# %%
show_source(best_of_n_weights)

# %% [markdown]
# The check enumerates all $\binom{12}{4} = 495$ subsets of the first prompt's first 12
# shipped samples; and at $n = 1$ and $n = N$ the estimate must be the plain mean and the gold
# reward of the top-scored sample.

# %%
proxy = torch.tensor(results["pool"]["proxy"], dtype=f64)  # (B, N) reward-model scores
gold = torch.tensor(results["pool"]["gold"], dtype=f64)  # (B, N) keyword counts
B, N = proxy.shape
s12, v12 = proxy[0, :12].tolist(), gold[0, :12].tolist()
enumerated = np.mean([v12[max(sub, key=lambda i: s12[i])] for sub in itertools.combinations(range(12), 4)])
checks = Checks("the subset estimator")
checks.close("best-of-4 of 12: enumeration of 495 subsets", enumerated,
             float(best_of_n_estimate(proxy[:1, :12], gold[:1, :12], 4)[0]), tol=1e-12)
checks.close("n = 1: the pool's mean gold", gold.mean(), best_of_n_estimate(proxy, gold, 1).mean(), tol=1e-12)
checks.close(f"n = N = {N}: gold of the top-scored sample", gold.gather(1, proxy.argmax(1, keepdim=True)).mean(),
             best_of_n_estimate(proxy, gold, N).mean(), tol=1e-12)
checks

# %% [markdown]
# ## 18b.5 Best-of-$n$ against the reward model
#
# The shipped pool holds 64 responses of the base model to each of 256 test prompts, with
# their proxy scores and gold keyword counts. For each $n$ the estimator gives the mean gold
# and proxy reward of best-of-$n$; $d = \sqrt{\log n - (n-1)/n}$.

# %%
distinct = min(len(set(row)) for row in proxy.tolist())
ns = [1, 2, 4, 8, 16, 32, 64]
d_bon = np.array([math.sqrt(best_of_n_kl(n)) for n in ns])
gold_bon = np.array([float(best_of_n_estimate(proxy, gold, n).mean()) for n in ns])
proxy_bon = np.array([float(best_of_n_estimate(proxy, proxy, n).mean()) for n in ns])
print(f"{B} prompts x {N} samples; fewest distinct proxy scores in a row: {distinct} of {N}")
print(f"{'n':>3s} {'d':>6s} {'gold':>7s} {'proxy':>7s}")
for n, d, gl, px in zip(ns, d_bon, gold_bon, proxy_bon, strict=True):
    print(f"{n:3d} {d:6.3f} {gl:7.3f} {px:7.3f}")
print(f"best-of-64 gains: proxy {proxy_bon[-1] - proxy_bon[0]:.2f}, gold {gold_bon[-1] - gold_bon[0]:.2f}")

# %% [markdown]
# Every response to a prompt has its own proxy score, so the formula's $d$ applies. Best-of-64
# raises the proxy by 1.32 and the gold reward from 0.374 to 1.832 keywords, and the gold
# reward rises *faster* than linearly in $d$: over the short distance that best-of-$n$
# travels, choosing by the learned model largely means choosing by keyword count, and the
# more responses it chooses from, the more keywords the winner has. There is no over-optimisation
# to see at $d < 2$; the learned model is a good proxy near the base policy, where its
# training data came from.
#
# ## 18b.6 RL against the reward model: PPO and GRPO
#
# Two RL runs optimise the proxy, both from the base model with LoRA adapters (chapter 16)
# as in chapter 18:
#
# * **PPO**: chapter 18's `rollout` and `ppo_update` with the reward model as the score and
#   the small KL coefficient $\beta = 0.003$ of section 18.7, so that the policy travels far;
# * **GRPO** (chapter 20): 8 responses to each of 8 prompts per iteration, advantages
#   normalised within each group of 8, the clipped loss, no KL term and no critic.
#
# Every 5 iterations the policy answers 256 test prompts; the record holds the mean gold and
# proxy reward of those responses and $\widehat{\mathrm{KL}}$, the mean over responses of
# $\sum_t \log\pi(y_t|\cdot)/\pi_{\text{ref}}(y_t|\cdot)$ (unbiased, chapter 18's
# `evaluate_policy`), with its standard error.

# %%
show_source(train_proxy_grpo)

# %%
print(f"PPO: beta = {recipe['ppo']['beta']}, {recipe['ppo']['iterations']} iterations of "
      f"{recipe['ppo']['batch_size']} prompts; GRPO: beta = {recipe['grpo']['beta']}, "
      f"{recipe['grpo']['iterations']} iterations of {recipe['grpo']['prompts_per_step']} prompts x "
      f"{recipe['grpo']['group_size']} responses")
for name in ("ppo", "grpo"):
    c = results[name]["curve"]
    print(f"{name}: {len(c['step'])} evaluations, {results[name]['wall_seconds'] / 60:.0f} min")
    print(f"  {'iter':>4s} {'KL':>7s} {'± se':>5s} {'d':>6s} {'gold':>6s} {'proxy':>7s}")
    for i in range(len(c["step"])):
        print(f"  {c['step'][i]:4d} {c['kl'][i]:7.2f} {c['kl_stderr'][i]:5.2f} {c['d'][i]:6.3f} "
              f"{c['gold'][i]:6.3f} {c['proxy'][i]:7.3f}")

# %% [markdown]
# Both runs push the proxy far beyond what best-of-64 reaches, and both travel much further:
# PPO's KL levels off between about 23 and 29 nats ($d \approx 5$): once the proxy flattens,
# even the small KL penalty holds the policy back; GRPO, with no KL term, keeps going to 100 nats ($d = 10$).
# The gold reward tells two different stories. For PPO it climbs from 0.328 to about 6 to 7
# keywords and stays there, within the noise of an evaluation on 256 prompts. For GRPO it
# climbs to 8.656 at $d = 7.2$ and then **falls**, to 6.402 at $d = 10$, while the proxy keeps
# rising (1.451 to 1.488): the policy has found responses that the reward model likes more and
# that have fewer keywords. That is over-optimisation, measured: the proxy gain keeps buying
# distance from the reference after the gold reward has turned.
#
# ## 18b.7 Fitting Gao et al.'s forms
#
# Both forms are *linear* in $(\alpha, \beta)$: $R = \alpha d - \beta d^2$ for best-of-$n$ and
# $R = \alpha d - \beta\, d\log d$ for RL. Ordinary least squares on these two columns, without
# an intercept since $R(0) = 0$, gives the coefficients in closed form; scipy's nonlinear
# `curve_fit`, started elsewhere, must find the same. The fitted curve peaks at
# $d^* = \alpha/(2\beta)$ (best-of-$n$) or $d^* = e^{\alpha/\beta - 1}$ (RL) when
# $\alpha, \beta > 0$.

# %%
show_source(gao_fit)

# %%
series = {"best-of-n": (d_bon, gold_bon - gold_bon[0], proxy_bon - proxy_bon[0], "bon")}
for name in ("ppo", "grpo"):
    c = results[name]["curve"]
    series[name.upper()] = (np.array(c["d"]), np.array(c["gold"]) - c["gold"][0],
                            np.array(c["proxy"]) - c["proxy"][0], "rl")
fits, checks = {}, Checks("least squares vs scipy's curve_fit")
print(f"{'':10s} {'reward':6s} {'form':4s} {'alpha':>7s} {'beta':>7s} {'R^2':>6s} {'rmse':>6s} {'peak d*':>8s}")
for name, (d, gain_gold, gain_proxy, form) in series.items():
    for which, gain in (("gold", gain_gold), ("proxy", gain_proxy)):
        fit = fits[name, which] = gao_fit(d, gain, form)
        peer = curve_fit(lambda x, a, b, form=form: gao_curve(x, a, b, form), d, gain, p0=(0.1, 0.0))[0]
        checks.close(f"{name} {which}: (alpha, beta)", peer, [fit.alpha, fit.beta], tol=1e-6)
        print(f"{name:10s} {which:6s} {form:4s} {fit.alpha:7.3f} {fit.beta:7.3f} {fit.r2:6.3f} "
              f"{fit.rmse:6.3f} {gao_peak(fit):8.2f}")
checks

# %% [markdown]
# What the fits say:
#
# * **The proxy** follows Gao et al.'s forms closely in all three cases ($R^2$ from 0.986 to
#   0.996): concave in $d$, rising ever more slowly.
# * **Best-of-$n$'s gold** fits its form with $R^2 = 0.998$, but with $\beta < 0$: a curve
#   bending *up*, so it has no peak. A positive $\beta_{\text{bon}}$, as Gao et al. find, needs
#   the gold reward to turn over, and over $d \le 1.78$ it does not here.
# * **PPO's gold** rises in an S: slowly while the policy is close to the reference (each
#   extra keyword is rare), fast once it has learned to repeat keywords, then flat. Both
#   fitted coefficients are negative, again no peak, and the fitted curve even dips below
#   zero near the start, where the data do not.
# * **GRPO's gold** does peak and fall, but the RL form captures it poorly ($R^2 = 0.77$): the
#   form can only turn down slowly, as $-d\log d$, and places the peak at $d^* \approx 17$,
#   beyond all the data, while the measured peak is at $d \approx 7$.
#
# So on this task the functional forms describe the proxy and not the gold reward. Two
# reasons are visible in the numbers. The gold reward counts keywords, a quantity a policy can
# raise twentyfold (chapter 18's hacked policy filled most of its 24 tokens with them), while
# the proxy saturates near 1.5: the two are on different scales with different ceilings, and
# Gao et al.'s gold was itself a reward model. And the book's runs are single seeds evaluated on 256 prompts,
# so each point carries noise of a few tenths of a keyword; the fall in GRPO's run (more than
# two keywords) is well outside it, the wiggles of PPO's are not.

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=False)
for ax, (name, (d, gain_gold, gain_proxy, form)) in zip(axes, series.items(), strict=True):
    grid = np.linspace(0, d.max() * 1.05, 200)
    ax.plot(d, gain_gold, "o", color="C0", label="gold (keywords)")
    ax.plot(grid, gao_curve(grid, fits[name, "gold"].alpha, fits[name, "gold"].beta, form), "-", color="C0",
            label="fit, gold")
    ax.plot(d, gain_proxy, "s", color="C1", label="proxy (reward model)")
    ax.plot(grid, gao_curve(grid, fits[name, "proxy"].alpha, fits[name, "proxy"].beta, form), "--",
            color="C1", label="fit, proxy")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(title=name, xlabel=r"$d = \sqrt{\mathrm{KL}(\pi\,\|\,\pi_{ref})}$ (nats$^{1/2}$)",
           ylabel="gain over the base policy\n(keywords; reward-model units)")
axes[0].legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "18b_reward_overoptimisation_curves")
plt.show()

# %% [markdown]
# The figure shows the gains over the base policy against $d$, the points measured and the
# lines fitted: best-of-$n$ on the left covers a short distance; the two RL runs go three to six
# times further. In each panel the proxy (orange) flattens; the gold reward (blue) climbs past
# it, and in GRPO's panel turns down while the proxy is still rising.
#
# ## Summary
#
# * Best-of-$n$ keeps a response with probability $nF^{n-1}\pi$; its KL from the base policy is
#   $\log n - \frac{n-1}{n}$ for a continuous reward, and at most that for a discrete one
#   (Jensen's inequality on each interval of the CDF), reached as the outcomes get finer.
# * Best-of-$n$ for every $n \le N$ comes from one pool of $N$ samples per prompt: the sample of
#   rank $k$ wins a fraction $\binom{k-1}{n-1}/\binom{N}{n}$ of the subsets.
# * Against chapter 17's reward model as proxy, best-of-64 ($d = 1.78$) raises the gold
#   keyword count from 0.374 to 1.832 without any sign of over-optimisation. PPO with
#   $\beta = 0.003$ stops near $d = 5$ at 6 to 7 keywords. GRPO without a KL term reaches
#   8.656 at $d = 7.2$ and then loses more than two keywords by $d = 10$ while the proxy keeps
#   rising: over-optimisation.
# * Gao et al.'s functional forms fit the proxy curves ($R^2 \ge 0.986$) but not the gold
#   reward of this task: best-of-$n$ and PPO bend upwards ($\beta < 0$), and the RL form puts
#   GRPO's peak at $d^* \approx 17$ instead of the measured 7.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/18b_reward_overoptimisation.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 18b` writes a stub
# of every function, `llmbook grade 18b` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_18b.py` runs
# the same checks on the reference.
#
# 1. (★) **Best-of-$n$ of a Gaussian proxy.** If the proxy score is standard normal under the
#    base policy, best-of-$n$'s expected proxy score is the mean of the maximum of $n$ normals
#    (chapter 20's `expected_max_gaussian`). Tabulate its ratio to $d = \sqrt{\log n - (n-1)/n}$
#    for $n$ from 2 to $2^{20}$. Is the proxy linear in $d$? Which constant does the ratio
#    approach, and how slowly?
# 2. (★★) **How fast the discrete KL reaches the formula.** For $K$ equally likely outcomes with
#    distinct rewards, expand the Jensen gap of each interval to second order and show with SymPy
#    that the total gap is $\frac{1}{24K^2}\int_0^1 g'(u)^2/g(u)\,du =
#    \frac{n(n-1)^2}{24(n-2)K^2}$ for $n > 2$. Check it against `best_of_n_kl_exact` for $n = 16$
#    and $K = 10, 100, 1000$.
# 3. (★★) **Is noise enough to over-optimise?** Let the gold reward be $G \sim N(0, 1)$ and the
#    proxy $P = G + \varepsilon$ with independent noise $\varepsilon \sim N(0, s^2)$. Show that
#    $\mathbb E[G \mid P] = P/(1+s^2)$, so that best-of-$n$ by the proxy gains exactly
#    $1/(1+s^2)$ of its proxy gain in gold: gold never falls. Check it with the pool estimator on
#    simulated pools for $s = 0.5$ and $s = 2$. What would a proxy error need to do to make gold
#    fall?

# %%
from llmbook.workbench import grade

grade("18b", globals())
