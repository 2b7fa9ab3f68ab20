"""Checks of the build-it-yourself unit build-I (a byte-level BPE tokenizer), run on ``solutions``.

The reader's functions (``llmbook/workbench/units/build1_tokenizer.py`` is the reference)
are compared with the book's own tokenizer (:mod:`llmbook.text.tokenizer`) and with the
independent peers the book tests itself against: Hugging Face ``tokenizers`` (its
byte-level pre-tokeniser, its BPE model given the same merges, and its own
``BpeTrainer``) and ``tiktoken`` built on the same ranks. Tokens, merges and ids must be
equal: there is no tolerance.

The last exercise is the end-to-end check: the reader's trainer, encoder and decoder
together, with ids equal to ``tokenizers``' encoder given the reader's merges, and merges
and tokens equal to ``tokenizers``' own trainer on a corpus where no step of training is a
tie (where two pairs tie, ``tokenizers`` prefers the pair of smaller internal ids, which
is neither of the book's tie rules, so the trainers may part there).
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter

from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.tokenizer import (
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    count_pairs,
    count_pretokens,
    gpt2_string_to_token,
    hf_tokenizer_from_bpe,
    merge_pair,
    pretokenize,
    split_on_special_tokens,
    train_bpe,
    train_hf_bpe,
)
from llmbook.workbench.checks import raises

#: ``{number: (stars, title)}``, in the order to build.
EXERCISES = {
    1: (1, "Pre-tokenisation and the word table"),
    2: (1, "Pair counts and one merge"),
    3: (3, "The BPE trainer"),
    4: (2, "The encoder"),
    5: (1, "The decoder"),
    6: (2, "End to end: ids equal to Hugging Face tokenizers"),
}

EOT = "<|endoftext|>"
#: Texts that exercise the pre-tokeniser's corners (each without special tokens).
TEXTS = [
    "Hello, world's  end",
    "Crème brûlée à Genève; Ærøskøbing, Łódź, Ñandú",
    "汉字と仮名、그리고 한글。 ελληνικά кириллица",
    "🧪🚀 mixed 👨‍🔬 zwj 🇯🇵 flag 🖐🏿 tone",
    "v1.2.3 at 12:45, 1e-9 ± 0.5, ⅔ and ٧٨٩",
    "We'd they've you'll I'M she's it'd 'LL",
    "gaps   and    tabs\t\t\nline\r\n\n  indent \t\n ",
    "ends with spaces    ",
    "    starts with spaces",
    "for i in range(3):\n    print(i ** 2)  # squares\n",
    "",
]
#: Texts with the special token, for the encoder and decoder.
SPECIAL_TEXTS = [
    f"special {EOT} kept{EOT}whole{EOT}{EOT} <|endoftext",
    f"{EOT}first document.{EOT}second document.{EOT}",
]
MERGES = 300  #: merges learned on the book's corpus in exercises 3 to 6
MARKOV_SEED, MARKOV_CHARS, MARKOV_MERGES = 12, 20_000, 40  #: exercise 6's tie-free corpus


@functools.cache
def _corpus() -> str:
    """About 20 kB of the book's corpus (stdlib docstrings), modules separated by EOT."""
    return load_stdlib_docs(20_000).replace("\n# module ", f"{EOT}# module ")


@functools.cache
def _held_out() -> str:
    """About 10 kB of the corpus that the trainers never see."""
    return load_stdlib_docs(60_000)[-10_000:].replace("\n# module ", f"{EOT}# module ")


@functools.cache
def _book_model() -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """The book's tokenizer on :func:`_corpus`: 256 bytes, EOT and 300 merges."""
    return train_bpe(_corpus(), 257 + MERGES, [EOT])


def _markov_text(seed: int, n_chars: int) -> str:
    """A random text over 12 letters and the space from a first-order Markov chain.

    Only ``random.Random.random`` is used, whose sequence Python keeps the same across
    versions, so the text is the same everywhere.
    """
    letters = "etaoinshrdlu "
    rng = random.Random(seed)
    rows = []
    for _ in letters:
        weights = [rng.random() ** 3 for _ in letters]
        total, acc, cumulative = sum(weights), 0.0, []
        for w in weights:
            acc += w / total
            cumulative.append(acc)
        rows.append(cumulative)
    out, state = [], 0
    for _ in range(n_chars):
        u = rng.random()
        state = next((j for j, c in enumerate(rows[state]) if u < c), len(letters) - 1)
        out.append(letters[state])
    return "".join(out)


