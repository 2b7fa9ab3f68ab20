"""Tests for llmbook.inference.minifloat: FP8/FP4 grids and rounding against torch's dtypes,
MX block scaling against ggml's MXFP4 (the gguf package)."""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.minifloat import (
    E2M1,
    E4M3,
    E5M2,
    FloatFormat,
    dequantize_mx,
    float_grid,
    quantize_mx,
    round_to_float,
)

PEERS = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}


def torch_grid(dtype: torch.dtype) -> torch.Tensor:
    """Every non-negative finite value of a torch 8-bit float, from its 256 bit patterns."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).double()
    values = values[torch.isfinite(values) & (values >= 0)]
    return torch.unique(values)  # sorted; +0 and -0 merge


def test_worked_examples():
    assert (E4M3.max_value, E5M2.max_value, E2M1.max_value) == (448.0, 57344.0, 6.0)
    assert (E4M3.min_subnormal, E5M2.min_subnormal, E2M1.min_subnormal) == (2.0**-9, 2.0**-16, 0.5)
    assert (E4M3.min_normal, E5M2.min_normal) == (2.0**-6, 2.0**-14)
    assert float_grid(E2M1).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert round_to_float(torch.tensor([0.25, 0.75, 2.5, 5.0, 7.0, -100.0]), E2M1).tolist() == \
        [0.0, 1.0, 2.0, 4.0, 6.0, -6.0]  # ties to even: 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_grid_and_limits_equal_torch(fmt):
    dtype = PEERS[fmt]
    assert torch.equal(float_grid(fmt), torch_grid(dtype))
    info = torch.finfo(dtype)
    assert (fmt.max_value, fmt.min_normal, 2.0**-fmt.man_bits) == (info.max, info.smallest_normal, info.eps)


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_rounding_equals_torch_cast_on_grid_midpoints_and_random(fmt):
    grid = float_grid(fmt).float()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([mids, torch.nextafter(mids, torch.zeros_like(mids)),
                      torch.nextafter(mids, torch.full_like(mids, float("inf")))])
    g = torch.Generator().manual_seed(0)
    wide = torch.exp2(torch.rand(20000, generator=g) * 40 - 22) * torch.randn(20000, generator=g).sign()
    x = torch.cat([grid, -grid, near, -near, wide, torch.tensor([fmt.max_value * 1.05, 1e9, -1e9])])
    saturate = fmt is E4M3  # torch saturates e4m3fn on the CPU, overflows e5m2 to inf
    ours = round_to_float(x, fmt, saturate=saturate)
    peer = x.to(PEERS[fmt]).float()
    assert torch.equal(ours, peer)


@given(st.lists(st.floats(-1e5, 1e5, allow_nan=False, width=32), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_rounding_properties(values):
    x = torch.tensor(values, dtype=torch.float64)
    for fmt in (E4M3, E5M2, E2M1):
        r = round_to_float(x, fmt)
        grid = float_grid(fmt)
        assert torch.isin(r.abs(), grid).all()  # lands on the grid
        nearest = (x.abs().clamp(max=fmt.max_value)[:, None] - grid).abs().min(1).values
        assert torch.allclose((r.abs() - x.abs().clamp(max=fmt.max_value)).abs(), nearest)


def test_overflow_and_nan():
    x = torch.tensor([61439.0, 61440.0, float("nan")])
    assert round_to_float(x, E5M2, saturate=False)[:2].tolist() == [57344.0, float("inf")]
    assert round_to_float(x, E5M2)[:2].tolist() == [57344.0, 57344.0]
    assert torch.isnan(round_to_float(x, E4M3)[2])


def test_mx_equals_ggml_mxfp4():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(12, 96, generator=g) * torch.exp2(torch.randint(-6, 6, (12, 1), generator=g))).float()
    x[0, :32] = 0  # an all-zero block
    x[1, 5] = 40.0  # an outlier that sets its block's scale
    x[2, :4] = torch.tensor([1.5, 3.5, 7.0, 8.0])  # scale 2 (from 8): 0.75, 1.75, 3.5 are E2M1 ties
    k, el = quantize_mx(x, ties="toward_zero")
    assert k.shape == (12, 3) and el.shape == (12, 96)
    assert torch.isin(el.abs(), float_grid(E2M1)).all()
    ours = dequantize_mx(k, el)
    peer = gguf.quants.dequantize(gguf.quants.quantize(x.numpy(), GGMLQuantizationType.MXFP4),
                                  GGMLQuantizationType.MXFP4)
    np.testing.assert_array_equal(ours.float().numpy(), peer)
    even = dequantize_mx(*quantize_mx(x))  # ties to even differ exactly at those ties
    assert (even != ours).nonzero().tolist() == [[2, 0], [2, 1], [2, 2]]
    assert even[2, :3].tolist() == [2.0, 4.0, 8.0] and ours[2, :3].tolist() == [1.0, 3.0, 6.0]


def test_mx_scale_is_floor_log2_minus_emax():
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, 0], x[0, 1] = 5.0, 0.3  # max 5: k = floor(log2 5) - 2 = 0
    k, el = quantize_mx(x)
    assert k.tolist() == [[0]] and el[0, :2].tolist() == [4.0, 0.5]  # 5 -> 4 (tie to even), 0.3 -> 0.5
    k8, _ = quantize_mx(x, E4M3)
    assert k8.tolist() == [[2 - 8]]


def test_bad_input():
    with pytest.raises(ValueError, match="fmt"):
        float_grid(FloatFormat(4, 3, "other"))
    with pytest.raises(TypeError, match="floating-point"):
        round_to_float(torch.arange(3), E4M3)
    with pytest.raises(ValueError, match="ties"):
        round_to_float(torch.zeros(2), E4M3, ties="up")
    with pytest.raises(ValueError, match="block_size"):
        quantize_mx(torch.zeros(2, 30))
    with pytest.raises(ValueError, match="match"):
        dequantize_mx(torch.zeros(2, 1, dtype=torch.int32), torch.zeros(2, 64))
