"""Near-duplicate detection: shingles, MinHash signatures and LSH banding.

For the data chapter of Part III (issue 23; the chapter itself is still to be written).
Two documents are compared as sets of *shingles* (their overlapping k-grams); their
Jaccard similarity is J(A, B) = |A ∩ B| / |A ∪ B|. MinHash (Broder, 1997) keeps, for each
of k random hash functions h_i, the minimum of h_i over a document's shingles; for a
min-wise independent family, P[min h_i(A) = min h_i(B)] = J(A, B), so the share of equal
entries of two signatures estimates J with variance J(1 − J)/k. LSH banding (Indyk and
Motwani, 1998; Leskovec, Rajaraman and Ullman, *Mining of Massive Datasets*, ch. 3) cuts a
signature into b bands of r rows; two documents become a *candidate pair* when any band
agrees entirely, which happens with probability 1 − (1 − J^r)^b, an S-curve whose steep
part sits near J = (1/b)^(1/r).

The hash family is Carter and Wegman's (1979) h(x) = (a x + b) mod p with p = 2^31 − 1 (a
Mersenne prime), a ∈ [1, p) and b ∈ [0, p) drawn from a seeded generator, applied to a
32-bit hash of each shingle (the first four bytes of its SHA-1, little-endian). Every
product stays below 2^62, so numpy's uint64 arithmetic is exact.

Shapes: a corpus of N documents gives signatures of shape (N, k), ``uint64``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from llmbook.validation import check_positive_int

__all__ = [
    "MERSENNE_31",
    "band_collision_probability",
    "band_threshold",
    "estimate_jaccard",
    "hash_family",
    "jaccard",
    "lsh_candidates",
    "minhash_signature",
    "minhash_signatures",
    "shingle_hashes",
    "shingles",
]

#: The prime modulus of the hash family, 2^31 − 1.
MERSENNE_31 = (1 << 31) - 1


def shingles(text: str, k: int = 5, unit: str = "word") -> set[str]:
    """The set of k-shingles of ``text``: runs of ``k`` words (``unit="word"``, split on
    whitespace and lower-cased) or of ``k`` characters (``unit="char"``).

    A text shorter than ``k`` units gives one shingle, the whole text (an empty text: none).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    k = check_positive_int("k", k)
    if unit == "word":
        words = text.lower().split()
        if not words:
            return set()
        if len(words) <= k:
            return {" ".join(words)}
        return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}
    if unit == "char":
        if not text:
            return set()
        if len(text) <= k:
            return {text}
        return {text[i:i + k] for i in range(len(text) - k + 1)}
    raise ValueError(f"unit must be 'word' or 'char', got {unit!r}")


def shingle_hashes(items: Iterable[str | bytes]) -> np.ndarray:
    """32-bit hashes of shingles (the first four bytes of SHA-1, little-endian), (n,) uint64."""
    out = []
    for s in items:
        data = s.encode("utf-8") if isinstance(s, str) else s
        if not isinstance(data, bytes):
            raise TypeError(f"shingles must be str or bytes, got {type(s).__name__}")
        out.append(int.from_bytes(hashlib.sha1(data).digest()[:4], "little"))
    return np.array(out, dtype=np.uint64)


