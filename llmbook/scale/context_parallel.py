"""Context parallelism: ring attention, zig-zag load balancing and Ulysses all-to-all.

Introduced in notebooks/22b_context_parallelism. Data, tensor and pipeline parallelism
(chapter 22) all keep a whole sequence on every rank, so the activations of one long
sequence must fit on one device. *Context parallelism* splits the sequence itself: each of
p ranks holds T/p positions of the queries, keys and values (B, H, T/p, d). Everything in a
transformer block is position-wise except attention, where every query needs every key.
Two ways to give it them:

* **Ring attention** (Liu, Zaharia & Abbeel, 2023, "Ring Attention with Blockwise
  Transformers for Near-Infinite Context"): the K/V blocks travel round a ring of ranks,
  p - 1 hops, and each rank folds every block into its queries' partial result with
  chapter 14's merge rule (:func:`llmbook.inference.flash.merge_softmax_states`) on the
  partial outputs and their log-sum-exps. The backward passes the K/V blocks round again,
  together with their gradient accumulators dK, dV, which arrive home after p hops; each
  pair of blocks is differentiated with chapter 14's
  :func:`~llmbook.inference.flash.flash_attention_backward_reference`, which recomputes the
  probabilities from the *global* log-sum-exp. Per rank, with a K and a V block of
  n_k = B H (T/p) d_k and n_v = B H (T/p) d_v elements: the forward sends (p - 1)(n_k + n_v)
  elements and the backward (p - 1)(n_k + n_v) + p (n_k + n_v).
* **Zig-zag sharding** for causal masks (the layout of Megatron-LM's context parallelism;
  Brandon et al., 2023, "Striped Attention", balance the same imbalance by striping): with
  contiguous shards the last rank's queries see every key and the first rank's almost none.
  Cutting the sequence into 2p chunks and giving rank r chunks r and 2p - 1 - r gives every
  rank the same number of unmasked scores.
* **Ulysses** (Jacobs et al., 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
  Training of Extreme Long Sequence Transformer Models"): one all-to-all turns the
  sequence-sharded q, k, v (B, H, T/p, d) into head-sharded ones (B, H/p, T, d), attention
  runs on whole sequences, and a second all-to-all turns the output back. Each all-to-all
  moves (p - 1)/p of the tensor off the rank: 4 (p - 1)/p B H (T/p) d elements per rank in
  the forward (q, k, v, out) and as many in the backward. Needs p to divide H.

Contents:

* layouts: :func:`chunk_layout`, :func:`shard_sequence`, :func:`gather_sequence`;
* work balance: :func:`causal_work_per_rank` (closed form) and
  :func:`causal_work_symbolic` (SymPy);
* communication: :class:`CommCounter` (wraps the sends and all-to-alls and counts nbytes),
  :func:`ring_attention_bytes_per_rank`, :func:`ulysses_bytes_per_rank`,
  :func:`context_parallel_bytes_symbolic`;
* :func:`ring_attention` (:class:`RingAttentionFunction`) and :func:`ulysses_attention`, to
  call inside a process group of :func:`llmbook.scale.launch.run`;
* workers for :func:`~llmbook.scale.launch.run`: :func:`ring_attention_worker`,
  :func:`ulysses_attention_worker`, and their single-process peer :func:`sdpa_with_grads`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy as sp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from llmbook.inference.flash import (
    flash_attention_backward_reference,
    flash_attention_reference,
    merge_softmax_states,
)
from llmbook.validation import check_floating_tensor, check_index, check_positive_int

__all__ = [
    "CommCounter",
    "LAYOUTS",
    "RingAttentionFunction",
    "causal_work_per_rank",
    "causal_work_symbolic",
    "chunk_layout",
    "context_parallel_bytes_symbolic",
    "gather_sequence",
    "ring_attention",
    "ring_attention_bytes_per_rank",
    "ring_attention_worker",
    "sdpa_with_grads",
    "shard_sequence",
    "ulysses_attention",
    "ulysses_attention_worker",
    "ulysses_bytes_per_rank",
]

#: The two ways of cutting a sequence among ranks.
LAYOUTS = ("contiguous", "zigzag")


# ---------------------------------------------------------------- layouts


def chunk_layout(world_size: int, layout: str = "contiguous") -> list[list[int]]:
    """The chunks of the sequence that each rank holds, in order: ``[[chunks of rank 0], ...]``.

    ``"contiguous"`` cuts the sequence into p chunks and gives rank r chunk r; ``"zigzag"``
    cuts it into 2p chunks and gives rank r chunks r and 2p - 1 - r, so that a rank holding
    an early (cheap, under a causal mask) chunk also holds a late (expensive) one.
    """
    p = check_positive_int("world_size", world_size)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "contiguous":
        return [[r] for r in range(p)]
    return [[r, 2 * p - 1 - r] for r in range(p)]


def _chunk_size(T: int, world_size: int, layout: str) -> int:
    n_chunks = world_size * len(chunk_layout(world_size, layout)[0])
    if T % n_chunks:
        raise ValueError(f"the {layout} layout cuts the sequence into {n_chunks} equal chunks; "
                         f"T={T} is not a multiple of {n_chunks}")
    return T // n_chunks


def shard_sequence(x: Tensor, rank: int, world_size: int, layout: str = "contiguous") -> Tensor:
    """Rank ``rank``'s part of x (..., T, d): its chunks of the sequence, concatenated in order.

    Returns (..., T/p, d). T must be a multiple of the number of chunks (p or 2p).
    """
    check_floating_tensor(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., T, d), got {tuple(x.shape)}")
    layout_ = chunk_layout(world_size, layout)
    rank = check_index("rank", rank, world_size)
    c = _chunk_size(x.shape[-2], world_size, layout)
    return torch.cat([x[..., a * c:(a + 1) * c, :] for a in layout_[rank]], dim=-2)


def gather_sequence(shards: list[Tensor], layout: str = "contiguous") -> Tensor:
    """Inverse of :func:`shard_sequence`: the full (..., T, d) from the p ranks' shards."""
    if not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError("shards must be a non-empty list of tensors, one per rank")
    layout_ = chunk_layout(len(shards), layout)
    per_rank = len(layout_[0])
    pieces: dict[int, Tensor] = {}
    for rank, shard in enumerate(shards):
        check_floating_tensor(shard, f"shards[{rank}]")
        if shard.shape != shards[0].shape or shard.shape[-2] % per_rank:
            raise ValueError(f"every shard must have shard 0's shape {tuple(shards[0].shape)} "
                             f"with a length divisible by {per_rank}, got {tuple(shard.shape)}")
        for a, piece in zip(layout_[rank], shard.chunk(per_rank, dim=-2), strict=True):
            pieces[a] = piece
    return torch.cat([pieces[a] for a in sorted(pieces)], dim=-2)


