"""Checks of chapter 22c's exercises (notebooks/22c_expert_parallelism), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's uniform traffic formula in SymPy
(:func:`llmbook.scale.expert_parallel.expert_parallel_bytes_symbolic`) and the bytes
that the all-to-all counters record in a real two-process run of the book's
expert-parallel layer (gloo, through :func:`llmbook.scale.launch.run`, which stops its
processes whatever happens, a time limit included).
"""

from __future__ import annotations

import sympy as sp
import torch

from llmbook.scale import expert_parallel as ep
from llmbook.scale.launch import run
from llmbook.scale.moe import MoELayer


def exercise_1_uneven_ranks_sum_to_the_uniform_formula(solutions) -> None:
    n0, n1, n2 = sp.symbols("n0 n1 n2", positive=True, integer=True)
    per_rank, total = solutions.uneven_rank_bytes([n0, n1, n2])
    n, P = sp.symbols("n P", positive=True, integer=True)
    want = ep.expert_parallel_bytes_symbolic().subs({n: n0 + n1 + n2, P: 3})
    difference = sp.simplify(total - want)
    assert difference == 0, (
        f"expected the three ranks' bytes to sum to the uniform formula with n = n0 + n1 + n2, "
        f"P = 3 ({want}), got {total} (difference {difference})")
    # equal sizes: every rank sends the same; a larger rank sends more
    vals = {sp.Symbol("k", positive=True, integer=True): 2, sp.Symbol("d", positive=True, integer=True): 4,
            sp.Symbol("b", positive=True, integer=True): 2, sp.Symbol("delta", nonnegative=True): 0}
    equal = [e.subs({n0: 6, n1: 6, n2: 6, **vals}) for e in per_rank]
    assert equal[0] == equal[1] == equal[2], (
        f"expected equal bytes from three ranks of 6 tokens each (k = 2, d = 4, b = 2), got {equal}")
    uneven = [e.subs({n0: 12, n1: 3, n2: 3, **vals}) for e in per_rank]
    assert uneven[0] > uneven[1] == uneven[2], (
        f"expected the rank of 12 tokens to send more than the two of 3, which send the same, got {uneven}")


def exercise_2_metadata_against_the_counters(solutions) -> None:
    torch.manual_seed(0)
    layer = MoELayer(6, 5, 4, 2, capacity_factor=1.0, dtype=torch.float64)
    x = torch.randn(10, 6, dtype=torch.float64)
    res = run(ep.run_expert_parallel_layer, 2, layer, x, x.clone(), timeout=60)
    want = solutions.metadata_bytes_per_rank(4, 2, 2)
    for rank, r in enumerate(res):
        counted = ep.AllToAllCounter(r["calls"]).bytes_sent("counts")
        assert counted == want, (
            f"expected metadata_bytes_per_rank(4, 2, 2) to match the {counted} bytes of counts that "
            f"rank {rank} sent in a two-process run (4 experts, top 2), got {want!r}")
    local = solutions.metadata_bytes_per_rank(4, 2, 2, "local")
    assert local == 16, f"expected 16 bytes of counts with the local rule (4 experts, 2 ranks), got {local!r}"
    d = solutions.smallest_width_for_small_metadata(64, 2, 8, 4096, 2)
    share = lambda w: solutions.metadata_bytes_per_rank(64, 2, 8) / (2 * 4096 * 2 * w * 2 * 7 / 8)  # noqa: E731
    at_d, below_d = share(d), share(d - 1)
    assert at_d < 0.01 <= below_d, (
        f"expected d = {d!r} to be the smallest width with the metadata under 1 % of the data "
        f"(64 experts, top 2, 8 ranks, 4096 tokens, 2 bytes): share at d = {at_d!r}, at d - 1 = {below_d!r}")


def exercise_3_global_rule_ignores_the_split(solutions) -> None:
    idx = torch.rand(45, 6, generator=torch.Generator().manual_seed(3)).topk(2, dim=-1).indices
    masks = solutions.dropped_by_split(idx, 6, 0.75)
    assert all(torch.equal(masks["global"][0], m) for m in masks["global"]), (
        "expected the global rule's keep mask to be the same on 1, 2, 3 and 4 ranks")
    assert not masks["global"][0].all(), (
        "expected the global rule to drop some copies at capacity factor 0.75, but it kept them all")
    assert torch.equal(masks["local"][0], masks["global"][0]), (  # one rank: the rules agree
        "expected the local and the global rule to agree on one rank")
    assert any(not torch.equal(masks["local"][0], m) for m in masks["local"][1:]), (
        "expected the local rule's keep mask to change with the number of ranks (2, 3 or 4)")
