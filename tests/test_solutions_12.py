"""The exercise solutions of notebooks/12_decoding hold."""

import math

import pytest
import torch
from solution_loader import load_solutions

from llmbook.inference.sampling import top_p_filter

solutions = load_solutions("12_decoding")

Z = torch.tensor([-0.336, 0.261, 0.260, -0.004, 0.341], dtype=torch.float64)


def test_min_p_filter() -> None:
    kept = torch.isfinite(solutions.min_p_filter(Z, 0.8))
    # p / p_max = exp(z - 0.341) >= 0.8  <=>  z >= 0.341 + log 0.8 = 0.118
    assert kept.tolist() == [False, True, True, False, True]
    assert torch.equal(torch.isfinite(solutions.min_p_filter(Z + 7.0, 0.8)), kept)
    n_cold = int(torch.isfinite(solutions.min_p_filter(Z / 0.1, 0.8)).sum())
    assert n_cold == 1  # temperature changes the set
    # top-p on shifted logits also unchanged; both rules ignore shifts
    assert torch.equal(torch.isfinite(top_p_filter(Z + 7.0, 0.75)), torch.isfinite(top_p_filter(Z, 0.75)))
    with pytest.raises(ValueError, match="p_min"):
        solutions.min_p_filter(Z, 0.0)


def test_temperature_for_entropy() -> None:
    t = solutions.temperature_for_entropy(Z, 1.0)
    assert abs(solutions.entropy_at(Z, t) - 1.0) < 1e-9
    assert 0.01 < t < 0.2
    with pytest.raises(ValueError, match="outside"):
        solutions.temperature_for_entropy(Z, 2.0)  # above log 5


def test_best_gamma() -> None:
    # a free draft: longer is always better; an expensive one with poor acceptance: short
    assert solutions.best_gamma(0.9, 0.0, 10) == 10
    assert solutions.best_gamma(0.6, 0.2, 20) == 2
    g = solutions.best_gamma(0.8, 0.05, 20)
    assert all(solutions.speedup(0.8, g, 0.05) >= solutions.speedup(0.8, k, 0.05) for k in range(1, 21))
    assert math.isclose(solutions.speedup(0.8, 1, 0.0), 1.8)


def test_llama_cache_gib() -> None:
    assert solutions.llama_cache_gib(32) == 2.0  # 2 * 32 * 4096 * 32 * 128 * 2 bytes
    assert solutions.llama_cache_gib(8) == 0.5
