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

A server cannot preallocate T_max positions for every request: most stop early, and the
reserved rows are lost to everyone else. PagedAttention (Kwon et al., 2023, "Efficient
Memory Management for Large Language Model Serving with PagedAttention") stores the cache
in fixed-size *pages* of a shared :class:`PagePool` and gives each sequence a *block table*
(the list of its pages), as an operating system does with virtual memory: a sequence holds
ceil(T / page_size) pages, wasting less than one page, and freed pages go back to a free
list. Pages are reference-counted, so sequences that begin with the same prompt share its
pages (*prefix caching*); a shared page is copied before it is written (copy-on-write).
:class:`PagedKVCache` implements the same interface as :class:`KVCache` and gives the same
keys and values, gathered through the block table.

:class:`Int8KVCache` halves the cache again against 16 bits: every key and value vector (one
token, one head) is stored as int8 with its own absmax scale (:func:`quantize_kv_int8`),
which bounds the error of every element by scale / 2 = absmax / 254.

:class:`SinkKVCache` is StreamingLLM's cache (Xiao et al., 2023, "Efficient Streaming Language
Models with Attention Sinks", section 3.2): it keeps the first ``n_sink`` positions (the
"attention sinks") and the ``window`` most recent ones, evicting the rest, so memory stays
n_sink + window positions however long the stream. Keys are cached after RoPE, so each kept
key keeps its original position (the paper re-numbers positions inside the cache instead);
decoding with it equals a full pass with :func:`sink_window_mask`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from llmbook.validation import check_positive_int

__all__ = ["Int8KVCache", "KVCache", "PagePool", "PagedKVCache", "SinkKVCache", "dequantize_kv_int8",
           "kv_cache_bytes", "quantize_kv_int8", "sink_window_mask"]


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


def _check_new_kv(cache: Any, layer: int, k: Tensor, v: Tensor) -> int:
    """Validate the arguments of a cache's ``update``; return the length after it."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < cache.n_layers:
        raise ValueError(f"layer must be an int in [0, {cache.n_layers}), got {layer!r}")
    want = (cache.batch_size, cache.n_kv_heads, cache.d_head)
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.ndim != 4 or (t.shape[0], t.shape[1], t.shape[3]) != want:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must have shape (B, H_kv, T, d_head) = ({want[0]}, "
                             f"{want[1]}, T, {want[2]}), got {got}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    end = cache.length + k.shape[2]
    if end > cache.max_seq_len:
        raise ValueError(f"the cache holds max_seq_len={cache.max_seq_len} positions: "
                         f"{cache.length} cached + {k.shape[2]} new = {end} do not fit")
    return end


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
        end = _check_new_kv(self, layer, k, v)  # layer, shapes, and that the positions fit
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


class PagePool:
    """Fixed-size pages of keys and values shared by many sequences, with a free list.

    Every layer has a key and a value buffer of shape (num_pages, H_kv, page_size, d_head);
    page ``i`` is row ``i`` of all of them. :meth:`allocate` takes a page from the free list
    (reference count 1), :meth:`share` adds a reference, :meth:`release` drops one and
    returns the page to the free list when none is left. Kwon et al. (2023), section 4.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, d_head: int, num_pages: int,
                 page_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.d_head = check_positive_int("d_head", d_head)
        self.num_pages = check_positive_int("num_pages", num_pages)
        self.page_size = check_positive_int("page_size", page_size)
        shape = (num_pages, n_kv_heads, page_size, d_head)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.free = list(range(num_pages - 1, -1, -1))  # a stack: page 0 is handed out first
        self.refs = [0] * num_pages

    @classmethod
    def for_model(cls, model: Any, num_pages: int, page_size: int) -> PagePool:
        """A pool shaped for ``model`` (a TransformerLM), on its device and in its dtype."""
        c, p = model.config, next(model.parameters())
        return cls(c.n_layers, c.n_kv_heads, c.d_head, num_pages, page_size, dtype=p.dtype,
                   device=p.device)

    @property
    def num_free(self) -> int:
        """Pages on the free list."""
        return len(self.free)

    def _check_page(self, page: int) -> int:
        if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < self.num_pages \
                or self.refs[page] == 0:
            raise ValueError(f"page must be an allocated page in [0, {self.num_pages}), got {page!r}")
        return page

    def allocate(self) -> int:
        """Take a page from the free list; its reference count becomes 1."""
        if not self.free:
            raise RuntimeError(f"the page pool is full: all {self.num_pages} pages are in use")
        page = self.free.pop()
        self.refs[page] = 1
        return page

    def share(self, page: int) -> int:
        """Add a reference to an allocated page (another sequence uses it)."""
        self.refs[self._check_page(page)] += 1
        return page

    def release(self, page: int) -> None:
        """Drop a reference; the page returns to the free list when none is left."""
        self.refs[self._check_page(page)] -= 1
        if self.refs[page] == 0:
            self.free.append(page)

    def copy(self, page: int) -> int:
        """A new page holding a copy of ``page`` in every layer (for copy-on-write)."""
        new = self.allocate()
        for buf in (*self.keys, *self.values):
            buf[new] = buf[self._check_page(page)]
        return new


