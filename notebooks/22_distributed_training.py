# %% [markdown]
# # 22 Distributed training, run for real
#
# A model that does not fit on one accelerator, or trains too slowly on one, is trained on
# many. This chapter does not simulate that in one process: every example runs on several
# real processes joined by `torch.distributed`, the engine users scale out on, with the
# `gloo` backend on the CPU (the same code runs with NCCL on GPUs). The chapter:
#
# 1. explains **process groups, ranks, the launcher and the collectives** (all-reduce,
#    reduce-scatter, all-gather, broadcast), and shows all-reduce = reduce-scatter + all-gather;
# 2. **derives** the cost of the ring all-reduce, $2(p-1)\alpha + 2\frac{p-1}{p} n\beta$, with
#    SymPy by counting messages, **implements** the ring with `isend`/`irecv`, verifies it equals
#    `dist.all_reduce` and sends exactly $2\frac{p-1}{p}n$ bytes, and **measures** the
#    $\alpha$–$\beta$ model on this machine;
# 3. builds **data parallelism** with gradient buckets and backward hooks, and checks that it
#    trains to the same parameters as one process on the whole batch and as PyTorch's DDP;
# 4. builds **ZeRO stages 1–3**, checks the trajectory against unsharded training and PyTorch's
#    FSDP2, and matches the bytes each rank holds to the formulas of Rajbhandari et al. (2020);
# 5. explains **mixed precision**: why float16 needs loss scaling, why bfloat16 needs float32
#    master weights, the 16 bytes per parameter, and a dynamic loss scaler checked against
#    `torch.amp.GradScaler`;
# 6. then tensor parallelism, pipeline parallelism and a cost model for clusters (sections
#    22.7–22.9), with the sensitivity of its best layout to a guessed overlap, the all-to-all
#    of expert parallelism, and the grade of claim C19.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import sympy as sp
import torch
import torch.nn.functional as F
from IPython.display import display

from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.scale import collectives, data_parallel, zero
from llmbook.scale import cost_model as cm
from llmbook.scale import pipeline as pp
from llmbook.scale import tensor_parallel as tp
from llmbook.scale.collectives import (
    alpha_beta_time,
    fit_alpha_beta,
    naive_all_reduce_cost_symbolic,
    ring_all_reduce_cost_symbolic,
    ring_schedule,
)
from llmbook.scale.launch import run
from llmbook.scale.mixed_precision import (
    DynamicLossScaler,
    MasterWeightOptimizer,
    half_ulp,
    mixed_precision_bytes_symbolic,
    scaler_trajectory,
)
from llmbook.scale.moe import all_to_all_bytes
from llmbook.scale.zero import zero_memory_per_rank, zero_memory_per_rank_symbolic
from llmbook.training.optim import AdamW
from llmbook.transformer.attention import MultiHeadAttention
from llmbook.transformer.layers import MLP

g = seed_everything(0)
torch.set_num_threads(1)
f64 = torch.float64

# %% [markdown]
# ## 22.1 Process groups, ranks, the launcher, the collectives
#
# A distributed job is $p$ processes, one per accelerator (here: per CPU process). Each is a
# **rank** $r \in \{0, \dots, p-1\}$ of a **process group** of size $p$, the *world size*. A
# **launcher** starts the processes and tells each its rank, the world size and where to meet
# (PyTorch's `torchrun` passes them in environment variables); each process then calls
# `torch.distributed.init_process_group(backend, ...)`, after which the ranks can exchange
# tensors. The **backend** moves the bytes: NCCL between GPUs, gloo between CPU processes (over
# TCP, here the loopback interface).
#
# The book's launcher, `llmbook.scale.launch.run(fn, p, *args)`, does what `torchrun` does from
# inside Python: it starts $p$ processes, joins them in a gloo group, calls
# `fn(rank, p, *args)` in each and returns the list of their results; a failing or hanging
# rank raises instead of hanging the notebook.
#
# Communication happens through **collectives**, which all ranks call together. With each rank
# $r$ holding a tensor $x_r$:
#
# | collective | rank $r$ ends with |
# |---|---|
# | broadcast (from 0) | $x_0$ |
# | all-reduce | $\sum_s x_s$ |
# | reduce-scatter | chunk $r$ of $\sum_s x_s$ |
# | all-gather | the concatenation of every rank's chunk |
#
# Four ranks run the four of them; rank $r$ starts from $x_r = [10r, 10r+1, \dots, 10r+7]$.

# %%
show_source(collectives.collectives_tour_worker)

# %%
tour = run(collectives.collectives_tour_worker, 4)
for name in tour[0]:
    print(f"{name:31s}", " | ".join(" ".join(f"{v:3.0f}" for v in t[name].tolist()) for t in tour))

# %% [markdown]
# Reduce-scatter leaves rank $r$ with the $r$-th chunk of the sum (two numbers each); an
# all-gather of those chunks gives every rank the whole sum: **all-reduce = reduce-scatter +
# all-gather**. That identity is the backbone of everything below: the ring all-reduce is built
# that way, and ZeRO splits the two halves apart.

# %%
checks = Checks("collectives on 4 real processes")
expected_sum = sum(t["x"] for t in tour)
for r, t in enumerate(tour):
    checks.equal(f"rank {r}: all-reduce = sum of x_r", expected_sum, t["all_reduce"])
    checks.equal(f"rank {r}: reduce-scatter + all-gather = all-reduce", t["all_reduce"],
                 t["reduce_scatter_then_all_gather"])
checks.equal("rank 2's reduce-scatter chunk = entries 4:6 of the sum", expected_sum[4:6], tour[2]["reduce_scatter"])
checks

# %% [markdown]
# ## 22.2 The ring all-reduce
#
# **The algorithm.** Cut each rank's tensor of $n$ numbers into $p$ chunks and arrange the
# ranks in a ring. In each of $p-1$ *reduce-scatter* steps, every rank sends one chunk to its
# right neighbour and adds the chunk it receives from its left neighbour into its own copy;
# after $p-1$ steps rank $r$ holds chunk $r$ summed over all ranks. In $p-1$ *all-gather* steps
# every rank forwards the completed chunk it received last. The schedule for $p = 4$:

# %%
schedule = ring_schedule(4)
for phase in ("reduce-scatter", "all-gather"):
    for s in range(3):
        step = [m for m in schedule if m.phase == phase and m.step == s]
        print(f"{phase:14s} step {s}:", ",  ".join(f"{m.src}→{m.dst} chunk {m.chunk}" for m in step))
print("messages per rank:", sum(m.src == 0 for m in schedule), "= 2(p - 1)")

# %% [markdown]
# **The cost.** In the $\alpha$–$\beta$ model (Hockney's; Thakur, Rabenseifner & Gropp, 2005)
# a message of $m$ bytes costs $\alpha + m\beta$: a latency $\alpha$ and an inverse bandwidth
# $\beta$. In a ring step every rank sends one message of $n/p$ bytes, and all links work at
# once, so a step costs $\alpha + \frac{n}{p}\beta$. SymPy sums the steps of both phases:

# %%
cost = ring_all_reduce_cost_symbolic()
p, n, alpha, beta = sp.symbols("p n alpha beta", positive=True)
assert sp.simplify(cost["all_reduce"] - (2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta)) == 0
assert sp.simplify(cost["bytes_per_rank"] - 2 * (p - 1) / p * n) == 0
naive = naive_all_reduce_cost_symbolic()
display(sp.Eq(sp.Symbol("T_{ring}"), sp.collect(cost["all_reduce"], [alpha, beta])),
        sp.Eq(sp.Symbol("T_{reduce+broadcast}"), sp.collect(naive, [alpha, beta])),
        sp.Eq(sp.Symbol(r"\lim_{p\to\infty} T_{ring}/(n\beta)"),
              sp.limit(cost["all_reduce"].subs(alpha, 0) / (n * beta), p, sp.oo)))

# %% [markdown]
# Each rank sends $2\frac{p-1}{p}n$ bytes, less than $2n$ however many ranks there are;
# Patarasuk & Yuan (2009) prove no all-reduce can send less per rank. Reducing everything to
# one root and broadcasting back would push $2(p-1)n$ bytes through the root's link. The price
# is $2(p-1)$ latencies, which dominates for small messages (tree and recursive-halving
# algorithms trade the other way; exercise 1).
#
# **The implementation.** The reduce-scatter half, with non-blocking `isend`/`irecv`: if every
# rank first called a blocking `send` to its right neighbour, all would wait for a receiver
# that is itself still sending.

# %%
show_source(collectives.ring_reduce_scatter_)

# %%
show_source(collectives._exchange)

# %% [markdown]
# The all-gather half is the same loop with the received chunk copied instead of added;
# `ring_all_reduce_` runs the two. On 2, 3 and 4 processes, in float64, with $n = 24$ (divisible
# by each $p$) and $n = 25$ (not: the chunks differ by one element), the ring must give what
# `dist.all_reduce` gives, up to the order of the additions, and each rank must have sent
# $2\frac{p-1}{p} \cdot 8n$ bytes when $p$ divides $n$.

