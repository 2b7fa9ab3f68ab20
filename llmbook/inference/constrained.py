"""Constrained decoding: a regular expression compiled to a DFA and to token masks.

Willard & Louf (2023, "Efficient Guided Generation for Large Language Models") make a
model emit only strings of a regular language: compile the expression to a deterministic
finite automaton (DFA) over characters; for each DFA state, walk every vocabulary token's
characters from that state and keep the tokens that leave the automaton alive; at each
decoding step, set the logits of the other tokens to ``-inf``. The per-state masks are
computed once, so a step costs one table look-up.

The regular-expression subset (anything else is a ``ValueError`` naming the feature):
literal characters; ``.`` (any character but a newline, as in :mod:`re`); character
classes ``[a-z0-9_]`` and ``[^...]``; the escapes ``\\d \\w \\s`` and their negations
``\\D \\W \\S`` (as :mod:`re` reads them for ``str`` patterns: Unicode digits, word characters,
white space), ``\\n \\t \\r`` and escaped punctuation; the quantifiers ``* + ?`` and ``{m}``,
``{m,}``, ``{m,n}``; alternation ``|``; groups ``( )``. The language is what
:func:`re.fullmatch` accepts; anchors, look-arounds, back-references, lazy quantifiers and
flags are not supported.

Shapes: a vocabulary of V tokens; ``TokenIndex.allowed`` (S, V) bool and
``TokenIndex.next_state`` (S, V) int32 for the S live DFA states.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from llmbook.inference.kvcache import KVCache
from llmbook.inference.sampling import sample_next
from llmbook.transformer.model import TransformerLM
from llmbook.validation import check_positive_int, check_token_ids

__all__ = ["CharSet", "RegexDFA", "TokenIndex", "compile_regex", "build_index", "token_strings",
           "constrained_generate", "allowed_along"]

_CLASSES = {"d": lambda c: unicodedata.category(c) == "Nd",
            "w": lambda c: c.isalnum() or c == "_",
            "s": lambda c: re.fullmatch(r"\s", c) is not None}
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


@dataclass(frozen=True)
class CharSet:
    """A set of characters: ``chars`` and the named classes ``classes`` (``"d"``, ``"w"``,
    ``"s"``, or ``"D"``... for a negated class), the whole complemented if ``negated``."""

    chars: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    negated: bool = False

    def __contains__(self, c: str) -> bool:
        hit = c in self.chars or any(
            _CLASSES[k.lower()](c) != k.isupper() for k in self.classes)
        return hit != self.negated


# ---------------------------------------------------------------- parsing


class _Parser:
    """Recursive descent: alt := cat ('|' cat)*; cat := rep*; rep := atom quantifier*."""

    def __init__(self, pattern: str) -> None:
        self.p, self.i = pattern, 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"pattern {self.p!r}: {what} at position {self.i} is not supported")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self) -> tuple:
        node = self.alt()
        if self.i != len(self.p):
            raise self.error("an unbalanced ')'")
        return node

    def alt(self) -> tuple:
        options = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.cat())
        return options[0] if len(options) == 1 else ("alt", options)

    def cat(self) -> tuple:
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.rep())
        return ("cat", items)

    def rep(self) -> tuple:
        node = self.atom()
        quantified = False
        while self.peek() in ("*", "+", "?", "{"):
            if quantified:
                raise self.error("a lazy, possessive or repeated quantifier")
            c = self.p[self.i]
            if c == "{":
                m = re.match(r"\{(\d+)(,(\d*))?\}", self.p[self.i:])
                if m is None:
                    raise self.error("a '{' that is not a repeat count {m}, {m,} or {m,n}")
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    raise self.error(f"the repeat count {m.group(0)} (max < min)")
                self.i += len(m.group(0))
            else:
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.i += 1
            node, quantified = ("rep", node, lo, hi), True
        return node

    def escape(self, in_class: bool) -> CharSet:
        if self.i >= len(self.p):
            raise self.error("a trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c in "dwsDWS":
            return CharSet(classes=frozenset(c))
        if c in _SIMPLE_ESCAPES:
            return CharSet(frozenset(_SIMPLE_ESCAPES[c]))
        if c.isalnum():
            raise self.error(f"the escape \\{c} (anchor, back-reference or code)")
        return CharSet(frozenset(c))

    def atom(self) -> tuple:
        c = self.p[self.i]
        if c == "(":
            self.i += 1
            if self.peek() == "?":
                raise self.error("a '(?' group (flags, look-around or named group)")
            node = self.alt()
            if self.peek() != ")":
                raise self.error("a '(' without its ')'")
            self.i += 1
            return node
        if c in "*+?{":
            raise self.error(f"a quantifier {c!r} with nothing to repeat")
        if c in "^$":
            raise self.error(f"the anchor {c!r}")
        self.i += 1
        if c == ".":
            return ("set", CharSet(frozenset("\n"), negated=True))
        if c == "\\":
            return ("set", self.escape(False))
        if c == "[":
            return ("set", self.char_class())
        return ("set", CharSet(frozenset(c)))

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        self.i += negated
        chars, classes, first = set(), set(), True
        while True:
            c = self.peek()
            if c is None:
                raise self.error("a '[' without its ']'")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            self.i += 1
            if c == "\\":
                s = self.escape(True)
                chars |= s.chars
                classes |= s.classes
                if s.classes:
                    continue
                c = next(iter(s.chars))
            if c == "[" and self.peek() == ":":
                raise self.error("a POSIX class [:...:]")
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self.p[self.i]
                self.i += 1
                if hi == "\\":
                    s = self.escape(True)
                    if s.classes:
                        raise self.error("a range ending in a class escape")
                    hi = next(iter(s.chars))
                if ord(hi) < ord(c):
                    raise self.error(f"the reversed range {c}-{hi}")
                chars |= {chr(k) for k in range(ord(c), ord(hi) + 1)}
            else:
                chars.add(c)
        return CharSet(frozenset(chars), frozenset(classes), negated)


# ---------------------------------------------------------------- NFA and DFA


class _NFA:
    """Thompson's construction: epsilon edges and character-set edges between integers."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[CharSet, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: tuple) -> tuple[int, int]:
        kind = node[0]
        if kind == "set":
            a, b = self.state(), self.state()
            self.edges[a].append((node[1], b))
            return a, b
        if kind == "cat":
            a = b = self.state()
            for item in node[1]:
                s, e = self.build(item)
                self.eps[b].append(s)
                b = e
            return a, b
        if kind == "alt":
            a, b = self.state(), self.state()
            for item in node[1]:
                s, e = self.build(item)
                self.eps[a].append(s)
                self.eps[e].append(b)
            return a, b
        _, inner, lo, hi = node  # "rep"
        a = b = self.state()
        for _ in range(lo):
            s, e = self.build(inner)
            self.eps[b].append(s)
            b = e
        if hi is None:  # a loop: b -> inner -> b
            s, e = self.build(inner)
            self.eps[b].append(s)
            self.eps[e].append(b)
            return a, b
        end = self.state()
        self.eps[b].append(end)
        for _ in range(hi - lo):  # optional copies, each may stop early
            s, e = self.build(inner)
            self.eps[b].append(s)
            self.eps[e].append(end)
            b = e
        return a, end

    def closure(self, states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


class RegexDFA:
    """The DFA of a pattern, built by subset construction as characters arrive.

    State 0 is the start; :meth:`step` returns the next state or ``-1`` (dead: no
    continuation can match). Transitions are computed once and cached, so walking a
    string is a dictionary look-up per character. ``accepting[s]``: whether the text read
    so far matches the whole pattern.
    """

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        self.pattern = pattern
        self._nfa = _NFA()
        start, self._final = self._nfa.build(_Parser(pattern).parse())
        self._sets: list[frozenset[int]] = []
        self._ids: dict[frozenset[int], int] = {}
        self._next: list[dict[str, int]] = []
        self.accepting: list[bool] = []
        self._add(self._nfa.closure({start}))

    def _add(self, s: frozenset[int]) -> int:
        if s not in self._ids:
            self._ids[s] = len(self._sets)
            self._sets.append(s)
            self._next.append({})
            self.accepting.append(self._final in s)
        return self._ids[s]

    @property
    def num_states(self) -> int:
        """How many states have been discovered so far (all reachable ones after a walk)."""
        return len(self._sets)

    def can_read(self, c: str) -> bool:
        """Whether some edge of the automaton reads ``c`` (else every state dies on it)."""
        return any(c in cs for edges in self._nfa.edges for cs, _ in edges)

    def step(self, state: int, c: str) -> int:
        """The state after reading the character ``c`` in ``state`` (-1: dead)."""
        if state < 0:
            return -1
        nxt = self._next[state]
        if c not in nxt:
            targets = {t for s in self._sets[state] for cs, t in self._nfa.edges[s] if c in cs}
            nxt[c] = self._add(self._nfa.closure(targets)) if targets else -1
        return nxt[c]

    def walk(self, state: int, text: str) -> int:
        """The state after reading ``text`` from ``state`` (-1 as soon as it dies)."""
        for c in text:
            state = self.step(state, c)
            if state < 0:
                return -1
        return state

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches all of ``text`` (what :func:`re.fullmatch` answers)."""
        s = self.walk(0, text)
        return s >= 0 and self.accepting[s]


def compile_regex(pattern: str) -> RegexDFA:
    """The DFA of ``pattern`` (see the module docstring for the subset); an unsupported
    feature is a ``ValueError`` that names it."""
    return RegexDFA(pattern)


# ---------------------------------------------------------------- token masks


@dataclass
class TokenIndex:
    """Willard & Louf's index: for each live DFA state, the tokens allowed and where they lead.

    ``allowed`` (S, V) bool: token v keeps the automaton alive from state s (for an
    accepting state the end-of-sequence ids are allowed as well). ``next_state`` (S, V)
    int32: the state after v (-1 where not allowed). ``states``: DFA state of each row;
    ``accepting`` (S,) bool; ``eos_ids``; ``walked``: how many tokens were walked per state
    (the candidates, made only of characters the automaton can read); ``states``: the DFA
    state of each row (row 0 is the start).
    """

    dfa: RegexDFA
    allowed: Tensor
    next_state: Tensor
    accepting: Tensor
    eos_ids: tuple[int, ...]
    walked: int
    states: tuple[int, ...]

    def row(self, text: str) -> int:
        """The row of ``allowed`` for the state after ``text`` (-1: ``text`` cannot be
        continued to a match with these tokens)."""
        s = self.dfa.walk(0, text)
        return self.states.index(s) if s in self.states else -1


def token_strings(vocab: Mapping[int, bytes], special_ids: Sequence[int] = ()) -> list[str | None]:
    """The text of each token id 0..V-1 of a byte-level vocabulary: ``None`` for special
    tokens, missing ids and byte strings that are not whole UTF-8 characters (such tokens
    are never allowed; a character split over two tokens is out of reach)."""
    specials = set(special_ids)
    out: list[str | None] = []
    for i in range(max(vocab) + 1 if vocab else 0):
        b = vocab.get(i)
        try:
            out.append(None if b is None or i in specials else b.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
    return out


def build_index(dfa: RegexDFA, tokens: Sequence[str | None], eos_ids: Sequence[int] = ()) -> TokenIndex:
    """Precompute the allowed tokens of every state of ``dfa`` over the vocabulary ``tokens``
    (V strings, ``None`` for a token never to emit; the empty string is never allowed).

    Only tokens made of characters the automaton can read are walked. A state is *live*
    if it is accepting (with an EOS id to end on, or none given) or some token leads to a
    live state; a token is allowed only if it leads to a live state, so decoding never
    reaches a state with no way to finish.
    """
    if not isinstance(dfa, RegexDFA):
        raise TypeError(f"dfa must be a RegexDFA, got {type(dfa).__name__}")
    V = len(tokens)
    eos = tuple(int(i) for i in check_token_ids(torch.tensor(list(eos_ids), dtype=torch.long), "eos_ids",
                                                vocab_size=V))
    chars = {c for t in tokens if t for c in t}
    readable = {c for c in chars if dfa.can_read(c)}
    cand = [v for v, t in enumerate(tokens) if t and set(t) <= readable and v not in eos]
    edges: dict[int, dict[int, int]] = {}
    frontier = [0]
    while frontier:  # every state reachable by whole tokens
        s = frontier.pop()
        if s in edges:
            continue
        edges[s] = {}
        for v in cand:
            t = dfa.walk(s, tokens[v])
            if t >= 0:
                edges[s][v] = t
                if t not in edges:
                    frontier.append(t)
    live = {s for s in edges if dfa.accepting[s]}
    changed = True
    while changed:
        new = {s for s in edges if s not in live and any(t in live for t in edges[s].values())}
        changed, live = bool(new), live | new
    states = sorted(live)
    row = {s: r for r, s in enumerate(states)}
    allowed = torch.zeros(len(states), V, dtype=torch.bool)
    nxt = torch.full((len(states), V), -1, dtype=torch.int32)
    for s in states:
        for v, t in edges[s].items():
            if t in live:
                allowed[row[s], v], nxt[row[s], v] = True, row[t]
        if dfa.accepting[s]:
            allowed[row[s], list(eos)] = True
    acc = torch.tensor([dfa.accepting[s] for s in states], dtype=torch.bool)
    if 0 not in row:
        raise ValueError(f"no sequence of these tokens matches {dfa.pattern!r}")
    return TokenIndex(dfa, allowed, nxt, acc, eos, len(cand), tuple(states))


# ---------------------------------------------------------------- decoding


@torch.no_grad()
def constrained_generate(model: nn.Module, prompt_ids: Tensor, index: TokenIndex,
                         max_new_tokens: int, temperature: float = 0.0,
                         generator: torch.Generator | None = None,
                         **rules: Any) -> tuple[list[int], bool]:
    """Decode one sequence whose text matches ``index``'s pattern.

    ``prompt_ids`` (1, T). At each step the logits of the tokens not allowed in the current
    state are set to ``-inf`` before :func:`~llmbook.inference.sampling.sample_next`
    (``temperature``, ``generator`` and ``rules`` such as ``top_p`` pass through; the mask
    comes first, so the filters see only allowed tokens). Stops on an EOS id (allowed only
    in an accepting state), or in an accepting state where no token can continue.
    Returns the new ids (the EOS id, if drawn, last) and whether their text matches the
    whole pattern (False only when ``max_new_tokens`` ran out before it did). A ``TransformerLM`` decodes with a KV cache.
    """
    ids = check_token_ids(prompt_ids, "prompt_ids", ndim=2)
    if ids.shape[0] != 1:
        raise ValueError(f"prompt_ids must have shape (1, T), got {tuple(ids.shape)}")
    n = check_positive_int("max_new_tokens", max_new_tokens)
    was_training = model.training
    model.eval()
    try:
        cache = KVCache.for_model(model, 1, ids.shape[1] + n) if isinstance(model, TransformerLM) else None
        logits = (model(ids, cache=cache) if cache is not None else model(ids))[:, -1]  # (1, V)
        state, out = 0, []
        for _ in range(n):
            mask = index.allowed[state]  # (V,)
            if not bool(mask.any()):
                return out, True  # accepting (a live state) and nothing can follow
            z = logits.masked_fill(~mask, float("-inf"))  # (1, V)
            v = int(sample_next(z, temperature=temperature, generator=generator,
                                previous_ids=ids, **rules))
            out.append(v)
            if v in index.eos_ids:
                return out, True
            state = int(index.next_state[state, v])
            ids = torch.cat([ids, torch.tensor([[v]])], dim=1)  # (1, T + 1)
            if cache is not None:
                logits = model(ids[:, -1:], cache=cache)[:, -1]
            else:
                logits = model(ids)[:, -1]
        return out, bool(index.accepting[state])
    finally:
        model.train(was_training)


def allowed_along(index: TokenIndex, new_ids: Sequence[int]) -> Tensor:
    """The masks that :func:`constrained_generate` applied while emitting ``new_ids``:
    (L, V) bool, row i the tokens allowed before token i (to replay a run teacher-forced).
    A token not allowed where it stands is a ``ValueError``."""
    state, rows = 0, []
    for i, v in enumerate(new_ids):
        if not 0 <= int(v) < index.allowed.shape[1] or not bool(index.allowed[state, int(v)]):
            raise ValueError(f"new_ids[{i}] = {v!r} is not allowed at that point of {index.dfa.pattern!r}")
        rows.append(index.allowed[state])
        if int(v) not in index.eos_ids:
            state = int(index.next_state[state, int(v)])
    return torch.stack(rows) if rows else torch.zeros(0, index.allowed.shape[1], dtype=torch.bool)
