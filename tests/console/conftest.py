"""Fixtures of the web console tests: a running broker with its console URL and token,
and (for the browser tests) Debian's Chromium driven by Playwright.

Chromium comes from the system (``/usr/bin/chromium``), never from Playwright's own
download: when it is missing and this runs as root where apt-get exists, the session
installs Debian's ``chromium`` package; if there is still none, browser tests skip
saying why."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

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
    path = find_chromium()
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=900)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env,
                       capture_output=True, timeout=1800)
        path = find_chromium()
    if path is None:
        pytest.skip("no Chromium: install Debian's 'chromium' package (apt-get install "
                    "chromium, as root) to run the console's browser tests")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path):
    """A headless Chromium for the session (Playwright, the system browser)."""
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
