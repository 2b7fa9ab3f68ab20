"""Tests for llmbook.alignment.sft: the prompt-masked loss, packing, gradient accumulation.

Worked examples pin the layout of a batch (inputs, targets, loss mask, positions, attention
mask) to exact tensors. The central facts are checked in float64 on small random models,
GPT-2 style (learned positions) and Llama style (RoPE, grouped-query attention): a packed
batch gives every response token the log-probability it has when its example runs alone,
and packing without the block-diagonal mask does not; the accumulated gradient of
:func:`sft_step` is the whole batch's gradient, and the per-micro-batch mean is not. Peers:
``torch.nn.functional.cross_entropy`` with ``ignore_index`` (the Hugging Face convention of
label -100 for prompt tokens) for the loss, and trl 1.16.0's ``pack_dataset`` (strategy
"bfd") for best-fit-decreasing packing.
"""

import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.logprobs import token_logprobs
from llmbook.alignment.sft import (
    SFTBatch,
    fit_stop_model,
    fitted_length_distribution,
    pack_examples,
    response_values,
    sft_batch,
    sft_loss,
    sft_loss_from_logprobs,
    sft_step,
    stop_model_lengths,
    stop_model_logprobs,
)
from llmbook.transformer.attention import causal_mask
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
V = 37  # vocabulary; d_model 24, 3 heads: nothing square


def gpt2_model(seed: int = 0) -> TransformerLM:
    cfg = TransformerConfig.gpt2_style(vocab_size=V, d_model=24, n_layers=2, n_heads=3, max_seq_len=40)
    return TransformerLM(cfg, generator=gen(seed)).double().eval()


def llama_model(seed: int = 0) -> TransformerLM:
    cfg = TransformerConfig.llama_style(vocab_size=V, d_model=24, n_layers=2, n_heads=4,
                                        n_kv_heads=2, max_seq_len=40)
    return TransformerLM(cfg, generator=gen(seed)).double().eval()


def random_examples(lengths, seed=0):
    g = gen(seed)
    return [(torch.randint(0, V, (p,), generator=g), torch.randint(0, V, (r,), generator=g))
            for p, r in lengths]


@torch.no_grad()
def separate_logprobs(model, examples):
    """Each example alone, as a batch of one: its response tokens' log-probabilities."""
    out = []
    for prompt, response in examples:
        b = sft_batch(prompt[None], response[None])
        out.append(token_logprobs(model(b.ids), b.targets)[b.loss_mask])
    return out


@torch.no_grad()
def packed_logprobs(model, batch, use_mask=True):
    logits = model(batch.ids, positions=batch.positions,
                   mask=batch.attention_mask if use_mask else None)
    return logits, token_logprobs(logits, batch.targets)


LENGTHS = [(3, 5), (1, 7), (6, 2), (4, 9), (2, 2), (5, 6), (1, 1)]


# ---------------------------------------------------------------- sft_batch


def test_sft_batch_worked_example():
    b = sft_batch(torch.tensor([[5, 6], [1, 2]]), torch.tensor([[7, 8, 9], [3, 4, 5]]), pad_id=0)
    assert b.ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]]
    assert b.targets.tolist() == [[6, 7, 8, 9, 0], [2, 3, 4, 5, 0]]
    # the logits at t = P - 1 = 1 predict the first response token; the last predicts nothing
    assert b.loss_mask.tolist() == [[False, True, True, True, False]] * 2
    assert b.positions is None and b.attention_mask is None
    assert b.example_ids.tolist() == [[0] * 5, [1] * 5]
    assert b.targets[b.loss_mask].tolist() == [7, 8, 9, 3, 4, 5]  # exactly the responses


def test_sft_batch_bad_input():
    with pytest.raises(ValueError, match=r"\(B, P\) and \(B, R\)"):
        sft_batch(torch.tensor([1, 2]), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="2 rows but response_ids has 1"):
        sft_batch(torch.tensor([[1], [2]]), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="P=0"):
        sft_batch(torch.zeros(1, 0, dtype=torch.long), torch.tensor([[3]]))
    with pytest.raises(TypeError, match="integer"):
        sft_batch(torch.tensor([[1.0]]), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="pad_id"):
        sft_batch(torch.tensor([[1]]), torch.tensor([[3]]), pad_id=-1)


