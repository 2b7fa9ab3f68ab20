"""Reading tiktoken's rank files: the vocabulary is a ranking, and the merges follow from it.

Introduced in notebooks/01_tokens. OpenAI's ``tiktoken`` (``cl100k_base``, GPT-4's
tokenizer) and Qwen's tokenizer (Bai et al., 2023, the ``qwen.tiktoken`` file that Qwen2
keeps) ship a byte-level BPE as one text file: a line per token, the token's bytes in
base64, a space, and its *rank*, which is also its id. There is no merge list. tiktoken
encodes a pre-token by starting from its bytes and, while two adjacent parts concatenate to
a token of the file, joining the pair whose concatenation has the lowest rank.

**Why the ranks determine the merges.** GPT-2-style BPE (:class:`~.encode.BPETokenizer`)
needs, for each token ``t`` longer than one byte, the pair ``(a, b)`` with ``a + b = t`` that
produces it. Run tiktoken's encoder on ``t``'s own bytes, allowed only the tokens of rank
below ``r(t)``: those are all it may build before ``t``, so it must stop at two parts whose
join is ``t``. Those two parts are the merge of rank ``r(t)`` (:func:`merges_from_ranks`); a
token whose bytes stop at more parts can never be produced and is a ``ValueError``. With
the merges in rank order, the book's encoder applies at every step the merge with the
lowest-ranked result, as tiktoken does. The two could part only where some text brings
``t`` together from another pair than ``t``'s own bytes do; the tests and chapter 1 check
that they agree on real text in several scripts and on random strings.

The same construction is how Hugging Face converts tiktoken files to ``tokenizer.json``.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["load_tiktoken_ranks", "merges_from_ranks", "read_tiktoken_file"]


def read_tiktoken_file(path: str | os.PathLike) -> dict[bytes, int]:
    """The ranks of a tiktoken file: token bytes -> rank (``.gz`` files are decompressed).

    Each non-empty line is ``<base64 token> <rank>``. A malformed line, a repeated token or
    a repeated rank is a ``ValueError`` naming the line.
    """
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    ranks: dict[bytes, int] = {}
    seen_ranks: set[int] = set()
    for n, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError("expected '<base64 token> <rank>'")
            token = base64.b64decode(fields[0], validate=True)
            rank = int(fields[1])
        except (ValueError, binascii.Error) as exc:
            raise ValueError(f"{str(path)!r} line {n}: {line[:60]!r}: {exc}") from None
        if token in ranks or rank in seen_ranks or rank < 0 or not token:
            raise ValueError(f"{str(path)!r} line {n}: token {token!r} or rank {rank} is empty, "
                             f"negative or repeated")
        ranks[token] = rank
        seen_ranks.add(rank)
    return ranks


def _last_merge(token: bytes, rank: int, ranks: Mapping[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts that tiktoken's encoder, limited to ranks below ``rank``, leaves of ``token``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    get = ranks.get
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):  # the adjacent pair whose join has the lowest rank
            r = get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            raise ValueError(f"token {token!r} (rank {rank}) cannot be built from tokens of lower "
                             f"rank: its bytes stop at {len(parts)} parts {parts!r}")
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts[0], parts[1]


def merges_from_ranks(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list, in rank order, of a byte-level BPE given only its ranks.

    Args:
        ranks: token bytes -> rank, containing all 256 single bytes.

    Returns:
        ``[(a, b), ...]``, one pair per token longer than one byte, ordered by the rank of
        ``a + b``; ``len == len(ranks) - 256``. Cost: one small BPE run per token (about a
        second for Qwen's 151,643 ranks).
    """
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"the ranks lack {len(missing)} single bytes, e.g. {bytes(missing[:3])!r}; "
                         f"a byte-level BPE needs all 256")
    return [_last_merge(token, rank, ranks)
            for token, rank in sorted(ranks.items(), key=lambda item: item[1]) if len(token) > 1]


def load_tiktoken_ranks(path: str | os.PathLike
                        ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """``(vocab, merges)`` for :class:`~.encode.BPETokenizer` from a tiktoken rank file.

    ``vocab`` maps id (= rank) -> token bytes; ``merges`` comes from :func:`merges_from_ranks`.
    Special tokens are not in rank files: add them to ``vocab`` with their ids (or use
    :meth:`BPETokenizer.from_tiktoken_file`).
    """
    ranks = read_tiktoken_file(path)
    vocab = {rank: token for token, rank in ranks.items()}
    return vocab, merges_from_ranks(ranks)
