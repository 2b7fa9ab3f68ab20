"""Tests for llmbook.alignment.ppo: KL-shaped rewards, whitening, policy and critic, rollout, update.

The rollout and update code runs on a tiny random TransformerLM (V = 40, d = 16, two
layers), so each test takes well under a second; one test runs ``train_ppo`` end to end on
the book's text model with a two-iteration recipe, and one loads the shipped artifacts.
"""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.logprobs import response_logprobs, token_logprobs
from llmbook.alignment.lora import LoRALinear
from llmbook.alignment.losses import gae
from llmbook.alignment.ppo import (
    PPO_RECIPE,
    PPO_SMALL_KL_RECIPE,
    Rollout,
    ValueModel,
    distinct_token_fraction,
    kl_shaped_rewards,
    load_ppo_policy,
    make_policy,
    ppo_update,
    response_logits,
    response_values,
    rollout,
    sampler_logprobs,
    train_ppo,
    whiten,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

V, P, R, NB = 40, 5, 6, 8  # vocabulary, prompt and response lengths, batch: all different
KW = torch.tensor([3, 7, 11])


def reward_fn(_prompts, responses):
    return torch.isin(responses, KW).sum(1).to(torch.float32)


@pytest.fixture(scope="module")
def reference():
    cfg = TransformerConfig.gpt2_style(vocab_size=V, d_model=16, n_layers=2, n_heads=2, max_seq_len=16)
    return TransformerLM(cfg, generator=gen(0)).eval().requires_grad_(False)


def setup(reference, seed=0, lora=True):
    g = gen(seed)
    if lora:
        policy = make_policy(reference, ["q_proj", "v_proj", "fc"], r=2, alpha=4, generator=g)
    else:
        policy = copy.deepcopy(reference).requires_grad_(True)
    critic = ValueModel(copy.deepcopy(reference).requires_grad_(True))
    prompts = torch.randint(0, V, (NB, P), generator=g)
    batch = rollout(policy, reference, critic, prompts, R, reward_fn, g)
    return policy, critic, batch, g


def optimizers(policy, critic, lr=0.01):
    return (torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=lr),
            torch.optim.Adam(critic.parameters(), lr=1e-3))


# ---------------------------------------------------------------- kl_shaped_rewards


def test_kl_shaped_rewards_worked_example():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -4.0]])
    ref = torch.tensor([[-1.5, -2.0, -0.25], [-0.3, -1.2, -3.0]])
    scores = torch.tensor([2.0, -1.0])
    got = kl_shaped_rewards(scores, logp, ref, beta=0.1)
    want = torch.tensor([[-0.05, 0.0, 0.025 + 2.0], [0.0, -0.1, 0.1 - 1.0]])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_kl_shaped_rewards_with_mask_scores_the_last_token_and_zeroes_padding():
    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-2.0, -2.0, 0.0], [-0.5, -1.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = kl_shaped_rewards(torch.tensor([5.0, 1.0]), logp, ref, beta=0.5, mask=mask)
    want = torch.tensor([[-0.5, 5.0, 0.0], [0.0, -0.5, 1.0]])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 7), st.floats(0.01, 2.0), st.integers(0, 10**6))
def test_kl_shaped_rewards_sum_to_score_minus_beta_log_ratio(b, r, beta, seed):
    g = gen(seed)
    logp, ref = torch.randn(b, r, generator=g, dtype=torch.float64), torch.randn(b, r, generator=g, dtype=torch.float64)
    scores = torch.randn(b, generator=g, dtype=torch.float64)
    rewards = kl_shaped_rewards(scores, logp, ref, beta)
    torch.testing.assert_close(rewards.sum(1), scores - beta * (logp - ref).sum(1))
    assert not rewards.requires_grad


@pytest.mark.parametrize("beta", [0, -0.1, float("nan"), float("inf")])
def test_kl_shaped_rewards_rejects_nonpositive_beta(beta):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="beta"):
        kl_shaped_rewards(torch.zeros(2), x, x, beta)


