"""Tests for llmbook.inference.quant: uniform quantisers, int8 matmul, QuantLinear, NF4."""

import math

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from llmbook.inference.quant import (
    QuantizedTensor,
    QuantLinear,
    accumulator_overflow_length,
    dequantize,
    fake_quantize,
    int8_matmul,
    int8_matmul_decomposed,
    nf4_levels,
    nf4_offset,
    quantize_absmax,
    quantize_nf4,
    quantize_zeropoint,
    roofline,
    stored_bits_per_weight,
)

f64 = torch.float64

# QLoRA's NF4 table as published (Dettmers et al., 2023, Appendix E; bitsandbytes).
NF4_PUBLISHED = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- worked examples


def test_absmax_worked_example():
    x = torch.tensor([-1.0, -0.5, 0.0, 0.26, 1.27], dtype=f64)
    qt = quantize_absmax(x, 8)
    assert qt.scale.item() == pytest.approx(0.01)
    assert qt.q.tolist() == [-100, -50, 0, 26, 127]
    assert qt.zero.item() == 0 and qt.layout == "tensor" and qt.q.dtype == torch.int32
    torch.testing.assert_close(dequantize(qt), x, atol=1e-12, rtol=0)


def test_zeropoint_worked_example():
    x = torch.tensor([[-1.0, 0.0, 2.0, 0.5]], dtype=f64)
    qt = quantize_zeropoint(x, 2)  # 3 steps over [-1, 2]: Δ = 1, z = 1
    assert qt.scale.item() == 1.0 and qt.zero.item() == 1.0
    assert qt.q.tolist() == [[0, 1, 3, 1]]  # 0.5 / 1 rounds half to even: 0
    assert dequantize(qt).tolist() == [[-1.0, 0.0, 2.0, 0.0]]


def test_zeropoint_range_contains_zero():
    x = torch.tensor([2.0, 3.0, 5.0], dtype=f64)  # all positive: range is [0, 5]
    qt = quantize_zeropoint(x, 4)
    assert qt.zero.item() == 0 and qt.scale.item() == pytest.approx(5 / 15)
    assert dequantize(quantize_zeropoint(torch.zeros(3, dtype=f64), 4)).abs().max() == 0


def test_per_channel_and_group_layouts_non_square():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(6, 12, generator=g, dtype=f64)
    per_row = quantize_absmax(W, 4, dim=0)
    assert per_row.scale.shape == (6, 1)
    torch.testing.assert_close(per_row.scale[:, 0], W.abs().amax(1) / 7)
    per_col = quantize_absmax(W, 4, dim=1)
    assert per_col.scale.shape == (1, 12)
    grouped = quantize_zeropoint(W, 4, group_size=4)
    assert grouped.scale.shape == (6, 3, 1) and grouped.q.shape == (6, 12)
    # a group's statistics only see that group
    torch.testing.assert_close(dequantize(grouped)[:, 4:8],
                               fake_quantize(W[:, 4:8].contiguous(), 4, dim=0))


def test_finer_blocks_give_smaller_error():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(32, 64, generator=g, dtype=f64) * torch.logspace(-1, 1, 32, dtype=f64)[:, None]
    err = {name: float(((fake_quantize(W, 4, **kw) - W) ** 2).mean())
           for name, kw in [("tensor", {}), ("channel", {"dim": 0}), ("group", {"group_size": 16})]}
    assert err["group"] < err["channel"] < err["tensor"]


def test_rounding_error_is_delta_squared_over_12():
    e, d = sp.symbols("e Delta", positive=True)
    density = 1 / d
    assert sp.integrate(e * density, (e, -d / 2, d / 2)) == 0
    assert sp.simplify(sp.integrate(e**2 * density, (e, -d / 2, d / 2)) - d**2 / 12) == 0
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200_000, generator=g, dtype=f64) * 2 - 1
    qt = quantize_absmax(x, 6)
    ratio = float(((dequantize(qt) - x) ** 2).mean() / (qt.scale**2 / 12))
    assert ratio == pytest.approx(1.0, abs=0.02)


# ---------------------------------------------------------------- error bound (property)

shapes = st.tuples(st.integers(1, 5), st.sampled_from([4, 8, 12]))


@settings(max_examples=40, deadline=None)
@given(shape=shapes, bits=st.integers(2, 8), seed=st.integers(0, 10_000),
       kind=st.sampled_from(["absmax", "zeropoint"]),
       layout=st.sampled_from(["tensor", "row", "col", "group"]),
       offset=st.floats(-3, 3), spread=st.floats(1e-3, 1e3))
