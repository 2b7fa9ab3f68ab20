"""Part IV, inference (chapters 12–15): decoding, the KV cache, tiling, quantisation.

Chapter → module → what it defines:

* 12 Decoding → :mod:`~llmbook.inference.sampling`: ``apply_temperature``, top-k and
  top-p filters, ``generate``, ``beam_search``, ``speculative_generate`` (with KV caches
  for target and draft), ``early_exit_draft``;
  :mod:`~llmbook.inference.kvcache`: ``KVCache`` (it implements the model's
  ``AttentionCache`` interface) and ``kv_cache_bytes``.
* 13 The KV cache and attention variants → :mod:`~llmbook.inference.attention_variants`:
  ``MultiHeadLatentAttention`` with weight absorption and decoupled RoPE (its MQA form,
  and ``deepseek_v3_attention``, the Hugging Face peer), ``RollingKVCache`` for a sliding
  window, decode FLOPs.
* 14 FlashAttention → :mod:`~llmbook.inference.flash`: the online-softmax merge rule,
  ``flash_attention_reference`` (forward and backward, tiled) and the memory model;
  :mod:`~llmbook.inference.flash_triton`: the Triton kernels.
* 15 Quantisation → :mod:`~llmbook.inference.quant`: absmax, zero-point and NF4
  quantisation, ``int8_matmul``, ``QuantLinear``; :mod:`~llmbook.inference.gptq`:
  ``gptq_quantize``, ``awq_scale_search``, ``quantize_model``.

Imports Parts I–III and the shared helpers, never a later part.
"""
