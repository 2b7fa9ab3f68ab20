"""Quality filtering: Gopher's heuristic rules, a perplexity filter, and junk to test them on.

Introduced in notebooks/10c_data. A web crawl holds much that is not prose: navigation
menus and cookie notices, keyboard mash, the same line a hundred times, code pasted into
text. Two families of filters remove it.

* **Heuristics** (Rae et al., 2021, "Scaling Language Models: Methods, Analysis & Insights
  from Training Gopher", appendix A.1.1 and table A1): a document is dropped when it has
  fewer than 50 or more than 100,000 words, a mean word length outside 3 to 10 characters,
  more than 0.1 hash symbols or ellipses per word, more than 90 % of its lines starting
  with a bullet or 30 % ending with an ellipsis, fewer than 80 % of its words holding a
  letter, fewer than two of the stop words *the, be, to, of, and, that, have, with*, or
  too much repetition (duplicate lines, a most frequent word n-gram, duplicated word
  n-grams; thresholds in :data:`GOPHER_THRESHOLDS`). :func:`gopher_failures` names the
  rules a document breaks.
* **Perplexity** against a clean reference (Wenzek et al., 2020, "CCNet", who score web
  text with an n-gram model of Wikipedia): :class:`PerplexityFilter` trains the book's
  :class:`~llmbook.text.ngram.NGramModel` on the reference, mapped to 32 character classes
  (:func:`character_classes`), and drops documents whose per-character perplexity lies
  above a quantile of held-out reference documents.

:func:`make_junk_document` writes, with a seed, the kinds of junk the chapter tests them on.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from llmbook.paths import data_path, missing_data
from llmbook.text.data import context_ids
from llmbook.text.ngram import NGramModel
from llmbook.validation import check_positive_int, check_probability

__all__ = [
    "GOPHER_STOP_WORDS",
    "GOPHER_THRESHOLDS",
    "JUNK_KINDS",
    "NUM_CHARACTER_CLASSES",
    "PerplexityFilter",
    "character_classes",
    "gopher_failures",
    "load_prose_documents",
    "make_junk_document",
    "quality_statistics",
]

#: Gopher's stop words: a document must hold at least two of them (Rae et al., 2021, A.1.1).
GOPHER_STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})

#: Each rule: (statistic of :func:`quality_statistics`, lowest allowed, highest allowed).
GOPHER_THRESHOLDS: dict[str, tuple[str, float, float]] = {
    "word count": ("num_words", 50, 100_000),
    "mean word length": ("mean_word_length", 3, 10),
    "hash/ellipsis per word": ("symbol_word_ratio", 0, 0.1),
    "bullet lines": ("bullet_line_fraction", 0, 0.9),
    "ellipsis lines": ("ellipsis_line_fraction", 0, 0.3),
    "words with a letter": ("alphabetic_word_fraction", 0.8, 1),
    "stop words": ("stop_words_present", 2, math.inf),
    "duplicate lines": ("duplicate_line_fraction", 0, 0.3),
    "chars in duplicate lines": ("duplicate_line_char_fraction", 0, 0.2),
    "top 2-gram chars": ("top_2gram_char_fraction", 0, 0.20),
    "top 3-gram chars": ("top_3gram_char_fraction", 0, 0.18),
    "top 4-gram chars": ("top_4gram_char_fraction", 0, 0.16),
    "duplicate 5-gram chars": ("duplicate_5gram_char_fraction", 0, 0.15),
    "duplicate 10-gram chars": ("duplicate_10gram_char_fraction", 0, 0.10),
}

_BULLETS = ("•", "●", "○", "▪", "‣", "-", "*")
_ELLIPSES = ("...", "…")


def _top_ngram_char_fraction(words: list[str], n: int) -> float:
    """Characters of the most frequent word n-gram's occurrences over all word characters."""
    total = sum(len(w) for w in words)
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams or total == 0:
        return 0.0
    gram, count = grams.most_common(1)[0]
    return count * sum(len(w) for w in gram) / total


