"""RLHF with PPO: rollouts, KL-shaped per-token rewards, a critic, the update and the training loop.

Introduced in notebooks/18_rlhf_ppo. The policy pi (the book's text model with LoRA adapters)
is trained to maximise the KL-regularised objective of RLHF (Ziegler et al., 2019,
"Fine-Tuning Language Models from Human Preferences"; Ouyang et al., 2022, "Training
language models to follow instructions with human feedback"),

    J(pi) = E_{x, y ~ pi} [ r(x, y) ] - beta KL( pi(. | x) || pi_ref(. | x) ),

with Proximal Policy Optimization (Schulman et al., 2017, "Proximal Policy Optimization
Algorithms"). The sequence is a short episode: each response token is an action, and the
KL term becomes a per-token reward -beta (log pi(y_t | .) - log pi_ref(y_t | .)), with the
score r(x, y) added at the last token (:func:`kl_shaped_rewards`). One PPO iteration

1. samples a response to each prompt of a batch and records the policy's, the reference
   model's and the critic's view of it (:func:`rollout`);
2. turns the per-token rewards and values into advantages and returns by generalised
   advantage estimation (:func:`llmbook.alignment.losses.gae`; Schulman et al., 2016) and
   takes a few epochs of minibatch steps on the clipped surrogate and the clipped value
   loss (:func:`ppo_update`).

:func:`train_ppo` runs the book's recipe (artifacts ``"ppo"`` and ``"ppo_small_kl"``,
shipped by :mod:`llmbook.alignment.shipped`); :func:`load_ppo_policy` loads a shipped policy.

Choices, for a run that takes a few minutes on one CPU core: the policy trains LoRA
adapters (chapter 16) on every linear layer, so the shipped policy is a 0.4 MB adapter
file rather than an 8 MB model and the reference is simply the base model; the critic
(:class:`ValueModel`) is a separate, fully trained copy of the base model with a linear
value head, as in InstructGPT, where the value model is a separate network, so the value
loss never pulls on the policy's weights.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from llmbook.alignment.logprobs import (
    _check_mask,
    _check_prompt_response,
    masked_mean,
    response_outputs,
    token_entropy,
    token_logprobs,
)
from llmbook.alignment.lora import apply_lora, lora_state_dict
from llmbook.alignment.losses import gae, kl_estimators, ppo_policy_loss, ppo_value_loss
from llmbook.alignment.preferences import (
    KEYWORDS,
    PREFERENCE_RECIPE,
    evaluate_policy,
    keyword_ids,
    keyword_reward,
    preference_data,
    sample_responses,
)
from llmbook.alignment.shipped import load_artifact, register
from llmbook.inference.kvcache import KVCache
from llmbook.transformer.model import TransformerLM
from llmbook.validation import (
    check_finite,
    check_nonempty,
    check_positive_int,
    check_positive_number,
    check_token_ids,
)
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "PPO_RECIPE",
    "PPO_SMALL_KL_RECIPE",
    "Rollout",
    "ValueModel",
    "distinct_token_fraction",
    "kl_shaped_rewards",
    "load_ppo_policy",
    "make_policy",
    "ppo_update",
    "response_logits",
    "response_values",
    "rollout",
    "sampler_logprobs",
    "train_ppo",
    "whiten",
]

#: The main run: beta = 0.3 lets the reward rise while keeping the policy near the reference.
PPO_RECIPE: dict[str, Any] = {
    "base": "text", "keywords": list(KEYWORDS), "response_tokens": PREFERENCE_RECIPE["response_tokens"],
    "beta": 0.3, "iterations": 60, "batch_size": 32, "epochs": 2, "minibatch_size": 16,
    "clip_eps": 0.2, "value_clip": 0.2, "gamma": 1.0, "lam": 0.95, "whiten_advantages": True,
    "lr": 1e-3, "critic_lr": 1e-4, "max_grad_norm": 1.0,
    "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "fc", "proj"], "lora_r": 8,
    "lora_alpha": 16, "seed": 0,
}
#: The reward-hacking run: the same with a KL coefficient 100 times smaller.
PPO_SMALL_KL_RECIPE: dict[str, Any] = {**PPO_RECIPE, "beta": 0.003}


# ---------------------------------------------------------------- validation


def _check_fits(model: nn.Module, P: int, R: int) -> None:
    max_len = getattr(getattr(model, "config", None), "max_seq_len", None)
    if isinstance(max_len, int) and P + R > max_len:
        raise ValueError(f"prompt ({P} tokens) plus response ({R} tokens) = {P + R} tokens exceeds "
                         f"the model's context max_seq_len={max_len}")


# ---------------------------------------------------------------- rewards and advantages


def kl_shaped_rewards(scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, beta: float,
                      mask: Tensor | None = None) -> Tensor:
    """Per-token rewards of RLHF: -beta (log pi - log pi_ref) at every token, plus the score at the last.

    ``scores`` (B,) are the sequence rewards r(x, y); ``logprobs`` and ``ref_logprobs``
    (B, R) are log pi(y_t | x, y_<t) under the policy that sampled y and under the
    reference. Summed over a response, the rewards are r(x, y) - beta log(pi(y|x) /
    pi_ref(y|x)), whose expectation over y ~ pi is the KL-regularised objective (Ziegler
    et al., 2019; the per-token form of trl's former ``PPOTrainer``). With a
    ``mask`` (B, R) of response tokens (right padding), padding gets reward 0 and the score
    goes to the last unmasked token of each row. Returns (B, R), detached.
    """
    beta = check_positive_number("beta", beta)
    check_finite(_check_floating(scores, "scores"), "scores")
    _check_floating(logprobs, "logprobs")
    _check_floating(ref_logprobs, "ref_logprobs")
    if logprobs.ndim != 2 or tuple(ref_logprobs.shape) != tuple(logprobs.shape):
        raise ValueError(f"logprobs and ref_logprobs must be (B, R) of one shape, got "
                         f"{tuple(logprobs.shape)} and {tuple(ref_logprobs.shape)}")
    B, R = logprobs.shape
    if tuple(scores.shape) != (B,):
        raise ValueError(f"scores must have shape (B,) = ({B},), one per response, got {tuple(scores.shape)}")
    m = torch.ones_like(logprobs) if mask is None else _check_mask(mask, logprobs, "mask", "logprobs")
    for x, name in ((logprobs, "logprobs"), (ref_logprobs, "ref_logprobs")):  # padding may hold NaN
        check_finite(torch.where(m > 0, x, torch.zeros_like(x)), name)
    counts = m.sum(dim=1)
    if bool((counts == 0).any()):
        raise ValueError("mask has a row with no response tokens: there is no last token to score")
    log_ratio = (logprobs - ref_logprobs).detach()
    rewards = torch.where(m > 0, -beta * log_ratio, torch.zeros_like(log_ratio))  # (B, R)
    last = (torch.arange(R, device=m.device) * (m > 0)).argmax(dim=1)  # (B,) index of the last token
    rewards[torch.arange(B), last] += scores.detach().to(rewards.dtype)
    return rewards


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the unmasked entries (0 at masked ones).

    The usual normalisation of PPO's advantages: the mean and the (population) variance
    are taken over all unmasked entries of the batch; ``shift_mean=False`` only rescales.
    ``eps`` keeps a batch whose entries are all equal (no learning signal, e.g. every score
    0 and the policy still equal to the reference) at 0 instead of 0/0. Fewer than two
    unmasked entries is a ``ValueError``.
    """
    _check_floating(x, "x")
    m = _check_mask(mask, x, "mask", "x")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got eps={eps!r}")
    if m.sum() < 2:
        raise ValueError("whiten needs at least two unmasked entries")
    mean = masked_mean(x, m)
    var = masked_mean((x - mean) ** 2, m)
    if not var + eps > 0:
        raise ValueError("whiten: every unmasked entry is equal and eps=0: 0/0")
    scale = torch.rsqrt(var + eps)
    out = (x - mean) * scale if shift_mean else x * scale
    return torch.where(m > 0, out, torch.zeros_like(out))


# ---------------------------------------------------------------- policy and critic


def make_policy(base: TransformerLM, targets: list[str], r: int, alpha: float,
                generator: torch.Generator | None = None) -> TransformerLM:
    """A trainable copy of ``base`` with LoRA adapters on the ``targets`` layers (chapter 16).

    ``base`` itself is left untouched and serves as the reference model. At the start the
    adapters' B is zero, so the policy computes exactly the reference's logits.
    """
    if not isinstance(base, TransformerLM):
        raise TypeError(f"base must be a TransformerLM, got {type(base).__name__}")
    return apply_lora(copy.deepcopy(base), targets, r, alpha, generator=generator)


class ValueModel(nn.Module):
    """A critic: a transformer trunk and a linear value head, ids (B, T) -> values (B, T).

    V(s) at position i is ``head(h_i)`` with h the final-normed hidden states of ``trunk``
    (:meth:`~llmbook.transformer.model.TransformerLM.hidden_states`): the value of the state
    made of the tokens up to and including position i. The head starts at zero (every
    value 0). The whole trunk trains.
    """

    def __init__(self, trunk: TransformerLM) -> None:
        super().__init__()
        if not isinstance(trunk, TransformerLM):
            raise TypeError(f"trunk must be a TransformerLM, got {type(trunk).__name__}")
        self.trunk = trunk
        self.config = trunk.config
        self.head = nn.Linear(trunk.config.d_model, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.trunk.hidden_states(ids)  # (B, T, d)
        return self.head(h).squeeze(-1)  # (B, T)


def response_logits(model: nn.Module, prompt_ids: Tensor, response_ids: Tensor) -> Tensor:
    """The logits that score each response token: (B, P), (B, R) -> (B, R, V).

    ``model(ids)`` is run on [x; y] (length P + R) and the logits at positions
    P - 1, ..., P + R - 2 are returned: those at P - 1 + t predict y_t. Prompt plus response
    longer than the model's context is a ``ValueError``.
    """
    return response_outputs(model, prompt_ids, response_ids)  # (B, R, V)


def response_values(critic: nn.Module, prompt_ids: Tensor, response_ids: Tensor) -> Tensor:
    """V(s_t) for the states s_t = (x, y_<t) from which each response token is chosen: (B, R).

    The critic's output at position P - 1 + t sees x and y_<t, exactly the state in which
    the policy drew y_t (the same shift by one as :func:`response_logits`).
    """
    return response_outputs(critic, prompt_ids, response_ids)  # (B, R)


def distinct_token_fraction(response_ids: Tensor) -> Tensor:
    """Number of distinct tokens in each response over its length: (B, R) -> (B,) in (0, 1].

    A quality signal that needs no model: ordinary text repeats few tokens in 24, a
    degenerate policy repeats one token over and over (1/R).
    """
    check_token_ids(response_ids, "response_ids", ndim=2)
    R = response_ids.shape[1]
    if R < 1:
        raise ValueError("response_ids must hold at least one token per row")
    counts = torch.tensor([len(set(row)) for row in response_ids.tolist()], dtype=torch.float64)
    return (counts / R).to(torch.get_default_dtype())


@torch.no_grad()
def sampler_logprobs(model: TransformerLM, prompt_ids: Tensor, response_ids: Tensor) -> Tensor:
    """log pi(y_t | x, y_<t) as the sampler computes it, with a KV cache: (B, P), (B, R) -> (B, R).

    The way :func:`~llmbook.inference.sampling.generate` runs the model: the prompt once (the
    prefill), whose last logits give y_0's distribution, then each response token alone,
    attending to the cached keys and values of all before it. PPO's ratio pi / pi_old needs
    the log-probabilities of the distribution the tokens were *drawn* from; the rollout
    records them by one teacher-forced pass over [x; y] (:func:`response_logits`), a
    different computation (a full causal mask instead of a growing cache). The two agree
    to float round-off exactly when the recorded pi_old is the sampling distribution, so
    the first PPO step starts at ratio 1: the check in notebooks/18_rlhf_ppo.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM (it decodes with the book's KV cache), got "
                        f"{type(model).__name__}")
    B, P, R = _check_prompt_response(prompt_ids, response_ids)
    _check_fits(model, P, R)
    cache = KVCache.for_model(model, B, P + R)
    logits = model(prompt_ids, cache=cache)[:, -1]  # (B, V): predicts y_0
    out = []
    for t in range(R):
        y_t = response_ids[:, t]
        out.append(torch.log_softmax(logits, dim=-1).gather(1, y_t[:, None].long())[:, 0])  # (B,)
        if t + 1 < R:
            logits = model(y_t[:, None].to(prompt_ids.dtype), cache=cache)[:, -1]  # predicts y_{t+1}
    return torch.stack(out, dim=1)  # (B, R)


# ---------------------------------------------------------------- rollout


class Rollout(NamedTuple):
    """What one PPO iteration collects, per prompt b and response token t.

    ``prompts`` (B, P) and ``responses`` (B, R) token ids; ``logprobs`` (log pi_old),
    ``ref_logprobs`` (log pi_ref), ``values`` (V_old(s_t)) and ``entropy`` (of pi_old's
    next-token distribution) all (B, R); ``scores`` (B,) the sequence rewards r(x, y).
    """

    prompts: Tensor
    responses: Tensor
    logprobs: Tensor
    ref_logprobs: Tensor
    values: Tensor
    scores: Tensor
    entropy: Tensor


@torch.no_grad()
def rollout(policy: TransformerLM, reference: nn.Module, critic: nn.Module, prompts: Tensor,
            response_tokens: int, reward_fn: Callable[[Tensor, Tensor], Tensor],
            generator: torch.Generator | None = None) -> Rollout:
    """Sample one response per prompt from ``policy`` at temperature 1 and score it.

    ``prompts`` (B, P); ``reward_fn(prompts, responses)`` returns the scores (B,) (e.g.
    the keyword count of :func:`llmbook.alignment.preferences.keyword_reward`). Runs the
    policy, the reference and the critic once each on prompt + response, without
    gradients. ``generator`` seeds the sampling.
    """
    check_nonempty(check_token_ids(prompts, "prompts", ndim=2), "prompts")
    R = check_positive_int("response_tokens", response_tokens)
    _check_fits(policy, prompts.shape[1], R)
    if not callable(reward_fn):
        raise TypeError(f"reward_fn must be callable (prompts, responses) -> scores, got "
                        f"{type(reward_fn).__name__}")
    responses = sample_responses(policy, prompts, R, 1.0, generator)  # (B, R)
    logits = response_logits(policy, prompts, responses)  # (B, R, V)
    logprobs = token_logprobs(logits, responses)
    ref_logprobs = token_logprobs(response_logits(reference, prompts, responses), responses)
    values = response_values(critic, prompts, responses)
    scores = reward_fn(prompts, responses)
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (prompts.shape[0],):
        raise ValueError(f"reward_fn must return one score per prompt, shape ({prompts.shape[0]},), "
                         f"got {getattr(scores, 'shape', type(scores).__name__)}")
    check_finite(scores, "reward_fn's scores")
    return Rollout(prompts, responses, logprobs, ref_logprobs, values,
                   scores.to(logprobs.dtype), token_entropy(logits))


# ---------------------------------------------------------------- the PPO update


def _unclipped_surrogate(logprobs: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    return -masked_mean(torch.exp(logprobs - old) * adv, mask)


def _check_update_options(policy_optimizer: object, critic_optimizer: object, value_clip: object,
                          max_grad_norm: object, whiten_advantages: object) -> None:
    """The arguments of :func:`ppo_update` that its losses do not check themselves."""
    for name, opt in (("policy_optimizer", policy_optimizer), ("critic_optimizer", critic_optimizer)):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"{name} must be a torch Optimizer, got {type(opt).__name__}")
    for name, value in (("value_clip", value_clip), ("max_grad_norm", max_grad_norm)):
        if value is not None:
            check_positive_number(name, value)
    if not isinstance(whiten_advantages, bool):
        raise TypeError(f"whiten_advantages must be a bool, got {whiten_advantages!r}")


def ppo_update(policy: nn.Module, critic: nn.Module, batch: Rollout, policy_optimizer: torch.optim.Optimizer,
               critic_optimizer: torch.optim.Optimizer, *, beta: float, gamma: float = 1.0,
               lam: float = 0.95, clip_eps: float | None = 0.2, value_clip: float | None = 0.2,
               epochs: int = 2, minibatch_size: int = 16, max_grad_norm: float | None = 1.0,
               whiten_advantages: bool = True,
               generator: torch.Generator | None = None) -> dict[str, float]:
    """One PPO update on a rollout: advantages by GAE, then epochs of minibatch steps.

    Per-token rewards are :func:`kl_shaped_rewards` with ``beta``; advantages and returns
    come from :func:`~llmbook.alignment.losses.gae` with ``gamma`` and ``lam`` on the
    rollout's values, and the advantages are whitened over the batch (``whiten_advantages``).
    Then, ``epochs`` times, the batch is shuffled (``generator``) and cut into minibatches of
    ``minibatch_size`` responses; each takes one step of ``policy_optimizer`` on
    :func:`~llmbook.alignment.losses.ppo_policy_loss` (``clip_eps``; None: the unclipped
    surrogate -mean(rho A), for comparison) and one of ``critic_optimizer`` on
    :func:`~llmbook.alignment.losses.ppo_value_loss` (``value_clip``), with the gradient norm
    of each network clipped to ``max_grad_norm``.

    Returns means over the minibatch steps: ``policy_loss``, ``value_loss``,
    ``clip_fraction``; and ``approx_kl`` (the k3 estimate of KL(pi_old || pi) per token),
    ``ratio_min`` and ``ratio_max`` (the extreme ratios pi / pi_old that the losses saw).
    """
    if not isinstance(batch, Rollout):
        raise TypeError(f"batch must be a Rollout (from rollout()), got {type(batch).__name__}")
    beta = check_positive_number("beta", beta)
    if clip_eps is not None and (isinstance(clip_eps, bool) or not isinstance(clip_eps, int | float)
                                 or not 0 < clip_eps < 1):
        raise ValueError(f"clip_eps must be a number in (0, 1) or None, got clip_eps={clip_eps!r}")
    B, R = batch.responses.shape
    minibatch_size = check_positive_int("minibatch_size", minibatch_size)
    epochs = check_positive_int("epochs", epochs)
    if minibatch_size > B:
        raise ValueError(f"minibatch_size={minibatch_size} exceeds the rollout's batch size {B}")
    _check_update_options(policy_optimizer, critic_optimizer, value_clip, max_grad_norm, whiten_advantages)
    mask = torch.ones_like(batch.logprobs)
    rewards = kl_shaped_rewards(batch.scores, batch.logprobs, batch.ref_logprobs, beta)
    advantages, returns = gae(rewards, batch.values, gamma, lam)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "clip_fraction", "approx_kl")}
    ratio_min, ratio_max = math.inf, -math.inf
    policy_params = [p for p in policy.parameters() if p.requires_grad]
    critic_params = [p for p in critic.parameters() if p.requires_grad]
    for _ in range(epochs):
        order = torch.randperm(B, generator=generator)
        for start in range(0, B, minibatch_size):
            idx = order[start:start + minibatch_size]
            prompts, responses, m = batch.prompts[idx], batch.responses[idx], mask[idx]
            logprobs = token_logprobs(response_logits(policy, prompts, responses), responses)  # (b, R)
            old = batch.logprobs[idx]
            if clip_eps is None:
                policy_loss = _unclipped_surrogate(logprobs, old, advantages[idx], m)
                clip_fraction = torch.zeros(())
            else:
                policy_loss, clip_fraction = ppo_policy_loss(logprobs, old, advantages[idx], m, clip_eps)
            policy_optimizer.zero_grad()
            policy_loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(policy_params, max_grad_norm)
            policy_optimizer.step()

            values = response_values(critic, prompts, responses)
            value_loss, _ = ppo_value_loss(values, batch.values[idx], returns[idx], m, value_clip)
            critic_optimizer.zero_grad()
            value_loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(critic_params, max_grad_norm)
            critic_optimizer.step()

            log_ratio = (logprobs - old).detach()
            ratio_min = min(ratio_min, float(log_ratio.min().exp()))
            ratio_max = max(ratio_max, float(log_ratio.max().exp()))
            stats["policy_loss"].append(float(policy_loss.detach()))
            stats["value_loss"].append(float(value_loss.detach()))
            stats["clip_fraction"].append(float(clip_fraction))
            stats["approx_kl"].append(float(masked_mean(kl_estimators(old, logprobs.detach()).k3, m)))
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out.update(ratio_min=ratio_min, ratio_max=ratio_max)
    return out


# ---------------------------------------------------------------- the book's runs


def _quality(policy: nn.Module, reference: nn.Module, prompts: Tensor, response_tokens: int,
             seed: int) -> dict[str, float]:
    """Two quality signals on responses sampled as evaluate_policy samples them (same seed)."""
    gen = torch.Generator().manual_seed(seed)
    responses = sample_responses(policy, prompts, response_tokens, 1.0, gen)
    with torch.no_grad():
        ref_lp = token_logprobs(response_logits(reference, prompts, responses), responses)
    return {"distinct_fraction": float(distinct_token_fraction(responses).double().mean()),
            "ref_logprob_per_token": float(ref_lp.double().mean())}


def train_ppo(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Train a LoRA policy on the keyword task with PPO; returns (adapter tensors, info).

    The recipe (:data:`PPO_RECIPE`) names the base model, the rewarded ``keywords``, the
    KL coefficient ``beta``, the number of ``iterations`` and the ``batch_size`` of prompts
    per rollout (drawn in a seeded order from the training prompts of the preference data,
    ``preference_data("train").prompts``), and the arguments of :func:`ppo_update`. Runs on
    one thread. An optional key ``eval_prompts`` evaluates on only the first so many test
    prompts (for quick tests; the shipped recipes evaluate on all 512).

    ``info`` holds ``history`` (lists, one entry per iteration: ``reward_mean``, the mean
    keyword count of the rollout; ``kl_mean``, the mean of sum_t log(pi / pi_ref) per
    response in nats; ``entropy``, the mean per-token entropy; and the update's statistics),
    ``final`` (:func:`~llmbook.alignment.preferences.evaluate_policy` on the 512 test
    prompts: ``reward``, ``kl``, ``kl_stderr``, ``num``; plus ``distinct_fraction`` and
    ``ref_logprob_per_token`` of the same samples, and the same four numbers for the base
    model under ``base``) and ``compute`` (``wall_seconds``; ``generated_tokens``; token
    passes: ``forward_tokens`` and ``backward_tokens`` over all networks, and per network).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_ppo(recipe)
    finally:
        torch.set_num_threads(threads)


def _train_ppo(recipe: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from llmbook.training.pretrained import book_model

    began = time.perf_counter()
    reference, binfo = book_model(recipe["base"])
    reference.requires_grad_(False)
    kw = keyword_ids(binfo["tokenizer"], tuple(recipe["keywords"]))
    seed, R, B = recipe["seed"], recipe["response_tokens"], recipe["batch_size"]
    gen = torch.Generator().manual_seed(seed)
    policy = make_policy(reference, recipe["lora_targets"], recipe["lora_r"], recipe["lora_alpha"], gen)
    critic = ValueModel(copy.deepcopy(reference).requires_grad_(True))
    policy_opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=recipe["lr"])
    critic_opt = torch.optim.Adam(critic.parameters(), lr=recipe["critic_lr"])
    train_prompts = preference_data("train").prompts
    P = train_prompts.shape[1]
    order = torch.cat([torch.randperm(len(train_prompts), generator=gen)
                       for _ in range(math.ceil(recipe["iterations"] * B / len(train_prompts)))])

    def reward_fn(_prompts: Tensor, responses: Tensor) -> Tensor:
        return keyword_reward(responses, kw)

    keys = ("reward_mean", "kl_mean", "entropy", "policy_loss", "value_loss", "clip_fraction",
            "approx_kl", "ratio_min", "ratio_max")
    history: dict[str, list[float]] = {k: [] for k in keys}
    for it in range(recipe["iterations"]):
        prompts = train_prompts[order[it * B:(it + 1) * B]]
        batch = rollout(policy, reference, critic, prompts, R, reward_fn, gen)
        history["reward_mean"].append(float(batch.scores.mean()))
        history["kl_mean"].append(float((batch.logprobs - batch.ref_logprobs).double().sum(1).mean()))
        history["entropy"].append(float(batch.entropy.double().mean()))
        stats = ppo_update(policy, critic, batch, policy_opt, critic_opt, beta=recipe["beta"],
                           gamma=recipe["gamma"], lam=recipe["lam"], clip_eps=recipe["clip_eps"],
                           value_clip=recipe["value_clip"], epochs=recipe["epochs"],
                           minibatch_size=recipe["minibatch_size"], max_grad_norm=recipe["max_grad_norm"],
                           whiten_advantages=recipe["whiten_advantages"], generator=gen)
        for k, v in stats.items():
            history[k].append(v)
    train_seconds = time.perf_counter() - began

    policy.eval()
    test_prompts = preference_data("test").prompts[:recipe.get("eval_prompts")]
    final: dict[str, Any] = {}
    for name, model in (("policy", policy), ("base", reference)):
        score = evaluate_policy(model, reference, test_prompts, kw)._asdict()
        score.update(_quality(model, reference, test_prompts, R, seed=0))
        final[name] = score
    final = {**final.pop("policy"), "base": final["base"]}

    iters, seq = recipe["iterations"], P + R
    policy_fwd = iters * B * seq * (1 + recipe["epochs"])  # rollout scoring + one per epoch
    policy_bwd = iters * B * seq * recipe["epochs"]
    critic_fwd, critic_bwd = policy_fwd, policy_bwd
    reference_fwd = iters * B * seq
    compute = {"wall_seconds": train_seconds, "iterations": iters, "prompts_seen": iters * B,
               "generated_tokens": iters * B * R,
               "policy_forward_tokens": policy_fwd, "policy_backward_tokens": policy_bwd,
               "reference_forward_tokens": reference_fwd,
               "critic_forward_tokens": critic_fwd, "critic_backward_tokens": critic_bwd,
               "forward_tokens": policy_fwd + reference_fwd + critic_fwd,
               "backward_tokens": policy_bwd + critic_bwd,
               "threads": 1}
    return lora_state_dict(policy), {"history": history, "final": final, "compute": compute}


register("ppo", PPO_RECIPE, train_ppo, __name__)
register("ppo_small_kl", PPO_SMALL_KL_RECIPE, train_ppo, __name__)


def load_ppo_policy(name: str = "ppo") -> tuple[TransformerLM, dict[str, Any]]:
    """The shipped PPO policy ``name`` ("ppo" or "ppo_small_kl") and its info: (policy, info).

    The policy is the book's text model with the shipped LoRA adapters loaded (unmerged), in
    eval mode with every parameter frozen; ``info`` is the artifact's (recipe, ``history``,
    ``final``, ``compute``), plus ``tokenizer``.
    """
    from llmbook.training.pretrained import book_model

    if name not in ("ppo", "ppo_small_kl"):
        raise ValueError(f"name must be 'ppo' or 'ppo_small_kl', got {name!r}")
    tensors, info = load_artifact(name)
    recipe = info["recipe"]
    base, binfo = book_model(recipe["base"])
    policy = make_policy(base, recipe["lora_targets"], recipe["lora_r"], recipe["lora_alpha"])
    missing, unexpected = policy.load_state_dict(tensors, strict=False)
    lora_missing = [k for k in missing if k.endswith((".lora_A", ".lora_B"))]
    if lora_missing or unexpected:
        raise ValueError(f"the artifact {name!r} does not fit the policy: missing {lora_missing}, "
                         f"unexpected {unexpected}")
    policy.requires_grad_(False)
    info = {**info, "tokenizer": binfo["tokenizer"]}
    return policy.eval(), info
