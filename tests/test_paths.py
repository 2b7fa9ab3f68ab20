"""Where the book's data is found: the checkout, ``LLMBOOK_DATA``, and an installed wheel.

The last test builds the wheel as ``pip install .`` would (not editable), installs it into
an empty folder and uses the shipped models and texts from another directory, where the
repository cannot be seen.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import llmbook
from llmbook.paths import DATA_ENV, data_dir, data_path, missing_data, source_checkout
from llmbook.text.corpus import stdlib_docs_path
from llmbook.training.pretrained import book_model, models_dir
from llmbook.workbench.checks import build_exercises
from llmbook.workbench.solutions import BUILD_PARTS

ROOT = Path(__file__).resolve().parents[1]


def _setup_module():
    """``setup.py`` imported as a module (its ``shipped_files`` lists what the wheel carries)."""
    spec = importlib.util.spec_from_file_location("llmbook_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checkout_uses_its_own_data_folder(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert source_checkout() == ROOT
    assert data_dir() == ROOT / "data"
    assert data_path("models", "text") == ROOT / "data" / "models" / "text"
    assert stdlib_docs_path() == ROOT / "data" / "stdlib_docs.txt"


@pytest.mark.parametrize("bad", ["", "../secret", "/etc", 3])
def test_data_path_takes_relative_names_only(bad):
    with pytest.raises(ValueError, match="relative name"):
        data_path(bad)


def test_every_loader_honours_llmbook_data_and_names_it_when_a_file_is_missing(
        tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    monkeypatch.delenv("LLMBOOK_MODELS", raising=False)
    assert data_dir() == tmp_path and models_dir() == tmp_path / "models"
    with pytest.raises(FileNotFoundError, match=f"(?s)the corpus is missing.*{DATA_ENV}"):
        stdlib_docs_path()
    with pytest.raises(ValueError, match=f"(?s)the shipped 'synthetic' model is missing.*{DATA_ENV}"
                                         r".*pip install --force-reinstall llmbook"):
        book_model("synthetic")
    # a copy of the corpus in the folder is found there
    (tmp_path / "stdlib_docs.txt").write_text("docstrings", encoding="utf-8")
    assert stdlib_docs_path() == tmp_path / "stdlib_docs.txt"


def test_missing_data_names_every_remedy():
    err = missing_data(Path("/x/y.json"), "the thing", "make models", error=ValueError)
    assert isinstance(err, ValueError)
    text = str(err)
    for part in ("the thing is missing: /x/y.json", DATA_ENV, "llmbook/_data",
                 "pip install --force-reinstall llmbook", "`make models` rebuilds it"):
        assert part in text


def test_the_wheel_ships_every_data_file_but_the_scripts():
    files = {p.relative_to(ROOT / "data").as_posix() for p in _setup_module().shipped_files()}
    assert {"stdlib_docs.txt", "heldout_prose.txt", "LICENSE-PSF.txt",
            "models/text/model.safetensors", "models/text/encoder.json",
            "models/dpo/tensors.safetensors", "scaling/isoflop_sweep.json",
            "quantisation/smollm2_sweep.json", "worked_examples/the_cat_sat.json"} <= files
    assert not any(f.startswith("make_") for f in files)


#: Run in a fresh interpreter from an empty directory, with only the installed wheel on its path.
_USE_INSTALLED = r"""
import json, sys
from pathlib import Path
import llmbook, llmbook.paths
from llmbook.training.pretrained import book_model
from llmbook.text.corpus import load_stdlib_docs
from llmbook.text.worked_example import load_the_cat_sat
from llmbook.alignment.shipped import load_artifact
from llmbook.training.scaling import ISOFLOP_RESULTS
from llmbook.inference.real_quant import SWEEP_JSON, HELDOUT_PROSE
from llmbook.nbtools import figures_dir
model, info = book_model("text")
tensors, _ = load_artifact("reward_model")
print(json.dumps({
    "package": llmbook.__file__, "data": str(llmbook.paths.data_dir()),
    "checkout": llmbook.paths.source_checkout(),
    "val_loss": info["val_loss"], "tokens": len(info["tokenizer"].encode("hello world")),
    "corpus": len(load_stdlib_docs()), "example": type(load_the_cat_sat()).__name__,
    "reward_tensors": len(tensors), "isoflop": ISOFLOP_RESULTS.is_file(),
    "sweep": SWEEP_JSON.is_file(), "prose": HELDOUT_PROSE.is_file(),
    "figures": str(figures_dir()),
}))
"""


def test_a_non_editable_install_works_from_another_directory(tmp_path):
    """``pip install`` of the built wheel into an empty folder; the book's data comes with it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
    shutil.copytree(ROOT / "llmbook", src / "llmbook", ignore=ignore)
    shutil.copytree(ROOT / "data", src / "data", ignore=ignore)
    shutil.copytree(ROOT / "notebooks" / "solutions", src / "notebooks" / "solutions", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(pip + ["wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path / "dist"), str(src)], check=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("llmbook-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points, = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "llmbook = llmbook.cli:main" in z.read(entry_points).decode()
    assert "llmbook/_data/models/text/model.safetensors" in names
    assert not any(n.startswith("llmbook/_data/make_") for n in names)
    site = tmp_path / "site"
    subprocess.run(pip + ["install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in (DATA_ENV, "LLMBOOK_MODELS", "LLMBOOK_FIGURES", "PYTHONPATH")}
    # the installed copy comes first on the path, ahead of the checkout's editable install
    env["PYTHONPATH"] = str(site)
    run = subprocess.run([sys.executable, "-c", _USE_INSTALLED], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(got["package"]).is_relative_to(site), got["package"]
    assert got["checkout"] is None
    assert got["data"] == str(site / "llmbook" / "_data")
    _, info = book_model("text")
    assert got["val_loss"] == info["val_loss"]
    assert got["tokens"] == len(info["tokenizer"].encode("hello world"))
    assert got["corpus"] == len(stdlib_docs_path().read_text(encoding="utf-8"))
    assert got["example"] == "WorkedExample" and got["reward_tensors"] > 0
    assert got["isoflop"] and got["sweep"] and got["prose"]
    assert got["figures"] == str(elsewhere / "figures")
    assert Path(llmbook.__file__).is_relative_to(ROOT)  # this process still uses the checkout
    # the reader's workbench works from the wheel alone (issue 28): the reference solutions,
    # the checks and the list of exercises are in it, and grading runs outside the checkout
    for name in ("llmbook/workbench/_solutions/03_language_modelling.py",
                 "llmbook/workbench/checks/ch03.py", "llmbook/workbench/exercises.json"):
        assert name in names, name
    work = elsewhere / "work"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "llmbook.cli", *args, "--dir", str(work)], cwd=elsewhere,
                              env=env, capture_output=True, text=True, timeout=300)

    wrote = cli("exercises", "03")
    assert wrote.returncode == 0 and (work / "03_language_modelling.py").exists(), wrote.stderr
    stub_grade = cli("grade", "03")
    assert stub_grade.returncode == 1 and stub_grade.stdout.count("not attempted") == 4, stub_grade.stdout
    shutil.copyfile(site / "llmbook" / "workbench" / "_solutions" / "03_language_modelling.py",
                    work / "03_language_modelling.py")
    reference_grade = cli("grade", "03")
    assert reference_grade.returncode == 0 and "4 of 4 exercises passed" in reference_grade.stdout, \
        reference_grade.stdout + reference_grade.stderr
    answers = work / "03_language_modelling.py"
    answers.write_text(answers.read_text(encoding="utf-8").replace(
        "return ((1.0 - epsilon) * nll + epsilon * uniform).mean()", "return nll.mean()"), encoding="utf-8")
    broken_grade = cli("grade", "03")
    assert broken_grade.returncode == 1 and "3 of 4 exercises passed" in broken_grade.stdout
    assert "Label smoothing" in next(line for line in broken_grade.stdout.splitlines() if "FAILED" in line)
    # the build-it-yourself track too: its references are in the package
    for stem in BUILD_PARTS:
        assert f"llmbook/workbench/units/{stem}.py" in names and \
            f"llmbook/workbench/checks/{stem.split('_')[0]}.py" in names, stem
    wrote = cli("exercises", "build-II")
    assert wrote.returncode == 0 and (work / "build2_transformer.py").exists(), wrote.stderr
    stub_grade = cli("grade", "build-II")
    assert stub_grade.returncode == 1 and "not attempted" in stub_grade.stdout and \
        "passed" not in stub_grade.stdout.replace("exercises passed", ""), stub_grade.stdout
    shutil.copyfile(site / "llmbook" / "workbench" / "units" / "build2_transformer.py",
                    work / "build2_transformer.py")
    reference_grade = cli("grade", "build-II")
    n = len(build_exercises("build2_transformer"))
    assert reference_grade.returncode == 0 and f"{n} of {n} exercises passed" in reference_grade.stdout, \
        reference_grade.stdout + reference_grade.stderr
    with open(work / "build2_transformer.py", "a", encoding="utf-8") as f:  # SiLU on the wrong branch
        f.write("\n\n_book_swiglu = swiglu\n\n\ndef swiglu(x, w_gate, w_up, w_down):\n"
                "    return _book_swiglu(x, w_up, w_gate, w_down)\n")
    broken_grade = cli("grade", "build-II")
    assert broken_grade.returncode == 1 and f"{n - 1} of {n} exercises passed" in broken_grade.stdout
    assert "SwiGLU" in next(line for line in broken_grade.stdout.splitlines() if "FAILED" in line)
