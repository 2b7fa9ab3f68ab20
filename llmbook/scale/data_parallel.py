"""Data parallelism: every rank holds the whole model and a slice of the batch.

Introduced in notebooks/22_distributed_training. With p ranks and a global batch of B
examples, rank r computes the gradient g_r of the mean loss over its B/p examples; the mean
of the g_r is the gradient of the mean loss over the whole batch, so after one all-reduce
(and a division by p) every rank applies the same update and the replicas stay identical.

:class:`BucketedDataParallel` does it the way PyTorch's ``DistributedDataParallel`` does
(Li et al., 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB):

* at construction, rank 0's parameters are broadcast so that all replicas start equal;
* the parameters are grouped into *buckets* of about ``bucket_cap_bytes``, in reverse order
  of registration (roughly the order in which backward produces their gradients);
* a hook on each parameter (``register_post_accumulate_grad_hook``) fires when its gradient
  is ready; when the last gradient of a bucket arrives, the bucket's gradients are copied
  into one flat buffer and an asynchronous all-reduce of it starts, while backward goes on
  computing the gradients of earlier layers: communication overlaps computation;
* :meth:`BucketedDataParallel.finish_gradient_sync` waits for the all-reduces, divides by p
  and copies the averages back into ``.grad``.

Also: :func:`shard_batch` (rank r's slice of a batch), a tiny language model
(:func:`tiny_language_model`) and the workers the notebook runs with
:func:`llmbook.scale.launch.run` (:func:`ddp_train_worker`), plus
:func:`train_single_process`, the reference they must agree with; both, and the workbench's
Part VI check, run the one loop :func:`train_steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.training.optim import AdamW
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.validation import check_index, check_keys, check_positive_int

__all__ = [
    "BucketedDataParallel",
    "ddp_train_worker",
    "make_batches",
    "shard_batch",
    "tiny_language_model",
    "train_single_process",
    "train_steps",
]


def shard_batch(batch: Tensor, rank: int, world_size: int) -> Tensor:
    """Rank ``rank``'s contiguous slice of ``batch`` along dim 0: rows [r B/p, (r+1) B/p).

    ``batch`` has shape (B, ...); B must be divisible by p, so that every rank's mean loss
    weighs its examples as the global mean does.
    """
    p = check_positive_int("world_size", world_size)
    check_index("rank", rank, p)
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"batch must be a torch.Tensor, got {type(batch).__name__}")
    if batch.ndim == 0:
        raise ValueError("batch must have a batch dimension, got a 0-d tensor")
    if batch.shape[0] % p:
        raise ValueError(f"the batch size {batch.shape[0]} is not divisible by world_size={p}")
    per_rank = batch.shape[0] // p
    return batch[rank * per_rank:(rank + 1) * per_rank]


@dataclass
class _Bucket:
    params: list[nn.Parameter]
    buffer: Tensor
    pending: int = 0
    work: Any = None
    views: list[Tensor] = field(default_factory=list)


class BucketedDataParallel(nn.Module):
    """Data-parallel wrapper with gradient buckets and hook-driven asynchronous all-reduce.

    Use as ``model = BucketedDataParallel(module)``; ``loss(model(x)).backward()``; then
    ``model.finish_gradient_sync()`` before ``optimizer.step()``. Parameters that need no
    gradient are skipped; every other parameter must receive a gradient in each backward
    (an unused parameter makes :meth:`finish_gradient_sync` raise, as its bucket never
    fills). ``launch_log`` records, for the last backward, each bucket's index in launch
    order and how many parameters were still waiting for their gradient at that moment:
    a positive number means the all-reduce ran while backward was still computing.
    """

    def __init__(self, module: nn.Module, bucket_cap_bytes: int = 25 * 2**20,
                 group: Any = None) -> None:
        super().__init__()
        check_positive_int("bucket_cap_bytes", bucket_cap_bytes)
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("module has no parameter that requires a gradient")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: run inside llmbook.scale.launch.run")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        with torch.no_grad():
            src = dist.get_global_rank(group, 0) if group is not None else 0
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=src, group=group)
        self.buckets: list[_Bucket] = []
        current: list[nn.Parameter] = []
        size = 0
        for p in reversed(params):  # backward meets the last layers first
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_cap_bytes:
                self._add_bucket(current)
                current, size = [], 0
        if current:
            self._add_bucket(current)
        self._bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b.params}
        self._waiting = 0
        self.launch_log: list[tuple[int, int]] = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._gradient_ready)

    def _add_bucket(self, params: list[nn.Parameter]) -> None:
        first = params[0]
        buffer = torch.zeros(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
        if any(p.dtype != first.dtype or p.device != first.device for p in params):
            raise ValueError("all parameters of a bucket must share dtype and device")
        views = list(buffer.split([p.numel() for p in params]))
        self.buckets.append(_Bucket(params=list(params), buffer=buffer, views=views))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module; arm the buckets for the backward that follows."""
        for bucket in self.buckets:
            bucket.pending, bucket.work = len(bucket.params), None
        self._waiting = sum(len(b.params) for b in self.buckets)
        self.launch_log = []
        return self.module(*args, **kwargs)

    def _gradient_ready(self, p: Tensor) -> None:
        """Called by autograd once ``p.grad`` is final for this backward."""
        index = self._bucket_of[p]
        bucket = self.buckets[index]
        bucket.pending -= 1
        self._waiting -= 1
        if bucket.pending == 0:
            with torch.no_grad():
                for view, q in zip(bucket.views, bucket.params, strict=True):
                    view.copy_(q.grad.reshape(-1))
            bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
            self.launch_log.append((index, self._waiting))

    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """Wait for every bucket's all-reduce and write the averaged gradients into ``.grad``."""
        for index, bucket in enumerate(self.buckets):
            if bucket.work is None:
                missing = [tuple(q.shape) for q in bucket.params if q.grad is None]
                raise RuntimeError(f"bucket {index} was never all-reduced: some of its parameters "
                                   f"got no gradient in this backward (shapes {missing}); every "
                                   f"parameter that requires a gradient must be used")
            bucket.work.wait()
            bucket.buffer.div_(self.world_size)
            for view, q in zip(bucket.views, bucket.params, strict=True):
                q.grad.copy_(view.view_as(q.grad))
            bucket.work = None


