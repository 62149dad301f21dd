"""Headless Chromium for page tests: Debian's `chromium`, driven by Playwright.

Playwright never downloads a browser here: it launches the system Chromium
through `executable_path`. Under CI=true a missing browser fails the test
(`.ci/run` installs it); elsewhere the test skips, naming what to install.
A failing browser test leaves a screenshot of every page it opened in
`test-artifacts/` (see `pytest_runtest_makereport` in conftest.py).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    explicit = os.environ.get("GPULEASE_CHROMIUM")
    if explicit:
        return explicit
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {what}: .ci/run must install it")
    pytest.skip(f"browser tests need {what} (apt-get install chromium; pip install playwright)")


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """One headless Chromium per test module.

    Not per session: Playwright's sync API keeps its own asyncio loop running
    in the main thread while it is open, and the asyncio tests of the modules
    after it could not run theirs.
    """
    path = chromium_path()
    if not path:
        _missing("Debian's chromium is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is not installed")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=path,
            # As root Chromium needs --no-sandbox; /dev/shm is small in containers.
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_context(chromium, request) -> Iterator[object]:
    """A fresh browser profile (cookies) per test, at a laptop's screen size."""
    context = chromium.new_context(viewport={"width": 1366, "height": 768})
    context.set_default_timeout(20_000)
    request.node._gpulease_browser_contexts = [context]
    try:
        yield context
    finally:
        context.close()


def new_context(chromium, request) -> object:
    """Another profile in the same test (a second person), screenshotted on failure too."""
    context = chromium.new_context(viewport={"width": 1366, "height": 768})
    context.set_default_timeout(20_000)
    request.node.__dict__.setdefault("_gpulease_browser_contexts", []).append(context)
    return context


def save_screenshots(item) -> list[Path]:
    """Screenshot every open page of a failed test's browser contexts."""
    saved = []
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)
    for c, context in enumerate(getattr(item, "_gpulease_browser_contexts", [])):
        for p, page in enumerate(getattr(context, "pages", [])):
            ARTIFACTS.mkdir(exist_ok=True)
            target = ARTIFACTS / f"{safe}-{c}-{p}.png"
            try:
                page.screenshot(path=str(target), full_page=True)
                saved.append(target)
            except Exception:  # a closed page cannot be shot; the others still are
                continue
    return saved