def _duplicate_ngram_char_fraction(words: list[str], n: int) -> float:
    """Characters of the words covered by a *repeat* of a word n-gram (an occurrence after
    its first) over all word characters; each word counted once, however many repeats
    cover it."""
    total = sum(len(w) for w in words)
    seen: set[tuple[str, ...]] = set()
    covered = np.zeros(len(words), dtype=bool)
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            covered[i:i + n] = True
        seen.add(gram)
    return 0.0 if total == 0 else sum(len(w) for w, c in zip(words, covered, strict=True) if c) / total


def quality_statistics(text: str) -> dict[str, float]:
    """The statistics Gopher's rules test (see :data:`GOPHER_THRESHOLDS`). Words are runs
    of non-whitespace, lower-cased for the stop words and n-grams; lines are the non-empty
    lines, stripped. Fractions of an empty document are 0.

    * ``symbol_word_ratio``: (``#`` characters + ellipses ``...`` or ``…``) / words;
    * ``bullet_line_fraction``, ``ellipsis_line_fraction``: lines starting with a bullet
      (``•``, ``-``, ``*``, ...) / ending with an ellipsis, over all lines;
    * ``duplicate_line_fraction``, ``duplicate_line_char_fraction``: the copies of a line
      after its first occurrence, by count over all lines, and by characters over all line
      characters;
    * ``top_{n}gram_char_fraction`` (n = 2, 3, 4): the characters of the words of the most
      frequent word n-gram, times its count, over all word characters;
    * ``duplicate_{n}gram_char_fraction`` (n = 5, 10): characters of the words covered by
      a repeat of an earlier word n-gram, over all word characters.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    words = text.split()
    lower = [w.lower() for w in words]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    n_words, n_lines = len(words), len(lines)
    line_counts = Counter(lines)
    dup_lines = [ln for ln in lines if line_counts[ln] > 1]
    # every copy after the first of a repeated line counts as duplicate
    extra = sum(c - 1 for c in line_counts.values())
    extra_chars = sum((c - 1) * len(ln) for ln, c in line_counts.items())
    symbols = text.count("#") + sum(text.count(e) for e in _ELLIPSES)
    stats = {
        "num_words": float(n_words),
        "mean_word_length": sum(len(w) for w in words) / n_words if n_words else 0.0,
        "symbol_word_ratio": symbols / n_words if n_words else 0.0,
        "bullet_line_fraction": (sum(ln.startswith(_BULLETS) for ln in lines) / n_lines
                                 if n_lines else 0.0),
        "ellipsis_line_fraction": (sum(ln.endswith(_ELLIPSES) for ln in lines) / n_lines
                                   if n_lines else 0.0),
        "alphabetic_word_fraction": (sum(any(c.isalpha() for c in w) for w in words) / n_words
                                     if n_words else 0.0),
        "stop_words_present": float(len(GOPHER_STOP_WORDS & set(lower))),
        "duplicate_line_fraction": extra / n_lines if n_lines else 0.0,
        "duplicate_line_char_fraction": (extra_chars / sum(len(ln) for ln in lines)
                                         if dup_lines else 0.0),
    }
    for n in (2, 3, 4):
        stats[f"top_{n}gram_char_fraction"] = _top_ngram_char_fraction(lower, n)
    for n in (5, 10):
        stats[f"duplicate_{n}gram_char_fraction"] = _duplicate_ngram_char_fraction(lower, n)
    return stats


def gopher_failures(text: str) -> list[str]:
    """The names of the rules of :data:`GOPHER_THRESHOLDS` that ``text`` breaks (empty: keep)."""
    stats = quality_statistics(text)
    return [rule for rule, (key, lo, hi) in GOPHER_THRESHOLDS.items()
            if not lo <= stats[key] <= hi]


def load_prose_documents(min_words: int = 120) -> list[str]:
    """The book's held-out prose (``data/heldout_prose.txt``, one paragraph a line) as
    documents: consecutive paragraphs joined with a space until a document has at least
    ``min_words`` words (a last, shorter remainder is dropped). Clean English to test
    filters on: every one should pass."""
    min_words = check_positive_int("min_words", min_words)
    path = data_path("heldout_prose.txt")
    if not path.is_file():
        raise missing_data(path, "the held-out prose", "python data/make_heldout_prose.py")
    docs, current = [], []
    for paragraph in path.read_text(encoding="utf-8").splitlines():
        if paragraph.strip():
            current.append(paragraph.strip())
        if sum(len(c.split()) for c in current) >= min_words:
            docs.append(" ".join(current))
            current = []
    return docs


# ---------------------------------------------------------------- perplexity filter

#: Letters a–z (case folded) are classes 0–25; then whitespace, digits, sentence ends
#: (. ! ?), clause marks (, ; :), quotes and brackets, and everything else.
NUM_CHARACTER_CLASSES = 32
_CLASS_OF = {**{chr(ord("a") + i): i for i in range(26)}, **{c: 27 for c in "0123456789"},
             **{c: 28 for c in ".!?"}, **{c: 29 for c in ",;:"},
             **{c: 30 for c in "'\"()[]{}`"}}


def character_classes(text: str) -> np.ndarray:
    """``text`` as a (len(text),) int64 array of :data:`NUM_CHARACTER_CLASSES` classes: a
    case-folded ASCII letter is its letter (0–25), any whitespace 26, then the classes of
    :data:`_CLASS_OF`, and any other character 31."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return np.array([26 if c.isspace() else _CLASS_OF.get(c.lower(), 31) for c in text],
                    dtype=np.int64)


