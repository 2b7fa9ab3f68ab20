"""Tests for llmbook.alignment.rl_variants: GSPO, DAPO, Dr. GRPO's std bias, the variant table.

Worked examples with numbers found by hand, special cases equal to
:func:`llmbook.alignment.losses.grpo_loss`, float64 gradient checks, and peers in trl 1.16.0:
``GRPOTrainer._compute_loss`` with ``importance_sampling_level="sequence"`` (GSPO) and
``loss_type="dapo"`` (DAPO, with ``num_items_in_batch``), reached as in
tests/test_alignment_losses.py: the trainer built with ``object.__new__``, only the
attributes the method reads set, and the model's forward pass stubbed to return our
per-token log-probabilities, so that trl's own code computes the loss.
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.losses import group_normalized_rewards, grpo_loss
from llmbook.alignment.rl_variants import (
    VARIANTS,
    arcsine_objective_symbolic,
    dapo_loss,
    expected_group_gradient,
    expected_group_gradient_enumerated,
    gspo_loss,
    informative_groups,
    sequence_log_ratio,
    variant_loss,
)
from llmbook.alignment.trl_peer import Accelerator as _Accelerator

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
B, T = 4, 6  # batch and response length, different so a transposed axis cannot hide


def randn(*shape, seed=0, scale=1.0):
    return scale * torch.randn(shape, generator=gen(seed), dtype=D)


def ragged_mask(lengths, width):
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


# ---------------------------------------------------------------- trl stubs


class _EvalModel:
    training = False


def _trl_loss(trl, loss_type, level, logprobs, old, ref, advantages, mask, beta, eps_low, eps_high,
              num_items_in_batch=None):
    """trl.GRPOTrainer._compute_loss (trl/trainer/grpo_trainer.py, 1.16.0, lines 3020-3300) on
    fixed per-token log-probs, in eval mode (no gradient-accumulation scaling)."""
    trainer = object.__new__(trl.GRPOTrainer)
    trainer.__dict__.update(
        accelerator=_Accelerator(), _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        model=_EvalModel(), aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps_low,
        epsilon_high=eps_high, use_vllm=False, vllm_importance_sampling_correction=False,
        _entropy_bonus_enabled=False, max_completion_length=logprobs.shape[1],
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None))
    trainer._get_per_token_logps_and_entropies = \
        lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None)
    n = logprobs.shape[0]
    inputs = {"prompt_ids": torch.zeros(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
              "completion_ids": torch.zeros(logprobs.shape, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if num_items_in_batch is not None:
        inputs["num_items_in_batch"] = torch.tensor(float(num_items_in_batch), dtype=D)
    loss = trainer._compute_loss(trainer.model, inputs)
    return loss, trainer._metrics["eval"]


def _batch(seed):
    logprobs = -randn(B, T, seed=seed).abs() - 0.1
    old = logprobs + randn(B, T, seed=seed + 1, scale=0.3)
    ref = logprobs + randn(B, T, seed=seed + 2, scale=0.2)
    adv = group_normalized_rewards(randn(B, seed=seed + 3), group_size=2)
    mask = ragged_mask([6, 3, 1, 4], T)
    return logprobs, old, ref, adv, mask


# ---------------------------------------------------------------- GSPO


def test_sequence_log_ratio_worked_example():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]], dtype=D)
    old = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -0.2, -0.8]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # row 0: (0.5 - 1.0) / 2; row 1: (0 - 0.3 + 0.3) / 3 (the masked -9 vs 0 is ignored)
    torch.testing.assert_close(sequence_log_ratio(logprobs, old, mask), torch.tensor([-0.25, 0.0], dtype=D),
                               rtol=0, atol=1e-15)


def test_gspo_worked_example():
    """Two sequences: s_0 = exp(0.1) > 1 + 0.05 with A = 1 (clipped); s_1 = exp(-0.02) with A = -2."""
    logprobs = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], dtype=D)
    old = torch.tensor([[-1.2, -1.0], [-1.98, -1.98]], dtype=D)
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -2.0], dtype=D)
    out = gspo_loss(logprobs, old, None, adv, mask, 0.05, 0.0)
    s1 = math.exp(-0.02)  # inside [0.95, 1.05]: -min(s A, clip(s) A) = 2 s
    expected = (-(1.05 * 1.0) + 2 * s1) / 2
    assert out.loss.item() == pytest.approx(expected, abs=1e-15)
    assert out.clip_fraction.item() == 0.5 and out.kl is None


def test_gspo_with_one_token_responses_is_grpo():
    logprobs, old, ref, adv, _ = _batch(10)
    lp, od, rf = logprobs[:, :1], old[:, :1], ref[:, :1]
    mask = torch.ones(B, 1)
    ours = gspo_loss(lp, od, rf, adv, mask, 0.2, 0.04, clip_eps_high=0.28)
    theirs = grpo_loss(lp, od, rf, adv, mask, 0.2, 0.04, "sequence_mean", clip_eps_high=0.28)
    assert abs(ours.loss - theirs.loss).item() < 1e-15
    assert abs(ours.kl - theirs.kl).item() < 1e-15


def test_gspo_on_policy_gradient_is_grpo_sequence_mean():
    """At s_i = 1 (on-policy), d s_i = (1/|o_i|) sum_t d log pi_it: GRPO's per-sequence mean."""
    logprobs, _, ref, adv, mask = _batch(20)
    x = logprobs.clone().requires_grad_()
    (g_gspo,) = torch.autograd.grad(gspo_loss(x, None, ref, adv, mask, 3e-4, 0.04, 4e-4).loss, x)
    (g_grpo,) = torch.autograd.grad(grpo_loss(x, None, ref, adv, mask, 0.2, 0.04, "sequence_mean").loss, x)
    torch.testing.assert_close(g_gspo, g_grpo, rtol=0, atol=1e-15)


