"""Tests for llmbook.alignment.dpo: the closed-form optimum, the batched DPO loss and step,
the hand-derived gradient, the implicit reward, correlations, the shipped run.

The model-level tests use a tiny float64 TransformerLM (V = 13, d = 8, one layer), with
prompts and responses of different lengths (P = 3, R = 5) so that a swapped axis cannot
hide. The peers: torch autograd for every hand-derived gradient, pandas (``DataFrame.corr``)
for the correlations, and :func:`llmbook.alignment.losses.dpo_loss` (itself tested against trl
1.16) for the batched loss.
"""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.dpo import (
    DPO_RECIPE,
    DPOBatch,
    comparison_rows,
    dpo_batch_loss,
    dpo_logprob_gradients,
    dpo_step,
    expected_dpo_loss,
    implicit_reward,
    kl_regularized_objective,
    load_dpo_policy,
    log_partition,
    optimal_policy,
    ppo_compute_to_reward,
    reference_logprobs,
    reward_correlation,
    sequence_logprobs,
    train_dpo,
)
from llmbook.alignment.losses import dpo_loss
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

D = torch.float64
N, P, R, V = 4, 3, 5, 13


def tiny_model(seed: int = 0) -> TransformerLM:
    cfg = TransformerConfig.gpt2_style(vocab_size=V, d_model=8, n_layers=1, n_heads=2, max_seq_len=16)
    return TransformerLM(cfg, generator=gen(seed)).double()


def perturbed(model: TransformerLM, seed: int, scale: float = 0.3) -> TransformerLM:
    """A copy of ``model`` with every parameter moved by scale * N(0, 1): a trained 'policy'."""
    out = copy.deepcopy(model)
    g = gen(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return out


def batch(seed: int = 1, n: int = N):
    g = gen(seed)
    return (torch.randint(0, V, (n, P), generator=g), torch.randint(0, V, (n, R), generator=g),
            torch.randint(0, V, (n, R), generator=g))


def simplex(k: int, seed: int) -> torch.Tensor:
    return torch.softmax(torch.randn(k, generator=gen(seed), dtype=D), -1)


# ---------------------------------------------------------------- the closed form


def test_optimal_policy_worked_example():
    ref = torch.tensor([0.5, 0.25, 0.25], dtype=D)
    r = torch.tensor([0.0, math.log(2), 0.0], dtype=D)
    # unnormalised 0.5, 0.25 * 2, 0.25 -> Z = 1.25
    assert torch.allclose(optimal_policy(ref, r, 1.0), torch.tensor([0.4, 0.4, 0.2], dtype=D), atol=1e-15)
    assert log_partition(ref, r, 1.0).item() == pytest.approx(math.log(1.25), abs=1e-15)
    # beta = 1/2 squares the tilt: 0.5, 1.0, 0.25 -> Z = 1.75
    assert torch.allclose(optimal_policy(ref, r, 0.5), torch.tensor([2, 4, 1], dtype=D) / 7, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 7), st.integers(0, 10_000), st.floats(0.05, 5.0))
def test_optimal_policy_maximises_the_objective(k, seed, beta):
    ref = simplex(k, seed)
    r = torch.randn(k, generator=gen(seed + 1), dtype=D)
    star = optimal_policy(ref, r, beta)
    best = kl_regularized_objective(star, ref, r, beta)
    assert best.item() == pytest.approx(beta * log_partition(ref, r, beta).item(), abs=1e-12)
    other = simplex(k, seed + 2)
    # Gibbs: J(pi) = beta log Z - beta KL(pi || pi*), so every other policy does worse
    kl = (other * (other.log() - star.log())).sum()
    assert kl_regularized_objective(other, ref, r, beta).item() == pytest.approx(
        (best - beta * kl).item(), abs=1e-12)
    assert kl_regularized_objective(other, ref, r, beta) <= best + 1e-12


