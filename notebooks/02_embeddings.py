# %% [markdown]
# # 2 Embeddings
#
# A tokenizer turns text into integers $0, 1, \dots, V-1$. Integers are names, not
# quantities: token 7 is not "more" than token 3. A network needs vectors, and the first
# thing every language model does is to give each token a learned vector of width $d$.
# The $V$ vectors, stacked as rows, form the **embedding matrix** $E \in \mathbb{R}^{V \times d}$.
#
# This chapter derives and checks four facts about $E$:
#
# 1. multiplying a one-hot vector by $E$ *is* a row lookup, so the embedding layer is a
#    linear map that costs no multiplications at all;
# 2. its gradient is a scatter-add: only the rows of tokens that occurred get one;
# 3. the output layer can reuse $E$ (weight tying), and then the gradient of $E$ is the sum
#    of the gradients of its two uses;
# 4. random vectors in high dimension are nearly orthogonal: the cosine of two of them has
#    mean $0$ and variance exactly $1/d$.
#
# It then counts how many parameters embeddings take in GPT-2 and in a Llama-sized model, and
# ends with two facts about real embeddings: why Gemma scales its tied embedding by $\sqrt d$,
# and how far the trained embedding of the book's real model, SmolLM2, is from isotropic. The
# other examples use a toy vocabulary, so the chapter does not depend on the tokenizer of
# chapter 1.

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
import transformers
from IPython.display import display
from sympy.stats import Beta
from sympy.stats import E as expectation

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.embedding import (
    TokenEmbedding,
    cosine_similarity,
    embedding_grad,
    embedding_parameter_count,
    one_hot,
    pairwise_cosine,
)

g = seed_everything(0)

# %% [markdown]
# ## 2.1 One-hot vectors select rows
#
# The one-hot vector of token $i$ is the standard basis vector $e_i \in \mathbb{R}^V$:
# a 1 in position $i$ and 0 elsewhere, $(e_i)_k = \delta_{ik}$. Entry $j$ of the row vector
# $e_i^\top E$ is
#
# $$ (e_i^\top E)_j = \sum_{k=0}^{V-1} \delta_{ik} E_{kj} = E_{ij}, $$
#
# so $e_i^\top E$ is row $i$ of $E$. SymPy evaluates the sum for general $V$, with the
# index $i$ and $j$ left symbolic. The answer comes with the condition $i \le V-1$, which a
# valid token id always meets:

# %%
i, j, k = sp.symbols("i j k", integer=True, nonnegative=True)
V_sym = sp.Symbol("V", integer=True, positive=True)
E_idx = sp.IndexedBase("E")
row_entry = sp.Sum(sp.KroneckerDelta(i, k) * E_idx[k, j], (k, 0, V_sym - 1))
display(sp.Eq(row_entry, row_entry.doit()))

# %% [markdown]
# SymPy cannot multiply matrices of symbolic shape entry by entry, so for the matrix form we
# take a concrete, non-square size, $V = 5$ and $d = 3$, with every entry of $E$ a free
# symbol, and assert $e_i^\top E - E_{i,:} = 0$ for every $i$:

# %%
V, d = 5, 3
E = sp.Matrix(V, d, lambda r, c: sp.Symbol(f"E_{r}{c}"))
for i_ in range(V):
    e_i = sp.zeros(V, 1)
    e_i[i_] = 1
    assert sp.simplify(e_i.T * E - E[i_, :]) == sp.zeros(1, d)
display(sp.Eq(sp.MatMul(sp.Matrix([[0, 0, 1, 0, 0]]), E, evaluate=False), E[2, :], evaluate=False))

# %% [markdown]
# A sequence of $T$ tokens becomes a one-hot **matrix** $X \in \{0, 1\}^{T \times V}$ whose
# row $t$ is $e_{x_t}^\top$. Then $XE$ stacks the rows $E_{x_1,:}, \dots, E_{x_T,:}$: the
# product of the one-hot matrix with $E$ equals gathering rows. Here with the ids
# $(3, 0, 3, 1)$, so $T = 4$ and token 3 occurs twice:

# %%
ids_sym = [3, 0, 3, 1]
X = sp.Matrix(len(ids_sym), V, lambda t, c: 1 if c == ids_sym[t] else 0)
gathered = sp.Matrix.vstack(*[E[t, :] for t in ids_sym])
assert sp.simplify(X * E - gathered) == sp.zeros(len(ids_sym), d)
display(sp.Eq(sp.MatMul(X, E, evaluate=False), gathered, evaluate=False))

# %% [markdown]
# ## 2.2 The embedding layer in code
#
# The naive implementation builds $X$ and multiplies. `llmbook.text.embedding.one_hot` builds $X$
# for any batch shape, refusing float ids and ids outside $[0, V)$ (the message names the
# offending id and $V$):

# %%
show_source(one_hot)

# %% [markdown]
# The product $XE$ spends $T \cdot V \cdot d$ multiply-adds, nearly all of them on zeros.
# The lookup `E[ids]` copies $T \cdot d$ numbers and gives the same result. `TokenEmbedding`
# holds $E$ as a parameter called `weight` (as `torch.nn.Embedding` does, so state dicts are
# interchangeable), initialises it as GPT-2 does, $E_{ij} \sim \mathcal{N}(0, 0.02^2)$
# (Radford et al., 2019, "Language Models are Unsupervised Multitask Learners"), and looks
# rows up. Its `logits` method is the tied output layer of section 2.4.

# %%
show_source(TokenEmbedding)

# %% [markdown]
# A batch of $B = 2$ sequences of $T = 6$ tokens from a vocabulary of $V = 10$, embedded in
# $d = 4$ (all four sizes different, so a transposed axis cannot hide). Seen as a linear
# map, the layer is `nn.Linear(V, d, bias=False)` applied to one-hot inputs, whose weight
# (shape $d \times V$) is $E^\top$:

# %%
B, T, V, d = 2, 6, 10, 4
emb = TokenEmbedding(V, d, generator=g, dtype=torch.float64)
ids = torch.randint(0, V, (B, T), generator=g)
X = one_hot(ids, V, dtype=torch.float64)  # (B, T, V)
linear = torch.nn.Linear(V, d, bias=False, dtype=torch.float64)
with torch.no_grad():
    linear.weight.copy_(emb.weight.T)  # (d, V)
reference = torch.nn.Embedding(V, d, dtype=torch.float64)
reference.load_state_dict(emb.state_dict())
print("ids:", ids.tolist())
print("output shape:", tuple(emb(ids).shape))

# %% [markdown]
# ## 2.3 The gradient is a scatter-add
#
# Let $Y = XE$ be the layer's output and $G = \partial L / \partial Y \in \mathbb{R}^{T \times d}$
# the gradient arriving from the rest of the network. Since $L$ depends on $E$ only through
# $Y$, the chain rule gives $\partial L/\partial E_{ij} = \sum_{t,c} G_{tc}\, X_{ti}\, \delta_{jc}$,
# that is
#
# $$ \frac{\partial L}{\partial E} = X^\top G, \qquad
#    \left(\frac{\partial L}{\partial E}\right)_{i,:} = \sum_{t \,:\, x_t = i} G_{t,:}. $$
#
# Row $i$ collects the upstream gradients of the positions where token $i$ occurred; a token
# that did not occur gets a zero row; a repeated token accumulates. SymPy checks this for
# $V = 5$, $d = 3$ and the ids $(3, 0, 3, 1)$: we write the loss as $L = \sum_{t,c} G_{tc} Y_{tc}$,
# which has exactly the upstream gradient $G$ (any loss does, to first order), and
# differentiate with respect to every entry of $E$.

# %%
V5, d3, ids4 = 5, 3, [3, 0, 3, 1]
E5 = sp.Matrix(V5, d3, lambda r, c: sp.Symbol(f"E_{r}{c}"))
G = sp.Matrix(len(ids4), d3, lambda t, c: sp.Symbol(f"G_{t}{c}"))
X4 = sp.Matrix(len(ids4), V5, lambda t, c: 1 if c == ids4[t] else 0)
L = sum(G.multiply_elementwise(X4 * E5))
dL_dE = sp.Matrix(V5, d3, lambda r, c: sp.diff(L, E5[r, c]))
assert sp.simplify(dL_dE - X4.T * G) == sp.zeros(V5, d3)
display(sp.Eq(sp.Symbol(r"\partial L / \partial E"), dL_dE, evaluate=False))

# %% [markdown]
# Rows 2 and 4 (tokens that never occurred) are zero; row 3 is $G_{0,:} + G_{2,:}$ because
# token 3 sits at positions 0 and 2. PyTorch's embedding backward computes exactly this with
# an index-add instead of the (mostly zero) product $X^\top G$, and so does `embedding_grad`:

# %%
show_source(embedding_grad)

# %% [markdown]
# Everything so far, checked in float64 against PyTorch's own embedding, against the
# one-hot product and the linear layer, against autograd, and with `gradcheck` (finite
# differences):

# %%
G_up = torch.randn(B, T, d, generator=g, dtype=torch.float64)  # upstream gradient dL/dY
emb.zero_grad()
(emb(ids) * G_up).sum().backward()
ours = embedding_grad(ids, G_up, V)
unseen = sorted(set(range(V)) - set(ids.flatten().tolist()))
twice = next(t for t in range(V) if (ids == t).sum() >= 2)
W = emb.weight.detach().clone().requires_grad_(True)

checks = Checks("embedding lookup and its gradient")
checks.close("one_hot vs F.one_hot", F.one_hot(ids, V), one_hot(ids, V, torch.long), tol=0)
checks.close("E[ids] vs F.embedding", F.embedding(ids, emb.weight), emb(ids), tol=0)
checks.close("E[ids] vs nn.Embedding", reference(ids), emb(ids), tol=0)
checks.close("E[ids] vs one_hot @ E", X @ emb.weight, emb(ids), tol=0)
checks.close("E[ids] vs Linear(V, d) on one-hot", linear(X), emb(ids), tol=0)
checks.close("dL/dE: autograd vs scatter-add", emb.weight.grad, ours, tol=1e-15)
checks.close("dL/dE: X^T G vs scatter-add", X.reshape(-1, V).T @ G_up.reshape(-1, d), ours, tol=1e-15)
checks.close(f"rows of unseen tokens {unseen} are 0", torch.zeros(len(unseen), d), ours[unseen], tol=0)
checks.close(f"token {twice} accumulates", G_up[ids == twice].sum(0), ours[twice], tol=1e-15)
checks.true("gradcheck of the lookup", torch.autograd.gradcheck(lambda w: w[ids], (W,)))
checks

# %% [markdown]
# ## 2.4 Weight tying
#
# At the other end of a language model, the final hidden states $h \in \mathbb{R}^{T \times d}$
# are mapped to logits $z \in \mathbb{R}^{T \times V}$, one score per vocabulary entry. That
# output layer is a $V \times d$ matrix too, and Press & Wolf (2017, "Using the Output
# Embedding to Improve Language Models") showed that it can simply *be* $E$:
#
# $$ z = h E^\top, \qquad z_{tv} = h_t \cdot E_{v,:}. $$
#
# The logit of token $v$ is the dot product of the hidden state with $v$'s own embedding. GPT-2
# ties its weights this way, which saves $V d$ parameters (38.6 million for GPT-2 small;
# section 2.6). With $G_z = \partial L / \partial z$ the gradient of this use is
#
# $$ \left.\frac{\partial L}{\partial E}\right|_{\text{output}} = G_z^\top h
#    \quad (V \times d), $$
#
# and since the same matrix appears twice, the total derivative (the multivariable chain
# rule) is the sum of the two uses:
#
# $$ \frac{\partial L}{\partial E} = X^\top G_x + G_z^\top h. $$
#
# SymPy confirms the output-layer gradient for $T = 2$, $d = 3$, $V = 5$:

# %%
h = sp.Matrix(2, d3, lambda t, c: sp.Symbol(f"h_{t}{c}"))
Gz = sp.Matrix(2, V5, lambda t, v: sp.Symbol(f"g_{t}{v}"))
L_out = sum(Gz.multiply_elementwise(h * E5.T))
dLout_dE = sp.Matrix(V5, d3, lambda r, c: sp.diff(L_out, E5[r, c]))
assert sp.simplify(dLout_dE - Gz.T * h) == sp.zeros(V5, d3)
display(sp.Eq(sp.Symbol(r"\partial L_{out} / \partial E_{0,:}"), dLout_dE[0, :], evaluate=False))

# %% [markdown]
# Now with autograd in float64, on a small model that uses $E$ at both ends: embed, mix with
# a matrix $A$ and a $\tanh$, project back with $E^\top$, and take the cross-entropy with
# random targets. We compute the gradient of the tied matrix, then untie it into two copies
# $E_{in}$ and $E_{out}$ holding the same numbers: the tied gradient must equal the sum of the
# two copies' gradients, and neither alone.

# %%
A = torch.randn(d, d, generator=g, dtype=torch.float64)
targets = torch.randint(0, V, (B, T), generator=g)


def tiny_lm_loss(E_in, E_out):
    h = torch.tanh(E_in[ids] @ A)  # (B, T, d)
    z = h @ E_out.T  # (B, T, V)
    return F.cross_entropy(z.reshape(-1, V), targets.reshape(-1))


emb.zero_grad()
h = torch.tanh(emb(ids) @ A)
F.cross_entropy(emb.logits(h).reshape(-1, V), targets.reshape(-1)).backward()
E_in = emb.weight.detach().clone().requires_grad_(True)
E_out = emb.weight.detach().clone().requires_grad_(True)
tiny_lm_loss(E_in, E_out).backward()

# %%
checks = Checks("weight tying")
checks.close("logits(h) vs h @ E^T", h @ emb.weight.T, emb.logits(h), tol=0)
checks.close("tied grad = grad(E_in) + grad(E_out)", E_in.grad + E_out.grad, emb.weight.grad, tol=1e-15)
gap_in = (emb.weight.grad - E_in.grad).abs().max().item()
gap_out = (emb.weight.grad - E_out.grad).abs().max().item()
checks.true("input use alone: max gap to tied grad > 1e-3", gap_in > 1e-3, got=f"{gap_in:.2g}")
checks.true("output use alone: max gap to tied grad > 1e-3", gap_out > 1e-3, got=f"{gap_out:.2g}")
checks.true("gradcheck of h -> h E^T", torch.autograd.gradcheck(emb.logits, (h.detach().requires_grad_(),)))
checks

# %% [markdown]
# ## 2.5 Cosine geometry
#
# The usual way to ask whether two embeddings are alike is the cosine of the angle between them,
#
# $$ \cos(a, b) = \frac{a \cdot b}{\lVert a \rVert\, \lVert b \rVert} \in [-1, 1], $$
#
# which ignores length and looks only at direction. The package version floors each norm at a
# small $\varepsilon$ (so a zero vector gives 0, not NaN) and clamps round-off beyond $\pm 1$:

# %%
show_source(cosine_similarity)

# %% [markdown]
# ### Random vectors are nearly orthogonal
#
# Draw $x, y \in \mathbb{R}^d$ independently from $\mathcal{N}(0, I_d)$, as a freshly
# initialised embedding table does (the scale $0.02$ cancels in the cosine). By symmetry
# ($y \mapsto -y$) the mean of $\cos(x, y)$ is 0. For its variance, write $x = r_x u_x$ with
# $r_x = \lVert x \rVert$ and $u_x$ a unit vector; for an isotropic Gaussian the length and
# the direction are independent. Then $(x \cdot y)^2 = r_x^2 r_y^2 \cos^2$, and taking
# expectations of independent factors,
#
# $$ \mathbb{E}[(x \cdot y)^2] = \mathbb{E}[r_x^2]\,\mathbb{E}[r_y^2]\,\mathbb{E}[\cos^2]
#    = d \cdot d \cdot \mathbb{E}[\cos^2]. $$
#
# The left side is a polynomial expectation, computed exactly from the Gaussian moments
# $\mathbb{E}[x^{2m}] = (2m-1)!!$ and $\mathbb{E}[x^{2m+1}] = 0$. SymPy does it for
# $d = 1, \dots, 5$ (a concrete $d$ each time, since the sum must be expanded):

# %%
def gaussian_expectation(poly_expr, variables):
    """E[poly] for independent standard normal variables: moments (k-1)!! for even k, else 0."""
    poly = sp.Poly(sp.expand(poly_expr), *variables)
    return sum(coeff * sp.prod([sp.factorial2(p - 1) if p % 2 == 0 else 0 for p in powers])
               for powers, coeff in poly.terms())


for d_ in range(1, 6):
    xs, ys = sp.symbols(f"x:{d_}"), sp.symbols(f"y:{d_}")
    dot = sum(a * b for a, b in zip(xs, ys, strict=True))
    assert gaussian_expectation(dot**2, xs + ys) == d_
    assert gaussian_expectation(sum(a**2 for a in xs), xs) == d_
print("E[(x.y)^2] = d and E[|x|^2] = d for d = 1..5, so E[cos^2] = d / d^2 = 1/d")

