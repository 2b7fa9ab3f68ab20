r"""Build it yourself, Part IV (inference): sampling filters, a KV cache, int8 and NF4.

Part IV of the book turns a trained model into a program that answers: it chooses tokens
from the next-token logits (chapter 12), keeps the keys and values it has already computed
instead of recomputing them at every step (chapters 12 and 13), and stores the weights in
fewer bits (chapter 15). In this unit you write the core of each yourself, and the grader
checks your code against the libraries the book checks its own against: ``transformers``'
logits warpers, full causal attention recomputed from scratch, ``torch.quantize_per_channel``
and QLoRA's published NF4 table (the one bitsandbytes ships).

Build in this order (each exercise's check uses only the functions named with it):

1. :func:`apply_temperature` and :func:`top_p_filter`, temperature and nucleus filtering;
2. :func:`top_k_filter`;
3. :class:`KVCache` and :func:`cached_attention`, a key/value cache and one attention step
   over it;
4. :func:`absmax_quantize` and :func:`absmax_dequantize`, int8 per row or per block;
5. :func:`nf4_levels` and :func:`nf4_quantize`, 4-bit NormalFloat;
6. the end-to-end check, which writes nothing new: your cache decodes the book's shipped
   text model token by token, your filters choose its tokens, and your NF4 and int8
   quantisers round its weights, and every result must equal the book's.

Every function works on PyTorch tensors; the checks use float64 wherever the peer allows,
so that a difference is a bug and not round-off. Write your file with
``llmbook exercises build-IV`` and grade it with ``llmbook grade build-IV`` (one row per
exercise: passed, failed with what was expected and what came back, or not attempted).

This file is the reference: each body calls the book's own implementation (the imports are
inside the functions, so the stub you start from does not carry them). Look only after
trying.
"""

from __future__ import annotations

