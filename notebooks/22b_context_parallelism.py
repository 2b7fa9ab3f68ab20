# %% [markdown]
# # 22b Context parallelism: splitting the sequence
#
# Every layout of chapter 22 keeps a whole sequence on each rank: data parallelism splits the
# batch, tensor parallelism the weights, pipelines the layers. The activations of one
# sequence grow with its length $T$, and at long contexts they no longer fit on one device,
# however the weights are cut. *Context parallelism* splits the sequence itself: each of $p$
# ranks holds $T/p$ positions of the queries, keys and values. Everything in a transformer
# block acts position by position except attention, where every query needs every key. This
# chapter gives attention the keys it needs in the two ways used in practice, on real gloo
# processes, and checks each against PyTorch's `scaled_dot_product_attention` (SDPA) on the
# full sequence. It:
#
# 1. builds **ring attention** (Liu et al., 2023): key/value blocks travel round a ring of
#    ranks and each rank folds them into its queries' result with chapter 14's merge rule on
#    partial outputs and their log-sum-exps; a custom backward sends the blocks round again
#    with their gradients. Outputs and gradients equal SDPA's in float64;
# 2. measures the **load imbalance** of a causal mask under contiguous sharding, derives it
#    with SymPy, and removes it with **zig-zag** sharding (rank $r$ holds chunks $r$ and
#    $2p-1-r$ of $2p$);
# 3. builds **Ulysses** sequence parallelism (Jacobs et al., 2023): two all-to-alls swap a
#    split over positions for a split over heads and back;
# 4. **derives** the bytes each method sends per rank and checks them against the bytes the
#    runs actually sent.
#
# The code is in `llmbook.scale.context_parallel`; the launcher is chapter 22's
# `llmbook.scale.launch.run`.

# %%
import matplotlib.pyplot as plt
import sympy as sp
import torch

from llmbook.inference.flash import merge_softmax_states
from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.scale import context_parallel as cp
from llmbook.scale.launch import run

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64

# %% [markdown]
# ## 22b.1 What a rank holds
#
# With $p$ ranks and a sequence of $T$ positions, rank $r$ holds a shard $(B, H, T/p, d)$ of
# $Q$, $K$ and $V$. The obvious cut is contiguous: rank $r$ gets positions
# $rT/p, \dots, (r+1)T/p - 1$. The zig-zag cut of section 22b.3 cuts the sequence into $2p$
# chunks instead. `shard_sequence` and `gather_sequence` do the cutting and the reassembly;
# here are the positions each of three ranks holds of a sequence of twelve.

# %%
positions = torch.arange(12, dtype=f64).reshape(1, 12, 1)
for layout in cp.LAYOUTS:
    print(f"{layout:>10}:", [cp.shard_sequence(positions, r, 3, layout).flatten().int().tolist()
                             for r in range(3)])

# %% [markdown]
# ## 22b.2 Ring attention
#
# Chapter 14 summarised a block of scores by its online-softmax state $(m, \ell, o)$ and
# merged two states of disjoint key blocks exactly. A *normalised* partial result, the
# output $O_j = \mathrm{softmax}(S_j)V_j$ of a query block against key block $j$ together with
# its log-sum-exp $L_j = \log\sum_k e^{S_{jk}}$, is the state $(L_j, 1, O_j)$. Merging two of
# them gives
#
# $$L = \log\left(e^{L_1} + e^{L_2}\right), \qquad O = e^{L_1 - L} O_1 + e^{L_2 - L} O_2,$$
#
# the softmax over the union of the two key blocks. SymPy confirms it on one query row with
# two keys in each block:

# %%
s1, s2, s3, s4, v1, v2, v3, v4 = sp.symbols("s1:5 v1:5", real=True)
L1, L2 = sp.log(sp.exp(s1) + sp.exp(s2)), sp.log(sp.exp(s3) + sp.exp(s4))
O1 = (sp.exp(s1) * v1 + sp.exp(s2) * v2) / sp.exp(L1)
O2 = (sp.exp(s3) * v3 + sp.exp(s4) * v4) / sp.exp(L2)
L = sp.log(sp.exp(L1) + sp.exp(L2))
merged = sp.exp(L1 - L) * O1 + sp.exp(L2 - L) * O2
full = sum(sp.exp(s) * v for s, v in zip((s1, s2, s3, s4), (v1, v2, v3, v4), strict=True)) / \
    sum(sp.exp(s) for s in (s1, s2, s3, s4))
print("merged output - softmax over all four keys:", sp.simplify(merged - full))

