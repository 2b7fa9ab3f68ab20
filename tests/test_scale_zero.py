"""Tests for llmbook.scale.zero: ZeRO stages 0-3 on real processes, memory and formulas."""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from torch import nn

from llmbook.scale import zero as Z
from llmbook.scale.launch import WorkerError, run

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = {"seed": 1, "steps": 3, "batch_size": 6, "lr": 1e-2, "weight_decay": 0.01}


def _padded_stage3(rank: int, world_size: int) -> dict:
    """3 ranks, units of 42 and 16 parameters: the second is padded to 18."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()  # 42, 16
    trainer = Z.ZeroTrainer(model, 3, lr=1e-2)
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    trainer.step(x, torch.zeros(4, 2, dtype=torch.float64), torch.nn.functional.mse_loss)
    return {"memory": trainer.memory(), "shards": [t.numel() for t in trainer.param_shards if t is not None]}


def _bad_stage(rank: int, world_size: int) -> None:
    Z.ZeroTrainer(nn.Sequential(nn.Linear(2, 2)), stage=4)


def _not_sequential(rank: int, world_size: int) -> None:
    Z.ZeroTrainer(nn.Linear(2, 2), stage=1)


def test_shard_bounds() -> None:
    assert Z.shard_bounds(10, 3, 0) == (0, 4, 4)
    assert Z.shard_bounds(10, 3, 2) == (8, 12, 4)
    assert Z.shard_bounds(12, 4, 3) == (9, 12, 3)
    with pytest.raises(ValueError, match="rank"):
        Z.shard_bounds(10, 3, 3)
    with pytest.raises(ValueError, match="numel"):
        Z.shard_bounds(0, 3, 0)


def test_formulas_symbolic_and_paper_numbers() -> None:
    f = Z.zero_memory_per_rank_symbolic()
    psi, n, bw, bg, k = sp.symbols("Psi N b_w b_g K", positive=True)
    assert sp.simplify(f[0] - (bw + bg + k) * psi) == 0
    assert sp.simplify(f[1] - ((bw + bg) * psi + k * psi / n)) == 0
    assert sp.simplify(f[2] - (bw * psi + (bg + k) * psi / n)) == 0
    assert sp.simplify(f[3] - (bw + bg + k) * psi / n) == 0
    sub = {bw: 2, bg: 2, k: 12, psi: sp.Rational(75, 10) * 10**9, n: 64}
    assert f[0].subs(sub) == 120 * 10**9
    assert abs(float(f[1].subs(sub)) / 1e9 - 31.4) < 0.05
    assert abs(float(f[2].subs(sub)) / 1e9 - 16.6) < 0.05
    assert f[3].subs(sub) == sp.Rational(1875, 1000) * 10**9


def test_zero_memory_per_rank_numbers_and_errors() -> None:
    assert Z.zero_memory_per_rank(2, 100, 4, 2, 2, 12) == {"params": 200, "grads": 50, "optimizer": 300}
    assert sum(Z.zero_memory_per_rank(0, 100, 4, 2, 2, 12).values()) == 1600
    with pytest.raises(ValueError, match="not divisible"):
        Z.zero_memory_per_rank(1, 10, 4, 2, 2, 12)
    with pytest.raises(ValueError, match="stage"):
        Z.zero_memory_per_rank(5, 8, 4, 2, 2, 12)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_stage_matches_unsharded_training_and_formula(stage: int) -> None:
    reference, _ = Z.train_unsharded(SPEC)
    res = run(Z.zero_train_worker, 2, SPEC | {"stage": stage}, timeout=60)
    psi = sum(t.numel() for t in reference)  # 616, divisible by 2
    for r in res:
        for a, b in zip(r["params"], reference, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        assert r["memory"] == Z.zero_memory_per_rank(stage, psi, 2, 8, 8, 24)
        assert r["peak"] >= sum(r["memory"].values())


def test_mixed_precision_memory_is_16_bytes_per_parameter_unsharded() -> None:
    res = run(Z.zero_train_worker, 2, SPEC | {"stage": 0, "dtype": "bfloat16", "master_dtype": "float32"},
              timeout=60)
    assert sum(res[0]["memory"].values()) == 16 * 616
    assert res[0]["params"][0].dtype == torch.bfloat16


def test_padding_when_world_size_does_not_divide() -> None:
    res = run(_padded_stage3, 3, timeout=60)
    assert res[0]["shards"] == [14, 6]  # ceil(42/3), ceil(16/3)
    assert res[0]["memory"]["params"] == (14 + 6) * 8


def test_fsdp2_agrees() -> None:
    reference, _ = Z.train_unsharded(SPEC)
    res = run(Z.fsdp2_train_worker, 2, SPEC, timeout=90)
    for a, b in zip(res[1]["params"], reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert res[0]["local_shapes"][0] == (8, 12) and res[0]["param_bytes"] == 616 * 8 // 2


def test_bad_input() -> None:
    with pytest.raises(WorkerError, match="stage must be"):
        run(_bad_stage, 1, timeout=30)
    with pytest.raises(WorkerError, match="nn.Sequential"):
        run(_not_sequential, 1, timeout=30)
    with pytest.raises(RuntimeError, match="not initialised"):
        Z.ZeroTrainer(nn.Sequential(nn.Linear(2, 2)), stage=1)
