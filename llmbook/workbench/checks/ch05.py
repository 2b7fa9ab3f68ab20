"""Checks of chapter 5's exercises (notebooks/05_positions), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's positional encodings (:mod:`llmbook.transformer.positional`: the
sinusoidal table and shift matrix, RoPE in both layouts, YaRN's frequencies), Hugging
Face's Llama weight reordering (view, transpose, reshape), SymPy and a direct sum.
"""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.transformer.positional import (
    RotaryEmbedding,
    rope_permutation,
    sinusoidal_positions,
    sinusoidal_shift_matrix,
)
from llmbook.workbench.checks import approx, raises


def exercise_1_sinusoidal_dot_depends_only_on_offset(solutions) -> None:
    T, d, base = 50, 16, 10000.0
    pe = sinusoidal_positions(T, d, base=base, dtype=torch.float64)
    gram = pe @ pe.T  # (T, T)
    expected = torch.tensor(
        [[solutions.sinusoidal_dot(m - n, d, base) for n in range(T)] for m in range(T)],
        dtype=torch.float64,
    )
    error = (gram - expected).abs().max().item()
    assert torch.allclose(gram, expected, rtol=0, atol=1e-12), (
        f"expected sinusoidal_dot(m - n) to be the dot product of the table's rows m and n (to 1e-12), "
        f"largest difference {error:.3g}")
    at_zero = solutions.sinusoidal_dot(0, d)
    assert approx(at_zero, d / 2, abs=1e-15), f"expected sinusoidal_dot(0, 16) = 8 (d / 2), got {at_zero!r}"
    ahead, behind = solutions.sinusoidal_dot(7, d), solutions.sinusoidal_dot(-7, d)
    assert approx(ahead, behind, abs=1e-15), (
        f"expected the same value at offsets 7 and -7, got {ahead!r} and {behind!r}")
    # the identity behind it, symbolically
    a, b = sp.symbols("a b", real=True)
    assert sp.simplify(sp.sin(a) * sp.sin(b) + sp.cos(a) * sp.cos(b) - sp.cos(a - b)) == 0


def exercise_2_shift_matrix_lstsq_and_conditioning(solutions) -> None:
    M, cond = solutions.shift_matrix_lstsq(3, 64, 8, base=100.0)
    error = (M - sinusoidal_shift_matrix(3, 8, base=100.0)).abs().max().item()
    assert torch.allclose(M, sinusoidal_shift_matrix(3, 8, base=100.0), rtol=0, atol=1e-12), (
        f"expected the least-squares matrix to be the exact shift matrix (to 1e-12) for base 100, d = 8; "
        f"largest difference {error:.3g}")
    assert cond < 10, f"expected a well-conditioned problem (condition number < 10) for base 100, got {cond!r}"
    M_bad, cond_bad = solutions.shift_matrix_lstsq(3, 256, 16, base=10000.0)
    err_bad = (M_bad - sinusoidal_shift_matrix(3, 16)).abs().max().item()
    assert cond_bad > 1e9, (  # nearly dependent low-frequency columns
        f"expected a condition number above 1e9 for base 10000, d = 16, got {cond_bad!r}")
    assert err_bad > 1e-9, (  # ... and the solution has lost digits accordingly
        f"expected the ill-conditioned solution to be off by more than 1e-9, got {err_bad!r}")
    assert err_bad < cond_bad * 1e-14 * 100, (  # but no more than the condition number predicts
        f"expected an error below cond * 1e-12 = {cond_bad * 1e-12:.3g}, got {err_bad!r}")
    with raises(ValueError, match="offset must lie", what="shift_matrix_lstsq(0, 10, 4)"):
        solutions.shift_matrix_lstsq(0, 10, 4)


