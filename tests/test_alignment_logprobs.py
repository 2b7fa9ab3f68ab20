"""Tests for llmbook.alignment.logprobs: per-token log-probabilities, entropy, masked reductions,
and the reductions of a loss (reduce_tokens, reduction_weights, reduce_sequences).

Peers: ``torch.log_softmax`` + ``gather`` and ``torch.distributions.Categorical.entropy``;
trl 1.16.0's helpers ``trl.trainer.utils.selective_log_softmax`` and
``trl.trainer.utils.entropy_from_logits`` (float64, to 1e-12); and the fused LM head that
trl's DPO and GRPO trainers score completions with, ``trl.trainer.utils.add_fused_lm_head``,
on a tiny randomly initialised Hugging Face GPT-2 (it computes in float32, so to 1e-5).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.logprobs import (
    REDUCTIONS,
    SEQUENCE_REDUCTIONS,
    check_reduction,
    masked_mean,
    masked_normalize,
    masked_sum,
    reduce_sequences,
    reduce_tokens,
    reduction_weights,
    reduction_weights_symbolic,
    response_logprobs,
    response_mask,
    sequence_values,
    token_entropy,
    token_logprobs,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
B, T, V = 3, 5, 11  # all different, so a transposed axis cannot hide
P, R = 4, 6  # prompt and response lengths


def logits_and_targets(seed=0, shape=(B, T), vocab=V):
    logits = 3 * torch.randn((*shape, vocab), generator=gen(seed), dtype=D)
    targets = torch.randint(0, vocab, shape, generator=gen(seed + 1))
    return logits, targets


def tiny_lm(max_seq_len=16) -> TransformerLM:
    cfg = TransformerConfig.gpt2_style(vocab_size=V, d_model=16, n_layers=2, n_heads=2,
                                       max_seq_len=max_seq_len)
    return TransformerLM(cfg, generator=gen(7)).double().eval()


# ---------------------------------------------------------------- token_logprobs


def test_token_logprobs_equals_gathered_log_softmax():
    logits, targets = logits_and_targets()
    expected = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    out = token_logprobs(logits, targets)
    assert out.shape == (B, T)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-14)
    # any leading shape, and int32 ids
    flat = token_logprobs(logits.reshape(B * T, V), targets.reshape(-1).int())
    torch.testing.assert_close(flat, expected.reshape(-1), rtol=0, atol=1e-14)


def test_token_logprobs_worked_example_and_gradient():
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=D, requires_grad=True)  # p = (1/4, 3/4)
    out = token_logprobs(logits, torch.tensor([[1]]))
    assert out.item() == pytest.approx(math.log(0.75), abs=1e-15)
    out.sum().backward()  # d log p_y / dz = onehot(y) - p
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.25, 0.25]]], dtype=D))
    x = logits_and_targets(seed=3)[0][:2, :3].clone().requires_grad_()
    y = torch.randint(0, V, (2, 3), generator=gen(4))
    assert torch.autograd.gradcheck(lambda z: token_logprobs(z, y), (x,))


def test_token_logprobs_bad_inputs():
    logits, targets = logits_and_targets()
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(logits, targets[:, :-1])
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(logits, targets.clone().fill_(V))
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(logits, targets.clone().fill_(-1))
    with pytest.raises(TypeError, match="targets"):
        token_logprobs(logits, targets.double())
    with pytest.raises(TypeError, match="logits"):
        token_logprobs(targets, targets)


def test_token_logprobs_matches_trl_selective_log_softmax():
    """Peer: ``trl.trainer.utils.selective_log_softmax(logits, index)``."""
    trl_utils = pytest.importorskip("trl.trainer.utils")
    logits, targets = logits_and_targets(seed=5)
    diff = (token_logprobs(logits, targets) - trl_utils.selective_log_softmax(logits, targets))
    assert diff.abs().max().item() < 1e-12


# ---------------------------------------------------------------- entropy


def test_token_entropy_worked_examples():
    uniform = torch.zeros(2, 3, V, dtype=D)
    torch.testing.assert_close(token_entropy(uniform), torch.full((2, 3), math.log(V), dtype=D))
    # p = (1/2, 1/2, 0): a -inf logit contributes 0, not NaN
    half = torch.tensor([[0.0, 0.0, -math.inf]], dtype=D)
    assert token_entropy(half).item() == pytest.approx(math.log(2), abs=1e-15)
    logits = logits_and_targets(seed=6)[0]
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(token_entropy(logits), expected, rtol=0, atol=1e-13)
    x = logits[:2, :2].clone().requires_grad_()
    assert torch.autograd.gradcheck(token_entropy, (x,))
    with pytest.raises(TypeError, match="logits"):
        token_entropy(torch.zeros(2, 3, dtype=torch.long))


def test_token_entropy_matches_trl():
    """Peer: ``trl.trainer.utils.entropy_from_logits(logits)``."""
    trl_utils = pytest.importorskip("trl.trainer.utils")
    logits = logits_and_targets(seed=8)[0]
    diff = token_entropy(logits) - trl_utils.entropy_from_logits(logits)
    assert diff.abs().max().item() < 1e-12


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.integers(0, 10**6))
def test_token_entropy_lies_between_zero_and_log_vocab(vocab, seed):
    logits = 4 * torch.randn(7, vocab, generator=gen(seed), dtype=D)
    h = token_entropy(logits)
    assert (h >= -1e-12).all() and (h <= math.log(vocab) + 1e-12).all()


# ---------------------------------------------------------------- response_logprobs


def test_response_logprobs_equals_a_manual_computation():
    """Score each response token from the last logits of its own prefix, one forward per token."""
    model = tiny_lm()
    prompt = torch.randint(0, V, (B, P), generator=gen(10))
    response = torch.randint(0, V, (B, R), generator=gen(11))
    out = response_logprobs(model, prompt, response)
    assert out.shape == (B, R)
    ids = torch.cat([prompt, response], dim=1)
    manual = torch.empty(B, R, dtype=D)
    with torch.no_grad():
        for t in range(R):
            last = model(ids[:, :P + t])[:, -1]  # (B, V): predicts response token t
            manual[:, t] = torch.log_softmax(last, dim=-1)[torch.arange(B), response[:, t]]
    torch.testing.assert_close(out.detach(), manual, rtol=0, atol=1e-12)
    # the sequence log-probability is the sum, and gradients reach the parameters
    out.sum().backward()
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().max() > 0


def test_response_logprobs_with_right_padding_and_mask():
    """Padding after a response does not change the log-probs of its real tokens."""
    model = tiny_lm()
    prompt = torch.randint(0, V, (2, P), generator=gen(12))
    response = torch.randint(0, V, (2, R), generator=gen(13))
    lengths = torch.tensor([R, 3])
    mask = response_mask(torch.zeros(2, dtype=torch.long), R, lengths)
    padded = response.masked_fill(~mask, 0)
    with torch.no_grad():
        full = response_logprobs(model, prompt, padded)
        short = response_logprobs(model, prompt[1:], response[1:, :3])
    torch.testing.assert_close(full[1, :3], short[0], rtol=0, atol=1e-12)
    seq = masked_sum(full, mask, dim=1)
    assert seq[1].item() == pytest.approx(short.sum().item(), abs=1e-12)


def test_response_logprobs_bad_inputs():
    model = tiny_lm(max_seq_len=8)
    prompt = torch.randint(0, V, (2, 3), generator=gen(14))
    with pytest.raises(ValueError, match="max_seq_len"):
        response_logprobs(model, prompt, torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size"):
        response_logprobs(model, prompt, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="prompt_ids"):
        response_logprobs(model, prompt[:, :0], torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="response_ids"):
        response_logprobs(model, prompt, torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="prompt_ids"):
        response_logprobs(model, prompt[0], torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="response_ids"):
        response_logprobs(model, prompt, torch.zeros(2, 2))
    with pytest.raises(TypeError, match="model"):
        response_logprobs(lambda ids: ids.tolist(), prompt, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        response_logprobs(lambda ids: torch.zeros(2, 3, V), prompt, torch.zeros(2, 2, dtype=torch.long))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_response_logprobs_matches_trl_fused_lm_head():
    """Peer: a tiny Hugging Face GPT-2 patched by ``trl.trainer.utils.add_fused_lm_head``,
    called as trl's trainers call it, ``model(input_ids, attention_mask, labels,
    fused_lm_head=True).log_probs`` with the prompt labels set to -100; trl's fused head
    computes in float32. The same model's plain forward (``.logits``) feeds ours."""
    trl_utils = pytest.importorskip("trl.trainer.utils")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).double().eval()
    prompt = torch.randint(0, V, (B, P), generator=gen(15))
    response = torch.randint(0, V, (B, R), generator=gen(16))
    with torch.no_grad():
        ours = response_logprobs(model, prompt, response)
        trl_utils.add_fused_lm_head(model)
        ids = torch.cat([prompt, response], dim=1)
        labels = ids.masked_fill(torch.arange(P + R) < P, -100)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                    fused_lm_head=True)
    theirs = out.log_probs[:, -R:]  # (B, P + R - 1) -> the response positions
    assert theirs.shape == (B, R)
    assert (ours - theirs.to(D)).abs().max().item() < 1e-5


