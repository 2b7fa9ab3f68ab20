"""Encoders for ggml's K formats (Q4_K, Q5_K, Q6_K) and llama.cpp's "Q4_K_M" mixture.

Introduced in notebooks/15_quantisation. The K formats (Kawrakow's k-quants, llama.cpp pull
request 1684, 2023) cut a row into super-blocks of 256 weights and those into sub-blocks
that each get their own scale, itself stored as a small integer times one fp16 number per
super-block (the layouts are in :mod:`.ggml_quants`):

* Q4_K / Q5_K: 8 sub-blocks of 32, w = d s_j q - dmin m_j with q in 0..15 (0..31) and
  6-bit s_j, m_j;
* Q6_K: 16 sub-blocks of 16, w = d s_j (q - 32) with q in 0..63 and int8 s_j.

Encoding is two searches, following llama.cpp's reference quantisers
(``quantize_row_q4_K_ref``, ``quantize_row_q5_K_ref`` and ``quantize_row_q6_K_ref`` in
``ggml/src/ggml-quants.c``):

1. per sub-block, the real scale (and offset) that minimise a weighted squared error
   (:func:`fit_scale_offset` for Q4_K/Q5_K, ``make_qkx2_quants`` there;
   :func:`fit_symmetric_scale` for Q6_K, ``make_qx_quants`` there);
2. per super-block, those 8 (16) reals are themselves quantised: d = max / 63 (Q6_K:
   -max / 128, signed) is rounded to fp16 and every sub-block scale becomes the nearest
   integer multiple of it; then every weight is rounded to the nearest level of the grid
   that was actually stored.

The searches run on all sub-blocks at once (numpy arrays of shape (weights per sub-block,
sub-blocks), so that the sums over a sub-block are sums over the first axis), in chunks
that stay in the processor cache. They are not bit-identical to llama.cpp's C (which uses
float32 sums in a different order and fused multiply-adds, and rounds the sub-block scales
against the float32 max / 63 rather than the stored fp16 d, as done here), so the bytes can
differ; the decoded values are exactly what any ggml decoder computes from these bytes.

:func:`q4_k_m_types` gives the per-tensor types of llama.cpp's Q4_K_M file type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

__all__ = ["QK_K", "fit_scale_offset", "fit_symmetric_scale", "q4_k_m_types",
           "quantize_q4_k", "quantize_q5_k", "quantize_q6_k"]

QK_K = 256  # weights per super-block
_CHUNK = 512  # super-blocks encoded at once: 128K weights, arrays that stay in cache
_EPS = 1e-15  # llama.cpp's GROUP_MAX_EPS: a sub-block this small is all zero


def _to_fp16(values: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """float32 (n,) -> (fp16 bytes (n, 2), the stored value as float32 (n, 1)); overflow is an
    error, since an infinite scale would decode to inf and NaN."""
    with np.errstate(over="ignore"):
        half = values.astype("<f2")
    if not np.isfinite(half).all():
        raise ValueError(f"{what} {values[~np.isfinite(half)][0]:.4g} overflows float16 "
                         f"(largest 65504): the weights are too large for this format")
    return half.view(np.uint8).reshape(-1, 2), half.astype(np.float32)[:, None]


# ---------------------------------------------------------------- per sub-block searches


def fit_scale_offset(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column of x, the scale s >= 0 and offset o >= 0 with x ≈ s l - o, l in 0..nmax.

    ``x``, ``w``: float32 (g, m), m sub-blocks of g weights and their weights w > 0. The
    search (llama.cpp's ``make_qkx2_quants``): start from the min-max grid (o = -min(x, 0),
    s = (max - min) / nmax); then for k = 0..nstep try the inverse step
    (nmax + rmin + k rdelta) / (max + o) with the best o so far, round every weight to its
    level l, and refit s and o to those levels by weighted least squares (o clamped to
    >= 0); keep whatever lowers E = Σ w (s l - o - x)². E is computed in closed form from
    the sums Σ w l², Σ w l and Σ w x l, so a candidate costs one pass over the weights.
    Returns (s, o), float32 (m,) each.
    """
    sum_w, sum_x = w.sum(0), np.einsum("ji,ji->i", w, x)
    wx = w * x
    lo = np.minimum(x.min(0), np.float32(0))
    hi = x.max(0)
    live = hi > lo  # a column of one value v <= 0 is exactly s = 0, o = -v
    levels = np.empty_like(x)

    def sums(offset: np.ndarray, inv_step: np.ndarray) -> tuple[np.ndarray, ...]:
        np.add(x, offset, out=levels)
        np.multiply(levels, inv_step, out=levels)
        np.rint(levels, out=levels)
        np.clip(levels, 0, nmax, out=levels)
        return (np.einsum("ji,ji,ji->i", w, levels, levels), np.einsum("ji,ji->i", w, levels),
                np.einsum("ji,ji->i", wx, levels))

    def error(s: np.ndarray, o: np.ndarray, a: np.ndarray, b: np.ndarray,
              c: np.ndarray) -> np.ndarray:  # E - Σ w x², the part that depends on s and o
        return s * (s * a - 2 * (o * b + c)) + o * (o * sum_w + 2 * sum_x)

    offset = -lo
    inv_step = np.float32(nmax) / np.where(live, hi - lo, np.float32(1))
    scale = np.float32(1) / inv_step
    best = error(scale, offset, *sums(offset, inv_step))
    for k in range(nstep + 1):
        top = hi + offset  # max - min of the grid, with the current best min
        ok = live & (top > 0)
        inv_step = np.float32(nmax + rmin + rdelta * k) / np.where(ok, top, np.float32(1))
        a, b, c = sums(offset, inv_step)
        det = sum_w * a - b * b
        ok &= det > 0
        det = np.where(ok, det, np.float32(1))
        s = (sum_w * c - sum_x * b) / det  # least squares for x ≈ s l + m, m = -o
        o = (b * c - a * sum_x) / det
        clamp = o < 0  # an offset must be >= 0: refit the scale alone with o = 0
        s = np.where(clamp, c / np.maximum(a, np.float32(1e-30)), s)
        o = np.maximum(o, np.float32(0))
        err = error(s, o, a, b, c)
        better = ok & (err < best)
        scale, offset, best = (np.where(better, s, scale), np.where(better, o, offset),
                               np.where(better, err, best))
    return np.where(live, scale, np.float32(0)), offset


def fit_symmetric_scale(x: np.ndarray, nmax: int, nstep: int = 9) -> np.ndarray:
    """Per column of x, a signed scale s with x ≈ s l, l in -nmax..nmax-1, weights w = x².

    ``x``: float32 (g, m). The search (llama.cpp's ``make_qx_quants`` with rmse_type 1):
    let v be the entry of largest magnitude; for the inverse steps -(nmax + k/10) / v,
    k = 0, -nstep..nstep, round x to levels l and fit s = Σ w x l / Σ w l² (least
    squares); keep the candidate with the largest explained energy (Σ w x l)² / Σ w l²,
    which is the one with the smallest weighted error. A column with max |x| < 1e-15 gets
    s = 0. Returns s, float32 (m,).
    """
    columns = np.arange(x.shape[1])
    vmax = x[np.abs(x).argmax(0), columns]
    live = np.abs(vmax) >= _EPS
    vmax = np.where(live, vmax, np.float32(1))
    w = x * x
    wx = w * x
    levels = np.empty_like(x)
    scale = best = None
    for k in [0, *range(-nstep, 0), *range(1, nstep + 1)]:
        np.multiply(x, -np.float32(nmax + 0.1 * k) / vmax, out=levels)
        np.rint(levels, out=levels)
        np.clip(levels, -nmax, nmax - 1, out=levels)
        a = np.einsum("ji,ji,ji->i", w, levels, levels)
        c = np.einsum("ji,ji->i", wx, levels)
        s = c / np.maximum(a, np.float32(1e-30))
        energy = s * c  # = (Σ w x l)² / Σ w l², or 0 where every level is 0
        if scale is None:
            scale, best = s, energy
            continue
        better = energy > best
        scale, best = np.where(better, s, scale), np.where(better, energy, best)
    return np.where(live, scale, np.float32(0))


# ---------------------------------------------------------------- the three encoders


