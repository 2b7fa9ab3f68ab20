"""The checks of the exercises, one module per chapter, run on any module of answers.

``checks/chNN.py`` (``ch03``, ``ch10b``) holds chapter NN's checks as functions
``exercise_<number>_<what>(solutions)``: each takes the module (or namespace) of answers,
calls the functions it needs as ``solutions.name(...)`` and asserts, with a message in
plain words (what was expected, what came back). The number maps the check to the
exercise of the chapter's ``## Exercises`` list (:mod:`llmbook.workbench.catalogue`); an
exercise may have several checks. The same functions grade a reader's file
(:mod:`llmbook.workbench.grader`) and the book's reference solutions
(``tests/test_solutions_NN.py``), so the two cannot diverge.

A unit of the build-it-yourself track has its checks in ``checks/buildN.py`` (``build2``,
Part II), written the same way, with ``EXERCISES = {number: (stars, title)}``: a unit has no
chapter whose Exercises section would list them (:func:`build_exercises`).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

__all__ = ["Check", "approx", "build_exercises", "chapters_with_checks", "checks_for", "checks_module_name",
           "raises"]

_CHECK = re.compile(r"exercise_(\d+)(?:_\w+)?")


@dataclass(frozen=True)
class Check:
    """One check: the exercise it belongs to, the function, the answers it calls."""

    exercise: int
    name: str
    run: Callable[[object], None]
    uses: tuple[str, ...]  #: the names it reads from ``solutions``, in order of first use


@contextmanager
def raises(expected: type[BaseException] | tuple[type[BaseException], ...],
           match: str | None = None, what: str = "the call") -> Iterator[None]:
    """The checks' ``pytest.raises`` (pytest is not a dependency of the installed book): the
    block must raise ``expected``, whose message must contain a match of the regular
    expression ``match`` if one is given; otherwise an AssertionError saying what happened."""
    names = expected.__name__ if isinstance(expected, type) else " or ".join(e.__name__ for e in expected)
    try:
        yield
    except expected as err:
        if match is not None and re.search(match, str(err)) is None:
            raise AssertionError(f"expected {what} to raise {names} with a message matching "
                                 f"{match!r}, got {type(err).__name__}: {err}") from None
        return
    raise AssertionError(f"expected {what} to raise {names}, but it returned normally")


def approx(got: object, want: float | Sequence[float], rel: float | None = None,
           abs: float | None = None) -> bool:  # noqa: A002 - pytest.approx's names
    """The checks' ``got == pytest.approx(want, rel=rel, abs=abs)`` (pytest is not a dependency
    of the installed book), with pytest's rules: given only ``abs``, the tolerance is ``abs``;
    otherwise ``max(rel * |want|, abs)``, with the defaults rel 1e-6 and abs 1e-12. A sequence
    ``want`` needs a sequence ``got`` of the same length, each value within its tolerance.
    Anything that is not a number (or a sequence of them) is simply not close.
    """
    if isinstance(want, Sequence):
        return (isinstance(got, Sequence) and not isinstance(got, str) and len(got) == len(want)
                and all(approx(g, w, rel, abs) for g, w in zip(got, want, strict=True)))
    if isinstance(got, (str, bytes)):
        return False
    try:
        got, want = float(got), float(want)
    except (TypeError, ValueError):
        return False
    if abs is not None and rel is None:
        return builtins.abs(got - want) <= abs
    tol = max((1e-6 if rel is None else rel) * builtins.abs(want), 1e-12 if abs is None else abs)
    return got == want or builtins.abs(got - want) <= tol


def checks_module_name(stem: str) -> str:
    """``"03_language_modelling"`` -> ``"llmbook.workbench.checks.ch03"``; a build-it-yourself
    unit's, ``"build2_transformer"`` -> ``"llmbook.workbench.checks.build2"``."""
    head = stem.split("_")[0]
    return f"{__name__}.{head}" if head.startswith("build") else f"{__name__}.ch{head}"


def chapters_with_checks(stems: list[str]) -> list[str]:
    """The stems among ``stems`` whose checks are in the package."""
    return [s for s in stems if importlib.util.find_spec(checks_module_name(s)) is not None]


def build_exercises(stem: str) -> dict[int, tuple[int, str]]:
    """A build-it-yourself unit's exercises, ``{number: (stars, title)}``, from its checks
    module's ``EXERCISES``; ValueError when the unit has no checks module."""
    name = checks_module_name(stem)
    if importlib.util.find_spec(name) is None:
        raise ValueError(f"stem: the checks of {stem} are not in the package yet")
    return dict(sorted(importlib.import_module(name).EXERCISES.items()))


def _uses(function: Callable, parameter: str) -> tuple[str, ...]:
    """The attribute names read from ``parameter`` in ``function``'s source."""
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(function)))
    names: list[str] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == parameter and node.attr not in names):
            names.append(node.attr)
    return tuple(sorted(names, key=lambda n: inspect.getsource(function).index(f".{n}")))


def checks_for(stem: str) -> dict[int, list[Check]]:
    """Chapter ``stem``'s checks by exercise number; ValueError when it has none yet."""
    name = checks_module_name(stem)
    if importlib.util.find_spec(name) is None:
        raise ValueError(f"stem: the checks of chapter {stem} are not in the package yet")
    module: ModuleType = importlib.import_module(name)
    found: dict[int, list[Check]] = {}
    for attr, function in vars(module).items():
        m = _CHECK.fullmatch(attr)
        if m is None or not inspect.isfunction(function) or function.__module__ != name:
            continue
        (parameter,) = inspect.signature(function).parameters
        check = Check(int(m.group(1)), attr, function, _uses(function, parameter))
        found.setdefault(check.exercise, []).append(check)
    return dict(sorted(found.items()))
