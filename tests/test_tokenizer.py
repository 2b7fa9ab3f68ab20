"""Unit tests of llmbook.text.tokenizer: worked examples, properties, bad input (notebooks/01_tokens)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from llmbook.text.corpus import load_stdlib_docs, stdlib_docs_path
from llmbook.text.tokenizer import (
    GPT2_SPLIT_PATTERN,
    PRETOKENIZERS,
    BPETokenizer,
    PreTokenizer,
    bytes_to_unicode,
    count_pairs,
    count_pretokens,
    get_pretokenizer,
    gpt2_string_to_token,
    load_text,
    merge_pair,
    pretokenize,
    read_gpt2_files,
    split_on_special_tokens,
    token_to_gpt2_string,
    train_bpe,
    train_bpe_naive,
    unicode_to_bytes,
)

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def small_tokenizer() -> BPETokenizer:
    vocab, merges = train_bpe(load_stdlib_docs(60_000), 600, [EOT, "<|pad|>"])
    return BPETokenizer(vocab, merges, [EOT, "<|pad|>"])


# -- the byte alphabet and pre-tokenisation -------------------------------------------------

def test_bytes_to_unicode_is_a_bijection_onto_printable_characters():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert not any(c.isspace() for c in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert table[0] == "\u0100" and table[0xAD] == "Ń"  # first and last shifted bytes
    assert unicode_to_bytes() == {c: b for b, c in table.items()}


def test_gpt2_strings_round_trip_and_reject_foreign_characters():
    assert token_to_gpt2_string(b" the") == "Ġthe"
    assert gpt2_string_to_token("Ġthe") == b" the"
    every_byte = bytes(range(256))
    assert gpt2_string_to_token(token_to_gpt2_string(every_byte)) == every_byte
    with pytest.raises(ValueError, match="U\\+0020"):
        gpt2_string_to_token("a b")
    with pytest.raises(TypeError, match="expected bytes"):
        token_to_gpt2_string("the")


def test_pretokenize_gpt2_pattern_worked_example():
    assert pretokenize("Hello, world's  end\n\n  x") == [
        "Hello", ",", " world", "'s", " ", " end", "\n\n ", " x"]
    assert pretokenize("I'm 2024's 3.14") == ["I", "'m", " 2024", "'s", " 3", ".", "14"]
    with pytest.raises(TypeError, match="expected str"):
        pretokenize(b"bytes")


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_pretokens_concatenate_to_the_text(text):
    assert "".join(pretokenize(text)) == text


def test_split_on_special_tokens_longest_first():
    specials = ["<|a|>", "<|a|><|b|>"]
    assert split_on_special_tokens("x<|a|><|b|>y<|a|>", specials) == [
        ("x", False), ("<|a|><|b|>", True), ("y", False), ("<|a|>", True)]
    assert split_on_special_tokens("plain", []) == [("plain", False)]
    assert split_on_special_tokens("", []) == []


# -- training: the worked example --------------------------------------------------------

def test_worked_example_aaabdaaabac():
    """Pair counts in 'aaabdaaabac': aa 4 (overlapping), ab 2, others 1 -> merge aa (id 256).
    Then 'aa a b d aa a b a c': (aa, a) 2 and (a, b) 2 tie; b"a" < b"aa" so (a, b) wins
    (id 257). Then (aa, ab) 2 -> 'aaab' (id 258); then all pairs count 1 and the
    smallest is (a, c) -> 'ac' (id 259)."""
    vocab, merges = train_bpe("aaabdaaabac", 260)
    assert merges == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab"), (b"a", b"c")]
    assert [vocab[i] for i in range(256, 260)] == [b"aa", b"ab", b"aaab", b"ac"]
    assert count_pairs([list(b"aaabdaaabac")], [1])[(97, 97)] == 4
    three = BPETokenizer(*train_bpe("aaabdaaabac", 259))
    assert three.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert three.encode("aaab") == [258] and three.encode("ba") == [98, 97]


def test_worked_example_with_spaces_and_special_tokens():
    text = "low lower<|endoftext|>low lowest"
    assert count_pretokens(text, (EOT,)) == {b"low": 2, b" lower": 1, b" lowest": 1}
    vocab, merges = train_bpe(text, 256 + 1 + 3, [EOT])
    assert vocab[256] == EOT.encode()
    # (l,o) and (o,w) occur 4 times, (' ',l) and (w,e) twice: (l, o) is the smaller byte pair
    assert merges == [(b"l", b"o"), (b"lo", b"w"), (b" ", b"low")]
    tok = BPETokenizer(vocab, merges, [EOT])
    assert tok.encode("low lower" + EOT) == [258, 259, 101, 114, 256]


# -- training: the tie-breaking rule ---------------------------------------------------------

def test_tie_break_largest_worked_example_aaabdaaabac():
    """After merge 1 (a, a), the pairs (aa, a) and (a, b) both occur twice. "smallest" takes
    (a, b) because b"a" < b"aa"; "largest" takes (aa, a). Both reach 'aaab' at merge 3, by
    different routes; at merge 4 every pair counts 1 and the rules pick opposite ends:
    (a, c) against (d, aaab), since b"d" is the greatest left side."""
    smallest = train_bpe("aaabdaaabac", 260, tie_break="smallest")
    largest = train_bpe("aaabdaaabac", 260, tie_break="largest")
    assert smallest == train_bpe("aaabdaaabac", 260)  # the default is unchanged
    assert smallest[1] == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab"), (b"a", b"c")]
    assert largest[1] == [(b"a", b"a"), (b"aa", b"a"), (b"aaa", b"b"), (b"d", b"aaab")]
    assert [largest[0][i] for i in range(256, 260)] == [b"aa", b"aaa", b"aaab", b"daaab"]
    # the same ids for the training word after three merges, different tokens for 'ab'
    three_s = BPETokenizer(*train_bpe("aaabdaaabac", 259, tie_break="smallest"))
    three_l = BPETokenizer(*train_bpe("aaabdaaabac", 259, tie_break="largest"))
    assert three_s.encode("aaabdaaabac") == three_l.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert three_s.encode("ab") == [257] and three_l.encode("ab") == [97, 98]
    assert three_l.encode("aaa") == [257]


def test_tie_break_largest_with_spaces_and_special_tokens():
    """(l, o) and (o, w) tie at 4: "largest" takes (o, w); then (l, ow) 4; then (' ', low)
    and (low, e) tie at 2 and b"low" > b" " decides."""
    text = "low lower<|endoftext|>low lowest"
    vocab, merges = train_bpe(text, 256 + 1 + 3, [EOT], tie_break="largest")
    assert merges == [(b"o", b"w"), (b"l", b"ow"), (b"low", b"e")]
    assert train_bpe_naive(text, 260, [EOT], tie_break="largest") == (vocab, merges)
    tok = BPETokenizer(vocab, merges, [EOT])
    assert tok.encode("low lower" + EOT) == [258, 32, 259, 114, 256]


def _merges_until_first_tie(text: str, merges: list[tuple[bytes, bytes]]) -> int:
    """Replay ``merges`` on the pre-tokens of ``text`` with bytes tokens and return how many
    of them were chosen with a unique highest count (the index of the first tied step, or
    ``len(merges)`` if no step was tied). Independent of the trainers: plain recounting."""
    words = [[bytes([b]) for b in w] for w in count_pretokens(text)]
    freqs = list(count_pretokens(text).values())
    for step, (left, right) in enumerate(merges):
        counts: dict[tuple[bytes, bytes], int] = {}
        for w, f in zip(words, freqs, strict=True):
            for pair in zip(w, w[1:], strict=False):
                counts[pair] = counts.get(pair, 0) + f
        top = max(counts.values())
        if sum(n == top for n in counts.values()) > 1:
            return step
        assert counts[(left, right)] == top  # the learned merge is the most frequent pair
        for i, w in enumerate(words):
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == (left, right):
                    out.append(left + right)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[i] = out
    return len(merges)


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="ab c\n'é", min_size=1, max_size=60),
       st.integers(min_value=257, max_value=300))
def test_tie_break_rules_agree_until_the_first_tie(text, vocab_size):
    """Without a tie the two rules learn the same merges; at the first tie they part.

    Both trainers (incremental and naive) agree with each other under either rule."""
    smallest = train_bpe(text, vocab_size, tie_break="smallest")[1]
    largest = train_bpe(text, vocab_size, tie_break="largest")
    assert largest == train_bpe_naive(text, vocab_size, tie_break="largest")
    largest = largest[1]
    first_tie = _merges_until_first_tie(text, smallest)
    assert smallest[:first_tie] == largest[:first_tie]
    if first_tie == len(smallest):  # no tie anywhere: identical training runs
        assert smallest == largest
    else:  # the tied step picks the smallest and the greatest tied pair: different merges
        assert smallest[first_tie] < largest[first_tie]


def test_tie_break_rules_agree_on_a_corpus_without_ties():
    """Pre-tokens b, ' aba', ' ab', ' abaab': the first counts are (a, b) 4, (' ', a) 3,
    (b, a) 2, (a, a) 1, and no later step is tied either (checked by the replay), so both
    rules learn the same four merges, after which no pair is left."""
    text = "b aba ab abaab"
    merges = [(b"a", b"b"), (b" ", b"ab"), (b" ab", b"a"), (b" aba", b"ab")]
    assert train_bpe(text, 262, tie_break="smallest")[1] == merges
    assert _merges_until_first_tie(text, merges) == len(merges)
    assert train_bpe(text, 262, tie_break="largest") == train_bpe(text, 262, tie_break="smallest")
    # pre-tokens 'ab' and ' ba': (a, b), (' ', b), (b, a) all count 1, a tie at once
    tied = "ab ba"
    assert train_bpe(tied, 257)[1] == [(b" ", b"b")]
    assert train_bpe(tied, 257, tie_break="largest")[1] == [(b"b", b"a")]


def test_tie_break_rejects_other_values():
    for bad in ("greatest", "Smallest", "", None, 1):
        with pytest.raises(ValueError, match="tie_break must be 'smallest' or 'largest'"):
            train_bpe("abc", 300, tie_break=bad)
        with pytest.raises(ValueError, match="tie_break must be 'smallest' or 'largest'"):
            train_bpe_naive("abc", 300, tie_break=bad)


def test_merge_pair_does_not_overlap():
    assert merge_pair([1, 2, 2, 2], (2, 2), 9) == [1, 9, 2]
    assert merge_pair([2, 2, 2, 2], (2, 2), 9) == [9, 9]
    assert merge_pair([], (1, 2), 9) == []


@settings(max_examples=25, deadline=None)
@given(st.text(alphabet="ab c\n'é", min_size=1, max_size=60),
       st.integers(min_value=256, max_value=300))
def test_incremental_trainer_equals_naive_trainer(text, vocab_size):
    assert train_bpe(text, vocab_size) == train_bpe_naive(text, vocab_size)


def test_incremental_equals_naive_on_real_text_with_specials():
    text = load_stdlib_docs(20_000).replace("\n\n\n", EOT)
    assert train_bpe(text, 420, [EOT]) == train_bpe_naive(text, 420, [EOT])


def test_vocab_layout_and_merge_count():
    text = load_stdlib_docs(30_000)
    vocab, merges = train_bpe(text, 400, [EOT, "<|pad|>"])
    assert [vocab[i] for i in range(256)] == [bytes([i]) for i in range(256)]
    assert vocab[256] == EOT.encode() and vocab[257] == b"<|pad|>"
    assert len(vocab) == 400 and len(merges) == 400 - 256 - 2
    assert [vocab[258 + k] for k in range(len(merges))] == [a + b for a, b in merges]


def test_training_stops_when_pairs_run_out():
    vocab, merges = train_bpe("ab ab", 1000)
    assert merges == [(b"a", b"b"), (b" ", b"ab")] and len(vocab) == 258


def test_special_tokens_are_never_merged_in_training():
    text = ("xy" + EOT) * 50
    assert train_bpe(text, 300, [EOT])[1] == [(b"x", b"y")]  # then no pairs are left
    as_plain_text = train_bpe(text, 300)[1]  # without the special, its pieces get merged
    assert any(b"|" in a + b for a, b in as_plain_text)


def test_train_from_path_equals_train_from_text(tmp_path):
    path = tmp_path / "corpus.txt"
    text = "naïve café, 東京 🙂 " * 20
    path.write_text(text, encoding="utf-8")
    assert train_bpe(path, 300) == train_bpe(text, 300)
    assert load_text(path) == text


def test_a_str_naming_a_file_is_refused_not_trained_on(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text("hello world " * 10, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'corpus.txt' is the name of an existing file.*"
                                         r"pass pathlib.Path\('corpus.txt'\)"):
        train_bpe("corpus.txt", 300)
    with pytest.raises(ValueError, match="existing file"):
        load_text(str(tmp_path / "corpus.txt"))
    assert load_text("corpus.txt\n") == "corpus.txt\n"  # text with a newline is text
    assert load_text("another.txt") == "another.txt"  # no such file: the text itself


# -- training: bad input -------------------------------------------------------------------

def test_training_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=257 is below 256 bytes \\+ 2 special"):
        train_bpe("abc", 257, [EOT, "<|pad|>"])
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
        train_bpe("abc", 300.0)
    with pytest.raises(ValueError, match="empty corpus"):
        train_bpe("", 300)
    with pytest.raises(ValueError, match="special token '' is empty"):
        train_bpe("abc", 300, [""])
    with pytest.raises(ValueError, match="'<\\|x\\|>' is given more than once"):
        train_bpe("abc", 300, ["<|x|>", "<|x|>"])
    with pytest.raises(TypeError, match="not the single str"):
        train_bpe("abc", 300, EOT)
    with pytest.raises(TypeError, match="is a int, not a str"):
        train_bpe("abc", 300, [7])
    with pytest.raises(TypeError, match="got bytes"):
        train_bpe(b"abc", 300)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("abc café".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt.*not UTF-8.*byte offset 7"):
        train_bpe(bad, 300)
    with pytest.raises(FileNotFoundError):
        train_bpe(tmp_path / "missing.txt", 300)


# -- encoding and decoding -------------------------------------------------------------------

TRICKY = ("Héllo wörld! 你好，世界 🤖🎉 I'm   here, they're 12345 678\n\n\t tabs  \n"
          " trailing   " + EOT + "x<|pad|>" + EOT + " don't'll ")


def test_round_trip_and_special_tokens_kept_whole(small_tokenizer):
    tok = small_tokenizer
    ids = tok.encode(TRICKY)
    assert tok.decode(ids) == TRICKY
    assert ids.count(256) == 2 and ids.count(257) == 1
    assert tok.encode(EOT) == [256]
    assert tok.encode("<|endoftext") != [256]  # an unfinished special token is plain text
    no_specials = BPETokenizer(tok.vocab, tok.merges)
    assert 256 not in no_specials.encode(EOT) and no_specials.decode(no_specials.encode(EOT)) == EOT


@settings(max_examples=80, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=80))
def test_decode_inverts_encode(small_tokenizer, text):
    assert small_tokenizer.decode(small_tokenizer.encode(text)) == text


def test_decode_replaces_invalid_utf8(small_tokenizer):
    tok = small_tokenizer
    ids = tok.encode("é")  # two bytes 0xC3 0xA9
    assert tok.decode_bytes(ids) == "é".encode()
    assert tok.decode([0xC3]) == "\ufffd"
    assert tok.decode([0xC3, ord("a")]) == "\ufffda"


def test_encode_decode_bad_input(small_tokenizer):
    tok = small_tokenizer
    with pytest.raises(ValueError, match="id 600 at position 1 is not in the vocabulary"):
        tok.decode([5, 600])
    with pytest.raises(ValueError, match="id -1 at position 0"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="position 0 is 'a', not an int"):
        tok.decode(["a"])
    with pytest.raises(TypeError, match="decode expects a list of ids, got str"):
        tok.decode("abc")
    with pytest.raises(TypeError, match="encode expects a str, got bytes"):
        tok.encode(b"abc")
    with pytest.raises(TypeError, match="expects strings, got int"):
        list(tok.encode_iterable(["a", 3]))


def test_decode_accepts_numpy_and_torch_integers(small_tokenizer):
    import numpy as np
    import torch

    ids = small_tokenizer.encode("hello world")
    assert small_tokenizer.decode(np.array(ids)) == "hello world"
    assert small_tokenizer.decode(torch.tensor(ids)) == "hello world"


def test_tokenizer_constructor_rejects_bad_input():
    vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ValueError, match="vocab lacks 1 single bytes"):
        BPETokenizer({i: bytes([i]) for i in range(255)}, [])
    with pytest.raises(ValueError, match="merges\\[0\\].*b'ab' is not in the vocab"):
        BPETokenizer(vocab, [(b"a", b"b")])
    with pytest.raises(TypeError, match="merges\\[0\\] must be a pair of bytes"):
        BPETokenizer(vocab, [("a", "b")])
    with pytest.raises(ValueError, match="special token '<\\|eot\\|>' is not in the vocab"):
        BPETokenizer(vocab, [], ["<|eot|>"])
    with pytest.raises(TypeError, match="vocab\\[3\\] must be non-empty bytes"):
        BPETokenizer({**vocab, 3: "x"}, [])
    with pytest.raises(TypeError, match="vocab must be a dict"):
        BPETokenizer(list(vocab.values()), [])


def test_encode_applies_merges_by_rank_not_by_position():
    # merges: (b, c) first, then (a, b): "abc" -> a + bc, not ab + c
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"bc", 257: b"ab"}
    tok = BPETokenizer(vocab, [(b"b", b"c"), (b"a", b"b")])
    assert tok.encode("abc") == [97, 256]
    assert tok.encode("abab") == [257, 257]


def test_tokenizer_accepts_gpt2_id_layout():
    """GPT-2's files do not put the bytes at ids 0..255; any layout must work."""
    vocab = {255 - i: bytes([i]) for i in range(256)} | {300: b"ab", 301: b"<|endoftext|>"}
    tok = BPETokenizer(vocab, [(b"a", b"b")], [EOT])
    assert tok.encode("abc" + EOT) == [300, 255 - ord("c"), 301]
    assert tok.decode([300, 301]) == "ab" + EOT


