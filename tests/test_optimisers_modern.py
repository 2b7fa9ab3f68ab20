"""Tests for llmbook.training.optimisers_modern: Muon, Adafactor and Lion against their peers,
and the two harnesses that compare optimisers."""

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from llmbook.training.optim import SGD, AdamW
from llmbook.training.optimisers_modern import (
    MUON_COEFFICIENTS,
    Adafactor,
    Lion,
    Muon,
    least_squares_run,
    newton_schulz,
    race_with_peer,
)

f64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def _race(make_ours, make_ref, shapes, steps=25, dtype=f64, seed=0):
    """race_with_peer, and a check that the race moved the parameters (not run at lr = 0)."""
    race = race_with_peer(make_ours, make_ref, shapes, steps=steps, seed=seed, dtype=dtype)
    assert race.max_move > 1e-3
    return race.max_abs_diff, race.params, race.optimizer


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


# ---------------------------------------------------------------- the harnesses


def test_race_with_peer_worked_example():
    # one step of SGD at lr 0.5 against SGD at lr 0.25 on a (2, 3) and a (1,) tensor: the same
    # start theta_0 and gradient g = n + theta_0 (drawn in that order from one generator), so
    # the parameters end 0.25 |g| apart and ours moved 0.5 |g|
    gen = torch.Generator().manual_seed(7)
    theta0 = [torch.randn(2, 3, dtype=f64, generator=gen), torch.randn(1, dtype=f64, generator=gen)]
    grads = [torch.randn(t.shape, dtype=f64, generator=gen) + t for t in theta0]
    g_max = max(g.abs().max().item() for g in grads)
    race = race_with_peer(lambda p: SGD(p, lr=0.5), lambda p: SGD(p, lr=0.25), [(2, 3), (1,)], steps=1, seed=7)
    assert race.max_abs_diff == pytest.approx(0.25 * g_max, rel=1e-15)
    assert race.max_move == pytest.approx(0.5 * g_max, rel=1e-15)
    torch.testing.assert_close(race.params[0].detach(), theta0[0] - 0.5 * grads[0], rtol=0, atol=1e-15)
    assert isinstance(race.optimizer, SGD)


def test_race_with_peer_equal_optimisers_and_the_chapters_muon_race():
    # the race of chapter 9: Muon against torch.optim.Muon, 20 steps, 7 x 12 and 12 x 5 in float64
    race = race_with_peer(lambda p: Muon(p, lr=0.02), lambda p: torch.optim.Muon(p, lr=0.02), [(7, 12), (12, 5)])
    assert race.max_abs_diff == 0.0 and race.max_move > 0.1
    # and a race that must find a difference: AdamW against torch's Adam (no decoupled decay)
    race = race_with_peer(lambda p: AdamW(p, lr=0.01, weight_decay=0.5), lambda p: torch.optim.Adam(p, lr=0.01),
                          [(3, 5)], steps=3)
    assert race.max_abs_diff > 1e-4


def test_race_with_peer_bad_input():
    make = lambda p: SGD(p, lr=0.1)  # noqa: E731
    with pytest.raises(TypeError, match="make_ours"):
        race_with_peer("SGD", make, [(2, 3)])
    with pytest.raises(ValueError, match="shapes"):
        race_with_peer(make, make, [])
    with pytest.raises(ValueError, match="shapes"):
        race_with_peer(make, make, [(2, 0)])
    with pytest.raises(ValueError, match="steps"):
        race_with_peer(make, make, [(2, 3)], steps=0)
    with pytest.raises(TypeError, match="dtype"):
        race_with_peer(make, make, [(2, 3)], dtype=torch.int64)


def test_least_squares_run_worked_example():
    # W is 1 x 1, X = [[1, 1]], Y = [[2, 2]] (N = 2): L(w) = (w - 2)^2 / 2 and dL/dw = w - 2.
    # SGD at a constant rate 1/2 (no warmup, no decay): w = 0, 1, 3/2, 7/4; L = 2, 1/2, 1/8
    losses = least_squares_run(lambda p, lr: SGD(p, lr=lr), 0.5, torch.tensor([[1.0, 1.0]], dtype=f64),
                               torch.tensor([[2.0, 2.0]], dtype=f64), torch.zeros(1, 1, dtype=f64), 3,
                               warmup_steps=0, decay_steps=0)
    assert losses.dtype == f64 and losses.tolist() == [2.0, 0.5, 0.125]