# ---------------------------------------------------------------- work balance


def causal_work_per_rank(T: int, world_size: int, layout: str = "contiguous") -> list[int]:
    """Unmasked (query, key) score entries of a causal mask that each rank's queries own.

    Query at position i sees i + 1 keys. A chunk a of c = T/n positions owns
    sum_{i=ac}^{ac+c-1} (i + 1) = a c^2 + c (c + 1)/2 entries: contiguous rank r owns
    r c^2 + c (c + 1)/2 (growing with r), zig-zag rank r owns (2p - 1) c^2 + c (c + 1) (the
    same for all). The ring computes exactly these entries.
    """
    layout_ = chunk_layout(world_size, layout)
    T = check_positive_int("T", T)
    c = _chunk_size(T, world_size, layout)
    return [sum(a * c * c + c * (c + 1) // 2 for a in chunks) for chunks in layout_]


def causal_work_symbolic() -> dict[str, sp.Expr]:
    """SymPy: work per rank under a causal mask, and the max/mean imbalance, by summing queries.

    Sums i + 1 over the query positions of each rank (symbols T, p, r); returns
    ``contiguous`` and ``zigzag`` (work of rank r), ``total`` (T (T + 1)/2) and
    ``imbalance_contiguous`` = work of the last rank / mean work, which tends to 2 as p grows.
    """
    T, p = sp.symbols("T p", positive=True, integer=True)
    r, i = sp.symbols("r i", nonnegative=True, integer=True)

    def chunk_work(a: sp.Expr, c: sp.Expr) -> sp.Expr:
        return sp.summation(i + 1, (i, a * c, a * c + c - 1))

    contiguous = sp.factor(chunk_work(r, T / p))
    zigzag = sp.factor(chunk_work(r, T / (2 * p)) + chunk_work(2 * p - 1 - r, T / (2 * p)))
    total = sp.factor(sp.summation(i + 1, (i, 0, T - 1)))
    imbalance = sp.simplify(contiguous.subs(r, p - 1) / (total / p))
    return {"contiguous": contiguous, "zigzag": zigzag, "total": total,
            "imbalance_contiguous": imbalance}


# ---------------------------------------------------------------- communication


@dataclass
class CommCounter:
    """Bytes a rank sends, recorded at each send or all-to-all: ``(kind, bytes)`` per call.

    The ring records the nbytes of every tensor it passes to its right neighbour; the
    all-to-all records the nbytes of the input slices addressed to *other* ranks (the slice
    a rank keeps for itself never leaves it).
    """

    calls: list[tuple[str, int]] = field(default_factory=list)

    def record(self, kind: str, nbytes: int) -> None:
        self.calls.append((kind, int(nbytes)))

    def bytes(self, kind_prefix: str = "") -> int:
        """Total bytes of the calls whose kind starts with ``kind_prefix`` (all by default)."""
        return sum(b for k, b in self.calls if k.startswith(kind_prefix))


def ring_attention_bytes_per_rank(shape_k: tuple[int, ...], d_v: int, world_size: int,
                                  bytes_per_element: int = 8) -> dict[str, int]:
    """Bytes one rank sends in ring attention: ``forward``, ``backward`` and ``total``.

    ``shape_k`` is the local K shard (..., T/p, d_k); V has the same shape with d_v. With
    n = numel(K) + numel(V): forward (p - 1) n (p - 1 hops of the K/V block); backward
    (p - 1) n for the K/V blocks plus p n for dK, dV (they travel with the block and take one
    more hop home).
    """
    p = check_positive_int("world_size", world_size)
    d_v = check_positive_int("d_v", d_v)
    b = check_positive_int("bytes_per_element", bytes_per_element)
    if len(shape_k) < 2:
        raise ValueError(f"shape_k must be (..., T/p, d_k), got {shape_k}")
    n_k = 1
    for s in shape_k:
        n_k *= check_positive_int("shape_k entries", s)
    n = n_k + n_k // shape_k[-1] * d_v
    forward = (p - 1) * n * b
    backward = ((p - 1) + (p if p > 1 else 0)) * n * b
    return {"forward": forward, "backward": backward, "total": forward + backward}


def ulysses_bytes_per_rank(shape_qk: tuple[int, ...], d_v: int, world_size: int,
                           bytes_per_element: int = 8) -> dict[str, int]:
    """Bytes one rank sends in Ulysses attention: ``forward``, ``backward`` and ``total``.

    ``shape_qk`` = (B, H, T/p, d_k) is the local q (and k) shard; v and the output have d_v.
    Each all-to-all keeps 1/p of its input and sends the rest. Forward: q, k, v in and the
    output back, (p - 1)/p (2 n_k + 2 n_v); backward: dout in and dq, dk, dv back, the same;
    n_k, n_v the elements of one local shard.
    """
    p = check_positive_int("world_size", world_size)
    d_v = check_positive_int("d_v", d_v)
    b = check_positive_int("bytes_per_element", bytes_per_element)
    if len(shape_qk) != 4:
        raise ValueError(f"shape_qk must be (B, H, T/p, d_k), got {shape_qk}")
    for s in shape_qk:
        check_positive_int("shape_qk entries", s)
    B, H, t, d_k = shape_qk
    if H % p:
        raise ValueError(f"Ulysses needs world_size={p} to divide the heads H={H}")
    per_pass = 2 * B * H * t * (d_k + d_v) * (p - 1) // p * b
    return {"forward": per_pass, "backward": per_pass, "total": 2 * per_pass}


def context_parallel_bytes_symbolic() -> dict[str, sp.Expr]:
    """SymPy: bytes per rank of one attention forward + backward, ring and Ulysses.

    Symbols B, H, T, d (d_k = d_v), p ranks, b bytes per element. Ring: sum over the p - 1
    forward hops and the p - 1 + p backward hops of one K and one V block of B H (T/p) d.
    Ulysses: 8 all-to-alls, each of which sends p - 1 of its p slices of B H (T/p) d / p.
    Returns ``ring``, ``ulysses`` and their ``ratio`` (ring / Ulysses). Valid for p >= 2: a
    single rank sends nothing, while the ring sum still counts the dK, dV hop home.
    """
    B, H, T, d, p, b = sp.symbols("B H T d p b", positive=True, integer=True)
    s = sp.symbols("s", integer=True, nonnegative=True)
    block = 2 * B * H * (T / p) * d * b  # one K block and one V block
    ring = (sp.summation(block, (s, 1, p - 1))  # forward hops
            + sp.summation(block, (s, 1, p - 1))  # backward: K, V
            + sp.summation(block, (s, 1, p)))  # backward: dK, dV, one hop more
    slice_ = B * H * (T / p) * d * b / p
    ulysses = 8 * sp.summation(slice_, (s, 1, p - 1))
    ring, ulysses = sp.factor(ring), sp.factor(ulysses)
    return {"ring": ring, "ulysses": ulysses, "ratio": sp.factor(ring / ulysses)}


# ---------------------------------------------------------------- ring attention


def _neighbours() -> tuple[int, int, int, int]:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: run inside llmbook.scale.launch.run")
    p, r = dist.get_world_size(), dist.get_rank()
    return p, r, (r + 1) % p, (r - 1) % p


def _ring_pass(tensors: list[Tensor], counter: CommCounter | None, kind: str) -> list[Tensor]:
    """Send each tensor to the right neighbour and return what arrived from the left."""
    _, _, right, left = _neighbours()
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), right) for t in tensors]
    ops += [dist.P2POp(dist.irecv, buf, left) for buf in received]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    if counter is not None:
        for t in tensors:
            counter.record(kind, t.numel() * t.element_size())
    return received


