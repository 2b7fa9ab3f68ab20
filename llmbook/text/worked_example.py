"""A published worked example, reproduced: "the cat sat" through one toy transformer layer.

``data/worked_examples/the_cat_sat.json`` holds a hand-computed walk through one layer of a
toy model (vocabulary of 5, d = 4, d_k = 2, one head) as a published source printed it: the
exact inputs, and every intermediate value rounded by hand. Several chapters recompute their
step of it with the book's own functions (attention in 4, the feed-forward layer, residual
and LayerNorm in 6, logits and cross-entropy in 7, scaling laws in 11, temperature, top-k
and top-p in 12) and grade each printed number with :class:`PublishedComparison`.

A printed number with ``d`` decimals is graded, entry by entry, as

* ``"agrees"``: it is the exact value rounded to ``d`` decimals;
* ``"rounded inputs"``: it is not, but it is the value recomputed from the source's *own*
  rounded intermediates (``from_rounded``), rounded to ``d`` decimals: a by-product of
  carrying rounded numbers forward, not a mistake in the step itself;
* ``"truncated"``: it is the exact value (or the one from rounded inputs) cut, not
  rounded, to ``d`` decimals;
* ``"last digit"``: none of these, but within 1.5 units of the last printed place of the
  exact value (or of the one from rounded inputs): a slip in the last digit, perhaps from a rounded intermediate the source
  did not print;
* ``"error"``: none of these; the table gives its distance in units of the last place.

Token lists are compared exactly (as sets when ``as_set``).
"""

from __future__ import annotations

import decimal
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmbook.paths import data_path, missing_data

__all__ = ["PublishedComparison", "WorkedExample", "grade", "load_the_cat_sat"]

VERDICTS = ("agrees", "rounded inputs", "truncated", "last digit", "error")
_MATRICES = ("E", "W_Q", "W_K", "W_V", "W1", "b1", "W2", "b2", "W_out")


def _path() -> Path:
    path = data_path("worked_examples", "the_cat_sat.json")
    if not path.is_file():
        raise missing_data(path, "the worked example")
    return path


def _decimals(x: Any) -> Any:
    """Nested decimals printed for each entry of a value parsed as ``decimal.Decimal``."""
    if isinstance(x, list):
        return [_decimals(v) for v in x]
    if isinstance(x, decimal.Decimal):
        return max(0, -int(x.as_tuple().exponent))
    return None


def _floats(x: Any) -> Any:
    if isinstance(x, list):
        return [_floats(v) for v in x]
    if isinstance(x, decimal.Decimal):
        return float(x)
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    return x


@dataclass(frozen=True)
class WorkedExample:
    """The example's inputs and the source's printed values.

    ``inputs`` maps ``"E"`` (5, 4), ``"W_Q"``, ``"W_K"``, ``"W_V"`` (4, 2), ``"W1"`` (3, 4),
    ``"b1"`` (3,), ``"W2"`` (4, 3), ``"b2"`` (4,) and ``"W_out"`` (5, 4) to float64 tensors, and
    ``"temperatures"``, ``"top_k"``, ``"top_p"``, ``"target_for_cross_entropy"`` and
    ``"ffn_note"`` to plain values. ``published`` holds the printed values as floats (lists
    of str for token sets) and ``decimals`` how many decimals each printed entry has.
    """

    vocabulary: list[str]
    input_ids: list[int]
    inputs: dict[str, Any]
    published: dict[str, Any]
    decimals: dict[str, Any]
    also: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    def published_tensor(self, name: str) -> torch.Tensor:
        """A numeric published value as a float64 tensor."""
        value = self.published[name]
        if isinstance(value, list) and value and isinstance(np.ravel(value)[0], str):
            raise TypeError(f"published value {name!r} is a list of tokens, not numbers")
        return torch.tensor(value, dtype=torch.float64)


def load_the_cat_sat(path: str | Path | None = None) -> WorkedExample:
    """Load the shipped example (or the JSON file at ``path``)."""
    with open(path or _path(), encoding="utf-8") as f:
        raw = json.load(f, parse_float=decimal.Decimal)
    inputs = dict(_floats(raw["inputs"]))
    for name in _MATRICES:
        inputs[name] = torch.tensor(inputs[name], dtype=torch.float64)
    published = raw["published"]
    return WorkedExample(
        vocabulary=list(raw["vocabulary"]), input_ids=list(raw["input_ids"]), inputs=inputs,
        published=_floats(published), decimals={k: _decimals(v) for k, v in published.items()},
        also=_floats(raw.get("also_in_the_same_source", {})),
        problems=list(raw.get("known_problems_to_find_and_explain", [])))


def _round_by_hand(x: float, d: int) -> float:
    """``x`` rounded to ``d`` decimals, halves away from zero (as by hand), via Decimal so
    that 0.1385 is not first turned into 0.13849999…"""
    q = decimal.Decimal(1).scaleb(-d)
    return float(decimal.Decimal(repr(x)).quantize(q, rounding=decimal.ROUND_HALF_UP))


def _truncate(x: float, d: int) -> float:
    q = decimal.Decimal(1).scaleb(-d)
    return float(decimal.Decimal(repr(x)).quantize(q, rounding=decimal.ROUND_DOWN))


