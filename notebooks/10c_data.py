# %% [markdown]
# # 10c Data: duplicates and quality
#
# A language model learns what its data holds, including the same page copied a thousand
# times and the cookie notice at the bottom of every page. Before training, a pre-training
# corpus is therefore *deduplicated* and *filtered*. Both steps are cheap next to training,
# and both are mathematics one can check:
#
# 1. **Exact duplicates**: a document's fingerprint is a hash of its normalised text; equal
#    fingerprints mean equal documents. What "normalised" means is a choice, and we state it.
# 2. **MinHash**: two documents are compared as sets of shingles, by their Jaccard
#    similarity $J$. We prove in SymPy that a random hash's minima agree with probability
#    exactly $J$, and that the estimator from $k$ hashes has variance $J(1-J)/k$, and
#    check both against `datasketch`.
# 3. **LSH banding**: finding similar pairs among $N$ documents without comparing all
#    $N^2/2$ of them. The probability that a pair becomes a candidate is
#    $1 - (1 - s^r)^b$; we derive where this S-curve is steepest and how good the usual
#    approximation $(1/b)^{1/r}$ is.
# 4. **A corpus with planted duplicates**, cut from the book's standard-library text: exact
#    copies, copies changed only in case and spacing, and copies edited at known rates. We
#    measure the precision and recall of exact and MinHash deduplication against the truth.
# 5. **Quality filters**: Gopher's heuristic rules and a perplexity filter built on the
#    book's n-gram model, run on clean text and on five kinds of junk.
#
# Mixing the filtered sources into one training stream is chapter 10d's subject. The code
# is in `llmbook.training.dedup` and `llmbook.training.quality`.

# %%
import math
from fractions import Fraction

import datasketch
import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
from IPython.display import display
from scipy.special import chdtri
from sympy.stats import Bernoulli, E, variance

from llmbook.nbtools import Checks, Formula, save_figure, show_source
from llmbook.text.corpus import load_stdlib_docs
from llmbook.training.dedup import (
    band_collision_probability,
    band_inflection,
    band_threshold,
    cut_documents,
    document_fingerprint,
    duplicate_clusters,
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
)
from llmbook.training.quality import (
    GOPHER_THRESHOLDS,
    JUNK_KINDS,
    PerplexityFilter,
    gopher_failures,
    load_prose_documents,
    make_junk_document,
    quality_statistics,
)

# %% [markdown]
# ## 10c.1 Exact duplicates
#
# Two files that differ only in a trailing space, in upper case or in a full-width "Ａ" are
# the same document for a language model's purposes, yet their bytes differ. So we hash a
# *normalised* form. The book's normalisation, in this order:
#
# * **Unicode NFKC**: compatibility characters become their plain forms (full-width
#   letters, the ligature "ﬁ", superscripts), and accents are composed, so that "é" typed
#   as one character or as "e" plus a combining accent agree;
# * **case folding** (`str.casefold`, stronger than lower-casing: "Straße" and "STRASSE"
#   agree), then NFKC again, since folding can break a composition;
# * **punctuation removed**: every character of Unicode category P (full stops, commas,
#   quotes, dashes, brackets); symbols such as `+` and `=` (category S) stay;
# * **whitespace collapsed**: every run of spaces, tabs and line breaks becomes one space,
#   none at the ends.
#
# Each choice merges more: removing punctuation makes "its" and "it's" one word, which is
# harmless for finding copies but would be wrong as a tokenizer's input. The fingerprint
# is the SHA-256 of the normalised text's UTF-8 bytes.

# %%
show_source(normalise_document)

# %%
examples = ["  Hello,\tWORLD!\n\n  It's  me. ", "Ｆｕｌｌ－ｗｉｄｔｈ ﬁle", "Straße",
            "Cafe\u0301 au lait", "x + y = 2 (a formula)"]
for text in examples:
    print(f"{text!r:36} -> {normalise_document(text)!r}")
checks = Checks("normalisation")
checks.equal("case, spacing and punctuation", "hello world its me", normalise_document(examples[0]))
checks.equal("NFKC: full width and ligature", "fullwidth file", normalise_document(examples[1]))
checks.equal("case folding: ß = ss", normalise_document("STRASSE"), normalise_document(examples[2]))
checks.equal("NFKC composes e + accent", "café au lait", normalise_document(examples[3]))
checks.equal("idempotent on every example", [normalise_document(t) for t in examples],
             [normalise_document(normalise_document(t)) for t in examples])
checks

# %% [markdown]
# Grouping equal fingerprints takes one pass and a dictionary: $O(N)$ for $N$ documents,
# against $O(N^2)$ comparisons. Exact deduplication keeps each group's first member.

# %%
show_source(exact_duplicate_groups)

# %%
texts = ["The cat sat.", "the  CAT sat", "A dog.", "The cat sat.", "a dog", "Another."]
print("fingerprint of", repr(texts[0]), document_fingerprint(texts[0])[:16], "...")
checks = Checks("exact groups")
checks.equal("normalised: groups", [[0, 1, 3], [2, 4]], exact_duplicate_groups(texts))
checks.equal("raw bytes: groups", [[0, 3]], exact_duplicate_groups(texts, normalise=False))
checks