class PagedKVCache:
    """A KV cache of ``batch_size`` sequences stored in pages of a :class:`PagePool`.

    Same interface as :class:`KVCache` (``update``, ``advance``, ``length``): a model run
    with either gives the same logits. Sequence ``b`` owns the pages listed in
    ``block_tables[b]``; position ``p`` lives in page ``block_tables[b][p // page_size]`` at
    row ``p % page_size``. :meth:`update` allocates pages as positions arrive (at layer 0),
    copies a page shared with another sequence before writing into it (copy-on-write), and
    returns the cached keys and values gathered through the block table,
    (B, H_kv, length + T, d_head). :meth:`from_prefix` starts a cache that shares the pages
    of another's first positions (prefix caching); :meth:`release` gives every page back.
    Kwon et al. (2023).
    """

    def __init__(self, pool: PagePool, batch_size: int = 1, max_seq_len: int | None = None) -> None:
        if not isinstance(pool, PagePool):
            raise TypeError(f"pool must be a PagePool, got {type(pool).__name__}")
        self.pool = pool
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.n_layers, self.n_kv_heads, self.d_head = pool.n_layers, pool.n_kv_heads, pool.d_head
        self.max_seq_len = (pool.num_pages * pool.page_size if max_seq_len is None
                            else check_positive_int("max_seq_len", max_seq_len))
        self.block_tables: list[list[int]] = [[] for _ in range(batch_size)]
        self.length = 0

    @classmethod
    def from_prefix(cls, source: PagedKVCache, length: int) -> PagedKVCache:
        """A cache whose first ``length`` positions are those of ``source``, sharing its pages.

        The pages that hold positions 0..length-1 get one more reference each; nothing is
        copied until one of them is written (the last, partly filled page, on the first
        :meth:`update`).
        """
        if not isinstance(source, PagedKVCache):
            raise TypeError(f"source must be a PagedKVCache, got {type(source).__name__}")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= source.length:
            raise ValueError(f"length must be an int in [0, {source.length}], got {length!r}")
        new = cls(source.pool, source.batch_size, source.max_seq_len)
        n_pages = -(-length // source.pool.page_size)
        new.block_tables = [[source.pool.share(page) for page in table[:n_pages]]
                            for table in source.block_tables]
        new.length = length
        return new

    def _prepare(self, end: int) -> None:
        """Give every sequence private pages for positions length..end-1 (layer 0 only)."""
        P = self.pool.page_size
        for table in self.block_tables:
            for idx in range(self.length // P, -(-end // P)):
                if idx == len(table):
                    table.append(self.pool.allocate())
                elif self.pool.refs[table[idx]] > 1:  # shared: copy before writing
                    old = table[idx]
                    table[idx] = self.pool.copy(old)
                    self.pool.release(old)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys and values of ``layer`` (B, H_kv, T, d_head) into their pages;
        return all cached keys and values (B, H_kv, length + T, d_head), gathered."""
        end = _check_new_kv(self, layer, k, v)
        if layer == 0:
            self._prepare(end)
        P = self.pool.page_size
        pos = torch.arange(self.length, end, device=k.device)  # (T,)
        outs = []
        for b, table in enumerate(self.block_tables):
            pages = torch.tensor(table, dtype=torch.long, device=k.device)  # (n_pages,)
            for buf, new in ((self.pool.keys[layer], k[b]), (self.pool.values[layer], v[b])):
                buf[pages[pos // P], :, pos % P] = new.transpose(0, 1)  # (T, H_kv, d_head)
            outs.append([buf[pages].transpose(0, 1).reshape(self.n_kv_heads, -1, self.d_head)[:, :end]
                         for buf in (self.pool.keys[layer], self.pool.values[layer])])
        return (torch.stack([o[0] for o in outs]),  # (B, H_kv, end, d_head)
                torch.stack([o[1] for o in outs]))

    advance = KVCache.advance

    def release(self) -> None:
        """Return every page of every sequence to the pool and empty the cache."""
        for table in self.block_tables:
            for page in table:
                self.pool.release(page)
            table.clear()
        self.length = 0

    def __repr__(self) -> str:
        return (f"PagedKVCache(batch_size={self.batch_size}, length={self.length}, pages="
                f"{[len(t) for t in self.block_tables]}, page_size={self.pool.page_size})")


def quantize_kv_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token, per-head absmax int8 quantisation of keys or values (..., d_head).

    Each vector x (the last dimension: one token of one head) gets the scale
    s = max|x| / 127 (1 for an all-zero vector) and is stored as q = round(x / s) in int8,
    so |x - s q| <= s / 2 element by element. Returns q (..., d_head) int8 and s (..., 1)
    in x's dtype.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim < 1:
        raise TypeError(f"x must be a floating-point tensor with at least one dimension, got "
                        f"{type(x).__name__ if not isinstance(x, Tensor) else x.dtype}")
    absmax = x.abs().amax(dim=-1, keepdim=True)  # (..., 1)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def dequantize_kv_int8(q: Tensor, scale: Tensor) -> Tensor:
    """Inverse of :func:`quantize_kv_int8`: q (..., d_head) int8 times scale (..., 1)."""
    if not isinstance(q, Tensor) or q.dtype != torch.int8:
        raise TypeError(f"q must be an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    return q.to(scale.dtype) * scale


class Int8KVCache(KVCache):
    """A :class:`KVCache` that stores keys and values in int8 with one scale per token and head.

    Same interface and shapes; :meth:`update` quantises the new keys and values
    (:func:`quantize_kv_int8`) and returns the dequantised cache, so attention runs in the
    model's dtype on values within scale / 2 of the originals. Memory per position and layer:
    2 H_kv (d_head + element_size) bytes (int8 numbers plus one scale per vector), against
    2 H_kv d_head element_size for the float cache.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_seq_len: int,
                 d_head: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(n_layers, batch_size, n_kv_heads, max_seq_len, d_head, dtype=torch.int8,
                         device=device)
        scale_shape = (batch_size, n_kv_heads, max_seq_len, 1)
        self.key_scales = [torch.ones(scale_shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.value_scales = [torch.ones(scale_shape, dtype=dtype, device=device) for _ in range(n_layers)]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Quantise and store the new keys and values; return all of them dequantised
        (B, H_kv, length + T, d_head) in the scales' dtype."""
        qk, sk = quantize_kv_int8(k)
        qv, sv = quantize_kv_int8(v)
        keys, values = super().update(layer, qk, qv)  # checks shapes, writes the int8 numbers
        end = keys.shape[2]
        self.key_scales[layer][:, :, self.length:end] = sk
        self.value_scales[layer][:, :, self.length:end] = sv
        return (dequantize_kv_int8(keys, self.key_scales[layer][:, :, :end]),
                dequantize_kv_int8(values, self.value_scales[layer][:, :, :end]))

    def num_bytes(self) -> int:
        """Bytes of the int8 buffers and their scales."""
        return super().num_bytes() + sum(t.numel() * t.element_size()
                                         for t in (*self.key_scales, *self.value_scales))


# ---------------------------------------------------------------- StreamingLLM


def sink_window_mask(T_q: int, T_k: int, window: int, n_sink: int, offset: int = 0,
                     device: torch.device | str | None = None) -> Tensor:
    """StreamingLLM's visibility as a mask: (T_q, T_k) booleans, True where query i may attend to key j.

    Query i sits at position i + ``offset`` and sees, causally, the first ``n_sink`` positions
    and the ``window`` most recent ones: j <= i + offset and (j < n_sink or i + offset - j <
    window). ``n_sink = 0`` is a plain sliding window
    (:func:`llmbook.inference.attention_variants.sliding_window_mask`); ``window >= T_k`` is causal.
    """
    T_q, T_k = check_positive_int("T_q", T_q), check_positive_int("T_k", T_k)
    window = check_positive_int("window", window)
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
        raise ValueError(f"n_sink must be an int >= 0, got {n_sink!r}")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {offset!r}")
    i = torch.arange(T_q, device=device)[:, None] + offset  # (T_q, 1) query positions
    j = torch.arange(T_k, device=device)[None, :]  # (1, T_k) key positions
    return (j <= i) & ((j < n_sink) | (i - j < window))  # (T_q, T_k)


class SinkKVCache:
    """StreamingLLM's cache: the first ``n_sink`` positions plus the ``window`` most recent ones.

    Same interface as :class:`KVCache` (``update``, ``advance``, ``length``). ``length`` counts
    every position seen, so the model gives new tokens their original positions (RoPE is
    applied before caching); ``max_seq_len`` bounds those positions (the model's context).
    :meth:`update` appends the new keys and values, evicts every position that is neither a
    sink nor among the ``window`` latest, and returns the n_sink + window (or fewer) kept ones
    (B, H_kv, T_kept, d_head), oldest first. Once positions have been evicted, tokens must
    arrive one at a time (a longer block would see more than ``window`` recent keys).
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, d_head: int, window: int,
                 n_sink: int, max_seq_len: int, dtype: torch.dtype = torch.float32) -> None:
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.d_head = check_positive_int("d_head", d_head)
        self.window = check_positive_int("window", window)
        if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
            raise ValueError(f"n_sink must be an int >= 0, got {n_sink!r}")
        self.n_sink = n_sink
        self.max_seq_len = check_positive_int("max_seq_len", max_seq_len)
        empty = torch.zeros(batch_size, n_kv_heads, 0, d_head, dtype=dtype)
        self.keys = [empty.clone() for _ in range(n_layers)]
        self.values = [empty.clone() for _ in range(n_layers)]
        self.length = 0

    @classmethod
    def for_model(cls, model: Any, batch_size: int, window: int, n_sink: int) -> SinkKVCache:
        """An empty cache shaped for ``model`` (a ``TransformerLM``), in its dtype."""
        c = model.config
        return cls(c.n_layers, batch_size, c.n_kv_heads, c.d_head, window, n_sink, c.max_seq_len,
                   dtype=next(model.parameters()).dtype)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new keys and values of ``layer`` (B, H_kv, T, d_head), evict, and return the kept ones."""
        _check_new_kv(self, layer, k, v)  # shapes, and positions within max_seq_len
        T, cap = k.shape[2], self.n_sink + self.window
        if T > 1 and self.length + T > cap:
            raise ValueError(f"a block of {T} tokens at length {self.length} would need evictions "
                             f"(n_sink + window = {cap}): feed tokens one at a time from there")
        keys = torch.cat([self.keys[layer], k.to(self.keys[layer].dtype)], dim=2)
        values = torch.cat([self.values[layer], v.to(self.values[layer].dtype)], dim=2)
        if keys.shape[2] > cap:  # keep the sinks and the window latest positions
            keys = torch.cat([keys[:, :, :self.n_sink], keys[:, :, -self.window:]], dim=2)
            values = torch.cat([values[:, :, :self.n_sink], values[:, :, -self.window:]], dim=2)
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def advance(self, num_positions: int) -> None:
        """Count ``num_positions`` new positions as seen (after every layer has written)."""
        if isinstance(num_positions, bool) or not isinstance(num_positions, int) or num_positions < 0:
            raise ValueError(f"num_positions must be an int >= 0, got {num_positions!r}")
        self.length += num_positions

    def num_bytes(self) -> int:
        """Bytes of the kept keys and values: at most 2 L B H_kv (n_sink + window) d_head bytes(dtype)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