def test_optimal_policy_batched_and_zero_reference_mass():
    ref = torch.stack([simplex(4, 0), torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=D)])  # (2, 4)
    r = torch.randn(2, 4, generator=gen(3), dtype=D)
    star = optimal_policy(ref, r, 0.3)
    assert star.shape == (2, 4)
    assert torch.allclose(star.sum(-1), torch.ones(2, dtype=D))
    assert star[1, 1] == 0 and star[1, 3] == 0  # pi* never leaves the support of pi_ref
    assert torch.allclose(star[0], optimal_policy(ref[0], r[0], 0.3))
    # the objective handles pi = 0 entries (0 log 0 = 0) and is E_ref[r] at pi = pi_ref
    assert torch.allclose(kl_regularized_objective(ref, ref, r, 0.3), (ref * r).sum(-1))
    assert torch.isfinite(kl_regularized_objective(star, ref, r, 0.3)).all()


def test_large_reward_over_beta_does_not_overflow():
    ref = simplex(3, 0)
    star = optimal_policy(ref, torch.tensor([1000.0, 0.0, 0.0], dtype=D), 0.01)
    assert torch.allclose(star, torch.tensor([1.0, 0.0, 0.0], dtype=D))


def test_closed_form_bad_input():
    ref, r = simplex(3, 0), torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="beta"):
        optimal_policy(ref, r, 0.0)
    with pytest.raises(ValueError, match="beta"):
        log_partition(ref, r, -1.0)
    with pytest.raises(TypeError, match="beta"):
        optimal_policy(ref, r, "0.1")
    with pytest.raises(ValueError, match="shape"):
        optimal_policy(ref, torch.zeros(4, dtype=D), 1.0)
    with pytest.raises(ValueError, match="probabilities"):
        optimal_policy(torch.tensor([0.5, 0.6, -0.1], dtype=D), r, 1.0)
    with pytest.raises(ValueError, match="probabilities"):
        kl_regularized_objective(torch.tensor([0.5, 0.2, 0.2], dtype=D), ref, r, 1.0)
    with pytest.raises(TypeError, match="floating"):
        optimal_policy(torch.tensor([1, 0, 0]), r, 1.0)
    with pytest.raises(ValueError, match="shape of policy_probs"):
        kl_regularized_objective(ref, ref, torch.zeros(2, dtype=D), 1.0)


def test_expected_dpo_loss_worked_example():
    """Two responses, pi = pi_ref: every log sigma(0) = -log 2, the weights sum to 1."""
    ref = torch.tensor([0.75, 0.25], dtype=D)
    r = torch.tensor([1.0, 0.0], dtype=D)
    got = expected_dpo_loss(ref, ref, r, 0.5)
    assert got.item() == pytest.approx(math.log(2), abs=1e-15)
    # pi = pi* of the doubled reward when bt_scale = 2; the loss is then smallest there
    star2 = optimal_policy(ref, 2 * r, 0.5)
    assert expected_dpo_loss(star2, ref, r, 0.5, bt_scale=2.0) < expected_dpo_loss(ref, ref, r, 0.5, 2.0)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000), st.floats(0.1, 3.0), st.floats(0.5, 2.0))
def test_expected_dpo_loss_is_minimised_by_the_optimal_policy(k, seed, beta, scale):
    """The gradient in the logits vanishes at pi* = optimal_policy(pi_ref, s r, beta)."""
    ref = simplex(k, seed)
    r = torch.randn(k, generator=gen(seed + 1), dtype=D)
    logits = torch.log(optimal_policy(ref, scale * r, beta)).requires_grad_(True)
    (grad,) = torch.autograd.grad(expected_dpo_loss(torch.softmax(logits, -1), ref, r, beta, scale), logits)
    assert grad.abs().max() < 1e-12
    other = simplex(k, seed + 2)
    assert expected_dpo_loss(other, ref, r, beta, scale) >= expected_dpo_loss(
        optimal_policy(ref, scale * r, beta), ref, r, beta, scale) - 1e-12


