"""Checks of chapter 9's exercises (notebooks/09_optimisers), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's SGD, Adam and AdamW (:mod:`llmbook.training.optim`), PyTorch's
``torch.optim.RMSprop``, closed forms checked in SymPy, the cosine schedule summed step
by step, and matrices built with known singular values.
"""

from __future__ import annotations

import copy
import math

import sympy as sp
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.text.data import default_source
from llmbook.text.embedding import TokenEmbedding
from llmbook.training.optim import SGD, Adam, AdamW, cosine_schedule, set_lr
from llmbook.transformer.layers import MLP
from llmbook.workbench.checks import raises


def exercise_1_momentum_displacement(solutions) -> None:
    expr, (eta, mu, g, t) = solutions.momentum_displacement_symbolic()
    closed = -eta * g / (1 - mu) * (t - mu * (1 - mu**t) / (1 - mu))
    residual = sp.simplify(expr - closed)
    assert residual == 0, (
        f"expected the displacement -eta g / (1 - mu) (t - mu (1 - mu^t) / (1 - mu)), "
        f"off by {residual}")
    grad = torch.tensor([0.7, -1.3], dtype=torch.float64)
    for mu_, steps in [(0.0, 7), (0.5, 13), (0.9, 40), (0.99, 25)]:
        theta = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        opt = SGD([theta], lr=0.03, momentum=mu_)
        for _ in range(steps):
            theta.grad = grad.clone()
            opt.step()
        want = solutions.momentum_displacement(0.03, mu_, grad, steps)
        got = theta.detach()
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-15), (
            f"mu={mu_}, {steps} steps: expected momentum_displacement to equal where SGD with "
            f"momentum went, {got.tolist()}, got {want.tolist()}")
        symbolic = float(expr.subs({eta: 0.03, mu: mu_, g: 0.7, t: steps}))
        assert abs(symbolic - want[0].item()) < 1e-12, (
            f"mu={mu_}, {steps} steps: the symbolic displacement {symbolic!r} and the numeric "
            f"one {want[0].item()!r} differ")
    # the lag: for large t the walker is mu / (1 - mu) full-speed steps behind
    lost = solutions.momentum_steps_lost(0.9)
    assert math.isclose(lost, 9.0, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected momentum_steps_lost(0.9) = 9, got {lost!r}")
    lag = 5000 - solutions.momentum_displacement(1.0, 0.9, 1.0, 5000) / (-1.0 / (1 - 0.9))
    assert math.isclose(lag, 9.0, rel_tol=1e-9, abs_tol=1e-12), (
        f"expected the walker 9 full-speed steps behind after 5000 steps at mu=0.9, got {lag!r}")
    with raises(ValueError, match="mu=1", what="momentum_displacement(0.1, 1, 1.0, 3)"):
        solutions.momentum_displacement(0.1, 1, 1.0, 3)


def exercise_2_rmsprop_equals_torch(solutions) -> None:
    V, d, B, T = 16, 8, 6, 5
    torch.manual_seed(0)
    base = nn.ModuleDict({"emb": TokenEmbedding(V, d), "mlp": MLP(d, 20)})
    tokens = default_source().sample(2000, seed=3)
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(tokens) - T - 1, (50, B), generator=g)
    windows = tokens[starts[..., None] + torch.arange(T + 1)]  # (50, B, T + 1)

    def run(model: nn.ModuleDict, opt: torch.optim.Optimizer) -> nn.ModuleDict:
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
    diff = max((p - q).abs().max().item()
               for p, q in zip(m_ours.parameters(), m_ref.parameters(), strict=True))
    moved = max((p - q).abs().max().item()
                for p, q in zip(m_ours.parameters(), base.parameters(), strict=True))
    assert diff <= 1e-6 and moved > 1e-2, (
        f"expected 50 steps of RMSprop to match torch.optim.RMSprop to 1e-6 (largest difference "
        f"{diff:.3g}) and to move the parameters by more than 1e-2 (moved {moved:.3g})")
    with raises(ValueError, match="alpha=1.0", what="RMSprop(..., alpha=1.0)"):
        solutions.RMSprop(base.parameters(), alpha=1.0)
    with raises(ValueError, match="lr=-1", what="RMSprop(..., lr=-1)"):
        solutions.RMSprop(base.parameters(), lr=-1)


