"""What a KV cache costs, and attention variants that make it cheaper.

Introduced in notebooks/13_kv_cache. The KV cache itself is :class:`llmbook.inference.kvcache.KVCache`
(chapter 12); this module adds what chapter 13 needs to study its cost and to shrink it:

* :func:`decode_step_flops` and :func:`generation_flops` - the forward FLOPs of producing
  one token at a given position, with a cache (one new token attends to T_k cached ones:
  O(T) per token) and without (the whole prefix is recomputed: O(T^2) per token), using
  the conventions of :mod:`llmbook.transformer.sizing`;
* :func:`kv_cache_bytes_per_token` - 2 L H_kv d_h bytes(dtype) for a published shape, and
  :func:`mla_cache_bytes_per_token` - L (d_c + d_R) bytes(dtype) for multi-head latent attention;
* :func:`sliding_window_mask` - the boolean mask of sliding-window attention (Beltagy,
  Peters & Cohan, 2020, "Longformer: The Long-Document Transformer"; Jiang et al., 2023,
  "Mistral 7B"): query i sees the ``window`` keys j with i + offset - window < j <= i + offset;
* :class:`RollingKVCache` and :func:`sliding_window_decode` - Mistral's rolling buffer of W
  slots (position p lives in slot p mod W), which decodes with a sliding window in
  O(W) memory and gives the outputs of full recomputation with the window mask;
* :class:`MultiHeadLatentAttention` - DeepSeek-V2's low-rank joint key/value compression
  (DeepSeek-AI, 2024, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
  Language Model", section 2.1.2): c = x W_DKV (d_c << H d_h), k = c W_UK, v = c W_UV; only c
  is cached. A naive path decompresses k and v; the absorbed path folds W_UK into the
  queries and W_UV into the output projection and attends in the d_c-dimensional latent
  space. With ``d_rope > 0`` it adds the paper's decoupled RoPE (section 2.1.3): a rotated
  query of d_R dimensions per head and ONE rotated key of d_R dimensions shared by all heads,
  cached next to c (d_c + d_R numbers per token and layer). The absorbed path is then
  multi-query attention with one shared key [c ; k_R] of width d_c + d_R and one shared
  value c of width d_c (:meth:`MultiHeadLatentAttention.mqa_form`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from llmbook.transformer.model import TransformerConfig
from llmbook.transformer.positional import RotaryEmbedding
from llmbook.transformer.sizing import flops_per_token

__all__ = [
    "LatentCache",
    "MultiHeadLatentAttention",
    "RollingKVCache",
    "decode_step_flops",
    "deepseek_v3_attention",
    "generation_flops",
    "kv_cache_bytes_per_token",
    "latent_decode",
    "mla_cache_bytes_per_token",
    "sliding_window_decode",
    "sliding_window_mask",
]


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def _element_size(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------- cost


def decode_step_flops(config: TransformerConfig, position: int, use_cache: bool) -> int:
    """Forward FLOPs (matrix products, 2 per multiply-add) to get the logits of the token
    that follows ``position`` tokens.

    With a cache, one new token runs through the model and attends to T_k = ``position``
    keys: ``flops_per_token(config, T_k)`` = 2 N_matmul + 4 L T_k H d_h, which is O(T).
    Without one, the whole sequence of T_k tokens is run again: T_k times as much, O(T^2).
    """
    position = _check_int("position", position)
    per_token = flops_per_token(config, position)
    return per_token if use_cache else position * per_token


def generation_flops(config: TransformerConfig, prompt_len: int, new_tokens: int,
                     use_cache: bool) -> int:
    """Forward FLOPs to generate ``new_tokens`` after a prompt of ``prompt_len`` tokens.

    Both ways begin with the prompt's forward pass (the *prefill*, prompt_len *
    flops_per_token(prompt_len)); each further token costs :func:`decode_step_flops` at
    its position. The last sampled token needs no forward pass.
    """
    prompt_len = _check_int("prompt_len", prompt_len)
    new_tokens = _check_int("new_tokens", new_tokens)
    total = prompt_len * flops_per_token(config, prompt_len)
    for position in range(prompt_len + 1, prompt_len + new_tokens):
        total += decode_step_flops(config, position, use_cache)
    return total


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int,
                             dtype: torch.dtype = torch.float16) -> int:
    """Bytes the KV cache holds per token (batch 1): 2 L H_kv d_h bytes(dtype).

    The factor 2 counts keys and values. Times B T it is
    :func:`llmbook.inference.kvcache.kv_cache_bytes`.
    """
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("d_head", d_head)):
        _check_int(name, value)
    return 2 * n_layers * n_kv_heads * d_head * _element_size(dtype)


def mla_cache_bytes_per_token(n_layers: int, d_latent: int, d_rope: int = 0,
                              dtype: torch.dtype = torch.float16) -> int:
    """Bytes an MLA cache holds per token: L (d_c + d_R) bytes(dtype).

    Each layer caches the latent c (d_c) and, in DeepSeek-V2, the decoupled RoPE key
    shared by all heads (d_R = d_h / 2 = 64 there; ``d_rope`` of :class:`MultiHeadLatentAttention`).
    """
    _check_int("n_layers", n_layers)
    _check_int("d_latent", d_latent)
    _check_int("d_rope", d_rope, minimum=0)
    return n_layers * (d_latent + d_rope) * _element_size(dtype)


# ---------------------------------------------------------------- sliding window


def sliding_window_mask(T_q: int, T_k: int, window: int, offset: int = 0,
                        device: torch.device | str | None = None) -> Tensor:
    """Sliding-window causal mask: (T_q, T_k) booleans, True where query i may attend to key j.

    Query i sits at position i + ``offset`` (``offset = T_k - T_q`` for the last T_q of T_k
    positions, as with a cache) and sees the ``window`` most recent positions up to its own:
    i + offset - window < j <= i + offset. ``window >= T_k`` gives the causal mask of
    :func:`llmbook.transformer.attention.causal_mask`; ``window = 1`` lets each token see only itself.
    """
    T_q = _check_int("T_q", T_q)
    T_k = _check_int("T_k", T_k)
    window = _check_int("window", window)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {offset!r}")
    i = torch.arange(T_q, device=device)[:, None] + offset  # (T_q, 1) query positions
    j = torch.arange(T_k, device=device)[None, :]  # (1, T_k) key positions
    return (j <= i) & (j > i - window)  # (T_q, T_k)


class RollingKVCache:
    """A rolling key/value buffer of W slots for sliding-window attention (Mistral 7B, section 2).

    Keys and values (B, H_kv, W, d_head) per layer; the token at position p is written to
    slot p mod W, overwriting position p - W, which a window of W no longer needs. The
    slots are out of order, which attention does not mind (a softmax-weighted sum is the
    same in any order; positions enter through RoPE before caching). ``length`` counts the
    positions seen so far; memory stays W slots however long the sequence grows.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, window: int,
                 d_head: int, dtype: torch.dtype = torch.float32) -> None:
        self.n_layers = _check_int("n_layers", n_layers)
        self.window = _check_int("window", window)
        shape = (_check_int("batch_size", batch_size), _check_int("n_kv_heads", n_kv_heads),
                 window, _check_int("d_head", d_head))
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.length = 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write the keys and values of ONE new position (B, H_kv, 1, d_head) of ``layer``.

        Returns all W slots of keys and values and a boolean (W,) mask of the filled ones
        (all True once ``length + 1 >= W``). Call :meth:`advance` after every layer wrote.
        """
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")
        want = self.keys[layer].shape
        if k.shape != (want[0], want[1], 1, want[3]) or v.shape != k.shape:
            raise ValueError(f"k and v must have shape ({want[0]}, {want[1]}, 1, {want[3]}), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        slot = self.length % self.window
        self.keys[layer][:, :, slot] = k[:, :, 0]
        self.values[layer][:, :, slot] = v[:, :, 0]
        filled = torch.arange(self.window) <= self.length  # (W,)
        return self.keys[layer], self.values[layer], filled

    def advance(self) -> None:
        """Count the position just written by every layer."""
        self.length += 1

    def num_bytes(self) -> int:
        """Bytes of all buffers: 2 L B H_kv W d_head bytes(dtype), independent of length."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@torch.no_grad()
