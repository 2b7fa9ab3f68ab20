"""Re-execute chapters and print how their outputs differ from the committed ones.

What strict nbval compares, cell by cell, but with the whole difference shown (nbval
truncates it). Outputs are masked with ``tests/nbval_sanitize.cfg`` first, as nbval
does, and cells tagged ``nbval-ignore-output`` are skipped. Nothing is written back.
Run it under another CPU setting to find the outputs that depend on the machine:

    python tools/diff_outputs.py 03_language_modelling 05_positions
    ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE python tools/diff_outputs.py

Exits 1 if any cell differs.
"""

from __future__ import annotations

import argparse
import configparser
import copy
import difflib
import re
import sys

import nbformat
from nbpairs import ROOT, chapter_sources, execute

SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def sanitizers() -> list[tuple[re.Pattern[str], str]]:
    """The (regex, replacement) pairs of the sanitize file, in order."""
    parser = configparser.ConfigParser()
    parser.read(SANITIZE)
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def output_text(cell: nbformat.NotebookNode, subs: list[tuple[re.Pattern[str], str]]) -> str:
    """The text nbval compares for a code cell: streams, text/plain and errors, sanitized."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            data = out.get("data", {})
            parts.append(data.get("text/plain", "") + data.get("text/latex", "")
                         + data.get("text/markdown", "") if "image/png" not in data else
                         data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    text = "".join(parts)
    for pattern, repl in subs:
        text = pattern.sub(repl, text)
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapters such as 03_language_modelling "
                        "(default: all)")
    subs, differ = sanitizers(), 0
    for py in chapter_sources(parser.parse_args(argv).chapters):
        committed = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
        fresh = copy.deepcopy(committed)
        for cell in fresh.cells:
            if cell.cell_type == "code":
                cell.outputs = []
        try:
            execute(fresh)
        except Exception as exc:  # a failing cell: report it, compare what ran
            print(f"{py.stem}: execution stopped: {type(exc).__name__}")
        code = [i for i, c in enumerate(committed.cells) if c.cell_type == "code"]
        for n, i in enumerate(code):
            if "nbval-ignore-output" in committed.cells[i].get("metadata", {}).get("tags", []):
                continue
            a, b = output_text(committed.cells[i], subs), output_text(fresh.cells[i], subs)
            if a != b:
                differ += 1
                print(f"=== {py.stem}, code cell {n} (notebook cell {i})")
                sys.stdout.writelines(difflib.unified_diff(
                    a.splitlines(True), b.splitlines(True), "committed", "now", n=0))
                print()
    print(f"{differ} cell(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
