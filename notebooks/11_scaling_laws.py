# %% [markdown]
# # 11 Scaling laws
#
# Chapter 10 trained one model. Training a large one costs millions of dollars, so before
# doing it one wants to know two things: how good will it be, and, for a fixed budget of
# compute, how big should the model be and on how many tokens should it train? The answer
# the field found is empirical but remarkably regular. Over many orders of magnitude the
# loss of a language model falls as a **power law** in its number of parameters $N$, its
# number of training tokens $D$ and its training compute $C$ (Kaplan et al., 2020,
# "Scaling Laws for Neural Language Models"). This chapter builds the tools to read and use
# such laws:
#
# 1. **power laws and log–log fits**: a power law is a straight line on a log–log plot, and
#    fitting it is a linear regression on the logarithms, derived in SymPy;
# 2. **$C \approx 6ND$**: the training compute, derived from the FLOPs per token of
#    chapter 7, with the condition under which attention can be neglected;
# 3. **a sweep**: eight sizes of tiny transformer, three seeds each, trained on the book's
#    synthetic source: a power law in $N$ fitted to the smaller half of the sizes predicts
#    the larger half, with intervals;
# 4. **Chinchilla's compute-optimal allocation**: the parametric loss
#    $L(N, D) = E + A/N^\alpha + B/D^\beta$ of Hoffmann et al. (2022), minimised under the
#    budget $6ND = C$ with a Lagrange multiplier in SymPy, and checked against a numerical
#    minimisation, for the published constants and for those of the 2024 replication;
# 5. **where the two fits disagree**: tokens per parameter, and what each says about
#    Chinchilla itself.
# 6. **Kaplan against Chinchilla**: $N_{opt} \propto C^{0.73}$ against $C^{0.5}$, why the two
#    studies differ, an iso-FLOP fit from tiny runs, and a published allocation claim checked
#    against $C = 6ND$.
# 7. **emergence as a property of the metric**: exact match on an answer of $L$ tokens is
#    $p^L$, which jumps where the per-token accuracy $p$ rises smoothly, shown on a sweep of
#    the book's own models; and three published claims about scale, graded.
# 8. **past the compute-optimal point**: what repeated epochs are worth (Muennighoff et al.,
#    2023), and the smaller model trained on more tokens that minimises training plus
#    inference compute (Sardana et al., 2024), which is why SmolLM2-135M saw 2T tokens.

# %%
import json
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display
from scipy.stats import t as student_t
from torch.utils.flop_counter import FlopCounterMode

from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.text.worked_example import load_the_cat_sat
from llmbook.training.emergence import (
    CODEX_PASS_AT_1,
    EMERGENCE_RESULTS,
    EMERGENT_SCALES,
    PUBLISHED_RUNS,
    exact_match_from_per_token,
    score_answers,
)
from llmbook.training.scaling import (
    CHINCHILLA_CONSTANTS,
    ISOFLOP_RESULTS,
    MUENNIGHOFF_R_STAR,
    SIZE_SWEEP_RESULTS,
    chinchilla_loss,
    compute_optimal,
    counted_training_flops,
    effective_data,
    fit_isoflop_parabola,
    fit_power_law,
    get_constants,
    golden_section_minimize,
    inference_breakeven_tokens,
    inference_optimal,
    optimal_exponents,
    predict_power_law,
    size_sweep,
    tokens_per_parameter,
    training_flops,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.sizing import (
    SYMBOLS,
    count_parameters_symbolic,
    flops_per_token,
    flops_per_token_symbolic,
    parameter_shares,
)

g = seed_everything(0)
torch.set_num_threads(1)  # the models here are tiny: one thread is faster and repeatable

# %% [markdown]
# ## 11.1 Power laws are straight lines on a log–log plot
#
# A **power law** $y = a\,x^{-\alpha}$ becomes linear after taking logarithms:
#
# $$ \log y = \log a - \alpha \log x . $$
#
# So a power law is a straight line of slope $-\alpha$ on log–log axes, and doubling $x$
# multiplies $y$ by $2^{-\alpha}$ wherever one starts: there is no characteristic scale.
# Kaplan et al. (2020) found the test loss of transformers to follow
# $L(N) = (N_c/N)^{\alpha_N}$ with $\alpha_N \approx 0.076$ over six orders of magnitude of
# $N$ (their equation 1.1), with similar laws in $D$ and $C$.
#
# To fit one, regress $v = \log y$ on $u = \log x$: choose $c_0, c_1$ minimising the sum of
# squares $S = \sum_i (v_i - c_0 - c_1 u_i)^2$, then $\alpha = -c_1$ and $a = e^{c_0}$.
# Setting both partial derivatives of $S$ to zero (the *normal equations*) and solving gives
# the familiar closed form. SymPy does it for $n = 5$ points with symbolic coordinates (the
# algebra is the same for any $n$):

# %%
n_pts = 5
u = sp.symbols(f"u1:{n_pts + 1}", real=True)
v = sp.symbols(f"v1:{n_pts + 1}", real=True)
c0, c1 = sp.symbols("c0 c1", real=True)
S = sum((v[i] - c0 - c1 * u[i]) ** 2 for i in range(n_pts))
sol = sp.solve([sp.diff(S, c0), sp.diff(S, c1)], [c0, c1], dict=True)[0]
u_bar, v_bar = sum(u) / n_pts, sum(v) / n_pts
slope = sum((u[i] - u_bar) * (v[i] - v_bar) for i in range(n_pts)) / sum(
    (u[i] - u_bar) ** 2 for i in range(n_pts))
assert sp.simplify(sol[c1] - slope) == 0
assert sp.simplify(sol[c0] - (v_bar - slope * u_bar)) == 0
display(sp.Eq(sp.Symbol("c_1"), sp.Symbol(r"\frac{\sum_i (u_i - \bar u)(v_i - \bar v)}"
                                          r"{\sum_i (u_i - \bar u)^2}")),
        sp.Eq(sp.Symbol("c_0"), sp.Symbol(r"\bar v - c_1 \bar u")))

# %% [markdown]
# The slope is the covariance of $u$ and $v$ over the variance of $u$. Fitting in log space
# weighs every point by its *relative* error, which suits data spread over orders of
# magnitude and noise that multiplies rather than adds.
#
# Loss curves do not fall to zero, though: no model beats the entropy of the text. The
# law then has an irreducible offset, $y = E + a\,x^{-\alpha}$, and only $y - E$ is a
# straight line. If $E$ is known (as it is for the book's synthetic source) it is
# subtracted; if not, `fit_power_law(..., offset="fit")` searches for the $E$ that makes
# the line straightest (smallest sum of squared log residuals), fitting the line in closed
# form at each candidate:

# %%
show_source(fit_power_law)

# %% [markdown]
# Checks: an exact power law must come back exactly; on noisy data the fit must equal
# NumPy's own least-squares polynomial fit `np.polyfit` of degree 1 on the logarithms (an
# independent implementation); and an offset law must give back its offset.

# %%
rng = np.random.default_rng(0)
x = np.logspace(2, 8, 13)
checks = Checks("fit_power_law")
exact = fit_power_law(x, 4.2 * x**-0.35)
checks.close("exact law: alpha", 0.35, exact.alpha, tol=1e-12)
checks.close("exact law: a", 4.2, exact.a, tol=1e-12, rel=True)
noisy_y = 4.2 * x**-0.35 * np.exp(0.05 * rng.standard_normal(x.size))
noisy = fit_power_law(x, noisy_y)
slope_np, intercept_np = np.polyfit(np.log(x), np.log(noisy_y), 1)
checks.close("noisy: alpha vs np.polyfit", -slope_np, noisy.alpha, tol=1e-12)
checks.close("noisy: a vs np.polyfit", math.exp(intercept_np), noisy.a, tol=1e-12, rel=True)
offset_fit = fit_power_law(x, 1.6 + 4.2 * x**-0.35, offset="fit")
checks.close("offset law: E (fitted)", 1.6, offset_fit.E, tol=1e-9)
checks.close("offset law: alpha", 0.35, offset_fit.alpha, tol=1e-9)
checks

# %% [markdown]
# What forgetting the offset does: below, 13 noisy points of $y = 1.6 + 4.2\,x^{-0.35}$
# (0.5% multiplicative noise). A pure power law (dashed) cannot follow the flattening
# towards $E$: it misses both ends, and its exponent is several times too small. Fitting
# $E$ as well recovers the law to within the noise.

# %%
x = np.logspace(1, 6, 13)
y_off = (1.6 + 4.2 * x**-0.35) * np.exp(0.005 * rng.standard_normal(x.size))
fit_no_e, fit_e = fit_power_law(x, y_off), fit_power_law(x, y_off, offset="fit")
print(f"no offset:     alpha = {fit_no_e.alpha:.4f}, R^2 (log space) = {fit_no_e.r_squared:.4f}")
print(f"fitted offset: alpha = {fit_e.alpha:.4f}, E = {fit_e.E:.4f}, a = {fit_e.a:.3f}")
fig, ax = plt.subplots(figsize=(6.5, 4))
ax.loglog(x, y_off, "o", color="black", label="data: $1.6 + 4.2x^{-0.35}$, 0.5% noise")
xs_dense = np.logspace(1, 6, 200)
ax.loglog(xs_dense, fit_no_e.predict(xs_dense), "--", label=f"$ax^{{-\\alpha}}$, "
          f"$\\alpha$ = {fit_no_e.alpha:.3f}")
ax.loglog(xs_dense, fit_e.predict(xs_dense), label=f"$E + ax^{{-\\alpha}}$, "
          f"$\\alpha$ = {fit_e.alpha:.3f}, E = {fit_e.E:.2f}")
ax.set_xlabel("x (e.g. parameters)")
ax.set_ylabel("y (e.g. loss, nats/token)")
ax.set_title("A power law with an offset, fitted with and without it")
ax.legend(fontsize="small")
save_figure(fig, "11_scaling_laws_offset")
plt.show()

# %% [markdown]
# ## 11.2 Counting compute: $C \approx 6ND$
#
# Chapter 7 derived the forward FLOPs per token of the book's model (matrix products only,
# 2 FLOPs per multiply-add). Subtract twice the number $N_{mm}$ of parameters that take
# part in matrix products (every weight matrix, the output layer included; not the
# embedding lookup, the norms or the biases, which are left out of the count) and what
# is left is the attention term, the only one that grows with $T$:

# %%
V, d, L, H, H_kv, d_h, d_ff, m, T, T_max, b_qkv, b_o, b_mlp, b_n, u_head, p_pos = SYMBOLS
F_fwd = flops_per_token_symbolic()
norms = (2 * L + 1) * d * (1 + b_n)
N_mm = count_parameters_symbolic().subs({b_qkv: 0, b_o: 0, b_mlp: 0, u_head: 0, p_pos: 0}) - norms
attention_term = sp.expand(F_fwd - 2 * N_mm)
assert sp.simplify(attention_term - 4 * L * T * H * d_h) == 0
display(sp.Eq(sp.Symbol("C_{fwd}/token"), sp.Add(2 * sp.Symbol("N_{mm}"), attention_term,
                                                  evaluate=False)))

# %% [markdown]
# When is the attention term small? Take the usual shapes, $H d_h = d$, no grouping
# ($H_{kv} = H$) and either the GELU MLP with $d_{ff} = 4d$ or SwiGLU with
# $d_{ff} = \tfrac83 d$. Both give $12 d^2$ weights per layer, and per layer the ratio of
# attention FLOPs to weight FLOPs is

# %%
standard = {H_kv: H, d_h: d / H}
for m_, ff in ((2, 4 * d), (3, sp.Rational(8, 3) * d)):
    per_layer = (F_fwd - 2 * d * V).subs(standard).subs({m: m_, d_ff: ff}) / L
    weights = sp.expand(per_layer).coeff(T, 0)
    ratio = sp.simplify((per_layer - weights) / weights)
    assert sp.simplify(weights - 2 * 12 * d**2) == 0 and sp.simplify(ratio - T / (6 * d)) == 0
display(sp.Eq(sp.Symbol(r"\frac{4THd_h}{2 \cdot 12 d^2}"), T / (6 * d)))

# %% [markdown]
# So $C_{fwd} \approx 2N$ per token when $d \gg T/6$: the model is much wider than a sixth
# of its context. GPT-2 small ($d = 768$, $T = 1024$) is at $T/6d = 0.22$; Llama 2 7B
# ($d = 4096$, $T = 4096$) at $0.17$ (a causal kernel that skips the masked half halves
# both).
#
# **The backward pass costs twice the forward.** For each product $Y = XW$ with
# $X \in \mathbb R^{n \times k}$, $W \in \mathbb R^{k \times m}$ (chapter 8), backward
# computes $\partial \mathcal L/\partial X = (\partial \mathcal L/\partial Y) W^\top$ and
# $\partial \mathcal L/\partial W = X^\top (\partial \mathcal L/\partial Y)$, two products of
# the same size:

# %%
n_, k_, m_ = sp.symbols("n k m", positive=True, integer=True)
fwd_mm = 2 * n_ * k_ * m_  # X (n, k) @ W (k, m)
bwd_mm = 2 * n_ * m_ * k_ + 2 * k_ * n_ * m_  # dY (n, m) @ W^T (m, k) and X^T (k, n) @ dY (n, m)
assert sp.simplify(bwd_mm - 2 * fwd_mm) == 0
train_per_token = sp.expand(3 * (2 * sp.Symbol("N_{mm}") + attention_term))
display(sp.Eq(sp.Symbol("C_{train}/token"), train_per_token))

# %% [markdown]
# Training therefore costs $3 \times 2N = 6N$ FLOPs per token, and $C \approx 6ND$ for $D$
# tokens (Kaplan et al., 2020, section 2.1). `FlopCounterMode`, which counts the matrix
# products PyTorch actually dispatches, confirms the factor 3 on a small model (with the
# book's unfused attention, which the counter can see); `counted_training_flops` then counts
# a forward and backward pass of real shapes, to compare with $6N$ and with the closed form:

# %%
tiny = TransformerConfig.llama_style(vocab_size=16, d_model=24, n_layers=2, n_heads=2,
                                     max_seq_len=32)
model = TransformerLM(tiny, generator=g)
model.set_fused_attention(False)
ids = torch.randint(0, 16, (4, 32), generator=g)
with FlopCounterMode(display=False) as fwd_counter:
    model(ids)
with FlopCounterMode(display=False) as train_counter:
    F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1)).backward()
