"""Small helpers the notebooks share: show source, tabulate checks, seed, save figures.

Introduced in notebooks/00_preface. Every chapter uses the same four moves:

* :func:`show_source` renders the source of an ``llmbook`` function in place, so the
  reader reads the code the tests run (and nbval notices when the two drift apart);
* :class:`Checks` collects verification checks (what, expected, got, error, pass)
  and prints them as one table, failing loudly if any check fails;
* :func:`seed_everything` makes a run repeatable;
* :func:`save_figure` writes a figure to ``figures/`` under a stable name.

Importing this module applies the book's figure style (:data:`FIGURE_STYLE`): font sizes
that stay readable when a figure is shrunk to the web book's text column.

Timing cells and the scripts in ``benchmarks/`` share :func:`best_time`.
"""

from __future__ import annotations

import inspect
import math
import os
import random
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from llmbook.paths import source_checkout

__all__ = [
    "FIGURE_STYLE",
    "VERDICTS",
    "Checks",
    "ClaimGrades",
    "Formula",
    "SourceCode",
    "best_time",
    "figures_dir",
    "format_number",
    "run_solution_tests",
    "save_figure",
    "seed_everything",
    "show_source",
    "use_figure_style",
]

#: The book's matplotlib font sizes (points). A figure is shown shrunk to the text column
#: of the web book, about 700 px wide on a laptop and 350 px on a phone: a 10-inch figure
#: at 100 dpi appears at 0.7 and 0.35 of its size, where matplotlib's default 10-point
#: labels would read as 7 and 3.5 points. These sizes keep them legible.
FIGURE_STYLE: dict[str, float] = {
    "font.size": 13,
    "axes.titlesize": 14,
    "axes.labelsize": 13,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "legend.fontsize": 12,
    "legend.title_fontsize": 12,
    "figure.titlesize": 15,
}


def use_figure_style() -> None:
    """Apply :data:`FIGURE_STYLE` to matplotlib's defaults (done when this module is imported)."""
    import matplotlib

    matplotlib.rcParams.update(FIGURE_STYLE)


use_figure_style()


@dataclass(frozen=True)
class Formula:
    """A displayed formula: typeset in a notebook, its LaTeX source as text elsewhere.

    ``display(Formula(r"\\frac{a}{b} = " + sp.latex(expr)))`` renders as display math in
    Jupyter and on the web page (``_repr_latex_``), and prints the LaTeX source where there
    is no front end to typeset it (``python notebooks/04_attention.py``), where IPython's
    own ``Math`` would print ``<IPython.core.display.Math object>``.
    """

    latex: str

    def __post_init__(self) -> None:
        if not isinstance(self.latex, str) or not self.latex.strip():
            raise ValueError(f"Formula needs a non-empty LaTeX string, got {self.latex!r}")

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {self.latex}$"

    def __repr__(self) -> str:
        return self.latex


@dataclass(frozen=True)
class SourceCode:
    """Source text that renders as highlighted Python in Jupyter and as plain text elsewhere."""

    name: str
    code: str

    def _repr_markdown_(self) -> str:
        return f"```python\n{self.code}\n```"

    def __repr__(self) -> str:
        return self.code


def run_solution_tests(solution_file: str | Path) -> int:
    """Run the tests of a chapter's reference solutions and return pytest's exit status.

    Each ``notebooks/solutions/NN_slug.py`` calls this when run as a script
    (``python notebooks/solutions/04_attention.py``), so that running it reports whether
    its answers pass ``tests/test_solutions_NN.py``, one line per test, instead of printing
    nothing. The tests live in a source checkout; elsewhere it says so and returns 1.
    """
    import re
    import subprocess
    import sys

    name = Path(solution_file).name
    m = re.fullmatch(r"(\d\d[a-z]?)_\w+\.py", name)
    if m is None:
        raise ValueError(f"run_solution_tests: expected notebooks/solutions/NN_slug.py "
                         f"(NN may carry a letter, as in 10b_slug.py), got {name!r}")
    label = m.group(1)  # "04", or "10b" for a chapter added after chapter 10
    root = source_checkout()
    tests = root / "tests" / f"test_solutions_{label}.py" if root else None
    if tests is None or not tests.is_file():
        print(f"the tests of {name} live in the book's repository (tests/test_solutions_{label}.py)")
        return 1
    print(f"checking the reference solutions in {name} with {tests.relative_to(root)}")
    return subprocess.call([sys.executable, "-m", "pytest", "-v", "-rN", "--no-header",
                            "-p", "no:cacheprovider", str(tests)], cwd=root)


