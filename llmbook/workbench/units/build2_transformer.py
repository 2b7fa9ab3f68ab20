"""Build it yourself, Part II: the transformer block, from softmax up.

Part II of the book (chapters 4 to 7) assembles a decoder-only transformer of the Llama
family: attention (chapter 4), the rotary position embedding (chapter 5), RMSNorm and the
SwiGLU feed-forward layer (chapter 6), and the pre-norm block that joins them (chapter 7).
In this unit you write each of those pieces yourself, with nothing but ``torch`` tensor
operations (no ``torch.nn.functional.scaled_dot_product_attention``, ``torch.softmax``,
``torch.nn.RMSNorm`` or ``llmbook`` inside your functions: the checks compare you with
them), and the last check runs SmolLM2-135M, the book's real model, with your block in
every one of its 30 layers.

Build in this order; each function may call the ones before it:

1. :func:`softmax`, stable along any axis;
2. :func:`attention`, scaled dot-product attention with a boolean or causal mask;
3. :func:`apply_rope`, the rotary embedding in Llama's half-split pairing;
4. :func:`rms_norm`;
5. :func:`swiglu`, Llama's gated feed-forward layer;
6. :func:`transformer_block`, the pre-norm block with grouped-query attention;
7. end to end: nothing new to write. The check puts your :func:`transformer_block` into
   every layer of the book's ``TransformerLM`` loaded from SmolLM2's GGUF file, your
   :func:`rms_norm` in place of its final norm and your :func:`softmax` on its logits, and
   compares the next-token distribution with the book's own model.

Weights follow PyTorch's ``nn.Linear`` layout, (out_features, in_features), so a layer is
``x @ W.T``: the layout of Hugging Face checkpoints and of the book's modules.

Grade with ``llmbook grade build-II`` (``llmbook exercises build-II`` writes the stub of this
file into your workspace). This file is the reference: the book's own implementations
plugged in behind the same signatures; read it only after trying.
"""

