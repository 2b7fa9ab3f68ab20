"""Tests for llmbook.scale.linear_attention: the parallel, recurrent and cumsum forms of causal
linear attention (Katharopoulos et al., 2020) agree, are causal, and match hand computations."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import randn

from llmbook.scale.linear_attention import (
    causal_linear_attention_cumsum,
    causal_linear_attention_parallel,
    causal_linear_attention_recurrent,
    elu_feature_map,
)

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
FORMS = [causal_linear_attention_parallel, causal_linear_attention_recurrent,
         causal_linear_attention_cumsum]


def identity(x):
    return x


def test_elu_feature_map_values():
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=D)
    assert torch.allclose(elu_feature_map(x), torch.tensor([math.exp(-1), 1.0, 3.0], dtype=D), atol=1e-15)
    assert bool((elu_feature_map(randn(100) * 30) > 0).all())  # elu(x) + 1 would round to 0
    assert torch.allclose(elu_feature_map(x), torch.nn.functional.elu(x) + 1, atol=1e-15)


@pytest.mark.parametrize("form", FORMS)
def test_worked_example(form):
    # phi = identity on positive numbers; T = 2, d_k = d_v = 1:
    # y_0 = v_0 = 2; y_1 = (q1 k0 v0 + q1 k1 v1) / (q1 k0 + q1 k1) = (4 + 24) / 8 = 3.5
    q = torch.tensor([[1.0], [2.0]], dtype=D)
    k = torch.tensor([[1.0], [3.0]], dtype=D)
    v = torch.tensor([[2.0], [4.0]], dtype=D)
    assert form(q, k, v, feature_map=identity).tolist() == [[2.0], [3.5]]


@pytest.mark.parametrize("form", FORMS[1:])
def test_forms_equal_parallel_non_square(form):
    q, k, v = randn(2, 3, 11, 4, seed=1), randn(2, 3, 11, 4, seed=2), randn(2, 3, 11, 6, seed=3)
    expected = causal_linear_attention_parallel(q, k, v)
    assert expected.shape == (2, 3, 11, 6)
    assert torch.allclose(form(q, k, v), expected, atol=1e-13)


def test_recurrent_state_is_sum_of_outer_products():
    q, k, v = randn(5, 3, seed=4), randn(5, 3, seed=5), randn(5, 2, seed=6)
    _, S, z = causal_linear_attention_recurrent(q, k, v, return_state=True)
    phi_k = elu_feature_map(k)
    assert torch.allclose(S, phi_k.T @ v, atol=1e-14)  # sum_t phi(k_t) v_t^T
    assert torch.allclose(z, phi_k.sum(0), atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 9), d_k=st.integers(1, 5), d_v=st.integers(1, 5), cut=st.integers(0, 8),
       seed=st.integers(0, 10_000))
def test_causal_future_does_not_change_the_past(T, d_k, d_v, cut, seed):
    cut = min(cut, T - 1)
    q, k, v = randn(T, d_k, seed=seed), randn(T, d_k, seed=seed + 1), randn(T, d_v, seed=seed + 2)
    y = causal_linear_attention_parallel(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[cut + 1:] += 5.0
    v2[cut + 1:] -= 3.0
    y2 = causal_linear_attention_recurrent(q, k2, v2)
    assert torch.allclose(y[: cut + 1], y2[: cut + 1], atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_output_is_a_convex_combination_of_values(T, seed):
    q, k, v = randn(T, 3, seed=seed), randn(T, 3, seed=seed + 1), randn(T, 2, seed=seed + 2)
    y = causal_linear_attention_cumsum(q, k, v)
    for t in range(T):
        assert bool((y[t] <= v[: t + 1].max(0).values + 1e-12).all())
        assert bool((y[t] >= v[: t + 1].min(0).values - 1e-12).all())


def test_gradients_agree_and_pass_gradcheck():
    q, k, v = (randn(6, 3, seed=s).requires_grad_() for s in (7, 8, 9))
    assert torch.autograd.gradcheck(causal_linear_attention_recurrent, (q, k, v))
    g1 = torch.autograd.grad(causal_linear_attention_parallel(q, k, v).square().sum(), (q, k, v))
    g2 = torch.autograd.grad(causal_linear_attention_recurrent(q, k, v).square().sum(), (q, k, v))
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_bad_input(form):
    q, v = randn(5, 3), randn(5, 2)
    with pytest.raises(ValueError, match="q and k"):
        form(q, randn(5, 4), v)
    with pytest.raises(ValueError, match="v must have"):
        form(q, q, randn(4, 2))
    with pytest.raises(ValueError, match=r"\(..., T, d\)"):
        form(randn(3), randn(3), randn(3))
    with pytest.raises(TypeError, match="floating-point"):
        form(q.long(), q.long(), v)
    with pytest.raises(TypeError, match="torch.Tensor"):
        form(q.tolist(), q, v)
    with pytest.raises(ValueError, match="feature_map"):
        form(q, q, v, feature_map=lambda x: x.sum(-1))
    with pytest.raises(TypeError, match="floating-point"):
        elu_feature_map(torch.tensor([1, 2]))