# ---------------------------------------------------------------- pack_examples


def test_pack_examples_worked_example():
    ex = [([1, 2], [3]), ([4], [5, 6]), ([7, 8, 9], [10])]
    b = pack_examples(ex, row_length=6, pad_id=0)
    assert b.ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]]
    assert b.targets.tolist() == [[2, 3, 0, 5, 6, 0], [8, 9, 10, 0, 0, 0]]
    assert b.loss_mask.long().tolist() == [[0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0]]
    assert b.positions.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 0, 1]]
    assert b.example_ids.tolist() == [[0, 0, 0, 1, 1, 1], [2, 2, 2, 2, -1, -1]]
    assert b.attention_mask.shape == (2, 1, 6, 6) and b.attention_mask.dtype == torch.bool
    blocks = torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).bool()
    assert torch.equal(b.attention_mask[0, 0], blocks)
    blocks = torch.block_diag(torch.ones(4, 4), torch.ones(2, 2)).bool()  # padding: its own block
    assert torch.equal(b.attention_mask[1, 0], blocks)
    assert b.targets[b.loss_mask].tolist() == [3, 5, 6, 10]  # the three responses, in order


def test_best_fit_decreasing_worked_example():
    # lengths 3, 5, 2, 4, 2 into rows of 6: longest first -> 5 | 4 | 3; then 2 -> the row with
    # least room that fits (4 has 2 left), then 2 -> the row of 3 (3 left)
    ex = [([1], [1] * (n - 1)) for n in (3, 5, 2, 4, 2)]
    b = pack_examples(ex, 6, strategy="best_fit_decreasing")
    rows = [sorted(set(r) - {-1}, key=r.index) for r in b.example_ids.tolist()]
    assert rows == [[1], [3, 2], [0, 4]]
    in_order = pack_examples(ex, 6, strategy="in_order")
    assert in_order.ids.shape[0] == 4  # next fit wastes a row: 3 | 5 | 2+4 | 2
    assert int(b.loss_mask.sum()) == int(in_order.loss_mask.sum()) == 16 - 5


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=9),
       st.integers(12, 20), st.sampled_from(["in_order", "best_fit_decreasing"]))
@settings(max_examples=40, deadline=None)
def test_pack_examples_layout_properties(lengths, row_length, strategy):
    ex = random_examples(lengths, seed=len(lengths))
    b = pack_examples(ex, row_length, strategy=strategy)
    N, T = b.ids.shape
    assert T == row_length
    # every example appears once, contiguously, with positions 0..L-1 and its own tokens
    for i, (p, r) in enumerate(ex):
        where = (b.example_ids == i).nonzero()
        assert where[:, 0].unique().numel() == 1
        n, cols = int(where[0, 0]), where[:, 1]
        assert torch.equal(cols, torch.arange(int(cols[0]), int(cols[0]) + len(p) + len(r)))
        assert torch.equal(b.ids[n, cols], torch.cat([p, r]))
        assert torch.equal(b.positions[n, cols], torch.arange(len(p) + len(r)))
        assert torch.equal(b.targets[n, cols][b.loss_mask[n, cols]], r)
    assert int(b.loss_mask.sum()) == sum(r for _, r in lengths)
    # the attention mask, with causality added, lets a token see exactly the earlier tokens of
    # its own example (or of the padding block)
    seen = b.attention_mask[:, 0] & causal_mask(T, T)
    same = b.example_ids[:, :, None] == b.example_ids[:, None, :]
    assert torch.equal(seen, same & causal_mask(T, T))
    assert bool(seen.any(-1).all())  # no query has nothing to attend to


