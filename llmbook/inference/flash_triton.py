"""FlashAttention-2 in Triton: a forward kernel and two backward kernels, differentiable.

Introduced in notebooks/14_flash_attention. The kernels follow Dao (2023, "FlashAttention-2:
Faster Attention with Better Parallelism and Work Partitioning"), Algorithms 1 and 2:

* forward: one program per (batch x head, block of BLOCK_M queries). It keeps the
  block of Q, the running max m, normaliser l and unnormalised output in registers and
  loops over blocks of BLOCK_N keys with the online softmax (:mod:`llmbook.inference.flash`); it
  writes O and the log-sum-exp L = m + log l of every row, nothing of size T^2;
* backward: D = rowsum(dO * O) first; then one program per key block accumulates dK and dV
  over the query blocks, and one program per query block accumulates dQ over the key
  blocks. Both recompute P = exp(S - L) from the saved L instead of reading a stored
  attention matrix, and use dS = P * (dP - D) with dP = dO V^T.

Matrix products go through ``tl.dot`` with float32 accumulation; exponentials are base 2
(exp(x) = 2^(x log2 e), with log2 e folded into the score scale). With a causal mask the
forward runs the key blocks left of the diagonal without any mask and masks only the blocks
that cross it; blocks right of it are never visited. Block sizes are compile-time
constants: on a GPU they are autotuned over a few configurations; under the Triton
interpreter (``TRITON_INTERPRET=1``, set before triton is imported, which runs the kernels
on the CPU with NumPy) they default to 16.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - depends on the platform
    raise ImportError(
        "llmbook.inference.flash_triton needs triton (Linux wheels only): pip install triton. "
        "Without it use llmbook.inference.flash.flash_attention_reference."
    ) from exc

__all__ = ["compile_for_gpu", "flash_attention", "flash_attention_forward", "interpreted"]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------ forward


@triton.jit
def _mm(a, b, DOT: tl.constexpr):
    """a @ b accumulated in float32 by ``tl.dot``; DOT is its input precision ("ieee", "tf32").

    DOT = "upcast" multiplies in float32 instead: the interpreter's ``tl.dot`` misreads
    bfloat16 operands, and a product of two bfloat16 numbers is exact in float32, so this
    reproduces what the tensor cores compute.
    """
    if DOT == "upcast":
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=DOT)
    return c


@triton.jit
def _forward_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_n,
                   offs_d, lo, hi, T_k, qk_scale, HEAD_DIM: tl.constexpr,
                   MASK_CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """Fold the key blocks [lo, hi) into the running state (acc, l_i, m_i) of a query block."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        kv_mask = (cols < T_k)[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        s = _mm(q, tl.trans(k), DOT_PRECISION) * qk_scale  # (BM, BN), log2 units
        keep = (cols < T_k)[None, :]
        if MASK_CAUSAL:
            keep = keep & (offs_m[:, None] >= cols[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BM,)
        alpha = tl.math.exp2(m_i - m_new)  # rescales the old state
        p = tl.math.exp2(s - m_new[:, None])  # (BM, BN)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_forward_kernel(Q, K, V, Out, L, stride_qb, stride_qt, stride_kb, stride_kt,
                          stride_vb, stride_vt, stride_ob, stride_ot, T_q, T_k, sm_scale,
                          HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    """O and L for one block of BLOCK_M queries of one (batch, head): grid (T_q / BLOCK_M, B H)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m < T_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(Q + bh * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=q_mask, other=0.0)  # (BM, BD), stays in SRAM/registers
    k_base, v_base = K + bh * stride_kb, V + bh * stride_vb
    qk_scale = sm_scale * 1.4426950408889634  # scores in log2 units: exp2 instead of exp
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if IS_CAUSAL:  # blocks left of the diagonal unmasked, then the diagonal blocks masked
        lo = tl.minimum(pid_m * BLOCK_M, T_k)
        hi = tl.minimum((pid_m + 1) * BLOCK_M, T_k)
        acc, l_i, m_i = _forward_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                       offs_m, offs_n, offs_d, 0, lo, T_k, qk_scale, HEAD_DIM,
                                       False, BLOCK_N, DOT_PRECISION)
        acc, l_i, m_i = _forward_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                       offs_m, offs_n, offs_d, lo, hi, T_k, qk_scale, HEAD_DIM,
                                       True, BLOCK_N, DOT_PRECISION)
    else:
        acc, l_i, m_i = _forward_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt,
                                       offs_m, offs_n, offs_d, 0, T_k, T_k, qk_scale, HEAD_DIM,
                                       False, BLOCK_N, DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(Out + bh * stride_ob + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=q_mask)
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # back to natural log: L = m + log l
    tl.store(L + bh * T_q + offs_m, lse, mask=offs_m < T_q)


# ------------------------------------------------------------------ backward


@triton.jit
def _flash_backward_preprocess(Out, dO, Delta, stride_ob, stride_ot, stride_dob, stride_dot, T_q,
                               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_D: tl.constexpr):
    """Delta = rowsum(dO * O) for one block of query rows (= rowsum(P * dP))."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < T_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(Out + bh * stride_ob + offs_m[:, None] * stride_ot + offs_d[None, :], mask=mask,
                other=0.0).to(tl.float32)
    do = tl.load(dO + bh * stride_dob + offs_m[:, None] * stride_dot + offs_d[None, :], mask=mask,
                 other=0.0).to(tl.float32)
    tl.store(Delta + bh * T_q + offs_m, tl.sum(o * do, 1), mask=offs_m < T_q)


