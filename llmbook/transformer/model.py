"""The decoder-only transformer: one configurable model for the GPT-2 and Llama families.

Introduced in notebooks/07_decoder. The pieces come from the chapters before: token
embeddings (chapter 2), multi-head attention with grouped-query heads (chapter 4), learned
and rotary positions (chapter 5), LayerNorm/RMSNorm and the MLP/SwiGLU feed-forward layers
(chapter 6). A model is

    x_0 = E[ids] (+ P[positions]),
    x_l = x_{l-1} + Attn(Norm(x_{l-1})),   x_l = x_l + FFN(Norm(x_l))   for l = 1..L,
    z   = Norm(x_L) W_out^T                (W_out = E when the embeddings are tied),

the *pre-norm* block of GPT-2 (Radford et al., 2019, "Language Models are Unsupervised
Multitask Learners", section 2.3) and Llama (Touvron et al., 2023, "LLaMA: Open and
Efficient Foundation Language Models"). The two families differ only in the choices a
:class:`TransformerConfig` records: LayerNorm or RMSNorm, learned positions or RoPE, a
GELU MLP or SwiGLU, biases, grouped-query heads, tied or untied output layer.

Contents:

* :class:`TransformerConfig` - the hyper-parameters, validated at construction, with the
  named constructors :meth:`~TransformerConfig.gpt2_style`,
  :meth:`~TransformerConfig.llama_style` and :meth:`~TransformerConfig.qwen2_style`;
* :class:`QKNormAttention` - attention with an RMSNorm on each query and key head (Qwen3);
* :class:`DecoderBlock` - x + attn(norm(x)), then x + ffn(norm(x)) (or post-norm, or
  Gemma 2's sandwich of both);
* :class:`GeGLU` - the gated feed-forward layer with a GELU gate (Gemma);
* :class:`TransformerLM` - embeddings, L blocks, final norm, LM head;
* :func:`minimal_forward` - the same forward pass in a dozen lines, without the cache,
  packing masks or input checks: the teaching version (equal to ``TransformerLM.forward``,
  tested);
* :func:`expected_initial_loss` - the cross-entropy to expect at initialisation, with the
  correction that tied embeddings bring (the current token's own logit is raised).

:func:`llmbook.transformer.hf_loading.from_hf` builds one from a Hugging Face GPT-2, Llama,
Qwen2/3, Mistral, OLMo 2, Gemma 2/3 or SmolLM3 model (that module imports this one, never the other way round).

Closed-form parameter and FLOP counts are in :mod:`llmbook.transformer.sizing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llmbook.text.embedding import TokenEmbedding
from llmbook.transformer.attention import AttentionCache, MultiHeadAttention, soft_cap
from llmbook.transformer.layers import ACTIVATIONS, MLP, LayerNorm, RMSNorm, SwiGLU, _check_input
from llmbook.transformer.positional import LearnedPositions, RotaryEmbedding, apply_rotary
from llmbook.validation import check_nonnegative_number, check_positive_int, check_probability

__all__ = ["DecoderBlock", "GeGLU", "QKNormAttention", "TransformerConfig", "TransformerLM", "expected_initial_loss",
           "minimal_forward"]

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "swiglu", "geglu")
QK_NORM_SCOPES = ("head", "all")
NORM_POSITIONS = ("pre", "post", "sandwich")
LAYER_TYPES = ("full_attention", "sliding_attention")
ROPE_SCALINGS = ("default", "linear", "llama3")
#: Options added after the first models were shipped, with their defaults (see ``to_dict``).
LATER_OPTIONS: dict[str, Any] = {"qk_norm": False, "qk_norm_scope": "head", "norm_position": "pre",
                                 "sliding_window": None, "rope_scaling": None, "layer_types": None,
                                 "no_rope_layers": None, "embed_scale": 1.0, "attn_scale": None,
                                 "attn_softcap": None, "final_softcap": None, "rope_local_theta": None}


def _choice(name: str, value: object, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"unknown {name}={value!r}; choose one of {list(options)}")


@dataclass
class TransformerConfig:
    """The hyper-parameters of a decoder-only transformer (validated at construction).

    Sizes: ``vocab_size`` V, ``d_model`` d, ``n_layers`` L, ``n_heads`` H, ``n_kv_heads``
    H_kv (default H; H_kv < H is grouped-query attention), ``d_head`` (default d / H),
    ``d_ff`` (the feed-forward width; default 4 d for the GELU MLP and Llama's rule
    2/3 * 4 d rounded up to a multiple of 32 for SwiGLU), ``max_seq_len`` T_max.

    Choices: ``norm`` "layernorm" | "rmsnorm" with ``norm_eps`` and ``norm_bias`` (LayerNorm's
    beta; RMSNorm has none); ``positions`` "learned" (a T_max x d table added to the embeddings) | "rope"
    (``rope_theta``, ``rope_interleaved`` for the pairing); ``mlp`` "gelu" (two matrices,
    ``activation`` default "gelu_tanh", GPT-2's) | "swiglu" (three matrices, SiLU gate);
    biases: ``attn_bias`` for all attention projections, overridden by ``qkv_bias`` (queries,
    keys, values) and ``out_bias`` (output projection), ``mlp_bias``; ``tie_embeddings``
    (LM head = E). ``init_std`` is the standard deviation of the initial weights and
    ``fused_attention`` selects PyTorch's fused attention kernel (see :class:`TransformerLM`).
    ``qk_norm`` puts an RMSNorm (eps ``norm_eps``) on the queries and keys before the rotation
    (:class:`QKNormAttention`): over each head of d_head entries (``qk_norm_scope="head"``,
    Qwen3) or over all heads at once (``"all"``, OLMo 2). ``norm_position`` "pre" (default,
    x + f(Norm x)) or "post" (x + Norm(f(x)), OLMo 2's reordered norm). ``sliding_window``
    W lets position i attend only to j with i - j < W (Mistral; None: the whole prefix).
    ``rope_scaling`` is a Hugging Face ``rope_parameters`` dict of type "linear" or
    "llama3" (Llama 3.1), handed to :class:`~llmbook.transformer.positional.RotaryEmbedding`.

    Gemma 2 (Riviere et al., 2024) and NoPE layers: ``norm_position="sandwich"`` puts a norm
    before *and* after each sub-layer, x + Norm(f(Norm x)); ``mlp="geglu"`` is the gated layer
    with a GELU gate (``activation`` default "gelu_tanh"); ``embed_scale`` multiplies the
    embedding rows (Gemma: sqrt(d)); ``attn_scale`` replaces 1/sqrt(d_head) in the scores
    (Gemma 2: ``query_pre_attn_scalar ** -0.5``); ``attn_softcap`` and ``final_softcap``
    soft-cap the attention scores and the output logits (cap tanh(z / cap));
    ``layer_types`` (one "full_attention" | "sliding_attention" per layer; None: every layer
    slides when ``sliding_window`` is set, as Mistral) alternates local and global layers;
    ``rope_local_theta`` (Gemma 3) gives the sliding layers their own RoPE base, without
    ``rope_scaling`` (None: they share the global one); ``no_rope_layers`` lists the layers that skip the rotation (NoPE, Kazemnejad et al., 2023;
    SmolLM3 drops it in every fourth layer).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    d_head: int | None = None
    d_ff: int | None = None
    max_seq_len: int = 1024
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_bias: bool = True
    positions: str = "learned"
    rope_theta: float = 10000.0
    rope_interleaved: bool = False
    mlp: str = "gelu"
    activation: str | None = None
    attn_bias: bool = True
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    mlp_bias: bool = True
    tie_embeddings: bool = True
    init_std: float = 0.02
    fused_attention: bool = True
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    norm_position: str = "pre"
    sliding_window: int | None = None
    rope_scaling: dict | None = None
    layer_types: tuple[str, ...] | None = None
    no_rope_layers: tuple[int, ...] | None = None
    embed_scale: float = 1.0
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    rope_local_theta: float | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
            check_positive_int(name, getattr(self, name))
        _choice("norm", self.norm, NORMS)
        _choice("positions", self.positions, POSITIONS)
        _choice("mlp", self.mlp, MLPS)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        check_positive_int("n_kv_heads", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.d_head is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(f"d_model={self.d_model} is not divisible by "
                                 f"n_heads={self.n_heads} (or give d_head explicitly)")
            self.d_head = self.d_model // self.n_heads
        check_positive_int("d_head", self.d_head)
        if self.positions == "rope" and self.d_head % 2:
            raise ValueError(f"RoPE rotates pairs, so d_head must be even, got d_head={self.d_head}")
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model if self.mlp == "gelu" else \
                32 * math.ceil(int(8 * self.d_model / 3) / 32)
        check_positive_int("d_ff", self.d_ff)
        if self.activation is None:
            self.activation = "gelu_tanh" if self.mlp in ("gelu", "geglu") else "silu"
        if self.mlp == "swiglu" and self.activation not in ("silu", "swish"):
            raise ValueError(f"mlp='swiglu' gates with SiLU, got activation={self.activation!r}")
        _choice("activation", self.activation, tuple(sorted(ACTIVATIONS)))
        if self.qkv_bias is None:
            self.qkv_bias = self.attn_bias
        if self.out_bias is None:
            self.out_bias = self.attn_bias
        for name in ("norm_eps", "rope_theta", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {name}={value!r}")
        if self.qk_norm and self.norm != "rmsnorm":
            raise ValueError("qk_norm=True normalises the heads with RMSNorm; it needs norm='rmsnorm'")
        _choice("qk_norm_scope", self.qk_norm_scope, QK_NORM_SCOPES)
        _choice("norm_position", self.norm_position, NORM_POSITIONS)
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, dict):
                raise TypeError(f"rope_scaling must be a dict or None, got {type(self.rope_scaling).__name__}")
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ROPE_SCALINGS or self.rope_scaling.get("partial_rotary_factor", 1.0) != 1.0:
                raise ValueError(f"unsupported rope_scaling {self.rope_scaling!r}: the model takes rope_type "
                                 f"in {list(ROPE_SCALINGS)} on every component of the head")
        if self.layer_types is not None:
            self.layer_types = tuple(self.layer_types)
            if len(self.layer_types) != self.n_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for n_layers={self.n_layers}")
            for kind in self.layer_types:
                _choice("layer_types entry", kind, LAYER_TYPES)
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has 'sliding_attention' layers but sliding_window is None")
        if self.no_rope_layers is not None:
            self.no_rope_layers = tuple(self.no_rope_layers)
            for layer in self.no_rope_layers:
                if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
                    raise ValueError(f"no_rope_layers entries must be layer indices in [0, {self.n_layers}), "
                                     f"got {layer!r}")
            if self.positions != "rope":
                raise ValueError("no_rope_layers needs positions='rope'")
        for name in ("embed_scale", "attn_scale", "attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if (value is not None or name == "embed_scale") and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or not value > 0):
                raise ValueError(f"{name} must be a positive finite number or None, got {name}={value!r}")
        if self.rope_local_theta is not None:
            if self.positions != "rope" or "sliding_attention" not in (self.layer_types or ()):
                raise ValueError("rope_local_theta is the RoPE base of the sliding layers: it needs "
                                 "positions='rope' and layer_types with 'sliding_attention' entries")
            if isinstance(self.rope_local_theta, bool) or not isinstance(self.rope_local_theta, int | float) \
                    or not self.rope_local_theta > 1:
                raise ValueError(f"rope_local_theta must be a number greater than 1, got {self.rope_local_theta!r}")
        if self.positions == "rope" and not self.rope_theta > 1:
            raise ValueError(f"rope_theta must be greater than 1, got {self.rope_theta}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (e.g. for a checkpoint or a JSON file).

        The options added for newer architectures (:data:`LATER_OPTIONS`: QK-norm, the norms'
        position, the sliding window, RoPE scaling) appear only when they differ from their
        defaults, so that the recipes, hashes and recorded configurations written before they
        existed still compare equal; ``TransformerConfig(**d)`` restores the defaults."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.name in LATER_OPTIONS and getattr(self, f.name) == LATER_OPTIONS[f.name])}

    @classmethod
    def gpt2_style(cls, vocab_size: int = 50257, d_model: int = 768, n_layers: int = 12,
                   n_heads: int = 12, max_seq_len: int = 1024, **overrides: Any) -> TransformerConfig:
        """GPT-2 (Radford et al., 2019): LayerNorm (eps 1e-5) with biases, learned positions,
        a 4d-wide MLP with the tanh GELU, biases everywhere, tied embeddings. The defaults
        are GPT-2 small (124M parameters)."""
        kw: dict[str, Any] = dict(norm="layernorm", norm_eps=1e-5, norm_bias=True,
                                  positions="learned", mlp="gelu", activation="gelu_tanh",
                                  attn_bias=True, mlp_bias=True, tie_embeddings=True)
        kw.update(overrides)
        return cls(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                   max_seq_len=max_seq_len, **kw)

    @classmethod
    def llama_style(cls, vocab_size: int = 32000, d_model: int = 4096, n_layers: int = 32,
                    n_heads: int = 32, max_seq_len: int = 4096, **overrides: Any) -> TransformerConfig:
        """Llama (Touvron et al., 2023): RMSNorm (eps 1e-5, Llama 2's; the first Llama used
        1e-6), RoPE (theta 10^4, half-split
        pairing as in Hugging Face checkpoints), SwiGLU, no biases, untied LM head; pass
        ``n_kv_heads`` for grouped-query attention. The defaults are Llama 2 7B's shape
        (d_ff = 11008)."""
        kw: dict[str, Any] = dict(norm="rmsnorm", norm_eps=1e-5, norm_bias=False,
                                  positions="rope", rope_theta=10000.0, rope_interleaved=False,
                                  mlp="swiglu", activation="silu", attn_bias=False,
                                  mlp_bias=False, tie_embeddings=False)
        if d_model == 4096 and "d_ff" not in overrides:
            kw["d_ff"] = 11008
        kw.update(overrides)
        return cls(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                   max_seq_len=max_seq_len, **kw)

    @classmethod
    def qwen2_style(cls, vocab_size: int = 151936, d_model: int = 896, n_layers: int = 24,
                    n_heads: int = 14, max_seq_len: int = 32768, **overrides: Any) -> TransformerConfig:
        """Qwen2 (Yang et al., 2024, "Qwen2 Technical Report"): Llama's block with biases on
        the query, key and value projections only, and RoPE theta 10^6. The defaults are
        Qwen2-0.5B (2 KV heads, d_ff = 4864, tied embeddings, 494,032,768 parameters) with
        its RMSNorm eps of 1e-6."""
        kw: dict[str, Any] = dict(rope_theta=1_000_000.0, qkv_bias=True, out_bias=False, norm_eps=1e-6)
        if (vocab_size, d_model, n_layers, n_heads) == (151936, 896, 24, 14):
            kw.update(n_kv_heads=2, d_ff=4864, tie_embeddings=True)
        kw.update(overrides)
        return cls.llama_style(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                               n_heads=n_heads, max_seq_len=max_seq_len, **kw)


class QKNormAttention(MultiHeadAttention):
    """Multi-head attention with an RMSNorm on every query and key head (QK-norm).

    Qwen3 (Yang et al., 2025, "Qwen3 Technical Report") normalises each head of Q and of K
    over its d_head entries, with a learned gain shared by the heads (``q_norm``, ``k_norm``,
    named as in Hugging Face's ``Qwen3Attention``; ``scope="head"``), *before* the rotary
    embedding; OLMo 2 (OLMo et al., 2024, "2 OLMo 2 Furious") normalises the whole projection,
    all heads at once (``scope="all"``, gains of H d_head and H_kv d_head entries). The scores
    q . k / sqrt(d_head) are then bounded by the gains, whatever the size of the stream
    (Dehghani et al., 2023, "Scaling Vision Transformers to 22 Billion Parameters", used it
    against exploding attention logits). Arguments as :class:`MultiHeadAttention`, plus
    ``eps`` for the two norms. Shapes as the parent's; only the parent's hook
    :meth:`~MultiHeadAttention.normalise_qk` is overridden.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 eps: float = 1e-6, scope: str = "head", **kwargs: Any) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, **kwargs)
        _choice("scope", scope, QK_NORM_SCOPES)
        self.scope = scope
        whole = scope == "all"
        self.q_norm = RMSNorm(self.d_head * (self.n_heads if whole else 1), eps=eps)
        self.k_norm = RMSNorm(self.d_head * (self.n_kv_heads if whole else 1), eps=eps)

    def normalise_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """QK-norm of the split heads q (..., H, T, d_head), k (..., H_kv, T, d_head): same shapes.

        :meth:`MultiHeadAttention.project_qkv` calls it before the rotary embedding.
        """
        if self.scope == "head":  # Qwen3: each head on its own
            return self.q_norm(q), self.k_norm(k)
        # OLMo 2: one norm over all heads of a position, (..., T, H d_head), then split again
        q = self.split_heads(self.q_norm(q.transpose(-3, -2).flatten(-2)), self.n_heads)
        k = self.split_heads(self.k_norm(k.transpose(-3, -2).flatten(-2)), self.n_kv_heads)
        return q, k


class DecoderBlock(nn.Module):
    """One pre-norm decoder block: x + Attn(Norm(x)), then + FFN(Norm(x)).

    With ``norm_position="post"`` (OLMo 2) the norms act on the sub-layers' outputs instead:
    x + Norm(Attn(x)), then + Norm(FFN(x)). With ``"sandwich"`` (Gemma 2) both:
    x + Norm'(Attn(Norm x)), then + Norm'(FFN(Norm x)), the outer norms being
    ``attn_post_norm`` and ``mlp_post_norm``. ``layer`` (default 0) is the block's index:
    a layer listed in ``config.no_rope_layers`` ignores the rotation it is handed (NoPE).

    Submodules ``attn_norm``, ``attn`` (:class:`~llmbook.transformer.attention.MultiHeadAttention`),
    ``mlp_norm`` and ``mlp`` (:class:`~llmbook.transformer.layers.MLP` or :class:`~llmbook.transformer.layers.SwiGLU`).
    Shapes: (B, T, d) -> (B, T, d).
    """

    def __init__(self, config: TransformerConfig, layer: int = 0) -> None:
        super().__init__()
        c = config
        self.use_rope = layer not in (c.no_rope_layers or ())
        self.attn_norm = _make_norm(c)
        attention = dict(d_head=c.d_head, qkv_bias=c.qkv_bias, out_bias=c.out_bias,
                         fused=c.fused_attention, scale=c.attn_scale, softcap=c.attn_softcap)
        self.post_norm = c.norm_position == "post"
        self.attn = QKNormAttention(c.d_model, c.n_heads, c.n_kv_heads, eps=c.norm_eps, scope=c.qk_norm_scope,
                                    **attention) \
            if c.qk_norm else MultiHeadAttention(c.d_model, c.n_heads, c.n_kv_heads, **attention)
        self.mlp_norm = _make_norm(c)
        if c.mlp == "gelu":
            self.mlp: nn.Module = MLP(c.d_model, c.d_ff, activation=c.activation, bias=c.mlp_bias)
        elif c.mlp == "geglu":
            self.mlp = GeGLU(c.d_model, c.d_ff, bias=c.mlp_bias, activation=c.activation)
        else:
            self.mlp = SwiGLU(c.d_model, c.d_ff, bias=c.mlp_bias)
        self.sandwich = c.norm_position == "sandwich"
        if self.sandwich:
            self.attn_post_norm, self.mlp_post_norm = _make_norm(c), _make_norm(c)

    def forward(self, x: Tensor, positions: Tensor | None = None,
                rope: Callable[[Tensor, Tensor], Tensor] | None = None,
                cache: AttentionCache | None = None, layer: int = 0,
                mask: Tensor | None = None) -> Tensor:
        rope = rope if self.use_rope else None
        if self.sandwich:  # Gemma 2: x + Norm'(f(Norm x))
            x = x + self.attn_post_norm(self.attn(self.attn_norm(x), positions=positions, rope=rope,
                                                  cache=cache, layer=layer, mask=mask))  # (B, T, d)
            return x + self.mlp_post_norm(self.mlp(self.mlp_norm(x)))  # (B, T, d)
        if self.post_norm:  # OLMo 2: x + Norm(f(x))
            x = x + self.attn_norm(self.attn(x, positions=positions, rope=rope, cache=cache,
                                             layer=layer, mask=mask))  # (B, T, d)
            return x + self.mlp_norm(self.mlp(x))  # (B, T, d)
        x = x + self.attn(self.attn_norm(x), positions=positions, rope=rope, cache=cache,
                          layer=layer, mask=mask)  # (B, T, d)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, d)


class GeGLU(SwiGLU):
    """The gated feed-forward layer with a GELU gate (Shazeer, 2020), Gemma's MLP:

        GeGLU(x) = W_down (GELU(W_gate x) * W_up x),

    :class:`~llmbook.transformer.layers.SwiGLU` with another gate ``activation`` (a key of
    :data:`~llmbook.transformer.layers.ACTIVATIONS`; Gemma uses "gelu_tanh", Hugging Face's
    ``gelu_pytorch_tanh``). Same submodules, shapes and parameter count as SwiGLU.
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False, dtype: torch.dtype | None = None,
                 activation: str = "gelu_tanh") -> None:
        super().__init__(d_model, d_ff, bias=bias, dtype=dtype)
        _choice("activation", activation, tuple(sorted(ACTIVATIONS)))
        self.activation = activation
        self.act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        x = _check_input(x, self.d_model, "GeGLU")
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # (..., d_model)


def _make_norm(c: TransformerConfig) -> nn.Module:
    if c.norm == "layernorm":
        return LayerNorm(c.d_model, eps=c.norm_eps, bias=c.norm_bias)
    return RMSNorm(c.d_model, eps=c.norm_eps)


class TransformerLM(nn.Module):
    """A decoder-only language model: ids (B, T) -> logits (B, T, V).

    Submodules: ``embed`` (:class:`~llmbook.text.embedding.TokenEmbedding`, E of shape (V, d)),
    ``pos_embed`` (:class:`~llmbook.transformer.positional.LearnedPositions`, or None with RoPE),
    ``rope`` (:class:`~llmbook.transformer.positional.RotaryEmbedding`, one shared by all layers, or
    None), ``blocks`` (L :class:`DecoderBlock`), ``final_norm`` and ``lm_head``
    (nn.Linear(d, V) without bias, or None when tied: then z = h E^T).

    Initialisation (GPT-2's, as in Radford et al., 2019, section 2.3, and nanoGPT): every
    weight matrix and both embedding tables N(0, s^2) with s = ``init_std`` = 0.02; the
    projections that write into the residual stream (attention ``o_proj`` and the MLP's
    ``proj`` / ``down_proj``) N(0, s^2 / (2L)), so that the variance the 2L residual
    branches add up to stays independent of depth; biases 0, norm gains 1. ``generator``
    makes it reproducible. The model can be built on the meta device (``with
    torch.device("meta"):``) to count parameters and FLOPs of large shapes for free.

    ``config.fused_attention`` (default True) runs the attention step with PyTorch's
    fused ``scaled_dot_product_attention``; :meth:`set_fused_attention` switches every
    layer to the book's own implementation (chapter 4) and back. Both agree to round-off.
    """

    def __init__(self, config: TransformerConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = c = config
        self.embed = TokenEmbedding(c.vocab_size, c.d_model, std=c.init_std, scale=c.embed_scale)
        self.pos_embed = LearnedPositions(c.max_seq_len, c.d_model, std=c.init_std) \
            if c.positions == "learned" else None
        self.rope = RotaryEmbedding(c.d_head, c.rope_theta, c.max_seq_len, c.rope_interleaved,
                                    scaling=c.rope_scaling) if c.positions == "rope" else None
        self.rope_local = None if c.rope_local_theta is None else \
            RotaryEmbedding(c.d_head, c.rope_local_theta, c.max_seq_len, c.rope_interleaved)  # Gemma 3's local layers
        self.blocks = nn.ModuleList(DecoderBlock(c, layer) for layer in range(c.n_layers))
        self.final_norm = _make_norm(c)
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2's initialisation (see the class docstring)."""
        s = self.config.init_std
        residual_std = s / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:  # norm gains
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "mlp.proj.weight", "down_proj.weight")):
                p.normal_(0.0, residual_std, generator=generator)
            else:
                p.normal_(0.0, s, generator=generator)

    def set_fused_attention(self, fused: bool) -> None:
        """Use PyTorch's fused attention kernel (True) or the book's (False) in every layer."""
        self.config.fused_attention = bool(fused)
        for block in self.blocks:
            block.attn.fused = bool(fused)

    def _check_inputs(self, ids: object, positions: object) -> Tensor:
        c = self.config
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be integer token ids (torch.long), got {ids.dtype}")
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"ids must have shape (B, T) with T >= 1, got {tuple(ids.shape)}")
        B, T = ids.shape
        if positions is None:
            if T > c.max_seq_len:
                raise ValueError(f"sequence length T={T} exceeds max_seq_len={c.max_seq_len}")
            positions = torch.arange(T, device=ids.device)  # (T,)
        elif not isinstance(positions, Tensor) or positions.shape not in ((T,), (B, T)) or \
                positions.dtype not in (torch.int64, torch.int32):
            got = (tuple(positions.shape), positions.dtype) if isinstance(positions, Tensor) \
                else type(positions).__name__
            raise ValueError(f"positions must be integers of shape (T,) = ({T},) or (B, T) = "
                             f"({B}, {T}), got {got}")
        if ids.device.type != "meta":  # a meta tensor has no values to check
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= c.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"token id {bad} is out of range for vocab_size={c.vocab_size} "
                                 f"(ids must lie in [0, {c.vocab_size - 1}])")
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= c.max_seq_len:
                raise ValueError(f"position {lo if lo < 0 else hi} is out of range for "
                                 f"max_seq_len={c.max_seq_len}")
        return positions

    def _check_cache(self, ids: Tensor, positions: Tensor | None, cache: AttentionCache) -> Tensor:
        c = self.config
        if not isinstance(ids, Tensor) or ids.ndim != 2:
            raise ValueError(f"ids must have shape (B, T), got "
                             f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
        B, T = ids.shape
        want = (c.n_layers, c.n_kv_heads, c.d_head)
        if (cache.n_layers, cache.n_kv_heads, cache.d_head) != want or cache.batch_size != B:
            raise ValueError(f"cache of shape (L, B, H_kv, d_head) = ({cache.n_layers}, "
                             f"{cache.batch_size}, {cache.n_kv_heads}, {cache.d_head}) does not "
                             f"fit this model and batch ({want[0]}, {B}, {want[1]}, {want[2]})")
        if cache.length + T > cache.max_seq_len:
            raise ValueError(f"{cache.length} cached + {T} new tokens = {cache.length + T} "
                             f"exceed the cache's max_seq_len={cache.max_seq_len}")
        if positions is None:
            positions = cache.length + torch.arange(T, device=ids.device)  # (T,)
        return positions

    def forward(self, ids: Tensor, positions: Tensor | None = None,
                cache: AttentionCache | None = None, mask: Tensor | None = None) -> Tensor:
        """Logits of the next token at every position: ids (B, T) -> (B, T, V).

        ``positions`` (T,) or (B, T) default to 0, 1, ..., T-1; with ``positions=None`` a
        sequence longer than ``max_seq_len`` is a ``ValueError`` naming both. With a
        ``cache`` (:class:`~llmbook.inference.kvcache.KVCache`, chapter 12) ``ids`` are the tokens
        that follow the cached ones: positions default to ``cache.length + arange(T)``,
        attention sees the cached keys and values too, and the cache grows by T.

        ``mask`` (boolean, True = may attend, broadcasting to (B, H, T, T_k)) is and-ed with
        the causal mask in every layer: with ``positions`` that restart at 0 for each
        document, a block-diagonal mask lets several documents share one row (*packing*,
        chapter 17) with each seeing only itself.
        """
        h = self.hidden_states(ids, positions, cache, mask)  # (B, T, d)
        z = F.linear(h, self.embed.weight) if self.lm_head is None else self.lm_head(h)  # (B, T, V); tied: h E^T
        if self.config.final_softcap is not None:  # Gemma 2: cap tanh(z / cap)
            z = soft_cap(z, self.config.final_softcap)
        return z

    def hidden_states(self, ids: Tensor, positions: Tensor | None = None,
                      cache: AttentionCache | None = None, mask: Tensor | None = None) -> Tensor:
        """The final-normed hidden states h: ids (B, T) -> (B, T, d); arguments as :meth:`forward`.

        The logits are h E^T (or the untied head applied to h); a reward model (chapter 17)
        puts a scalar head on h instead.
        """
        c = self.config
        if cache is not None:
            positions = self._check_cache(ids, positions, cache)
        positions = self._check_inputs(ids, positions)
        x = F.embedding(ids, self.embed.weight)  # (B, T, d): the lookup E[ids] of chapter 2
        if c.embed_scale != 1.0:  # Gemma: E[ids] sqrt(d)
            x = x * c.embed_scale
        if self.pos_embed is not None:
            x = x + self.pos_embed.weight[positions]  # (B, T, d)
        rope = _rotation(self.rope, positions, x.dtype)  # looked up once, shared by every layer
        rope_local = rope if self.rope_local is None else _rotation(self.rope_local, positions, x.dtype)
        local_mask = mask
        if c.sliding_window is not None:  # Mistral: key j visible from query i if i - j < W
            k_pos = positions if cache is None else torch.arange(cache.length + ids.shape[1], device=ids.device)
            band = (positions[..., :, None] - k_pos[..., None, :]) < c.sliding_window  # (T, T_k) or (B, T, T_k)
            band = band[:, None] if band.ndim == 3 else band  # (B, 1, T, T_k): shared by the heads
            local_mask = band if mask is None else mask & band
        types = c.layer_types or ("sliding_attention",) * c.n_layers
        for layer, block in enumerate(self.blocks):
            local = types[layer] == "sliding_attention"  # Gemma 2 and 3: local / global layers
            x = block(x, positions, rope_local if local else rope, cache, layer,
                      local_mask if local else mask)  # (B, T, d)
        if cache is not None:
            cache.advance(ids.shape[1])
        return self.final_norm(x)  # (B, T, d)

    def num_parameters(self) -> int:
        """The number of distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())


def _rotation(rope: RotaryEmbedding | None, positions: Tensor,
              dtype: torch.dtype) -> Callable[[Tensor, Tensor], Tensor] | None:
    """The rotation of ``rope`` at ``positions`` (T,) or (B, T), looked up once, as a function of
    the queries or keys (B, H, T, d_head); None without RoPE."""
    if rope is None:
        return None
    cos, sin = rope.cos[positions], rope.sin[positions]  # (..., T, d_head/2)
    if positions.ndim == 2:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d_head/2), shared by the heads
    cos, sin = cos.to(dtype), sin.to(dtype)
    interleaved = rope.interleaved

    def rotate(t: Tensor, _positions: Tensor) -> Tensor:
        return apply_rotary(t, cos, sin, interleaved=interleaved)  # (B, H, T, d_head)

    return rotate


def minimal_forward(model: TransformerLM, ids: Tensor) -> Tensor:
    """The forward pass of ``model`` without the production branches: ids (B, T) -> logits (B, T, V).

    Embed, add learned positions (GPT-2), run the L pre-norm blocks (RoPE models hand
    chapter 5's rotation to every attention layer), apply the final norm and the output
    layer ``z = h W_out^T`` (``W_out = E`` when tied). No KV cache, packing mask,
    custom positions or input checks: :meth:`TransformerLM.forward` adds those and
    computes the same logits (tested to 1e-12 in float64).
    """
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}")
    if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError("ids must be an integer tensor of shape (B, T)")
    c = model.config
    if c.sliding_window is not None or c.embed_scale != 1.0 or c.final_softcap is not None:
        raise ValueError("minimal_forward has no sliding-window mask, embedding scale or logit soft-cap; "
                         "use TransformerLM.forward")
    positions = torch.arange(ids.shape[1], device=ids.device)  # (T,)
    x = model.embed.weight[ids]  # (B, T, d): E[ids]
    if model.pos_embed is not None:
        x = x + model.pos_embed.weight[positions]  # (B, T, d): + P[positions]
    for block in model.blocks:
        x = block(x, positions, model.rope)  # (B, T, d): x + Attn(Norm x), then + FFN(Norm x)
    h = model.final_norm(x)  # (B, T, d)
    w_out = model.embed.weight if model.lm_head is None else model.lm_head.weight  # (V, d)
    return h @ w_out.T  # (B, T, V)


def expected_initial_loss(vocab_size: int, logit_var: float, self_logit: float = 0.0,
                          repeat_rate: float = 0.0) -> float:
    """The expected next-token cross-entropy (nats) of a freshly initialised model.

    At initialisation the logits z_v = h . W_v are small. With V - 1 of them independent of
    the context, mean 0 and variance ``logit_var`` = sigma^2, their exponentials sum to about
    (V - 1) exp(sigma^2 / 2) (the mean of a log-normal, times V - 1). With **tied**
    embeddings (W = E) one logit is different: the final hidden state h still carries the
    current token's own embedding E_x (the residual stream starts at E_x and the blocks add
    little at first), so z_x = h . E_x has a positive mean ``self_logit`` = mu. The loss
    ell = log sum_v exp(z_v) - z_y then has expectation

        E[ell] ~= log((V - 1) exp(sigma^2 / 2) + exp(mu)) - r mu
               = log V + sigma^2 / 2 + (exp(mu - sigma^2 / 2) - 1) / V - r mu + O(1 / V^2),

    where ``repeat_rate`` r is the fraction of positions whose target equals the current
    token (only there does the raised logit belong to the target). With mu = 0 (untied) it
    is log V + sigma^2 / 2 to O(sigma^2 / V). Derived in notebooks/07_decoder (section 7.8)
    and tested there against the mean loss of many initialisations. Bad arguments raise
    ``TypeError`` (not a number) or ``ValueError`` (out of range) naming the argument.
    """
    V = check_positive_int("vocab_size", vocab_size)
    if V < 2:
        raise ValueError(f"vocab_size must be at least 2, got vocab_size={vocab_size}")
    s2 = check_nonnegative_number("logit_var", logit_var)
    if isinstance(self_logit, bool) or not isinstance(self_logit, int | float):
        raise TypeError(f"self_logit must be a number, got {self_logit!r} ({type(self_logit).__name__})")
    if not math.isfinite(self_logit):
        raise ValueError(f"self_logit must be finite, got self_logit={self_logit}")
    r = check_probability("repeat_rate", repeat_rate)
    return math.log((V - 1) * math.exp(s2 / 2) + math.exp(self_logit)) - r * self_logit
