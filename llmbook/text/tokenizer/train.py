"""Training byte-level BPE: a naive version, then one with incremental pair counts.

Introduced in notebooks/01_tokens. Byte-pair encoding (Gage, 1994, "A New Algorithm
for Data Compression"; for subwords Sennrich et al., 2016, "Neural Machine
Translation of Rare Words with Subword Units") starts from the 256 single bytes and
repeatedly adds the most frequent adjacent pair of tokens as a new token, until the
vocabulary has ``vocab_size`` entries.

Conventions of this module (shared with :class:`llmbook.text.tokenizer.BPETokenizer`):

* **Vocabulary layout.** ids ``0..255`` are the single bytes in byte order, then the
  special tokens in the order given, then one id per merge in the order learned.
  So ``len(merges) == vocab_size - 256 - len(special_tokens)`` unless the corpus
  runs out of pairs first (or, rarely, a merge rebuilds a token that already exists:
  its id is then reused and one more merge is learned, as Hugging Face's trainer does).
* **Counting.** The text is cut at special tokens, then into GPT-2 pre-tokens; pairs
  are counted inside pre-tokens only, weighted by how often each pre-token occurs.
* **Ties.** Among pairs with the highest count, the lexicographically *smallest*
  pair of byte strings ``(left, right)`` wins by default (Python's ordering of
  ``bytes``: ``left`` decides, and ``right`` only when the lefts are equal; a proper
  prefix is smaller, so ``b"a" < b"aa" < b"ab"``). ``tie_break="largest"`` takes the
  lexicographically *greatest* pair instead, the rule some courses and implementations
  use (for example Stanford's CS336, 2025, assignment 1). The rule matters only when
  two pairs tie for the highest count; without ties both rules learn the same merges.

:func:`train_bpe_naive` recounts every pair after each merge: short and obviously
right, but it costs a pass over the whole word table per merge. :func:`train_bpe`
counts once, then after each merge updates only the words that contain the merged
pair (found through an index pair -> words), and finds the best pair with a heap
whose stale entries are skipped when popped ("lazy invalidation"). Both return the
same vocabulary and merges.
"""

from __future__ import annotations

import heapq
import os
from collections import Counter
from itertools import pairwise
from pathlib import Path

from llmbook.text.tokenizer.pretokenize import (
    pretokenize,
    split_on_special_tokens,
    validate_special_tokens,
)

__all__ = [
    "TIE_BREAKS",
    "count_pairs",
    "count_pretokens",
    "initial_vocab",
    "load_text",
    "merge_pair",
    "train_bpe",
    "train_bpe_naive",
]

Pair = tuple[int, int]
TIE_BREAKS = ("smallest", "largest")


class _Descending:
    """A ``bytes`` key that sorts in reverse, so that a min-heap pops the greatest first.

    ``_Descending(a) < _Descending(b)`` exactly when ``a > b``; equal bytes compare equal.
    """

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __lt__(self, other: _Descending) -> bool:
        return self.value > other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.value == other.value

    __hash__ = None  # a sort key only: compared, never hashed


def _check_tie_break(tie_break: str) -> None:
    if not isinstance(tie_break, str) or tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be 'smallest' or 'largest', got {tie_break!r}")


