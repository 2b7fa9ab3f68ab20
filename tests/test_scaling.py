"""Tests for llmbook.training.scaling: power-law fits, C = 6ND, Chinchilla's compute-optimal allocation."""

import json
import math

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from llmbook.training.scaling import (
    CHINCHILLA_CONSTANTS,
    ISOFLOP_RESULTS,
    MUENNIGHOFF_R_STAR,
    SIZE_SWEEP_RESULTS,
    ChinchillaConstants,
    PowerLawFit,
    chinchilla_loss,
    compute_optimal,
    counted_training_flops,
    effective_data,
    fit_isoflop_parabola,
    fit_power_law,
    get_constants,
    golden_section_minimize,
    inference_breakeven_tokens,
    inference_optimal,
    isoflop_sweep,
    optimal_exponents,
    predict_power_law,
    size_sweep,
    tokens_per_parameter,
    training_flops,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.transformer.sizing import flops_per_token, flops_per_token_symbolic, parameter_shares

BUDGETS = [1e18, 1e19, 1e20, 1e21, 1e22, 5.76e23, 1e24, 1e25]

# ---------------------------------------------------------------- fit_power_law


def test_fit_power_law_worked_example():
    fit = fit_power_law([1.0, 2.0, 4.0, 8.0], [3.0, 3.0 / 2**0.5, 1.5, 3.0 / 8**0.5])
    assert isinstance(fit, PowerLawFit)
    assert fit.a == pytest.approx(3.0, rel=1e-14)
    assert fit.alpha == pytest.approx(0.5, rel=1e-14)
    assert fit.E == 0.0 and not fit.offset_fitted
    assert fit.r_squared == pytest.approx(1.0, abs=1e-14)
    assert np.max(np.abs(fit.residuals)) < 1e-14
    assert fit.predict(16.0) == pytest.approx(0.75, rel=1e-14)
    assert fit.predict(np.array([[1.0, 4.0]])).shape == (1, 2)


def test_fit_power_law_matches_numpy_polyfit():
    rng = np.random.default_rng(3)
    x = np.logspace(1, 5, 11)
    y = 7.0 * x**-0.37 * np.exp(0.05 * rng.standard_normal(11))
    fit = fit_power_law(x, y)
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    assert fit.alpha == pytest.approx(-slope, rel=1e-12)
    assert fit.a == pytest.approx(math.exp(intercept), rel=1e-12)
    r = np.corrcoef(np.log(x), np.log(y))[0, 1]
    assert fit.r_squared == pytest.approx(r**2, rel=1e-12)  # R^2 of a line = squared correlation
    assert 0.9 < fit.r_squared < 1.0


@settings(max_examples=40, deadline=None)
@given(a=st.floats(1e-3, 1e3), alpha=st.floats(-1.5, 1.5), lo=st.floats(-3, 3),
       span=st.floats(0.5, 8), n=st.integers(2, 20))
def test_fit_power_law_recovers_exact_power_law(a, alpha, lo, span, n):
    x = np.logspace(lo, lo + span, n)
    fit = fit_power_law(x, a * x ** (-alpha))
    assert fit.alpha == pytest.approx(alpha, abs=1e-9)
    assert fit.a == pytest.approx(a, rel=1e-8)
    assert np.max(np.abs(fit.residuals)) < 1e-9


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.1, 100), alpha=st.floats(0.05, 1.0), sigma=st.floats(0.001, 0.1),
       seed=st.integers(0, 2**32 - 1))
def test_fit_power_law_noisy_within_standard_error(a, alpha, sigma, seed):
    """Multiplicative log-normal noise: the fitted slope is within 6 standard errors."""
    rng = np.random.default_rng(seed)
    x = np.logspace(2, 7, 30)
    y = a * x ** (-alpha) * np.exp(sigma * rng.standard_normal(x.size))
    fit = fit_power_law(x, y)
    u = np.log(x)
    se = sigma / math.sqrt(np.sum((u - u.mean()) ** 2))  # standard error of the slope
    assert abs(fit.alpha - alpha) < 6 * se
    assert fit.r_squared <= 1.0


@settings(max_examples=25, deadline=None)
@given(E=st.floats(0.1, 3.0), a=st.floats(0.5, 50), alpha=st.floats(0.1, 0.8))
def test_fit_power_law_with_offset_given_and_fitted(E, a, alpha):
    x = np.logspace(2, 8, 9)
    y = E + a * x ** (-alpha)
    given_fit = fit_power_law(x, y, offset=E)
    assert given_fit.alpha == pytest.approx(alpha, rel=1e-7)
    assert given_fit.a == pytest.approx(a, rel=1e-6)
    fitted = fit_power_law(x, y, offset="fit")
    assert fitted.offset_fitted
    assert fitted.E == pytest.approx(E, rel=1e-5)
    assert fitted.alpha == pytest.approx(alpha, rel=1e-4)
    assert np.allclose(fitted.predict(x), y, rtol=1e-7)