def show_source(obj: Any) -> SourceCode:
    """Return the source code of a function, class or method for display in a notebook.

    ``obj`` is anything :func:`inspect.getsource` accepts. The result displays as a
    highlighted code block; ``repr`` gives the plain source.
    """
    try:
        code = inspect.getsource(obj)
    except (TypeError, OSError) as exc:
        raise TypeError(f"show_source: cannot find the source of {obj!r}: {exc}") from None
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    return SourceCode(name=name, code=textwrap.dedent(code).rstrip())


def format_number(x: Any, digits: int = 4) -> str:
    """Format a number (or a sequence of numbers) compactly and deterministically.

    Integers, and floats that hold whole numbers (below 2**53), print in full; other
    floats with ``digits`` significant digits; a sequence of up
    to four numbers as ``[a, b, c, d]``. A longer one prints as its shape,
    ``shape (2, 37, 16)`` for an array or tensor and ``[1184 values]`` for a list: its
    first few float entries, shown to four digits, would change with the CPU whenever
    one of them lies near a rounding boundary, and the table must read the same on
    every machine (the error column says how close the two sides are).
    """
    if isinstance(x, bool | np.bool_):
        return str(bool(x))
    shape = None
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        shape = x.shape
        x = x.item() if x.ndim == 0 else x.ravel().tolist()
    if isinstance(x, list | tuple):
        if len(x) <= 4:
            return "[" + ", ".join(format_number(v, digits) for v in x) + "]"
        return f"shape {shape}" if shape is not None and len(shape) > 1 else f"[{len(x)} values]"
    if isinstance(x, int | np.integer):
        return str(int(x))
    if isinstance(x, float | np.floating):
        x = float(x)
        if x == 0.0:
            return "0"
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x.is_integer() and abs(x) < 2.0**53:
            return str(int(x))  # a whole number in full: 50257, never 5.026e+04
        return f"{x:.{digits}g}"
    return str(x)


def _format_error(err: float | None) -> str:
    """One significant digit. Below 1e-15 (float64 round-off at unit scale), zero included,
    the error is shown as ``<1e-15``: whether a sum comes out exactly equal or one ulp away
    depends on the CPU's kernels, and the table should read the same on every machine."""
    if err is None:
        return "-"
    if err < 1e-15:
        return "<1e-15"
    return f"{err:.0e}"


def _as_float_array(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=float)


def _snap_roundoff(x: Any, floor: float) -> Any:
    """``x`` as floats with every entry of magnitude at most ``floor`` set to 0 (for display).

    A value that should be 0 comes out as 0 on one CPU and as -3e-08 on another; shown
    with four digits, the two would print differently though both pass the check."""
    raw = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)
    if not np.issubdtype(raw.dtype, np.floating):
        return x  # integers (and anything else) are shown as they are
    a = raw.astype(float)
    return np.where(np.abs(a) <= floor, 0.0, a) if a.ndim else (0.0 if abs(a) <= floor else float(a))


def _max_abs_error(expected: Any, got: Any) -> float:
    a, b = _as_float_array(expected), _as_float_array(got)
    if a.shape != b.shape:
        raise ValueError(f"Checks: expected has shape {a.shape} but got has shape {b.shape}")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)))


