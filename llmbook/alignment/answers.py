"""Reading the final answer out of a model's text, voting over answers, and pass@k by definition.

Introduced in notebooks/20_grpo. A verifiable reward (chapter 20) is only as good as the
parser that finds the answer in a free-form response: "#### 1,234" (the GSM8K format of
Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems"), "\\boxed{42}" (the
MATH format), "42 apples", "$12", "-3.5"; or a multiple-choice letter: "(B)",
"Answer: c", "the answer is D.".

* :func:`parse_numeric_answer`: the number a response answers, as an exact
  :class:`~fractions.Fraction` (so "1,234", "1234" and "1234.0" are the same answer), or
  None. Precedence: the last "####" marker, else the last ``\\boxed{...}`` (braces matched,
  so ``\\boxed{\\frac{1}{2}}`` is 1/2), else the last "answer is" / "answer:" phrase, else
  the last number in the text.
* :func:`parse_choice_answer`: the letter of a multiple-choice answer, or None; a bare
  capital "A" used as an article is never read as an answer.
* :func:`majority_vote`: parse every response and return the most frequent answer
  (self-consistency, Wang et al., 2023) by
  :func:`llmbook.alignment.repeated_sampling.plurality`, the count that ``plurality_vote``
  uses on ints, here over any hashable answers (numbers as fractions, letters).
* :func:`pass_at_k_enumerated`: pass@k by its definition, the fraction of the C(n, k)
  subsets of k of the n samples that contain a right one (Chen et al., 2021, "Evaluating
  Large Language Models Trained on Code"); the reference that the closed form
  1 - C(n - c, k) / C(n, k) (:func:`llmbook.alignment.repeated_sampling.pass_at_k`) is tested against.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Hashable, Sequence
from fractions import Fraction

from llmbook.alignment.repeated_sampling import plurality
from llmbook.validation import check_positive_int

__all__ = [
    "majority_vote",
    "parse_choice_answer",
    "parse_numeric_answer",
    "pass_at_k_enumerated",
]

# A number: optional sign, optional currency sign, then either digits grouped by commas in
# threes ("1,234,567"; a group of other width makes the commas a list separator) or plain
# digits, then an optional decimal part. It may not start inside a word or a decimal
# ("H2O", "v1.5"), and a "-" right after a digit is a range, not a sign ("3-4").
_NUMBER = re.compile(
    r"(?<![\w.])"
    r"(?P<sign>[-−])?\$?(?P<sign2>[-−])?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?![\d])|\d+)"
    r"(?P<frac>\.\d+)?"
)
_MARKER = "####"
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)\s*", re.IGNORECASE)
_FRAC = re.compile(r"^\\[dt]?frac\{(?P<num>[^{}]*)\}\{(?P<den>[^{}]*)\}$")


def _check_text(text: object, name: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def _parse_number(match: re.Match[str]) -> Fraction:
    """The exact value of a match of the module's number pattern: thousands commas dropped."""
    sign = -1 if (match.group("sign") or match.group("sign2")) else 1
    digits = match.group("int").replace(",", "") + (match.group("frac") or "")
    return sign * Fraction(digits)


def _numbers(text: str) -> list[Fraction]:
    return [_parse_number(m) for m in _NUMBER.finditer(text)]