def test_fit_power_law_offset_fit_noisy():
    rng = np.random.default_rng(0)
    x = np.logspace(3, 9, 13)
    y = (1.7 + 40 * x**-0.3) * np.exp(0.002 * rng.standard_normal(13))
    fit = fit_power_law(x, y, offset="fit")
    assert fit.E == pytest.approx(1.7, abs=0.02)
    assert fit.alpha == pytest.approx(0.3, abs=0.03)
    # ignoring the offset bends the line: a much worse straight-line fit
    assert fit_power_law(x, y).r_squared < 0.95 < fit.r_squared


@pytest.mark.parametrize("x, y, offset, match", [
    ([1.0, -2.0, 3.0], [1.0, 2.0, 3.0], None, r"x\[1\] = -2\.0"),
    ([1.0, 2.0, 0.0], [1.0, 2.0, 3.0], None, r"x\[2\] = 0\.0"),
    ([1.0, 2.0, 3.0], [1.0, 0.0, 3.0], None, r"y\[1\] = 0\.0"),
    ([1.0, 2.0, 3.0], [1.0, float("nan"), 3.0], None, r"y\[1\] = nan"),
    ([1.0, 2.0, 3.0], [1.0, 2.0], None, "same length, got 3 and 2"),
    ([1.0], [1.0], None, "at least 2 points, got 1"),
    ([2.0, 2.0], [1.0, 3.0], None, "all equal"),
    ([1.0, 2.0], [3.0, 1.0], "fit", "at least 3 points, got 2"),
    ([1.0, 2.0, 3.0], [3.0, 2.0, 1.5], "magic", "offset must be None, a number or 'fit'"),
    ([1.0, 2.0, 3.0], [3.0, 2.0, 1.5], 1.5, r"exceed the offset 1\.5, got y\[2\] = 1\.5"),
    ([[1.0, 2.0]], [[3.0, 2.0]], None, "must be 1-D"),
])
def test_fit_power_law_errors(x, y, offset, match):
    with pytest.raises(ValueError, match=match):
        fit_power_law(x, y, offset=offset)


# ---------------------------------------------------------------- golden_section_minimize


def test_golden_section_minimize():
    x = golden_section_minimize(lambda t: (t - 0.3) ** 2 + 1.0, -2.0, 5.0, tol=1e-12)
    assert abs(x - 0.3) < 1e-7  # values are flat to round-off within ~sqrt(eps) of the minimum
    x = golden_section_minimize(lambda t: math.cosh(t - 1.25), 0.0, 10.0, tol=1e-10)
    assert abs(x - 1.25) < 1e-7
    assert golden_section_minimize(lambda t: t, 0.0, 1.0, tol=1e-9) < 1e-8  # boundary minimum
    for lo, hi, tol, match in [(1.0, 1.0, 1e-6, "lo < hi"), (0.0, math.inf, 1e-6, "finite"),
                               (0.0, 1.0, 0.0, "tol must be > 0")]:
        with pytest.raises(ValueError, match=match):
            golden_section_minimize(abs, lo, hi, tol=tol)


# ---------------------------------------------------------------- constants and the loss


def test_published_constants():
    h, b = get_constants("hoffmann2022"), get_constants("besiroglu2024")
    assert (h.E, h.A, h.B, h.alpha, h.beta) == (1.69, 406.4, 410.7, 0.34, 0.28)
    assert (b.E, b.A, b.B, b.alpha, b.beta) == (1.8172, 482.01, 2085.43, 0.3478, 0.3658)
    assert "Hoffmann" in h.source and "Besiroglu" in b.source
    assert set(CHINCHILLA_CONSTANTS) == {"hoffmann2022", "besiroglu2024"}
    assert get_constants(h) is h
    with pytest.raises(ValueError, match=r"known: \['besiroglu2024', 'hoffmann2022'\]"):
        get_constants("kaplan2020")
    with pytest.raises(TypeError, match="got int"):
        get_constants(3)


def test_chinchilla_loss_worked_example():
    # Chinchilla itself: 70B parameters, 1.4T tokens
    want = 1.69 + 406.4 / 70e9**0.34 + 410.7 / 1.4e12**0.28
    assert chinchilla_loss(70e9, 1.4e12, "hoffmann2022") == pytest.approx(want, rel=1e-15)
    assert chinchilla_loss(70e9, 1.4e12, "hoffmann2022") == pytest.approx(1.93665, abs=1e-5)
    assert chinchilla_loss(70e9, 1.4e12, "besiroglu2024") == pytest.approx(1.97388, abs=1e-5)
    assert isinstance(chinchilla_loss(1e9, 1e10), float)
    custom = ChinchillaConstants(E=1.0, A=2.0, B=3.0, alpha=1.0, beta=0.5, source="test")
    assert chinchilla_loss(4.0, 9.0, custom) == pytest.approx(1.0 + 0.5 + 1.0)


