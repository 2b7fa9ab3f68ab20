# %% [markdown]
# # 24 In-context learning and induction heads
#
# A language model's loss on a token falls the further into a document the token is: the
# model uses its context. Olsson et al. (2022, "In-context Learning and Induction Heads")
# trace much of that *in-context learning* to **induction heads**, attention heads that
# complete a pattern seen earlier: at a token A whose previous occurrence was followed by B,
# attend to that B and predict it, $[A][B]\dots[A] \to [B]$. They appear in a sudden *phase
# change* during training, in step with a jump in in-context learning. Elhage et al. (2021,
# "A Mathematical Framework for Transformer Circuits") explain why they need two layers. This
# chapter, on small attention-only models trained on sequences that repeat a random segment:
#
# 1. **derives** the decomposition of a layer-1 attention score into direct, Q-, K- and
#    V-composition terms (SymPy) and checks the model's heads against the book's multi-head
#    attention and PyTorch's;
# 2. **shows** the phase change in the shipped training runs: the loss on the repeated half
#    drops abruptly, the in-context-learning score jumps, and the previous-token and
#    prefix-matching scores of the heads rise at the same steps; a one-layer model never
#    gets there;
# 3. **finds** the heads by their attention patterns and by ablation (zero and mean), and
#    cuts the K-composition path alone to show that it carries the circuit;
# 4. **builds** a two-layer induction circuit by hand on one-hot embeddings, derives its
#    attention scores exactly in SymPy and verifies that it predicts every repeated token.

# %%
import math

import matplotlib.pyplot as plt
import sympy as sp
import torch
from IPython.display import display

from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.scale.icl import (
    LinearSelfAttention,
    effective_weights,
    gd_construction,
    gd_prediction,
    optimal_learning_rate,
    regression_prompts,
    train_lsa,
)
from llmbook.scale.induction import (
    AttentionOnlyTransformer,
    alignment_chance,
    induction_batch,
    lm_attention_patterns,
    load_induction_model,
    per_position_loss,
    prefix_matching_score,
    previous_token_score,
    repeated_tokens,
)
from llmbook.scale.interpretability import (
    head_ablation_effects,
    icl_score,
    induction_circuit,
    induction_circuit_weights,
    repeat_mask,
)
from llmbook.training.pretrained import book_model
from llmbook.transformer.attention import MultiHeadAttention

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64

# %% [markdown]
# ## 24.1 The task: repeated random tokens
#
# Random tokens carry no information about each other, so the first time a token appears
# no model can do better than $\log V$ nats. If a segment is repeated, though, every token of
# the copy but the first is predictable from the context: it is the token that followed the
# current token last time. That is exactly what an induction head does, and nothing else on
# this data helps. The evaluation data is the cleanest form, $L$ random tokens followed by the
# same $L$ ($V = 64$, $L = 24$):

# %%
show_source(repeated_tokens)

# %%
ids = repeated_tokens(2, 6, 64, torch.Generator().manual_seed(0))
print(ids)

# %% [markdown]
# The training data hides the repeat. With a fixed $L$ a model could predict token $t+1$ by
# *position* alone (copy the token at $t - L + 1$), no induction needed (exercise 1 builds
# such a model). So each training sequence of $T = 48$ tokens places a segment of random
# length $L \in [8, 24]$ at a random start among random filler tokens, and returns the mask of
# the tokens an induction head can predict:

# %%
show_source(induction_batch)

# %%
ids, repeat = induction_batch(1, 48, 64, 8, 24, torch.Generator().manual_seed(3))
print(ids[0].tolist())
print("".join("r" if r else "." for r in repeat[0].tolist()))

# %% [markdown]
# ## 24.2 An attention-only transformer, and the algebra of composition
#
# The models have no MLPs and no normalisation: $x_0 = W_E[\text{ids}]$ and
# $x_l = x_{l-1} + \sum_h W_O^h A^h (x_{l-1} W_V^{h\top})$ with causal attention patterns
# $A^h = \mathrm{softmax}(q k^\top/\sqrt{d_{head}})$, then $\text{logits} = x_L W_U^\top$.
# Positions enter as RoPE (chapter 5) in the scores only, so that a head can find "the
# previous position" whatever the position. The book's `MultiHeadAttention` (chapter 4)
# holds each layer's weights; the model runs the heads itself so that it can return their
# patterns, *ablate* a head (set its output to zero or to its mean), and cut the queries,
# keys or values of a layer off from the earlier layers (`composition`).

# %%
show_source(AttentionOnlyTransformer.run_with_cache)

# %% [markdown]
# **Composition.** Elhage et al. (2021) read a two-layer attention-only model as a sum of
# paths. In layer 1 a head's score between query position $t$ and key position $s$ is the
# bilinear form $x_t^\top W_{QK}\, x_s$ (with $W_{QK} = W_Q^\top W_K$, scaled, and rotated by
# RoPE according to $t - s$) of residual streams that already contain layer 0's output,
# $x_t = e_t + o_t$ with $o_t = \sum_r A^0_{tr} W_{OV} e_r$. Expanding:
#
# $$ x_t^\top W_{QK} x_s = \underbrace{e_t^\top W_{QK} e_s}_{\text{direct}}
#  + \underbrace{o_t^\top W_{QK} e_s}_{\text{Q-composition}}
#  + \underbrace{e_t^\top W_{QK} o_s}_{\text{K-composition}}
#  + \underbrace{o_t^\top W_{QK} o_s}_{\text{Q and K}} , $$
#
# and V-composition is the same for the values. Only a K-composition term can make the score
# of key $s$ depend on the token at $s-1$: it is how "the token *after* the previous
# occurrence of mine" can be found. SymPy checks the expansion with $2\times 2$ matrices and
# one earlier position $r$ standing in for the sums:

