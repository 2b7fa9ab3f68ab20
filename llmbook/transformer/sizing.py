"""Closed-form parameter counts and forward FLOPs of a :class:`~llmbook.transformer.model.TransformerLM`.

Introduced in notebooks/07_decoder. The symbolic forms are built component by component
from the shapes of the tensors and products (:func:`parameter_terms_symbolic`,
:func:`flops_terms_symbolic`); the integer functions evaluate the same sums. Both are
checked independently: against the sum of ``p.numel()`` over real models, component by
component (ours and Hugging Face's, on the meta device for large shapes), and against
``torch.utils.flop_counter.FlopCounterMode``, module by module.

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
    "flops_terms_symbolic",
    "linear_parameters",
    "matmul_flops",
    "parameter_shares",
    "parameter_terms_symbolic",
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
    attn += c.qk_norm * ((H + H_kv) * d_h if c.qk_norm_scope == "all" else 2 * d_h)  # QK-norm gains
    mlp = m * d * d_ff + c.mlp_bias * ((m - 1) * d_ff + d)
    norm = d * (1 + (c.norm == "layernorm" and c.norm_bias))  # gain (+ LayerNorm's beta)
    emb = V * d * (1 + (not c.tie_embeddings)) + (c.max_seq_len * d if c.positions == "learned"
                                                   else 0)
    per_layer = 4 if c.norm_position == "sandwich" else 2  # Gemma 2 adds a norm after each sub-layer
    shares = {"embeddings": emb, "attention": L * attn, "mlp": L * mlp, "norms": (per_layer * L + 1) * norm}
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


def linear_parameters(n_in: sp.Expr, n_out: sp.Expr, bias: sp.Expr) -> sp.Expr:
    """Parameters of ``nn.Linear(n_in, n_out)``: a weight of shape (n_out, n_in) and, when
    the indicator ``bias`` is 1, a bias of shape (n_out,)."""
    return n_out * n_in + bias * n_out


def matmul_flops(rows: sp.Expr, inner: sp.Expr, cols: sp.Expr) -> sp.Expr:
    """FLOPs of a (rows, inner) @ (inner, cols) product: rows x cols dot products of
    ``inner`` multiply-adds, 2 FLOPs each (``FlopCounterMode``'s convention)."""
    return 2 * rows * inner * cols


def parameter_terms_symbolic() -> dict[str, sp.Expr]:
    """The parameter count of each component, built from the shapes of its tensors.

    Keys: ``embedding`` (E, V x d), ``positions`` (the learned table, T_max x d, if p = 1),
    ``attention`` and ``mlp`` (one layer: W_Q (H d_h x d), W_K and W_V (H_kv d_h x d),
    W_O (d x H d_h), and the m - 1 input matrices and one output matrix of the
    feed-forward layer, each as an ``nn.Linear``), ``norm`` (one norm: gain, and
    LayerNorm's shift if b_n = 1), ``lm_head`` (an untied d -> V matrix if u = 1).
    """
    V, d, L, H, H_kv, d_h, d_ff, m, T, T_max, b_qkv, b_o, b_mlp, b_n, u, p = SYMBOLS
    attention = (linear_parameters(d, H * d_h, b_qkv) + 2 * linear_parameters(d, H_kv * d_h, b_qkv)
                 + linear_parameters(H * d_h, d, b_o))
    mlp = (m - 1) * linear_parameters(d, d_ff, b_mlp) + linear_parameters(d_ff, d, b_mlp)
    return {"embedding": V * d, "positions": p * T_max * d, "attention": attention, "mlp": mlp,
            "norm": d + b_n * d, "lm_head": u * linear_parameters(d, V, 0)}


def count_parameters_symbolic() -> sp.Expr:
    """The parameter count as a SymPy expression in :data:`SYMBOLS`: the embeddings, L
    blocks of attention, feed-forward and two norms, the final norm and the LM head, each
    term from :func:`parameter_terms_symbolic`."""
    t, L = parameter_terms_symbolic(), SYMBOLS[2]
    return (t["embedding"] + t["positions"] + L * (t["attention"] + t["mlp"] + 2 * t["norm"])
            + t["norm"] + t["lm_head"])


def flops_terms_symbolic() -> dict[str, sp.Expr]:
    """Forward FLOPs per token of each component, built from the shapes of its products.

    A sequence of T tokens is a (T, d) matrix, so a projection d -> n costs
    ``matmul_flops(T, d, n) / T`` per token; per head the scores are (T, d_h) @ (d_h, T)
    and the mix (T, T) @ (T, d_h). Keys: ``attention_projections``, ``attention_scores``
    and ``mlp`` (one layer each) and ``lm_head``.
    """
    V, d, L, H, H_kv, d_h, d_ff, m, T, *_ = SYMBOLS
    proj = (matmul_flops(T, d, H * d_h) + 2 * matmul_flops(T, d, H_kv * d_h)
            + matmul_flops(T, H * d_h, d))
    scores = H * (matmul_flops(T, d_h, T) + matmul_flops(T, T, d_h))
    mlp = (m - 1) * matmul_flops(T, d, d_ff) + matmul_flops(T, d_ff, d)
    return {"attention_projections": sp.expand(proj / T), "attention_scores": sp.expand(scores / T),
            "mlp": sp.expand(mlp / T), "lm_head": sp.expand(matmul_flops(T, d, V) / T)}


def flops_per_token_symbolic() -> sp.Expr:
    """Forward FLOPs per token as a SymPy expression in :data:`SYMBOLS`: L layers of
    :func:`flops_terms_symbolic`'s per-layer terms plus the LM head."""
    t, L = flops_terms_symbolic(), SYMBOLS[2]
    return L * (t["attention_projections"] + t["attention_scores"] + t["mlp"]) + t["lm_head"]


def symbol_values(config: TransformerConfig, seq_len: int = 1) -> dict[sp.Symbol, int]:
    """The values of :data:`SYMBOLS` for ``config`` (to ``subs`` into the symbolic forms)."""
    c = _check_config(config)
    values = (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff,
              _mlp_matrices(c), seq_len, c.max_seq_len, int(c.qkv_bias), int(c.out_bias),
              int(c.mlp_bias), int(c.norm == "layernorm" and c.norm_bias),
              int(not c.tie_embeddings), int(c.positions == "learned"))
    return dict(zip(SYMBOLS, values, strict=True))
