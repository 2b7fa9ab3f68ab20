"""GPT-2's byte <-> printable-unicode alphabet, and its pre-tokenisation.

Introduced in notebooks/01_tokens. Byte-level BPE (Radford et al., 2019, "Language
Models are Unsupervised Multitask Learners", section 2.2) works on the UTF-8 bytes of
the text, so every string can be encoded and there is no unknown token. Two pieces
of GPT-2's design live here:

* **Pre-tokenisation.** Before any merge, the text is cut into pre-tokens with the
  regular expression :data:`GPT2_SPLIT_PATTERN` (English contractions, runs of
  letters or digits with an optional leading space, runs of other symbols, runs of
  whitespace). BPE then merges only *inside* a pre-token, so a token never spans a
  word boundary. Special tokens (``"<|endoftext|>"``) are cut out of the text first,
  so they are never split and never merged with their neighbours.
* **The byte <-> unicode alphabet.** GPT-2's files (``encoder.json``, ``vocab.bpe``)
  store tokens as strings in which each byte 0..255 is one printable character:
  the 188 printable Latin-1 bytes stand for themselves and the other 68 bytes are
  shifted to U+0100.. (so the space byte 0x20 is written ``"Ġ"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

import regex

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "bytes_to_unicode",
    "gpt2_string_to_token",
    "pretokenize",
    "special_token_pattern",
    "split_on_special_tokens",
    "token_to_gpt2_string",
    "unicode_to_bytes",
    "validate_special_tokens",
]

#: GPT-2's pre-tokenisation pattern (Radford et al., 2019; the ``pat`` of its encoder.py).
GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
_GPT2_SPLIT_RE = regex.compile(GPT2_SPLIT_PATTERN)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte value 0..255 to one printable unicode character.

    Bytes that are printable Latin-1 characters (``!``..``~``, ``¡``..``¬``,
    ``®``..``ÿ``: 188 of them) map to themselves; the remaining 68 bytes (controls,
    space, DEL, no-break space, soft hyphen) map, in byte order, to U+0100, U+0101, ...
    The result is a bijection onto 256 characters, none of them whitespace.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {}
    shifted = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of :func:`bytes_to_unicode`: printable character -> byte value."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_gpt2_string(token: bytes) -> str:
    """Write a token's bytes in GPT-2's printable alphabet, e.g. ``b" the"`` -> ``"Ġthe"``."""
    if not isinstance(token, bytes):
        raise TypeError(f"token_to_gpt2_string: expected bytes, got {type(token).__name__}")
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def gpt2_string_to_token(text: str) -> bytes:
    """Read a token written in GPT-2's printable alphabet back to bytes (``"Ġthe"`` -> ``b" the"``).

    Raises ``ValueError`` naming the first character that is not in the alphabet.
    """
    table = unicode_to_bytes()
    try:
        return bytes(table[c] for c in text)
    except KeyError as exc:
        raise ValueError(f"{text!r} is not written in GPT-2's byte alphabet: character "
                         f"{exc.args[0]!r} (U+{ord(exc.args[0]):04X}) stands for no byte") from None


def pretokenize(text: str) -> list[str]:
    """Cut ``text`` into GPT-2 pre-tokens with :data:`GPT2_SPLIT_PATTERN`.

    ``"Hello, world's  end"`` -> ``["Hello", ",", " world", "'s", " ", " end"]``.
    The pieces concatenate back to ``text``. Special tokens are *not* handled here;
    see :func:`split_on_special_tokens`.
    """
    if not isinstance(text, str):
        raise TypeError(f"pretokenize: expected str, got {type(text).__name__}")
    return _GPT2_SPLIT_RE.findall(text)


def validate_special_tokens(special_tokens: Iterable[str] | None) -> tuple[str, ...]:
    """Check a collection of special tokens and return it as a tuple (order kept).

    Each must be a non-empty ``str`` and appear once. A bare string is rejected
    (``"<|endoftext|>"`` would otherwise be read as 13 one-character tokens).
    """
    if special_tokens is None:
        return ()
    if isinstance(special_tokens, str | bytes):
        raise TypeError(f"special_tokens must be a list of strings, not the single "
                        f"{type(special_tokens).__name__} {special_tokens!r}; "
                        f"write [{special_tokens!r}]")
    tokens = tuple(special_tokens)
    seen: set[str] = set()
    for tok in tokens:
        if not isinstance(tok, str):
            raise TypeError(f"special token {tok!r} is a {type(tok).__name__}, not a str")
        if tok == "":
            raise ValueError("special token '' is empty")
        if tok in seen:
            raise ValueError(f"special token {tok!r} is given more than once")
        seen.add(tok)
    return tokens


def special_token_pattern(special_tokens: Sequence[str]) -> regex.Pattern | None:
    """A compiled pattern matching any special token, longest first (``None`` if there are none).

    Longest-first alternation means that with ``"<|a|>"`` and ``"<|a|><|b|>"`` both
    special, the text ``"<|a|><|b|>"`` is the second token, not the first plus text.
    """
    if not special_tokens:
        return None
    ordered = sorted(special_tokens, key=lambda s: (-len(s), s))
    return regex.compile("(" + "|".join(regex.escape(s) for s in ordered) + ")")


def split_on_special_tokens(text: str, special_tokens: Sequence[str]) -> list[tuple[str, bool]]:
    """Cut ``text`` at special tokens: a list of ``(piece, is_special)`` in text order.

    ``split_on_special_tokens("a<|endoftext|>b", ["<|endoftext|>"])`` is
    ``[("a", False), ("<|endoftext|>", True), ("b", False)]``. Empty ordinary pieces
    are dropped. With no special tokens the whole text is one ordinary piece.
    """
    pattern = special_token_pattern(special_tokens)
    if pattern is None:
        return [(text, False)] if text else []
    pieces = pattern.split(text)  # [text, special, text, special, ..., text]
    out = []
    for i, piece in enumerate(pieces):
        if i % 2 == 1:
            out.append((piece, True))
        elif piece:
            out.append((piece, False))
    return out
