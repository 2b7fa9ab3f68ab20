"""Numbers typed in the chapters' prose: each is computed, set in code, or declared."""

import sys
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import prose_numbers as pn  # noqa: E402


def texts(s: str) -> list[str]:
    return [t.text for t in pn.extract(s)]


def values(s: str) -> list[Decimal]:
    return [t.value for t in pn.extract(s)]


def test_the_book_has_no_unexplained_number_and_no_stale_entry():
    typed, problems = pn.check()
    assert len(typed) > 1000
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("source, expected", [
    ("GPT-2 has 50,257 tokens", [Decimal(50257)]),
    ("in LaTeX $V = 50{,}257$ and $d = 4\\,096$", [Decimal(50257), Decimal(4096)]),
    ("spaced 2 001 024 parameters", [Decimal(2001024)]),
    ("a loss of 3.67 nats", [Decimal("3.67")]),
    ("a rate of 1.8e-4 and 3e-4", [Decimal("1.8e-4"), Decimal("3e-4")]),
    ("$3 \\times 10^{-4}$ and $6\\cdot10^{-8}$", [Decimal("3e-4"), Decimal("6e-8")]),
    ("a minimum of −0.17 and -0.75", [Decimal("-0.17"), Decimal("-0.75")]),
    ("175B parameters, 38.6 million, 4.9 MB", [Decimal("175e9"), Decimal("38.6e6"),
                                              Decimal("4.9e6")]),
])
def test_extract_reads_the_value(source, expected):
    assert values(source) == expected


def test_extract_keeps_percent_and_ratio_signs():
    found = pn.extract("44% more, 0.5 \\% noise and 4.2× faster")
    assert [t.text for t in found] == ["44%", "0.5 \\%", "4.2×"]
    assert [t.percent for t in found] == [True, True, False]


def test_extract_skips_names_references_years_and_structure():
    assert texts("GPT-2, fp16, W_1, Qwen2-0.5B, 2D, the 1st, torch 2.13.0") == []
    assert texts("chapter 7, chapters 2 to 6, section 7.3, §4, equation 1.1") == []
    assert texts("(Kaplan et al., 2020) and Hoffmann et al. (2022), (Gu, Goel & Ré, 2021, x)"
                 ) == []
    assert texts("## 7.1 The block\n1. **first** item\n2) second") == []
    assert texts("see https://arxiv.org/abs/2203.15556 or arXiv:2203.15556, U+40000") == []
    assert texts("```\nx = 12345\n```\n`torch==2.13.0`") == []


def test_extract_in_math_skips_indices_exponents_and_small_integers():
    assert texts("$x_1 + W_{12} + x^2 + 2^{-\\alpha} + \\frac{1}{2} + 6ND + T-1$") == []
    assert texts("$\\alpha_N \\approx 0.076$ and $d = 4096$") == ["0.076", "4096"]
    assert texts("a section's own number: the policy of 18.2",) == ["18.2"]
    assert [t.text for t in pn.extract("the policy of 18.2", sections=frozenset({"18.2"}))] == []


def chapter(markdown: str, output: str, code: str = "x = 1") -> pn.Chapter:
    return pn.Chapter("99_test", [
        {"type": "markdown", "source": "## 99.1 Results\n" + markdown, "outputs": ""},
        {"type": "code", "source": code, "outputs": output}])


def reasons(ch: pn.Chapter, registry: dict | None = None) -> list[str]:
    typed, stale = pn.classify(ch, registry or {})
    return [t.reason for t in typed] + stale


def test_a_number_is_computed_when_an_output_rounds_to_it():
    assert reasons(chapter("the loss falls to 3.67", "val 3.6712")) == ["computed (same section)"]
    assert reasons(chapter("about 470,000 tokens", "469,812 tokens")) == [
        "computed (same section)"]
    assert reasons(chapter("2.0M parameters and 12%", "2,001,024 0.1213")) == [
        "computed (same section)"] * 2
    # the output must be written at least as finely as the prose
    assert reasons(chapter("the loss is 2.06", "loss 2")) == [""]
    assert reasons(chapter("the loss is 3.67", "val 3.6812")) == [""]


def test_a_number_set_in_code_or_declared_is_explained():
    assert reasons(chapter("a rate of 3e-4", "", code="lr = 0.0003")) == ["code"]
    entry = {"99_test": {"3.47": {"kind": "math", "why": "log 32", "value": "log(32)"}}}
    assert reasons(chapter("at most 3.47 nats", ""), entry) == ["declared math"]


def test_a_wrong_math_entry_and_a_stale_entry_fail():
    wrong = {"99_test": {"3.47": {"kind": "math", "why": "log 32", "value": "log(33)"}}}
    typed, _ = pn.classify(chapter("at most 3.47 nats", ""), wrong)
    assert typed[0].reason == "" and "does not round to 3.47" in typed[0].context
    stale = {"99_test": {"9.99": {"kind": "published", "why": "nowhere"}}}
    assert any("matches no" in r for r in reasons(chapter("no numbers here", ""), stale))
    untyped = {"99_test": {"3.47": {"kind": "math", "why": "no value"}}}
    assert any("needs a value" in r for r in reasons(chapter("at most 3.47", ""), untyped))


def test_a_drifted_output_is_reported_in_a_real_chapter():
    ch = pn.read_chapter(ROOT / "notebooks" / "14_flash_attention.ipynb")
    typed, problems = pn.classify(ch)
    assert not [t for t in typed if not t.reason]
    assert any("60.65" in c["outputs"] for c in ch.cells)
    for c in ch.cells:  # the measured ratio drifts, in memory only
        c["outputs"] = c["outputs"].replace("60.65", "70.65")
    typed, _ = pn.classify(ch)
    drifted = [pn.describe(t) for t in typed if not t.reason]
    assert len(drifted) == 1 and "'61'" in drifted[0] and "factor of 61" in drifted[0]
    assert drifted[0].startswith("notebooks/14_flash_attention.py:")
