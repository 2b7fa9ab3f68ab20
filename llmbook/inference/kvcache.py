"""The key/value cache of autoregressive decoding.

Introduced in notebooks/12_decoding (chapter 13 studies its cost in depth). A decoder
generating token t + 1 needs the keys and values of positions 0..t in every layer. They do
not change once computed (a causal model's position j never sees later tokens), so instead
of recomputing them for the whole prefix at every step, a :class:`KVCache` keeps them:
each step computes queries, keys and values for the *new* tokens only, appends the keys
and values, and attends over everything cached. The new queries are the last T of the
T_k cached positions, so the causal mask is bottom-right aligned
(:func:`llmbook.transformer.attention.causal_mask` with ``offset = T_k - T``).

The buffers are preallocated, (B, H_kv, T_max, d_head) per layer for keys and values
alike, so the memory is

    bytes = 2 * L * B * T_max * H_kv * d_head * bytes_per_element

(:func:`kv_cache_bytes`); grouped-query attention (H_kv < H) divides it by H / H_kv.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from llmbook.validation import check_positive_int

__all__ = ["KVCache", "kv_cache_bytes"]


def kv_cache_bytes(config: Any, batch_size: int, seq_len: int,
                   dtype: torch.dtype = torch.float32) -> int:
    """Bytes of a KV cache for ``seq_len`` positions: 2 L B T H_kv d_head bytes(dtype).

    ``config`` is a :class:`~llmbook.transformer.model.TransformerConfig` (``n_layers``, ``n_kv_heads``,
    ``d_head``). The factor 2 counts keys and values.
    """
    batch_size = check_positive_int("batch_size", batch_size)
    seq_len = check_positive_int("seq_len", seq_len)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layers * batch_size * seq_len * config.n_kv_heads * config.d_head * element


class KVCache:
    """Preallocated per-layer key and value buffers, (B, H_kv, T_max, d_head) each.

    ``length`` is the number of positions cached so far (the same in every layer between
    forward passes). During a forward pass, layer ``l`` calls :meth:`update` with the keys
    and values of the T new positions, which are written at ``length .. length + T - 1``;
    it gets back all ``length + T`` cached keys and values. When every layer has written,
    the model calls :meth:`advance` (T) to move ``length`` on. :meth:`reset` empties the
    cache and :meth:`truncate` forgets the positions from a given length on (what
    speculative decoding needs when it rejects drafted tokens).
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_seq_len: int,
                 d_head: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        self.d_head = check_positive_int("d_head", d_head)
        shape = (batch_size, n_kv_heads, max_seq_len, d_head)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = 0

    @classmethod
    def for_model(cls, model: Any, batch_size: int, max_seq_len: int | None = None) -> KVCache:
        """An empty cache shaped for ``model`` (a :class:`~llmbook.transformer.model.TransformerLM`), on its
        device and in its dtype; ``max_seq_len`` defaults to the model's context length."""
        c = model.config
        T_max = c.max_seq_len if max_seq_len is None else check_positive_int("max_seq_len",
                                                                             max_seq_len)
        if T_max > c.max_seq_len:
            raise ValueError(f"max_seq_len={T_max} exceeds the model's context length "
                             f"max_seq_len={c.max_seq_len}")
        p = next(model.parameters())
        return cls(c.n_layers, batch_size, c.n_kv_heads, T_max, c.d_head, dtype=p.dtype,
                   device=p.device)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys and values of ``layer`` (B, H_kv, T, d_head) after the cached
        ones; return all cached keys and values (B, H_kv, length + T, d_head) (views)."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")
        want = (self.batch_size, self.n_kv_heads, self.d_head)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.ndim != 4 or (t.shape[0], t.shape[1], t.shape[3]) != want:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must have shape (B, H_kv, T, d_head) = ({want[0]}, "
                                 f"{want[1]}, T, {want[2]}), got {got}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")
        end = self.length + k.shape[2]
        if end > self.max_seq_len:
            raise ValueError(f"the cache holds max_seq_len={self.max_seq_len} positions: "
                             f"{self.length} cached + {k.shape[2]} new = {end} do not fit")
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    append = update

    def advance(self, num_positions: int) -> None:
        """Count ``num_positions`` new positions as cached (after every layer has written)."""
        if isinstance(num_positions, bool) or not isinstance(num_positions, int) or \
                num_positions < 0 or self.length + num_positions > self.max_seq_len:
            raise ValueError(f"cannot advance a cache of length {self.length} (max_seq_len="
                             f"{self.max_seq_len}) by {num_positions!r} positions")
        self.length += num_positions

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (0 <= length <= current length)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}], got {length!r}")
        self.length = length

    def reset(self) -> None:
        """Empty the cache (the buffers are kept and overwritten on the next use)."""
        self.length = 0

    def num_bytes(self) -> int:
        """The bytes of all key and value buffers: sum of numel * element_size."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def __repr__(self) -> str:
        return (f"KVCache(n_layers={self.n_layers}, batch_size={self.batch_size}, n_kv_heads="
                f"{self.n_kv_heads}, length={self.length}/{self.max_seq_len}, d_head={self.d_head})")
