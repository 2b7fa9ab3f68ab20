"""Pre-tokenisers as a sequence of regex stages: GPT-2's, SmolLM2's, Qwen2's, cl100k's, o200k's.

Introduced in notebooks/01_tokens. GPT-2's regular expression
(:data:`~llmbook.text.tokenizer.pretokenize.GPT2_SPLIT_PATTERN`) is one way to cut text
into pre-tokens before BPE; later models changed the rule, mostly around digits and
whitespace. A :class:`PreTokenizer` is a list of *stages*, each a regular expression: a
stage cuts every piece left by the stage before it at both ends of each of its matches (the
text between two matches stays a piece of its own, so the pieces always concatenate back to
the input). The presets (:data:`PRETOKENIZERS`):

* ``"gpt2"``: GPT-2's pattern alone (Radford et al., 2019). Digits run together,
  `` 2024`` is one pre-token.
* ``"smollm"``: SmolLM2's (Allal et al., 2025), as its Hugging Face ``tokenizer.json``
  declares it (``Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]``) and
  llama.cpp implements it (``LLAMA_VOCAB_PRE_TYPE_SMOLLM``): first every character of
  Unicode category N (``\\p{N}``) becomes a piece of its own, then GPT-2's pattern cuts each
  piece. A digit therefore never joins a space, and a run of spaces before a digit stays
  whole (``"a  1"`` -> ``a``, two spaces, ``1``; GPT-2's pattern gives ``a``, space, `` 1``).
* ``"qwen2"``: the single pattern of Qwen's tokenizer (Bai et al., 2023; Qwen2 keeps it,
  Yang et al., 2024), published as ``PAT_STR`` in its ``tokenization_qwen.py``:
  contractions in any case, one optional non-letter before a run of letters, *one* digit
  per pre-token, punctuation that swallows the line breaks after it, line breaks with the
  whitespace before them.
* ``"cl100k"``: the pattern of OpenAI's ``cl100k_base`` (GPT-4's tokenizer), as shipped in
  ``tiktoken_ext/openai_public.py``: like Qwen's, but numbers in groups of up to three
  digits, written with possessive quantifiers (``++``), which the ``regex`` module runs.
* ``"o200k"``: the pattern of OpenAI's ``o200k_base`` (GPT-4o's tokenizer), from the same
  file: a word is an optional non-letter, a run of capitals, then a run of lower-case
  letters, or capitals alone (marks ``\\p{M}`` count as both), so ``camelCase`` is cut
  ``camel`` + ``Case`` while ``HTTPServer`` stays whole; a contraction stays *attached* to
  its word (``don't`` is one pre-token, not ``don`` + ``'t``); numbers in groups of up to
  three digits, as cl100k.

**Streaming.** :meth:`BPETokenizer.encode_iterable` may cut a stream between pre-tokens only
where more text cannot change them. ``lookahead`` states how far that decision can reach:
every pre-token that ends at position ``e`` is decided by the text before ``q + lookahead``,
where ``q`` is the first non-whitespace character at or after ``e``. For GPT-2's pattern a
pre-token is decided by the two characters after its end (``'re`` tried at a ``'``, or
``\\s+(?!\\S)`` looking one past a run), so 3 holds. SmolLM2's first stage cuts around each
``\\p{N}`` character by looking at that character alone, and within a piece GPT-2's argument
holds, so 3 holds. Qwen's, cl100k's and o200k's patterns look past a run of whitespace, however long,
to see whether it ends in a line break or at the end of the text (``\\s*[\\r\\n]+``,
``\\s++$``), but never past the first non-whitespace character after it; every other
alternative looks at most two characters past the end of the match (o200k's letter runs
decide at the first character after them whether capitals were followed by lower case, and its
contraction suffixes, at most three characters long, start right after the letters). So 3
holds for them too, counted from ``q``. A :class:`PreTokenizer` built with ``lookahead=None`` claims nothing, and a
stream is then cut only at special tokens (exact, since text on either side of a special
token is encoded separately, but the text between two special tokens is held whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import regex

from llmbook.text.tokenizer.pretokenize import GPT2_SPLIT_PATTERN

__all__ = [
    "CL100K_SPLIT_PATTERN",
    "DIGIT_PATTERN",
    "O200K_SPLIT_PATTERN",
    "PRETOKENIZERS",
    "QWEN2_SPLIT_PATTERN",
    "PreTokenizer",
    "get_pretokenizer",
]

#: One character of Unicode category N (decimal digits, letter numbers like Ⅻ, other numbers
#: like ½ and ²): Hugging Face's ``Digits`` pre-tokeniser tests Rust's ``char::is_numeric``,
#: which is this category.
DIGIT_PATTERN = r"\p{N}"

#: Qwen's pre-tokenisation pattern (``PAT_STR`` of Qwen's ``tokenization_qwen.py``).
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: cl100k_base's pattern (``tiktoken_ext/openai_public.py``, tiktoken 0.7 and later).
CL100K_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
    r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


#: o200k_base's pattern (``tiktoken_ext/openai_public.py``, its seven alternatives joined by ``|``).
O200K_SPLIT_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


@dataclass(frozen=True)
class PreTokenizer:
    """A pre-tokeniser: regex ``stages`` applied in order, each cutting the pieces of the last.

    Args:
        name: a label (the presets use their key in :data:`PRETOKENIZERS`).
        stages: one or more regular expressions (``regex`` module syntax, so ``\\p{L}`` and
            possessive quantifiers work). Each stage cuts every piece at both ends of each
            non-empty match; the text between matches stays a piece.
        lookahead: the streaming bound of the module docstring, or ``None`` when no bound is
            claimed (then :meth:`BPETokenizer.encode_iterable` cuts only at special tokens).

    ``split(text)`` returns the pre-tokens, a ``list[str]`` that concatenates to ``text``.
    """

    name: str
    stages: tuple[str, ...]
    lookahead: int | None = None
    _compiled: tuple[tuple[regex.Pattern, regex.Pattern], ...] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        stages = self.stages
        if isinstance(stages, str) or not isinstance(stages, tuple | list) or not stages:
            raise TypeError(f"stages must be a non-empty tuple of regex strings, got {stages!r}")
        lookahead = self.lookahead
        if lookahead is not None and (isinstance(lookahead, bool) or not isinstance(lookahead, int)
                                      or lookahead < 1):
            raise ValueError(f"lookahead must be a positive int or None, got {lookahead!r}")
        compiled = []
        for k, pattern in enumerate(stages):
            if not isinstance(pattern, str) or not pattern:
                raise TypeError(f"stages[{k}] must be a non-empty str, got {pattern!r}")
            try:
                # the pattern itself (for findall) and wrapped in a group (split keeps matches)
                compiled.append((regex.compile(pattern), regex.compile(f"({pattern})")))
            except regex.error as exc:
                raise ValueError(f"stages[{k}] = {pattern!r} is not a valid regex: {exc}") from None
        object.__setattr__(self, "stages", tuple(stages))
        object.__setattr__(self, "_compiled", tuple(compiled))

    def split(self, text: str) -> list[str]:
        """The pre-tokens of ``text``, in order; ``"".join(split(text)) == text``."""
        if not isinstance(text, str):
            raise TypeError(f"split expects a str, got {type(text).__name__}")
        pieces = [text] if text else []
        for pattern, grouped in self._compiled:
            out: list[str] = []
            for piece in pieces:
                found = pattern.findall(piece)
                if sum(map(len, found)) != len(piece):  # the matches leave gaps: keep them
                    found = [s for s in grouped.split(piece) if s]
                out.extend(found)
            pieces = out
        return pieces

    def __repr__(self) -> str:
        return f"PreTokenizer({self.name!r}, {len(self.stages)} stage(s))"


#: The named presets (see the module docstring for each one's source).
PRETOKENIZERS: dict[str, PreTokenizer] = {
    "gpt2": PreTokenizer("gpt2", (GPT2_SPLIT_PATTERN,), lookahead=3),
    "smollm": PreTokenizer("smollm", (DIGIT_PATTERN, GPT2_SPLIT_PATTERN), lookahead=3),
    "qwen2": PreTokenizer("qwen2", (QWEN2_SPLIT_PATTERN,), lookahead=3),
    "cl100k": PreTokenizer("cl100k", (CL100K_SPLIT_PATTERN,), lookahead=3),
    "o200k": PreTokenizer("o200k", (O200K_SPLIT_PATTERN,), lookahead=3),
}


def get_pretokenizer(spec: str | PreTokenizer) -> PreTokenizer:
    """A preset by name (``"gpt2"``, ``"smollm"``, ``"qwen2"``, ``"cl100k"``, ``"o200k"``), or ``spec``."""
    if isinstance(spec, PreTokenizer):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"pretokenizer must be a preset name or a PreTokenizer, "
                        f"got {type(spec).__name__}")
    if spec not in PRETOKENIZERS:
        raise ValueError(f"unknown pre-tokenizer {spec!r}; the presets are {sorted(PRETOKENIZERS)}")
    return PRETOKENIZERS[spec]
