"""Reference solutions to the exercises of notebooks/16_lora.

Checked by tests/test_solutions_16.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.lora import lora_memory_ratio_symbolic

# ---------------------------------------------------------------- exercise 1


def breakeven_ranks(trainable_bytes: float = 16, frozen_bytes: float = 2) -> tuple[sp.Expr, sp.Expr]:
    """The rank at which an adapter has as many parameters as W, and the rank at which
    LoRA's AdamW training memory equals full fine-tuning's, as SymPy expressions in
    ``d_in`` and ``d_out`` (mixed precision by default: t = 16 bytes per trained parameter,
    f = 2 per frozen one).

    r (d_in + d_out) = d_in d_out gives r = d_in d_out / (d_in + d_out); rho(r) = 1 gives
    t r (d_in + d_out) = (t - f) d_in d_out, r = (1 - f / t) d_in d_out / (d_in + d_out):
    7/8 of the first in mixed precision (3/4 in float32). The memory break-even rank is the
    *smaller* one: at that rank LoRA still keeps the frozen W, f bytes per entry, on top of
    its adapters, so the adapters must cost less than full fine-tuning's state by that much.
    """
    d_in, d_out, r = sp.symbols("d_in d_out r", positive=True, integer=True)
    params = sp.solve(sp.Eq(r * (d_in + d_out), d_in * d_out), r)[0]
    memory = sp.solve(sp.Eq(lora_memory_ratio_symbolic(trainable_bytes, frozen_bytes), 1), r)[0]
    return sp.simplify(params), sp.simplify(memory)


def breakeven_for(d_in: int, d_out: int) -> tuple[sp.Rational, sp.Rational]:
    """Both break-even ranks for a d_out x d_in matrix, exact (mixed precision)."""
    params, memory = breakeven_ranks()
    subs = {sp.Symbol("d_in", positive=True, integer=True): d_in,
            sp.Symbol("d_out", positive=True, integer=True): d_out}
    return params.subs(subs), memory.subs(subs)


# ---------------------------------------------------------------- exercise 2


def best_low_rank(delta: Tensor, r: int) -> tuple[Tensor, Tensor]:
    """LoRA factors B (d_out, r) and A (r, d_in) with B A the truncated SVD of ``delta``.

    By the Eckart-Young theorem B A is the best rank-r approximation in the Frobenius norm,
    with squared error the sum of the discarded squared singular values.
    """
    if delta.ndim != 2 or not 1 <= r <= min(delta.shape):
        raise ValueError(f"need a matrix and 1 <= r <= {min(delta.shape) if delta.ndim == 2 else '?'}"
                         f", got shape {tuple(delta.shape)} and r={r}")
    U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
    sqrt_s = S[:r].sqrt()
    return U[:, :r] * sqrt_s, sqrt_s[:, None] * Vh[:r]  # (d_out, r), (r, d_in)


def random_subspace_error(delta: Tensor, r: int, generator: torch.Generator) -> float:
    """Squared Frobenius error of projecting delta's columns onto a random r-dim subspace."""
    Q, _ = torch.linalg.qr(torch.randn(delta.shape[0], r, generator=generator, dtype=delta.dtype))
    return float(((delta - Q @ (Q.T @ delta)) ** 2).sum())


# ---------------------------------------------------------------- exercise 3


def merge_two(W: Tensor, adapters: list[tuple[Tensor, Tensor, float]]) -> Tensor:
    """W + sum of scaling * B @ A over the adapters (B, A, scaling), merged in the given order."""
    W = W.clone()
    for B, A, scaling in adapters:
        W += scaling * (B @ A)
    return W


def stacked_adapter(adapters: list[tuple[Tensor, Tensor, float]]) -> tuple[Tensor, Tensor]:
    """One adapter of rank r1 + r2 + ...: B = [s1 B1, s2 B2, ...], A = [A1; A2; ...]."""
    B = torch.cat([s * B for B, _, s in adapters], dim=1)  # (d_out, r1 + r2)
    A = torch.cat([A for _, A, _ in adapters], dim=0)  # (r1 + r2, d_in)
    return B, A


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