def exercise_3_schedule_area_and_total_decay(solutions) -> None:
    area, (eta_max, eta_min, W, N) = solutions.schedule_area_symbolic()
    residual = sp.simplify(area - (eta_max * W / 2 + (eta_max + eta_min) * (N - W) / 2))
    assert residual == 0, (
        f"expected the area eta_max W / 2 + (eta_max + eta_min) (N - W) / 2, off by {residual}")
    numeric = solutions.schedule_area(6e-4, 6e-5, 100, 1000)
    symbolic = float(area.subs({eta_max: 6e-4, eta_min: 6e-5, W: 100, N: 1000}))
    assert math.isclose(symbolic, numeric, rel_tol=1e-14, abs_tol=1e-12), (
        f"expected schedule_area(6e-4, 6e-5, 100, 1000) = the symbolic area {symbolic!r}, "
        f"got {numeric!r}")
    # the sum over integer steps is close to the integral
    steps_sum = sum(cosine_schedule(s, 6e-4, 6e-5, 100, 1000) for s in range(1000))
    assert math.isclose(steps_sum, numeric, rel_tol=1e-3, abs_tol=1e-12), (
        f"expected the area within 0.1% of the schedule summed over its 1000 steps, "
        f"{steps_sum!r}, got {numeric!r}")
    exact = solutions.adamw_shrink_exact(6e-4, 6e-5, 100, 1000, 0.1)
    approx = solutions.adamw_shrink_factor(6e-4, 6e-5, 100, 1000, 0.1)
    assert abs(approx - exact) / exact < 1e-5 and 0.96 < exact < 0.97, (
        f"expected an exact shrink factor between 0.96 and 0.97 and the approximation within "
        f"1e-5 of it (relative), got exact {exact!r}, approximate {approx!r}")
    # AdamW on zero gradients under the schedule realises the exact product
    theta = nn.Parameter(torch.tensor([2.0, -0.5], dtype=torch.float64))
    opt = AdamW([theta], lr=1.0, weight_decay=0.1)
    for s in range(1000):
        set_lr(opt, cosine_schedule(s, 6e-4, 6e-5, 100, 1000))
        theta.grad = torch.zeros(2, dtype=torch.float64)
        opt.step()
    got = theta.detach()
    assert torch.allclose(got, torch.tensor([2.0, -0.5], dtype=torch.float64) * exact,
                          rtol=1e-12, atol=0), (
        f"expected AdamW on zero gradients to scale (2, -0.5) by the exact factor {exact!r}, "
        f"got {got.tolist()}")


def exercise_4_adam_step_bound(solutions) -> None:
    first = solutions.adam_step_bound(1)
    assert math.isclose(first, 1.0, rel_tol=1e-14, abs_tol=1e-12), (
        f"expected adam_step_bound(1) = 1, got {first!r}")
    late, limit = solutions.adam_step_bound(20_000), solutions.adam_step_bound_limit()
    assert math.isclose(late, limit, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected adam_step_bound(20_000) within 1e-6 of the limit {limit!r}, got {late!r}")
    assert abs(limit - 7.2703) <= 1e-4, f"expected adam_step_bound_limit() = 7.2703, got {limit!r}"
    with raises(ValueError, match="beta1=0.99", what="adam_step_bound_limit(0.99, 0.9)"):
        solutions.adam_step_bound_limit(0.99, 0.9)
    # Adam (eps = 0, lr = 1) attains the bound at step t on the extremal sequence ...
    t = 300
    theta = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = Adam([theta], lr=1.0, eps=0.0)
    before = theta.detach().clone()
    for gi in solutions.adam_extremal_gradients(t):
        before = theta.detach().clone()
        theta.grad = gi.reshape(1).clone()
        opt.step()
    step_t = (before - theta.detach()).abs().item()
    bound = solutions.adam_step_bound(t)
    assert math.isclose(step_t, bound, rel_tol=1e-12, abs_tol=1e-12), (
        f"expected Adam's step {t} on the extremal gradients to equal the bound {bound!r}, "
        f"got {step_t!r}")
    assert step_t > 3.0, (  # far more than lr (the bound is 1.30 at t = 30, 3.70 at t = 300)
        f"expected the extremal step at t = 300 above 3 (the bound is 3.70), got {step_t!r}")
    t = 60
    # ... and never exceeds it on random sequences (including heavy-tailed ones)
    g = torch.Generator().manual_seed(0)
    grads: Tensor = torch.randn(200, t, generator=g, dtype=torch.float64) * torch.exp(
        3 * torch.randn(200, t, generator=g, dtype=torch.float64))  # (200 runs, t steps)
    thetas = nn.Parameter(torch.zeros(200, dtype=torch.float64))
    opt = Adam([thetas], lr=1.0, eps=0.0)
    largest = 0.0
    for s in range(t):
        before = thetas.detach().clone()
        thetas.grad = grads[:, s].clone()
        opt.step()
        largest = max(largest,
                      ((before - thetas.detach()).abs() / solutions.adam_step_bound(s + 1)).max().item())
    assert largest <= 1 + 1e-12, (
        f"expected no step of 200 random runs above the bound, got one at {largest!r} times it")
    assert math.isfinite(largest) and largest > 0.5, (
        f"expected the largest step / bound ratio finite and above 0.5, got {largest!r}")


def _matrix_with_singular_values(s: list[float], n: int = 9, m: int = 6, seed: int = 0) -> Tensor:
    """An (n, m) float64 matrix whose nonzero singular values are ``s``."""
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, len(s), dtype=torch.float64, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(m, len(s), dtype=torch.float64, generator=gen))
    return u @ torch.diag(torch.tensor(s, dtype=torch.float64)) @ v.T


def exercise_5_newton_schulz_steps(solutions) -> None:
    for kappa in (10.0, 1000.0):
        s = torch.logspace(0, -math.log10(kappa), 6, dtype=torch.float64).tolist()
        g = _matrix_with_singular_values(s)
        x = [v / math.sqrt(sum(w * w for w in s)) for v in s]
        tol = 1e-8
        k = max(solutions.cubic_steps_needed(v, tol) for v in x)
        slowest = solutions.cubic_steps_needed(min(x), tol)
        assert k == slowest, (  # the smallest value is the slowest
            f"kappa={kappa}: expected the smallest singular value to need the most steps, {k}, "
            f"got {slowest}")
        at_k, before_k = solutions.polar_error(g, k), solutions.polar_error(g, k - 1)
        assert at_k < tol <= before_k, (
            f"kappa={kappa}: expected polar_error below {tol} after {k} steps and not after "
            f"{k - 1}, got {at_k!r} and {before_k!r}")
        # the error after any k is the worst singular value's distance from 1
        for steps, coeffs in [(3, (1.5, -0.5, 0.0)), (5, (3.4445, -4.7750, 2.0315))]:
            want = max(abs(1 - solutions.scalar_newton_schulz(v, steps, coeffs)) for v in x)
            got = solutions.polar_error(g, steps, coeffs)
            assert abs(got - want) <= 1e-12, (
                f"kappa={kappa}, {steps} steps of {coeffs}: expected polar_error = the worst "
                f"scalar iterate's distance from 1, {want!r}, got {got!r}")
        # Muon's quintic after 5 steps is not U V^T: off by more than 0.1 in spectral norm
        quintic = solutions.polar_error(g, 5, (3.4445, -4.7750, 2.0315))
        assert quintic > 0.1, (
            f"kappa={kappa}: expected Muon's quintic after 5 steps more than 0.1 from U V^T, "
            f"got {quintic!r}")


def exercise_5_bad_input(solutions) -> None:
    with raises(ValueError, match="x must", what="cubic_steps_needed(0.0, 1e-3)"):
        solutions.cubic_steps_needed(0.0, 1e-3)
    with raises(ValueError, match="tol", what="cubic_steps_needed(0.5, 0.0)"):
        solutions.cubic_steps_needed(0.5, 0.0)
