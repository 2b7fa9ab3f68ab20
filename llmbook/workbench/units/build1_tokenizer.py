r"""Build it yourself, Part I: a byte-level BPE tokenizer (the reference: the book's code plugged in).

In this unit you write, from scratch, the tokenizer that Part I of the book builds in
notebooks/01_tokens: GPT-2's pre-tokenisation, a BPE trainer, an encoder and a decoder.
Each function below is one piece; its docstring says what to compute, the edge cases and
what it is compared with. The bodies here call the book's own implementation
(:mod:`llmbook.text.tokenizer`); yours must not (the grader cannot tell, but you would
learn nothing).

Build in this order, grading as you go (``llmbook grade build-I``):

1. ``pretokenize``, ``split_on_special_tokens`` and ``count_pretokens``: the word table;
2. ``count_pairs`` and ``merge_pair``: one step of BPE on that table;
3. ``train_bpe``: the whole trainer, with the book's vocabulary layout and tie rule;
4. ``encode``: apply the learned merges, lowest rank first, to new text;
5. ``decode``: ids back to text, invalid UTF-8 included;
6. nothing new to write: the end-to-end check trains with your ``train_bpe``, encodes and
   decodes with yours, and compares the ids with Hugging Face ``tokenizers``, both its
   encoder given your merges and its own trainer.

The peers are the book's functions, Hugging Face ``tokenizers`` (its byte-level
pre-tokeniser, its BPE model and its ``BpeTrainer``) and OpenAI's ``tiktoken`` built on
your ranks. Tokens and ids must be equal, not close: there is no tolerance anywhere in
this unit.

Conventions shared by every function (the book's, chapter 1):

* a token is a non-empty ``bytes``; a vocabulary is a ``dict[int, bytes]`` id -> token;
* ids ``0..255`` are the single bytes in byte order (id ``b`` is ``bytes([b])``), then one
  id per special token in the order given, then one id per merge in the order learned;
* a merge is a pair ``(left_bytes, right_bytes)``; its position in the list is its rank.
"""

from __future__ import annotations

from collections.abc import Sequence

#: GPT-2's pre-tokenisation pattern (Radford et al., 2019), for the third-party ``regex``
#: module (``import regex``; Python's own ``re`` has no ``\p{L}``): contractions, runs of
#: letters, runs of digits or runs of other symbols (each with one optional leading space),
#: then whitespace.
GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


def pretokenize(text: str) -> list[str]:
    r"""Cut ``text`` into GPT-2 pre-tokens: every match of :data:`GPT2_SPLIT_PATTERN`, in order.

    ``"Hello, world's  end"`` -> ``["Hello", ",", " world", "'s", " ", " end"]``: the
    pieces join back to ``text`` exactly. Note the two spaces before ``end``: the
    alternative ``\s+(?!\S)`` takes all but the last space, which then starts the word.
    The empty string gives ``[]``. Special tokens are not handled here.

    Hint: ``regex.findall(GPT2_SPLIT_PATTERN, text)``, with the third-party ``regex`` module
    (``import regex``; a dependency of the book), since Python's ``re`` has no ``\p{L}``.

    Checked against the book's ``pretokenize`` and against the byte-level pre-tokeniser
    of Hugging Face ``tokenizers`` (``ByteLevel(add_prefix_space=False)``), piece by piece,
    on English, accented, CJK, emoji, digit, contraction and whitespace-heavy texts.
    """
    from llmbook.text.tokenizer import pretokenize as book_pretokenize

    return book_pretokenize(text)


def split_on_special_tokens(text: str, special_tokens: Sequence[str]) -> list[tuple[str, bool]]:
    """Cut ``text`` at the special tokens: a list of ``(piece, is_special)`` in text order.

    ``split_on_special_tokens("a<|endoftext|>b", ["<|endoftext|>"])`` is
    ``[("a", False), ("<|endoftext|>", True), ("b", False)]``. Rules:

    * empty ordinary pieces are dropped (two special tokens in a row give two special
      pieces and nothing between them);
    * where two special tokens could match at the same place, the longer wins: with
      ``"<|a|>"`` and ``"<|a|><|b|>"`` both special, the text ``"<|a|><|b|>"`` is one piece;
    * with no special tokens the whole text is one ordinary piece (``[]`` for ``""``).

    Hint: ``regex.escape`` each token, sort them longest first, join them with ``|``
    inside one capturing group, and ``regex.split`` (the captured separators come back at
    the odd positions).

    Checked against the book's ``split_on_special_tokens`` (equal lists).
    """
    from llmbook.text.tokenizer import split_on_special_tokens as book_split

    return book_split(text, list(special_tokens))


def count_pretokens(text: str, special_tokens: Sequence[str] = ()) -> dict[bytes, int]:
    """The word table: each distinct pre-token's UTF-8 bytes -> how many times it occurs.

    Cut ``text`` at the special tokens first (they are not counted), then each ordinary
    piece into pre-tokens with :func:`pretokenize`; count the pre-tokens and key them by
    their ``.encode("utf-8")``. ``count_pretokens("the cat the", ())`` is
    ``{b"the": 1, b" cat": 1, b" the": 1}``: a leading space makes a different word.

    Checked against the book's ``count_pretokens`` (equal dicts) and against the counts
    of the pieces that Hugging Face ``tokenizers``' byte-level pre-tokeniser gives.
    """
    from llmbook.text.tokenizer import count_pretokens as book_count

    return book_count(text, tuple(special_tokens))


