# %% [markdown]
# # 20 RL for reasoning and test-time compute
#
# The reasoning models of 2024–2025 were trained by reinforcement learning against rewards
# that no human labels and no reward model estimates: a *program* checks the final answer of
# a maths problem or runs the unit tests of a piece of code. DeepSeekMath (Shao et al., 2024,
# "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models")
# introduced the algorithm most of them use, **GRPO** (group relative policy optimisation):
# PPO (chapter 18) without a value network, with the baseline taken from a *group* of answers
# to the same question. DeepSeek-R1 (DeepSeek-AI, 2025) trained with it at scale. The second
# lever is spending compute at *inference*: sample several answers and vote, or keep one that
# a verifier accepts. This chapter:
#
# 1. builds a task with a **verifiable reward** that the book's models learn on a CPU:
#    two-digit addition, checked exactly by a program;
# 2. trains a tiny transformer by SFT to *partial* accuracy, the base model for RL;
# 3. **derives GRPO**: the group-relative advantage and its clipping; shows with SymPy how
#    the way per-token losses are *aggregated* biases the length of the answers (GRPO's
#    per-sequence mean, DAPO's token mean, Dr. GRPO's constant), and measures the bias;
# 4. checks a micro-batched GRPO step against the full-batch gradient, and **trains GRPO**:
#    held-out accuracy goes from 0.39 to 0.78;
# 5. derives **self-consistency** (majority voting) and **best-of-N** / pass@k, with the
#    unbiased pass@k estimator, and measures both on the models before and after RL;
# 6. reads answers out of free text (`#### 72`, `\boxed{}`, multiple-choice letters) with
#    parsers tested on adversarial strings, and checks pass@k against its definition;
# 7. derives the corrections of GRPO in use today, **Dr. GRPO** (what the std in the
#    advantage does to the objective), **DAPO** (clip-higher, token-level loss, dynamic
#    sampling) and **GSPO** (one importance ratio per sequence), checks them against trl,
#    and compares all four on the arithmetic task.
#
# The code is in `llmbook.alignment.reasoning` (task, models, GRPO),
# `llmbook.alignment.repeated_sampling` (voting, pass@k), `llmbook.alignment.answers` (answer
# parsers, voting over texts) and `llmbook.alignment.rl_variants` (Dr. GRPO, DAPO, GSPO);
# the GRPO loss is chapter 18's `llmbook.alignment.losses`.

# %%
import json
import math
import time

import matplotlib.pyplot as plt
import sympy as sp
import torch
from IPython.display import display

from llmbook.alignment.answers import (
    majority_vote,
    parse_choice_answer,
    parse_numeric_answer,
    pass_at_k_enumerated,
)
from llmbook.alignment.logprobs import response_logprobs
from llmbook.alignment.losses import group_normalized_rewards, grpo_loss
from llmbook.alignment.reasoning import (
    GRPO_RECIPE,
    SFT_RECIPE,
    VOCAB,
    accuracy,
    decode,
    format_answer,
    format_problem,
    grpo_microbatch_step,
    load_arithmetic_model,
    make_grpo_batch,
    parse_answer,
    problem_split,
    run_length_toy,
    sample_responses,
    sft_loss,
    verify_answer,
)
from llmbook.alignment.repeated_sampling import (
    expected_max_gaussian,
    expected_max_uniform_symbolic,
    expected_pass_at_k_symbolic,
    majority_probability,
    majority_probability_symbolic,
    pass_at_k,
    pass_at_n,
    plurality_vote,
    vote_accuracy,
)
from llmbook.alignment.rl_variants import (
    VARIANTS,
    arcsine_objective_symbolic,
    dapo_loss,
    expected_group_gradient,
    expected_group_gradient_enumerated,
    gspo_loss,
    informative_groups,
    sequence_log_ratio,
)
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.paths import data_path
from llmbook.training.optim import gradient_vector

g = seed_everything(0)
torch.set_num_threads(1)  # a tiny model: one thread is steadier
f64 = torch.float64
began = time.perf_counter()

# %% [markdown]
# ## 20.1 A reward that a program checks
#
# The task: add two numbers in $[0, 99]$. A prompt writes both operands with two digits,
# `"07+12="`, so every prompt has $P = 6$ tokens; the answer is the sum in ordinary decimal
# followed by an end token, `"19$"`. The vocabulary has one token per character: ten digits,
# `+`, `=`, the end token `$` and a padding token `_`. A response has at most $R = 5$ tokens:
# the longest answer, `"198$"`, and one more, so that a model can also fail to stop.
#
# The reward is 1 if the answer is *exactly* right and 0 otherwise, computed by a parser and a
# comparison, never by a model. An answer counts only if it is a run of digits with no leading
# zero, followed by the end token; anything after the end token is ignored.

# %%
show_source(parse_answer)

# %%
show_source(verify_answer)

# %% [markdown]
# All 10 000 operand pairs are shuffled once by a seeded permutation (integer arithmetic, the
# same on every machine); 500 are held out for testing and the other 9 500 are what SFT and RL
# train on.

# %%
test, train = problem_split("test"), problem_split("train")
print(f"{len(train)} training and {len(test)} held-out problems; vocabulary {VOCAB!r} ({len(VOCAB)} tokens)")
for a, b in test[:3].tolist():
    print(f"  {format_problem(a, b)} -> {format_answer(a + b)}")

checks = Checks("the verifier")
checks.true('"19$" answers 07+12=', verify_answer("07+12=", "19$"))
checks.true('"19$__" too (padding after the end)', verify_answer("07+12=", "19$__"))
checks.true('"19" does not (no end token)', not verify_answer("07+12=", "19"))
checks.true('"019$" does not (leading zero)', not verify_answer("07+12=", "019$"))
checks.true('"18$" does not (wrong)', not verify_answer("07+12=", "18$"))
raised = None  # the exception a malformed prompt raises, or None if it raises none
try:
    verify_answer("7+12=", "19$")
except (ValueError, TypeError) as err:
    raised = err
checks.equal("a malformed problem (one-digit operand) raises", "ValueError", type(raised).__name__)
checks.true("the error names the expected format", "two 2-digit operands" in str(raised), str(raised)[:40] + "…")
checks.equal("training and held-out sets are disjoint", 0,
             len(set(map(tuple, train.tolist())) & set(map(tuple, test.tolist()))))
checks

# %% [markdown]
# ## 20.2 The base model: SFT to partial accuracy
#
# The model is a GPT-2-style transformer (chapter 7) with 2 layers, $d = 64$, 4 heads and a
# context of $P + R = 11$ tokens: about 0.1M parameters. Supervised fine-tuning minimises the
# cross-entropy of the answer tokens given the prompt (the prompt's own tokens are not
# trained on):
#
# $$ \mathcal L_{\text{SFT}} = -\frac{1}{\sum_i |y_i|}\sum_i \sum_{t=1}^{|y_i|}
#    \log \pi_\theta(y_{i,t} \mid x_i, y_{i,<t}). $$

# %%
show_source(sft_loss)

# %% [markdown]
# RL needs a base model that is right *sometimes*: a model that is never right gets reward 0 on
# every sample and so no signal, and one that is always right has nothing to learn. So the SFT
# run is stopped early, after 400 AdamW steps on batches of 64 problems (16 seconds on one
# core), in the middle of the rise that a longer run completes. The weights are shipped
# (artifact `arithmetic_sft`, made by `python -m llmbook.alignment.shipped arithmetic_sft`), so
# every reader starts RL from the same model.

# %%
sft, sft_info = load_arithmetic_model("arithmetic_sft")
sft_greedy = accuracy(sft, test)
print("recipe:", {k: SFT_RECIPE[k] for k in ("steps", "batch_size", "lr")},
      f"-> {sft.num_parameters():,} parameters")
print(f"held-out greedy accuracy of the SFT model: {sft_greedy:.2f}")
below = max(s for s, a in zip(sft_info["eval_steps"], sft_info["test_accuracy"], strict=True) if a < 0.1)
print(f"during SFT, the greedy accuracy is below 0.1 until step {below}")
checks = Checks("the shipped SFT model")
checks.true("greedy accuracy = the one measured at training time (±0.005)",
            abs(sft_info["test_accuracy_greedy"] - sft_greedy) <= 0.005)
checks.true("partial: between 0.3 and 0.6", 0.3 <= sft_greedy <= 0.6)
checks

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
ax1.plot(sft_info["loss"])
ax1.set(xlabel="step", ylabel="cross-entropy (nats / answer token)", title="SFT loss")
ax2.plot(sft_info["eval_steps"], sft_info["test_accuracy"], "o-")
ax2.set(xlabel="step", ylabel="held-out greedy accuracy", title="SFT accuracy (500 held-out problems)")
fig.tight_layout()
save_figure(fig, "20_grpo_sft")
plt.show()

# %% [markdown]
# The loss falls steadily, but the accuracy of whole answers stays below 0.1 for the first 175
# steps and only then climbs: an answer is right only when all its digits are, carries included. The
# run ends on the way up, at 0.39. Most wrong answers are close: one digit off by one or two.

# %%
responses = sample_responses(sft, test[:8], temperature=0.0)
for (a, b), r in zip(test[:8].tolist(), responses, strict=True):
    text = decode(r).rstrip("_")
    print(f"{format_problem(a, b)} {text:5s} {'right' if parse_answer(text) == a + b else 'wrong: ' + str(a + b)}")

# %% [markdown]
# ## 20.3 GRPO: a group as the baseline
#
# For each question $q$, GRPO samples a group of $G$ answers $o_1, \dots, o_G$ from the
# current policy $\pi_{\text{old}}$, scores them with the reward, and gives every token of
# answer $i$ the same **group-relative advantage**
#
# $$ A_i = \frac{r_i - \operatorname{mean}(r_1, \dots, r_G)}{\operatorname{std}(r_1, \dots, r_G)} . $$
#
# The group mean replaces PPO's learned value $V(s)$ as the baseline: no value network to
# train or store. The policy then maximises PPO's clipped objective with a KL penalty towards
# a reference model (Shao et al., 2024, eq. 3):
#
# $$ \mathcal J(\theta) = \mathbb E\Big[\frac1G\sum_{i=1}^G \frac{1}{|o_i|}\sum_{t=1}^{|o_i|}
#    \Big(\min\big(\rho_{i,t} A_i,\ \operatorname{clip}(\rho_{i,t}, 1-\varepsilon, 1+\varepsilon)A_i\big)
#    - \beta\, \mathbb D_{\text{KL}}\big[\pi_\theta \,\|\, \pi_{\text{ref}}\big]_{i,t}\Big)\Big],
#    \qquad \rho_{i,t} = \frac{\pi_\theta(o_{i,t} \mid q, o_{i,<t})}{\pi_{\text{old}}(o_{i,t} \mid q, o_{i,<t})}, $$
#
# where the KL term is the per-token k3 estimator of chapter 18.
#
# With 0/1 rewards the advantages take two values. If $c$ of the $G$ answers are right, the
# mean is $\hat p = c/G$ and the sample variance is
# $\frac{1}{G-1}\big(c(1-\hat p)^2 + (G-c)\hat p^2\big) = \frac{G}{G-1}\hat p(1-\hat p)$, so a
# right answer gets $(1-\hat p)/s$ and a wrong one $-\hat p/s$. SymPy confirms the variance and
# that the advantages sum to zero, and `group_normalized_rewards` (trl's convention: the
# Bessel-corrected std) gives those values:

# %%
G, c = sp.symbols("G c", positive=True)
p_hat = c / G
variance = (c * (1 - p_hat) ** 2 + (G - c) * p_hat**2) / (G - 1)
assert sp.simplify(variance - G / (G - 1) * p_hat * (1 - p_hat)) == 0
s = sp.sqrt(G / (G - 1) * p_hat * (1 - p_hat))
A_right, A_wrong = (1 - p_hat) / s, -p_hat / s
assert sp.simplify(c * A_right + (G - c) * A_wrong) == 0
P = sp.Symbol(r"\hat{p}", positive=True)  # both sides positive: compare squares
assert sp.simplify((A_right**2 - (G - 1) * (1 - P) / (G * P)).subs(c, G * P)) == 0
assert sp.simplify((A_wrong**2 - (G - 1) * P / (G * (1 - P))).subs(c, G * P)) == 0
display(sp.Eq(sp.Symbol("A_{right}"), sp.sqrt((G - 1) * (1 - P) / (G * P))),
        sp.Eq(sp.Symbol("A_{wrong}"), -sp.sqrt((G - 1) * P / (G * (1 - P)))))
rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1], dtype=f64)  # c = 3 of G = 8
checks = Checks("group-relative advantages, c = 3 of G = 8")
checks.close("right answers", float(A_right.subs({G: 8, c: 3})),
             group_normalized_rewards(rewards, 8, eps=0.0)[0], tol=1e-15)
checks.close("wrong answers", float(A_wrong.subs({G: 8, c: 3})),
             group_normalized_rewards(rewards, 8, eps=0.0)[1], tol=1e-15)
checks.equal("a group with all answers right has no signal", [0.0] * 4,
             group_normalized_rewards(torch.ones(4, dtype=f64), 4).tolist())
checks

# %% [markdown]
# The last check is GRPO's blind spot: a question that the policy always or never gets right
# contributes nothing, and the batch shrinks in effect. DAPO (Yu et al., 2025, "DAPO: An
# Open-Source LLM Reinforcement Learning System at Scale") therefore over-samples and drops
# such groups ("dynamic sampling"). A group of size $G$ is silent with probability
# $p^G + (1-p)^G$ for a question answered right with probability $p$; section 20.7 measures
# it on the book's models.
#
# **The clipping.** Per token, the objective is $\min(\rho A, \operatorname{clip}(\rho)A)$: for
# $A > 0$ it stops rewarding an increase of $\rho$ beyond $1+\varepsilon$, for $A < 0$ a
# decrease below $1-\varepsilon$. SymPy differentiates it on both sides of the boundary, and
# autograd through `grpo_loss` (whose gradient with respect to $\log\pi$ is
# $-\rho A$ inside, by $d\rho/d\log\pi = \rho$) agrees: a clipped token gets no gradient.

# %%
rho, eps_ = sp.symbols("rho epsilon", positive=True)
surrogate = sp.Min(rho * 2, sp.Max(sp.Min(rho, 1 + eps_), 1 - eps_) * 2)  # A = 2 > 0
slope = {r: sp.diff(surrogate, rho).subs({eps_: sp.Rational(1, 5), rho: r}) for r in (sp.Rational(11, 10), sp.Rational(13, 10))}
print("d/d rho of min(rho A, clip(rho) A), A = 2, eps = 0.2:", {str(k): v for k, v in slope.items()})
logp = torch.log(torch.tensor([[1.1, 1.3]], dtype=f64)).requires_grad_()  # rho = 1.1, 1.3
out = grpo_loss(logp, torch.zeros(1, 2, dtype=f64), None, torch.tensor([2.0], dtype=f64),
                torch.ones(1, 2), 0.2, 0.0, "token_mean")
out.loss.backward()
checks = Checks("the clipping")
checks.close("inside: d loss / d log pi = -rho A / 2 tokens", -1.1 * 2 / 2, logp.grad[0, 0], tol=1e-15)
checks.close("outside (rho = 1.3 > 1.2): zero", 0.0, logp.grad[0, 1], tol=0)
checks.close("clip fraction", 0.5, out.clip_fraction, tol=0)
checks

# %% [markdown]
# ## 20.4 How the aggregation biases length
#
# The objective above averages each answer's tokens first ($1/|o_i|$) and then the answers
# ($1/G$). That is one of three ways to turn per-token losses $\ell_{i,t}$ into a number, and
# they are not equivalent:
#
# | aggregation | loss | weight of a token of answer $i$ |
# |---|---|---|
# | GRPO: mean of per-sequence means | $\frac1G\sum_i \frac{1}{\lvert o_i\rvert}\sum_t \ell_{i,t}$ | $\frac{1}{G\,\lvert o_i\rvert}$ |
# | DAPO (Yu et al., 2025): token mean | $\frac{1}{\sum_j \lvert o_j\rvert}\sum_i\sum_t \ell_{i,t}$ | $\frac{1}{\sum_j \lvert o_j\rvert}$ |
# | Dr. GRPO (Liu et al., 2025): constant | $\frac{1}{G\,L_{\max}}\sum_i\sum_t \ell_{i,t}$ | $\frac{1}{G\,L_{\max}}$ |
#
# Under GRPO's mean a token's weight depends on the length of *its own* answer. Liu et al.
# (2025, "Understanding R1-Zero-like Training: A Critical Perspective") point out what this
# does: a right answer ($A > 0$) is reinforced by $A/|o|$ per token, so short right answers are
# reinforced more; a wrong answer ($A < 0$) is penalised by $|A|/|o|$ per token, so *long wrong
# answers are penalised less*. Their Dr. GRPO ("GRPO done right") divides by a constant instead,
# and drops the std from the advantage too (exercise 3 shows what the std does).
#
# SymPy first: two answers of 2 and 3 tokens, with symbolic advantages and log-probabilities.
# At $\rho = 1$ the per-token loss is $-A_i \log\pi_{i,t}$ (in value $-A_i$, but its gradient
# carries the weights), and the derivatives are the weights of the table ($L_{\max} = 3$):