def test_least_squares_run_equals_an_autograd_loop_with_torch_optim():
    # independent of the hand-written gradient and of wsd_schedule: autograd, torch.optim.AdamW
    # and the rates written out by hand (warmup 3, plateau to step 6, linear decay over 4 to 0.01)
    gen = torch.Generator().manual_seed(2)
    x, w_true, w0 = (torch.randn(*s, dtype=f64, generator=gen) for s in ((5, 11), (3, 5), (3, 5)))
    y = w_true @ x
    got = least_squares_run(lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.0), 0.1, x, y, w0, 10,
                            warmup_steps=3, decay_steps=4, min_lr=0.01)
    rates = [0.0, 0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.1, 0.1 - 0.09 / 4, 0.1 - 0.09 / 2, 0.1 - 0.09 * 3 / 4]
    w = nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([w], lr=0.1, weight_decay=0.0)
    want = []
    for rate in rates:
        opt.param_groups[0]["lr"] = rate
        opt.zero_grad()
        loss = 0.5 * (w @ x - y).square().sum() / x.shape[1]
        loss.backward()
        opt.step()
        want.append(loss.item())
    torch.testing.assert_close(got, torch.tensor(want, dtype=f64), rtol=1e-12, atol=0)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(2, 9), st.floats(0.05, 0.95), st.integers(0, 2**31 - 1))
def test_least_squares_run_gradient_descent_below_the_stability_limit_never_goes_up(d_out, d_in, n, frac, seed):
    # gradient descent on a convex quadratic with rate < 2 / lambda_max of its Hessian X X^T / N
    # decreases the loss at every step; the WSD rate never exceeds its peak
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(d_in, n, dtype=f64, generator=gen)
    y, w0 = torch.randn(d_out, n, dtype=f64, generator=gen), torch.randn(d_out, d_in, dtype=f64, generator=gen)
    lam_max = torch.linalg.eigvalsh(x @ x.T / n).max().item()
    losses = least_squares_run(lambda p, lr: SGD(p, lr=lr), frac * 2 / lam_max, x, y, w0, 12,
                               warmup_steps=2, decay_steps=3)
    assert (losses.diff() <= 1e-12 * losses[0]).all()


def test_least_squares_run_bad_input():
    x, y, w0 = torch.ones(4, 6), torch.ones(3, 6), torch.zeros(3, 4)
    make = lambda p, lr: SGD(p, lr=lr)  # noqa: E731
    with pytest.raises(ValueError, match="start"):
        least_squares_run(make, 0.1, x, y, torch.zeros(4, 3), 100)
    with pytest.raises(ValueError, match="inputs"):
        least_squares_run(make, 0.1, torch.ones(4), y, w0, 100)
    with pytest.raises(ValueError, match="steps"):
        least_squares_run(make, 0.1, x, y, w0, 0)
    with pytest.raises(ValueError, match="total_steps"):  # warmup 20 + decay 60 do not fit in 50 steps
        least_squares_run(make, 0.1, x, y, w0, 50)
    with pytest.raises(ValueError, match="lr"):
        least_squares_run(make, -0.1, x, y, w0, 100)
    with pytest.raises(TypeError, match="make"):
        least_squares_run(None, 0.1, x, y, w0, 100)


def test_muon_docstring_sum_and_code_average_give_the_same_update() -> None:
    """torch's Muon docstring keeps the momentum as a sum (B <- mu B + G, Nesterov G + mu B);
    its code, and ours, keep the average. Newton-Schulz normalises its input, so the updates
    agree (to float64 round-off, eps = 1e-7 aside) step after step."""
    from llmbook.training.optimisers_modern import newton_schulz

    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(4)]
    mu = 0.95
    b_sum = torch.zeros(5, 3, dtype=torch.float64)
    b_avg = torch.zeros(5, 3, dtype=torch.float64)
    for grad in grads:
        b_sum = mu * b_sum + grad
        b_avg = b_avg.lerp(grad, 1 - mu)
        o_sum = newton_schulz(grad + mu * b_sum, eps=0.0, dtype=torch.float64)
        o_avg = newton_schulz(grad.lerp(b_avg, mu), eps=0.0, dtype=torch.float64)
        assert torch.allclose(o_sum, o_avg, rtol=0, atol=1e-12)
        assert torch.allclose((1 - mu) * (grad + mu * b_sum), grad.lerp(b_avg, mu), rtol=0, atol=1e-14)