def test_gspo_gradcheck():
    logprobs, old, ref, adv, mask = _batch(30)
    old = logprobs + randn(B, T, seed=35, scale=0.02)  # ratios near 1 so that some are not clipped

    def f(x):
        return gspo_loss(x, old, ref, adv, mask, 0.02, 0.1).loss

    assert torch.autograd.gradcheck(f, (logprobs.clone().requires_grad_(),))


@pytest.mark.parametrize("beta,eps", [(0.0, (3e-4, 4e-4)), (0.04, (0.2, 0.28))])
def test_gspo_matches_trl(trl, beta, eps):
    """Peer: trl ``importance_sampling_level="sequence"``, ``loss_type="grpo"``, on the same
    per-token log-probs; loss, gradient, logged KL and sequence clip ratio."""
    logprobs, old, ref, adv, mask = _batch(40)
    old = logprobs + randn(B, T, seed=41, scale=0.1)
    x = logprobs.clone().requires_grad_()
    theirs, logged = _trl_loss(trl, "grpo", "sequence", x, old, ref, adv, mask, beta, *eps)
    ours = gspo_loss(x, old, ref, adv, mask, eps[0], beta, eps[1])
    assert abs(theirs - ours.loss).item() < 1e-12
    (g_theirs,) = torch.autograd.grad(theirs, x)
    (g_ours,) = torch.autograd.grad(ours.loss, x)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-12)
    assert logged["clip_ratio/region_mean"][0] == pytest.approx(ours.clip_fraction.item(), abs=1e-7)
    if beta:
        assert logged["kl"][0] == pytest.approx(ours.kl.item(), abs=1e-12)


def test_gspo_bad_inputs():
    logprobs, old, ref, adv, mask = _batch(50)
    with pytest.raises(ValueError, match="advantages"):
        gspo_loss(logprobs, old, None, torch.zeros(B, T, dtype=D), mask, 0.2, 0.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        gspo_loss(logprobs, old, None, adv, mask, 0.2, 0.1)
    with pytest.raises(ValueError, match="beta"):
        gspo_loss(logprobs, old, ref, adv, mask, 0.2, -0.1)
    with pytest.raises(TypeError, match="beta"):
        gspo_loss(logprobs, old, ref, adv, mask, 0.2, "0.1")
    with pytest.raises(ValueError, match="clip_eps"):
        gspo_loss(logprobs, old, ref, adv, mask, 1.5, 0.0)
    with pytest.raises(ValueError, match="old_logprobs"):
        gspo_loss(logprobs, old[:, :2], None, adv, mask, 0.2, 0.0)
    with pytest.raises(ValueError, match="no ones"):
        gspo_loss(logprobs, old, None, adv, ragged_mask([6, 0, 1, 1], T), 0.2, 0.0)
    with pytest.raises(TypeError, match="logprobs"):
        sequence_log_ratio([[0.0]], None, torch.ones(1, 1))


# ---------------------------------------------------------------- DAPO


def test_informative_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], dtype=D)
    assert informative_groups(rewards, 4).tolist() == [True, True, False]
    assert informative_groups(rewards, 2).tolist() == [False, True, True, False, False, False]
    with pytest.raises(ValueError, match="group_size"):
        informative_groups(rewards, 5)
    with pytest.raises(ValueError, match="group_size"):
        informative_groups(rewards.view(3, 4), 4)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(2, 6), st.integers(0, 10**6))
