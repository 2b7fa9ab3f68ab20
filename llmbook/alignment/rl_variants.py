"""RL for reasoning as practised in 2025: Dr. GRPO, DAPO and GSPO, next to GRPO.

Introduced in notebooks/20_grpo. Three corrections of GRPO (Shao et al., 2024), each a
change of one or two lines of the loss, each with an argument about what the original gets
wrong:

* **Dr. GRPO** (Liu et al., 2025, "Understanding R1-Zero-Like Training: A Critical
  Perspective"): drop the 1/|o_i| length normalisation (sum the tokens, divide by a
  constant) and the division of the advantage by the group's std. The std makes the
  expected update of a question with success probability p proportional to
  sqrt(p (1 - p)) d p/d theta instead of (G - 1) d p/d theta: GRPO then ascends
  2 arcsin(sqrt(p)), which overweights questions the policy nearly always or nearly never
  solves (:func:`expected_group_gradient`, exact for a one-logit Bernoulli policy, and
  :func:`arcsine_objective_symbolic`).
* **DAPO** (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale"): *clip-higher*, a wider upper clip 1 + eps_high (0.28) than lower 1 - eps_low
  (0.2), so that unlikely tokens with a positive advantage can grow; a *token-level* loss,
  every token of the generation batch weighted alike (:func:`dapo_loss`, with the batch's
  token count as an explicit normaliser so that micro-batches add up); *dynamic sampling*,
  dropping the groups whose rewards are all equal (:func:`informative_groups`); no KL term.
* **GSPO** (Zheng et al., 2025, "Group Sequence Policy Optimization"): one importance
  ratio per sequence, the geometric mean of its token ratios,
  s_i = exp(mean_t [log pi(o_it) - log pi_old(o_it)]) (:func:`sequence_log_ratio`),
  clipped per sequence with a very narrow range (3e-4, 4e-4 in the paper)
  (:func:`gspo_loss`).

:data:`VARIANTS` collects each method's settings, :func:`variant_loss` computes any of
them from raw rewards, and :func:`train_variant` runs one of them on chapter 20's
arithmetic task (the comparison that data/make_grpo_variants.py ships). The conventions (which quantity is averaged over what) follow
trl 1.16.0's ``GRPOTrainer`` (``loss_type`` "grpo", "dr_grpo", "dapo";
``importance_sampling_level="sequence"`` for GSPO), against which the tests compare.
"""

from __future__ import annotations

import math
import time
from itertools import product
from typing import Any

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.logprobs import (
    REDUCTIONS,
    SEQUENCE_REDUCTIONS,
    _check_mask,
    check_reduction,
    masked_mean,
    reduce_sequences,
    response_logprobs,
)
from llmbook.alignment.losses import (
    GRPOLossOutput,
    group_normalized_rewards,
    grpo_loss,
    kl_estimators,
)
from llmbook.alignment.reasoning import (
    GRPOBatch,
    accuracy,
    load_arithmetic_model,
    make_grpo_batch,
    problem_split,
)
from llmbook.training.optim import AdamW, clip_grad_norm_, cosine_schedule, set_lr
from llmbook.training.train import param_groups
from llmbook.validation import (
    check_finite,
    check_floating_tensor,
    check_positive_int,
    check_positive_number,
)

__all__ = [
    "VARIANTS",
    "VARIANT_RECIPE",
    "arcsine_objective_symbolic",
    "dapo_loss",
    "expected_group_gradient",
    "expected_group_gradient_enumerated",
    "gspo_loss",
    "informative_groups",
    "sequence_log_ratio",
    "train_variant",
    "variant_loss",
]

#: Each method's settings: advantage with or without the std, aggregation, clip range,
#: importance-sampling level, dynamic sampling (the papers' values; DAPO and GSPO use no KL).
VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"normalize_std": True, "aggregation": "sequence_mean", "clip_eps": 0.2, "clip_eps_high": 0.2,
             "level": "token", "dynamic_sampling": False},
    "dr_grpo": {"normalize_std": False, "aggregation": "constant", "clip_eps": 0.2, "clip_eps_high": 0.2,
                "level": "token", "dynamic_sampling": False},
    "dapo": {"normalize_std": True, "aggregation": "token_mean", "clip_eps": 0.2, "clip_eps_high": 0.28,
             "level": "token", "dynamic_sampling": True},
    "gspo": {"normalize_std": True, "aggregation": "sequence_mean", "clip_eps": 3e-4, "clip_eps_high": 4e-4,
             "level": "sequence", "dynamic_sampling": False},
}


