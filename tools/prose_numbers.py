"""Numbers typed into the chapters' prose, each tied to what explains it (part of ``make test``).

A number in a markdown cell can drift from the output it describes: the code changes, the
notebook is re-executed, and the sentence beside it still says the old value. This tool
reads every executed chapter ``notebooks/NN_slug.ipynb``, takes the numbers out of its
markdown cells and accepts each one only for a reason it can check:

computed
    The same number, to the digits the prose types, appears in the committed outputs of the
    chapter's code cells: ``0.41`` matches an output ``0.4123`` (rounded the way the prose
    rounds), ``50,257`` matches ``50257``, ``135M`` matches ``134,515,008``, ``12%`` matches
    ``0.12`` or ``12.0%``. When the output changes, the typed number no longer appears and
    the check fails. A match in the number's own section (``##`` heading) is preferred and
    counted separately from one elsewhere in the chapter.
code
    The number is a literal in the chapter's code cells, with the same value (``0.5%`` and
    ``0.005``, ``3e-4`` and ``0.0003``): a setting the prose restates. Changing the code's
    value fails the check.
declared
    The registry ``tools/prose_numbers.toml`` lists it for this chapter with a kind and a
    reason: a published constant with its citation, a definition, a mathematical fact, a
    property of a format or a machine. An entry that matches no typed number fails too, so
    the registry cannot go stale.

Everything else is *unexplained* and fails ``tests/test_prose_numbers.py`` with its chapter,
the line of ``notebooks/NN_slug.py`` it is typed on, and the text around it.

What counts as a typed number (the extraction rules, each tested on small strings):

1. Digits with optional thousands separators (``50,257``, LaTeX ``50{,}257``), decimals,
   a sign (``-`` or ``−``) when it stands alone before the digits, scientific notation
   (``1.8e-4``, ``3 \\times 10^{-4}``, ``3×10^23``), a percent sign (``12%``, ``12 \\%``), a
   ratio sign (``4.2×``, ``4x``) and a magnitude suffix (``175B``, ``98 MB``: ``k``, ``K``,
   ``M``, ``B``, ``G``, ``T`` scale the value; a unit such as ``GB``, ``ms`` or ``FLOPs`` is
   kept with it).
2. Not a number: digits that belong to a name (``GPT-2``, ``fp16``, ``W_1``, ``Qwen2-0.5B``,
   ``2D``, ``1st``, ``x86``), a version or a dotted triple (``2.13.0``), an arXiv or DOI
   identifier, a URL, or anything inside a fenced code block.
3. Not a number: references to the book's own structure, ``chapter 7``, ``chapters 2 to 6``,
   ``section 7.3``, ``§4``, ``Part V``, ``equation 1.1``, ``figure 2``, ``table 3``,
   ``exercise 4``, ``step 2``; the section number that opens a heading (``## 7.1 The block``);
   and the number that opens a list item (``1. **power laws**``).
4. Not a number: a year in a citation, 1900 to 2099 after an author or ``et al.``, or in
   parentheses: ``(Kaplan et al., 2020)``, ``Hoffmann et al. (2022)``, ``Shannon 1948``,
   ``the 2024 replication`` is *not* caught by this rule and must be declared.
5. In LaTeX math (``$...$`` and ``$$...$$``) the digits of an index or an exponent
   (``x_1``, ``W_{12}``, ``x^2``, ``2^{-\\alpha}``, ``e^{-4}`` except as the exponent of a
   ``10^{...}`` written as scientific notation) and integers below 100 are the formula's
   structure (``\\frac{1}{2}``, ``6ND``, ``T-1``), not values; decimals and integers of 100
   or more in math are values like any other.

Run ``python tools/prose_numbers.py`` to list the unexplained numbers (``--all`` lists every
number with its reason, ``--summary`` prints the counts).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
REGISTRY = ROOT / "tools" / "prose_numbers.toml"

KINDS = {
    "published": "a published constant or result; the why names the source",
    "math": "a number worked out in the prose; `value` holds the expression that checks it",
    "elsewhere": "computed or set outside the chapter's cells; `source` names the file that "
                 "holds it (another chapter's .ipynb outputs, a data file, the package's code)",
    "definition": "fixed by a standard or a format (IEEE 754, uint16, a data type's range)",
    "illustration": "a round number chosen for an example or an exercise, computed nowhere",
    "estimate": "an order of magnitude the prose reasons out, not a measured value",
    "history": "a date that is not a citation's year, or a result of an earlier version",
    "figure": "read off a plotted curve or a shipped artifact's record that the chapter does "
              "not print; it can drift unseen when the artifact is remade",
}
REQUIRED = {"math": "value", "elsewhere": "source"}

MAGNITUDE = {"k": 10**3, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12,
             "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
UNITS = {
    "ms", "s", "µs", "us", "ns", "min", "h", "x", "GB", "MB", "KB", "kB", "TB", "GiB", "MiB",
    "KiB", "bit", "bits", "FLOP", "FLOPs", "GFLOP", "GFLOPs", "TFLOP", "TFLOPs", "PFLOP",
    "Hz", "GHz", "MHz", "W", "kW",
}

UNIT_SCALE = {"kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10,
              "MiB": 2**20, "GiB": 2**30, "GFLOP": 10**9, "TFLOP": 10**12}

# a number: sign, digits with thousands separators, decimals, exponent
NUMBER = re.compile(
    r"(?P<sign>[-−])?(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d{1,3}(?:[  \u202f]\d{3})+(?!\d|[.,]\d)"
    r"|\d+)(?P<frac>\.\d+)?(?P<exp>[eE][-+−]?\d+)?"
    r"(?P<times>\s*(?:×|\\times|\\cdot)\s*10\^(?:\{\s*(?P<texp>[-−]?\d+)\s*\}|(?P<texp1>\d+)))?"
)
STRUCTURE_WORDS = (r"chapters?|ch\.|sections?|§|parts?|equations?|eqs?\.|eq\.|figures?|fig\.|"
                   r"tables?|exercises?|steps?|lines?|cells?|appendix|items?|issues?|rows?|lectures?|"
                   r"pull request|PR|torch|PyTorch|Python|CUDA|version|IEEE|ISO")
REFERENCE = re.compile(
    rf"(?:\b(?:{STRUCTURE_WORDS})|§)\s*~?\(?"
    r"(?:\d+(?:\.\d+)*[a-z]?)(?:\s*(?:,|and|to|or|–|-|&)\s*(?:\d+(?:\.\d+)*[a-z]?))*",
    re.IGNORECASE,
)
HEADING_NUMBER = re.compile(r"^#{1,6}\s+\d+(?:\.\d+)*\.?(?=\s)")
LIST_NUMBER = re.compile(r"^\s*\d+[.)](?=\s)")
YEAR = re.compile(
    r"(?:et\s+al\.?,?\s*\(?|(?<=\w),\s+|\(|\b[A-Z][a-zé]+\s+(?=\d{4}\)))"
    r"(?P<year>19\d\d|20[0-2]\d)[a-z]?(?=[),;:]|,\s|\s+\()"
)
URL = re.compile(r"https?://\S+|U\+[0-9A-F]+|\]\([^)]*\)|arXiv:\s*\d+\.\d+(?:v\d+)?|doi:\S+|\b10\.\d{4,}/\S+",
                 re.IGNORECASE)
INLINE_CODE = re.compile(r"`[^`]*`")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.DOTALL)
SUFFIX = re.compile(r"\s?(?P<pct>%|\\%)|(?P<ratio>×|x\b)|\s?(?P<unit>[A-Za-zµ]+)")
ORDINAL = {"st", "nd", "rd", "th"}


@dataclass
class Typed:
    """One number typed in a markdown cell."""

    chapter: str
    cell: int
    line: int  # 1-based line of notebooks/NN_slug.py; 0 when unknown
    text: str  # as typed, e.g. "50,257" or "1.8e-4" or "12%"
    value: Decimal  # with the magnitude applied (175B -> 1.75e11); a percent as typed
    step: Decimal  # the resolution the prose types it to (0.41 -> 0.01), scaled the same way
    percent: bool = False
    mantissa: Decimal | None = None  # the value before a magnitude suffix (175 for 175B)
    in_math: bool = False
    context: str = ""
    section: str = ""
    reason: str = ""  # how it is explained, filled in by classify()


@dataclass
class Chapter:
    name: str
    cells: list[dict]
    py_lines: list[str] = field(default_factory=list)

    def outputs_text(self) -> str:
        return "\n".join(c["outputs"] for c in self.cells if c["type"] == "code")


# ---------------------------------------------------------------- extraction

def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    """Replace the characters of ``spans`` by spaces (offsets stay valid)."""
    chars = list(text)
    for a, b in spans:
        for i in range(a, b):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def _math_structure(math: str) -> list[tuple[int, int]]:
    """Spans inside a math string that are indices or exponents (not scientific notation)."""
    spans = []
    for m in re.finditer(r"[_^]", math):
        i = m.end()
        # the exponent of "10^{...}" after a mantissa and \times is scientific notation
        if m.group() == "^" and re.search(r"(?:×|\\times|\\cdot)\s*10$", math[:m.start()]):
            continue
        if i < len(math) and math[i] == "{":
            depth, j = 0, i
            while j < len(math):
                depth += math[j] == "{"
                depth -= math[j] == "}"
                j += 1
                if depth == 0:
                    break
            spans.append((i, j))
        elif i < len(math) and math[i] == "\\":  # x_\text{...}: leave it
            continue
        elif i < len(math):
            spans.append((i, i + 1))
    return spans


def _parse(m: re.Match) -> tuple[Decimal, Decimal]:
    """The value of a NUMBER match and the step of its last typed digit."""
    digits = re.sub(r"[,  \u202f]", "", m.group("int")) + (m.group("frac") or "")
    value = Decimal(digits)
    frac = m.group("frac")
    if frac:
        step = Decimal(1).scaleb(-(len(frac) - 1))
    else:  # "about 470,000": trailing zeros of an integer are the prose's rounding
        zeros = len(digits) - len(digits.rstrip("0"))
        step = Decimal(10) ** min(zeros, len(digits) - 1) if len(digits) >= 3 else Decimal(1)
    exp = m.group("exp")
    texp = m.group("texp") or m.group("texp1")
    if exp:
        e = int(exp[1:].replace("−", "-"))
        value, step = value.scaleb(e), step.scaleb(e)
    if texp:
        e = int(texp.replace("−", "-"))
        value, step = value.scaleb(e), step.scaleb(e)
    if m.group("sign"):
        value = -value
    return value, step


def extract(text: str, chapter: str = "", cell: int = 0,
            sections: frozenset[str] = frozenset()) -> list[Typed]:
    """The typed numbers of one markdown cell's source, by the rules of the module docstring.

    ``sections`` are the chapter's own section numbers (``"18.1"``): typed bare, as in "the
    derivation of 18.1", they are references too.
    """
    found: list[Typed] = []
    # a LaTeX thousands separator: 50{,}257 and 50\\,257 read as 50,257
    text = re.sub(r"(?<=\d)(?:\{,\}|\\,)(?=\d{3})", ",", text)
    # fenced code blocks are code, not prose
    text = re.sub(r"^```.*?^```", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                  flags=re.DOTALL | re.MULTILINE)
    skip: list[tuple[int, int]] = []
    for rx in (URL, REFERENCE):
        skip += [m.span() for m in rx.finditer(text)]
    skip += [m.span("year") for m in YEAR.finditer(text)]
    offset = 0
    for line in text.split("\n"):
        for rx in (HEADING_NUMBER, LIST_NUMBER):
            if m := rx.match(line):
                skip.append((offset + m.start(), offset + m.end()))
        offset += len(line) + 1
    # a dollar sign inside inline code is code, not the start of math
    text = INLINE_CODE.sub(lambda m: m.group().replace("$", "\u2063"), text)
    math_spans = [m.span() for m in MATH.finditer(text)]
    for a, b in math_spans:
        skip += [(a + i, a + j) for i, j in _math_structure(text[a:b])]
    masked = _mask(text, skip)
    for m in NUMBER.finditer(masked):
        a, b = m.span()
        before = masked[a - 1] if a else " "
        before2 = masked[max(0, a - 2):a]
        if m.group("sign") and (masked[a + 1:a + 2] == " "):
            continue
        if before.isalnum() or before in "_.\\" or (before in "-−" and a >= 2
                                                     and (before2[0].isalnum())):
            continue  # part of a name: fp16, W_1, GPT-2, x86, v1.2
        if m.group("sign") and a and (masked[a - 1].isalnum() or masked[a - 1] in ")}]"):
            continue  # a binary minus reads "x-1", not "-1": the digits start after it
        rest = masked[b:b + 12]
        if re.match(r"\.\d", rest) or re.match(r",\d", rest):
            continue  # a version or dotted number: 2.13.0
        if m.group() in sections:
            continue  # a reference to one of the chapter's sections: "the policy of 18.2"
        in_math = any(x <= a < y for x, y in math_spans)
        value, step = _parse(m)
        percent = False
        mantissa = None
        s = SUFFIX.match(rest)
        if s and s.group("pct"):
            percent = True
            b += s.end()
        elif s and s.group("ratio"):
            b += s.end()
        elif s and s.group("unit"):
            word = s.group("unit")
            if word in ORDINAL or (rest[:1].isalpha() and word not in MAGNITUDE
                                   and word not in UNITS and word.rstrip("s") not in UNITS):
                continue  # a name or an ordinal: 2D, 1st, 4o
            if word in MAGNITUDE or (word[:1] in MAGNITUDE and word[1:] in UNITS | {""}):
                mag = 1 if word in UNITS else MAGNITUDE.get(word) or MAGNITUDE[word[0]]
                if mag != 1:
                    mantissa = value
                    value, step = value * mag, step * mag
                b += s.end()
            elif word in UNITS:
                b += s.end()
                if word in UNIT_SCALE:  # 4.9 MB is 4,900,000 bytes to the prose's rounding
                    mantissa = value
                    value, step = value * UNIT_SCALE[word], step * UNIT_SCALE[word]
        if in_math and not m.group("frac") and not m.group("exp") and not m.group("times") \
                and not percent and mantissa is None and abs(value) < 100:
            continue  # a formula's own small integer: \frac{1}{2}, 6ND, T-1
        typed_text = text[a:b].strip()
        line_start = text.rfind("\n", 0, a) + 1
        line_end = text.find("\n", a)
        line_end = len(text) if line_end < 0 else line_end
        found.append(Typed(chapter=chapter, cell=cell, line=text.count("\n", 0, a),
                           text=typed_text, value=value, step=step, percent=percent,
                           mantissa=mantissa, in_math=in_math,
                           context=text[line_start:line_end].strip()))
    return found


# numbers in outputs and code: permissive (any digits), each with its value
OUT_NUMBER = re.compile(
    r"(?<![\d.])(?P<sign>[-−])?(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?"
    r"(?P<exp>[eE][-+−]?\d+)?(?P<times>\s*(?:×|\\times|\\cdot)\s*10\^(?:\{\s*(?P<texp>[-−]?\d+)"
    r"\s*\}|(?P<texp1>\d+)))?(?P<mag>\s?[kKMBGT](?![A-Za-z]))?"
)


class Values:
    """The numbers of some output or code text, sorted, each with the step it is written to."""

    def __init__(self, pairs: list[tuple[Decimal, Decimal]] = ()):
        self.pairs = sorted(pairs)
        self.keys = [v for v, _ in self.pairs]
        self.exact = set(self.keys)

    def __or__(self, other: Values) -> Values:
        return Values(self.pairs + other.pairs)

    def within(self, low: Decimal, high: Decimal, step: Decimal) -> bool:
        """Whether a value in [low, high] is written to ``step`` or more finely."""
        i = bisect.bisect_left(self.keys, low)
        while i < len(self.keys) and self.keys[i] <= high:
            if self.pairs[i][1] <= step:
                return True
            i += 1
        return False


def output_values(text: str) -> Values:
    """Every number in an output or code text (permissive: digits inside names count too).

    A number with a magnitude suffix (``135M``) counts both as written and scaled; a number
    after a dash counts both negative and positive (the dash may be a range or a bullet).
    """
    pairs = []
    text = text.replace("{,}", ",").replace("_", "")  # 1_000_000 in code
    for m in OUT_NUMBER.finditer(text):
        value, _ = _parse(m)
        frac = m.group("frac")
        step = Decimal(1).scaleb(-(len(frac) - 1)) if frac else Decimal(1)
        e = m.group("exp") or ""
        texp = m.group("texp") or m.group("texp1")
        if e or texp:
            step = step.scaleb(int((e[1:] if e else texp).replace("−", "-")))
        pairs += [(value, step), (abs(value), step)]
        mag = (m.group("mag") or "").strip()
        if mag:
            pairs.append((abs(value) * MAGNITUDE[mag], step * MAGNITUDE[mag]))
    return Values(pairs)


# ---------------------------------------------------------------- reading the chapters

def _text_of(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "\n".join("".join(v) if isinstance(v, list) else str(v)
                     for k, v in data.items() if k.startswith("text/"))


def read_chapter(ipynb: Path) -> Chapter:
    nb = json.loads(ipynb.read_text())
    cells = []
    for c in nb["cells"]:
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        outs = "\n".join(_text_of(o) for o in c.get("outputs", []))
        cells.append({"type": c["cell_type"], "source": src, "outputs": outs})
    py = ipynb.with_suffix(".py")
    return Chapter(ipynb.stem, cells, py.read_text().split("\n") if py.exists() else [])


def _py_line(chapter: Chapter, cell: int, line_in_cell: int, text: str) -> int:
    """The 1-based line of the .py source that holds line ``line_in_cell`` of ``cell``."""
    markers = [i for i, s in enumerate(chapter.py_lines) if s.startswith("# %%")]
    if cell < len(markers):
        start = markers[cell] + 1
        # jupytext may drop blank lines at a cell's start: search a little way on
        target = text.split("\n")[line_in_cell].strip()
        for i in range(start + line_in_cell, min(start + line_in_cell + 5,
                                                  len(chapter.py_lines))):
            if chapter.py_lines[i].lstrip("#").strip() == target:
                return i + 1
    return 0


def chapter_numbers(chapter: Chapter) -> list[Typed]:
    typed = []
    section = ""
    numbers = frozenset(re.findall(r"^##+\s+(\d+\.\d+(?:\.\d+)*)", "\n".join(
        c["source"] for c in chapter.cells if c["type"] == "markdown"), re.MULTILINE))
    for i, c in enumerate(chapter.cells):
        if c["type"] != "markdown":
            continue
        heads = re.findall(r"^##\s+(.*)$", c["source"], re.MULTILINE)
        section = heads[-1].strip() if heads else section
        for t in extract(c["source"], chapter.name, i, numbers):
            t.section = section
            t.line = _py_line(chapter, i, t.line, c["source"])
            typed.append(t)
    return typed


# ---------------------------------------------------------------- matching

def _candidates(t: Typed) -> list[tuple[Decimal, Decimal]]:
    """(value, step) pairs the typed number may stand for."""
    cands = [(t.value, t.step)]
    if t.mantissa is not None:
        cands.append((t.mantissa, t.step / (t.value / t.mantissa)))
    if t.percent:  # 12% as 0.12, and "44% more" or "12% less" as the ratios 1.44 and 0.88
        cands += [(t.value / 100, t.step / 100), (1 + t.value / 100, t.step / 100),
                  (1 - t.value / 100, t.step / 100)]
    return cands


def matches(t: Typed, values: Values, exact: bool = False) -> bool:
    """Whether one of ``values`` rounds to the typed number (equals it, when ``exact``).

    Rounding: an output ``v`` matches a number typed as ``x`` to a step ``s`` (0.41: 0.01)
    when ``|v - x| <= s/2`` and ``v`` is itself written to ``s`` or more finely, so that the
    typed digits can be read off the output (an output ``2`` does not explain a typed 2.06).
    """
    for value, step in _candidates(t):
        if exact:
            if value in values.exact:
                return True
        elif values.within(value - step / 2, value + step / 2, step):
            return True
    return False


MATH_NAMES = {k: getattr(math, k) for k in (
    "sqrt", "log", "log2", "log10", "exp", "pi", "e", "erf", "tanh", "cos", "sin", "ceil",
    "floor", "comb", "factorial")}


def _verify(t: Typed, entry: dict) -> str:
    """Check a registry entry's ``value`` (an expression) or ``source`` (a file) against ``t``.

    Returns what is wrong, or "" when the typed number is what the entry says it is.
    """
    if "value" in entry:
        got = eval(entry["value"], {"__builtins__": {}}, MATH_NAMES)  # the registry's own text
        if not matches(t, Values([(Decimal(repr(float(got))), Decimal(0))])):
            return f"value {entry['value']} = {got:.6g} does not round to {t.text}"
    if "source" in entry:
        path = ROOT / entry["source"]
        if not path.exists():
            return f"source {entry['source']} does not exist"
        text = (read_chapter(path).outputs_text() if path.suffix == ".ipynb"
                else path.read_text())
        if not matches(t, output_values(text)):
            return f"{t.text} is not in {entry['source']}"
    return ""


def load_registry(path: Path = REGISTRY) -> dict[str, dict[str, str]]:
    if not path.exists():
        return {}
    return tomllib.loads(path.read_text())


def classify(chapter: Chapter, registry: dict[str, dict[str, str]] | None = None
             ) -> tuple[list[Typed], list[str]]:
    """Every typed number of ``chapter`` with its reason; and the registry's stale entries."""
    registry = load_registry() if registry is None else registry
    declared = registry.get(chapter.name, {})
    typed = chapter_numbers(chapter)
    sections: dict[str, Values] = {}
    section = ""
    for c in chapter.cells:
        if c["type"] == "markdown":
            heads = re.findall(r"^##\s+(.*)$", c["source"], re.MULTILINE)
            section = heads[-1].strip() if heads else section
        elif c["outputs"]:
            sections[section] = sections.get(section, Values()) | output_values(c["outputs"])
    everywhere = Values([p for v in sections.values() for p in v.pairs])
    code = output_values("\n".join(c["source"] for c in chapter.cells if c["type"] == "code"))
    number = chapter.name.split("_")[0]
    # the exercises' checks: the tests of the reference solutions, and the package's checks
    # that they run (llmbook/workbench/checks/chNN.py, issue 28)
    checked = [ROOT / "tests" / f"test_solutions_{number}.py",
               ROOT / "llmbook" / "workbench" / "checks" / f"ch{number}.py"]
    solution = output_values("\n".join(p.read_text() for p in checked if p.exists()))
    used = set()
    for t in typed:
        if matches(t, sections.get(t.section, Values())):
            t.reason = "computed (same section)"
        elif matches(t, everywhere):
            t.reason = "computed (elsewhere in the chapter)"
        elif matches(t, code, exact=True):
            t.reason = "code"
        elif matches(t, solution):
            t.reason = "exercise"
        elif t.text in declared:
            entry = declared[t.text]
            t.reason = f"declared {entry.get('kind', '?')}"
            used.add(t.text)
            if problem := _verify(t, entry):
                t.reason = ""
                t.context = f"{t.context}  [registry: {problem}]"
    stale = [f"{chapter.name}: registry entry {k!r} matches no unexplained typed number"
             for k in declared if k not in used]
    stale += [f"{chapter.name}: registry entry {k!r} needs a kind (one of {', '.join(KINDS)}) "
              f"and a why" for k, v in declared.items()
              if not isinstance(v, dict) or v.get("kind") not in KINDS or not v.get("why")]
    stale += [f"{chapter.name}: registry entry {k!r} of kind {v['kind']} needs a "
              f"{REQUIRED[v['kind']]}" for k, v in declared.items() if isinstance(v, dict)
              and v.get("kind") in REQUIRED and REQUIRED[v["kind"]] not in v]
    return typed, stale


