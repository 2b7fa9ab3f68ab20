"""Tests for llmbook.alignment.preference_losses: IPO, KTO, ORPO, SimPO, RLOO.

Worked examples with numbers derived by hand, hypothesis properties (the minimiser of IPO's
expected loss, the zero sum of leave-one-out advantages, the length normalisations), float64
gradient checks, non-square shapes, bad input, and peer tests against trl 1.16.0 on the same
float64 tensors:

* ORPO: ``trl.experimental.orpo.ORPOTrainer.odds_ratio_loss`` and SimPO:
  ``trl.experimental.cpo.CPOTrainer.cpo_loss`` (``loss_type="simpo"``) only need tensors, so
  they are called on an instance built without ``__init__`` (its ``beta``, ``alpha``,
  ``loss_type``, ``simpo_gamma``, ``label_smoothing`` and a CPU ``accelerator`` set by hand);
* IPO: the lines of ``trl/trainer/dpo_trainer.py``, ``DPOTrainer._compute_loss``, branch
  ``loss_type == "ipo"``; KTO: ``trl/trainer/kto_trainer.py``, ``KTOTrainer._compute_loss``
  (the KL estimate and the ``loss_type == "kto"`` branches); RLOO:
  ``trl/trainer/rloo_trainer.py``, ``RLOOTrainer._generate_and_score_completions`` (the
  leave-one-out baseline and ``normalize_advantages``, with trl's own ``nanstd``) and
  ``RLOOTrainer._compute_loss`` (the clipped sequence-level surrogate). These sit inside
  methods that first run a model, so their lines are reproduced in the peer functions below
  (``_trl_*``); ``test_trl_source_still_has_the_reproduced_lines`` fails if trl's source no
  longer contains them.
"""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.alignment.logprobs import sequence_values
from llmbook.alignment.losses import dpo_loss
from llmbook.alignment.preference_losses import (
    PreferenceLoss,
    ipo_loss,
    kto_loss,
    kto_reference_point,
    log_odds,
    orpo_loss,
    rloo_advantages,
    rloo_loss,
    simpo_loss,
)
from llmbook.alignment.trl_peer import Accelerator as _Accelerator

D = torch.float64


def logps(n: int, seed: int, low: float = -4.0, high: float = -0.01) -> torch.Tensor:
    """n float64 log-probabilities drawn uniformly from [low, high] (high < 0)."""
    return low + (high - low) * torch.rand(n, generator=gen(seed), dtype=D)


# ---------------------------------------------------------------- trl


def _bare(cls, **attributes):
    obj = object.__new__(cls)
    obj.__dict__.update(accelerator=_Accelerator(), **attributes)
    return obj


def _trl_ipo(chosen_scores, rejected_scores, chosen_mask, rejected_mask, beta):
    """trl/trainer/dpo_trainer.py, DPOTrainer._compute_loss, loss_type == "ipo" (trl 1.16.0)."""
    chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
    rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
    ipo_delta = chosen_avg_score - rejected_avg_score
    per_sequence_loss = (ipo_delta - 1 / (2 * beta)) ** 2
    return per_sequence_loss.mean()


def _trl_kto(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, KL_logps, ref_KL_logps,
             beta, desirable_weight, undesirable_weight):
    """trl/trainer/kto_trainer.py, KTOTrainer._compute_loss, loss_type == "kto" (trl 1.16.0)."""
    kl = (KL_logps - ref_KL_logps).mean().detach()
    kl = kl.mean().clamp(min=0)
    chosen_logratios = chosen_logps - ref_chosen_logps
    chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
    rejected_logratios = rejected_logps - ref_rejected_logps
    rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
    losses = torch.cat((desirable_weight * chosen_losses, undesirable_weight * rejected_losses), 0)
    return losses.mean(), kl


def _trl_rloo_advantages(rewards, num_generations, normalize, nanstd):
    """trl/trainer/rloo_trainer.py, RLOOTrainer._generate_and_score_completions (trl 1.16.0)."""
    grouped_rewards = rewards.view(-1, num_generations)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)
    baselines = baselines.view(-1)
    advantages = rewards - baselines
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def _trl_rloo_loss(logps, old_logps, advantages, epsilon_low, epsilon_high):
    """trl/trainer/rloo_trainer.py, RLOOTrainer._compute_loss (trl 1.16.0)."""
    log_ratio = logps - old_logps
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_sequence_loss1 = coef_1 * advantages
    per_sequence_loss2 = coef_2 * advantages
    per_sequence_loss = -torch.min(per_sequence_loss1, per_sequence_loss2)
    return per_sequence_loss.mean()


