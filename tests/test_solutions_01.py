"""Checks the reference solutions of notebooks/01_tokens (notebooks/solutions/01_tokens.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.tokenizer import BPETokenizer, count_pretokens, train_bpe

PATH = Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / "01_tokens.py"


def _load():
    spec = importlib.util.spec_from_file_location("solutions_01_tokens", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sol = _load()


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    vocab, merges = train_bpe(load_stdlib_docs(100_000), 700)
    return BPETokenizer(vocab, merges)


def test_exercise_1_utf8_length_and_encode_on_every_scalar_value():
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if cp % 97 == 0 or cp < 0x1000 or cp in (0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000):
            expected = chr(cp).encode("utf-8")
            assert sol.utf8_encode(cp) == expected
        assert sol.utf8_length(cp) == len(chr(cp).encode("utf-8"))
    with pytest.raises(ValueError, match="0xd800 is not a Unicode scalar"):
        sol.utf8_length(0xD800)
    with pytest.raises(ValueError, match="0x110000"):
        sol.utf8_encode(0x110000)


def test_exercise_2_most_frequent_pair():
    counts = {b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}
    # e-s and s-t occur 6 + 3 = 9 times; (b"e", b"s") < (b"s", b"t")
    assert sol.most_frequent_pair(counts) == (b"e", b"s")
    assert sol.most_frequent_pair(counts, tie_break="largest") == (b"s", b"t")
    assert sol.most_frequent_pair({b"aaabdaaabac": 1}) == (b"a", b"a")
    text = load_stdlib_docs(30_000)
    _, merges = train_bpe(text, 257)
    assert sol.most_frequent_pair(count_pretokens(text)) == merges[0]
    # the same words, as the trainer sees them, under both tie rules
    words = {b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}
    text_ws = "".join(f"{w.decode()}\n" * n for w, n in words.items())
    for rule in ("smallest", "largest"):
        first = train_bpe(text_ws, 257, tie_break=rule)[1][0]
        assert sol.most_frequent_pair(count_pretokens(text_ws), tie_break=rule) == first
    with pytest.raises(ValueError, match="tie_break must be"):
        sol.most_frequent_pair(counts, tie_break="first")
    with pytest.raises(ValueError, match="no pair to merge"):
        sol.most_frequent_pair({b"a": 3})


def test_exercise_3_bpe_encode_word_matches_the_tokenizer(tokenizer):
    for word in ["hello", " tokenization", " naïve", "東京", "'s", "   ", " 2024"]:
        pieces = sol.bpe_encode_word(word.encode("utf-8"), tokenizer.merges)
        assert b"".join(pieces) == word.encode("utf-8")
        assert pieces == [tokenizer.vocab[i] for i in tokenizer.encode(word)]


def test_exercise_4_non_additive_pair(tokenizer):
    a, b = sol.non_additive_pair(tokenizer)
    assert tokenizer.encode(a + b) != tokenizer.encode(a) + tokenizer.encode(b)
    assert tokenizer.decode(tokenizer.encode(a) + tokenizer.encode(b)) == a + b


def test_exercise_5_cosine_to_reference_worked_example():
    import torch

    # rows: mean (1, 1); centred: (-1, -1), (1, 1), (1, -1), (-1, 1), (0, 0) - tokens 0 and 1 oppose
    E = torch.tensor([[0.0, 0.0], [2.0, 2.0], [2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    ids, cos = sol.cosine_to_reference(E, [1], 4)
    assert ids == [2, 3, 4, 0]  # 2 and 3 tie at cos 0 (smaller id first); the zero row has cos 0
    assert cos == pytest.approx([0.0, 0.0, 0.0, -1.0], abs=1e-12)
    assert sol.cosine_to_reference(E, [1], 1, exclude=[2, 3, 4]) == ([0], [pytest.approx(-1.0)])
    with pytest.raises(ValueError, match="k"):
        sol.cosine_to_reference(E, [1], 5)
    with pytest.raises(ValueError, match="floating"):
        sol.cosine_to_reference(E.long(), [1], 1)


def test_exercise_5_cosine_to_reference_equals_torch_cosine_similarity():
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    E = torch.randn(40, 7, generator=g, dtype=torch.float64)  # (V, d), non-square
    ref = [3, 11, 17]
    centred = E - E.mean(0)
    cos = F.cosine_similarity(centred, centred[ref].mean(0)[None], dim=1)
    others = [i for i in range(40) if i not in ref]
    expected = sorted(others, key=lambda i: -cos[i].item())[:9]
    ids, values = sol.cosine_to_reference(E, ref, 9)
    assert ids == expected and values == pytest.approx([cos[i].item() for i in expected], abs=1e-12)


def test_exercise_5_on_smollm2_agrees_with_the_chapters_reference_point():
    """On SmolLM2 the ten most aligned rows are the chapter's ten nearest the reserved tokens."""
    import numpy as np
    import torch

    from llmbook.inference.ggml_quants import dequantize
    from llmbook.inference.gguf import smollm2_path
    from llmbook.inference.gguf_file import read_gguf
    from llmbook.text.embedding import nearest_rows

    embd = read_gguf(smollm2_path()).tensors["token_embd.weight"]
    E = torch.from_numpy(np.ascontiguousarray(dequantize(embd.data, embd.qtype, embd.shape)))
    reserved, controls = list(range(7, 17)), list(range(17))
    ids, cos = sol.cosine_to_reference(E, reserved, 10, exclude=controls)
    near = nearest_rows(E, 10, centre=E[reserved].mean(0), exclude=controls)[0].tolist()
    assert set(ids) == set(near) and 36744 in ids and min(cos) > 0.99