# -- streaming -----------------------------------------------------------------------------

def test_encode_iterable_over_a_file_equals_encode(small_tokenizer, tmp_path):
    text = load_stdlib_docs(40_000) + "\n" + TRICKY * 3
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8", newline="") as f:
        streamed = list(small_tokenizer.encode_iterable(f, block_chars=500))
    assert streamed == small_tokenizer.encode(text)


STREAM_PIECES = [*"ab 's\n\t.1é🙂", "  ", "\n\n", EOT, "<|pad|>", "<|", "|>", "'r", "'re"]


@pytest.fixture(scope="module")
def stream_tokenizer() -> BPETokenizer:
    """Trained on text made of the pieces the streaming test draws from, so that merges
    such as b"\n\n" and b"  " exist and a wrong cut changes the ids."""
    rng = random.Random(0)
    text = "".join(rng.choice(STREAM_PIECES) for _ in range(20_000))
    vocab, merges = train_bpe(text, 420, [EOT, "<|pad|>"])
    assert (b"\n", b"\n") in merges and (b" ", b" ") in merges
    return BPETokenizer(vocab, merges, [EOT, "<|pad|>"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from(STREAM_PIECES), max_size=6).map("".join), max_size=30),
       st.integers(min_value=1, max_value=12))
def test_encode_iterable_is_exact_for_any_chunking(stream_tokenizer, chunks, block):
    expected = stream_tokenizer.encode("".join(chunks))
    assert list(stream_tokenizer.encode_iterable(chunks, block_chars=block)) == expected