def _first_difference(got: list, want: list) -> str:
    """Where two lists part, in words."""
    for k, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"at position {k}: expected {w!r}, got {g!r}"
    return f"the lengths differ: expected {len(want)} items, got {len(got)}"


def _hf_merges(tokenizer) -> list[tuple[bytes, bytes]]:
    """A ``tokenizers`` BPE model's merges, as pairs of bytes."""
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    return [(gpt2_string_to_token(a), gpt2_string_to_token(b)) for a, b in pairs]


def _hf_pieces(text: str) -> list[bytes]:
    """``tokenizers``' byte-level pre-tokeniser (GPT-2's regex) on ``text``, as bytes."""
    from tokenizers import pre_tokenizers

    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return [gpt2_string_to_token(piece) for piece, _ in splitter.pre_tokenize_str(text)]


def exercise_1_pretokenize_matches_the_book_and_tokenizers(solutions) -> None:
    for text in [*TEXTS, _corpus()[:3000]]:
        got = solutions.pretokenize(text)
        want = pretokenize(text)
        assert got == want, (f"expected pretokenize({text[:40]!r}...) to give GPT-2's pre-tokens, "
                             f"{_first_difference(got, want)}")
        peer = _hf_pieces(text)
        mine = [piece.encode("utf-8") for piece in got]
        assert mine == peer, (f"expected the pre-tokens of {text[:40]!r} to be tokenizers' "
                              f"ByteLevel pieces, {_first_difference(mine, peer)}")


def exercise_1_special_tokens_and_the_word_table(solutions) -> None:
    cases = [
        ("a<|endoftext|>b", [EOT], "a special token is one piece"),
        (f"{EOT}{EOT}x{EOT}", [EOT], "no empty pieces between special tokens"),
        ("<|a|><|b|> then <|a|>", ["<|a|>", "<|a|><|b|>"], "the longer special token wins"),
        ("no specials here", [], "no special tokens: one ordinary piece"),
        ("plain text", [EOT], "no special token in the text: one ordinary piece"),
        ("", [EOT], "the empty text has no pieces"),
        ("a.b*c", [".", "*"], "special tokens are literal text, not regular expressions"),
    ]
    for text, specials, rule in cases:
        got = solutions.split_on_special_tokens(text, specials)
        want = split_on_special_tokens(text, specials)
        assert got == want, (f"expected split_on_special_tokens({text!r}, {specials}) = {want!r} "
                             f"({rule}), got {got!r}")
    text = _corpus()
    got = solutions.count_pretokens(text, [EOT])
    leaked = [w for w in got if b"endoftext" in w or b"<|" in w]
    assert not leaked, (f"expected the special token {EOT!r} to be cut out of the text before "
                        f"pre-tokenisation, and not counted; the word table has {leaked[:3]}")
    want = count_pretokens(text, (EOT,))
    if got != want:
        wrong = sorted(set(got) ^ set(want) | {w for w in set(got) & set(want) if got[w] != want[w]})
        w = wrong[0]
        raise AssertionError(f"expected count_pretokens of 20 kB of the book's corpus (with "
                             f"{EOT!r} as a special token) to equal the book's word table; "
                             f"{len(wrong)} words differ, e.g. {w!r}: expected {want.get(w)}, "
                             f"got {got.get(w)}")
    plain = load_stdlib_docs(8_000)
    peer = dict(Counter(_hf_pieces(plain)))
    got = solutions.count_pretokens(plain)
    assert got == peer, (f"expected count_pretokens without special tokens to count the pieces of "
                         f"tokenizers' ByteLevel pre-tokeniser; {len(set(got) ^ set(peer))} words "
                         "are in one table only")


