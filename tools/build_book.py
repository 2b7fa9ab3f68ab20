"""Build the book (``make book``): execute every chapter, then render the web site.

Each ``notebooks/NN_slug.py`` is executed top to bottom in a fresh kernel into
``build/executed/NN_slug.ipynb`` (the committed notebooks are left untouched; ``make sync``
re-executes those), and :mod:`website` renders the executed notebooks as a static site in
``build/book/`` (sidebar, math rendered offline, search) whose landing page gives each
chapter's measured run time.

``--render-only`` skips the execution and renders the committed notebooks (seconds;
``make site``). ``--readme`` also rewrites the table of contents in README.md (between the
``<!-- toc -->`` markers) with the run times just measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import nbformat
from nbpairs import NOTEBOOKS, ROOT, chapter_sources, execute, read_source
from website import render, title_of

EXECUTED = ROOT / "build" / "executed"


def build(names: list[str]) -> list[dict]:
    EXECUTED.mkdir(parents=True, exist_ok=True)
    chapters = []
    for py in chapter_sources(names):
        nb = read_source(py)
        seconds = execute(nb)
        nbformat.write(nb, EXECUTED / f"{py.stem}.ipynb")
        chapters.append({"stem": py.stem, "title": title_of(nb, py.stem), "seconds": round(seconds, 1)})
        print(f"{py.stem}: executed in {seconds:.1f} s", flush=True)
    (EXECUTED / "timings.json").write_text(json.dumps(
        {"machine": platform.platform(), "cpus": os.cpu_count(),
         "date": time.strftime("%Y-%m-%d"), "chapters": chapters}, indent=2) + "\n")
    return chapters


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
    parser.add_argument("--render-only", action="store_true",
                        help="render the committed notebooks without executing them")
    args = parser.parse_args(argv)
    if args.render_only:
        if args.readme:
            parser.error("--readme needs the run times of an execution, not --render-only")
        stems = [p.stem for p in chapter_sources(args.notebooks)]
        index = render([NOTEBOOKS / f"{s}.ipynb" for s in stems])
    else:
        chapters = build(args.notebooks)
        if args.readme:
            update_readme(chapters)
        index = render([EXECUTED / f"{c['stem']}.ipynb" for c in chapters],
                       seconds={c["stem"]: c["seconds"] for c in chapters})
    print(f"\nThe book is built. Open {index.relative_to(ROOT)} in a browser "
          f"(file://{index}), or run `make lab` to study it interactively.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
