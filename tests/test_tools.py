"""The notebook tools: pairing, sync checks and execution."""

import shutil
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_notebooks  # noqa: E402
import nbpairs  # noqa: E402

SOURCE = """# %% [markdown]
# # 9 A tiny chapter

# %%
x = 6 * 7
x
"""


def make_pair(folder: Path, source: str = SOURCE, execute: bool = True) -> Path:
    py = folder / "09_tiny.py"
    py.write_text(source)
    nb = nbpairs.read_source(py)
    if execute:
        nbpairs.execute(nb, cwd=folder)
    nbformat.write(nb, folder / "09_tiny.ipynb")
    return py


@pytest.fixture(scope="module")
def executed_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nb")
    make_pair(folder)
    return folder


def test_executed_pair_passes_and_has_outputs(executed_pair):
    assert check_notebooks.problems(executed_pair) == []
    nb = jupytext.read(executed_pair / "09_tiny.ipynb")
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "42"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_out_of_sync_pair_is_reported(executed_pair, tmp_path):
    for f in executed_pair.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "09_tiny.py").write_text(SOURCE.replace("6 * 7", "6 * 8"))
    assert check_notebooks.problems(tmp_path) == [
        "09_tiny: .py and .ipynb cells differ (run `make sync NB=09_tiny`)"]


def test_unexecuted_and_unpaired_notebooks_are_reported(tmp_path):
    make_pair(tmp_path, execute=False)
    (tmp_path / "10_orphan.py").write_text(SOURCE)
    found = check_notebooks.problems(tmp_path)
    assert "10_orphan: has only one half of its .py/.ipynb pair" in found
    assert any(p.startswith("09_tiny.ipynb: not executed top to bottom") for p in found)


def test_the_book_itself_is_in_sync():
    assert check_notebooks.problems() == []


def test_chapter_sources_resolves_names():
    assert [p.name for p in nbpairs.chapter_sources(["00_preface"])] == ["00_preface.py"]
    with pytest.raises(SystemExit, match="no such notebook"):
        nbpairs.chapter_sources(["99_missing"])