def test_error_at_most_half_a_step(shape, bits, seed, kind, layout, offset, spread):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=f64) + offset) * spread
    kw = {"tensor": {}, "row": {"dim": 0}, "col": {"dim": -1}, "group": {"group_size": 4}}[layout]
    qt = (quantize_absmax if kind == "absmax" else quantize_zeropoint)(x, bits, **kw)
    levels = 2 ** (bits - 1) - 1 if kind == "absmax" else 2**bits - 1
    assert int(qt.q.min()) >= (-levels if kind == "absmax" else 0)
    assert int(qt.q.max()) <= levels
    err = (dequantize(qt) - x).abs()
    if layout == "group":
        bound = (qt.scale / 2).expand(*x.shape[:-1], x.shape[-1] // 4, 4).reshape(x.shape)
    else:
        bound = (qt.scale / 2).expand(x.shape)
    assert bool((err <= bound * (1 + 1e-9) + 1e-12).all())


# ---------------------------------------------------------------- integer matmul


def test_accumulator_overflow_length():
    assert accumulator_overflow_length(16, 8) == 3  # 2 * 127² = 32258 fits, 3 * 127² does not
    assert accumulator_overflow_length(32, 8) == 133_145
    assert accumulator_overflow_length(16, 4) == 32767 // 49 + 1
    with pytest.raises(ValueError, match="acc_bits"):
        accumulator_overflow_length(1)


def test_int8_matmul_equals_float_product_of_dequantised():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(7, 300, generator=g, dtype=f64)
    B = torch.randn(5, 300, generator=g, dtype=f64)
    aq, bq = quantize_absmax(A, 8, dim=0), quantize_absmax(B, 8, dim=0)
    y = int8_matmul(aq, bq)
    assert y.shape == (7, 5)
    torch.testing.assert_close(y, dequantize(aq) @ dequantize(bq).T, atol=1e-12, rtol=1e-12)
    exact = aq.q.to(torch.int64) @ bq.q.to(torch.int64).T  # integer part, exact
    torch.testing.assert_close(y / (aq.scale * bq.scale.T), exact.to(f64), atol=1e-9, rtol=0)
    # per-tensor scales too
    y2 = int8_matmul(quantize_absmax(A, 8), quantize_absmax(B, 8))
    torch.testing.assert_close(y2, dequantize(quantize_absmax(A, 8)) @ dequantize(quantize_absmax(B, 8)).T)


def test_int16_accumulator_overflows_int32_does_not():
    A = torch.full((1, 8), 1.0, dtype=f64)
    aq = quantize_absmax(A, 8)  # every code 127
    y32 = int8_matmul(aq, aq, acc_bits=32)
    y16 = int8_matmul(aq, aq, acc_bits=16)
    assert y32.item() == pytest.approx(8.0)
    assert y16.item() != pytest.approx(8.0)  # 8 * 16129 = 129032 wraps in int16
    assert round(y16.item() / float(aq.scale) ** 2) == ((8 * 16129 + 32768) % 65536) - 32768
    two = quantize_absmax(torch.ones(1, 2, dtype=f64), 8)
    assert int8_matmul(two, two, acc_bits=16).item() == pytest.approx(2.0)


def test_int8_matmul_validation():
    a = quantize_absmax(torch.randn(3, 4), 8, dim=0)
    with pytest.raises(ValueError, match="inner dimensions"):
        int8_matmul(a, quantize_absmax(torch.randn(3, 5), 8, dim=0))
    with pytest.raises(ValueError, match="symmetric"):
        int8_matmul(a, quantize_zeropoint(torch.tensor([[-1.0, 2.0, 3.0, 4.0]] * 3), 8, dim=0))
    with pytest.raises(ValueError, match="per row"):
        int8_matmul(a, quantize_absmax(torch.randn(3, 4), 8, group_size=2))
    with pytest.raises(ValueError, match="acc_bits"):
        int8_matmul(a, a, acc_bits=8)
    with pytest.raises(TypeError, match="QuantizedTensor"):
        int8_matmul(torch.randn(3, 4), a)


def test_quant_linear_weight_only_and_w8a8():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(12, 5, dtype=f64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(5, 12, generator=g, dtype=f64))
    x = torch.randn(2, 3, 12, generator=g, dtype=f64)
    ql = QuantLinear.from_linear(lin, 8)
    w_hat = dequantize(ql.weight_q)
    torch.testing.assert_close(ql(x), x @ w_hat.T + lin.bias)
    assert (w_hat - lin.weight).abs().max() <= ql.weight_q.scale.max() / 2 + 1e-12
    q8 = QuantLinear.from_linear(lin, 8, act_bits=8)
    y = q8(x)
    assert y.shape == (2, 3, 5)
    xq = dequantize(quantize_absmax(x.reshape(6, 12), 8, dim=0)).reshape(2, 3, 12)
    torch.testing.assert_close(y, xq @ w_hat.T + lin.bias, atol=1e-12, rtol=1e-12)
    assert (y - lin(x)).abs().max() < 0.05 * lin(x).abs().max()
    grouped = QuantLinear.from_linear(lin, 4, group_size=4, symmetric=False)
    torch.testing.assert_close(grouped(x), x @ fake_quantize(lin.weight.detach(), 4, group_size=4).T
                               + lin.bias)
    with pytest.raises(ValueError, match="symmetric"):
        QuantLinear.from_linear(lin, 4, group_size=4, act_bits=8)
    with pytest.raises(ValueError, match="d_in=12"):
        ql(torch.randn(2, 5, dtype=f64))


# ---------------------------------------------------------------- NF4


def test_nf4_levels_equal_published_table():
    levels = nf4_levels()
    assert levels.shape == (16,)
    torch.testing.assert_close(levels, torch.tensor(NF4_PUBLISHED, dtype=f64), atol=1e-4, rtol=0)
    assert float((levels - torch.tensor(NF4_PUBLISHED, dtype=f64)).abs().max()) < 1e-6
    assert nf4_offset() == pytest.approx(0.9677083, abs=1e-7)
    assert int((levels > 0).sum()) == 8 and int((levels < 0).sum()) == 7 and 0.0 in levels.tolist()


def test_nf4_uses_ndtri_equivalently():
    p = torch.linspace(nf4_offset(), 0.5, 9, dtype=f64)[:-1]
    q = torch.special.ndtri(p)
    torch.testing.assert_close(nf4_levels()[8:], torch.sort(q / q.max()).values)


def test_quantize_nf4_snaps_to_levels_and_beats_uniform_on_gaussians():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g, dtype=f64)
    xq = quantize_nf4(x, 64)
    amax = x.abs().amax(-1, keepdim=True)
    codes = xq / amax
    dist = (codes[..., None] - nf4_levels()).abs().min(-1).values
    assert float(dist.max()) < 1e-12
    mse_nf4 = float(((xq - x) ** 2).mean())
    mse_int4 = float(((fake_quantize(x, 4, group_size=64, symmetric=True) - x) ** 2).mean())
    assert mse_nf4 < mse_int4


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs,match", [
    ({"bits": 1}, "bits must be an int in 2..8"),
    ({"bits": 9}, "bits must be an int in 2..8"),
    ({"bits": 4.0}, "bits"),
    ({"bits": 4, "group_size": 5}, "group_size=5 must divide"),
    ({"bits": 4, "group_size": 0}, "positive int"),
    ({"bits": 4, "dim": 2}, "dim must be"),
    ({"bits": 4, "dim": 0, "group_size": 4}, "not both"),
])
def test_bad_arguments(kwargs, match):
    x = torch.randn(3, 8)
    for fn in (quantize_absmax, quantize_zeropoint):
        with pytest.raises(ValueError, match=match):
            fn(x, **kwargs)