def _check_logprobs(logprobs: object, name: str) -> Tensor:
    x = check_finite(check_floating_tensor(logprobs, name), name, allow_inf=True)
    if x.ndim != 2 or x.numel() == 0:
        raise ValueError(f"{name} must be a non-empty (B, T) tensor, got shape {tuple(x.shape)}")
    return x


def _check_like(x: object, like: Tensor, name: str) -> Tensor:
    x = check_finite(check_floating_tensor(x, name), name, allow_inf=True)
    if tuple(x.shape) != tuple(like.shape):
        raise ValueError(f"{name} must have the shape of logprobs, {tuple(like.shape)}, got {tuple(x.shape)}")
    return x


def _clip_range(clip_eps: object, clip_eps_high: object) -> tuple[float, float]:
    low = check_positive_number("clip_eps", clip_eps)
    if low >= 1:
        raise ValueError(f"clip_eps must lie in (0, 1), got clip_eps={clip_eps}")
    high = low if clip_eps_high is None else check_positive_number("clip_eps_high", clip_eps_high)
    return low, high


# ---------------------------------------------------------------- GSPO


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor | None, mask: Tensor) -> Tensor:
    """GSPO's length-normalised log importance ratio: (B, T) -> (B,).

    log s_i = (1 / |o_i|) sum_t m_it (log pi(o_it) - log pi_old(o_it)), the log of the
    geometric mean of the token ratios (Zheng et al., 2025, eq. 7). ``old_logprobs=None``
    means on-policy (value 0, gradient that of the mean of ``logprobs``). A row of
    ``mask`` with no ones is a ``ValueError``.
    """
    logprobs = _check_logprobs(logprobs, "logprobs")
    old = logprobs.detach() if old_logprobs is None else _check_like(old_logprobs, logprobs, "old_logprobs").detach()
    m = _check_mask(mask, logprobs, "mask", "logprobs")
    return masked_mean(logprobs - old, m, dim=1)


def gspo_loss(logprobs: Tensor, old_logprobs: Tensor | None, ref_logprobs: Tensor | None,
              advantages: Tensor, mask: Tensor, clip_eps: float, beta: float,
              clip_eps_high: float | None = None, *, reduction: str = "mean") -> GRPOLossOutput:
    """The GSPO loss (Zheng et al., 2025, eq. 5, negated), plus beta times the k3 KL.

    loss = mean_i [ -min(s_i A_i, clip(s_i, 1 - eps, 1 + eps_high) A_i) ]
    + beta * mean_i [token mean of k3_i], with s_i = exp(:func:`sequence_log_ratio`).
    ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``mask`` (B, T); ``advantages`` (B,).
    A sequence is clipped as a whole, so a few off-policy tokens cannot be clipped away
    one by one while the rest of the sequence is updated. trl 1.16.0:
    ``importance_sampling_level="sequence"``, ``loss_type="grpo"``. With responses of one
    token this is :func:`~llmbook.alignment.losses.grpo_loss`; on-policy (s_i = 1) its
    gradient equals GRPO's with ``aggregation="sequence_mean"``. Returns
    ``GRPOLossOutput(loss, kl, clip_fraction)``, the clip fraction over sequences.
    The loss is per sequence, so ``reduction`` is "mean" (default, the paper's 1/G), "sum"
    or "none" (the (B,) losses, each with its own beta * token mean of k3), through
    :func:`~llmbook.alignment.logprobs.reduce_sequences`.
    """
    reduction = check_reduction(reduction, SEQUENCE_REDUCTIONS)
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask)  # (B,)
    adv = check_finite(check_floating_tensor(advantages, "advantages"), "advantages").detach()
    if tuple(adv.shape) != tuple(log_s.shape):
        raise ValueError(f"advantages must be (B,) = {tuple(log_s.shape)}, one per sequence, got {tuple(adv.shape)}")
    low, high = _clip_range(clip_eps, clip_eps_high)
    beta = _beta(beta)
    m = _check_mask(mask, logprobs, "mask", "logprobs")
    s = torch.exp(log_s)
    per_sequence = -torch.minimum(s * adv, torch.clamp(s, 1 - low, 1 + high) * adv)
    loss = per_sequence.mean() if reduction == "mean" else reduce_sequences(per_sequence, reduction)
    kl = None
    if ref_logprobs is not None:
        k3 = kl_estimators(logprobs, _check_like(ref_logprobs, logprobs, "ref_logprobs").detach()).k3
        if beta:
            loss = loss + beta * reduce_sequences(masked_mean(k3, m, dim=1), reduction)
        kl = masked_mean(k3, m).detach()
    elif beta:
        raise ValueError(f"ref_logprobs is needed for the KL penalty when beta={beta} > 0")
    is_clipped = ((s < 1 - low) & (adv < 0)) | ((s > 1 + high) & (adv > 0))
    return GRPOLossOutput(loss, kl, is_clipped.to(logprobs.dtype).mean().detach())