# %%
A1, A2 = sp.symbols("A_1 A_2")
lp = [sp.symbols("l_{1\\,1} l_{1\\,2}"), sp.symbols("l_{2\\,1} l_{2\\,2} l_{2\\,3}")]
ell = [[-A1 * x for x in lp[0]], [-A2 * x for x in lp[1]]]
losses = {"sequence_mean": (sum(ell[0]) / 2 + sum(ell[1]) / 3) / 2,
          "token_mean": (sum(ell[0]) + sum(ell[1])) / 5,
          "constant": (sum(ell[0]) + sum(ell[1])) / (2 * 3)}
for name, loss_ in losses.items():
    print(f"{name:14s} d/d l_11 = {sp.diff(loss_, lp[0][0])},   d/d l_21 = {sp.diff(loss_, lp[1][0])}")

# %% [markdown]
# Now the consequence for learning. Let a wrong answer have length $L_1$ with probability
# $1-q$ or $L_2 > L_1$ with probability $q = \sigma(\theta)$, the reward not depending on the
# length at all. The expected gradient of the objective with respect to $\theta$ is
# $\mathbb E[A\,w(L)\,\partial_\theta \log\pi(L)]$ with the weight $w$ of each aggregation
# (DAPO's normaliser is shared by the whole batch; for a large batch it is a constant too):

# %%
theta, A, L1, L2, Lmax = sp.symbols("theta A L_1 L_2 L_max", real=True)
q = sp.Symbol("q", positive=True)
sigma = 1 / (1 + sp.exp(-theta))  # q = sigma(theta)
logpi, prob = {L1: sp.log(1 - sigma), L2: sp.log(sigma)}, {L1: 1 - q, L2: q}


def expected_gradient(weight):
    """E[A w(L) d/dtheta log pi(L)], written in q = sigma(theta)."""
    grad = {L: sp.diff(logpi[L], theta).subs(sp.exp(-theta), (1 - q) / q) for L in (L1, L2)}
    return sp.factor(sp.simplify(sum(prob[L] * A * weight(L) * grad[L] for L in (L1, L2))))


per_sequence, constant = expected_gradient(lambda L: 1 / L), expected_gradient(lambda L: 1 / Lmax)
assert sp.simplify(per_sequence - A * q * (1 - q) * (1 / L2 - 1 / L1)) == 0 and constant == 0
display(sp.Eq(sp.Symbol(r"\mathbb{E}[\nabla_\theta]_{\mathrm{GRPO}}"), per_sequence),
        sp.Eq(sp.Symbol(r"\mathbb{E}[\nabla_\theta]_{\mathrm{Dr.\,GRPO}}"), constant))

# %% [markdown]
# With $A < 0$ (a wrong answer) and $L_2 > L_1$, GRPO's expected gradient
# $A\,q(1-q)(1/L_2 - 1/L_1)$ is *positive*: gradient ascent raises $\theta$ and makes wrong
# answers longer, although length earns nothing. With $A > 0$ it is negative: right answers get
# shorter. With a constant normaliser the two terms cancel exactly, as they must for an
# unbiased policy gradient of a length-independent reward: $\mathbb E[\nabla\log\pi] = 0$.
#
# **Measured, 1: the weights.** Autograd through `grpo_loss` on five answers of lengths 1 to
# 5 (advantage 1, padded to $T = 5$) gives each token's weight
# $-\partial\mathcal L/\partial\log\pi_{i,t}$; it matches the table:

# %%
lengths = torch.arange(1, 6)
mask = torch.arange(5)[None, :] < lengths[:, None]
measured = {}
for aggregation in ("sequence_mean", "token_mean", "constant"):
    logp = torch.zeros(5, 5, dtype=f64, requires_grad=True)
    grpo_loss(logp, None, None, torch.ones(5, dtype=f64), mask, 0.2, 0.0, aggregation).loss.backward()
    measured[aggregation] = -logp.grad[:, 0]  # (5,): the weight of the first token of each answer
checks = Checks("per-token weights, answers of 1..5 tokens")
checks.close("GRPO: 1 / (G |o_i|)", 1 / (5 * lengths.double()), measured["sequence_mean"], tol=1e-15)
checks.close("DAPO: 1 / sum |o_j| = 1/15", torch.full((5,), 1 / 15, dtype=f64), measured["token_mean"], tol=1e-15)
checks.close("Dr. GRPO: 1 / (G L_max) = 1/25", torch.full((5,), 1 / 25, dtype=f64), measured["constant"], tol=1e-15)
checks

# %% [markdown]
# **Measured, 2: the lengths.** A toy policy (`LengthToyPolicy`) isolates the effect. It answers
# right with a fixed probability $1/2$, and its only learnable choice is how many "digit" tokens
# to write before the end token (up to 8 tokens in all), with separate logits for right and wrong
# answers. The reward ignores the length, so an unbiased method leaves the lengths alone. GRPO
# runs 150 steps on it with each aggregation (groups of 8, 16 groups a step, SGD):

# %%
toy = {agg: run_length_toy(agg, steps=150) for agg in ("sequence_mean", "token_mean", "constant")}
print("mean length, start -> after 150 steps:")
for agg, h in toy.items():
    print(f"  {agg:14s} right answers {h['right'][0]:.2f} -> {h['right'][-1]:.2f}   "
          f"wrong answers {h['wrong'][0]:.2f} -> {h['wrong'][-1]:.2f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
for agg, marker in zip(measured, "os^", strict=True):
    ax1.plot(lengths, measured[agg], marker + "-", label=agg)
ax1.set(xlabel="answer length |o_i| (tokens)", ylabel="weight of each of its tokens",
        title="Per-token gradient weight (batch of 5)")
ax1.legend()
for (agg, h), color in zip(toy.items(), ("C0", "C1", "C2"), strict=True):
    ax2.plot(h["wrong"], color=color, label=f"{agg}: wrong")
    ax2.plot(h["right"], "--", color=color, label=f"{agg}: right")
ax2.set(xlabel="GRPO step", ylabel="expected length (tokens)", title="Toy: lengths under each aggregation")
ax2.legend(fontsize="x-small", ncol=2)
fig.tight_layout()
save_figure(fig, "20_grpo_length_bias")
plt.show()

# %% [markdown]
# On the left, GRPO's weight falls as $1/|o_i|$ while the other two are flat. On the right, the
# consequence: under GRPO's per-sequence mean (blue) wrong answers grow from 3 tokens to more
# than 5 and right answers shrink towards the minimum of 2, with a reward that says nothing
# about length; under the token mean and the constant they wander around 3. This is the
# mechanism Liu et al. offer for part of the long, wrong responses of R1-Zero-style training:
# not all of the growth in length is "more reasoning".

# %%
checks = Checks("length bias on the toy")
seq, const = toy["sequence_mean"], toy["constant"]
checks.true("GRPO: wrong answers grow by > 1.5 tokens", seq["wrong"][-1] > seq["wrong"][0] + 1.5)
checks.true("GRPO: right answers shrink by > 0.5 tokens", seq["right"][-1] < seq["right"][0] - 0.5)
for agg in ("token_mean", "constant"):
    h = toy[agg]
    checks.true(f"{agg}: both lengths move by < 0.3", max(abs(h["wrong"][-1] - h["wrong"][0]),
                                                         abs(h["right"][-1] - h["right"][0])) < 0.3)
checks

# %% [markdown]
# ## 20.5 One GRPO step in micro-batches
#
# A batch of $G$ answers to each of many questions rarely fits in memory at once, so the
# gradient is accumulated over micro-batches: forward and backward on a slice, add up the
# gradients, one optimiser step at the end. The slices' losses must be weighted so that the
# sum is the full batch's gradient, and the right weight depends on the aggregation. For the
# per-sequence mean and the constant, a slice of $b$ of the $N$ answers weighs $b/N$. For the
# token mean it must weigh $n_j / N_{\text{tok}}$, its share of the batch's tokens: averaging
# the slices' token means instead gives the tokens of a slice of short answers more weight
# (exercise 4 works out by how much). Each slice is also trimmed to its own longest answer, so
# slices have uneven lengths.

# %%
show_source(grpo_microbatch_step)

# %% [markdown]
# The check, in float64: a GRPO batch sampled from the SFT model (4 questions, $G = 8$; old
# log-probabilities shifted by noise so that the ratios differ from 1 and the clipping is
# active; a KL term with $\beta = 0.04$), the gradient of `grpo_loss` on the whole batch
# against `grpo_microbatch_step` with micro-batches of 5 answers.

# %%
policy64 = load_arithmetic_model("arithmetic_sft")[0].double()
batch = make_grpo_batch(policy64, policy64, train[:4], 8, generator=torch.Generator().manual_seed(1))
batch = batch._replace(old_logprobs=batch.old_logprobs + 0.3 * torch.randn(batch.old_logprobs.shape, generator=g, dtype=f64),
                       advantages=torch.randn(32, generator=g, dtype=f64))  # every answer with a signal


# %%
checks = Checks("micro-batches of 5 against the whole batch of 32 (float64)")
for aggregation in ("sequence_mean", "token_mean", "constant"):
    policy64.zero_grad()
    full = grpo_loss(response_logprobs(policy64, batch.prompts, batch.responses), batch.old_logprobs,
                     batch.ref_logprobs, batch.advantages, batch.mask, 0.2, 0.04, aggregation)
    full.loss.backward()
    expected = gradient_vector(policy64).clone()
    policy64.zero_grad()
    grpo_microbatch_step(policy64, batch, 5, 0.2, 0.04, aggregation)
    checks.close(f"{aggregation}: gradient ({expected.numel():,} entries)", expected, gradient_vector(policy64), tol=1e-12)
checks.true("the clipping is active", full.clip_fraction > 0)
checks.true("answers of uneven lengths", len(set(batch.mask.sum(1).tolist())) > 1)
checks

# %% [markdown]
# ## 20.6 GRPO on arithmetic
#
# The shipped run (`train_grpo`, artifact `arithmetic_grpo`) starts from the SFT model, which
# is also the frozen reference of the KL term. Each of its 200 steps draws 64 training
# questions, samples $G = 8$ answers to each at temperature 1 (512 answers), scores them with
# the verifier, and takes two AdamW steps on that batch (PPO-style reuse: the second step is
# off-policy, so the ratio and its clipping matter), each accumulated over micro-batches of
# 128. It uses GRPO's original choices: the std in the advantage and the per-sequence mean
# (the answers here are 2 to 4 tokens long, and their length is fixed by the sum, so there is
# little room for a length bias).

# %%
grpo, grpo_info = load_arithmetic_model("arithmetic_grpo")
print({k: GRPO_RECIPE[k] for k in ("steps", "prompts_per_step", "group_size", "updates_per_batch",
                                   "lr", "clip_eps", "beta", "aggregation", "normalize_std")})
curve = grpo_info["curve"]
print(f"trained in {grpo_info['train_seconds']:.0f} s on one core of an {grpo_info['made']['cpu']} shared "
      f"with other work (the SFT model in {sft_info['train_seconds']:.0f} s)")
print(f"mean answer length per batch: {min(curve['length']):.1f} to {max(curve['length']):.1f} tokens, "
      f"{sum(curve['length']) / len(curve['length']):.1f} over the run")

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
axes[0].plot(curve["eval_steps"], curve["test_accuracy"], "o-", label="held-out, greedy")
axes[0].plot(curve["reward"], alpha=0.6, label="training batch: mean reward (sampled)")
axes[0].set(xlabel="GRPO step", ylabel="accuracy", title="Accuracy during GRPO")
axes[0].legend(fontsize="small")
axes[1].plot(curve["kl"])
axes[1].set(xlabel="GRPO step", ylabel="k3 KL (nats / token)", title="KL to the SFT model")
axes[2].plot(curve["clip_fraction"], label="clip fraction")
axes[2].plot([x / 10 for x in curve["length"]], label="mean answer length / 10")
axes[2].set(xlabel="GRPO step", title="Clipped tokens and length")
axes[2].legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "20_grpo_training")
plt.show()

