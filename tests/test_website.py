"""The rendered book, as a reader sees it: the site is built from the committed notebooks
and opened from file:// in headless Chromium (tools/website.py, tools/browser.py).

Nothing in a page may stick out of the text column or scroll sideways in it at a laptop's
width (1280 px), and no text or figure at a phone's (390 px); the failure lists every
offender. Search has one box and a snippet under every result, from file:// and over
HTTP; every chapter links its notebook, its solutions and the repository; the
bibliography lists every entry of references.bib, each cited somewhere.
"""

import functools
import http.server
import re
import sys
import threading
import time
import warnings
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from browser import LAPTOP, PHONE, Chromium, check_site, find_chromium  # noqa: E402
from site_text import (  # noqa: E402
    LONG_TEX,
    break_formula,
    chapter_label,
    checks_to_html,
    cite_papers,
    restore_name,
)
from website import PARTS, REPOSITORY, count_checks, landing_page, render  # noqa: E402

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
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


def chromium_or_skip() -> str:
    chromium = find_chromium()
    if chromium is None:
        message = ("\n" + "!" * 78 + "\nNO CHROMIUM: the browser test of the rendered book is SKIPPED. "
                   "Install Debian's `chromium` package (.ci/run does when it runs as root).\n" + "!" * 78)
        print(message, file=sys.stderr)
        warnings.warn(message, stacklevel=1)
        pytest.skip("no Chromium on PATH")
    return chromium


def test_every_chapter_reads_well_in_a_browser(site):
    chromium = chromium_or_skip()
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
    # nothing overflows the text column: any element at a laptop's width, text and figures
    # at a phone's (code and tables may scroll there)
    for width, key in ((LAPTOP, "overflow_laptop"), (PHONE, "overflow_phone")):
        offenders = [f"{name}: {o['element']} {o['overflow']} by {o['px']} px"
                     for name, page in pages.items() for o in page[key]]
        print(f"horizontal overflow at {width} px: {len(offenders)} elements")
        assert not offenders, (f"{len(offenders)} elements overflow the text column at {width} px:\n"
                               + "\n".join(offenders[:60]))
    # one search box, at either width
    for key in ("search_boxes_laptop", "search_boxes_phone"):
        boxes = {name: page[key] for name, page in pages.items() if len(page[key]) != 1}
        assert not boxes, f"pages without exactly one visible search box ({key}): {boxes}"


@pytest.fixture
def http_site(site):
    """The site served over HTTP on a free port of the loopback address."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_search_results_have_snippets(site, http_site):
    """From file:// and over HTTP, every result of a search has a snippet of the page's text."""
    chromium = chromium_or_skip()
    with Chromium(chromium) as browser:
        for base in (site.as_uri(), http_site):
            for query in ("rotary", "Chinchilla", "all-reduce"):
                results = browser.search(f"{base}/search.html", query)
                assert results, f"{base}: no results for {query!r}"
                bare = [title for title, snippet in results
                        if len(snippet.strip(". ")) < 40 or ".ipynb" in snippet[:12]]
                assert not bare, f"{base}: results for {query!r} without a snippet: {bare}"
            assert not [e for e in browser.errors() if "favicon" not in e]


def test_every_chapter_links_its_notebook_solutions_and_repository(site):
    for path in CHAPTERS:
        page = (site / f"{path.stem}.html").read_text(encoding="utf-8")
        notebook = f'href="notebooks/{path.stem}.ipynb"'
        assert notebook in page and (site / "notebooks" / path.name).is_file(), path.stem
        copy = (site / "notebooks" / path.name).read_text(encoding="utf-8")  # the committed one,
        assert "llmbook-chapter-links" not in copy and "{cite:" not in copy  # not the web's copy
        solution = ROOT / "notebooks" / "solutions" / f"{path.stem}.py"
        if solution.is_file():
            assert f'href="solutions/{path.stem}.html"' in page, f"{path.stem}: no solutions link"
            assert (site / "solutions" / f"{path.stem}.html").is_file()
            assert f"{REPOSITORY}/blob/main/notebooks/solutions/{path.stem}.py" in page
        assert f'href="{REPOSITORY}"' in page, f"{path.stem}: no link to the repository"
        words = " ".join(re.sub(r"<[^>]+>", "", page).split())
        assert "make lab" in words and "pip install llmbook" in words, f"{path.stem}: no how-to-run note"


def bib_entries() -> dict[str, str]:
    """references.bib's keys and titles."""
    text = (ROOT / "references.bib").read_text(encoding="utf-8")
    keys = re.findall(r"^@\w+\{([^,]+),", text, flags=re.M)
    titles = re.findall(r"^\s*title = \{(.*)\},$", text, flags=re.M)
    assert len(keys) == len(titles) == len(set(keys)), "one title per entry, keys unique"
    return dict(zip(keys, titles, strict=True))