def test_trl_source_still_has_the_reproduced_lines(trl):
    import trl.trainer.dpo_trainer as dpo_mod
    import trl.trainer.kto_trainer as kto_mod
    import trl.trainer.rloo_trainer as rloo_mod

    dpo_src = inspect.getsource(dpo_mod.DPOTrainer._compute_loss)
    for line in ("chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)",
                 "per_sequence_loss = (ipo_delta - 1 / (2 * self.beta)) ** 2"):
        assert line in dpo_src
    kto_src = inspect.getsource(kto_mod.KTOTrainer._compute_loss)
    for line in ("kl = (KL_logps - ref_KL_logps).mean().detach()",
                 "chosen_losses = 1 - F.sigmoid(self.beta * (chosen_logratios - kl))",
                 "rejected_losses = 1 - F.sigmoid(self.beta * (kl - rejected_logratios))",
                 "(self.desirable_weight * chosen_losses, self.undesirable_weight * rejected_losses)"):
        assert line in kto_src
    gen_src = inspect.getsource(rloo_mod.RLOOTrainer._generate_and_score_completions)
    for line in ("baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)",
                 "advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)"):
        assert line in gen_src
    loss_src = inspect.getsource(rloo_mod.RLOOTrainer._compute_loss)
    for line in ("coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)",
                 "per_sequence_loss = -torch.min(per_sequence_loss1, per_sequence_loss2)"):
        assert line in loss_src


# ---------------------------------------------------------------- IPO


def test_ipo_worked_example():
    # h = (-2 - -3) - (-5 - -4) = 2; tau = 0.5: (2 - 1)^2 = 1
    out = ipo_loss(torch.tensor(-2.0, dtype=D), torch.tensor(-5.0, dtype=D),
                   torch.tensor(-3.0, dtype=D), torch.tensor(-4.0, dtype=D), tau=0.5)
    assert isinstance(out, PreferenceLoss)
    assert out.loss.item() == 1.0
    assert out.chosen_rewards.item() == 0.5 and out.rejected_rewards.item() == -0.5
    # lengths 2 and 4: h = 1/2 + 1/4 = 3/4; tau = 1: (3/4 - 1/2)^2 = 1/16
    out = ipo_loss(torch.tensor([-2.0], dtype=D), torch.tensor([-5.0], dtype=D), torch.tensor([-3.0], dtype=D),
                   torch.tensor([-4.0], dtype=D), tau=1.0, chosen_lengths=torch.tensor([2.0]),
                   rejected_lengths=torch.tensor([4]))
    assert out.loss.item() == 1 / 16


def test_ipo_equals_dpo_loss_ipo_and_trl(trl):
    n = 7
    pc, pr, rc, rr = (logps(n, s) for s in range(4))
    lc = torch.tensor([3, 5, 1, 8, 2, 2, 4])
    lr = torch.tensor([6, 1, 2, 2, 7, 3, 4])
    ours = ipo_loss(pc, pr, rc, rr, 0.3, chosen_lengths=lc, rejected_lengths=lr)
    book = dpo_loss(pc, pr, rc, rr, 0.3, loss_type="ipo", chosen_lengths=lc, rejected_lengths=lr)
    torch.testing.assert_close(ours.loss, book[0], rtol=0, atol=1e-15)
    # trl: scores are the summed log-ratios, the masks count tokens (non-square: width 9)
    mc = (torch.arange(9)[None] < lc[:, None]).to(D)
    mr = (torch.arange(9)[None] < lr[:, None]).to(D)
    theirs = _trl_ipo(pc - rc, pr - rr, mc, mr, 0.3)
    torch.testing.assert_close(ours.loss, theirs, rtol=0, atol=1e-14)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 0.99), st.floats(0.05, 5.0))
