"""Reference solutions to the exercises of notebooks/04_attention (checked by tests/test_solutions_04.py)."""

from __future__ import annotations

import math

import sympy as sp
import torch

from llmbook.transformer.attention import (
    MultiHeadAttention,
    attention_weights,
    scaled_dot_product_attention,
)


def padding_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """Exercise 1: (B,) sequence lengths -> (B, 1, 1, T) booleans, True at real tokens.

    The two singleton axes broadcast over the heads and the query positions, so key j of
    sequence b may be attended to exactly when j < lengths[b].
    """
    if lengths.ndim != 1 or lengths.dtype.is_floating_point:
        raise ValueError(f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)} "
                         f"and dtype {lengths.dtype}")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > T):
        raise ValueError(f"lengths must lie in [1, T={T}], got {lengths.tolist()}")
    keep = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    return keep[:, None, None, :]  # (B, 1, 1, T)


def score_moments() -> tuple[sp.Expr, sp.Expr, sp.Expr, tuple[sp.Symbol, sp.Symbol, sp.Symbol]]:
    """Exercise 2: E[q.k], Var(q.k) and the unit-variance scale for components with mean mu
    and variance sigma^2, i.i.d. across the d_k components of q and k.

    From section 4.3: E[s] = d m1^2 and E[s^2] = d m2^2 + d (d - 1) m1^4 with m1 = mu and
    m2 = sigma^2 + mu^2. The result: E = d mu^2, Var = d sigma^2 (sigma^2 + 2 mu^2).
    """
    mu = sp.Symbol("mu", real=True)
    sigma = sp.Symbol("sigma", positive=True)
    d = sp.Symbol("d_k", integer=True, positive=True)
    m1, m2 = mu, sigma**2 + mu**2
    mean = d * m1**2
    var = sp.factor(sp.expand(d * m2**2 + d * (d - 1) * m1**4 - mean**2))
    scale = 1 / sp.sqrt(var)
    return mean, var, scale, (mu, sigma, d)


def mha_to_gqa(mha: MultiHeadAttention, n_kv_heads: int) -> MultiHeadAttention:
    """Exercise 3: mean-pool the key and value heads of each group (Ainslie et al., 2023).

    KV head g of the result is the mean of the heads g * r, ..., g * r + r - 1 of ``mha``
    (r = H / H_kv), matching the rule that query head h reads KV head h // r. The query and
    output projections are copied unchanged.
    """
    if mha.n_kv_heads != mha.n_heads:
        raise ValueError(f"expected a multi-head layer (n_kv_heads = n_heads = {mha.n_heads}), "
                         f"got n_kv_heads={mha.n_kv_heads}")
    w = mha.q_proj.weight
    gqa = MultiHeadAttention(mha.d_model, mha.n_heads, n_kv_heads, d_head=mha.d_head,
                             qkv_bias=mha.q_proj.bias is not None,
                             out_bias=mha.o_proj.bias is not None, scale=mha.scale,
                             fused=mha.fused, device=w.device, dtype=w.dtype)
    r, dh = mha.n_heads // n_kv_heads, mha.d_head
    with torch.no_grad():
        gqa.q_proj.load_state_dict(mha.q_proj.state_dict())
        gqa.o_proj.load_state_dict(mha.o_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(mha, name), getattr(gqa, name)
            W = src.weight.view(n_kv_heads, r, dh, mha.d_model).mean(dim=1)  # (H_kv, d_head, d)
            dst.weight.copy_(W.reshape(n_kv_heads * dh, mha.d_model))
            if src.bias is not None:
                dst.bias.copy_(src.bias.view(n_kv_heads, r, dh).mean(dim=1).reshape(-1))
    return gqa


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                       mask: torch.Tensor | None = None, is_causal: bool = False,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exercise 4: dL/dq, dL/dk, dL/dv for z = softmax(q k^T s + mask) v, without autograd.

    Shapes as in ``scaled_dot_product_attention``; ``grad_out`` is dL/dz (..., T_q, d_v).
    With A the attention weights and G = grad_out:
    dV = A^T G, dA = G V^T, dS = A * (dA - rowsum(A * dA)), dQ = s dS K, dK = s dS^T Q.
    Masked entries have A = 0 and so get dS = 0.
    """
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    A = attention_weights(q, k, mask=mask, is_causal=is_causal, scale=s)  # (..., T_q, T_k)
    dv = A.transpose(-2, -1) @ grad_out  # (..., T_k, d_v)
    dA = grad_out @ v.transpose(-2, -1)  # (..., T_q, T_k)
    dS = A * (dA - (A * dA).sum(dim=-1, keepdim=True))  # softmax backward, row by row
    dq = s * dS @ k  # (..., T_q, d_k)
    dk = s * dS.transpose(-2, -1) @ q  # (..., T_k, d_k)
    return dq, dk, dv


def qk_norm_weight_floor(d_head: int, T: int) -> float:
    """Exercise 5: the smallest weight a key can get under QK-norm with unit gains, T keys.

    RMS-normalised vectors have length sqrt(d_head), so by Cauchy-Schwarz the scaled score
    q.k / sqrt(d_head) lies in [-sqrt(d_head), sqrt(d_head)]. A key's weight is smallest when
    its score is the lowest possible and the T - 1 others the highest:
    e^{-r} / (e^{-r} + (T - 1) e^{r}) = 1 / (1 + (T - 1) e^{2r}), r = sqrt(d_head).
    """
    r = math.sqrt(d_head)
    return 1.0 / (1.0 + (T - 1) * math.exp(2 * r))


def sink_as_extra_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Exercise 6: sink attention as ordinary attention over one extra key with a zero value.

    q (..., H, T_q, d), k (..., H, T_k, d), v (..., H, T_k, d_v), sinks (H,) -> (..., H, T_q, d_v).
    The extra key is the zero vector (score 0); a float mask adds s_h to its column, so its
    logit is s_h for every query; its value is zero, so it takes weight and adds nothing.
    """
    lead, T_q, T_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    k_ext = torch.cat([k, k.new_zeros(*lead, 1, k.shape[-1])], dim=-2)  # (..., H, T_k + 1, d)
    v_ext = torch.cat([v, v.new_zeros(*lead, 1, v.shape[-1])], dim=-2)  # (..., H, T_k + 1, d_v)
    add = q.new_zeros(*lead, T_q, T_k)  # float mask over the real keys
    if mask is not None:
        add = add.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else add + mask
    sink_col = sinks.to(q.dtype).view(-1, 1, 1).expand(*lead, T_q, 1)  # (..., H, T_q, 1)
    return scaled_dot_product_attention(q, k_ext, v_ext, mask=torch.cat([add, sink_col], dim=-1),
                                        scale=1.0 / math.sqrt(q.shape[-1]))


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
