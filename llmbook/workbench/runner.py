"""Run a chapter's checks on a reader's answers, one exercise at a time, with a time limit.

:func:`run_exercises` does the work in the current process, on a module or a namespace
(``globals()`` of a notebook): before an exercise's checks run it compares the functions
they call with the reference solutions' (present, same parameters), wraps each so that a
return value of the wrong type is named, and runs the checks under a per-exercise time
limit (``SIGALRM``, where the platform has it). Each outcome becomes a :class:`Result`.

``python -m llmbook.workbench.runner SPEC`` is the child process the grader starts for a
reader's file (:mod:`llmbook.workbench.grader`): it loads the file without writing beside
it, sends its file descriptor 1 to 2 (so that the reader's prints cannot garble the
protocol), and writes one JSON line per event on the original stdout.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import signal
import sys
import threading
import time
import traceback
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from llmbook.workbench.checks import checks_for
from llmbook.workbench.solutions import load_module, load_solutions

__all__ = ["PASSED", "FAILED", "NOT_ATTEMPTED", "ERROR", "Result", "TimeLimitExceeded",
           "WrongReturnType", "load_answers", "run_exercises"]

PASSED, FAILED, NOT_ATTEMPTED, ERROR = "passed", "failed", "not attempted", "error"


@dataclass(frozen=True)
class Result:
    """The outcome of one exercise: ``status`` is passed, failed, not attempted or error."""

    exercise: int
    status: str
    detail: str = ""
    seconds: float = 0.0


class TimeLimitExceeded(BaseException):
    """Raised in the reader's code when an exercise runs past its limit.

    A BaseException, so that a reader's ``except Exception`` does not swallow it.
    """


class WrongReturnType(Exception):
    """A reader's function returned a value of another type than the reference's."""


def load_answers(path: str | Path, stem: str) -> ModuleType:
    """Load the reader's file ``path`` as a module (read only; no ``__pycache__``)."""
    return load_module(path, f"answers_{stem.split('_')[0]}")


def _type_of(annotation: object) -> type | tuple[type, ...] | None:
    """The runtime type(s) a return annotation asks for, or None when it cannot be checked."""
    import numbers

    if annotation is typing.Any:  # a class on Python 3.11+, but nothing to check
        return None
    if annotation is float:
        return numbers.Real
    if annotation is int:
        return numbers.Integral
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        types = [_type_of(a) for a in typing.get_args(annotation)]
        if any(t is None for t in types):
            return None
        flat: list[type] = []
        for t in types:
            flat += list(t) if isinstance(t, tuple) else [t]
        return tuple(flat)
    if annotation is type(None) or annotation is None:
        return type(None)
    target = origin or annotation
    if not isinstance(target, type):
        return None
    if target.__module__.startswith("sympy."):  # sp.Matrix is mutable; simplify() returns an
        import sympy  # ImmutableDenseMatrix: any SymPy matrix (or expression) answers alike

        for base in (sympy.MatrixBase, sympy.Basic):
            if issubclass(target, base):
                return base
    return target


def _describe(value: object) -> str:
    shape = getattr(value, "shape", None)
    kind = type(value).__module__ + "." + type(value).__qualname__
    kind = kind.removeprefix("builtins.")
    return f"{kind} of shape {tuple(shape)}" if shape is not None else kind


def _checked(name: str, answer: Callable, reference: Callable) -> Callable:
    """``answer``, raising :class:`WrongReturnType` when its result's type is not the reference's."""
    try:
        hints = typing.get_type_hints(reference, vars(sys.modules.get(reference.__module__, sys)))
        expected = _type_of(hints["return"]) if "return" in hints else None
        annotation = hints.get("return")
    except Exception:  # an annotation that cannot be evaluated is not checked
        expected, annotation = None, None
    if expected is None:
        return answer

    @functools.wraps(answer)
    def wrapper(*args, **kwargs):
        value = answer(*args, **kwargs)
        if not isinstance(value, expected):
            shown = getattr(annotation, "__name__", None) or str(annotation)
            raise WrongReturnType(f"{name} returned a {_describe(value)}; expected {shown}")
        args_of = typing.get_args(annotation)
        if typing.get_origin(annotation) is tuple and args_of and Ellipsis not in args_of \
                and len(value) != len(args_of):
            raise WrongReturnType(f"{name} returned a tuple of {len(value)} values; "
                                  f"expected {len(args_of)}")
        return value

    return wrapper


