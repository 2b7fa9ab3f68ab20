"""The exercise solutions of notebooks/05_positions hold."""

import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.transformer.positional import (
    RotaryEmbedding,
    rope_permutation,
    sinusoidal_positions,
    sinusoidal_shift_matrix,
)

solutions = load_solutions("05_positions")


def test_exercise_1_sinusoidal_dot_depends_only_on_offset():
    T, d, base = 50, 16, 10000.0
    pe = sinusoidal_positions(T, d, base=base, dtype=torch.float64)
    gram = pe @ pe.T  # (T, T)
    expected = torch.tensor(
        [[solutions.sinusoidal_dot(m - n, d, base) for n in range(T)] for m in range(T)],
        dtype=torch.float64,
    )
    assert torch.allclose(gram, expected, rtol=0, atol=1e-12)
    assert solutions.sinusoidal_dot(0, d) == pytest.approx(d / 2, abs=1e-15)
    assert solutions.sinusoidal_dot(7, d) == pytest.approx(solutions.sinusoidal_dot(-7, d), abs=1e-15)
    # the identity behind it, symbolically
    a, b = sp.symbols("a b", real=True)
    assert sp.simplify(sp.sin(a) * sp.sin(b) + sp.cos(a) * sp.cos(b) - sp.cos(a - b)) == 0


def test_exercise_2_shift_matrix_lstsq_and_conditioning():
    M, cond = solutions.shift_matrix_lstsq(3, 64, 8, base=100.0)
    assert torch.allclose(M, sinusoidal_shift_matrix(3, 8, base=100.0), rtol=0, atol=1e-12)
    assert cond < 10
    M_bad, cond_bad = solutions.shift_matrix_lstsq(3, 256, 16, base=10000.0)
    err_bad = (M_bad - sinusoidal_shift_matrix(3, 16)).abs().max().item()
    assert cond_bad > 1e9  # nearly dependent low-frequency columns
    assert err_bad > 1e-9  # ... and the solution has lost digits accordingly
    assert err_bad < cond_bad * 1e-14 * 100  # but no more than the condition number predicts
    with pytest.raises(ValueError, match="offset must lie"):
        solutions.shift_matrix_lstsq(0, 10, 4)


def test_exercise_3_checkpoint_conversion_preserves_scores():
    g = torch.Generator().manual_seed(0)
    H, dk, d, T = 3, 8, 20, 6
    W = torch.randn(H * dk, d, generator=g, dtype=torch.float64)  # W_q (and W_k) in interleaved layout
    Wk = torch.randn(H * dk, d, generator=g, dtype=torch.float64)
    x = torch.randn(1, T, d, generator=g, dtype=torch.float64)
    pos = torch.tensor([2, 3, 5, 8, 13, 21])
    inter = RotaryEmbedding(dk, max_seq_len=32, interleaved=True, dtype=torch.float64)
    half = RotaryEmbedding(dk, max_seq_len=32, dtype=torch.float64)

    def heads(y):  # (1, T, H d_k) -> (1, H, T, d_k)
        return y.reshape(1, T, H, dk).transpose(1, 2)

    def scores(rope, Wq_, Wk_):
        q, k = rope(heads(x @ Wq_.T), pos), rope(heads(x @ Wk_.T), pos)
        return q @ k.transpose(-1, -2)

    Wq_half = solutions.interleaved_to_half_split(W, H)
    Wk_half = solutions.interleaved_to_half_split(Wk, H)
    assert torch.allclose(scores(half, Wq_half, Wk_half), scores(inter, W, Wk), rtol=0, atol=1e-12)
    # the wrong direction (pi instead of pi^-1) does not preserve the scores
    perm = rope_permutation(dk)
    Wq_wrong = W.reshape(H, dk, d)[:, perm].reshape(H * dk, d)
    Wk_wrong = Wk.reshape(H, dk, d)[:, perm].reshape(H * dk, d)
    assert (scores(half, Wq_wrong, Wk_wrong) - scores(inter, W, Wk)).abs().max() > 1e-3
    # the same reordering as Hugging Face's Llama conversion (view, transpose, reshape)
    hf_style = W.view(H, dk // 2, 2, d).transpose(1, 2).reshape(H * dk, d)
    assert torch.equal(Wq_half, hf_style)
    with pytest.raises(ValueError, match="multiple of n_heads=5"):
        solutions.interleaved_to_half_split(W, 5)


def test_exercise_4_roformer_bound():
    dk = 128
    r = torch.arange(0, 1001)
    bound = solutions.roformer_decay_bound(r, dk)
    assert bound.shape == (1001,)
    assert bound[0].item() == pytest.approx((dk / 2 + 1) / 2, rel=1e-14)
    # direct evaluation at one distance
    theta = 10000.0 ** (-torch.arange(0, dk, 2, dtype=torch.float64) / dk)
    S = [abs(sum(complex(math.cos(500 * t), math.sin(500 * t)) for t in theta[:j].tolist()))
         for j in range(1, dk // 2 + 1)]
    assert bound[500].item() == pytest.approx(sum(S) / (dk // 2), rel=1e-12)
    assert bound[500:].mean() < 0.5 * bound[:20].mean()  # it decays
    # Abel's inequality holds, and the RoPE score is the real part of the bounded sum
    g = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(16, max_seq_len=1200, interleaved=True, dtype=torch.float64)
    for dist in (0, 1, 10, 100, 1000):
        q = torch.randn(16, generator=g, dtype=torch.float64)
        k = torch.randn(16, generator=g, dtype=torch.float64)
        total, b = solutions.abel_bound_holds(q, k, dist)
        assert total <= b + 1e-12
        score = (rope(q.view(1, 1, 1, 16), torch.tensor([dist + 5]))
                 * rope(k.view(1, 1, 1, 16), torch.tensor([5]))).sum().item()
        assert abs(score) <= total + 1e-12


def test_exercise_5_yarn_keeps_fast_pairs_and_interpolates_slow_ones():
    from llmbook.transformer.positional import rope_inverse_frequencies

    d, base, L0, s = 128, 5e5, 8192, 8.0
    r = solutions.pair_rotations(d, base, L0)
    assert r.shape == (64,)
    assert r[0].item() == pytest.approx(L0 / (2 * math.pi), rel=1e-15)  # theta_0 = 1
    assert torch.all(r[1:] < r[:-1])  # slower and slower pairs
    plain, _ = rope_inverse_frequencies(d, base, dtype=torch.float64)
    yarn, factor = rope_inverse_frequencies(
        d, base, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}, dtype=torch.float64)
    ratio = yarn / plain  # (64,)
    assert torch.allclose(ratio[r > 32], torch.ones(int((r > 32).sum()), dtype=torch.float64), rtol=1e-14)
    assert torch.allclose(ratio[r < 1], torch.full((int((r < 1).sum()),), 1 / s, dtype=torch.float64), rtol=1e-14)
    between = (r >= 1) & (r <= 32)
    span = math.log(32) / math.log(base ** (2 / d))  # r_j falls by base^(2/d) per pair: 16.9 pairs
    assert int(between.sum()) in (math.floor(span), math.ceil(span))
    assert factor == pytest.approx(0.1 * math.log(s) + 1)
