"""Tests for llmbook.alignment.losses: reward-model, DPO/IPO, policy-gradient, GAE, PPO, GRPO, KL.

Each loss is checked by worked examples with numbers computed by hand, by properties
(hypothesis), by float64 ``torch.autograd.gradcheck`` and, where trl 1.16.0 computes the
same quantity, by a peer test against trl on the same float64 tensors.

How trl is reached. trl's losses live inside trainer methods that normally run a model on
a tokenised dataset. The peer tests build the trainer with ``object.__new__`` (skipping
``__init__``), set only the attributes the method reads, and hand it a stub model that
returns fixed tensors, so trl's own code computes the loss from our inputs:

* ``trl.RewardTrainer.compute_loss`` (Bradley-Terry, with and without margin and centring);
* ``trl.DPOTrainer._compute_loss`` with ``loss_type=["sigmoid"]`` and ``["ipo"]``;
* ``trl.GRPOTrainer._compute_loss`` with ``loss_type`` "grpo", "bnpo" and "dr_grpo" (also
  the PPO clipped policy loss: "bnpo" with beta = 0 and per-token advantages is PPO's
  token-mean clipped surrogate);
* ``trl.GRPOTrainer._generate_and_score_completions`` for the group-normalised advantages,
  with stubbed generation and reward functions.

GAE and the value loss. trl 1.16.0 ships no PPO trainer (it was removed from trl, with its
``masked_whiten`` helper, its value-function loss and its GAE loop), so :func:`gae` and
:func:`ppo_value_loss` are checked against torchrl 0.14.1 instead, on the same rollouts:

* ``torchrl.objectives.value.functional.generalized_advantage_estimate`` (advantages and
  value targets), with episodes that end inside the batch: ragged rows, a row that packs
  two episodes around a masked position, and the same episodes laid end to end as one
  stream with ``done`` flags where torchrl's recursion must stop;
* ``torchrl.objectives.ClipPPOLoss.loss_critic`` with ``clip_value``, ``loss_critic_type="l2"``
  and ``critic_coeff=0.5`` (value and gradient), on the unmasked entries.

Besides, hand computations and an independent closed form (A = sum_l (gamma lam)^l
delta_{t+l} as a matrix product).

KL estimators. :func:`kl_estimator_variances` is checked against SymPy's exact moments
(:func:`llmbook.alignment.policy_gradient.kl_estimator_moments`) and
:func:`kl_estimator_loss_gradients` against autograd of ``torch.distributions``' KL in
both directions, against a SymPy derivation, and against Monte Carlo averages of
per-sample gradients.
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.logprobs import reduce_tokens
from llmbook.alignment.losses import (
    GRPOLossOutput,
    KLEstimates,
    bradley_terry_loss,
    dpo_loss,
    gae,
    group_normalized_rewards,
    grpo_loss,
    kl_estimator_loss_gradients,
    kl_estimator_variances,
    kl_estimators,
    policy_gradient_loss,
    ppo_policy_loss,
    ppo_value_loss,
)
from llmbook.alignment.trl_peer import EvalModel as _EvalModel
from llmbook.alignment.trl_peer import bare_trainer as _bare

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
B, T = 3, 5  # batch and response length, different so a transposed axis cannot hide


def randn(*shape, seed=0, scale=1.0):
    return scale * torch.randn(shape, generator=gen(seed), dtype=D)


def ragged_mask(lengths, width):
    """(len(lengths), width) 0/1 long mask with the first lengths[b] positions on."""
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ---------------------------------------------------------------- trl stubs




# ---------------------------------------------------------------- Bradley-Terry (chapter 17)


def test_bradley_terry_worked_example():
    rc = torch.tensor([2.0, 0.5], dtype=D)
    rr = torch.tensor([1.0, 1.5], dtype=D)
    # differences +1 and -1: -log sigma(1) = log(1 + e^-1), -log sigma(-1) = log(1 + e)
    expected = (math.log1p(math.exp(-1)) + math.log1p(math.e)) / 2
    assert bradley_terry_loss(rc, rr).item() == pytest.approx(expected, abs=1e-15)
    # a margin of 1 turns the differences into 0 and -2
    expected_m = (math.log(2) + math.log1p(math.exp(2))) / 2
    assert bradley_terry_loss(rc, rr, margin=1.0).item() == pytest.approx(expected_m, abs=1e-15)
    # centring adds c * mean((rc + rr)^2) = 0.1 * (9 + 4) / 2
    assert bradley_terry_loss(rc, rr, center_coefficient=0.1).item() == \
        pytest.approx(expected + 0.65, abs=1e-15)
    # one pair as 0-d tensors; equal rewards give log 2
    assert bradley_terry_loss(torch.tensor(0.3, dtype=D), torch.tensor(0.3, dtype=D)).item() == \
        pytest.approx(math.log(2), abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.floats(-5, 5), st.floats(-5, 5), st.floats(0.01, 3))
def test_bradley_terry_decreases_as_the_chosen_reward_grows(rc, rr, step):
    rc_t, rr_t = torch.tensor([rc], dtype=D), torch.tensor([rr], dtype=D)
    assert bradley_terry_loss(rc_t + step, rr_t) < bradley_terry_loss(rc_t, rr_t)
    assert bradley_terry_loss(rc_t, rr_t) > 0


def test_bradley_terry_gradcheck():
    rc = randn(4, seed=1).requires_grad_()
    rr = randn(4, seed=2).requires_grad_()
    margin = randn(4, seed=3).abs()
    assert torch.autograd.gradcheck(lambda a, b: bradley_terry_loss(a, b, margin, 0.05), (rc, rr))


def test_bradley_terry_bad_inputs():
    with pytest.raises(ValueError, match="r_rejected"):
        bradley_terry_loss(torch.zeros(3, dtype=D), torch.zeros(4, dtype=D))
    with pytest.raises(ValueError, match="r_chosen"):
        bradley_terry_loss(torch.zeros(2, 3, dtype=D), torch.zeros(2, 3, dtype=D))
    with pytest.raises(TypeError, match="r_chosen"):
        bradley_terry_loss(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=D))
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(torch.zeros(3, dtype=D), torch.zeros(3, dtype=D), torch.zeros(2, dtype=D))
    with pytest.raises(ValueError, match="center_coefficient"):
        bradley_terry_loss(torch.zeros(3, dtype=D), torch.zeros(3, dtype=D), center_coefficient=-1)


@pytest.mark.parametrize("with_margin", [False, True])
@pytest.mark.parametrize("center", [None, 0.01])
def test_bradley_terry_matches_trl(trl, with_margin, center):
    """Peer: ``trl.RewardTrainer.compute_loss`` (-logsigmoid(r_c - r_r [- margin]).mean()
    [+ center_rewards_coefficient * mean((r_c + r_r)^2)]), on a stub reward model."""
    n = 6
    rc, rr, margin = randn(n, seed=4), randn(n, seed=5), randn(n, seed=6).abs()
    model = _EvalModel(SimpleNamespace(logits=torch.cat([rc, rr])[:, None]))  # (2n, 1)
    trainer = _bare(trl.RewardTrainer, model=model,
                    args=SimpleNamespace(center_rewards_coefficient=center),
                    _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * n, 4, dtype=torch.long),
              "attention_mask": torch.ones(2 * n, 4, dtype=torch.long)}
    if with_margin:
        inputs["margin"] = margin
    theirs = trainer.compute_loss(model, inputs)
    ours = bradley_terry_loss(rc, rr, margin if with_margin else None, center or 0.0)
    assert abs(theirs - ours).item() < 1e-12


# ---------------------------------------------------------------- DPO and IPO (chapter 19)


def test_dpo_sigmoid_worked_example():
    # chosen log-ratio -5 - (-6) = 1, rejected -7 - (-6) = -1: margin h = 2, beta h = 0.2
    pc, pr, rc, rr = (torch.tensor(v, dtype=D) for v in (-5.0, -7.0, -6.0, -6.0))
    loss, chosen_r, rejected_r = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert loss.item() == pytest.approx(-math.log(sigmoid(0.2)), abs=1e-15)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-15)
    assert (chosen_r.item(), rejected_r.item()) == pytest.approx((0.1, -0.1), abs=1e-15)
    assert chosen_r.shape == () and not chosen_r.requires_grad
    # conservative DPO: -(1 - eps) log sigma(0.2) - eps log sigma(-0.2)
    smoothed, _, _ = dpo_loss(pc, pr, rc, rr, beta=0.1, label_smoothing=0.2)
    expected = -0.8 * math.log(sigmoid(0.2)) - 0.2 * math.log(sigmoid(-0.2))
    assert smoothed.item() == pytest.approx(expected, abs=1e-15)


def test_dpo_batched_is_the_mean_of_pairs():
    pc, pr, rc, rr = (randn(B, seed=s, scale=3) - 20 for s in range(4))  # log-probs are <= 0
    loss, cr, rj = dpo_loss(pc, pr, rc, rr, beta=0.5)
    per_pair, _, _ = dpo_loss(pc, pr, rc, rr, beta=0.5, reduction="none")
    assert per_pair.shape == (B,) and cr.shape == (B,) and rj.shape == (B,)
    singles = [dpo_loss(pc[i], pr[i], rc[i], rr[i], beta=0.5)[0] for i in range(B)]
    torch.testing.assert_close(per_pair, torch.stack(singles), rtol=0, atol=1e-15)
    torch.testing.assert_close(loss, per_pair.mean(), rtol=0, atol=1e-15)
    torch.testing.assert_close(cr, 0.5 * (pc - rc), rtol=0, atol=1e-15)


def test_ipo_worked_example():
    # log-ratios 6 (over 3 tokens) and -2 (over 4 tokens): h' = 2 - (-0.5) = 2.5; beta = 0.25
    pc, pr, rc, rr = (torch.tensor([v], dtype=D) for v in (-10.0, -14.0, -16.0, -12.0))
    loss, chosen_r, _ = dpo_loss(pc, pr, rc, rr, beta=0.25, loss_type="ipo",
                                 chosen_lengths=torch.tensor([3]), rejected_lengths=torch.tensor([4]))
    assert loss.item() == pytest.approx((2.5 - 1 / (2 * 0.25)) ** 2, abs=1e-15)  # 0.25
    assert chosen_r.item() == pytest.approx(0.25 * 6, abs=1e-15)  # rewards are not averaged
    # without lengths the log-ratios are used as they are: h = 8
    loss_raw, _, _ = dpo_loss(pc, pr, rc, rr, beta=0.25, loss_type="ipo")
    assert loss_raw.item() == pytest.approx((8 - 2) ** 2, abs=1e-13)


def test_dpo_gradient_by_hand():
    """dL/dh = -beta sigma(-beta h) for L = -log sigma(beta h), h = (pc - rc) - (pr - rr)."""
    beta = 0.7
    pc, pr, rc, rr = ((randn(B, seed=s, scale=3) - 20).requires_grad_() for s in (10, 11, 12, 13))
    loss, _, _ = dpo_loss(pc, pr, rc, rr, beta)
    loss.backward()
    h = ((pc - rc) - (pr - rr)).detach()
    dl_dh = -beta * torch.sigmoid(-beta * h) / B  # the mean over the B pairs
    torch.testing.assert_close(pc.grad, dl_dh, rtol=0, atol=1e-15)
    torch.testing.assert_close(pr.grad, -dl_dh, rtol=0, atol=1e-15)
    torch.testing.assert_close(rc.grad, -dl_dh, rtol=0, atol=1e-15)
    torch.testing.assert_close(rr.grad, dl_dh, rtol=0, atol=1e-15)
    # the gradient vanishes for a pair ranked right by a wide margin (h = 60) and tends to
    # -beta for one ranked wrong by as much (h = -60): sigma(-42) = 5.7e-19, sigma(42) = 1 - 5.7e-19
    far = torch.tensor([-1.0, -61.0], dtype=D, requires_grad=True)
    dpo_loss(far, torch.tensor([-61.0, -1.0], dtype=D), torch.full((2,), -1.0, dtype=D),
             torch.full((2,), -1.0, dtype=D), beta)[0].backward()
    assert abs(far.grad[0].item()) < 1e-18
    assert far.grad[1].item() == pytest.approx(-beta / 2, abs=1e-15)


@pytest.mark.parametrize("loss_type,eps", [("sigmoid", 0.0), ("sigmoid", 0.1), ("ipo", 0.0)])
def test_dpo_gradcheck(loss_type, eps):
    inputs = tuple((randn(B, seed=20 + s, scale=2) - 20).requires_grad_() for s in range(4))
    lengths = {} if loss_type == "sigmoid" else {"chosen_lengths": torch.tensor([3, 1, 5]),
                                                 "rejected_lengths": torch.tensor([2, 4, 6])}

    def f(*x):
        return dpo_loss(*x, beta=0.3, loss_type=loss_type, label_smoothing=eps, **lengths)[0]

    assert torch.autograd.gradcheck(f, inputs)


@settings(max_examples=40, deadline=None)
@given(st.floats(-20, 20), st.floats(0.01, 5), st.floats(0.05, 2.0), st.floats(0, 0.45))
def test_dpo_loss_decreases_as_the_margin_grows(margin, step, beta, eps):
    def loss_at(h, smoothing=0.0):
        pc = torch.tensor([h - 100], dtype=D)  # log-probs are <= 0; DPO sees differences only
        base = torch.full((1,), -100.0, dtype=D)
        return dpo_loss(pc, base, base, base, beta, label_smoothing=smoothing)[0].item()

    assert loss_at(margin + step) < loss_at(margin)
    assert loss_at(margin) > 0
    # sigma(0) = 1/2: log 2 at a zero margin, whatever the label smoothing
    assert loss_at(0.0, eps) == pytest.approx(math.log(2), abs=1e-12)
    # with smoothing eps the loss is smallest at beta h = log((1 - eps) / eps), not at infinity
    if eps > 0.01:
        best = math.log((1 - eps) / eps) / beta
        assert loss_at(best, eps) <= min(loss_at(best + step, eps), loss_at(best - step, eps))


def test_dpo_bad_inputs():
    x = torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(x, x, x, x, beta=0.0)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(x, x, x, x, beta=-1.0)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="hinge")
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        dpo_loss(x, x, x, torch.zeros(4, dtype=D), beta=0.1)
    with pytest.raises(ValueError, match="policy_chosen_logps"):
        dpo_loss(*(torch.zeros(2, 3, dtype=D),) * 4, beta=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(x, x, x, x, beta=0.1, label_smoothing=0.5)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="ipo"):
        dpo_loss(x, x, x, x, beta=0.1, chosen_lengths=torch.ones(3), rejected_lengths=torch.ones(3))
    with pytest.raises(ValueError, match="chosen_lengths"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="ipo", chosen_lengths=torch.tensor([1, 0, 2]),
                 rejected_lengths=torch.ones(3))
    with pytest.raises(ValueError, match="both"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="ipo", chosen_lengths=torch.ones(3))
    with pytest.raises(ValueError, match="reduction"):
        dpo_loss(x, x, x, x, beta=0.1, reduction="token_sum")


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_matches_trl(trl, loss_type):
    """Peer: ``trl.DPOTrainer._compute_loss`` with ``loss_types=[loss_type]``, precomputed
    reference log-probs and a stub model whose ``log_probs`` (per token, 0 off the
    completion) trl sums into sequence log-probabilities (and, for IPO, divides by the
    completion lengths ``completion_mask.sum(1)``). Also compares the logged mean rewards."""
    n, width, beta = 3, 8, 0.3
    lengths = [2, 6, 3, 5, 1, 7]  # completion tokens of the 3 chosen, then the 3 rejected
    completion_mask = torch.zeros(2 * n, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        completion_mask[i, width - length:] = 1  # the completion follows the prompt
    token_logps = -3 * torch.rand(2 * n, width - 1, generator=gen(30), dtype=D)
    token_logps = token_logps * completion_mask[:, 1:]  # trl's labels are -100 off the completion
    ref = randn(2 * n, seed=31, scale=4) - 8
    zeros = torch.zeros(2 * n, width - 1, dtype=D)
    output = SimpleNamespace(log_probs=token_logps, entropy=zeros, mean_logits=zeros,
                             is_top1=zeros.bool())
    trainer = _bare(trl.DPOTrainer, model=_EvalModel(output), aux_loss_enabled=False,
                    ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
                    loss_types=[loss_type], loss_weights=[1.0], beta=beta, label_smoothing=0.0,
                    use_weighting=False, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * n, width, dtype=torch.long),
              "attention_mask": torch.ones(2 * n, width, dtype=torch.long),
              "completion_mask": completion_mask,
              "ref_chosen_logps": ref[:n], "ref_rejected_logps": ref[n:]}
    theirs = trainer._compute_loss(trainer.model, inputs, return_outputs=False)

    seq = token_logps.sum(dim=1)
    counts = completion_mask.sum(dim=1)
    extra = {} if loss_type == "sigmoid" else {"chosen_lengths": counts[:n],
                                               "rejected_lengths": counts[n:]}
    ours, chosen_r, rejected_r = dpo_loss(seq[:n], seq[n:], ref[:n], ref[n:], beta,
                                          loss_type=loss_type, **extra)
    assert abs(theirs - ours).item() < 1e-12
    logged = trainer._metrics["eval"]
    assert logged["rewards/chosen"][0] == pytest.approx(chosen_r.mean().item(), abs=1e-12)
    assert logged["rewards/rejected"][0] == pytest.approx(rejected_r.mean().item(), abs=1e-12)


# ---------------------------------------------------------------- policy gradient (chapter 18)


def test_policy_gradient_worked_example():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=D, requires_grad=True)
    rewards = torch.tensor([1.0, 0.0, 2.0], dtype=D)
    loss = policy_gradient_loss(logp, rewards, baseline=1.0)
    # -(0 * -1 + (-1) * -2 + 1 * -0.5) / 3 = -(2 - 0.5) / 3
    assert loss.item() == pytest.approx(-0.5, abs=1e-15)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 1.0, -1.0], dtype=D) / 3)
    # per-token log-probabilities with a mask sum to the same sequence log-probabilities
    tokens = torch.tensor([[-0.4, -0.6, 9.0], [-2.0, 7.0, 7.0], [-0.25, -0.25, 5.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]])
    per_token = policy_gradient_loss(tokens, rewards, torch.tensor(1.0, dtype=D), mask=mask)
    assert per_token.item() == pytest.approx(-0.5, abs=1e-15)


def test_policy_gradient_baseline_leaves_the_expected_gradient_unchanged():
    """E_{a ~ pi}[(R_a - b) grad log pi_a] = E[R_a grad log pi_a] for a constant b, exactly."""
    theta = randn(4, seed=40).requires_grad_()
    rewards = randn(4, seed=41)

    def expected_gradient(baseline):
        logp = torch.log_softmax(theta, dim=0)
        probs = logp.exp().detach()
        total = sum(probs[a] * policy_gradient_loss(logp[a:a + 1], rewards[a:a + 1], baseline)
                    for a in range(4))
        return torch.autograd.grad(total, theta)[0]

    g0 = expected_gradient(None)
    torch.testing.assert_close(expected_gradient(3.7), g0, rtol=0, atol=1e-14)
    torch.testing.assert_close(expected_gradient(-1.2), g0, rtol=0, atol=1e-14)
    assert g0.abs().max() > 1e-3


def test_policy_gradient_bad_inputs():
    x = torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="rewards"):
        policy_gradient_loss(x, torch.zeros(4, dtype=D))
    with pytest.raises(ValueError, match="mask"):
        policy_gradient_loss(torch.zeros(3, 4, dtype=D), x)
    with pytest.raises(ValueError, match="mask"):
        policy_gradient_loss(x, x, mask=torch.ones(3))
    with pytest.raises(ValueError, match="baseline"):
        policy_gradient_loss(x, x, baseline=torch.zeros(2, dtype=D))


# ---------------------------------------------------------------- GAE


def test_gae_worked_example():
    rewards = torch.tensor([0.0, 0.0, 1.0], dtype=D)
    values = torch.tensor([0.5, 0.25, 0.75], dtype=D)
    gamma, lam = 0.9, 0.5
    # delta = r_t + gamma V_{t+1} - V_t, with V_3 = 0
    d2 = 1.0 - 0.75  # 0.25
    d1 = 0.0 + 0.9 * 0.75 - 0.25  # 0.425
    d0 = 0.0 + 0.9 * 0.25 - 0.5  # -0.275
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    adv, ret = gae(rewards, values, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor([a0, a1, a2], dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(ret, adv + values, rtol=0, atol=1e-15)


def test_gae_lambda_zero_is_td_error_and_lambda_one_is_return_minus_value():
    rewards, values, gamma = randn(B, T, seed=50), randn(B, T, seed=51), 0.8
    next_values = torch.cat([values[:, 1:], torch.zeros(B, 1, dtype=D)], dim=1)
    td = rewards + gamma * next_values - values
    adv0, ret0 = gae(rewards, values, gamma, 0.0)
    torch.testing.assert_close(adv0, td, rtol=0, atol=1e-14)
    torch.testing.assert_close(ret0, rewards + gamma * next_values, rtol=0, atol=1e-14)
    discounted = torch.zeros_like(rewards)  # G_t = sum_l gamma^l r_{t+l}
    running = torch.zeros(B, dtype=D)
    for t in reversed(range(T)):
        running = rewards[:, t] + gamma * running
        discounted[:, t] = running
    adv1, ret1 = gae(rewards, values, gamma, 1.0)
    torch.testing.assert_close(adv1, discounted - values, rtol=0, atol=1e-14)
    torch.testing.assert_close(ret1, discounted, rtol=0, atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(1, 7), st.integers(0, 10**6))
def test_gae_equals_the_closed_form(gamma, lam, length, seed):
    """A_t = sum_{l >= 0} (gamma lam)^l delta_{t+l}: an upper-triangular matrix times delta."""
    rewards, values = randn(2, length, seed=seed), randn(2, length, seed=seed + 1)
    next_values = torch.cat([values[:, 1:], torch.zeros(2, 1, dtype=D)], dim=1)
    delta = rewards + gamma * next_values - values
    offsets = torch.arange(length)[None, :] - torch.arange(length)[:, None]  # l = s - t
    weights = torch.where(offsets >= 0, (gamma * lam) ** offsets.clamp(min=0).to(D),
                          torch.zeros((), dtype=D))
    adv, _ = gae(rewards, values, gamma, lam)
    torch.testing.assert_close(adv, delta @ weights.T, rtol=0, atol=1e-12)


def test_gae_batch_rows_and_mask():
    rewards, values = randn(B, T, seed=60), randn(B, T, seed=61)
    adv, ret = gae(rewards, values, 0.95, 0.9)
    for b in range(B):  # a batch is its rows, one at a time
        a_b, r_b = gae(rewards[b], values[b], 0.95, 0.9)
        torch.testing.assert_close(adv[b], a_b, rtol=0, atol=1e-15)
        torch.testing.assert_close(ret[b], r_b, rtol=0, atol=1e-15)
    lengths = [5, 2, 3]
    mask = ragged_mask(lengths, T)
    adv_m, ret_m = gae(rewards, values, 0.95, 0.9, mask=mask)
    for b, n in enumerate(lengths):  # a right-padded row is its unpadded prefix, then zeros
        a_b, r_b = gae(rewards[b, :n], values[b, :n], 0.95, 0.9)
        torch.testing.assert_close(adv_m[b, :n], a_b, rtol=0, atol=1e-15)
        torch.testing.assert_close(ret_m[b, :n], r_b, rtol=0, atol=1e-15)
        assert (adv_m[b, n:] == 0).all() and (ret_m[b, n:] == 0).all()


def test_gae_gradcheck_and_bad_inputs():
    r, v = randn(2, 4, seed=62).requires_grad_(), randn(2, 4, seed=63).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: gae(a, b, 0.9, 0.7), (r, v))
    with pytest.raises(ValueError, match="gamma"):
        gae(r, v, 1.5, 0.9)
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, 0.9, -0.1)
    with pytest.raises(ValueError, match="values"):
        gae(r, v[:, :3], 0.9, 0.9)
    with pytest.raises(ValueError, match="mask"):
        gae(r, v, 0.9, 0.9, mask=torch.ones(2, 3))


# ---------------------------------------------------------------- GAE against torchrl


@pytest.fixture(scope="module")
def torchrl_gae():
    """torchrl's functional GAE (imported once: slow)."""
    functional = pytest.importorskip("torchrl.objectives.value.functional")
    return functional.generalized_advantage_estimate