# %%
checks = Checks("the book's ring all-reduce against dist.all_reduce (float64)")
for world in (2, 3, 4):
    for numel in (24, 25):
        res = run(collectives.ring_versus_dist_worker, world, numel, 10 * world)
        exact = sum(r["x"] for r in res)
        err = max(float((r["ring"] - r["dist"]).abs().max()) for r in res)
        checks.close(f"p={world}, n={numel}: ring = dist.all_reduce", 0.0, err, tol=1e-13)
        if numel % world == 0:
            checks.equal(f"p={world}, n={numel}: bytes sent per rank = 2(p-1)/p·8n",
                         [2 * (world - 1) * 8 * numel // world] * world, [r["bytes_sent"] for r in res])
checks.close("p=4, n=25: ring = sum of the x_r", exact, res[0]["ring"], tol=1e-13)
checks

# %% [markdown]
# **Measuring $\alpha$ and $\beta$.** `benchmarks/allreduce.py` times `dist.all_reduce` and
# the book's ring on 2 and 4 processes for messages of 4 KiB to 16 MiB and fits the model by
# least squares (`fit_alpha_beta`: the model is linear in $\alpha$ and $\beta$); the results
# are in `benchmarks/results/allreduce.json`. The cell below re-measures three sizes on two
# processes. The printed numbers depend on the machine and on what else runs on it, so the
# cell's output is not compared when the book is tested.

# %%
show_source(fit_alpha_beta)

# %% tags=["nbval-ignore-output"]
sizes = [2**10, 2**16, 2**20]
per_rank = run(collectives.all_reduce_timing_worker, 2, sizes, 3, "dist")
now = [max(t) for t in zip(*per_rank, strict=True)]
a_now, b_now = fit_alpha_beta([4 * s for s in sizes], now, 2)
print("re-measured now, p = 2, dist.all_reduce:",
      ", ".join(f"{4 * s / 1024:.0f} KiB: {t * 1e3:.2f} ms" for s, t in zip(sizes, now, strict=True)))
print(f"  fit: alpha = {a_now * 1e6:.0f} us, beta = {b_now * 1e9:.2f} ns/byte")
bench = json.loads((Path("..") / "benchmarks/results/allreduce.json").read_text())
for series in bench["results"]:
    print(f"benchmark p={series['world_size']} {series['implementation']:4s}: alpha = "
          f"{series['alpha_s'] * 1e6:6.0f} us, beta = {series['beta_s_per_byte'] * 1e9:.2f} ns/byte")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
for ax, world in zip(axes, (2, 4), strict=True):
    for series, color in zip([s for s in bench["results"] if s["world_size"] == world], ("C0", "C1"), strict=True):
        nb = torch.tensor(series["bytes"], dtype=torch.float64)
        ax.loglog(nb, torch.tensor(series["seconds"]) * 1e3, "o", color=color,
                  label=f"{series['implementation']} (measured)")
        fit = alpha_beta_time(nb, world, series["alpha_s"], series["beta_s_per_byte"])
        ax.loglog(nb, fit * 1e3, "-", color=color, alpha=0.6, label=f"{series['implementation']} (α–β fit)")
    ax.set(title=f"all-reduce on {world} CPU processes (gloo)", xlabel="message size (bytes)")
    ax.legend(fontsize="small")
axes[0].set_ylabel("time per all-reduce (ms)")
save_figure(fig, "22_allreduce_time")
plt.show()

# %% [markdown]
# Below some tens of KiB the time barely depends on the size: the latency terms
# $2(p-1)\alpha$ dominate, and they grow with $p$ (the book's ring, driven from Python, pays
# more per message than gloo's C++ one). For megabytes the time grows linearly with the size,
# at a slope set by $\beta$, the inverse of the bandwidth. One might expect processes on one
# machine to move bytes faster than any network, but gloo sends them through the loopback's
# TCP stack, copying each one several times, on two cores shared with everything else: the
# fitted $\beta$ is *larger* (the bandwidth smaller) than a cluster's, as the benchmark's own
# numbers show against the links the cost model of section 22.9 assumes:

# %%
ib, nvlink = cm.a100_cluster(8).inter_bandwidth, cm.a100_cluster(8).intra_bandwidth
checks = Checks("fitted beta (benchmark) against a cluster's links: beta = 1 / bandwidth")
for series in bench["results"]:
    b_fit = series["beta_s_per_byte"]
    print(f"p={series['world_size']} {series['implementation']:4s}: beta = {b_fit * 1e9:.1f} ns/byte, "
          f"{1 / b_fit / 1e9:.1f} GB/s; {b_fit * ib:.0f}x InfiniBand's beta, {b_fit * nvlink:.0f}x NVLink's")
    checks.true(f"p={series['world_size']} {series['implementation']}: fitted beta > InfiniBand's 1/(25 GB/s)",
                b_fit > 1 / ib, got=b_fit)
checks

# %% [markdown]
# Gloo on this machine moves a byte some tens of times slower than an A100's InfiniBand link
# and hundreds of times slower than NVLink. What carries over to a cluster is the *shape* of the
# model, $\alpha$ plus $\beta$ per byte, which section 22.9 uses with the links' published
# bandwidths.
#
# ## 22.3 Data parallelism
#
# Each rank holds the whole model and takes $B/p$ of the batch's $B$ examples. The gradient of
# the mean loss is the mean of the ranks' gradients, each of the mean over the rank's own
# examples (when they all have $B/p$ examples), so **one all-reduce and a division by $p$**
# make every rank's gradient the full-batch gradient. SymPy, for $B = 6$ per-example gradients
# on $p = 3$ ranks:

# %%
gs = sp.symbols("g0:6")
full_batch = sum(gs) / 6
per_rank_mean = [sum(gs[2 * r:2 * r + 2]) / 2 for r in range(3)]
assert sp.simplify(sum(per_rank_mean) / 3 - full_batch) == 0
display(sp.Eq(sp.Symbol(r"\frac{1}{p}\sum_r \bar g_r"), sp.expand(sum(per_rank_mean) / 3)))

# %% [markdown]
# PyTorch's `DistributedDataParallel` (Li et al., 2020) adds two ideas that make the
# all-reduce nearly free. **Buckets**: one all-reduce per parameter would pay the latency
# $\alpha$ hundreds of times, one for the whole model would wait for the whole backward, so
# gradients are grouped into buckets of ~25 MB. **Overlap**: backward produces the last
# layers' gradients first; a hook on each parameter notices when its gradient is ready, and
# as soon as a bucket is complete its all-reduce starts asynchronously while backward
# continues with earlier layers. The book's `BucketedDataParallel` does both:

# %%
show_source(data_parallel.BucketedDataParallel._gradient_ready)

# %%
show_source(data_parallel.BucketedDataParallel.finish_gradient_sync)

# %% [markdown]
# The experiment: the book's `TransformerLM` (chapter 6), tiny ($V=32$, $d=16$, 2 layers,
# 7 232 parameters), in float64, trained for 4 AdamW steps on batches of 8 sequences. Once in
# one process on the whole batch; then on 2 processes with `BucketedDataParallel` (buckets of
# 4 KiB) and with `torch.nn.parallel.DistributedDataParallel`, each rank taking 4 sequences.
# Each rank builds its model from a *different* seed: the wrapper's initial broadcast must make
# the replicas equal.

# %%
show_source(data_parallel.ddp_train_worker)

# %% [markdown]
# The loop itself is one function, shared with the single-process reference (and with the
# workbench's Part VI check, where the reader's own all-reduce averages the gradients):
# each rank takes its slice of every global batch, and `sync` runs between the backward
# and the optimiser step.

# %%
show_source(data_parallel.train_steps)

# %%
spec = {"seed": 0, "steps": 4, "batch_size": 8, "lr": 1e-2, "bucket_cap_bytes": 4096}
reference, ref_losses = data_parallel.train_single_process(spec)
book = run(data_parallel.ddp_train_worker, 2, spec | {"implementation": "book"})
torch_ddp = run(data_parallel.ddp_train_worker, 2, spec | {"implementation": "torch"})
print(f"the model: {data_parallel.tiny_language_model(spec['seed']).num_parameters():,} parameters")


def max_state_error(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


checks = Checks("data parallelism on 2 processes vs one process on the whole batch (float64)")
checks.close("book DDP rank 0 = single process", 0.0, max_state_error(book[0]["state"], reference), tol=1e-12)
checks.close("torch DDP rank 0 = single process", 0.0, max_state_error(torch_ddp[0]["state"], reference), tol=1e-12)
checks.close("book DDP = torch DDP", 0.0, max_state_error(book[0]["state"], torch_ddp[0]["state"]), tol=1e-12)
checks.equal("book DDP: replicas identical (rank 0 vs rank 1)", 0.0, max_state_error(book[0]["state"], book[1]["state"]))
checks.close("mean of the ranks' losses = full-batch loss (step 1)", ref_losses[0],
             (book[0]["losses"][0] + book[1]["losses"][0]) / 2, tol=1e-12)
checks

# %% [markdown]
# The replicas are equal bit for bit (they apply the same averaged gradient), and equal to
# single-process training up to round-off: the sums are taken in a different order.
#
# **Overlap, seen.** The log of the last backward lists each bucket when its all-reduce was
# launched, with the number of parameters whose gradients backward had not produced yet:

# %%
print("bucket sizes (parameters per bucket):", book[0]["bucket_sizes"])
for index, waiting in book[0]["launch_log"]:
    print(f"bucket {index} launched while {waiting:2d} parameters still waited for their gradient")
checks = Checks("gradient hooks launch all-reduces during backward")
log = book[0]["launch_log"]
checks.equal("every bucket launched once", sorted(range(len(book[0]["bucket_sizes"]))), sorted(i for i, _ in log))
checks.true("first bucket launched while backward still had work", log[0][1] > 0, got=log[0][1])
checks.equal("only the last bucket waits for the end of backward", 0, log[-1][1])
checks

# %% [markdown]
# All buckets but the last go out while backward is still computing. With gloo on a CPU the
# all-reduce and the backward compete for the same cores, so the time saved here is modest; on
# GPUs, where NCCL moves data while the GPU computes, this overlap hides most of the
# communication (Li et al., 2020, section 5).
#
# ## 22.4 ZeRO: sharding optimizer states, gradients and parameters
#
# Data parallelism replicates everything. Count the bytes per parameter with mixed precision
# and Adam (section 22.6 derives them): $2$ for the 16-bit weight, $2$ for its gradient and
# $K = 12$ for the optimizer (float32 master weight, first and second moment). ZeRO
# (Rajbhandari et al., 2020) shards these across the $N$ data-parallel ranks in stages:
# stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the weights. With
# $b_w$, $b_g$ and $K$ bytes per parameter, SymPy writes the per-rank memory of each stage:

# %%
formulas = zero_memory_per_rank_symbolic()
Psi, N, b_w, b_g, K = sp.symbols("Psi N b_w b_g K", positive=True)
for stage, expr in formulas.items():
    display(sp.Eq(sp.Symbol(f"M_{stage}"), sp.factor_terms(expr)))
mixed = {b_w: 2, b_g: 2, K: 12}
paper = {stage: float(expr.subs(mixed | {Psi: 7.5e9, N: 64})) / 1e9 for stage, expr in formulas.items()}
print("7.5B parameters, N = 64, mixed precision (K = 12), GB per rank:",
      ", ".join(f"stage {s}: {v:.1f}" for s, v in paper.items()))

# %%
checks = Checks("ZeRO formulas against the paper's Figure 1 (Psi = 7.5B, N = 64)")
for stage, gb in zip(range(4), (120, 31.4, 16.6, 1.9), strict=True):
    checks.close(f"stage {stage}: GB per rank", gb, paper[stage], tol=0.05)
checks

# %% [markdown]
# **The implementation.** `ZeroTrainer` shards an `nn.Sequential` unit by unit (each child
# layer is a *unit*, as FSDP wraps layers): a unit's parameters are flattened, padded to a
# multiple of $N$ and cut into $N$ shards. Rank $r$ keeps the master weights and Adam moments
# of its shard only (stage ≥ 1), reduce-scatters gradients instead of all-reducing them and
# keeps only its gradient shard (stage ≥ 2), and in stage 3 keeps only its shard of the
# weights: before a unit computes, an all-gather rebuilds its weights, which are freed right
# after. In the backward, stage 3 gathers the unit again and recomputes its forward
# (activation checkpointing) before back-propagating through it:

# %%
show_source(zero.ZeroTrainer._forward_backward_sharded)

# %% [markdown]
# The experiment: a 616-parameter MLP ($12\to16\to16\to8$, three linear units of 208, 272
# and 136 parameters, each divisible by 4) in float64, 4 AdamW steps on batches of 8, on 4
# processes, at every stage; and the same training in one process without any sharding. Adam
# is elementwise, so updating each shard separately is the same update; the trajectories must
# agree to round-off.

# %%
zspec = {"seed": 0, "steps": 4, "batch_size": 8, "lr": 1e-2, "weight_decay": 0.01}
unsharded, _ = zero.train_unsharded(zspec)
runs = {stage: run(zero.zero_train_worker, 4, zspec | {"stage": stage}) for stage in range(4)}


def max_param_error(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


checks = Checks("ZeRO stages 0-3 on 4 processes vs unsharded training (float64)")
for stage, res in runs.items():
    err = max(max_param_error(r["params"], unsharded) for r in res)
    checks.close(f"stage {stage}: parameters after 4 steps (all ranks)", 0.0, err, tol=1e-12)
checks

# %% [markdown]
# **Memory, counted.** `rank_memory` adds up `numel * element_size` over the distinct storages
# a rank actually keeps after a step: the model's parameters that still have storage and the
# parameter shards; the gradients and gradient buffers; the master weights and every
# non-scalar optimizer state. In this float64 run $b_w = b_g = 8$ and the optimizer holds an
# 8-byte master copy and two 8-byte moments, $K = 24$, with $\Psi = 616$ and $N = 4$. A second
# run keeps the model in bfloat16 with float32 master weights and moments, the paper's mixed
# precision, where the formula has $b_w = b_g = 2$ and $K = 12$.

# %%
bf16_runs = {stage: run(zero.zero_train_worker, 4, zspec | {"stage": stage, "dtype": "bfloat16",
                                                          "master_dtype": "float32"})
             for stage in range(4)}
psi = sum(t.numel() for t in unsharded)
print(f"Psi = {psi} parameters; bytes held by rank 0 after a step (measured | formula):")
print(f"{'':9s} {'float64, K = 24':>38s}   {'bf16 + fp32 master, K = 12':>34s}")
checks = Checks("measured bytes per rank = ZeRO formula")
for stage in range(4):
    m64, m16 = runs[stage][0]["memory"], bf16_runs[stage][0]["memory"]
    formula64, formula16 = zero_memory_per_rank(stage, psi, 4, 8, 8, 24), zero_memory_per_rank(stage, psi, 4, 2, 2, 12)
    print(f"stage {stage}: {m64['params']:5d} {m64['grads']:5d} {m64['optimizer']:6d} = {sum(m64.values()):6d}"
          f" | {sum(formula64.values()):6d}    {m16['params']:4d} {m16['grads']:4d} {m16['optimizer']:5d} = "
          f"{sum(m16.values()):5d} | {sum(formula16.values()):5d}")
    checks.equal(f"stage {stage}, float64: params, grads, optimizer", list(formula64.values()), list(m64.values()))
    checks.equal(f"stage {stage}, bf16/fp32: params, grads, optimizer", list(formula16.values()), list(m16.values()))
    checks.equal(f"stage {stage}, float64: SymPy M_{stage} at Psi = {psi}, N = 4 = measured total",
                 int(formulas[stage].subs({Psi: psi, N: 4, b_w: 8, b_g: 8, K: 24})), sum(m64.values()))
checks.equal("bf16/fp32 stage 0 = 16 bytes per parameter", 16 * psi, sum(bf16_runs[0][0]["memory"].values()))
checks

# %% [markdown]
# The counted bytes equal the formula exactly at every stage, for both precisions. Between
# steps that is all a rank keeps. *During* a step there is more: stage 3 rebuilds one unit's
# full weights (and its gradient) at a time, and the book's stage 2 reduce-scatters after the
# whole backward, so the full gradient exists for a moment (DeepSpeed reduce-scatters bucket by
# bucket during backward to avoid that). `ZeroTrainer` records the largest total it held at any
# point of the step (activations not counted):

# %%
peaks = [runs[s][0]["peak"] for s in range(4)]
steady = [sum(runs[s][0]["memory"].values()) for s in range(4)]
print("float64 bytes per rank, after the step:", steady)
print("float64 bytes per rank, peak in a step: ", peaks)
checks = Checks("peaks")
checks.true("peak falls with every stage", all(a > b for a, b in zip(peaks, peaks[1:], strict=False)), got=peaks)
checks.true("stage 3 peak < stage 0 peak / 2", peaks[3] < peaks[0] / 2, got=peaks[3] / peaks[0])
checks

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
bottom = [0] * 4
for category, color in zip(("params", "grads", "optimizer"), ("C0", "C1", "C2"), strict=True):
    heights = [runs[s][0]["memory"][category] for s in range(4)]
    ax.bar(range(4), heights, bottom=bottom, color=color, label=f"{category} (measured)")
    bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
ax.plot(range(4), peaks, "k_", markersize=30, mew=2, label="peak during the step")
ax.set(xticks=range(4), xticklabels=["0 (DP)", "1 (P_os)", "2 (P_os+g)", "3 (P_os+g+p)"],
       xlabel="ZeRO stage", ylabel="bytes per rank",
       title="Bytes held per rank, 616-parameter MLP, float64, N = 4")
ax.legend(fontsize="small")
save_figure(fig, "22_zero_memory")
plt.show()

# %% [markdown]
# The optimizer states, the largest block, shrink by $N$ at stage 1; the gradients at stage 2;
# the weights at stage 3, where everything is divided by $N$. The peaks sit well above the
# steady state here because one unit of this tiny MLP is 44 % of the model: stage 3 holds that
# unit's full weights and gradient while it computes. In a model of many layers a unit is a
# small fraction, and the peak approaches the steady state.
#
# ## 22.5 PyTorch's FSDP2
#
# PyTorch's fully sharded data parallelism (Zhao et al., 2023) is ZeRO stage 3. Its second
# version, `torch.distributed.fsdp.fully_shard` ("FSDP2"), turns each parameter into a
# `DTensor` sharded along its first dimension, all-gathers a wrapped module's parameters in a
# forward pre-hook and frees them after, and reduce-scatters the gradients in backward. It runs
# on gloo and the CPU in torch 2.13. The same training, wrapping each linear layer and the root,
# with `torch.optim.AdamW`:

# %%
fsdp = run(zero.fsdp2_train_worker, 4, zspec)
print("rank 0's local parameter shards:", fsdp[0]["local_shapes"])
checks = Checks("FSDP2 (fully_shard) vs the book's ZeRO-3, 4 processes, float64")
checks.close("FSDP2 = unsharded training", 0.0, max(max_param_error(r["params"], unsharded) for r in fsdp), tol=1e-12)
checks.close("FSDP2 = book's stage 3", 0.0, max_param_error(fsdp[0]["params"], runs[3][0]["params"]), tol=1e-12)
checks.equal("rank's parameter bytes: FSDP2 = book's stage 3 (Psi/N · 8)", runs[3][0]["memory"]["params"],
             fsdp[0]["param_bytes"])
checks.equal("rank's optimizer bytes: FSDP2 (m, v) = book's minus its master shard",
             runs[3][0]["memory"]["optimizer"] - 8 * psi // 4, fsdp[0]["optimizer_bytes"])
checks

# %% [markdown]
# Same trajectory, same bytes of parameters per rank. Two differences of design: FSDP2 shards
# each parameter by rows (a $16\times12$ weight gives each of 4 ranks a $4\times12$ block)
# where the book flattens a unit into one buffer; and in full precision FSDP2 keeps no separate
# master copy (its optimizer steps the sharded parameters themselves), while the book keeps one,
# as it must in mixed precision.
#
# ## 22.6 Mixed precision
#
# **Memory.** Micikevicius et al. (2018) compute in 16 bits and keep a float32 *master* copy of
# the weights, which the optimizer updates. Counting bits per parameter:

# %%
per_param = mixed_precision_bytes_symbolic()
for name, value in per_param.items():
    print(f"{name:22s} {value} bytes")
# independently, from torch's own sizes of the dtypes: 2 bf16 copies and 3 fp32 ones
by_dtype = 2 * torch.bfloat16.itemsize + 3 * torch.float32.itemsize
assert per_param["total"] == by_dtype == 16 and per_param["K (optimizer states)"] == 3 * torch.float32.itemsize

# %% [markdown]
# 16 bytes per parameter: a 7B model needs 112 GB for its training state before any
# activation, which is why ZeRO shards it. Float32 training also needs 16 (4 + 4 + 4 + 4, the
# weights being their own master); mixed precision saves activation memory and time
# (16-bit matrix units), not state memory. What the master copy and loss scaling buy is
# *correctness*, in two different ways.
#
# **float16: range.** float16 has 5 exponent bits: its smallest positive (subnormal) number is
# $2^{-24} \approx 6\cdot10^{-8}$. Small gradients, common deep in a network, flush to zero.
# A real float16 backward through a linear layer whose gradients are about $2^{-26}$:

# %%
w16 = torch.randn(6, 5, generator=g).half().requires_grad_()
x16 = (torch.rand(4, 6, generator=g) + 0.5).half()
tiny = 2.0**-28  # the upstream gradient: the layer's weight gradient is x^T · tiny
exact = (x16.double().T @ torch.full((4, 5), tiny, dtype=torch.float64))
(x16 @ w16).backward(torch.full((4, 5), tiny).half())
plain = w16.grad.clone()
w16.grad = None
S = 2.0**16
(x16 @ w16).backward(torch.full((4, 5), tiny * S).half())  # = backward of S * loss
rescued = w16.grad.float() / S
checks = Checks("a float16 gradient that underflows, and loss scaling")
checks.equal("without scaling: gradient entries that are exactly 0 (of 30)", 30, int((plain == 0).sum()))
checks.equal("with S = 2^16: entries that are 0", 0, int((rescued == 0).sum()))
rel_err = float(((rescued.double() - exact) / exact).abs().max())
checks.true("with S = 2^16, unscaled in float32: relative error < 2e-3 (float16's ulp)", rel_err < 2e-3)
checks

# %% [markdown]
# The chain rule is linear, so scaling the loss by $S$ scales every gradient by $S$; the
# unscaling happens in float32, where $2^{-26}$ is an ordinary number. Too large an $S$
# overflows (float16's largest number is 65 504), hence a **dynamic** scale: start high; on a
# step whose gradients hold an inf or a NaN, skip the update and halve $S$; after $N$ good
# steps in a row, double it.

# %%
show_source(DynamicLossScaler.update)

# %% [markdown]
# `torch.amp.GradScaler` runs on the CPU in torch 2.13, so the two scalers can be driven
# through the same sequence of gradients: a one-parameter model whose gradient is mostly
# $10^{-3}$, with two spikes (1 and 10) that overflow float16 once scaled, and a growth
# interval of 3 good steps.

# %%
grads = [1e-3] * 3 + [1.0] + [1e-3] * 6 + [10.0] + [1e-3] * 5 + [1.0] + [1e-3] * 3
ours = scaler_trajectory(DynamicLossScaler(init_scale=2.0**16, growth_interval=3), grads)
theirs = scaler_trajectory(torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=3), grads)
print("step  gradient   scale (book)  stepped | scale (torch)  stepped")
for t, (gt, (s1, k1), (s2, k2)) in enumerate(zip(grads, ours, theirs, strict=True)):
    print(f"{t:4d} {gt:9g} {s1:14.0f} {k1!s:>8s} | {s2:13.0f} {k2!s:>8s}")
checks = Checks("the book's DynamicLossScaler against torch.amp.GradScaler")
checks.equal("scale at every step", [s for s, _ in theirs], [s for s, _ in ours])
checks.equal("steps skipped", [t for t, (_, k) in enumerate(theirs) if not k], [t for t, (_, k) in enumerate(ours) if not k])
checks

# %%
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.step(range(len(grads)), [s for s, _ in ours], where="post", label="book's DynamicLossScaler")
ax.plot(range(len(grads)), [s for s, _ in theirs], "x", color="C1", label="torch.amp.GradScaler")
skipped = [t for t, (_, k) in enumerate(ours) if not k]
ax.plot(skipped, [ours[t][0] for t in skipped], "o", mfc="none", color="C3", markersize=12, label="overflow: step skipped")
ax.set(yscale="log", xlabel="step", ylabel="loss scale S", title="Dynamic loss scaling (growth interval 3)")
ax.legend(fontsize="small")
save_figure(fig, "22_loss_scale")
plt.show()

# %% [markdown]
# Each spike overflows: the step is skipped and $S$ halves; after three good steps $S$ doubles
# again, probing upward until the next overflow. The two scalers agree at every step.
#
# **bfloat16: precision.** bfloat16 keeps float32's 8 exponent bits (so no underflow problem:
# loss scaling is unnecessary) but only 8 significant bits. Around $w = 1$ its numbers are
# $2^{-7}$ apart, and an update smaller than half that spacing rounds back to $w$. A hundred
# SGD updates of $-10^{-3}$:

# %%
w_bf16 = torch.tensor(1.0, dtype=torch.bfloat16)
master = torch.tensor(1.0, dtype=torch.float32)
for _ in range(100):
    w_bf16 = w_bf16 - torch.tensor(1e-3, dtype=torch.bfloat16)
    master = master - 1e-3
print("half an ulp of bfloat16 at 1:", float(half_ulp(torch.tensor(1.0), torch.bfloat16)))
print("bf16 weight after 100 updates:", float(w_bf16), "| fp32 master:", round(float(master), 4),
      "-> cast to bf16:", float(master.bfloat16()))
assert float(w_bf16) == 1.0 and float(master.bfloat16()) == 0.8984375

# %% [markdown]
# Without a master copy the weight never moves; with it, the updates accumulate in float32 and
# the bfloat16 weight follows. The same on a model: the section-22.4 MLP trained for 300 AdamW
# steps (learning rate $10^{-3}$) in float32, in pure bfloat16, and in bfloat16 with float32
# master weights (`MasterWeightOptimizer`). The loss is the mean over the last 50 steps.

# %%
show_source(MasterWeightOptimizer.step)

# %%
xs, ys = zero.make_regression_batches(300, 32, seed=1, dtype=torch.float32)


def train_precision(mode):
    model = zero.tiny_mlp(0, dtype=torch.float32 if mode == "float32" else torch.bfloat16)
    make = lambda ps: AdamW(ps, lr=1e-3, weight_decay=0.0)  # noqa: E731
    opt = MasterWeightOptimizer(model.parameters(), make) if mode == "master" else make(list(model.parameters()))
    dtype, losses = next(model.parameters()).dtype, []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        loss = F.mse_loss(model(x.to(dtype)).float(), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return sum(losses[-50:]) / 50


final = {mode: train_precision(mode) for mode in ("float32", "bfloat16", "master")}
checks = Checks("bfloat16 training with and without float32 master weights")
checks.true("bf16 + fp32 master within 3 % of float32", abs(final["master"] / final["float32"] - 1) < 0.03)
checks.true("pure bf16 > 10 % worse than float32", final["bfloat16"] / final["float32"] > 1.10)
checks

# %% [markdown]
# With master weights the bfloat16 run tracks float32 training; without them the small late
# updates are rounded away and the loss stalls higher.

# %% [markdown]
# ## 22.7 Tensor parallelism
#
# Data parallelism copies the whole model to every rank; once a layer's weights no longer fit
# one device, the matrices themselves must be split. Shoeybi et al. (2019, "Megatron-LM")
# split a transformer block so that it needs only one all-reduce forward and one backward.
# For the MLP $Z = \mathrm{GELU}(XA)\,B$: split $A = [A_1,\dots,A_p]$ by **columns**, so rank
# $i$ computes $Y_i = \mathrm{GELU}(XA_i)$ from the whole input (GELU is elementwise, so
# it acts on each slice separately); split $B = [B_1;\dots;B_p]$ by **rows**, so rank $i$ computes
# $Y_iB_i$ and $Z = \sum_i Y_iB_i$ is one all-reduce. Two conjugate operators carry the
# communication: $f$ is the identity forward and an all-reduce of the gradient backward (each
# rank's $\partial\mathcal L/\partial X$ holds only its slice's contribution); $g$ is an
# all-reduce forward and the identity backward. SymPy checks the identity behind the row
# split on a $2\times 4$ by $4\times 3$ product cut into $p = 2$ shards:

# %%
Ys = sp.Matrix(2, 4, sp.symbols("y0:8"))
Bs = sp.Matrix(4, 3, sp.symbols("b0:12"))
shards = sum((Ys[:, 2 * i:2 * i + 2] * Bs[2 * i:2 * i + 2, :] for i in range(2)), sp.zeros(2, 3))
checks = Checks("row split, symbolic")
checks.equal("Y_1 B_1 + Y_2 B_2 - Y B (expanded)", sp.zeros(2, 3), sp.expand(shards - Ys * Bs))
checks

# %% [markdown]
# The package's $f$ and $g$ are `torch.autograd.Function`s; each all-reduce goes through
# one helper that also records it in a `CommCounter` (its kind and number of elements), so
# that what was sent can be compared with the formula below.

# %%
show_source(tp.CopyToParallelRegion)

# %%
show_source(tp.ReduceFromParallelRegion)

# %% [markdown]
# `ColumnParallelLinear` and `RowParallelLinear` are built by *sharding* a full `nn.Linear`:
# the column layer keeps a block of output rows of the weight, the row layer a block of input
# columns (and the whole bias, added once after $g$). `ParallelMLP` wraps the book's `MLP`
# (chapter 6); `ParallelAttention` the book's `MultiHeadAttention` (chapter 4): rank $i$ owns
# $H/p$ whole heads, so $W_Q, W_K, W_V$ are column-parallel behind one shared $f$, attention
# runs locally on those heads, and $W_O$ is row-parallel.

# %%
show_source(tp.ParallelAttention.forward)

# %% [markdown]
# **Verify.** A single-process float64 MLP ($d = 12$, $d_{ff} = 20$) and a grouped-query
# attention layer ($d = 12$, 4 query heads, 2 key/value heads, biases) are sent to $p = 2$
# real processes, which shard them and run forward and backward on the same input
# $(B, T, d) = (3, 5, 12)$ and output gradient. The outputs, the input gradients and the
# weight gradients gathered from the shards must equal the unsplit layer's.

# %%
gen = torch.Generator().manual_seed(0)
torch.manual_seed(0)
layers = {"MLP": MLP(12, 20, dtype=f64), "attention": MultiHeadAttention(12, 4, 2, bias=True, dtype=f64)}
B_, T_, d_ = 3, 5, 12
x = torch.randn(B_, T_, d_, generator=gen, dtype=f64)
grad_out = torch.randn(B_, T_, d_, generator=gen, dtype=f64)
per_rank = run(tp.run_tensor_parallel_layers, 2, list(layers.values()), x, grad_out, timeout=60)
tp_results = {name: [rank_results[i] for rank_results in per_rank] for i, name in enumerate(layers)}

# %%
checks = Checks("tensor parallel (p = 2) = single process, float64")
for name, layer in layers.items():
    out, x_grad, grads = tp.single_process_reference(layer, x, grad_out)
    res, full = tp_results[name], tp.gather_sharded(tp_results[name])
    checks.close(f"{name}: output", out, res[0]["out"], tol=1e-12)
    checks.close(f"{name}: output on rank 1 = rank 0", res[0]["out"], res[1]["out"], tol=1e-15)
    checks.close(f"{name}: input gradient", x_grad, res[1]["x_grad"], tol=1e-12)
    err = max(float((full[k] - grads[k]).abs().max()) for k in grads)
    checks.close(f"{name}: {len(grads)} weight gradients (gathered)", 0.0, err, tol=1e-12)
checks

# %% [markdown]
# **Communication, derived and counted.** A ring all-reduce of $n$ elements over $p$ ranks
# (Patarasuk & Yuan 2009) is a reduce-scatter and an all-gather of $p-1$ steps each, every
# step sending a chunk of $n/p$ elements; with $n = BTd$ activations of $b$ bytes each rank
# sends
#
# $$ 2\,\frac{p-1}{p}\,B\,T\,d\,b \ \text{bytes per all-reduce,} $$
#
# and the MLP and attention each do two (one $g$ forward, one $f$ backward): four per
# transformer block, forward and backward. SymPy derives it; the counters of the runs above
# recorded the all-reduces each rank made, which must match the formula exactly (integers).

# %%
comm = tp.tp_block_comm_symbolic()
display_expr = sp.Eq(sp.Symbol("bytes_{MLP}"), comm["mlp"])
syms = {sp.Symbol(n, positive=True, integer=True): v for n, v in
        {"B": B_, "T": T_, "d": d_, "p": 2, "b": 8}.items()}
sizes_seen = {n for r in tp_results.values() for _, n, _ in r[0]["calls"]}
ring_replay = {n: run(collectives.ring_versus_dist_worker, 2, n, 0) for n in sizes_seen}
checks = Checks("tensor-parallel communication: counted = derived")
for name in layers:
    calls = tp_results[name][0]["calls"]
    checks.equal(f"{name}: all-reduces (g forward, f backward)", ["g forward", "f backward"],
                 [kind for kind, _, _ in calls])
    checks.equal(f"{name}: elements per all-reduce = B·T·d", [B_ * T_ * d_] * 2, [n for _, n, _ in calls])
    # measured independently: the recorded all-reduces replayed through section 22.2's ring,
    # which counts the bytes each rank actually sends
    counted = sum(ring_replay[n][0]["bytes_sent"] for _, n, _ in calls)
    checks.equal(f"{name}: ring bytes sent per rank (SymPy = replayed ring)", int(comm["mlp"].subs(syms)), counted)
checks.equal("block = attention + MLP: all-reduces", int(comm["allreduces_block"]),
             sum(len(r[0]["calls"]) for r in tp_results.values()))
display_expr

# %% [markdown]
# Both layers communicate activations, not weights: $4 \cdot 2\frac{p-1}{p}BTd$ per block,
# independent of $d_{ff}$ and of the number of heads. That is why Megatron keeps tensor
# parallelism inside a node, on NVLink: the volume grows with the batch and is on the
# critical path (nothing to overlap it with), while a weight-sized all-reduce of data
# parallelism happens once per step.

# %% [markdown]
# ## 22.8 Pipeline parallelism
#
# Pipeline parallelism cuts the model into $p$ *stages* of consecutive layers, one per rank,
# and the batch into $m$ *micro-batches*. Stage $s$ receives a micro-batch's activation from
# $s-1$ (`dist.recv`), runs its layers and sends the result on (`dist.isend`); the backward
# pass sends gradients the other way. Two schedules order the work of each stage:
# **GPipe** (Huang et al. 2019) runs all $m$ forwards, then all $m$ backwards; **1F1B**
# (PipeDream-Flush, Narayanan et al. 2021) runs $p - s - 1$ warm-up forwards, then alternates
# one forward and one backward.

# %%
for name in ("gpipe", "1f1b"):
    print(name, [" ".join(f"{k}{j}" for k, j in ops) for ops in pp.schedule(name, 3, 4)])

# %% [markdown]
# **The bubble.** Let a forward take $t_f$ and a backward $t_b$. In GPipe the last stage
# starts after $(p-1)t_f$; the $m$ forwards take $mt_f$, the backwards $mt_b$, and the last
# gradient needs $(p-1)t_b$ to reach stage 0. Each stage works $m(t_f+t_b)$ of that time:

# %%
bubble = pp.bubble_fraction_symbolic()
p_, m_ = sp.symbols("p m", positive=True)
assert sp.simplify(bubble - (p_ - 1) / (m_ + p_ - 1)) == 0
sp.Eq(sp.Symbol(r"\text{bubble}"), bubble)

# %% [markdown]
# It does not depend on $t_f$ and $t_b$, and 1F1B has the same one: it reorders the work but
# cannot start stage $p-1$ sooner. We measure it as the processes run, with a *logical
# clock*: a forward takes 1 tick and a backward 2 (it does twice the multiplications), every
# message carries the tick at which its sender finished, and an operation starts at the later
# of the stage's own clock and that tick. This is the schedule's ideal timeline, computed by
# the real ranks in their real order, so it is exact.
#
# The model is a stack of 6 blocks $\mathrm{Linear}\to\tanh$ (widths $6\to 8\to\dots\to 5$,
# float64), the batch 12 examples; the loss of a micro-batch is its squared error divided by
# the *full* batch size, so the micro-batches' gradients add up to the full batch's. Every
# stage returns its gradients; concatenated, they must equal single-process training on the
# whole batch.

# %%
model = pp.make_mlp_stack([6, 8, 8, 8, 8, 8, 5], seed=0)
xb = torch.randn(12, 6, generator=gen, dtype=f64)
yb = torch.randn(12, 5, generator=gen, dtype=f64)
ref_loss, ref_grads = pp.reference_gradients(model, xb, yb)
# one start of 3 processes for four runs: both schedules in logical ticks, then both again
# with every forward made to take 20 ms and every backward 40 ms (used further down)
runs = [{"num_microbatches": 6, "schedule_name": name, "compute_seconds": c}
        for c in (0.0, 0.02) for name in ("gpipe", "1f1b")]
results = pp.run_pipelines(model, xb, yb, 3, runs, timeout=60)
reports = {(name, 3, 6): results[i] for i, name in enumerate(("gpipe", "1f1b"))}
wall = {name: results[2 + i] for i, name in enumerate(("gpipe", "1f1b"))}

# %%
checks = Checks("pipeline (real processes) = single process; bubble measured = derived")
for (name, p, m), reps in reports.items():
    grads = [g for r in reps for g in r.grads]
    err = max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads, strict=True))
    checks.close(f"{name} p={p} m={m}: all {len(grads)} gradients", 0.0, err, tol=1e-12)
    measured, per_stage = pp.measured_bubble(reps, "tick")
    checks.equal(f"{name} p={p} m={m}: bubble in ticks (p-1)/(m+p-1)",
                 str(pp.bubble_fraction(p, m)), str(measured))
    checks.true(f"{name} p={p} m={m}: every stage idles the same share",
                len(set(per_stage)) == 1)
checks

# %% [markdown]
# **Activation memory.** While a micro-batch's backward has not run, its stage keeps what
# autograd saved in the forward. The ranks count the micro-batches they hold and, through
# `torch.autograd.graph.saved_tensors_hooks`, the bytes of the saved activations. GPipe holds
# all $m$; 1F1B at most $p - s$ on stage $s$, whatever $m$: the same bubble with a memory
# that no longer grows with the number of micro-batches.

# %%
checks = Checks("micro-batches held at the peak: GPipe m, 1F1B p - s")
for (name, p, m), reps in reports.items():
    expected = [m] * p if name == "gpipe" else [p - s for s in range(p)]
    checks.equal(f"{name} p={p} m={m}: peak micro-batches per stage", expected,
                 [r.peak_microbatches for r in reps])
    checks.equal(f"{name} p={p} m={m}: peak bytes = peak count × bytes per micro-batch",
                 [r.peak_microbatches * r.activation_bytes[0] for r in reps],
                 [r.peak_activation_bytes for r in reps])
checks

# %% [markdown]
# (The last stage also keeps its loss's intermediate values, the same for every micro-batch,
# so the product still holds there.) Now in seconds, from the last two runs above: each
# forward was made to take 20 ms and each backward 40 ms (a sleep; the tiny model's own
# compute is negligible), and the ranks
# record `time.perf_counter()` around every operation. The measured bubble comes out above
# the formula: sending a message between processes takes time too, which the logical clock
# does not count, and on a busy 2-core machine three processes also wait for a core. How far
# above depends on the machine and its load; `benchmarks/pipeline.py` measures it for several
# $p$ and $m$ (`benchmarks/results/pipeline.json`). (Timings: this cell's output is not
# compared.)

# %% tags=["nbval-ignore-output"]
for name, reps in wall.items():
    print(f"{name}: wall-clock bubble {pp.measured_bubble(reps, 'wall')[0]:.3f}, "
          f"formula {float(pp.bubble_fraction(3, 6)):.3f}")

# %% [markdown]
# The timeline of those runs: each row a stage, forwards light, backwards dark. In GPipe the
# diagonal band of forwards is followed by the band of backwards; in 1F1B the backwards start
# as soon as the last stage has a micro-batch, and the idle triangles at both ends (the
# bubble) are the same size.

# %%
def plot_timeline(wall: dict) -> plt.Figure:
    fig, axes = plt.subplots(2, 1, figsize=(8, 3.6), sharex=True)
    for ax, (name, reps) in zip(axes, wall.items(), strict=True):
        t0 = min(e[4] for r in reps for e in r.events)
        for r in reps:
            for kind, j, *_, w0, w1 in r.events:
                ax.barh(r.stage, (w1 - w0) * 1e3, left=(w0 - t0) * 1e3, height=0.8,
                        color="tab:blue" if kind == "F" else "tab:orange", edgecolor="white")
                ax.text((w0 + w1 - 2 * t0) / 2 * 1e3, r.stage, f"{j}", ha="center", va="center", fontsize="x-small")
        ax.set_yticks(range(len(reps)), [f"stage {s}" for s in range(len(reps))])
        ax.invert_yaxis()
        ax.set_title(f"{name}: p = 3 stages, m = 6 micro-batches (blue forward, orange backward)")
    axes[-1].set_xlabel("wall-clock time (ms)")
    fig.tight_layout()
    return fig


save_figure(plot_timeline(wall), "22_pipeline_timeline")
plt.show()

# %% [markdown]
# ## 22.9 A cost model for clusters
#
# Which layout to train a 175B model with on 1024 GPUs? `llmbook.scale.cost_model` puts the
# chapter's pieces together into a prediction of memory per GPU, step time and **MFU** (model
# FLOPs utilisation: the model's FLOPs per second over the cluster's peak; Chowdhery et al.
# 2022) for a layout $t \times p \times d$ (tensor × pipeline × data parallel):
#
# * memory: 16 bytes per parameter for mixed-precision Adam (ZeRO, Rajbhandari et al. 2020)
#   over $tp$ ranks (and over $d$ with ZeRO), plus activations: per layer and micro-batch
#   $sbh\,(34 + 5as/h)$ bytes (Korthikanti et al. 2022), with their variants for tensor and
#   sequence parallelism and for recomputation, times the $L/p$ layers of a stage and the $p$
#   micro-batches 1F1B keeps on its first stage;
# * time: compute $6ND(1+\text{recompute}) / (G \cdot \text{peak} \cdot \text{efficiency})$
#   (plus the attention term $12Lhs$ per token), stretched by the bubble, plus the exposed
#   communication of each kind in the $\alpha$–$\beta$ model (Thakur et al. 2005): the
#   tensor-parallel all-reduces counted above, the pipeline's sends, the data-parallel
#   gradient all-reduce (half hidden behind the backward, a guess).
#
# SymPy first re-derives Korthikanti's per-layer activation count from the list of what
# attention and the MLP save:

# %%
act = cm.activation_memory_symbolic()
s, b, h, a = sp.symbols("s b h a", positive=True)
assert sp.simplify(act - s * b * h * (34 + 5 * a * s / h)) == 0
checks = Checks("activation bytes: the term-by-term SymPy sum against the cost model's table-2 code")
for t_ in (1, 8):  # with sequence parallelism every term is split over t ranks
    checks.close(f"GPT-3 175B, micro-batch 1, t = {t_}, no recomputation",
                 float(act.subs({s: 2048, b: 1, h: 12288, a: 96})) / t_,
                 cm.activation_bytes_per_layer(cm.GPT3_175B, 1, t_, "none", sequence_parallel=t_ > 1), tol=1e-12)
display(sp.Eq(sp.Symbol("activations"), act))
checks

# %% [markdown]
# The model's one important knob is the fraction of peak the matrix products reach. We
# calibrate it on **one** published run, Megatron-LM's GPT-3 175B on 1024 A100s (Narayanan et
# al. 2021: 140 TFLOP/s per GPU, counting recomputation), and then predict the others with
# it, unchanged. The layouts, batch sizes and recomputation of the other runs come from their
# papers where stated; what we had to assume is in `PUBLISHED_RUNS`' comments (micro-batch 1
# for Megatron, interleaving $v = 4$ for Llama 3, how PaLM's TPU torus maps onto "nodes").

# %%
runs = cm.PUBLISHED_RUNS
cal = runs[0]
e = cm.calibrate_compute_efficiency(cal.model, cal.cluster, cal.layout, cal.reported_tflops, cal.hardware)
eff = cm.Efficiency(compute=e)
print(f"calibrated on {cal.name}: the layers reach {e:.2f} of peak")
rows = []
for r in runs:
    pred = cm.predict(r.model, r.cluster, r.layout, eff)
    if r.reported_tflops is not None:
        key = "hardware_tflops_per_gpu" if r.hardware else "model_tflops_per_gpu"
        rows.append((r.name, "TFLOP/s/GPU", pred[key], r.reported_tflops))
    if r.reported_mfu is not None:
        rows.append((r.name, "MFU", pred["mfu"], r.reported_mfu))
print(f"{'run':22} {'quantity':12} {'predicted':>9} {'reported':>9} {'ratio':>6}")
for name, what, got, rep in rows:
    print(f"{name:22} {what:12} {got:9.3g} {rep:9.3g} {got / rep:6.2f}")

# %% [markdown]
# **OPT-175B, scored from its published number.** Zhang et al. (2022) report "up to 147
# TFLOP/s per GPU" on A100s, without saying which FLOPs they count. The row above scores it like
# the Megatron runs, counting the recomputation its run does (full activation checkpointing
# doubles the forward). Read instead as model FLOPs, the same 147 would be an MFU of 147/312;
# the cost model's MFU for the run is the other side of that comparison:

# %%
opt = next(r for r in runs if r.name == "OPT-175B")
opt_pred = cm.predict(opt.model, opt.cluster, opt.layout, eff)
hw_over_model = opt_pred["hardware_tflops_per_gpu"] / opt_pred["model_tflops_per_gpu"]
readings = {"147 counts recomputation (as Megatron)": (opt_pred["hardware_tflops_per_gpu"], 147.0),
            "147 counts model FLOPs only": (opt_pred["model_tflops_per_gpu"], 147.0)}
for what, (got, rep) in readings.items():
    print(f"OPT-175B, {what:40s} predicted {got:5.1f}, reported {rep:5.1f}, ratio {got / rep:.2f}")
print(f"published 147 TFLOP/s per A100 as MFU: {147 / 312:.3f} (model FLOPs) or "
      f"{147 / hw_over_model / 312:.3f} (recomputation counted); predicted MFU {opt_pred['mfu']:.3f}")
checks = Checks("OPT-175B: two readings of the published 147 TFLOP/s")
checks.close("hardware / model FLOPs = (8N + 16Lhs)/(6N + 12Lhs) (full recomputation)",
             (8 * opt.model.params + 16 * 96 * 12288 * 2048) / (6 * opt.model.params + 12 * 96 * 12288 * 2048),
             hw_over_model, tol=1e-12)
checks

# %% [markdown]
# The calibration run reproduces itself by construction (ratio 1.00). The others come out
# *low*, never high: Megatron's 1T run reaches more of the peak than the 175B one (bigger
# matrices run closer to peak; one efficiency for all sizes cannot know that), OPT and PaLM
# shard their data parallelism (FSDP, ZeRO-3) and may overlap its communication better than
# our guessed half, and PaLM's TPU torus is not the A100 node-and-InfiniBand picture the model
# has. OPT's score depends on how its 147 is read: within 10 % counting recomputation, a third
# low if it is model FLOPs, and "up to" makes it a best step, not an average. Llama 3 on H100s
# is within 10 %, by some luck: its efficiency need not equal an A100's. A model with one
# calibrated knob gets the scale right, not the last 20 %; use it to compare layouts, and
# calibrate it on a run on your own hardware.
#
# **The best layout as the model grows.** For Megatron's family of GPT models (Narayanan et
# al. 2021, table 1; sequence 2048) on a fixed cluster of 1024 A100s and a batch of 2048
# sequences, `best_layout` searches $t$ (powers of 2 up to a node), $p$ (divisors of $L$),
# micro-batch, recomputation and ZeRO-1, keeps the layouts that fit 80 GB, and picks the one
# with the highest predicted throughput.

# %%
family = [cm.ModelSpec(f"{L}x{hh}", L, hh, heads, 2048, 51200) for L, hh, heads in
          [(24, 2304, 24), (30, 3072, 32), (36, 4096, 32), (40, 6144, 48), (48, 8192, 64),
           (60, 10240, 80), (80, 12288, 96), (96, 16384, 128), (128, 25600, 160)]]
cluster = cm.a100_cluster(1024)
best = [cm.best_layout(spec, cluster, 2048, eff) for spec in family]
print(f"{'params':>8} {'t':>3} {'p':>3} {'d':>4} {'b':>2} {'recompute':>9} {'ZeRO':>4} {'MFU':>5}")
for spec, (lay, pred) in zip(family, best, strict=True):
    print(f"{spec.params / 1e9:7.1f}B {lay.tp:3} {lay.pp:3} {lay.dp:4} {lay.micro_batch:2} "
          f"{lay.recompute:>9} {lay.zero_stage:4} {pred['mfu']:5.2f}")


# %% [markdown]
# With 2048 sequences on 1024 GPUs, every GPU sees only 2 sequences a step, so the
# data-parallel gradient all-reduce over InfiniBand is expensive at every size: the model
# prefers to spend NVLink on tensor parallelism (t = 4 already at 1.7B, 8 at 39–76B; never
# more, a node has 8 GPUs), and ZeRO-1 once the optimizer state gets large. Pipeline stages
# appear only when the weights and optimizer state no longer fit (from 146B on: p = 8, then
# 16 at 1T, with t dropping back to 4 at 146B where that is faster), and selective
# recomputation only where activations would not fit otherwise. Predicted MFU *rises* with
# size, from 0.41 to 0.49: bigger layers do more arithmetic per byte they communicate.

# %%
def plot_best_layouts(family: list, best: list) -> plt.Figure:
    n = [spec.params / 1e9 for spec in family]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    for key, label in (("tp", "tensor parallel t"), ("pp", "pipeline p"), ("dp", "data parallel d")):
        ax.plot(n, [getattr(lay, key) for lay, _ in best], "o-", label=label)
    ax.set(xscale="log", yscale="log", xlabel="parameters (billions)", ylabel="ways",
           title="Best layout on 1024 A100s (cost model)")
    ax.legend()
    ax2.plot(n, [100 * pred["mfu"] for _, pred in best], "o-", color="tab:red")
    ax2.set(xscale="log", xlabel="parameters (billions)", ylabel="predicted MFU (%)",
            title="Predicted MFU of the best layout")
    fig.tight_layout()
    return fig


save_figure(plot_best_layouts(family, best), "22_best_layout")
plt.show()

# %% [markdown]
# **How much of that is the guess?** Every layout above assumed that half the data-parallel
# all-reduce hides behind the backward pass (`dp_overlap = 0.5`), a number nobody measured for
# these runs. `overlap_sensitivity` repeats the search with the overlap at 0, ¼, ½, ¾ and 1, and
# `layout_ranges` reports each choice as the range the guess allows:

# %%
overlaps = (0.0, 0.25, 0.5, 0.75, 1.0)
sweeps = [cm.overlap_sensitivity(spec, cluster, 2048, overlaps, eff) for spec in family]
print(f"{'params':>8} {'t':>5} {'p':>7} {'d':>8} {'recompute':>17} {'MFU':>11} {'layouts':>7}")
for spec, sweep in zip(family, sweeps, strict=True):
    rg = cm.layout_ranges(sweep)
    span = {k: f"{rg[k][0]}" if rg[k][0] == rg[k][1] else f"{rg[k][0]}–{rg[k][1]}" for k in ("tp", "pp", "dp")}
    print(f"{spec.params / 1e9:7.1f}B {span['tp']:>5} {span['pp']:>7} {span['dp']:>8} "
          f"{'/'.join(rg['recompute']):>17} {rg['mfu'][0]:.2f}–{rg['mfu'][1]:.2f} {rg['distinct'][0]:7}")
checks = Checks("the sweep at overlap 0.5 is the search above")
checks.equal("best layouts at dp_overlap = 0.5", [lay for lay, _ in best],
             [sweep[overlaps.index(0.5)][1] for sweep in sweeps])
checks

# %% [markdown]
# The guess moves the answer at every size. When none of the gradient all-reduce hides, the
# model buys pipeline stages to shrink the data-parallel degree; when all of it hides, data
# parallelism costs nothing and the smaller models drop tensor and pipeline parallelism
# altogether. Only at the largest sizes, where memory forces the layout, do the ranges close
# up. The predicted MFU moves less than the layout: several layouts are nearly as fast. Read
# the table of best layouts as "one of these", and measure the overlap on your own cluster
# before trusting a single answer.
#
# **All-to-all: expert parallelism's collective.** Chapter 21's MoE layer spread over $e$
# ranks sends each token to its expert's rank and back, an *all-to-all*: every rank has a
# different block for every other rank. In the pairwise exchange (Thakur et al. 2005) step
# $i = 1, \dots, p-1$ sends block $r+i$ to rank $r+i$; SymPy sums the steps:

# %%
a2a = cm.alltoall_cost_symbolic()
p, n, alpha, beta = sp.symbols("p n alpha beta", positive=True)
display(sp.Eq(sp.Symbol("T_{all-to-all}"), sp.collect(a2a["time"], [alpha, beta])))
checks = Checks("all-to-all: derived against counted and against chapter 21")
checks.equal("bytes per rank = n minus the block it keeps", 0, sp.simplify(a2a["bytes_per_rank"] - (n - n / p)))
checks.equal("bandwidth term = half the ring all-reduce's", 0,
             sp.simplify(2 * a2a["time"].coeff(beta) - ring_all_reduce_cost_symbolic()["all_reduce"].coeff(beta)))
# the cost model's per-layer time against chapter 21's byte count, on a cluster with no latency
flat = cm.Cluster("no latency", 8, 1e15, 80e9, 1e11, 1e11, latency=0.0)
crossing = 2 * all_to_all_bytes(4096, 4096, 2, 2, ep_size=8)  # forward + backward, one layer
checks.close("one MoE layer: expert_parallel_time = chapter 21's bytes / bandwidth",
             crossing / 1e11, cm.expert_parallel_time(4096, 4096, 1, 8, flat, top_k=2), tol=1e-15)
checks

# %% [markdown]
# An all-to-all sends $(p-1)/p$ of a rank's buffer, half an all-reduce's volume, but it does
# not shrink with more ranks and, unlike the gradient all-reduce, it sits on the critical
# path of every MoE layer, forward and backward. For a Mixtral-like model (32 MoE layers,
# $d = 4096$, top-2; Jiang et al. 2024) with 4096 tokens per GPU, the four all-to-alls of each
# layer cost, per step and GPU:

# %%
for ep_size, where in ((8, "inside a node (NVLink)"), (16, "across 2 nodes (InfiniBand)")):
    for hw in (cm.a100_cluster(64), cm.h100_cluster(64)):
        t_ep = cm.expert_parallel_time(4096, 4096, 32, ep_size, hw, top_k=2, capacity_factor=1.25)
        t_compute = 6 * 12.9e9 * 4096 / (hw.peak_flops * e)  # active parameters, calibrated efficiency
        print(f"ep = {ep_size:2} {where:28s} {hw.name.split(' x ')[1]:10s}: all-to-all {t_ep * 1e3:6.1f} ms "
              f"against {t_compute * 1e3:5.0f} ms of compute ({t_ep / t_compute:.0%})")

# %% [markdown]
# Inside a node the traffic is a few per cent of the step; across nodes, over links nine to
# twelve times slower, it becomes a fifth to a third of it, with nothing to hide behind. That
# is why expert parallelism is kept within a node where it can be (DeepSeek-V3 limits each
# token to 4 nodes). Chapter 22c runs
# the dispatch and combine for real on gloo ranks and counts the bytes they move.
#
# **Grading the claims.** C13's effective batch size was graded in chapter 10b (only the
# data-parallel degree multiplies the batch). C19 says that training must distribute seven
# things; the book runs each of them, on real processes where the thing is distributed:

# %%
claims = ClaimGrades("claims met in this chapter")
claims.grade(
    "C19", "training must distribute data, parameters, gradients, optimizer states, activations, "
    "attention context and experts",
    "data: 22.3 (the book's DDP = torch DDP = one process, parameters equal to "
    f"{'1e-12' if max_state_error(book[0]['state'], torch_ddp[0]['state']) < 1e-12 else 'MORE than 1e-12'}); "
    "parameters, gradients and "
    f"optimizer states: 22.4 (ZeRO-1/2/3, bytes per rank = formula, stage 3 holding "
    f"{sum(bf16_runs[3][0]['memory'].values()) / sum(bf16_runs[0][0]['memory'].values()):.2f} of stage 0's "
    "on 4 ranks); activations: recomputed "
    "in chapter 10 (activation checkpointing), split over ranks by tensor and sequence parallelism "
    "(22.7) and by pipeline stages (22.8), costed here; attention context: chapter 22b (context "
    "parallelism); experts: chapter 22c (expert parallelism), costed here with the all-to-all. "
    "Layers (tensor and pipeline parallelism) are an eighth axis the list omits",
    "correct")
claims

# %% [markdown]
# ## Summary
#
# * A distributed job is $p$ ranks of a process group, started by a launcher and joined through
#   a backend (gloo on CPUs, NCCL on GPUs); they talk through collectives, and all-reduce =
#   reduce-scatter + all-gather.
# * The ring all-reduce sends $2\frac{p-1}{p}n$ bytes per rank, which is optimal, and costs
#   $2(p-1)\alpha + 2\frac{p-1}{p}n\beta$; the book's ring, written with `isend`/`irecv`,
#   equals `dist.all_reduce` and sends exactly those bytes. On this machine latency dominates
#   below some tens of KiB.
# * Data parallelism averages gradients with one all-reduce; buckets and backward hooks let the
#   all-reduces overlap backward. The book's DDP, PyTorch's DDP and one process on the whole
#   batch train to the same parameters, to round-off.
# * ZeRO shards optimizer states, then gradients, then parameters: per rank
#   $(b_w + b_g + K)\Psi$ bytes fall to $(b_w+b_g)\Psi + K\Psi/N$, $b_w\Psi + (b_g+K)\Psi/N$ and
#   $(b_w+b_g+K)\Psi/N$. The counted bytes of the book's stages match these exactly, the
#   trajectories match unsharded training, and stage 3 matches PyTorch's FSDP2.
# * Mixed precision costs $2+2+4+4+4 = 16$ bytes per parameter with Adam. Loss scaling rescues
#   float16 gradients below $2^{-24}$; float32 master weights keep bfloat16 updates smaller than
#   half an ulp. The book's dynamic loss scaler behaves step for step like `torch.amp.GradScaler`.
# * Tensor parallelism, pipeline parallelism and a cluster cost model (sections 22.7–22.9)
#   complete the picture. The cost model predicts published runs to within a third with one
#   calibrated knob; its best layout depends on the guessed overlap of data-parallel
#   communication, so it reports ranges. Expert parallelism's all-to-all sends $(p-1)/p$ of a
#   buffer, half an all-reduce's volume, on the critical path of every MoE layer.
# * Of the seven things C19 says training must distribute, this chapter runs data, parameters,
#   gradients and optimizer states, and splits activations; chapters 22b and 22c run attention
#   context and experts.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/22_distributed_training.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 22` writes a stub
# of every function, `llmbook grade 22` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_22.py` runs
# the same checks on the reference.
#
# 1. (★★) **Recursive halving and doubling.** For $p$ a power of two, Rabenseifner's
#    all-reduce does a reduce-scatter by recursive halving ($\log_2 p$ steps, exchanging
#    $n/2, n/4, \dots$ bytes with a partner) and an all-gather by recursive doubling (Thakur et
#    al., 2005). Derive its $\alpha$–$\beta$ cost with SymPy, show it has the ring's bandwidth
#    term, and find the message size below which it beats the ring for given $p$, $\alpha$,
#    $\beta$.
# 2. (★) **What fits.** With mixed-precision Adam ($K=12$), activations ignored, find the
#    largest model (in parameters) that fits in 80 GB per GPU on $N = 64$ GPUs at each ZeRO
#    stage.
# 3. (★★) **A static loss scale.** Given a tensor of float32 gradients, find the largest power
#    of two $S$ such that $S\,g$ does not overflow float16, and the fraction of the non-zero
#    gradients that still flush to zero in float16 at that scale. Compare with $S = 1$ on
#    gradients drawn log-uniformly between $10^{-10}$ and $10^{-1}$.
# 4. (★★) **Sequence parallelism's volume.** Korthikanti et al. (2022) replace each all-reduce of
#    tensor parallelism by a reduce-scatter and an all-gather, so that layer norms and
#    dropout run on $1/p$ of the sequence. With SymPy, show that a ring reduce-scatter plus a
#    ring all-gather of $BTd$ elements send exactly as many bytes per rank as one ring
#    all-reduce, and compute how many bytes one block sends per rank, forward and backward,
#    for $B = 8$, $T = 2048$, $d = 12288$, $p = 8$, bf16. (Solution:
#    `sequence_parallel_bytes` in `notebooks/solutions/22_distributed_training.py`.)
# 5. (★★) **Interleaving.** With $v$ virtual stages per rank (Narayanan et al. 2021) the bubble
#    becomes $\frac{p-1}{vm}\,/\,(1 + \frac{p-1}{vm})$ of the step. Derive it from the
#    timeline as above (each chunk's forward takes $t_f/v$), and find the smallest $m$ for
#    which a 16-stage pipeline with $v = 4$ idles less than 5 %. (Solution:
#    `interleaved_bubble`, `smallest_microbatches`.)

# %%
from llmbook.workbench import grade

grade("22", globals())
