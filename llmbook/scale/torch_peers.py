"""The book's parallelisms side by side with PyTorch's own: tensor, pipeline, ZeRO, FSDP.

Introduced in notebooks/22d_torch_peers. Chapter 22 built tensor parallelism
(:mod:`~llmbook.scale.tensor_parallel`), pipeline schedules (:mod:`~llmbook.scale.pipeline`)
and ZeRO (:mod:`~llmbook.scale.zero`) from ``torch.distributed``'s collectives. PyTorch
ships each of them; the workers here train the same tiny model with the book's version and
with PyTorch's on the same ranks, for several AdamW steps, and return both trajectories'
gradients (every step) and final parameters, in full, so that a chapter can report their
largest differences:

* :func:`tp_pair_worker`: :class:`~llmbook.scale.tensor_parallel.ParallelMLP` against
  ``torch.distributed.tensor.parallel.parallelize_module`` with ``ColwiseParallel`` on
  ``fc`` and ``RowwiseParallel`` on ``proj`` (Megatron's split, Shoeybi et al., 2019) on a
  one-dimensional CPU device mesh;
* :func:`pp_pair_worker`: :func:`~llmbook.scale.pipeline.pipeline_worker` (GPipe or 1F1B)
  against ``torch.distributed.pipelining``'s ``PipelineStage`` with ``ScheduleGPipe`` or
  ``Schedule1F1B`` (Huang et al., 2019; Narayanan et al., 2021);
* :func:`zero_pair_worker`: :class:`~llmbook.scale.zero.ZeroTrainer` stage 1 or 2 against
  ``DistributedDataParallel`` with ``torch.distributed.optim.ZeroRedundancyOptimizer``
  (stage 1 of Rajbhandari et al., 2020, sharding whole parameters rather than a flat buffer);
* :func:`fsdp_pair_worker`: :class:`~llmbook.scale.sharded.ShardedModule` against
  ``torch.distributed.fsdp.fully_shard`` with a ``MixedPrecisionPolicy``, in float64 or
  with bfloat16 compute and float32 master weights.

Each worker runs under :func:`llmbook.scale.launch.run` (gloo) with a ``spec`` dict; every
rank returns the same full tensors, so the caller reads rank 0's. :func:`max_abs_diff`
compares two lists of tensors or two dicts with the same keys.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.scale.data_parallel import shard_batch
from llmbook.scale.pipeline import make_mlp_stack, pipeline_worker, split_stages
from llmbook.scale.sharded import ShardedModule
from llmbook.scale.tensor_parallel import ParallelMLP
from llmbook.scale.zero import ZeroTrainer, make_regression_batches, tiny_mlp
from llmbook.training.optim import AdamW
from llmbook.transformer.layers import MLP
from llmbook.validation import check_keys

__all__ = [
    "fsdp_pair_worker",
    "max_abs_diff",
    "max_step_diff",
    "pp_pair_worker",
    "pp_reference",
    "tp_batches",
    "tp_mlp",
    "tp_pair_worker",
    "tp_reference",
    "unsharded_reference",
    "zero_pair_worker",
]

TP_KEYS = ("seed", "steps", "batch_size", "seq_len", "d_model", "d_ff", "lr", "weight_decay")
PP_KEYS = ("seed", "steps", "widths", "batch_size", "num_microbatches", "schedule", "lr", "weight_decay")
ZERO_KEYS = ("seed", "steps", "batch_size", "lr", "weight_decay", "stage")
FSDP_KEYS = ("seed", "steps", "batch_size", "lr", "weight_decay", "dtype", "compute_dtype")


def max_abs_diff(a: Sequence[Tensor] | Mapping[str, Tensor], b: Sequence[Tensor] | Mapping[str, Tensor]) -> float:
    """max |a_i - b_i| over all pairs of tensors (compared in float64); lists must have equal
    lengths and dicts equal keys, tensors equal shapes (ValueError otherwise)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise ValueError(f"a and b must have the same keys, got {sorted(a)} and {sorted(b)}")
        pairs = [(a[k], b[k]) for k in a]
    elif isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, str | bytes):
        if len(a) != len(b):
            raise ValueError(f"a and b must have the same length, got {len(a)} and {len(b)}")
        pairs = list(zip(a, b, strict=True))
    else:
        raise TypeError(f"a and b must both be sequences or both be mappings of tensors, got "
                        f"{type(a).__name__} and {type(b).__name__}")
    out = 0.0
    for x, y in pairs:
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise TypeError(f"a and b must hold tensors, got {type(x).__name__} and {type(y).__name__}")
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {tuple(x.shape)} and {tuple(y.shape)}")
        if x.numel():
            out = max(out, float((x.detach().double() - y.detach().double()).abs().max()))
    return out