# %% [markdown]
# Held-out greedy accuracy dips in the first steps (a new optimiser's first updates are
# large), then climbs from 0.39 to about 0.8, and the mean reward of the sampled training
# answers from 0.2 to almost 0.6: the model got better at addition, not only more confident.
# The KL to the SFT model grows to about 0.3 nats per token, and about 5 % of the tokens are
# clipped in the second update of each batch. The length stays at 3.5 tokens (3.3 to 3.7 per
# batch), as it must here.
#
# Now both shipped models on the 500 held-out problems, greedy and sampled (8 answers per
# problem at temperature 1, seeded):

# %%
sampled = {}
for name, model in (("SFT", sft), ("GRPO", grpo)):
    sampled[name] = accuracy(model, test, 1.0, 8, torch.Generator().manual_seed(GRPO_RECIPE["eval_seed"]))
grpo_greedy = accuracy(grpo, test)
print(f"{'':6s} {'greedy':>7s} {'sampled':>8s}")
for name, greedy in (("SFT", sft_greedy), ("GRPO", grpo_greedy)):
    print(f"{name:6s} {greedy:7.2f} {sampled[name]:8.2f}")
scores = grpo_info["scores"]
checks = Checks("accuracy before and after GRPO")
for what, stored, now in (("greedy after", scores["grpo_greedy"], grpo_greedy),
                          ("sampled before", scores["sft_sampled"], sampled["SFT"]),
                          ("sampled after", scores["grpo_sampled"], sampled["GRPO"])):
    checks.true(f"{what} = at training time (±0.005)", abs(stored - now) <= 0.005)
checks.true("GRPO raises greedy accuracy by > 0.3", grpo_greedy > sft_greedy + 0.3)
checks.true("GRPO raises sampled accuracy by > 0.3", sampled["GRPO"] > sampled["SFT"] + 0.3)
checks

# %% [markdown]
# ## 20.7 Self-consistency: majority voting
#
# Instead of one answer, sample $n$ and return the most frequent (Wang et al., 2023,
# "Self-Consistency Improves Chain of Thought Reasoning in Language Models"). When there are
# only two possible answers, right with probability $p$, the vote is right when more than half
# the samples are:
#
# $$ P_n(p) = \sum_{k > n/2} \binom{n}{k} p^k (1-p)^{n-k} . $$

# %%
p, n, delta = sp.Symbol("p", positive=True), sp.Symbol("n", positive=True), sp.Symbol("delta", positive=True)
for k in (1, 3, 5):
    display(sp.Eq(sp.Symbol(f"P_{k}"), sp.factor(majority_probability_symbolic(k).doit())))
print("exact P_n(0.6):", [f"{float(majority_probability_symbolic(k).doit().subs(p, sp.Rational(3, 5))):.4f}"
                          for k in (1, 11, 101)], " P_n(0.4):",
      [f"{float(majority_probability_symbolic(k).doit().subs(p, sp.Rational(2, 5))):.4f}" for k in (1, 11, 101)])

# %% [markdown]
# $P_n(p) \to 1$ for $p > 1/2$ and $\to 0$ for $p < 1/2$. SymPy cannot take the limit of the
# sum directly, but a bound does it: the number of right votes is a sum of $n$ independent
# indicators with mean $np$, and by Hoeffding's inequality it falls to $n/2$ or below with
# probability at most $e^{-2n(p - 1/2)^2}$. For $p = 1/2 + \delta$ that bound tends to 0, so
# $P_n \to 1$; for $p < 1/2$ the same argument applied to the wrong votes gives $P_n \to 0$.

# %%
bound = sp.exp(-2 * n * delta**2)
assert sp.limit(bound, n, sp.oo) == 0
display(sp.Eq(sp.Limit(bound, n, sp.oo), 0))
checks = Checks("majority of two answers")
for k in (1, 5, 21, 51):
    checks.true(f"n = {k}: 1 - P_n(0.6) <= Hoeffding bound",
                1 - majority_probability(0.6, k) <= float(bound.subs({n: k, delta: sp.Rational(1, 10)})))
checks.close("P_n(0.6) = sympy's sum, n = 11", float(majority_probability_symbolic(11).doit().subs(p, sp.Rational(3, 5))),
             majority_probability(0.6, 11), tol=1e-14)
checks

# %% [markdown]
# **Measured.** 64 answers at temperature 1 to each of the first 200 held-out problems, from
# each model (seeded), give for every problem the fraction $\hat p_i$ of right answers. The
# two-answer formula then predicts the accuracy of a vote over "right or wrong"; a real vote is
# over the *answers* (a plurality vote, `plurality_vote`), in which the wrong answers split
# their votes among many values. The plurality vote is right at least whenever more than half
# are right, so the formula is a lower bound for it. `vote_accuracy` cuts each problem's 64
# samples into disjoint blocks of $n$ and averages over the blocks.

# %%
problems, S = test[:200], 64
truths = problems.sum(1).tolist()
answers, texts = {}, {}
for name, model in (("SFT", sft), ("GRPO", grpo)):
    responses = sample_responses(model, problems, S, 1.0, torch.Generator().manual_seed(0))
    texts[name] = [decode(r) for r in responses]  # (200 S,) strings, kept for section 20.10
    flat = [parse_answer(t) for t in texts[name]]
    answers[name] = [flat[i * S:(i + 1) * S] for i in range(len(problems))]
num_right = {name: torch.tensor([sum(a == t for a in ans) for ans, t in zip(answers[name], truths, strict=True)])
             for name in answers}
p_hat = {name: c.double() / S for name, c in num_right.items()}

# %%
votes = (1, 3, 5, 9, 17, 33, 63)
binary = {name: [[int(a == t) for a in ans] for ans, t in zip(answers[name], truths, strict=True)] for name in answers}
table, rows = {}, []
for name in answers:
    table[name] = [(vote_accuracy(answers[name], truths, k), vote_accuracy(binary[name], [1] * len(truths), k),
                    float(majority_probability(p_hat[name], k).mean())) for k in votes]
    rows.append(f"{name}: n  plurality vote  right-or-wrong vote  formula mean_i P_n(p_i)")
    rows += [f"  {k:6d} {plural:15.2f} {two:20.2f} {formula:25.2f}"
             for k, (plural, two, formula) in zip(votes, table[name], strict=True)]
print("\n".join(rows))

# %% [markdown]
# The formula predicts the right-or-wrong vote closely (the blocks are drawn without
# replacement from 64 samples, the formula assumes independent draws, hence small
# differences). For the SFT model it predicts a vote that gets *worse* with $n$, since on
# almost every problem $\hat p_i < 1/2$, while the real plurality vote improves from 0.19 to
# about 0.3: its wrong answers disagree with each other, so the right one is often the most
# frequent although it is rarely the majority. The limit of the plurality vote as
# $n\to\infty$ is the fraction of problems whose *most likely* answer is right, estimated by the
# vote over all 64 samples. For GRPO the right answer is the majority on most problems and
# voting lifts it from 0.56 to about 0.75.

# %%
checks = Checks("self-consistency on the shipped models")
for name in answers:
    worst = max(abs(two - formula) for _, two, formula in table[name])
    checks.true(f"{name}: right-or-wrong vote within 0.04 of the formula", worst < 0.04, round(worst, 2))
    checks.true(f"{name}: plurality vote >= formula - 0.01 (a lower bound)",
                all(plural >= formula - 0.01 for plural, _, formula in table[name]))
    checks.true(f"{name}: voting over 33 beats one sample by > 0.1", table[name][5][0] > table[name][0][0] + 0.1)
mode_right = {name: sum(plurality_vote(a) == t for a, t in zip(answers[name], truths, strict=True)) / len(truths)
              for name in answers}
print("limit estimates (vote over all 64):", {k: round(v, 2) for k, v in mode_right.items()},
      " share of problems with p_i > 1/2:", {k: round(float((v > 0.5).double().mean()), 2) for k, v in p_hat.items()})
print("share of groups of 8 with no signal, mean_i p_i^8 + (1 - p_i)^8:",
      {k: round(float((v**8 + (1 - v) ** 8).mean()), 2) for k, v in p_hat.items()})
checks

# %% [markdown]
# (The last line is section 20.3's blind spot measured: for the SFT model about 30 % of the
# groups of 8 would carry no signal at all, most of them all wrong.)
#
# ## 20.8 Best-of-N with a verifier, and pass@k
#
# With a verifier the best of $N$ samples is right when *any* of them is. For independent
# samples right with probability $p$ that is one minus the probability that all are wrong,
# and it equals the binomial sum over $k \ge 1$ right samples:
#
# $$ \text{pass@}N = 1 - (1-p)^N = \sum_{k\ge 1}\binom{N}{k}p^k(1-p)^{N-k} . $$
#
# With a continuous score instead (a reward model's), best-of-$N$ keeps the sample with the
# largest score, and the expected maximum of $N$ i.i.d. draws with CDF $F$ follows from
# $P(\max \le x) = F(x)^N$: $\mathbb E[\max] = \int x \, d F(x)^N$. For uniform scores that is
# $N/(N+1)$; for Gaussian ones it grows like $\sqrt{2\ln N}$, slowly, which is why best-of-$N$
# against a reward model buys less and less with $N$ (Gao et al., 2023, "Scaling Laws for
# Reward Model Overoptimization", use exactly this in its KL form).

# %%
N, k = sp.Symbol("N", positive=True, integer=True), sp.Symbol("k", integer=True)
for m in (1, 2, 5, 8):
    assert sp.expand(sp.Sum(sp.binomial(m, k) * p**k * (1 - p) ** (m - k), (k, 1, m)).doit() - (1 - (1 - p) ** m)) == 0
display(sp.Eq(sp.Symbol(r"\mathbb{E}[\max_{N}\ \mathrm{Uniform}]"), expected_max_uniform_symbolic()))
rows = [f"{'N':>6s} {'E[max] Gaussian':>16s} {'sqrt(2 ln N)':>13s} {'ratio':>6s}"]
for m in (2, 10, 100, 1000, 10_000):
    e_max, approx = expected_max_gaussian(m), float(sp.sqrt(2 * sp.log(m)))
    rows.append(f"{m:6d} {e_max:16.4f} {approx:13.4f} {e_max / approx:6.3f}")
print("\n".join(rows))

# %% [markdown]
# **pass@k from $n$ samples.** To measure pass@$k$ one draws $n \ge k$ samples per problem,
# counts the $c$ right ones, and estimates the probability that $k$ samples drawn without
# replacement from them include a right one (Chen et al., 2021, "Evaluating Large Language
# Models Trained on Code"):
#
# $$ \widehat{\text{pass@}k} = 1 - \binom{n-c}{k}\Big/\binom{n}{k} . $$
#
# Its expectation over $c \sim \text{Binomial}(n, p)$ is exactly $1-(1-p)^k$, which SymPy
# confirms for $n = 8$ and every $k$; the plug-in $1 - (1 - c/n)^k$ is biased low (exercise 2).
# The code uses Chen et al.'s product form, which does not overflow for large $n$:

# %%
show_source(pass_at_k)

# %%
checks = Checks("the pass@k estimator")
for kk in range(1, 9):
    checks.true(f"unbiased: E[estimate] = 1 - (1-p)^{kk}, n = 8",
                sp.expand(expected_pass_at_k_symbolic(8, kk) - (1 - (1 - p) ** kk)) == 0)
checks.close("n = 10, c = 3, k = 2: 1 - C(7,2)/C(10,2) = 8/15", 8 / 15, pass_at_k(10, 3, 2), tol=1e-15)
checks.close("k = 1 is the fraction right", num_right["SFT"].double() / S, pass_at_k(S, num_right["SFT"], 1), tol=1e-15)
checks

# %% [markdown]
# ## 20.9 Accuracy against the number of samples
#
# The test-time-compute plot: for $N = 1, \dots, 64$ samples, pass@$N$ (best-of-$N$ with the
# exact verifier, unbiased estimate from the 64 samples) and the plurality vote over $N$
# samples, before and after GRPO, with greedy decoding as a reference line.

# %%
grid = [1, 2, 4, 8, 16, 32, 64]
vote_grid = [1, 3, 5, 9, 17, 33, 63]
pass_curve = {name: [float(pass_at_k(S, num_right[name], m).mean()) for m in grid] for name in answers}
vote_curve = {name: [vote_accuracy(answers[name], truths, m) for m in vote_grid] for name in answers}
greedy_200 = {"SFT": accuracy(sft, problems), "GRPO": accuracy(grpo, problems)}
fig, ax = plt.subplots(figsize=(7, 4.2))
for name, color in (("SFT", "C0"), ("GRPO", "C3")):
    ax.plot(grid, pass_curve[name], "o-", color=color, label=f"{name}: pass@N (verifier)")
    ax.plot(vote_grid, vote_curve[name], "s--", color=color, label=f"{name}: majority vote of N")
    ax.axhline(greedy_200[name], color=color, lw=0.8, ls=":", label=f"{name}: greedy")
ax.set_xscale("log", base=2)
ax.set(xlabel="number of samples N", ylabel="accuracy (200 held-out problems)",
       title="Test-time compute before and after GRPO")
ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
save_figure(fig, "20_grpo_test_time")
plt.show()

# %% [markdown]
# Three things to see. GRPO lifts every curve at small $N$: pass@1 from about 0.19 to 0.56,
# majority vote from about 0.3 to 0.75. Voting helps both models but saturates, at the
# fraction of problems whose most likely answer is right. And with a verifier the two models
# meet: at $N = 64$ both solve 99 % of the problems. The SFT model could already produce the
# right answer to nearly every problem; what RL changed is *how often* it does. Yue et al.
# (2025, "Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the
# Base Model?") report the same pattern for large reasoning models: RL raises pass@1 while
# pass@$k$ at large $k$ stays where the base model had it, or falls.
#
# Two smaller observations. Greedy decoding (dotted) is about as good as a vote over dozens
# of samples here: taking the most likely token at each step already finds the most likely
# answer of a 3-token response most of the time. And the plug-in estimate
# $1-(1-\hat p)^N$ lies below the unbiased one for every problem, since
# $\binom{n-c}{k}/\binom nk = \prod_{i<k}\frac{n-c-i}{n-i} \le (1-c/n)^k$.

