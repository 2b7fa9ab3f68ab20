"""The decoding rules against transformers' logits processors, on the real model's logits.

SmolLM2-135M-Instruct (``load_model``) gives the next-token logits (float32, V = 49152) of
four conversations; each row has its own history (the last 24 tokens of its prompt). Every
rule of :mod:`llmbook.inference.sampling` must return the tensor that transformers' processor
returns (``filter_value=-inf``, ``min_tokens_to_keep=1``, their defaults), kept values and all:

* temperature, repetition penalty, no-repeat n-gram: bitwise equal, always (the same
  arithmetic on the same numbers);
* top-k: bitwise equal when the k-th and (k+1)-th logits differ (on a tie transformers keeps
  every tied token, the book exactly k, the lower token index first);
* min-p: bitwise equal when no token's z - max z lies within 1e-5 of log(min_p) (the book
  tests that in float64 on the logits, transformers compares float32 probabilities);
* top-p: bitwise equal when no running mass lies within 1e-4 of p (transformers sums float32
  probabilities from the least likely token up and removes a token when that sum is
  <= 1 - p; the book sums float64 probabilities from the most likely down and keeps a token
  when the mass before it is < p: the same rule in exact arithmetic). Inside that band the
  two sets may differ, and only by tokens in the band. On float64 logits they agree
  everywhere the band is 1e-9 wide.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from llmbook.inference.gguf import load_model, smollm2_path
from llmbook.inference.sampling import (
    IncrementalDecoder,
    apply_temperature,
    generate,
    min_p_filter,
    no_repeat_ngram_filter,
    process_logits,
    repetition_penalty,
    stream,
    top_k_filter,
    top_p_filter,
)

CONVERSATIONS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "List three fruits."},
     {"role": "assistant", "content": "Apple, banana, cherry."},
     {"role": "user", "content": "Three more?"}],
]
TEMPERATURES = (0.7, 1.0, 1.5)


@pytest.fixture(scope="module")
def real():
    """(model, tokenizer, logits (4, V) float32, histories (4, 24))."""
    model, tokenizer = load_model()
    rows, histories = [], []
    with torch.no_grad():
        for messages in CONVERSATIONS:
            ids = torch.tensor([tokenizer.encode_chat(messages)])  # (1, T)
            rows.append(model(ids)[0, -1])
            histories.append(ids[0, -24:])
    return model, tokenizer, torch.stack(rows), torch.stack(histories)


def top_p_margins(z: torch.Tensor, p: float) -> torch.Tensor:
    """Per row: how far p lies from the running masses that decide the nucleus (float64)."""
    probs = torch.softmax(z.double(), dim=-1)
    sorted_probs = torch.sort(probs, dim=-1, descending=True, stable=True).values
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # (B, V)
    n = (before < p).sum(dim=-1, keepdim=True)  # tokens kept
    last_in = p - before.gather(-1, n - 1)
    first_out = before.gather(-1, n.clamp(max=z.shape[-1] - 1)) - p
    return torch.minimum(last_in, first_out)[:, 0]


def min_p_margins(z: torch.Tensor, min_p: float) -> torch.Tensor:
    """Per row: the distance of the nearest z - max z from the cut log(min_p) (float64)."""
    z = z.double()
    return (z - z.amax(dim=-1, keepdim=True) - math.log(min_p)).abs().amin(dim=-1)


def test_the_rows_are_real_and_different(real):
    _, tokenizer, z, histories = real
    assert z.shape == (4, 49152) and z.dtype == torch.float32
    assert len({tuple(h.tolist()) for h in histories}) == 4
    top = torch.softmax(z.double(), -1).max(dim=-1).values
    assert bool((top < 0.9).all())  # none is a one-token distribution: the filters have work


def test_temperature_is_bitwise_transformers(real):
    _, _, z, histories = real
    for t in (0.3, 0.7, 1.0, 1.5, 2.5):
        assert torch.equal(apply_temperature(z, t), TemperatureLogitsWarper(t)(histories, z))


def test_top_k_is_bitwise_transformers_without_ties(real):
    _, _, z, histories = real
    ranked = torch.sort(z, dim=-1, descending=True).values
    for k in (1, 2, 10, 50, 1000):
        assert bool((ranked[:, k - 1] > ranked[:, k]).all()), f"a tie at the top-{k} boundary"
        assert torch.equal(top_k_filter(z, k), TopKLogitsWarper(k)(histories, z))
    tied = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0]])  # the convention that differs: ties
    assert torch.isfinite(top_k_filter(tied, 2)).tolist() == [[False, True, False, True, False]]
    assert torch.isfinite(TopKLogitsWarper(2)(None, tied)).tolist() == [[False, True, False, True, True]]


def test_top_p_is_bitwise_transformers_away_from_the_boundary(real):
    _, _, z, histories = real
    exact = 0
    for t in TEMPERATURES:
        zt = apply_temperature(z, t)
        for p in (0.5, 0.8, 0.9, 0.95):
            ours, theirs = top_p_filter(zt, p), TopPLogitsWarper(p)(histories, zt)
            margins = top_p_margins(zt, p)
            for b in range(4):
                if margins[b] > 1e-4:
                    assert torch.equal(ours[b], theirs[b]), (t, p, b)
                    exact += 1
                else:  # any disagreement is a token whose running mass is within 1e-4 of p
                    probs = torch.softmax(zt[b].double(), -1)
                    order = torch.sort(probs, descending=True, stable=True).indices
                    before = torch.empty_like(probs)
                    before[order] = torch.cumsum(probs[order], 0) - probs[order]
                    differ = torch.isfinite(ours[b]) != torch.isfinite(theirs[b])
                    assert bool(((before[differ] - p).abs() <= 1e-4).all())
            z64 = zt.double()  # in float64 both sums are exact to ~1e-15
            if bool((top_p_margins(z64, p) > 1e-9).all()):
                assert torch.equal(top_p_filter(z64, p), TopPLogitsWarper(p)(histories, z64))
    assert exact >= 30  # most of the 48 (T, p, row) cases (33 here) are decided by more than 1e-4


def test_min_p_is_bitwise_transformers_away_from_the_cut(real):
    _, _, z, histories = real
    for t in TEMPERATURES:
        zt = apply_temperature(z, t)
        for m in (0.01, 0.05, 0.1, 0.3):
            assert bool((min_p_margins(zt, m) > 1e-5).all()), (t, m)
            assert torch.equal(min_p_filter(zt, m), MinPLogitsWarper(m)(histories, zt))


def test_repetition_penalty_is_bitwise_transformers(real):
    _, _, z, histories = real
    for penalty in (0.8, 1.2, 1.5, 2.0):
        ours = repetition_penalty(z, histories, penalty)
        assert torch.equal(ours, RepetitionPenaltyLogitsProcessor(penalty)(histories, z))
        assert int((ours != z).sum()) > 4 * 10  # every row had tokens to penalise


def test_no_repeat_ngram_is_bitwise_transformers(real):
    _, _, z, histories = real
    looped = torch.cat([histories, histories[:, 4:12]], dim=1)  # (4, 32): repeats to ban
    for n in (1, 2, 3, 4):
        for h in (histories, looped):
            assert torch.equal(no_repeat_ngram_filter(z, h, n), NoRepeatNGramLogitsProcessor(n)(h, z))
    assert int(torch.isinf(no_repeat_ngram_filter(z, looped, 3)).sum()) >= 4


def test_the_whole_chain_is_transformers_processor_list(real):
    _, _, z, histories = real
    for t, k, p, m in ((0.8, 50, 0.9, 0.05), (1.2, 200, 0.8, 0.02)):
        chain = LogitsProcessorList([
            RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(3),
            TemperatureLogitsWarper(t), TopKLogitsWarper(k), TopPLogitsWarper(p),
            MinPLogitsWarper(m)])
        theirs = chain(histories, z.clone())
        ours = process_logits(z, histories, temperature=t, top_k=k, top_p=p, min_p=m,
                              repetition_penalty=1.3, no_repeat_ngram_size=3)
        assert torch.equal(ours, theirs), (t, k, p, m)
        assert 1 < int(torch.isfinite(ours).sum()) < 4 * k


def test_greedy_with_penalties_is_transformers_generate(real):
    """End to end: the history the penalties read is the prompt plus the tokens generated."""
    from transformers import AutoModelForCausalLM

    model, tokenizer, _, _ = real
    path = smollm2_path()
    peer = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    ids = torch.tensor([tokenizer.encode("The best thing about living by the sea is")])
    rules = dict(repetition_penalty=1.3, no_repeat_ngram_size=3)
    ours = generate(model, ids, 40, temperature=0, stop_ids=tokenizer.stop_token_ids, **rules)
    with torch.no_grad():
        theirs = peer.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                               do_sample=False, eos_token_id=tokenizer.stop_token_ids,
                               pad_token_id=tokenizer.eos_token_id, **rules)
        z = model(ours[:, :-1])[0]  # teacher-forced: the margins of every greedy choice
    for t in range(ids.shape[1], ours.shape[1]):
        top2 = process_logits(z[t - 1], ours[0, :t], temperature=0, **rules).topk(2).values
        assert float(top2[0] - top2[1]) > 1e-3  # far above the 1e-4 between the two models
    assert ours.tolist() == theirs.tolist()


def test_a_streamed_chat_answer_decodes_to_whole_characters(real):
    model, tokenizer, _, _ = real
    ids = torch.tensor([tokenizer.encode_chat(CONVERSATIONS[2])])
    decoder = IncrementalDecoder(tokenizer)
    tokens, pieces = [], []
    for nxt in stream(model, ids, 30, temperature=0, stop_ids=tokenizer.stop_token_ids):
        tokens.append(int(nxt))
        pieces.append(decoder.push(nxt))
    pieces.append(decoder.flush())
    assert tokens[-1] in tokenizer.stop_token_ids and len(tokens) < 30  # stopped at the end of turn
    assert not any(t in tokenizer.stop_token_ids for t in tokens[:-1])
    assert "".join(pieces) == tokenizer.decode(tokens)
    assert generate(model, ids, 30, temperature=0, stop_ids=tokenizer.stop_token_ids)[0, ids.shape[1]:].tolist() == tokens


def test_incremental_decoder_on_characters_the_tokenizer_splits(real):
    _, tokenizer, _, _ = real
    text = "The sea 🌊, the shell 🐚, 海 and café ☀️."
    ids = tokenizer.encode(text)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # some tokens hold part of a character
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # it waited for a character to complete
