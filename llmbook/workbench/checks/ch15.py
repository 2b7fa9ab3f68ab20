"""Checks of chapter 15's exercises (notebooks/15_quantisation), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are SymPy's closed form of the uniform quantiser's SQNR, measured errors of
absmax and clipped quantisation, the book's GPTQ run on permuted columns
(:mod:`llmbook.inference.gptq`) and the E4M3/E2M1 grids of :mod:`llmbook.inference.minifloat`.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.inference.gptq import gptq_quantize, hessian_from_inputs, layer_output_error
from llmbook.workbench.checks import raises

f64 = torch.float64


def exercise_1_sqnr(solutions) -> None:
    expr, b = solutions.sqnr_db_symbolic()
    residual = sp.simplify(expr - 10 * sp.log(4 * (2 ** (b - 1) - 1) ** 2, 10))
    assert residual == 0, (
        f"expected the SQNR 10 log10(4 (2^(b-1) - 1)^2) dB, your expression differs by {residual}")
    for bits in (4, 6, 8):
        symbolic, closed = float(expr.subs(b, bits)), solutions.sqnr_db(bits)
        assert math.isclose(closed, symbolic, rel_tol=1e-6, abs_tol=1e-12), (
            f"{bits} bits: expected sqnr_db to be the symbolic expression's {symbolic!r}, got {closed!r}")
        measured = solutions.measured_sqnr_db(bits)
        assert abs(measured - closed) <= 0.1, (
            f"{bits} bits: expected the measured SQNR within 0.1 dB of {closed:.3f}, got {measured:.3f}")
    slope = solutions.sqnr_db(8) - solutions.sqnr_db(7)
    six = 20 * torch.log10(torch.tensor(2.0)).item()
    assert abs(slope - six) <= 0.1, (
        f"expected the eighth bit to add 20 log10 2 = {six:.3f} dB (to 0.1), got {slope:.3f}")


def exercise_2_clipping(solutions) -> None:
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(0), dtype=f64)
    ratio, mse = solutions.best_clip_ratio(x, 3)
    mse_absmax = float(((solutions.clipped_absmax(x, 3, 1.0) - x) ** 2).mean())
    assert ratio < 0.7 and mse < 0.5 * mse_absmax, (
        f"3 bits on a Gaussian: expected the best clip ratio below 0.7 and an error below half of "
        f"absmax's {mse_absmax:.4g}, got ratio {ratio:.3f} and error {mse:.4g}")
    ratio8, mse8 = solutions.best_clip_ratio(x, 8)
    mse8_absmax = float(((solutions.clipped_absmax(x, 8, 1.0) - x) ** 2).mean())
    assert ratio8 > ratio and mse8 <= mse8_absmax, (
        f"8 bits: expected a clip ratio above the 3-bit one ({ratio:.3f}) and an error no worse than "
        f"absmax's {mse8_absmax:.4g}, got ratio {ratio8:.3f} and error {mse8:.4g}")


def exercise_3_nf4_vs_int4(solutions) -> None:
    nf4, int4 = solutions.nf4_vs_int4_mse("normal")
    assert nf4 < 0.9 * int4, (
        f"normal weights: expected NF4's error below 0.9 x INT4's {int4:.4g}, got {nf4:.4g}")
    nf4_u, int4_u = solutions.nf4_vs_int4_mse("uniform")
    assert int4_u < nf4_u, (
        f"uniform weights: expected INT4's error below NF4's {nf4_u:.4g}, got {int4_u:.4g}")
    with raises(ValueError, match="distribution", what='nf4_vs_int4_mse("cauchy")'):
        solutions.nf4_vs_int4_mse("cauchy")


def exercise_4_act_order(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(512, 32, generator=g, dtype=f64) * torch.logspace(0, 1.5, 32, dtype=f64)
    X = X + 0.3 * X[:, :1]  # and correlated
    W = torch.randn(16, 32, generator=g, dtype=f64)
    H = hessian_from_inputs(X)
    Q = solutions.gptq_act_order(W, H, 3)
    assert Q.shape == W.shape, f"expected Q of W's shape {tuple(W.shape)}, got {tuple(Q.shape)}"
    perm = torch.argsort(torch.diag(H), descending=True)
    got, want = Q[:, perm], gptq_quantize(W[:, perm], H[perm][:, perm], 3)[0]
    assert got.dtype == want.dtype, f"expected a {want.dtype} result, got {got.dtype}"
    # torch.testing.assert_close's float64 tolerances
    assert torch.allclose(got, want, rtol=1e-7, atol=1e-7), (
        "expected GPTQ run on the columns sorted by decreasing diag(H), then put back in "
        f"place (to 1e-7), off by up to {float((got - want).abs().max()):.3g}")
    plain = layer_output_error(W, gptq_quantize(W, H, 3)[0], X)
    ordered = layer_output_error(W, Q, X)
    assert ordered < plain, (
        f"expected act-order's output error below plain GPTQ's {plain:.4g}, got {ordered:.4g}")


def exercise_5_nvfp4(solutions) -> None:
    from llmbook.inference.minifloat import E2M1, E4M3, float_grid, round_to_float

    x = torch.tensor([[3.0, -0.5, 0.2, 1.0] + [0.0] * 12], dtype=f64)
    # s = E4M3(3 / 6) = 0.5: x / s = 6, -1, 0.4 -> 0.5, 2 on E2M1's grid
    got = solutions.quantize_nvfp4(x)[0, :4].tolist()
    assert got == [3.0, -0.5, 0.25, 1.0], (
        f"expected [3, -0.5, 0.2, 1] to become [3.0, -0.5, 0.25, 1.0] (scale 0.5), got {got}")
    zeros = solutions.quantize_nvfp4(torch.zeros(2, 32, dtype=f64)).abs().sum()
    assert zeros == 0, f"expected zeros to stay zeros, got a total magnitude of {float(zeros)}"
    g = torch.Generator().manual_seed(3)
    y = torch.randn(8, 64, generator=g, dtype=f64)
    back = solutions.quantize_nvfp4(y).reshape(8, 4, 16)  # every element: an E4M3 scale x E2M1
    s = round_to_float(y.reshape(8, 4, 16).abs().amax(-1, keepdim=True) / 6, E4M3)
    assert torch.isin(s.abs().reshape(-1), float_grid(E4M3)).all()
    off = int((~torch.isin((back / s).abs().reshape(-1), float_grid(E2M1))).sum())
    assert off == 0, (
        f"expected every element to be an E4M3 block scale (absmax / 6) times an E2M1 value, "
        f"{off} of 512 are not")
    r = solutions.nvfp4_vs_mxfp4()
    assert r["nvfp4"] < 0.9 * r["mxfp4"], (
        f"expected NVFP4's error below 0.9 x MXFP4's {r['mxfp4']:.4g}, got {r['nvfp4']:.4g}")
    bits = (r["nvfp4_bits"], r["mxfp4_bits"])
    assert bits == (4.5, 4.25), f"expected 4.5 and 4.25 bits per element, got {bits}"
