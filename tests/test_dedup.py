"""MinHash and LSH banding (llmbook.training.dedup), against exact sets and against datasketch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.corpus import load_stdlib_docs
from llmbook.training.dedup import (
    MERSENNE_31,
    band_collision_probability,
    band_threshold,
    estimate_jaccard,
    hash_family,
    jaccard,
    lsh_candidates,
    minhash_signature,
    minhash_signatures,
    shingle_hashes,
    shingles,
)

datasketch = pytest.importorskip("datasketch")


def _documents() -> list[set[str]]:
    """Paragraph-sized pieces of the shipped corpus, each with an edited copy beside it."""
    text = load_stdlib_docs(200_000)
    words = text.split()
    docs = []
    rng = np.random.default_rng(0)
    for start in range(0, 6000, 600):
        piece = words[start:start + 300]
        edited = list(piece)
        for i in rng.choice(len(edited), size=15, replace=False):  # 5 % of words replaced
            edited[i] = f"edit{i}"
        docs += [shingles(" ".join(piece), 3), shingles(" ".join(edited), 3)]
    return docs


DOCS = _documents()


def test_shingles_worked_example():
    assert shingles("The cat sat on the mat", 3) == {"the cat sat", "cat sat on", "sat on the",
                                                     "on the mat"}
    assert shingles("abcd", 3, unit="char") == {"abc", "bcd"}
    assert shingles("ab", 3, unit="char") == {"ab"}
    assert shingles("   ", 2) == set()
    assert jaccard({"a", "b", "c"}, {"b", "c", "d", "e"}) == 2 / 5
    assert jaccard(set(), set()) == 1.0


def test_the_hash_family_is_exact_in_uint64():
    a, b = hash_family(64, seed=3)
    assert a.dtype == np.uint64 and int(a.min()) >= 1 and int(a.max()) < MERSENNE_31
    x = shingle_hashes(["the cat sat", "on the mat"])
    sig = minhash_signature(x, (a, b))
    expected = [min((int(ai) * (int(xj) % MERSENNE_31) + int(bi)) % MERSENNE_31 for xj in x)
                for ai, bi in zip(a, b, strict=True)]  # Python's big integers: no overflow
    assert sig.tolist() == expected


def test_the_estimate_is_unbiased_with_variance_j_one_minus_j_over_k():
    """Across 400 independent families, the mean estimate is J and its variance J(1-J)/k."""
    a_set, b_set = DOCS[0], DOCS[1]
    j = jaccard(a_set, b_set)
    k = 64
    ha, hb = shingle_hashes(sorted(a_set)), shingle_hashes(sorted(b_set))
    est = np.array([estimate_jaccard(minhash_signature(ha, f), minhash_signature(hb, f))
                    for f in (hash_family(k, seed=s) for s in range(400))])
    var = j * (1 - j) / k
    assert abs(est.mean() - j) < 4 * math.sqrt(var / len(est))
    assert 0.8 * var < est.var(ddof=1) < 1.25 * var  # chi-square with 399 d.o.f.: +-20 % is 4 sd


def test_estimates_agree_with_datasketch_within_the_standard_error():
    k = 256
    family = hash_family(k, seed=1)
    for a_set, b_set in zip(DOCS[::2], DOCS[1::2], strict=True):
        j = jaccard(a_set, b_set)
        se = math.sqrt(j * (1 - j) / k)
        ours = estimate_jaccard(minhash_signature(shingle_hashes(a_set), family),
                                minhash_signature(shingle_hashes(b_set), family))
        ma, mb = datasketch.MinHash(num_perm=k, seed=1), datasketch.MinHash(num_perm=k, seed=1)
        ma.update_batch([s.encode() for s in a_set])
        mb.update_batch([s.encode() for s in b_set])
        theirs = ma.jaccard(mb)
        assert abs(ours - j) < 4 * se and abs(theirs - j) < 4 * se
        assert abs(ours - theirs) < 4 * math.sqrt(2) * se


def test_banding_finds_the_candidates_datasketch_finds_on_the_same_signatures():
    bands, rows = 32, 4  # threshold (1/32)^(1/4) = 0.42; the edited copies have J near 0.75
    sketches = []
    for doc in DOCS:
        m = datasketch.MinHash(num_perm=bands * rows, seed=7)
        m.update_batch([s.encode() for s in doc])
        sketches.append(m)
    lsh = datasketch.MinHashLSH(num_perm=bands * rows, params=(bands, rows))
    for i, m in enumerate(sketches):
        lsh.insert(i, m)
    theirs = {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if i != j}
    ours = lsh_candidates(np.stack([m.hashvalues for m in sketches]), bands, rows)
    assert ours == theirs
    copies = {(i, i + 1) for i in range(0, len(DOCS), 2)}
    assert min(jaccard(DOCS[i], DOCS[j]) for i, j in copies) > 0.7  # P(found) > 0.99999 each
    assert copies <= ours  # every edited copy is found


def test_banding_on_our_signatures_matches_the_definition():
    bands, rows = 8, 4
    sig = minhash_signatures([sorted(d) for d in DOCS], hash_family(bands * rows, seed=2))
    brute = {(i, j) for i in range(len(DOCS)) for j in range(i + 1, len(DOCS))
             if any((sig[i, r * rows:(r + 1) * rows] == sig[j, r * rows:(r + 1) * rows]).all()
                    for r in range(bands))}
    assert lsh_candidates(sig, bands, rows) == brute


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(1, 40), st.integers(1, 12))
def test_the_banding_curve_against_simulated_bands(s, bands, rows):
    """Rows agree independently with probability s; a band needs all r rows; any band will do."""
    rng = np.random.default_rng(0)
    agree = rng.random((4000, bands, rows)) < s
    measured = agree.all(axis=2).any(axis=1).mean()
    p = band_collision_probability(s, bands, rows)
    assert abs(measured - p) < 4 * math.sqrt(max(p * (1 - p), 1e-4) / 4000) + 1e-3


def test_the_threshold_sits_on_the_steep_part_of_the_curve():
    bands, rows = 20, 5
    t = band_threshold(bands, rows)
    assert t == pytest.approx(20 ** -0.2)
    assert band_collision_probability(t, bands, rows) == pytest.approx(1 - (1 - 1 / 20) ** 20)
    grid = np.linspace(0, 1, 2001)
    slope = np.gradient(band_collision_probability(grid, bands, rows), grid)
    inflection = ((rows - 1) / (bands * rows - 1)) ** (1 / rows)
    assert grid[slope.argmax()] == pytest.approx(inflection, abs=1e-3)
    assert abs(inflection - t) < 0.05


@pytest.mark.parametrize("call,error,match", [
    (lambda: shingles(3), TypeError, "text must be a str"),
    (lambda: shingles("a b", 0), ValueError, "k"),
    (lambda: shingles("a b", 2, unit="line"), ValueError, "unit must be 'word' or 'char'"),
    (lambda: shingle_hashes([3]), TypeError, "shingles must be str or bytes"),
    (lambda: hash_family(0), ValueError, "num_perm"),
    (lambda: minhash_signature(np.array([], dtype=np.uint64), hash_family(4)), ValueError,
     "hashes is empty"),
    (lambda: minhash_signature(np.array([1.5]), hash_family(4)), ValueError, "uint64"),
    (lambda: minhash_signature(np.array([1], dtype=np.uint64), (1, 2)), ValueError, "uint64"),
    (lambda: minhash_signatures([], hash_family(4)), ValueError, "documents is empty"),
    (lambda: jaccard([1], {1}), TypeError, "two sets"),
    (lambda: estimate_jaccard(np.zeros(3), np.zeros(4)), ValueError, "one length"),
    (lambda: band_collision_probability(1.5, 2, 2), ValueError, r"s must lie in \[0, 1\]"),
    (lambda: band_collision_probability(float("nan"), 2, 2), ValueError, "s must lie"),
    (lambda: lsh_candidates(np.zeros((3, 5), dtype=np.uint64), 2, 3), ValueError,
     "fewer than bands"),
    (lambda: lsh_candidates(np.zeros((3, 6)), 2, 3), ValueError, "integer array"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
