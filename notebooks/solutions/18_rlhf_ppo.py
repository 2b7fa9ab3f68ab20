"""Reference solutions to the exercises of notebooks/18_rlhf_ppo.

Checked by tests/test_solutions_18.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.losses import kl_estimator_variances, ppo_policy_loss
from llmbook.alignment.policy_gradient import exact_policy_gradient, kl_estimator_moments

# ---------------------------------------------------------------- exercise 1


def _score_norms(probs: Tensor) -> Tensor:
    """||e_a - pi||^2 for every action a: (K,) -> (K,)."""
    K = probs.shape[0]
    return ((torch.eye(K, dtype=probs.dtype) - probs) ** 2).sum(1)


def estimator_variance(logits: Tensor, f: Tensor, b: float) -> float:
    """Total variance of one REINFORCE sample (f(a) - b)(e_a - pi), summed over the K coordinates.

    sigma_b^2 = E[(f(a) - b)^2 ||e_a - pi||^2] - ||grad J||^2: a quadratic in b.
    """
    probs = torch.softmax(logits, 0)
    grad = exact_policy_gradient(logits, f)
    return float((probs * (f - b) ** 2 * _score_norms(probs)).sum() - grad.pow(2).sum())


def optimal_baseline(logits: Tensor, f: Tensor) -> float:
    """The b minimising sigma_b^2: E[f ||e_a - pi||^2] / E[||e_a - pi||^2].

    d sigma_b^2 / db = -2 E[(f - b) ||s||^2] = 0 gives it; the second derivative
    2 E[||s||^2] > 0 makes it the minimum. It weights each action's reward by how large
    that action's score vector is, so it differs from J = E[f] unless ||s|| is constant.
    """
    probs = torch.softmax(logits, 0)
    w = probs * _score_norms(probs)
    return float((w * f).sum() / w.sum())


def variance_quadratic(logits: Tensor, f: Tensor) -> tuple[sp.Expr, sp.Symbol]:
    """sigma_b^2 as a SymPy polynomial in the symbol b (numeric coefficients), and b."""
    b = sp.Symbol("b", real=True)
    probs = torch.softmax(logits, 0)
    norms = _score_norms(probs)
    grad_sq = float(exact_policy_gradient(logits, f).pow(2).sum())
    expr = sum(float(p) * (float(fk) - b) ** 2 * float(n) for p, fk, n in zip(probs, f, norms, strict=True))
    return sp.expand(expr - grad_sq), b


# ---------------------------------------------------------------- exercise 2


def kl_estimators_near_reference(order: int = 5) -> dict[str, sp.Expr]:
    """Series in delta of KL, k2's bias and the variances of k1, k2, k3, for p = (1/3, 2/3)
    and q = (1/3 + delta, 2/3 - delta); each truncated before delta**order."""
    d = sp.Symbol("delta", positive=True)
    m = kl_estimator_moments([sp.Rational(1, 3), sp.Rational(2, 3)],
                             [sp.Rational(1, 3) + d, sp.Rational(2, 3) - d])

    def series(expr: sp.Expr) -> sp.Expr:
        return sp.series(sp.expand_log(expr, force=True), d, 0, order).removeO()

    return {"delta": d, "kl": series(m["kl"][0]), "bias_k2": series(m["k2"][0] - m["kl"][0]),
            "var_k1": series(m["k1"][1]), "var_k2": series(m["k2"][1]), "var_k3": series(m["k3"][1])}


# ---------------------------------------------------------------- exercise 3


def n_step_advantage(r: Sequence[Any], V: Sequence[Any], gamma: Any, t: int, n: int) -> Any:
    """A^(n)_t = sum_{l<n} gamma^l r_{t+l} + gamma^n V_{t+n} - V_t, with V = 0 (and no
    rewards) from T on. Works on numbers and on SymPy symbols alike."""
    T = len(r)
    steps = min(n, T - t)
    total = sum(gamma ** k * r[t + k] for k in range(steps))
    bootstrap = gamma ** n * V[t + n] if t + n < T else 0
    return total + bootstrap - V[t]


def gae_from_n_step(r: Sequence[Any], V: Sequence[Any], gamma: Any, lam: Any) -> list[Any]:
    """GAE as the lambda-weighted average of the n-step advantages, the tail weight collected
    on the last one: (1 - lam) sum_{n < T - t} lam^(n-1) A^(n) + lam^(T-t-1) A^(T-t)."""
    T = len(r)
    out = []
    for t in range(T):
        horizon = T - t
        head = sum((1 - lam) * lam ** (n - 1) * n_step_advantage(r, V, gamma, t, n) for n in range(1, horizon))
        out.append(head + lam ** (horizon - 1) * n_step_advantage(r, V, gamma, t, horizon))
    return out


# ---------------------------------------------------------------- exercise 4


def bandit_ppo(ref_logits: Tensor, rewards: Tensor, beta: float, generator: torch.Generator,
               iterations: int = 300, batch_size: int = 512, epochs: int = 4, lr: float = 0.1,
               clip_eps: float = 0.2) -> Tensor:
    """PPO on a K-armed bandit with the KL-shaped reward r_a - beta log(pi(a) / pi_ref(a)).

    Each iteration samples ``batch_size`` actions from the current policy, uses the mean
    shaped reward as the baseline, and takes ``epochs`` Adam steps (learning rate decaying
    linearly to 0) on ``ppo_policy_loss`` of the sampled actions. Returns the final
    probabilities (K,).

    At the optimum pi* = softmax(theta_ref + r / beta) the shaped reward
    r_a - beta log(pi*(a) / pi_ref(a)) = beta log Z is the same for every action, so every
    advantage is exactly 0: the noise of the estimate vanishes there, and the iterates settle
    on pi* itself rather than jittering around it.
    """
    theta = ref_logits.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    total = iterations * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / total)
    ref_logp = torch.log_softmax(ref_logits, 0)
    mask = torch.ones(batch_size, 1, dtype=ref_logits.dtype)
    for _ in range(iterations):
        with torch.no_grad():
            old_logp = torch.log_softmax(theta, 0)
            actions = torch.multinomial(old_logp.exp(), batch_size, replacement=True, generator=generator)
            shaped = rewards[actions] - beta * (old_logp[actions] - ref_logp[actions])
            advantages = shaped - shaped.mean()
        for _ in range(epochs):
            logp = torch.log_softmax(theta, 0)[actions]
            loss, _ = ppo_policy_loss(logp[:, None], old_logp[actions][:, None], advantages[:, None], mask,
                                      clip_eps)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return torch.softmax(theta.detach(), 0)


def kl_regularised_optimum(ref_logits: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """pi* = softmax(theta_ref + r / beta), the maximiser of E_pi[r] - beta KL(pi || pi_ref)."""
    return torch.softmax(ref_logits + rewards / beta, 0)


# ---------------------------------------------------------------- exercise 5


def k3_variance_gap(eps: float, q_other: float = 0.5) -> float:
    """Var[k3] - Var[k1] for p = (1 - eps, eps) and q = (1 - q_other, q_other), exactly."""
    logp = torch.tensor([1 - eps, eps], dtype=torch.float64).log()
    logq = torch.tensor([1 - q_other, q_other], dtype=torch.float64).log()
    var = kl_estimator_variances(logp, logq)
    return float(var.k3 - var.k1)


def k3_variance_crossover(q_other: float = 0.5, iterations: int = 200) -> float:
    """The eps* below which k3 spreads more than k1, for p = (1 - eps, eps), q = (1 - q_other, q_other).

    For two outcomes Var[k3] / Var[k1] = (L - 1)^2 with L the logarithmic mean of the two
    ratios (notebooks/18_rlhf_ppo, 18.3): the gap is positive for small eps (L large: the
    policy all but rules out an outcome the reference gives q_other) and negative as eps
    approaches q_other (L -> 1). Bisection on the exact gap between the two.
    """
    lo, hi = 1e-12, q_other * (1 - 1e-9)  # gap > 0 at lo, < 0 at hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if k3_variance_gap(mid, q_other) > 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
