"""Scaling laws: power-law fits, the C = 6ND rule and Chinchilla's compute-optimal allocation.

Introduced in notebooks/11_scaling_laws. Three pieces:

* :func:`fit_power_law` fits ``y = a x^(-alpha)`` (or ``y = E + a x^(-alpha)``) by least
  squares on ``log y`` against ``log x``: a straight line on a log-log plot, with the
  slope and intercept of the ordinary linear regression in closed form;
* :func:`training_flops` is the rule of thumb ``C = 6 N D``: about ``2 N`` FLOPs per token
  forward (one multiply-add per parameter, ``llmbook.transformer.sizing.flops_per_token`` without its
  attention term) and twice that backward (Kaplan et al., 2020, "Scaling Laws for Neural
  Language Models", section 2.1);
* :func:`chinchilla_loss` and :func:`compute_optimal` evaluate the parametric loss of
  Hoffmann et al. (2022, "Training Compute-Optimal Large Language Models", equation 2)

  .. math::  L(N, D) = E + \\frac{A}{N^\\alpha} + \\frac{B}{D^\\beta}

  and its minimum under a compute budget ``6 N D = C``, found with a Lagrange multiplier:

  .. math::  N_{opt} = G \\left(\\frac{C}{6}\\right)^{\\beta/(\\alpha+\\beta)}, \\quad
             D_{opt} = G^{-1} \\left(\\frac{C}{6}\\right)^{\\alpha/(\\alpha+\\beta)}, \\quad
             G = \\left(\\frac{\\alpha A}{\\beta B}\\right)^{1/(\\alpha+\\beta)}

  (Hoffmann et al., 2022, equation 4), for two published sets of constants
  (:data:`CHINCHILLA_CONSTANTS`).

:func:`golden_section_minimize`, a one-dimensional minimiser, fits the offset ``E`` of a
power law and, in the notebook and the tests, checks :func:`compute_optimal` numerically.

:func:`fit_isoflop_parabola` is Hoffmann et al.'s approach 2 (section 3.2): at one budget,
fit a parabola in ``log N`` to the final losses and take its vertex as ``N_opt``.
:func:`isoflop_sweep` trains the book's tiny iso-FLOP runs on the synthetic source;
``python -m llmbook.training.scaling`` re-makes their results, :data:`ISOFLOP_RESULTS`
(``data/scaling/isoflop_sweep.json``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmbook.paths import data_path

__all__ = [
    "CHINCHILLA_CONSTANTS",
    "ISOFLOP_RESULTS",
    "SIZE_SWEEP_RESULTS",
    "effective_data",
    "fit_isoflop_parabola",
    "inference_breakeven_tokens",
    "inference_optimal",
    "isoflop_sweep",
    "ChinchillaConstants",
    "PowerLawFit",
    "PowerLawPrediction",
    "chinchilla_loss",
    "MUENNIGHOFF_R_STAR",
    "compute_optimal",
    "counted_training_flops",
    "fit_power_law",
    "get_constants",
    "golden_section_minimize",
    "optimal_exponents",
    "predict_power_law",
    "size_sweep",
    "tokens_per_parameter",
    "training_flops",
]


# ---------------------------------------------------------------- power-law fits


@dataclass(frozen=True)
class PowerLawFit:
    """The result of :func:`fit_power_law`: ``y ~ E + a x^(-alpha)``.

    Attributes:
        a: the prefactor (``y - E`` at ``x = 1``).
        alpha: the exponent; positive when ``y`` falls with ``x``.
        E: the irreducible offset (``0.0`` for a pure power law).
        r_squared: the coefficient of determination of the straight-line fit in log-log
            space, ``1 - SS_res / SS_tot`` on ``log(y - E)`` (1 for an exact power law).
        residuals: ``(n,)`` array, ``log(y - E) - log(a x^(-alpha))`` for every point.
        offset_fitted: whether ``E`` was fitted (``offset="fit"``) rather than given.
    """

    a: float
    alpha: float
    E: float
    r_squared: float
    residuals: np.ndarray
    offset_fitted: bool = False

    def predict(self, x: float | np.ndarray) -> float | np.ndarray:
        """``E + a x^(-alpha)`` at ``x`` (a scalar or an array of any shape)."""
        out = self.E + self.a * np.power(np.asarray(x, dtype=np.float64), -self.alpha)
        return float(out) if np.ndim(out) == 0 else out


def _as_1d_positive(name: str, values: object) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name} must be finite and positive for a log-log fit, "
                         f"got {name}[{i}] = {float(arr[i])!r}")
    return arr


def _line_fit(u: np.ndarray, v: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Least-squares line ``v = c0 + c1 u``: ``c1 = cov(u, v) / var(u)``, ``c0 = mean(v) - c1 mean(u)``."""
    du = u - u.mean()
    c1 = float(du @ (v - v.mean()) / (du @ du))
    c0 = float(v.mean() - c1 * u.mean())
    return c0, c1, v - (c0 + c1 * u)


