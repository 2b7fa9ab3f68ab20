"""The extremes of a smooth function to many digits: a grid finds them, mpmath pins them down.

Introduced in notebooks/06_norms_ffn (section 6.4), where it gives the largest error of the
tanh approximation of the normal CDF and of GELU without a grid's discretisation error. A
float64 grid locates each local extreme of f to within a step h; at an interior extreme
f'(x*) = 0, so Newton's method on f' started at the grid point converges to x* (quadratically,
when f''(x*) != 0), and f(x*) follows at the working precision of mpmath, the
arbitrary-precision library under SymPy.

* :func:`critical_extremes` - the (x*, f(x*)) pairs of the local extremes of ``|f|`` seen
  on a grid, each refined as a root of f' by ``mpmath.findroot``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbook.validation import check_positive_int, check_positive_number

__all__ = ["critical_extremes"]


def _as_line(name: str, value: object) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a 1-D array or tensor of real numbers, got "
                        f"{type(value).__name__}") from err
    if arr.ndim != 1 or arr.shape[0] < 3:
        raise ValueError(f"{name} must be 1-D with at least 3 points, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    return arr


def critical_extremes(expr: Any, x: Any, line: Any, values: Any, digits: int = 30,
                      min_fraction: float = 1e-3) -> list[tuple[Any, Any]]:
    """Local extremes of the SymPy expression ``expr`` in the symbol ``x``: [(x*, f(x*)), ...].

    ``line`` (n,) is an increasing grid and ``values`` (n,) the float64 values of f on it (a
    NumPy array or a CPU tensor). Every interior grid point where ``|values|`` is a local
    maximum of at least ``min_fraction`` times the largest (smaller ones are round-off
    wiggles in flat tails) starts Newton's method (``mpmath.findroot``) on f' = d expr / dx,
    which SymPy differentiates; f is then evaluated at each root. Both at ``digits``
    significant digits, inside ``mpmath.workdps`` (the global precision is left as it was).
    Roots that agree to ``digits - 5`` digits count once. Returns ``mpmath.mpf`` pairs sorted
    by x*. The answer is as good as the starting points: an extreme that the grid does not
    resolve (two within a step) may be missed, and Newton's method may converge to a
    neighbouring critical point, so keep the grid fine against the function's features.
    """
    import mpmath as mp
    import sympy as sp

    if not isinstance(x, sp.Symbol):
        raise TypeError(f"x must be a sympy.Symbol, got {type(x).__name__}")
    if not isinstance(expr, sp.Expr):
        raise TypeError(f"expr must be a SymPy expression, got {type(expr).__name__}")
    if not expr.free_symbols <= {x}:
        raise ValueError(f"expr must depend on x={x} only, got free symbols {sorted(map(str, expr.free_symbols))}")
    digits = check_positive_int("digits", digits)
    if digits < 10:
        raise ValueError(f"digits must be at least 10 (float64 gives 16), got digits={digits}")
    min_fraction = check_positive_number("min_fraction", min_fraction)
    grid, v = _as_line("line", line), np.abs(_as_line("values", values))
    if grid.shape != v.shape:
        raise ValueError(f"line and values must have the same length, got {grid.shape[0]} and {v.shape[0]}")
    if not (np.diff(grid) > 0).all():
        raise ValueError("line must be strictly increasing")
    inner = v[1:-1]
    peaks = np.nonzero((inner >= v[:-2]) & (inner >= v[2:]) & (inner > min_fraction * v.max()))[0] + 1
    f_mp = sp.lambdify(x, expr, "mpmath")
    df_mp = sp.lambdify(x, sp.diff(expr, x), "mpmath")
    found: dict[str, Any] = {}
    with mp.workdps(digits):
        for i in peaks.tolist():
            root = mp.findroot(df_mp, mp.mpf(float(grid[i])))
            found.setdefault(mp.nstr(root, digits - 5), root)
        return sorted(((r, f_mp(r)) for r in found.values()), key=lambda pair: pair[0])