@triton.jit
def _flash_backward_dkdv_kernel(Q, K, V, dO, L, Delta, dK, dV, stride_qb, stride_qt, stride_kb,
                                stride_kt, stride_vb, stride_vt, stride_dob, stride_dot, T_q, T_k,
                                sm_scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK, dV for one block of BLOCK_N keys, looping over query blocks: grid (T_k / BLOCK_N, B H).

    Works with transposed tiles (keys as rows): P^T = exp2(K Q^T scale log2e - L log2e).
    dK and dV of these keys are final when the loop ends, so each is written once.
    dK/dV share K and V, dQ is left to :func:`_flash_backward_dq_kernel`.
    """
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key positions
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n < T_k)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + bh * stride_kb + offs_n[:, None] * stride_kt + offs_d[None, :], mask=kv_mask,
                other=0.0)  # (BN, BD)
    v = tl.load(V + bh * stride_vb + offs_n[:, None] * stride_vt + offs_d[None, :], mask=kv_mask,
                other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    q_base, do_base = Q + bh * stride_qb, dO + bh * stride_dob
    lo = 0
    if IS_CAUSAL:  # queries before the first key of the block cannot see any of it
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(lo, T_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_mask = (offs_m < T_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
        q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dot + offs_d[None, :], mask=q_mask,
                     other=0.0)
        lse = tl.load(L + bh * T_q + offs_m, mask=offs_m < T_q, other=0.0)  # (BM,)
        delta = tl.load(Delta + bh * T_q + offs_m, mask=offs_m < T_q, other=0.0)
        s_t = _mm(k, tl.trans(q), DOT_PRECISION) * qk_scale  # (BN, BM)
        p_t = tl.math.exp2(s_t - (lse * 1.4426950408889634)[None, :])  # P^T, recomputed
        keep = (offs_m < T_q)[None, :] & (offs_n < T_k)[:, None]
        if IS_CAUSAL:
            keep = keep & (offs_m[None, :] >= offs_n[:, None])
        p_t = tl.where(keep, p_t, 0.0)
        dv += _mm(p_t.to(do.dtype), do, DOT_PRECISION)  # P^T dO
        dp_t = _mm(v, tl.trans(do), DOT_PRECISION)  # (dO V^T)^T, (BN, BM)
        ds_t = p_t * (dp_t - delta[None, :])  # dS^T
        dk += _mm(ds_t.to(q.dtype), q, DOT_PRECISION)  # dS^T Q
    dk *= sm_scale
    tl.store(dK + bh * stride_kb + offs_n[:, None] * stride_kt + offs_d[None, :],
             dk.to(dK.dtype.element_ty), mask=kv_mask)
    tl.store(dV + bh * stride_vb + offs_n[:, None] * stride_vt + offs_d[None, :],
             dv.to(dV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _flash_backward_dq_kernel(Q, K, V, dO, L, Delta, dQ, stride_qb, stride_qt, stride_kb,
                              stride_kt, stride_vb, stride_vt, stride_dob, stride_dot, T_q, T_k,
                              sm_scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dQ = scale dS K for one block of BLOCK_M queries, looping over key blocks."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m < T_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(Q + bh * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :], mask=q_mask,
                other=0.0)
    do = tl.load(dO + bh * stride_dob + offs_m[:, None] * stride_dot + offs_d[None, :],
                 mask=q_mask, other=0.0)
    lse2 = tl.load(L + bh * T_q + offs_m, mask=offs_m < T_q, other=0.0) * 1.4426950408889634
    delta = tl.load(Delta + bh * T_q + offs_m, mask=offs_m < T_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    k_base, v_base = K + bh * stride_kb, V + bh * stride_vb
    hi = T_k
    if IS_CAUSAL:  # keys after the block's last query are nobody's past
        hi = tl.minimum((pid_m + 1) * BLOCK_M, T_k)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kv_mask = (offs_n < T_k)[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        s = _mm(q, tl.trans(k), DOT_PRECISION) * qk_scale  # (BM, BN)
        p = tl.math.exp2(s - lse2[:, None])  # recomputed P
        keep = (offs_m < T_q)[:, None] & (offs_n < T_k)[None, :]
        if IS_CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(keep, p, 0.0)
        dp = _mm(do, tl.trans(v), DOT_PRECISION)  # dO V^T
        ds = p * (dp - delta[:, None])
        dq += _mm(ds.to(k.dtype), k, DOT_PRECISION)  # dS K
    dq *= sm_scale
    tl.store(dQ + bh * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :],
             dq.to(dQ.dtype.element_ty), mask=q_mask)


# ------------------------------------------------------------------ launching


def interpreted() -> bool:
    """True if the kernels run under the Triton interpreter (``TRITON_INTERPRET=1`` at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_flash_forward_kernel, InterpretedFunction)


def _fwd_configs() -> list:
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
                                 (64, 64, 4, 4), (128, 32, 4, 4))]


def _bwd_configs() -> list:
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3),
                                 (128, 64, 8, 3), (128, 32, 4, 3))]


_KEY = ["T_q", "T_k", "HEAD_DIM", "IS_CAUSAL"]
_flash_forward_tuned = triton.autotune(_fwd_configs(), key=_KEY)(_flash_forward_kernel)
_flash_backward_dkdv_tuned = triton.autotune(_bwd_configs(), key=_KEY)(_flash_backward_dkdv_kernel)
_flash_backward_dq_tuned = triton.autotune(_bwd_configs(), key=_KEY)(_flash_backward_dq_kernel)


def _check_inputs(q: object, k: object, v: object, block_m: int | None,
                  block_n: int | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the Triton kernels take float32, "
                            f"float16 or bfloat16 (float64: use flash_attention_reference)")
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., T, d), got {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k and v must have equal leading dimensions, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        raise ValueError(f"the kernels need one head dimension d = d_k = d_v, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions T_k, got k "
                         f"{tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or not 1 <= q.shape[-1] <= 256:
        raise ValueError(f"need T_q, T_k >= 1 and 1 <= d <= 256, got q {tuple(q.shape)} and k "
                         f"{tuple(k.shape)}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if interpreted():
        if q.device.type != "cpu":
            raise ValueError(f"under TRITON_INTERPRET=1 the tensors must be on the CPU, got "
                             f"{q.device}")
    elif q.device.type != "cuda":
        raise ValueError(f"the compiled kernels need CUDA tensors, got {q.device}; to run them on "
                         f"the CPU set TRITON_INTERPRET=1 before triton is first imported")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 16
                              or b & (b - 1)):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    if (block_m is None) != (block_n is None):
        raise ValueError(f"give both block_m and block_n or neither, got block_m={block_m}, "
                         f"block_n={block_n}")


def _blocks(block_m: int | None, block_n: int | None) -> tuple[int, int] | None:
    """Explicit block sizes, or None to autotune (GPU); the interpreter defaults to 16 x 16."""
    if block_m is not None:
        return block_m, block_n
    return (16, 16) if interpreted() else None


def _as_3d(t: Tensor) -> Tensor:
    """(..., T, d) -> (B H, T, d), contiguous (a view when t already is)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def _precision(dtype: torch.dtype) -> str:
    """The DOT argument of :func:`_mm` for inputs of this dtype."""
    # float32 inputs: exact IEEE products (tf32 would cost the 1e-5 agreement); 16-bit
    # inputs are multiplied exactly by the tensor cores whatever this says.
    if dtype == torch.bfloat16 and interpreted():
        return "upcast"
    return "ieee" if dtype == torch.float32 else "tf32"


def _forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float,
             blocks: tuple[int, int] | None) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel on (BH, T, d) tensors; returns O (BH, T_q, d), L (BH, T_q)."""
    BH, T_q, d = q.shape
    T_k = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty(BH, T_q, dtype=torch.float32, device=q.device)
    args = (q, k, v, o, lse, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), o.stride(0), o.stride(1), T_q, T_k, scale)
    meta = {"HEAD_DIM": d, "IS_CAUSAL": bool(is_causal),
            "BLOCK_D": max(16, triton.next_power_of_2(d)), "DOT_PRECISION": _precision(q.dtype)}
    if blocks is None:
        grid = lambda META: (triton.cdiv(T_q, META["BLOCK_M"]), BH)  # noqa: E731
        _flash_forward_tuned[grid](*args, **meta)
    else:
        bm, bn = blocks
        if is_causal and bm % bn:
            raise ValueError(f"a causal forward needs block_m a multiple of block_n, got "
                             f"{bm} and {bn}")
        _flash_forward_kernel[(triton.cdiv(T_q, bm), BH)](*args, BLOCK_M=bm, BLOCK_N=bn, **meta)
    return o, lse


def _backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
              is_causal: bool, scale: float,
              blocks: tuple[int, int] | None) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the three backward kernels on (BH, T, d) tensors; returns dq, dk, dv."""
    BH, T_q, d = q.shape
    T_k = k.shape[1]
    do = do.contiguous()
    BLOCK_D = max(16, triton.next_power_of_2(d))
    delta = torch.empty(BH, T_q, dtype=torch.float32, device=q.device)
    _flash_backward_preprocess[(triton.cdiv(T_q, 64), BH)](
        o, do, delta, o.stride(0), o.stride(1), do.stride(0), do.stride(1), T_q,
        HEAD_DIM=d, BLOCK_M=64, BLOCK_D=BLOCK_D)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               do.stride(0), do.stride(1))
    meta = {"HEAD_DIM": d, "IS_CAUSAL": bool(is_causal), "BLOCK_D": BLOCK_D,
            "DOT_PRECISION": _precision(q.dtype)}
    dkdv_args = (q, k, v, do, lse, delta, dk, dv, *strides, T_q, T_k, scale)
    dq_args = (q, k, v, do, lse, delta, dq, *strides, T_q, T_k, scale)
    if blocks is None:
        _flash_backward_dkdv_tuned[lambda META: (triton.cdiv(T_k, META["BLOCK_N"]), BH)](
            *dkdv_args, **meta)
        _flash_backward_dq_tuned[lambda META: (triton.cdiv(T_q, META["BLOCK_M"]), BH)](
            *dq_args, **meta)
    else:
        bm, bn = blocks
        _flash_backward_dkdv_kernel[(triton.cdiv(T_k, bn), BH)](*dkdv_args, BLOCK_M=bm,
                                                                BLOCK_N=bn, **meta)
        _flash_backward_dq_kernel[(triton.cdiv(T_q, bm), BH)](*dq_args, BLOCK_M=bm, BLOCK_N=bn,
                                                              **meta)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """autograd.Function: Triton forward saving (q, k, v, O, L); Triton backward recomputing P.

    ``FlashAttentionFunction.apply(q, k, v)`` works with the defaults of :func:`flash_attention`
    (no mask, scale 1/sqrt(d), automatic tiles); the inputs are checked here too.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                scale: float | None = None, blocks: tuple[int, int] | None = None) -> Tensor:
        _check_inputs(q, k, v, *(blocks if blocks is not None else (None, None)))
        blocks = blocks if blocks is not None else _blocks(None, None)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        q3, k3, v3 = _as_3d(q), _as_3d(k), _as_3d(v)  # (BH, T, d)
        o3, lse = _forward(q3, k3, v3, bool(is_causal), scale, blocks)
        ctx.save_for_backward(q3, k3, v3, o3, lse)
        ctx.is_causal, ctx.scale, ctx.blocks = bool(is_causal), scale, blocks
        ctx.shapes = (q.shape, k.shape, v.shape)
        return o3.view(*q.shape[:-1], v.shape[-1])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q3, k3, v3, o3, lse = ctx.saved_tensors
        do3 = grad_out.reshape(o3.shape)
        dq, dk, dv = _backward(q3, k3, v3, o3, lse, do3, ctx.is_causal, ctx.scale, ctx.blocks)
        q_shape, k_shape, v_shape = ctx.shapes
        return dq.view(q_shape), dk.view(k_shape), dv.view(v_shape), None, None, None


def flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                    scale: float | None = None, block_m: int | None = None,
                    block_n: int | None = None) -> Tensor:
    """softmax(scale q k^T) v by the Triton kernels; differentiable with respect to q, k, v.

    q (..., T_q, d), k and v (..., T_k, d), equal leading dimensions (e.g. (B, H, T, d)),
    float32, float16 or bfloat16; ``scale`` defaults to 1/sqrt(d); ``is_causal`` is top-left
    aligned. ``block_m`` x ``block_n`` is the tile (powers of two >= 16); left out, it is
    autotuned on a GPU and 16 x 16 under the interpreter. Returns (..., T_q, d).
    """
    _check_inputs(q, k, v, block_m, block_n)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return FlashAttentionFunction.apply(q, k, v, bool(is_causal), scale, _blocks(block_m, block_n))


def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                            scale: float | None = None, block_m: int | None = None,
                            block_n: int | None = None) -> tuple[Tensor, Tensor]:
    """The forward kernel alone: (O (..., T_q, d), L (..., T_q) float32 log-sum-exp), no grad."""
    _check_inputs(q, k, v, block_m, block_n)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q3, k3, v3 = _as_3d(q.detach()), _as_3d(k.detach()), _as_3d(v.detach())
    o3, lse = _forward(q3, k3, v3, is_causal, scale, _blocks(block_m, block_n))
    return o3.view(q.shape), lse.view(q.shape[:-1])


