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
# # 12 Decoding
#
# A trained language model gives, for every prefix, a distribution over the next token:
# logits $z \in \mathbb{R}^V$ and probabilities $p = \mathrm{softmax}(z)$. Turning that into
# text is a separate decision, the *decoding rule*, and it matters as much as the model:
# the same weights write loops, gibberish or fluent text depending on it. This chapter
# derives and checks the common rules.
#
# 1. **Greedy** decoding and why it loops.
# 2. **Temperature**: $\mathrm{softmax}(z/T)$, its limits, and a worked table.
# 3. **Top-k** and **top-p** (nucleus) filtering, with worked examples and property tests,
#    and a published hand-computed table graded entry by entry (two of its results are wrong).
# 4. **Beam search**, and a model on which it finds the most likely sequence where greedy
#    does not.
# 5. The book's text model under each rule, and the **KV cache** that makes generation
#    cheap (chapter 13 studies its cost).
# 6. **Speculative decoding**: a small draft model proposes, the large one verifies, and a
#    rejection rule makes the output distribution *exactly* the large model's. We prove it
#    with SymPy, test it with a chi-square test, check the expected number of tokens per
#    target pass, and derive when it saves time; on the book's model it does not.
# 7. **A real model**, SmolLM2-135M-Instruct: its next-token distributions, what each rule
#    keeps of them (with **min-p** and the **repetition penalty**), every rule checked
#    against its `transformers` counterpart, alone, chained and on ties, answers streamed
#    until the end-of-turn token, greedy decoding's loops measured against sampling, and
#    speculative decoding that pays, with a draft that copies from the prompt.
#
# The code is in `llmbook.inference.sampling` and `llmbook.inference.kvcache`.

# %%
import copy
import itertools
import json
import math
import re
import time

import matplotlib.pyplot as plt
import numpy as np
import regex
import sympy as sp
import torch
from IPython.display import display
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from llmbook.inference.constrained import (
    allowed_along,
    build_index,
    compile_regex,
    constrained_generate,
    token_strings,
)
from llmbook.inference.gguf import load_model
from llmbook.inference.kvcache import KVCache, kv_cache_bytes
from llmbook.inference.sampling import (
    BigramLM,
    IncrementalDecoder,
    PromptLookupDraft,
    apply_temperature,
    beam_search,
    chi_square_sf,
    chi_square_test,
    early_exit_draft,
    expected_tokens_per_step,
    generate,
    min_p_filter,
    no_repeat_ngram_filter,
    process_logits,
    repeated_ngram_fraction,
    repetition_penalty,
    sample_next,
    sequence_log_prob,
    speculative_generate,
    speculative_sample,
    speculative_speedup,
    stream,
    top_k_filter,
    top_p_filter,
)
from llmbook.nbtools import Checks, best_time, save_figure, seed_everything, show_source
from llmbook.paths import data_path
from llmbook.text.data import default_source
from llmbook.text.ngram import NGramModel
from llmbook.text.worked_example import PublishedComparison, load_the_cat_sat
from llmbook.training.pretrained import book_model
from llmbook.transformer.worked_example import ffn_step

g = seed_everything(0)
torch.set_num_threads(1)  # tiny tensors: one thread is as fast and steadier
text_model, text_info = book_model("text")
tok = text_info["tokenizer"]
print(f"text model: V = {text_model.config.vocab_size}, context {text_model.config.max_seq_len}, "
      f"validation loss {text_info['val_loss']:.3f} nats/token")

# %% [markdown]
# ## 12.1 Greedy decoding
#
# The simplest rule takes the most likely token, $x_{t+1} = \arg\max_x z_x$, appends it
# and repeats. It is deterministic, and it is what `temperature=0` means in
# `llmbook.inference.sampling.generate` (and in most serving APIs). On the book's small text model
# (chapter 10: four layers, 1024 BPE tokens, trained on the standard library's docstrings):

# %%
prompt = torch.tensor([tok.encode("Return the ")])  # (1, T)
greedy = generate(text_model, prompt, 40, temperature=0)
print(repr(tok.decode(greedy[0].tolist())))

# %% [markdown]
# Greedy decoding falls into a loop: once a few tokens repeat, the repetition itself makes
# the same continuation most likely again. Holtzman et al. (2020, "The Curious Case of
# Neural Text Degeneration") document this for large models too: maximising probability
# produces text that is *less* likely to be human-written, whose per-token probabilities
# are far higher than those of real text. Sampling from $p$ instead avoids the loop; the
# rules below decide *how much* of $p$ to sample from.

# %% [markdown]
# ## 12.2 Temperature
#
# Dividing the logits by a temperature $T > 0$ before the softmax,
#
# $$p_i(T) = \frac{e^{z_i / T}}{\sum_j e^{z_j / T}},$$
#
# sharpens the distribution for $T < 1$ and flattens it for $T > 1$. The limits, for
# distinct logits: $T \to \infty$ gives the uniform distribution, $T \to 0^+$ puts all
# mass on the arg max (greedy). SymPy on two logits $a > b$ (the ratio $p_b / p_a =
# e^{(b - a)/T}$ carries all the information):

# %%
a, b, T = sp.symbols("a b T", real=True)
d = sp.symbols("Delta", positive=True)  # a - b > 0
ratio = sp.exp((b - a) / T)
display(sp.Eq(sp.Symbol("p_b/p_a"), ratio))
lim_hot = sp.limit(sp.exp(-d / T), T, sp.oo)
lim_cold = sp.limit(sp.exp(-d / T), T, 0, "+")
print("T -> oo:", lim_hot, "(uniform)   T -> 0+:", lim_cold, "(all mass on the arg max)")
checks = Checks("temperature limits")
checks.equal("p_b/p_a -> 1 as T -> oo", 1, int(lim_hot))
checks.equal("p_b/p_a -> 0 as T -> 0+", 0, int(lim_cold))
checks

# %%
show_source(apply_temperature)

# %% [markdown]
# A worked table for the logits $z = (-0.336, 0.261, 0.260, -0.004, 0.341)$, the logits
# printed by a published hand-computed example that section 12.4 grades. We print each
# row's sum (the published table's $T = 0.5$ row sums to 0.8725; section 12.4 finds out
# why). A softmax sums to 1 by construction, so the sums check nothing; the rows are
# checked instead against SymPy's exact $e^{z_i/T} / \sum_j e^{z_j/T}$ on the rational
# logits, evaluated to 30 digits, which shares no code with `torch.softmax`.

# %%
z = torch.tensor([-0.336, 0.261, 0.260, -0.004, 0.341], dtype=torch.float64)
temperatures = [0.1, 0.5, 1.0, 2.0, 10.0]
rows = {t: torch.softmax(apply_temperature(z, t), dim=-1) for t in temperatures}
print("   T  " + "  ".join(f"  p_{i}  " for i in range(5)) + "    sum")
for t, p in rows.items():
    print(f"{t:4g}  " + "  ".join(f"{v:.4f}" for v in p.tolist()) + f"   {float(p.sum()):.4f}")

# %%
checks = Checks("temperature table")
checks.close("T = 1 row", [0.1251, 0.2273, 0.2270, 0.1744, 0.2462], rows[1.0], tol=5e-5)
checks.close("T = 0.5 row", [0.0746, 0.2461, 0.2456, 0.1449, 0.2888], rows[0.5], tol=5e-5)
z_exact_sym = [sp.Rational(v).limit_denominator(1000) for v in z.tolist()]
for t in temperatures:
    e = [sp.exp(v / sp.nsimplify(t)) for v in z_exact_sym]
    exact_row = [float(sp.N(x / sum(e), 30)) for x in e]
    checks.close(f"T = {t:g} row vs SymPy's exact softmax", exact_row, rows[t], tol=1e-12)
checks.true("T = 0.1 row: arg max has > 0.5", float(rows[0.1][4]) > 0.5, float(rows[0.1][4]))
checks

# %% [markdown]
# The entropy $H(T) = -\sum_i p_i(T) \log p_i(T)$ (nats) measures how spread the
# distribution is: 0 for greedy, $\log V$ for uniform. It increases with $T$ (its derivative
# is $\mathrm{Var}_{p(T)}[z] / T^3 \ge 0$). Below for the example logits and for the text
# model's next-token distribution after the prompt above.

# %%
def entropy(logits: torch.Tensor, t: float) -> float:
    logp = torch.log_softmax(apply_temperature(logits.double(), t), dim=-1)
    return float(-(logp.exp() * logp).sum())


with torch.no_grad():
    z_text = text_model(prompt)[0, -1]  # (V,)
ts = np.geomspace(0.05, 20, 80)
fig, ax = plt.subplots(figsize=(6.4, 3.6))
for logits, name in ((z, "example logits, V = 5"), (z_text, f"text model, V = {z_text.numel()}")):
    ax.plot(ts, [entropy(logits, t) for t in ts], label=name)
    ax.axhline(math.log(logits.numel()), ls=":", c="gray")
ax.set(xscale="log", xlabel="temperature T", ylabel="entropy H(T) (nats)",
       title="Entropy of softmax(z / T) rises from 0 (greedy) to log V (uniform)")
ax.legend()
save_figure(fig, "12_decoding_entropy")
plt.show()

# %%
hs = [entropy(z_text, t) for t in ts]
checks = Checks("entropy against temperature")
checks.true("H(T) increasing (text model): rising steps", bool(np.all(np.diff(hs) > 0)),
            f"{int((np.diff(hs) > 0).sum())} of {len(hs) - 1}")
checks.close(f"H(20) -> log {z_text.numel()}", math.log(z_text.numel()), hs[-1], tol=0.1)
checks.close("H(0.002) -> 0 (example)", 0.0, entropy(z, 0.002), tol=1e-9)
checks

# %% [markdown]
# The dotted lines are $\log V$: a hot model spreads towards it, a cold one collapses to
# the greedy choice. *Where* the transition happens depends on the gaps between the top
# logits, not on the temperature alone: the example's top three logits lie within 0.08 of
# each other, so even $T = 0.05$ leaves about 0.8 nats of uncertainty, while the text
# model's logits spread over several units and it is practically greedy below $T \approx
# 0.2$ and close to uniform above $T \approx 5$.
#
# ## 12.3 Top-k sampling
#
# Temperature alone keeps every token: with $V = 50{,}000$ the many individually unlikely
# tokens together carry real mass, and one of them is eventually drawn and derails the
# text. **Top-k** (Fan, Lewis & Dauphin, 2018, "Hierarchical Neural Story Generation")
# samples only among the $k$ largest logits: the others get $-\infty$, and the softmax
# renormalises the rest. Ties at the boundary are broken by token index, so exactly
# $k$ tokens survive.

# %%
show_source(top_k_filter)

# %%
kept = torch.softmax(top_k_filter(z, 2), dim=-1)
print("top-2 keeps tokens", torch.nonzero(kept).flatten().tolist(), "with p =",
      [round(v, 4) for v in kept[kept > 0].tolist()])
checks = Checks("top-k example")
checks.equal("kept tokens", [1, 4], torch.nonzero(kept).flatten().tolist())
checks.close("renormalised", (rows[1.0][[1, 4]] / rows[1.0][[1, 4]].sum()).tolist(),
             kept[[1, 4]], tol=1e-12)
checks