# %% [markdown]
# The same answer from the exact distribution. For $u$ uniform on the unit sphere,
# $u_1^2 = x_1^2 / \lVert x \rVert^2$ is a ratio of a $\chi^2_1$ to an independent
# $\chi^2_1 + \chi^2_{d-1}$, which is $\mathrm{Beta}\!\left(\tfrac12, \tfrac{d-1}{2}\right)$;
# by rotation invariance $\cos^2(x, y)$ has that distribution. Its mean, for symbolic $d$:

# %%
d_sym = sp.Symbol("d", integer=True, positive=True)
cos2 = Beta("C2", sp.Rational(1, 2), (d_sym - 1) / 2)
mean_cos2 = sp.simplify(expectation(cos2))
assert sp.simplify(mean_cos2 - 1 / d_sym) == 0
display(sp.Eq(sp.Symbol(r"\mathbb{E}[\cos^2]"), mean_cos2))

# %% [markdown]
# So $\operatorname{Var}(\cos) = 1/d$ and the typical cosine is $\pm 1/\sqrt{d}$: $0.088$
# for $d = 128$, $0.031$ for $d = 1024$. Changing variables from $\cos^2$ to $c = \cos$ gives the
# density of the cosine itself,
#
# $$ f_d(c) = \frac{\Gamma(d/2)}{\sqrt{\pi}\,\Gamma\!\left(\frac{d-1}{2}\right)} (1 - c^2)^{(d-3)/2},
#    \qquad -1 < c < 1, $$
#
# which is the arcsine law for $d = 2$ and uniform for $d = 3$ (Archimedes' hat-box theorem).
# SymPy checks both special cases, that $f_d$ integrates to 1 and that its second moment is
# $1/d$; the figure below evaluates it in floating point through $\log \Gamma$, checked here
# against the exact expression:

# %%
c = sp.Symbol("c", real=True)


def cosine_density(d_value):
    d_value = sp.Integer(d_value)
    const = sp.gamma(d_value / 2) / (sp.sqrt(sp.pi) * sp.gamma((d_value - 1) / 2))
    return const * (1 - c**2) ** ((d_value - 3) / 2)


assert sp.simplify(cosine_density(2) - 1 / (sp.pi * sp.sqrt(1 - c**2))) == 0
assert cosine_density(3) == sp.Rational(1, 2)
for d_ in (2, 3, 4, 5, 8):
    assert sp.simplify(sp.integrate(cosine_density(d_), (c, -1, 1)) - 1) == 0
    assert sp.simplify(sp.integrate(c**2 * cosine_density(d_), (c, -1, 1)) - sp.Rational(1, d_)) == 0


def cosine_density_float(cs, d_value):
    """f_d(c) in float64 through log-gamma (the Gamma values overflow for large d)."""
    log_const = math.lgamma(d_value / 2) - math.lgamma((d_value - 1) / 2) - 0.5 * math.log(math.pi)
    return np.exp(log_const + (d_value - 3) / 2 * np.log1p(-cs**2))


c_grid = np.linspace(-0.95, 0.95, 7)
for d_ in (2, 3, 4, 16):
    exact = sp.lambdify(c, cosine_density(d_), "numpy")(c_grid)
    assert np.allclose(cosine_density_float(c_grid, d_), exact, rtol=1e-12, atol=0)
display(sp.Eq(sp.Function("f_4")(c), cosine_density(4)))

# %% [markdown]
# Now numerically: for each $d$, 600 random Gaussian embeddings (as `TokenEmbedding`
# initialises them), all $600 \cdot 599 / 2 = 179{,}700$ pairwise cosines from
# `pairwise_cosine`, and their mean square against $1/d$. The pairs share vectors, so they
# are not independent, but they are *uncorrelated*: given $u_i$, the factors
# $\cos(u_i, u_j)$ and $\cos(u_i, u_k)$ are independent with conditional means $0$ (and
# conditional mean squares $1/d$) that do not depend on $u_i$. So the usual standard error
# $s / \sqrt{n}$ of a mean holds, and each check allows four of them.

# %%
show_source(pairwise_cosine)

# %%
dims, n_vectors = (2, 16, 128, 1024), 600
upper = torch.triu_indices(n_vectors, n_vectors, offset=1)
cosines = {}
for d_ in dims:
    table = TokenEmbedding(n_vectors, d_, generator=g, dtype=torch.float64)
    cosines[d_] = pairwise_cosine(table.weight.detach())[upper[0], upper[1]]  # (179700,)

checks = Checks("random embeddings: E[cos] = 0, E[cos^2] = 1/d")
for d_ in dims:
    cs = cosines[d_]
    checks.close(f"d={d_}: mean cos", 0.0, cs.mean(), tol=4 * cs.std().item() / math.sqrt(cs.numel()))
    sem = 4 * (cs**2).std().item() / math.sqrt(cs.numel())
    checks.close(f"d={d_}: mean cos^2", 1 / d_, (cs**2).mean(), tol=sem)
a_, b_ = table.weight[:50].detach(), table.weight[50:100].detach()
checks.close("cosine_similarity vs F.cosine_similarity", F.cosine_similarity(a_, b_), cosine_similarity(a_, b_), tol=1e-6)
checks

# %%
fig, axes = plt.subplots(1, len(dims), figsize=(11, 3.4))
for ax, d_ in zip(axes, dims, strict=True):
    width = min(1.0, 5 / math.sqrt(d_))  # show +-5 standard deviations
    ax.hist(cosines[d_].numpy(), bins=60, range=(-width, width), density=True, color="tab:blue",
            alpha=0.6, label="pairs")
    grid = np.linspace(-width, width, 801)[1:-1]
    ax.plot(grid, cosine_density_float(grid, d_), color="black", lw=1, label="exact $f_d$")
    ax.axvspan(-1 / math.sqrt(d_), 1 / math.sqrt(d_), color="tab:orange", alpha=0.2,
               label=r"$\pm 1/\sqrt{d}$")
    ax.set_title(f"d = {d_}")
    ax.set_xlabel("cosine similarity (dimensionless)")
    ax.set_ylim(0, 2.5 if d_ == 2 else None)
