"""The exercise solutions of notebooks/23_beyond_attention hold."""

import pytest
import sympy as sp
import torch
from seeded import randn
from solution_loader import load_solutions

from llmbook.scale.linear_attention import causal_linear_attention_parallel
from llmbook.scale.ssm import linear_recurrence

solutions = load_solutions("23_beyond_attention")

f64 = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")


def test_exercise_1_decayed_linear_attention():
    assert solutions.decay_mask(3, 0.5).tolist() == [[1, 0, 0], [0.5, 1, 0], [0.25, 0.5, 1]]
    q, k, v = randn(2, 12, 4, seed=1), randn(2, 12, 4, seed=2), randn(2, 12, 3, seed=3)
    for gamma in (0.3, 0.9):
        par = solutions.decayed_linear_attention_parallel(q, k, v, gamma)
        assert torch.allclose(par, solutions.decayed_linear_attention_recurrent(q, k, v, gamma), atol=1e-13)
        assert not torch.allclose(par, causal_linear_attention_parallel(q, k, v))
    assert torch.allclose(solutions.decayed_linear_attention_recurrent(q, k, v, 1.0),
                          causal_linear_attention_parallel(q, k, v), atol=1e-13)
    with pytest.raises(ValueError, match="gamma"):
        solutions.decayed_linear_attention_parallel(q, k, v, 1.5)


@pytest.mark.parametrize("T", [1, 2, 5, 8, 13, 16])
def test_exercise_2_blelloch_scan(T):
    a, b = torch.rand(T, 3, generator=torch.Generator().manual_seed(T), dtype=f64) + 0.2, randn(T, 3, seed=T)
    h, combines = solutions.blelloch_scan(a, b)
    assert torch.allclose(h, linear_recurrence(a, b, dim=0), atol=1e-13)
    n = 1 << max(T - 1, 0).bit_length()
    assert combines == 2 * (n - 1)
    if T == n and T > 1:
        log = T.bit_length() - 1
        assert solutions.hillis_steele_combines(T) == T * log - T + 1
        assert combines < solutions.hillis_steele_combines(T) or T <= 4


def test_exercise_3_bilinear():
    dA, dB = solutions.bilinear_minus_zoh_series()
    a, b = sp.symbols("a b")
    delta = sp.Symbol("Delta", positive=True)
    assert sp.simplify(dA - a**3 * delta**3 / 12) == 0
    assert sp.simplify(dB - a**2 * b * delta**3 / 12) == 0
    A = randn(3, 3, seed=4) - 2.5 * torch.eye(3, dtype=f64)
    B, C = randn(3, seed=5), randn(3, seed=6)
    Ab, Bb = solutions.bilinear_discretize(A, B, 0.1)
    a0, b0 = -2.0, 1.5  # scalar case against the closed form
    Ab1, Bb1 = solutions.bilinear_discretize(torch.tensor([[a0]], dtype=f64), torch.tensor([b0], dtype=f64), 0.2)
    assert abs(float(Ab1) - (1 + 0.1 * a0) / (1 - 0.1 * a0)) < 1e-15
    assert abs(float(Bb1) - 0.2 * b0 / (1 - 0.1 * a0)) < 1e-15
    assert Ab.shape == (3, 3) and Bb.shape == (3,)
    small, large = solutions.kernel_gap(A, B, C, 0.01, 50), solutions.kernel_gap(A, B, C, 0.5, 50)
    assert small < 1e-5 < large