# %%
WQK, WOV = sp.Matrix(2, 2, sp.symbols("q0:4")), sp.Matrix(2, 2, sp.symbols("w0:4"))
e_t, e_s, e_r = (sp.Matrix(2, 1, sp.symbols(f"{n}0:2")) for n in ("t", "s", "r"))
a_t, a_s = sp.symbols("a_t a_s")
o_t, o_s = a_t * WOV * e_r, a_s * WOV * e_r
score = ((e_t + o_t).T * WQK * (e_s + o_s))[0]
terms = {"direct": (e_t.T * WQK * e_s)[0], "Q": (o_t.T * WQK * e_s)[0],
         "K": (e_t.T * WQK * o_s)[0], "QK": (o_t.T * WQK * o_s)[0]}
assert sp.expand(score - sum(terms.values())) == 0
display(sp.Eq(sp.Symbol("K-composition"), sp.factor(terms["K"]), evaluate=False))

# %% [markdown]
# Before reading heads we check that the model's own head loop computes what the book's
# `MultiHeadAttention` computes, and that with PyTorch's fused kernel: one random layer in
# float64, $T = 11$, $d = 24$, three heads of width 8 (not square anywhere).

# %%
model64 = AttentionOnlyTransformer(37, 24, 1, 3, 16, positions="learned",
                                   generator=torch.Generator().manual_seed(1)).double()
x_ids = torch.randint(0, 37, (2, 11), generator=g)
checks = Checks("attention-only layer")
with torch.no_grad():
    x0 = model64.embed(x_ids) + model64.pos(torch.arange(11))
    ours = model64(x_ids)
    for fused in (False, True):
        mha = MultiHeadAttention(24, 3, fused=fused).double()
        mha.load_state_dict(model64.layers[0].state_dict())
        peer = model64.unembed(x0 + mha(x0))
        checks.close(f"logits = MultiHeadAttention(fused={fused}) path", peer, ours, tol=1e-12)
checks

# %% [markdown]
# ## 24.3 The phase change
#
# Two models were trained on `induction_batch` data and shipped (`python -m
# llmbook.alignment.shipped induction_2l induction_1l` retrains them; about two minutes of one
# CPU core each): two layers and a one-layer control, both with $d = 64$, two heads of width
# 32 per layer, $V = 64$, 2000 AdamW steps on batches of $32 \times 48$ tokens. Every 25 steps
# the run measured, on a fixed batch of 200 `repeated_tokens` sequences ($L = 24$), the loss
# at each position and each head's scores. Each head gets two:
#
# * **previous-token score**: its mean attention from position $t$ to $t-1$;
# * **prefix-matching score**: from each token of the repeat, at position $L + i$, its mean
#   attention to position $i + 1$, the token that followed the same token last time.

# %%
show_source(prefix_matching_score)

# %%
model2, info2 = load_induction_model("induction_2l")
model1, info1 = load_induction_model("induction_1l")
L = info2["recipe"]["eval_segment"]
hist2, hist1 = info2["history"], info1["history"]
steps = torch.tensor(hist2["step"])
pos_loss2, pos_loss1 = torch.tensor(hist2["position_loss"]), torch.tensor(hist1["position_loss"])
rep = repeat_mask(L)
first2, repeat2 = pos_loss2[:, : L - 1].mean(1), pos_loss2[:, rep].mean(1)
first1, repeat1 = pos_loss1[:, : L - 1].mean(1), pos_loss1[:, rep].mean(1)
icl2 = icl_score(pos_loss2, L // 2, L + L // 2)  # the same token, first time vs repeat
icl1 = icl_score(pos_loss1, L // 2, L + L // 2)
prev_score = torch.tensor(hist2["previous_token"])  # (evals, layers, heads)
prefix_score = torch.tensor(hist2["prefix_matching"])
print(f"trained parameters: {info2['parameters']} (two layers), {info1['parameters']} (one layer); "
      f"evaluated every {info2['recipe']['eval_every']} steps")

# %% [markdown]
# The **in-context-learning score** of Olsson et al. is the loss at a late token minus the
# loss at an early one (they take the 500th and the 50th token of text). Here the late token
# is position $L + L/2$ of the repeat and the early one the same token's first occurrence,
# $L/2$; a model that learns from its context makes it negative.
#
# The figure shows the two runs over training. Left: the loss on the first occurrence stays
# near $\log 64 = 4.16$ nats for both (nothing can predict a random token), while the loss on
# the repeat of the two-layer model, after a plateau of 900 steps, falls from 3.6 to below 1
# within about 150 steps (and to 0.44 by the end); the training loss over all tokens (green)
# shows the same drop, smaller, as only a third of the training tokens are predictable repeats. Middle: the in-context-learning score jumps at the same steps. Right: the
# previous-token score of one layer-0 head and the prefix-matching scores of the layer-1
# heads rise together, at the grey band, where the loss drops.

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 4))
ax = axes[0]
ax.plot(steps, first2, label="2 layers, first occurrence", color="C0", ls="--")
ax.plot(steps, repeat2, label="2 layers, repeat", color="C0")
ax.plot(steps, first1, label="1 layer, first occurrence", color="C1", ls="--")
ax.plot(steps, repeat1, label="1 layer, repeat", color="C1")
ax.plot(steps[1:], hist2["train_loss"][1:], label="2 layers, training batches (all tokens)", color="C2", lw=0.8)
ax.axhline(math.log(64), color="grey", lw=0.8)
ax.set(xlabel="training step", ylabel="loss (nats/token)", title="Loss on each half of [segment | segment]")
ax.legend(fontsize="small")
axes[1].plot(steps, icl2, label="2 layers")
axes[1].plot(steps, icl1, label="1 layer")
axes[1].set(xlabel="training step", ylabel="loss(L + L/2) − loss(L/2)  (nats)",
            title="In-context-learning score")
axes[1].legend()
for h in range(prev_score.shape[2]):
    axes[2].plot(steps, prev_score[:, 0, h], ls="--", label=f"layer 0 head {h}: previous token")
    axes[2].plot(steps, prefix_score[:, 1, h], label=f"layer 1 head {h}: prefix matching")
axes[2].set(xlabel="training step", ylabel="mean attention weight", title="Head scores during training")
axes[2].legend(fontsize="small")
drop = int(steps[1:][(repeat2[1:] - repeat2[:-1]).argmin()])  # steepest drop of the repeat loss
for ax in axes:
    ax.axvspan(drop - 50, drop + 50, color="grey", alpha=0.2)
fig.suptitle("Two-layer vs one-layer attention-only models on repeated random tokens")
fig.tight_layout()
save_figure(fig, "24_induction_heads_phase_change")
plt.show()

# %% [markdown]
# This is the "bump" of Olsson et al. in miniature: a plateau, then a fall within a few
# hundred steps, visible in the overall loss too. The alignment, measured: the step of the steepest fall of the
# repeat loss and of the ICL score, of the steepest rise of the best prefix-matching score and of the best
# previous-token score. How close must they be? The tolerance is fixed here, before the steps are
# read, from the run alone: four evaluation intervals (100 steps, 5% of the run). If the four
# steps were independent and uniform over the 80 evaluations, they would fall within four
# intervals of each other with the probability `alignment_chance` computes, well under 1 in 1000.

# %%
tolerance = 4 * info2["recipe"]["eval_every"]  # steps; set before the alignment is measured
print(f"tolerance {tolerance} steps; chance of meeting it with four random steps: "
      f"{alignment_chance(len(steps) - 1, 4, tolerance // info2['recipe']['eval_every']):.1e}")

# %%
def steepest(curve, sign):
    """Step at which the curve changes fastest in the direction ``sign`` (+1 rises, -1 falls)."""
    return int(steps[1:][(sign * (curve[1:] - curve[:-1])).argmax()])


align = {"repeat loss falls": steepest(repeat2, -1), "ICL score falls": steepest(icl2, -1),
         "prefix matching rises (layer 1)": steepest(prefix_score[:, 1].max(1).values, +1),
         "previous token rises (layer 0)": steepest(prev_score[:, 0].max(1).values, +1)}
for what, step in align.items():
    print(f"{what:34s} step {step}")
# the plateau: from the first evaluation within 0.1 nats of log V to the last one above 3.6;
# the fall: from there to the first evaluation below 1 nat
on_plateau = int(steps[repeat2 < math.log(64) + 0.1][0])
falls = int(steps[repeat2 > 3.6][-1])
below_1 = int(steps[repeat2 < 1][0])
print(f"2 layers, repeat loss: plateau from step {on_plateau} to {falls} ({falls - on_plateau} steps), "
      f"then from {float(repeat2[steps == falls][0]):.1f} to below 1 by step {below_1} ({below_1 - falls} steps)")
checks = Checks("the phase change")
checks.true("all four within the tolerance", max(align.values()) - min(align.values()) <= tolerance,
            max(align.values()) - min(align.values()))
checks.true("2 layers, final repeat loss < log 2 (better than a coin flip between two tokens)",
            repeat2[-1] < math.log(2), round(float(repeat2[-1]), 2))
checks.true("1 layer, final repeat loss > log 24 (no better than an even bet on the segment)",
            repeat1[-1] > math.log(24), round(float(repeat1[-1]), 2))
checks.true("first occurrence stays within 0.2 of log V (both)",
            bool((first2[-1] - math.log(64)).abs() < 0.2 and (first1[-1] - math.log(64)).abs() < 0.2))
checks

# %% [markdown]
# The one-layer model learns something: its repeat loss sits about half a nat below
# $\log 64$. A single head can attend to *tokens present in the context* and raise their
# logits (a "skip-trigram" in Elhage et al.'s words); a model that spread its bet evenly over
# the $L = 24$ tokens of the segment would reach $\log 24 = 3.18$ nats on the repeat. What
# it cannot do is single out the right one.
#
# ## 24.4 Finding the heads
#
# **By their attention patterns.** The shipped two-layer model on one evaluation sequence:
# each panel is a head's attention pattern (query position down, key position across).

# %%
eval_ids = repeated_tokens(200, L, 64, torch.Generator().manual_seed(1000 + 0))
with torch.no_grad():
    logits2, cache2 = model2.run_with_cache(eval_ids)
    logits1, cache1 = model1.run_with_cache(eval_ids)
fig, axes = plt.subplots(1, 4, figsize=(11, 3.4))
for ax, (layer, h) in zip(axes, [(0, 0), (0, 1), (1, 0), (1, 1)], strict=True):
    ax.imshow(cache2["pattern"][layer][0, h], cmap="viridis", vmin=0, vmax=1)
    ax.set(title=f"layer {layer}, head {h}", xlabel="key position s", ylabel="query position t")
fig.suptitle(f"Attention patterns of the two-layer model on [segment | segment], L = {L}")
fig.tight_layout()
save_figure(fig, "24_induction_heads_patterns")
plt.show()

# %% [markdown]
# One layer-0 head attends to the position just before the query (the sub-diagonal: a
# previous-token head); the other splits its attention between the current and the previous
# position. In layer 1, from the middle of the sequence on, the attention follows a second
# diagonal $L-1$ below the main one: the query at $L + i$ attends to $i + 1$, an induction
# head (in the first half, with nothing to match, head 0 rests on the current position). The scores
# on the 200 sequences, rounded:

# %%
def score_table(cache):
    rows = []
    for layer, p in enumerate(cache["pattern"]):
        for h, (pt, pm) in enumerate(zip(previous_token_score(p), prefix_matching_score(p, L), strict=True)):
            rows.append((layer, h, round(float(pt), 2), round(float(pm), 2)))
    return rows


print("model     layer head  previous-token  prefix-matching")
for name, cache in (("2 layers", cache2), ("1 layer", cache1)):
    for layer, h, pt, pm in score_table(cache):
        print(f"{name:9s} {layer:5d} {h:4d}  {pt:14.2f}  {pm:15.2f}")

# %% [markdown]
# A uniform causal head would score $(H_T - 1)/(T - 1) = 0.07$ on the previous-token scale
# for $T = 48$ (exercise 2) and about $0.03$ on the prefix-matching scale: both of the
# layer-1 heads of the two-layer model are induction heads, its layer-0 head 1 is the main
# previous-token head, and no head of the one-layer model is either.
#
# **By ablation.** Patterns show where a head looks, not whether the loss needs it. Ablating
# a head, replacing its output by zero or by its mean over the batch at each position (mean
# ablation keeps the head's average contribution and removes only what depends on the
# sequence), and measuring the loss on the repeated tokens:

# %%
show_source(head_ablation_effects)

# %%
zero2 = head_ablation_effects(model2, eval_ids, rep, "zero")
mean2 = head_ablation_effects(model2, eval_ids, rep, "mean")
base_loss = float(per_position_loss(logits2, eval_ids)[:, rep].mean())
print(f"intact model: {base_loss:.2f} nats on the repeated tokens")
print("layer head   zero-ablated  mean-ablated  (rise of the repeat loss, nats)")
for layer in range(2):
    for h in range(2):
        print(f"{layer:5d} {h:4d}   {float(zero2[layer, h]):12.2f}  {float(mean2[layer, h]):12.2f}")

# %% [markdown]
# **Cutting the K-composition path alone.** Section 24.2 predicts that the induction head
# finds its key through K-composition. The model can let layer 1's keys read only the
# embeddings (the residual stream without layer 0's output) while its queries and values
# still read everything, and the same for queries and for values:

# %%
cut = {}
with torch.no_grad():
    for which in ("q", "k", "v"):
        cut[which] = float(per_position_loss(model2(eval_ids, composition={1: which}), eval_ids)[:, rep].mean())
for which, loss in cut.items():
    print(f"layer 1 {which.upper()} cut off from layer 0: repeat loss {loss:.2f} nats (intact {base_loss:.2f})")

# %%
prev_head = int(previous_token_score(cache2["pattern"][0]).argmax())
checks = Checks("the heads of the two-layer model")
checks.true("ablating the previous-token head (layer 0) costs > 2 nats", zero2[0, prev_head] > 2,
            round(float(zero2[0, prev_head]), 2))
checks.true("it is the layer-0 head whose ablation hurts most",
            int(zero2[0].argmax()) == prev_head and int(mean2[0].argmax()) == prev_head)
checks.true("the layer-1 head with the best prefix matching hurts most when ablated",
            int(zero2[1].argmax()) == int(prefix_matching_score(cache2["pattern"][1], L).argmax()))
checks.true("cutting K-composition leaves it worse than the one-layer model", cut["k"] > float(repeat1[-1]),
            round(cut["k"], 2))
checks.true("cutting K costs more than cutting Q or V", cut["k"] > max(cut["q"], cut["v"]))
checks

# %% [markdown]
# Ablating the previous-token head costs more than ablating either induction head (the two
# induction heads partly stand in for each other; both need the previous-token head), and
# cutting layer 1's keys off from layer 0 leaves the model worse than the one-layer model,
# while cutting the queries or the values costs far less: the circuit is previous-token
# head → K-composition → induction head.
#
# **Before and after.** The run also shipped the weights at steps 800 (before the drop) and
# 1200 (after). The induction head and the previous-token head appear together:

# %%
for step in info2["recipe"]["snapshots"]:
    snap, _ = load_induction_model("induction_2l", step=step)
    with torch.no_grad():
        lg, cache = snap.run_with_cache(eval_ids)
    print(f"step {step:4d}: repeat loss {float(per_position_loss(lg, eval_ids)[:, rep].mean()):.2f}, "
          f"best previous-token score (layer 0) {float(previous_token_score(cache['pattern'][0]).max()):.2f}, "
          f"best prefix-matching score (layer 1) {float(prefix_matching_score(cache['pattern'][1], L).max()):.2f}")

# %% [markdown]
# ## 24.5 Why it takes two layers
#
# **One layer cannot.** In a one-layer attention-only model the score of key $s$ for query $t$
# is $e_t^\top W_{QK} e_s$, a function of the two tokens and of $t - s$ only. To predict the
# repeat at $t = L + i$ the head must put its weight on $s = i + 1$, the one position whose
# *previous* token equals $x_t$; but $x_{s-1}$ appears nowhere in the score. With $L$ and the
# start random, neither does any fixed offset find it. The best a head can do is to attend to
# the tokens of the context in general, which is what the one-layer model learned. The
# two-layer model escapes through the K-composition term of section 24.2: layer 0 writes
# $x_{s-1}$ into position $s$, and layer 1's keys read it.
#
# A direct test: change only the token at position $i$ (the first occurrence of $x_t$). In the
# one-layer model no other key's score moves, so its pattern over the other keys,
# renormalised, is unchanged; in the two-layer model the weight on $i + 1$ collapses.

# %%
t, i = L + 10, 10
changed = eval_ids[:1].clone()
changed[0, i] = (changed[0, i] + 1) % 64


def weights_without_i(model, ids_):
    with torch.no_grad():
        _, cache = model.run_with_cache(ids_)
    p = cache["pattern"][-1][0, :, t, : t + 1].double()  # (H, t + 1): the last layer, query t
    keep = torch.ones(t + 1, dtype=torch.bool)
    keep[i] = False
    return p[:, keep] / p[:, keep].sum(-1, keepdim=True), p[:, i + 1]


(one_a, _), (one_b, _) = weights_without_i(model1, eval_ids[:1]), weights_without_i(model1, changed)
(_, two_a), (_, two_b) = weights_without_i(model2, eval_ids[:1]), weights_without_i(model2, changed)
checks = Checks("changing the token at i")
checks.close("1 layer: pattern over the other keys unchanged", one_a, one_b, tol=1e-6)
checks.true("2 layers: weight on i + 1 of the induction heads drops below a tenth",
            bool((two_b < 0.1 * two_a).all()), [round(float(v), 2) for v in two_b])
checks

# %% [markdown]
# **Two layers can, exactly.** Elhage et al. describe the circuit; here it is built by hand.
# The residual stream has four one-hot blocks: the token ($V$), the position ($T$), the
# previous token ($V$, written by layer 0) and the output ($V$, written by layer 1). Layer 0's
# head has query "my position $t$", key "position $s+1$", so its score is $\beta[s = t-1]$,
# and copies the token into the previous-token block; layer 1's head has query "my token",
# key "the previous-token block, minus one at $s = 0$" (position 0 has no predecessor and
# layer 0 can only make it attend to itself), and copies the token into the output block,
# which the unembedding reads.

# %%
show_source(induction_circuit_weights)

# %% [markdown]
# SymPy works out the scores exactly for $V = 3$, $T = 6$ on the sequence
# $[0, 2, 1, 0, 2, 1]$ with a symbolic sharpness $\beta$. Layer 0's scores are
# $\beta[s = t-1]$; as $\beta\to\infty$ its softmax becomes the shift to the previous
# position (position 0 attends to itself). Then layer 1's scores, split into the four terms
# of section 24.2, have no Q-composition, a K-composition term equal to
# $\beta\,[x_{s-1} = x_t]$, the induction rule itself (position 0 counts as its own
# predecessor), and a direct term $-\beta[s = 0]$ that cancels that false match at $s = 0$.

# %%
beta = sp.Symbol("beta", positive=True)
V_, T_, seq = 3, 6, [0, 2, 1, 0, 2, 1]
w = {k: sp.Matrix(v.to(torch.int64).tolist()) for k, v in induction_circuit_weights(V_, T_).items()}
X0 = sp.Matrix.vstack(*[w["W_E"][x, :] + w["W_P"][j, :] for j, x in enumerate(seq)])  # (T, d)
S0 = beta * X0 * w["W_Q0"].T * w["W_K0"] * X0.T
assert S0 == beta * sp.Matrix(T_, T_, lambda a, b: int(b == a - 1))
A0 = sp.Matrix(T_, T_, lambda a, b: int(b == max(a - 1, 0)))  # the beta -> oo limit (causal rows)
O0 = A0 * X0 * (w["W_O0"] * w["W_V0"]).T  # layer 0's output, (T, d)
QK1 = beta * w["W_Q1"].T * w["W_K1"]
direct, q_comp, k_comp = X0 * QK1 * X0.T, O0 * QK1 * X0.T, X0 * QK1 * O0.T
match = sp.Matrix(T_, T_, lambda a, b: int(seq[max(int(b) - 1, 0)] == seq[int(a)]))  # [x_{s-1} = x_t]
assert direct == -beta * sp.Matrix(T_, T_, lambda a, b: int(b == 0)) and q_comp == sp.zeros(T_, T_)
assert k_comp == beta * match and O0 * QK1 * O0.T == sp.zeros(T_, T_)
display(sp.Eq(sp.Symbol("S^{(1)}"), (direct + k_comp).applyfunc(lambda e: sp.factor(e)), evaluate=False))

# %% [markdown]
# Row $t = 4$ (token 2, seen before at position 1) has its largest score $\beta$ at key 2
# alone among the causal keys $s \le 4$, so its softmax tends to the one-hot on key 2, whose
# token 1 the head copies: the prediction for position 5 is 1, correct. SymPy takes the limit:

# %%
row = [(direct + k_comp)[4, s] for s in range(5)]
weights_row = [sp.exp(r) / sum(sp.exp(c) for c in row) for r in row]
limits = [sp.limit(wr, beta, sp.oo) for wr in weights_row]
assert limits == [0, 0, 1, 0, 0]
print("attention of query 4 as beta -> oo:", limits, "; the token at key 2 is", seq[2], "=", seq[5])

# %% [markdown]
# The same weights in the float64 `AttentionOnlyTransformer`, at finite $\beta$, on 500
# sequences of $L = 12$ distinct tokens out of $V = 16$: every repeated token is predicted
# (argmax), and the loss on them falls like $e^{-\beta}$ as $\beta$ grows.

# %%
hand_ids = repeated_tokens(500, 12, 16, torch.Generator().manual_seed(5), distinct=True)
hand_rep = repeat_mask(12)
checks = Checks("the hand-built induction circuit (float64)")
for b in (5.0, 10.0, 20.0):
    hand = induction_circuit(16, 24, beta=b)
    with torch.no_grad():
        hand_logits, hand_cache = hand.run_with_cache(hand_ids)
    acc = (hand_logits[:, :-1].argmax(-1) == hand_ids[:, 1:])[:, hand_rep].double().mean()
    hand_loss = per_position_loss(hand_logits, hand_ids)[:, hand_rep].mean()
    checks.equal(f"beta = {b:g}: repeated tokens predicted (fraction)", 1.0, float(acc))
    checks.true(f"beta = {b:g}: repeat loss < 2 e^(-beta) * T", float(hand_loss) < 2 * math.exp(-b) * 24,
                f"{float(hand_loss):.1e}")
checks.close("beta = 20: previous-token score of layer 0", 1.0,
             previous_token_score(hand_cache["pattern"][0])[0], tol=1e-6)
checks.close("beta = 20: prefix-matching score of layer 1", 1.0,
             prefix_matching_score(hand_cache["pattern"][1], 12)[0], tol=1e-6)
checks

# %% [markdown]
# The hand-built circuit uses learned (one-hot) positions and a sharp softmax; the trained
# model found a soft version of the same thing with RoPE, in 64 dimensions instead of
# $3V + T = 240$, and with some of its attention spread (prefix-matching scores of 0.86 and
# 0.79 in section 24.4, not 1).
#
# ## 24.6 Induction in the book's own text model
#
# Do the same scores find induction heads in a model trained on text rather than on repeats?
# The book's text model (chapter 10: four layers of six heads, $d = 192$, a 1024-token BPE
# vocabulary, trained on docstrings with a context of 128) reads 32 sequences of $L = 48$
# uniformly random tokens repeated once. `lm_attention_patterns` hooks each block's attention and
# recomputes its pattern from the same inputs. The threshold is fixed before the scores are
# read: a head counts as an induction head if its prefix-matching score exceeds, by 0.1 (a tenth
# of its attention), its own score at the same positions on random sequences *without* a
# repeat, which measures how much it looks at offset $L - 1$ for reasons that are not induction.

# %%
text_model, text_info = book_model("text")
L_text, margin = 48, 0.1  # the margin is set here, before the scores below are computed
text_ids = repeated_tokens(32, L_text, 1024, torch.Generator().manual_seed(24))
control_ids = torch.randint(0, 1024, (32, 2 * L_text), generator=torch.Generator().manual_seed(25))
text_logits, text_patterns = lm_attention_patterns(text_model, text_ids)
_, control_patterns = lm_attention_patterns(text_model, control_ids)
score = torch.stack([prefix_matching_score(p, L_text) for p in text_patterns])  # (layers, heads)
baseline = torch.stack([prefix_matching_score(p, L_text) for p in control_patterns])
text_loss = per_position_loss(text_logits, text_ids)
first_half, second_half = float(text_loss[:, : L_text - 1].mean()), float(text_loss[:, L_text:].mean())
print("prefix-matching score, layer x head (repeat):\n", score.numpy().round(2))
print(f"best score {float(score.max()):.2f}; heads above threshold: {int((score > baseline + margin).sum())}")
print(f"loss on the first half {first_half:.2f} nats, on the repeated half {second_half:.2f} "
      f"(log V = {math.log(1024):.2f})")

# %% [markdown]
# The answer is no: no head of the text model comes near the threshold, and the repeated half
# costs about as much as the first. Its loss on random tokens is far above $\log V$: the model
# is confident about what follows in docstrings and is badly wrong about random tokens, and it
# gains almost nothing from having seen the segment. A 2M-parameter model trained for 1000
# steps on 128-token contexts has not (yet) formed induction heads; the attention-only models
# above, trained on data where induction is the only thing that helps, form them within a
# thousand steps. Chapter 24b looks for them in a real 135M-parameter model.

# %%
checks = Checks("induction in the book's text model")
checks.true("no head beats its no-repeat baseline by the margin", bool((score <= baseline + margin).all()),
            round(float((score - baseline).max()), 3))
checks.true("the repeated half gains less than 0.5 nats", first_half - second_half < 0.5,
            round(first_half - second_half, 2))
checks

# %% [markdown]
# ## 24.7 In-context learning as one step of gradient descent
#
# von Oswald et al. (2023) give a precise sense to "attention can implement gradient descent".
# Take in-context linear regression: a prompt holds $N$ examples $(x_i, y_i)$, $x_i\in\mathbb
# R^d$, $y_i = w^\top x_i$ for a task $w$ drawn afresh for each prompt, then a query $x_q$. One
# step of gradient descent on $L(w) = \frac1{2N}\sum_i (w^\top x_i - y_i)^2$ from $w_0 = 0$ with
# learning rate $\eta$ gives $w_1 = \frac{\eta}{N}\sum_i y_i x_i$ and the prediction
# $\hat y = w_1^\top x_q$. Lay the prompt out as tokens $e_i = (x_i, y_i)$ and $e_q = (x_q, 0)$,
# and let the query pass through one **linear** self-attention layer (no softmax):
#
# $$ e_q \leftarrow e_q + \sum_{i=1}^N P W_V e_i\,(W_K e_i)^\top (W_Q e_q). $$
#
# With $W_K = W_Q = \begin{pmatrix} I_d & 0\\ 0 & 0\end{pmatrix}$, $W_V =
# \begin{pmatrix} 0 & 0\\ 0 & -1\end{pmatrix}$ and $P = \frac{\eta}{N} I$, the score is
# $x_i^\top x_q$ and the value $-\frac{\eta}{N} y_i$ in the $y$-slot, so the query's $y$-slot
# becomes $-\frac{\eta}{N}\sum_i y_i x_i^\top x_q = -\hat y$. SymPy checks it with symbols for
# every entry, $d = 3$ and $N = 4$ (the algebra does not depend on the sizes, and the tests
# check other $d$ and $N$ numerically):

# %%
show_source(gd_construction)

# %%
d_s, N_s, eta = 3, 4, sp.Symbol("eta", positive=True)
xs = [sp.Matrix(sp.symbols(f"x{i}_0:{d_s}")) for i in range(N_s + 1)]  # x_1..x_N, then x_q
ys = sp.symbols(f"y0:{N_s}")
W = {k: sp.Matrix(v.tolist()) for k, v in gd_construction(d_s, 1.0, N_s).items()}
P = eta * W["P"]  # eta / N times the identity
e = [xs[i].col_join(sp.Matrix([ys[i]])) for i in range(N_s)]
e_q = xs[N_s].col_join(sp.Matrix([0]))
update = sum((P * W["W_V"] * e[i] * (W["W_K"] * e[i]).T * (W["W_Q"] * e_q) for i in range(N_s)),
             sp.zeros(d_s + 1, 1))
w_sym = sp.Matrix(sp.symbols(f"w0:{d_s}"))
loss = sum(((w_sym.T * xs[i])[0] - ys[i]) ** 2 for i in range(N_s)) / (2 * N_s)
grad0 = sp.Matrix([sp.diff(loss, c) for c in w_sym]).subs({c: 0 for c in w_sym})  # from w_0 = 0
y_hat = (-eta * grad0).dot(xs[N_s])
assert sp.expand(-update[d_s] - y_hat) == 0 and update[:d_s, 0] == sp.zeros(d_s, 1)
display(sp.Eq(sp.Symbol(r"\hat{y}"), sp.factor(y_hat), evaluate=False))

# %% [markdown]
# **Does training find it?** A layer started from random weights and trained on fresh prompts
# ($d = 3$, $N = 10$, $x\sim U(-1,1)^d$, $w\sim\mathcal N(0, I)$) cannot learn "a" learning
# rate: it learns the one that is best for this data. One step gives $w_1 = \eta S w$ with
# $S = \frac1N\sum_i x_i x_i^\top$, and the expected error is smallest at
# $\eta^* = \operatorname{tr}E[S] / \operatorname{tr}E[S^2]$. SymPy derives it from the
# moments $E[x^2] = 1/3$, $E[x^4] = 1/5$ of the uniform distribution:

# %%
x_, d_, N_ = sp.symbols("x d N", positive=True)
m2, m4 = (sp.integrate(x_ ** k / 2, (x_, -1, 1)) for k in (2, 4))
ES2 = (m4 + (d_ - 1) * m2 ** 2) / N_ + (N_ - 1) / N_ * m2 ** 2  # a diagonal entry of E[S^2]
eta_star = sp.simplify(m2 / ES2)
display(sp.Eq(sp.Symbol(r"\eta^*"), eta_star, evaluate=False))
d_icl, N_icl = 3, 10
checks = Checks("one LSA layer = one GD step")
checks.close("eta* (SymPy) = optimal_learning_rate", float(eta_star.subs({d_: d_icl, N_: N_icl})),
             optimal_learning_rate(d_icl, N_icl), tol=1e-12)
tokens, target = regression_prompts(4000, N_icl, d_icl, torch.Generator().manual_seed(7))
eta_opt = optimal_learning_rate(d_icl, N_icl)
constructed = LinearSelfAttention(d_icl, weights=gd_construction(d_icl, eta_opt, N_icl))
with torch.no_grad():
    checks.close("constructed layer = one GD step (autograd), float64", gd_prediction(tokens, eta_opt),
                 constructed.predict(tokens), tol=1e-12)
gd_err = {f: float(((gd_prediction(tokens, f * eta_opt) - target) ** 2).mean()) for f in (0.8, 1.0, 1.2)}
checks.true("GD error at eta* below that at 0.8 eta* and 1.2 eta*", gd_err[1.0] < min(gd_err[0.8], gd_err[1.2]),
            round(gd_err[1.0], 3))
checks

# %%
layer, lsa_losses = train_lsa(d_icl, N_icl, seed=0)
with torch.no_grad():
    trained_pred = layer.predict(tokens)
gd_pred = gd_prediction(tokens, eta_opt)
with torch.no_grad():
    M, M_gd = effective_weights(layer), effective_weights(gd_construction(d_icl, eta_opt, N_icl))