def test_expected_dpo_loss_bad_input():
    ref, r = simplex(3, 0), torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="beta"):
        expected_dpo_loss(ref, ref, r, 0.0)
    with pytest.raises(ValueError, match="bt_scale"):
        expected_dpo_loss(ref, ref, r, 1.0, bt_scale=-1.0)
    with pytest.raises(ValueError, match="1-d"):
        expected_dpo_loss(ref[None], ref[None], r[None], 1.0)
    with pytest.raises(ValueError, match="shape of policy_probs"):
        expected_dpo_loss(ref, ref, torch.zeros(4, dtype=D), 1.0)


# ---------------------------------------------------------------- sequence log-probabilities


def test_sequence_logprobs_by_hand_and_in_chunks():
    model = tiny_model()
    prompts, chosen, _ = batch(n=5)
    seq = sequence_logprobs(model, prompts, chosen)
    assert seq.shape == (5,)
    logits = model(torch.cat([prompts, chosen], 1))  # (5, P + R, V)
    logp = torch.log_softmax(logits, -1)
    by_hand = sum(logp[:, P - 1 + t].gather(-1, chosen[:, t:t + 1])[:, 0] for t in range(R))
    assert torch.allclose(seq, by_hand, atol=1e-13)
    assert torch.allclose(sequence_logprobs(model, prompts, chosen, batch_size=2), seq, atol=1e-13)
    assert seq.requires_grad  # differentiable without batch_size


def test_reference_logprobs_no_grad_and_mode_restored():
    model = tiny_model().train()
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(model, prompts, chosen, rejected, batch_size=3)
    assert ref_c.shape == ref_r.shape == (N,) and not ref_c.requires_grad
    assert torch.allclose(ref_c, sequence_logprobs(model, prompts, chosen).detach(), atol=1e-13)
    assert torch.allclose(ref_r, sequence_logprobs(model, prompts, rejected).detach(), atol=1e-13)
    assert model.training


def test_sequence_logprobs_bad_input():
    model = tiny_model()
    prompts, chosen, rejected = batch()
    with pytest.raises(ValueError, match="empty"):
        sequence_logprobs(model, prompts[:0], chosen[:0])
    with pytest.raises(ValueError, match="rows"):
        sequence_logprobs(model, prompts, chosen[:3])
    with pytest.raises(TypeError, match="integer"):
        sequence_logprobs(model, prompts.double(), chosen)
    with pytest.raises(ValueError, match="2-d"):
        sequence_logprobs(model, prompts[0], chosen)
    with pytest.raises(ValueError, match="batch_size"):
        sequence_logprobs(model, prompts, chosen, batch_size=0)
    with pytest.raises(ValueError, match="shape of chosen"):
        reference_logprobs(model, prompts, chosen, rejected[:, :2])


# ---------------------------------------------------------------- the DPO loss of a batch


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_batch_loss_equals_dpo_loss_on_sequence_logprobs(loss_type):
    reference = tiny_model()
    policy = perturbed(reference, 5)
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    out = dpo_batch_loss(policy, prompts, chosen, rejected, ref_c, ref_r, 0.2, loss_type)
    assert isinstance(out, DPOBatch) and out.loss.shape == () and out.chosen_rewards.shape == (N,)
    lengths = torch.full((N,), float(R), dtype=D) if loss_type == "ipo" else None
    want, r_w, r_l = dpo_loss(sequence_logprobs(policy, prompts, chosen),
                              sequence_logprobs(policy, prompts, rejected), ref_c, ref_r, 0.2,
                              loss_type, chosen_lengths=lengths, rejected_lengths=lengths)
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-13)
    assert torch.allclose(out.chosen_rewards, r_w, atol=1e-13)
    assert torch.allclose(out.rejected_rewards, r_l, atol=1e-13)
    assert out.accuracy == float((r_w > r_l).double().mean())


