"""Reference solutions to the exercises of notebooks/20_grpo.

Checked by tests/test_solutions_20.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.losses import group_normalized_rewards, grpo_loss
from llmbook.alignment.repeated_sampling import majority_probability_symbolic

p = sp.Symbol("p", positive=True)

# ---------------------------------------------------------------- exercise 1


def majority_with_coin_ties_symbolic(n: int) -> sp.Expr:
    """Two-answer majority vote of n, a tie (even n) settled by a fair coin, in the symbol p.

    P(win) = sum_{k > n/2} C(n, k) p^k (1 - p)^(n - k) + [n even] C(n, n/2) (p (1 - p))^(n/2) / 2.
    """
    win = majority_probability_symbolic(n).doit()
    if n % 2 == 0:
        win += sp.Rational(1, 2) * sp.binomial(n, n // 2) * (p * (1 - p)) ** (n // 2)
    return sp.expand(win)


def even_votes_gain_nothing(m: int) -> sp.Expr:
    """P_{2m} - P_{2m-1} with coin-flip ties: identically 0 (an even vote adds no accuracy).

    Why: of 2m votes, take the first 2m - 1. Their majority is overturned by the last vote
    only when they split m : m - 1, and then the last vote makes a tie that the coin settles
    half the time either way: gains and losses cancel exactly.
    """
    return sp.expand(majority_with_coin_ties_symbolic(2 * m) - majority_with_coin_ties_symbolic(2 * m - 1))


# ---------------------------------------------------------------- exercise 2


def plugin_pass_at_k_expectation(n: int, k: int) -> sp.Expr:
    """E[1 - (1 - c/n)^k] over c ~ Binomial(n, p): the expectation of the plug-in estimate."""
    return sp.expand(sum(sp.binomial(n, c) * p**c * (1 - p) ** (n - c) * (1 - (1 - sp.Rational(c, n)) ** k)
                         for c in range(n + 1)))


def plugin_bias(n: int, k: int) -> sp.Expr:
    """E[plug-in estimate] - pass@k: zero for k = 1, negative for k >= 2 and 0 < p < 1.

    x -> (1 - x)^k is convex, so by Jensen E[(1 - c/n)^k] >= (1 - p)^k: the plug-in
    estimate is too low on average; the unbiased estimator of Chen et al. corrects it.
    """
    return sp.expand(plugin_pass_at_k_expectation(n, k) - (1 - (1 - p) ** k))


# ---------------------------------------------------------------- exercise 3


def group_weight(num_right: int, group_size: int, normalize_std: bool) -> float:
    """sum_i |A_i| for a group of ``group_size`` 0/1 rewards with ``num_right`` ones.

    This total is how strongly a group pushes on the policy (each response's log-probability
    gradient is scaled by its A_i). Computed with group_normalized_rewards (eps = 0).
    """
    rewards = torch.zeros(group_size, dtype=torch.float64)
    rewards[:num_right] = 1.0
    if 0 < num_right < group_size or not normalize_std:
        adv = group_normalized_rewards(rewards, group_size, normalize_std, eps=0.0)
    else:
        adv = torch.zeros_like(rewards)  # all equal: no signal
    return float(adv.abs().sum())


def group_weight_symbolic(normalize_std: bool) -> sp.Expr:
    """The closed form of :func:`group_weight` in G and the success fraction q = c / G.

    sum |A| = c (1 - q) + (G - c) q = 2 G q (1 - q) without the std; dividing by the sample
    std s = sqrt(G q (1 - q) / (G - 1)) gives 2 sqrt(G (G - 1) q (1 - q)).
    """
    G, q = sp.symbols("G q", positive=True)
    total = 2 * G * q * (1 - q)
    if normalize_std:
        total = total / sp.sqrt(G * q * (1 - q) / (G - 1))
    return sp.simplify(total)


# ---------------------------------------------------------------- exercise 4


def naive_token_weight_ratio(lengths: list[int], micro_batch_size: int) -> Tensor:
    """Per response: (its tokens' weight when micro-batch token means are averaged) / (the
    weight under the batch's token mean). (N,) float64.

    A micro-batch j of b_j responses holding n_j tokens gets weight b_j / N, so each of its
    tokens weighs b_j / (N n_j) instead of 1 / N_tok: the ratio b_j N_tok / (N n_j), the
    batch's mean length over the micro-batch's mean length.
    """
    L = torch.tensor(lengths, dtype=torch.float64)
    N, total = len(lengths), L.sum()
    ratio = torch.empty(N, dtype=torch.float64)
    for start in range(0, N, micro_batch_size):
        chunk = L[start:start + micro_batch_size]
        ratio[start:start + micro_batch_size] = len(chunk) * total / (N * chunk.sum())
    return ratio


def measured_token_weight_ratio(lengths: list[int], micro_batch_size: int) -> Tensor:
    """The same ratio measured with autograd on grpo_loss (advantages 1, ratio 1): (N,)."""
    N, T = len(lengths), max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    adv = torch.ones(N, dtype=torch.float64)
    full = torch.zeros(N, T, dtype=torch.float64, requires_grad=True)
    grpo_loss(full, None, None, adv, mask, 0.2, 0.0, "token_mean").loss.backward()
    naive = torch.zeros(N, T, dtype=torch.float64, requires_grad=True)
    for start in range(0, N, micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        b = len(range(N)[rows])
        (b / N * grpo_loss(naive[rows], None, None, adv[rows], mask[rows], 0.2, 0.0,
                           "token_mean").loss).backward()
    return naive.grad[:, 0] / full.grad[:, 0]


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