def _affine_k(blocks: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's numbers for (n, 256) float32 blocks: fp16 d and dmin (n, 4) bytes, the
    12 packed bytes of 6-bit scales and mins (n, 12), and the levels q (n, 8, 32) uint8."""
    n = blocks.shape[0]
    xs = np.ascontiguousarray(blocks.reshape(n * 8, 32).T)  # (32, m): sub-blocks in columns
    # llama.cpp's weights: the sub-block's RMS plus |x|, so large weights count more
    w = np.sqrt(np.mean(xs * xs, axis=0)) + np.abs(xs)
    scale, offset = fit_scale_offset(xs, w, nmax, rmin, rdelta, nstep)
    scale, offset = scale.reshape(n, 8), offset.reshape(n, 8)
    d_bytes, d = _to_fp16(scale.max(1) / np.float32(63), "Q4_K/Q5_K super-block scale d")
    m_bytes, dmin = _to_fp16(offset.max(1) / np.float32(63), "Q4_K/Q5_K super-block dmin")
    with np.errstate(divide="ignore", invalid="ignore"):
        s6 = np.where(d > 0, np.clip(np.rint(scale / d), 0, 63), 0).astype(np.uint8)
        m6 = np.where(dmin > 0, np.clip(np.rint(offset / dmin), 0, 63), 0).astype(np.uint8)
        step = (d * s6.astype(np.float32))[..., None]  # (n, 8, 1): what the decoder uses
        off = (dmin * m6.astype(np.float32))[..., None]
        x = blocks.reshape(n, 8, 32)
        q = np.where(step > 0, np.clip(np.rint((x + off) / step), 0, nmax), 0).astype(np.uint8)
    # 12 bytes: scales 0-3 and mins 0-3 in the low 6 bits of bytes 0-7; sub-blocks 4-7 put
    # their low 4 bits in bytes 8-11 and their top 2 bits in the spare top bits of 0-7
    packed = np.concatenate([s6[:, :4] | ((s6[:, 4:] >> 4) << 6),
                             m6[:, :4] | ((m6[:, 4:] >> 4) << 6),
                             (s6[:, 4:] & 0x0F) | ((m6[:, 4:] & 0x0F) << 4)], axis=1)
    return np.concatenate([d_bytes, m_bytes], axis=1), packed, q


def _k_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 8, 32) levels -> (n, 128) bytes: sub-block 2c in the low nibbles of bytes
    32c..32c+31, sub-block 2c+1 in their high nibbles."""
    low = q & 0x0F
    return (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(q.shape[0], 128)


def _encode_q4_k(blocks: np.ndarray) -> np.ndarray:
    scales, packed, q = _affine_k(blocks, 15, -1.0, 0.1, 20)
    return np.concatenate([scales, packed, _k_nibbles(q)], axis=1)  # (n, 144)


def _encode_q5_k(blocks: np.ndarray) -> np.ndarray:
    scales, packed, q = _affine_k(blocks, 31, -0.5, 0.1, 15)
    high = np.packbits(q >> 4, axis=1, bitorder="little").reshape(-1, 32)  # bit j: sub-block j
    return np.concatenate([scales, packed, high, _k_nibbles(q)], axis=1)  # (n, 176)


def _encode_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    xs = np.ascontiguousarray(blocks.reshape(n * 16, 16).T)  # (16, m)
    scale = fit_symmetric_scale(xs, 32).reshape(n, 16)
    where_max = np.abs(scale).argmax(1)
    top = scale[np.arange(n), where_max]  # the signed scale of largest magnitude
    live = np.abs(top) >= _EPS
    d_bytes, d = _to_fp16(np.where(live, top / np.float32(-128), 0), "Q6_K super-block scale d")
    with np.errstate(divide="ignore", invalid="ignore"):
        s8 = np.where(d != 0, np.clip(np.rint(scale / d), -128, 127), 0).astype(np.int8)
        step = (d * s8.astype(np.float32))[..., None]  # (n, 16, 1)
        x = blocks.reshape(n, 16, 16)
        q = np.where(step != 0, np.clip(np.rint(x / step), -32, 31), 0)
    q = (q + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # halves of 128, quarters of 32
    # per half: 64 bytes of nibbles (quarters 0, 1 low; 2, 3 high), 32 bytes of 2-bit highs
    low = q & 0x0F
    low = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4),
                          low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)  # (n, 2, 64)
    high = ((q >> 4) << np.array([0, 2, 4, 6], np.uint8)[:, None]).sum(2, dtype=np.uint8)
    return np.concatenate([low.reshape(n, 128), high.reshape(n, 64), s8.view(np.uint8),
                           d_bytes], axis=1)  # (n, 210)


def _chunked(encode: Callable[[np.ndarray], np.ndarray], blocks: np.ndarray) -> np.ndarray:
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.float32:
        raise TypeError(f"blocks must be a float32 numpy array, got "
                        f"{blocks.dtype if isinstance(blocks, np.ndarray) else type(blocks)}")
    if blocks.ndim != 2 or blocks.shape[1] != QK_K or not len(blocks):
        raise ValueError(f"blocks must have shape (n, {QK_K}) with n >= 1, got {blocks.shape}")
    if not np.isfinite(blocks).all():
        raise ValueError("blocks has NaN or infinite entries")
    return np.concatenate([encode(blocks[i:i + _CHUNK]) for i in range(0, len(blocks), _CHUNK)])


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """Q4_K: float32 (n, 256) -> uint8 (n, 144): fp16 d, fp16 dmin, 12 bytes of 6-bit
    scales and mins, 128 bytes of 4-bit levels. Search as ``quantize_row_q4_K_ref``:
    weights RMS + |x|, inverse steps (15 - 1 + k/10) / range for k = 0..20."""
    return _chunked(_encode_q4_k, blocks)


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """Q5_K: float32 (n, 256) -> uint8 (n, 176): as Q4_K plus 32 bytes of fifth bits; the
    search of ``quantize_row_q5_K_ref``: (31 - 0.5 + k/10) / range for k = 0..15."""
    return _chunked(_encode_q5_k, blocks)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K: float32 (n, 256) -> uint8 (n, 210): 128 bytes of low nibbles, 64 of 2-bit
    highs, 16 int8 scales, fp16 d. Search as ``quantize_row_q6_K_ref``: per sub-block of
    16 :func:`fit_symmetric_scale` with nmax = 32; d = -max scale / 128, so the sub-block
    with the largest scale gets s_j = -128."""
    return _chunked(_encode_q6_k, blocks)


# ---------------------------------------------------------------- the Q4_K_M mixture


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int:
    match = re.match(r"blk\.(\d+)\.", name)
    return int(match.group(1)) if match else -1


def q4_k_m_types(tensor_names: Sequence[str], n_layers: int,
                 shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, str]:
    """The ggml type llama.cpp's Q4_K_M file type gives each tensor of a Llama-style model.

    From ``llama_tensor_get_type`` and its helpers in llama.cpp's ``src/llama-quant.cpp``
    (2025), for a dense model (no experts) and no user overrides. Q4_K_M is a *mixture*:

    * tensors that are not quantised keep their type, returned as "F32": anything that is
      not a matrix (1-D when ``shapes`` is given), norms (``*_norm.weight``) and names that
      do not end in "weight";
    * ``output.weight`` is Q6_K; so is ``token_embd.weight`` when there is no
      ``output.weight`` (tied embeddings: the matrix is also the output layer), else Q4_K;
    * ``attn_v.weight``: Q6_K where ``use_more_bits(i, n)`` holds, i the tensor's rank
      among the attn_v tensors in layer order and n their count; else Q4_K. use_more_bits is
      i < n/8 or i >= 7n/8 or (i - n/8) mod 3 = 2 (integer division): the first and last
      eighth of the layers and every third layer in between;
    * ``ffn_down``: Q6_K where ``use_more_bits(layer, n_layers)``, else Q4_K;
    * every other matrix: Q4_K.

    With ``shapes`` (name -> numpy-order shape, as in
    :class:`~llmbook.inference.gguf_file.GGUFTensor`), llama.cpp's fallback for rows that
    are not a multiple of 256 weights is applied too: the output (or tied embedding) becomes
    Q8_0, and elsewhere Q4_K -> Q5_0, Q6_K -> Q8_0 (Q5_0 and Q8_0 have blocks of 32); rows
    that are not even a multiple of 32 get F16.
    """
    if isinstance(tensor_names, str) or not all(isinstance(t, str) for t in tensor_names):
        raise TypeError("tensor_names must be a sequence of tensor name strings")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")
    top = max((_layer(t) for t in tensor_names), default=-1)
    if top >= n_layers:
        raise ValueError(f"tensor layer blk.{top} is out of range for n_layers={n_layers}")
    shapes = dict(shapes or {})
    missing = [t for t in tensor_names if shapes and t not in shapes]
    if missing:
        raise ValueError(f"shapes has no entry for {missing[:3]}")
    tied = "output.weight" not in tensor_names
    attn_v = sorted((t for t in tensor_names if "attn_v.weight" in t), key=_layer)
    rank_v = {t: i for i, t in enumerate(attn_v)}

    types: dict[str, str] = {}
    for name in tensor_names:
        shape = tuple(shapes.get(name, (QK_K, QK_K)))
        if len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name:
            types[name] = "F32"
            continue
        is_output = name == "output.weight" or (tied and name == "token_embd.weight")
        if is_output:
            qtype = "Q6_K" if shape[-1] % QK_K == 0 else "Q8_0"
        elif name in rank_v:
            qtype = "Q6_K" if _use_more_bits(rank_v[name], len(attn_v)) else "Q4_K"
        elif "ffn_down" in name:
            qtype = "Q6_K" if _use_more_bits(_layer(name), n_layers) else "Q4_K"
        else:
            qtype = "Q4_K"
        if shape[-1] % QK_K:
            qtype = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}.get(qtype, qtype)
        types[name] = "F16" if shape[-1] % 32 else qtype  # too odd even for 32-blocks
    return types
