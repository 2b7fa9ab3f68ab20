"""The exercise solutions of notebooks/09_optimisers hold."""

import copy
import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from solution_loader import load_solutions
from torch import nn

from llmbook.text.data import default_source
from llmbook.text.embedding import TokenEmbedding
from llmbook.training.optim import SGD, Adam, AdamW, cosine_schedule, set_lr
from llmbook.transformer.layers import MLP

solutions = load_solutions("09_optimisers")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_momentum_displacement():
    expr, (eta, mu, g, t) = solutions.momentum_displacement_symbolic()
    closed = -eta * g / (1 - mu) * (t - mu * (1 - mu**t) / (1 - mu))
    assert sp.simplify(expr - closed) == 0
    grad = torch.tensor([0.7, -1.3], dtype=torch.float64)
    for mu_, steps in [(0.0, 7), (0.5, 13), (0.9, 40), (0.99, 25)]:
        theta = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        opt = SGD([theta], lr=0.03, momentum=mu_)
        for _ in range(steps):
            theta.grad = grad.clone()
            opt.step()
        want = solutions.momentum_displacement(0.03, mu_, grad, steps)
        assert torch.allclose(theta.detach(), want, rtol=1e-12, atol=1e-15)
        assert (
            abs(float(expr.subs({eta: 0.03, mu: mu_, g: 0.7, t: steps})) - want[0].item()) < 1e-12
        )
    # the lag: for large t the walker is mu / (1 - mu) full-speed steps behind
    assert solutions.momentum_steps_lost(0.9) == pytest.approx(9.0)
    lag = 5000 - solutions.momentum_displacement(1.0, 0.9, 1.0, 5000) / (-1.0 / (1 - 0.9))
    assert lag == pytest.approx(9.0, rel=1e-9)
    with pytest.raises(ValueError, match="mu=1"):
        solutions.momentum_displacement(0.1, 1, 1.0, 3)


def test_exercise_2_rmsprop_equals_torch():
    V, d, B, T = 16, 8, 6, 5
    torch.manual_seed(0)
    base = nn.ModuleDict({"emb": TokenEmbedding(V, d), "mlp": MLP(d, 20)})
    tokens = default_source().sample(2000, seed=3)
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(tokens) - T - 1, (50, B), generator=g)
    windows = tokens[starts[..., None] + torch.arange(T + 1)]  # (50, B, T + 1)

    def run(model, opt):
        for w in windows:
            opt.zero_grad()
            h = model["emb"](w[:, :-1])  # (B, T, d)
            logits = model["emb"].logits(h + model["mlp"](h))  # (B, T, V)
            F.cross_entropy(logits.reshape(-1, V), w[:, 1:].reshape(-1)).backward()
            opt.step()
        return model

    m_ours, m_ref = copy.deepcopy(base), copy.deepcopy(base)
    run(m_ours, solutions.RMSprop(m_ours.parameters(), lr=1e-2, alpha=0.95))
    run(m_ref, torch.optim.RMSprop(m_ref.parameters(), lr=1e-2, alpha=0.95))
    diff = max(
        (p - q).abs().max().item()
        for p, q in zip(m_ours.parameters(), m_ref.parameters(), strict=True)
    )
    moved = max(
        (p - q).abs().max().item()
        for p, q in zip(m_ours.parameters(), base.parameters(), strict=True)
    )
    assert diff <= 1e-6 and moved > 1e-2
    with pytest.raises(ValueError, match="alpha=1.0"):
        solutions.RMSprop(base.parameters(), alpha=1.0)
    with pytest.raises(ValueError, match="lr=-1"):
        solutions.RMSprop(base.parameters(), lr=-1)


def test_exercise_3_schedule_area_and_total_decay():
    area, (eta_max, eta_min, W, N) = solutions.schedule_area_symbolic()
    assert sp.simplify(area - (eta_max * W / 2 + (eta_max + eta_min) * (N - W) / 2)) == 0
    assert float(area.subs({eta_max: 6e-4, eta_min: 6e-5, W: 100, N: 1000})) == pytest.approx(
        solutions.schedule_area(6e-4, 6e-5, 100, 1000), rel=1e-14
    )
    # the sum over integer steps is close to the integral
    steps_sum = sum(cosine_schedule(s, 6e-4, 6e-5, 100, 1000) for s in range(1000))
    assert steps_sum == pytest.approx(solutions.schedule_area(6e-4, 6e-5, 100, 1000), rel=1e-3)
    exact = solutions.adamw_shrink_exact(6e-4, 6e-5, 100, 1000, 0.1)
    approx = solutions.adamw_shrink_factor(6e-4, 6e-5, 100, 1000, 0.1)
    assert abs(approx - exact) / exact < 1e-5 and 0.96 < exact < 0.97
    # AdamW on zero gradients under the schedule realises the exact product
    theta = nn.Parameter(torch.tensor([2.0, -0.5], dtype=torch.float64))
    opt = AdamW([theta], lr=1.0, weight_decay=0.1)
    for s in range(1000):
        set_lr(opt, cosine_schedule(s, 6e-4, 6e-5, 100, 1000))
        theta.grad = torch.zeros(2, dtype=torch.float64)
        opt.step()
    assert torch.allclose(
        theta.detach(), torch.tensor([2.0, -0.5], dtype=torch.float64) * exact, rtol=1e-12, atol=0
    )