def fit_power_law(x: object, y: object, offset: float | str | None = None) -> PowerLawFit:
    """Fit ``y = a x^(-alpha)``, or ``y = E + a x^(-alpha)``, by least squares in log-log space.

    ``x`` and ``y`` are 1-D sequences of the same length ``n >= 2`` (``n >= 3`` to fit the
    offset), ``x`` positive and not all equal. With ``offset=None`` the fit is the linear
    regression of ``log y`` on ``log x`` (closed form: slope ``-alpha``, intercept
    ``log a``). With a number ``E``, the same regression of ``log(y - E)``; every
    ``y`` must then exceed ``E``. With ``offset="fit"``, ``E`` is chosen in ``[0, min y)``
    to minimise the sum of squared log residuals (a grid scan, then
    :func:`golden_section_minimize` around the best grid point; the line fit in closed
    form inside both).

    Minimising squared errors of ``log y`` weights every point by its *relative* error,
    which suits data spanning orders of magnitude (and multiplicative noise).
    """
    xs = _as_1d_positive("x", x)
    ys = np.asarray(y, dtype=np.float64)
    if ys.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {ys.shape}")
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if xs.size < 2:
        raise ValueError(f"a power-law fit needs at least 2 points, got {xs.size}")
    if np.all(xs == xs[0]):
        raise ValueError(f"x values are all equal (to {float(xs[0])!r}): no slope to fit")
    u = np.log(xs)

    if offset is None or isinstance(offset, int | float) and not isinstance(offset, bool):
        E = 0.0 if offset is None else float(offset)
        if not math.isfinite(E):
            raise ValueError(f"offset must be finite, got {offset!r}")
        if offset is None:
            ys = _as_1d_positive("y", ys)
        elif np.any(~np.isfinite(ys) | (ys <= E)):
            i = int(np.flatnonzero(~np.isfinite(ys) | (ys <= E))[0])
            raise ValueError(f"every y must be finite and exceed the offset {E!r}, "
                             f"got y[{i}] = {float(ys[i])!r}")
        fitted = False
    elif offset == "fit":
        if xs.size < 3:
            raise ValueError(f"fitting the offset too needs at least 3 points, got {xs.size}")
        ys = _as_1d_positive("y", ys)
        y_min = float(ys.min())

        def sse(e: float) -> float:
            return float(np.sum(_line_fit(u, np.log(ys - e))[2] ** 2))

        # The sum of squares need not be unimodal in E on [0, min y): scan a grid that is
        # dense near min y (E = min y (1 - s), s from 1 down to 1e-10), refine every local
        # minimum of the grid by golden-section search, and keep the best.
        grid = y_min * (1.0 - np.logspace(0.0, -10.0, 201))  # (201,), grid[0] = 0
        values = np.array([sse(e) for e in grid])
        best_sse, E = float(values[0]), 0.0
        for k in range(grid.size):
            left, right = values[max(k - 1, 0)], values[min(k + 1, grid.size - 1)]
            if values[k] <= left and values[k] <= right:  # a local minimum of the grid
                lo, hi = float(grid[max(k - 1, 0)]), float(grid[min(k + 1, grid.size - 1)])
                e = golden_section_minimize(sse, lo, hi, tol=1e-13 * y_min) if hi > lo else lo
                if sse(e) < best_sse:
                    best_sse, E = sse(e), float(e)
        fitted = True
    else:
        raise ValueError(f"offset must be None, a number or 'fit', got {offset!r}")

    v = np.log(ys - E)
    log_a, slope, residuals = _line_fit(u, v)
    ss_res = float(residuals @ residuals)
    ss_tot = float(np.sum((v - v.mean()) ** 2))
    r_squared = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return PowerLawFit(a=math.exp(log_a), alpha=-slope, E=E, r_squared=r_squared,
                       residuals=residuals, offset_fitted=fitted)


