"""The reader's workbench (issue 28): stubs, the exercise list, ``llmbook exercises``/``grade``.

Chapter 3 is the pilot: its checks live in ``llmbook/workbench/checks/ch03.py``. The
grading tests run the grader's subprocess on files in a temporary workspace: the stub, the
reference solution, one broken function, and files with every kind of bad input, and check
that the reader's files are left byte for byte as they were.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest
import sympy as sp
import torch

from llmbook.cli import main as llmbook
from llmbook.workbench import grader
from llmbook.workbench.catalogue import (
    CATALOGUE,
    Exercise,
    catalogue,
    exercises_from_notebooks,
    parse_exercises,
)
from llmbook.workbench.checks import checks_for
from llmbook.workbench.grader import format_table, grade
from llmbook.workbench.solutions import (
    BUILD_PARTS,
    build_stems,
    chapter_stems,
    is_build,
    label,
    load_module,
    load_solutions,
    resolve_chapter,
    solution_path,
    solutions_dir,
    unit_stems,
)
from llmbook.workbench.stubs import make_stub, write_stub

ROOT = Path(__file__).resolve().parents[1]
STEM = "03_language_modelling"
REFERENCE = ROOT / "notebooks" / "solutions" / f"{STEM}.py"


# ------------------------------------------------------------------ solutions and chapters

def test_the_solutions_are_found_and_chapters_resolve() -> None:
    assert solutions_dir() == ROOT / "notebooks" / "solutions"
    stems = chapter_stems()
    assert len(stems) == 37 and stems[0] == "00_preface" and "10b_batch_size" in stems
    assert resolve_chapter(3) == resolve_chapter("03") == resolve_chapter(" 3 ") == STEM
    assert resolve_chapter(STEM) == STEM and resolve_chapter("10B") == "10b_batch_size"
    with pytest.raises(ValueError, match="no chapter or build unit '99'.*03"):
        resolve_chapter("99")
    with pytest.raises(TypeError, match="chapter"):
        resolve_chapter(3.0)
    with pytest.raises(TypeError, match="chapter"):
        resolve_chapter(True)


def test_the_build_units_resolve_by_part_in_every_spelling() -> None:
    assert build_stems() == list(BUILD_PARTS)  # every Part has its unit
    assert unit_stems() == chapter_stems() + list(BUILD_PARTS)
    for spelling in ("build-II", "build-ii", "build-2", "build2", "BUILD 2", "build2_transformer"):
        assert resolve_chapter(spelling) == "build2_transformer"
    assert resolve_chapter("build-VI") == "build6_distributed"
    assert [label(s) for s in BUILD_PARTS] == [f"build-{r}" for r in
                                               ("I", "II", "III", "IV", "V", "VI")]
    assert label(STEM) == "03" and label("10b_batch_size") == "10b"
    assert is_build("build1_tokenizer") and not is_build(STEM)
    assert solution_path("build3_training") == ROOT / "llmbook" / "workbench" / "units" / "build3_training.py"
    assert solution_path(STEM) == REFERENCE
    for wrong in ("build-VII", "build-0", "build-IIII", "build"):
        with pytest.raises(ValueError, match="build-I, build-II"):
            resolve_chapter(wrong)


def test_load_module_writes_nothing_beside_the_file(tmp_path) -> None:
    path = tmp_path / "m.py"
    path.write_text("X = 2 + 3\n")
    assert load_module(path, "wb_test_m").X == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]


# ------------------------------------------------------------------ the list of exercises

def test_parse_exercises_reads_numbers_stars_and_titles() -> None:
    text = ("# %% [markdown]\n# ## Exercises\n#\n# Solutions are elsewhere.\n#\n"
            "# 1. (★) **First one.** Do it.\n#    More text.\n# 2. **Unrated.** Text.\n"
            "# 3. (★★★) **Hard: really.** Go.\n\n# %%\n# 4. (★) **Not in the section.**\n")
    assert parse_exercises(text) == [Exercise(1, 1, "First one"), Exercise(2, None, "Unrated"),
                                     Exercise(3, 3, "Hard: really")]
    assert parse_exercises("# ## Something else\n# 1. (★) **No.**\n") == []
    with pytest.raises(TypeError, match="notebook_source"):
        parse_exercises(b"# ## Exercises")


def test_the_shipped_list_matches_the_chapters() -> None:
    """Fails when a chapter's exercises change: run `python -m llmbook.workbench.catalogue`."""
    chapters = {s: e for s, e in catalogue().items() if not is_build(s)}
    assert chapters == exercises_from_notebooks(ROOT / "notebooks")
    assert [s for s in catalogue() if is_build(s)] == list(BUILD_PARTS)  # from checks/buildN.py
    assert json.loads(CATALOGUE.read_text(encoding="utf-8"))["chapters"].keys() == set(chapter_stems())
    assert catalogue()[STEM] == [Exercise(1, 2, "The shift needs no gradient"),
                                 Exercise(2, 1, "Label smoothing"),
                                 Exercise(3, 2, "Where the flat curves end"),
                                 Exercise(4, 2, "Cross-entropy is entropy plus KL")]