def test_informative_groups_are_those_with_nonzero_advantages(groups, size, seed):
    """Peer: group_normalized_rewards, whose advantages vanish exactly on all-equal groups."""
    rewards = torch.randint(0, 2, (groups * size,), generator=gen(seed)).to(D)
    adv = group_normalized_rewards(rewards, size).view(groups, size)
    assert informative_groups(rewards, size).tolist() == (adv != 0).any(dim=1).tolist()


def test_dapo_is_token_mean_grpo_with_clip_higher():
    logprobs, old, _, adv, mask = _batch(60)
    ours = dapo_loss(logprobs, old, adv, mask)
    theirs = grpo_loss(logprobs, old, None, adv, mask, 0.2, 0.0, "token_mean", clip_eps_high=0.28).loss
    assert abs(ours - theirs).item() < 1e-15


def test_dapo_worked_example_clip_higher():
    """One token, A = 1, ratio 1.25: clipped at 1.2 by symmetric clipping, not at 1.28."""
    lp = torch.log(torch.tensor([[0.5]], dtype=D))
    old = torch.log(torch.tensor([[0.4]], dtype=D))  # ratio 1.25
    one, mask = torch.ones(1, dtype=D), torch.ones(1, 1)
    assert dapo_loss(lp, old, one, mask, 0.2, 0.2).item() == pytest.approx(-1.2, abs=1e-15)
    assert dapo_loss(lp, old, one, mask, 0.2, 0.28).item() == pytest.approx(-1.25, abs=1e-15)


def test_dapo_micro_batches_add_up_to_the_batch():
    logprobs, old, _, adv, mask = _batch(70)
    x = logprobs.clone().requires_grad_()
    full = dapo_loss(x, old, adv, mask)
    n = int(mask.sum())
    parts = sum(dapo_loss(x[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], num_tokens=n) for i in (0, 2))
    assert abs(full - parts).item() < 1e-15
    (g_full,) = torch.autograd.grad(full, x)
    (g_parts,) = torch.autograd.grad(parts, x)
    torch.testing.assert_close(g_parts, g_full, rtol=0, atol=1e-15)


def test_dapo_gradcheck():
    logprobs, _, _, adv, mask = _batch(75)
    old = logprobs + randn(B, T, seed=76, scale=0.05)

    def f(x):
        return dapo_loss(x, old, adv, mask, 0.05, 0.08, num_tokens=30)

    assert torch.autograd.gradcheck(f, (logprobs.clone().requires_grad_(),))


@pytest.mark.parametrize("num_tokens", [None, 40])
def test_dapo_matches_trl(trl, num_tokens):
    """Peer: trl ``loss_type="dapo"``, ``epsilon_low=0.2``, ``epsilon_high=0.28``, beta = 0, with
    ``num_items_in_batch`` the batch's token count (or a larger count: a micro-batch)."""
    logprobs, old, _, adv, mask = _batch(80)
    count = int(mask.sum()) if num_tokens is None else num_tokens
    theirs, logged = _trl_loss(trl, "dapo", "token", logprobs, old, None, adv, mask, 0.0, 0.2, 0.28,
                               num_items_in_batch=count)
    ours = dapo_loss(logprobs, old, adv, mask, num_tokens=num_tokens)
    assert abs(theirs - ours).item() < 1e-12
    assert logged["clip_ratio/high_mean"][0] > 0  # clip-higher is active on this batch


def test_dapo_bad_inputs():
    logprobs, old, _, adv, mask = _batch(90)
    with pytest.raises(ValueError, match="num_tokens"):
        dapo_loss(logprobs, old, adv, mask, num_tokens=3)
    with pytest.raises(ValueError, match="num_tokens"):
        dapo_loss(logprobs, old, adv, mask, num_tokens=0)
    with pytest.raises(ValueError, match="no ones"):
        dapo_loss(logprobs, old, adv, torch.zeros(B, T))
    with pytest.raises(ValueError, match="clip_eps_high"):
        dapo_loss(logprobs, old, adv, mask, 0.2, -0.1)