@dataclass
class Checks:
    """A table of verification checks, printed in the notebook and asserted.

    Usage::

        checks = Checks("softmax against PyTorch")
        checks.close("softmax", expected=torch_p, got=our_p, tol=1e-12)
        checks.equal("tokens", expected=hf_ids, got=our_ids)
        checks.true("sums to one", bool(ok))
        checks  # displays the table; raises AssertionError if any check failed

    ``close`` compares numerically (max absolute error against ``tol``), ``equal``
    compares exactly, ``true`` records a condition that must hold.

    A failed check raises ``AssertionError`` at once, from the line that recorded it
    (``strict=True``, the default), so a chapter run as a plain script
    (``python notebooks/NN_slug.py``) stops with a non-zero exit at the first failure,
    not only when IPython displays the table. ``strict=False`` records failures and
    leaves the raising to :meth:`assert_all` (and to the notebook display).
    """

    title: str = "checks"
    rows: list[tuple[str, str, str, str, bool]] = field(default_factory=list)
    strict: bool = True

    def _record(self, row: tuple[str, str, str, str, bool]) -> bool:
        self.rows.append(row)
        if self.strict and not row[-1]:
            raise AssertionError(f"{self.title}: check failed: {row[0]!r} "
                                 f"(expected {row[1]}, got {row[2]}, error {row[3]})\n"
                                 f"{self.table()}")
        return row[-1]

    def close(self, what: str, expected: Any, got: Any, tol: float = 1e-6, rel: bool = False,
              digits: int = 4) -> float:
        """Record that ``got`` equals ``expected`` to within ``tol`` (absolute, or relative
        to ``max|expected|`` when ``rel``); return the error.

        The values are shown with ``digits`` significant digits, and entries within
        round-off of zero (magnitude at most ``min(tol, 1e-6)``, in absolute terms) as 0,
        so that the row reads the same on every CPU."""
        err = _max_abs_error(expected, got)
        scale = 1.0
        if rel:
            scale = float(np.max(np.abs(_as_float_array(expected)), initial=0.0))
            err = err / scale if scale > 0 else err
        ok = bool(err <= tol) and not math.isnan(err)
        floor = min(tol * (scale if rel and scale > 0 else 1.0), 1e-6)
        self._record((what, format_number(_snap_roundoff(expected, floor), digits),
                      format_number(_snap_roundoff(got, floor), digits), _format_error(err), ok))
        return err

    def equal(self, what: str, expected: Any, got: Any) -> bool:
        """Record that ``got == expected`` exactly (any comparable Python values)."""
        a = expected.tolist() if hasattr(expected, "tolist") else expected
        b = got.tolist() if hasattr(got, "tolist") else got
        return self._record((what, format_number(expected), format_number(got), "-", bool(a == b)))

    def true(self, what: str, condition: bool, got: Any = "") -> bool:
        """Record a condition that must hold, with an optional value to show."""
        ok = bool(condition)
        return self._record((what, "True", format_number(got) if got != "" else str(ok), "-", ok))

    @property
    def passed(self) -> bool:
        return all(row[-1] for row in self.rows)

    def table(self) -> str:
        """The checks as a fixed-width text table."""
        # the error goes last: it is the one column whose width depends on round-off
        # ("<1e-15" or "3e-08"), and nothing is padded after the last column
        header = ("check", "expected", "got", "pass", "error")
        body = [(w, e, g, "yes" if ok else "NO", err) for w, e, g, err, ok in self.rows]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(5)]
        # a check's name prints in full (the web book wraps it); long values are cut with "…"
        widths = [widths[0], *(min(w, 48) for w in widths[1:])]
        widths[4] = 6  # errors print in at most 6 characters: the rule below stays put

        def line(r: tuple[str, ...]) -> str:
            cells = [(c if len(c) <= widths[i] else c[: widths[i] - 1] + "…").ljust(widths[i])
                     for i, c in enumerate(r)]
            return "  ".join(cells).rstrip()

        rule = "  ".join("-" * w for w in widths)
        n_ok = sum(ok for *_, ok in self.rows)
        lines = [f"{self.title}: {n_ok}/{len(self.rows)} passed", line(header), rule]
        lines += [line(r) for r in body]
        return "\n".join(lines)

    def assert_all(self) -> None:
        """Raise ``AssertionError`` listing the failed checks, if any."""
        failed = [row[0] for row in self.rows if not row[-1]]
        if failed:
            raise AssertionError(f"{self.title}: failed checks: {failed}\n{self.table()}")

    def __repr__(self) -> str:
        return self.table()

    def _ipython_display_(self) -> None:
        print(self.table())
        self.assert_all()


#: The verdicts a graded claim can get (``../shared/source_claims.md``'s scale).
VERDICTS = ("correct", "rounding", "wrong", "unsupported", "true only under a condition")