# %% [markdown]
# ## 12.4 Top-p (nucleus) sampling
#
# A fixed $k$ is too many when the model is sure and too few when it is not. The
# **nucleus** (Holtzman et al., 2020) adapts: sort the probabilities
# $p_{(1)} \ge p_{(2)} \ge \dots$ and keep the smallest prefix whose mass reaches $p$,
#
# $$k^* = \min\{k : p_{(1)} + \dots + p_{(k)} \ge p\},$$
#
# then renormalise. Token $(i)$ is kept exactly when the mass *before* it is still below
# $p$, which is what the code tests.

# %%
show_source(top_p_filter)

# %% [markdown]
# For our logits at $p = 0.75$: the sorted probabilities are 0.2462 (token 4), 0.2273 (1),
# 0.2270 (2), 0.1744 (3), 0.1251 (0). The first three sum to 0.7005 < 0.75, so token 3 is
# needed as well (0.8749 ≥ 0.75) and only token 0 is dropped:

# %%
p1 = rows[1.0]
nucleus = torch.softmax(top_p_filter(z, 0.75), dim=-1)
print("cumulative (sorted):", [round(v, 4) for v in torch.cumsum(p1.sort(descending=True).values, 0).tolist()])
print("nucleus p:", [round(v, 4) for v in nucleus.tolist()], " sum", round(float(nucleus.sum()), 4))
checks = Checks("nucleus at p = 0.75")
checks.equal("kept tokens", [1, 2, 3, 4], torch.nonzero(nucleus).flatten().tolist())
checks.close("renormalised probabilities", [0.2598, 0.2595, 0.1993, 0.2814], nucleus[1:], tol=5e-5)
checks.close("= p_i / (1 - p_0) of the T = 1 row", rows[1.0][1:] / (1 - rows[1.0][0]), nucleus[1:],
             tol=1e-12)
checks.equal("p = 0.70 keeps 3 tokens", 3, int(torch.isfinite(top_p_filter(z, 0.70)).sum()))
checks

# %% [markdown]
# ### A published table, graded
#
# The logits $z$ above are not made up: they are the output of a published, hand-computed
# walk through one layer of a toy transformer ("the cat sat", vocabulary *the, cat, sat,
# on, mat*), which the book ships with its exact inputs and every value the source
# printed (`data/worked_examples/the_cat_sat.json`; chapters 4, 6 and 7 grade its earlier
# steps). The source rounded its logits to three decimals, then printed a temperature
# table for $T = 0.5, 1, 2$, the top-3 set, the sorted cumulative probabilities and a
# nucleus at $p = 0.75$. We recompute each of them with this chapter's functions in
# float64, starting from the *exact* logits (the layer of chapters 6 and 7 applied to the
# exact inputs: a ReLU feed-forward layer on the embedding of *sat*, the residual, a
# LayerNorm with $\varepsilon = 0$, and the output matrix), and grade every printed entry
# with `PublishedComparison`: **agrees** (the exact value, rounded), **rounded inputs** (the
# value recomputed from the source's own rounded logits, rounded), **truncated** (cut
# instead of rounded), **last digit** (within 1.5 units of the last place), or **error**.

# %%
ex = load_the_cat_sat()
inp = ex.inputs
z_exact = ffn_step(ex)["logits"]  # (5,) exact logits: chapter 6's step, then W_out
z_printed = ex.published_tensor("logits")  # (5,) the source's logits, 3 decimals
print("exact logits:  ", [round(v, 5) for v in z_exact.tolist()])
print("printed logits:", z_printed.tolist())

table = PublishedComparison('"the cat sat": temperature, top-k and top-p')
exact_rows, printed_rows = {}, {}
for t in inp["temperatures"]:
    exact_rows[t] = torch.softmax(apply_temperature(z_exact, t), dim=-1)
    printed_rows[t] = torch.softmax(apply_temperature(z_printed, t), dim=-1)
    key = f"probabilities_T{t:g}"
    table.add(key, ex.published[key], exact_rows[t], from_rounded=printed_rows[t])
order_exact = torch.argsort(exact_rows[1.0], descending=True)
published_t1 = ex.published_tensor("probabilities_T1")
cum_exact = torch.cumsum(exact_rows[1.0][order_exact], 0)
cum_source = torch.cumsum(published_t1[torch.argsort(published_t1, descending=True)], 0)
table.add("top_p_0.75_cumulative", ex.published["top_p_0.75_cumulative"], cum_exact,
          from_rounded=torch.cumsum(printed_rows[1.0][torch.argsort(printed_rows[1.0], descending=True)], 0))


def kept_tokens(filtered: torch.Tensor) -> list[str]:
    return [ex.vocabulary[i] for i in torch.nonzero(torch.isfinite(filtered)).flatten().tolist()]


table.add("top_k_3_set", ex.published["top_k_3_set"], kept_tokens(top_k_filter(z_exact, inp["top_k"])),
          as_set=True)
table.add("top_p_0.75_nucleus_claimed", ex.published["top_p_0.75_nucleus_claimed"],
          kept_tokens(top_p_filter(z_exact, inp["top_p"])), as_set=True)
table

# %% [markdown]
# What the verdicts mean, row by row:
#
# * **$T = 1$ and $T = 2$**: every entry is within two units of the fourth decimal. Most
#   are what the source's own three-decimal logits give ("rounded inputs"): rounding
#   $-0.00248$ to $-0.004$ and $0.34179$ to $0.341$ (chapter 7 grades those) moves the
#   probabilities by about $10^{-4}$. One entry per row is cut rather than rounded or off
#   by one in the last digit even from the source's own logits (0.2148 where they give
#   0.2147), a slip from some intermediate it did not print. These are rounding, not
#   mistakes; the $T = 1$ row sums to 0.9999 for the same reason.
# * **$T = 0.5$**: all five entries are wrong, by 0.009 to 0.037,
#   and the row sums to 0.8725. The source's numerators $e^{z_i/T}$ are right: each
#   printed entry is the correct probability times the same factor 0.8725. Dividing the
#   numerators by the printed probabilities recovers the denominator the source used, and
#   it is the true one plus 1 (below), as if $e^{0} = 1$, a sixth term, had crept into the
#   sum. With that extra 1, four printed entries are reproduced exactly and the fifth is
#   the same number cut instead of rounded (0.21476 printed as 0.2147), the habit the
#   other rows show.
# * **Cumulative sums**: rounding and truncation only; they are the running sums of the
#   source's printed $T = 1$ row (0.2462, 0.4734, 0.7004, 0.8748, and 1.0 for 0.9999).
# * **Top-3**: {cat, sat, mat}, correct.
# * **Nucleus at $p = 0.75$**: an error. The rule is the smallest set whose cumulative
#   probability *reaches* $p$; by the source's own cumulative sums the top three reach only
#   0.7004 < 0.75, so the fourth token (*on*, 0.8748) is needed. The source stopped at
#   three: it kept the tokens *before* the threshold was crossed, not the one that
#   crosses it. The correct nucleus is {cat, sat, on, mat}, as `top_p_filter` returns.

# %%
numerators = torch.exp(z_printed / 0.5)  # e^(z_i / T) from the source's logits
implied = numerators / ex.published_tensor("probabilities_T0.5")  # (5,) the denominator it used
with_extra_one = numerators / (numerators.sum() + 1.0)
regraded = PublishedComparison("T = 0.5 row, recomputed with 1 added to the denominator")
regraded.add("probabilities_T0.5", ex.published["probabilities_T0.5"], with_extra_one)
print(f"sum of the printed T = 0.5 row: {sum(ex.published['probabilities_T0.5']):.4f}")
print(f"denominator implied by each entry: {[round(v, 2) for v in implied.tolist()]}, "
      f"true sum of e^(z/T): {float(numerators.sum()):.4f}")
display(regraded)
checks = Checks('"the cat sat": the errors, measured')
row_sum = sum(ex.published["probabilities_T0.5"])
checks.true("printed T = 0.5 row: |sum - 1| > 0.1", abs(row_sum - 1) > 0.1, round(row_sum, 4))
checks.close("implied denominator - true denominator (mean over entries)", 1.0,
             float(implied.mean() - numerators.sum()), tol=0.01, digits=4)
regraded_counts = {v: k for v, k in regraded.counts().items() if k}
checks.true("T = 0.5 row with an extra 1: only agrees / truncated",
            set(regraded_counts) <= {"agrees", "truncated"}, regraded_counts)
checks.close("source's cumulative sums = cumsum of its printed T = 1 row (first 4)",
             ex.published["top_p_0.75_cumulative"][:4], cum_source[:4], tol=1e-12)
source_cum3 = ex.published["top_p_0.75_cumulative"][2]
checks.true("source's own cumulative sum after 3 tokens < p = 0.75", source_cum3 < inp["top_p"],
            source_cum3)
checks.equal("nucleus by the rule, from the source's own cumulative sums: size",
             4, int((torch.tensor(ex.published["top_p_0.75_cumulative"]) < inp["top_p"]).sum()) + 1)
checks.equal("nucleus by top_p_filter on the printed logits", ["cat", "sat", "on", "mat"],
             kept_tokens(top_p_filter(z_printed, inp["top_p"])))
checks

# %% [markdown]
# The tests check three invariants on random logits with `hypothesis`: top-k keeps
# exactly $\min(k, V)$ tokens, none smaller than a dropped one; top-p keeps a prefix of the
# sorted order that reaches $p$ while the prefix one shorter does not; and the filtered
# distributions sum to 1. `sample_next` composes the rules (with `process_logits`, which
# section 12.9 takes apart: temperature, then top-k, then top-p, then min-p) and draws a
# token, or takes the arg max when $T = 0$. The draw is an *exponential race*: every token
# gets an independent clock $E_i \sim \mathrm{Exp}(1)$ and the largest $p_i / E_i$ wins.
# Since $E_i / p_i$ is exponential with rate $p_i$, token $i$ rings first with probability
# $p_i / \sum_j p_j$; taking logs, it is the Gumbel-max trick $\arg\max_i (\log p_i + G_i)$.
# It is how `torch.multinomial` draws one sample on a CPU, token for token.

# %%
show_source(sample_next)

# %% [markdown]
# ## 12.5 Beam search
#
# Greedy decoding maximises each factor of $P(x_{1:n}) = \prod_t p(x_t \mid x_{<t})$ in
# turn, not the product. **Beam search** keeps the $k$ most probable prefixes ("beams") at
# each step, extends each by every token and keeps the $k$ best of the $kV$ candidates.
# With $k = 1$ it is greedy; with $k = V^{n-1}$ it is exhaustive. A hand-made bigram
# model shows the difference: after token 0, token 1 is likelier (0.55 against 0.41),
# but nothing after 1 is likely, while 2 is almost always followed by 3.

