"""``make lab``: JupyterLab rooted at notebooks/, each chapter listed once and paired with its .py.

The contents manager is the one the lab runs (``tools/lab.py``), driven directly, rooted
where ``make lab`` roots it; the save tests work on a copy so the checkout stays as it is.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from lab import NOTEBOOKS, BookContentsManager, paired_sources  # noqa: E402

CHAPTERS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))


def run(coro):
    return asyncio.run(coro)


def test_paired_sources_are_the_py_files_with_an_ipynb_twin():
    names = ["01_a.ipynb", "01_a.py", "02_b.py", "solutions", "x.ipynb", "jupytext.toml"]
    assert paired_sources(names) == {"01_a.py"}


def test_the_config_file_roots_the_lab_at_notebooks_with_the_book_contents_manager():
    config = PyFileConfigLoader("jupyter_lab_config.py", path=str(ROOT / "tools")).load_config()
    assert config.ServerApp.root_dir == str(NOTEBOOKS)
    assert config.ServerApp.contents_manager_class is BookContentsManager
    assert (NOTEBOOKS / "jupytext.toml").is_file()  # inside the root, where jupytext looks


def test_each_chapter_is_listed_once_as_a_notebook_and_found_paired():
    cm = BookContentsManager(root_dir=str(NOTEBOOKS))
    listing = run(cm.get("", content=True))
    names = [e["name"] for e in listing["content"]]
    chapters = [n for n in names if n[:2].isdigit()]
    assert chapters == sorted(chapters, key=names.index)  # (order as the server gives it)
    assert sorted(chapters) == [f"{c}.ipynb" for c in CHAPTERS]
    assert "solutions" in names
    solutions = run(cm.get("solutions", content=True))
    assert any(e["name"].endswith(".py") for e in solutions["content"])  # no twin: listed
    config = run(cm.get_config("04_attention.ipynb"))
    assert config.formats in ("ipynb,py:percent", ["ipynb,py:percent"])
    model = run(cm.get("04_attention.ipynb"))
    assert model["type"] == "notebook"
    assert model["content"]["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"


def test_a_py_source_opens_as_the_notebook_even_when_its_ipynb_is_newer(tmp_path):
    """After ``make sync`` the .ipynb is the newer file; jupytext then compares the two, and
    opens the .py only if they agree once its metadata filters are applied."""
    root = tmp_path / "notebooks"
    root.mkdir()
    for name in ("jupytext.toml", "04_attention.py", "04_attention.ipynb"):
        shutil.copy2(NOTEBOOKS / name, root / name)
    stamp = (root / "04_attention.ipynb").stat().st_mtime - 60
    os.utime(root / "04_attention.py", (stamp, stamp))
    cm = BookContentsManager(root_dir=str(root))
    model = run(cm.get("04_attention.ipynb"))
    text = run(cm.get("04_attention.py"))
    assert text["type"] == "notebook"
    assert [c["source"] for c in text["content"]["cells"]] == \
        [c["source"] for c in model["content"]["cells"]]
    assert any(c.get("outputs") for c in text["content"]["cells"])


def test_saving_in_the_lab_writes_both_files_and_an_unchanged_save_changes_nothing(tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    for name in ("jupytext.toml", "00_preface.py", "00_preface.ipynb"):
        shutil.copy2(NOTEBOOKS / name, root / name)
    cm = BookContentsManager(root_dir=str(root))
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    model = run(cm.get("00_preface.ipynb"))
    run(cm.save(model, "00_preface.ipynb"))
    assert (root / "00_preface.py").read_bytes() == before["00_preface.py"]
    new = {p.name for p in root.iterdir()} - set(before)
    assert new <= {".ipynb_checkpoints"}  # (git ignores the lab's checkpoints)
    model["content"]["cells"][0]["source"] += "\n\nA sentence a reader added."
    run(cm.save(model, "00_preface.ipynb"))
    assert "A sentence a reader added." in (root / "00_preface.py").read_text(encoding="utf-8")
    assert "A sentence a reader added." in (root / "00_preface.ipynb").read_text(encoding="utf-8")