# %%
checks = Checks("test-time compute")
checks.true("GRPO: pass@1 > SFT's by > 0.3", pass_curve["GRPO"][0] > pass_curve["SFT"][0] + 0.3)
checks.true("pass@64 within 0.03 of each other", abs(pass_curve["GRPO"][-1] - pass_curve["SFT"][-1]) < 0.03)
checks.true("both pass@64 > 0.95", min(pass_curve["GRPO"][-1], pass_curve["SFT"][-1]) > 0.95)
checks.true("pass@N increases with N", all(a < b for c in pass_curve.values() for a, b in zip(c, c[1:], strict=False)))
plug_in = {name: [float(pass_at_n(p_hat[name], m).mean()) for m in grid] for name in answers}
checks.true("plug-in 1 - (1 - c/n)^N <= unbiased estimate, every N", all(
    a <= b + 1e-12 for name in answers for a, b in zip(plug_in[name], pass_curve[name], strict=True)))
checks.true("the verifier beats voting at every N > 1", all(
    pv[i] > vc[i] for pv, vc in zip(pass_curve.values(), vote_curve.values(), strict=True) for i in range(1, 7)))
checks

# %% [markdown]
# ## 20.10 Reading the answer out of free text
#
# The arithmetic verifier is strict: it accepts `"19$"` and nothing else. A reasoning model
# writes a derivation and then its answer in the format it was taught: GSM8K's `#### 72`
# (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems"), MATH's
# `\boxed{72}`, or a sentence. The parser is part of the reward: one that reads the wrong
# number rewards a wrong answer, one that is too strict punishes a right one.
# `parse_numeric_answer` (in `llmbook.alignment.answers`) returns an exact `Fraction`, so
# that "1,234" and "1234" are one answer, and follows a fixed precedence: the
# last `####`, else the last `\boxed{}` (braces matched, so a `\frac` inside is read),
# else the first number after the last "answer is", else the last number.
# `parse_choice_answer` reads a multiple-choice letter and never takes the article "A" for
# one. The strings below are hard cases from the tests, each with the answer a careful
# reader would give:

# %%
show_source(parse_numeric_answer)

# %%
numeric_cases = [  # (text, the answer a careful reader gives)
    ("She sold 48 in April and half as many in May.\n#### 72", "72"),
    ("#### 5 was a draft; the final:\n#### 7", "7"),
    (r"First \boxed{3}, then corrected to \boxed{4}.", "4"),
    (r"\boxed{-\dfrac{3}{4}}", "-3/4"),
    (r"\boxed{\$1,234.50}", "2469/2"),
    (r"\boxed{x = 5}", None),
    ("The answer is 42. Check: 40 + 2 = 42, not 41.", "42"),
    ("a loss of -$12.50.", "-25/2"),
    ("1,234,567 people", "1234567"),
    ("the list 1,2,3", "3"),
    ("pages 3-4", "4"),
    ("H2O has 3 atoms", "3"),
]
choice_cases = [("the answer is D.", "D"), ("Answer: c", "C"), ("A good answer is (C).", "C"),
                ("A is wrong and B is right", None), ("I'd say (B), not (E)", "B"),
                ("the answer is a bit unclear", None), (r"\boxed{\text{B}}", "B")]
checks = Checks("answer parsers on adversarial strings")
for text, expected in numeric_cases:
    got = parse_numeric_answer(text)
    checks.equal(repr(text)[:44], expected, None if got is None else str(got))
for text, expected in choice_cases:
    checks.equal(repr(text)[:44] + " (choices A-D)", expected, parse_choice_answer(text))
checks

# %% [markdown]
# **A vote over texts.** `majority_vote` parses each response and returns the most frequent
# answer, with the tie rule of `plurality_vote` (section 20.7), which it generalises from
# integers to any answer a parser returns (fractions, letters). On the 64 sampled responses
# of section 20.7 it must reproduce the votes computed there. The cell also counts the
# responses on which the lenient `parse_numeric_answer` and the task's strict `parse_answer`
# give different verdicts (an answer without its end token, or with a leading zero, is
# right for the one and wrong for the other):

# %%
checks = Checks("majority_vote on the sampled texts of section 20.7")
for name in texts:
    groups = [texts[name][i * S:(i + 1) * S] for i in range(len(problems))]
    checks.equal(f"{name}: = plurality_vote of the parsed answers, all {len(groups)} problems",
                 [plurality_vote(a) for a in answers[name]], [majority_vote(t, parse_answer) for t in groups])
    truth_per_text = [t for t in truths for _ in range(S)]
    strict = [parse_answer(t) == truth for t, truth in zip(texts[name], truth_per_text, strict=True)]
    lenient = [parse_numeric_answer(t) == truth for t, truth in zip(texts[name], truth_per_text, strict=True)]
    differ = sum(a != b for a, b in zip(strict, lenient, strict=True))
    print(f"{name}: the two parsers disagree on {differ} of {len(strict)} responses "
          f"({differ / len(strict):.2%}); strict accuracy {sum(strict) / len(strict):.3f}, "
          f"lenient {sum(lenient) / len(lenient):.3f}")
checks

# %% [markdown]
# They almost never disagree here: after SFT the model writes its answers in the one format
# it was trained on. The parser matters when the format is free, as in the strings above;
# an RL run against a lenient parser can also teach a model to exploit it (a "number
# somewhere in the text" rule rewards listing many numbers).
#
# **pass@k by its definition.** Section 20.8 used the closed form
# $1 - \binom{n-c}{k}/\binom{n}{k}$ in Chen et al.'s product form
# $1 - \prod_{i=n-c+1}^{n}(1 - k/i)$. Both can be checked against the definition itself:
# the fraction of the $\binom nk$ subsets of $k$ samples that contain a right one, counted
# by enumerating them (`pass_at_k_enumerated`). SymPy first shows the two closed forms equal
# for symbolic $n$ and $k$ (the ratio of binomials telescopes into the product):

# %%
n_, k_, i_ = sp.symbols("n k i", positive=True, integer=True)
for c_ in range(1, 5):
    ratio = sp.combsimp(sp.binomial(n_ - c_, k_) / sp.binomial(n_, k_))
    assert sp.simplify(ratio - sp.Product(1 - k_ / i_, (i_, n_ - c_ + 1, n_)).doit()) == 0
display(sp.Eq(sp.binomial(n_ - 3, k_) / sp.binomial(n_, k_), sp.Product(1 - k_ / i_, (i_, n_ - 2, n_))))
checks = Checks("pass@k: closed form against all k-subsets")
worst, subsets = 0.0, 0
for name in answers:
    for i in range(5):  # the first 12 samples of 5 problems: every k = 1 .. 12
        right = [a == truths[i] for a in answers[name][i][:12]]
        for kk in range(1, 13):
            worst = max(worst, abs(float(pass_at_k_enumerated(right, kk)) - pass_at_k(12, sum(right), kk)))
            subsets += math.comb(12, kk)
checks.close(f"max |enumerated - pass_at_k| over {subsets:,} subsets", 0.0, worst, tol=1e-15)
checks

# %% [markdown]
# ## 20.11 RL for reasoning as practised now: Dr. GRPO, DAPO, GSPO
#
# Within a year of DeepSeek-R1, three corrections of GRPO became standard options of the
# libraries that train reasoning models (trl's `GRPOTrainer` has each as a setting). Each
# changes a line or two of the loss, in `llmbook.alignment.rl_variants`, and each comes with
# an argument about what GRPO gets wrong:

# %%
for name, settings in VARIANTS.items():
    print(f"{name:8s}", {k: v for k, v in settings.items()})

# %% [markdown]
# ### Dr. GRPO: the std in the advantage changes the objective
#
# Section 20.4 derived the first bias that Liu et al. (2025) remove, the $1/|o_i|$ of the
# per-sequence mean. The second is the division by the group's std. Take one question that
# the policy answers right with probability $p = \sigma(\theta)$, so that
# $\partial_\theta \log\pi(o) = o - p$ for an answer $o \in \{0, 1\}$. A group of $G$ answers
# with $c$ right pushes $\theta$ by $\sum_i A_i (o_i - p) = c\,A_{\text{right}}$ (the
# advantages sum to zero). Without the std, $A_{\text{right}} = 1 - c/G$ and the expectation
# over $c \sim \text{Binomial}(G, p)$ is $(G-1)\,p(1-p) = (G-1)\,\partial_\theta p$: the true
# gradient of the accuracy, scaled. With the std, the push is divided by about
# $\sqrt{p(1-p)}$, and the update becomes $(G-1)\sqrt{p(1-p)}$ for large $G$. That is the
# gradient of a different objective, $F(p) = 2\arcsin\sqrt p$, whose slope in $p$,
# $1/\sqrt{p(1-p)}$, is largest for the questions the policy almost never or almost always
# gets right. SymPy derives both:

# %%
show_source(expected_group_gradient)

# %%
arc = arcsine_objective_symbolic()
display(sp.Eq(sp.Symbol(r"\mathbb{E}[c\,(1 - c/G)]"), arc["no_std"]),
        sp.Eq(sp.Symbol(r"F(p)"), arc["F"]),
        sp.Eq(sp.Symbol(r"\frac{dF}{dp}\,\frac{dp}{d\theta}"), arc["dF_dtheta"]))
