"""Reference solutions to the exercises of notebooks/21_mixture_of_experts.

Checked by tests/test_solutions_21.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy as sp
import torch
from torch import Tensor

from llmbook.scale.moe import (
    MoELayer,
    expected_drop_fraction,
    expert_capacity,
    route,
    update_expert_bias,
)

# ---------------------------------------------------------------- exercise 1


def smallest_capacity_factor(num_tokens: int, num_experts: int, top_k: int, max_drop: float = 0.01,
                             step: float = 0.01) -> float:
    """The smallest capacity factor on a grid of ``step`` (from 1) whose expected dropped
    fraction under uniform routing is below ``max_drop``.

    It grows with N: each expert's mean load n k / N shrinks, and the binomial's relative
    fluctuation sqrt((1 - p) / (n p)) with p = k / N grows, so a larger share of slack is
    needed to absorb it.
    """
    i = 0
    while True:
        cf = round(1 + i * step, 10)
        cap = expert_capacity(num_tokens, num_experts, top_k, cf)
        if expected_drop_fraction(num_tokens, num_experts, top_k, cap) < max_drop:
            return cf
        i += 1


# ---------------------------------------------------------------- exercise 2


def collapsed_switch_loss() -> sp.Expr:
    """The Switch loss (alpha N sum f_i P_i, k = 1) when every token goes to one of m experts
    (uniformly among them) with probability 1: f_i = P_i = 1/m on those m experts, 0 elsewhere,
    so alpha N m / m^2 = alpha N / m."""
    alpha, N, m = sp.symbols("alpha N m", positive=True)
    i = sp.Symbol("i", integer=True)
    return sp.simplify(alpha * N * sp.summation((1 / m) * (1 / m), (i, 1, m)))


def collapsed_logits(num_experts: int, m: int, tokens_per_expert: int = 3, big: float = 60.0) -> Tensor:
    """float64 logits that send ``tokens_per_expert`` tokens to each of the first m experts
    with probability 1 - O(e^-big)."""
    rows = []
    for e in range(m):
        for _ in range(tokens_per_expert):
            z = torch.zeros(num_experts, dtype=torch.float64)
            z[e] = big
            rows.append(z)
    return torch.stack(rows)


# ---------------------------------------------------------------- exercise 3


def fine_grained_counts(num_experts: int, top_k: int, d_model: int, d_ff: int, m: int) -> dict[str, int]:
    """Routed-expert parameters (total and active per token) and the number of expert
    combinations per token, for N experts of width f split into m N experts of width f/m
    with top m k routing; counted on an actual :class:`MoELayer`."""
    if d_ff % m:
        raise ValueError(f"d_ff={d_ff} is not divisible by m={m}")
    layer = MoELayer(d_model, d_ff // m, num_experts * m, top_k * m)
    expert_params = sum(p.numel() for p in layer.experts.parameters())
    return {"expert_parameters": expert_params,
            "active_expert_parameters": expert_params * layer.top_k // layer.num_experts,
            "combinations": math.comb(num_experts * m, top_k * m)}


# ---------------------------------------------------------------- exercise 4


def balance_with_bias(logits_fn: Callable[[int], Tensor], top_k: int, rate: float, steps: int,
                      ) -> tuple[Tensor, list[float], list[tuple[Tensor, Tensor]]]:
    """Auxiliary-loss-free balancing with sigmoid scores (DeepSeek-V3).

    ``logits_fn(step)`` returns a batch of router logits (n, N). Each step routes with the
    current bias, records the busiest expert's share, and updates the bias. Returns the final
    bias, the shares, and (logits, routing weights) of every batch for checking the gates.
    """
    bias = None
    shares: list[float] = []
    seen: list[tuple[Tensor, Tensor]] = []
    for step in range(steps):
        z = logits_fn(step)
        if bias is None:
            bias = torch.zeros(z.shape[1], dtype=z.dtype)
        r = route(z, top_k, score="sigmoid", bias=bias)
        counts = torch.bincount(r.indices.reshape(-1), minlength=z.shape[1])
        shares.append(float(counts.max()) / r.indices.numel())
        seen.append((z, r))
        bias = update_expert_bias(bias, counts, rate)
    return bias, shares, seen


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