class PerplexityFilter:
    """Score documents by their per-character perplexity under an order-``order`` n-gram
    model of a clean reference (in character classes), and drop those above a threshold.

    ``fit(reference)`` counts the reference documents (each on its own, so no n-gram spans
    two of them); ``calibrate(held_out, keep)`` sets the threshold to the ``keep`` quantile
    of the held-out reference documents' perplexities, so that about that share of clean
    text passes; ``keeps(text)`` applies it.
    """

    def __init__(self, order: int = 4, add_k: float = 0.1) -> None:
        self.model = NGramModel(check_positive_int("order", order), NUM_CHARACTER_CLASSES, add_k)
        self.threshold = math.inf
        self._log_table: np.ndarray | None = None

    def fit(self, reference: Sequence[str]) -> PerplexityFilter:
        """Count the n-grams of every reference document; returns ``self``."""
        if isinstance(reference, str) or not reference:
            raise ValueError("reference must be a non-empty sequence of documents (str)")
        self.model.counts[:] = 0
        for doc in reference:
            if len(doc) >= self.model.order:
                self.model.update(character_classes(doc))
        self._log_table = np.log(self.model.probability_table())  # (V^(n-1), V)
        return self

    def perplexity(self, text: str) -> float:
        """exp(mean negative log-likelihood per predicted character) of ``text``."""
        if self._log_table is None:
            raise RuntimeError("call fit(reference) before perplexity()")
        x = character_classes(text)
        k = self.model.order - 1
        if x.size <= k:
            raise ValueError(f"text must have more than {k} characters to be scored, got {x.size}")
        logp = self._log_table[context_ids(x, k, NUM_CHARACTER_CLASSES), x[k:]]  # (N - k,)
        return math.exp(-float(logp.mean()))

    def calibrate(self, held_out: Sequence[str], keep: float = 0.95) -> float:
        """Set and return the threshold: the ``keep`` quantile (numpy's default, linear
        interpolation) of the perplexities of ``held_out`` reference documents."""
        keep = check_probability("keep", keep)
        if isinstance(held_out, str) or not held_out:
            raise ValueError("held_out must be a non-empty sequence of documents (str)")
        self.threshold = float(np.quantile([self.perplexity(t) for t in held_out], keep))
        return self.threshold

    def keeps(self, text: str) -> bool:
        """Whether ``text`` passes: its perplexity is at most the threshold."""
        return self.perplexity(text) <= self.threshold


