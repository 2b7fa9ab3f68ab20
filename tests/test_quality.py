"""Quality filters (llmbook.training.quality): Gopher's rules, the perplexity filter, junk."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.paths import data_path
from llmbook.text.ngram import NGramModel
from llmbook.training.quality import (
    GOPHER_THRESHOLDS,
    JUNK_KINDS,
    NUM_CHARACTER_CLASSES,
    PerplexityFilter,
    character_classes,
    gopher_failures,
    load_prose_documents,
    make_junk_document,
    quality_statistics,
)

PROSE = load_prose_documents(120)


def test_statistics_worked_example():
    text = "The cat sat on the mat.\nThe cat sat on the mat.\n# a dog ... with 42\n"
    s = quality_statistics(text)
    assert s["num_words"] == 18
    assert s["mean_word_length"] == (2 * (3 + 3 + 3 + 2 + 3 + 4) + 1 + 1 + 3 + 3 + 4 + 2) / 18
    assert s["symbol_word_ratio"] == 2 / 18  # one '#', one '...'
    assert s["alphabetic_word_fraction"] == 15 / 18  # '#', '...' and '42' hold no letter
    assert s["stop_words_present"] == 2  # 'the' and 'with'
    assert s["duplicate_line_fraction"] == 1 / 3  # the second copy of line 1
    assert s["duplicate_line_char_fraction"] == 23 / (23 + 23 + 19)
    assert s["ellipsis_line_fraction"] == 0 and s["bullet_line_fraction"] == 0
    # the most frequent 2-gram (ties: the first counted) is ('the', 'cat'), twice: 2 x 6 chars
    assert s["top_2gram_char_fraction"] == 12 / 50
    # 5-grams at words 6 and 7 repeat those at 0 and 1: words 6..11 ('the' ... 'mat.') covered
    assert s["duplicate_5gram_char_fraction"] == 18 / 50
    assert s["duplicate_10gram_char_fraction"] == 0
    assert set(gopher_failures(text)) == {"word count", "mean word length", "hash/ellipsis per word",
                                          "duplicate lines", "chars in duplicate lines",
                                          "top 2-gram chars", "top 3-gram chars",
                                          "top 4-gram chars", "duplicate 5-gram chars"}


def test_empty_and_tiny_documents():
    s = quality_statistics("")
    assert s["num_words"] == 0 and all(v == 0 for v in s.values())
    assert "word count" in gopher_failures("") and "stop words" in gopher_failures("")
    assert gopher_failures("word " * 60) != []


def test_prose_documents():
    paragraphs = [p.strip() for p in data_path("heldout_prose.txt").read_text().splitlines() if p.strip()]
    assert len(PROSE) == 29 and all(len(d.split()) >= 120 for d in PROSE)
    joined = " ".join(PROSE)
    assert " ".join(paragraphs).startswith(joined)  # consecutive paragraphs, in order
    assert len(" ".join(paragraphs)) - len(joined) < 2000  # only a short remainder dropped
    assert load_prose_documents(10_000) == []


def test_clean_prose_passes_every_rule():
    failures = {rule: sum(rule in gopher_failures(d) for d in PROSE) for rule in GOPHER_THRESHOLDS}
    assert sum(failures.values()) == 0, failures  # the book's prose is prose


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=300))
def test_fractions_lie_in_the_unit_interval(text):
    s = quality_statistics(text)
    for key, v in s.items():
        if key.endswith("fraction"):
            assert 0 <= v <= 1, (key, v)
    assert s["stop_words_present"] <= 8


def test_repetition_statistics_against_a_counted_example():
    line = "alpha beta gamma delta epsilon zeta"
    text = "\n".join([line] * 4)
    s = quality_statistics(text)
    assert s["duplicate_line_fraction"] == 3 / 4
    assert s["duplicate_line_char_fraction"] == 3 / 4
    # every word of copies 2-4 lies in a repeated 5-gram, and no word of the first copy
    assert s["duplicate_5gram_char_fraction"] == pytest.approx(3 / 4)
    assert set(gopher_failures(text)) >= {"duplicate lines", "chars in duplicate lines",
                                          "duplicate 5-gram chars", "duplicate 10-gram chars"}


def test_character_classes():
    x = character_classes("Ab z\t9.,(é")
    assert x.tolist() == [0, 1, 26, 25, 26, 27, 28, 29, 30, 31]
    assert x.dtype == np.int64
    assert character_classes("").shape == (0,)


def test_perplexity_matches_the_ngram_models_cross_entropy():
    f = PerplexityFilter(order=3, add_k=0.5).fit(PROSE[:20])
    ref = NGramModel(3, NUM_CHARACTER_CLASSES, 0.5)
    for d in PROSE[:20]:
        ref.update(character_classes(d))
    assert (ref.counts == f.model.counts).all()
    text = PROSE[25]
    assert f.perplexity(text) == pytest.approx(math.exp(ref.cross_entropy(character_classes(text))),
                                               rel=1e-12)


def test_perplexity_of_a_uniform_model_is_the_class_count():
    f = PerplexityFilter(order=2, add_k=1.0).fit(["ab"])  # one bigram counted: nearly uniform
    f.model.counts[:] = 0
    f._log_table = np.log(f.model.probability_table())
    assert f.perplexity("any text at all") == pytest.approx(NUM_CHARACTER_CLASSES)


def test_calibration_keeps_the_requested_share_of_held_out_prose():
    f = PerplexityFilter().fit(PROSE[::2])
    held = PROSE[1::2]
    t = f.calibrate(held, keep=0.8)
    kept = sum(f.keeps(d) for d in held)
    assert t == pytest.approx(np.quantile([f.perplexity(d) for d in held], 0.8))
    assert kept == math.floor(0.8 * (len(held) - 1)) + 1  # linear interpolation's rank
    rng = np.random.default_rng(0)
    mash = [make_junk_document("keyboard mash", PROSE, rng) for _ in range(10)]
    assert not any(f.keeps(d) for d in mash)  # random letters are far from English


def test_junk_generators_are_seeded_and_caught():
    for kind in JUNK_KINDS:
        a = make_junk_document(kind, PROSE, np.random.default_rng(3))
        b = make_junk_document(kind, PROSE, np.random.default_rng(3))
        assert a == b and len(a.split()) >= 100
    rng = np.random.default_rng(1)
    caught = {kind: sum(bool(gopher_failures(make_junk_document(kind, PROSE, rng))) for _ in range(20))
              for kind in JUNK_KINDS}
    assert caught["repeated lines"] == 20 and caught["boilerplate"] >= 15
    assert caught["word salad"] <= 5  # real words in a random order pass the rules: a known gap


def test_word_salad_holds_the_words_of_the_prose():
    salad = make_junk_document("word salad", PROSE, np.random.default_rng(0), num_words=80)
    vocabulary = {w for d in PROSE for w in d.split()}
    assert len(salad.split()) == 80 and set(salad.split()) <= vocabulary


@pytest.mark.parametrize("call,error,match", [
    (lambda: quality_statistics(None), TypeError, "text must be a str"),
    (lambda: character_classes(1), TypeError, "text must be a str"),
    (lambda: PerplexityFilter(order=0), ValueError, "order"),
    (lambda: PerplexityFilter().fit("abc"), ValueError, "reference must be"),
    (lambda: PerplexityFilter().perplexity("abcdef"), RuntimeError, "call fit"),
    (lambda: PerplexityFilter().fit(PROSE).perplexity("ab"), ValueError, "more than 3 characters"),
    (lambda: PerplexityFilter().fit(PROSE).calibrate(PROSE, keep=1.5), ValueError, "keep"),
    (lambda: PerplexityFilter().fit(PROSE).calibrate([]), ValueError, "held_out"),
    (lambda: make_junk_document("spam", PROSE, np.random.default_rng(0)), ValueError, "kind must be"),
    (lambda: make_junk_document("boilerplate", [], np.random.default_rng(0)), ValueError, "prose"),
    (lambda: make_junk_document("boilerplate", PROSE, np.random.default_rng(0), 0), ValueError,
     "num_words"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
