"""Tests for llmbook.training.backprop: every hand-written backward pass equals torch.autograd."""

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.training.backprop import (
    attention_backward,
    cross_entropy_backward,
    gelu_backward,
    layer_norm_backward,
    linear_backward,
    softmax_backward,
)

F64 = torch.float64
B, T, D_IN, D_OUT, V = 3, 5, 7, 4, 11  # all different, so a transposed axis cannot hide
TOL = 1e-10


def _randn(*shape, seed=0, scale=1.0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=F64)).requires_grad_(requires_grad)


def _max_err(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------- linear


@pytest.mark.parametrize("x_shape", [(D_IN,), (T, D_IN), (B, T, D_IN), (2, B, T, D_IN)])
def test_linear_backward_equals_autograd(x_shape):
    x = _randn(*x_shape, seed=1, requires_grad=True)
    W = _randn(D_OUT, D_IN, seed=2, requires_grad=True)
    b = _randn(D_OUT, seed=3, requires_grad=True)
    G = _randn(*x_shape[:-1], D_OUT, seed=4)
    auto = torch.autograd.grad(F.linear(x, W, b), (x, W, b), G)
    ours = linear_backward(x.detach(), W.detach(), G)
    for a, o in zip(auto, ours, strict=True):
        assert a.shape == o.shape
        assert _max_err(a, o) < TOL


def test_linear_backward_worked_example():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]], dtype=F64)  # (N=3, d_in=2)
    W = torch.tensor([[1.0, 0.0], [2.0, -1.0], [0.5, 1.0]], dtype=F64)  # (d_out=3, d_in=2)
    G = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [2.0, 0.0, -1.0]], dtype=F64)
    gx, gW, gb = linear_backward(x, W, G)
    assert gx.tolist() == [[1.5, 1.0], [2.0, -1.0], [1.5, -1.0]]  # G W
    assert gW.tolist() == [[1.0, 4.0], [3.0, -1.0], [1.0, 1.0]]  # G^T X
    assert gb.tolist() == [3.0, 1.0, 0.0]


def test_linear_backward_xw_layout_identity():
    # for Y = X M with M = W^T (d_in, d_out): dL/dM = X^T G, dL/dX = G M^T
    x = _randn(6, D_IN, seed=5)
    W = _randn(D_OUT, D_IN, seed=6)
    G = _randn(6, D_OUT, seed=7)
    gx, gW, _ = linear_backward(x, W, G)
    M = W.T
    assert _max_err(gW.T, x.T @ G) < 1e-14 and _max_err(gx, G @ M.T) < 1e-14


def test_linear_backward_errors():
    x, W, G = _randn(B, D_IN), _randn(D_OUT, D_IN), _randn(B, D_OUT)
    with pytest.raises(ValueError, match=r"x has last dimension 4 but W of shape \(4, 7\)"):
        linear_backward(_randn(B, D_OUT), W, G)
    with pytest.raises(ValueError, match=r"grad_out must have shape \(3, 4\)"):
        linear_backward(x, W, _randn(B, D_IN))
    with pytest.raises(ValueError, match=r"W must have shape \(d_out, d_in\)"):
        linear_backward(x, _randn(1, D_OUT, D_IN), G)
    with pytest.raises(TypeError, match="floating-point"):
        linear_backward(x.long(), W, G)
    with pytest.raises(TypeError, match="torch.Tensor"):
        linear_backward(x.tolist(), W, G)


def test_linear_backward_symbolic():
    X = sp.Matrix(2, 3, lambda i, j: sp.Symbol(f"x{i}{j}"))
    Wt = sp.Matrix(2, 3, lambda i, j: sp.Symbol(f"w{i}{j}"))  # (d_out, d_in)
    G = sp.Matrix(2, 2, lambda i, j: sp.Symbol(f"g{i}{j}"))
    L = sum(G.multiply_elementwise(X * Wt.T))
    assert sp.Matrix(2, 3, lambda i, j: sp.diff(L, Wt[i, j])) == sp.expand(G.T * X)
    assert sp.Matrix(2, 3, lambda i, j: sp.diff(L, X[i, j])) == sp.expand(G * Wt)
    vals = {s: (k % 5) - 2.0 for k, s in enumerate(sorted(L.free_symbols, key=str))}
    to_t = lambda M: torch.tensor(M.subs(vals).tolist(), dtype=F64)  # noqa: E731
    gx, gW, _ = linear_backward(to_t(X), to_t(Wt), to_t(G))
    assert torch.equal(gW, to_t(G.T * X)) and torch.equal(gx, to_t(G * Wt))


# ---------------------------------------------------------------- softmax


def test_softmax_backward_equals_autograd_and_jacobian():
    z = _randn(B, T, V, seed=8, scale=2.0, requires_grad=True)
    p = torch.softmax(z, -1)
    g = _randn(B, T, V, seed=9)
    (auto,) = torch.autograd.grad(p, z, g)
    ours = softmax_backward(p.detach(), g)
    assert _max_err(auto, ours) < TOL
    pd = p.detach()[1, 2]
    J = torch.diag(pd) - torch.outer(pd, pd)
    assert _max_err(J.T @ g[1, 2], ours[1, 2]) < 1e-15


def test_softmax_backward_worked_example():
    p = torch.tensor([0.5, 0.25, 0.25], dtype=F64)
    g = torch.tensor([1.0, 0.0, 0.0], dtype=F64)  # <g, p> = 0.5
    assert softmax_backward(p, g).tolist() == [0.25, -0.125, -0.125]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-20, 20), min_size=2, max_size=9),
    st.integers(0, 2**31 - 1),
)
def test_softmax_backward_rows_sum_to_zero_and_ignore_constant_g(z_list, seed):
    z = torch.tensor(z_list, dtype=F64)
    p = torch.softmax(z, -1)
    g = torch.randn(len(z_list), generator=torch.Generator().manual_seed(seed), dtype=F64)
    out = softmax_backward(p, g)
    assert abs(out.sum().item()) < 1e-12 * max(1.0, g.abs().max().item())
    # adding a constant to g (a loss term that depends on sum(p) = 1) changes nothing
    assert _max_err(softmax_backward(p, g + 3.0), out) < 1e-12


def test_softmax_backward_errors():
    with pytest.raises(ValueError, match=r"same shape, got \(2, 3\) and \(2, 4\)"):
        softmax_backward(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(TypeError, match="floating-point"):
        softmax_backward(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3))


# ---------------------------------------------------------------- cross-entropy


@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy_backward_equals_autograd(ignore):
    z = _randn(B, T, V, seed=10, scale=3.0, requires_grad=True)
    t = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(11))
    if ignore:
        t[0, 1] = t[2, 4] = -100
    (auto,) = torch.autograd.grad(F.cross_entropy(z.reshape(-1, V), t.reshape(-1)), z)
    ours = cross_entropy_backward(z.detach(), t)
    assert _max_err(auto, ours) < TOL
    if ignore:
        assert torch.equal(ours[0, 1], torch.zeros(V, dtype=F64))


def test_cross_entropy_backward_worked_example_and_custom_ignore_index():
    z = torch.zeros(2, 4, dtype=F64)  # uniform p = 1/4
    t = torch.tensor([2, 7])
    out = cross_entropy_backward(z, t, ignore_index=7)  # N = 1
    assert out[0].tolist() == [0.25, 0.25, -0.75, 0.25] and out[1].tolist() == [0.0] * 4