def test_best_fit_decreasing_matches_trl_pack_dataset():
    datasets = pytest.importorskip("datasets")
    trl_data_utils = pytest.importorskip("trl.data_utils")
    datasets.disable_progress_bars()
    rnd = random.Random(0)
    for _ in range(25):
        T = rnd.randint(4, 30)
        lengths = [rnd.randint(2, T) for _ in range(rnd.randint(1, 25))]
        # token i marks example i, so trl's packed rows say which examples they hold
        ds = datasets.Dataset.from_dict({"input_ids": [[i] * n for i, n in enumerate(lengths)]})
        packed = trl_data_utils.pack_dataset(ds, T, strategy="bfd")
        trl_rows = [sorted(set(r), key=r.index) for r in packed["input_ids"]]
        ex = [([0], [0] * (n - 1)) for n in lengths]
        ours = pack_examples(ex, T, strategy="best_fit_decreasing").example_ids.tolist()
        assert [sorted(set(r) - {-1}, key=r.index) for r in ours] == trl_rows


def test_pack_examples_bad_input():
    ok = [([1, 2], [3])]
    with pytest.raises(ValueError, match="empty"):
        pack_examples([], 8)
    with pytest.raises(ValueError, match=r"examples\[1\] has P \+ R = 6 \+ 3 = 9 tokens, longer than row_length=8"):
        pack_examples(ok + [([1] * 6, [2] * 3)], 8)
    with pytest.raises(ValueError, match="R=0"):
        pack_examples([([1, 2], [])], 8)
    with pytest.raises(ValueError, match="P=0"):
        pack_examples([([], [2])], 8)
    with pytest.raises(TypeError, match="pair"):
        pack_examples([([1, 2], [3], [4])], 8)
    with pytest.raises(TypeError, match="list of"):
        pack_examples(torch.ones(2, 3, dtype=torch.long), 8)
    with pytest.raises(ValueError, match=">= 0"):
        pack_examples([([1, -2], [3])], 8)
    with pytest.raises(TypeError, match="int token ids"):
        pack_examples([([1.5], [3])], 8)
    with pytest.raises(ValueError, match="1-d"):
        pack_examples([(torch.ones(1, 2, dtype=torch.long), torch.ones(1, dtype=torch.long))], 8)
    with pytest.raises(ValueError, match="strategy"):
        pack_examples(ok, 8, strategy="first_fit")
    with pytest.raises(ValueError, match="row_length"):
        pack_examples(ok, 0)
    with pytest.raises(ValueError, match="pad_id"):
        pack_examples(ok, 8, pad_id=-1)


# ---------------------------------------------------------------- packed = separate


@pytest.mark.parametrize("make_model", [gpt2_model, llama_model], ids=["gpt2_learned", "llama_rope_gqa"])
@pytest.mark.parametrize("strategy", ["in_order", "best_fit_decreasing"])
def test_packed_equals_separate_float64(make_model, strategy):
    model, ex = make_model(), random_examples(LENGTHS)
    batch = pack_examples(ex, row_length=16, strategy=strategy)
    assert batch.ids.shape[0] < len(ex)  # some rows really hold several examples
    logits, logp = packed_logprobs(model, batch)
    alone = separate_logprobs(model, ex)
    for a, b in zip(response_values(logp, batch), alone, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    loss = sft_loss(logits, batch.targets, batch.loss_mask)
    assert abs(float(loss) + float(torch.cat(alone).mean())) < 1e-13


@pytest.mark.parametrize("make_model", [gpt2_model, llama_model], ids=["gpt2_learned", "llama_rope_gqa"])
def test_packing_without_the_mask_contaminates(make_model):
    model, ex = make_model(), random_examples(LENGTHS)
    batch = pack_examples(ex, row_length=16)
    logits, logp = packed_logprobs(model, batch, use_mask=False)
    alone = separate_logprobs(model, ex)
    diffs = [float((a - b).abs().max()) for a, b in zip(response_values(logp, batch), alone, strict=True)]
    first = batch.example_ids[:, 0].tolist()  # the first example of each row sees only itself
    assert all(diffs[i] < 1e-12 for i in first)
    assert all(diffs[i] > 1e-4 for i in range(len(ex)) if i not in first)
    loss = sft_loss(logits, batch.targets, batch.loss_mask)
    assert abs(float(loss) + float(torch.cat(alone).mean())) > 1e-4


# ---------------------------------------------------------------- sft_loss


def test_sft_loss_uniform_logits_is_log_v():
    logits = torch.zeros(2, 5, V, dtype=D)
    targets = torch.randint(0, V, (2, 5), generator=gen(0))
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]]).bool()
    assert float(sft_loss(logits, targets, mask)) == pytest.approx(math.log(V), abs=1e-14)


