# %% [markdown]
# # 17 SFT and reward models
#
# A pretrained language model continues text; an assistant answers. The recipe that turned
# GPT-3 into InstructGPT (Ouyang et al., 2022, "Training language models to follow
# instructions with human feedback") has three steps: **supervised fine-tuning** (SFT) on
# demonstrations, a **reward model** trained on human comparisons of two answers, and
# reinforcement learning against that reward (chapter 18). This chapter does the first two on
# the book's text model and the shared task of Part V (`llmbook.alignment.preferences`):
# continue an 8-token prompt from the standard-library docstrings with 24 tokens, where the
# true reward $r(x, y)$ counts the response tokens that are one of twelve keywords
# (" value", " string", " None", ...), and a simulated labeller compares two responses.
#
# 1. **SFT is conditional maximum likelihood**: the loss counts only response tokens; SymPy
#    derives the masked loss and its gradient, and the per-token normalisation;
# 2. **packing** several examples into one row changes no log-probability, provided positions
#    restart and a block-diagonal mask keeps the examples apart (checked in float64);
# 3. **gradient accumulation** gives the full batch's gradient only if every micro-batch is
#    divided by the batch's total number of response tokens;
# 4. a short **SFT run** on the book's model moves the true reward of what it writes;
# 5. **Bradley–Terry** as maximum likelihood, its gradient, what its minimiser recovers, and
#    the **Bayes ceiling**: the best accuracy any reward model can reach on noisy labels;
# 6. a **reward model** trained on 4096 labelled pairs (shipped), measured against the true
#    reward and the ceiling;
# 7. how a loss is **reduced** (summed, averaged over tokens, per sequence, or divided by a
#    constant) decides the weight of long against short responses, and what length SFT teaches.
#
# The code lives in `llmbook.alignment.sft`, `llmbook.alignment.logprobs` and `llmbook.alignment.reward_model`.

# %%
import copy
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display

from llmbook.alignment.logprobs import (
    reduce_tokens,
    reduction_weights,
    reduction_weights_symbolic,
    token_logprobs,
)
from llmbook.alignment.losses import bradley_terry_loss
from llmbook.alignment.preferences import (
    PREFERENCE_RECIPE,
    evaluate_policy,
    keyword_ids,
    preference_data,
)
from llmbook.alignment.reward_model import (
    RewardModel,
    bayes_optimal_accuracy,
    load_reward_model,
    pairwise_accuracy,
    pearson_correlation,
    reward_model_loss,
    spearman_correlation,
)
from llmbook.alignment.sft import (
    fit_stop_model,
    fitted_length_distribution,
    pack_examples,
    response_values,
    sft_batch,
    sft_loss,
    sft_loss_from_logprobs,
    sft_step,
    stop_model_lengths,
)
from llmbook.alignment.shipped import load_artifact
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.training.optim import gradient_vector
from llmbook.training.pretrained import book_model

g = seed_everything(0)
torch.set_num_threads(1)  # a small model: one thread is steadier
f64 = torch.float64

base, info = book_model("text")
tok = info["tokenizer"]
kw = keyword_ids(tok)
train_pairs, test_pairs = preference_data("train"), preference_data("test")
print(f"{len(train_pairs.prompts)} training and {len(test_pairs.prompts)} test pairs; prompts of "
      f"{train_pairs.prompts.shape[1]} tokens, responses of {train_pairs.chosen.shape[1]}")

# %% [markdown]
# ## 17.1 Instruction data as conditional likelihood
#
# A demonstration is a prompt $x = (x_1,\dots,x_P)$ and a response $y = (y_1,\dots,y_R)$. The
# language model assigns the pair the probability $p_\theta(x, y) = p_\theta(x)\,
# p_\theta(y \mid x)$, and the chain rule splits the second factor into next-token
# probabilities:
#
# $$ \log p_\theta(y \mid x) = \sum_{t=1}^{R} \log p_\theta(y_t \mid x, y_{<t}). $$
#
# SFT maximises this, not $\log p_\theta(x, y)$: the prompt is given, and modelling it would
# spend capacity on text the user writes. So the loss is the pretraining cross-entropy with a
# **loss mask** that keeps only the response positions. SymPy checks the bookkeeping on a
# 3-token prompt and a 2-token response, with one symbol per conditional probability:

# %%
P_, R_ = 3, 2
q = sp.symbols(f"q1:{P_ + R_ + 1}", positive=True)  # q_t = p(s_t | s_<t), s = [x; y]
log_joint = sp.log(sp.Mul(*q))
log_prompt = sp.log(sp.Mul(*q[:P_]))
mask = [0] * P_ + [1] * R_  # 1 where the predicted token is a response token
masked_sum = sum(m * sp.log(qt) for m, qt in zip(mask, q, strict=True))
assert sp.simplify(sp.expand_log(log_joint - log_prompt) - masked_sum) == 0
display(sp.Eq(sp.Symbol(r"\log p(y \mid x)"), masked_sum))

# %% [markdown]
# In code, the logits at position $t$ predict the token at $t+1$, so for a sequence
# $s = [x; y]$ of length $T = P + R$ the targets are $s$ shifted left by one, and the mask is on
# at $t = P-1, \dots, T-2$: the last prompt position predicts $y_1$, the last position predicts
# nothing. `sft_batch` builds inputs, targets and mask once, so that no later code has to get
# the shift right again:

# %%
show_source(sft_batch)

# %%
demo = sft_batch(torch.tensor([[11, 12, 13]]), torch.tensor([[21, 22]]))
print("ids      ", demo.ids[0].tolist())
print("targets  ", demo.targets[0].tolist())
print("loss mask", demo.loss_mask[0].int().tolist())

# %% [markdown]
# **Which mean.** A batch holds responses of different lengths $n_b$. The loss divides the sum
# of the masked token losses by their total number $N = \sum_b n_b$, so every response token of
# the batch weighs $1/N$:
#
# $$ \mathcal L_{\text{SFT}} = -\frac{1}{N} \sum_{b}\sum_{t} m_{bt}\,
#    \log p_\theta(s_{b,t+1} \mid s_{b,\le t}). $$
#
# That is the maximum-likelihood estimate over the batch's response tokens, up to the constant
# $N$. The other common choice, a mean per sequence and then over sequences, gives a token of
# sequence $b$ the weight $1/(B\,n_b)$: the tokens of short responses count more (exercise 1).
# The gradient with respect to the logits $z_{bt}$ is the softmax gradient of chapter 3,
# masked and divided by $N$:
#
# $$ \frac{\partial \mathcal L_{\text{SFT}}}{\partial z_{bt}} = \frac{m_{bt}}{N}
#    \bigl(\operatorname{softmax}(z_{bt}) - e_{s_{b,t+1}}\bigr). $$
#
# SymPy derives it for one position with $V = 3$ (the sum over positions is linear, so the
# factor $m_{bt}/N$ carries through):