# %%
probs = torch.tensor([[0.02, 0.55, 0.41, 0.02],
                      [0.34, 0.33, 0.01, 0.32],
                      [0.01, 0.01, 0.01, 0.97],
                      [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
bigram = BigramLM.from_probs(probs)
start = torch.tensor([[0]])
greedy_seq = generate(bigram, start, 2, temperature=0)
beams = beam_search(bigram, start, num_beams=2, max_new_tokens=2, length_penalty=0.0)
print("greedy:", greedy_seq[0].tolist(), " P =", round(math.exp(float(sequence_log_prob(bigram, greedy_seq, 1))), 4))
print("beam 2:", beams[0].tokens.tolist(), " P =", round(math.exp(beams[0].log_prob), 4))

# %%
every = torch.tensor([[0, i, j] for i, j in itertools.product(range(4), repeat=2)])  # (16, 3)
logps = sequence_log_prob(bigram, every, 1)
checks = Checks("beam search against exhaustive enumeration")
checks.equal("most likely sequence (all 16)", every[int(logps.argmax())].tolist(), beams[0].tokens.tolist())
checks.close("its probability 0.41 * 0.97", 0.41 * 0.97, math.exp(beams[0].log_prob), tol=1e-12)
p_greedy = math.exp(float(sequence_log_prob(bigram, greedy_seq, 1)))
checks.true("greedy is worse: P(greedy)", p_greedy < math.exp(beams[0].log_prob), round(p_greedy, 4))
checks.equal("beam width 1 = greedy", greedy_seq[0].tolist(), beam_search(bigram, start, 1, 2)[0].tokens.tolist())
checks

# %% [markdown]
# With an end-of-sequence token the beams have different lengths, and the total log
# probability favours stopping early (every token multiplies in a factor below 1).
# `beam_search` ranks finished hypotheses by $\log P / n^{\lambda}$ with the
# `length_penalty` $\lambda$ (Hugging Face's convention): $\lambda = 0$ is the total,
# $\lambda = 1$ the mean per token. Beam search suits tasks with one right answer
# (translation); for open-ended text it inherits greedy's blandness and loops.
#
# ## 12.6 The text model under each rule
#
# Same prompt, same seed, five sampling rules, then beam search. With a fixed
# `torch.Generator` each output is reproducible, and because the book ships the model's
# weights, it is the same on your machine as in the committed notebook.

# %%
rules = {"greedy": dict(temperature=0), "T = 0.7": dict(temperature=0.7),
         "T = 1.5": dict(temperature=1.5), "top-k = 20": dict(top_k=20),
         "top-p = 0.9, T = 0.8": dict(top_p=0.9, temperature=0.8)}
outputs = {}
for name, kw in rules.items():
    out = generate(text_model, prompt, 40, generator=torch.Generator().manual_seed(1), **kw)
    outputs[name] = out
    print(f"{name}:\n{tok.decode(out[0].tolist())!r}\n")
best = beam_search(text_model, prompt, num_beams=4, max_new_tokens=40, length_penalty=1.0)[0]
print(f"beam search, 4 beams:\n{tok.decode(best.tokens.tolist())!r}")

# %% [markdown]
# Each rule has its own character. Greedy decoding loops at once ("identifier?
# identifier? identifier?"). Temperature 1.5 flattens the distribution until rare tokens
# win and words dissolve into fragments. The moderate rules (T = 0.7, top-k, top-p) all
# write "queueueue". Beam search, which maximises the probability of the whole
# continuation rather than of each token, writes the most docstring-like text, a header
# and a sentence the corpus could contain, and then, like greedy, repeats it. That is the
# trade-off of section 12.5 seen on real text: the most probable text is fluent and dull,
# sampling is varied and error-prone.
#
# **Why "queueueue" under every rule.** The stutter is the model's, not the rules'. The
# tokenizer cuts "queue" into *q*, *ue*, *ue*, so in training every *ue* of "queue" is
# followed by another *ue* or ends the word, and a four-layer model with a short memory
# does not count how many it has written. Below, the probability the model gives *ue*
# along the sampled stutter (from a float64 copy of the model, so the digits are the same
# on any CPU): it is the most likely next token for several steps, so every rule that
# keeps the most likely tokens keeps it, and a sample draws it most of the time. Only a
# rule that reads the history can refuse it. Forbidding any bigram to occur twice
# (`no_repeat_ngram_size=2`) bans *ue* once "ue ue" has been written: with the same seed
# and the top-p rule the model now writes "queue" and goes on. We check the ban at every
# step of that run against `transformers`' `NoRepeatNGramLogitsProcessor`. The price: a
# bigram ban also forbids "of the" twice in a paragraph, so it suits a small model's
# short outputs better than long text.

# %%
text64 = copy.deepcopy(text_model).double()
stutter = outputs["T = 0.7"][0]  # (T0 + 40,)
ue = stutter[4]  # the tokens: Return, " the", " ", q, ue, ue, ...
with torch.no_grad():
    p_text = torch.softmax(text64(stutter[None])[0], dim=-1)  # (T, V) float64
print(f"{'context ends':>16}  drawn  p(ue)  rank of ue")
for t in range(3, 10):
    rank = int((p_text[t] > p_text[t, ue]).sum()) + 1
    print(f"{tok.decode(stutter[3:t + 1].tolist())!r:>16}  {tok.decode([int(stutter[t + 1])])!r:5}  "
          f"{float(p_text[t, ue]):.3f}  {rank}")
ban_rule = dict(top_p=0.9, temperature=0.8, no_repeat_ngram_size=2)
banned = generate(text_model, prompt, 40, generator=torch.Generator().manual_seed(1), **ban_rule)
print(f"top-p = 0.9, T = 0.8, no bigram twice:\n{tok.decode(banned[0].tolist())!r}")

# %%
with torch.no_grad():
    z_ban = text_model(banned[:, :-1])[0]  # (T - 1, V): the logits of every step
T_p = prompt.shape[1]
checks = Checks("the stutter is the model's; a bigram ban escapes it")
checks.true("ue is the most likely token after q, que, queue, queueue",
            all(int(p_text[t].argmax()) == int(ue) for t in range(3, 7)))
same = [torch.equal(NoRepeatNGramLogitsProcessor(2)(banned[:, :t], z_ban[t - 1:t].clone()),
                    no_repeat_ngram_filter(z_ban[t - 1:t], banned[:, :t], 2))
        for t in range(T_p, banned.shape[1])]
checks.true("no_repeat_ngram_filter = NoRepeatNGramLogitsProcessor(2): steps", all(same), len(same))
checks.true('with the ban: no "queueue"', "queueue" not in tok.decode(banned[0].tolist()).lower())
checks

# %% [markdown]
# ## 12.7 The KV cache, briefly
#
# Generating token $t + 1$ needs the keys and values of all earlier positions in every
# layer. In a causal model they never change once computed, so `generate` keeps them in a
# `KVCache` (preallocated buffers of shape $(B, H_{kv}, T_{max}, d_{head})$ per layer): it
# runs the prompt once (the *prefill*) and then the model on one new token per step. The
# new queries are the last $T$ of the $T_k$ cached positions, so the causal mask is
# bottom-right aligned: query $i$ sees key $j$ when $j \le i + (T_k - T)$.

# %%
show_source(KVCache.update)

# %% [markdown]
# Its first line checks the arguments (`_check_new_kv`, which chapter 13's paged cache
# shares, names a wrong layer index, a wrong shape, or new positions that do not fit in
# $T_{max}$) and returns the new length; the next two write the $T$ new keys and values
# after the `length` cached ones, and the method returns views of all of them. `length`
# itself moves on only when every layer has written (`advance`, called by the model).
#
# The cache must not change the result: greedy decoding with and without it gives the
# same tokens, and the logits of a prefill followed by one-token steps equal those of one
# full forward pass to round-off. The memory is $2 L B T H_{kv} d_{head}$ elements (keys
# and values), which we compare with the buffers' real size.

# %%
cached = generate(text_model, prompt, 40, temperature=0, use_cache=True)
uncached = generate(text_model, prompt, 40, temperature=0, use_cache=False)
seq = cached[:, :30]
with torch.no_grad():
    full = text_model(seq)  # (1, 30, V)
    cache = KVCache.for_model(text_model, batch_size=1)
    steps = [text_model(seq[:, :7], cache=cache)] + [text_model(seq[:, t:t + 1], cache=cache)
                                                       for t in range(7, 30)]
checks = Checks("KV cache")
checks.equal("greedy tokens, cache vs none", uncached.tolist(), cached.tolist())
checks.close("logits: prefill 7 + 23 steps vs full (relative)", full, torch.cat(steps, dim=1),
             tol=1e-5, rel=True)  # float32 round-off over 4 layers
checks.equal("cache length", 30, cache.length)
checks.equal("bytes: 2 L B T H_kv d_head * 4", kv_cache_bytes(text_model.config, 1, text_model.config.max_seq_len), cache.num_bytes())
checks

# %% tags=["nbval-ignore-output"]
for use_cache in (False, True):
    began = time.perf_counter()
    generate(text_model, prompt, 60, temperature=0, use_cache=use_cache)
    print(f"use_cache={use_cache}: {1e3 * (time.perf_counter() - began):.0f} ms for 60 tokens")

# %% [markdown]
# Chapter 13 measures what the cache saves and costs (memory grows linearly with $T$ and
# dominates at long contexts; grouped-query attention divides it by $H / H_{kv}$).
#
# ## 12.8 Speculative decoding
#
# A large model's decoding step is slow mostly because it reads all its weights for one
# token. Scoring $\gamma + 1$ tokens in one pass costs about the same. **Speculative
# decoding** (Leviathan, Kalman & Matias, 2023, "Fast Inference from Transformers via
# Speculative Decoding"; Chen et al., 2023, "Accelerating Large Language Model Decoding
# with Speculative Sampling") uses that: a cheap *draft* model $q$ proposes $\gamma$ tokens,
# the *target* $p$ scores them all at once, and each drafted token $x$ is
#
# * accepted with probability $\min(1, p(x)/q(x))$, left to right;
# * at the first rejection, replaced by a draw from the residual
#   $r = \mathrm{norm}(\max(0, p - q))$, and the step ends;
# * if all $\gamma$ are accepted, one more token is drawn from $p$ (the target computed
#   that distribution anyway).
#
# **Claim**: each output token is distributed exactly as $p$. The probability of emitting
# $x$ at one position is
#
# $$P(x) = q(x)\min\!\Big(1, \frac{p(x)}{q(x)}\Big) + \Big(1 - \sum_y q(y) \min\!\Big(1,
# \frac{p(y)}{q(y)}\Big)\Big)\, \frac{\max(0, p(x) - q(x))}{\sum_y \max(0, p(y) - q(y))}.$$
#
# The $\min$ and $\max$ are resolved by cases: let $S = \{x : p(x) > q(x)\}$. Then
# $q \min(1, p/q) = q$ on $S$ and $p$ off it, and $\max(0, p - q) = p - q$ on $S$ and 0
# off it. For $V = 3$ with symbolic $p = (p_1, p_2, 1 - p_1 - p_2)$ and $q = (q_1, q_2,
# 1 - q_1 - q_2)$ we check every nonempty proper subset $S$ (if $S$ is empty or everything,
# $p = q$ and nothing is ever rejected):

# %%
show_source(speculative_sample)

# %%
def speculative_law(V: int) -> list[tuple[tuple[int, ...], bool]]:
    ps, qs = sp.symbols(f"p1:{V}", positive=True), sp.symbols(f"q1:{V}", positive=True)
    p = [*ps, 1 - sum(ps)]
    q = [*qs, 1 - sum(qs)]
    results = []
    for size in range(1, V):
        for S in itertools.combinations(range(V), size):
            accept = [q[i] if i in S else p[i] for i in range(V)]  # q min(1, p/q)
            excess = [p[i] - q[i] if i in S else 0 for i in range(V)]  # max(0, p - q)
            reject = 1 - sum(accept)
            law = [accept[i] + reject * excess[i] / sum(excess) for i in range(V)]
            results.append((S, all(sp.simplify(law[i] - p[i]) == 0 for i in range(V))))
    return results


proof = speculative_law(3)
for S, ok in proof:
    print(f"S = {set(S)}: P(x) = p(x) for every x: {ok}")

# %%
checks = Checks("speculative sampling is exact (SymPy, all orderings)")
checks.true("V = 3: all 6 cases", all(ok for _, ok in proof), len(proof))
proof4 = speculative_law(4)
checks.true("V = 4: all 14 cases", all(ok for _, ok in proof4), len(proof4))
checks

# %% [markdown]
# The key step is visible in the algebra: the rejection probability
# $1 - \sum_y \min(p(y), q(y))$ equals $\sum_{y \in S} (p(y) - q(y))$, the residual's
# normaliser, so on $S$ the rejection branch adds exactly the missing $p(x) - q(x)$.
#
# **Empirically.** A chi-square goodness-of-fit test compares the counts $O_x$ of $N$
# draws with the expected $E_x = N p(x)$: $X^2 = \sum_x (O_x - E_x)^2 / E_x$ is
# approximately $\chi^2_{V-1}$ if the draws follow $p$. For its p-value we need the
# survival function of $\chi^2_k$, the regularised upper incomplete gamma function
# $Q(k/2, x/2)$. For integer $k$ it has a closed form (Abramowitz & Stegun, 1964,
# 26.4.4–5): for even $k$, $e^{-y}\sum_{i < k/2} y^i / i!$ with $y = x/2$; for odd $k$, an
# $\mathrm{erfc}$ term plus a similar sum. We check it against SymPy's `uppergamma` and
# against the Wilson–Hilferty approximation (Wilson & Hilferty, 1931: $(X/k)^{1/3}$ is
# nearly normal with mean $1 - 2/(9k)$ and variance $2/(9k)$).

# %%
show_source(chi_square_sf)

# %%
def wilson_hilferty_sf(x: float, k: int) -> float:
    zscore = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(zscore / math.sqrt(2))


checks = Checks("chi-square survival function")
for k, x in ((1, 3.841), (4, 9.488), (7, 5.0), (15, 30.0)):
    exact = float(sp.uppergamma(sp.Rational(k, 2), sp.Rational(x).limit_denominator(10**6) / 2)
                  / sp.gamma(sp.Rational(k, 2)))
    checks.close(f"k = {k}, x = {x}: vs SymPy", exact, chi_square_sf(x, k), tol=1e-10)
    checks.close(f"k = {k}, x = {x}: vs Wilson-Hilferty", exact, wilson_hilferty_sf(x, k), tol=5e-3)
checks

# %% [markdown]
# Now the test on real distributions. The target is the book's synthetic model (chapter
# 10: it has learned the order-2 Markov source of chapter 3); the draft is a bigram model
# counted on the source's training data (it sees only the last token, so it is a
# reasonable but imperfect guess). At one context we take $p$ and $q$ and draw
# $N = 50{,}000$ speculative samples:

# %%
target, _ = book_model("synthetic")
train_ids, _ = default_source().train_val(1_000_000, 100_000)
draft = BigramLM.from_probs(torch.from_numpy(NGramModel(2, 16, add_k=0.2).fit(train_ids).probability_table()))
context = train_ids[:6][None].long()  # (1, 6)
with torch.no_grad():
    p_t = torch.softmax(target(context)[0, -1].double(), -1)  # (16,)
    q_d = torch.softmax(draft(context)[0, -1], -1)  # (16,)
alpha = float(torch.minimum(p_t, q_d).sum())
samples = speculative_sample(p_t, q_d, 50_000, torch.Generator().manual_seed(0))
stat, df, pval = chi_square_test(samples, p_t)
_, _, pval_q = chi_square_test(torch.multinomial(q_d, 50_000, True, generator=torch.Generator().manual_seed(1)), p_t)
print(f"acceptance rate alpha = sum min(p, q) = {alpha:.4f}")
print(f"speculative samples vs p: X^2 = {stat:.2f} with {df} dof, p-value = {pval:.3f}")
print(f"draft samples vs p (control): p-value = {pval_q:.3g}")

# %%
checks = Checks("chi-square: speculative samples follow the target")
checks.true("p-value > 0.01 (speculative vs p)", pval > 0.01, pval)
checks.true("p-value < 1e-6 (draft vs p: the test has power)", pval_q < 1e-6, pval_q)
checks.close("frequencies vs p (16 tokens)", p_t, torch.bincount(samples, minlength=16) / 50_000,
             tol=0.01)
checks

# %% [markdown]
# **The speed-up.** If each drafted token is accepted independently with probability
# $\alpha = \sum_x \min(p(x), q(x))$ (the acceptance probability above), a step accepts
# $n$ drafted tokens with probability $\alpha^n (1 - \alpha)$ for $n < \gamma$ and
# $\alpha^\gamma$ for $n = \gamma$, and always emits $n + 1$ tokens. The expected number of
# tokens per target pass (Leviathan et al., 2023, eq. 1) is therefore

# %%
al, n_ = sp.symbols("alpha n", positive=True)
gam = sp.symbols("gamma", positive=True, integer=True)
by_gamma = []
for gamma_ in range(1, 7):
    e = sum((k + 1) * al**k * (1 - al) for k in range(gamma_)) + (gamma_ + 1) * al**gamma_
    by_gamma.append(sp.simplify(e - (1 - al ** (gamma_ + 1)) / (1 - al)) == 0)
general = sp.piecewise_fold(sp.summation((n_ + 1) * al**n_ * (1 - al), (n_, 0, gam - 1))
                            + (gam + 1) * al**gam)
general = general.args[-1][0]  # the branch alpha != 1 (alpha = 1 gives gamma + 1)
display(sp.Eq(sp.Symbol(r"\mathbb{E}[\mathrm{tokens}]"), (1 - al ** (gam + 1)) / (1 - al)))
checks = Checks("expected tokens per step")
checks.true("sum = (1 - a^(g+1)) / (1 - a) for g = 1..6", all(by_gamma), sum(by_gamma))
general_gap = sp.simplify(general - (1 - al ** (gam + 1)) / (1 - al))
checks.true("general gamma (SymPy summation): difference", general_gap == 0, general_gap)
checks

# %% [markdown]
# We measure it two ways for $\gamma = 1, \dots, 6$: with context-free models whose $p$
# and $q$ are fixed (so $\alpha$ is the same at every position and the formula is exact
# in expectation), and with the synthetic target and the bigram draft (where $\alpha$
# varies with the context, so the formula at the *average* $\alpha$ is only an
# approximation).

# %%
p_fix = torch.tensor([0.45, 0.25, 0.2, 0.1], dtype=torch.float64)
q_fix = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
alpha_fix = float(torch.minimum(p_fix, q_fix).sum())  # 0.8
fixed_t, fixed_d = BigramLM.from_probs(p_fix.expand(4, 4)), BigramLM.from_probs(q_fix.expand(4, 4))
gammas = list(range(1, 7))
measured_fixed = []
for gamma_ in gammas:
    _, st = speculative_generate(fixed_t, fixed_d, torch.tensor([[0]]), 1200, gamma_,
                                 generator=torch.Generator().manual_seed(gamma_))
    full_steps = [t for t, n in zip(st.tokens_per_step, st.proposed, strict=True) if n == gamma_]
    measured_fixed.append(sum(full_steps) / len(full_steps))

# %%
measured_real, alphas_real = [], []
prompts = train_ids[:2 * 80].view(80, 2).long()  # 80 prompts of 2 tokens
with torch.no_grad():
    for gamma_ in gammas:
        gen = torch.Generator().manual_seed(100 + gamma_)
        tokens_per_step, texts_ = [], []
        for pr in prompts:
            ids, st = speculative_generate(target, draft, pr[None], 14, gamma_, generator=gen)
            tokens_per_step += [t for t, n in zip(st.tokens_per_step, st.proposed, strict=True) if n == gamma_]
            texts_.append(ids)
        texts_ = torch.cat(texts_)  # (80, 16): alpha at every generated position, in one pass
        pp = torch.softmax(target(texts_)[:, 1:-1].double(), -1)
        qq = torch.softmax(draft(texts_)[:, 1:-1], -1)
        measured_real.append(sum(tokens_per_step) / len(tokens_per_step))
        alphas_real.append(float(torch.minimum(pp, qq).sum(-1).mean()))
alpha_real = float(np.mean(alphas_real))
print(f"real models: average alpha = {alpha_real:.3f}")

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.8))
ax.plot(gammas, [expected_tokens_per_step(alpha_fix, k) for k in gammas], "-", c="C0",
        label=f"formula, alpha = {alpha_fix:.2f}")
ax.plot(gammas, measured_fixed, "o", c="C0", label="measured, fixed p and q")
ax.plot(gammas, [expected_tokens_per_step(alpha_real, k) for k in gammas], "-", c="C1",
        label=f"formula, average alpha = {alpha_real:.2f}")
ax.plot(gammas, measured_real, "s", c="C1", label="measured, synthetic target + bigram draft")
ax.set(xlabel="draft length gamma (tokens)", ylabel="tokens per target pass",
       title="Speculative decoding: (1 - alpha^(gamma+1)) / (1 - alpha) vs measured")
ax.legend(fontsize="small")
save_figure(fig, "12_decoding_speculative")
plt.show()

# %% [markdown]
# The fixed-distribution points sit on their curve; the returns diminish with $\gamma$
# because a long draft is rarely accepted to its end ($\alpha^\gamma$ shrinks). With the
# real models the points scatter around the curve at the average $\alpha$: the
# acceptance probability varies from context to context, so the formula is then a
# summary rather than an identity, but a useful one. The bigram draft is accepted less
# than half the time, so drafts longer than two or three tokens buy almost nothing.
# The wall-clock speed-up also depends on the draft's cost $c$ relative to the target:
# $\gamma$ draft passes and one target pass produce the tokens above, so it is
# $\mathbb{E}[\mathrm{tokens}] / (\gamma c + 1)$ (Exercise 3).

# %%
checks = Checks("expected tokens per step: formula vs measured")
for k, m in zip(gammas, measured_fixed, strict=True):
    checks.close(f"fixed p, q: gamma = {k}", expected_tokens_per_step(alpha_fix, k), m, tol=0.15,
                 digits=3)
checks.close("real models: formula at average alpha (all gamma)",
             [expected_tokens_per_step(alpha_real, k) for k in gammas], measured_real, tol=0.25,
             digits=3)
checks.true("real models: tokens per pass grow with gamma (gamma = 1, 6)",
            measured_real[-1] > measured_real[0], (round(measured_real[0], 2), round(measured_real[-1], 2)))
checks

# %% [markdown]
# **Wall-clock time.** Target passes are not seconds: a draft pass costs something, and a
# target pass over $\gamma + 1$ tokens costs more than one over a single token, though
# less than $\gamma + 1$ single-token passes (section 13.7 explains why). To measure the
# real thing both models must decode as they would in practice, with a KV cache:
# `speculative_generate(..., use_cache=True)` keeps one for the target and one for the
# draft, runs the draft on one new token per proposal and the target on the $\gamma + 1$
# new ones, and truncates the caches to the accepted tokens after every step (a test
# checks that it produces the same tokens as rerunning both models on the whole sequence).
# The target is the text model of section 12.6. The draft needs the same vocabulary; a
# cheap one that needs no training is the target's own first layers with its output head
# (*self-speculative* decoding: Zhang et al., 2024, "Draft & Verify: Lossless Large
# Language Model Acceleration via Self-Speculative Decoding"; Elhoushi et al., 2024,
# "LayerSkip"), built by `early_exit_draft`. We time 64 sampled tokens ($T = 1$) with
# plain cached decoding and with speculative decoding, in the same run, best of two. The
# acceptance rate put into $S$ is measured by `SpeculativeStats.acceptance_rate`: the
# drafted tokens accepted over those tested (a step stops testing at its first rejection),
# which estimates $\alpha$ (`tests/test_sampling.py` checks it against
# $\sum_x \min(p(x), q(x))$ computed in exact fractions).

# %%
show_source(early_exit_draft)

# %% tags=["nbval-ignore-output"]
n_new = 64
t_plain, _ = best_time(lambda: generate(text_model, prompt, n_new, temperature=1.0, use_cache=True,
                                        generator=torch.Generator().manual_seed(0)), repeats=2)
print(f"plain decoding, cached: {1e3 * t_plain:6.0f} ms for {n_new} tokens ({n_new} target passes)")


for draft_layers, gamma_ in ((1, 2), (2, 3)):
    draft_lm = early_exit_draft(text_model, draft_layers)
    t_draft, _ = best_time(lambda d=draft_lm: generate(d, prompt, n_new, temperature=1.0, use_cache=True,
                                                       generator=torch.Generator().manual_seed(0)), repeats=2)
    t_spec, (_, st) = best_time(lambda d=draft_lm, k=gamma_: speculative_generate(
        text_model, d, prompt, n_new, k, use_cache=True, generator=torch.Generator().manual_seed(0)),
        repeats=2)
    c_cost, a_hat = t_draft / t_plain, st.acceptance_rate
    print(f"draft = first {draft_layers} of {text_model.config.n_layers} layers, gamma = {gamma_}: "
          f"cost ratio c = {c_cost:.2f}, acceptance {a_hat:.2f}; predicted speed-up "
          f"{speculative_speedup(a_hat, gamma_, c_cost):.2f}x, measured {t_plain / t_spec:.2f}x "
          f"({1e3 * t_spec:.0f} ms, {len(st.accepted)} target passes)")

# %% [markdown]
# **When it pays.** A step costs $\gamma$ draft passes of $c$ target passes each plus one
# target pass, and emits $\mathbb{E}[\mathrm{tokens}]$ tokens, so the expected speed-up is
#
# $$S(\alpha, \gamma, c) = \frac{1 - \alpha^{\gamma + 1}}{(1 - \alpha)(\gamma c + 1)}$$
#
# (Leviathan et al., 2023, theorem 3.8; `speculative_speedup`), assuming a target pass
# over $\gamma + 1$ tokens costs what a one-token pass costs. It is a slow-down when
# drafting costs more than it saves: for $\gamma = 1$, SymPy finds below that
# $S > 1$ exactly when $\alpha > c$, the acceptance rate must beat the draft's cost ratio.
# The timing cell measures both on the text model (timings vary from run to run, so its
# output is not compared). An untrained early exit is a poor predictor of the full model,
# so only about one drafted token in two is accepted, and on a model this small the passes
# are dominated by fixed per-pass overheads, so $c$ is much closer to 1 than the ratio of
# layers suggests: the predicted speed-up is near or below 1. The measured one is lower
# still, because a target pass over $\gamma + 1$ tokens is not free either. The method is built for the opposite case: a large target whose every
# pass reads gigabytes of weights (memory-bound, so $\gamma + 1$ tokens cost what one does)
# and a draft ten or more times cheaper that agrees with it most of the time. Section 12.9
# shows the regime where it pays on the real model, with a draft that costs almost nothing.
# `benchmarks/speculative.py` runs the comparison for more drafts and draft lengths and
# stores the result, with the machine and the date, in `benchmarks/results/speculative.json`.

# %%
c_ = sp.symbols("c", positive=True)
s_gamma1 = sp.simplify(((1 - al**2) / (1 - al)) / (c_ + 1))
display(sp.Eq(sp.Symbol("S(alpha, 1, c)"), s_gamma1))
checks = Checks("when speculative decoding pays")
checks.true("gamma = 1: S - 1 = (alpha - c) / (c + 1) (SymPy)",
            sp.simplify(s_gamma1 - 1 - (al - c_) / (c_ + 1)) == 0)
checks.close("speculative_speedup(0.8, 3, 0.1) = SymPy's S", float(
    ((1 - al**4) / ((1 - al) * (3 * c_ + 1))).subs({al: sp.Rational(4, 5), c_: sp.Rational(1, 10)})),
    speculative_speedup(0.8, 3, 0.1), tol=1e-12)
checks.true("alpha = 0.3, c = 0.5: a slow-down at every gamma <= 6",
            all(speculative_speedup(0.3, k, 0.5) < 1 for k in gammas))
checks

# %% [markdown]
# ## 12.9 A real model: SmolLM2-135M-Instruct
#
# The rules so far ran on the book's small models. Here they meet a real chat model,
# SmolLM2-135M-Instruct (Allal et al., 2025, "SmolLM2: When Smol Goes Big"), read from its
# GGUF file by `llmbook.inference.gguf.load_model` into the book's own `TransformerLM`
# (30 layers, $d = 576$, $V = 49{,}152$; chapter 7 checks its logits against
# `transformers`). A conversation reaches the model through its *chat template*:
# `render_chat` shows the text it sees, ending with the header of the turn the model is to
# write.

# %%
torch.set_num_threads(1)  # one thread: under `make test` another notebook runs beside this one
real_model, chat_tok = load_model()
messages = [{"role": "user", "content": "Write a short poem about the sea."}]
print(chat_tok.render_chat(messages))
chat_ids = torch.tensor([chat_tok.encode_chat(messages)])  # (1, T)
print(f"{chat_ids.shape[1]} tokens; the model's vocabulary: V = {real_model.config.vocab_size}")

# %% [markdown]
# **Digits that every CPU agrees on.** The model computes in float32, and float32 logits
# differ between CPUs in their last bits: by up to about $10^{-4}$ between this machine's
# AVX2 kernels and the portable ones (`ATEN_CPU_CAPABILITY=default`). A probability
# printed to four decimals would then read differently elsewhere whenever it lies near a
# rounding boundary. So the distributions printed below come from a float64 copy of the
# model (the same weights; its results differ between CPUs by about $10^{-13}$), while
# decoding uses the float32 model, with margins that are checked.

# %%
real64 = copy.deepcopy(real_model).double()
with torch.no_grad():
    z_chat = real_model(chat_ids)[0, -1]  # (V,) float32: what decoding uses
    z_chat64 = real64(chat_ids)[0, -1]  # (V,) float64: for the printed digits
p_chat = torch.softmax(z_chat64, dim=-1)
top = torch.topk(p_chat, 8)
print("rank  token       p")
for rank, (pv, i) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True), 1):
    print(f"{rank:4d}  {chat_tok.decode([i])!r:10}  {pv:.4f}")
