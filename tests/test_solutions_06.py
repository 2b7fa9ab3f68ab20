"""The exercise solutions of notebooks/06_norms_ffn hold."""


import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.transformer.layers import layer_norm_jacobian

solutions = load_solutions("06_norms_ffn")


def test_exercise_1_layer_norm_via_rms_norm():
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(3, 5, 8, generator=g) + 2  # B=3, T=5, d=8
    ref = torch.nn.LayerNorm(8)
    with torch.no_grad():
        ref.weight.normal_(generator=g)
        ref.bias.normal_(generator=g)
    ours = solutions.layer_norm_via_rms_norm(x, ref.weight.detach(), ref.bias.detach(), 1e-5)
    assert torch.allclose(ours, ref(x), rtol=0, atol=1e-6)
    no_bias = solutions.layer_norm_via_rms_norm(x, ref.weight.detach(), None, 1e-5)
    assert torch.allclose(no_bias, ref(x) - ref.bias, rtol=0, atol=1e-6)
    # and it is not RMSNorm of the raw input: the mean matters
    assert (ours - ref.weight * x / x.pow(2).mean(-1, keepdim=True).sqrt()).abs().max() > 0.1


@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_exercise_2_layer_norm_vjp_matches_autograd_and_matrix(eps):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, generator=g, dtype=torch.float64)
    b = torch.randn(7, generator=g, dtype=torch.float64)
    grad_out = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    y = torch.nn.functional.layer_norm(x, (7,), w, b, eps)
    (auto,) = torch.autograd.grad(y, x, grad_out)
    ours = solutions.layer_norm_vjp(x.detach(), w, grad_out, eps)
    assert torch.allclose(ours, auto, rtol=0, atol=1e-13)
    J = layer_norm_jacobian(x.detach(), w, eps)  # (2, 3, 7, 7)
    assert torch.allclose(
        ours, (J.transpose(-1, -2) @ grad_out.unsqueeze(-1)).squeeze(-1), atol=1e-13
    )
    assert ours.sum(-1).abs().max() < 1e-12  # no component along 1


def test_exercise_3_best_tanh_constant():
    published = solutions.tanh_gelu_max_error(0.044715)
    assert 4.70e-4 < published < 4.75e-4
    c = solutions.best_tanh_constant()
    assert abs(c - 0.04438) < 5e-5
    best = solutions.tanh_gelu_max_error(c)
    assert 3.8e-4 < best < 3.95e-4
    assert (
        best
        < published
        < solutions.tanh_gelu_max_error((4 - 3.141592653589793) / (6 * 3.141592653589793))
    )
    # a local minimum: nudging c either way makes it worse
    assert (
        solutions.tanh_gelu_max_error(c - 2e-4) > best
        and solutions.tanh_gelu_max_error(c + 2e-4) > best
    )


def test_exercise_4_rms_norm_spectrum_symbolic_and_numeric():
    J, lam_perp, lam_x = solutions.rms_norm_jacobian_spectrum(3)
    x = sp.Matrix(sorted(J.free_symbols - {sp.Symbol("epsilon", positive=True)}, key=str))
    assert len(x) == 3
    assert sp.simplify(J * x - lam_x * x) == sp.zeros(3, 1)
    for v in (sp.Matrix([x[1], -x[0], 0]), sp.Matrix([0, x[2], -x[1]])):  # both orthogonal to x
        assert sp.simplify(J * v - lam_perp * v) == sp.zeros(3, 1)
    eps = sp.Symbol("epsilon", positive=True)
    r2 = sum(xi**2 for xi in x) / 3 + eps
    assert sp.simplify(lam_perp / lam_x - r2 / eps) == 0
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(4, 6, generator=g, dtype=torch.float64)
    for eps_ in (1e-2, 1e-4):
        assert solutions.check_rms_norm_condition_number(xs, eps_) < 1e-8
    assert torch.allclose(
        solutions.rms_norm_jacobian_condition_number(xs, 1e-2), (xs.pow(2).mean(-1) + 1e-2) / 1e-2
    )
