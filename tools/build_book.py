"""Build the book (``make book``): execute every chapter and render it to HTML.

Each ``notebooks/NN_slug.py`` is executed top to bottom in a fresh kernel; the
executed notebook and its HTML rendering go to ``build/book/``, with an
``index.html`` table of contents giving each chapter's measured run time. The
committed notebooks are left untouched (``make sync`` re-executes those).

``--readme`` also rewrites the table of contents in README.md (between the
``<!-- toc -->`` markers) with the run times just measured.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbpairs import ROOT, chapter_sources, execute, read_source

BUILD = ROOT / "build" / "book"


def title_of(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, flags=re.M)
            if m:
                return m.group(1).strip()
    return fallback


def build(names: list[str]) -> list[dict]:
    BUILD.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()
    chapters = []
    for py in chapter_sources(names):
        nb = read_source(py)
        seconds = execute(nb)
        nbformat.write(nb, BUILD / f"{py.stem}.ipynb")
        body, _ = exporter.from_notebook_node(nb)
        (BUILD / f"{py.stem}.html").write_text(body, encoding="utf-8")
        chapters.append({"stem": py.stem, "title": title_of(nb, py.stem), "seconds": round(seconds, 1)})
        print(f"{py.stem}: executed and rendered in {seconds:.1f} s", flush=True)
    return chapters


def write_index(chapters: list[dict]) -> Path:
    total = sum(c["seconds"] for c in chapters)
    rows = "\n".join(
        f'<tr><td><a href="{c["stem"]}.html">{html.escape(c["title"])}</a></td>'
        f'<td style="text-align:right">{c["seconds"]:.0f} s</td></tr>'
        for c in chapters
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>llmbook</title>
<style>body{{font-family:sans-serif;max-width:44em;margin:2em auto}}td{{padding:.2em 1em}}</style>
</head><body>
<h1>llmbook: the mathematics of large language models</h1>
<p>Derive, implement, verify, explore. Executed on {html.escape(platform.platform())}
with {os.cpu_count()} CPUs; total {total:.0f} s.</p>
<table><tr><th>chapter</th><th>run time</th></tr>
{rows}
</table></body></html>
"""
    index = BUILD / "index.html"
    index.write_text(page, encoding="utf-8")
    (BUILD / "timings.json").write_text(json.dumps(
        {"machine": platform.platform(), "cpus": os.cpu_count(),
         "date": time.strftime("%Y-%m-%d"), "chapters": chapters}, indent=2) + "\n")
    return index


def update_readme(chapters: list[dict]) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    lines = ["| chapter | notebook | run time (2-core CPU) |", "|---|---|---|"]
    for c in chapters:
        lines.append(f"| {c['title']} | [`{c['stem']}.ipynb`](notebooks/{c['stem']}.ipynb) "
                     f"| {c['seconds']:.0f} s |")
    lines.append(f"| **whole book** | | **{sum(c['seconds'] for c in chapters):.0f} s** |")
    table = "\n".join(lines)
    new, n = re.subn(r"<!-- toc -->.*?<!-- /toc -->",
                     lambda m: f"<!-- toc -->\n{table}\n<!-- /toc -->", text, flags=re.S)
    if n != 1:
        raise SystemExit("README.md has no <!-- toc --> ... <!-- /toc --> block")
    readme.write_text(new, encoding="utf-8")
    print("README.md table of contents updated")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="chapters to build (default: all)")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's table of contents")
    args = parser.parse_args(argv)
    chapters = build(args.notebooks)
    index = write_index(chapters)
    if args.readme:
        update_readme(chapters)
    print(f"\nThe book is built. Open {index.relative_to(ROOT)} in a browser "
          f"(file://{index}), or run `make lab` to study it interactively.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