def test_encode_iterable_reads_lazily(small_tokenizer):
    lines = load_stdlib_docs(100_000).splitlines(keepends=True)
    pulled = 0

    def reader():
        nonlocal pulled
        for line in lines:
            pulled += 1
            yield line

    stream = small_tokenizer.encode_iterable(reader(), block_chars=2_000)
    first = [next(stream) for _ in range(100)]
    assert pulled < len(lines) / 10  # the first ids come before most of the text is read
    assert first == small_tokenizer.encode("".join(lines))[:100]
    with pytest.raises(ValueError, match="block_chars must be a positive int"):
        list(small_tokenizer.encode_iterable(["a"], block_chars=0))


# -- GPT-2 files ---------------------------------------------------------------------------

def test_gpt2_files_round_trip(small_tokenizer, tmp_path):
    encoder_json, vocab_bpe = small_tokenizer.save_gpt2_files(tmp_path)
    first_lines = vocab_bpe.read_text(encoding="utf-8").split("\n")[:2]
    a, b = small_tokenizer.merges[0]
    assert first_lines == ["#version: 0.2", f"{token_to_gpt2_string(a)} {token_to_gpt2_string(b)}"]
    again = BPETokenizer.from_gpt2_files(encoder_json, vocab_bpe)
    assert again.vocab == small_tokenizer.vocab and again.merges == small_tokenizer.merges
    assert again.special_tokens == (EOT, "<|pad|>")  # found as neither byte nor merge
    assert again.encode(TRICKY) == small_tokenizer.encode(TRICKY)


