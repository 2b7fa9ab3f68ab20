"""Tests for llmbook.text.data: the Markov source, its stationary distribution and entropy rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.data import MarkovSource, as_token_array, context_ids, default_source


@pytest.fixture(scope="module")
def source() -> MarkovSource:
    return default_source()


@pytest.fixture(scope="module")
def long_sample(source: MarkovSource) -> torch.Tensor:
    return source.sample(1_000_000, seed=123)


# ---------------------------------------------------------------- worked examples


def test_two_state_chain_entropy_rate_by_hand() -> None:
    # P = [[1-a, a], [b, 1-b]]: pi = (b, a)/(a+b), H = pi_0 h(a) + pi_1 h(b).
    a, b = sp.Rational(1, 4), sp.Rational(1, 2)

    def h(q):
        return -(q * sp.log(q) + (1 - q) * sp.log(1 - q))

    pi0, pi1 = b / (a + b), a / (a + b)
    exact = pi0 * h(a) + pi1 * h(b)
    assert sp.simplify(exact - (sp.Rational(5, 3) * sp.log(2) - sp.Rational(1, 2) * sp.log(3))) == 0
    src = MarkovSource.from_transition([[0.75, 0.25], [0.5, 0.5]], order=1)
    assert torch.allclose(src.stationary, torch.tensor([2 / 3, 1 / 3], dtype=torch.float64),
                          atol=1e-15)
    assert math.isclose(src.entropy_rate(), float(exact), abs_tol=1e-15)
    assert math.isclose(src.entropy_rate(), 0.6059391565991873, abs_tol=1e-15)


def test_order_two_chain_that_ignores_the_oldest_token() -> None:
    # P(x | a, b) = Q(x | b): same entropy rate as the order-1 chain Q.
    q = MarkovSource(vocab_size=5, order=1, concentration=0.5, seed=3)
    table2 = q.transition.repeat(5, 1)  # row a*5 + b is Q[b]
    src2 = MarkovSource.from_transition(table2, order=2)
    assert math.isclose(src2.entropy_rate(), q.entropy_rate(), abs_tol=1e-14)
    marginal = src2.stationary.reshape(5, 5).sum(0)  # distribution of the newest token
    assert torch.allclose(marginal, q.stationary, atol=1e-14)


def test_context_ids_worked_example() -> None:
    assert context_ids(np.array([1, 2, 3, 4]), order=2, vocab_size=10).tolist() == [12, 23]
    assert context_ids(torch.tensor([1, 2, 3]), order=0, vocab_size=10).tolist() == [0, 0, 0]
    assert context_ids(np.array([1, 2]), order=3, vocab_size=10).tolist() == []


# ---------------------------------------------------------------- the default source


def test_default_source_entropy_rate_is_pinned(source: MarkovSource) -> None:
    assert (source.vocab_size, source.order, source.num_contexts) == (16, 2, 256)
    h = source.entropy_rate()
    assert round(h, 4) == 1.6184  # the value documented in default_source's docstring
    assert math.isclose(h, 1.6184495962346532, abs_tol=1e-10)
    assert h < math.log(16) - 1.0  # clearly below a uniform guess


def test_stationary_distribution_is_stationary(source: MarkovSource) -> None:
    pi = source.stationary
    assert pi.shape == (256,) and pi.dtype == torch.float64
    assert (pi > 0).all() and math.isclose(float(pi.sum()), 1.0, abs_tol=1e-14)
    assert source.stationary_residual() < 1e-14
    # independent check: the dense context-chain matrix and its left eigenvector for 1
    v, n = source.vocab_size, source.num_contexts
    dense = np.zeros((n, n))
    for c in range(n):
        for x in range(v):
            dense[c, (c % (n // v)) * v + x] += float(source.transition[c, x])
    w, vecs = np.linalg.eig(dense.T)
    top = vecs[:, np.argmin(np.abs(w - 1))].real
    assert np.abs(top / top.sum() - pi.numpy()).max() < 1e-12


def test_entropy_rate_matches_monte_carlo(source: MarkovSource, long_sample: torch.Tensor) -> None:
    nll = -source.conditional_log_probs(long_sample).numpy()  # (N - 2,)
    batches = nll[: len(nll) // 100 * 100].reshape(100, -1).mean(1)  # batch means
    stderr = batches.std(ddof=1) / math.sqrt(len(batches))
    assert stderr < 0.003
    assert abs(nll.mean() - source.entropy_rate()) < 4 * stderr


def test_sample_frequencies_match_the_source(source: MarkovSource, long_sample: torch.Tensor) -> None:
    ctx = context_ids(long_sample, 2, 16)
    freq = np.bincount(ctx, minlength=256) / len(ctx)
    assert np.abs(freq - source.stationary.numpy()).max() < 0.003
    c = int(np.argmax(freq))  # the most frequent context: its successors follow P(. | c)
    nxt = long_sample.numpy()[2:][ctx == c]
    emp = np.bincount(nxt, minlength=16) / len(nxt)
    assert np.abs(emp - source.transition[c].numpy()).max() < 0.02


def test_sample_is_reproducible(source: MarkovSource) -> None:
    a = source.sample(5000, seed=7)
    assert a.dtype == torch.long and a.shape == (5000,)
    assert int(a.min()) >= 0 and int(a.max()) < 16
    assert torch.equal(a, source.sample(5000, seed=7))
    assert not torch.equal(a, source.sample(5000, seed=8))
    assert torch.equal(a, source.sample(5000, seed=np.random.default_rng(7)))
    train, val = source.train_val(3000, 2000, seed=7)
    assert torch.equal(torch.cat([train, val]), a)
    assert torch.equal(MarkovSource(seed=0).transition, source.transition)
    assert not torch.equal(MarkovSource(seed=1).transition, source.transition)


@settings(max_examples=15, deadline=None)
@given(v=st.integers(2, 6), k=st.integers(1, 3), alpha=st.floats(0.05, 3.0), seed=st.integers(0, 99))
def test_random_sources_are_valid(v: int, k: int, alpha: float, seed: int) -> None:
    src = MarkovSource(vocab_size=v, order=k, concentration=alpha, seed=seed)
    assert src.transition.shape == (v**k, v)
    assert torch.allclose(src.transition.sum(1), torch.ones(v**k, dtype=torch.float64))
    assert src.stationary_residual() < 1e-12
    assert 0 <= src.entropy_rate() <= math.log(v) + 1e-12


def test_nearly_periodic_chain_has_a_stationary_distribution() -> None:
    # Transitions within 1e-8 of a deterministic 2-cycle: power iteration barely moves,
    # so the exact linear solve has to take over.
    src = MarkovSource(vocab_size=2, order=1, concentration=0.0625, seed=2)
    assert src.transition[0, 1] > 1 - 1e-7 and src.transition[1, 0] > 1 - 1e-7
    assert src.stationary_residual() < 1e-12
    assert torch.allclose(src.stationary, torch.tensor([0.5, 0.5], dtype=torch.float64),
                          atol=1e-7)


# ---------------------------------------------------------------- bad input


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="vocab_size must be an int >= 2, got 1"):
        MarkovSource(vocab_size=1)
    with pytest.raises(ValueError, match="order must be an int >= 1, got 0"):
        MarkovSource(order=0)
    with pytest.raises(ValueError, match="concentration must be > 0, got 0"):
        MarkovSource(concentration=0)
    with pytest.raises(ValueError, match="1073741824 contexts"):
        MarkovSource(vocab_size=32, order=6)
    with pytest.raises(ValueError, match="sum to 1"):
        MarkovSource.from_transition([[0.5, 0.6], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"shape \(3, 2\)"):
        MarkovSource.from_transition(np.full((3, 2), 0.5), order=1)
    with pytest.raises(ValueError, match="num_tokens must be an int >= order = 2, got 1"):
        default_source().sample(1)
    with pytest.raises(TypeError, match="integer"):
        as_token_array(torch.zeros(3))
    with pytest.raises(ValueError, match=r"1-D .* \(2, 2\)"):
        as_token_array(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"token 16 is outside the vocabulary \[0, 16\)"):
        default_source().conditional_log_probs(torch.tensor([0, 1, 16]))