def _pairs(q_chunks: list[int], k_chunks: list[int], is_causal: bool):
    """(query slot, key slot, diagonal?) of every chunk pair with at least one unmasked score."""
    for i, a in enumerate(q_chunks):
        for j, b in enumerate(k_chunks):
            if not is_causal or b < a:
                yield i, j, False
            elif b == a:
                yield i, j, True  # the chunk against itself: top-left causal


def _split(x: Tensor, n: int) -> list[Tensor]:
    return list(x.chunk(n, dim=-2))


class RingAttentionFunction(torch.autograd.Function):
    """Ring attention forward and backward across the ranks of the default process group.

    Forward: for p steps, fold the local K/V block into each local query chunk's state
    (partial output, log-sum-exp) with :func:`~llmbook.inference.flash.merge_softmax_states`,
    then pass the block right. Backward: the K/V block goes round again with accumulators
    dK, dV; each chunk pair adds :func:`~llmbook.inference.flash.flash_attention_backward_reference`
    evaluated with the saved global output and log-sum-exp, and the accumulators take one
    more hop home. Call it through :func:`ring_attention`.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool, layout: str,
                counter: CommCounter | None, work: list[int] | None) -> Tensor:
        p, r, _, _ = _neighbours()
        chunks = chunk_layout(p, layout)
        n = len(chunks[0])
        q_parts = _split(q, n)
        states = [(torch.full(qa.shape[:-1], float("-inf"), dtype=q.dtype),
                   torch.zeros(qa.shape[:-1], dtype=q.dtype),
                   torch.zeros(*qa.shape[:-1], v.shape[-1], dtype=q.dtype)) for qa in q_parts]
        kv = [k, v]
        for step in range(p):
            src = (r - step) % p
            k_parts, v_parts = _split(kv[0], n), _split(kv[1], n)
            for i, j, diag in _pairs(chunks[r], chunks[src], is_causal):
                out, lse = flash_attention_reference(q_parts[i], k_parts[j], v_parts[j],
                                                     is_causal=diag, return_lse=True)
                # a normalised partial result is the state (m, l, o) = (lse, 1, out)
                states[i] = merge_softmax_states(states[i], (lse, torch.ones_like(lse), out))
                if work is not None:
                    c_q, c_k = q_parts[i].shape[-2], k_parts[j].shape[-2]
                    heads = q_parts[i][..., 0, 0].numel()  # B H (query, key) matrices
                    work.append(heads * (c_q * (c_q + 1) // 2 if diag else c_q * c_k))
            if step < p - 1:
                kv = _ring_pass(kv, counter, "ring forward")
        out = torch.cat([o / ell.unsqueeze(-1) for _, ell, o in states], dim=-2)
        lse = torch.cat([m + torch.log(ell) for m, ell, _ in states], dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (is_causal, layout, counter)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, layout, counter = ctx.options
        p, r, _, _ = _neighbours()
        chunks = chunk_layout(p, layout)
        n = len(chunks[0])
        q_parts, o_parts = _split(q, n), _split(out, n)
        l_parts = list(lse.chunk(n, dim=-1))
        g_parts = _split(grad_out.contiguous(), n)
        dq_parts = [torch.zeros_like(qa) for qa in q_parts]
        kv, dkv = [k, v], [torch.zeros_like(k), torch.zeros_like(v)]
        for step in range(p):
            src = (r - step) % p
            k_parts, v_parts = _split(kv[0], n), _split(kv[1], n)
            dk_parts, dv_parts = _split(dkv[0], n), _split(dkv[1], n)  # views of the accumulators
            for i, j, diag in _pairs(chunks[r], chunks[src], is_causal):
                dq, dk, dv = flash_attention_backward_reference(
                    q_parts[i], k_parts[j], v_parts[j], o_parts[i], l_parts[i], g_parts[i],
                    is_causal=diag)
                dq_parts[i] += dq
                dk_parts[j] += dk
                dv_parts[j] += dv
            if step < p - 1:
                kv = _ring_pass(kv, counter, "ring backward kv")
            if p > 1:  # the accumulators follow their block; after p hops they are home
                dkv = _ring_pass(dkv, counter, "ring backward dkv")
        return torch.cat(dq_parts, dim=-2), dkv[0], dkv[1], None, None, None, None


def _check_local_qkv(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_floating_tensor(t, name)
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., T/p, d), got {tuple(t.shape)}")
    if not q.shape[:-1] == k.shape[:-1] == v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v must be local shards (..., T/p, d) of one sequence with "
                         f"d_q = d_k, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def ring_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                   layout: str = "contiguous", counter: CommCounter | None = None,
                   work: list[int] | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_k)) v over the whole sequence, from this rank's shards, on a ring.

    q, k (..., T/p, d_k) and v (..., T/p, d_v) are this rank's part of the sequence as cut by
    :func:`shard_sequence` with the same ``layout``; returns this rank's rows of the output
    (..., T/p, d_v), equal to the matching rows of ``scaled_dot_product_attention`` on the
    full sequence. Differentiable (:class:`RingAttentionFunction`). ``counter`` records the
    bytes sent, ``work`` (a list) gets the number of score entries of each chunk pair computed.
    """
    _check_local_qkv(q, k, v)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if q.shape[-2] % len(chunk_layout(1, layout)[0]):
        raise ValueError(f"the {layout} layout holds two chunks per rank; the local length "
                         f"{q.shape[-2]} must be even")
    return RingAttentionFunction.apply(q, k, v, bool(is_causal), layout, counter, work)


