"""Closed-form parameter counts and forward FLOPs of a :class:`~llmbook.transformer.model.TransformerLM`.

Introduced in notebooks/07_decoder, where both formulas are derived in SymPy and checked
against real models (ours and Hugging Face's, on the meta device for large shapes) and
against ``torch.utils.flop_counter.FlopCounterMode``.

Notation: V vocabulary, d model width, L layers, H query heads, H_kv key/value heads,
d_h head width, d_ff feed-forward width, T_max the length of a learned position table,
m = 2 feed-forward matrices for the GELU MLP and m = 3 for SwiGLU.

**Parameters** (each bias and LayerNorm beta only where the configuration has it):

* per layer, attention: d H d_h (W_Q) + 2 d H_kv d_h (W_K, W_V) + H d_h d (W_O), biases
  (H + 2 H_kv) d_h and d; feed-forward: m d d_ff, biases (m - 1) d_ff + d; two norms of
  d (+ d) each;
* once: V d (E), V d more for an untied LM head, T_max d for learned positions, the final norm.

**FLOPs** of one forward pass, counted as ``FlopCounterMode`` counts them: matrix products
only, 2 per multiply-add (an (m, n) @ (n, p) product is 2 m n p); biases, norms,
activations, softmax, RoPE and the embedding lookup are not counted. Per token, on a
sequence of T tokens:

* per layer: projections 2 d (H + 2 H_kv) d_h + 2 H d_h d; scores Q K^T 2 T H d_h and
  mix A V 2 T H d_h (the full T x T square, as the unfused attention computes it:
  a causal kernel that skips the masked half does about half of this); feed-forward 2 m d d_ff;
* once: the LM head 2 d V.

Neglecting attention, that is 2 N_matmul FLOPs per token, where N_matmul is the number of
parameters that take part in matrix products (all but embeddings, biases and norms; the
tied E counts, through the LM head): the "C = 2N per token" forward half of the 6N rule
(Kaplan et al., 2020, "Scaling Laws for Neural Language Models", section 2.1).
"""

from __future__ import annotations

import sympy as sp

from llmbook.transformer.model import TransformerConfig

__all__ = [
    "count_parameters",
    "count_parameters_symbolic",
    "flops_per_token",
    "flops_per_token_symbolic",
    "flops_shares",
    "parameter_shares",
    "symbol_values",
]


def _check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"expected a TransformerConfig, got {type(config).__name__}")
    return config


def _mlp_matrices(c: TransformerConfig) -> int:
    return 2 if c.mlp == "gelu" else 3


def parameter_shares(config: TransformerConfig) -> dict[str, int]:
    """The parameter count split into ``embeddings`` (E, untied head, position table),
    ``attention``, ``mlp`` and ``norms`` (all L layers plus the final norm), and ``total``."""
    c = _check_config(config)
    d, L, H, H_kv, d_h, d_ff, V = (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head,
                                   c.d_ff, c.vocab_size)
    m = _mlp_matrices(c)
    attn = d * H * d_h + 2 * d * H_kv * d_h + H * d_h * d  # W_Q, W_K, W_V, W_O
    attn += c.qkv_bias * (H + 2 * H_kv) * d_h + c.out_bias * d
    mlp = m * d * d_ff + c.mlp_bias * ((m - 1) * d_ff + d)
    norm = d * (1 + (c.norm == "layernorm" and c.norm_bias))  # gain (+ LayerNorm's beta)
    emb = V * d * (1 + (not c.tie_embeddings)) + (c.max_seq_len * d if c.positions == "learned"
                                                   else 0)
    shares = {"embeddings": emb, "attention": L * attn, "mlp": L * mlp, "norms": (2 * L + 1) * norm}
    shares["total"] = sum(shares.values())
    return shares


def count_parameters(config: TransformerConfig) -> int:
    """The number of distinct parameters of ``TransformerLM(config)``, in closed form.

    Equal to ``sum(p.numel() for p in model.parameters())`` (tested), and to the count of
    the Hugging Face model of the same configuration. Qwen2-0.5B: 494,032,768.
    """
    return parameter_shares(config)["total"]


def flops_shares(config: TransformerConfig, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per token on a sequence of ``seq_len`` tokens, split into
    ``attention_projections``, ``attention_scores`` (Q K^T and A V), ``mlp``, ``lm_head``,
    and ``total``. Conventions as in the module docstring."""
    c = _check_config(config)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive int, got seq_len={seq_len!r}")
    d, L, H, H_kv, d_h, d_ff, V = (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head,
                                   c.d_ff, c.vocab_size)
    T = seq_len
    shares = {
        "attention_projections": L * (2 * d * (H + 2 * H_kv) * d_h + 2 * H * d_h * d),
        "attention_scores": L * (2 * T * H * d_h + 2 * T * H * d_h),
        "mlp": L * 2 * _mlp_matrices(c) * d * d_ff,
        "lm_head": 2 * d * V,
    }
    shares["total"] = sum(shares.values())
    return shares


def flops_per_token(config: TransformerConfig, seq_len: int) -> int:
    """Forward FLOPs per token of ``TransformerLM(config)`` on sequences of ``seq_len`` tokens.

    Times B T, it equals what ``FlopCounterMode`` counts for a forward pass on a (B, T)
    batch with the book's (unfused) attention (tested). Matrix products only, 2 FLOPs
    per multiply-add; see the module docstring for what is and is not counted.
    """
    return flops_shares(config, seq_len)["total"]


# The symbols of the closed forms. Indicators are 0 or 1: b_qkv, b_o, b_mlp (biases),
# b_n (LayerNorm's beta), u (an untied LM head), p (a learned position table).
SYMBOLS = sp.symbols("V d L H H_kv d_h d_ff m T T_max b_qkv b_o b_mlp b_n u p",
                     integer=True, nonnegative=True)


def count_parameters_symbolic() -> sp.Expr:
    """The parameter count as a SymPy expression in :data:`SYMBOLS` (see the module docstring)."""
    V, d, L, H, H_kv, d_h, d_ff, m, T, T_max, b_qkv, b_o, b_mlp, b_n, u, p = SYMBOLS
    attn = d * H * d_h + 2 * d * H_kv * d_h + H * d_h * d + b_qkv * (H + 2 * H_kv) * d_h + b_o * d
    mlp = m * d * d_ff + b_mlp * ((m - 1) * d_ff + d)
    norm = d * (1 + b_n)
    return L * (attn + mlp + 2 * norm) + norm + V * d * (1 + u) + p * T_max * d


def flops_per_token_symbolic() -> sp.Expr:
    """Forward FLOPs per token as a SymPy expression in :data:`SYMBOLS`."""
    V, d, L, H, H_kv, d_h, d_ff, m, T, *_ = SYMBOLS
    layer = 2 * d * (H + 2 * H_kv) * d_h + 2 * H * d_h * d + 4 * T * H * d_h + 2 * m * d * d_ff
    return L * layer + 2 * d * V


def symbol_values(config: TransformerConfig, seq_len: int = 1) -> dict[sp.Symbol, int]:
    """The values of :data:`SYMBOLS` for ``config`` (to ``subs`` into the symbolic forms)."""
    c = _check_config(config)
    values = (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff,
              _mlp_matrices(c), seq_len, c.max_seq_len, int(c.qkv_bias), int(c.out_bias),
              int(c.mlp_bias), int(c.norm == "layernorm" and c.norm_bias),
              int(not c.tie_embeddings), int(c.positions == "learned"))
    return dict(zip(SYMBOLS, values, strict=True))