print(f"top 8 hold {float(top.values.sum()):.4f}; entropy {float(torch.special.entr(p_chat).sum()):.3f} "
      f"nats (log V = {math.log(p_chat.numel()):.3f})")

# %% [markdown]
# Two openings are almost equally likely, and the remaining mass is spread thin over
# tens of thousands of tokens: the tail that truncation rules exist to cut. What each rule
# keeps of this distribution, computed with `process_logits` (the columns: how many tokens
# survive, how much of the original probability they held, and the renormalised
# probabilities of the two favourites):

# %%
show_source(min_p_filter)

# %%
real_rules = {"T = 1": {}, "T = 0.7": dict(temperature=0.7), "T = 1.5": dict(temperature=1.5),
              "top-k = 10": dict(top_k=10), "top-p = 0.9": dict(top_p=0.9),
              "min-p = 0.1": dict(min_p=0.1), "T = 1.5, top-p = 0.9": dict(temperature=1.5, top_p=0.9),
              "T = 1.5, min-p = 0.1": dict(temperature=1.5, min_p=0.1)}
first, second = top.indices[:2].tolist()
kept_counts = {}
print(f"{'rule':22}  kept  their p   p({chat_tok.decode([first])!r})  p({chat_tok.decode([second])!r})")
for name, rule in real_rules.items():
    z = process_logits(z_chat64, **rule)  # (V,) float64
    q, kept = torch.softmax(z, dim=-1), torch.isfinite(z)
    kept_counts[name] = int(kept.sum())
    print(f"{name:22}  {kept_counts[name]:5d}  {float(p_chat[kept].sum()):.4f}  {float(q[first]):9.4f}"
          f"  {float(q[second]):8.4f}")