# ---------------------------------------------------------------- Ulysses


class _AllToAll(torch.autograd.Function):
    """All-to-all that scatters dimension ``scatter`` and gathers dimension ``gather``.

    Rank r cuts x into p slices along ``scatter`` and sends slice j to rank j; it receives
    one slice from every rank and concatenates them along ``gather`` in rank order. Its
    adjoint is the all-to-all with the two dimensions swapped.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, scatter: int, gather: int, counter: CommCounter | None,
                kind: str) -> Tensor:
        ctx.dims, ctx.counter, ctx.kind = (scatter, gather), counter, kind
        return _all_to_all(x, scatter, gather, counter, kind)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        scatter, gather = ctx.dims
        return _all_to_all(grad, gather, scatter, ctx.counter, ctx.kind + " backward"), \
            None, None, None, None


def _all_to_all(x: Tensor, scatter: int, gather: int, counter: CommCounter | None,
                kind: str) -> Tensor:
    p, r = dist.get_world_size(), dist.get_rank()
    slices = list(x.chunk(p, dim=scatter))
    inp = torch.stack(slices).contiguous()  # (p, *slice)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    if counter is not None:
        counter.record(kind, sum(s.numel() * s.element_size() for j, s in enumerate(slices) if j != r))
    return torch.cat(list(out.unbind(0)), dim=gather)


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                      counter: CommCounter | None = None) -> Tensor:
    """Attention of the full sequence from sequence shards (B, H, T/p, d), by two all-to-alls.

    The shards are contiguous (:func:`shard_sequence` with ``"contiguous"``). An all-to-all
    on each of q, k, v gives this rank all T positions of H/p heads; attention runs there
    with ``scaled_dot_product_attention``; an all-to-all sends each position's output back.
    Returns (B, H, T/p, d_v). Differentiable: the all-to-all's backward is the reverse one.
    """
    _check_local_qkv(q, k, v)
    if q.ndim != 4:
        raise ValueError(f"q, k, v must have shape (B, H, T/p, d), got {tuple(q.shape)}")
    p, _, _, _ = _neighbours()
    if q.shape[1] % p:
        raise ValueError(f"Ulysses needs world_size={p} to divide the number of heads "
                         f"H={q.shape[1]}")
    q_h, k_h, v_h = (_AllToAll.apply(t, 1, 2, counter, "ulysses " + name)
                     for name, t in (("q", q), ("k", k), ("v", v)))  # (B, H/p, T, d)
    o_h = F.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=bool(is_causal))
    return _AllToAll.apply(o_h, 2, 1, counter, "ulysses out")  # (B, H, T/p, d_v)


# ---------------------------------------------------------------- workers


def sdpa_with_grads(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor,
                    is_causal: bool = False) -> dict[str, Tensor]:
    """The single-process peer: ``scaled_dot_product_attention`` on the full sequence.

    q, k (..., T, d_k), v (..., T, d_v) and dL/dout ``grad_out`` (..., T, d_v); returns the
    output and the gradients ``dq``, ``dk``, ``dv``, keyed as the workers' results are.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("grad_out", grad_out)):
        check_floating_tensor(t, name)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=bool(is_causal))
    if out.shape != grad_out.shape:
        raise ValueError(f"grad_out must have the output's shape {tuple(out.shape)}, got "
                         f"{tuple(grad_out.shape)}")
    out.backward(grad_out)
    return {"out": out.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}