checks = Checks("the std bias: exact expected updates (G answers, Bernoulli policy)")
checks.close("no std, G = 8, p = 0.3: (G - 1) p (1 - p)", 7 * 0.3 * 0.7, expected_group_gradient(0.3, 8, False), tol=1e-14)
for G_ in (4, 8):
    checks.close(f"with std, G = {G_}, p = 0.1: closed sum = all 2^G outcomes by autograd",
                 expected_group_gradient_enumerated(0.1, G_, True), expected_group_gradient(0.1, G_, True), tol=1e-13)
checks.close("with std, G = 256, p = 0.1: / (G - 1) sqrt(p (1 - p)) -> 1", 1.0,
             expected_group_gradient(0.1, 256, True) / (255 * math.sqrt(0.09)), tol=0.01)
checks

# %% [markdown]
# How much does it matter at the book's $G = 8$? The table divides the expected update with
# the std by the one without, per question difficulty, next to the large-$G$ limit
# $1/\sqrt{p(1-p)}$; then it weighs the 200 held-out problems of section 20.7 by each rule,
# with the SFT model's measured $\hat p_i$, and reports the share of the total update that goes
# to hard problems ($\hat p_i < 1/4$):

# %%
rows = [f"{'p':>6s} {'with std / without, G = 8':>26s} {'limit 1/sqrt(p(1-p))':>21s}"]
for pp in (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 7 / 8):
    rows.append(f"{pp:6.3f} {expected_group_gradient(pp, 8, True) / expected_group_gradient(pp, 8, False):26.2f} "
                f"{1 / math.sqrt(pp * (1 - pp)):21.2f}")
print("\n".join(rows))
inside = [float(x) for x in p_hat["SFT"] if 0 < x < 1]  # p = 0 or 1: no update either way
push = {std: [expected_group_gradient(x, 8, std) for x in inside] for std in (True, False)}
hard_share = {std: sum(w for w, x in zip(push[std], inside, strict=True) if x < 0.25) / sum(push[std])
              for std in push}
print(f"share of the expected update on problems with p_i < 1/4 (SFT model, {len(inside)} problems with "
      f"0 < p_i < 1): with std {hard_share[True]:.2f}, without {hard_share[False]:.2f}")

# %% [markdown]
# The std multiplies the push on a question right one time in eight by more than it does
# on a coin-flip question, and the large-$G$ limit says by how much more as $G$ grows (at
# $G = 8$ the groups with no right answer at all, which get no push, hold the extremes
# back). On the book's SFT model, whose $\hat p_i$ are mostly small, the shift of weight
# towards the hardest problems is modest. Whether that is good is a choice, not a law: it is a curriculum that favours the
# extremes. Dr. GRPO's point is that it is a choice GRPO makes silently, and that without it
# the update is the gradient of the expected reward.
#
# ### DAPO: clip-higher, token-level loss, dynamic sampling
#
# Yu et al. (2025) make three changes (and drop the KL term). **Clip-higher**: PPO's clip
# $\rho \le 1 + \varepsilon$ bounds how much one update can raise a token's probability
# *relative to its old value*, so a token at $\pi_{\text{old}} = 0.01$ can go to
# $0.01(1+\varepsilon)$ and one at 0.9 to 1: the clip protects likely tokens and starves
# unlikely ones, which DAPO blames for the collapse of entropy during training. It raises
# the upper bound alone ($\varepsilon_{\text{high}} > \varepsilon_{\text{low}}$). **Token-level
# loss**: section 20.4's token mean, with the batch's token count as the normaliser so that
# micro-batches add up. **Dynamic sampling**: drop the groups whose rewards are all equal (no
# signal, section 20.3) and sample more prompts to refill the batch.

# %%
show_source(dapo_loss)

# %%
print("largest probability after one update, pi_old (1 + eps_high), capped at 1:")
for p_old in (0.01, 0.1, 0.5, 0.9):
    print(f"  pi_old = {p_old:4.2f}:  eps_high = 0.2 -> {min(1.0, p_old * 1.2):.4f},   "
          f"0.28 -> {min(1.0, p_old * 1.28):.4f}")
silent_measured, silent_predicted = {}, {}
for name in answers:
    binary_rewards = torch.tensor([b for row in binary[name] for b in row], dtype=f64)  # (200 * 64,)
    kept = informative_groups(binary_rewards, 8)  # (200 * 8,)
    silent_measured[name] = 1 - float(kept.double().mean())
    silent_predicted[name] = float((p_hat[name] ** 8 + (1 - p_hat[name]) ** 8).mean())
    print(f"{name}: groups of 8 that dynamic sampling drops: {silent_measured[name]:.3f} measured, "
          f"{silent_predicted[name]:.3f} predicted by mean_i p_i^8 + (1 - p_i)^8")
checks = Checks("DAPO")
lp = response_logprobs(policy64, batch.prompts, batch.responses).detach()
checks.close("dapo_loss = grpo_loss(token mean, eps_high = 0.28) on the batch of 20.5",
             grpo_loss(lp, batch.old_logprobs, None, batch.advantages, batch.mask, 0.2, 0.0, "token_mean",
                       clip_eps_high=0.28).loss,
             dapo_loss(lp, batch.old_logprobs, batch.advantages, batch.mask), tol=1e-15)
n_tok = int(batch.mask.sum())
checks.close("micro-batches of 5 with the batch's token count add up to the batch", dapo_loss(
    lp, batch.old_logprobs, batch.advantages, batch.mask), sum(
    dapo_loss(lp[j:j + 5], batch.old_logprobs[j:j + 5], batch.advantages[j:j + 5], batch.mask[j:j + 5],
              num_tokens=n_tok) for j in range(0, 32, 5)), tol=1e-15)
for name in answers:
    checks.close(f"{name}: dropped share = the silent-group formula (the blocks are drawn without replacement)",
                 silent_predicted[name], silent_measured[name], tol=0.03)
checks

# %% [markdown]
# ### GSPO: one importance ratio per sequence
#
# The reward is given to a whole answer, but GRPO's ratio and clipping act per token. Zheng
# et al. (2025, "Group Sequence Policy Optimization") argue that the per-token ratios are
# noisy estimates of a correction that only makes sense per sequence, and that their noise
# accumulates over long answers and destabilises training (they trained Qwen3's large
# mixture-of-experts models this way). GSPO uses one ratio per sequence, the geometric mean
# of the token ratios,
#
# $$ s_i = \Big(\frac{\pi_\theta(o_i \mid q)}{\pi_{\text{old}}(o_i \mid q)}\Big)^{1/|o_i|}
#    = \exp\Big(\frac{1}{|o_i|}\sum_t \log\frac{\pi_\theta(o_{i,t}\mid q, o_{i,<t})}{\pi_{\text{old}}(o_{i,t}\mid q, o_{i,<t})}\Big), $$
#
# and clips $s_i$, with a range so narrow ($1 \pm$ a few $10^{-4}$) that whole answers are
# dropped from an update when the policy has moved on them. Two special cases tie it to
# GRPO: with one-token answers $s_i$ is the token ratio, and on-policy ($s_i = 1$ in value)
# $\nabla s_i = \frac{1}{|o_i|}\sum_t \nabla\log\pi_{i,t}$, the gradient of GRPO's per-sequence
# mean. Both are checked below through the book's model, with the batch of section 20.5.

# %%
show_source(gspo_loss)

# %%
token_log_ratio = (lp - batch.old_logprobs)[batch.mask]
seq_log_ratio = sequence_log_ratio(lp, batch.old_logprobs, batch.mask)
print(f"std of the log ratio: per token {float(token_log_ratio.std()):.3f}, per sequence "
      f"{float(seq_log_ratio.std()):.3f} (the batch of 20.5, old log-probs perturbed by noise of 0.3)")
g_eps = VARIANTS["gspo"]
clip_grpo = grpo_loss(lp, batch.old_logprobs, None, batch.advantages, batch.mask, 0.2, 0.0).clip_fraction
clip_gspo = gspo_loss(lp, batch.old_logprobs, None, batch.advantages, batch.mask, g_eps["clip_eps"], 0.0,
                      g_eps["clip_eps_high"]).clip_fraction
print(f"clipped: GRPO (eps = 0.2) {float(clip_grpo):.2f} of the tokens, "
      f"GSPO (its narrow range) {float(clip_gspo):.2f} of the sequences")

# %%
checks = Checks("GSPO special cases, through the model (float64)")
one = batch.mask.clone()
one[:, 1:] = False  # every answer cut to its first token
checks.close("one-token answers: gspo_loss = grpo_loss",
             grpo_loss(lp, batch.old_logprobs, batch.ref_logprobs, batch.advantages, one, 0.2, 0.04).loss,
             gspo_loss(lp, batch.old_logprobs, batch.ref_logprobs, batch.advantages, one, 0.2, 0.04).loss, tol=1e-15)
