"""Tests for llmbook.scale.data_parallel: bucketed DDP on real processes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmbook.scale import data_parallel as D
from llmbook.scale.launch import WorkerError, run

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = {"seed": 3, "steps": 3, "batch_size": 6, "lr": 1e-2, "bucket_cap_bytes": 2048}


def _unused_parameter(rank: int, world_size: int) -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)).double()
    ddp = D.BucketedDataParallel(model, bucket_cap_bytes=10**6)
    ddp.module[0](torch.ones(1, 3, dtype=torch.float64)).sum().backward()  # layer 1 unused
    ddp.finish_gradient_sync()


def _averages_gradients(rank: int, world_size: int) -> list[torch.Tensor]:
    torch.manual_seed(rank)  # different initial weights: the broadcast must fix that
    model = nn.Linear(4, 3, bias=True).double()
    ddp = D.BucketedDataParallel(model, bucket_cap_bytes=8)  # one bucket per parameter
    x = torch.full((1, 4), float(rank + 1), dtype=torch.float64)
    ddp(x).sum().backward()
    ddp.finish_gradient_sync()
    return [model.weight.grad.clone(), model.bias.grad.clone(), model.weight.detach().clone(),
            torch.tensor(len(ddp.buckets))]


def test_shard_batch_worked_example_and_errors() -> None:
    b = torch.arange(12).reshape(6, 2)
    assert D.shard_batch(b, 1, 3).tolist() == [[4, 5], [6, 7]]
    assert torch.equal(torch.cat([D.shard_batch(b, r, 2) for r in range(2)]), b)
    with pytest.raises(ValueError, match="not divisible by world_size=4"):
        D.shard_batch(b, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        D.shard_batch(b, 3, 3)
    with pytest.raises(ValueError, match="batch dimension"):
        D.shard_batch(torch.tensor(1.0), 0, 1)


def test_gradients_are_averaged_and_weights_broadcast() -> None:
    res = run(_averages_gradients, 3, timeout=30)
    # d(sum(W x + b))/dW = x^T per row; mean of x over ranks = (1 + 2 + 3)/3 = 2
    for w_grad, b_grad, w, n_buckets in res:
        assert torch.equal(w_grad, torch.full((3, 4), 2.0, dtype=torch.float64))
        assert torch.equal(b_grad, torch.ones(3, dtype=torch.float64))
        assert torch.equal(w, res[0][2])
        assert int(n_buckets) == 2


@pytest.mark.parametrize("implementation", ["book", "torch"])
def test_ddp_equals_single_process(implementation: str) -> None:
    reference, ref_losses = D.train_single_process(SPEC)
    res = run(D.ddp_train_worker, 3, SPEC | {"implementation": implementation}, timeout=60)
    for r in res:
        for k, v in reference.items():
            torch.testing.assert_close(r["state"][k], v, rtol=0, atol=1e-12)
    mean_first = sum(r["losses"][0] for r in res) / 3
    assert mean_first == pytest.approx(ref_losses[0], abs=1e-12)
    if implementation == "book":
        log = res[0]["launch_log"]
        assert sorted(i for i, _ in log) == list(range(len(res[0]["bucket_sizes"])))
        assert log[0][1] > 0 and log[-1][1] == 0  # overlap: launched before backward ended
        assert sum(res[0]["bucket_sizes"]) == len(list(D.tiny_language_model(0).parameters()))


def test_training_changes_the_parameters() -> None:
    reference, losses = D.train_single_process(SPEC)
    initial = D.tiny_language_model(SPEC["seed"]).state_dict()
    assert max(float((initial[k] - reference[k]).abs().max()) for k in initial) > 1e-3
    assert D.make_batches(2, 4, seed=0).shape == (2, 4, 9)


def test_unused_parameter_raises() -> None:
    with pytest.raises(WorkerError, match="never all-reduced"):
        run(_unused_parameter, 2, timeout=30)


def test_bad_arguments() -> None:
    with pytest.raises(WorkerError, match="implementation"):
        run(D.ddp_train_worker, 2, SPEC | {"implementation": "horovod"}, timeout=30)
    with pytest.raises(ValueError, match="bucket_cap_bytes must be positive"):
        D.BucketedDataParallel(nn.Linear(2, 2), bucket_cap_bytes=0)


def test_train_steps_shards_the_batch_and_syncs_between_backward_and_step() -> None:
    """The one loop the chapter's runs and the workbench's Part VI check share."""
    model = D.tiny_language_model(SPEC["seed"])
    seen = []

    def sync() -> None:  # after the backward (gradients there), before the step
        seen.append(all(p.grad is not None for p in model.parameters()))

    state, losses = D.train_steps(model, SPEC, sync=sync)
    reference, ref_losses = D.train_single_process(SPEC)
    assert seen == [True] * SPEC["steps"] and losses == ref_losses
    assert all(torch.equal(state[k], v) for k, v in reference.items())
    # rank 0 of 2 without a gradient sync trains on its half alone: a different model
    half, half_losses = D.train_steps(D.tiny_language_model(SPEC["seed"]), SPEC, rank=0, world_size=2)
    assert half_losses[0] != ref_losses[0]
    assert not all(torch.equal(half[k], v) for k, v in reference.items())
    with pytest.raises(ValueError, match="missing the key"):
        D.train_steps(model, {"seed": 0, "steps": 1, "batch_size": 2})