def test_sft_loss_worked_example():
    # one row, V = 2: logits (0, log 3) give p = (1/4, 3/4); targets 1, 0, 1; the middle is prompt
    logits = torch.tensor([[[0.0, math.log(3.0)]] * 3], dtype=D)
    loss = sft_loss(logits, torch.tensor([[1, 0, 1]]), torch.tensor([[True, False, True]]))
    assert float(loss) == pytest.approx(-math.log(0.75), abs=1e-15)
    # per-token over the batch: a 1-token row and a 3-token row weigh 1/4 each token, not 1/2 a row
    logits = torch.randn(2, 4, 3, generator=gen(1), dtype=D)
    targets = torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    nll = -token_logprobs(logits, targets)
    expected = (nll[0, 0] + nll[1, 0] + nll[1, 1] + nll[1, 2]) / 4
    assert float(sft_loss(logits, targets, mask)) == pytest.approx(float(expected), abs=1e-15)
    per_sequence = (nll[0, 0] + (nll[1, 0] + nll[1, 1] + nll[1, 2]) / 3) / 2
    assert abs(float(expected - per_sequence)) > 1e-3  # the other normalisation differs


@given(st.integers(1, 4), st.integers(2, 7), st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_sft_loss_equals_cross_entropy_with_ignore_index(B, T, seed):
    g = gen(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=D)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.6
    mask[0, 0] = True
    labels = targets.masked_fill(~mask, -100)  # Hugging Face: -100 = not in the loss
    peer = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    assert torch.allclose(sft_loss(logits, targets, mask), peer, rtol=0, atol=1e-13)


def test_sft_loss_gradient_is_masked_p_minus_onehot_over_n():
    logits = torch.randn(3, 4, 5, generator=gen(2), dtype=D, requires_grad=True)
    targets = torch.randint(0, 5, (3, 4), generator=gen(3))
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 1, 0]]).bool()
    sft_loss(logits, targets, mask).backward()
    p = torch.softmax(logits.detach(), -1)
    closed = mask[..., None] * (p - F.one_hot(targets, 5)) / mask.sum()
    assert torch.allclose(logits.grad, closed, rtol=0, atol=1e-15)
    assert torch.autograd.gradcheck(lambda z: sft_loss(z, targets, mask), (logits.detach().requires_grad_(),))


def test_sft_loss_num_tokens_divides_the_sum():
    logits = torch.randn(2, 3, 4, generator=gen(4), dtype=D)
    targets, mask = torch.randint(0, 4, (2, 3), generator=gen(5)), torch.ones(2, 3, dtype=torch.bool)
    assert torch.allclose(sft_loss(logits, targets, mask, num_tokens=12) * 12,
                          sft_loss(logits, targets, mask) * 6, atol=1e-14)


