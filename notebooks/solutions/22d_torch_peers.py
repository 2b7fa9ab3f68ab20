"""Reference solutions to the exercises of notebooks/22d_torch_peers.

Checked by tests/test_solutions_22d.py.
"""

from __future__ import annotations

import copy

import sympy as sp
import torch.nn.functional as F
from torch import Tensor, nn

# ---------------------------------------------------------------- exercise 1


def greedy_partition(sizes: list[int], world_size: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer's partition: indices of the parameters each rank owns, the
    parameters taken largest first, each to the rank holding the fewest elements so far
    (ties to the lowest rank)."""
    owned: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(sizes)), key=lambda j: -sizes[j]):
        r = min(range(world_size), key=lambda k: load[k])
        owned[r].append(i)
        load[r] += sizes[i]
    return owned


def elements_per_rank(sizes: list[int], world_size: int) -> list[int]:
    """How many elements each rank's optimizer states cover under :func:`greedy_partition`."""
    return [sum(sizes[i] for i in part) for part in greedy_partition(sizes, world_size)]


# ---------------------------------------------------------------- exercise 2


def accumulated_gradient(model: nn.Module, x: Tensor, y: Tensor, sizes: list[int]) -> list[Tensor]:
    """Gradients of mean squared error accumulated over micro-batches of the given sizes,
    then divided by their number (PyTorch's scale_grads=True)."""
    model = copy.deepcopy(model)
    for xs, ys in zip(x.split(sizes), y.split(sizes), strict=True):
        F.mse_loss(model(xs), ys).backward()
    return [p.grad / len(sizes) for p in model.parameters()]


def full_batch_gradient(model: nn.Module, x: Tensor, y: Tensor) -> list[Tensor]:
    """Gradients of the whole batch's mean squared error."""
    model = copy.deepcopy(model)
    F.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]


# ---------------------------------------------------------------- exercise 3


def sharded_peak_bytes() -> sp.Expr:
    """Bytes per rank while one unit runs its backward: float32 master shards (4), Adam's m
    and v (8) and float32 gradient shards (4) for L P / N parameters, plus one gathered unit
    in bfloat16 (2 P) and its full bfloat16 gradient (2 P)."""
    L, P, N = sp.symbols("L P N", positive=True)
    return 16 * L * P / N + 4 * P


def smallest_units(world_size: int, share: float = 0.1) -> int:
    """Smallest L for which the gathered unit and its gradient are under ``share`` of the peak."""
    L, P, N = sp.symbols("L P N", positive=True)
    fraction = sp.simplify(4 * P / sharded_peak_bytes()).subs(N, world_size)
    share = sp.Rational(str(share))  # exact: 4/40 is not under one tenth
    count = 1
    while not fraction.subs(L, count) < share:
        count += 1
    return count


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
