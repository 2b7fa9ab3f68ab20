# %% [markdown]
# # 10d Data mixtures
#
# A pretraining corpus is not one text but a **mixture** of sources of very different
# sizes: crawled web pages, books, an encyclopedia, code, papers. A run draws its
# training tokens from source $i$ with probability $p_i$, and the choice of the $p_i$ is
# one of the most consequential and least principled decisions of a training run. This
# chapter makes three pieces of it exact:
#
# 1. **temperature sampling** $p_i \propto n_i^\alpha$ and the **epochs** each source gets,
#    $e_i = p_i D / n_i$, derived in SymPy: up-weighting a small source means repeating it;
# 2. **a sampler** that picks each window's source with probability $p_i$, checked with a
#    chi-square test, and a sweep that trains the book's small model on nine mixtures of
#    three sources and measures the validation loss on each;
# 3. **the data-mixing law** of Ye et al. (2024), $L_i(r) = c_i + k_i \exp(\sum_j t_{ij} r_j)$,
#    fitted on eight of the mixtures and asked to predict the ninth;
#
# and then compares a claim about "typical" mixtures with three published ones.

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import display
from scipy.special import stdtr

from llmbook.inference.sampling import chi_square_test
from llmbook.nbtools import Checks, ClaimGrades, Formula, save_figure, seed_everything, show_source
from llmbook.paths import data_path
from llmbook.training.mixtures import (
    PUBLISHED_MIXTURES,
    book_sources,
    category_shares,
    epochs_per_source,
    fit_mixing_law,
    mixing_law,
    mixture_batch,
    sample_sources,
    synthetic_mixture_source,
    temperature_weights,
    total_variation,
    train_on_mixture,
)
from llmbook.training.train import TrainConfig
from llmbook.transformer.model import TransformerConfig, TransformerLM

g = seed_everything(0)
torch.set_num_threads(1)  # tiny models: one thread is faster and repeatable

# %% [markdown]
# ## 10d.1 Temperature sampling and epochs
#
# Take $K$ sources of $n_1, \dots, n_K$ tokens and a budget of $D$ training tokens. Sampling
# **in proportion to size**, $p_i = n_i / \sum_j n_j$, treats every token alike: each
# source is read the same number of times, $D / \sum_j n_j$. That starves the small
# sources, which are often the valuable ones (an encyclopedia, a language with little
# text). **Temperature sampling** flattens the distribution with an exponent $\alpha$:
#
# $$ p_i = \frac{n_i^\alpha}{\sum_j n_j^\alpha}, \qquad \alpha = 1 \text{ proportional},
# \quad \alpha \to 0 \text{ uniform}. $$
#
# A source sampled with probability $p_i$ contributes $p_i D$ tokens to the run, so it is
# read $e_i = p_i D / n_i$ times. SymPy derives the ratio of two sources' epochs:

# %%
n1, n2, alpha, D = sp.symbols("n_1 n_2 alpha D", positive=True)
p1 = n1**alpha / (n1**alpha + n2**alpha)
p2 = n2**alpha / (n1**alpha + n2**alpha)
e1, e2 = p1 * D / n1, p2 * D / n2
ratio = sp.simplify(e1 / e2)
assert sp.simplify(ratio - (n1 / n2) ** (alpha - 1)) == 0
assert sp.simplify(p1 + p2 - 1) == 0
assert sp.simplify(ratio.subs(alpha, 1) - 1) == 0  # proportional: equal epochs
display(Formula(r"\frac{e_1}{e_2} = " + sp.latex((n1 / n2) ** (alpha - 1))))

# %% [markdown]
# For $\alpha < 1$ the exponent $\alpha - 1$ is negative: the smaller source is read
# $(n_2/n_1)^{1-\alpha}$ times more often than the larger. At $\alpha = 0$ a source a
# thousand times smaller is repeated a thousand times more. The package computes both
# (in log space, so sizes of $10^{12}$ tokens do not overflow), checked here against the
# SymPy expressions:

# %%
show_source(temperature_weights)

