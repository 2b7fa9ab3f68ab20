"""The build-it-yourself unit of Part I (a byte-level BPE tokenizer): its checks pass on the
reference (the book's own code plugged in, ``llmbook/workbench/units/build1_tokenizer.py``)
and on a plain version of every function written here from the docstrings, each planted
bug fails its exercise with a message that names the problem while the exercises that do
not call the broken function still pass, every exercise has a check, the end-to-end
exercise's corpus really has no tie, and the generated stub grades as not attempted."""

from __future__ import annotations

import importlib
import inspect
import re
import types
from collections import Counter
from collections.abc import Sequence

import pytest
import regex

from llmbook.text.tokenizer import GPT2_SPLIT_PATTERN as BOOK_PATTERN
from llmbook.text.tokenizer import train_bpe
from llmbook.workbench.solutions import load_solutions

STEM = "build1_tokenizer"
reference = importlib.import_module(f"llmbook.workbench.units.{STEM}")
checks = importlib.import_module("llmbook.workbench.checks.build1")

CHECKS = {name: f for name, f in vars(checks).items()
          if name.startswith("exercise_") and inspect.isfunction(f)}
NAMES = ("pretokenize", "split_on_special_tokens", "count_pretokens", "count_pairs", "merge_pair",
         "train_bpe", "encode", "decode")
LAST = max(checks.EXERCISES)


def _number(name: str) -> int:
    return int(re.match(r"exercise_(\d+)_", name).group(1))


def _uses(name: str) -> set[str]:
    return set(re.findall(r"solutions\.(\w+)", inspect.getsource(CHECKS[name])))


def _with(source: object = reference, **replaced) -> types.SimpleNamespace:
    """The functions of ``source`` (the reference by default), with some replaced."""
    found = {n: getattr(source, n) for n in NAMES}
    found.update(replaced)
    return types.SimpleNamespace(**found)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_reference_passes(name: str) -> None:
    CHECKS[name](reference)


def test_the_end_to_end_exercise_runs_trainer_encoder_and_decoder_together() -> None:
    assert {u for n in CHECKS if _number(n) == LAST for u in _uses(n)} == {"train_bpe", "encode",
                                                                          "decode"}


def test_the_given_pattern_is_the_books() -> None:
    assert reference.GPT2_SPLIT_PATTERN == BOOK_PATTERN


def test_the_end_to_end_corpus_has_no_tie() -> None:
    """Exercise 6 compares the reader's trainer with tokenizers' BpeTrainer, whose tie rule is
    neither of the book's: on its corpus the two book rules must learn the same merges, which
    happens only when no step has two pairs tied for the highest count."""
    text = checks._markov_text(checks.MARKOV_SEED, checks.MARKOV_CHARS)
    size = 257 + checks.MARKOV_MERGES
    smallest = train_bpe(text, size, [checks.EOT], tie_break="smallest")
    largest = train_bpe(text, size, [checks.EOT], tie_break="largest")
    assert smallest == largest and len(smallest[1]) == checks.MARKOV_MERGES
    assert text[:40] == checks._markov_text(checks.MARKOV_SEED, 40)  # a prefix of the same stream


def test_tokenizers_numbers_the_merges_as_the_book_does() -> None:
    """With one special token the two layouts differ only below 257 (tokenizers puts the
    special token at 0 and the bytes in the order of their characters), so the trained
    tokens of exercise 6 have equal ids, not only equal bytes."""
    from llmbook.text.tokenizer import gpt2_string_to_token, train_hf_bpe

    text = checks._markov_text(checks.MARKOV_SEED, checks.MARKOV_CHARS)
    size = 257 + checks.MARKOV_MERGES
    vocab, _ = train_bpe(text, size, [checks.EOT])
    peer = train_hf_bpe(text, size, [checks.EOT])
    assert peer.token_to_id(checks.EOT) == 0 and vocab[256] == checks.EOT.encode()
    for i in range(257, size):
        assert gpt2_string_to_token(peer.id_to_token(i)) == vocab[i]