def sliding_window_decode(attn: MultiHeadAttention, x: Tensor, window: int) -> Tensor:
    """Run ``attn`` over x (B, T, d_model) one position at a time with a :class:`RollingKVCache`
    of ``window`` slots; returns (B, T, d_model).

    Equals ``attn(x, mask=sliding_window_mask(T, T, window))`` (full recomputation with
    the window mask) while holding only ``window`` keys and values. No positional encoding
    is applied (a RoPE would rotate q and k by their absolute positions before caching).
    """
    if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != attn.d_model:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (B, T, d_model={attn.d_model}), got {shape}")
    B, T, _ = x.shape
    cache = RollingKVCache(1, B, attn.n_kv_heads, window, attn.d_head, dtype=x.dtype)
    groups = attn.n_heads // attn.n_kv_heads
    outputs = []
    for t in range(T):
        q, k, v = attn.project_qkv(x[:, t:t + 1])  # (B, H, 1, d_h), (B, H_kv, 1, d_h) x2
        k_all, v_all, filled = cache.update(0, k, v)  # (B, H_kv, W, d_h), (W,)
        k_all = k_all.repeat_interleave(groups, dim=1)  # (B, H, W, d_h)
        v_all = v_all.repeat_interleave(groups, dim=1)
        z = scaled_dot_product_attention(q, k_all, v_all, mask=filled[None, :], scale=attn.scale)
        outputs.append(attn.o_proj(z.transpose(1, 2).reshape(B, 1, -1)))  # (B, 1, d_model)
        cache.advance()
    return torch.cat(outputs, dim=1)  # (B, T, d_model)


