"""The objectives of alignment: reward models, PPO, DPO and IPO, GRPO, and KL estimators.

Introduced in notebooks/17_sft_reward_models (the Bradley-Terry loss), notebooks/18_rlhf_ppo
(the policy gradient, GAE, the PPO losses, the KL estimators), notebooks/19_dpo (DPO and
IPO) and notebooks/20_grpo (group-normalised rewards and the GRPO loss). Every function
takes per-token or per-sequence log-probabilities (see :mod:`llmbook.alignment.logprobs`)
and returns a scalar loss to minimise, plus the diagnostics each method is usually
monitored with.

* :func:`bradley_terry_loss`: -log sigma(r_chosen - r_rejected), the pairwise loss of a
  reward model under the Bradley-Terry preference model (Bradley & Terry, 1952), as used
  for InstructGPT (Ouyang et al., 2022, "Training language models to follow instructions
  with human feedback");
* :func:`policy_gradient_loss`: REINFORCE with an optional baseline (Williams, 1992);
* :func:`gae`: generalised advantage estimation (Schulman et al., 2016, "High-Dimensional
  Continuous Control Using Generalized Advantage Estimation");
* :func:`ppo_policy_loss`, :func:`ppo_value_loss`: the clipped surrogate objective and the
  clipped value loss of PPO (Schulman et al., 2017, "Proximal Policy Optimization
  Algorithms");
* :func:`dpo_loss`: DPO (Rafailov et al., 2023, "Direct Preference Optimization: Your
  Language Model is Secretly a Reward Model") and IPO (Azar et al., 2023, "A General
  Theoretical Paradigm to Understand Learning from Human Preferences");
* :func:`group_normalized_rewards`, :func:`grpo_loss`: GRPO (Shao et al., 2024,
  "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"),
  with the three ways of aggregating per-token losses whose length bias is analysed by
  Liu et al., 2025, "Understanding R1-Zero-like Training: A Critical Perspective"
  (Dr. GRPO);
* :func:`kl_estimators`: the k1, k2, k3 single-sample estimators of KL(p || q) from
  J. Schulman, "Approximating KL Divergence" (blog post, 2020); :func:`kl_estimator_variances`
  (their exact variances) and :func:`kl_estimator_loss_gradients` (what their gradients
  estimate when they are used as a loss), both summed exactly over a categorical distribution.

Conventions. Per-token tensors are (B, T) with a (B, T) mask of response tokens (boolean or
0/1, exactly the shape of the tensor; never broadcast). Per-sequence tensors are (B,).
Every loss takes a keyword ``reduction`` whose default is the method's own: the per-token
losses (policy gradient, PPO, GRPO) any of
:data:`~llmbook.alignment.logprobs.REDUCTIONS` through
:func:`~llmbook.alignment.logprobs.reduce_tokens` ("none" returns the per-token values),
the per-pair losses (Bradley-Terry, DPO) "mean", "sum" or "none" through
:func:`~llmbook.alignment.logprobs.reduce_sequences`.
Constants of an update (old log-probabilities, advantages, returns, rewards) are detached
inside the losses, so their gradient flows only through the current policy or value.
The conventions (which quantity is averaged over what) follow trl 1.16.0, against which
the tests compare; where trl differs from the papers the docstring says so.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from llmbook.alignment.logprobs import (
    REDUCTIONS,
    _check_mask,
    check_reduction,
    masked_mean,
    masked_sum,
    reduce_sequences,
    reduce_tokens,
)
from llmbook.validation import (
    check_finite,
    check_nonempty,
    check_positive_int,
    check_positive_number,
)
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "GRPOLossOutput",
    "KLEstimates",
    "bradley_terry_loss",
    "dpo_loss",
    "gae",
    "grpo_loss",
    "group_normalized_rewards",
    "kl_estimator_loss_gradients",
    "kl_estimator_variances",
    "kl_estimators",
    "policy_gradient_loss",
    "ppo_policy_loss",
    "ppo_value_loss",
]

DPO_LOSS_TYPES = ("sigmoid", "ipo")
GRPO_AGGREGATIONS = ("sequence_mean", "token_mean", "constant")


# ---------------------------------------------------------------- validation


def _check_same_shape(**tensors: Tensor) -> None:
    """All the named tensors are floating, non-empty, free of NaN (-inf is a legal
    log-probability) and share one shape (no broadcasting)."""
    items = list(tensors.items())
    for name, t in items:
        check_finite(check_nonempty(_check_floating(t, name), name), name, allow_inf=True)
    first_name, first = items[0]
    for name, t in items[1:]:
        if tuple(t.shape) != tuple(first.shape):
            raise ValueError(f"{name} must have the shape of {first_name}, {tuple(first.shape)}, "
                             f"got {tuple(t.shape)}")


def _check_pairs(ndim_max: int = 1, **tensors: Tensor) -> None:
    _check_same_shape(**tensors)
    name, first = next(iter(tensors.items()))
    if first.ndim > ndim_max:
        raise ValueError(f"{name} must be a scalar (one pair) or 1-d (a batch of pairs), "
                         f"got shape {tuple(first.shape)}")


def _check_log_probs(**tensors: Tensor) -> None:
    """Log-probabilities are finite (or -inf) and never above 0: name the first that is not."""
    for name, t in tensors.items():
        bad = torch.isnan(t) | (t > 0)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0]) if t.ndim else ()
            value = float(t[where]) if t.ndim else float(t)
            raise ValueError(f"{name} must hold log-probabilities (<= 0, not NaN); "
                             f"{name}[{', '.join(map(str, where))}] = {value}")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {name}={value}")
    return float(value)


def _unit_interval(name: str, value: object) -> float:
    v = _number(name, value)
    if not 0 <= v <= 1:
        raise ValueError(f"{name} must lie in [0, 1], got {name}={value}")
    return v


def _clip_range(clip_eps: object, clip_eps_high: object) -> tuple[float, float]:
    low = check_positive_number("clip_eps", clip_eps)
    if low >= 1:
        raise ValueError(f"clip_eps must lie in (0, 1) so that 1 - clip_eps > 0, got "
                         f"clip_eps={clip_eps}")
    high = low if clip_eps_high is None else check_positive_number("clip_eps_high", clip_eps_high)
    return low, high


def _per_sequence_to_tokens(adv: Tensor, like: Tensor, name: str) -> Tensor:
    """``adv`` of ``like``'s shape, or one value per row (``like.shape[:-1]``) spread over tokens."""
    check_finite(_check_floating(adv, name), name)
    if tuple(adv.shape) == tuple(like.shape):
        return adv
    if like.ndim >= 1 and tuple(adv.shape) == tuple(like.shape[:-1]):
        return adv.unsqueeze(-1).expand_as(like)
    raise ValueError(f"{name} must have shape {tuple(like.shape)} (per token) or "
                     f"{tuple(like.shape[:-1])} (per sequence), got {tuple(adv.shape)}")