# %%
z = sp.symbols("z0:3")
m, N = sp.symbols("m N", positive=True)
target = 1
loss_t = -m / N * (z[target] - sp.log(sum(sp.exp(zi) for zi in z)))
softmax = [sp.exp(zi) / sum(sp.exp(zj) for zj in z) for zi in z]
grad = [sp.diff(loss_t, zi) for zi in z]
assert all(sp.simplify(gi - m / N * (softmax[i] - (1 if i == target else 0))) == 0
           for i, gi in enumerate(grad))
display(sp.Eq(sp.Symbol(r"\partial \mathcal{L}/\partial z_0"), sp.simplify(grad[0])))

# %%
show_source(sft_loss)

# %% [markdown]
# **Verify.** On the book's model in float64, with six prompts and chosen responses of which
# the first 10, 12, ..., 20 tokens are in the loss (the responses have different lengths): the loss equals PyTorch's `cross_entropy` with the Hugging Face
# convention (label $-100$ for every position outside the loss, `ignore_index=-100`), and the
# logits' gradient equals the closed form above.

# %%
model64 = copy.deepcopy(base).double()
batch = sft_batch(train_pairs.prompts[:6], train_pairs.chosen[:6])
kept = torch.arange(10, 22, 2)  # response tokens in the loss: the first 10, 12, ..., 20
batch = batch._replace(loss_mask=batch.loss_mask & (torch.arange(32) < 7 + kept[:, None]))
logits = model64(batch.ids).detach().requires_grad_()
loss = sft_loss(logits, batch.targets, batch.loss_mask)
loss.backward()
labels = batch.targets.masked_fill(~batch.loss_mask, -100)
peer = F.cross_entropy(logits.detach().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
closed = batch.loss_mask[..., None] * (torch.softmax(logits.detach(), -1)
                                       - F.one_hot(batch.targets, logits.shape[-1])) / batch.loss_mask.sum()
checks = Checks("the SFT loss on the book's model (float64)")
checks.equal("response tokens in the loss", int(kept.sum()), int(batch.loss_mask.sum()))
checks.close("loss = cross_entropy(ignore_index=-100)", peer, loss.detach(), tol=1e-13)
checks.close("∂L/∂z = m (softmax - onehot) / N", closed, logits.grad, tol=1e-15)
checks

# %% [markdown]
# ## 17.2 Packing
#
# Demonstrations have different lengths, and padding them all to the longest wastes compute.
# *Packing* puts several examples one after another into each row of a fixed length. Done
# naively, a token attends to the examples before it in the row, and its position counts from
# the start of the row; its log-probability, and so the loss, changes. Two changes make a
# packed row compute exactly what the examples compute alone (Krell et al., 2021, "Efficient
# Sequence Packing without Cross-contamination"):
#
# * **positions restart** at 0 at the start of every example;
# * a **block-diagonal attention mask** lets a token attend only to its own example; the model
#   ands it with the causal mask (`TransformerLM.forward(ids, positions=..., mask=...)`).
#
# The last token of each example must not be trained to predict the first token of the next
# one: its target is masked out like the prompt. `pack_examples` fills rows in order, or, like
# trl's `pack_dataset` (strategy "bfd", against which the tests compare it), by *best fit
# decreasing*: longest example first, each into the row with the least room that still fits.

# %%
show_source(pack_examples)

# %%
lengths = [5, 13, 20, 9, 24, 16, 7, 11]  # response tokens kept from each chosen response
examples = [(train_pairs.prompts[i], train_pairs.chosen[i, :n]) for i, n in enumerate(lengths)]
packed = pack_examples(examples, row_length=64, strategy="best_fit_decreasing")
print(f"{len(examples)} examples of {sum(8 + n for n in lengths)} tokens in {packed.ids.shape[0]} rows "
      f"of 64 (padding: {int((packed.example_ids < 0).sum())} positions)")
print("row 0, example of each position:", packed.example_ids[0].tolist())

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
causal = torch.tril(torch.ones(64, 64, dtype=torch.bool))
axes[0].imshow(causal, cmap="Greys", interpolation="nearest")
axes[0].set(title="naive packing: causal mask only", xlabel="key position", ylabel="query position")
axes[1].imshow(packed.attention_mask[0, 0] & causal, cmap="Greys", interpolation="nearest")
axes[1].set(title="with the block-diagonal mask", xlabel="key position", ylabel="query position")
fig.suptitle("Which keys each query of packed row 0 may attend to (black = allowed)")
fig.tight_layout()
save_figure(fig, "17_sft_packing_mask")
plt.show()

# %% [markdown]
# On the right, each example is a causal triangle of its own; the last block is padding, which
# attends only to itself and is never in the loss. Now the check: every response token's
# log-probability in the packed rows against the same example run alone, in float64, with the
# mask, and without it (positions still restarting), and with neither.

# %%
@torch.no_grad()
def packed_logprobs(batch, use_mask=True, restart_positions=True):
    logits = model64(batch.ids, positions=batch.positions if restart_positions else None,
                     mask=batch.attention_mask if use_mask else None)
    return logits, response_values(token_logprobs(logits, batch.targets), batch)


with torch.no_grad():
    alone = [token_logprobs(model64(b.ids), b.targets)[b.loss_mask]
             for b in (sft_batch(p[None], r[None]) for p, r in examples)]
alone_loss = -torch.cat(alone).mean()

# %%
checks = Checks("packed = separate (book's model, float64)")
for name, kwargs in (("mask + restarted positions", {}),
                     ("no mask", {"use_mask": False}),
                     ("neither", {"use_mask": False, "restart_positions": False})):
    logits, lp = packed_logprobs(packed, **kwargs)
    err = max(float((a - b).abs().max()) for a, b in zip(lp, alone, strict=True))
    loss = sft_loss(logits, packed.targets, packed.loss_mask)
    if not kwargs:
        checks.close(f"{name}: per-token log-probs", 0.0, err, tol=1e-12)
        checks.close(f"{name}: loss", alone_loss, loss, tol=1e-13)
    else:
        checks.true(f"{name}: log-probs differ by > 0.01", err > 0.01)
        checks.true(f"{name}: loss differs by > 0.001", abs(float(loss - alone_loss)) > 1e-3)
checks

# %% [markdown]
# ## 17.3 Gradient accumulation
#
# A batch too large for memory is split into $M$ micro-batches, each run forward and backward
# in turn, with the gradients adding up in `.grad` before one optimiser step. For the result
# to be the full batch's gradient, the sum of the micro-batch losses must be the full batch's
# loss. With $S_m$ the summed token loss of micro-batch $m$ and $n_m$ its number of response
# tokens, the full loss is $\sum_m S_m / \sum_m n_m$. The tempting implementation computes each
# micro-batch's own mean and averages those, $\frac1M\sum_m S_m/n_m$. SymPy compares the two
# for $M = 2$:

# %%
S1, S2, n1, n2 = sp.symbols("S_1 S_2 n_1 n_2", positive=True)
full = (S1 + S2) / (n1 + n2)
naive = (S1 / n1 + S2 / n2) / 2
gap = sp.factor(sp.simplify(naive - full))
display(sp.Eq(sp.Symbol(r"\mathcal{L}_{\mathrm{naive}} - \mathcal{L}"), gap))
assert gap.subs(n2, n1) == 0
assert sp.simplify(sp.diff(naive, S1) - 1 / (2 * n1)) == 0 and sp.diff(full, S1) == 1 / (n1 + n2)

# %% [markdown]
# The naive loss gives a token of micro-batch 1 the weight $1/(2n_1)$ instead of $1/(n_1+n_2)$:
# equal only when $n_1 = n_2$. Otherwise the tokens of the micro-batch with fewer response
# tokens count more, a bias that depends on how the batch happened to be split (and changes
# with the number of micro-batches). Hugging Face `transformers` had exactly this bias in its
# trainer's gradient accumulation until 2024, when it started passing the batch's token count
# (`num_items_in_batch`) to the loss. `sft_step` counts the response tokens of all micro-batches
# first and divides each micro-batch's sum by that total:

# %%
show_source(sft_step)

# %% [markdown]
# **Verify**, in float64 on the book's model: the eight examples above in micro-batches of
# 1, 3 and 4 examples (unequal token counts), against one backward pass on all of them at once.

# %%
splits = [examples[:1], examples[1:4], examples[4:]]
micro = [pack_examples(ex, 64) for ex in splits]
out = sft_step(model64, None, micro)  # optimizer=None: accumulate only
accumulated = gradient_vector(model64)
sft_step(model64, None, micro, normalization="per_micro_batch")
naive_grad = gradient_vector(model64)
sft_step(model64, None, [pack_examples(examples, 64)])
full_grad = gradient_vector(model64)

checks = Checks("gradient accumulation (float64)")
checks.equal("response tokens per micro-batch", [5, 42, 58], [int(b.loss_mask.sum()) for b in micro])
checks.close("loss = full-batch loss", alone_loss, out.loss, tol=1e-13)
checks.close("accumulated gradient = full-batch gradient", full_grad, accumulated, tol=1e-14)
checks.true("per-micro-batch mean: gradient off by > 10 %",
            float((naive_grad - full_grad).norm() / full_grad.norm()) > 0.1)
checks

# %% [markdown]
# ## 17.4 SFT on the book's model
#
# What the demonstrations contain is what SFT teaches. As demonstrations, take the chosen
# responses of the training pairs that contain at least one keyword: 1632 responses whose mean
# true reward is about 1.4 keywords, against 0.33 for what the base model writes on the test
# prompts. Keeping the better of two samples and fine-tuning on it is the simplest way to turn
# a reward into demonstrations (*rejection-sampling* or best-of-$n$ fine-tuning, as in Llama 2,
# Touvron et al., 2023). Sixteen steps of AdamW on 64 packed examples each (four 32-token
# examples per row of 128, in two micro-batches), prompts masked:

# %%
keep = torch.nonzero(train_pairs.reward_chosen >= 1).squeeze(1)
demos = [(train_pairs.prompts[i], train_pairs.chosen[i]) for i in keep.tolist()]
held_out_keep = torch.nonzero(test_pairs.reward_chosen >= 1).squeeze(1)
held_out = pack_examples([(test_pairs.prompts[i], test_pairs.chosen[i]) for i in held_out_keep.tolist()], 128)
print(f"{len(demos)} demonstrations, mean true reward {float(train_pairs.reward_chosen[keep].mean()):.2f}; "
      f"{len(held_out_keep)} held out")
base_eval = load_artifact("ppo")[1]["final"]["base"]  # the base model's shipped evaluation (chapter 18)
print(f"the base model's own responses to the {base_eval['num']} test prompts: mean true reward "
      f"{base_eval['reward']:.2f}")


@torch.no_grad()
def held_out_loss(model):
    logits = model(held_out.ids, positions=held_out.positions, mask=held_out.attention_mask)
    return float(sft_loss(logits, held_out.targets, held_out.loss_mask))

# %%
policy = copy.deepcopy(base).train()
optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=0.0)
order = torch.randperm(len(demos), generator=torch.Generator().manual_seed(0)).tolist()
losses = []
for step in range(16):
    idx = order[64 * step:64 * (step + 1)]
    micro = [pack_examples([demos[i] for i in idx[:32]], 128), pack_examples([demos[i] for i in idx[32:]], 128)]
    losses.append(float(sft_step(policy, optimizer, micro, grad_clip=1.0).loss))
