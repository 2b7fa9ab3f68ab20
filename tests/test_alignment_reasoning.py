"""Tests for llmbook.alignment.reasoning: the arithmetic task, its verifier, SFT, GRPO, the length toy.

The verifier is checked on worked examples and, with hypothesis, on every kind of operand
pair; the model-facing code with an *oracle* (a module whose logits spell the right answer,
so every sample is right) and with the book's tiny model in float64. The micro-batched GRPO
gradient is compared with the gradient of :func:`~llmbook.alignment.losses.grpo_loss` on
the whole batch (itself checked against trl in tests/test_alignment_losses.py), on
responses of uneven lengths, for every aggregation.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen
from torch import nn

from llmbook.alignment import reasoning as R
from llmbook.alignment.logprobs import response_logprobs
from llmbook.alignment.losses import grpo_loss
from llmbook.alignment.reasoning import (
    END_ID,
    PAD_ID,
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    VOCAB,
    GRPOBatch,
    LengthToyPolicy,
)

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
operand = st.integers(0, R.MAX_OPERAND)


class Oracle(nn.Module):
    """Logits that put all mass on the right answer's next character (or on ``offset`` + it).

    With ``offset=1`` the last digit of every answer is off by one: always wrong.
    """

    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset

    def forward(self, ids):
        B, T = ids.shape
        logits = torch.full((B, T, len(VOCAB)), -30.0)
        for b in range(B):
            a, c = R.parse_problem(R.decode(ids[b, :PROMPT_LENGTH]))
            answer = R.format_answer(a + c + self.offset)
            for t in range(PROMPT_LENGTH - 1, T):
                ch = answer[t - PROMPT_LENGTH + 1] if t - PROMPT_LENGTH + 1 < len(answer) else "_"
                logits[b, t, VOCAB.index(ch)] = 30.0
        return logits


# ---------------------------------------------------------------- the task


def test_vocabulary_and_round_trip():
    assert VOCAB == "0123456789+=$_" and (END_ID, PAD_ID) == (12, 13)
    assert R.encode("07+12=").tolist() == [0, 7, 10, 1, 2, 11]
    assert R.decode(R.encode("19$__")) == "19$__"
    assert R.decode([1, 9, 12]) == "19$"
    with pytest.raises(ValueError, match=r"\['-'\]"):
        R.encode("07-12=")
    with pytest.raises(TypeError, match="str"):
        R.encode(7)
    with pytest.raises(ValueError, match=r"in \[0, 14\), found 14"):
        R.decode([1, 14])
    with pytest.raises(ValueError, match="one sequence"):
        R.decode(torch.zeros(2, 3, dtype=torch.long))


def test_format_and_parse_problems():
    assert R.format_problem(7, 12) == "07+12=" and R.format_problem(0, 99) == "00+99="
    assert R.parse_problem("07+12=") == (7, 12)
    assert R.format_answer(19) == "19$" and R.format_answer(0) == "0$"
    assert len(R.format_problem(5, 5)) == PROMPT_LENGTH == 6 and RESPONSE_LENGTH == 5
    for bad in ("7+12=", "07+12", "07-12=", "ab+12=", "07+12+3=", "٠7+12=", "", "007+12="):
        with pytest.raises(ValueError, match="malformed problem"):
            R.parse_problem(bad)
    with pytest.raises(ValueError, match="b must lie"):
        R.format_problem(3, 100)
    with pytest.raises(TypeError, match="a must be an int"):
        R.format_problem(True, 3)
    with pytest.raises(ValueError, match="non-negative"):
        R.format_answer(-1)
    with pytest.raises(TypeError, match="prompt"):
        R.parse_problem(712)


def test_parse_answer_cases():
    cases = {"19$": 19, "19$__": 19, "0$": 0, "198$": 198, "19$7$": 19, "19": None, "$": None,
             "019$": None, "00$": None, "1+9$": None, "": None, "_19$": None, "١٩$": None}
    for text, expected in cases.items():
        assert R.parse_answer(text) == expected, text
    with pytest.raises(TypeError, match="response"):
        R.parse_answer(None)


@settings(max_examples=200, deadline=None)
@given(operand, operand, st.integers(-5, 5))
def test_verify_answer_is_exact(a, b, delta):
    prompt = R.format_problem(a, b)
    assert R.parse_problem(prompt) == (a, b)
    assert R.verify_answer(prompt, R.format_answer(a + b))
    assert R.verify_answer(prompt, R.format_answer(a + b) + "_")
    assert not R.verify_answer(prompt, str(a + b))  # no end token: no answer
    if delta and a + b + delta >= 0:
        assert not R.verify_answer(prompt, R.format_answer(a + b + delta))


def test_problem_split_is_a_seeded_partition():
    test, train = R.problem_split("test"), R.problem_split("train")
    assert test.shape == (500, 2) and train.shape == (9500, 2) and test.dtype == torch.long
    codes = torch.cat([test, train]) @ torch.tensor([100, 1])
    assert torch.equal(codes.sort().values, torch.arange(10_000))  # every pair exactly once
    assert torch.equal(R.problem_split("test"), test)
    assert not torch.equal(R.problem_split("test", seed=1), test)
    with pytest.raises(ValueError, match="split"):
        R.problem_split("validation")


def test_prompt_and_target_ids():
    problems = torch.tensor([[7, 12], [99, 99], [0, 0]])
    prompts = R.prompt_ids(problems)
    assert prompts.shape == (3, PROMPT_LENGTH) and prompts.dtype == torch.long
    assert [R.decode(p) for p in prompts] == ["07+12=", "99+99=", "00+00="]
    all_pairs = R.problem_split("train")[:300]
    assert torch.equal(R.prompt_ids(all_pairs),
                       torch.stack([R.encode(R.format_problem(a, b)) for a, b in all_pairs.tolist()]))
    targets, mask = R.target_ids(problems)
    assert [R.decode(t) for t in targets] == ["19$__", "198$_", "0$___"]
    assert mask.sum(1).tolist() == [3, 4, 2] and mask.dtype == torch.bool
    with pytest.raises(ValueError, match="operands"):
        R.prompt_ids(torch.tensor([[7, 100]]))
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        R.prompt_ids(torch.tensor([[7, 1, 2]]))
    with pytest.raises(TypeError, match="long"):
        R.prompt_ids(torch.tensor([[7.0, 1.0]]))


def test_answer_mask_and_rewards():
    responses = torch.stack([R.encode(s) for s in ("19$__", "198$_", "$____", "12345", "1$$$$")])
    assert R.answer_mask(responses).sum(1).tolist() == [3, 4, 1, 5, 2]
    problems = torch.tensor([[7, 12], [99, 99], [0, 0], [1, 1], [0, 1]])
    assert R.correctness_rewards(problems, responses).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 problems but 5"):
        R.correctness_rewards(problems[:2], responses)
    with pytest.raises(TypeError, match="responses"):
        R.answer_mask(responses.float())


# ---------------------------------------------------------------- model, SFT, sampling


def test_arithmetic_model_shape():
    model = R.arithmetic_model(generator=gen(0))
    assert model.config.vocab_size == 14 and model.config.max_seq_len == PROMPT_LENGTH + RESPONSE_LENGTH
    assert 100_000 < model.num_parameters() < 110_000
    assert model(torch.zeros(2, 11, dtype=torch.long)).shape == (2, 11, 14)


def test_sft_loss_is_cross_entropy_on_the_answer_tokens():
    """Peer: torch's cross-entropy on the logits that predict each answer token."""
    model = R.arithmetic_model(generator=gen(1)).double()
    problems = torch.tensor([[7, 12], [99, 99], [0, 0]])
    targets, mask = R.target_ids(problems)
    ids = torch.cat([R.prompt_ids(problems), targets], 1)
    logits = model(ids)[:, PROMPT_LENGTH - 1:-1]  # (3, R, V): predict the response tokens
    ce = nn.functional.cross_entropy(logits.reshape(-1, 14), targets.reshape(-1), reduction="none")
    expected = (ce * mask.reshape(-1)).sum() / mask.sum()
    assert abs(R.sft_loss(model, problems) - expected).item() < 1e-12