weight_gap = float((M - M_gd).norm() / M_gd.norm())
pred_gap = float((trained_pred - gd_pred).pow(2).mean().sqrt() / gd_pred.pow(2).mean().sqrt())
print(f"relative distance of the trained weights (M) from the construction with eta*: {weight_gap:.3f}")
print(f"relative RMS gap of the predictions: {pred_gap:.3f}; errors: trained "
      f"{float(((trained_pred - target) ** 2).mean()):.3f}, one GD step {gd_err[1.0]:.3f}")

# %% [markdown]
# The weights are compared through $M_{abk} = (PW_V)_{d,a}(W_K^\top W_Q)_{b,k}$, the product
# that the prediction depends on: rescaling $P$ by $c$ and $W_Q$ by $1/c$ changes the matrices
# and nothing the layer computes. The left panel shows the training loss falling to the error
# of one gradient step with $\eta^*$; the right panel the trained layer's predictions against
# the gradient step's on fresh prompts.

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
axes[0].plot(lsa_losses, lw=0.6, label="trained LSA layer (batch loss)")
axes[0].axhline(gd_err[1.0], color="C3", ls="--", label=f"one GD step, eta* = {eta_opt:.2f}")
axes[0].set(yscale="log", xlabel="training step", ylabel="mean squared error",
            title="Training one linear self-attention layer")
axes[0].legend()
axes[1].scatter(gd_pred[:500], trained_pred[:500], s=4)
axes[1].plot([-3, 3], [-3, 3], color="grey", lw=0.8)
axes[1].set(xlabel="one GD step's prediction", ylabel="trained layer's prediction",
            title="Predictions on 500 fresh prompts")
fig.tight_layout()
save_figure(fig, "24_induction_heads_icl_gd")
plt.show()

# %%
checks = Checks("the trained layer converges to the construction")
checks.true("weights within 3% of the construction with eta*", weight_gap < 0.03, round(weight_gap, 3))
checks.true("predictions within 3% (relative RMS)", pred_gap < 0.03, round(pred_gap, 3))
checks

# %% [markdown]
# **When the claim holds.** Exactly, under all of these: linear attention (no softmax, no
# normalisation); the token layout $(x_i, y_i)$ with the query's $y$ set to 0 and read back with
# a minus sign; gradient descent from $w_0 = 0$ on the squared loss, with $\eta$ entering as
# $P = \frac{\eta}{N}I$; one layer for one step. Training recovers the construction when the
# inputs are isotropic, as here: the symmetry of $U(-1,1)^d$ makes the best matrix a multiple
# of $I$. With correlated inputs the best layer is a *preconditioned* step, $\hat y = x_q^\top
# \Gamma \frac1N\sum_i y_i x_i$ with $\Gamma \ne \eta I$; with softmax attention
# the equality is not exact; more layers do more than repeat the same step.

# %%
claims = ClaimGrades("a claim from the published texts")
claims.grade("C15", "Transformers can implement gradient descent implicitly through attention.",
             f"one linear attention layer with von Oswald et al.'s weights equals one GD step (SymPy, "
             f"and float64 to 1e-12); a trained layer lands within {weight_gap:.3f} (weights) and "
             f"{pred_gap:.3f} (predictions) of it", "true only under a condition")
claims

# %% [markdown]
# ## 24.8 Summary
#
# * On repeated random tokens, a two-layer attention-only model learns induction in an
#   abrupt phase change: the loss on the repeat falls from $\log V$ to below half a nat within
#   a couple of hundred steps, in step with the in-context-learning score and with the
#   previous-token and prefix-matching scores of its heads. A one-layer model stays near
#   $\log V$: it can boost the tokens of its context but not find the right one.
# * The circuit is found twice: by attention patterns (a previous-token head in layer 0,
#   induction heads in layer 1) and by ablation; cutting only the K-composition path destroys
#   it, as Elhage et al.'s decomposition of the score predicts.
# * A hand-built two-layer model on one-hot embeddings implements induction exactly: SymPy
#   shows its layer-1 score is $\beta([x_{s-1} = x_t] - [s = 0])$, and it predicts every
#   repeated token.
# * The book's own text model has no induction head on repeated random tokens: no head passes
#   a threshold fixed before looking, and the repeated half is not predicted better.
# * One linear self-attention layer with von Oswald et al.'s weights *is* one step of gradient
#   descent on in-context linear regression (SymPy), and a layer trained on such prompts lands
#   on that construction with the best learning rate for the data: claim C15 holds under the
#   stated conditions (linear attention, the $(x_i, y_i)$ layout, $w_0 = 0$, one layer = one step).
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/24_induction_heads.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 24` writes a stub
# of every function, `llmbook grade 24` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_24.py` runs
# the same checks on the reference.
#
# 1. **The positional shortcut.** Build a *one-layer* attention-only model with learned
#    one-hot positions that predicts the repeat of `repeated_tokens` data perfectly for one
#    fixed $L$ (attend from $t$ to $t - L + 1$), and show that it fails for another $L$. This
#    is why the training data randomises $L$ and the start.
# 2. **A baseline for the scores.** Derive with SymPy the previous-token score of a head
#    that attends uniformly to all causal positions, $\frac{1}{T-1}\sum_{t=1}^{T-1}
#    \frac{1}{t+1} = \frac{H_T - 1}{T-1}$, and check it against `previous_token_score`.
# 3. **How sharp must the circuit be?** Find (by bisection) the smallest $\beta$ for which
#    the hand-built circuit's loss on the repeated tokens is below $10^{-2}$ nats, for
#    $V = 16$, $L = 12$.
#
# Solutions: `notebooks/solutions/24_induction_heads.py`.

# %%
from llmbook.workbench import grade

grade("24", globals())
