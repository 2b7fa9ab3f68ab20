"""FlashAttention in PyTorch: online softmax, its merge rule, exact tiled attention and its backward.

Introduced in notebooks/14_flash_attention. Attention as written in chapter 4 materialises
the (T_q, T_k) score matrix S = scale Q K^T and its softmax P; FlashAttention (Dao et al.,
2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness";
Dao, 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning") computes the *same* output block by block and never holds more than a
(block_q, block_k) tile of S. What makes this possible is the online normaliser of
Milakov & Gimelshein (2018, "Online normalizer calculation for softmax"): a block of scores
s_1..s_n with values v_1..v_n is summarised by the state

    m = max_j s_j,   l = sum_j exp(s_j - m),   o = sum_j exp(s_j - m) v_j,

and two states of disjoint blocks merge into the state of their union (eq. of Dao et al.,
2022, section 3.1):

    m = max(m1, m2),  l = e^(m1 - m) l1 + e^(m2 - m) l2,  o = e^(m1 - m) o1 + e^(m2 - m) o2.

The softmax-weighted average is o / l, and the log-sum-exp of the scores is m + log l. The
merge is associative and commutative with identity (-inf, 0, 0), so blocks may be folded in
any order and grouping.

Contents:

* :func:`softmax_state` and :func:`merge_softmax_states` - the state of a block and the merge;
* :func:`online_softmax` - softmax over the last dimension, streaming over blocks;
* :func:`flash_attention_reference` - exact tiled attention (forward), optionally with the
  log-sum-exp L of every query row;
* :func:`flash_attention_backward_reference` - the tiled backward of FlashAttention-2
  (Dao, 2023, Algorithm 2) that recomputes P = exp(S - L) from L instead of storing it;
* :class:`FlashAttentionReferenceFunction` and :func:`flash_attention_tiled` - the two joined
  into one ``autograd.Function``: differentiable attention that keeps no (T_q, T_k) matrix;
* :func:`causal_mask_mod`, :func:`sliding_window_mask_mod` and :func:`document_mask_mod` -
  masks as functions of positions, in the ``mask_mod`` convention of PyTorch's
  ``torch.nn.attention.flex_attention``, and :func:`flash_attention_masked` - tiled attention
  under such a mask that skips every tile the mask hides entirely (block sparsity);
* :func:`split_kv_attention` - split-KV ("Flash-Decoding", Dao et al., 2023): the keys cut into
  chunks attended independently, the partial outputs merged exactly by their log-sum-exp;
* :func:`attention_hbm_accesses` - the IO counts of Dao et al.'s Theorem 2 for one head, and
  :func:`attention_arithmetic_intensity` - FLOPs per byte of the two, for a roofline;
* :func:`peak_memory_bytes` - the peak of tensor memory allocated while a function runs;
* :func:`flash_attention_triton` - the Triton kernels of :mod:`llmbook.inference.flash_triton`,
  imported only when called.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from llmbook.validation import check_positive_int

__all__ = [
    "FlashAttentionReferenceFunction",
    "attention_arithmetic_intensity",
    "attention_hbm_accesses",
    "causal_mask_mod",
    "document_mask_mod",
    "flash_attention_backward_reference",
    "flash_attention_masked",
    "flash_attention_reference",
    "flash_attention_tiled",
    "flash_attention_triton",
    "merge_softmax_states",
    "online_softmax",
    "peak_memory_bytes",
    "sliding_window_mask_mod",
    "softmax_state",
    "split_kv_attention",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

State = tuple[Tensor, Tensor, Tensor | None]


def _check_tensor(name: str, t: object, min_ndim: int = 1) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape "
                         f"{tuple(t.shape)}")
    return t


# ------------------------------------------------------------------ online softmax


def softmax_state(s: Tensor, v: Tensor | None = None) -> State:
    """The online-softmax state (m, l, o) of a block of scores s (..., n), row by row.

    m = max_j s_j (...), l = sum_j exp(s_j - m) (...), and, if values are given,
    o = sum_j exp(s_j - m) v_j (..., d_v); otherwise o is None. For attention s is a tile
    (..., r, n) of r query rows against n keys and v (..., n, d_v) holds the keys' values
    (shared by the r rows); for a single row s (n,) and v (n, d_v). A row whose scores are
    all -inf (fully masked) gets the identity state (-inf, 0, 0).
    """
    _check_tensor("s", s)
    if s.shape[-1] == 0:
        raise ValueError(f"s must hold at least one score in its last dimension, got shape "
                         f"{tuple(s.shape)}")
    m = s.amax(dim=-1)  # (...)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe.unsqueeze(-1))  # (..., n) unnormalised weights, <= 1
    ell = p.sum(dim=-1)  # (...), the normaliser (the literature's l)
    if v is None:
        return m, ell, None
    _check_tensor("v", v, min_ndim=2)
    if v.shape[-2] != s.shape[-1] or v.shape[:-2] != s.shape[:-2]:
        raise ValueError(f"v must have shape (*s.shape[:-2], n, d_v) for s of shape (..., r, n), "
                         f"got s {tuple(s.shape)} and v {tuple(v.shape)}")
    o = p @ v  # (..., r, d_v), or (d_v,) for a single row
    return m, ell, o


def merge_softmax_states(a: State, b: State) -> State:
    """Merge the online-softmax states of two disjoint blocks into the state of their union.

    Each state is (m, l, o) with m, l of shape (...) and o (..., d_v) or None (both or
    neither). With m = max(m1, m2):

        l = exp(m1 - m) l1 + exp(m2 - m) l2,   o = exp(m1 - m) o1 + exp(m2 - m) o2.

    Milakov & Gimelshein (2018), eq. in Algorithm 3; Dao et al. (2022), section 3.1. The
    state (-inf, 0, 0) of an empty (or fully masked) block is the identity.
    """
    if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == 3 and len(b) == 3):
        raise TypeError("merge_softmax_states takes two (m, l, o) tuples")
    (m1, l1, o1), (m2, l2, o2) = a, b
    for name, t in (("m1", m1), ("l1", l1), ("m2", m2), ("l2", l2)):
        _check_tensor(name, t, min_ndim=0)
    if not m1.shape == l1.shape == m2.shape == l2.shape:
        raise ValueError(f"m and l of both states must have one shape, got m1 {tuple(m1.shape)}, "
                         f"l1 {tuple(l1.shape)}, m2 {tuple(m2.shape)}, l2 {tuple(l2.shape)}")
    if (o1 is None) != (o2 is None):
        raise ValueError("either both states carry an output o or neither does")
    if o1 is not None:
        for name, t in (("o1", o1), ("o2", o2)):
            _check_tensor(name, t)
            if t.shape[:-1] != m1.shape:
                raise ValueError(f"{name} must have shape (*m.shape, d_v) with m.shape = "
                                 f"{tuple(m1.shape)}, got {tuple(t.shape)}")
        if o1.shape != o2.shape:
            raise ValueError(f"o1 and o2 must have one shape, got {tuple(o1.shape)} and "
                             f"{tuple(o2.shape)}")
    m = torch.maximum(m1, m2)  # (...)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # both empty: shift by 0
    alpha, beta = torch.exp(m1 - m_safe), torch.exp(m2 - m_safe)  # rescale factors, <= 1
    ell = alpha * l1 + beta * l2
    o = None if o1 is None else alpha.unsqueeze(-1) * o1 + beta.unsqueeze(-1) * o2
    return m, ell, o


def online_softmax(x: Tensor, block: int = 128) -> Tensor:
    """Softmax over the last dimension of x (..., n), computed by streaming over blocks.

    One pass folds the state (m, l) of each block of ``block`` entries into a running state
    with :func:`merge_softmax_states` (the online normaliser of Milakov & Gimelshein, 2018);
    a second pass writes exp(x - m) / l. Equals ``torch.softmax(x, -1)``; n need not be a
    multiple of ``block``.
    """
    _check_tensor("x", x)
    block = check_positive_int("block", block)
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"x must have at least one entry in its last dimension, got shape "
                         f"{tuple(x.shape)}")
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)  # (...)
    ell = torch.zeros_like(m)
    for start in range(0, n, block):
        m_b, l_b, _ = softmax_state(x[..., start:start + block])
        m, ell, _ = merge_softmax_states((m, ell, None), (m_b, l_b, None))
    return torch.exp(x - m.unsqueeze(-1)) / ell.unsqueeze(-1)  # (..., n)


# ------------------------------------------------------------------ tiled attention


def _check_attention_inputs(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, min_ndim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension d_k, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions T_k, got k "
                         f"{tuple(k.shape)} and v {tuple(v.shape)}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k and v must have equal leading dimensions, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if 0 in (q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]):
        raise ValueError(f"q, k and v must have T >= 1 and d >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def _causal_keep(i0: int, i1: int, j0: int, j1: int, device: torch.device) -> Tensor:
    """(i1 - i0, j1 - j0) booleans: query i may see key j when j <= i (top-left aligned)."""
    i = torch.arange(i0, i1, device=device)[:, None]
    j = torch.arange(j0, j1, device=device)[None, :]
    return j <= i


def _empty_state(q_i: Tensor, d_v: int) -> tuple[Tensor, Tensor, Tensor]:
    """The identity state (-inf, 0, 0) for a block of queries q_i (..., Bq, d_k): m, l (..., Bq)
    and o (..., Bq, d_v)."""
    m = torch.full(q_i.shape[:-1], float("-inf"), dtype=q_i.dtype, device=q_i.device)
    return m, torch.zeros_like(m), torch.zeros(*q_i.shape[:-1], d_v, dtype=q_i.dtype,
                                               device=q_i.device)


def flash_attention_reference(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                              block_q: int = 64, block_k: int = 64, scale: float | None = None,
                              return_lse: bool = False,
                              io: dict[str, int] | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Exact attention softmax(scale q k^T) v, computed tile by tile (FlashAttention's forward).

    q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v) with equal leading dimensions
    (e.g. (B, H, T, d)); returns the output (..., T_q, d_v) and, if ``return_lse``, the
    log-sum-exp L (..., T_q) of every query row's scaled scores. ``scale`` defaults to
    1/sqrt(d_k); ``is_causal`` masks top-left aligned (query i sees keys j <= i), as
    ``torch.nn.functional.scaled_dot_product_attention`` does.

    For each block of ``block_q`` queries the state (m, l, o) starts empty and takes in one
    block of ``block_k`` keys at a time (Dao et al., 2022, Algorithm 1, in the loop order of
    FlashAttention-2); the largest intermediate is a (block_q, block_k) tile of scores, never
    the (T_q, T_k) matrix. With a causal mask, key blocks entirely in a query block's future
    are skipped, and only blocks that cross the diagonal are masked. T need not be a multiple
    of the block sizes. Differentiable by autograd (through the tiles).

    ``io``, if given a dict, counts the elements the loop moves between "HBM" (the full
    tensors) and "SRAM" (the tiles), per leading index (one head): ``read`` (each Q_i once,
    each K_j and V_j every time a query block visits it) and ``written`` (each O_i and L_i
    once); compare :func:`attention_hbm_accesses`.
    """
    _check_attention_inputs(q, k, v)
    block_q = check_positive_int("block_q", block_q)
    block_k = check_positive_int("block_k", block_k)
    T_q, T_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    outs, lses = [], []
    if io is not None:
        io.setdefault("read", 0)
        io.setdefault("written", 0)
    for i0 in range(0, T_q, block_q):
        i1 = min(i0 + block_q, T_q)
        q_i = q[..., i0:i1, :]  # (..., Bq, d_k)
        m, ell, o = _empty_state(q_i, v.shape[-1])
        k_end = min(i1, T_k) if is_causal else T_k  # keys j >= i1 are every row's future
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, T_k)
            s = scale * (q_i @ k[..., j0:j1, :].transpose(-2, -1))  # (..., Bq, Bk)
            if is_causal and j1 - 1 > i0:  # the tile crosses the diagonal
                s = s.masked_fill(~_causal_keep(i0, i1, j0, j1, q.device), float("-inf"))
            m, ell, o = merge_softmax_states((m, ell, o), softmax_state(s, v[..., j0:j1, :]))
            if io is not None:  # K_j and V_j loaded for this query block
                io["read"] += (j1 - j0) * (k.shape[-1] + v.shape[-1])
        outs.append(o / ell.unsqueeze(-1))  # (..., Bq, d_v)
        lses.append(m + torch.log(ell))  # (..., Bq)
        if io is not None:  # Q_i loaded once; O_i and L_i stored once
            io["read"] += (i1 - i0) * q.shape[-1]
            io["written"] += (i1 - i0) * (v.shape[-1] + 1)
    out = torch.cat(outs, dim=-2)  # (..., T_q, d_v)
    return (out, torch.cat(lses, dim=-1)) if return_lse else out


