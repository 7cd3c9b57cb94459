"""The web book as a reader uses it (``make book``, then ``make test-browser``).

Every internal link and image of every page resolves (a file, and the anchor where a link
names one). Then, in headless Chromium over a local server, with every request to another
host refused and counted: the front page, a lecture page (its figures drawn, its formulas
typeset by the book's own MathJax), the exercises and the glossary render; search finds
"zig-zag" in the context-parallelism chapter; following "next" from notebook 00 walks the
lecture in order to the last page. A screenshot of one page is kept in build/browser/.
"""
from __future__ import annotations

import functools
import http.server
import re
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "build" / "book"
SHOTS = ROOT / "build" / "browser"
sys.path.insert(0, str(ROOT / "tools"))
import book  # noqa: E402  tools/ is not a package: what `make book` runs


class _Refs(HTMLParser):
    """Every href/src and every id of one page."""

    def __init__(self):
        super().__init__()
        self.refs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key) and tag in ("a", "img", "link", "script"):
                self.refs.append((tag, attrs[key]))


@functools.lru_cache(maxsize=None)
def _parsed(page: Path) -> _Refs:
    parser = _Refs()
    parser.feed(page.read_text(errors="replace"))
    return parser


@pytest.fixture(scope="module")
def built():
    if not (BOOK / "index.html").exists():
        pytest.fail("no book in build/book: run `make book` first (make test-browser does)")
    return BOOK


def _pages_in_order() -> list[str]:
    lecture, appendix = book.lecture_and_appendix(ROOT / "notebooks")
    return ["index.html", *(f"notebooks/{p.stem}.html" for p in lecture + appendix),
            *(f"{page}.html" for page in book.PAGES)]


def test_every_internal_link_and_image_resolves(built):
    broken = []
    pages = [p for p in built.rglob("*.html") if "_static" not in p.parts]   # not theme macros
    for page in pages:
        for tag, ref in _parsed(page).refs:
            url = urlparse(ref)
            if url.scheme in ("http", "https", "mailto", "data", "javascript") or not url.path:
                continue
            target = (page.parent / unquote(url.path)).resolve()
            where = f"{page.relative_to(built)}: <{tag}> {ref}"
            if not target.exists():
                broken.append(where)
            elif url.fragment and target.suffix == ".html" \
                    and url.fragment not in _parsed(target).ids:
                broken.append(f"{where} (no such anchor)")
    assert not broken, "\n".join(broken[:20])
    assert all((built / p).exists() for p in _pages_in_order())


@pytest.fixture(scope="module")
def server(built):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def page(chromium, server):
    from playwright.sync_api import sync_playwright  # noqa: PLC0415  optional
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        tab.elsewhere = []

        def route(r):
            if r.request.url.startswith(server):
                return r.continue_()
            tab.elsewhere.append(r.request.url)
            return r.abort()
        tab.route("**/*", route)
        yield tab
        browser.close()


def test_each_kind_of_page_renders_with_its_figures(page, server):
    page.goto(f"{server}/index.html")
    assert "Parallelism Basics" in page.title()
    assert page.locator("nav").first.is_visible()            # the sidebar
    lecture = book.lecture_and_appendix(ROOT / "notebooks")[0]
    figures = next(p for p in lecture if p.stem.startswith("05"))
    page.goto(f"{server}/notebooks/{figures.stem}.html")
    page.wait_for_selector("mjx-container", timeout=30_000)    # typeset by the book's MathJax
    images = page.locator("img")
    assert images.count() > 0
    drawn = page.evaluate("[...document.images].filter(i => i.naturalWidth > 0).length")
    assert drawn == images.count(), f"{images.count() - drawn} images were not drawn"
    assert page.get_by_text("Run this notebook yourself").count() == 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "book_context_parallel.png"))
    for name, needle in (("exercises", "ex13"), ("glossary", "all-reduce"), ("gpus", "torchrun")):
        page.goto(f"{server}/{name}.html")
        assert needle in page.inner_text("main")
    assert page.elsewhere == [], f"pages asked other hosts for {page.elsewhere[:5]}"


def test_search_finds_a_term_of_a_late_notebook(page, server):
    page.goto(f"{server}/search.html?q=zig-zag")
    page.wait_for_selector("#search-results li", timeout=30_000)
    hits = page.locator("#search-results li a").evaluate_all("l => l.map(a => a.href)")
    assert any(re.search(r"notebooks/05_", h) for h in hits), hits


def test_next_walks_the_course_from_00_to_the_last_page(page, server):
    order = _pages_in_order()
    page.goto(f"{server}/{order[1]}")
    seen = [order[1]]
    while True:
        nxt = page.locator("a.right-next")
        if nxt.count() == 0:
            break
        nxt.first.click()
        page.wait_for_load_state()
        seen.append(page.url.removeprefix(f"{server}/"))
    assert seen == order[1:], seen
