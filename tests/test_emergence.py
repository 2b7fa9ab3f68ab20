"""Tests for llmbook.training.emergence: the fact-recall task, answer metrics, p^L, published runs."""

import functools
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.training.emergence import (
    EMERGENCE_RESULTS,
    FACT_VOCAB,
    PUBLISHED_RUNS,
    PublishedRun,
    answer_log_probs,
    answer_logits,
    edit_distance,
    emergence_sweep,
    exact_match,
    exact_match_from_per_token,
    fact_table,
    greedy_answers,
    per_token_accuracy,
    score_answers,
    token_edit_distance,
    train_fact_model,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM


def tiny_model(vocab=11, d=16, layers=2, seed=0, max_len=16):
    config = TransformerConfig.llama_style(vocab_size=vocab, d_model=d, n_layers=layers,
                                           n_heads=2, max_seq_len=max_len)
    return TransformerLM(config, generator=torch.Generator().manual_seed(seed)).eval()


# ---------------------------------------------------------------- the task


def test_fact_table_worked_example():
    prompts, answers = fact_table(2, 5, torch.Generator().manual_seed(3))
    assert prompts.shape == (100, 3) and answers.shape == (100, 5)  # non-square
    assert prompts[0].tolist() == [0, 0, 10] and prompts[47].tolist() == [4, 7, 10]
    assert prompts[99].tolist() == [9, 9, 10]
    assert FACT_VOCAB[10] == "=" and int(answers.min()) >= 0 and int(answers.max()) <= 9
    again = torch.randint(0, 10, (100, 5), generator=torch.Generator().manual_seed(3))
    assert torch.equal(answers, again)  # the answers are the generator's digits, in order


def test_fact_table_bad_input():
    g = torch.Generator()
    with pytest.raises(ValueError, match="key_digits"):
        fact_table(0, 3, g)
    with pytest.raises(ValueError, match="key_digits"):
        fact_table(6, 3, g)
    with pytest.raises(ValueError, match="answer_length"):
        fact_table(1, -2, g)
    with pytest.raises(TypeError, match="generator"):
        fact_table(1, 3, 0)


# ---------------------------------------------------------------- metrics


def test_answer_log_probs_worked_example():
    # two answers of three tokens over V = 2: logits (0, log 3) give p = (1/4, 3/4)
    logits = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64).expand(2, 3, 2)
    answers = torch.tensor([[1, 1, 0], [0, 1, 1]])
    got = answer_log_probs(logits, answers)
    want = torch.tensor([[math.log(0.75)] * 2 + [math.log(0.25)],
                         [math.log(0.25)] + [math.log(0.75)] * 2], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)


def test_answer_log_probs_equals_torch_cross_entropy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 4, 7, generator=g, dtype=torch.float64)
    answers = torch.randint(0, 7, (5, 4), generator=g)
    want = -F.cross_entropy(logits.reshape(-1, 7), answers.reshape(-1), reduction="none").reshape(5, 4)
    torch.testing.assert_close(answer_log_probs(logits, answers), want, rtol=0, atol=1e-14)


def test_answer_logits_are_the_full_forward_sliced():
    model = tiny_model()
    prompts, answers = fact_table(1, 4, torch.Generator().manual_seed(0))  # (10, 2), (10, 4)
    got = answer_logits(model, prompts, answers)
    with torch.no_grad():
        full = model(torch.cat([prompts, answers], dim=1))  # also has the logits after the last token
    assert got.shape == (10, 4, 11)
    torch.testing.assert_close(got, full[:, 1:5], rtol=1e-5, atol=1e-6)  # causal: the extra token is invisible


def test_accuracy_and_exact_match_worked_example():
    correct = torch.tensor([[True, True, True], [True, False, True]])  # (2, 3)
    assert per_token_accuracy(correct) == pytest.approx(5 / 6, abs=1e-15)
    assert exact_match(correct) == 0.5
    assert exact_match(torch.zeros(4, 2, dtype=torch.bool)) == 0.0