# %% [markdown]
# ## 10c.2 MinHash: the probability that two minima agree is the Jaccard similarity
#
# Near duplicates (a page with a changed date, a lightly edited copy) hash differently.
# Broder (1997) compares documents as sets $A, B$ of *shingles*, their overlapping runs of
# $w$ words (here $w = 5$, on normalised text), by the Jaccard similarity
#
# $$J(A, B) = \frac{|A \cap B|}{|A \cup B|}.$$
#
# Take a random ordering $\pi$ of all possible shingles and keep, for each document, its
# smallest shingle under $\pi$. **Claim:** $P[\min \pi(A) = \min \pi(B)] = J(A, B)$.
#
# **Counting argument.** Only the order of the $u = |A \cup B|$ shingles of the union
# matters, and each of its $u!$ orders is equally likely. The smallest element of the
# union is the smallest of $A$ or of $B$ or of both; the two minima agree exactly when it
# lies in $A \cap B$ (if it lies in $A$ only, $B$'s minimum is something else). The
# orders whose first element is one of the $m = |A \cap B|$ shared shingles number
# $m\,(u-1)!$: pick that element, order the rest. So the probability is
# $m\,(u-1)!/u!$, and SymPy simplifies it:

# %%
m, u = sp.symbols("m u", positive=True, integer=True)
p_agree = m * sp.factorial(u - 1) / sp.factorial(u)
display(sp.Eq(sp.Symbol("P_agree"), p_agree, evaluate=False), sp.Eq(sp.Symbol("P_agree"),
        sp.simplify(sp.combsimp(p_agree))))
checks = Checks("P[minima agree] = J")
checks.equal("m (u-1)!/u! simplifies to m/u", 0, sp.simplify(sp.combsimp(p_agree) - m / u))
for a_set, b_set in (({1, 2, 3}, {2, 3, 4, 5}), ({1, 2}, {3, 4}), (set(range(6)), {0, 6})):
    checks.equal(f"all {len(a_set | b_set)}! orders of {sorted(a_set)}, {sorted(b_set)}",
                 str(Fraction(len(a_set & b_set), len(a_set | b_set))),
                 str(exact_minhash_agreement(a_set, b_set)))
checks

# %% [markdown]
# (`exact_minhash_agreement` enumerates every order of the union: the ideal that hash
# functions imitate.)
#
# **The estimator.** A signature keeps the minima of $k$ independent hash functions. Each
# position agrees with probability $J$, independently, so the share of agreeing positions,
# $\hat J = \frac1k \sum_{i=1}^k X_i$ with $X_i \sim \text{Bernoulli}(J)$, is unbiased
# with variance $k \cdot \mathrm{Var}(X_1)/k^2$. SymPy's statistics module computes the
# Bernoulli moments, and the variance of a mean of three for a concrete check:

# %%
J, k = sp.symbols("J k", positive=True)
X = [Bernoulli(f"X{i}", J) for i in range(3)]
var_one = sp.factor(variance(X[0]))
var_mean3 = sp.factor(sp.simplify(variance(sum(X) / 3)))
display(Formula(r"\mathrm{Var}(X_1) = " + sp.latex(var_one)
                + r",\quad \mathrm{Var}\Big(\tfrac13 \textstyle\sum_{i=1}^3 X_i\Big) = "
                + sp.latex(var_mean3)))
checks = Checks("the estimator's moments")
checks.equal("E[X] = J", 0, sp.simplify(E(X[0]) - J))
checks.equal("Var(X) = J(1 - J)", 0, sp.simplify(var_one - J * (1 - J)))
checks.equal("Var(mean of 3) = J(1 - J)/3", 0, sp.simplify(var_mean3 - J * (1 - J) / 3))
checks

# %% [markdown]
# Independence makes the variances add, hence $\mathrm{Var}(\hat J) = J(1-J)/k$ and a
# standard error $\sqrt{J(1-J)/k}$: with $k = 128$ hashes, at most $0.044$ (at $J = 1/2$).
#
# The book's hash functions are Carter and Wegman's $h(x) = (ax + b) \bmod (2^{31} - 1)$,
# applied to a 32-bit hash of each shingle: not truly random orderings, but close enough
# that the estimate behaves as derived. A document from the corpus and a copy of it with
# about a tenth of its words replaced; 300 independent families of $k = 64$ functions:

# %%
show_source(minhash_signature)

# %%
docs_all = cut_documents(load_stdlib_docs(600_000), 150, max_overlap=0.2)
rng = np.random.default_rng(0)
words = docs_all[0].split()
edited = [w if rng.random() > 0.1 else "edited" for w in words]
set_a, set_b = shingles(normalise_document(docs_all[0])), shingles(normalise_document(" ".join(edited)))
j_true, k_small = jaccard(set_a, set_b), 64
ha, hb = shingle_hashes(sorted(set_a)), shingle_hashes(sorted(set_b))
est = np.array([estimate_jaccard(minhash_signature(ha, f), minhash_signature(hb, f))
                for f in (hash_family(k_small, seed=s) for s in range(300))])
se = math.sqrt(j_true * (1 - j_true) / k_small)
print(f"|A| = {len(set_a)}, |B| = {len(set_b)}, |A ∩ B| = {len(set_a & set_b)}, J = {j_true:.4f}")
print(f"300 families: mean estimate {est.mean():.3f}, standard deviation {est.std(ddof=1):.4f}, "
      f"derived sqrt(J(1-J)/k) = {se:.4f}")

# %%
checks = Checks("MinHash estimator, 300 hash families")
checks.true("mean within 4 standard errors of J", abs(est.mean() - j_true) < 4 * se / math.sqrt(300),
            f"{abs(est.mean() - j_true) / (se / math.sqrt(300)):.1f} s.e.")
