"""Bad input to Parts V-VI (llmbook.alignment, llmbook.scale) gets a clear error naming the
argument: wrong shapes, dtypes, empty tensors, NaN and out-of-range hyperparameters (issue 22
section 6). Each case asserts the argument's name in the message, so it fails if the check
goes or a generic torch error comes back instead."""

import pytest
import torch

from llmbook.alignment import dpo, logprobs, losses, policy_gradient, test_time

NAN = float("nan")
INF = float("inf")


def _lp(*shape):
    return -torch.rand(*shape)


ALIGNMENT_CASES = [
    # (id, thunk, error, match)
    ("token_logprobs NaN logits", lambda: logprobs.token_logprobs(
        torch.full((2, 3, 5), NAN), torch.zeros(2, 3, dtype=torch.long)), ValueError, r"logits must not hold NaN"),
    ("token_logprobs +inf logits", lambda: logprobs.token_logprobs(
        torch.tensor([[0.0, INF]]), torch.zeros(1, dtype=torch.long)), ValueError, r"logits must not hold \+inf"),
    ("token_logprobs empty vocabulary", lambda: logprobs.token_logprobs(
        torch.zeros(2, 3, 0), torch.zeros(2, 3, dtype=torch.long)), ValueError, "logits must have a non-empty vocabulary"),
    ("token_entropy empty vocabulary", lambda: logprobs.token_entropy(torch.zeros(2, 0)),
     ValueError, "logits must have a non-empty vocabulary"),
    ("token_entropy NaN", lambda: logprobs.token_entropy(torch.tensor([NAN, 0.0])), ValueError, "logits must not hold NaN"),
    ("response_logprobs negative ids", lambda: logprobs.response_logprobs(
        lambda x: torch.zeros(*x.shape, 4), torch.tensor([[0, -1]]), torch.tensor([[1]])),
     ValueError, "prompt_ids must hold token ids >= 0"),
    ("bradley_terry empty", lambda: losses.bradley_terry_loss(torch.zeros(0), torch.zeros(0)),
     ValueError, r"r_chosen is empty \(shape \(0,\)\)"),
    ("bradley_terry NaN", lambda: losses.bradley_terry_loss(torch.tensor([0.0, NAN]), torch.zeros(2)),
     ValueError, r"r_chosen must not hold NaN; r_chosen\[1\] = nan"),
    ("dpo_loss empty", lambda: losses.dpo_loss(*(torch.zeros(0),) * 4, beta=0.1), ValueError, "policy_chosen_logps is empty"),
    ("dpo_loss NaN", lambda: losses.dpo_loss(_lp(3), torch.tensor([-1.0, NAN, -1.0]), _lp(3), _lp(3), 0.1),
     ValueError, "policy_rejected_logps must not hold NaN"),
    ("dpo_loss -inf reference", lambda: losses.dpo_loss(
        torch.tensor([-INF]), _lp(1), torch.tensor([-INF]), _lp(1), 0.1), ValueError, "ref_chosen_logps must not hold NaN or inf"),
    ("dpo_loss NaN lengths", lambda: losses.dpo_loss(
        _lp(2), _lp(2), _lp(2), _lp(2), 0.1, loss_type="ipo", chosen_lengths=torch.tensor([NAN, 1.0]),
        rejected_lengths=torch.ones(2)), ValueError, "chosen_lengths must be positive token counts"),
    ("policy_gradient_loss NaN rewards", lambda: losses.policy_gradient_loss(_lp(2), torch.tensor([1.0, NAN])),
     ValueError, "rewards must not hold NaN"),
    ("policy_gradient_loss empty", lambda: losses.policy_gradient_loss(torch.zeros(0), torch.zeros(0)),
     ValueError, "logprobs is empty"),
    ("policy_gradient_loss NaN baseline", lambda: losses.policy_gradient_loss(
        _lp(2), torch.ones(2), baseline=torch.tensor(NAN)), ValueError, "baseline must not hold NaN"),
    ("gae no positions", lambda: losses.gae(torch.zeros(2, 0), torch.zeros(2, 0), 1.0, 0.9),
     ValueError, "rewards is empty"),
    ("gae NaN values", lambda: losses.gae(torch.zeros(3), torch.tensor([0.0, NAN, 0.0]), 1.0, 0.9),
     ValueError, "values must not hold NaN"),
    ("ppo_policy_loss NaN logprobs", lambda: losses.ppo_policy_loss(
        torch.full((2, 3), NAN), _lp(2, 3), torch.ones(2), torch.ones(2, 3), 0.2), ValueError, "logprobs must not hold NaN"),
    ("ppo_policy_loss NaN advantages", lambda: losses.ppo_policy_loss(
        _lp(2, 3), _lp(2, 3), torch.tensor([NAN, 1.0]), torch.ones(2, 3), 0.2), ValueError, "advantages must not hold NaN"),
    ("ppo_value_loss NaN returns", lambda: losses.ppo_value_loss(
        torch.zeros(2, 3), torch.zeros(2, 3), torch.full((2, 3), NAN), torch.ones(2, 3), 0.2),
     ValueError, "returns must not hold NaN"),
    ("kl_estimators NaN", lambda: losses.kl_estimators(torch.tensor([NAN]), _lp(1)), ValueError, "logp must not hold NaN"),
    ("group_normalized_rewards NaN", lambda: losses.group_normalized_rewards(torch.tensor([1.0, NAN]), 2),
     ValueError, "rewards must not hold NaN"),
    ("grpo_loss NaN logprobs", lambda: losses.grpo_loss(
        torch.full((2, 3), NAN), None, None, torch.ones(2), torch.ones(2, 3), 0.2, 0.0), ValueError, "logprobs must not hold NaN"),
    ("kl_regularized_objective NaN rewards", lambda: dpo.kl_regularized_objective(
        torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), torch.tensor([NAN, 0.0]), 1.0), ValueError, "rewards must not hold NaN"),
    ("dpo_logprob_gradients NaN", lambda: dpo.dpo_logprob_gradients(
        torch.tensor([NAN]), _lp(1), _lp(1), _lp(1), 0.1), ValueError, "policy_chosen_logps must not hold NaN"),
    ("reward_correlation integer", lambda: dpo.reward_correlation(torch.arange(3), torch.rand(3)),
     TypeError, "predicted must be a floating-point tensor"),
    ("reward_correlation NaN", lambda: dpo.reward_correlation(torch.rand(3), torch.tensor([0.0, NAN, 1.0])),
     ValueError, "true must not hold NaN"),
    ("reward_correlation constant", lambda: dpo.reward_correlation(torch.ones(3), torch.rand(3)),
     ValueError, "predicted is constant"),
    ("reward_correlation one value", lambda: dpo.reward_correlation(torch.ones(1), torch.ones(1)),
     ValueError, "predicted and true need at least 2 values"),
    ("dpo_step optimizer", lambda: dpo.dpo_step(torch.nn.Linear(1, 1), None, *(None,) * 5, beta=0.1),
     TypeError, "optimizer must be a torch Optimizer, got NoneType"),
    ("exact_policy_gradient NaN", lambda: policy_gradient.exact_policy_gradient(
        torch.tensor([NAN, 0.0]), torch.zeros(2)), ValueError, "logits must not hold NaN"),
    ("score_function_samples NaN baseline", lambda: policy_gradient.score_function_samples(
        torch.zeros(2), torch.zeros(2), 4, torch.Generator(), baseline=NAN), ValueError, "baseline must be a finite number"),
    ("sample_kl_estimators NaN", lambda: policy_gradient.sample_kl_estimators(
        torch.tensor([NAN, 0.5]), torch.tensor([0.5, 0.5]), 4, torch.Generator()), ValueError, "p must be positive"),
    ("sample_kl_estimators not a distribution", lambda: policy_gradient.sample_kl_estimators(
        torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.7]), 4, torch.Generator()), ValueError, "q must sum to 1"),
    ("clipped_surrogate_grad negative ratio", lambda: policy_gradient.clipped_surrogate_grad(
        torch.tensor([-1.0]), torch.ones(1), 0.2), ValueError, "ratio must be positive"),
    ("clipped_surrogate_grad NaN advantages", lambda: policy_gradient.clipped_surrogate_grad(
        torch.ones(1), torch.tensor([NAN]), 0.2), ValueError, "advantages must not hold NaN"),
    ("pass_at_n NaN tensor", lambda: test_time.pass_at_n(torch.tensor([NAN]), 3), ValueError, r"p must be a floating tensor with entries in \[0, 1\]"),
    ("majority_probability NaN tensor", lambda: test_time.majority_probability(torch.tensor([0.5, NAN]), 3),
     ValueError, r"p must be a floating tensor with entries in \[0, 1\]"),
    ("vote_accuracy mismatch", lambda: test_time.vote_accuracy([[1]], [1, 2], 1), ValueError, "answers and truths"),
]


@pytest.mark.parametrize(("thunk", "error", "match"), [c[1:] for c in ALIGNMENT_CASES],
                         ids=[c[0] for c in ALIGNMENT_CASES])
def test_alignment_bad_input(thunk, error, match):
    with pytest.raises(error, match=match):
        thunk()
