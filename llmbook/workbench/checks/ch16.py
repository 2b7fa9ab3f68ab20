"""Checks of chapter 16's exercises (notebooks/16_lora), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are closed forms in SymPy, the singular values of ``torch.linalg.svdvals``
(the Eckart-Young theorem), random subspaces and ``torch.linalg.matrix_rank``.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.workbench.checks import raises

f64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def exercise_1_breakeven_ranks(solutions) -> None:
    params, memory = solutions.breakeven_ranks()
    d_in, d_out = sp.symbols("d_in d_out", positive=True, integer=True)
    residual = sp.simplify(params - d_in * d_out / (d_in + d_out))
    assert residual == 0, f"expected the parameter break-even d_in d_out / (d_in + d_out), off by {residual}"
    # mixed precision: LoRA's memory 2 d_in d_out + 16 r (d_in + d_out) equals 16 d_in d_out
    residual = sp.simplify(memory - 14 * d_in * d_out / (16 * (d_in + d_out)))
    assert residual == 0, (
        f"expected the memory break-even 14 d_in d_out / (16 (d_in + d_out)), off by {residual}")
    _, memory32 = solutions.breakeven_ranks(16, 4)  # float32: 4 bytes per frozen weight
    residual = sp.simplify(memory32 - sp.Rational(3, 4) * params)
    assert residual == 0, (
        f"expected 3/4 of the parameter break-even with 4-byte frozen weights, off by {residual}")
    p, m = solutions.breakeven_for(4096, 11008)
    want_p = sp.Rational(4096 * 11008, 4096 + 11008)
    assert p == want_p, f"expected the exact rational {want_p} for 4096 x 11008, got {p}"
    want_m = sp.Rational(14 * 4096 * 11008, 16 * (4096 + 11008))
    assert m == want_m, f"expected the exact rational {want_m} for 4096 x 11008, got {m}"
    assert 2985 < p < 2986 and 2612 < m < 2613, f"expected ranks near 2985.x and 2612.x, got {p}, {m}"
    assert m < p, f"expected the memory break-even rank {m} below the parameter one {p}"


def exercise_2_best_low_rank_is_eckart_young(solutions) -> None:
    delta = torch.randn(30, 20, generator=_gen(0), dtype=f64) @ torch.diag(
        torch.logspace(0, -2, 20, dtype=f64))
    s = torch.linalg.svdvals(delta)
    for r in (1, 4, 10):
        B, A = solutions.best_low_rank(delta, r)
        assert B.shape == (30, r) and A.shape == (r, 20), (
            f"r = {r}: expected B (30, {r}) and A ({r}, 20), got {tuple(B.shape)} and {tuple(A.shape)}")
        rank = int(torch.linalg.matrix_rank(B @ A))
        assert rank == r, f"expected B @ A of rank {r}, got rank {rank}"
        err = float(((delta - B @ A) ** 2).sum())
        tail = float((s[r:] ** 2).sum())
        assert math.isclose(err, tail, rel_tol=1e-10, abs_tol=1e-12), (
            f"r = {r}: expected the squared error to be the sum of the dropped squared singular "
            f"values, {tail!r} (Eckart-Young, to 1e-10), got {err!r}")
        randoms = [solutions.random_subspace_error(delta, r, _gen(k)) for k in range(20)]
        assert all(err <= e for e in randoms), (
            f"r = {r}: expected no random subspace to beat the best error {err:.6g}, got "
            f"{min(randoms):.6g}")
    full_B, full_A = solutions.best_low_rank(delta, 20)
    assert torch.allclose(full_B @ full_A, delta, atol=1e-12), (
        f"expected full rank 20 to give delta back (to 1e-12), off by "
        f"{float((full_B @ full_A - delta).abs().max()):.3g}")
    with raises(ValueError, match="r=", what="best_low_rank of a 30 x 20 matrix with r = 21"):
        solutions.best_low_rank(delta, 21)


def exercise_3_two_adapters(solutions) -> None:
    g = _gen(1)
    W = torch.randn(12, 9, generator=g, dtype=f64)
    a1 = (torch.randn(12, 2, generator=g, dtype=f64), torch.randn(2, 9, generator=g, dtype=f64), 4.0)
    a2 = (torch.randn(12, 3, generator=g, dtype=f64), torch.randn(3, 9, generator=g, dtype=f64), 0.5)
    one_way, other_way = solutions.merge_two(W, [a1, a2]), solutions.merge_two(W, [a2, a1])
    assert torch.allclose(one_way, other_way, atol=1e-13), (
        "expected merging the adapters in either order to give the same matrix, off by "
        f"{float((one_way - other_way).abs().max()):.3g}")
    rank = int(torch.linalg.matrix_rank(one_way - W))
    assert rank == 5, f"expected the merged update of rank r1 + r2 = 5 (generic factors), got {rank}"
    B, A = solutions.stacked_adapter([a1, a2])
    assert B.shape == (12, 5) and A.shape == (5, 9), (
        f"expected a stacked B (12, 5) and A (5, 9), got {tuple(B.shape)} and {tuple(A.shape)}")
    assert torch.allclose(W + B @ A, one_way, atol=1e-13), (
        "expected W + B @ A of the stacked adapter to equal the merged matrix, off by "
        f"{float((W + B @ A - one_way).abs().max()):.3g}")
    assert not torch.allclose(one_way, W), "expected the adapters to change W, got W back"
