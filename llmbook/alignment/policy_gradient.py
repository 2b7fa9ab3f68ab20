"""The theory under PPO, on examples small enough to solve exactly.

Introduced in notebooks/18_rlhf_ppo. Before PPO trains a language model, each of its parts
is checked where the exact answer is known:

* the policy-gradient theorem (the score-function identity
  grad E_pi[f] = E_pi[f grad log pi]; Williams, 1992, "Simple statistical gradient-following
  algorithms for connectionist reinforcement learning") on a categorical softmax policy:
  :func:`softmax_policy_gradient_symbolic` (SymPy), :func:`exact_policy_gradient`
  (autograd) and :func:`score_function_samples` (the Monte Carlo estimator, with a baseline);
* the three single-sample estimators of KL(p || q) of J. Schulman, "Approximating KL
  Divergence" (blog post, 2020), whose exact means and variances under a categorical p
  :func:`kl_estimator_moments` computes in SymPy, and :func:`sample_kl_estimators` samples;
* generalised advantage estimation (Schulman et al., 2016, "High-Dimensional Continuous
  Control Using Generalized Advantage Estimation"): :func:`gae_symbolic` builds the
  advantages of an episode of T steps both by the backward recursion and by the closed form;
* the clipped surrogate of PPO (Schulman et al., 2017, "Proximal Policy Optimization
  Algorithms"): :func:`clipped_surrogate_grad`, its derivative in the ratio by cases.
"""

from __future__ import annotations

import math
from typing import Any

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.losses import KLEstimates, kl_estimators
from llmbook.validation import check_finite, check_positive_int
from llmbook.validation import check_floating_tensor as _check_floating

__all__ = [
    "clipped_surrogate_grad",
    "exact_policy_gradient",
    "gae_symbolic",
    "kl_estimator_moments",
    "sample_kl_estimators",
    "score_function_samples",
    "softmax_policy_gradient_symbolic",
]


def _check_logits_rewards(logits: object, f: object) -> None:
    check_finite(_check_floating(logits, "logits"), "logits")
    check_finite(_check_floating(f, "f"), "f")
    if logits.ndim != 1 or logits.shape != f.shape or logits.shape[0] < 2:
        raise ValueError(f"logits and f must be 1-d of one length K >= 2, got shapes "
                         f"{tuple(logits.shape)} and {tuple(f.shape)}")


# ---------------------------------------------------------------- the policy-gradient theorem


def softmax_policy_gradient_symbolic(K: int) -> dict[str, Any]:
    """The gradient of J(theta) = sum_k pi_k f_k for a softmax policy pi = softmax(theta), in SymPy.

    Returns a dict with the symbols ``theta`` and ``f`` (K each), the probabilities ``pi``,
    ``J``, and three forms of the gradient (lists of K expressions):

    * ``direct``: d J / d theta_j by differentiating J;
    * ``score``: sum_k pi_k f_k d log pi_k / d theta_j, the score-function form E_pi[f grad log pi];
    * ``closed``: pi_j (f_j - J), what both simplify to (d log pi_k / d theta_j = [k = j] - pi_j).

    Also ``baseline_term``: sum_k pi_k d log pi_k / d theta_j (K expressions), which is 0:
    a constant baseline b adds -b times it to the estimator's mean, so it adds no bias.
    """
    K = check_positive_int("K", K)
    if K < 2:
        raise ValueError(f"a policy needs at least two actions, got K={K}")
    theta = sp.symbols(f"theta0:{K}", real=True)
    f = sp.symbols(f"f0:{K}", real=True)
    Z = sum(sp.exp(t) for t in theta)
    pi = [sp.exp(t) / Z for t in theta]
    J = sum(p * fk for p, fk in zip(pi, f, strict=True))
    log_pi = [t - sp.log(Z) for t in theta]  # log softmax
    direct = [sp.diff(J, t) for t in theta]
    score = [sum(pi[k] * f[k] * sp.diff(log_pi[k], t) for k in range(K)) for t in theta]
    closed = [pi[j] * (f[j] - J) for j in range(K)]
    baseline = [sum(pi[k] * sp.diff(log_pi[k], t) for k in range(K)) for t in theta]
    return {"theta": theta, "f": f, "pi": pi, "J": J, "direct": direct, "score": score,
            "closed": closed, "baseline_term": baseline}