axes[0].set_ylabel("probability density")
axes[0].legend(loc="upper center", fontsize="small")
fig.suptitle("Pairwise cosines of 600 random Gaussian embeddings: they concentrate at 0 "
             "with width 1/sqrt(d)", y=1.03)
save_figure(fig, "02_embeddings_random_cosines")
plt.show()

# %% [markdown]
# In two dimensions every angle is equally likely and the cosine piles up at $\pm 1$. As $d$
# grows the histogram narrows onto 0 and turns Gaussian, matching the exact density (black),
# with about two thirds of the pairs inside the $\pm 1/\sqrt{d}$ band (orange) once $d$ is large
# (for $d = 2$ exactly half). Note the horizontal axes: each panel spans five standard
# deviations either side (at most $[-1, 1]$), so the $d = 1024$ panel is more than six times
# narrower than the $d = 16$ one. At GPT-2's width, $d = 768$,
# the typical cosine between two untrained embeddings is $0.036$: there is room for
# thousands of almost-orthogonal directions, and training only has to *create* similarity,
# never remove accidental similarity.

# %% [markdown]
# ### Training makes interchangeable tokens similar
#
# A toy language: sentences `DET [ADJ] NOUN VERB .` over a 15-token vocabulary
# (2 determiners, 4 adjectives, 4 nouns, 4 verbs, and the full stop), where a determiner is
# followed by an adjective or a noun with probability $\tfrac12$ each and every choice
# within a class is uniform. We fit a bigram model,
# $p(x_{t+1} \mid x_t) = \mathrm{softmax}(E_{x_t,:} U^\top + b)$ with $d = 8$, to the
# *exact* next-token distributions (no sampling, so the run is deterministic), for 300 full-batch
# AdamW steps. Tokens of the same class have identical next-token distributions; the
# distributional hypothesis (Harris, 1954, "Distributional Structure") says they should
# end up with similar embeddings.

# %%
classes = {"DET": ["the", "a"], "ADJ": ["big", "small", "red", "old"],
           "NOUN": ["cat", "dog", "bird", "fish"], "VERB": ["runs", "sleeps", "eats", "swims"],
           "END": ["."]}
follows = {"DET": {"ADJ": 0.5, "NOUN": 0.5}, "ADJ": {"NOUN": 1.0}, "NOUN": {"VERB": 1.0},
           "VERB": {"END": 1.0}, "END": {"DET": 1.0}}
words = [w for ws in classes.values() for w in ws]
word_class = {w: cl for cl, ws in classes.items() for w in ws}
P_next = torch.tensor([[follows[word_class[u]].get(word_class[v], 0.0) / len(classes[word_class[v]])
                        for v in words] for u in words], dtype=torch.float64)  # (V, V)
assert torch.allclose(P_next.sum(1), torch.ones(len(words), dtype=torch.float64))
print(f"V = {len(words)}; entropy floor = {-(P_next * P_next.clamp_min(1e-300).log()).sum(1).mean():.4f} nats")

# %%
Vw, dw = len(words), 8
emb_in = TokenEmbedding(Vw, dw, std=0.5, generator=g, dtype=torch.float64)
emb_out = TokenEmbedding(Vw, dw, std=0.5, generator=g, dtype=torch.float64)  # U, untied
bias = torch.nn.Parameter(torch.zeros(Vw, dtype=torch.float64))
params = [emb_in.weight, emb_out.weight, bias]
opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
all_ids = torch.arange(Vw)
for _step in range(300):
    log_q = F.log_softmax(emb_out.logits(emb_in(all_ids)) + bias, dim=-1)  # (V, V)
    loss = -(P_next * log_q).sum(1).mean()  # cross-entropy against the exact next-token law
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss after 300 steps = {loss.item():.3f} nats")

# %%
C = pairwise_cosine(emb_in.weight.detach())
labels = [word_class[w] for w in words]
same = torch.tensor([[a == b for b in labels] for a in labels]) & ~torch.eye(Vw, dtype=torch.bool)
other = torch.tensor([[a != b for b in labels] for a in labels])
print(f"mean cosine within a class: {C[same].mean():.2f} (lowest {C[same].min():.2f})")
print(f"mean cosine across classes: {C[other].mean():.2f}")
members = {cl: [words.index(w) for w in ws] for cl, ws in classes.items()}
class_cos = {(a, b): C[members[a]][:, members[b]].mean().item()
             for ai, a in enumerate(classes) for b in list(classes)[ai + 1:]}
closest_pair = max(class_cos, key=class_cos.get)
print("closest pair of classes:", closest_pair, f"mean cosine {class_cos[closest_pair]:.2f}")
# the prediction, made from the data alone before any training: the two classes whose
# next-token distributions overlap most (mean cosine between rows of P_next)
P_cos = pairwise_cosine(P_next)
law_cos = {pair: P_cos[members[pair[0]]][:, members[pair[1]]].mean().item() for pair in class_cos}
predicted_pair = max(law_cos, key=law_cos.get)
print("next-token laws: closest pair", predicted_pair, f"cosine {law_cos[predicted_pair]:.4f}; "
      f"all other pairs {max(v for k, v in law_cos.items() if k != predicted_pair):.4f}")
checks = Checks("trained toy embeddings")
checks.true("lowest within-class cosine > highest across-class cosine", C[same].min() > C[other].max(),
            got=f"{C[same].min().item():.2f} vs {C[other].max().item():.2f}")