checks = Checks("training FLOPs")
checks.equal("forward: closed form x B T", 4 * 32 * flops_per_token(tiny, 32),
             fwd_counter.get_total_flops())
checks.equal("forward + backward = 3 x forward", 3 * fwd_counter.get_total_flops(),
             train_counter.get_total_flops())
checks

# %%
def n_matmul(c):
    """N_mm of a configuration without biases: attention, MLP and output-layer weights."""
    shares = parameter_shares(c)
    return shares["attention"] + shares["mlp"] + c.vocab_size * c.d_model


shapes = {"GPT-2 small": (TransformerConfig.gpt2_style(), 1024),
          "Qwen2-0.5B": (TransformerConfig.qwen2_style(), 2048),
          "sweep, d=8": (TransformerConfig.llama_style(vocab_size=16, d_model=8, n_layers=1,
                                                       n_heads=1, max_seq_len=32), 32),
          "sweep, d=64": (TransformerConfig.llama_style(vocab_size=16, d_model=64, n_layers=2,
                                                        n_heads=8, max_seq_len=32), 32)}
checks = Checks("training FLOPs: FlopCounterMode (meta device) vs closed form")
print(f"{'model':13s}{'N':>13s}{'N_mm':>13s}{'counted FLOP/token':>20s}{'/ 6N':>7s}{'/ 6N_mm':>9s}"
      f"{'T/6d':>7s}")
for name, (c, T_) in shapes.items():
    counted = counted_training_flops(c, T_)  # forward + backward of one sequence, counted
    checks.equal(f"{name}: counted = 3 x closed form x T", 3 * flops_per_token(c, T_) * T_, counted)
    N_, Nmm_, per_token = parameter_shares(c)["total"], n_matmul(c), counted / T_
    print(f"{name:13s}{N_:13,d}{Nmm_:13,d}{per_token:20,.0f}{per_token / (6 * N_):7.3f}"
          f"{per_token / (6 * Nmm_):9.3f}{T_ / (6 * c.d_model):7.3f}")
checks

# %% [markdown]
# The counter dispatches the real model, shapes only, on PyTorch's `meta` device (no memory,
# no arithmetic), and adds up every matrix product of the forward pass, the loss and the
# backward pass: it agrees to the FLOP with three times chapter 7's closed form, for a
# GPT-2-style and a grouped-query Qwen2-style shape at their full context. The ratios to
# $6N$ are measurements of what the rule leaves out: at these context lengths $6N$
# undercounts GPT-2 small's training FLOPs by 14% and Qwen2-0.5B's by 18%, all of it the
# attention term (Qwen2-0.5B's query, key and value biases are counted in $N_{mm}$ here,
# though they are not products; they are 0.01% of it). Among the models of the next
# section, the widest ($d = 64$, $T/6d = 0.08$) is within 7% of $6N$; the narrowest
# ($d = 8$, $T/6d = 0.67$) needs 44% more than $6N_{mm}$. The rule is a statement about wide
# models; in our sweep we count parameters, not FLOPs.
#
# ## 11.3 A sweep of model sizes on the synthetic source
#
# The scaling laws of the literature come from hundreds of training runs. We can afford
# two dozen, on the synthetic source of chapter 3 (16 tokens, order-2 Markov chain). Its
# advantage over real text is that the floor is known exactly: the entropy rate
# $H = 1.6184$ nats/token, so the **reducible loss** $L - H$ can be measured directly, with
# no offset to fit. Each model is a Llama-style transformer, eight shapes with widths $d$
# from 8 to 64 and one or two layers, heads of width 8, trained with chapter 10's `train`
# for the same 300 steps of $32 \times 32$ tokens (307,200 tokens each) with the same
# hyperparameters, and each shape with three seeds (the seed draws the data sample, the
# initialisation and the batches). As in Kaplan et al. (2020) the size is the number of
# **non-embedding** parameters (the blocks, without $E$ and the output layer). The
# validation loss is scored from position 2 of each window on: the source draws each token
# from the two before it, so the first two predictions of a window lack context that no
# model could make up for, and would add a constant to every model's loss. Training the 24
# runs takes minutes and float32 training is not bit-reproducible across CPUs, so
# `data/make_scaling_sweep.py` makes them once and the chapter loads the result:

# %%
show_source(size_sweep)

# %%
size_data = json.loads(SIZE_SWEEP_RESULTS.read_text())
H_rate = size_data["entropy_rate"]
print(f"{size_data['made_by']}, {size_data['date']}: {size_data['steps']} steps of "
      f"{size_data['batch_size']} x {size_data['context_length']} tokens, lr {size_data['lr']}, "
      f"seeds {size_data['seeds']}")
sizes_sw = sorted({(r["N"], r["d_model"], r["n_layers"], r["N_total"]) for r in size_data["runs"]})
# Losses to two decimals: that is what reads the same on every CPU (float32 training
# amplifies a last-bit difference in one kernel to about 1e-4 over 300 steps).
print(f"{'d':>3s}{'L':>3s}{'non-emb N':>11s}{'total N':>9s}{'val loss, each seed':>22s}{'mean L - H':>12s}")
for n_ne, d_, L_, n_tot in sizes_sw:
    vals = [r["val_loss"] for r in size_data["runs"] if r["N"] == n_ne]
    print(f"{d_:3d}{L_:3d}{n_ne:11,d}{n_tot:9,d}{'  '.join(f'{v:.2f}' for v in vals):>22s}"
          f"{np.mean(vals) - H_rate:12.2f}")

# %% [markdown]
# The seeds disagree by about 0.2 nats at one size (the two-layer $d = 16$ model ends
# worse with seed 1 than the one-layer model of the same width), so one run per size would
# not be enough to read an exponent off.
#
# **Predict first, then look.** Fit the power law $L - H = aN^{-\alpha}$ to the twelve runs
# of the four smaller shapes only, with the Student-$t$ intervals of a straight-line
# regression in log space, and predict the four larger shapes before comparing. The
# prediction interval for the mean of three new runs at $N_{new}$ widens with the distance
# $\log N_{new} - \overline{\log N}$ from the fitted points; it is set at 98.75% per size, so
# that all four held-out sizes are covered together with probability 95% (Bonferroni) if the
# law holds and the runs scatter independently around it.