grads = {}
for name, loss_fn in (("grpo", lambda x: grpo_loss(x, None, None, batch.advantages, batch.mask, 0.2, 0.0).loss),
                      ("gspo", lambda x: gspo_loss(x, None, None, batch.advantages, batch.mask, 3e-4, 0.0, 4e-4).loss)):
    policy64.zero_grad()
    loss_fn(response_logprobs(policy64, batch.prompts, batch.responses)).backward()
    grads[name] = gradient_vector(policy64).clone()
checks.close(f"on-policy: GSPO's gradient = GRPO's (sequence mean), {grads['gspo'].numel():,} parameters",
             grads["grpo"], grads["gspo"], tol=1e-13)
checks.true("the gradients are not zero", float(grads["gspo"].abs().max()) > 1e-3)
checks

# %% [markdown]
# ## 20.12 The four methods on the arithmetic task
#
# Do the corrections matter on the book's task? `data/make_grpo_variants.py` trains the SFT
# model with each method of `VARIANTS` (`train_variant`), with one recipe and one seed and
# no KL term for any of them, and ships the curves; the notebook loads them. Here the answers
# are 2 to 4 tokens long and their length is fixed by the sum, so the length corrections have
# little to act on: what differs is the std (Dr. GRPO), clip-higher and dynamic sampling
# (DAPO), and the sequence-level ratio with its narrow clip (GSPO).

# %%
variant_runs = json.loads(data_path("grpo_variants", "results.json").read_text())
recipe_v, runs = variant_runs["recipe"], variant_runs["runs"]
print({k: recipe_v[k] for k in ("steps", "prompts_per_step", "group_size", "updates_per_batch", "lr")})
print(f"{'':8s} {'greedy':>7s} {'sampled':>8s} {'answers sampled':>16s} {'mean reward, last 10 steps':>27s}")
for name, run in runs.items():
    reward_tail = sum(run["curve"]["reward"][-10:]) / 10
    print(f"{name:8s} {run['greedy']:7.3f} {run['sampled']:8.3f} {sum(run['curve']['generated']):16,d} "
          f"{reward_tail:27.3f}")
print(f"start (the SFT model): greedy {sft_greedy:.3f}, sampled {sampled['SFT']:.3f}")

# %%
sampled_by = {}  # answers sampled before each evaluation, per run
for name, run in runs.items():
    c = run["curve"]
    cumulative = [0] + [sum(c["generated"][:s_]) for s_ in range(1, len(c["generated"]) + 1)]
    sampled_by[name] = [cumulative[s_] for s_ in c["eval_steps"]]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
for name, run in runs.items():
    c = run["curve"]
    ax1.plot(c["eval_steps"], c["test_accuracy"], "o-", label=name)
    ax2.plot([x / 1000 for x in sampled_by[name]], c["test_accuracy"], "o-", label=name)
ax1.set(xlabel="step (two updates each)", ylabel="held-out greedy accuracy", title="Accuracy per step")
ax2.set(xlabel="answers sampled (thousands)", ylabel="held-out greedy accuracy", title="Accuracy per answer sampled")
ax1.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "20_grpo_variants")
plt.show()
budget = min(sampled_by[name][-1] for name in runs)
for name in runs:
    at = max(i for i, x in enumerate(sampled_by[name]) if x <= budget)
    print(f"{name:8s} after {sampled_by[name][at]:,} answers sampled (step {runs[name]['curve']['eval_steps'][at]}): "
          f"greedy {runs[name]['curve']['test_accuracy'][at]:.3f}")

# %%
checks = Checks("the shipped comparison")
g_re = torch.Generator().manual_seed(recipe_v["seed"])  # the first batch of every run, redrawn here
first = make_grpo_batch(sft, None, train[torch.randint(len(train), (recipe_v["prompts_per_step"],), generator=g_re)],
                        recipe_v["group_size"], recipe_v["temperature"], True, g_re)
for name, run in runs.items():
    checks.close(f"{name}: first batch's mean reward, recomputed = shipped (±0.005)", float(first.rewards.mean()),
                 run["curve"]["reward"][0], tol=0.005)
checks

# %% [markdown]
# Per step, DAPO is ahead of the other three by the end of the run; GRPO, Dr. GRPO and GSPO
# end close together. But DAPO's steps are not the same size: dynamic sampling drops the
# silent groups and refills the batch from a second round of sampling, so it drew twice as
# many answers. Per answer sampled (right panel) its lead is gone. With one seed per method,
# differences of a few points between the other three are within what another seed could
# change; the comparison says that on a task this short and this easy to verify none of the
# corrections is decisive, and that a method that samples more must be compared at equal
# sampling. What the corrections fix (a length bias, a silent curriculum, a token-level
# ratio that is noisy on long answers) grows with the length of the answers, which is where
# their papers measured them.

# %% tags=["nbval-ignore-output"]
print(f"notebook ran in {time.perf_counter() - began:.0f} s")

# %% [markdown]
# ## Summary
#
# * A **verifiable reward** is a program: here a parser and an exact comparison. It cannot be
#   flattered, but it gives no signal on questions the policy always or never gets right.
# * **GRPO** replaces PPO's value network by the group mean:
#   $A_i = (r_i - \bar r)/\operatorname{std}(r)$ over $G$ answers to one question, then PPO's
#   clipped surrogate with a KL penalty. On the book's addition task it lifts held-out accuracy
#   from 0.39 to 0.78 (greedy) and from 0.19 to 0.57 (sampled) in 200 steps.
# * **Aggregation is not a detail.** GRPO's per-sequence mean weighs a token by $1/|o_i|$, so the
#   expected gradient $A\,q(1-q)(1/L_2 - 1/L_1)$ lengthens wrong answers and shortens right ones
#   although the reward ignores length; a constant normaliser (Dr. GRPO) removes the bias, and
#   DAPO's token mean nearly does. Micro-batches must be weighted by the aggregation's own
#   normaliser, or the accumulated gradient is not the batch's.
# * **Test-time compute**: majority voting is right with probability
#   $\sum_{k>n/2}\binom nk p^k(1-p)^{n-k} \to \mathbb 1[p > 1/2]$ for two answers, and a
#   plurality vote does better when wrong answers disagree; best-of-$N$ with a verifier reaches
#   $1-(1-p)^N$, estimated without bias by $1 - \binom{n-c}{k}/\binom nk$. RL moved the model's
#   pass@1 far more than its pass@64.
# * **The parser is part of the reward.** Numeric answers are read with a fixed precedence
#   (`####`, then `\boxed{}`, then "answer is", then the last number) as exact fractions;
#   letters never from prose. pass@k's closed form equals the count over all $k$-subsets.
# * **GRPO's corrections.** Dividing the advantage by the group's std turns the expected
#   update from $(G-1)\,\partial_\theta p$ into about $(G-1)\,\partial_\theta\, 2\arcsin\sqrt p$,
#   a silent preference for the hardest and easiest questions (Dr. GRPO drops it, with the
#   $1/|o_i|$). DAPO widens the upper clip so unlikely tokens can grow, weighs every token of
#   the batch alike and drops groups without signal. GSPO clips one geometric-mean ratio per
#   answer; on-policy its gradient is GRPO's.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/20_grpo.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 20` writes a stub
# of every function, `llmbook grade 20` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_20.py` runs
# the same checks on the reference.
#
# 1. (★) **Even votes.** Break a tie of a two-answer majority vote with a fair coin. Show with
#    SymPy that $P_{2m}(p) = P_{2m-1}(p)$ for $m = 1, \dots, 6$: an even number of votes adds
#    nothing over the odd number below it. Explain why with one sentence about the last vote.
# 2. (★★) **The plug-in estimator.** Compute $\mathbb E[1 - (1 - c/n)^k]$ over
#    $c\sim\text{Binomial}(n, p)$ in SymPy and show that it is below $1-(1-p)^k$ for $k \ge 2$
#    and $0 < p < 1$ (why, by Jensen?). How large is the bias for $n = 10$, $k = 5$, $p = 0.1$?
# 3. (★★) **The difficulty bias of the std.** For a group of $G$ 0/1 rewards with $c$ right,
#    compute $\sum_i |A_i|$, the total push the group exerts, with and without the std in the
#    advantage, first with `group_normalized_rewards` and then in closed form. With $G = 8$,
#    how much does a question answered right once weigh relative to one answered right four
#    times, with and without the std? Which questions does the std favour?
# 4. (★★) **Averaging micro-batch token means.** If micro-batch $j$ (with $b_j$ answers and
#    $n_j$ tokens) is given weight $b_j/N$ and its token mean is used, what weight does each of
#    its tokens get, relative to the batch's token mean? Predict it and measure it with
#    autograd through `grpo_loss`.

# %%
from llmbook.workbench import grade

grade("20", globals())