def exercise_2_count_pairs(solutions) -> None:
    got = solutions.count_pairs([[1, 1, 1]], [2])
    assert got == {(1, 1): 4}, (f"expected count_pairs([[1, 1, 1]], [2]) = {{(1, 1): 4}} "
                                f"(two overlapping pairs, each counted twice), got {got}")
    got = solutions.count_pairs([[7], [], [3, 4]], [5, 2, 1])
    assert got == {(3, 4): 1}, (f"expected count_pairs([[7], [], [3, 4]], [5, 2, 1]) = "
                                f"{{(3, 4): 1}} (no pairs in words of length 0 or 1), got {got}")
    table = count_pretokens(_corpus(), (EOT,))
    words, freqs = [list(w) for w in table], list(table.values())
    got = solutions.count_pairs(words, freqs)
    want = count_pairs(words, freqs)
    if got != want:
        wrong = sorted(set(got) ^ set(want) | {p for p in set(got) & set(want) if got[p] != want[p]})
        p = wrong[0]
        raise AssertionError(f"expected the pair counts of the corpus's word table to equal the "
                             f"book's; {len(wrong)} pairs differ, e.g. {p}: expected "
                             f"{want.get(p)}, got {got.get(p)}")


def exercise_2_merge_pair(solutions) -> None:
    cases = [([1, 2, 2, 2], (2, 2), 9), ([5, 5, 5, 5], (5, 5), 7), ([5, 5, 5], (5, 5), 7),
             ([1, 2, 3], (3, 4), 8), ([], (1, 2), 3), ([1], (1, 1), 3), ([1, 2, 1, 2], (1, 2), 0),
             ([2, 1, 2, 1], (1, 2), 6)]
    rng = random.Random(1)
    cases += [([rng.randrange(4) for _ in range(rng.randrange(12))],
               (rng.randrange(4), rng.randrange(4)), 300 + k) for k in range(200)]
    for word, pair, new_id in cases:
        before = list(word)
        got = solutions.merge_pair(word, pair, new_id)
        want = merge_pair(before, pair, new_id)
        assert got == want, (f"expected merge_pair({before}, {pair}, {new_id}) = {want} "
                             f"(occurrences replaced left to right, without overlapping), got {got}")
        assert word == before, (f"expected merge_pair to leave its word unchanged, but {before} "
                                f"became {word}")


def _train_message(got: tuple, want: tuple, what: str, text: str,
                   specials: list[str]) -> str:
    """Why the reader's ``(vocab, merges)`` is not the book's: the first merge that differs,
    with the pair counts at that step (recounted from the merges that agree)."""
    (got_vocab, got_merges), (want_vocab, want_merges) = got, want
    if got_merges != want_merges:
        k = next((k for k, (g, w) in enumerate(zip(got_merges, want_merges, strict=False))
                  if g != w), min(len(got_merges), len(want_merges)))
        if k >= min(len(got_merges), len(want_merges)):
            return (f"expected {len(want_merges)} merges on {what}, got {len(got_merges)} (the "
                    f"first {k} agree)")
        shared = BPETokenizer(want_vocab, want_merges[:k], specials)
        table = count_pretokens(text, tuple(specials))
        words = [shared.encode(w.decode("utf-8")) for w in table]
        counts = {(shared.vocab[a], shared.vocab[b]): n
                  for (a, b), n in count_pairs(words, list(table.values())).items()}
        top = max(counts.values())
        tied = sorted(p for p, n in counts.items() if n == top)
        mine = counts.get(got_merges[k], 0)
        if mine == top:
            why = (f"{len(tied)} pairs tie for the highest count {top} there and yours took "
                   f"another than the smallest (the book's rule: compare the pairs' bytes, "
                   f"left token first)")
        else:
            why = f"your pair occurs {mine} times there, the book's {top} times (the highest)"
        agree = ("the very first merge" if k == 0 else "the first merge agrees" if k == 1
                 else f"the first {k} merges agree")
        return (f"expected merge {k} on {what} to be {want_merges[k]!r}, got "
                f"{got_merges[k]!r} ({agree}): {why}")
    wrong = sorted(set(got_vocab) ^ set(want_vocab)
                   | {i for i in set(got_vocab) & set(want_vocab) if got_vocab[i] != want_vocab[i]})
    i = wrong[0]
    return (f"expected the vocabulary on {what} to be the book's (bytes, then the special tokens, "
            f"then the merges); {len(wrong)} ids differ, e.g. id {i}: expected "
            f"{want_vocab.get(i)!r}, got {got_vocab.get(i)!r}")


