"""Reference solutions to the exercises of notebooks/01_tokens (checked by tests/test_solutions_01.py)."""

from __future__ import annotations

from collections.abc import Sequence


def utf8_length(cp: int) -> int:
    """Exercise 1: UTF-8 length of code point ``cp`` (7, 11, 16, 21 payload bits)."""
    if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
        raise ValueError(f"{cp:#x} is not a Unicode scalar value")
    if cp < 1 << 7:
        return 1
    if cp < 1 << 11:
        return 2
    if cp < 1 << 16:
        return 3
    return 4


def utf8_encode(cp: int) -> bytes:
    """Exercise 1: the UTF-8 bytes of ``cp``: a lead byte with 0, 110, 1110 or 11110
    followed by the payload, then continuation bytes 10xxxxxx of 6 payload bits each."""
    n = utf8_length(cp)
    if n == 1:
        return bytes([cp])
    lead_marker = {2: 0b1100_0000, 3: 0b1110_0000, 4: 0b1111_0000}[n]
    continuation = [0b1000_0000 | ((cp >> (6 * k)) & 0b11_1111) for k in range(n - 2, -1, -1)]
    return bytes([lead_marker | (cp >> (6 * (n - 1)))] + continuation)


def most_frequent_pair(word_counts: dict[bytes, int],
                       tie_break: str = "smallest") -> tuple[bytes, bytes]:
    """Exercise 2: the first pair BPE merges: highest count, ties to the smallest pair
    (``tie_break="smallest"``) or to the greatest (``"largest"``).

    For ``{b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}`` the pairs (e, s) and
    (s, t) both occur 6 + 3 = 9 times: the smallest rule takes (e, s), the largest (s, t).
    """
    if tie_break not in ("smallest", "largest"):
        raise ValueError(f"tie_break must be 'smallest' or 'largest', got {tie_break!r}")
    counts: dict[tuple[bytes, bytes], int] = {}
    for word, n in word_counts.items():
        symbols = [bytes([b]) for b in word]
        for pair in zip(symbols, symbols[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + n
    if not counts:
        raise ValueError("no pre-token has two bytes: there is no pair to merge")
    top = max(counts.values())
    tied = [pair for pair, n in counts.items() if n == top]
    return min(tied) if tie_break == "smallest" else max(tied)


def bpe_encode_word(word: bytes, merges: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """Exercise 3: split one pre-token into tokens by applying merges lowest rank first."""
    rank = {pair: r for r, pair in reversed(list(enumerate(merges)))}
    parts = [bytes([b]) for b in word]
    while len(parts) > 1:
        pairs = [(rank[p], i) for i, p in enumerate(zip(parts, parts[1:], strict=False))
                 if p in rank]
        if not pairs:
            break
        best = parts[min(pairs)[1]], parts[min(pairs)[1] + 1]
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


def non_additive_pair(tokenizer) -> tuple[str, str]:
    """Exercise 4: strings a, b with encode(a + b) != encode(a) + encode(b).

    Cutting "the end" as "the " + "end" moves the space: as one text, GPT-2's
    pre-tokeniser makes the pre-tokens "the", " end" (the space starts the word);
    encoded apart, "the " ends with a lone space pre-token and "end" has no space,
    so the ids differ (and the split version is usually longer).
    """
    for a, b in [("the ", "end"), ("hello ", "world"), ("in", "put"), ("a", "b")]:
        if tokenizer.encode(a + b) != tokenizer.encode(a) + tokenizer.encode(b):
            return a, b
    raise AssertionError("no non-additive pair among the candidates")


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))


def cosine_to_reference(E, reference: Sequence[int], k: int,
                        exclude: Sequence[int] = ()) -> tuple[list[int], list[float]]:
    """Exercise 5: the ``k`` rows of ``E`` (V, d) most aligned with the known-unused tokens.

    Centre the rows (subtract E's mean row, the direction every row shares), take the mean of
    the centred reference rows as the direction of "unused", and rank the other rows by their
    cosine similarity to it, highest first (ties: the smaller id first). Returns the ids and
    their cosines. The reference ids and ``exclude`` are left out of the ranking.
    """
    import torch

    if not isinstance(E, torch.Tensor) or E.ndim != 2 or not E.is_floating_point():
        raise ValueError("E must be a floating (V, d) tensor")
    if not reference or not 1 <= k <= E.shape[0] - len(set(reference) | set(exclude)):
        raise ValueError(f"need a non-empty reference and 1 <= k <= the rows left, got k = {k}")
    centred = E.double() - E.double().mean(0)  # (V, d)
    direction = centred[list(reference)].mean(0)  # (d,)
    cos = (centred @ direction) / (centred.norm(dim=1) * direction.norm()).clamp_min(1e-300)  # (V,)
    keep = torch.ones(E.shape[0], dtype=torch.bool)
    keep[sorted(set(reference) | set(exclude))] = False
    ids = torch.arange(E.shape[0])[keep]
    order = torch.sort(-cos[keep], stable=True).indices[:k]  # highest cosine first, ties by id
    return ids[order].tolist(), cos[keep][order].tolist()
