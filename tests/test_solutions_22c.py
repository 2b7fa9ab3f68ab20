"""The exercise solutions of notebooks/22c_expert_parallelism hold."""

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.scale import expert_parallel as ep
from llmbook.scale.launch import run
from llmbook.scale.moe import MoELayer

solutions = load_solutions("22c_expert_parallelism")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_uneven_ranks_sum_to_the_uniform_formula():
    n0, n1, n2 = sp.symbols("n0 n1 n2", positive=True, integer=True)
    per_rank, total = solutions.uneven_rank_bytes([n0, n1, n2])
    n, k, d, b, P = sp.symbols("n k d b P", positive=True, integer=True)
    want = ep.expert_parallel_bytes_symbolic().subs({n: n0 + n1 + n2, P: 3})
    assert sp.simplify(total - want) == 0
    # equal sizes: every rank sends the same; a larger rank sends more
    vals = {sp.Symbol("k", positive=True, integer=True): 2, sp.Symbol("d", positive=True, integer=True): 4,
            sp.Symbol("b", positive=True, integer=True): 2, sp.Symbol("delta", nonnegative=True): 0}
    equal = [e.subs({n0: 6, n1: 6, n2: 6, **vals}) for e in per_rank]
    assert equal[0] == equal[1] == equal[2]
    uneven = [e.subs({n0: 12, n1: 3, n2: 3, **vals}) for e in per_rank]
    assert uneven[0] > uneven[1] == uneven[2]


def test_exercise_2_metadata_against_the_counters():
    torch.manual_seed(0)
    layer = MoELayer(6, 5, 4, 2, capacity_factor=1.0, dtype=torch.float64)
    x = torch.randn(10, 6, dtype=torch.float64)
    res = run(ep.run_expert_parallel_layer, 2, layer, x, x.clone(), timeout=60)
    for r in res:
        assert ep.AllToAllCounter(r["calls"]).bytes_sent("counts") == solutions.metadata_bytes_per_rank(4, 2, 2)
    assert solutions.metadata_bytes_per_rank(4, 2, 2, "local") == 16
    d = solutions.smallest_width_for_small_metadata(64, 2, 8, 4096, 2)
    share = lambda w: solutions.metadata_bytes_per_rank(64, 2, 8) / (2 * 4096 * 2 * w * 2 * 7 / 8)  # noqa: E731
    assert share(d) < 0.01 <= share(d - 1)


def test_exercise_3_global_rule_ignores_the_split():
    idx = torch.rand(45, 6, generator=torch.Generator().manual_seed(3)).topk(2, dim=-1).indices
    masks = solutions.dropped_by_split(idx, 6, 0.75)
    assert all(torch.equal(masks["global"][0], m) for m in masks["global"])
    assert not masks["global"][0].all()
    assert torch.equal(masks["local"][0], masks["global"][0])  # one rank: the rules agree
    assert any(not torch.equal(masks["local"][0], m) for m in masks["local"][1:])