from __future__ import annotations

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The softmax of ``x`` along ``dim``: exp(x_i) / sum_j exp(x_j).

    ``x`` is a floating-point tensor of any shape; the result has the same shape and dtype
    and sums to 1 along ``dim`` (any axis, negative ones included).

    Stability: exp overflows for large inputs (exp(89) is already inf in float32), so first
    subtract the largest entry of each slice along ``dim``: softmax(x) = softmax(x - m) with
    m = max_j x_j, and then every exponent is <= 0. Logits of size 1e4 must give finite
    probabilities. An entry of -inf gets probability 0 (as long as its slice has a finite
    entry).

    Hint: ``x.amax(dim=dim, keepdim=True)`` keeps the axis, so the subtraction broadcasts.

    Checked against ``torch.softmax`` in float64 on a (3, 5, 7) tensor along every axis, to
    1e-14; on logits of size 1e4 in float32 (finite, to 1e-6); with -inf entries.
    """
    from llmbook.text.functional import softmax as book_softmax

    return book_softmax(x, dim=dim)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              is_causal: bool = False) -> torch.Tensor:
    """Scaled dot-product attention: softmax(q k^T / sqrt(d_k) + mask) v.

    Shapes: ``q`` (..., T_q, d_k), ``k`` (..., T_k, d_k), ``v`` (..., T_k, d_v) with the same
    leading dimensions (e.g. (B, H, T, d_head)) -> (..., T_q, d_v).

    ``mask``, if given, is boolean and broadcasts to (..., T_q, T_k): True where query i may
    attend to key j; a False entry removes key j from query i's softmax (its score becomes
    -inf before the softmax). ``is_causal=True`` lets query i see only the keys j <= i: the
    lower triangle of a (T_q, T_k) matrix, aligned at the top left as in PyTorch
    (``torch.ones(T_q, T_k, dtype=torch.bool).tril()``). Give one or the other, not both.
    A query whose keys are all masked attends to nothing: its output row is zeros (not NaN).

    Hint: the scores are ``q @ k.transpose(-2, -1)``; ``masked_fill(~mask, float("-inf"))``
    removes keys; your :func:`softmax` normalises the last axis.

    Checked against ``torch.nn.functional.scaled_dot_product_attention`` and the book's
    ``llmbook.transformer.attention.scaled_dot_product_attention`` in float64 on
    non-square shapes (T_q != T_k, d_k != d_v), with no mask, a causal one and a random
    boolean one, to 1e-12; a fully masked row must give zeros.
    """
    from llmbook.transformer.attention import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` by the rotary position embedding (RoPE) at ``positions``, half-split pairing.

    Shapes: ``x`` (..., T, d) with d even, usually queries or keys (B, H, T, d_head);
    ``positions`` (T,) integer positions m_0, ..., m_{T-1} (not necessarily 0, 1, ...).
    Returns a tensor of x's shape and dtype.

    The d components form d/2 pairs, and pair j of the vector at position m turns by the
    angle m * theta_j, with theta_j = theta ** (-2j / d), j = 0, ..., d/2 - 1:

        (a, b) -> (a cos(m theta_j) - b sin(m theta_j),  a sin(m theta_j) + b cos(m theta_j)).

    Pairing: Llama's *half-split* layout of Hugging Face checkpoints, a = x[..., j] and
    b = x[..., j + d/2] (not the interleaved (x_{2j}, x_{2j+1}) of the RoFormer paper).
    Then the score between a query at m and a key at n depends on the positions only
    through n - m.

    Hint: compute the angles as a (T, d/2) table, ``positions[:, None] * theta_j[None, :]``,
    in float64 for float64 input; split ``x`` into its two halves and concatenate the two
    rotated halves.

    Checked against the book's ``RotaryEmbedding`` in float64 (to 1e-12), against
    ``transformers``' ``apply_rotary_pos_emb`` with ``LlamaRotaryEmbedding``'s cos and sin in
    float32 (to 1e-5), and for the relative-position property in float64 (to 1e-12).
    """
    from llmbook.transformer.positional import RotaryEmbedding

    table = torch.float64 if x.dtype == torch.float64 else torch.float32
    rope = RotaryEmbedding(x.shape[-1], theta=theta, max_seq_len=int(positions.max()) + 1,
                           interleaved=False, dtype=table)
    return rope(x, positions)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last axis: weight * x / sqrt(mean(x^2) + eps).

    Shapes: ``x`` (..., d), ``weight`` the gain g, (d,) -> (..., d). The mean is over the
    last axis only; there is no mean subtraction and no bias (that is LayerNorm).

    Precision, as Llama: for float16 or bfloat16 input, compute x / sqrt(mean(x^2) + eps) in
    float32, cast it back to x's dtype, and only then multiply by the weight. float32 and
    float64 inputs are computed in their own dtype.

    Hint: ``torch.rsqrt`` and ``mean(dim=-1, keepdim=True)``.

    Checked against ``torch.nn.RMSNorm`` in float64 (to 1e-12) and ``transformers``'
    ``LlamaRMSNorm`` in float32 (to 1e-6) and in bfloat16 (bit for bit), on x of shape
    (2, 5, 12) with an offset mean.
    """
    from torch.func import functional_call

    from llmbook.transformer.layers import RMSNorm

    with torch.device("meta"):
        norm = RMSNorm(x.shape[-1], eps=eps)
    return functional_call(norm, {"weight": weight}, (x,))


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Llama's gated feed-forward layer: down(SiLU(gate(x)) * up(x)).

    Shapes: ``x`` (..., d); ``w_gate`` and ``w_up`` (d_ff, d); ``w_down`` (d, d_ff), in
    ``nn.Linear``'s layout, so that gate(x) = x @ w_gate.T. Returns (..., d). No biases.

        SwiGLU(x) = (SiLU(x W_gate^T) * (x W_up^T)) W_down^T,   SiLU(z) = z * sigmoid(z),

    with * the elementwise product.

    Checked against ``transformers``' ``LlamaMLP`` holding the same weights, in float64 on
    (2, 7, 12) inputs with d_ff = 20, to 1e-12.
    """
    from torch.func import functional_call

    from llmbook.transformer.layers import SwiGLU

    with torch.device("meta"):
        mlp = SwiGLU(x.shape[-1], w_gate.shape[0])
    weights = {"gate_proj.weight": w_gate, "up_proj.weight": w_up, "down_proj.weight": w_down}
    return functional_call(mlp, weights, (x,))