def test_chinchilla_loss_arrays_broadcast_and_decrease():
    N = np.logspace(6, 11, 4)[:, None]  # (4, 1)
    D = np.logspace(8, 13, 3)[None, :]  # (1, 3)
    grid = chinchilla_loss(N, D, "besiroglu2024")
    assert grid.shape == (4, 3)
    assert np.all(np.diff(grid, axis=0) < 0) and np.all(np.diff(grid, axis=1) < 0)
    assert np.all(grid > get_constants("besiroglu2024").E)
    assert grid[2, 1] == chinchilla_loss(N[2, 0], D[0, 1], "besiroglu2024")


@pytest.mark.parametrize("N, D, match", [
    (0.0, 1e9, r"N must be finite and positive, got 0\.0"),
    (1e9, -5.0, r"D must be finite and positive, got -5\.0"),
    (np.array([1e9, np.inf]), 1e9, r"got inf \(at flat index 1\)"),
    (np.ones(3), np.ones(2), r"shape \(3,\) and D of shape \(2,\) do not broadcast"),
])
def test_chinchilla_loss_errors(N, D, match):
    with pytest.raises(ValueError, match=match):
        chinchilla_loss(N, D)


# ---------------------------------------------------------------- compute-optimal allocation


def test_lagrange_derivation_equals_closed_form():
    """Re-derive the optimum in SymPy: stationary point of the Lagrangian, then N from 6ND = C."""
    N, D, C, A, B, E, al, be, lam = sp.symbols("N D C A B E alpha beta lambda", positive=True)
    lagrangian = E + A / N**al + B / D**be + lam * (6 * N * D - C)
    dN, dD = sp.diff(lagrangian, N), sp.diff(lagrangian, D)
    lam_star = sp.solve(dN, lam)[0]
    balance = sp.simplify(dD.subs(lam, lam_star))  # alpha A / N^alpha = beta B / D^beta, / D
    (N_star,) = sp.solve(balance.subs(D, C / (6 * N)), N)
    G = (al * A / (be * B)) ** (1 / (al + be))
    assert sp.simplify(N_star - G * (C / 6) ** (be / (al + be))) == 0
    D_star = C / (6 * N_star)
    assert sp.simplify(sp.powsimp(D_star / (G**-1 * (C / 6) ** (al / (al + be))), force=True)) == 1
    # and the numbers of compute_optimal are this expression evaluated
    for name in CHINCHILLA_CONSTANTS:
        c = get_constants(name)
        values = {A: c.A, B: c.B, al: c.alpha, be: c.beta, C: 1e21}
        assert compute_optimal(1e21, c)[0] == pytest.approx(float(N_star.subs(values)), rel=1e-12)


def numeric_optimum(C, name):
    """argmin over N of L(N, C / 6N) - E by golden-section search on log N (E moves nothing)."""
    c = get_constants(name)

    def reducible(log_n):
        n = math.exp(log_n)
        return c.A * n**-c.alpha + c.B * (C / (6 * n)) ** -c.beta

    return math.exp(golden_section_minimize(reducible, math.log(1e2), math.log(C / 6 / 1e2),
                                            tol=1e-12))


@pytest.mark.parametrize("name", sorted(CHINCHILLA_CONSTANTS))
@pytest.mark.parametrize("C", BUDGETS)
def test_compute_optimal_matches_numeric_minimisation(name, C):
    N_opt, D_opt = compute_optimal(C, name)
    assert abs(numeric_optimum(C, name) / N_opt - 1) < 1e-6
    assert training_flops(N_opt, D_opt) == pytest.approx(C, rel=1e-12)
    c = get_constants(name)  # the balance condition at the optimum
    assert c.alpha * c.A / N_opt**c.alpha == pytest.approx(c.beta * c.B / D_opt**c.beta, rel=1e-10)
    # perturbing N along the budget curve can only increase the loss
    best = chinchilla_loss(N_opt, D_opt, name)
    for k in (0.5, 0.9, 1.1, 2.0):
        assert chinchilla_loss(k * N_opt, D_opt / k, name) > best


