"""Checks of chapter 12's exercises (notebooks/12_decoding), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are ``transformers``' ``TypicalLogitsWarper`` (Meister et al. (2023)'s locally
typical sampling; imported inside the checks that use it), the book's top-p filter and
speculative speed-up (:mod:`llmbook.inference.sampling`), Llama 2 7B's cache worked by
hand, Python's ``re`` on every string, and the calendar.
"""

from __future__ import annotations

import calendar
import itertools
import math
import re

import torch

from llmbook.inference.sampling import speculative_speedup, top_p_filter
from llmbook.workbench.checks import raises

Z = torch.tensor([-0.336, 0.261, 0.260, -0.004, 0.341], dtype=torch.float64)


def exercise_1_typical_filter(solutions) -> None:
    # surprisal - H: |2.079 - 1.583| = 0.496, 0.101, 0.100, 0.164, 0.181 for tokens 0..4;
    # in that order 2, 1, 3 hold 0.2270 + 0.2273 + 0.1744 >= 0.5: the favourite 4 is dropped
    kept = torch.isfinite(solutions.typical_filter(Z, 0.5)).tolist()
    assert kept == [False, True, True, True, False], (
        f"expected typical_filter(Z, 0.5) to keep tokens 1, 2, 3 (the favourite 4 is atypical), "
        f"got kept = {kept}")
    nucleus = torch.isfinite(top_p_filter(Z, 0.5)).tolist()
    assert nucleus == [False, True, True, False, True], (
        f"top_p_filter(Z, 0.5) should keep tokens 1, 2, 4, got {nucleus}")
    kept = torch.isfinite(solutions.typical_filter(Z, 0.2)).tolist()
    assert kept == [False, False, True, False, False], (
        f"expected typical_filter(Z, 0.2) to keep token 2 alone, got kept = {kept}")
    every = bool(torch.isfinite(solutions.typical_filter(Z, 1.0)).all())
    assert every, "expected typical_filter(Z, 1.0) to keep every token"
    with raises(ValueError, match="mass", what="typical_filter(Z, 0.0)"):
        solutions.typical_filter(Z, 0.0)


def exercise_1_typical_filter_is_transformers_typical_warper(solutions) -> None:
    from transformers.generation.logits_process import TypicalLogitsWarper

    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        z = torch.randn(3, 5 + trial, generator=g, dtype=torch.float64) * (0.5 + trial / 10)
        for mass in (0.3, 0.6, 0.9):
            ours, theirs = solutions.typical_filter(z, mass), TypicalLogitsWarper(mass)(None, z)
            assert torch.equal(ours, theirs), (
                f"trial {trial}, mass {mass}: expected typical_filter to equal transformers' "
                f"TypicalLogitsWarper; they keep {torch.isfinite(ours).sum(-1).tolist()} and "
                f"{torch.isfinite(theirs).sum(-1).tolist()} tokens per row")


def exercise_1_typical_filter_ties_policy_against_transformers(solutions) -> None:
    """With ties (logits with five distinct values, V = 40), TypicalLogitsWarper keeps every
    token tied with the last one it needs; the solution keeps the shortest prefix of its
    stable order. So the solution's set is inside theirs, and both reach the mass."""
    from transformers.generation.logits_process import TypicalLogitsWarper

    z = torch.randint(0, 5, (4, 40), generator=torch.Generator().manual_seed(1)).double() * 0.6
    p = torch.softmax(z, -1)
    for mass in (0.3, 0.7):
        ours = torch.isfinite(solutions.typical_filter(z, mass))
        theirs = torch.isfinite(TypicalLogitsWarper(mass)(None, z.clone()))
        assert bool((ours <= theirs).all()), (
            f"mass {mass}: expected every token typical_filter keeps to be kept by "
            "TypicalLogitsWarper too")
        ours_mass, theirs_mass = (p * ours).sum(-1), (p * theirs).sum(-1)
        assert bool((ours_mass >= mass - 1e-12).all()), (
            f"mass {mass}: expected typical_filter's kept mass to reach {mass}, got {ours_mass.tolist()}")
        assert bool((theirs_mass >= mass - 1e-12).all()), (
            f"mass {mass}: TypicalLogitsWarper's kept mass should reach {mass}, got {theirs_mass.tolist()}")
        ours_n, theirs_n = ours.sum(-1), theirs.sum(-1)
        assert bool((ours_n < theirs_n).any()), (  # the policies do differ here
            f"mass {mass}: expected typical_filter to keep fewer tied tokens than "
            f"TypicalLogitsWarper in some row, got {ours_n.tolist()} and {theirs_n.tolist()}")