def test_cross_entropy_backward_errors():
    z = torch.zeros(B, V, dtype=F64)
    with pytest.raises(ValueError, match=r"need targets of shape \(3,\)"):
        cross_entropy_backward(z, torch.zeros(B, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="target 11 is out of range for V = 11"):
        cross_entropy_backward(z, torch.tensor([0, 11, 2]))
    with pytest.raises(ValueError, match="every target is ignore_index"):
        cross_entropy_backward(z, torch.full((B,), -100))
    with pytest.raises(TypeError, match="integer tensor"):
        cross_entropy_backward(z, torch.zeros(B))


# ---------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("eps", [1e-5, 0.3])
def test_layer_norm_backward_equals_autograd(eps):
    d = 9
    x = _randn(B, T, d, seed=12, scale=3.0, requires_grad=True)
    with torch.no_grad():
        x += 2.0
    gamma, beta = _randn(d, seed=13, requires_grad=True), _randn(d, seed=14, requires_grad=True)
    G = _randn(B, T, d, seed=15)
    auto = torch.autograd.grad(F.layer_norm(x, (d,), gamma, beta, eps), (x, gamma, beta), G)
    ours = layer_norm_backward(x.detach(), gamma.detach(), eps, G)
    for a, o in zip(auto, ours, strict=True):
        assert a.shape == o.shape and _max_err(a, o) < TOL
    assert ours[0].sum(-1).abs().max() < 1e-13  # orthogonal to 1


def test_layer_norm_backward_symbolic_d3():
    xs = sp.Matrix(sp.symbols("x0:3", real=True))
    gam = sp.Matrix(sp.symbols("c0:3", real=True))
    eps = sp.Rational(1, 10)
    mu = sum(xs) / 3
    s = sp.sqrt(sum((xi - mu) ** 2 for xi in xs) / 3 + eps)
    y = gam.multiply_elementwise((xs - mu * sp.ones(3, 1)) / s)
    J = y.jacobian(xs)
    vals = {xs[0]: 0.3, xs[1]: -1.2, xs[2]: 2.0, gam[0]: 1.5, gam[1]: -0.5, gam[2]: 0.8}
    G = torch.tensor([0.7, -0.1, 0.4], dtype=F64)
    J_num = torch.tensor(J.subs(vals).evalf().tolist(), dtype=F64)
    ours, _, _ = layer_norm_backward(torch.tensor([0.3, -1.2, 2.0], dtype=F64),
                                     torch.tensor([1.5, -0.5, 0.8], dtype=F64), 0.1, G)
    assert _max_err(J_num.T @ G, ours) < 1e-14


def test_layer_norm_backward_errors():
    x = torch.zeros(B, 6, dtype=F64)
    with pytest.raises(ValueError, match=r"gamma must have shape \(6,\)"):
        layer_norm_backward(x, torch.ones(5, dtype=F64), 1e-5, x)
    with pytest.raises(ValueError, match="same shape"):
        layer_norm_backward(x, torch.ones(6, dtype=F64), 1e-5, torch.zeros(B, 7, dtype=F64))
    with pytest.raises(ValueError, match="eps must be a positive"):
        layer_norm_backward(x, torch.ones(6, dtype=F64), 0.0, x)


# ---------------------------------------------------------------- GELU


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_equals_autograd(approximate):
    x = _randn(B, T, D_IN, seed=16, scale=3.0, requires_grad=True)
    G = _randn(B, T, D_IN, seed=17)
    (auto,) = torch.autograd.grad(F.gelu(x, approximate=approximate), x, G)
    assert _max_err(auto, gelu_backward(x.detach(), G, approximate)) < TOL


def test_gelu_backward_worked_values_and_errors():
    x = torch.tensor([0.0, 1.0], dtype=F64)
    out = gelu_backward(x, torch.ones(2, dtype=F64))
    phi1 = math.exp(-0.5) / math.sqrt(2 * math.pi)
    assert abs(out[0].item() - 0.5) < 1e-16  # Phi(0) + 0
    assert abs(out[1].item() - (0.5 * (1 + math.erf(1 / math.sqrt(2))) + phi1)) < 1e-15
    with pytest.raises(ValueError, match="approximate must be"):
        gelu_backward(x, x, "fast")
    with pytest.raises(ValueError, match="same shape"):
        gelu_backward(x, torch.ones(3, dtype=F64))


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("lead", [(), (B,), (B, 2)])
def test_attention_backward_equals_autograd(is_causal, scale, lead):
    T_q, T_k, d_k, d_v = 5, 6, 7, 4
    q = _randn(*lead, T_q, d_k, seed=18, requires_grad=True)
    k = _randn(*lead, T_k, d_k, seed=19, requires_grad=True)
    v = _randn(*lead, T_k, d_v, seed=20, requires_grad=True)
    dO = _randn(*lead, T_q, d_v, seed=21)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    auto = torch.autograd.grad(out, (q, k, v), dO)
    ours = attention_backward(q.detach(), k.detach(), v.detach(), dO, is_causal=is_causal,
                              scale=scale)
    for a, o in zip(auto, ours, strict=True):
        assert a.shape == o.shape and _max_err(a, o) < TOL


def test_attention_backward_causal_blocks_the_future():
    T_, d = 6, 3
    q, k, v = _randn(T_, d, seed=22), _randn(T_, d, seed=23), _randn(T_, d, seed=24)
    dO = torch.zeros(T_, d, dtype=F64)
    dO[2] = 1.0  # only query 2's output matters: keys 3.. must get no gradient
    dq, dk, dv = attention_backward(q, k, v, dO, is_causal=True)
    assert torch.equal(dk[3:], torch.zeros(3, d, dtype=F64))
    assert torch.equal(dv[3:], torch.zeros(3, d, dtype=F64))
    assert torch.equal(dq[[0, 1, 3, 4, 5]], torch.zeros(5, d, dtype=F64))
    assert dv[:3].abs().min() > 0


def test_attention_backward_errors():
    q, k, v = torch.zeros(5, 4), torch.zeros(6, 4), torch.zeros(6, 3)
    with pytest.raises(ValueError, match=r"grad_out must have the output's shape \(5, 3\)"):
        attention_backward(q, k, v, torch.zeros(5, 4))
    with pytest.raises(ValueError, match="equal leading dimensions"):
        attention_backward(q, torch.zeros(6, 5), v, torch.zeros(5, 3))
    with pytest.raises(ValueError, match="equal leading dimensions"):
        attention_backward(torch.zeros(2, 5, 4), torch.zeros(3, 6, 4), torch.zeros(3, 6, 3),
                           torch.zeros(2, 5, 3))
    with pytest.raises(ValueError, match="at least 2 dimension"):
        attention_backward(torch.zeros(4), k, v, torch.zeros(5, 3))
