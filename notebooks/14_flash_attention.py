# %% [markdown]
# # 14 FlashAttention
#
# Chapter 4 computed attention the way the formula reads: form the $T \times T$ scores
# $S = QK^\top/\sqrt{d_k}$, take the softmax $P$ row by row, multiply by $V$. On a GPU that
# is slow, and the reason is not arithmetic. A GPU does its sums in a small, fast on-chip
# memory (SRAM: a few hundred KB per streaming multiprocessor) and keeps its tensors in a
# large, slower one (HBM: tens of GB, about ten times less bandwidth than the cores can
# consume). The $T^2$ matrices $S$ and $P$ do not fit on chip, so they travel to HBM and
# back, and for long sequences that traffic, not the FLOPs, sets the run time.
#
# FlashAttention (Dao et al., 2022, "FlashAttention: Fast and Memory-Efficient Exact
# Attention with IO-Awareness"; Dao, 2023, "FlashAttention-2") computes the *same* output
# without ever writing $S$ or $P$: it walks over tiles of keys and keeps, for each query, a
# running softmax state. This chapter builds it up:
#
# 1. the IO count: $\Theta(Td + T^2)$ HBM accesses against $\Theta(T^2 d^2 / M)$;
# 2. the online softmax and its merge rule, proved exact (and associative) in SymPy;
# 3. exact tiled attention in PyTorch, with its peak memory measured: $O(T)$ against $O(T^2)$;
# 4. the backward pass that recomputes $P$ from a saved log-sum-exp, derived in SymPy and
#    implemented as FlashAttention-2's Algorithm 2;
# 5. the forward and backward as Triton kernels, run here on the CPU by the Triton
#    interpreter and checked against naive attention to $10^{-5}$; timed on a GPU by
#    `benchmarks/flash.py` against PyTorch's own fused attention;
# 6. masks as functions (causal, sliding window, packed documents) with the tiles they hide
#    skipped, checked against PyTorch's `flex_attention`, and split-KV decoding.

# %%
import os

os.environ["TRITON_INTERPRET"] = "1"  # run the Triton kernels on the CPU; set before triton loads

import json
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display

from llmbook.inference import flash_triton
from llmbook.inference.attention_variants import sliding_window_mask
from llmbook.inference.flash import (
    FlashAttentionReferenceFunction,
    attention_arithmetic_intensity,
    attention_hbm_accesses,
    causal_mask_mod,
    document_mask_mod,
    flash_attention_backward_reference,
    flash_attention_masked,
    flash_attention_reference,
    flash_attention_tiled,
    flash_attention_triton,
    merge_softmax_states,
    online_softmax,
    peak_memory_bytes,
    sliding_window_mask_mod,
    softmax_state,
    split_kv_attention,
)
from llmbook.nbtools import Checks, Formula, save_figure, seed_everything, show_source
from llmbook.transformer.attention import causal_mask, scaled_dot_product_attention

g = seed_everything(0)
torch.set_num_threads(1)  # small tensors; one thread keeps the memory events in one order

# %% [markdown]
# ## 14.1 Why memory, not FLOPs
#
# Count what moves between HBM and the chip for one head, $T$ queries and keys of width
# $d$, with an SRAM of $M$ elements ($d \le M \le Td$). The standard algorithm (Dao et al.,
# 2022, Algorithm 0) runs in three passes: read $Q, K$, write $S$; read $S$, write $P$;
# read $P, V$, write $O$. That is $4Td + 4T^2$ elements.
#
# The tiled algorithm holds one block of rows on chip while blocks of the other side stream
# past. Dao et al. (2022, Algorithm 1) hold a block of $B_c = \lceil M / 4d \rceil$ keys and
# values and stream blocks of $B_r = \min(\lceil M / 4d \rceil, d)$ queries; this chapter
# uses FlashAttention-2's loop order (queries outside, section 14.3), so the roles swap: a
# block of $\lceil M/4d \rceil$ queries is held and blocks of $\min(\lceil M/4d \rceil, d)$
# keys stream. On chip at once are $Q_i$ and $O_i$, $K_j$ and $V_j$, and the score tile
# $S_{ij}$. The tiled pass reads $Q$ and writes $O$ once ($2Td$), writes one log-sum-exp per
# row ($T$), and streams all of $K$ and $V$ once per query block: $2Td \lceil T / B_r
# \rceil$, with $B_r$ now the held query block. **Theorem 2** of Dao et al.
# (2022): standard attention needs $\Theta(Td + T^2)$ HBM accesses, FlashAttention
# $\Theta(T^2 d^2 M^{-1})$; and (their Proposition 3) no exact algorithm does
# asymptotically better for every $M$ in that range. Up to constant factors, the $T^2$
# term is multiplied by $d^2/M$, which is about 0.04 for $d = 64$ and $M$ around $10^5$.

# %%
show_source(attention_hbm_accesses)

# %% [markdown]
# **What fits on chip.** With a held block of $b_1$ rows and a streamed block of $b_2$ rows,
# the chip holds $2 b_1 d$ (a block of $Q$ and of $O$), $2 b_2 d$ (a block of $K$ and of $V$)
# and the $b_1 b_2$ scores. The expression is symmetric in $b_1$ and $b_2$, so Dao et al.'s
# sizes fit equally in either loop order. SymPy evaluates it for those sizes (the ceiling
# dropped, $4d \mid M$) in the two cases of the minimum, $b_2 = d$ when $M \ge 4d^2$ and
# $b_2 = M/4d$ when $M < 4d^2$; the second is also the choice that budgets only the four
# blocks of $Q, O, K, V$ ($4 b d \le M$) and forgets the score tile:

# %%
M_s, d_s = sp.symbols("M d", positive=True)
b1, b2 = sp.symbols("b_1 b_2", positive=True)
on_chip = 2 * b1 * d_s + 2 * b2 * d_s + b1 * b2  # Q_i, O_i | K_j, V_j | S_ij
used = {"b2 = d": sp.expand(on_chip.subs({b1: M_s / (4 * d_s), b2: d_s})),  # Dao, M >= 4 d^2
        "b2 = M/4d": sp.expand(on_chip.subs({b1: M_s / (4 * d_s), b2: M_s / (4 * d_s)}))}
for name, expr in used.items():
    display(Formula(r"b_1 = M/4d,\ " + name.replace("b2", "b_2") + r":\quad " + sp.latex(expr)))
fits_from = sp.solve(sp.Eq(used["b2 = d"], M_s), M_s)[0]
display(Formula(r"3M/4 + 2d^2 \le M \iff M \ge " + sp.latex(fits_from)))

