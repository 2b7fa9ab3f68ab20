"""Tests for llmbook.scale.mixed_precision: loss scaling, master weights, ulps, bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from llmbook.scale import mixed_precision as M
from llmbook.training.optim import SGD

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bytes_per_parameter() -> None:
    b = M.mixed_precision_bytes_symbolic()
    assert b["total"] == 16 and b["K (optimizer states)"] == 12 and b["weight (16-bit)"] == 2


def test_half_ulp_worked_examples() -> None:
    assert float(M.half_ulp(torch.tensor(1.0), torch.bfloat16)) == 2.0**-8
    assert float(M.half_ulp(torch.tensor(-3.0), torch.float16)) == 2.0**-10
    assert float(M.half_ulp(torch.tensor(0.5), torch.float32)) == 2.0**-25
    with pytest.raises(ValueError, match="non-zero"):
        M.half_ulp(torch.tensor(0.0), torch.bfloat16)
    with pytest.raises(TypeError, match="floating"):
        M.half_ulp(torch.tensor(1.0), torch.int32)


@given(st.floats(0.01, 100.0), st.sampled_from([torch.bfloat16, torch.float16]))
@settings(max_examples=40, deadline=None)
def test_half_ulp_is_the_rounding_threshold(x: float, dtype: torch.dtype) -> None:
    w = torch.tensor(x, dtype=dtype)
    h = float(M.half_ulp(w.double(), dtype))
    assert (w.double() + 0.49 * h).to(dtype) == w  # below half an ulp: lost
    assert (w.double() + 1.01 * h).to(dtype) != w  # above: the weight moves


def test_loss_scaler_rules() -> None:
    s = M.DynamicLossScaler(init_scale=8.0, growth_interval=2)
    p = nn.Parameter(torch.zeros(2))
    steps = []
    for grad in ([1.0, 2.0], [float("inf"), 0.0], [1.0, 1.0], [1.0, 1.0], [float("nan"), 1.0]):
        p.grad = torch.tensor(grad) * s.scale_value
        steps.append(s.step(lambda: None, [p]))
    assert steps == [True, False, True, True, False]
    assert [h[0] for h in s.history] == [8.0, 8.0, 4.0, 4.0, 8.0]
    assert s.scale_value == 4.0
    torch.testing.assert_close(s.scale(torch.tensor(2.0)), torch.tensor(8.0))


def test_loss_scaler_bad_arguments() -> None:
    with pytest.raises(ValueError, match="growth_factor"):
        M.DynamicLossScaler(growth_factor=0.5)
    with pytest.raises(ValueError, match="init_scale"):
        M.DynamicLossScaler(init_scale=-1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        M.DynamicLossScaler(growth_interval=0)


@given(st.lists(st.sampled_from([1e-3, 0.5, 3.0, 1e-5]), min_size=1, max_size=25), st.integers(1, 4))
@settings(max_examples=20, deadline=None)
def test_scaler_matches_torch_grad_scaler(grads: list[float], interval: int) -> None:
    ours = M.scaler_trajectory(M.DynamicLossScaler(init_scale=2.0**15, growth_interval=interval), grads)
    theirs = M.scaler_trajectory(torch.amp.GradScaler("cpu", init_scale=2.0**15, growth_interval=interval), grads)
    assert ours == theirs


def test_master_weights_keep_small_updates() -> None:
    model = nn.Linear(3, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.fill_(1.0)
    plain = SGD(model.parameters(), lr=1e-3)
    for _ in range(10):
        plain.zero_grad()
        model.weight.grad = torch.ones_like(model.weight)
        plain.step()
    assert torch.equal(model.weight, torch.ones_like(model.weight))  # every update was lost
    opt = M.MasterWeightOptimizer(model.parameters(), lambda ps: SGD(ps, lr=1e-3))
    for _ in range(100):
        opt.zero_grad()
        model.weight.grad = torch.ones_like(model.weight)
        assert opt.step()
    assert opt.masters[0].dtype == torch.float32
    torch.testing.assert_close(opt.masters[0], torch.full((1, 3), 0.9), atol=1e-5, rtol=0)
    assert torch.equal(model.weight, torch.full((1, 3), 0.9).bfloat16())


def test_master_weights_with_scaler_skip_overflow_and_unscale() -> None:
    model = nn.Linear(2, 1, bias=False).half()
    scaler = M.DynamicLossScaler(init_scale=1024.0)
    opt = M.MasterWeightOptimizer(model.parameters(), lambda ps: SGD(ps, lr=1.0), scaler=scaler)
    before = model.weight.detach().clone()
    model.weight.grad = torch.tensor([[float("inf"), 1.0]]).half()
    assert not opt.step() and torch.equal(model.weight, before) and scaler.scale_value == 512.0
    model.weight.grad = (torch.tensor([[2.0**-20, 1.0]]) * 512).half()  # scaled gradient
    assert opt.step()
    torch.testing.assert_close(opt.masters[0].float(), before.float() - torch.tensor([[2.0**-20, 1.0]]),
                               atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="no parameter"):
        M.MasterWeightOptimizer([], lambda ps: SGD(ps, lr=1.0))
