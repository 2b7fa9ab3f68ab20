# %% [markdown]
# # 4 Attention
#
# An embedding gives each token a vector that knows nothing about its neighbours: "bank"
# gets the same vector next to "river" and next to "money". **Attention** is the operation
# that lets each position look at the others and take in what it needs. Every position
# asks a question (a *query*), every position advertises what it holds (a *key*) and what
# it would hand over (a *value*); each query collects a weighted average of the values,
# weighted by how well its question matches each key (Vaswani et al., 2017, "Attention Is
# All You Need"):
#
# $$ \operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V. $$
#
# This chapter takes the formula apart:
#
# 1. $Q$, $K$, $V$ as three linear projections of the same embeddings, and a worked example
#    on "the cat sat" computed exactly in SymPy;
# 2. why the scores are divided by $\sqrt{d_k}$: $\operatorname{Var}(q \cdot k) = d_k$, derived
#    symbolically, and what happens to the softmax without the scale;
# 3. the causal mask that makes a decoder unable to read the future;
# 4. multi-head attention as nothing more than a reshape, and its grouped-query variants;
# 5. the cost: $O(T^2 d)$ operations, counted in closed form and measured.
#
# Everything is checked against PyTorch's own attention, `torch.nn.MultiheadAttention` and
# Hugging Face's Llama attention.

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import Math, display
from sympy.stats import E as expectation
from sympy.stats import Normal, Rademacher
from torch.utils.flop_counter import FlopCounterMode

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.embedding import TokenEmbedding
from llmbook.transformer.attention import (
    MultiHeadAttention,
    attention_flops,
    attention_weights,
    causal_mask,
    scaled_dot_product_attention,
)

g = seed_everything(0)
torch.set_default_dtype(torch.float32)

# %% [markdown]
# ## 4.1 Queries, keys and values
#
# Stack the $T$ embeddings of a sequence as the rows of $X \in \mathbb{R}^{T \times d}$.
# Three learned matrices project every row three ways:
#
# $$ Q = X W_Q, \quad K = X W_K, \quad V = X W_V, \qquad
#    W_Q, W_K \in \mathbb{R}^{d \times d_k},\ W_V \in \mathbb{R}^{d \times d_v}. $$
#
# Query $i$ scores key $j$ by the dot product $S_{ij} = q_i \cdot k_j$, so $S = Q K^\top$
# is $T \times T$. Each row of scores becomes a probability distribution over the positions,
# $A = \operatorname{softmax}(S / \sqrt{d_k})$ row by row, and the output of position $i$
# is the average of the values under it, $z_i = \sum_j A_{ij} v_j$, that is $Z = A V$.
# It is a soft dictionary lookup: a hard lookup would return the one value whose key equals
# the query; attention returns every value, weighted by similarity.
#
# ## 4.2 A worked example: "the cat sat"
#
# Three tokens, $d = 4$, $d_k = d_v = 2$, and small rational matrices chosen by hand so that
# SymPy can carry every step exactly (the numbers mean nothing; they only have to be easy to
# follow):

# %%
words = ["the", "cat", "sat"]
X_ex = sp.Matrix([[1, 0, 1, 0],
                  [0, 2, 0, 1],
                  [1, 1, 0, 1]])  # (T, d) = (3, 4): one row per word
W_Q = sp.Matrix([[1, 0], [0, 1], [1, 1], [0, 0]])  # (d, d_k) = (4, 2)
W_K = sp.Matrix([[0, 1], [1, 0], [1, 0], [0, 1]])
W_V = sp.Matrix([[1, 0], [0, 1], [0, 0], [1, 1]]) / 2
Q_ex, K_ex, V_ex = X_ex * W_Q, X_ex * W_K, X_ex * W_V
S_ex = Q_ex * K_ex.T  # (T, T) raw scores
S_scaled = S_ex / sp.sqrt(2)  # divided by sqrt(d_k)
display(Math(r"Q = " + sp.latex(Q_ex) + r",\ K = " + sp.latex(K_ex) + r",\ V = " + sp.latex(V_ex)
             + r",\ \frac{QK^\top}{\sqrt{2}} = " + sp.latex(S_scaled)))

# %% [markdown]
# The softmax of row $i$ is $A_{ij} = e^{S_{ij}/\sqrt{2}} / \sum_{j'} e^{S_{ij'}/\sqrt{2}}$.
# SymPy keeps it exact, as exponentials of multiples of $\sqrt 2$; here is the first row,
# and the exact output $z_1$ of "the":

