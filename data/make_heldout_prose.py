"""Build data/heldout_prose.txt: English the real model cannot have seen, for perplexity.

The book measures the perplexity of SmolLM2-135M-Instruct (chapter 15) on text written
after the model was trained (its release: November 2024): the book's own prose, taken
from the markdown cells of its chapters as they stood when this file was made. Formulas
($...$ and $$...$$), tables, code and headings are removed, so what remains is ordinary
technical English. Paragraphs are taken chapter by chapter, in order, until the text
reaches ``--bytes`` (default 40,000). The output is MIT-licensed, like the book.

    .venv/bin/python data/make_heldout_prose.py          # writes data/heldout_prose.txt
    .venv/bin/python data/make_heldout_prose.py --check  # rebuilds in memory and compares

``--check`` only holds while the chapters' prose is unchanged; the shipped file is a
snapshot, and the book never rebuilds it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "heldout_prose.txt"


def markdown_cells(source: str) -> list[str]:
    """The markdown cells of a py:percent notebook, with the leading ``# `` removed."""
    cells, current = [], None
    for line in source.splitlines():
        if line.startswith("# %%"):
            if current is not None:
                cells.append("\n".join(current))
            current = [] if "[markdown]" in line else None
        elif current is not None:
            current.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    if current is not None:
        cells.append("\n".join(current))
    return cells


def plain_paragraphs(cell: str) -> list[str]:
    """Paragraphs of plain English: no formulas, tables, code, headings or list markers."""
    cell = re.sub(r"\$\$.*?\$\$", " ", cell, flags=re.S)
    cell = re.sub(r"```.*?```", " ", cell, flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n", cell):
        lines = [ln.strip() for ln in block.splitlines()]
        if not lines or any(ln.startswith(("#", "|", ">")) for ln in lines):
            continue
        text = " ".join(re.sub(r"^(\*|-|\d+\.)\s+", "", ln) for ln in lines)
        if "$" in text or "`" in text:  # inline maths or code: the sentence would be broken
            continue
        text = re.sub(r"\*\*?([^*]+)\*\*?", r"\1", text)  # emphasis
        text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)  # links
        text = re.sub(r"\s+", " ", text).strip()
        if len(text) >= 120 and sum(c.isalpha() for c in text) > 0.75 * len(text):
            out.append(text)
    return out


def build(max_bytes: int) -> str:
    paragraphs: list[str] = []
    size = 0
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        for cell in markdown_cells(path.read_text(encoding="utf-8")):
            for p in plain_paragraphs(cell):
                if size + len(p.encode()) + 2 > max_bytes:
                    return "\n\n".join(paragraphs) + "\n"
                paragraphs.append(p)
                size += len(p.encode()) + 2
    return "\n\n".join(paragraphs) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=40_000)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = build(args.bytes)
    if args.check:
        same = OUT.read_text(encoding="utf-8") == text
        print("same as the shipped file" if same else "differs from the shipped file")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(text.encode()):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