checks.equal("closest pair of classes == closest pair of next-token laws", predicted_pair, closest_pair)
checks

# %% [markdown]
# To look at 8-dimensional vectors we project them on their two principal axes: centre the
# rows of $E$ and take the top two right singular vectors from `torch.linalg.svd`.

# %%
E_centered = emb_in.weight.detach() - emb_in.weight.detach().mean(0)
_, S, Vh = torch.linalg.svd(E_centered, full_matrices=False)
coords = E_centered @ Vh[:2].T  # (V, 2)
explained = (S[:2] ** 2).sum() / (S**2).sum()
fig, ax = plt.subplots(figsize=(6, 4.6))
for cl, ws in classes.items():
    rows = [words.index(w) for w in ws]
    ax.scatter(coords[rows, 0], coords[rows, 1], s=30, alpha=0.8, label=f"{cl}: {' '.join(ws)}")
ax.legend(fontsize="small", loc="best")
ax.set_xlabel("principal axis 1 (embedding units)")
ax.set_ylabel("principal axis 2 (embedding units)")
ax.set_title(f"Toy-grammar embeddings after 300 steps (2 axes keep {explained:.0%} of the variance)")
save_figure(fig, "02_embeddings_toy_pca")
plt.show()

# %% [markdown]
# The words gather by class: the model was never told the classes, only which words follow
# which, and words that can replace one another get nearly the same vector (every cosine
# within a class exceeds every cosine across classes, checked above). Of the different
# classes, determiners and adjectives are the closest pair, as predicted from the data
# before training: both can be followed by a noun, so theirs are the only two next-token
# distributions that overlap (cosine $1/\sqrt{2}$; every other pair of classes has
# disjoint successors, cosine 0).

# %% [markdown]
# ## 2.6 Parameter counts
#
# With $T_{\max}$ the context length, the embedding-related matrices of a language model hold
#
# $$ N_{\text{tok}} = V d, \qquad N_{\text{head}} = \begin{cases} 0 & \text{tied} \\ V d & \text{untied}\end{cases},
#    \qquad N_{\text{pos}} = T_{\max}\, d \ \ (\text{learned positions only}). $$

# %%
show_source(embedding_parameter_count)

# %%
Vs, ds, Ts = sp.symbols("V d T_max", positive=True, integer=True)
N_tied = Vs * ds + Ts * ds
N_untied = 2 * Vs * ds + Ts * ds
gpt2_small = {Vs: 50257, ds: 768, Ts: 1024}
display(sp.Eq(sp.Symbol(r"N_{\text{tied}}"), N_tied),
        sp.Eq(sp.Symbol(r"N_{\text{untied}} - N_{\text{tied}}"), sp.factor(N_untied - N_tied)))
print(f"GPT-2 small: token embedding {int((Vs * ds).subs(gpt2_small)):,}, "
      f"positions {int((Ts * ds).subs(gpt2_small)):,}, total {int(N_tied.subs(gpt2_small)):,}")

# %% [markdown]
# The real objects come from Hugging Face `transformers`, built from their configurations
# on PyTorch's `meta` device: every tensor has a shape but no storage, so nothing is
# downloaded or allocated and a 7-billion-parameter model costs nothing to build. GPT-2 small
# uses the library's default `GPT2Config` (Radford et al., 2019); the Llama-sized model uses
# $V = 32000$, $d = 4096$ and 32 layers, the shape of Llama 2 7B (Touvron et al., 2023,
# "Llama 2: Open Foundation and Fine-Tuned Chat Models"), which has rotary positions (no
# table) and an untied head.

# %%
with torch.device("meta"):
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, tie_word_embeddings=False))
wte, wpe = gpt2.transformer.wte.weight, gpt2.transformer.wpe.weight
tok, head = llama.model.embed_tokens.weight, llama.lm_head.weight
gpt2_total = sum(p.numel() for p in gpt2.parameters())
llama_total = sum(p.numel() for p in llama.parameters())

# %%
checks = Checks("parameter counts against transformers")
checks.equal("GPT-2 wte = V d", wte.numel(), embedding_parameter_count(50257, 768))
checks.equal("GPT-2 wpe = T_max d", wpe.numel(), int((Ts * ds).subs(gpt2_small)))
checks.equal("GPT-2 wte + wpe (tied)", wte.numel() + wpe.numel(),
             embedding_parameter_count(50257, 768, context_length=1024, tied=True))
checks.true("GPT-2 lm_head is wte (tied)", gpt2.lm_head.weight is wte)
checks.equal("Llama embed + head (untied) = 2 V d", tok.numel() + head.numel(),
             embedding_parameter_count(32000, 4096, tied=False))
checks.true("Llama lm_head is a separate matrix", head is not tok)
checks

# %%
print(f"GPT-2 small: {gpt2_total:,} parameters, of which embeddings {wte.numel() + wpe.numel():,} "
      f"= {(wte.numel() + wpe.numel()) / gpt2_total:.1%}")
print(f"  untying its head would add {embedding_parameter_count(50257, 768):,} parameters (+{50257 * 768 / gpt2_total:.1%})")
print(f"Llama-2-7B shape: {llama_total:,} parameters, of which embedding + head {tok.numel() + head.numel():,} "
      f"= {(tok.numel() + head.numel()) / llama_total:.1%}")

# %% [markdown]
# In a small model the vocabulary dominates: almost a third of GPT-2 small is its embedding
# table, and tying the head is what keeps it from being half. At 7 billion parameters the
# untied embedding and head together are under 4%; the transformer blocks, whose size grows
# as $d^2$ per layer while the embeddings grow only as $V d$, have taken over.