def _worker_result(rank: int, world_size: int, q: Tensor, k: Tensor, v: Tensor,
                   grad_out: Tensor, layout: str, attend) -> dict[str, Any]:
    q_l, k_l, v_l = (shard_sequence(t, rank, world_size, layout).requires_grad_()
                     for t in (q, k, v))
    counter, work = CommCounter(), []
    out = attend(q_l, k_l, v_l, counter, work)
    out.backward(shard_sequence(grad_out, rank, world_size, layout))
    return {"out": out.detach(), "dq": q_l.grad, "dk": k_l.grad, "dv": v_l.grad,
            "calls": counter.calls, "work": sum(work)}


def ring_attention_worker(rank: int, world_size: int, q: Tensor, k: Tensor, v: Tensor,
                          grad_out: Tensor, is_causal: bool = False,
                          layout: str = "contiguous") -> dict[str, Any]:
    """One rank of ring attention on the full tensors' shards, forward and backward.

    Every rank gets the full q, k, v (B, H, T, d) and dL/dout; it keeps its shard, runs
    :func:`ring_attention` and backpropagates. Returns its shard of ``out``, ``dq``, ``dk``,
    ``dv``, the ``calls`` of its :class:`CommCounter` and the score entries it computed
    (``work``). Reassemble with :func:`gather_sequence`.
    """
    return _worker_result(rank, world_size, q, k, v, grad_out, layout,
                          lambda a, b, c, cnt, w: ring_attention(a, b, c, is_causal, layout, cnt, w))


def ulysses_attention_worker(rank: int, world_size: int, q: Tensor, k: Tensor, v: Tensor,
                             grad_out: Tensor, is_causal: bool = False) -> dict[str, Any]:
    """One rank of Ulysses attention, forward and backward; results as :func:`ring_attention_worker`.

    ``work`` is the score entries of its H/p heads over the full sequence.
    """
    def attend(a: Tensor, b: Tensor, c: Tensor, cnt: CommCounter, w: list[int]) -> Tensor:
        T = a.shape[-2] * world_size
        per_head = T * (T + 1) // 2 if is_causal else T * T
        w.append(a.shape[0] * a.shape[1] // world_size * per_head)
        return ulysses_attention(a, b, c, is_causal, cnt)

    return _worker_result(rank, world_size, q, k, v, grad_out, "contiguous", attend)
