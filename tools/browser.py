"""Open the rendered book in headless Chromium and check what a reader would see.

:func:`check_site` visits the landing page and every chapter reachable from its sidebar,
from ``file://``, through the Chrome DevTools Protocol (a WebSocket on the loopback
address), and reports per page: whether MathJax finished and how many formulas it set,
any raw TeX left in the visible text (``$$``, ``\\frac``, ``\\(``), images that did not
load, every console error, uncaught exception and failed resource load, what sticks out
of the text column or scrolls sideways in it at a laptop's width and at a phone's, and
the search boxes a reader sees. :meth:`Chromium.search` reads the results of a search.
It can save a screenshot of one page. ``python tools/browser.py [SITE] [--screenshot PNG]``
prints the report.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import websocket

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")

# Run in the page once it has loaded and MathJax (if any) has typeset it.
PAGE_REPORT_JS = r"""
(() => {
  const clone = document.querySelector('main, article, body').cloneNode(true);
  for (const el of clone.querySelectorAll(
      'pre, code, script, style, mjx-container, .highlight, .output, .cell_output, textarea'))
    el.remove();
  const text = clone.innerText || clone.textContent || '';
  const raw = ['$$', '\\frac', '\\(', '\\[', '\\begin{'].filter(s => text.includes(s));
  const images = [...document.images];
  const broken = images.filter(im => !(im.complete && im.naturalWidth > 0)).map(im => im.src);
  const sidebar = [...document.querySelectorAll('.bd-sidebar-primary a.reference.internal')]
      .map(a => a.href.split('#')[0]);
  return JSON.stringify({
    title: document.title,
    formulas: document.querySelectorAll('mjx-container').length,
    raw_tex: raw,
    images: images.length,
    broken_images: broken,
    sidebar: [...new Set(sidebar)],
  });
})()
"""


# Measure what sticks out of the text column or scrolls sideways inside it. ``phone`` limits
# the elements measured to text and figures (code and tables may scroll on a phone).
OVERFLOW_JS = r"""
((phone, width) => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  if (!article) return JSON.stringify([]);
  const box = article.getBoundingClientRect(), style = getComputedStyle(article);
  const left = box.left + parseFloat(style.paddingLeft) - 1;
  const right = box.right - parseFloat(style.paddingRight) + 1;
  const text = 'p, li, dt, dd, h1, h2, h3, h4, h5, blockquote, .admonition, figure, img, caption';
  const all = text + ', pre, table, div.cell_output, div.output, div.highlight, mjx-container, '
      + 'div.math-wrapper, div.cell, div.pst-scrollable-table-container, div.table-wrapper';
  const clipped = (el) => {  // an ancestor below the article scrolls or clips it
    for (let a = el.parentElement; a && a !== article; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== 'visible') return true;
    return false;
  };
  const name = (el) => {
    const cls = [...el.classList].slice(0, 2).join('.');
    const words = (el.innerText || el.getAttribute('src') || '').trim().replace(/\s+/g, ' ');
    return `${el.tagName.toLowerCase()}${cls ? '.' + cls : ''} "${words.slice(0, 60)}"`;
  };
  const out = [];
  for (const el of article.querySelectorAll(phone ? text : all)) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || el.closest('details:not([open])')) continue;
    const overflow = getComputedStyle(el).overflowX;
    const scroll = el.scrollWidth - el.clientWidth;
    if (overflow !== 'visible' && scroll > 1) {
      out.push({element: name(el), overflow: 'scrolls', px: scroll});
    } else if ((r.right > right || r.left < left) && !clipped(el)) {
      out.push({element: name(el), overflow: 'sticks out',
                px: Math.round(Math.max(r.right - right, left - r.left))});
    }
  }
  const page = document.documentElement.scrollWidth - Math.min(window.innerWidth, width);
  if (page > 1) out.push({element: 'the page', overflow: 'scrolls', px: page});
  return JSON.stringify(out);
})
"""

# Visible places to type a search (a field or the button that opens the search dialog).
SEARCH_BOXES_JS = r"""
[...document.querySelectorAll('.search-button, .search-button-field, input[type=search], '
    + 'form.bd-search input, #searchbox input')]
  .filter(el => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
                  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden'; })
  .map(el => el.className || el.tagName).join('\n')
"""

# The results on the search page once Sphinx's search has finished: [title, snippet] each.
SEARCH_RESULTS_JS = r"""
new Promise((resolve) => {
  const started = Date.now();
  const poll = () => {
    const items = [...document.querySelectorAll('#search-results ul.search li')];
    const status = document.querySelector('#search-results .search-summary, #search-results p');
    const done = status && /finished|did not match/i.test(status.innerText);
    const snippets = items.filter(li => li.querySelector('p.context')).length;
    if ((done && snippets === items.length) || Date.now() - started > 20000)
      resolve(JSON.stringify(items.map(li => [li.querySelector('a').innerText,
          (li.querySelector('p.context') || {innerText: ''}).innerText])));
    else setTimeout(poll, 100);
  };
  poll();
})
"""

#: The widths (CSS pixels) the overflow is measured at: a laptop and a phone.
LAPTOP, PHONE = 1280, 390


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) executable on PATH, or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """A headless Chromium driven over the DevTools Protocol (one page)."""

    def __init__(self, executable: str, width: int = 1280, height: int = 1000,
                 timeout: float = 60.0) -> None:
        self.profile = tempfile.mkdtemp(prefix="llmbook-chromium-")
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--allow-file-access-from-files", f"--window-size={width},{height}",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{executable} did not start its DevTools endpoint")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout,
                                              suppress_origin=True)
        self._id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for i, e in enumerate(self.events):
                if e.get("method") == event:
                    return self.events.pop(i)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(f"no {event} within {self.timeout} s")

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=await_promise)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event and for MathJax to finish typesetting."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        self.evaluate("window.MathJax && MathJax.startup && MathJax.startup.promise "
                      "? MathJax.startup.promise.then(() => true) : false", await_promise=True)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads since the last :meth:`open`."""
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                  for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                entry = p["entry"]
                out.append(f"log: {entry.get('text', '')} {entry.get('url', '')}".strip())
        return out

    def set_width(self, width: int, mobile: bool = False) -> None:
        """Lay the page out as a window ``width`` CSS pixels wide (a phone's if ``mobile``)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=900 if mobile else 1000,
                  deviceScaleFactor=2 if mobile else 1, mobile=mobile)

    def overflow(self, width: int, phone: bool = False) -> list[dict[str, Any]]:
        """What overflows the text column of the page now open, laid out ``width`` pixels
        wide (see ``OVERFLOW_JS``)."""
        return json.loads(self.evaluate(f"{OVERFLOW_JS}({'true' if phone else 'false'}, {width})"))

    def search_boxes(self) -> list[str]:
        """The visible search fields and buttons of the page now open."""
        return [b for b in self.evaluate(SEARCH_BOXES_JS).split("\n") if b]

    def search(self, search_page: str, query: str) -> list[list[str]]:
        """Open ``search_page`` (a URL) for ``query``; return its results as [title, snippet]."""
        self.open(f"{search_page}?q={urllib.parse.quote(query)}")
        return json.loads(self.evaluate(SEARCH_RESULTS_JS, await_promise=True))

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            if hasattr(self, "ws"):
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_site(site: Path, executable: str | None = None, screenshot: tuple[str, Path] | None = None,
               ) -> dict[str, Any]:
    """Visit ``site/index.html`` and every page its sidebar links to; return a report.

    ``screenshot`` = (page file name, png path) saves a screenshot of that page. The report
    maps ``"pages"`` to {file name: page report} and ``"sidebar"`` to the landing page's links.
    Each page report also lists what overflows the text column at a laptop's width
    (``overflow_laptop``: any element) and at a phone's (``overflow_phone``: text and
    figures), and the visible search boxes at each width (``search_boxes_laptop``,
    ``search_boxes_phone``).
    """
    executable = executable or find_chromium()
    if executable is None:
        raise FileNotFoundError("no Chromium found on PATH (looked for " + ", ".join(CANDIDATES) + ")")
    site = Path(site).resolve()
    index = site / "index.html"
    if not index.is_file():
        raise FileNotFoundError(f"{index} does not exist: render the site first")
    report: dict[str, Any] = {"pages": {}}
    with Chromium(executable, width=LAPTOP) as browser:
        def visit(url: str) -> dict[str, Any]:
            browser.open(url)
            page = json.loads(browser.evaluate(PAGE_REPORT_JS))
            page["errors"] = browser.errors()
            page["overflow_laptop"] = browser.overflow(LAPTOP)
            page["search_boxes_laptop"] = browser.search_boxes()
            return page

        browser.set_width(LAPTOP)
        home = visit(index.as_uri())
        report["pages"]["index.html"] = home
        report["sidebar"] = [u for u in home["sidebar"] if u.startswith("file://")]
        urls = {"index.html": index.as_uri()}
        for url in report["sidebar"]:
            name = url.rsplit("/", 1)[-1]
            if name not in report["pages"]:
                urls[name] = url
                report["pages"][name] = visit(url)
                if screenshot and name == screenshot[0]:
                    browser.screenshot(screenshot[1])
        browser.set_width(PHONE, mobile=True)
        for name, url in urls.items():
            browser.open(url)
            report["pages"][name]["overflow_phone"] = browser.overflow(PHONE, phone=True)
            report["pages"][name]["search_boxes_phone"] = browser.search_boxes()
    return report


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Check the rendered book in headless Chromium.")
    parser.add_argument("site", nargs="?", type=Path, default=ROOT / "build" / "book")
    parser.add_argument("--screenshot", type=Path, default=ROOT / "build" / "site_screenshot.png",
                        help="where to save the screenshot of chapter 4")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = check_site(args.site, screenshot=("04_attention.html", args.screenshot))
    for name, page in report["pages"].items():
        print(f"{name:34s} formulas {page['formulas']:5d}  images {page['images']:3d}  "
              f"raw TeX {page['raw_tex'] or '-'}  broken {len(page['broken_images'])}  "
              f"overflow {len(page['overflow_laptop'])} at {LAPTOP} px, "
              f"{len(page['overflow_phone'])} at {PHONE} px  errors {page['errors'] or '-'}")
    print(f"{len(report['pages'])} pages checked in {time.perf_counter() - start:.1f} s; "
          f"screenshot {args.screenshot}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main(sys.argv[1:]))
