"""Reference solutions to the exercises of notebooks/00_preface (checked by tests/test_solutions_00.py)."""

from __future__ import annotations

import sympy as sp
import torch
import torch.nn.functional as F


def exercise_1() -> float:
    """d/dx tanh(x) = 1 - tanh(x)^2, symbolically and against autograd; return the max error."""
    x = sp.symbols("x", real=True)
    assert sp.simplify(sp.diff(sp.tanh(x), x) - (1 - sp.tanh(x) ** 2)) == 0
    xs = torch.linspace(-4, 4, 101, dtype=torch.float64, requires_grad=True)
    torch.tanh(xs).sum().backward()
    symbolic = sp.lambdify(x, 1 - sp.tanh(x) ** 2, "numpy")(xs.detach().numpy())
    return float((xs.grad - torch.from_numpy(symbolic)).abs().max())


def exercise_2() -> bool:
    """tanh(x) = 2 sigma(2x) - 1, as an identity of SymPy expressions."""
    x = sp.symbols("x", real=True)
    sigma = lambda u: 1 / (1 + sp.exp(-u))  # noqa: E731
    return sp.simplify((2 * sigma(2 * x) - 1 - sp.tanh(x)).rewrite(sp.exp)) == 0


def exercise_3() -> float:
    """softplus against log(1 + e^x) on [-20, 20] in float64: return the max relative error.

    ``log1p(exp(x))`` is accurate there (exp(20) is far from overflow), so an honest
    tolerance is a few ulps of float64, about 1e-15 relative.
    """
    xs = torch.linspace(-20, 20, 401, dtype=torch.float64)
    ours = torch.log1p(torch.exp(xs))
    return float(((F.softplus(xs) - ours).abs() / ours).max())
