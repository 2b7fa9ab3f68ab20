"""Reference solutions to the exercises of notebooks/00_preface (checked by tests/test_solutions_00.py)."""

from __future__ import annotations

import math

import sympy as sp
import torch
import torch.nn.functional as F

from llmbook.nbtools import Checks


def exercise_1() -> tuple[sp.Expr, torch.Tensor]:
    """d/dx tanh(x), derived by SymPy, and autograd's gradient of tanh on 101 points.

    Returns ``(derivative, gradient)``: the SymPy expression of d/dx tanh(x) in the real
    symbol ``x`` (which simplifies to 1 - tanh(x)^2), and autograd's float64 gradient of
    ``tanh`` at ``torch.linspace(-4, 4, 101)``, shape (101,).
    """
    x = sp.symbols("x", real=True)
    derivative = sp.diff(sp.tanh(x), x)
    assert sp.simplify(derivative - (1 - sp.tanh(x) ** 2)) == 0
    xs = torch.linspace(-4, 4, 101, dtype=torch.float64, requires_grad=True)
    torch.tanh(xs).sum().backward()
    symbolic = sp.lambdify(x, derivative, "numpy")(xs.detach().numpy())
    assert float((xs.grad - torch.from_numpy(symbolic)).abs().max()) < 1e-15
    return derivative, xs.grad


def exercise_2() -> sp.Expr:
    """2 sigma(2x) - 1 as a SymPy expression of the real symbol ``x``, built from the sigmoid
    sigma(u) = 1 / (1 + e^-u) (so written with ``exp``, not ``tanh``); SymPy shows it is tanh(x)."""
    x = sp.symbols("x", real=True)
    sigma = lambda u: 1 / (1 + sp.exp(-u))  # noqa: E731
    expression = 2 * sigma(2 * x) - 1
    assert sp.simplify((expression - sp.tanh(x)).rewrite(sp.exp)) == 0
    return expression


def exercise_3() -> dict[str, float]:
    """softplus against log(1 + e^x), evaluated literally, on [-20, 20] in float64.

    Returns the max relative error of the literal formula ``log(1 + exp(x))``, the x where
    it occurs, the bound that explains it, and the error of ``log1p(exp(x))`` for contrast,
    after recording both comparisons in a ``Checks`` table.

    Why the literal formula loses digits: for x < 0, u = e^x is small and ``1 + u`` is
    rounded to float64, ``fl(1 + u) = (1 + u)(1 + delta)`` with ``|delta| <= 2^-53``. Then
    ``log(fl(1 + u)) = log(1 + u) + log(1 + delta)``: an absolute error of about ``delta``
    on a result of size ``log(1 + u) ~ u``, so a relative error up to ``2^-53 e^{-x}``,
    about 5e-8 at x = -20. An honest tolerance for the literal formula on this interval is
    therefore 2^-53 e^20 relative, not a few ulps. ``log1p`` never forms ``1 + u`` and
    stays within a few ulps (about 1e-15 relative) everywhere.
    """
    xs = torch.linspace(-20, 20, 401, dtype=torch.float64)
    reference = F.softplus(xs)
    literal = torch.log(1 + torch.exp(xs))
    accurate = torch.log1p(torch.exp(xs))
    rel_literal = (literal - reference).abs() / reference
    bound = 2.0**-53 * math.exp(20)
    checks = Checks("softplus vs log(1 + e^x), float64, 401 points on [-20, 20]")
    one = torch.ones_like(xs)  # each ratio to softplus should be 1: its error is relative
    checks.close("log(1 + exp(x)) / softplus, tol 2^-53 e^20", one, literal / reference, tol=bound)
    checks.close("log1p(exp(x)) / softplus, tol 1e-15", one, accurate / reference, tol=1e-15)
    return {
        "max_rel_error_literal": float(rel_literal.max()),
        "x_of_max_error": float(xs[rel_literal.argmax()]),
        "bound_2^-53_e^20": bound,
        "max_rel_error_log1p": float(((accurate - reference).abs() / reference).max()),
    }


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
