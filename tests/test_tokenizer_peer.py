"""llmbook.text.tokenizer against Hugging Face ``tokenizers`` and ``transformers`` (notebooks/01_tokens).

No downloads: the peers are built locally from our own vocabulary and merges, or
trained locally on the shipped corpus.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.tokenizer import (
    BPETokenizer,
    count_pretokens,
    hf_tokenizer_from_bpe,
    token_to_gpt2_string,
    train_bpe,
    train_hf_bpe,
    train_hf_unigram,
    train_hf_wordpiece,
    unigram_segment,
    wordpiece_segment,
)

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<|pad|>"]
TRICKY = [
    "Héllo wörld! Ça va? naïve café, Zürich, São Paulo",
    "你好，世界。東京は晴れ。 한국어 텍스트",
    "🤖🎉 emoji 👩‍👩‍👧 flags 🇫🇷 skin 👍🏽",
    "digits 3.14159 2024-05-09 1,000,000 ٣٤٥ ½",
    "contractions: I'm you're we've she'll they'd it's don't 'S 'RE",
    "runs   of    spaces\n\n\nand\n newlines\r\n\ttabs\t\t mixed \t\n ",
    "trailing spaces   ",
    "   leading spaces",
    f"special {EOT} kept<|pad|>whole{EOT}{EOT} <|endoftext",
    "def f(x):\n    return x ** 2  # comment\n",
    "",
]


@pytest.fixture(scope="module")
def ours_and_peer():
    vocab, merges = train_bpe(load_stdlib_docs(120_000), 800, SPECIALS)
    return BPETokenizer(vocab, merges, SPECIALS), hf_tokenizer_from_bpe(vocab, merges, SPECIALS)


@pytest.mark.parametrize("text", TRICKY)
def test_encode_equals_hf_tokenizers(ours_and_peer, text):
    ours, peer = ours_and_peer
    ids = ours.encode(text)
    assert ids == peer.encode(text).ids
    assert ours.decode(ids) == peer.decode(ids, skip_special_tokens=False) == text


def test_whole_corpus_slice_equals_hf_tokenizers(ours_and_peer):
    ours, peer = ours_and_peer
    text = load_stdlib_docs(300_000)[-100_000:]
    assert ours.encode(text) == peer.encode(text).ids


def test_special_tokens_match_hf_added_tokens(ours_and_peer):
    ours, peer = ours_and_peer
    text = f"a{EOT}b<|pad|>{EOT}"
    assert ours.encode(text) == peer.encode(text).ids
    assert [ours.vocab[i] for i in ours.encode(text)].count(EOT.encode()) == 2
    assert peer.token_to_id(EOT) == 256 and peer.token_to_id("<|pad|>") == 257


@settings(max_examples=120, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=60))
def test_property_encode_equals_hf_and_round_trips(ours_and_peer, text):
    ours, peer = ours_and_peer
    ids = ours.encode(text)
    assert ids == peer.encode(text).ids
    assert ours.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([*"aé 's\n\t.1🙂", "the", " of", EOT, "<|pad|>", "<|"]),
                max_size=40).map("".join))
def test_property_special_tokens_equal_hf(ours_and_peer, text):
    ours, peer = ours_and_peer
    assert ours.encode(text) == peer.encode(text).ids


def test_gpt2_files_load_in_transformers(ours_and_peer, tmp_path):
    """The files we write are GPT-2's format: transformers' GPT-2 tokenizer reads them
    (as the file paths, and from a local folder under Hugging Face's file names)."""
    from transformers import GPT2Tokenizer, GPT2TokenizerFast

    ours, _ = ours_and_peer
    encoder_json, vocab_bpe = ours.save_gpt2_files(tmp_path)
    from_paths = GPT2Tokenizer(vocab=str(encoder_json), merges=str(vocab_bpe))
    shutil.copy(encoder_json, tmp_path / "vocab.json")
    shutil.copy(vocab_bpe, tmp_path / "merges.txt")
    from_folder = GPT2TokenizerFast.from_pretrained(str(tmp_path), local_files_only=True)
    reloaded = BPETokenizer.from_gpt2_files(encoder_json, vocab_bpe)
    assert len(from_folder) == ours.vocab_size
    for text in TRICKY[:-1]:
        plain = text.replace("<|pad|>", "")  # transformers knows only <|endoftext|> as special
        ids = ours.encode(plain)
        assert from_paths(plain)["input_ids"] == ids
        assert from_folder(plain)["input_ids"] == ids
        assert reloaded.encode(plain) == ids
        assert from_folder.decode(ids) == plain


def test_compression_within_2_percent_of_hf_trainer():
    """Both trainers on the same 200 KB to V = 1000: bytes per token within 2%."""
    text = load_stdlib_docs(200_000)
    n_bytes = len(text.encode("utf-8"))
    ours = BPETokenizer(*train_bpe(text, 1000, [EOT]), [EOT])
    peer = train_hf_bpe(text, 1000, [EOT])
    assert peer.get_vocab_size() == ours.vocab_size == 1000
    ratio_ours = n_bytes / len(ours.encode(text))
    ratio_peer = n_bytes / len(peer.encode(text).ids)
    assert ratio_ours > 2.5  # real compression, not a degenerate tokenizer
    assert abs(ratio_ours / ratio_peer - 1) < 0.02


def test_overlapping_special_tokens_longest_first_like_hf():
    """With "<|a|>" and "<|a|><|b|>" both special, the longer one wins where both match
    (tokenizers matches added tokens leftmost-longest)."""
    specials = ["<|a|>", "<|a|><|b|>"]
    vocab, merges = train_bpe("some text <|a|> and <|b|> more text", 300, specials)
    ours = BPETokenizer(vocab, merges, specials)
    peer = hf_tokenizer_from_bpe(vocab, merges, specials)
    for text in ["x<|a|><|b|>y", "<|a|><|a|><|b|><|b|>", "<|a|> <|b|>", "<|a|><|b"]:
        assert ours.encode(text) == peer.encode(text).ids
    assert ours.encode("<|a|><|b|>") == [257] and ours.encode("<|a|><|b") == [256, *ours.encode("<|b")]


# -- the other subword schemes: WordPiece and Unigram -------------------------------------------

@pytest.fixture(scope="module")
def alternatives():
    text = load_stdlib_docs(60_000)
    words = [token_to_gpt2_string(w) for w in count_pretokens(text)]
    wordpiece = train_hf_wordpiece(text, 600)
    unigram = train_hf_unigram(text, 600)
    return text, words, wordpiece, unigram


def test_wordpiece_worked_examples():
    vocab = {"a", "ab", "##bcd", "##c", "##d", "[UNK]"}
    assert wordpiece_segment("abcd", vocab) == ["ab", "##c", "##d"]  # greedy, not fewest
    assert wordpiece_segment("abcd", vocab - {"##c"}) == ["[UNK]"]  # although a ##bcd exists
    assert wordpiece_segment("a", vocab) == ["a"]
    assert wordpiece_segment("ba", vocab) == ["[UNK]"]  # no piece starts with b
    assert wordpiece_segment("ab" * 60, {"ab", "##ab"}) == ["[UNK]"]  # longer than 100
    assert wordpiece_segment("abab", {"ab", "__ab"}, prefix="__", unk_token="?") == ["ab", "__ab"]
    with pytest.raises(TypeError, match="word must be a str"):
        wordpiece_segment(b"ab", vocab)


def test_unigram_worked_examples():
    log_p = {"a": math.log(0.2), "b": math.log(0.2), "c": math.log(0.1), "ab": math.log(0.05),
             "bc": math.log(0.3)}
    # a|bc: 0.2 * 0.3 = 0.06 beats ab|c: 0.005 and a|b|c: 0.004
    pieces, score = unigram_segment("abc", log_p)
    assert pieces == ["a", "bc"]
    assert score == pytest.approx(math.log(0.06), abs=1e-15)
    assert unigram_segment("ab", log_p) == (["ab"], pytest.approx(math.log(0.05)))  # 0.05 > 0.04
    with pytest.raises(ValueError, match="no segmentation of 'abd'"):
        unigram_segment("abd", log_p)
    with pytest.raises(ValueError, match="empty word"):
        unigram_segment("", log_p)
    with pytest.raises(TypeError, match="word must be a str"):
        unigram_segment(3, log_p)


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet="abc", min_size=1, max_size=9))
def test_unigram_segment_is_the_most_probable_cut_by_enumeration(word):
    """Against brute force: all 2^(n-1) cuts of the word, scored by the same log-probs."""
    log_p = {"a": -1.0, "b": -1.5, "c": -2.0, "ab": -1.7, "bc": -2.2, "ca": -3.1, "abc": -3.0,
             "cc": -2.5}
    best = -math.inf
    n = len(word)
    for mask in range(2 ** (n - 1)):
        cuts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
        pieces = [word[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
        if all(p in log_p for p in pieces):
            best = max(best, sum(log_p[p] for p in pieces))
    pieces, score = unigram_segment(word, log_p)
    assert "".join(pieces) == word
    assert score == pytest.approx(sum(log_p[p] for p in pieces), abs=1e-12)
    assert score == pytest.approx(best, abs=1e-12)


def test_wordpiece_segment_equals_hf_wordpiece_on_every_word(alternatives):
    _, words, wordpiece, _ = alternatives
    vocab = wordpiece.get_vocab()
    assert len(vocab) <= 600 and "[UNK]" in vocab
    for word in words:
        assert wordpiece_segment(word, vocab) == [t.value for t in wordpiece.model.tokenize(word)]
    # a byte never seen inside a word has no ## form: the whole word becomes [UNK]
    unseen = token_to_gpt2_string("naïve".encode())
    assert [t.value for t in wordpiece.model.tokenize(unseen)] == ["[UNK]"]
    assert wordpiece_segment(unseen, vocab) == ["[UNK]"]


def test_unigram_segment_equals_hf_unigram_on_every_word(alternatives):
    _, words, _, unigram = alternatives
    scores = dict(json.loads(unigram.to_str())["model"]["vocab"])
    del scores["<unk>"]
    assert len(scores) == 599
    for word in words:
        ours, log_p = unigram_segment(word, scores)
        theirs = [t.value for t in unigram.model.tokenize(word)]
        assert sum(scores[t] for t in theirs) == pytest.approx(log_p, abs=1e-9)
        assert ours == theirs
    # byte-level: every word segments, and decoding gives the text back
    probe = "naïve café, 東京 🙂"
    assert unigram.decode(unigram.encode(probe).ids) == probe


def test_hf_alternatives_reject_bad_vocab_sizes():
    for trainer in (train_hf_wordpiece, train_hf_unigram):
        with pytest.raises(ValueError, match="vocab_size=256 is below"):
            trainer("abc", 256)
        with pytest.raises(TypeError, match="vocab_size must be an int"):
            trainer("abc", 300.0)