def _torchrl_gae(fn, rewards, values, dones, gamma, lam):
    """torchrl's GAE on (B, L) rows: V(s_{t+1}) is the next entry, 0 after the last; done
    (and terminated) where an episode ends, so that neither the next value nor the
    recursion crosses it. Returns (advantages, value targets), (B, L)."""
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    done = dones[..., None].bool()
    # gamma and lam as float64 tensors: torchrl multiplies gamma by an integer tensor, which
    # would round a Python float to float32 (an error of ~1e-8 in the advantages)
    gamma, lam = torch.tensor(gamma, dtype=values.dtype), torch.tensor(lam, dtype=values.dtype)
    adv, target = fn(gamma, lam, values[..., None], next_values[..., None], rewards[..., None],
                     done, done.clone(), time_dim=-2)
    return adv[..., 0], target[..., 0]


def _episode_ends(mask):
    """True at the last unmasked position of each run of ones in a (B, L) 0/1 mask."""
    m = mask.bool()
    after = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)
    return m & ~after


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.0), (0.99, 1.0), (0.8, 0.6)])
def test_gae_matches_torchrl_with_episodes_ending_inside_the_batch(torchrl_gae, gamma, lam):
    rewards, values = randn(4, 9, seed=64), randn(4, 9, seed=65)
    # rows: the full width; right padding; a single token; two episodes (3 and 4 tokens)
    # packed in one row around a masked position
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] + [0] * 8, [1, 1, 1, 0, 1, 1, 1, 1, 0]])
    adv, ret = gae(rewards, values, gamma, lam, mask=mask)
    # torchrl sees every position, with done at the end of each episode and at each padding
    # position (a one-step episode of its own, compared nowhere)
    dones = _episode_ends(mask) | (mask == 0)
    want_adv, want_ret = _torchrl_gae(torchrl_gae, rewards, values, dones, gamma, lam)
    on = mask.bool()
    torch.testing.assert_close(adv[on], want_adv[on], rtol=0, atol=1e-13)
    torch.testing.assert_close(ret[on], want_ret[on], rtol=0, atol=1e-13)
    assert (adv[~on] == 0).all() and (ret[~on] == 0).all()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.floats(0, 1), st.floats(0, 1),
       st.integers(0, 10**6))
