"""Tests for llmbook.alignment.answers: answer parsers, the majority vote, pass@k by enumeration.

The parsers are checked on adversarial strings (several numbers, nested braces, commas as
thousands separators and as list separators, trailing punctuation, the article "A"), the
vote against :func:`llmbook.alignment.repeated_sampling.plurality_vote` (its peer on ints), and
pass@k by enumeration against the closed form of :func:`llmbook.alignment.repeated_sampling.pass_at_k`
and against exact fractions of binomials.
"""

import itertools
import math
from fractions import Fraction

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.alignment.answers import (
    majority_vote,
    parse_choice_answer,
    parse_numeric_answer,
    pass_at_k_enumerated,
)
from llmbook.alignment.repeated_sampling import pass_at_k, plurality_vote

# ---------------------------------------------------------------- numeric answers

NUMERIC = [
    # GSM8K's marker wins over every other number, and the last marker over earlier ones
    ("Natalia sold 48 clips in April and half as many in May.\n#### 72", Fraction(72)),
    ("#### 5 was a draft; the final:\n#### 7", Fraction(7)),
    ("She has 3 + 4 = 7 boxes of 1,000 each.\n#### 7,000", Fraction(7000)),
    ("####", None),
    # \boxed{}: the last box, braces matched, units and currency dropped
    (r"First \boxed{3}, then corrected to \boxed{4}.", Fraction(4)),
    (r"\boxed{\frac{1}{2}}", Fraction(1, 2)),
    (r"\boxed{-\dfrac{3}{4}}", Fraction(-3, 4)),
    (r"\boxed{{42}}", Fraction(42)),
    (r"\boxed{12\text{ cm}}", Fraction(12)),
    (r"\boxed{\$1,234.50}", Fraction(246900, 200)),
    (r"\boxed{x = 5}", None),  # a box that holds an equation is not a number
    (r"\boxed{\frac{1}{0}}", None),
    # an "answer is" phrase, then the first number after it
    ("The answer is 42. Check: 40 + 2 = 42, not 41.", Fraction(42)),
    ("Answer: 7 (not 8)", Fraction(7)),
    ("answer IS -3.5!", Fraction(-7, 2)),
    # otherwise the last number
    ("42 apples", Fraction(42)),
    ("It costs $12.", Fraction(12)),
    ("a loss of -$12.50.", Fraction(-25, 2)),
    ("a loss of $-3", Fraction(-3)),
    ("1,234", Fraction(1234)),
    ("1,234,567 people", Fraction(1234567)),
    ("the list 1,2,3", Fraction(3)),  # commas not in groups of three: a list
    ("12,34", Fraction(34)),
    ("1,2345", Fraction(2345)),
    ("1,234.5", Fraction(2469, 2)),
    ("pages 3-4", Fraction(4)),  # a range, not -4
    ("5 - 3 = 2", Fraction(2)),
    ("H2O has 3 atoms", Fraction(3)),  # no number inside a word
    ("−8 degrees", Fraction(-8)),  # the Unicode minus sign
    ("no number here", None),
    ("", None),
]


@pytest.mark.parametrize("text,expected", NUMERIC)
def test_parse_numeric_answer_adversarial(text, expected):
    got = parse_numeric_answer(text)
    assert got == expected
    assert got is None or isinstance(got, Fraction)


def test_equal_numbers_written_differently_are_one_answer():
    forms = ["1234", "1,234", "1234.0", "#### 1,234", r"\boxed{1234}", "$1,234", "the answer is 1234."]
    assert {parse_numeric_answer(t) for t in forms} == {Fraction(1234)}
    assert parse_numeric_answer("42") == 42  # compares equal to an int


@settings(max_examples=60, deadline=None)
@given(st.integers(-10**9, 10**9), st.sampled_from(["#### {}", r"\boxed{{{}}}", "The answer is {}.",
                                                    "{} apples", "so {}"]))
def test_any_int_round_trips_with_or_without_thousands_commas(value, template):
    plain, grouped = str(value), f"{value:,}"
    assert parse_numeric_answer(template.format(plain)) == value
    assert parse_numeric_answer(template.format(grouped)) == value


@settings(max_examples=60, deadline=None)
@given(st.decimals(min_value=-10**6, max_value=10**6, places=3, allow_nan=False, allow_infinity=False))
def test_decimals_are_read_exactly(value):
    text = f"the result is {value:f}"
    assert parse_numeric_answer(text) == Fraction(value)


def test_parse_numeric_answer_rejects_non_text():
    with pytest.raises(TypeError, match="text"):
        parse_numeric_answer(42)


# ---------------------------------------------------------------- multiple choice