def test_sft_loss_bad_input():
    logits, targets = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="never broadcast"):
        sft_loss(logits, targets, torch.ones(2, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="only 0 and 1"):
        sft_loss(logits, targets, torch.full((2, 3), 2))
    with pytest.raises(ValueError, match="no response tokens"):
        sft_loss(logits, targets, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, T, V\)"):
        sft_loss(logits, targets[:, :2], mask[:, :2])
    with pytest.raises(TypeError, match="floating"):
        sft_loss(logits.long(), targets, mask)
    with pytest.raises(ValueError, match="targets must be token ids"):
        sft_loss(logits, targets + 4, mask)
    with pytest.raises(ValueError, match="num_tokens"):
        sft_loss(logits, targets, mask, num_tokens=0)


# ---------------------------------------------------------------- reductions; the loss from log-probabilities


def test_sft_loss_reductions_worked_example():
    # per-token log-probabilities of a (2, 4) batch; row 0 has 2 response tokens, row 1 has 3
    logp = -torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, math.nan]], dtype=D)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]).bool()
    assert float(sft_loss_from_logprobs(logp, mask)) == 12.6  # 63 / 5 tokens
    assert float(sft_loss_from_logprobs(logp, mask, reduction="sum")) == 63.0
    assert float(sft_loss_from_logprobs(logp, mask, reduction="sequence_mean")) == 10.75  # (1.5 + 20) / 2
    assert float(sft_loss_from_logprobs(logp, mask, reduction="constant", normaliser=8)) == 7.875
    assert float(sft_loss_from_logprobs(logp, mask, num_tokens=10)) == 6.3
    per_token = sft_loss_from_logprobs(logp, mask, reduction="none")
    torch.testing.assert_close(per_token, torch.tensor([[1.0, 2.0, 0, 0], [10.0, 20.0, 30.0, 0]], dtype=D))
    assert float(per_token.sum()) == float(sft_loss_from_logprobs(logp, mask, reduction="sum"))


@pytest.mark.parametrize("reduction", ["none", "sum", "token_mean", "sequence_mean", "constant"])
def test_sft_loss_logits_and_logprobs_routes_agree_float64(reduction):
    """sft_loss on logits = sft_loss_from_logprobs on torch's own log-softmax: loss and gradient."""
    logits = torch.randn(3, 5, 7, generator=gen(6), dtype=D, requires_grad=True)
    targets = torch.randint(0, 7, (3, 5), generator=gen(7))
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 1, 1]]).bool()
    c = 11.0 if reduction == "constant" else None
    ours = sft_loss(logits, targets, mask, reduction=reduction, normaliser=c)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    peer_logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]  # (3, 5)
    theirs = sft_loss_from_logprobs(peer_logp, mask, reduction=reduction, normaliser=c)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), logits)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-14)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-15)
    if reduction == "sum":  # peer: cross-entropy with ignore_index, summed
        labels = targets.masked_fill(~mask, -100)
        peer = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), ignore_index=-100, reduction="sum")
        torch.testing.assert_close(ours, peer, rtol=0, atol=1e-13)
    if reduction == "sequence_mean":  # the mean of each row's own cross-entropy
        rows = [F.cross_entropy(logits[b][mask[b]], targets[b][mask[b]]) for b in range(3)]
        torch.testing.assert_close(ours, torch.stack(rows).mean(), rtol=0, atol=1e-14)


def test_sft_loss_logprobs_route_on_a_model_float64():
    """On a model: the two routes give the same loss and parameter gradients (float64)."""
    model = gpt2_model(3)
    batch = pack_examples(random_examples(LENGTHS[:4], seed=8), 20)
    grads_by_route = []
    for route in ("logits", "logprobs"):
        model.zero_grad()
        logits = model(batch.ids, positions=batch.positions, mask=batch.attention_mask)
        if route == "logits":
            loss = sft_loss(logits, batch.targets, batch.loss_mask, reduction="sequence_mean")
        else:
            loss = sft_loss_from_logprobs(token_logprobs(logits, batch.targets), batch.loss_mask,
                                          reduction="sequence_mean")
        loss.backward()
        grads_by_route.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (l1, g1), (l2, g2) = grads_by_route
    assert float(l1) == float(l2)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-15)


def test_sft_loss_default_unchanged():
    """The default reduction is today's token mean, bit for bit, and num_tokens a constant."""
    logits = torch.randn(2, 6, 5, generator=gen(9), dtype=D)
    targets = torch.randint(0, 5, (2, 6), generator=gen(10))
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]).bool()
    nll = -token_logprobs(logits, targets)
    assert float(sft_loss(logits, targets, mask)) == float(nll[mask].sum() / 7)
    assert float(sft_loss(logits, targets, mask, 12)) == float(
        sft_loss(logits, targets, mask, reduction="constant", normaliser=12.0))


