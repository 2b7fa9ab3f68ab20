"""Exercise stubs, generated from the reference solutions, and ``llmbook exercises``.

:func:`make_stub` reads a chapter's reference solutions (``notebooks/solutions/NN_slug.py``)
with :mod:`ast` and writes the reader's starting file: a docstring saying what the file is
and how to grade it, the solutions' imports, and every public function and class (name not
starting with ``_``) with its exact signature and docstring and a body that raises
``NotImplementedError``. A public class keeps its bases, its docstring, its class-level
assignments and its public and dunder methods, each stubbed the same way. Private helpers
are left out, except a module-level name that a public signature needs (a default value,
an annotation, a base class, a decorator), which is copied as it is, and the exercises'
givens, the module-level constants (UPPER_CASE names) the answers read. The signature lines
are copied from the solution's source, so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Sequence
from pathlib import Path

from llmbook.workbench.catalogue import exercises_of
from llmbook.workbench.checks import checks_for
from llmbook.workbench.solutions import DEFAULT_DIR, is_build, label, resolve_chapter, solution_path

__all__ = ["DEFAULT_DIR", "exercise_functions", "main", "make_stub", "write_stub"]

_Def = ast.FunctionDef | ast.AsyncFunctionDef


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _names(nodes: Sequence[ast.AST | None]) -> set[str]:
    return {n.id for node in nodes if node is not None
            for n in ast.walk(node) if isinstance(n, ast.Name)}


def _signature_nodes(node: ast.AST) -> list[ast.AST | None]:
    """The parts of a def or class that run when it is defined: annotations, defaults, ..."""
    if isinstance(node, ast.ClassDef):
        out: list[ast.AST | None] = [*node.decorator_list, *node.bases, *node.keywords]
        for item in node.body:
            if isinstance(item, _Def) and _public(item.name):
                out += _signature_nodes(item)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                out.append(item)
        return out
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
    return [*node.decorator_list, *a.defaults, *a.kw_defaults, node.returns,
            *(p.annotation for p in params if p is not None)]


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else (
        [node.target] if isinstance(node, ast.AnnAssign) else [])
    return _names(targets)


def _lines(lines: list[str], first: int, last: int) -> str:
    return "".join(lines[first - 1:last])


def _stub_def(node: _Def, lines: list[str], message: str) -> str:
    """A def with its decorators, header and docstring as written, and a raising body."""
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    body0 = node.body[0]
    indent = " " * body0.col_offset
    if body0.lineno == node.lineno:  # `def f(x): return x` on one line
        header = lines[first - 1:node.lineno - 1]
        bare = ast.unparse(ast.FunctionDef(node.name, node.args, [ast.Pass()], [], node.returns,
                                           getattr(node, "type_params", [])))
        text = "".join(header) + " " * node.col_offset + bare.splitlines()[0] + "\n"
        indent = " " * (node.col_offset + 4)
    else:
        text = _lines(lines, first, body0.lineno - 1)
    if isinstance(body0, ast.Expr) and isinstance(body0.value, ast.Constant) \
            and isinstance(body0.value.value, str) and body0.lineno != node.lineno:
        text += _lines(lines, body0.lineno, body0.end_lineno)
    return text + f"{indent}raise NotImplementedError({message!r})\n"


def _stub_class(node: ast.ClassDef, lines: list[str], message: str) -> str:
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    text = _lines(lines, first, node.body[0].lineno - 1)
    dropped = {item.name for item in node.body if isinstance(item, _Def) and not _public(item.name)}
    kept = 0
    for i, item in enumerate(node.body):
        if i == 0 and isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant):
            text += _lines(lines, item.lineno, item.end_lineno)
            continue
        if isinstance(item, _Def):
            if _public(item.name):
                text += "\n" + _stub_def(item, lines, f"{node.name}.{item.name}: {message}")
                kept += 1
        elif not (_names([item]) & dropped):
            text += "\n" + _lines(lines, item.lineno, item.end_lineno)
            kept += 1
    if not kept and len(node.body) == 1 and not isinstance(node.body[0], ast.Expr):
        text += " " * node.body[0].col_offset + "pass\n"
    return text


def exercise_functions(stem: str) -> dict[int, tuple[str, ...]]:
    """Which answers each exercise's checks call, ``{exercise: names}`` ({} without checks)."""
    try:
        checks = checks_for(stem)
    except ValueError:
        return {}
    return {n: tuple(dict.fromkeys(u for c in cs for u in c.uses)) for n, cs in checks.items()}