def test_ipo_expected_loss_is_minimised_at_bounded_margin(p, tau):
    """E loss = p (h - 1/2tau)^2 + (1-p)(-h - 1/2tau)^2 is smallest at h* = (2p-1)/(2tau),
    where it is p (1-p)^2/tau^2 + (1-p) p^2/tau^2 = p (1-p)/tau^2."""
    def expected(h):
        base = torch.full((), -20.0, dtype=D)  # log-probabilities -20 + h stay below 0
        win = ipo_loss(base + h, base, base, base, tau).loss  # y_w labelled preferred: margin h
        lose = ipo_loss(base, base + h, base, base, tau).loss  # the other label: margin -h
        return p * win + (1 - p) * lose

    h_star = (2 * p - 1) / (2 * tau)
    hs = torch.tensor(h_star, dtype=D)
    for dh in (1e-3, -1e-3, 0.5):
        assert expected(hs) <= expected(hs + dh) + 1e-12
    assert expected(hs).item() == pytest.approx(p * (1 - p) / tau**2, rel=1e-9)


def test_ipo_gradcheck():
    args = [logps(5, s).requires_grad_(True) for s in range(4)]
    lc, lr = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([5, 4, 3, 2, 1])
    assert torch.autograd.gradcheck(lambda a, b, c, d: ipo_loss(a, b, c, d, 0.7, lc, lr).loss, args)


def test_ipo_bad_input():
    x = logps(3, 0)
    with pytest.raises(ValueError, match="tau"):
        ipo_loss(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match="policy_rejected_logps"):
        ipo_loss(x, logps(4, 1), x, x, 0.1)
    with pytest.raises(ValueError, match="ref_chosen_logps"):
        ipo_loss(x, x, -x, x, 0.1)
    with pytest.raises(ValueError, match="both"):
        ipo_loss(x, x, x, x, 0.1, chosen_lengths=torch.ones(3))
    with pytest.raises(ValueError, match="rejected_lengths"):
        ipo_loss(x, x, x, x, 0.1, chosen_lengths=torch.ones(3), rejected_lengths=torch.zeros(3))
    with pytest.raises(TypeError, match="chosen_lengths"):
        ipo_loss(x, x, x, x, 0.1, chosen_lengths=[1, 1, 1], rejected_lengths=torch.ones(3))
    with pytest.raises(TypeError, match="policy_chosen_logps"):
        ipo_loss([-1.0], x, x, x, 0.1)
    with pytest.raises(ValueError, match="reduction"):
        ipo_loss(x, x, x, x, 0.1, reduction="token_sum")


# ---------------------------------------------------------------- KTO


def test_kto_worked_example():
    # r = (0.5, -1.0), z0 = 0.25, beta = 2: desirable 1 - sigma(0.5), undesirable 1 - sigma(2.5)
    pol = torch.tensor([-1.5, -3.0], dtype=D)
    ref = torch.tensor([-2.0, -2.0], dtype=D)
    out = kto_loss(pol, ref, torch.tensor([True, False]), beta=2.0, reference_point=0.25,
                   desirable_weight=1.0, undesirable_weight=2.0, reduction="none")
    sig = lambda u: 1 / (1 + math.exp(-u))  # noqa: E731
    torch.testing.assert_close(out.loss, torch.tensor([1 - sig(0.5), 2 * (1 - sig(2.5))], dtype=D),
                               rtol=0, atol=1e-15)
    assert out.chosen_rewards[0].item() == 1.0 and math.isnan(out.chosen_rewards[1].item())
    assert out.rejected_rewards[1].item() == -2.0 and math.isnan(out.rejected_rewards[0].item())
    # z0: the mean of (-1, -3) - (-2, -2) = (1, -1) is 0; of (-1, -1) - (-2, -2) it is 1
    assert kto_reference_point(torch.tensor([-1.0, -3.0], dtype=D), ref).item() == 0.0
    assert kto_reference_point(torch.tensor([-1.0, -1.0], dtype=D), ref).item() == 1.0
    # clamped at 0
    assert kto_reference_point(torch.tensor([-3.0, -3.0], dtype=D), ref).item() == 0.0


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.33), (0.5, 2.0)])
def test_kto_matches_trl(trl, weights):
    n, m = 9, 6  # nine responses, six mismatched pairs for the KL estimate
    pol, ref = logps(n, 1), logps(n, 2)
    desirable = torch.tensor([True, False, False, True, True, False, True, False, False])
    kl_pol, kl_ref = logps(m, 3, low=-2.0), logps(m, 4)
    z0 = kto_reference_point(kl_pol, kl_ref)
    ours = kto_loss(pol, ref, desirable, 0.1, z0, *weights)
    theirs, kl = _trl_kto(pol[desirable], pol[~desirable], ref[desirable], ref[~desirable], kl_pol, kl_ref,
                          0.1, *weights)
    assert z0.item() == kl.item() and z0.item() > 0
    torch.testing.assert_close(ours.loss, theirs, rtol=0, atol=1e-15)