# ---------------------------------------------------------------- masked reductions


def test_masked_reductions_worked_example():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, math.nan]], dtype=D)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert masked_sum(x, mask).item() == 63.0  # the NaN is masked out, not propagated
    assert masked_mean(x, mask).item() == pytest.approx(63 / 5)
    torch.testing.assert_close(masked_sum(x, mask, dim=1), torch.tensor([3.0, 60.0], dtype=D))
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 20.0], dtype=D))
    torch.testing.assert_close(masked_mean(x[:, :3], mask[:, :3].bool(), dim=0),
                               torch.tensor([5.5, 11.0, 30.0], dtype=D))
    with pytest.raises(ValueError, match="no ones"):  # column 3 is all masked out
        masked_mean(x, mask, dim=0)
    assert masked_normalize(x, mask, constant=8).item() == pytest.approx(63 / 8)
    torch.testing.assert_close(masked_normalize(x, mask, 4, dim=-1),
                               torch.tensor([0.75, 15.0], dtype=D))


def test_masked_mean_gradient():
    x = torch.randn(B, T, generator=gen(20), dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    masked_mean(x, mask).backward()
    torch.testing.assert_close(x.grad, mask.to(D) / 9)  # 1 / (number of ones), 0 off the mask
    assert torch.autograd.gradcheck(lambda z: masked_mean(z, mask, dim=1), (x.detach().requires_grad_(),))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 10**6))