# %% [markdown]
# Temperature keeps every token and only moves mass: $T = 0.7$ sharpens the two
# favourites, $T = 1.5$ hands mass to the tail. Top-k keeps a fixed number whatever the
# shape. Top-p and min-p adapt, in different ways. Top-p asks for a fixed *mass*, so when
# the temperature flattens the distribution, its nucleus swells to hundreds of tokens.
# Min-p asks for a fixed *ratio* to the favourite: at $T = 1.5$ its cut moves from
# $\max z + \log 0.1$ to $\max z + 1.5 \log 0.1$ and it keeps more tokens too, but far
# fewer than top-p. That is the argument of Nguyen et al. (2024) for min-p: it lets one
# raise the temperature for variety without letting the long tail back in.
#
# **The order of the rules.** `process_logits` applies them in the order of Hugging Face's
# `generate`: first the rules that read the history (the repetition penalty and the
# no-repeat n-gram ban, on the model's own logits, in greedy decoding too), then
# temperature, top-k, top-p and min-p. The order matters where rules do not commute.
# Top-k keeps the $k$ largest logits, which a temperature does not reorder; top-p,
# applied after top-k, measures its mass on the renormalised top-k distribution; min-p
# comes after the temperature, which moves its cut (Hugging Face's code comment points to
# the llama.cpp discussion that settled this); and min-p after top-p is not top-p after
# min-p (`tests/test_sampling.py` has an example). The repetition penalty divides a positive
# logit by $\theta$ and multiplies a negative one, which keeps its sign, so it commutes
# with $z/T$: penalising before or after the temperature is the same rule.

# %%
show_source(repetition_penalty)

# %% [markdown]
# **Against `transformers`.** Each rule must give, bit for bit, the tensor that the
# matching `transformers` logits processor gives, on the float32 logits that decoding
# uses. Two rows: the chat above and the plain-text prompt of the next experiment, each
# with its own history for the repetition penalty. What can differ, by design: on a tie at
# the top-k boundary `TopKLogitsWarper` keeps every tied token where the book keeps
# exactly $k$ (lower index first); `TopPLogitsWarper` sums float32 probabilities from the
# least likely token up and removes a token when that sum is at most $1 - p$, the book
# sums float64 probabilities from the most likely down and keeps a token while the mass
# before it is below $p$, the same rule in exact arithmetic, so the two sets could differ
# only if a running sum came within float32 round-off of $p$; `MinPLogitsWarper` compares
# float32 probabilities, the book compares $z - \max z$ with $\log p_{min}$ in float64.
# The last rows check that no boundary on these logits is that close, so the equalities
# are not luck (`tests/test_sampling_real.py` does the same on more prompts and settings).