# %%
show_source(predict_power_law)

# %%
N_runs = np.array([r["N"] for r in size_data["runs"]], dtype=float)
red_runs = np.array([r["val_loss"] for r in size_data["runs"]]) - H_rate
N_sizes = np.array(sorted({r["N"] for r in size_data["runs"]}), dtype=float)
fit_set, held_out = N_sizes[:4], N_sizes[4:]
in_fit = np.isin(N_runs, fit_set)
n_seeds = len(size_data["seeds"])
prediction = predict_power_law(N_runs[in_fit], red_runs[in_fit], held_out,
                               level=1 - 0.05 / held_out.size, averaged=n_seeds)
halves = {"smaller half": in_fit, "larger half": ~in_fit, "all sizes": np.ones_like(in_fit)}
alpha_se = {}
for label, mask in halves.items():
    lo, hi = predict_power_law(N_runs[mask], red_runs[mask], [1.0]).alpha_interval
    alpha_se[label] = ((lo + hi) / 2, (hi - lo) / 2 / student_t.ppf(0.975, mask.sum() - 2))
    print(f"{label:12s} ({mask.sum():2d} runs): alpha = {alpha_se[label][0]:.2f}, "
          f"95% interval [{lo:.2f}, {hi:.2f}]")
(a_small, se_small), (a_large, se_large) = alpha_se["smaller half"], alpha_se["larger half"]
print(f"larger - smaller: {a_large - a_small:.2f} = {(a_large - a_small) / math.hypot(se_small, se_large):.1f}"
      " standard errors (a measurement)")
held_mean = np.array([np.exp(np.mean(np.log(red_runs[N_runs == n]))) for n in held_out])
mean_by_size = np.array([np.mean(red_runs[N_runs == n]) for n in N_sizes])
checks = Checks("predicted from the smaller half, then compared (geometric mean over seeds of L - H)")
for n, lo, pred, hi, got in zip(held_out, prediction.lower, prediction.predicted, prediction.upper,
                                held_mean, strict=True):
    checks.true(f"N = {n:,.0f}: in [{lo:.2f}, {hi:.2f}] around {pred:.2f}", bool(lo <= got <= hi),
                got=round(float(got), 2))
checks.true("the seed-mean loss falls at every step up in size", bool(np.all(np.diff(mean_by_size) < 0)))
checks

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
ax.loglog(N_runs[in_fit], red_runs[in_fit], "o", color="black", ms=4, label="runs fitted (3 seeds each)")
ax.loglog(N_runs[~in_fit], red_runs[~in_fit], "o", color="C1", ms=4, mfc="none",
          label="held-out runs")
ax.loglog(held_out, held_mean, "D", color="C1", label="held-out seed mean")
dense = np.logspace(np.log10(N_sizes[0]) - 0.1, np.log10(N_sizes[-1]) + 0.1, 100)
band = predict_power_law(N_runs[in_fit], red_runs[in_fit], dense, level=1 - 0.05 / held_out.size,
                         averaged=n_seeds)
ax.loglog(dense, band.predicted, color="C0",
          label=f"fit to the smaller half: $\\alpha$ = {prediction.fit.alpha:.2f}")
ax.fill_between(dense, band.lower, band.upper, color="C0", alpha=0.15,
                label="prediction interval, mean of 3 runs")
ax.axvline(np.sqrt(fit_set[-1] * held_out[0]), color="gray", ls=":", lw=1)
ax.set_xlabel("non-embedding parameters N")
ax.set_ylabel("validation loss − entropy rate (nats/token)")
ax.set_title("Reducible loss: fitted on small models, predicting larger ones")
ax.legend(fontsize="small", loc="upper right")
save_figure(fig, "11_scaling_laws_sweep")
plt.show()

# %% [markdown]
# The four held-out sizes land inside the band the smaller models drew before they were
# looked at, all of them below its centre: the larger models do a little better than the
# small ones promised. The exponents say the same. Fitted on each half alone they are 0.28
# and 0.40, with intervals that overlap but whose difference is about twice its standard
# error: over two decades of $N$ the curve is not quite one straight line, and which
# exponent one reports depends on where one looks. That is why the exponent of all 24
# runs, 0.36, comes with an interval of its own and should not be read as a law of nature
# either: the models are tiny, the learning rate is the same for all of them (not tuned
# per size, as a real sweep would do), and every model saw the same 307k tokens, so the
# largest are partly limited by data rather than parameters (the $B/D^\beta$ term of
# section 11.4). Kaplan et al. (2020) fitted their $\alpha_N = 0.076$ on models trained to
# convergence over six decades of $N$; more decades, more seeds and per-size tuning are
# what turn a trend like this one into a law.
#
# ## 11.4 Chinchilla's parametric loss
#
# Hoffmann et al. (2022, "Training Compute-Optimal Large Language Models") trained over
# 400 models, from 70M to 16B parameters on 5B to 500B tokens, and modelled the final loss
# as a function of both $N$ and $D$ (their equation 2):
#
# $$ L(N, D) = E + \frac{A}{N^\alpha} + \frac{B}{D^\beta} . $$
#
# $E$ is the entropy of text (the floor); $A/N^\alpha$ is what a model of finite size
# cannot represent, even with infinite data; $B/D^\beta$ is what finite data leaves
# unlearned. Their "approach 3" fitted the five constants to all runs (a Huber loss on the
# log of the loss, minimised with L-BFGS). Besiroglu et al. (2024, "Chinchilla Scaling:
# A replication attempt") reconstructed the data from the paper's figure, found that the
# published constants fit it poorly, and refitted. Both sets are in `llmbook.training.scaling`:

# %%
print(f"{'constants':15s}{'E':>8s}{'A':>9s}{'B':>9s}{'alpha':>8s}{'beta':>8s}")
for name, c in CHINCHILLA_CONSTANTS.items():
    print(f"{name:15s}{c.E:8.4f}{c.A:9.2f}{c.B:9.2f}{c.alpha:8.4f}{c.beta:8.4f}")
    print(f"{'':15s}{c.source}")

# %% [markdown]
# Two reference points. Chinchilla has $N = 70$B parameters and was trained on
# $D = 1.4$T tokens; Gopher (Rae et al., 2021) has 280B parameters trained on 300B tokens.
# Hoffmann et al. (2022) built Chinchilla to spend Gopher's compute, which they put at
# $5.76 \times 10^{23}$ FLOPs (one "Gopher" of compute in their Table 3). The published
# shapes do not quite spend the same: $6ND$ gives each its own budget (first two lines
# below). A comparison of the losses at those shapes would mix the allocation with the
# budget, so each fit is evaluated at the *same* $C = 5.76 \times 10^{23}$, each model size
# given the $D = C/6N$ tokens that budget buys, next to the fit's own optimum at that $C$:

# %%
C_gopher = 5.76e23  # Hoffmann et al. (2022), Table 3: one "Gopher" of compute
models = {"Chinchilla": (70e9, 1.4e12), "Gopher": (280e9, 300e9)}
for model_name, (N_, D_) in models.items():
    print(f"{model_name:11s} as published: {N_ / 1e9:4.0f}B parameters x {D_ / 1e12:.2f}T tokens, "
          f"6ND = {training_flops(N_, D_):.3g} FLOPs")
print(f"\nat C = {C_gopher:.3g} FLOPs, D = C / 6N:")
print(f"{'allocation':15s}{'constants':>15s}{'N':>7s}{'D':>8s}{'A/N^a':>8s}{'B/D^b':>8s}{'L':>8s}")
iso_losses = {}
for name in CHINCHILLA_CONSTANTS:
    c = get_constants(name)
    sizes = {**{k: N_ for k, (N_, _) in models.items()}, "optimum": compute_optimal(C_gopher, name)[0]}
    for model_name, N_ in sizes.items():
        D_ = C_gopher / (6 * N_)
        iso_losses[model_name, name] = chinchilla_loss(N_, D_, c)
        print(f"{model_name:15s}{name:>15s}{N_ / 1e9:6.0f}B{D_ / 1e12:7.2f}T{c.A / N_**c.alpha:8.4f}"
              f"{c.B / D_**c.beta:8.4f}{iso_losses[model_name, name]:8.4f}")
checks = Checks("Chinchilla against Gopher at the same compute (Hoffmann et al., 2022, section 4)")
for name in CHINCHILLA_CONSTANTS:
    checks.true(f"{name}: Chinchilla's allocation predicts the lower loss",
                iso_losses["Chinchilla", name] < iso_losses["Gopher", name],
                got=f"gap {iso_losses['Gopher', name] - iso_losses['Chinchilla', name]:.3f}")
checks

# %% [markdown]
# Hoffmann et al. report that Chinchilla outperforms Gopher on nearly every evaluation
# (their section 4), and both fits agree on the direction at equal compute. They disagree
# on how much: the original fit expects a gap of 0.046 nats/token and the replication only
# 0.019. They also apportion the loss differently: the replication's data term
# $B/D^\beta$ is larger (its $B$ is five times the original's) and its floor $E$ higher.
# And they disagree on the best size for this budget, as the last row of each block shows:
# the replication's optimum is close to Chinchilla's 70B, and to the 67B trained on 1.5T
# tokens that Hoffmann et al.'s approach 1 gives for the same $5.76 \times 10^{23}$ FLOPs
# (their Table 3); the published approach-3 constants recommend a model half that size.
#
# ## 11.5 The compute-optimal allocation, by a Lagrange multiplier
#
# Given a budget $C$, which $N$ and $D$ minimise $L(N, D)$ subject to $6ND = C$? Introduce
# a multiplier $\lambda$ for the constraint and set the gradient of the Lagrangian
# $\mathcal{L} = L(N, D) + \lambda\,(6ND - C)$ to zero. SymPy solves the first condition
# for $\lambda$, substitutes it into the second, and then solves the constraint for $N$:

# %%
N, D, C, A, B, E, al, be, lam = sp.symbols("N D C A B E alpha beta lambda", positive=True)
loss = E + A / N**al + B / D**be
lagrangian = loss + lam * (6 * N * D - C)
dN, dD = sp.diff(lagrangian, N), sp.diff(lagrangian, D)
lam_star = sp.solve(dN, lam)[0]
balance = sp.simplify(dD.subs(lam, lam_star) * D)  # both conditions together
assert sp.simplify(balance - (al * A / N**al - be * B / D**be)) == 0
display(sp.Eq(sp.Symbol(r"\lambda"), lam_star), sp.Eq(al * A / N**al, be * B / D**be))