def count_pairs(words: list[list[int]], freqs: list[int]) -> dict[tuple[int, int], int]:
    """Adjacent-pair counts over a word table: ``count(a, b) = sum_w freqs[w] * #(a, b in w)``.

    ``words[w]`` is a word as a list of token ids and ``freqs[w]`` how often it occurs.
    Pairs are counted inside words only, overlapping occurrences included:
    ``count_pairs([[1, 1, 1]], [2])`` is ``{(1, 1): 4}``. A pair that never occurs is
    absent (no zero entries).

    Checked against the book's ``count_pairs`` (equal dicts).
    """
    from llmbook.text.tokenizer import count_pairs as book_count_pairs

    return book_count_pairs(words, freqs)


def merge_pair(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``word``, scanning left to right, by ``new_id``.

    Occurrences do not overlap: once two ids are merged the scan continues after them,
    so ``merge_pair([1, 2, 2, 2], (2, 2), 9)`` is ``[1, 9, 2]``, not ``[1, 9, 9]``, and
    ``merge_pair([5, 5, 5, 5], (5, 5), 7)`` is ``[7, 7]``. A word without the pair comes
    back unchanged (as a new list; ``word`` itself is not modified).

    Checked against the book's ``merge_pair`` on hand-made and random words.
    """
    from llmbook.text.tokenizer import merge_pair as book_merge_pair

    return book_merge_pair(list(word), tuple(pair), new_id)


def train_bpe(text: str, vocab_size: int, special_tokens: Sequence[str] = ()
              ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train byte-level BPE on ``text`` until the vocabulary has ``vocab_size`` ids.

    Returns ``(vocab, merges)``. Start from ``vocab`` = the 256 single bytes (ids 0..255)
    followed by the special tokens' UTF-8 bytes (ids 256, 257, ... in the order given).
    Build the word table with :func:`count_pretokens` (each word as its list of byte ids),
    then repeat until ``len(vocab) == vocab_size``:

    1. count the adjacent pairs over the table (:func:`count_pairs`);
    2. take the pair with the highest count; among pairs tied for it, the one whose
       ``(vocab[a], vocab[b])`` is the smallest as Python compares tuples of ``bytes``
       (the left token decides; the right only when the lefts are equal; a proper prefix
       is smaller, so ``b"a" < b"aa" < b"ab"``). This is the book's tie rule;
    3. give the merged bytes ``vocab[a] + vocab[b]`` the next id, append
       ``(vocab[a], vocab[b])`` to ``merges``, and :func:`merge_pair` it in every word.

    Stop early when no word has two tokens left. Rarely a merge rebuilds bytes that are
    already a token (``b"a" + b"aa"`` after ``b"aa" + b"a"``): the existing id is reused,
    the merge is still recorded, and training goes on, so ``merges`` is then one longer
    than ``vocab_size - 256 - len(special_tokens)``.

    Raises ``ValueError`` when ``vocab_size < 256 + len(special_tokens)`` or ``text == ""``.

    Hint: recounting every pair after each merge (as above) is fine here; the book's
    faster version updates only the words that contain the merged pair, with a heap.

    Checked against the book's ``train_bpe``: the same ``vocab`` and the same ``merges``
    in the same order, on corpora where ties decide merges, with and without special
    tokens (a few tens of kilobytes of the book's corpus, a few hundred merges).
    """
    from llmbook.text.tokenizer import train_bpe as book_train_bpe

    return book_train_bpe(text, vocab_size, list(special_tokens))


def encode(text: str, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
           special_tokens: Sequence[str] = ()) -> list[int]:
    """The token ids of ``text`` under a trained ``(vocab, merges)``: a ``list[int]`` of length T.

    1. Cut ``text`` with :func:`split_on_special_tokens`; a special piece becomes the one
       id whose token is its UTF-8 bytes (it is never split or merged).
    2. Cut each ordinary piece with :func:`pretokenize`; BPE works inside each pre-token.
    3. For a pre-token, start from its UTF-8 bytes (one token each). While some adjacent
       pair of tokens is a merge, take the pair whose merge has the lowest rank (the one
       learned earliest) and merge every occurrence of it, left to right. The ids are the
       vocabulary's ids of the final tokens.

    The rank decides, not the position: with ``merges = [(b"b", b"c"), (b"a", b"b")]`` the
    pre-token ``"abc"`` becomes ``a|bc``, although the leftmost mergeable pair is ``a, b``.

    Hint: build ``rank = {(left, right): r}`` and ``id_of = {token: id}`` once per call,
    and cache the ids of each distinct pre-token: real text repeats its words.

    Checked, id for id, against the book's ``BPETokenizer``, against Hugging Face
    ``tokenizers``' BPE model given the same vocabulary and merges, and against
    ``tiktoken`` built on the same ranks with the same pattern.
    """
    from llmbook.text.tokenizer import BPETokenizer

    return BPETokenizer(vocab, merges, list(special_tokens)).encode(text)


def decode(ids: list[int], vocab: dict[int, bytes]) -> str:
    """The text of the tokens ``ids``: join their bytes, then read the bytes as UTF-8.

    Bytes that are not valid UTF-8 (a sequence of ids cut inside a character) become the
    replacement character U+FFFD, as ``bytes.decode("utf-8", errors="replace")`` does:
    decode the joined bytes once, not token by token, since one character's bytes may be
    spread over several tokens. Special tokens decode to their own text.

    Raises ``ValueError`` naming the id and its position for an id not in ``vocab``.

    Checked against the book's ``BPETokenizer.decode`` and Hugging Face ``tokenizers``'
    byte-level decoder (equal strings), on round trips and on cut characters.
    """
    from llmbook.text.tokenizer import BPETokenizer

    return BPETokenizer(vocab, []).decode(ids)