# %% [markdown]
# ## 2.7 Real embeddings: the $\sqrt{d}$ scale and anisotropy
#
# ### Why Gemma multiplies its embeddings by $\sqrt{d}$
#
# A tied matrix $E$ serves two masters. As the output layer it meets the final hidden state
# $h$, which a normalisation layer (chapter 6) leaves with entries of mean square about 1; if
# the entries of $E$ are independent with variance $\sigma^2$, the logit $z_v = h \cdot E_{v,:}$
# has variance $d\sigma^2$, and unit-variance logits at initialisation need
# $\sigma = 1/\sqrt{d}$. As the input layer it feeds the residual stream, whose blocks are built
# for inputs of root-mean-square (RMS) about 1; but a row of that $E$ has RMS
# $\sigma = 1/\sqrt{d}$. Multiplying the looked-up rows, and only those, by $s = \sqrt{d}$
# reconciles the two. Gemma 2 (Riviere et al., 2024) does this: its `transformers` module
# `Gemma2TextScaledWordEmbedding` multiplies the rows by `hidden_size**0.5`, and
# `TokenEmbedding(..., scale=...)` does the same here. The two conditions are one way to see
# why the factor is $\sqrt{d}$; SymPy solves them:

# %%
sigma, s_scale, d_sym = sp.symbols("sigma s d", positive=True)
sigma_out = sp.solve(sp.Eq(d_sym * sigma**2, 1), sigma)[0]  # Var(z) = d sigma^2 = 1
s_in = sp.solve(sp.Eq(s_scale * sigma_out, 1), s_scale)[0]  # RMS of s E_v = s sigma = 1
display(sp.Eq(sp.Symbol(r"\sigma"), sigma_out), sp.Eq(sp.Symbol("s"), s_in))

# %% [markdown]
# The check builds a tied model both ways at $d = 2304$ (Gemma 2 2B's width) with
# $\sigma = 1/\sqrt{d}$, against `transformers`' module given the same matrix: the scaled
# lookup must equal it, the logits of a unit-RMS $h$ must have variance near 1 and the inputs
# RMS near 1, and without the scale the inputs have RMS near $1/\sqrt{d} = 0.021$. The
# tolerances are four standard errors of each estimate, fixed by the sample sizes before the
# run (the variance of a sample variance of $n$ Gaussian values is $2/(n-1)$ in units of the
# variance squared; the mean square of $n$ values has relative standard error $\sqrt{2/n}$).

# %%
from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding

d_g, V_g = 2304, 1000
scaled = TokenEmbedding(V_g, d_g, std=1 / math.sqrt(d_g), generator=g, scale=float(s_in.subs(d_sym, d_g)))
plain = TokenEmbedding(V_g, d_g, std=1 / math.sqrt(d_g))
with torch.no_grad():
    plain.weight.copy_(scaled.weight)
gemma_peer = Gemma2TextScaledWordEmbedding(V_g, d_g, padding_idx=0, embed_scale=d_g**0.5)
gemma_peer.weight.data.copy_(scaled.weight.data)
ids_g = torch.randint(0, V_g, (4, 64), generator=g)  # (B, T)
h_g = F.rms_norm(torch.randn(4, 64, d_g, generator=g), (d_g,))  # (B, T, d), mean square 1
z_g = scaled.logits(h_g)  # (B, T, V)
x_scaled, x_plain = scaled(ids_g), plain(ids_g)  # (B, T, d)
n_z, n_x = z_g.numel(), x_scaled.numel()
print(f"logit variance {z_g.var().item():.4f} (n = {n_z:,}); input RMS with the scale "
      f"{x_scaled.pow(2).mean().sqrt().item():.4f}, without {x_plain.pow(2).mean().sqrt().item():.4f}")
scale_checks = Checks("the sqrt(d) embedding scale, d = 2304, sigma = 1/sqrt(d)")
scale_checks.close("scaled lookup vs transformers' Gemma2TextScaledWordEmbedding", gemma_peer(ids_g),
                   x_scaled, tol=0)
scale_checks.close("Var(z) vs 1 (4 s.e.)", 1.0, z_g.var(), tol=4 * math.sqrt(2 / (n_z - 1)))
scale_checks.close("mean square of the scaled inputs vs 1 (4 s.e.)", 1.0, x_scaled.pow(2).mean(),
                   tol=4 * math.sqrt(2 / n_x))
scale_checks.close("mean square without the scale vs 1/d (4 s.e.)", 1 / d_g, x_plain.pow(2).mean(),
                   tol=4 * math.sqrt(2 / n_x) / d_g)
scale_checks

# %% [markdown]
# (The draws are not all independent: positions can share a row, and the logits of one
# position share $h$, which is why the checks allow four standard errors rather than two.)
#
# ### Anisotropy: the embeddings of a trained model share a direction
#
# Section 2.5 showed that random vectors are nearly orthogonal: the cosine of two of them has
# mean 0 and standard deviation $1/\sqrt{d}$. Trained embedding matrices are known not to look
# like that: their rows crowd into a narrow cone, so that unrelated tokens have clearly
# positive cosines (the "representation degeneration" of tied output embeddings described by
# Gao et al., 2019). We measure it on the book's real model, SmolLM2-135M ($d = 576$, tied), on 2,000
# random tokens, and again after subtracting the mean row of the whole matrix, the one
# direction they all share.

# %%
from llmbook.inference.ggml_quants import dequantize
from llmbook.inference.gguf import smollm2_path
from llmbook.inference.gguf_file import read_gguf