# ---------------------------------------------------------------- reward model (chapter 17)


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | float | None = None,
                       center_coefficient: float = 0.0, *, reduction: str = "mean") -> Tensor:
    """Mean of -log sigma(r_chosen - r_rejected - margin): the reward-model loss, a scalar.

    Under the Bradley-Terry model P(chosen > rejected) = sigma(r_chosen - r_rejected), so
    this is the negative log-likelihood of the observed preferences. ``r_chosen`` and
    ``r_rejected`` are scalar rewards, () for one pair or (N,) for a batch. The optional
    ``margin`` (a number or a tensor of the same shape; Llama 2's "margin" for graded
    preferences) asks the chosen reward to win by at least that much. The optional
    ``center_coefficient`` c adds c * mean((r_chosen + r_rejected)^2), which pins the
    free additive constant of the rewards near zero (Eisenstein et al., 2023). Both extras
    are those of trl's ``RewardTrainer``. ``reduction`` "mean" (default), "sum" or "none"
    (the loss of each pair, centring term included).
    """
    _check_pairs(r_chosen=r_chosen, r_rejected=r_rejected)
    reduction = check_reduction(reduction, ("mean", "sum", "none"))
    diff = r_chosen - r_rejected
    if margin is not None:
        if isinstance(margin, Tensor):
            _check_same_shape(r_chosen=r_chosen, margin=margin)
        else:
            margin = _number("margin", margin)
        diff = diff - margin
    c = _number("center_coefficient", center_coefficient)
    if c < 0:
        raise ValueError(f"center_coefficient must be >= 0, got center_coefficient={c}")
    if reduction != "mean":
        per_pair = -F.logsigmoid(diff) + c * (r_chosen + r_rejected) ** 2 if c else -F.logsigmoid(diff)
        return reduce_sequences(per_pair, reduction)
    loss = -F.logsigmoid(diff).mean()
    if c:
        loss = loss + c * ((r_chosen + r_rejected) ** 2).mean()
    return loss