def test_bad_inputs():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_absmax(torch.arange(4), 8)
    with pytest.raises(ValueError, match="NaN"):
        quantize_absmax(torch.tensor([1.0, float("nan")]), 8)
    with pytest.raises(ValueError, match="shape"):
        quantize_zeropoint(torch.tensor(1.0), 8)
    with pytest.raises(TypeError, match="QuantizedTensor"):
        dequantize(torch.zeros(3))
    assert isinstance(quantize_absmax(torch.ones(2), 8), QuantizedTensor)


# ---------------------------------------------------------------- roofline


def test_stored_bits_per_weight_worked_examples():
    assert stored_bits_per_weight(None) == 16.0  # float16
    assert stored_bits_per_weight(4) == 4.0  # per-row scale left out
    assert stored_bits_per_weight(4, 128) == 4 + 20 / 128 == 4.15625
    assert stored_bits_per_weight(3, 32) == 3 + 19 / 32
    assert stored_bits_per_weight(8, 64, scale_bits=32) == 8 + 40 / 64
    assert 16 / stored_bits_per_weight(4, 128) == pytest.approx(3.8496, abs=1e-4)
    for bad, name in (({"bits": 0}, "bits"), ({"bits": 4, "group_size": 0}, "group_size"),
                      ({"bits": 4, "scale_bits": 0}, "scale_bits"), ({"bits": 4.0}, "bits")):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            stored_bits_per_weight(**bad)


