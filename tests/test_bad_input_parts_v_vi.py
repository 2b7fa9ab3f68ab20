"""Bad input to Parts V-VI (llmbook.alignment, llmbook.scale) gets a clear error naming the
argument: wrong shapes, dtypes, empty tensors, NaN and out-of-range hyperparameters (issue 22
section 6). Each case asserts the argument's name in the message, so it fails if the check
goes or a generic torch error comes back instead."""

import pytest
import torch

from llmbook.alignment import (
    dpo,
    logprobs,
    lora,
    losses,
    policy_gradient,
    ppo,
    preferences,
    reasoning,
    repeated_sampling,
    reward_model,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

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
    ("reduce_tokens unknown reduction", lambda: logprobs.reduce_tokens(torch.zeros(2, 3), torch.ones(2, 3), "avg"),
     ValueError, "reduction must be one of"),
    ("reduce_tokens all-false mask, token mean", lambda: logprobs.reduce_tokens(
        torch.zeros(2, 3), torch.zeros(2, 3), "token_mean"), ValueError, "mask has no ones"),
    ("reduce_tokens empty sequence, sequence mean", lambda: logprobs.reduce_tokens(
        torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]), "sequence_mean"), ValueError, "row with no ones"),
    ("reduce_tokens constant without normaliser", lambda: logprobs.reduce_tokens(
        torch.zeros(2, 3), torch.ones(2, 3), "constant"), ValueError, "needs a normaliser"),
    ("reduce_tokens NaN normaliser", lambda: logprobs.reduce_tokens(
        torch.zeros(2, 3), torch.ones(2, 3), "constant", NAN), ValueError, "constant must be a positive"),
    ("reduce_sequences empty mean", lambda: logprobs.reduce_sequences(torch.zeros(0)),
     ValueError, "values is empty"),
    ("sequence_values bad reduction", lambda: logprobs.sequence_values(torch.zeros(2, 3), torch.ones(2, 3), "none"),
     ValueError, "reduction must be one of"),
    ("ppo_policy_loss bad reduction", lambda: losses.ppo_policy_loss(
        _lp(2, 3), _lp(2, 3), torch.zeros(2), torch.ones(2, 3), 0.2, reduction="mean"),
     ValueError, "reduction must be one of"),
    ("ppo_value_loss normaliser without constant", lambda: losses.ppo_value_loss(
        _lp(2, 3), _lp(2, 3), _lp(2, 3), torch.ones(2, 3), None, normaliser=4.0),
     ValueError, "normaliser applies to reduction='constant' only"),
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
    ("pass_at_n NaN tensor", lambda: repeated_sampling.pass_at_n(torch.tensor([NAN]), 3), ValueError, r"p must be a floating tensor with entries in \[0, 1\]"),
    ("majority_probability NaN tensor", lambda: repeated_sampling.majority_probability(torch.tensor([0.5, NAN]), 3),
     ValueError, r"p must be a floating tensor with entries in \[0, 1\]"),
    ("vote_accuracy mismatch", lambda: repeated_sampling.vote_accuracy([[1]], [1, 2], 1), ValueError, "answers and truths"),
]


@pytest.mark.parametrize(("thunk", "error", "match"), [c[1:] for c in ALIGNMENT_CASES],
                         ids=[c[0] for c in ALIGNMENT_CASES])
def test_alignment_bad_input(thunk, error, match):
    with pytest.raises(error, match=match):
        thunk()


@pytest.fixture(scope="module")
def tiny_lm():
    config = TransformerConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, max_seq_len=16,
                               fused_attention=False)
    return TransformerLM(config, generator=torch.Generator().manual_seed(0))


def _ids(*shape):
    return torch.randint(0, 32, shape, generator=torch.Generator().manual_seed(1))


def _rollout(lm):
    critic = ppo.ValueModel(lm)
    return critic, ppo.rollout(lm, lm, critic, _ids(4, 3), 2, lambda p, r: torch.zeros(4),
                               generator=torch.Generator().manual_seed(0))