# ---------------------------------------------------------------- DPO and IPO (chapter 19)


def dpo_loss(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor,
             ref_chosen_logps: Tensor, ref_rejected_logps: Tensor, beta: float,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             chosen_lengths: Tensor | None = None, rejected_lengths: Tensor | None = None,
             reduction: str = "mean") -> tuple[Tensor, Tensor, Tensor]:
    """The DPO (or IPO) loss of preference pairs; returns (loss, chosen_rewards, rejected_rewards).

    Inputs are sequence log-probabilities log pi(y | x) (sums over the response tokens),
    all of one shape: () for a single pair or (N,) for a batch. With the log-ratios
    rho_w = log pi(y_w|x) - log pi_ref(y_w|x) and rho_l likewise, and h = rho_w - rho_l:

    * ``"sigmoid"`` (DPO, Rafailov et al., 2023, eq. 7): -log sigma(beta h). With
      ``label_smoothing`` eps > 0 (conservative DPO: each label is flipped with probability
      eps) it is -(1 - eps) log sigma(beta h) - eps log sigma(-beta h). The gradient with
      respect to h at eps = 0 is -beta sigma(-beta h): large when the pair is ranked wrongly.
    * ``"ipo"`` (Azar et al., 2023, eq. 17, tau = beta): (h' - 1/(2 beta))^2, where, as in
      trl, h' = rho_w / |y_w| - rho_l / |y_l| uses log-ratios *averaged over the response
      tokens*: pass the token counts as ``chosen_lengths`` and ``rejected_lengths`` (the
      same shape, positive). Without them the inputs are taken as already length-averaged.

    ``chosen_rewards`` = beta rho_w and ``rejected_rewards`` = beta rho_l are the implicit
    rewards of DPO (detached, for monitoring), of the inputs' shape. ``loss`` is the mean
    over pairs (``reduction="mean"``), their sum (``"sum"``) or one value per pair
    (``"none"``), through :func:`~llmbook.alignment.logprobs.reduce_sequences`.

    trl 1.16.0's ``"sigmoid"`` loss has no label smoothing (trl uses ``label_smoothing`` only
    for its "robust", "exo_pair" and "aot" variants); at eps = 0 the two agree.
    """
    _check_pairs(policy_chosen_logps=policy_chosen_logps,
                 policy_rejected_logps=policy_rejected_logps,
                 ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    _check_log_probs(policy_chosen_logps=policy_chosen_logps,
                     policy_rejected_logps=policy_rejected_logps,
                     ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    for name, t in (("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps)):
        check_finite(t, name)  # log pi_ref = -inf: the log-ratio is -inf - -inf or +inf
    beta = check_positive_number("beta", beta)
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {DPO_LOSS_TYPES}, got {loss_type!r}")
    eps = _number("label_smoothing", label_smoothing)
    if not 0 <= eps < 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5), got label_smoothing={eps}")
    reduction = check_reduction(reduction, ("mean", "sum", "none"))
    chosen_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_ratio = policy_rejected_logps - ref_rejected_logps
    if loss_type == "sigmoid":
        if chosen_lengths is not None or rejected_lengths is not None:
            raise ValueError("chosen_lengths and rejected_lengths apply to loss_type='ipo' only")
        logits = beta * (chosen_ratio - rejected_ratio)
        per_pair = -F.logsigmoid(logits)
        if eps:
            per_pair = (1 - eps) * per_pair - eps * F.logsigmoid(-logits)
    else:
        if eps:
            raise ValueError(f"label_smoothing applies to loss_type='sigmoid' only, got "
                             f"label_smoothing={eps} with loss_type='ipo'")
        if (chosen_lengths is None) != (rejected_lengths is None):
            raise ValueError("pass both chosen_lengths and rejected_lengths, or neither")
        if chosen_lengths is not None and rejected_lengths is not None:
            for name, lengths in (("chosen_lengths", chosen_lengths),
                                  ("rejected_lengths", rejected_lengths)):
                if not isinstance(lengths, Tensor):
                    raise TypeError(f"{name} must be a torch.Tensor, got {type(lengths).__name__}")
                if tuple(lengths.shape) != tuple(chosen_ratio.shape):
                    raise ValueError(f"{name} must have the shape of the log-probabilities, "
                                     f"{tuple(chosen_ratio.shape)}, got {tuple(lengths.shape)}")
                if not bool((lengths > 0).all()):  # NaN too
                    raise ValueError(f"{name} must be positive token counts, got {lengths.tolist()}")
            chosen_ratio_avg = chosen_ratio / chosen_lengths.to(chosen_ratio.dtype)
            rejected_ratio_avg = rejected_ratio / rejected_lengths.to(rejected_ratio.dtype)
        else:
            chosen_ratio_avg, rejected_ratio_avg = chosen_ratio, rejected_ratio
        per_pair = (chosen_ratio_avg - rejected_ratio_avg - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * chosen_ratio.detach()
    rejected_rewards = beta * rejected_ratio.detach()
    return reduce_sequences(per_pair, reduction), chosen_rewards, rejected_rewards


# ---------------------------------------------------------------- policy gradient, GAE, PPO (ch. 18)


def policy_gradient_loss(logprobs: Tensor, rewards: Tensor, baseline: Tensor | float | None = None,
                         mask: Tensor | None = None, *, reduction: str = "constant",
                         normaliser: float | None = None) -> Tensor:
    """REINFORCE: -mean_b (R_b - b) log pi(y_b | x_b), a scalar whose gradient is the policy gradient.

    ``logprobs`` are sequence log-probabilities (B,), or per-token ones (B, T) with a
    ``mask`` (B, T) of response tokens, summed over the tokens. ``rewards`` (B,) and the
    ``baseline`` (a number, a () tensor or a (B,) tensor; None for no baseline) are constants
    (detached). Any baseline that does not depend on the sampled response leaves the
    expected gradient unchanged and can only reduce its variance.

    ``reduction`` (:func:`~llmbook.alignment.logprobs.reduce_tokens`) acts on the per-token
    losses -(R_b - b) log pi(y_bt | ...) (one per sequence for (B,) inputs). The default,
    "constant" with ``normaliser`` None meaning B, is the REINFORCE estimate above; "none"
    returns the per-token losses (B, T) (or (B,)), "sum" drops the 1/B, "token_mean" divides
    by the number of response tokens and "sequence_mean" by each sequence's own length, which
    changes the weight of long against short responses (chapter 17, section 17.8).
    """
    reduction = check_reduction(reduction)
    _check_same_shape(logprobs=logprobs)
    if logprobs.ndim == 2:
        if mask is None:
            raise ValueError("per-token logprobs (B, T) need a mask (B, T) of response tokens")
        seq_logps = masked_sum(logprobs, mask, dim=1)  # (B,)
        token_mask = mask
    elif logprobs.ndim == 1:
        if mask is not None:
            raise ValueError("mask applies to per-token logprobs (B, T) only, got logprobs of "
                             f"shape {tuple(logprobs.shape)}")
        seq_logps = logprobs
        token_mask = None
    else:
        raise ValueError(f"logprobs must be (B,) or (B, T), got shape {tuple(logprobs.shape)}")
    check_finite(_check_floating(rewards, "rewards"), "rewards")
    if tuple(rewards.shape) != tuple(seq_logps.shape):
        raise ValueError(f"rewards must have shape {tuple(seq_logps.shape)} (one per sequence), "
                         f"got {tuple(rewards.shape)}")
    weight = rewards.detach()
    if baseline is not None:
        if isinstance(baseline, Tensor):
            check_finite(_check_floating(baseline, "baseline"), "baseline")
            if baseline.ndim != 0 and tuple(baseline.shape) != tuple(rewards.shape):
                raise ValueError(f"baseline must be a scalar or have the shape of rewards, "
                                 f"{tuple(rewards.shape)}, got {tuple(baseline.shape)}")
            weight = weight - baseline.detach()
        else:
            weight = weight - _number("baseline", baseline)
    if reduction == "constant" and normaliser is None:
        return -(weight * seq_logps).mean()  # the default: REINFORCE, C = B
    if token_mask is None:  # one value per sequence: each sequence is one "token"
        per_item = -(weight * seq_logps)
        out = reduce_tokens(per_item[:, None], torch.ones_like(per_item[:, None]), reduction, normaliser)
        return out[:, 0] if reduction == "none" else out
    return reduce_tokens(-(weight[:, None] * logprobs), token_mask, reduction, normaliser)


def gae(rewards: Tensor, values: Tensor, gamma: float, lam: float,
        mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimates and returns, per sequence: (advantages, returns).

    ``rewards`` and ``values`` are (T,) for one sequence or (B, T) for a batch. With the
    TD errors delta_t = r_t + gamma V_{t+1} - V_t (V_T = 0: the episode ends after the
    last token), the reversed recursion

        A_t = delta_t + gamma * lam * A_{t+1},   A_T = 0,

    gives A_t = sum_l (gamma lam)^l delta_{t+l}; the returns (the value targets) are
    A_t + V_t. lam = 0 gives the one-step TD errors; lam = 1 gives the discounted
    return-to-go minus V_t. A ``mask`` (the shape of ``rewards``) marks the positions inside
    the episode: at a masked-out position the episode has ended, so neither its value nor
    its advantage flows backwards, and both outputs are 0 there (right-padded responses).
    Differentiable (it is linear in rewards and values), though usually run on detached inputs.
    """
    _check_same_shape(rewards=rewards, values=values)
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards must be (T,) or (B, T), got shape {tuple(rewards.shape)}")
    gamma = _unit_interval("gamma", gamma)
    lam = _unit_interval("lam", lam)
    single = rewards.ndim == 1
    r = rewards.unsqueeze(0) if single else rewards  # (B, T)
    v = values.unsqueeze(0) if single else values
    if mask is None:
        m = torch.ones_like(r)
    else:
        m = _check_mask(mask, rewards, "mask", "rewards")
        m = m.unsqueeze(0) if single else m
    T = r.shape[1]
    next_value = torch.zeros_like(r[:, 0])  # (B,)
    next_adv = torch.zeros_like(r[:, 0])
    advs: list[Tensor] = []
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * next_value - v[:, t]  # (B,)
        adv = (delta + gamma * lam * next_adv) * m[:, t]
        advs.append(adv)
        next_value = v[:, t] * m[:, t]
        next_adv = adv
    advantages = torch.stack(advs[::-1], dim=1)  # (B, T)
    returns = (advantages + v) * m
    if single:
        return advantages[0], returns[0]
    return advantages, returns


def ppo_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    clip_eps: float, clip_eps_high: float | None = None, *,
                    reduction: str = "token_mean", normaliser: float | None = None) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate as a loss, and the fraction of clipped tokens: (loss, clip_fraction).

    With the ratio rho_t = pi(y_t | .) / pi_old(y_t | .) = exp(logprobs - old_logprobs) and
    advantage A_t, the per-token loss is max(-rho_t A_t, -clip(rho_t, 1 - eps, 1 + eps) A_t)
    (Schulman et al., 2017, eq. 7, negated), averaged over the unmasked tokens of the whole
    batch. ``logprobs``, ``old_logprobs`` and ``mask`` are (B, T); ``advantages`` are (B, T)
    per token or (B,) per sequence (shared by its tokens). ``clip_eps_high`` sets a different
    upper bound 1 + eps_high (DAPO's "clip-higher"); it defaults to ``clip_eps``.

    ``clip_fraction`` (detached) is the fraction of unmasked tokens on which the clipped term
    is the active one, so whose gradient is zero: rho < 1 - eps with A < 0, or rho > 1 + eps
    with A > 0.

    ``reduction`` (:func:`~llmbook.alignment.logprobs.reduce_tokens`, default the token mean
    above; ``normaliser`` for "constant") turns the per-token losses into ``loss``; "none"
    returns them, (B, T), zero off the mask. The clip fraction is a token mean in any case.
    """
    reduction = check_reduction(reduction)
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    adv = _per_sequence_to_tokens(advantages, logprobs, "advantages").detach()
    low, high = _clip_range(clip_eps, clip_eps_high)
    _check_mask(mask, logprobs, "mask", "logprobs")
    ratio = torch.exp(logprobs - old_logprobs.detach())
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    per_token = torch.maximum(-ratio * adv, -clipped * adv)
    is_clipped = ((ratio < 1 - low) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
    loss = reduce_tokens(per_token, mask, reduction, normaliser)
    clip_fraction = masked_mean(is_clipped.to(logprobs.dtype), mask).detach()
    return loss, clip_fraction


def ppo_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
                   clip_eps: float | None, *, reduction: str = "token_mean",
                   normaliser: float | None = None) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss and its clip fraction: (loss, clip_fraction).

    0.5 * masked mean of max((V - R)^2, (V_clip - R)^2) with
    V_clip = old_V + clip(V - old_V, -eps, eps): the value head may not move more than eps
    from the values recorded at rollout time (the ``cliprange_value`` of the PPO
    implementations for RLHF). ``clip_eps=None`` gives the plain 0.5 * mean (V - R)^2. All
    tensors (B, T); ``old_values`` and ``returns`` are detached. ``clip_fraction`` is the
    fraction of unmasked tokens where the clipped term is the larger. ``reduction`` and
    ``normaliser`` as in :func:`ppo_policy_loss` (the 0.5 applies to every reduction).
    """
    reduction = check_reduction(reduction)
    _check_same_shape(values=values, old_values=old_values, returns=returns)
    _check_mask(mask, values, "mask", "values")
    old = old_values.detach()
    target = returns.detach()
    unclipped = (values - target) ** 2
    if clip_eps is None:
        return (0.5 * reduce_tokens(unclipped, mask, reduction, normaliser),
                masked_mean(torch.zeros_like(unclipped), mask))
    eps = check_positive_number("clip_eps", clip_eps)
    v_clip = old + torch.clamp(values - old, -eps, eps)
    clipped = (v_clip - target) ** 2
    loss = 0.5 * reduce_tokens(torch.maximum(unclipped, clipped), mask, reduction, normaliser)
    clip_fraction = masked_mean((clipped > unclipped).to(values.dtype), mask).detach()
    return loss, clip_fraction


# ---------------------------------------------------------------- KL estimators


class KLEstimates(NamedTuple):
    """Per-sample estimators of KL(p || q) for samples x ~ p; each has the inputs' shape."""

    k1: Tensor
    k2: Tensor
    k3: Tensor


def kl_estimators(logp: Tensor, logq: Tensor) -> KLEstimates:
    """Schulman's k1, k2, k3 estimators of KL(p || q) from log p(x), log q(x) at samples x ~ p.

    With log r = log q(x) - log p(x) (so E_p[r] = 1):

    * k1 = -log r: unbiased, negative for some samples;
    * k2 = (log r)^2 / 2: biased (low bias when p and q are close), always >= 0;
    * k3 = (r - 1) - log r: unbiased (the added r - 1 has mean 0) and always >= 0, since
      log r <= r - 1. Near q = p its variance is far below k1's, but not always: where q/p
      has a heavy upper tail (q much larger than p on outcomes p still samples), the r term
      makes it the larger (:func:`kl_estimator_variances`).

    As *values* all three estimate KL(p || q). Used as a *loss* (differentiated through
    log p(x) at fixed samples x ~ p) they estimate three different gradients
    (:func:`kl_estimator_loss_gradients`): k1 gives 0 in expectation, k2 gives the gradient
    of KL(p || q), and k3 the gradient of the *reverse* KL(q || p). GRPO's KL penalty (Shao
    et al., 2024, eq. 4) is k3 with p the policy and q the reference model, so on samples from
    the current policy its gradient is, in expectation, that of KL(pi_ref || pi), not of
    KL(pi || pi_ref).

    ``logp`` and ``logq`` have one shape; the estimates have it too (average them yourself).
    """
    _check_same_shape(logp=logp, logq=logq)
    log_r = logq - logp
    return KLEstimates(k1=-log_r, k2=0.5 * log_r ** 2, k3=torch.expm1(log_r) - log_r)


def _check_categorical(logp: Tensor, name: str) -> None:
    """``logp`` (..., K) holds log-probabilities that sum to 1 over the last dimension."""
    if logp.ndim < 1:
        raise ValueError(f"{name} must have a last dimension of outcomes (..., K), got a scalar")
    _check_log_probs(**{name: logp})
    tol = 1e-9 if logp.dtype == torch.float64 else 1e-5
    total = torch.logsumexp(logp, dim=-1)
    if not bool((total.abs() <= tol).all()):
        worst = float(total.abs().max())
        raise ValueError(f"{name} must be a log-distribution over its last dimension (logsumexp 0); "
                         f"|logsumexp| reaches {worst:.3g}")


def kl_estimator_variances(logp: Tensor, logq: Tensor) -> KLEstimates:
    """Exact variances of k1, k2, k3 under x ~ p, for categorical p and q: (..., K) -> three (...).

    ``logp`` and ``logq`` are log-probabilities over the last dimension (K outcomes; each sums
    to 1; a batch of pairs in the leading dimensions). Each variance is
    Var_p[k] = sum_x p(x) (k(x) - E_p[k])^2, summed over the outcomes, not sampled.
    Outcomes with p(x) = 0 are never drawn and do not count; ``logq`` must be finite where
    p(x) > 0 (else KL(p || q) is infinite).

    Since k3 = k1 + (r - 1), Var[k3] - Var[k1] = Var_p[r] - 2 Cov_p(r, log r), where
    Var_p[r] = chi^2(q || p): k3 has the *larger* variance exactly when the spread of the
    ratio r = q/p outweighs twice its covariance with log r, as happens when q/p is far from 1
    (notebooks/18_rlhf_ppo works out when).
    """
    _check_same_shape(logp=logp, logq=logq)
    _check_categorical(logp, "logp")
    _check_categorical(logq, "logq")
    p = logp.exp()
    support = p > 0
    if not bool(torch.isfinite(torch.where(support, logq, torch.zeros_like(logq))).all()):
        raise ValueError("logq must be finite wherever p > 0 (q = 0 there makes KL(p || q) infinite)")
    zero = torch.zeros_like(logp)
    est = kl_estimators(torch.where(support, logp, zero), torch.where(support, logq, zero))  # 0 off the support

    def variance(k: Tensor) -> Tensor:
        mean = (p * k).sum(dim=-1, keepdim=True)
        return (p * (k - mean) ** 2).sum(dim=-1)

    return KLEstimates(*(variance(k) for k in est))


def kl_estimator_loss_gradients(logits: Tensor, logq: Tensor) -> KLEstimates:
    """What the gradient of each KL estimator estimates when it is used as a loss: three (..., K).

    p = softmax(``logits``) is the policy (K outcomes in the last dimension) and ``logq``
    (same shape; log-probabilities, finite) the reference. In practice an estimator k(x) is
    averaged over samples x ~ p and differentiated with the samples held fixed, through
    log p(x) only. The expected gradient of that loss is

        E_{x ~ p}[ d k(x) / d logits ] = sum_x p(x) d k(x) / d logits,

    computed here exactly, by autograd of sum_x stopgrad(p(x)) k(x). The results (derived
    in notebooks/18_rlhf_ppo): k1 gives 0 (the score function has mean 0), k2 gives the
    gradient of KL(p || q), and k3 the gradient of KL(q || p), which in logit space is p - q.
    Differentiating with respect to the logits of a softmax means each result sums to 0
    over the outcomes.
    """
    _check_same_shape(logits=logits, logq=logq)
    check_finite(logits, "logits")
    _check_categorical(logq, "logq")
    check_finite(logq, "logq")
    with torch.enable_grad():
        z = logits.detach().clone().requires_grad_(True)
        logp = torch.log_softmax(z, dim=-1)  # (..., K)
        weight = logp.detach().exp()  # the sampling distribution: not differentiated
        est = kl_estimators(logp, logq.detach())
        grads = [torch.autograd.grad((weight * k).sum(), z, retain_graph=True)[0] for k in est]
    return KLEstimates(*grads)


# ---------------------------------------------------------------- GRPO (chapter 20)


def group_normalized_rewards(rewards: Tensor, group_size: int, normalize_std: bool = True,
                             eps: float = 1e-4) -> Tensor:
    """GRPO's advantages: each reward minus its group's mean, over the group's std: (N,) -> (N,).

    ``rewards`` (N,) holds N / group_size groups of ``group_size`` consecutive completions of
    one prompt. A_i = (r_i - mean_g) / (std_g + eps) with the sample (Bessel-corrected,
    n - 1) standard deviation of the group, as in trl's ``GRPOTrainer``
    (``scale_rewards="group"``, eps = 1e-4); with ``normalize_std=False`` A_i = r_i - mean_g
    (Dr. GRPO's recommendation, trl's ``scale_rewards="none"``). The advantages of each group
    sum to zero; a group whose rewards are all equal gets zero advantages (no signal).
    """
    check_finite(_check_floating(rewards, "rewards"), "rewards")
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-d (N,), got shape {tuple(rewards.shape)}")
    group_size = check_positive_int("group_size", group_size)
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (a group of one has no baseline), "
                         f"got group_size={group_size}")
    N = rewards.shape[0]
    if N == 0 or N % group_size:
        raise ValueError(f"the number of rewards, {N}, must be a positive multiple of "
                         f"group_size={group_size}")
    if not isinstance(normalize_std, bool):
        raise TypeError(f"normalize_std must be a bool, got {normalize_std!r}")
    eps = _number("eps", eps)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got eps={eps}")
    grouped = rewards.view(-1, group_size)  # (N / G, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std:
        std = grouped.std(dim=1, keepdim=True, correction=1)
        if eps == 0 and bool((std == 0).any()):
            raise ValueError("a group has all-equal rewards (std 0) and eps=0: its advantages "
                             "would be 0/0; use eps > 0")
        centred = centred / (std + eps)
    return centred.reshape(N)


class GRPOLossOutput(NamedTuple):
    """The GRPO loss and its diagnostics (both detached): token-mean k3 KL and clip fraction."""

    loss: Tensor
    kl: Tensor | None
    clip_fraction: Tensor


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor | None, ref_logprobs: Tensor | None,
              advantages: Tensor, mask: Tensor, clip_eps: float, beta: float,
              aggregation: str = "sequence_mean", clip_eps_high: float | None = None,
              max_length: int | None = None, *, reduction: str | None = None) -> GRPOLossOutput:
    """The GRPO loss (Shao et al., 2024, eq. 3, negated): clipped surrogate plus beta * k3 KL.

    Per token (B, T): l_t = -min(rho_t A, clip(rho_t, 1 - eps, 1 + eps_high) A)
    + beta * k3_t, with rho_t = exp(logprobs - old_logprobs) and k3_t the k3 estimate of
    KL(pi || pi_ref) from :func:`kl_estimators` (logp = logprobs, logq = ref_logprobs).
    ``old_logprobs=None`` means the samples come from the current policy (one update per
    batch): rho = 1 in value, but still carries the gradient. ``advantages`` are (B,) (e.g.
    from :func:`group_normalized_rewards`) or (B, T). ``ref_logprobs`` may be None only
    when ``beta == 0``.

    ``aggregation`` turns the per-token losses into a scalar (with ``mask`` (B, T)):

    * ``"sequence_mean"``: mean over sequences of each sequence's token mean (the GRPO
      paper; trl ``loss_type="grpo"``). A token of a short response weighs more than one of
      a long response: the length bias of Liu et al., 2025.
    * ``"token_mean"``: sum over all tokens / number of tokens (trl ``"bnpo"``; DAPO's
      token-level loss on one device).
    * ``"constant"``: sum over all tokens / (B * max_length) with ``max_length`` (default
      T, at least T) the maximum response length (Dr. GRPO; trl ``"dr_grpo"`` with
      ``max_completion_length``).

    These are three of :func:`~llmbook.alignment.logprobs.reduce_tokens`'s reductions, which
    computes them; its other two are accepted too: ``"sum"`` and ``"none"`` (the per-token
    losses (B, T), zero off the mask). ``reduction`` is the same argument under the name the
    other losses use; pass one or the other.

    Returns ``GRPOLossOutput(loss, kl, clip_fraction)``; ``kl`` is the token mean of k3
    (None without ``ref_logprobs``), ``clip_fraction`` as in :func:`ppo_policy_loss`.
    """
    _check_same_shape(logprobs=logprobs)
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    if old_logprobs is None:
        old = logprobs.detach()
    else:
        _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
        old = old_logprobs.detach()
    beta = _number("beta", beta)
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got beta={beta}")
    if ref_logprobs is None:
        if beta:
            raise ValueError(f"ref_logprobs is needed for the KL penalty when beta={beta} > 0")
    else:
        _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    if reduction is not None:
        reduction = check_reduction(reduction)
        if aggregation != "sequence_mean" and aggregation != reduction:
            raise ValueError(f"aggregation={aggregation!r} and reduction={reduction!r} are the same "
                             "argument: pass one of them")
        aggregation = reduction
    aggregation = check_reduction(aggregation, REDUCTIONS, "aggregation")
    adv = _per_sequence_to_tokens(advantages, logprobs, "advantages").detach()
    low, high = _clip_range(clip_eps, clip_eps_high)
    m = _check_mask(mask, logprobs, "mask", "logprobs")
    B, T = logprobs.shape
    if max_length is None:
        max_length = T
    else:
        max_length = check_positive_int("max_length", max_length)
        if aggregation != "constant":
            raise ValueError("max_length applies to aggregation='constant' only")
        if max_length < T:
            raise ValueError(f"max_length must be at least the padded length T={T}, got "
                             f"max_length={max_length}")

    ratio = torch.exp(logprobs - old)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    kl = None
    if ref_logprobs is not None:
        k3 = kl_estimators(logprobs, ref_logprobs.detach()).k3
        if beta:
            per_token = per_token + beta * k3
        kl = masked_mean(k3, m).detach()

    loss = reduce_tokens(per_token, m, aggregation, B * max_length if aggregation == "constant" else None)
    is_clipped = ((ratio < 1 - low) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
    clip_fraction = masked_mean(is_clipped.to(logprobs.dtype), m).detach()
    return GRPOLossOutput(loss, kl, clip_fraction)
