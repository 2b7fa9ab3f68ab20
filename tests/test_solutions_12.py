"""The exercise solutions of notebooks/12_decoding hold."""

import calendar
import itertools
import math
import re

import pytest
import torch
from solution_loader import load_solutions
from transformers.generation.logits_process import TypicalLogitsWarper

from llmbook.inference.sampling import speculative_speedup, top_p_filter

solutions = load_solutions("12_decoding")

Z = torch.tensor([-0.336, 0.261, 0.260, -0.004, 0.341], dtype=torch.float64)


def test_typical_filter() -> None:
    # surprisal - H: |2.079 - 1.583| = 0.496, 0.101, 0.100, 0.164, 0.181 for tokens 0..4;
    # in that order 2, 1, 3 hold 0.2270 + 0.2273 + 0.1744 >= 0.5: the favourite 4 is dropped
    kept = torch.isfinite(solutions.typical_filter(Z, 0.5))
    assert kept.tolist() == [False, True, True, True, False]
    assert torch.isfinite(top_p_filter(Z, 0.5)).tolist() == [False, True, True, False, True]
    assert torch.isfinite(solutions.typical_filter(Z, 0.2)).tolist() == [False, False, True, False, False]
    assert bool(torch.isfinite(solutions.typical_filter(Z, 1.0)).all())
    with pytest.raises(ValueError, match="mass"):
        solutions.typical_filter(Z, 0.0)


def test_typical_filter_is_transformers_typical_warper() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        z = torch.randn(3, 5 + trial, generator=g, dtype=torch.float64) * (0.5 + trial / 10)
        for mass in (0.3, 0.6, 0.9):
            assert torch.equal(solutions.typical_filter(z, mass), TypicalLogitsWarper(mass)(None, z))


def test_typical_filter_ties_policy_against_transformers() -> None:
    """With ties (logits with five distinct values, V = 40), TypicalLogitsWarper keeps every
    token tied with the last one it needs; the solution keeps the shortest prefix of its
    stable order. So the solution's set is inside theirs, and both reach the mass."""
    z = torch.randint(0, 5, (4, 40), generator=torch.Generator().manual_seed(1)).double() * 0.6
    p = torch.softmax(z, -1)
    for mass in (0.3, 0.7):
        ours = torch.isfinite(solutions.typical_filter(z, mass))
        theirs = torch.isfinite(TypicalLogitsWarper(mass)(None, z.clone()))
        assert bool((ours <= theirs).all())
        assert bool(((p * ours).sum(-1) >= mass - 1e-12).all())
        assert bool(((p * theirs).sum(-1) >= mass - 1e-12).all())
        assert bool((ours.sum(-1) < theirs.sum(-1)).any())  # the policies do differ here


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
    assert all(speculative_speedup(0.8, g, 0.05) >= speculative_speedup(0.8, k, 0.05) for k in range(1, 21))
    assert math.isclose(speculative_speedup(0.8, 1, 0.0), 1.8)


def test_llama_cache_gib() -> None:
    assert solutions.llama_cache_gib(32) == 2.0  # 2 * 32 * 4096 * 32 * 128 * 2 bytes
    assert solutions.llama_cache_gib(8) == 0.5


CALENDAR = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


@pytest.mark.parametrize("pattern", [r"a(b|c)*", r"[ab]{2}c?", r"(ab|ba)+|c"])
def test_count_matches_equals_enumeration(pattern) -> None:
    for n in range(6):
        brute = sum(re.fullmatch(pattern, "".join(w)) is not None for w in itertools.product("abc", repeat=n))
        assert solutions.count_matches(pattern, "abc", n) == brute


def test_count_matches_dates() -> None:
    digits = "0123456789-"
    assert solutions.count_matches(CALENDAR, digits, 10) == 10**4 * 12 * 31
    assert solutions.count_matches(r"\d{4}-\d{2}-\d{2}", digits, 10) == 10**8
    assert solutions.count_matches(CALENDAR, digits, 9) == 0
    year = "2024-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    real = sum(calendar.monthrange(2024, m)[1] for m in range(1, 13))
    assert (solutions.count_matches(year, digits, 10), real) == (372, 366)
