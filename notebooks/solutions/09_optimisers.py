"""Reference solutions to the exercises of notebooks/09_optimisers (checked by tests/test_solutions_09.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import sympy as sp
import torch
from torch import Tensor
from torch.optim import Optimizer

from llmbook.training.optim import cosine_schedule

# ---------------------------------------------------------------- exercise 1


def momentum_displacement_symbolic() -> tuple[sp.Expr, tuple[sp.Symbol, ...]]:
    """Exercise 1: theta_t - theta_0 for SGD with momentum mu and a constant gradient g.

    b_s = g (1 - mu^s) / (1 - mu), and theta moves by -eta b_s at step s, so
    theta_t - theta_0 = -eta g / (1 - mu) * sum_{s=1}^t (1 - mu^s)
                      = -eta g / (1 - mu) * (t - mu (1 - mu^t) / (1 - mu)).
    Returns the summed expression and its symbols (eta, mu, g, t).
    """
    eta, mu, g = sp.symbols("eta mu g", positive=True)
    t, s = sp.symbols("t s", integer=True, positive=True)
    total = sp.summation(eta * g * (1 - mu**s) / (1 - mu), (s, 1, t))
    total = sp.piecewise_fold(total)
    if isinstance(total, sp.Piecewise):  # keep the branch for mu != 1
        total = total.args[-1][0]
    return -total, (eta, mu, g, t)


def momentum_displacement(lr: float, mu: float, g: float | Tensor, t: int) -> float | Tensor:
    """Exercise 1: the closed form -lr g / (1 - mu) * (t - mu (1 - mu^t) / (1 - mu))."""
    if not 0 <= mu < 1:
        raise ValueError(f"mu must lie in [0, 1), got mu={mu}")
    return -lr * g / (1 - mu) * (t - mu * (1 - mu**t) / (1 - mu))


def momentum_steps_lost(mu: float) -> float:
    """Exercise 1: for large t the displacement is that of t - mu / (1 - mu) full-speed steps.

    Momentum starts from b = 0, so it trails a walker moving at lr g / (1 - mu) from the
    start by mu / (1 - mu) steps: 9 for mu = 0.9, 99 for mu = 0.99.
    """
    return mu / (1 - mu)


# ---------------------------------------------------------------- exercise 2


class RMSprop(Optimizer):
    """Exercise 2: RMSprop (Tieleman & Hinton, 2012), without momentum and not centred.

        v <- alpha v + (1 - alpha) g^2,   theta <- theta - lr g / (sqrt(v) + eps)

    No bias correction: v starts at 0, so the first steps are large,
    lr / sqrt(1 - alpha) = 10 lr for alpha = 0.99. State per parameter as
    ``torch.optim.RMSprop``: ``step`` and ``square_avg``.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
    ) -> None:
        for name, value in (("lr", lr), ("eps", eps)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {name}={value}")
        if not 0 <= alpha < 1:
            raise ValueError(f"alpha must lie in [0, 1), got alpha={alpha}")
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                v = state["square_avg"]
                v.mul_(alpha).addcmul_(p.grad, p.grad, value=1 - alpha)
                p.addcdiv_(p.grad, v.sqrt().add_(eps), value=-lr)
        return loss


# ---------------------------------------------------------------- exercise 3


def schedule_area_symbolic() -> tuple[sp.Expr, tuple[sp.Symbol, ...]]:
    """Exercise 3: int_0^N eta(s) ds for the warmup-cosine schedule, by SymPy.

    The warmup contributes a triangle eta_max W / 2; the cosine term integrates to zero over
    its half period, leaving the mean (eta_max + eta_min) / 2 times N - W.
    Returns the integral and its symbols (eta_max, eta_min, W, N).
    """
    s, W, N = sp.symbols("s W N", positive=True)
    eta_max, eta_min = sp.symbols("eta_max eta_min", positive=True)
    warm = sp.integrate(eta_max * s / W, (s, 0, W))
    decay = sp.integrate(
        eta_min + (eta_max - eta_min) / 2 * (1 + sp.cos(sp.pi * (s - W) / (N - W))), (s, W, N)
    )
    return sp.simplify(warm + decay), (eta_max, eta_min, W, N)


def schedule_area(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Exercise 3: max_lr W / 2 + (max_lr + min_lr) (N - W) / 2."""
    return max_lr * warmup_steps / 2 + (max_lr + min_lr) * (total_steps - warmup_steps) / 2


def adamw_shrink_factor(
    max_lr: float, min_lr: float, warmup_steps: int, total_steps: int, weight_decay: float
) -> float:
    """Exercise 3: exp(-lambda * area), the approximate factor AdamW's decay shrinks a weight by."""
    return math.exp(-weight_decay * schedule_area(max_lr, min_lr, warmup_steps, total_steps))


def adamw_shrink_exact(
    max_lr: float, min_lr: float, warmup_steps: int, total_steps: int, weight_decay: float
) -> float:
    """Exercise 3: prod_{s=0}^{N-1} (1 - lr(s) lambda), the exact factor over N steps."""
    factor = 1.0
    for step in range(total_steps):
        factor *= 1 - weight_decay * cosine_schedule(
            step, max_lr, min_lr, warmup_steps, total_steps
        )
    return factor


# ---------------------------------------------------------------- exercise 4


def _adam_weights(t: int, beta1: float, beta2: float) -> tuple[Tensor, Tensor]:
    """The weights w_i, u_i (i = 1..t) of m_hat_t = sum w_i g_i and v_hat_t = sum u_i g_i^2."""
    i = torch.arange(1, t + 1, dtype=torch.float64)
    w = (1 - beta1) * beta1 ** (t - i) / (1 - beta1**t)  # (t,), sums to 1
    u = (1 - beta2) * beta2 ** (t - i) / (1 - beta2**t)  # (t,), sums to 1
    return w, u


def adam_step_bound(t: int, beta1: float = 0.9, beta2: float = 0.999) -> float:
    """Exercise 4: the largest |m_hat_t| / sqrt(v_hat_t) over all gradient sequences (eps = 0).

    |sum w_i g_i| = |sum (w_i / sqrt(u_i)) (sqrt(u_i) g_i)| <= sqrt(sum w_i^2 / u_i) sqrt(v_hat_t)
    by Cauchy-Schwarz, with equality for g_i proportional to w_i / u_i. 1 at t = 1; for
    beta1^2 < beta2 it tends to (1 - beta1) / sqrt((1 - beta2)(1 - beta1^2 / beta2)) = 7.27
    for the default betas.
    """
    w, u = _adam_weights(t, beta1, beta2)
    return float((w**2 / u).sum().sqrt())


def adam_step_bound_limit(beta1: float = 0.9, beta2: float = 0.999) -> float:
    """Exercise 4: the bound as t -> infinity (needs beta1^2 < beta2)."""
    if not beta1**2 < beta2:
        raise ValueError(
            f"the bound grows without limit when beta1^2 >= beta2, got beta1={beta1}, beta2={beta2}"
        )
    return (1 - beta1) / math.sqrt((1 - beta2) * (1 - beta1**2 / beta2))


def adam_extremal_gradients(t: int, beta1: float = 0.9, beta2: float = 0.999) -> Tensor:
    """Exercise 4: g_i = w_i / u_i (i = 1..t), the sequence whose step t attains the bound."""
    w, u = _adam_weights(t, beta1, beta2)
    return w / u  # (t,)


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))