def exercise_3_train_bpe_matches_the_book(solutions) -> None:
    text_ws = "low\n" * 5 + "lower\n" * 2 + "newest\n" * 6 + "widest\n" * 3  # e-s and s-t tie at 9
    corpus = _corpus()
    cases = [("aaabdaaabac", 259, [], "'aaabdaaabac'"),
             (text_ws, 262, [], "the words low, lower, newest, widest (ties from the first merge)"),
             ("ab ab", 1000, [], "'ab ab' (training stops when no pair is left)"),
             (f"x{EOT}y{EOT}xy", 258, [EOT], "a text with a special token (one merge)"),
             (corpus, 257 + MERGES, [EOT], f"20 kB of the book's corpus with {EOT!r} ({MERGES} merges)")]
    for text, vocab_size, specials, what in cases:
        got = solutions.train_bpe(text, vocab_size, specials)
        want = _book_model() if text is corpus else train_bpe(text, vocab_size, specials)
        assert isinstance(got, tuple) and len(got) == 2, (
            f"expected train_bpe to return (vocab, merges), got a {type(got).__name__}")
        got = (dict(got[0]), [tuple(m) for m in got[1]])
        assert got == want, _train_message(got, want, what, text, specials)
    for text, vocab_size, specials, what in [("abc", 255, [], "vocab_size=255"),
                                              ("abc", 256, [EOT], "vocab_size=256 with one special token"),
                                              ("", 300, [], "an empty text")]:
        with raises(ValueError, what=f"train_bpe with {what}"):
            solutions.train_bpe(text, vocab_size, specials)


def _tiktoken_encoding(vocab: dict[int, bytes], specials: list[str]):
    """``tiktoken`` on the book's layout: each token's id is its rank, GPT-2's pattern."""
    import tiktoken

    special_ids = {vocab[256 + k].decode(): 256 + k for k in range(len(specials))}
    ranks = {tok: i for i, tok in vocab.items() if not 256 <= i < 256 + len(specials)}
    return tiktoken.Encoding("build1", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens=special_ids)


def exercise_4_encode_matches_the_book_tokenizers_and_tiktoken(solutions) -> None:
    # the rank decides, not the position: b+c (rank 0) goes before a+b (rank 1)
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"bc", 257: b"ab"}
    got = solutions.encode("abc", vocab, [(b"b", b"c"), (b"a", b"b")], [])
    assert got == [97, 256], (f"expected encode('abc') with merges [(b'b', b'c'), (b'a', b'b')] "
                              f"to be [97, 256] (a, bc: the lowest-ranked merge first), got {got}")
    vocab, merges = _book_model()
    got = solutions.encode(f"{EOT}{EOT}", vocab, merges, [EOT])
    assert got == [256, 256], (f"expected two special tokens {EOT!r} to be two ids [256, 256] "
                               f"(a special token is cut out first and never split), got {got}")
    book = BPETokenizer(vocab, merges, [EOT])
    hf = hf_tokenizer_from_bpe(vocab, merges, [EOT])
    tk = _tiktoken_encoding(vocab, [EOT])
    for text in [*TEXTS, *SPECIAL_TEXTS, _held_out()]:
        got = solutions.encode(text, vocab, merges, [EOT])
        want = book.encode(text)
        assert got == want, (f"expected encode({text[:40]!r}...) to give the book's ids, "
                             f"{_first_difference(got, want)}")
        peer = hf.encode(text).ids
        assert got == peer, (f"expected encode({text[:40]!r}...) to give tokenizers' ids, "
                             f"{_first_difference(got, peer)}")
        peer = tk.encode(text, allowed_special="all")
        assert got == peer, (f"expected encode({text[:40]!r}...) to give tiktoken's ids, "
                             f"{_first_difference(got, peer)}")
    got = solutions.encode(f"a{EOT}b", vocab, merges, [])
    want = BPETokenizer(vocab, merges).encode(f"a{EOT}b")
    assert got == want, (f"expected {EOT!r} to be ordinary text when special_tokens is empty "
                         f"(ids {want}), got {got}")


