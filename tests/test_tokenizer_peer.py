"""llmbook.text.tokenizer against Hugging Face ``tokenizers`` and ``transformers`` (notebooks/01_tokens).

No downloads: the peers are built locally from our own vocabulary and merges, or
trained locally on the shipped corpus.
"""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.tokenizer import BPETokenizer, hf_tokenizer_from_bpe, train_bpe, train_hf_bpe

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