def check(nb_dir: Path = NOTEBOOKS, registry: dict | None = None
          ) -> tuple[list[Typed], list[str]]:
    """All typed numbers of the book and the problems: unexplained numbers, stale entries."""
    registry = load_registry() if registry is None else registry
    everything, problems = [], []
    names = set()
    for ipynb in sorted(nb_dir.glob("[0-9][0-9]*_*.ipynb")):
        chapter = read_chapter(ipynb)
        names.add(chapter.name)
        typed, stale = classify(chapter, registry)
        everything += typed
        problems += stale
        problems += [describe(t) for t in typed if not t.reason]
    problems += [f"registry names a chapter that does not exist: {k}" for k in registry
                 if k not in names]
    return everything, problems


def describe(t: Typed) -> str:
    where = f"notebooks/{t.chapter}.py:{t.line}" if t.line else f"{t.chapter} cell {t.cell}"
    return f"{where}: unexplained number {t.text!r} in: {t.context}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list every number and its reason")
    parser.add_argument("--summary", action="store_true", help="print only the counts")
    args = parser.parse_args(argv)
    typed, problems = check()
    if args.all:
        for t in typed:
            print(f"{t.chapter}:{t.line}\t{t.text}\t{t.reason or 'UNEXPLAINED'}\t{t.context}")
    elif not args.summary:
        for p in problems:
            print(p)
    counts = Counter(t.reason.split(" (")[0] if t.reason else "unexplained" for t in typed)
    detail = Counter(t.reason for t in typed if t.reason)
    print(f"{len(typed)} typed numbers: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(detail.items())))
    stale = [p for p in problems if "registry" in p]
    if stale:
        print(f"{len(stale)} registry problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