import torch


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide the logits by the temperature T: (..., V) -> (..., V), same dtype.

    softmax(z / T) is flatter than softmax(z) for T > 1 and sharper for T < 1. Divide
    (``logits / temperature``), do not multiply by ``1 / temperature``: the two can differ
    in the last bit, and the check wants ``transformers``' ``TemperatureLogitsWarper``
    bit for bit. Return a new tensor; do not change ``logits`` in place.

    Bad input: a temperature that is not > 0 (0, a negative number) raises ``ValueError``
    (greedy decoding, T -> 0, is an arg max, not a division by zero).

    Checked against ``TemperatureLogitsWarper`` with ``torch.equal`` (exact), on float64
    logits of shape (6, V).
    """
    from llmbook.inference.sampling import apply_temperature as book_apply_temperature

    return book_apply_temperature(logits, temperature)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus (top-p) filtering: keep the smallest set of most likely tokens whose
    probability reaches p, and set every other logit to -inf. (..., V) -> (..., V).

    Each row is filtered on its own. Sort the probabilities softmax(z) of a row in
    decreasing order, p_(1) >= p_(2) >= ...; token (i) is kept when the mass before it,
    p_(1) + ... + p_(i-1), is below p. So the most likely token is always kept (its mass
    before is 0: ``transformers``' ``min_tokens_to_keep=1``), and the kept set is the
    shortest prefix whose sum is >= p. Kept logits are returned unchanged (not the
    probabilities); ``logits`` itself is not modified.

    Policy on ties: when tokens of equal probability straddle the boundary, keep the ones
    of lowest token index (sort with ``stable=True``). ``transformers`` keeps the same
    *number* of tokens but leaves the choice among ties to its sort, so the check compares
    the count with theirs and the set with the book's.

    Hint: compute the softmax and the running sum in float64 (``logits.double()``), even
    for float32 logits: a running sum that lands within round-off of p is then rare.
    ``torch.sort(..., descending=True, stable=True)``, ``torch.cumsum`` and a ``scatter``
    back to the original order do the work; p = 1 keeps everything.

    Bad input: p outside (0, 1] raises ``ValueError``.

    Checked against ``transformers``' ``TopPLogitsWarper`` with ``torch.equal`` (exact), on
    float64 logits without ties, after :func:`apply_temperature`; and on logits with ties
    against the policy above.
    """
    from llmbook.inference.sampling import top_p_filter as book_top_p_filter

    return book_top_p_filter(logits, p)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row and set the others to -inf: (..., V) -> (..., V).

    Exactly min(k, V) entries of each row are kept, with their values unchanged; k >= V
    keeps everything. Policy on ties: when tokens tied with the k-th largest logit do not
    all fit, keep the ones of lowest token index (a stable sort). ``transformers``'
    ``TopKLogitsWarper`` keeps every token tied with the k-th instead, so it may keep more
    than k; without ties the two agree.

    Hint: ``torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]`` are
    the tokens to keep; build a boolean mask with ``scatter`` and use ``masked_fill``.
    (``torch.topk`` does not promise which of several tied tokens it returns.)

    Bad input: k < 1 raises ``ValueError``.

    Checked against ``TopKLogitsWarper`` with ``torch.equal`` (exact) on float64 logits
    without ties, and on logits with ties against the policy above.
    """
    from llmbook.inference.sampling import top_k_filter as book_top_k_filter

    return book_top_k_filter(logits, k)


class KVCache:
    """A key/value cache for a decoder of ``n_layers`` layers: preallocated buffers of shape
    (batch_size, n_kv_heads, max_seq_len, d_head) for the keys and the values of each layer.

    The book's transformer (``llmbook.transformer.model.TransformerLM``) accepts any object
    with this interface (``llmbook.transformer.attention.AttentionCache``), so yours can be
    plugged into it: ``model(ids, cache=your_cache)``. It needs:

    * the attributes ``n_layers``, ``batch_size``, ``n_kv_heads``, ``max_seq_len``,
      ``d_head`` (the constructor's arguments) and ``length``, the number of positions
      cached so far (0 for a new cache);
    * ``update(layer, k, v)``: k and v of shape (batch_size, n_kv_heads, T, d_head) are the
      keys and values of T new positions in layer ``layer``; write them at positions
      ``length .. length + T - 1`` of that layer's buffers and return *all* the cached keys
      and values of the layer, (batch_size, n_kv_heads, length + T, d_head) each (slices of
      the buffers are fine). ``update`` does not change ``length``: during one forward pass
      every layer writes at the same positions. If length + T > max_seq_len, raise
      ``ValueError`` (the positions do not fit).
    * ``advance(num_positions)``: add ``num_positions`` to ``length``; the model calls it
      once every layer has written.

    The buffers are created in ``dtype`` (the checks use float64).

    Checked in exercise 3 with :func:`cached_attention` and inside a small random Llama-style
    model (grouped-query attention, RoPE) against recomputing the whole sequence, to 1e-10
    in float64; in exercise 6 inside the book's shipped model.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_seq_len: int,
                 d_head: int, dtype: torch.dtype = torch.float32) -> None:
        from llmbook.inference.kvcache import KVCache as BookKVCache

        self._book = BookKVCache(n_layers, batch_size, n_kv_heads, max_seq_len, d_head, dtype=dtype)
        self.n_layers, self.batch_size, self.n_kv_heads = n_layers, batch_size, n_kv_heads
        self.max_seq_len, self.d_head = max_seq_len, d_head
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the keys and values of T new positions of ``layer``, (B, H_kv, T, d_head),
        after the cached ones; return all of them, (B, H_kv, length + T, d_head) each."""
        return self._book.update(layer, k, v)

    def advance(self, num_positions: int) -> None:
        """Count ``num_positions`` more positions as cached (after every layer has written)."""
        self._book.advance(num_positions)
        self.length = self._book.length


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                     layer: int) -> torch.Tensor:
    """One attention step with a cache: append the new keys and values to ``cache`` and let
    the new queries attend over everything cached. Returns (B, H, T, d_head).

    Shapes: the queries q (B, H, T, d_head) and the keys and values k, v (B, H_kv, T, d_head)
    of T new positions, which come after the ``cache.length`` positions already cached in
    layer ``layer``. H is a multiple of H_kv (grouped-query attention): query head h uses
    key/value head h // (H / H_kv) (``repeat_interleave`` the keys and values along the
    head dimension). Steps:

    1. ``keys, values = cache.update(layer, k, v)``: (B, H_kv, T_k, d_head), T_k = length + T;
    2. scores = q keys^T / sqrt(d_head), (B, H, T, T_k);
    3. the causal mask, aligned bottom-right: new query i sits at position length + i and may
       see key j when j <= length + i (a mask with ``diagonal=T_k - T``, not the top-left
       ``torch.tril`` of a square); masked scores become -inf;
    4. softmax over the keys, times the values.

    Do not call ``cache.advance``: the caller does, once every layer has written.

    Checked by feeding a sequence in pieces (a prompt of 5 positions, then 1, 3 and 4) through
    two layers of your :class:`KVCache` and comparing with full causal attention over the whole
    sequence, ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, to 1e-12
    in float64.
    """
    from llmbook.transformer.attention import causal_mask, scaled_dot_product_attention

    keys, values = cache.update(layer, k, v)  # (B, H_kv, T_k, d_head)
    groups = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(groups, dim=1)  # (B, H, T_k, d_head)
    values = values.repeat_interleave(groups, dim=1)
    T, T_k = q.shape[-2], keys.shape[-2]
    return scaled_dot_product_attention(q, keys, values,
                                        mask=causal_mask(T, T_k, offset=T_k - T, device=q.device))


def absmax_quantize(x: torch.Tensor, block_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric (absmax) int8 quantisation per row, or per block of the last dimension.

    x (..., n), floating point. A block is a whole row (the last dimension) when
    ``block_size`` is None, else ``block_size`` consecutive entries of it (n must be a
    multiple of ``block_size``, or ``ValueError``). For every block, the scale is
    s = max|x| / 127 over the block (s = 1 for an all-zero block), and each entry is stored
    as q = round(x / s), clamped to [-127, 127] (``torch.round``: halves go to the even
    integer). Returns ``(q, scale)``: q int8 of x's shape, and the scales (..., n_blocks)
    in x's dtype (n_blocks = 1 for rows). Dequantised, s q is within s / 2 of x.

    Checked against ``torch.quantize_per_channel`` (qint8, zero points 0, your scales, one
    channel per block) with ``torch.equal`` on the codes, and against the book's
    ``llmbook.inference.quant.quantize_absmax`` (scales to 1e-12 relative, codes exact).
    """
    from llmbook.inference.quant import quantize_absmax

    n = x.shape[-1] if x.ndim else 0
    qt = quantize_absmax(x, 8, group_size=n if block_size is None else block_size)
    return qt.q.to(torch.int8), qt.scale.squeeze(-1)  # (..., n), (..., n_blocks)