def test_compute_optimal_exponents_and_arrays():
    budgets = np.array(BUDGETS)
    for name in CHINCHILLA_CONSTANTS:
        a, b = optimal_exponents(name)
        assert a + b == pytest.approx(1.0, abs=1e-15)
        N_opt, D_opt = compute_optimal(budgets, name)
        assert N_opt.shape == D_opt.shape == budgets.shape
        assert fit_power_law(budgets, 1 / N_opt).alpha == pytest.approx(a, rel=1e-10)
        assert fit_power_law(budgets, 1 / D_opt).alpha == pytest.approx(b, rel=1e-10)
        assert np.allclose(tokens_per_parameter(budgets, name), D_opt / N_opt, rtol=1e-14)
    assert optimal_exponents("hoffmann2022")[0] == pytest.approx(0.28 / 0.62, rel=1e-15)
    assert optimal_exponents("besiroglu2024")[0] == pytest.approx(0.3658 / 0.7136, rel=1e-15)


def test_tokens_per_parameter_at_chinchilla_budget():
    """The two fits at Chinchilla's compute (6 * 70e9 * 1.4e12 = 5.88e23 FLOPs)."""
    C = training_flops(70e9, 1.4e12)
    assert C == pytest.approx(5.88e23)
    h, b = tokens_per_parameter(C, "hoffmann2022"), tokens_per_parameter(C, "besiroglu2024")
    c = get_constants("hoffmann2022")
    G = (c.alpha * c.A / (c.beta * c.B)) ** (1 / (c.alpha + c.beta))
    assert h == pytest.approx(G**-2 * (C / 6) ** ((c.alpha - c.beta) / (c.alpha + c.beta)))
    assert 15 < b < 25 < 80 < h  # the replication is near 20 tokens/parameter; the original not
    # for alpha < beta (the replication) tokens/parameter falls as C grows, for alpha > beta it rises
    assert tokens_per_parameter(1e25, "besiroglu2024") < b
    assert tokens_per_parameter(1e25, "hoffmann2022") > h


@pytest.mark.parametrize("C", [0.0, -1e20, float("nan")])
def test_compute_optimal_errors(C):
    with pytest.raises(ValueError, match="C must be finite and positive"):
        compute_optimal(C)
    with pytest.raises(ValueError, match="C must be finite and positive"):
        tokens_per_parameter(C)


# ---------------------------------------------------------------- C = 6 N D


def test_training_flops():
    assert training_flops(70e9, 1.4e12) == 6 * 70e9 * 1.4e12
    assert training_flops(np.array([1.0, 2.0]), 3.0).tolist() == [18.0, 36.0]
    with pytest.raises(ValueError, match=r"N must be finite and positive, got -1\.0"):
        training_flops(-1.0, 5.0)


def n_matmul(c: TransformerConfig) -> int:
    """Parameters that take part in matrix products: all but embeddings lookups, biases, norms."""
    shares = parameter_shares(c)
    weights = shares["attention"] + shares["mlp"] + c.vocab_size * c.d_model  # + the LM head
    weights -= c.n_layers * (c.qkv_bias * (c.n_heads + 2 * c.n_kv_heads) * c.d_head
                             + c.out_bias * c.d_model)
    weights -= c.n_layers * c.mlp_bias * ((3 if c.mlp == "swiglu" else 2) - 1) * c.d_ff
    weights -= c.n_layers * c.mlp_bias * c.d_model
    return weights


@pytest.mark.parametrize("config, T", [
    (TransformerConfig.gpt2_style(), 1024),
    (TransformerConfig.llama_style(), 2048),
    (TransformerConfig.llama_style(vocab_size=16, d_model=24, n_layers=2, n_heads=2), 32),
    (TransformerConfig.gpt2_style(vocab_size=50, d_model=12, n_layers=3, n_heads=3,
                                  max_seq_len=20), 7),
])
def test_six_n_from_flops_per_token(config, T):
    """3 x forward = 6 N_mm + 3 x (attention term 4 L T H d_h): exactly, for any shape."""
    attention = 4 * config.n_layers * T * config.n_heads * config.d_head
    assert 3 * flops_per_token(config, T) == 6 * n_matmul(config) + 3 * attention


def test_attention_share_is_t_over_6d():
    """Per layer with H d_h = d and 12 d^2 weights, attention / weight FLOPs = T / (6 d)."""
    V, d, L, H, H_kv, d_h, d_ff, m, T, *_ = sp.symbols(
        "V d L H H_kv d_h d_ff m T T_max b_qkv b_o b_mlp b_n u p", integer=True, nonnegative=True)
    fwd = flops_per_token_symbolic()
    layer = {H_kv: H, d_h: d / H, V: 0, L: 1}
    for mm, ff in ((2, 4 * d), (3, sp.Rational(8, 3) * d)):  # GELU MLP, SwiGLU
        per_layer = sp.expand(fwd.subs(layer).subs({m: mm, d_ff: ff}))
        weights = per_layer.coeff(T, 0)
        assert sp.simplify(weights - 24 * d**2) == 0  # 2 x 12 d^2
        assert sp.simplify(per_layer.coeff(T, 1) * T / weights - T / (6 * d)) == 0


