"""Over-optimising a learned reward model: best-of-n, PPO and GRPO against a proxy, measured.

Introduced in notebooks/18b_reward_overoptimisation. Chapter 17 learned a reward model r_phi
from noisy preferences; chapters 18–20 optimised the *true* keyword reward. Here the learned
model is the **proxy** that the optimiser sees, and the keyword count is the **gold**
reward that it does not see, as in Gao et al. (2023, "Scaling Laws for Reward Model
Overoptimization"), who measure the gold reward against the distance d = sqrt(KL(pi || pi_ref))
that an optimiser has moved the policy, and fit

    best-of-n:  R(d) = d (alpha - beta d),          RL:  R(d) = d (alpha - beta log d),

with R(0) = 0 (the gain over the starting policy). This module holds:

* the best-of-n policy's distance from its base, derived (:func:`best_of_n_kl_symbolic`:
  for a continuous reward the winner has density n F^(n-1) f and
  KL = log n - (n - 1)/n, :func:`best_of_n_kl`), exact for a discrete base distribution
  (:func:`best_of_n_distribution`, :func:`best_of_n_kl_exact`, never above the formula), and
  drawn by Monte Carlo (:func:`sample_best_of_n`, :func:`plug_in_kl`);
* the unbiased estimate of a best-of-n policy's expected value from N >= n samples per
  prompt, averaging over all n-subsets at once by order statistics (:func:`best_of_n_weights`,
  :func:`best_of_n_estimate`);
* the two functional forms fitted by linear least squares (:func:`gao_fit`, :func:`gao_curve`,
  :func:`gao_peak`);
* PPO and GRPO against the proxy, evaluated every few steps (:func:`reward_model_scorer`,
  :func:`evaluate_against_proxy`, :func:`train_proxy_ppo`, :func:`train_proxy_grpo`,
  :func:`best_of_n_pool`), run by ``data/make_overoptimisation.py``, whose results
  :func:`load_overoptimisation` loads.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import sympy as sp
import torch
from torch import Tensor, nn

from llmbook.alignment.logprobs import response_logprobs
from llmbook.alignment.losses import group_normalized_rewards
from llmbook.alignment.ppo import PPO_RECIPE, ValueModel, make_policy, ppo_update, rollout
from llmbook.alignment.preferences import (
    KEYWORDS,
    PREFERENCE_RECIPE,
    evaluate_policy,
    keyword_ids,
    keyword_reward,
    preference_data,
    sample_responses,
)
from llmbook.alignment.reasoning import GRPOBatch, grpo_microbatch_step
from llmbook.alignment.reward_model import RewardModel
from llmbook.validation import check_array, check_finite, check_positive_int, check_token_ids
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "OVEROPTIMISATION_RECIPE",
    "GaoFit",
    "best_of_n_distribution",
    "best_of_n_estimate",
    "best_of_n_kl",
    "best_of_n_kl_exact",
    "best_of_n_kl_symbolic",
    "best_of_n_pool",
    "best_of_n_weights",
    "evaluate_against_proxy",
    "gao_curve",
    "gao_fit",
    "gao_peak",
    "load_overoptimisation",
    "plug_in_kl",
    "reward_model_scorer",
    "sample_best_of_n",
    "train_proxy_grpo",
    "train_proxy_ppo",
]

#: The runs of data/make_overoptimisation.py: a best-of-n pool, PPO and GRPO against the proxy.
OVEROPTIMISATION_RECIPE: dict[str, Any] = {
    "base": "text", "keywords": list(KEYWORDS), "response_tokens": PREFERENCE_RECIPE["response_tokens"],
    "pool_prompts": 256, "pool_samples": 64, "pool_seed": 1,
    "eval_prompts": 256, "eval_seed": 0,
    "ppo": {**PPO_RECIPE, "beta": 0.003, "iterations": 60, "eval_every": 5, "seed": 0},
    "grpo": {"iterations": 60, "prompts_per_step": 8, "group_size": 8, "updates_per_batch": 2,
             "clip_eps": 0.2, "beta": 0.0, "lr": 1e-3, "max_grad_norm": 1.0,
             "lora_targets": PPO_RECIPE["lora_targets"], "lora_r": PPO_RECIPE["lora_r"],
             "lora_alpha": PPO_RECIPE["lora_alpha"], "eval_every": 5, "seed": 0},
}


# ---------------------------------------------------------------- best-of-n: the KL, derived


def best_of_n_kl_symbolic() -> dict[str, sp.Expr]:
    """The best-of-n policy of a continuous reward and its KL from the base policy, in SymPy.

    Draw n responses independently from pi and keep the one with the highest reward r. If
    F is the CDF of r under pi, the winner's reward is below t exactly when all n are:
    P(max <= t) = F(t)^n, so the winner's density is d/dt F^n = n F^(n-1) f: the best-of-n
    policy is pi_bon(y) = n F(r(y))^(n-1) pi(y). Its KL from pi is the expectation under
    pi_bon of log(n F^(n-1)); with u = F(r) uniform under pi,

        KL(pi_bon || pi) = int_0^1 n u^(n-1) log(n u^(n-1)) du = log n - (n - 1)/n.

    Returns ``density`` (d/dt F(t)^n), ``ratio`` (n u^(n-1)), ``antiderivative`` (of
    ratio * log(ratio) in u) and ``kl`` (the antiderivative at 1 minus its limit at 0+,
    simplified), in the symbols n, u, t and the function F.
    """
    n = sp.Symbol("n", positive=True, integer=True)
    u, t = sp.symbols("u t", positive=True)
    F = sp.Function("F")
    density = sp.diff(F(t) ** n, t)
    ratio = n * u ** (n - 1)
    antiderivative = sp.integrate(sp.expand(sp.expand_log(ratio * sp.log(ratio), force=True)), u)
    kl = sp.simplify(antiderivative.subs(u, 1) - sp.limit(antiderivative, u, 0, "+"))
    return {"density": density, "ratio": ratio, "antiderivative": antiderivative, "kl": kl}


def best_of_n_kl(n: int) -> float:
    """KL(pi_bon || pi) = log n - (n - 1)/n nats, for a reward with no ties (continuous).

    0 at n = 1; it grows like log n, so the distance d = sqrt(KL) that best-of-n travels
    grows very slowly: n = 64 is only KL = 3.17 nats.
    """
    n = check_positive_int("n", n)
    return math.log(n) - (n - 1) / n


def _check_categorical(probs: object, rewards: object) -> tuple[Tensor, Tensor]:
    for name, x in (("probs", probs), ("rewards", rewards)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        check_finite(_check_floating(x, name), name)
    assert isinstance(probs, Tensor) and isinstance(rewards, Tensor)
    if probs.ndim != 1 or probs.numel() == 0 or tuple(rewards.shape) != tuple(probs.shape):
        raise ValueError(f"probs and rewards must be (K,) of one shape with K >= 1, got "
                         f"{tuple(probs.shape)} and {tuple(rewards.shape)}")
    p = probs.double()
    if bool((p <= 0).any()) or abs(float(p.sum()) - 1) > 1e-9:
        raise ValueError(f"probs must be positive and sum to 1, got sum {float(p.sum())!r} and "
                         f"minimum {float(p.min())!r}")
    return p / p.sum(), rewards.double()


def best_of_n_distribution(probs: Tensor, rewards: Tensor, n: int) -> Tensor:
    """The exact best-of-n distribution over K outcomes of a categorical base policy: (K,) float64.

    ``probs`` (K,) is pi (positive, summing to 1), ``rewards`` (K,) the reward of each
    outcome. With the outcomes sorted by reward and F_i = sum of the probabilities of the
    first i, an outcome whose reward is shared by no other wins with probability
    F_i^n - F_(i-1)^n (all n draws at or below it, not all strictly below). **Ties** are
    broken uniformly at random among the drawn responses with the highest reward: then a
    block of outcomes with equal reward wins with F_hi^n - F_lo^n in total, split in
    proportion to pi within the block (the tied draws are i.i.d. from pi restricted to the
    block). Returned in the input's order.
    """
    p, r = _check_categorical(probs, rewards)
    n = check_positive_int("n", n)
    values, block = torch.unique(r, return_inverse=True)  # sorted distinct rewards, block of each
    block_p = torch.zeros(values.numel(), dtype=torch.float64).index_add_(0, block, p)
    F = torch.cumsum(block_p, 0).clamp(max=1.0)  # (blocks,) CDF at each distinct reward
    F_below = torch.cat([torch.zeros(1, dtype=torch.float64), F[:-1]])
    wins = F ** n - F_below ** n  # (blocks,)
    return wins[block] * p / block_p[block]


def best_of_n_kl_exact(probs: Tensor, rewards: Tensor, n: int) -> float:
    """KL(pi_bon || pi) in nats for a categorical base policy, exactly (:func:`best_of_n_distribution`).

    Never above log n - (n - 1)/n. Proof: with distinct rewards, pi_bon(i)/pi(i) =
    (F_i^n - F_(i-1)^n)/(F_i - F_(i-1)) is the average of g(u) = n u^(n-1) over
    [F_(i-1), F_i], and by Jensen's inequality for the convex t log t each interval
    contributes at most the integral of g log g over it; the sum of those integrals over
    [0, 1] is the continuous KL. A tied block is one interval whose mass is split in
    proportion to pi, which leaves its ratio, hence its term, unchanged. Equality needs g
    constant on every interval: it is reached only as the largest probability shrinks to 0.
    """
    q = best_of_n_distribution(probs, rewards, n)
    p, _ = _check_categorical(probs, rewards)
    keep = q > 0
    return float((q[keep] * (q[keep] / p[keep]).log()).sum())


def sample_best_of_n(probs: Tensor, rewards: Tensor, n: int, num: int,
                     generator: torch.Generator | None = None) -> Tensor:
    """``num`` Monte Carlo draws of the best-of-n policy of a categorical base: (num,) outcome indices.

    Each draw takes n i.i.d. outcomes from ``probs`` and keeps the one with the highest
    reward; ties are broken uniformly at random (the rule of :func:`best_of_n_distribution`).
    """
    p, r = _check_categorical(probs, rewards)
    n, num = check_positive_int("n", n), check_positive_int("num", num)
    draws = torch.multinomial(p, num * n, replacement=True, generator=generator).view(num, n)
    r_draws = r[draws]  # (num, n)
    at_max = r_draws == r_draws.max(dim=1, keepdim=True).values
    key = torch.rand(num, n, generator=generator, dtype=torch.float64) * at_max  # random tie-break
    return draws.gather(1, key.argmax(dim=1, keepdim=True))[:, 0]


def plug_in_kl(samples: Tensor, probs: Tensor) -> float:
    """The plug-in estimate sum_i q_i log(q_i / p_i) of KL(q || p) from ``samples`` (M,) of q.

    q_i is the fraction of the samples equal to outcome i; ``probs`` (K,) is p. Biased
    upwards by about (K' - 1)/(2M) for K' outcomes seen (the estimate of a KL of 0 from
    finite samples is positive), so use M much larger than K.
    """
    check_token_ids(samples, "samples", ndim=1)
    p, _ = _check_categorical(probs, probs)
    if samples.numel() == 0 or int(samples.max()) >= p.numel():
        raise ValueError(f"samples must be a non-empty (M,) tensor of outcome indices below "
                         f"K={p.numel()}")
    q = torch.bincount(samples.long(), minlength=p.numel()).double() / samples.numel()
    keep = q > 0
    return float((q[keep] * (q[keep] / p[keep]).log()).sum())


# ---------------------------------------------------------------- best-of-n from a pool of samples


def _check_pool(scores: object, name: str) -> Tensor:
    if not isinstance(scores, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scores).__name__}")
    check_finite(_check_floating(scores, name), name)
    if scores.ndim != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"{name} must be (B, N): N samples for each of B prompts, got "
                         f"{tuple(scores.shape)}")
    return scores.double()


def best_of_n_weights(proxy: Tensor, n: int) -> Tensor:
    """How often each of N samples is the best of a uniformly random n-subset: (B, N) -> (B, N).

    Row b holds N proxy scores of samples to prompt b. The sample of rank k (1 = lowest
    score) is the maximum of an n-subset exactly when the subset holds it and n - 1 of the
    k - 1 samples below it: C(k - 1, n - 1) of the C(N, n) subsets. So the average over
    all subsets of the best one's value is the weighted sum with these weights, an
    unbiased estimate of the best-of-n policy's expected value that uses every sample
    (Gao et al., 2023, appendix; the order-statistics form of Nakano et al., 2021's
    best-of-n). Ties: samples with equal scores share their weights equally (a uniformly
    random tie-break). Each row sums to 1. Needs n <= N.
    """
    s = _check_pool(proxy, "proxy")
    n = check_positive_int("n", n)
    B, N = s.shape
    if n > N:
        raise ValueError(f"n={n} exceeds the number of samples per prompt N={N}")
    k = torch.arange(1, N + 1, dtype=torch.float64)
    log_w = (torch.lgamma(k) - torch.lgamma(k - n + 1).where(k >= n, torch.ones_like(k))
             - math.lgamma(n) - (math.lgamma(N + 1) - math.lgamma(n + 1) - math.lgamma(N - n + 1)))
    w_sorted = torch.where(k >= n, log_w.exp(), torch.zeros_like(k))  # (N,) by ascending rank
    order = torch.argsort(s, dim=1, stable=True)
    w = torch.empty_like(s).scatter_(1, order, w_sorted.expand(B, N).contiguous())
    for b in range(B):  # share weights within tied scores
        values, inverse = torch.unique(s[b], return_inverse=True)
        if values.numel() < N:
            total = torch.zeros(values.numel(), dtype=torch.float64).index_add_(0, inverse, w[b])
            count = torch.bincount(inverse, minlength=values.numel()).double()
            w[b] = (total / count)[inverse]
    return w


def best_of_n_estimate(proxy: Tensor, value: Tensor, n: int) -> Tensor:
    """The expected ``value`` of the sample that best-of-n picks by ``proxy``, per prompt: (B,).

    ``proxy`` and ``value`` are (B, N): the selection score and the quantity to average
    (e.g. the reward model's score and the gold keyword count of N samples to each of B
    prompts). Equals the mean, over all C(N, n) subsets of each row, of the value of the
    subset's highest-proxy sample (:func:`best_of_n_weights`). Float64.
    """
    v = _check_pool(value, "value")
    if tuple(v.shape) != tuple(proxy.shape):
        raise ValueError(f"proxy and value must have one shape (B, N), got {tuple(proxy.shape)} "
                         f"and {tuple(v.shape)}")
    return (best_of_n_weights(proxy, n) * v).sum(dim=1)


# ---------------------------------------------------------------- the functional forms


class GaoFit(NamedTuple):
    """A least-squares fit R(d) = d (alpha - beta d) (``form="bon"``) or d (alpha - beta log d)
    (``"rl"``): the coefficients, the coefficient of determination ``r2`` and the root mean
    square ``rmse`` of the residuals."""

    form: str
    alpha: float
    beta: float
    r2: float
    rmse: float


_FORMS = ("bon", "rl")


def _design(d: np.ndarray, form: str) -> np.ndarray:
    if form not in _FORMS:
        raise ValueError(f"form must be one of {_FORMS}, got {form!r}")
    second = d * d if form == "bon" else d * np.log(np.where(d > 0, d, 1.0))  # d log d -> 0 at d = 0
    return np.stack([d, -second], axis=1)  # R = alpha * d - beta * second


def gao_curve(d: object, alpha: float, beta: float, form: str) -> np.ndarray:
    """R(d) = d (alpha - beta d) for ``form="bon"`` or d (alpha - beta log d) for ``"rl"``: (M,).

    At d = 0 both are 0 (d log d -> 0).
    """
    arr = check_array("d", d, sign="nonnegative")
    return _design(arr, form) @ np.array([float(alpha), float(beta)])


def gao_fit(d: object, reward: object, form: str) -> GaoFit:
    """Fit Gao et al.'s (2023) form to gains ``reward`` (M,) at distances ``d`` (M,) = sqrt(KL).

    Both forms are linear in (alpha, beta): R = alpha d - beta d^2 or alpha d - beta d log d,
    so ordinary least squares on those two columns (no intercept: R(0) = 0) gives them in
    closed form (``numpy.linalg.lstsq``, float64). ``reward`` is the gain over the start,
    R(d) - R(0). Needs at least two points with d > 0.
    """
    arr_d = check_array("d", d, sign="nonnegative")
    arr_r = check_array("reward", reward)
    if arr_r.shape != arr_d.shape:
        raise ValueError(f"d and reward must have one shape (M,), got {arr_d.shape} and {arr_r.shape}")
    if int((arr_d > 0).sum()) < 2:
        raise ValueError("gao_fit needs at least two points with d > 0")
    X = _design(arr_d, form)
    coef = np.linalg.lstsq(X, arr_r, rcond=None)[0]
    resid = arr_r - X @ coef
    total = float(((arr_r - arr_r.mean()) ** 2).sum())
    r2 = 1 - float((resid ** 2).sum()) / total if total > 0 else float("nan")
    return GaoFit(form, float(coef[0]), float(coef[1]), r2, float(np.sqrt((resid ** 2).mean())))


def gao_peak(fit: GaoFit) -> float:
    """The distance d* at which the fitted R(d) is largest (``inf`` if it never turns down).

    best-of-n: dR/dd = alpha - 2 beta d = 0 at d* = alpha / (2 beta); RL: dR/dd =
    alpha - beta log d - beta = 0 at d* = exp(alpha / beta - 1). Both need alpha, beta > 0.
    """
    if not isinstance(fit, GaoFit):
        raise TypeError(f"fit must be a GaoFit, got {type(fit).__name__}")
    if fit.beta <= 0 or fit.alpha <= 0:
        return math.inf
    if fit.form == "bon":
        return fit.alpha / (2 * fit.beta)
    return math.exp(fit.alpha / fit.beta - 1)


# ---------------------------------------------------------------- optimising the proxy


def reward_model_scorer(reward_model: RewardModel, batch_size: int = 256) -> Callable[[Tensor, Tensor], Tensor]:
    """The learned reward model as a ``reward_fn(prompts, responses) -> scores`` for :func:`rollout`.

    Scores (B,) float are r_phi(x, y) in batches of ``batch_size``, without gradients and
    in eval mode: the proxy reward that PPO and GRPO maximise here.
    """
    if not isinstance(reward_model, RewardModel):
        raise TypeError(f"reward_model must be a RewardModel, got {type(reward_model).__name__}")
    batch_size = check_positive_int("batch_size", batch_size)

    @torch.no_grad()
    def score(prompts: Tensor, responses: Tensor) -> Tensor:
        reward_model.eval()
        return torch.cat([reward_model(prompts[i:i + batch_size], responses[i:i + batch_size])
                          for i in range(0, prompts.shape[0], batch_size)])

    return score


@torch.no_grad()
def evaluate_against_proxy(policy: nn.Module, reference: nn.Module, reward_model: RewardModel,
                           prompts: Tensor, keywords: Tensor, seed: int = 0) -> dict[str, float]:
    """Gold and proxy reward and distance of ``policy`` on ``prompts`` (N, P): a dict of floats.

    ``gold`` (mean keyword count), ``kl`` and ``kl_stderr`` come from
    :func:`~llmbook.alignment.preferences.evaluate_policy` (one response per prompt, sampled
    with ``seed``); ``proxy`` is the reward model's mean score of the same responses
    (sampled again with the same seed); ``d`` = sqrt(max(kl, 0)).
    """
    score = evaluate_policy(policy, reference, prompts, keywords, seed=seed)
    responses = sample_responses(policy, prompts, PREFERENCE_RECIPE["response_tokens"], 1.0,
                                 torch.Generator().manual_seed(seed))
    proxy = reward_model_scorer(reward_model)(prompts, responses).double().mean().item()
    return {"gold": score.reward, "proxy": proxy, "kl": score.kl, "kl_stderr": score.kl_stderr,
            "d": math.sqrt(max(score.kl, 0.0)),
            "gold_check": keyword_reward(responses, keywords).double().mean().item()}


def _setup(recipe: dict[str, Any], run: dict[str, Any]) -> tuple[Any, ...]:
    from llmbook.alignment.reward_model import load_reward_model
    from llmbook.training.pretrained import book_model

    reference, binfo = book_model(recipe["base"])
    reference.requires_grad_(False)
    reward_model, _ = load_reward_model()
    kw = keyword_ids(binfo["tokenizer"], tuple(recipe["keywords"]))
    gen = torch.Generator().manual_seed(run["seed"])
    policy = make_policy(reference, run["lora_targets"], run["lora_r"], run["lora_alpha"], gen)
    test = preference_data("test").prompts[:recipe["eval_prompts"]]
    curve: dict[str, list[float]] = {k: [] for k in ("step", "gold", "proxy", "kl", "kl_stderr", "d")}
    return reference, reward_model, reward_model_scorer(reward_model), kw, gen, policy, test, curve


def _record(curve: dict[str, list[float]], step: int, policy: nn.Module, reference: nn.Module,
            reward_model: RewardModel, test: Tensor, kw: Tensor, seed: int) -> None:
    policy.eval()
    point = evaluate_against_proxy(policy, reference, reward_model, test, kw, seed)
    policy.train()
    curve["step"].append(step)
    for k in ("gold", "proxy", "kl", "kl_stderr", "d"):
        curve[k].append(point[k])


def _train_prompts(num: int, gen: torch.Generator) -> Tensor:
    prompts = preference_data("train").prompts
    order = torch.cat([torch.randperm(len(prompts), generator=gen) for _ in range(math.ceil(num / len(prompts)))])
    return prompts[order[:num]]


def train_proxy_ppo(recipe: dict[str, Any] = OVEROPTIMISATION_RECIPE) -> dict[str, Any]:
    """PPO (chapter 18's :func:`~llmbook.alignment.ppo.rollout` and :func:`~llmbook.alignment.ppo.ppo_update`)
    with the learned reward model as the score; returns its evaluation curve.

    ``recipe["ppo"]`` is chapter 18's recipe with a small KL coefficient (beta = 0.003, the
    reward-hacking run's) so that the policy travels far. Every ``eval_every`` iterations
    (and before the first) :func:`evaluate_against_proxy` on the first ``eval_prompts`` test
    prompts records ``step``, ``gold``, ``proxy``, ``kl``, ``kl_stderr`` and ``d``; also
    the rollouts' mean proxy score per iteration (``train_proxy``) and ``wall_seconds``.
    """
    run = recipe["ppo"]
    began = time.perf_counter()
    reference, reward_model, scorer, kw, gen, policy, test, curve = _setup(recipe, run)
    critic = ValueModel(copy.deepcopy(reference).requires_grad_(True))
    policy_opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=run["lr"])
    critic_opt = torch.optim.Adam(critic.parameters(), lr=run["critic_lr"])
    B, R = run["batch_size"], recipe["response_tokens"]
    prompts_all = _train_prompts(run["iterations"] * B, gen)
    train_proxy: list[float] = []
    for it in range(run["iterations"]):
        if it % run["eval_every"] == 0:
            _record(curve, it, policy, reference, reward_model, test, kw, recipe["eval_seed"])
        batch = rollout(policy, reference, critic, prompts_all[it * B:(it + 1) * B], R, scorer, gen)
        train_proxy.append(float(batch.scores.double().mean()))
        ppo_update(policy, critic, batch, policy_opt, critic_opt, beta=run["beta"], gamma=run["gamma"],
                   lam=run["lam"], clip_eps=run["clip_eps"], value_clip=run["value_clip"],
                   epochs=run["epochs"], minibatch_size=run["minibatch_size"],
                   max_grad_norm=run["max_grad_norm"], whiten_advantages=run["whiten_advantages"],
                   generator=gen)
    _record(curve, run["iterations"], policy, reference, reward_model, test, kw, recipe["eval_seed"])
    return {"curve": curve, "train_proxy": train_proxy, "wall_seconds": time.perf_counter() - began}


def train_proxy_grpo(recipe: dict[str, Any] = OVEROPTIMISATION_RECIPE) -> dict[str, Any]:
    """GRPO with the learned reward model as the reward; returns its evaluation curve.

    Each iteration samples ``group_size`` responses to each of ``prompts_per_step``
    training prompts from the current LoRA policy, scores them with the reward model,
    normalises the scores within each group
    (:func:`~llmbook.alignment.losses.group_normalized_rewards`) and takes
    ``updates_per_batch`` Adam steps on the clipped GRPO loss
    (:func:`~llmbook.alignment.reasoning.grpo_microbatch_step`; no KL term with beta = 0, as
    in DAPO). No critic. Evaluated as :func:`train_proxy_ppo`.
    """
    run = recipe["grpo"]
    began = time.perf_counter()
    reference, reward_model, scorer, kw, gen, policy, test, curve = _setup(recipe, run)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=run["lr"])
    M, G, R = run["prompts_per_step"], run["group_size"], recipe["response_tokens"]
    prompts_all = _train_prompts(run["iterations"] * M, gen)
    train_proxy: list[float] = []
    for it in range(run["iterations"]):
        if it % run["eval_every"] == 0:
            _record(curve, it, policy, reference, reward_model, test, kw, recipe["eval_seed"])
        prompts = prompts_all[it * M:(it + 1) * M].repeat_interleave(G, dim=0)  # (M G, P)
        with torch.no_grad():
            responses = sample_responses(policy, prompts, R, 1.0, gen)
            scores = scorer(prompts, responses).double()
            old = response_logprobs(policy, prompts, responses)
            ref = response_logprobs(reference, prompts, responses) if run["beta"] else None
        train_proxy.append(float(scores.mean()))
        batch = GRPOBatch(prompts, responses, torch.ones_like(responses, dtype=torch.bool), scores.float(),
                          group_normalized_rewards(scores, G).float(), old, ref)
        for _ in range(run["updates_per_batch"]):
            opt.zero_grad()
            grpo_microbatch_step(policy, batch, M * G, run["clip_eps"], run["beta"])
            nn.utils.clip_grad_norm_(params, run["max_grad_norm"])
            opt.step()
    _record(curve, run["iterations"], policy, reference, reward_model, test, kw, recipe["eval_seed"])
    return {"curve": curve, "train_proxy": train_proxy, "wall_seconds": time.perf_counter() - began}


@torch.no_grad()
def best_of_n_pool(recipe: dict[str, Any] = OVEROPTIMISATION_RECIPE) -> dict[str, Any]:
    """N = ``pool_samples`` base-model responses to each of ``pool_prompts`` test prompts, scored.

    Returns ``proxy`` and ``gold`` as (B, N) nested lists (the reward model's score and the
    keyword count of each response), from which :func:`best_of_n_estimate` gives best-of-n
    for every n <= N; and ``wall_seconds``.
    """
    from llmbook.alignment.reward_model import load_reward_model
    from llmbook.training.pretrained import book_model

    began = time.perf_counter()
    base, binfo = book_model(recipe["base"])
    reward_model, _ = load_reward_model()
    kw = keyword_ids(binfo["tokenizer"], tuple(recipe["keywords"]))
    B, N = recipe["pool_prompts"], recipe["pool_samples"]
    prompts = preference_data("test").prompts[:B].repeat_interleave(N, dim=0)  # (B N, P)
    responses = sample_responses(base, prompts, recipe["response_tokens"], 1.0,
                                 torch.Generator().manual_seed(recipe["pool_seed"]))
    proxy = reward_model_scorer(reward_model)(prompts, responses).double().view(B, N)
    gold = keyword_reward(responses, kw).double().view(B, N)
    return {"proxy": proxy.tolist(), "gold": gold.tolist(), "wall_seconds": time.perf_counter() - began}


def load_overoptimisation() -> dict[str, Any]:
    """The shipped results of data/make_overoptimisation.py (``data/overoptimisation/results.json``).

    Keys: ``recipe``, ``pool`` (:func:`best_of_n_pool`), ``ppo`` and ``grpo``
    (:func:`train_proxy_ppo`, :func:`train_proxy_grpo`), ``made``.
    """
    from llmbook.paths import data_path, missing_data

    path = data_path("overoptimisation", "results.json")
    if not path.is_file():
        raise missing_data(path, "the over-optimisation results", "python data/make_overoptimisation.py")
    return json.loads(path.read_text())