def test_masked_mean_equals_the_mean_of_the_selected_entries(rows, cols, seed):
    x = torch.randn(rows, cols, generator=gen(seed), dtype=D)
    mask = torch.rand(rows, cols, generator=gen(seed + 1)) < 0.6
    mask[:, 0] = True  # every row keeps at least one entry
    assert masked_mean(x, mask).item() == pytest.approx(x[mask].mean().item(), abs=1e-12)
    per_row = torch.stack([x[r][mask[r]].mean() for r in range(rows)])
    torch.testing.assert_close(masked_mean(x, mask, dim=1), per_row, rtol=0, atol=1e-12)


def test_masked_reductions_bad_inputs():
    x = torch.zeros(B, T, dtype=D)
    with pytest.raises(ValueError, match="mask must have the shape"):
        masked_sum(x, torch.ones(B, 1))  # never broadcast
    with pytest.raises(ValueError, match="mask must have the shape"):
        masked_mean(x, torch.ones(T))
    with pytest.raises(ValueError, match="no ones"):
        masked_mean(x, torch.zeros(B, T))
    with pytest.raises(ValueError, match="row with no ones"):
        masked_mean(x, torch.tensor([[1] * T, [0] * T, [1] * T]), dim=1)
    with pytest.raises(ValueError, match="only 0 and 1"):
        masked_sum(x, torch.full((B, T), 0.5))
    with pytest.raises(ValueError, match="dim"):
        masked_sum(x, torch.ones(B, T), dim=2)
    with pytest.raises(TypeError, match="dim"):
        masked_sum(x, torch.ones(B, T), dim=1.0)
    with pytest.raises(TypeError, match="mask"):
        masked_sum(x, [[1] * T] * B)
    with pytest.raises(TypeError, match="^x must be a floating-point"):
        masked_sum(torch.zeros(B, T, dtype=torch.long), torch.ones(B, T))
    with pytest.raises(ValueError, match="constant"):
        masked_normalize(x, torch.ones(B, T), 0)
    with pytest.raises(TypeError, match="constant"):
        masked_normalize(x, torch.ones(B, T), "8")


