"""The preference-optimisation family trained on one task: DPO, IPO, KTO, ORPO, SimPO and RLOO.

Introduced in notebooks/19_dpo (section 19.8). Each method of
:mod:`llmbook.alignment.preference_losses` (and DPO, :func:`llmbook.alignment.losses.dpo_loss`)
is trained here with the recipe of chapter 19's shipped DPO run (:data:`FAMILY_RECIPE`, which
is :data:`llmbook.alignment.dpo.DPO_RECIPE` without its loss): the book's text model with the
same LoRA adapters, the same 4096 preference pairs of chapter 17 in the same shuffled batches
of 64, the same AdamW schedule, grad clipping and seed, so that the runs differ only in the
loss. The offline methods

* **DPO** (Rafailov et al., 2023): -log sigma(beta h), h the log-ratio margin;
* **IPO** (Azar et al., 2023): (h / |y| - 1/(2 tau))^2, log-ratios averaged over tokens;
* **KTO** (Ethayarajh et al., 2024): each pair split into a desirable and an undesirable
  response, the reference point z0 estimated on the chosen responses shifted by one prompt;
* **ORPO** (Hong et al., 2024): SFT on y_w plus lambda times the odds-ratio term, no reference;
* **SimPO** (Meng et al., 2024): -log sigma(beta (avg log pi(y_w) - avg log pi(y_l)) - gamma),
  no reference;

see the pairs; the online **RLOO** (Ahmadian et al., 2024) sees only their prompts. It
samples k = 2 responses from the *current* policy for each of the 64 prompts of a step,
scores them with the true keyword reward minus beta times the sequence's log-ratio to the
reference (the KL penalty of chapter 18), and takes a REINFORCE step with the leave-one-out
baseline (:func:`~llmbook.alignment.preference_losses.rloo_loss`). With k = 2 an RLOO step
passes as many sequences through the policy (128) as a DPO step, over the same prompts in
the same order, so the two runs match in steps, prompts and forward and backward token
passes; RLOO also generates its 128 responses at every step.

This module holds :func:`family_loss` (the loss of one method on a batch, from sequence
log-probabilities), :func:`family_setup` (what every run shares: the reference model, its
log-probabilities of the pairs, the base model's score), :func:`train_member` (one run of
one method and seed) and :func:`summarize_family` (the table of mean final scores with
Student-t intervals over seeds), :func:`family_paths` (the mean path of each method) and
:func:`reward_at_kl` (a path's reward where it first reaches a given KL). ``data/make_preference_family.py`` runs them all and writes
``data/preference_family/results.json``, which the chapter loads.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from llmbook.alignment.dpo import DPO_RECIPE, _lora_policy, reference_logprobs, sequence_logprobs
from llmbook.alignment.losses import dpo_loss
from llmbook.alignment.preference_losses import (
    ipo_loss,
    kto_loss,
    kto_reference_point,
    orpo_loss,
    rloo_advantages,
    rloo_loss,
    simpo_loss,
)
from llmbook.validation import check_positive_int, check_positive_number

__all__ = [
    "FAMILY_METHODS",
    "FAMILY_PARAMS",
    "FAMILY_RECIPE",
    "FamilySetup",
    "family_loss",
    "family_paths",
    "family_setup",
    "reward_at_kl",
    "summarize_family",
    "t_interval",
    "train_member",
]

#: The methods, offline first, in the order the chapter shows them.
FAMILY_METHODS: tuple[str, ...] = ("DPO", "IPO", "KTO", "ORPO", "SimPO", "RLOO")

#: Each method's hyperparameters. beta = 0.3 (tau = 0.3 for IPO) is chapter 18's KL
#: coefficient for every method with a reference model, so that DPO, IPO, KTO and RLOO aim
#: at PPO's target (trl's defaults are 0.1, and 0.05 for RLOO's KL penalty). The two
#: reference-free methods keep published defaults: ORPO's lambda = 0.1 (trl's ``ORPOConfig``
#: beta, Hong et al.'s lambda), SimPO's margin gamma = 0.5 (trl's ``CPOConfig.simpo_gamma``)
#: with beta = 2 (in the range Meng et al. use). RLOO: k = 2 samples per prompt (trl's
#: ``RLOOConfig.num_generations``), one update per batch, clipping 0.2 (trl's epsilon).
FAMILY_PARAMS: dict[str, dict[str, float]] = {
    "DPO": {"beta": 0.3},
    "IPO": {"tau": 0.3},
    "KTO": {"beta": 0.3, "desirable_weight": 1.0, "undesirable_weight": 1.0},
    "ORPO": {"lam": 0.1},
    "SimPO": {"beta": 2.0, "gamma": 0.5},
    "RLOO": {"beta": 0.3, "k": 2, "clip_eps": 0.2},
}

#: The shared recipe: chapter 19's DPO recipe without its loss, the methods' parameters,
#: the seeds, and the evaluation: ``evaluate_policy`` on the first ``path_eval_prompts``
#: test prompts every ``eval_every`` steps, and on the first ``num_eval_prompts`` at the end
#: (and for the base model at step 0), as the shipped DPO run is scored.
FAMILY_RECIPE: dict[str, Any] = {
    **{k: v for k, v in DPO_RECIPE.items() if k not in ("beta", "loss_type", "num_test_pairs")},
    "methods": list(FAMILY_METHODS), "params": FAMILY_PARAMS, "seeds": [0, 1, 2],
    "path_eval_prompts": 128,
}

_OFFLINE = FAMILY_METHODS[:-1]
_USES_REFERENCE = ("DPO", "IPO", "KTO", "RLOO")


def _check_method(method: object) -> str:
    if method not in FAMILY_METHODS:
        raise ValueError(f"method must be one of {FAMILY_METHODS}, got {method!r}")
    return str(method)


class FamilyLoss(NamedTuple):
    """``loss`` (scalar) and the method's mean ``chosen_reward`` and ``rejected_reward``
    (floats, for monitoring; for ORPO and SimPO their reference-free rewards)."""

    loss: Tensor
    chosen_reward: float
    rejected_reward: float


def family_loss(method: str, params: dict[str, float], policy_chosen_logps: Tensor,
                policy_rejected_logps: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor,
                response_length: int, reference_point: Tensor | float | None = None) -> FamilyLoss:
    """The mean loss of an offline method on N pairs, from summed sequence log-probabilities (N,) each.

    ``params``: the method's entry of :data:`FAMILY_PARAMS`; ``response_length``: the token
    count of every response (the book's responses all have 24), for the length-normalised
    losses (IPO, ORPO, SimPO); ``reference_point``: KTO's z0
    (:func:`~llmbook.alignment.preference_losses.kto_reference_point`), required for KTO.
    ORPO and SimPO ignore the reference log-probabilities. KTO sees the 2N responses unpaired,
    the chosen ones desirable.
    """
    method = _check_method(method)
    if method == "RLOO":
        raise ValueError("RLOO is online: it has no loss on fixed pairs (see train_member)")
    n = check_positive_int("response_length", response_length)
    lengths = torch.full(policy_chosen_logps.shape, float(n), dtype=policy_chosen_logps.dtype)
    if method == "DPO":
        loss, r_w, r_l = dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                  ref_rejected_logps, params["beta"])
    elif method == "IPO":
        loss, r_w, r_l = ipo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                  ref_rejected_logps, params["tau"], lengths, lengths)
    elif method == "KTO":
        if reference_point is None:
            raise ValueError("KTO needs reference_point (its z0, from kto_reference_point)")
        m = policy_chosen_logps.shape[0]
        desirable = torch.cat([torch.ones(m, dtype=torch.bool), torch.zeros(m, dtype=torch.bool)])
        loss, r_w, r_l = kto_loss(torch.cat([policy_chosen_logps, policy_rejected_logps]),
                                  torch.cat([ref_chosen_logps, ref_rejected_logps]), desirable,
                                  params["beta"], reference_point, params["desirable_weight"],
                                  params["undesirable_weight"])
        r_w, r_l = r_w[:m], r_l[m:]
    elif method == "ORPO":
        loss, r_w, r_l = orpo_loss(policy_chosen_logps / n, policy_rejected_logps / n, params["lam"])
    else:  # SimPO
        loss, r_w, r_l = simpo_loss(policy_chosen_logps, policy_rejected_logps, lengths, lengths,
                                    params["beta"], params["gamma"])
    return FamilyLoss(loss, float(r_w.mean()), float(r_l.mean()))


# ---------------------------------------------------------------- what the runs share


class FamilySetup(NamedTuple):
    """What every run of the family shares (:func:`family_setup`).

    ``reference`` (the frozen text model), ``keywords`` (token ids of the reward), the first
    ``num_pairs`` training pairs (``prompts``, ``chosen``, ``rejected``), the reference's
    sequence log-probabilities of them (``ref_chosen``, ``ref_rejected``) and the seconds
    that pass took (``reference_seconds``), the evaluation prompts, and ``base``: the score
    of the base model (every run's step 0, since LoRA starts at B = 0).
    """

    reference: nn.Module
    keywords: Tensor
    prompts: Tensor
    chosen: Tensor
    rejected: Tensor
    ref_chosen: Tensor
    ref_rejected: Tensor
    reference_seconds: float
    eval_prompts: Tensor
    base: dict[str, float]


def family_setup(recipe: dict[str, Any]) -> FamilySetup:
    """Load the reference and the pairs, score the pairs with the reference once, score the base model."""
    from llmbook.alignment.preferences import evaluate_policy, keyword_ids, preference_data
    from llmbook.training.pretrained import book_model

    reference, info = book_model(recipe["base"])
    reference.eval().requires_grad_(False)
    kw = keyword_ids(info["tokenizer"])
    train = preference_data("train")
    n = recipe["num_pairs"]
    prompts, chosen, rejected = train.prompts[:n], train.chosen[:n], train.rejected[:n]
    began = time.perf_counter()
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    ref_seconds = time.perf_counter() - began
    eval_prompts = preference_data("test").prompts[:recipe["num_eval_prompts"]]
    base = evaluate_policy(reference, reference, eval_prompts, kw)._asdict()
    return FamilySetup(reference, kw, prompts, chosen, rejected, ref_c, ref_r, ref_seconds,
                       eval_prompts, base)


def _step(optimizer: torch.optim.Optimizer, loss: Tensor, grad_clip: float) -> float:
    """zero_grad, backward, clip to ``grad_clip``, step; returns the norm before clipping."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return float(norm)


# ---------------------------------------------------------------- one run


def train_member(method: str, recipe: dict[str, Any], seed: int,
                 setup: FamilySetup | None = None) -> dict[str, Any]:
    """Train one method of the family with one seed; returns its record (JSON-able).

    The policy is the text model with ``recipe["lora"]`` adapters initialised from ``seed``;
    the pairs are visited once in the order ``torch.randperm(num_pairs)`` of a generator
    seeded with ``seed``, in batches of ``batch_pairs`` (as :func:`llmbook.alignment.dpo.train_dpo`,
    so DPO with the shipped recipe and seed 0 repeats the shipped run). AdamW with linear
    warmup and cosine decay from ``lr`` to ``min_lr``, gradients clipped to ``grad_clip``.
    RLOO takes the same prompts in the same batches, k = ``params["k"]`` samples each, drawn
    with a generator seeded with ``seed``.

    Returns ``path`` (step, reward, kl, kl_stderr and num, the prompts scored, every
    ``eval_every`` steps; step 0 is the base model's score, the last on all
    ``num_eval_prompts``, the others on the first ``path_eval_prompts``), ``final`` (the last
    point), ``history`` (per step: loss, grad_norm, lr and the
    method's mean chosen and rejected reward, or for RLOO the rollout's mean true reward and
    KL) and ``compute``: ``wall_seconds`` (training steps, plus the shared reference pass for
    the methods that use the reference's log-probabilities of the pairs), ``step_seconds``,
    ``eval_seconds`` (excluded), token passes (``forward_tokens``, ``backward_tokens``) and
    ``generated_tokens``.
    """
    from llmbook.alignment.preferences import evaluate_policy, keyword_reward, sample_responses
    from llmbook.training.optim import cosine_schedule, set_lr

    method = _check_method(method)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    params = recipe["params"][method]
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        setup = family_setup(recipe) if setup is None else setup
        reference, kw = setup.reference, setup.keywords
        policy = _lora_policy(reference, recipe["lora"], seed)
        policy.train()
        opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=recipe["lr"],
                                weight_decay=0.0)
        n, bsz, R = recipe["num_pairs"], recipe["batch_pairs"], setup.chosen.shape[1]
        seq_len = setup.prompts.shape[1] + R
        total = recipe["epochs"] * (n // bsz)
        gen = torch.Generator().manual_seed(seed)
        sample_gen = torch.Generator().manual_seed(seed)
        keys = ("loss", "grad_norm", "lr") + (("reward", "kl") if method == "RLOO"
                                               else ("chosen_reward", "rejected_reward"))
        history: dict[str, list[float]] = {k: [] for k in keys}
        path: dict[str, list[float]] = {"step": [0], **{k: [setup.base[k]] for k in
                                                         ("reward", "kl", "kl_stderr", "num")}}
        step_seconds = eval_seconds = 0.0
        extra_forward = 0
        step = 0
        for _ in range(recipe["epochs"]):
            order = torch.randperm(n, generator=gen)
            for b in range(n // bsz):
                idx = order[b * bsz:(b + 1) * bsz]
                t0 = time.perf_counter()
                lr = cosine_schedule(step, recipe["lr"], recipe["min_lr"], recipe["warmup_steps"], total)
                set_lr(opt, lr)
                prompts = setup.prompts[idx]
                if method == "RLOO":
                    k = int(params["k"])
                    group_prompts = prompts.repeat_interleave(k, 0)  # (k B, P): groups of k
                    responses = sample_responses(policy, group_prompts, R, 1.0, sample_gen)
                    logps = sequence_logprobs(policy, group_prompts, responses)  # (k B,)
                    with torch.no_grad():
                        ref = sequence_logprobs(reference, group_prompts, responses)
                    scores = keyword_reward(responses, kw).to(logps.dtype)
                    kl = logps.detach() - ref
                    adv = rloo_advantages(scores, k, kl=kl, beta=params["beta"])
                    loss = rloo_loss(logps, logps.detach(), adv, params["clip_eps"])
                    extra_forward += 2 * group_prompts.shape[0] * seq_len  # policy and reference
                    stats = {"reward": float(scores.mean()), "kl": float(kl.double().mean())}
                else:
                    chosen, rejected = setup.chosen[idx], setup.rejected[idx]
                    both = sequence_logprobs(policy, torch.cat([prompts, prompts]), torch.cat([chosen, rejected]))
                    z0 = None
                    if method == "KTO":  # chosen responses shifted by one prompt: z0, no gradient
                        shifted = chosen.roll(1, 0)
                        with torch.no_grad():
                            z0 = kto_reference_point(sequence_logprobs(policy, prompts, shifted),
                                                     sequence_logprobs(reference, prompts, shifted))
                        extra_forward += 2 * bsz * seq_len
                    out = family_loss(method, params, both[:bsz], both[bsz:], setup.ref_chosen[idx],
                                      setup.ref_rejected[idx], R, z0)
                    loss = out.loss
                    extra_forward += 2 * bsz * seq_len
                    stats = {"chosen_reward": out.chosen_reward, "rejected_reward": out.rejected_reward}
                norm = _step(opt, loss, recipe["grad_clip"])
                step_seconds += time.perf_counter() - t0
                stats.update(loss=float(loss.detach()), grad_norm=norm, lr=lr)
                for key in history:
                    history[key].append(round(stats[key], 6))
                step += 1
                if step % recipe["eval_every"] == 0 or step == total:
                    t0 = time.perf_counter()
                    policy.eval()
                    num = None if step == total else recipe["path_eval_prompts"]
                    score = evaluate_policy(policy, reference, setup.eval_prompts[:num], kw, R)
                    policy.train()
                    eval_seconds += time.perf_counter() - t0
                    for key in ("reward", "kl", "kl_stderr", "num"):
                        path[key].append(getattr(score, key))
                    path["step"].append(step)
        uses_pairs_reference = method in _USES_REFERENCE and method != "RLOO"
        reference_forward = 2 * n * seq_len if uses_pairs_reference else 0
        backward = total * 2 * bsz * seq_len
        compute = {"wall_seconds": step_seconds + (setup.reference_seconds if uses_pairs_reference else 0.0),
                   "step_seconds": step_seconds, "eval_seconds": eval_seconds, "steps": total,
                   "forward_tokens": reference_forward + extra_forward, "backward_tokens": backward,
                   "generated_tokens": total * 2 * bsz * R if method == "RLOO" else 0}
        final = {k: path[k][-1] for k in ("reward", "kl", "kl_stderr")}
        return {"method": method, "seed": seed, "params": params, "path": path, "final": final,
                "history": history, "compute": compute}
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- the table


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The mean of ``values`` (independent runs, e.g. seeds) and the half-width of its
    Student-t interval at ``level``: t_{(1+level)/2, m-1} s / sqrt(m), s the sample standard
    deviation; the half-width is 0 for a single value. Used for every across-seed interval
    of Parts V and VI (chapters 19 and 21)."""
    if not values:
        raise ValueError("values is empty: an interval needs at least one run")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    from scipy.stats import t as student_t

    m = len(values)
    mean = sum(values) / m
    if m < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (m - 1))
    return mean, float(student_t.ppf(0.5 + level / 2, m - 1)) * sd / math.sqrt(m)


def summarize_family(results: dict[str, Any], level: float = 0.95) -> list[dict[str, Any]]:
    """One row per method of a ``results.json``: means over seeds and Student-t intervals.

    ``results["runs"]`` maps a method to its list of :func:`train_member` records (one per
    seed). Each row: ``method``, ``seeds`` (how many), ``reward`` and ``reward_pm`` (mean final
    true reward and the half-width of its ``level`` interval over seeds, t with seeds - 1
    degrees of freedom), ``kl`` and ``kl_pm`` likewise, and the means of ``wall_seconds``,
    ``forward_tokens``, ``backward_tokens`` and ``generated_tokens``. Methods keep the order
    of ``results["runs"]``.
    """
    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict) or not results["runs"]:
        raise ValueError("results must be a dict with a non-empty 'runs' dict (method -> list of runs)")
    level = check_positive_number("level", level)
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rows = []
    for method, runs in results["runs"].items():
        if not isinstance(runs, list) or not runs:
            raise ValueError(f"runs[{method!r}] must be a non-empty list of runs")
        row: dict[str, Any] = {"method": method, "seeds": len(runs)}
        for key in ("reward", "kl"):
            row[key], row[f"{key}_pm"] = t_interval([float(r["final"][key]) for r in runs], level)
        for key in ("wall_seconds", "forward_tokens", "backward_tokens", "generated_tokens"):
            row[key] = sum(r["compute"][key] for r in runs) / len(runs)
        rows.append(row)
    return rows


def family_paths(results: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Each method's path in the reward-KL plane, averaged over its seeds, point by point.

    ``results["runs"]`` maps a method to its :func:`train_member` records; every record of a
    method must have the same evaluation steps. Returns method -> ``step``, ``reward`` and
    ``kl`` (lists, the means over seeds at each step).
    """
    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict) or not results["runs"]:
        raise ValueError("results must be a dict with a non-empty 'runs' dict (method -> list of runs)")
    out = {}
    for method, runs in results["runs"].items():
        if not isinstance(runs, list) or not runs:
            raise ValueError(f"runs[{method!r}] must be a non-empty list of runs")
        steps = runs[0]["path"]["step"]
        if any(r["path"]["step"] != steps for r in runs):
            raise ValueError(f"the runs of {method!r} were evaluated at different steps")
        out[method] = {"step": list(steps), **{
            key: [sum(r["path"][key][i] for r in runs) / len(runs) for i in range(len(steps))]
            for key in ("reward", "kl")}}
    return out


def reward_at_kl(path: dict[str, list[float]], kl: float) -> float | None:
    """The reward of a path where its KL first reaches ``kl``, linearly interpolated; None if never.

    ``path`` has lists ``kl`` and ``reward`` of one length, in the order of the steps (as
    :func:`family_paths` returns them). The first point i with kl_i >= ``kl`` is found; for
    i = 0 its reward is returned, otherwise the reward on the segment from point i - 1 to i
    at ``kl``. Compares methods at equal distance from the reference: reward per nat of KL.
    """
    if not isinstance(path, dict) or "kl" not in path or "reward" not in path:
        raise ValueError("path must be a dict with lists 'kl' and 'reward'")
    kls, rewards = [float(v) for v in path["kl"]], [float(v) for v in path["reward"]]
    if len(kls) != len(rewards) or not kls:
        raise ValueError(f"path's 'kl' and 'reward' must be non-empty lists of one length, got "
                         f"{len(kls)} and {len(rewards)}")
    if isinstance(kl, bool) or not isinstance(kl, int | float) or not math.isfinite(kl):
        raise TypeError(f"kl must be a finite number, got {kl!r}")
    for i, value in enumerate(kls):
        if value >= kl:
            if i == 0:
                return rewards[0]
            t = (kl - kls[i - 1]) / (value - kls[i - 1])
            return rewards[i - 1] + t * (rewards[i] - rewards[i - 1])
    return None
