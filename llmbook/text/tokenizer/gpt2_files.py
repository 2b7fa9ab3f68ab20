"""Reading and writing GPT-2's tokenizer files ``encoder.json`` and ``vocab.bpe``.

Introduced in notebooks/01_tokens. OpenAI released GPT-2's tokenizer (Radford et
al., 2019) as two files, and many later models reuse the format:

* ``encoder.json``: a JSON object mapping each token, written in GPT-2's printable
  byte alphabet (:func:`~llmbook.text.tokenizer.pretokenize.bytes_to_unicode`), to its id;
  special tokens such as ``"<|endoftext|>"`` appear as their plain text.
* ``vocab.bpe``: a ``#version: 0.2`` header line, then one merge per line, the two
  tokens in the same alphabet separated by one space, earliest (lowest rank) first.

With these two files :meth:`BPETokenizer.from_gpt2_files` reproduces GPT-2's token
ids; the book writes them from its own trainer, since it runs without a network.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from llmbook.text.tokenizer.pretokenize import (
    gpt2_string_to_token,
    token_to_gpt2_string,
    validate_special_tokens,
)

__all__ = ["read_gpt2_files", "write_gpt2_files"]

VERSION_LINE = "#version: 0.2"


def write_gpt2_files(directory: str | os.PathLike, vocab: Mapping[int, bytes],
                     merges: Sequence[tuple[bytes, bytes]], special_tokens: Iterable[str] = ()
                     ) -> tuple[Path, Path]:
    """Write ``encoder.json`` and ``vocab.bpe`` for a byte-level BPE into ``directory``.

    Special tokens are written as their text; every other token in GPT-2's byte
    alphabet. Returns the two paths ``(encoder_json, vocab_bpe)``.
    """
    specials = validate_special_tokens(special_tokens)
    special_bytes = {s.encode("utf-8"): s for s in specials}
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    encoder: dict[str, int] = {}
    for i in sorted(vocab):
        tok = vocab[i]
        key = special_bytes.pop(tok) if tok in special_bytes else token_to_gpt2_string(tok)
        if key in encoder:
            raise ValueError(f"tokens {encoder[key]} and {i} are both written {key!r} in "
                             f"encoder.json; GPT-2's format needs distinct strings")
        encoder[key] = i
    encoder_path, merges_path = folder / "encoder.json", folder / "vocab.bpe"
    encoder_path.write_text(json.dumps(encoder, ensure_ascii=False), encoding="utf-8")
    lines = [VERSION_LINE] + [f"{token_to_gpt2_string(a)} {token_to_gpt2_string(b)}"
                              for a, b in merges]
    merges_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return encoder_path, merges_path


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{str(path)!r} is not UTF-8 text: byte offset {exc.start} "
                         f"({exc.reason})") from None


def read_gpt2_files(encoder_json: str | os.PathLike, vocab_bpe: str | os.PathLike,
                    special_tokens: Iterable[str] | None = None
                    ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]], tuple[str, ...]]:
    """Read GPT-2's file pair; return ``(vocab, merges, special_tokens)``.

    ``vocab`` maps id -> token bytes, ``merges`` lists ``(left, right)`` bytes by rank.
    With ``special_tokens=None`` the special tokens are the ``encoder.json`` entries
    that are neither a single byte nor the result of a merge; otherwise the named
    strings (each must be in ``encoder.json``).
    """
    enc_path, bpe_path = Path(encoder_json), Path(vocab_bpe)
    try:
        encoder = json.loads(_read_utf8(enc_path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(enc_path)!r} is not valid JSON: {exc}") from None
    if not isinstance(encoder, dict):
        raise ValueError(f"{str(enc_path)!r} must hold a JSON object token -> id")
    merges: list[tuple[bytes, bytes]] = []
    for n, line in enumerate(_read_utf8(bpe_path).split("\n"), start=1):
        if (n == 1 and line.startswith("#version")) or line == "":
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{str(bpe_path)!r} line {n}: expected two tokens separated by "
                             f"one space, got {line!r}")
        try:
            merges.append((gpt2_string_to_token(parts[0]), gpt2_string_to_token(parts[1])))
        except ValueError as exc:
            raise ValueError(f"{str(bpe_path)!r} line {n}: {exc}") from None
    if special_tokens is None:
        alphabet_sized = {token_to_gpt2_string(bytes([b])) for b in range(256)}
        merged = {token_to_gpt2_string(a + b) for a, b in merges}
        specials = tuple(k for k in encoder if k not in alphabet_sized and k not in merged)
    else:
        specials = validate_special_tokens(special_tokens)
        for s in specials:
            if s not in encoder:
                raise ValueError(f"special token {s!r} is not in {str(enc_path)!r}")
    vocab: dict[int, bytes] = {}
    for key, i in encoder.items():
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{str(enc_path)!r}: id of {key!r} is {i!r}, not an int")
        if i in vocab:
            raise ValueError(f"{str(enc_path)!r}: id {i} is used twice")
        vocab[i] = key.encode("utf-8") if key in specials else gpt2_string_to_token(key)
    return vocab, merges, specials