# %% [markdown]
# The book's `merge_softmax_states` computes the same with the maximum subtracted first, so
# that nothing overflows; on the state $(L, 1, O)$ it returns $\ell = e^{L_1 - m} + e^{L_2 - m}$
# and the unnormalised sum, and $O = o/\ell$, $L = m + \log \ell$. A numerical check against
# the softmax over the concatenated block:

# %%
s = torch.randn(3, 10, generator=g, dtype=f64)  # 3 query rows, 10 keys
v = torch.randn(10, 4, generator=g, dtype=f64)
parts = [(torch.logsumexp(s[:, a:b], -1), torch.softmax(s[:, a:b], -1) @ v[a:b]) for a, b in ((0, 6), (6, 10))]
m, ell, o = merge_softmax_states(*[(lse, torch.ones_like(lse), out) for lse, out in parts])
checks = Checks("merging two normalised partial results")
checks.close("output = softmax over all 10 keys", torch.softmax(s, -1) @ v, o / ell[:, None], tol=1e-13)
checks.close("log-sum-exp = logsumexp over all 10 keys", torch.logsumexp(s, -1), m + ell.log(), tol=1e-13)
checks

# %% [markdown]
# **The forward.** Rank $r$ starts with its own K/V block. For $p$ steps it computes its
# queries' partial result against the block it holds (chapter 14's tiled
# `flash_attention_reference`, which also returns $L$), merges it into its running state,
# and passes the block to rank $r+1$ while receiving one from rank $r-1$. After $p-1$ hops
# every query has seen every key. Under a causal mask, a pair of chunks is either wholly
# visible (the keys' chunk is earlier), wholly masked (later: skipped), or the chunk against
# itself, which takes the ordinary causal mask.
#
# **The backward.** With the global output $O$ and log-sum-exp $L$ saved, the gradient of a
# pair of blocks needs nothing else: chapter 14's `flash_attention_backward_reference`
# recomputes $P = e^{S - L}$ and, with $D = \mathrm{rowsum}(dO \circ O)$, gives the pair's
# share of $dQ$, $dK$ and $dV$ (Dao et al., 2022, Algorithm 4). The K/V blocks go round the
# ring again, and the accumulators $dK$, $dV$ of each block travel with it; after the last
# step one more hop takes them home to the block's owner.

# %%
show_source(cp.RingAttentionFunction.forward)

# %% [markdown]
# Each rank receives the full tensors, keeps its shard, and runs forward and backward; the
# parent reassembles the shards and compares them with SDPA on the whole sequence, in
# float64, with $T \ne d_k \ne d_v$, several heads, with and without the causal mask, on two
# and three ranks.

# %%
B, H, T, d_k, d_v = 2, 4, 24, 5, 3
q, k, v = (torch.randn(B, H, T, d, generator=g, dtype=f64) for d in (d_k, d_k, d_v))
grad_out = torch.randn(B, H, T, d_v, generator=g, dtype=f64)
reference = {c: cp.sdpa_with_grads(q, k, v, grad_out, c) for c in (False, True)}
ring_runs = {(p, layout, c): run(cp.ring_attention_worker, p, q, k, v, grad_out, c, layout, timeout=60)
             for p in (2, 3) for layout in cp.LAYOUTS for c in (False, True)}

# %%
checks = Checks("ring attention on gloo ranks = SDPA on the full sequence (float64)")
for (p, layout, c), res in ring_runs.items():
    err = max(float((cp.gather_sequence([r[n] for r in res], layout) - reference[c][n]).abs().max())
              for n in ("out", "dq", "dk", "dv"))
    checks.close(f"p={p} {layout:>10} {'causal' if c else 'full  '}: out, dq, dk, dv", 0.0, err, tol=1e-12)
checks

# %% [markdown]
# ## 22b.3 Causal masks and zig-zag sharding
#
# Under a causal mask, the query at position $i$ sees $i+1$ keys. Cut into contiguous shards,
# rank 0's queries see almost nothing and the last rank's see almost everything, and as every
# rank waits for the slowest at each step of the ring, the slowest sets the pace. Let SymPy
# count the unmasked entries of rank $r$ by summing $i+1$ over its queries, for contiguous
# shards (chunk size $T/p$) and zig-zag ones (chunks $r$ and $2p-1-r$ of size $T/(2p)$):

# %%
work = cp.causal_work_symbolic()
for name in ("contiguous", "zigzag", "total"):
    print(f"{name:>10}:", work[name])
print("last rank / mean (contiguous):", work["imbalance_contiguous"])
Ts, ps = sp.symbols("T p", positive=True, integer=True)
print("as T -> oo:", sp.limit(work["imbalance_contiguous"], Ts, sp.oo))

