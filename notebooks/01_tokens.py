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
# equally well.
#
# The corpus throughout is `data/stdlib_docs.txt`: about 1.3 MB of English
# docstrings from the Python standard library, shipped with the book (PSF licence).

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp
import torch
from IPython.display import display

from llmbook.nbtools import Checks, save_figure, seed_everything, show_source
from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
from llmbook.text.tokenizer import (
    BPETokenizer,
    count_pairs,
    hf_tokenizer_from_bpe,
    pretokenize,
    train_bpe,
    train_bpe_naive,
    train_hf_bpe,
)
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
# The thresholds come from the payload bits: one byte carries 7 bits, two bytes
# 5 + 6 = 11, three bytes 4 + 6 + 6 = 16, four bytes 3 + 6 + 6 + 6 = 21. So ASCII costs
# one byte, accented Latin two, most CJK three, emoji four.

# %%
c = sp.Symbol("c", integer=True, nonnegative=True)
utf8_len = sp.Piecewise((1, c < 2**7), (2, c < 2**11), (3, c < 2**16), (4, True))
payload_bits = [7, 5 + 6, 4 + 6 + 6, 3 + 6 + 6 + 6]
assert [sp.log(2**b, 2) for b in payload_bits] == [7, 11, 16, 21]
display(sp.Eq(sp.Function("ell")(c), utf8_len))
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

# %%
example = "GPT-2's tokenizer (2019) splits   text: don't, 3.14!\n\n  Done"
print(pretokenize(example))

# %% [markdown]
# ## Training BPE
#
# BPE (Gage, 1994, *A New Algorithm for Data Compression*; for word pieces Sennrich
# et al., 2016, *Neural Machine Translation of Rare Words with Subword Units*):
#
# 1. Count the pre-tokens of the corpus: a table word $\to$ frequency. Each word
#    starts as its list of byte ids.
# 2. Count every adjacent pair of ids inside the words, weighted by frequency.
# 3. Take the most frequent pair (ties: the smallest pair of byte strings), give it
#    the next free id, and replace it in every word.
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
same_merges = train_bpe(sample, 500, [EOT]) == train_bpe_naive(sample, 500, [EOT])
print("incremental == naive:", same_merges)

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
prefix_ok = train_bpe(slice_text, 500, [EOT])[1] == merges_big[: 500 - 257]
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

# %% [markdown]
# ## Loading GPT-2's own files
#
# OpenAI released GPT-2's tokenizer as two files: `encoder.json` (token $\to$ id,
# with each byte written as one printable character, so a space is `Ġ`) and
# `vocab.bpe` (a `#version` line, then one merge per line). A reader who has them
# reproduces GPT-2's tokens with
#
# ```python
# gpt2 = BPETokenizer.from_gpt2_files("encoder.json", "vocab.bpe")
# ```
#
# The book runs without a network, so we demonstrate the format on files written by
# our own trainer, and let `transformers`' GPT-2 tokenizer read the same files.

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
# for the files, `transformers`' `GPT2Tokenizer` reading what we wrote; for
# compression, `tokenizers`' trainer on the full corpus with the same $V = 2000$.

# %%
from transformers import GPT2Tokenizer

tricky = ("Ça va? 你好，世界。 🤖🎉👍🏽 I'm   here,\tthey'll pay 1,234.50\n\n  "
          f"trailing   {EOT}naïve{EOT} ")
hf_ours = hf_tokenizer_from_bpe(vocab, merges, [EOT])
hf_trained = train_hf_bpe(corpus, 2000, [EOT])
corpus_bytes = len(corpus.encode("utf-8"))
ratio_ours = corpus_bytes / len(tokenizer.encode(corpus))
ratio_hf = corpus_bytes / len(hf_trained.encode(corpus).ids)
gpt2_hf = GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe))
print(f"bytes per token on {corpus_bytes:,} bytes: ours {ratio_ours:.4f}, "
      f"tokenizers {ratio_hf:.4f}")