def test_backward_is_twice_forward_flop_counter():
    """FlopCounterMode on a tiny model: forward + backward = 3 x forward (every matmul)."""
    c = TransformerConfig.llama_style(vocab_size=11, d_model=12, n_layers=2, n_heads=3,
                                      max_seq_len=16)
    model = TransformerLM(c, generator=torch.Generator().manual_seed(0))
    model.set_fused_attention(False)  # the fused kernel is invisible to the counter
    ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as fwd:
        logits = model(ids)
    with FlopCounterMode(display=False) as both:
        loss = F.cross_entropy(model(ids).reshape(-1, 11), ids.reshape(-1))
        loss.backward()
    assert fwd.get_total_flops() == 2 * 9 * flops_per_token(c, 9)
    assert both.get_total_flops() == 3 * fwd.get_total_flops()
    assert logits.shape == (2, 9, 11)


# ---------------------------------------------------------------- iso-FLOP profiles


def test_fit_isoflop_parabola_recovers_an_exact_vertex() -> None:
    n = np.array([1e3, 3e3, 1e4, 3e4, 1e5, 3e5])  # non-square: 6 points for 3 coefficients
    u = np.log(n)
    loss = 0.07 * (u - math.log(2.5e4)) ** 2 + 1.9
    n_opt, coeffs = fit_isoflop_parabola(n, loss)
    assert n_opt == pytest.approx(2.5e4, rel=1e-10)
    assert coeffs[0] == pytest.approx(0.07, rel=1e-10)
    # independent reference: the vertex of the Lagrange polynomial through 3 of the points
    a, b, c = u[1:4]
    fa, fb, fc = loss[1:4]
    vertex = b - 0.5 * ((b - a) ** 2 * (fb - fc) - (b - c) ** 2 * (fb - fa)) / (
        (b - a) * (fb - fc) - (b - c) * (fb - fa))
    assert math.log(n_opt) == pytest.approx(vertex, abs=1e-9)


def test_fit_isoflop_parabola_near_compute_optimal_on_a_chinchilla_profile() -> None:
    C = 1e21
    n_star, _ = compute_optimal(C, "besiroglu2024")
    n = n_star * np.logspace(-0.3, 0.3, 7)
    n_opt, _ = fit_isoflop_parabola(n, chinchilla_loss(n, C / (6 * n), "besiroglu2024"))
    assert n_opt == pytest.approx(n_star, rel=0.02)  # a parabola, not the exact profile


def test_fit_isoflop_parabola_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="3 distinct"):
        fit_isoflop_parabola([1e3, 1e4], [2.0, 1.9])
    with pytest.raises(ValueError, match="shape"):
        fit_isoflop_parabola([1e3, 1e4, 1e5], [2.0, 1.9])
    with pytest.raises(ValueError, match="curve upwards"):
        fit_isoflop_parabola([1e3, 1e4, 1e5], [1.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="^N must be finite and positive"):
        fit_isoflop_parabola([-1e3, 1e4, 1e5], [2.0, 1.9, 2.0])
    with pytest.raises(ValueError, match="points"):
        fit_isoflop_parabola([1e3, 1e4, 1e5], [2.0, 1.9, 2.0], points=2)


def test_fit_isoflop_parabola_points_keeps_the_bottom() -> None:
    # a parabola near its bottom, far points that flatten out (as real profiles do)
    n = np.array([1e2, 1e3, 3e3, 1e4, 3e4, 1e5, 1e7])
    u = np.log(n)
    loss = 0.05 * (u - math.log(1e4)) ** 2 + 2.0
    loss[0], loss[-1] = 2.5, 2.6  # not on the parabola
    n_opt, _ = fit_isoflop_parabola(n, loss, points=5)
    assert n_opt == pytest.approx(1e4, rel=1e-9)
    assert fit_isoflop_parabola(n, loss)[0] != pytest.approx(1e4, rel=1e-3)  # all 7: pulled away


def test_isoflop_sweep_runs_spend_their_budget() -> None:
    out = isoflop_sweep(budgets=(3e7,), widths=(8, 16), batch_size=4, context_length=8, max_steps=200)
    assert [r["d_model"] for r in out["runs"]] == [8, 16]
    for r in out["runs"]:
        assert r["D"] == r["steps"] * 4 * 8
        assert 6 * r["N"] * r["D"] == pytest.approx(3e7, rel=0.05)
        assert 1.5 < r["val_loss"] < 3.0  # between the entropy rate and log 16 (+ margin)


def test_shipped_isoflop_results_are_consistent() -> None:
    data = json.loads(ISOFLOP_RESULTS.read_text())
    budgets = sorted({r["C"] for r in data["runs"]})
    assert len(budgets) >= 3
    n_opts = []
    for C in budgets:
        runs = [r for r in data["runs"] if r["C"] == C]
        for r in runs:
            assert 6 * r["N"] * r["D"] == pytest.approx(C, rel=0.05)
        n_opts.append(fit_isoflop_parabola([r["N"] for r in runs], [r["val_loss"] for r in runs], points=3)[0])
    assert all(a < b for a, b in zip(n_opts, n_opts[1:], strict=False))  # N_opt grows with the budget


def test_scaling_command_runs_a_small_sweep_with_progress(tmp_path, capsys):
    from llmbook.training.scaling import main

    out = tmp_path / "sweep.json"
    # d = 12 has N = 1764 non-embedding parameters: C = 6 N B T x 12 gives 12 steps
    assert main(["--budgets", "260112384", "--widths", "12", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["d_model"], r["steps"], r["N"]) for r in runs] == [(12, 12, 1764)]
    printed = capsys.readouterr().out
    assert "C = 3e+08, d = 12: 12 steps, val loss" in printed and f"wrote 1 runs to {out}" in printed


# ---------------------------------------------------------------- issue 27: intervals, counted FLOPs, size sweep


def test_predict_power_law_worked_example():
    # log y = log 2 - 0.5 log x + e with residuals e = (0.1, -0.1, -0.1, 0.1) at x = 1, e, e^2, e^3
    u = np.arange(4.0)
    e = np.array([0.1, -0.1, -0.1, 0.1])
    out = predict_power_law(np.exp(u), 2.0 * np.exp(-0.5 * u + e), [math.exp(5.0)], level=0.9)
    # e is orthogonal to 1 and to u - 1.5, so the fit is exact: alpha = 0.5, a = 2, SS_res = 0.04
    assert out.fit.alpha == pytest.approx(0.5, rel=1e-12) and out.fit.a == pytest.approx(2.0, rel=1e-12)
    s, t = math.sqrt(0.04 / 2), 2.919985580355516  # t_{0.95, 2}
    assert out.alpha_interval == pytest.approx((0.5 - t * s / math.sqrt(5.0), 0.5 + t * s / math.sqrt(5.0)))
    half = t * s * math.sqrt(1 + 1 / 4 + (5 - 1.5) ** 2 / 5.0)
    assert out.predicted == pytest.approx([2.0 * math.exp(-2.5)], rel=1e-12)
    assert out.lower == pytest.approx([2.0 * math.exp(-2.5 - half)], rel=1e-12)
    assert out.upper == pytest.approx([2.0 * math.exp(-2.5 + half)], rel=1e-12)


def test_predict_power_law_matches_scipy_linregress():
    from scipy import stats

    rng = np.random.default_rng(5)
    x = np.logspace(1, 4, 9)
    y = 0.7 + 3.0 * x**-0.4 * np.exp(0.1 * rng.standard_normal(9))
    out = predict_power_law(x, y, [2e4, 5e4, 1e5], offset=0.7, averaged=3)
    r = stats.linregress(np.log(x), np.log(y - 0.7))
    t = stats.t.ppf(0.975, 7)
    assert out.alpha_interval == pytest.approx((-r.slope - t * r.stderr, -r.slope + t * r.stderr), rel=1e-10)
    assert out.predicted == pytest.approx(0.7 + np.exp(r.intercept + r.slope * np.log([2e4, 5e4, 1e5])), rel=1e-10)
    assert np.all(out.lower < out.predicted) and np.all(out.predicted < out.upper)
    wider = predict_power_law(x, y, [2e4, 5e4, 1e5], offset=0.7)  # one new point: a wider interval
    assert np.all(wider.upper - wider.lower > out.upper - out.lower)


def test_predict_power_law_covers_at_its_level():
    """Over many simulated data sets, the 90% intervals cover the true exponent and a new
    observation about 90% of the time (binomial standard deviation 0.0095 at 1,000 trials)."""
    rng = np.random.default_rng(0)
    x = np.logspace(2, 4, 6)
    x_new = 3e4
    hits_alpha = hits_new = 0
    for _ in range(1000):
        y = 5.0 * x**-0.3 * np.exp(0.05 * rng.standard_normal(6))
        y_new = 5.0 * x_new**-0.3 * math.exp(0.05 * rng.standard_normal())
        out = predict_power_law(x, y, [x_new], level=0.9)
        hits_alpha += out.alpha_interval[0] <= 0.3 <= out.alpha_interval[1]
        hits_new += out.lower[0] <= y_new <= out.upper[0]
    assert abs(hits_alpha / 1000 - 0.9) < 4 * 0.0095
    assert abs(hits_new / 1000 - 0.9) < 4 * 0.0095


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"level": 1.0}, ValueError, "level"),
    ({"averaged": 0}, ValueError, "averaged"),
    ({"offset": "fit"}, TypeError, "offset"),
])
def test_predict_power_law_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        predict_power_law([1.0, 2.0, 4.0], [1.0, 0.7, 0.5], [8.0], **kwargs)
    with pytest.raises(ValueError, match="at least 3"):
        predict_power_law([1.0, 2.0], [1.0, 0.7], [8.0])
    with pytest.raises(ValueError, match="x_new"):
        predict_power_law([1.0, 2.0, 4.0], [1.0, 0.7, 0.5], [-8.0])


