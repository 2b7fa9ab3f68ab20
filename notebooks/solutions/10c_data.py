"""Reference solutions to the exercises of notebooks/10c_data (checked by tests/test_solutions_10c.py)."""

from __future__ import annotations

from collections.abc import Sequence

from llmbook.training.dedup import band_collision_probability, band_inflection

# ---------------------------------------------------------------- exercise 1


def choose_bands(k: int, target: float) -> tuple[int, int]:
    """Exercise 1: the factorisation k = b r whose steepest point ((r-1)/(br-1))^(1/r) is
    closest to ``target`` (ties: the larger r, the steeper curve)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if not 0 < target < 1:
        raise ValueError(f"target must lie in (0, 1), got {target}")
    options = [(k // r, r) for r in range(1, k + 1) if k % r == 0]
    return min(options, key=lambda br: (abs(band_inflection(*br) - target), -br[1]))


def miss_and_false_alarm(bands: int, rows: int, low: float, high: float) -> tuple[float, float]:
    """Exercise 1: P(a pair of similarity ``high`` is not a candidate) and P(a pair of
    similarity ``low`` is one), for b = ``bands`` bands of r = ``rows`` rows."""
    return (1.0 - band_collision_probability(high, bands, rows),
            band_collision_probability(low, bands, rows))


# ---------------------------------------------------------------- exercise 2


def shingle_survival(rate: float, w: int) -> float:
    """Exercise 2: the probability that a w-word shingle of the original appears unchanged
    in the copy. Each word gets at most one edit (probability ``rate``: a third each
    substitution, deletion, insertion after it). The shingle survives when its first
    w − 1 words are untouched (an edit of any kind breaks it: an insertion after one of
    them lands inside the shingle) and its last word is neither substituted nor deleted
    (an insertion after it falls outside): q = (1 − ρ)^(w−1) (1 − 2ρ/3)."""
    if not 0 <= rate <= 1:
        raise ValueError(f"rate must lie in [0, 1], got {rate}")
    if not isinstance(w, int) or w < 1:
        raise ValueError(f"w must be a positive int, got {w!r}")
    return (1 - rate) ** (w - 1) * (1 - 2 * rate / 3)


def predicted_jaccard(rate: float, w: int = 5) -> float:
    """Exercise 2: J ≈ q / (2 − q). The copy has as many words as the original in
    expectation (insertions balance deletions), so |B| ≈ |A|; a share q of A's shingles is
    shared, hence |A ∩ B| ≈ q|A| and |A ∪ B| ≈ (2 − q)|A|. New shingles that happen to
    equal old ones are neglected."""
    q = shingle_survival(rate, w)
    return q / (2 - q)


# ---------------------------------------------------------------- exercise 3


def suffix_array(tokens: Sequence) -> list[int]:
    """Exercise 3: the start positions of the suffixes of ``tokens`` in sorted order (by
    prefix doubling: sort by the ranks of the first 2^j tokens, j = 0, 1, ...; O(n log^2 n))."""
    n = len(tokens)
    if n == 0:
        return []
    rank = _dense_ranks(tokens)  # rank of each suffix by its first token
    order = list(range(n))
    step = 1
    while True:
        key = [(rank[i], rank[i + step] if i + step < n else -1) for i in range(n)]
        order.sort(key=lambda i: key[i])
        new = [0] * n
        for a, b in zip(order, order[1:], strict=False):
            new[b] = new[a] + (key[b] != key[a])
        rank = new
        if rank[order[-1]] == n - 1 or step >= n:
            return order
        step *= 2


def _dense_ranks(tokens: Sequence) -> list[int]:
    index = {t: i for i, t in enumerate(sorted(set(tokens)))}
    return [index[t] for t in tokens]


def _common_prefix(tokens: Sequence, i: int, j: int) -> int:
    n, m = len(tokens), 0
    while i + m < n and j + m < n and tokens[i + m] == tokens[j + m]:
        m += 1
    return m


def longest_repeat(tokens: Sequence) -> tuple[int, int, int]:
    """Exercise 3: (length, first start, second start) of the longest run of tokens that
    occurs at two different positions (overlaps allowed), starts in increasing order;
    (0, -1, -1) when no token repeats. The longest repeat is the longest common prefix
    of two suffixes, and the two suffixes sharing the most are adjacent in sorted order."""
    sa = suffix_array(tokens)
    best = (0, -1, -1)
    for a, b in zip(sa, sa[1:], strict=False):
        m = _common_prefix(tokens, a, b)
        if m > best[0]:
            best = (m, min(a, b), max(a, b))
    return best


if __name__ == "__main__":  # `python notebooks/solutions/NN_slug.py`: run these answers' tests
    from llmbook.nbtools import run_solution_tests

    raise SystemExit(run_solution_tests(__file__))