def test_gae_batch_equals_torchrl_on_one_stream_of_episodes(torchrl_gae, lengths, gamma, lam, seed):
    """The episodes of a right-padded (B, T) batch, laid end to end as one stream of
    sum(lengths) steps with done flags at each episode's end (torchrl's layout for a
    collector's batch): the same advantages and value targets, position by position."""
    width = max(lengths) + 1  # a padded column even in the longest row
    rewards, values = randn(len(lengths), width, seed=seed), randn(len(lengths), width, seed=seed + 1)
    mask = ragged_mask(lengths, width)
    adv, ret = gae(rewards, values, gamma, lam, mask=mask)
    on = mask.bool()  # row-major: episode after episode
    stream_dones = _episode_ends(mask)[on][None]  # (1, sum(lengths))
    want_adv, want_ret = _torchrl_gae(torchrl_gae, rewards[on][None], values[on][None],
                                      stream_dones, gamma, lam)
    torch.testing.assert_close(adv[on], want_adv[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(ret[on], want_ret[0], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- PPO


def test_ppo_policy_loss_worked_example():
    old = torch.zeros(1, 4, dtype=D)
    # ratios 1.5, 0.5, 1.1, 0.7 with advantages +1, -2, +1, +3; eps = 0.2
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]], dtype=D))
    adv = torch.tensor([[1.0, -2.0, 1.0, 3.0]], dtype=D)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, clip_fraction = ppo_policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    # per token max(-r A, -clip(r) A): max(-1.5, -1.2) = -1.2; max(1.0, 1.6) = 1.6;
    # max(-1.1, -1.1) = -1.1; max(-2.1, -2.4) = -2.1 (clip(0.7) = 0.8 but the min keeps 0.7)
    assert loss.item() == pytest.approx((-1.2 + 1.6 - 1.1 - 2.1) / 4, abs=1e-14)
    assert clip_fraction.item() == pytest.approx(2 / 4)  # tokens 0 and 1 are clipped
    mask[0, 3] = False  # a masked token does not count
    loss3, frac3 = ppo_policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    assert loss3.item() == pytest.approx((-1.2 + 1.6 - 1.1) / 3, abs=1e-14)
    assert frac3.item() == pytest.approx(2 / 3)