def absmax_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The reals that :func:`absmax_quantize`'s codes stand for: s q, block by block.

    q (..., n) int8 and scale (..., n_blocks); the block size is n / n_blocks. Returns a
    tensor of q's shape in the scales' dtype.

    Checked against ``torch.dequantize`` of the per-channel quantised tensor (to 1e-6
    relative, torch computes in float32) and the book's ``dequantize`` (to 1e-12, float64).
    """
    from llmbook.inference.quant import QuantizedTensor, dequantize

    block = q.shape[-1] // scale.shape[-1]
    qt = QuantizedTensor(q.to(torch.int32), scale[..., None], torch.zeros_like(scale[..., None]), 8,
                         "group", None, block)
    return dequantize(qt)


def nf4_levels() -> torch.Tensor:
    """The 16 levels of 4-bit NormalFloat (Dettmers et al., 2023, "QLoRA", section 3 and
    Appendix E), sorted, float64, shape (16,).

    The levels are quantiles of the standard normal distribution, made asymmetric so that 0
    is a level: with offset = 1 - (1/32 + 1/30) / 2 = 0.9677083...,

    * 8 positive levels: the quantiles at ``linspace(offset, 0.5, 9)[:-1]``;
    * 7 negative levels: minus the quantiles at ``linspace(offset, 0.5, 8)[:-1]``;
    * and 0.

    Divide all 16 by the largest, so that they span [-1, 1] with -1, 0 and 1 exact.

    Hint: ``torch.distributions.Normal(0., 1.).icdf`` in float64 (or ``torch.special.ndtri``).

    Checked against QLoRA's table as published (the values bitsandbytes ships) to 1e-6.
    """
    from llmbook.inference.quant import nf4_levels as book_nf4_levels

    return book_nf4_levels()


def nf4_quantize(x: torch.Tensor, block_size: int = 64) -> torch.Tensor:
    """Quantise x to NF4 and back ("fake quantisation"): same shape and dtype as x.

    x (..., n) is cut into blocks of ``block_size`` consecutive entries of the last
    dimension (n a multiple of ``block_size``, or ``ValueError``). Each block is divided by
    its absolute maximum (an all-zero block by 1), every entry is replaced by the nearest of
    the 16 levels of :func:`nf4_levels`, and the block is multiplied back by its absmax. So
    the result holds level x absmax in every entry: what QLoRA computes with after storing the
    4-bit level indices and one absmax per block.

    Hint: ``(blocks / absmax)[..., None] - levels`` has a last dimension of 16; its
    ``abs().argmin(-1)`` is the index of the nearest level.

    Checked against the book's ``llmbook.inference.quant.quantize_nf4`` (to 1e-12 x absmax,
    float64) and against rounding to the published table (to 1e-6 x absmax).
    """
    from llmbook.inference.quant import quantize_nf4

    return quantize_nf4(x, block_size)