def test_kto_gradcheck_and_no_gradient_through_the_reference_point():
    pol = logps(6, 5).requires_grad_(True)
    ref = logps(6, 6)
    desirable = torch.tensor([True, False, True, True, False, False])
    kl_pol = logps(4, 7).requires_grad_(True)
    z0 = kto_reference_point(kl_pol, logps(4, 8))
    assert not z0.requires_grad
    assert torch.autograd.gradcheck(lambda p: kto_loss(p, ref, desirable, 0.5, z0).loss, (pol,))
    # the gradient pushes desirable log-probs up and undesirable ones down
    g, = torch.autograd.grad(kto_loss(pol, ref, desirable, 0.5, z0).loss, pol)
    assert bool((g[desirable] < 0).all()) and bool((g[~desirable] > 0).all())


def test_kto_bad_input():
    x = logps(3, 0)
    d = torch.tensor([True, False, True])
    with pytest.raises(TypeError, match="desirable"):
        kto_loss(x, x, torch.tensor([1, 0, 1]), 0.1, 0.0)
    with pytest.raises(ValueError, match="desirable"):
        kto_loss(x, x, torch.tensor([True, False]), 0.1, 0.0)
    with pytest.raises(ValueError, match="beta"):
        kto_loss(x, x, d, -1.0, 0.0)
    with pytest.raises(ValueError, match="reference_point"):
        kto_loss(x, x, d, 0.1, -0.5)
    with pytest.raises(ValueError, match="reference_point"):
        kto_loss(x, x, d, 0.1, torch.zeros(2, dtype=D))
    with pytest.raises(ValueError, match="undesirable_weight"):
        kto_loss(x, x, d, 0.1, 0.0, undesirable_weight=-1.0)
    with pytest.raises(ValueError, match="empty"):
        kto_reference_point(torch.zeros(0, dtype=D), torch.zeros(0, dtype=D))
    with pytest.raises(ValueError, match="mismatched_ref_logps"):
        kto_reference_point(x, logps(2, 1))


# ---------------------------------------------------------------- ORPO


def test_log_odds_worked_example_and_stability():
    # P = 1/2: odds 1, log odds 0; P = 1/4: log(1/3)
    x = torch.log(torch.tensor([0.5, 0.25], dtype=D))
    torch.testing.assert_close(log_odds(x), torch.tensor([0.0, math.log(1 / 3)], dtype=D), rtol=0, atol=1e-15)
    # near P = 1 and P = 0 both branches stay finite and accurate
    tiny = torch.tensor([-1e-12, -700.0], dtype=D)
    out = log_odds(tiny)
    assert out[0].item() == pytest.approx(-math.log(1e-12), rel=1e-9)
    assert out[1].item() == pytest.approx(-700.0, rel=1e-12)
    with pytest.raises(ValueError, match="avg_logps"):
        log_odds(torch.tensor([0.0], dtype=D))


def test_orpo_worked_example():
    # P_w = 1/2 (log odds 0), P_l = 1/4 (log odds -log 3): ratio log 3; NLL = log 2
    cw, cl = torch.log(torch.tensor(0.5, dtype=D)), torch.log(torch.tensor(0.25, dtype=D))
    out = orpo_loss(cw, cl, lam=0.1)
    expected = math.log(2) - 0.1 * math.log(1 / (1 + 1 / 3))
    assert out.loss.item() == pytest.approx(expected, abs=1e-15)


def test_orpo_matches_trl(trl):
    from trl.experimental.orpo import ORPOTrainer

    n = 8
    cw, cl = logps(n, 10, low=-2.0), logps(n, 11, low=-6.0)
    cw[0] = -1e-3  # near P = 1, the other branch of log1mexp
    trainer = _bare(ORPOTrainer, beta=0.25)
    losses, chosen_r, rejected_r, mean_ratio, mean_log_odds = trainer.odds_ratio_loss(cw, cl)
    # trl: loss = policy_nll_loss - losses.mean(); with equal lengths its NLL is the mean of -cw
    # trl casts the log-probabilities to float32 (``.float()``), so it agrees to float32 rounding
    theirs = (-cw).mean() - losses.mean()
    ours = orpo_loss(cw, cl, lam=0.25)
    torch.testing.assert_close(ours.loss, theirs.to(D), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.chosen_rewards, chosen_r.to(D), rtol=1e-6, atol=0)
    torch.testing.assert_close(ours.rejected_rewards, rejected_r.to(D), rtol=1e-6, atol=0)
    torch.testing.assert_close((log_odds(cw) - log_odds(cl)).mean(), mean_log_odds.to(D), rtol=0, atol=1e-6)
    # and to float64 rounding on trl's lines in float64 (orpo_trainer.py, odds_ratio_loss, with
    # trl's own log1mexp and without the cast)
    from trl.experimental.orpo.orpo_trainer import log1mexp

    log_odds_trl = (cw - cl) - (log1mexp(cw) - log1mexp(cl))
    theirs64 = (-cw).mean() - (0.25 * F.logsigmoid(log_odds_trl)).mean()
    torch.testing.assert_close(ours.loss, theirs64, rtol=0, atol=1e-15)


def test_orpo_gradcheck_and_custom_nll():
    cw = logps(5, 12, low=-2.0).requires_grad_(True)
    cl = logps(5, 13).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: orpo_loss(a, b, 0.5).loss, (cw, cl))
    nll = torch.rand(5, generator=gen(14), dtype=D)
    out = orpo_loss(cw, cl, 0.5, chosen_nll=nll, reduction="none")
    torch.testing.assert_close(out.loss - nll,
                               orpo_loss(cw, cl, 0.5, chosen_nll=torch.zeros(5, dtype=D), reduction="none").loss,
                               rtol=0, atol=1e-15)


def test_orpo_bad_input():
    x = logps(3, 0)
    with pytest.raises(ValueError, match="lam"):
        orpo_loss(x, x, -0.1)
    with pytest.raises(ValueError, match="chosen_nll"):
        orpo_loss(x, x, 0.1, chosen_nll=torch.zeros(2, dtype=D))
    with pytest.raises(ValueError, match="avg_logps"):
        orpo_loss(torch.zeros(3, dtype=D), x, 0.1)


# ---------------------------------------------------------------- SimPO


def test_simpo_worked_example():
    # beta = 2, avg log-probs -1 (= -3/3) and -2 (= -10/5): margin 2 (-1 + 2) - 0.5 = 1.5
    out = simpo_loss(torch.tensor(-3.0, dtype=D), torch.tensor(-10.0, dtype=D), torch.tensor(3),
                     torch.tensor(5), beta=2.0, gamma=0.5)
    assert out.loss.item() == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-15)
    assert out.chosen_rewards.item() == -2.0 and out.rejected_rewards.item() == -4.0


@pytest.mark.parametrize(("beta", "gamma"), [(2.0, 0.5), (0.1, 0.0), (10.0, 5.4)])
def test_simpo_matches_trl(trl, beta, gamma):
    from trl.experimental.cpo import CPOTrainer

    n = 7
    sw, sl = logps(n, 20, low=-20.0), logps(n, 21, low=-20.0)
    lw, ll = torch.tensor([3, 5, 1, 8, 2, 2, 4]), torch.tensor([6, 1, 2, 2, 7, 3, 4])
    trainer = _bare(CPOTrainer, beta=beta, alpha=0.0, loss_type="simpo", simpo_gamma=gamma, label_smoothing=0.0)
    # trl's CPO uses length-averaged log-probabilities for SimPO (average_log_prob=True)
    losses, chosen_r, rejected_r = trainer.cpo_loss(sw / lw, sl / ll)
    ours = simpo_loss(sw, sl, lw, ll, beta, gamma, reduction="none")
    torch.testing.assert_close(ours.loss, losses, rtol=0, atol=1e-14)
    torch.testing.assert_close(ours.chosen_rewards, chosen_r, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(ours.rejected_rewards, rejected_r, rtol=1e-15, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 20), st.integers(1, 20), st.floats(0.1, 5.0), st.integers(2, 4))