# %% [markdown]
# With $b_2 = d$ the total is $3M/4 + 2d^2$, within $M$ as soon as $M \ge 8d^2$ (32,768
# elements for $d = 64$); when $M < 4d^2$ both blocks are $M/4d$ rows and the total is
# $M + M^2/16d^2 \le 5M/4$: the sizes fit up to a constant, which is all Theorem 2 needs.
# Used at $M \ge 4d^2$, the four-block budget fills the SRAM before the score tile, which
# alone holds $(M/4d)^2$ numbers, more than the SRAM itself in the A100 case below.
#
# A concrete case: $T = 4096$, $d = 64$ and $M = 98\,304$ elements, the 192 KB of SRAM of
# an A100 streaming multiprocessor (Dao et al., 2022, section 2.1) in 16-bit numbers.
# `attention_hbm_accesses` returns the block sizes and the elements they occupy, which must
# agree with the SymPy expression and stay within $M$:

# %%
T_ex, d_ex, M_ex = 4096, 64, 98304
counts = attention_hbm_accesses(T_ex, d_ex, M_ex)
B_r, B_c = counts["block_q"], counts["block_k"]
print(f"held query block {B_r} rows, streamed key block {B_c} rows, on chip "
      f"{counts['sram_used']:,} of {M_ex:,} elements; standard {counts['standard']:,} "
      f"elements, tiled {counts['flash']:,}; ratio {counts['standard'] / counts['flash']:.2f}")
at_ex = {M_s: M_ex, d_s: d_ex}
checks = Checks("what fits in SRAM: SymPy vs attention_hbm_accesses")
checks.equal("on chip: 3M/4 + 2d^2 (SymPy) vs the function's count",
             int(used["b2 = d"].subs(at_ex)), counts["sram_used"])
checks.true("fits: sram_used <= M", counts["sram_used"] <= M_ex, got=counts["sram_used"])
checks.true("M >= 8 d^2 (SymPy's condition)", M_ex >= fits_from.subs(d_s, d_ex),
            got=f"{M_ex} >= {fits_from.subs(d_s, d_ex)}")