def test_exercise_4_adam_step_bound():
    assert solutions.adam_step_bound(1) == pytest.approx(1.0, rel=1e-14)
    assert solutions.adam_step_bound(20_000) == pytest.approx(
        solutions.adam_step_bound_limit(), rel=1e-6
    )
    assert solutions.adam_step_bound_limit() == pytest.approx(7.2703, abs=1e-4)
    with pytest.raises(ValueError, match="beta1=0.99"):
        solutions.adam_step_bound_limit(0.99, 0.9)
    # Adam (eps = 0, lr = 1) attains the bound at step t on the extremal sequence ...
    t = 300
    theta = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = Adam([theta], lr=1.0, eps=0.0)
    for gi in solutions.adam_extremal_gradients(t):
        before = theta.detach().clone()
        theta.grad = gi.reshape(1).clone()
        opt.step()
    step_t = (before - theta.detach()).abs().item()
    assert step_t == pytest.approx(solutions.adam_step_bound(t), rel=1e-12)
    assert step_t > 3.0  # far more than lr (the bound is 1.30 at t = 30, 3.70 at t = 300)
    t = 60
    # ... and never exceeds it on random sequences (including heavy-tailed ones)
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(200, t, generator=g, dtype=torch.float64) * torch.exp(
        3 * torch.randn(200, t, generator=g, dtype=torch.float64)
    )  # (200 runs, t steps)
    thetas = nn.Parameter(torch.zeros(200, dtype=torch.float64))
    opt = Adam([thetas], lr=1.0, eps=0.0)
    largest = 0.0
    for s in range(t):
        before = thetas.detach().clone()
        thetas.grad = grads[:, s].clone()
        opt.step()
        largest = max(
            largest,
            ((before - thetas.detach()).abs() / solutions.adam_step_bound(s + 1)).max().item(),
        )
    assert largest <= 1 + 1e-12
    assert math.isfinite(largest) and largest > 0.5


def _matrix_with_singular_values(s, n=9, m=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, len(s), dtype=torch.float64, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(m, len(s), dtype=torch.float64, generator=gen))
    return u @ torch.diag(torch.tensor(s, dtype=torch.float64)) @ v.T


@pytest.mark.parametrize("kappa", [10.0, 1000.0])
def test_exercise_5_newton_schulz_steps(kappa):
    s = torch.logspace(0, -math.log10(kappa), 6, dtype=torch.float64).tolist()
    g = _matrix_with_singular_values(s)
    x = [v / math.sqrt(sum(w * w for w in s)) for v in s]
    tol = 1e-8
    k = max(solutions.cubic_steps_needed(v, tol) for v in x)
    assert k == solutions.cubic_steps_needed(min(x), tol)  # the smallest value is the slowest
    assert solutions.polar_error(g, k) < tol <= solutions.polar_error(g, k - 1)
    # the error after any k is the worst singular value's distance from 1
    for steps, coeffs in [(3, (1.5, -0.5, 0.0)), (5, (3.4445, -4.7750, 2.0315))]:
        want = max(abs(1 - solutions.scalar_newton_schulz(v, steps, coeffs)) for v in x)
        assert solutions.polar_error(g, steps, coeffs) == pytest.approx(want, abs=1e-12)
    # Muon's quintic after 5 steps is not U V^T: off by more than 0.1 in spectral norm
    assert solutions.polar_error(g, 5, (3.4445, -4.7750, 2.0315)) > 0.1


def test_exercise_5_bad_input():
    with pytest.raises(ValueError, match="x must"):
        solutions.cubic_steps_needed(0.0, 1e-3)
    with pytest.raises(ValueError, match="tol"):
        solutions.cubic_steps_needed(0.5, 0.0)
