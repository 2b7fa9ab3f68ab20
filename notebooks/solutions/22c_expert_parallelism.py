"""Reference solutions to the exercises of notebooks/22c_expert_parallelism.

Checked by tests/test_solutions_22c.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.scale import expert_parallel as ep
from llmbook.scale.moe import capacity_keep_mask, expert_capacity

# ---------------------------------------------------------------- exercise 1


def uneven_rank_bytes(sizes: list[sp.Expr]) -> tuple[list[sp.Expr], sp.Expr]:
    """Expected bytes each rank sends in one step when rank r holds ``sizes[r]`` tokens.

    Dispatch: each of rank r's n_r k (1 - delta) kept copies leaves with probability
    (P - 1)/P. Combine: rank r returns the outputs of the copies other ranks sent to its
    experts, each of the other ranks' copies landing on rank r with probability 1/P. Forward
    and backward send each twice. Returns the per-rank expressions and their sum.
    """
    k, d, b = sp.symbols("k d b", positive=True, integer=True)
    delta = sp.Symbol("delta", nonnegative=True)
    p = len(sizes)
    n = sum(sizes)
    kept = k * (1 - delta) * d * b
    per_rank = [2 * (n_r * kept * sp.Rational(p - 1, p) + (n - n_r) * kept / p) for n_r in sizes]
    return per_rank, sp.simplify(sum(per_rank))


# ---------------------------------------------------------------- exercise 2


def metadata_bytes_per_rank(num_experts: int, top_k: int, world_size: int, scope: str = "global") -> int:
    """Bytes of counts one rank sends per forward pass: the counts all-to-all, N (P - 1)/P int64,
    plus, for the global capacity, its (k, N) int64 counts to each of the P - 1 other ranks."""
    p = world_size
    total = 8 * num_experts * (p - 1) // p
    if scope == "global":
        total += 8 * top_k * num_experts * (p - 1)
    return total


def smallest_width_for_small_metadata(num_experts: int, top_k: int, world_size: int,
                                      tokens_per_rank: int, bytes_per_value: int,
                                      share: float = 0.01) -> int:
    """The smallest d at which the forward metadata is below ``share`` of the forward data,
    under uniform routing without drops: data per rank = 2 n_r k d b (P - 1)/P."""
    meta = metadata_bytes_per_rank(num_experts, top_k, world_size)
    d = 1
    while meta >= share * 2 * tokens_per_rank * top_k * d * bytes_per_value * (world_size - 1) / world_size:
        d += 1
    return d


# ---------------------------------------------------------------- exercise 3


def dropped_by_split(indices: Tensor, num_experts: int, capacity_factor: float,
                     world_sizes: tuple[int, ...] = (1, 2, 3, 4)) -> dict[str, list[Tensor]]:
    """The keep masks (n, k) of the global and the local rule for each number of ranks."""
    n, k = indices.shape
    cap = expert_capacity(n, num_experts, k, capacity_factor)
    out: dict[str, list[Tensor]] = {"global": [], "local": []}
    for p in world_sizes:
        chunks = ep.token_chunks(n, p)
        counts = torch.stack([ep.assignment_counts(indices[c], num_experts) for c in chunks])
        out["global"].append(torch.cat([ep.keep_mask_across_ranks(indices[c], counts, r, cap)
                                        for r, c in enumerate(chunks)]))
        out["local"].append(torch.cat([
            capacity_keep_mask(indices[c], num_experts,
                               expert_capacity(c.stop - c.start, num_experts, k, capacity_factor))
            for c in chunks]))
    return out