def test_kl_shaped_rewards_rejects_bad_inputs():
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="beta"):
        kl_shaped_rewards(torch.zeros(2), x, x, True)
    with pytest.raises(ValueError, match="one shape"):
        kl_shaped_rewards(torch.zeros(2), x, torch.zeros(2, 4), 0.1)
    with pytest.raises(ValueError, match="scores must have shape"):
        kl_shaped_rewards(torch.zeros(3), x, x, 0.1)
    with pytest.raises(ValueError, match="no response tokens"):
        kl_shaped_rewards(torch.zeros(2), x, x, 0.1, mask=torch.tensor([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="shape"):
        kl_shaped_rewards(torch.zeros(2), x, x, 0.1, mask=torch.ones(3, 2))
    with pytest.raises(TypeError, match="floating"):
        kl_shaped_rewards(torch.zeros(2, dtype=torch.long), x, x, 0.1)


# ---------------------------------------------------------------- whiten


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 5), st.integers(2, 7), st.integers(0, 10**6))
def test_whiten_has_zero_mean_unit_variance_over_the_mask(b, r, seed):
    g = gen(seed)
    x = 3 + 5 * torch.randn(b, r, generator=g, dtype=torch.float64)
    mask = torch.rand(b, r, generator=g) < 0.7
    mask[0, :2] = True  # at least two entries
    w = whiten(x, mask)
    assert float(w[mask].mean()).__abs__() < 1e-12
    assert float((w[mask] ** 2).mean()) == pytest.approx(1.0, abs=1e-6)
    assert bool((w[~mask] == 0).all())
    scaled = whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(scaled[mask] / x[mask], torch.full_like(x[mask], float(scaled[mask][0] / x[mask][0])))


