"""Seeded tensors for the tests: the same numbers on every run (``from seeded import gen``)."""

from __future__ import annotations

import torch


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Standard normal numbers of ``shape`` (float64 unless ``dtype``) from ``gen(seed)``."""
    return torch.randn(shape, generator=gen(seed), dtype=dtype)
