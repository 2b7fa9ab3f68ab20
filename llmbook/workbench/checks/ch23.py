"""Checks of chapter 23's exercises (notebooks/23_beyond_attention), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the book's causal linear attention (the limit gamma = 1), its sequential
linear recurrence (:func:`llmbook.scale.ssm.linear_recurrence`), the operation counts of
the work-efficient and the Hillis-Steele scans, and the bilinear transform's series and
scalar closed form in SymPy.
"""

from __future__ import annotations

import sympy as sp
import torch

from llmbook.scale.linear_attention import causal_linear_attention_parallel
from llmbook.scale.ssm import linear_recurrence
from llmbook.workbench.checks import raises

f64 = torch.float64


def _randn(*shape: int, seed: int) -> torch.Tensor:
    """Standard normal float64 numbers of ``shape``, the same on every run."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


def exercise_1_decayed_linear_attention(solutions) -> None:
    mask = solutions.decay_mask(3, 0.5).tolist()
    assert mask == [[1, 0, 0], [0.5, 1, 0], [0.25, 0.5, 1]], (
        f"expected decay_mask(3, 0.5) = [[1, 0, 0], [0.5, 1, 0], [0.25, 0.5, 1]], got {mask}")
    q, k, v = _randn(2, 12, 4, seed=1), _randn(2, 12, 4, seed=2), _randn(2, 12, 3, seed=3)
    for gamma in (0.3, 0.9):
        par = solutions.decayed_linear_attention_parallel(q, k, v, gamma)
        rec = solutions.decayed_linear_attention_recurrent(q, k, v, gamma)
        assert torch.allclose(par, rec, atol=1e-13), (
            f"expected the parallel and the recurrent form to agree at gamma = {gamma} (to 1e-13), "
            f"largest difference {float((par - rec).abs().max()):.3g}")
        assert not torch.allclose(par, causal_linear_attention_parallel(q, k, v)), (
            f"expected the decay gamma = {gamma} to change the output of causal linear attention")
    rec = solutions.decayed_linear_attention_recurrent(q, k, v, 1.0)
    plain = causal_linear_attention_parallel(q, k, v)
    assert torch.allclose(rec, plain, atol=1e-13), (
        f"expected gamma = 1 to give the book's causal linear attention (to 1e-13), "
        f"largest difference {float((rec - plain).abs().max()):.3g}")
    with raises(ValueError, match="gamma", what="decayed_linear_attention_parallel with gamma = 1.5"):
        solutions.decayed_linear_attention_parallel(q, k, v, 1.5)


def exercise_2_blelloch_scan(solutions) -> None:
    for T in (1, 2, 5, 8, 13, 16):
        a = torch.rand(T, 3, generator=torch.Generator().manual_seed(T), dtype=f64) + 0.2
        b = _randn(T, 3, seed=T)
        h, combines = solutions.blelloch_scan(a, b)
        want = linear_recurrence(a, b, dim=0)
        assert torch.allclose(h, want, atol=1e-13), (
            f"expected the scan to give the sequential recurrence at T = {T} (to 1e-13), "
            f"largest difference {float((h - want).abs().max()):.3g}")
        n = 1 << max(T - 1, 0).bit_length()
        assert combines == 2 * (n - 1), (
            f"expected 2 (n - 1) = {2 * (n - 1)} combines at T = {T} (padded to n = {n}), got {combines!r}")
        if T == n and T > 1:
            log = T.bit_length() - 1
            hillis = solutions.hillis_steele_combines(T)
            assert hillis == T * log - T + 1, (
                f"expected T log2 T - T + 1 = {T * log - T + 1} Hillis-Steele combines at T = {T}, got {hillis!r}")
            assert combines < hillis or T <= 4, (
                f"expected fewer combines than Hillis-Steele's {hillis} at T = {T}, got {combines!r}")


def exercise_3_bilinear(solutions) -> None:
    dA, dB = solutions.bilinear_minus_zoh_series()
    a, b = sp.symbols("a b")
    delta = sp.Symbol("Delta", positive=True)
    assert sp.simplify(dA - a**3 * delta**3 / 12) == 0, f"expected a^3 Delta^3 / 12 for A, got {dA}"
    assert sp.simplify(dB - a**2 * b * delta**3 / 12) == 0, f"expected a^2 b Delta^3 / 12 for B, got {dB}"
    A = _randn(3, 3, seed=4) - 2.5 * torch.eye(3, dtype=f64)
    B, C = _randn(3, seed=5), _randn(3, seed=6)
    Ab, Bb = solutions.bilinear_discretize(A, B, 0.1)
    a0, b0 = -2.0, 1.5  # scalar case against the closed form
    Ab1, Bb1 = solutions.bilinear_discretize(torch.tensor([[a0]], dtype=f64), torch.tensor([b0], dtype=f64), 0.2)
    got_a, want_a = float(Ab1), (1 + 0.1 * a0) / (1 - 0.1 * a0)
    assert abs(got_a - want_a) < 1e-15, (
        f"expected A_bar = (1 + a Delta / 2) / (1 - a Delta / 2) = {want_a!r} for a = -2, Delta = 0.2, got {got_a!r}")
    got_b, want_b = float(Bb1), 0.2 * b0 / (1 - 0.1 * a0)
    assert abs(got_b - want_b) < 1e-15, (
        f"expected B_bar = Delta b / (1 - a Delta / 2) = {want_b!r} for a = -2, b = 1.5, Delta = 0.2, got {got_b!r}")
    assert Ab.shape == (3, 3) and Bb.shape == (3,), (
        f"expected shapes (3, 3) and (3,), got {tuple(Ab.shape)} and {tuple(Bb.shape)}")
    small, large = solutions.kernel_gap(A, B, C, 0.01, 50), solutions.kernel_gap(A, B, C, 0.5, 50)
    assert small < 1e-5 < large, (
        f"expected the kernel gap below 1e-5 at Delta = 0.01 and above it at Delta = 0.5, got {small!r} and {large!r}")
