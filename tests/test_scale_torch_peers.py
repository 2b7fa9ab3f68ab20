"""Tests for llmbook.scale.torch_peers: the book's TP, PP and ZeRO-1/2 against PyTorch's, on 2 ranks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.scale import torch_peers as T
from llmbook.scale.launch import WorkerError, run

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64

TP = {"seed": 0, "steps": 3, "batch_size": 2, "seq_len": 3, "d_model": 6, "d_ff": 8, "lr": 1e-2,
      "weight_decay": 0.01}
PP = {"seed": 0, "steps": 3, "widths": [4, 6, 6, 5, 3], "batch_size": 8, "num_microbatches": 4,
      "schedule": "gpipe", "lr": 1e-2, "weight_decay": 0.01}
ZERO = {"seed": 1, "steps": 3, "batch_size": 6, "lr": 1e-2, "weight_decay": 0.01, "stage": 1}


def _pp_both(rank: int, world_size: int, spec: dict) -> list[dict]:
    return [T.pp_pair_worker(rank, world_size, {**spec, "schedule": s}) for s in ("gpipe", "1f1b")]


def _zero_both(rank: int, world_size: int, spec: dict) -> list[dict]:
    return [T.zero_pair_worker(rank, world_size, {**spec, "stage": s}) for s in (1, 2)]


_worst_grad = T.max_step_diff


def test_max_abs_diff_worked_examples() -> None:
    a = [torch.tensor([1.0, 2.0]), torch.tensor([[0.5]])]
    b = [torch.tensor([1.0, 2.25]), torch.tensor([[-0.5]])]
    assert T.max_abs_diff(a, b) == 1.0
    assert T.max_abs_diff({"x": a[0]}, {"x": b[0]}) == 0.25
    assert T.max_abs_diff([], []) == 0.0
    with pytest.raises(ValueError, match="same length"):
        T.max_abs_diff(a, b[:1])
    with pytest.raises(ValueError, match="same keys"):
        T.max_abs_diff({"x": a[0]}, {"y": a[0]})
    with pytest.raises(ValueError, match="shapes differ"):
        T.max_abs_diff([a[0]], [a[1]])
    with pytest.raises(TypeError, match="both be sequences"):
        T.max_abs_diff(a, {"x": a[0]})
    with pytest.raises(TypeError, match="hold tensors"):
        T.max_abs_diff([1.0], [2.0])


def test_max_step_diff() -> None:
    a = [[torch.zeros(2)], [torch.ones(2)]]
    b = [[torch.tensor([0.0, 0.5])], [torch.tensor([1.0, -1.0])]]
    assert T.max_step_diff(a, b) == 2.0
    assert T.max_step_diff([{"w": torch.ones(1)}], [{"w": torch.zeros(1)}]) == 1.0
    with pytest.raises(ValueError, match="same number of steps"):
        T.max_step_diff(a, b[:1])
    with pytest.raises(ValueError, match="same number of steps"):
        T.max_step_diff([], [])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=6), st.integers(0, 5), st.floats(-10, 10))
def test_max_abs_diff_finds_one_perturbation(values: list[float], where: int, delta: float) -> None:
    a = torch.tensor(values, dtype=f64)
    b = a.clone()
    b[where % len(values)] += delta
    expected = abs(float(b[where % len(values)] - a[where % len(values)]))
    assert T.max_abs_diff([a], [b]) == expected
    assert T.max_abs_diff([b], [a]) == expected


def test_tensor_parallel_matches_parallelize_module() -> None:
    out = run(T.tp_pair_worker, 2, TP, timeout=120)
    ref = T.tp_reference(TP)
    for r in out:
        book, peer = r["book"], r["torch"]
        assert len(book["grads"]) == len(peer["grads"]) == TP["steps"]
        assert _worst_grad(book["grads"], peer["grads"]) < 1e-13
        assert _worst_grad(book["grads"], ref["grads"]) < 1e-13
        assert T.max_abs_diff(book["params"], peer["params"]) < 1e-13
        assert T.max_abs_diff(peer["params"], ref["params"]) < 1e-13
        # Megatron's split on both sides: fc by output rows, proj by input columns (d_ff = 8 over 2)
        assert book["local_shapes"] == peer["local_shapes"] == {
            "fc.weight": (4, 6), "fc.bias": (4,), "proj.weight": (6, 4), "proj.bias": (6,)}
    # the training moved the weights: equality is not that of untouched initial values
    start = T.tp_mlp(TP)
    assert T.max_abs_diff(dict(start.named_parameters()), ref["params"]) > 1e-3


def test_pipeline_matches_torch_pipelining_both_schedules() -> None:
    ref = T.pp_reference(PP)
    out = run(_pp_both, 2, PP, timeout=120)
    for stages in ([out[0][k], out[1][k]] for k in range(2)):  # gpipe, then 1f1b
        book = stages[0]["book"]["params"] + stages[1]["book"]["params"]
        peer = stages[0]["torch"]["params"] + stages[1]["torch"]["params"]
        assert T.max_abs_diff(book, peer) < 1e-13
        assert T.max_abs_diff(book, ref["params"]) < 1e-13
        for step in range(PP["steps"]):
            g_book = stages[0]["book"]["grads"][step] + stages[1]["book"]["grads"][step]
            g_peer = stages[0]["torch"]["grads"][step] + stages[1]["torch"]["grads"][step]
            assert T.max_abs_diff(g_book, g_peer) < 1e-13
            assert T.max_abs_diff(g_book, ref["grads"][step]) < 1e-13
        assert len(stages[0]["book"]["params"]) == 4  # two blocks of weight and bias per stage


def test_zero_matches_zero_redundancy_optimizer() -> None:
    ref = T.unsharded_reference(ZERO)
    runs = run(_zero_both, 2, ZERO, timeout=120)
    for stage in (0, 1):
        for r in (runs[0][stage], runs[1][stage]):
            assert T.max_abs_diff(r["book"]["params"], r["torch"]["params"]) < 1e-13
            assert T.max_abs_diff(r["book"]["params"], ref["params"]) < 1e-13
            assert _worst_grad(r["book"]["grads"], r["torch"]["grads"]) < 1e-13
            assert _worst_grad(r["book"]["grads"], ref["grads"]) < 1e-13
        # m and v of 616 float64 parameters: the book splits each unit's flat buffer in halves
        # (104 + 136 + 68 = 308 per rank); PyTorch gives whole tensors to ranks (296 and 320)
        book = [runs[k][stage]["book"]["optimizer_bytes"] for k in (0, 1)]
        peer = [runs[k][stage]["torch"]["optimizer_bytes"] for k in (0, 1)]
        assert book == [2 * 8 * 308, 2 * 8 * 308]
        assert sum(peer) == 2 * 8 * 616 and peer == [2 * 8 * 296, 2 * 8 * 320]


def test_bad_specs() -> None:
    with pytest.raises(ValueError, match=r"missing the key\(s\) \[.lr.\]"):
        T.tp_reference({k: v for k, v in TP.items() if k != "lr"})
    with pytest.raises(ValueError, match="schedule"):
        T.pp_reference({k: v for k, v in PP.items() if k != "schedule"})
    with pytest.raises(ValueError, match="world_size"):
        T.pp_pair_worker(0, 1, PP)
    with pytest.raises(ValueError, match="stage"):
        T.zero_pair_worker(0, 2, {**ZERO, "stage": 3})
    with pytest.raises(ValueError, match="dtype"):
        T.fsdp_pair_worker(0, 2, ZERO)
    with pytest.raises(WorkerError, match="does not divide"):
        run(T.tp_pair_worker, 2, {**TP, "d_ff": 7}, timeout=60)