# ---------------------------------------------------------------- the variant table


def test_variant_loss_special_cases():
    logprobs, old, _, _, mask = _batch(100)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=D)  # the second group is all right
    adv = group_normalized_rewards(rewards, 2)
    adv0 = group_normalized_rewards(rewards, 2, normalize_std=False)
    assert variant_loss("grpo", logprobs, old, rewards, 2, mask) == \
        grpo_loss(logprobs, old, None, adv, mask, 0.2, 0.0, "sequence_mean").loss
    assert variant_loss("dr_grpo", logprobs, old, rewards, 2, mask, max_length=10) == \
        grpo_loss(logprobs, old, None, adv0, mask, 0.2, 0.0, "constant", max_length=10).loss
    # DAPO keeps only the informative first group: its tokens alone are the token mean's denominator
    assert variant_loss("dapo", logprobs, old, rewards, 2, mask) == dapo_loss(logprobs[:2], old[:2], adv[:2], mask[:2])
    assert variant_loss("gspo", logprobs, old, rewards, 2, mask) == \
        gspo_loss(logprobs, old, None, adv, mask, 3e-4, 0.0, 4e-4).loss
    x = logprobs.clone().requires_grad_()
    silent = variant_loss("dapo", x, old, torch.ones(4, dtype=D), 2, mask)
    assert silent.item() == 0 and torch.autograd.grad(silent, x)[0].abs().sum() == 0
    with pytest.raises(ValueError, match="variant"):
        variant_loss("ppo", logprobs, old, rewards, 2, mask)
    assert set(VARIANTS) == {"grpo", "dr_grpo", "dapo", "gspo"}


# ---------------------------------------------------------------- Dr. GRPO: the std bias


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("p,G", [(0.3, 2), (0.1, 4), (0.7, 5)])
def test_expected_group_gradient_equals_brute_force(p, G, normalize_std):
    """Closed sum over c ~ Binomial(G, p) against all 2^G outcomes with autograd."""
    assert expected_group_gradient(p, G, normalize_std) == \
        pytest.approx(expected_group_gradient_enumerated(p, G, normalize_std), abs=1e-13)


def test_without_std_the_update_is_the_true_gradient_times_g_minus_one():
    for G in (2, 3, 8, 16):
        for p in (0.05, 0.3, 0.5, 0.95):
            assert expected_group_gradient(p, G, False) == pytest.approx((G - 1) * p * (1 - p), abs=1e-13)


def test_with_std_the_update_tends_to_the_arcsine_gradient():
    """(G - 1) sqrt(p (1 - p)) for large G: the ratio is within 1 % at G = 256."""
    for p in (0.05, 0.5, 0.9):
        ratio = expected_group_gradient(p, 256, True) / (255 * math.sqrt(p * (1 - p)))
        assert abs(ratio - 1) < 0.01
    # and the std favours the extremes: a p = 0.1 question is pushed harder, relative to its
    # true gradient, than a p = 0.5 one; by 1.25 at G = 8, tending to sqrt(0.25 / 0.09) = 5/3
    def relative(p, G):
        return expected_group_gradient(p, G, True) / expected_group_gradient(p, G, False)
    assert 1.2 < relative(0.1, 8) / relative(0.5, 8) < 1.3
    assert relative(0.1, 256) / relative(0.5, 256) == pytest.approx(5 / 3, rel=0.01)


def test_arcsine_objective_symbolic():
    d = arcsine_objective_symbolic()
    p, G = d["p"], d["G"]
    assert sp.simplify(d["no_std"] - (G - 1) * p * (1 - p)) == 0
    assert sp.simplify(d["dF_dtheta"] - sp.sqrt(p * (1 - p))) == 0
    # the expected c (1 - c/G) by an explicit binomial sum for G = 6
    explicit = sum(sp.binomial(6, c) * p**c * (1 - p) ** (6 - c) * c * (1 - sp.Rational(c, 6)) for c in range(7))
    assert sp.expand(explicit - d["no_std"].subs(G, 6)) == 0


