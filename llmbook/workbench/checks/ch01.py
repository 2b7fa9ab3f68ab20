"""Checks of chapter 1's exercises (notebooks/01_tokens), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are Python's own UTF-8 codec, the book's BPE trainer and tokenizer
(:mod:`llmbook.text.tokenizer`), ``torch.nn.functional.cosine_similarity`` and, on
SmolLM2's embedding table, :func:`llmbook.text.embedding.nearest_rows`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.tokenizer import BPETokenizer, count_pretokens, train_bpe
from llmbook.workbench.checks import approx, raises


@functools.cache
def _tokenizer() -> BPETokenizer:
    """The byte-level BPE tokenizer of exercises 3 and 4: 700 tokens on 100 kB of docs."""
    vocab, merges = train_bpe(load_stdlib_docs(100_000), 700)
    return BPETokenizer(vocab, merges)


def exercise_1_utf8_length_and_encode_on_every_scalar_value(solutions) -> None:
    # looked up once: the grader wraps each lookup, and the loop makes 1.1 million calls
    utf8_length, utf8_encode = solutions.utf8_length, solutions.utf8_encode
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if cp % 97 == 0 or cp < 0x1000 or cp in (0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000):
            expected = chr(cp).encode("utf-8")
            got = utf8_encode(cp)
            assert got == expected, f"expected utf8_encode({cp:#x}) = {expected!r}, got {got!r}"
        length, want = utf8_length(cp), len(chr(cp).encode("utf-8"))
        assert length == want, f"expected utf8_length({cp:#x}) = {want}, got {length!r}"
    with raises(ValueError, match="0xd800 is not a Unicode scalar", what="utf8_length(0xD800)"):
        solutions.utf8_length(0xD800)
    with raises(ValueError, match="0x110000", what="utf8_encode(0x110000)"):
        solutions.utf8_encode(0x110000)


def exercise_2_most_frequent_pair(solutions) -> None:
    counts = {b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}
    # e-s and s-t occur 6 + 3 = 9 times; (b"e", b"s") < (b"s", b"t")
    got = solutions.most_frequent_pair(counts)
    assert got == (b"e", b"s"), (
        f"expected (b'e', b's') for {counts} (e-s and s-t tie at 9; the smaller pair wins), got {got!r}")
    got = solutions.most_frequent_pair(counts, tie_break="largest")
    assert got == (b"s", b"t"), f"expected (b's', b't') with tie_break='largest', got {got!r}"
    got = solutions.most_frequent_pair({b"aaabdaaabac": 1})
    assert got == (b"a", b"a"), f"expected (b'a', b'a') for {{b'aaabdaaabac': 1}}, got {got!r}"
    text = load_stdlib_docs(30_000)
    _, merges = train_bpe(text, 257)
    got, first = solutions.most_frequent_pair(count_pretokens(text)), merges[0]
    assert got == first, f"expected the trainer's first merge {first!r} on 30 kB of docs, got {got!r}"
    # the same words, as the trainer sees them, under both tie rules
    words = {b"low": 5, b"lower": 2, b"newest": 6, b"widest": 3}
    text_ws = "".join(f"{w.decode()}\n" * n for w, n in words.items())
    for rule in ("smallest", "largest"):
        first = train_bpe(text_ws, 257, tie_break=rule)[1][0]
        got = solutions.most_frequent_pair(count_pretokens(text_ws), tie_break=rule)
        assert got == first, f"expected the trainer's first merge {first!r} with tie_break={rule!r}, got {got!r}"
    with raises(ValueError, match="tie_break must be", what="most_frequent_pair(..., tie_break='first')"):
        solutions.most_frequent_pair(counts, tie_break="first")
    with raises(ValueError, match="no pair to merge", what="most_frequent_pair({b'a': 3})"):
        solutions.most_frequent_pair({b"a": 3})


def exercise_3_bpe_encode_word_matches_the_tokenizer(solutions) -> None:
    tokenizer = _tokenizer()
    for word in ["hello", " tokenization", " naïve", "東京", "'s", "   ", " 2024"]:
        pieces = solutions.bpe_encode_word(word.encode("utf-8"), tokenizer.merges)
        joined = b"".join(pieces)
        assert joined == word.encode("utf-8"), (
            f"expected the pieces of {word!r} to join back to its bytes, got {pieces!r}")
        want = [tokenizer.vocab[i] for i in tokenizer.encode(word)]
        assert pieces == want, f"expected the tokenizer's pieces {want!r} for {word!r}, got {pieces!r}"


def exercise_4_non_additive_pair(solutions) -> None:
    tokenizer = _tokenizer()
    a, b = solutions.non_additive_pair(tokenizer)
    together, apart = tokenizer.encode(a + b), tokenizer.encode(a) + tokenizer.encode(b)
    assert together != apart, (
        f"expected encode(a + b) != encode(a) + encode(b) for a = {a!r}, b = {b!r}; both are {apart}")
    back = tokenizer.decode(apart)
    assert back == a + b, f"expected decode(encode(a) + encode(b)) = {a + b!r}, got {back!r}"


def exercise_5_cosine_to_reference_worked_example(solutions) -> None:
    # rows: mean (1, 1); centred: (-1, -1), (1, 1), (1, -1), (-1, 1), (0, 0) - tokens 0 and 1 oppose
    E = torch.tensor([[0.0, 0.0], [2.0, 2.0], [2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    ids, cos = solutions.cosine_to_reference(E, [1], 4)
    assert ids == [2, 3, 4, 0], (  # 2 and 3 tie at cos 0 (smaller id first); the zero row has cos 0
        f"expected ids [2, 3, 4, 0] (ties at cos 0 by smaller id, the zero row has cos 0), got {ids!r}")
    assert approx(cos, [0.0, 0.0, 0.0, -1.0], abs=1e-12), (
        f"expected the list of cosines [0, 0, 0, -1] (to 1e-12), got {cos!r}")
    result = solutions.cosine_to_reference(E, [1], 1, exclude=[2, 3, 4])
    ids, cos = result
    # pytest.approx(-1.0), its default tolerance 1e-6
    assert isinstance(result, tuple) and ids == [0] and isinstance(cos, list) and approx(cos, [-1.0], abs=1e-6), (
        f"expected the lists ([0], [-1.0]) with rows 2, 3, 4 excluded, got ({ids!r}, {cos!r})")
    with raises(ValueError, match="k", what="cosine_to_reference(E, [1], 5) with 5 rows, 1 reference"):
        solutions.cosine_to_reference(E, [1], 5)
    with raises(ValueError, match="floating", what="cosine_to_reference on an integer table"):
        solutions.cosine_to_reference(E.long(), [1], 1)


def exercise_5_cosine_to_reference_equals_torch_cosine_similarity(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    E = torch.randn(40, 7, generator=g, dtype=torch.float64)  # (V, d), non-square
    ref = [3, 11, 17]
    centred = E - E.mean(0)
    cos = F.cosine_similarity(centred, centred[ref].mean(0)[None], dim=1)
    others = [i for i in range(40) if i not in ref]
    expected = sorted(others, key=lambda i: -cos[i].item())[:9]
    ids, values = solutions.cosine_to_reference(E, ref, 9)
    want = [cos[i].item() for i in expected]
    assert ids == expected, f"expected the ids {expected} (F.cosine_similarity's order), got {ids!r}"
    assert approx(values, want, abs=1e-12), (
        f"expected F.cosine_similarity's values {want} (to 1e-12), got {values!r}")


def exercise_5_on_smollm2_agrees_with_the_chapters_reference_point(solutions) -> None:
    """On SmolLM2 the ten most aligned rows are the chapter's ten nearest the reserved tokens."""
    import numpy as np

    from llmbook.inference.ggml_quants import dequantize
    from llmbook.inference.gguf import smollm2_path
    from llmbook.inference.gguf_file import read_gguf
    from llmbook.text.embedding import nearest_rows

    embd = read_gguf(smollm2_path()).tensors["token_embd.weight"]
    E = torch.from_numpy(np.ascontiguousarray(dequantize(embd.data, embd.qtype, embd.shape)))
    reserved, controls = list(range(7, 17)), list(range(17))
    ids, cos = solutions.cosine_to_reference(E, reserved, 10, exclude=controls)
    near = nearest_rows(E, 10, centre=E[reserved].mean(0), exclude=controls)[0].tolist()
    assert set(ids) == set(near), (
        f"expected the ten rows nearest the reserved tokens' mean, {sorted(near)}, got {sorted(ids)}")
    assert 36744 in ids, f"expected token 36744 among the ten, got {ids!r}"
    lowest = min(cos)
    assert lowest > 0.99, f"expected all ten cosines above 0.99, got a smallest of {lowest!r}"