def test_sampling_with_an_oracle_and_the_group_layout():
    problems = torch.tensor([[7, 12], [99, 99], [0, 0]])
    responses = R.sample_responses(Oracle(), problems, num_samples=2, temperature=1.0, generator=gen(0))
    assert responses.shape == (6, RESPONSE_LENGTH)
    assert [R.decode(r) for r in responses] == ["19$__", "19$__", "198$_", "198$_", "0$___", "0$___"]
    assert R.accuracy(Oracle(), problems) == 1.0
    assert R.accuracy(Oracle(offset=1), problems, temperature=1.0, num_samples=3, generator=gen(0)) == 0.0
    with pytest.raises(ValueError, match="num_samples"):
        R.sample_responses(Oracle(), problems, num_samples=0)


def test_sampled_responses_are_padded_after_the_end_token():
    model = R.arithmetic_model(generator=gen(2))  # untrained: random tokens
    responses = R.sample_responses(model, R.problem_split("test")[:64], 4, 1.0, gen(3))
    mask = R.answer_mask(responses)
    assert torch.all(responses[~mask] == PAD_ID)
    greedy = R.sample_responses(model, R.problem_split("test")[:8], 3, 0.0)
    assert torch.equal(greedy[0::3], greedy[1::3]) and torch.equal(greedy[0::3], greedy[2::3])