MODEL_CASES = [
    ("rollout NaN scores", lambda lm: ppo.rollout(lm, lm, ppo.ValueModel(lm), _ids(2, 3), 2,
                                                  lambda p, r: torch.full((2,), NAN)),
     ValueError, "reward_fn's scores must not hold NaN"),
    ("rollout no prompts", lambda lm: ppo.rollout(lm, lm, ppo.ValueModel(lm), _ids(0, 3), 2,
                                                  lambda p, r: torch.zeros(0)), ValueError, "prompts is empty"),
    ("ppo_update max_grad_norm 0", lambda lm: ppo.ppo_update(
        lm, _rollout(lm)[0], _rollout(lm)[1], torch.optim.SGD(lm.parameters(), lr=0.0),
        torch.optim.SGD(lm.parameters(), lr=0.0), beta=0.1, minibatch_size=2, max_grad_norm=0.0),
     ValueError, "max_grad_norm must be a positive finite number"),
    ("ppo_update value_clip NaN", lambda lm: ppo.ppo_update(
        lm, _rollout(lm)[0], _rollout(lm)[1], torch.optim.SGD(lm.parameters(), lr=0.0),
        torch.optim.SGD(lm.parameters(), lr=0.0), beta=0.1, minibatch_size=2, value_clip=NAN),
     ValueError, "value_clip must be a positive finite number"),
    ("ppo_update optimizer", lambda lm: ppo.ppo_update(
        lm, _rollout(lm)[0], _rollout(lm)[1], None, torch.optim.SGD(lm.parameters(), lr=0.0), beta=0.1,
        minibatch_size=2), TypeError, "policy_optimizer must be a torch Optimizer"),
    ("ppo_update whiten_advantages", lambda lm: ppo.ppo_update(
        lm, _rollout(lm)[0], _rollout(lm)[1], torch.optim.SGD(lm.parameters(), lr=0.0),
        torch.optim.SGD(lm.parameters(), lr=0.0), beta=0.1, minibatch_size=2, whiten_advantages="no"),
     TypeError, "whiten_advantages must be a bool"),
    ("reward_model_step grad_clip str", lambda lm: reward_model.reward_model_step(
        reward_model.RewardModel(lm), torch.optim.SGD(lm.parameters(), lr=0.0), _ids(2, 3), _ids(2, 2),
        _ids(2, 2), grad_clip="1"), TypeError, "grad_clip must be a number"),
    ("train_reward_model misaligned data", lambda lm: reward_model.train_reward_model(
        reward_model.RewardModel(lm), preferences.PreferenceData(_ids(8, 3), _ids(7, 2), _ids(8, 2), torch.zeros(8),
                                                                 torch.zeros(8)), 1, 2, 0.1, torch.Generator()),
     ValueError, "data: need prompts"),
    ("train_reward_model warmup_steps -1", lambda lm: reward_model.train_reward_model(
        reward_model.RewardModel(lm), preferences.PreferenceData(_ids(8, 3), _ids(8, 2), _ids(8, 2), torch.zeros(8),
                                                                 torch.zeros(8)), 1, 2, 0.1, torch.Generator(),
        warmup_steps=-1), ValueError, "warmup_steps must be an int >= 0"),
    ("train_reward_model lr NaN", lambda lm: reward_model.train_reward_model(
        reward_model.RewardModel(lm), preferences.PreferenceData(_ids(8, 3), _ids(8, 2), _ids(8, 2), torch.zeros(8),
                                                                 torch.zeros(8)), 1, 2, NAN, torch.Generator()),
     ValueError, "lr must be a positive finite number"),
    ("sft_batch negative ids", lambda lm: __import__("llmbook.alignment.sft", fromlist=["sft_batch"]).sft_batch(
        -_ids(2, 3) - 1, _ids(2, 2)), ValueError, "prompt_ids must hold token ids >= 0"),
    ("preferences.sample_responses length 0", lambda lm: preferences.sample_responses(lm, _ids(2, 3), 0),
     ValueError, "length must be positive"),
    ("preferences.sample_responses batch_size 0", lambda lm: preferences.sample_responses(
        lm, _ids(2, 3), 2, batch_size=0), ValueError, "batch_size must be positive"),
    ("preferences.sample_responses float prompts", lambda lm: preferences.sample_responses(
        lm, torch.zeros(2, 3), 2), TypeError, "prompts must be an integer tensor"),
    ("evaluate_policy response_tokens 0", lambda lm: preferences.evaluate_policy(
        lm, lm, _ids(2, 3), torch.tensor([1]), response_tokens=0), ValueError, "response_tokens must be positive"),
    ("evaluate_policy float keywords", lambda lm: preferences.evaluate_policy(
        lm, lm, _ids(2, 3), torch.tensor([1.0])), TypeError, "keywords must be a"),
]


@pytest.mark.parametrize(("thunk", "error", "match"), [c[1:] for c in MODEL_CASES],
                         ids=[c[0] for c in MODEL_CASES])