@dataclass
class ClaimGrades:
    """Claims from the published texts the book was planned from, graded with evidence.

    Usage::

        claims = ClaimGrades("claims met in this chapter")
        claims.grade("C4", "the causal mask is triu(ones) * -inf", f"{n_nan} of 49 entries are NaN",
                     "wrong")
        claims  # displays the table: claim / evidence computed here / verdict

    The evidence is a sentence built from values the notebook computed (so it changes when
    they do); the verdict is one of :data:`VERDICTS`, anything else is a ``ValueError``.
    """

    title: str = "claims"
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)

    def grade(self, key: str, claim: str, evidence: str, verdict: str) -> None:
        """Add claim ``key`` (e.g. "C4") with what it says, the evidence and the verdict."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {list(VERDICTS)}, got {verdict!r}")
        for name, text in (("key", key), ("claim", claim), ("evidence", evidence)):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{name} must be a non-empty string, got {text!r}")
        self.rows.append((key, claim, evidence, verdict))

    def table(self) -> str:
        """The grades as plain text, one block per claim."""
        lines = [f"{self.title}: {len(self.rows)} graded"]
        for key, claim, evidence, verdict in self.rows:
            lines += [f"{key}  claim:    {claim}", f"{' ' * len(key)}  evidence: {evidence}",
                      f"{' ' * len(key)}  verdict:  {verdict.upper()}"]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()

    def _repr_markdown_(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        lines = [f"**{self.title}**", "", "| | claim | evidence computed here | verdict |",
                 "|---|---|---|---|"]
        lines += [f"| {key} | {cell(claim)} | {cell(evidence)} | **{verdict}** |"
                  for key, claim, evidence, verdict in self.rows]
        return "\n".join(lines)


R = TypeVar("R")


def best_time(fn: Callable[[], R], repeats: int = 3) -> tuple[float, R]:
    """(fastest wall-clock seconds of ``repeats`` calls of ``fn()``, the last call's result).

    The minimum, not the mean: other work on the machine only ever adds time, so the
    fastest run is the best estimate of what ``fn`` itself costs.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result  # type: ignore[return-value]


def seed_everything(seed: int = 0) -> Any:
    """Seed Python, NumPy and PyTorch; return a seeded ``torch.Generator``.

    Also asks PyTorch for deterministic algorithms where it has them (as
    ``torch.use_deterministic_algorithms(True, warn_only=True)`` does, without importing
    the compiler when a chapter has not), so that a notebook re-executed on the same machine
    prints the same numbers.

    String hashing (the order in which a ``set`` of strings iterates) is fixed when an
    interpreter starts, from the environment variable ``PYTHONHASHSEED``; setting it here
    cannot change the running interpreter. It is set anyway because it reaches the
    processes started afterwards (the ranks :func:`llmbook.scale.launch.launch` spawns).
    The book's own kernels get ``PYTHONHASHSEED=0`` from where they are started: the
    Makefile exports it (``make book``, ``make test``, ``make lab``) and
    ``tools/sync_notebooks.py`` sets it when it is absent (``sys.flags.hash_randomization``
    is 0 in an interpreter started with ``PYTHONHASHSEED=0``).
    """
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    # torch.use_deterministic_algorithms(True, warn_only=True) sets this flag and the
    # compiler's: importing the compiler to set it costs every chapter a second or two, and
    # most never compile, so the compiler's flag is set only where it is already loaded
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    compiler = sys.modules.get("torch._inductor.config")
    if compiler is not None:
        compiler.deterministic = True
    return torch.Generator().manual_seed(seed)


def figures_dir() -> Path:
    """Where :func:`save_figure` writes (created if needed).

    ``LLMBOOK_FIGURES`` sets it: ``make sync`` (``tools/sync_notebooks.py``), which updates
    the book, points it at the checkout's committed ``figures/``. Otherwise a reader's own
    run (JupyterLab, ``python notebooks/04_attention.py``) writes to ``build/figures/`` in a
    source checkout, which git ignores, so the checkout stays as it was; outside a
    checkout, to ``figures/`` under the current directory.
    """
    env = os.environ.get("LLMBOOK_FIGURES")
    if env:
        path = Path(env)
    else:
        root = source_checkout()
        path = root / "build" / "figures" if root is not None else Path.cwd() / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig: Any, name: str, dpi: int = 110) -> Path:
    """Save a matplotlib figure as ``<name>.png`` in :func:`figures_dir` and return the path.

    ``name`` is a bare file stem such as ``"01_tokens_compression"`` (the chapter's
    number and slug first). The PNG carries no timestamp, so re-running a notebook
    rewrites an identical file when the figure is unchanged.
    """
    if not name or "/" in name or "\\" in name or name.endswith(".png"):
        raise ValueError(f"save_figure: name must be a bare stem like '01_tokens_x', got {name!r}")
    path = figures_dir() / f"{name}.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    return path
