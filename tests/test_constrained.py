"""Tests of llmbook.inference.constrained: the regex DFA against Python's re, the token masks
against a brute force with the `regex` package's partial matching, decoding on random logits."""
from __future__ import annotations

import itertools
import re

import pytest
import regex
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.constrained import (
    allowed_along,
    build_index,
    compile_regex,
    constrained_generate,
    token_strings,
)
from llmbook.inference.sampling import BigramLM

PATTERNS = [r"ab*c", r"(ab|a)+", r"[a-c]{2,3}", r"a?b+|c", r"[^b]x", r"\d{2}-\d", r"(a|bc)*d?",
            r"\{\"k\": [0-9]+\}", r"x{0,2}y{2,}", r".a", r"[\w-]+", r"a\.b", r"[]a]+", r"[a\-]{2}",
            r"\s\S", r"\D\W"]
ALPHABET = "abcdxy09-.\"{}:_ \n"
VOCAB = ["a", "b", "c", "d", "x", "y", "0", "9", "-", ".", '"', "{", "}", ":", " ", "_", "ab", "bc",
         "abc", "ca", "xy", "yy", "09", "90", "-9", '{"k', '": ', "a.b", "\n", "é", "]", "k"]  # V = 32
# every character of PATTERNS is a token of VOCAB, so a prefix that can be completed by
# characters can be completed by tokens: the brute force below may work character-wise


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_equals_re_on_every_short_string(pattern):
    dfa, peer = compile_regex(pattern), re.compile(pattern)
    letters = "abcdxy09-.\"{}:_ \n]"
    for n in range(4):
        for chars in itertools.product(letters, repeat=n):
            s = "".join(chars)
            assert dfa.fullmatch(s) == (peer.fullmatch(s) is not None), (pattern, s)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(PATTERNS), st.text(alphabet=ALPHABET + "é]", max_size=8))
def test_dfa_equals_re_on_random_strings(pattern, s):
    assert compile_regex(pattern).fullmatch(s) == (re.fullmatch(pattern, s) is not None)


def test_worked_example_states_and_masks():
    # "ab*c" over a, b, c, ab, bc, <eos>. Subset construction does not minimise: after "a"
    # (row 1) and after "ab", "abb", ... (row 2) are different NFA sets with the same future.
    ix = build_index(compile_regex("ab*c"), ["a", "b", "c", "ab", "bc", "<eos>"], eos_ids=[5])
    assert ix.allowed.int().tolist() == [[1, 0, 0, 1, 0, 0], [0, 1, 1, 0, 1, 0],
                                         [0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 1]]
    assert ix.next_state.tolist() == [[1, -1, -1, 2, -1, -1], [-1, 2, 3, -1, 3, -1],
                                      [-1, 2, 3, -1, 3, -1], [-1, -1, -1, -1, -1, -1]]
    assert ix.accepting.tolist() == [False, False, False, True]
    assert ix.walked == 5 and [ix.row(t) for t in ["", "a", "abb", "ac", "c"]] == [0, 1, 2, 3, -1]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_masks_equal_brute_force_with_partial_matching(pattern):
    ix = build_index(compile_regex(pattern), VOCAB + ["<eos>"], eos_ids=[len(VOCAB)])
    peer = regex.compile(pattern)
    # every prefix of length <= 3 over the alphabet that the index can reach
    for n in range(4):
        for chars in itertools.product("abcdxy09-.\"{}:k ", repeat=n):
            prefix = "".join(chars)
            r = ix.row(prefix)
            alive = peer.fullmatch(prefix, partial=True) is not None
            if r < 0:
                # dead for the DFA: no completion, or none made of these tokens
                continue
            assert alive, (pattern, prefix)
            expect = [peer.fullmatch(prefix + t, partial=True) is not None for t in VOCAB]
            expect.append(peer.fullmatch(prefix) is not None)
            assert ix.allowed[r].tolist() == expect, (pattern, prefix)


