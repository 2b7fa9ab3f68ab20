"""A ZeRO-3 / FSDP-style sharded module that any torch optimizer can drive.

Introduced in notebooks/22d_torch_peers. Chapter 22's :class:`~llmbook.scale.zero.ZeroTrainer`
owns its optimizer and its training step. :class:`ShardedModule` is the other design, the one
of PyTorch's FSDP (Zhao et al., 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel"): a module wrapper whose ``parameters()`` are the rank's *shards* of the master
weights, so that ``torch.optim.AdamW(wrapped.parameters())``, or any other optimizer, steps
them with no knowledge of the sharding (elementwise optimizers give the same update on a
shard as on the whole tensor). Each child of an ``nn.Sequential`` is a *unit*:

* at construction its parameters are flattened, padded to a multiple of N and cut into N
  equal shards (:func:`~llmbook.scale.zero.shard_bounds`); rank r keeps shard r as an
  ``nn.Parameter`` in the master dtype (float32 in mixed precision) and frees the rest;
* in the forward, the shard is cast to the *compute dtype* (bfloat16, say) and all-gathered
  into the unit's full flat weights, which the unit uses through
  ``torch.func.functional_call``; the all-gather is an autograd function whose backward is
  the conjugate collective, a reduce-scatter: each rank receives the sum of the ranks'
  gradients of its shard, cast to the master dtype before the reduction and divided by N
  (data parallelism's average);
* each unit runs under non-reentrant activation checkpointing, so its full weights are not
  kept between forward and backward: the backward gathers them again and recomputes the
  unit (as chapter 22's stage 3 does), and they live only while the unit computes.

With ``compute_dtype=None`` the unit computes in the master dtype. This is ZeRO stage 3
(Rajbhandari et al., 2020) with mixed precision in the manner of Micikevicius et al. (2018):
working copies in 16 bits, master weights, optimizer states and gradient reduction in 32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from llmbook.scale.zero import shard_bounds

__all__ = ["GatherShard", "ShardedModule"]


class GatherShard(torch.autograd.Function):
    """All-gather forward, reduce-scatter (averaged, in the shard's dtype) backward.

    Forward: the rank's shard (S,) in the master dtype -> the full flat buffer (N S,) in
    ``compute_dtype``. Backward: the full gradient (N S,) in the compute dtype is cast to the
    shard's dtype, reduce-scattered (sum) and divided by N -> the shard's gradient (S,).
    """

    @staticmethod
    def forward(ctx: Any, shard: Tensor, compute_dtype: torch.dtype, group: Any) -> Tensor:
        ctx.group, ctx.dtype = group, shard.dtype
        n = dist.get_world_size(group)
        full = torch.empty(shard.numel() * n, dtype=compute_dtype, device=shard.device)
        dist.all_gather_single(full, shard.detach().to(compute_dtype).contiguous(), group=group)
        return full

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        n = dist.get_world_size(ctx.group)
        grad = grad.to(ctx.dtype).contiguous()
        shard = torch.empty(grad.numel() // n, dtype=ctx.dtype, device=grad.device)
        dist.reduce_scatter_single(shard, grad, group=ctx.group)
        return shard.div_(n), None, None


class ShardedModule(nn.Module):
    """Shard an ``nn.Sequential`` over the data-parallel ranks, ZeRO-3 style.

    Args:
        module: its children are the sharding units; every rank must pass a module of the
            same architecture (rank 0's values are broadcast). Its floating-point parameters
            give the master dtype.
        compute_dtype: dtype of the gathered working weights and of the computation
            (default: the master dtype). Inputs are cast to it.
        group: the process group (default: the whole world).

    ``parameters()`` yields one flat shard (S_i,) per unit that has parameters; drive them
    with any torch optimizer. ``forward(x)`` maps (B, ...) to the module's output in the
    compute dtype. Call it, and the backward, on every rank: both run collectives.
    """

    def __init__(self, module: nn.Sequential, compute_dtype: torch.dtype | None = None,
                 group: Any = None) -> None:
        super().__init__()
        if not isinstance(module, nn.Sequential):
            raise TypeError(f"module must be an nn.Sequential (its children are the sharding "
                            f"units), got {type(module).__name__}")
        first = next(module.parameters(), None)
        if first is None:
            raise ValueError("module has no parameters to shard")
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype)
                                              and compute_dtype.is_floating_point):
            raise TypeError(f"compute_dtype must be None or a floating-point torch.dtype, got {compute_dtype!r}")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: run inside llmbook.scale.launch.run")
        self.group = group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.master_dtype = first.dtype
        self.compute_dtype = compute_dtype or first.dtype
        src = dist.get_global_rank(group, 0) if group is not None else 0
        self._units = list(module)  # a plain list: the units' own parameters are not ours
        self._names: list[list[str]] = []
        self._shapes: list[list[tuple[int, ...]]] = []
        self._prefix = [name for name, _ in module.named_children()]
        self.shards = nn.ParameterList()
        self._index: list[int | None] = []
        with torch.no_grad():
            for unit in self._units:
                named = [(n, p) for n, p in unit.named_parameters()]
                for _, p in named:
                    dist.broadcast(p.data, src=src, group=group)
                self._names.append([n for n, _ in named])
                self._shapes.append([tuple(p.shape) for _, p in named])
                if not named:
                    self._index.append(None)
                    continue
                flat = torch.cat([p.reshape(-1) for _, p in named])
                start, end, size = shard_bounds(flat.numel(), self.world_size, self.rank)
                flat = F.pad(flat, (0, size * self.world_size - flat.numel()))
                self._index.append(len(self.shards))
                self.shards.append(nn.Parameter(flat[start:end].clone()))
                for _, p in named:  # free the full weights: the shard is all the rank keeps
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                    p.requires_grad_(False)

    def _views(self, i: int, full: Tensor) -> dict[str, Tensor]:
        out, offset = {}, 0
        for name, shape in zip(self._names[i], self._shapes[i], strict=True):
            n = math.prod(shape)
            out[name] = full[offset:offset + n].view(shape)
            offset += n
        return out

    def _run_unit(self, i: int, x: Tensor, shard: Tensor) -> Tensor:
        full = GatherShard.apply(shard, self.compute_dtype, self.group)
        return torch.func.functional_call(self._units[i], self._views(i, full), (x,))

    def forward(self, x: Tensor) -> Tensor:
        if x.is_floating_point():
            x = x.to(self.compute_dtype)
        for i, unit in enumerate(self._units):
            k = self._index[i]
            if k is None:
                x = unit(x)
            else:
                x = checkpoint(self._run_unit, i, x, self.shards[k], use_reentrant=False)
        return x

    def _gather(self, tensors: list[Tensor | None]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for i, k in enumerate(self._index):
            if k is None:
                continue
            t = tensors[k]
            if t is None:
                t = torch.zeros_like(self.shards[k])
            full = torch.empty(t.numel() * self.world_size, dtype=t.dtype, device=t.device)
            dist.all_gather_single(full, t.detach().contiguous(), group=self.group)
            for name, view in self._views(i, full).items():
                out[f"{self._prefix[i]}.{name}"] = view.clone()
        return out

    def full_parameters(self) -> dict[str, Tensor]:
        """Every master weight in full, named as in the wrapped module (a collective)."""
        return self._gather(list(self.shards))

    def full_gradients(self) -> dict[str, Tensor]:
        """The averaged gradients in full, in the master dtype (a collective; zeros where a
        shard has no gradient yet)."""
        return self._gather([s.grad for s in self.shards])

    def shard_bytes(self) -> int:
        """Bytes of the master shards this rank holds: sum of S_i times the element size."""
        return sum(s.numel() * s.element_size() for s in self.shards)