def test_on_the_books_corpus_the_trainers_part_at_a_tie() -> None:
    """Why exercise 6 needs its own corpus: on the book's, tokenizers' trainer parts from the
    book's under either tie rule within the first few dozen merges."""
    from llmbook.text.tokenizer import train_hf_bpe

    text = checks._corpus()
    peer = checks._hf_merges(train_hf_bpe(text, 257 + checks.MERGES, [checks.EOT]))
    for rule in ("smallest", "largest"):
        ours = train_bpe(text, 257 + checks.MERGES, [checks.EOT], tie_break=rule)[1]
        assert ours != peer
        first = next(k for k, (a, b) in enumerate(zip(ours, peer, strict=True)) if a != b)
        assert first < 60


# ---------------------------------------------------------------- a reader's plain version

_SPLIT = regex.compile(reference.GPT2_SPLIT_PATTERN)
CHAPTER_1 = load_solutions("01_tokens")


def plain_pretokenize(text: str) -> list[str]:
    return _SPLIT.findall(text)


def plain_split_on_special_tokens(text: str, special_tokens: Sequence[str]) -> list[tuple[str, bool]]:
    if not special_tokens:
        return [(text, False)] if text else []
    ordered = sorted(special_tokens, key=len, reverse=True)
    pattern = "(" + "|".join(regex.escape(s) for s in ordered) + ")"
    return [(piece, i % 2 == 1) for i, piece in enumerate(regex.split(pattern, text)) if piece]


def plain_count_pretokens(text: str, special_tokens: Sequence[str] = ()) -> dict[bytes, int]:
    counts: Counter[bytes] = Counter()
    for piece, special in plain_split_on_special_tokens(text, special_tokens):
        if not special:
            counts.update(p.encode("utf-8") for p in plain_pretokenize(piece))
    return dict(counts)


