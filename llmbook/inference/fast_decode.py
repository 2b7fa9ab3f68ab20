"""Decoding a real model fast on a CPU: fewer bytes per token, and less Python per step.

Introduced in notebooks/13_kv_cache (the roofline of decoding) and notebooks/15_quantisation
(weight-only int4). Generating one token reads every weight once and does two flops per
weight: at batch 1 that is one multiply-add per byte of fp32 weights, far below what a
CPU core computes per byte it can fetch, so decoding is bound by memory bandwidth:

    tokens/s <= bandwidth / bytes read per token.

Two ways to move fewer bytes and waste less time around them:

* **weight-only quantisation.** :class:`Int4Linear` keeps a linear layer's weights as 4-bit
  codes in groups of 32 along the input dimension, w = (q - 8) s + z, and multiplies with
  PyTorch's CPU kernel ``aten._weight_int4pack_mm_for_cpu`` (bfloat16 activations), which
  unpacks the codes in registers: 4 bits plus 32 bits of (s, z) per 32 weights, 5 bits a
  weight instead of 32. A GGUF Q4_1 block (fp16 d and m, w = d q + m) is the same code with
  s = d and z = m + 8d, so :meth:`Int4Linear.from_q4_1` runs the very bits llama.cpp runs
  (its d and m rounded from fp16 to bfloat16: an error the book measures). :class:`Int8Linear`
  does the same for 8-bit codes with one scale per output row (``aten._weight_int8pack_mm``).
  :func:`quantize_for_decode` swaps a :class:`~llmbook.transformer.model.TransformerLM`'s layers.
* **a static cache and a compiled step.** :class:`StaticKVCache` has fixed-shape buffers,
  and :func:`decode_step` attends over the whole buffer with a mask instead of slicing it,
  so every decoding step runs the same tensor shapes and ``torch.compile`` can turn the
  step into one graph (:func:`compiled_decode_step`) without per-step recompilation.

:func:`stream_bandwidth` measures what the roofline needs (a STREAM-style copy, McCalpin,
1995), :func:`decode_bytes_per_token` counts what a step reads, and :func:`profile_decode_step`
says where a step's time goes.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.transformer.model import TransformerLM
from llmbook.transformer.positional import _rotate_pairs
from llmbook.validation import check_positive_int

__all__ = [
    "Int4Linear",
    "Int8Linear",
    "StaticKVCache",
    "compiled_decode_step",
    "decode_bytes_per_token",
    "decode_step",
    "profile_decode_step",
    "quantize_for_decode",
    "stream_bandwidth",
]

GROUP_SIZES = (32, 64, 128, 256)


def _check_weight(weight: object) -> Tensor:
    if not isinstance(weight, Tensor) or weight.ndim != 2 or not weight.is_floating_point():
        what = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a floating-point (d_out, d_in) tensor, got {what}")
    if not torch.isfinite(weight).all():
        raise ValueError("weight has non-finite entries")
    return weight


class Int4Linear(nn.Module):
    """y = x W^T with W in 4-bit codes: w[n, k] = (q[n, k] - 8) s[n, g] + z[n, g], g = k // G.

    ``codes`` (N, K) integers in 0..15, ``scales`` and ``zeros`` (N, K / G) for groups of
    G = ``group_size`` consecutive inputs. The codes are packed two per byte in the layout
    of ``aten._convert_weight_to_int4pack_for_cpu``; scales and zeros are stored in
    bfloat16 as the (K / G, N, 2) tensor the kernel reads. Shapes: x (..., K) -> (..., N),
    any floating dtype in and out; the product is computed with bfloat16 activations.
    Storage: K N / 2 bytes of codes + 4 K N / G bytes of scales and zeros.
    """

    def __init__(self, codes: Tensor, scales: Tensor, zeros: Tensor, group_size: int = 32) -> None:
        super().__init__()
        if not isinstance(codes, Tensor) or codes.ndim != 2 or codes.is_floating_point():
            raise ValueError(f"codes must be an integer (N, K) tensor, got {codes!r:.60}")
        N, K = codes.shape
        if group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
        if K % group_size or N % 16:
            raise ValueError(f"the int4 kernel needs K a multiple of group_size={group_size} and "
                             f"N a multiple of 16, got (N, K) = ({N}, {K})")
        if int(codes.min()) < 0 or int(codes.max()) > 15:
            raise ValueError(f"codes must lie in 0..15, got {int(codes.min())}..{int(codes.max())}")
        for name, t in (("scales", scales), ("zeros", zeros)):
            if not isinstance(t, Tensor) or tuple(t.shape) != (N, K // group_size):
                raise ValueError(f"{name} must have shape (N, K/G) = ({N}, {K // group_size}), "
                                 f"got {tuple(t.shape) if isinstance(t, Tensor) else t!r}")
        self.in_features, self.out_features, self.group_size = K, N, group_size
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        self.register_buffer("packed", packed)  # (N, K/2) uint8
        sz = torch.stack([scales.T, zeros.T], dim=-1).to(torch.bfloat16)  # (K/G, N, 2)
        self.register_buffer("scales_and_zeros", sz.contiguous())

    @classmethod
    def from_float(cls, weight: Tensor, group_size: int = 32) -> Int4Linear:
        """Round ``weight`` (N, K) to 4 bits per group with min-max scaling (GGUF Q4_1's
        rule): s = (max - min) / 15, z = min + 8 s, q = round((w - min) / s)."""
        w = _check_weight(weight).detach().float()
        N, K = w.shape
        if group_size not in GROUP_SIZES or K % group_size:
            raise ValueError(f"K={K} must be a multiple of group_size, one of {GROUP_SIZES}")
        g = w.reshape(N, K // group_size, group_size)
        lo, hi = g.amin(-1), g.amax(-1)  # (N, K/G)
        s = (hi - lo) / 15
        inv = torch.where(s > 0, 1 / s, torch.zeros_like(s))
        q = torch.round((g - lo[..., None]) * inv[..., None]).clamp(0, 15).reshape(N, K)
        return cls(q.to(torch.int32), s, lo + 8 * s, group_size)

    @classmethod
    def from_q4_1(cls, data: np.ndarray, shape: tuple[int, int]) -> Int4Linear:
        """The layer whose codes are those of a GGUF Q4_1 tensor: raw bytes, numpy shape (N, K).

        Block b of row n holds fp16 d, fp16 m and 32 codes (weights 0-15 in the low nibbles,
        16-31 in the high ones), w = d q + m = (q - 8) d + (m + 8 d): s = d, z = m + 8 d.
        """
        N, K = shape
        blocks = np.ascontiguousarray(data).reshape(N, K // 32, 20)  # 20 bytes per block
        d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)  # (N, K/32)
        m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32)
        qs = blocks[..., 4:]  # (N, K/32, 16)
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(N, K)
        d_t, m_t = torch.from_numpy(d), torch.from_numpy(m)
        return cls(torch.from_numpy(codes.astype(np.int32)), d_t, m_t + 8 * d_t, 32)

    def weight(self) -> Tensor:
        """The (N, K) float32 weights the kernel multiplies by (bfloat16 scales and zeros)."""
        codes = self._codes().float()  # (N, K)
        sz = self.scales_and_zeros.float()  # (K/G, N, 2)
        s = sz[..., 0].T.repeat_interleave(self.group_size, dim=1)  # (N, K)
        z = sz[..., 1].T.repeat_interleave(self.group_size, dim=1)
        return (codes - 8) * s + z

    def _codes(self) -> Tensor:
        """Unpack the codes by multiplying the identity: row k of I W^T is column k of W."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)  # (K, K)
        ones = torch.ones_like(self.scales_and_zeros)
        ones[..., 1] = 8.0  # s = 1, z = 8: w = q exactly, small integers are exact in bf16
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            eye, self.packed, self.group_size, ones).T.round().to(torch.int32)  # (N, K)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., {self.in_features}), got {tuple(x.shape)}")
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, self.in_features).to(torch.bfloat16), self.packed, self.group_size,
            self.scales_and_zeros)  # (M, N) bfloat16
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def storage_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + \
            self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"group_size={self.group_size}"


