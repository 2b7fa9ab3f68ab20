"""Tests for llmbook.scale.icl: in-context regression prompts, one GD step, the LSA construction."""

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.scale.icl import (
    LinearSelfAttention,
    effective_weights,
    gd_construction,
    gd_prediction,
    optimal_learning_rate,
    regression_prompts,
    train_lsa,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_regression_prompts_layout():
    tokens, target = regression_prompts(5, 7, 3, gen(0))
    assert tokens.shape == (5, 8, 4) and target.shape == (5,) and tokens.dtype == torch.float64
    assert torch.all(tokens[:, -1, -1] == 0) and tokens[:, :, :3].abs().max() <= 1
    # y_i = w^T x_i with one w per prompt: solve for w from the first 3 examples, predict the rest
    x, y = tokens[:, :-1, :3], tokens[:, :-1, 3]
    w = torch.linalg.solve(x[:, :3], y[:, :3])  # (5, 3)
    assert torch.allclose(torch.einsum("bnd,bd->bn", x, w), y, atol=1e-10)
    assert torch.allclose((tokens[:, -1, :3] * w).sum(-1), target, atol=1e-10)
    with pytest.raises(TypeError, match="generator"):
        regression_prompts(2, 3, 2, 0)
    with pytest.raises(ValueError, match="n_context"):
        regression_prompts(2, 0, 2, gen(0))


def test_gd_prediction_worked_example():
    # d = 2, N = 2: x_1 = (1, 0), y_1 = 2; x_2 = (0, 1), y_2 = -4; x_q = (3, 1); eta = 0.5
    tokens = torch.tensor([[[1.0, 0.0, 2.0], [0.0, 1.0, -4.0], [3.0, 1.0, 0.0]]], dtype=torch.float64)
    # grad L(0) = -1/2 (2 (1, 0) - 4 (0, 1)) = (-1, 2); w_1 = (0.5, -1); w_1^T x_q = 0.5
    assert gd_prediction(tokens, 0.5).tolist() == [0.5]
    with pytest.raises(ValueError, match="eta"):
        gd_prediction(tokens, 0.0)
    with pytest.raises(ValueError, match="tokens"):
        gd_prediction(tokens[:, :1], 0.5)
    with pytest.raises(TypeError, match="tokens"):
        gd_prediction(tokens.long(), 0.5)


@given(d=st.integers(1, 5), N=st.integers(1, 9), eta=st.floats(0.01, 3.0), seed=st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_construction_equals_one_gd_step(d, N, eta, seed):
    tokens, _ = regression_prompts(6, N, d, gen(seed))
    layer = LinearSelfAttention(d, weights=gd_construction(d, eta, N))
    closed = eta / N * torch.einsum("bn,bnd,bd->b", tokens[:, :-1, -1], tokens[:, :-1, :-1], tokens[:, -1, :-1])
    with torch.no_grad():
        got = layer.predict(tokens)
    assert torch.allclose(got, gd_prediction(tokens, eta), atol=1e-12)
    assert torch.allclose(got, closed, atol=1e-12)
    assert torch.allclose(layer(tokens)[:, :-1], tokens[:, -1, :-1], atol=0)  # x_q passes unchanged


def test_construction_symbolic_d3_n2():
    d, N = 3, 2
    eta = sp.Symbol("eta", positive=True)
    xs = [sp.Matrix(sp.symbols(f"x{i}_0:{d}")) for i in range(N + 1)]
    ys = list(sp.symbols(f"y0:{N}"))
    w = {k: sp.Matrix(v.tolist()) for k, v in gd_construction(d, 1.0, N).items()}
    P = w["P"] * eta  # P = eta / N I, built with eta = 1
    e = [xs[i].col_join(sp.Matrix([ys[i]])) for i in range(N)]
    q = xs[N].col_join(sp.Matrix([0]))
    update = sum((P * w["W_V"] * e[i] * (w["W_K"] * e[i]).T * (w["W_Q"] * q) for i in range(N)), sp.zeros(d + 1, 1))
    grad = -sum((ys[i] * xs[i] for i in range(N)), sp.zeros(d, 1)) / N  # grad L at w = 0
    prediction = (-eta * grad).dot(xs[N])
    assert sp.expand(-update[d] - prediction) == 0
    assert update[:d, 0] == sp.zeros(d, 1)


def test_layer_forward_matches_loop_and_gradcheck():
    layer = LinearSelfAttention(3, init_std=0.5, generator=gen(1))
    tokens, _ = regression_prompts(2, 5, 3, gen(2))
    with torch.no_grad():
        got = layer(tokens)
        for b in range(2):
            q = tokens[b, -1]
            want = q + sum(layer.P @ layer.W_V @ e * ((layer.W_K @ e) @ (layer.W_Q @ q)) for e in tokens[b, :-1])
            assert torch.allclose(got[b], want, atol=1e-12)
    params = tuple(p.detach().clone().requires_grad_() for p in (layer.W_K, layer.W_Q, layer.W_V, layer.P))

    def f(wk, wq, wv, p):
        return LinearSelfAttention(3, weights={"W_K": wk, "W_Q": wq, "W_V": wv, "P": p}).predict(tokens)

    def g(wk, wq, wv, p):  # the same function written with plain tensor algebra
        e, q = tokens[:, :-1], tokens[:, -1]
        s = (e @ wk.T) @ (wq @ q[..., None])  # (B, N, 1)
        return -(q[:, -1] + ((e @ (p @ wv).T)[..., -1:] * s).sum((1, 2)))

    assert torch.allclose(f(*params), g(*params), atol=1e-12)
    assert torch.autograd.gradcheck(g, params)  # float64 finite differences of the plain algebra
    layer.predict(tokens).sum().backward()  # ... and the layer's autograd agrees with it
    want = torch.autograd.grad(g(*params).sum(), params)
    for got, w in zip((layer.W_K, layer.W_Q, layer.W_V, layer.P), want, strict=True):
        assert torch.allclose(got.grad, w, atol=1e-12)
    with pytest.raises(ValueError, match="features"):
        layer(torch.zeros(2, 5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="W_V"):
        LinearSelfAttention(2, weights={"W_K": torch.eye(3), "W_Q": torch.eye(3), "P": torch.eye(3)})


def test_effective_weights_invariant_and_identify_predictions():
    layer = LinearSelfAttention(2, init_std=0.7, generator=gen(3))
    tokens, _ = regression_prompts(4, 6, 2, gen(4))
    M = effective_weights(layer).detach()
    assert M.shape == (3, 3, 2)
    # the prediction is -sum_i e_i^a e_i^b x_q^k M[a, b, k] (plus the query's own y-slot, 0)
    want = -torch.einsum("bna,bnc,bk,ack->b", tokens[:, :-1], tokens[:, :-1], tokens[:, -1, :-1], M)
    assert torch.allclose(layer.predict(tokens).detach(), want, atol=1e-12)
    # rescaling P by c and W_Q by 1/c leaves M (and the predictions) unchanged
    w = {n: getattr(layer, n).detach() for n in ("W_K", "W_Q", "W_V", "P")}
    w2 = {**w, "P": 4.0 * w["P"], "W_Q": w["W_Q"] / 4.0}
    assert torch.allclose(effective_weights(w2), M, atol=1e-12)


def test_optimal_learning_rate_closed_form_and_monte_carlo():
    assert optimal_learning_rate(1, 1) == pytest.approx(5 / 3)  # E[x^2] / E[x^4] = (1/3) / (1/5)
    assert optimal_learning_rate(3, 10) == pytest.approx(2.34375)
    assert optimal_learning_rate(3, 10 ** 6) == pytest.approx(3.0, rel=1e-5)  # S -> E[S] = I / 3
    tokens, target = regression_prompts(20000, 10, 3, gen(5))
    err = {eta: float(((gd_prediction(tokens, eta) - target) ** 2).mean()) for eta in (1.8, 2.34375, 2.9)}
    assert err[2.34375] < err[1.8] and err[2.34375] < err[2.9]
    with pytest.raises(ValueError, match="dim"):
        optimal_learning_rate(0, 3)


def test_trained_layer_converges_to_the_construction():
    d, N = 3, 10  # the chapter's run (about 10 s)
    layer, losses = train_lsa(d, N, seed=0)
    eta = optimal_learning_rate(d, N)
    M, Mc = effective_weights(layer).detach(), effective_weights(gd_construction(d, eta, N))
    assert float((M - Mc).norm() / Mc.norm()) < 0.03
    tokens, _ = regression_prompts(2000, N, d, gen(9))
    with torch.no_grad():
        gap = (layer.predict(tokens) - gd_prediction(tokens, eta)).pow(2).mean().sqrt()
    assert float(gap) < 0.05 and losses[-1] < 0.5 * losses[0]