def exercise_5_decode_matches_the_book_and_tokenizers(solutions) -> None:
    vocab, merges = _book_model()
    book = BPETokenizer(vocab, merges, [EOT])
    hf = hf_tokenizer_from_bpe(vocab, merges, [EOT])
    east = list("東".encode())  # three single-byte tokens
    cut = [list("🙂".encode())[:3], east[:2], [0xFF, 65], east[:2] + [65] + east[2:],
           [book.encode("é")[0]] + east[:1], [max(vocab)] + east[1:]]
    for ids in [east, *cut]:
        got = solutions.decode(ids, vocab)
        want = book.decode(ids)
        peer = hf.decode(ids, skip_special_tokens=False)
        assert want == peer, f"the book's decode {want!r} and tokenizers' {peer!r} differ on {ids}"
        assert got == want, (f"expected decode({ids}) = {want!r} (the joined bytes read as UTF-8, "
                             f"invalid sequences replaced by U+FFFD), got {got!r}")
    for text in [*TEXTS, *SPECIAL_TEXTS, _held_out()[:3000]]:
        ids = book.encode(text)
        got = solutions.decode(ids, vocab)
        assert got == text, (f"expected decode(encode(text)) to give the text back, "
                             f"{_first_difference(list(got), list(text))} (text {text[:40]!r}...)")
    with raises(ValueError, match="99999", what="decode([65, 66, 99999], vocab)"):
        solutions.decode([65, 66, 99999], vocab)


def exercise_6_end_to_end_equals_tokenizers(solutions) -> None:
    # 1. the reader's trainer, encoder and decoder on the book's corpus; tokenizers' encoder,
    #    given the reader's merges, must give the same ids
    vocab, merges = solutions.train_bpe(_corpus(), 257 + MERGES, [EOT])
    vocab, merges = dict(vocab), [tuple(m) for m in merges]
    assert (vocab, merges) == _book_model(), (
        "expected your train_bpe to learn the book's vocabulary and merges on 20 kB of the "
        "corpus; it does not (exercise 3 says where they part)")
    hf = hf_tokenizer_from_bpe(vocab, merges, [EOT])
    for text in [*TEXTS, *SPECIAL_TEXTS, _held_out()]:
        ids = solutions.encode(text, vocab, merges, [EOT])
        peer = hf.encode(text).ids
        assert ids == peer, (f"expected your encode, with your trained merges, to give the ids of "
                             f"tokenizers' BPE model given the same merges, on {text[:40]!r}...: "
                             f"{_first_difference(ids, peer)}")
        back = solutions.decode(ids, vocab)
        assert back == text, (f"expected decode(encode(text)) to give the text back, "
                              f"{_first_difference(list(back), list(text))}")
    # 2. tokenizers' own trainer on a corpus on which no step of training is a tie: the same
    #    merges, and the same tokens (ids equal after translating tokenizers' byte and special
    #    ids, which it lays out in another order: the special token first, bytes by character)
    text = _markov_text(MARKOV_SEED, MARKOV_CHARS)
    vocab_size = 257 + MARKOV_MERGES
    vocab, merges = solutions.train_bpe(text, vocab_size, [EOT])
    vocab, merges = dict(vocab), [tuple(m) for m in merges]
    peer = train_hf_bpe(text, vocab_size, [EOT])
    peer_merges = _hf_merges(peer)
    assert merges == peer_merges, (
        f"expected your train_bpe on {MARKOV_CHARS} characters of random text (a corpus without "
        f"ties) to learn tokenizers' {MARKOV_MERGES} merges, {_first_difference(merges, peer_merges)}")
    id_of = {tok: i for i, tok in vocab.items()}
    specials = {EOT}
    for sample in (_markov_text(MARKOV_SEED + 1, 3000), f"{EOT}retina in shadow{EOT}"):
        ids = solutions.encode(sample, vocab, merges, [EOT])
        translated = [id_of[t.encode() if t in specials else gpt2_string_to_token(t)]
                      for t in peer.encode(sample).tokens]
        assert ids == translated, (
            f"expected your encode, with your trained merges, to give tokenizers' tokens on "
            f"{sample[:40]!r}...: {_first_difference(ids, translated)}")