# %% [markdown]
# Zig-zag gives every rank exactly the mean, $T(T+1)/(2p)$: the early chunk's shortfall is
# the late chunk's excess. Contiguous shards load the last rank $2 - 1/p$ times the mean
# for long sequences, so the step takes nearly twice as long as it would balanced. The ring
# runs above counted the score entries each rank computed (per head); four ranks give a
# clearer picture.

# %%
T4 = 32
q4, k4, v4 = (torch.randn(1, 2, T4, d, generator=g, dtype=f64) for d in (d_k, d_k, d_v))
go4 = torch.randn(1, 2, T4, d_v, generator=g, dtype=f64)
measured = {layout: [r["work"] // 2 for r in run(cp.ring_attention_worker, 4, q4, k4, v4, go4, True, layout,
                                                    timeout=60)] for layout in cp.LAYOUTS}
checks = Checks("score entries per rank under a causal mask: counted in the ring = derived")
for (p, layout, c), res in ring_runs.items():
    if c:
        checks.equal(f"p={p} {layout}, T={T}", [B * H * w for w in cp.causal_work_per_rank(T, p, layout)],
                     [r["work"] for r in res])
for layout in cp.LAYOUTS:
    formula = [int(work[layout].subs({Ts: T4, ps: 4, sp.Symbol("r", nonnegative=True, integer=True): r}))
               for r in range(4)]
    checks.equal(f"p=4 {layout}, T={T4} (SymPy)", formula, measured[layout])
checks

# %%
fig, ax = plt.subplots(figsize=(6, 3.2))
for shift, layout in ((-0.2, "contiguous"), (0.2, "zigzag")):
    ax.bar([r + shift for r in range(4)], measured[layout], width=0.4, label=layout)
ax.axhline(T4 * (T4 + 1) / 2 / 4, color="k", lw=0.8, ls="--", label="mean")
ax.set(title=f"causal attention work per rank, T = {T4}, p = 4", xlabel="rank",
       ylabel="unmasked score entries per head", xticks=range(4))
ax.legend(fontsize="small")
save_figure(fig, "22b_zigzag_balance")
plt.show()
for layout in cp.LAYOUTS:
    print(f"{layout:>10}: max / mean = {max(measured[layout]) / (sum(measured[layout]) / 4):.3f}")

# %% [markdown]
# The contiguous bars climb with the rank; the zig-zag bars sit on the mean. Zig-zag changes
# nothing in the communication: every rank still sends its two chunks as one block per hop.
#
# ## 22b.4 Ulysses: all-to-all over heads
#
# Ulysses (Jacobs et al., 2023) swaps the split instead of moving blocks. Attention heads are
# independent, so a rank holding *all* positions of $H/p$ heads can run ordinary attention.
# One all-to-all turns the sequence-sharded $(B, H, T/p, d)$ into head-sharded
# $(B, H/p, T, d)$: rank $r$ cuts its shard into $p$ groups of heads and sends group $j$ to
# rank $j$. After attention, a second all-to-all turns the output back. The backward of an
# all-to-all is the all-to-all with the two dimensions swapped. It needs $p$ to divide $H$,
# which caps $p$ at the number of heads (at the number of key/value heads if these are sent
# unexpanded, as exercise 1 explores); a causal mask costs every rank the same, since every
# rank holds all positions.

# %%
show_source(cp.ulysses_attention)

# %%
ulysses_runs = {c: run(cp.ulysses_attention_worker, 2, q, k, v, grad_out, c, timeout=60) for c in (False, True)}
checks = Checks("Ulysses on 2 gloo ranks = SDPA on the full sequence (float64)")
for c, res in ulysses_runs.items():
    for n in ("out", "dq", "dk", "dv"):
        checks.close(f"{'causal' if c else 'full'}: {n}", reference[c][n], cp.gather_sequence([r[n] for r in res]),
                     tol=1e-12)
checks

# %% [markdown]
# ## 22b.5 How many bytes move
#
# **Ring.** A K block and a V block of $B H (T/p) d$ elements each make $p-1$ hops in the
# forward. In the backward they make $p-1$ hops again, and their gradients $p$ (the last one
# home). **Ulysses.** Each of the eight all-to-alls (q, k, v, out forward; dout, dq, dk, dv
# backward) keeps one of its $p$ slices and sends the other $p-1$, each of
# $B H (T/p) d / p$ elements. SymPy sums the hops, with $d_k = d_v = d$ and $b$ bytes per
# element:

# %%
volume = cp.context_parallel_bytes_symbolic()
for name, expr in volume.items():
    print(f"{name:>8}:", expr)

