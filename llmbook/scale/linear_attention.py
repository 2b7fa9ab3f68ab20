"""Causal linear attention, in its parallel (masked) form and as a recurrent network.

Katharopoulos, Vyas, Pappas & Fleuret (2020), "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention". Softmax attention weighs value j for query i by
exp(q_i . k_j); linear attention replaces that similarity by a kernel phi(q_i) . phi(k_j)
with a positive feature map phi (their eq. 7, phi(x) = elu(x) + 1). The causal output

    y_t = sum_{s<=t} phi(q_t)^T phi(k_s) v_s^T / sum_{s<=t} phi(q_t)^T phi(k_s)

can be computed two ways that give the same numbers:

* **parallel** (:func:`causal_linear_attention_parallel`): the (T, T) matrix
  phi(Q) phi(K)^T, masked to its lower triangle, times V, divided row by row by its row
  sums: O(T^2) time and memory, like softmax attention;
* **recurrent** (:func:`causal_linear_attention_recurrent`): the state
  S_t = S_{t-1} + phi(k_t) v_t^T (d_k x d_v) and normaliser z_t = z_{t-1} + phi(k_t) (d_k)
  give y_t = S_t^T phi(q_t) / (z_t . phi(q_t)) (their eqs. 18-20): O(T) time and a state of
  fixed size, an RNN.

:func:`causal_linear_attention_cumsum` is the recurrent form vectorised over time (cumulative
sums of the outer products): O(T) time but O(T d_k d_v) memory.

Introduced in notebooks/23_beyond_attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from llmbook.transformer.attention import _check_qkv as check_attention_inputs
from llmbook.validation import check_finite, check_same_dtype

__all__ = [
    "causal_linear_attention_cumsum",
    "causal_linear_attention_parallel",
    "causal_linear_attention_recurrent",
    "elu_feature_map",
]

FeatureMap = Callable[[Tensor], Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1, elementwise: positive everywhere (Katharopoulos et al., eq. 7).

    Equal to x + 1 for x > 0 and exp(x) for x <= 0, and computed that way: elu(x) + 1 =
    (exp(x) - 1) + 1 rounds to 0 once exp(x) is below the rounding unit (x < -37 in float64,
    x < -17 in float32), and a zero feature vector could make a normaliser 0.
    Shapes: (...) -> (...).
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"elu_feature_map expects a floating-point tensor, got "
                        f"{type(x).__name__ if not isinstance(x, Tensor) else x.dtype}")
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


def _check_qkv(q: object, k: object, v: object) -> None:
    """Softmax attention's input checks (chapter 4), and one more: here q and k pair up
    position by position, so they must have the same shape."""
    check_attention_inputs(q, k, v)
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (..., T, d_k), got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if q.shape[-2] == 0:
        raise ValueError(f"q, k and v have no positions (T = 0), got q {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_same_dtype(t, name, q, "q")
        check_finite(t, name)


def _features(q: Tensor, k: Tensor, feature_map: FeatureMap) -> tuple[Tensor, Tensor]:
    if not callable(feature_map):
        raise TypeError(f"feature_map must be callable (..., T, d_k) -> (..., T, m), got "
                        f"{type(feature_map).__name__}")
    phi_q, phi_k = feature_map(q), feature_map(k)
    if phi_q.shape[:-1] != q.shape[:-1] or phi_k.shape != phi_q.shape:
        raise ValueError(f"feature_map must map (..., T, d_k) to (..., T, m), got {tuple(q.shape)} "
                         f"-> {tuple(phi_q.shape)}")
    return phi_q, phi_k


def causal_linear_attention_parallel(q: Tensor, k: Tensor, v: Tensor,
                                     feature_map: FeatureMap = elu_feature_map) -> Tensor:
    """Causal linear attention in its parallel form, O(T^2): like masked softmax attention.

    A = tril(phi(Q) phi(K)^T) (the causal mask sets the upper triangle to 0, not -inf),
    y = (A V) / (A 1), row by row. Shapes: ``q``, ``k`` (..., T, d_k); ``v`` (..., T, d_v)
    -> (..., T, d_v). ``feature_map`` must be positive, so no row sum is 0.
    """
    _check_qkv(q, k, v)
    phi_q, phi_k = _features(q, k, feature_map)
    T = q.shape[-2]
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, 0.0)
    return (scores @ v) / scores.sum(dim=-1, keepdim=True)  # (..., T, d_v)


def causal_linear_attention_recurrent(q: Tensor, k: Tensor, v: Tensor,
                                      feature_map: FeatureMap = elu_feature_map,
                                      return_state: bool = False
                                      ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Causal linear attention as an RNN: one step per position, a state of fixed size.

        S_t = S_{t-1} + phi(k_t) v_t^T      (..., m, d_v),   S_0 = 0
        z_t = z_{t-1} + phi(k_t)            (..., m),        z_0 = 0
        y_t = S_t^T phi(q_t) / (z_t . phi(q_t))

    (Katharopoulos et al., eqs. 18-20). Shapes as :func:`causal_linear_attention_parallel`;
    with ``return_state`` also returns the final (S_T, z_T).
    """
    _check_qkv(q, k, v)
    phi_q, phi_k = _features(q, k, feature_map)
    S = q.new_zeros(*q.shape[:-2], phi_k.shape[-1], v.shape[-1])  # (..., m, d_v)
    z = q.new_zeros(*q.shape[:-2], phi_k.shape[-1])  # (..., m)
    outputs = []
    for t in range(q.shape[-2]):
        S = S + phi_k[..., t, :, None] * v[..., t, None, :]  # outer product phi(k_t) v_t^T
        z = z + phi_k[..., t, :]
        num = (phi_q[..., t, :, None] * S).sum(dim=-2)  # S_t^T phi(q_t): (..., d_v)
        den = (phi_q[..., t, :] * z).sum(dim=-1, keepdim=True)  # (..., 1)
        outputs.append(num / den)
    y = torch.stack(outputs, dim=-2)  # (..., T, d_v)
    return (y, S, z) if return_state else y


def causal_linear_attention_cumsum(q: Tensor, k: Tensor, v: Tensor,
                                   feature_map: FeatureMap = elu_feature_map) -> Tensor:
    """The recurrent form vectorised over time: S_t = cumsum_s phi(k_s) v_s^T.

    Every S_t is materialised at once, (..., T, m, d_v): O(T) time without a Python loop,
    but O(T m d_v) memory (the chunked kernels of later work keep only a few S_t at a time).
    Shapes as :func:`causal_linear_attention_parallel`.
    """
    _check_qkv(q, k, v)
    phi_q, phi_k = _features(q, k, feature_map)
    S = torch.cumsum(phi_k[..., :, None] * v[..., None, :], dim=-3)  # (..., T, m, d_v)
    z = torch.cumsum(phi_k, dim=-2)  # (..., T, m)
    num = (phi_q[..., None] * S).sum(dim=-2)  # (..., T, d_v)
    den = (phi_q * z).sum(dim=-1, keepdim=True)  # (..., T, 1)
    return num / den
