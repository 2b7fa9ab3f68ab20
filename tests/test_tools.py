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


def test_a_heading_in_code_and_a_control_character_are_reported(tmp_path):
    bad = SOURCE.replace("x = 6 * 7", "x = 6 * 7\n#\n# ## 9.1 A section\ns = '$\x08inom nk$'")
    make_pair(tmp_path, bad, execute=False)
    found = check_notebooks.problems(tmp_path)
    assert "09_tiny: cell 1 is code but holds a markdown heading (a missing '# %% [markdown]' marker?)" in found
    assert "09_tiny: cell 1 holds a control character ('\\x08': a non-raw \\b or \\f?)" in found


def test_a_control_character_in_an_output_is_reported(executed_pair, tmp_path):
    for f in executed_pair.iterdir():
        shutil.copy(f, tmp_path / f.name)
    nb = nbformat.read(tmp_path / "09_tiny.ipynb", 4)
    nb.cells[1].outputs[0]["data"]["text/plain"] = "'\x0crac{1}{2}'"  # a printed non-raw "\frac"
    nbformat.write(nb, tmp_path / "09_tiny.ipynb")
    assert check_notebooks.problems(tmp_path) == [
        "09_tiny.ipynb: an output of cell 1 holds a control character ('\\x0c': a non-raw \\b or \\f?)"]
    assert check_notebooks.output_texts({"output_type": "stream", "text": "a\x08"}) == ["a\x08"]


def test_a_notebook_without_the_pairing_metadata_is_reported(executed_pair, tmp_path):
    for f in executed_pair.iterdir():
        shutil.copy(f, tmp_path / f.name)
    nb = nbformat.read(tmp_path / "09_tiny.ipynb", 4)
    nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}  # as synced before the filters
    nbformat.write(nb, tmp_path / "09_tiny.ipynb")
    found = check_notebooks.problems(tmp_path)
    assert len(found) == 1 and found[0].startswith("09_tiny.ipynb: its jupytext metadata is")


def test_the_book_itself_is_in_sync():
    assert check_notebooks.problems() == []


def test_chapter_sources_resolves_names():
    assert [p.name for p in nbpairs.chapter_sources(["00_preface"])] == ["00_preface.py"]
    with pytest.raises(SystemExit, match="no such notebook"):
        nbpairs.chapter_sources(["99_missing"])


def test_the_second_cpu_setting_changes_float_bits():
    """`make test`'s second nbval pass is only a test if its setting changes PyTorch's
    results. Where the native kernels are vectorised (x86-64 with AVX2 or AVX-512), the
    plain kernels of ATEN_CPU_CAPABILITY=default must give other bits for some op."""
    import cpu_settings

    native = cpu_settings.probe()
    if native["capability"] == "DEFAULT":
        pytest.skip("this CPU has no vectorised PyTorch kernels to switch off")
    second = cpu_settings.probe(cpu_settings.SECOND_SETTING)
    assert second["capability"] == "DEFAULT"
    assert any(native[k] != second[k] for k in native if k != "capability")


def test_diff_outputs_finds_a_changed_output(tmp_path, monkeypatch, capsys):
    import diff_outputs

    py = make_pair(tmp_path)
    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    nb.cells[1].outputs[0]["data"]["text/plain"] = "41"  # as if committed from another run
    nbformat.write(nb, py.with_suffix(".ipynb"))
    assert diff_outputs.main([str(py)]) == 1
    out = capsys.readouterr().out
    assert "-41" in out and "+42" in out and "1 cell(s) differ" in out
    make_pair(tmp_path)  # committed = fresh
    assert diff_outputs.main([str(py)]) == 0


def test_tidy_gives_stable_ids_and_no_timestamps(tmp_path):
    py = make_pair(tmp_path)
    first = nbpairs.tidy(nbformat.read(py.with_suffix(".ipynb"), as_version=4))
    again = nbpairs.read_source(py)
    nbpairs.execute(again, cwd=tmp_path)
    again = nbpairs.tidy(again)
    assert [c["id"] for c in first.cells] == [f"cell-{i}" for i in range(len(first.cells))]
    assert all("execution" not in c.metadata for c in first.cells)
    assert nbformat.writes(first) == nbformat.writes(again)  # re-execution: the same file


def test_sync_markdown_only_copies_prose_and_refuses_changed_code(executed_pair, tmp_path):
    import sync_notebooks

    for f in executed_pair.iterdir():
        shutil.copy(f, tmp_path / f.name)
    py, ipynb = tmp_path / "09_tiny.py", tmp_path / "09_tiny.ipynb"
    py.write_text(SOURCE.replace("A tiny chapter", "A small chapter"))
    assert sync_notebooks.sync_markdown(py) is True
    nb = jupytext.read(ipynb)
    assert nb.cells[0].source == "# 9 A small chapter"
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "42"  # outputs kept, nothing run
    assert check_notebooks.problems(tmp_path) == []
    assert sync_notebooks.sync_markdown(py) is False
    py.write_text(SOURCE.replace("6 * 7", "6 * 8"))
    with pytest.raises(SystemExit, match="code cell 1 differs"):
        sync_notebooks.sync_markdown(py)
