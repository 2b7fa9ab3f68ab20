"""Encoding and decoding with a trained byte-level BPE: :class:`BPETokenizer`.

Introduced in notebooks/01_tokens. Encoding repeats the training in miniature on
each pre-token: start from its UTF-8 bytes and, while some adjacent pair is a known
merge, merge the pair with the lowest *rank* (the merge learned earliest) everywhere
in the pre-token. This is GPT-2's ``bpe`` routine (Radford et al., 2019) and gives
the same ids as Hugging Face ``tokenizers``' BPE model with the same vocabulary and
merges. Pre-tokens repeat a lot in real text, so results are cached per pre-token.

Decoding concatenates the tokens' bytes and reads them as UTF-8; a byte sequence
that is not valid UTF-8 (a token sequence cut inside a character) becomes U+FFFD,
as GPT-2 does with ``errors="replace"``.

The pre-tokeniser is GPT-2's regex unless another is given
(:mod:`.pretokenizers`: ``"smollm"``, ``"qwen2"``, ``"cl100k"`` or any
:class:`~llmbook.text.tokenizer.pretokenizers.PreTokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import pairwise

import regex

from llmbook.text.tokenizer.pretokenize import special_token_pattern, validate_special_tokens
from llmbook.text.tokenizer.pretokenizers import PreTokenizer, get_pretokenizer

__all__ = ["BPETokenizer"]

# The last non-whitespace character of a string (searched backwards): \s as the
# pre-tokenisers' patterns read it (Unicode White_Space), not as str.isspace does.
_LAST_NON_SPACE = regex.compile(r"(?r)\S")


def _check_vocab(vocab: Mapping[int, bytes]) -> dict[int, bytes]:
    if not isinstance(vocab, Mapping):
        raise TypeError(f"vocab must be a dict id -> bytes, got {type(vocab).__name__}")
    for i, tok in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise TypeError(f"vocab ids must be non-negative ints, got {i!r}")
        if not isinstance(tok, bytes) or tok == b"":
            raise TypeError(f"vocab[{i}] must be non-empty bytes, got {tok!r}")
    return dict(vocab)


class BPETokenizer:
    """A byte-level BPE tokenizer given its vocabulary, merges and special tokens.

    Args:
        vocab: id -> token bytes. Must contain all 256 single bytes, every merge's
            parts and result, and each special token's UTF-8 bytes. Any id layout
            works (the book's trainer puts bytes at 0..255; GPT-2's files do not).
        merges: the learned pairs ``(left_bytes, right_bytes)``, earliest first; a
            merge's position in the list is its rank.
        special_tokens: strings kept whole by :meth:`encode` (matched longest first,
            before pre-tokenisation). ``None`` means none.
        pretokenizer: a preset name of :data:`~.pretokenizers.PRETOKENIZERS` (``"gpt2"``,
            the default, ``"smollm"``, ``"qwen2"``, ``"cl100k"``) or a
            :class:`~.pretokenizers.PreTokenizer`.
        require_all_bytes: with ``False`` the vocabulary may lack some single bytes (as
            SmolLM2's lacks 21 that its training text never had); :meth:`encode` then
            raises ``ValueError`` on text that needs one. Default ``True``.

    ``encode(text)`` gives a ``list[int]`` of length T (the number of tokens), and
    ``decode(ids)`` inverts it: ``decode(encode(s)) == s`` for every string ``s`` (whose
    bytes all have tokens, which is every string when the vocab has all 256 bytes).
    """

    #: Pre-token cache entries kept before the cache is emptied (bounds memory).
    cache_size = 1 << 16

    def __init__(self, vocab: Mapping[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                 special_tokens: Iterable[str] | None = None,
                 pretokenizer: str | PreTokenizer = "gpt2", *,
                 require_all_bytes: bool = True) -> None:
        self.vocab = _check_vocab(vocab)
        self.special_tokens = validate_special_tokens(special_tokens)
        self.pretokenizer = get_pretokenizer(pretokenizer)
        if isinstance(merges, str | bytes) or not isinstance(merges, Sequence):
            raise TypeError(f"merges must be a list of (bytes, bytes), got {type(merges).__name__}")
        self.merges = [tuple(m) for m in merges]
        # Regular tokens by their bytes. With duplicates (say a special token whose
        # bytes equal a merge result) the lowest id stands for the bytes.
        self._id_of: dict[bytes, int] = {}
        for i in sorted(self.vocab):
            self._id_of.setdefault(self.vocab[i], i)
        missing = [b for b in range(256) if bytes([b]) not in self._id_of]
        if missing and require_all_bytes:
            raise ValueError(f"vocab lacks {len(missing)} single bytes, e.g. {bytes(missing[:3])!r}; "
                             f"a byte-level vocabulary needs all 256")
        #: The single bytes that have no id (empty unless ``require_all_bytes=False``).
        self.missing_bytes = bytes(missing)
        self._byte_ids = [self._id_of.get(bytes([b]), -1) for b in range(256)]
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(self.merges):
            if len(merge) != 2 or not (isinstance(merge[0], bytes) and isinstance(merge[1], bytes)):
                raise TypeError(f"merges[{rank}] must be a pair of bytes, got {merge!r}")
            left, right = merge
            for part in (left, right, left + right):
                if part not in self._id_of:
                    raise ValueError(f"merges[{rank}] = {merge!r}: {part!r} is not in the vocab")
            pair = (self._id_of[left], self._id_of[right])
            self._ranks.setdefault(pair, (rank, self._id_of[left + right]))
        self._special_ids = self._find_special_ids()
        self._special_re = special_token_pattern(self.special_tokens)
        self._max_special_len = max((len(s) for s in self.special_tokens), default=0)
        self._cache: dict[str, list[int]] = {}

    def _find_special_ids(self) -> dict[str, int]:
        """Each special token's id: an id with its bytes that no byte or merge claims."""
        regular = set(self._byte_ids) | {r for _, r in self._ranks.values()}
        ids = {}
        for tok in self.special_tokens:
            candidates = [i for i, t in self.vocab.items() if t == tok.encode("utf-8")]
            if not candidates:
                raise ValueError(f"special token {tok!r} is not in the vocab")
            own = [i for i in candidates if i not in regular]
            ids[tok] = min(own or candidates)
        return ids

    @property
    def vocab_size(self) -> int:
        """V: the number of ids."""
        return len(self.vocab)

    def __repr__(self) -> str:
        pre = "" if self.pretokenizer.name == "gpt2" else f", pretokenizer={self.pretokenizer.name!r}"
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={list(self.special_tokens)}{pre})")

    # -- encoding ---------------------------------------------------------------------

    def _bpe(self, pretoken: str) -> list[int]:
        """Ids of one pre-token: merge the lowest-rank adjacent pair until none is left."""
        word = [self._byte_ids[b] for b in pretoken.encode("utf-8")]
        ranks = self._ranks
        while len(word) > 1:
            best = None
            for pair in pairwise(word):
                found = ranks.get(pair)
                if found is not None and (best is None or found[0] < best[1][0]):
                    best = (pair, found)
            if best is None:
                break
            (a, b), (_, new_id) = best
            merged, i, n = [], 0, len(word)
            while i < n:  # replace every occurrence, left to right
                if i + 1 < n and word[i] == a and word[i + 1] == b:
                    merged.append(new_id)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def _refuse_missing_byte(self, pretoken: str) -> None:
        """Raise the ``ValueError`` for a pre-token that needs a byte the vocab lacks."""
        for ch in pretoken:
            lacking = [b for b in ch.encode("utf-8") if self._byte_ids[b] < 0]
            if lacking:
                raise ValueError(f"cannot encode {ch!r} (U+{ord(ch):04X}): its UTF-8 byte "
                                 f"{lacking[0]:#04x} has no token in this vocabulary, which "
                                 f"lacks {len(self.missing_bytes)} of the 256 bytes")

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (no special tokens in it) to ``out``."""
        self._encode_pretokens(self.pretokenizer.split(text), out)

    def _encode_pretokens(self, pretokens: Iterable[str], out: list[int]) -> None:
        """Append the ids of each pre-token to ``out``, through the cache."""
        cache = self._cache
        for pretoken in pretokens:
            ids = cache.get(pretoken)
            if ids is None:
                if len(cache) >= self.cache_size:
                    cache.clear()
                ids = self._bpe(pretoken)
                if self.missing_bytes and -1 in ids:  # a byte without a token (id -1) is left
                    self._refuse_missing_byte(pretoken)
                cache[pretoken] = ids
            out.extend(ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (length T). Special tokens are kept whole."""
        return self._encode_text(text)

    def _encode_text(self, text: str) -> list[int]:
        """The ids of ``text``: what :meth:`encode` and the end of :meth:`encode_iterable` give."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        out: list[int] = []
        if self._special_re is None:
            self._encode_ordinary(text, out)
            return out
        for i, piece in enumerate(self._special_re.split(text)):
            if i % 2:
                out.append(self._special_ids[piece])
            elif piece:
                self._encode_ordinary(piece, out)
        return out

    def encode_iterable(self, chunks: Iterable[str], block_chars: int = 1 << 16) -> Iterator[int]:
        """Yield the ids of the concatenated ``chunks``, reading them lazily.

        ``chunks`` is any iterable of strings, e.g. an open text file (its lines). The
        ids are exactly ``encode("".join(chunks))``, but only a bounded tail of text is
        held at any time (about ``block_chars`` plus one line), so a file of any size
        streams in bounded memory.

        Why it is exact: the text is cut only where the cut cannot change the result.
        A special token is confirmed once the longest special token would fit after
        its start; ordinary text after it is pre-tokenised, and a pre-token is emitted
        when some non-whitespace character at or after its end lies more than the
        pre-tokeniser's ``lookahead`` (3) characters before the buffer's end: for GPT-2's
        pattern a pre-token is decided by at most the two characters after its end, and
        for the other presets by the text up to two characters past the first
        non-whitespace character after it (:mod:`.pretokenizers`). The rest waits for more
        text. A pre-tokeniser with ``lookahead=None`` is cut only at special tokens.
        """
        if isinstance(chunks, str):
            chunks = [chunks]  # a single string is one chunk, not a stream of characters
        if isinstance(block_chars, bool) or not isinstance(block_chars, int) or block_chars < 1:
            raise ValueError(f"block_chars must be a positive int, got {block_chars!r}")
        buffer = ""
        next_at = block_chars  # try to cut when the buffer reaches this length
        for chunk in chunks:
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable expects strings, got {type(chunk).__name__}")
            buffer += chunk
            if len(buffer) >= next_at:
                ids, buffer = self._encode_prefix(buffer)
                yield from ids
                # a tail that could not be cut (one huge pre-token) waits for a full block
                next_at = len(buffer) + block_chars
        yield from self._encode_text(buffer)

    def _encode_prefix(self, buffer: str) -> tuple[list[int], str]:
        """Encode the part of ``buffer`` that more text cannot change; return (ids, rest)."""
        out: list[int] = []
        start = 0  # where the ordinary text after the last confirmed special token begins
        avail_end = len(buffer)
        if self._special_re is not None:
            avail_end = len(buffer) - self._max_special_len + 1
            for m in self._special_re.finditer(buffer):
                if m.start() >= avail_end:
                    break
                if m.start() > start:
                    self._encode_ordinary(buffer[start:m.start()], out)
                out.append(self._special_ids[m.group()])
                start = m.end()
            avail_end = max(avail_end, start)
        lookahead = self.pretokenizer.lookahead
        if lookahead is None:  # no bound claimed: cut only after confirmed special tokens
            return out, buffer[start:]
        # A pre-token ending at e is final if a non-whitespace character sits at some
        # q >= e with q + lookahead < avail_end: find the last such q.
        last = _LAST_NON_SPACE.search(buffer, start, max(start, avail_end - lookahead))
        if last is None:
            return out, buffer[start:]
        # Keep the pre-tokens themselves: pre-tokenising buffer[start:cut] again could
        # differ, since the end of a string satisfies the look-ahead (?!\S).
        cut, pretokens = start, []
        for pretoken in self.pretokenizer.split(buffer[start:avail_end]):
            if cut + len(pretoken) > last.start():
                break
            pretokens.append(pretoken)
            cut += len(pretoken)
        self._encode_pretokens(pretokens, out)
        return out, buffer[cut:]

    # -- decoding ---------------------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The concatenated bytes of the tokens ``ids`` (``ValueError`` on an unknown id)."""
        if isinstance(ids, str | bytes):
            raise TypeError(f"decode expects a list of ids, got {type(ids).__name__}")
        vocab = self.vocab
        parts = []
        for pos, i in enumerate(ids):
            tok = vocab.get(i) if isinstance(i, int) and not isinstance(i, bool) else None
            if tok is None:
                if not hasattr(i, "__index__") or isinstance(i, bool):
                    raise TypeError(f"id at position {pos} is {i!r}, not an int")
                tok = vocab.get(int(i))  # numpy / torch integers
                if tok is None:
                    raise ValueError(f"id {int(i)} at position {pos} is not in the vocabulary "
                                     f"(V = {len(vocab)})")
            parts.append(tok)
        return b"".join(parts)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the tokens ``ids``; invalid UTF-8 becomes U+FFFD (``errors="replace"``)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # -- GPT-2 files --------------------------------------------------------------------

    @classmethod
    def from_gpt2_files(cls, encoder_json: str | os.PathLike, vocab_bpe: str | os.PathLike,
                        special_tokens: Iterable[str] | None = None) -> BPETokenizer:
        """Load GPT-2's file pair ``encoder.json`` + ``vocab.bpe`` (see :mod:`.gpt2_files`).

        With ``special_tokens=None`` the special tokens are found in the files: the
        entries of ``encoder.json`` that are neither a byte nor a merge result (for
        GPT-2 itself, ``"<|endoftext|>"``).
        """
        from llmbook.text.tokenizer.gpt2_files import read_gpt2_files

        vocab, merges, specials = read_gpt2_files(encoder_json, vocab_bpe, special_tokens)
        return cls(vocab, merges, specials)

    @classmethod
    def from_tiktoken_file(cls, path: str | os.PathLike, pretokenizer: str | PreTokenizer,
                           special_tokens: Mapping[str, int] | None = None) -> BPETokenizer:
        """Load a tiktoken rank file (``cl100k_base.tiktoken``, Qwen's ``qwen.tiktoken``).

        ``pretokenizer`` must be the file's own (``"cl100k"``, ``"qwen2"``): the file does
        not say. ``special_tokens`` maps each special token to its id, which must be free
        (rank files hold no special tokens). See :mod:`.tiktoken_files`.
        """
        from llmbook.text.tokenizer.tiktoken_files import load_tiktoken_ranks

        vocab, merges = load_tiktoken_ranks(path)
        specials = dict(special_tokens or {})
        validate_special_tokens(list(specials))
        for tok, i in specials.items():
            if isinstance(i, bool) or not isinstance(i, int) or i in vocab:
                raise ValueError(f"special token {tok!r}: id {i!r} is not an int, or is already "
                                 f"a token of the rank file")
            vocab[i] = tok.encode("utf-8")
        return cls(vocab, merges, list(specials), pretokenizer)

    def save_gpt2_files(self, directory: str | os.PathLike) -> tuple[os.PathLike, os.PathLike]:
        """Write ``encoder.json`` and ``vocab.bpe`` into ``directory``; return their paths."""
        from llmbook.text.tokenizer.gpt2_files import write_gpt2_files

        return write_gpt2_files(directory, self.vocab, self.merges, self.special_tokens)