def test_sft_loss_empty_mask_by_reduction():
    logp = -torch.rand(2, 3, generator=gen(11), dtype=D)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert float(sft_loss_from_logprobs(logp, empty, reduction="sum")) == 0.0
    assert float(sft_loss_from_logprobs(logp, empty, num_tokens=5)) == 0.0  # a micro-batch adds nothing
    with pytest.raises(ValueError, match="no response tokens"):
        sft_loss_from_logprobs(logp, empty)
    with pytest.raises(ValueError, match="row with no ones"):
        sft_loss_from_logprobs(logp, empty, reduction="sequence_mean")


def test_sft_loss_from_logprobs_bad_input():
    logp, mask = -torch.rand(2, 3, dtype=D), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"logprobs must be \(B, T\)"):
        sft_loss_from_logprobs(logp[0], mask[0])
    with pytest.raises(ValueError, match="loss_mask must have the shape of logprobs"):
        sft_loss_from_logprobs(logp, mask[:, :2])
    with pytest.raises(ValueError, match="log-probabilities"):
        sft_loss_from_logprobs(-logp, mask)
    with pytest.raises(ValueError, match="log-probabilities"):
        sft_loss_from_logprobs(torch.full((2, 3), math.nan, dtype=D), mask)
    with pytest.raises(TypeError, match="logprobs"):
        sft_loss_from_logprobs(torch.zeros(2, 3, dtype=torch.long), mask)
    with pytest.raises(ValueError, match="reduction must be one of"):
        sft_loss_from_logprobs(logp, mask, reduction="mean")
    with pytest.raises(ValueError, match="num_tokens is reduction='constant'"):
        sft_loss_from_logprobs(logp, mask, 4, reduction="sum")
    with pytest.raises(ValueError, match="needs a normaliser"):
        sft_loss_from_logprobs(logp, mask, reduction="constant")
    with pytest.raises(ValueError, match="reduction must be one of"):
        sft_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), mask, reduction="avg")
    # masked-out positions may hold anything
    nan_pad = torch.tensor([[-1.0, math.nan, 3.0]], dtype=D)
    assert float(sft_loss_from_logprobs(nan_pad, torch.tensor([[1, 0, 0]]))) == 1.0



# ---------------------------------------------------------------- sft_step


def micro_batches_of(examples, sizes, row_length=16):
    """Split examples into consecutive micro-batches of the given numbers of examples."""
    out, start = [], 0
    for n in sizes:
        out.append(pack_examples(examples[start:start + n], row_length))
        start += n
    return out


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_accumulated_gradient_equals_full_batch_gradient():
    model, ex = gpt2_model(1), random_examples(LENGTHS, seed=3)
    mbs = micro_batches_of(ex, [1, 2, 4])  # response tokens 5 | 9 | 18: unequal
    counts = [int(mb.loss_mask.sum()) for mb in mbs]
    assert len(set(counts)) == 3
    out = sft_step(model, None, mbs)
    accumulated = grads(model)
    full = pack_examples(ex, 16)
    model.zero_grad()
    loss = sft_loss(model(full.ids, positions=full.positions, mask=full.attention_mask),
                    full.targets, full.loss_mask)
    loss.backward()
    assert out.num_tokens == sum(counts) == int(full.loss_mask.sum())
    assert abs(float(out.loss - loss.detach())) < 1e-14
    for a, b in zip(accumulated, grads(model), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-14)


def test_per_micro_batch_mean_is_biased_unless_counts_are_equal():
    model, ex = gpt2_model(1), random_examples(LENGTHS, seed=3)
    sft_step(model, None, micro_batches_of(ex, [1, 2, 4]))
    right = grads(model)
    naive = sft_step(model, None, micro_batches_of(ex, [1, 2, 4]), normalization="per_micro_batch")
    wrong = grads(model)
    assert max(float((a - b).abs().max()) for a, b in zip(right, wrong, strict=True)) > 1e-4
    # the naive loss is the mean of the three micro-batch means
    with torch.no_grad():
        means = [float(sft_loss(model(mb.ids, positions=mb.positions, mask=mb.attention_mask),
                                mb.targets, mb.loss_mask)) for mb in micro_batches_of(ex, [1, 2, 4])]
    assert float(naive.loss) == pytest.approx(sum(means) / 3, abs=1e-14)
    # equal counts: both normalisations agree
    same = random_examples([(2, 4)] * 4, seed=4)
    sft_step(model, None, micro_batches_of(same, [2, 2]))
    g1 = grads(model)
    sft_step(model, None, micro_batches_of(same, [2, 2]), normalization="per_micro_batch")
    for a, b in zip(g1, grads(model), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-15)


def test_sft_step_takes_the_optimizer_step_and_clips():
    model, ex = gpt2_model(2), random_examples(LENGTHS, seed=5)
    before = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = sft_step(model, opt, micro_batches_of(ex, [3, 4]), grad_clip=1e-3)
    assert out.grad_norm is not None and float(out.grad_norm) > 1e-3
    total = torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))
    assert float(total) == pytest.approx(1e-3, rel=1e-6)  # clipped to the threshold
    for p, q in zip(model.parameters(), before.parameters(), strict=True):
        assert torch.allclose(p, q - 0.1 * p.grad, rtol=0, atol=1e-15)
    # the training moves the loss down
    mbs = micro_batches_of(ex, [3, 4])
    first = sft_step(model, torch.optim.SGD(model.parameters(), lr=0.5), mbs).loss
    assert float(sft_step(model, None, mbs).loss) < float(first)


def test_sft_step_on_unpacked_batches():
    model = gpt2_model(3)
    g = gen(6)
    b = sft_batch(torch.randint(0, V, (3, 4), generator=g), torch.randint(0, V, (3, 5), generator=g))
    out = sft_step(model, None, [b])
    assert out.num_tokens == 15
    assert abs(float(out.loss) - float(sft_loss(model(b.ids), b.targets, b.loss_mask).detach())) < 1e-14


def test_sft_step_bad_input():
    model = gpt2_model()
    mb = pack_examples([([1], [2, 3])], 8)
    empty = mb._replace(loss_mask=torch.zeros_like(mb.loss_mask))
    with pytest.raises(ValueError, match="empty"):
        sft_step(model, None, [])
    with pytest.raises(TypeError, match="list of SFTBatch"):
        sft_step(model, None, mb)
    with pytest.raises(TypeError, match=r"micro_batches\[1\] must be an SFTBatch"):
        sft_step(model, None, [mb, (mb.ids, mb.targets)])
    with pytest.raises(ValueError, match=r"micro_batches\[1\] has no response tokens"):
        sft_step(model, None, [mb, empty])
    with pytest.raises(ValueError, match="normalization"):
        sft_step(model, None, [mb], normalization="per_sequence")
    with pytest.raises(ValueError, match="grad_clip"):
        sft_step(model, None, [mb], grad_clip=0.0)
    with pytest.raises(TypeError, match="Optimizer"):
        sft_step(model, "adam", [mb])
    with pytest.raises(TypeError, match="nn.Module"):
        sft_step(lambda ids: ids, None, [mb])


# ---------------------------------------------------------------- response_values


def test_response_values_splits_by_example():
    b = pack_examples([([1, 2], [3]), ([4], [5, 6]), ([7, 8, 9], [10])], 6)
    vals = torch.arange(12.0).reshape(2, 6)
    assert [v.tolist() for v in response_values(vals, b)] == [[1.0], [3.0, 4.0], [8.0]]
    with pytest.raises(ValueError, match="shape"):
        response_values(torch.zeros(2, 5), b)
    with pytest.raises(TypeError, match="SFTBatch"):
        response_values(vals, (b.ids, b.targets))
    with pytest.raises(TypeError, match="example_ids"):
        response_values(vals, SFTBatch(b.ids, b.targets, b.loss_mask))