policy.eval()
prompts = test_pairs.prompts[:256]
before, after = evaluate_policy(base, base, prompts, kw), evaluate_policy(policy, base, prompts, kw)

# %% [markdown]
# `evaluate_policy` (shared by chapters 17–19) samples one response per test prompt and reports
# its mean true reward and the Monte Carlo estimate of the KL divergence from the base model,
# $\mathrm{KL}(\pi \,\|\, \pi_{\text{base}})$, in nats per response. Sampling turns a last-bit
# difference between CPUs into a different token, so the numbers are stated as checks:

# %%
checks = Checks("16 SFT steps on the filtered chosen responses")
checks.true("held-out SFT loss fell", held_out_loss(policy) < held_out_loss(base))
checks.true("base model's reward on 256 test prompts < 0.5", before.reward < 0.5)
checks.true("after SFT: reward > 0.6", after.reward > 0.6)
checks.true("KL(π ‖ base) per response between 0.2 and 2 nats", 0.2 < after.kl < 2)
checks

# %% [markdown]
# Sixteen small steps (learning rate $10^{-4}$) more than double the number of keywords the
# model writes, at the cost of moving it a fraction of a nat per response away from the base
# model; the loss on held-out demonstrations of the same kind falls a little. SFT imitates the
# demonstrations, including whatever made them score well. (At a learning rate of
# $3\cdot10^{-4}$ the reward rises further, but the held-out loss *rises*: in one pass the model
# starts memorising the particular responses it saw.) It can only go as far as the
# demonstrations do, though, and it needs them; the rest of this chapter and the next learn
# from comparisons instead.
#
# ## 17.5 Bradley–Terry as maximum likelihood
#
# A labeller sees two responses $y_c, y_r$ to one prompt and says which is better. The
# Bradley–Terry model (Bradley & Terry, 1952, "Rank Analysis of Incomplete Block Designs")
# explains such choices with a score per item:
#
# $$ P(y_c \succ y_r \mid x) = \sigma\bigl(r(x, y_c) - r(x, y_r)\bigr)
#    = \frac{e^{r(x,y_c)}}{e^{r(x,y_c)} + e^{r(x,y_r)}}. $$
#
# A reward model $r_\phi$ is fitted by maximising the likelihood of the observed choices, i.e.
# by minimising $-\log\sigma(r_c - r_r)$ averaged over the pairs (Ouyang et al., 2022, eq. 1).
# SymPy derives the gradient:

# %%
rc, rr = sp.symbols("r_c r_r", real=True)
sigma = lambda t: 1 / (1 + sp.exp(-t))  # noqa: E731
nll = -sp.log(sigma(rc - rr))
d_c, d_r = sp.diff(nll, rc), sp.diff(nll, rr)
assert sp.simplify(d_c + sigma(rr - rc)) == 0 and sp.simplify(d_r - sigma(rr - rc)) == 0
assert sp.simplify(sp.diff(nll, rc, 2) - sigma(rc - rr) * sigma(rr - rc)) == 0
c = sp.symbols("c", real=True)
assert sp.simplify(nll.subs({rc: rc + c, rr: rr + c}) - nll) == 0
display(sp.Eq(sp.Symbol(r"\partial\ell/\partial r_c"), -sigma(rr - rc)),
        sp.Eq(sp.Symbol(r"\partial\ell/\partial r_r"), sigma(rr - rc)))

# %% [markdown]
# The gradient pushes $r_c$ up and $r_r$ down by the probability the model gives the *wrong*
# order, $\sigma(r_r - r_c)$: a pair already ranked confidently right contributes almost
# nothing. The second derivative $\sigma(1-\sigma) > 0$ makes the loss convex in the reward
# difference, and adding a constant $c$ to every reward changes nothing: only differences are
# identified, so a reward model's zero is arbitrary (trl's `center_rewards_coefficient`, the
# `center_coefficient` of `bradley_terry_loss`, pins it near 0).
#
# **What the minimiser recovers.** Suppose the labeller follows Bradley–Terry with the true
# reward and a scale $s$: $P(c \succ r) = p = \sigma(s\Delta^*)$ with $\Delta^* = r^*_c - r^*_r$.
# The expected loss of a model difference $\Delta$ on that pair is the cross-entropy
# $-p\log\sigma(\Delta) - (1-p)\log\sigma(-\Delta)$, minimised where its derivative
# $\sigma(\Delta) - p$ vanishes:

# %%
D, Dstar, s = sp.symbols("Delta Delta^* s", real=True)
p = sigma(s * Dstar)
expected = -p * sp.log(sigma(D)) - (1 - p) * sp.log(sigma(-D))
stationary = sp.simplify(sp.diff(expected, D))
assert sp.simplify(stationary - (sigma(D) - p)) == 0
assert sp.simplify(stationary.subs(D, s * Dstar)) == 0
display(sp.Eq(sp.Symbol(r"\partial_\Delta \mathbb{E}[\ell]"), sigma(D) - p))

# %% [markdown]
# So with enough data and a flexible enough model the learned reward is $s\,r^* + \text{const}$:
# Bradley–Terry recovers the true reward up to a shift, *scale included*, because a noisy
# labeller's disagreement rate says how far apart two responses are. Here $s = 1$, so a
# perfect reward model would have slope 1 against the true reward.
#
# **Verify** the derivative against autograd and the package's loss against a hand computation,
# in float64. The package's `bradley_terry_loss` is also tested against trl's
# `RewardTrainer.compute_loss` (in `tests/test_alignment_losses.py`).

# %%
r_c = torch.randn(7, generator=g, dtype=f64, requires_grad=True)
r_r = torch.randn(7, generator=g, dtype=f64, requires_grad=True)
loss = bradley_terry_loss(r_c, r_r)
g_c, g_r = torch.autograd.grad(loss, (r_c, r_r))
f_c = sp.lambdify((rc, rr), d_c)
checks = Checks("Bradley–Terry loss and gradient (float64)")
checks.close("loss = mean -log σ(r_c - r_r)", -F.logsigmoid(r_c - r_r).mean(), loss, tol=1e-15)
checks.close("∂/∂r_c: SymPy = autograd", f_c(r_c.detach().numpy(), r_r.detach().numpy()) / 7, g_c, tol=1e-15)
checks.close("∂/∂r_r = -∂/∂r_c", -g_c, g_r, tol=1e-16)
checks

# %% [markdown]
# ## 17.6 The Bayes ceiling
#
# How accurate can a reward model be on such labels? Take the best conceivable predictor, one
# that knows the true rewards. On a pair with $r^*_a \ne r^*_b$ it picks the higher one, and
# the label agrees with probability $\sigma(s\,|\Delta^*|)$; a rule that picks $a$ with
# probability $q$ scores $q\,\sigma(s\Delta^*) + (1-q)\,\sigma(-s\Delta^*)$, linear in $q$ with
# slope $\sigma(s\Delta^*) - \sigma(-s\Delta^*) > 0$ for $\Delta^* > 0$, so $q = 1$ is best, and
# nothing else about the responses can help, since the label depends on them only through the
# rewards. On a tie every rule scores $\sigma(0) = 1/2$. The expected accuracy of any reward
# model on the labelled pairs is therefore at most
#
# $$ A^* = \frac1N \sum_{i=1}^N \sigma\bigl(s\,|r^*_{a,i} - r^*_{b,i}|\bigr). $$