@pytest.mark.parametrize(("config", "T"), [
    (TransformerConfig.llama_style(vocab_size=16, d_model=24, n_layers=2, n_heads=3, n_kv_heads=1,
                                   max_seq_len=40), 40),
    (TransformerConfig.gpt2_style(vocab_size=50, d_model=32, n_layers=3, n_heads=4, max_seq_len=64), 17),
])
def test_counted_training_flops_equal_real_counter_and_closed_form(config, T):
    counted = counted_training_flops(config, T)
    assert counted == 3 * T * flops_per_token(config, T)  # the closed form of chapter 7
    model = TransformerLM(config, generator=torch.Generator().manual_seed(0))  # real tensors, same count
    model.set_fused_attention(False)
    ids = torch.randint(0, config.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(ids).reshape(-1, config.vocab_size), ids.reshape(-1)).backward()
    assert counted == counter.get_total_flops()


def test_counted_training_flops_errors():
    config = TransformerConfig.llama_style(vocab_size=16, d_model=8, n_layers=1, n_heads=1, max_seq_len=8)
    with pytest.raises(TypeError, match="config"):
        counted_training_flops({"d_model": 8}, 4)
    for bad in (0, 9, 4.0, True):
        with pytest.raises(ValueError, match="seq_len"):
            counted_training_flops(config, bad)


def test_size_sweep_runs_every_shape_and_seed():
    out = size_sweep(shapes=((8, 1), (16, 2)), seeds=(0, 1), steps=4, batch_size=4, context_length=8)
    assert [(r["d_model"], r["n_layers"], r["seed"]) for r in out["runs"]] == [
        (8, 1, 0), (16, 2, 0), (8, 1, 1), (16, 2, 1)]
    assert [r["N"] for r in out["runs"][:2]] == [1048, 8272]  # non-embedding counts, as in chapter 11
    assert out["runs"][0]["N_total"] == 1048 + 2 * 16 * 8
    assert all(r["D"] == 4 * 4 * 8 and 1.5 < r["val_loss"] < 3.5 for r in out["runs"])
    assert out["runs"][0]["val_loss"] != out["runs"][2]["val_loss"]  # another seed, another run


def test_shipped_size_sweep_is_consistent():
    data = json.loads(SIZE_SWEEP_RESULTS.read_text())
    assert data["made_by"] == "data/make_scaling_sweep.py" and "cpu" in data["made"]
    shapes = sorted({(r["d_model"], r["n_layers"]) for r in data["runs"]})
    assert len(data["runs"]) == len(shapes) * len(data["seeds"]) >= 12
    for r in data["runs"]:
        assert data["entropy_rate"] < r["val_loss"] < math.log(16)
        assert r["D"] == data["steps"] * data["batch_size"] * data["context_length"]


# ---------------------------------------------------------------- issue 27: data-constrained and inference-aware


def test_effective_data_worked_examples():
    assert MUENNIGHOFF_R_STAR == 15.4
    assert effective_data(1e9, 1e9) == pytest.approx(1e9, rel=1e-15)  # one epoch: all fresh
    # four epochs: R = 3, D' = U (1 + 15.4 (1 - e^(-3/15.4))) = 3.725877... U
    assert effective_data(1e9, 4e9) == pytest.approx(1e9 * (1 + 15.4 * (1 - math.exp(-3 / 15.4))), rel=1e-14)
    assert effective_data(1e9, 4e9) / 4e9 == pytest.approx(0.931469, abs=1e-6)
    assert effective_data(1.0, 1e6) == pytest.approx(16.4, rel=1e-12)  # saturates at U (1 + R*)
    assert effective_data(np.array([1.0, 2.0]), np.array([[3.0], [4.0]])).shape == (2, 2)