def exercise_3_checkpoint_conversion_preserves_scores(solutions) -> None:
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
    converted, original = scores(half, Wq_half, Wk_half), scores(inter, W, Wk)
    error = (converted - original).abs().max().item()
    assert torch.allclose(converted, original, rtol=0, atol=1e-12), (
        f"expected the converted weights under half-split RoPE to give the interleaved scores (to 1e-12), "
        f"largest difference {error:.3g}")
    # the wrong direction (pi instead of pi^-1) does not preserve the scores
    perm = rope_permutation(dk)
    Wq_wrong = W.reshape(H, dk, d)[:, perm].reshape(H * dk, d)
    Wk_wrong = Wk.reshape(H, dk, d)[:, perm].reshape(H * dk, d)
    off = (scores(half, Wq_wrong, Wk_wrong) - original).abs().max().item()
    assert off > 1e-3, f"the wrong permutation should change the scores, but moved them by {off:.3g}"
    # the same reordering as Hugging Face's Llama conversion (view, transpose, reshape)
    hf_style = W.view(H, dk // 2, 2, d).transpose(1, 2).reshape(H * dk, d)
    assert torch.equal(Wq_half, hf_style), (
        "expected exactly the rows of Hugging Face's Llama conversion (view, transpose, reshape)")
    with raises(ValueError, match="multiple of n_heads=5", what="interleaved_to_half_split(W, 5) with 24 rows"):
        solutions.interleaved_to_half_split(W, 5)


def exercise_4_roformer_bound(solutions) -> None:
    dk = 128
    r = torch.arange(0, 1001)
    bound = solutions.roformer_decay_bound(r, dk)
    shape = tuple(bound.shape)
    assert shape == (1001,), f"expected shape (1001,) for 1001 distances, got {shape}"
    at_zero, want = bound[0].item(), (dk / 2 + 1) / 2
    assert approx(at_zero, want, rel=1e-14), f"expected (d_k/2 + 1) / 2 = {want} at distance 0, got {at_zero!r}"
    # direct evaluation at one distance
    theta = 10000.0 ** (-torch.arange(0, dk, 2, dtype=torch.float64) / dk)
    S = [abs(sum(complex(math.cos(500 * t), math.sin(500 * t)) for t in theta[:j].tolist()))
         for j in range(1, dk // 2 + 1)]
    at_500, want = bound[500].item(), sum(S) / (dk // 2)
    assert approx(at_500, want, rel=1e-12), (
        f"expected the directly summed bound {want!r} at distance 500 (to 1e-12 relative), got {at_500!r}")
    far, near = bound[500:].mean().item(), bound[:20].mean().item()
    assert far < 0.5 * near, (  # it decays
        f"expected the mean bound over distances 500-1000 below half that over 0-19 ({near:.4g}), got {far:.4g}")
    # Abel's inequality holds, and the RoPE score is the real part of the bounded sum
    g = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(16, max_seq_len=1200, interleaved=True, dtype=torch.float64)
    for dist in (0, 1, 10, 100, 1000):
        q = torch.randn(16, generator=g, dtype=torch.float64)
        k = torch.randn(16, generator=g, dtype=torch.float64)
        total, b = solutions.abel_bound_holds(q, k, dist)
        assert total <= b + 1e-12, f"at distance {dist} the sum {total!r} exceeds Abel's bound {b!r}"
        score = (rope(q.view(1, 1, 1, 16), torch.tensor([dist + 5]))
                 * rope(k.view(1, 1, 1, 16), torch.tensor([5]))).sum().item()
        assert abs(score) <= total + 1e-12, (
            f"at distance {dist} the RoPE score {score!r} exceeds the modulus of the sum, {total!r}")


def exercise_5_yarn_keeps_fast_pairs_and_interpolates_slow_ones(solutions) -> None:
    from llmbook.transformer.positional import rope_inverse_frequencies

    d, base, L0, s = 128, 5e5, 8192, 8.0
    r = solutions.pair_rotations(d, base, L0)
    shape = tuple(r.shape)
    assert shape == (64,), f"expected one count per pair, shape (64,), got {shape}"
    first, want = r[0].item(), L0 / (2 * math.pi)
    assert approx(first, want, rel=1e-15), (  # theta_0 = 1
        f"expected pair 0 (theta = 1) to make L / (2 pi) = {want!r} turns, got {first!r}")
    assert torch.all(r[1:] < r[:-1]), "expected fewer turns for each slower pair"
    plain, _ = rope_inverse_frequencies(d, base, dtype=torch.float64)
    yarn, factor = rope_inverse_frequencies(
        d, base, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0}, dtype=torch.float64)
    ratio = yarn / plain  # (64,)
    assert torch.allclose(ratio[r > 32], torch.ones(int((r > 32).sum()), dtype=torch.float64), rtol=1e-14), (
        "expected YaRN to keep the frequencies of the pairs with r > 32")
    assert torch.allclose(ratio[r < 1], torch.full((int((r < 1).sum()),), 1 / s, dtype=torch.float64),
                          rtol=1e-14), "expected YaRN to divide the frequencies of the pairs with r < 1 by 8"
    between = int(((r >= 1) & (r <= 32)).sum())
    span = math.log(32) / math.log(base ** (2 / d))  # r_j falls by base^(2/d) per pair: 16.9 pairs
    assert between in (math.floor(span), math.ceil(span)), (
        f"expected {math.floor(span)} or {math.ceil(span)} pairs with 1 <= r <= 32, got {between}")
    want = 0.1 * math.log(s) + 1
    assert approx(factor, want), f"expected YaRN's attention factor 0.1 ln 8 + 1 = {want!r}, got {factor!r}"
