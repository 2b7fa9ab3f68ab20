"""The exercise solutions of notebooks/16_lora hold."""

import pytest
import sympy as sp
import torch
from seeded import gen
from solution_loader import load_solutions

solutions = load_solutions("16_lora")

f64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_breakeven_ranks():
    params, memory = solutions.breakeven_ranks()
    d_in, d_out = sp.symbols("d_in d_out", positive=True, integer=True)
    assert sp.simplify(params - d_in * d_out / (d_in + d_out)) == 0
    # mixed precision: LoRA's memory 2 d_in d_out + 16 r (d_in + d_out) equals 16 d_in d_out
    assert sp.simplify(memory - 14 * d_in * d_out / (16 * (d_in + d_out))) == 0
    _, memory32 = solutions.breakeven_ranks(16, 4)  # float32: 4 bytes per frozen weight
    assert sp.simplify(memory32 - sp.Rational(3, 4) * params) == 0
    p, m = solutions.breakeven_for(4096, 11008)
    assert p == sp.Rational(4096 * 11008, 4096 + 11008)
    assert m == sp.Rational(14 * 4096 * 11008, 16 * (4096 + 11008))
    assert 2985 < p < 2986 and 2612 < m < 2613
    assert m < p  # the memory break-even rank is the smaller one


def test_exercise_2_best_low_rank_is_eckart_young():
    delta = torch.randn(30, 20, generator=gen(0), dtype=f64) @ torch.diag(
        torch.logspace(0, -2, 20, dtype=f64))
    s = torch.linalg.svdvals(delta)
    for r in (1, 4, 10):
        B, A = solutions.best_low_rank(delta, r)
        assert B.shape == (30, r) and A.shape == (r, 20)
        assert torch.linalg.matrix_rank(B @ A) == r
        err = float(((delta - B @ A) ** 2).sum())
        assert err == pytest.approx(float((s[r:] ** 2).sum()), rel=1e-10)
        assert all(err <= solutions.random_subspace_error(delta, r, gen(k)) for k in range(20))
    full_B, full_A = solutions.best_low_rank(delta, 20)
    assert torch.allclose(full_B @ full_A, delta, atol=1e-12)
    with pytest.raises(ValueError, match="r="):
        solutions.best_low_rank(delta, 21)


def test_exercise_3_two_adapters():
    g = gen(1)
    W = torch.randn(12, 9, generator=g, dtype=f64)
    a1 = (torch.randn(12, 2, generator=g, dtype=f64), torch.randn(2, 9, generator=g, dtype=f64), 4.0)
    a2 = (torch.randn(12, 3, generator=g, dtype=f64), torch.randn(3, 9, generator=g, dtype=f64), 0.5)
    one_way, other_way = solutions.merge_two(W, [a1, a2]), solutions.merge_two(W, [a2, a1])
    assert torch.allclose(one_way, other_way, atol=1e-13)
    assert torch.linalg.matrix_rank(one_way - W) == 5  # r1 + r2 for generic factors
    B, A = solutions.stacked_adapter([a1, a2])
    assert B.shape == (12, 5) and A.shape == (5, 9)
    assert torch.allclose(W + B @ A, one_way, atol=1e-13)
    assert not torch.allclose(one_way, W)  # the adapters do change W