def flash_attention_backward_reference(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                       grad_out: Tensor, is_causal: bool = False,
                                       block_q: int = 64, block_k: int = 64,
                                       scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of O = softmax(scale q k^T) v: FlashAttention-2's Algorithm 2.

    Shapes as in :func:`flash_attention_reference`; ``out`` (..., T_q, d_v) and ``lse``
    (..., T_q) are what its forward returned and ``grad_out`` = dL/dO (..., T_q, d_v). This is
    Algorithm 2 of Dao (2023), step for step: D = rowsum(dO * O) is computed once (line 5);
    the outer loop runs over key blocks j, each holding accumulators dK_j = dV_j = 0 on chip
    (lines 7-8); the inner loop over query blocks i recomputes the probabilities from the
    saved log-sum-exp alone, P_ij = exp(S_ij - L_i) (line 12), and

        dV_j += P^T dO_i,  dP = dO_i V_j^T,  dS = P * (dP - D_i),
        dQ_i += scale dS K_j  (read, updated and written back to HBM: line 16),
        dK_j += scale dS^T Q_i;

    dK_j and dV_j are written once, after the inner loop (line 19). FlashAttention's first
    backward (Dao et al., 2022, Algorithm 4) saved the row maxima m and normalisers l instead
    of L and formed D_i inside the inner loop. No (T_q, T_k) matrix is stored. With a causal
    mask (top-left aligned) query blocks that end before key j0 are skipped.
    """
    _check_attention_inputs(q, k, v)
    for name, t in (("out", out), ("lse", lse), ("grad_out", grad_out)):
        _check_tensor(name, t)
    o_shape = (*q.shape[:-1], v.shape[-1])
    if out.shape != o_shape or grad_out.shape != o_shape or lse.shape != q.shape[:-1]:
        raise ValueError(f"need out and grad_out of shape {o_shape} and lse of shape "
                         f"{tuple(q.shape[:-1])}, got out {tuple(out.shape)}, grad_out "
                         f"{tuple(grad_out.shape)} and lse {tuple(lse.shape)}")
    block_q = check_positive_int("block_q", block_q)
    block_k = check_positive_int("block_k", block_k)
    T_q, T_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    D = (grad_out * out).sum(dim=-1)  # (..., T_q), line 5
    dq = torch.zeros_like(q)  # in "HBM", line 4
    dks, dvs = [], []
    for j0 in range(0, T_k, block_k):
        j1 = min(j0 + block_k, T_k)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (..., Bk, d), line 7
        dk_j, dv_j = torch.zeros_like(k_j), torch.zeros_like(v_j)  # on chip, line 8
        first_q = (j0 // block_q) * block_q if is_causal else 0  # earlier queries cannot see j0
        for i0 in range(first_q, T_q, block_q):
            i1 = min(i0 + block_q, T_q)
            q_i, do_i = q[..., i0:i1, :], grad_out[..., i0:i1, :]  # line 10
            s = scale * (q_i @ k_j.transpose(-2, -1))  # (..., Bq, Bk), line 11
            p = torch.exp(s - lse[..., i0:i1, None])  # (..., Bq, Bk), line 12
            if is_causal and j1 - 1 > i0:
                p = p.masked_fill(~_causal_keep(i0, i1, j0, j1, q.device), 0.0)
            dv_j = dv_j + p.transpose(-2, -1) @ do_i  # line 13
            dp = do_i @ v_j.transpose(-2, -1)  # (..., Bq, Bk), line 14
            ds = p * (dp - D[..., i0:i1, None])  # (..., Bq, Bk), line 15
            dq[..., i0:i1, :] += scale * (ds @ k_j)  # line 16
            dk_j = dk_j + scale * (ds.transpose(-2, -1) @ q_i)  # line 17
        dks.append(dk_j)  # line 19: written once
        dvs.append(dv_j)
    return dq, torch.cat(dks, dim=-2), torch.cat(dvs, dim=-2)


class FlashAttentionReferenceFunction(torch.autograd.Function):
    """The tiled forward and the tiled backward joined into one differentiable operation.

    The forward (:func:`flash_attention_reference`) runs without recording a graph and saves
    only q, k, v, the output O and the log-sum-exp L: O(T d) memory instead of the
    (T_q, T_k) probabilities an autograd graph through the tiles would keep. The backward is
    :func:`flash_attention_backward_reference`, which recomputes P tile by tile from L. This
    is how FlashAttention is used in training (Dao et al., 2022, section 3.1). Call it
    through :func:`flash_attention_tiled`, or as ``.apply(q, k, v)`` with the defaults of
    that function.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                block_q: int = 64, block_k: int = 64, scale: float | None = None) -> Tensor:
        out, lse = flash_attention_reference(q, k, v, is_causal=is_causal, block_q=block_q,
                                             block_k=block_k, scale=scale, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = {"is_causal": is_causal, "block_q": block_q, "block_k": block_k,
                       "scale": scale}
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward_reference(q, k, v, out, lse, grad_out.contiguous(),
                                                        **ctx.options)
        return dq, dk, dv, None, None, None, None


def flash_attention_tiled(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                          block_q: int = 64, block_k: int = 64,
                          scale: float | None = None) -> Tensor:
    """softmax(scale q k^T) v with the tiled forward and the tiled, recomputing backward.

    Arguments and shapes as in :func:`flash_attention_reference`; returns (..., T_q, d_v).
    Differentiable with respect to q, k and v through
    :class:`FlashAttentionReferenceFunction`, whose backward keeps no (T_q, T_k) matrix.
    """
    return FlashAttentionReferenceFunction.apply(q, k, v, bool(is_causal), block_q, block_k,
                                                 scale)


# ------------------------------------------------------------------ masks as functions, block sparsity


def causal_mask_mod() -> MaskMod:
    """The causal mask as a ``mask_mod``: ``(b, h, q_idx, kv_idx) -> kv_idx <= q_idx``.

    A ``mask_mod`` (the convention of ``torch.nn.attention.flex_attention``) takes the batch
    and head indices and broadcastable integer tensors of query and key positions and
    returns booleans, True where the query may attend to the key.
    """

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx

    return mask_mod


def sliding_window_mask_mod(window: int) -> MaskMod:
    """Causal sliding-window mask (Mistral 7B, Jiang et al., 2023): query i sees keys
    i - window < j <= i, the ``window`` most recent positions including its own."""
    window = check_positive_int("window", window)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return mask_mod


def document_mask_mod(doc_ids: Tensor) -> MaskMod:
    """Causal attention within packed documents: query i sees key j <= i of its own document.

    ``doc_ids`` (T,) holds the document index of each position of a packed sequence (e.g.
    ``[0, 0, 0, 1, 1, 2, ...]``); the mask is ``doc_ids[i] == doc_ids[j] and j <= i``, so each
    document is attended as if it were a sequence of its own.
    """
    if not isinstance(doc_ids, Tensor) or doc_ids.ndim != 1 or doc_ids.is_floating_point() \
            or doc_ids.dtype == torch.bool or doc_ids.numel() == 0:
        raise TypeError(f"doc_ids must be a non-empty 1-D integer tensor, got "
                        f"{doc_ids if not isinstance(doc_ids, Tensor) else doc_ids.dtype}")

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx)

    return mask_mod