def test_bibliography_lists_every_entry_and_each_is_cited(site):
    from bs4 import BeautifulSoup

    entries = bib_entries()
    soup = BeautifulSoup((site / "bibliography.html").read_text(encoding="utf-8"), "html.parser")
    listed = {div["id"]: " ".join(div.get_text(" ").split()).lower()
              for div in soup.select('div.citation[role="doc-biblioentry"]')}
    assert len(listed) == len(entries), f"{len(listed)} entries listed, {len(entries)} in references.bib"
    text = " ".join(listed.values())
    for key, title in entries.items():
        plain = re.sub(r"[{}]|\\(?=&)", "", title).replace("---", "—").lower()
        assert " ".join(plain.split())[:40] in text, f"{key} is not listed: {title}"
    cited = set()
    for path in site.glob("[0-9][0-9]*_*.html"):
        cited |= set(re.findall(r'href="bibliography\.html#(id\d+)"', path.read_text(encoding="utf-8")))
    uncited = set(listed) - cited
    assert not uncited, f"entries no chapter cites: {[listed[i][:60] for i in sorted(uncited)]}"
    # and the names the chapters give resolve to those entries, none left over
    used: set[str] = set()
    for path in CHAPTERS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                cite_papers(cell.source, chapter_label(path.stem), used)
    assert used == set(entries), f"cited but not in references.bib: {used - set(entries)}; " \
                                 f"never cited: {set(entries) - used}"


def test_back_matter_pages(site):
    for name in ("bibliography", "glossary", "changelog"):
        assert (site / f"{name}.html").is_file(), name
        assert f'href="{name}.html"' in (site / "index.html").read_text(encoding="utf-8")
    assert "0.1.0" in (site / "changelog.html").read_text(encoding="utf-8")
    assert 'id="equation-window-floor"' in (site / "10_training.html").read_text(encoding="utf-8")


def test_citation_cff_is_valid_yaml():
    yaml = pytest.importorskip("yaml")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    for field in ("cff-version", "message", "title", "authors", "version"):
        assert cff.get(field), f"CITATION.cff lacks {field}"
    assert cff["repository-code"] == REPOSITORY


def test_check_table_becomes_an_html_table():
    text = ("before\nsoftmax: 2/2 passed\ncheck         expected  got  pass  error\n"
            "------------  --------  ---  ----  ------\nrows sum to …  1         1    yes   <1e-15\n"
            "b             2         2    yes   -\nafter")
    source = 'checks.close("rows sum to one over the vocabulary", a, b)'
    html = checks_to_html(text, source)
    assert html.count("<tr>") == 3 and 'class="llmbook-checks"' in html
    assert "rows sum to one over the vocabulary" in html  # the cut name restored
    assert html.index("before") < html.index("<table") < html.index("after")
    assert checks_to_html("no table here", "") is None
    assert restore_name("ab…", ["abc", "abd"]) == "ab…"  # two candidates: left as it was


def test_long_formula_is_set_one_term_per_line():
    tex = "$\\displaystyle y = " + " + ".join(["\\frac{\\partial}{\\partial x} f{\\left(x \\right)}"] * 12) + "$"
    assert len(tex) > LONG_TEX
    broken = break_formula(tex)
    assert broken.count("\\\\") == 11 and "\\begin{aligned}" in broken and "y = {} &" in broken
    assert break_formula("$x = a + b$") == "$x = a + b$"


def test_chapter_label():
    assert chapter_label("07_decoder") == "07" and chapter_label("10d_data_mixtures") == "10d"
    for bad in ("decoder", "7_decoder", "10dd_x"):
        with pytest.raises(ValueError, match="not a chapter name"):
            chapter_label(bad)


def test_papers_become_citations():
    used: set[str] = set()
    text = ("Vaswani et al. (2017) and (Kaplan et al., 2020, \"Scaling\"); Llama (Touvron et al., 2023); "
            "$a (2017)$ and `Vaswani et al., 2017` stay; Nobody et al. (2001) has no entry.")
    out = cite_papers(text, "07", used)
    assert "Vaswani et al. ({cite:year}`vaswani2017`)" in out
    assert "Kaplan et al., {cite:year}`kaplan2020`" in out
    assert "{cite:year}`touvron2023llama`" in out  # chapter 7 means LLaMA, not Llama 2
    assert "`Vaswani et al., 2017`" in out and "Nobody et al. (2001)" in out
    assert used == {"vaswani2017", "kaplan2020", "touvron2023llama"}
    # a letter after the year tells two papers of one year apart, in any chapter
    out = cite_papers("LLaMA (Touvron et al., 2023a) and Llama 2 (Touvron et al., 2023b)", "11", used)
    assert "{cite:year}`touvron2023llama`" in out and "{cite:year}`touvron2023llama2`" in out
    # a surname with a lower-case particle is one name; "caravan" holds no particle
    used = set()
    out = cite_papers("as von Oswald et al. (2023) show; a caravan Smith 2020 is not a paper", "24", used)
    assert "von Oswald et al. ({cite:year}`vonoswald2023`)" in out and used == {"vonoswald2023"}
    assert "caravan Smith 2020" in out
