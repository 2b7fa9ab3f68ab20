"""Checks of chapter 21's exercises (notebooks/21_mixture_of_experts), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's expected drop fraction and expert capacity and its Switch
load-balancing loss (:mod:`llmbook.scale.moe`), the collapsed loss alpha N / m written
here in SymPy, ``math.comb`` for the routing combinations, and the renormalised sigmoid
scores of the chosen experts.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.scale.moe import expected_drop_fraction, expert_capacity, load_balancing_loss
from llmbook.workbench.checks import raises


def exercise_1_smallest_capacity_factor_grows_with_experts(solutions) -> None:
    experts = (8, 64, 256)
    cfs = [solutions.smallest_capacity_factor(4096, n, 2) for n in experts]
    assert cfs[0] < cfs[1] < cfs[2], f"expected the capacity factor to grow with {experts} experts, got {cfs}"
    for n, cf in zip(experts, cfs, strict=True):
        dropped = expected_drop_fraction(4096, n, 2, expert_capacity(4096, n, 2, cf))
        assert dropped < 0.01, (
            f"expected fewer than 1% of tokens dropped at capacity factor {cf} ({n} experts), got {dropped!r}")
        below = round(cf - 0.01, 10)
        assert below < 1 or expected_drop_fraction(4096, n, 2, expert_capacity(4096, n, 2, below)) >= 0.01, (
            f"expected capacity factor {below} (0.01 less than {cf}, {n} experts) to drop at least 1% of "
            f"tokens, that is {cf} to be the smallest")


def exercise_2_collapse_onto_m_experts(solutions) -> None:
    alpha, N, m = sp.symbols("alpha N m", positive=True)
    loss = solutions.collapsed_switch_loss()
    assert sp.simplify(loss - alpha * N / m) == 0, f"expected the collapsed loss alpha N / m, got {loss}"
    for n_experts, k in ((8, 1), (8, 2), (8, 8), (6, 3)):
        z = solutions.collapsed_logits(n_experts, k)
        got, want = float(load_balancing_loss(z, 1, alpha=0.5)), 0.5 * n_experts / k
        assert abs(got - want) <= 1e-12, (
            f"expected the loss of collapsed_logits({n_experts}, {k}) to be 0.5 x {n_experts} / {k} "
            f"(to 1e-12), got {got!r}")


def exercise_3_fine_grained_experts_keep_parameters(solutions) -> None:
    counts = [solutions.fine_grained_counts(16, 2, 32, 64, m) for m in (1, 2, 4)]
    totals = [c["expert_parameters"] for c in counts]
    assert len(set(totals)) == 1, f"expected the same expert parameters for m = 1, 2, 4, got {totals}"
    active = [c["active_expert_parameters"] for c in counts]
    assert len(set(active)) == 1, f"expected the same active expert parameters for m = 1, 2, 4, got {active}"
    got = [c["combinations"] for c in counts]
    want = [math.comb(16, 2), math.comb(32, 4), math.comb(64, 8)]
    assert got == want, f"expected C(16, 2), C(32, 4), C(64, 8) = {want} combinations, got {got}"
    assert got[0] == 120, f"expected 120 combinations at m = 1, got {got[0]}"
    with raises(ValueError, match="divisible", what="fine_grained_counts(16, 2, 32, 63, 2)"):
        solutions.fine_grained_counts(16, 2, 32, 63, 2)


def exercise_4_bias_balancing_with_sigmoid_scores(solutions) -> None:
    skew = torch.linspace(1.5, -1.5, 8, dtype=torch.float64)

    def logits(step):
        return torch.randn(1024, 8, generator=torch.Generator().manual_seed(step), dtype=torch.float64) + skew

    bias, shares, seen = solutions.balance_with_bias(logits, 2, 0.01, 300)
    assert shares[0] > 2 / 8, f"expected the favoured expert's first share above 2/8, got {shares[0]!r}"
    late = sum(shares[-50:]) / 50
    assert late < 1.2 / 8, f"expected its mean share over the last 50 steps below 1.2/8, got {late!r}"
    first, last = float(bias[0]), float(bias[-1])
    assert first < 0 < last, (
        f"expected a negative bias on the favoured expert and a positive one on the least favoured, "
        f"got {first!r} and {last!r}")
    for z, r in seen[::50]:
        s = torch.sigmoid(z).gather(1, r.indices)
        torch.testing.assert_close(
            r.weights, s / s.sum(-1, keepdim=True), rtol=0, atol=1e-15,
            msg=lambda m: f"expected the weights to be the chosen experts' sigmoid scores, renormalised: {m}")
