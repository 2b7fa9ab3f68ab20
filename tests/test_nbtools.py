"""The notebook helpers: source display, the checks table, seeding, figures, environment check."""

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from llmbook import environment, nbtools
from llmbook.nbtools import (
    Checks,
    best_time,
    format_number,
    save_figure,
    seed_everything,
    show_source,
)


def test_show_source_returns_the_real_source():
    src = show_source(format_number)
    assert src.code.startswith("def format_number(")
    assert "significant digits" in src.code
    assert src._repr_markdown_().startswith("```python\n")
    assert repr(src) == src.code


def test_show_source_rejects_builtins():
    with pytest.raises(TypeError, match="cannot find the source"):
        show_source(len)


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (0.0, "0"), (1 / 3, "0.3333"), (np.float64(2.5e-7), "2.5e-07"), (True, "True"),
     ([1, 2], "[1, 2]"), (list(range(10)), "[10 values]"), (torch.zeros(2, 37, 16), "shape (2, 37, 16)"),
     (np.arange(9.0), "[9 values]"),
     (torch.tensor([0.5, 0.25]), "[0.5, 0.25]"), (np.array(7), "7"), ("abc", "abc"),
     (50257.0, "50257"), (np.float64(1.75e11), "175000000000"), (50257.5, "5.026e+04"), (2.0**60, "1.153e+18")],
)
def test_format_number(value, text):
    assert format_number(value) == text


def test_checks_table_passes_and_reports_errors():
    checks = Checks("demo")
    err = checks.close("close", expected=[1.0, 2.0], got=[1.0, 2.0 + 3e-7], tol=1e-6)
    assert err == pytest.approx(3e-7)
    assert checks.equal("ids", [1, 2, 3], [1, 2, 3])
    assert checks.true("holds", 1 < 2)
    assert checks.passed
    table = checks.table()
    assert table.splitlines()[0] == "demo: 3/3 passed"
    assert "3e-07" in table
    checks.assert_all()


def test_checks_raises_at_the_failing_check():
    checks = Checks("demo")
    checks.close("near", expected=1.0, got=1.0 + 1e-9, tol=1e-6)
    with pytest.raises(AssertionError, match=r"check failed: 'far' \(expected 1, got 1\.1"):
        checks.close("far", expected=1.0, got=1.1, tol=1e-3)
    with pytest.raises(AssertionError, match="check failed: 'ids'"):
        checks.equal("ids", [1, 2], [2, 1])
    with pytest.raises(AssertionError, match="check failed: 'holds'"):
        checks.true("holds", 2 < 1)
    assert [row[-1] for row in checks.rows] == [True, False, False, False]


def test_a_failed_check_stops_a_chapter_run_as_a_script(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "chapter.py"
    script.write_text("from llmbook.nbtools import Checks\n"
                      "c = Checks('demo')\n"
                      "c.equal('one', 1, 2)\n"
                      "print('not reached')\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert run.returncode != 0
    assert "check failed: 'one'" in run.stderr and "not reached" not in run.stdout


def test_checks_not_strict_defers_to_assert_all():
    checks = Checks("demo", strict=False)
    checks.close("far", expected=1.0, got=1.1, tol=1e-3)
    checks.equal("ids", [1, 2], [2, 1])
    assert not checks.passed
    assert "NO" in checks.table()
    with pytest.raises(AssertionError, match=r"failed checks: \['far', 'ids'\]"):
        checks.assert_all()


def test_checks_relative_error_and_nan():
    checks = Checks(strict=False)
    err = checks.close("relative", expected=[1000.0, -2000.0], got=[1000.0, -2000.2], tol=1e-4, rel=True)
    assert err == pytest.approx(1e-4, rel=1e-3)
    checks.close("nan never passes", expected=1.0, got=float("nan"), tol=1.0)
    assert checks.rows[-1][-1] is False


def test_checks_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"shape \(2,\) but got has shape \(3,\)"):
        Checks().close("x", expected=[1.0, 2.0], got=[1.0, 2.0, 3.0])


def test_seed_everything_repeats_all_generators():
    def draw():
        g = seed_everything(123)
        return random.random(), np.random.rand(), torch.rand(2).tolist(), torch.rand(2, generator=g).tolist()

    assert draw() == draw()


def test_seed_everything_sets_what_use_deterministic_algorithms_sets():
    """The same flags as torch.use_deterministic_algorithms(True, warn_only=True), in a fresh
    process: without the compiler loaded it is not imported; with it loaded its flag is set."""
    code = ("import sys, torch\n"
            "from llmbook.nbtools import seed_everything\n"
            "seed_everything(0)\n"
            "print(torch.are_deterministic_algorithms_enabled(), "
            "torch.is_deterministic_algorithms_warn_only_enabled(), 'torch._inductor' in sys.modules)\n"
            "import torch._inductor.config as c\n"
            "c.deterministic = False\n"
            "seed_everything(0)\n"
            "print(c.deterministic)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False", "True"]


def _child_hash(env: dict[str, str]) -> int:
    out = subprocess.run(
        [sys.executable, "-c", "print(hash('llmbook'))"], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_seed_everything_hash_seed_reaches_children_only(monkeypatch):
    """PYTHONHASHSEED cannot change the running interpreter, only processes started later."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    before = hash("llmbook-" + str(id(object)))
    seed_everything(7)
    assert hash("llmbook-" + str(id(object))) == before  # the running interpreter is unchanged
    assert os.environ["PYTHONHASHSEED"] == "7"
    child = _child_hash(dict(os.environ))
    fixed = _child_hash({**os.environ, "PYTHONHASHSEED": "7"})
    other = _child_hash({**os.environ, "PYTHONHASHSEED": "8"})
    assert child == fixed and child != other


def test_book_kernels_start_with_hash_seed_zero():
    """The Makefile exports PYTHONHASHSEED=0 and sync_notebooks sets it when absent."""
    root = Path(__file__).resolve().parents[1]
    assert re.search(r"^export PYTHONHASHSEED := 0$", (root / "Makefile").read_text(), re.M)
    assert 'os.environ.setdefault("PYTHONHASHSEED", "0")' in (root / "tools" / "sync_notebooks.py").read_text()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    flag = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.flags.hash_randomization)"],
        env={**env, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True,
    )
    assert flag.stdout.strip() == "0"
    assert _child_hash({**env, "PYTHONHASHSEED": "0"}) == _child_hash({**env, "PYTHONHASHSEED": "0"})


def test_save_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBOOK_FIGURES", str(tmp_path))
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_figure(fig, "99_test_line")
    first = path.read_bytes()
    assert path == tmp_path / "99_test_line.png" and first[:8] == b"\x89PNG\r\n\x1a\n"
    save_figure(fig, "99_test_line")
    assert path.read_bytes() == first  # no timestamp: identical bytes
    plt.close(fig)
    for bad in ["", "a/b", "x.png"]:
        with pytest.raises(ValueError, match="bare stem"):
            save_figure(fig, bad)


def test_figures_dir_leaves_the_checkout_clean_unless_asked(monkeypatch):
    monkeypatch.delenv("LLMBOOK_FIGURES", raising=False)
    root = Path(nbtools.__file__).resolve().parents[1]
    assert nbtools.figures_dir() == root / "build" / "figures"  # git ignores build/
    monkeypatch.setenv("LLMBOOK_FIGURES", str(root / "figures"))  # what make sync sets
    assert nbtools.figures_dir() == root / "figures"


def test_parse_version():
    assert environment.parse_version("2.13.0+cpu") == (2, 13, 0)
    assert environment.parse_version("1.26rc1") == (1, 26)
    assert environment.parse_version("2026.11.15") == (2026, 11, 15)


def test_check_environment_passes_here(capsys):
    rows = environment.check_environment()
    assert {r.name for r in rows} >= {"torch", "sympy", "tokenizers"}
    assert "torch" in capsys.readouterr().out


def test_check_environment_names_what_is_missing():
    reqs = {"numpy": ("999.0", "arrays"), "no_such_package_xyz": ("1.0", "nothing")}
    with pytest.raises(RuntimeError) as info:
        environment.check_environment(reqs, verbose=False)
    message = str(info.value)
    assert "numpy" in message and "older than 999.0" in message
    assert "no_such_package_xyz is not installed" in message
    assert "make setup" in message


def test_requirements_agree_with_pyproject():
    """Every minimum the environment check names is the lower bound pyproject.toml declares."""
    import tomllib

    deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {}
    for dep in deps:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", dep)
        if m:
            bounds[m.group(1).lower()] = m.group(2)
    for name, (minimum, _) in environment.REQUIREMENTS.items():
        if name in bounds:
            assert bounds[name] == minimum, name
    assert environment.REQUIREMENTS["torch"][0] == bounds["torch"] == "2.5"


def test_check_environment_names_torch_features(monkeypatch):
    """An SDPA without enable_gqa, or one that gives NaN for a fully masked row, is reported."""
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention

    def old_sdpa(q, k, v, attn_mask=None):  # torch 2.4's signature: no enable_gqa
        out = real(q, k, v, attn_mask=attn_mask)
        if attn_mask is not None:
            out = out.masked_fill(~attn_mask.any(-1, keepdim=True), float("nan"))
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", old_sdpa)
    with pytest.raises(RuntimeError) as info:
        environment.check_environment(verbose=False)
    assert "enable_gqa" in str(info.value) and "fully masked row" in str(info.value)


def _sanitize(text):
    import configparser
    import re
    from pathlib import Path

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parent / "nbval_sanitize.cfg")
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    return text


def test_the_sanitize_file_masks_round_off_and_nothing_else():
    assert _sanitize("err 3e-08, <1e-15, < 1e-7, -2.5e-16") == \
        "err ROUNDOFF, ROUNDOFF, ROUNDOFF, ROUNDOFF"
    kept = "1e-05 2e-3 0.001 4.2e+06 1e5 x1e-07y 50257 0.1234"
    assert _sanitize(kept) == kept


def test_checks_rows_read_the_same_whatever_the_round_off():
    """Two CPUs give 0 and -3e-08 for a value that should be 0, or an error of exactly 0 and
    of 2e-16: the rows must print the same."""
    a, b = Checks("a"), Checks("b")
    a.close("J 1 = 0", expected=[0.0, 1.0, 0.0], got=[0.0, 1.0, 0.0], tol=1e-6)
    b.close("J 1 = 0", expected=[0.0, 1.0, 0.0], got=[-3e-08, 1.0 + 2e-16, 4e-9], tol=1e-6)
    assert a.rows[0][1:3] == b.rows[0][1:3] and a.rows[0][4] and b.rows[0][4]
    assert a.rows[0][2] == "[0, 1, 0]" and a.rows[0][3] == "<1e-15"
    assert (a.rows[0][3], b.rows[0][3]) == ("<1e-15", "3e-08")  # both masked by nbval:
    assert _sanitize(a.table().replace("a:", "b:")) == _sanitize(b.table())
    # values above round-off, and integers, are shown as they are
    c = Checks("c")
    c.close("small but real", expected=[2e-3, 50257], got=[2e-3, 50257], tol=1e-9)
    assert c.rows[0][2] == "[0.002, 50257]"
    c.close("integers", expected=[50257, 3], got=[50257, 3], tol=0)
    assert c.rows[1][2] == "[50257, 3]"


def test_best_time_returns_the_fastest_run_and_the_result():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.02 if len(calls) == 1 else 0.0)
        return len(calls)

    seconds, result = best_time(fn, repeats=3)
    assert result == 3 and len(calls) == 3
    assert 0 <= seconds < 0.02  # the slow first call is not the one reported
    with pytest.raises(ValueError, match="repeats"):
        best_time(fn, repeats=0)
    with pytest.raises(TypeError, match="callable"):
        best_time(42)


def test_claim_grades_table_and_markdown():
    claims = nbtools.ClaimGrades("claims here")
    claims.grade("C4", "mask = triu(ones) * -inf", "28 of 49 entries are NaN", "wrong")
    claims.grade("C1", "a | pipe", "151,643 + 3 ids", "true only under a condition")
    text = repr(claims)
    assert text.splitlines()[0] == "claims here: 2 graded"
    assert "C4  claim:    mask = triu(ones) * -inf" in text and "verdict:  WRONG" in text
    md = claims._repr_markdown_()
    assert "| C4 | mask = triu(ones) * -inf | 28 of 49 entries are NaN | **wrong** |" in md
    assert "a \\| pipe" in md  # a pipe in a cell is escaped, the table keeps four columns
    with pytest.raises(ValueError, match="verdict"):
        claims.grade("C9", "x", "y", "probably")
    with pytest.raises(ValueError, match="evidence"):
        claims.grade("C9", "x", "  ", "correct")
    assert nbtools.VERDICTS[0] == "correct" and len(nbtools.VERDICTS) == 5


def test_formula_typesets_in_a_notebook_and_prints_its_latex_elsewhere():
    import subprocess
    import sys

    from llmbook.nbtools import Formula

    f = Formula(r"\frac{a}{b} = 2")
    assert f._repr_latex_() == r"$\displaystyle \frac{a}{b} = 2$"
    assert repr(f) == r"\frac{a}{b} = 2"
    for bad in ("", "   ", 3):
        with pytest.raises(ValueError, match="non-empty LaTeX string"):
            Formula(bad)
    # a script run (no Jupyter front end): IPython's display prints the object
    script = "from IPython.display import display\nfrom llmbook.nbtools import Formula\n" \
             "display(Formula(r'E = mc^2'))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert out == "E = mc^2\n"


def test_a_solution_file_run_as_a_script_reports_its_tests(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, str(root / "notebooks" / "solutions" / "00_preface.py")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "checking the reference solutions in 00_preface.py with tests/test_solutions_00.py" \
        in run.stdout
    assert "PASSED" in run.stdout and "passed" in run.stdout.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="expected notebooks/solutions/NN_slug.py"):
        nbtools.run_solution_tests("notes.py")


def test_a_suffixed_chapter_runs_its_own_solution_tests(monkeypatch, capsys):
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda args, cwd: calls.append(args) or 0)
    assert nbtools.run_solution_tests("notebooks/solutions/10c_data.py") == 0
    assert calls[0][-1].endswith("tests/test_solutions_10c.py")  # not chapter 10's tests
    assert "with tests/test_solutions_10c.py" in capsys.readouterr().out
    for bad in ("10cc_data.py", "1_data.py", "10c_data.txt"):
        with pytest.raises(ValueError, match="expected notebooks/solutions/NN_slug.py"):
            nbtools.run_solution_tests(bad)


def test_a_long_check_name_prints_in_full_and_long_values_are_cut():
    checks = nbtools.Checks("long")
    name = "the probability that a sampled token lies in the nucleus of the distribution"
    checks.true(name, True, got="x" * 60)
    lines = checks.table().splitlines()
    assert lines[3].startswith(name + "  ")
    assert len(lines[1]) >= len(name) and lines[2].startswith("-" * len(name) + "  ")
    assert ("x" * 47 + "…") in lines[3] and ("x" * 48) not in lines[3]