def test_batched_loss_is_the_mean_of_per_pair_losses():
    reference = tiny_model()
    policy = perturbed(reference, 6)
    prompts, chosen, rejected = batch(n=6)
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    per_pair = dpo_batch_loss(policy, prompts, chosen, rejected, ref_c, ref_r, 0.5, reduction="none").loss
    one_by_one = torch.stack([
        dpo_batch_loss(policy, prompts[i:i + 1], chosen[i:i + 1], rejected[i:i + 1], ref_c[i:i + 1],
                       ref_r[i:i + 1], 0.5).loss for i in range(6)])
    assert per_pair.shape == (6,)
    assert torch.allclose(per_pair, one_by_one, atol=1e-13)
    mean = dpo_batch_loss(policy, prompts, chosen, rejected, ref_c, ref_r, 0.5).loss
    assert mean.item() == pytest.approx(one_by_one.mean().item(), abs=1e-13)
    total = dpo_batch_loss(policy, prompts, chosen, rejected, ref_c, ref_r, 0.5, reduction="sum").loss
    assert total.item() == pytest.approx(one_by_one.sum().item(), abs=1e-12)


def test_policy_equal_to_reference_gives_log_2():
    model = tiny_model()
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(model, prompts, chosen, rejected)
    out = dpo_batch_loss(model, prompts, chosen, rejected, ref_c, ref_r, 0.1)
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-13)
    assert torch.allclose(out.chosen_rewards, torch.zeros(N, dtype=D), atol=1e-13)
    assert out.accuracy == 0.0  # ties are not counted as right


def test_parameter_gradient_is_the_weighted_sum_of_logprob_gradients():
    """Chain rule: dL/dtheta = sum_i g_w,i dlog pi(y_w,i)/dtheta + g_l,i dlog pi(y_l,i)/dtheta."""
    reference = tiny_model()
    policy = perturbed(reference, 7)
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    params = list(policy.parameters())
    loss = dpo_batch_loss(policy, prompts, chosen, rejected, ref_c, ref_r, 0.3).loss
    autograd = torch.autograd.grad(loss, params)
    lw, ll = sequence_logprobs(policy, prompts, chosen), sequence_logprobs(policy, prompts, rejected)
    g_w, g_l = dpo_logprob_gradients(lw.detach(), ll.detach(), ref_c, ref_r, 0.3)
    by_hand = torch.autograd.grad((g_w * lw).sum() + (g_l * ll).sum(), params)
    for a, b in zip(autograd, by_hand, strict=True):
        assert torch.allclose(a, b, atol=1e-14)


def test_dpo_batch_loss_gradcheck_through_the_model():
    """Finite differences against autograd, through the whole model, in float64."""
    reference = tiny_model()
    policy = perturbed(reference, 8)
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    w0 = policy.final_norm.weight.detach().clone().requires_grad_(True)  # (d,)

    def loss(w):
        return _loss_with_gain(policy, w, prompts, chosen, rejected, ref_c, ref_r)

    assert torch.autograd.gradcheck(loss, (w0,), eps=1e-6, atol=1e-8)


def _loss_with_gain(policy, w, prompts, chosen, rejected, ref_c, ref_r):
    """The DPO loss as a function of the final norm's gain w (functional_call, no mutation)."""
    params = dict(policy.named_parameters())
    params["final_norm.weight"] = w

    def model(ids):
        return torch.func.functional_call(policy, params, (ids,))

    return dpo_batch_loss(model, prompts, chosen, rejected, ref_c, ref_r, 0.4).loss


