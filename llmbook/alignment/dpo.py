"""DPO: preference optimisation without a reward model or sampling.

Introduced in notebooks/19_dpo. Direct Preference Optimization (Rafailov et al., 2023,
"Direct Preference Optimization: Your Language Model is Secretly a Reward Model") starts
from the objective RLHF maximises (chapter 18),

    max_pi  E_{y ~ pi(.|x)} [r(x, y)] - beta KL(pi(.|x) || pi_ref(.|x)),

whose maximiser is known in closed form (their eq. 4):

    pi*(y | x) = pi_ref(y | x) exp(r(x, y) / beta) / Z(x),
    Z(x) = sum_y pi_ref(y | x) exp(r(x, y) / beta).

Solved for the reward, r = beta log(pi* / pi_ref) + beta log Z(x); in the Bradley-Terry
probability of a preference only the difference r(x, y_w) - r(x, y_l) enters, so Z(x)
cancels and the preference likelihood is a function of the policy alone. Its negative log
is the DPO loss (:func:`llmbook.alignment.losses.dpo_loss`), minimised on the preference
pairs directly, with no reward model and no sampling.

This module holds:

* :func:`optimal_policy`, :func:`log_partition`, :func:`kl_regularized_objective`: the
  closed form on a finite set of responses, where everything can be computed exactly, and
  :func:`expected_dpo_loss`, the DPO loss in expectation over pairs of such responses,
  whose minimiser is that closed form;
* :func:`sequence_logprobs`, :func:`reference_logprobs`: log pi(y | x) summed over the
  response tokens (:func:`llmbook.alignment.logprobs.response_logprobs`), and those of the
  frozen reference, computed once before training;
* :func:`dpo_batch_loss`, :func:`dpo_step`: the DPO loss of a batch of pairs (the policy
  runs once on chosen and rejected together) and one optimiser step;
* :func:`dpo_logprob_gradients`: the gradient of the loss with respect to the sequence
  log-probabilities, derived by hand (each pair weighted by sigma(r_l - r_w));
* :func:`implicit_reward`: beta log(pi / pi_ref), the reward DPO's policy implies;
  :func:`reward_correlation`: its Pearson and Spearman correlations with a true reward;
* :func:`train_dpo` and :func:`load_dpo_policy`: DPO on the preferences of chapter 17,
  shipped as artifact ``"dpo"`` (:mod:`llmbook.alignment.shipped`);
  :func:`comparison_rows`: the table that sets the base model, DPO and PPO side by side;
  :func:`ppo_compute_to_reward`: PPO's token passes and time until it matches a reward.
"""

from __future__ import annotations

import copy
import time
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from llmbook.alignment.logprobs import _check_prompt_response, response_logprobs
from llmbook.alignment.losses import DPO_LOSS_TYPES, dpo_loss
from llmbook.alignment.reward_model import pearson_correlation, spearman_correlation
from llmbook.alignment.shipped import load_artifact, register
from llmbook.validation import (
    check_finite,
    check_positive_int,
    check_positive_number,
    check_token_ids,
)
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "DPO_RECIPE",
    "DPOBatch",
    "comparison_rows",
    "dpo_batch_loss",
    "dpo_logprob_gradients",
    "dpo_step",
    "expected_dpo_loss",
    "implicit_reward",
    "kl_regularized_objective",
    "load_dpo_policy",
    "log_partition",
    "optimal_policy",
    "ppo_compute_to_reward",
    "reference_logprobs",
    "reward_correlation",
    "sequence_logprobs",
    "train_dpo",
]

#: The shipped DPO run (artifact ``"dpo"``): LoRA adapters on every linear layer of the
#: book's text model, one pass over the 4096 preference pairs of chapter 17. beta = 0.3 is
#: chapter 18's KL coefficient, so DPO and PPO aim at the same optimal policy.
DPO_RECIPE: dict[str, Any] = {
    "base": "text", "beta": 0.3, "loss_type": "sigmoid", "num_pairs": 4096,
    "lora": {"targets": ["q_proj", "k_proj", "v_proj", "o_proj", "fc", "proj"], "r": 8,
             "alpha": 16},
    "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 8, "batch_pairs": 64, "epochs": 1,
    "grad_clip": 1.0, "eval_every": 8, "num_eval_prompts": 512, "num_test_pairs": 512,
    "seed": 0, "threads": 1,
}