def test_gpt2_files_bad_input(small_tokenizer, tmp_path):
    encoder_json, vocab_bpe = small_tokenizer.save_gpt2_files(tmp_path)
    broken = tmp_path / "broken.bpe"
    broken.write_text("#version: 0.2\nĠt h e\n", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.bpe' line 2: expected two tokens"):
        read_gpt2_files(encoder_json, broken)
    foreign = tmp_path / "foreign.bpe"
    foreign.write_text("#version: 0.2\n\u4e00 a\n", encoding="utf-8")
    with pytest.raises(ValueError, match="foreign.bpe' line 2: .*U\\+4E00"):
        read_gpt2_files(encoder_json, foreign)
    not_json = tmp_path / "encoder_bad.json"
    not_json.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="encoder_bad.json' is not valid JSON"):
        read_gpt2_files(not_json, vocab_bpe)
    with pytest.raises(ValueError, match="special token '<\\|nope\\|>' is not in"):
        read_gpt2_files(encoder_json, vocab_bpe, ["<|nope|>"])


# -- the corpus ------------------------------------------------------------------------------

def test_corpus_loader():
    path = stdlib_docs_path()
    assert isinstance(path, Path) and path.name == "stdlib_docs.txt"
    assert 1_200_000 <= path.stat().st_size <= 2_000_000
    head = load_stdlib_docs(1000)
    assert head.startswith("# module abc") and len(head.encode()) <= 1000
    assert load_stdlib_docs().startswith(head)
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        load_stdlib_docs(-1)
    with pytest.raises(TypeError, match="max_bytes must be an int or None"):
        load_stdlib_docs(1.5)


