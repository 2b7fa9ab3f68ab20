"""Part III, training (chapters 8–11): gradients, optimisers, the loop, data, scaling laws.

Chapter → module → what it defines:

* 8 Backpropagation → :mod:`~llmbook.training.backprop`: hand-derived backward passes
  (linear, softmax, cross-entropy, LayerNorm, GELU, attention);
  :mod:`~llmbook.training.autograd`: a scalar autograd engine (``Value``),
  ``numeric_gradient`` (central differences, no autograd) and ``gradcheck``.
* 9 Optimisers → :mod:`~llmbook.training.optim`: ``SGD``, ``Adam``, ``AdamW``,
  ``cosine_schedule``, ``wsd_schedule``, ``clip_grad_norm_``;
  :mod:`~llmbook.training.optimisers_modern`: ``Muon`` (``newton_schulz``), ``Adafactor``, ``Lion``,
  and the harnesses ``race_with_peer`` and ``least_squares_run`` that compare optimisers.
* 10 Training a small language model → :mod:`~llmbook.training.train`: ``get_batch``,
  ``TrainConfig``, ``train_step``, ``evaluate``, ``train``;
  :mod:`~llmbook.training.checkpoint`: atomic saves and safe loads;
  :mod:`~llmbook.training.pretrained`: the book's shipped models (``book_model``,
  ``RECIPES``) and the plumbing of the ``data/make_*.py`` scripts (``write_json``,
  ``write_sweep``, ``run_in_parts``);
  :mod:`~llmbook.training.memory`: float formats, master weights, loss scaling, the bytes
  of a training step and of its saved activations (``float_format_symbolic``,
  ``MasterWeightOptimizer``, ``DynamicLossScaler``, ``training_state_bytes``,
  ``saved_activation_bytes``);
  :mod:`~llmbook.training.packing`: documents packed into chunks with segment-aware masks
  and positions (``pack_documents``, ``PackedChunks``), a batch order that resumes
  (``ResumableBatches``).
* 10b Batch size, accumulation and gradient noise → :mod:`~llmbook.training.batch_size`:
  ``accumulate_gradients``, ``accumulated_train_step``, ``global_batch_size``,
  ``noise_scale``, ``unbiased_noise_estimates``, ``microbatch_noise_estimate``,
  ``steps_to_target``, ``fit_steps_examples_tradeoff``; ``BatchSizeExperiment`` (the chapter's
  training runs, shipped in ``data/batch_size/runs.json``).
* 10c Data: duplicates and quality → :mod:`~llmbook.training.dedup`: ``normalise_document``,
  ``exact_duplicate_groups``, ``shingles``, ``minhash_signatures``, ``estimate_jaccard``,
  ``lsh_candidates``, ``band_collision_probability``, ``band_inflection``,
  ``duplicate_clusters``, ``make_duplicate_corpus``; :mod:`~llmbook.training.quality`:
  ``quality_statistics``, ``gopher_failures``, ``PerplexityFilter``, ``make_junk_document``.
* 10d Data mixtures → :mod:`~llmbook.training.mixtures`: ``temperature_weights``,
  ``epochs_per_source``, ``sample_sources``, ``train_on_mixture``, ``book_sources``,
  ``mixing_law``, ``fit_mixing_law``, ``PUBLISHED_MIXTURES``.
* 11 Scaling laws → :mod:`~llmbook.training.scaling`: ``fit_power_law``,
  ``chinchilla_loss``, ``compute_optimal``, ``fit_isoflop_parabola``, ``isoflop_sweep``,
  ``predict_power_law``, ``size_sweep``, ``counted_training_flops``, ``effective_data``,
  ``inference_optimal``; :mod:`~llmbook.training.emergence`: a fact-recall sweep with several-token answers,
  per-token accuracy against exact match (``exact_match_from_per_token``,
  ``token_edit_distance``), ``PUBLISHED_RUNS``.
* 12b Multi-token prediction (its models and loss; the decoding is in Part IV) →
  :mod:`~llmbook.training.mtp`: ``ParallelMTP``, ``SequentialMTP``, ``multi_token_loss``,
  ``train_mtp``, ``head_entropy_floors``, ``mtp_gradient_symbolic``.

Imports Parts I–II and the shared helpers, never a later part.
"""
