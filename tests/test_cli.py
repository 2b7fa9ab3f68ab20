"""The ``llmbook`` console script: every subcommand listed, each answers ``--help`` at once."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from llmbook.cli import COMMANDS, benchmarks, main

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_declared_and_installed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"] == {"llmbook": "llmbook.cli:main"}
    script = Path(sys.executable).parent / "llmbook"
    assert script.is_file(), "reinstall the package (make setup) to get the llmbook command"


def test_no_command_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: llmbook")
    for name, cmd in COMMANDS.items():
        assert f"  {name} " in out and cmd.summary in out
    long = [line.split()[0] for line in out.splitlines() if line.endswith("[long]")]
    assert long == [name for name, cmd in COMMANDS.items() if cmd.long]


def test_every_command_runs_a_module_with_a_main():
    for name, cmd in COMMANDS.items():
        module = importlib.import_module(cmd.module)
        if cmd.module != "llmbook.cli":
            assert callable(module.main), name


def test_an_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train-everything"])
    assert exit_.value.code == 2
    assert "invalid choice: 'train-everything'" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_answers_help_and_starts_nothing(name, tmp_path):
    result = subprocess.run([str(Path(sys.executable).parent / "llmbook"), name, "--help"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lstrip().startswith("usage:"), result.stdout[:500]
    assert list(tmp_path.iterdir()) == []


def test_bench_lists_the_checkout_scripts_and_refuses_unknown_names(capsys):
    found = benchmarks()
    assert set(found) == {p.stem for p in (ROOT / "benchmarks").glob("[a-z]*.py")}
    assert "real_model" in found
    assert main(["bench"]) == 0
    listed = capsys.readouterr().out.split("\n")
    assert [line.split()[0] for line in listed if line] == list(found)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "no_such_benchmark"])
    assert exit_.value.code == 2
    assert "no benchmark named 'no_such_benchmark'" in capsys.readouterr().err


def test_env_reports_the_data_folder_and_the_real_model(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert f"data folder: {ROOT / 'data'}" in out
    assert f"source checkout: {ROOT}" in out
    assert "real model: " in out and "torch" in out