# ---------------------------------------------------------------- GRPO batches and accumulation


def test_make_grpo_batch():
    model = R.arithmetic_model(generator=gen(4)).double()
    problems = R.problem_split("train")[:5]
    batch = R.make_grpo_batch(model, model, problems, group_size=4, generator=gen(5))
    assert batch.responses.shape == (20, RESPONSE_LENGTH) and batch.prompts.shape == (20, PROMPT_LENGTH)
    assert torch.allclose(batch.advantages.view(5, 4).sum(1), torch.zeros(5, dtype=batch.advantages.dtype),
                          atol=1e-6)
    assert torch.equal(batch.mask, R.answer_mask(batch.responses))
    assert torch.equal(batch.old_logprobs, response_logprobs(model, batch.prompts, batch.responses))
    assert torch.equal(batch.ref_logprobs, batch.old_logprobs)
    oracle_batch = R.make_grpo_batch(Oracle(), None, problems, 3)
    assert oracle_batch.ref_logprobs is None
    assert oracle_batch.rewards.tolist() == [1.0] * 15
    assert oracle_batch.advantages.abs().max() == 0  # all right: no signal
    with pytest.raises(ValueError, match="group_size must be at least 2"):
        R.make_grpo_batch(Oracle(), None, problems, 1)


def uneven_batch(model, seed=6, beta=True):
    """Twelve responses of lengths 1 to 5, with old log-probs off the policy (ratios != 1)."""
    g = gen(seed)
    problems = R.problem_split("train")[:4]
    texts = ["19$", "3$", "1234$", "12345", "$", "55$", "7$", "100$", "2222$", "9$", "10$", "4321$"]
    responses = torch.stack([R.encode(t.ljust(RESPONSE_LENGTH, "_")) for t in texts])
    prompts = R.prompt_ids(problems).repeat_interleave(3, 0)
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 1], dtype=D)
    with torch.no_grad():
        old = response_logprobs(model, prompts, responses) + 0.3 * torch.randn(12, RESPONSE_LENGTH, generator=g,
                                                                             dtype=D)
        ref = response_logprobs(model, prompts, responses) + 0.2 * torch.randn(12, RESPONSE_LENGTH, generator=g,
                                                                             dtype=D)
    adv = torch.randn(12, generator=g, dtype=D)
    return GRPOBatch(prompts, responses, R.answer_mask(responses), rewards, adv, old, ref if beta else None)


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
@pytest.mark.parametrize("micro", [1, 5, 12])
def test_microbatch_gradient_equals_full_batch_gradient(aggregation, micro):
    model = R.arithmetic_model(generator=gen(7)).double()
    batch = uneven_batch(model)
    assert sorted(batch.mask.sum(1).tolist()) == [1, 2, 2, 2, 3, 3, 3, 4, 5, 5, 5, 5]
    model.zero_grad()
    full = grpo_loss(response_logprobs(model, batch.prompts, batch.responses), batch.old_logprobs,
                     batch.ref_logprobs, batch.advantages, batch.mask, 0.2, 0.05, aggregation)
    full.loss.backward()
    expected = grads(model).clone()
    model.zero_grad()
    stats = R.grpo_microbatch_step(model, batch, micro, 0.2, 0.05, aggregation)
    assert full.clip_fraction.item() > 0  # the clipping is active
    torch.testing.assert_close(grads(model), expected, rtol=0, atol=1e-12)
    assert stats["loss"] == pytest.approx(full.loss.item(), abs=1e-12)
    assert stats["kl"] == pytest.approx(full.kl.item(), abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(full.clip_fraction.item(), abs=1e-12)


def test_constant_aggregation_with_a_larger_max_length():
    model = R.arithmetic_model(generator=gen(8)).double()
    batch = uneven_batch(model, beta=False)
    model.zero_grad()
    grpo_loss(response_logprobs(model, batch.prompts, batch.responses), batch.old_logprobs, None,
              batch.advantages, batch.mask, 0.2, 0.0, "constant", max_length=9).loss.backward()
    expected = grads(model).clone()
    model.zero_grad()
    stats = R.grpo_microbatch_step(model, batch, 5, 0.2, 0.0, "constant", max_length=9)
    torch.testing.assert_close(grads(model), expected, rtol=0, atol=1e-12)
    assert stats["kl"] is None


def test_averaging_token_means_of_micro_batches_is_not_the_token_mean():
    """The pitfall grpo_microbatch_step avoids: micro-batches with different token counts."""
    model = R.arithmetic_model(generator=gen(9)).double()
    batch = uneven_batch(model, beta=False)
    model.zero_grad()
    R.grpo_microbatch_step(model, batch, 4, 0.2, 0.0, "token_mean")
    right = grads(model).clone()
    model.zero_grad()
    for start in range(0, 12, 4):
        rows = slice(start, start + 4)
        logp = response_logprobs(model, batch.prompts[rows], batch.responses[rows])
        (grpo_loss(logp, batch.old_logprobs[rows], None, batch.advantages[rows], batch.mask[rows],
                   0.2, 0.0, "token_mean").loss / 3).backward()
    assert (grads(model) - right).abs().max() > 1e-4


def test_grpo_microbatch_step_bad_inputs():
    model = R.arithmetic_model(generator=gen(10)).double()
    batch = uneven_batch(model)
    with pytest.raises(ValueError, match="batch.mask must have shape"):
        R.grpo_microbatch_step(model, batch._replace(mask=batch.mask[:, :3]), 4, 0.2)
    with pytest.raises(ValueError, match="batch.advantages"):
        R.grpo_microbatch_step(model, batch._replace(advantages=batch.advantages[:5]), 4, 0.2)
    with pytest.raises(ValueError, match="no tokens"):
        R.grpo_microbatch_step(model, batch._replace(mask=batch.mask & False), 4, 0.2)
    with pytest.raises(TypeError, match="boolean"):
        R.grpo_microbatch_step(model, batch._replace(mask=batch.mask.long()), 4, 0.2)
    with pytest.raises(ValueError, match="micro_batch_size"):
        R.grpo_microbatch_step(model, batch, 0, 0.2)
    with pytest.raises(ValueError, match="aggregation"):
        R.grpo_microbatch_step(model, batch, 4, 0.2, aggregation="dapo")
    with pytest.raises(ValueError, match="max_length"):
        R.grpo_microbatch_step(model, batch, 4, 0.2, aggregation="token_mean", max_length=9)
    with pytest.raises(TypeError, match="GRPOBatch"):
        R.grpo_microbatch_step(model, tuple(batch), 4, 0.2)


# ---------------------------------------------------------------- trainers and shipped models


def test_train_sft_runs_and_reports():
    recipe = dict(R.SFT_RECIPE, steps=3, eval_every=2, warmup_steps=1)
    tensors, info = R.train_sft(recipe)
    assert set(tensors) == set(R.arithmetic_model().state_dict())
    assert len(info["loss"]) == 3 and info["eval_steps"] == [0, 2, 3]
    assert info["loss"][0] > 2.0  # untrained: about log 14 = 2.6 nats
    assert 0 <= info["test_accuracy_greedy"] <= 1


def test_train_grpo_runs_from_the_shipped_sft_model():
    recipe = dict(R.GRPO_RECIPE, steps=2, prompts_per_step=3, group_size=2, micro_batch_size=4,
                  eval_every=1, eval_samples=1, warmup_steps=1)
    tensors, info = R.train_grpo(recipe)
    curve = info["curve"]
    assert len(curve["reward"]) == 2 and curve["eval_steps"] == [0, 1, 2]
    assert all(0 <= r <= 1 for r in curve["reward"]) and all(1 <= n <= 5 for n in curve["length"])
    assert set(info["scores"]) == {"sft_greedy", "sft_sampled", "grpo_greedy", "grpo_sampled"}
    _, sft_info = R.load_arithmetic_model("arithmetic_sft")
    assert info["scores"]["sft_greedy"] == pytest.approx(sft_info["test_accuracy_greedy"], abs=0.005)


def test_shipped_models_improve_with_grpo():
    test = R.problem_split("test")
    sft, sft_info = R.load_arithmetic_model("arithmetic_sft")
    grpo, grpo_info = R.load_arithmetic_model("arithmetic_grpo")
    before, after = R.accuracy(sft, test), R.accuracy(grpo, test)
    assert before == pytest.approx(sft_info["test_accuracy_greedy"], abs=0.005)
    assert after == pytest.approx(grpo_info["scores"]["grpo_greedy"], abs=0.005)
    assert 0.3 <= before <= 0.6 and after > before + 0.2
    with pytest.raises(ValueError, match="arithmetic_sft"):
        R.load_arithmetic_model("arithmetic")


# ---------------------------------------------------------------- the length toy


def test_length_toy_probabilities():
    policy = LengthToyPolicy(max_length=6, p_correct=0.3)
    with torch.no_grad():
        policy.continue_logits.copy_(torch.randn(2, 4, generator=gen(11), dtype=D))
    lengths = torch.arange(2, 7).repeat(2)
    correct = torch.tensor([True] * 5 + [False] * 5)
    logprobs, mask = policy.token_logprobs(correct, lengths)
    assert logprobs.shape == mask.shape == (10, 6) and mask.sum(1).tolist() == lengths.tolist()
    total = torch.exp((logprobs * mask).sum(1)).sum()  # every possible response, once
    assert abs(total.item() - 1) < 1e-12
    q = torch.sigmoid(policy.continue_logits[1]).detach()  # right: digit, digit, end at length 4
    by_hand = math.log(0.3) + math.log(q[0]) + math.log(q[1]) + math.log(1 - q[2])
    assert (logprobs[2] * mask[2]).sum().item() == pytest.approx(by_hand, abs=1e-12)
    probs = torch.exp((logprobs * mask).sum(1))
    right_mean = (probs[:5] * lengths[:5]).sum() / probs[:5].sum()
    wrong_mean = (probs[5:] * lengths[5:]).sum() / probs[5:].sum()
    assert policy.expected_lengths() == pytest.approx((right_mean.item(), wrong_mean.item()), abs=1e-12)


def test_length_toy_sampling_matches_its_expectation():
    policy = LengthToyPolicy(max_length=8)
    assert policy.expected_lengths() == pytest.approx((2 + sum(0.5**t for t in range(1, 7)),) * 2)
    correct, lengths = policy.sample(20_000, gen(12))
    assert abs(correct.double().mean().item() - 0.5) < 0.02
    assert abs(lengths.double().mean().item() - policy.expected_lengths()[0]) < 0.05
    assert lengths.min() == 2 and lengths.max() <= 8
    with pytest.raises(ValueError, match="lengths must lie"):
        policy.token_logprobs(correct[:2], torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="max_length"):
        LengthToyPolicy(max_length=2)
    with pytest.raises(ValueError, match="p_correct"):
        LengthToyPolicy(p_correct=1.0)


def test_length_bias_on_the_toy():
    """Per-sequence means lengthen wrong answers and shorten right ones; Dr. GRPO's does not."""
    seq = R.run_length_toy("sequence_mean", steps=80)
    const = R.run_length_toy("constant", steps=80)
    assert len(seq["right"]) == len(seq["wrong"]) == 81
    assert seq["wrong"][-1] > seq["wrong"][0] + 1.0 and seq["right"][-1] < seq["right"][0] - 0.5
    assert abs(const["wrong"][-1] - const["wrong"][0]) < 0.3
    assert abs(const["right"][-1] - const["right"][0]) < 0.3
    with pytest.raises(ValueError, match="aggregation"):
        R.run_length_toy("per_token")
