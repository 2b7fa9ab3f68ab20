"""The two other subword schemes: WordPiece's greedy match and the Unigram model's Viterbi.

Introduced in notebooks/01_tokens, next to byte-level BPE. All three cut a pre-token into
vocabulary entries; they differ in how the vocabulary is chosen and in how a word is cut.

* **WordPiece** (Schuster & Nakajima, 2012, "Japanese and Korean Voice Search"; Wu et al.,
  2016, "Google's Neural Machine Translation System", section 4.1; used by BERT, Devlin et
  al., 2019). A piece that continues a word carries the prefix ``##``. A word is cut
  *greedily*, longest match first: from the left, take the longest vocabulary entry that
  matches, then continue after it; if at some point nothing matches, the *whole word*
  becomes the unknown token. :func:`wordpiece_segment`.
* **Unigram language model** (Kudo, 2018, "Subword Regularization: Improving Neural Network
  Translation Models with Multiple Subword Candidates"; implemented with BPE in
  SentencePiece, Kudo & Richardson, 2018). Each piece ``s`` has a probability ``p(s)``,
  pieces are independent, and a word is cut into the segmentation of highest probability,
  ``argmax prod_i p(s_i)``, found by dynamic programming (Viterbi). :func:`unigram_segment`.

Both functions take the word as a string in the alphabet of the vocabulary (for the
byte-level models of the book, GPT-2's printable byte alphabet, where a space is ``Ġ``)
and are checked against Hugging Face ``tokenizers`` in ``tests/test_tokenizer_peer.py``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

__all__ = ["unigram_segment", "wordpiece_segment"]


def wordpiece_segment(word: str, vocab: Collection[str], prefix: str = "##",
                      unk_token: str = "[UNK]", max_chars: int = 100) -> list[str]:
    """Cut ``word`` into WordPiece tokens, greedily, longest match first.

    Args:
        word: one pre-token (no whitespace splitting is done here).
        vocab: the vocabulary (any container supporting ``in``); pieces after the first of
            a word are looked up with ``prefix`` in front.
        prefix: the continuation prefix, ``"##"`` for BERT.
        unk_token: what the whole word becomes when some position has no match, or when it
            is longer than ``max_chars`` characters (as in BERT and ``tokenizers``).

    Returns:
        The pieces, e.g. ``["to", "##ken", "##s"]``, or ``[unk_token]``.

    Greedy longest match need not give the fewest pieces: with the vocabulary
    ``{"a", "ab", "##bcd", "##c", "##d"}`` the word ``"abcd"`` becomes ``ab ##c ##d``, not
    ``a ##bcd``; and without ``##c`` it becomes ``[UNK]`` although ``a ##bcd`` exists.
    """
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    if len(word) > max_chars:
        return [unk_token]
    pieces, start = [], 0
    while start < len(word):
        end, found = len(word), None
        while start < end:
            candidate = word[start:end] if start == 0 else prefix + word[start:end]
            if candidate in vocab:
                found = candidate
                break
            end -= 1
        if found is None:
            return [unk_token]
        pieces.append(found)
        start = end
    return pieces


def unigram_segment(word: str, log_probs: Mapping[str, float]) -> tuple[list[str], float]:
    """The most probable cut of ``word`` under a unigram model: Viterbi over end positions.

    With ``best[i]`` the highest log-probability of a cut of ``word[:i]``,
    ``best[0] = 0`` and ``best[i] = max_{j < i, word[j:i] in vocab} best[j] + log p(word[j:i])``;
    following the arg-maxes back from ``i = len(word)`` gives the pieces. Cost
    O(len(word) * longest piece) look-ups.

    Args:
        word: one pre-token.
        log_probs: piece -> log-probability (natural log, <= 0), e.g. the ``vocab`` scores
            of a trained ``tokenizers`` Unigram model.

    Returns:
        ``(pieces, log_prob)``: the pieces, in order, and the sum of their log-probabilities.
        Among equally probable cuts the one found first wins (the shorter last piece).

    Raises:
        ValueError: if ``word`` is empty, or some character is covered by no piece.
    """
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    if word == "":
        raise ValueError("cannot segment an empty word")
    longest = max(map(len, log_probs), default=0)
    n = len(word)
    best = [0.0] + [-math.inf] * n
    back = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(max(0, i - longest), i):
            score = log_probs.get(word[j:i])
            if score is not None and best[j] + score > best[i]:
                best[i], back[i] = best[j] + score, j
    if best[n] == -math.inf:
        raise ValueError(f"no segmentation of {word!r}: some character is in no piece of "
                         f"the vocabulary")
    pieces, i = [], n
    while i > 0:
        pieces.append(word[back[i]:i])
        i = back[i]
    return pieces[::-1], best[n]