lo_var, hi_var = chdtri(299, [0.9995, 0.0005]) / 299  # (n-1) s^2 / sigma^2 ~ chi^2_(n-1)
checks.true(f"variance / (J(1-J)/k) in the 99.9 % chi-square band [{lo_var:.2f}, {hi_var:.2f}]",
            lo_var < est.var(ddof=1) / se**2 < hi_var, f"{est.var(ddof=1) / se**2:.2f}")
checks

# %% [markdown]
# The 300 estimates are checked against the derivation, not against themselves: their mean
# must lie within 4 standard errors of the exact $J$, and their sample variance $s^2$ inside
# the band where $(n-1)s^2/\sigma^2$, a chi-square variable with $n - 1 = 299$ degrees of
# freedom if the estimates were Gaussian with the derived variance $\sigma^2 = J(1-J)/k$,
# falls with probability 99.9 % (SciPy's quantiles).
#
# **Against `datasketch`.** The `datasketch` library's `MinHash` (version 2, its default
# "affine32" scheme) starts from the same 32-bit SHA-1 of each shingle but hashes it
# differently: a fixed bijective scramble of the 32 bits (MurmurHash3's finaliser) and then
# $h(x) = (ax + b) \bmod 2^{32}$ with odd $a$, a permutation of the 32-bit values, where
# ours takes $(ax + b) \bmod (2^{31} - 1)$. Its estimate therefore differs from ours but
# must lie within the same standard error of the truth; we compare the two on planted
# near-duplicates in section 10c.4, after recomputing its signature of one document from
# that description.
#
# ## 10c.3 LSH banding: which pairs to compare
#
# Comparing every pair of signatures is still $O(N^2)$. Locality-sensitive hashing (Indyk
# and Motwani, 1998; the banding form as in Leskovec, Rajaraman and Ullman's *Mining of
# Massive Datasets*, chapter 3) cuts each signature of $k = br$ values into $b$ *bands*
# of $r$ rows and puts each document into one hash bucket per band. Two documents become a
# *candidate pair* when they share a bucket in at least one band, that is, when some band
# agrees in all its $r$ rows. For similarity $s$ each row agrees with probability $s$,
# independently, so
#
# $$P(\text{candidate}) = 1 - (1 - s^r)^b.$$
#
# This is an S-curve: pairs far below its rise are almost never compared, pairs far above
# almost always. Where is it steepest? Set the second derivative to zero. SymPy
# differentiates and, after dividing out the factor $b r s^{r-2} (1-s^r)^{b-2}$ (positive
# for $0 < s < 1$), leaves a condition linear in $s^r$:

# %%
s, b, r, x = sp.symbols("s b r x", positive=True)
P = 1 - (1 - s**r) ** b
d2 = sp.diff(P, s, 2)
core = sp.expand(sp.simplify(d2 / (b * r * s ** (r - 2) * (1 - s**r) ** (b - 2))))
root = sp.solve(core.subs(s**r, x), x)
display(sp.Eq(core, 0), sp.Eq(sp.Symbol("s^r"), root[0]))
checks = Checks("where the S-curve is steepest")
checks.equal("one root in s^r", 1, len(root))
for bb, rr in ((20, 5), (32, 4), (16, 8)):
    s_star = sp.Rational(rr - 1, bb * rr - 1) ** sp.Rational(1, rr)
    checks.equal(f"P''(s*) = 0 exactly at b={bb}, r={rr}", 0,
                 sp.simplify(d2.subs({b: bb, r: rr}).subs(s, s_star)))
    checks.close(f"band_inflection({bb}, {rr})", float(s_star), band_inflection(bb, rr), tol=1e-12)
checks

# %% [markdown]
# So the curve is steepest at $s^* = \left(\frac{r-1}{br-1}\right)^{1/r}$. For large $b$,
# $(r-1)/(br-1) \approx 1/b$, which gives the threshold quoted everywhere,
# $(1/b)^{1/r}$. How good is it? The table sets both beside the similarity where the
# probability is one half, $s_{1/2} = (1 - 2^{-1/b})^{1/r}$ (solve $P = 1/2$), for the
# settings this chapter uses and two more.

# %%
settings = [(64, 2), (32, 4), (16, 8), (20, 5), (8, 16)]
print(" b   r   (1/b)^(1/r)   s* (steepest)   s_1/2   P at (1/b)^(1/r)   P at s*")
for bb, rr in settings:
    t, s_star = band_threshold(bb, rr), band_inflection(bb, rr)
    s_half = (1 - 2 ** (-1 / bb)) ** (1 / rr)
    print(f"{bb:2}  {rr:2}   {t:.4f}        {s_star:.4f}          {s_half:.4f}   "
          f"{band_collision_probability(t, bb, rr):.4f}             "
          f"{band_collision_probability(s_star, bb, rr):.4f}")
checks = Checks("the usual threshold (1/b)^(1/r) against the steepest point")
for bb, rr in settings:
    t, s_star = band_threshold(bb, rr), band_inflection(bb, rr)
    checks.true(f"b={bb}, r={rr}: 0 < (1/b)^(1/r) - s* < 0.05", 0 < t - s_star < 0.05, f"{t - s_star:.4f}")
    checks.true(f"b={bb}, r={rr}: P at (1/b)^(1/r) = 1 - (1 - 1/b)^b (to 1e-12)",
                abs(1 - (1 - 1 / bb) ** bb - float(band_collision_probability(t, bb, rr))) < 1e-12)
checks.true("1 - (1 - 1/b)^b falls towards 1 - 1/e as b grows",
            all(1 - (1 - 1 / b1) ** b1 > 1 - (1 - 1 / b2) ** b2 > 1 - 1 / math.e
                for b1, b2 in ((8, 16), (16, 32), (32, 64))))
checks

# %% [markdown]
# The approximation sits within a few hundredths of the steepest point, a little above it,
# and at $(1/b)^{1/r}$ the probability is always $1 - (1 - 1/b)^b$, about $1 - 1/e$ for
# large $b$: the approximation names the similarity where candidates become *likely*,
# not where they are a coin flip. Choosing $(b, r)$ with $br$ fixed moves the curve: more
# rows per band move it right, trading missed pairs for false candidates. They do not
# simply make it steeper. Solving $P = q$ gives $s_q = (1 - (1-q)^{1/b})^{1/r}$, and the
# width $s_{0.9} - s_{0.1}$ of the rise, for the $br = 128$ settings:

# %%
print(" b   r   s_0.1    s_0.9    width")
widths = {}
checks = Checks("the rise of the S-curve, from the closed-form inverse")
for bb, rr in [(64, 2), (32, 4), (16, 8), (8, 16)]:
    s_10, s_90 = ((1 - (1 - q) ** (1 / bb)) ** (1 / rr) for q in (0.1, 0.9))
    widths[bb, rr] = s_90 - s_10
    print(f"{bb:2}  {rr:2}   {s_10:.4f}   {s_90:.4f}   {s_90 - s_10:.4f}")
    p_back = band_collision_probability(np.array([s_10, s_90]), bb, rr)
    checks.true(f"b={bb}, r={rr}: P(s_0.1) = 0.1 and P(s_0.9) = 0.9 (to 1e-12)",
                bool(np.all(np.abs(p_back - [0.1, 0.9]) < 1e-12)))
checks.true("the width is not monotone in r (wider at r = 4 than at r = 2 and r = 16)",
            widths[32, 4] > max(widths[64, 2], widths[8, 16]))
checks

# %% [markdown]
# The rise is widest in the middle settings and narrowest at both ends: at $r = 2$ because
# the whole curve is squeezed near $s = 0$, at $r = 16$ because it is squeezed near 1.
# Only more hash functions ($k = br$ larger) make every setting's rise narrower.

# %%
grid = np.linspace(0, 1, 401)
fig, ax = plt.subplots(figsize=(7.5, 4.2))
for bb, rr in settings[:3]:
    line, = ax.plot(grid, band_collision_probability(grid, bb, rr), label=f"b = {bb}, r = {rr}")
    ax.axvline(band_threshold(bb, rr), color=line.get_color(), ls=":")
ax.set(xlabel="Jaccard similarity s of a pair", ylabel="P(pair becomes a candidate)",
       title="LSH banding with k = br = 128: 1 - (1 - s^r)^b")
ax.legend(title="dotted: (1/b)^(1/r)")
save_figure(fig, "10c_data_banding_curves")
plt.show()

# %% [markdown]
# ## 10c.4 A corpus with planted duplicates
#
# To measure precision and recall we need to know the true duplicates. We make the corpus
# ourselves: the standard library's documentation text (the book's corpus from chapter 1)
# cut into documents of 150 words, keeping only documents that share at most
# $J = 0.2$ with every document kept before them (the real text repeats itself: many
# classes carry the same docstrings). These are the originals. Then
# `make_duplicate_corpus` adds, each of a different original, exact copies, *trivial*
# copies (case, spacing, punctuation and full-width letters changed:
# `trivial_variant`) and *near* copies in which each word is, with probability $\rho$
# (the edit rate), replaced, deleted or followed by an inserted word, the three equally
# likely (`edit_words`). The copies are shuffled among themselves.

# %%
show_source(make_duplicate_corpus)

# %%
edit_rates = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4]
originals = docs_all[:400]
corpus = make_duplicate_corpus(originals, edit_rates, copies_per_rate=20, num_exact=20,
                               num_trivial=20, seed=0)
truth = corpus.true_pairs()
n_docs = len(corpus.texts)
print(f"{len(originals)} originals + {n_docs - len(originals)} copies = {n_docs} documents, "
      f"{n_docs * (n_docs - 1) // 2} pairs, {len(truth)} of them true duplicates")
i_trivial = corpus.kind.index("trivial")
print("an original:   ", repr(corpus.texts[corpus.source[i_trivial]][:90]))
print("trivial copy:  ", repr(corpus.texts[i_trivial][:90]))
i_near = next(i for i, rt in enumerate(corpus.edit_rate) if rt == 0.1)
print("original:      ", repr(corpus.texts[corpus.source[i_near]][:90]))
print("near, rho 0.1: ", repr(corpus.texts[i_near][:90]))

# %% [markdown]
# **Exact deduplication**, on raw bytes and on normalised text. It can only find the exact
# and trivial copies; its precision should be perfect, since the originals are distinct.

# %%
print("method              true pos  false pos  false neg  precision  recall")
for name, norm in (("raw bytes", False), ("normalised", True)):
    found = {(g[0], j) for g in exact_duplicate_groups(corpus.texts, normalise=norm) for j in g[1:]}
    tp, fp, fn = pair_counts(found, truth)
    print(f"{name:18}  {tp:8}  {fp:9}  {fn:9}  {tp / max(tp + fp, 1):9.3f}  {tp / (tp + fn):6.3f}")
    exact_found = found
checks = Checks("exact deduplication")
checks.equal("normalised hashing finds exactly the exact and trivial copies",
             len(corpus.true_pairs(["exact", "trivial"])), len(exact_found & truth))
checks.equal("and nothing else", set(), exact_found - corpus.true_pairs(["exact", "trivial"]))
checks

# %% [markdown]
# **MinHash and LSH.** Shingles of five words of the normalised text, signatures of
# $k = 128$ hash functions, then banding with three settings of $br = 128$: $b = 64$ rows
# of $r = 2$ (a low threshold), $32 \times 4$ and $16 \times 8$ (a high one). A candidate
# pair counts as found; precision is the share of candidates that are true duplicates,
# recall the share of true duplicates that become candidates.

# %%
doc_shingles = [sorted(shingles(normalise_document(t), 5)) for t in corpus.texts]
exact_j = {p: jaccard(set(doc_shingles[p[0]]), set(doc_shingles[p[1]])) for p in truth}
signatures = minhash_signatures(doc_shingles, hash_family(128, seed=1))  # (N, 128)
candidates = {(bb, rr): lsh_candidates(signatures, bb, rr) for bb, rr in settings[:3]}
print(f"signatures: {signatures.shape}, {signatures.dtype}")

# %%
print("  b   r  candidates  true pos  false pos  false neg  precision  recall")
for (bb, rr), cand in candidates.items():
    tp, fp, fn = pair_counts(cand, truth)
    print(f"{bb:3} {rr:3}  {len(cand):10}  {tp:8}  {fp:9}  {fn:9}  {tp / (tp + fp):9.3f}  "
          f"{tp / (tp + fn):6.3f}")

# %% [markdown]
# Recall for each kind of copy and edit rate, with the mean true Jaccard of those pairs.
# Each cell is found / planted (20 each):

# %%
groups = [("exact", 0.0), ("trivial", 0.0)] + [("near", rt) for rt in edit_rates]
print("copy          mean J   " + "   ".join(f"b={bb},r={rr}" for bb, rr in candidates))
for kind, rt in groups:
    pairs = {p for p in truth if corpus.kind[p[1]] == kind and corpus.edit_rate[p[1]] == rt}
    label = kind if kind != "near" else f"near {rt:.2f}"
    mean_j = np.mean([exact_j[p] for p in pairs])
    print(f"{label:12}  {mean_j:6.3f}   " + "   ".join(f"{len(pairs & c):4} / {len(pairs)}"
                                                     for c in candidates.values()))

# %% [markdown]
# The exact and trivial copies have $J = 1$ and every setting finds them. The near copies
# lose similarity fast: a five-word shingle survives only if none of its words (and no gap
# between them) was edited, so at edit rate $\rho$ roughly a share $(1-\rho)^5$ of the
# shingles is shared (exercise 2 makes this precise). Each setting finds the pairs whose
# $J$ lies above its curve's rise and misses those below, as the S-curves predict. The
# low threshold ($b = 64$, $r = 2$) finds most pairs, at the price of many false
# positives: unrelated documentation pages share common phrasings ("Return a new",
# "If the optional argument"), with an exact $J$ of about a tenth (measured below, on
# every false candidate), and at such similarities a $64 \times 2$ banding still makes
# candidates about half the time:

# %%
false_64 = sorted(candidates[64, 2] - truth)
false_j = np.array([jaccard(set(doc_shingles[i]), set(doc_shingles[j])) for i, j in false_64])
print(f"exact J of the {len(false_64)} false candidates at b=64, r=2: median {np.median(false_j):.3f}, "
      f"max {false_j.max():.3f}")
print(f"P(candidate | s = 0.1) at b=64, r=2: {band_collision_probability(0.1, 64, 2):.3f}; "
      f"at b=32, r=4: {band_collision_probability(0.1, 32, 4):.4f}")

# %% [markdown]
# In practice candidates are *verified*: each candidate pair's Jaccard is estimated from
# the full signature (or computed exactly from the shingles) and kept only above a
# threshold. Verification cannot raise recall, but it removes the false positives:

# %%
print("  b   r  verify at  true pos  false pos  false neg  precision  recall")
for bb, rr in candidates:
    for tau in (0.2, 0.4):
        kept = {p for p in candidates[bb, rr] if estimate_jaccard(signatures[p[0]], signatures[p[1]]) >= tau}
        tp, fp, fn = pair_counts(kept, truth)
        print(f"{bb:3} {rr:3}  J^ >= {tau}  {tp:8}  {fp:9}  {fn:9}  {tp / max(tp + fp, 1):9.3f}  "
              f"{tp / (tp + fn):6.3f}")

# %% [markdown]
# **Recall against the banding curve.** Each true pair is a trial at its own similarity.
# To see the curve through the noise of 200 pairs we repeat the signatures with five
# independent hash families and bin the pairs by their exact Jaccard; the line is
# $1 - (1 - s^r)^b$, not fitted to anything.

# %%
pair_list = sorted(truth)
pair_j = np.array([exact_j[p] for p in pair_list])
found_by_seed = {setting: [] for setting in candidates}
for seed in range(1, 6):
    sig = signatures if seed == 1 else minhash_signatures(doc_shingles, hash_family(128, seed=seed))
    for bb, rr in candidates:
        cand = candidates[bb, rr] if seed == 1 else lsh_candidates(sig, bb, rr)
        found_by_seed[bb, rr].append([p in cand for p in pair_list])
edges = np.linspace(0, 1, 11)
centres = (edges[:-1] + edges[1:]) / 2
which = np.clip(np.digitize(pair_j, edges) - 1, 0, 9)  # (pairs,) bin of each pair

# %%
fig, ax = plt.subplots(figsize=(7.5, 4.4))
for (bb, rr), found in found_by_seed.items():
    hits = np.array(found, dtype=float).mean(axis=0)  # (pairs,) share of seeds that found it
    rec = [hits[which == i].mean() if (which == i).any() else np.nan for i in range(10)]
    line, = ax.plot(grid, band_collision_probability(grid, bb, rr), lw=1.5)
    ax.plot(centres, rec, "o", color=line.get_color(), label=f"b = {bb}, r = {rr}")
ax.set(xlabel="exact Jaccard similarity of a planted pair (bins of 0.1)",
       ylabel="recall (found / planted)",
       title="Measured recall (dots, 5 hash seeds) on the banding curves (lines)")
ax.legend()
save_figure(fig, "10c_data_recall_vs_jaccard")
plt.show()

# %%
checks = Checks("recall follows 1 - (1 - s^r)^b")
checks.equal("the planted pairs share no document", 2 * len(pair_list), len({i for p in pair_list for i in p}))
for (bb, rr), found in found_by_seed.items():
    hits = np.array(found, dtype=float)  # (5, pairs)
    expected = band_collision_probability(pair_j, bb, rr)  # (pairs,)
    z = (hits.sum() - 5 * expected.sum()) / math.sqrt(5 * (expected * (1 - expected)).sum())
    checks.true(f"b={bb}, r={rr}: found {int(hits.sum())} of {hits.size}, expected "
                f"{5 * expected.sum():.0f}; |z| < 3", abs(z) < 3, f"z = {z:.2f}")
checks

# %% [markdown]
# The dots sit on the lines: the S-curve derived for independent rows describes the real
# documents. (The $z$ treats each of the 5 × 200 pair-and-family trials as an independent
# coin with the curve's probability: given a pair's similarity the five families are
# independent, and the pairs do not share documents.)
#
# **Against `datasketch`.** We build `datasketch.MinHash` signatures of the same shingles
# and index them in a `datasketch.MinHashLSH` with the same $(b, r)$; our
# `lsh_candidates` on *their* signatures must return exactly the pairs their index
# returns, and on the planted pairs both libraries' estimates must lie within the derived
# standard error of the exact Jaccard.

# %%
sketches = []
for sh in doc_shingles:
    mh = datasketch.MinHash(num_perm=128, seed=1)
    mh.update_batch([t.encode("utf-8") for t in sh])
    sketches.append(mh)
theirs_sig = np.stack([mh.hashvalues for mh in sketches])  # (N, 128) uint32
print(f"datasketch signatures: {theirs_sig.shape}, {theirs_sig.dtype}")
hv = shingle_hashes(doc_shingles[0]).astype(np.uint32)  # the same 32-bit SHA-1 as ours
for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):  # MurmurHash3's fmix32
    hv = (hv ^ (hv >> np.uint32(shift))) * np.uint32(mult)
hv = hv ^ (hv >> np.uint32(16))
a_ds, b_ds = sketches[0].permutations  # (128,) odd multipliers and offsets, uint32
recomputed = (a_ds[:, None] * hv[None, :] + b_ds[:, None]).min(axis=1)  # mod 2^32: uint32 wraps
print("document 0: datasketch's signature = min over shingles of (a fmix32(x) + b) mod 2^32:",
      bool(np.array_equal(recomputed, theirs_sig[0])), "; all multipliers odd:", bool((a_ds % 2).all()))

# %%
checks = Checks("against datasketch")
for bb, rr in settings[:3]:
    index = datasketch.MinHashLSH(num_perm=128, params=(bb, rr))
    for i, mh in enumerate(sketches):
        index.insert(i, mh)
    theirs = {(min(i, j), max(i, j)) for i, mh in enumerate(sketches) for j in index.query(mh) if i != j}
    checks.equal(f"b={bb}, r={rr}: our banding = MinHashLSH ({len(theirs)} pairs)", True,
                 lsh_candidates(theirs_sig, bb, rr) == theirs)
z_ours = [(estimate_jaccard(signatures[i], signatures[j]) - exact_j[i, j])
          / max(math.sqrt(exact_j[i, j] * (1 - exact_j[i, j]) / 128), 1e-9) for i, j in pair_list]
z_theirs = [(sketches[i].jaccard(sketches[j]) - exact_j[i, j])
            / max(math.sqrt(exact_j[i, j] * (1 - exact_j[i, j]) / 128), 1e-9) for i, j in pair_list]
partial = np.array([0 < exact_j[p] < 1 for p in pair_list])  # J = 1 pairs have s.e. 0
n_part = int(partial.sum())  # a bound fixed before looking: 95.4 % within 2 s.e., minus 3 s.d.
min_within = n_part * 0.954 - 3 * math.sqrt(n_part * 0.954 * 0.046)
for name, zs in (("ours", z_ours), ("datasketch", z_theirs)):
    zs = np.abs(zs)
    checks.true(f"{name}: of {n_part} pairs with 0 < J < 1, at least {min_within:.0f} within 2 s.e.",
                (zs[partial] <= 2).sum() >= min_within, f"{int((zs[partial] <= 2).sum())}")
    checks.true(f"{name}: every estimate within 4 s.e.", bool((zs <= 4).all()), f"max {zs.max():.2f}")
checks

# %% [markdown]
# **From pairs to a deduplicated corpus.** Duplicates of duplicates are duplicates: the
# candidate pairs are edges of a graph, and each connected component (found with
# union-find) keeps one document. With the verified $32 \times 4$ pairs:

# %%
show_source(duplicate_clusters)

