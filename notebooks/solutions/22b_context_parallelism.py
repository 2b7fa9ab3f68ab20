"""Reference solutions to the exercises of notebooks/22b_context_parallelism.

Checked by tests/test_solutions_22b.py.
"""

from __future__ import annotations

import sympy as sp

from llmbook.scale.context_parallel import causal_work_per_rank

# ---------------------------------------------------------------- exercise 1


def ulysses_gqa_bytes() -> dict[str, sp.Expr]:
    """Ulysses with H query heads and H_kv key/value heads (sent unexpanded), bytes per rank.

    Every all-to-all sends p - 1 of its p slices. Forward: q and out have B H (T/p) d
    elements, k and v B H_kv (T/p) d; backward: dout and dq like q, dk and dv like k. So
    (p - 1)/p (4 B H + 4 B H_kv) (T/p) d b in all. The head split must divide H_kv, so
    p <= H_kv. Returns ``bytes`` (SymPy, in B, H, H_kv, T, d, p, b), ``saving`` = 1 - bytes /
    bytes at H_kv = H, and ``max_p`` = H_kv.
    """
    B, H, H_kv, T, d, p, b = sp.symbols("B H H_kv T d p b", positive=True, integer=True)
    frac = (p - 1) / p
    local = (T / p) * d * b
    total = frac * (4 * B * H + 4 * B * H_kv) * local
    saving = sp.simplify(1 - total / total.subs(H_kv, H))
    return {"bytes": sp.factor(total), "saving": saving, "max_p": H_kv}


# ---------------------------------------------------------------- exercise 2


def striped_work_per_rank(T: int, world_size: int) -> list[int]:
    """Unmasked causal score entries per rank when rank r holds the positions i = r (mod p).

    sum over j < T/p of (r + j p + 1) = (T/p)(r + 1) + p (T/p)(T/p - 1)/2: it grows with r by
    T/p per rank, so the last rank does (p - 1) T/p more than the first (contiguous:
    (p - 1) T^2/p^2 more; zig-zag: none).
    """
    if T % world_size:
        raise ValueError(f"T={T} must be a multiple of world_size={world_size}")
    return [sum(i + 1 for i in range(r, T, world_size)) for r in range(world_size)]


def imbalances(T: int, world_size: int) -> dict[str, float]:
    """max / mean of the per-rank causal work for contiguous, zig-zag and striped sharding."""
    layouts = {"contiguous": causal_work_per_rank(T, world_size),
               "zigzag": causal_work_per_rank(T, world_size, "zigzag"),
               "striped": striped_work_per_rank(T, world_size)}
    return {name: max(w) / (sum(w) / world_size) for name, w in layouts.items()}