# ---------------------------------------------------------------- response_mask


def test_response_mask_worked_example():
    mask = response_mask(torch.tensor([2, 0, 4]), 5)
    expected = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    padded = response_mask(torch.tensor([2, 0, 4]), 5, sequence_lengths=torch.tensor([4, 1, 4]))
    expected = torch.tensor([[0, 0, 1, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(padded, expected)


def test_response_mask_bad_inputs():
    with pytest.raises(ValueError, match="total_length"):
        response_mask(torch.tensor([2, 6]), 5)
    with pytest.raises(ValueError, match="prompt_lengths"):
        response_mask(torch.tensor([-1, 2]), 5)
    with pytest.raises(ValueError, match="prompt_lengths"):
        response_mask(torch.tensor([[1, 2]]), 5)
    with pytest.raises(ValueError, match="sequence_lengths"):
        response_mask(torch.tensor([3, 2]), 5, sequence_lengths=torch.tensor([2, 5]))
    with pytest.raises(ValueError, match="sequence_lengths"):
        response_mask(torch.tensor([1, 2]), 5, sequence_lengths=torch.tensor([5]))
    with pytest.raises(TypeError, match="prompt_lengths"):
        response_mask(torch.tensor([1.0, 2.0]), 5)
    with pytest.raises(ValueError, match="total_length"):
        response_mask(torch.tensor([0]), 0)


# ---------------------------------------------------------------- reduce_tokens: every reduction of a loss

X2 = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, math.nan]]  # (2, 4): B != T
M2 = [[1, 1, 0, 0], [1, 1, 1, 0]]  # L = (2, 3), 5 tokens


def test_reduce_tokens_worked_example():
    x, mask = torch.tensor(X2, dtype=D), torch.tensor(M2)
    none = reduce_tokens(x, mask, "none")
    torch.testing.assert_close(none, torch.tensor([[1.0, 2.0, 0.0, 0.0], [10.0, 20.0, 30.0, 0.0]], dtype=D))
    assert reduce_tokens(x, mask, "sum").item() == 63.0  # the NaN is masked out
    assert reduce_tokens(x, mask, "token_mean").item() == 12.6  # 63 / 5
    assert reduce_tokens(x, mask, "sequence_mean").item() == 10.75  # (3/2 + 60/3) / 2
    assert reduce_tokens(x, mask, "constant", normaliser=8).item() == 7.875  # 63 / 8
    assert reduce_tokens(x, mask.bool()).item() == 12.6  # the default is the token mean
    assert none.sum().item() == reduce_tokens(x, mask, "sum").item()


def test_reduction_weights_worked_example():
    mask = torch.tensor(M2)
    torch.testing.assert_close(reduction_weights(mask, "sum"), mask.to(D))
    torch.testing.assert_close(reduction_weights(mask, "token_mean"), mask.to(D) / 5)
    torch.testing.assert_close(reduction_weights(mask, "sequence_mean"),
                               torch.tensor([[1 / 4, 1 / 4, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]], dtype=D))
    torch.testing.assert_close(reduction_weights(mask, "constant", normaliser=10), mask.to(D) / 10)
    with pytest.raises(ValueError, match="none"):
        reduction_weights(mask, "none")
    with pytest.raises(TypeError, match="mask"):
        reduction_weights([[1, 0]], "sum")


def test_reduction_weights_symbolic():
    import sympy as sp
    w = reduction_weights_symbolic()
    L1, L2, L3 = w["L"]
    C = sp.Symbol("C", positive=True)
    assert w["sum"] == 1 and w["B"] == 3
    assert sp.simplify(w["token_mean"] - 1 / (L1 + L2 + L3)) == 0
    assert sp.simplify(w["sequence_mean"] - 1 / (3 * L1)) == 0
    assert sp.simplify(w["constant"] - 1 / C) == 0
    # concrete lengths: the SymPy weight of sequence 1's tokens equals autograd's
    lengths = [4, 1, 2]
    mask = torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]  # (3, 5)
    num = reduction_weights_symbolic(lengths)
    assert float(num["token_mean"]) == reduction_weights(mask, "token_mean")[0, 0].item() == 1 / 7
    assert float(num["sequence_mean"]) == pytest.approx(reduction_weights(mask, "sequence_mean")[0, 0].item(),
                                                        abs=1e-16)
    assert float(num["sequence_mean"]) == pytest.approx(1 / 12, abs=1e-16)
    # every sequence's weight at once, against autograd at its first token
    for reduction in ("sum", "token_mean", "sequence_mean"):
        assert [float(v) for v in num["per_sequence"][reduction]] == pytest.approx(
            reduction_weights(mask, reduction)[:, 0].tolist(), abs=1e-16)
    assert num["per_sequence"]["sequence_mean"] == (sp.Rational(1, 12), sp.Rational(1, 3), sp.Rational(1, 6))
    with pytest.raises(ValueError, match="lengths"):
        reduction_weights_symbolic([2, 0])
    with pytest.raises(ValueError, match="lengths"):
        reduction_weights_symbolic([])