def test_a_state_whose_only_way_out_is_missing_is_not_live():
    # "ab|cd" with no token "d": after "c" nothing finishes, so "c" is never allowed.
    ix = build_index(compile_regex("ab|cd"), ["a", "b", "c"])
    assert ix.allowed[0].tolist() == [True, False, False] and ix.row("c") == -1


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(PATTERNS), st.integers(0, 2**31 - 1), st.sampled_from([0.0, 1.0, 2.0]))
def test_every_finished_output_fully_matches(pattern, seed, temperature):
    V = len(VOCAB) + 1
    g = torch.Generator().manual_seed(seed)
    model = BigramLM(3 * torch.randn(V, V, generator=g, dtype=torch.float64))
    ix = build_index(compile_regex(pattern), VOCAB + ["<eos>"], eos_ids=[V - 1])
    out, done = constrained_generate(model, torch.tensor([[0]]), ix, 12, temperature=temperature,
                                     generator=g)
    text = "".join(VOCAB[v] for v in out if v != V - 1)
    peer = regex.compile(pattern)
    assert peer.fullmatch(text, partial=True) is not None  # always a prefix of a match
    if done:
        assert re.fullmatch(pattern, text) is not None
    if out and out[-1] == V - 1:
        assert done
    assert allowed_along(ix, out).shape == (len(out), V)


def test_bounded_pattern_always_finishes_and_masked_argmax():
    V = len(VOCAB) + 1
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        table = torch.randn(V, V, generator=g, dtype=torch.float64)
        ix = build_index(compile_regex(r"\d{2}-\d"), VOCAB + ["<eos>"], eos_ids=[V - 1])
        out, done = constrained_generate(BigramLM(table), torch.tensor([[1, 2]]), ix, 6)
        assert done and out[-1] == V - 1
        # greedy: each token is the best allowed one under the model's logits
        prev = [2, *out[:-1]]
        masks = allowed_along(ix, out)
        for p, m, v in zip(prev, masks, out, strict=True):
            z = table[p].masked_fill(~m, float("-inf"))
            assert int(z.argmax()) == v


def test_token_strings_of_a_byte_vocabulary():
    vocab = {0: b"a", 1: "é".encode()[:1], 2: "é".encode(), 3: b"<s>", 5: b" x"}
    assert token_strings(vocab, [3]) == ["a", None, "é", None, None, " x"]


def test_no_cache_path_equals_kv_cache_path():
    from llmbook.transformer.model import TransformerConfig, TransformerLM
    torch.manual_seed(0)
    V = len(VOCAB) + 1
    model = TransformerLM(TransformerConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2,
                                            max_seq_len=32)).double()
    ix = build_index(compile_regex(r"(ab|a)+"), VOCAB + ["<eos>"], eos_ids=[V - 1])
    cached, _ = constrained_generate(model, torch.tensor([[3, 4]]), ix, 8)

    class Plain(torch.nn.Module):
        def forward(self, ids):
            return model(ids)
    plain, _ = constrained_generate(Plain(), torch.tensor([[3, 4]]), ix, 8)
    assert cached == plain


@pytest.mark.parametrize("pattern, feature", [("^ab", "anchor"), ("ab$", "anchor"), (r"a\b", r"\b"),
                                              ("(?i)a", "(?"), ("a*?", "lazy"), (r"(a)\1", r"\1"),
                                              ("(ab", "without its ')'"), ("ab)", "unbalanced"),
                                              ("[ab", "without its ']'"), ("*a", "nothing to repeat"),
                                              ("a{3,1}", "max < min"), ("[z-a]", "reversed"),
                                              ("a\\", "trailing backslash"), ("a{,2}", "repeat count")])
def test_unsupported_features_are_named(pattern, feature):
    with pytest.raises(ValueError, match=re.escape(feature)):
        compile_regex(pattern)


def test_bad_arguments():
    with pytest.raises(TypeError, match="pattern"):
        compile_regex(3)
    with pytest.raises(TypeError, match="dfa"):
        build_index("ab", ["a"])
    with pytest.raises(ValueError, match="no sequence"):
        build_index(compile_regex("zz"), ["a", "b"])
    with pytest.raises(ValueError, match="eos_ids"):
        build_index(compile_regex("a"), ["a"], eos_ids=[4])
    ix = build_index(compile_regex("ab"), ["a", "b", "<eos>"], eos_ids=[2])
    with pytest.raises(ValueError, match="prompt_ids"):
        constrained_generate(BigramLM(torch.zeros(3, 3)), torch.tensor([[0], [1]]), ix, 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        constrained_generate(BigramLM(torch.zeros(3, 3)), torch.tensor([[0]]), ix, 0)
    with pytest.raises(ValueError, match=r"new_ids\[0\]"):
        allowed_along(ix, [1])
