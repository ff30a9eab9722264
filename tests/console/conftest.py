"""Fixtures of the web console tests: a running broker with its console URL and token,
and (for the browser tests) Debian's Chromium driven by Playwright.

Chromium comes from the system (``/usr/bin/chromium``), never from Playwright's own
download: when it is missing and this runs as root where apt-get exists, the session
installs Debian's ``chromium`` package; if there is still none, browser tests skip
saying why."""
from __future__ import annotations

import os
import shutil
from html.parser import HTMLParser

import pytest

from helpers.apt import ensure_packages

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def find_chromium() -> str | None:
    for path in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The system Chromium, installed with apt-get first if missing (as root)."""
    ensure_packages(["chromium"], lambda: find_chromium() is not None, update=True)
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium: install Debian's 'chromium' package (apt-get install "
                    "chromium, as root) to run the console's browser tests")
    return path


@pytest.fixture(scope="module")
def browser(chromium_path):
    """A headless Chromium for a module's tests (Playwright, the system browser). Not
    for the session: Playwright's sync API keeps an event loop set as running on the
    main thread while it is open, and later tests' ``asyncio.run`` would refuse."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is in the 'test' extras")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh browser context (no cookies) and page; closed after the test."""
    context = browser.new_context()
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    context.close()


class Console:
    """A running broker and how to reach its console."""

    def __init__(self, broker):
        self.broker = broker
        self.base = f"http://127.0.0.1:{broker.admin_port}"
        self.token = broker.admin_token

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture
def console(make_broker):
    return Console(make_broker())


class _Cells(HTMLParser):
    """The rows of the table with ``id``: the text of each cell, and whether it holds
    an ``<svg>``."""

    def __init__(self, table_id: str):
        super().__init__()
        self.table_id, self.inside, self.depth = table_id, False, 0
        self.rows: list[list[str]] = []
        self.svgs: list[list[bool]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        if not self.inside:
            return
        if tag == "tr":
            self.rows.append([])
            self.svgs.append([])
        elif tag == "td":
            self._cell = []
            self.svgs[-1].append(False)
        elif tag == "svg" and self._cell is not None:
            self.svgs[-1][-1] = True

    def handle_endtag(self, tag):
        if not self.inside:
            return
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def table(body: str, table_id: str) -> tuple[list[str], dict[str, list[str]], dict]:
    """(header, rows by first cell, svg flags by first cell) of table ``table_id``."""
    p = _Cells(table_id)
    p.feed(body)
    header = body.split(f'id="{table_id}"', 1)[1].split("</thead>", 1)[0]
    names = [c.split("</th>", 1)[0] for c in header.split("<th>")[1:]]
    rows = {r[0]: r for r in p.rows if r}
    svgs = {r[0]: s for r, s in zip(p.rows, p.svgs) if r}
    return names, rows, svgs


@pytest.fixture
def html_table():
    """``table(body, id)``: (header, rows by first cell, svg flags by first cell) of the
    HTML table with that id in a page's body."""
    return table


@pytest.fixture
def html_rows():
    """``rows(body, id)``: the cell texts of every body row of the HTML table with that
    id."""
    def rows(body: str, table_id: str) -> list[list[str]]:
        p = _Cells(table_id)
        p.feed(body)
        return [r for r in p.rows if r]
    return rows
