"""The exercise solutions of notebooks/22d_torch_peers hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.scale.zero import tiny_mlp

solutions = load_solutions("22d_torch_peers")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_greedy_partition_of_tiny_mlp():
    sizes = [p.numel() for p in tiny_mlp(0).parameters()]  # 192, 16, 256, 16, 128, 8
    assert sizes == [192, 16, 256, 16, 128, 8]
    # 2 ranks: the bytes measured in the chapter, 2 * 8 * 296 and 2 * 8 * 320
    assert solutions.elements_per_rank(sizes, 2) == [296, 320]
    assert solutions.elements_per_rank(sizes, 4) == [256, 192, 128, 40]
    assert max(solutions.elements_per_rank(sizes, 4)) > math.ceil(sum(sizes) / 4) == 154
    owned = solutions.greedy_partition(sizes, 3)
    assert sorted(i for part in owned for i in part) == list(range(6))


def test_exercise_2_scaled_accumulation_equals_full_batch_only_for_equal_microbatches():
    model = tiny_mlp(0, (3, 4, 2))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randn(8, 2, generator=g, dtype=torch.float64)
    full = solutions.full_batch_gradient(model, x, y)
    equal = solutions.accumulated_gradient(model, x, y, [2, 2, 2, 2])
    unequal = solutions.accumulated_gradient(model, x, y, [2, 6])
    assert max(float((a - b).abs().max()) for a, b in zip(full, equal, strict=True)) < 1e-15
    assert max(float((a - b).abs().max()) for a, b in zip(full, unequal, strict=True)) > 1e-3


def test_exercise_3_peak_and_smallest_units():
    L, P, N = sp.symbols("L P N", positive=True)
    peak = solutions.sharded_peak_bytes()
    assert sp.simplify(peak - (16 * L * P / N + 4 * P)) == 0
    assert peak.subs({L: 8, P: 1000, N: 8}) == 16 * 1000 + 4000
    # 4P / (16 L P / 8 + 4P) < 0.1  <=>  L > 18
    assert solutions.smallest_units(8) == 19
    assert solutions.smallest_units(1) == 3  # 4 / (16 L + 4) < 0.1 <=> L > 2.25
