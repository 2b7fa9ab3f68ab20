"""Checks of chapter 22's exercises (notebooks/22_distributed_training), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the cost and volume formulas written here in SymPy, the memory per parameter
of the ZeRO stages (Rajbhandari et al., 2020), float16's largest finite value (65504),
the book's ring all-reduce volume (:mod:`llmbook.scale.collectives`) and its pipeline
bubble (:mod:`llmbook.scale.pipeline`).
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.scale.collectives import ring_all_reduce_bytes_per_rank
from llmbook.scale.pipeline import bubble_fraction
from llmbook.workbench.checks import raises


def exercise_1_halving_doubling(solutions) -> None:
    t = solutions.halving_doubling_cost_symbolic()
    p, n, a, b = sp.symbols("p n alpha beta", positive=True)
    expected = 2 * sp.log(p, 2) * a + 2 * (1 - 1 / p) * n * b
    for pv in (2, 8, 64):
        difference = sp.simplify((t - expected).subs(p, pv))
        assert difference == 0, (
            f"expected the cost {expected.subs(p, pv)} at p = {pv}, got {t.subs(p, pv)} (difference {difference})")
    two, eight = solutions.crossover_bytes(2, 1e-5, 1e-9), solutions.crossover_bytes(8, 1e-5, 1e-9)
    assert two == 0.0, f"expected the crossover at 0 bytes for p = 2 (the two algorithms coincide), got {two!r}"
    assert eight == math.inf, f"expected no crossover (inf) for p = 8, got {eight!r}"
    with raises(ValueError, match="power of two", what="crossover_bytes(6, ...)"):
        solutions.crossover_bytes(6, 1e-5, 1e-9)


def exercise_2_largest_model(solutions) -> None:
    sizes = solutions.largest_model(80e9, 64)
    for i, want in ((0, 5e9), (3, 80e9 * 64 / 16), (1, 80e9 / (4 + 12 / 64))):
        got = sizes[i]
        assert abs(got - want) <= max(1e-6 * abs(want), 1e-12), (
            f"expected largest_model(80e9, 64)[{i}] = {want!r} parameters (to 1e-6 relative), got {got!r}")
    assert sizes[0] < sizes[1] < sizes[2] < sizes[3], f"expected the sizes to grow stage by stage, got {sizes}"


def exercise_3_static_loss_scale(solutions) -> None:
    g = torch.exp(torch.empty(10_000).uniform_(math.log(1e-10), math.log(1e-1),
                                               generator=torch.Generator().manual_seed(0)))
    s = solutions.largest_safe_scale(g)
    assert s == 2.0**19, (  # 65504 / 0.1 ~ 6.6e5, largest power of two below: 2^19
        f"expected the largest power of two below 65504 / 0.1, 2^19 = {2.0**19:.0f}, got {s!r}")
    fits, overflows = torch.isfinite((g * s).half()).all(), not torch.isfinite((g * 2 * s).half()).all()
    assert fits and overflows, (
        f"expected every scaled gradient finite in float16 at scale {s!r} and some infinite at twice it, "
        f"got all finite = {bool(fits)}, some infinite at twice = {overflows}")
    plain, scaled = solutions.underflow_fraction(g, 1.0), solutions.underflow_fraction(g, s)
    assert 0.25 < plain < 0.4 and scaled < 0.05 and scaled < plain, (
        f"expected between 25% and 40% underflowing unscaled and under 5% scaled, got {plain!r} and {scaled!r}")
    with raises(ValueError, match="finite", what="largest_safe_scale(torch.zeros(3))"):
        solutions.largest_safe_scale(torch.zeros(3))


def exercise_4_sequence_parallel_sends_what_an_allreduce_sends(solutions) -> None:
    rs, ag, total = solutions.sequence_parallel_bytes()
    B, T, d, p, b = sp.symbols("B T d p b", positive=True, integer=True)
    want = (p - 1) / p * B * T * d * b
    assert sp.simplify(rs - want) == 0, f"expected the reduce-scatter to send {want} bytes per rank, got {rs}"
    assert sp.simplify(rs - ag) == 0, f"expected the all-gather to send what the reduce-scatter sends, got {ag} and {rs}"
    got = solutions.block_bytes_sequence_parallel(8, 2048, 12288, 8, 2)
    want = 4 * ring_all_reduce_bytes_per_rank(8 * 2048 * 12288, 8, 2)
    assert got == want, f"expected four ring all-reduces' bytes, {want}, got {got!r}"
    want = 7 * 8 * 2048 * 12288 * 2  # 4 * 2 * 7/8 * BTd * 2
    assert got == want, f"expected 4 x 2 x 7/8 x BTd x 2 = {want} bytes, got {got!r}"


def exercise_5_interleaved_bubble(solutions) -> None:
    p, m, v = sp.symbols("p m v", positive=True)
    expr = solutions.interleaved_bubble()
    want = (p - 1) / (v * m + p - 1)
    assert sp.simplify(expr - want) == 0, f"expected the interleaved bubble {want}, got {expr}"
    one = expr.subs(v, 1)
    assert sp.simplify(one - (p - 1) / (m + p - 1)) == 0, f"expected the plain bubble (p - 1)/(m + p - 1) at v = 1, got {one}"
    got, want = expr.subs({p: 4, m: 8, v: 1}), sp.Rational(*bubble_fraction(4, 8).as_integer_ratio())
    assert got == want, f"expected the book's bubble_fraction(4, 8) = {want} at p = 4, m = 8, v = 1, got {got}"
    for v_, want in ((4, 72), (1, 286)):
        got = solutions.smallest_microbatches(16, v_, 0.05)
        assert got == want, f"expected {want} micro-batches for a bubble of at most 5% at p = 16, v = {v_}, got {got!r}"
