"""Part III, training (chapters 8–11): gradients, optimisers, the loop, scaling laws.

Chapter → module → what it defines:

* 8 Backpropagation → :mod:`~llmbook.training.backprop`: hand-derived backward passes
  (linear, softmax, cross-entropy, LayerNorm, GELU, attention);
  :mod:`~llmbook.training.autograd`: a scalar autograd engine (``Value``) and
  ``gradcheck``.
* 9 Optimisers → :mod:`~llmbook.training.optim`: ``SGD``, ``Adam``, ``AdamW``,
  ``cosine_schedule``, ``clip_grad_norm_``.
* 10 Training a small language model → :mod:`~llmbook.training.train`: ``get_batch``,
  ``TrainConfig``, ``train_step``, ``evaluate``, ``train``;
  :mod:`~llmbook.training.checkpoint`: atomic saves and safe loads;
  :mod:`~llmbook.training.pretrained`: the book's shipped models (``book_model``,
  ``RECIPES``);
  :mod:`~llmbook.training.memory`: float formats, master weights, loss scaling, the bytes
  of a training step and of its saved activations (``float_format_symbolic``,
  ``MasterWeightOptimizer``, ``DynamicLossScaler``, ``training_state_bytes``,
  ``saved_activation_bytes``).
* 11 Scaling laws → :mod:`~llmbook.training.scaling`: ``fit_power_law``,
  ``chinchilla_loss``, ``compute_optimal``, ``fit_isoflop_parabola``, ``isoflop_sweep``.
* Data (a chapter to come, issue 23) → :mod:`~llmbook.training.dedup`: ``shingles``,
  ``minhash_signatures``, ``estimate_jaccard``, ``lsh_candidates``,
  ``band_collision_probability``.

Imports Parts I–II and the shared helpers, never a later part.
"""
