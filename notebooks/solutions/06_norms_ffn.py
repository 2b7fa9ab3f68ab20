"""Reference solutions to the exercises of notebooks/06_norms_ffn (checked by tests/test_solutions_06.py)."""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.transformer.layers import RMSNorm, gelu, rms_norm_jacobian


def layer_norm_via_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5
) -> torch.Tensor:
    """Exercise 1: LayerNorm as RMSNorm of the centred input, then gain and shift.

    On a zero-mean vector the mean square is the biased variance, so
    LN(x) = RMSNorm_eps(x - mean(x)) * gamma + beta. Shapes: (..., d) -> (..., d).
    """
    d = x.shape[-1]
    rms = RMSNorm(d, eps=eps, dtype=x.dtype)
    with torch.no_grad():
        rms.weight.copy_(weight)
    y = rms(x - x.mean(dim=-1, keepdim=True))
    return y + bias if bias is not None else y


def layer_norm_vjp(
    x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    """Exercise 2: J^T g for LayerNorm in O(d), without forming the (d, d) Jacobian.

    With s = sqrt(var + eps), x_hat = (x - mu) / s and g' = gamma * g,
    J^T g = (g' - mean(g') - x_hat * mean(g' * x_hat)) / s   (J^T = P diag(gamma) / s,
    P symmetric). Shapes: x, grad_out (..., d); weight (d,) -> (..., d).
    """
    mu = x.mean(dim=-1, keepdim=True)
    s = ((x - mu).pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (..., 1)
    x_hat = (x - mu) / s  # (..., d)
    gp = weight * grad_out  # (..., d)
    mean_gp = gp.mean(dim=-1, keepdim=True)
    mean_gpx = (gp * x_hat).mean(dim=-1, keepdim=True)
    return (gp - mean_gp - x_hat * mean_gpx) / s


def tanh_gelu_max_error(c: float, lo: float = -6.0, hi: float = 6.0, step: float = 1e-4) -> float:
    """Exercise 3: max |GELU_tanh(x; c) - GELU(x)| on a grid of [lo, hi] with the given step."""
    n = round((hi - lo) / step) + 1
    x = torch.linspace(lo, hi, n, dtype=torch.float64)
    approx = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + c * x**3)))
    return (approx - gelu(x)).abs().max().item()


def best_tanh_constant(lo: float = 0.040, hi: float = 0.050, iterations: int = 40) -> float:
    """Exercise 3: the c minimising :func:`tanh_gelu_max_error`, by ternary search.

    The maximum error is unimodal in c on [0.04, 0.05] (the positive peaks near |x| = 2.7
    grow with c's distance below c* while the negative dips near |x| = 1.4 shrink).
    Result: c = 0.04438, max error 3.87e-4 (GPT-2's 0.044715 gives 4.73e-4).
    """
    for _ in range(iterations):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if tanh_gelu_max_error(m1) < tanh_gelu_max_error(m2):
            hi = m2
        else:
            lo = m1
    return (lo + hi) / 2


def rms_norm_jacobian_spectrum(d: int = 3) -> tuple[sp.Matrix, sp.Expr, sp.Expr]:
    """Exercise 4: for symbolic x in R^d and eps, the eigen-decomposition of the RMSNorm Jacobian.

    Returns (J, lambda_perp, lambda_x) with J = (1/r)(I - x x^T/(d r^2)) built from the
    forward formula by ``sp.Matrix.jacobian``; J v = lambda_perp v for every v orthogonal
    to x, and J x = lambda_x x, with lambda_perp = 1/r and lambda_x = eps / r^3.
    """
    xs = sp.Matrix(sp.symbols(f"x_0:{d}", real=True))
    eps = sp.Symbol("epsilon", positive=True)
    r = sp.sqrt(sum(v**2 for v in xs) / d + eps)
    J = (xs / r).jacobian(xs)
    return J, 1 / r, eps / r**3


def rms_norm_jacobian_condition_number(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Exercise 4: cond(J) = (1/r) / (eps/r^3) = r^2 / eps = (mean(x^2) + eps) / eps.

    Shapes: (..., d) -> (...). For d >= 2 and g = 1 (with d = 1 there is no orthogonal
    direction and J is the 1x1 matrix eps / r^3).
    """
    return (x.pow(2).mean(dim=-1) + eps) / eps


def check_rms_norm_condition_number(x: torch.Tensor, eps: float) -> float:
    """Exercise 4: relative gap between r^2/eps and torch.linalg.cond of the Jacobian."""
    ours = rms_norm_jacobian_condition_number(x, eps)
    ref = torch.linalg.cond(rms_norm_jacobian(x, eps=eps))
    return ((ours - ref).abs() / ref).max().item()


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