def grade(published: float, exact: float, decimals: int, from_rounded: float | None = None) -> str:
    """The verdict on one printed number (see the module docstring).

    >>> grade(0.1385, 0.13850000000000001, 4), grade(1.7454, 1.7454607, 4)
    ('agrees', 'truncated')
    """
    if not isinstance(decimals, int) or isinstance(decimals, bool) or decimals < 0:
        raise ValueError(f"decimals must be a non-negative int, got {decimals!r}")
    for name, v in (("published", published), ("exact", exact), ("from_rounded", from_rounded)):
        if v is not None and not math.isfinite(float(v)):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    tiny = 1e-9 * 10.0 ** -decimals

    def same(a: float, b: float) -> bool:
        return abs(a - b) <= tiny

    published, exact = float(published), float(exact)
    if same(published, _round_by_hand(exact, decimals)):
        return "agrees"
    if from_rounded is not None and same(published, _round_by_hand(float(from_rounded), decimals)):
        return "rounded inputs"
    cuts = [_truncate(exact, decimals)]
    if from_rounded is not None:
        cuts.append(_truncate(float(from_rounded), decimals))
    if any(same(published, c) for c in cuts):
        return "truncated"
    near = [exact] if from_rounded is None else [exact, float(from_rounded)]
    if any(abs(published - x) <= 1.5 * 10.0 ** -decimals for x in near):
        return "last digit"
    return "error"


def _flat(x: Any) -> list[Any]:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).reshape(-1).tolist()
    return np.asarray(x, dtype=object).reshape(-1).tolist()


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else np.shape(np.asarray(x, dtype=object))


def _index(i: int, shape: tuple[int, ...]) -> str:
    if len(shape) <= 1:
        return f"[{i}]" if shape else ""
    return "[" + ", ".join(str(j) for j in np.unravel_index(i, shape)) + "]"


class PublishedComparison:
    """A table grading printed values against exact ones, entry by entry.

    ``add(name, published, exact, from_rounded=None, decimals=None)`` grades one quantity
    (a number, a nested list or a tensor of the same shape as ``published``). When
    ``decimals`` is None it is taken from the shipped file if ``name`` is one of its
    published keys (so "0.200" counts as three decimals), else from the printed floats.
    The table (its ``repr``) lists every entry: published, exact and verdict, with the
    distance in units of the last printed place where they do not agree.
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self.verdicts: dict[str, list[tuple[str, Any, Any, str]]] = {}
        self._decs: dict[str, list[int]] = {}
        self._file_decimals = load_the_cat_sat().decimals

    def add(self, name: str, published: Any, exact: Any, from_rounded: Any = None,
            decimals: int | None = None, as_set: bool = False) -> list[str]:
        """Grade ``published`` against ``exact``; return the verdict of each entry."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        pub = _flat(published)
        if pub and all(isinstance(p, str) for p in pub):
            ex = _flat(exact)
            ok = set(pub) == set(ex) if as_set else pub == ex
            verdict = "agrees" if ok else "error"
            self.verdicts[name] = [("", pub, ex, verdict)]
            return [verdict]
        if _shape(published) != _shape(exact):
            raise ValueError(f"{name}: published has shape {_shape(published)} but exact has "
                             f"shape {_shape(exact)}")
        ex = [float(v) for v in _flat(exact)]
        fr = [None] * len(ex) if from_rounded is None else [float(v) for v in _flat(from_rounded)]
        if len(fr) != len(ex):
            raise ValueError(f"{name}: from_rounded has {len(fr)} entries, exact has {len(ex)}")
        if decimals is not None:
            dec = [decimals] * len(ex)
        elif name in self._file_decimals and self._file_decimals[name] is not None:
            dec = [int(d) for d in _flat(self._file_decimals[name])]
        else:
            dec = [_printed_decimals(p) for p in pub]
        shape = _shape(published)
        rows = [(_index(i, shape), float(p), e, grade(float(p), e, d, f))
                for i, (p, e, d, f) in enumerate(zip(pub, ex, dec, fr, strict=True))]
        self._decs[name] = dec
        self.verdicts[name] = rows
        return [r[3] for r in rows]

    def counts(self) -> dict[str, int]:
        """How many entries got each verdict, over the whole table."""
        out = dict.fromkeys(VERDICTS, 0)
        for rows in self.verdicts.values():
            for row in rows:
                out[row[3]] += 1
        return out

    def table(self) -> str:
        """Every graded entry: quantity, index, published, exact (two more decimals), verdict."""
        lines = [f"{self.title}: " + ", ".join(f"{n} {v}" for v, n in self.counts().items() if n)]
        width = max([len(n) for n in self.verdicts] + [8])
        lines.append(f"{'quantity':{width}s}  {'entry':8s}  {'published':>10s}  {'exact':>12s}  verdict")
        for name, rows in self.verdicts.items():
            label = name
            for k, (idx, p, e, v) in enumerate(rows):
                if isinstance(p, list):  # tokens
                    lines.append(f"{label:{width}s}  published {p}, exact {e}: {v}")
                    continue
                d = self._decs[name][k]
                note = "" if v == "agrees" else f" ({abs(p - e) / 10.0 ** -d:.1f} units of the last place)"
                lines.append(f"{label:{width}s}  {idx:8s}  {p:10.{d}f}  {e:12.{d + 2}f}  {v}{note}")
                label = ""
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def _printed_decimals(x: Any) -> int:
    text = repr(float(x))
    if "e" in text or "E" in text:
        raise ValueError(f"cannot tell how many decimals {x!r} was printed with; pass decimals")
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0
