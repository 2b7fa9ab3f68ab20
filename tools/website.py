"""Render the book's executed notebooks as a static web site (``build/book/``).

The site is made by Sphinx with MyST-NB (which reads the executed ``.ipynb`` files and
does not run them), the Sphinx Book Theme (a sidebar with the parts and chapters, a
table of contents beside the text, previous/next links, search), and MathJax 3 from the
``sphinx-mathjax-offline`` package, copied into the site so that formulas render with no
network. The landing page says what the book is and how to run it, and lists the
chapters with their run times and the number of checks each one passes.

The chapters are rendered from copies that :mod:`site_text` adjusts for the web (check
tables as HTML tables, papers linked to the bibliography, a box with the chapter's
notebook, solutions and how to run it). Besides the chapters the site has the
bibliography (``references.bib``, through sphinxcontrib-bibtex), the glossary of
notation (``book/glossary.md``), the changelog (``CHANGELOG.md``) and each chapter's
solutions (``notebooks/solutions``). ``book/llmbook.css`` makes code, output and tables
fit the text column. Search shows a snippet of every result from ``file://`` as over HTTP:
the text of each page ships with the search page (:func:`write_search_snippets`).

``python tools/website.py`` renders the committed notebooks; ``tools/build_book.py`` calls
:func:`render` on the notebooks it has just executed.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from site_text import prepare_chapter

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "build" / "book"
SOURCE = ROOT / "build" / "site-src"
BOOK = ROOT / "book"  # the site's own files: style, script, glossary

#: The project's public home: its source, issues and releases.
REPOSITORY = "https://github.com/llmbook/llmbook"

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
extensions = ["myst_nb", "sphinxcontrib.bibtex"]
nb_execution_mode = "off"          # render the executed notebooks as they are
myst_enable_extensions = ["dollarmath", "amsmath"]
math_numfig = True                 # labelled formulas are numbered: (1), (2), ...
bibtex_bibfiles = ["references.bib"]
bibtex_reference_style = "author_year"
bibtex_default_style = "alpha"
html_theme = "sphinx_book_theme"
html_title = "llmbook"
html_theme_options = {{
    "show_toc_level": 2, "home_page_in_toc": True,
    "repository_url": {repository!r}, "repository_branch": "main",
    "use_repository_button": True,
    "navbar_persistent": [],       # one search box: the sidebar's (a button on a phone)
}}
html_sidebars = {{"**": ["navbar-logo.html", "search-button-field.html", "sbt-sidebar-nav.html"]}}
html_context = {{"default_mode": "light"}}  # the theme's light/dark switch starts from this
html_show_sourcelink = False
html_static_path = ["_static"]
html_css_files = ["llmbook.css"]
html_js_files = ["llmbook.js"]
exclude_patterns = ["_build"]
# MathJax 3 as the sphinx-mathjax-offline package ships it, copied into the site: no CDN
mathjax_path = "mathjax/tex-chtml.js"
_MATHJAX = Path(importlib.util.find_spec("sphinx-mathjax-offline").origin).parent / "static" / "mathjax"


def _copy_mathjax(app, exc):
    if exc is None:
        copy_asset(str(_MATHJAX), str(Path(app.outdir) / "_static" / "mathjax"))


def setup(app):
    app.connect("build-finished", _copy_mathjax)
    return {{"parallel_read_safe": True, "parallel_write_safe": True}}
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
            for m in re.finditer(r"\(notebooks/(\d\d[a-z]?_\w+)\.ipynb\) \| (\d+) s \|", text)}


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
    toc.append("```{toctree}\n:caption: Back matter\n:maxdepth: 1\n\n"
               "bibliography\nglossary\nchangelog\n```")
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

Each chapter opens with a link to its notebook, to the solutions of its exercises and to
the repository, and says how to run that chapter alone. The source, issues and releases
are at <a href="{REPOSITORY}">{REPOSITORY}</a>; to cite the book, use its `CITATION.cff`
there. The back matter holds the [bibliography](bibliography.md), a
[glossary of the notation](glossary.md) and the [changelog](changelog.md) of editions and
errata.

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


def solution_page(path: Path, title: str, repository: str = REPOSITORY) -> str:
    """A page that shows a chapter's reference solutions (``notebooks/solutions/<stem>.py``)."""
    stem = path.stem
    code = path.read_text(encoding="utf-8").rstrip()
    fence = "````" if "```" in code else "```"
    return f"""---
orphan: true
---

# Solutions: {title}

The reference solutions to the exercises of [{title}](../{stem}.ipynb), as the repository
holds them (<a href="{repository}/blob/main/notebooks/solutions/{stem}.py">{stem}.py on the
repository</a>, <a href="{stem}.py" download>download</a>); the tests in `tests/` check them.

{fence}python
{code}
{fence}
"""


def bibliography_page() -> str:
    """The bibliography: every entry of ``references.bib``, each linked from where it is cited."""
    return """# Bibliography

The papers, books and documents the chapters name. A year in a chapter links here; the
entries are in ``references.bib`` at the root of the repository.

```{bibliography}
:all:
```
"""


