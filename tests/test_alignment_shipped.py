"""Tests for llmbook.alignment.shipped (Part V's shipped artifacts) and the shared task of
llmbook.alignment.preferences."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.alignment import shipped
from llmbook.alignment.preferences import (
    KEYWORDS,
    PREFERENCE_RECIPE,
    corpus_prompts,
    evaluate_policy,
    keyword_ids,
    keyword_reward,
    label_preferences,
    preference_data,
    sample_responses,
)
from llmbook.training.pretrained import book_model, models_dir
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")


def _toy(recipe):
    n = recipe["n"]
    return {"x": torch.arange(n, dtype=torch.float32), "ids": torch.arange(n).to(torch.int16)}, \
        {"total": n * (n - 1) / 2}


@pytest.fixture
def toy_artifact(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMBOOK_MODELS", str(tmp_path))
    monkeypatch.setattr(shipped, "ARTIFACTS", {})
    shipped.register("toy", {"n": 5}, _toy, "tests")
    return tmp_path


def test_write_then_load_round_trips_exactly(toy_artifact):
    info = shipped.write_artifact("toy")
    assert info["total"] == 10 and info["recipe"] == {"n": 5}
    assert info["made"]["command"] == "python -m llmbook.alignment.shipped toy"
    tensors, loaded = shipped.load_artifact("toy")
    assert torch.equal(tensors["x"], torch.arange(5, dtype=torch.float32))
    assert tensors["ids"].dtype == torch.int16
    assert loaded["recipe_hash"] == shipped.artifact_hash("toy") == info["recipe_hash"]
    assert json.loads((toy_artifact / "toy" / "info.json").read_text())["total"] == 10


def test_a_changed_recipe_or_missing_files_are_refused(toy_artifact, monkeypatch):
    with pytest.raises(ValueError, match="missing.*python -m llmbook.alignment.shipped toy"):
        shipped.load_artifact("toy")
    shipped.write_artifact("toy")
    old = shipped.artifact_hash("toy")
    shipped.ARTIFACTS["toy"] = shipped.Artifact("toy", {"n": 6}, _toy, "tests")
    assert shipped.artifact_hash("toy") != old
    with pytest.raises(ValueError, match=f"made from recipe {old}"):
        shipped.load_artifact("toy")


def test_cli_writes_the_named_artifacts(toy_artifact, capsys, monkeypatch):
    monkeypatch.setattr(shipped, "_import_all", lambda: None)
    assert shipped.main(["toy", "--out", str(toy_artifact / "elsewhere")]) == 0
    assert (toy_artifact / "elsewhere" / "toy" / "tensors.safetensors").is_file()
    assert "toy: made in" in capsys.readouterr().out


def test_register_rejects_bad_names_and_clashes(toy_artifact):
    with pytest.raises(ValueError, match="without '/'"):
        shipped.register("a/b", {}, _toy, "tests")
    with pytest.raises(ValueError, match="already registered by tests"):
        shipped.register("toy", {"n": 5}, _toy, "another.module")
    with pytest.raises(TypeError, match="not JSON serializable"):
        shipped.register("bad", {"f": object()}, _toy, "tests")  # not JSON-able
    with pytest.raises(ValueError, match="unknown artifact 'nope'"):
        shipped.load_artifact("nope")
    with pytest.raises(TypeError, match="must be a str"):
        shipped.load_artifact(3)


# ---------------------------------------------------------------- the shared task


@pytest.fixture(scope="module")
def text_model():
    return book_model("text")


def test_keywords_are_single_tokens_and_reward_counts_them(text_model):
    _, info = text_model
    tok = info["tokenizer"]
    kw = keyword_ids(tok)
    assert len(kw) == len(KEYWORDS) and torch.equal(kw, kw.sort().values)
    r = keyword_reward(torch.tensor([tok.encode(" value value the None")]), kw)
    assert r.tolist() == [3.0]
    assert keyword_reward(torch.tensor([tok.encode(" the cat sat")]), kw).tolist() == [0.0]
    with pytest.raises(ValueError, match="is 2 tokens"):
        keyword_ids(tok, (" false",))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=4, max_size=4), min_size=1, max_size=5),
       st.integers(0, 2**16))
def test_keyword_reward_matches_a_loop_and_respects_the_mask(rows, seed):
    ids = torch.tensor(rows)
    kw = torch.tensor([2, 3, 7])
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) < 0.5
    expect = [sum(1 for v, m in zip(row, mrow, strict=True) if v in (2, 3, 7) and m)
              for row, mrow in zip(rows, mask.tolist(), strict=True)]
    assert keyword_reward(ids, kw, mask).tolist() == expect
    assert keyword_reward(ids, kw).tolist() == [sum(v in (2, 3, 7) for v in row) for row in rows]


def test_keyword_reward_rejects_bad_input():
    with pytest.raises(TypeError, match="response_ids"):
        keyword_reward(torch.zeros(2, 3), torch.tensor([1]))
    with pytest.raises(TypeError, match="keywords"):
        keyword_reward(torch.zeros(2, 3, dtype=torch.long), [1])
    with pytest.raises(ValueError, match="mask must be a tensor of shape"):
        keyword_reward(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1]), torch.ones(3, 2))


def test_labels_follow_bradley_terry():
    g = torch.Generator().manual_seed(0)
    n = 40_000
    ra, rb = torch.full((n,), 2.0), torch.full((n,), 1.0)
    frac = label_preferences(ra, rb, 1.0, g).double().mean().item()
    p = torch.sigmoid(torch.tensor(1.0, dtype=torch.float64)).item()
    assert abs(frac - p) < 4 * (p * (1 - p) / n) ** 0.5
    assert label_preferences(ra, rb, 1e6, g).all()  # a very sharp labeller is never wrong
    with pytest.raises(ValueError, match="scale must be > 0"):
        label_preferences(ra, rb, 0.0, g)
    with pytest.raises(ValueError, match="one shape"):
        label_preferences(ra, rb[:3], 1.0, g)


def test_corpus_prompts_are_deterministic_and_distinct(text_model):
    tok = text_model[1]["tokenizer"]
    text = "\n".join(f"line number {i} is long enough to be a prompt for the book" for i in range(30))
    a, b = corpus_prompts(tok, text, 10, 6, seed=1), corpus_prompts(tok, text, 10, 6, seed=1)
    assert a.shape == (10, 6) and torch.equal(a, b)
    assert len({tuple(r) for r in a.tolist()}) == 10
    assert not torch.equal(a, corpus_prompts(tok, text, 10, 6, seed=2))
    with pytest.raises(ValueError, match="only 30 usable lines"):
        corpus_prompts(tok, text, 31, 6, seed=1)
    with pytest.raises(ValueError, match=">= 1"):
        corpus_prompts(tok, text, 0, 6, seed=1)


def test_shipped_preferences_match_their_recipe_and_rewards(text_model):
    tok = text_model[1]["tokenizer"]
    kw = keyword_ids(tok)
    train, test = preference_data("train"), preference_data("test")
    R, P = PREFERENCE_RECIPE["response_tokens"], PREFERENCE_RECIPE["prompt_tokens"]
    assert train.chosen.shape == (PREFERENCE_RECIPE["num_train"], R)
    assert test.prompts.shape == (PREFERENCE_RECIPE["num_test"], P)
    for d in (train, test):
        assert d.chosen.dtype == torch.long
        assert torch.equal(keyword_reward(d.chosen, kw), d.reward_chosen)
        assert torch.equal(keyword_reward(d.rejected, kw), d.reward_rejected)
    # labelled by a noisy labeller: the better response wins more often than it loses
    better = (train.reward_chosen > train.reward_rejected).double().mean()
    worse = (train.reward_chosen < train.reward_rejected).double().mean()
    assert better > 1.5 * worse
    assert (models_dir() / "preferences" / "tensors.safetensors").stat().st_size < 3_000_000
    with pytest.raises(ValueError, match="split must be"):
        preference_data("val")


def test_evaluate_policy_estimates_the_exact_sequence_kl():
    from itertools import product

    from llmbook.alignment.logprobs import response_logprobs

    g = torch.Generator().manual_seed(0)
    cfg = TransformerConfig.gpt2_style(vocab_size=3, d_model=16, n_layers=1, n_heads=2,
                                       max_seq_len=6)
    ref, other = TransformerLM(cfg, generator=g).eval(), TransformerLM(cfg, generator=g).eval()
    with torch.no_grad():
        other.embed.weight.mul_(10)  # peaked next-token distributions: a KL far from 0
    prompt = torch.tensor([[1, 0]])
    kw = torch.tensor([2])
    same = evaluate_policy(ref, ref, prompt.repeat(64, 1), kw, response_tokens=2)
    assert same.kl == 0 and same.kl_stderr == 0 and same.num == 64
    responses = sample_responses(ref, prompt.repeat(64, 1), 2, 1.0, torch.Generator().manual_seed(0))
    assert same.reward == pytest.approx(keyword_reward(responses, kw).double().mean().item())
    # the exact KL(π‖π_ref) over all 3² responses, against the Monte Carlo estimate
    ys = torch.tensor(list(product(range(3), repeat=2)))  # (9, 2)
    with torch.no_grad():
        lp = response_logprobs(other, prompt.repeat(9, 1), ys).double().sum(-1)
        lq = response_logprobs(ref, prompt.repeat(9, 1), ys).double().sum(-1)
    exact = (lp.exp() * (lp - lq)).sum().item()
    est = evaluate_policy(other, ref, prompt.repeat(4000, 1), kw, response_tokens=2)
    assert exact > 0.1 and est.kl_stderr > 0
    assert abs(est.kl - exact) < 4 * est.kl_stderr