# ---------------------------------------------------------------- the stop model: what a reduction does to lengths


def test_stop_model_worked_example():
    # T = 3: h_1 = sigma(0) = 1/2, h_2 = sigma(log 3) = 3/4, h_3 = 1
    theta = torch.tensor([0.0, math.log(3.0)], dtype=D)
    logprobs, mask = stop_model_logprobs(theta, torch.tensor([3, 1, 2]))
    h = [0.5, 0.75]
    want = torch.tensor([[math.log(1 - h[0]), math.log(1 - h[1]), 0.0],
                         [math.log(h[0]), 0.0, 0.0],
                         [math.log(1 - h[0]), math.log(h[1]), 0.0]], dtype=D)
    torch.testing.assert_close(logprobs, want, rtol=0, atol=1e-15)
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    torch.testing.assert_close(stop_model_lengths(theta), torch.tensor([0.5, 0.375, 0.125], dtype=D),
                               rtol=0, atol=1e-15)


def test_fitted_length_distribution_worked_example():
    lengths = torch.tensor([1, 2, 2, 4])  # p = (1/4, 1/2, 0, 1/4)
    torch.testing.assert_close(fitted_length_distribution(lengths, 4),
                               torch.tensor([0.25, 0.5, 0.0, 0.25], dtype=D))
    # per-sequence mean: p(L)/L = (1/4, 1/4, 0, 1/16), normalised by 9/16
    torch.testing.assert_close(fitted_length_distribution(lengths, 4, "sequence_mean"),
                               torch.tensor([4 / 9, 4 / 9, 0.0, 1 / 9], dtype=D))


@pytest.mark.parametrize("reduction", ["sum", "token_mean", "sequence_mean"])
def test_fit_stop_model_lands_on_the_closed_form(reduction):
    lengths = torch.repeat_interleave(torch.arange(1, 6), torch.tensor([3, 1, 4, 1, 5]))
    q = stop_model_lengths(fit_stop_model(lengths, 5, reduction))
    torch.testing.assert_close(q, fitted_length_distribution(lengths, 5, reduction), rtol=0, atol=1e-6)
    mean = float((q * torch.arange(1, 6)).sum())
    if reduction == "sequence_mean":  # the harmonic mean of the observed lengths
        assert mean == pytest.approx(len(lengths) / float((1 / lengths.double()).sum()), abs=1e-5)
    else:
        assert mean == pytest.approx(float(lengths.double().mean()), abs=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=2, max_size=7), st.integers(0, 100))
def test_stop_model_lengths_sum_to_one_and_match_logprobs(raw, seed):
    theta = torch.randn(len(raw), generator=gen(seed), dtype=D)
    q = stop_model_lengths(theta)
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-12)
    L = torch.tensor([1 + r % (len(raw) + 1) for r in raw])
    logprobs, mask = stop_model_logprobs(theta, L)
    torch.testing.assert_close(sft_loss_from_logprobs(logprobs, mask, reduction="none").sum(1),
                               -torch.log(q[L - 1]), rtol=0, atol=1e-12)


def test_stop_model_bad_input():
    theta = torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="lengths must be"):
        stop_model_logprobs(theta, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="lengths must be"):
        stop_model_logprobs(theta, torch.tensor([5]))
    with pytest.raises(ValueError, match="stop_logits must be 1-d"):
        stop_model_lengths(torch.zeros(2, 2, dtype=D))
    with pytest.raises(TypeError, match="stop_logits"):
        stop_model_lengths(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction must be one of"):
        fit_stop_model(torch.tensor([1, 2]), 3, "none")
    with pytest.raises(ValueError, match="max_length must be at least 2"):
        fit_stop_model(torch.tensor([1]), 1)
    with pytest.raises(ValueError, match="lengths must be"):
        fitted_length_distribution(torch.tensor([4]), 3)
    with pytest.raises(TypeError, match="lengths"):
        fitted_length_distribution(torch.tensor([1.0]), 3)
