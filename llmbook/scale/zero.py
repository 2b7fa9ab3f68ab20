"""ZeRO: shard the optimizer states, the gradients and the parameters across data-parallel ranks.

Introduced in notebooks/22_distributed_training. Plain data parallelism keeps a full copy of
everything on every rank. With Psi parameters, b_w bytes per working weight, b_g per
gradient and K bytes of optimizer state per parameter (mixed precision with Adam: 2, 2 and
K = 4 + 4 + 4 for the float32 master weight and the two moments), a rank holds
(b_w + b_g + K) Psi bytes. ZeRO (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", Figure 1) splits each of the three over the N
ranks in turn:

* stage 1 (P_os): each rank keeps and updates only 1/N of the optimizer states: after the
  gradient all-reduce, rank r steps its shard and an all-gather rebuilds the parameters;
* stage 2 (P_os+g): the gradients are reduce-scattered instead of all-reduced, so each rank
  keeps only the 1/N of the averaged gradient that its shard needs;
* stage 3 (P_os+g+p): the parameters themselves are sharded; each layer's full weights are
  all-gathered just before they are used and freed right after. PyTorch's FSDP is this
  stage (Zhao et al., 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
  Parallel").

Communication: stages 1 and 2 send what data parallelism sends (a reduce-scatter plus an
all-gather is an all-reduce); stage 3 adds one all-gather of the parameters for the backward.

:class:`ZeroTrainer` implements stages 0 (no sharding: data parallelism with a master copy)
to 3 on an ``nn.Sequential`` whose children are the sharding *units*. Each unit's parameters
are flattened, padded to a multiple of N and cut into N equal shards (rank r owns
[r S, (r+1) S)). Stage 3 runs the forward unit by unit under ``no_grad``, keeping only the
inputs of the units, and in the backward gathers each unit again and recomputes its forward
(activation checkpointing) before back-propagating through it: so a unit's full weights are
alive only while it computes. Stage 2 reduce-scatters after the whole backward, so the full
gradient exists for a moment (the paper reduce-scatters bucket by bucket during backward);
the measured peak shows it.

:func:`rank_memory` counts the bytes a rank holds (``numel * element_size`` of every
distinct storage), by category; :func:`zero_memory_per_rank_symbolic` is the formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import sympy as sp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.training.optim import AdamW, _check_adam_group
from llmbook.validation import check_index, check_keys, check_positive_int

__all__ = [
    "ZeroTrainer",
    "fsdp2_train_worker",
    "make_regression_batches",
    "rank_memory",
    "shard_bounds",
    "tiny_mlp",
    "train_unsharded",
    "zero_memory_per_rank",
    "zero_memory_per_rank_symbolic",
    "zero_train_worker",
]

CATEGORIES = ("params", "grads", "optimizer")


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int, int]:
    """(start, end, shard size S) of rank ``rank``'s shard of a flat tensor of ``numel``
    elements padded to N S, S = ceil(numel / N). The padding lives in the last shards."""
    n = check_positive_int("numel", numel)
    p = check_positive_int("world_size", world_size)
    check_index("rank", rank, p)
    size = math.ceil(n / p)
    return rank * size, (rank + 1) * size, size


def _storage_bytes(tensors: Iterable[Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class ZeroTrainer:
    """ZeRO stage 0-3 training of an ``nn.Sequential`` with AdamW (the book's, chapter 9).

    Args:
        model: the units to shard are its children; every rank must pass a model of the same
            architecture (rank 0's values are broadcast at construction).
        stage: 0 (replicated optimizer, all-reduce), 1, 2 or 3.
        lr, betas, eps, weight_decay: AdamW's hyperparameters.
        master_dtype: dtype of the master weights and Adam's moments (default: the model's).
            A bfloat16 model with ``master_dtype=torch.float32`` is the mixed-precision setup
            of the paper (2 + 2 + 12 bytes per parameter).
        group: the process group (default: the whole world).

    :meth:`step` does one training step on the rank's batch and returns its loss.
    """

    def __init__(self, model: nn.Sequential, stage: int, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, master_dtype: torch.dtype | None = None,
                 group: Any = None) -> None:
        if not isinstance(model, nn.Sequential):
            raise TypeError(f"model must be an nn.Sequential (its children are the sharding units), "
                            f"got {type(model).__name__}")
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
        _check_adam_group({"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        if master_dtype is not None and not (isinstance(master_dtype, torch.dtype) and master_dtype.is_floating_point):
            raise TypeError(f"master_dtype must be None or a floating-point torch.dtype, got {master_dtype!r}")
        first = next(model.parameters(), None)
        if first is None:
            raise ValueError("the model has no parameters")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: run inside llmbook.scale.launch.run")
        self.model, self.stage, self.group = model, stage, group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        self.units = list(model)
        self.unit_params = [[p for p in u.parameters() if p.requires_grad] for u in self.units]
        self._shapes = [[tuple(p.shape) for p in params] for params in self.unit_params]
        self.dtype, self.device = first.dtype, first.device
        self.master_dtype = master_dtype or self.dtype
        self.masters: list[nn.Parameter | None] = []
        self.param_shards: list[Tensor | None] = []  # stage 3: the rank's working-precision shard
        self.grad_buffers: list[Tensor | None] = []  # stage 0/1: full; stage 2/3: the shard
        self.peak_bytes = 0
        with torch.no_grad():
            for params in self.unit_params:
                for p in params:
                    dist.broadcast(p.data, src=src, group=group)
                if not params:
                    self.masters.append(None)
                    self.param_shards.append(None)
                    self.grad_buffers.append(None)
                    continue
                flat = self._flat(p.data for p in params)
                start, end, size = self._bounds(len(self.masters))
                if stage == 0:
                    start, end = 0, flat.numel()
                self.masters.append(nn.Parameter(flat[start:end].to(self.master_dtype).clone()))
                full_grad = stage in (0, 1)
                self.grad_buffers.append(torch.zeros(flat.numel() if full_grad else size,
                                                     dtype=self.dtype, device=self.device))
                if stage == 3:
                    self.param_shards.append(flat[start:end].clone())
                    for p in params:  # free the full weights: the shard is all the rank keeps
                        p.data = torch.empty(0, dtype=self.dtype, device=self.device)
                else:
                    self.param_shards.append(None)
        self.optimizer = AdamW([m for m in self.masters if m is not None], lr=lr, betas=betas,
                               eps=eps, weight_decay=weight_decay)
        self._record_peak()

    # -------------------------------------------------------------- flat buffers

    def _bounds(self, i: int) -> tuple[int, int, int]:
        numel = sum(math.prod(shape) for shape in self._shapes[i])
        return shard_bounds(numel, self.world_size, self.rank)

    def _flat(self, tensors: Iterable[Tensor]) -> Tensor:
        """Concatenate, flattened, and pad with zeros to a multiple of N."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        padded = math.ceil(flat.numel() / self.world_size) * self.world_size
        return F.pad(flat, (0, padded - flat.numel()))

    def _gather_unit(self, i: int) -> Tensor | None:
        """Stage 3: all-gather unit i's weights and point its parameters at the full buffer."""
        params = self.unit_params[i]
        if not params:
            return None
        shard = self.param_shards[i]
        full = torch.empty(shard.numel() * self.world_size, dtype=self.dtype, device=self.device)
        dist.all_gather_single(full, shard, group=self.group)
        offset = 0
        for p, shape in zip(params, self._shapes[i], strict=True):
            n = math.prod(shape)
            p.data = full[offset:offset + n].view(shape)
            offset += n
        return full

    def _free_unit(self, i: int) -> None:
        for p in self.unit_params[i]:
            p.data = torch.empty(0, dtype=self.dtype, device=self.device)
            p.grad = None

    def _reduce_gradients(self, i: int) -> None:
        """Average unit i's gradients over the ranks into its gradient buffer."""
        params = self.unit_params[i]
        flat = self._flat(p.grad for p in params)
        buffer = self.grad_buffers[i]
        if self.stage in (0, 1):
            dist.all_reduce(flat, group=self.group)
            buffer.copy_(flat)
            offset = 0
            for p in params:  # the rank keeps the full gradient, as views of one buffer
                p.grad = buffer[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        else:
            dist.reduce_scatter_single(buffer, flat, group=self.group)
            self._record_peak(flat)
            for p in params:
                p.grad = None
        buffer.div_(self.world_size)

    # -------------------------------------------------------------- the step

    def step(self, inputs: Tensor, targets: Tensor,
             loss_fn: Callable[[Tensor, Tensor], Tensor]) -> float:
        """One training step on this rank's batch; returns the rank's loss."""
        for params in self.unit_params:
            for p in params:
                p.grad = None
        if self.stage == 3:
            loss = self._forward_backward_sharded(inputs, targets, loss_fn)
        else:
            loss = loss_fn(self.model(inputs), targets)
            loss.backward()
            self._record_peak()
            for i, params in enumerate(self.unit_params):
                if params:
                    self._reduce_gradients(i)
        self._update()
        return float(loss.detach())

    def _forward_backward_sharded(self, inputs: Tensor, targets: Tensor,
                                  loss_fn: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        acts = [inputs]
        with torch.no_grad():
            for i, unit in enumerate(self.units):
                full = self._gather_unit(i)
                self._record_peak(full)
                acts.append(unit(acts[-1]))
                self._free_unit(i)
        out = acts[-1].detach().requires_grad_(True)
        loss = loss_fn(out, targets)
        loss.backward()
        grad = out.grad
        for i in reversed(range(len(self.units))):
            full = self._gather_unit(i)
            x = acts[i].detach()
            if x.is_floating_point():
                x.requires_grad_(True)
            y = self.units[i](x)  # recompute the unit's forward with its gathered weights
            y.backward(grad)
            self._record_peak(full)
            grad = x.grad
            if self.unit_params[i]:
                self._reduce_gradients(i)
            self._free_unit(i)
        return loss

    @torch.no_grad()
    def _update(self) -> None:
        for i, params in enumerate(self.unit_params):
            if not params:
                continue
            start, end, _ = self._bounds(i)
            grad = self.grad_buffers[i]
            if self.stage == 1:
                grad = grad[start:end]
            self.masters[i].grad = grad.to(self.master_dtype)
        self.optimizer.step()
        self._record_peak()
        for i, params in enumerate(self.unit_params):
            if not params:
                continue
            master = self.masters[i]
            master.grad = None
            if self.stage == 3:
                self.param_shards[i].copy_(master)
                continue
            if self.stage == 0:
                full = master.detach().to(self.dtype)
            else:
                full = torch.empty(master.numel() * self.world_size, dtype=self.dtype, device=self.device)
                dist.all_gather_single(full, master.detach().to(self.dtype), group=self.group)
            offset = 0
            for p in params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    # -------------------------------------------------------------- memory

    def memory(self, extra: Iterable[Tensor | None] = ()) -> dict[str, int]:
        """Bytes this rank holds now, by category (see :func:`rank_memory`)."""
        return rank_memory(self, extra)

    def _record_peak(self, *extra: Tensor | None) -> None:
        self.peak_bytes = max(self.peak_bytes, sum(self.memory(extra).values()))

    def full_parameters(self) -> list[Tensor]:
        """Every parameter in full (stage 3 gathers them: a collective, call on all ranks)."""
        out = []
        for i, params in enumerate(self.unit_params):
            if self.stage == 3 and params:
                self._gather_unit(i)
            out += [p.detach().clone() for p in params]
            if self.stage == 3 and params:
                self._free_unit(i)
        return out


def rank_memory(trainer: ZeroTrainer, extra: Iterable[Tensor | None] = ()) -> dict[str, int]:
    """Bytes of the tensors ``trainer``'s rank holds, by category, counted as the sum of
    ``numel * element_size`` over distinct storages:

    * ``params``: the model's parameters that have storage (stages 0-2: all of them; stage 3:
      none between steps) and stage 3's parameter shards, plus ``extra`` (gathered buffers);
    * ``grads``: the model's ``.grad`` tensors and the gradient buffers (full or shard);
    * ``optimizer``: master weights and every non-scalar optimizer state (Adam's m and v;
      the scalar step counters are left out), with the masters' transient ``.grad``.

    Activations are not counted.
    """
    params = [p for ps in trainer.unit_params for p in ps]
    param_bytes = _storage_bytes([*params, *trainer.param_shards, *extra])
    grad_bytes = _storage_bytes([*(p.grad for p in params), *trainer.grad_buffers])
    states = [t for s in trainer.optimizer.state.values() for t in s.values()
              if isinstance(t, Tensor) and t.ndim > 0]
    masters = [m for m in trainer.masters if m is not None]
    opt_bytes = _storage_bytes([*masters, *(m.grad for m in masters), *states])
    return {"params": param_bytes, "grads": grad_bytes, "optimizer": opt_bytes}


# ---------------------------------------------------------------- the formulas


def zero_memory_per_rank_symbolic() -> dict[int, sp.Expr]:
    """Bytes per rank at each ZeRO stage, for Psi parameters on N ranks.

    Each parameter costs b_w bytes of weight, b_g of gradient and K of optimizer state;
    stage s shards the first s of (optimizer states, gradients, weights), dividing their
    bytes by N. Rajbhandari et al. (2020), Figure 1, with b_w = b_g = 2 and K = 12.
    """
    psi, n, b_w, b_g, k = sp.symbols("Psi N b_w b_g K", positive=True)
    cost = {"params": b_w, "grads": b_g, "optimizer": k}
    sharded_from = {"optimizer": 1, "grads": 2, "params": 3}  # the stage that shards each
    return {stage: sum(cost[c] * psi / (n if stage >= sharded_from[c] else 1) for c in cost)
            for stage in range(4)}


def zero_memory_per_rank(stage: int, psi: int, world_size: int, bytes_weight: int,
                         bytes_grad: int, k: int) -> dict[str, int]:
    """The formula by category, in integers; ``psi`` must be divisible by ``world_size``
    (pad it first, as :class:`ZeroTrainer` does per unit)."""
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    for name, value in (("psi", psi), ("world_size", world_size), ("bytes_weight", bytes_weight),
                        ("bytes_grad", bytes_grad), ("k", k)):
        check_positive_int(name, value)
    if psi % world_size:
        raise ValueError(f"psi={psi} is not divisible by world_size={world_size}: pad it first")
    shard = psi // world_size
    return {"params": bytes_weight * (shard if stage >= 3 else psi),
            "grads": bytes_grad * (shard if stage >= 2 else psi),
            "optimizer": k * (shard if stage >= 1 else psi)}


# ---------------------------------------------------------------- the experiment


def tiny_mlp(seed: int, dims: tuple[int, ...] = (12, 16, 16, 8),
             dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """Linear-Tanh-...-Linear with the given widths (default 12 -> 16 -> 16 -> 8: 616
    parameters in 3 linear units of 208, 272 and 136, all divisible by 4)."""
    if not isinstance(dims, tuple | list) or len(dims) < 2 or \
            any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in dims):
        raise ValueError(f"dims must be a tuple of at least 2 positive int widths (input, ..., output), "
                         f"got {dims!r}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(dtype)


def make_regression_batches(steps: int, batch_size: int, d_in: int = 12, d_out: int = 8,
                            seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Inputs (steps, B, d_in) and targets (steps, B, d_out) = sin(x W) for a fixed random W."""
    for name, n in (("steps", steps), ("batch_size", batch_size), ("d_in", d_in), ("d_out", d_out)):
        check_positive_int(name, n)
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, batch_size, d_in, generator=g, dtype=dtype)
    w = torch.randn(d_in, d_out, generator=g, dtype=dtype) / math.sqrt(d_in)
    return x, torch.sin(x @ w)


def train_unsharded(spec: dict[str, Any]) -> tuple[list[Tensor], list[float]]:
    """The reference: one process, whole batches, AdamW on the model itself. ``spec``:
    ``seed``, ``steps``, ``batch_size`` (global), ``lr``, ``weight_decay``."""
    check_keys(spec, "spec", ("seed", "steps", "batch_size", "lr", "weight_decay"))
    model = tiny_mlp(spec["seed"])
    optimizer = AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    losses = []
    xs, ys = make_regression_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1)
    for x, y in zip(xs, ys, strict=True):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return [p.detach().clone() for p in model.parameters()], losses


def zero_train_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """ZeRO stage ``spec["stage"]`` on this rank's slice of each batch (``spec`` as
    :func:`train_unsharded`; optional ``dtype``/``master_dtype`` names, e.g. "bfloat16").
    Returns the final full parameters, the memory by category after the last step, the
    peak and the losses."""
    from llmbook.scale.data_parallel import shard_batch

    dtype = getattr(torch, spec.get("dtype", "float64"))
    master = getattr(torch, spec.get("master_dtype", spec.get("dtype", "float64")))
    model = tiny_mlp(spec["seed"] + rank, dtype=dtype)  # rank 0's values win at the broadcast
    trainer = ZeroTrainer(model, spec["stage"], lr=spec["lr"], weight_decay=spec["weight_decay"],
                          master_dtype=master)
    xs, ys = make_regression_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1,
                                     dtype=dtype)
    losses = [trainer.step(shard_batch(x, rank, world_size), shard_batch(y, rank, world_size),
                           F.mse_loss) for x, y in zip(xs, ys, strict=True)]
    memory = trainer.memory()
    return {"params": trainer.full_parameters(), "memory": memory, "peak": trainer.peak_bytes,
            "losses": losses}


def fsdp2_train_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """The same training with PyTorch's FSDP2 (``fully_shard`` on each linear layer and on
    the root) and ``torch.optim.AdamW``. Returns full parameters, the shapes of the rank's
    local parameter shards and the bytes of its local shards and optimizer states."""
    from torch.distributed.fsdp import fully_shard  # imported here: it takes seconds

    from llmbook.scale.data_parallel import shard_batch

    model = tiny_mlp(spec["seed"])
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"],
                                  weight_decay=spec["weight_decay"], foreach=False)
    xs, ys = make_regression_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1)
    for x, y in zip(xs, ys, strict=True):
        optimizer.zero_grad()
        F.mse_loss(model(shard_batch(x, rank, world_size)), shard_batch(y, rank, world_size)).backward()
        optimizer.step()
    local = [p.to_local() for p in model.parameters()]
    states = [t.to_local() if hasattr(t, "to_local") else t
              for s in optimizer.state.values() for t in s.values()]
    return {"params": [p.full_tensor().detach().clone() for p in model.parameters()],
            "local_shapes": [tuple(t.shape) for t in local],
            "param_bytes": sum(t.numel() * t.element_size() for t in local),
            "optimizer_bytes": sum(t.numel() * t.element_size() for t in states if t.ndim > 0)}
