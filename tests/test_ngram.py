"""Tests for llmbook.text.ngram: counts, add-k smoothing, and convergence to the entropy rate."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.data import default_source
from llmbook.text.ngram import NGramModel


def test_bigram_worked_example() -> None:
    tokens = [0, 1, 0, 1, 1]  # pairs: 0->1 twice, 1->0 once, 1->1 once
    mle = NGramModel(order=2, vocab_size=2, add_k=0).fit(np.array(tokens))
    assert mle.counts.tolist() == [[0, 2], [1, 1]]
    assert mle.probs([0]).tolist() == [0.0, 1.0]
    assert mle.probs([1]).tolist() == [0.5, 0.5]
    laplace = NGramModel(order=2, vocab_size=2, add_k=1).fit(np.array(tokens))
    assert laplace.probs([0]).tolist() == [0.25, 0.75]
    lp = laplace.log_prob(torch.tensor([0, 1, 1]))
    assert torch.allclose(lp, torch.tensor([math.log(0.75), math.log(0.5)], dtype=torch.float64))
    assert math.isclose(laplace.cross_entropy(torch.tensor([0, 1, 1])),
                        -(math.log(0.75) + math.log(0.5)) / 2, abs_tol=1e-15)
    # a pair never seen has probability 0 under the MLE
    assert mle.log_prob(torch.tensor([0, 0])).tolist() == [-math.inf]


def test_unigram_is_the_empirical_frequency() -> None:
    tokens = np.array([2, 2, 0, 2, 1, 2, 0, 2])
    uni = NGramModel(order=1, vocab_size=4, add_k=0).fit(tokens)
    assert uni.probs([]).tolist() == [2 / 8, 1 / 8, 5 / 8, 0.0]
    lid = NGramModel(order=1, vocab_size=4, add_k=0.5).fit(tokens)
    assert torch.allclose(lid.probs([]), torch.tensor([2.5, 1.5, 5.5, 0.5], dtype=torch.float64) / 10)


def test_counts_equal_a_python_loop() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, size=400)
    model = NGramModel(order=3, vocab_size=5, add_k=0.1).fit(tokens)
    ref = Counter((int(a), int(b), int(c)) for a, b, c in zip(tokens, tokens[1:], tokens[2:],
                                                              strict=False))
    for (a, b, c), n in ref.items():
        assert model.counts[a * 5 + b, c] == n
    assert model.counts.sum() == len(tokens) - 2
    table = model.probability_table()
    assert table.shape == (25, 5) and np.allclose(table.sum(1), 1.0, atol=1e-14)
    # update accumulates; fit replaces
    model.update(tokens[:50])
    assert model.counts.sum() == len(tokens) - 2 + 48
    model.fit(tokens[:50])
    assert model.counts.sum() == 48


def test_unseen_context_is_uniform_without_smoothing() -> None:
    model = NGramModel(order=2, vocab_size=3, add_k=0).fit(np.array([0, 0, 0]))
    assert model.probs([2]).tolist() == [1 / 3, 1 / 3, 1 / 3]
    assert np.allclose(model.probability_table()[2], 1 / 3)


@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=3, max_size=60),
       order=st.integers(1, 3), k=st.floats(0.01, 5.0))
def test_mle_maximises_training_likelihood(tokens: list[int], order: int, k: float) -> None:
    # Maximum likelihood = minimum training cross-entropy: smoothing can only raise it.
    arr = np.array(tokens)
    mle = NGramModel(order, 4, add_k=0).fit(arr).cross_entropy(arr)
    smooth = NGramModel(order, 4, add_k=k).fit(arr).cross_entropy(arr)
    assert math.isfinite(mle) and mle <= smooth + 1e-12


def test_converges_to_the_entropy_rate() -> None:
    source = default_source()
    h = source.entropy_rate()
    train, val = source.train_val(1_000_000, 200_000, seed=5)
    oracle = float(-source.conditional_log_probs(val).mean())  # the true model on these tokens
    assert abs(oracle - h) < 0.01
    k = source.concentration
    trigram_small = NGramModel(3, 16, add_k=k).fit(train[:10_000]).cross_entropy(val)
    trigram = NGramModel(3, 16, add_k=k).fit(train).cross_entropy(val)
    # order-matched: within a few thousandths of a nat of the true model on the same tokens
    assert 0 < trigram - oracle < 0.005
    assert trigram_small - oracle > 0.05  # and far from it with 100x less data
    # too little context plateaus well above the floor
    bigram = NGramModel(2, 16, add_k=k).fit(train).cross_entropy(val)
    assert bigram - h > 0.5
    # too much context needs more data: order 5 is still clearly worse at 1M tokens
    five = NGramModel(5, 16, add_k=k).fit(train).cross_entropy(val)
    assert five - trigram > 0.02


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="order must be an int >= 1, got 0"):
        NGramModel(0, 10)
    with pytest.raises(ValueError, match="add_k must be >= 0, got -1"):
        NGramModel(2, 10, add_k=-1)
    with pytest.raises(ValueError, match=r"50257\*\*3"):
        NGramModel(3, 50257)
    model = NGramModel(3, 4)
    with pytest.raises(ValueError, match="token 4 is outside the vocabulary"):
        model.fit(np.array([0, 1, 4]))
    with pytest.raises(ValueError, match="context of 2 tokens, got 1"):
        model.probs([1])
    with pytest.raises(ValueError, match="at least 3 tokens"):
        model.cross_entropy(np.array([0, 1]))
    with pytest.raises(TypeError, match="integer"):
        model.fit(np.array([0.0, 1.0, 2.0]))