# %%
checks = Checks("temperature sampling and epochs against SymPy")
p1_fn = sp.lambdify((n1, n2, alpha), p1)
e1_fn = sp.lambdify((n1, n2, alpha, D), e1)
for a in (0.0, 0.3, 0.7, 1.0):
    checks.close(f"p_1 at alpha = {a}, n = (3e9, 5e11)", p1_fn(3e9, 5e11, a),
                 temperature_weights([3e9, 5e11], a)[0], tol=1e-14)
    checks.close(f"e_1 at alpha = {a}, D = 1e12", e1_fn(3e9, 5e11, a, 1e12),
                 epochs_per_source(temperature_weights([3e9, 5e11], a), [3e9, 5e11], 1e12)[0],
                 tol=1e-10, rel=True)
checks

# %% [markdown]
# The same arithmetic reads a published table. GPT-3 (Brown et al., 2020, Table 2.2) lists
# for each source its tokens, its weight in the training mix and the epochs elapsed over
# its 300 billion training tokens. Recomputing $e_i = p_i D / n_i$ from the table's own
# weights and sizes:

# %%
gpt3 = PUBLISHED_MIXTURES["GPT-3"]
print(f"{'GPT-3 source':<24}{'weight %':>9}{'tokens (B)':>11}{'epochs: printed':>17}{'p D / n':>9}"
      f"{'range if rounded':>18}")
consistent = {}
for name, (w, n, e, _) in gpt3["components"].items():
    # the table prints whole percents and whole billions: each value is +-0.5 off at most
    e_lo = (w - 0.5) / 100 * gpt3["budget"] / (n + 0.5)
    e_hi = (w + 0.5) / 100 * gpt3["budget"] / (n - 0.5)
    consistent[name] = e_lo <= e <= e_hi
    print(f"{name:<24}{w:>9.0f}{n:>11.0f}{e:>17.2f}{w / 100 * gpt3['budget'] / n:>9.2f}"
          f"{f'{e_lo:.2f} - {e_hi:.2f}':>18}")
weight_sum = sum(v[0] for v in gpt3["components"].values())
print(f"sum of the weights: {weight_sum:.0f} % (five rounded weights: 100 +- {5 * 0.5})")
checks = Checks("GPT-3's Table 2.2 against its own rounding")
checks.equal("rows whose printed epochs no rounding explains", ["WebText2"],
             [name for name, ok in consistent.items() if not ok])
checks.true("the weights' sum is within the rounding of 100 %", abs(weight_sum - 100) <= 5 * 0.5)
checks

# %% [markdown]
# The table prints whole percents and whole billions of tokens, so each weight and size
# may be off by up to a half; the last column is the range of $p D / n$ over those
# roundings. Four rows agree with the table's rounding (Wikipedia's 3.40 against 3.00 only
# because "3 billion tokens" and "3 %" are so coarse), and the weights' sum of 101 % is
# within the rounding of five numbers. One row does not: WebText2, whose weight and size
# give 3.31 to 3.65 epochs where the table prints 2.90. A table of rounded numbers need not be
# consistent; a reader who reuses it should know which columns to trust. What the table
# does show plainly is the point of this section: the smaller, curated sources (WebText2,
# Books1, Wikipedia) are read about two to three and a half times, the large crawl less
# than once.
#
# ## 10d.2 Sampling a mixture
#
# The sampler draws each window's source independently with probability $p_i$, then a
# window within that source with chapter 10's `get_batch`. All sources share one
# vocabulary, so one model reads them all and their losses are comparable.

# %%
show_source(mixture_batch)

# %% [markdown]
# Checks: the draws follow $p$ (Pearson's chi-square test of chapter 12, which would
# reject a wrong distribution), the same seed gives the same batch, and each row really
# comes from its source (three sources with disjoint token ids).

# %%
checks = Checks("the mixture sampler")
p_test = np.array([0.55, 0.3, 0.1, 0.05])
draws = sample_sources(p_test, 50_000, torch.Generator().manual_seed(0))
stat, df, pvalue = chi_square_test(draws, torch.from_numpy(p_test))
checks.true("chi-square p-value > 0.001 under p", pvalue > 1e-3)
checks.true("uniform is rejected (p-value < 1e-10)",
            chi_square_test(draws, torch.full((4,), 0.25, dtype=torch.float64))[2] < 1e-10)
toy = [np.arange(0, 40), np.arange(100, 150), np.arange(200, 260)]
x1, y1, s1 = mixture_batch(toy, [0.2, 0.3, 0.5], 32, 6, torch.Generator().manual_seed(1))
x2, y2, s2 = mixture_batch(toy, [0.2, 0.3, 0.5], 32, 6, torch.Generator().manual_seed(1))
checks.true("same seed, same batch", torch.equal(x1, x2) and torch.equal(s1, s2))
checks.true("every row from its source", torch.equal(x1 // 100, s1[:, None].expand_as(x1)))
checks.true("targets are inputs shifted by one", torch.equal(x1[:, 1:], y1[:, :-1]))
checks

# %% [markdown]
# ## 10d.3 Nine mixtures of three sources
#
# The book has three sources of very different kinds and sizes, all read as bytes
# (256 ids) plus 16 ids for the synthetic symbols, one vocabulary of 272:
#
# * **synthetic**: a Markov chain of chapter 3's kind, of order 1 so that a short run
#   learns it, with an exactly known entropy rate (the floor of its loss);
# * **prose**: the book's own English prose (`data/heldout_prose.txt`), the small source;
# * **docs**: the Python standard library's docstrings (`data/stdlib_docs.txt`), the
#   large source.
#
# `data/make_mixtures.py` trains the same 2-layer model (same initialisation, same batch
# seed) on nine mixtures: six fixed points of the simplex and temperature sampling at
# $\alpha = 0, 0.5, 1$. It measures each model's validation loss on each source's
# held-out tail and ships the results as JSON. The sizes and the epochs each mixture
# gives each source:

# %%
sweep = json.loads(data_path("mixtures", "sweep.json").read_text())
names = sweep["sources"]
src_entropy = synthetic_mixture_source().entropy_rate()
print(f"training tokens per source: {dict(zip(names, sweep['train_sizes'], strict=True))}")
print(f"budget D = steps x B x T = {sweep['budget_tokens']:,} tokens; "
      f"synthetic floor (entropy rate) = {src_entropy:.4f} nats/token\n")
print(f"{'mixture':<19}{'weights r':<22}{'epochs':<22}val loss (nats/token)")
print(f"{'':<19}{'':<22}{'':<22}" + "".join(f"{s:>10}" for s in names))
for run in sweep["runs"]:
    r = "(" + ", ".join(f"{w:.3f}" for w in run["weights"]) + ")"
    e = "(" + ", ".join(f"{x:.2f}" for x in run["epochs"]) + ")"
    print(f"{run['name']:<19}{r:<22}{e:<22}" + "".join(f"{v:>10.3f}" for v in run["val_loss"]))

# %%
W = np.array([run["weights"] for run in sweep["runs"]])  # (9, K)
V = np.array([run["val_loss"] for run in sweep["runs"]])  # (9, K)
ranks = [(a[:, None] > a).sum(1) + ((a[:, None] == a).sum(1) + 1) / 2 for a in (*W.T, *V.T)]  # ties: mean rank
rho = {s: np.corrcoef(ranks[i], ranks[len(names) + i])[0, 1] for i, s in enumerate(names)}  # Spearman
print("Spearman rank correlation of a source's weight with its loss, over the nine mixtures: "
      + ", ".join(f"{s} {r:+.2f}" for s, r in rho.items()))
checks = Checks("a source's loss falls as its weight grows")
for s, r in rho.items():  # one-sided p from t = rho sqrt((n - 2)/(1 - rho^2)), n - 2 = 7 d.o.f.
    checks.true(f"{s}: negative rank correlation, one-sided p < 0.05",
                r < 0 and stdtr(7, r * np.sqrt(7 / (1 - r**2))) < 0.05, f"{r:+.2f}")
checks

# %% [markdown]
# Each source's loss falls, roughly, as its own weight grows, and the small prose source
# is read many times over in the mixtures that favour it. Sources also help one another:
# prose and docs are both English, so the prose loss of the mixture that barely samples
# prose ($\alpha = 1$) is close to that of mixtures giving it several times more weight. The numbers are a shipped file, not a
# run of this notebook: training sums floats in an order that differs between CPUs, so
# the book ships what one machine measured. Replaying the first steps of the held-out
# mixture here shows that the file is what the script computes:

# %%
held = next(run for run in sweep["runs"] if run["name"] == sweep["held_out"])
sources = book_sources()
model = TransformerLM(TransformerConfig(**sweep["model"]),
                      generator=torch.Generator().manual_seed(sweep["init_seed"]))
config = TrainConfig(**{**sweep["train"], "betas": tuple(sweep["train"]["betas"])})
replay = train_on_mixture(model, [sources[s][0] for s in names], held["weights"], config,
                          stop_at=40)
gap = max(abs(a - b) for a, b in zip(replay, held["train_loss"][:40], strict=True))
checks = Checks("replaying the shipped run")
checks.true("first 40 training losses within 1e-3 of the shipped ones", gap < 1e-3)
checks

# %% [markdown]
# ## 10d.4 The data-mixing law
#
# Ye et al. (2024, "Data Mixing Laws") found that the validation loss on a domain $i$,
# as a function of the mixture proportions $r = (r_1, \dots, r_K)$, is well described by
# an exponential of a linear function:

# %%
display(Formula(r"L_i(r) = c_i + k_i \exp\Big(\sum_{j=1}^{K} t_{ij}\, r_j\Big)"))

# %% [markdown]
# $c_i$ is the loss no mixture removes, $k_i$ a scale, and $t_{ij}$ how much weight on
# source $j$ helps ($t_{ij} < 0$) or hurts source $i$. On the simplex
# ($\sum_j r_j = 1$) one parameter per source is redundant: adding $s$ to every $t_{ij}$
# and dividing $k_i$ by $e^s$ leaves $L_i$ unchanged. So with three sources each law has
# four free parameters, and eight mixtures leave four degrees of freedom per source.
#
# The fit is nonlinear least squares. For a fixed $c_i$ the law is linear in
# $\log(L_i - c_i)$, which gives a starting point; Levenberg–Marquardt then refines all
# parameters in float64, from several starting values of $c_i$:

# %%
show_source(fit_mixing_law)

# %% [markdown]
# Fit on every mixture but the held-out one (temperature sampling at $\alpha = 0.5$),
# then predict it. The fit error is the root-mean-square residual on the eight fitted
# mixtures; the prediction error is on the one the fit never saw. A second, harsher
# test is leave-one-out: each of the nine mixtures in turn is held out.

# %%
R = np.array([run["weights"] for run in sweep["runs"]])  # (M, K)
L = np.array([run["val_loss"] for run in sweep["runs"]])  # (M, S)
h = [run["name"] for run in sweep["runs"]].index(sweep["held_out"])
keep = np.arange(len(R)) != h
fit = fit_mixing_law(R[keep], L[keep])
pred = fit.predict(R[h:h + 1])[0]
print(f"{'source':<11}{'c_i':>8}{'fit RMSE':>10}{'measured':>10}{'predicted':>11}{'error':>9}")
for i, s in enumerate(names):
    print(f"{s:<11}{fit.c[i]:>8.3f}{fit.rmse[i]:>10.4f}{L[h, i]:>10.3f}{pred[i]:>11.3f}"
          f"{pred[i] - L[h, i]:>+9.4f}")
loo = np.array([fit_mixing_law(R[np.arange(len(R)) != m], L[np.arange(len(R)) != m])
                .predict(R[m:m + 1])[0] for m in range(len(R))])  # (M, S)
print(f"\nheld-out mixture: mean |error| = {np.abs(pred - L[h]).mean():.4f} nats/token")
print(f"leave-one-out over all {len(R)} mixtures: mean |error| = {np.abs(loo - L).mean():.4f}, "
      f"max = {np.abs(loo - L).max():.4f} nats/token")
baselines = {"constant (mean of the other 8)": [], "linear in r": []}
for mix in range(len(R)):
    other = np.arange(len(R)) != mix
    baselines["constant (mean of the other 8)"].append(L[other].mean(0))
    design = np.c_[R[other, :-1], np.ones(other.sum())]  # r_K = 1 - the others: drop it
    coef = np.linalg.lstsq(design, L[other], rcond=None)[0]
    baselines["linear in r"].append(np.r_[R[mix, :-1], 1.0] @ coef)
loo_err = {"mixing law": np.abs(loo - L).mean(0),
           **{k: np.abs(np.array(v) - L).mean(0) for k, v in baselines.items()}}
print("leave-one-out mean |error| per source (" + ", ".join(names) + "):")
for k, v in loo_err.items():
    print(f"  {k:<31}" + "".join(f"{x:8.4f}" for x in v) + f"   all: {v.mean():.4f}")
checks = Checks("the law against the two baselines, leave-one-out")
checks.true("the law beats predicting the mean of the other mixtures, on every source",
            bool(np.all(loo_err["mixing law"] < loo_err["constant (mean of the other 8)"])))
checks

# %%
fig, ax = plt.subplots(figsize=(6.5, 5))
for i, s in enumerate(names):
    ax.plot(L[:, i], loo[:, i], "o", color=f"C{i}", label=f"{s} (leave-one-out)")
    ax.plot(L[h, i], pred[i], "*", color=f"C{i}", markersize=16, markeredgecolor="black")
lo, hi = L.min() - 0.05, L.max() + 0.05
ax.plot([lo, hi], [lo, hi], "--", color="grey", label="prediction = measurement")
ax.set_xlabel("measured validation loss (nats/token)")
ax.set_ylabel("predicted by the mixing law (nats/token)")
ax.set_title("Data-mixing law: predicted vs measured (star: held-out α = 0.5)")
ax.legend(fontsize="small")
save_figure(fig, "10d_data_mixtures_law")
plt.show()

# %% [markdown]
# Points on the diagonal are mixtures the law predicts from the others. The prediction
# errors are to be compared with the spread of the losses across mixtures (tenths of a
# nat) and with two baselines, both predicted leave-one-out as the law was: ignoring the
# mixture (the mean of the other eight) does three to four times worse, and a plane in
# $r$, the law's first-order approximation, does worse on the synthetic and docs sources
# but better on prose (the table above). Nine runs are few, and the noise of one run
# (another seed) is not measured here, so the comparison ranks the predictors on this
# sweep only. The law is a smooth surrogate: with it one can
# search the simplex for a mixture without training at every point, which is what Ye et
# al. propose, fitted on small runs and extrapolated to large ones with scaling laws.
#
# Checks of the fit itself, on data generated from known parameters: off the simplex
# every parameter is identifiable and comes back; on the simplex the predictions do.

# %%
checks = Checks("fit_mixing_law on synthetic data")
rng = np.random.default_rng(0)
c0, k0, t0 = np.array([1.6, 2.5]), np.array([0.8, 1.4]), np.array([[-2.5, 0.4, 0.1], [0.3, -1.8, 0.0]])
r_free = rng.uniform(0, 1, size=(12, 3))
f_free = fit_mixing_law(r_free, mixing_law(r_free, c0, k0, t0))
checks.close("off the simplex: c", c0, f_free.c, tol=1e-8)
checks.close("off the simplex: t", t0, f_free.t, tol=1e-6)
r_simplex = rng.dirichlet(np.ones(3), size=9)
f_simplex = fit_mixing_law(r_simplex[:8], mixing_law(r_simplex[:8], c0, k0, t0))
checks.close("on the simplex: held-out prediction", mixing_law(r_simplex[8:], c0, k0, t0),
             f_simplex.predict(r_simplex[8:]), tol=1e-6)
checks

# %% [markdown]
# ## 10d.5 Published mixtures, and claim C11
#
# A claim met in tutorials (C11) says modern LLMs train on "diverse mixtures", with
# typical shares: web (Common Crawl) 60 %, books 15 %, Wikipedia 5 %, code 10 %,
# scientific 5 %, curated (InstructGPT data) 5 %. Three published mixtures are shipped in
# `PUBLISHED_MIXTURES`: GPT-3 (Brown et al., 2020, Table 2.2), LLaMA (Touvron et al.,
# 2023, Table 1) and the Pile (Gao et al., 2020, Table 1). The tests check the tables'
# own arithmetic (the Pile's weights are its effective sizes over their total, to the
# printed 0.01 %). Filing each component under a broad category (the book's reading of
# each paper's description; WebText2 and C4 are filtered web text, StackExchange counts
# as code) gives:

# %%
claim = {"web": 60.0, "books": 15.0, "wikipedia": 5.0, "code": 10.0, "scientific": 5.0,
         "curated": 5.0, "other": 0.0}
shares = {name: category_shares(m["components"]) for name, m in PUBLISHED_MIXTURES.items()}
print(f"{'category':<12}{'claim':>8}" + "".join(f"{n:>10}" for n in shares))
for cat in claim:
    print(f"{cat:<12}{claim[cat]:>8.1f}" + "".join(f"{s[cat]:>10.2f}" for s in shares.values()))


tv = {n: total_variation(claim, s) for n, s in shares.items()}
print("\ntotal variation distance from the claim: "
      + ", ".join(f"{n} {d:.2f}" for n, d in tv.items()))
checks = Checks("the claim's shares against the published ones")
checks.true("no published mixture within a fifth (TV <= 0.2) of the claim", min(tv.values()) > 0.2,
            f"min {min(tv.values()):.2f}")
checks.equal("the claim's web share is GPT-3's Common Crawl weight", claim["web"],
             float(gpt3["components"]["Common Crawl (filtered)"][0]))
checks

# %% [markdown]
# The total variation distance is the share of the mixture that would have to move to
# turn one into the other (0: the same, 1: disjoint). No published mixture is within a
# fifth of the claim's. The claim's web share matches GPT-3's Common Crawl row exactly;
# its code, scientific and Wikipedia shares are those of no table here; and its "curated
# (InstructGPT data)" row mixes up two stages: InstructGPT's demonstrations and
# comparisons (Ouyang et al., 2022) fine-tune a model that was already pretrained, and
# no published pretraining mixture lists them.

# %%
claims = ClaimGrades("Claim C11 against three published mixtures")
claims.grade("C11", "modern LLMs train on diverse mixtures",
             f"GPT-3 mixes {len(PUBLISHED_MIXTURES['GPT-3']['components'])} sources, LLaMA "
             f"{len(PUBLISHED_MIXTURES['LLaMA']['components'])}, the Pile "
             f"{len(PUBLISHED_MIXTURES['The Pile']['components'])}; web text is "
             f"{min(s['web'] for s in shares.values()):.0f}-{max(s['web'] for s in shares.values()):.0f} "
             f"% of them", "correct")
claims.grade("C11", "web 60 %, books 15 %, Wikipedia 5 %, code 10 %, scientific 5 %, curated 5 %",
             f"total variation distance to GPT-3 {tv['GPT-3']:.2f}, LLaMA {tv['LLaMA']:.2f}, "
             f"the Pile {tv['The Pile']:.2f}; the shares match no published table and the claim "
             f"cites none", "unsupported")
claims.grade("C11", "curated (InstructGPT data) 5 % of pretraining",
             "none of the three pretraining tables has instruction data; InstructGPT's data is "
             "used to fine-tune a pretrained model (Ouyang et al., 2022)", "wrong")
claims

# %% [markdown]
# ## Summary
#
# * Temperature sampling $p_i \propto n_i^\alpha$ interpolates between proportional
#   ($\alpha = 1$, equal epochs) and uniform ($\alpha = 0$); the epochs ratio is
#   $(n_1/n_2)^{\alpha - 1}$, so small sources are repeated. GPT-3's own table shows it.
# * A mixture sampler is a multinomial draw per window; the chi-square test checks it.
# * The exponential mixing law of Ye et al. (2024) fits the book's nine-mixture sweep and
#   predicts a held-out mixture; the numbers above are its errors.
# * "Diverse mixtures" is right; the claim's specific shares are not from any published
#   mixture, and instruction data is not pretraining data.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/10d_data_mixtures.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 10d` writes a stub
# of every function, `llmbook grade 10d` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_10d.py` runs
# the same checks on the reference.
#
# 1. (★) **How hot?** Write `alpha_for_max_epochs(sizes, budget, max_epochs)` returning the
#    smallest $\alpha \in [0, 1]$ at which no source is read more than `max_epochs` times
#    (bisection; the epochs of the smallest source fall as $\alpha$ grows). Why may no
#    such $\alpha$ exist, and what should the function do then?
# 2. (★★) **Search the simplex.** Write `best_mixture(fit, importance, grid)` returning
#    the mixture on a grid of the simplex that minimises the importance-weighted sum of
#    the predicted losses $\sum_i w_i L_i(r)$ of a fitted law. For the book's fit with
#    equal importance, which mixture does it choose?
# 3. (★★) **The redundant parameter.** Show in SymPy that on the simplex
#    $k\,e^{\sum_j t_j r_j} = k e^{s} e^{\sum_j (t_j - s) r_j}$ for every $s$, and write
#    `canonical_law(fit)` returning the same law with $t_{iK} = 0$ for every $i$.

# %%
from llmbook.workbench import grade

grade("10d", globals())
