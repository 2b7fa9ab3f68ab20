"""Part IV, inference (chapters 12–15): decoding, the KV cache, tiling, quantisation.

Chapter → module → what it defines:

* 12 Decoding → :mod:`~llmbook.inference.sampling`: ``apply_temperature``, the top-k,
  top-p and min-p filters, ``repetition_penalty``, ``no_repeat_ngram_filter``,
  ``process_logits`` (all of them in Hugging Face's order), ``sample_categorical``,
  ``sample_next``, ``stream`` and ``generate`` (stop tokens, streaming), ``sample_text``,
  ``IncrementalDecoder`` (streamed ids to whole characters), ``repeated_ngram_fraction``,
  ``beam_search``, ``speculative_generate`` (with KV caches for target and draft),
  ``early_exit_draft``, ``PromptLookupDraft``, ``speculative_speedup``,
  ``SpeculativeStats.acceptance_rate``;
  :mod:`~llmbook.inference.kvcache`: ``KVCache`` (it implements the model's
  ``AttentionCache`` interface) and ``kv_cache_bytes``; ``PagePool`` and
  ``PagedKVCache`` (pages, block tables, prefix caching) are chapter 13's.
  :mod:`~llmbook.inference.constrained`: constrained decoding, a regular expression
  compiled to a DFA (``compile_regex``) and to per-state token masks (``build_index``,
  Willard & Louf 2023), ``constrained_generate``.
* 12b Multi-token prediction → :mod:`~llmbook.inference.mtp_decode`: self-speculative
  decoding with the extra heads of :mod:`llmbook.training.mtp`
  (``self_speculative_generate``, ``self_speculative_batch``), the exact distribution of
  continuations (``continuation_distribution``), ``pooled_chi_square``,
  ``ideal_acceptance_rate``.
* 13 The KV cache and attention variants → :mod:`~llmbook.inference.attention_variants`:
  ``MultiHeadLatentAttention`` with weight absorption and decoupled RoPE (its MQA form,
  and ``deepseek_v3_attention``, the Hugging Face peer), ``RollingKVCache`` for a sliding
  window, decode FLOPs; :mod:`~llmbook.inference.fast_decode`: decoding a real model fast,
  ``Int4Linear`` (GGUF Q4_1 codes on PyTorch's int4 kernel), ``Int8Linear``,
  ``quantize_for_decode``, ``StaticKVCache``, ``decode_step`` and its compiled form, and
  the roofline's measurements (``stream_bandwidth``, ``decode_bytes_per_token``,
  ``profile_decode_step``).
* 14 FlashAttention → :mod:`~llmbook.inference.flash`: the online-softmax merge rule,
  ``flash_attention_reference`` (forward and backward, tiled) and the memory model;
  ``flash_attention_masked`` (masks as functions, fully hidden tiles skipped) and
  ``split_kv_attention`` (Flash-Decoding);
  :mod:`~llmbook.inference.flash_triton`: the Triton kernels.
* 15 Quantisation → :mod:`~llmbook.inference.quant`: absmax, zero-point and NF4
  quantisation, ``int8_matmul``, ``QuantLinear``; :mod:`~llmbook.inference.gptq`:
  ``gptq_quantize``, ``awq_scale_search``, ``quantize_model``;
  :mod:`~llmbook.inference.minifloat`: FP8 (E4M3, E5M2) and FP4 (E2M1) grids,
  ``round_to_float`` (equal to torch's float8 casts) and MX block scaling
  (``quantize_mx``, ggml's MXFP4); :mod:`~llmbook.inference.rotation`: Hadamard
  rotations (QuaRot: ``hadamard``, ``hadamard_rotate``) and ``kurtosis``; GGUF, the file format of
  ggml and llama.cpp: :mod:`~llmbook.inference.gguf_file` (``read_gguf``),
  :mod:`~llmbook.inference.ggml_quants` (``dequantize`` and ``quantize`` for its block
  formats, bits per weight derived), :mod:`~llmbook.inference.ggml_kquants` (the Q4_K, Q5_K
  and Q6_K encoders, llama.cpp's Q4_K_M mixture), and :mod:`~llmbook.inference.gguf`
  (``load_model``: the real model, SmolLM2-135M-Instruct, as the book's ``TransformerLM``
  with its tokenizer; read in chapters 1, 4, 7, 12 and 13 as well);
  :mod:`~llmbook.inference.real_quant`: the real model re-quantised in every format,
  ``perplexity`` on held-out prose, ``build_variant``, bits per weight counted
  (``format_bits``, ``storage_bits``), GPTQ and AWQ one block at a time
  (``quantize_blockwise``), and the sweep (``python -m llmbook.inference.real_quant``).

Imports Parts I–III and the shared helpers, never a later part.
"""