def test_ppo_policy_loss_on_policy_gradient_is_the_policy_gradient():
    """At ratio 1 (old = current) the gradient is -A grad log pi / (number of tokens)."""
    logprobs = (-randn(B, T, seed=70).abs()).requires_grad_()
    adv = randn(B, seed=71)
    mask = ragged_mask([5, 2, 4], T)
    loss, frac = ppo_policy_loss(logprobs, logprobs.detach(), adv, mask, clip_eps=0.2)
    loss.backward()
    expected = -adv[:, None].expand(B, T) * mask / mask.sum()
    torch.testing.assert_close(logprobs.grad, expected, rtol=0, atol=1e-15)
    assert frac.item() == 0


def test_ppo_policy_loss_gradcheck_and_bad_inputs():
    logprobs = randn(B, T, seed=72, scale=0.05).requires_grad_()  # ratios near 1: no kinks
    old, adv, mask = randn(B, T, seed=73, scale=0.05), randn(B, T, seed=74), ragged_mask([5, 2, 4], T)
    assert torch.autograd.gradcheck(lambda x: ppo_policy_loss(x, old, adv, mask, 0.5)[0], (logprobs,))
    with pytest.raises(ValueError, match="mask"):
        ppo_policy_loss(logprobs, old, adv, mask[:, :4], 0.2)
    with pytest.raises(ValueError, match="mask has no ones"):
        ppo_policy_loss(logprobs, old, adv, torch.zeros(B, T), 0.2)
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(logprobs, old, adv[:, :2], mask, 0.2)
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_policy_loss(logprobs, old, adv, mask, 1.0)
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        ppo_policy_loss(logprobs, old, adv, 2 * mask, 0.2)


@pytest.mark.parametrize("eps_high", [None, 0.28])
def test_ppo_policy_loss_matches_trl(trl, eps_high):
    """Peer: ``trl.GRPOTrainer._compute_loss`` with ``loss_type="bnpo"``, ``beta=0`` and
    per-token advantages (B, T): the token-mean clipped surrogate of PPO. The clip fraction
    is trl's ``clip_ratio/region_mean`` metric, which trl computes in float32."""
    logprobs = -randn(B, T, seed=80).abs()
    old = logprobs + randn(B, T, seed=81, scale=0.3)
    adv = randn(B, T, seed=82)
    mask = ragged_mask([5, 2, 4], T)
    theirs, logged = _trl_grpo(trl, "bnpo", logprobs, old, None, adv, mask, 0.0, 0.2,
                               eps_high or 0.2)
    ours, clip_fraction = ppo_policy_loss(logprobs, old, adv, mask, 0.2, eps_high)
    assert abs(theirs - ours).item() < 1e-12
    assert clip_fraction.item() > 0
    assert logged["clip_ratio/region_mean"][0] == pytest.approx(clip_fraction.item(), abs=1e-7)


def test_ppo_value_loss_worked_example():
    old = torch.tensor([[1.0, 1.0, 1.0]], dtype=D)
    values = torch.tensor([[1.5, 0.9, 0.0]], dtype=D)
    returns = torch.tensor([[2.0, 0.0, 1.0]], dtype=D)
    mask = torch.ones(1, 3)
    loss, frac = ppo_value_loss(values, old, returns, mask, clip_eps=0.2)
    # clipped values 1.2, 0.9, 0.8; squared errors unclipped (0.25, 0.81, 1.0),
    # clipped (0.64, 0.81, 0.04): the max is 0.64, 0.81, 1.0
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 1.0) / 3, abs=1e-14)
    assert frac.item() == pytest.approx(1 / 3)
    plain, zero = ppo_value_loss(values, old, returns, mask, clip_eps=None)
    assert plain.item() == pytest.approx(0.5 * (0.25 + 0.81 + 1.0) / 3, abs=1e-14)
    assert zero.item() == 0


def test_ppo_value_loss_gradcheck_and_bad_inputs():
    values = randn(B, T, seed=90).requires_grad_()
    old, returns, mask = randn(B, T, seed=91), randn(B, T, seed=92), ragged_mask([1, 5, 3], T)
    assert torch.autograd.gradcheck(lambda v: ppo_value_loss(v, old, returns, mask, 5.0)[0],
                                    (values,))
    with pytest.raises(ValueError, match="returns"):
        ppo_value_loss(values, old, returns[:2], mask, 0.2)
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_value_loss(values, old, returns, mask, 0.0)
    with pytest.raises(ValueError, match="mask has no ones"):
        ppo_value_loss(values, old, returns, torch.zeros(B, T, dtype=torch.bool), 0.2)


class _FixedValues(torch.nn.Module):
    """A critic whose output is a parameter: the values themselves, whatever the input."""

    def __init__(self, values):
        super().__init__()
        self.values = torch.nn.Parameter(values.clone())

    def forward(self, observation):
        return self.values


@pytest.mark.parametrize("clip", [0.2, None])
def test_ppo_value_loss_matches_torchrl(clip):
    """0.5 * mean max((V - R)^2, (V_clip - R)^2) against torchrl's ClipPPOLoss.loss_critic
    (clip_value, "l2" distance, critic_coeff 0.5), value and gradient, on the unmasked
    entries of a ragged batch (torchrl has no mask: it gets those entries as a flat batch)."""
    pytest.importorskip("torchrl")
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss

    old = randn(B, T, seed=93)
    values = (old + 0.3 * randn(B, T, seed=94)).requires_grad_()  # some move beyond 0.2, some not
    returns, mask = randn(B, T, seed=95), ragged_mask([5, 2, 4], T)
    loss, _ = ppo_value_loss(values, old, returns, mask, clip)
    (grad,) = torch.autograd.grad(loss, values)

    on = mask.bool()
    n = int(on.sum())
    critic = ValueOperator(_FixedValues(values.detach()[on][:, None]), in_keys=["observation"])
    actor = ProbabilisticActor(TensorDictModule(torch.nn.Linear(1, 2).double(), in_keys=["observation"],
                                                out_keys=["logits"]),
                               in_keys=["logits"], distribution_class=torch.distributions.Categorical)
    as64 = None if clip is None else torch.tensor(clip, dtype=D)  # a float becomes a float32 buffer
    peer = ClipPPOLoss(actor, critic, clip_value=as64, loss_critic_type="l2",
                       critic_coeff=torch.tensor(0.5, dtype=D), functional=False)
    td = TensorDict({"observation": torch.zeros(n, 1, dtype=D), "value_target": returns[on][:, None],
                     "state_value": old[on][:, None]}, batch_size=[n])
    per_entry = peer.loss_critic(td)[0]  # (n, 1), not yet reduced
    want = per_entry.mean()
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=0, atol=1e-14)
    torch.testing.assert_close(grad[on], critic.module.values.grad[:, 0], rtol=0, atol=1e-14)
    assert (grad[~on] == 0).all()
    if clip is not None:  # the comparison must cover both branches of the max
        v, o, r = values.detach()[on], old[on], returns[on]
        clipped_larger = (o + (v - o).clamp(-clip, clip) - r) ** 2 > (v - r) ** 2
        assert clipped_larger.any() and not clipped_larger.all()


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_worked_example():
    est = kl_estimators(torch.tensor(math.log(0.5), dtype=D), torch.tensor(math.log(0.25), dtype=D))
    assert isinstance(est, KLEstimates)
    # log r = log(0.25 / 0.5) = -log 2
    assert est.k1.item() == pytest.approx(math.log(2), abs=1e-15)
    assert est.k2.item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-15)
    assert est.k3.item() == pytest.approx(0.5 - 1 + math.log(2), abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.integers(0, 10**6))
