"""Scaled dot-product attention, causal masks and multi-head (grouped-query) attention.

Introduced in notebooks/04_attention. Attention (Vaswani et al., 2017, "Attention Is All
You Need", eq. 1) mixes the value vectors of T_k positions with weights computed from
queries and keys:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V,

Q (T_q, d_k), K (T_k, d_k), V (T_k, d_v) -> (T_q, d_v). The 1/sqrt(d_k) keeps the scores at
unit variance whatever d_k (Var(q.k) = d_k for independent unit-variance components), so the
softmax does not saturate. Multi-head attention runs H such attentions side by side on
d_model / H wide slices; grouped-query attention (Ainslie et al., 2023, "GQA: Training
Generalized Multi-Query Transformer Models from Multi-Head Checkpoints") lets groups of
query heads share one key/value head, and multi-query attention (Shazeer, 2019, "Fast
Transformer Decoding: One Write-Head is All You Need") is the case of a single shared head.

Conventions (the same as ``torch.nn.functional.scaled_dot_product_attention``):

* a boolean mask is True where a query *may* attend to a key; a float mask is added to
  the scores (-inf removes a key);
* ``is_causal=True`` masks with a top-left aligned lower triangle: query i sees keys
  j <= i, also when T_q != T_k. For queries that are the *last* T_q of T_k positions (a
  KV cache), build the bottom-right aligned mask with ``causal_mask(T_q, T_k,
  offset=T_k - T_q)``;
* a query row whose keys are all masked gets zero weights and a zero output, never NaN.

Contents:

* :func:`causal_mask` - the boolean lower-triangular mask, with an offset;
* :func:`attention_weights` - A = softmax(Q K^T * scale + mask), rows summing to 1;
* :func:`attention_entropy` - the entropy of each attention row, from scores or weights;
* :func:`scaled_dot_product_attention` - A V;
* :func:`minimal_multi_head_attention` - causal multi-head attention in a dozen lines, the
  teaching version of :class:`MultiHeadAttention`;
* :class:`MultiHeadAttention` - projections, heads, GQA, an optional rotary embedding, any
  leading batch dimensions;
* :func:`attention_flops` - the closed-form multiply-add count of one attention layer;
* :func:`soft_cap` - Gemma 2's logit soft-capping c tanh(s / c), the ``softcap`` option of
  :func:`attention_weights` and :class:`MultiHeadAttention` (QK-norm, the other guard against
  growing scores, is ``llmbook.transformer.model.QKNormAttention``);
* :func:`sliding_window_reach` - how far back L layers of sliding-window attention see,
  L (W - 1) positions (the mask itself is
  ``llmbook.inference.attention_variants.sliding_window_mask``);
* :func:`sink_attention_weights` - attention with a learned per-head sink logit in the
  softmax denominator (gpt-oss), whose rows may leave weight "nowhere".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.validation import check_finite, check_floating_tensor, check_positive_int

__all__ = [
    "AttentionCache",
    "MultiHeadAttention",
    "attention_entropy",
    "attention_flops",
    "attention_weights",
    "causal_mask",
    "minimal_multi_head_attention",
    "scaled_dot_product_attention",
    "sink_attention_weights",
    "sliding_window_reach",
    "soft_cap",
]


@runtime_checkable
class AttentionCache(Protocol):
    """What the transformer needs of a key/value cache: the interface, not the cache.

    The cache itself is inference code (chapter 12, :class:`llmbook.inference.kvcache.KVCache`
    implements this). The transformer of Part II only writes into one, so it names the few
    attributes and methods it uses here instead of importing Part IV: dependencies in the
    package point back to earlier parts only.

    ``update(layer, k, v)`` stores the new keys and values (B, H_kv, T_new, d_head) of one
    layer at positions ``length ..`` and returns all of them so far (B, H_kv, T_k, d_head);
    ``advance(n)`` moves ``length`` on once every layer has been updated.
    """

    n_layers: int
    batch_size: int
    n_kv_heads: int
    d_head: int
    max_seq_len: int
    length: int

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...

    def advance(self, num_positions: int) -> None: ...


def causal_mask(T_q: int, T_k: int | None = None, offset: int = 0,
                device: torch.device | str | None = None) -> Tensor:
    """The causal mask: (T_q, T_k) booleans, True where query i may attend to key j.

    Query i may attend to key j when j <= i + offset. With ``offset=0`` this is the
    top-left aligned lower triangle ``torch.ones(T_q, T_k).tril()`` that PyTorch uses for
    ``is_causal=True``. With ``offset = T_k - T_q`` it is bottom-right aligned: the queries
    are the last T_q of the T_k positions, as when new tokens attend to a KV cache.
    ``T_k`` defaults to ``T_q``.
    """
    T_q = check_positive_int("T_q", T_q)
    T_k = T_q if T_k is None else check_positive_int("T_k", T_k)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {offset!r}")
    i = torch.arange(T_q, device=device)[:, None]  # (T_q, 1) query positions
    j = torch.arange(T_k, device=device)[None, :]  # (1, T_k) key positions
    return j <= i + offset  # (T_q, T_k)


def _check_qkv(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., T, d), got {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension d_k, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions T_k, got k "
                         f"{tuple(k.shape)} and v {tuple(v.shape)}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k and v must have equal leading dimensions, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}")


def _check_mask(mask: object, scores_shape: tuple[int, ...]) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be boolean (True = may attend) or floating point (added to "
                        f"the scores), got {mask.dtype}")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
                         f"shape (..., T_q, T_k) = {scores_shape}")


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """Logit soft-capping: cap * tanh(x / cap), elementwise, same shape as ``x``.

    Gemma 2 (Riviere et al., 2024, "Gemma 2: Improving Open Language Models at a Practical
    Size", section 2) caps its attention scores at 50 and its final logits at 30 this way:
    the map has slope 1 at 0 (small scores pass almost unchanged) and stays strictly inside
    (-cap, cap), so no score can grow without bound. ``cap`` must be a positive number.
    """
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive finite number, got cap={cap!r}")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    return cap * torch.tanh(x / cap)


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None, is_causal: bool = False,
                      scale: float | None = None, softcap: float | None = None) -> Tensor:
    """The attention matrix A = softmax(q k^T * scale + mask): (..., T_q, T_k).

    ``q`` (..., T_q, d_k) and ``k`` (..., T_k, d_k) with equal leading dimensions; ``scale``
    defaults to 1/sqrt(d_k). ``mask`` broadcasts to (..., T_q, T_k): boolean, True where a
    query may attend, or floating point, added to the scores. ``is_causal`` applies
    :func:`causal_mask` (top-left aligned) and excludes ``mask``. Each row sums to 1, except
    a row with every key masked, which is all zeros (not NaN). ``softcap`` (default None)
    passes the scaled scores through :func:`soft_cap` before the mask, as Gemma 2 does.
    """
    _check_qkv(q, k, k)
    if mask is not None and is_causal:
        raise ValueError("give either mask or is_causal=True, not both (combine them into one "
                         "mask, e.g. mask & causal_mask(T_q, T_k))")
    T_q, T_k = q.shape[-2], k.shape[-2]
    scores_shape = (*q.shape[:-2], T_q, T_k)
    if mask is not None:
        _check_mask(mask, scores_shape)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if is_causal:
        mask = causal_mask(T_q, T_k, device=q.device)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.to(scores.dtype)
    if mask is None:
        return torch.softmax(scores, dim=-1)
    # A row with every key masked has no softmax; give it zero weights. Its scores are set
    # to 0 first so that neither the forward nor the backward pass ever meets exp(-inf)/0.
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., T_q, 1)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return weights.masked_fill(dead, 0.0)  # (..., T_q, T_k)


def attention_entropy(scores: Tensor | None = None, *, weights: Tensor | None = None) -> Tensor:
    """Entropy H = -sum_j p_j log p_j of each attention row, in nats: (..., T_q, T_k) -> (..., T_q).

    Give either the ``scores`` (p = softmax over the last dimension, computed from the stable
    log-softmax; a key with score -inf has p = 0) or the ``weights`` p themselves (rows summing
    to 1, e.g. from :func:`attention_weights`). H lies in [0, log T_k]: 0 for a one-hot row,
    log T_k for a uniform one, and e^H is the number of keys a row spreads over (k equal
    weights give H = log k). Terms with p_j = 0 count 0, the limit of p log p; a row with
    every key masked (all scores -inf, or all weights 0, :func:`attention_weights`'s
    convention) has entropy 0. Introduced in notebooks/04_attention (section 4.3).
    """
    if (scores is None) == (weights is None):
        raise ValueError("give exactly one of scores (before the softmax) and weights (after it)")
    name, x = ("scores", scores) if weights is None else ("weights", weights)
    x = check_floating_tensor(x, name)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (..., T_k) with T_k >= 1, got {tuple(x.shape)}")
    check_finite(x, name, allow_inf=True)
    if weights is None:
        if bool(torch.isposinf(x).any()):
            raise ValueError("scores must not hold +inf (only -inf, for a masked key)")
        logp = torch.log_softmax(x, dim=-1)  # (..., T_k); NaN on a row of all -inf
        p = logp.exp()
        return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)  # (...)
    sums = x.sum(dim=-1)
    tol = torch.finfo(x.dtype).eps ** 0.5
    off = ((sums - 1).abs() > tol) & (sums != 0)
    if bool((x < 0).any()) or bool(torch.isinf(x).any()) or bool(off.any()):
        raise ValueError(f"weights must be finite, >= 0, with rows summing to 1 (or 0 for a fully "
                         f"masked row); got row sums from {sums.min().item():.4g} to "
                         f"{sums.max().item():.4g} and minimum {x.min().item():.4g}")
    return -torch.special.xlogy(x, x).sum(dim=-1)  # (...)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 is_causal: bool = False, scale: float | None = None,
                                 softcap: float | None = None) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V (Vaswani et al., 2017, eq. 1).

    Shapes: ``q`` (..., T_q, d_k), ``k`` (..., T_k, d_k), ``v`` (..., T_k, d_v) with the same
    leading dimensions (no silent broadcasting between them) -> (..., T_q, d_v).
    ``mask``, ``is_causal``, ``scale`` and ``softcap`` as in :func:`attention_weights`, which follow
    ``torch.nn.functional.scaled_dot_product_attention``: a boolean mask is True where a query
    may attend; ``is_causal`` is top-left aligned when T_q != T_k; a query with every key
    masked outputs zeros. Raises ``ValueError`` naming the shapes when they do not fit.
    """
    _check_qkv(q, k, v)
    weights = attention_weights(q, k, mask=mask, is_causal=is_causal, scale=scale, softcap=softcap)
    return weights @ v  # (..., T_q, d_v)


def sliding_window_reach(n_layers: int, window: int) -> int:
    """How many positions back L stacked sliding-window layers can carry information: L (W - 1).

    One layer with window W lets position i read positions i - W + 1 .. i (Beltagy, Peters &
    Cohan, 2020, "Longformer", section 3.1; Jiang et al., 2023, "Mistral 7B", section 2). A
    second layer reads those positions' outputs, each of which already holds W - 1 positions
    of its own past, so the reach grows by W - 1 per layer: r_L = r_{L-1} + (W - 1), r_0 = 0,
    hence r_L = L (W - 1). ``window = 1`` (each token sees only itself) reaches nothing.
    """
    return check_positive_int("n_layers", n_layers) * (check_positive_int("window", window) - 1)


def sink_attention_weights(q: Tensor, k: Tensor, sinks: Tensor, mask: Tensor | None = None,
                           scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Attention weights with one learned sink logit per head: (weights, sink_weight).

    ``q`` (..., H, T_q, d_k), ``k`` (..., H, T_k, d_k), ``sinks`` (H,) -> weights
    (..., H, T_q, T_k) and sink_weight (..., H, T_q). The sink s_h of head h is an extra
    logit in every row's softmax that belongs to no key (OpenAI, 2025, "gpt-oss-120b &
    gpt-oss-20b Model Card"; Xiao et al., 2023, "Efficient Streaming Language Models with
    Attention Sinks", trained a sink token to this end): with scores z_j = q.k_j * scale,

        a_j = e^{z_j} / (e^{s_h} + sum_i e^{z_i}),   sink_weight = e^{s_h} / (e^{s_h} + sum_i e^{z_i}),

    so a row's weights sum to 1 - sink_weight and a query may put weight "nowhere" (the
    sink contributes no value). ``mask`` and ``scale`` as in :func:`attention_weights`; a row
    with every key masked gives all its weight to the sink (weights 0, sink_weight 1).
    """
    _check_qkv(q, k, k)
    if q.ndim < 3:
        raise ValueError(f"q must have shape (..., H, T_q, d_k), got {tuple(q.shape)}")
    H = q.shape[-3]
    if not isinstance(sinks, Tensor) or not sinks.is_floating_point():
        raise TypeError(f"sinks must be a floating-point tensor, got "
                        f"{getattr(sinks, 'dtype', type(sinks).__name__)}")
    if sinks.shape != (H,):
        raise ValueError(f"sinks must have shape (H,) = ({H},), one logit per head, got {tuple(sinks.shape)}")
    T_q, T_k = q.shape[-2], k.shape[-2]
    if mask is not None:
        _check_mask(mask, (*q.shape[:-2], T_q, T_k))
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., H, T_q, T_k)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.to(scores.dtype)
    s = sinks.to(scores.dtype).view(H, 1, 1).expand(*scores.shape[:-1], 1)  # (..., H, T_q, 1)
    log_z = torch.logsumexp(torch.cat([scores, s], dim=-1), dim=-1, keepdim=True)  # log denominator
    return torch.exp(scores - log_z), torch.exp(s - log_z)[..., 0]


def _check_minimal_args(x: object, weights: dict[str, object], n_heads: object) -> None:
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim < 2:
        got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point tensor of shape (..., T, d), got {got}")
    d = x.shape[-1]
    for name, w in weights.items():
        if not isinstance(w, Tensor) or w.ndim != 2:
            got = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
            raise TypeError(f"{name} must be a 2-d tensor, got {got}")
    D = weights["W_q"].shape[1]
    for name, want in (("W_q", (d, D)), ("W_k", (d, D)), ("W_v", (d, D)), ("W_o", (D, d))):
        if tuple(weights[name].shape) != want:
            raise ValueError(f"{name} must have shape {want} for x of shape {tuple(x.shape)} and "
                             f"W_q of shape {tuple(weights['W_q'].shape)}, got "
                             f"{tuple(weights[name].shape)}")
    if D % n_heads != 0:
        raise ValueError(f"the width of W_q, {D}, is not divisible by n_heads={n_heads}")


def minimal_multi_head_attention(x: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, W_o: Tensor,
                                 n_heads: int) -> Tensor:
    """Causal multi-head self-attention in its shortest form, the teaching version.

    Vaswani et al. (2017), section 3.2.2, with the book's conventions: ``x`` (..., T, d),
    ``W_q``, ``W_k``, ``W_v`` (d, D) with D = n_heads d_head, ``W_o`` (D, d); no biases, no
    cache, no grouped heads, no fused kernel. Returns (..., T, d). Equal to
    :class:`MultiHeadAttention` with ``q_proj.weight = W_q.T`` and so on (tested).
    """
    _check_minimal_args(x, {"W_q": W_q, "W_k": W_k, "W_v": W_v, "W_o": W_o}, n_heads)
    T, d_head = x.shape[-2], W_q.shape[1] // n_heads

    def split(t: Tensor) -> Tensor:  # (..., T, D) -> (..., H, T, d_head)
        return t.unflatten(-1, (n_heads, d_head)).transpose(-3, -2)

    q, k, v = split(x @ W_q), split(x @ W_k), split(x @ W_v)  # (..., H, T, d_head)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (..., H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # j > i
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    z = (weights @ v).transpose(-3, -2).flatten(-2)  # (..., T, D): heads side by side
    return z @ W_o  # (..., T, d)


Rope = Callable[[Tensor, Tensor], Tensor]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with grouped-query attention and an optional rotary embedding.

    Vaswani et al. (2017), section 3.2.2: with H heads of width d_head, head h attends with
    Q_h = X W_Q^h, K_h = X W_K^h, V_h = X W_V^h, and the heads' outputs, concatenated, are
    projected back by W_O. Grouped-query attention (Ainslie et al., 2023) has only H_kv key
    and value heads; query head h uses KV head h // (H / H_kv), as in Hugging Face's
    ``repeat_kv``. H_kv = 1 is multi-query attention (Shazeer, 2019).

    Parameters are four ``nn.Linear`` layers named as in Llama and Qwen2, so their state
    dicts map one to one: ``q_proj`` (d_model -> H d_head), ``k_proj`` and ``v_proj``
    (d_model -> H_kv d_head), ``o_proj`` (H d_head -> d_model). ``bias`` sets all biases;
    ``qkv_bias`` and ``out_bias`` override it for the input and output projections
    (Qwen2: ``qkv_bias=True, out_bias=False``; GPT-2: ``bias=True`` with its fused c_attn
    split into the three input projections). ``d_head`` defaults to d_model / H; ``scale``
    to 1/sqrt(d_head).

    ``fused=True`` computes the attention step with PyTorch's fused
    ``torch.nn.functional.scaled_dot_product_attention`` instead of the book's
    :func:`scaled_dot_product_attention`; the two agree to round-off (tested), the fused
    kernel is faster and uses less memory.

    ``softcap`` (default None) soft-caps the scaled scores (Gemma 2's
    ``attn_logit_softcapping``, see :func:`soft_cap`); PyTorch's fused kernel has no
    soft-capping, so with ``softcap`` the book's attention runs even when ``fused``.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 d_head: int | None = None, bias: bool = False, qkv_bias: bool | None = None,
                 out_bias: bool | None = None, scale: float | None = None, fused: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 softcap: float | None = None) -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads",
                                                                                 n_kv_heads)
        if d_head is None:
            if d_model % n_heads != 0:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; "
                                 f"give d_head explicitly")
            d_head = d_model // n_heads
        self.d_head = check_positive_int("d_head", d_head)
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        self.scale = 1.0 / math.sqrt(self.d_head) if scale is None else float(scale)
        self.fused = bool(fused)
        qkv_bias = bias if qkv_bias is None else qkv_bias
        out_bias = bias if out_bias is None else out_bias
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(d_model, self.n_heads * self.d_head, bias=qkv_bias, **kw)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.d_head, bias=qkv_bias, **kw)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.d_head, bias=qkv_bias, **kw)
        self.o_proj = nn.Linear(self.n_heads * self.d_head, d_model, bias=out_bias, **kw)
        if softcap is not None:
            soft_cap(torch.zeros(1), softcap)  # validates softcap
        self.softcap = None if softcap is None else float(softcap)

    def split_heads(self, x: Tensor, n: int) -> Tensor:
        """(..., T, n d_head) -> (..., n, T, d_head): a view and a transpose, no copy."""
        return x.unflatten(-1, (n, self.d_head)).transpose(-3, -2)  # (..., n, T, d_head)

    def _check_x_and_positions(self, x: object, positions: object) -> None:
        if not isinstance(x, Tensor) or x.ndim < 2 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (..., T, d_model={self.d_model}), got {shape}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        if positions is None:
            return
        if not isinstance(positions, Tensor):
            raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
        T = x.shape[-2]
        allowed = [(T,), (1, T)] + ([(x.shape[0], T)] if x.ndim >= 3 else [])
        if tuple(positions.shape) not in allowed:
            raise ValueError(f"positions must have shape (T,), (1, T) or (B, T) with B = x.shape[0] "
                             f"(x of shape {tuple(x.shape)} allows {allowed}), got "
                             f"{tuple(positions.shape)}")

    def normalise_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The hook between projection and rotation: returns (q, k) unchanged here.

        ``q`` (..., H, T, d_head), ``k`` (..., H_kv, T, d_head). A subclass that normalises
        the queries and keys (``llmbook.transformer.model.QKNormAttention``) overrides only this.
        """
        return q, k

    def project_qkv(self, x: Tensor, positions: Tensor | None = None,
                    rope: Rope | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (..., H, T, d_head) and keys, values (..., H_kv, T, d_head) for x (..., T, d_model).

        Any leading dimensions work, as in torch: (T, d_model), (B, T, d_model),
        (B, C, T, d_model), ... ``rope(t, positions)`` (chapter 5's ``RotaryEmbedding`` has
        this signature), if given, rotates the queries and keys; ``positions`` (T,), (1, T)
        or (B, T) with B = x.shape[0] (one row per entry of the first dimension) defaults to
        0, 1, ..., T-1. Between the projections and the rotation, :meth:`normalise_qk` may
        change the queries and keys (the identity here; QK-norm in a subclass).
        """
        self._check_x_and_positions(x, positions)
        q = self.split_heads(self.q_proj(x), self.n_heads)  # (..., H, T, d_head)
        k = self.split_heads(self.k_proj(x), self.n_kv_heads)  # (..., H_kv, T, d_head)
        v = self.split_heads(self.v_proj(x), self.n_kv_heads)  # (..., H_kv, T, d_head)
        q, k = self.normalise_qk(q, k)
        if rope is not None:
            if positions is None:
                positions = torch.arange(x.shape[-2], device=x.device)  # (T,)
            q, k = rope(q, positions), rope(k, positions)
        return q, k, v

    def forward(self, x: Tensor, positions: Tensor | None = None, rope: Rope | None = None,
                mask: Tensor | None = None, is_causal: bool = True,
                attn_bias: Tensor | None = None, cache: AttentionCache | None = None,
                layer: int = 0) -> Tensor:
        """Self-attention of x (..., T, d_model) -> (..., T, d_model), usually (B, T, d_model).

        Any leading dimensions work, as in torch; each (T, d_model) slice attends within
        itself. ``is_causal`` (default True, a decoder) lets position i see positions j <= i.
        ``mask`` (boolean, True = may attend, broadcasting to (..., H, T, T_k)), e.g. a padding
        mask, is combined with the causal mask by logical and. ``attn_bias`` (float,
        broadcasting to (..., H, T, T_k)) is added to the scaled scores, e.g. ALiBi's -m_h (i - j).
        ``positions`` and ``rope`` as in :meth:`project_qkv`. With a ``cache``
        (:class:`~llmbook.inference.kvcache.KVCache`, chapter 12; x must then be (B, T, d_model))
        the new keys and values are appended to those of ``layer`` and the T queries attend over
        all T_k cached positions with the bottom-right aligned causal mask; without one, T_k = T.
        """
        if cache is not None and isinstance(x, Tensor) and x.ndim != 3:
            raise ValueError(f"with a cache, x must have shape (B, T, d_model={self.d_model}), "
                             f"got {tuple(x.shape)}")
        q, k, v = self.project_qkv(x, positions, rope)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H_kv, T_k, d_head): cached + new
        lead, T = q.shape[:-3], q.shape[-2]
        T_k = k.shape[-2]
        scores_shape = (*lead, self.n_heads, T, T_k)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError(f"mask must be a boolean tensor (True = may attend), got "
                                f"{getattr(mask, 'dtype', type(mask).__name__)}; pass an "
                                f"additive float mask as attn_bias")
            _check_mask(mask, scores_shape)
        if attn_bias is not None:
            if not isinstance(attn_bias, Tensor) or not attn_bias.is_floating_point():
                raise TypeError(f"attn_bias must be a floating-point tensor added to the scores, "
                                f"got {getattr(attn_bias, 'dtype', type(attn_bias).__name__)}")
            _check_mask(attn_bias, scores_shape)
        if is_causal:
            causal = causal_mask(T, T_k, offset=T_k - T, device=x.device)  # (T, T_k)
            mask = causal if mask is None else mask & causal
        if attn_bias is not None:  # fold the boolean mask into the bias: -inf where masked
            bias = attn_bias.to(q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        groups = self.n_heads // self.n_kv_heads
        if self.fused and self.softcap is None:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                               enable_gqa=groups > 1)  # (..., H, T, d_head)
        else:
            k = k.repeat_interleave(groups, dim=-3)  # (..., H, T_k, d_head): head h uses h // groups
            v = v.repeat_interleave(groups, dim=-3)
            z = scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale, softcap=self.softcap)
        z = z.transpose(-3, -2).flatten(-2)  # (..., T, H d_head)
        return self.o_proj(z)  # (..., T, d_model)

    def extra_repr(self) -> str:
        extra = f", softcap={self.softcap}" if self.softcap is not None else ""
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"d_head={self.d_head}, fused={self.fused}{extra}")


def attention_flops(T: int, d_model: int, n_heads: int = 1, n_kv_heads: int | None = None,
                    d_head: int | None = None, T_k: int | None = None) -> dict[str, int]:
    """Floating-point operations of one attention layer on T query positions (batch 1).

    A matrix product (m, n) @ (n, p) costs 2 m n p (a multiply and an add per term). With
    D = H d_head and D_kv = H_kv d_head:

    * ``projections``: queries and output 2 T d D each, keys and values 2 T d D_kv each;
      for H_kv = H and D = d this is 8 T d^2;
    * ``scores`` Q K^T: 2 T T_k D;  ``mix`` A V: 2 T T_k D (together 4 T^2 d for T_k = T).

    The softmax, scaling and masking (O(T T_k H) operations) are not counted, nor is the
    saving of a causal mask (the fused kernels skip masked blocks, the matrix products do
    not). ``T_k`` defaults to T. Returns the three parts and their ``total``.
    """
    T = check_positive_int("T", T)
    d_model = check_positive_int("d_model", d_model)
    n_heads = check_positive_int("n_heads", n_heads)
    n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
    if d_head is None:
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        d_head = d_model // n_heads
    T_k = T if T_k is None else check_positive_int("T_k", T_k)
    D, D_kv = n_heads * d_head, n_kv_heads * d_head
    parts = {
        "projections": 2 * T * d_model * (2 * D + 2 * D_kv),
        "scores": 2 * T * T_k * D,
        "mix": 2 * T * T_k * D,
    }
    parts["total"] = sum(parts.values())
    return parts
