"""ggml's block quantisation formats, decoded (and encoded) with numpy.

Introduced in notebooks/15_quantisation. A ggml tensor is cut, row by row, into *blocks*
of 32 weights (the "legacy" formats) or 256 weights (the "K" formats, Kawrakow's k-quants,
llama.cpp pull request 1684, 2023). A block stores its weights as small integers q and a
few numbers that map them back to reals; the layouts are the structs of ggml's
``ggml-common.h``. Every multi-byte field is little-endian; "fp16" is IEEE half precision.

=========  =====  =====  ===========================================================
format     block  bytes  stored per block, and the decoded weight
=========  =====  =====  ===========================================================
F32/F16/BF16  1   4/2/2  the number itself
Q8_0        32     34    fp16 d, 32 int8 q:                        w = d q
Q4_0        32     18    fp16 d, 32 4-bit q in 16 bytes:           w = d (q - 8)
Q4_1        32     20    fp16 d, fp16 m, 32 4-bit q:               w = d q + m
Q5_0        32     22    fp16 d, 32 high bits (uint32), 32 low nibbles: w = d (q - 16)
Q5_1        32     24    fp16 d, fp16 m, high bits, low nibbles:   w = d q + m
Q4_K       256    144    fp16 d, fp16 dmin, 8 six-bit (scale, min) pairs in 12 bytes,
                         256 4-bit q; sub-block j of 32:           w = d s_j q - dmin m_j
Q5_K       256    176    as Q4_K plus 256 high bits:               q in 0..31
Q6_K       256    210    256 low nibbles, 256 2-bit highs, 16 int8 scales, fp16 d;
                         sub-block j of 16:                        w = d s_j (q - 32)
MXFP4       32     17    an E8M0 exponent e, 32 4-bit E2M1 codes:  w = 2^(e-127) v(q)
=========  =====  =====  ===========================================================

In the 32-weight formats a byte holds two 4-bit values: weight i < 16 in the low nibble
of byte i and weight i + 16 in its high nibble. The K formats pair sub-blocks the same way
within each 64 weights. :func:`dequantize` decodes any of these, vectorised over all the
blocks at once, with the same float32 arithmetic (the same products and sums, in the same
order) as ggml's Python package ``gguf.quants``, so the results are equal bit for bit.

:func:`quantize` encodes. For the 32-weight formats it reproduces ggml's reference
quantisers (``quantize_row_*_ref`` in ``ggml-quants.c``) byte for byte: the scale is
computed in float32 from the block's extreme values and every weight rounded against it
(Q4_0: d = v / -8 for the entry v of largest magnitude, q = min(15, trunc(x / d + 8.5));
Q4_1: d = (max - min) / 15, q = trunc((x - min) / d + 0.5); Q8_0: d = max|x| / 127,
q = round half away from zero). The K formats search for their scales
(:mod:`.ggml_kquants`). :func:`bits_per_weight_symbolic` derives each format's size from
its fields, :func:`rounding_mse` the error of rounding, :func:`block_rmse` measures it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import sympy

from llmbook.inference.ggml_kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from llmbook.inference.gguf_file import block_layout

__all__ = ["BLOCK_FIELDS", "DEQUANTIZE_TYPES", "QUANTIZE_TYPES", "bits_per_weight_symbolic",
           "block_rmse", "dequantize", "quantize", "rounding_mse"]


def _fp16(raw: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n, 1) float32: little-endian IEEE half precision numbers."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """(..., k) uint8 -> (..., 2k) uint8: the k low nibbles, then the k high nibbles."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _bits(packed: np.ndarray, count: int) -> np.ndarray:
    """(n, count/8) uint8 -> (n, count) uint8: bit i of the little-endian bit string."""
    return np.unpackbits(packed, axis=-1, count=count, bitorder="little")


# ---------------------------------------------------------------- the 32-weight formats


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _fp16(b[:, :2])  # (n, 1)
    q = np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float32)  # (n, 32)
    return q * d


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _fp16(b[:, :2])
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)  # (n, 32) in -8..7
    return d * q.astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _fp16(b[:, :2]), _fp16(b[:, 2:4])
    q = _nibbles(b[:, 4:]).astype(np.float32)  # (n, 32) in 0..15
    return d * q + m