@pytest.mark.parametrize("reduction", ["none", "sum", "token_mean", "sequence_mean", "constant"])
def test_reduce_tokens_gradcheck(reduction):
    x = torch.randn(3, 5, generator=gen(31), dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    c = 7.0 if reduction == "constant" else None
    assert torch.autograd.gradcheck(lambda z: reduce_tokens(z, mask, reduction, c), (x,))
    if reduction != "none":
        reduce_tokens(x, mask, reduction, c).backward()
        torch.testing.assert_close(x.grad, reduction_weights(mask, reduction, c))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 4), st.integers(0, 10**6))
def test_reduce_tokens_properties(rows, cols, pad, seed):
    x = torch.randn(rows, cols, generator=gen(seed), dtype=D)
    mask = torch.rand(rows, cols, generator=gen(seed + 1)) < 0.6
    mask[:, 0] = True  # every sequence keeps a token
    n = int(mask.sum())
    total = reduce_tokens(x, mask, "sum")
    assert reduce_tokens(x, mask, "token_mean").item() == pytest.approx(total.item() / n, abs=1e-12)
    assert reduce_tokens(x, mask, "none").sum().item() == pytest.approx(total.item(), abs=1e-12)
    assert reduce_tokens(x, mask, "constant", 3.5).item() == pytest.approx(total.item() / 3.5, abs=1e-12)
    per_row = sum(x[r][mask[r]].mean().item() for r in range(rows)) / rows
    seq = reduce_tokens(x, mask, "sequence_mean").item()
    assert seq == pytest.approx(per_row, abs=1e-12)
    # padding (masked-out columns, even holding NaN) changes no reduction
    xp = torch.cat([x, torch.full((rows, pad), math.nan, dtype=D)], dim=1)
    mp = torch.cat([mask, torch.zeros(rows, pad, dtype=torch.bool)], dim=1)
    for reduction in ("sum", "token_mean", "sequence_mean"):
        assert reduce_tokens(xp, mp, reduction).item() == pytest.approx(
            reduce_tokens(x, mask, reduction).item(), abs=1e-12)
    # the weights: the token mean's sum to 1; the sequence mean gives each sequence 1 / B
    torch.testing.assert_close(reduction_weights(mask, "token_mean").sum(), torch.tensor(1.0, dtype=D))
    torch.testing.assert_close(reduction_weights(mask, "sequence_mean").sum(1),
                               torch.full((rows,), 1 / rows, dtype=D))


