"""Tests for llmbook.scale.collectives: the ring all-reduce on real processes, its cost model."""

from __future__ import annotations

import pytest
import sympy as sp
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.scale import collectives as C
from llmbook.scale.launch import WorkerError, run

pytestmark = pytest.mark.usefixtures("one_thread")


def _reduce_scatter_then_gather(rank: int, world_size: int, n: int) -> dict:
    x = torch.arange(n, dtype=torch.float64) * (rank + 1)
    chunk, sent_rs = C.ring_reduce_scatter_(x)
    chunk = chunk.clone()
    sent_ag = C.ring_all_gather_(x)
    return {"chunk": chunk, "full": x, "sent": (sent_rs, sent_ag)}


def _ring_on_int_tensor(rank: int, world_size: int) -> int:
    return C.ring_all_reduce_(torch.ones(8, dtype=torch.int64))


def _ring_too_small(rank: int, world_size: int) -> int:
    return C.ring_all_reduce_(torch.ones(1))


def _ring_float32_2d(rank: int, world_size: int) -> torch.Tensor:
    x = torch.full((3, 5), float(rank + 1))
    C.ring_all_reduce_(x)
    return x


def test_ring_schedule_worked_example() -> None:
    s = C.ring_schedule(3)
    assert len(s) == 2 * 3 * 2
    assert s[0] == C.Message("reduce-scatter", 0, 0, 1, 2)
    assert s[6] == C.Message("all-gather", 0, 0, 1, 0)
    # each rank sends 2 (p - 1) messages and receives as many
    for r in range(3):
        assert sum(m.src == r for m in s) == 4 and sum(m.dst == r for m in s) == 4
    assert C.ring_schedule(1) == []
    with pytest.raises(ValueError, match="world_size"):
        C.ring_schedule(0)


@given(st.integers(2, 9))
@settings(max_examples=10, deadline=None)
def test_ring_schedule_reduces_every_chunk(p: int) -> None:
    """Simulate the schedule on sets: after reduce-scatter rank r's chunk r contains every
    rank's contribution; after all-gather every rank has every chunk complete."""
    have = [[{r} for _ in range(p)] for r in range(p)]  # have[rank][chunk] = contributors
    for m in C.ring_schedule(p):
        if m.phase == "reduce-scatter":
            have[m.dst][m.chunk] = have[m.dst][m.chunk] | have[m.src][m.chunk]
        else:
            have[m.dst][m.chunk] = set(have[m.src][m.chunk])
    assert all(have[r][c] == set(range(p)) for r in range(p) for c in range(p))


def test_ring_cost_symbolic() -> None:
    cost = C.ring_all_reduce_cost_symbolic()
    p, n, a, b = sp.symbols("p n alpha beta", positive=True)
    assert sp.simplify(cost["all_reduce"] - 2 * (p - 1) * (a + n * b / p)) == 0
    assert sp.simplify(cost["reduce_scatter"] - cost["all_gather"]) == 0
    assert cost["bytes_per_rank"].subs({p: 4, n: 1000}) == 1500
    naive = C.naive_all_reduce_cost_symbolic()
    assert sp.simplify(naive - 2 * (p - 1) * (a + n * b)) == 0


def test_alpha_beta_time_and_fit_recover_parameters() -> None:
    n = torch.tensor([1e3, 1e4, 1e5, 1e6], dtype=torch.float64)
    t = C.alpha_beta_time(n, 4, 2e-5, 3e-9)
    assert float(t[0]) == pytest.approx(6 * 2e-5 + 1.5 * 1e3 * 3e-9)
    a, b = C.fit_alpha_beta(n.tolist(), t.tolist(), 4)
    assert a == pytest.approx(2e-5, rel=1e-8) and b == pytest.approx(3e-9, rel=1e-8)


def test_fit_alpha_beta_bad_input() -> None:
    with pytest.raises(ValueError, match="distinct"):
        C.fit_alpha_beta([10, 10], [1.0, 2.0], 2)
    with pytest.raises(ValueError, match="length"):
        C.fit_alpha_beta([10, 20], [1.0], 2)
    with pytest.raises(ValueError, match="world_size=1"):
        C.fit_alpha_beta([10, 20], [1.0, 2.0], 1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_equals_dist_all_reduce_and_counts_bytes(world_size: int) -> None:
    n = 12
    res = run(C.ring_versus_dist_worker, world_size, n, 3, timeout=30)
    exact = sum(r["x"] for r in res)
    for r in res:
        torch.testing.assert_close(r["ring"], r["dist"], rtol=0, atol=1e-13)
        torch.testing.assert_close(r["ring"], exact, rtol=0, atol=1e-13)
        assert r["bytes_sent"] == 2 * (world_size - 1) * n * 8 // world_size


def test_ring_uneven_chunks_and_phases() -> None:
    res = run(_reduce_scatter_then_gather, 3, 10, timeout=30)  # chunks of 4, 3, 3
    total = torch.arange(10, dtype=torch.float64) * 6
    assert torch.equal(res[0]["chunk"], total[:4])
    assert torch.equal(res[2]["chunk"], total[7:])
    for r in res:
        assert torch.equal(r["full"], total)
    # rank 0 sends chunks 2 and 1 (3 + 3 elements) in reduce-scatter, 0 and 2 (4 + 3) in all-gather
    assert res[0]["sent"] == (6 * 8, 7 * 8)


def test_ring_float32_any_shape() -> None:
    for x in run(_ring_float32_2d, 2, timeout=30):
        assert torch.equal(x, torch.full((3, 5), 3.0))


def test_ring_bad_input() -> None:
    with pytest.raises(WorkerError, match="floating-point"):
        run(_ring_on_int_tensor, 2, timeout=30)
    with pytest.raises(WorkerError, match="only 1 elements"):
        run(_ring_too_small, 2, timeout=30)
    with pytest.raises(RuntimeError, match="not initialised"):
        if not dist.is_initialized():
            C.ring_all_reduce_(torch.ones(4))


def test_collectives_tour() -> None:
    res = run(C.collectives_tour_worker, 2, timeout=30)
    assert res[1]["broadcast"].tolist() == [0, 1, 2, 3]
    assert res[0]["all_reduce"].tolist() == [10, 12, 14, 16]
    assert res[1]["reduce_scatter"].tolist() == [14, 16]
    assert res[0]["all_gather"].tolist() == [0, 1, 10, 11]
    assert torch.equal(res[1]["reduce_scatter_then_all_gather"], res[1]["all_reduce"])


def test_timing_worker_returns_positive_times_and_rejects_bad_name() -> None:
    res = run(C.all_reduce_timing_worker, 2, [16, 256], 2, "ring", timeout=30)
    assert len(res) == 2 and all(len(t) == 2 and min(t) > 0 for t in res)
    with pytest.raises(WorkerError, match="implementation"):
        run(C.all_reduce_timing_worker, 2, [16], 1, "tree", timeout=30)
