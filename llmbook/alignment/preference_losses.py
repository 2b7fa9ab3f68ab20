"""The preference-optimisation family beyond DPO: IPO, KTO, ORPO, SimPO and RLOO.

Introduced in notebooks/19_dpo. DPO (:func:`llmbook.alignment.losses.dpo_loss`) fits the
implicit reward beta log(pi / pi_ref) to preference pairs by Bradley-Terry. Each loss here
changes one ingredient of that recipe; each is derived from its objective below, takes
sequence log-probabilities (sums over the response tokens, from
:func:`llmbook.alignment.dpo.sequence_logprobs`, or their averages where the method is
length-normalised), and returns a :class:`PreferenceLoss`.

**IPO** (Azar et al., 2023, "A General Theoretical Paradigm to Understand Learning from
Human Preferences"). DPO's loss -log sigma(beta h) of the log-ratio margin
h = log pi(y_w)/pi_ref(y_w) - log pi(y_l)/pi_ref(y_l) keeps falling as h grows, so a pair
labelled the same way every time is pushed apart without bound, whatever beta. IPO
maximises instead the *probability of being preferred*, E[p*(y > y')] - tau KL(pi || pi_ref),
whose population loss is the square E[(h - 1/(2 tau))^2] with the label's direction folded
into h (their eq. 17): for a pair preferred with probability p, the expected loss
p (h - 1/(2tau))^2 + (1 - p)(-h - 1/(2tau))^2 is minimised at h* = (2p - 1)/(2tau), bounded
by 1/(2tau). :func:`ipo_loss` averages the log-ratios over the response tokens, as trl does
(with the IPO authors' agreement, trl's comment says).

**KTO** (Ethayarajh et al., 2024, "KTO: Model Alignment as Prospect Theoretic Optimization").
No pairs: each response is labelled desirable or undesirable on its own. With the implied
reward r = log pi(y|x)/pi_ref(y|x) and a reference point z0, prospect theory's value is
v = lambda_D sigma(beta (r - z0)) for a desirable and lambda_U sigma(beta (z0 - r)) for an
undesirable response, and the loss is lambda - v (their eq. 7). z0 is the KL divergence
KL(pi(y'|x) || pi_ref(y'|x)), estimated on *mismatched* pairs (the responses of other
prompts in the batch), clamped at 0 and not differentiated (:func:`kto_reference_point`):
a response gains only by beating what the policy's drift already buys.

**ORPO** (Hong et al., 2024, "ORPO: Monolithic Preference Optimization without Reference
Model"). No reference model and no separate SFT stage: the SFT loss on the chosen response
plus lambda times an odds-ratio term, L = L_SFT - lambda log sigma(log odds(y_w) -
log odds(y_l)), with odds(y) = P(y) / (1 - P(y)) and P(y) the *per-token average*
probability exp(mean_t log pi(y_t | ...)) (their eqs. 4-7). In log space
log odds = log P - log(1 - P), computed stably as log P - log1mexp(log P).

**SimPO** (Meng et al., 2024, "SimPO: Simple Preference Optimization with a Reference-Free
Reward"). The reward is the length-normalised log-probability r(x, y) = beta/|y| log pi(y|x),
the quantity generation ranks by, with no reference model; the Bradley-Terry loss gets a
target margin gamma: L = -log sigma(r_w - r_l - gamma) (their eq. 6).

**RLOO** (Ahmadian et al., 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs"). REINFORCE on whole responses, with k samples per
prompt and for each the mean reward of the *other* k - 1 as its baseline:
A_i = R_i - 1/(k-1) sum_{j != i} R_j = k/(k-1) (R_i - mean_j R_j). The baseline does not
depend on y_i, so the estimator stays unbiased, and the advantages of a group sum to 0.
:func:`rloo_advantages` subtracts trl's KL penalty beta sum_t (log pi - log pi_ref) from the
reward first; :func:`rloo_loss` is trl's clipped sequence-level surrogate, whose gradient at
the sampling policy is the REINFORCE estimate -mean_i A_i grad log pi(y_i).

Every function follows trl 1.16.0 (``DPOTrainer`` with ``loss_type="ipo"``, ``KTOTrainer``,
``ORPOTrainer.odds_ratio_loss``, ``CPOTrainer.cpo_loss`` with ``loss_type="simpo"``,
``RLOOTrainer``), against which tests/test_alignment_preference_losses.py compares them.

Reductions. Every loss takes ``reduction`` "mean" (default), "sum" or "none" over its pairs
or responses. The per-token part of each method is in its inputs: DPO, IPO, KTO and RLOO
take the *sum* over the response tokens of the log-probabilities, SimPO and ORPO their
per-sequence *mean* (SimPO divides the sum by the length itself, ORPO takes the average);
:func:`~llmbook.alignment.logprobs.sequence_values` computes either from per-token
log-probabilities and a mask.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from llmbook.alignment.logprobs import SEQUENCE_REDUCTIONS, check_reduction, reduce_sequences
from llmbook.validation import check_finite, check_positive_int, check_positive_number
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "PreferenceLoss",
    "ipo_loss",
    "kto_loss",
    "kto_reference_point",
    "log_odds",
    "orpo_loss",
    "rloo_advantages",
    "rloo_loss",
    "simpo_loss",
]


class PreferenceLoss(NamedTuple):
    """A loss and the rewards it implies (detached, for monitoring).

    ``loss``: a scalar (``reduction="mean"``, or ``"sum"``) or one value per pair or
    response (``"none"``), through :func:`~llmbook.alignment.logprobs.reduce_sequences`; ``chosen_rewards``, ``rejected_rewards``: the method's reward of each
    chosen and rejected response (for KTO: of each desirable and undesirable response, in
    input order, with NaN where the response is of the other kind).
    """

    loss: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor


# ---------------------------------------------------------------- validation


def _check_same_1d(**tensors: object) -> Tensor:
    """Floating, finite tensors of one shape, () or (N,); returns the first."""
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        check_finite(_check_floating(t, name), name)
        if t.ndim > 1:
            raise ValueError(f"{name} must be a scalar or 1-d (N,), got shape {tuple(t.shape)}")
        if tuple(t.shape) != tuple(first.shape):
            raise ValueError(f"{name} must have the shape of {first_name}, {tuple(first.shape)}, "
                             f"got {tuple(t.shape)}")
    return first


def _check_logps(strict: bool = False, **tensors: Tensor) -> None:
    """Log-probabilities are <= 0 (< 0 with ``strict``): name the first that is not."""
    for name, t in tensors.items():
        bad = (t >= 0) if strict else (t > 0)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0]) if t.ndim else ()
            bound = "< 0" if strict else "<= 0"
            raise ValueError(f"{name} must hold log-probabilities ({bound}); "
                             f"{name}[{', '.join(map(str, where))}] = {float(t[where])}")


def _check_lengths(lengths: object, like: Tensor, name: str) -> Tensor:
    if not isinstance(lengths, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(lengths).__name__}")
    if tuple(lengths.shape) != tuple(like.shape):
        raise ValueError(f"{name} must have the shape of the log-probabilities, {tuple(like.shape)}, "
                         f"got {tuple(lengths.shape)}")
    if not bool((lengths > 0).all()):  # NaN too
        raise ValueError(f"{name} must be positive token counts, got {lengths.tolist()}")
    return lengths.to(like.dtype)


def _nonnegative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {name}={value}")
    return float(value)


# ---------------------------------------------------------------- IPO


def ipo_loss(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor,
             ref_chosen_logps: Tensor, ref_rejected_logps: Tensor, tau: float,
             chosen_lengths: Tensor | None = None, rejected_lengths: Tensor | None = None,
             reduction: str = "mean") -> PreferenceLoss:
    """IPO (Azar et al., 2023, eq. 17): (h - 1/(2 tau))^2 per pair; inputs (), or (N,) each.

    h = rho_w / |y_w| - rho_l / |y_l| with rho = log pi(y|x) - log pi_ref(y|x) from summed
    sequence log-probabilities and |y| the token counts ``chosen_lengths`` and
    ``rejected_lengths`` (positive, the inputs' shape), as trl's ``DPOTrainer`` with
    ``loss_type="ipo"``; without lengths the inputs are taken as already averaged (|y| = 1).
    The minimiser of the expected loss of a pair preferred with probability p is
    h* = (2p - 1) / (2 tau), never beyond 1/(2 tau). Rewards: tau rho_w and tau rho_l (trl's
    monitors beta rho, with beta = tau).
    """
    _check_same_1d(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                   ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    _check_logps(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                 ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    tau = check_positive_number("tau", tau)
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    if (chosen_lengths is None) != (rejected_lengths is None):
        raise ValueError("pass both chosen_lengths and rejected_lengths, or neither")
    rho_w = policy_chosen_logps - ref_chosen_logps
    rho_l = policy_rejected_logps - ref_rejected_logps
    if chosen_lengths is not None:
        h = (rho_w / _check_lengths(chosen_lengths, rho_w, "chosen_lengths")
             - rho_l / _check_lengths(rejected_lengths, rho_l, "rejected_lengths"))
    else:
        h = rho_w - rho_l
    per_pair = (h - 1 / (2 * tau)) ** 2
    return PreferenceLoss(reduce_sequences(per_pair, reduction), tau * rho_w.detach(), tau * rho_l.detach())


# ---------------------------------------------------------------- KTO


def kto_reference_point(mismatched_policy_logps: Tensor, mismatched_ref_logps: Tensor) -> Tensor:
    """KTO's z0: max(0, mean(log pi(y'|x) - log pi_ref(y'|x))), detached: (M,), (M,) -> ().

    A Monte Carlo estimate of KL(pi || pi_ref) from responses y' paired with prompts x they
    were not written for (trl shifts the completions of a batch by one), clamped at 0 as the
    true KL is; no gradient flows through it (Ethayarajh et al., 2024, section 4.1).
    """
    _check_same_1d(mismatched_policy_logps=mismatched_policy_logps,
                   mismatched_ref_logps=mismatched_ref_logps)
    _check_logps(mismatched_policy_logps=mismatched_policy_logps, mismatched_ref_logps=mismatched_ref_logps)
    if mismatched_policy_logps.numel() == 0:
        raise ValueError("mismatched_policy_logps is empty: the KL estimate needs at least one response")
    return (mismatched_policy_logps - mismatched_ref_logps).mean().detach().clamp(min=0)


def kto_loss(policy_logps: Tensor, ref_logps: Tensor, desirable: Tensor, beta: float,
             reference_point: Tensor | float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0, reduction: str = "mean") -> PreferenceLoss:
    """KTO (Ethayarajh et al., 2024, eq. 7) on unpaired responses: (N,) each -> loss.

    ``policy_logps``, ``ref_logps``: summed log-probabilities of N responses; ``desirable``:
    (N,) booleans (True: a desirable response). With r = policy - ref and z0 =
    ``reference_point`` (:func:`kto_reference_point`, detached here in any case):

        loss_i = lambda_D (1 - sigma(beta (r_i - z0)))   if desirable,
                 lambda_U (1 - sigma(beta (z0 - r_i)))   otherwise,

    lambda_D = ``desirable_weight``, lambda_U = ``undesirable_weight``. The mean over all N
    equals trl's ``KTOTrainer`` (which concatenates the desirable losses, then the
    undesirable ones, and averages). Rewards: beta r of the desirable responses in
    ``chosen_rewards`` and of the undesirable ones in ``rejected_rewards``, NaN elsewhere.
    """
    _check_same_1d(policy_logps=policy_logps, ref_logps=ref_logps)
    _check_logps(policy_logps=policy_logps, ref_logps=ref_logps)
    if not isinstance(desirable, Tensor) or desirable.dtype != torch.bool:
        raise TypeError(f"desirable must be a torch.bool tensor, got "
                        f"{getattr(desirable, 'dtype', type(desirable).__name__)}")
    if tuple(desirable.shape) != tuple(policy_logps.shape):
        raise ValueError(f"desirable must have the shape of policy_logps, {tuple(policy_logps.shape)}, "
                         f"got {tuple(desirable.shape)}")
    beta = check_positive_number("beta", beta)
    if isinstance(reference_point, Tensor):
        z0 = check_finite(_check_floating(reference_point, "reference_point"), "reference_point")
        if z0.numel() != 1:
            raise ValueError(f"reference_point must be one number, got shape {tuple(z0.shape)}")
        z0 = z0.detach().reshape(()).to(policy_logps.dtype)
    else:
        z0 = torch.tensor(_nonnegative("reference_point", reference_point), dtype=policy_logps.dtype)
    lam_d = _nonnegative("desirable_weight", desirable_weight)
    lam_u = _nonnegative("undesirable_weight", undesirable_weight)
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    r = policy_logps - ref_logps
    per_item = torch.where(desirable, lam_d * (1 - torch.sigmoid(beta * (r - z0))),
                           lam_u * (1 - torch.sigmoid(beta * (z0 - r))))
    nan = torch.full_like(r, float("nan"))
    reward = beta * r.detach()
    return PreferenceLoss(reduce_sequences(per_item, reduction), torch.where(desirable, reward, nan),
                          torch.where(desirable, nan, reward))


# ---------------------------------------------------------------- ORPO


def log_odds(avg_logps: Tensor) -> Tensor:
    """log(P / (1 - P)) of P = exp(avg_logps), elementwise; needs avg_logps < 0.

    log(1 - e^x) is computed as log1p(-e^x) for x < -log 2 and log(-expm1(x)) above, the
    stable branches (Maechler, 2012, "Accurately Computing log(1 - exp(-|a|))").
    """
    check_finite(_check_floating(avg_logps, "avg_logps"), "avg_logps")
    _check_logps(strict=True, avg_logps=avg_logps)
    log1mexp = torch.where(avg_logps < -math.log(2), torch.log1p(-torch.exp(avg_logps)),
                           torch.log(-torch.expm1(avg_logps)))
    return avg_logps - log1mexp


def orpo_loss(chosen_avg_logps: Tensor, rejected_avg_logps: Tensor, lam: float,
              chosen_nll: Tensor | None = None, reduction: str = "mean") -> PreferenceLoss:
    """ORPO (Hong et al., 2024, eqs. 6-7): L_SFT - lam log sigma(log odds(y_w) - log odds(y_l)).

    ``chosen_avg_logps``, ``rejected_avg_logps``: () or (N,) per-token *average*
    log-probabilities of the responses (strictly below 0); ``chosen_nll``: the SFT loss of
    each chosen response, by default -``chosen_avg_logps`` (the mean token NLL). No reference
    model. trl's ``ORPOTrainer`` computes ``policy_nll_loss - (lam log sigma(...)).mean()``
    with the NLL averaged over all chosen tokens of the batch, which equals the mean of
    this loss when the chosen responses have equal lengths. Rewards: lam times the average
    log-probabilities (trl's monitors).
    """
    _check_same_1d(chosen_avg_logps=chosen_avg_logps, rejected_avg_logps=rejected_avg_logps)
    lam = _nonnegative("lam", lam)
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    if chosen_nll is None:
        chosen_nll = -chosen_avg_logps
    else:
        _check_same_1d(chosen_avg_logps=chosen_avg_logps, chosen_nll=chosen_nll)
    ratio = log_odds(chosen_avg_logps) - log_odds(rejected_avg_logps)
    per_pair = chosen_nll - lam * F.logsigmoid(ratio)
    return PreferenceLoss(reduce_sequences(per_pair, reduction), lam * chosen_avg_logps.detach(),
                          lam * rejected_avg_logps.detach())


# ---------------------------------------------------------------- SimPO


def simpo_loss(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor, chosen_lengths: Tensor,
               rejected_lengths: Tensor, beta: float, gamma: float,
               reduction: str = "mean") -> PreferenceLoss:
    """SimPO (Meng et al., 2024, eq. 6): -log sigma(beta/|y_w| log pi(y_w) - beta/|y_l| log pi(y_l) - gamma).

    Summed sequence log-probabilities and token counts, () or (N,) each; no reference model.
    trl's ``CPOTrainer`` with ``loss_type="simpo"`` (``cpo_alpha=0``) writes the same as
    -log sigma(beta (avg_w - avg_l - gamma / beta)). Rewards: beta times the average
    log-probabilities, SimPO's r(x, y).
    """
    _check_same_1d(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps)
    _check_logps(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps)
    beta = check_positive_number("beta", beta)
    gamma = _nonnegative("gamma", gamma)
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    r_w = beta * policy_chosen_logps / _check_lengths(chosen_lengths, policy_chosen_logps, "chosen_lengths")
    r_l = beta * policy_rejected_logps / _check_lengths(rejected_lengths, policy_rejected_logps,
                                                        "rejected_lengths")
    per_pair = -F.logsigmoid(r_w - r_l - gamma)
    return PreferenceLoss(reduce_sequences(per_pair, reduction), r_w.detach(), r_l.detach())


# ---------------------------------------------------------------- RLOO


def rloo_advantages(rewards: Tensor, group_size: int, kl: Tensor | None = None, beta: float = 0.0,
                    normalize: bool = False) -> Tensor:
    """Leave-one-out advantages: (N,) rewards of N / k groups of k consecutive samples -> (N,).

    A_i = R_i - 1/(k-1) sum_{j != i in its group} R_j, with R = rewards - beta kl when a
    per-sequence ``kl`` (N,) (trl: sum_t log pi_old - log pi_ref) is given. With
    ``normalize`` the advantages are then standardised over the whole batch,
    (A - mean) / (std + 1e-4) with the unbiased std, as trl's ``normalize_advantages``.
    Needs k >= 2 (a sample's baseline is the others' mean) and N a multiple of k.
    """
    check_finite(_check_floating(rewards, "rewards"), "rewards")
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-d (N,), got shape {tuple(rewards.shape)}")
    k = check_positive_int("group_size", group_size)
    if k < 2:
        raise ValueError(f"group_size must be >= 2 (the baseline is the other samples' mean), got {k}")
    if rewards.shape[0] == 0 or rewards.shape[0] % k:
        raise ValueError(f"rewards must hold a positive multiple of group_size = {k} values, "
                         f"got {rewards.shape[0]}")
    beta = _nonnegative("beta", beta)
    if kl is not None:
        _check_same_1d(rewards=rewards, kl=kl)
        rewards = rewards - beta * kl
    elif beta:
        raise ValueError("beta > 0 needs the per-sequence kl")
    grouped = rewards.detach().view(-1, k)
    baselines = (grouped.sum(1, keepdim=True) - grouped) / (k - 1)
    adv = (grouped - baselines).reshape(-1)
    if normalize:
        if adv.numel() < 2:
            raise ValueError("normalize needs at least 2 advantages for a standard deviation")
        adv = (adv - adv.mean()) / (adv.std() + 1e-4)
    return adv


def rloo_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, clip_eps: float = 0.2,
              clip_eps_high: float | None = None, reduction: str = "mean") -> Tensor:
    """RLOO's sequence-level clipped surrogate, as trl's ``RLOOTrainer``: (N,) each -> loss.

    With the ratio c = exp(log pi(y) - log pi_old(y)) of summed sequence log-probabilities,
    loss_i = -min(c A_i, clip(c, 1 - eps, 1 + eps_high) A_i); ``old_logps`` and
    ``advantages`` are constants (detached). At pi = pi_old (one update per batch, as in
    Ahmadian et al.) c = 1 and the gradient is -mean_i A_i grad log pi(y_i): REINFORCE with
    the leave-one-out baseline.
    """
    _check_same_1d(logps=logps, old_logps=old_logps, advantages=advantages)
    low = check_positive_number("clip_eps", clip_eps)
    if low >= 1:
        raise ValueError(f"clip_eps must lie in (0, 1), got clip_eps={clip_eps}")
    high = low if clip_eps_high is None else check_positive_number("clip_eps_high", clip_eps_high)
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    adv = advantages.detach()
    ratio = torch.exp(logps - old_logps.detach())
    per_seq = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - low, 1 + high) * adv)
    return reduce_sequences(per_seq, reduction)