embd = read_gguf(smollm2_path()).tensors["token_embd.weight"]
E_real = torch.from_numpy(np.ascontiguousarray(dequantize(embd.data, embd.qtype, embd.shape))).double()
V_r, d_r = E_real.shape
sample = torch.randperm(V_r, generator=g)[:2000]
upper_r = torch.triu_indices(2000, 2000, offset=1)
cos_raw = pairwise_cosine(E_real[sample])[upper_r[0], upper_r[1]]  # (1999000,)
mean_row = E_real.mean(0)  # (d,)
cos_centred = pairwise_cosine(E_real[sample] - mean_row)[upper_r[0], upper_r[1]]
share = (E_real[sample] @ mean_row / mean_row.norm()).pow(2).sum() / E_real[sample].pow(2).sum()
print(f"SmolLM2, d = {d_r}, {len(sample):,} random tokens: isotropic expectation 0 +- {1 / math.sqrt(d_r):.4f}")
print(f"  raw rows:        mean cosine {cos_raw.mean().item():.4f}, standard deviation {cos_raw.std().item():.4f}")
print(f"  minus mean row:  mean cosine {cos_centred.mean().item():.4f}, standard deviation "
      f"{cos_centred.std().item():.4f}")
print(f"  share of the rows' squared length along the mean direction: {share.item():.3f} "
      f"(isotropic: 1/d = {1 / d_r:.4f})")
aniso_checks = Checks("anisotropy of SmolLM2's embedding")
aniso_checks.close("pairwise_cosine vs F.cosine_similarity (200 rows)",
                   F.cosine_similarity(E_real[sample[:200], None], E_real[None, sample[:200]], dim=-1),
                   pairwise_cosine(E_real[sample[:200]]), tol=1e-12)
# isotropic rows: each cosine has mean 0 and standard deviation 1/sqrt(d), so their mean, however
# dependent, has standard deviation at most 1/sqrt(d); above 4/sqrt(d) has probability < 1/16
aniso_checks.true("raw mean cosine > 4/sqrt(d): not isotropic", cos_raw.mean().item() > 4 / math.sqrt(d_r),
                  got=f"{cos_raw.mean().item():.4f} vs {4 / math.sqrt(d_r):.4f}")
aniso_checks

# %% [markdown]
# The raw rows have a mean cosine above 0.4, ten times the spread that isotropic vectors would
# show, and about half of their squared length lies along one direction, the mean row. Removing that single direction brings the mean cosine to about zero, though the
# spread stays wider than $1/\sqrt{d}$: the rest of the geometry is not isotropic either, but
# most of what made every token look similar to every other was one shared offset. This is
# why similarity searches over embeddings usually centre them first, and why the cosine of
# two raw embeddings says less about the two tokens than it seems to.

# %% [markdown]
# ## Summary
#
# * $e_i^\top E = E_{i,:}$: the embedding layer is the linear map $X \mapsto XE$ on one-hot
#   inputs, computed as a lookup.
# * $\partial L / \partial E = X^\top G$: a scatter-add into the rows of the tokens that
#   occurred; unseen rows get nothing, repeats accumulate.
# * Tied output $z = h E^\top$ saves $V d$ parameters, and the tied gradient is the sum of
#   both uses' gradients.
# * Random embeddings are nearly orthogonal, $\cos \sim \pm 1/\sqrt d$ with
#   $\mathbb{E}[\cos^2] = 1/d$ exactly; training makes interchangeable tokens close.
# * A tied matrix initialised for unit-variance logits ($\sigma = 1/\sqrt d$) gives inputs of
#   RMS $1/\sqrt d$; Gemma's $\sqrt d$ factor on the lookup restores RMS 1 (equal to
#   `transformers`' module).
# * A trained embedding is anisotropic: SmolLM2's rows have a mean cosine above 0.4, and about
#   half of their squared length lies along their mean; removing that one direction brings the
#   mean cosine to about zero.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/02_embeddings.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 02` writes a stub
# of every function, `llmbook grade 02` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_02.py` runs
# the same checks on the reference.
#
# 1. (★) **Nearest neighbours.** Write `nearest_neighbours(E, i, k)` returning the indices of
#    the $k$ rows of $E$ with the highest cosine to row $i$, excluding $i$ itself, ties broken
#    by the smaller index. On the trained toy table, the 3 neighbours of `cat` should be the
#    other nouns.
# 2. (★★) **When the vocabulary is half the model.** GPT-2 small has 85,056,000 parameters
#    outside `wte` and `wpe` (count them from the meta-device model above). With SymPy, solve
#    for the vocabulary size $V$ at which the tied token embedding plus the position table are
#    exactly half of all parameters, keeping $d = 768$ and $T_{\max} = 1024$.
# 3. (★★) **The spread of $\cos^2$.** Using the $\mathrm{Beta}(\tfrac12, \tfrac{d-1}{2})$ law,
#    find $\mathbb{E}[\cos^4]$ and $\operatorname{Var}(\cos^2)$ as functions of $d$; check
#    $d = 3$ against the uniform density and $d = 64$ against random vectors.
# 4. (★★★) **The tied gradient by hand.** For the tiny model of section 2.4,
#    $z = \tanh(E_{x,:} A)\, E^\top$, take the squared-error loss
#    $L = \frac{1}{2N}\sum_{t} \lVert z_t - y_t \rVert^2$ against the one-hot targets $y_t$
#    (chapter 3 explains why language models use the cross-entropy instead). Derive
#    $\partial L / \partial z = (z - y)/N$ with SymPy on a small case, then write
#    $\partial L / \partial E$ without autograd and check it against autograd in float64.
#    Hint: the chain rule through $\tanh$ ($\tanh' = 1 - \tanh^2$), and the two uses of the
#    tied matrix add (section 2.4).
# 5. (★★) **All but the top.** Write `remove_top_directions(E, k)` that centres the rows of
#    $E$ and projects out the $k$ leading principal directions of the centred rows (the first
#    $k$ right singular vectors). Check that the squared length removed equals the sum of the
#    $k$ largest eigenvalues of the centred rows' scatter matrix, then measure on SmolLM2's
#    sample of section 2.7 how the mean cosine and its spread change for $k = 0, 1, 2, 5, 10$.

# %%
from llmbook.workbench import grade

grade("02", globals())
