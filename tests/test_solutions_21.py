"""The exercise solutions of notebooks/21_mixture_of_experts hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.scale.moe import expected_drop_fraction, expert_capacity, load_balancing_loss

solutions = load_solutions("21_mixture_of_experts")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_smallest_capacity_factor_grows_with_experts():
    cfs = [solutions.smallest_capacity_factor(4096, n, 2) for n in (8, 64, 256)]
    assert cfs[0] < cfs[1] < cfs[2]
    for n, cf in zip((8, 64, 256), cfs, strict=True):
        assert expected_drop_fraction(4096, n, 2, expert_capacity(4096, n, 2, cf)) < 0.01
        below = round(cf - 0.01, 10)
        assert below < 1 or expected_drop_fraction(4096, n, 2, expert_capacity(4096, n, 2, below)) >= 0.01


def test_exercise_2_collapse_onto_m_experts():
    alpha, N, m = sp.symbols("alpha N m", positive=True)
    assert sp.simplify(solutions.collapsed_switch_loss() - alpha * N / m) == 0
    for n_experts, k in ((8, 1), (8, 2), (8, 8), (6, 3)):
        z = solutions.collapsed_logits(n_experts, k)
        assert float(load_balancing_loss(z, 1, alpha=0.5)) == pytest.approx(0.5 * n_experts / k, abs=1e-12)


def test_exercise_3_fine_grained_experts_keep_parameters():
    counts = [solutions.fine_grained_counts(16, 2, 32, 64, m) for m in (1, 2, 4)]
    assert len({c["expert_parameters"] for c in counts}) == 1
    assert len({c["active_expert_parameters"] for c in counts}) == 1
    assert [c["combinations"] for c in counts] == [math.comb(16, 2), math.comb(32, 4), math.comb(64, 8)]
    assert counts[0]["combinations"] == 120
    with pytest.raises(ValueError, match="divisible"):
        solutions.fine_grained_counts(16, 2, 32, 63, 2)


def test_exercise_4_bias_balancing_with_sigmoid_scores():
    skew = torch.linspace(1.5, -1.5, 8, dtype=torch.float64)

    def logits(step):
        return torch.randn(1024, 8, generator=torch.Generator().manual_seed(step), dtype=torch.float64) + skew

    bias, shares, seen = solutions.balance_with_bias(logits, 2, 0.01, 300)
    assert shares[0] > 2 / 8
    assert sum(shares[-50:]) / 50 < 1.2 / 8
    assert bias[0] < 0 < bias[-1]
    for z, r in seen[::50]:
        s = torch.sigmoid(z).gather(1, r.indices)
        torch.testing.assert_close(r.weights, s / s.sum(-1, keepdim=True), rtol=0, atol=1e-15)