def load_text(text_or_path: str | os.PathLike) -> str:
    """Return the text itself (a ``str``) or the contents of a UTF-8 file (a path).

    A ``str`` is always text, never a file name; pass ``pathlib.Path(name)`` for a file.
    Because ``train_bpe("corpus.txt", ...)`` would otherwise train quietly on the ten
    characters of the name, a one-line ``str`` that names an existing file is refused with
    a ``ValueError`` that says to pass a path. A file that is not valid UTF-8 raises
    ``ValueError`` naming the file and byte offset.
    """
    if isinstance(text_or_path, str):
        if (0 < len(text_or_path) < 4096 and "\n" not in text_or_path and "\0" not in text_or_path
                and os.path.isfile(text_or_path)):
            raise ValueError(f"{text_or_path!r} is the name of an existing file, and a str is "
                             f"read as the text itself: pass pathlib.Path({text_or_path!r}) to "
                             f"read the file")
        return text_or_path
    if not isinstance(text_or_path, os.PathLike):
        raise TypeError(f"expected the text (str) or a path (pathlib.Path), "
                        f"got {type(text_or_path).__name__}")
    path = Path(text_or_path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{str(path)!r} is not UTF-8 text: byte {data[exc.start]:#04x} at "
                         f"byte offset {exc.start} ({exc.reason})") from None


def count_pretokens(text: str, special_tokens: tuple[str, ...] = ()) -> dict[bytes, int]:
    """The word-frequency table: each distinct pre-token's UTF-8 bytes -> its count.

    The text is first cut at the special tokens (which are not counted), then each
    ordinary piece into GPT-2 pre-tokens. Keys are in order of first occurrence.
    """
    counts: Counter[str] = Counter()
    for piece, is_special in split_on_special_tokens(text, special_tokens):
        if not is_special:
            counts.update(pretokenize(piece))
    return {word.encode("utf-8"): n for word, n in counts.items()}


def initial_vocab(special_tokens: tuple[str, ...] = ()) -> dict[int, bytes]:
    """ids 0..255 -> the single bytes, then one id per special token (its UTF-8 bytes)."""
    vocab = {i: bytes([i]) for i in range(256)}
    for tok in special_tokens:
        vocab[len(vocab)] = tok.encode("utf-8")
    return vocab


def merge_pair(word: list[int], pair: Pair, new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``word`` (left to right) by ``new_id``.

    ``merge_pair([1, 2, 2, 2], (2, 2), 9) == [1, 9, 2]``: occurrences do not overlap.
    """
    a, b = pair
    out = []
    i, n = 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def count_pairs(words: list[list[int]], freqs: list[int]) -> dict[Pair, int]:
    """Adjacent-pair counts over a word table: ``sum_w freq_w * #(pair in w)``."""
    counts: dict[Pair, int] = {}
    for word, f in zip(words, freqs, strict=True):
        for pair in pairwise(word):
            counts[pair] = counts.get(pair, 0) + f
    return counts


def _check_arguments(text: str, vocab_size: int, specials: tuple[str, ...]) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__} "
                        f"{vocab_size!r}")
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size={vocab_size} is below 256 bytes + {len(specials)} "
                         f"special tokens = {256 + len(specials)}")
    if text == "":
        raise ValueError("cannot train BPE on an empty corpus (text is '')")


def _prepare(text_or_path: str | os.PathLike, vocab_size: int, special_tokens
             ) -> tuple[dict[int, bytes], list[list[int]], list[int]]:
    """Shared set-up of both trainers: validated inputs -> (vocab, words, freqs)."""
    specials = validate_special_tokens(special_tokens)
    text = load_text(text_or_path)
    _check_arguments(text, vocab_size, specials)
    table = count_pretokens(text, specials)
    words = [list(word) for word in table]  # each word as its byte ids
    return initial_vocab(specials), words, list(table.values())


def _new_token(vocab: dict[int, bytes], ids_of: dict[bytes, int], pair: Pair) -> int:
    """The id for the merge of ``pair``: a fresh id, or the existing one for those bytes."""
    merged = vocab[pair[0]] + vocab[pair[1]]
    if merged not in ids_of:
        ids_of[merged] = len(vocab)
        vocab[len(vocab)] = merged
    return ids_of[merged]