def max_step_diff(a: Sequence[Any], b: Sequence[Any]) -> float:
    """The largest :func:`max_abs_diff` over the steps of two equally long lists of per-step
    gradients (each step a list or a dict of tensors)."""
    if not isinstance(a, Sequence) or not isinstance(b, Sequence) or len(a) != len(b) or not a:
        raise ValueError(f"a and b must be non-empty lists of the same number of steps, got "
                         f"{len(a) if isinstance(a, Sequence) else type(a).__name__} and "
                         f"{len(b) if isinstance(b, Sequence) else type(b).__name__}")
    return max(max_abs_diff(x, y) for x, y in zip(a, b, strict=True))


def _gather_dim(t: Tensor, dim: int | None) -> Tensor:
    """The full tensor from the ranks' shards split on ``dim`` (None: already full)."""
    if dim is None:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.detach().contiguous())
    return torch.cat(parts, dim=dim)


# ---------------------------------------------------------------- tensor parallelism


def tp_mlp(spec: Mapping[str, Any]) -> MLP:
    """The book's float64 GPT-2 MLP (d_model -> d_ff -> d_model), seeded by ``spec["seed"]``."""
    torch.manual_seed(spec["seed"])
    return MLP(spec["d_model"], spec["d_ff"], dtype=torch.float64)


