# %% [markdown]
# # 5 Positions
#
# Chapter 4 built attention, $\operatorname{softmax}(QK^\top/\sqrt{d_k})\,V$. Every ingredient
# of that formula treats the $T$ tokens of a sequence as a *set*: the scores compare contents,
# never places. Word order, which carries much of the meaning of language, is invisible to it.
# This chapter shows that fact in two lines of code and then studies the four standard ways of
# giving a transformer a sense of position:
#
# 1. **sinusoidal** encodings, a fixed table added to the embeddings (Vaswani et al., 2017,
#    "Attention Is All You Need");
# 2. **learned** absolute positions, a trained table (GPT-2's `wpe`);
# 3. **rotary** position embedding, RoPE, which rotates queries and keys so that their dot
#    product depends only on the *distance* between two tokens (Su et al., 2021, "RoFormer:
#    Enhanced Transformer with Rotary Position Embedding"), with its two incompatible memory
#    layouts and the permutation between them;
# 4. **ALiBi**, which adds no vectors at all but penalises attention scores in proportion to
#    distance (Press, Smith & Lewis, 2022, "Train Short, Test Long: Attention with Linear
#    Biases Enables Input Length Extrapolation").
#
# Section 5.6 then stretches RoPE beyond the length a model was trained on, with the scaling
# rules current checkpoints ship (position interpolation, NTK-aware, YaRN, Llama 3.1's).
#
# The central result is a SymPy proof that RoPE scores depend on positions $m$ and $n$ only
# through $m - n$. The code is checked against Hugging Face's Llama rotary embedding, against
# an independent complex-number implementation, and against BLOOM's ALiBi.

# %%
import itertools
import math

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
import transformers
from IPython.display import display
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.transformer.positional import (
    LearnedPositions,
    RotaryEmbedding,
    _rotate_pairs,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    rope_float32_angle_error_bound,
    rope_frequencies,
    rope_inverse_frequencies,
    rope_matrix,
    rope_permutation,
    sinusoidal_positions,
    sinusoidal_shift_matrix,
)

g = seed_everything(0)

# %% [markdown]
# ## 5.1 Attention cannot see order
#
# Let $X \in \mathbb{R}^{T \times d}$ hold one sequence, a row per token, and let $P$ be a
# $T \times T$ permutation matrix, so $PX$ is the same tokens in another order. Then
# $Q, K, V$ become $PQ, PK, PV$, the scores become $P\,QK^\top P^\top$, the row-wise softmax
# commutes with permuting rows and columns alike, and $P^\top P = I$:
#
# $$ \operatorname{Attn}(PX) = \operatorname{softmax}\!\big(P\,QK^\top P^\top/\sqrt{d_k}\big)\,PV
#    = P\,\operatorname{softmax}\!\big(QK^\top/\sqrt{d_k}\big)\,P^\top P V = P\,\operatorname{Attn}(X). $$
#
# Attention is *permutation equivariant*: shuffle the input and the output is shuffled the same
# way, token by token unchanged. A plain unmasked attention shows it in float64:

# %%
def attention(X, Wq, Wk, Wv):
    """softmax(Q K^T / sqrt(d_k)) V for one sequence X of shape (T, d); no mask."""
    Q, K, V = X @ Wq, X @ Wk, X @ Wv  # (T, d_k) each
    return torch.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1) @ V  # (T, d_k)


T, d, d_k = 6, 8, 4
X = torch.randn(T, d, generator=g, dtype=torch.float64)
Wq, Wk, Wv = (torch.randn(d, d_k, generator=g, dtype=torch.float64) for _ in range(3))
perm = torch.randperm(T, generator=g)
PE = sinusoidal_positions(T, d, dtype=torch.float64)  # section 5.2
print("permutation:", perm.tolist())

# %% [markdown]
# Adding a position vector to each *place* (not to each token) breaks the symmetry: after the
# shuffle, token $t$ carries a different position vector, so its output changes.

# %%
checks = Checks("attention and order")
checks.close("Attn(X[perm]) = Attn(X)[perm]", attention(X, Wq, Wk, Wv)[perm],
             attention(X[perm], Wq, Wk, Wv), tol=1e-14)
moved = (attention(X[perm] + PE, Wq, Wk, Wv) - attention(X + PE, Wq, Wk, Wv)[perm]).abs().max()
checks.true("with positions added, it differs", bool(moved > 0.01), got=moved)
checks

# %% [markdown]
# A causal mask (chapter 4) is itself an ordering, so a causal decoder without any position
# scheme is not exactly equivariant and can still learn some positional information (Haviv et
# al., 2022, "Transformer Language Models without Positional Encodings Still Learn Positional
# Information"). Every model in this book nevertheless uses one of the explicit schemes below.
#
# ## 5.2 Sinusoidal positions
#
# Vaswani et al. (2017, section 3.5) add to the embedding of the token at position $p$ the
# vector $\mathrm{PE}_p \in \mathbb{R}^d$ with
#
# $$ \mathrm{PE}_{p,\,2i} = \sin(p\,\omega_i), \qquad \mathrm{PE}_{p,\,2i+1} = \cos(p\,\omega_i),
#    \qquad \omega_i = 10000^{-2i/d}, \quad i = 0, \dots, d/2 - 1. $$
#
# Each pair of coordinates is a clock hand turning at its own speed, with wavelengths from
# $2\pi$ up to $2\pi \cdot 10000$ positions. The paper chose this form because, for a fixed
# offset $k$, $\mathrm{PE}_{p+k}$ is a *linear* function of $\mathrm{PE}_p$. SymPy derives the
# map from the angle-addition formulas, for one pair with symbolic $p$, $k$ and $\omega$:

# %%
p, k, w = sp.symbols("p k omega", real=True)
S, C = sp.symbols("S C", real=True)  # stand-ins for sin(p omega) and cos(p omega)
pair = sp.Matrix([sp.sin(p * w), sp.cos(p * w)])
shifted = sp.Matrix([sp.sin(p * w + k * w), sp.cos(p * w + k * w)]).applyfunc(sp.expand_trig)
linear = shifted.subs({sp.sin(p * w): S, sp.cos(p * w): C})
M = linear.jacobian([S, C])  # the coefficients of sin(p omega) and cos(p omega)
assert sp.expand(linear - M * sp.Matrix([S, C])) == sp.zeros(2, 1)  # linear in the pair
assert p not in M.free_symbols  # and the map does not depend on the position p
assert sp.simplify(M.T * M) == sp.eye(2) and sp.simplify(M.det()) == 1  # a rotation
display(sp.Eq(pair.subs(p, p + k), sp.MatMul(M, pair, evaluate=False), evaluate=False))

# %% [markdown]
# So $\mathrm{PE}_{p+k} = M_k\, \mathrm{PE}_p$ with $M_k$ block diagonal, its $i$-th block the
# rotation by $-k\omega_i$ shown above, the same for every $p$. A model can therefore learn to
# attend "$k$ tokens back" with a linear map, at least in principle. The package builds the table
# and $M_k$:

# %%
show_source(sinusoidal_positions)

# %% [markdown]
# The float64 table against the formula evaluated by `sp.lambdify`, and the shift property for
# several offsets (including a negative one) on a table of $T = 300$ positions and $d = 64$.
# (A float32 table is the float64 one rounded once; section 5.4 shows why that order matters.)