# ---------------------------------------------------------------- multi-head latent attention


class LatentCache:
    """The cache of multi-head latent attention: (B, T_max, width) per layer.

    ``width`` is what MLA keeps per token and layer: d_c for the latent c alone, or
    d_c + d_R when the decoupled RoPE key k_R (shared by all heads) is cached next to it,
    as in DeepSeek-V2 (the row is [c ; k_R]). The attribute ``latents`` holds the buffers.
    """

    def __init__(self, n_layers: int, batch_size: int, max_seq_len: int, d_latent: int,
                 dtype: torch.dtype = torch.float32) -> None:
        self.n_layers = _check_int("n_layers", n_layers)
        self.max_seq_len = _check_int("max_seq_len", max_seq_len)
        shape = (_check_int("batch_size", batch_size), max_seq_len, _check_int("d_latent", d_latent))
        self.latents = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.length = 0

    @property
    def width(self) -> int:
        """Numbers cached per token and layer (d_c, or d_c + d_R with decoupled RoPE)."""
        return self.latents[0].shape[2]

    def update(self, layer: int, c: Tensor) -> Tensor:
        """Write the rows c (B, T, width) of the new positions; return all (B, length + T, width)."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")
        buf = self.latents[layer]
        if c.ndim != 3 or c.shape[0] != buf.shape[0] or c.shape[2] != buf.shape[2]:
            raise ValueError(f"c must have shape ({buf.shape[0]}, T, {buf.shape[2]}), got "
                             f"{tuple(c.shape)}")
        end = self.length + c.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"{self.length} cached + {c.shape[1]} new = {end} positions exceed "
                             f"max_seq_len={self.max_seq_len}")
        buf[:, self.length:end] = c
        return buf[:, :end]

    def advance(self, num_positions: int) -> None:
        """Count ``num_positions`` new positions once every layer has written them."""
        self.length += _check_int("num_positions", num_positions)

    def num_bytes(self) -> int:
        """Bytes of all buffers: L B T_max width bytes(dtype)."""
        return sum(t.numel() * t.element_size() for t in self.latents)


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-AI, 2024, DeepSeek-V2, section 2.1, eqs. 9-19).

    With x (B, T, d), H heads of width d_h, a latent width d_c and a RoPE width d_R
    (``d_rope``, 0 for none):

        q = x W_Q  (B, T, H d_h),     c = x W_DKV  (B, T, d_c)     <- cached,
        k = c W_UK (B, T, H d_h),     v = c W_UV   (B, T, H d_h),
        q_R = RoPE(x W_QR) (B, T, H d_R),   k_R = RoPE(x W_KR) (B, T, d_R)  <- cached, ONE for all heads,
        score_h(i, j) = (q_h,i . k_h,j + q_R,h,i . k_R,j) / sqrt(d_h + d_R),
        out = concat_h softmax(score_h + causal) v_h  W_O.

    ``forward(x, cache=None, layer=0, absorbed=False)``; the positions of x are
    ``cache.length, ..., cache.length + T - 1`` (0, ..., T-1 without a cache). The naive
    path (``absorbed=False``) decompresses k and v. The absorbed path uses
    q_h k_h^T = (q_h W_UK,h^T) c^T: each head's query is mapped into latent space by
    W_UK,h^T (d_h -> d_c) and scored against the cached c directly; the weights mix c
    (not v), and W_UV,h W_O,h (d_c -> d) maps the result out. RoPE cannot be absorbed (the
    rotation R_{j-i} sits between W_UK and the query and depends on the positions), hence
    the separate d_R dimensions, which are not absorbed. Both paths compute the same
    function. The queries are not compressed (DeepSeek-V2 also compresses them, to save
    activation memory in training), and the latent has no RMSNorm (DeepSeek-V2's code
    normalises c).
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int, d_latent: int,
                 dtype: torch.dtype | None = None, d_rope: int = 0, max_seq_len: int = 2048,
                 rope_theta: float = 10000.0) -> None:
        super().__init__()
        self.d_model = _check_int("d_model", d_model)
        self.n_heads = _check_int("n_heads", n_heads)
        self.d_head = _check_int("d_head", d_head)
        self.d_latent = _check_int("d_latent", d_latent)
        self.d_rope = _check_int("d_rope", d_rope, minimum=0)
        if d_rope % 2:
            raise ValueError(f"d_rope must be even (RoPE rotates pairs), got d_rope={d_rope}")
        self.scale = 1.0 / math.sqrt(d_head + d_rope)
        kw = {"bias": False, "dtype": dtype}
        D = n_heads * d_head
        self.q_proj = nn.Linear(d_model, D, **kw)  # W_Q
        self.kv_down = nn.Linear(d_model, d_latent, **kw)  # W_DKV
        self.k_up = nn.Linear(d_latent, D, **kw)  # W_UK
        self.v_up = nn.Linear(d_latent, D, **kw)  # W_UV
        self.o_proj = nn.Linear(D, d_model, **kw)  # W_O
        if d_rope:
            self.q_rope = nn.Linear(d_model, n_heads * d_rope, **kw)  # W_QR: d_R per head
            self.k_rope = nn.Linear(d_model, d_rope, **kw)  # W_KR: one key for all heads
            table = torch.float64 if dtype == torch.float64 else torch.float32
            self.rope = RotaryEmbedding(d_rope, rope_theta, _check_int("max_seq_len", max_seq_len),
                                        dtype=table)

    @property
    def cache_width(self) -> int:
        """Numbers cached per token and layer: d_c + d_R."""
        return self.d_latent + self.d_rope

    def _project(self, x: Tensor, cache: LatentCache | None,
                 layer: int) -> tuple[Tensor, Tensor | None, Tensor]:
        """q (B, H, T, d_h), q_R (B, H, T, d_R) or None, and the cached rows [c ; k_R] (B, T_k, d_c + d_R)."""
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}), got {shape}")
        if cache is not None and cache.width != self.cache_width:
            raise ValueError(f"cache must hold d_latent + d_rope = {self.cache_width} numbers per "
                             f"token, got a LatentCache of width {cache.width}")
        B, T, _ = x.shape
        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + T)  # (T,)
        c = self.kv_down(x)  # (B, T, d_c)
        q_r = None
        if self.d_rope:
            k_r = self.rope(self.k_rope(x), positions)  # (B, T, d_R): rotated before caching
            c = torch.cat((c, k_r), dim=-1)  # (B, T, d_c + d_R)
            q_r = self.q_rope(x).view(B, T, self.n_heads, self.d_rope).transpose(1, 2)
            q_r = self.rope(q_r, positions)  # (B, H, T, d_R)
        if cache is not None:
            c = cache.update(layer, c)  # (B, T_k, d_c + d_R): cached + new
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_h)
        return q, q_r, c

    def absorbed_weights(self) -> tuple[Tensor, Tensor]:
        """W_UK reshaped per head (H, d_h, d_c) and W_UV W_O per head (H, d_c, d)."""
        H, d_h, d_c = self.n_heads, self.d_head, self.d_latent
        W_UK = self.k_up.weight.view(H, d_h, d_c)  # k_h = c W_UK,h with W_UK,h = W_UK[h]^T
        W_UV = self.v_up.weight.view(H, d_h, d_c).transpose(1, 2)  # (H, d_c, d_h)
        W_O = self.o_proj.weight.t().reshape(H, d_h, self.d_model)  # (H, d_h, d)
        return W_UK, W_UV @ W_O  # (H, d_h, d_c), (H, d_c, d)

    def mqa_form(self, x: Tensor, cache: LatentCache | None = None,
                 layer: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """The absorbed layer as multi-query attention: H queries, ONE shared key and value.

        Returns q (B, H, T, d_c + d_R) = [q_h W_UK,h^T ; q_R,h], the shared key
        k (B, 1, T_k, d_c + d_R) = [c ; k_R] (exactly the cached rows) and the shared value
        v (B, 1, T_k, d_c) = c. softmax(q k^T / sqrt(d_h + d_R)) v per head, times
        W_UV,h W_O,h summed over heads, is the layer's output.
        """
        q, q_r, c = self._project(x, cache, layer)
        W_UK, _ = self.absorbed_weights()
        q_wide = q @ W_UK  # (B, H, T, d_c): q_h W_UK,h^T
        if q_r is not None:
            q_wide = torch.cat((q_wide, q_r), dim=-1)  # (B, H, T, d_c + d_R)
        return q_wide, c[:, None], c[:, None, :, :self.d_latent]

    def forward(self, x: Tensor, cache: LatentCache | None = None, layer: int = 0,
                absorbed: bool = False) -> Tensor:
        """Causal self-attention of x (B, T, d_model) -> (B, T, d_model), appending to ``cache``."""
        B, T = x.shape[:2] if isinstance(x, Tensor) and x.ndim == 3 else (0, 0)
        H, d_h, d_c = self.n_heads, self.d_head, self.d_latent
        if absorbed:
            q, k, v = self.mqa_form(x, cache, layer)  # (B, H, T, d_c+d_R), (B, 1, T_k, .), (B, 1, T_k, d_c)
            T_k = k.shape[2]
            causal = torch.arange(T_k)[None, :] <= torch.arange(T)[:, None] + (T_k - T)  # (T, T_k)
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, T_k): one key for all heads
            weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            z_latent = weights @ v  # (B, H, T, d_c): mix the latents, not the values
            return torch.einsum("bhtc,hcd->btd", z_latent, self.absorbed_weights()[1])  # (B, T, d)
        q, q_r, c = self._project(x, cache, layer)  # (B, H, T, d_h), (B, H, T, d_R), (B, T_k, d_c + d_R)
        T_k = c.shape[1]
        causal = torch.arange(T_k)[None, :] <= torch.arange(T)[:, None] + (T_k - T)  # (T, T_k)
        latent = c[..., :d_c]  # (B, T_k, d_c)
        k = self.k_up(latent).view(B, T_k, H, d_h).transpose(1, 2)  # (B, H, T_k, d_h)
        v = self.v_up(latent).view(B, T_k, H, d_h).transpose(1, 2)  # (B, H, T_k, d_h)
        if q_r is not None:  # append the rotated parts: the shared k_R is repeated per head
            k = torch.cat((k, c[:, None, :, d_c:].expand(B, H, T_k, self.d_rope)), dim=-1)
            q = torch.cat((q, q_r), dim=-1)  # (B, H, T, d_h + d_R)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=self.scale)
        return self.o_proj(z.transpose(1, 2).reshape(B, T, H * d_h))  # (B, T, d)



@torch.no_grad()
def latent_decode(mla: MultiHeadLatentAttention, x: Tensor, prefill: int,
                  absorbed: bool = True) -> tuple[Tensor, LatentCache]:
    """Run ``mla`` over x (B, T, d_model) as a decoder would: a prefill of the first
    ``prefill`` positions, then one position at a time, with a :class:`LatentCache`.

    Returns the outputs (B, T, d_model), equal to ``mla(x, absorbed=absorbed)`` (the full
    causal pass), and the cache, which then holds the T rows [c ; k_R] of width
    d_c + d_R.
    """
    if not isinstance(x, Tensor) or x.ndim != 3:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (B, T, d_model), got {shape}")
    B, T, _ = x.shape
    prefill = _check_int("prefill", prefill)
    if prefill > T:
        raise ValueError(f"prefill must be at most T={T}, got prefill={prefill}")
    cache = LatentCache(1, B, T, mla.cache_width, dtype=x.dtype)
    outputs = [mla(x[:, :prefill], cache=cache, absorbed=absorbed)]
    cache.advance(prefill)
    for t in range(prefill, T):
        outputs.append(mla(x[:, t:t + 1], cache=cache, absorbed=absorbed))
        cache.advance(1)
    return torch.cat(outputs, dim=1), cache

def deepseek_v3_attention(mla: MultiHeadLatentAttention) -> nn.Module:
    """Hugging Face's ``DeepseekV3Attention`` holding the weights of ``mla``: an independent peer.

    The config has ``q_lora_rank=None`` (uncompressed queries), ``kv_lora_rank = d_c``,
    ``qk_nope_head_dim = v_head_dim = d_h``, ``qk_rope_head_dim = d_R`` and the half-split
    RoPE (``rope_interleave=False``); the weights are copied into its fused layout
    (q_proj = per head [W_Q,h ; W_QR,h], kv_a_proj_with_mqa = [W_DKV ; W_KR],
    kv_b_proj = per head [W_UK,h ; W_UV,h]). Its RMSNorm on the latent is replaced by the
    identity, because this module's MLA has none; attention runs through ``sdpa`` (HF's
    eager path takes the softmax in float32). Call it as
    ``peer(x, position_embeddings=(cos, sin), attention_mask=additive_mask)[0]`` with cos/sin
    of shape (1, T, d_R) in HF's layout ``cat(angles, angles)``. Requires ``d_rope > 0``.
    """
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    if not isinstance(mla, MultiHeadLatentAttention) or mla.d_rope == 0:
        raise ValueError("mla must be a MultiHeadLatentAttention with d_rope > 0")
    d, H, d_h, d_c, d_r = mla.d_model, mla.n_heads, mla.d_head, mla.d_latent, mla.d_rope
    config = DeepseekV3Config(hidden_size=d, num_attention_heads=H, num_key_value_heads=H,
                              q_lora_rank=None, kv_lora_rank=d_c, qk_nope_head_dim=d_h,
                              qk_rope_head_dim=d_r, v_head_dim=d_h, rope_interleave=False,
                              max_position_embeddings=mla.rope.max_seq_len, num_hidden_layers=1,
                              vocab_size=8, attention_bias=False)
    config._attn_implementation = "sdpa"
    weight = mla.q_proj.weight
    peer = DeepseekV3Attention(config, layer_idx=0).to(dtype=weight.dtype).eval()
    peer.kv_a_layernorm = nn.Identity()
    with torch.no_grad():
        peer.q_proj.weight.copy_(torch.cat((weight.view(H, d_h, d), mla.q_rope.weight.view(H, d_r, d)),
                                           dim=1).reshape(H * (d_h + d_r), d))
        peer.kv_a_proj_with_mqa.weight.copy_(torch.cat((mla.kv_down.weight, mla.k_rope.weight)))
        peer.kv_b_proj.weight.copy_(torch.cat((mla.k_up.weight.view(H, d_h, d_c),
                                               mla.v_up.weight.view(H, d_h, d_c)),
                                              dim=1).reshape(H * 2 * d_h, d_c))
        peer.o_proj.weight.copy_(mla.o_proj.weight)
    return peer
