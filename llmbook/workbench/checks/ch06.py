"""Checks of chapter 6's exercises (notebooks/06_norms_ffn), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are ``torch.nn.LayerNorm`` and ``torch.nn.functional.layer_norm`` with autograd,
the book's explicit Jacobian (:func:`llmbook.transformer.layers.layer_norm_jacobian`),
the published GELU constant 0.044715 and SymPy.
"""

from __future__ import annotations

import sympy as sp
import torch

from llmbook.transformer.layers import layer_norm_jacobian


def exercise_1_layer_norm_via_rms_norm(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(3, 5, 8, generator=g) + 2  # B=3, T=5, d=8
    ref = torch.nn.LayerNorm(8)
    with torch.no_grad():
        ref.weight.normal_(generator=g)
        ref.bias.normal_(generator=g)
    ours = solutions.layer_norm_via_rms_norm(x, ref.weight.detach(), ref.bias.detach(), 1e-5)
    want = ref(x)
    error = (ours - want).abs().max().item()
    assert torch.allclose(ours, want, rtol=0, atol=1e-6), (
        f"expected torch.nn.LayerNorm's output (to 1e-6), largest difference {error:.3g}")
    no_bias = solutions.layer_norm_via_rms_norm(x, ref.weight.detach(), None, 1e-5)
    error = (no_bias - (want - ref.bias)).abs().max().item()
    assert torch.allclose(no_bias, want - ref.bias, rtol=0, atol=1e-6), (
        f"expected LayerNorm's output less its bias when bias is None (to 1e-6), largest difference {error:.3g}")
    # and it is not RMSNorm of the raw input: the mean matters
    gap = (ours - ref.weight * x / x.pow(2).mean(-1, keepdim=True).sqrt()).abs().max().item()
    assert gap > 0.1, f"expected the result to differ from RMSNorm of the raw input, got a gap of {gap:.3g}"


def exercise_2_layer_norm_vjp_matches_autograd_and_matrix(solutions) -> None:
    for eps in (1e-5, 0.5):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.randn(7, generator=g, dtype=torch.float64)
        b = torch.randn(7, generator=g, dtype=torch.float64)
        grad_out = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
        y = torch.nn.functional.layer_norm(x, (7,), w, b, eps)
        (auto,) = torch.autograd.grad(y, x, grad_out)
        ours = solutions.layer_norm_vjp(x.detach(), w, grad_out, eps)
        error = (ours - auto).abs().max().item()
        assert torch.allclose(ours, auto, rtol=0, atol=1e-13), (
            f"expected autograd's vector-Jacobian product at eps = {eps} (to 1e-13), largest difference {error:.3g}")
        J = layer_norm_jacobian(x.detach(), w, eps)  # (2, 3, 7, 7)
        through_matrix = (J.transpose(-1, -2) @ grad_out.unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(ours, through_matrix, atol=1e-13), (
            f"expected J^T grad_out with the explicit Jacobian at eps = {eps}")
        along_ones = ours.sum(-1).abs().max().item()
        assert along_ones < 1e-12, (  # no component along 1
            f"expected no component along the all-ones direction (sums below 1e-12), got {along_ones:.3g}")


def exercise_3_best_tanh_constant(solutions) -> None:
    published = solutions.tanh_gelu_max_error(0.044715)
    assert 4.70e-4 < published < 4.75e-4, (
        f"expected the published constant 0.044715 to be off by between 4.70e-4 and 4.75e-4, got {published!r}")
    c = solutions.best_tanh_constant()
    assert abs(c - 0.04438) < 5e-5, f"expected the best constant within 5e-5 of 0.04438, got {c!r}"
    best = solutions.tanh_gelu_max_error(c)
    assert 3.8e-4 < best < 3.95e-4, f"expected the best constant's error between 3.8e-4 and 3.95e-4, got {best!r}"
    series = solutions.tanh_gelu_max_error((4 - 3.141592653589793) / (6 * 3.141592653589793))
    assert best < published < series, (
        f"expected best < published < series constant's errors, got {best!r}, {published!r}, {series!r}")
    # a local minimum: nudging c either way makes it worse
    lower, higher = solutions.tanh_gelu_max_error(c - 2e-4), solutions.tanh_gelu_max_error(c + 2e-4)
    assert lower > best and higher > best, (
        f"expected c = {c!r} to be a local minimum: errors at c -/+ 2e-4 are {lower!r}, {higher!r} vs {best!r}")


def exercise_4_rms_norm_spectrum_symbolic_and_numeric(solutions) -> None:
    J, lam_perp, lam_x = solutions.rms_norm_jacobian_spectrum(3)
    x = sp.Matrix(sorted(J.free_symbols - {sp.Symbol("epsilon", positive=True)}, key=str))
    assert len(x) == 3, f"expected J in three symbols besides epsilon, got {sorted(map(str, J.free_symbols))}"
    residual = sp.simplify(J * x - lam_x * x)
    assert residual == sp.zeros(3, 1), (
        f"expected x to be an eigenvector with eigenvalue {lam_x}: J x - lam x = {residual}")
    for v in (sp.Matrix([x[1], -x[0], 0]), sp.Matrix([0, x[2], -x[1]])):  # both orthogonal to x
        residual = sp.simplify(J * v - lam_perp * v)
        assert residual == sp.zeros(3, 1), (
            f"expected {list(v)} (orthogonal to x) to have eigenvalue {lam_perp}: J v - lam v = {residual}")
    eps = sp.Symbol("epsilon", positive=True)
    r2 = sum(xi**2 for xi in x) / 3 + eps
    gap = sp.simplify(lam_perp / lam_x - r2 / eps)
    assert gap == 0, f"expected the eigenvalues' ratio r^2 / eps, got {sp.simplify(lam_perp / lam_x)}"
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(4, 6, generator=g, dtype=torch.float64)
    for eps_ in (1e-2, 1e-4):
        gap_ = solutions.check_rms_norm_condition_number(xs, eps_)
        assert gap_ < 1e-8, (
            f"expected r^2 / eps within 1e-8 relative of torch.linalg.cond at eps = {eps_}, got {gap_!r}")
    ours, want = solutions.rms_norm_jacobian_condition_number(xs, 1e-2), (xs.pow(2).mean(-1) + 1e-2) / 1e-2
    assert torch.allclose(ours, want), f"expected (mean(x^2) + eps) / eps = {want.tolist()}, got {ours.tolist()}"