def compile_for_gpu(dtype: str = "fp16", head_dim: int = 128, is_causal: bool = True,
                    capability: int = 90, num_warps: int = 8, num_stages: int = 3) -> dict:
    """Compile the four kernels ahead of time for an NVIDIA GPU, which need not be present.

    ``dtype`` is "fp16", "bf16" or "fp32"; ``capability`` the compute capability (90: H100,
    80: A100). Returns {kernel name: triton CompiledKernel}, whose ``asm`` holds the
    intermediate stages ("ttir", "ttgir", "llir", "ptx") and the "cubin". It checks, without
    a GPU, that the kernels are valid Triton for the real compiler and not only for the
    interpreter. Not available under ``TRITON_INTERPRET=1`` (the kernels are Python then).
    """
    if interpreted():
        raise RuntimeError("compile_for_gpu needs the compiled kernels: run it in a process "
                           "without TRITON_INTERPRET=1")
    if dtype not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"dtype must be 'fp16', 'bf16' or 'fp32', got {dtype!r}")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptr = {"L": "*fp32", "Delta": "*fp32"}
    block_d = max(16, triton.next_power_of_2(head_dim))
    common = {"HEAD_DIM": head_dim, "IS_CAUSAL": bool(is_causal), "BLOCK_D": block_d,
              "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32"}
    kernels = {
        "forward": (_flash_forward_kernel, {**common, "BLOCK_M": 128, "BLOCK_N": 64}),
        "backward_preprocess": (_flash_backward_preprocess,
                                {"HEAD_DIM": head_dim, "BLOCK_M": 64, "BLOCK_D": block_d}),
        "backward_dkdv": (_flash_backward_dkdv_kernel, {**common, "BLOCK_M": 32, "BLOCK_N": 128}),
        "backward_dq": (_flash_backward_dq_kernel, {**common, "BLOCK_M": 128, "BLOCK_N": 32}),
    }
    compiled = {}
    for name, (kernel, constants) in kernels.items():
        signature = {}
        for arg in kernel.arg_names:
            if arg in constants:
                signature[arg] = "constexpr"
            elif arg in ("Q", "K", "V", "Out", "dO", "dQ", "dK", "dV", "L", "Delta"):  # pointers
                signature[arg] = ptr.get(arg, "*" + dtype)
            else:
                signature[arg] = "fp32" if arg == "sm_scale" else "i32"
        constexprs = {(kernel.arg_names.index(k),): v for k, v in constants.items()}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled[name] = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                                        options={"num_warps": num_warps,
                                                 "num_stages": num_stages})
    return compiled