def test_kl_estimators_expectations(k, seed):
    """Over x ~ p exactly: E[k1] = E[k3] = KL(p || q) (unbiased); k2, k3 >= 0 pointwise."""
    logp = torch.log_softmax(randn(k, seed=seed), dim=0)
    logq = torch.log_softmax(randn(k, seed=seed + 1), dim=0)
    p = logp.exp()
    est = kl_estimators(logp, logq)
    kl = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logp),
                                           torch.distributions.Categorical(logits=logq))
    assert (p * est.k1).sum().item() == pytest.approx(kl.item(), abs=1e-12)
    assert (p * est.k3).sum().item() == pytest.approx(kl.item(), abs=1e-12)
    assert (est.k2 >= 0).all() and (est.k3 >= 0).all()
    with pytest.raises(ValueError, match="logq"):
        kl_estimators(logp, logq[:-1])


def _categorical(k, seed, scale=1.0, shape=()):
    return torch.log_softmax(randn(*shape, k, seed=seed, scale=scale), dim=-1)


def test_kl_estimator_variances_worked_example():
    """p = (0.9, 0.1), q = (0.1, 0.9): log r = -log 9 w.p. 0.9 and +log 9 w.p. 0.1. A two-point
    variable has variance p1 p2 (difference of its two values)^2."""
    logp = torch.tensor([0.9, 0.1], dtype=D).log()
    logq = torch.tensor([0.1, 0.9], dtype=D).log()
    var = kl_estimator_variances(logp, logq)
    assert isinstance(var, KLEstimates)
    l9 = math.log(9)
    assert var.k1.item() == pytest.approx(0.09 * (2 * l9) ** 2, rel=1e-14)
    assert var.k2.item() == pytest.approx(0.0, abs=1e-15)  # (log r)^2 / 2 is the same at both
    k3_values = (1 / 9 - 1 + l9, 9 - 1 - l9)
    assert var.k3.item() == pytest.approx(0.09 * (k3_values[1] - k3_values[0]) ** 2, rel=1e-14)
    assert var.k3 > var.k1  # k3 is not always the lower-variance estimator


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 5), st.integers(0, 10**6))
def test_kl_estimator_variances_equal_sympy(k, seed):
    """Against the exact SymPy moments of policy_gradient.kl_estimator_moments (rationals)."""
    import sympy as sp

    from llmbook.alignment.policy_gradient import kl_estimator_moments

    weights = torch.randint(1, 20, (2, k), generator=gen(seed))
    p_sym = [sp.Rational(int(w), int(weights[0].sum())) for w in weights[0]]
    q_sym = [sp.Rational(int(w), int(weights[1].sum())) for w in weights[1]]
    exact = kl_estimator_moments(p_sym, q_sym)
    logp = torch.tensor([float(v) for v in p_sym], dtype=D).log()
    logq = torch.tensor([float(v) for v in q_sym], dtype=D).log()
    var = kl_estimator_variances(logp, logq)
    for name in ("k1", "k2", "k3"):
        want = float(sp.N(exact[name][1], 30))
        assert getattr(var, name).item() == pytest.approx(want, rel=1e-10, abs=1e-14)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 8), st.floats(0.1, 4.0), st.integers(0, 10**6))
def test_kl_estimator_variance_gap_is_chi_square_minus_twice_a_covariance(k, scale, seed):
    """Var[k3] - Var[k1] = Var_p[r] - 2 Cov_p(r, log r), Var_p[r] = chi^2(q || p) = sum q^2/p - 1,
    on a batch of non-square shape (3, 2, k)."""
    logp, logq = _categorical(k, seed, scale, (3, 2)), _categorical(k, seed + 1, scale, (3, 2))
    var = kl_estimator_variances(logp, logq)
    p, r = logp.exp(), (logq - logp).exp()
    chi2 = (logq.exp() ** 2 / p).sum(-1) - 1
    cov = (p * (r - 1) * ((logq - logp) - (p * (logq - logp)).sum(-1, keepdim=True))).sum(-1)
    torch.testing.assert_close(var.k3 - var.k1, chi2 - 2 * cov, rtol=1e-9, atol=1e-12)
    for i in range(3):  # a batch is its rows
        row = kl_estimator_variances(logp[i, 1], logq[i, 1])
        torch.testing.assert_close(var.k2[i, 1], row.k2, rtol=0, atol=0)


def test_kl_estimator_variances_ignore_outcomes_p_never_draws():
    logp = torch.tensor([0.5, 0.0, 0.5], dtype=D).log()  # log 0 = -inf
    logq = torch.tensor([0.2, 0.5, 0.3], dtype=D).log()
    var = kl_estimator_variances(logp, logq)
    log_r = torch.tensor([math.log(0.2 / 0.5), math.log(0.3 / 0.5)], dtype=D)  # the two drawn
    assert var.k1.item() == pytest.approx(0.25 * float(log_r[0] - log_r[1]) ** 2, rel=1e-13)
    assert all(torch.isfinite(v) for v in var)


def test_kl_estimator_variances_bad_inputs():
    logp, logq = _categorical(3, 1), _categorical(3, 2)
    with pytest.raises(ValueError, match="logq"):
        kl_estimator_variances(logp, logq[:2])
    with pytest.raises(ValueError, match="logp"):
        kl_estimator_variances(logp + 0.1, logq)  # sums to more than 1 (and a positive log)
    with pytest.raises(ValueError, match="logq"):
        kl_estimator_variances(logp, logq - 0.1)  # sums to less than 1
    with pytest.raises(ValueError, match="logq must be finite"):
        kl_estimator_variances(logp, torch.tensor([0.0, -math.inf, -math.inf], dtype=D))
    with pytest.raises(ValueError, match="last dimension"):
        kl_estimator_variances(torch.tensor(0.0, dtype=D), torch.tensor(0.0, dtype=D))
    with pytest.raises(TypeError, match="logp"):
        kl_estimator_variances(torch.zeros(2, dtype=torch.long), logq[:2])


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 7), st.floats(0.1, 3.0), st.integers(0, 10**6))
def test_kl_estimator_loss_gradients_are_zero_forward_kl_reverse_kl(k, scale, seed):
    """Used as losses: E[grad k1] = 0, E[grad k2] = grad KL(p || q), E[grad k3] = grad KL(q || p)
    = p - q, the KLs differentiated by autograd through torch.distributions; shape (2, 3, k)."""
    logits = scale * randn(2, 3, k, seed=seed)
    logq = _categorical(k, seed + 1, scale, (2, 3))
    grads = kl_estimator_loss_gradients(logits, logq)
    z = logits.clone().requires_grad_()
    Cat = torch.distributions.Categorical
    forward = torch.distributions.kl_divergence(Cat(logits=z), Cat(logits=logq)).sum()
    reverse = torch.distributions.kl_divergence(Cat(logits=logq), Cat(logits=z)).sum()
    (g_forward,) = torch.autograd.grad(forward, z)
    (g_reverse,) = torch.autograd.grad(reverse, z)
    torch.testing.assert_close(grads.k1, torch.zeros_like(logits), rtol=0, atol=1e-13)
    torch.testing.assert_close(grads.k2, g_forward, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads.k3, g_reverse, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads.k3, torch.softmax(logits, -1) - logq.exp(), rtol=1e-10, atol=1e-12)
    assert not torch.allclose(g_forward, g_reverse, atol=1e-6)  # the two KLs' gradients differ