@dataclass(frozen=True)
class PowerLawPrediction:
    """The result of :func:`predict_power_law`: a fit, the interval of its exponent, and
    prediction intervals for new observations.

    Attributes:
        fit: the :class:`PowerLawFit` of the points given.
        alpha_interval: ``(lo, hi)``, the Student-t confidence interval of ``alpha`` at ``level``.
        x_new: ``(m,)`` the sizes predicted.
        predicted: ``(m,)`` ``E + a x_new^(-alpha)``.
        lower, upper: ``(m,)`` the prediction interval at each ``x_new`` (of one new observation,
            or of the mean of ``averaged`` new observations, of ``log(y - E)``).
        level: the coverage asked for, e.g. 0.95.
    """

    fit: PowerLawFit
    alpha_interval: tuple[float, float]
    x_new: np.ndarray
    predicted: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    level: float


def predict_power_law(x: object, y: object, x_new: object, level: float = 0.95,
                      offset: float | None = None, averaged: int = 1) -> PowerLawPrediction:
    """Fit ``y = E + a x^(-alpha)`` (``E = offset``, default 0) to ``n >= 3`` points and predict
    new observations at ``x_new``, with the intervals of ordinary least squares in log space.

    With ``u = log x``, ``v = log(y - E)``, residual variance ``s^2 = SS_res / (n - 2)``,
    ``S_uu = sum (u - mean u)^2`` and ``t = t_{(1 + level)/2, n - 2}``:

        alpha in  alpha_hat -+ t s / sqrt(S_uu),
        v_new in  v_hat(u_new) -+ t s sqrt(1/m + 1/n + (u_new - mean u)^2 / S_uu)

    (the textbook intervals of a straight-line regression with independent normal errors,
    e.g. Montgomery, Peck and Vining, "Introduction to Linear Regression Analysis", section
    2.4), where ``v_new`` is the mean of ``m = averaged`` new observations of ``log(y - E)``
    (``m = 1``: one new observation). The prediction interval is mapped back through
    ``y = E + exp(v)``. It covers with probability ``level`` only if the points scatter independently around a
    true power law; a curve that bends away from the line shows up as points outside it.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int | float)):
        raise TypeError(f"offset must be a number or None, got {type(offset).__name__}")
    if isinstance(averaged, bool) or not isinstance(averaged, int) or averaged < 1:
        raise ValueError(f"averaged must be a positive int (new observations averaged), got {averaged!r}")
    fit = fit_power_law(x, y, offset=offset)
    u = np.log(_as_1d_positive("x", x))
    n = u.size
    if n < 3:
        raise ValueError(f"intervals need at least 3 points (n - 2 degrees of freedom), got {n}")
    u_new = np.log(_as_1d_positive("x_new", np.atleast_1d(np.asarray(x_new, dtype=np.float64))))
    from scipy.stats import t as student_t

    s = math.sqrt(float(fit.residuals @ fit.residuals) / (n - 2))
    s_uu = float(np.sum((u - u.mean()) ** 2))
    t = float(student_t.ppf(0.5 + level / 2, n - 2))
    half_alpha = t * s / math.sqrt(s_uu)
    v_hat = math.log(fit.a) - fit.alpha * u_new
    half_pred = t * s * np.sqrt(1.0 / averaged + 1.0 / n + (u_new - u.mean()) ** 2 / s_uu)
    return PowerLawPrediction(
        fit=fit, alpha_interval=(fit.alpha - half_alpha, fit.alpha + half_alpha), x_new=np.exp(u_new),
        predicted=fit.E + np.exp(v_hat), lower=fit.E + np.exp(v_hat - half_pred),
        upper=fit.E + np.exp(v_hat + half_pred), level=level)


def golden_section_minimize(f: Callable[[float], float], lo: float, hi: float,
                            tol: float = 1e-10, max_iter: int = 500) -> float:
    """The minimiser of a unimodal ``f`` on ``[lo, hi]`` by golden-section search.

    Each step keeps the part of the bracket that must hold the minimum and shrinks it by
    ``1/phi = 0.618`` with one new evaluation of ``f`` (Kiefer, 1953, "Sequential minimax
    search for a maximum"). Stops when the bracket is narrower than ``tol`` (absolute).
    For a smooth minimum, ``f`` rounds to the same float over a width of about
    ``sqrt(eps)`` relative, which limits any search on values alone.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise ValueError(f"need finite lo < hi, got lo={lo!r}, hi={hi!r}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0  # 0.618...
    a, b = lo, hi
    c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(max_iter):
        if b - a <= tol:
            break
        if fc <= fd:  # the minimum lies in [a, d]
            b, d, fd = d, c, fc
            c = b - inv_phi * (b - a)
            fc = f(c)
        else:  # the minimum lies in [c, b]
            a, c, fc = c, d, fd
            d = a + inv_phi * (b - a)
            fd = f(d)
    return (a + b) / 2.0


# ---------------------------------------------------------------- compute: C = 6 N D


def training_flops(N: float | np.ndarray, D: float | np.ndarray) -> float | np.ndarray:
    """Training compute ``C = 6 N D`` FLOPs for ``N`` parameters and ``D`` tokens.

    Forward about ``2 N`` FLOPs per token (``llmbook.transformer.sizing.flops_per_token`` less its
    attention term ``4 L T H d_h``, small when ``d >> T / 6``), backward twice that.
    """
    n, dd = _check_positive("N", N), _check_positive("D", D)
    out = 6.0 * n * dd
    return float(out) if np.ndim(out) == 0 else out


def counted_training_flops(config: Any, seq_len: int) -> int:
    """FLOPs of one forward and backward pass of ``TransformerLM(config)`` on one sequence of
    ``seq_len`` tokens, as ``torch.utils.flop_counter.FlopCounterMode`` counts them.

    The model is built on PyTorch's ``meta`` device (shapes only: nothing is allocated or
    computed, so a 7B shape costs no memory) with the book's unfused attention, whose score
    and value products the counter can see; the loss is the cross-entropy of the logits
    against the (zero) ids. The counter adds 2 FLOPs per multiply-add of every matrix product
    dispatched, independently of ``llmbook.transformer.sizing``'s closed form, so the two
    are a check on each other. Divide by ``seq_len`` for FLOPs per token.
    """
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from llmbook.transformer.model import TransformerConfig, TransformerLM

    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= config.max_seq_len:
        raise ValueError(f"seq_len must be an int from 1 to config.max_seq_len = {config.max_seq_len}, "
                         f"got {seq_len!r}")
    with torch.device("meta"):
        model = TransformerLM(config)
    model.set_fused_attention(False)
    ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        logits = model(ids)
        F.cross_entropy(logits.reshape(-1, config.vocab_size), ids.reshape(-1)).backward()
    return int(counter.get_total_flops())


# ---------------------------------------------------------------- Chinchilla


@dataclass(frozen=True)
class ChinchillaConstants:
    """The constants of ``L(N, D) = E + A / N^alpha + B / D^beta`` (loss in nats/token,
    ``N`` parameters, ``D`` training tokens), and where they were published."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str


CHINCHILLA_CONSTANTS: dict[str, ChinchillaConstants] = {
    "hoffmann2022": ChinchillaConstants(
        E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28,
        source="Hoffmann et al., 2022, 'Training Compute-Optimal Large Language Models', "
               "approach 3"),
    "besiroglu2024": ChinchillaConstants(
        E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658,
        source="Besiroglu et al., 2024, 'Chinchilla Scaling: A replication attempt', "
               "their refit of approach 3"),
}


def get_constants(name: str | ChinchillaConstants) -> ChinchillaConstants:
    """The named constants from :data:`CHINCHILLA_CONSTANTS` (a ``ChinchillaConstants`` passes through)."""
    if isinstance(name, ChinchillaConstants):
        return name
    if not isinstance(name, str):
        raise TypeError(f"constants must be a name or ChinchillaConstants, got {type(name).__name__}")
    if name not in CHINCHILLA_CONSTANTS:
        raise ValueError(f"unknown constants {name!r}; known: {sorted(CHINCHILLA_CONSTANTS)}")
    return CHINCHILLA_CONSTANTS[name]


def _check_positive(name: str, value: object) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        raise ValueError(f"{name} must be finite and positive, got {float(arr.ravel()[bad[0]])!r}"
                         + (f" (at flat index {int(bad[0])})" if arr.ndim else ""))
    return arr


def chinchilla_loss(N: float | np.ndarray, D: float | np.ndarray,
                    constants: str | ChinchillaConstants = "hoffmann2022") -> float | np.ndarray:
    """``L(N, D) = E + A / N^alpha + B / D^beta`` in nats/token (Hoffmann et al., 2022, eq. 2).

    ``N`` and ``D`` are positive scalars or arrays that broadcast together (e.g. ``N`` of
    shape ``(k, 1)`` and ``D`` of shape ``(1, m)`` give a ``(k, m)`` grid); a float for
    scalars.
    """
    c = get_constants(constants)
    n, d = _check_positive("N", N), _check_positive("D", D)
    try:
        np.broadcast_shapes(n.shape, d.shape)
    except ValueError:
        raise ValueError(f"N of shape {n.shape} and D of shape {d.shape} do not broadcast") from None
    out = c.E + c.A * n ** (-c.alpha) + c.B * d ** (-c.beta)
    return float(out) if np.ndim(out) == 0 else out


def optimal_exponents(constants: str | ChinchillaConstants = "hoffmann2022") -> tuple[float, float]:
    """``(a, b) = (beta / (alpha + beta), alpha / (alpha + beta))``: ``N_opt ~ C^a``, ``D_opt ~ C^b``."""
    c = get_constants(constants)
    return c.beta / (c.alpha + c.beta), c.alpha / (c.alpha + c.beta)


def compute_optimal(C: float | np.ndarray, constants: str | ChinchillaConstants = "hoffmann2022"
                    ) -> tuple[float | np.ndarray, float | np.ndarray]:
    """``(N_opt, D_opt)`` minimising :func:`chinchilla_loss` subject to ``6 N D = C``.

    Setting the gradient of the Lagrangian ``L(N, D) + lambda (6 N D - C)`` to zero gives
    ``alpha A / N^alpha = beta B / D^beta`` (both equal ``6 lambda N D``); with
    ``D = C / (6 N)``:

        N_opt = G (C/6)^(beta/(alpha+beta)),  D_opt = (C/6)^(alpha/(alpha+beta)) / G,
        G = (alpha A / (beta B))^(1/(alpha+beta))

    (Hoffmann et al., 2022, equation 4). ``C`` in FLOPs, a positive scalar or array.
    """
    c = get_constants(constants)
    budget = _check_positive("C", C)
    G = (c.alpha * c.A / (c.beta * c.B)) ** (1.0 / (c.alpha + c.beta))
    a, b = optimal_exponents(c)
    n_opt, d_opt = G * (budget / 6.0) ** a, (budget / 6.0) ** b / G
    if np.ndim(n_opt) == 0:
        return float(n_opt), float(d_opt)
    return n_opt, d_opt


def tokens_per_parameter(C: float | np.ndarray,
                         constants: str | ChinchillaConstants = "hoffmann2022") -> float | np.ndarray:
    """``D_opt / N_opt = G^(-2) (C/6)^((alpha - beta)/(alpha + beta))`` at budget ``C``."""
    n_opt, d_opt = compute_optimal(C, constants)
    return d_opt / n_opt


# ---------------------------------------------------------------- beyond compute-optimal

MUENNIGHOFF_R_STAR = 15.4
"""Muennighoff et al. (2023), "Scaling Data-Constrained Language Models", equation 5: the
fitted decay constant ``R_D*`` of the value of repeated tokens (in epochs)."""


def effective_data(unique_tokens: float | np.ndarray, total_tokens: float | np.ndarray,
                   r_star: float = MUENNIGHOFF_R_STAR) -> float | np.ndarray:
    """The effective data ``D' = U + U R* (1 - exp(-R / R*))`` of ``D`` tokens drawn from ``U``
    unique ones, ``R = D / U - 1`` the repetitions beyond the first epoch.

    Muennighoff et al. (2023, equation 5): the ``k``-th repetition of the data is worth
    ``exp(-k / R*)`` of fresh data, integrated over ``0 <= k <= R``, so ``D'`` starts as ``D``
    (a few epochs are nearly as good as new tokens) and saturates at ``U (1 + R*)``. Arrays
    broadcast; ``D >= U > 0`` (tokens), ``r_star > 0``.
    """
    u, d = _check_positive("unique_tokens", unique_tokens), _check_positive("total_tokens", total_tokens)
    if not (isinstance(r_star, int | float) and not isinstance(r_star, bool) and math.isfinite(r_star)
            and r_star > 0):
        raise ValueError(f"r_star must be a finite number > 0, got {r_star!r}")
    if np.any(d < u):
        raise ValueError("total_tokens must be >= unique_tokens (at least one epoch), got "
                         f"{float(np.min(d - u)):.4g} fewer")
    repeats = d / u - 1.0
    out = u + u * r_star * -np.expm1(-repeats / r_star)
    return float(out) if np.ndim(out) == 0 else out


def inference_optimal(loss: float, inference_tokens: float,
                      constants: str | ChinchillaConstants = "besiroglu2024") -> tuple[float, float]:
    """``(N, D_train)`` reaching ``L(N, D_train) = loss`` at the least lifetime compute
    ``6 N D_train + 2 N D_inf`` (training plus ``D_inf = inference_tokens`` tokens served).

    Sardana et al. (2024), "Beyond Chinchilla-Optimal: Accounting for Inference in Language
    Model Scaling Laws", section 2. On the loss's level set ``D(N) = (B / (loss - E - A
    N^-alpha))^(1/beta)``, which needs ``N > (A / (loss - E))^(1/alpha)``; the cost falls
    and then rises in ``log N``, and :func:`golden_section_minimize` finds its minimum. With
    ``inference_tokens = 0`` it is Chinchilla's compute-optimal point for that loss.
    """
    c = get_constants(constants)
    if not (isinstance(loss, int | float) and math.isfinite(loss) and loss > c.E):
        raise ValueError(f"loss must exceed the fit's floor E = {c.E}, got {loss!r}")
    if not (isinstance(inference_tokens, int | float) and math.isfinite(inference_tokens)
            and inference_tokens >= 0):
        raise ValueError(f"inference_tokens must be finite and >= 0, got {inference_tokens!r}")
    log_n_min = math.log(c.A / (loss - c.E)) / c.alpha  # below it no D reaches the loss

    def log_cost(log_n: float) -> float:
        n = math.exp(log_n)
        d = (c.B / (loss - c.E - c.A * n**-c.alpha)) ** (1.0 / c.beta)
        return math.log(6.0 * n * d + 2.0 * n * inference_tokens)

    lo = log_n_min + 1e-9
    log_n = golden_section_minimize(log_cost, lo, lo + math.log(1e8), tol=1e-12)
    n = math.exp(log_n)
    return n, (c.B / (loss - c.E - c.A * n**-c.alpha)) ** (1.0 / c.beta)


def inference_breakeven_tokens(N: float, D: float,
                               constants: str | ChinchillaConstants = "besiroglu2024") -> float:
    """The tokens served ``D_inf`` for which a model of ``N`` parameters trained on ``D`` tokens
    is the inference-optimal way (:func:`inference_optimal`) to reach its own loss:

        D_inf = 3 D (alpha A N^-alpha / (beta B D^-beta) - 1)

    (the first-order condition of ``6 N D + 2 N D_inf`` on the level set of ``L(N, D)``,
    derived in notebooks/11_scaling_laws). Zero at the compute-optimal balance; negative when
    the model is larger than compute-optimal, so that no amount of inference makes it optimal.
    """
    c = get_constants(constants)
    n, d = float(_check_positive("N", N)), float(_check_positive("D", D))
    return 3.0 * d * (c.alpha * c.A * n**-c.alpha / (c.beta * c.B * d**-c.beta) - 1.0)


def fit_isoflop_parabola(N: object, loss: object, points: int | None = None
                         ) -> tuple[float, np.ndarray]:
    """Fit ``loss = c2 u^2 + c1 u + c0`` with ``u = log N`` (least squares) and return the
    vertex ``N_opt = exp(-c1 / (2 c2))`` and ``(c2, c1, c0)``.

    One iso-FLOP profile (Hoffmann et al., 2022, section 3.2, approach 2): the final losses
    of several model sizes trained with the same compute. A profile is a parabola only near
    its bottom; ``points`` = k fits only the k sizes nearest (in ``log N``) to the size with
    the lowest loss, that one included (default: all). Needs at least 3 distinct sizes and a
    parabola that opens upwards (``c2 > 0``), else ``ValueError``.
    """
    n = _as_1d_positive("N", N)
    y = np.asarray(loss, dtype=float)
    if y.shape != n.shape:
        raise ValueError(f"loss must have the shape of N {n.shape}, got {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError("loss must be finite")
    if points is not None:
        if isinstance(points, bool) or not isinstance(points, int) or not 3 <= points <= n.size:
            raise ValueError(f"points must be an int from 3 to the number of sizes ({n.size}), got {points!r}")
        u_best = math.log(n[int(np.argmin(y))])
        keep = np.argsort(np.abs(np.log(n) - u_best), kind="stable")[:points]
        n, y = n[keep], y[keep]
    if np.unique(n).size < 3:
        raise ValueError(f"need at least 3 distinct sizes N to fit a parabola, got {np.unique(n).size}")
    coeffs = np.polyfit(np.log(n), y, 2)
    if coeffs[0] <= 0:
        raise ValueError(f"the profile does not curve upwards (c2 = {coeffs[0]:.3g}): no minimum")
    return float(math.exp(-coeffs[1] / (2 * coeffs[0]))), coeffs


ISOFLOP_RESULTS = data_path("scaling", "isoflop_sweep.json")
SIZE_SWEEP_RESULTS = data_path("scaling", "size_sweep.json")


def _train_and_score(d_model: int, n_layers: int, steps: int, batch_size: int, context_length: int,
                     warmup_steps: int, train_tokens: Any, val_tokens: Any, seed: int) -> dict[str, Any]:
    """Train one Llama-style model of chapter 11's sweeps (V = 16, heads of width 8, or one head
    below d = 16; lr 1e-2 -> 1e-3, no weight decay) and score it on held-out windows from
    position 2 (nats/token). Returns its sizes and validation loss."""
    import torch

    from llmbook.nbtools import seed_everything
    from llmbook.training.train import TrainConfig, evaluate, train
    from llmbook.transformer.model import TransformerConfig, TransformerLM
    from llmbook.transformer.sizing import parameter_shares

    config = TransformerConfig.llama_style(vocab_size=16, d_model=d_model, n_layers=n_layers,
                                           n_heads=max(1, d_model // 8), max_seq_len=context_length)
    shares = parameter_shares(config)
    seed_everything(seed)
    model = TransformerLM(config, generator=torch.Generator().manual_seed(seed))
    cfg = TrainConfig(steps=steps, batch_size=batch_size, context_length=context_length,
                      lr=1e-2, min_lr=1e-3, warmup_steps=warmup_steps,
                      weight_decay=0.0, eval_every=None, seed=seed)
    train(model, train_tokens, None, cfg)
    val = evaluate(model, val_tokens, batch_size=64, context_length=context_length,
                   num_batches=24, first_position=2)  # the same windows for every model
    return {"d_model": d_model, "n_layers": n_layers, "N": shares["total"] - shares["embeddings"],
            "N_total": shares["total"], "steps": steps, "D": steps * batch_size * context_length,
            "seed": seed, "val_loss": round(val, 4)}


def isoflop_sweep(budgets: Sequence[float] = (1e10, 3e10, 1e11),
                  widths: Sequence[int] = (12, 16, 24, 32, 48, 64),
                  batch_size: int = 64, context_length: int = 32, max_steps: int = 2500,
                  seed: int = 0, log: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train the iso-FLOP runs of chapter 11 on the synthetic source and return their results.

    For each budget C (FLOPs) and each width d, a one-layer Llama-style model (heads of width
    8, or one head below d = 16) with N non-embedding parameters trains for
    ``round(C / (6 N B T))`` steps (so ``6 N D = C``; Kaplan's count, non-embedding N) with a
    warmup + cosine schedule as long as the run, at the sweep settings of section 11.3,
    and is scored on held-out windows from position 2 (nats/token). Runs that would take more
    than ``max_steps`` or fewer than 10 steps are skipped. One thread, seeded: the same
    numbers on one machine, close (not bit-equal) on another. ``log(run)``, if given, is called
    with each run's record as it finishes (progress).
    """
    import torch

    from llmbook.text.data import default_source
    from llmbook.transformer.model import TransformerConfig
    from llmbook.transformer.sizing import parameter_shares

    torch.set_num_threads(1)
    source = default_source()
    train_tokens, val_tokens = source.train_val(num_train=400_000, num_val=50_000, seed=seed)
    runs = []
    for C in budgets:
        for d in widths:
            shares = parameter_shares(TransformerConfig.llama_style(
                vocab_size=16, d_model=d, n_layers=1, n_heads=max(1, d // 8), max_seq_len=context_length))
            steps = round(C / (6 * (shares["total"] - shares["embeddings"]) * batch_size * context_length))
            if not 10 <= steps <= max_steps:
                continue
            run = _train_and_score(d, 1, steps, batch_size, context_length, max(1, steps // 10),
                                   train_tokens, val_tokens, seed)
            runs.append({"C": C, "d_model": d, "N": run["N"], "steps": steps, "D": run["D"],
                         "val_loss": run["val_loss"]})
            if log is not None:  # progress: one line per finished run
                log(runs[-1])
    return {"entropy_rate": source.entropy_rate(), "batch_size": batch_size,
            "context_length": context_length, "runs": runs,
            "made_by": "python -m llmbook.training.scaling"}


def size_sweep(shapes: Sequence[tuple[int, int]] = ((8, 1), (12, 1), (16, 1), (16, 2), (24, 2),
                                                     (32, 2), (40, 2), (64, 2)),
               seeds: Sequence[int] = (0, 1, 2), steps: int = 300, batch_size: int = 32,
               context_length: int = 32,
               log: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train chapter 11's sweep of model sizes on the synthetic source and return the results.

    Every ``(d_model, n_layers)`` in ``shapes`` trains with every seed in ``seeds`` (the seed
    draws the data sample, the initialisation and the batches) for the same ``steps`` steps of
    ``batch_size x context_length`` tokens, with a warmup of a tenth of the steps and a cosine
    decay; each run is scored from position 2 of held-out windows (nats/token). One thread:
    repeatable on one machine, within about 1e-3 on another. ``data/make_scaling_sweep.py``
    writes the result to :data:`SIZE_SWEEP_RESULTS`.
    """
    import torch

    from llmbook.text.data import default_source

    torch.set_num_threads(1)
    source = default_source()
    runs = []
    for seed in seeds:
        train_tokens, val_tokens = source.train_val(num_train=400_000, num_val=50_000, seed=seed)
        for d, layers in shapes:
            runs.append(_train_and_score(d, layers, steps, batch_size, context_length, steps // 10,
                                         train_tokens, val_tokens, seed))
            if log is not None:
                log(runs[-1])
    return {"entropy_rate": source.entropy_rate(), "steps": steps, "batch_size": batch_size,
            "context_length": context_length, "lr": [1e-2, 1e-3], "warmup_steps": steps // 10,
            "seeds": list(seeds), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbook.training.scaling``: re-make chapter 11's iso-FLOP sweep and write its
    JSON (:data:`ISOFLOP_RESULTS` by default; about 9 minutes on 2 cores)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m llmbook.training.scaling", description=main.__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1e10, 3e10, 1e11],
                        help="compute budgets C in FLOPs")
    parser.add_argument("--widths", type=int, nargs="+", default=[12, 16, 24, 32, 48, 64],
                        help="model widths d_model tried at each budget")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, weights and batches")
    parser.add_argument("--out", type=Path, default=ISOFLOP_RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    result = isoflop_sweep(tuple(args.budgets), tuple(args.widths), seed=args.seed,
                           log=lambda run: print(f"[{time.perf_counter() - began:6.0f} s] C = {run['C']:.0e}, "
                                                 f"d = {run['d_model']:2d}: {run['steps']} steps, "
                                                 f"val loss {run['val_loss']:.4f}", flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {len(result['runs'])} runs to {args.out}")
    return 0


if __name__ == "__main__":  # re-make data/scaling/isoflop_sweep.json
    raise SystemExit(main())
