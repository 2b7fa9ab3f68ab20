"""Reference solutions to the exercises of notebooks/22_distributed_training.

Checked by tests/test_solutions_22.py.
"""

from __future__ import annotations

import math

import sympy as sp
import torch
from torch import Tensor

from llmbook.scale.collectives import ring_all_reduce_cost_symbolic
from llmbook.scale.tensor_parallel import activation_all_reduce_bytes_symbolic
from llmbook.scale.zero import zero_memory_per_rank_symbolic

# ---------------------------------------------------------------- exercise 1


def halving_doubling_cost_symbolic() -> sp.Expr:
    """Rabenseifner's all-reduce for p = 2^k: reduce-scatter by recursive halving, step i
    (i = 1..k) exchanges n / 2^i bytes with one partner; all-gather by recursive doubling,
    the same sizes in reverse. T = 2 k alpha + 2 (1 - 1/p) n beta."""
    k, i, n, alpha, beta = sp.symbols("k i n alpha beta", positive=True)
    half = sp.summation(alpha + n / 2**i * beta, (i, 1, k))
    p = sp.Symbol("p", positive=True)
    return sp.expand(sp.simplify(2 * half)).subs(k, sp.log(p, 2))


def crossover_bytes(p: int, alpha: float, beta: float) -> float:
    """Message size (bytes) below which halving-doubling beats the ring: they share the
    bandwidth term, so halving-doubling (2 log2 p latencies < 2 (p - 1)) wins at every size
    for p > 2; return inf then, and 0 for p = 2 (the two coincide)."""
    if p < 2 or p & (p - 1):
        raise ValueError(f"p must be a power of two >= 2, got {p}")
    ring = ring_all_reduce_cost_symbolic()["all_reduce"]
    hd = halving_doubling_cost_symbolic()
    syms = {s.name: s for s in (ring.free_symbols | hd.free_symbols)}
    sub = {syms["p"]: p, syms["alpha"]: alpha, syms["beta"]: beta}
    diff = float((ring - hd).subs(sub).subs(syms["n"], 1))  # the n terms cancel
    return math.inf if diff > 1e-12 * alpha else 0.0


# ---------------------------------------------------------------- exercise 2


def largest_model(memory_bytes: float, world_size: int, k: int = 12) -> dict[int, float]:
    """The largest Psi whose ZeRO stage-s state fits in ``memory_bytes`` per rank."""
    f = zero_memory_per_rank_symbolic()
    psi, n, b_w, b_g, kk = sp.symbols("Psi N b_w b_g K", positive=True)
    out = {}
    for stage, expr in f.items():
        per_param = expr.subs({psi: 1, n: world_size, b_w: 2, b_g: 2, kk: k})
        out[stage] = float(memory_bytes / per_param)
    return out


# ---------------------------------------------------------------- exercise 3


def largest_safe_scale(grads: Tensor, dtype: torch.dtype = torch.float16) -> float:
    """The largest power of two S with max |S g| <= the dtype's largest finite number."""
    top = float(grads.abs().max())
    if top == 0 or not math.isfinite(top):
        raise ValueError("need finite gradients, not all zero")
    return 2.0 ** math.floor(math.log2(torch.finfo(dtype).max / top))


def underflow_fraction(grads: Tensor, scale: float, dtype: torch.dtype = torch.float16) -> float:
    """Fraction of the non-zero gradients that become 0 when S g is rounded to ``dtype``."""
    nonzero = grads != 0
    flushed = ((grads * scale).to(dtype) == 0) & nonzero
    return float(flushed.sum() / nonzero.sum())


# ---------------------------------------------------------------- exercise 4


def sequence_parallel_bytes() -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """Per-rank bytes of a ring reduce-scatter, a ring all-gather, and their sum, for an
    activation of B T d elements of b bytes over p ranks.

    A ring reduce-scatter is p - 1 steps, each sending a chunk of BTd/p elements; the
    all-gather is the same p - 1 steps in reverse. Together 2 (p-1)/p BTd b: exactly one ring
    all-reduce, which is itself a reduce-scatter followed by an all-gather.
    """
    B, T, d, p, b = sp.symbols("B T d p b", positive=True, integer=True)
    k = sp.Symbol("k", integer=True)
    chunk = B * T * d / p * b
    reduce_scatter = sp.Sum(chunk, (k, 1, p - 1)).doit()
    all_gather = sp.Sum(chunk, (k, 1, p - 1)).doit()
    total = sp.factor(reduce_scatter + all_gather)
    assert sp.simplify(total - activation_all_reduce_bytes_symbolic()) == 0
    return sp.factor(reduce_scatter), sp.factor(all_gather), total


def block_bytes_sequence_parallel(B: int, T: int, d: int, p: int, bytes_per_element: int = 2) -> int:
    """Bytes one rank sends for one transformer block, forward and backward, with sequence
    parallelism: 4 (reduce-scatter + all-gather) pairs, one per all-reduce they replace."""
    _, _, total = sequence_parallel_bytes()
    subs = {sp.Symbol(n, positive=True, integer=True): v for n, v in
            {"B": B, "T": T, "d": d, "p": p, "b": bytes_per_element}.items()}
    value = 4 * total.subs(subs)
    assert value.is_integer
    return int(value)


# ---------------------------------------------------------------- exercise 5


def interleaved_bubble() -> sp.Expr:
    """Bubble fraction of interleaved 1F1B with v model chunks per rank.

    Each chunk has L/(p v) layers, so its forward takes t_f / v and its backward t_b / v. The
    fill and drain of the pipeline pass through p - 1 ranks one chunk at a time:
    (p-1)(t_f + t_b)/v; the work is still m (t_f + t_b). The bubble is their ratio to the
    makespan, (p - 1)/(v m + p - 1).
    """
    p, m, v, t_f, t_b = sp.symbols("p m v t_f t_b", positive=True)
    idle = (p - 1) * (t_f + t_b) / v
    work = m * (t_f + t_b)
    return sp.simplify(idle / (idle + work))


def smallest_microbatches(num_stages: int, virtual_stages: int, target: float) -> int:
    """The smallest m with bubble (p-1)/(v m + p - 1) below ``target``."""
    expr = interleaved_bubble()
    p, m, v = sp.symbols("p m v", positive=True)
    f = sp.lambdify(m, expr.subs({p: num_stages, v: virtual_stages}))
    count = 1
    while not f(count) < target:
        count += 1
    return count


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