# ---------------------------------------------------------------- junk documents

#: The kinds of junk :func:`make_junk_document` writes.
JUNK_KINDS = ("boilerplate", "keyboard mash", "repeated lines", "code in prose", "word salad")

_BOILERPLATE = (
    "Home | About us | Products | Blog | Contact", "Skip to main content",
    "We use cookies to improve your experience. Accept all cookies",
    "Copyright © 2024 Example Ltd. All rights reserved.", "Privacy policy | Terms of use",
    "Share on Facebook Share on Twitter Share by email", "Subscribe to our newsletter!",
    "Log in | Register | Forgot your password?", "Read more...", "Previous page | Next page",
    "Click here to download the app", "Follow us on social media",
)
_CODE = (
    "for i in range(n):", "    total += values[i] * weights[i]", "if x is None:",
    "    raise ValueError('x must be given')", "return {k: v for k, v in items.items() if v}",
    "data = json.loads(path.read_text())", "self.cache[key] = (time.time(), result)",
    "print(f'{name}: {value:.3f}')", "while queue:", "    node = queue.pop(0)",
    "x = np.zeros((B, T, d), dtype=np.float32)", "#include <stdio.h>", "int main(void) {",
    "    printf(\"%d\\n\", a[i]);", "}", "# TODO: fix this hack", "assert len(out) == 2 * n",
)
_MASH_KEYS = "asdfghjklqwertyuiopzxcvbnm"


def make_junk_document(kind: str, prose: Sequence[str], rng: np.random.Generator,
                       num_words: int = 120) -> str:
    """One junk document of ``kind`` (one of :data:`JUNK_KINDS`), about ``num_words`` words:

    * ``"boilerplate"``: lines of navigation, cookie and copyright text, drawn with repeats;
    * ``"keyboard mash"``: words of 2–9 random letters, half of them from the home row;
    * ``"repeated lines"``: one sentence of ``prose`` on every line;
    * ``"code in prose"``: a sentence of ``prose``, then lines of code, and so on;
    * ``"word salad"``: the words of ``prose`` in a random order (every word real, no sentence).

    ``prose`` holds clean sentences or documents to draw from.
    """
    if kind not in JUNK_KINDS:
        raise ValueError(f"kind must be one of {JUNK_KINDS}, got {kind!r}")
    if isinstance(prose, str) or not prose:
        raise ValueError("prose must be a non-empty sequence of str to draw sentences from")
    num_words = check_positive_int("num_words", num_words)

    def sentence() -> str:
        doc = prose[int(rng.integers(len(prose)))]
        parts = [s.strip() for s in re.split(r"(?<=[.!?])\s+", doc) if len(s.split()) >= 6]
        return parts[int(rng.integers(len(parts)))] if parts else doc

    lines: list[str] = []
    count = 0
    if kind == "repeated lines":
        line = sentence()
        while count < num_words or len(lines) < 3:
            lines.append(line)
            count += len(line.split())
        return "\n".join(lines)
    if kind == "word salad":
        words = " ".join(prose[int(i)] for i in rng.permutation(len(prose))[:8]).split()
        return " ".join(words[int(i)] for i in rng.permutation(len(words))[:num_words])
    while count < num_words:
        if kind == "boilerplate":
            line = _BOILERPLATE[int(rng.integers(len(_BOILERPLATE)))]
        elif kind == "keyboard mash":
            line = " ".join(
                "".join(rng.choice(list(_MASH_KEYS[:9] if rng.random() < 0.5 else _MASH_KEYS),
                                   size=int(rng.integers(2, 10))))
                for _ in range(int(rng.integers(5, 12))))
        else:  # code in prose
            line = (sentence() + "\n" + "\n".join(
                _CODE[int(i)] for i in rng.choice(len(_CODE), size=int(rng.integers(3, 7)))))
        lines.append(line)
        count += len(line.split())
    return "\n".join(lines)