class _Answers:
    """The reader's answers as the checks see them: ``answers.name`` is their function, wrapped."""

    def __init__(self, found: Mapping[str, object], reference: ModuleType) -> None:
        self._found, self._reference = found, reference
        self._wrapped: dict[str, object] = {}  # a check may look an answer up a million times

    def __getattr__(self, name: str) -> object:
        if name.startswith("_") or name not in self._found:
            raise AttributeError(name)
        if name not in self._wrapped:
            value, ref = self._found[name], getattr(self._reference, name, None)
            if inspect.isfunction(value) and inspect.isfunction(ref):
                value = _checked(name, value, ref)
            self._wrapped[name] = value
        return self._wrapped[name]


def _parameters(fn: Callable) -> list[tuple[str, str, str]]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [(p.name, p.kind.description,
             "" if p.default is inspect.Parameter.empty else repr(p.default)) for p in params]


def _bare(fn: Callable) -> str:
    """The parameters without annotations: ``"logits, targets, epsilon=0.1"``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "..."
    plain = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=plain, return_annotation=inspect.Signature.empty))[1:-1]


def _interface_problem(names: Iterable[str], found: Mapping[str, object],
                       reference: ModuleType) -> str | None:
    """A missing function or a wrong signature among ``names``, in plain words, or None."""
    for name in names:
        ref = getattr(reference, name, None)
        if name not in found:
            return f"missing function: your file defines no {name}"
        if ref is None or not callable(ref):
            continue
        got = found[name]
        if not callable(got):
            return f"{name} is a {type(got).__name__}, not a function"
        want = _parameters(ref)
        if inspect.isfunction(ref) and _parameters(got) != want:
            return (f"wrong signature: {name}({_bare(got)}); expected {name}({_bare(ref)}) "
                    "(names, order and defaults)")
    return None


def _where(err: BaseException, answer_file: str | None) -> str:
    """' (your line N, in f)' for the innermost frame in the reader's code, else ''."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if answer_file and f.filename == answer_file]
    if mine:
        return f" (your line {mine[-1].lineno}, in {mine[-1].name})"
    return ""


def _is_reader_stub(err: NotImplementedError, answer_file: str | None) -> bool:
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and (answer_file is None or frames[-1].filename == answer_file)