def plain_count_pairs(words: list[list[int]], freqs: list[int]) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for word, f in zip(words, freqs, strict=True):
        for pair in zip(word, word[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + f
    return counts


def plain_merge_pair(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def _train(text, vocab_size, special_tokens, pick) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """BPE by recounting after every merge; ``pick(counts, vocab)`` chooses the pair."""
    if vocab_size < 256 + len(special_tokens) or text == "":
        raise ValueError("vocab_size below 256 + the special tokens, or an empty text")
    vocab = {i: bytes([i]) for i in range(256)}
    for tok in special_tokens:
        vocab[len(vocab)] = tok.encode("utf-8")
    table = plain_count_pretokens(text, special_tokens)
    words, freqs = [list(w) for w in table], list(table.values())
    id_of = {bytes([i]): i for i in range(256)}
    merges = []
    while len(vocab) < vocab_size:
        counts = plain_count_pairs(words, freqs)
        if not counts:
            break
        best = pick(counts, vocab)
        merged = vocab[best[0]] + vocab[best[1]]
        if merged not in id_of:
            id_of[merged] = len(vocab)
            vocab[len(vocab)] = merged
        merges.append((vocab[best[0]], vocab[best[1]]))
        words = [plain_merge_pair(w, best, id_of[merged]) for w in words]
    return vocab, merges


def _smallest_of_the_most_frequent(counts, vocab):
    top = max(counts.values())
    return min((p for p, n in counts.items() if n == top), key=lambda p: (vocab[p[0]], vocab[p[1]]))


def plain_train_bpe(text: str, vocab_size: int, special_tokens: Sequence[str] = ()
                    ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    return _train(text, vocab_size, special_tokens, _smallest_of_the_most_frequent)


def plain_encode(text: str, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
                 special_tokens: Sequence[str] = ()) -> list[int]:
    """Chapter 1's exercise 3 (one pre-token, lowest rank first) on every pre-token."""
    id_of: dict[bytes, int] = {}
    for i in sorted(vocab):
        id_of.setdefault(vocab[i], i)
    out: list[int] = []
    for piece, special in plain_split_on_special_tokens(text, special_tokens):
        if special:
            out.append(id_of[piece.encode("utf-8")])
            continue
        for pretoken in plain_pretokenize(piece):
            out += [id_of[t] for t in CHAPTER_1.bpe_encode_word(pretoken.encode("utf-8"), merges)]
    return out


def plain_decode(ids: list[int], vocab: dict[int, bytes]) -> str:
    for pos, i in enumerate(ids):
        if i not in vocab:
            raise ValueError(f"id {i} at position {pos} is not in the vocabulary")
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


PLAIN = types.SimpleNamespace(**{n: globals()[f"plain_{n}"] for n in NAMES})


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_plain_version_passes_too(name: str) -> None:
    """Written from the docstrings alone, recounting every pair after each merge."""
    CHECKS[name](PLAIN)


# ---------------------------------------------------------------- planted bugs

_NO_LOOKAHEAD = regex.compile(reference.GPT2_SPLIT_PATTERN.replace(r"\s+(?!\S)|", ""))


def pretokenize_without_the_lookahead(text):
    return _NO_LOOKAHEAD.findall(text)  # "  end" -> "  ", "end": the space no longer starts the word


def split_in_the_given_order(text, special_tokens):
    if not special_tokens:
        return [(text, False)] if text else []
    pattern = "(" + "|".join(regex.escape(s) for s in special_tokens) + ")"  # not longest first
    return [(piece, i % 2 == 1) for i, piece in enumerate(regex.split(pattern, text)) if piece]


def count_special_tokens_as_text(text, special_tokens=()):
    return plain_count_pretokens(text)


def merge_pair_overlapping(word, pair, new_id):
    # replaces the pair at every position, so [1, 2, 2, 2] with (2, 2) gives [1, 9, 9]
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == tuple(pair):
            out.append(new_id)
            if i + 2 < len(word) and (word[i + 1], word[i + 2]) == tuple(pair):
                i += 1
                continue
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def count_pairs_once_per_word(words, freqs):
    counts = {}
    for word, f in zip(words, freqs, strict=True):
        for pair in set(zip(word, word[1:], strict=False)):
            counts[pair] = counts.get(pair, 0) + f
    return counts


def train_ties_to_the_largest(text, vocab_size, special_tokens=()):
    return train_bpe(text, vocab_size, list(special_tokens), tie_break="largest")


def train_ties_to_the_first_seen(text, vocab_size, special_tokens=()):
    """``max(counts, key=counts.get)``: ties go to the pair counted first, not the smallest."""
    return _train(text, vocab_size, special_tokens, lambda counts, vocab: max(counts, key=counts.get))


def encode_highest_rank_first(text, vocab, merges, special_tokens=()):
    """``max`` for ``min``: the merge learned last goes first (the merges, reversed)."""
    return plain_encode(text, vocab, list(reversed(merges)), special_tokens)


def encode_special_tokens_as_text(text, vocab, merges, special_tokens=()):
    return plain_encode(text, vocab, merges, ())


def decode_token_by_token(ids, vocab):
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def decode_dropping_invalid_bytes(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="ignore")


def decode_skipping_unknown_ids(ids, vocab):
    return b"".join(vocab[i] for i in ids if i in vocab).decode("utf-8", errors="replace")


#: (the function replaced, the bug, the exercises that must fail, what the message must say)
BUGS = [
    ("pretokenize", pretokenize_without_the_lookahead, {1},
     r"GPT-2's pre-tokens, at position 4: expected ' ', got '  '"),
    ("split_on_special_tokens", split_in_the_given_order, {1}, r"the longer special token wins"),
    ("count_pretokens", count_special_tokens_as_text, {1}, r"cut out of the text before pre-tokenisation"),
    ("merge_pair", merge_pair_overlapping, {2}, r"= \[1, 9, 2\] \(occurrences replaced left to right, "
                                                r"without overlapping\), got \[1, 9, 9\]"),
    ("count_pairs", count_pairs_once_per_word, {2}, r"two overlapping pairs, each counted twice\), "
                                                    r"got \{\(1, 1\): 2\}"),
    ("train_bpe", train_ties_to_the_largest, {3, 6}, r"pairs tie for the highest count .* took "
                                                     r"another than the smallest"),
    ("train_bpe", train_ties_to_the_first_seen, {3, 6}, r"pairs tie for the highest count"),
    ("encode", encode_highest_rank_first, {4, 6}, r"\[97, 256\] \(a, bc: the lowest-ranked merge first\)"),
    ("encode", encode_special_tokens_as_text, {4, 6}, r"two ids \[256, 256\]"),
    ("decode", decode_token_by_token, {5, 6}, r"expected decode\(\[230, 157, 177\]\) = '東'"),
    ("decode", decode_dropping_invalid_bytes, {5}, r"invalid sequences replaced by U\+FFFD\), got ''"),
    ("decode", decode_skipping_unknown_ids, {5}, r"to raise ValueError"),
]


@pytest.mark.parametrize("name, bug, failing, message", BUGS, ids=[b[1].__name__ for b in BUGS])
def test_a_planted_bug_fails_its_exercise_and_only_where_it_is_used(name, bug, failing, message):
    answers = _with(**{name: bug})
    for check_name, check in sorted(CHECKS.items(), key=lambda kv: _number(kv[0])):
        n = _number(check_name)
        if n in failing and name in _uses(check_name) | ({"train_bpe", "encode", "decode"}
                                                         if n == LAST else set()):
            with pytest.raises(AssertionError, match=message if n == min(failing) else None):
                check(answers)
        else:
            assert n == LAST or name not in _uses(check_name)
            check(answers)


def test_the_end_to_end_check_says_where_it_went_wrong():
    with pytest.raises(AssertionError, match=r"learn the book's vocabulary and merges .* "
                                             r"\(exercise 3 says where they part"):
        checks.exercise_6_end_to_end_equals_tokenizers(_with(train_bpe=train_ties_to_the_largest))
    with pytest.raises(AssertionError, match=r"ids of tokenizers' BPE model given the same merges"):
        checks.exercise_6_end_to_end_equals_tokenizers(_with(encode=encode_highest_rank_first))
    with pytest.raises(AssertionError, match=r"decode\(encode\(text\)\) to give the text back"):
        checks.exercise_6_end_to_end_equals_tokenizers(_with(decode=decode_token_by_token))


def test_a_trainer_with_the_wrong_layout_fails_on_the_vocabulary():
    """Special tokens after the merges instead of before: the merges agree, the ids do not."""
    def specials_last(text, vocab_size, special_tokens=()):
        vocab, merges = plain_train_bpe(text, vocab_size, special_tokens)
        specials = range(256, 256 + len(special_tokens))
        order = [i for i in sorted(vocab) if i not in specials] + list(specials)
        return {k: vocab[i] for k, i in enumerate(order)}, merges

    with pytest.raises(AssertionError, match=r"expected the vocabulary on a text with a special "
                                             r"token .* id 256: expected b'<\|endoftext\|>'"):
        checks.exercise_3_train_bpe_matches_the_book(_with(PLAIN, train_bpe=specials_last))


# ---------------------------------------------------------------- the stub and the grader

def test_the_stub_grades_as_not_attempted_and_the_reference_as_passed(tmp_path):
    from llmbook.workbench.grader import grade
    from llmbook.workbench.runner import NOT_ATTEMPTED, PASSED
    from llmbook.workbench.stubs import make_stub

    source = inspect.getsource(reference)
    stub = tmp_path / f"{STEM}.py"
    stub.write_text(make_stub(source, STEM), encoding="utf-8")
    text = stub.read_text(encoding="utf-8")
    assert "from llmbook" not in text and "GPT2_SPLIT_PATTERN = (" in text
    rows = grade("build-I", stub)
    assert [r.exercise for r in rows] == sorted(checks.EXERCISES)
    assert all(r.status == NOT_ATTEMPTED for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
    mine = tmp_path / "mine.py"
    mine.write_text(source, encoding="utf-8")
    rows = grade("build-I", mine)
    assert all(r.status == PASSED for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
