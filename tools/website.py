"""Render the book's executed notebooks as a static web site (``build/book/``).

The site is made by Sphinx with MyST-NB (which reads the executed ``.ipynb`` files and
does not run them), the Sphinx Book Theme (a sidebar with the parts and chapters, a
table of contents beside the text, previous/next links, search), and MathJax 3 from the
``sphinx-mathjax-offline`` package, copied into the site so that formulas render with no
network. The landing page says what the book is and how to run it, and lists the
chapters with their run times and the number of checks each one passes.

``python tools/website.py`` renders the committed notebooks; ``tools/build_book.py`` calls
:func:`render` on the notebooks it has just executed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "build" / "book"
SOURCE = ROOT / "build" / "site-src"

#: The book's parts: (title, first chapter, last chapter).
PARTS = [
    ("Preface", 0, 0),
    ("Part I · Text as mathematics", 1, 3),
    ("Part II · The transformer", 4, 7),
    ("Part III · Training", 8, 11),
    ("Part IV · Inference", 12, 15),
    ("Part V · Adaptation and alignment", 16, 20),
    ("Part VI · Scale", 21, 24),
]

CONF = '''\
# Sphinx configuration written by tools/website.py; edit it there.
import importlib.util
from pathlib import Path

from sphinx.util.fileutil import copy_asset

project = "llmbook"
author = "the llmbook authors"
copyright = "the llmbook authors, MIT licence"
extensions = ["myst_nb"]
nb_execution_mode = "off"          # render the executed notebooks as they are
myst_enable_extensions = ["dollarmath", "amsmath"]
html_theme = "sphinx_book_theme"
html_title = "llmbook"
html_theme_options = {"show_toc_level": 2, "home_page_in_toc": True}
html_context = {"default_mode": "light"}  # the theme's light/dark switch starts from this
html_show_sourcelink = False
exclude_patterns = ["_build"]
# MathJax 3 as the sphinx-mathjax-offline package ships it, copied into the site: no CDN
mathjax_path = "mathjax/tex-chtml.js"
_MATHJAX = Path(importlib.util.find_spec("sphinx-mathjax-offline").origin).parent / "static" / "mathjax"


def _copy_mathjax(app, exc):
    if exc is None:
        copy_asset(str(_MATHJAX), str(Path(app.outdir) / "_static" / "mathjax"))


def setup(app):
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
'''


def title_of(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The first ``# heading`` of the notebook's first markdown cell that has one."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, flags=re.M)
            if m:
                return m.group(1).strip()
    return fallback


def count_checks(nb: nbformat.NotebookNode) -> tuple[int, int]:
    """(passed, total) over the check tables (``title: n/m passed``) a notebook printed."""
    passed = total = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
            if isinstance(text, list):
                text = "".join(text)
            for m in re.finditer(r"^.*?: (\d+)/(\d+) passed$", text, flags=re.M):
                passed, total = passed + int(m.group(1)), total + int(m.group(2))
    return passed, total


def readme_seconds() -> dict[str, float]:
    """Each chapter's run time from the README's contents table (``build_book --readme``)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"\(notebooks/(\d\d_\w+)\.ipynb\) \| (\d+) s \|", text)}


def readme_intro() -> str:
    """The README's opening paragraph, which says what the book is."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split("\n", 1)[1].strip()
    return body.split("\n## ", 1)[0].strip()


def landing_page(chapters: list[dict]) -> str:
    rows = []
    for title, first, last in PARTS:
        part = title  # named on the part's first row only
        for c in chapters:
            if first <= c["number"] <= last:
                secs = f"{c['seconds']:.0f} s" if c["seconds"] is not None else "–"
                rows.append(f"| {part} | [{c['title']}]({c['stem']}.ipynb) | {secs} | "
                            f"{c['checks'][0]} / {c['checks'][1]} |")
                part = ""
    n_pass = sum(c["checks"][0] for c in chapters)
    n_all = sum(c["checks"][1] for c in chapters)
    known = [c["seconds"] for c in chapters if c["seconds"] is not None]
    total = f"{sum(known):.0f} s" if known else "–"
    toc = []
    for title, first, last in PARTS:
        stems = [c["stem"] for c in chapters if first <= c["number"] <= last]
        if stems:
            toc.append(f"```{{toctree}}\n:caption: {title}\n:maxdepth: 1\n\n" + "\n".join(stems) + "\n```")
    return f"""# llmbook: the mathematics of large language models

{readme_intro()}

## How to run it

Every chapter on this site is a notebook executed on a laptop CPU; what you read here is
its committed output. To run the book yourself, from a clone of the repository:

```bash
make book   # execute every chapter, render this site
make site   # render it from the committed notebooks
make lab    # study the chapters in JupyterLab
make test   # unit tests; every chapter re-run and compared
```

## Contents

The run time is one chapter's execution on a 2-core CPU; the checks are the rows of the
chapter's check tables (derivations against implementations, implementations against
PyTorch and Hugging Face), all of which must pass for the chapter to run to its end.

| part | chapter | run time | checks passed |
|---|---|---|---|
{chr(10).join(rows)}
| **the book** | **{len(chapters)} chapters** | **{total}** | **{n_pass} / {n_all}** |

{chr(10).join(toc)}
"""


def render(notebooks: list[Path], site: Path = SITE, seconds: dict[str, float] | None = None,
           source: Path = SOURCE, quiet: bool = True) -> Path:
    """Render the executed ``notebooks`` into ``site``; return its ``index.html``.

    ``seconds`` maps a chapter's stem to its run time (default: the README's table);
    ``source`` is the scratch folder for the Sphinx project (emptied first).
    """
    if not notebooks:
        raise ValueError("no notebooks to render")
    seconds = readme_seconds() if seconds is None else seconds
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    chapters = []
    for path in sorted(notebooks):
        nb = nbformat.read(path, as_version=4)
        stem = path.stem
        chapters.append({"stem": stem, "number": int(stem[:2]), "title": title_of(nb, stem),
                         "seconds": seconds.get(stem), "checks": count_checks(nb)})
        nbformat.write(nb, source / path.name)
    (source / "conf.py").write_text(CONF, encoding="utf-8")
    (source / "index.md").write_text(landing_page(chapters), encoding="utf-8")
    if site.exists():
        shutil.rmtree(site)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-j", "2", "-W", "--keep-going",
           "-d", str(source / ".doctrees"), str(source), str(site)]
    if quiet:
        cmd.insert(3, "-q")
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    (site / "chapters.json").write_text(json.dumps(chapters, indent=1) + "\n", encoding="utf-8")
    print(f"site rendered in {time.perf_counter() - start:.1f} s: {site / 'index.html'}", flush=True)
    return site / "index.html"


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Render the committed notebooks as a web site.")
    parser.add_argument("--out", type=Path, default=SITE, help="where the site goes (build/book)")
    args = parser.parse_args(argv)
    index = render(sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), args.out)
    print(f"Open file://{index}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