def _five_bit(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """32 five-bit values from 4 bytes of high bits and 16 bytes of low nibbles."""
    return _nibbles(low) | (_bits(high, 32) << 4)  # (n, 32) in 0..31


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _fp16(b[:, :2])
    q = _five_bit(b[:, 2:6], b[:, 6:]).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _fp16(b[:, :2]), _fp16(b[:, 2:4])
    q = _five_bit(b[:, 4:8], b[:, 8:]).astype(np.float32)
    return d * q + m


#: E2M1 (1 sign, 2 exponent, 1 mantissa bit) values times two, indexed by the 4-bit code:
#: MXFP4's elements (OCP Microscaling Formats MX v1.0, 2023), as ggml's kvalues_mxfp4.
E2M1_TIMES_TWO = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                          dtype=np.int8)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) in float32 for an E8M0 exponent byte e (half the shared scale, because
    the element table holds E2M1 values times two). e = 0 and 1 give subnormal floats."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    d = _e8m0_half(b[:, :1])  # (n, 1)
    v = E2M1_TIMES_TWO[_nibbles(b[:, 1:])]  # (n, 32)
    return d * v.astype(np.float32)


# ---------------------------------------------------------------- the 256-weight K formats


def k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 8 six-bit scales and 8 six-bit mins from their 12 bytes: (n, 12) -> 2 x (n, 8).

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold the
    low 4 bits of scale 4+j (low nibble) and min 4+j (high nibble), whose top 2 bits are
    the spare top bits of bytes j (scale) and 4 + j (min).
    """
    lo_s, lo_m, mixed = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([lo_s & 0x3F, (mixed & 0x0F) | ((lo_s >> 6) << 4)], axis=-1)
    mins = np.concatenate([lo_m & 0x3F, (mixed >> 4) | ((lo_m >> 6) << 4)], axis=-1)
    return scales, mins


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) -> (n, 8, 32): in each 32 bytes, sub-block 2c in the low nibbles, 2c+1 high."""
    n = qs.shape[0]
    return _nibbles(qs.reshape(n, 4, 32)).reshape(n, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d, dmin = _fp16(b[:, 0:2]), _fp16(b[:, 2:4])
    s, m = k_scales_mins(b[:, 4:16])
    scale = (d * s.astype(np.float32))[..., None]  # (n, 8, 1)
    offset = (dmin * m.astype(np.float32))[..., None]
    q = _k_nibbles(b[:, 16:]).astype(np.float32)  # (n, 8, 32)
    return (scale * q - offset).reshape(n, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d, dmin = _fp16(b[:, 0:2]), _fp16(b[:, 2:4])
    s, m = k_scales_mins(b[:, 4:16])
    scale = (d * s.astype(np.float32))[..., None]
    offset = (dmin * m.astype(np.float32))[..., None]
    # bit j of high byte l is the fifth bit of weight l of sub-block j
    high = np.unpackbits(b[:, 16:48][:, None, :], axis=1, count=8, bitorder="little")  # (n, 8, 32)
    q = (_k_nibbles(b[:, 48:]) | (high << 4)).astype(np.float32)
    return (scale * q - offset).reshape(n, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _fp16(b[:, 208:210])
    scale = (d * np.ascontiguousarray(sc).view(np.int8).astype(np.float32))[..., None]  # (n, 16, 1)
    # each half of 128 weights: 64 bytes of nibbles (weights 0-63 low, 64-127 high) and
    # 32 bytes of 2-bit highs (weights 32 k + l in bits 2k, 2k+1 of byte l)
    low = _nibbles(ql.reshape(n, 2, 64))  # (n, 2, 128)
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    q = (low | (high.reshape(n, 2, 128) << 4)).astype(np.int8) - np.int8(32)
    return (scale * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


# ---------------------------------------------------------------- the plain number types


def _f32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f4").astype(np.float32)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32: shift the 16 bits up and read a float32."""
    return (np.ascontiguousarray(b).view("<u2").astype(np.uint32) << 16).view(np.float32)


_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _f32, "F16": _f16, "BF16": _bf16, "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1,
    "Q5_0": _q5_0, "Q5_1": _q5_1, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "MXFP4": _mxfp4,
}
#: The formats :func:`dequantize` decodes.
DEQUANTIZE_TYPES = tuple(_DECODERS)


def _check_qtype(qtype: object, known: tuple[str, ...], verb: str) -> str:
    if not isinstance(qtype, str):
        raise TypeError(f"qtype must be a ggml type name such as 'Q4_K', got {qtype!r}")
    if qtype not in known:
        raise ValueError(f"cannot {verb} {qtype!r}; supported: {list(known)}")
    return qtype


def _check_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, tuple | list) or not shape or not all(
            isinstance(s, int | np.integer) and not isinstance(s, bool) and s > 0 for s in shape):
        raise ValueError(f"shape must be a non-empty tuple of positive ints, got {shape!r}")
    return tuple(int(s) for s in shape)


def dequantize(data: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode the raw bytes of a ggml tensor: uint8 (n_bytes,) -> float32 array of ``shape``.

    ``qtype`` names the format (one of :data:`DEQUANTIZE_TYPES`); ``shape`` is in numpy
    order, so blocks run along the last axis and ``shape[-1]`` must be a multiple of the
    block size. ``data`` holds exactly the bytes that shape needs (a ``ValueError`` names
    the sizes otherwise), e.g. :attr:`~llmbook.inference.gguf_file.GGUFTensor.data`.
    """
    qtype = _check_qtype(qtype, DEQUANTIZE_TYPES, "dequantize")
    shape = _check_shape(shape)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"data must be a numpy array of bytes, got {type(data).__name__}")
    block, size = block_layout(qtype)
    if shape[-1] % block:
        raise ValueError(f"{qtype} packs {block} weights per block, but the last axis of "
                         f"shape {shape} has {shape[-1]}")
    n_blocks = int(np.prod(shape, dtype=np.int64)) // block
    raw = data.reshape(-1).view(np.uint8)
    if raw.size != n_blocks * size:
        raise ValueError(f"{qtype} data of shape {shape} needs {n_blocks} blocks of {size} "
                         f"bytes = {n_blocks * size} bytes, got {raw.size}")
    out = _DECODERS[qtype](raw.reshape(n_blocks, size))  # (n_blocks, block)
    return out.reshape(shape)


# ---------------------------------------------------------------- encoders


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """1 / d in float32, and 0 where d is 0 (an all-zero block encodes as zeros)."""
    return np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)


def _half(d: np.ndarray, qtype: str) -> np.ndarray:
    """float32 (n, 1) scales -> (n, 2) bytes of fp16; a scale past 65504 is an error."""
    with np.errstate(over="ignore"):
        half = d.astype("<f2")
    if not np.isfinite(half).all():
        raise ValueError(f"{qtype}: a block scale of {d[~np.isfinite(half)][0]:.4g} overflows "
                         f"float16 (largest 65504): the weights are too large for {qtype}")
    return half.view(np.uint8).reshape(-1, 2)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values -> (n, 16) bytes: weight i in the low nibble of byte i, i + 16 high."""
    return (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)


def _symmetric(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0/Q5_0: d = v / -2^(b-1), v the first entry of largest |x|, so v itself maps to
    level 0; q = min(2^b - 1, trunc(x / d + 2^(b-1) + 1/2)) in float32."""
    half = 2 ** (bits - 1)
    v = np.take_along_axis(blocks, np.abs(blocks).argmax(1)[:, None], axis=1)  # (n, 1)
    d = v / np.float32(-half)
    q = np.trunc(blocks * _reciprocal(d) + np.float32(half + 0.5))
    return d, np.minimum(q, 2 * half - 1).astype(np.uint8)


def _affine(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1/Q5_1: m = min, d = (max - min) / (2^b - 1), q = trunc((x - m) / d + 1/2)."""
    lo, hi = blocks.min(1, keepdims=True), blocks.max(1, keepdims=True)
    d = (hi - lo) / np.float32(2**bits - 1)
    q = np.trunc((blocks - lo) * _reciprocal(d) + np.float32(0.5))
    return d, lo, np.minimum(q, 2**bits - 1).astype(np.uint8)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: to the nearest integer, halves away from zero (np.rint rounds them to even)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.copysign(np.where(a - whole >= 0.5, whole + 1, whole), v)


def _encode_q8_0(b: np.ndarray) -> np.ndarray:
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    q = _round_half_away(b * _reciprocal(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_half(d, "Q8_0"), q], axis=1)


def _encode_q4_0(b: np.ndarray) -> np.ndarray:
    d, q = _symmetric(b, 4)
    return np.concatenate([_half(d, "Q4_0"), _pack_nibbles(q)], axis=1)


def _encode_q4_1(b: np.ndarray) -> np.ndarray:
    d, m, q = _affine(b, 4)
    return np.concatenate([_half(d, "Q4_1"), _half(m, "Q4_1"), _pack_nibbles(q)], axis=1)


def _high_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) five-bit values -> (n, 4) bytes: the fifth bit of weight i is bit i."""
    return np.packbits(q >> 4, axis=1, bitorder="little")


def _encode_q5_0(b: np.ndarray) -> np.ndarray:
    d, q = _symmetric(b, 5)
    return np.concatenate([_half(d, "Q5_0"), _high_bits(q), _pack_nibbles(q)], axis=1)


def _encode_q5_1(b: np.ndarray) -> np.ndarray:
    d, m, q = _affine(b, 5)
    return np.concatenate([_half(d, "Q5_1"), _half(m, "Q5_1"), _high_bits(q), _pack_nibbles(q)],
                          axis=1)


def _encode_mxfp4(b: np.ndarray) -> np.ndarray:
    """Shared exponent e = floor(log2 max|x|) - 2 + 127 (float32 log2, as ggml; clamped at 0
    for |x| < 2^-125), so max|x| lands in [4, 8) x 2^(e-127), near E2M1's largest value 6;
    each weight takes the nearest of the 16 values (the first, on a tie)."""
    amax = np.abs(b).max(1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) + np.float32(125), 0)
    e = np.maximum(e, 0).astype(np.uint8)  # (n, 1)
    values = _e8m0_half(e)[:, :, None] * E2M1_TIMES_TWO.astype(np.float32)  # (n, 1, 16)
    q = np.abs(values - b[:, :, None]).argmin(-1).astype(np.uint8)  # (n, 32)
    return np.concatenate([e, _pack_nibbles(q)], axis=1)


def _encode_f16(b: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        half = b.astype("<f2")
    if not np.isfinite(half).all():
        raise ValueError("F16: values beyond ±65504 overflow float16")
    return half.view(np.uint8)


def _encode_bf16(b: np.ndarray) -> np.ndarray:
    """The top 16 bits of the float32, rounded to nearest even on the 16 dropped bits."""
    u = b.view(np.uint32).astype(np.uint64)
    top = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    if ((top & 0x7F80) == 0x7F80).any():
        raise ValueError("BF16: values beyond ±3.39e38 overflow bfloat16")
    return top.view(np.uint8)


_ENCODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": lambda b: b.astype("<f4").view(np.uint8), "F16": _encode_f16, "BF16": _encode_bf16,
    "Q8_0": _encode_q8_0, "Q4_0": _encode_q4_0, "Q4_1": _encode_q4_1, "Q5_0": _encode_q5_0,
    "Q5_1": _encode_q5_1, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k,
    "MXFP4": _encode_mxfp4,
}
#: The formats :func:`quantize` encodes.
QUANTIZE_TYPES = tuple(_ENCODERS)
_CHUNK_WEIGHTS = 1 << 18  # encode 256K weights at a time: bounded memory, cache-sized arrays


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """Encode float weights in a ggml format: x (..., k) -> uint8 (..., k / block * bytes).

    ``x`` is a floating-point numpy array of any shape whose last axis is a multiple of the
    format's block (32, or 256 for the K formats); it is converted to float32 first, as
    ggml does. ``qtype`` is one of :data:`QUANTIZE_TYPES`. The result holds each row's
    blocks one after the other (:func:`dequantize` with ``x.shape`` decodes it). The
    32-weight formats, MXFP4, F16 and BF16 equal ``gguf.quants.quantize`` byte for byte.
    Raises ``TypeError`` for a non-float array, ``ValueError`` for an empty one, a bad last
    axis, NaN or infinite entries, or a block scale that overflows float16.
    """
    qtype = _check_qtype(qtype, QUANTIZE_TYPES, "quantize")
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x must be a floating-point numpy array, got "
                        f"{x.dtype if isinstance(x, np.ndarray) else type(x).__name__}")
    if x.ndim == 0 or x.size == 0:
        raise ValueError(f"x must have at least one axis and one entry, got shape {x.shape}")
    block, size = block_layout(qtype)
    if x.shape[-1] % block:
        raise ValueError(f"{qtype} packs {block} weights per block, but the last axis of x "
                         f"(shape {x.shape}) has {x.shape[-1]}")
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf: refused
        blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block)
    if not np.isfinite(blocks).all():
        raise ValueError(f"x has NaN or infinite entries (after conversion to float32): "
                         f"{int((~np.isfinite(blocks)).sum())} of {blocks.size}")
    step = max(1, _CHUNK_WEIGHTS // block)
    out = np.concatenate([_ENCODERS[qtype](blocks[i:i + step])
                          for i in range(0, len(blocks), step)])
    return out.reshape(*x.shape[:-1], x.shape[-1] // block * size)


# ---------------------------------------------------------------- sizes and errors

#: Each format's block as (field, count, bits each), from the structs of ggml-common.h.
#: Q5's fifth bits (qh) are counted with their low nibbles as 5-bit codes; the K formats'
#: 12 bytes of scales are 8 six-bit scales and 8 six-bit mins.
BLOCK_FIELDS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "F32": (("value", 1, 32),), "F16": (("value", 1, 16),), "BF16": (("value", 1, 16),),
    "Q8_0": (("d", 1, 16), ("q", 32, 8)),
    "Q4_0": (("d", 1, 16), ("q", 32, 4)),
    "Q4_1": (("d", 1, 16), ("m", 1, 16), ("q", 32, 4)),
    "Q5_0": (("d", 1, 16), ("q", 32, 5)),
    "Q5_1": (("d", 1, 16), ("m", 1, 16), ("q", 32, 5)),
    "Q4_K": (("d", 1, 16), ("dmin", 1, 16), ("s_j", 8, 6), ("m_j", 8, 6), ("q", 256, 4)),
    "Q5_K": (("d", 1, 16), ("dmin", 1, 16), ("s_j", 8, 6), ("m_j", 8, 6), ("q", 256, 5)),
    "Q6_K": (("d", 1, 16), ("s_j", 16, 8), ("q", 256, 6)),
    "MXFP4": (("e", 1, 8), ("q", 32, 4)),
}


def bits_per_weight_symbolic() -> dict[str, sympy.Rational]:
    """Stored bits per weight of each format, exactly: (Σ count · bits over the block's
    fields) / weights per block, as a SymPy Rational. E.g. Q4_K = (16 + 16 + 8·6 + 8·6 +
    256·4) / 256 = 9/2: 4 bits of code plus 1/2 bit of scales per weight; Q6_K = 105/16."""
    out = {}
    for qtype, fields in BLOCK_FIELDS.items():
        bits = sympy.Add(*(sympy.Integer(count) * bits for _, count, bits in fields))
        out[qtype] = sympy.Rational(bits, block_layout(qtype)[0])
    return out


def rounding_mse() -> sympy.Expr:
    """The mean squared error of rounding to a grid of step d, for a weight spread uniformly
    over a step: its error e is uniform on [-d/2, d/2], E[e²] = ∫ e² de / d = d²/12 (the
    Δ²/12 of :mod:`.quant`). A SymPy expression in the positive symbol ``d``."""
    d = sympy.Symbol("d", positive=True)
    e = sympy.Symbol("e", real=True)
    return sympy.integrate(e**2, (e, -d / 2, d / 2)) / d


def block_rmse(x: np.ndarray, qtype: str) -> float:
    """Root-mean-square round-trip error sqrt(mean((dequantize(quantize(x)) - x)²)) of
    encoding ``x`` (any float array that :func:`quantize` accepts) in ``qtype``."""
    back = dequantize(quantize(x, qtype), qtype, x.shape)  # quantize checks x
    return float(np.sqrt(np.mean((back.astype(np.float64) - x.astype(np.float32)) ** 2)))