# ---------------------------------------------------------------- the experiment


def tiny_language_model(seed: int, dtype: torch.dtype = torch.float64) -> TransformerLM:
    """The book's TransformerLM, tiny: V = 32, d = 16, 2 layers, 2 heads, context 8.

    Used by the chapter-22 experiments, where every rank builds the same model from ``seed``.
    """
    config = TransformerConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_seq_len=8,
                               fused_attention=False)
    return TransformerLM(config, generator=torch.Generator().manual_seed(seed)).to(dtype)


def make_batches(steps: int, batch_size: int, seq_len: int = 8, vocab_size: int = 32,
                 seed: int = 0) -> Tensor:
    """``steps`` global batches of random token ids, shape (steps, batch_size, seq_len + 1)."""
    for name, n in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len), ("vocab_size", vocab_size)):
        check_positive_int(name, n)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (steps, batch_size, seq_len + 1), generator=g)


def _lm_loss(model: nn.Module, tokens: Tensor) -> Tensor:
    logits = model(tokens[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train_steps(model: nn.Module, spec: dict[str, Any], rank: int = 0, world_size: int = 1,
                forward: nn.Module | None = None,
                sync: Callable[[], None] | None = None) -> tuple[dict[str, Tensor], list[float]]:
    """The loop every run of the chapter-22 experiment shares: ``spec["steps"]`` AdamW steps
    (lr ``spec["lr"]``, weight decay 0.01) on the global batches of :func:`make_batches`, each
    cut to rank ``rank``'s shard (:func:`shard_batch`; the whole batch when ``world_size`` is
    1). ``forward`` is what the loss runs through (a data-parallel wrapper of ``model``; by
    default ``model``), and ``sync()`` runs between the backward and the step (the gradient
    all-reduce). Returns the final state dict of ``model`` and this rank's losses.
    """
    check_keys(spec, "spec", ("seed", "steps", "batch_size", "lr"))
    optimizer = AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.01)
    losses = []
    for tokens in make_batches(spec["steps"], spec["batch_size"], seed=spec["seed"] + 1):
        loss = _lm_loss(forward if forward is not None else model,
                        shard_batch(tokens, rank, world_size))
        optimizer.zero_grad()
        loss.backward()
        if sync is not None:
            sync()
        optimizer.step()
        losses.append(float(loss.detach()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def train_single_process(spec: dict[str, Any]) -> tuple[dict[str, Tensor], list[float]]:
    """The reference: one process, the whole global batch, AdamW. Returns (state, losses).

    ``spec`` holds ``seed``, ``steps``, ``batch_size`` (global), ``lr``.
    """
    return train_steps(tiny_language_model(spec["seed"]), spec)


def ddp_train_worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Data-parallel training on rank ``rank``; ``spec`` as :func:`train_single_process`,
    plus ``implementation``: ``"book"`` (:class:`BucketedDataParallel`, with
    ``bucket_cap_bytes``) or ``"torch"`` (``torch.nn.parallel.DistributedDataParallel``).

    Every rank builds the model from a *different* seed (seed + rank): the wrapper's initial
    broadcast must make them equal. Returns the final state dict, the rank's own losses and
    the last backward's bucket launch log (empty for torch).
    """
    model = tiny_language_model(spec["seed"] + rank)  # deliberately different per rank
    if spec["implementation"] == "book":
        ddp = BucketedDataParallel(model, bucket_cap_bytes=spec.get("bucket_cap_bytes", 4096))
    elif spec["implementation"] == "torch":
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=spec.get("bucket_cap_bytes", 4096) / 2**20)
    else:
        raise ValueError(f"implementation must be 'book' or 'torch', got {spec['implementation']!r}")
    book = isinstance(ddp, BucketedDataParallel)
    state, losses = train_steps(model, spec, rank, world_size, forward=ddp,
                                sync=ddp.finish_gradient_sync if book else None)
    log = list(ddp.launch_log) if book else []
    buckets = [len(b.params) for b in ddp.buckets] if book else []
    return {"state": state, "losses": losses, "launch_log": log, "bucket_sizes": buckets}
