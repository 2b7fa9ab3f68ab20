"""Hadamard rotations that spread outlier channels before quantisation (QuaRot).

Ashkboos et al. (2024), "QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs": for an
orthogonal Q, x W^T = (x Q)(W Q)^T, so a layer may be computed from rotated inputs and
rotated weights with the same result. With Q a normalised Hadamard matrix, every rotated
coordinate is a ±1/sqrt(n) combination of all n inputs: a channel far larger than the rest
is shared out among all of them, and |(x Q)_j| <= ||x||_2 (Cauchy-Schwarz), whatever
the outlier. The quantiser then sees values of similar size.

:func:`hadamard` builds Sylvester's Hadamard matrix (n a power of two), :func:`block_hadamard`
a block-diagonal rotation for widths that are not (576 = 9 x 64 in SmolLM2; QuaRot itself
uses Hadamard matrices of sizes 12 * 2^k and others), :func:`hadamard_rotate` applies it
block by block without forming the (d, d) matrix, and :func:`kurtosis` measures how
heavy-tailed a set of values is (3 for a normal distribution). Introduced in
notebooks/15_quantisation (section 15.17).
"""

from __future__ import annotations

import torch
from torch import Tensor

from llmbook.validation import check_floating_tensor, check_positive_int

__all__ = ["block_hadamard", "hadamard", "hadamard_rotate", "kurtosis"]


def hadamard(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Sylvester's Hadamard matrix of order n (a power of two), divided by sqrt(n) so that it
    is orthogonal: H H^T = I, entries ±1/sqrt(n). Shape (n, n); H_2k = [[H_k, H_k], [H_k, -H_k]]."""
    n = check_positive_int("n", n)
    if n & (n - 1):
        raise ValueError(f"n must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / h.shape[0] ** 0.5


def block_hadamard(d: int, block_size: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """The (d, d) block-diagonal orthogonal matrix with ``hadamard(block_size)`` on its diagonal;
    ``block_size`` (a power of two) must divide d. x @ block_hadamard(d, B) mixes each run of B
    consecutive channels among themselves."""
    d, block_size = check_positive_int("d", d), check_positive_int("block_size", block_size)
    if d % block_size:
        raise ValueError(f"block_size={block_size} must divide d={d}")
    return torch.block_diag(*[hadamard(block_size, dtype)] * (d // block_size))


def hadamard_rotate(x: Tensor, block_size: int) -> Tensor:
    """x @ block_hadamard(d, block_size) for x (..., d), computed per block of ``block_size``
    channels: (..., d / B, B) @ hadamard(B), d / B times cheaper than the dense product.
    Apply it to the inputs and to the rows of the weight, x W^T = (x Q)(W Q)^T."""
    x = check_floating_tensor(x, "x")
    block_size = check_positive_int("block_size", block_size)
    if x.ndim == 0 or x.shape[-1] % block_size:
        raise ValueError(f"block_size={block_size} must divide the last dimension of x, "
                         f"shape {tuple(x.shape)}")
    h = hadamard(block_size, x.dtype)  # (B, B)
    return (x.reshape(*x.shape[:-1], -1, block_size) @ h).reshape(x.shape)


def kurtosis(x: Tensor, dim: int = -1) -> Tensor:
    """E[(x - mean)^4] / Var(x)^2 along ``dim`` (population moments): 3 for a normal
    distribution, 1.8 for a uniform one, large when a few values dominate."""
    x = check_floating_tensor(x, "x")
    centred = x - x.mean(dim, keepdim=True)
    var = (centred**2).mean(dim)
    if bool((var == 0).any()):
        raise ValueError("x has a slice with zero variance: its kurtosis is undefined")
    return (centred**4).mean(dim) / var**2