# %% [markdown]
# The two conditions combine into a **balance**: at the optimum $\alpha A/N^\alpha =
# \beta B/D^\beta$ (both equal $6\lambda ND$). Moving a fraction $\varepsilon$ of the budget
# from data to parameters (multiplying $N$ by $1 + \varepsilon$ and $D$ by
# $1/(1 + \varepsilon)$) changes the loss by $\varepsilon(-\alpha A/N^\alpha +
# \beta B/D^\beta)$ to first order, so at the optimum nothing is gained either way. Putting
# $D = C/(6N)$ into the balance and solving for $N$:

# %%
(N_star,) = sp.solve(balance.subs(D, C / (6 * N)), N)
D_star = C / (6 * N_star)
G = (al * A / (be * B)) ** (1 / (al + be))
N_closed, D_closed = G * (C / 6) ** (be / (al + be)), (C / 6) ** (al / (al + be)) / G
assert sp.simplify(N_star - N_closed) == 0
assert sp.simplify(sp.powsimp(D_star / D_closed, force=True)) == 1
display(sp.Eq(sp.Symbol("N_{opt}"), N_star),
        sp.Eq(sp.Symbol("N_{opt}"), sp.Symbol("G") * (C / 6) ** (be / (al + be))),
        sp.Eq(sp.Symbol("D_{opt}"), sp.Symbol("G^{-1}") * (C / 6) ** (al / (al + be))),
        sp.Eq(sp.Symbol("G"), G))

# %% [markdown]
# This is equation 4 of Hoffmann et al. (2022): $N_{opt} \propto C^a$ and
# $D_{opt} \propto C^b$ with $a = \beta/(\alpha + \beta)$ and $b = \alpha/(\alpha + \beta)$,
# $a + b = 1$. Whichever term of the loss falls more slowly gets the larger share of any
# extra compute: if $\beta < \alpha$ (data helps more slowly), $D$ must grow faster.
# The package implements the closed form:

# %%
show_source(compute_optimal)

# %% [markdown]
# A check that does not use the derivation: minimise $L(N, C/6N)$ over $\log N$ numerically
# with a golden-section search (below), at budgets from $10^{18}$ to $10^{25}$ FLOPs, for
# both sets of constants. $E$ does not move the minimum, so the search minimises the
# reducible part alone, which keeps more significant digits: values of a smooth function
# are flat to round-off within about $\sqrt{\epsilon} \approx 10^{-8}$ of a minimum, so a
# search on values alone is good to roughly $10^{-7}$ in $N$, and we ask for $10^{-6}$.

# %%
show_source(golden_section_minimize)

# %%
def numeric_n_opt(C_, name):
    c = get_constants(name)

    def reducible_loss(log_n):
        return c.A * math.exp(-c.alpha * log_n) + c.B * (C_ / (6 * math.exp(log_n))) ** -c.beta

    return math.exp(golden_section_minimize(reducible_loss, math.log(1e2),
                                            math.log(C_ / 6 / 1e2), tol=1e-12))


checks = Checks("compute_optimal vs numeric minimisation (relative error in N_opt)")
for name in CHINCHILLA_CONSTANTS:
    for C_ in (1e18, 1e20, 1e22, 5.76e23, 1e25):
        checks.close(f"{name}, C = {C_:.3g}", compute_optimal(C_, name)[0], numeric_n_opt(C_, name),
                     tol=1e-6, rel=True)
checks

# %% [markdown]
# The **iso-FLOP curves** make the optimum visible: at each budget, the loss of every
# model size trained on the tokens the budget allows. Each curve is a valley; its bottom
# (the dot, from the closed form) moves right as $C$ grows. Both panels share the axes:

# %%
budgets = [1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
for ax, name in zip(axes, CHINCHILLA_CONSTANTS, strict=True):
    for i, C_ in enumerate(budgets):
        ns = np.logspace(6.5, 12.5, 300)
        ns = ns[C_ / (6 * ns) > 1e8]  # at least 100M tokens
        color = plt.cm.viridis(i / (len(budgets) - 1))
        ax.semilogx(ns, chinchilla_loss(ns, C_ / (6 * ns), name), color=color,
                    label=f"C = {C_:.0e}")
        N_opt, D_opt = compute_optimal(C_, name)
        ax.plot(N_opt, chinchilla_loss(N_opt, D_opt, name), "o", color=color)
    ax.set_ylim(1.8, 4.5)
    ax.set_xlabel("parameters N")
    ax.set_title(f"Iso-FLOP curves, {name}")
axes[0].set_ylabel("predicted loss L(N, C / 6N) (nats/token)")
axes[1].legend(fontsize="small")
save_figure(fig, "11_scaling_laws_isoflop")
plt.show()

# %% [markdown]
# The valleys are shallow near the bottom: a model twice too large or too small costs
# little (exercise 1 makes this precise). The two fits put the bottoms in about the same
# place at $10^{18}$ FLOPs, but the replication's move right faster.
#
# ## 11.6 Where the two fits disagree
#
# The exponents of $N_{opt} \propto C^a$ and $D_{opt} \propto C^b$, and the number of
# training tokens per parameter $D_{opt}/N_{opt} = G^{-2}(C/6)^{(\alpha-\beta)/(\alpha+\beta)}$,
# at budgets from $10^{18}$ to $10^{26}$ FLOPs:

# %%
for name in CHINCHILLA_CONSTANTS:
    a_, b_ = optimal_exponents(name)
    print(f"{name}: N_opt ~ C^{a_:.4f}, D_opt ~ C^{b_:.4f}")
table_budgets = [1e18, 1e20, 1e22, 5.88e23, 1e24, 1e26]
print(f"\n{'C (FLOPs)':>10s}" + "".join(f"{n + ': N_opt':>22s}{'D/N':>7s}"
                                      for n in CHINCHILLA_CONSTANTS))
for C_ in table_budgets:
    row = f"{C_:10.3g}"
    for name in CHINCHILLA_CONSTANTS:
        N_opt, _ = compute_optimal(C_, name)
        row += f"{N_opt:22.3g}{tokens_per_parameter(C_, name):7.1f}"
    print(row)

# %% [markdown]
# Hoffmann et al. report $a = 0.50, 0.49$ and $0.46$ for their three approaches (their
# Table 2); the published approach-3 constants give $a = 0.28/0.62 = 0.452$. Because
# $\alpha > \beta$ there, the tokens per parameter *grow* with the budget, from 26 at
# $10^{18}$ FLOPs to 93 at Chinchilla's budget and 153 at $10^{26}$. The replication has
# $\alpha < \beta$, $a = 0.513$, and tokens per parameter that fall slowly, from 26 to 16
# over the same range: 18 at Chinchilla's budget, close to the 20 tokens per parameter
# that Chinchilla itself used (1.4T / 70B) and that became the field's rule of thumb. At
# $5.88 \times 10^{23}$ FLOPs the original fit recommends a 32B model on 3.0T tokens, the
# replication a 73B model on 1.3T tokens, which is Chinchilla's actual shape. The
# published constants disagree with the paper's own headline model; the refit does not.

# %%
Cs = np.logspace(18, 26, 100)
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for name, style in zip(CHINCHILLA_CONSTANTS, ("-", "--"), strict=True):
    N_opt, D_opt = compute_optimal(Cs, name)
    axes[0].loglog(Cs, N_opt, style, label=f"{name}: $N_{{opt}} \\propto C^{{"
                   f"{optimal_exponents(name)[0]:.3f}}}$")
    axes[1].semilogx(Cs, D_opt / N_opt, style, label=name)
for model_name, (N_, D_) in models.items():
    axes[0].plot(training_flops(N_, D_), N_, "o", label=f"{model_name} (actual)")
    axes[1].plot(training_flops(N_, D_), D_ / N_, "o", label=f"{model_name} (actual)")
axes[0].set_ylabel("compute-optimal parameters $N_{opt}$")
axes[1].set_ylabel("tokens per parameter $D_{opt}/N_{opt}$")
for ax, title in zip(axes, ("Compute-optimal model size", "Tokens per parameter"), strict=True):
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_title(title)
    ax.legend(fontsize="small")
save_figure(fig, "11_scaling_laws_optimal")
plt.show()

# %% [markdown]
# Left: the two lines of compute-optimal size cross near $10^{18}$ FLOPs (exercise 3) and
# diverge to a factor of 2.3 at $10^{24}$; Chinchilla sits on the replication's line, Gopher
# far above both (4 times too large for its compute by the replication, 9 times by the
# original fit). Right: the original fit's tokens per
# parameter climb steadily while the replication's stay near 20. Small differences in
# fitted exponents become large differences in recommendations after extrapolating over
# six orders of magnitude; a scaling law is only as good as the fit behind it.
#
# ## 11.7 Kaplan's allocation against Chinchilla's
#
# Two years before Chinchilla, Kaplan et al. (2020, section 6) had answered the same
# question differently: along their compute-efficient frontier the model should grow as
# $N_{opt} \propto C^{0.73}$ and the data only as $D \propto C^{0.27}$, so most of any extra
# compute should buy parameters. GPT-3 (Brown et al., 2020: 175B parameters, 300B tokens)
# was trained in that spirit. Hoffmann et al. (2022) found $N_{opt} \propto C^{0.5}$: model
# and data should grow together. Extrapolated over many decades of compute, the two
# exponents recommend very different models. Why did two careful studies disagree?
#
# * Hoffmann et al. (2022, section 2 and their appendix) point to the learning-rate schedule:
#   Kaplan et al. used one number of training tokens and one schedule for all models and
#   read the loss after fewer tokens off intermediate checkpoints, whose learning rate had
#   not yet decayed. Such a checkpoint scores worse than a run of that length with its own
#   schedule; Hoffmann et al. found the best final loss when the cosine cycle matches the
#   run's length, so Kaplan's measurements mis-stated what more tokens buy. Their own runs
#   also went further, up to 16B parameters.
# * Pearce and Song (2024, "Reconciling Kaplan and Chinchilla Scaling Laws") attribute most
#   of the gap to two choices: Kaplan counted **non-embedding** parameters (and
#   non-embedding compute), and fitted at **small scale**, where the embedding is a large
#   share of the model. Simulating Chinchilla's study under those two conditions gives
#   coefficients close to Kaplan's.
# * Porian et al. (2024, "Resolving Discrepancies in Compute-Optimal Scaling of Language
#   Models") reproduce both laws and remove the gap by correcting three factors: the
#   compute of the last (output) layer, the length of the warmup, and optimiser
#   hyperparameters tuned per scale. They also find that careful learning-rate decay is
#   not essential for Chinchilla's law to hold.
#
# ### An iso-FLOP fit from runs you can make
#
# Hoffmann's "approach 2" (their section 3.2) needs no parametric form: fix a budget $C$,
# train several model sizes each on the $D = C/6N$ tokens the budget allows, fit a
# parabola to the final loss against $\log N$, and read $N_{opt}(C)$ off its vertex; then
# fit a power law to $N_{opt}(C)$ over the budgets. `isoflop_sweep` does it in miniature on
# the synthetic source: three budgets of $10^{10}$, $3 \times 10^{10}$ and $10^{11}$ FLOPs,
# one-layer models of width 12 to 64, batches of $64 \times 32$ tokens, each run's cosine
# schedule as long as the run itself (so Hoffmann's objection does not apply), $N$
# counted without the embeddings as in section 11.3. Seventeen runs take a few minutes
# on one CPU thread, and training in float32 is not bit-reproducible across CPUs (section
# 11.3), so the book ships their results in `data/scaling/isoflop_sweep.json`;
# `python -m llmbook.training.scaling` re-makes the file on your machine (the losses will
# agree to about two decimals, not to the bit).

# %%
show_source(fit_isoflop_parabola)

# %%
iso = json.loads(ISOFLOP_RESULTS.read_text())
print(f"{iso['made_by']}: {len(iso['runs'])} runs, batches of {iso['batch_size']} x "
      f"{iso['context_length']} tokens")
print(f"{'C':>8s}{'d':>4s}{'non-emb N':>11s}{'steps':>7s}{'tokens D':>10s}{'val loss':>10s}")
for r in iso["runs"]:
    print(f"{r['C']:8.0e}{r['d_model']:4d}{r['N']:11,d}{r['steps']:7d}{r['D']:10,d}{r['val_loss']:10.2f}")
iso_budgets = sorted({r["C"] for r in iso["runs"]})
iso_opt, iso_exponents = {}, {}
for count, points in (("non-embedding", 3), ("non-embedding", 4), ("total", 3)):
    n_opts = []
    for C_ in iso_budgets:
        runs = [r for r in iso["runs"] if r["C"] == C_]
        sizes = [r["N"] + (2 * 16 * r["d_model"] if count == "total" else 0) for r in runs]
        n_opt, coeffs = fit_isoflop_parabola(sizes, [r["val_loss"] for r in runs], points=points)
        n_opts.append(n_opt)
        if (count, points) == ("non-embedding", 3):
            iso_opt[C_] = (n_opt, coeffs)
    iso_exponents[count, points] = -fit_power_law(iso_budgets, n_opts).alpha
    print(f"N = {count:13s} parabola through {points} sizes: N_opt = "
          + ", ".join(f"{n:,.0f}" for n in n_opts) + f"  ->  N_opt ~ C^{iso_exponents[count, points]:.2f}")

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
for i, C_ in enumerate(iso_budgets):
    runs = [r for r in iso["runs"] if r["C"] == C_]
    color = plt.cm.viridis(i / max(1, len(iso_budgets) - 1))
    ns_ = np.array([r["N"] for r in runs], dtype=float)
    ax.semilogx(ns_, [r["val_loss"] for r in runs], "o", color=color, label=f"C = {C_:.0e}")
    dense = iso_opt[C_][0] * np.logspace(-0.35, 0.35, 50)  # the parabola near its vertex
    ax.semilogx(dense, np.polyval(iso_opt[C_][1], np.log(dense)), color=color)
    ax.axvline(iso_opt[C_][0], color=color, ls=":", lw=1)
ax.axhline(iso["entropy_rate"], color="black", lw=1, label="entropy rate H")
ax.set_xlabel("non-embedding parameters N")
ax.set_ylabel("validation loss (nats/token)")
ax.set_title("Iso-FLOP profiles of tiny models on the synthetic source")
ax.xaxis.set_minor_formatter(plt.NullFormatter())
ax.legend(fontsize="small")
save_figure(fig, "11_scaling_laws_isoflop_runs")
plt.show()

# %% [markdown]
# Each profile has a bottom: at $10^{10}$ and $3 \times 10^{10}$ FLOPs the best run is
# the width-16 model (4,144 non-embedding parameters), and the parabolas put the optimum at
# about 3,200 and 4,100; a smaller model runs out of capacity, a larger one out of tokens. At $10^{11}$ FLOPs the bottom is flat from 4,000 to 13,000
# parameters, because all those models come within 0.06 nats of the entropy floor: the
# source has little reducible loss left, and the data are a few hundred thousand tokens
# seen up to ten times, so this regime is not Chinchilla's. The vertices grow with $C$, and
# a power law through three of them gives an exponent near 0.5, but with parabolas
# through four sizes instead of three it drops to 0.36: three budgets, one seed and
# losses that differ in the second decimal do not pin an exponent down (exercise 2 shows
# how many budgets and how little noise that takes). Counting the embeddings as well
# lowers the exponent slightly, the direction Pearce and Song (2024) describe, though
# here the embeddings are small ($V = 16$) and the effect is small too. The method, not
# the number, is the lesson: it is how Hoffmann et al. measured $a \approx 0.5$ at
# nine budgets from $6 \times 10^{18}$ to $3 \times 10^{21}$ FLOPs (their section 3.2).
#
# ### A published claim, checked against $C = 6ND$
#
# The worked example of chapters 4 to 7 (`data/worked_examples/the_cat_sat.json`) ends
# with a remark on compute-optimal allocation: "$N^* \sim D^* \sim \sqrt{C/6}$ and about 20
# tokens per parameter". Under $C = 6ND$ the two statements cannot both hold: equal $N$
# and $D$ is one token per parameter. SymPy solves $6ND = C$ with $D = kN$:

# %%
k_tok = sp.symbols("k", positive=True)
(N_k,) = sp.solve(sp.Eq(6 * N * (k_tok * N), C), N)
display(sp.Eq(sp.Symbol("N^*"), N_k), sp.Eq(sp.Symbol("N^*_{k=1}"), N_k.subs(k_tok, 1)),
        sp.Eq(sp.Symbol("N^*_{k=20}"), N_k.subs(k_tok, 20)))
published = load_the_cat_sat().also
checks = Checks("the worked example's allocation claim, against C = 6ND")
checks.close("N* = sqrt(C/6) is the k = 1 solution (D/N = 1)", 0, sp.simplify(N_k.subs(k_tok, 1) - sp.sqrt(C / 6)),
             tol=0)
checks.close("20 tokens/parameter: N* = sqrt(C/120) instead", 0,
             sp.simplify(N_k.subs(k_tok, 20) - sp.sqrt(C / 120)), tol=0)
n_, d_ = published["chinchilla"]["params"], published["chinchilla"]["tokens"]
checks.close("Chinchilla (70B, 1.4T): tokens per parameter vs the claim's 20", 20, d_ / n_, tol=1e-12, rel=True)
display(checks)
for key in ("chinchilla", "gpt3"):  # measurements: what each rule says at each model's own C
    n_, d_ = published[key]["params"], published[key]["tokens"]
    c_ = training_flops(n_, d_)
    print(f"{key:10s}: N = {n_ / 1e9:.0f}B, D = {d_ / 1e9:,.0f}B, D/N = {d_ / n_:.2f}, C = 6ND = {c_:.3g}; "
          f"sqrt(C/120) = {math.sqrt(c_ / 120) / 1e9:.0f}B on {20 * math.sqrt(c_ / 120) / 1e12:.2f}T tokens, "
          f"sqrt(C/6) = {math.sqrt(c_ / 6) / 1e9:.0f}B")

# %% [markdown]
# Chinchilla itself is the 20-tokens rule: at its budget $C = 5.88 \times 10^{23}$,
# $\sqrt{C/120}$ gives its 70B parameters, while $\sqrt{C/6}$ would give a 313B model on
# 313B tokens, a Gopher-like shape that Chinchilla was built to beat. GPT-3 used 1.7
# tokens per parameter; by the 20-tokens rule its compute would have been better spent
# on a 51B model and 1.0T tokens. The claim's "$N^* \sim D^* \sim \sqrt{C/6}$" is right only
# as a statement of *exponents*, $N^* \propto C^{0.5}$ and $D^* \propto C^{0.5}$; read as
# values, it contradicts the "20 tokens per parameter" next to it by a factor
# $\sqrt{20} \approx 4.5$ in $N$ and in $D$.

# %% [markdown]
# ## 11.8 Emergence as a property of the metric
#
# Scaling laws describe the *loss*, which falls smoothly. Benchmarks score *answers*, and
# some of them jump: Wei et al. (2022, "Emergent Abilities of Large Language Models") list
# abilities that are near chance for smaller models and well above it for larger ones, and
# call them **emergent**. Schaeffer, Miranda and Koyejo (2023, "Are Emergent Abilities of
# Large Language Models a Mirage?") point out that many of those scores are **exact match**
# on answers of several tokens: an answer of $L$ tokens counts only if all $L$ are right.
# If each token is right with probability $p$, independently, exact match is $p^L$. With the
# per-token cross-entropy $\ell = -\log p$ falling as a power law $\ell = c N^{-\alpha}$, as
# in section 11.3, SymPy follows the consequences:

# %%
p_tok, L_ans, c_l, al_l, N_s = sp.symbols("p L c alpha N", positive=True)
em = p_tok**L_ans
em_of_n = em.subs(p_tok, sp.exp(-c_l * N_s**-al_l))  # p = exp(-ell), ell = c N^-alpha
assert sp.simplify(sp.expand_log(sp.log(em_of_n), force=True) + L_ans * c_l * N_s**-al_l) == 0
slope_in_p = sp.diff(em, p_tok)
assert sp.simplify(slope_in_p - L_ans * p_tok ** (L_ans - 1)) == 0
(p_half,) = sp.solve(sp.Eq(em, sp.Rational(1, 2)), p_tok)
(n_half,) = sp.solve(sp.Eq(em_of_n, sp.Rational(1, 2)), N_s)
assert sp.simplify(p_half - 2 ** (-1 / L_ans)) == 0
assert sp.simplify(n_half - (L_ans * c_l / sp.log(2)) ** (1 / al_l)) == 0
hamming = L_ans * (1 - p_tok)  # expected number of wrong tokens: linear in p
display(sp.Eq(sp.Symbol("EM(N)"), em_of_n), sp.Eq(sp.Symbol(r"\partial EM/\partial p"), slope_in_p),
        sp.Eq(sp.Symbol("p_{1/2}"), p_half), sp.Eq(sp.Symbol("N_{1/2}"), n_half),
        sp.Eq(sp.Symbol(r"\mathbb{E}[\mathrm{wrong\ tokens}]"), hamming))

# %% [markdown]
# Three things follow. $-\log EM = L\,c\,N^{-\alpha}$ is exactly as smooth as the loss, only
# $L$ times larger: nothing happens suddenly to the model. But exact match responds to $p$
# with slope $L p^{L-1}$, tiny while $p$ is well below 1 and steep near 1, so on a grid of
# model sizes it sits near zero and then shoots up; it passes $\tfrac12$ only once
# $p > 2^{-1/L}$. And the size at which it does, $N_{1/2} \propto L^{1/\alpha}$, moves with
# the answer length: the "threshold" belongs to the metric and the task, not to the model.
# A metric linear in the tokens, such as the expected number of wrong tokens $L(1 - p)$, or
# the mean log-probability $-\ell$, shows no threshold at all. The package's
# `exact_match_from_per_token` is $p^L$; checked against answers simulated token by token,
# with a tolerance of four binomial standard deviations of the simulated fraction, and at
# SymPy's $p_{1/2}$:

# %%
rng_em, n_answers = np.random.default_rng(0), 100_000
checks = Checks("exact match from per-token accuracy, against simulated answers of independent tokens")
for p_, L_ in ((0.5, 6), (0.9, 6), (0.99, 6), (0.9, 1), (0.9, 20)):
    simulated = float(np.mean(np.all(rng_em.random((n_answers, L_)) < p_, axis=1)))
    q_ = exact_match_from_per_token(p_, L_)  # tolerance: 4 binomial standard deviations
    checks.close(f"p = {p_}, L = {L_}", q_, simulated, tol=4 * math.sqrt(q_ * (1 - q_) / n_answers))
checks.close("p_1/2 for L = 6: 2^(-1/6)", 0.5, exact_match_from_per_token(2 ** (-1 / 6), 6), tol=1e-15)
checks

# %% [markdown]
# ### Emergence in the book's own sweep
#
# To see it happen, `data/make_emergence.py` trains six of the book's Llama-style models
# (two layers, widths 8 to 32) on a task with several-token answers: a table of facts,
# where each of the 1,000 three-digit keys has a random six-digit answer to recall
# (`fact_table`). The answers are random, so a model gets a token right only as far as it
# has stored it, and how much it can store grows with its size, the way knowledge of facts
# grows with the size of a language model. All models get the same 300 full-batch steps.
# Each is scored on the table with the metrics of `llmbook.training.emergence`: under
# teacher forcing (each answer token predicted from the key and the *true* tokens before
# it), the per-token accuracy of the argmax and the mean log-probability of the right
# token; exact match; and, from greedy decoding, the token edit distance (Levenshtein, in
# tokens) to the right answer. Greedy decoding reproduces an answer exactly when every
# teacher-forced argmax is right, so the two ways of scoring exact match agree; the test
# suite checks this, and so does the table below. Training on one CPU thread takes a few
# minutes and is not bit-reproducible across CPUs, so the results are shipped in
# `data/emergence/fact_recall_sweep.json`.

# %%
show_source(score_answers)

# %%
emerge = json.loads(EMERGENCE_RESULTS.read_text())
L_facts = emerge["answer_length"]
print(f"{emerge['task']}; {emerge['steps']} steps; made by {emerge['made_by']}")
print(f"{'d':>3s}{'non-emb N':>11s}{'per-token acc':>15s}{'mean log p':>12s}{'exact match':>13s}"
      f"{'p^L':>7s}{'prod_i p_i':>12s}{'edit dist':>11s}")
for r in emerge["runs"]:
    print(f"{r['d_model']:3d}{r['N']:11,d}{r['per_token_accuracy']:15.2f}{r['mean_log_prob']:12.2f}"
          f"{r['exact_match']:13.2f}{exact_match_from_per_token(r['per_token_accuracy'], L_facts):7.2f}"
          f"{math.prod(r['per_position_accuracy']):12.2f}{r['token_edit_distance']:11.2f}")

# %%
N_em = np.array([r["N"] for r in emerge["runs"]], dtype=float)
acc_em = np.array([r["per_token_accuracy"] for r in emerge["runs"]])
em_em = np.array([r["exact_match"] for r in emerge["runs"]])
checks = Checks("the emergence sweep")
checks.true("exact match: teacher-forced = greedy, every model",
            all(r["exact_match"] == r["exact_match_greedy"] for r in emerge["runs"]))
checks.true("per-token accuracy rises with N, every step", bool(np.all(np.diff(acc_em) > 0)))
checks.true("mean log-probability rises with N, every step",
            bool(np.all(np.diff([r["mean_log_prob"] for r in emerge["runs"]]) > 0)))
checks.true("exact match <= the lowest per-position accuracy (all right implies each right), every model",
            all(r["exact_match"] <= min(r["per_position_accuracy"]) for r in emerge["runs"]))
# Independent tokens would make exact match prod_i p_i, with binomial noise over the table's
# n facts. Where that predicts at least 5 right and 5 wrong answers, test whether the measured
# exact match lies more than 3 binomial standard deviations above it (a threshold fixed
# before looking; one-sided, the direction the clustering of errors predicts).
n_facts = emerge["n_facts"]
independent = np.array([math.prod(r["per_position_accuracy"]) for r in emerge["runs"]])
testable = (n_facts * independent >= 5) & (n_facts * (1 - independent) >= 5)
z_scores = (em_em - independent) / np.sqrt(independent * (1 - independent) / n_facts)
checks.true(f"exact match > prod_i p_i + 3 sigma where testable ({int(testable.sum())} models)",
            bool(np.all(z_scores[testable] > 3)), got=[round(float(z), 1) for z in z_scores[testable]])
checks

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
n_dense = np.logspace(np.log10(N_em[0]), np.log10(N_em[-1]), 100)
acc_dense = np.interp(np.log(n_dense), np.log(N_em), acc_em)  # between models: linear in log N
axes[0].semilogx(N_em, acc_em, "o-", label="per-token accuracy")
axes[0].semilogx(N_em, em_em, "s-", label="exact match")
axes[0].semilogx(n_dense, exact_match_from_per_token(acc_dense, L_facts), ":", color="gray",
                 label=f"(per-token accuracy)$^{{{L_facts}}}$")
axes[0].set_ylabel("fraction right")
axes[0].set_title("Accuracy and exact match")
axes[0].legend(fontsize="small")
axes[1].semilogx(N_em, [r["mean_log_prob"] for r in emerge["runs"]], "o-")
axes[1].set_ylabel("mean log p of answer tokens (nats)")
axes[1].set_title("Mean log-probability")
axes[2].semilogx(N_em, [r["token_edit_distance"] for r in emerge["runs"]], "o-", color="C2")
axes[2].set_ylabel("edit distance of greedy answers (tokens)")
axes[2].set_title("Token edit distance")
for ax in axes:
    ax.set_xlabel("non-embedding parameters N")
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
fig.tight_layout()
save_figure(fig, "11_scaling_laws_emergence")
plt.show()

# %% [markdown]
# Left: per-token accuracy climbs steadily across the sweep, while exact match stays at
# zero for the smaller models and then rises steeply. The dotted curve is $p^6$ of the
# per-token accuracy (interpolated between models). The measured exact match lies above
# it, and above the product of the six per-position accuracies that independent tokens
# would give, by more than three binomial standard deviations wherever the table has
# enough right and wrong answers to tell (the last check above), because a model's mistakes are not independent across the six tokens: some facts are
# stored whole and others hardly at all, so errors cluster in the same answers. The shape is
# the same, though: flat, then steep, with nothing sudden in the per-token numbers it is
# made of. Middle: the mean log-probability of the right tokens improves at every size,
# the continuous score of the same predictions. Right: the edit distance of greedy answers
# falls at every size too, but it is not a per-token metric in disguise: a greedy answer
# that goes wrong once continues from a wrong prefix, so its later tokens go wrong with it,
# and the distance is larger than the $L(1-p)$ wrong tokens of teacher forcing. A metric
# inherits the model's smoothness only as far as it scores tokens independently. (The
# per-token accuracy itself is not a perfectly smooth curve here either: six models, one
# seed, one table.) Schaeffer et al. (2023)
# make the same argument with GPT-3's and InstructGPT's arithmetic, and show that the
# choice of metric can also *create* emergence in vision models, where none had been
# reported.
#
# ## 11.9 Claims about scale, graded
#
# Three claims from the published texts the book was planned from meet this chapter
# (`source_claims.md`). For C8 and C9, the parameters and training tokens of the named
# models, each from its paper, are in `llmbook.training.emergence.PUBLISHED_RUNS`;
# `None` marks a number the paper does not publish. The compute-optimal ratio to compare
# with is the replication's (section 11.6) at each model's own budget $C = 6ND$, and
# Chinchilla's own 20:

# %%
print(f"{'model':12s}{'params':>9s}{'tokens':>9s}{'D/N':>8s}{'D/N opt (Besiroglu)':>21s}  source")
for run in PUBLISHED_RUNS:
    dn = run.tokens_per_parameter
    opt = "" if dn is None else f"{tokens_per_parameter(training_flops(run.params, run.tokens), 'besiroglu2024'):.0f}"
    print(f"{run.model:12s}{'?' if run.params is None else f'{run.params / 1e9:.1f}B':>9s}"
          f"{'?' if run.tokens is None else f'{run.tokens / 1e12:.2f}T':>9s}"
          f"{'unknown' if dn is None else f'{dn:.1f}':>8s}{opt:>21s}  {run.source}")

# %%
runs = {run.model: run for run in PUBLISHED_RUNS}
chin, gpt3, gopher = runs["Chinchilla"], runs["GPT-3 175B"], runs["Gopher"]
llama_ratios = {name: run.tokens_per_parameter for name, run in runs.items() if "LLaMA" in name or "Llama" in name}
c_chin = training_flops(chin.params, chin.tokens)
claims = ClaimGrades("Claims C8, C9 and C14")
claims.grade("C8", "Chinchilla (70B parameters, 1.4T tokens) matched GPT-3 with 4x fewer parameters at inference",
             f"size and data as published ({chin.tokens_per_parameter:.0f} tokens per parameter; "
             f"sqrt(C/120) at its C = {c_chin:.2e} FLOPs gives {math.sqrt(c_chin / 120) / 1e9:.0f}B). But GPT-3 has "
             f"{gpt3.params / chin.params:.1f}x Chinchilla's parameters (and its 2N FLOPs per token); the 4x is "
             f"Gopher's {gopher.params / chin.params:.1f}x, the model Chinchilla was built to match in compute, and "
             f"Hoffmann et al. report that Chinchilla outperforms both, not that it matches them", "wrong")
claims.grade("C9", "Meta's LLaMA models followed Chinchilla-style recipes (about 20 tokens per parameter)",
             "tokens per parameter: " + ", ".join(f"{k} {v:.0f}" for k, v in llama_ratios.items())
             + f" against {chin.tokens_per_parameter:.0f}: only LLaMA 65B is near it. Touvron et al. (2023a) "
             "train small models far past the compute-optimal point on purpose, for cheaper inference", "wrong")
claims.grade("C9", "PaLM 2 and Mistral 7B followed Chinchilla-style recipes (about 20 tokens per parameter)",
             f"PaLM 2: {runs['PaLM 2'].source}. Mistral 7B: {runs['Mistral 7B'].source}. Neither ratio can be "
             "computed from the papers", "unsupported")
wei = {ability: (model, params) for ability, model, params, _ in EMERGENT_SCALES}
few_shot = [params for ability, (_, params) in wei.items() if ability.startswith("few-shot")]
claims.grade("C14", "few-shot learning emerges at ~6B parameters",
             f"Wei et al. (2022), Table 1: few-shot abilities emerge task by task between "
             f"{min(few_shot) / 1e9:.1f}B and {max(few_shot) / 1e9:.0f}B parameters; the only 6B entry is an "
             f"augmented prompting method (ask-me-anything prompting, {wei['ask-me-anything prompting'][0]})",
             "wrong")
cot = [wei[a] for a in wei if a.startswith("chain-of-thought")]
claims.grade("C14", "chain-of-thought emerges at ~60B",
             "Wei et al. (2022), Table 1: " + ", ".join(f"{m} {n / 1e9:.0f}B" for m, n in cot)
             + ", for two model families, scored by the accuracy of the final answer", "true only under a condition")
claims.grade("C14", "instruction following emerges at ~1B + SFT",
             f"Wei et al. (2022), Table 1: instruction tuning helps from "
             f"{wei['instruction following (finetuning)'][1] / 1e9:.0f}B "
             f"({wei['instruction following (finetuning)'][0]}). A ~1B figure matches InstructGPT (Ouyang et al., "
             "2022), whose 1.3B model with SFT and RLHF was preferred to GPT-3: a comparison of two models, "
             "not a threshold", "wrong")
claims.grade("C14", "code generation emerges at ~10B",
             "not in Wei et al.'s table. Codex (Chen et al., 2021), HumanEval pass@1: "
             + ", ".join(f"{n / 1e6:,.0f}M {r:.1%}" for n, r in CODEX_PASS_AT_1) + ": steady gains, no threshold",
             "unsupported")
claims.grade("C14", "abilities appear suddenly: phase transitions as capacity crosses task thresholds",
             f"in section 11.8 per-token accuracy rises at every size ({acc_em[0]:.2f} to {acc_em[-1]:.2f}) "
             f"while exact match on {L_facts}-token answers stays near {em_em[0]:.2f}, then jumps to "
             f"{em_em[-1]:.2f}, at or above p^L. "
             "Sudden under all-or-nothing metrics; smooth under per-token ones (Schaeffer et al., 2023)",
             "true only under a condition")
claims

# %% [markdown]
# C8 mixes up the two comparisons of Hoffmann et al. (2022): Chinchilla was given the
# compute of Gopher, four times its size, and outperformed it, as well as GPT-3, which is
# 2.5 times its size. C9 is the reverse of what the LLaMA paper says: Touvron et al.
# (2023a, "LLaMA: Open and Efficient Foundation Language Models", section 1) note that
# Hoffmann et al.'s rule would train a 10B model on 200B tokens, and train their 7B model
# on 1T tokens instead, because a smaller model trained longer is cheaper to *serve*
# (exercise 4 puts a price on it). What the field took from Chinchilla was "more tokens",
# not "20 tokens per parameter". The PaLM 2 report (Anil et al., 2023) gives neither its
# models' sizes nor their token counts, so for it the ratio is not known. For C14, the thresholds quoted are mostly not those of the
# paper that coined the term, and the sudden jumps themselves are, at least in part, a
# property of all-or-nothing metrics, as section 11.8 showed on the book's own models.

# %% [markdown]
# ## 11.10 Past the compute-optimal point: repeated data and inference
#
# Chinchilla's allocation answers one question: the least *training* compute that reaches
# a loss, with every token fresh. Practice breaks both assumptions. Good text is finite, so
# large runs repeat it; and a model that is served spends $2N$ FLOPs on every token it
# generates, for as long as it is used, which favours the smaller model trained longer
# that C9's LLaMA example chose.
#
# **Repeated data.** Muennighoff et al. (2023, "Scaling Data-Constrained Language Models")
# trained models on $U$ unique tokens repeated for several epochs and modelled what the
# repeats are worth: the $k$-th repetition of the data counts as $e^{-k/R^*}$ of fresh data,
# so $D$ tokens drawn from $U$ unique ones ($R = D/U - 1$ repetitions past the first epoch)
# are worth the **effective data** $D' = U + U\int_0^R e^{-k/R^*}\,dk$, with $R^* \approx 15.4$
# fitted to their runs (their equation 5). SymPy integrates it and takes the two ends:

# %%
U_, R_, R_st, k_rep = sp.symbols("U R R^* k", positive=True)
D_eff = U_ + U_ * sp.integrate(sp.exp(-k_rep / R_st), (k_rep, 0, R_))
assert sp.simplify(D_eff - (U_ + U_ * R_st * (1 - sp.exp(-R_ / R_st)))) == 0
display(sp.Eq(sp.Symbol("D'"), sp.factor(D_eff)),
        sp.Eq(sp.Symbol(r"\lim_{R \to \infty} D'"), sp.limit(D_eff, R_, sp.oo)),
        sp.Eq(sp.Symbol("D'"), sp.series(D_eff, R_, 0, 3).removeO()))

# %% [markdown]
# For a few epochs $D' \approx U(1 + R) - UR^2/2R^*$: the repeats are nearly as good as new
# tokens. However long one trains, $D'$ never exceeds $U(1 + R^*) = 16.4\,U$: past a few
# dozen epochs another pass adds almost nothing. `effective_data` implements the closed form;
# it is checked against SymPy's numerical quadrature of the integral (mpmath), not against
# the formula it was written from:

# %%
show_source(effective_data)

# %%
checks = Checks("effective_data against numerical integration of the decaying repeats")
for epochs in (1.5, 4, 16, 40, 400):
    quadrature = 1 + float(sp.Integral(sp.exp(-k_rep / 15.4), (k_rep, 0, epochs - 1)).evalf(30))
    checks.close(f"{epochs} epochs: D' / U", quadrature, effective_data(1e9, epochs * 1e9) / 1e9,
                 tol=1e-12, rel=True)
checks.close("limit: D' / U at 10^5 epochs vs 1 + R*", 1 + MUENNIGHOFF_R_STAR,
             effective_data(1.0, 1e5), tol=1e-12, rel=True)
display(checks)
print(f"{'epochs D/U':>11s}{'D_eff / U':>10s}{'D_eff / D':>10s}{'loss penalty (nats)':>21s}")
n_rep, d_rep = 70e9, 1.4e12  # Chinchilla's shape, its 1.4T tokens drawn from U = D / epochs
for epochs in (1, 2, 4, 8, 16, 40):
    d_eff = effective_data(d_rep / epochs, d_rep)
    penalty = chinchilla_loss(n_rep, d_eff, "besiroglu2024") - chinchilla_loss(n_rep, d_rep, "besiroglu2024")
    print(f"{epochs:11d}{d_eff / (d_rep / epochs):10.2f}{d_eff / d_rep:10.3f}{penalty:21.4f}")

# %% [markdown]
# The table prices repetition for a Chinchilla-shaped run (70B parameters, 1.4T tokens in
# all), with the replication's constants and $D'$ in place of $D$: four epochs of a quarter
# of the data are worth 93% of fresh tokens and cost 0.002 nats, which is the sense of
# Muennighoff et al.'s finding that a few epochs are almost as good as new data; at 40
# epochs the same compute buys only 38% of the effective data that fresh tokens would. (They fit their own
# constants, and a matching decay for excess parameters; this uses only their $R^*$.)
#
# **Inference.** Sardana et al. (2024, "Beyond Chinchilla-Optimal: Accounting for
# Inference in Language Model Scaling Laws") ask for the model that reaches a loss $\ell$
# at the least *lifetime* compute: training, $6ND$, plus serving $D_{inf}$ tokens, $2ND_{inf}$.
# Minimise $6ND + 2ND_{inf}$ on the level set $L(N, D) = \ell$ with a multiplier $\mu$:

# %%
D_inf, ell, mu = sp.symbols("D_inf ell mu", positive=True)
lagrangian_inf = 6 * N * D + 2 * N * D_inf + mu * (loss - ell)
(mu_star,) = sp.solve(sp.diff(lagrangian_inf, D), mu)
(d_inf_star,) = sp.solve(sp.diff(lagrangian_inf, N).subs(mu, mu_star), D_inf)
ratio = (al * A / N**al) / (be * B / D**be)
assert sp.simplify(d_inf_star - 3 * D * (ratio - 1)) == 0
display(sp.Eq(sp.Symbol("D_{inf}"), 3 * D * (sp.Symbol(r"\frac{\alpha A / N^\alpha}{\beta B / D^\beta}") - 1)))

# %% [markdown]
# With no inference ($D_{inf} = 0$) this is Chinchilla's balance $\alpha A/N^\alpha =
# \beta B/D^\beta$ again. The more tokens a model will serve, the further the optimum moves
# to a smaller $N$ whose parameter term outweighs its data term, trained on more tokens.
# Read backwards, the condition says for how many served tokens a given $(N, D)$ is the
# optimal way to reach its own loss (`inference_breakeven_tokens`). `inference_optimal`
# finds the optimum by golden-section search along the level set, without the condition;
# the checks compare the two, and the search at $D_{inf} = 0$ with section 11.5's closed form.

# %%
show_source(inference_optimal)

# %%
smol_n, smol_d = 135e6, 2e12  # SmolLM2-135M: 135M parameters, 2T tokens (Allal et al., 2025)
checks = Checks("inference_optimal (search) against the closed forms")
for name in CHINCHILLA_CONSTANTS:
    n_opt_, d_opt_ = compute_optimal(1e21, name)
    checks.close(f"{name}: D_inf = 0 gives N_opt of section 11.5 (C = 1e21)", n_opt_,
                 inference_optimal(chinchilla_loss(n_opt_, d_opt_, name), 0.0, name)[0], tol=1e-6, rel=True)
    target = chinchilla_loss(smol_n, smol_d, name)
    checks.close(f"{name}: the search at SmolLM2's breakeven D_inf returns 135M", smol_n,
                 inference_optimal(target, inference_breakeven_tokens(smol_n, smol_d, name), name)[0],
                 tol=1e-6, rel=True)
display(checks)
print(f"SmolLM2-135M: D/N = {smol_d / smol_n:,.0f} tokens per parameter, C = 6ND = {6 * smol_n * smol_d:.3g}")
for name in CHINCHILLA_CONSTANTS:
    target = chinchilla_loss(smol_n, smol_d, name)
    n0, d0 = inference_optimal(target, 0.0, name)
    be_ = inference_breakeven_tokens(smol_n, smol_d, name)
    print(f"{name}: L = {target:.3f}; compute-optimal at that loss: {n0 / 1e6:.0f}M on {d0 / 1e9:.1f}B tokens "
          f"(D/N = {d0 / n0:.0f}, C = {6 * n0 * d0:.2g}); SmolLM2's shape is optimal if it serves "
          f"{be_ / 1e12:.0f}T tokens, lifetime compute {6 * smol_n * smol_d + 2 * smol_n * be_:.2g} "
          f"against {6 * n0 * d0 + 2 * n0 * be_:.2g} for the compute-optimal model")

# %%
served = np.logspace(9, 15, 61)
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
epochs_axis = np.logspace(0, np.log10(400), 100)
axes[0].loglog(epochs_axis, epochs_axis, "--", color="gray", label="fresh tokens: D / U")
axes[0].loglog(epochs_axis, effective_data(1.0, epochs_axis), label="repeated: D' / U")
axes[0].axhline(1 + MUENNIGHOFF_R_STAR, color="black", lw=1, ls=":", label="limit 1 + R*")
axes[0].set_xlabel("epochs D / U")
axes[0].set_ylabel("data, in units of the unique tokens U")
axes[0].set_title("Effective data of repeated tokens (R* = 15.4)")
axes[0].legend(fontsize="small")
for name, style in zip(CHINCHILLA_CONSTANTS, ("-", "--"), strict=True):
    target = chinchilla_loss(smol_n, smol_d, name)
    opt = np.array([inference_optimal(target, float(s_), name) for s_ in served])
    axes[1].loglog(served, opt[:, 1] / opt[:, 0], style, label=f"{name}: optimal D/N at SmolLM2's loss")
    axes[1].plot(inference_breakeven_tokens(smol_n, smol_d, name), smol_d / smol_n, "o", color="C3")
axes[1].axhline(20, color="gray", lw=1, ls=":", label="Chinchilla's 20 tokens per parameter")
axes[1].set_xlabel("tokens served over the model's life $D_{inf}$")
axes[1].set_ylabel("training tokens per parameter D/N")
axes[1].set_title("Inference-aware optimum (dot: SmolLM2-135M)")
axes[1].legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "11_scaling_laws_beyond_optimal")
plt.show()