# %%
base_prompt = "The best thing about living by the sea is"
base_ids = torch.tensor([chat_tok.encode(base_prompt)])  # (1, T0)
with torch.no_grad():
    z_base = real_model(base_ids)[0, -1]
z2 = torch.stack([z_chat, z_base])  # (2, V) float32
history = torch.stack([chat_ids[0, -base_ids.shape[1]:], base_ids[0]])  # (2, T0): one per row
checks = Checks("llmbook's rules = transformers' processors, SmolLM2's float32 logits")
for t in (0.7, 1.5):
    checks.equal(f"temperature {t}", TemperatureLogitsWarper(t)(history, z2), apply_temperature(z2, t))
for k in (10, 50):
    checks.equal(f"top-k {k}", TopKLogitsWarper(k)(history, z2), top_k_filter(z2, k))
top_p_cases, min_p_cases = ((1.0, 0.9), (1.0, 0.95)), ((1.0, 0.1), (1.5, 0.05))
for t, p in top_p_cases:
    zt = apply_temperature(z2, t)
    checks.equal(f"T = {t}, top-p {p}", TopPLogitsWarper(p)(history, zt), top_p_filter(zt, p))
for t, m in min_p_cases:
    zt = apply_temperature(z2, t)
    checks.equal(f"T = {t}, min-p {m}", MinPLogitsWarper(m)(history, zt), min_p_filter(zt, m))
for theta in (1.2, 1.5):
    checks.equal(f"repetition penalty {theta}", RepetitionPenaltyLogitsProcessor(theta)(history, z2),
                 repetition_penalty(z2, history, theta))


# %%
def top_p_margin(z: torch.Tensor, p: float) -> float:
    """How far p lies from the running masses that decide the nucleus (float64, all rows)."""
    probs = torch.sort(torch.softmax(z.double(), -1), dim=-1, descending=True).values
    before = torch.cumsum(probs, -1) - probs  # (B, V): mass before each token
    n = (before < p).sum(-1, keepdim=True)
    return float(torch.minimum(p - before.gather(-1, n - 1), before.gather(-1, n) - p).min())


def min_p_margin(z: torch.Tensor, m: float) -> float:
    """How far the nearest z - max z lies from the cut log m (float64, all rows)."""
    z = z.double()
    return float((z - z.amax(-1, keepdim=True) - math.log(m)).abs().min())


ranked = torch.sort(z2, dim=-1, descending=True).values
checks.true("top-k: no tie at the boundaries", all(bool((ranked[:, k - 1] > ranked[:, k]).all())
                                                   for k in (10, 50)))
checks.true("top-p: every running mass >= 1e-4 from p",
            min(top_p_margin(apply_temperature(z2, t), p) for t, p in top_p_cases) > 1e-4)
checks.true("min-p: every z - max z >= 1e-5 from the cut",
            min(min_p_margin(apply_temperature(z2, t), m) for t, m in min_p_cases) > 1e-5)
checks

# %% [markdown]
# **All the rules at once, and ties.** Chained, the rules must also agree with
# `transformers`' `LogitsProcessorList` in the order its `generate` builds it. At $T = 1.5$
# the nucleus at $p = 0.9$ holds hundreds of tokens, so with $k = 50$ the order matters:
# top-p measured on the renormalised top 50 keeps fewer tokens than top-k cut after top-p,
# and a temperature applied after the filters would change both cuts. The chain below
# would fail under either slip. Ties need a stated policy: the book's top-k keeps exactly
# $k$ tokens and breaks ties by the lower token index (a *stable* sort; from $V = 17$ on,
# `torch.sort`'s default reorders equal values), `TopKLogitsWarper` keeps every token tied
# with the $k$-th. Top-p keeps the same *number* of tokens in both (the smallest prefix
# reaching $p$); which of the tied tokens at its boundary survive, the book decides by
# index and `transformers` leaves to its sort. We check both policies on logits with
# only five distinct values, $V = 64$.

# %%
rules_all = dict(temperature=1.5, top_k=50, top_p=0.9, min_p=0.02, repetition_penalty=1.3,
                 no_repeat_ngram_size=3)
chain = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(3),
                             TemperatureLogitsWarper(1.5), TopKLogitsWarper(50), TopPLogitsWarper(0.9),
                             MinPLogitsWarper(0.02)])
ours_all = process_logits(z2, history, **rules_all)
warm = apply_temperature(no_repeat_ngram_filter(repetition_penalty(z2, history, 1.3), history, 3), 1.5)
p_first = min_p_filter(top_k_filter(top_p_filter(warm, 0.9), 50), 0.02)  # top-p before top-k
print("tokens kept per row: the chain", torch.isfinite(ours_all).sum(-1).tolist(),
      " top-p before top-k", torch.isfinite(p_first).sum(-1).tolist())
z_tie = (torch.randint(0, 5, (2, 64), generator=torch.Generator().manual_seed(0)) * 0.7).double()
k_tie = 10
ours_k, hf_k = torch.isfinite(top_k_filter(z_tie, k_tie)), torch.isfinite(TopKLogitsWarper(k_tie)(None, z_tie))
kth = torch.sort(z_tie, dim=-1, descending=True).values[:, k_tie - 1:k_tie]  # (2, 1)
print(f"V = 64, top-{k_tie}: the book keeps", ours_k.sum(-1).tolist(), "tokens, transformers",
      hf_k.sum(-1).tolist(), "(every token tied with the 10th)")

# %%
checks = Checks("the chain and the ties policies against transformers")
checks.true("all six rules = LogitsProcessorList, bit for bit", torch.equal(chain(history, z2.clone()), ours_all))
checks.true("top-p margin >= 1e-4 on the chain's top-k output",
            top_p_margin(top_k_filter(warm, 50), 0.9) > 1e-4)
checks.true("nucleus alone > 100 tokens in each row, so top-k cuts it to 50",
            bool((torch.isfinite(top_p_filter(warm, 0.9)).sum(-1) > 100).all()))
checks.true("min-p margins >= 1e-5 (in the chain, and after top-p first)",
            min(min_p_margin(top_p_filter(top_k_filter(warm, 50), 0.9), 0.02),
                min_p_margin(top_k_filter(top_p_filter(warm, 0.9), 50), 0.02)) > 1e-5)
checks.true("the order matters here (top-p first keeps other sets)",
            not torch.equal(torch.isfinite(p_first), torch.isfinite(ours_all)))
checks.true("top-k ties: book = transformers' set less its highest-index tied tokens",
            all(torch.equal(ours_k[r], hf_k[r] & ((z_tie[r] > kth[r]) | (torch.cumsum(
                (z_tie[r] == kth[r]).long(), 0) <= k_tie - int((z_tie[r] > kth[r]).sum())))) for r in range(2)))
checks.true("stable and default sorts order these ties differently",
            not torch.equal(torch.sort(z_tie, dim=-1, descending=True).indices,
                            torch.sort(z_tie, dim=-1, descending=True, stable=True).indices))
for p_tie in (0.4, 0.8):
    ours_p, hf_p = torch.isfinite(top_p_filter(z_tie, p_tie)), torch.isfinite(TopPLogitsWarper(p_tie)(None, z_tie))
    checks.equal(f"top-p {p_tie} with ties: same number kept", hf_p.sum(-1).tolist(), ours_p.sum(-1).tolist())
checks

# %% [markdown]
# ### Streaming an answer, until the end of the turn
#
# A chat interface prints the answer as it is generated. `stream` yields each step's
# tokens before the model runs again, and with `stop_ids` it ends as soon as the model
# writes its end-of-turn token (`<|im_end|>` for SmolLM2), which is included. (`generate`
# collects the same tokens into a tensor; for a batch, rows that stopped are padded with a
# `pad_id` until every row has.) Turning streamed tokens into text needs care: byte-level
# BPE cuts characters outside its merges into pieces, as the emoji below shows, and a
# piece decoded alone is the replacement character U+FFFD. `IncrementalDecoder` holds the
# pieces back until the character is whole.

# %%
emoji_ids = chat_tok.encode(" 🌊")
print("tokens of ' 🌊':", emoji_ids, "each decoded alone:", [chat_tok.decode([i]) for i in emoji_ids])
decoder = IncrementalDecoder(chat_tok)
print("pushed one by one:", [decoder.push(i) for i in emoji_ids])
show_source(IncrementalDecoder.push)

# %%
question = [{"role": "user", "content": "Describe the sea in one sentence."}]
question_ids = torch.tensor([chat_tok.encode_chat(question)])  # (1, T)
decoder = IncrementalDecoder(chat_tok, skip_special_tokens=True)
answer_ids, pieces = [], []
for token in stream(real_model, question_ids, 48, temperature=0, stop_ids=chat_tok.stop_token_ids):
    answer_ids.append(int(token))
    pieces.append(decoder.push(token))  # a terminal would print(piece, end="", flush=True)
pieces.append(decoder.flush())
print("".join(pieces))

# %% [markdown]
# The answer is greedy, so before trusting that it prints the same on every CPU we check
# the margin of every choice: the gap between the best and the second-best logit, on the
# logits of one teacher-forced pass over the whole answer (they differ from the cached
# ones of `stream` by round-off, as another CPU's would). A gap wider than $10^{-3}$, ten
# times the largest difference between CPUs measured above, cannot be overturned. The same replay checks
# the sampled texts below: `sample_next` draws by the exponential race, so replaying the
# generator's clocks gives each draw's margin, the gap between the winner's score
# $T(\log p_i - \log E_i)$ and the runner-up's, in the same logit units.


# %%
def choice_margins(ids: torch.Tensor, T0: int, temperature: float = 0.0, seed: int | None = None,
                   **rules: float) -> torch.Tensor:
    """Replay a decoding run of real_model teacher-forced: by how much (in logits) each token won."""
    with torch.no_grad():
        z = real_model(ids[:, :-1])  # (B, L - 1, V)
    clocks = None if seed is None else torch.Generator().manual_seed(seed)
    margins = []
    for t in range(T0, ids.shape[1]):
        score = process_logits(z[:, t - 1], ids[:, :t], temperature=temperature, **rules)
        if temperature > 0:  # sample_next's race: the largest p / E, i.e. log p - log E
            e = torch.empty(score.shape, dtype=torch.float64).exponential_(1, generator=clocks)
            score = temperature * (torch.log_softmax(score.double(), -1) - torch.log(e))
        best = torch.topk(score, 2, dim=-1)
        assert torch.equal(best.indices[:, 0], ids[:, t]), f"the replay differs at step {t}"
        margins.append(best.values[:, 0] - best.values[:, 1])
    return torch.stack(margins, dim=1)  # (B, L - T0)


def margin_floor(margins: torch.Tensor) -> str:
    """The smallest margin, as the power of ten below it (a bound that reads the same anywhere)."""
    return f"{10.0 ** math.floor(math.log10(float(margins.min()))):.0e}"


answer = torch.cat([question_ids, torch.tensor([answer_ids])], dim=1)
gaps = choice_margins(answer, question_ids.shape[1])
checks = Checks("the streamed answer")
checks.true(f"greedy: every gap >= {margin_floor(gaps)} (> 1e-3)", float(gaps.min()) > 1e-3)
checks.true("pieces joined = decode(tokens, skip specials)",
            "".join(pieces) == chat_tok.decode(answer_ids, skip_special_tokens=True))
