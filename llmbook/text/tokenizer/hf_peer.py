"""The independent peer: Hugging Face ``tokenizers`` set up like the book's tokenizer.

Introduced in notebooks/01_tokens. The book checks its tokenizer against the Rust
implementation in Hugging Face ``tokenizers`` in two ways:

* :func:`hf_tokenizer_from_bpe` builds a ``tokenizers.Tokenizer`` from *our*
  vocabulary and merges (converted to GPT-2's byte alphabet), with GPT-2's
  byte-level pre-tokeniser and decoder, so that both encode the same text with the
  same model and must give the same ids;
* :func:`train_hf_bpe` trains ``tokenizers``' own byte-level BPE on the same text,
  to compare what the two trainers learn (compression, not ids: tie-breaking and
  details of counting differ).

``tokenizers`` is a development dependency, imported only when these are called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from llmbook.text.tokenizer.pretokenize import token_to_gpt2_string, validate_special_tokens

__all__ = ["hf_tokenizer_from_bpe", "train_hf_bpe"]


def hf_tokenizer_from_bpe(vocab: Mapping[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                          special_tokens: Iterable[str] = ()):
    """A ``tokenizers.Tokenizer`` with our vocab and merges (``models.BPE``), GPT-2's
    ``ByteLevel(add_prefix_space=False)`` pre-tokeniser and ``ByteLevel`` decoder, and
    our special tokens added as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = validate_special_tokens(special_tokens)
    special_bytes = {s.encode("utf-8"): s for s in specials}
    hf_vocab = {}
    for i, tok in vocab.items():
        hf_vocab[special_bytes.get(tok) or token_to_gpt2_string(tok)] = i
    hf_merges = [(token_to_gpt2_string(a), token_to_gpt2_string(b)) for a, b in merges]
    tokenizer = Tokenizer(models.BPE(vocab=hf_vocab, merges=hf_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def train_hf_bpe(text: str, vocab_size: int, special_tokens: Iterable[str] = ()):
    """Train ``tokenizers``' byte-level BPE on ``text`` (one sequence, so it sees the same
    pre-tokens as :func:`~llmbook.text.tokenizer.train_bpe`); return the trained ``Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(validate_special_tokens(special_tokens)),
                                  show_progress=False)
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer
