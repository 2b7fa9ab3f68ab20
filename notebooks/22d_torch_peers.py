# %% [markdown]
# # 22d PyTorch's own parallelisms as peers
#
# Chapter 22 built tensor parallelism, pipeline schedules and ZeRO from `torch.distributed`'s
# collectives, and checked each against one process on the whole model. PyTorch ships its own
# version of each. This chapter trains the same tiny models both ways, on the same two gloo
# processes, for three AdamW steps, and compares the gradients at every step and the
# parameters at the end. It then builds the piece chapter 22 left out, a fully sharded module
# wrapper that any torch optimizer can drive, with a compute dtype apart from the float32
# master weights, and runs it beside `fully_shard`. You will learn:
#
# 1. how `parallelize_module` with `ColwiseParallel` and `RowwiseParallel` expresses
#    Megatron's split (Shoeybi et al., 2019) with `DTensor`s, and that it trains exactly as the
#    book's `ParallelMLP`;
# 2. how `torch.distributed.pipelining`'s `PipelineStage`, `ScheduleGPipe` and `Schedule1F1B`
#    map onto the book's stages and schedules (Huang et al., 2019; Narayanan et al., 2021);
# 3. how `ZeroRedundancyOptimizer` shards the optimizer states by whole tensors where the book
#    cuts a flat buffer (Rajbhandari et al., 2020), and what that does to the bytes per rank;
# 4. how to write ZeRO-3 as a module wrapper: an all-gather whose backward is a
#    reduce-scatter, activation checkpointing per unit, and bfloat16 compute over float32
#    masters (Micikevicius et al., 2018), matched against FSDP2 (Zhao et al., 2023).

# %%
import torch

from llmbook.nbtools import Checks, seed_everything, show_source
from llmbook.scale import torch_peers as tpeers
from llmbook.scale.launch import run
from llmbook.scale.sharded import GatherShard, ShardedModule

g = seed_everything(0)
torch.set_num_threads(1)
max_abs_diff, worst = tpeers.max_abs_diff, tpeers.max_step_diff  # worst: over the steps


# %% [markdown]
# ## 22d.1 Tensor parallelism: `parallelize_module`
#
# PyTorch describes a tensor-parallel layer by the *placement* of each tensor on a device
# mesh, here a one-dimensional mesh of the two CPU ranks. `ColwiseParallel` shards a linear
# layer's weight (d_out, d_in) and bias along d_out, `Shard(0)`: it is the book's
# `ColumnParallelLinear`. `RowwiseParallel` shards the weight along d_in, `Shard(1)`, keeps
# the bias replicated and all-reduces the partial outputs: the book's `RowParallelLinear`
# with Megatron's g. Applied to the `fc` and `proj` of the book's MLP, the plan is the
# book's `ParallelMLP`, written as data:

# %%
show_source(tpeers.tp_pair_worker)

# %%
tp_spec = {"seed": 0, "steps": 3, "batch_size": 2, "seq_len": 3, "d_model": 6, "d_ff": 8,
           "lr": 1e-2, "weight_decay": 0.01}
tp_runs = run(tpeers.tp_pair_worker, 2, tp_spec, timeout=120)
tp_ref = tpeers.tp_reference(tp_spec)
book, peer = tp_runs[0]["book"], tp_runs[0]["torch"]
print("rank 0's shards, book:   ", book["local_shapes"])
print("rank 0's shards, PyTorch:", peer["local_shapes"])
checks = Checks("TP: ParallelMLP vs parallelize_module, 2 processes, float64, 3 AdamW steps")
checks.equal("same shard shapes on both ranks", tp_runs[1]["book"]["local_shapes"], tp_runs[1]["torch"]["local_shapes"])
checks.close("gradients, every step: book = PyTorch", 0.0, worst(book["grads"], peer["grads"]), tol=1e-13)
checks.close("parameters after 3 steps: book = PyTorch", 0.0, max_abs_diff(book["params"], peer["params"]), tol=1e-13)
checks.close("parameters: PyTorch = one process", 0.0, max_abs_diff(peer["params"], tp_ref["params"]), tol=1e-13)
checks.close("parameters: rank 1 = rank 0 (PyTorch)", 0.0, max_abs_diff(tp_runs[1]["torch"]["params"], peer["params"]), tol=1e-13)
checks

# %% [markdown]
# The shards have the same shapes (each rank owns 4 of the 8 hidden units), and the two
# trajectories agree to the last bits of float64. What differs is where the communication is
# written: the book calls its f and g operators by hand inside the layer; PyTorch derives
# them from the placements. `RowwiseParallel`'s output is a partial sum that its output
# hook turns into a replicated tensor, an all-reduce; and because `fc`'s input is replicated
# and its weight sharded, autograd's backward of the `DTensor` redistribution sums the input
# gradient over the ranks, which is f.
#
# ## 22d.2 Pipeline schedules: `torch.distributed.pipelining`
#
# PyTorch splits the roles that the book's `pipeline_worker` holds in one function: a
# `PipelineStage` wraps the rank's sub-module and its point-to-point sends, and a *schedule*
# orders the micro-batches' forwards and backwards. `ScheduleGPipe` and `Schedule1F1B` are
# chapter 22's two schedules. The first stage calls `schedule.step(x)`, the last
# `schedule.step(target=y)`, and gradients accumulate in the stage's parameters. One detail
# must match: PyTorch divides the accumulated gradients by the number of micro-batches unless
# told not to (`scale_grads=False`); the book's micro-batch loss is already its share of the
# batch's loss (squared error summed, divided by the whole batch size B), so the book turns
# that scaling off.

# %%
show_source(tpeers.pp_pair_worker)

# %%
pp_spec = {"seed": 0, "steps": 3, "widths": [4, 6, 6, 5, 3], "batch_size": 8, "num_microbatches": 4,
           "schedule": "gpipe", "lr": 1e-2, "weight_decay": 0.01}
pp_runs = run(tpeers.pp_pair_worker, 2, pp_spec, timeout=120)
pp_1f1b = run(tpeers.pp_pair_worker, 2, {**pp_spec, "schedule": "1f1b"}, timeout=120)
pp_ref = tpeers.pp_reference(pp_spec)
checks = Checks("PP: the book's schedules vs torch.distributed.pipelining, 2 stages, 4 micro-batches")
for name, ranks in (("GPipe", pp_runs), ("1F1B", pp_1f1b)):
    steps = range(pp_spec["steps"])
    book_grads = [ranks[0]["book"]["grads"][s] + ranks[1]["book"]["grads"][s] for s in steps]
    peer_grads = [ranks[0]["torch"]["grads"][s] + ranks[1]["torch"]["grads"][s] for s in steps]
    book_params = ranks[0]["book"]["params"] + ranks[1]["book"]["params"]
    peer_params = ranks[0]["torch"]["params"] + ranks[1]["torch"]["params"]
    checks.close(f"{name}: gradients, every step: book = PyTorch", 0.0, worst(book_grads, peer_grads), tol=1e-13)
    checks.close(f"{name}: parameters after 3 steps: book = PyTorch", 0.0, max_abs_diff(book_params, peer_params), tol=1e-13)
    checks.close(f"{name}: gradients: PyTorch = one process", 0.0, worst(peer_grads, pp_ref["grads"]), tol=1e-13)
checks

# %% [markdown]
# Both schedules give both implementations the gradient of the whole batch, step after step:
# a schedule changes when work happens and how many micro-batches' activations a stage holds,
# never the sum of the gradients. The book's worker takes the whole model and cuts it at
# each step, so after its optimizer step each stage broadcasts its new weights; PyTorch's
# stage keeps only its own sub-module, which is how a real pipeline saves memory.
#
# ## 22d.3 ZeRO-1 and 2: `ZeroRedundancyOptimizer`
#
# `torch.distributed.optim.ZeroRedundancyOptimizer` wraps any optimizer class and gives each
# rank the states of a subset of the parameters; after its step, each parameter is broadcast
# from the rank that owns it. With `DistributedDataParallel` all-reducing the gradients, that
# is ZeRO stage 1. PyTorch has no stage 2 in this optimizer (the gradients stay whole and
# all-reduced), so the book's stages 1 and 2 are both compared with it: the two stages differ
# in the bytes of gradient a rank keeps, not in the numbers. The book's gradients are its
# averaged buffers, gathered in full for the comparison.