checks.true("ended at the end-of-turn token: tokens", answer_ids[-1] in chat_tok.stop_token_ids,
            len(answer_ids))
checks

# %% [markdown]
# ### Greedy decoding loops; sampling does not
#
# Section 12.1 saw greedy decoding loop on a small model. A real model does too, given a
# plain-text prompt to continue (no chat template, so no end of turn is expected: every
# rule runs the full 128 tokens). We compare greedy decoding, greedy with the repetition
# penalty $\theta = 1.3$, greedy with no repeated 3-gram (the hard ban of
# `no_repeat_ngram_filter`), and four seeded samples at $T = 0.8$ drawn as one batch.
#
# Writing these texts takes $4 \times 128$ decoding steps, one after the other; checking
# them takes one teacher-forced forward pass per run, because every position's
# distribution comes out of a single pass once the tokens are known (the asymmetry that
# speculative decoding exploits). So `data/make_real_decoding.py` decodes them with
# `generate` (the calls are in the script: `generate(real_model, base_ids, 128,
# temperature=0, repetition_penalty=1.3)` and so on) and ships the token ids, and here
# `choice_margins` replays each run: every token must be the one its rule picks from the
# replayed logits, with the margin above. A stale file, another model or a change in a rule
# fails this check.

# %%
N_REAL, T0 = 128, base_ids.shape[1]
greedy_rules = {"greedy": {}, "greedy + penalty 1.3": dict(repetition_penalty=1.3),
                "greedy + no 3-gram twice": dict(no_repeat_ngram_size=3)}
shipped = json.loads(data_path("real_decoding", "runs.json").read_text())
runs = {name: torch.cat([base_ids, torch.tensor([shipped["runs"][name]])], dim=1) for name in greedy_rules}
samples = torch.cat([base_ids.expand(4, -1), torch.tensor(shipped["samples"])], dim=1)  # (4, T0 + 128)
checks = Checks("the shipped runs are what each rule decodes, every margin > 1e-3")
recipe = dict(prompt=base_prompt, max_new_tokens=N_REAL, greedy_rules=greedy_rules,
              samples=dict(batch=4, temperature=0.8, seed=0))
checks.true("the file's recipe and prompt ids are this section's",
            shipped["recipe"] == recipe and shipped["prompt_ids"] == base_ids[0].tolist())
for name, rule in greedy_rules.items():
    m = choice_margins(runs[name], T0, **rule)  # asserts that the replay picks every shipped token
    checks.true(f"{name}: replayed, every gap >= {margin_floor(m)}", float(m.min()) > 1e-3)
m = choice_margins(samples, T0, temperature=0.8, seed=0)
checks.true(f"T = 0.8 samples: replayed, every race margin >= {margin_floor(m)}", float(m.min()) > 1e-3)
checks

# %%
for name, ids in runs.items():
    print(f"--- {name}:\n{base_prompt}{chat_tok.decode(ids[0, T0:].tolist())}\n")
for b in (0, 1):
    print(f"--- T = 0.8, sample {b}:\n{base_prompt}{chat_tok.decode(samples[b, T0:].tolist())}\n")

# %% [markdown]
# Greedy decoding writes a fluent paragraph, then starts it again word for word and never
# leaves. The repetition penalty breaks the loop but pays for it: it lowers *every* token
# already seen, the common words and punctuation included, so the text drifts, and here
# the model escapes by ending its turn and starting a new one (the special tokens are
# printed as they are). The 3-gram ban forbids the loop outright and forces rephrasing.
# None of the four samples settles into a loop, though a small model at $T = 0.8$ does
# repeat phrases. The repeated-n-gram fraction (Welleck et al., 2020, "seq-rep-n": the share of
# n-grams that repeat an earlier one) puts numbers on it, and the figure follows it along
# the text, next to the probability greedy decoding gives its own choice (float64 model).

# %%
def continuation(ids: torch.Tensor) -> list[int]:
    return ids[T0:].tolist()


texts = {**{name: continuation(ids[0]) for name, ids in runs.items()},
         **{f"T = 0.8, sample {b}": continuation(samples[b]) for b in range(4)}}
print(f"{'decoding':32}  rep-2  rep-4")
for name, toks in texts.items():
    print(f"{name:32}  {repeated_ngram_fraction(toks, 2):.3f}  {repeated_ngram_fraction(toks, 4):.3f}")
with torch.no_grad():
    logp = torch.log_softmax(real64(runs["greedy"][:, :-1])[0, T0 - 1:], dim=-1)  # (128, V)
