"""The exercise solutions of notebooks/22b_context_parallelism hold."""

import pytest
import sympy as sp
from solution_loader import load_solutions

from llmbook.scale.context_parallel import context_parallel_bytes_symbolic

solutions = load_solutions("22b_context_parallelism")


def test_exercise_1_gqa_ulysses_reduces_to_mha_and_saves():
    sol = solutions.ulysses_gqa_bytes()
    B, H, H_kv, T, d, p, b = sp.symbols("B H H_kv T d p b", positive=True, integer=True)
    assert sp.simplify(sol["bytes"].subs(H_kv, H) - context_parallel_bytes_symbolic()["ulysses"]) == 0
    assert sol["saving"].subs({H: 32, H_kv: 8}) == sp.Rational(3, 8)
    assert sol["max_p"] == H_kv


def test_exercise_2_striped_is_nearly_balanced():
    assert solutions.striped_work_per_rank(8, 2) == [16, 20]  # (1+3+5+7), (2+4+6+8)
    for T, p in ((64, 4), (48, 3), (96, 8)):
        work = solutions.striped_work_per_rank(T, p)
        assert sum(work) == T * (T + 1) // 2
        assert work[-1] - work[0] == (p - 1) * T // p
        imb = solutions.imbalances(T, p)
        assert imb["zigzag"] == 1.0
        assert 1.0 < imb["striped"] < imb["contiguous"]
    with pytest.raises(ValueError, match="multiple"):
        solutions.striped_work_per_rank(10, 3)