def test_dpo_batch_loss_bad_input():
    model = tiny_model()
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(model, prompts, chosen, rejected)
    with pytest.raises(ValueError, match="beta"):
        dpo_batch_loss(model, prompts, chosen, rejected, ref_c, ref_r, 0.0)
    with pytest.raises(ValueError, match="beta"):
        dpo_batch_loss(model, prompts, chosen, rejected, ref_c, ref_r, -0.1)
    with pytest.raises(ValueError, match="shape of chosen"):
        dpo_batch_loss(model, prompts, chosen, rejected[:3], ref_c, ref_r, 0.1)
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        dpo_batch_loss(model, prompts, chosen, rejected, ref_c, ref_r[:3], 0.1)
    with pytest.raises(ValueError, match="ref_chosen_logps"):
        dpo_batch_loss(model, prompts, chosen, rejected, ref_c[:, None], ref_r, 0.1)
    with pytest.raises(ValueError, match="empty"):
        dpo_batch_loss(model, prompts[:0], chosen[:0], rejected[:0], ref_c[:0], ref_r[:0], 0.1)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_batch_loss(model, prompts, chosen, rejected, ref_c, ref_r, 0.1, loss_type="hinge")
    with pytest.raises(TypeError, match="floating"):
        dpo_batch_loss(model, prompts, chosen, rejected, ref_c.long(), ref_r, 0.1)


# ---------------------------------------------------------------- the optimiser step


def test_dpo_step_lowers_the_loss_and_reports_before_the_step():
    reference = tiny_model()
    policy = perturbed(reference, 9, scale=0.0)  # starts equal to the reference
    prompts, chosen, rejected = batch(n=8)
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    opt = torch.optim.Adam(policy.parameters(), lr=0.02)
    first = dpo_step(policy, opt, prompts, chosen, rejected, ref_c, ref_r, 0.5, grad_clip=1.0)
    assert set(first) == {"loss", "accuracy", "chosen_reward", "rejected_reward", "grad_norm"}
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-12) and first["accuracy"] == 0.0
    for _ in range(20):
        last = dpo_step(policy, opt, prompts, chosen, rejected, ref_c, ref_r, 0.5)
    assert last["loss"] < first["loss"] - 0.1
    assert last["accuracy"] > 0.5
    assert last["chosen_reward"] > last["rejected_reward"]
    with pytest.raises(ValueError, match="grad_clip"):
        dpo_step(policy, opt, prompts, chosen, rejected, ref_c, ref_r, 0.5, grad_clip=0)


def test_dpo_step_clips_the_gradient():
    reference = tiny_model()
    policy = perturbed(reference, 10)
    prompts, chosen, rejected = batch()
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    before = [p.detach().clone() for p in policy.parameters()]
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    stats = dpo_step(policy, opt, prompts, chosen, rejected, ref_c, ref_r, 5.0, grad_clip=1e-3)
    assert stats["grad_norm"] > 1e-3  # reported before clipping
    moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(policy.parameters(), before, strict=True)))
    assert moved.item() == pytest.approx(1e-3, rel=1e-3)  # SGD with lr 1 moves by the clipped norm


# ---------------------------------------------------------------- the hand-derived gradient


def test_dpo_logprob_gradients_worked_example():
    zero = torch.zeros(3, dtype=D)
    g_w, g_l = dpo_logprob_gradients(zero, zero, zero, zero, 0.1)  # every margin 0: weight 1/2
    assert torch.allclose(g_w, torch.full((3,), -0.1 * 0.5 / 3, dtype=D), atol=1e-17)
    assert torch.allclose(g_l, -g_w)
    # a pair ranked rightly by a wide margin hardly counts; one ranked wrongly counts fully
    lw = torch.tensor([50.0, -50.0], dtype=D)
    g_w, _ = dpo_logprob_gradients(lw, torch.zeros(2, dtype=D), torch.zeros(2, dtype=D),
                                   torch.zeros(2, dtype=D), 1.0)
    assert abs(g_w[0].item()) < 1e-20 and g_w[1].item() == pytest.approx(-0.5, abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000), st.floats(0.01, 3.0))
