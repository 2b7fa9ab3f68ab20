"""Checks of chapter 22d's exercises (notebooks/22d_torch_peers), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the parameter sizes of the book's ``tiny_mlp`` and the bytes per rank the
chapter measures with PyTorch's sharded wrapper, the full-batch gradient (for the
accumulated one), and the peak-memory formula and its threshold derived in SymPy.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.scale.zero import tiny_mlp


def exercise_1_greedy_partition_of_tiny_mlp(solutions) -> None:
    sizes = [p.numel() for p in tiny_mlp(0).parameters()]  # 192, 16, 256, 16, 128, 8
    assert sizes == [192, 16, 256, 16, 128, 8], f"tiny_mlp's parameter sizes changed: {sizes}"
    # 2 ranks: the bytes measured in the chapter, 2 * 8 * 296 and 2 * 8 * 320
    two = solutions.elements_per_rank(sizes, 2)
    assert two == [296, 320], (
        f"expected [296, 320] elements on 2 ranks (the bytes the chapter measures), got {two!r}")
    four = solutions.elements_per_rank(sizes, 4)
    assert four == [256, 192, 128, 40], f"expected [256, 192, 128, 40] elements on 4 ranks, got {four!r}"
    largest = max(solutions.elements_per_rank(sizes, 4))
    assert largest > math.ceil(sum(sizes) / 4) == 154, (
        f"expected the largest of 4 ranks above the even share ceil(616 / 4) = 154, got {largest!r}")
    owned = solutions.greedy_partition(sizes, 3)
    assert sorted(i for part in owned for i in part) == list(range(6)), (
        f"expected the 3 parts to hold each of the 6 parameters exactly once, got {owned!r}")


def exercise_2_scaled_accumulation_equals_full_batch_only_for_equal_microbatches(solutions) -> None:
    model = tiny_mlp(0, (3, 4, 2))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randn(8, 2, generator=g, dtype=torch.float64)
    full = solutions.full_batch_gradient(model, x, y)
    equal = solutions.accumulated_gradient(model, x, y, [2, 2, 2, 2])
    unequal = solutions.accumulated_gradient(model, x, y, [2, 6])
    off_equal = max(float((a - b).abs().max()) for a, b in zip(full, equal, strict=True))
    assert off_equal < 1e-15, (
        f"expected micro-batches [2, 2, 2, 2] to give the full-batch gradient (to 1e-15), "
        f"largest difference {off_equal:.3g}")
    off_unequal = max(float((a - b).abs().max()) for a, b in zip(full, unequal, strict=True))
    assert off_unequal > 1e-3, (
        f"expected micro-batches [2, 6] to differ from the full-batch gradient by more than 1e-3, "
        f"largest difference {off_unequal:.3g}")


def exercise_3_peak_and_smallest_units(solutions) -> None:
    L, P, N = sp.symbols("L P N", positive=True)
    peak = solutions.sharded_peak_bytes()
    want = 16 * L * P / N + 4 * P
    assert sp.simplify(peak - want) == 0, f"expected the peak {want}, got {peak}"
    at = peak.subs({L: 8, P: 1000, N: 8})
    assert at == 16 * 1000 + 4000, f"expected 20000 bytes at L = 8, P = 1000, N = 8, got {at}"
    # 4P / (16 L P / 8 + 4P) < 0.1  <=>  L > 18
    eight = solutions.smallest_units(8)
    assert eight == 19, f"expected 19 units on 8 ranks (4P / (2 L P + 4P) < 0.1 <=> L > 18), got {eight!r}"
    one = solutions.smallest_units(1)
    assert one == 3, f"expected 3 units on 1 rank (4 / (16 L + 4) < 0.1 <=> L > 2.25), got {one!r}"