class Int8Linear(nn.Module):
    """y = x W^T with W in 8-bit codes, one scale per output row: w[n, k] = q[n, k] s[n].

    Symmetric absmax per row, s = max_k |w[n, k]| / 127, computed with
    ``aten._weight_int8pack_mm`` (bfloat16 activations and scales). Shapes: x (..., K) ->
    (..., N). Storage: N K bytes + 2 N.
    """

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        w = _check_weight(weight).detach().float()
        s = w.abs().amax(dim=1) / 127  # (N,)
        inv = torch.where(s > 0, 1 / s, torch.zeros_like(s))
        q = torch.round(w * inv[:, None]).clamp(-127, 127).to(torch.int8)
        self.out_features, self.in_features = w.shape
        self.register_buffer("codes", q)  # (N, K) int8
        self.register_buffer("scales", s.to(torch.bfloat16))  # (N,)

    def weight(self) -> Tensor:
        """The (N, K) float32 weights the kernel multiplies by."""
        return self.codes.float() * self.scales.float()[:, None]

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., {self.in_features}), got {tuple(x.shape)}")
        y = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, self.in_features).to(torch.bfloat16), self.codes, self.scales)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def storage_bytes(self) -> int:
        return self.codes.numel() + 2 * self.scales.numel()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


_PROJECTIONS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def quantize_for_decode(model: TransformerLM, source: object | None = None,
                        head: str = "int8") -> TransformerLM:
    """Swap ``model``'s seven projections per block for :class:`Int4Linear` and its output
    layer for ``head`` ("int8": :class:`Int8Linear`, "int4": :class:`Int4Linear`, "float":
    unchanged), **in place**; return the model.

    ``source`` (a :class:`~llmbook.inference.gguf_file.GGUFFile` the model was loaded from):
    a projection stored there as Q4_1 keeps its file's codes exactly
    (:meth:`Int4Linear.from_q4_1`); otherwise the float weights are rounded
    (:meth:`Int4Linear.from_float`). With tied embeddings the lookup keeps the float table
    and only the output layer is quantised. The model needs SwiGLU blocks without biases.
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if head not in ("int8", "int4", "float"):
        raise ValueError(f"head must be 'int8', 'int4' or 'float', got {head!r}")
    if model.config.mlp != "swiglu" or model.config.qkv_bias or model.config.mlp_bias:
        raise ValueError("quantize_for_decode takes Llama-style models (SwiGLU, no biases)")
    from llmbook.inference.gguf import book_name  # GGUF's tensor names, in the book's words

    tensors = {book_name(n): t for n, t in getattr(source, "tensors", {}).items()}
    for layer, block in enumerate(model.blocks):
        for path in _PROJECTIONS:
            parent_name, attr = path.split(".")
            parent = getattr(block, parent_name)
            t = tensors.get(f"blocks.{layer}.{path}.weight")
            if t is not None and t.qtype == "Q4_1":
                new = Int4Linear.from_q4_1(t.data, t.shape)
            else:
                new = Int4Linear.from_float(getattr(parent, attr).weight)
            setattr(parent, attr, new)
    if head != "float":
        w = model.embed.weight if model.lm_head is None else model.lm_head.weight
        model.lm_head = Int8Linear(w) if head == "int8" else Int4Linear.from_float(w)
    return model


# ---------------------------------------------------------------- static cache and the step


@dataclass
class StaticKVCache:
    """Fixed-shape key and value buffers: L tensors of (B, H_kv, T_max, d_head) each.

    Unlike :class:`~llmbook.inference.kvcache.KVCache`, which hands attention the slice of
    the positions cached so far (a shape that grows every step), :func:`decode_step` writes
    position t in place and attends over all T_max slots with a mask that hides the slots
    beyond t: the same shapes at every step, which is what a compiled step needs.

    One buffer per layer, not one (L, B, H_kv, T_max, d_head) tensor: ``torch.compile``
    turns an in-place write into a slice of a tensor that is an input of the graph into a
    copy of the whole tensor, so a single buffer would be copied once per layer and step
    (measured: the compiled step then ran slower than the eager one).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @classmethod
    def for_model(cls, model: TransformerLM, batch_size: int, max_seq_len: int) -> StaticKVCache:
        c = model.config
        check_positive_int("batch_size", batch_size)
        check_positive_int("max_seq_len", max_seq_len)
        if max_seq_len > c.max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's {c.max_seq_len}")
        dtype = model.final_norm.weight.dtype
        shape = (batch_size, c.n_kv_heads, max_seq_len, c.d_head)
        return cls(tuple(torch.zeros(shape, dtype=dtype) for _ in range(c.n_layers)),
                   tuple(torch.zeros(shape, dtype=dtype) for _ in range(c.n_layers)))

    @property
    def max_seq_len(self) -> int:
        return self.keys[0].shape[2]

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def decode_step(model: TransformerLM, ids: Tensor, start: Tensor, cache: StaticKVCache) -> Tensor:
    """Logits of ``ids`` (B, T) at positions start .. start + T - 1, with a static cache: (B, T, V).

    The same computation as ``model(ids, cache=...)`` (chapter 12's cache), written for fixed
    shapes: ``start`` is a 0-d long tensor (not an int, so a compiled step does not
    specialise on it), keys and values are written into the buffers with ``index_copy_``,
    and the queries attend over every slot j with the mask j <= position. The model's own
    modules (norms, projections, SwiGLU, rotary tables) do the work.
    """
    c = model.config
    B, T = ids.shape
    pos = start + torch.arange(T)  # (T,)
    slots = torch.arange(cache.max_seq_len)  # (T_max,)
    mask = slots[None, :] <= pos[:, None]  # (T, T_max)
    x = model.embed.weight[ids]  # (B, T, d)
    if model.pos_embed is not None:  # GPT-2's learned positions
        x = x + model.pos_embed.weight[pos]
    rope = model.rope
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        h = block.attn_norm(x)
        q = attn.q_proj(h).view(B, T, c.n_heads, c.d_head).transpose(1, 2)  # (B, H, T, d_head)
        k = attn.k_proj(h).view(B, T, c.n_kv_heads, c.d_head).transpose(1, 2)
        v = attn.v_proj(h).view(B, T, c.n_kv_heads, c.d_head).transpose(1, 2)
        if rope is not None:
            cos, sin = rope.cos[pos].to(q.dtype), rope.sin[pos].to(q.dtype)  # (T, d_head/2)
            q, k = _rotate_pairs(q, cos, sin, rope.interleaved), _rotate_pairs(k, cos, sin, rope.interleaved)
        cache.keys[layer].index_copy_(2, pos, k.to(cache.keys[layer].dtype))
        cache.values[layer].index_copy_(2, pos, v.to(cache.values[layer].dtype))
        z = F.scaled_dot_product_attention(q, cache.keys[layer].to(q.dtype),
                                           cache.values[layer].to(q.dtype), attn_mask=mask,
                                           scale=attn.scale, enable_gqa=True)  # (B, H, T, d_head)
        x = x + attn.o_proj(z.transpose(1, 2).reshape(B, T, c.n_heads * c.d_head))
        x = x + block.mlp(block.mlp_norm(x))  # (B, T, d)
    h = model.final_norm(x)
    return F.linear(h, model.embed.weight) if model.lm_head is None else model.lm_head(h)