def test_stored_bits_zero_bits_equals_ggml_block_sizes():
    """zero_bits=0 (symmetric, fp16 scale) and 16 (fp16 minimum) give the sizes that ggml's own
    package publishes for its 32-weight blocks: Q4_0/Q5_0/Q8_0 and Q4_1/Q5_1 (ggml-common.h)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, bits, zero_bits in (("Q4_0", 4, 0), ("Q5_0", 5, 0), ("Q8_0", 8, 0),
                                  ("Q4_1", 4, 16), ("Q5_1", 5, 16)):
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert stored_bits_per_weight(bits, block, zero_bits=zero_bits) * block / 8 == size, name
    assert stored_bits_per_weight(4, 32, zero_bits=None) == stored_bits_per_weight(4, 32)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="zero_bits"):
            stored_bits_per_weight(4, 32, zero_bits=bad)


@given(bits=st.integers(2, 8), group=st.integers(1, 64), rows=st.integers(1, 5))
@settings(max_examples=30, deadline=None)
def test_stored_bits_counts_the_tensors_a_quantiser_returns(bits, group, rows):
    """Counting the elements of q, scale and zero that quantize_zeropoint stores gives the formula."""
    qt = quantize_zeropoint(torch.randn(rows, 2 * group, dtype=torch.float64), bits, group_size=group)
    counted = (bits * qt.q.numel() + 16 * qt.scale.numel() + bits * qt.zero.numel()) / qt.q.numel()
    assert counted == pytest.approx(stored_bits_per_weight(bits, group), rel=1e-12)


def test_stored_bits_agrees_with_model_memory_bytes():
    """The per-weight accounting of the roofline is the one of model_memory_bytes."""
    from llmbook.inference.gptq import model_memory_bytes
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    cfg = TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=1, n_heads=2,
                                       max_seq_len=8)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    n_lin = sum(m.weight.numel() for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and n.startswith("blocks."))
    other = model.num_parameters() - n_lin
    expected = n_lin * stored_bits_per_weight(4, 16) / 8 + 2 * other
    assert model_memory_bytes(model, 4, 16) == math.ceil(expected)


def test_roofline_worked_example_and_regimes():
    r = roofline(flops=2e9, bytes_moved=1e9, peak_flops=100e12, bandwidth=2e12)
    assert r["intensity"] == 2.0 and r["balance"] == 50.0
    assert r["time"] == pytest.approx(1e9 / 2e12) and r["bound"] == "memory"
    c = roofline(flops=1e12, bytes_moved=1e9, peak_flops=100e12, bandwidth=2e12)
    assert c["bound"] == "compute" and c["time"] == pytest.approx(1e12 / 100e12)
    with pytest.raises(ValueError, match="bandwidth"):
        roofline(1.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="flops"):
        roofline(True, 1.0, 1.0, 1.0)


# ---------------------------------------------------------------- LLM.int8() decomposition


def test_int8_decomposed_worked_example_and_limits():
    x = torch.tensor([[1.0, 10.0, 0.5], [2.0, -1.0, 0.25]], dtype=torch.float64)  # (M, K) = (2, 3)
    w = torch.tensor([[0.5, 1.0, -1.0], [0.25, 2.0, 1.0], [1.0, 0.0, 0.5], [-2.0, 1.0, 1.0]],
                     dtype=torch.float64)  # (N, K) = (4, 3)
    y, outlier = int8_matmul_decomposed(x, w, threshold=6.0)
    assert outlier.tolist() == [False, True, False]
    keep = torch.tensor([0, 2])
    xs, ws = quantize_absmax(x[:, keep], 8, dim=0), quantize_absmax(w[:, keep], 8, dim=0)
    expected = x[:, 1:2] @ w[:, 1:2].T + dequantize(xs) @ dequantize(ws).T
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    # limits: no outlier column is plain W8A8; threshold 0 computes everything in float
    plain = int8_matmul(quantize_absmax(x, 8, dim=0), quantize_absmax(w, 8, dim=0))
    torch.testing.assert_close(int8_matmul_decomposed(x, w, float("inf"))[0], plain, rtol=0, atol=1e-12)
    assert torch.equal(int8_matmul_decomposed(x, w, 0.0)[0], x @ w.T)


def test_int8_decomposed_repairs_outlier_columns():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g, dtype=torch.float64)
    x[:, 3] *= 60  # one outlier feature, in every token
    w = torch.randn(20, 48, generator=g, dtype=torch.float64) / 7
    ref = x @ w.T
    plain = int8_matmul(quantize_absmax(x, 8, dim=0), quantize_absmax(w, 8, dim=0))
    y, outlier = int8_matmul_decomposed(x, w)
    assert outlier.nonzero().flatten().tolist() == [3]
    assert (y - ref).norm() < 0.2 * (plain - ref).norm()


def test_int8_decomposed_bad_input():
    x, w = torch.ones(2, 3), torch.ones(4, 3)
    with pytest.raises(ValueError, match="inner"):
        int8_matmul_decomposed(x, torch.ones(4, 5))
    with pytest.raises(ValueError, match="threshold"):
        int8_matmul_decomposed(x, w, -1.0)
    with pytest.raises(ValueError, match="x must"):
        int8_matmul_decomposed(torch.ones(3), w)