def test_dpo_logprob_gradients_match_autograd(n, seed, beta):
    lw, ll, rw, rl = (torch.randn(n, generator=gen(seed + i), dtype=D) * 3 - 20 for i in range(4))  # log-probs <= 0
    lw.requires_grad_(True)
    ll.requires_grad_(True)
    loss, _, _ = dpo_loss(lw, ll, rw, rl, beta)
    auto_w, auto_l = torch.autograd.grad(loss, (lw, ll))
    g_w, g_l = dpo_logprob_gradients(lw.detach(), ll.detach(), rw, rl, beta)
    assert torch.allclose(g_w, auto_w, atol=1e-15) and torch.allclose(g_l, auto_l, atol=1e-15)


def test_dpo_logprob_gradients_bad_input():
    x = torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="beta"):
        dpo_logprob_gradients(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match="shape"):
        dpo_logprob_gradients(x, torch.zeros(2, dtype=D), x, x, 0.1)


# ---------------------------------------------------------------- the implicit reward


def test_implicit_reward():
    reference = tiny_model()
    policy = perturbed(reference, 11)
    prompts, chosen, _ = batch(n=5)
    got = implicit_reward(policy, reference, prompts, chosen, 0.25, batch_size=2)
    want = 0.25 * (sequence_logprobs(policy, prompts, chosen) - sequence_logprobs(reference, prompts, chosen))
    assert got.shape == (5,) and not got.requires_grad
    assert torch.allclose(got, want.detach(), atol=1e-13)
    assert torch.equal(implicit_reward(reference, reference, prompts, chosen, 0.25), torch.zeros(5, dtype=D))
    with pytest.raises(ValueError, match="beta"):
        implicit_reward(policy, reference, prompts, chosen, 0.0)
    with pytest.raises(ValueError, match="rows"):
        implicit_reward(policy, reference, prompts[:2], chosen, 0.1)


# ---------------------------------------------------------------- correlations


def test_reward_correlation_worked_example():
    p, s = reward_correlation(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 4.0, 9.0, 16.0]))
    assert s == pytest.approx(1.0, abs=1e-15)  # monotone: ranks agree exactly
    assert p == pytest.approx(0.984374038697, abs=1e-11)  # 30 / sqrt(5 * 187.5) ... by hand
    p, s = reward_correlation(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([0.0, 0.0, 1.0]))
    # ranks (3, 2, 1) and (1.5, 1.5, 3): Pearson of those
    assert s == pytest.approx(-0.8660254037844386, abs=1e-15)


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 40), st.integers(0, 10_000))
def test_reward_correlation_matches_pandas_with_ties(n, seed):
    pd = pytest.importorskip("pandas")
    g = gen(seed)
    true = torch.randint(0, 3, (n,), generator=g).double()  # many ties, as in the keyword reward
    pred = torch.round(torch.randn(n, generator=g, dtype=D) * 2) / 2 + 0.3 * true
    if true.std() == 0 or pred.std() == 0:
        true[0], pred[0] = true[0] + 1, pred[0] + 1
    p, s = reward_correlation(pred, true)
    frame = pd.DataFrame({"pred": pred.numpy(), "true": true.numpy()})
    assert p == pytest.approx(frame.corr(method="pearson").iloc[0, 1], abs=1e-12)
    assert s == pytest.approx(frame.corr(method="spearman").iloc[0, 1], abs=1e-12)