_COMPILED: weakref.WeakKeyDictionary[nn.Module, Callable[..., Tensor]] = weakref.WeakKeyDictionary()


def compiled_decode_step(model: TransformerLM) -> Callable[[Tensor, Tensor, StaticKVCache], Tensor]:
    """:func:`decode_step` for ``model`` compiled by ``torch.compile`` (one graph per shape of
    ``ids`` and of the cache). The first call of each shape compiles (tens of seconds on a
    CPU); later calls run the graph. The compiled function is kept with the model, so asking
    again for the same model returns it without compiling anew."""
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if model not in _COMPILED:
        def step(ids: Tensor, start: Tensor, cache: StaticKVCache) -> Tensor:
            return decode_step(model, ids, start, cache)
        _COMPILED[model] = torch.compile(step, dynamic=False)
    return _COMPILED[model]


# ---------------------------------------------------------------- measuring the roofline


def stream_bandwidth(n_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s of a STREAM-style copy of ``n_bytes`` (default 256 MiB),
    best of ``repeats``: a copy reads and writes ``n_bytes`` each, so it moves 2 n_bytes."""
    n_bytes = check_positive_int("n_bytes", n_bytes)
    src = torch.ones(n_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(check_positive_int("repeats", repeats)):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def _module_bytes(module: nn.Module) -> int:
    if isinstance(module, Int4Linear | Int8Linear):
        return module.storage_bytes()
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))


def decode_bytes_per_token(model: TransformerLM, context_length: int,
                           cache_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes one decoding step reads: every weight of the blocks and the output layer once
    (the embedding lookup reads one row), and the cached keys and values of
    ``context_length`` positions: 2 L T H_kv d_head bytes(dtype). Returns a dict with
    "weights", "kv_cache" and "total"."""
    c = model.config
    context_length = check_positive_int("context_length", context_length)
    weights = sum(_module_bytes(m) for m in model.blocks.modules()) + _module_bytes(model.final_norm)
    out = model.embed if model.lm_head is None else model.lm_head
    weights += _module_bytes(out)
    if model.lm_head is not None:  # the lookup reads one row of the table
        weights += model.embed.weight.shape[1] * model.embed.weight.element_size()
    dtype = cache_dtype or model.final_norm.weight.dtype
    kv = 2 * c.n_layers * context_length * c.n_kv_heads * c.d_head * \
        torch.empty((), dtype=dtype).element_size()
    return {"weights": int(weights), "kv_cache": int(kv), "total": int(weights + kv)}


#: How :func:`profile_decode_step` groups PyTorch operators.
PROFILE_GROUPS = {
    "matmul (linear layers)": ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul",
                               "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm"),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product_attention"),
    "elementwise and norms": ("aten::mul", "aten::add", "aten::rsqrt", "aten::pow", "aten::mean",
                              "aten::silu", "aten::sub", "aten::cat", "aten::stack"),
}


def profile_decode_step(step: Callable[[], object], repeats: int = 10) -> dict[str, float]:
    """Where a decoding step's time goes: run ``step()`` ``repeats`` times under
    ``torch.profiler`` and return the self CPU time per call (seconds) of each group of
    :data:`PROFILE_GROUPS`, the rest of the operators ("other operators"), and the wall
    time not spent inside any operator ("Python and dispatch"), which is the overhead a
    compiled step removes."""
    from torch.profiler import ProfilerActivity, profile

    repeats = check_positive_int("repeats", repeats)
    step()  # warm up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(repeats):
            step()
        wall = (time.perf_counter() - t) / repeats
    groups = dict.fromkeys([*PROFILE_GROUPS, "other operators"], 0.0)
    for event in prof.key_averages():
        name = event.key
        group = next((g for g, prefixes in PROFILE_GROUPS.items()
                      if name.startswith(prefixes)), "other operators")
        groups[group] += event.self_cpu_time_total / 1e6 / repeats
    groups["Python and dispatch"] = max(wall - sum(groups.values()), 0.0)
    groups["wall"] = wall
    return groups