def tp_batches(spec: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """Inputs and targets (steps, B, T, d_model), float64, the same on every rank."""
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    shape = (spec["steps"], spec["batch_size"], spec["seq_len"], spec["d_model"])
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    return x, torch.tanh(x.flip(-1))


def tp_reference(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One process, the whole MLP, the book's AdamW: gradients per step, final parameters."""
    check_keys(spec, "spec", TP_KEYS)
    mlp = tp_mlp(spec)
    optimizer = AdamW(mlp.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    grads = []
    for x, y in zip(*tp_batches(spec), strict=True):
        optimizer.zero_grad()
        F.mse_loss(mlp(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in mlp.named_parameters()})
        optimizer.step()
    return {"grads": grads, "params": {n: p.detach().clone() for n, p in mlp.named_parameters()}}


def tp_pair_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Tensor-parallel training of :func:`tp_mlp`, the book's way and PyTorch's.

    ``spec``: ``seed``, ``steps``, ``batch_size``, ``seq_len``, ``d_model``, ``d_ff`` (divisible
    by the world size), ``lr``, ``weight_decay``. The book: ``ParallelMLP`` + the book's AdamW
    on the rank's shards. PyTorch: ``parallelize_module`` (ColwiseParallel ``fc``,
    RowwiseParallel ``proj``) + ``torch.optim.AdamW`` on the DTensor parameters. Returns,
    for each, ``grads`` (per step, name -> full gradient), ``params`` (name -> full) and
    ``local_shapes`` (name -> the rank's shard shape).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    check_keys(spec, "spec", TP_KEYS)
    mlp = tp_mlp(spec)
    xs, ys = tp_batches(spec)
    book = ParallelMLP(mlp, rank, world_size)
    book_opt = AdamW(book.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    peer = copy.deepcopy(mlp)
    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(peer, mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
    peer_opt = torch.optim.AdamW(peer.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"],
                                 foreach=False)
    out: dict[str, Any] = {"book": {"grads": []}, "torch": {"grads": []}}
    for x, y in zip(xs, ys, strict=True):
        for opt, model, side in ((book_opt, book, "book"), (peer_opt, peer, "torch")):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            if side == "book":
                grads = {n: _gather_dim(g, d) for n, (g, d) in book.sharded_grads().items()}
            else:
                grads = {n: p.grad.full_tensor() for n, p in peer.named_parameters()}
            out[side]["grads"].append(grads)
            opt.step()
    dims = {n: d for n, (_, d) in book.sharded_grads().items()}
    named = dict(book.named_parameters())
    out["book"]["params"] = {n: _gather_dim(named[n], dims[n]) for n in dims}
    out["book"]["local_shapes"] = {n: tuple(named[n].shape) for n in dims}
    out["torch"]["params"] = {n: p.full_tensor().detach().clone() for n, p in peer.named_parameters()}
    out["torch"]["local_shapes"] = {n: tuple(p.to_local().shape) for n, p in peer.named_parameters()}
    return out


# ---------------------------------------------------------------- pipeline parallelism


def _pp_data(spec: Mapping[str, Any]) -> tuple[nn.Sequential, Tensor, Tensor]:
    model = make_mlp_stack(list(spec["widths"]), seed=spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    widths = spec["widths"]
    x = torch.randn(spec["steps"], spec["batch_size"], widths[0], generator=g, dtype=torch.float64)
    y = torch.randn(spec["steps"], spec["batch_size"], widths[-1], generator=g, dtype=torch.float64)
    return model, x, y


def _sum_squares_over(out: Tensor, target: Tensor, batch: int) -> Tensor:
    """The pipeline chapter's loss of a micro-batch: squared error summed, over the full batch."""
    return ((out - target) ** 2).sum() / batch


def pp_reference(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One process, the whole stack, the book's AdamW on sum-of-squares / B: gradients per
    step and final parameters, in ``model.parameters()`` order."""
    check_keys(spec, "spec", PP_KEYS)
    model, xs, ys = _pp_data(spec)
    optimizer = AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    grads = []
    for x, y in zip(xs, ys, strict=True):
        optimizer.zero_grad()
        _sum_squares_over(model(x), y, x.shape[0]).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return {"grads": grads, "params": [p.detach().clone() for p in model.parameters()]}


def pp_pair_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Pipeline-parallel training of a :func:`~llmbook.scale.pipeline.make_mlp_stack`, rank s
    owning stage s, the book's way and PyTorch's.

    ``spec``: ``seed``, ``steps``, ``widths`` (the stack's widths; the world size divides its
    blocks), ``batch_size``, ``num_microbatches``, ``schedule`` ("gpipe" or "1f1b"), ``lr``,
    ``weight_decay``. The book: chapter 22's ``pipeline_worker`` for each step's gradients,
    the book's AdamW on the stage's parameters, then every stage broadcasts its new
    parameters (the worker takes the whole model). PyTorch: ``PipelineStage`` with
    ``ScheduleGPipe``/``Schedule1F1B`` (``scale_grads=False``: the loss of a micro-batch is
    already its share of the batch's) and ``torch.optim.AdamW``. Returns, for each, the
    stage's ``grads`` (per step) and ``params`` (final), in parameter order.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    check_keys(spec, "spec", PP_KEYS)
    if world_size < 2:
        raise ValueError(f"pipeline parallelism needs at least 2 ranks, got world_size={world_size}")
    model, xs, ys = _pp_data(spec)
    m, name = spec["num_microbatches"], spec["schedule"]
    k = len(model) // world_size
    own = [list(model[s * k:(s + 1) * k].parameters()) for s in range(world_size)]
    book_opt = AdamW(own[rank], lr=spec["lr"], weight_decay=spec["weight_decay"])
    stage_module = split_stages(model, world_size)[rank]
    stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    sched = cls(stage, m, loss_fn=partial(_sum_squares_over, batch=spec["batch_size"]), scale_grads=False)
    peer_opt = torch.optim.AdamW(stage_module.parameters(), lr=spec["lr"],
                                 weight_decay=spec["weight_decay"], foreach=False)
    out: dict[str, Any] = {"book": {"grads": []}, "torch": {"grads": []}}
    for x, y in zip(xs, ys, strict=True):
        report = pipeline_worker(rank, world_size, model, x, y, m, name)
        for p, g in zip(own[rank], report.grads, strict=True):
            p.grad = g
        out["book"]["grads"].append([g.clone() for g in report.grads])
        book_opt.step()
        with torch.no_grad():
            for s in range(world_size):
                for p in own[s]:
                    dist.broadcast(p.data, src=s)
        peer_opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif rank == world_size - 1:
            sched.step(target=y)
        else:
            sched.step()
        out["torch"]["grads"].append([p.grad.clone() for p in stage_module.parameters()])
        peer_opt.step()
    out["book"]["params"] = [p.detach().clone() for p in own[rank]]
    out["torch"]["params"] = [p.detach().clone() for p in stage_module.parameters()]
    return out


# ---------------------------------------------------------------- ZeRO-1/2


def unsharded_reference(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One process, :func:`~llmbook.scale.zero.tiny_mlp` on whole batches, the book's AdamW:
    flat gradients per unit per step, and the final parameters (``spec`` as
    :func:`zero_pair_worker`; ``dtype`` optional, default float64)."""
    check_keys(spec, "spec", ("seed", "steps", "batch_size", "lr", "weight_decay"))
    dtype = getattr(torch, spec.get("dtype", "float64"))
    model = tiny_mlp(spec["seed"], dtype=dtype)
    optimizer = AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    xs, ys = make_regression_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1, dtype=dtype)
    grads = []
    for x, y in zip(xs, ys, strict=True):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads.append(_unit_grads(model))
        optimizer.step()
    return {"grads": grads, "params": [p.detach().clone() for p in model.parameters()]}


def _unit_grads(model: nn.Sequential) -> list[Tensor]:
    """Each unit's gradients flattened into one vector, for units with parameters."""
    return [torch.cat([p.grad.reshape(-1) for p in u.parameters()]).detach().clone()
            for u in model if any(True for _ in u.parameters())]


def zero_pair_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Data-parallel training of :func:`~llmbook.scale.zero.tiny_mlp` (float64) with the
    optimizer states sharded: the book's ``ZeroTrainer`` at ``spec["stage"]`` (1 or 2)
    against DDP + ``ZeroRedundancyOptimizer(optimizer_class=torch.optim.AdamW)``.

    ``spec``: ``seed``, ``steps``, ``batch_size`` (global; rank r takes its slice), ``lr``,
    ``weight_decay``, ``stage``. Returns, for each, ``grads`` (per step, the averaged gradient
    of each unit, flat, gathered in full), ``params`` (final, full) and ``optimizer_bytes``
    (Adam's m and v that this rank holds).
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    check_keys(spec, "spec", ZERO_KEYS)
    if spec["stage"] not in (1, 2):
        raise ValueError(f"spec['stage'] must be 1 or 2, got {spec['stage']!r}")
    xs, ys = make_regression_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1)
    trainer = ZeroTrainer(tiny_mlp(spec["seed"]), spec["stage"], lr=spec["lr"],
                          weight_decay=spec["weight_decay"])
    model = tiny_mlp(spec["seed"])
    ddp = DistributedDataParallel(model)
    zro = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=spec["lr"],
                                  weight_decay=spec["weight_decay"], foreach=False)
    out: dict[str, Any] = {"book": {"grads": []}, "torch": {"grads": []}}
    units = [i for i, ps in enumerate(trainer.unit_params) if ps]
    for x, y in zip(xs, ys, strict=True):
        xr, yr = shard_batch(x, rank, world_size), shard_batch(y, rank, world_size)
        trainer.step(xr, yr, F.mse_loss)
        grads = []
        for i in units:
            numel = sum(p.numel() for p in trainer.unit_params[i])
            buffer = trainer.grad_buffers[i]
            if spec["stage"] == 2:
                full = torch.empty(buffer.numel() * world_size, dtype=buffer.dtype)
                dist.all_gather_single(full, buffer)
                buffer = full
            grads.append(buffer[:numel].clone())
        out["book"]["grads"].append(grads)
        zro.zero_grad()
        F.mse_loss(ddp(xr), yr).backward()
        out["torch"]["grads"].append(_unit_grads(model))
        zro.step()
    out["book"]["params"] = trainer.full_parameters()
    out["torch"]["params"] = [p.detach().clone() for p in model.parameters()]
    out["book"]["optimizer_bytes"] = _state_bytes(trainer.optimizer)
    out["torch"]["optimizer_bytes"] = _state_bytes(zro.optim)
    return out


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's non-scalar states (Adam's m and v), local shards only."""
    total = 0
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, Tensor) and t.ndim > 0:
                t = t.to_local() if hasattr(t, "to_local") else t
                total += t.numel() * t.element_size()
    return total


# ---------------------------------------------------------------- ZeRO-3 / FSDP


def fsdp_pair_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Fully sharded data-parallel training of :func:`~llmbook.scale.zero.tiny_mlp`: the
    book's :class:`~llmbook.scale.sharded.ShardedModule` against ``fully_shard`` (on each
    linear layer and the root), both driven by ``torch.optim.AdamW``.

    ``spec``: ``seed``, ``steps``, ``batch_size`` (global), ``lr``, ``weight_decay``,
    ``dtype`` (the master weights', e.g. "float32"), ``compute_dtype`` (e.g. "bfloat16";
    equal to ``dtype`` for full precision). FSDP2 gets
    ``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=dtype)``. The loss is computed
    in the master dtype. Returns, for each, ``grads`` (per step, name -> full averaged
    gradient in the master dtype), ``params`` (final, full) and ``shard_bytes`` (the rank's
    parameter shards); ``losses`` of rank 0's slice for the book's side.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    check_keys(spec, "spec", FSDP_KEYS)
    dtype, compute = getattr(torch, spec["dtype"]), getattr(torch, spec["compute_dtype"])
    xs, ys = make_regression_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1, dtype=dtype)
    book = ShardedModule(tiny_mlp(spec["seed"], dtype=dtype), compute_dtype=compute)
    peer = tiny_mlp(spec["seed"], dtype=dtype)
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=dtype)
    for layer in peer:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(peer, mp_policy=policy)
    opts = {side: torch.optim.AdamW(m.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"],
                                    foreach=False) for side, m in (("book", book), ("torch", peer))}
    out: dict[str, Any] = {"book": {"grads": [], "losses": []}, "torch": {"grads": []}}
    for x, y in zip(xs, ys, strict=True):
        xr, yr = shard_batch(x, rank, world_size), shard_batch(y, rank, world_size)
        for side, model in (("book", book), ("torch", peer)):
            opts[side].zero_grad()
            loss = F.mse_loss(model(xr).to(dtype), yr)
            loss.backward()
            if side == "book":
                out[side]["losses"].append(float(loss.detach()))
                out[side]["grads"].append(book.full_gradients())
            else:
                out[side]["grads"].append({n: p.grad.full_tensor() for n, p in peer.named_parameters()})
            opts[side].step()
    out["book"]["params"] = book.full_parameters()
    out["book"]["shard_bytes"] = book.shard_bytes()
    out["torch"]["params"] = {n: p.full_tensor().detach().clone() for n, p in peer.named_parameters()}
    out["torch"]["shard_bytes"] = sum(p.to_local().numel() * p.element_size() for p in peer.parameters())
    return out