# %%
pos_s, i_s, d_s = sp.symbols("p i d", nonnegative=True)
angle = pos_s / sp.Integer(10000) ** (2 * i_s / d_s)
f_sin, f_cos = (sp.lambdify((pos_s, i_s, d_s), e, "numpy") for e in (sp.sin(angle), sp.cos(angle)))
T_pe, d_pe = 300, 64
pp, ii = np.meshgrid(np.arange(T_pe), np.arange(d_pe // 2), indexing="ij")  # (T, d/2) each
ref = np.stack([f_sin(pp, ii, d_pe), f_cos(pp, ii, d_pe)], -1).reshape(T_pe, d_pe)  # sin, cos, ...
pe = sinusoidal_positions(T_pe, d_pe, dtype=torch.float64)

checks = Checks("sinusoidal positions")
checks.close("table vs SymPy lambdify", ref, pe, tol=1e-13)
for k_ in (1, 7, 50):
    Mk = sinusoidal_shift_matrix(k_, d_pe)
    checks.close(f"PE[p + {k_}] = M_{k_} PE[p]", pe[k_:], pe[:-k_] @ Mk.T, tol=1e-13)
checks.close("PE[p - 5] = M_-5 PE[p]", pe[:-5], pe[5:] @ sinusoidal_shift_matrix(-5, d_pe).T, tol=1e-13)
checks.close("M_k orthogonal", torch.eye(d_pe, dtype=torch.float64), Mk.T @ Mk, tol=1e-14)
checks

# %% [markdown]
# The table as an image: rows are positions, columns dimensions. The first columns oscillate
# quickly (wavelength $2\pi \approx 6.3$ positions) and distinguish neighbours; the last ones
# barely move over 300 positions and place a token coarsely in the sequence, like the hands of
# a clock from seconds to hours.

# %%
fig, ax = plt.subplots(figsize=(7, 3.6))
im = ax.imshow(pe.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
ax.set_title(f"Sinusoidal position table (T = {T_pe}, d = {d_pe})")
ax.set_xlabel("dimension (even: sin, odd: cos)")
ax.set_ylabel("position p (tokens)")
fig.colorbar(im, ax=ax, label="PE value")
save_figure(fig, "05_positions_sinusoidal")
plt.show()

# %% [markdown]
# ## 5.3 Learned positions
#
# GPT-2 (Radford et al., 2019) drops the formula and *learns* the table: a matrix
# $P \in \mathbb{R}^{T_{\max} \times d}$ whose row $p$ is added to the token embedding at
# position $p$, exactly like the token embedding of chapter 2 but indexed by position. It costs
# $T_{\max} d$ parameters (786,432 for GPT-2 small) and has no row at all for positions
# $p \ge T_{\max}$, so a learned table cannot be used beyond the context length it was trained
# for. The package refuses such a position instead of indexing out of bounds:

# %%
show_source(LearnedPositions)

# %% [markdown]
# Checked against Hugging Face's GPT-2: a small randomly initialised `GPT2Model` (no download)
# returns as its first hidden state the sum of its token and position embeddings, which our
# table, loaded with the model's `wpe` weights, reproduces:

# %%
cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=12, n_layer=1, n_head=2,
                              bos_token_id=0, eos_token_id=0)
torch.manual_seed(0)
gpt2 = transformers.GPT2Model(cfg).eval()
wpe = LearnedPositions(cfg.n_positions, cfg.n_embd)
wpe.load_state_dict(gpt2.wpe.state_dict())
ids = torch.randint(0, 50, (3, 11), generator=g)  # B=3, T=11
with torch.no_grad():
    h0 = gpt2(ids, output_hidden_states=True).hidden_states[0]  # (B, T, d)
    ours = gpt2.wte(ids) + wpe(torch.arange(11))  # (B, T, d)

checks = Checks("learned positions against GPT-2")
checks.close("wte(ids) + wpe(arange(T)) vs GPT-2", h0, ours, tol=1e-7)
checks.close("wpe vs nn.Embedding", gpt2.wpe(torch.arange(16)), wpe(torch.arange(16)), tol=0)
checks.equal("parameters = T_max d", sum(p.numel() for p in wpe.parameters()), 16 * 12)
checks

# %%
try:
    wpe(torch.arange(17))
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## 5.4 Rotary position embedding (RoPE)
#
# Both schemes so far mark *absolute* positions and leave it to the network to work out
# distances. Su et al. (2021) asked instead for position-dependent maps $f(q, m)$ and $f(k, n)$
# of a query at position $m$ and a key at position $n$ such that the attention score depends on
# the positions only through their offset:
#
# $$ f(q, m)^\top f(k, n) = g(q, k, m - n). $$
#
# In two dimensions a rotation does it. Let $R_\alpha$ be the rotation by angle $\alpha$ and
# take $f(q, m) = R_{m\theta}\, q$. Rotations compose by adding angles and
# $R_\alpha^\top = R_{-\alpha}$, so
#
# $$ (R_{m\theta} q)^\top (R_{n\theta} k) = q^\top R_{m\theta}^\top R_{n\theta}\, k
#    = q^\top R_{(n-m)\theta}\, k. $$
#
# SymPy proves the matrix identity for symbolic $m$, $n$, $\theta$:

# %%
m, n, r, theta = sp.symbols("m n r theta", real=True)


def rot(a):
    """The 2x2 rotation matrix by angle a."""
    return sp.Matrix([[sp.cos(a), -sp.sin(a)], [sp.sin(a), sp.cos(a)]])


lhs = rot(m * theta).T * rot(n * theta)
assert sp.simplify(lhs - rot((n - m) * theta)) == sp.zeros(2, 2)
display(sp.Eq(sp.MatMul(rot(m * theta).T, rot(n * theta), evaluate=False), rot((n - m) * theta)))

# %% [markdown]
# and then the score itself, with $q$ and $k$ symbolic: substituting $n = m + r$ leaves an
# expression whose derivative with respect to $m$ is zero. It depends on $r = n - m$ alone:

# %%
q = sp.Matrix(sp.symbols("q_0 q_1", real=True))
kv = sp.Matrix(sp.symbols("k_0 k_1", real=True))
score = ((rot(m * theta) * q).T * (rot(n * theta) * kv))[0, 0]
relative = sp.simplify(sp.expand_trig(score.subs(n, m + r)))
assert sp.simplify(sp.diff(relative, m)) == 0
assert sp.simplify(relative - (q.T * rot(r * theta) * kv)[0, 0]) == 0
display(sp.Eq(sp.Symbol(r"(R_{m\theta} q)^\top R_{n\theta} k"), sp.collect(relative, [sp.cos(r * theta)])))

# %% [markdown]
# For a head of width $d_k$ (even), RoPE splits the vector into $d_k/2$ pairs and rotates pair
# $j$ by $m\theta_j$, with a frequency per pair like the sinusoidal table:
#
# $$ \theta_j = b^{-2j/d_k}, \quad j = 0, \dots, d_k/2 - 1, \qquad
#    R_m = \operatorname{diag}\big(R_{m\theta_0}, \dots, R_{m\theta_{d_k/2-1}}\big), $$
#
# with base $b = 10000$ in the paper (`rope_theta` in Hugging Face configurations: 500000 for
# Llama 3). A block-diagonal matrix of rotations is again orthogonal with
# $R_m^\top R_n = R_{n-m}$, block by block. SymPy checks $d_k = 6$ with three symbolic
# frequencies:

# %%
thetas = sp.symbols("theta_0:3", positive=True)


def R6(pos):
    """RoPE's block-diagonal rotation for d_k = 6 at position pos (interleaved pairs)."""
    return sp.diag(*[rot(pos * t) for t in thetas])


q6, k6 = sp.Matrix(sp.symbols("q_0:6", real=True)), sp.Matrix(sp.symbols("k_0:6", real=True))
assert sp.simplify(R6(m).T * R6(n) - R6(n - m)) == sp.zeros(6, 6)
score6 = ((R6(m) * q6).T * (R6(n) * k6))[0, 0].subs(n, m + r)
assert sp.simplify(sp.diff(score6, m)) == 0
print("d_k = 6: R_m^T R_n = R_(n-m) and d(score)/dm = 0 with n = m + r")

# %% [markdown]
# The same thing in complex numbers, which is how the paper and Meta's Llama code write it:
# read pair $j$ of $q$ as $\tilde q_j = q_{2j} + i\, q_{2j+1}$. A rotation by $m\theta_j$ is
# multiplication by $e^{i m \theta_j}$, and the real dot product of two pairs is
# $\operatorname{Re}(\tilde q_j \overline{\tilde k_j})$, so
#
# $$ (R_m q)^\top (R_n k) = \operatorname{Re} \sum_j \tilde q_j\, \overline{\tilde k_j}\,
#    e^{i (m - n) \theta_j}. $$
#
# The offset appears in a single factor. We use this form below as an independent
# implementation to test against.
#
# ### The implementation
#
# No $d_k \times d_k$ matrix is ever built: pair $(a, b)$ becomes
# $(a\cos - b\sin,\; a\sin + b\cos)$, an elementwise operation with the cosines and sines
# looked up in a table computed once. The tables are indexed by **explicit positions**, a
# $(T,)$ or $(B, T)$ integer tensor, because with a KV cache (chapter 13) or left padding the
# positions of a block of queries do not start at 0 and may differ across the batch.
# `apply_rotary` checks its arguments and hands the rotation to `_rotate_pairs`, which the
# fast decoding loop of chapter 13 calls directly, its shapes checked once.

# %%
show_source(apply_rotary)

# %%
show_source(_rotate_pairs)

# %%
show_source(RotaryEmbedding)

# %% [markdown]
# ### Two layouts and the permutation between them
#
# *Which* coordinates form a pair is a convention, and two are in use:
#
# * **interleaved**: pairs $(x_0, x_1), (x_2, x_3), \dots$, as in the RoFormer paper, GPT-J and
#   Meta's original Llama code (complex numbers over adjacent entries);
# * **half-split**: pairs $(x_j, x_{j + d_k/2})$, as in Hugging Face's Llama and Qwen2, written
#   there as $x \cos + \operatorname{rotate\_half}(x) \sin$.
#
# The two are different functions of $x$, so a checkpoint trained with one gives wrong outputs
# under the other. They are related by a fixed permutation. Let $\pi = (0, \tfrac{d_k}{2}, 1,
# \tfrac{d_k}{2} + 1, \dots)$ and $P$ the matrix with $(Px)_i = x_{\pi(i)}$; then $Px$ lists
# the half-split pairs side by side and
#
# $$ R^{\text{interleaved}}_m = P\, R^{\text{half}}_m\, P^\top . $$
#
# SymPy for $d_k = 4$, with $c_j = \cos m\theta_j$ and $s_j = \sin m\theta_j$ left symbolic:

# %%
c0, s0, c1, s1 = sp.symbols("c_0 s_0 c_1 s_1", real=True)
R_inter = sp.Matrix([[c0, -s0, 0, 0], [s0, c0, 0, 0], [0, 0, c1, -s1], [0, 0, s1, c1]])
R_half = sp.Matrix([[c0, 0, -s0, 0], [0, c1, 0, -s1], [s0, 0, c0, 0], [0, s1, 0, c1]])
pi = rope_permutation(4).tolist()
P = sp.eye(4)[pi, :]  # (P x)_i = x_pi(i)
assert P * R_half * P.T == R_inter
print("pi =", pi)
display(sp.Eq(sp.Symbol(r"R^{\mathrm{interleaved}}"), R_inter, evaluate=False),
        sp.Eq(sp.Symbol(r"R^{\mathrm{half}}"), R_half, evaluate=False))

# %%
show_source(rope_permutation)

# %% [markdown]
# Converting a checkpoint applies $P$ to the rows of $W_q$ and $W_k$ within each head
# (exercise 3): as $P$ is orthogonal, $(P a)^\top (P b) = a^\top b$ and the attention scores do
# not change.
#
# ### Checks against Hugging Face Llama and a complex-number RoPE
#
# Hugging Face's `LlamaRotaryEmbedding` is built from a small `LlamaConfig` (no download) with
# head width $d_k = 12$ and base $500000$. The test uses $B = 3$, $H = 2$, $T = 7$ and
# positions that neither start at 0 nor run consecutively, different for each sequence:

# %%
B, H, T, dk, base = 3, 2, 7, 12, 500000.0
llama_cfg = transformers.LlamaConfig(hidden_size=H * dk, num_attention_heads=H, head_dim=dk,
                                     max_position_embeddings=512, rope_theta=base)
hf_rope = LlamaRotaryEmbedding(llama_cfg)
rope = RotaryEmbedding(dk, theta=base, max_seq_len=512)  # half-split, float32
rope_il = RotaryEmbedding(dk, theta=base, max_seq_len=512, interleaved=True)
qh = torch.randn(B, H, T, dk, generator=g)  # (B, H, T, d_k)
kh = torch.randn(B, H, T, dk, generator=g)
positions = torch.tensor([[3, 4, 9, 10, 11, 50, 200], [17, 18, 19, 20, 21, 22, 23],
                          [511, 0, 1, 2, 100, 101, 7]])  # (B, T)
cos, sin = hf_rope(qh, positions)
q_hf, k_hf = apply_rotary_pos_emb(qh, kh, cos, sin)

# %% [markdown]
# The independent implementation of the interleaved layout multiplies complex pairs by
# $e^{i m \theta_j}$ (`torch.polar`), in float64:

# %%
def rope_complex(x, positions, base):
    """Interleaved RoPE via complex numbers: x (B, H, T, d) float64, positions (B, T)."""
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions[:, None, :, None].double() * freqs  # (B, 1, T, d/2)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())  # (B, H, T, d/2)
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)


rope64 = RotaryEmbedding(dk, theta=base, max_seq_len=512, interleaved=True, dtype=torch.float64)
x64 = qh.double()

# %%
perm, inv = rope_permutation(dk), torch.argsort(rope_permutation(dk))
checks = Checks("RoPE")
checks.close("inv_freq vs Llama (float32)", hf_rope.inv_freq, rope.inv_freq, tol=0)
checks.close("half-split q vs Llama apply_rotary_pos_emb", q_hf, rope(qh, positions), tol=1e-6)
checks.close("half-split k vs Llama apply_rotary_pos_emb", k_hf, rope(kh, positions), tol=1e-6)
checks.close("non-contiguous input vs Llama", q_hf, rope(qh.transpose(1, 2).contiguous().transpose(1, 2), positions), tol=1e-6)
checks.close("interleaved vs complex e^(i m theta) (float64)", rope_complex(x64, positions, base), rope64(x64, positions), tol=1e-12)
checks.close("interleaved(x[perm])[inv] = half-split(x)", rope(qh, positions), rope_il(qh[..., perm], positions)[..., inv], tol=0)
checks.close("R_m x via rope_matrix (m = 50)", rope_matrix(50, dk, base, interleaved=True) @ x64[0, 0, 0], rope64(x64[:1, :1, :1], torch.tensor([50]))[0, 0, 0], tol=1e-14)
layout_gap = (rope(qh, positions) - rope_il(qh, positions)).abs().max()
checks.true("layouts differ unpermuted (max |diff| > 0.1)", bool(layout_gap > 0.1), got=layout_gap)
checks

# %% [markdown]
# Now the property itself, numerically: shifting all positions by the same amount leaves every
# score $q_i \cdot k_j$ unchanged, in both layouts; the scores of a shifted query alone do
# change. In float64 the agreement is at round-off; in float32 it is limited by rounding the
# angles $m\theta_j$ to float32, an error that grows with the position and that Hugging Face's
# tables share (measured in the next section).

# %%
def rope_scores(module, q, k, pos):
    """All scores q_i . k_j after RoPE at positions pos: (B, H, T, T)."""
    return module(q, pos) @ module(k, pos).transpose(-1, -2)


q64, k64 = qh.double()[:, :, 1:6], kh.double()[:, :, 1:6]  # (B, H, 5, d_k)
q32, k32, pos5 = qh[:, :, 1:6], kh[:, :, 1:6], positions[:, 1:6]  # positions up to 101
rope64_half = RotaryEmbedding(dk, theta=base, max_seq_len=512, dtype=torch.float64)
checks = Checks("RoPE scores depend only on offsets")
for name, mod in [("half-split", rope64_half), ("interleaved", rope64)]:
    checks.close(f"{name} float64: shift positions by 250", rope_scores(mod, q64, k64, pos5),
                 rope_scores(mod, q64, k64, pos5 + 250), tol=1e-12)
checks.close("half-split float32: shift by 250", rope_scores(rope, q32, k32, pos5),
             rope_scores(rope, q32, k32, pos5 + 250), tol=1e-4)
moved = (rope64(q64, pos5 + 1) @ rope64(k64, pos5).transpose(-1, -2)
         - rope_scores(rope64, q64, k64, pos5)).abs().max()
checks.true("shifting only the queries changes scores", bool(moved > 0.1), got=moved)
checks

# %% [markdown]
# ### Float32 tables: the angle error grows with the position
#
# The float32 module computes its tables as Hugging Face's Llama does: the exponent
# $x_j = 2j/d_k$ in float32, the power $b^{x_j}$, its reciprocal $\hat\theta_j$, the angle
# $\widehat{m\theta_j} = \mathrm{fl}(m\,\hat\theta_j)$, then its cosine and sine. In the standard
# model of floating-point arithmetic each operation returns the exact result times $(1 + \delta)$
# with $|\delta| \le u = 2^{-24}$, the unit round-off of float32. Four things can go wrong:
#
# * the exponent is rounded: $\hat x_j = x_j(1 + \delta_0)$. When $d_k$ is a power of two
#   (64, 128) the quotient $2j/d_k$ is a short binary fraction and $\delta_0 = 0$; when it is
#   not (80, 96 for Phi-3), $|\delta_0| \le u$, and the power turns it into the factor
#   $b^{x_j\delta_0} = e^{x_j \ln b\, \delta_0}$: amplified up to $\ln b \approx 9.2$ times
#   for $b = 10^4$;
# * the power routine is not an exact operation; we allow it one unit in the last place
#   (relative error $2u$): PyTorch's vectorised `pow` comes from SLEEF's 1-ulp routines;
# * the reciprocal and the product with $m$ are rounded once each ($\delta_2, \delta_3$).
#   The position $m$ itself is exact (an integer below $2^{24}$).
#
# So the computed angle is $m\theta_j\, e^{x_j \ln b\,\delta_0}(1+\delta_1)(1+\delta_2)(1+\delta_3)$
# with $|\delta_1| \le 2u$, and the relative error is largest at the corner of the box of
# $\delta$'s where all push the same way. SymPy builds that bound and expands it to first order
# in $u$:

# %%
u_s, lnb, x_s = sp.symbols("u ln_b x_j", positive=True)
deltas = sp.symbols("delta_0:4", real=True)
rel_angle_err = sp.exp(x_s * lnb * deltas[0]) * sp.prod([1 + dl for dl in deltas[1:]]) - 1
corner = {deltas[0]: u_s, deltas[1]: 2 * u_s, deltas[2]: u_s, deltas[3]: u_s}
rel_bound = rel_angle_err.subs(corner)  # every delta at its largest, all of one sign
# the opposite corner, 1 - e^{-a}(1-2u)(1-u)^2, is smaller in magnitude for every a = x_j ln b
other = -rel_angle_err.subs({k: -v for k, v in corner.items()})
assert all(rel_bound.subs({u_s: sp.Rational(1, 2**24), x_s: 1, lnb: a}) > other.subs({u_s: sp.Rational(1, 2**24),
           x_s: 1, lnb: a}) for a in (0, 1, 5, 10, 14))
first_order_bound = sp.series(rel_bound, u_s, 0, 2).removeO()
a_s, e_s = sp.symbols("a e", real=True)
# cos(a + e) - cos(a) = -2 sin(a + e/2) sin(e/2), so |cos(a + e) - cos(a)| <= |e|; to first order -e sin(a)
assert sp.simplify(sp.cos(a_s + e_s) - sp.cos(a_s) + 2 * sp.sin(a_s + e_s / 2) * sp.sin(e_s / 2)) == 0
first_order = sp.series(sp.cos(a_s + e_s) - sp.cos(a_s), e_s, 0, 2).removeO()
display(sp.Eq(sp.Symbol(r"\rho_j"), rel_bound),
        sp.Eq(sp.Symbol(r"\rho_j"), sp.collect(sp.expand(first_order_bound), u_s) + sp.O(u_s**2)),
        sp.Eq(sp.Symbol(r"\cos(a + e) - \cos a"), first_order + sp.O(e_s**2)))

# %% [markdown]
# For a power of two the exponent term drops out and $\rho_j = (1 + 2u)(1 + u)^2 - 1 \approx 4u$
# for every pair; otherwise $\rho_j \approx (4 + x_j \ln b)\,u$, up to about $13u$ for the
# slowest pairs at $b = 10^4$. `rope_float32_angle_error_bound` evaluates the bound in float64
# (it is written before any table is measured):

# %%
show_source(rope_float32_angle_error_bound)

# %% [markdown]
# Since $|\cos(a + e) - \cos a| \le |e|$, the float32 table's error at position $m$ is at most
#
# $$ |\widehat{\cos}(m\theta_j) - \cos(m\theta_j)| \le m\,\theta_j\,\rho_j + 2u, $$
#
# the last $2u$ for rounding the cosine itself and the float32 cosine routine (allowing it one
# unit of round-off). The first term grows linearly with $m$; to first order the error is
# $-\sin(m\theta_j)\,e$, with $e$ the angle's error. Both are measured on a table of 4096
# positions against the float64 table (whose own error, about $10^{-16}$, is negligible), for
# the head widths of SmolLM2 and Qwen2-0.5B ($d_k = 64$), Phi-3 ($d_k = 96$), Llama 2 7B
# ($d_k = 128$) and a width that is neither a power of two nor a model's (80), at the bases
# $10^4$ and $5 \times 10^5$. The angle error $e$ is known *exactly*: the float32 angle converts to
# float64 without loss. So each entry's error can be predicted, not only bounded. By contrast,
# the package's sinusoidal table of section 5.2 is computed in float64 and rounded once, and its
# float32 error stays below $u$ at every position.

# %%
u32 = 2.0**-24
T_fp, d_fp = 4096, 64
checks = Checks("float32 RoPE tables against float64, m < 4096: derived bounds")
margins = {}
for d_b, b_b in itertools.product((64, 80, 96, 128), (1e4, 5e5)):
    rho_j = rope_float32_angle_error_bound(d_b, b_b)  # (d/2,) derived, float64
    r32_b = RotaryEmbedding(d_b, theta=b_b, max_seq_len=T_fp)
    r64_b = RotaryEmbedding(d_b, theta=b_b, max_seq_len=T_fp, dtype=torch.float64)
    exact_b = torch.arange(T_fp, dtype=torch.float64)[:, None] * rope_frequencies(d_b, b_b)  # (T, d/2)
    angle_b = (torch.arange(T_fp, dtype=torch.float32)[:, None] * r32_b.inv_freq).double()
    inv_bound = (1 + rho_j) / (1 + u32) - 1  # the inverse frequency has one rounding fewer
    inv_ratio = ((r32_b.inv_freq.double() / rope_frequencies(d_b, b_b) - 1).abs() / inv_bound).max().item()
    angle_ratio_b = ((angle_b - exact_b)[1:].abs() / (exact_b[1:] * rho_j)).max().item()
    table_b = exact_b * rho_j + 2 * u32
    table_ratio_b = max(((r32_b.cos.double() - r64_b.cos).abs() / table_b).max().item(),
                        ((r32_b.sin.double() - r64_b.sin).abs() / table_b).max().item())
    old_ratio = ((angle_b - exact_b)[1:].abs() / (exact_b[1:] * ((1 + u32) ** 3 - 1))).max().item()
    margins[(d_b, b_b)] = (inv_ratio, angle_ratio_b, table_ratio_b, old_ratio)
    checks.true(f"d_k={d_b}, b={b_b:g}: inv_freq, angle, table error / bound <= 1",
                max(inv_ratio, angle_ratio_b, table_ratio_b) <= 1,
                got=round(max(inv_ratio, angle_ratio_b, table_ratio_b), 2))
checks

# %% [markdown]
# Each line reports the largest ratio of a measured error to its bound, so $1/\text{ratio}$ is
# the margin. The bound a power-of-two analysis gives, $(1+u)^3 - 1 \approx 3u$ (an exact
# exponent and a correctly rounded power), is printed beside it: it holds at $d_k = 64$ and 128
# and fails at 80 and 96, where the rounded exponent, amplified by $\ln b$, dominates.

# %%
print("d_k   base    angle error / derived bound   angle error / 3u-bound")
for (d_b, b_b), (_, ang, _, old) in margins.items():
    print(f"{d_b:4d} {b_b:7.0e}   {ang:27.2f}   {old:22.2f}")

# %% [markdown]
# The tables of one head width, $d_k = 64$ at $b = 10^4$, in detail: every entry's error against
# the first-order prediction, and its growth with the position.

# %%
r32 = RotaryEmbedding(d_fp, max_seq_len=T_fp)
r64 = RotaryEmbedding(d_fp, max_seq_len=T_fp, dtype=torch.float64)
exact_angle = torch.arange(T_fp, dtype=torch.float64)[:, None] * rope_frequencies(d_fp)  # (T, d/2)
angle32 = (torch.arange(T_fp, dtype=torch.float32)[:, None] * r32.inv_freq).double()  # as the module does
e_angle = angle32 - exact_angle  # exact: a float32 number is a float64 number
err_cos, err_sin = r32.cos.double() - r64.cos, r32.sin.double() - r64.sin  # (T, d/2) each
bound = exact_angle * rope_float32_angle_error_bound(d_fp) + 2 * u32
octaves = range(4, 12)  # positions [2^k, 2^(k+1))
envelope = [max(err_cos[2**k:2 ** (k + 1)].abs().max().item(), err_sin[2**k:2 ** (k + 1)].abs().max().item())
            for k in octaves]
slope = np.polyfit([k + 1 for k in octaves], np.log2(envelope), 1)[0]
pe_err = (sinusoidal_positions(T_fp, d_fp) - sinusoidal_positions(T_fp, d_fp, dtype=torch.float64)).abs().max()

# %%
checks = Checks("float32 RoPE tables against float64, m < 4096, d_k = 64")
checks.close("cos error = -sin(m theta_j) e, to within u", -torch.sin(exact_angle) * e_angle, err_cos, tol=u32)
checks.close("sin error = cos(m theta_j) e, to within u", torch.cos(exact_angle) * e_angle, err_sin, tol=u32)
checks.close("error per octave of m: log-log slope", 1.0, slope, tol=0.1)
checks.true("sinusoidal, rounded once: max error / u <= 1", bool(pe_err <= u32),
            got=round(pe_err.item() / u32, 2))
checks

# %%
print("largest |error| per octave of positions, in units of u = 2^-24:")
for k, env in zip(octaves, envelope, strict=True):
    print(f"  {2**k:5d} <= m < {2 ** (k + 1):5d}: {float(f'{env / u32:.2g}'):g}")

# %% [markdown]
# The error grows in proportion to the position (the fitted slope is 1 on log-log axes), and
# every entry's error is the predicted $-\sin(m\theta_j)\,e$ up to less than one unit of
# round-off, so the table is as accurate as float32 angles allow and no more. At the end of
# this short table the error is already above $10^{-4}$; at $m = 10^5$ the bound reaches
# $3u \cdot 10^5\,\theta_j \approx 2 \times 10^{-2}$ for the fast pairs. Computing the angles in
# float64 and rounding only the finished table, as `sinusoidal_positions` does, removes the
# growth. The fastest pair ($\theta_0 = 1$ exactly) has no angle
# error at all. The figure shows one pair, $j = 2$ ($\theta_2 = 10^{-1/4} \approx 0.56$):

# %%
j_show = 2
fig, ax = plt.subplots(figsize=(7, 3.6))
m_axis = np.arange(1, T_fp)
ax.plot(m_axis, err_cos[1:, j_show].abs().numpy(), ".", ms=1.5, color="tab:blue", label="|float32 - float64| (measured)")
ax.plot(m_axis, bound[1:, j_show].numpy(), color="black", lw=1, label=r"bound $m\theta_j\rho_j + 2u$")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_ylim(1e-10, 1e-3)
ax.set_title(rf"Float32 RoPE cosine table: error against position (pair j = {j_show}, $d_k$ = {d_fp})")
ax.set_xlabel("position m (tokens, log scale)")
ax.set_ylabel("absolute error (log scale)")
ax.legend(fontsize="small", loc="upper left")
save_figure(fig, "05_positions_rope_float32")
plt.show()

# %% [markdown]
# ### Long-term decay
#
# For $q = k$ the score at offset $r = m - n$ is $\sum_j \lVert q_{(j)} \rVert^2 \cos(r\theta_j)$,
# with $q_{(j)}$ the $j$-th pair. For a random isotropic $q$ every pair has
# $\mathbb{E}\lVert q_{(j)}\rVert^2 = 2$, so the expected score, relative to $r = 0$, is
#
# $$ \rho(r) = \frac{\mathbb{E}[(R_m q)^\top (R_n q)]}{\mathbb{E}[q^\top q]}
#    = \frac{2}{d_k} \sum_{j=0}^{d_k/2-1} \cos(r \theta_j). $$
#
# A token's attention to an identical token therefore fades, with oscillations, as the distance
# grows: the "long-term decay" that Su et al. (2021, section 3.4.3) bound with an Abel
# summation (exercise 4). First the formula against 4000 random vectors with $d_k = 128$:

# %%
d_big, n_vec = 128, 4000
rope_big = RotaryEmbedding(d_big, max_seq_len=4096, dtype=torch.float64)
qv = torch.randn(1, 1, n_vec, d_big, generator=g, dtype=torch.float64)  # n_vec vectors as "T"
checks = Checks("expected self-score under RoPE, d_k = 128")
for r_ in (0, 3, 30, 300, 3000):
    ratio = (rope_big(qv, torch.full((n_vec,), r_)) * qv).sum(-1) / d_big  # (1, 1, n_vec)
    rho = torch.cos(r_ * rope_frequencies(d_big)).mean()
    sem = ratio.std() / math.sqrt(n_vec)
    checks.close(f"rho({r_}) within 4 standard errors", rho, ratio.mean(), tol=4 * sem.item())
checks

# %% [markdown]
# The curve for the paper's base $b = 10^4$ and for Llama 3's $b = 5 \times 10^5$: a larger
# base slows every pair's rotation, so the decay sets in at longer distances, one reason
# long-context models raise it.

# %%
dist = torch.arange(0, 8193, dtype=torch.float64)
fig, ax = plt.subplots(figsize=(7, 3.6))
for b_ in (1e4, 5e5):
    rho = torch.cos(dist[:, None] * rope_frequencies(d_big, b_)).mean(dim=1)  # (distances,)
    ax.plot(dist[1:], rho[1:], lw=1, label=f"base b = {b_:g}")
ax.set_xscale("log")
ax.axhline(0, color="grey", lw=0.5)
ax.set_title(f"RoPE: expected score of a vector with itself at distance r (d_k = {d_big})")
ax.set_xlabel("distance r = m - n (tokens, log scale)")
ax.set_ylabel(r"$\rho(r)$, relative to r = 0")
ax.legend()
save_figure(fig, "05_positions_rope_decay")
plt.show()

# %% [markdown]
# ## 5.5 ALiBi: a linear bias instead of a position vector
#
# Press, Smith & Lewis (2022) add nothing to the embeddings, queries or keys. Instead, head $h$
# subtracts from each causal score a penalty proportional to the distance:
#
# $$ \mathrm{score}_{h,ij} = \frac{q_i \cdot k_j}{\sqrt{d_k}} - m_h\,(i - j), \qquad j \le i. $$
#
# The slopes $m_h$ are fixed, not learned: for $H$ heads (a power of two) the geometric sequence
# $m_h = 2^{-8h/H}$, $h = 1, \dots, H$, which is $\tfrac12, \tfrac14, \dots, \tfrac1{256}$ for
# $H = 8$. For other $H$, the paper's code takes the slopes for the nearest smaller power of two
# $n$, then fills the remaining $H - n$ heads with every other slope of the $2n$-head sequence.
# Steep heads look only at the last few tokens; shallow ones see far back.

# %%
show_source(alibi_slopes)

# %%
show_source(alibi_bias)

# %% [markdown]
# The bias is linear in $j$ over the whole row, so the entries above the diagonal are positive
# and must be removed by the causal mask. BLOOM (BigScience, 2022, "BLOOM: A 176B-Parameter
# Open-Access Multilingual Language Model"), which uses ALiBi, adds $m_h\, j$ instead of
# $-m_h (i - j)$: the two differ by $m_h\, i$, a constant along each row, and softmax ignores
# constants added to a row (chapter 3). So the attention probabilities agree:

# %%
H12, T12 = 12, 9
scores = torch.randn(H12, T12, T12, generator=g, dtype=torch.float64)
causal = torch.ones(T12, T12, dtype=torch.bool).tril()
bloom = build_alibi_tensor(torch.ones(1, T12, dtype=torch.long), H12, torch.float64)  # (H, 1, T)
ours = alibi_bias(H12, T12, dtype=torch.float64)  # (H, T, T)
p_ours = F.softmax((scores + ours).masked_fill(~causal, float("-inf")), dim=-1)
p_bloom = F.softmax((scores + bloom).masked_fill(~causal, float("-inf")), dim=-1)
expected_12 = [2.0**-h for h in range(1, 9)] + [2.0 ** (-h / 2) for h in (1, 3, 5, 7)]

# %%
checks = Checks("ALiBi")
checks.equal("slopes, 8 heads = 1/2, ..., 1/256", [2.0**-h for h in range(1, 9)],
             alibi_slopes(8, dtype=torch.float64).tolist())
checks.close("12 heads: 8-head rule + odd 16-head slopes", expected_12, alibi_slopes(12, torch.float64), tol=1e-16)
checks.close("slopes, 12 heads vs BLOOM (float32)", bloom[:, 0, 1], alibi_slopes(12, torch.float64), tol=1e-7)
checks.close("softmax with our bias = with BLOOM's bias", p_bloom, p_ours, tol=1e-6)
bias_gap = (ours - bloom).abs().max()
checks.true("biases differ (by m_h i): max > 1", bool(bias_gap > 1), got=bias_gap)
checks.close("bias(H, 4, 9) = last 4 rows of bias(H, 9, 9)", alibi_bias(H12, 9)[:, 5:], alibi_bias(H12, 4, 9), tol=0)
checks.true("bias <= 0 on and below the diagonal (max)", bool((ours[:, causal] <= 0).all()), got=ours[:, causal].max())
checks

# %% [markdown]
# The biases of 8 heads over 16 positions, the future masked out. On the left the steepest head
# ($m_1 = 1/2$) as a matrix; on the right the penalty against distance for every head, straight
# lines whose slopes halve from head to head.

# %%
H8, T16 = 8, 16
bias8 = alibi_bias(H8, T16).masked_fill(~torch.ones(T16, T16, dtype=torch.bool).tril(), float("nan"))
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
im = ax0.imshow(bias8[0].numpy(), cmap="viridis", interpolation="nearest")
ax0.set_title("ALiBi bias, head 1 of 8 (slope 1/2)")
ax0.set_xlabel("key position j")
ax0.set_ylabel("query position i")
fig.colorbar(im, ax=ax0, label="bias (added to the score)")
for h_ in range(H8):
    ax1.plot(range(T16), bias8[h_, -1].flip(0).numpy(), marker=".", label=f"head {h_ + 1}")
ax1.set_title("ALiBi penalty against distance (8 heads)")
ax1.set_xticks(range(0, T16, 3))
ax1.set_xlabel("distance i - j (tokens)")
ax1.set_ylabel("bias -m_h (i - j)")
ax1.legend(fontsize="x-small", ncol=2)
save_figure(fig, "05_positions_alibi")
plt.show()

# %% [markdown]
# ## 5.6 Stretching RoPE beyond the trained length
#
# A model trained on contexts of $L_0$ tokens has seen every pair's angle $m\theta_j$ only for
# $m < L_0$. Beyond that the slow pairs, whose wavelength $\lambda_j = 2\pi/\theta_j$ exceeds
# $L_0$, reach angles never trained on, and quality collapses. The methods used today change
# the frequencies, so that a context $s$ times longer ($s$ the *factor*) maps back into angles
# the model knows:
#
# * **position interpolation** (Chen et al., 2023): $\theta_j' = \theta_j / s$, every pair
#   slowed, so position $sL_0$ gets the angle $L_0$ had; it also squeezes the fast pairs, which
#   carry the local word order;
# * **NTK-aware scaling** (proposed in an online post in 2023, analysed by Peng et al., 2023): raise the base,
#   $b' = b\,s^{d/(d-2)}$, which keeps the fastest pair and slows the slowest by exactly $s$;
#   the **dynamic** form grows $s$ with the current length $L$, $s(L) = \text{factor} \cdot
#   L/L_0 - (\text{factor} - 1)$, and leaves short inputs untouched;
# * **YaRN** (Peng et al., 2023): count each pair's rotations over the trained context,
#   $r_j = L_0/\lambda_j$; pairs with $r_j > \beta_{\text{fast}} = 32$ are kept, pairs with
#   $r_j < \beta_{\text{slow}} = 1$ are interpolated by $s$, a linear ramp in between; and the
#   logits are sharpened by multiplying $\cos$ and $\sin$ by $0.1 \ln s + 1$;
# * **Llama 3.1** (Dubey et al., 2024): the same idea with wavelength bands,
#   $\lambda_j < L_0/4$ kept, $\lambda_j > L_0$ divided by $s = 8$, a smooth blend between.
#
# The NTK exponent, derived: require the slowest pair $j = d/2 - 1$, whose frequency is
# $b^{-(d-2)/d}$, to be slowed by exactly $s$:

# %%
b_s, b_new, s_f, d_s = sp.symbols("b b' s d", positive=True)
(ntk_base,) = sp.solve(sp.Eq(b_new ** (-(d_s - 2) / d_s), b_s ** (-(d_s - 2) / d_s) / s_f), b_new)
assert sp.simplify(ntk_base - b_s * s_f ** (d_s / (d_s - 2))) == 0
fastest = sp.simplify(ntk_base**0)  # pair j = 0 has frequency b'^0 = 1 for every base
display(sp.Eq(b_new, ntk_base), sp.Eq(sp.Symbol(r"\theta'_0"), fastest))

# %% [markdown]
# The package computes all of them from the dict a Hugging Face config carries
# (`rope_scaling` in transformers 4, `rope_parameters` in 5), so a checkpoint's own settings
# can be passed unchanged; `RotaryEmbedding(..., scaling=...)` builds its tables from it. A
# `partial_rotary_factor` below 1 rotates only the first components of each head (partial
# RoPE, as in GPT-NeoX and Phi-2); a layer without RoPE at all (a "NoPE" layer) simply has
# no rotary module.

# %%
show_source(rope_inverse_frequencies)

# %% [markdown]
# The peer is `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`, each entry called with a
# small `LlamaConfig` (no download). Every inverse frequency must be bit for bit equal in
# float32, and so must the attention factor, for head widths 64 and 96 (Phi-3), two bases,
# and the settings of real checkpoints: Llama 3.1's, a YaRN with DeepSeek-style `mscale`, a
# dynamic one at several lengths, and a partial rotation. Then the tables of a YaRN
# `RotaryEmbedding` against Hugging Face's `LlamaRotaryEmbedding` applied to queries:

# %%
scalings = {
    "linear (PI), s = 4": dict(rope_type="linear", factor=4.0),
    "dynamic NTK, s = 4": dict(rope_type="dynamic", factor=4.0),
    "YaRN, s = 4": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=2048),
    "YaRN, mscale": dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=2048,
                         mscale=1.0, mscale_all_dim=0.5, beta_fast=16, beta_slow=2),
    "Llama 3.1": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=2048),
    "linear, partial 1/2": dict(rope_type="linear", factor=2.0, partial_rotary_factor=0.5),
}
checks = Checks("RoPE scaling vs transformers ROPE_INIT_FUNCTIONS (float32, bit for bit)")
for (label, sc), d_r, b_r in itertools.product(scalings.items(), (64, 96), (1e4, 5e5)):
    params = dict(sc, rope_theta=b_r)
    cfg_r = transformers.LlamaConfig(hidden_size=2 * d_r, num_attention_heads=2, head_dim=d_r,
                                     max_position_embeddings=8192, rope_parameters=dict(params))
    agree = True
    for seq_len in ((None, 9000, 30000) if sc["rope_type"] == "dynamic" else (None,)):
        inv_hf, af_hf = ROPE_INIT_FUNCTIONS[sc["rope_type"]](cfg_r, "cpu", seq_len=seq_len)
        inv_ours, af_ours = rope_inverse_frequencies(d_r, scaling=params, max_position_embeddings=8192,
                                                     seq_len=seq_len)
        agree &= inv_hf.shape == inv_ours.shape and torch.equal(inv_hf, inv_ours) and af_hf == af_ours
    checks.true(f"{label}, d_k={d_r}, b={b_r:g}: inv_freq and attention factor", agree,
                got=f"factor {af_ours:.4f}")