print("tricky string:", len(tokenizer.encode(tricky)), "tokens")

# %%
checks = Checks("chapter 1: tokens and BPE")
checks.equal("UTF-8 length formula: mismatches", 0, mismatches)
checks.true("incremental trainer == naive trainer", same_merges)
checks.equal("worked example aaabdaaabac ids",
             [258, 100, 258, 97, 99], BPETokenizer(*train_bpe("aaabdaaabac", 259)).encode("aaabdaaabac"))
checks.equal("merges M = V - 256 - S (V=2000, S=1)", int(n_merges.subs({V: 2000, S: 1})), len(merges))
checks.equal("ids == tokenizers (tricky string)", hf_ours.encode(tricky).ids, tokenizer.encode(tricky))
checks.equal("ids == tokenizers (whole corpus)", hf_ours.encode(corpus).ids, tokenizer.encode(corpus))
checks.true("round trip decode(encode(s)) == s", tokenizer.decode(tokenizer.encode(tricky)) == tricky)
checks.equal("special token kept whole", [256], tokenizer.encode(EOT))
checks.close("compression gap vs tokenizers (rel.)", ratio_hf, ratio_ours, tol=0.02, rel=True)
checks.true("prefix property of merges", prefix_ok)
checks.equal("GPT-2 files: reloaded ids", tokenizer.encode(tricky), reloaded.encode(tricky))
checks.equal("GPT-2 files: transformers ids", tokenizer.encode(tricky), gpt2_hf(tricky)["input_ids"])
checks

# %% [markdown]
# ### Timings (from `benchmarks/bpe.py`)
#
# The benchmark trains both tokenizers on the full corpus to $V = 2000$ and encodes it,
# and stores the results in `benchmarks/results/bpe.json`; the numbers below are read
# from that file, so they describe the machine it ran on, not this run.

# %% tags=["nbval-ignore-output"]
bench = json.loads((stdlib_docs_path().parents[1] / "benchmarks/results/bpe.json").read_text())
r = bench["ratios"]
print(f"{bench['machine']['processor']}, {bench['machine']['cpu_count']} CPUs, {bench['date_utc']}")
print(f"train: ours {bench['ours']['train_s']:.2f} s, tokenizers {bench['tokenizers']['train_s']:.2f} s "
      f"-> {r['train_time_ours_over_tokenizers']:.1f}x")
print(f"encode: ours {bench['ours']['encode_MB_per_s']:.2f} MB/s, "
      f"tokenizers {bench['tokenizers']['encode_MB_per_s']:.2f} MB/s")
print(f"compression gap: {100 * r['compression_relative_gap']:+.3f}%")

# %% [markdown]
# ## Exercises
#
# Reference solutions are in `notebooks/solutions/01_tokens.py` (checked by
# `tests/test_solutions_01.py`).
#
# 1. (★) Write `utf8_length(cp)` that returns the UTF-8 length of a code point from its
#    value alone (no `.encode`), and `utf8_encode(cp)` that returns the bytes, using the
#    payload layout `0xxxxxxx`, `110xxxxx 10xxxxxx`, ... . Check both against Python
#    on every scalar value.
# 2. (★★) Write `most_frequent_pair(word_counts)` that takes a dict
#    `bytes -> count` of pre-tokens and returns the pair of single bytes that BPE merges
#    first (highest count; ties to the smallest pair). What does it return for
#    `{b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}`?
# 3. (★★) Write `bpe_encode_word(word, merges)` that encodes one pre-token (bytes) with
#    a list of merges by rank and returns the list of token byte strings, without
#    using `BPETokenizer`. Compare with the tokenizer of this chapter.
# 4. (★★★) Tokenization is not a homomorphism: find strings $a$, $b$ with
#    `encode(a + b) != encode(a) + encode(b)` for the $V = 2000$ tokenizer above, and
#    explain from the pre-tokenisation rule why `encode(a + " " + b)` splits
#    differently from `encode(a + " ") + encode(b)`. Write `non_additive_pair(tok)`
#    returning such a pair.