# %%
qq = sp.symbols("q", nonnegative=True)
rule = qq * sigma(s * Dstar) + (1 - qq) * sigma(-s * Dstar)
slope = sp.simplify(sp.diff(rule, qq))
assert sp.simplify(slope - sp.tanh(s * Dstar / 2)) == 0  # > 0 when s Δ* > 0
show_source(bayes_optimal_accuracy)

# %% [markdown]
# The true rewards of the test pairs are shipped, and they are integers, so $A^*$ is a finite
# sum that SymPy can write exactly: $n_k$ pairs with $|\Delta^*| = k$ contribute
# $n_k\,\sigma(k)$.

# %%
gaps = (test_pairs.reward_chosen - test_pairs.reward_rejected).abs().long()
counts = torch.bincount(gaps).tolist()
ceiling = sum(n * sigma(sp.Integer(kk)) for kk, n in enumerate(counts)) / sum(counts)
untied = sum(n * sigma(sp.Integer(kk)) for kk, n in enumerate(counts) if kk) / sum(counts[1:])
print("pairs with |Δ*| = 0, 1, 2, ...:", counts)
display(sp.Eq(sp.Symbol("A^*"), ceiling))
print(f"A* = {float(ceiling):.4f} over all {sum(counts)} test pairs; "
      f"{float(untied):.4f} over the {sum(counts[1:])} non-tied ones")
checks = Checks("Bayes ceiling on the test pairs")
checks.close("SymPy = bayes_optimal_accuracy", float(ceiling),
             bayes_optimal_accuracy(test_pairs.reward_chosen.double(), test_pairs.reward_rejected.double(),
                                    PREFERENCE_RECIPE["bt_scale"]), tol=1e-15)
checks

# %% [markdown]
# 57 % of the test pairs are ties, on which every model is a coin flip, and even a one-keyword
# gap is labelled the wrong way round 27 % of the time. No reward model can expect more than
# about 61 % on these labels, or 77 % on the non-tied pairs; the true reward itself scores
# whatever its luck on these particular 512 labels gives (it is one draw, not the expectation).
#
# ## 17.7 A reward model
#
# The reward model is the book's text model without its LM head: a linear head reads one scalar
# off the final hidden state $h_T$ of the last response token, which by causal attention has
# seen the whole prompt and response (InstructGPT's design, Ouyang et al., 2022, section 3.5):
# $r_\phi(x, y) = w^\top h_T + b$. The head starts at zero, so training starts at reward 0 for
# everything and loss $\log 2$. Only the last two blocks, the token and position embeddings,
# the final norm and the head are trained, 56 % of the parameters. The embeddings matter: the
# model must learn which tokens are rewarded, and in trials without them the learned reward
# correlated markedly less with the true one. The first two blocks matter less, and leaving
# them frozen keeps the shipped file small (the frozen weights are the text model's own).

# %%
show_source(RewardModel.forward)

# %%
show_source(reward_model_loss)

# %%
fresh = RewardModel(copy.deepcopy(base), trainable_blocks=2, train_embeddings=True)
with torch.no_grad():
    first = reward_model_loss(fresh, train_pairs.prompts[:64], train_pairs.chosen[:64], train_pairs.rejected[:64])
n_trained = sum(p.numel() for p in fresh.parameters() if p.requires_grad)
print(f"trained: {n_trained:,} of {sum(p.numel() for p in fresh.parameters()):,} parameters "
      f"({n_trained / sum(p.numel() for p in fresh.parameters()):.0%})")
checks = Checks("an untrained reward model")
checks.close("loss at the start = log 2", math.log(2), first.loss, tol=1e-7)
cfg = base.config
per_block = sum(p.numel() for p in base.blocks[0].parameters())
checks.equal("trained: 2 blocks, embeddings, final norm, head",
             2 * per_block + (cfg.vocab_size + cfg.max_seq_len) * cfg.d_model + 3 * cfg.d_model + 1, n_trained)
checks

# %% [markdown]
# The shipped model (`python -m llmbook.alignment.shipped reward_model`) was trained with
# `train_reward_model` from the text model's weights: AdamW on batches of 32 pairs (64
# responses) with a short warm-up and cosine decay, about two passes over the 4096 training
# pairs on one CPU core. Its training curve and test scores are stored with it:

# %%
rm, rm_info = load_reward_model()
hist, scores = rm_info["history"], rm_info["test"]
true_loss = float(bradley_terry_loss(test_pairs.reward_chosen.double(), test_pairs.reward_rejected.double()))
recipe = rm_info["recipe"]
print(f"{recipe['steps']} steps of {recipe['batch_size']} pairs, lr {recipe['lr']:g}, "
      f"trainable blocks {recipe['trainable_blocks']} + embeddings; {rm_info['num_trained_parameters']:,} "
      f"trained parameters shipped in {recipe['shipped_dtype']}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
steps = np.arange(1, len(hist["loss"]) + 1)
smooth = lambda v: np.convolve(v, np.ones(16) / 16, mode="valid")  # noqa: E731
ax1.plot(steps, hist["loss"], color="lightgrey", lw=0.8, label="batch")
ax1.plot(steps[15:], smooth(hist["loss"]), label="batch, 16-step mean")
ax1.plot(hist["eval_step"], hist["eval_loss"], "o-", label="test pairs")
ax1.axhline(math.log(2), color="grey", ls=":", lw=0.8)
ax1.axhline(true_loss, color="black", ls="--", lw=1, label="true reward (test)")
ax1.set(xlabel="step", ylabel="Bradley–Terry loss (nats/pair)", title="Loss")
ax1.legend()
ax2.plot(steps[15:], smooth(hist["accuracy"]), label="batch, 16-step mean")
ax2.plot(hist["eval_step"], hist["eval_accuracy"], "o-", label="test pairs")
ax2.axhline(scores["bayes_accuracy"], color="black", ls="--", lw=1, label="Bayes ceiling (test)")
ax2.axhline(0.5, color="grey", ls=":", lw=0.8)
ax2.set(xlabel="step", ylabel="pairwise accuracy", title="Accuracy")
ax2.legend()
fig.suptitle("Training the reward model on 4096 labelled pairs (shipped history)")
fig.tight_layout()
save_figure(fig, "17_reward_model_training")
plt.show()

# %% [markdown]
# The test loss falls for about a hundred steps, then creeps up a little during the second
# pass over the data (from step 128), while the training batches' loss and accuracy move past
# what even the true reward achieves: the model starts to fit the noise of the particular
# training labels. The dashed
# line is the loss of the true reward itself on the test labels: with most pairs tied or one
# keyword apart, even the perfect reward scores only about 0.61 nats per pair, not far below
# $\log 2 = 0.69$. The test accuracy climbs to the Bayes ceiling and stays there, within the
# noise of a single set of 512 labels (its standard deviation is about
# $\sqrt{0.6\cdot 0.4/512} \approx 0.02$).
#
# How well does the learned reward track the true one? On the 1024 test responses (both sides
# of every pair), learned against true reward, with Pearson's correlation and Spearman's rank
# correlation (ranks of tied values averaged: most true rewards are 0):

# %%
learned, true = np.array(scores["learned_rewards"]), np.array(scores["true_rewards"])
fit = np.polyfit(true, learned, 1)
jitter = np.random.default_rng(0).uniform(-0.15, 0.15, true.shape)
fig, ax = plt.subplots(figsize=(6, 4.2))
ax.scatter(true + jitter, learned, s=6, alpha=0.4, label="test responses")
levels = np.unique(true)
ax.plot(levels, [learned[true == v].mean() for v in levels], "ko-", label="mean per true reward")
ax.plot(levels, np.polyval(fit, levels), "r--", label=f"least squares, slope {fit[0]:.2f}")
ax.set(xlabel="true reward r*(x, y) (keywords in the response; jittered)",
       ylabel="learned reward r_φ(x, y)", title="Learned against true reward, 1024 test responses")
ax.legend()
fig.tight_layout()
save_figure(fig, "17_reward_model_scatter")
plt.show()

# %%
print(f"test accuracy {scores['accuracy']:.2f} (Bayes ceiling {scores['bayes_accuracy']:.2f}); "
      f"non-tied pairs {scores['accuracy_non_tied']:.2f} (ceiling {scores['bayes_accuracy_non_tied']:.2f})")
print(f"the true reward on these labels: {scores['true_reward_accuracy']:.2f}")
print(f"correlation with the true reward: Pearson {scores['pearson']:.2f}, Spearman {scores['spearman']:.2f}; "
      f"least-squares slope {fit[0]:.2f}")
sampled = torch.cat([pairs.reward_chosen for pairs in (train_pairs, test_pairs)]
                    + [pairs.reward_rejected for pairs in (train_pairs, test_pairs)])
print(f"sampled responses (all pairs) with more than two keywords: {int((sampled > 2).sum())} of "
      f"{len(sampled)}, {float((sampled > 2).double().mean()):.1%}")

# %% [markdown]
# The learned reward reaches the ceiling's accuracy on all pairs, and a few points under it on
# the non-tied ones (the true reward's own 0.62 on these labels is one lucky draw above its
# expectation, 0.61). Yet it tracks the true reward only in part. The mean learned reward
# rises with the number of keywords (flattening beyond two, which only 1.3 % of the sampled
# responses reach), but the responses of any one true reward spread widely, and the slope is about two thirds of the value 1 that the maximum-likelihood
# argument of section 17.5 promises in the limit: from 4096 noisy comparisons, most of them
# ties, the model has learned the direction of the true reward and a shrunken, noisy version of
# its size. Accuracy on noisy labels saturates long before the reward is learned well, so a
# reward model's accuracy alone says little about how safely a policy can be optimised
# against it (chapter 18).
#
# Finally, the scores stored with the artifact are recomputed here from the loaded model, and
# the recomputed accuracy is held against the ceiling $A^*$ derived with SymPy in section
# 17.6 (not against the ceiling stored beside it):

# %%
r_c = rm(test_pairs.prompts, test_pairs.chosen).detach()
r_r = rm(test_pairs.prompts, test_pairs.rejected).detach()
learned_now = torch.cat([r_c, r_r]).double()
true_t = torch.tensor(true)
checks = Checks("shipped reward model: the stored scores recomputed")
checks.true("accuracy within 2 pairs of the stored one",
            abs(float(pairwise_accuracy(r_c, r_r)) - scores["accuracy"]) <= 2 / 512)
checks.close("Pearson correlation", scores["pearson"], pearson_correlation(learned_now, true_t),
             tol=1e-4, digits=2)
checks.close("Spearman correlation", scores["spearman"], spearman_correlation(learned_now, true_t),
             tol=1e-3, digits=2)
acc_now = float(pairwise_accuracy(r_c, r_r))
checks.true("recomputed accuracy below the SymPy Bayes ceiling A* + 0.03", acc_now < float(ceiling) + 0.03)
checks.true("recomputed accuracy above chance + 0.05", acc_now > 0.55)
checks

# %% [markdown]
# ## 17.8 Reductions: how a loss is averaged biases length
#
# Every loss of Part V starts from per-token values $\ell_{b,t}$ on a mask of response tokens:
# here $-\log p_\theta(y_t \mid x, y_{<t})$, in chapters 18–20 a clipped surrogate. Turning them
# into one number is a choice. Section 17.1 took the token mean and section 17.3 showed that a
# mean of micro-batch means breaks it; section 20.4 shows what GRPO's mean per answer does to
# the lengths of answers in RL. In `llmbook.alignment` the choice is one keyword of every loss,
# `reduction`, computed in one place, `reduce_tokens`. For $B$ sequences of $L_b$ tokens:
#
# | `reduction` | loss | weight of one token of sequence $b$ | weight of all of sequence $b$ |
# |---|---|---|---|
# | `"none"` | the per-token values, 0 off the mask | – | – |
# | `"sum"` | $\sum_b\sum_t \ell_{b,t}$ | $1$ | $L_b$ |
# | `"token_mean"` | $\sum_b\sum_t \ell_{b,t} \,/\, \sum_b L_b$ | $1/\sum_{b'} L_{b'}$ | $L_b/\sum_{b'} L_{b'}$ |
# | `"sequence_mean"` | $\frac1B\sum_b \frac{1}{L_b}\sum_t \ell_{b,t}$ | $1/(B L_b)$ | $1/B$ |
# | `"constant"` | $\sum_b\sum_t \ell_{b,t} \,/\, C$ | $1/C$ | $L_b/C$ |
#
# The SFT loss, PPO and DAPO default to the token mean, GRPO to the mean per sequence, Dr. GRPO
# to a constant $C$ (Liu et al., 2025); the pair losses of chapter 19 take `"mean"`, `"sum"` or
# `"none"` over pairs. A mean over nothing is undefined, so `"token_mean"` with an all-false mask,
# and `"sequence_mean"` with a sequence that has no tokens, raise a `ValueError` rather than
# return NaN; a `"sum"` or `"constant"` of nothing is 0, so a micro-batch without response tokens
# adds nothing. (In a packed batch a "sequence" is a row: for a mean per example, put one example
# in each row.)

# %%
show_source(reduce_tokens)

# %% [markdown]
# **Derive.** SymPy writes each reduction out for three sequences of symbolic lengths, with
# symbolic per-token losses, and differentiates with respect to one token of the first
# sequence; multiplying by $L_1$ gives the weight of the whole sequence:

# %%
w_sym = reduction_weights_symbolic()
L_1, L_2, L_3 = w_sym["L"]
for name in ("sum", "token_mean", "sequence_mean", "constant"):
    print(f"{name:14s} one token: {str(w_sym[name]):16s} the whole sequence: {sp.simplify(L_1 * w_sym[name])}")
assert sp.simplify(w_sym["sequence_mean"] * L_1 - sp.Rational(1, 3)) == 0  # every sequence weighs 1/B

# %% [markdown]
# Only the mean per sequence makes a token's weight depend on the length of *its own*
# sequence: a token of a 5-token response weighs almost five times one of a 24-token response,
# and every response, short or long, weighs the same in total. The other three weigh every
# token alike, so a sequence weighs in proportion to its length.
#
# **Verify on the book's model** (the float64 copy of section 17.2), with the eight
# demonstrations of section 17.2 (responses of 5 to 24 tokens), one to a row: the SFT loss under
# each reduction, from the logits and from per-token log-probabilities, against
# `F.cross_entropy` (summed; averaged over all tokens; averaged within each row, then over
# rows), loss and gradient with respect to every parameter; then the gradient with respect to
# each token's log-probability against the SymPy weight evaluated at the actual lengths.

# %%
rows = pack_examples(examples, row_length=32)  # 8 + 24 tokens: no two examples share a row
assert rows.ids.shape[0] == len(examples)
sel = rows.loss_mask
row_logits = model64(rows.ids, positions=rows.positions, mask=rows.attention_mask)


def cross_entropy_peer(reduction):
    """torch's cross-entropy, row by row for the mean per sequence."""
    if reduction == "sequence_mean":
        return torch.stack([F.cross_entropy(row_logits[b][sel[b]], rows.targets[b][sel[b]])
                            for b in range(len(examples))]).mean()
    return F.cross_entropy(row_logits[sel], rows.targets[sel], reduction="sum" if reduction == "sum" else "mean")


def parameter_gradient(loss):
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model64.parameters()), retain_graph=True)])


