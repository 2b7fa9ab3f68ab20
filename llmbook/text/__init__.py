"""Part I, text as mathematics (chapters 1–3): from bytes to tokens to probabilities.

Chapter → module → what it defines:

* 1 Tokens → :mod:`~llmbook.text.tokenizer` (a subpackage): byte-level BPE trained with
  incremental pair counts (``train_bpe``, either tie rule), ``BPETokenizer`` with any
  pre-tokeniser (``PreTokenizer``: GPT-2's, SmolLM2's, Qwen2's, cl100k's, o200k's), GPT-2's file
  pair, tiktoken rank files (``load_tiktoken_ranks``), a real model's tokenizer and chat
  template from GGUF metadata (``ChatTokenizer``), WordPiece's and Unigram's segmenters, and
  the Hugging Face ``tokenizers`` peer; :mod:`~llmbook.text.corpus`: the shipped corpus
  (``load_stdlib_docs``).
* 2 Embeddings → :mod:`~llmbook.text.embedding`: ``one_hot``, ``TokenEmbedding``,
  ``embedding_grad``, cosine geometry and parameter counts; ``nearest_rows`` (chapter 1's
  under-trained tokens of SmolLM2).
* 3 Language modelling → :mod:`~llmbook.text.functional`: stable ``softmax``,
  ``log_softmax``, ``logsumexp``, ``cross_entropy``, ``perplexity``;
  :mod:`~llmbook.text.data`: ``MarkovSource`` with an exact entropy rate and the book's
  ``default_source``; :mod:`~llmbook.text.ngram`: the ``NGramModel`` baseline.
* Chapters 4, 6, 7, 11, 12 (the published worked example "the cat sat", loaded here with
  the data it needs and recomputed in each chapter with that chapter's code) →
  :mod:`~llmbook.text.worked_example`: ``load_the_cat_sat``, ``PublishedComparison``, ``grade``.

Imports only the shared helpers at the top of ``llmbook``.
"""