def _beta(beta: object) -> float:
    if isinstance(beta, bool) or not isinstance(beta, int | float):
        raise TypeError(f"beta must be a number, got {beta!r} ({type(beta).__name__})")
    if not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got beta={beta}")
    return float(beta)


# ---------------------------------------------------------------- DAPO


def informative_groups(rewards: Tensor, group_size: int) -> Tensor:
    """DAPO's dynamic-sampling filter: which groups have rewards that are not all equal.

    ``rewards`` (N,) holds N / G groups of G = ``group_size`` consecutive completions of one
    prompt; returns (N / G,) bool. A group whose rewards are all equal has all-zero
    group-relative advantages and so no policy gradient; DAPO over-samples prompts and keeps
    only the informative groups (Yu et al., 2025, sec. 3.2). Expand to one flag per
    completion with ``informative_groups(r, G).repeat_interleave(G)``.
    """
    rewards = check_finite(check_floating_tensor(rewards, "rewards"), "rewards")
    group_size = check_positive_int("group_size", group_size)
    if rewards.ndim != 1 or rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (N,) with N a positive multiple of group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)
    return (grouped != grouped[:, :1]).any(dim=1)


def dapo_loss(logprobs: Tensor, old_logprobs: Tensor | None, advantages: Tensor, mask: Tensor,
              clip_eps: float = 0.2, clip_eps_high: float = 0.28, num_tokens: int | None = None, *,
              reduction: str = "token_mean") -> Tensor:
    """DAPO's loss (Yu et al., 2025, eq. 8, negated): token-level, clip-higher, no KL.

    loss = -(1 / N_tok) sum_{i,t} m_it min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps_high) A_i),
    with rho_it the token ratio and N_tok = ``num_tokens``: the number of response tokens
    in the whole generation batch. Default: ``mask.sum()``, the batch passed in, where this
    is :func:`~llmbook.alignment.losses.grpo_loss` with ``aggregation="token_mean"``; pass
    the batch's count when ``logprobs`` is one micro-batch of it, and the micro-batch losses
    then add up to the batch's (trl 1.16.0 ``loss_type="dapo"``, whose ``num_items_in_batch``
    is this count). ``advantages`` (B,) or (B, T). Returns the scalar loss.

    ``num_tokens`` N_tok makes the token mean a "constant" reduction with normaliser N_tok
    (:func:`~llmbook.alignment.logprobs.reduce_tokens`). ``reduction`` swaps DAPO's token
    mean for any other reduction of the same per-token losses ("none" returns them, (B, T));
    ``num_tokens`` applies to the default "token_mean" only.
    """
    reduction = check_reduction(reduction, REDUCTIONS)
    logprobs = _check_logprobs(logprobs, "logprobs")
    m = _check_mask(mask, logprobs, "mask", "logprobs")
    if reduction != "token_mean":
        if num_tokens is not None:
            raise ValueError(f"num_tokens applies to reduction='token_mean' only, got reduction={reduction!r}")
        if reduction == "constant":
            raise ValueError("reduction='constant' is reduction='token_mean' with num_tokens=C: pass num_tokens")
        return grpo_loss(logprobs, old_logprobs, None, advantages, mask, clip_eps, 0.0, reduction,
                         clip_eps_high=clip_eps_high).loss
    if num_tokens is None:
        num_tokens = int(m.sum())
        if num_tokens == 0:
            raise ValueError("mask has no ones: the token-level loss is undefined")
    else:
        num_tokens = check_positive_int("num_tokens", num_tokens)
        if num_tokens < int(m.sum()):
            raise ValueError(f"num_tokens={num_tokens} is fewer than the {int(m.sum())} response tokens "
                             "passed in: it must count the whole batch")
    out = grpo_loss(logprobs, old_logprobs, None, advantages, mask, clip_eps, 0.0, "token_mean",
                    clip_eps_high=clip_eps_high)
    return out.loss * (m.sum() / num_tokens)