def hash_family(num_perm: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The parameters (a, b) of ``num_perm`` hash functions x -> (a x + b) mod (2^31 − 1),
    each of shape (num_perm,), uint64, drawn from ``numpy.random.default_rng(seed)``."""
    num_perm = check_positive_int("num_perm", num_perm)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    rng = np.random.default_rng(int(seed))
    a = rng.integers(1, MERSENNE_31, size=num_perm, dtype=np.uint64)
    b = rng.integers(0, MERSENNE_31, size=num_perm, dtype=np.uint64)
    return a, b


def _check_family(family: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not (isinstance(family, tuple) and len(family) == 2):
        raise TypeError("family must be the pair (a, b) that hash_family returns")
    a, b = (np.asarray(v) for v in family)
    if a.shape != b.shape or a.ndim != 1 or a.dtype != np.uint64 or b.dtype != np.uint64:
        raise ValueError(f"family must be two uint64 vectors of one length, got shapes "
                         f"{a.shape} and {b.shape}, dtypes {a.dtype} and {b.dtype}")
    if a.size and (int(a.min()) < 1 or int(a.max()) >= MERSENNE_31 or int(b.max()) >= MERSENNE_31):
        raise ValueError("family: a must lie in [1, 2^31 − 1) and b in [0, 2^31 − 1)")
    return a, b


def minhash_signature(hashes: np.ndarray, family: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The MinHash signature of one document: for each function i, min over its shingle
    hashes x of (a_i x + b_i) mod (2^31 − 1). ``hashes`` (n,) from :func:`shingle_hashes`;
    returns (k,) uint64. An empty document has no minimum: ``ValueError``."""
    a, b = _check_family(family)
    x = np.asarray(hashes)
    if x.ndim != 1 or x.dtype != np.uint64:
        raise ValueError(f"hashes must be a 1-d uint64 array, got shape {x.shape}, dtype {x.dtype}")
    if x.size == 0:
        raise ValueError("hashes is empty: a document with no shingles has no signature")
    x = x % np.uint64(MERSENNE_31)  # < 2^31, so a * x < 2^62: exact in uint64
    return ((a[:, None] * x[None, :] + b[:, None]) % np.uint64(MERSENNE_31)).min(axis=1)


def minhash_signatures(documents: Sequence[Iterable[str | bytes]],
                       family: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Signatures of a corpus: one row per document's shingle set, (N, k) uint64."""
    rows = [minhash_signature(shingle_hashes(doc), family) for doc in documents]
    if not rows:
        raise ValueError("documents is empty: need at least one document")
    return np.stack(rows)


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b| of two sets (two empty sets: 1.0, as identical)."""
    if not isinstance(a, set | frozenset) or not isinstance(b, set | frozenset):
        raise TypeError(f"jaccard takes two sets, got {type(a).__name__} and {type(b).__name__}")
    union = len(a | b)
    return 1.0 if union == 0 else len(a & b) / union


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """The MinHash estimate of J: the share of positions where two signatures agree."""
    sig_a, sig_b = np.asarray(sig_a), np.asarray(sig_b)
    if sig_a.ndim != 1 or sig_a.shape != sig_b.shape or sig_a.size == 0:
        raise ValueError(f"signatures must be non-empty 1-d arrays of one length, got shapes "
                         f"{sig_a.shape} and {sig_b.shape}")
    return float(np.mean(sig_a == sig_b))


def _check_bands(bands: int, rows: int) -> tuple[int, int]:
    return check_positive_int("bands", bands), check_positive_int("rows", rows)


def band_collision_probability(s: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """P[two documents of Jaccard similarity s share at least one whole band] = 1 − (1 − s^r)^b."""
    bands, rows = _check_bands(bands, rows)
    s_arr = np.asarray(s, dtype=float)
    if np.isnan(s_arr).any() or (s_arr < 0).any() or (s_arr > 1).any():
        raise ValueError(f"s must lie in [0, 1], got {s}")
    p = 1.0 - (1.0 - s_arr**rows) ** bands
    return float(p) if np.ndim(s) == 0 else p


def band_threshold(bands: int, rows: int) -> float:
    """(1/b)^(1/r): the similarity near which the banding S-curve is steepest (its usual
    approximation; the exact inflection point is ((r − 1)/(b r − 1))^(1/r))."""
    bands, rows = _check_bands(bands, rows)
    return (1.0 / bands) ** (1.0 / rows)


def lsh_candidates(signatures: np.ndarray, bands: int, rows: int) -> set[tuple[int, int]]:
    """The candidate pairs (i, j), i < j, whose signatures agree on every row of at least
    one band. ``signatures`` (N, k) with k = ``bands`` × ``rows`` (the first b·r columns
    are used if k is larger, as band i takes columns i·r to (i + 1)·r − 1)."""
    bands, rows = _check_bands(bands, rows)
    sig = np.asarray(signatures)
    if sig.ndim != 2 or sig.dtype.kind not in "iu":
        raise ValueError(f"signatures must be an (N, k) integer array, got shape {sig.shape}, "
                         f"dtype {sig.dtype}")
    if sig.shape[1] < bands * rows:
        raise ValueError(f"signatures have k = {sig.shape[1]} columns, fewer than bands × rows "
                         f"= {bands} × {rows}")
    pairs: set[tuple[int, int]] = set()
    for band in range(bands):
        buckets: dict[bytes, list[int]] = defaultdict(list)
        block = np.ascontiguousarray(sig[:, band * rows:(band + 1) * rows])
        for i in range(sig.shape[0]):
            buckets[block[i].tobytes()].append(i)
        for members in buckets.values():
            pairs.update((members[x], members[y]) for x in range(len(members))
                         for y in range(x + 1, len(members)))
    return pairs
