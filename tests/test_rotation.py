"""Tests for llmbook.inference.rotation: Hadamard matrices against SciPy, kurtosis against
SciPy, the rotation's invariance and its bound on the largest coordinate."""

from __future__ import annotations

import pytest
import scipy.linalg
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.rotation import block_hadamard, hadamard, hadamard_rotate, kurtosis

f64 = torch.float64


def test_hadamard_equals_scipy_and_is_orthogonal():
    for n in (1, 2, 8, 64):
        h = hadamard(n)
        ref = torch.from_numpy(scipy.linalg.hadamard(n)).to(f64) / n**0.5
        assert torch.equal(h, ref)
        torch.testing.assert_close(h @ h.T, torch.eye(n, dtype=f64), atol=1e-14, rtol=0)
    assert (hadamard(4) * 2).tolist() == [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]


def test_block_hadamard_structure():
    q = block_hadamard(12, 4)
    assert q.shape == (12, 12)
    torch.testing.assert_close(q @ q.T, torch.eye(12, dtype=f64), atol=1e-14, rtol=0)
    assert torch.equal(q[4:8, 4:8], hadamard(4)) and q[:4, 4:].abs().sum() == 0


@given(rows=st.integers(1, 6), blocks=st.integers(1, 4), out=st.integers(1, 5), seed=st.integers(0, 10**6))
@settings(max_examples=30, deadline=None)
def test_rotation_keeps_products_and_bounds_outliers(rows, blocks, out, seed):
    g = torch.Generator().manual_seed(seed)
    d = 8 * blocks
    x = torch.randn(rows, d, generator=g, dtype=f64)
    x[:, 0] *= 1000  # an outlier channel
    w = torch.randn(out, d, generator=g, dtype=f64)
    q = block_hadamard(d, 8)
    torch.testing.assert_close(hadamard_rotate(x, 8), x @ q, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(hadamard_rotate(x, 8) @ hadamard_rotate(w, 8).T, x @ w.T, rtol=1e-12, atol=1e-9)
    block_norms = x.reshape(rows, blocks, 8).norm(dim=-1)  # (rows, blocks)
    rotated = (x @ q).reshape(rows, blocks, 8).abs().amax(-1)
    assert (rotated <= block_norms * (1 + 1e-12)).all()  # Cauchy-Schwarz
    assert (x @ q).abs().max() < x.abs().max()


def test_kurtosis_equals_scipy():
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0), dtype=f64)
    x[1, 3] = 40.0
    ref = scipy.stats.kurtosis(x.numpy(), axis=-1, fisher=False, bias=True)
    torch.testing.assert_close(kurtosis(x), torch.from_numpy(ref), rtol=1e-12, atol=0)
    assert kurtosis(torch.tensor([-1.0, 1.0], dtype=f64)).item() == 1.0


def test_bad_input():
    with pytest.raises(ValueError, match="power of two"):
        hadamard(12)
    with pytest.raises(ValueError, match="divide"):
        block_hadamard(10, 4)
    with pytest.raises(ValueError, match="divide"):
        hadamard_rotate(torch.zeros(3, 10), 4)
    with pytest.raises(ValueError, match="^n must be positive"):
        hadamard(0)
    with pytest.raises(ValueError, match="variance"):
        kurtosis(torch.ones(2, 3))
    with pytest.raises(TypeError, match="floating-point"):
        kurtosis(torch.arange(4))
