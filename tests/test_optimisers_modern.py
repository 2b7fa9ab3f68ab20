"""Tests for llmbook.training.optimisers_modern: Muon, Adafactor and Lion against their peers."""

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from llmbook.training.optimisers_modern import (
    MUON_COEFFICIENTS,
    Adafactor,
    Lion,
    Muon,
    newton_schulz,
)

f64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def _race(make_ours, make_ref, shapes, steps=25, dtype=f64, seed=0):
    """Run both optimisers on the same gradients (noise + theta); max |diff| of the parameters."""
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(*s, dtype=dtype, generator=gen) for s in shapes]
    ours = [nn.Parameter(p.clone()) for p in start]
    ref = [nn.Parameter(p.clone()) for p in start]
    opt_ours, opt_ref = make_ours(ours), make_ref(ref)
    for _ in range(steps):
        for a, b in zip(ours, ref, strict=True):
            grad = torch.randn(a.shape, dtype=dtype, generator=gen) + a.detach()
            a.grad, b.grad = grad.clone(), grad.clone()
        opt_ours.step()
        opt_ref.step()
    moved = max((a - s).abs().max().item() for a, s in zip(ours, start, strict=True))
    assert moved > 1e-3  # the race was not run at lr = 0
    return max((a - b).abs().max().item() for a, b in zip(ours, ref, strict=True)), ours, opt_ours


# ---------------------------------------------------------------- Newton-Schulz


@pytest.mark.parametrize("shape", [(5, 9), (9, 5), (6, 6)])
def test_newton_schulz_is_the_polynomial_on_singular_values(shape):
    g = torch.randn(*shape, dtype=f64, generator=torch.Generator().manual_seed(3))
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    x = s / s.norm()  # ||G||_F = sqrt(sum s^2)
    a, b, c = MUON_COEFFICIENTS
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    out = newton_schulz(g, dtype=f64)
    assert out.shape == shape and out.dtype == f64
    torch.testing.assert_close(out, u @ torch.diag(x) @ vh, rtol=0, atol=1e-12)


def test_newton_schulz_cubic_converges_to_the_polar_factor():
    g = torch.randn(4, 7, dtype=f64, generator=torch.Generator().manual_seed(4))
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    out = newton_schulz(g, steps=60, coefficients=(1.5, -0.5, 0.0), dtype=f64)
    torch.testing.assert_close(out, u @ vh, rtol=0, atol=1e-10)


def test_newton_schulz_worked_example():
    # diag(3, 4): ||G||_F = 5, one cubic step maps 0.6 -> 0.9 - 0.108 = 0.792, 0.8 -> 1.2 - 0.256 = 0.944
    out = newton_schulz(torch.diag(torch.tensor([3.0, 4.0], dtype=f64)), 1, (1.5, -0.5, 0.0), dtype=f64)
    torch.testing.assert_close(out, torch.diag(torch.tensor([0.792, 0.944], dtype=f64)), rtol=0, atol=1e-15)


def test_newton_schulz_bad_input():
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.ones(3))
    with pytest.raises(ValueError, match="steps"):
        newton_schulz(torch.ones(2, 2), steps=-1)
    with pytest.raises(ValueError, match="coefficients"):
        newton_schulz(torch.ones(2, 2), coefficients=(1.0, 2.0))


# ---------------------------------------------------------------- Muon


@pytest.mark.parametrize("dtype", [f64, torch.float32])
@pytest.mark.parametrize("kwargs", [{}, {"nesterov": False, "adjust_lr_fn": "match_rms_adamw", "momentum": 0.9},
                                    {"weight_decay": 0.0, "ns_steps": 3}])
def test_muon_equals_torch_step_for_step(dtype, kwargs):
    diff, _, _ = _race(lambda p: Muon(p, lr=0.02, **kwargs), lambda p: torch.optim.Muon(p, lr=0.02, **kwargs),
                       [(7, 12), (12, 5)], dtype=dtype)
    assert diff == 0.0


def test_muon_update_is_orthogonal_in_float64():
    # one step from B = 0, no decay, momentum 0 with the cubic run long: W moves by -lr U V^T
    w0 = torch.randn(6, 4, dtype=f64, generator=torch.Generator().manual_seed(5))
    w = nn.Parameter(w0.clone())
    opt = Muon([w], lr=0.1, momentum=0.0, weight_decay=0.0, ns_coefficients=(1.5, -0.5, 0.0), ns_steps=60,
               ns_dtype=f64)
    w.grad = torch.randn(6, 4, dtype=f64, generator=torch.Generator().manual_seed(6))
    u, _, vh = torch.linalg.svd(w.grad, full_matrices=False)
    opt.step()
    torch.testing.assert_close(w.detach(), w0 - 0.1 * (6 / 4) ** 0.5 * u @ vh, rtol=0, atol=1e-10)
    assert list(opt.state[w]) == ["momentum_buffer"]


