"""The exercise solutions of notebooks/15_quantisation hold."""


import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.inference.gptq import gptq_quantize, hessian_from_inputs, layer_output_error

solutions = load_solutions("15_quantisation")

f64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_sqnr():
    expr, b = solutions.sqnr_db_symbolic()
    assert sp.simplify(expr - 10 * sp.log(4 * (2 ** (b - 1) - 1) ** 2, 10)) == 0
    for bits in (4, 6, 8):
        assert float(expr.subs(b, bits)) == pytest.approx(solutions.sqnr_db(bits))
        assert solutions.measured_sqnr_db(bits) == pytest.approx(solutions.sqnr_db(bits), abs=0.1)
    slope = solutions.sqnr_db(8) - solutions.sqnr_db(7)
    assert slope == pytest.approx(20 * torch.log10(torch.tensor(2.0)).item(), abs=0.1)


def test_exercise_2_clipping():
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(0), dtype=f64)
    ratio, mse = solutions.best_clip_ratio(x, 3)
    mse_absmax = float(((solutions.clipped_absmax(x, 3, 1.0) - x) ** 2).mean())
    assert ratio < 0.7 and mse < 0.5 * mse_absmax
    ratio8, mse8 = solutions.best_clip_ratio(x, 8)
    assert ratio8 > ratio and mse8 <= float(((solutions.clipped_absmax(x, 8, 1.0) - x) ** 2).mean())


def test_exercise_3_nf4_vs_int4():
    nf4, int4 = solutions.nf4_vs_int4_mse("normal")
    assert nf4 < 0.9 * int4
    nf4_u, int4_u = solutions.nf4_vs_int4_mse("uniform")
    assert int4_u < nf4_u
    with pytest.raises(ValueError, match="distribution"):
        solutions.nf4_vs_int4_mse("cauchy")


def test_exercise_4_act_order():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(512, 32, generator=g, dtype=f64) * torch.logspace(0, 1.5, 32, dtype=f64)
    X = X + 0.3 * X[:, :1]  # and correlated
    W = torch.randn(16, 32, generator=g, dtype=f64)
    H = hessian_from_inputs(X)
    Q = solutions.gptq_act_order(W, H, 3)
    assert Q.shape == W.shape
    perm = torch.argsort(torch.diag(H), descending=True)
    torch.testing.assert_close(Q[:, perm], gptq_quantize(W[:, perm], H[perm][:, perm], 3)[0])
    plain = layer_output_error(W, gptq_quantize(W, H, 3)[0], X)
    assert layer_output_error(W, Q, X) < plain


def test_exercise_5_nvfp4():
    from llmbook.inference.minifloat import E2M1, E4M3, float_grid, round_to_float

    x = torch.tensor([[3.0, -0.5, 0.2, 1.0] + [0.0] * 12], dtype=f64)
    # s = E4M3(3 / 6) = 0.5: x / s = 6, -1, 0.4 -> 0.5, 2 on E2M1's grid
    assert solutions.quantize_nvfp4(x)[0, :4].tolist() == [3.0, -0.5, 0.25, 1.0]
    assert solutions.quantize_nvfp4(torch.zeros(2, 32, dtype=f64)).abs().sum() == 0
    g = torch.Generator().manual_seed(3)
    y = torch.randn(8, 64, generator=g, dtype=f64)
    back = solutions.quantize_nvfp4(y).reshape(8, 4, 16)  # every element: an E4M3 scale x E2M1
    s = round_to_float(y.reshape(8, 4, 16).abs().amax(-1, keepdim=True) / 6, E4M3)
    assert torch.isin(s.abs().reshape(-1), float_grid(E4M3)).all()
    assert torch.isin((back / s).abs().reshape(-1), float_grid(E2M1)).all()
    r = solutions.nvfp4_vs_mxfp4()
    assert r["nvfp4"] < 0.9 * r["mxfp4"]
    assert (r["nvfp4_bits"], r["mxfp4_bits"]) == (4.5, 4.25)