# %%
verified = {p for p in candidates[32, 4] if estimate_jaccard(signatures[p[0]], signatures[p[1]]) >= 0.2}
clusters = duplicate_clusters(n_docs, verified)
removed = sum(len(c) - 1 for c in clusters)
print(f"{len(clusters)} clusters; deduplication removes {removed} of {n_docs} documents "
      f"({n_docs - len(originals)} were planted copies); largest cluster has "
      f"{max(len(c) for c in clusters)} documents")

# %% [markdown]
# ## 10c.5 Quality filters
#
# Deduplication removes repeats; quality filtering removes text that is not worth
# learning from. Two families are in use.
#
# **Heuristic rules.** Gopher's (Rae et al., 2021, appendix A) are simple statistics with
# fixed thresholds: the word count, the mean word length, the number
# of hash symbols and ellipses per word, the share of lines that start with a bullet or
# end with an ellipsis, the share of words containing a letter, the presence of common
# English stop words, and a family of repetition measures (duplicate lines, the most
# frequent word 2-, 3- and 4-gram, characters covered by repeated word 5- to 10-grams).
# The book implements all of them except the paragraph rules (our documents have no
# paragraphs) and, of the duplicate n-gram lengths 5 to 10, keeps only the two ends:

# %%
for rule, (stat, lo, hi) in GOPHER_THRESHOLDS.items():
    print(f"{rule:26} {stat:32} keep if {lo:g} <= value <= {hi:g}")

# %% [markdown]
# **Perplexity against a reference.** Wenzek et al. (2020) score web text with an n-gram
# model trained on Wikipedia and keep the documents it finds likely. The book's version
# trains chapter 3's `NGramModel` (order 4, add-$k$ smoothing with $k = 0.1$) on text
# mapped to 32 character classes (the 26 letters case-folded, whitespace, digits, three
# groups of punctuation, everything else), and keeps a document when its per-character
# perplexity is below the 95th percentile of held-out reference documents.

# %%
show_source(PerplexityFilter.perplexity)

# %% [markdown]
# The test documents: clean text of two kinds, the book's own prose (the held-out prose
# of chapter 15, in documents of at least 60 words) and held-out standard-library
# documentation, and 30 documents of each kind of junk, made by `make_junk_document` from
# sentences of the prose: boilerplate (navigation and cookie lines), keyboard mash,
# one sentence on every line, sentences interleaved with code, and word salad (the
# prose's words in a random order). One of each, shortened:

# %%
prose_docs = load_prose_documents(60)
rng = np.random.default_rng(0)
junk = {kind: [make_junk_document(kind, prose_docs, rng) for _ in range(30)] for kind in JUNK_KINDS}
for kind, docs in junk.items():
    print(f"--- {kind}\n{docs[0][:160]!r}")

# %% [markdown]
# The statistics the rules read, for a clean document and two kinds of junk:

# %%
samples = {"prose": prose_docs[0], "repeated lines": junk["repeated lines"][0],
           "keyboard mash": junk["keyboard mash"][0]}
stats = {name: quality_statistics(d) for name, d in samples.items()}
print(f"{'statistic':32}" + "".join(f"{n:>16}" for n in samples))
for key in stats["prose"]:
    print(f"{key:32}" + "".join(f"{stats[n][key]:16.3f}" for n in samples))
for name, d in samples.items():
    print(f"{name}: breaks {gopher_failures(d)}")

# %% [markdown]
# The reference for the perplexity filter: the standard-library documents that section
# 10c.4 did not use, a third of them to train on and a third to calibrate the threshold,
# plus a third of the prose documents in each; the last third of each is clean test text.

# %%
spare = docs_all[400:]
std_train, std_cal, std_test = spare[0::3], spare[1::3], spare[2::3][:40]
prose_train, prose_cal, prose_test = prose_docs[0::3], prose_docs[1::3], prose_docs[2::3]
ppl = PerplexityFilter(order=4, add_k=0.1).fit(std_train + prose_train)
threshold = ppl.calibrate(std_cal + prose_cal, keep=0.95)
tests = {"clean: prose": prose_test, "clean: stdlib docs": std_test, **junk}
print(f"reference: {len(std_train) + len(prose_train)} documents; threshold = perplexity "
      f"{threshold:.2f} per character (of {len(std_cal) + len(prose_cal)} held-out documents, "
      f"95 % lie below)")
for name, docs in tests.items():
    values = [ppl.perplexity(d) for d in docs]
    print(f"{name:20} median perplexity {np.median(values):6.2f}")

# %% [markdown]
# What each filter removes, as a count per kind of document (out of the number in the
# header). A row per Gopher rule (a document can break several), then any Gopher rule,
# the perplexity filter, and the two together:

# %%
failures = {name: [set(gopher_failures(d)) for d in docs] for name, docs in tests.items()}
too_perplexing = {name: [not ppl.keeps(d) for d in docs] for name, docs in tests.items()}
rows = {"any Gopher rule": [sum(bool(f) for f in failures[n]) for n in tests],
        "perplexity": [sum(too_perplexing[n]) for n in tests],
        "Gopher or perplexity": [sum(bool(f) or p for f, p in zip(failures[n], too_perplexing[n],
                                                                   strict=True)) for n in tests]}

# %%
short = {"clean: prose": "prose", "clean: stdlib docs": "stdlib", "boilerplate": "boiler",
         "keyboard mash": "mash", "repeated lines": "repeat", "code in prose": "code",
         "word salad": "salad"}