def _boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}``, braces matched (nested braces kept)."""
    out = []
    for m in re.finditer(r"\\boxed\s*\{", text):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                out.append(text[start:i])
                break
    return out


def _boxed_value(content: str) -> Fraction | None:
    """The number a box holds: "42", "1,234", "\\$12", "-3.5", "\\frac{1}{2}", "5\\text{ cm}"."""
    s = re.sub(r"\\text\{[^{}]*\}|\\[,!;: ]|\\%|%|\\\$|\s", "", content)
    s = s.replace("\\left", "").replace("\\right", "")
    while s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    frac = _FRAC.match(s.lstrip("-−"))
    if frac:
        num, den = _NUMBER.fullmatch(frac.group("num")), _NUMBER.fullmatch(frac.group("den"))
        if num and den and _parse_number(den) != 0:
            sign = -1 if s[:1] in "-−" else 1
            return sign * _parse_number(num) / _parse_number(den)
        return None
    whole = _NUMBER.fullmatch(s)
    return _parse_number(whole) if whole else None


def parse_numeric_answer(text: str) -> Fraction | None:
    """The number that ``text`` gives as its final answer, exactly, or None.

    In order of precedence: the first number after the last ``####`` (GSM8K); else the
    content of the last ``\\boxed{...}`` if it is one number or ``\\frac{a}{b}`` (a box
    holding anything else is no numeric answer: None); else the first number after the last
    "answer is" or "answer:"; else the last number in the text. Numbers keep their sign
    ("-3.5"), lose a currency sign ("$12") and thousands commas ("1,234" is 1234, but
    "1,2,3" is a list whose last number is 3), and ignore what follows them ("42 apples",
    "42."). Returns a :class:`~fractions.Fraction`: it compares equal to ints.
    """
    text = _check_text(text)
    if _MARKER in text:
        found = _numbers(text[text.rindex(_MARKER) + len(_MARKER):])
        return found[0] if found else None
    boxes = _boxed_contents(text)
    if boxes:
        return _boxed_value(boxes[-1])
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        found = _numbers(text[phrases[-1].end():])
        if found:
            return found[0]
    found = _numbers(text)
    return found[-1] if found else None


def parse_choice_answer(text: str, choices: str = "ABCD") -> str | None:
    """The multiple-choice letter that ``text`` answers (upper case, one of ``choices``), or None.

    In order of precedence: the letter after the last "answer is" / "answer:" (optionally
    in parentheses, "Answer: (c)"; a lower-case letter without parentheses only at the end
    of a sentence, so that neither "Answer: cat" nor "the answer is a bit" counts); else the
    content of the last ``\\boxed{X}``; else the last letter of ``choices`` in parentheses,
    "(B)"; else the
    whole text if it is one letter with optional parentheses and punctuation ("D.", "c").
    A letter outside ``choices`` is no answer. A capital "A" inside prose ("A good
    guess ...") is never read as the answer.
    """
    text = _check_text(text)
    if not isinstance(choices, str) or not choices or not choices.isalpha() or not choices.isupper() \
            or len(set(choices)) != len(choices):
        raise ValueError(f"choices must be distinct upper-case letters, got choices={choices!r}")

    def letter(s: str) -> str | None:
        up = s.upper()
        return up if len(up) == 1 and up in choices else None

    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        after = text[phrases[-1].end():]
        # "(c)" or a capital "C" followed by no letter; a bare lower-case letter only at the
        # end of a sentence ("the answer is c."), since "the answer is a bit ..." is prose
        m = re.match(r"\(([A-Za-z])\)|([A-Z])(?![A-Za-z])|([a-z])\s*(?:[.!;)]|$)", after)
        if m:
            return letter(next(g for g in m.groups() if g))
    boxes = _boxed_contents(text)
    if boxes:
        return letter(re.sub(r"\\text\{([^{}]*)\}", r"\1", boxes[-1]).strip("() "))
    parenthesised = [x for x in re.findall(r"(?<![A-Za-z])\(([A-Za-z])\)", text) if letter(x)]
    if parenthesised:
        return letter(parenthesised[-1])
    bare = re.fullmatch(r"\s*\(?([A-Za-z])\)?[.!:)]?\s*", text)
    return letter(bare.group(1)) if bare else None


def majority_vote(responses: Sequence[str],
                  parser: Callable[[str], Hashable | None] = parse_numeric_answer) -> Hashable | None:
    """The most frequent parsed answer among ``responses`` (self-consistency, Wang et al., 2023).

    Each response is parsed by ``parser`` (default :func:`parse_numeric_answer`; pass
    :func:`parse_choice_answer` for letters); a response with no answer (None) votes for
    nothing. Ties go to the answer that reached the top count first
    (:func:`llmbook.alignment.repeated_sampling.plurality`). Returns None if no response has
    an answer.
    """
    if isinstance(responses, str | bytes) or not isinstance(responses, Sequence):
        raise TypeError(f"responses must be a sequence of str, got {type(responses).__name__}")
    if len(responses) == 0:
        raise ValueError("responses is empty: a vote needs at least one response")
    if not callable(parser):
        raise TypeError(f"parser must be callable, got {parser!r}")
    return plurality(parser(_check_text(r, "every response")) for r in responses)


def pass_at_k_enumerated(correct: Sequence[bool], k: int) -> Fraction:
    """pass@k by definition: the share of the k-subsets of the samples with a right one.

    ``correct`` lists, for each of n samples, whether it is right. Enumerates all C(n, k)
    subsets (exponential: for small n, as a reference); returns an exact fraction.
    """
    if isinstance(correct, str | bytes) or not isinstance(correct, Sequence):
        raise TypeError(f"correct must be a sequence of bools, got {type(correct).__name__}")
    if not all(isinstance(c, bool) for c in correct):
        raise TypeError("correct must hold bools (True for a right sample)")
    k = check_positive_int("k", k)
    if k > len(correct):
        raise ValueError(f"k={k} exceeds the number of samples, {len(correct)}")
    subsets = list(itertools.combinations(correct, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))