checks.true("four blocks of M/4d rows: the score tile alone exceeds M",
            (M_ex // (4 * d_ex)) ** 2 > M_ex, got=(M_ex // (4 * d_ex)) ** 2)
checks

# %% [markdown]
# Both algorithms do the same $4T^2 d$ FLOPs (two matrix products). Put them beside the
# traffic on an A100 (Dao et al., 2022, section 2.1: HBM at 1.5 to 2 TB/s; NVIDIA's
# datasheet: 312 TFLOP/s of 16-bit tensor-core arithmetic), with 2 bytes per element:

# %%
hbm_bytes_per_s, flop_per_s = 1.5e12, 312e12
t_flops = 4 * T_ex**2 * d_ex / flop_per_s
for name in ("standard", "flash"):
    t_mem = 2 * counts[name] / hbm_bytes_per_s
    print(f"{name:8s}: memory traffic {t_mem * 1e6:5.1f} us, arithmetic {t_flops * 1e6:5.1f} us "
          f"-> bound by {'memory' if t_mem > t_flops else 'arithmetic'}")

# %% [markdown]
# The standard algorithm spends most of its time waiting for HBM; the tiled one, with the
# query block of 384 rows, moves less data than its arithmetic takes to consume, so it is
# limited by the tensor cores instead (the roofline below shows how that depends on the
# block).
#
# ### The roofline
#
# The same argument in one number per kernel. A kernel that does $F$ FLOPs and moves $B$
# bytes takes at least $\max(F/\pi, B/\beta)$ on a GPU with peak arithmetic $\pi$ FLOP/s
# and memory bandwidth $\beta$ bytes/s (the *roofline* of Williams, Waterman & Patterson,
# 2009, "Roofline: An Insightful Visual Performance Model for Multicore Architectures").
# Which term wins depends only on the **arithmetic intensity** $I = F/B$ against the
# GPU's **balance point** $\pi/\beta$: below it the kernel is memory-bound, above it
# compute-bound. With $F = 4T^2d$ and 2 bytes per element, the counts of 14.1 give
#
# $$ I_{\text{standard}} = \frac{4T^2 d}{2(4Td + 4T^2)} \xrightarrow{T \gg d} \frac{d}{2}, \qquad
#    I_{\text{tiled}} \approx \frac{4T^2 d}{2 \cdot 2Td \cdot T/B_r} = B_r = \frac{M}{4d} , $$
#
# which SymPy confirms from the counts (the ceiling dropped, $T$ a multiple of $B_r$).
# The standard intensity is fixed by the head width, however large the GPU; the tiled one
# grows with the SRAM. The balance points, from the vendors' datasheets for dense 16-bit
# tensor-core arithmetic: A100 SXM 312 TFLOP/s over 1.5 to 2.0 TB/s (NVIDIA A100 datasheet,
# 2020), about 160 to 210 FLOP/B; H100 SXM 989 TFLOP/s over 3.35 TB/s (NVIDIA H100
# datasheet, 2022), about 295 FLOP/B. Its SM has up to 228 KB of shared memory, $M = 116\,736$
# 16-bit elements.

# %%
T_s, d_s, M_s, Br_s = sp.symbols("T d M B_r", positive=True)
intensity_std = 4 * T_s**2 * d_s / (2 * (4 * T_s * d_s + 4 * T_s**2))
intensity_tiled = 4 * T_s**2 * d_s / (2 * (2 * T_s * d_s + T_s + 2 * T_s * d_s * T_s / Br_s))
limits = {"standard, T -> oo": sp.limit(intensity_std, T_s, sp.oo),
          "tiled, T -> oo": sp.limit(intensity_tiled, T_s, sp.oo)}
display(Formula(r"I_{\mathrm{standard}} \to " + sp.latex(limits["standard, T -> oo"])
             + r",\qquad I_{\mathrm{tiled}} \to " + sp.latex(limits["tiled, T -> oo"])))

gpus = {"A100 (1.5 TB/s)": (312e12, 1.5e12, 98304), "H100 SXM": (989e12, 3.35e12, 116736)}
print(f"{'GPU':16s} {'balance':>8s} {'standard':>9s} {'tiled, B_r = M/4d':>18s} "
      f"{'B_r = 128':>10s} {'B_r = 64':>9s}   (FLOP/B)")
roofline = {}
for name, (peak, bw, sram) in gpus.items():
    ai = {b: attention_arithmetic_intensity(T_ex, d_ex, sram, block_q=b) for b in (None, 128, 64)}
    roofline[name] = (peak / bw, ai)
    print(f"{name:16s} {peak / bw:8.0f} {ai[None]['standard']:9.1f} "
          f"{ai[None]['flash']:11.1f} ({ai[None]['block_q']:3d}) {ai[128]['flash']:10.1f} "
          f"{ai[64]['flash']:9.1f}")

# %% [markdown]
# At $T = 4096$, $d = 64$ the standard algorithm does about 32 FLOPs per byte, a tenth of
# either balance point: it is memory-bound, and a faster GPU does not help it. The tiled
# one does about $B_r$ FLOPs per byte, so where it stands depends on the query block. With
# the largest block the SRAM holds, $\lceil M/4d \rceil$ rows, it is above the balance
# point of both GPUs. Real kernels use smaller query blocks (64 or 128 rows in
# FlashAttention-2, so that several blocks share an SM), and with those the same count puts
# the tiled pass *below* both balance points, memory-bound by this model. The model ignores
# the L2 cache, which serves many of the repeated loads of $K$ and $V$ (one head's $K$ and
# $V$ at $T = 4096$ are 1 MiB in 16 bits, against 40 MB of L2 on an A100): the count is an
# upper bound on the HBM traffic, the intensity a lower bound, and the measured speed of
# FlashAttention-2 (section 14.7) is what says how far below the roof it really runs.
#
# The count itself can be measured here. `flash_attention_reference` takes an `io` dict
# and adds up, inside its loop, the elements of every tile it loads (each $Q_i$ once, each
# $K_j, V_j$ once per query block) and stores ($O_i$ and $L_i$). With query blocks of
# $B_r$ rows this is the formula of Theorem 2's proof, element for element. With a causal
# mask the tiles right of the diagonal are skipped, which leaves a little over half: the
# diagonal tiles are loaded whole.

# %%
q_io = torch.randn(1, 1, T_ex, d_ex, generator=g)  # one head; the values do not matter
io_counts = {}
for causal in (False, True):
    io_counts[causal] = {}
    flash_attention_reference(q_io, q_io, q_io, is_causal=causal, block_q=B_r, block_k=B_c,
                              io=io_counts[causal])
checks = Checks("roofline and counted IO")
for name, sym in limits.items():
    formula = {"standard, T -> oo": d_s / 2, "tiled, T -> oo": Br_s}[name]
    checks.true(f"SymPy limit of I {name} = {formula}", sp.simplify(sym - formula) == 0, got=sym)
checks.equal("counted reads + writes of the tiled pass = formula",
             counts["flash"], sum(io_counts[False].values()))
checks.equal("counted writes = T (d + 1)", T_ex * (d_ex + 1), io_counts[False]["written"])
causal_walk = sum(2 * min(B_r, T_ex - i0) * d_ex + min(B_r, T_ex - i0)  # Q_i in, O_i, L_i out
                  + 2 * d_ex * min(-(-min(i0 + B_r, T_ex) // B_c) * B_c, T_ex)  # K_j, V_j, j < i1
                  for i0 in range(0, T_ex, B_r))
checks.equal("causal: counted = walk over the visited tiles", causal_walk, sum(io_counts[True].values()))
checks.true("causal traffic between 1/2 and 2/3 of non-causal", 0.5 < sum(io_counts[True].values())
            / sum(io_counts[False].values()) < 2 / 3,
            got=sum(io_counts[True].values()) / sum(io_counts[False].values()))
for name, (balance, ai) in roofline.items():
    checks.true(f"{name}: standard below balance, tiled (B_r = M/4d) above",
                ai[None]["standard"] < balance < ai[None]["flash"],
                got=f"{ai[None]['standard']:.1f} < {balance:.0f} < {ai[None]['flash']:.1f}")
    checks.true(f"{name}: tiled with B_r = 64 or 128 below balance",
                max(ai[64]["flash"], ai[128]["flash"]) < balance,
                got=f"{max(ai[64]['flash'], ai[128]['flash']):.1f} < {balance:.0f}")
checks

# %% [markdown]
# ## 14.2 The online softmax
#
# The softmax of a row needs its maximum (for stability) and its normaliser, both of which
# seem to need the whole row. Milakov & Gimelshein (2018, "Online normalizer calculation
# for softmax") showed that they do not. Summarise a block of scores $s_j$ with values $v_j$
# by the **state**
#
# $$ m = \max_j s_j, \qquad \ell = \sum_j e^{s_j - m}, \qquad o = \sum_j e^{s_j - m} v_j . $$
#
# Two blocks' states merge into the state of their union by rescaling each to the common
# maximum $m = \max(m_1, m_2)$:
#
# $$ \ell = e^{m_1 - m}\ell_1 + e^{m_2 - m}\ell_2, \qquad o = e^{m_1 - m} o_1 + e^{m_2 - m} o_2 , $$
#
# and at the end $o / \ell$ is the softmax-weighted average and $m + \log \ell$ the
# log-sum-exp. SymPy proves that the merge gives exactly the softmax-weighted sum of a row
# of five scores split 2 + 3, with the maxima left symbolic (`Max`):

# %%
s = sp.symbols("s1:6", real=True)
v = sp.symbols("v1:6", real=True)


def state(idx):
    """(m, l, o) of the scores s_i, i in idx, symbolically."""
    m = sp.Max(*[s[i] for i in idx])
    return m, sum(sp.exp(s[i] - m) for i in idx), sum(sp.exp(s[i] - m) * v[i] for i in idx)


def merge(a, b):
    m = sp.Max(a[0], b[0])
    return m, sp.exp(a[0] - m) * a[1] + sp.exp(b[0] - m) * b[1], \
        sp.exp(a[0] - m) * a[2] + sp.exp(b[0] - m) * b[2]


def is_zero(expr):
    return sp.simplify(sp.powsimp(sp.expand(expr))) == 0


m_, l_, o_ = merge(state([0, 1]), state([2, 3, 4]))
softmax_avg = sum(sp.exp(s[i]) * v[i] for i in range(5)) / sum(sp.exp(s[i]) for i in range(5))
assert is_zero(o_ / l_ - softmax_avg)
assert is_zero(m_ + sp.log(l_) - sp.log(sum(sp.exp(si) for si in s)))
display(Formula(r"\frac{o}{\ell} = " + sp.latex(sp.simplify(sp.powsimp(sp.expand(o_ / l_))))))

# %% [markdown]
# Because the merge is **associative** and **commutative**, a row may be cut into blocks
# anywhere and the blocks folded in any grouping and order: one GPU program may walk the
# keys left to right, another may split them between programs and merge at the end
# (exercise 2). The empty state $(-\infty, 0, 0)$ is its identity, so the states form a
# commutative monoid. SymPy checks the three laws:

# %%
a, b, c = state([0]), state([1, 2]), state([3, 4])
assoc = [is_zero(x - y) for x, y in zip(merge(merge(a, b), c), merge(a, merge(b, c)), strict=True)]
commut = [is_zero(x - y) for x, y in zip(merge(a, b), merge(b, a), strict=True)]
identity = merge((sp.S.NegativeInfinity, 0, 0), b)
checks = Checks("merge rule, symbolic and numerical")
residual_avg = sp.simplify(sp.powsimp(sp.expand(o_ / l_ - softmax_avg)))
residual_lse = sp.simplify(sp.powsimp(sp.expand(m_ + sp.log(l_) - sp.log(sum(sp.exp(si) for si in s)))))
checks.true("SymPy: o/l - softmax average simplifies to", residual_avg == 0, got=residual_avg)
checks.true("SymPy: m + log l - LSE simplifies to", residual_lse == 0, got=residual_lse)
s_num = 10 * torch.randn(5, generator=g, dtype=torch.float64)  # one row, split 2 + 3 as above
v_num = torch.randn(5, 3, generator=g, dtype=torch.float64)
m_n, l_n, o_n = merge_softmax_states(softmax_state(s_num[:2], v_num[:2]),
                                     softmax_state(s_num[2:], v_num[2:]))
checks.close("numerical: o/l vs softmax(s) @ v", torch.softmax(s_num, 0) @ v_num, o_n / l_n,
             tol=1e-14)
checks.close("numerical: m + log l vs torch.logsumexp", torch.logsumexp(s_num, 0),
             m_n + torch.log(l_n), tol=1e-14)
checks.true("associative (m, l, o)", all(assoc), got=f"{sum(assoc)} of 3 differences simplify to 0")
checks.true("commutative (m, l, o)", all(commut), got=f"{sum(commut)} of 3 differences simplify to 0")
ident = [is_zero(x - y) for x, y in zip(identity[1:], b[1:], strict=True)]
checks.true("(-inf, 0, 0) is the identity", all(ident), got=f"{sum(ident)} of 2 (l, o) differences = 0")
checks

# %% [markdown]
# The package implements the state of a block and the merge, with the empty state handled
# (a fully masked row has $m = -\infty$, and $e^{-\infty - (-\infty)}$ would be NaN), and the
# two-pass online softmax on top of them:

# %%
show_source(merge_softmax_states)

# %%
show_source(online_softmax)

# %%
x = 30 * torch.randn(4, 1000, generator=g, dtype=torch.float64)  # scores far beyond exp's range
checks = Checks("online softmax")
for block in (1, 7, 128, 1000):
    checks.close(f"block {block} vs torch.softmax", torch.softmax(x, -1), online_softmax(x, block),
                 tol=1e-15)
parts = [softmax_state(x[:, j:j + 300], torch.eye(1000, dtype=torch.float64)[j:j + 300])
         for j in range(0, 1000, 300)]  # values e_j: o / l recovers the softmax itself
m_r, l_r, o_r = parts[0]
for part in parts[1:]:
    m_r, l_r, o_r = merge_softmax_states((m_r, l_r, o_r), part)
checks.close("merged states: o/l = softmax", torch.softmax(x, -1), o_r / l_r[:, None], tol=1e-15)
checks

# %% [markdown]
# ## 14.3 Exact tiled attention
#
# Apply the state to attention. For a block of $B_r$ queries start with the empty state and
# fold in one block of $B_c$ keys at a time: the scores of the tile are
# $S_{ij} = Q_i K_j^\top / \sqrt{d_k}$, a $B_r \times B_c$ matrix, and the state of the tile
# merges into the running one. After the last key block, $O_i = o / \ell$ and
# $L_i = m + \log \ell$. This is Algorithm 1 of Dao et al. (2022) with the loops in the
# order of FlashAttention-2 (queries outside, keys inside), so each query block is
# finished, and written, once. With a causal mask, a key block entirely to the right of
# the diagonal is never visited (about half of them), and only the tiles that cross the
# diagonal are masked.

# %%
show_source(flash_attention_reference)

# %% [markdown]
# Against chapter 4's naive attention and PyTorch's `scaled_dot_product_attention`, in
# float32, with $T = 37$ (not a multiple of the 16-wide blocks), $T_q \ne T_k$ and
# $d_k \ne d_v$; gradients by autograd through the tiles against autograd through naive
# attention:

# %%
def grads(fn, q, k, v, do, **kw):
    """Output and (dq, dk, dv) of fn by autograd, for an upstream gradient do."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, **kw)
    return [out, *torch.autograd.grad(out, (q, k, v), do)]


checks = Checks("tiled attention (PyTorch) vs naive, float32")
for T_q, T_k, d_v, causal in ((37, 37, 16, False), (37, 37, 16, True), (29, 53, 24, False)):
    q, k, v = (torch.randn(2, 3, T, d, generator=g) for T, d in ((T_q, 16), (T_k, 16), (T_k, d_v)))
    do = torch.randn(2, 3, T_q, d_v, generator=g)
    ours = grads(flash_attention_reference, q, k, v, do, is_causal=causal, block_q=16, block_k=16)
    naive = grads(scaled_dot_product_attention, q, k, v, do, is_causal=causal)
    torch_ = grads(F.scaled_dot_product_attention, q, k, v, do, is_causal=causal)
    tag = f"T_q={T_q} T_k={T_k}{' causal' if causal else ''}"
    for name, a_, b_, c_ in zip(("out", "dq", "dk", "dv"), ours, naive, torch_, strict=True):
        checks.close(f"{tag}: {name} vs naive", b_, a_, tol=1e-5)
        checks.close(f"{tag}: {name} vs torch SDPA", c_, a_, tol=1e-5)
checks

# %% [markdown]
# ### Peak memory: $O(T)$ against $O(T^2)$
#
# `peak_memory_bytes` runs a function under `torch.profiler` with memory profiling: every
# allocation and free of PyTorch's allocator is an event with a size, and the peak is the
# largest running sum. The sizes and their order do not depend on timing, so the numbers
# below are the same on every run. One head, $d = 64$, float32, blocks of 128:

# %%
show_source(peak_memory_bytes)

# %%
T_mem = [256, 512, 1024, 2048, 4096]
peaks = {"naive": [], "tiled": []}
for T in T_mem:
    q, k, v = (torch.randn(1, 1, T, 64, generator=g) for _ in range(3))
    peaks["naive"].append(peak_memory_bytes(scaled_dot_product_attention, q, k, v))
    peaks["tiled"].append(peak_memory_bytes(flash_attention_reference, q, k, v, block_q=128,
                                            block_k=128))
print(f"{'T':>6s}{'naive MiB':>12s}{'tiled MiB':>12s}{'8 T^2 bytes, MiB':>18s}")
for T, a_, b_ in zip(T_mem, peaks["naive"], peaks["tiled"], strict=True):
    print(f"{T:6d}{a_ / 2**20:12.3f}{b_ / 2**20:12.3f}{8 * T * T / 2**20:18.3f}")

# %% [markdown]
# Naive attention peaks at exactly two $T \times T$ float32 matrices (the scores and the
# probabilities, alive together inside the softmax), 128 MiB per head at $T = 4096$. The tiled
# version peaks at about twice its $T \times d$ output (the per-block outputs and their
# concatenation) plus a few $128 \times 128$ tiles: 2.1 MiB. The slopes on a log-log
# scale are the exponents:

# %%
slope = {name: np.polyfit(np.log(T_mem[2:]), np.log(p[2:]), 1)[0] for name, p in peaks.items()}
checks = Checks("peak memory")
checks.close("naive: peak / (2 * 4 T^2 bytes) at T=4096", 1.0, peaks["naive"][-1] / (8 * 4096**2),
             tol=1e-6)
checks.close("naive: log-log slope", 2.0, slope["naive"], tol=0.01)
checks.close("tiled: log-log slope", 1.0, slope["tiled"], tol=0.15)
checks.true("tiled peak < 1/50 of naive at T=4096", peaks["tiled"][-1] * 50 < peaks["naive"][-1],
            got=peaks["naive"][-1] / peaks["tiled"][-1])
checks

# %%
fig, ax = plt.subplots(figsize=(6, 4))
for name, marker in (("naive", "o"), ("tiled", "s")):
    ax.loglog(T_mem, np.array(peaks[name]) / 2**20, marker=marker,
              label=f"{name} (slope {slope[name]:.2f})")
ax.loglog(T_mem, 8 * np.array(T_mem, dtype=float) ** 2 / 2**20, "k:", label=r"$2 \times 4T^2$ bytes")
ax.set(xlabel="sequence length T (tokens)", ylabel="peak allocated memory (MiB)",
       title="Attention peak memory, one head, d = 64, float32 (CPU)")
ax.set_xticks(T_mem, [str(T) for T in T_mem], minor=False)
ax.xaxis.set_minor_formatter(plt.NullFormatter())
ax.legend()
save_figure(fig, "14_flash_attention_memory")
plt.show()

# %% [markdown]
# The naive curve lies on the $8T^2$ line: every doubling of $T$ quadruples the memory.
# The tiled curve grows linearly and is a factor of 61 lower at $T = 4096$; at $T = 128$k
# the naive version would need 128 GiB per head, the tiled one about 64 MiB.

# %% [markdown]
# ## 14.4 The backward pass: recompute, do not store
#
# Autograd through the tiles (as above) works but saves every tile, which is again $T^2$
# memory. FlashAttention's backward saves only $O$ and the log-sum-exp $L$ (one number per
# row) and **recomputes** each tile of probabilities as $P_{ij} = e^{S_{ij} - L_i}$: extra
# FLOPs, but no $T^2$ traffic. With $O = PV$ and the upstream gradient
# $dO = \partial\mathcal L/\partial O$ (chapter 8):
#
# $$ dV = P^\top dO, \qquad dP = dO\,V^\top, \qquad dS = P \odot (dP - D), \qquad
#    dQ = \tfrac{1}{\sqrt{d_k}}\, dS\, K, \qquad dK = \tfrac{1}{\sqrt{d_k}}\, dS^\top Q , $$
#
# where $D_i = \sum_j P_{ij}\, dP_{ij}$ comes from the softmax Jacobian
# $\partial P_{ij}/\partial S_{ik} = P_{ij}(\delta_{jk} - P_{ik})$. SymPy derives $dS$ for one
# row of three scores, and then shows the identity that makes $D$ cheap:
# $D_i = \sum_j P_{ij}\, dP_{ij} = \sum_c dO_{ic}\, O_{ic}$, a row sum over $d$ entries of two
# tensors the backward has anyway, instead of over $T$ entries of $P$.

# %%
S_row = sp.symbols("S1:4", real=True)
dP_row = sp.symbols("dP1:4", real=True)  # upstream gradient dL/dP of one row
P_row = [sp.exp(si) / sum(sp.exp(sj) for sj in S_row) for si in S_row]
loss = sum(gp * p for gp, p in zip(dP_row, P_row, strict=True))  # L linear in P: dL/dP = dP
D_row = sum(p * gp for p, gp in zip(P_row, dP_row, strict=True))
dS_formula = [P_row[k] * (dP_row[k] - D_row) for k in range(3)]
assert all(sp.simplify(sp.diff(loss, S_row[k]) - dS_formula[k]) == 0 for k in range(3))

P_m = sp.Matrix(2, 3, sp.symbols("P1:7"))  # (T_q, T_k) = (2, 3)
V_m = sp.Matrix(3, 2, sp.symbols("V1:7"))  # (T_k, d) = (3, 2)
dO_m = sp.Matrix(2, 2, sp.symbols("dO1:5"))  # (T_q, d)
dP_m, O_m = dO_m * V_m.T, P_m * V_m
D_P = [sum(P_m[i, j] * dP_m[i, j] for j in range(3)) for i in range(2)]
D_O = [sum(dO_m[i, c] * O_m[i, c] for c in range(2)) for i in range(2)]
assert all(sp.expand(x - y) == 0 for x, y in zip(D_P, D_O, strict=True))
display(Formula(r"\frac{\partial \mathcal L}{\partial S_1} = " + sp.latex(sp.factor(dS_formula[0]))
             + r",\qquad D_1 = \operatorname{rowsum}(P \odot dP)_1 = " + sp.latex(sp.expand(D_O[0]))))

# %% [markdown]
# The tiled backward in PyTorch is Algorithm 2 of FlashAttention-2 (Dao, 2023), line for
# line: $D$ computed once; key blocks outside, each with accumulators $dK_j$, $dV_j$ that stay
# on chip and are written once when the inner loop ends; query blocks inside, with $P$
# recomputed from $L$ alone in every tile and $dQ_i$ read, updated and written back to HBM
# for every key block. FlashAttention's first backward (Dao et al., 2022, Algorithm 4) has
# the same loops but saves the row maxima $m$ and normalisers $\ell$ instead of $L$,
# recomputes $P = \operatorname{diag}(\ell)^{-1} e^{S - m}$, and forms $D_i$ again inside
# the inner loop, once per key block.

# %%
show_source(flash_attention_backward_reference)

# %%
checks = Checks("Algorithm 2 (recomputing P from L) vs autograd of torch's attention, float64")
for T_q, T_k, causal in ((29, 45, False), (45, 29, False), (37, 53, True)):
    q, k = (torch.randn(2, 2, T, 16, generator=g, dtype=torch.float64) for T in (T_q, T_k))
    v = torch.randn(2, 2, T_k, 24, generator=g, dtype=torch.float64)  # d_v = 24 != d_k = 16
    do = torch.randn(2, 2, T_q, 24, generator=g, dtype=torch.float64)
    out, lse = flash_attention_reference(q, k, v, is_causal=causal, block_q=16, block_k=8,
                                         return_lse=True)
    ours = flash_attention_backward_reference(q, k, v, out, lse, do, is_causal=causal,
                                              block_q=16, block_k=8)
    auto = grads(F.scaled_dot_product_attention, q, k, v, do, is_causal=causal)[1:]
    for name, a_, b_ in zip(("dq", "dk", "dv"), auto, ours, strict=True):
        checks.close(f"T_q={T_q} T_k={T_k}{' causal' if causal else ''}: {name}", a_, b_, tol=1e-12)
scores = (q @ k.transpose(-2, -1) / 4).masked_fill(~causal_mask(T_q, T_k, offset=0), -torch.inf)
checks.close("L = logsumexp of the scaled scores", torch.logsumexp(scores, -1), lse, tol=1e-12)
checks

# %% [markdown]
# Training uses the two halves as *one* differentiable operation: a
# `torch.autograd.Function` whose forward runs the tiled loop without recording a graph and
# saves only $(Q, K, V, O, L)$, and whose backward is the tiled backward above. Autograd
# through the tiles (what `flash_attention_reference` offers by itself) would keep every
# tile of $P$ for the backward, $O(T^2)$ memory again.

# %%
show_source(FlashAttentionReferenceFunction)

# %%
g_tiled = torch.Generator().manual_seed(14)  # its own stream: later cells keep theirs
q_t, k_t, v_t = (torch.randn(2, 2, 37, 16, generator=g_tiled, dtype=torch.float64,
                             requires_grad=True) for _ in range(3))
do_t = torch.randn(2, 2, 37, 16, generator=g_tiled, dtype=torch.float64)
out_t = flash_attention_tiled(q_t, k_t, v_t, is_causal=True, block_q=16, block_k=16)
saved = [tuple(t.shape) for t in out_t.grad_fn.saved_tensors]
checks = Checks("flash_attention_tiled: one autograd.Function, float64")
checks.equal("saved for backward: q, k, v, O, L", saved,
             [(2, 2, 37, 16)] * 4 + [(2, 2, 37)])
ours = torch.autograd.grad(out_t, (q_t, k_t, v_t), do_t)
auto = grads(F.scaled_dot_product_attention, q_t, k_t, v_t, do_t, is_causal=True)[1:]
for name, a_, b_ in zip(("dq", "dk", "dv"), auto, ours, strict=True):
    checks.close(f"{name} vs autograd of torch's attention", a_, b_, tol=1e-12)
checks

# %% [markdown]
# ## 14.5 The forward kernel in Triton
#
# Triton (Tillet et al., 2019, "Triton: An Intermediate Language and Compiler for Tiled
# Neural Network Computations") writes GPU kernels as Python functions over *blocks*: a
# program loads a tile with `tl.load`, multiplies tiles with `tl.dot` (tensor cores, here
# with float32 accumulation), and stores. The forward kernel is the tiled loop above, one
# program per (batch·head, block of queries), the state $(m, \ell, \text{acc})$ in
# registers. Two GPU habits show: exponentials in base 2 ($e^x = 2^{x \log_2 e}$, with
# $\log_2 e$ folded into the scale), and, for a causal mask, the key blocks left of the
# diagonal run without any mask, only the diagonal ones are masked.

# %%
show_source(flash_triton._forward_inner.fn)

# %%
show_source(flash_triton._flash_forward_kernel.fn)

# %% [markdown]
# ## 14.6 The backward kernels
#
# The kernels compute what Algorithm 2 computes, but not in its single pass. Algorithm 2
# updates $dQ_i$ in HBM from every key block, so on a GPU, where the key blocks run as
# parallel programs, those updates need atomic additions, whose order, and so whose
# rounding, varies from run to run. The kernels here split the work instead, after a small
# kernel that computes $D = \operatorname{rowsum}(dO \odot O)$: one program per key block
# accumulates $dK_j$ and $dV_j$ over the query blocks (it works with transposed tiles, keys
# as rows), one program per query block accumulates $dQ_i$ over the key blocks. Each output
# is written once by one program, so there are no atomic additions and the result is
# deterministic; the price is computing $P$ and $dP$ twice.

# %%
show_source(flash_triton._flash_backward_dkdv_kernel.fn)

# %%
show_source(flash_triton._flash_backward_dq_kernel.fn)

# %% [markdown]
# A `torch.autograd.Function` ties them together: its forward launches the forward kernel and
# saves $(Q, K, V, O, L)$, nothing of size $T^2$; its backward launches the three backward
# kernels.

# %%
show_source(flash_triton.FlashAttentionFunction)

# %% [markdown]
# Here `TRITON_INTERPRET=1` makes Triton run each program in NumPy on the CPU: slow (every
# program is a Python call), but the same kernel source. Against naive attention in float32,
# forward and gradients, with $T$ not a multiple of the 16-wide blocks:

# %%
checks = Checks("Triton kernels (interpreter) vs naive, float32")
for T_q, T_k, d, causal in ((37, 37, 16, False), (37, 37, 16, True), (29, 50, 32, False)):
    q, k, v, do = (torch.randn(1, 2, T, d, generator=g) for T in (T_q, T_k, T_k, T_q))
    ours = grads(flash_attention_triton, q, k, v, do, is_causal=causal)
    naive = grads(scaled_dot_product_attention, q, k, v, do, is_causal=causal)
    torch_ = grads(F.scaled_dot_product_attention, q, k, v, do, is_causal=causal)
    tag = f"T_q={T_q} T_k={T_k} d={d}{' causal' if causal else ''}"
    for name, a_, b_, c_ in zip(("out", "dq", "dk", "dv"), ours, naive, torch_, strict=True):
        checks.close(f"{tag}: {name} vs naive", b_, a_, tol=1e-5)
        checks.close(f"{tag}: {name} vs torch SDPA", c_, a_, tol=1e-5)
checks

# %% [markdown]
# In 16-bit inputs the kernels round like PyTorch does: their error against a float32
# computation is of the size of PyTorch's own in that dtype.

# %%
checks = Checks("Triton kernels in 16-bit vs float32 attention")
for dtype in (torch.float16, torch.bfloat16):
    q, k, v, do = (torch.randn(1, 2, 48, 32, generator=g).to(dtype) for _ in range(4))
    exact = grads(F.scaled_dot_product_attention, q.float(), k.float(), v.float(), do.float(),
                  is_causal=True)
    ours = grads(flash_attention_triton, q, k, v, do, is_causal=True)
    torch_ = grads(F.scaled_dot_product_attention, q, k, v, do, is_causal=True)
    tag = str(dtype).replace("torch.", "")
    for name, e_, o_, t_ in zip(("out", "dq", "dk", "dv"), exact, ours, torch_, strict=True):
        err_torch = (t_.float() - e_).abs().max().item()
        checks.close(f"{tag} {name} (tol: 2x torch's error + eps)", e_, o_.float(),
                     tol=2 * err_torch + 4 * torch.finfo(dtype).eps)
checks

# %% [markdown]
# ## 14.7 On a GPU
#
# `benchmarks/flash.py` times the kernels against `torch.nn.functional.scaled_dot_product_attention`
# (which dispatches to its own FlashAttention-2 kernels) on a CUDA GPU: $T$ from 1k to 16k,
# $d = 64$ and 128, causal or not, float16 and bfloat16, forward and backward. It writes
# `benchmarks/results/flash_<gpu>.json`, which this cell plots; on a machine without a GPU the
# script only checks correctness under the interpreter and writes
# `flash_cpu_interpreter.json`, which holds no speed figures.

# %%
results_dir = Path(flash_triton.__file__).resolve().parents[1] / "benchmarks" / "results"
gpu_files = sorted(p for p in results_dir.glob("flash_*.json") if p.name != "flash_cpu_interpreter.json")
gpu_results = [json.loads(p.read_text()) for p in gpu_files]
gpu_results = [r for r in gpu_results if r.get("speed_measured")]
if not gpu_results:
    print("no GPU measurements yet: run `python benchmarks/flash.py` on a machine with a CUDA GPU")
for r in gpu_results:
    print(f"{r['machine']['gpu']}: {len(r['rows'])} configurations; at T >= 4k, d = 128, fp16: "
          f"forward {r['summary']['min_forward_ratio']:.2f}x, backward "
          f"{r['summary']['min_backward_ratio']:.2f}x SDPA's TFLOP/s")

# %%
for r in gpu_results:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, phase in zip(axes, ("forward", "backward"), strict=True):
        for causal, style in ((False, "-"), (True, "--")):
            rows = [x for x in r["rows"] if x["dtype"] == "float16" and x["d"] == 128
                    and x["causal"] == causal]
            Ts = [x["T"] for x in rows]
            for who, color in (("ours", "C0"), ("sdpa", "C1")):
                ax.plot(Ts, [x[who][f"{phase}_tflops"] for x in rows], style, color=color,
                        marker="o", label=f"{who}{' causal' if causal else ''}")
        ax.set(xscale="log", xlabel="sequence length T (tokens)", title=f"{phase}, fp16, d = 128")
    axes[0].set_ylabel("throughput (TFLOP/s)")
    axes[0].legend()
    fig.suptitle(f"Triton FlashAttention vs torch SDPA on {r['machine']['gpu']}")
    save_figure(fig, f"14_flash_attention_gpu_{Path(gpu_files[gpu_results.index(r)]).stem[6:]}")
    plt.show()

# %% [markdown]
# ## 14.8 Masks as functions: FlexAttention, and split-KV decoding
#
# Causal is one mask among several that models use today: a sliding window of the $w$ most
# recent keys (Mistral, Jiang et al., 2023), and, when several documents are packed into one
# training sequence, a *document mask* that lets a token see only the earlier tokens of its
# own document. PyTorch's `torch.nn.attention.flex_attention` (Dong et al., 2024) takes any
# such mask as a function `mask_mod(b, h, q_idx, kv_idx)` that returns True where a query
# may see a key, and turns it into a `BlockMask`: for every tile of the score matrix, whether
# the mask hides it entirely (skip it), shows it entirely (no masking needed) or cuts
# through it (mask it). `flash_attention_masked` does the same in the tiled loop of 14.3,
# deciding each tile from the mask before computing a single score. The three masks, as
# functions of positions:

# %%
display(show_source(sliding_window_mask_mod))
show_source(document_mask_mod)

# %% [markdown]
# Here `flex_attention` runs eagerly on the CPU: without `torch.compile` it forms the whole
# score matrix, so it is a peer for the *values* and for the block classification, not for
# speed. $T = 128$, tiles of $16 \times 16$ (an $8 \times 8$ grid of 64 tiles), a window of
# 24 and three documents of 40, 57 and 31 tokens; float32, tolerance $10^{-5}$ as in 14.3:

# %%
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
T_flex, block, window = 128, 16, 24
doc_ids = torch.repeat_interleave(torch.arange(3), torch.tensor([40, 57, 31]))  # packed documents
masks = {"causal": causal_mask_mod(), f"window w={window}": sliding_window_mask_mod(window),
         "documents 40+57+31": document_mask_mod(doc_ids)}
q, k, v = (torch.randn(1, 2, T_flex, 32, generator=g) for _ in range(3))
checks = Checks("masked tiled attention vs flex_attention, float32")
print(f"{'mask':>20s}{'full':>6s}{'partial':>9s}{'skipped':>9s}{'flex sparsity':>15s}")
for name, mask_mod in masks.items():
    blocks = {}
    ours = flash_attention_masked(q, k, v, mask_mod, block_q=block, block_k=block, blocks=blocks)
    block_mask = create_block_mask(mask_mod, None, None, T_flex, T_flex, device="cpu",
                                   BLOCK_SIZE=block)
    checks.close(f"{name}: output", flex_attention(q, k, v, block_mask=block_mask), ours, tol=1e-5)
    checks.equal(f"{name}: partial tiles = BlockMask.kv_num_blocks",
                 int(block_mask.kv_num_blocks.sum()), blocks["partial"])
    checks.equal(f"{name}: full tiles = BlockMask.full_kv_num_blocks",
                 int(block_mask.full_kv_num_blocks.sum()), blocks["full"])
    print(f"{name:>20s}{blocks['full']:6d}{blocks['partial']:9d}{blocks['skipped']:9d}"
          f"{block_mask.sparsity():14.1f}%")
checks

# %% [markdown]
# Both count the same tiles, and `BlockMask.sparsity()` is the skipped share: 28, 43 and 42
# of the 64 tiles are never computed. The sliding window has no full tile at all, because a
# window of 24 is not a multiple of 16 and so cuts through every tile it touches. Two
# checks that do not go through either mask function: with the document mask, the output
# must equal each document attended as a causal sequence of its own (the reason packing
# with document masks is exact); with the window, it must equal PyTorch's SDPA under the
# boolean mask that `attention_variants.sliding_window_mask` builds from its own formula
# (float64):

# %%
q64, k64, v64 = (t.double() for t in (q, k, v))
separate = torch.cat([F.scaled_dot_product_attention(q64[..., a:b, :], k64[..., a:b, :],
                                                     v64[..., a:b, :], is_causal=True)
                      for a, b in ((0, 40), (40, 97), (97, 128))], dim=-2)
dense_window = sliding_window_mask(T_flex, T_flex, window)  # (T, T) booleans
checks = Checks("masked tiled attention vs independent constructions, float64")
checks.close("documents = each document as its own causal sequence", separate,
             flash_attention_masked(q64, k64, v64, masks["documents 40+57+31"], 16, 16), tol=1e-12)
checks.close("window = SDPA under sliding_window_mask",
             F.scaled_dot_product_attention(q64, k64, v64, attn_mask=dense_window),
             flash_attention_masked(q64, k64, v64, masks[f"window w={window}"], 16, 16), tol=1e-12)
checks

# %% [markdown]
# How the computed tiles grow with $T$ follows from the geometry, before any run: with
# $n = T/16$ query blocks, causal attention computes the $n(n+1)/2$ tiles on and below the
# diagonal. With $w = 24$, the query block $[i_0, i_0 + 16)$ sees keys from $i_0 - 23$ to
# $i_0 + 15$, which meet its own key block and the two to its left, so $3n$ tiles less the
# three that would lie left of the first key block: $3n - 3$, linear in $T$.

# %%
checks = Checks("computed tiles (full + partial) against the counts derived above")
print(f"{'T':>6s}{'causal':>8s}{'window':>8s}")
for T in (128, 256, 512):
    x = torch.randn(1, T, 4, generator=g)
    computed = []
    for mask_mod in (causal_mask_mod(), sliding_window_mask_mod(window)):
        blocks = {}
        flash_attention_masked(x, x, x, mask_mod, block_q=16, block_k=16, blocks=blocks)
        computed.append(blocks["full"] + blocks["partial"])
    n = T // 16
    checks.equal(f"T={T}: causal = n(n+1)/2", n * (n + 1) // 2, computed[0])
    checks.equal(f"T={T}: window = 3n - 3", 3 * n - 3, computed[1])
    print(f"{T:6d}{computed[0]:8d}{computed[1]:8d}")
checks

# %% [markdown]
# ### Split-KV decoding
#
# At decoding time there is one query per sequence and head, so the tiled forward has a
# single query block: one program on a GPU with a hundred or more multiprocessors, walking
# alone over a long KV cache. Flash-Decoding (Dao et al., 2023) splits the *keys* into
# chunks, lets a separate program attend to each, and combines the partial results. Each
# chunk returns its normalised output $O_c$ and its log-sum-exp $L_c$; such a pair is the
# online-softmax state $(m, \ell, o) = (L_c, 1, O_c)$, so the merge rule of 14.2 combines
# them exactly, $L = \log\sum_c e^{L_c}$ and $O = \sum_c e^{L_c - L} O_c$ (exercise 1 derives
# the same formula directly).

# %%
show_source(split_kv_attention)

# %% [markdown]
# One query per head, four heads, a cache of 4096 keys, in float64 against PyTorch's SDPA:

# %%
q1 = torch.randn(1, 4, 1, 64, generator=g, dtype=torch.float64)
k_cache, v_cache = (torch.randn(1, 4, 4096, 64, generator=g, dtype=torch.float64)
                    for _ in range(2))
exact = F.scaled_dot_product_attention(q1, k_cache, v_cache)
checks = Checks("split-KV vs torch SDPA, float64")
for n_splits in (1, 4, 16, 128):
    checks.close(f"{n_splits} chunks", exact, split_kv_attention(q1, k_cache, v_cache, n_splits),
                 tol=1e-12)
checks

# %% [markdown]
# ## Summary
#
# * Standard attention writes the $T \times T$ scores and probabilities to HBM and reads them
#   back: $\Theta(Td + T^2)$ accesses and an arithmetic intensity of about $d/2$ FLOPs per
#   byte in 16 bits, far below a GPU's balance point (about 295 FLOP/B on an H100), so it is
#   memory-bound. The tiled algorithm moves $\Theta(T^2d^2/M)$ elements (Dao et al., 2022,
#   Theorem 2), an intensity of about its query block $B_r$: above the balance point with
#   the largest block the SRAM holds ($M/4d$ rows, next to a key block of $\min(M/4d, d)$
#   rows and the score tile: $3M/4 + 2d^2 \le M$ elements), below it with the 64- or
#   128-row blocks of real kernels, whose repeated loads the L2 cache serves. The count was
#   reproduced element for element by instrumenting the tiled loop.
# * The online-softmax state $(m, \ell, o)$ of a block merges exactly into the state of a
#   union, proved in SymPy and checked numerically; the merge is associative and commutative
#   with identity $(-\infty, 0, 0)$, so blocks can be folded in any order and grouping.
# * Exact tiled attention keeps a $B_r \times B_c$ tile instead of the $T \times T$ matrix:
#   its peak memory grows linearly in $T$, the naive version's quadratically (measured).
# * The backward saves only $O$ and the log-sum-exp $L$ and recomputes $P = e^{S - L}$ per
#   tile; $D = \operatorname{rowsum}(dO \odot O)$ replaces a sum over $T$ by one over $d$.
#   This is FlashAttention-2's Algorithm 2, checked against autograd of PyTorch's attention;
#   the forward and backward join in one `autograd.Function` that keeps no $T^2$ tensor.
# * The same algorithm as Triton kernels agrees with naive attention and PyTorch's SDPA to
#   $10^{-5}$ in float32 and to PyTorch's own error in 16 bits.
# * A mask given as a function of positions (causal, sliding window, packed documents)
#   classifies every tile as skipped, full or partial before any score is computed; the
#   tiled loop that skips the hidden tiles agrees with `flex_attention` and counts the same
#   tiles as its `BlockMask`. A fixed window makes the computed tiles grow linearly in $T$.
# * Split-KV decoding attends to chunks of the cache independently and merges their
#   $(L_c, O_c)$ with the online-softmax rule; the result is exact.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/14_flash_attention.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 14` writes a stub
# of every function, `llmbook grade 14` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_14.py` runs
# the same checks on the reference.
#
# 1. (★) **Merging normalised results.** Kernels often keep a block's result normalised:
#    its log-sum-exp $L = m + \log\ell$ and output $O = o/\ell$. Show that two such results
#    merge as $L = \log(e^{L_1} + e^{L_2})$, $O = e^{L_1 - L} O_1 + e^{L_2 - L} O_2$ (a convex
#    combination), implement `merge_lse_states((L1, O1), (L2, O2))` with `torch.logaddexp`,
#    and check it against the softmax of the whole row, including an empty block $L = -\infty$.
# 2. (★★) **Split-KV decoding.** When a single new token attends to a long KV cache
#    (chapter 13), one program per query block leaves most of a GPU idle. Write
#    `split_kv_attention(q, k, v, n_splits)` that cuts the keys into `n_splits` chunks,
#    attends to each chunk independently and merges the results with exercise 1; check it
#    against `F.scaled_dot_product_attention` for 1, 3, 7 and $T_k$ chunks.
# 3. (★) **How much SRAM?** With `attention_hbm_accesses`, find the smallest SRAM (a power of
#    two, in elements) at which the tiled forward moves at most a tenth of the standard
#    algorithm's HBM traffic for $T = 4096$, $d = 64$: `min_sram_for_saving(T, d, ratio)`.
#    Why can no SRAM give a saving of 1000× at $T = 64$, $d = 16$?
# 4. (★★★) **Sliding-window FlashAttention.** Mistral-style sliding-window attention lets
#    query $i$ see keys $i - w < j \le i$. Write `sliding_window_flash(q, k, v, window, block)`
#    that skips every tile lying entirely outside the window, returns the output and the
#    number of tiles visited, and matches `F.scaled_dot_product_attention` with the
#    equivalent boolean mask. How does the tile count grow with $T$ for a fixed window?
# 5. (★★) **A prefix-LM mask.** Encoder-decoder style "prefix LM" training lets every token
#    see the whole prompt of `prefix` tokens, in both directions, and the tokens after it
#    causally. Write `prefix_lm_mask_mod(prefix)` in the `mask_mod` convention of 14.8, run it
#    through `flash_attention_masked` and `flex_attention`, and check the output against
#    SDPA with the equivalent boolean mask and the tile counts against the `BlockMask`. Which
#    tiles above the diagonal are no longer skipped?

# %%
from llmbook.workbench import grade

grade("14", globals())