def test_kl_estimator_loss_gradients_equal_a_sympy_derivation():
    """sum_x p(x) d k(x) / d theta_j in SymPy, for K = 3 symbolic logits, at a point."""
    import sympy as sp

    theta = sp.symbols("theta0:3", real=True)
    log_z = sp.log(sum(sp.exp(t) for t in theta))
    logq_values = [sp.log(sp.Rational(1, 6)), sp.log(sp.Rational(1, 2)), sp.log(sp.Rational(1, 3))]
    log_r = [lq - (t - log_z) for lq, t in zip(logq_values, theta, strict=True)]
    p = [sp.exp(t - log_z) for t in theta]
    estimators = {"k1": [-lr for lr in log_r], "k2": [lr**2 / 2 for lr in log_r],
                  "k3": [sp.exp(lr) - 1 - lr for lr in log_r]}
    point = {theta[0]: sp.Rational(1, 2), theta[1]: -1, theta[2]: sp.Rational(3, 10)}
    logits = torch.tensor([0.5, -1.0, 0.3], dtype=D)
    grads = kl_estimator_loss_gradients(logits, torch.tensor([1 / 6, 1 / 2, 1 / 3], dtype=D).log())
    for name, ks in estimators.items():
        want = [float(sum(pk * sp.diff(kv, theta[j]) for pk, kv in zip(p, ks, strict=True)).subs(point))
                for j in range(3)]
        torch.testing.assert_close(getattr(grads, name), torch.tensor(want, dtype=D), rtol=1e-12, atol=1e-14)


def test_kl_estimator_loss_gradients_match_monte_carlo():
    """The mean over samples x ~ p of autograd's gradient of k(x), each sample held fixed,
    lies within 5 standard errors of the exact expectation."""
    logits = torch.tensor([1.0, -0.5, 0.2, 0.8, -1.2], dtype=D)
    logq = _categorical(5, 7)
    exact = kl_estimator_loss_gradients(logits, logq)
    n = 4000
    x = torch.multinomial(torch.softmax(logits, 0), n, replacement=True, generator=gen(8))
    z = logits.clone().requires_grad_()
    est = kl_estimators(torch.log_softmax(z, 0)[x], logq[x])  # (n,) each
    for name in ("k1", "k2", "k3"):
        per_sample = torch.stack([torch.autograd.grad(getattr(est, name)[i], z, retain_graph=True)[0]
                                  for i in range(0, n, 8)])  # every 8th: 500 samples
        mean, se = per_sample.mean(0), per_sample.std(0) / per_sample.shape[0] ** 0.5
        assert ((mean - getattr(exact, name)).abs() <= 5 * se + 1e-12).all(), name


def test_kl_estimator_loss_gradients_bad_inputs():
    logits, logq = randn(2, 4, seed=3), _categorical(4, 4, shape=(2,))
    with pytest.raises(ValueError, match="logq"):
        kl_estimator_loss_gradients(logits, logq[:, :3])
    with pytest.raises(ValueError, match="logits"):
        kl_estimator_loss_gradients(torch.full((2, 4), math.inf, dtype=D), logq)
    with pytest.raises(ValueError, match="logq"):
        kl_estimator_loss_gradients(logits, logq.exp())  # probabilities, not their logs
    with pytest.raises(ValueError, match="logq"):
        kl_estimator_loss_gradients(logits, torch.tensor([[0.0] + [-math.inf] * 3] * 2, dtype=D))


# ---------------------------------------------------------------- GRPO (chapter 20)


def test_group_normalized_rewards_worked_example():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=D)
    adv = group_normalized_rewards(rewards, group_size=4)
    # group 1: mean 1/2, sample std sqrt(4 * 1/4 / 3) = sqrt(1/3); group 2: all equal -> 0
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0, 0, 0, 0], dtype=D),
                               rtol=0, atol=1e-15)
    centred = group_normalized_rewards(rewards, group_size=4, normalize_std=False)
    torch.testing.assert_close(centred, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], dtype=D))
    two_groups_of_two = group_normalized_rewards(torch.tensor([3.0, 1.0, 0.0, 4.0], dtype=D), 2,
                                                 eps=0.0)
    s = math.sqrt(2)  # the sample std of {a, b} is |a - b| / sqrt 2
    torch.testing.assert_close(two_groups_of_two,
                               torch.tensor([1 / s, -1 / s, -1 / s, 1 / s], dtype=D))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 10**6), st.booleans())
def test_group_normalized_rewards_have_mean_zero_per_group(groups, size, seed, normalize):
    rewards = randn(groups * size, seed=seed, scale=3)
    adv = group_normalized_rewards(rewards, size, normalize_std=normalize)
    per_group = adv.view(groups, size)
    torch.testing.assert_close(per_group.mean(dim=1), torch.zeros(groups, dtype=D),
                               rtol=0, atol=1e-12)
    if normalize:  # std of A = s / (s + eps) < 1, and close to 1 for a spread-out group
        s = rewards.view(groups, size).std(dim=1)
        torch.testing.assert_close(per_group.std(dim=1), s / (s + 1e-4), rtol=0, atol=1e-12)


def test_group_normalized_rewards_bad_inputs():
    with pytest.raises(ValueError, match="group_size"):
        group_normalized_rewards(torch.zeros(6, dtype=D), 4)
    with pytest.raises(ValueError, match="group_size"):
        group_normalized_rewards(torch.zeros(6, dtype=D), 1)
    with pytest.raises(ValueError, match="group_size"):
        group_normalized_rewards(torch.zeros(0, dtype=D), 2)
    with pytest.raises(ValueError, match="group_size"):
        group_normalized_rewards(torch.zeros(6, dtype=D), 0)
    with pytest.raises(ValueError, match="rewards"):
        group_normalized_rewards(torch.zeros(2, 3, dtype=D), 3)
    with pytest.raises(ValueError, match="eps"):
        group_normalized_rewards(torch.ones(4, dtype=D), 2, eps=0.0)


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_group_normalized_rewards_match_trl(trl, scale_rewards):
    """Peer: ``trl.GRPOTrainer._generate_and_score_completions`` (the ``advantages`` it
    returns, ``multi_objective_aggregation="sum_then_normalize"``) with ``_generate`` and
    ``_calculate_rewards`` stubbed to return fixed completions and rewards. Run under
    ``torch.set_default_dtype(float64)``: trl's ``nanstd`` forms the Bessel factor
    n / (n - 1) by dividing integer tensors, which otherwise rounds it to float32."""
    groups, size = 3, 4
    n = groups * size
    rewards = randn(n, seed=100, scale=2)
    rewards[4:8] = 1.5  # one group with equal rewards: zero std
    trainer = _bare(
        trl.GRPOTrainer, model=_EvalModel(), environment_factories=None, environments=None,
        tools=[], _tokenizer=SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None,
        mask_truncated_completions=False, num_iterations=1, use_vllm=False,
        vllm_importance_sampling_correction=False, beta=0.0, num_generations_eval=size,
        multi_objective_aggregation="sum_then_normalize", reward_weights=torch.ones(1, dtype=D),
        scale_rewards=scale_rewards, reward_func_names=["r"], _pending_extra_logs={},
        _pending_metrics={}, log_multimodal=False,
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
               "extra": defaultdict(list)},
        args=SimpleNamespace(per_device_eval_batch_size=n, gradient_checkpointing_kwargs=None,
                             steps_per_generation=1, gradient_accumulation_steps=1))
    trainer._generate = lambda prompts: ([[1, 2]] * len(prompts), [[3, 4, 5]] * len(prompts),
                                         None, ["c"] * len(prompts), None, {}, None, None)
    trainer._calculate_rewards = lambda inputs, prompts, completions, ids: rewards[:, None].clone()
    default = torch.get_default_dtype()
    torch.set_default_dtype(D)
    try:
        theirs = trainer._generate_and_score_completions([{"prompt": "p"}] * n)["advantages"]
    finally:
        torch.set_default_dtype(default)
    ours = group_normalized_rewards(rewards, size, normalize_std=scale_rewards == "group")
    assert theirs.dtype == D
    assert (theirs - ours).abs().max().item() < 1e-12


def _trl_grpo(trl, loss_type, logprobs, old, ref, advantages, mask, beta, eps_low, eps_high,
              max_completion_length=None):
    """trl.GRPOTrainer._compute_loss on fixed per-token log-probs; returns (loss, metrics)."""
    width = logprobs.shape[1]
    trainer = _bare(
        trl.GRPOTrainer, model=_EvalModel(), aux_loss_enabled=False, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False,
        max_completion_length=max_completion_length or width,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None))
    # the model's forward pass: the log-probs (and entropies) of the completion tokens
    trainer._get_per_token_logps_and_entropies = \
        lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None)
    inputs = {"prompt_ids": torch.zeros(logprobs.shape[0], 2, dtype=torch.long),
              "prompt_mask": torch.ones(logprobs.shape[0], 2, dtype=torch.long),
              "completion_ids": torch.zeros(logprobs.shape, dtype=torch.long),
              "completion_mask": mask, "advantages": advantages, "old_per_token_logps": old}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    loss = trainer._compute_loss(trainer.model, inputs)
    return loss, trainer._metrics["eval"]


