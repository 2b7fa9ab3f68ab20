"""The preface's exercise solutions hold."""


import math

from solution_loader import load_solutions

solutions = load_solutions("00_preface")


def test_exercise_1_tanh_derivative():
    assert solutions.exercise_1() < 1e-15


def test_exercise_2_tanh_from_sigmoid():
    assert solutions.exercise_2() is True


def test_exercise_3_softplus_against_the_literal_formula():
    got = solutions.exercise_3()
    bound = 2.0**-53 * math.exp(20)
    assert got["bound_2^-53_e^20"] == bound
    # the literal log(1 + e^x) loses digits where e^x is small: the error is far above
    # float64 round-off, within the bound 2^-53 e^{-x}, and worst at the left end
    assert 1e-8 < got["max_rel_error_literal"] <= bound
    assert got["x_of_max_error"] <= -19
    # log1p keeps them: a few ulps
    assert got["max_rel_error_log1p"] < 1e-15