def test_encode_iterable_accepts_a_text_stream(small_tokenizer):
    text = "one\ntwo  three\n\n four"
    assert list(small_tokenizer.encode_iterable(io.StringIO(text))) == small_tokenizer.encode(text)


# -- other pre-tokenisers ----------------------------------------------------------------------

PRE_EXAMPLE = "I'M 2024\n\n  x  1 v1.2 12345\r\n"


def test_pretokenizer_presets_worked_example():
    split = {name: pre.split(PRE_EXAMPLE) for name, pre in PRETOKENIZERS.items()}
    assert split["gpt2"] == pretokenize(PRE_EXAMPLE) == [
        "I", "'", "M", " 2024", "\n\n ", " x", " ", " 1", " v", "1", ".", "2", " 12345", "\r\n"]
    # SmolLM2: every digit apart first, so a space never joins a digit and "  " stays whole
    assert split["smollm"] == [
        "I", "'", "M", " ", "2", "0", "2", "4", "\n\n ", " x", "  ", "1", " v", "1", ".", "2",
        " ", "1", "2", "3", "4", "5", "\r\n"]
    # Qwen2: contractions in any case, single digits, line breaks apart from the spaces after
    assert split["qwen2"] == [
        "I", "'M", " ", "2", "0", "2", "4", "\n\n", " ", " x", " ", " ", "1", " v", "1", ".", "2",
        " ", "1", "2", "3", "4", "5", "\r\n"]
    # cl100k: like Qwen2 but digits in groups of up to three
    assert split["cl100k"][3:5] == ["202", "4"] and split["cl100k"][-3:] == ["123", "45", "\r\n"]
    # o200k: the contraction stays on its word; digits in threes like cl100k
    assert split["o200k"] == [
        "I'M", " ", "202", "4", "\n\n", " ", " x", " ", " ", "1", " v", "1", ".", "2", " ", "123",
        "45", "\r\n"]
    # o200k: a lower-case run after capitals ends a word, capitals before lower case join it
    assert PRETOKENIZERS["o200k"].split("camelCase HTTPServer don't a/b c//\nd") == [
        "camel", "Case", " HTTPServer", " don't", " a", "/b", " c", "//\n", "d"]
    assert PRETOKENIZERS["cl100k"].split("camelCase don't") == ["camelCase", " don", "'t"]


