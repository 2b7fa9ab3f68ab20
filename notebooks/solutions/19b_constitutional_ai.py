"""Reference solutions to the exercises of notebooks/19b_constitutional_ai.

Checked by tests/test_solutions_19b.py.
"""

from __future__ import annotations

import sympy as sp

from llmbook.alignment.ai_feedback import ai_label_probability_symbolic

# ---------------------------------------------------------------- exercise 1


def consistency_probability() -> tuple[sp.Expr, tuple[sp.Symbol, sp.Symbol]]:
    """P(the two orders of a pair pick the same text), under 19b.3's judge model, and its
    symbols ``(b, pt)``.

    In order (a, b) the judge picks a with probability b + (1 - b) pt (the first slot by
    bias, or a on the merits, pt = eps + (1 - 2 eps) p); in order (b, a) it picks a with
    probability (1 - b) pt (a is now in the second slot, which bias never picks). The two
    verdicts are independent, so P(same text) = P(a, a) + P(b, b).
    """
    b, pt = sp.symbols("b ptilde", real=True)
    pick_a_first = b + (1 - b) * pt
    pick_a_second = (1 - b) * pt
    same = pick_a_first * pick_a_second + (1 - pick_a_first) * (1 - pick_a_second)
    return sp.expand(same), (b, pt)


def bias_from_consistency(rate: float) -> float:
    """b estimated from the measured rate of consistent verdicts of an uninformative judge:
    (1 - b^2)/2 = rate, so b = sqrt(1 - 2 rate) (rate in [0, 1/2])."""
    if not 0 <= rate <= 0.5:
        raise ValueError(f"an uninformative judge is consistent at most half the time, got rate={rate}")
    return (1 - 2 * rate) ** 0.5


# ---------------------------------------------------------------- exercise 2


def label_information() -> tuple[sp.Expr, sp.Expr]:
    """(Fisher information about Delta at a tie in one AI label, the same for one true
    label), SymPy expressions in s, epsilon, b.

    I = q'(0)^2 / (q(0)(1 - q(0))): the information a Bernoulli(q(Delta)) draw holds about
    Delta. q(0) = 1/2 for every b and eps (the judge model is symmetric at a tie).
    """
    out = ai_label_probability_symbolic()
    s, d, eps, b = out["symbols"]
    q = out["q"]
    q0 = sp.simplify(q.subs(d, 0))
    slope = sp.diff(q, d).subs(d, 0)
    info = sp.simplify(slope**2 / (q0 * (1 - q0)))
    return info, sp.simplify(info.subs({eps: 0, b: 0}))


def labels_per_true_label(agreement: float, bias: float = 0.0) -> float:
    """How many AI labels hold the information of one true label, for a judge that agrees
    with the true labeller with probability ``agreement`` (so eps = 1 - agreement) and
    picks the first slot with probability ``bias``: 1 / ((1 - b)(1 - 2 eps))^2."""
    eps = 1 - agreement
    return 1 / ((1 - bias) * (1 - 2 * eps)) ** 2
