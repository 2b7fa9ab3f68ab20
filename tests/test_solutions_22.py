"""The exercise solutions of notebooks/22_distributed_training hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.scale.collectives import ring_all_reduce_bytes_per_rank
from llmbook.scale.pipeline import bubble_fraction

solutions = load_solutions("22_distributed_training")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_halving_doubling() -> None:
    t = solutions.halving_doubling_cost_symbolic()
    p, n, a, b = sp.symbols("p n alpha beta", positive=True)
    expected = 2 * sp.log(p, 2) * a + 2 * (1 - 1 / p) * n * b
    for pv in (2, 8, 64):
        assert sp.simplify((t - expected).subs(p, pv)) == 0
    assert solutions.crossover_bytes(2, 1e-5, 1e-9) == 0.0
    assert solutions.crossover_bytes(8, 1e-5, 1e-9) == math.inf
    with pytest.raises(ValueError, match="power of two"):
        solutions.crossover_bytes(6, 1e-5, 1e-9)


def test_exercise_2_largest_model() -> None:
    sizes = solutions.largest_model(80e9, 64)
    assert sizes[0] == pytest.approx(5e9)
    assert sizes[3] == pytest.approx(80e9 * 64 / 16)
    assert sizes[0] < sizes[1] < sizes[2] < sizes[3]
    assert sizes[1] == pytest.approx(80e9 / (4 + 12 / 64))


def test_exercise_3_static_loss_scale() -> None:
    g = torch.exp(torch.empty(10_000).uniform_(math.log(1e-10), math.log(1e-1),
                                               generator=torch.Generator().manual_seed(0)))
    s = solutions.largest_safe_scale(g)
    assert s == 2.0**19  # 65504 / 0.1 ~ 6.6e5, largest power of two below: 2^19
    assert torch.isfinite((g * s).half()).all() and not torch.isfinite((g * 2 * s).half()).all()
    plain, scaled = solutions.underflow_fraction(g, 1.0), solutions.underflow_fraction(g, s)
    assert 0.25 < plain < 0.4 and scaled < 0.05 and scaled < plain
    with pytest.raises(ValueError, match="finite"):
        solutions.largest_safe_scale(torch.zeros(3))


def test_exercise_4_sequence_parallel_sends_what_an_allreduce_sends() -> None:
    rs, ag, total = solutions.sequence_parallel_bytes()
    B, T, d, p, b = sp.symbols("B T d p b", positive=True, integer=True)
    assert sp.simplify(rs - (p - 1) / p * B * T * d * b) == 0
    assert sp.simplify(rs - ag) == 0
    got = solutions.block_bytes_sequence_parallel(8, 2048, 12288, 8, 2)
    assert got == 4 * ring_all_reduce_bytes_per_rank(8 * 2048 * 12288, 8, 2)
    assert got == 7 * 8 * 2048 * 12288 * 2  # 4 * 2 * 7/8 * BTd * 2


def test_exercise_5_interleaved_bubble() -> None:
    p, m, v = sp.symbols("p m v", positive=True)
    expr = solutions.interleaved_bubble()
    assert sp.simplify(expr - (p - 1) / (v * m + p - 1)) == 0
    assert sp.simplify(expr.subs(v, 1) - (p - 1) / (m + p - 1)) == 0
    assert expr.subs({p: 4, m: 8, v: 1}) == sp.Rational(*bubble_fraction(4, 8).as_integer_ratio())
    assert solutions.smallest_microbatches(16, 4, 0.05) == 72
    assert solutions.smallest_microbatches(16, 1, 0.05) == 286
