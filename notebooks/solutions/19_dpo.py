"""Reference solutions to the exercises of notebooks/19_dpo.

Checked by tests/test_solutions_19.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.dpo import expected_dpo_loss, log_partition, optimal_policy

# ---------------------------------------------------------------- exercise 1


def pair_optima() -> tuple[sp.Expr, sp.Expr]:
    """The log-ratio margin h = rho_a - rho_b that minimises the expected loss of one pair
    (a, b) in which a is preferred with probability p: (DPO's, IPO's), as SymPy expressions
    in ``p``, ``beta`` (DPO) and ``tau`` (IPO).

    DPO: -p log sigma(beta h) - (1 - p) log sigma(-beta h), minimised at
    h = logit(p) / beta, which grows without bound as p -> 1 (a preference seen always
    pushes the margin to infinity, whatever beta). IPO: p (h - 1/(2 tau))^2 +
    (1 - p) (-h - 1/(2 tau))^2, minimised at h = (2p - 1) / (2 tau), at most 1 / (2 tau).
    """
    p, beta, tau, h = sp.symbols("p beta tau h", positive=True)
    sig = lambda u: 1 / (1 + sp.exp(-u))  # noqa: E731
    dpo = -p * sp.log(sig(beta * h)) - (1 - p) * sp.log(sig(-beta * h))
    ipo = p * (h - 1 / (2 * tau)) ** 2 + (1 - p) * (-h - 1 / (2 * tau)) ** 2
    h_dpo = sp.solve(sp.diff(dpo, h), h)
    h_ipo = sp.solve(sp.diff(ipo, h), h)
    return sp.simplify(h_dpo[0]), sp.simplify(h_ipo[0])


# ---------------------------------------------------------------- exercise 2


def optimum_reward_and_kl(ref_probs: Tensor, rewards: Tensor, beta: float) -> tuple[float, float]:
    """E_{pi*}[r] and KL(pi* || pi_ref) of the optimal policy at ``beta`` (finite response set)."""
    star = optimal_policy(ref_probs, rewards, beta)
    reward = float((star * rewards).sum())
    kl = float((star * (star.log() - ref_probs.log())).sum())
    return reward, kl


def kl_from_reward(ref_probs: Tensor, rewards: Tensor, beta: float) -> float:
    """KL(pi* || pi_ref) = E_{pi*}[r] / beta - log Z: log(pi*/pi_ref) = r / beta - log Z."""
    reward, _ = optimum_reward_and_kl(ref_probs, rewards, beta)
    return reward / beta - float(log_partition(ref_probs, rewards, beta))


def reward_slope(ref_probs: Tensor, rewards: Tensor, beta: float) -> tuple[float, float]:
    """d E_{pi*}[r] / d beta by autograd, and the closed form -Var_{pi*}(r) / beta^2."""
    b = torch.tensor(beta, dtype=ref_probs.dtype, requires_grad=True)
    star = torch.softmax(ref_probs.log() + rewards / b, -1)
    mean = (star * rewards).sum()
    (slope,) = torch.autograd.grad(mean, b)
    var = float((star.detach() * rewards**2).sum() - mean.detach() ** 2)
    return float(slope), -var / beta**2


# ---------------------------------------------------------------- exercise 3


def tabular_descent(ref_probs: Tensor, rewards: Tensor, beta: float, weighted: bool, steps: int,
                    lr: float) -> tuple[list[float], Tensor]:
    """Gradient descent on the logits of a tabular policy over K responses, from pi = pi_ref.

    ``weighted=True`` minimises the expected DPO loss; ``weighted=False`` the same expected
    pairs with every pair's weight sigma(r_hat_l - r_hat_w) replaced by 1, i.e. the loss
    -E[r_hat_w - r_hat_l] (the gradient of DPO without its weight). Returns the KL(pi || pi_ref)
    after every step and the final policy.
    """
    logits = ref_probs.log().clone().requires_grad_(True)
    kls = []
    prefer = torch.sigmoid(rewards[:, None] - rewards[None, :])
    weight = ref_probs[:, None] * ref_probs[None, :]
    for _ in range(steps):
        pi = torch.softmax(logits, -1)
        if weighted:
            loss = expected_dpo_loss(pi, ref_probs, rewards, beta)
        else:
            r_hat = beta * (torch.log_softmax(logits, -1) - ref_probs.log())
            loss = -2 * (weight * prefer * (r_hat[:, None] - r_hat[None, :])).sum()
        (grad,) = torch.autograd.grad(loss, logits)
        with torch.no_grad():
            logits -= lr * grad
            log_pi = torch.log_softmax(logits, -1)  # finite even where pi underflows to 0
            kls.append(float((log_pi.exp() * (log_pi - ref_probs.log())).sum()))
    return kls, torch.softmax(logits.detach(), -1)


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