# %%
zero_spec = {"seed": 1, "steps": 3, "batch_size": 6, "lr": 1e-2, "weight_decay": 0.01, "stage": 1}
zero_ref = tpeers.unsharded_reference(zero_spec)
checks = Checks("ZeRO: ZeroTrainer vs DDP + ZeroRedundancyOptimizer(AdamW), 2 processes, float64")
zero_bytes = {}
for stage in (1, 2):
    zruns = run(tpeers.zero_pair_worker, 2, {**zero_spec, "stage": stage}, timeout=120)
    book, peer = zruns[0]["book"], zruns[0]["torch"]
    checks.close(f"stage {stage}: gradients, every step: book = PyTorch", 0.0, worst(book["grads"], peer["grads"]), tol=1e-13)
    checks.close(f"stage {stage}: parameters after 3 steps: book = PyTorch", 0.0,
                 max_abs_diff(book["params"], peer["params"]), tol=1e-13)
    checks.close(f"stage {stage}: parameters: PyTorch = one process", 0.0,
                 max_abs_diff(peer["params"], zero_ref["params"]), tol=1e-13)
    zero_bytes[stage] = ([r["book"]["optimizer_bytes"] for r in zruns], [r["torch"]["optimizer_bytes"] for r in zruns])
checks.equal("Adam's m and v: both shard the same total (2 · 8 · 616 bytes)", 2 * 8 * 616, sum(zero_bytes[1][1]))
checks

# %%
print("Adam's m and v per rank, bytes  book:", zero_bytes[1][0], "  PyTorch:", zero_bytes[1][1])

# %% [markdown]
# Same numbers, different shards. The book flattens each unit and cuts the flat buffer into
# two equal halves, so both ranks hold exactly half of the 616 parameters' states.
# `ZeroRedundancyOptimizer` never splits a tensor: it sorts the parameters by size and gives
# each to the rank that holds the fewest elements so far, so the ranks hold 296 and 320
# parameters' states here, and a model whose largest tensor is a large share of the total
# cannot be balanced at all. Splitting whole tensors keeps each optimizer step a step on
# ordinary tensors, with no flattening; the flat split is exact but needs the buffers.
#
# ## 22d.4 A sharded module that any optimizer can drive
#
# Chapter 22's `ZeroTrainer` owns its AdamW and its training step. FSDP's design is a module
# wrapper instead: the wrapper's `parameters()` are the rank's shards of the master weights,
# and any optimizer steps them without knowing that they are shards, which is correct for
# every elementwise optimizer (SGD, Adam, AdamW: each element's update depends on that
# element's gradient and state only). `ShardedModule` does this for an `nn.Sequential`, one
# unit per child. The one new piece is an autograd function whose forward is the all-gather
# and whose backward is its conjugate, the reduce-scatter:

# %%
show_source(GatherShard)

# %% [markdown]
# If rank $k$'s loss is $L_k$ and the gathered buffer is $w = [s_0; s_1; \dots]$, the
# gradient that shard $s_r$ needs for the mean loss $\frac1N\sum_k L_k$ is
# $\frac1N\sum_k \partial L_k/\partial w\,[\text{slice } r]$: the sum over ranks of the
# slice $r$ of each rank's gradient, which is what a reduce-scatter delivers, divided by $N$.
# The forward runs each unit inside non-reentrant activation checkpointing, so the gathered
# weights are dropped after the unit's forward and gathered again for its backward.

# %%
show_source(ShardedModule.forward)

# %% [markdown]
# ## 22d.5 Against FSDP2, in float64 and in bfloat16 over float32 masters
#
# `fully_shard` with a `MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32)` keeps float32 sharded parameters, all-gathers them cast to
# bfloat16, computes in bfloat16, and reduce-scatters the gradients in float32. The wrapper
# does the same with `compute_dtype=torch.bfloat16`. Both run on gloo and the CPU in torch
# 2.13, bfloat16 collectives included, so here they are side by side, each driven by
# `torch.optim.AdamW`, first in float64, then in bfloat16 over float32 masters:

# %%
fsdp_spec = {"seed": 1, "steps": 3, "batch_size": 6, "lr": 1e-2, "weight_decay": 0.01,
             "dtype": "float64", "compute_dtype": "float64"}
