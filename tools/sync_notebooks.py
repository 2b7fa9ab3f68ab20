"""Re-execute notebook sources into their committed ``.ipynb`` (``make sync [NB=...]``).

For each ``notebooks/NN_slug.py``: read it, execute it top to bottom in a fresh
kernel, and write ``NN_slug.ipynb`` with the outputs. Prints each run time.
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbpairs import ROOT, chapter_sources, execute, read_source, tidy


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapters such as 01_tokens, or one "
                        "space-separated string of them (default: all)")
    names = [a for arg in parser.parse_args(argv).chapters for a in arg.split()]
    # updating the book: its kernels write the committed figures (a reader's run does not)
    os.environ.setdefault("LLMBOOK_FIGURES", str(ROOT / "figures"))
    for py in chapter_sources(names):
        nb = read_source(py)
        seconds = execute(nb)
        nbformat.write(tidy(nb), py.with_suffix(".ipynb"))
        print(f"{py.stem}: executed in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