def exact_policy_gradient(logits: Tensor, f: Tensor) -> Tensor:
    """grad_theta sum_k softmax(theta)_k f_k by autograd: (K,), (K,) -> (K,).

    The exact gradient of the expected reward of a one-step categorical policy with
    logits ``theta`` and per-action rewards ``f`` (use float64 for reference values).
    """
    _check_logits_rewards(logits, f)
    theta = logits.detach().clone().requires_grad_(True)
    J = (torch.softmax(theta, dim=0) * f.detach()).sum()
    (grad,) = torch.autograd.grad(J, theta)
    return grad


def score_function_samples(logits: Tensor, f: Tensor, num_samples: int, generator: torch.Generator,
                           baseline: float | Tensor = 0.0) -> Tensor:
    """N single-sample REINFORCE estimates of grad E_pi[f]: (K,), (K,) -> (N, K).

    Row n is (f(a_n) - b) grad_theta log pi(a_n) = (f(a_n) - b)(e_{a_n} - pi) for
    a_n ~ pi = softmax(logits) (drawn with ``generator``) and a constant ``baseline`` b.
    Their mean is the Monte Carlo estimate, unbiased for any b; its variance depends on b.
    """
    _check_logits_rewards(logits, f)
    num_samples = check_positive_int("num_samples", num_samples)
    if isinstance(baseline, Tensor):
        if baseline.numel() != 1:
            raise ValueError(f"baseline must be a number (one constant), got shape {tuple(baseline.shape)}")
        baseline = float(baseline)
    if isinstance(baseline, bool) or not isinstance(baseline, int | float) or not math.isfinite(baseline):
        raise ValueError(f"baseline must be a finite number, got baseline={baseline!r}")
    pi = torch.softmax(logits.detach(), dim=0)  # (K,)
    actions = torch.multinomial(pi, num_samples, replacement=True, generator=generator)  # (N,)
    score = torch.nn.functional.one_hot(actions, pi.shape[0]).to(pi.dtype) - pi  # (N, K)
    return (f.detach()[actions] - baseline)[:, None] * score  # (N, K)


# ---------------------------------------------------------------- KL estimators


def kl_estimator_moments(p: list[Any], q: list[Any]) -> dict[str, tuple[sp.Expr, sp.Expr]]:
    """Exact mean and variance under x ~ p of Schulman's k1, k2, k3, and KL(p || q), in SymPy.

    ``p`` and ``q`` are categorical distributions as lists of SymPy numbers or symbols
    (positive, each summing to 1). With rho = q(x) / p(x): k1 = -log rho,
    k2 = (log rho)^2 / 2, k3 = rho - 1 - log rho. Returns
    ``{"kl": (KL, 0), "k1": (mean, variance), "k2": ..., "k3": ...}``; the bias of an
    estimator is its mean minus ``kl``.
    """
    if len(p) != len(q) or len(p) < 2:
        raise ValueError(f"p and q must be lists of one length >= 2, got {len(p)} and {len(q)}")
    p = [sp.sympify(v) for v in p]
    q = [sp.sympify(v) for v in q]
    for name, dist in (("p", p), ("q", q)):
        if any(v.is_positive is False for v in dist):
            raise ValueError(f"{name} must have positive entries, got {dist}")
        total = sp.simplify(sum(dist))
        if total.is_number and total != 1:
            raise ValueError(f"{name} must sum to 1, got {total}")
    log_rho = [sp.log(qk) - sp.log(pk) for pk, qk in zip(p, q, strict=True)]
    estimators = {"k1": [-lr for lr in log_rho],
                  "k2": [lr ** 2 / 2 for lr in log_rho],
                  "k3": [qk / pk - 1 - lr for pk, qk, lr in zip(p, q, log_rho, strict=True)]}
    kl = sum(pk * (sp.log(pk) - sp.log(qk)) for pk, qk in zip(p, q, strict=True))
    out: dict[str, tuple[sp.Expr, sp.Expr]] = {"kl": (kl, sp.Integer(0))}
    for name, values in estimators.items():
        mean = sum(pk * v for pk, v in zip(p, values, strict=True))
        second = sum(pk * v ** 2 for pk, v in zip(p, values, strict=True))
        out[name] = (mean, second - mean ** 2)
    return out


