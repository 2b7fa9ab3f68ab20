"""Checks of chapter 22b's exercises (notebooks/22b_context_parallelism), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's Ulysses volume for multi-head attention
(:func:`llmbook.scale.context_parallel.context_parallel_bytes_symbolic`), the saving
1 - H_kv / H, and the causal work T (T + 1) / 2 counted by hand and split over the ranks.
"""

from __future__ import annotations

import sympy as sp

from llmbook.scale.context_parallel import context_parallel_bytes_symbolic
from llmbook.workbench.checks import raises


def exercise_1_gqa_ulysses_reduces_to_mha_and_saves(solutions) -> None:
    sol = solutions.ulysses_gqa_bytes()
    B, H, H_kv, T, d, p, b = sp.symbols("B H H_kv T d p b", positive=True, integer=True)
    mha, want = sol["bytes"].subs(H_kv, H), context_parallel_bytes_symbolic()["ulysses"]
    assert sp.simplify(mha - want) == 0, f"expected Ulysses' multi-head volume {want} at H_kv = H, got {mha}"
    saving = sol["saving"].subs({H: 32, H_kv: 8})
    assert saving == sp.Rational(3, 8), f"expected a saving of 3/8 at H = 32, H_kv = 8, got {saving}"
    assert sol["max_p"] == H_kv, f"expected at most H_kv ranks, got {sol['max_p']}"


def exercise_2_striped_is_nearly_balanced(solutions) -> None:
    got = solutions.striped_work_per_rank(8, 2)
    assert got == [16, 20], f"expected the work [1+3+5+7, 2+4+6+8] = [16, 20] for T = 8, p = 2, got {got!r}"
    for T, p in ((64, 4), (48, 3), (96, 8)):
        work = solutions.striped_work_per_rank(T, p)
        assert sum(work) == T * (T + 1) // 2, (
            f"expected the work to add up to T (T + 1)/2 = {T * (T + 1) // 2} for T = {T}, p = {p}, got {work!r}")
        spread = work[-1] - work[0]
        assert spread == (p - 1) * T // p, (
            f"expected the last rank to do (p - 1) T / p = {(p - 1) * T // p} more than the first "
            f"(T = {T}, p = {p}), got {spread}")
        imb = solutions.imbalances(T, p)
        assert imb["zigzag"] == 1.0, f"expected zigzag to be balanced (1.0) at T = {T}, p = {p}, got {imb['zigzag']!r}"
        assert 1.0 < imb["striped"] < imb["contiguous"], (
            f"expected striped's imbalance above 1 and below contiguous's at T = {T}, p = {p}, got {imb}")
    with raises(ValueError, match="multiple", what="striped_work_per_rank(10, 3)"):
        solutions.striped_work_per_rank(10, 3)
