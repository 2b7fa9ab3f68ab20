"""Checks of the preface's exercises (notebooks/00_preface), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are SymPy, ``torch.tanh``, float64 round-off (``2^-53``) and the bound ``2^-53 e^20``
the exercise derives.
"""

from __future__ import annotations

import math

import sympy as sp
import torch


def exercise_1_tanh_derivative(solutions) -> None:
    derivative, gradient = solutions.exercise_1()
    x = sp.Symbol("x", real=True)
    assert derivative.free_symbols == {x}, (
        f"expected the derivative in the real symbol x (sp.symbols('x', real=True)), got "
        f"{derivative} with symbols {derivative.free_symbols}")
    residual = sp.simplify(derivative - (1 - sp.tanh(x) ** 2))
    assert residual == 0, f"expected d/dx tanh(x) - (1 - tanh(x)^2) to simplify to 0, got {residual}"
    xs = torch.linspace(-4, 4, 101, dtype=torch.float64)
    assert isinstance(gradient, torch.Tensor) and gradient.shape == (101,) \
        and gradient.dtype == torch.float64, (
            f"expected autograd's gradient as a float64 tensor of shape (101,), got "
            f"{type(gradient).__name__} {getattr(gradient, 'shape', '')} {getattr(gradient, 'dtype', '')}")
    closed = 1 - torch.tanh(xs) ** 2
    error = float((gradient - closed).abs().max())
    assert error < 1e-15, (
        f"expected the gradient at linspace(-4, 4, 101) to equal 1 - tanh^2 to 1e-15 (float64 "
        f"round-off), got a largest difference of {error:.3g}")


def exercise_2_tanh_from_sigmoid(solutions) -> None:
    expression = solutions.exercise_2()
    x = sp.Symbol("x", real=True)
    assert expression.free_symbols == {x} and not expression.has(sp.tanh) \
        and expression.has(sp.exp), (
            f"expected 2 sigma(2x) - 1 written with exp in the real symbol x (not with tanh), "
            f"got {expression}")
    residual = sp.simplify((expression - sp.tanh(x)).rewrite(sp.exp))
    assert residual == 0, f"expected 2 sigma(2x) - 1 - tanh(x) to simplify to 0, got {residual}"
    for point in (-3, sp.Rational(1, 2), 2):
        value = float(expression.subs(x, point))
        assert math.isclose(value, math.tanh(float(point)), rel_tol=1e-14), (
            f"expected the expression at x = {point} to be tanh({point}) = "
            f"{math.tanh(float(point))!r}, got {value!r}")


def exercise_3_softplus_against_the_literal_formula(solutions) -> None:
    got = solutions.exercise_3()
    bound = 2.0**-53 * math.exp(20)
    returned = got["bound_2^-53_e^20"]
    assert returned == bound, f"expected the bound 2^-53 e^20 = {bound!r}, got {returned!r}"
    # the literal log(1 + e^x) loses digits where e^x is small: the error is far above
    # float64 round-off, within the bound 2^-53 e^{-x}, and worst at the left end
    literal = got["max_rel_error_literal"]
    assert 1e-8 < literal <= bound, (
        f"expected the literal formula's largest relative error to lie in (1e-8, 2^-53 e^20 = "
        f"{bound:.4g}], got {literal!r}")
    where = got["x_of_max_error"]
    assert where <= -19, f"expected the largest error at the left end (x <= -19), got x = {where!r}"
    # log1p keeps them: a few ulps
    accurate = got["max_rel_error_log1p"]
    assert accurate < 1e-15, f"expected log1p(exp(x)) within 1e-15 relative, got {accurate!r}"