mixed_spec = {**fsdp_spec, "dtype": "float32", "compute_dtype": "bfloat16"}
f64_runs = run(tpeers.fsdp_pair_worker, 2, fsdp_spec, timeout=120)
bf16_runs = run(tpeers.fsdp_pair_worker, 2, mixed_spec, timeout=120)
ref32 = tpeers.unsharded_reference({**fsdp_spec, "dtype": "float32"})
checks = Checks("ZeRO-3: ShardedModule vs fully_shard, 2 processes, 3 AdamW steps")
for name, runs_, tol in (("float64", f64_runs, 1e-13), ("bf16 / fp32 masters", bf16_runs, 1e-6)):
    book, peer = runs_[0]["book"], runs_[0]["torch"]
    checks.close(f"{name}: gradients, every step: wrapper = FSDP2", 0.0, worst(book["grads"], peer["grads"]), tol=tol)
    checks.close(f"{name}: parameters after 3 steps: wrapper = FSDP2", 0.0,
                 max_abs_diff(book["params"], peer["params"]), tol=tol)
    checks.equal(f"{name}: bytes of a rank's shards, wrapper = FSDP2", peer["shard_bytes"], book["shard_bytes"])
checks.close("float64: wrapper = one process", 0.0,
             max_abs_diff(list(f64_runs[0]["book"]["params"].values()), tpeers.unsharded_reference(fsdp_spec)["params"]),
             tol=1e-13)
drift = max_abs_diff(list(bf16_runs[0]["book"]["params"].values()), ref32["params"])
checks.true("bf16 compute: parameters leave float32 training's path (1e-5 < drift < 1e-1)", 1e-5 < drift < 1e-1)
checks

# %% [markdown]
# In float64 the wrapper, FSDP2 and one process agree to round-off. In bfloat16 the wrapper
# and FSDP2 still agree with each other, within the stated 1e-6 (the same casts, the same
# kernels, the same float32 reduction), while both drift away from float32 training by far more
# than float32's round-off: that drift is the price of 8-bit mantissas in the forward and
# backward. What stays in float32 is what chapter 22's section 22.6 showed must: the master
# weights, so that small updates are not rounded away, and the gradient reduction. Each rank
# holds half of the 616 master weights, 1232 bytes in float32.
#
# ## Summary
#
# * PyTorch's `parallelize_module` with `ColwiseParallel`/`RowwiseParallel` is Megatron's
#   column-then-row split expressed as placements of `DTensor`s; it trains the book's MLP to the
#   same gradients and parameters as the book's `ParallelMLP` and as one process.
# * `torch.distributed.pipelining`'s GPipe and 1F1B schedules reproduce the book's, gradient
#   for gradient, once the micro-batch loss is scaled the same way (`scale_grads=False`).
# * `ZeroRedundancyOptimizer` is ZeRO stage 1 with whole tensors as the unit of sharding; the
#   book's flat split balances the optimizer states exactly, PyTorch's greedy partition does
#   not.
# * ZeRO-3 fits in a module wrapper: an all-gather whose backward is an averaged reduce-scatter,
#   recomputation per unit, and shards as the only parameters, so any optimizer can drive it.
#   With bfloat16 compute over float32 masters it matches FSDP2's mixed precision.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/22d_torch_peers.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 22d` writes a stub
# of every function, `llmbook grade 22d` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_22d.py` runs
# the same checks on the reference.
#
# 1. (★) **The greedy partition.** Write the partition that `ZeroRedundancyOptimizer` uses
#    (parameters sorted by size, largest first, each given to the rank with the fewest elements
#    so far) and find, for `tiny_mlp` on 2 and on 4 ranks, the elements each rank holds. Compare
#    the largest with the flat split's $\lceil \Psi/N \rceil$. (Solution: `greedy_partition`.)
# 2. (★★) **Micro-batch losses.** Show in one process that accumulating the gradients of the
#    *mean* squared error of $m$ micro-batches and dividing by $m$ (PyTorch's default
#    `scale_grads=True`) gives the gradient of the whole batch's mean squared error, for equal
#    micro-batches, and that it does not for unequal ones. (Solution: `accumulated_gradient`.)
# 3. (★★) **The wrapper's peak.** For $L$ equal units of $P$ parameters on $N$ ranks, float32
#    masters, bfloat16 compute and AdamW, write with SymPy the bytes a rank of `ShardedModule`
#    holds while one unit computes its backward (master shards, Adam's states, gradient shards,
#    one gathered unit and its full bfloat16 gradient) and find the smallest $L$ for which the
#    gathered unit and its gradient are under 10 % of the total at $N = 8$.
#    (Solution: `sharded_peak_bytes`, `smallest_units`.)

# %%
from llmbook.workbench import grade

grade("22d", globals())
