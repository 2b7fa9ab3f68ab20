"""Duplicate detection: exact fingerprints, shingles, MinHash signatures and LSH banding.

Introduced in notebooks/10c_data. *Exact* duplicates are found by hashing a normalised
document (:func:`normalise_document`: Unicode NFKC, case folding, punctuation removed,
whitespace collapsed) and grouping equal fingerprints. *Near* duplicates: two documents
are compared as sets of *shingles* (their overlapping k-grams), by their Jaccard
similarity J(A, B) = |A ∩ B| / |A ∪ B|. MinHash (Broder, 1997) keeps, for each
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

Candidate pairs become clusters (:func:`duplicate_clusters`, union-find), of which
deduplication keeps one document each. To measure all this against a known truth,
:func:`make_duplicate_corpus` plants exact, trivially changed and word-edited copies among
distinct documents cut from a text (:func:`cut_documents`).

Shapes: a corpus of N documents gives signatures of shape (N, k), ``uint64``.
"""

from __future__ import annotations

import hashlib
import itertools
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from llmbook.validation import check_positive_int

__all__ = [
    "MERSENNE_31",
    "DuplicateCorpus",
    "band_collision_probability",
    "band_inflection",
    "band_threshold",
    "cut_documents",
    "document_fingerprint",
    "duplicate_clusters",
    "edit_words",
    "estimate_jaccard",
    "exact_duplicate_groups",
    "exact_minhash_agreement",
    "make_duplicate_corpus",
    "normalise_document",
    "pair_counts",
    "trivial_variant",
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

# ---------------------------------------------------------------- exact duplicates


def normalise_document(text: str) -> str:
    """The form in which two documents count as *the same*: Unicode NFKC (compatibility
    forms such as full-width letters and ligatures become their plain letters), case folded
    (``str.casefold``: ``"Straße"`` and ``"STRASSE"`` agree), every punctuation character
    (Unicode category P*) removed, and every run of whitespace made one space, with none at
    the ends. NFKC is applied again after folding, since folding can undo a composition."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    kept = "".join(ch for ch in folded if not unicodedata.category(ch).startswith("P"))
    return " ".join(unicodedata.normalize("NFKC", kept).split())


def document_fingerprint(text: str, normalise: bool = True) -> str:
    """The SHA-256 (hex) of a document's UTF-8 bytes, after :func:`normalise_document`
    unless ``normalise`` is False: equal fingerprints mean equal (normalised) documents,
    up to a hash collision (probability about n^2 / 2^257 for n documents)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return hashlib.sha256((normalise_document(text) if normalise else text).encode()).hexdigest()


def exact_duplicate_groups(texts: Sequence[str], normalise: bool = True) -> list[list[int]]:
    """The groups (two or more indices, increasing) of documents with one fingerprint, in the
    order of their first member. Exact deduplication keeps each group's first member."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a sequence of str, got {type(texts).__name__}")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(texts):
        groups[document_fingerprint(t, normalise)].append(i)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])



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


def exact_minhash_agreement(a: set, b: set) -> Fraction:
    """P[min π(A) = min π(B)] over *all* orderings π of A ∪ B, counted exhaustively: the
    ideal min-wise hash that MinHash imitates (Broder, 1997). Equals J(A, B) exactly; the
    union may hold at most 8 elements (8! = 40320 orderings)."""
    if not isinstance(a, set | frozenset) or not isinstance(b, set | frozenset):
        raise TypeError(f"a and b must be sets, got {type(a).__name__} and {type(b).__name__}")
    union = sorted(a | b, key=repr)
    if not 1 <= len(union) <= 8:
        raise ValueError(f"a ∪ b must hold 1 to 8 elements, got {len(union)}")
    agree = total = 0
    for order in itertools.permutations(union):
        first = order[0]  # the element of A ∪ B with the smallest hash
        agree += (first in a) == (first in b)  # both minima are it, or one set lacks it
        total += 1
    return Fraction(agree, total)


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


def band_inflection(bands: int, rows: int) -> float:
    """The similarity where 1 − (1 − s^r)^b is steepest: s* = ((r − 1)/(b r − 1))^(1/r),
    from setting its second derivative to zero (derived in SymPy in notebooks/10c_data).
    ``rows = 1`` gives 0 (the curve 1 − (1 − s)^b is concave)."""
    bands, rows = _check_bands(bands, rows)
    return ((rows - 1) / (bands * rows - 1)) ** (1.0 / rows) if bands * rows > 1 else 0.0


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


def duplicate_clusters(num_documents: int, pairs: Iterable[tuple[int, int]]) -> list[list[int]]:
    """The connected components (two or more documents, indices increasing, ordered by their
    first member) of the graph whose edges are ``pairs``: duplicates of duplicates are
    duplicates. Deduplication keeps the first member of each cluster."""
    n = check_positive_int("num_documents", num_documents)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    for i, j in pairs:
        if not (0 <= i < n and 0 <= j < n):
            raise ValueError(f"pairs: ({i}, {j}) is outside the documents 0..{n - 1}")
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    members: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        members[root(i)].append(i)
    return sorted((m for m in members.values() if len(m) > 1), key=lambda m: m[0])


def pair_counts(found: set[tuple[int, int]], truth: set[tuple[int, int]]) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives) of the pairs ``found`` against the
    pairs ``truth`` (both as (i, j) with i < j). Precision is tp / (tp + fp), recall
    tp / (tp + fn)."""
    for name, pairs in (("found", found), ("truth", truth)):
        if not isinstance(pairs, set | frozenset):
            raise TypeError(f"{name} must be a set of (i, j) pairs, got {type(pairs).__name__}")
        if any(not (isinstance(p, tuple) and len(p) == 2 and p[0] < p[1]) for p in pairs):
            raise ValueError(f"{name} must hold pairs (i, j) with i < j")
    tp = len(found & truth)
    return tp, len(found) - tp, len(truth) - tp


# ---------------------------------------------------------------- a corpus with known duplicates


def cut_documents(text: str, words_per_document: int, max_overlap: float = 0.2,
                  k: int = 5) -> list[str]:
    """``text`` cut into consecutive documents of ``words_per_document`` words (the last,
    shorter piece dropped), keeping only documents whose ``k``-word shingles share a
    Jaccard similarity of at most ``max_overlap`` with every document kept before them: a
    real corpus repeats itself (docstrings copied between classes), and these documents are
    to be the *distinct* originals of a corpus whose duplicates we plant ourselves."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    n = check_positive_int("words_per_document", words_per_document)
    if not 0 <= max_overlap <= 1:
        raise ValueError(f"max_overlap must lie in [0, 1], got {max_overlap}")
    words = text.split()
    kept: list[str] = []
    sets: list[set[str]] = []
    index: dict[str, list[int]] = defaultdict(list)  # shingle -> kept documents holding it
    for start in range(0, len(words) - n + 1, n):
        doc = " ".join(words[start:start + n])
        sh = shingles(normalise_document(doc), k)
        shared: dict[int, int] = defaultdict(int)
        for s in sh:
            for j in index[s]:
                shared[j] += 1
        if all(c / len(sh | sets[j]) <= max_overlap for j, c in shared.items()):
            for s in sh:
                index[s].append(len(kept))
            kept.append(doc)
            sets.append(sh)
    return kept


def edit_words(words: Sequence[str], rate: float, rng: np.random.Generator,
               vocabulary: Sequence[str]) -> list[str]:
    """A copy of ``words`` in which each word, with probability ``rate``, undergoes one edit
    chosen uniformly from: replaced by a word of ``vocabulary``, deleted, or followed by an
    inserted word of ``vocabulary``. ``rate = 0`` returns the words unchanged."""
    if not 0 <= rate <= 1:
        raise ValueError(f"rate must lie in [0, 1], got {rate}")
    if not vocabulary:
        raise ValueError("vocabulary is empty: edits need words to substitute and insert")
    out: list[str] = []
    edit = rng.random(len(words)) < rate  # (n,) which words are edited
    kind = rng.integers(0, 3, size=len(words))  # 0 substitute, 1 delete, 2 insert after
    pick = rng.integers(0, len(vocabulary), size=len(words))
    for w, e, kd, p in zip(words, edit, kind, pick, strict=True):
        if not e:
            out.append(w)
        elif kd == 0:
            out.append(vocabulary[p])
        elif kd == 2:
            out += [w, vocabulary[p]]
    return out


_FULL_WIDTH = {c: chr(ord(c) + 0xFEE0) for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"}


def trivial_variant(text: str, rng: np.random.Generator) -> str:
    """``text`` changed only in ways :func:`normalise_document` undoes: its case (upper,
    lower or title), its whitespace (some spaces doubled or made line breaks, a trailing
    space), its punctuation (some commas and full stops dropped or added after a word) and
    a few letters in their full-width compatibility forms (``"Ａ"`` for ``"A"``)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = (str.upper, str.lower, str.title)[int(rng.integers(0, 3))](text)
    words = []
    for w in text.split():
        u = rng.random()
        if u < 0.05:
            w = w.rstrip(".,")  # drop punctuation
        elif u < 0.10:
            w += ","  # add punctuation
        if rng.random() < 0.05:
            w = "".join(_FULL_WIDTH.get(c, c) for c in w)
        words.append(w)
    seps = rng.choice(np.array([" ", "  ", "\n"]), size=max(len(words) - 1, 0), p=[0.9, 0.05, 0.05])
    out = words[0] if words else ""
    for sep, w in zip(seps, words[1:], strict=True):
        out += str(sep) + w
    return out + " "


@dataclass(frozen=True)
class DuplicateCorpus:
    """Documents with known duplicates: ``texts[i]`` is a copy of ``texts[source[i]]`` (an
    original has ``source[i] == i``), made as ``kind[i]`` (``"original"``, ``"exact"``,
    ``"trivial"`` or ``"near"``) at the word edit rate ``edit_rate[i]`` (0 except for near)."""

    texts: list[str]
    source: list[int]
    kind: list[str]
    edit_rate: list[float]

    def true_pairs(self, kinds: Iterable[str] | None = None) -> set[tuple[int, int]]:
        """The pairs (original, copy) whose copy is of one of ``kinds`` (default: all)."""
        wanted = {"exact", "trivial", "near"} if kinds is None else set(kinds)
        return {(s, i) for i, (s, k) in enumerate(zip(self.source, self.kind, strict=True))
                if k in wanted and s != i}


def make_duplicate_corpus(originals: Sequence[str], edit_rates: Sequence[float],
                          copies_per_rate: int, num_exact: int, num_trivial: int,
                          seed: int = 0) -> DuplicateCorpus:
    """``originals`` followed by planted copies, each of a different original (drawn without
    replacement with ``numpy.random.default_rng(seed)``): ``num_exact`` verbatim copies,
    ``num_trivial`` :func:`trivial_variant` copies, and ``copies_per_rate`` near copies made
    by :func:`edit_words` at each rate of ``edit_rates`` (words drawn from the originals'
    own vocabulary; a near copy is redrawn until it differs from its original after
    normalisation). The copies come in a shuffled order, so position gives nothing away."""
    if isinstance(originals, str) or not originals or not all(isinstance(t, str) for t in originals):
        raise TypeError("originals must be a non-empty sequence of str")
    copies_per_rate = check_positive_int("copies_per_rate", copies_per_rate)
    for name, v in (("num_exact", num_exact), ("num_trivial", num_trivial)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    if any(not 0 <= r <= 1 for r in edit_rates):
        raise ValueError(f"edit_rates must lie in [0, 1], got {list(edit_rates)}")
    n0 = len(originals)
    plan = ([("exact", 0.0)] * num_exact + [("trivial", 0.0)] * num_trivial
            + [("near", float(r)) for r in edit_rates for _ in range(copies_per_rate)])
    if len(plan) > n0:
        raise ValueError(f"{len(plan)} copies of distinct originals need at least that many "
                         f"originals, got {n0}")
    rng = np.random.default_rng(seed)
    vocabulary = sorted({w for t in originals for w in t.split()})
    sources = rng.choice(n0, size=len(plan), replace=False)
    order = rng.permutation(len(plan))
    texts, source = list(originals), list(range(n0))
    kind, rate = ["original"] * n0, [0.0] * n0
    for i in order:
        (kd, r), s = plan[i], int(sources[i])
        if kd == "exact":
            texts.append(originals[s])
        elif kd == "trivial":
            texts.append(trivial_variant(originals[s], rng))
        else:  # redrawn until it differs after normalisation (at rate 0.02, 200 words are
            # left unedited with probability 0.98^200 = 1.8 %): a near copy is not exact
            copy = originals[s]
            while r > 0 and normalise_document(copy) == normalise_document(originals[s]):
                copy = " ".join(edit_words(originals[s].split(), r, rng, vocabulary))
            texts.append(copy)
        source.append(s)
        kind.append(kd)
        rate.append(r)
    return DuplicateCorpus(texts, source, kind, rate)