def variant_loss(variant: str, logprobs: Tensor, old_logprobs: Tensor | None, rewards: Tensor,
                 group_size: int, mask: Tensor, max_length: int | None = None) -> Tensor:
    """The loss of one method of :data:`VARIANTS` from raw rewards, with its own settings.

    Advantages from :func:`~llmbook.alignment.losses.group_normalized_rewards` (with or
    without the std), then: "grpo", "dr_grpo" -> :func:`~llmbook.alignment.losses.grpo_loss`
    ("dr_grpo" divides by B * ``max_length``, default T); "dapo" -> :func:`dapo_loss` on the
    informative groups only (0 with no gradient-carrying token if none is informative);
    "gspo" -> :func:`gspo_loss`. No KL term (beta = 0). Shapes: (B, T), (B,), (B, T).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    v = VARIANTS[variant]
    adv = group_normalized_rewards(rewards, group_size, normalize_std=v["normalize_std"])
    if variant == "gspo":
        return gspo_loss(logprobs, old_logprobs, None, adv, mask, v["clip_eps"], 0.0, v["clip_eps_high"]).loss
    if variant == "dapo":
        keep = informative_groups(rewards, group_size).repeat_interleave(group_size)
        if not bool(keep.any()):
            return (logprobs * 0).sum()
        old = None if old_logprobs is None else old_logprobs[keep]
        return dapo_loss(logprobs[keep], old, adv[keep], mask[keep], v["clip_eps"], v["clip_eps_high"])
    return grpo_loss(logprobs, old_logprobs, None, adv, mask, v["clip_eps"], 0.0, v["aggregation"],
                     clip_eps_high=v["clip_eps_high"],
                     max_length=max_length if variant == "dr_grpo" else None).loss


# ---------------------------------------------------------------- Dr. GRPO: the bias of the std


def _check_bernoulli(p: object, group_size: object) -> tuple[float, int]:
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p < 1:
        raise ValueError(f"p must be a number in (0, 1), got p={p!r}")
    group_size = check_positive_int("group_size", group_size)
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got group_size={group_size}")
    return float(p), group_size


def expected_group_gradient(p: float, group_size: int, normalize_std: bool, eps: float = 1e-4) -> float:
    """E[sum_i A_i d/dtheta log pi(o_i)] for one question, exactly, for a Bernoulli policy.

    The policy answers right with probability p = sigmoid(theta), so d/dtheta log pi(o) = o - p
    for an answer o in {0, 1} (reward = o). A group of G = ``group_size`` answers with c right
    has advantages from :func:`~llmbook.alignment.losses.group_normalized_rewards` (with
    ``eps``), and since they sum to zero the group's gradient is c * A_right(c). Averaged
    over c ~ Binomial(G, p) in float64. Without the std it is (G - 1) p (1 - p) =
    (G - 1) dp/dtheta, the true gradient scaled by G - 1; with the std it tends to
    (G - 1) sqrt(p (1 - p)) = (G - 1) d/dtheta 2 arcsin(sqrt p) for large G.
    """
    p, G = _check_bernoulli(p, group_size)
    total = 0.0
    for c in range(1, G):  # c = 0 or G: all-equal rewards, zero advantages
        rewards = torch.tensor([1.0] * c + [0.0] * (G - c), dtype=torch.float64)
        a_right = float(group_normalized_rewards(rewards, G, normalize_std=normalize_std, eps=eps)[0])
        total += math.comb(G, c) * p**c * (1 - p) ** (G - c) * c * a_right
    return total


def expected_group_gradient_enumerated(p: float, group_size: int, normalize_std: bool,
                                       eps: float = 1e-4) -> float:
    """:func:`expected_group_gradient` by brute force: all 2^G outcomes, autograd for the score.

    For every sequence of G answers (o_1 .. o_G) in {0, 1}^G: its probability, its advantages,
    and the gradient of sum_i A_i log pi(o_i) with respect to theta by autograd, with
    pi(1) = sigmoid(theta). Exponential in G: a reference for small G.
    """
    p, G = _check_bernoulli(p, group_size)
    theta = torch.tensor(math.log(p / (1 - p)), dtype=torch.float64, requires_grad=True)
    log_right, log_wrong = torch.nn.functional.logsigmoid(theta), torch.nn.functional.logsigmoid(-theta)
    total = torch.zeros((), dtype=torch.float64)
    for outcome in product((0.0, 1.0), repeat=G):
        r = torch.tensor(outcome, dtype=torch.float64)
        prob = math.prod(p if o else 1 - p for o in outcome)
        adv = group_normalized_rewards(r, G, normalize_std=normalize_std, eps=eps)
        total = total + prob * (adv * torch.where(r > 0, log_right, log_wrong)).sum()
    (grad,) = torch.autograd.grad(total, theta)
    return float(grad)


def arcsine_objective_symbolic() -> dict[str, sp.Expr]:
    """What the std turns the objective into, derived in SymPy (large-G limit).

    Without the std the expected update of a question is (G - 1) dp/dtheta: gradient ascent
    on p. With it, each advantage is divided by sqrt(p (1 - p)), so the update is
    (G - 1) p (1 - p) / sqrt(p (1 - p)) = (G - 1) d/dtheta F(p) with
    F(p) = 2 arcsin(sqrt p). Returns the symbols' expressions: ``"no_std"`` (G - 1) p (1 - p),
    ``"with_std"`` (G - 1) sqrt(p (1 - p)), ``"F"``, ``"dF_dtheta"`` = F'(p) dp/dtheta (which
    simplifies to sqrt(p (1 - p))), and the symbols ``"p"``, ``"G"``, ``"theta"``.
    """
    p, G, theta = sp.Symbol("p", positive=True), sp.Symbol("G", positive=True), sp.Symbol("theta", real=True)
    # E[c (1 - c/G)] over c ~ Binomial(G, p), from E[c] = G p and E[c^2] = G p (1 - p) + G^2 p^2
    mean_c, mean_c2 = G * p, G * p * (1 - p) + G**2 * p**2
    no_std = sp.factor(sp.expand(mean_c - mean_c2 / G))
    F = 2 * sp.asin(sp.sqrt(p))
    dF = sp.simplify(sp.diff(F, p) * p * (1 - p))  # chain rule: dp/dtheta = p (1 - p) for p = sigmoid(theta)
    return {"no_std": no_std, "with_std": (G - 1) * sp.sqrt(p * (1 - p)), "F": F, "dF_dtheta": dF,
            "p": p, "G": G, "theta": theta}


# ---------------------------------------------------------------- the variants on the arithmetic task

#: The comparison's settings: chapter 20's GRPO recipe (:data:`~llmbook.alignment.reasoning.GRPO_RECIPE`)
#: shortened, without the KL term (DAPO and GSPO drop it; so every variant does), on one
#: full batch per update (no micro-batches needed at this size).
VARIANT_RECIPE: dict[str, Any] = {
    "start": "arithmetic_sft", "seed": 0, "steps": 200, "prompts_per_step": 64, "group_size": 8,
    "temperature": 1.0, "updates_per_batch": 2, "lr": 5e-4, "warmup_steps": 10, "grad_clip": 1.0,
    "max_sampling_rounds": 3, "eval_every": 20, "eval_samples": 8, "eval_seed": 1234,
}


def _cat_batches(batches: list[GRPOBatch], rows: int) -> GRPOBatch:
    fields = [torch.cat([getattr(b, f) for b in batches])[:rows] if f != "ref_logprobs" else None
              for f in GRPOBatch._fields]
    return GRPOBatch(*fields)


def train_variant(variant: str, recipe: dict[str, Any]) -> dict[str, Any]:
    """Train the shipped SFT arithmetic model with one method of :data:`VARIANTS`; its curves.

    Each step samples ``group_size`` answers to each of ``prompts_per_step`` training
    problems (:func:`~llmbook.alignment.reasoning.make_grpo_batch`); for DAPO, groups with
    all-equal rewards are dropped and more problems sampled, up to ``max_sampling_rounds``
    rounds, until the batch is full again (dynamic sampling). Then ``updates_per_batch``
    AdamW steps on :func:`variant_loss` (the first on-policy, the next ones off-policy, so
    that the clipping acts). Returns per-step ``reward`` (of the first round's samples, the
    same measurement for every variant), ``length``, ``generated`` (answers sampled),
    held-out greedy accuracy every ``eval_every`` steps, the final greedy and sampled
    accuracy, and the wall time.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    torch.set_num_threads(1)
    began = time.perf_counter()
    policy, _ = load_arithmetic_model(recipe["start"])
    policy.train()
    opt = AdamW(param_groups(policy, 0.0), lr=recipe["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    train, test = problem_split("train"), problem_split("test")
    g = torch.Generator().manual_seed(recipe["seed"])
    G, M = recipe["group_size"], recipe["prompts_per_step"]
    settings = VARIANTS[variant]
    curve: dict[str, list] = {"reward": [], "length": [], "generated": [], "kept_groups": [],
                              "eval_steps": [], "test_accuracy": []}
    for step in range(recipe["steps"]):
        if step % recipe["eval_every"] == 0:
            curve["eval_steps"].append(step)
            curve["test_accuracy"].append(accuracy(policy, test))
        set_lr(opt, cosine_schedule(step, recipe["lr"], recipe["lr"], recipe["warmup_steps"], recipe["steps"]))
        batches, kept, generated = [], 0, 0
        for round_ in range(recipe["max_sampling_rounds"] if settings["dynamic_sampling"] else 1):
            problems = train[torch.randint(len(train), (M,), generator=g)]
            batch = make_grpo_batch(policy, None, problems, G, recipe["temperature"], settings["normalize_std"], g)
            generated += len(batch.rewards)
            if round_ == 0:
                curve["reward"].append(float(batch.rewards.mean()))
                curve["length"].append(float(batch.mask.sum(1).double().mean()))
            if settings["dynamic_sampling"]:
                keep = informative_groups(batch.rewards, G).repeat_interleave(G)
                batch = GRPOBatch(*(None if x is None else x[keep] for x in batch))
            batches.append(batch)
            kept += len(batch.rewards) // G
            if kept >= M:
                break
        if kept == 0:
            curve["generated"].append(generated)
            curve["kept_groups"].append(0)
            continue
        batch = _cat_batches(batches, M * G)
        curve["generated"].append(generated)
        curve["kept_groups"].append(len(batch.rewards) // G)
        for _ in range(recipe["updates_per_batch"]):
            logp = response_logprobs(policy, batch.prompts, batch.responses)
            loss = variant_loss(variant, logp, batch.old_logprobs, batch.rewards, G, batch.mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_grad_norm_(policy.parameters(), recipe["grad_clip"])
            opt.step()
    curve["eval_steps"].append(recipe["steps"])
    curve["test_accuracy"].append(accuracy(policy, test))
    policy.eval()
    sampled = accuracy(policy, test, 1.0, recipe["eval_samples"], torch.Generator().manual_seed(recipe["eval_seed"]))
    return {"variant": variant, "curve": curve, "greedy": curve["test_accuracy"][-1], "sampled": sampled,
            "train_seconds": time.perf_counter() - began}