def train_bpe_naive(text_or_path: str | os.PathLike, vocab_size: int,
                    special_tokens: tuple[str, ...] | list[str] = (),
                    tie_break: str = "smallest",
                    ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Teaching version of :func:`train_bpe`: recount all pairs after every merge.

    Same arguments, results and conventions as :func:`train_bpe`; it costs
    O(total word length) per merge, so use it on small corpora only.
    """
    _check_tie_break(tie_break)
    vocab, words, freqs = _prepare(text_or_path, vocab_size, special_tokens)
    ids_of = {tok: i for i, tok in vocab.items() if i < 256}
    merges = []
    while len(vocab) < vocab_size:
        counts = count_pairs(words, freqs)
        if not counts:
            break  # every pre-token is a single token: nothing left to merge
        top = max(counts.values())
        tied = [p for p, n in counts.items() if n == top]  # the pairs with the highest count
        choose = min if tie_break == "smallest" else max  # ... and among them, by their bytes
        best = choose(tied, key=lambda p: (vocab[p[0]], vocab[p[1]]))
        new_id = _new_token(vocab, ids_of, best)
        merges.append((vocab[best[0]], vocab[best[1]]))
        words = [merge_pair(w, best, new_id) for w in words]
    return vocab, merges


def _apply_merge(pair: Pair, new_id: int, words: list[list[int]], freqs: list[int],
                 pair_counts: dict[Pair, int], pair_words: dict[Pair, set[int]]) -> set[Pair]:
    """Merge ``pair`` in the words that contain it, updating counts and index in place.

    Only the words listed in ``pair_words[pair]`` are touched: their old pairs are
    subtracted and their new pairs added. Returns the pairs whose count changed.
    """
    changed: set[Pair] = set()
    for w in pair_words.pop(pair):
        old, f = words[w], freqs[w]
        new = merge_pair(old, pair, new_id)
        words[w] = new
        old_pairs = list(pairwise(old))
        new_pairs = list(pairwise(new))
        for p in old_pairs:
            pair_counts[p] -= f
        for p in new_pairs:
            pair_counts[p] = pair_counts.get(p, 0) + f
            pair_words.setdefault(p, set()).add(w)
        for p in set(old_pairs).difference(new_pairs):
            if p != pair:
                pair_words[p].discard(w)
        changed.update(old_pairs)
        changed.update(new_pairs)
    for p in changed:
        if pair_counts[p] == 0:
            del pair_counts[p]
    return changed


def _pop_best(heap: list, pair_counts: dict[Pair, int]) -> Pair | None:
    """Pop heap entries until one is current (its count is the pair's count now)."""
    while heap:
        neg_count, _, _, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b)) == -neg_count:
            return a, b
    return None


def train_bpe(text_or_path: str | os.PathLike, vocab_size: int,
              special_tokens: tuple[str, ...] | list[str] = (),
              tie_break: str = "smallest",
              ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE tokenizer with incremental pair counts.

    Args:
        text_or_path: the training text (``str``) or a path (``pathlib.Path``) to a
            UTF-8 file.
        vocab_size: the number of ids wanted, at least ``256 + len(special_tokens)``.
        special_tokens: strings that are cut out of the text before counting and get
            their own ids (256, 257, ...) after the bytes.
        tie_break: which pair wins when several share the highest count:
            ``"smallest"`` (the default) the lexicographically smallest ``(left, right)``
            pair of byte strings, ``"largest"`` the greatest. Anything else is a
            ``ValueError``.

    Returns:
        ``(vocab, merges)``: ``vocab`` maps id -> token bytes (ids 0..255 the bytes,
        then the special tokens, then the merges in order); ``merges`` lists the
        learned pairs ``(left_bytes, right_bytes)`` in the order learned.

    The heap holds ``(-count, left_bytes, right_bytes, left_id, right_id)``, so popping
    gives the highest count and, among ties, the smallest byte pair (with
    ``tie_break="largest"`` the bytes are wrapped in a key that sorts in reverse, so the
    greatest pair pops first). When a pair's count changes a fresh entry is pushed; an
    entry whose count no longer matches is stale and is skipped when popped.
    """
    _check_tie_break(tie_break)
    key = (lambda b: b) if tie_break == "smallest" else _Descending
    vocab, words, freqs = _prepare(text_or_path, vocab_size, special_tokens)
    ids_of = {tok: i for i, tok in vocab.items() if i < 256}
    pair_counts: dict[Pair, int] = {}
    pair_words: dict[Pair, set[int]] = {}
    for w, (word, f) in enumerate(zip(words, freqs, strict=True)):
        for p in pairwise(word):
            pair_counts[p] = pair_counts.get(p, 0) + f
            pair_words.setdefault(p, set()).add(w)
    heap = [(-c, key(vocab[a]), key(vocab[b]), a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    merges = []
    while len(vocab) < vocab_size:
        best = _pop_best(heap, pair_counts)
        if best is None:
            break  # no pairs left anywhere
        new_id = _new_token(vocab, ids_of, best)
        merges.append((vocab[best[0]], vocab[best[1]]))
        for p in _apply_merge(best, new_id, words, freqs, pair_counts, pair_words):
            if p in pair_counts:
                heapq.heappush(heap, (-pair_counts[p], key(vocab[p[0]]), key(vocab[p[1]]), *p))
    return vocab, merges
