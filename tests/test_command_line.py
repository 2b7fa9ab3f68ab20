"""Every entry point of the book answers ``--help`` at once, with its usage, and starts no work.

The entry points are found, not listed: every module of ``llmbook`` and every script under
``benchmarks/``, ``tools/`` and ``data/`` with a top-level ``if __name__ == "__main__":``.
Each runs in a fresh process with ``--help`` and must exit 0 within a time limit that is far
below any sweep's or benchmark's (a slow machine imports torch in a few seconds).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAIN = re.compile(r'^if __name__ == "__main__":', re.MULTILINE)


def entry_points() -> list[tuple[str, list[str]]]:
    found = []
    for path in sorted((ROOT / "llmbook").rglob("*.py")):
        if MAIN.search(path.read_text(encoding="utf-8")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found.append((module, [sys.executable, "-m", module]))
    for folder in ("benchmarks", "tools", "data"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if MAIN.search(path.read_text(encoding="utf-8")):
                found.append((f"{folder}/{path.name}", [sys.executable, str(path)]))
    return found


ENTRY_POINTS = entry_points()


def test_the_entry_points_are_found():
    names = {name for name, _ in ENTRY_POINTS}
    assert {"llmbook.chat", "llmbook.training.scaling", "llmbook.inference.real_quant",
            "benchmarks/real_model.py", "tools/sync_notebooks.py"} <= names
    assert "llmbook.scale.launch" not in names  # its docstring mentions the idiom; no entry point


@pytest.mark.parametrize("name,command", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_help_answers_at_once_and_starts_nothing(name, command, tmp_path):
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)  # elsewhere than the repository: nothing to find by chance
    assert result.returncode == 0, f"{name} --help failed:\n{result.stderr[-2000:]}"
    assert result.stdout.lstrip().startswith("usage:"), f"{name} --help printed:\n{result.stdout[:500]}"
    assert list(tmp_path.iterdir()) == [], f"{name} --help wrote files"
