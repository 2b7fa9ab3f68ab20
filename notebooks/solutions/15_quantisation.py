"""Reference solutions to the exercises of notebooks/15_quantisation.

Checked by tests/test_solutions_15.py.
"""

from __future__ import annotations

import math

import sympy as sp
import torch
from torch import Tensor

from llmbook.inference.gptq import gptq_quantize
from llmbook.inference.minifloat import E2M1, E4M3, dequantize_mx, quantize_mx, round_to_float
from llmbook.inference.quant import dequantize, fake_quantize, quantize_absmax, quantize_nf4

f64 = torch.float64


# ---------------------------------------------------------------- exercise 1


def sqnr_db_symbolic() -> tuple[sp.Expr, sp.Symbol]:
    """SQNR of b-bit absmax quantisation of x ~ U[-A, A], in dB, as a SymPy expression in b.

    Var x = A²/3; Δ = A / (2^(b-1) - 1); noise Δ²/12; SQNR = 4 (2^(b-1) - 1)².
    """
    b, A = sp.symbols("b A", positive=True)
    delta = A / (2 ** (b - 1) - 1)
    signal = sp.integrate(sp.Symbol("x") ** 2 / (2 * A), (sp.Symbol("x"), -A, A))
    ratio = sp.simplify(signal / (delta**2 / 12))
    return 10 * sp.log(ratio, 10), b


def sqnr_db(bits: int) -> float:
    """The closed form 10 log10(4 (2^(b-1) - 1)²): about 6.02 dB per bit."""
    return 10 * math.log10(4 * (2 ** (bits - 1) - 1) ** 2)


def measured_sqnr_db(bits: int, n: int = 200_000, seed: int = 0) -> float:
    """SQNR measured on n uniform samples, per-tensor absmax."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g, dtype=f64) * 2 - 1
    e = dequantize(quantize_absmax(x, bits)) - x
    return float(10 * torch.log10((x**2).mean() / (e**2).mean()))


# ---------------------------------------------------------------- exercise 2


def clipped_absmax(x: Tensor, bits: int, ratio: float) -> Tensor:
    """Symmetric quantisation with the range clipped to ratio · max|x| (fake-quantised)."""
    qmax = 2 ** (bits - 1) - 1
    scale = ratio * x.abs().max() / qmax
    return torch.clamp(torch.round(x / scale), -qmax, qmax) * scale


def best_clip_ratio(x: Tensor, bits: int, grid: int = 100) -> tuple[float, float]:
    """The clip ratio in {1/grid, ..., 1} with the smallest MSE, and that MSE."""
    best = (1.0, float(((clipped_absmax(x, bits, 1.0) - x) ** 2).mean()))
    for k in range(1, grid):
        r = k / grid
        mse = float(((clipped_absmax(x, bits, r) - x) ** 2).mean())
        if mse < best[1]:
            best = (r, mse)
    return best


# ---------------------------------------------------------------- exercise 3


def nf4_vs_int4_mse(distribution: str, n_rows: int = 256, group_size: int = 64,
                    seed: int = 0) -> tuple[float, float]:
    """(MSE of NF4, MSE of symmetric int4), group-wise absmax, on Gaussian or uniform data."""
    g = torch.Generator().manual_seed(seed)
    if distribution == "normal":
        x = torch.randn(n_rows, group_size * 4, generator=g, dtype=f64)
    elif distribution == "uniform":
        x = torch.rand(n_rows, group_size * 4, generator=g, dtype=f64) * 2 - 1
    else:
        raise ValueError(f"distribution must be 'normal' or 'uniform', got {distribution!r}")
    nf4 = float(((quantize_nf4(x, group_size) - x) ** 2).mean())
    int4 = float(((fake_quantize(x, 4, group_size=group_size, symmetric=True) - x) ** 2).mean())
    return nf4, int4


# ---------------------------------------------------------------- exercise 4


def gptq_act_order(W: Tensor, H: Tensor, bits: int, damp: float = 0.01) -> Tensor:
    """GPTQ with the columns visited in order of decreasing H_jj (per-row grids).

    Permute W's columns and H's rows and columns, run GPTQ, undo the permutation: the
    columns with the largest inputs are quantised first, while the most columns are left
    to absorb their error.
    """
    perm = torch.argsort(torch.diag(H), descending=True)
    inv = torch.argsort(perm)
    Q, _ = gptq_quantize(W[:, perm], H[perm][:, perm], bits, None, damp=damp)
    return Q[:, inv]


# ---------------------------------------------------------------- exercise 5


def quantize_nvfp4(x: Tensor, block_size: int = 16) -> Tensor:
    """E2M1 elements in blocks of ``block_size`` with one E4M3 scale each (fake-quantised).

    s = round_to_float(max|x_block| / 6, E4M3) so that the block's largest value lands near
    E2M1's largest level 6; elements round_to_float(x / s, E2M1) with saturation. x (..., K),
    K a multiple of ``block_size``; returns the dequantised tensor, float64, x's shape.
    """
    blocks = x.double().reshape(*x.shape[:-1], -1, block_size)  # (..., K / B, B)
    s = round_to_float(blocks.abs().amax(-1, keepdim=True) / E2M1.max_value, E4M3)
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero block (or one below E4M3's range)
    return (round_to_float(blocks / s, E2M1) * s).reshape(x.shape)


def nvfp4_vs_mxfp4(n_rows: int = 512, seed: int = 0) -> dict[str, float]:
    """Relative RMS error of NVFP4 (blocks of 16, E4M3 scales: 4.5 bits per weight) and
    MXFP4 (blocks of 32, power-of-two scales: 4.25 bits) on standard normal data."""
    x = torch.randn(n_rows, 256, generator=torch.Generator().manual_seed(seed), dtype=f64)

    def rel(back: Tensor) -> float:
        return float((back - x).norm() / x.norm())

    return {"nvfp4": rel(quantize_nvfp4(x)), "mxfp4": rel(dequantize_mx(*quantize_mx(x))),
            "nvfp4_bits": 4 + 8 / 16, "mxfp4_bits": 4 + 8 / 32}


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