def test_muon_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        Muon([nn.Parameter(torch.ones(3))])
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon([nn.Parameter(torch.ones(2, 3))], adjust_lr_fn="nope")
    with pytest.raises(ValueError, match="momentum"):
        Muon([nn.Parameter(torch.ones(2, 3))], momentum=1.0)
    with pytest.raises(ValueError, match="lr"):
        Muon([nn.Parameter(torch.ones(2, 3))], lr=-1.0)


# ---------------------------------------------------------------- Adafactor


@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1, "lr": 0.05}, {"eps": (1e-20, 1e-2), "d": 2.0},
                                    {"beta2_decay": -0.5}])
def test_adafactor_equals_torch_step_for_step(kwargs):
    diff, params, opt = _race(lambda p: Adafactor(p, **kwargs), lambda p: torch.optim.Adafactor(p, **kwargs),
                              [(7, 12), (12, 5), (9,), (2, 3, 4)])
    assert diff == 0.0
    # factored state: n + m numbers for an (n, m) matrix, the full vector for a vector
    assert opt.state[params[0]]["row_var"].shape == (7, 1) and opt.state[params[0]]["col_var"].shape == (1, 12)
    assert opt.state[params[2]]["variance"].shape == (9,)
    assert opt.state[params[3]]["row_var"].shape == (2, 3, 1) and opt.state[params[3]]["col_var"].shape == (2, 1, 4)


def test_adafactor_first_step_worked_example():
    # t = 1: beta2_1 = 0, so V = R C / mean(R) from G alone; for a rank-one G^2 that is G^2 exactly,
    # U = sign(G), RMS(U) = 1, alpha = max(1e-3, RMS(X)) * min(lr, 1) = RMS(X) * lr
    x0 = torch.tensor([[1.0, -2.0, 2.0], [3.0, 0.5, -1.0]], dtype=f64)
    x = nn.Parameter(x0.clone())
    x.grad = torch.tensor([[1.0, -2.0, 4.0], [-0.5, 1.0, -2.0]], dtype=f64)  # rows proportional
    Adafactor([x], lr=0.01).step()
    rms = (x0.square().mean()) ** 0.5
    torch.testing.assert_close(x.detach(), x0 - 0.01 * rms * x.grad.sign(), rtol=0, atol=1e-15)


def test_adafactor_bad_input():
    p = [nn.Parameter(torch.ones(2, 3))]
    with pytest.raises(ValueError, match="beta2_decay"):
        Adafactor(p, beta2_decay=0.5)
    with pytest.raises(ValueError, match="d must"):
        Adafactor(p, d=0.5)
    with pytest.raises(ValueError, match="eps"):
        Adafactor(p, eps=1e-3)


# ---------------------------------------------------------------- Lion


def test_lion_matches_sympy_for_two_steps():
    th, m, g, eta, b1, b2, lam = sp.symbols("theta m g eta beta1 beta2 lambda", real=True)
    theta_next = th * (1 - eta * lam) - eta * sp.sign(b1 * m + (1 - b1) * g)
    m_next = b2 * m + (1 - b2) * g
    vals = {eta: 0.1, b1: 0.9, b2: 0.99, lam: 0.5}
    theta0 = [0.3, -1.2, 2.0, 0.7]
    grads = [[1.0, -0.2, 0.0, 3.0], [-0.5, 0.3, 2.0, -3.0]]  # step 1: c = 0 in coord 2; step 2: c < 0 < m in coord 0
    want_t, want_m = list(theta0), [0.0] * 4
    for gs in grads:
        for j in range(4):
            sub = vals | {th: want_t[j], m: want_m[j], g: gs[j]}
            want_t[j], want_m[j] = float(theta_next.subs(sub)), float(m_next.subs(sub))
    p = nn.Parameter(torch.tensor(theta0, dtype=f64))
    opt = Lion([p], lr=0.1, weight_decay=0.5)
    for gs in grads:
        p.grad = torch.tensor(gs, dtype=f64)
        opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor(want_t, dtype=f64), rtol=0, atol=1e-15)
    torch.testing.assert_close(opt.state[p]["exp_avg"], torch.tensor(want_m, dtype=f64), rtol=0, atol=1e-15)
    assert list(opt.state[p]) == ["exp_avg"]  # one state tensor, Adam's two


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.floats(1e-4, 1.0))
def test_lion_moves_every_coordinate_by_lr(n, m, lr):
    p0 = torch.randn(n, m, dtype=f64)
    p = nn.Parameter(p0.clone())
    opt = Lion([p], lr=lr)
    p.grad = torch.randn(n, m, dtype=f64) + 0.1  # nonzero almost surely
    opt.step()
    # theta - lr is rounded once: the difference is lr to within one ulp of |theta0| + lr
    err = ((p.detach() - p0).abs() - lr).abs()
    assert (err <= 2 * torch.finfo(f64).eps * (p0.abs() + lr)).all()


def test_lion_bad_input():
    p = [nn.Parameter(torch.ones(3))]
    with pytest.raises(ValueError, match="beta2"):
        Lion(p, betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="lr"):
        Lion(p, lr="fast")
