# %% [markdown]
# # 22c Expert parallelism, run for real
#
# Chapter 21 built a mixture-of-experts layer in one process and, in section 21.8, derived
# the traffic it would cause if its experts lived on different devices. This chapter runs
# that layout: the $N$ experts of a layer are split over the $P$ ranks of an *expert-parallel*
# group (Lepikhin et al., 2020, "GShard"), each rank holds $N/P$ experts and its own tokens,
# and two all-to-all exchanges move the tokens to their experts and the results back. The
# chapter:
#
# 1. **explains** the four steps of an expert-parallel layer: route, exchange counts,
#    dispatch, combine, and why the counts must travel first;
# 2. **derives** the token-dropping rule across ranks that reproduces chapter 21's capacity
#    exactly, and the bytes one training step sends, with SymPy;
# 3. **implements** them in `llmbook.scale.expert_parallel` on real `gloo` processes, with an
#    all-to-all whose backward is the reverse all-to-all;
# 4. **verifies** outputs and every gradient against chapter 21's single-process `MoELayer`
#    (float64, with and without dropped tokens, on 2 and 4 ranks), and the bytes each rank
#    actually sent against the formula;
# 5. **explores** how the traffic grows with the number of ranks, and how the two ways of
#    applying a capacity across ranks drop different tokens.

# %%
import matplotlib.pyplot as plt
import sympy as sp
import torch

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.scale import expert_parallel as ep
from llmbook.scale.launch import run
from llmbook.scale.moe import MoELayer, all_to_all_bytes, capacity_keep_mask, expert_capacity

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64

# %% [markdown]
# ## 22c.1 The layout and the four steps
#
# Rank $r$ holds experts $rN/P,\dots,(r+1)N/P-1$, a copy of the router (and of a shared expert,
# if the layer has one), and $n_r$ of the batch's tokens. One forward pass:
#
# 1. **route**: the router picks each token's $k$ experts and gates, as in chapter 21;
# 2. **exchange counts**: how many rows rank $r$ will send to rank $s$ depends on the routing,
#    so before the data moves, every rank tells every other how many rows to expect, one
#    integer per expert (an all-to-all of $N$ integers);
# 3. **dispatch**: an all-to-all with *variable* split sizes sends each kept (token, expert)
#    copy, $d$ numbers, to the rank of its expert, sorted by expert;
# 4. **expert compute**, then **combine**: each local expert runs on the rows it received from
#    all ranks, and the reverse all-to-all sends its outputs home, where they are weighted by
#    the gates and summed over the token's $k$ slots.
#
# An all-to-all sends row block $s$ of the input to rank $s$ and receives block $r$ of every
# rank; its adjoint is the same exchange with the send and receive splits swapped, which is
# all its backward pass does:

# %%
show_source(ep.AllToAll)

# %% [markdown]
# ## 22c.2 Capacity across ranks
#
# Chapter 21's layer gives each expert $C = \lceil \text{CF}\,kn/N\rceil$ slots and fills them in
# *slot-major* order: every token's first choice in token order, then every second choice, so a
# token loses its second expert before any token loses its first. Over a batch split into
# rank 0's tokens, then rank 1's, and so on, that order is (slot $j$, rank $r$, token $t$). So
# if $c_{r,j,e}$ counts rank $r$'s tokens whose slot-$j$ choice is expert $e$, rank $r$'s
# assignment $(t, j) \to e$ sits at place
#
# $$ \pi = \sum_{j'<j}\sum_{r'} c_{r',j',e} + \sum_{r'<r} c_{r',j,e} + (\text{its place among rank } r\text{'s slot-}j \text{ choices of } e) $$
#
# of expert $e$'s queue, and is kept if $\pi < C$. One all-gather of the $k\times N$ counts
# gives every rank what it needs, before any token moves, and a rank never sends a token that
# will be dropped. Production systems (Megatron-LM, DeepSpeed) usually apply the capacity to
# each rank's tokens separately instead (the *local* scope), which needs no all-gather but
# drops different tokens. The rule against chapter 21's `capacity_keep_mask` on the whole
# batch, for 4 ranks of uneven size:

# %%
n_tok, n_exp, top_k, world = 61, 8, 2, 4
scores = torch.rand(n_tok, n_exp, generator=g)
idx = scores.topk(top_k, dim=-1).indices  # (n, k)
cap = expert_capacity(n_tok, n_exp, top_k, 1.0)
chunks = ep.token_chunks(n_tok, world)
counts = torch.stack([ep.assignment_counts(idx[c], n_exp) for c in chunks])  # (P, k, N)
keep_ranks = torch.cat([ep.keep_mask_across_ranks(idx[c], counts, r, cap) for r, c in enumerate(chunks)])
keep_whole = capacity_keep_mask(idx, n_exp, cap)
print("tokens per rank:", [c.stop - c.start for c in chunks], " capacity:", cap,
      " dropped:", int((~keep_whole).sum()), "of", idx.numel())
checks = Checks("capacity across ranks against the single-process rule")
checks.equal("keep mask from the ranks' counts = capacity_keep_mask on the batch", keep_whole, keep_ranks)
checks

# %% [markdown]
# ## 22c.3 The layer on real processes
#
# `run_expert_parallel_layer` is the per-rank worker: rank $r$ takes its rows of the batch,
# runs `ExpertParallelMoE` forward and backward, and all-reduces the gradients of the
# replicated router (each rank's is a partial sum over its own tokens); an expert's gradient
# is complete on its owner, since the rows of every rank that chose it arrived there. The
# reference is chapter 21's `MoELayer` on the whole batch in one process, which chapter 21
# checked against `transformers`' Mixtral block. Three settings, in float64: no capacity with a
# shared expert, capacity factor 0.75 on 2 ranks, capacity factor 1 on 4 ranks.

# %%
def compare(world_size, n_experts, cf, shared, n=37, d=12, d_ff=20, scope="global"):
    torch.manual_seed(world_size + n_experts)
    layer = MoELayer(d, d_ff, n_experts, 2, capacity_factor=cf, shared_d_ff=shared, dtype=f64)
    x, grad_out = torch.randn(n, d, dtype=f64, generator=g), torch.randn(n, d, dtype=f64, generator=g)
    ref = ep.single_process_reference(layer, x, grad_out)
    res = run(ep.run_expert_parallel_layer, world_size, layer, x, grad_out, scope, timeout=120)
    return layer, ref, res


checks = Checks("expert parallelism (gloo) against the single-process MoE layer, float64")
runs = {}
for world_size, n_experts, cf, shared in ((2, 4, None, 8), (2, 4, 0.75, None), (4, 8, 1.0, None)):
    layer, (out, x_grad, grads, keep), res = compare(world_size, n_experts, cf, shared)
    runs[world_size, cf] = (layer, keep, res)
    full = ep.gather_expert_grads(res)
    tag = f"P={world_size}, N={n_experts}, CF={cf}"
    checks.close(f"{tag}: outputs", out, torch.cat([r["out"] for r in res]), tol=1e-13)
    checks.close(f"{tag}: input gradients", x_grad, torch.cat([r["x_grad"] for r in res]), tol=1e-13)
    checks.close(f"{tag}: router gradient", grads["router.weight"], full["router.weight"], tol=1e-13)
    expert_err = max(float((full[k] - grads[k]).abs().max()) for k in grads if k.startswith("experts."))
    checks.close(f"{tag}: all expert gradients", 0.0, expert_err, tol=1e-13)
    checks.equal(f"{tag}: dropped assignments", int((~keep).sum()),
                 int(sum((~r["keep"]).sum() for r in res)))
checks

# %% [markdown]
# The dropped counts are the same number computed twice: once by the single-process layer on the
# whole batch, once by the ranks from the exchanged counts; the capacity settings above drop
# a visible share of the assignments, so the rule is exercised, not bypassed.
#
# ## 22c.4 The bytes per step
#
# Let $K_{rs}$ be the kept assignments of rank $r$'s tokens whose expert lives on rank $s$.
# In the forward pass rank $r$ sends $d\,b\sum_{s\ne r}K_{rs}$ bytes in the dispatch and
# $d\,b\sum_{s\ne r}K_{sr}$ in the combine ($b$ bytes per value; rows for its own experts never
# leave it); the backward pass runs both exchanges reversed and sends as much again. Under
# uniform routing an assignment is kept with probability $1-\delta$ and its expert lives on
# another rank with probability $(P-1)/P$, so one training step moves, over all ranks,