gathered = torch.log_softmax(row_logits, -1).gather(-1, rows.targets[..., None])[..., 0]  # (8, 32)
checks = Checks("SFT loss under each reduction = F.cross_entropy (book's model, float64)")
for reduction in ("sum", "token_mean", "sequence_mean"):
    peer = cross_entropy_peer(reduction)
    ours = sft_loss(row_logits, rows.targets, sel, reduction=reduction)
    from_logprobs = sft_loss_from_logprobs(gathered, sel, reduction=reduction)
    checks.close(f"{reduction}: loss from logits", peer, ours, tol=1e-12, rel=True)
    checks.close(f"{reduction}: loss from log-probabilities", peer, from_logprobs, tol=1e-12, rel=True)
    checks.close(f"{reduction}: parameter gradient", parameter_gradient(peer), parameter_gradient(ours),
                 tol=1e-12, rel=True)
leaf = gathered.detach().requires_grad_()
demo_lengths = [int(n) for n in sel.sum(1)]
print(f"response tokens per row: {demo_lengths}")
symbolic = reduction_weights_symbolic(demo_lengths)["per_sequence"]  # SymPy, at these lengths
first = sel.int().argmax(1)  # the first response token of each row
for reduction in ("sum", "token_mean", "sequence_mean"):
    (g_leaf,) = torch.autograd.grad(sft_loss_from_logprobs(leaf, sel, reduction=reduction), leaf)
    checks.close(f"{reduction}: -d loss / d log p = SymPy weight, every row",
                 torch.tensor([float(w) for w in symbolic[reduction]], dtype=f64),
                 -g_leaf[torch.arange(len(demo_lengths)), first], tol=1e-15)
checks

# %% [markdown]
# **What it does to the lengths SFT teaches.** Suppose the model is free to fit any length
# distribution $q(L)$ and the demonstrations' lengths have distribution $p(L)$. Under the sum
# (or the token mean, whose divisor is the same for every sequence of the batch) the loss is
# $-\sum_b \log q(L_b)$ plus terms that do not involve the length, so maximum likelihood gives
# $q = p$. Under the mean per sequence, sequence $b$'s log-likelihood carries the weight
# $1/(B L_b)$: the minimiser of $-\sum_L p(L)\,w(L) \log q(L)$ subject to $\sum_L q(L) = 1$ is
# $q(L) \propto p(L)\,w(L)$ (a Lagrange multiplier), here $p(L)/L$. SymPy solves it for two
# lengths, with the constraint substituted, and takes the mean length of the fitted distribution:

# %%
p_short, L_s, L_l, q_s = sp.symbols("p L_s L_l q", positive=True)
weighted_loglik = p_short / L_s * sp.log(q_s) + (1 - p_short) / L_l * sp.log(1 - q_s)  # q(L_l) = 1 - q
q_star = sp.solve(sp.diff(weighted_loglik, q_s), q_s)[0]
mean_fitted = sp.simplify(q_star * L_s + (1 - q_star) * L_l)
harmonic = 1 / (p_short / L_s + (1 - p_short) / L_l)
display(sp.Eq(sp.Symbol("q^*(L_s)"), sp.factor(q_star)), sp.Eq(sp.Symbol(r"\mathbb{E}_{q^*}[L]"), mean_fitted))
assert sp.simplify(mean_fitted - harmonic) == 0  # the harmonic mean of the observed lengths

# %% [markdown]
# The fitted mean length is the *harmonic* mean of the demonstrations' lengths, never more than
# their arithmetic mean, and much less when the lengths spread. To see an optimiser land there,
# `fit_stop_model` fits the smallest model of length: at each position it stops with
# probability $\sigma(\theta_t)$, so a response of $L$ tokens contributes $L - 1$ "continue"
# tokens and one "stop" token to the SFT loss (`stop_model_logprobs`). Forty-two demonstrations
# with lengths 1 to 8, fitted by L-BFGS under each reduction and compared with the closed form
# `fitted_length_distribution`:

# %%
length_counts = torch.tensor([2, 4, 6, 8, 8, 6, 4, 4])
demo_L = torch.repeat_interleave(torch.arange(1, 9), length_counts)  # (42,)
fitted = {r: stop_model_lengths(fit_stop_model(demo_L, 8, r)) for r in ("sum", "token_mean", "sequence_mean")}
closed = {r: fitted_length_distribution(demo_L, 8, r) for r in fitted}
checks = Checks("stop model fitted by L-BFGS = closed form q ∝ p(L) w(L)")
for r in fitted:
    checks.close(f"{r}: fitted length distribution", closed[r], fitted[r], tol=1e-6)
checks.close("sequence_mean: mean length = harmonic mean of the data",
             len(demo_L) / float((1 / demo_L.double()).sum()), float((fitted["sequence_mean"] * torch.arange(1, 9)).sum()),
             tol=1e-5)
display(checks)
L_axis = torch.arange(1, 9, dtype=f64)
print("length L:                 " + " ".join(f"{n:6d}" for n in range(1, 9)))
for r, label in (("token_mean", "data = token mean/sum"), ("sequence_mean", "sequence mean")):
    print(f"{label:25s} " + " ".join(f"{v:6.3f}" for v in closed[r].tolist())
          + f"   mean length {float((closed[r] * L_axis).sum()):.2f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
order_by_length = sorted(range(len(demo_lengths)), key=lambda b: demo_lengths[b])
for reduction, marker, label in (("token_mean", "o", "token_mean (= sum, constant)"),
                                 ("sequence_mean", "s", "sequence_mean")):
    share = reduction_weights(sel, reduction).sum(1)  # (8,): the weight of each whole response
    share = share / share.sum()
    ax1.plot([demo_lengths[b] for b in order_by_length], share[order_by_length], marker + "-", label=label)
ax1.set(xlabel="response length L_b (tokens)", ylabel="share of the gradient",
        title="Weight of each demonstration (batch of 8)")
ax1.legend(fontsize="small")
width = 0.4
ax2.bar(L_axis - width / 2, closed["token_mean"], width, label="data (= token mean, sum)")
ax2.bar(L_axis + width / 2, fitted["sequence_mean"], width, label="fitted, sequence mean")
ax2.set(xlabel="response length L", ylabel="probability", title="Length distribution SFT teaches",
        ylim=(0, 0.27))
ax2.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "17_sft_reduction_length_bias")
plt.show()

# %% [markdown]
# On the left, the token mean (and the sum, and a constant) give each demonstration a share of
# the gradient in proportion to its length, the mean per sequence an equal share whatever its
# length. On the right, the consequence: the mean per sequence teaches a model to stop early,
# its mean length falling from 4.67 to 3.60 tokens, although every demonstration was weighted
# "equally". That is why the SFT loss of section 17.1, trl's `SFTTrainer` and Hugging Face's
# causal-LM loss take the token mean.
#
# In RL the same weight multiplies an advantage. Under the mean per sequence a token of a wrong
# answer ($A < 0$) of $L$ tokens is pushed down by $|A|/(BL)$: short wrong answers are
# penalised more per token than long ones, and right answers are reinforced more when short;
# section 20.4 derives the drift this causes (long wrong answers, short right ones) and
# measures it, the argument of Liu et al. (2025) for Dr. GRPO's constant. A constant gives
# every token the same weight in every batch; the token mean does too within a batch, but its
# divisor moves with the batch's total length, and over micro-batches it must be the whole
# batch's count (section 17.3, and `num_tokens` of `sft_loss` and `dapo_loss`).

# %% [markdown]
# ## Summary
#
# * SFT maximises $\log p_\theta(y \mid x) = \sum_t \log p_\theta(y_t \mid x, y_{<t})$: the
#   pretraining loss with the prompt masked out, averaged over the batch's response tokens.
# * Packing is exact when positions restart per example and a block-diagonal mask separates
#   the examples; without the mask, examples contaminate each other's log-probabilities.
# * Gradient accumulation must divide every micro-batch by the whole batch's token count;
#   averaging micro-batch means over-weights the tokens of micro-batches with few of them.
# * A few SFT steps on filtered demonstrations move what the model writes towards them.
# * Bradley–Terry is logistic regression on reward differences: gradient
#   $-\sigma(r_r - r_c)$ for the chosen reward, shift-invariant, and consistent for
#   $s\,r^* + \text{const}$. On noisy labels no model can beat
#   $A^* = \frac1N\sum_i\sigma(s|\Delta^*_i|)$, here about 0.61.
# * The book's reward model reaches that ceiling on the test pairs yet tracks the true reward
#   only in part (correlation about 0.6, slope about 0.65); chapter 18 optimises a policy
#   against a reward and shows what such gaps cost.
# * Every loss takes a `reduction`. Only the mean per sequence weighs a token by
#   $1/(B L_b)$, the inverse of its own response's length; SFT under it fits
#   $q(L) \propto p(L)/L$, whose mean is the harmonic mean of the demonstrations' lengths.
#   The token mean, the sum and a constant give maximum likelihood.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/17_sft_reward_models.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 17` writes a stub
# of every function, `llmbook grade 17` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_17.py` runs
# the same checks on the reference.
#
# 1. (★) **Per-sequence normalisation.** Write `per_sequence_sft_loss`, the mean over
#    sequences of each sequence's mean token loss. Show with SymPy that for two sequences of
#    $n_1$ and $n_2$ response tokens a token of the first weighs $1/(2n_1)$ instead of
#    $1/(n_1+n_2)$, that the difference is $(n_2-n_1)/(2n_1(n_1+n_2))$, and check both weights
#    against autograd.
# 2. (★) **How noisy is the labeller?** Write the Bayes ceiling as a function of the scale $s$
#    and evaluate it on the test pairs' gaps for $s \to 0$, $s = 1$ and $s \to \infty$ (where do
#    the ties leave it?). Solve for the scale at which a pair one keyword apart is labelled
#    correctly 90 % of the time.
# 3. (★★) **Maximum likelihood recovers the scale.** Label 20 000 pairs of random integer
#    rewards with `label_preferences` at scales 1 and 2.5, and fit the one-parameter model
#    $P = \sigma(a\Delta^*)$ by Newton's method on the log-likelihood (derive its first two
#    derivatives; why does Newton converge from $a = 0$?). Check that $\hat a \approx s$.
# 4. (★) **Packing efficiency.** Write `padding_fraction(batch)` and compare the two packing
#    strategies on 60 examples of random lengths between 2 and 40 in rows of 64.

# %%
from llmbook.workbench import grade

grade("17", globals())