def sample_kl_estimators(p: Tensor, q: Tensor, num_samples: int, generator: torch.Generator) -> KLEstimates:
    """k1, k2, k3 at ``num_samples`` draws x ~ p of a categorical pair: (K,), (K,) -> three (N,).

    Uses :func:`llmbook.alignment.losses.kl_estimators` on log p(x) and log q(x).
    """
    _check_floating(p, "p")
    _check_floating(q, "q")
    if p.ndim != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must be 1-d of one length, got {tuple(p.shape)} and {tuple(q.shape)}")
    for name, dist in (("p", p), ("q", q)):
        if not bool((dist > 0).all()):  # NaN too
            raise ValueError(f"{name} must be positive everywhere (its log appears in the "
                             f"estimators), got {name}={dist.tolist()}")
        if abs(float(dist.sum()) - 1) > 1e-4:
            raise ValueError(f"{name} must sum to 1 (a distribution), sums to {float(dist.sum())}")
    num_samples = check_positive_int("num_samples", num_samples)
    x = torch.multinomial(p, num_samples, replacement=True, generator=generator)  # (N,)
    return kl_estimators(torch.log(p)[x], torch.log(q)[x])


# ---------------------------------------------------------------- GAE


def gae_symbolic(T: int) -> dict[str, Any]:
    """GAE for an episode of ``T`` steps in SymPy, by recursion and by closed form.

    Symbols: rewards ``r`` (r_0 .. r_{T-1}), values ``V`` (V_0 .. V_{T-1}; V_T = 0, the
    episode ends), ``gamma``, ``lam``. With delta_t = r_t + gamma V_{t+1} - V_t:

    * ``recursive``: A_t = delta_t + gamma lam A_{t+1}, A_T = 0, unrolled backwards;
    * ``closed``: A_t = sum_{l=0}^{T-1-t} (gamma lam)^l delta_{t+l};
    * ``td``: the deltas; ``mc``: sum_l gamma^l r_{t+l} - V_t, the Monte Carlo advantage.

    Each is a list of T expressions.
    """
    T = check_positive_int("T", T)
    r = sp.symbols(f"r0:{T}", real=True)
    V = sp.symbols(f"V0:{T}", real=True)
    gamma, lam = sp.symbols("gamma lambda", nonnegative=True)
    Vn = [*V, sp.Integer(0)]  # V_T = 0
    delta = [r[t] + gamma * Vn[t + 1] - V[t] for t in range(T)]
    recursive: list[sp.Expr] = [sp.Integer(0)] * T
    nxt: sp.Expr = sp.Integer(0)
    for t in reversed(range(T)):
        nxt = delta[t] + gamma * lam * nxt
        recursive[t] = nxt
    closed = [sum((gamma * lam) ** k * delta[t + k] for k in range(T - t)) for t in range(T)]
    mc = [sum(gamma ** k * r[t + k] for k in range(T - t)) - V[t] for t in range(T)]
    return {"r": r, "V": V, "gamma": gamma, "lam": lam, "td": delta, "recursive": recursive,
            "closed": closed, "mc": mc}


# ---------------------------------------------------------------- the clipped surrogate


def clipped_surrogate_grad(ratio: Tensor, advantages: Tensor, clip_eps: float) -> Tensor:
    """d/d rho of min(rho A, clip(rho, 1 - eps, 1 + eps) A), by the four cases: elementwise.

    * A > 0: A while rho <= 1 + eps, 0 above (the objective is capped at (1 + eps) A);
    * A < 0: A while rho >= 1 - eps, 0 below (capped at (1 - eps) A);
    * A = 0: 0.

    So the gradient vanishes exactly where the ratio has already moved *in the direction
    the advantage favours* by more than eps; a ratio that moved the wrong way keeps its
    full gradient, which pulls it back. ``ratio`` and ``advantages`` have one shape.
    """
    check_finite(_check_floating(ratio, "ratio"), "ratio")
    check_finite(_check_floating(advantages, "advantages"), "advantages")
    if not bool((ratio > 0).all()):
        raise ValueError(f"ratio must be positive (a ratio of probabilities), found "
                         f"{float(ratio.min())}")
    if ratio.shape != advantages.shape:
        raise ValueError(f"ratio and advantages must have one shape, got {tuple(ratio.shape)} "
                         f"and {tuple(advantages.shape)}")
    if isinstance(clip_eps, bool) or not isinstance(clip_eps, int | float) or not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps must be a number in (0, 1), got {clip_eps!r}")
    flat = ((advantages > 0) & (ratio > 1 + clip_eps)) | ((advantages < 0) & (ratio < 1 - clip_eps))
    return torch.where(flat, torch.zeros_like(advantages), advantages)