# %%
step_bytes = ep.expert_parallel_bytes_symbolic()
n_, k_, d_, b_, P_ = sp.symbols("n k d b P", positive=True, integer=True)
delta = sp.Symbol("delta", nonnegative=True)
display_expr = sp.Eq(sp.Symbol("B_step"), step_bytes)
print(sp.pretty(display_expr, use_unicode=False))
checks = Checks("the derived bytes against chapter 21's all-to-all formula")
for vals in ({n_: 32768, k_: 2, d_: 4096, b_: 2, P_: 8}, {n_: 37, k_: 2, d_: 12, b_: 8, P_: 4}):
    forward_21 = all_to_all_bytes(vals[n_], vals[d_], vals[k_], vals[b_], ep_size=vals[P_])
    checks.close(f"delta = 0, n={vals[n_]}, P={vals[P_]}: B_step = 2 x chapter 21's forward bytes",
                 2 * forward_21, float(step_bytes.subs({**vals, delta: 0})), tol=1e-6)
checks

# %% [markdown]
# twice chapter 21's forward-only $2nkdb\,(P-1)/P$, derived there independently. Now the bytes
# that actually moved: each rank's `AllToAllCounter` records the rows it passed to
# `all_to_all_single` for other ranks, forward and backward; the formula takes $K$ from the
# single-process layer's own routing and keep mask.

# %%
checks = Checks("bytes each rank sent (counter) against the formula from the routing")
for (world_size, cf), (layer, keep, res) in runs.items():
    K = ep.remote_assignments(layer.expert_indices, keep, world_size, layer.num_experts)
    want = ep.expert_parallel_bytes(K, layer.d_model, 8)
    got = [ep.AllToAllCounter(r["calls"]) for r in res]
    checks.equal(f"P={world_size}, CF={cf}: dispatch forward, per rank", want["dispatch"],
                 [c.bytes_sent("dispatch forward") for c in got])
    checks.equal(f"P={world_size}, CF={cf}: whole step (4 all-to-alls), per rank", want["step"],
                 [c.bytes_sent("dispatch") + c.bytes_sent("combine") for c in got])
    meta = sum(c.bytes_sent("counts") for c in got)
    print(f"P={world_size}, CF={cf}: data {sum(want['step'])} bytes, counts {meta} bytes")
checks

# %% [markdown]
# The counts are small beside the data here and vanish beside it at real widths: they grow
# with $N$, the data with $n\,d$.
#
# ## 22c.5 Traffic against the number of ranks
#
# With the routing of one batch fixed, the same layer on $P = 1, 2, 4$ ranks: the measured step
# bytes against the uniform-routing formula with the measured drop fraction. A random router is
# not exactly uniform, so the points scatter around the curve $(P-1)/P$ rather than sit on it.

# %%
torch.manual_seed(7)
layer = MoELayer(16, 24, 8, 2, capacity_factor=1.25, dtype=f64)
n_big = 256
x, grad_out = torch.randn(n_big, 16, dtype=f64, generator=g), torch.randn(n_big, 16, dtype=f64, generator=g)
_, _, _, keep = ep.single_process_reference(layer, x, grad_out)
drop = float((~keep).float().mean())
measured, predicted = {}, {}
for world_size in (1, 2, 4):
    res = run(ep.run_expert_parallel_layer, world_size, layer, x, grad_out, timeout=120)
    measured[world_size] = sum(ep.AllToAllCounter(r["calls"]).bytes_sent("dispatch")
                               + ep.AllToAllCounter(r["calls"]).bytes_sent("combine") for r in res)
    predicted[world_size] = float(step_bytes.subs({n_: n_big, k_: 2, d_: 16, b_: 8, P_: world_size,
                                                   delta: drop}))
print(f"dropped fraction: {drop:.3f}")
for p in measured:
    print(f"P={p}: measured {measured[p]} bytes, uniform formula {predicted[p]:.0f}, "
          f"ratio {measured[p] / predicted[p] if predicted[p] else float('nan'):.2f}")
checks = Checks("measured traffic against the uniform-routing formula")
checks.equal("P=1: nothing crosses", 0, measured[1])
for p in (2, 4):
    checks.close(f"P={p}: measured / formula", 1.0, measured[p] / predicted[p], tol=0.15)
checks

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.8))
ps = [1, 2, 3, 4, 6, 8]
ax.plot(ps, [float(step_bytes.subs({n_: n_big, k_: 2, d_: 16, b_: 8, P_: p, delta: drop})) / 1024 for p in ps],
        "-", label=r"formula $4nk(1-\delta)db\,(P-1)/P$")
