"""Collective communication: the ring all-reduce, written with send/recv, and its cost.

Introduced in notebooks/22_distributed_training. Data parallelism, ZeRO and tensor
parallelism are built from a handful of *collectives*, operations that every rank of a
process group calls together. With p ranks each holding a tensor x_r of n elements:

* all-reduce: every rank ends with sum_r x_r;
* reduce-scatter: rank r ends with the r-th of p chunks of sum_r x_r;
* all-gather: every rank ends with the concatenation of the p ranks' chunks;
* broadcast: every rank ends with rank 0's tensor.

All-reduce = reduce-scatter followed by all-gather. The *ring* algorithm does each half in
p - 1 steps in which every rank sends one chunk of n/p elements to its right neighbour and
receives one from its left, so each rank sends 2 (p - 1)/p * n elements in all, which is
optimal in bandwidth (Patarasuk & Yuan, 2009, "Bandwidth optimal all-reduce algorithms for
clusters of workstations"). With a latency alpha per message and a time beta per byte
(Hockney's model, as used by Thakur, Rabenseifner & Gropp, 2005, "Optimization of
Collective Communication Operations in MPICH"):

    T_ring(n, p) = 2 (p - 1) alpha + 2 (p - 1)/p * n beta.

Contents:

* :func:`ring_reduce_scatter_`, :func:`ring_all_gather_`, :func:`ring_all_reduce_` - the
  book's ring, with ``dist.isend``/``dist.irecv``; each returns the bytes it sent;
* :func:`ring_schedule` - the messages of the ring, step by step (who sends which chunk);
* :func:`ring_all_reduce_cost_symbolic`, :func:`naive_all_reduce_cost_symbolic` - the
  alpha-beta cost, derived with SymPy by counting messages per step;
* :func:`alpha_beta_time`, :func:`fit_alpha_beta` - the model and its least-squares fit to
  measured times;
* workers for :func:`llmbook.scale.launch.run`: :func:`collectives_tour_worker`,
  :func:`ring_versus_dist_worker`, :func:`all_reduce_timing_worker`.

Everything works on any backend that supports point-to-point messages (gloo on the CPU,
NCCL on GPUs): the tensors stay on the device they are given on.
"""

from __future__ import annotations

import time
from fractions import Fraction
from typing import Any, NamedTuple

import sympy as sp
import torch
import torch.distributed as dist
from torch import Tensor

from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_nonnegative_number,
    check_positive_int,
)

__all__ = [
    "Message",
    "all_reduce_timing_worker",
    "alpha_beta_time",
    "collectives_tour_worker",
    "fit_alpha_beta",
    "naive_all_reduce_cost_symbolic",
    "ring_all_gather_",
    "ring_all_reduce_",
    "ring_all_reduce_bytes_per_rank",
    "ring_all_reduce_cost_symbolic",
    "ring_reduce_scatter_",
    "ring_schedule",
    "ring_versus_dist_worker",
]


# ---------------------------------------------------------------- the schedule


class Message(NamedTuple):
    """One message of the ring: at ``step`` of ``phase``, ``src`` sends chunk ``chunk`` to ``dst``."""

    phase: str  # "reduce-scatter" or "all-gather"
    step: int
    src: int
    dst: int
    chunk: int


def ring_schedule(world_size: int) -> list[Message]:
    """Every message of a ring all-reduce on ``world_size`` ranks, in order.

    Reduce-scatter, step s = 0..p-2: rank r sends chunk (r - s - 1) mod p to rank r + 1,
    which adds it to its own copy; after p - 1 steps rank r holds the full sum of chunk r
    (the convention of ``dist.reduce_scatter``). All-gather, step s = 0..p-2: rank r sends
    chunk (r - s) mod p, the one it completed last, and the receiver overwrites its copy.
    2 p (p - 1) messages in all, 2 (p - 1) sent by each rank.
    """
    p = check_positive_int("world_size", world_size)
    schedule = []
    for phase, offset in (("reduce-scatter", 1), ("all-gather", 0)):
        for s in range(p - 1):
            schedule += [Message(phase, s, r, (r + 1) % p, (r - s - offset) % p) for r in range(p)]
    return schedule


# ---------------------------------------------------------------- the ring itself


def _ring_setup(tensor: Tensor, group: Any) -> tuple[int, int, list[Tensor], int, int]:
    check_floating_tensor(tensor, "tensor")
    if not tensor.is_contiguous():
        raise ValueError("the ring works in place on a contiguous tensor; call .contiguous() first")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: run inside llmbook.scale.launch.run")
    p, r = dist.get_world_size(group), dist.get_rank(group)
    if tensor.numel() < p:
        raise ValueError(f"the ring splits the tensor into world_size={p} chunks; "
                         f"it has only {tensor.numel()} elements")
    chunks = list(tensor.view(-1).tensor_split(p))  # views: writing them writes the tensor
    right = dist.get_global_rank(group, (r + 1) % p) if group is not None else (r + 1) % p
    left = dist.get_global_rank(group, (r - 1) % p) if group is not None else (r - 1) % p
    return p, r, chunks, right, left