def test_pretokenizer_stage_keeps_the_text_between_matches():
    words = PreTokenizer("words", (r"\p{L}+",))  # matches letters only: the rest are gaps
    assert words.split("ab, cd!") == ["ab", ", ", "cd", "!"]
    two = PreTokenizer("two", (r"\s+", r"\p{N}"))
    assert two.split("a1b  22") == ["a", "1", "b", "  ", "2", "2"]
    assert words.split("") == [] and get_pretokenizer(words) is words
    assert get_pretokenizer("smollm").stages == (r"\p{N}", GPT2_SPLIT_PATTERN)


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_every_preset_splits_into_pieces_that_concatenate_to_the_text(text):
    for pre in PRETOKENIZERS.values():
        assert "".join(pre.split(text)) == text


def test_pretokenizer_bad_input():
    with pytest.raises(ValueError, match="unknown pre-tokenizer 'llama3'; the presets are"):
        get_pretokenizer("llama3")
    with pytest.raises(TypeError, match="preset name or a PreTokenizer"):
        get_pretokenizer(3)
    with pytest.raises(ValueError, match=r"stages\[0\] = '\(' is not a valid regex"):
        PreTokenizer("bad", ("(",))
    with pytest.raises(TypeError, match="non-empty tuple of regex strings"):
        PreTokenizer("bad", r"\s+")
    with pytest.raises(ValueError, match="lookahead must be a positive int or None"):
        PreTokenizer("bad", (r"\s+",), lookahead=0)
    with pytest.raises(ValueError, match="unknown pre-tokenizer"):
        BPETokenizer({i: bytes([i]) for i in range(256)}, [], pretokenizer="gpt-4")