# %%
def softmax_rows(M):
    """Row-wise softmax of a SymPy matrix, exactly."""
    E_ = M.applyfunc(sp.exp)
    return sp.Matrix(M.rows, M.cols, lambda r, c: E_[r, c] / sum(E_[r, :]))


A_ex = softmax_rows(S_scaled)  # (T, T)
Z_ex = A_ex * V_ex  # (T, d_v)
assert all(sp.simplify(sum(A_ex[r, :]) - 1) == 0 for r in range(3))
display(Math(r"A_{1,:} = " + sp.latex(A_ex[0, :]) + r",\qquad z_1 = "
             + sp.latex(sp.simplify(Z_ex[0, :]))))

# %% [markdown]
# To four decimals, every intermediate table:

# %%
def print_table(name, M, rows, cols=None):
    cols = cols or [f"[{c}]" for c in range(M.cols)]
    print(f"{name}:".ljust(8) + "".join(c.rjust(9) for c in cols))
    for r, label in enumerate(rows):
        print(f"  {label}".ljust(8) + "".join(f"{float(M[r, c]):9.4f}" for c in range(M.cols)))


for name, M, cols in [("Q", Q_ex, None), ("K", K_ex, None), ("V", V_ex, None),
                      ("S", S_ex, words), ("S/√2", S_scaled, words), ("A", A_ex, words),
                      ("Z", Z_ex, None)]:
    print_table(name, M, words, cols)

# %% [markdown]
# Read row "sat" of $A$: the query of "sat" spends 40% of its attention on "cat" and 40%
# on itself, because $q_{\text{sat}} = (1, 1)$ meets the keys $(2, 1)$ and $(1, 2)$ equally
# well, and only 20% on "the". Its output $z_3$ is therefore close to the average of
# $v_{\text{cat}}$ and $v_{\text{sat}}$.
#
# The package computes the same thing in two steps, the weights $A$ and then $AV$, for any
# number of leading (batch, head) dimensions. The mask arguments are explained in section 4.4.

# %%
show_source(attention_weights)

# %%
show_source(scaled_dot_product_attention)

# %% [markdown]
# The package, in float32 and float64, against the exact SymPy values (evaluated to 30
# digits) and against PyTorch's `torch.nn.functional.scaled_dot_product_attention`:

# %%
def to_torch(M, dtype):
    return torch.tensor([[float(sp.N(x, 30)) for x in M.row(r)] for r in range(M.rows)], dtype=dtype)


checks = Checks('"the cat sat" worked example')
for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
    Q_t, K_t, V_t = (to_torch(M, dtype) for M in (Q_ex, K_ex, V_ex))
    tag = str(dtype).replace("torch.", "")
    checks.close(f"A vs SymPy ({tag})", to_torch(A_ex, torch.float64), attention_weights(Q_t, K_t), tol=tol)
    checks.close(f"Z vs SymPy ({tag})", to_torch(Z_ex, torch.float64),
                 scaled_dot_product_attention(Q_t, K_t, V_t), tol=tol)
    checks.close(f"Z vs torch SDPA ({tag})", F.scaled_dot_product_attention(Q_t, K_t, V_t),
                 scaled_dot_product_attention(Q_t, K_t, V_t), tol=tol)
checks

# %% [markdown]
# ## 4.3 Why divide by $\sqrt{d_k}$
#
# At initialisation the components of a query and a key are roughly independent with mean
# 0 and variance 1 (that is what the initialisation and, later, the normalisation layers of
# chapter 6 aim for). Then the score $s = q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ has mean
# $\sum_i \mathbb{E}[q_i]\,\mathbb{E}[k_i] = 0$, and its second moment splits into the
# $d_k$ diagonal terms and the $d_k(d_k - 1)$ off-diagonal ones:
#
# $$ \mathbb{E}[s^2] = \sum_{i,j} \mathbb{E}[q_i q_j]\,\mathbb{E}[k_i k_j]
#    = \sum_{i} \mathbb{E}[q_i^2]\,\mathbb{E}[k_i^2] + \sum_{i \ne j} \mathbb{E}[q_i]\mathbb{E}[q_j]\mathbb{E}[k_i]\mathbb{E}[k_j]
#    = d_k\, m_2^2 + d_k (d_k - 1)\, m_1^4, $$
#
# with $m_1 = \mathbb{E}[x]$ and $m_2 = \mathbb{E}[x^2]$ the first two moments of a
# component. Only independence was used, no distribution. SymPy checks the counting for
# $d_k = 1, \dots, 6$ by expanding $s^2$ and replacing each monomial by its expectation: by
# independence, the product of the moments of its factors. Then it puts in $m_1 = 0$,
# $m_2 = 1$:

# %%
m1, m2 = sp.symbols("m_1 m_2")
dk = sp.Symbol("d_k", integer=True, positive=True)
second_moment = dk * m2**2 + dk * (dk - 1) * m1**4


def iid_expectation(poly_expr, variables):
    """E[poly] for independent variables with E[x] = m1, E[x^2] = m2 (degree <= 2 in each)."""
    poly = sp.Poly(sp.expand(poly_expr), *variables)
    moment = {0: 1, 1: m1, 2: m2}
    return sum(coeff * sp.prod([moment[p] for p in powers]) for powers, coeff in poly.terms())


for d_ in range(1, 7):
    qs, ks = sp.symbols(f"q:{d_}"), sp.symbols(f"k:{d_}")
    s = sum(a * b for a, b in zip(qs, ks, strict=True))
    assert sp.expand(iid_expectation(s**2, qs + ks) - second_moment.subs(dk, d_)) == 0
    assert iid_expectation(s, qs + ks) == d_ * m1**2
variance = second_moment - (dk * m1**2) ** 2
assert sp.expand(variance - dk * (m2**2 - m1**4)) == 0
variance = dk * (m2**2 - m1**4)
var_unit = variance.subs({m1: 0, m2: 1})
assert var_unit == dk and sp.simplify(var_unit / (sp.sqrt(dk)) ** 2) == 1
display(sp.Eq(sp.Symbol(r"\operatorname{Var}(q \cdot k)"), variance),
        sp.Eq(sp.Symbol(r"\operatorname{Var}(q \cdot k)|_{m_1=0,\,m_2=1}"), var_unit))

# %% [markdown]
# So $\operatorname{Var}(q \cdot k) = d_k$ and $\operatorname{Var}(q \cdot k / \sqrt{d_k}) = 1$.
# As an independent check, `sympy.stats` integrates the exact distributions for
# $d_k = 2$: standard normal components, and Rademacher components ($\pm 1$ with equal
# probability, also mean 0 and variance 1):

# %%
for law in (lambda n: Normal(n, 0, 1), Rademacher):
    q_rv = [law(f"q{i}") for i in range(2)]
    k_rv = [law(f"k{i}") for i in range(2)]
    s_rv = q_rv[0] * k_rv[0] + q_rv[1] * k_rv[1]
    assert expectation(s_rv) == 0 and sp.simplify(expectation(s_rv**2)) == 2
print("sympy.stats, d_k = 2: E[q.k] = 0 and Var(q.k) = 2 for normal and Rademacher components")

# %% [markdown]
# And by Monte Carlo, with 20,000 random Gaussian pairs for each $d_k$ and a tolerance of
# four standard errors of the sample variance. The standard error needs the fourth moment:
# counting terms as above, with $\mathbb{E}[(q_ik_i)^4] = 3 \cdot 3$ for standard normals,
# $\mathbb{E}[s^4] = 9d_k + 3d_k(d_k - 1) = 3d_k^2 + 6d_k$, so $s^2$ has variance
# $2d_k^2 + 6d_k$ and the standard error of the mean of $n$ squares is
# $\sqrt{(2d_k^2 + 6d_k)/n}$.

# %%
n_mc = 20_000
checks = Checks("Var(q.k) = d_k by Monte Carlo")
for d_ in (4, 64, 512):
    q_s = torch.randn(n_mc, d_, generator=g, dtype=torch.float64)
    k_s = torch.randn(n_mc, d_, generator=g, dtype=torch.float64)
    s_mc = (q_s * k_s).sum(-1)  # (n,)
    se = math.sqrt((2 * d_**2 + 6 * d_) / n_mc)
    checks.close(f"d_k={d_}: Var(q.k)", d_, s_mc.var(), tol=4 * se)
    checks.close(f"d_k={d_}: Var(q.k / sqrt(d_k))", 1.0, (s_mc / math.sqrt(d_)).var(), tol=4 * se / d_)
checks

# %% [markdown]
# Why does the variance matter? The softmax only sees differences of scores. Scores with
# standard deviation $\sqrt{d_k}$ differ by tens when $d_k$ is in the hundreds, and then
# $e^{s_j}$ for the largest score dwarfs all others: the softmax **saturates** into a
# one-hot vector. A saturated softmax also stops learning, because its Jacobian
# $\partial p / \partial s = \operatorname{diag}(p) - p p^\top$ is zero at a one-hot $p$.
# The figure draws one query against $T = 32$ random keys, 400 times for each $d_k$,
# and measures the entropy of the attention row (in nats; at most $\log 32 = 3.47$ for
# uniform weights) and the size of the softmax Jacobian, with and without the scale.