def test_each_check_maps_to_an_exercise_and_names_the_answers_it_calls() -> None:
    checks = checks_for(STEM)
    assert list(checks) == [1, 2, 3, 4]
    assert checks[1][0].uses == ("shift_gradient_symbolic", "logsumexp_attached")
    assert [c.uses for n in (2, 3, 4) for c in checks[n]] == [
        ("label_smoothed_cross_entropy",), ("ngram_limit",), ("cross_entropy_decomposition",)]
    with pytest.raises(ValueError, match="not in the package yet"):
        checks_for("99_no_such_chapter")
    from llmbook.workbench.checks import chapters_with_checks

    assert chapters_with_checks(unit_stems()) == unit_stems()  # every chapter and unit grades


# ------------------------------------------------------------------ stubs

def _public(module) -> dict[str, object]:
    return {n: v for n, v in vars(module).items()
            if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
            and getattr(v, "__module__", None) == module.__name__}


def _members(cls: type) -> dict[str, object]:
    return {n: v for n, v in vars(cls).items() if callable(getattr(v, "__func__", v))
            and (not n.startswith("_") or (n.startswith("__") and n.endswith("__")))}


def _nones(fn) -> list[None]:
    return [None for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


@pytest.mark.parametrize("stem", unit_stems())
def test_each_stub_has_exactly_the_solutions_functions_and_signatures(stem, tmp_path) -> None:
    reference = load_solutions(stem)
    path = tmp_path / f"{stem}.py"
    path.write_text(make_stub(solution_path(stem).read_text(encoding="utf-8"), stem))
    stub = load_module(path, f"stub_{stem}")
    want, got = _public(reference), _public(stub)
    assert sorted(got) == sorted(want)
    assert want, f"{stem}: the solutions define no public function"
    for name, ref in want.items():
        if inspect.isfunction(ref):
            assert inspect.signature(got[name]) == inspect.signature(ref), name
            with pytest.raises(NotImplementedError, match=name):
                got[name](*_nones(got[name]))
            continue
        assert [b.__name__ for b in got[name].__mro__] == [b.__name__ for b in ref.__mro__]
        assert sorted(_members(got[name])) == sorted(_members(ref)), name
        for member, fn in _members(ref).items():
            fn = getattr(fn, "__func__", fn)
            mine = getattr(_members(got[name])[member], "__func__", _members(got[name])[member])
            assert inspect.signature(mine) == inspect.signature(fn), f"{name}.{member}"
            if mine.__name__ == member:  # an alias (__radd__ = __add__) is checked as its target
                with pytest.raises(NotImplementedError):
                    mine(*_nones(mine))


def test_the_stub_says_what_it_is_and_keeps_no_solution_code() -> None:
    text = make_stub(REFERENCE.read_text(encoding="utf-8"), STEM)
    assert text.startswith('r"""Your answers to the exercises of chapter 03')
    assert "llmbook grade 03" in text and "NotImplementedError" in text
    assert "1. (★★) The shift needs no gradient: shift_gradient_symbolic, logsumexp_attached" in text
    assert "gather" not in text and "entropy_rate()" not in text  # the answers' bodies are gone
    assert "def ngram_limit(source: MarkovSource, order: int) -> float:" in text


def test_write_stub_never_overwrites(tmp_path, capsys) -> None:
    path, written = write_stub("3", tmp_path / "work")
    assert written and path == tmp_path / "work" / f"{STEM}.py"
    path.write_text("# mine\n")
    assert write_stub(3, tmp_path / "work") == (path, False)
    assert path.read_text() == "# mine\n"
    assert llmbook(["exercises", "03", "--dir", str(tmp_path / "work")]) == 0
    assert "exists: left as it is" in capsys.readouterr().out
    assert path.read_text() == "# mine\n"
    with pytest.raises(SystemExit):
        llmbook(["exercises", "99", "--dir", str(tmp_path)])
    assert "no chapter or build unit '99'" in capsys.readouterr().err


# ------------------------------------------------------------------ grading

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def ref_line(text: str, folder: Path) -> int:
    """The line of the workspace file in ``folder`` that holds ``text``."""
    lines = (folder / f"{STEM}.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    """Workspaces named by case, each holding one chapter-3 file."""
    root = tmp_path_factory.mktemp("workbench")
    ref = REFERENCE.read_text(encoding="utf-8")
    stub = make_stub(ref, STEM)
    files = {
        "stub": stub,
        "reference": ref,
        "broken": _replace(ref, "return ((1.0 - epsilon) * nll + epsilon * uniform).mean()",
                           "return nll.mean()"),
        "syntax": ref.replace("def ngram_limit(", "def ngram_limit(:", 1),
        "import": _replace(ref, "import numpy as np\n", "import no_such_module_anywhere\n"),
        # 1 missing function, 2 wrong signature, 3 an infinite loop, 4 an exception in their code
        "mixed_a": (ref.replace("def logsumexp_attached(", "def _logsumexp_attached(")
                    .replace("targets: torch.Tensor,\n                                 epsilon: float)",
                             "targets: torch.Tensor, eps: float)")
                    .replace('    """Exercise 3: the cross-entropy', '    while True:\n        pass\n'
                             '    """Exercise 3: the cross-entropy', 1)
                    .replace("    q1, q2, p1, p2 = sp.symbols", "    1 / 0\n    q1, q2, p1, p2 = sp.symbols")),
        # 1 wrong return type, 2 sys.exit, 3 prints and gives up, 4 a loop SIGALRM cannot stop
        "mixed_b": (_replace(stub, "    raise NotImplementedError('shift_gradient_symbolic:",
                             "    return [1, 2]\n    raise NotImplementedError('")
                    .replace("    raise NotImplementedError('label_smoothed_cross_entropy:",
                             "    import sys; sys.exit(3)\n    raise NotImplementedError('")
                    .replace("    raise NotImplementedError('ngram_limit:",
                             "    print('{\"event\": \"result\"}')\n    raise NotImplementedError('")
                    .replace("    raise NotImplementedError('cross_entropy_decomposition:",
                             "    import signal, time; signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                             "    while True: time.sleep(0.05)\n    raise NotImplementedError('")),
    }
    folders = {}
    for case, text in files.items():
        folders[case] = root / case
        folders[case].mkdir()
        (folders[case] / f"{STEM}.py").write_text(text, encoding="utf-8")
    return folders


def _grade(folder: Path, limit: float = 60.0, monkeypatch=None) -> tuple[list, dict[str, bytes]]:
    before = _snapshot(folder)
    rows = grade(3, folder / f"{STEM}.py", time_limit=limit)
    assert _snapshot(folder) == before  # byte for byte, and no new file (no __pycache__)
    return rows, before


def _cli_grade(folder: Path, capsys) -> tuple[int, str]:
    """``llmbook grade 03 --dir folder``: exit status and output; the folder is left as it was."""
    before = _snapshot(folder)
    status = llmbook(["grade", "03", "--dir", str(folder)])
    assert _snapshot(folder) == before
    return status, capsys.readouterr().out


def test_the_stub_is_not_attempted_and_exits_non_zero(workspaces, capsys) -> None:
    status, out = _cli_grade(workspaces["stub"], capsys)
    assert status == 1
    assert out.count("not attempted") == 4 and "0 of 4 exercises passed" in out
    assert "        label_smoothed_cross_entropy raises NotImplementedError\n" in out
    assert "Traceback" not in out


def test_the_reference_solution_passes_and_exits_zero(workspaces, capsys) -> None:
    status, out = _cli_grade(workspaces["reference"], capsys)
    assert status == 0, out
    for e in catalogue()[STEM]:
        assert f"  {e.number:>2}  {'★' * e.stars:<3}  {e.title}" in out
    assert out.count("passed  (") == 4 and "4 of 4 exercises passed" in out


def test_one_broken_function_fails_that_exercise_alone(workspaces) -> None:
    rows, _ = _grade(workspaces["broken"])
    assert [r.status for r in rows] == ["passed", "failed", "passed", "passed"]
    assert rows[1].detail.startswith("expected label_smoothed_cross_entropy(logits, targets, 0.1)")
    assert "got 3.0534" in rows[1].detail
    assert "2  ★    Label smoothing" in format_table(rows)


def test_a_syntax_or_import_error_gives_one_clear_row_per_exercise(workspaces) -> None:
    rows, _ = _grade(workspaces["syntax"])
    assert {r.status for r in rows} == {"error"}
    line = ref_line("def ngram_limit(:", workspaces["syntax"])
    assert rows[0].detail == f"syntax error on line {line}: invalid syntax"
    rows, _ = _grade(workspaces["import"])
    assert {r.status for r in rows} == {"error"}
    line = ref_line("import no_such_module_anywhere", workspaces["import"])
    assert rows[0].detail == (f"import error (your line {line}, in <module>): No module named "
                              "'no_such_module_anywhere'")


def test_missing_function_signature_time_limit_and_exception_rows(workspaces) -> None:
    rows, _ = _grade(workspaces["mixed_a"], limit=3)
    assert [r.status for r in rows] == ["error"] * 4
    assert rows[0].detail == "missing function: your file defines no logsumexp_attached"
    assert rows[1].detail == ("wrong signature: label_smoothed_cross_entropy(logits, targets, eps); "
                              "expected label_smoothed_cross_entropy(logits, targets, epsilon) "
                              "(names, order and defaults)")
    assert rows[2].detail == "time limit exceeded: still running after 3 s"
    assert rows[3].detail.startswith("ZeroDivisionError (your line ")
    assert rows[3].detail.endswith("in cross_entropy_decomposition): division by zero")


def test_wrong_return_type_exit_prints_and_an_unstoppable_loop(workspaces, monkeypatch) -> None:
    monkeypatch.setattr(grader, "KILL_GRACE_SECONDS", 1.0)
    rows, _ = _grade(workspaces["mixed_b"], limit=2)
    assert [r.status for r in rows] == ["error", "error", "not attempted", "error"], format_table(rows)
    assert rows[0].detail == ("wrong return type: shift_gradient_symbolic returned a list; "
                              "expected tuple")
    assert rows[1].detail.startswith("SystemExit (your line ")
    assert rows[3].detail.startswith("time limit exceeded: still running after 2 s")


def test_grading_a_namespace_in_process() -> None:
    rows = grade("03", vars(load_solutions(STEM)))
    assert [r.status for r in rows] == ["passed"] * 4
    stub = {}
    exec(compile(make_stub(REFERENCE.read_text(encoding="utf-8"), STEM), "<stub>", "exec"), stub)
    assert [r.status for r in grade(3, stub)] == ["not attempted"] * 4
    with pytest.raises(TypeError, match="answers must be"):
        grade(3, 42)
    with pytest.raises(ValueError, match="time_limit"):
        grade(3, stub, time_limit=0)


def test_a_notebook_grades_its_own_functions_and_borrows_the_rest() -> None:
    """``grade("03", globals())`` in a chapter: what the notebook defines is graded as the
    reader's; an imported function of an answer's name is not an answer; the rest is the
    book's, and the rows and the table say so, without timings."""
    from llmbook.text.functional import softmax

    notebook = {"__name__": "__main__", "softmax": softmax,
                "shift_gradient_symbolic": softmax}  # imported, not defined here: not an answer
    rows = grade("03", notebook)
    assert [r.status for r in rows] == ["passed"] * 4
    assert [r.borrowed for r in rows] == [("shift_gradient_symbolic", "logsumexp_attached"),
                                          ("label_smoothed_cross_entropy",), ("ngram_limit",),
                                          ("cross_entropy_decomposition",)]
    assert notebook["shift_gradient_symbolic"] is softmax  # the notebook's globals are untouched
    shown = repr(rows)
    assert shown.count("passed  (the book's)") == 4 and " s)" not in shown
    assert "define yours here (`llmbook exercises 03` writes stubs" in shown
    exec(compile("import torch.nn.functional as F\n"
                 "def label_smoothed_cross_entropy(logits, targets, epsilon):\n"
                 "    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), "
                 "label_smoothing=epsilon / 2)\n"
                 "def logsumexp_attached(logits, dim=-1):\n"
                 "    return logits.logsumexp(dim)\n", "<cell>", "exec"), notebook)
    rows = grade(3, notebook)
    assert [r.status for r in rows] == ["passed", "failed", "passed", "passed"]
    assert rows[1].borrowed == () and "label_smoothing=0.1" in rows[1].detail
    assert rows[0].borrowed == ("shift_gradient_symbolic",)  # half the reader's, half the book's
    shown = repr(rows)
    assert "passed  (with the book's shift_gradient_symbolic)" in shown
    assert "FAILED" in shown and "3 of 4 exercises passed" in shown
    assert "(the book's)" in format_table(rows) and " s)" in format_table(rows)


def test_grade_and_list_from_the_command_line(workspaces, tmp_path, capsys) -> None:
    assert llmbook(["grade", "03", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"no file {tmp_path / (STEM + '.py')}: `llmbook exercises 03` writes the stub" in out
    for argv in (["grade"], ["grade", "03", "--all"], ["grade", "99"]):
        with pytest.raises(SystemExit):
            llmbook(argv)
    assert "no chapter or build unit '99'; there are 00, 01," in capsys.readouterr().err
    assert llmbook(["grade", "--all", "--dir", str(tmp_path)]) == 1  # no file: a row each
    assert "chapter 03 (03_language_modelling)" in capsys.readouterr().out
    shutil.copy(REFERENCE, tmp_path / f"{STEM}.py")
    assert llmbook(["exercises", "--list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "   2  ★    Label smoothing" in out and out.count("passed") == 4
    assert "not in the package yet" not in out  # every chapter's checks are (issue 28)
    assert sum(line.startswith("chapter ") for line in out.splitlines()) == 37  # one line per chapter


def test_an_assert_without_message_shows_its_names_values(tmp_path) -> None:
    """A check written as a bare ``assert`` still says what came back: the values of the plain
    names on its line, read from the check's frame (nothing is run again)."""
    from llmbook.workbench.runner import FAILED, _classify

    source = ("def check():\n    got, want = 2.5, [1.0, 2.0]\n    tolerance = 1e-3\n"
              "    assert abs(got - sum(want)) < tolerance\n")
    path = tmp_path / "a_check.py"
    path.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)  # not rewritten by pytest, as in the grader
    try:
        namespace["check"]()
    except AssertionError as err:
        result = _classify(2, err, None, 1.0, 0.0)
    assert result.status == FAILED
    assert result.detail == ("the check `assert abs(got - sum(want)) < tolerance` does not hold; "
                             "tolerance = 0.001, got = 2.5, want = [1.0, 2.0]")


def test_raises_is_pytest_raises_in_plain_words() -> None:
    from llmbook.workbench.checks import raises

    with raises(ValueError, match="epsilon"):
        raise ValueError("epsilon must be in [0, 1]")
    with raises((TypeError, ValueError)):
        raise TypeError("x")
    try:
        with raises(ValueError, match="epsilon", what="label_smoothed_cross_entropy(z, y, 2.0)"):
            raise ValueError("something else")
    except AssertionError as err:
        assert str(err) == ("expected label_smoothed_cross_entropy(z, y, 2.0) to raise ValueError with a "
                            "message matching 'epsilon', got ValueError: something else")
    else:
        raise AssertionError("a wrong message passed")
    try:
        with raises(ValueError):
            pass
    except AssertionError as err:
        assert str(err) == "expected the call to raise ValueError, but it returned normally"
    else:
        raise AssertionError("no exception passed")
    try:  # another exception type is not caught
        with raises(ValueError):
            raise KeyError("k")
    except KeyError:
        pass


def test_any_sympy_matrix_answers_a_matrix_annotation() -> None:
    """``sp.simplify`` turns a Matrix into an ImmutableDenseMatrix: a reference annotated
    ``-> sp.Matrix`` accepts it (chapter 2's exercise 4), and still refuses a list."""
    import sympy as sp

    from llmbook.workbench.runner import _type_of

    want = _type_of(sp.Matrix)
    assert isinstance(sp.simplify(sp.Matrix([[1, 2]])), want)
    assert isinstance(sp.ImmutableMatrix([[1]]), want)
    assert not isinstance([[1, 2]], want)
    assert _type_of(sp.Expr) is sp.Basic and _type_of(float) is not None
    import typing

    assert _type_of(typing.Any) is None and _type_of(list[typing.Any]) is list  # chapter 18's answers


def test_the_stub_keeps_the_exercises_givens(tmp_path) -> None:
    """Chapter 17b's answers read module-level constants (the default system prompt, the
    assistant header's ids, a forged conversation): the stub defines them as the reference does."""
    from llmbook.workbench.solutions import load_module, load_solutions, solutions_dir
    from llmbook.workbench.stubs import make_stub

    stem = "17b_chat_finetuning"
    path = tmp_path / f"{stem}.py"
    path.write_text(make_stub((solutions_dir() / f"{stem}.py").read_text(), stem))
    stub, reference = load_module(path, "stub_17b"), load_solutions(stem)
    for name in ("DEFAULT_SYSTEM", "ASSISTANT_HEADER", "FORGED"):
        assert getattr(stub, name) == getattr(reference, name), name


def test_titles_print_without_tex() -> None:
    from llmbook.workbench.catalogue import Exercise, catalogue

    cases = {"The spread of $\\cos^2$": "The spread of cos^2", "Where $k_3$ loses": "Where k_3 loses",
             "a $\\mathrm{KL}(q \\| p)$ b": "a KL(q | p) b", "**Bold** and `code`": "Bold and code",
             "x $O(T^{2})$": "x O(T^2)"}
    for title, want in cases.items():
        assert Exercise(1, 2, title).plain_title == want
    assert not [e.title for v in catalogue().values() for e in v if set("$\\`") & set(e.plain_title)]


_X = sp.Symbol("x", real=True)
_TRIVIAL = {  # answers that return the right type and nothing worked out
    ("00_preface", 1): {"exercise_1": lambda: (sp.Integer(0), torch.zeros(101, dtype=torch.float64))},
    ("00_preface", 2): {"exercise_2": lambda: sp.tanh(_X)},
    ("02_embeddings", 4): {"squared_error_gradient": lambda N=2, V=3: sp.zeros(N, V)},
    ("20_grpo", 1): {"even_votes_gain_nothing": lambda m: 0,
                     "majority_with_coin_ties_symbolic": lambda n: sp.Symbol("p", positive=True)},
}


@pytest.mark.parametrize(("stem", "exercise"), list(_TRIVIAL))
def test_a_trivial_answer_fails(stem, exercise) -> None:
    """Exercises whose first checks accepted `return True`, a zero residual or a constant."""
    from types import SimpleNamespace

    reference = load_solutions(stem)
    answers = SimpleNamespace(**{**vars(reference), **_TRIVIAL[stem, exercise]})
    with pytest.raises(AssertionError, match="expected"):
        for check in checks_for(stem)[exercise]:
            check.run(answers)


@pytest.mark.parametrize("stem", chapter_stems())
def test_every_chapter_ends_by_grading_its_exercises_and_the_book_shows_all_passed(stem) -> None:
    """Issue 28, item 4: the last cell grades the notebook's own functions; executed as
    shipped, it grades the reference and every row passes."""
    source = (ROOT / "notebooks" / f"{stem}.py").read_text(encoding="utf-8")
    assert source.rstrip().endswith(f'# %%\nfrom llmbook.workbench import grade\n\n'
                                    f'grade("{label(stem)}", globals())')
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]
    shown = "".join(text for o in cells[-1].get("outputs", [])
                    for text in o.get("data", {}).get("text/plain", []))
    n = len(catalogue()[stem])
    assert f"  {n} of {n} exercises passed" in shown, shown
    assert shown.count("passed  (the book's)") == n  # no chapter cell shadows an answer


def test_approx_follows_pytest_approx() -> None:
    from llmbook.workbench.checks import approx

    for got, want, kw in [(1.0 + 5e-7, 1.0, {}), (1e-13, 0.0, {}), (2.0, 2.1, {"abs": 0.2}),
                          (100.0, 101.0, {"rel": 0.01}), ([1.0, 2.0], [1.0, 2.0 + 1e-9], {}),
                          (3, 3.0, {"rel": 0.0})]:
        assert approx(got, want, **kw) and got == pytest.approx(want, **kw)
    for got, want, kw in [(1.0 + 2e-6, 1.0, {}), (1e-11, 0.0, {}), (2.0, 2.3, {"abs": 0.2}),
                          ([1.0], [1.0, 2.0], {}), ((1.0, 2.5), [1.0, 2.0], {"abs": 0.1}),
                          ("1.0", 1.0, {}), (None, 1.0, {}), (torch.ones(2), [1.0, 1.0], {})]:
        assert not approx(got, want, **kw)
    assert (1.0 + 2e-6) != pytest.approx(1.0) and [1.0] != pytest.approx([1.0, 2.0])


def test_a_missing_peer_package_is_named_with_how_to_install_it(monkeypatch) -> None:
    """A check whose peer (transformers, tokenizers, trl, ...) is not installed: one clear row."""
    from llmbook.workbench.checks import Check
    from llmbook.workbench.runner import run_exercises

    def needs_a_peer(solutions) -> None:
        import no_such_peer_package.sub  # noqa: F401

    monkeypatch.setattr("llmbook.workbench.runner.checks_for",
                        lambda stem: {1: [Check(1, "exercise_1", needs_a_peer, ())]})
    (result,) = run_exercises(STEM, load_solutions(STEM), [1])
    assert result.status == "error" and result.detail == (
        'this check compares with the package no_such_peer_package, which is not installed: '
        'pip install "llmbook[dev]" (or pip install no_such_peer_package)')


@pytest.mark.parametrize("stem", BUILD_PARTS)
def test_a_build_reference_imports_no_book_code_at_the_top(stem) -> None:
    """A reference's top-level imports are copied into the reader's stub: they must not hand
    over the book's implementation (the bodies import it inside), and the stub must say where
    the reference is."""
    import ast

    source = solution_path(stem).read_text(encoding="utf-8")
    top = [n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith("llmbook") for m in modules), modules
    stub = make_stub(source, stem)
    assert stub.startswith(f'r"""Your build of Part {label(stem).split("-")[1]} of the book')
    assert f"llmbook grade {label(stem)}" in stub and f"llmbook/workbench/units/{stem}.py" in stub
    assert "from llmbook" not in stub and "import llmbook" not in stub


@pytest.mark.parametrize("stem", BUILD_PARTS)
def test_every_build_exercise_has_a_check_and_every_answer_a_use(stem) -> None:
    """A unit's ``EXERCISES`` are numbered 1..n, rated 1-3 stars with plain titles, each has a
    check; and the checks call exactly the reference's public functions and classes."""
    from llmbook.workbench.checks import build_exercises

    listed = build_exercises(stem)
    found = checks_for(stem)
    assert list(found) == list(listed) == list(range(1, len(listed) + 1))
    for stars, title in listed.values():
        assert stars in (1, 2, 3) and title and not set("$\\`") & set(title), title
    reference = load_solutions(stem)
    public = {n for n, v in vars(reference).items() if not n.startswith("_")
              and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == reference.__name__}
    assert {u for checks in found.values() for c in checks for u in c.uses} == public
