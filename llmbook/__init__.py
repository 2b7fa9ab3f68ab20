"""llmbook: the code of an executable textbook on the mathematics of large language models.

One subpackage per part of the book, each importing only from earlier parts:

* :mod:`llmbook.text` — Part I, text as mathematics (chapters 1–3): tokenizer, corpus,
  embeddings, softmax and cross-entropy, the Markov source, n-grams.
* :mod:`llmbook.transformer` — Part II, the transformer (chapters 4–7): attention,
  positions, norms and feed-forward layers, the decoder, loading from Hugging Face, sizing.
* :mod:`llmbook.training` — Part III, training (chapters 8–11): backpropagation, autograd,
  optimisers, the training loop, checkpoints, the book's shipped models, scaling laws.
* :mod:`llmbook.inference` — Part IV, inference (chapters 12–15): sampling and beam
  search, the KV cache and attention variants, FlashAttention, quantisation.

* :mod:`llmbook.alignment` — Part V, adaptation and alignment (chapters 16–20, being
  written): LoRA, per-token log-probabilities, the reward-model, PPO, DPO and GRPO losses.

* :mod:`llmbook.workbench` — the reader's workbench (after every part): exercise stubs
  made from the reference solutions, the exercises' checks, and the grader behind
  ``llmbook exercises`` and ``llmbook grade``.

Part VI (scale) will be :mod:`llmbook.scale`. Shared by every chapter, at the top: :mod:`llmbook.nbtools`
(``show_source``, ``Checks``, ``save_figure``), :mod:`llmbook.validation` (argument
checks) and :mod:`llmbook.environment` (the preface's environment check).
"""

import warnings

# Inside Jupyter without ipywidgets, tqdm.auto (imported by transformers) warns once per
# kernel that it falls back to a text progress bar. The fallback is what the book wants,
# and the warning would otherwise land in a notebook's committed outputs.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
