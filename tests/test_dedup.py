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
    band_inflection,
    band_threshold,
    cut_documents,
    document_fingerprint,
    duplicate_clusters,
    edit_words,
    estimate_jaccard,
    exact_duplicate_groups,
    exact_minhash_agreement,
    hash_family,
    jaccard,
    lsh_candidates,
    make_duplicate_corpus,
    minhash_signature,
    minhash_signatures,
    normalise_document,
    pair_counts,
    shingle_hashes,
    shingles,
    trivial_variant,
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


def test_normalisation_worked_examples():
    assert normalise_document("  Hello,\tWORLD!\n\n  It's  me. ") == "hello world its me"
    assert normalise_document("Ｆｕｌｌ－ｗｉｄｔｈ ﬁle") == "fullwidth file"  # NFKC: forms and ligature
    assert normalise_document("Straße") == normalise_document("STRASSE") == "strasse"
    assert normalise_document("Cafe\u0301") == normalise_document("Café") == "café"  # composed
    assert normalise_document("...") == ""
    assert normalise_document("x + y = 2") == "x + y = 2"  # symbols (category S) stay


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_normalisation_is_idempotent_and_has_no_punctuation_or_stray_space(text):
    once = normalise_document(text)
    assert normalise_document(once) == once
    assert once == once.strip() and "  " not in once
    assert not any(c in once for c in ".,;:!?'\"()[]{}-")


def test_exact_groups_with_and_without_normalisation():
    texts = ["The cat sat.", "the  CAT sat", "A dog.", "The cat sat.", "a dog", "Another."]
    assert exact_duplicate_groups(texts) == [[0, 1, 3], [2, 4]]
    assert exact_duplicate_groups(texts, normalise=False) == [[0, 3]]
    assert document_fingerprint("The cat sat.") == document_fingerprint("the cat sat")
    assert document_fingerprint("The cat sat.", normalise=False) != document_fingerprint("the cat sat")
    import hashlib
    assert document_fingerprint("a b") == hashlib.sha256(b"a b").hexdigest()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_trivial_variants_normalise_to_the_original(seed):
    doc = " ".join(load_stdlib_docs(20_000).split()[seed % 500:seed % 500 + 60])
    variant = trivial_variant(doc, np.random.default_rng(seed))
    assert normalise_document(variant) == normalise_document(doc)


def test_a_trivial_variant_is_not_byte_identical():
    doc = "The quick brown fox jumps over the lazy dog, twice."
    variants = {trivial_variant(doc, np.random.default_rng(s)) for s in range(20)}
    assert doc not in variants and len(variants) == 20


def test_minhash_agreement_counted_over_every_ordering_is_jaccard():
    from fractions import Fraction
    cases = [({1, 2, 3}, {2, 3, 4, 5}), ({"a"}, {"a"}), ({1, 2}, {3, 4}), (set(range(6)), {0, 9})]
    for a, b in cases:
        union, inter = len(a | b), len(a & b)
        assert exact_minhash_agreement(a, b) == Fraction(inter, union)


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(0, 7)), st.sets(st.integers(0, 7)))
def test_minhash_agreement_property(a, b):
    from fractions import Fraction
    if a | b:
        assert exact_minhash_agreement(a, b) == Fraction(len(a & b), len(a | b))


def test_inflection_is_where_the_second_derivative_vanishes():
    for bands, rows in ((20, 5), (32, 4), (16, 8), (7, 3)):
        s = band_inflection(bands, rows)
        h = 1e-4
        second = [(band_collision_probability(x + h, bands, rows) - 2 * band_collision_probability(x, bands, rows)
                   + band_collision_probability(x - h, bands, rows)) / h**2 for x in (s - 0.01, s + 0.01)]
        assert second[0] > 0 > second[1]  # convex below, concave above
        assert abs(s - band_threshold(bands, rows)) < 0.06
    assert band_inflection(5, 1) == 0.0 and band_inflection(1, 1) == 0.0


def test_duplicate_clusters_are_connected_components():
    assert duplicate_clusters(7, [(0, 3), (3, 5), (1, 6)]) == [[0, 3, 5], [1, 6]]
    assert duplicate_clusters(3, []) == []
    assert duplicate_clusters(4, [(2, 3), (3, 2), (0, 0)]) == [[2, 3]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=15))
def test_clusters_against_brute_force_closure(pairs):
    n = 12
    reach = np.eye(n, dtype=bool)
    for i, j in pairs:
        reach[i, j] = reach[j, i] = True
    for m in range(n):  # Floyd–Warshall closure
        reach |= reach[:, [m]] & reach[[m], :]
    clusters = duplicate_clusters(n, pairs)
    for c in clusters:
        assert all(reach[c[0], j] for j in c) and len(c) >= 2
    expected = sorted({tuple(np.flatnonzero(reach[i]).tolist()) for i in range(n) if reach[i].sum() > 1})
    assert sorted(tuple(c) for c in clusters) == expected


