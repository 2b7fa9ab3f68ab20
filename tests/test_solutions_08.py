"""The exercise solutions of notebooks/08_backpropagation hold."""

import math

import numpy as np
import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.training.autograd import MLP, Value, mse_loss
from llmbook.transformer.layers import RMSNorm

solutions = load_solutions("08_backpropagation")

F64 = torch.float64


@pytest.mark.parametrize("x", [-800.0, -3.0, 0.0, 2.0, 800.0])
def test_exercise_1_softplus(x):
    v = Value(x)
    out = solutions.softplus(v)
    out.backward()
    expected = max(x, 0.0) + math.log1p(math.exp(-abs(x)))
    assert abs(out.data - expected) < 1e-15 * max(1.0, abs(x))
    sigma = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
    assert abs(v.grad - sigma) < 1e-15
    with pytest.raises(OverflowError):  # the naive formula overflows
        (1 + Value(800.0).exp()).log()


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_exercise_2_rms_norm_backward(eps):
    g = torch.Generator().manual_seed(0)
    x = (2 * torch.randn(3, 5, 7, generator=g, dtype=F64) + 1).requires_grad_()
    norm = RMSNorm(7, eps=eps, dtype=F64)
    with torch.no_grad():
        norm.weight.normal_(generator=g)
    G = torch.randn(3, 5, 7, generator=g, dtype=F64)
    gx, gw = torch.autograd.grad(norm(x), (x, norm.weight), G)
    ours_x, ours_w = solutions.rms_norm_backward(x.detach(), norm.weight.detach(), eps, G)
    assert (gx - ours_x).abs().max() < 1e-10
    assert (gw - ours_w).abs().max() < 1e-10
    # the gradient along x itself is damped by eps / r^2 (chapter 6's eigenvalue)
    xd = x.detach()
    r2 = xd.pow(2).mean(-1) + eps
    along = (ours_x * xd).sum(-1)
    w_g = (norm.weight.detach() * G * xd).sum(-1)
    assert torch.allclose(along, w_g * eps / r2.pow(1.5), atol=1e-12)


def test_exercise_3_five_point_stencil():
    cs = solutions.five_point_coefficients()
    assert cs == [sp.Rational(1, 12), sp.Rational(-2, 3), 0, sp.Rational(2, 3), sp.Rational(-1, 12)]
    assert solutions.five_point_truncation_constant() == sp.Rational(1, 30)
    eps_star, err_star = solutions.predicted_five_point_optimum(2.0**-53)
    assert 8e-4 < eps_star < 1.3e-3 and 1e-13 < err_star < 5e-13
    best_eps, best_err = solutions.measured_five_point_optimum(np.logspace(-6, -1, 41))
    assert 0.25 < best_eps / eps_star < 4
    assert best_err < 1e-12  # better than the central difference's ~6e-12
    # truncation dominates at large eps: error ~ eps^4 / 30
    x = torch.tensor([1.0], dtype=F64)
    err = (solutions.five_point_derivative(torch.exp, x, 0.05) - x.exp()).abs() / x.exp()
    assert abs(err.item() / (0.05**4 / 30) - 1) < 0.01


def test_exercise_4_forward_mode_equals_reverse_mode():
    d = solutions.Dual(2.0, 1.0)
    f = (d * d + 3 * d - 1) / (d + 1) + d.tanh() * d.exp() - d**3
    t = 2.0
    df = ((2 * t + 3) * (t + 1) - (t * t + 3 * t - 1)) / (t + 1) ** 2 \
        + (1 - math.tanh(t) ** 2) * math.exp(t) + math.tanh(t) * math.exp(t) - 3 * t * t
    assert abs(f.tangent - df) < 1e-12
    mlp = MLP([3, 4, 4, 1], seed=0)
    g = torch.Generator().manual_seed(1)
    X = (torch.rand(6, 3, generator=g, dtype=F64) * 2 - 1).tolist()
    y = [math.sin(sum(r)) for r in X]
    loss = mse_loss([mlp(r)[0] for r in X], y)
    loss.backward()
    reverse = [p.grad for p in mlp.parameters()]
    forward, passes = solutions.forward_mode_gradient(mlp, X, y)
    assert passes == len(mlp.parameters()) == 41
    assert max(abs(a - b) for a, b in zip(forward, reverse, strict=True)) < 1e-12
    plain = solutions.mlp_mse([p.data for p in mlp.parameters()], mlp.sizes, X, y)
    assert abs(plain - loss.data) < 1e-14