def test_alignment_bad_input_with_a_model(tiny_lm, thunk, error, match):
    with pytest.raises(error, match=match):
        thunk(tiny_lm)


MORE_ALIGNMENT_CASES = [
    ("pairwise_accuracy NaN", lambda: reward_model.pairwise_accuracy(torch.tensor([NAN]), torch.zeros(1)),
     ValueError, "r_chosen must not hold NaN"),
    ("pearson_correlation NaN", lambda: reward_model.pearson_correlation(torch.tensor([0.0, NAN, 1.0]), torch.rand(3)),
     ValueError, "x must not hold NaN"),
    ("spearman_correlation NaN", lambda: reward_model.spearman_correlation(torch.rand(3), torch.tensor([0.0, NAN, 1.0])),
     ValueError, "y must not hold NaN"),
    ("label_preferences NaN", lambda: preferences.label_preferences(
        torch.tensor([NAN]), torch.zeros(1), 1.0, torch.Generator()), ValueError, "r_a must not hold NaN"),
    ("count_trainable_parameters", lambda: lora.count_trainable_parameters(3), TypeError, "model must be a torch.nn.Module"),
    ("prompt_ids operands", lambda: reasoning.prompt_ids(torch.tensor([[100, 1]])), ValueError,
     r"problems must hold operands in \[0, 99\]"),
    ("run_length_toy lr 0", lambda: reasoning.run_length_toy("token_mean", steps=1, lr=0.0), ValueError,
     "lr must be a positive finite number"),
    ("run_length_toy num_groups 0", lambda: reasoning.run_length_toy("token_mean", steps=1, num_groups=0),
     ValueError, "num_groups must be positive"),
    ("LoRALinear float64 input", lambda: lora.LoRALinear(torch.nn.Linear(4, 3), 2, 4.0)(
        torch.randn(2, 4, dtype=torch.float64)), TypeError, "x must have the dtype of the adapter's weights, torch.float32"),
    ("optimal_policy NaN rewards", lambda: dpo.optimal_policy(torch.tensor([0.5, 0.5]), torch.tensor([NAN, 0.0]), 1.0),
     ValueError, "rewards must not hold NaN"),
    ("bayes_optimal_accuracy NaN", lambda: reward_model.bayes_optimal_accuracy(
        torch.tensor([0.0, NAN]), torch.zeros(2), 1.0), ValueError, "true_a must not hold NaN"),
    ("kl_shaped_rewards NaN scores", lambda: ppo.kl_shaped_rewards(
        torch.tensor([NAN, 1.0]), _lp(2, 3), _lp(2, 3), 0.1), ValueError, "scores must not hold NaN"),
    ("kl_shaped_rewards NaN log-prob at a response token", lambda: ppo.kl_shaped_rewards(
        torch.ones(2), torch.tensor([[-1.0, -2.0, -0.5], [-1.0, NAN, -0.5]]), _lp(2, 3), 0.1),
     ValueError, r"logprobs must not hold NaN or inf; logprobs\[1, 1\] = nan"),
    ("kl_shaped_rewards -inf reference log-prob", lambda: ppo.kl_shaped_rewards(
        torch.ones(2), _lp(2, 3), torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -2.0, -float("inf")]]), 0.1),
     ValueError, r"ref_logprobs must not hold NaN or inf; ref_logprobs\[1, 2\] = -inf"),
]