#: The keys of :func:`transformer_block`'s ``weights``, in the order a block uses them.
BLOCK_WEIGHTS = ("attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm", "gate_proj",
                 "up_proj", "down_proj")


def transformer_block(x: torch.Tensor, weights: dict[str, torch.Tensor], n_heads: int, n_kv_heads: int,
                      theta: float = 10000.0, eps: float = 1e-5) -> torch.Tensor:
    """One pre-norm Llama decoder block: x + Attn(RMSNorm(x)), then + SwiGLU(RMSNorm(x)).

    ``x`` (B, T, d) is the residual stream at positions 0, 1, ..., T-1. ``weights`` holds
    the block's tensors under the names of :data:`BLOCK_WEIGHTS` (Hugging Face's and the
    book's), with H = ``n_heads``, H_kv = ``n_kv_heads`` and d_head = q_proj's rows / H:

    * ``attn_norm`` (d,) and ``mlp_norm`` (d,): the RMSNorm gains (eps = ``eps``);
    * ``q_proj`` (H d_head, d), ``k_proj`` and ``v_proj`` (H_kv d_head, d), ``o_proj``
      (d, H d_head): the attention projections, no biases;
    * ``gate_proj``, ``up_proj`` (d_ff, d) and ``down_proj`` (d, d_ff): the SwiGLU layer.

    The attention sub-layer, on h = RMSNorm(x):

    1. project q = h W_q^T, k = h W_k^T, v = h W_v^T and split the last axis into heads:
       q (B, H, T, d_head), k and v (B, H_kv, T, d_head);
    2. rotate q and k with RoPE (base ``theta``, half-split pairing) at positions 0..T-1;
    3. grouped-query attention: query head h uses key/value head h // (H / H_kv), so repeat
       each key/value head H / H_kv times along the head axis (``repeat_interleave``);
    4. causal attention, scale 1/sqrt(d_head), then join the heads back into (B, T, H d_head)
       and project with W_o.

    Returns the block's output, (B, T, d), the dtype of x.

    Hint: build it from your :func:`rms_norm`, :func:`apply_rope`, :func:`attention` and
    :func:`swiglu`. ``t.view(B, T, H, d_head).transpose(1, 2)`` splits the heads.

    Checked in float64 with d = 48, H = 4, H_kv = 2, d_head = 16 (not d / H), theta = 500
    and eps = 1e-3 against the book's ``DecoderBlock`` holding the same weights (two layers
    in turn, and the defaults), to 1e-12, and against the first decoder layer of
    ``transformers``' ``LlamaForCausalLM`` (from ``output_hidden_states``), to 1e-5, as its
    rotary tables are float32; the end-to-end check adds a float32 block with a single
    key/value head (multi-query attention), to 1e-5.
    """
    from torch.func import functional_call

    from llmbook.transformer.model import DecoderBlock, TransformerConfig
    from llmbook.transformer.positional import RotaryEmbedding

    missing = [name for name in BLOCK_WEIGHTS if name not in weights]
    if missing:
        raise KeyError(f"weights lacks {missing}; it needs the keys {list(BLOCK_WEIGHTS)}")
    B, T, d = x.shape
    d_head = weights["q_proj"].shape[0] // n_heads
    config = TransformerConfig.llama_style(
        vocab_size=1, d_model=d, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head,
        d_ff=weights["gate_proj"].shape[0], max_seq_len=T, norm_eps=eps, rope_theta=theta,
        fused_attention=False)
    with torch.device("meta"):
        block = DecoderBlock(config)
    params = {name: weights[name.removesuffix(".weight").split(".")[-1]]
              for name, _ in block.named_parameters()}
    table = torch.float64 if x.dtype == torch.float64 else torch.float32
    rope = RotaryEmbedding(d_head, theta=theta, max_seq_len=T, dtype=table)
    return functional_call(block, params, (x, torch.arange(T), rope))