def test_grpo_aggregations_worked_example():
    """Ratio 1 and beta = 0: the per-token loss is -A_b; only the aggregation differs."""
    logprobs = torch.zeros(2, 3, dtype=D)
    adv = torch.tensor([1.0, 4.0], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    def agg(a, **kw):
        return grpo_loss(logprobs, None, None, adv, mask, 0.2, 0.0, a, **kw).loss.item()
    assert agg("sequence_mean") == pytest.approx(-(1.0 + 4.0) / 2)
    assert agg("token_mean") == pytest.approx(-(3 * 1.0 + 4.0) / 4)
    assert agg("constant") == pytest.approx(-(3 * 1.0 + 4.0) / (2 * 3))
    assert agg("constant", max_length=10) == pytest.approx(-(3 * 1.0 + 4.0) / (2 * 10))


def test_grpo_length_bias_of_the_sequence_mean():
    """Under "sequence_mean" a token's gradient weight is 1 / (B |y_b|): short responses
    weigh more per token; "token_mean" and "constant" weigh every token alike."""
    logprobs = torch.zeros(2, 4, dtype=D, requires_grad=True)
    adv = torch.tensor([1.0, 1.0], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    for aggregation, per_token in [("sequence_mean", [1 / 8, 1 / 2]), ("token_mean", [1 / 5, 1 / 5]),
                                   ("constant", [1 / 8, 1 / 8])]:
        logprobs.grad = None
        grpo_loss(logprobs, None, None, adv, mask, 0.2, 0.0, aggregation).loss.backward()
        assert (-logprobs.grad[0, 0].item(), -logprobs.grad[1, 0].item()) == \
            pytest.approx(per_token, abs=1e-15)


def test_grpo_kl_term_and_output():
    logprobs, ref = -randn(B, T, seed=110).abs(), -randn(B, T, seed=111).abs()
    mask = ragged_mask([5, 1, 3], T)
    out = grpo_loss(logprobs, None, ref, torch.zeros(B, dtype=D), mask, 0.2, 0.04, "token_mean")
    assert isinstance(out, GRPOLossOutput)
    k3 = torch.exp(ref - logprobs) - (ref - logprobs) - 1
    kl = (k3 * mask).sum() / mask.sum()
    assert out.kl.item() == pytest.approx(kl.item(), abs=1e-15)
    assert out.loss.item() == pytest.approx(0.04 * kl.item(), abs=1e-15)  # A = 0: only the KL
    assert out.clip_fraction.item() == 0
    assert grpo_loss(logprobs, None, None, torch.zeros(B, dtype=D), mask, 0.2, 0.0).kl is None


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
def test_grpo_gradcheck(aggregation):
    logprobs = (-1 + randn(B, T, seed=120, scale=0.05)).requires_grad_()
    old = -1 + randn(B, T, seed=121, scale=0.05)
    ref = -1 + randn(B, T, seed=122, scale=0.3)
    adv, mask = randn(B, seed=123), ragged_mask([5, 2, 4], T)

    def f(x):
        return grpo_loss(x, old, ref, adv, mask, 0.3, 0.1, aggregation).loss

    assert torch.autograd.gradcheck(f, (logprobs,))


def test_grpo_bad_inputs():
    lp, adv, mask = torch.zeros(B, T, dtype=D), torch.zeros(B, dtype=D), torch.ones(B, T)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(lp, None, None, adv, mask, 0.2, beta=0.1)
    with pytest.raises(ValueError, match="beta"):
        grpo_loss(lp, None, lp, adv, mask, 0.2, beta=-0.1)
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(lp, None, None, adv, mask, 0.2, 0.0, aggregation="dapo")
    with pytest.raises(ValueError, match="max_length"):
        grpo_loss(lp, None, None, adv, mask, 0.2, 0.0, "constant", max_length=T - 1)
    with pytest.raises(ValueError, match="max_length"):
        grpo_loss(lp, None, None, adv, mask, 0.2, 0.0, "token_mean", max_length=T + 1)
    with pytest.raises(ValueError, match="row with no ones"):
        grpo_loss(lp, None, None, adv, ragged_mask([5, 0, 2], T), 0.2, 0.0)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(lp, None, None, torch.zeros(T, dtype=D), mask, 0.2, 0.0)
    with pytest.raises(ValueError, match="old_logprobs"):
        grpo_loss(lp, lp[:, :2], None, adv, mask, 0.2, 0.0)
    with pytest.raises(ValueError, match="clip_eps_high"):
        grpo_loss(lp, None, None, adv, mask, 0.2, 0.0, clip_eps_high=0.0)


@pytest.mark.parametrize("loss_type,aggregation", [("grpo", "sequence_mean"),
                                                   ("bnpo", "token_mean"),
                                                   ("dr_grpo", "constant")])
def test_grpo_matches_trl(trl, loss_type, aggregation):
    """Peer: ``trl.GRPOTrainer._compute_loss`` (token-level importance sampling, k3 KL with
    ``beta=0.04``, ``epsilon_low=0.2``, ``epsilon_high=0.28``, ``max_completion_length=9``
    for "dr_grpo"), with advantages from :func:`group_normalized_rewards`. Also compares the
    logged ``kl`` and ``clip_ratio/region_mean`` (the latter trl computes in float32)."""
    n = 4
    logprobs = -randn(n, T, seed=130).abs()
    old = logprobs + randn(n, T, seed=131, scale=0.3)
    ref = logprobs + randn(n, T, seed=132, scale=0.2)
    adv = group_normalized_rewards(randn(n, seed=133), group_size=2)
    mask = ragged_mask([5, 3, 1, 4], T)
    max_length = 9 if aggregation == "constant" else None
    theirs, logged = _trl_grpo(trl, loss_type, logprobs, old, ref, adv, mask, 0.04, 0.2, 0.28,
                               max_completion_length=max_length)
    ours = grpo_loss(logprobs, old, ref, adv, mask, 0.2, 0.04, aggregation, clip_eps_high=0.28,
                     max_length=max_length)
    assert abs(theirs - ours.loss).item() < 1e-12
    assert logged["kl"][0] == pytest.approx(ours.kl.item(), abs=1e-12)
    assert ours.clip_fraction.item() > 0
    assert logged["clip_ratio/region_mean"][0] == pytest.approx(ours.clip_fraction.item(), abs=1e-7)


def test_grpo_on_policy_matches_trl_default(trl):
    """Peer: ``trl.GRPOTrainer._compute_loss`` without ``old_per_token_logps`` (one update
    per generation: trl uses ``per_token_logps.detach()``), against ``old_logprobs=None``,
    comparing the loss and its gradient."""
    logprobs = (-randn(B, T, seed=140).abs()).requires_grad_()
    ref = logprobs.detach() + randn(B, T, seed=141, scale=0.2)
    adv, mask = randn(B, seed=142), ragged_mask([5, 2, 4], T)
    theirs, _ = _trl_grpo(trl, "grpo", logprobs, None, ref, adv, mask, 0.04, 0.2, 0.2)
    (g_theirs,) = torch.autograd.grad(theirs, logprobs)
    ours = grpo_loss(logprobs, None, ref, adv, mask, 0.2, 0.04).loss
    (g_ours,) = torch.autograd.grad(ours, logprobs)
    assert abs(theirs - ours).item() < 1e-12
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-12)


def test_losses_reject_non_tensors():
    with pytest.raises(TypeError, match="logprobs"):
        grpo_loss([[0.0]], None, None, torch.zeros(1), torch.ones(1, 1), 0.2, 0.0)
    with pytest.raises(TypeError, match="beta"):
        dpo_loss(*(torch.zeros(2, dtype=D),) * 4, beta="0.1")
    with pytest.raises(TypeError, match="mask"):
        ppo_policy_loss(torch.zeros(1, 2, dtype=D), torch.zeros(1, 2, dtype=D),
                        torch.zeros(1, dtype=D), [[1, 1]], 0.2)


def test_dpo_loss_rejects_what_cannot_be_a_log_probability():
    ok = torch.tensor([-3.0, -2.5])
    dpo_loss(ok, ok - 1, ok, ok - 1, beta=0.1)  # accepted
    with pytest.raises(ValueError, match=r"policy_rejected_logps\[1\] = 0.5"):
        dpo_loss(ok, torch.tensor([-1.0, 0.5]), ok, ok, beta=0.1)
    with pytest.raises(ValueError, match=r"ref_chosen_logps\[0\] = nan"):
        dpo_loss(ok, ok, torch.tensor([float("nan"), -1.0]), ok, beta=0.1)
    with pytest.raises(ValueError, match=r"policy_chosen_logps\[\] = 2.0"):
        dpo_loss(torch.tensor(2.0), torch.tensor(-1.0), torch.tensor(-1.0), torch.tensor(-1.0), beta=0.1)


# ---------------------------------------------------------------- explicit reductions (issue 24)
# On-policy (ratio 1), beta = 0: the per-token policy loss is -A_b on a (2, 4) batch whose rows
# hold 2 and 3 response tokens; A = (1, -2). By hand: "none" [[-1, -1, 0, 0], [2, 2, 2, 0]],
# "sum" -2 + 6 = 4, "token_mean" 4/5, "sequence_mean" (-1 + 2)/2 = 1/2, "constant" C=10: 2/5.

ADV2 = torch.tensor([1.0, -2.0], dtype=D)
MASK2 = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
NONE2 = torch.tensor([[-1.0, -1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 0.0]], dtype=D)
BY_HAND2 = {"sum": 4.0, "token_mean": 0.8, "sequence_mean": 0.5, "constant": 0.4}


def _c(reduction):
    return 10.0 if reduction == "constant" else None


@pytest.mark.parametrize("reduction", ["sum", "token_mean", "sequence_mean", "constant"])
def test_ppo_and_grpo_reductions_worked_example(reduction):
    lp = torch.zeros(2, 4, dtype=D)
    ppo, _ = ppo_policy_loss(lp, lp, ADV2, MASK2, 0.2, reduction=reduction, normaliser=_c(reduction))
    assert ppo.item() == pytest.approx(BY_HAND2[reduction], abs=1e-15)
    grpo = grpo_loss(lp, None, None, ADV2, MASK2, 0.2, 0.0, reduction=reduction,
                     max_length=10 // 2 if reduction == "constant" else None).loss  # C = B * max_length
    assert grpo.item() == pytest.approx(BY_HAND2[reduction], abs=1e-15)
    if reduction != "constant":
        same = grpo_loss(lp, None, None, ADV2, MASK2, 0.2, 0.0, reduction).loss  # aggregation, positional
        assert same.item() == grpo.item()


def test_per_token_losses_with_reduction_none():
    lp = torch.zeros(2, 4, dtype=D)
    ppo, clip = ppo_policy_loss(lp, lp, ADV2, MASK2, 0.2, reduction="none")
    torch.testing.assert_close(ppo, NONE2)
    assert clip.item() == 0
    grpo = grpo_loss(lp, None, None, ADV2, MASK2, 0.2, 0.0, reduction="none").loss
    torch.testing.assert_close(grpo, NONE2)
    for reduction in ("sum", "token_mean", "sequence_mean"):  # "none" then reduced = the reduction
        torch.testing.assert_close(ppo_policy_loss(lp, lp, ADV2, MASK2, 0.2, reduction=reduction)[0],
                                   reduce_tokens(ppo, MASK2, reduction))
    assert ppo.sum().item() == BY_HAND2["sum"]


def test_policy_gradient_loss_reductions():
    # per-token log-probabilities -1 .. -4 and -10 .. -30; rewards 1 and -2, baseline 0.5:
    # weights 0.5 and -2.5, per-token losses -w_b log pi_bt
    logp = -torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]], dtype=D)
    rewards = torch.tensor([1.0, -2.0], dtype=D)
    per_token = torch.tensor([[0.5, 1.0, 0.0, 0.0], [-25.0, -50.0, -75.0, 0.0]], dtype=D)
    kw = {"baseline": 0.5, "mask": MASK2}
    default = policy_gradient_loss(logp, rewards, **kw)
    assert default.item() == (1.5 - 150.0) / 2  # -mean_b w_b log pi(y_b): today's default, B = 2
    torch.testing.assert_close(policy_gradient_loss(logp, rewards, **kw, reduction="none"), per_token)
    assert policy_gradient_loss(logp, rewards, **kw, reduction="sum").item() == -148.5
    assert policy_gradient_loss(logp, rewards, **kw, reduction="token_mean").item() == -148.5 / 5
    assert policy_gradient_loss(logp, rewards, **kw, reduction="sequence_mean").item() == (0.75 - 50.0) / 2
    assert policy_gradient_loss(logp, rewards, **kw, reduction="constant", normaliser=2).item() == default.item()
    # per-sequence inputs: each sequence is one item
    seq = torch.tensor([-3.0, -60.0], dtype=D)
    torch.testing.assert_close(policy_gradient_loss(seq, rewards, 0.5, reduction="none"),
                               torch.tensor([1.5, -150.0], dtype=D))
    assert policy_gradient_loss(seq, rewards, 0.5, reduction="sum").item() == -148.5
    assert policy_gradient_loss(seq, rewards, 0.5, reduction="token_mean").item() == default.item()
    with pytest.raises(ValueError, match="reduction must be one of"):
        policy_gradient_loss(seq, rewards, reduction="mean")
    with pytest.raises(ValueError, match="normaliser applies"):
        policy_gradient_loss(seq, rewards, reduction="sum", normaliser=3)


