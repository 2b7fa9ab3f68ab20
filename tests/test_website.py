"""The rendered book, as a reader sees it: the site is built from the committed notebooks
and opened from file:// in headless Chromium (tools/website.py, tools/browser.py)."""

import re
import sys
import time
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from browser import check_site, find_chromium  # noqa: E402
from website import PARTS, count_checks, landing_page, render  # noqa: E402

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SCREENSHOT = ROOT / "build" / "site_screenshot.png"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    start = time.perf_counter()
    render(CHAPTERS, out / "book", source=out / "src")
    print(f"site rendered in {time.perf_counter() - start:.1f} s")
    return out / "book"


def test_parts_cover_every_chapter_once():
    numbers = [int(p.name[:2]) for p in CHAPTERS]
    covered = [n for _, first, last in PARTS for n in range(first, last + 1)]
    assert sorted(covered) == sorted(set(covered)), "the parts overlap"
    assert set(numbers) <= set(covered), f"chapters outside every part: {set(numbers) - set(covered)}"


def test_check_counts_are_read_from_the_tables():
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("checks")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="softmax: 3/3 passed\ncheck  expected\n"),
                    nbformat.v4.new_output("execute_result", data={"text/plain": "b: 2/2 passed"})]
    nb.cells = [cell]
    assert count_checks(nb) == (5, 5)


def test_landing_page_lists_parts_times_and_checks():
    chapters = [{"stem": "04_attention", "number": 4, "title": "4 Attention", "seconds": 20.0,
                 "checks": (7, 7)},
                {"stem": "05_positions", "number": 5, "title": "5 Positions", "seconds": None,
                 "checks": (3, 4)}]
    page = landing_page(chapters)
    assert "| Part II · The transformer | [4 Attention](04_attention.ipynb) | 20 s | 7 / 7 |" in page
    assert "|  | [5 Positions](05_positions.ipynb) | – | 3 / 4 |" in page  # the part named once
    assert "| **the book** | **2 chapters** | **20 s** | **10 / 11** |" in page
    assert ":caption: Part II · The transformer" in page and "make book" in page


def test_site_is_offline(site):
    """No page loads a script, style sheet or font from the network (MathJax is copied in)."""
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    remote = re.compile(r"""<(?:script|link|img)[^>]+(?:src|href)=["'](?:https?:)?//""")
    offenders = [p.name for p in site.glob("*.html") if remote.search(p.read_text(encoding="utf-8"))]
    assert not offenders, f"pages that load something from the network: {offenders}"


def test_every_chapter_reads_well_in_a_browser(site):
    chromium = find_chromium()
    if chromium is None:
        message = ("\n" + "!" * 78 + "\nNO CHROMIUM: the browser test of the rendered book is SKIPPED. "
                   "Install Debian's `chromium` package (.ci/run does when it runs as root).\n" + "!" * 78)
        print(message, file=sys.stderr)
        warnings.warn(message, stacklevel=1)
        pytest.skip("no Chromium on PATH")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    report = check_site(site, chromium, screenshot=("04_attention.html", SCREENSHOT))
    pages = report["pages"]
    # every chapter is reachable from the sidebar of the landing page
    missing = {f"{p.stem}.html" for p in CHAPTERS} - set(pages)
    assert not missing, f"chapters not reachable from the sidebar: {sorted(missing)}"
    for name, page in pages.items():
        assert not page["raw_tex"], f"{name}: raw TeX left in the text: {page['raw_tex']}"
        assert not page["broken_images"], f"{name}: images that did not load: {page['broken_images']}"
        assert not page["errors"], f"{name}: console errors: {page['errors']}"
    # formulas are typeset (MathJax's elements are there) in every chapter past the preface
    untypeset = [n for n, p in pages.items() if n[:2].isdigit() and n > "01" and p["formulas"] == 0]
    assert not untypeset, f"chapters with no typeset formula: {untypeset}"
    assert sum(p["images"] for p in pages.values()) >= len(CHAPTERS)
    assert SCREENSHOT.stat().st_size > 10_000