def test_reduce_tokens_empty_mask():
    """What a reduction over no tokens does: sums are 0, means are a ValueError (never NaN)."""
    x = torch.randn(2, 3, generator=gen(5), dtype=D)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert reduce_tokens(x, empty, "sum").item() == 0.0
    assert reduce_tokens(x, empty, "constant", 4).item() == 0.0
    assert bool((reduce_tokens(x, empty, "none") == 0).all())
    with pytest.raises(ValueError, match="mask has no ones: reduction='token_mean'"):
        reduce_tokens(x, empty, "token_mean")
    with pytest.raises(ValueError, match="row with no ones"):
        reduce_tokens(x, empty, "sequence_mean")
    one_empty_row = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert reduce_tokens(x, one_empty_row, "token_mean").item() == pytest.approx(x[0, :2].mean().item())
    with pytest.raises(ValueError, match="row with no ones"):
        reduce_tokens(x, one_empty_row, "sequence_mean")


def test_reduce_tokens_bad_input():
    x, mask = torch.zeros(2, 3, dtype=D), torch.ones(2, 3)
    with pytest.raises(ValueError, match="reduction must be one of"):
        reduce_tokens(x, mask, "mean")
    with pytest.raises(TypeError, match="reduction must be a str"):
        reduce_tokens(x, mask, None)
    with pytest.raises(ValueError, match="normaliser applies to reduction='constant' only"):
        reduce_tokens(x, mask, "sum", normaliser=2)
    with pytest.raises(ValueError, match="needs a normaliser"):
        reduce_tokens(x, mask, "constant")
    with pytest.raises(ValueError, match="constant must be a positive"):
        reduce_tokens(x, mask, "constant", normaliser=0)
    with pytest.raises(ValueError, match="mask must have the shape of values"):
        reduce_tokens(x, torch.ones(2, 1), "sum")
    with pytest.raises(ValueError, match="token axis"):
        reduce_tokens(torch.tensor(1.0), torch.tensor(1), "sum")
    with pytest.raises(TypeError, match="values"):
        reduce_tokens(torch.zeros(2, 3, dtype=torch.long), mask, "sum")
    with pytest.raises(ValueError, match="only 0 and 1"):
        reduce_tokens(x, torch.full((2, 3), 2.0), "sum")


def test_check_reduction():
    assert check_reduction("sum") == "sum"
    assert check_reduction("mean", SEQUENCE_REDUCTIONS) == "mean"
    with pytest.raises(ValueError, match="aggregation must be one of"):
        check_reduction("mean", REDUCTIONS, "aggregation")
    with pytest.raises(TypeError, match="reduction must be a str"):
        check_reduction(1)


def test_reduce_sequences_and_sequence_values():
    v = torch.tensor([1.0, -2.0, 4.5], dtype=D)
    assert reduce_sequences(v).item() == 3.5 / 3
    assert reduce_sequences(v, "sum").item() == 3.5
    assert reduce_sequences(v, "none") is v
    with pytest.raises(ValueError, match="reduction must be one of"):
        reduce_sequences(v, "token_mean")
    with pytest.raises(ValueError, match="empty"):
        reduce_sequences(torch.zeros(0, dtype=D))
    x, mask = torch.tensor(X2, dtype=D), torch.tensor(M2)
    torch.testing.assert_close(sequence_values(x, mask), torch.tensor([3.0, 60.0], dtype=D))
    torch.testing.assert_close(sequence_values(x, mask, "mean"), torch.tensor([1.5, 20.0], dtype=D))
    with pytest.raises(ValueError, match="reduction must be one of"):
        sequence_values(x, mask, "token_mean")
    with pytest.raises(ValueError, match="no ones"):
        sequence_values(x, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]), "mean")