# %%
def softmax_stats(d_, scaled, n=400, T_keys=32):
    q_ = torch.randn(n, 1, d_, generator=g, dtype=torch.float64)
    k_ = torch.randn(n, T_keys, d_, generator=g, dtype=torch.float64)
    scores = (q_ * k_).sum(-1) / (math.sqrt(d_) if scaled else 1.0)  # (n, T_keys)
    p_ = torch.softmax(scores, dim=-1)
    entropy = -(p_ * torch.log(p_.clamp_min(1e-300))).sum(-1)
    jac = torch.diag_embed(p_) - p_[:, :, None] * p_[:, None, :]  # (n, T_keys, T_keys)
    return entropy.mean().item(), torch.linalg.matrix_norm(jac).mean().item()


d_grid = [2**e for e in range(1, 13)]
stats = {sc: np.array([softmax_stats(d_, sc) for d_ in d_grid]) for sc in (True, False)}
for sc in (True, False):
    print(f"{'with' if sc else 'without'} 1/sqrt(d_k): entropy at d_k=2: {stats[sc][0, 0]:.2f}, "
          f"at d_k=4096: {stats[sc][-1, 0]:.2f} nats")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for sc, style in ((True, "o-"), (False, "s--")):
    label = r"scores $q\cdot k/\sqrt{d_k}$" if sc else r"scores $q\cdot k$ (no scale)"
    axes[0].plot(d_grid, stats[sc][:, 0], style, label=label)
    axes[1].plot(d_grid, stats[sc][:, 1], style, label=label)
axes[0].axhline(math.log(32), color="gray", lw=0.8, ls=":", label="uniform: log 32")
axes[0].set_ylabel("mean entropy of an attention row (nats)")
axes[1].set_ylabel(r"mean $\|\mathrm{diag}(p) - pp^\top\|_F$ (dimensionless)")
for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(r"key width $d_k$")
    ax.legend(fontsize=8)
axes[0].set_title("Without the scale the softmax collapses to one key")
axes[1].set_title("... and its Jacobian (the gradient signal) vanishes")
save_figure(fig, "04_attention_scaling")
plt.show()

# %% [markdown]
# With the scale (circles) both curves are flat: the scores have unit variance for every
# $d_k$, so an attention row spreads over several keys and passes gradient. Without it
# (squares) the entropy falls towards 0 as $d_k$ grows, and after a small rise (at $d_k = 8$
# the unscaled scores are spread just enough to make the softmax most sensitive) the Jacobian
# falls with it; at the head
# width of GPT-2 and Llama ($d_k = 64$ and $128$) the unscaled softmax is already nearly
# one-hot at initialisation.
#
# ## 4.4 The causal mask
#
# A language model predicts token $t+1$ from tokens $1, \dots, t$ (chapter 3). If the
# representation of position $t$ could attend to position $t+1$, the model would read the
# answer. The **causal mask** forbids every score $S_{ij}$ with $j > i$ by setting it to
# $-\infty$ before the softmax; $e^{-\infty} = 0$, so those weights are exactly zero and the
# remaining ones still sum to one. The package builds the boolean mask (True = may attend,
# PyTorch's convention):

# %%
show_source(causal_mask)

# %% [markdown]
# For $T_q \ne T_k$ there are two ways to align the triangle. PyTorch's `is_causal=True`
# (and the package's) aligns it top-left: query $i$ sees keys $0..i$. When the $T_q$ queries
# are the *newest* tokens and the keys include $T_k - T_q$ earlier ones (decoding with a KV
# cache, chapter 13), the triangle must be bottom-right aligned: `offset = T_k - T_q`.

# %%
print("causal_mask(3, 5)             causal_mask(3, 5, offset=2)")
for a, b in zip(causal_mask(3, 5).int().tolist(), causal_mask(3, 5, offset=2).int().tolist(),
                strict=True):
    print(f"  {a}            {b}")

# %% [markdown]
# A row whose keys are *all* masked has no softmax ($0/0$). The book's rule is "never a
# NaN": such a row gets zero weights and a zero output, which is also what PyTorch 2's
# `scaled_dot_product_attention` returns; the package zeroes the row's scores before the
# softmax so that the backward pass stays finite too (tested in `tests/test_attention.py`).
#
# Now a picture. A made-up sentence, a random embedding table and a random two-head
# attention layer (section 4.5) with $d = 16$; the first panel attends in both directions,
# the others are causal:

# %%
sentence = "the cat sat on the mat".split()
vocab = sorted(set(sentence))
ids = torch.tensor([vocab.index(w) for w in sentence])  # (T,)
emb = TokenEmbedding(len(vocab), 16, std=1.0, generator=g)
mha_demo = MultiHeadAttention(16, 2)
with torch.no_grad():
    for p_ in mha_demo.parameters():
        p_.copy_(torch.randn(p_.shape, generator=g) * 0.5)
    x_demo = emb(ids)[None]  # (1, T, d)
    q_d, k_d, _ = mha_demo.project_qkv(x_demo)  # (1, H, T, d_head)
    A_full = attention_weights(q_d, k_d)[0]  # (H, T, T)
    A_causal = attention_weights(q_d, k_d, is_causal=True)[0]

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
panels = [(A_full[0], "head 0, no mask"), (A_causal[0], "head 0, causal"),
          (A_causal[1], "head 1, causal")]
for ax, (A_, title) in zip(axes, panels, strict=True):
    im = ax.imshow(A_.numpy(), cmap="Blues", vmin=0, vmax=1)
    for r in range(len(sentence)):
        for c in range(len(sentence)):
            ax.text(c, r, f"{A_[r, c]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if A_[r, c] > 0.6 else "black")
    ax.set_xticks(range(len(sentence)), sentence, rotation=45)
    ax.set_yticks(range(len(sentence)), sentence)
    ax.set_xlabel("key position j (attended to)")
    ax.set_title(title)
axes[0].set_ylabel("query position i (attending)")
fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight $A_{ij}$")
fig.suptitle("Attention maps of a random 2-head layer on a made-up sentence", y=1.0)
save_figure(fig, "04_attention_causal_maps")
plt.show()

# %% [markdown]
# The causal maps are lower triangular: "the" (row 0) can only attend to itself, so its
# weight is 1; "mat" sees the whole sentence. The two occurrences of "the" have the same
# embedding, so in the unmasked panel rows 0 and 4 are identical, but under the causal mask
# they differ, because they see different prefixes. Attention by itself does not know
# *where* a token is, only what it is and what it may see; positions are chapter 5.
# The checks: causal outputs do not move when the future changes, rows sum to one, and a
# fully masked row is zero here and in PyTorch:

# %%
x2 = x_demo.clone()
x2[0, -1] = torch.randn(16, generator=g)  # change the last token only
with torch.no_grad():
    y1, y2 = mha_demo(x_demo), mha_demo(x2)
m_dead = torch.ones(6, 6, dtype=torch.bool).tril()
m_dead[2] = False
qd, kd = q_d[0], k_d[0]
checks = Checks("causal mask")
checks.close("outputs 0..4 unchanged by token 5", y1[0, :5], y2[0, :5], tol=0)
checks.true("output 5 did change", bool((y1[0, 5] - y2[0, 5]).abs().max() > 1e-3))
checks.close("rows of A sum to 1", torch.ones(2, 6), A_causal.sum(-1), tol=1e-6)
checks.close("upper triangle of A is 0", torch.zeros(2, 6, 6), A_causal.triu(1), tol=0)
checks.close("is_causal vs torch SDPA", F.scaled_dot_product_attention(qd, kd, kd, is_causal=True),
             scaled_dot_product_attention(qd, kd, kd, is_causal=True), tol=1e-6, rel=True)
checks.close("fully masked row: ours is 0", torch.zeros(2, 8),
             scaled_dot_product_attention(qd, kd, kd, mask=m_dead)[:, 2], tol=0)
checks.close("... and torch SDPA's", torch.zeros(2, 8),
             F.scaled_dot_product_attention(qd, kd, kd, attn_mask=m_dead)[:, 2], tol=0)
checks

# %% [markdown]
# ## 4.5 Multi-head attention is a reshape
#
# One attention computes one weighted average per position; a model usually wants several
# (one head may track the previous token, another the subject of the sentence). **Multi-head
# attention** (Vaswani et al., 2017, section 3.2.2) runs $H$ attentions of width
# $d_{\text{head}} = d/H$ side by side and mixes their concatenated outputs with $W_O$:
#
# $$ \operatorname{head}_h = \operatorname{Attention}(X W_Q^{h}, X W_K^{h}, X W_V^{h}),
#    \qquad \operatorname{MHA}(X) = [\operatorname{head}_1, \dots, \operatorname{head}_H]\, W_O. $$
#
# The trick that makes it cheap: $W_Q^h$ is just columns $h d_{\text{head}}, \dots,
# (h+1)d_{\text{head}} - 1$ of one $d \times d$ matrix $W_Q$. So compute $X W_Q$ once,
# shape $(B, T, d)$, **view** it as $(B, T, H, d_{\text{head}})$ (no copy: the last axis is
# split), **transpose** to $(B, H, T, d_{\text{head}})$, and one batched matrix product
# runs all heads at once. Merging is the reverse reshape. `MultiHeadAttention` names its
# projections `q_proj`, `k_proj`, `v_proj`, `o_proj`, as Llama and Qwen2 do, so their
# state dicts load without renaming (chapter 7):

# %%
show_source(MultiHeadAttention.project_qkv)

# %%
show_source(MultiHeadAttention.forward)

# %% [markdown]
# The reshape claim, checked: a loop over heads with explicit column slices of the weight
# matrices and one attention per head, against the module. Then against PyTorch's
# `nn.MultiheadAttention` with the same weights (it stores $W_Q, W_K, W_V$ stacked in one
# `in_proj_weight`; beware that its boolean `attn_mask` has the *opposite* convention,
# True = blocked). Then the module's `fused=True` path, which calls PyTorch's fused kernel
# instead of the book's function.

# %%
B, T, d, H = 2, 7, 24, 4
mha = MultiHeadAttention(d, H, bias=True, dtype=torch.float64)
x = torch.randn(B, T, d, generator=g, dtype=torch.float64)
d_head = d // H
heads = []
for h in range(H):
    cols = slice(h * d_head, (h + 1) * d_head)  # head h's slice of the d outputs
    Q_h, K_h, V_h = (x @ lin.weight[cols].T + lin.bias[cols]
                     for lin in (mha.q_proj, mha.k_proj, mha.v_proj))  # (B, T, d_head)
    heads.append(scaled_dot_product_attention(Q_h, K_h, V_h, is_causal=True))
loop_out = mha.o_proj(torch.cat(heads, dim=-1))  # (B, T, d)

# %%
ref = torch.nn.MultiheadAttention(d, H, batch_first=True, dtype=torch.float64)
with torch.no_grad():
    ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
    ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
    ref.out_proj.load_state_dict(mha.o_proj.state_dict())
    ref_out, _ = ref(x, x, x, attn_mask=~causal_mask(T), need_weights=False)  # True = blocked
    ours = mha(x)
    mha.fused = True
    fused_out = mha(x)
    mha.fused = False
checks = Checks("multi-head attention")
checks.close("module vs loop over H heads", loop_out, ours, tol=1e-14)
checks.close("module vs nn.MultiheadAttention", ref_out, ours, tol=1e-14)
checks.close("fused path vs book path", ours, fused_out, tol=1e-14)
checks.true("view + transpose made no copy", mha.split_heads(x, H).data_ptr() == x.data_ptr())
checks

# %% [markdown]
# ### Grouped-query and multi-query attention
#
# When generating text, a model keeps every past key and value in memory (the KV cache,
# chapter 13): $2 \cdot H \cdot d_{\text{head}}$ numbers per token per layer. Multi-query
# attention (Shazeer, 2019, "Fast Transformer Decoding: One Write-Head is All You Need")
# lets all $H$ query heads share one key head and one value head; grouped-query attention
# (Ainslie et al., 2023, "GQA: Training Generalized Multi-Query Transformer Models from
# Multi-Head Checkpoints") is the middle ground, $H_{kv}$ KV heads each shared by a group of
# $H / H_{kv}$ query heads, used by Llama 2 70B, Llama 3 and Qwen2. Query head $h$ reads KV
# head $\lfloor h / (H/H_{kv}) \rfloor$, which is `repeat_interleave` along the head axis.
# With $H = 8$ and $H_{kv} = 2$:

# %%
H, H_kv, d = 8, 2, 32
gqa = MultiHeadAttention(d, H, H_kv, dtype=torch.float64)
print(gqa)
print("KV head used by each query head:", torch.arange(H_kv).repeat_interleave(H // H_kv).tolist())
for n_kv in (H, H_kv, 1):
    m_ = MultiHeadAttention(d, H, n_kv)
    n_params = sum(p_.numel() for p_ in m_.parameters())
    print(f"H_kv = {n_kv}: {n_params:,} parameters, KV cache {2 * n_kv * m_.d_head} numbers per token")

# %% [markdown]
# Two checks. First, a GQA layer equals an ordinary multi-head layer whose key and value
# weights are the GQA ones with each head's rows repeated $H/H_{kv}$ times. Second, an
# independent implementation: Hugging Face's `LlamaAttention` with the same weights and
# $H_{kv} = 2$. It applies rotary position embeddings (chapter 5) to queries and keys; we
# hand it $\cos = 1$, $\sin = 0$, the rotation by angle zero, and an additive causal mask.

# %%
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention

x = torch.randn(B, T, d, generator=g, dtype=torch.float64)
full = MultiHeadAttention(d, H, dtype=torch.float64)
groups = H // H_kv
with torch.no_grad():
    full.q_proj.load_state_dict(gqa.q_proj.state_dict())
    full.o_proj.load_state_dict(gqa.o_proj.state_dict())
    for name in ("k_proj", "v_proj"):
        W = getattr(gqa, name).weight.view(H_kv, d // H, d)  # (H_kv, d_head, d)
        getattr(full, name).weight.copy_(W.repeat_interleave(groups, dim=0).reshape(d, d))
cfg = LlamaConfig(hidden_size=d, num_attention_heads=H, num_key_value_heads=H_kv)
cfg._attn_implementation = "sdpa"
hf = LlamaAttention(cfg, layer_idx=0).double()
hf.load_state_dict(gqa.state_dict())
ones, zeros = torch.ones(B, T, d // H, dtype=torch.float64), torch.zeros(B, T, d // H, dtype=torch.float64)
blocked = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal_mask(T), float("-inf"))
with torch.no_grad():
    hf_out, _ = hf(x, position_embeddings=(ones, zeros), attention_mask=blocked[None, None])
    gqa_out = gqa(x)
checks = Checks("grouped-query attention")
checks.close("GQA vs MHA with repeated KV heads", full(x), gqa_out, tol=1e-14)
checks.close("GQA vs transformers LlamaAttention", hf_out, gqa_out, tol=1e-14)
gqa.fused = True
checks.close("GQA fused (enable_gqa) vs book path", gqa_out, gqa(x), tol=1e-14)
checks

# %% [markdown]
# ## 4.6 The cost of attention
#
# Count the floating-point operations of one layer on $T$ positions (batch 1). A product of an
# $(m \times n)$ and an $(n \times p)$ matrix costs $2mnp$: a multiply and an add per term.
#
# * The four projections $XW_Q, XW_K, XW_V$ and $ZW_O$: each $(T \times d)(d \times d)$, so
#   $4 \cdot 2Td^2 = 8Td^2$.
# * The scores $QK^\top$: per head $(T \times d_{\text{head}})(d_{\text{head}} \times T)$, over
#   $H$ heads $2T^2 d$. The mix $AV$: the same, $2T^2 d$.
#
# The projections grow linearly with $T$, the attention proper quadratically; SymPy finds
# where they cross:

# %%
Ts, ds = sp.symbols("T d", positive=True)
flops_proj, flops_attn = 8 * Ts * ds**2, 2 * Ts**2 * ds + 2 * Ts**2 * ds
(crossover,) = sp.solve(sp.Eq(flops_proj, flops_attn), Ts)
display(sp.Eq(sp.Symbol("C_{attn}"), flops_proj + flops_attn), sp.Eq(sp.Symbol("T^{*}"), crossover))
print(f"GPT-2 small (d=768): the T^2 part dominates beyond T = {crossover.subs(ds, 768)} tokens")

# %%
show_source(attention_flops)

# %% [markdown]
# PyTorch's `FlopCounterMode` counts the operations of every matrix product it sees while
# the module runs; it must agree with the formula, for ordinary and grouped-query layers and
# for $T$ on both sides of $T^* = 2d$. (It counts the masked upper triangle too, as the
# formula does: the book's implementation computes all $T^2$ scores and then discards half.)

# %%
checks = Checks("FLOPs: closed form vs FlopCounterMode")
d_c, H_c = 64, 4
for T_c, n_kv in ((32, 4), (128, 4), (512, 4), (512, 1)):
    layer = MultiHeadAttention(d_c, H_c, n_kv)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        layer(torch.zeros(1, T_c, d_c))
    formula = attention_flops(T_c, d_c, H_c, n_kv)["total"]
    checks.equal(f"T={T_c}, H_kv={n_kv}", formula, counter.get_total_flops())
checks.equal("symbolic formula at T=512, d=64", int((flops_proj + flops_attn).subs({Ts: 512, ds: 64})),
             attention_flops(512, 64, 4)["total"])
checks

# %% [markdown]
# Memory follows the same pattern: the book's implementation materialises $A$, $B \cdot H
# \cdot T^2$ numbers per layer (1 GiB in float32 for one head of $T = 16{,}384$). That is
# what FlashAttention (chapter 14) avoids.
#
# Finally the clock. We time `scaled_dot_product_attention` alone (no projections) for
# one head of width $d = 64$ and $T$ from 64 to 1024, on one CPU thread, taking the fastest of
# several runs, and fit the slope of $\log(\text{time})$ against $\log T$ for $T \ge 256$. Timings depend on the
# machine and on what else it is doing, so this cell's printed numbers are not part of the
# book's checked outputs, and nothing is asserted about them.

# %% tags=["nbval-ignore-output"]
def best_time(fn, repeats=7):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


T_grid = [64, 128, 256, 512, 1024]
times = {}
n_threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: less disturbed by other work on the machine
for T_t in T_grid:
    qt, kt, vt = (torch.randn(1, 1, T_t, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        times[T_t] = best_time(lambda qt=qt, kt=kt, vt=vt: scaled_dot_product_attention(
            qt, kt, vt, is_causal=True))
torch.set_num_threads(n_threads)
big = [t for t in T_grid if t >= 256]
slope = np.polyfit(np.log([t for t in big]), np.log([times[t] for t in big]), 1)[0]
print("time per call (ms):", {t: round(1e3 * s, 3) for t, s in times.items()})
print(f"log-log slope for T >= 256: {slope:.2f}")

# %%
fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(T_grid, [1e3 * times[t] for t in T_grid], "o-", label="measured")
ref_line = [1e3 * times[1024] * (t / 1024) ** 2 for t in T_grid]
ax.loglog(T_grid, ref_line, "k:", label=r"$\propto T^2$")
ax.set_xlabel("sequence length T (tokens)")
ax.set_ylabel("time per call (ms)")
ax.set_title(f"Causal attention, one head of width 64: slope {slope:.2f}")
ax.legend()
save_figure(fig, "04_attention_time")
plt.show()

# %% [markdown]
# At short lengths fixed overheads flatten the curve; from a few hundred tokens on, doubling
# $T$ roughly quadruples the time, as $4T^2d$ predicts. (The slope can come out a little
# above 2: at the longest lengths the $T \times T$ score matrix no longer fits in the
# processor's caches, and each pass over it gets slower per element.)
#
# ## Summary
#
# * Attention is $\operatorname{softmax}(QK^\top/\sqrt{d_k})V$, with $Q, K, V$ three linear
#   projections of the same embeddings; the worked example reproduces SymPy's exact values
#   to $10^{-12}$ in float64.
# * $\operatorname{Var}(q \cdot k) = d_k$ for independent unit-variance components (any
#   distribution); dividing by $\sqrt{d_k}$ keeps the softmax from saturating, which would
#   also kill its gradient.
# * The causal mask sets the future's scores to $-\infty$; the package aligns it top-left as
#   PyTorch does, offers a bottom-right offset for KV caches, and returns zeros, not NaN, for
#   a fully masked row.
# * Multi-head attention is a view and a transpose around one batched product; GQA and MQA
#   share KV heads by `repeat_interleave`; all equal PyTorch's and Hugging Face's layers.
# * The cost is $8Td^2 + 4T^2d$ FLOPs, quadratic beyond $T = 2d$, measured with slope near 2.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/04_attention.py` and are checked by
# `tests/test_solutions_04.py`.
#
# 1. (★) **Padding masks.** A batch holds sequences of different lengths, padded to a common
#    $T$. Write `padding_mask(lengths, T)` returning a boolean mask of shape $(B, 1, 1, T)$
#    that is True for real tokens, and check that with it (and the causal mask) the outputs
#    of a `MultiHeadAttention` at the real positions equal those of each sequence run alone.
# 2. (★★) **Scores with a mean.** If the components of $q$ and $k$ have mean $\mu$ and
#    variance $\sigma^2$, find $\mathbb{E}[q \cdot k]$ and $\operatorname{Var}(q \cdot k)$ with
#    SymPy (hint: $m_1 = \mu$, $m_2 = \sigma^2 + \mu^2$ in section 4.3's formula), and the
#    scale that brings the variance back to 1. Check by Monte Carlo.
# 3. (★★) **From multi-head to grouped-query.** Ainslie et al. (2023) turn a multi-head
#    checkpoint into a GQA one by mean-pooling the key and value projection heads of each
#    group. Write `mha_to_gqa(mha, n_kv_heads)`; show that it is exact when the heads of
#    each group already have equal key and value weights, and count the parameters saved.
# 4. (★★★) **Attention's backward pass by hand.** For $Z = AV$, $A =
#    \operatorname{softmax}(S)$, $S = QK^\top s$, and an upstream gradient $G = \partial L /
#    \partial Z$, derive and implement $\partial L/\partial Q$, $\partial L/\partial K$,
#    $\partial L/\partial V$ without autograd (hint: $\partial L/\partial S = A \odot
#    (G V^\top - \operatorname{rowsum}(A \odot G V^\top))$), and check against autograd in
#    float64, with a causal mask.