def test_simpo_depends_on_length_only_through_the_average(lw, ll, beta, k):
    """Repeating a response's per-token log-probability k times leaves its SimPO reward unchanged."""
    aw, al = torch.tensor(-0.7, dtype=D), torch.tensor(-1.3, dtype=D)
    one = simpo_loss(aw * lw, al * ll, torch.tensor(lw), torch.tensor(ll), beta, 0.3).loss
    more = simpo_loss(aw * lw * k, al * ll, torch.tensor(lw * k), torch.tensor(ll), beta, 0.3).loss
    assert abs(one.item() - more.item()) < 1e-12


def test_simpo_gradcheck_and_bad_input():
    sw, sl = logps(4, 22).requires_grad_(True), logps(4, 23).requires_grad_(True)
    lw, ll = torch.tensor([1, 2, 3, 4]), torch.tensor([4, 4, 1, 2])
    assert torch.autograd.gradcheck(lambda a, b: simpo_loss(a, b, lw, ll, 1.5, 0.2).loss, (sw, sl))
    x = logps(3, 0)
    with pytest.raises(ValueError, match="gamma"):
        simpo_loss(x, x, torch.ones(3), torch.ones(3), 1.0, -1.0)
    with pytest.raises(ValueError, match="rejected_lengths"):
        simpo_loss(x, x, torch.ones(3), torch.ones(2), 1.0, 0.0)
    with pytest.raises(ValueError, match="policy_chosen_logps"):
        simpo_loss(-x, x, torch.ones(3), torch.ones(3), 1.0, 0.0)


# ---------------------------------------------------------------- RLOO


