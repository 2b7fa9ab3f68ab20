"""Tests for llmbook.text.functional: softmax, log_softmax, logsumexp, cross_entropy, perplexity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llmbook.text.functional import (
    cross_entropy,
    log_softmax,
    logsumexp,
    perplexity,
    perplexity_from_loss,
    softmax,
)

SHAPES = [(7,), (3, 5), (2, 3, 11), (4, 1, 6)]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """|got - ref| <= tol * max(1, |ref|) elementwise: absolute for O(1) values, relative
    beyond (a float32 log-probability of -30 is only stored to about 4e-6)."""
    return bool(((got - ref).abs() <= tol * ref.abs().clamp(min=1.0)).all())


# ---------------------------------------------------------------- worked examples


def test_softmax_worked_example() -> None:
    z = torch.tensor([0.0, math.log(2.0), math.log(5.0)], dtype=torch.float64)
    assert torch.allclose(softmax(z), torch.tensor([1 / 8, 2 / 8, 5 / 8], dtype=torch.float64),
                          atol=1e-15)
    assert math.isclose(float(logsumexp(z)), math.log(8.0), abs_tol=1e-15)


def test_cross_entropy_worked_example() -> None:
    # p = (1/8, 2/8, 5/8); targets 2 then 0: mean NLL = (log(8/5) + log 8) / 2
    z = torch.log(torch.tensor([[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]], dtype=torch.float64))
    y = torch.tensor([2, 0])
    expected = (math.log(8 / 5) + math.log(8)) / 2
    assert math.isclose(float(cross_entropy(z, y)), expected, abs_tol=1e-15)
    assert math.isclose(float(perplexity(z, y)), math.exp(expected), rel_tol=1e-14)
    assert math.isclose(float(cross_entropy(z, y, reduction="sum")), 2 * expected, abs_tol=1e-14)


def test_uniform_model_has_perplexity_v() -> None:
    for v in (2, 17, 50257):
        z = torch.zeros(3, v)
        y = torch.tensor([0, v // 2, v - 1])
        assert math.isclose(float(perplexity(z, y)), v, rel_tol=1e-5)
    assert perplexity_from_loss(math.log(10.0)) == pytest.approx(10.0, rel=1e-15)
    assert float(perplexity_from_loss(torch.tensor(math.log(3.0)))) == pytest.approx(3.0)


# ---------------------------------------------------------------- against PyTorch


@pytest.mark.parametrize(("shape", "dim"), [(s, d) for s in SHAPES for d in (0, -1, 1) if d < len(s)])
def test_softmax_and_log_softmax_match_torch(shape: tuple[int, ...], dim: int) -> None:
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
        x = 3 * torch.randn(shape, generator=_gen(len(shape)), dtype=dtype)
        assert _close(softmax(x, dim), torch.softmax(x, dim), tol)
        assert _close(log_softmax(x, dim), torch.log_softmax(x, dim), tol)
        assert _close(logsumexp(x, dim), torch.logsumexp(x, dim), tol)
        assert logsumexp(x, dim, keepdim=True).shape == torch.logsumexp(x, dim, keepdim=True).shape


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 11), (4, 1, 6), (2, 3, 4, 9)])
def test_cross_entropy_matches_torch(shape: tuple[int, ...]) -> None:
    v = shape[-1]
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
        z = 4 * torch.randn(shape, generator=_gen(v), dtype=dtype)
        y = torch.randint(0, v, shape[:-1], generator=_gen(v + 1))
        ref = F.cross_entropy(z.reshape(-1, v), y.reshape(-1))
        assert _close(cross_entropy(z, y), ref, tol)
        ref_none = F.cross_entropy(z.reshape(-1, v), y.reshape(-1), reduction="none")
        assert _close(cross_entropy(z, y, reduction="none").reshape(-1), ref_none, tol)
        assert _close(perplexity(z, y), torch.exp(ref), 2 * tol)


def test_cross_entropy_ignore_index_matches_torch() -> None:
    z = torch.randn(4, 6, 10, generator=_gen(3), dtype=torch.float64)
    y = torch.randint(0, 10, (4, 6), generator=_gen(4))
    y[0, :3] = -100
    y[2, 5] = -100
    ref = F.cross_entropy(z.reshape(-1, 10), y.reshape(-1))
    assert abs(float(cross_entropy(z, y) - ref)) <= 1e-12
    y2 = torch.where(y == -100, torch.full_like(y, 7), y)
    y2[1, 1] = 7
    ref7 = F.cross_entropy(z.reshape(-1, 10), y2.reshape(-1), ignore_index=7)
    assert abs(float(cross_entropy(z, y2, ignore_index=7) - ref7)) <= 1e-12


def test_stable_at_extreme_logits() -> None:
    big = torch.tensor([[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4, 1e4, 1e4]])
    y = torch.tensor([1, 2, 3])
    p = softmax(big)
    lp = log_softmax(big)
    assert torch.isfinite(p).all() and torch.isfinite(lp).all()
    assert _close(p, torch.softmax(big, -1), 1e-6)
    assert _close(lp, torch.log_softmax(big, -1), 1e-6)
    ce = cross_entropy(big, y)
    assert torch.isfinite(ce)
    assert _close(ce, F.cross_entropy(big, y), 1e-6)
    # the naive formula overflows: exp(1e4) = inf, inf / inf = nan
    naive = torch.exp(big) / torch.exp(big).sum(-1, keepdim=True)
    assert torch.isnan(naive).any()


def test_all_minus_inf_row_matches_torch() -> None:
    x = torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 1.0]])
    assert torch.equal(logsumexp(x), torch.logsumexp(x, -1))
    assert torch.allclose(softmax(x)[1], torch.softmax(x, -1)[1])


# ---------------------------------------------------------------- gradients


def test_gradcheck_float64() -> None:
    x = torch.randn(3, 5, generator=_gen(5), dtype=torch.float64, requires_grad=True)
    y = torch.tensor([4, 0, 2])
    assert torch.autograd.gradcheck(lambda t: softmax(t, 1), (x,))
    assert torch.autograd.gradcheck(lambda t: log_softmax(t, 0), (x,))
    assert torch.autograd.gradcheck(lambda t: logsumexp(t, -1), (x,))
    assert torch.autograd.gradcheck(lambda t: cross_entropy(t, y), (x,))
    assert torch.autograd.gradgradcheck(lambda t: cross_entropy(t, y), (x,))


def test_cross_entropy_gradient_is_p_minus_y_over_n() -> None:
    z = torch.randn(2, 3, 7, generator=_gen(6), dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (2, 3), generator=_gen(7))
    (g,) = torch.autograd.grad(cross_entropy(z, y), z)
    expected = (torch.softmax(z, -1) - F.one_hot(y, 7)) / y.numel()
    assert (g - expected).abs().max() <= 1e-15


# ---------------------------------------------------------------- properties

finite_rows = arrays(dtype="float64", shape=st.tuples(st.integers(1, 4), st.integers(1, 9)),
                     elements=st.floats(-1e4, 1e4, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(x=finite_rows, c=st.floats(-1e3, 1e3))
def test_softmax_sums_to_one_and_is_shift_invariant(x, c) -> None:
    t = torch.from_numpy(x)
    p = softmax(t)
    assert torch.isfinite(p).all()
    assert torch.allclose(p.sum(-1), torch.ones(t.shape[0], dtype=torch.float64), atol=1e-12)
    shift = torch.linspace(-1, 1, t.shape[0], dtype=torch.float64)[:, None] * c  # per row
    assert torch.allclose(softmax(t + shift), p, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(x=finite_rows)
@example(x=np.array([[-8494.0] + [-7753.0] * 6]))
def test_log_softmax_is_log_of_softmax(x) -> None:
    t = torch.from_numpy(x)
    lp = log_softmax(t)
    assert torch.isfinite(lp).all()
    p = softmax(t)
    # compared where p is a normal float: a subnormal p (below 2.2e-308) keeps only a few
    # significant bits. At x = (-8494, -7753 x 6), p_0 = e^-741 / 6 = 2.5e-323 and log p_0 is
    # 0.039 off, while log_softmax gives -741 - log 6 exactly (hypothesis found this row)
    normal = p >= torch.finfo(torch.float64).tiny
    assert torch.allclose(lp[normal], torch.log(p[normal]), atol=1e-9)
    assert (lp <= 1e-12).all()


# ---------------------------------------------------------------- bad input


def test_bad_targets_raise() -> None:
    z = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match=r"target 5 .* V = 5"):
        cross_entropy(z, torch.tensor([[0, 1, 5], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"target -1 .* V = 5"):
        cross_entropy(z, torch.tensor([[0, -1, 2], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"\(2, 3, 5\).*\(3, 2\)"):
        cross_entropy(z, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(2, 3, 5\).*\(6,\)"):
        cross_entropy(z, torch.zeros(6, dtype=torch.long))  # no silent flattening
    with pytest.raises(TypeError, match="integer"):
        cross_entropy(z, torch.zeros(2, 3))
    with pytest.raises(TypeError, match="floating"):
        cross_entropy(torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="all 2 targets are ignore_index"):
        cross_entropy(torch.randn(2, 5), torch.tensor([-100, -100]))
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(torch.randn(2, 5), torch.tensor([1, 1]), reduction="avg")


def test_bad_dim_and_dtype_raise() -> None:
    x = torch.randn(3, 4)
    for fn in (softmax, log_softmax, logsumexp):
        with pytest.raises(ValueError, match=r"dim=2 .* 2 dimensions"):
            fn(x, 2)
        with pytest.raises(ValueError, match=r"dim=-3"):
            fn(x, -3)
        with pytest.raises(TypeError, match="floating"):
            fn(torch.arange(4), -1)
        with pytest.raises(ValueError, match="0-d"):
            fn(torch.tensor(1.0), 0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        perplexity_from_loss(-1.0)