p_greedy = logp.gather(-1, runs["greedy"][0, T0:, None])[:, 0].exp()  # (128,) float64
loop = next(t for t in range(4, N_REAL) if repeated_ngram_fraction(texts["greedy"][:t + 1], 4) > 0)
print(f"greedy: the first repeated 4-gram ends at token {loop}; mean p of its own choice "
      f"before {float(p_greedy[:loop].mean()):.3f}, after {float(p_greedy[loop:].mean()):.3f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
ax1.plot(range(1, N_REAL + 1), p_greedy.numpy(), c="C0", lw=1)
ax1.axvline(loop + 1, c="gray", ls=":", label="first repeated 4-gram")
ax1.set(xlabel="generated token", ylabel="probability of the chosen token",
        title="Greedy: once it loops, the model is sure", ylim=(0, 1.02))
ax1.legend(fontsize="small", loc="lower right")
steps_x = range(4, N_REAL + 1)
for i, (name, toks) in enumerate(texts.items()):
    sampled = name.startswith("T = 0.8")
    ax2.plot(steps_x, [repeated_ngram_fraction(toks[:n], 4) for n in steps_x],
             c="C3" if sampled else f"C{i}", lw=0.8 if sampled else 1.6, alpha=0.6 if sampled else 1,
             label="T = 0.8 (4 samples)" if name.endswith("sample 0") else (None if sampled else name))
ax2.set(xlabel="generated tokens", ylabel="fraction of 4-grams repeated",
        title="Repetition along the text (seq-rep-4)", ylim=(-0.02, 0.5))
ax2.legend(fontsize="small")
save_figure(fig, "12_decoding_real_repetition")
plt.show()

# %% [markdown]
# On the left, greedy decoding's confidence in its own choices: it wavers while writing
# the paragraph the first time, then, once it starts repeating, almost every token has
# probability close to 1. Repetition feeds on itself: the more often a phrase is in the
# context, the likelier the model makes it again (Xu et al., 2022, "Learning to Break the
# Loop", name this self-reinforcement), which is why maximising each step's probability
# ends in a loop. On the right, the greedy curve climbs steadily once the loop starts;
# the penalty and the ban stay at zero, and the samples below the greedy curve, the one
# that repeats a phrase included.
#
# What to use, then: for open-ended text, sampling with a moderate temperature and a
# truncation rule (top-p, or min-p, which tolerates a higher temperature); the penalties
# when greedy or low-temperature decoding is required, knowing that the repetition penalty
# also penalises the words every sentence needs. For tasks with one right answer (a
# translation, an arithmetic result), greedy decoding or beam search.

# %% [markdown]
# ### Speculative decoding that pays: a draft that copies
#
# Section 12.8 found speculative decoding slower on the text model, and predicted it from
# $S(\alpha, \gamma, c)$. The way out is a draft with $c \approx 0$ and a task where it is
# often right. Much of what chat models write copies their input: quoting, editing code,
# answering from a retrieved document. `PromptLookupDraft` guesses the next token by
# finding the current suffix (up to three tokens) earlier in the context and proposing the
# token that followed it; with no match its $q$ is uniform. Its $q$ is one-hot, so a guess
# $x$ is accepted with probability $p(x)$, and a rejection draws from $p$ with $x$ removed:
# the output is still exactly the target's. This is the copy mechanism of Yang et al.
# (2023, "Inference with Reference: Lossless Acceleration of Large Language Models"), as
# `transformers` offers it under `prompt_lookup_num_tokens` (a test checks that the first
# guess equals its candidate). We ask SmolLM2 to repeat a sentence of ours, and decode at
# $T = 0.5$ (`speculative_generate` divides both models' logits by $T$; a surer target
# copies more often), with plain decoding and with the lookup draft, $\gamma = 4$.
#
# What the draft *could* achieve is exact and CPU-independent: for a faithful copy, how
# many of its tokens the lookup guesses from the true prefix. What the model does is
# sampled from float32 logits and timed, so that cell's output is not compared.

# %%
copy_text = ("The lighthouse keeper climbed the stairs every evening, lit the lamp, and watched "
             "the ships pass safely through the narrow strait.")
copy_ids = torch.tensor([chat_tok.encode_chat(
    [{"role": "user", "content": "Repeat this sentence exactly: " + copy_text}])])  # (1, T)
faithful = chat_tok.encode(copy_text) + [chat_tok.stop_token_ids[0]]  # the copy and <|im_end|>
lookup = PromptLookupDraft(real_model.config.vocab_size, max_ngram=3)
ideal = torch.cat([copy_ids, torch.tensor([faithful])], dim=1)  # (1, T + n)
hits = sum(lookup.guess(ideal[:, :copy_ids.shape[1] + i]) == [x] for i, x in enumerate(faithful))
print(f"a faithful copy has {len(faithful)} tokens; the lookup guesses {hits} of them from the true prefix")
checks = Checks("the copying draft")
checks.true("guesses more than 3 in 4 tokens of a faithful copy", hits > 0.75 * len(faithful), hits)
checks.true("a gamma = 4 free draft with alpha = 0.75 pays: S(0.75, 4, 0)",
            speculative_speedup(0.75, 4, 0.0) > 2, round(speculative_speedup(0.75, 4, 0.0), 3))
checks

# %% tags=["nbval-ignore-output"]
n_copy, gamma_copy = len(faithful), 4
t_real, plain_copy = best_time(lambda: generate(real_model, copy_ids, n_copy, temperature=0.5,
                                                generator=torch.Generator().manual_seed(0)), repeats=1)
t_real_spec, (spec_copy, st_copy) = best_time(lambda: speculative_generate(
    real_model, lookup, copy_ids, n_copy, gamma_copy, temperature=0.5,
    generator=torch.Generator().manual_seed(0)), repeats=1)
t_guess, _ = best_time(lambda: lookup.next_token_logits(spec_copy), repeats=3)
c_copy, a_copy = t_guess / (t_real / n_copy), st_copy.acceptance_rate
print("speculative output:", repr(chat_tok.decode(spec_copy[0, copy_ids.shape[1]:].tolist())))
print(f"plain: {1e3 * t_real:.0f} ms for {n_copy} tokens ({n_copy} target passes); speculative: "
      f"{1e3 * t_real_spec:.0f} ms, {len(st_copy.accepted)} target passes")
print(f"cost ratio c = {c_copy:.3f}, acceptance {a_copy:.2f}: predicted speed-up "
      f"{speculative_speedup(a_copy, gamma_copy, c_copy):.2f}x, measured {t_real / t_real_spec:.2f}x")

# %% [markdown]
# Here the draft is nearly free and usually right, and the measured speed-up is real,
# though below the prediction: a target pass over five tokens costs more than one over a
# single token on this CPU, which the formula ignores. On open-ended text the lookup finds
# few matches and the same draft buys little; production systems pair the target with a
# small trained draft model of the same vocabulary, or train extra heads to draft
# (chapter 12b).

# %% [markdown]
# ## 12.10 Constrained decoding
#
# When a program reads the model's answer (a date, a JSON object, the arguments of a
# function call), a polite sentence around it is an error. Constrained decoding makes
# invalid strings impossible rather than unlikely: at every step, each token that could not
# lead to a valid string gets the logit $-\infty$. Willard & Louf (2023, "Efficient Guided
# Generation for Large Language Models") do this for any regular expression with two
# tables computed once, before decoding:
#
# 1. `compile_regex` turns the expression into a deterministic finite automaton (DFA)
#    over characters: Thompson's construction of a nondeterministic automaton, then the
#    subset construction, one DFA state per set of NFA states reached.
# 2. `build_index` walks, from each DFA state $s$, the characters of each token $v$ of the
#    vocabulary. Token $v$ is allowed in $s$ if the walk ends in a *live* state, one from
#    which some sequence of tokens reaches an accepting state; the end-of-turn token is
#    allowed only in an accepting state. The result is a mask of shape $(S, V)$ and the
#    state each allowed token leads to.
#
# A decoding step then costs one row of the mask. Two things keep the index cheap on
# SmolLM2's vocabulary: a token holding a character that no edge of the automaton reads dies
# in every state, so only tokens made of readable characters are walked; and each
# (state, character) transition is computed once and cached. Tokens that are special, or
# only part of a UTF-8 character, are never allowed. Below, the index of three patterns:
# any four, two and two digits; a calendar date (a month that exists, a day no later than
# the thirty-first); and a small JSON object.

# %%
vocab_text = token_strings(chat_tok.vocab, chat_tok.special_token_ids.values())  # V strings (None: never)
patterns = {"digits": r"\d{4}-\d{2}-\d{2}",
            "calendar": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
            "JSON": r'\{"age": [0-9]+\}'}
indices = {name: build_index(compile_regex(p), vocab_text, chat_tok.stop_token_ids)
           for name, p in patterns.items()}
print(f"{sum(t is None for t in vocab_text)} of V = {len(vocab_text)} tokens are never allowed")
for name, ix in indices.items():
    print(f"{name:8} {patterns[name]}: {ix.walked} tokens walked, {ix.allowed.shape[0]} live states,"
          f" allowed per state {ix.allowed.sum(dim=1).tolist()}")

# %% [markdown]
# The masks are checked against a peer that knows nothing of automata: the `regex`
# package's partial matching, which says whether a string can still be extended to a
# match. A token is allowed after a prefix exactly when prefix + token can be extended
# (every character of these patterns is a token of its own, so "can be extended by
# characters" and "by tokens" agree), and the end-of-turn tokens exactly when the prefix
# already matches. Each such check runs over all 49,152 tokens: two prefixes where the
# calendar pattern differs from the plain digits, and one of the JSON pattern.

# %%
checks = Checks("the token masks against regex's partial matching")
for name, prefix in [("calendar", "1969-"), ("calendar", "1969-1"), ("JSON", '{"age": 4')]:
    ix, peer = indices[name], regex.compile(patterns[name])
    brute = torch.tensor([t is not None and peer.fullmatch(prefix + t, partial=True) is not None
                          for t in vocab_text])  # (V,)
    brute[list(chat_tok.stop_token_ids)] = peer.fullmatch(prefix) is not None
    checks.true(f"{name} after {prefix!r}: allowed tokens", torch.equal(ix.allowed[ix.row(prefix)], brute),
                int(brute.sum()))
checks

# %% [markdown]
# Now the real model. Asked for the date of the Moon landing, SmolLM2 answers in a
# sentence (its first six tokens below); constrained by the calendar pattern, it must
# write a date. Both runs are greedy (`constrained_generate` masks the logits and calls
# `sample_next`, with the KV cache). Python's `re.fullmatch` checks the constrained answer,
# and a teacher-forced replay checks that every greedy choice won by more than $10^{-3}$
# among the tokens it was allowed, so that the text reads the same on any CPU.

# %%
moon_ids = torch.tensor([chat_tok.encode_chat(
    [{"role": "user", "content": "On what date did Apollo 11 land on the Moon?"}])])  # (1, T)
T_moon = moon_ids.shape[1]
free_moon = generate(real_model, moon_ids, 6, temperature=0)  # (1, T + 6)
dated, _ = constrained_generate(real_model, moon_ids, indices["calendar"], 12)
dated_text = chat_tok.decode(dated[:-1])
print(f"free      {chat_tok.decode(free_moon[0, T_moon:].tolist())!r} ...")
print(f"calendar  {chat_tok.decode(dated)!r}")
checks = Checks("a constrained answer of SmolLM2")
gaps = choice_margins(free_moon, T_moon)
checks.true(f"free: every gap >= {margin_floor(gaps)} (> 1e-3)", float(gaps.min()) > 1e-3)
checks.true("calendar: re.fullmatch of the answer, then an end-of-turn token",
            re.fullmatch(patterns["calendar"], dated_text) is not None and dated[-1] in chat_tok.stop_token_ids,
            dated_text)
with torch.no_grad():
    z = real_model(torch.cat([moon_ids, torch.tensor([dated[:-1]])], dim=1))[0, T_moon - 1:]  # (n, V)
best = torch.topk(z.masked_fill(~allowed_along(indices["calendar"], dated), float("-inf")), 2, dim=-1)
gaps = best.values[:, 0] - best.values[:, 1]  # +inf where only one token was allowed
checks.true(f"calendar: the replay picks the same tokens, every gap >= {margin_floor(gaps)} (> 1e-3)",
            best.indices[:, 0].tolist() == dated and float(gaps.min()) > 1e-3)
checks

# %% [markdown]
# The free answer begins in words. Forced to begin with a digit where it wanted to write
# "Apollo", the model loses the thread and writes the year 1473. The calendar pattern keeps
# the month and the day in range, which the plain digits pattern would not. A mask guarantees the form of the answer, never its content, and it can hurt the
# content: the model is pushed onto tokens it found unlikely, from which its own
# continuation no longer makes sense. Practice therefore states the format in the prompt as
# well, or lets the model write freely first and constrains only the final answer.
# Libraries such as Outlines and llama.cpp's grammars
# build these indices for JSON schemas and context-free grammars; the principle is the
# one above.

# %% [markdown]
# ## Summary
#
# * Greedy and beam search maximise probability; for open-ended text that produces loops.
#   Some loops are the model's under every rule (the text model's "queueueue"); only a
#   rule that reads the history, such as a ban on repeated bigrams, escapes them.
# * Temperature rescales the logits (entropy rises from 0 to $\log V$); top-k and top-p
#   cut the unreliable tail, top-p adaptively; all three are a few lines on the logits.
# * The KV cache turns each decoding step into work on one token, with identical output.
# * Speculative decoding is exact: the accept/reject rule reproduces the target's
#   distribution (proved by cases, confirmed by a chi-square test), and it emits
#   $(1 - \alpha^{\gamma+1})/(1 - \alpha)$ tokens per target pass. It saves wall-clock time
#   only when $S = (1 - \alpha^{\gamma+1}) / ((1 - \alpha)(\gamma c + 1)) > 1$ (for
#   $\gamma = 1$: when the acceptance rate beats the draft's cost ratio). An early exit of
#   the small text model does not pay; a prompt-lookup draft does when SmolLM2 copies.
# * The published "the cat sat" table gets its $T = 1$ and $T = 2$ rows right up to
#   rounding, but its $T = 0.5$ row has an extra 1 in the denominator (it sums to 0.8725)
#   and its nucleus at $p = 0.75$ stops one token short of the rule.
# * On a real chat model (SmolLM2-135M-Instruct, $V = 49{,}152$) every rule, min-p and the
#   repetition penalty included, gives bit for bit the tensor of its `transformers`
#   processor, alone and chained in `generate`'s order; top-p and min-p keep the same sets
#   because no boundary lies within float32 round-off, which is checked rather than
#   assumed. On ties the book's top-k keeps exactly $k$ tokens (lower index first), the
#   `transformers` warper every token tied with the $k$-th. Min-p keeps the tail out at a high
#   temperature where top-p lets hundreds of tokens in.
# * `stream` yields tokens as they are made and stops at the end-of-turn token;
#   `IncrementalDecoder` prints only whole characters. Greedy decoding of the real model
#   falls into a loop it grows surer of with every repetition; the repetition penalty and
#   the n-gram ban break it at a cost, sampling does not enter it. Printed text that
#   depends on float32 logits is shown only with a margin of $10^{-3}$ on every choice.
# * Constrained decoding compiles a regular expression to a DFA and, once, each DFA state
#   to a mask over the vocabulary (Willard & Louf, 2023); masked logits make every finished
#   answer match, as the `regex` package's partial matching and `re.fullmatch` confirm. The
#   mask fixes the form of an answer, not its truth.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/12_decoding.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 12` writes a stub
# of every function, `llmbook grade 12` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_12.py` runs
# the same checks on the reference.
#
# 1. (★★) **Locally typical sampling.** Meister et al. (2023, "Locally Typical
#    Sampling") keep the tokens whose surprisal $-\log p(x)$ is closest to the entropy $H$
#    of the distribution: sort the tokens by $|{-\log p(x)} - H|$ and keep the shortest
#    prefix of that order whose mass reaches $\tau$ (the top-p rule, in another order).
#    Write `typical_filter(logits, mass)`, find which of the example's tokens it keeps at
#    $\tau = 0.5$, and check it against `transformers`' `TypicalLogitsWarper` on random
#    logits. Which token does it drop that top-p would keep first?
# 2. (★★) **A temperature for a target entropy.** Since $H(T)$ is increasing, find $T$
#    with $H(T) = h$ by bisection: `temperature_for_entropy(logits, h)`. What temperature
#    gives the example logits an entropy of 1.0 nat?
# 3. (★★) **The best draft length.** With a draft costing $c$ target passes, the
#    expected speed-up is $(1 - \alpha^{\gamma+1}) / ((1 - \alpha)(\gamma c + 1))$
#    (Leviathan et al., 2023, theorem 3.8; `speculative_speedup`). Write
#    `best_gamma(alpha, c, max_gamma)` and tabulate it for $\alpha \in \{0.6, 0.8, 0.9\}$
#    and $c \in \{0.05, 0.2\}$. Why does the best $\gamma$ grow as $c$ falls?
# 4. (★) **Cache memory.** Use `kv_cache_bytes` to compute the KV cache of Llama 2 7B
#    ($L = 32$, $H_{kv} = 32$, $d_{head} = 128$) at $T = 4096$, $B = 1$ in bfloat16, and
#    the same with 8 KV heads (grouped-query attention). Write `llama_cache_gib(n_kv_heads)`.
# 5. (★★) **Counting what a pattern allows.** Write `count_matches(pattern, alphabet, n)`:
#    the number of strings of $n$ characters that the pattern matches, by dynamic
#    programming over the states of `compile_regex(pattern)` (carry a count per state, one
#    character at a time). How many strings does the calendar pattern of section 12.10
#    accept, how many of them fall in one year, and how many dates has a year?

# %%
from llmbook.workbench import grade

grade("12", globals())