def test_ppo_value_loss_reductions():
    values = torch.tensor([[1.0, 2.0, 9.0, 9.0], [0.0, 1.0, 3.0, 9.0]], dtype=D)
    returns = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.0, 0.0]], dtype=D)
    # squared errors on the mask: 1, 4 | 4, 0, 9 -> 0.5 x: sum 9, token mean 1.8, sequence mean
    # 0.5 (2.5 + 13/3) / 2, constant 18 / 10 * 0.5
    for reduction, want in [("sum", 9.0), ("token_mean", 1.8), ("sequence_mean", 0.5 * (2.5 + 13 / 3) / 2),
                            ("constant", 0.9)]:
        for clip in (None, 100.0):  # a clip range that never binds gives the same loss
            got, _ = ppo_value_loss(values, values, returns, MASK2, clip, reduction=reduction,
                                    normaliser=_c(reduction))
            assert got.item() == pytest.approx(want, abs=1e-14)
    none, _ = ppo_value_loss(values, values, returns, MASK2, None, reduction="none")
    torch.testing.assert_close(none, torch.tensor([[0.5, 2.0, 0, 0], [2.0, 0.0, 4.5, 0]], dtype=D))


@pytest.mark.parametrize("reduction", ["sum", "sequence_mean", "constant"])
def test_reductions_gradcheck(reduction):
    lp = (-1 + randn(B, T, seed=130, scale=0.05)).requires_grad_()
    old, adv, mask = -1 + randn(B, T, seed=131, scale=0.05), randn(B, seed=132), ragged_mask([5, 2, 4], T)
    c = _c(reduction)
    assert torch.autograd.gradcheck(
        lambda x: ppo_policy_loss(x, old, adv, mask, 0.3, reduction=reduction, normaliser=c)[0], (lp,))
    assert torch.autograd.gradcheck(
        lambda x: policy_gradient_loss(x, adv, mask=mask, reduction=reduction, normaliser=c), (lp,))
    values = randn(B, T, seed=133).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda v: ppo_value_loss(v, old, adv[:, None].expand(B, T), mask, 0.5, reduction=reduction,
                                 normaliser=c)[0], (values,))


def test_grpo_reduction_and_aggregation_are_one_argument():
    lp = torch.zeros(2, 4, dtype=D)
    with pytest.raises(ValueError, match="same argument"):
        grpo_loss(lp, None, None, ADV2, MASK2, 0.2, 0.0, "token_mean", reduction="sum")
    with pytest.raises(ValueError, match="reduction must be one of"):
        grpo_loss(lp, None, None, ADV2, MASK2, 0.2, 0.0, reduction="mean")
    with pytest.raises(ValueError, match="max_length applies"):
        grpo_loss(lp, None, None, ADV2, MASK2, 0.2, 0.0, reduction="sum", max_length=8)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(0, 10**6))
def test_pair_losses_sum_and_none_agree_with_mean(lengths, seed):
    n = len(lengths)
    pc, pr = -randn(n, seed=seed).abs(), -randn(n, seed=seed + 1).abs()
    rc, rr = -randn(n, seed=seed + 2).abs(), -randn(n, seed=seed + 3).abs()
    per = dpo_loss(pc, pr, rc, rr, 0.3, reduction="none")[0]
    assert dpo_loss(pc, pr, rc, rr, 0.3, reduction="sum")[0].item() == pytest.approx(per.sum().item(), abs=1e-12)
    assert dpo_loss(pc, pr, rc, rr, 0.3)[0].item() == pytest.approx(per.mean().item(), abs=1e-12)
    bt = bradley_terry_loss(pc, pr, center_coefficient=0.1, reduction="none")
    assert bt.shape == (n,)
    assert bradley_terry_loss(pc, pr, center_coefficient=0.1).item() == pytest.approx(bt.mean().item(), abs=1e-12)
    assert bradley_terry_loss(pc, pr, reduction="sum").item() == pytest.approx(
        bradley_terry_loss(pc, pr).item() * n, abs=1e-12)


def test_bradley_terry_reduction_worked_example():
    rc, rr = torch.tensor([1.0, 0.0], dtype=D), torch.tensor([0.0, 0.0], dtype=D)
    per = bradley_terry_loss(rc, rr, reduction="none")
    torch.testing.assert_close(per, torch.tensor([-math.log(sigmoid(1.0)), math.log(2.0)], dtype=D))
    with pytest.raises(ValueError, match="reduction must be one of"):
        bradley_terry_loss(rc, rr, reduction="token_mean")