def test_effective_data_is_the_integral_of_decaying_repetitions():
    """D' = U + U * integral_0^R exp(-k / R*) dk, by scipy's quadrature."""
    from scipy.integrate import quad

    for epochs, r_star in ((1.5, 15.4), (4.0, 15.4), (40.0, 15.4), (7.0, 3.0)):
        integral, _ = quad(lambda k, rs=r_star: math.exp(-k / rs), 0.0, epochs - 1.0)
        assert effective_data(2.5, 2.5 * epochs, r_star) == pytest.approx(2.5 * (1 + integral), rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.floats(1e6, 1e12), st.floats(1.0, 1e3), st.floats(0.5, 50.0))
def test_effective_data_between_unique_and_total(u, epochs, r_star):
    d_eff = effective_data(u, u * epochs, r_star)
    assert u * (1 - 1e-12) <= d_eff <= u * epochs * (1 + 1e-12)  # never worse than U, never better than D
    assert d_eff <= u * (1 + r_star) * (1 + 1e-12)
    assert effective_data(u, u * epochs * 1.5, r_star) >= d_eff  # more repetitions never lose value


@pytest.mark.parametrize(("args", "match"), [
    ((2.0, 1.0), "total_tokens must be >="),
    ((0.0, 1.0), "unique_tokens"),
    ((1.0, 2.0, 0.0), "r_star"),
    ((1.0, 2.0, True), "r_star"),
])
def test_effective_data_errors(args, match):
    with pytest.raises(ValueError, match=match):
        effective_data(*args)


@pytest.mark.parametrize("name", sorted(CHINCHILLA_CONSTANTS))
def test_inference_optimal_without_inference_is_compute_optimal(name):
    """With D_inf = 0 the optimum is Chinchilla's for the same loss: found here by bisecting
    the budget C until the compute-optimal loss equals the target."""
    target = 2.3
    lo, hi = math.log(1e15), math.log(1e28)
    for _ in range(200):
        mid = (lo + hi) / 2
        if chinchilla_loss(*compute_optimal(math.exp(mid), name), name) > target:
            lo = mid
        else:
            hi = mid
    n_ref, d_ref = compute_optimal(math.exp(lo), name)
    n, d = inference_optimal(target, 0.0, name)
    assert n == pytest.approx(n_ref, rel=1e-6) and d == pytest.approx(d_ref, rel=1e-6)
    assert chinchilla_loss(n, d, name) == pytest.approx(target, rel=1e-12)


@pytest.mark.parametrize("name", sorted(CHINCHILLA_CONSTANTS))
def test_inference_optimal_matches_scipy_and_breakeven(name):
    from scipy.optimize import minimize_scalar

    c = get_constants(name)
    target, d_inf = 2.4, 1e13
    n, d = inference_optimal(target, d_inf, name)

    def cost(log_n):
        nn = math.exp(log_n)
        rest = target - c.E - c.A * nn**-c.alpha
        return math.inf if rest <= 0 else 6 * nn * (c.B / rest) ** (1 / c.beta) + 2 * nn * d_inf

    ref = minimize_scalar(cost, bracket=(math.log(n) - 1, math.log(n), math.log(n) + 1),
                          options={"xtol": 1e-12})
    assert n == pytest.approx(math.exp(ref.x), rel=1e-5)
    assert inference_breakeven_tokens(n, d, name) == pytest.approx(d_inf, rel=1e-4)  # the round trip
    n0, d0 = inference_optimal(target, 0.0, name)
    assert n < n0 and d > d0  # serving tokens makes the best model smaller, trained longer


@settings(max_examples=25, deadline=None)
@given(st.floats(1e7, 1e11), st.floats(1.0, 1e4))
def test_inference_breakeven_round_trip(n, ratio):
    d = n * ratio
    d_inf = inference_breakeven_tokens(n, d)
    if d_inf > 0:  # smaller than compute-optimal: some amount of inference makes it optimal
        n_back, d_back = inference_optimal(chinchilla_loss(n, d, "besiroglu2024"), d_inf)
        assert n_back == pytest.approx(n, rel=1e-5) and d_back == pytest.approx(d, rel=1e-4)


def test_inference_breakeven_zero_at_compute_optimal_and_errors():
    n, d = compute_optimal(1e22, "besiroglu2024")
    assert inference_breakeven_tokens(n, d) == pytest.approx(0.0, abs=1e-8 * d)
    assert inference_breakeven_tokens(4 * n, d / 4) < 0  # over-sized: no inference makes it optimal
    with pytest.raises(ValueError, match="loss must exceed"):
        inference_optimal(1.5, 1e12)
    with pytest.raises(ValueError, match="inference_tokens"):
        inference_optimal(2.5, -1.0)
    with pytest.raises(ValueError, match="N must be"):
        inference_breakeven_tokens(0.0, 1e9)
