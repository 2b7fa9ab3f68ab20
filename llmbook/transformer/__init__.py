"""Part II, the transformer (chapters 4–7): attention, positions, norms, the decoder.

Chapter → module → what it defines:

* 4 Attention → :mod:`~llmbook.transformer.attention`: ``scaled_dot_product_attention``,
  ``causal_mask``, ``attention_entropy``, ``minimal_multi_head_attention`` (the teaching version),
  ``MultiHeadAttention`` (grouped-query heads, any leading dimensions), ``attention_flops``,
  and ``AttentionCache``, the interface a key/value cache offers the model (the cache
  itself is inference code, chapter 12).
* 5 Positions → :mod:`~llmbook.transformer.positional`: sinusoidal and learned positions,
  RoPE (``RotaryEmbedding``, both pairings), ALiBi.
* 6 Norms and the feed-forward layer → :mod:`~llmbook.transformer.layers`:
  ``LayerNorm``, ``RMSNorm`` and their Jacobians, ``gelu`` (and ``tanh_cdf_error``), ``MLP``,
  ``SwiGLU``; :mod:`~llmbook.transformer.extremes`: ``critical_extremes``, the extremes of an
  error function to many digits (mpmath roots of its derivative, started on a grid).
* 7 The decoder → :mod:`~llmbook.transformer.model`: ``TransformerConfig`` (GPT-2,
  Llama, Qwen2 styles; QK-norm, post-norm and sandwich norms, sliding window and local/global
  layers, RoPE scaling, NoPE layers, soft-capping and embedding-scale options),
  ``QKNormAttention``, ``GeGLU``, ``DecoderBlock``, ``TransformerLM``, ``minimal_forward`` (its
  teaching version) and ``expected_initial_loss`` (tied and untied);
  :mod:`~llmbook.transformer.hf_loading`: ``from_hf`` and ``config_from_hf`` (Hugging
  Face GPT-2, Llama 3.x, Qwen2/3, Mistral, OLMo 2, Gemma 2/3 and SmolLM3 weights into the book's model),
  and ``to_hf_llama`` (a Llama-style book model into transformers' ``LlamaForCausalLM``); :mod:`~llmbook.transformer.sizing`: closed-form
  ``count_parameters`` and ``flops_per_token``, numeric and symbolic, built term by term
  from the layers' shapes (``parameter_terms_symbolic``, ``flops_terms_symbolic``).
* 6, 7 (and 12) The published worked example → :mod:`~llmbook.transformer.worked_example`:
  ``ffn_step``, the source's feed-forward step with the book's layers.

Imports Part I (:mod:`llmbook.text`) and the shared helpers, never a later part.
"""