ax.plot(list(measured), [v / 1024 for v in measured.values()], "o", label="measured (gloo counters)")
ax.set(xlabel="expert-parallel ranks P", ylabel="bytes sent per step, all ranks (KiB)",
       title=f"All-to-all traffic, one MoE layer (n={n_big}, k=2, d=16)")
ax.legend()
save_figure(fig, "22c_all_to_all_bytes")
plt.show()

# %% [markdown]
# The traffic rises steeply from one rank to two and then flattens towards $4nk(1-\delta)db$:
# adding ranks beyond a few barely changes how much crosses, only how thinly it is spread.
#
# ## 22c.6 Global or local capacity
#
# The same batch with capacity factor 0.75 on 2 ranks, once with the global rule of section
# 22c.2 and once with the capacity applied to each rank's tokens alone. Both equal a
# single-process computation (the whole batch, or each rank's chunk), but they drop different
# assignments.

# %%
torch.manual_seed(11)
layer = MoELayer(12, 20, 4, 2, capacity_factor=0.75, dtype=f64)
x2, grad2 = torch.randn(37, 12, dtype=f64, generator=g), torch.randn(37, 12, dtype=f64, generator=g)
res_g = run(ep.run_expert_parallel_layer, 2, layer, x2, grad2, "global", timeout=120)
res_l = run(ep.run_expert_parallel_layer, 2, layer, x2, grad2, "local", timeout=120)
keep_g = torch.cat([r["keep"] for r in res_g])
keep_l = torch.cat([r["keep"] for r in res_l])
per_chunk = [ep.single_process_reference(layer, x2[c], grad2[c])[3] for c in ep.token_chunks(37, 2)]
print("dropped, global:", int((~keep_g).sum()), " local:", int((~keep_l).sum()),
      " assignments treated differently:", int((keep_g != keep_l).sum()))
checks = Checks("local capacity = the single-process layer on each rank's chunk")
checks.equal("local keep mask = MoELayer on each chunk", torch.cat(per_chunk), keep_l)
checks.true("global and local drop different assignments", bool((keep_g != keep_l).any()))
checks

# %% [markdown]
# ## Summary
#
# * An expert-parallel MoE layer routes locally, exchanges per-expert counts, dispatches the
#   kept copies with an all-to-all of variable splits, runs its local experts, and combines
#   with the reverse all-to-all; the backward pass of an all-to-all is the all-to-all with the
#   splits swapped.
# * Chapter 21's capacity rule survives the split: ordering assignments by (slot, rank, token)
#   and sharing the $k\times N$ counts lets every rank drop exactly what the single-process layer
#   drops, before sending anything. The per-rank (local) capacity of production systems drops
#   different tokens.
# * On gloo, on 2 and 4 ranks, outputs, input gradients, router and expert gradients equal the
#   single-process layer to float64 round-off, with and without dropped tokens.
# * One training step sends $4d\,b\sum_{r\ne s}K_{rs}$ bytes, exactly what the ranks' counters
#   measured; under uniform routing $4nk(1-\delta)db\,(P-1)/P$, twice chapter 21's forward
#   traffic.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/22c_expert_parallelism.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 22c` writes a stub
# of every function, `llmbook grade 22c` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_22c.py` runs
# the same checks on the reference.
#
# 1. **Uneven ranks.** With $n_r$ tokens on rank $r$ and uniform routing, derive the expected
#    bytes rank $r$ sends in one step (dispatch and combine, forward and backward). Show that
#    they sum over ranks to $4nk(1-\delta)db\,(P-1)/P$, and that a rank with more tokens sends
#    more only through its dispatch.
# 2. **The price of the counts.** Write the bytes a rank spends on metadata per forward pass:
#    the counts all-to-all ($N(P-1)/P$ integers of 8 bytes) and, for the global capacity, the
#    all-gather of its $k\times N$ counts to $P-1$ ranks. Check your formula against the
#    counters of a real run, and find the width $d$ above which the metadata is under 1 % of
#    the data for $N=64$, $k=2$, $P=8$, 4096 tokens per rank, bfloat16.
# 3. **Split invariance.** Show with `keep_mask_across_ranks` that the global rule's dropped
#    set does not depend on how the batch is split over ranks (1, 2, 3 or 4 ranks), while the
#    local rule's does.

# %%
from llmbook.workbench import grade

grade("22c", globals())