yarn = dict(scalings["YaRN, s = 4"], rope_theta=1e4)
hf_yarn = LlamaRotaryEmbedding(transformers.LlamaConfig(
    hidden_size=2 * 96, num_attention_heads=2, head_dim=96, max_position_embeddings=8192, rope_parameters=dict(yarn)))
ours_yarn = RotaryEmbedding(96, 1e4, max_seq_len=8192, scaling=yarn)
q_y = torch.randn(1, 2, 6, 96, generator=g)
pos_y = torch.tensor([0, 1, 2047, 2048, 5000, 8191])
cos_y, sin_y = hf_yarn(q_y, pos_y[None])
checks.close("YaRN RotaryEmbedding vs LlamaRotaryEmbedding + apply_rotary_pos_emb", apply_rotary_pos_emb(
    q_y, q_y, cos_y, sin_y)[0], ours_yarn(q_y, pos_y), tol=2e-6)
checks

# %% [markdown]
# What each method does to the pairs, for Llama 3.1's own setting ($d_k = 128$, $b = 5 \times
# 10^5$, $L_0 = 8192$, $s = 8$): the wavelength of each pair before and after. Pairs below the
# lower dotted line turn more than 32 times within $L_0$; pairs above the upper one less
# than once.

# %%
L0, d_l3 = 8192, 128
base_inv, _ = rope_inverse_frequencies(d_l3, 5e5, dtype=torch.float64)
shown = {"linear (PI)": dict(rope_type="linear", factor=8.0),
         "dynamic NTK at 8 L0": dict(rope_type="dynamic", factor=8.0),
         "YaRN": dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=L0),
         "Llama 3.1": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=L0)}