def test_metrics_bad_input():
    with pytest.raises(TypeError, match="correct"):
        per_token_accuracy(torch.ones(2, 3))
    with pytest.raises(ValueError, match="correct"):
        exact_match(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="logits"):
        answer_log_probs(torch.zeros(2, 4, 5), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="answers"):
        answer_log_probs(torch.zeros(2, 3, 5), torch.full((2, 3), 5))
    with pytest.raises(TypeError, match="answers"):
        answer_log_probs(torch.zeros(2, 3, 5), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="rows"):
        answer_logits(tiny_model(), torch.zeros(2, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="rows"):
        token_edit_distance(torch.zeros(2, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))


def test_exact_match_from_per_token_worked_example():
    assert exact_match_from_per_token(0.9, 6) == pytest.approx(0.531441, abs=1e-15)
    np.testing.assert_allclose(exact_match_from_per_token(np.array([0.5, 1.0, 0.0]), 3), [0.125, 1.0, 0.0])
    with pytest.raises(ValueError, match="p must"):
        exact_match_from_per_token(1.2, 3)
    with pytest.raises(ValueError, match="^L must be positive"):
        exact_match_from_per_token(0.5, 0)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_exact_match_from_per_token_properties(p, L):
    em = exact_match_from_per_token(p, L)
    assert 0.0 <= em <= p + 1e-15  # never above one token's accuracy
    assert exact_match_from_per_token(p, L + 1) <= em + 1e-15  # longer answers are harder


def test_p_to_the_L_against_independent_tokens():
    # tokens right independently with probability p: exact match -> p^L (within 4 standard errors)
    g = torch.Generator().manual_seed(0)
    p, L, n = 0.8, 5, 200_000
    correct = torch.rand(n, L, generator=g) < p
    em, want = exact_match(correct), exact_match_from_per_token(p, L)
    assert abs(em - want) < 4 * math.sqrt(want * (1 - want) / n)
    assert abs(per_token_accuracy(correct) - p) < 4 * math.sqrt(p * (1 - p) / (n * L))


@functools.cache
def _levenshtein_recursive(a, b):
    """The definition, by recursion on the last tokens (an independent implementation)."""
    if not a or not b:
        return len(a) + len(b)
    return min(_levenshtein_recursive(a[:-1], b) + 1, _levenshtein_recursive(a, b[:-1]) + 1,
               _levenshtein_recursive(a[:-1], b[:-1]) + (a[-1] != b[-1]))


def test_edit_distance_worked_examples():
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance([1, 2, 3], [2, 3]) == 1 and edit_distance([], [4, 4]) == 2
    assert edit_distance([1, 2, 3, 4], [2, 3, 4, 1]) == 2  # a rotation: 2 edits, Hamming 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=7), st.lists(st.integers(0, 3), max_size=7))
def test_edit_distance_properties(a, b):
    d = edit_distance(a, b)
    assert d == _levenshtein_recursive(tuple(a), tuple(b))
    assert d == edit_distance(b, a)
    assert (d == 0) == (a == b)
    assert abs(len(a) - len(b)) <= d <= max(len(a), len(b))
    if len(a) == len(b):
        assert d <= sum(x != y for x, y in zip(a, b, strict=True))  # at most the Hamming distance


def test_token_edit_distance_is_the_mean():
    predicted = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0], [5, 6, 7, 8]])
    answers = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 1], [6, 7, 8, 9]])
    assert token_edit_distance(predicted, answers) == pytest.approx((0 + 1 + 2) / 3, abs=1e-15)


# ---------------------------------------------------------------- greedy decoding


def test_greedy_exact_match_equals_teacher_forced_exact_match():
    model = tiny_model(seed=2)
    prompts, answers = fact_table(1, 3, torch.Generator().manual_seed(0))
    greedy = greedy_answers(model, prompts, 3)
    assert greedy.shape == (10, 3)
    # the model's own greedy answers are, position by position, its teacher-forced argmax
    assert torch.equal(answer_logits(model, prompts, greedy).argmax(-1), greedy)
    # against other answers: a row is all right under teacher forcing iff greedy reproduces it
    mixed = torch.where(torch.arange(10)[:, None] % 2 == 0, greedy, answers)
    tf_rows = (answer_logits(model, prompts, mixed).argmax(-1) == mixed).all(1)
    assert torch.equal(tf_rows, (greedy == mixed).all(1))
    assert int(tf_rows.sum()) >= 5
    scores = score_answers(model, prompts, mixed)
    assert scores["exact_match"] == scores["exact_match_greedy"] == float(tf_rows.double().mean())