def flash_attention_masked(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod,
                           block_q: int = 64, block_k: int = 64, scale: float | None = None,
                           return_lse: bool = False,
                           blocks: dict[str, int] | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Tiled attention under a mask given as a function, skipping the tiles it hides entirely.

    q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v) as in
    :func:`flash_attention_reference`; ``mask_mod(b, h, q_idx, kv_idx)`` returns True where
    query q_idx may see key kv_idx (e.g. :func:`sliding_window_mask_mod`); it is called with
    b = h = 0, so the mask must be the same for every batch element and head. Returns the
    output (..., T_q, d_v) and, if ``return_lse``, the log-sum-exp (..., T_q). A row that
    sees no key gets output 0 and log-sum-exp -inf, as ``flex_attention`` gives.

    Each (block_q, block_k) tile is classified from the mask alone, before any score is
    computed: *empty* (every entry hidden: skipped, no FLOPs and no loads), *full* (every
    entry visible: no masking needed) or *partial* (masked with -inf). This is the block
    sparsity of FlexAttention's ``BlockMask`` (Dong et al., 2024), whose ``kv_num_blocks``
    counts the partial tiles and ``full_kv_num_blocks`` the full ones. ``blocks``, if given a
    dict, receives the counts ``full``, ``partial`` and ``skipped``.
    """
    _check_attention_inputs(q, k, v)
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be callable, got {type(mask_mod).__name__}")
    block_q = check_positive_int("block_q", block_q)
    block_k = check_positive_int("block_k", block_k)
    T_q, T_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    zero = torch.zeros((), dtype=torch.long, device=q.device)
    counts = {"full": 0, "partial": 0, "skipped": 0}
    outs, lses = [], []
    for i0 in range(0, T_q, block_q):
        i1 = min(i0 + block_q, T_q)
        q_i = q[..., i0:i1, :]  # (..., Bq, d_k)
        m, ell, o = _empty_state(q_i, v.shape[-1])
        i_idx = torch.arange(i0, i1, device=q.device)[:, None]  # (Bq, 1)
        for j0 in range(0, T_k, block_k):
            j1 = min(j0 + block_k, T_k)
            keep = mask_mod(zero, zero, i_idx, torch.arange(j0, j1, device=q.device)[None, :])
            keep = torch.as_tensor(keep, device=q.device).expand(i1 - i0, j1 - j0)  # (Bq, Bk)
            if not keep.any():
                counts["skipped"] += 1
                continue
            s = scale * (q_i @ k[..., j0:j1, :].transpose(-2, -1))  # (..., Bq, Bk)
            if keep.all():
                counts["full"] += 1
            else:
                counts["partial"] += 1
                s = s.masked_fill(~keep, float("-inf"))
            m, ell, o = merge_softmax_states((m, ell, o), softmax_state(s, v[..., j0:j1, :]))
        seen = (ell > 0).unsqueeze(-1)
        outs.append(torch.where(seen, o / torch.where(seen, ell.unsqueeze(-1), 1.0), 0.0))
        lses.append(m + torch.log(ell))  # -inf where no key was seen
    if blocks is not None:
        blocks.update(counts)
    out = torch.cat(outs, dim=-2)  # (..., T_q, d_v)
    return (out, torch.cat(lses, dim=-1)) if return_lse else out


# ------------------------------------------------------------------ split-KV decoding


def split_kv_attention(q: Tensor, k: Tensor, v: Tensor, n_splits: int, scale: float | None = None,
                       return_lse: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of a few queries over a long KV cache, split along the keys (Flash-Decoding).

    q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v); returns (..., T_q, d_v) and, if
    ``return_lse``, the log-sum-exp (..., T_q). The keys are cut into ``n_splits`` contiguous
    chunks of near-equal length; each chunk's normalised output O_c and log-sum-exp L_c are
    computed independently (on a GPU by separate programs, so that a single decoding query
    still fills the machine: Dao et al., 2023, "Flash-Decoding for long-context inference"),
    then combined exactly. A normalised result (L, O) is the online-softmax state
    (m, l, o) = (L, 1, O), so the combination is :func:`merge_softmax_states`:

        L = log sum_c e^(L_c),   O = sum_c e^(L_c - L) O_c.
    """
    _check_attention_inputs(q, k, v)
    n_splits = check_positive_int("n_splits", n_splits)
    T_k = k.shape[-2]
    if n_splits > T_k:
        raise ValueError(f"n_splits must be at most T_k = {T_k}, got {n_splits}")
    edges = [(c * T_k) // n_splits for c in range(n_splits + 1)]
    state: State | None = None
    for j0, j1 in zip(edges, edges[1:], strict=False):
        o_c, lse_c = flash_attention_reference(q, k[..., j0:j1, :], v[..., j0:j1, :],
                                               block_q=q.shape[-2], block_k=j1 - j0, scale=scale,
                                               return_lse=True)  # one tile per chunk
        part = (lse_c, torch.ones_like(lse_c), o_c)
        state = part if state is None else merge_softmax_states(state, part)
    m, ell, o = state
    out = o / ell.unsqueeze(-1)
    return (out, m + torch.log(ell)) if return_lse else out


# ------------------------------------------------------------------ IO and memory


def attention_hbm_accesses(T: int, d: int, sram: int,
                           block_q: int | None = None) -> dict[str, int]:
    """Elements read from and written to HBM by one head of attention, T queries and keys.

    ``standard`` is Dao et al.'s (2022) Algorithm 0: read Q, K, write S; read S, write P;
    read P, V, write O: 4 T d + 4 T^2, that is Theta(T d + T^2).

    ``flash`` is the tiled forward in the loop order of FlashAttention-2 (Dao, 2023): a block
    of ``block_q`` queries is held on chip while blocks of ``block_k`` keys stream past. Q is
    read and O written once (2 T d), the log-sum-exp written once (T), and K and V read once
    per query block, 2 T d ceil(T / block_q). The block sizes are those of Dao et al. (2022),
    Algorithm 1, line 1, with the roles of queries and keys swapped (their outer loop runs
    over keys): the held block has ceil(M / 4d) rows and the streamed one min(ceil(M / 4d), d),
    for M = ``sram`` elements. On chip are then Q_i and O_i (block_q x d each), K_j and V_j
    (block_k x d each) and the score tile S_ij (block_q x block_k); ``sram_used`` is their
    sum, 3M/4 + 2 d^2 when 4d^2 <= M and 4d divides M, so everything fits when M >= 8 d^2.
    The traffic is then Theta(T^2 d^2 / M) (their Theorem 2). ``block_q`` overrides the held
    block (e.g. the 64 or 128 rows real kernels use); the streamed one stays
    min(ceil(M / 4d), d). Returns ``standard``, ``flash``, ``block_q``, ``block_k`` and
    ``sram_used``. Needs 4 d <= sram.
    """
    T, d, sram = (check_positive_int(n, x) for n, x in (("T", T), ("d", d), ("sram", sram)))
    if sram < 4 * d:
        raise ValueError(f"sram={sram} elements cannot hold four blocks of width d={d}; need "
                         f"sram >= 4 d = {4 * d}")
    rows = -(-sram // (4 * d))  # ceil(M / 4d)
    block_q = rows if block_q is None else check_positive_int("block_q", block_q)
    block_k = min(rows, d)
    n_blocks = -(-T // block_q)
    return {"standard": 4 * T * d + 4 * T * T,
            "flash": 2 * T * d + T + 2 * T * d * n_blocks,
            "block_q": block_q, "block_k": block_k,
            "sram_used": 2 * block_q * d + 2 * block_k * d + block_q * block_k}


def attention_arithmetic_intensity(T: int, d: int, sram: int, bytes_per_element: int = 2,
                                   block_q: int | None = None) -> dict[str, float]:
    """FLOPs per byte of HBM traffic of one head's attention forward, standard and tiled.

    Both algorithms do the two matrix products S = Q K^T and O = P V, 2 T^2 d multiply-adds
    each: 4 T^2 d FLOPs (the softmax's O(T^2) operations are left out, as in Dao et al.,
    2022). The bytes are :func:`attention_hbm_accesses` times ``bytes_per_element``. For
    T >> block_q the standard intensity tends to d / bytes_per_element (32 FLOP/B in 16 bits
    for d = 64) and the tiled one to 2 block_q / bytes_per_element. A kernel is memory-bound
    when its intensity is below the GPU's balance point (peak FLOP/s divided by bytes/s).
    ``block_q`` as in :func:`attention_hbm_accesses`. Returns ``flops``, ``standard`` and
    ``flash`` (FLOP/byte) and ``block_q``.
    """
    bytes_per_element = check_positive_int("bytes_per_element", bytes_per_element)
    counts = attention_hbm_accesses(T, d, sram, block_q=block_q)
    flops = 4 * T * T * d
    return {"flops": float(flops),
            "standard": flops / (bytes_per_element * counts["standard"]),
            "flash": flops / (bytes_per_element * counts["flash"]),
            "block_q": counts["block_q"]}


class _SilencedStderr:
    """Redirect file descriptor 2 to /dev/null (the profiler's C++ layer logs start/stop)."""

    def __enter__(self) -> None:
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self.devnull, 2)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)
        os.close(self.devnull)


def peak_memory_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Peak bytes of tensor memory allocated by ``fn(*args, **kwargs)`` above what was live.

    Runs ``fn`` under ``torch.profiler`` with memory profiling; every allocation and free of
    the PyTorch allocator is an event with a signed size, and the peak is the largest
    running sum over the events in time order. The sizes and their order do not depend on
    timing, so on one machine the result is deterministic; the inputs (allocated before)
    are not counted, the output (still live at the end) is.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    from torch.profiler import ProfilerActivity, profile

    with _SilencedStderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*args, **kwargs)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())  # stable: ties keep the recorded order
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


# ------------------------------------------------------------------ Triton


def flash_attention_triton(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                           scale: float | None = None, block_m: int | None = None,
                           block_n: int | None = None) -> Tensor:
    """FlashAttention-2 as Triton kernels, differentiable: see :mod:`llmbook.inference.flash_triton`.

    q, k, v (..., T, d) in float32, float16 or bfloat16 with equal leading dimensions and
    d_k = d_v; returns softmax(scale q k^T) v (..., T_q, d). The forward kernel saves the
    log-sum-exp of each row, the backward kernels recompute P from it. Needs ``triton``
    (Linux); on the CPU, set ``TRITON_INTERPRET=1`` before the first import of triton.
    """
    from llmbook.inference import flash_triton  # imported here, so this module works without triton

    return flash_triton.flash_attention(q, k, v, is_causal=is_causal, scale=scale,
                                        block_m=block_m, block_n=block_n)
