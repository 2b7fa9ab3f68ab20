"""Tests for llmbook.pretrained: the book's cached models and the sampling helper."""

import pytest
import torch

from llmbook.data import default_source
from llmbook.model import TransformerConfig, TransformerLM
from llmbook.pretrained import (
    RECIPES,
    book_model,
    cache_dir,
    generate,
    recipe_hash,
    sample_text,
)
from llmbook.train import evaluate


def test_synthetic_book_model_is_within_3_percent_of_the_entropy_rate():
    """Uses the cache (training takes under half a minute from a cold one)."""
    model, info = book_model("synthetic")
    source = default_source()
    H = source.entropy_rate()
    assert info["val_loss"] / H < 1.03 and info["val_loss"] > H - 0.02
    assert abs(info["val_loss_over_entropy_rate"] - info["val_loss"] / H) < 1e-12
    # an independent check on fresh data the model never saw: a new sample of the source
    fresh = source.sample(60_000, seed=2024)
    loss = evaluate(model, fresh, 256, 16, 8, torch.Generator().manual_seed(7), first_position=1)
    assert loss / H < 1.03
    assert not model.training
    assert info["history"]["val_loss"][-1] < info["history"]["val_loss"][0] - 0.9


def test_cache_is_keyed_by_the_recipe_and_reloads_identically(tmp_path, monkeypatch):
    model, info = book_model("synthetic")
    assert info["cache_path"].endswith(f"book_model_synthetic_{recipe_hash('synthetic')}.pt")
    again, info2 = book_model("synthetic")
    assert info2["trained_now"] is False
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values(), strict=True))
    monkeypatch.setitem(RECIPES["synthetic"], "init_seed", 1)
    assert recipe_hash("synthetic") != info["recipe_hash"]


def test_damaged_cache_file_is_retrained(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBOOK_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    recipe = RECIPES["synthetic"]
    tiny_train = {**recipe["train"], "steps": 3, "warmup_steps": 1, "eval_every": 2}
    monkeypatch.setitem(RECIPES, "synthetic", {**recipe, "train": tiny_train,
                                               "data": {**recipe["data"], "num_train": 5_000,
                                                        "num_val": 2_000}})
    model, info = book_model("synthetic")
    assert info["trained_now"] and info["history"]["steps"] == [0, 1, 2]
    path = tmp_path / f"book_model_synthetic_{recipe_hash('synthetic')}.pt"
    path.write_bytes(path.read_bytes()[:100])  # truncate it
    again, info2 = book_model("synthetic")
    assert info2["trained_now"]  # retrained, not trusted
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="kind must be one of"):
        book_model("poetry")


def test_generate_greedy_matches_argmax_and_sampling_is_seeded():
    cfg = TransformerConfig.gpt2_style(vocab_size=11, d_model=16, n_layers=1, n_heads=2,
                                       max_seq_len=5)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = generate(model, ids, 4, temperature=0)
    assert out.shape == (2, 7) and torch.equal(out[:, :3], ids)
    with torch.no_grad():
        manual = ids
        for _ in range(4):
            manual = torch.cat([manual, model(manual[:, -5:])[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, manual)
    a = generate(model, ids, 6, 1.0, top_k=3, generator=torch.Generator().manual_seed(1))
    b = generate(model, ids, 6, 1.0, top_k=3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    with torch.no_grad():  # top-k: every sampled token is among the 3 most likely
        for t in range(3, 9):
            top3 = model(a[:, max(0, t - 5):t])[:, -1].topk(3).indices
            assert (top3 == a[:, t:t + 1]).any(-1).all()
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, ids, 1, temperature=-1.0)
    with pytest.raises(ValueError, match="ids must have shape"):
        generate(model, ids[0], 1)


class ByteTokenizer:
    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


def test_sample_text_starts_with_the_prompt():
    cfg = TransformerConfig.gpt2_style(vocab_size=256, d_model=16, n_layers=1, n_heads=2,
                                       max_seq_len=16)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    text = sample_text(model, ByteTokenizer(), "abc", 5, temperature=0)
    assert text.startswith("abc") and len(text.encode(errors="replace")) >= 3
    with pytest.raises(ValueError, match="prompt must encode"):
        sample_text(model, ByteTokenizer(), "", 5)
