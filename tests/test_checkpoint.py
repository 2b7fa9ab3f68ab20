"""Tests for llmbook.training.checkpoint: atomic writes, safe loading, clear errors."""

import os
import pickle

import pytest
import torch
from torch import nn

import llmbook.training.checkpoint as ckpt
from llmbook.training.checkpoint import (
    atomic_save,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from llmbook.training.optim import AdamW
from llmbook.transformer.model import TransformerConfig, TransformerLM


def small_model(seed=0, d=16):
    cfg = TransformerConfig.gpt2_style(vocab_size=10, d_model=d, n_layers=1, n_heads=2,
                                       max_seq_len=8)
    return TransformerLM(cfg, generator=torch.Generator().manual_seed(seed))


def trained_pair(seed=0):
    model = small_model(seed)
    opt = AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 10, (3, 8), generator=torch.Generator().manual_seed(seed))
    model(x).logsumexp(-1).mean().backward()
    opt.step()
    return model, opt


def test_round_trip_restores_model_optimizer_step_and_extra(tmp_path):
    model, opt = trained_pair()
    rng = torch.Generator().manual_seed(3).get_state()
    path = save_checkpoint(tmp_path / "c.pt", model, opt, 17, rng=rng, note="hello", losses=[1.5])
    fresh = small_model(seed=1)
    fresh_opt = AdamW(fresh.parameters(), lr=1e-2)
    assert load_checkpoint(path, fresh, fresh_opt) == 17
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    s0 = opt.state_dict()["state"][0]
    s1 = fresh_opt.state_dict()["state"][0]
    assert torch.equal(s0["exp_avg"], s1["exp_avg"]) and torch.equal(s0["exp_avg_sq"], s1["exp_avg_sq"])
    extra = read_checkpoint(path)["extra"]
    assert torch.equal(extra["rng"], rng) and extra["note"] == "hello" and extra["losses"] == [1.5]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no leftovers


def test_round_trip_through_a_file_object():
    import io
    model, opt = trained_pair()
    buffer = io.BytesIO()
    assert save_checkpoint(buffer, model, opt, 5, note="in memory") is buffer
    buffer.seek(0)
    fresh = small_model(seed=1)
    fresh_opt = AdamW(fresh.parameters(), lr=1e-2)
    assert load_checkpoint(buffer, fresh, fresh_opt) == 5
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    buffer.seek(0)
    assert read_checkpoint(buffer)["extra"] == {"note": "in memory"}
    with pytest.raises(ValueError, match="not an llmbook checkpoint"):
        other = io.BytesIO()
        torch.save({"x": 1}, other)
        other.seek(0)
        read_checkpoint(other)
    with pytest.raises(TypeError, match="binary file object"):
        save_checkpoint(42, model, opt, 1)
    with pytest.raises(TypeError, match="binary file object"):
        read_checkpoint(3.5)


def test_crash_mid_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    model, opt = trained_pair()
    path = save_checkpoint(tmp_path / "c.pt", model, opt, 5)
    before = path.read_bytes()

    def crashing_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip file")  # some bytes reach the disk, then the crash
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt.torch, "save", crashing_save)
    other, other_opt = trained_pair(seed=1)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(path, other, other_opt, 6)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.pt"]  # the temporary file was removed
    fresh = small_model(seed=2)
    assert load_checkpoint(path, fresh) == 5
    assert torch.equal(fresh.embed.weight, model.embed.weight)


def test_non_atomic_write_would_have_destroyed_it(tmp_path):
    """The failure mode atomic_save prevents: writing in place and crashing mid-write."""
    model, opt = trained_pair()
    path = save_checkpoint(tmp_path / "c.pt", model, opt, 5)
    with open(path, "wb") as f:  # what torch.save(obj, path) does first: truncate
        f.write(b"PK\x03\x04 half")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        read_checkpoint(path)


def test_truncated_and_garbage_files_raise_value_error_naming_the_file(tmp_path):
    model, opt = trained_pair()
    path = save_checkpoint(tmp_path / "good.pt", model, opt, 1)
    data = path.read_bytes()
    for name, content in [("truncated.pt", data[: len(data) // 2]), ("garbage.pt", b"\x00" * 64),
                          ("empty.pt", b""), ("text.pt", b"not a checkpoint at all")]:
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=rf"checkpoint .*{name} is corrupt or truncated"):
            load_checkpoint(bad, small_model())
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt", small_model())


def test_not_an_llmbook_checkpoint(tmp_path):
    torch.save({"model": {}}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="plain.pt is not an llmbook checkpoint"):
        read_checkpoint(tmp_path / "plain.pt")


class Payload:
    """An arbitrary object: unpickling it would call os.system under plain pickle."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_weights_only_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"format": ckpt.FORMAT, "step": 0, "model": {}, "optimizer": None,
                    "extra": {"x": Payload()}}, f)
    with pytest.raises(ValueError, match=r"evil.pt holds objects that safe loading .*refuses"):
        read_checkpoint(path)
    # the refusal comes from PyTorch's restricted unpickler itself
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


def test_wrong_model_names_missing_unexpected_and_shapes(tmp_path):
    model, opt = trained_pair()
    path = save_checkpoint(tmp_path / "c.pt", model, opt, 3)
    with pytest.raises(ValueError, match=r"shape mismatches \['embed.weight: checkpoint \(10, 16\) "
                                         r"vs model \(10, 24\)'"):
        load_checkpoint(path, small_model(d=24))
    two_layers = TransformerLM(TransformerConfig.gpt2_style(vocab_size=10, d_model=16, n_layers=2,
                                                            n_heads=2, max_seq_len=8))
    with pytest.raises(ValueError, match=r"missing keys \['blocks.1."):
        load_checkpoint(path, two_layers)
    llama = TransformerLM(TransformerConfig.llama_style(vocab_size=10, d_model=16, n_layers=1,
                                                        n_heads=2, max_seq_len=8))
    with pytest.raises(ValueError, match=r"unexpected keys \['pos_embed.weight'"):
        load_checkpoint(path, llama)
    before = [p.clone() for p in llama.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, llama.parameters(), strict=True))


def test_optimizer_requested_but_not_saved(tmp_path):
    model = small_model()
    path = save_checkpoint(tmp_path / "c.pt", model, None, 0)
    assert load_checkpoint(path, small_model()) == 0
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(path, small_model(), AdamW(nn.Linear(2, 2).parameters()))
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        save_checkpoint(tmp_path / "d.pt", model, None, -1)


def test_atomic_save_creates_directories(tmp_path):
    path = atomic_save({"a": torch.ones(2)}, tmp_path / "deep" / "er" / "x.pt")
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(2))