def test_reward_correlation_bad_input():
    with pytest.raises(ValueError, match="constant"):
        reward_correlation(torch.ones(4), torch.arange(4.0))
    with pytest.raises(ValueError, match="one shape"):
        reward_correlation(torch.arange(4.0), torch.arange(5.0))
    with pytest.raises(ValueError, match="at least 2"):
        reward_correlation(torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match="1-d"):
        reward_correlation(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(TypeError, match="predicted"):
        reward_correlation([1.0, 2.0], torch.ones(2))


# ---------------------------------------------------------------- the head-to-head table


def fake_ppo_info():
    """The keys chapter 18's artifact documents: history, final, compute."""
    return {"history": {"reward_mean": [0.3, 0.9, 1.4], "kl_mean": [0.0, 1.0, 2.5]},
            "final": {"reward": 1.5, "kl": 2.75, "kl_stderr": 0.1, "num": 512},
            "compute": {"wall_seconds": 200.0, "forward_tokens": 10, "backward_tokens": 5,
                        "generated_tokens": 7}}


def test_comparison_rows_on_fake_infos():
    dpo = {"final": {"reward": 1.25, "kl": 4.5, "kl_stderr": 0.2}, "base": {"reward": 0.33, "kl": 0.0},
           "compute": {"wall_seconds": 100.0, "forward_tokens": 3, "backward_tokens": 2, "generated_tokens": 0}}
    rows = comparison_rows({"base": None, "DPO": dpo, "PPO": fake_ppo_info()})
    assert [r["name"] for r in rows] == ["base", "DPO", "PPO"]
    assert rows[0] == {"name": "base", "reward": 0.33, "kl": 0.0, "kl_stderr": 0.0, "wall_seconds": 0.0,
                       "forward_tokens": 0, "backward_tokens": 0, "generated_tokens": 0}
    assert rows[1]["reward"] == 1.25 and rows[1]["kl"] == 4.5 and rows[1]["wall_seconds"] == 100.0
    assert rows[2]["reward"] == 1.5 and rows[2]["generated_tokens"] == 7
    no_compute = {"final": {"reward": 1.0, "kl": 1.0, "kl_stderr": 0.0}}
    assert comparison_rows({"x": no_compute})[0]["wall_seconds"] is None


def test_comparison_rows_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        comparison_rows({})
    with pytest.raises(ValueError, match="base"):
        comparison_rows({"base": None})
    with pytest.raises(ValueError, match="final"):
        comparison_rows({"PPO": {"history": {}}})
    with pytest.raises(ValueError, match="kl_stderr"):
        comparison_rows({"PPO": {"final": {"reward": 1.0, "kl": 0.5}}})


# ---------------------------------------------------------------- the shipped run


def test_train_dpo_small_recipe_runs_and_reports():
    recipe = {**DPO_RECIPE, "num_pairs": 32, "batch_pairs": 16, "epochs": 1, "eval_every": 1,
              "num_eval_prompts": 4, "num_test_pairs": 8, "warmup_steps": 1}
    tensors, info = train_dpo(recipe)
    assert info["compute"]["steps"] == 2
    assert len(info["history"]["loss"]) == 2 and info["path"]["step"] == [0, 1, 2]
    assert info["history"]["loss"][0] == pytest.approx(math.log(2), abs=1e-6)  # policy = reference
    assert info["path"]["kl"][0] == 0.0 and info["path"]["kl"][-1] != 0.0
    assert tensors["test_implicit_reward"].shape == (16,)
    assert info["compute"]["backward_tokens"] == 2 * 2 * 16 * 32
    assert info["compute"]["forward_tokens"] == 2 * 32 * 32 + 2 * 2 * 16 * 32
    adapters = [k for k in tensors if k.endswith(("lora_A", "lora_B"))]
    assert len(adapters) == 2 * 6 * 4  # A and B on six linear layers of four blocks
    assert any(tensors[k].abs().max() > 0 for k in adapters if k.endswith("lora_B"))
    assert -1 <= info["test"]["pearson"] <= 1 and 0 <= info["test"]["pair_accuracy"] <= 1


def test_load_dpo_policy_matches_the_shipped_numbers():
    from llmbook.alignment.preferences import preference_data

    policy, reference, info = load_dpo_policy()
    assert info["recipe"] == DPO_RECIPE
    assert not any(p.requires_grad for p in policy.parameters())
    test = preference_data("test")
    k = 16
    got = implicit_reward(policy, reference, test.prompts[:k], test.chosen[:k], DPO_RECIPE["beta"])
    from llmbook.alignment.shipped import load_artifact

    stored = load_artifact("dpo")[0]["test_implicit_reward"][:k]
    assert torch.allclose(got, stored, atol=1e-4)
    assert info["final"]["reward"] > info["base"]["reward"]


# ---------------------------------------------------------------- PPO's compute to a reward


def _fake_ppo_info(rewards, kls, wall=12.0):
    n = len(rewards)
    return {"history": {"reward_mean": rewards, "kl_mean": kls},
            "compute": {"iterations": n, "wall_seconds": wall, "forward_tokens": 70 * n,
                        "backward_tokens": 40 * n, "generated_tokens": 24 * n}}


def test_ppo_compute_to_reward_worked_example():
    info = _fake_ppo_info([0.0, 1.0, 0.0, 2.0, 3.0, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], wall=6.0)
    # trailing means over 2: 0.5, 0.5, 1.0, 2.5, 1.75 -> first >= 1 at iteration 4
    out = ppo_compute_to_reward(info, 1.0, window=2)
    assert out == {"iterations": 4, "reward": 1.0, "kl": pytest.approx(0.35, abs=1e-15),
                   "wall_seconds": 4.0, "forward_tokens": 280, "backward_tokens": 160,
                   "generated_tokens": 96}
    # window 1: the first single iteration >= 1 is the second
    assert ppo_compute_to_reward(info, 1.0, window=1)["iterations"] == 2
    assert ppo_compute_to_reward(info, 2.6, window=2) is None
    assert ppo_compute_to_reward(info, 0.0, window=7) is None  # window longer than the run


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 5), min_size=1, max_size=20), st.floats(0, 5), st.integers(1, 5))
def test_ppo_compute_to_reward_is_the_first_crossing(rewards, target, window):
    info = _fake_ppo_info(rewards, [0.0] * len(rewards))
    out = ppo_compute_to_reward(info, target, window)
    means = [sum(rewards[k - window:k]) / window for k in range(window, len(rewards) + 1)]
    crossing = [k for k, m in zip(range(window, len(rewards) + 1), means, strict=True) if m >= target]
    if not crossing:
        assert out is None
    else:
        k = crossing[0]
        assert out["iterations"] == k and out["forward_tokens"] == 70 * k
        assert out["reward"] >= target and all(m < target for m in means[:k - window])


