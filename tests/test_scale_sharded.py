"""Tests for llmbook.scale.sharded: the ZeRO-3 wrapper, against one process and FSDP2, on 2 ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from llmbook.scale import torch_peers as T
from llmbook.scale.launch import WorkerError, run
from llmbook.scale.sharded import GatherShard, ShardedModule
from llmbook.scale.zero import tiny_mlp

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64
DIMS = (4, 3, 2)  # units of 15 (odd: padded to 16) and 8 parameters


def _gather_shard(rank: int, world_size: int) -> dict:
    shard = torch.arange(3, dtype=f64) + 10 * rank
    shard.requires_grad_(True)
    full = GatherShard.apply(shard, torch.float32, None)
    weights = torch.arange(6, dtype=torch.float32) * (rank + 1)  # rank r's loss: sum(w_r * full)
    (weights * full).sum().backward()
    return {"full": full.detach(), "grad": shard.grad}


def _train(rank: int, world_size: int, optimizer: str) -> dict:
    torch.manual_seed(5)
    x, y = torch.randn(4, 4, dtype=f64), torch.randn(4, 2, dtype=f64)
    model = ShardedModule(tiny_mlp(3 + rank, DIMS))  # rank 0's values are broadcast
    shards = [tuple(p.shape) for p in model.parameters()]
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False))
    grads = []
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2]).backward()
        grads.append(model.full_gradients())
        opt.step()
    return {"params": model.full_parameters(), "grads": grads, "shards": shards,
            "bytes": model.shard_bytes(), "dtype": model(x[:1]).dtype}


def _reference(optimizer: str) -> dict:
    torch.manual_seed(5)
    x, y = torch.randn(4, 4, dtype=f64), torch.randn(4, 2, dtype=f64)
    model = tiny_mlp(3, DIMS)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False))
    grads = []
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads": grads}


def _both(rank: int, world_size: int) -> list[dict]:
    return [_train(rank, world_size, o) for o in ("sgd", "adamw")]


def _bf16(rank: int, world_size: int) -> dict:
    model = ShardedModule(tiny_mlp(0, DIMS, dtype=torch.float32), compute_dtype=torch.bfloat16)
    out = model(torch.ones(2, 4))
    out.float().sum().backward()
    return {"out": out.dtype, "masters": [p.dtype for p in model.parameters()],
            "grads": [p.grad.dtype for p in model.parameters()]}


def _not_sequential(rank: int, world_size: int) -> None:
    ShardedModule(nn.Linear(2, 2))


def test_gather_shard_forward_and_averaged_reduce_scatter() -> None:
    out = run(_gather_shard, 2, timeout=60)
    expected = torch.tensor([0, 1, 2, 10, 11, 12], dtype=torch.float32)
    for r in out:
        assert torch.equal(r["full"], expected)
        assert r["full"].dtype == torch.float32
    # shard r gets mean over ranks k of w_k[slice r] = (1 + 2)/2 * arange(6)[slice r]
    assert torch.equal(out[0]["grad"], torch.tensor([0.0, 1.5, 3.0], dtype=f64))
    assert torch.equal(out[1]["grad"], torch.tensor([4.5, 6.0, 7.5], dtype=f64))


def test_sharded_module_trains_as_one_process() -> None:
    runs = run(_both, 2, timeout=120)
    for k, optimizer in enumerate(("sgd", "adamw")):
        ref = _reference(optimizer)
        for r in (runs[0][k], runs[1][k]):
            assert r["shards"] == [(8,), (4,)]  # ceil(15/2), 8/2
            assert r["bytes"] == (8 + 4) * 8
            assert r["dtype"] == f64
            assert T.max_abs_diff(r["params"], ref["params"]) < 1e-13
            for got, want in zip(r["grads"], ref["grads"], strict=True):
                assert T.max_abs_diff(got, want) < 1e-13
        start = dict(tiny_mlp(3, DIMS).named_parameters())
        assert T.max_abs_diff(start, ref["params"]) > 1e-3  # the steps moved the weights


def test_compute_dtype_separate_from_masters() -> None:
    for r in run(_bf16, 2, timeout=60):
        assert r["out"] == torch.bfloat16
        assert r["masters"] == r["grads"] == [torch.float32, torch.float32]


def test_fsdp_pair_float64_and_bf16() -> None:
    spec = {"seed": 1, "steps": 3, "batch_size": 6, "lr": 1e-2, "weight_decay": 0.01,
            "dtype": "float64", "compute_dtype": "float64"}
    specs = [spec, {**spec, "dtype": "float32", "compute_dtype": "bfloat16"}]
    results = run(_fsdp_many, 2, specs, timeout=120)
    ref = T.unsharded_reference(spec)
    ref32 = T.unsharded_reference({**spec, "dtype": "float32"})
    for r in results[0]:
        assert T.max_abs_diff(r["book"]["params"], r["torch"]["params"]) < 1e-6
        assert max(T.max_abs_diff(a, b) for a, b in zip(r["book"]["grads"], r["torch"]["grads"], strict=True)) < 1e-6
    f64_run, bf16_run = results[0]
    assert T.max_abs_diff(list(f64_run["book"]["params"].values()), ref["params"]) < 1e-13
    assert f64_run["book"]["shard_bytes"] == f64_run["torch"]["shard_bytes"] == 616 * 8 // 2
    assert bf16_run["book"]["shard_bytes"] == bf16_run["torch"]["shard_bytes"] == 616 * 4 // 2
    # bfloat16 compute moves the trajectory away from float32's, by far more than round-off
    drift = T.max_abs_diff(list(bf16_run["book"]["params"].values()), ref32["params"])
    assert 1e-5 < drift < 1e-1


def _fsdp_many(rank: int, world_size: int, specs: list) -> list:
    return [T.fsdp_pair_worker(rank, world_size, s) for s in specs]


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="nn.Sequential"):
        ShardedModule(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no parameters"):
        ShardedModule(nn.Sequential(nn.Tanh()))
    with pytest.raises(TypeError, match="compute_dtype"):
        ShardedModule(nn.Sequential(nn.Linear(2, 2)), compute_dtype=torch.int64)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="not initialised"):
        ShardedModule(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(WorkerError, match="nn.Sequential"):
        run(_not_sequential, 2, timeout=60)