def _values(err: AssertionError, line: str | None, width: int = 70) -> str:
    """The values of the plain names in a failing ``assert`` line, from the check's frame:
    ``"; got = 2.71, ref = 3.01"`` (nothing is re-evaluated, so no answer runs twice)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not line:
        return ""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return ""
    names = list(dict.fromkeys(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)))
    local = tb.tb_frame.f_locals
    shown = []
    for name in names:
        if name in local and not callable(local[name]) and not isinstance(local[name], ModuleType):
            text = repr(local[name]).replace("\n", " ")
            shown.append(f"{name} = {text if len(text) <= width else text[:width - 3] + '...'}")
    return "; " + ", ".join(shown) if shown else ""


def _on_alarm(signum, frame):
    raise TimeLimitExceeded()


def _classify(exercise: int, err: BaseException, answer_file: str | None, limit: float,
              seconds: float) -> Result:
    if isinstance(err, TimeLimitExceeded):
        return Result(exercise, ERROR, f"time limit exceeded: still running after {limit:g} s",
                      seconds)
    if isinstance(err, NotImplementedError) and _is_reader_stub(err, answer_file):
        frames = traceback.extract_tb(err.__traceback__)
        return Result(exercise, NOT_ATTEMPTED, f"{frames[-1].name} raises NotImplementedError",
                      seconds)
    if isinstance(err, WrongReturnType):
        return Result(exercise, ERROR, f"wrong return type: {err}", seconds)
    if isinstance(err, AssertionError):
        message = str(err).strip()
        if not message:
            frame = traceback.extract_tb(err.__traceback__)[-1]
            message = f"the check `{frame.line}` does not hold{_values(err, frame.line)}"
        return Result(exercise, FAILED, message, seconds)
    if isinstance(err, ModuleNotFoundError) and err.name and not _where(err, answer_file):
        top = err.name.split(".")[0]  # a peer the check compares with, missing here
        return Result(exercise, ERROR, f"this check compares with the package {top}, which is "
                      f"not installed: pip install \"llmbook[dev]\" (or pip install {top})", seconds)
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return Result(exercise, ERROR, f"{type(err).__name__}{_where(err, answer_file)}: {first}",
                  seconds)


def run_exercises(stem: str, answers: ModuleType | Mapping[str, object],
                  numbers: Iterable[int] | None = None, time_limit: float = 60.0,
                  on_start: Callable[[int], None] | None = None,
                  on_result: Callable[[Result], None] | None = None) -> list[Result]:
    """Check chapter ``stem``'s exercises (all, or ``numbers``) on ``answers``, one by one.

    ``answers`` is a module or a namespace such as a notebook's ``globals()``. Each
    exercise gets ``time_limit`` seconds (enforced with ``SIGALRM`` in the main thread of
    a POSIX process; elsewhere only the grader's subprocess limit applies). ``on_start``
    and ``on_result`` are called as each exercise starts and ends.
    """
    found = dict(vars(answers) if isinstance(answers, ModuleType) else answers)
    answer_file = found.get("__file__") if isinstance(answers, ModuleType) else None
    reference = load_solutions(stem)
    checks = checks_for(stem)
    wanted = list(checks) if numbers is None else list(numbers)
    proxy = _Answers(found, reference)
    alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    results = []
    for n in wanted:
        if on_start:
            on_start(n)
        uses = tuple(dict.fromkeys(u for c in checks[n] for u in c.uses))
        problem = _interface_problem(uses, found, reference)
        if problem:
            results.append(Result(n, ERROR, problem))
            if on_result:
                on_result(results[-1])
            continue
        start = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, _on_alarm) if alarm else None
        try:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, time_limit)
            for check in checks[n]:
                check.run(proxy)
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
            result = Result(n, PASSED, "", time.perf_counter() - start)
        except BaseException as err:  # the reader's code may raise anything, SystemExit too
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if isinstance(err, KeyboardInterrupt):
                raise
            result = _classify(n, err, answer_file, time_limit, time.perf_counter() - start)
        finally:
            if alarm:
                signal.signal(signal.SIGALRM, previous)
        results.append(result)
        if on_result:
            on_result(result)
    return results


def _child(spec: dict) -> int:
    """The grader's subprocess: load the file, run the exercises, one JSON line per event."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the reader's prints (and C-level output) go to stderr
    sys.stdout = sys.stderr

    def send(**event) -> None:
        protocol.write(json.dumps(event) + "\n")
        protocol.flush()

    stem, path, limit = spec["stem"], spec["file"], float(spec["time_limit"])
    import_limit = float(spec["import_limit"])  # the file imports torch, sympy, ...: not `limit`
    alarm = hasattr(signal, "setitimer")
    if alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, import_limit)
    try:
        answers = load_answers(path, stem)
    except BaseException as err:  # a file that raises anything on import
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(err, TimeLimitExceeded):
            detail = f"time limit exceeded: importing your file took more than {import_limit:g} s"
        elif isinstance(err, SyntaxError):
            detail = f"syntax error on line {err.lineno}: {err.msg}"
        elif isinstance(err, ImportError):
            detail = f"import error{_where(err, path)}: {err}"
        else:
            first = (str(err).strip().splitlines() or [""])[0]
            detail = f"your file raised {type(err).__name__} on import{_where(err, path)}: {first}"
        send(event="file", status=ERROR, detail=detail)
        return 0
    if alarm:
        signal.setitimer(signal.ITIMER_REAL, 0)
    send(event="loaded")
    run_exercises(stem, answers, spec["exercises"], limit,
                  on_start=lambda n: send(event="start", exercise=n),
                  on_result=lambda r: send(event="result", **asdict(r)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m llmbook.workbench.runner JOB\n\n"
              "The grader's child process (llmbook grade starts it): JOB is a JSON object naming\n"
              "the chapter, the reader's file and the time limit. Run `llmbook grade --help`.")
        raise SystemExit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    sys.dont_write_bytecode = True
    raise SystemExit(_child(json.loads(sys.argv[1])))
