"""Part II, the transformer (chapters 4–7): attention, positions, norms, the decoder.

Chapter → module → what it defines:

* 4 Attention → :mod:`~llmbook.transformer.attention`: ``scaled_dot_product_attention``,
  ``causal_mask``, ``MultiHeadAttention`` (with grouped-query heads), ``attention_flops``,
  and ``AttentionCache``, the interface a key/value cache offers the model (the cache
  itself is inference code, chapter 12).
* 5 Positions → :mod:`~llmbook.transformer.positional`: sinusoidal and learned positions,
  RoPE (``RotaryEmbedding``, both pairings), ALiBi.
* 6 Norms and the feed-forward layer → :mod:`~llmbook.transformer.layers`:
  ``LayerNorm``, ``RMSNorm`` and their Jacobians, ``gelu``, ``MLP``, ``SwiGLU``.
* 7 The decoder → :mod:`~llmbook.transformer.model`: ``TransformerConfig`` (GPT-2,
  Llama, Qwen2 styles), ``DecoderBlock``, ``TransformerLM``;
  :mod:`~llmbook.transformer.hf_loading`: ``from_hf`` and ``config_from_hf`` (Hugging
  Face weights into the book's model); :mod:`~llmbook.transformer.sizing`: closed-form
  ``count_parameters`` and ``flops_per_token``, numeric and symbolic.

Imports Part I (:mod:`llmbook.text`) and the shared helpers, never a later part.
"""