def make_stub(source: str, stem: str) -> str:
    """The reader's starting file for chapter ``stem``, made from its solutions' ``source``."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    name = label(stem)
    uses = exercise_functions(stem)
    owner: dict[str, int] = {}  # the first exercise that calls each answer
    for n, answers in uses.items():
        for answer in answers:
            owner.setdefault(answer, n)
    public = [n for n in tree.body if isinstance(n, (*_Def.__args__, ast.ClassDef))
              and not n.name.startswith("_")]
    # module-level names the public signatures need, and what those need in turn
    needed = _names([x for n in public for x in _signature_nodes(n)])
    # and the exercises' givens: module-level constants (UPPER_CASE names) such as 17b's
    # DEFAULT_SYSTEM, which the answers read as the reference does
    needed |= {name for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
               for name in _defined(n) if name.isupper() and not name.startswith("_")}
    support: list[ast.stmt] = []
    for node in reversed(tree.body):
        if node in public or not isinstance(node, (ast.Assign, ast.AnnAssign, *_Def.__args__,
                                                   ast.ClassDef)):
            continue
        if _defined(node) & needed:
            support.insert(0, node)
            needed |= _names([node])
    exercises = {e.number: e for e in exercises_of(stem)}
    listing = []
    for n, names in uses.items():
        e = exercises.get(n)
        title = f"({'★' * e.stars}) {e.plain_title}" if e and e.stars else (e.plain_title if e else "")
        listing.append(f"    {n}. {title}: {', '.join(names)}")
    if is_build(stem):
        what = (f"Your build of Part {name.split('-')[1]} of the book (the build-it-yourself unit "
                f"{name}).")
        # the reference's own introduction (the order to build in, the conventions), less its
        # title line and the paragraph that says it is the reference
        intro = [p for p in (ast.get_docstring(tree) or "").split("\n\n")[1:]
                 if "file is the reference" not in " ".join(p.split())]
        if intro:
            what += "\n\n" + "\n\n".join(intro)
        where = (f"The reference is the book's own code plugged in: llmbook/workbench/units/{stem}.py\n"
                 "(each function calls the implementation the chapters build): look after trying.\n")
    else:
        what = f"Your answers to the exercises of chapter {name} (notebooks/{stem} in the book)."
        where = (f"The reference solutions are notebooks/solutions/{stem}.py in the book's repository\n"
                 "(llmbook/workbench/_solutions/ in an installed package): look after trying.\n")
    parts = [
        f'r"""{what}\n\n'
        f"Written by `llmbook exercises {name}` from the reference: every function\n"
        "has the reference's name, signature and docstring, and a body that raises\n"
        "NotImplementedError. Replace each body with your code; keep the names and signatures.\n"
        f"Grade it with `llmbook grade {name}` (add `--dir DIR` if this file is not in\n"
        "./llmbook-work/): one row per exercise, passed, failed (what was expected, what came\n"
        "back) or not attempted.\n"
        + ("\nThe exercises and the functions their checks call:\n\n" + "\n".join(listing) + "\n"
           if listing else "")
        + "\n" + where + '"""\n']
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    parts.append("\n" + "".join(_lines(lines, n.lineno, n.end_lineno) for n in imports))
    for node in tree.body:
        if node in support:
            parts.append("\n\n" + _lines(lines, node.lineno, node.end_lineno))
        elif node in public:
            n = owner.get(node.name)
            unit = name if is_build(stem) else f"chapter {name}"
            message = f"exercise {n} of {unit}: yours to write" if n else "yours to write"
            stub = (_stub_class(node, lines, message) if isinstance(node, ast.ClassDef)
                    else _stub_def(node, lines, f"{node.name}: {message}"))
            parts.append("\n\n" + stub)
    return "".join(parts)


def write_stub(chapter: str | int, directory: str | Path = DEFAULT_DIR) -> tuple[Path, bool]:
    """Write chapter ``chapter``'s stub into ``directory``; never overwrites.

    Returns ``(path, written)``: ``written`` is False when the file was already there (it
    is left as it is).
    """
    stem = resolve_chapter(chapter)
    path = Path(directory) / f"{stem}.py"
    if path.exists():
        return path, False
    text = make_stub(solution_path(stem).read_text(encoding="utf-8"), stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as f:  # "x": fails rather than overwrite
        f.write(text)
    return path, True


def main(argv: Sequence[str] | None = None) -> int:
    """``llmbook exercises NN [--dir DIR]`` and ``llmbook exercises --list [--dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="llmbook exercises",
        description="Write a chapter's exercise stub into your workspace (never overwriting "
                    "a file), or list the exercises with their ratings and your status.")
    parser.add_argument("chapter", nargs="?", help="the chapter: 3, 03, 10b or its full name; "
                        "or a build-it-yourself unit: build-I ... build-VI")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"your workspace (default ./{DEFAULT_DIR}/)")
    parser.add_argument("--list", action="store_true",
                        help="list the chapters whose exercises are graded, and your status")
    args = parser.parse_args(argv)
    if args.list:
        from llmbook.workbench.grader import print_list

        return print_list(args.dir)
    if args.chapter is None:
        parser.error("name a chapter (llmbook exercises 03) or use --list")
    try:
        path, written = write_stub(args.chapter, args.dir)
    except ValueError as err:
        parser.error(str(err))
    if written:
        print(f"wrote {path}: fill in the functions, then run "
              f"`llmbook grade {label(path.stem)} --dir {args.dir}`")
    else:
        print(f"{path} exists: left as it is (delete it to start again from the stub)")
    return 0