def test_greedy_answers_bad_input():
    with pytest.raises(ValueError, match="^L must be positive"):
        greedy_answers(tiny_model(), torch.zeros(2, 2, dtype=torch.long), 0)
    with pytest.raises(TypeError, match="prompts"):
        greedy_answers(tiny_model(), [[0, 1]], 2)


# ---------------------------------------------------------------- training and the sweep


def test_train_fact_model_memorises_a_small_table():
    torch.set_num_threads(1)
    prompts, answers = fact_table(1, 3, torch.Generator().manual_seed(0))  # 10 facts
    before = score_answers(tiny_model(seed=0), prompts, answers)
    model = train_fact_model(prompts, answers, d_model=16, n_layers=1, steps=150, lr=1e-2)
    after = score_answers(model, prompts, answers)
    assert before["per_token_accuracy"] < 0.5
    assert after["per_token_accuracy"] == 1.0 and after["exact_match"] == 1.0
    assert after["mean_log_prob"] > before["mean_log_prob"] + 1.0
    assert not model.training


def test_train_fact_model_bad_input():
    prompts, answers = fact_table(1, 3, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="d_model"):
        train_fact_model(prompts, answers, d_model=0)
    with pytest.raises(ValueError, match="steps"):
        train_fact_model(prompts, answers, d_model=8, steps=-1)


def test_emergence_sweep_records():
    result = emergence_sweep(widths=(8, 16), key_digits=1, answer_length=2, steps=3)
    assert result["answer_length"] == 2 and result["n_facts"] == 10
    assert [r["d_model"] for r in result["runs"]] == [8, 16]
    for r in result["runs"]:
        assert r["exact_match"] == r["exact_match_greedy"]
        assert r["exact_match"] <= r["per_token_accuracy"] <= 1
        assert len(r["per_position_accuracy"]) == 2 and r["N"] < r["N_total"]


def test_shipped_sweep_is_consistent():
    result = json.loads(EMERGENCE_RESULTS.read_text())
    runs = result["runs"]
    assert len(runs) >= 5 and [r["N"] for r in runs] == sorted(r["N"] for r in runs)
    for r in runs:
        assert r["exact_match"] == r["exact_match_greedy"]
        assert r["exact_match"] <= r["per_token_accuracy"] + 1e-12
        assert math.isclose(r["per_token_accuracy"], float(np.mean(r["per_position_accuracy"])), abs_tol=1e-9)
        assert 0 <= r["token_edit_distance"] <= result["answer_length"]
        assert r["mean_log_prob"] <= 0


# ---------------------------------------------------------------- published runs


def test_published_runs():
    runs = {r.model: r for r in PUBLISHED_RUNS}
    assert len(runs) == len(PUBLISHED_RUNS)
    assert runs["Chinchilla"].tokens_per_parameter == pytest.approx(20.0, abs=1e-12)
    assert runs["GPT-3 175B"].tokens_per_parameter == pytest.approx(300 / 175, abs=1e-12)
    assert runs["Gopher"].params / runs["Chinchilla"].params == pytest.approx(4.0, abs=1e-12)
    assert runs["Mistral 7B"].tokens is None and runs["Mistral 7B"].tokens_per_parameter is None
    assert runs["PaLM 2"].params is None and runs["PaLM 2"].tokens_per_parameter is None
    assert PublishedRun("x", 2.0, None, "s").tokens_per_parameter is None
    assert all(r.source for r in PUBLISHED_RUNS)


def test_emergent_scales_and_codex():
    from llmbook.training.emergence import CODEX_PASS_AT_1, EMERGENT_SCALES

    scales = [params for _, _, params, _ in EMERGENT_SCALES]
    assert min(scales) == 6e9 and max(scales) == 540e9
    assert all(source.startswith("Wei et al. (2022)") for *_, source in EMERGENT_SCALES)
    sizes, rates = zip(*CODEX_PASS_AT_1, strict=True)
    assert list(sizes) == sorted(sizes) and list(rates) == sorted(rates) and max(rates) < 1
