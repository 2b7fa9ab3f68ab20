"""The notebook helpers: source display, the checks table, seeding, figures, environment check."""

import random

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from llmbook import environment, nbtools
from llmbook.nbtools import Checks, format_number, save_figure, seed_everything, show_source


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
     ([1, 2], "[1, 2]"), (list(range(10)), "[0, 1, 2, … (10 values)]"),
     (torch.tensor([0.5, 0.25]), "[0.5, 0.25]"), (np.array(7), "7"), ("abc", "abc")],
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


def test_checks_fails_loudly():
    checks = Checks("demo")
    checks.close("far", expected=1.0, got=1.1, tol=1e-3)
    checks.equal("ids", [1, 2], [2, 1])
    assert not checks.passed
    assert "NO" in checks.table()
    with pytest.raises(AssertionError, match=r"failed checks: \['far', 'ids'\]"):
        checks.assert_all()


def test_checks_relative_error_and_nan():
    checks = Checks()
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


def test_figures_dir_defaults_to_the_checkout(monkeypatch):
    monkeypatch.delenv("LLMBOOK_FIGURES", raising=False)
    assert nbtools.figures_dir().name == "figures"


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
