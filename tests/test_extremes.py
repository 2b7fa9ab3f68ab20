"""Tests for llmbook.transformer.extremes: critical points against closed forms, to 25 digits."""

import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.transformer.extremes import critical_extremes

x = sp.Symbol("x", real=True)


def on_grid(expr, lo, hi, n):
    line = np.linspace(lo, hi, n)
    return line, sp.lambdify(x, expr, "numpy")(line)


def test_cubic_extremes_are_exact_to_25_digits():
    # f = x^3 - 3x: f' = 3(x^2 - 1), extremes f(-1) = 2 and f(1) = -2; |f| also peaks at the
    # ends of [-2, 2] but only interior grid points start a search
    f = x**3 - 3 * x
    line, values = on_grid(f, -2.0, 2.0, 401)
    got = critical_extremes(f, x, line, values)
    assert len(got) == 2
    for (xs_, fs_), (x_want, f_want) in zip(got, [(-1, 2), (1, -2)], strict=True):
        assert abs(xs_ - x_want) < mp.mpf(10) ** -25 and abs(fs_ - f_want) < mp.mpf(10) ** -25


def test_sine_extremes_are_odd_multiples_of_half_pi():
    f = sp.sin(x)
    line, values = on_grid(f, 0.0, 10.0, 1001)  # pi/2, 3pi/2, 5pi/2 inside; 7pi/2 = 11.0 is not
    got = critical_extremes(f, x, torch.tensor(line), torch.tensor(values), digits=40)
    assert len(got) == 3
    with mp.workdps(40):
        for k, (xs_, fs_) in enumerate(got):
            assert abs(xs_ - (2 * k + 1) * mp.pi / 2) < mp.mpf(10) ** -35
            assert abs(fs_ - (-1) ** k) < mp.mpf(10) ** -35


@settings(max_examples=15, deadline=None)
@given(roots=st.lists(st.integers(-6, 6), min_size=3, max_size=3, unique=True))
def test_cubic_critical_points_equal_sympy_exact_solutions(roots):
    a, b, c = sorted(roots)
    f = (x - a) * (x - b) * (x - c)  # two critical points, one between each pair of roots
    line, values = on_grid(f, a - 0.5, c + 0.5, 2001)
    got = critical_extremes(f, x, line, values, min_fraction=1e-12)
    exact = sorted(sp.solve(sp.diff(f, x), x), key=float)
    assert len(got) == 2
    with mp.workdps(40):
        for (xs_, fs_), r in zip(got, exact, strict=True):
            assert abs(xs_ - mp.mpf(str(sp.N(r, 40)))) < mp.mpf(10) ** -25
            assert abs(fs_ - mp.mpf(str(sp.N(f.subs(x, r), 40)))) < mp.mpf(10) ** -25


def test_min_fraction_skips_small_extremes_and_precision_is_restored():
    # e^-x sin x peaks at pi/4 + k pi with |f| proportional to e^(-k pi)
    f = sp.exp(-x) * sp.sin(x)
    line, values = on_grid(f, 0.0, 20.0, 20001)
    before = mp.mp.dps
    coarse = critical_extremes(f, x, line, values)  # k pi < log(1e3) = 6.9: k = 0, 1, 2
    fine = critical_extremes(f, x, line, values, min_fraction=1e-9)  # k = 0 .. 6
    assert mp.mp.dps == before
    assert len(coarse) == 3 and len(fine) == 7
    assert all(abs(xs_ - (mp.pi / 4 + k * mp.pi)) < 1e-14 for k, (xs_, _) in enumerate(fine))


def test_a_flat_top_on_the_grid_counts_once():
    f = 1 - x**2
    line = np.linspace(-1.0, 1.0, 201)
    values = np.round(1 - line**2, 3)  # the three points nearest 0 tie at 1.0
    got = critical_extremes(f, x, line, values)
    assert len(got) == 1 and got[0][0] == 0 and got[0][1] == 1


def test_critical_extremes_bad_input():
    line, values = on_grid(sp.sin(x), 0.0, 3.0, 31)
    y = sp.Symbol("y")
    with pytest.raises(TypeError, match="x must be a sympy.Symbol"):
        critical_extremes(sp.sin(x), "x", line, values)
    with pytest.raises(TypeError, match="expr must be a SymPy expression"):
        critical_extremes(math.sin, x, line, values)
    with pytest.raises(ValueError, match=r"expr must depend on x=x only, got free symbols \['x', 'y'\]"):
        critical_extremes(sp.sin(x) * y, x, line, values)
    with pytest.raises(ValueError, match=r"line must be 1-D with at least 3 points, got shape \(1, 31\)"):
        critical_extremes(sp.sin(x), x, line[None], values)
    with pytest.raises(ValueError, match="same length, got 31 and 30"):
        critical_extremes(sp.sin(x), x, line, values[:-1])
    with pytest.raises(ValueError, match="strictly increasing"):
        critical_extremes(sp.sin(x), x, line[::-1], values)
    with pytest.raises(ValueError, match="values must be finite"):
        critical_extremes(sp.sin(x), x, line, np.where(line > 1, np.nan, values))
    with pytest.raises(TypeError, match="values must be a 1-D array"):
        critical_extremes(sp.sin(x), x, line, ["a"] * 31)
    with pytest.raises(ValueError, match="digits must be at least 10"):
        critical_extremes(sp.sin(x), x, line, values, digits=8)
    with pytest.raises(TypeError, match="digits must be an int"):
        critical_extremes(sp.sin(x), x, line, values, digits=30.0)
    with pytest.raises(ValueError, match="min_fraction must be a positive"):
        critical_extremes(sp.sin(x), x, line, values, min_fraction=0)