def test_expected_group_gradient_bad_inputs():
    with pytest.raises(ValueError, match="p must"):
        expected_group_gradient(0.0, 4, True)
    with pytest.raises(ValueError, match="group_size"):
        expected_group_gradient(0.5, 1, True)
    with pytest.raises(TypeError, match="group_size"):
        expected_group_gradient_enumerated(0.5, 2.0, True)


# ---------------------------------------------------------------- training on the arithmetic task


def test_train_variant_smoke():
    """Two steps of each variant on a small batch: the curves have their lengths, DAPO keeps
    only informative groups (and samples more to refill), the others sample exactly one round."""
    from llmbook.alignment.rl_variants import VARIANT_RECIPE, train_variant

    recipe = {**VARIANT_RECIPE, "steps": 2, "prompts_per_step": 4, "group_size": 4, "eval_every": 2, "warmup_steps": 1,
              "eval_samples": 1}
    for variant in ("grpo", "dapo"):
        out = train_variant(variant, recipe)
        curve = out["curve"]
        assert len(curve["reward"]) == len(curve["generated"]) == 2
        assert curve["eval_steps"] == [0, 2] and 0 <= out["greedy"] <= 1 and 0 <= out["sampled"] <= 1
        if variant == "grpo":
            assert curve["generated"] == [16, 16] and curve["kept_groups"] == [4, 4]
        else:
            assert all(16 <= n <= 48 for n in curve["generated"]) and all(k <= 4 for k in curve["kept_groups"])
    with pytest.raises(ValueError, match="variant"):
        train_variant("ppo", recipe)


# ---------------------------------------------------------------- explicit reductions (issue 24)


def test_gspo_reductions_worked_example():
    """On-policy, s = 1: the per-sequence loss is -A_i; "sum" and "none" besides the mean."""
    lp = torch.zeros(3, 4, dtype=D)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=D)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    assert gspo_loss(lp, None, None, adv, mask, 0.2, 0.0).loss.item() == 0.5 / 3
    assert gspo_loss(lp, None, None, adv, mask, 0.2, 0.0, reduction="sum").loss.item() == 0.5
    torch.testing.assert_close(gspo_loss(lp, None, None, adv, mask, 0.2, 0.0, reduction="none").loss, -adv)
    # with the KL term, "none" keeps each sequence's own beta * token mean of k3
    ref = -torch.rand(3, 4, generator=gen(5), dtype=D)
    k3 = torch.exp(ref - lp) - (ref - lp) - 1
    per_seq_kl = torch.stack([k3[i][mask[i].bool()].mean() for i in range(3)])
    got = gspo_loss(lp, None, ref, adv, mask, 0.2, 0.1, reduction="none").loss
    torch.testing.assert_close(got, -adv + 0.1 * per_seq_kl)
    assert gspo_loss(lp, None, ref, adv, mask, 0.2, 0.1).loss.item() == pytest.approx(got.mean().item(), abs=1e-15)
    with pytest.raises(ValueError, match="reduction must be one of"):
        gspo_loss(lp, None, None, adv, mask, 0.2, 0.0, reduction="token_mean")


def test_dapo_reductions():
    lp = torch.zeros(2, 4, dtype=D)
    adv = torch.tensor([1.0, -2.0], dtype=D)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert dapo_loss(lp, None, adv, mask).item() == pytest.approx(0.8, abs=1e-15)  # (-2 + 6) / 5
    assert dapo_loss(lp, None, adv, mask, reduction="sum").item() == 4.0
    assert dapo_loss(lp, None, adv, mask, reduction="sequence_mean").item() == 0.5
    torch.testing.assert_close(dapo_loss(lp, None, adv, mask, reduction="none"),
                               torch.tensor([[-1.0, -1.0, 0, 0], [2.0, 2.0, 2.0, 0]], dtype=D))
    assert dapo_loss(lp, None, adv, mask, num_tokens=10).item() == pytest.approx(0.4, abs=1e-15)
    with pytest.raises(ValueError, match="num_tokens applies"):
        dapo_loss(lp, None, adv, mask, num_tokens=10, reduction="sum")
    with pytest.raises(ValueError, match="pass num_tokens"):
        dapo_loss(lp, None, adv, mask, reduction="constant")
    with pytest.raises(ValueError, match="reduction must be one of"):
        dapo_loss(lp, None, adv, mask, reduction="mean")