# ---------------------------------------------------------------- exercise 5


def polar_error(
    g: Tensor, steps: int, coefficients: tuple[float, float, float] = (1.5, -0.5, 0.0)
) -> float:
    """Exercise 5: spectral norm of newton_schulz(g) - U V^T, in float64 (g = U S V^T)."""
    from llmbook.training.optimisers_modern import newton_schulz

    g = g.to(torch.float64)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    out = newton_schulz(g, steps=steps, coefficients=coefficients, dtype=torch.float64)
    return torch.linalg.matrix_norm(out - u @ vh, ord=2).item()


def scalar_newton_schulz(x: float, steps: int, coefficients: tuple[float, float, float] = (1.5, -0.5, 0.0)) -> float:
    """Exercise 5: p^steps(x) with p(x) = a x + b x^3 + c x^5 (what one singular value goes through)."""
    a, b, c = coefficients
    for _ in range(steps):
        x = a * x + b * x**3 + c * x**5
    return x


def cubic_steps_needed(x: float, tol: float) -> int:
    """Exercise 5: steps of the cubic until |1 - p^k(x)| < tol, for x in (0, 1].

    On (0, 1] the cubic p(x) = (3 x - x^3) / 2 increases x toward its fixed point 1
    (1 - p(x) = (1 - x)^2 (2 + x) / 2), so the count is finite; the smallest singular value
    of a matrix needs the most steps.
    """
    if not 0 < x <= 1:
        raise ValueError(f"x must lie in (0, 1], got x={x}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got tol={tol}")
    k = 0
    while abs(1 - x) >= tol:
        x = 1.5 * x - 0.5 * x**3
        k += 1
    return k