def test_rloo_advantages_worked_example():
    # group (1, 2, 6): baselines (4, 3.5, 1.5); group (0, 0, 3): (1.5, 1.5, 0)
    r = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0], dtype=D)
    torch.testing.assert_close(rloo_advantages(r, 3), torch.tensor([-3.0, -1.5, 4.5, -1.5, -1.5, 3.0], dtype=D),
                               rtol=0, atol=0)
    # a KL penalty of 0.5 per nat: rewards (0, 2, 6), baselines (4, 3, 1)
    kl = torch.tensor([2.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=D)
    torch.testing.assert_close(rloo_advantages(r, 3, kl=kl, beta=0.5)[:3],
                               torch.tensor([-4.0, -1.0, 5.0], dtype=D), rtol=0, atol=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(1, 5), st.integers(0, 10_000))
def test_rloo_advantages_properties(k, groups, seed):
    r = torch.randn(k * groups, generator=gen(seed), dtype=D)
    adv = rloo_advantages(r, k)
    g = r.view(groups, k)
    # they sum to zero in each group, and equal k/(k-1) times the deviation from the group mean
    torch.testing.assert_close(adv.view(groups, k).sum(1), torch.zeros(groups, dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(adv, (k / (k - 1) * (g - g.mean(1, keepdim=True))).reshape(-1), rtol=0,
                               atol=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
def test_rloo_advantages_match_trl(trl, normalize):
    from trl.trainer.utils import nanstd

    r = torch.randn(12, generator=gen(30), dtype=D)  # 3 prompts x 4 samples
    kl = torch.rand(12, generator=gen(31), dtype=D)
    ours = rloo_advantages(r, 4, kl=kl, beta=0.05, normalize=normalize)
    theirs = _trl_rloo_advantages(r - 0.05 * kl, 4, normalize, nanstd)
    # trl's nanstd forms Bessel's factor count / (count - 1) from integer tensors, in float32
    torch.testing.assert_close(ours, theirs, rtol=1e-7 if normalize else 0, atol=1e-15)


def test_rloo_loss_matches_trl_and_is_reinforce_at_the_sampling_policy(trl):
    n = 10
    lp = logps(n, 40).requires_grad_(True)
    old = (lp.detach() + 0.3 * torch.randn(n, generator=gen(41), dtype=D))
    adv = rloo_advantages(torch.randn(n, generator=gen(42), dtype=D), 5)
    ours = rloo_loss(lp, old, adv, 0.2, 0.28)
    theirs = _trl_rloo_loss(lp, old, adv, 0.2, 0.28)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-15)
    g_ours, = torch.autograd.grad(ours, lp)
    g_theirs, = torch.autograd.grad(_trl_rloo_loss(lp, old, adv, 0.2, 0.28), lp)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-15)
    # at pi = pi_old the gradient is -A_i / N on log pi(y_i): REINFORCE with the LOO baseline
    g, = torch.autograd.grad(rloo_loss(lp, lp.detach(), adv), lp)
    torch.testing.assert_close(g, -adv / n, rtol=0, atol=1e-15)
    assert torch.autograd.gradcheck(lambda a: rloo_loss(a, old, adv, 0.2), (lp,))


def test_rloo_bad_input():
    r = torch.zeros(6, dtype=D)
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(r, 1)
    with pytest.raises(ValueError, match="multiple"):
        rloo_advantages(r, 4)
    with pytest.raises(ValueError, match="rewards"):
        rloo_advantages(r.view(2, 3), 3)
    with pytest.raises(ValueError, match="needs the per-sequence kl"):
        rloo_advantages(r, 3, beta=0.1)
    with pytest.raises(ValueError, match="^kl must have the shape of rewards"):
        rloo_advantages(r, 3, kl=torch.zeros(5, dtype=D), beta=0.1)
    with pytest.raises(TypeError, match="rewards"):
        rloo_advantages([1.0, 2.0], 2)
    with pytest.raises(ValueError, match="clip_eps"):
        rloo_loss(r, r, r, clip_eps=1.0)
    with pytest.raises(ValueError, match="advantages"):
        rloo_loss(r, r, torch.zeros(5, dtype=D))


# ---------------------------------------------------------------- explicit reductions (issue 24)


def test_every_preference_loss_sum_and_none_agree_with_mean():
    n = 5
    pc, pr, rc, rr = logps(n, 50), logps(n, 51), logps(n, 52), logps(n, 53)
    lengths = torch.tensor([3.0, 1.0, 7.0, 2.0, 4.0], dtype=D)
    desirable = torch.tensor([True, False, True, True, False])
    losses = {
        "ipo": lambda red: ipo_loss(pc, pr, rc, rr, 0.1, lengths, lengths + 1, reduction=red).loss,
        "kto": lambda red: kto_loss(pc, rc, desirable, 0.1, 0.05, reduction=red).loss,
        "orpo": lambda red: orpo_loss(pc / 4, pr / 4, 0.5, reduction=red).loss,
        "simpo": lambda red: simpo_loss(pc, pr, lengths, lengths + 1, 2.0, 0.5, reduction=red).loss,
        "rloo": lambda red: rloo_loss(pc, rc, pr - rr, reduction=red),
    }
    for name, f in losses.items():
        per = f("none")
        assert per.shape == (n,), name
        assert f("sum").item() == pytest.approx(per.sum().item(), abs=1e-12), name
        assert f("mean").item() == pytest.approx(per.mean().item(), abs=1e-12), name
        with pytest.raises(ValueError, match="reduction must be one of"):
            f("token_mean")


def test_simpo_reward_is_the_per_sequence_token_mean():
    """SimPO's reward beta/|y| log pi(y) is the per-sequence mean of the token log-probabilities:
    sequence_values(..., "mean") of per-token values equals the sum divided by the length."""
    tok_w = -torch.rand(3, 6, generator=gen(60), dtype=D)
    tok_l = -torch.rand(3, 6, generator=gen(61), dtype=D)
    mask_w = torch.arange(6)[None, :] < torch.tensor([[2], [6], [4]])
    mask_l = torch.arange(6)[None, :] < torch.tensor([[5], [1], [3]])
    out = simpo_loss(sequence_values(tok_w, mask_w), sequence_values(tok_l, mask_l),
                     mask_w.sum(1).to(D), mask_l.sum(1).to(D), 2.0, 0.3, reduction="none")
    mean_w, mean_l = sequence_values(tok_w, mask_w, "mean"), sequence_values(tok_l, mask_l, "mean")
    torch.testing.assert_close(out.chosen_rewards, 2.0 * mean_w, rtol=0, atol=1e-15)
    torch.testing.assert_close(out.loss, -F.logsigmoid(2.0 * (mean_w - mean_l) - 0.3), rtol=0, atol=1e-15)