print(f"{'filter':26}" + "".join(f"{short[n]:>7}" for n in tests))
print(f"{'(documents)':26}" + "".join(f"{len(d):7}" for d in tests.values()))
for rule in GOPHER_THRESHOLDS:
    row = [sum(rule in f for f in failures[n]) for n in tests]
    if any(row):
        print(f"{rule:26}" + "".join(f"{v:7}" for v in row))
for name, row in rows.items():
    print(f"{name:26}" + "".join(f"{v:7}" for v in row))

# %%
checks = Checks("quality filters")
col = {n: i for i, n in enumerate(tests)}
checks.equal("no book prose breaks a Gopher rule", 0, rows["any Gopher rule"][col["clean: prose"]])
checks.equal("repeated lines: all caught by the rules", 30, rows["any Gopher rule"][col["repeated lines"]])
checks.equal("keyboard mash: all caught by perplexity", 30, rows["perplexity"][col["keyboard mash"]])
checks.true("word salad passes the rules (real words)", rows["any Gopher rule"][col["word salad"]] <= 3,
            rows["any Gopher rule"][col["word salad"]])
checks.true("word salad passes the perplexity filter too (a gap)",
            rows["perplexity"][col["word salad"]] <= 3, rows["perplexity"][col["word salad"]])
checks.true("boilerplate, mash, repeats: all removed by the two together",
            all(rows["Gopher or perplexity"][col[k]] == 30 for k in JUNK_KINDS[:3]),
            [rows["Gopher or perplexity"][col[k]] for k in JUNK_KINDS[:3]])
checks

# %% [markdown]
# The two families are complementary. The rules catch what is *structurally* wrong
# (a repeated line, boilerplate's recurring menus and notices, keyboard mash's missing
# stop words) whatever its characters; the perplexity filter catches what does not *look like* the
# reference at the level of characters (keyboard mash, boilerplate, much of the code). A
# sentence repeated on every line is ordinary English to a character model, so the
# perplexity filter keeps most of it; the repetition rules remove it all. Code mixed into
# prose escapes both in part: its prose sentences hold the stop words, its lines rarely
# repeat, and it is only moderately unlikely character by character.
#
# **Word salad passes both.** Every word is real and the words are common, so the rules
# see nothing wrong, and a model of four characters sees ordinary words with ordinary
# spaces between them. Catching it needs a model of word order: a word n-gram (as in
# Wenzek et al., 2020) or a small language model, or a classifier trained on examples of
# good text, which is what most recent pipelines add.
#
# Both also remove clean text, and the table shows which. The standard-library
# documentation breaks Gopher's "hash symbols per word" rule, because the book's corpus
# marks each entry with a Markdown heading (`## name`): a rule tuned on web pages
# misfires on a source written in another convention. The perplexity filter, by
# construction, removes about 5 % of text like its reference, and more of text unlike it:
# it prefers the reference's style, which is why Wenzek et al. (2020) use it to *rank*
# text into buckets rather than to delete, and why the choice of reference is itself a
# decision about what the model should learn.
#
# ## Summary
#
# * Exact deduplication hashes a normalised document (here: NFKC, case folding, no
#   punctuation, collapsed whitespace); on the planted corpus it finds every exact and
#   trivial copy and nothing else, and on raw bytes it misses the trivial copies.
# * MinHash: $P[\min \pi(A) = \min \pi(B)] = J(A, B)$ by counting orders of $A \cup B$;
#   the estimate from $k$ hashes is unbiased with variance $J(1-J)/k$ (SymPy), as
#   measured over 300 hash families and as `datasketch`'s estimates show.
# * LSH banding makes a pair of similarity $s$ a candidate with probability
#   $1 - (1 - s^r)^b$; the curve is steepest at $((r-1)/(br-1))^{1/r}$, a little below the
#   usual $(1/b)^{1/r}$. Measured recall on the planted pairs follows the curve, and
#   candidate sets equal `datasketch.MinHashLSH`'s exactly.
# * Low thresholds buy recall with false positives; verifying candidates with the
#   signature's estimate restores precision.
# * Gopher's rules and a perplexity filter catch different junk, and word salad escapes
#   both; both remove some clean text, the perplexity filter in favour of its reference's
#   style.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/10c_data.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 10c` writes a stub
# of every function, `llmbook grade 10c` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_10c.py` runs
# the same checks on the reference.
#
# 1. (★) **Choosing the bands.** With $k = br = 128$ hash functions, write
#    `choose_bands(k, target)` returning the factorisation $(b, r)$ of $k$ whose
#    steepest point $((r-1)/(br-1))^{1/r}$ is closest to `target`, and
#    `miss_and_false_alarm(b, r, low, high)` returning $P(\text{not candidate} \mid s = \text{high})$
#    and $P(\text{candidate} \mid s = \text{low})$. Which setting suits a target of 0.8?
# 2. (★★) **What an edit rate does to $J$.** For a document of $n$ words edited at rate
#    $\rho$ as `edit_words` does, derive the expected share of $w$-word shingles that
#    survive unchanged, $q(\rho, w)$, and from it the approximate Jaccard
#    $J \approx q/(2 - q)$. Write `predicted_jaccard(rate, w)` and compare it with the
#    mean exact Jaccard of the planted near copies at each rate.
# 3. (★★★) **Exact substrings.** Lee et al. (2022) deduplicate at the level of repeated
#    *substrings* rather than documents, with a suffix array. Write
#    `suffix_array(tokens)` (sort the suffixes) and `longest_repeat(tokens)` returning the
#    start positions and length of the longest token run that occurs twice (overlaps
#    allowed), using adjacent suffixes in the array; check it against brute force.

# %%
from llmbook.workbench import grade

grade("10c", globals())