def test_kl_shaped_rewards_still_ignores_nan_in_padding():
    lp = torch.tensor([[-1.0, -2.0, NAN], [-1.0, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rewards = ppo.kl_shaped_rewards(torch.ones(2), lp, torch.zeros(2, 3), 0.1, mask=mask)
    assert torch.isfinite(rewards).all() and rewards[0, 2] == 0


@pytest.mark.parametrize(("thunk", "error", "match"), [c[1:] for c in MORE_ALIGNMENT_CASES],
                         ids=[c[0] for c in MORE_ALIGNMENT_CASES])
def test_more_alignment_bad_input(thunk, error, match):
    with pytest.raises(error, match=match):
        thunk()


def _scale_cases():
    from llmbook.scale import (
        collectives,
        cost_model,
        data_parallel,
        induction,
        interpretability,
        linear_attention,
        moe,
        moe_training,
        pipeline,
        rwkv,
        ssm,
        tensor_parallel,
        zero,
    )
    from llmbook.transformer.layers import MLP

    q, v = torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    w, u, k = torch.rand(4), torch.randn(4), torch.randn(2, 5, 4)
    aot = induction.AttentionOnlyTransformer(10, 8, 2, 2, 8, generator=torch.Generator().manual_seed(0))
    mamba = ssm.MambaLM(ssm.MambaConfig(10, d_model=8, n_layers=1, d_state=4))
    rwkv_lm = rwkv.RWKVLM(rwkv.RWKVConfig(10, d_model=8, n_layers=1))
    ids = torch.zeros(2, 3, dtype=torch.long)
    return [
        ("route NaN logits", lambda: moe.route(torch.full((3, 4), NAN), 2), ValueError, "router_logits must not hold NaN"),
        ("router_z_loss NaN", lambda: moe.router_z_loss(torch.tensor([[0.0, NAN]])), ValueError,
         "router_logits must not hold NaN"),
        ("MoELayer float64 input", lambda: moe.MoELayer(4, 8, 3, 2)(torch.randn(2, 4, dtype=torch.float64)),
         TypeError, "x must have the dtype of the layer's weights, torch.float32"),
        ("moe_layers not a module", lambda: moe_training.moe_layers(3), TypeError, "model must be a torch.nn.Module"),
        ("linear attention T=0", lambda: linear_attention.causal_linear_attention_recurrent(
            q[:, :0], q[:, :0], v[:, :0]), ValueError, r"q, k and v have no positions \(T = 0\)"),
        ("linear attention dtype mix", lambda: linear_attention.causal_linear_attention_parallel(q.double(), q, v),
         TypeError, "k must have the dtype of q, torch.float64"),
        ("linear attention NaN", lambda: linear_attention.causal_linear_attention_cumsum(q, q, torch.full_like(v, NAN)),
         ValueError, "v must not hold NaN"),
        ("linear attention feature_map", lambda: linear_attention.causal_linear_attention_parallel(q, q, v, feature_map=3),
         TypeError, "feature_map must be callable"),
        ("ssm_recurrent T=0", lambda: ssm.ssm_recurrent(torch.eye(3) * 0.5, torch.ones(3), torch.ones(3), torch.zeros(0)),
         ValueError, "u must have shape"),
        ("ssm_recurrent dtype mix", lambda: ssm.ssm_recurrent(torch.eye(3) * 0.5, torch.ones(3), torch.ones(3),
                                                              torch.zeros(5, dtype=torch.float64)),
         TypeError, "u must have the dtype of A_bar"),
        ("linear_recurrence T=0", lambda: ssm.linear_recurrence(torch.zeros(2, 0), torch.zeros(2, 0)),
         ValueError, "a and b have no steps along dim=1"),
        ("selective_scan negative delta", lambda: ssm.selective_scan(
            torch.randn(2, 5, 3), -torch.rand(2, 5, 3), -torch.rand(3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
         ValueError, "delta must hold step sizes >= 0"),
        ("selective_scan T=0", lambda: ssm.selective_scan(
            torch.randn(2, 0, 3), torch.rand(2, 0, 3), -torch.rand(3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 4)),
         ValueError, r"u has no positions \(T = 0\)"),
        ("selective_scan NaN", lambda: ssm.selective_scan(
            torch.full((2, 5, 3), NAN), torch.rand(2, 5, 3), -torch.rand(3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)),
         ValueError, "u must not hold NaN"),
        ("MambaConfig eps NaN", lambda: ssm.MambaConfig(10, eps=NAN), ValueError, "eps must be a positive finite number"),
        ("MambaLM scan_method", lambda: ssm.MambaLM(ssm.MambaConfig(10, d_model=8, n_layers=1), scan_method="x"),
         ValueError, "scan_method must be 'sequential' or 'parallel'"),
        ("MambaLM ids out of range", lambda: mamba(torch.full((2, 3), 10)), ValueError, r"ids must hold token ids in \[0, 10\)"),
        ("MambaLM no positions", lambda: mamba(ids[:, :0]), ValueError, "ids is empty"),
        ("wkv_recurrent T=0", lambda: rwkv.wkv_recurrent(w, u, k[:, :0], k[:, :0]), ValueError, r"no positions \(T = 0\)"),
        ("wkv_parallel negative w", lambda: rwkv.wkv_parallel(-w - 0.1, u, k, k), ValueError, "w must hold decay rates >= 0"),
        ("wkv_parallel dtype mix", lambda: rwkv.wkv_parallel(w.double(), u, k, k), TypeError, "w must have the dtype of k"),
        ("wkv_recurrent NaN", lambda: rwkv.wkv_recurrent(w, u, torch.full_like(k, NAN), k), ValueError, "k must not hold NaN"),
        ("RWKVConfig eps NaN", lambda: rwkv.RWKVConfig(10, eps=NAN), ValueError, "eps must be a positive finite number"),
        ("RWKVLM ids out of range", lambda: rwkv_lm(torch.full((2, 3), -1)), ValueError, r"ids must hold token ids in \[0, 10\)"),
        ("RWKVLM no positions", lambda: rwkv_lm(ids[:, :0]), ValueError, "ids is empty"),
        ("RWKVChannelMixing width", lambda: rwkv.RWKVChannelMixing(8, 16)(torch.randn(2, 3, 5)), ValueError,
         r"x must have shape \(batch, T, d_model\) = \(batch, T, 8\)"),
        ("AttentionOnlyTransformer embed_std 0", lambda: induction.AttentionOnlyTransformer(10, 8, 1, 2, 8, embed_std=0.0),
         ValueError, "embed_std must be a positive finite number"),
        ("AttentionOnlyTransformer ablate list", lambda: aot(ids, ablate=[1]), TypeError, "ablate must be a dict"),
        ("per_position_loss ids out of range", lambda: induction.per_position_loss(torch.randn(2, 3, 10), ids + 10),
         ValueError, r"ids must hold token ids in \[0, 10\)"),
        ("per_position_loss integer logits", lambda: induction.per_position_loss(torch.ones(2, 3, 10, dtype=torch.long), ids),
         TypeError, "logits must be a floating-point tensor"),
        ("per_position_loss NaN logits", lambda: induction.per_position_loss(torch.full((2, 3, 10), NAN), ids),
         ValueError, "logits must not hold NaN"),
        ("previous_token_score T=1", lambda: induction.previous_token_score(torch.ones(2, 2, 1, 1)), ValueError, "T >= 2"),
        ("prefix_matching_score NaN", lambda: induction.prefix_matching_score(torch.full((1, 1, 4, 4), NAN), 2),
         ValueError, "pattern must not hold NaN"),
        ("icl_score 0-d", lambda: interpretability.icl_score(torch.tensor(1.0), 0, 1), ValueError, "position_loss must have a position axis"),
        ("ablation_value layer", lambda: interpretability.ablation_value(aot, ids, 5, 0), ValueError, r"layer must be an int in \[0, 2\)"),
        ("ablation_value head", lambda: interpretability.ablation_value(aot, ids, 0, -1), ValueError, r"head must be an int in \[0, 2\)"),
        ("ablation_value model", lambda: interpretability.ablation_value(None, ids, 0, 0), TypeError, "model must be an AttentionOnlyTransformer"),
        ("allreduce_time bandwidth 0", lambda: cost_model.allreduce_time(1e6, 4, 0.0, 1e-5), ValueError,
         "bandwidth must be a positive finite number"),
        ("allreduce_time latency NaN", lambda: cost_model.allreduce_time(1e6, 4, 1e9, NAN), ValueError,
         "latency must be a finite number >= 0"),
        ("allreduce_time negative bytes", lambda: cost_model.allreduce_time(-1.0, 4, 1e9, 1e-5), ValueError,
         "n_bytes must be a finite number >= 0"),
        ("shard_batch list", lambda: data_parallel.shard_batch([1, 2], 0, 1), TypeError, "batch must be a torch.Tensor"),
        ("shard_batch rank", lambda: data_parallel.shard_batch(torch.zeros(4, 2), 2, 2), ValueError, r"rank must be an int in \[0, 2\)"),
        ("shard_bounds rank bool", lambda: zero.shard_bounds(10, 2, True), TypeError, "rank must be an int, got True"),
        ("make_regression_batches batch_size", lambda: zero.make_regression_batches(2, -2), ValueError, "batch_size must be positive"),
        ("make_regression_batches dtype", lambda: zero.make_regression_batches(2, 2, dtype=torch.long), TypeError,
         "dtype must be a floating-point dtype"),
        # the second sweep: functions shown in the chapters
        ("causal_convolution T=0", lambda: ssm.causal_convolution(torch.zeros(2, 0), torch.zeros(0)), ValueError,
         r"u has no positions \(T = 0\)"),
        ("causal_convolution dtype mix", lambda: ssm.causal_convolution(torch.zeros(3), torch.zeros(3, dtype=torch.float64)),
         TypeError, "K must have the dtype of u"),
        ("causal_convolution NaN", lambda: ssm.causal_convolution(torch.full((3,), NAN), torch.ones(3)), ValueError,
         "u must not hold NaN"),
        ("fit_alpha_beta NaN seconds", lambda: collectives.fit_alpha_beta([1e3, 1e4], [1e-3, NAN], 2), ValueError,
         "seconds must not hold NaN"),
        ("fit_alpha_beta NaN bytes", lambda: collectives.fit_alpha_beta([NAN, 1e4], [1e-3, 2e-3], 2), ValueError,
         "n_bytes must not hold NaN"),
        ("fit_alpha_beta strings", lambda: collectives.fit_alpha_beta([1e3, 1e4], ["a", "b"], 2), TypeError,
         "seconds must be a 1-d sequence of numbers"),
        ("run_with_cache empty ids", lambda: aot.run_with_cache(ids[:, :0]), ValueError, "ids is empty"),
        ("run_with_cache ids out of range", lambda: aot.run_with_cache(ids + 10), ValueError,
         r"ids must hold token ids in \[0, 10\)"),
        ("MambaMixer width", lambda: ssm.MambaMixer(ssm.MambaConfig(10, d_model=8))(torch.randn(2, 3, 5)), ValueError,
         r"h must have shape \(batch, T, d_model\) = \(batch, T, 8\)"),
        ("MambaMixer dtype", lambda: ssm.MambaMixer(ssm.MambaConfig(10, d_model=8))(torch.randn(2, 3, 8).double()),
         TypeError, "h must have the dtype of the layer's weights, torch.float32"),
        ("RWKVTimeMixing width", lambda: rwkv.RWKVTimeMixing(8)(torch.randn(2, 3, 5)), ValueError,
         r"x must have shape \(batch, T, d_model\) = \(batch, T, 8\)"),
        ("RWKVTimeMixing dtype", lambda: rwkv.RWKVTimeMixing(8)(torch.randn(2, 3, 8).double()), TypeError,
         "x must have the dtype of the layer's weights, torch.float32"),
        ("RWKVChannelMixing T=0", lambda: rwkv.RWKVChannelMixing(8, 16)(torch.randn(2, 0, 8)), ValueError, "with T >= 1"),
        ("head_ablation_effects all-False mask", lambda: interpretability.head_ablation_effects(
            aot, ids, torch.zeros(2, dtype=torch.bool)), ValueError, "mask selects no predictions"),
        ("route NaN bias", lambda: moe.route(torch.randn(3, 4), 2, bias=torch.tensor([0.0, NAN, 0.0, 0.0])),
         ValueError, "bias must not hold NaN"),
        ("route normalize str", lambda: moe.route(torch.randn(3, 4), 2, normalize="yes"), TypeError,
         "normalize must be a bool"),
        # the cost model
        ("ModelSpec n_heads 0", lambda: cost_model.ModelSpec("m", 2, 8, 0, 16, 10), ValueError, "n_heads must be positive"),
        ("ModelSpec n_layers float", lambda: cost_model.ModelSpec("m", 2.5, 8, 2, 16, 10), TypeError,
         "n_layers must be an int"),
        ("ModelSpec n_params NaN", lambda: cost_model.ModelSpec("m", 2, 8, 2, 16, 10, NAN), ValueError,
         "n_params must be a positive finite number"),
        ("Cluster n_gpus 0", lambda: cost_model.Cluster("c", 0, 1e12, 1e9, 1e9, 1e9), ValueError, "n_gpus must be positive"),
        ("Cluster bandwidth NaN", lambda: cost_model.Cluster("c", 8, 1e12, 1e9, NAN, 1e9), ValueError,
         "intra_bandwidth must be a positive finite number"),
        ("Cluster negative latency", lambda: cost_model.Cluster("c", 8, 1e12, 1e9, 1e9, 1e9, latency=-1.0), ValueError,
         "latency must be a finite number >= 0"),
        ("Layout recompute", lambda: cost_model.Layout(1, 1, 1, 1, 1, "some"), ValueError, "recompute must be one of"),
        ("Layout zero_stage", lambda: cost_model.Layout(1, 1, 1, 1, 1, zero_stage=4), ValueError,
         "zero_stage must be 0, 1, 2 or 3"),
        ("Layout sequence_parallel", lambda: cost_model.Layout(1, 1, 1, 1, 1, sequence_parallel="yes"), TypeError,
         "sequence_parallel must be a bool"),
        ("Efficiency compute 0", lambda: cost_model.Efficiency(0.0), ValueError, r"compute must lie in \(0, 1\]"),
        ("Efficiency dp_overlap NaN", lambda: cost_model.Efficiency(0.5, NAN), ValueError, r"dp_overlap must lie in \[0, 1\]"),
        ("memory_per_gpu tp=0", lambda: cost_model.memory_per_gpu(cost_model.GPT3_175B, cost_model.Layout(0, 1, 1, 1, 1)),
         ValueError, "tp must be positive"),
        ("memory_per_gpu layout None", lambda: cost_model.memory_per_gpu(cost_model.GPT3_175B, None), TypeError,
         "layout must be a Layout"),
        ("predict eff None", lambda: cost_model.predict(cost_model.GPT3_175B, cost_model.a100_cluster(1024),
                                                        cost_model.Layout(8, 8, 16, 1, 1536), None), TypeError,
         "eff must be an Efficiency"),
        ("best_layout model None", lambda: cost_model.best_layout(None, cost_model.a100_cluster(8), 8), TypeError,
         "model must be a ModelSpec"),
        ("best_layout micro_batches 0", lambda: cost_model.best_layout(
            cost_model.GPT3_175B, cost_model.a100_cluster(8), 8, micro_batches=(0,)), ValueError,
         "micro_batches must be positive"),
        # distributed training's helpers (no processes started)
        ("alpha_beta_time negative alpha", lambda: collectives.alpha_beta_time(1e3, 4, -1e-5, 1e-9), ValueError,
         "alpha must be a finite number >= 0"),
        ("alpha_beta_time NaN beta", lambda: collectives.alpha_beta_time(1e3, 4, 1e-5, NAN), ValueError,
         "beta must be a finite number >= 0"),
        ("zero_memory_per_rank k=0", lambda: zero.zero_memory_per_rank(1, 8, 4, 2, 2, 0), ValueError, "k must be positive"),
        ("zero_memory_per_rank negative bytes", lambda: zero.zero_memory_per_rank(1, 8, 4, -2, 2, 12), ValueError,
         "bytes_weight must be positive"),
        ("tiny_mlp one width", lambda: zero.tiny_mlp(0, dims=(12,)), ValueError, "dims must be a tuple of at least 2"),
        ("tiny_mlp zero width", lambda: zero.tiny_mlp(0, dims=(12, 0, 8)), ValueError, "dims must be a tuple"),
        ("make_batches vocab 0", lambda: data_parallel.make_batches(2, 2, vocab_size=0), ValueError,
         "vocab_size must be positive"),
        ("ZeroTrainer lr NaN", lambda: zero.ZeroTrainer(zero.tiny_mlp(0), 1, lr=NAN), ValueError, "lr must be finite"),
        ("ZeroTrainer betas", lambda: zero.ZeroTrainer(zero.tiny_mlp(0), 1, betas=(0.9, 1.5)), ValueError, "beta2 must lie"),
        ("ZeroTrainer master_dtype", lambda: zero.ZeroTrainer(zero.tiny_mlp(0), 1, master_dtype=torch.int32), TypeError,
         "master_dtype must be None or a floating-point"),
        ("ZeroTrainer no parameters", lambda: zero.ZeroTrainer(torch.nn.Sequential(torch.nn.Tanh()), 1), ValueError,
         "model has no parameters"),
        ("BucketedDataParallel module", lambda: data_parallel.BucketedDataParallel(None), TypeError,
         "module must be a torch.nn.Module"),
        ("BucketedDataParallel frozen module", lambda: data_parallel.BucketedDataParallel(
            torch.nn.Linear(2, 2).requires_grad_(False)), ValueError, "module has no parameter that requires a gradient"),
        ("ColumnParallelLinear 1-d weight", lambda: tensor_parallel.ColumnParallelLinear(torch.zeros(4), None), ValueError,
         r"weight must be 2-d \(d_out, d_in\)"),
        ("RowParallelLinear bias shape", lambda: tensor_parallel.RowParallelLinear(torch.zeros(4, 2), torch.zeros(2)),
         ValueError, r"bias must have shape \(d_out,\) = \(4,\)"),
        ("RowParallelLinear bias dtype", lambda: tensor_parallel.RowParallelLinear(
            torch.zeros(4, 2), torch.zeros(4, dtype=torch.float64)), TypeError, "bias must have the dtype of weight"),
        ("single_process_reference grad_out shape", lambda: tensor_parallel.single_process_reference(
            MLP(8, 16), torch.randn(2, 3, 8), torch.randn(2, 3, 4)), ValueError, "grad_out must have the shape"),
        ("single_process_reference grad_out dtype", lambda: tensor_parallel.single_process_reference(
            MLP(8, 16), torch.randn(2, 3, 8), torch.randn(2, 3, 8).double()), TypeError, "grad_out must have the dtype of x"),
        ("single_process_reference NaN x", lambda: tensor_parallel.single_process_reference(
            MLP(8, 16), torch.full((2, 3, 8), NAN), torch.randn(2, 3, 8)), ValueError, "x must not hold NaN"),
        ("reference_gradients y shape", lambda: pipeline.reference_gradients(
            pipeline.make_mlp_stack([4, 6, 3]), torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)),
         ValueError, r"y must have shape \(B, 3\)"),
        ("check_pipeline x width", lambda: pipeline.check_pipeline(
            pipeline.make_mlp_stack([4, 6, 3]), torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64),
            2, 2, "1f1b"), ValueError, r"x must have shape \(B, 4\)"),
        ("check_pipeline x dtype", lambda: pipeline.check_pipeline(
            pipeline.make_mlp_stack([4, 6, 3]), torch.randn(4, 4), torch.randn(4, 3), 2, 2, "1f1b"), TypeError,
         "x must have the dtype of the model's weights, torch.float64"),
        ("check_pipeline x NaN", lambda: pipeline.check_pipeline(
            pipeline.make_mlp_stack([4, 6, 3]), torch.full((4, 4), NAN, dtype=torch.float64),
            torch.randn(4, 3, dtype=torch.float64), 2, 2, "1f1b"), ValueError, "x must not hold NaN"),
        ("run_pipeline t_f=0", lambda: pipeline.run_pipeline(
            pipeline.make_mlp_stack([4, 6, 3]), torch.randn(4, 4, dtype=torch.float64),
            torch.randn(4, 3, dtype=torch.float64), 2, 2, t_f=0), ValueError, "t_f and t_b must be positive int ticks"),
        ("run_pipeline compute_seconds NaN", lambda: pipeline.run_pipeline(
            pipeline.make_mlp_stack([4, 6, 3]), torch.randn(4, 4, dtype=torch.float64),
            torch.randn(4, 3, dtype=torch.float64), 2, 2, compute_seconds=NAN), ValueError,
         "compute_seconds must be a finite number >= 0"),
        ("train_single_process missing lr", lambda: data_parallel.train_single_process({"seed": 0, "steps": 1, "batch_size": 2}),
         ValueError, r"spec is missing the key\(s\) \['lr'\]"),
        ("train_unsharded missing weight_decay", lambda: zero.train_unsharded(
            {"seed": 0, "steps": 1, "batch_size": 2, "lr": 0.1}), ValueError, r"spec is missing the key\(s\) \['weight_decay'\]"),
        ("train_unsharded spec list", lambda: zero.train_unsharded([1]), TypeError, "spec must be a dict"),
    ]


SCALE_CASES = _scale_cases()


@pytest.mark.parametrize(("thunk", "error", "match"), [c[1:] for c in SCALE_CASES], ids=[c[0] for c in SCALE_CASES])
def test_scale_bad_input(thunk, error, match):
    with pytest.raises(error, match=match):
        thunk()


def _mixed_precision_cases():
    from llmbook.training import memory

    return [
        ("half_ulp integer tensor", lambda: memory.half_ulp(torch.tensor(3), torch.float16), TypeError,
         "x must be a floating-point tensor, got dtype torch.int64"),
        ("half_ulp dtype str", lambda: memory.half_ulp(torch.tensor(1.0), "float16"), TypeError,
         "dtype must be a floating-point torch.dtype"),
        ("scaler_trajectory scaler", lambda: memory.scaler_trajectory(None, [1.0]), TypeError,
         "scaler must be a DynamicLossScaler or a torch.amp.GradScaler, got NoneType"),
        ("scaler_trajectory dtype", lambda: memory.scaler_trajectory(memory.DynamicLossScaler(), [1.0], torch.int8),
         TypeError, "dtype must be a floating-point torch.dtype"),
        ("scaler_trajectory gradients", lambda: memory.scaler_trajectory(memory.DynamicLossScaler(), ["a"]),
         TypeError, "gradients must be a list of numbers"),
    ]


MIXED_PRECISION_CASES = _mixed_precision_cases()


@pytest.mark.parametrize(("thunk", "error", "match"), [c[1:] for c in MIXED_PRECISION_CASES],
                         ids=[c[0] for c in MIXED_PRECISION_CASES])
def test_mixed_precision_bad_input(thunk, error, match):
    with pytest.raises(error, match=match):
        thunk()