def _exchange(send: Tensor, recv: Tensor, right: int, left: int, group: Any) -> int:
    """Send ``send`` to the right neighbour while receiving ``recv`` from the left one.

    Both are posted before either is waited on: with blocking send/recv, every rank would
    first send and wait for a receiver that is itself still sending (a deadlock once
    messages exceed the transport's buffer)."""
    requests = [dist.isend(send, right, group=group), dist.irecv(recv, left, group=group)]
    for request in requests:
        request.wait()
    return send.numel() * send.element_size()


def ring_reduce_scatter_(tensor: Tensor, group: Any = None) -> tuple[Tensor, int]:
    """Ring reduce-scatter in place: afterwards chunk r of ``tensor`` on rank r is the sum over ranks.

    ``tensor`` (any shape, n >= p elements) is split along its flattened elements into p
    chunks of sizes differing by at most one (``tensor_split``). Returns (the view of the
    rank's reduced chunk, bytes this rank sent). The other chunks hold partial sums.
    """
    p, r, chunks, right, left = _ring_setup(tensor, group)
    sent = 0
    for s in range(p - 1):
        send, recv = chunks[(r - s - 1) % p], chunks[(r - s - 2) % p]
        buffer = torch.empty_like(recv)
        sent += _exchange(send, buffer, right, left, group)
        recv.add_(buffer)
    return chunks[r], sent


def ring_all_gather_(tensor: Tensor, group: Any = None) -> int:
    """Ring all-gather in place: rank r contributes chunk r of ``tensor``; afterwards every
    rank holds every rank's chunk. Returns the bytes this rank sent."""
    p, r, chunks, right, left = _ring_setup(tensor, group)
    sent = 0
    for s in range(p - 1):
        sent += _exchange(chunks[(r - s) % p], chunks[(r - s - 1) % p], right, left, group)
    return sent


def ring_all_reduce_(tensor: Tensor, group: Any = None) -> int:
    """Ring all-reduce (sum) in place, as reduce-scatter then all-gather; returns bytes sent.

    Equal to ``dist.all_reduce(tensor)`` up to the order of the additions. Each rank sends
    2 (p - 1) messages whose sizes add up to 2 (p - 1)/p * n elements when p divides n.
    """
    _, sent = ring_reduce_scatter_(tensor, group)
    return sent + ring_all_gather_(tensor, group)


# ---------------------------------------------------------------- the cost model


def ring_all_reduce_cost_symbolic() -> dict[str, sp.Expr]:
    """The alpha-beta time of the ring all-reduce, derived by counting messages per step.

    Symbols: p ranks, n bytes, alpha seconds per message, beta seconds per byte. In each of
    the p - 1 steps of either phase a rank sends one message of n/p bytes, and all ranks send
    at once, so a step costs alpha + (n/p) beta. Returns the time of each phase, the total,
    and the bytes sent per rank.
    """
    p, n, alpha, beta, s = sp.symbols("p n alpha beta s", positive=True)
    step_time = alpha + n / p * beta
    reduce_scatter = sp.summation(step_time, (s, 0, p - 2))
    all_gather = sp.summation(step_time, (s, 0, p - 2))
    return {"reduce_scatter": sp.factor(reduce_scatter), "all_gather": sp.factor(all_gather),
            "all_reduce": sp.expand(reduce_scatter + all_gather),
            "bytes_per_rank": sp.factor(sp.summation(2 * n / p, (s, 0, p - 2)))}


def naive_all_reduce_cost_symbolic() -> sp.Expr:
    """The time of reduce-to-root then broadcast, with the root's link as the bottleneck.

    The root receives p - 1 whole tensors (alpha + n beta each) and sends p - 1 back, so
    T = 2 (p - 1)(alpha + n beta): the bandwidth term grows with p, where the ring's stays
    below 2 n beta.
    """
    p, n, alpha, beta, s = sp.symbols("p n alpha beta s", positive=True)
    return sp.expand(2 * sp.summation(alpha + n * beta, (s, 1, p - 1)))


def ring_all_reduce_bytes_per_rank(n_elements: int, world_size: int,
                                   bytes_per_element: int = 4) -> Fraction:
    """Bytes one rank sends in a ring all-reduce of n elements over p ranks: 2 (p-1)/p * n * bytes.

    Patarasuk & Yuan (2009, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations"): a reduce-scatter (p-1 steps, each sending a chunk of n/p elements) then an
    all-gather (p-1 more). Exact (a Fraction: n need not divide by p). p = 1 sends nothing.
    """
    n = check_positive_int("n_elements", n_elements)
    p = check_positive_int("world_size", world_size)
    b = check_positive_int("bytes_per_element", bytes_per_element)
    return Fraction(2 * (p - 1) * n * b, p)