def test_whiten_worked_example_and_errors():
    x = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # mean 3, population std sqrt(8/3)
    torch.testing.assert_close(whiten(x, mask, eps=0.0), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]) * (3 / 8) ** 0.5 * 2)
    assert bool((whiten(torch.ones(2, 2), torch.ones(2, 2)) == 0).all())  # no signal: zeros, not NaN
    with pytest.raises(ValueError, match="0/0"):
        whiten(torch.ones(2, 2), torch.ones(2, 2), eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        whiten(x, mask, eps=-1.0)
    with pytest.raises(ValueError, match="two"):
        whiten(x, torch.tensor([[1, 0], [0, 0]]))
    with pytest.raises(ValueError, match="shape"):
        whiten(x, torch.ones(2, 3))


# ---------------------------------------------------------------- policy, critic, logits


def test_make_policy_starts_equal_to_the_reference_and_leaves_it_alone(reference):
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    policy = make_policy(reference, ["q_proj", "fc"], r=2, alpha=4, generator=gen(1))
    ids = torch.randint(0, V, (3, 9), generator=gen(2))
    with torch.no_grad():
        assert torch.equal(policy(ids), reference(ids))
    assert sum(isinstance(m, LoRALinear) for m in policy.modules()) == 4  # 2 layers x 2 targets
    assert not any(isinstance(m, LoRALinear) for m in reference.modules())
    assert all(torch.equal(before[k], v) for k, v in reference.state_dict().items())
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with pytest.raises(TypeError, match="TransformerLM"):
        make_policy(torch.nn.Linear(2, 2), ["q_proj"], 2, 4)


def test_value_model_starts_at_zero_and_trains_its_trunk(reference):
    critic = ValueModel(copy.deepcopy(reference).requires_grad_(True))
    ids = torch.randint(0, V, (3, 7), generator=gen(3))
    values = critic(ids)
    assert values.shape == (3, 7) and bool((values == 0).all())
    (values - 1.0).pow(2).sum().backward()
    assert critic.head.bias.grad is not None and float(critic.head.bias.grad.abs()) > 0
    critic.head.weight.data.normal_(generator=gen(4))
    critic.zero_grad()
    critic(ids).sum().backward()
    assert float(critic.trunk.blocks[0].attn.q_proj.weight.grad.abs().sum()) > 0
    with pytest.raises(TypeError, match="TransformerLM"):
        ValueModel(torch.nn.Linear(2, 2))


def test_response_logits_and_values_are_shifted_by_one(reference):
    prompts = torch.randint(0, V, (3, P), generator=gen(5))
    responses = torch.randint(0, V, (3, R), generator=gen(6))
    ids = torch.cat([prompts, responses], dim=1)
    with torch.no_grad():
        logits = response_logits(reference, prompts, responses)
        assert logits.shape == (3, R, V)
        torch.testing.assert_close(logits, reference(ids)[:, P - 1:P + R - 1])
        # the peer: llmbook.alignment.logprobs.response_logprobs
        torch.testing.assert_close(token_logprobs(logits, responses),
                                   response_logprobs(reference, prompts, responses))
        critic = ValueModel(copy.deepcopy(reference))
        critic.head.weight.normal_(generator=gen(7))
        values = response_values(critic, prompts, responses)
        torch.testing.assert_close(values, critic(ids)[:, P - 1:P + R - 1])
        # the value of s_t sees y_<t only: changing the last response token changes nothing
        changed = responses.clone()
        changed[:, -1] = (changed[:, -1] + 1) % V
        torch.testing.assert_close(response_values(critic, prompts, changed), values)


def test_response_logits_rejects_bad_inputs(reference):
    prompts = torch.zeros(2, 10, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the model's context max_seq_len=16"):
        response_logits(reference, prompts, torch.zeros(2, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size"):
        response_logits(reference, prompts, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        response_values(reference, prompts.float(), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="2 dimensions"):
        response_logits(reference, prompts[0], torch.zeros(2, dtype=torch.long))


def test_distinct_token_fraction():
    ids = torch.tensor([[4, 4, 4, 4], [1, 2, 3, 4], [1, 2, 1, 2]])
    torch.testing.assert_close(distinct_token_fraction(ids), torch.tensor([0.25, 1.0, 0.5]))
    with pytest.raises(TypeError, match="integer"):
        distinct_token_fraction(ids.float())
    with pytest.raises(ValueError, match="2 dimensions"):
        distinct_token_fraction(ids[0])


# ---------------------------------------------------------------- rollout


def test_rollout_records_what_the_three_models_see(reference):
    policy, critic, batch, _ = setup(reference)
    assert isinstance(batch, Rollout)
    assert batch.prompts.shape == (NB, P) and batch.responses.shape == (NB, R)
    for t in (batch.logprobs, batch.ref_logprobs, batch.values, batch.entropy):
        assert t.shape == (NB, R) and not t.requires_grad
    # LoRA's B = 0 at the start: the policy *is* the reference, so the KL is exactly 0
    assert torch.equal(batch.logprobs, batch.ref_logprobs)
    torch.testing.assert_close(batch.logprobs, response_logprobs(policy, batch.prompts, batch.responses))
    torch.testing.assert_close(batch.scores, reward_fn(None, batch.responses))
    assert bool((batch.values == 0).all())  # the value head starts at zero
    assert bool((batch.entropy > 0).all()) and bool((batch.entropy <= torch.log(torch.tensor(V.__float__()))).all())
    again = rollout(policy, reference, critic, batch.prompts, R, reward_fn, gen(0))
    same = rollout(policy, reference, critic, batch.prompts, R, reward_fn, gen(0))
    assert torch.equal(again.responses, same.responses)


def test_sampler_logprobs_equal_the_teacher_forced_logprobs(reference):
    """The KV-cache decoding path (prefill, then one token at a time) and one teacher-forced
    pass over [x; y] give the same log pi(y_t | x, y_<t): to round-off in float64, to float32
    precision in float32; a pass shifted by one position does not."""
    prompts = torch.randint(0, V, (3, P), generator=gen(11))
    responses = torch.randint(0, V, (3, R + 2), generator=gen(12))  # P + R + 2 = 13 <= 16
    model64 = copy.deepcopy(reference).double()
    got = sampler_logprobs(model64, prompts, responses)
    assert got.shape == (3, R + 2) and got.dtype == torch.float64
    torch.testing.assert_close(got, response_logprobs(model64, prompts, responses), rtol=0, atol=1e-12)
    torch.testing.assert_close(sampler_logprobs(reference, prompts, responses),
                               response_logprobs(reference, prompts, responses), rtol=0, atol=2e-6)
    with torch.no_grad():  # one position off: the bug this check is there to catch
        ids = torch.cat([prompts, responses], dim=1)
        shifted = token_logprobs(model64(ids)[:, P:P + R + 2], responses)
    assert (shifted - got).abs().max() > 0.1


def test_sampler_logprobs_see_the_policy_move_after_an_update(reference):
    policy, critic, batch, g = setup(reference, seed=3)
    torch.testing.assert_close(sampler_logprobs(policy, batch.prompts, batch.responses), batch.logprobs,
                               rtol=0, atol=2e-6)  # ratio 1 before the update
    ppo_update(policy, critic, batch, *optimizers(policy, critic), beta=0.1, minibatch_size=4, generator=g)
    after = sampler_logprobs(policy, batch.prompts, batch.responses)
    assert (after - batch.logprobs).abs().max() > 1e-3
    with torch.no_grad():
        torch.testing.assert_close(after, response_logprobs(policy, batch.prompts, batch.responses),
                                   rtol=0, atol=2e-6)


def test_sampler_logprobs_rejects_bad_inputs(reference):
    prompts, responses = torch.zeros(2, 10, dtype=torch.long), torch.zeros(2, 7, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        sampler_logprobs(reference, prompts, responses)
    with pytest.raises(TypeError, match="TransformerLM"):
        sampler_logprobs(lambda ids: ids, prompts, responses[:, :2])
    with pytest.raises(ValueError, match="batch size"):
        sampler_logprobs(reference, prompts, responses[:1, :2])
    with pytest.raises(TypeError, match="integer"):
        sampler_logprobs(reference, prompts.float(), responses[:, :2])


def test_rollout_rejects_bad_inputs(reference):
    policy, critic, batch, g = setup(reference)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        rollout(policy, reference, critic, torch.zeros(2, 12, dtype=torch.long), 5, reward_fn, g)
    with pytest.raises(ValueError, match="one score per prompt"):
        rollout(policy, reference, critic, batch.prompts, R, lambda p, y: torch.zeros(3), g)
    with pytest.raises(TypeError, match="callable"):
        rollout(policy, reference, critic, batch.prompts, R, "reward", g)
    with pytest.raises(ValueError, match="response_tokens"):
        rollout(policy, reference, critic, batch.prompts, 0, reward_fn, g)


# ---------------------------------------------------------------- the PPO update


def surrogate(policy, batch, beta=0.1):
    """mean_t rho_t A_t with the rollout's whitened GAE advantages (what the update maximises)."""
    rewards = kl_shaped_rewards(batch.scores, batch.logprobs, batch.ref_logprobs, beta)
    adv, _ = gae(rewards, batch.values, 1.0, 0.95)
    adv = whiten(adv, torch.ones_like(adv))
    with torch.no_grad():
        lp = token_logprobs(response_logits(policy, batch.prompts, batch.responses), batch.responses)
    return float(((lp - batch.logprobs).exp() * adv).mean()), lp


def test_one_ppo_update_increases_the_surrogate_objective(reference):
    policy, critic, batch, g = setup(reference, lora=False)
    before, _ = surrogate(policy, batch)
    assert before == pytest.approx(0.0, abs=1e-6)  # rho = 1 and whitened advantages have mean 0
    po, co = optimizers(policy, critic, lr=1e-3)
    stats = ppo_update(policy, critic, batch, po, co, beta=0.1, epochs=1, minibatch_size=NB, generator=g)
    after, _ = surrogate(policy, batch)
    assert after > before + 1e-3
    assert stats["ratio_min"] == pytest.approx(1.0) == stats["ratio_max"]  # one step: ratio 1 when seen
    assert stats["clip_fraction"] == 0.0


def test_ppo_update_trains_the_critic_and_reports_its_statistics(reference):
    policy, critic, batch, g = setup(reference)
    rewards = kl_shaped_rewards(batch.scores, batch.logprobs, batch.ref_logprobs, 0.1)
    _, returns = gae(rewards, batch.values, 1.0, 0.95)
    with torch.no_grad():
        loss_before = float(((response_values(critic, batch.prompts, batch.responses) - returns) ** 2).mean())
    po, co = optimizers(policy, critic)
    stats = ppo_update(policy, critic, batch, po, co, beta=0.1, epochs=3, minibatch_size=4, generator=g)
    with torch.no_grad():
        loss_after = float(((response_values(critic, batch.prompts, batch.responses) - returns) ** 2).mean())
    assert loss_after < loss_before
    assert set(stats) == {"policy_loss", "value_loss", "clip_fraction", "approx_kl", "ratio_min", "ratio_max"}
    assert 0 <= stats["clip_fraction"] <= 1 and stats["approx_kl"] >= 0
    assert stats["ratio_min"] <= 1.0 <= stats["ratio_max"]  # the first minibatch sees rho = 1


def test_clipping_keeps_the_ratio_bounded_where_the_plain_surrogate_runs_away(reference):
    """Thirty epochs on one rollout with a large step: the clipped objective stops pushing a
    token once its ratio leaves [1 - eps, 1 + eps] in the favoured direction; the unclipped
    surrogate -mean(rho A) keeps pushing, and its ratios run off by orders of magnitude."""
    spread = {}
    for clip in (0.2, None):
        policy, critic, batch, g = setup(reference, lora=False)
        po, co = optimizers(policy, critic, lr=0.01)
        ppo_update(policy, critic, batch, po, co, beta=0.1, clip_eps=clip, epochs=30, minibatch_size=4,
                   max_grad_norm=None, generator=g)
        _, lp = surrogate(policy, batch)
        spread[clip] = float((lp - batch.logprobs).abs().max())
    assert spread[0.2] < 2.0  # |log rho| < 2: rho within [0.14, 7.4]
    assert spread[None] > 4.0  # rho beyond e^4 = 55 or below 1/55
    assert spread[None] > 2 * spread[0.2]


def test_ppo_update_is_deterministic_given_the_generator(reference):
    states = []
    for _ in range(2):
        policy, critic, batch, _ = setup(reference, seed=3)
        po, co = optimizers(policy, critic)
        ppo_update(policy, critic, batch, po, co, beta=0.1, generator=gen(9), minibatch_size=4)
        states.append([p.detach().clone() for p in policy.parameters() if p.requires_grad])
    assert all(torch.equal(a, b) for a, b in zip(*states, strict=True))


def test_ppo_update_rejects_bad_inputs_before_changing_anything(reference):
    policy, critic, batch, g = setup(reference)
    po, co = optimizers(policy, critic)
    before = [p.detach().clone() for p in policy.parameters()]
    with pytest.raises(ValueError, match="beta"):
        ppo_update(policy, critic, batch, po, co, beta=0.0)
    with pytest.raises(ValueError, match="beta"):
        ppo_update(policy, critic, batch, po, co, beta=-1.0)
    with pytest.raises(ValueError, match="minibatch_size"):
        ppo_update(policy, critic, batch, po, co, beta=0.1, minibatch_size=NB + 1)
    with pytest.raises(ValueError, match="epochs"):
        ppo_update(policy, critic, batch, po, co, beta=0.1, epochs=0)
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_update(policy, critic, batch, po, co, beta=0.1, clip_eps=1.5, minibatch_size=4)
    with pytest.raises(TypeError, match="Rollout"):
        ppo_update(policy, critic, tuple(batch), po, co, beta=0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


# ---------------------------------------------------------------- the book's runs


def test_train_ppo_end_to_end_reproduces_the_start_of_the_shipped_run():
    """The shipped recipe cut to two iterations (and 4 evaluation prompts): the first two
    iterations are those of the shipped run, since the prompt order and every sample are
    drawn from one seeded generator."""
    recipe = {**PPO_RECIPE, "iterations": 2, "eval_prompts": 4}
    tensors, info = train_ppo(recipe)
    assert tensors and all(k.endswith((".lora_A", ".lora_B")) for k in tensors)
    assert len(tensors) == 2 * 6 * 4  # A and B, six targets, four blocks
    h = info["history"]
    assert {"reward_mean", "kl_mean", "entropy"} <= set(h) and all(len(v) == 2 for v in h.values())
    assert h["kl_mean"][0] == 0.0  # the first rollout comes from the reference itself
    assert h["kl_mean"][1] != 0.0  # the policy moved
    _, shipped = load_ppo_policy("ppo")
    for key in ("reward_mean", "kl_mean", "entropy"):
        assert h[key] == pytest.approx(shipped["history"][key][:2], rel=1e-3, abs=1e-4)
    final = info["final"]
    assert {"reward", "kl", "kl_stderr", "num", "distinct_fraction", "ref_logprob_per_token"} <= set(final)
    assert final["num"] == 4 and final["base"]["kl"] == 0.0
    c = info["compute"]
    assert c["generated_tokens"] == 2 * 32 * 24
    assert c["policy_backward_tokens"] == 2 * 32 * 32 * 2  # iterations x batch x (8 + 24) x epochs
    assert c["forward_tokens"] == c["policy_forward_tokens"] + c["reference_forward_tokens"] + c["critic_forward_tokens"]
    assert c["wall_seconds"] > 0


def test_recipes_differ_only_in_beta():
    assert {k for k in PPO_RECIPE if PPO_RECIPE[k] != PPO_SMALL_KL_RECIPE[k]} == {"beta"}
    assert PPO_SMALL_KL_RECIPE["beta"] * 10 <= PPO_RECIPE["beta"]


def test_load_ppo_policy_loads_the_shipped_runs():
    policy, info = load_ppo_policy("ppo")
    small, small_info = load_ppo_policy("ppo_small_kl")
    for inf in (info, small_info):
        assert set(inf["history"]) >= {"reward_mean", "kl_mean", "entropy"}
        assert all(len(v) == inf["recipe"]["iterations"] for v in inf["history"].values())
        assert {"reward", "kl", "kl_stderr"} <= set(inf["final"]) and "wall_seconds" in inf["compute"]
    assert not any(p.requires_grad for p in policy.parameters()) and not policy.training
    # both runs raise the reward above the base model's; the small-KL run goes much further
    assert info["final"]["reward"] > info["final"]["base"]["reward"] + 1
    assert small_info["final"]["reward"] > info["final"]["reward"]
    assert small_info["final"]["kl"] > 5 * info["final"]["kl"]
    ids = torch.tensor([info["tokenizer"].encode("Return the value of the key.")])
    from llmbook.training.pretrained import book_model

    base, _ = book_model("text")
    with torch.no_grad():
        assert not torch.allclose(policy(ids), base(ids), atol=1e-3)
    with pytest.raises(ValueError, match="name"):
        load_ppo_policy("dpo")