def test_gpt2_default_is_unchanged(small_tokenizer):
    same = BPETokenizer(small_tokenizer.vocab, small_tokenizer.merges, [EOT, "<|pad|>"], "gpt2")
    assert small_tokenizer.pretokenizer is PRETOKENIZERS["gpt2"]
    assert same.encode(TRICKY) == small_tokenizer.encode(TRICKY)
    assert "pretokenizer" not in repr(small_tokenizer)


def test_smollm_preset_changes_only_digits_after_whitespace(small_tokenizer):
    smollm = BPETokenizer(small_tokenizer.vocab, small_tokenizer.merges, [EOT], "smollm")
    assert "pretokenizer='smollm'" in repr(smollm)
    # each digit is its own pre-token, so its own token
    assert [smollm.vocab[i] for i in smollm.encode("x 2024")] == [b"x", b" ", b"2", b"0", b"2", b"4"]
    assert smollm.decode(smollm.encode(TRICKY)) == TRICKY


STREAM_EXTRA = ["\r\n", "   \n", "12345", "'S", "\u3000", "x", "      ", "AB", "Cd", "/", "'ll"]


def whitespace_merges() -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Bytes plus merges that join whitespace and digits in many ways, so that a pre-token
    cut at the wrong place (say a run of spaces split from the line break after it)
    encodes to other ids."""
    merges = [(b"\n", b" "), (b"\n ", b" "), (b" ", b"\n"), (b" ", b" "), (b"\n", b"\n"),
              (b"\r", b"\n"), (b"  ", b"  "), (b"  ", b"\n"), (b"1", b"2"), (b"12", b"3"),
              (b" ", b"1"), (b"x", b" "), (b"'", b"S")]
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return vocab, merges


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(PRETOKENIZERS)),
       st.lists(st.lists(st.sampled_from(STREAM_PIECES + STREAM_EXTRA), max_size=6).map("".join),
                max_size=30),
       st.integers(min_value=1, max_value=12))
@example("qwen2", ["x\n", "    ", "  \n", "x"], 3)
@example("cl100k", ["a\n", "      ", "\n\nb"], 2)
@example("o200k", ["AB", "Cd", "'ll", "AB'", "S/\n"], 1)
def test_encode_iterable_is_exact_for_every_preset(name, chunks, block):
    tok = BPETokenizer(*whitespace_merges(), None, name)  # no specials: cuts come early
    expected = tok.encode("".join(chunks))
    assert list(tok.encode_iterable(chunks, block_chars=block)) == expected


def test_encode_iterable_without_a_lookahead_cuts_only_at_special_tokens(stream_tokenizer):
    unbounded = PreTokenizer("no bound", (GPT2_SPLIT_PATTERN,))  # lookahead=None
    tok = BPETokenizer(stream_tokenizer.vocab, stream_tokenizer.merges, [EOT], unbounded)
    chunks = ["ab ", "ab\n", EOT, "  's", "1.é", EOT, "ab"] * 5
    pulled = []

    def reader():
        for chunk in chunks:
            pulled.append(chunk)
            yield chunk

    stream = tok.encode_iterable(reader(), block_chars=4)
    first = next(stream)
    assert first == tok.encode("ab ab\n")[0] and len(pulled) < len(chunks)  # cut at the EOT
    assert [first, *stream] == tok.encode("".join(chunks))


def test_vocab_without_some_bytes_refuses_only_text_that_needs_them():
    vocab = {i: bytes([i]) for i in range(256) if i != 4}
    with pytest.raises(ValueError, match="vocab lacks 1 single bytes"):
        BPETokenizer(vocab, [])
    tok = BPETokenizer(vocab, [], require_all_bytes=False)
    assert tok.missing_bytes == b"\x04" and tok.encode("ab") == [97, 98]
    with pytest.raises(ValueError, match=r"cannot encode '\\x04' \(U\+0004\): its UTF-8 byte 0x04"):
        tok.encode("a\x04")
