"""Reference solutions to the exercises of notebooks/17_sft_reward_models.

Checked by tests/test_solutions_17.py.
"""

from __future__ import annotations

import sympy as sp
import torch
from torch import Tensor

from llmbook.alignment.logprobs import masked_mean, token_logprobs
from llmbook.alignment.sft import SFTBatch

# ---------------------------------------------------------------- exercise 1


def per_sequence_sft_loss(logits: Tensor, targets: Tensor, loss_mask: Tensor) -> Tensor:
    """The mean over sequences of each sequence's mean response-token loss.

    Every row needs at least one response token. A token of row b weighs 1 / (B n_b).
    """
    nll = -token_logprobs(logits, targets)  # (B, T)
    return masked_mean(nll, loss_mask, dim=1).mean()


def token_weights_symbolic() -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """For two sequences of n1 and n2 response tokens: the weight of one token of sequence 1
    under the per-token mean and under the per-sequence mean, and their difference."""
    n1, n2 = sp.symbols("n_1 n_2", positive=True, integer=True)
    per_token = 1 / (n1 + n2)
    per_sequence = 1 / (2 * n1)
    return per_token, per_sequence, sp.factor(per_sequence - per_token)


# ---------------------------------------------------------------- exercise 2


def bayes_ceiling_vs_scale(abs_deltas: Tensor, scales: Tensor) -> Tensor:
    """The Bayes ceiling mean_i sigma(s |Delta_i|) of pairs with reward gaps ``abs_deltas`` (N,),
    for each labeller scale in ``scales`` (S,): (S,)."""
    return torch.sigmoid(scales[:, None] * abs_deltas[None, :].abs()).mean(dim=1)


def scale_for_pair_accuracy(p: sp.Expr | float) -> sp.Expr:
    """The scale s at which a pair one keyword apart is labelled the right way round with
    probability p: sigma(s) = p, so s = log(p / (1 - p)), the logit of p."""
    s = sp.symbols("s", positive=True)
    (sol,) = sp.solve(sp.Eq(1 / (1 + sp.exp(-s)), sp.nsimplify(p)), s)
    return sp.simplify(sol)


# ---------------------------------------------------------------- exercise 3


def fit_bt_scale(delta_true: Tensor, first_wins: Tensor, iters: int = 30) -> float:
    """Maximum-likelihood a in P(first wins) = sigma(a Delta) from labelled pairs (Newton).

    The log-likelihood l(a) = sum_i [y_i log sigma(a D_i) + (1 - y_i) log sigma(-a D_i)] has
    l'(a) = sum_i D_i (y_i - sigma(a D_i)) and l''(a) = -sum_i D_i^2 sigma(a D_i) sigma(-a D_i) < 0,
    so it is concave and Newton's method from a = 0 converges.
    """
    d, y = delta_true.double(), first_wins.double()
    a = torch.zeros((), dtype=torch.float64)
    for _ in range(iters):
        p = torch.sigmoid(a * d)
        grad = (d * (y - p)).sum()
        hess = -(d * d * p * (1 - p)).sum()
        a = a - grad / hess
    return float(a)


# ---------------------------------------------------------------- exercise 4


def padding_fraction(batch: SFTBatch) -> float:
    """The share of a packed batch's positions that hold padding (example_ids == -1)."""
    if batch.example_ids is None:
        raise ValueError("the batch has no example_ids")
    return float((batch.example_ids < 0).double().mean())


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