def alpha_beta_time(n_bytes: Any, world_size: int, alpha: float, beta: float) -> Any:
    """T = 2 (p - 1) alpha + 2 (p - 1)/p * n beta for ``n_bytes`` (a number or an array)."""
    p = check_positive_int("world_size", world_size)
    check_nonnegative_number("alpha", alpha)
    check_nonnegative_number("beta", beta)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


def _measurements(n_bytes: Any, seconds: Any) -> tuple[Tensor, Tensor]:
    """``n_bytes`` and ``seconds`` as float64 vectors: finite, of one length, two distinct sizes."""
    vectors = []
    for name, values in (("n_bytes", n_bytes), ("seconds", seconds)):
        try:
            vector = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{name} must be a 1-d sequence of numbers, got {values!r}") from error
        vectors.append(check_finite(vector, name))
    n, t = vectors
    if n.shape != t.shape:
        raise ValueError(f"n_bytes and seconds differ in length: {n.numel()} vs {t.numel()}")
    if n.unique().numel() < 2:
        raise ValueError("need at least two distinct message sizes to separate alpha from beta")
    return n, t


def fit_alpha_beta(n_bytes: Any, seconds: Any, world_size: int) -> tuple[float, float]:
    """Least-squares fit of (alpha, beta) of the ring model to measured all-reduce times.

    ``n_bytes`` and ``seconds`` are 1-d sequences of the same length (at least two distinct
    sizes); the model is linear in (alpha, beta) with rows [2 (p - 1), 2 (p - 1)/p * n].
    Returns (alpha in seconds, beta in seconds per byte).
    """
    p = check_positive_int("world_size", world_size)
    if p < 2:
        raise ValueError("with world_size=1 there is no communication to fit")
    n, t = _measurements(n_bytes, seconds)
    design = torch.stack([torch.full_like(n, 2.0 * (p - 1)), 2.0 * (p - 1) / p * n], dim=1)
    solution = torch.linalg.lstsq(design, t[:, None]).solution[:, 0]
    return float(solution[0]), float(solution[1])


# ---------------------------------------------------------------- workers for launch.run

#: Imported once by the launcher's fork server, so that forked ranks need not import them:
#: torch._dynamo (which ``torch.optim`` imports on first use, ~2 s), SymPy and the chapter's modules.
def collectives_tour_worker(rank: int, world_size: int) -> dict[str, Tensor]:
    """The four collectives of ``torch.distributed`` on small integer-valued tensors.

    Rank r starts from x_r = [10 r, 10 r + 1, ..., 10 r + 2p - 1] (float, exact) and returns
    what broadcast, all-reduce, reduce-scatter and all-gather give it, plus all-reduce done
    as reduce-scatter followed by all-gather.
    """
    p = world_size
    x = torch.arange(2 * p, dtype=torch.float32) + 10 * rank
    out = {"x": x.clone()}
    b = x.clone()
    dist.broadcast(b, src=0)
    out["broadcast"] = b
    a = x.clone()
    dist.all_reduce(a)
    out["all_reduce"] = a
    shard = torch.empty(2)
    dist.reduce_scatter_single(shard, x.clone())
    out["reduce_scatter"] = shard
    gathered = torch.empty(2 * p)
    dist.all_gather_single(gathered, x[:2].clone())
    out["all_gather"] = gathered
    both = torch.empty(2 * p)
    dist.all_gather_single(both, shard)
    out["reduce_scatter_then_all_gather"] = both
    return out


def ring_versus_dist_worker(rank: int, world_size: int, n: int, seed: int,
                            dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """Rank r draws x_r (n numbers, seed + r), all-reduces it with the book's ring and with
    ``dist.all_reduce``, and returns x_r, both results and the bytes the ring sent."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed + rank), dtype=dtype)
    ours, theirs = x.clone(), x.clone()
    sent = ring_all_reduce_(ours)
    dist.all_reduce(theirs)
    return {"x": x, "ring": ours, "dist": theirs, "bytes_sent": sent}


def all_reduce_timing_worker(rank: int, world_size: int, sizes: list[int], repeats: int,
                             implementation: str = "dist") -> list[float]:
    """Seconds per all-reduce of float32 tensors of each size in ``sizes`` (elements).

    ``implementation`` is ``"dist"`` (``dist.all_reduce``) or ``"ring"`` (the book's). For
    each size: one warm-up, then ``repeats`` timed calls, each started after a barrier; the
    median is returned. Timings depend on the machine and its load.
    """
    if implementation not in ("dist", "ring"):
        raise ValueError(f"implementation must be 'dist' or 'ring', got {implementation!r}")
    reduce = dist.all_reduce if implementation == "dist" else ring_all_reduce_
    medians = []
    for n in sizes:
        x = torch.ones(n)
        reduce(x)
        times = []
        for _ in range(repeats):
            dist.barrier()
            began = time.perf_counter()
            reduce(x)
            times.append(time.perf_counter() - began)
        medians.append(sorted(times)[len(times) // 2])
    return medians