CHOICE = [
    ("(B)", "B"),
    ("Answer: c", "C"),
    ("the answer is D.", "D"),
    ("The answer is (b) because ...", "B"),
    ("ANSWER: A", "A"),
    ("A good answer is (C).", "C"),  # the article "A" is not the answer
    ("A is wrong and B is right", None),  # no marker: prose is not read
    ("I'd say (B), not (E)", "B"),  # (E) is not a choice
    ("(A) looks tempting but (D) is correct", "D"),  # the last parenthesised letter
    ("the answer is a bit unclear", None),  # "a" as an article
    ("Answer: cat", None),
    ("the answer is E", None),  # not among the choices
    (r"\boxed{C}", "C"),
    (r"\boxed{\text{B}}", "B"),
    ("D.", "D"),
    ("c", "C"),
    (" (a) ", "A"),
    ("", None),
]


@pytest.mark.parametrize("text,expected", CHOICE)
def test_parse_choice_answer_adversarial(text, expected):
    assert parse_choice_answer(text) == expected


def test_parse_choice_answer_other_choices():
    assert parse_choice_answer("the answer is E", choices="ABCDE") == "E"
    assert parse_choice_answer("(E)", choices="ABCDE") == "E"
    with pytest.raises(ValueError, match="choices"):
        parse_choice_answer("(A)", choices="abc")
    with pytest.raises(ValueError, match="choices"):
        parse_choice_answer("(A)", choices="AAB")
    with pytest.raises(TypeError, match="text"):
        parse_choice_answer(None)


# ---------------------------------------------------------------- majority vote


def test_majority_vote_examples():
    responses = ["#### 12", "I get 12 apples", "the answer is 1,2", r"\boxed{12.0}", "#### 13", "no idea"]
    assert majority_vote(responses) == 12
    assert majority_vote(["no", "idea"]) is None
    assert majority_vote(["#### 3", "#### 4"]) == 3  # a tie: the first to reach the top count
    assert majority_vote(["#### 3", "#### 4", "#### 4", "#### 3"]) == 4
    letters = ["Answer: b", "(C)", "the answer is (B).", "A good guess is (C)", "(b)"]
    assert majority_vote(letters, parse_choice_answer) == "B"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=1, max_size=15))
def test_majority_vote_equals_plurality_vote_on_ints(answers):
    """Peer: repeated_sampling.plurality_vote, on responses that write those ints (None: no number)."""
    responses = ["no answer" if a is None else f"#### {a}" for a in answers]
    assert majority_vote(responses) == plurality_vote(answers)


def test_majority_vote_bad_inputs():
    with pytest.raises(ValueError, match="responses"):
        majority_vote([])
    with pytest.raises(TypeError, match="responses"):
        majority_vote("#### 1")
    with pytest.raises(TypeError, match="response"):
        majority_vote(["#### 1", 2])
    with pytest.raises(TypeError, match="parser"):
        majority_vote(["#### 1"], parser="numeric")


# ---------------------------------------------------------------- pass@k by enumeration


def test_pass_at_k_enumerated_worked_example():
    # n = 4 samples, the 1st and 3rd right; k = 2: of the 6 pairs only {2, 4} has no right one
    assert pass_at_k_enumerated([True, False, True, False], 2) == Fraction(5, 6)
    assert pass_at_k_enumerated([False] * 5, 3) == 0
    assert pass_at_k_enumerated([True], 1) == 1


def test_pass_at_k_closed_form_equals_enumeration_over_all_subsets():
    """Brute force over all k-subsets (every n <= 9, c, k and every placement of the right
    samples for n <= 6) against 1 - C(n - c, k) / C(n, k) in exact fractions and against
    repeated_sampling.pass_at_k (Chen et al.'s product form) in floats."""
    for n in range(1, 10):
        for c in range(n + 1):
            placements = [[i < c for i in range(n)], [i >= n - c for i in range(n)]]
            if n <= 6:  # every placement of the c right samples gives the same value
                placements = [[i in s for i in range(n)] for s in
                              map(set, itertools.combinations(range(n), c))]
            for k in range(1, n + 1):
                closed = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                for correct in placements:
                    assert pass_at_k_enumerated(correct, k) == closed
                assert abs(pass_at_k(n, c, k) - float(closed)) < 1e-14


def test_pass_at_k_product_form_derived():
    """C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i), for symbolic n and k."""
    n, k, i = sp.symbols("n k i", positive=True, integer=True)
    for c in range(0, 5):
        ratio = sp.binomial(n - c, k) / sp.binomial(n, k)
        product = sp.Product(1 - k / i, (i, n - c + 1, n)).doit()
        assert sp.simplify(sp.combsimp(ratio) - product) == 0


def test_pass_at_k_enumerated_bad_inputs():
    with pytest.raises(ValueError, match="k=3 exceeds"):
        pass_at_k_enumerated([True, False], 3)
    with pytest.raises(TypeError, match="bools"):
        pass_at_k_enumerated([1, 0], 1)
    with pytest.raises(TypeError, match="correct"):
        pass_at_k_enumerated("TF", 1)
    with pytest.raises(ValueError, match="^k must be positive"):
        pass_at_k_enumerated([True], 0)
