"""Packing documents into chunks with document-aware masks, and resumable batch order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.functional import cross_entropy
from llmbook.training.packing import ResumableBatches, pack_documents
from llmbook.transformer.model import TransformerConfig, TransformerLM

IGNORE = -100


def test_worked_example_exact_tensors():
    # documents [5 6 7], [8], [9 10 11 12 13] with separator 1, chunks of 4:
    # stream 5 6 7 1 | 8 1 9 10 | 11 12 13 1 (12 tokens, 3 chunks, no padding)
    p = pack_documents([[5, 6, 7], [8], [9, 10, 11, 12, 13]], chunk_len=4, sep_id=1)
    assert p.ids.tolist() == [[5, 6, 7, 1], [8, 1, 9, 10], [11, 12, 13, 1]]
    assert p.documents.tolist() == [[0, 0, 0, 0], [1, 1, 2, 2], [2, 2, 2, 2]]
    assert p.segments.tolist() == [[0, 0, 0, 0], [1, 1, 2, 2], [3, 3, 3, 3]]
    assert p.positions.tolist() == [[0, 1, 2, 3], [0, 1, 0, 1], [0, 1, 2, 3]]
    assert p.targets.tolist() == [[6, 7, 1, IGNORE], [1, IGNORE, 10, IGNORE], [12, 13, 1, IGNORE]]
    assert p.padding_fraction == 0.0
    mask = p.attention_mask()
    assert mask.shape == (3, 1, 4, 4)
    assert mask[1, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]


def test_padding_and_no_separator():
    p = pack_documents([[3, 4, 5]], chunk_len=5, pad_id=2)
    assert p.ids.tolist() == [[3, 4, 5, 2, 2]]
    assert p.segments.tolist() == [[0, 0, 0, -1, -1]]
    assert p.documents.tolist() == [[0, 0, 0, -1, -1]]
    assert p.positions.tolist() == [[0, 1, 2, 0, 0]]
    assert p.targets.tolist() == [[4, 5, IGNORE, IGNORE, IGNORE]]
    assert p.padding_fraction == pytest.approx(2 / 5)
    assert not p.attention_mask()[0, 0, 3:].any()  # padding attends to nothing


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6), L=st.integers(1, 7),
       sep=st.booleans())
def test_properties_of_any_packing(lengths, L, sep):
    docs = [[10 + 10 * d + i for i in range(n)] for d, n in enumerate(lengths)]
    p = pack_documents(docs, L, sep_id=1 if sep else None)
    total = sum(lengths) + (len(lengths) if sep else 0)
    assert p.ids.shape == (-(-total // L), L)
    real = p.segments >= 0
    assert int(real.sum()) == total  # every token once, padding only at the end
    assert p.ids[real].tolist() == [t for doc in docs for t in doc + ([1] if sep else [])]
    # a target is the next token of its segment; the segment's last token has none
    kept = p.targets != IGNORE
    assert int(kept.sum()) == total - int(p.segments.max()) - 1
    flat_ids, flat_t, flat_s = p.ids.view(-1), p.targets.view(-1), p.segments.view(-1)
    for i in torch.nonzero(kept.view(-1))[:, 0].tolist():
        assert flat_t[i] == flat_ids[i + 1] and flat_s[i] == flat_s[i + 1]
    # positions count from 0 inside each segment
    for s in range(int(p.segments.max()) + 1):
        assert p.positions[p.segments == s].tolist() == list(range(int((p.segments == s).sum())))


def test_packed_model_equals_each_segment_run_alone():
    """The mask and positions make a packed chunk compute what each segment computes alone."""
    torch.manual_seed(0)
    config = TransformerConfig.llama_style(vocab_size=32, d_model=24, n_layers=2, n_heads=4,
                                           max_seq_len=16)
    model = TransformerLM(config).double().eval()
    docs = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
    p = pack_documents(docs, chunk_len=10, sep_id=1)
    with torch.no_grad():
        packed = model(p.ids, positions=p.positions, mask=p.attention_mask())  # (N, L, V)
        for s in range(int(p.segments.max()) + 1):
            where = p.segments == s
            alone = model(p.ids[where][None])[0]  # the segment as its own sequence
            torch.testing.assert_close(packed[where], alone, rtol=0, atol=1e-12)
        # and the loss: packed with ignored targets equals the token-weighted mean of the parts
        loss = cross_entropy(packed, p.targets)
        parts = [cross_entropy(model(p.ids[p.segments == s][None])[0, :-1],
                               p.ids[p.segments == s][1:], reduction="sum")
                 for s in range(int(p.segments.max()) + 1)]
        n = int((p.targets != IGNORE).sum())
        torch.testing.assert_close(loss, sum(parts) / n, rtol=0, atol=1e-12)
        # the plain causal mask leaks across documents: a different answer
        leaky = model(p.ids)
        assert (leaky - packed).abs().max() > 1e-3


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="documents must be a sequence"):
        pack_documents("abc", 4)
    with pytest.raises(ValueError, match="at least one document"):
        pack_documents([], 4)
    with pytest.raises(ValueError, match=r"documents\[1\] is empty"):
        pack_documents([[1], []], 4)
    with pytest.raises(ValueError, match=r"documents\[0\] must hold non-negative integer"):
        pack_documents([[1, -2]], 4)
    with pytest.raises(ValueError, match=r"documents\[0\] must hold non-negative integer"):
        pack_documents([[1.5]], 4)
    with pytest.raises(TypeError, match=r"documents\[0\] must be a 1-D integer tensor"):
        pack_documents([torch.ones(3)], 4)
    with pytest.raises(ValueError, match="chunk_len must be positive"):
        pack_documents([[1]], 0)
    with pytest.raises(ValueError, match="sep_id must be a non-negative"):
        pack_documents([[1]], 4, sep_id=-1)
    with pytest.raises(ValueError, match="ignore_index must be a negative"):
        pack_documents([[1]], 4, ignore_index=0)
    assert pack_documents([torch.tensor([4, 5])], 2).ids.tolist() == [[4, 5]]


def test_each_epoch_visits_every_item_once_and_depends_on_the_seed_only():
    it = ResumableBatches(10, 3, seed=7, drop_last=False)
    assert it.batches_per_epoch == 4
    epoch0 = torch.cat([next(it) for _ in range(4)])
    assert sorted(epoch0.tolist()) == list(range(10))
    epoch1 = torch.cat([next(it) for _ in range(4)])
    assert sorted(epoch1.tolist()) == list(range(10)) and epoch1.tolist() != epoch0.tolist()
    again = ResumableBatches(10, 3, seed=7, drop_last=False)
    assert torch.cat([next(again) for _ in range(4)]).tolist() == epoch0.tolist()
    other = ResumableBatches(10, 3, seed=8, drop_last=False)
    assert torch.cat([next(other) for _ in range(4)]).tolist() != epoch0.tolist()
    plain = ResumableBatches(5, 2, shuffle=False)  # drop_last: the 5th item is never drawn
    assert [next(plain).tolist() for _ in range(3)] == [[0, 1], [2, 3], [0, 1]]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 30), b=st.integers(1, 8), stop=st.integers(0, 25), seed=st.integers(0, 99),
       drop_last=st.booleans())
def test_a_resumed_run_sees_the_batches_an_uninterrupted_one_sees(n, b, stop, seed, drop_last):
    if drop_last and b > n:
        return
    straight = ResumableBatches(n, b, seed=seed, drop_last=drop_last)
    expected = [next(straight).tolist() for _ in range(stop + 10)]
    first = ResumableBatches(n, b, seed=seed, drop_last=drop_last)
    for _ in range(stop):
        next(first)
    state = first.state_dict()
    resumed = ResumableBatches(n, b, seed=seed, drop_last=drop_last)
    resumed.load_state_dict(dict(state))
    assert [next(resumed).tolist() for _ in range(10)] == expected[stop:]


def test_resumable_batches_bad_input():
    with pytest.raises(ValueError, match="larger than num_items"):
        ResumableBatches(3, 4)
    with pytest.raises(ValueError, match="seed must be a non-negative"):
        ResumableBatches(3, 1, seed=-1)
    it = ResumableBatches(6, 2, seed=1)
    with pytest.raises(ValueError, match="saved with seed=2"):
        it.load_state_dict({**it.state_dict(), "seed": 2})
    with pytest.raises(ValueError, match="lacks"):
        it.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="past the 3 batches"):
        it.load_state_dict({**it.state_dict(), "position": 4})
    with pytest.raises(TypeError, match="state must be a dict"):
        it.load_state_dict([1, 2])
