"""Checks of chapter 10c's exercises (notebooks/10c_data), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the band probabilities in closed form and the book's
:func:`llmbook.training.dedup.band_collision_probability`, simulated edits
(:func:`llmbook.training.dedup.edit_words`), planted near-duplicates of the standard
library's documentation, and a brute-force search for repeated substrings.
"""

from __future__ import annotations

import math

import numpy as np

from llmbook.text.corpus import load_stdlib_docs
from llmbook.training.dedup import (
    band_collision_probability,
    cut_documents,
    edit_words,
    jaccard,
    make_duplicate_corpus,
    normalise_document,
    shingles,
)
from llmbook.workbench.checks import raises


def exercise_1_choose_bands(solutions) -> None:
    got = solutions.choose_bands(128, 0.8)
    assert got == (8, 16), (  # steepest at 0.875; 16 x 8 at 0.696
        f"expected choose_bands(128, 0.8) = (8, 16), whose steepest point 0.875 is nearest, got {got}")
    got = solutions.choose_bands(128, 0.4)
    assert got == (32, 4), f"expected choose_bands(128, 0.4) = (32, 4), got {got}"
    got = solutions.choose_bands(7, 0.5)
    assert got in {(7, 1), (1, 7)}, f"expected choose_bands(7, 0.5) to be (7, 1) or (1, 7), got {got}"
    b, r = solutions.choose_bands(120, 0.6)
    assert b * r == 120, f"expected choose_bands(120, 0.6) to factor 120, got b={b}, r={r}"
    with raises(ValueError, match="target must lie", what="choose_bands(128, 1.5)"):
        solutions.choose_bands(128, 1.5)


def exercise_1_miss_and_false_alarm(solutions) -> None:
    miss, alarm = solutions.miss_and_false_alarm(8, 16, low=0.5, high=0.95)
    want_miss, want_alarm = (1 - 0.95**16) ** 8, 1 - (1 - 0.5**16) ** 8
    assert math.isclose(miss, want_miss, rel_tol=1e-12, abs_tol=1e-12), (
        f"expected the miss rate (1 - 0.95^16)^8 = {want_miss!r}, got {miss!r}")
    assert math.isclose(alarm, want_alarm, rel_tol=1e-12, abs_tol=1e-12), (
        f"expected the false-alarm rate 1 - (1 - 0.5^16)^8 = {want_alarm!r}, got {alarm!r}")
    assert miss < 0.01 and alarm < 0.001, (
        f"expected a miss rate below 0.01 and a false-alarm rate below 0.001, got {miss!r}, {alarm!r}")
    m2, a2 = solutions.miss_and_false_alarm(32, 4, 0.5, 0.95)
    assert a2 > alarm and m2 < miss, (  # a lower threshold: fewer misses, more false alarms
        f"expected 32 bands of 4 to miss less ({m2!r} vs {miss!r}) and alarm more ({a2!r} vs "
        f"{alarm!r}) than 8 bands of 16")


def exercise_1_band_probability_is_the_books(solutions) -> None:
    got = solutions.miss_and_false_alarm(20, 5, 0.3, 0.8)[1]
    want = band_collision_probability(0.3, 20, 5)
    assert got == want, (
        f"expected the false-alarm rate of 20 bands of 5 at 0.3 to be the book's "
        f"band_collision_probability, {want!r}, got {got!r}")


def exercise_2_shingle_survival_by_simulation(solutions) -> None:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30_000)]
    for rate in (0.05, 0.2):
        out = edit_words(words, rate, rng, ["x"])
        a, b = shingles(" ".join(words), 5), shingles(" ".join(out), 5)
        measured = len(a & b) / len(a)
        q = solutions.shingle_survival(rate, 5)
        bound = 4 * np.sqrt(q * (1 - q) / len(a) * 5)  # shingles overlap: x5
        assert abs(measured - q) < bound, (
            f"rate {rate}: expected shingle_survival within {bound:.3g} of the share that "
            f"survived a simulated edit, {measured:.4f}, got {q!r}")
    none, one = solutions.shingle_survival(0.0, 5), solutions.shingle_survival(1.0, 1)
    assert none == 1.0 and math.isclose(one, 1 / 3, rel_tol=1e-6, abs_tol=1e-12), (
        f"expected shingle_survival(0.0, 5) = 1 and shingle_survival(1.0, 1) = 1/3, "
        f"got {none!r} and {one!r}")


def exercise_2_predicted_jaccard_against_planted_copies(solutions) -> None:
    originals = cut_documents(load_stdlib_docs(400_000), 150)[:200]
    rates = [0.02, 0.05, 0.1, 0.2]
    corpus = make_duplicate_corpus(originals, rates, copies_per_rate=30, num_exact=0,
                                   num_trivial=0, seed=3)
    for rate in rates:
        js = [jaccard(shingles(normalise_document(corpus.texts[s])),
                      shingles(normalise_document(corpus.texts[i])))
              for s, i in corpus.true_pairs() if corpus.edit_rate[i] == rate]
        measured, predicted = float(np.mean(js)), solutions.predicted_jaccard(rate)
        assert abs(measured - predicted) < 0.04, (
            f"rate {rate}: expected predicted_jaccard within 0.04 of the mean Jaccard of the "
            f"planted copies, {measured:.4f}, got {predicted!r}")


def _brute_longest(tokens: list[int]) -> int:
    """The length of the longest substring that occurs twice (overlaps allowed), by brute force."""
    n, best = len(tokens), 0
    for i in range(n):
        for j in range(i + 1, n):
            m = 0
            while j + m < n and tokens[i + m] == tokens[j + m]:
                m += 1
            best = max(best, m)
    return best


def exercise_3_suffix_array_worked_example(solutions) -> None:
    got = solutions.suffix_array("banana")
    assert got == [5, 3, 1, 0, 4, 2], f"expected suffix_array('banana') = [5, 3, 1, 0, 4, 2], got {got}"
    got = solutions.longest_repeat("banana")
    assert got == (3, 1, 3), f"expected longest_repeat('banana') = (3, 1, 3) ('ana', overlapping), got {got}"
    got = solutions.longest_repeat("abc")
    assert got == (0, -1, -1), f"expected longest_repeat('abc') = (0, -1, -1), got {got}"
    got = solutions.suffix_array([])
    assert got == [], f"expected suffix_array([]) = [], got {got}"


def exercise_3_suffix_array_and_longest_repeat_against_brute_force(solutions) -> None:
    # lists of 0..40 tokens from {0, 1, 2, 3}: the edge cases first, then 100 seeded draws
    rng = np.random.default_rng(0)
    cases = [[], [0], [3, 3], [0, 1], [0] * 40, [1, 0] * 20, [0, 1, 2, 3] * 10, [3, 2, 1, 0]]
    cases += [rng.integers(0, 4, size=int(rng.integers(0, 41))).tolist() for _ in range(100)]
    for tokens in cases:
        sa = solutions.suffix_array(tokens)
        want = sorted(range(len(tokens)), key=lambda i, t=tokens: t[i:])
        assert sa == want, f"expected suffix_array({tokens}) = {want}, got {sa}"
        length, i, j = solutions.longest_repeat(tokens)
        brute = _brute_longest(tokens)
        assert length == brute, (
            f"expected longest_repeat({tokens}) to find a repeat of length {brute} (brute force), "
            f"got length {length}")
        if length:
            assert i < j and tokens[i:i + length] == tokens[j:j + length], (
                f"expected positions i < j where {tokens} repeats for {length} tokens, got i={i}, j={j}")
