"""Checks of chapter 8's exercises (notebooks/08_backpropagation), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are ``math.log1p`` and the logistic function, PyTorch's autograd through the book's
:class:`~llmbook.transformer.layers.RMSNorm`, SymPy's exact rationals, the exponential's
known derivative, and the reverse mode of :mod:`llmbook.training.autograd`.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
import torch

from llmbook.training.autograd import MLP, Value, mse_loss
from llmbook.transformer.layers import RMSNorm
from llmbook.workbench.checks import raises

F64 = torch.float64


def exercise_1_softplus(solutions) -> None:
    for x in (-800.0, -3.0, 0.0, 2.0, 800.0):
        v = Value(x)
        out = solutions.softplus(v)
        out.backward()
        expected = max(x, 0.0) + math.log1p(math.exp(-abs(x)))
        assert abs(out.data - expected) < 1e-15 * max(1.0, abs(x)), (
            f"expected softplus({x:g}) = {expected!r} (to 1e-15 relative), got {out.data!r}")
        sigma = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
        assert abs(v.grad - sigma) < 1e-15, (
            f"expected the gradient sigma({x:g}) = {sigma!r} (to 1e-15), got {v.grad!r}")
    with raises(OverflowError, what="the naive (1 + Value(800.0).exp()).log()"):  # the naive formula overflows
        (1 + Value(800.0).exp()).log()


def exercise_2_rms_norm_backward(solutions) -> None:
    for eps in (1e-6, 0.5):
        g = torch.Generator().manual_seed(0)
        x = (2 * torch.randn(3, 5, 7, generator=g, dtype=F64) + 1).requires_grad_()
        norm = RMSNorm(7, eps=eps, dtype=F64)
        with torch.no_grad():
            norm.weight.normal_(generator=g)
        G = torch.randn(3, 5, 7, generator=g, dtype=F64)
        gx, gw = torch.autograd.grad(norm(x), (x, norm.weight), G)
        ours_x, ours_w = solutions.rms_norm_backward(x.detach(), norm.weight.detach(), eps, G)
        error_x, error_w = (gx - ours_x).abs().max().item(), (gw - ours_w).abs().max().item()
        assert error_x < 1e-10, f"expected autograd's dL/dx at eps = {eps} to 1e-10, largest difference {error_x:.3g}"
        assert error_w < 1e-10, f"expected autograd's dL/dw at eps = {eps} to 1e-10, largest difference {error_w:.3g}"
        # the gradient along x itself is damped by eps / r^2 (chapter 6's eigenvalue)
        xd = x.detach()
        r2 = xd.pow(2).mean(-1) + eps
        along = (ours_x * xd).sum(-1)
        w_g = (norm.weight.detach() * G * xd).sum(-1)
        assert torch.allclose(along, w_g * eps / r2.pow(1.5), atol=1e-12), (
            f"expected the component along x to be damped by eps / r^2 at eps = {eps}")


def exercise_3_five_point_stencil(solutions) -> None:
    cs = solutions.five_point_coefficients()
    want = [sp.Rational(1, 12), sp.Rational(-2, 3), 0, sp.Rational(2, 3), sp.Rational(-1, 12)]
    assert cs == want, f"expected the coefficients {want}, got {cs!r}"
    constant = solutions.five_point_truncation_constant()
    assert constant == sp.Rational(1, 30), f"expected the truncation constant 1/30, got {constant!r}"
    eps_star, err_star = solutions.predicted_five_point_optimum(2.0**-53)
    assert 8e-4 < eps_star < 1.3e-3 and 1e-13 < err_star < 5e-13, (
        f"expected a predicted optimum eps* in (8e-4, 1.3e-3) with error in (1e-13, 5e-13), "
        f"got eps* = {eps_star!r}, error {err_star!r}")
    best_eps, best_err = solutions.measured_five_point_optimum(np.logspace(-6, -1, 41))
    assert 0.25 < best_eps / eps_star < 4, (
        f"expected the measured best eps within a factor 4 of the predicted {eps_star:.3g}, got {best_eps!r}")
    assert best_err < 1e-12, (  # better than the central difference's ~6e-12
        f"expected the measured best error below 1e-12 (the central difference's is ~6e-12), got {best_err!r}")
    # truncation dominates at large eps: error ~ eps^4 / 30
    x = torch.tensor([1.0], dtype=F64)
    err = (solutions.five_point_derivative(torch.exp, x, 0.05) - x.exp()).abs() / x.exp()
    ratio = err.item() / (0.05**4 / 30)
    assert abs(ratio - 1) < 0.01, (
        f"expected the error of exp' at 1 with eps = 0.05 to be eps^4 / 30 within 1 %, got {ratio:.4f} times it")


def exercise_4_forward_mode_equals_reverse_mode(solutions) -> None:
    d = solutions.Dual(2.0, 1.0)
    f = (d * d + 3 * d - 1) / (d + 1) + d.tanh() * d.exp() - d**3
    t = 2.0
    df = ((2 * t + 3) * (t + 1) - (t * t + 3 * t - 1)) / (t + 1) ** 2 \
        + (1 - math.tanh(t) ** 2) * math.exp(t) + math.tanh(t) * math.exp(t) - 3 * t * t
    assert abs(f.tangent - df) < 1e-12, (
        f"expected the tangent of f at 2 to be the derivative by hand, {df!r} (to 1e-12), got {f.tangent!r}")
    mlp = MLP([3, 4, 4, 1], seed=0)
    g = torch.Generator().manual_seed(1)
    X = (torch.rand(6, 3, generator=g, dtype=F64) * 2 - 1).tolist()
    y = [math.sin(sum(r)) for r in X]
    loss = mse_loss([mlp(r)[0] for r in X], y)
    loss.backward()
    reverse = [p.grad for p in mlp.parameters()]
    forward, passes = solutions.forward_mode_gradient(mlp, X, y)
    n_params = len(mlp.parameters())
    assert passes == n_params == 41, f"expected one forward pass per parameter, 41, got {passes!r}"
    error = max(abs(a - b) for a, b in zip(forward, reverse, strict=True))
    assert error < 1e-12, f"expected reverse mode's gradient to 1e-12, largest difference {error:.3g}"
    plain = solutions.mlp_mse([p.data for p in mlp.parameters()], mlp.sizes, X, y)
    assert abs(plain - loss.data) < 1e-14, f"expected the MLP's loss {loss.data!r} (to 1e-14), got {plain!r}"
