"""Checks of the preface's exercises (notebooks/00_preface), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are float64 round-off (``2^-53``) and the bound ``2^-53 e^20`` the exercise derives.
"""

from __future__ import annotations

import math


def exercise_1_tanh_derivative(solutions) -> None:
    error = solutions.exercise_1()
    assert error < 1e-15, (
        f"expected the largest gap between autograd's d/dx tanh and 1 - tanh^2 to be below "
        f"1e-15 (float64 round-off), got {error!r}")


def exercise_2_tanh_from_sigmoid(solutions) -> None:
    identity = solutions.exercise_2()
    assert identity is True, (
        f"expected exercise_2() to return True (SymPy confirms tanh(x) = 2 sigma(2x) - 1), "
        f"got {identity!r}")


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
