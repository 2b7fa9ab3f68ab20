"""Expert parallelism: an MoE layer whose experts live on different ranks, with all-to-all.

Introduced in notebooks/22c_expert_parallelism; builds on chapter 21's single-process
:class:`~llmbook.scale.moe.MoELayer`. GShard (Lepikhin et al., 2020, "GShard: Scaling Giant
Models with Conditional Computation and Automatic Sharding", section 2.2) splits the N
experts of a layer over the P ranks of an expert-parallel group: rank r holds experts
r N/P, ..., (r + 1) N/P - 1 and its own n_r tokens; the router (and a shared expert, if any)
is replicated. One forward pass of the layer on every rank:

1. **route** its n_r tokens (:func:`~llmbook.scale.moe.route`) and decide which assignments
   fit the experts' capacity (:func:`keep_mask_across_ranks`);
2. **exchange counts**: every rank learns how many rows it will receive from each other rank
   (an all-to-all of P N/P integers), since the split sizes of the next step vary;
3. **dispatch**: an all-to-all with variable split sizes sends each kept (token, expert) copy,
   d numbers, to the rank of its expert;
4. **expert compute**: each local expert runs on the rows it received, from all ranks;
5. **combine**: the reverse all-to-all sends the expert outputs home, where they are weighted
   by the gates and summed over the token's k slots.

:class:`AllToAll` is the autograd function: its backward is the all-to-all with send and
receive splits swapped, so the layer trains. With capacity, chapter 21's rule keeps the
assignments in slot-major, token order over the *whole* batch; across ranks that order is
(slot, rank, token), and a rank finds its assignments' places in each expert's queue from
everyone's per-(slot, expert) counts (one all-gather), so the distributed layer drops exactly
the tokens that the single-process layer drops on the concatenated batch
(``capacity_scope="global"``). Megatron-LM and DeepSpeed instead apply the capacity to each
rank's tokens separately (``capacity_scope="local"``): the single-process layer called on
each rank's chunk.

Traffic. Let K[r, s] be the kept assignments of rank r's tokens whose expert lives on rank s.
A rank sends d b bytes (b bytes per value) for each remote row: forward, dispatch sends
sum_{s != r} K[r, s] rows and combine sends sum_{s != r} K[s, r]; the backward pass sends the
same again, reversed. Summed over ranks, a training step moves 4 d b sum_{r != s} K[r, s]
bytes (:func:`expert_parallel_bytes`); under uniform routing with a fraction delta dropped,
E = 4 n k (1 - delta) d b (P - 1)/P (:func:`expert_parallel_bytes_symbolic`), twice chapter
21's forward-only :func:`~llmbook.scale.moe.all_to_all_bytes`. An :class:`AllToAllCounter`
records what each call actually sent, so the chapter checks the formula against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy as sp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.scale.moe import MoELayer, capacity_keep_mask, expert_capacity, route
from llmbook.validation import (
    check_floating_tensor,
    check_index,
    check_positive_int,
    check_same_dtype,
)

__all__ = [
    "AllToAll",
    "AllToAllCounter",
    "ExpertParallelMoE",
    "all_to_all",
    "assignment_counts",
    "expert_parallel_bytes",
    "expert_parallel_bytes_symbolic",
    "gather_expert_grads",
    "keep_mask_across_ranks",
    "rank_of_expert",
    "remote_assignments",
    "run_expert_parallel_layer",
    "single_process_reference",
    "token_chunks",
]

SCOPES = ("global", "local")


# ---------------------------------------------------------------- the all-to-all, with a counter


@dataclass
class AllToAllCounter:
    """Records every all-to-all: ``(kind, rows sent to other ranks, values per row, bytes per value)``.

    Rows a rank "sends" to itself never leave it and are not counted.
    """

    calls: list[tuple[str, int, int, int]] = field(default_factory=list)

    def record(self, kind: str, rows: int, width: int, element_size: int) -> None:
        self.calls.append((kind, int(rows), int(width), int(element_size)))

    def bytes_sent(self, prefix: str = "") -> int:
        """Bytes this rank sent to other ranks in the calls whose kind starts with ``prefix``."""
        return sum(r * w * b for kind, r, w, b in self.calls if kind.startswith(prefix))


def _check_splits(splits: object, name: str, world_size: int) -> list[int]:
    if not isinstance(splits, list | tuple) or len(splits) != world_size or \
            any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in splits):
        raise ValueError(f"{name} must be a list of {world_size} non-negative ints, got {splits!r}")
    return list(splits)


def _all_to_all(x: Tensor, send: list[int], recv: list[int], kind: str,
                counter: AllToAllCounter | None, group: Any) -> Tensor:
    rank = dist.get_rank(group)
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send,
                           group=group)
    if counter is not None:
        counter.record(kind, sum(send) - send[rank], x[0].numel() if x.ndim > 1 else 1,
                       x.element_size())
    return out


class AllToAll(torch.autograd.Function):
    """All-to-all with variable splits: rank r sends ``send[s]`` rows to rank s and receives
    ``recv[s]`` rows from it. Backward: the same exchange with ``send`` and ``recv`` swapped,
    which returns each row's gradient to the rank it came from."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, send: list[int], recv: list[int], kind: str,
                counter: AllToAllCounter | None, group: Any) -> Tensor:
        ctx.send, ctx.recv, ctx.kind, ctx.counter, ctx.group = send, recv, kind, counter, group
        return _all_to_all(x, send, recv, kind + " forward", counter, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        g = _all_to_all(grad, ctx.recv, ctx.send, ctx.kind + " backward", ctx.counter, ctx.group)
        return g, None, None, None, None, None


def all_to_all(x: Tensor, send: list[int], recv: list[int], kind: str = "all-to-all",
               counter: AllToAllCounter | None = None, group: Any = None) -> Tensor:
    """Differentiable ``dist.all_to_all_single`` of the rows of x (m, ...) -> (sum(recv), ...)."""
    x = check_floating_tensor(x, "x")
    p = dist.get_world_size(group)
    send, recv = _check_splits(send, "send", p), _check_splits(recv, "recv", p)
    if x.ndim == 0 or x.shape[0] != sum(send):
        raise ValueError(f"x must have sum(send) = {sum(send)} rows, got shape {tuple(x.shape)}")
    return AllToAll.apply(x, send, recv, kind, counter, group)


# ---------------------------------------------------------------- routing bookkeeping (no processes)


def token_chunks(num_tokens: int, world_size: int) -> list[slice]:
    """The contiguous rows each rank owns: ``torch.tensor_split``'s rule (the first
    num_tokens mod P ranks get one more), so rank 0's tokens come first in the batch."""
    n = check_positive_int("num_tokens", num_tokens)
    p = check_positive_int("world_size", world_size)
    bounds = [0]
    for r in range(p):
        bounds.append(bounds[-1] + n // p + (1 if r < n % p else 0))
    return [slice(bounds[r], bounds[r + 1]) for r in range(p)]


def rank_of_expert(num_experts: int, world_size: int) -> Tensor:
    """(N,) the rank that holds each expert: N/P consecutive experts per rank."""
    n_experts = check_positive_int("num_experts", num_experts)
    p = check_positive_int("world_size", world_size)
    if n_experts % p != 0:
        raise ValueError(f"world_size={p} must divide num_experts={n_experts}: each rank holds "
                         f"the same number of experts")
    return torch.arange(n_experts) // (n_experts // p)


def _check_indices(indices: object, num_experts: int) -> Tensor:
    if not isinstance(indices, Tensor) or indices.dtype not in (torch.int64, torch.int32) or indices.ndim != 2:
        raise TypeError(f"indices must be an integer tensor of shape (n_tokens, top_k), got "
                        f"{tuple(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_experts):
        raise ValueError(f"expert indices must lie in [0, {num_experts - 1}]")
    return indices.long()


def assignment_counts(indices: Tensor, num_experts: int) -> Tensor:
    """(k, N) int64: how many of a rank's tokens chose expert e in slot j (before capacity)."""
    n_experts = check_positive_int("num_experts", num_experts)
    idx = _check_indices(indices, n_experts)
    return F.one_hot(idx.t(), n_experts).sum(dim=1)  # (k, n, N) -> (k, N)


def keep_mask_across_ranks(indices: Tensor, counts: Tensor, rank: int, capacity: int) -> Tensor:
    """Chapter 21's capacity rule for rank ``rank``'s tokens when the batch is split over ranks.

    ``indices`` (n_r, k): this rank's choices; ``counts`` (P, k, N): every rank's
    :func:`assignment_counts`. The single-process layer fills each expert's ``capacity`` slots
    in slot-major, token order over the concatenated batch (rank 0's tokens first), i.e. in
    (slot, rank, token) order. Assignment (t, j) of rank r to expert e therefore sits at place
    sum_{j' < j, all r'} c[r', j', e] + sum_{r' < r} c[r', j, e] + (its place among rank r's
    slot-j choices of e), and is kept if that place is below ``capacity``. Returns (n_r, k)
    bool, equal to the matching rows of :func:`~llmbook.scale.moe.capacity_keep_mask` on the
    whole batch.
    """
    if not isinstance(counts, Tensor) or counts.ndim != 3:
        raise ValueError(f"counts must have shape (world_size, top_k, num_experts), got "
                         f"{tuple(counts.shape) if isinstance(counts, Tensor) else type(counts).__name__}")
    p, k, n_experts = counts.shape
    check_index("rank", rank, p)
    idx = _check_indices(indices, n_experts)
    if idx.shape[1] != k:
        raise ValueError(f"indices has top_k={idx.shape[1]} columns but counts has {k} slots")
    if not torch.equal(counts[rank], assignment_counts(idx, n_experts)):
        raise ValueError(f"counts[{rank}] does not match this rank's indices")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be a non-negative int, got {capacity!r}")
    per_slot = counts.sum(dim=0)  # (k, N)
    earlier_slots = per_slot.cumsum(0) - per_slot  # (k, N): places taken by slots j' < j
    earlier_ranks = counts[:rank].sum(dim=0)  # (k, N): by ranks r' < r in slot j
    one_hot = F.one_hot(idx.t(), n_experts)  # (k, n_r, N)
    local = ((one_hot.cumsum(1) - 1) * one_hot).sum(-1)  # (k, n_r): place among this rank's
    offset = (earlier_slots + earlier_ranks).gather(1, idx.t())  # (k, n_r)
    return (offset + local < capacity).t()  # (n_r, k)


def remote_assignments(indices: Tensor, keep: Tensor, world_size: int, num_experts: int) -> Tensor:
    """K (P, P) int64: kept assignments of rank r's tokens (rows :func:`token_chunks`) whose
    expert lives on rank s. From a single-process routing of the whole batch: ``indices`` and
    ``keep`` (n, k), e.g. an :class:`~llmbook.scale.moe.MoELayer`'s ``expert_indices``/``keep``."""
    n_experts = check_positive_int("num_experts", num_experts)
    idx = _check_indices(indices, n_experts)
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool or keep.shape != idx.shape:
        raise ValueError(f"keep must be a bool tensor of shape {tuple(idx.shape)}")
    owner = rank_of_expert(n_experts, world_size)[idx]  # (n, k)
    p = world_size
    K = torch.zeros(p, p, dtype=torch.int64)
    for r, rows in enumerate(token_chunks(idx.shape[0], p)):
        dest = owner[rows][keep[rows]]
        K[r] = torch.bincount(dest, minlength=p)
    return K


def expert_parallel_bytes(remote: Tensor, d_model: int, bytes_per_value: int) -> dict[str, list[int]]:
    """Bytes each rank sends to the others in one step, from K = :func:`remote_assignments`.

    Forward: dispatch d b sum_{s != r} K[r, s], combine d b sum_{s != r} K[s, r]; the backward
    pass sends the combine volume through the dispatch's reverse and vice versa. Returns lists
    over ranks: ``"dispatch"``, ``"combine"``, ``"forward"``, ``"step"`` (forward + backward).
    """
    if not isinstance(remote, Tensor) or remote.ndim != 2 or remote.shape[0] != remote.shape[1]:
        raise ValueError("remote must be a square (world_size, world_size) tensor")
    d = check_positive_int("d_model", d_model)
    b = check_positive_int("bytes_per_value", bytes_per_value)
    off = remote - torch.diag(torch.diag(remote))  # the diagonal stays on its rank
    dispatch = [int(v) * d * b for v in off.sum(dim=1)]
    combine = [int(v) * d * b for v in off.sum(dim=0)]
    forward = [a + c for a, c in zip(dispatch, combine, strict=True)]
    return {"dispatch": dispatch, "combine": combine, "forward": forward,
            "step": [2 * f for f in forward]}


def expert_parallel_bytes_symbolic() -> sp.Expr:
    """Expected bytes of one training step, all ranks together, under uniform routing, derived.

    Each of the n k assignments is kept with probability 1 - delta and its expert lives on
    each of the P ranks with probability 1/P, so it crosses to another rank with probability
    (P - 1)/P; every crossing copy moves d b bytes in each of four all-to-alls (dispatch,
    combine, and their two reverses in the backward pass). Symbols n, k, d, b, P, delta.
    """
    n, k, d, b, P = sp.symbols("n k d b P", positive=True, integer=True)
    delta = sp.Symbol("delta", nonnegative=True)
    s = sp.Symbol("s", integer=True)
    p_cross = sp.summation(sp.Rational(1, 1) / P, (s, 1, P - 1))  # the P - 1 other ranks
    per_copy = d * b * 4  # four all-to-alls per step
    return n * k * (1 - delta) * p_cross * per_copy


# ---------------------------------------------------------------- the layer


class ExpertParallelMoE(nn.Module):
    """Rank ``rank``'s part of an expert-parallel copy of a single-process :class:`MoELayer`.

    Holds the (replicated) router, shared expert and bias of ``layer``, and its experts
    rank N/P ... (rank + 1) N/P - 1 (the same modules, not copies). ``forward`` takes this
    rank's tokens (..., d) and returns their outputs (..., d); the replicated parameters'
    gradients are partial sums over this rank's tokens (all-reduce them, as data parallelism
    does), the local experts' gradients are complete. ``capacity_scope``: "global" drops
    exactly as ``layer`` does on the concatenation of all ranks' tokens; "local" as ``layer``
    does on this rank's tokens alone. After a call: ``expert_indices``, ``keep`` (n_r, k).
    """

    def __init__(self, layer: MoELayer, rank: int, world_size: int, *,
                 capacity_scope: str = "global", counter: AllToAllCounter | None = None,
                 group: Any = None) -> None:
        super().__init__()
        if not isinstance(layer, MoELayer):
            raise TypeError(f"layer must be an llmbook MoELayer, got {type(layer).__name__}")
        if capacity_scope not in SCOPES:
            raise ValueError(f"unknown capacity_scope={capacity_scope!r}; choose one of {list(SCOPES)}")
        self.world_size = check_positive_int("world_size", world_size)
        self.rank = check_index("rank", rank, self.world_size)
        owner = rank_of_expert(layer.num_experts, self.world_size)
        self.local_experts = [int(e) for e in torch.where(owner == self.rank)[0]]
        self.layer, self.capacity_scope, self.counter, self.group = layer, capacity_scope, counter, group
        self.experts = nn.ModuleList(layer.experts[e] for e in self.local_experts)
        self.router, self.shared_expert = layer.router, layer.shared_expert
        self.shared_expert_gate = layer.shared_expert_gate
        self.expert_indices: Tensor | None = None
        self.keep: Tensor | None = None

    def _keep(self, indices: Tensor) -> Tensor:
        lay = self.layer
        if lay.capacity_factor is None:
            return torch.ones_like(indices, dtype=torch.bool)
        if self.capacity_scope == "local":
            if indices.shape[0] == 0:
                return torch.ones_like(indices, dtype=torch.bool)
            cap = expert_capacity(indices.shape[0], lay.num_experts, lay.top_k, lay.capacity_factor)
            return capacity_keep_mask(indices, lay.num_experts, cap)
        mine = assignment_counts(indices, lay.num_experts)  # (k, N)
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.group)
        if self.counter is not None:
            self.counter.record("counts all-gather", self.world_size - 1, mine.numel(), mine.element_size())
        counts = torch.stack(parts)  # (P, k, N)
        n_total = int(counts[:, 0].sum())  # every token has one first choice
        cap = expert_capacity(n_total, lay.num_experts, lay.top_k, lay.capacity_factor)
        return keep_mask_across_ranks(indices, counts, self.rank, cap)

    def forward(self, x: Tensor) -> Tensor:
        lay, p = self.layer, self.world_size
        x = check_floating_tensor(x, "x")
        if x.ndim == 0 or x.shape[-1] != lay.d_model:
            raise ValueError(f"ExpertParallelMoE expects input of shape (..., {lay.d_model}), "
                             f"got {tuple(x.shape)}")
        check_same_dtype(x, "x", self.router.weight, "the layer's weights")
        h = x.reshape(-1, lay.d_model)  # (n_r, d)
        r = route(self.router(h), lay.top_k, lay.score, lay.normalize, lay.expert_bias, lay.scaling)
        keep = self._keep(r.indices)  # (n_r, k)
        token, slot = torch.where(keep)  # kept assignments, token-major
        expert = r.indices[token, slot]
        order = torch.sort(expert, stable=True).indices  # by expert, then by token
        token, slot, expert = token[order], slot[order], expert[order]
        # exchange counts: how many rows each rank sends to each expert of each other rank
        per_expert = torch.bincount(expert, minlength=lay.num_experts)  # (N,)
        got = torch.empty_like(per_expert)
        dist.all_to_all_single(got, per_expert, group=self.group)  # (P * N/P,): from rank s, its experts
        if self.counter is not None:
            self.counter.record("counts all-to-all", per_expert.numel() * (p - 1) // p, 1,
                                per_expert.element_size())
        send = [int(c) for c in per_expert.view(p, -1).sum(dim=1)]
        got = got.view(p, -1)  # (P, N/P): rows from rank s for each local expert
        recv = [int(c) for c in got.sum(dim=1)]
        rows = all_to_all(h[token], send, recv, "dispatch", self.counter, self.group)  # (sum recv, d)
        # expert compute: expert e's rows from every rank, in rank order = the batch's token order
        start = torch.cat([got.new_zeros(1), got.reshape(-1).cumsum(0)[:-1]]).view(p, -1)
        outputs = torch.empty_like(rows)
        for i, exp in enumerate(self.experts):
            where = torch.cat([torch.arange(int(start[s, i]), int(start[s, i] + got[s, i]))
                               for s in range(p)])
            if where.numel():
                outputs = outputs.index_copy(0, where, exp(rows[where]))
        back = all_to_all(outputs, recv, send, "combine", self.counter, self.group)  # (kept, d)
        out = torch.zeros_like(h).index_add(0, token, back * r.weights[token, slot, None])
        if self.shared_expert is not None:
            shared = self.shared_expert(h)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(h)) * shared
            out = out + shared
        self.expert_indices, self.keep = r.indices.detach(), keep
        return out.reshape(x.shape)


# ---------------------------------------------------------------- workers and references


def _check_batch(layer: object, x: object, grad_out: object) -> None:
    if not isinstance(layer, MoELayer):
        raise TypeError(f"layer must be an llmbook MoELayer, got {type(layer).__name__}")
    x = check_floating_tensor(x, "x")
    g = check_floating_tensor(grad_out, "grad_out")
    if x.ndim != 2 or x.shape[1] != layer.d_model or g.shape != x.shape:
        raise ValueError(f"x and grad_out must both have shape (n_tokens, {layer.d_model}), got "
                         f"{tuple(x.shape)} and {tuple(g.shape)}")


def run_expert_parallel_layer(rank: int, world_size: int, layer: MoELayer, x: Tensor,
                              grad_out: Tensor, capacity_scope: str = "global") -> dict[str, Any]:
    """Worker for :func:`llmbook.scale.launch.run`: rank r takes rows :func:`token_chunks` of
    x (n, d) and grad_out (n, d), runs :class:`ExpertParallelMoE` forward and backward, and
    all-reduces the replicated parameters' gradients. Returns ``{"out", "x_grad", "keep",
    "grads" (state-dict name -> gradient, replicated ones summed, local experts only),
    "calls" (the :class:`AllToAllCounter`'s records)}``."""
    _check_batch(layer, x, grad_out)
    rows = token_chunks(x.shape[0], world_size)[rank]
    counter = AllToAllCounter()
    ep = ExpertParallelMoE(layer, rank, world_size, capacity_scope=capacity_scope, counter=counter)
    layer.zero_grad(set_to_none=True)
    xr = x[rows].detach().clone().requires_grad_(True)
    out = ep(xr)
    out.backward(grad_out[rows])
    local = {f"experts.{e}." for e in ep.local_experts}
    grads: dict[str, Tensor] = {}
    for name, param in layer.named_parameters():
        if name.startswith("experts."):
            if any(name.startswith(prefix) for prefix in local):
                grads[name] = torch.zeros_like(param) if param.grad is None else param.grad
            continue
        g = torch.zeros_like(param) if param.grad is None else param.grad.clone()
        dist.all_reduce(g)  # replicated: sum the ranks' partial gradients
        grads[name] = g
    return {"out": out.detach(), "x_grad": xr.grad, "keep": ep.keep, "grads": grads,
            "calls": list(counter.calls)}


def single_process_reference(layer: MoELayer, x: Tensor,
                             grad_out: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor], Tensor]:
    """The unsplit layer on the whole batch: output, input gradient, parameter gradients (by
    state-dict name; zeros for an expert that got no token) and its keep mask (n, k)."""
    _check_batch(layer, x, grad_out)
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = layer(x)
    out.backward(grad_out)
    grads = {name: (torch.zeros_like(p) if p.grad is None else p.grad.detach().clone())
             for name, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    layer.router_logits = layer.router_logits.detach()  # so the layer can be sent to the ranks
    return out.detach(), x.grad, grads, layer.keep


def gather_expert_grads(results: list[dict[str, Any]]) -> dict[str, Tensor]:
    """Full parameter gradients from the ranks' ``grads``: each expert's from its owner, the
    replicated ones (equal on every rank after the all-reduce) from rank 0."""
    if not results:
        raise ValueError("gather_expert_grads needs the results of at least one rank")
    full: dict[str, Tensor] = {}
    for r in results:
        for name, g in r["grads"].items():
            if name in full and not name.startswith("experts."):
                if not torch.equal(full[name], g):
                    raise ValueError(f"replicated gradient {name!r} differs between ranks")
            full.setdefault(name, g)
    return full