fig, ax = plt.subplots(figsize=(7.5, 4))
pairs = np.arange(d_l3 // 2)
ax.plot(pairs, (2 * math.pi / base_inv).numpy(), "k-", lw=2, label="no scaling")
stretch = {}
for (label, sc), style in zip(shown.items(), ("--", "-.", ":", "-"), strict=True):
    inv_s, af_s = rope_inverse_frequencies(d_l3, 5e5, sc, max_position_embeddings=L0, seq_len=8 * L0,
                                           dtype=torch.float64)
    stretch[label] = (base_inv / inv_s).numpy()  # wavelength after / before, per pair
    ax.plot(pairs, (2 * math.pi / inv_s).numpy(), style, lw=1.3, label=f"{label} (attention factor {af_s:.3f})")
for n_rot in (32, 1):
    ax.axhline(L0 / n_rot, color="grey", lw=0.7, ls=":")
ax.set_yscale("log")
ax.set_xlabel("pair j (0 = fastest)")
ax.set_ylabel(r"wavelength $2\pi/\theta_j$ (tokens, log scale)")
ax.set_title(r"RoPE scaling with factor 8, Llama 3.1's $d_k$ = 128, $b = 5 \times 10^5$, $L_0$ = 8192")
ax.legend(fontsize="x-small")
save_figure(fig, "05_positions_rope_scaling")
plt.show()
for label, st in stretch.items():
    print(f"{label:20s} wavelength stretch: fastest pair x{st[0]:.3f}, slowest x{st[-1]:.3f}")

# %% [markdown]
# Position interpolation stretches every wavelength eight times, the fast pairs too. NTK
# (here at $L = 8L_0$, where its $s(L) = 57$) leaves the fastest pair alone and stretches the
# slowest by $s(L)$, not 8: the dynamic form keeps growing with the input. YaRN and Llama 3.1
# leave every pair that turns many times within $L_0$ untouched and stretch by exactly 8 only
# the pairs whose wavelength already exceeded the trained context; they differ in where the
# blend sits (YaRN counts rotations, Llama 3.1 compares wavelengths with $L_0/4$ and $L_0$).
# Only YaRN also changes the size of the scores, by its attention factor $0.1\ln 8 + 1$.

# %% [markdown]
# ## 5.7 The schemes side by side
#
# | scheme | what is added | where | parameters | relative? | beyond the training length | used by |
# |---|---|---|---|---|---|---|
# | sinusoidal | $\mathrm{PE}_p$, fixed | to the token embeddings, once | 0 | through a linear map $M_k$ | defined, but extrapolates poorly | original transformer |
# | learned | row $p$ of a trained $T_{\max} \times d$ table | to the token embeddings, once | $T_{\max} d$ | no | undefined | GPT-2, BERT |
# | RoPE | rotation $R_m$ | to $q$ and $k$, in every layer | 0 | exactly: score depends on $m - n$ | defined; degrades without rescaling the positions or the base | GPT-J, Llama, Qwen2 |
# | ALiBi | bias $-m_h (i - j)$ | to the attention scores, in every layer | 0 | exactly | extrapolates well in the paper's tests | BLOOM, MPT |
#
# The extrapolation column summarises Press et al. (2022), who trained models on short
# sequences and evaluated them on longer ones: the sinusoidal model's perplexity grows within
# a few dozen extra tokens, rotary does somewhat better, ALiBi stays flat. Rotary models are
# stretched to longer contexts by rescaling positions (Chen et al., 2023, "Extending Context
# Window of Large Language Models via Positional Interpolation") or frequencies (Peng et al.,
# 2023, "YaRN: Efficient Context Window Extension of Large Language Models").
#
# ## Summary
#
# * Attention without positions is permutation equivariant: $\operatorname{Attn}(PX) = P\operatorname{Attn}(X)$.
# * Sinusoidal: $\mathrm{PE}_{p+k} = M_k \mathrm{PE}_p$ with $M_k$ a block rotation independent of $p$.
# * Learned: a $T_{\max} \times d$ table, exact equality with GPT-2's `wpe`; no positions beyond $T_{\max}$.
# * RoPE: $(R_m q)^\top (R_n k) = q^\top R_{n-m} k$, proven in SymPy; two layouts related by
#   $R^{\text{interleaved}} = P R^{\text{half}} P^\top$; equal to Hugging Face's Llama in float32.
# * Float32 RoPE tables round the angle $m\theta_j$ four times, and the rounded exponent
#   $2j/d_k$ is amplified by $\ln b$ unless $d_k$ is a power of two: the error is at most
#   $m\theta_j\rho_j + 2u$ with $\rho_j \approx (4 + (2j/d_k)\ln b)\,u$ ($4u$ for $d_k = 64$, 128),
#   $u = 2^{-24}$, checked at $d_k = 64, 80, 96, 128$; it grows linearly with the position and is
#   $-\sin(m\theta_j)$ times the angle's error entry by entry (measured to within $u$).
# * Context extension rescales RoPE's frequencies: position interpolation slows every pair,
#   NTK-aware scaling raises the base to $b s^{d/(d-2)}$, YaRN and Llama 3.1 slow only the
#   pairs whose wavelength exceeds the trained context (YaRN also scales the logits); all
#   equal to `transformers`' `ROPE_INIT_FUNCTIONS` bit for bit.
# * ALiBi: slopes $2^{-8h/H}$; BLOOM's bias differs by a row constant that softmax ignores.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/05_positions.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 05` writes a stub
# of every function, `llmbook grade 05` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_05.py` runs
# the same checks on the reference.
#
# 1. (★) **Sinusoidal dot products.** Show that $\mathrm{PE}_m \cdot \mathrm{PE}_n =
#    \sum_i \cos\big((m - n)\,\omega_i\big)$, so this dot product depends only on the offset.
#    Write `sinusoidal_dot(offset, d_model, base)` and check it against the table for all pairs
#    of $T = 50$ positions.
# 2. (★★) **The shift matrix from data.** Recover $M_k$ from the table alone by least squares,
#    solving $\mathrm{PE}_{0:T-k}\, M_k^\top = \mathrm{PE}_{k:T}$ (`shift_matrix_lstsq`), and
#    compare with `sinusoidal_shift_matrix`. With base 100, $d = 8$, $T = 64$ it is exact to
#    round-off; with base 10000, $d = 16$, $T = 256$ it is not. Explain with the condition number
#    of $\mathrm{PE}_{0:T-k}$.
# 3. (★★) **Converting a checkpoint.** Write `interleaved_to_half_split(W, n_heads)`, which
#    reorders the rows of a query or key projection $W$ of shape $(H d_k, d)$ within each head so
#    that half-split RoPE on $xW'^\top$ gives the same attention scores as interleaved RoPE on
#    $xW^\top$. Which permutation of a head's rows is it, $\pi$ or $\pi^{-1}$?
# 4. (★★★) **RoFormer's decay bound.** With $h_j = \tilde q_j \overline{\tilde k_j}$ and
#    $S_j = \sum_{l < j} e^{i r \theta_l}$, Abel summation gives
#    $\big|\sum_j h_j e^{i r\theta_j}\big| \le \max_j |h_{j+1} - h_j| \sum_{j=1}^{d_k/2} |S_j|$
#    (with $h_{d_k/2} = 0$). Write `roformer_decay_bound(distances, d_head, base)` returning
#    $\frac{2}{d_k}\sum_{j=1}^{d_k/2} |S_j|$, plot it up to distance 1000 for $d_k = 128$, and
#    check the inequality on random $q$, $k$.
# 5. (★★) **Which pairs does YaRN touch?** Write `pair_rotations(d_head, base, context)`
#    returning the number of turns $r_j = L\theta_j/(2\pi)$ each pair makes over $L$ tokens. For
#    Llama 3.1's $d_k = 128$, $b = 5 \times 10^5$ and YaRN with factor 8 over $L_0 = 8192$, check
#    with `rope_inverse_frequencies` that every pair with $r_j > 32$ keeps its frequency and
#    every pair with $r_j < 1$ is slowed by exactly 8. How many pairs lie in between, and why
#    is it about $\ln 32 / \ln b^{2/d_k}$?

# %%
from llmbook.workbench import grade

grade("05", globals())
