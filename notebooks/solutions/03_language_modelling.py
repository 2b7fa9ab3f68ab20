"""Reference solutions to the exercises of notebooks/03_language_modelling.

Checked by tests/test_solutions_03.py.
"""

from __future__ import annotations

import numpy as np
import sympy as sp
import torch

from llmbook.text.data import MarkovSource
from llmbook.text.functional import log_softmax


def shift_gradient_symbolic(v: int = 3) -> tuple[list[sp.Expr], list[sp.Expr]]:
    """Exercise 1: the gradient of ``m(z) + log sum_j exp(z_j - m(z))`` for an arbitrary m.

    ``m`` is an undefined SymPy function of all ``v`` logits, so the raw derivatives contain
    ``Derivative(m, z_i)``. Returns ``(gradient, softmax)``, two lists of ``v`` expressions;
    ``gradient[i] - softmax[i]`` simplifies to 0: the terms in dm/dz_i cancel, which is why
    :func:`llmbook.text.functional.logsumexp` may detach its shift.
    """
    z = sp.symbols(f"z1:{v + 1}", real=True)
    m = sp.Function("m")(*z)
    lse = m + sp.log(sum(sp.exp(zj - m) for zj in z))
    gradient = [sp.diff(lse, zi) for zi in z]
    denom = sum(sp.exp(zj) for zj in z)
    return gradient, [sp.exp(zi) / denom for zi in z]


def logsumexp_attached(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exercise 1: log-sum-exp shifted by a max that is *not* detached: ``(..., V) -> (...)``.

    Autograd then also differentiates through ``amax`` (whose gradient is split evenly
    between tied maxima); the two contributions of the shift cancel, so the gradient is
    still ``softmax(logits)``, up to round-off.
    """
    m = logits.amax(dim=dim, keepdim=True)  # (..., 1), gradient flows through it
    return (m + torch.log(torch.exp(logits - m).sum(dim=dim, keepdim=True))).squeeze(dim)


def label_smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 epsilon: float) -> torch.Tensor:
    """Exercise 2: cross-entropy against the target ``(1 - eps) y + eps / V``.

    ``logits`` is ``(..., V)``, ``targets`` is ``(...)``. Equals
    ``(1 - eps) * CE + eps * mean_i(-log p_i)`` averaged over positions, which is what
    ``torch.nn.functional.cross_entropy(..., label_smoothing=eps)`` computes.
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    logp = log_softmax(logits, dim=-1)  # (..., V)
    nll = -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (...)
    uniform = -logp.mean(dim=-1)  # (...)
    return ((1.0 - epsilon) * nll + epsilon * uniform).mean()


def ngram_limit(source: MarkovSource, order: int) -> float:
    """Exercise 3: the cross-entropy an order-``n`` model reaches with unlimited data.

    With infinite data the n-gram estimate becomes the true conditional
    ``P(x_t | x_{t-n+1..t-1})`` of the stationary chain, so its cross-entropy is the
    conditional entropy ``H(X_t | n - 1 previous tokens) = H(n-block) - H((n-1)-block)``
    of the stationary block distributions. For ``n - 1 >= k`` it is the entropy rate.
    """
    k, v = source.order, source.vocab_size
    if order - 1 >= k:
        return source.entropy_rate()
    joint = (source.stationary[:, None] * source.transition).numpy()  # (V**k, V)
    joint = joint.reshape((v,) * (k + 1))  # P(x_{t-k}, ..., x_t)
    block = joint.sum(axis=tuple(range(k + 1 - order)))  # P(last `order` tokens)
    context = block.sum(axis=-1)  # P(the order - 1 tokens before x_t)

    def entropy(p: np.ndarray) -> float:
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())

    return entropy(block) - entropy(context)


def cross_entropy_decomposition() -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """Exercise 4: ``H(q, p) = H(q) + KL(q || p)`` for two distributions on 3 outcomes.

    Returns ``(cross_entropy, entropy, kl)`` as SymPy expressions in q1, q2, p1, p2 (the
    third probability of each is one minus the others).
    """
    q1, q2, p1, p2 = sp.symbols("q1 q2 p1 p2", positive=True)
    q = [q1, q2, 1 - q1 - q2]
    p = [p1, p2, 1 - p1 - p2]
    cross = -sum(qi * sp.log(pi) for qi, pi in zip(q, p, strict=True))
    entropy = -sum(qi * sp.log(qi) for qi in q)
    kl = sum(qi * sp.log(qi / pi) for qi, pi in zip(q, p, strict=True))
    return cross, entropy, kl


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
