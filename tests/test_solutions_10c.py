"""The exercise solutions of notebooks/10c_data hold."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solution_loader import load_solutions

from llmbook.text.corpus import load_stdlib_docs
from llmbook.training.dedup import (
    band_collision_probability,
    cut_documents,
    jaccard,
    make_duplicate_corpus,
    normalise_document,
    shingles,
)

solutions = load_solutions("10c_data")


def test_choose_bands():
    assert solutions.choose_bands(128, 0.8) == (8, 16)  # steepest at 0.875; 16 x 8 at 0.696
    assert solutions.choose_bands(128, 0.4) == (32, 4)
    assert solutions.choose_bands(7, 0.5) in {(7, 1), (1, 7)}
    b, r = solutions.choose_bands(120, 0.6)
    assert b * r == 120
    with pytest.raises(ValueError, match="target must lie"):
        solutions.choose_bands(128, 1.5)


def test_miss_and_false_alarm():
    miss, alarm = solutions.miss_and_false_alarm(8, 16, low=0.5, high=0.95)
    assert miss == pytest.approx((1 - 0.95**16) ** 8, rel=1e-12)
    assert alarm == pytest.approx(1 - (1 - 0.5**16) ** 8, rel=1e-12)
    assert miss < 0.01 and alarm < 0.001
    m2, a2 = solutions.miss_and_false_alarm(32, 4, 0.5, 0.95)
    assert a2 > alarm and m2 < miss  # a lower threshold: fewer misses, more false alarms


def test_shingle_survival_by_simulation():
    from llmbook.training.dedup import edit_words

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30_000)]
    for rate in (0.05, 0.2):
        out = edit_words(words, rate, rng, ["x"])
        a, b = shingles(" ".join(words), 5), shingles(" ".join(out), 5)
        measured = len(a & b) / len(a)
        q = solutions.shingle_survival(rate, 5)
        assert abs(measured - q) < 4 * np.sqrt(q * (1 - q) / len(a) * 5)  # shingles overlap: x5
    assert solutions.shingle_survival(0.0, 5) == 1.0 and solutions.shingle_survival(1.0, 1) == pytest.approx(1 / 3)


def test_predicted_jaccard_against_planted_copies():
    originals = cut_documents(load_stdlib_docs(400_000), 150)[:200]
    rates = [0.02, 0.05, 0.1, 0.2]
    corpus = make_duplicate_corpus(originals, rates, copies_per_rate=30, num_exact=0,
                                   num_trivial=0, seed=3)
    for rate in rates:
        js = [jaccard(shingles(normalise_document(corpus.texts[s])),
                      shingles(normalise_document(corpus.texts[i])))
              for s, i in corpus.true_pairs() if corpus.edit_rate[i] == rate]
        assert abs(np.mean(js) - solutions.predicted_jaccard(rate)) < 0.04, rate


def _brute_longest(tokens):
    n, best = len(tokens), 0
    for i in range(n):
        for j in range(i + 1, n):
            m = 0
            while j + m < n and tokens[i + m] == tokens[j + m]:
                m += 1
            best = max(best, m)
    return best


def test_suffix_array_worked_example():
    assert solutions.suffix_array("banana") == [5, 3, 1, 0, 4, 2]
    assert solutions.longest_repeat("banana") == (3, 1, 3)  # "ana", overlapping
    assert solutions.longest_repeat("abc") == (0, -1, -1)
    assert solutions.suffix_array([]) == []


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40))
def test_suffix_array_and_longest_repeat_against_brute_force(tokens):
    sa = solutions.suffix_array(tokens)
    assert sa == sorted(range(len(tokens)), key=lambda i: tokens[i:])
    length, i, j = solutions.longest_repeat(tokens)
    assert length == _brute_longest(tokens)
    if length:
        assert i < j and tokens[i:i + length] == tokens[j:j + length]


def test_band_probability_used_by_the_solutions_is_the_books():
    assert solutions.miss_and_false_alarm(20, 5, 0.3, 0.8)[1] == band_collision_probability(0.3, 20, 5)