def exercise_2_temperature_for_entropy(solutions) -> None:
    t = solutions.temperature_for_entropy(Z, 1.0)
    h = solutions.entropy_at(Z, t)
    assert abs(h - 1.0) < 1e-9, f"expected the entropy at temperature {t!r} to be 1 nat, got {h!r}"
    assert 0.01 < t < 0.2, f"expected a temperature between 0.01 and 0.2, got {t!r}"
    with raises(ValueError, match="outside", what="temperature_for_entropy(Z, 2.0), above log 5"):
        solutions.temperature_for_entropy(Z, 2.0)


def exercise_3_best_gamma(solutions) -> None:
    # a free draft: longer is always better; an expensive one with poor acceptance: short
    got = solutions.best_gamma(0.9, 0.0, 10)
    assert got == 10, f"expected best_gamma(0.9, 0.0, 10) = 10 (a free draft), got {got}"
    got = solutions.best_gamma(0.6, 0.2, 20)
    assert got == 2, f"expected best_gamma(0.6, 0.2, 20) = 2, got {got}"
    g = solutions.best_gamma(0.8, 0.05, 20)
    worse = [k for k in range(1, 21) if speculative_speedup(0.8, g, 0.05) < speculative_speedup(0.8, k, 0.05)]
    assert not worse, (
        f"expected best_gamma(0.8, 0.05, 20) = {g} to have the largest speed-up, beaten by {worse}")
    one = speculative_speedup(0.8, 1, 0.0)
    assert math.isclose(one, 1.8), f"speculative_speedup(0.8, 1, 0.0) should be 1.8, got {one!r}"


def exercise_4_llama_cache_gib(solutions) -> None:
    got = solutions.llama_cache_gib(32)
    assert got == 2.0, f"expected llama_cache_gib(32) = 2 * 32 * 4096 * 32 * 128 * 2 bytes = 2.0, got {got!r}"
    got = solutions.llama_cache_gib(8)
    assert got == 0.5, f"expected llama_cache_gib(8) = 0.5, got {got!r}"


CALENDAR = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


def exercise_5_count_matches_equals_enumeration(solutions) -> None:
    for pattern in (r"a(b|c)*", r"[ab]{2}c?", r"(ab|ba)+|c"):
        for n in range(6):
            brute = sum(re.fullmatch(pattern, "".join(w)) is not None
                        for w in itertools.product("abc", repeat=n))
            got = solutions.count_matches(pattern, "abc", n)
            assert got == brute, (
                f"expected count_matches({pattern!r}, 'abc', {n}) = {brute} (every string tried "
                f"with re.fullmatch), got {got}")


def exercise_5_count_matches_dates(solutions) -> None:
    digits = "0123456789-"
    got = solutions.count_matches(CALENDAR, digits, 10)
    assert got == 10**4 * 12 * 31, f"expected 10^4 * 12 * 31 = 3,720,000 calendar strings, got {got}"
    got = solutions.count_matches(r"\d{4}-\d{2}-\d{2}", digits, 10)
    assert got == 10**8, f"expected 10^8 strings of the form dddd-dd-dd, got {got}"
    got = solutions.count_matches(CALENDAR, digits, 9)
    assert got == 0, f"expected no calendar string of 9 characters, got {got}"
    year = "2024-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    real = sum(calendar.monthrange(2024, m)[1] for m in range(1, 13))
    got = solutions.count_matches(year, digits, 10)
    assert (got, real) == (372, 366), (
        f"expected the 2024 pattern to allow 372 dates (12 x 31) against the calendar's 366, "
        f"got {got} against {real}")