def page_text(html_text: str) -> str:
    """A page's article, reduced to its sections' ids and text, for search snippets."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html_text, "html.parser")
    article = soup.select_one("article.bd-article") or soup.body
    for el in article.select("script, style, .headerlink, div.cell_input, mjx-container, img, svg"):
        el.decompose()

    def walk(node) -> str:  # sections nest; each keeps its id so a result's anchor finds it
        parts = []
        for child in node.children:
            if getattr(child, "name", None) == "section":
                parts.append(f'<section id="{child.get("id", "")}">{walk(child)}</section>')
            elif getattr(child, "name", None):
                words = " ".join(child.get_text(" ").split())
                if words:
                    parts.append(html.escape(words) + " ")
            elif str(child).strip():
                parts.append(html.escape(" ".join(str(child).split())) + " ")
        return "".join(parts)

    return f'<div role="main">{walk(article)}</div>'


SNIPPETS_JS = """// Written by tools/website.py: the text of every page, for the snippets under search
// results. Sphinx's search fetches each result's page to cut a snippet from it; that fetch
// fails from file:// and, over HTTP, finds the page's toolbar before its text. Here it is
// answered from the text below instead, the same way from file:// and over HTTP.
window.LLMBOOK_PAGES = %s;
(() => {
  const realFetch = window.fetch.bind(window);
  window.fetch = (input, init) => {
    const url = typeof input === "string" ? input : input.url;
    const root = document.documentElement.dataset.content_root || "";
    if (url.startsWith(root) && url.endsWith(".html")) {
      const page = window.LLMBOOK_PAGES[url.slice(root.length, -5)];
      if (page !== undefined)
        return Promise.resolve(new Response(page, {headers: {"Content-Type": "text/html"}}));
    }
    return realFetch(input, init);
  };
})();
"""


def write_search_snippets(site: Path) -> int:
    """Give the search page the text of every page (see ``SNIPPETS_JS``); return how many."""
    pages = {}
    for path in sorted(site.rglob("*.html")):
        name = path.relative_to(site).with_suffix("").as_posix()
        if name in ("search", "genindex") or name.startswith("_"):
            continue
        pages[name] = page_text(path.read_text(encoding="utf-8"))
    (site / "_static" / "llmbook-snippets.js").write_text(
        SNIPPETS_JS % json.dumps(pages, ensure_ascii=False), encoding="utf-8")
    search = site / "search.html"
    text = search.read_text(encoding="utf-8")
    tag = '<script src="_static/llmbook-snippets.js"></script>\n'
    search.write_text(text.replace("</head>", tag + "</head>", 1), encoding="utf-8")
    return len(pages)


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
    (source / "_static").mkdir(parents=True)
    (source / "solutions").mkdir()
    chapters = []
    cited: set[str] = set()
    for path in sorted(notebooks):
        nb = nbformat.read(path, as_version=4)
        stem = path.stem
        title = title_of(nb, stem)
        chapters.append({"stem": stem, "number": int(stem[:2]), "title": title,
                         "seconds": seconds.get(stem), "checks": count_checks(nb)})
        chapters[-1].update(prepare_chapter(nb, stem, REPOSITORY, cited))
        nbformat.write(nb, source / path.name)
        solution = ROOT / "notebooks" / "solutions" / f"{stem}.py"
        if solution.is_file():
            (source / "solutions" / f"{stem}.md").write_text(solution_page(solution, title),
                                                            encoding="utf-8")
    (source / "conf.py").write_text(CONF.format(repository=REPOSITORY), encoding="utf-8")
    (source / "index.md").write_text(landing_page(chapters), encoding="utf-8")
    shutil.copy(ROOT / "references.bib", source / "references.bib")
    (source / "bibliography.md").write_text(bibliography_page(), encoding="utf-8")
    shutil.copy(BOOK / "glossary.md", source / "glossary.md")
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    (source / "changelog.md").write_text(changelog, encoding="utf-8")
    for name in ("llmbook.css", "llmbook.js"):
        shutil.copy(BOOK / name, source / "_static" / name)
    if site.exists():
        shutil.rmtree(site)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-j", "2", "-W", "--keep-going",
           "-d", str(source / ".doctrees"), str(source), str(site)]
    if quiet:
        cmd.insert(3, "-q")
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    # the notebooks to download are the committed ones, not the copies adjusted for the web
    (site / "notebooks").mkdir()
    for path in notebooks:
        shutil.copy(path, site / "notebooks" / path.name)
        shutil.copy(path, site / "_sources" / path.name)
        solution = ROOT / "notebooks" / "solutions" / f"{path.stem}.py"
        if solution.is_file():
            shutil.copy(solution, site / "solutions" / solution.name)
    write_search_snippets(site)
    (site / "chapters.json").write_text(json.dumps(chapters, indent=1) + "\n", encoding="utf-8")
    print(f"site rendered in {time.perf_counter() - start:.1f} s: {site / 'index.html'}", flush=True)
    return site / "index.html"


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Render the committed notebooks as a web site.")
    parser.add_argument("--out", type=Path, default=SITE, help="where the site goes (build/book)")
    args = parser.parse_args(argv)
    index = render(sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")), args.out)
    print(f"Open file://{index}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