# %% [markdown]
# Per rank, the ring sends about $6BHTdb$ bytes for any $p$: each rank's share of the
# sequence shrinks as $1/p$ but it sees $p-1$ blocks go by. Ulysses sends $8BHTdb(p-1)/p^2$,
# which falls as $1/p$. The ratio $p(3p-2)/(4(p-1))$ is 2 at $p = 2$ and grows linearly. The
# ring's advantage is elsewhere: its hops are to a neighbour and overlap with the attention
# of the block already held, so on a ring of fast links their time can hide; Ulysses needs
# an all-to-all among all ranks and $p \le H$. The runs above counted the nbytes of every
# tensor they passed to `isend` or handed to `all_to_all_single` (only the slices addressed
# to other ranks). Measured against the formulas, with $d_k \ne d_v$:

# %%
checks = Checks("bytes sent per rank: counted in the runs = derived (float64, 8 bytes)")
for (p, layout, c), res in ring_runs.items():
    want = cp.ring_attention_bytes_per_rank((B, H, T // p, d_k), d_v, p)
    sent = [cp.CommCounter(r["calls"]) for r in res]
    checks.equal(f"ring p={p} {layout} {'causal' if c else 'full'}: (forward, backward) of each rank",
                 [(want["forward"], want["backward"])] * p,
                 [(s.bytes("ring forward"), s.bytes("ring backward")) for s in sent])
for c, res in ulysses_runs.items():
    want = cp.ulysses_bytes_per_rank((B, H, T // 2, d_k), d_v, 2)
    checks.equal(f"Ulysses p=2 {'causal' if c else 'full'}: (forward + backward) of each rank",
                 [want["total"]] * 2, [cp.CommCounter(r["calls"]).bytes() for r in res])
names = sp.symbols("B H T d p b", positive=True, integer=True)
for p in (2, 3, 4):  # the closed forms against the SymPy sums (d_k = d_v = 6, H = 12)
    subs = dict(zip(names, (2, 12, 12 * p, 6, p, 8), strict=True))
    checks.equal(f"p={p}: ring and Ulysses closed forms = SymPy sums",
                 [int(volume["ring"].subs(subs)), int(volume["ulysses"].subs(subs))],
                 [cp.ring_attention_bytes_per_rank((2, 12, 12, 6), 6, p)["total"],
                  cp.ulysses_bytes_per_rank((2, 12, 12, 6), 6, p)["total"]])
checks

# %% [markdown]
# ## Summary
#
# * Context parallelism splits the sequence; only attention needs to communicate.
# * Ring attention passes K/V blocks round a ring and merges normalised partial results with
#   chapter 14's rule, $L = \log(e^{L_1} + e^{L_2})$, $O = e^{L_1-L}O_1 + e^{L_2-L}O_2$. Its
#   backward reuses chapter 14's recomputing backward with the saved global $L$, and sends the
#   gradients of each block home with it. On gloo ranks, outputs and gradients equal SDPA's
#   on the full sequence to float64 round-off.
# * A causal mask loads contiguous shards unevenly, the last rank $2 - 1/p$ times the mean
#   for long sequences; zig-zag sharding (chunks $r$ and $2p-1-r$) makes every rank's work
#   exactly $T(T+1)/(2p)$, as the counted work confirms.
# * Ulysses swaps a split over positions for a split over heads with two all-to-alls; it
#   equals SDPA too, and needs $p \mid H$.
# * Per rank and per layer, forward and backward, the ring sends $2BHTdb(3p-2)/p$ bytes,
#   Ulysses $8BHTdb(p-1)/p^2$; the bytes counted in the runs equal both formulas exactly.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/22b_context_parallelism.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 22b` writes a stub
# of every function, `llmbook grade 22b` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_22b.py` runs
# the same checks on the reference.
#
# 1. (★) **Ulysses with grouped-query attention.** With $H$ query heads and $H_{kv}$ key/value
#    heads, sent unexpanded, derive the bytes per rank of Ulysses, forward and backward, and
#    the largest $p$ it allows. How much does it save over $H_{kv} = H$ for $H = 32$,
#    $H_{kv} = 8$? (Solution: `ulysses_gqa_bytes`.)
# 2. (★★) **Striped sharding.** Brandon et al. (2023) give rank $r$ the positions
#    $i \equiv r \pmod p$. Count each rank's unmasked entries under a causal mask, show
#    that the last rank does $(p-1)T/p$ more than the first for $T$ a multiple of $p$
#    (contiguous shards: $(p-1)T^2/p^2$ more), and compare the max/mean imbalance with
#    contiguous and zig-zag sharding. (Solution: `striped_work_per_rank`.)

# %%
from llmbook.workbench import grade

grade("22b", globals())