# %% [markdown]
# Left: repeated tokens follow fresh ones for a few epochs and then level off at
# $16.4\,U$. Right: as the tokens to be served grow past the training tokens, the optimal
# model shrinks and trains on ever more tokens per parameter. SmolLM2-135M (Allal et al.,
# 2025) was trained on 2T tokens, 14,815 per parameter where Chinchilla's rule says 20: by
# either fit, the compute-optimal model for the same loss is five to six times larger and
# trained on 60 to 120 times fewer tokens, and SmolLM2's shape is the optimal one once it
# serves tens of trillions of tokens (29T or 56T), where its lifetime compute is a fifth of
# the larger model's. That is the case for small models that run on phones
# and laptops, served many times over; it is why they are trained far past the
# compute-optimal point. Two caveats: the constants were fitted on other data, to runs
# with far fewer tokens per parameter, so the numbers are an extrapolation that shows the
# direction and the scale of the trade-off, not SmolLM2's actual loss; and the count
# $2N$ per served token ignores the attention term and the batching of real serving.
#
# %% [markdown]
# ## Summary
#
# * A power law $y = a x^{-\alpha}$ is a straight line on log–log axes; its least-squares
#   fit is a linear regression on the logarithms (derived in SymPy), and a floor $E$ must
#   be subtracted or fitted first.
# * Training costs $C \approx 6ND$ FLOPs: $2N$ per token forward, twice that backward,
#   plus an attention term that is small when $d \gg T/6$ (derived from chapter 7's count,
#   and equal to what `FlopCounterMode` counts on real shapes, run on the `meta` device).
# * On the synthetic source, whose entropy floor is known exactly, a power law in the
#   non-embedding parameter count fitted to small models (three seeds each) predicts the
#   reducible loss of larger ones within its prediction interval; the exponent itself
#   depends on the range of sizes fitted, and comes with an interval.
# * Minimising Chinchilla's $L(N, D) = E + A/N^\alpha + B/D^\beta$ under $6ND = C$ with a
#   Lagrange multiplier gives $N_{opt} \propto C^{\beta/(\alpha+\beta)}$ and
#   $D_{opt} \propto C^{\alpha/(\alpha+\beta)}$; the published constants and the 2024
#   refit disagree on tokens per parameter, and only the refit matches Chinchilla's own
#   20 tokens per parameter.
# * Kaplan et al. (2020) recommended $N_{opt} \propto C^{0.73}$, Hoffmann et al. (2022)
#   $C^{0.5}$; the gap comes from how the studies counted parameters and compute, the
#   scale they fitted at, and how they scheduled and tuned their runs. An iso-FLOP fit
#   (approach 2) on tiny runs recovers the method, and "$N^* \sim D^* \sim \sqrt{C/6}$"
#   contradicts "20 tokens per parameter" under $C = 6ND$.
# * Exact match on $L$-token answers is $p^L$ of the per-token accuracy: near zero, then
#   steep, though $-\log EM = L\ell$ is as smooth as the loss. On the book's sweep the
#   per-token accuracy and log-probability improve at every size while exact match
#   "emerges"; the threshold is the metric's. Of the published claims, C8 confuses GPT-3
#   with Gopher, C9 is contradicted by LLaMA's own tokens per parameter, and C14's
#   thresholds mostly differ from Wei et al.'s table.
# * Repeated data is worth $D' = U + UR^*(1 - e^{-R/R^*})$: nearly fresh for a few epochs,
#   never more than $(1 + R^*)U$. Counting the $2N$ FLOPs of every token served moves the
#   optimum to smaller models trained on far more tokens per parameter, the regime of
#   SmolLM2-135M.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/11_scaling_laws.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 11` writes a stub
# of every function, `llmbook grade 11` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_11.py` runs
# the same checks on the reference.
#
# 1. (★) **The price of the wrong size.** Train a model $k$ times larger than $N_{opt}$ on
#    $k$ times fewer tokens (same $C$). Show with SymPy that the *fraction* by which the
#    reducible loss $L - E$ exceeds its optimum depends only on $k$, $\alpha$ and $\beta$,
#    not on $C$, $A$ or $B$. Evaluate it for $k = 2$ and $k = 10$ for both fits.
# 2. (★★) **Hoffmann's approach 2.** For budgets $10^{19}, \dots, 10^{23}$, evaluate the
#    Besiroglu loss at 9 model sizes around the optimum (0.3 decades apart), multiply by
#    $\exp(0.002\,\varepsilon)$ noise, fit a parabola in $\log N$ to each iso-FLOP profile,
#    take its vertex as $N_{opt}$, and fit $N_{opt} \propto C^a$ with `fit_power_law`. How
#    close is $a$ to $\beta/(\alpha + \beta)$?
# 3. (★) **Where the fits agree.** Find in closed form the budget at which the two fits
#    recommend the same $N_{opt}$, and the tokens per parameter there.
# 4. (★★) **Over-training.** Llama 2 7B was trained on 2T tokens (Touvron et al., 2023,
#    "Llama 2: Open Foundation and Fine-Tuned Chat Models"). For each fit, predict its loss,
#    find the compute-optimal budget $C^*$ that reaches the same loss (a one-dimensional
#    root), and the ratio of the compute actually spent to $C^*$. Why would anyone pay it?
# 5. (★) **Where exact match crosses one half.** With per-token loss $\ell = c N^{-\alpha}$,
#    find the per-token accuracy and the size $N$ at which exact match on $L$-token answers
#    reaches a level $q$. How does that size grow with $L$? Show that the rise from $q = 0.1$
#    to $q = 0.9$ spans the same factor in $N$ for every $L$: longer answers move the jump,
#    they do not sharpen it on a log axis.
# 6. (★★) **Repeats and served tokens.** (a) Under Muennighoff et al.'s decay, in which
#    epoch is one more pass over the data worth half a pass of fresh tokens? After how many
#    epochs has $D'/D$ fallen to 0.9? (b) With the replication's constants, a model must reach
#    the loss of the compute-optimal 7B model and then serve $D_{inf}$ tokens. For
#    $D_{inf} = 0$, $10^{12}$, $10^{13}$ and $10^{14}$, find the inference-optimal $N$ and $D$,
#    and the fraction of lifetime compute saved against serving the 7B model.

# %%
from llmbook.workbench import grade

grade("11", globals())
