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
# 2. why the scores are divided by $\sqrt{d_k}$: $\operatorname{Var}(q \cdot k) = d_k \sigma^4$,
#    derived symbolically, what it is at a real initialisation, and what happens to the
#    softmax without the scale;
# 3. the causal mask that makes a decoder unable to read the future, and a published
#    hand-computed example, rechecked: its attention has no mask;
# 4. multi-head attention as nothing more than a reshape, its grouped-query variants, and two
#    guards of current models against saturating scores, QK-norm and logit soft-capping;
# 5. the cost: $O(T^2 d)$ operations, counted in closed form and measured.
#
# Everything is checked against PyTorch's own attention, `torch.nn.MultiheadAttention` and
# Hugging Face's Llama attention.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display
from sympy.stats import E as expectation
from sympy.stats import Normal, Rademacher
from torch.utils.flop_counter import FlopCounterMode

from llmbook.inference.attention_variants import sliding_window_mask
from llmbook.nbtools import (
    Checks,
    ClaimGrades,
    Formula,
    best_time,
    save_figure,
    seed_everything,
    show_source,
)
from llmbook.text.embedding import TokenEmbedding
from llmbook.text.worked_example import PublishedComparison, load_the_cat_sat
from llmbook.transformer.attention import (
    MultiHeadAttention,
    attention_entropy,
    attention_flops,
    attention_weights,
    causal_mask,
    minimal_multi_head_attention,
    scaled_dot_product_attention,
    sink_attention_weights,
    sliding_window_reach,
    soft_cap,
)
from llmbook.transformer.hf_loading import from_hf, randomize_parameters_
from llmbook.transformer.layers import RMSNorm
from llmbook.transformer.model import QKNormAttention

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
display(Formula(r"Q = " + sp.latex(Q_ex) + r",\ K = " + sp.latex(K_ex) + r",\ V = " + sp.latex(V_ex)
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
display(Formula(r"A_{1,:} = " + sp.latex(A_ex[0, :]) + r",\qquad z_1 = "
             + sp.latex(sp.simplify(Z_ex[0, :]))))

# %% [markdown]
# To four decimals, every intermediate table:

# %%
def print_table(name, M, rows, cols=None):
    """Print a SymPy matrix or a 2-d tensor M, rounded to four decimals."""
    cols = cols or [f"[{c}]" for c in range(M.shape[1])]
    print(f"{name}:".ljust(10) + "".join(c.rjust(9) for c in cols))
    for r, label in enumerate(rows):
        print(f"  {label}".ljust(10) + "".join(f"{float(M[r, c]):9.4f}" for c in range(M.shape[1])))


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
# Model the components of a query and a key as independent random numbers with mean $m_1$
# and second moment $m_2$ ($m_1 = 0$ and $m_2 = \sigma^2$ for zero-mean components of
# variance $\sigma^2$). The score $s = q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ has mean
# $\sum_i \mathbb{E}[q_i]\,\mathbb{E}[k_i]$, and since $q$ and $k$ are independent, its second
# moment is a double sum,
#
# $$ \mathbb{E}[s^2] = \sum_{i=1}^{d_k} \sum_{j=1}^{d_k} \mathbb{E}[q_i q_j]\,\mathbb{E}[k_i k_j],
#    \qquad \mathbb{E}[q_i q_j] = m_2\,\delta_{ij} + m_1^2\,(1 - \delta_{ij}), $$
#
# the second formula being what independence says about two components (a square for
# $i = j$, a product of means otherwise). Only independence is used, no distribution. SymPy
# does the sums for a symbolic $d_k$ (the inner sum over $i$ leaves "1 if $j \le d_k$",
# which holds on the range of $j$):

# %%
i_, j_ = sp.symbols("i j", integer=True, positive=True)
dk = sp.Symbol("d_k", integer=True, positive=True)
m1, m2, sigma, c_ = sp.symbols("m_1 m_2 sigma c", positive=True)


def pair_moment(a, b):
    """E[x_a x_b] for independent components with E[x] = m1, E[x^2] = m2."""
    return m2 * sp.KroneckerDelta(a, b) + m1**2 * (1 - sp.KroneckerDelta(a, b))


def sum_over_ij(expr, n):
    """sum_{i=1}^{n} sum_{j=1}^{n} expr, for a symbolic n."""
    inner = sp.Sum(sp.expand(expr), (i_, 1, n)).doit()  # Piecewise(..., j <= n)
    return sp.expand(sp.Sum(sp.refine(inner, sp.Q.le(j_, n)), (j_, 1, n)).doit())


mean_s = sp.Sum(m1 * m1, (i_, 1, dk)).doit()  # E[s] = sum_i E[q_i] E[k_i]
second_moment = sum_over_ij(pair_moment(i_, j_) * pair_moment(i_, j_), dk)
variance = dk * sp.expand(sp.cancel((second_moment - mean_s**2) / dk))
var_zero_mean = variance.subs({m1: 0, m2: sigma**2})
display(sp.Eq(sp.Symbol(r"\mathbb{E}[s^2]"), sp.factor(second_moment)),
        sp.Eq(sp.Symbol(r"\operatorname{Var}(q \cdot k)"), variance),
        sp.Eq(sp.Symbol(r"\operatorname{Var}(q \cdot k)|_{m_1=0,\,m_2=\sigma^2}"), var_zero_mean))

# %% [markdown]
# Two independent checks of the general result. For $d_k = 1, \dots, 6$, expand $s^2$ as a
# polynomial in the $2d_k$ variables and replace each monomial by its expectation (by
# independence, the product of the moments of its factors). And `sympy.stats` integrates
# the exact distributions for $d_k = 2$: normal components $\mathcal{N}(0, \sigma^2)$ with a
# symbolic $\sigma$, and Rademacher components ($\pm 1$ with equal probability):

# %%
def iid_expectation(poly_expr, variables):
    """E[poly] for independent variables with E[x] = m1, E[x^2] = m2 (degree <= 2 in each)."""
    poly = sp.Poly(sp.expand(poly_expr), *variables)
    moment = {0: 1, 1: m1, 2: m2}
    return sum(coeff * sp.prod([moment[p] for p in powers]) for powers, coeff in poly.terms())


for d_ in range(1, 7):
    qs, ks = sp.symbols(f"q:{d_}"), sp.symbols(f"k:{d_}")
    s = sum(a * b for a, b in zip(qs, ks, strict=True))
    by_monomials = iid_expectation(s**2, qs + ks) - iid_expectation(s, qs + ks) ** 2
    assert sp.expand(by_monomials - variance.subs(dk, d_)) == 0
for name, law, expected in (("normal", lambda n: Normal(n, 0, sigma), var_zero_mean.subs(dk, 2)),
                            ("Rademacher", Rademacher, 2)):
    q_rv, k_rv = [law(f"q{i}") for i in range(2)], [law(f"k{i}") for i in range(2)]
    s_rv = q_rv[0] * k_rv[0] + q_rv[1] * k_rv[1]
    assert expectation(s_rv) == 0 and sp.simplify(expectation(s_rv**2) - expected) == 0
    print(f"sympy.stats, {name} components, d_k = 2: E[q.k] = 0, Var(q.k) = {sp.simplify(expectation(s_rv**2))}")
print("expansion by monomials, d_k = 1..6: Var(q.k) = d_k (m_2^2 - m_1^4) in every case")

# %% [markdown]
# So for zero-mean components $\operatorname{Var}(q \cdot k) = d_k \sigma^4$: the spread of the
# scores grows like $\sqrt{d_k}$. Multiplying the scores by $c$ multiplies their variance by
# $c^2$; the $c$ that makes it 1 is

# %%
(scale_solution,) = sp.solve(sp.Eq(c_**2 * var_zero_mean, 1), c_)
display(sp.Eq(c_, scale_solution), sp.Eq(sp.Symbol(r"c|_{\sigma=1}"), scale_solution.subs(sigma, 1)))

# %% [markdown]
# With unit-variance components this is the Transformer's $1/\sqrt{d_k}$. Whatever $\sigma$
# is, the factor $1/\sqrt{d_k}$ removes the dependence on the head width, so a wider head
# does not make the softmax sharper.
#
# **Is $\sigma = 1$ realistic at initialisation?** Not with the usual initialisation. A
# query component is $q_j = \sum_{i=1}^{d} x_i W_{ij}$; with inputs of variance $v_x$
# (normalised, chapter 6: $v_x = 1$) and weights drawn independently with standard
# deviation $s$, the same double sum gives its variance. GPT-style models draw every weight
# from $\mathcal{N}(0, 0.02^2)$ (Radford et al., 2018, "Improving Language Understanding by
# Generative Pre-Training", section 4.1; the book's model does too, chapter 7), and at
# GPT-2 small's $d = 768$:

# %%
d_sym, v_x, s_w = sp.Symbol("d", integer=True, positive=True), sp.Symbol("v_x", positive=True), sp.Symbol("s", positive=True)
# E[q_j^2] = sum_{i, i'} E[x_i x_i'] E[W_ij W_i'j], each factor zero unless i = i'
var_query = sum_over_ij(v_x * sp.KroneckerDelta(i_, j_) * s_w**2 * sp.KroneckerDelta(i_, j_), d_sym)
gpt2_var = var_query.subs({d_sym: 768, v_x: 1, s_w: sp.Rational(2, 100)})
gpt2_scores = var_zero_mean.subs(sigma**2, gpt2_var) / dk  # Var(q.k / sqrt(d_k)) = sigma^4
display(sp.Eq(sp.Symbol(r"\operatorname{Var}(q_j)"), var_query),
        sp.Eq(sp.Symbol(r"\operatorname{Var}(q_j)|_{d=768,\ s=0.02}"), gpt2_var),
        sp.Eq(sp.Symbol(r"\operatorname{Var}(q \cdot k/\sqrt{d_k})"), gpt2_scores))
print(f"Var(q_j) = {float(gpt2_var):.4f}, Var(scaled score) = {float(gpt2_scores):.4f}")

# %% [markdown]
# Measured on one draw: 256 unit-variance token vectors, $W_Q$ and $W_K$ of size
# $768 \times 768$ with standard deviation 0.02, twelve heads of width 64. One draw of the
# weights is one sample of the model, so the tolerance is loose (5%):

# %%
x_init = torch.randn(256, 768, generator=g, dtype=torch.float64)  # (T, d), unit variance
W_Q_init, W_K_init = (0.02 * torch.randn(768, 768, generator=g, dtype=torch.float64) for _ in range(2))
q_init = (x_init @ W_Q_init).view(256, 12, 64).transpose(0, 1)  # (H, T, d_head)
k_init = (x_init @ W_K_init).view(256, 12, 64).transpose(0, 1)
scores_init = q_init @ k_init.transpose(-2, -1) / math.sqrt(64)  # (H, T, T)
checks = Checks("queries and keys at initialisation (std 0.02, d = 768)")
checks.close("Var of a query component", float(gpt2_var), q_init.var(), tol=0.05, rel=True)
checks.close("Var of a key component", float(gpt2_var), k_init.var(), tol=0.05, rel=True)
checks.close("Var of a scaled score q.k/8", float(gpt2_scores), scores_init.var(), tol=0.05, rel=True)
checks

# %% [markdown]
# So at initialisation a GPT-2-sized layer's scaled scores have variance about 0.09, not 1,
# and its attention rows start out close to uniform, far from saturation. Unit-variance
# queries and keys are an idealisation, the one in which the $\sqrt{d_k}$ argument is
# cleanest; the argument itself, that unscaled scores spread like $\sigma^2\sqrt{d_k}$ and
# the scaled ones do not depend on $d_k$, holds for every $\sigma$ under the independence
# model.
#
# Back to unit-variance components ($\sigma = 1$), a Monte Carlo check: 20,000 random
# Gaussian pairs for each $d_k$ and a tolerance of four standard errors of the sample
# variance. The standard error needs the fourth moment:
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
# $e^{s_j}$ for the largest score dwarfs all others: the softmax **saturates** towards a
# one-hot vector. A saturated softmax also stops learning, because its Jacobian
# $\partial p / \partial s = \operatorname{diag}(p) - p p^\top$ (derived in chapter 3) is zero
# at a one-hot $p$.
# The figure draws one query against $T = 32$ random keys, 400 times for each $d_k$,
# and measures the entropy of the attention row (the package's `attention_entropy`, in
# nats; at most $\log 32 = 3.47$ for uniform weights; $e^{H}$ is the number of keys a row of
# entropy $H$ spreads over, in the sense that $k$ equal weights give $H = \log k$) and the size of the softmax Jacobian, with
# and without the scale. It does so under two assumptions about $q$ and $k$: the idealised
# unit-variance components of the argument above, and GPT-2's initialisation, whose
# components have the variance $\sigma^2 = d s^2 = 0.3072$ derived above, so that
# $\operatorname{Var}(q \cdot k) = d_k\sigma_q^2\sigma_k^2 = 0.0944\,d_k$. Scaling $q$ and $k$ by
# $\sigma$ multiplies every score by $\sigma^2$, so both assumptions use the same random draws.

# %%
sigma2_init = float(gpt2_var)  # Var(q_j) at GPT-2's initialisation, derived above


def softmax_stats(d_, scaled, n=400, T_keys=32):
    """Row entropy (mean, standard error) and mean Jacobian norm of the attention softmax,
    for unit-variance q, k and for components of variance sigma2_init: a (2, 3) array."""
    q_ = torch.randn(n, 1, d_, generator=g, dtype=torch.float64)
    k_ = torch.randn(n, T_keys, d_, generator=g, dtype=torch.float64)
    dots = (q_ * k_).sum(-1) / (math.sqrt(d_) if scaled else 1.0)  # (n, T_keys)
    rows = []
    for var_qk in (1.0, sigma2_init):  # q -> sigma q and k -> sigma k multiply the scores by sigma^2
        p_ = torch.softmax(var_qk * dots, dim=-1)
        entropy = attention_entropy(weights=p_)  # (n,)
        jac = torch.diag_embed(p_) - p_[:, :, None] * p_[:, None, :]  # (n, T_keys, T_keys)
        rows.append([entropy.mean().item(), entropy.std().item() / math.sqrt(n),
                     torch.linalg.matrix_norm(jac).mean().item()])
    return np.array(rows)


d_grid = [2**e for e in range(1, 13)]
stats = {sc: np.array([softmax_stats(d_, sc) for d_ in d_grid]) for sc in (True, False)}  # (d, 2, 3)
print("mean entropy of an attention row, nats (e^H = number of keys it spreads over):")
for sc in (True, False):
    for a, name in enumerate(("unit-variance q, k", "GPT-2 initialisation")):
        row = "  ".join(f"d_k={d_}: {stats[sc][d_grid.index(d_), a, 0]:.2f}" for d_ in (2, 64, 128, 4096))
        print(f"  {'with' if sc else 'without'} 1/sqrt(d_k), {name:21s} {row}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for sc, a, style in ((True, 0, "o-"), (False, 0, "s--"), (True, 1, "^-"), (False, 1, "v--")):
    scores_label = r"$q\cdot k/\sqrt{d_k}$" if sc else r"$q\cdot k$ (no scale)"
    label = scores_label + (", unit variance" if a == 0 else ", GPT-2 init")
    axes[0].plot(d_grid, stats[sc][:, a, 0], style, label=label)
    axes[1].plot(d_grid, stats[sc][:, a, 2], style, label=label)
axes[0].axhline(math.log(32), color="gray", lw=0.8, ls=":", label="uniform: log 32")
axes[0].set_ylabel("mean entropy of an attention row (nats)")
axes[1].set_ylabel(r"mean $\|\mathrm{diag}(p) - pp^\top\|_F$ (dimensionless)")
for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(r"key width $d_k$")
    ax.legend(fontsize="x-small")
axes[0].set_title("Without the scale the softmax collapses to one key")
axes[1].set_title("... and its Jacobian (the gradient signal) vanishes")
save_figure(fig, "04_attention_scaling")
plt.show()

# %% [markdown]
# With the scale (circles, triangles) the curves are flat: the scaled scores have a variance
# that does not depend on $d_k$, so an attention row spreads over several keys and passes
# gradient. Without it (squares) the entropy falls towards 0 as $d_k$ grows, and after a small
# rise (at $d_k = 8$ the unscaled scores are spread just enough to make the softmax most
# sensitive) the Jacobian falls with it. How far it has fallen at the head widths of GPT-2 and
# Llama ($d_k = 64$ and $128$) depends on the assumption. With unit-variance queries and keys
# the unscaled softmax is already concentrated: the rows spread over fewer than two keys
# ($e^H < 2$). At GPT-2's initialisation the scores are $\sigma^2 \approx 0.31$ times smaller, and
# the unscaled rows still spread over more than four keys at $d_k = 64$: well below uniform,
# not one-hot. The collapse without the scale comes later, as training makes $q$ and $k$ larger
# and more aligned. The scaled rows at initialisation are nearly uniform; for scores of small
# variance $v$ a second-order expansion of $H = \log\sum_j e^{s_j} - \sum_j p_j s_j$ gives
# $\mathbb{E}[H] \approx \log T - v(T-1)/(2T)$, here with $v = \sigma^4$, and the neglected terms are
# of order $v^2$.
#
# The checks compare the idealised curves with those statements, and the GPT-2 curve, which
# uses only the derived variance, with attention rows of the real GPT-2-sized layer drawn
# above (its first 32 keys, $d_k = 64$, 256 queries in each of 12 heads; each head has its own
# weights, so the standard error comes from the spread of the 12 head means):

# %%
i64 = d_grid.index(64)
real_unscaled = attention_entropy(8.0 * scores_init[:, :, :32]).mean(-1)  # (H,): q.k without the 1/8
real_scaled = attention_entropy(scores_init[:, :, :32]).mean(-1)
small_var = math.log(32) - sigma2_init**2 * 31 / 64  # log T - v (T - 1) / (2T), v = sigma^4
checks = Checks("attention entropy at initialisation: the two assumptions")
for d_ in (64, 128):
    checks.true(f"unit variance, no scale, d_k={d_}: e^H < 2 keys",
                math.exp(stats[False][d_grid.index(d_), 0, 0]) < 2,
                got=round(math.exp(stats[False][d_grid.index(d_), 0, 0]), 2))
checks.true("GPT-2 init, no scale, d_k=64: e^H > 4 keys", math.exp(stats[False][i64, 1, 0]) > 4,
            got=round(math.exp(stats[False][i64, 1, 0]), 2))
for name, real, sc in (("no scale", real_unscaled, False), ("scaled", real_scaled, True)):
    se = math.hypot(real.std().item() / math.sqrt(12), stats[sc][i64, 1, 1])
    checks.close(f"GPT-2 init, {name}, d_k=64: real layer vs variance model (4 s.e.)",
                 stats[sc][i64, 1, 0], real.mean(), tol=4 * se)
checks.close("GPT-2 init, scaled: log T - v(T-1)/(2T), to O(v^2)", small_var, stats[True][i64, 1, 0],
             tol=4 * stats[True][i64, 1, 1] + sigma2_init**4)
checks

# %% [markdown]
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
fig, axes = plt.subplots(1, 3, figsize=(11, 4.0))
panels = [(A_full[0], "head 0, no mask"), (A_causal[0], "head 0, causal"),
          (A_causal[1], "head 1, causal")]
for ax, (A_, title) in zip(axes, panels, strict=True):
    im = ax.imshow(A_.numpy(), cmap="Blues", vmin=0, vmax=1)
    for r in range(len(sentence)):
        for c in range(len(sentence)):
            ax.text(c, r, f"{A_[r, c]:.2f}", ha="center", va="center", fontsize="x-small",
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
# The checks: causal outputs do not move when the future changes; the weights equal PyTorch's
# (its `scaled_dot_product_attention` returns them when the values are the identity matrix,
# $A I = A$); and a fully masked row is zero here and in PyTorch:

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
change_5 = (y1[0, 5] - y2[0, 5]).abs().max().item()
checks.true("output 5 did change (max |diff| > 1e-3)", change_5 > 1e-3, got=round(change_5, 3))
checks.close("A vs torch SDPA with V = I", F.scaled_dot_product_attention(qd, kd, torch.eye(6), is_causal=True),
             A_causal, tol=1e-6)
checks.close("upper triangle of A is 0", torch.zeros(2, 6, 6), A_causal.triu(1), tol=0)
checks.close("is_causal vs torch SDPA", F.scaled_dot_product_attention(qd, kd, kd, is_causal=True),
             scaled_dot_product_attention(qd, kd, kd, is_causal=True), tol=1e-6, rel=True)
checks.close("fully masked row: ours is 0", torch.zeros(2, 8),
             scaled_dot_product_attention(qd, kd, kd, mask=m_dead)[:, 2], tol=0)
checks.close("... and torch SDPA's", torch.zeros(2, 8),
             F.scaled_dot_product_attention(qd, kd, kd, attn_mask=m_dead)[:, 2], tol=0)
checks

# %% [markdown]
# ### A published worked example, rechecked
#
# Hand-computed walks through a toy transformer layer are a popular way to teach attention.
# `data/worked_examples/the_cat_sat.json` holds one as it was published: the exact inputs
# (an embedding table $E$ for a vocabulary of five words, $W_Q, W_K, W_V \in
# \mathbb{R}^{4 \times 2}$) and every number the source printed, rounded by hand. The file
# reached the project without the name of its source, so the book cites it by its file
# (`data/README.md` records this), not by an author. The
# source's attention step works on the embeddings of "the cat sat". We recompute it with
# the package's functions in float64 and grade each printed number with
# `PublishedComparison` (in `llmbook.text.worked_example`): *agrees* means it is the exact
# value correctly rounded; *rounded inputs*, that it is what the source's own rounded
# intermediates give; *truncated*, that the exact value was cut instead of rounded; *last
# digit*, a slip of at most 1.5 units in the last printed place; *error*, anything else.

# %%
example = load_the_cat_sat()
X_pub = example.inputs["E"][example.input_ids]  # (T, d) = (3, 4): "the", "cat", "sat"
Q_pub, K_pub, V_pub = (X_pub @ example.inputs[w] for w in ("W_Q", "W_K", "W_V"))  # (3, 2) each
S_pub = Q_pub @ K_pub.T  # (T, T) raw scores
A_pub = attention_weights(Q_pub, K_pub)  # no mask, as in the source
Z_pub = scaled_dot_product_attention(Q_pub, K_pub, V_pub)
A_pub_causal = attention_weights(Q_pub, K_pub, is_causal=True)
Z_pub_causal = scaled_dot_product_attention(Q_pub, K_pub, V_pub, is_causal=True)
pub = example.published_tensor
for name, M in [("Q", Q_pub), ("K", K_pub), ("V", V_pub), ("S", S_pub), ("S/√2", S_pub / math.sqrt(2)),
                ("A", A_pub), ("Z", Z_pub), ("A causal", A_pub_causal), ("Z causal", Z_pub_causal)]:
    print_table(name, M, words, words if M.shape[1] == 3 else None)

# %%
table = PublishedComparison('"the cat sat", attention step (float64, llmbook)')
table.add("Q", example.published["Q"], Q_pub)
table.add("K", example.published["K"], K_pub)
table.add("V", example.published["V"], V_pub)
table.add("S", example.published["S"], S_pub, from_rounded=pub("Q") @ pub("K").T)
table.add("S_scaled", example.published["S_scaled"], S_pub / math.sqrt(2), from_rounded=pub("S") / math.sqrt(2))
table.add("A", example.published["A"], A_pub, from_rounded=torch.softmax(pub("S_scaled"), dim=-1))
table.add("Z", example.published["Z"], Z_pub, from_rounded=pub("A") @ pub("V"))
table

# %% [markdown]
# The source's attention step is right: no number is an *error*. A few last digits are off:
# one scaled score and one output are truncated instead of rounded, one weight is what the
# source's own rounded scores give, and the remaining slips are under 1.5 units of the
# fourth decimal. The published rows of $A$ sum to 1.0001, 1.0000 and 1.0001, which is no
# slip: three weights each rounded to four decimals can miss their exact sum of 1 by up to
# $3 \times 0.5 \times 10^{-4}$, a bound the check below applies. What the
# source does not say is that **its attention has no causal mask**: the first row ("the")
# puts 0.3549 on "cat" and 0.3081 on "sat", words that come after it. That is an encoder's
# attention. In a decoder,
# the setting of the rest of the source's walk (it goes on to predict the next word),
# "the" can only see itself, so its output is $v_{\text{the}}$ exactly, and "cat" splits its
# attention between "the" and itself; only the last row, "sat", is the same either way.

# %%
checks = Checks('published "the cat sat": the causal version')
checks.close("published A row 'sat' = causal row 'sat'", pub("A")[2], A_pub_causal[2], tol=1.5e-4)
checks.close("causal z_the = v_the", V_pub[0], Z_pub_causal[0], tol=1e-15)
# two keys: the softmax is the logistic function of the score difference
cat_logistic = 1 / (1 + math.exp((S_pub[1, 1] - S_pub[1, 0]).item() / math.sqrt(2)))
checks.close("causal A, row 'cat' vs logistic of the score gap", [cat_logistic, 1 - cat_logistic, 0.0],
             A_pub_causal[1], tol=1e-15)
checks.close("published rows of A sum to 1 within 3 half-units of 1e-4", torch.ones(3, dtype=torch.float64),
             pub("A").sum(-1), tol=1.5e-4 + 1e-12)
print("published row sums of A:", [round(v, 6) for v in pub("A").sum(-1).tolist()])
checks

# %% [markdown]
# ### A mask built by multiplying by $-\infty$, graded
#
# An inference tutorial the book was planned from builds its mask in one line,
# `mask = torch.triu(torch.ones(7, 7), diagonal=1) * -float('inf')`, and adds it to the
# scores (claim C4). The intent is right: $0$ where a query may look, $-\infty$ where it may
# not, so that $e^{-\infty} = 0$ removes the future from the softmax. The arithmetic is not:
# the product is taken entry by entry, and below the diagonal it is $0 \cdot (-\infty)$,
# which has no value. SymPy says so, and IEEE 754 floating point, which PyTorch follows,
# makes it NaN ("not a number"), and a NaN poisons every sum it enters:

# %%
print("SymPy: 0 * (-oo) =", sp.S(0) * -sp.oo, "  1 * (-oo) =", sp.S(1) * -sp.oo)
claim_mask = torch.triu(torch.ones(7, 7), diagonal=1) * -float("inf")  # the claim's line
print(claim_mask[:3])
print(f"{int(claim_mask.isnan().sum())} of 49 entries are NaN, "
      f"{int(claim_mask.isneginf().sum())} are -inf, {int((claim_mask == 0).sum())} are 0")

# %% [markdown]
# Measured on a real model: the first attention layer of SmolLM2-135M-Instruct (chapter 7
# loads it from its GGUF file; chapter 1 builds its tokenizer), on the seven tokens of
# "What is the meaning of life?". With the claim's mask added to the scores, every
# attention weight of every head is NaN, and so is every output; with the mask built
# correctly, `torch.full((T, T), -inf).triu(1)` (or `masked_fill` on the boolean mask
# above the diagonal), the layer equals the book's `is_causal=True` attention.

# %%
from llmbook.inference.gguf import load_model, smollm2_path  # noqa: E402

smol, smol_tokenizer = load_model(smollm2_path(), dtype=torch.float64)
smol_ids = torch.tensor([smol_tokenizer.encode("What is the meaning of life?")])  # (1, 7)
attn0 = smol.blocks[0].attn
with torch.no_grad():
    h0 = smol.blocks[0].attn_norm(smol.embed.weight[smol_ids])  # (1, T, d): layer 0's input
    q0, k0, v0 = attn0.project_qkv(h0, rope=smol.rope)  # (1, 9, T, 64), (1, 3, T, 64) x 2
    k0, v0 = (t.repeat_interleave(3, dim=1) for t in (k0, v0))  # 3 query heads per KV head
    T_smol = smol_ids.shape[1]
    right_mask = torch.full((T_smol, T_smol), -float("inf"), dtype=torch.float64).triu(1)
    A_claim = torch.softmax(q0 @ k0.transpose(-2, -1) * attn0.scale + claim_mask.double(), -1)
    A_right = torch.softmax(q0 @ k0.transpose(-2, -1) * attn0.scale + right_mask, -1)
    out_claim = attn0(h0, attn_bias=claim_mask.double(), is_causal=False)
    out_right = attn0(h0, attn_bias=right_mask, is_causal=False)
    out_causal = attn0(h0)  # the book's causal mask
print(f"{T_smol} tokens: {smol_tokenizer.decode(smol_ids[0].tolist())!r}")
print(f"claim's mask: {int(A_claim.isnan().sum())} of {A_claim.numel()} attention weights "
      f"and {int(out_claim.isnan().sum())} of {out_claim.numel()} outputs are NaN")

checks = Checks("claim C4 on SmolLM2's first attention layer (float64)")
checks.equal("NaN weights with the claim's mask", A_claim.numel(), int(A_claim.isnan().sum()))
checks.close("right additive mask vs book's causal attention", out_causal, out_right, tol=1e-12)
checks.close("A (right mask) vs torch SDPA with V = I", A_right,
             F.scaled_dot_product_attention(q0, k0, torch.eye(T_smol, dtype=torch.float64).expand(1, 9, -1, -1),
                                            is_causal=True, scale=attn0.scale), tol=1e-12)
checks.close("future weights are 0 (right mask)", torch.zeros(1, 9, T_smol, T_smol),
             A_right.triu(1), tol=0)
checks

# %%
claims = ClaimGrades("a claim from the published texts")
claims.grade("C4", "mask = torch.triu(torch.ones(7, 7), diagonal=1) * -float('inf'), added to "
             "the scores",
             f"0 * (-inf) is NaN: {int(claim_mask.isnan().sum())} of the 49 entries (the diagonal "
             f"and below) are NaN, so on SmolLM2's first layer all {A_claim.numel()} attention "
             f"weights and all {out_claim.numel()} outputs are NaN; "
             "torch.full((7, 7), -inf).triu(1) gives the intended mask and the causal attention",
             "wrong")
claims

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
# runs all heads at once. Merging is the reverse reshape. Here is the whole computation in
# its shortest form, with the weights as plain matrices in the $XW$ convention of this
# chapter: project, split into heads, score, mask the future, softmax, average the values,
# merge the heads, project out.

# %%
show_source(minimal_multi_head_attention)

# %% [markdown]
# The package's `MultiHeadAttention` computes the same thing, and more: biases,
# grouped-query heads, a rotary embedding (chapter 5), an additive bias such as ALiBi,
# padding masks, a KV cache (chapter 13) and PyTorch's fused kernel. Like the minimal
# version it accepts any leading batch dimensions, $(\dots, T, d)$, as torch's layers do.
# It names its projections `q_proj`, `k_proj`, `v_proj`, `o_proj`, as Llama and Qwen2 do,
# so their state dicts load without renaming (chapter 7). Its `nn.Linear` layers store
# $W^\top$: `q_proj.weight` is $W_Q^\top$. Between splitting the heads and rotating them,
# `project_qkv` passes the queries and keys through the hook `normalise_qk`, which returns
# them unchanged here; QK-norm (later in this section) is a subclass that overrides only this hook.

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
# instead of the book's function. Then the minimal version on the module's weights
# (without biases, which it does not have), and a $(2, 3, T, d)$ input against each of its
# six $(T, d)$ slices run alone.

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
no_bias = MultiHeadAttention(d, H, dtype=torch.float64)  # the minimal version has no biases
x4 = torch.randn(2, 3, T, d, generator=g, dtype=torch.float64)  # (2, 3, T, d): two batch axes
with torch.no_grad():
    W_min = [lin.weight.T for lin in (no_bias.q_proj, no_bias.k_proj, no_bias.v_proj, no_bias.o_proj)]
    minimal_out = minimal_multi_head_attention(x, *W_min, n_heads=H)
    q_t, k_t, v_t = ((x @ W_).unflatten(-1, (H, d_head)).transpose(1, 2) for W_ in W_min[:3])
    torch_out = F.scaled_dot_product_attention(q_t, k_t, v_t, is_causal=True).transpose(1, 2).flatten(-2) @ W_min[3]
    y4 = no_bias(x4)
    per_slice = torch.stack([torch.stack([no_bias(x4[b, c]) for c in range(3)]) for b in range(2)])
checks = Checks("multi-head attention")
checks.close("module vs loop over H heads", loop_out, ours, tol=1e-14)
checks.close("module vs nn.MultiheadAttention", ref_out, ours, tol=1e-14)
checks.close("fused path vs book path", ours, fused_out, tol=1e-14)
checks.close("minimal version vs module", no_bias(x).detach(), minimal_out, tol=1e-12)
checks.close("minimal version vs torch SDPA", torch_out, minimal_out, tol=1e-12)
checks.close("(2, 3, T, d) input vs its (T, d) slices", per_slice, y4, tol=1e-14)
shares = mha.split_heads(x, H).untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
checks.true("split_heads is a view of x", shares, got="shares storage" if shares else "copied")
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
# ### QK-norm and logit soft-capping
#
# Nothing in attention stops the scores from growing during training: if $W_Q$ and $W_K$ grow,
# the scores grow with the product of their sizes and the softmax saturates, the failure of
# section 4.3 arriving late. Two guards are common in current models. **QK-norm** applies an
# RMSNorm (chapter 6) with a learned gain to every head's query and key vectors before the
# rotary embedding (Qwen3, Yang et al., 2025; OLMo 2, OLMo et al., 2024). With unit gains each
# normalised vector has length $\sqrt{d_{\text{head}}}$, so by Cauchy-Schwarz every scaled score
# lies in $[-\sqrt{d_{\text{head}}}, \sqrt{d_{\text{head}}}]$ whatever the weights. **Logit
# soft-capping** (Gemma 2, Riviere et al., 2024) passes the scaled scores through
# $s \mapsto c \tanh(s/c)$ with $c = 50$. SymPy gives its series and its slope:

# %%
s_sym, c_sym = sp.symbols("s c", positive=True)
capped = c_sym * sp.tanh(s_sym / c_sym)
display(sp.Eq(sp.Symbol(r"c\tanh(s/c)"), sp.series(capped, s_sym, 0, 6)),
        sp.Eq(sp.Symbol(r"\lim_{s\to\infty} c\tanh(s/c)"), sp.limit(capped, s_sym, sp.oo)),
        sp.Eq(sp.Symbol(r"\frac{d}{ds}\,c\tanh(s/c)\big|_{s=0}"), sp.diff(capped, s_sym).subs(s_sym, 0)))

# %% [markdown]
# Scores well below $c$ pass almost unchanged (the error is $s^3/(3c^2)$), and none can leave
# $(-c, c)$. In the package, `QKNormAttention` (the attention of chapter 7's model when its
# configuration asks for QK-norm) adds `q_norm` and `k_norm` with Qwen3's parameter names
# and overrides only the hook `normalise_qk` shown above, and
# `MultiHeadAttention(..., softcap=c)` caps the scores with `soft_cap`:

# %%
show_source(soft_cap)

# %% [markdown]
# The peers are Hugging Face's `Gemma2Attention` (its eager path, which computes the softmax
# in float32) and `Qwen3Attention` (whose RMSNorm computes in float32), hence a tolerance of
# float32 round-off in float64 runs, with the same
# random weights and a small cap, 2.5, so that the capping matters; the rotation is again the
# identity ($\cos = 1$, $\sin = 0$):

# %%
from transformers import Gemma2Config, Qwen3Config  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention  # noqa: E402

d_g, H_g, Hkv_g, dh_g, T_g = 24, 4, 2, 8, 7
gemma_cfg = Gemma2Config(hidden_size=d_g, num_attention_heads=H_g, num_key_value_heads=Hkv_g, head_dim=dh_g,
                         query_pre_attn_scalar=dh_g, attn_logit_softcapping=2.5, num_hidden_layers=1,
                         layer_types=["full_attention"])
qwen_cfg = Qwen3Config(hidden_size=d_g, num_attention_heads=H_g, num_key_value_heads=Hkv_g, head_dim=dh_g,
                       rms_norm_eps=1e-6, num_hidden_layers=1, layer_types=["full_attention"])
gemma_cfg._attn_implementation, qwen_cfg._attn_implementation = "eager", "sdpa"
ours_cap = MultiHeadAttention(d_g, H_g, Hkv_g, d_head=dh_g, softcap=2.5, dtype=torch.float64)
ours_qk = QKNormAttention(d_g, H_g, Hkv_g, d_head=dh_g, eps=1e-6).double()  # scope "head", as Qwen3
with torch.no_grad():
    for m_ in (ours_cap, ours_qk):
        for p_ in m_.parameters():
            p_.copy_(torch.randn(p_.shape, generator=g, dtype=torch.float64))
hf_cap = Gemma2Attention(gemma_cfg, layer_idx=0).double()
hf_qk = Qwen3Attention(qwen_cfg, layer_idx=0).double()
hf_cap.load_state_dict(ours_cap.state_dict())
hf_qk.load_state_dict(ours_qk.state_dict())
x_g = torch.randn(2, T_g, d_g, generator=g, dtype=torch.float64)
rot0 = (torch.ones(2, T_g, dh_g, dtype=torch.float64), torch.zeros(2, T_g, dh_g, dtype=torch.float64))
blocked_g = torch.zeros(T_g, T_g, dtype=torch.float64).masked_fill(~causal_mask(T_g), float("-inf"))[None, None]
with torch.no_grad():
    uncapped = MultiHeadAttention(d_g, H_g, Hkv_g, d_head=dh_g, dtype=torch.float64)
    uncapped.load_state_dict(ours_cap.state_dict())
    cap_gap = (ours_cap(x_g) - uncapped(x_g)).abs().max().item()
    checks = Checks("soft-capping and QK-norm against Gemma 2 and Qwen3")
    checks.close("softcap=2.5 vs Gemma2Attention (eager)", hf_cap(x_g, rot0, blocked_g)[0], ours_cap(x_g),
                 tol=1e-6, rel=True)
    checks.close("QKNormAttention vs Qwen3Attention", hf_qk(x_g, rot0, blocked_g)[0], ours_qk(x_g), tol=1e-6, rel=True)
    checks.true("the cap changes the output (max |diff| > 0.01)", cap_gap > 1e-2, got=round(cap_gap, 3))
checks

# %% [markdown]
# What each guard does as the weights grow: multiply $W_Q$ and $W_K$ of a GPT-2-sized head
# ($d = 768$, $d_{\text{head}} = 64$, the initialisation of section 4.3) by $\alpha$, so that
# the scores grow like $\alpha^2$, and measure the mean entropy of the attention rows over 32
# keys, for the plain scores, the soft-capped ones ($c = 50$) and QK-norm with unit gains.

# %%
alphas = [1, 2, 4, 8, 16, 32]
x_a = x_init[:32]  # (32, 768): unit-variance inputs of section 4.3, float64
Wq_a, Wk_a = W_Q_init[:, :64], W_K_init[:, :64]  # one head's (768, 64) columns
rms_unit = RMSNorm(64, dtype=torch.float64)
guards = {"plain": [], "soft-cap c = 50": [], "QK-norm": []}
for a_ in alphas:
    q_a, k_a = x_a @ (a_ * Wq_a), x_a @ (a_ * Wk_a)  # (32, 64)
    raw = q_a @ k_a.T / 8.0  # (32, 32) scaled scores
    with torch.no_grad():
        normed = rms_unit(q_a) @ rms_unit(k_a).T / 8.0
    for name, sc_ in (("plain", raw), ("soft-cap c = 50", soft_cap(raw, 50.0)), ("QK-norm", normed)):
        guards[name].append(attention_entropy(sc_).mean().item())
print("mean row entropy (nats) for alpha =", alphas)
for name, ent in guards.items():
    print(f"  {name:16s}", [round(e, 2) for e in ent])

fig, ax = plt.subplots(figsize=(6.5, 3.8))
for (name, ent), style in zip(guards.items(), ("o-", "s--", "^-"), strict=True):
    ax.plot(alphas, ent, style, label=name)
ax.axhline(math.log(32), color="gray", lw=0.8, ls=":", label="uniform: log 32")
ax.set_xscale("log", base=2)
ax.set_xlabel(r"weight growth $\alpha$ ($W_Q, W_K \to \alpha W_Q, \alpha W_K$)")
ax.set_ylabel("mean entropy of an attention row (nats)")
ax.set_title("Growing query/key weights: plain, soft-capped and QK-normed scores")
ax.legend(fontsize="small")
save_figure(fig, "04_attention_guards")
plt.show()

# %% [markdown]
# The plain rows collapse onto one key as the weights grow. The soft-capped rows follow them
# while the scores are well below $c$, then turn back up: once several scores are pressed
# against $c$ they tie, and the row spreads over those keys. The cap bounds the scores (and
# so the gradients' blow-up) but gives up their order among the largest. QK-norm makes the
# scores independent of $\alpha$: the normalised vectors have length $\sqrt{64} = 8$, the
# cosine of two random directions has variance $1/64$, so the scaled scores have variance 1,
# and the entropy is that of the unit-variance, scaled curve of section 4.3; in a trained
# model the learned gains set the sharpness instead of the weights' size.

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
# for $T$ on both sides of $T^* = 2d$. This is the independent check of the count: the
# SymPy expression above and `attention_flops` are the same reasoning written twice, the
# counter is PyTorch's own tally of the matrix products that actually ran. (It counts the
# masked upper triangle too, as the formula does: the book's implementation computes all
# $T^2$ scores and then discards half.)

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
checks

# %% [markdown]
# Memory follows the same pattern: the book's implementation materialises $A$, $B \cdot H
# \cdot T^2$ numbers per layer (1 GiB in float32 for one head of $T = 16{,}384$). That is
# what FlashAttention (chapter 14) avoids.
#
# Finally the clock. We time `scaled_dot_product_attention` alone (no projections) for one
# head of width $d = 64$ and the nine lengths $T$ from 64 to 2048 of the grid below (the cell
# prints how many), on one CPU thread, taking the
# fastest of several runs, fit the slope of $\log(\text{time})$ against $\log T$ for
# $T \ge 256$ (seven points), and draw the figure from the same measurements. What to
# expect: the score matrix and the mix cost $4T^2 d$ operations, so if every operation cost
# the same the time would grow like $T^2$, a slope of 2. At small $T$ the work takes
# microseconds and fixed costs (the Python calls, allocating the outputs, starting each
# operation) are a large part of it, so the curve is flatter there and a fit that includes
# small $T$ comes out below 2. At large $T$ the opposite can happen: the scores, the mask and
# the weights are $T \times T$ matrices, and once they no longer fit in the processor's
# caches every pass over them runs at the speed of main memory, so the time per operation
# rises and the slope can come out well above 2 (on some machines as a jump between two
# neighbouring lengths). Timings depend on the machine and on what else it is doing, so this
# cell's output is not part of the book's checked outputs, no number from it is quoted here,
# and nothing is asserted about it.

# %% tags=["nbval-ignore-output"]
T_grid = [64, 128, 256, 384, 512, 768, 1024, 1536, 2048]
times = {}
n_threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: less disturbed by other work on the machine
for T_t in T_grid:
    qt, kt, vt = (torch.randn(1, 1, T_t, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        times[T_t], _ = best_time(lambda qt=qt, kt=kt, vt=vt: scaled_dot_product_attention(
            qt, kt, vt, is_causal=True), repeats=5)
torch.set_num_threads(n_threads)
big = [t for t in T_grid if t >= 256]
slope = np.polyfit(np.log(big), np.log([times[t] for t in big]), 1)[0]
print(f"{len(T_grid)} lengths; time per call (ms):", {t: round(1e3 * s, 3) for t, s in times.items()})
print(f"log-log slope for T >= 256 ({len(big)} points): {slope:.2f}")

fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(T_grid, [1e3 * times[t] for t in T_grid], "o-", label="measured")
ref_line = [1e3 * times[T_grid[-1]] * (t / T_grid[-1]) ** 2 for t in T_grid]
ax.loglog(T_grid, ref_line, "k:", label=r"$\propto T^2$")
ax.set_xlabel("sequence length T (tokens)")
ax.set_ylabel("time per call (ms)")
ax.set_title(f"Causal attention, one head of width 64: fitted slope {slope:.2f} (T ≥ 256)")
ax.legend()
save_figure(fig, "04_attention_time")
plt.show()

# %% [markdown]
# Read the figure against the dotted $T^2$ line, drawn through the last point: where the
# measured curve is flatter than the line, fixed costs dominate; where it is steeper, the
# $T \times T$ matrices have outgrown a cache. The count of operations is exact (it was
# checked above); the time per operation is what depends on the machine. Chapter 14 returns
# to this: FlashAttention never stores the $T \times T$ matrix at all.

# %% [markdown]
# ## 4.7 Sliding windows and attention sinks
#
# Two changes to the causal mask and the softmax are common in models readers run today.
# **Sliding-window attention** (Beltagy, Peters & Cohan, 2020; Mistral 7B, Jiang et al., 2023)
# lets query $i$ see only the $W$ most recent positions $i - W + 1, \dots, i$, so a layer costs
# $O(TW)$ instead of $O(T^2)$ and a cache holds $W$ positions (chapter 13 builds that rolling
# cache). A token further back is not lost: layer 2 reads outputs of layer 1 that already hold
# $W - 1$ positions of their own past, so the reach grows by $W - 1$ per layer. SymPy solves
# the recurrence $r_L = r_{L-1} + (W - 1)$, $r_0 = 0$:

# %%
L_sym, W_sym = sp.symbols("L W", positive=True, integer=True)
r_fn = sp.Function("r")
reach_sym = sp.rsolve(r_fn(L_sym) - r_fn(L_sym - 1) - (W_sym - 1), r_fn(L_sym), {r_fn(0): 0})
display(sp.Eq(sp.Symbol("r_L"), sp.factor(reach_sym)))
print("Mistral 7B (32 layers, W = 4096): reach", reach_sym.subs({L_sym: 32, W_sym: 4096}), "positions")

# %%
show_source(sliding_window_reach)

# %% [markdown]
# Two independent checks. First, the boolean mask of one layer composed $L$ times (query $i$
# depends on key $j$ after $L$ layers exactly when the $L$-th power of the 0/1 mask matrix
# has a non-zero entry at $(i, j)$) must reach exactly $L(W-1)$ back, for every $L$ and $W$ of
# a small grid. Second, Hugging Face's `MistralForCausalLM` itself: a random two-layer model
# with $W = 4$ (with random noise of std 0.1 added to every weight), loaded into the book's
# `TransformerLM` by `from_hf`; the logits must agree (to float32 round-off, relative 1e-5:
# Hugging Face's RMSNorm computes in float32 even in a float64 model), and changing the first token must
# change the outputs at positions $0, \dots, 2 \cdot 3 = 6$ and at none after, in both models.

# %%
checks = Checks("sliding-window reach")
T_r = 24
ij_r = torch.arange(T_r)[:, None] - torch.arange(T_r)[None, :]  # (T, T): i - j
for L_r, W_r in ((1, 3), (2, 3), (3, 4), (4, 2), (2, 7)):
    composed = torch.linalg.matrix_power(sliding_window_mask(T_r, T_r, W_r).long(), L_r) > 0
    checks.equal(f"L = {L_r}, W = {W_r}: composed masks reach L(W-1) = {sliding_window_reach(L_r, W_r)}",
                 ((ij_r >= 0) & (ij_r <= sliding_window_reach(L_r, W_r))).tolist(), composed.tolist())

import transformers  # noqa: E402

torch.manual_seed(0)
mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
    vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=12, max_position_embeddings=64, sliding_window=4,
    attn_implementation="eager")).double().eval()
with torch.no_grad():
    randomize_parameters_(mistral, 0.1, torch.Generator().manual_seed(1))
book_mistral = from_hf(mistral).double().eval()
ids_m = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(2))
ids_m2 = ids_m.clone()
ids_m2[0, 0] = (ids_m[0, 0] + 1) % 101
with torch.no_grad():
    logit_pairs = {name: (m_(ids_m).logits if name == "Hugging Face" else m_(ids_m),
                          m_(ids_m2).logits if name == "Hugging Face" else m_(ids_m2))
                   for name, m_ in (("Hugging Face", mistral), ("book", book_mistral))}
hf_l, book_l = logit_pairs["Hugging Face"][0], logit_pairs["book"][0]
mistral_err = ((hf_l - book_l).abs().max() / hf_l.abs().max()).item()  # float32 round-off: not printed
checks.true("book TransformerLM vs MistralForCausalLM (W = 4): relative logit error < 1e-5",
            mistral_err < 1e-5)
for name, (a_, b_) in logit_pairs.items():
    changed = [t for t in range(12) if (a_[0, t] - b_[0, t]).abs().max().item() > 1e-6]
    checks.equal(f"{name}: positions changed by token 0", list(range(sliding_window_reach(2, 4) + 1)), changed)
checks

# %% [markdown]
# **Attention sinks.** Every row of a softmax sums to 1, so a head has to put its weight
# somewhere even when no key is relevant; trained models park it on the first token (Xiao
# et al., 2023, who call such tokens attention sinks, and chapter 24b finds them in SmolLM2).
# gpt-oss gives each head a learned logit $s_h$ that sits in the softmax's denominator and
# belongs to no key (OpenAI, 2025):
# $$a_j = \frac{e^{z_j}}{e^{s_h} + \sum_i e^{z_i}}, \qquad
#   \text{left to the sink} = \frac{e^{s_h}}{e^{s_h} + \sum_i e^{z_i}},$$
# so a row's weights sum to less than 1 and the output $\sum_j a_j v_j$ can shrink towards 0:
# the head can abstain. For a row of $T$ equal scores $z$, SymPy gives the sink's share and
# what it takes to keep half of the weight in the sink:

# %%
s_k, z_k, T_k_sym = sp.symbols("s z T", real=True)
sink_share = sp.exp(s_k) / (sp.exp(s_k) + T_k_sym * sp.exp(z_k))
(half_at,) = sp.solve(sp.Eq(sink_share, sp.Rational(1, 2)), s_k)
display(sp.Eq(sp.Symbol(r"\text{sink share}"), sink_share), sp.Eq(sp.Symbol("s_{1/2}"), sp.simplify(half_at)))

# %%
show_source(sink_attention_weights)

# %% [markdown]
# The peer is `eager_attention_forward` of Hugging Face's gpt-oss, which appends the sink as
# an extra column of logits and drops its column after the softmax (the book's function takes
# a log-sum-exp instead). In float64, with a bottom-right causal mask and grouped heads
# repeated, both must agree to round-off; the closed form above must match the function for
# rows of equal scores. A fixed sink loses its share as the context grows, since
# $s_{1/2} = z + \log T$ rises with $T$: the table measures it at $s = 4$, $z = 0$.

# %%
from transformers.models.gpt_oss.modeling_gpt_oss import (  # noqa: E402
    eager_attention_forward as gpt_oss_attention,
)

g_s = torch.Generator().manual_seed(7)
H_s, T_qs, T_ks, d_s = 4, 5, 9, 16
q_s, k_s, v_s = (torch.randn(2, H_s, n_, d_s, generator=g_s, dtype=torch.float64) for n_ in (T_qs, T_ks, T_ks))
sinks_s = 2 * torch.randn(H_s, generator=g_s, dtype=torch.float64)
mask_s = causal_mask(T_qs, T_ks, offset=T_ks - T_qs)
sink_module = torch.nn.Module().eval()
sink_module.sinks, sink_module.num_key_value_groups = torch.nn.Parameter(sinks_s), 1
out_peer, w_peer = gpt_oss_attention(
    sink_module, q_s, k_s, v_s, torch.zeros(T_qs, T_ks, dtype=torch.float64).masked_fill(~mask_s, float("-inf")),
    scaling=d_s**-0.5)
w_s, left_s = sink_attention_weights(q_s, k_s, sinks_s, mask=mask_s)
checks = Checks("attention sinks against gpt-oss and the closed form")
checks.close("weights vs gpt-oss eager_attention_forward", w_peer.detach(), w_s, tol=1e-13)
checks.close("outputs vs gpt-oss", out_peer.detach(), (w_s @ v_s).transpose(1, 2), tol=1e-13)
for T_e in (1, 16, 256, 4096):
    _, left_e = sink_attention_weights(torch.ones(1, 1, 1, dtype=torch.float64),
                                       torch.zeros(1, T_e, 1, dtype=torch.float64),
                                       torch.tensor([4.0], dtype=torch.float64))
    checks.close(f"T = {T_e}: share left to a sink s = 4 (measured {left_e.item():.4f})",
                 float(sink_share.subs({s_k: 4, z_k: 0, T_k_sym: T_e})), left_e.item(), tol=1e-12)
print(f"rows of the random example leave between {left_s.min().item():.3f} and "
      f"{left_s.max().item():.3f} of their weight to the sink")
checks

# %% [markdown]
# With $s = 4$ a lone key gets a small fraction of its row and the sink nearly all of it; with
# 4096 keys the sink's share has fallen to about a hundredth, so a head that wants to stay "off" over a long context must
# learn to lower its scores below $s - \log T$, or its sink logit must be large. The sink
# changes nothing else: with $s = -\infty$ it is ordinary attention.

# %% [markdown]
# ## Summary
#
# * Attention is $\operatorname{softmax}(QK^\top/\sqrt{d_k})V$, with $Q, K, V$ three linear
#   projections of the same embeddings; the worked example reproduces SymPy's exact values
#   to $10^{-12}$ in float64.
# * $\operatorname{Var}(q \cdot k) = d_k \sigma^4$ for independent zero-mean components of
#   variance $\sigma^2$ (any distribution), derived in SymPy for symbolic $d_k$; dividing by
#   $\sqrt{d_k}$ removes the dependence on the head width and keeps the softmax from
#   saturating, which would also kill its gradient. With GPT-2's initialisation (std 0.02,
#   $d = 768$) $\sigma^2 \approx 0.31$, so the scaled scores start with variance about 0.09,
#   not 1, and the rows are nearly uniform. Even unscaled, at $d_k = 64$ they spread over more
#   than four of 32 keys at that initialisation; the near one-hot collapse is what unit-variance
#   (or, later in training, larger) queries and keys produce.
# * The causal mask sets the future's scores to $-\infty$; the package aligns it top-left as
#   PyTorch does, offers a bottom-right offset for KV caches, and returns zeros, not NaN, for
#   a fully masked row. A published hand-computed example gets its numbers right to the last
#   digit or so, but attends without a mask, as an encoder would.
# * Multi-head attention is a view and a transpose around one batched product, a dozen lines
#   in its minimal form; the full module adds GQA and MQA (shared KV heads by
#   `repeat_interleave`), masks, biases, caches and fused kernels, accepts any leading batch
#   dimensions, and equals the minimal version, PyTorch's and Hugging Face's layers.
# * QK-norm bounds every scaled score by $\sqrt{d_{\text{head}}}$ and soft-capping maps scores
#   into $(-c, c)$; both equal Qwen3's and Gemma 2's layers, and both keep growing weights
#   from collapsing the attention rows (soft-capping only once scores near $c$).
# * The cost is $8Td^2 + 4T^2d$ FLOPs (checked with `FlopCounterMode`), quadratic beyond
#   $T = 2d$; the measured time grows more slowly than $T^2$ while fixed costs dominate,
#   and can grow faster once the $T \times T$ matrices no longer fit in the caches.
# * A sliding window of $W$ positions reaches $L(W-1)$ positions back after $L$ layers
#   (composed masks and Hugging Face's Mistral agree); a sink logit per head (gpt-oss) lets
#   a row leave the weight $e^{s}/(e^{s} + \sum_i e^{z_i})$ to no key, equal to Hugging Face's
#   gpt-oss attention.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/04_attention.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 04` writes a stub
# of every function, `llmbook grade 04` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_04.py` runs
# the same checks on the reference.
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
# 5. (★★) **What QK-norm guarantees.** With unit gains (and no $\varepsilon$) every scaled score
#    of a QK-normed head lies in $[-\sqrt{d_{\text{head}}}, \sqrt{d_{\text{head}}}]$. Write
#    `qk_norm_weight_floor(d_head, T)`, the smallest attention weight any key can then get in a
#    row of $T$ keys, $1/(1 + (T - 1)e^{2\sqrt{d_{\text{head}}}})$; check that random queries
#    and keys never go below it, and that the floor is reached when one key points opposite
#    to the query and all others along it.
# 6. (★) **A sink is a key with a zero value.** Show that attention with a sink logit $s_h$
#    equals ordinary attention over one extra key whose score is $s_h$ for every query and
#    whose value vector is zero. Write `sink_as_extra_key(q, k, v, sinks, mask)` with
#    `scaled_dot_product_attention` and a float mask that adds $s_h$ to the extra key's score,
#    and check it against `sink_attention_weights(...)[0] @ v`.

# %%
from llmbook.workbench import grade

grade("04", globals())
