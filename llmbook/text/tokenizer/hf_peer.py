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

For the comparison with the other two subword schemes, :func:`train_hf_wordpiece` and
:func:`train_hf_unigram` train ``tokenizers``' WordPiece and Unigram models behind the
same byte-level pre-tokeniser, so all three see the same pre-tokens and the same
256-character byte alphabet and differ only in the model.

``tokenizers`` is a development dependency, imported only when these are called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from llmbook.text.tokenizer.pretokenize import token_to_gpt2_string, validate_special_tokens

__all__ = ["hf_tokenizer_from_bpe", "train_hf_bpe", "train_hf_unigram", "train_hf_wordpiece"]


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


def _check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size} is below 256 bytes + 1 unknown token = 257")


def train_hf_wordpiece(text: str, vocab_size: int, unk_token: str = "[UNK]"):
    """Train ``tokenizers``' WordPiece on ``text`` behind GPT-2's byte-level pre-tokeniser.

    ``tokenizers`` learns the WordPiece vocabulary with its BPE trainer (pieces that
    continue a word get the prefix ``##``), not with the likelihood criterion of the
    original WordPiece; what is WordPiece here is the encoding, greedy longest match first
    (:func:`~llmbook.text.tokenizer.alternatives.wordpiece_segment`). ``unk_token`` takes
    one id. The result has no decoder: it is meant for counting and inspecting tokens.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    _check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.WordPiece(unk_token=unk_token))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size,
                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                        special_tokens=[unk_token], show_progress=False)
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer


def train_hf_unigram(text: str, vocab_size: int, unk_token: str = "<unk>"):
    """Train ``tokenizers``' Unigram model (Kudo, 2018) on ``text`` behind GPT-2's
    byte-level pre-tokeniser and decoder.

    The trainer starts from a large set of frequent substrings and alternates EM
    re-estimation of the piece probabilities with pruning of the pieces whose removal
    lowers the corpus likelihood least, until ``vocab_size`` pieces remain (the 256 byte
    characters are always kept). Encoding is Viterbi
    (:func:`~llmbook.text.tokenizer.alternatives.unigram_segment`). ``unk_token`` takes one id.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    _check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=[unk_token], unk_token=unk_token,
                                      show_progress=False)
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer
