"""``llmbook grade``: grade a reader's answers to a chapter's exercises, one row per exercise.

:func:`grade` takes a chapter and either a file (the reader's workspace copy of the stub,
see :mod:`llmbook.workbench.stubs`) or a namespace (a module, or ``globals()`` in a
notebook). A file is graded in a subprocess (:mod:`llmbook.workbench.runner`), so that
nothing the reader's code does (an infinite loop, a crash, ``sys.exit``, printing) can
hang or break the grader: each exercise has a time limit, enforced in the child with
``SIGALRM`` and, for a loop that never returns to Python, by killing the child, after
which the remaining exercises run in a fresh one. The file is only read. A namespace is
graded in this process with the same checks and the ``SIGALRM`` limit. A notebook's
``globals()`` (a namespace with a ``__name__``) counts as the reader's only the functions
and classes defined in it; an answer it does not define is taken from the reference and
its row says so, so that the book, executed as shipped, shows every exercise passing, and a
reader who defines a function of the same name sees their own result.

Each row is passed, failed (the check's message: what was expected, what came back), not
attempted (the function still raises ``NotImplementedError``) or error: syntax error,
import error, missing function, wrong signature, wrong return type, time limit exceeded,
or an exception in the reader's code (its type, line and message; never a traceback).
Nothing here needs pytest: the checks write their own messages.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from llmbook.workbench.catalogue import catalogue, exercises_of
from llmbook.workbench.checks import chapters_with_checks, checks_for
from llmbook.workbench.runner import ERROR, NOT_ATTEMPTED, PASSED, Result, run_exercises
from llmbook.workbench.solutions import (
    DEFAULT_DIR,
    is_build,
    label,
    load_solutions,
    resolve_chapter,
    unit_stems,
)

__all__ = ["DEFAULT_TIME_LIMIT", "Report", "Row", "format_table", "grade", "main", "print_list"]

#: Seconds each exercise may run (``--time-limit``); chapter 3's slowest takes about 3 s.
DEFAULT_TIME_LIMIT = 60.0
#: Seconds the child may take to start and import the reader's file (and with it torch).
STARTUP_SECONDS = 120.0
#: Seconds past an exercise's limit before the child is killed (when SIGALRM did not stop it).
KILL_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class Row:
    """One exercise's line of the table."""

    stem: str
    exercise: int
    stars: int | None
    title: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    #: the answers the check called that were the book's, not the reader's (notebook grading)
    borrowed: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == PASSED


class Report(list):
    """The rows :func:`grade` returns; a notebook shows them as the table, without timings
    (which vary from run to run)."""

    def __repr__(self) -> str:
        text = format_table(self, seconds=False)
        if any(r.borrowed for r in self):
            unit = self[0].stem
            text += ("\n  \"the book's\": graded on the reference solution, as this notebook "
                     "defines no function of\n  that name; define yours here (`llmbook exercises "
                     f"{label(unit)}` writes stubs to start from)\n  and run this cell again.")
        return text


def _borrow(stem: str, found: dict[str, object], names: set[str]) -> set[str]:
    """Fill ``found`` (a notebook's globals) with the reference's answers among ``names``
    that the notebook does not define itself; return the names filled.

    A name counts as defined in the notebook when it is a function or class whose
    ``__module__`` is the namespace's ``__name__``: an ``import`` of the book's own function
    of the same name is not an answer.
    """
    home = found.get("__name__")
    reference = load_solutions(stem)
    borrowed = set()
    for name in sorted(names):
        value = found.get(name)
        own = ((inspect.isfunction(value) or inspect.isclass(value))
               and getattr(value, "__module__", None) == home)
        if not own and hasattr(reference, name):
            found[name] = getattr(reference, name)
            borrowed.add(name)
    return borrowed


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9) if hasattr(os, "killpg") else proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _grade_file(stem: str, path: Path, numbers: list[int], limit: float) -> dict[int, Result]:
    """Run the checks on the file ``path`` in subprocesses; a result for every number."""
    results: dict[int, Result] = {}
    remaining = list(numbers)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    while remaining:
        spec = {"stem": stem, "file": str(path.resolve()), "time_limit": limit,
                "import_limit": STARTUP_SECONDS, "exercises": remaining}
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "llmbook.workbench.runner", json.dumps(spec)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env,
                cwd=path.parent, start_new_session=True)
            selector = selectors.DefaultSelector()
            selector.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + STARTUP_SECONDS + KILL_GRACE_SECONDS
            current, started, buffer, loaded = None, 0.0, b"", False
            while True:
                wait = deadline - time.monotonic()
                if wait <= 0 or not selector.select(timeout=wait):
                    _kill(proc)
                    if current is None:
                        detail = ("time limit exceeded: importing your file did not finish"
                                  if not loaded else "the grader's process stopped answering")
                        for n in remaining:
                            results[n] = Result(n, ERROR, detail)
                        remaining = []
                    else:
                        results[current] = Result(
                            current, ERROR, f"time limit exceeded: still running after "
                            f"{limit:g} s", time.monotonic() - started)
                        remaining.remove(current)
                    break
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:  # the child ended
                    code = proc.wait()
                    err.seek(0)
                    tail = [line for line in err.read().decode(errors="replace").splitlines()
                            if line.strip()]
                    last = tail[-1].strip() if tail else ""
                    if remaining and current is None and not loaded:
                        for n in remaining:
                            results[n] = Result(n, ERROR, f"your file could not be loaded "
                                                f"(exit status {code}): {last}")
                        remaining = []
                    elif current is not None:
                        results[current] = Result(current, ERROR, f"the process ended (exit "
                                                  f"status {code}) while checking: {last}")
                        remaining.remove(current)
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = json.loads(line)
                    kind = event.pop("event")
                    if kind == "file":
                        for n in remaining:
                            results[n] = Result(n, event["status"], event["detail"])
                        remaining = []
                    elif kind == "loaded":
                        loaded = True
                        deadline = time.monotonic() + limit + KILL_GRACE_SECONDS
                    elif kind == "start":
                        current, started = event["exercise"], time.monotonic()
                        deadline = started + limit + KILL_GRACE_SECONDS  # SIGALRM first; the kill if it fails
                    elif kind == "result":
                        results[event["exercise"]] = Result(**event)
                        remaining.remove(event["exercise"])
                        current, deadline = None, time.monotonic() + limit + KILL_GRACE_SECONDS
            selector.close()
            if proc.poll() is None:
                _kill(proc)
            proc.stdout.close()
    return results


def grade(chapter: str | int, answers: str | Path | ModuleType | Mapping[str, object],
          time_limit: float = DEFAULT_TIME_LIMIT) -> Report:
    """Grade chapter ``chapter``'s exercises on ``answers``: one :class:`Row` per exercise.

    ``answers`` is the reader's file (graded in a subprocess; it is only read) or a module
    or namespace (graded in this process). A notebook's ``globals()`` (a dict with a
    ``__name__``) supplies the functions and classes defined in the notebook; the answers it
    does not define are the reference's, and their rows name them in ``borrowed``.
    """
    stem = resolve_chapter(chapter)
    if not isinstance(time_limit, (int, float)) or isinstance(time_limit, bool) or time_limit <= 0:
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    checks = checks_for(stem)
    numbers = list(checks)
    uses = {n: tuple(dict.fromkeys(u for c in cs for u in c.uses)) for n, cs in checks.items()}
    borrowed: set[str] = set()
    if isinstance(answers, (str, Path)):
        path = Path(answers)
        if not path.is_file():
            detail = f"no file {path}: `llmbook exercises {label(stem)}` writes the stub"
            results = {n: Result(n, ERROR, detail) for n in numbers}
        else:
            results = _grade_file(stem, path, numbers, float(time_limit))
    elif isinstance(answers, (ModuleType, Mapping)):
        if isinstance(answers, Mapping) and "__name__" in answers:  # a notebook's globals
            answers = dict(answers)  # the reader's namespace is not changed
            borrowed = _borrow(stem, answers, {u for names in uses.values() for u in names})
        results = {r.exercise: r for r in run_exercises(stem, answers, numbers, time_limit)}
    else:
        raise TypeError(f"answers must be a file path, a module or a namespace dict, "
                        f"got {type(answers).__name__}")
    info = {e.number: e for e in exercises_of(stem)}
    rows = Report()
    for n in numbers:
        r, e = results[n], info.get(n)
        rows.append(Row(stem, n, e.stars if e else None, e.plain_title if e else "", r.status,
                        r.detail, r.seconds, tuple(u for u in uses[n] if u in borrowed)))
    return rows


def format_table(rows: Sequence[Row], seconds: bool = True) -> str:
    """The rows as the terminal shows them, with a summary line (and each passed
    exercise's time unless ``seconds`` is False)."""
    if not rows:
        return "no exercises graded"
    width = max(len(r.title) for r in rows)
    lines = []
    for r in rows:
        stars = "★" * (r.stars or 0)
        status = r.status.upper() if r.status not in (PASSED, NOT_ATTEMPTED) else r.status
        whose = "  (the book's)" if r.borrowed and set(r.borrowed) == set(_answers_of(r)) else (
            f"  (with the book's {', '.join(r.borrowed)})" if r.borrowed else "")
        lines.append(f"  {r.exercise:>2}  {stars:<3}  {r.title:<{width}}  {status}{whose}"
                     + (f"  ({r.seconds:.1f} s)" if r.passed and seconds else ""))
        if r.detail and not r.passed:
            lines.append(f"        {r.detail}")
    done = sum(r.passed for r in rows)
    lines.append(f"  {done} of {len(rows)} exercises passed")
    return "\n".join(lines)


def _answers_of(row: Row) -> tuple[str, ...]:
    """The answers ``row``'s exercise calls."""
    return tuple(dict.fromkeys(u for c in checks_for(row.stem)[row.exercise] for u in c.uses))


def _workspace_file(directory: Path, stem: str) -> Path:
    return directory / f"{stem}.py"


def _unit(stem: str) -> str:
    """``chapter 03 (03_language_modelling)`` or ``build-II (build2_transformer)``."""
    return f"{label(stem)} ({stem})" if is_build(stem) else f"chapter {label(stem)} ({stem})"


def print_list(directory: Path = DEFAULT_DIR) -> int:
    """``llmbook exercises --list``: the graded chapters, their exercises and the reader's status."""
    graded = chapters_with_checks(unit_stems())
    everything = catalogue()
    for stem in graded:
        path = _workspace_file(directory, stem)
        if path.is_file():
            rows = {r.exercise: r for r in grade(stem, path)}
            status = {n: r.status for n, r in rows.items()}
        else:
            status = {}
        print(f"{_unit(stem)}: "
              + (f"your file {path}" if status else f"no file yet (llmbook exercises "
                                                      f"{label(stem)} writes it)"))
        for e in everything.get(stem, []):
            print(f"  {e.number:>2}  {'★' * (e.stars or 0):<3}  {e.plain_title:<40}  "
                  f"{status.get(e.number, 'not started')}")
    rest = [s for s in everything if s not in graded and everything[s]]
    if rest:
        print(f"{len(rest)} more chapters have exercises whose checks are not in the package "
              f"yet: {', '.join(label(s) for s in rest)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``llmbook grade NN [--dir DIR]`` or ``llmbook grade --all``: print the table(s).

    The exit status is 0 only when every exercise graded passed.
    """
    parser = argparse.ArgumentParser(
        prog="llmbook grade",
        description="Grade your answers to a chapter's exercises (the file `llmbook "
                    "exercises NN` wrote): one row per exercise; exit status 0 only when "
                    "all pass.")
    parser.add_argument("chapter", nargs="?", help="the chapter: 3, 03, 10b or its full name; "
                        "or a build-it-yourself unit: build-I ... build-VI")
    parser.add_argument("--all", action="store_true",
                        help="every chapter with graded exercises, and every build-it-yourself unit")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"your workspace (default ./{DEFAULT_DIR}/)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT,
                        help=f"seconds per exercise (default {DEFAULT_TIME_LIMIT:g})")
    args = parser.parse_args(argv)
    if args.all == (args.chapter is not None):
        parser.error("name one chapter (llmbook grade 03) or use --all")
    if args.time_limit <= 0:
        parser.error("--time-limit must be positive")
    try:
        stems = (chapters_with_checks(unit_stems()) if args.all
                 else [resolve_chapter(args.chapter)])
        if not args.all:
            checks_for(stems[0])
    except ValueError as err:
        parser.error(str(err))
    ok = True
    for stem in stems:
        path = _workspace_file(args.dir, stem)
        print(f"{_unit(stem)}, answers in {path}")
        rows = grade(stem, path, args.time_limit)
        print(format_table(rows))
        ok = ok and all(r.passed for r in rows)
    return 0 if ok else 1