def test_pair_counts():
    assert pair_counts({(0, 1), (2, 3), (4, 5)}, {(0, 1), (1, 2)}) == (1, 2, 1)
    assert pair_counts(set(), {(0, 1)}) == (0, 0, 1)


def test_edit_words_rates():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20_000)]
    assert edit_words(words, 0.0, rng, ["x"]) == words
    out = edit_words(words, 0.3, rng, ["x"])
    kept = sum(w != "x" for w in out)
    # each word survives unless substituted or deleted: 1 - 0.3 * 2/3 = 0.8 of them
    assert abs(kept / len(words) - 0.8) < 4 * math.sqrt(0.8 * 0.2 / len(words))
    # insertions and deletions balance: the expected length is unchanged
    assert abs(len(out) / len(words) - 1) < 4 * math.sqrt(0.2 / len(words))
    survivors = set(out)
    assert [w for w in out if w != "x"] == [w for w in words if w in survivors]  # order kept


def test_cut_documents_keeps_distinct_documents():
    text = load_stdlib_docs(200_000)
    docs = cut_documents(text, 120, max_overlap=0.2)
    assert all(len(d.split()) == 120 for d in docs)
    sets = [shingles(normalise_document(d), 5) for d in docs[:150]]
    assert max(jaccard(sets[i], sets[j]) for i in range(len(sets)) for j in range(i)) <= 0.2
    everything = cut_documents(text, 120, max_overlap=1.0)
    assert len(everything) == len(text.split()) // 120 > len(docs)
    assert cut_documents("a b c d e f", 2, 1.0) == ["a b", "c d", "e f"]


def test_duplicate_corpus_truth():
    originals = cut_documents(load_stdlib_docs(100_000), 100)[:60]
    corpus = make_duplicate_corpus(originals, [0.05, 0.2], copies_per_rate=5, num_exact=4,
                                   num_trivial=3, seed=1)
    n0 = len(originals)
    assert corpus.texts[:n0] == originals and len(corpus.texts) == n0 + 17
    assert sorted(corpus.kind[n0:]) == ["exact"] * 4 + ["near"] * 10 + ["trivial"] * 3
    truth = corpus.true_pairs()
    assert len(truth) == 17 and len({s for s, _ in truth}) == 17  # distinct originals
    for s, i in truth:
        if corpus.kind[i] == "exact":
            assert corpus.texts[i] == corpus.texts[s]
        elif corpus.kind[i] == "trivial":
            assert normalise_document(corpus.texts[i]) == normalise_document(corpus.texts[s])
        else:
            j = jaccard(shingles(corpus.texts[i]), shingles(corpus.texts[s]))
            assert (0.3 < j < 0.95) if corpus.edit_rate[i] == 0.05 else (j < 0.6)
    assert corpus.true_pairs(["exact"]) == {(s, i) for s, i in truth if corpus.kind[i] == "exact"}
    again = make_duplicate_corpus(originals, [0.05, 0.2], 5, 4, 3, seed=1)
    assert again == corpus
    # exact deduplication finds the exact and trivial copies, and only them
    found = {(g[0], j) for g in exact_duplicate_groups(corpus.texts) for j in g[1:]}
    assert found == corpus.true_pairs(["exact", "trivial"])


@pytest.mark.parametrize("call,error,match", [
    (lambda: normalise_document(b"x"), TypeError, "text must be a str"),
    (lambda: exact_duplicate_groups("abc"), TypeError, "texts must be a sequence"),
    (lambda: exact_minhash_agreement(set(range(9)), set()), ValueError, "1 to 8 elements"),
    (lambda: exact_minhash_agreement([1], {1}), TypeError, "must be sets"),
    (lambda: band_inflection(0, 2), ValueError, "bands"),
    (lambda: duplicate_clusters(3, [(0, 3)]), ValueError, "outside the documents"),
    (lambda: duplicate_clusters(0, []), ValueError, "num_documents"),
    (lambda: pair_counts([(0, 1)], set()), TypeError, "found must be a set"),
    (lambda: pair_counts({(1, 0)}, set()), ValueError, "i < j"),
    (lambda: edit_words(["a"], 1.5, np.random.default_rng(0), ["b"]), ValueError, "rate must lie"),
    (lambda: edit_words(["a"], 0.5, np.random.default_rng(0), []), ValueError, "vocabulary is empty"),
    (lambda: cut_documents("a b", 0), ValueError, "words_per_document"),
    (lambda: cut_documents("a b", 1, max_overlap=2), ValueError, "max_overlap"),
    (lambda: trivial_variant(3, np.random.default_rng(0)), TypeError, "text must be a str"),
    (lambda: make_duplicate_corpus(["a"], [0.1], 2, 0, 0), ValueError, "at least that many"),
    (lambda: make_duplicate_corpus("abc", [0.1], 1, 0, 0), TypeError, "originals"),
    (lambda: make_duplicate_corpus(["a", "b"], [1.2], 1, 0, 0), ValueError, "edit_rates"),
    (lambda: make_duplicate_corpus(["a", "b"], [0.1], 1, -1, 0), ValueError, "num_exact"),

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