# ---------------------------------------------------------------- validation


def _check_prompts_responses(prompts: object, responses: object,
                             responses_name: str = "responses") -> tuple[Tensor, Tensor]:
    _check_prompt_response(prompts, responses, "prompts", responses_name)
    if prompts.shape[0] == 0:
        raise ValueError("the batch is empty (0 prompts)")
    return prompts, responses


def _check_distribution(p: Tensor, name: str) -> None:
    _check_floating(p, name)
    if p.ndim == 0 or p.shape[-1] == 0:
        raise ValueError(f"{name} must have a last axis of responses, got shape {tuple(p.shape)}")
    if bool((p < 0).any()) or not torch.allclose(p.sum(-1), torch.ones((), dtype=p.dtype),
                                                  atol=1e-6 if p.dtype == torch.float64 else 1e-4):
        raise ValueError(f"{name} must be probabilities (>= 0, summing to 1 over the last axis)")


# ---------------------------------------------------------------- the closed form


def optimal_policy(ref_probs: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """pi*(y) = pi_ref(y) exp(r(y) / beta) / Z over a finite set of responses: (..., K) -> (..., K).

    The maximiser of :func:`kl_regularized_objective` (Rafailov et al., 2023, eq. 4).
    Computed as softmax(log pi_ref + r / beta) along the last axis, so large r / beta does
    not overflow; responses with pi_ref = 0 keep probability 0.
    """
    _check_distribution(ref_probs, "ref_probs")
    check_finite(_check_floating(rewards, "rewards"), "rewards")
    if tuple(rewards.shape) != tuple(ref_probs.shape):
        raise ValueError(f"rewards must have the shape of ref_probs, {tuple(ref_probs.shape)}, "
                         f"got {tuple(rewards.shape)}")
    beta = check_positive_number("beta", beta)
    return torch.softmax(torch.log(ref_probs) + rewards / beta, dim=-1)


def log_partition(ref_probs: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """log Z = log sum_y pi_ref(y) exp(r(y) / beta) over the last axis: (..., K) -> (...).

    beta log Z is the maximum of the KL-regularised objective (attained at pi*).
    """
    optimal_policy(ref_probs, rewards, beta)  # validates
    return torch.logsumexp(torch.log(ref_probs) + rewards / beta, dim=-1)


def kl_regularized_objective(policy_probs: Tensor, ref_probs: Tensor, rewards: Tensor,
                             beta: float) -> Tensor:
    """J(pi) = sum_y pi(y) r(y) - beta sum_y pi(y) log(pi(y) / pi_ref(y)): (..., K) -> (...).

    The objective RLHF maximises, on a finite set of K responses. Terms with pi(y) = 0
    contribute 0 (the limit of p log p); pi(y) > 0 where pi_ref(y) = 0 gives KL = inf.
    """
    _check_distribution(policy_probs, "policy_probs")
    _check_distribution(ref_probs, "ref_probs")
    check_finite(_check_floating(rewards, "rewards"), "rewards")
    for name, t in (("ref_probs", ref_probs), ("rewards", rewards)):
        if tuple(t.shape) != tuple(policy_probs.shape):
            raise ValueError(f"{name} must have the shape of policy_probs, "
                             f"{tuple(policy_probs.shape)}, got {tuple(t.shape)}")
    beta = check_positive_number("beta", beta)
    safe = torch.where(policy_probs > 0, policy_probs, torch.ones_like(policy_probs))
    kl_terms = torch.where(policy_probs > 0, policy_probs * (torch.log(safe) - torch.log(ref_probs)),
                           torch.zeros_like(policy_probs))
    return (policy_probs * rewards).sum(-1) - beta * kl_terms.sum(-1)


def expected_dpo_loss(policy_probs: Tensor, ref_probs: Tensor, rewards: Tensor, beta: float,
                      bt_scale: float = 1.0) -> Tensor:
    """The DPO loss in expectation over all pairs of K responses: (K,) -> () .

    Pairs (i, j) are drawn from pi_ref x pi_ref (both responses sampled from the reference,
    as the book's preference data were) and labelled "i preferred" with the Bradley-Terry
    probability sigma(bt_scale (r_i - r_j)), else "j preferred"; with
    r_hat = beta log(pi / pi_ref), the expected loss is (the two labels of a drawn pair are the
    terms (i, j) and (j, i) of one sum, and each pair can be drawn in either order)

        L(pi) = 2 sum_ij pi_ref(i) pi_ref(j) sigma(s (r_i - r_j)) (-log sigma(r_hat_i - r_hat_j)),

    which is log 2 at pi = pi_ref, like the DPO loss at the start of training.

    A cross-entropy between the true and the modelled preference probabilities: it is
    smallest when r_hat_i - r_hat_j = s (r_i - r_j) for all pairs, i.e. at
    pi = :func:`optimal_policy` (pi_ref, s r, beta). Differentiable in ``policy_probs``.
    """
    _check_distribution(policy_probs, "policy_probs")
    _check_distribution(ref_probs, "ref_probs")
    _check_floating(rewards, "rewards")
    if policy_probs.ndim != 1:
        raise ValueError(f"policy_probs must be 1-d (K,), got shape {tuple(policy_probs.shape)}")
    for name, t in (("ref_probs", ref_probs), ("rewards", rewards)):
        if tuple(t.shape) != tuple(policy_probs.shape):
            raise ValueError(f"{name} must have the shape of policy_probs, "
                             f"{tuple(policy_probs.shape)}, got {tuple(t.shape)}")
    beta = check_positive_number("beta", beta)
    bt_scale = check_positive_number("bt_scale", bt_scale)
    r_hat = beta * (torch.log(policy_probs) - torch.log(ref_probs))  # (K,)
    prefer = torch.sigmoid(bt_scale * (rewards[:, None] - rewards[None, :]))  # (K, K): P(i > j)
    weight = ref_probs[:, None] * ref_probs[None, :]  # (K, K)
    return -2 * (weight * prefer * torch.nn.functional.logsigmoid(r_hat[:, None] - r_hat[None, :])).sum()


# ---------------------------------------------------------------- sequence log-probabilities


def sequence_logprobs(model: nn.Module, prompts: Tensor, responses: Tensor,
                      batch_size: int | None = None) -> Tensor:
    """log pi(y | x) = sum_t log pi(y_t | x, y_<t): prompts (N, P), responses (N, R) -> (N,).

    The per-token log-probabilities of :func:`~llmbook.alignment.logprobs.response_logprobs`
    summed over the response. With ``batch_size`` the rows are scored in chunks of that many
    (for large N without gradients); otherwise in one pass, differentiable.
    """
    prompts, responses = _check_prompts_responses(prompts, responses)
    if batch_size is None:
        return response_logprobs(model, prompts, responses).sum(-1)  # (N,)
    batch_size = check_positive_int("batch_size", batch_size)
    return torch.cat([response_logprobs(model, prompts[i:i + batch_size],
                                        responses[i:i + batch_size]).sum(-1)
                      for i in range(0, prompts.shape[0], batch_size)])


@torch.no_grad()
def reference_logprobs(reference: nn.Module, prompts: Tensor, chosen: Tensor, rejected: Tensor,
                       batch_size: int = 256) -> tuple[Tensor, Tensor]:
    """log pi_ref(y_w | x) and log pi_ref(y_l | x) of every pair, without gradients: (N,), (N,).

    The reference is frozen, so these are computed once before training and reused at every
    step: the policy is the only model DPO runs per step.
    """
    prompts, chosen = _check_prompts_responses(prompts, chosen, "chosen")
    _check_pair_shapes(chosen, rejected)
    was_training = reference.training
    reference.eval()
    out = (sequence_logprobs(reference, prompts, chosen, batch_size),
           sequence_logprobs(reference, prompts, rejected, batch_size))
    reference.train(was_training)
    return out


def _check_pair_shapes(chosen: Tensor, rejected: object) -> None:
    check_token_ids(rejected, "rejected", ndim=2)
    if tuple(rejected.shape) != tuple(chosen.shape):
        raise ValueError(f"rejected must have the shape of chosen, {tuple(chosen.shape)}, got "
                         f"{tuple(rejected.shape)}")


# ---------------------------------------------------------------- the DPO loss of a batch


class DPOBatch(NamedTuple):
    """The DPO loss of a batch and its implicit rewards.

    ``loss``: a scalar (mean or sum over pairs) or (N,) per pair; ``chosen_rewards`` and
    ``rejected_rewards`` (N,): beta log(pi / pi_ref) of y_w and y_l (detached).
    """

    loss: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor

    @property
    def accuracy(self) -> float:
        """Fraction of pairs whose chosen response has the larger implicit reward."""
        return float((self.chosen_rewards > self.rejected_rewards).double().mean())


def dpo_batch_loss(policy: nn.Module, prompts: Tensor, chosen: Tensor, rejected: Tensor,
                   ref_chosen_logps: Tensor, ref_rejected_logps: Tensor, beta: float,
                   loss_type: str = "sigmoid", reduction: str = "mean") -> DPOBatch:
    """The DPO (or IPO) loss of N preference pairs, differentiable in the policy.

    ``prompts`` (N, P), ``chosen`` and ``rejected`` (N, R) token ids; ``ref_chosen_logps``
    and ``ref_rejected_logps`` (N,) from :func:`reference_logprobs`. The policy runs once on
    the 2N sequences [x; y_w] and [x; y_l] stacked, and the sequence log-probabilities go to
    :func:`~llmbook.alignment.losses.dpo_loss` (Rafailov et al., 2023, eq. 7):

        L = -mean_i log sigma(beta (log pi(y_w)/pi_ref(y_w) - log pi(y_l)/pi_ref(y_l))).

    ``reduction="none"`` gives the loss of each pair; for IPO (Azar et al., 2023) the
    log-ratios are averaged over the R response tokens, as in trl.
    """
    prompts, chosen = _check_prompts_responses(prompts, chosen, "chosen")
    _check_pair_shapes(chosen, rejected)
    n = prompts.shape[0]
    for name, t in (("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps)):
        _check_floating(t, name)
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} must have shape (N,) = ({n},), got {tuple(t.shape)}")
    beta = check_positive_number("beta", beta)
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {DPO_LOSS_TYPES}, got {loss_type!r}")
    both = sequence_logprobs(policy, torch.cat([prompts, prompts]), torch.cat([chosen, rejected]))
    pol_chosen, pol_rejected = both[:n], both[n:]  # (N,), (N,)
    ref_c, ref_r = ref_chosen_logps.to(both.dtype), ref_rejected_logps.to(both.dtype)
    lengths = None
    if loss_type == "ipo":
        lengths = torch.full((n,), chosen.shape[1], dtype=both.dtype)
    loss, r_w, r_l = dpo_loss(pol_chosen, pol_rejected, ref_c, ref_r, beta, loss_type,
                              chosen_lengths=lengths, rejected_lengths=lengths, reduction=reduction)
    return DPOBatch(loss, r_w, r_l)


def dpo_step(policy: nn.Module, optimizer: torch.optim.Optimizer, prompts: Tensor, chosen: Tensor,
             rejected: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor, beta: float,
             grad_clip: float | None = None, loss_type: str = "sigmoid") -> dict[str, float]:
    """One optimiser step on the DPO loss of a batch; returns its diagnostics.

    ``loss``, ``accuracy`` (fraction of pairs ranked rightly by the implicit reward, before
    the step), ``chosen_reward`` and ``rejected_reward`` (batch means of beta log pi/pi_ref)
    and ``grad_norm`` (before clipping to ``grad_clip``, if given).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch Optimizer, got {type(optimizer).__name__}")
    optimizer.zero_grad(set_to_none=True)
    out = dpo_batch_loss(policy, prompts, chosen, rejected, ref_chosen_logps, ref_rejected_logps,
                         beta, loss_type)
    out.loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if grad_clip is None:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad)
                                                     for p in params if p.grad is not None]))
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, check_positive_number("grad_clip", grad_clip))
    optimizer.step()
    return {"loss": float(out.loss.detach()), "accuracy": out.accuracy,
            "chosen_reward": float(out.chosen_rewards.mean()),
            "rejected_reward": float(out.rejected_rewards.mean()), "grad_norm": float(norm)}


def dpo_logprob_gradients(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor,
                          ref_chosen_logps: Tensor, ref_rejected_logps: Tensor,
                          beta: float) -> tuple[Tensor, Tensor]:
    """The gradient of the mean DPO loss with respect to log pi(y_w) and log pi(y_l): (N,), (N,).

    With the implicit rewards r_w = beta log(pi(y_w) / pi_ref(y_w)) and r_l likewise, the
    loss of one pair is -log sigma(r_w - r_l), and sigma'(u) = sigma(u) sigma(-u) gives

        dL/d log pi(y_w) = -beta sigma(r_l - r_w) / N,   dL/d log pi(y_l) = +beta sigma(r_l - r_w) / N.

    A pair counts with weight sigma(r_l - r_w): near 1 when the implicit reward ranks it
    wrongly, near 0 when it already ranks it rightly by a wide margin. By the chain rule the
    gradient for the parameters is the weighted sum of the gradients of log pi(y_w) and
    log pi(y_l) (Rafailov et al., 2023, section 4).
    """
    from llmbook.alignment.losses import _check_pairs

    _check_pairs(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                 ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    beta = check_positive_number("beta", beta)
    r_w = beta * (policy_chosen_logps - ref_chosen_logps)
    r_l = beta * (policy_rejected_logps - ref_rejected_logps)
    weight = torch.sigmoid(r_l - r_w) * beta / max(r_w.numel(), 1)
    return -weight, weight


# ---------------------------------------------------------------- the implicit reward


@torch.no_grad()
def implicit_reward(policy: nn.Module, reference: nn.Module, prompts: Tensor, responses: Tensor,
                    beta: float, batch_size: int = 256) -> Tensor:
    """beta (log pi(y | x) - log pi_ref(y | x)) of each response: (N, P), (N, R) -> (N,).

    The reward a DPO policy implies: by the closed form it equals the reward it was trained
    towards up to beta log Z(x), a term that depends on the prompt alone.
    """
    prompts, responses = _check_prompts_responses(prompts, responses)
    beta = check_positive_number("beta", beta)
    return beta * (sequence_logprobs(policy, prompts, responses, batch_size)
                   - sequence_logprobs(reference, prompts, responses, batch_size))


def reward_correlation(predicted: Tensor, true: Tensor) -> tuple[float, float]:
    """Pearson and Spearman correlation of two (N,) reward vectors: (pearson, spearman).

    Chapter 17's :func:`~llmbook.alignment.reward_model.pearson_correlation` and
    :func:`~llmbook.alignment.reward_model.spearman_correlation` (tied values get their average
    rank, as ``scipy.stats.spearmanr`` and pandas' ``DataFrame.corr`` do; float64), as
    floats. Needs N >= 2 and neither vector constant.
    """
    for name, t in (("predicted", predicted), ("true", true)):
        check_finite(_check_floating(t, name), name)
        if t.ndim != 1:
            raise ValueError(f"{name} must be 1-d (N,), got shape {tuple(t.shape)}")
    if predicted.shape != true.shape:
        raise ValueError(f"predicted and true must have one shape, got {tuple(predicted.shape)} "
                         f"and {tuple(true.shape)}")
    if predicted.numel() < 2:
        raise ValueError(f"predicted and true need at least 2 values for a correlation, got "
                         f"{predicted.numel()}")
    for name, t in (("predicted", predicted), ("true", true)):
        if bool((t == t[0]).all()):
            raise ValueError(f"{name} is constant (zero standard deviation): it has no correlation")
    return (float(pearson_correlation(predicted, true)),
            float(spearman_correlation(predicted, true)))


# ---------------------------------------------------------------- the shipped run


def _lora_policy(base: nn.Module, lora: dict[str, Any], seed: int) -> nn.Module:
    from llmbook.alignment.lora import apply_lora

    return apply_lora(copy.deepcopy(base), lora["targets"], lora["r"], lora["alpha"],
                      generator=torch.Generator().manual_seed(seed))


def train_dpo(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """DPO on the preference pairs of chapter 17, from the book's text model; ``(tensors, info)``.

    The policy is the text model with LoRA adapters (``recipe["lora"]``); the reference is
    the same model, frozen. The reference's sequence log-probabilities of the first
    ``num_pairs`` training pairs are computed once; then ``epochs`` passes over the pairs in
    shuffled batches of ``batch_pairs`` (:func:`dpo_step`), AdamW with linear warmup and cosine
    decay from ``lr`` to ``min_lr``, gradients clipped to ``grad_clip``. Every ``eval_every``
    steps, and at step 0, the policy is scored by
    :func:`~llmbook.alignment.preferences.evaluate_policy` on the first ``num_eval_prompts``
    test prompts: its path in the reward-KL plane. At the end the implicit rewards of the
    chosen and rejected responses of the first ``num_test_pairs`` test pairs are computed.

    ``tensors``: the adapter weights and ``test_implicit_reward`` (2 num_test_pairs,), chosen
    responses first. ``info``: ``history`` (per step: loss, accuracy, chosen_reward,
    rejected_reward, grad_norm, lr), ``path`` (step, reward, kl, kl_stderr), ``final`` and
    ``base`` (the last and first scores), ``test`` (pair accuracy, over all and over pairs
    without a tie in true reward; Pearson and Spearman correlation of the implicit with the
    true reward, and of the reference's log-probability with it) and ``compute`` (seconds,
    steps, tokens through forward and backward passes, generated tokens, trainable
    parameters; evaluation excluded).
    """
    from llmbook.alignment.lora import count_trainable_parameters, lora_state_dict
    from llmbook.alignment.preferences import (
        evaluate_policy,
        keyword_ids,
        keyword_reward,
        preference_data,
    )
    from llmbook.training.optim import cosine_schedule, set_lr
    from llmbook.training.pretrained import book_model

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        reference, info = book_model(recipe["base"])
        reference.eval().requires_grad_(False)
        kw = keyword_ids(info["tokenizer"])
        policy = _lora_policy(reference, recipe["lora"], recipe["seed"])
        train, test = preference_data("train"), preference_data("test")
        test = type(test)(*(t[:recipe["num_test_pairs"]] for t in test))
        eval_prompts = test.prompts[:recipe["num_eval_prompts"]]
        n, beta, bsz = recipe["num_pairs"], recipe["beta"], recipe["batch_pairs"]
        prompts, chosen, rejected = train.prompts[:n], train.chosen[:n], train.rejected[:n]
        seq_len = prompts.shape[1] + chosen.shape[1]

        began = time.perf_counter()
        ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
        ref_seconds = time.perf_counter() - began
        opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                lr=recipe["lr"], weight_decay=0.0)
        steps_per_epoch = n // bsz
        total = recipe["epochs"] * steps_per_epoch
        gen = torch.Generator().manual_seed(recipe["seed"])
        history: dict[str, list[float]] = {k: [] for k in ("loss", "accuracy", "chosen_reward",
                                                           "rejected_reward", "grad_norm", "lr")}
        path: dict[str, list[float]] = {"step": [], "reward": [], "kl": [], "kl_stderr": []}
        step_seconds = eval_seconds = 0.0

        def evaluate(step: int) -> None:
            nonlocal eval_seconds
            t0 = time.perf_counter()
            policy.eval()
            score = evaluate_policy(policy, reference, eval_prompts, kw)
            policy.train()
            eval_seconds += time.perf_counter() - t0
            for key, value in (("step", step), ("reward", score.reward), ("kl", score.kl),
                               ("kl_stderr", score.kl_stderr)):
                path[key].append(value)

        evaluate(0)
        step = 0
        for _ in range(recipe["epochs"]):
            order = torch.randperm(n, generator=gen)
            for b in range(steps_per_epoch):
                idx = order[b * bsz:(b + 1) * bsz]
                t0 = time.perf_counter()
                lr = cosine_schedule(step, recipe["lr"], recipe["min_lr"], recipe["warmup_steps"], total)
                set_lr(opt, lr)
                stats = dpo_step(policy, opt, prompts[idx], chosen[idx], rejected[idx], ref_c[idx],
                                 ref_r[idx], beta, recipe["grad_clip"], recipe["loss_type"])
                step_seconds += time.perf_counter() - t0
                for key in history:
                    history[key].append(lr if key == "lr" else stats[key])
                step += 1
                if step % recipe["eval_every"] == 0 or step == total:
                    evaluate(step)

        policy.eval()
        t0 = time.perf_counter()
        test_prompts = torch.cat([test.prompts, test.prompts])
        test_responses = torch.cat([test.chosen, test.rejected])
        true_reward = torch.cat([test.reward_chosen, test.reward_rejected])
        implicit = implicit_reward(policy, reference, test_prompts, test_responses, beta)
        m = test.prompts.shape[0]
        pearson, spearman = reward_correlation(implicit, true_reward)
        ref_pearson, ref_spearman = reward_correlation(
            sequence_logprobs(reference, test_prompts, test_responses, 256).detach(), true_reward)
        eval_seconds += time.perf_counter() - t0
        assert torch.equal(keyword_reward(test_responses, kw), true_reward)
        tokens_per_step = 2 * bsz * seq_len
        info_out = {
            "history": history,
            "path": path,
            "final": {"reward": path["reward"][-1], "kl": path["kl"][-1],
                      "kl_stderr": path["kl_stderr"][-1], "num": eval_prompts.shape[0]},
            "base": {"reward": path["reward"][0], "kl": path["kl"][0]},
            "test": {"pair_accuracy": float((implicit[:m] > implicit[m:]).double().mean()),
                     "pair_accuracy_untied": float(((implicit[:m] > implicit[m:])
                                                    [test.reward_chosen != test.reward_rejected]).double().mean()),
                     "pearson": pearson, "spearman": spearman,
                     "reference_logprob_pearson": ref_pearson,
                     "reference_logprob_spearman": ref_spearman},
            "compute": {"wall_seconds": ref_seconds + step_seconds,
                        "reference_seconds": ref_seconds, "step_seconds": step_seconds,
                        "eval_seconds": eval_seconds, "steps": total,
                        "forward_tokens": 2 * n * seq_len + total * tokens_per_step,
                        "backward_tokens": total * tokens_per_step, "generated_tokens": 0,
                        "trainable_parameters": count_trainable_parameters(policy)},
        }
        tensors = {**lora_state_dict(policy), "test_implicit_reward": implicit.float()}
        return tensors, info_out
    finally:
        torch.set_num_threads(threads)


register("dpo", DPO_RECIPE, train_dpo, __name__)


def load_dpo_policy(name: str = "dpo") -> tuple[nn.Module, nn.Module, dict[str, Any]]:
    """The shipped DPO policy, its frozen reference (the base text model) and the run's info.

    Returns ``(policy, reference, info)``, both models in eval mode with no trainable
    parameters; ``info`` is the artifact's ``info.json`` (recipe, curves, scores, compute).
    """
    from llmbook.training.pretrained import book_model

    tensors, info = load_artifact(name)
    recipe = info["recipe"]
    reference, _ = book_model(recipe["base"])
    policy = _lora_policy(reference, recipe["lora"], recipe["seed"])
    adapters = {k: v for k, v in tensors.items() if k.endswith((".lora_A", ".lora_B"))}
    missing = [k for k in (k for k, _ in policy.named_parameters() if k.endswith(("lora_A", "lora_B")))
               if k not in adapters]
    if missing:
        raise ValueError(f"the artifact {name!r} lacks adapter weights {missing[:3]}...")
    policy.load_state_dict(adapters, strict=False)
    for model in (policy, reference):
        model.eval().requires_grad_(False)
    return policy, reference, info


# ---------------------------------------------------------------- DPO against PPO


def comparison_rows(runs: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per run for the head-to-head table: name, reward, kl, kl_stderr and compute.

    ``runs`` maps a name to an artifact's info dict with ``final`` (``reward``, ``kl``,
    ``kl_stderr``, as :func:`~llmbook.alignment.preferences.evaluate_policy` returns them)
    and optionally ``compute`` (``wall_seconds``, ``forward_tokens``, ``backward_tokens``,
    ``generated_tokens``; a missing entry is None), or to None for the base model (reward and
    KL taken from the DPO run's ``base`` entry, compute 0). Runs keep the given order.
    """
    if not isinstance(runs, dict) or not runs:
        raise ValueError("runs must be a non-empty dict of name -> info")
    base_score = next((info["base"] for info in runs.values() if info and "base" in info), None)
    rows = []
    for name, info in runs.items():
        if info is None:
            if base_score is None:
                raise ValueError("a base row (None) needs a run whose info has a 'base' entry")
            rows.append({"name": name, "reward": base_score["reward"], "kl": base_score["kl"],
                         "kl_stderr": 0.0, "wall_seconds": 0.0, "forward_tokens": 0,
                         "backward_tokens": 0, "generated_tokens": 0})
            continue
        if not isinstance(info, dict) or "final" not in info:
            raise ValueError(f"run {name!r} has no 'final' score (reward, kl, kl_stderr)")
        final, compute = info["final"], info.get("compute", {})
        missing = [k for k in ("reward", "kl", "kl_stderr") if k not in final]
        if missing:
            raise ValueError(f"run {name!r}: 'final' lacks {missing}")
        rows.append({"name": name, **{k: final[k] for k in ("reward", "kl", "kl_stderr")},
                     **{k: compute.get(k) for k in ("wall_seconds", "forward_tokens",
                                                    "backward_tokens", "generated_tokens")}})
    return rows


def ppo_compute_to_reward(ppo_info: dict[str, Any], target: float,
                          window: int = 8) -> dict[str, Any] | None:
    """PPO's compute up to the first iteration at which its reward reaches ``target``, or None.

    ``ppo_info`` is a PPO artifact's info (:func:`llmbook.alignment.ppo.train_ppo`): its
    ``history["reward_mean"]`` (the mean true reward of each iteration's rollout batch),
    ``history["kl_mean"]`` and ``compute`` (totals over ``iterations``). The first
    iteration k whose trailing mean reward over ``window`` iterations (k - window + 1 .. k,
    1-based) is >= ``target`` is returned with that mean (``reward``), the mean KL of the
    same iterations (``kl``) and PPO's compute up to it: the token passes
    (``forward_tokens``, ``backward_tokens``, ``generated_tokens``), which are the same in
    every iteration and so exactly k / iterations of the totals, and ``wall_seconds``
    pro-rated the same way (an estimate: iterations differ a little in time). None when the
    trailing mean never reaches ``target``.

    The window smooths the noise of a batch of a few dozen rollouts; the reward is measured
    on the training prompts of each iteration, not on the held-out prompts of ``final``.
    """
    if not isinstance(ppo_info, dict) or "history" not in ppo_info or "compute" not in ppo_info:
        raise ValueError("ppo_info must be a PPO artifact's info dict with 'history' and 'compute'")
    if isinstance(target, bool) or not isinstance(target, (int, float)):
        raise TypeError(f"target must be a number, got {type(target).__name__}")
    target = float(check_finite(torch.tensor(float(target)), "target"))
    window = check_positive_int("window", window)
    rewards = [float(v) for v in ppo_info["history"]["reward_mean"]]
    kls = [float(v) for v in ppo_info["history"]["kl_mean"]]
    compute = ppo_info["compute"]
    iters = int(compute["iterations"])
    if len(rewards) != iters or len(kls) != iters:
        raise ValueError(f"ppo_info's history must have one entry per iteration ({iters}), got "
                         f"{len(rewards)} rewards and {len(kls)} KLs")
    for k in range(window, iters + 1):
        mean_reward = sum(rewards[k - window:k]) / window
        if mean_reward >= target:
            out: dict[str, Any] = {"iterations": k, "reward": mean_reward,
                                   "kl": sum(kls[k - window:k]) / window,
                                   "wall_seconds": compute["wall_seconds"] * k / iters}
            for key in ("forward_tokens", "backward_tokens", "generated_tokens"):
                total = int(compute[key])
                if total % iters:
                    raise ValueError(f"compute[{key!r}] = {total} is not the same in every iteration")
                out[key] = total // iters * k
            return out
    return None