def test_ppo_compute_to_reward_bad_input():
    info = _fake_ppo_info([0.0, 1.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="ppo_info"):
        ppo_compute_to_reward({"history": {}}, 1.0)
    with pytest.raises(TypeError, match="target"):
        ppo_compute_to_reward(info, "1")
    with pytest.raises(ValueError, match="target"):
        ppo_compute_to_reward(info, float("nan"))
    with pytest.raises(ValueError, match="window"):
        ppo_compute_to_reward(info, 1.0, window=0)
    short = _fake_ppo_info([0.0, 1.0], [0.0])
    with pytest.raises(ValueError, match="one entry per iteration"):
        ppo_compute_to_reward(short, 1.0)
    uneven = _fake_ppo_info([0.0, 1.0], [0.0, 0.0])
    uneven["compute"]["forward_tokens"] = 141
    with pytest.raises(ValueError, match="forward_tokens"):
        ppo_compute_to_reward(uneven, 1.0, window=1)


def test_ppo_compute_to_reward_on_the_shipped_ppo_run():
    """Token passes per iteration counted from the PPO recipe, independently of its compute."""
    from llmbook.alignment.shipped import load_artifact

    try:
        _, info = load_artifact("ppo")
    except ValueError:
        pytest.skip("the PPO artifact is not shipped")
    rec = info["recipe"]
    out = ppo_compute_to_reward(info, 0.0, window=1)
    assert out["iterations"] == 1
    seq = 8 + rec["response_tokens"]  # the preference data's prompts have 8 tokens
    # rollout scoring + one pass per epoch, for policy and critic; one reference pass
    assert out["forward_tokens"] == rec["batch_size"] * seq * (2 * (1 + rec["epochs"]) + 1)
    assert out["backward_tokens"] == rec["batch_size"] * seq * 2 * rec["epochs"]
    assert out["generated_tokens"] == rec["batch_size"] * rec["response_tokens"]
