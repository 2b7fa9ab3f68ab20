# %% [markdown]
# # 24b Interpretability on SmolLM2-135M-Instruct
#
# Chapter 24 found induction heads in a two-layer model trained for the purpose. This chapter
# turns the same tools, and a few more, on the book's real model: SmolLM2-135M-Instruct, 30
# layers of 9 heads, loaded from its GGUF file into the book's `TransformerLM` (chapter 7).
# Nothing in the model is changed; every reading goes through PyTorch forward hooks that
# the functions of `llmbook.scale.interpretability` add and remove. The chapter:
#
# 1. **reads** the residual stream after every layer through the unembedding, the *logit
#    lens* (nostalgebraist, 2020, "interpreting GPT: the logit lens"), and checks that its
#    last layer is the model's own output;
# 2. **classifies** all 270 heads by measured scores: previous-token, induction (prefix
#    matching on repeated random tokens, as in chapter 24) and attention sinks (Xiao et al.,
#    2024, "Efficient Streaming Language Models with Attention Sinks");
# 3. **patches** activations (Meng et al., 2022, "Locating and Editing Factual Associations
#    in GPT") between "The capital of France is" and "The capital of Italy is" to find the
#    layers and positions that carry the answer;
# 4. **reads** the feed-forward layer as a key-value memory (Geva et al., 2021, "Transformer
#    Feed-Forward Layers Are Key-Value Memories"): which side of which matrix holds the keys
#    and which the values, and what the unit that writes " Paris" stores;
# 5. **asks** the basis question: do single embedding coordinates carry meaning, or
#    directions? (Elhage et al., 2022, "Toy Models of Superposition"), and grades three
#    claims from the published texts.
#
# The tests check every hook against a `transformers` Llama, and the real model's attention
# patterns against `transformers`' own loading of the same file (`output_attentions`, to
# $10^{-4}$).

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from llmbook.inference.gguf import load_model
from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.scale.induction import prefix_matching_score, previous_token_score, repeated_tokens
from llmbook.scale.interpretability import (
    attention_patterns,
    attention_sink_score,
    basis_probe,
    ffn_activations,
    ffn_keys_values,
    logit_lens,
    patch_residual,
    random_rotation,
    read_through_unembedding,
    residual_stream,
    top_activating,
)

seed_everything(0)
torch.set_num_threads(1)
model, tok = load_model()
c = model.config
print(f"{c.n_layers} layers, {c.n_heads} heads ({c.n_kv_heads} key-value heads), d = {c.d_model}, "
      f"d_ff = {c.d_ff}, V = {c.vocab_size}")

# %% [markdown]
# ## 24b.1 The residual stream and the logit lens
#
# Every block adds to a running sum, the residual stream $x_0, x_1, \dots, x_L$ (chapter 7);
# the output is $\mathrm{Norm}(x_L)\,W_U^\top$. The logit lens applies the same final norm and
# unembedding to an earlier $x_l$, asking what the model would say if it stopped there.
# `residual_stream` records the input of each block and of the final norm with forward
# pre-hooks:

# %%
show_source(residual_stream)

# %%
clean = torch.tensor([tok.encode("The capital of France is")])
corrupt = torch.tensor([tok.encode("The capital of Italy is")])
paris, rome = tok.encode(" Paris")[0], tok.encode(" Rome")[0]
print([tok.decode([i]) for i in clean[0].tolist()], "->", repr(tok.decode([paris])))
resid = residual_stream(model, clean)  # (L + 1, 1, T, d)
lens = logit_lens(model, resid)[:, 0, -1]  # (L + 1, V): the last position at every layer
with torch.no_grad():
    logits = model(clean)[0, -1]
rank = (lens > lens[:, paris : paris + 1]).sum(-1)  # how many tokens beat " Paris"
checks = Checks("logit lens")
checks.true("layer L of the lens = the model's logits (max error < 1e-4)",
            float((logits - lens[-1]).abs().max()) < 1e-4)
checks.equal("the model's top token", " Paris", tok.decode([int(logits.argmax())]))
checks

# %%
first_top10 = int((rank < 10).nonzero()[0])
print(f"rank of ' Paris' at layers 0, 8, 16, 23, 24, 26, 28, 30: "
      f"{[int(rank[i]) for i in (0, 8, 16, 23, 24, 26, 28, 30)]}")
print(f"first in the top 10 at layer {first_top10}; top token at layer {int((rank == 0).nonzero()[0])}")
fig, ax = plt.subplots(figsize=(6.5, 3))
ax.semilogy(range(c.n_layers + 1), rank.double() + 1, marker="o", ms=3)
ax.set(xlabel="layer l (residual stream x_l)", ylabel="rank of ' Paris' + 1",
       title="The logit lens on 'The capital of France is'")
fig.tight_layout()
save_figure(fig, "24b_real_model_interpretability_lens")
plt.show()

# %% [markdown]
# For two thirds of the depth the answer is nowhere near the top: its rank wanders in the
# thousands. It climbs within a handful of layers near the end, the shape the logit lens
# shows in larger models too. (The lens is crude for the early layers, whose residual
# stream is not written to be read by the unembedding.)
#
# ## 24b.2 The heads, classified by their scores
#
# `attention_patterns` recomputes every head's attention matrix from the layer's own
# queries and keys (with RoPE, and the three key heads shared by nine query heads), however
# the model runs its attention. To check it independently, one layer's output is rebuilt
# from the patterns, $o = W_O\,(A V)$, and compared with the module's own fused kernel.

# %%
L_seg, n_seq = 20, 3
rep = repeated_tokens(n_seq, L_seg, c.vocab_size, torch.Generator().manual_seed(0))  # (3, 40)
P = attention_patterns(model, rep)  # (L, B, H, T, T)
x5 = residual_stream(model, rep)[5]
attn5 = model.blocks[5].attn
with torch.no_grad():
    h5 = model.blocks[5].attn_norm(x5)
    _, _, v5 = attn5.project_qkv(h5, rope=model.rope)
    z5 = P[5] @ v5.repeat_interleave(c.n_heads // c.n_kv_heads, dim=-3)  # (B, H, T, d_head)
    rebuilt = attn5.o_proj(z5.transpose(1, 2).flatten(-2))
    direct = attn5(h5, rope=model.rope)
checks = Checks("attention patterns")
checks.true("layer 5: W_O (A V) from the patterns = the fused attention output (max error < 1e-4)",
            float((direct - rebuilt).abs().max()) < 1e-4)
checks

# %% [markdown]
# The three scores, each a mean attention weight: previous-token (query $t$ to key $t-1$),
# prefix matching (on the repeat, query $L+i$ to key $i+1$, the token after the first
# occurrence of the current one) and sink (queries $t \ge 1$ to the first token):

# %%
show_source(attention_sink_score)

# %%
prev = torch.stack([previous_token_score(p) for p in P])  # (L, H)
induct = torch.stack([prefix_matching_score(p, L_seg) for p in P])
sink = torch.stack([attention_sink_score(p) for p in P])
with torch.no_grad():
    nll = F.cross_entropy(model(rep)[:, :-1].flatten(0, 1), rep[:, 1:].flatten(), reduction="none")
nll = nll.view(n_seq, -1)
print(f"loss on the first segment {nll[:, : L_seg - 1].mean():.1f} nats, on the repeat "
      f"{nll[:, L_seg:].mean():.2f} nats (log V = {math.log(c.vocab_size):.1f})")
for name, s in (("previous-token", prev), ("induction", induct), ("sink", sink)):
    top = s.flatten().topk(3)
    heads = ", ".join(f"{int(i) // c.n_heads}.{int(i) % c.n_heads} ({float(v):.2f})"
                      for v, i in zip(top.values, top.indices, strict=True))
    print(f"{name:>15}: {int((s > 0.5).sum()):3d} of {s.numel()} heads above 0.5; best {heads}")

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), sharey=True)
for ax, (name, s) in zip(axes, (("previous-token", prev), ("induction", induct), ("sink", sink)), strict=True):
    im = ax.imshow(s, aspect="auto", vmin=0, vmax=1, cmap="viridis")
    ax.set(title=f"{name} score", xlabel="head")
axes[0].set_ylabel("layer")
fig.colorbar(im, ax=axes, shrink=0.8)
save_figure(fig, "24b_real_model_interpretability_heads")
plt.show()

# %% [markdown]
# The loss on the copy is far below the loss on the first segment (tokens drawn from all of
# the vocabulary surprise the model even more than a uniform guess would): the model uses
# the repeat, the induction mechanism of chapter 24 at work, if less cleanly than chapter
# 24's specialised model. The scores place it. A handful of previous-token heads sit in the early and middle layers, and
# the strongest induction heads come a few layers after them, around layers 17 and 18 (a
# previous-token head must write before an induction head can read it: K-composition).
# Sinks are the rule, not the exception: more than half of all heads park most of their
# attention on the first token, whatever it is. A head with nothing to do must still put
# its softmax weight somewhere, and the first token, seen by every query, is the place
# (Xiao et al., 2024).
#
# ## 24b.3 Activation patching: where is the capital written?
#
# Run "The capital of Italy is" (the model says " Rome"), but replace the residual stream at
# one layer $l$ and one position $t$ by its value in the run on "The capital of France is".
# If the metric logit(" Paris") - logit(" Rome") recovers, that one vector carried the
# difference. `patch_residual` does all $(L+1) \times T$ patched runs in one batch:

# %%
show_source(patch_residual)

# %%
effects, m_clean, m_corrupt = patch_residual(model, clean, corrupt, lambda z: z[:, paris] - z[:, rome])
recovered = (effects - m_corrupt) / (m_clean - m_corrupt)  # 0 = corrupted, 1 = clean
checks = Checks("patching")
checks.true("embedding of ' France' patched in = the clean run (within 1e-3)",
            abs(float(m_clean - effects[0, 3])) < 1e-3)
checks.true("last site, last position patched in = the clean run (within 1e-3)",
            abs(float(m_clean - effects[-1, -1])) < 1e-3)
checks.true("a position before the difference changes nothing (within 1e-3)",
            float((effects[:, :3] - m_corrupt).abs().max()) < 1e-3)
checks

# %%
country, last = recovered[:, 3], recovered[:, -1]
move = int((last > 0.5).nonzero()[0])
print(f"logit(Paris) - logit(Rome): clean {m_clean:.2f}, corrupted {m_corrupt:.2f}")
print(f"recovered by the country token: {country[: move].min():.2f} or more at sites 0..{move - 1}, "
      f"{country[move:].abs().max():.2f} or less from site {move} on")
print(f"recovered by the last position: {last[move:].min():.2f} or more from site {move} on, "
      f"{last[: move].abs().max():.2f} or less before")
P_clean = attention_patterns(model, clean)[move - 1, 0, :, -1, 3]  # (H,): last position -> country
print(f"block {move - 1}: attention from ' is' to ' France' per head {[round(float(a), 2) for a in P_clean]}")

# %%
fig, ax = plt.subplots(figsize=(5, 5.5))
im = ax.imshow(recovered, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
ax.set_xticks(range(clean.shape[1]), [tok.decode([i]) for i in clean[0].tolist()], rotation=30)
ax.set(ylabel="site l (input of block l; 30 = final norm)", title="fraction of the answer recovered")
fig.colorbar(im)
fig.tight_layout()
save_figure(fig, "24b_real_model_interpretability_patching")
plt.show()

# %% [markdown]
# **What patching found.** Only two positions ever matter, and they hand over cleanly. Up to
# the input of block 23, the whole difference between the two answers lives at the country
# token: patching ' France' in, at any of those layers, gives the clean answer, and patching
# anything else does nothing. From block 24's input on it lives at the last position alone.
# So the fact is moved from the subject to the last token within one block, by attention
# (the country column goes to zero at the same site where the last column goes to one), and
# the printed row shows which of block 23's heads attend from ' is' to ' France': head 4
# almost entirely. Before
# that, the country's residual stream already holds what distinguishes France from Italy,
# enough for the answer; after it, the last position's stream does. This is the pattern
# Meng et al. (2022) report for GPT-2 XL, in one small model: early-to-middle layers at the
# subject, a late move to the last token. (Patching the whole residual stream says where
# the information is, not which component computed it; exercise 1 patches a second pair.)
#
# ## 24b.4 The feed-forward layer as a key-value memory
#
# Geva et al. (2021) read a feed-forward layer $\mathrm{FFN}(x) = W_{\text{out}}\,f(W_{\text{in}} x)$
# as a memory of $d_{ff}$ slots: the hidden unit $i$ fires by how much $x$ matches a *key*
# $k_i$ and adds its *value* $v_i$ to the residual stream,
# $\mathrm{FFN}(x) = \sum_i f(k_i \cdot x)\, v_i$. In the book's `nn.Linear` layout ($y = Wx$)
# the keys are the **rows** of `up_proj.weight` ($d_{ff} \times d$; SwiGLU has a second
# key, the gate row) and the values the **columns** of `down_proj.weight` ($d \times
# d_{ff}$). In the row-vector form $x W_1 W_2$ of claim C10, $W_1 = W_{\text{in}}^\top$ has
# the keys as columns, and $W_2 = W_{\text{out}}^\top \in \mathbb{R}^{d_{ff} \times d}$ has the
# values as **rows**: its columns have length $d_{ff}$ and cannot be added to the residual
# stream.

# %%
show_source(ffn_keys_values)

# %%
layer = move  # the first block whose input carries the answer at the last position
kv = ffn_keys_values(model, layer)
W_in, W_out = model.blocks[layer].mlp.up_proj.weight, model.blocks[layer].mlp.down_proj.weight
print(f"up_proj.weight {tuple(W_in.shape)}: keys are rows; down_proj.weight {tuple(W_out.shape)}: values are columns")
h = ffn_activations(model, clean, layer)[0, -1]  # (d_ff,) at the last position
x_in = resid[layer : layer + 2, 0]  # (2, T, d): the stream entering blocks `layer` and `layer` + 1
with torch.no_grad():
    blk = model.blocks[layer]
    mid = x_in[0] + blk.attn(blk.attn_norm(x_in[0][None]), rope=model.rope)[0]  # (T, d)
ffn_out = (x_in[1] - mid)[-1]  # what the FFN added at the last position, from the stream
checks = Checks("key-value reading")
checks.true("sum_i h_i v_i = what the FFN added to the stream (max error < 1e-3)",
            float((ffn_out - h @ kv["values"]).abs().max()) < 1e-3)
checks

# %% [markdown]
# Which slots write the answer? Unit $i$ moves the metric logit(" Paris") - logit(" Rome")
# by $h_i$ times its value read through the unembedding (the final norm's gain included).
# What France changes is $(h_i^{\text{France}} - h_i^{\text{Italy}})$ times that reading; the
# unit that changes it most in each of the last six blocks, at the last position, with the
# tokens its value promotes most:

# %%
pair = torch.tensor([paris, rome])
writers = {}
for blk_i in range(c.n_layers - 6, c.n_layers):
    values = ffn_keys_values(model, blk_i)["values"]
    h_fr, h_it = ffn_activations(model, clean, blk_i)[0, -1], ffn_activations(model, corrupt, blk_i)[0, -1]
    read = read_through_unembedding(model, values, pair)  # (d_ff, 2)
    change = (h_fr - h_it) * (read[:, 0] - read[:, 1])  # (d_ff,)
    i = int(change.argmax())
    promotes = read_through_unembedding(model, values[i]).topk(5).indices
    writers[blk_i] = i
    print(f"block {blk_i}, unit {i:4d}: {float(change[i]):5.1f} of the block's {float(change.sum()):5.1f}; "
          f"value promotes {[tok.decode([int(j)]) for j in promotes]}")

# %% [markdown]
# Most of these values read as a jumble of word pieces: a value is a direction that later
# layers and the final norm also act on, not a single entry of a table. Some read cleanly,
# though, and block 28's best unit is one: its value promotes words for cities. Its key,
# seen through the contexts where it fires most in a few short sentences:

# %%
l_best, unit = c.n_layers - 2, writers[c.n_layers - 2]
texts = ["The capital of France is Paris.", "She flew from London to Paris last May.",
         "The Eiffel Tower stands in the French capital.", "Rome is the capital of Italy.",
         "He ordered a coffee and a croissant.", "Berlin and Madrid are large cities."]
enc = [tok.encode(t) for t in texts]
T_max = max(map(len, enc))
ids = torch.tensor([e + [e[-1]] * (T_max - len(e)) for e in enc])  # pad by repeating the last token
acts = ffn_activations(model, ids, l_best)
acts[torch.arange(T_max)[None, :] >= torch.tensor([len(e) for e in enc])[:, None]] = -float("inf")
vals, where = top_activating(acts, unit, 4)
for v, (b, t) in zip(vals, where.tolist(), strict=True):
    print(f"{float(v):6.2f}  ...{tok.decode(enc[b][max(0, t - 5) : t + 1])!r}")
h_all = acts[acts.isfinite()]
neg_share = float((h_all < 0).double().mean())
print(f"share of negative activations in block {l_best}: {neg_share:.2f}")

# %% [markdown]
# The key-value reading works on SmolLM2's SwiGLU, with two amendments to the textbook
# version. The "selection" is not a ReLU: $\mathrm{SiLU}(g_i \cdot x)\,(k_i \cdot x)$ is
# negative for a large share of units (printed above), so a slot can subtract its value as
# well as add it. And a slot is a direction in a shared space, not a clean entry: a value
# promotes a family of related tokens (see the list), and keys fire in related contexts.
#
# ## 24b.5 The basis question: coordinates or directions?
#
# Is "being a country" or "being capitalised" written in one coordinate of the embedding,
# or along a direction? `basis_probe` picks, on a training split, the single coordinate
# that separates two sets of tokens best and the mean-difference direction, and reports
# both held-out AUCs, and how concentrated the direction is (the share of its squared norm
# in its largest 10% of coordinates: 0.1 if spread evenly). Running it again after a random
# rotation of the embedding space is the control: a rotation keeps every direction and
# scrambles every coordinate. If single coordinates were special (a *privileged basis*),
# they would do clearly better before the rotation than after.

# %%
E = model.embed.weight.detach().double()
g = torch.Generator().manual_seed(0)
words = {i: tok.decode([i]) for i in range(c.vocab_size)}
cap = [i for i, w in words.items() if len(w) > 3 and w[0] == " " and w[1:].isalpha() and w[1].isupper() and w[2:].islower()]
low = [i for i, w in words.items() if len(w) > 3 and w[0] == " " and w[1:].isalpha() and w[1:].islower()]
countries = ("France Italy Spain Germany Japan China India Brazil Canada Mexico Russia Egypt Greece Turkey "
             "Poland Sweden Norway Kenya Chile Peru Cuba Iran Iraq Israel Ireland Portugal Austria Belgium "
             "Denmark Finland Nigeria Vietnam Korea Thailand Argentina Australia Switzerland Netherlands "
             "Ukraine Pakistan Indonesia Colombia Morocco Ethiopia Hungary Romania Scotland England").split()
animals = ("dog cat horse cow pig sheep goat lion tiger bear wolf fox deer rabbit mouse rat bird fish snake "
           "frog duck chicken eagle owl whale shark dolphin monkey elephant camel zebra bee ant spider "
           "turtle squirrel bat goose donkey crab worm parrot penguin crow hawk salmon lizard").split()
one = [tok.encode(" " + w) for w in countries + animals]
n_c = sum(len(e) == 1 for e in one[: len(countries)])
single = [e[0] for e in one if len(e) == 1]
perm = lambda ix, n: torch.tensor(ix)[torch.randperm(len(ix), generator=g)[:n]]  # noqa: E731
sets = {"capitalised vs lower-case word": torch.cat([perm(cap, 300), perm(low, 300)]),
        "country vs animal": torch.tensor(single)}
sizes = {"capitalised vs lower-case word": 300, "country vs animal": n_c}
Q = random_rotation(c.d_model, torch.Generator().manual_seed(1))
basis = {}
for name, ix in sets.items():
    y = torch.arange(len(ix)) < sizes[name]
    train = torch.rand(len(ix), generator=torch.Generator().manual_seed(2)) < 0.7
    r, s = basis_probe(E[ix], y, train), basis_probe(E[ix] @ Q, y, train)
    d = E[ix][train & y].mean(0) - E[ix][train & ~y].mean(0)
    basis[name] = (r, s, float(d[:100].pow(2).sum() / d.pow(2).sum()))
    print(f"{name} ({int(y.sum())} vs {int((~y).sum())} tokens)")
    print(f"   direction AUC {r['direction_auc']:.2f} (rotated {s['direction_auc']:.2f}); best single "
          f"coordinate {r['best_dim']}: AUC {r['best_dim_auc']:.2f} (rotated basis {s['best_dim_auc']:.2f})")
    print(f"   top-10% share {r['top10_share']:.2f} (rotated {s['top10_share']:.2f}); share in "
          f"coordinates 0-99: {basis[name][2]:.2f} (even spread {100 / c.d_model:.2f})")
rms = E.pow(2).mean(0).sqrt()
print(f"per-coordinate RMS of the embeddings: median {rms.median():.2f}, largest {rms.max():.2f}")

# %% [markdown]
# Both properties are read off a direction, and the direction does not care how the axes
# are drawn (the rotated AUCs are identical, as they must be). The axes are not arbitrary
# either: the best single coordinate does clearly better in the model's own basis than in
# a random one (for capitalisation it even beats the mean-difference direction), and each
# direction is more concentrated than its rotated copy. Elementwise operations make a basis
# special (Elhage et al., 2022); here RMSNorm's per-coordinate gain does, and a few
# coordinates have several times the median scale (printed above). But no property sits in
# a block of coordinates: the share of either direction in coordinates 0 to 99 is close to
# the even-spread share, not near 1. Meaning is in directions, some of them leaning on a
# few privileged coordinates.
#
# ## 24b.6 Claims graded

# %%
cr, cs, c100 = basis["country vs animal"]
kr, ks, k100 = basis["capitalised vs lower-case word"]
claims = ClaimGrades("claims met in this chapter")
claims.grade("C3", "embedding dimensions 1-100 encode semantic category, 101-200 emotional valence, "
             "201-300 grammatical role",
             f"SmolLM2 has d = {c.d_model}, not 896; country-vs-animal and capitalisation are read off "
             f"directions (held-out AUC {cr['direction_auc']:.2f}, {kr['direction_auc']:.2f}); coordinates "
             f"0-99 hold {c100:.2f} and {k100:.2f} of their squared norm against {100 / c.d_model:.2f} for an "
             f"even spread; the best single coordinate reaches AUC {cr['best_dim_auc']:.2f} and "
             f"{kr['best_dim_auc']:.2f} ({cs['best_dim_auc']:.2f}, {ks['best_dim_auc']:.2f} in a random basis)",
             "wrong")
claims.grade("C10", "FFN = ReLU(x W1 + b1) W2 + b2 is a key-value memory: W1 columns are keys, W2 columns "
             "are values, ReLU selects",
             f"keys: columns of W1 (rows of up_proj {tuple(W_in.shape)}), right; values: rows of W2 (columns "
             f"of down_proj {tuple(W_out.shape)}), not columns; SmolLM2 gates with SiLU, and {neg_share:.2f} "
             f"of block {l_best}'s activations are negative; the sum of h_i v_i rebuilds the FFN output",
             "wrong")
claims.grade("C16", "induction heads copy patterns; attention patterns are positional, syntactic, "
             "semantic; MLP as memory: key-value lookup",
             f"repeat loss {nll[:, L_seg:].mean():.2f} nats against {nll[:, : L_seg - 1].mean():.1f}; "
             f"{int((induct > 0.5).sum())} induction and {int((prev > 0.5).sum())} previous-token heads above "
             f"0.5, and {int((sink > 0.5).sum())} of {sink.numel()} sink heads, a kind the claim omits; "
             f"some FFN values read as a topic (block {l_best}'s unit {unit}: city words), most do not",
             "true only under a condition")
claims

# %% [markdown]
# C16 holds in outline (induction heads, positional heads, FFN slots that write facts) but
# its list of head types leaves out the commonest kind this model has, the sink, and
# "lookup" oversells how discrete the memory is.
#
# ## 24b.7 Summary
#
# * The logit lens on the real model: the answer to "The capital of France is" is far from
#   the top for two thirds of the depth and reaches rank 0 only at the output; the lens's
#   last layer is the model's output.
# * Measured head scores find previous-token heads in the early and middle layers, induction heads around layers
#   17-18 (its loss on the repeat of a random segment falls far below that on the first
#   occurrence) and attention sinks
#   in more than half of all heads.
# * Activation patching between France and Italy locates the fact at the subject token up
#   to block 23 and at the last position from block 24 on: one block's attention moves it.
# * The FFN is a key-value memory with keys in the rows of `up_proj` and values in the
#   columns of `down_proj` (the rows of $W_2$ in the row-vector form, not its columns);
#   single units change the answer's logit gap measurably, with signed, not ReLU,
#   activations, and a few values read cleanly as a topic.
# * Properties of tokens live along directions of the embedding, not in blocks of
#   coordinates; the coordinates are only mildly privileged.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/24b_real_model_interpretability.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 24b` writes a stub
# of every function, `llmbook grade 24b` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_24b.py` runs
# the same checks on the reference.
#
# 1. **A second pair.** Patch "The capital of Japan is" into "The capital of Spain is"
#    (metric logit(" Tokyo") - logit(" Madrid")) and write `move_site(recovered, position)`,
#    the first site where the last position recovers more than half. Is it the same block?
# 2. **A baseline for the sink score.** Derive with SymPy the sink score of a head that
#    attends uniformly over the causal positions, $\frac{1}{T-1}\sum_{t=1}^{T-1}
#    \frac{1}{t+1}$, and check it against `attention_sink_score`.
# 3. **The last block's units, exactly.** The final stream is $x_L = m + \sum_i h_i v_i$,
#    with $m$ the stream entering the last FFN, and the logits are
#    $W_U (g \odot x_L) / \mathrm{rms}(x_L)$. Write `logit_gap_split(model, ids, good, bad)`,
#    which returns the logit gap, $\mathrm{rms}(x_L)$, the reading of $m$ and each unit's
#    $h_i$ times the reading of $v_i$, check that they rebuild the gap exactly, and name the
#    unit that writes most of " Rome" over " Paris" for "The capital of Italy is".
#
# Solutions: `notebooks/solutions/24b_real_model_interpretability.py`.

# %%
from llmbook.workbench import grade

grade("24b", globals())
