"""Headless Chromium for page tests: Debian's `chromium`, driven by Playwright.

Playwright never downloads a browser here: it launches the system Chromium
through `executable_path`. Under CI=true a missing browser fails the test
(`.ci/run` installs it); elsewhere the test skips, naming what to install.
A failing browser test leaves a screenshot of every page it opened in
`test-artifacts/` (see `pytest_runtest_makereport` in conftest.py).

Every context records the 4xx and 5xx answers its pages receive
(`context.http_errors`); a test that walks a researcher's path calls
`check()` on it, and any answer outside ALLOWED_ERRORS (each with its reason)
fails it. `open_jupyterlab_cell` is what a person does in JupyterLab: wait
for its shell, open a notebook from the launcher, type a cell, Shift+Enter,
and read the output in the page.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
# As root Chromium needs --no-sandbox; /dev/shm is small in containers.
CHROMIUM_ARGS = ("--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu")


@dataclass(frozen=True)
class AllowedError:
    """A 4xx/5xx answer a page may receive on a path that works, and why."""

    status: int
    path: str  # a regular expression matched against the URL's path
    reason: str
    # only for the tests that name it in check(): an answer that is right on their
    # path (a server they stop) and a failure on any other
    only_when: str = ""

    def allows(self, status: int, path: str) -> bool:
        return status == self.status and re.search(self.path, path) is not None


# The one allow-list of the browser tests: answers that are not failures.
ALLOWED_ERRORS: tuple[AllowedError, ...] = (
    AllowedError(424, r"^/hub/user/[^/]+/([^/]+/)?(lab/)?api/",
                 "JupyterHub's answer to an open JupyterLab tab's API calls once its server "
                 "has stopped (a suspend): 'server not running'; JupyterLab then offers to "
                 "restart it", only_when="server stopped"),
)


class HttpErrors:
    """The 4xx and 5xx answers one browser context received, less ALLOWED_ERRORS."""

    def __init__(self, context) -> None:
        self.answers: list[tuple[int, str, str]] = []  # status, method, URL
        context.on("response", self._record)

    def _record(self, response) -> None:
        if response.status >= 400:
            self.answers.append((response.status, response.request.method,
                                 response.url.split("?")[0]))

    def unexpected(self, *expected: str) -> list[str]:
        """The error answers no entry allows; entries with `only_when` count only if named."""
        allowed = [a for a in ALLOWED_ERRORS if not a.only_when or a.only_when in expected]
        return [f"{status} {method} {url}" for status, method, url in self.answers
                if not any(a.allows(status, re.sub(r"^[a-z]+://[^/]+", "", url))
                           for a in allowed)]

    def check(self, *expected: str) -> None:
        """Fail with every unexpected error answer so far. `expected` names the
        `only_when` entries this test's path allows (e.g. "server stopped")."""
        unexpected = self.unexpected(*expected)
        assert not unexpected, (
            "error answers on the way (tests/support/browser.py ALLOWED_ERRORS lists the allowed "
            f"ones): {unexpected}")


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
        browser = pw.chromium.launch(executable_path=path, args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_context(chromium, request) -> Iterator[object]:
    """A fresh browser profile (cookies) per test, at a laptop's screen size."""
    context = _context(chromium)
    request.node._gpulease_browser_contexts = [context]
    try:
        yield context
    finally:
        context.close()


def _context(chromium, **options) -> object:
    context = chromium.new_context(viewport={"width": 1366, "height": 768}, **options)
    context.set_default_timeout(20_000)
    context.http_errors = HttpErrors(context)
    _pages_that_reload_on_a_network_change(context)
    return context


def _pages_that_reload_on_a_network_change(context) -> None:
    """Its pages load again, as a person would, when Chromium aborts a navigation with
    ERR_NETWORK_CHANGED: it does when the machine's addresses change, and on the test
    machine other hubs make and remove their sandboxes' bridges all the time (a
    researcher's browser is not on the GPU box). Any other error, and any 4xx or 5xx
    (HttpErrors), still fails the test."""
    from playwright.sync_api import Error

    new_page = context.new_page

    def make_page():
        page = new_page()
        goto = page.goto

        def goto_again_on_a_network_change(url: str, **kwargs):
            for attempt in range(3):
                try:
                    return goto(url, **kwargs)
                except Error as e:
                    if "ERR_NETWORK_CHANGED" not in str(e) or attempt == 2:
                        raise
            raise AssertionError("unreachable")

        page.goto = goto_again_on_a_network_change
        return page

    context.new_page = make_page


def new_context(chromium, request, **options) -> object:
    """Another profile in the same test (a second person), screenshotted on failure too.
    `options`: Playwright's new_context options (e.g. ignore_https_errors=True)."""
    context = _context(chromium, **options)
    request.node.__dict__.setdefault("_gpulease_browser_contexts", []).append(context)
    return context


def launch_another(chromium, *switches: str) -> object:
    """A second Chromium, from the module's Playwright, with more command-line switches
    (e.g. `--host-resolver-rules=MAP *.gpu.test 127.0.0.1`, which only a launch takes):
    a second sync_playwright cannot run beside the one the `chromium` fixture holds.
    The caller closes it."""
    return chromium.browser_type.launch(executable_path=chromium_path(),
                                        args=[*CHROMIUM_ARGS, *switches])


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


# --- JupyterLab, as a person uses it ---------------------------------------------------------------

LAB_TIMEOUT_MS = 120_000  # a cold JupyterLab on two busy cores


def sign_in(page, hub_url: str, name: str, password: str) -> None:
    """Sign in at the hub's login form and wait for what a person then sees: their home
    page's servers or the spawn form (never a URL: an error page has one too)."""
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.locator("tr.gpulease-server, form#spawn_form").first.wait_for()


def wait_for_jupyterlab(page) -> None:
    """JupyterLab's own shell on screen: its main area and its file browser."""
    page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=LAB_TIMEOUT_MS)
    page.locator(".jp-DirListing").first.wait_for(state="visible", timeout=LAB_TIMEOUT_MS)


def _accept_kernel_choice(page) -> bool:
    """Press Select on JupyterLab's "Select Kernel" dialog, if it shows; whether it did.

    JupyterLab restores the notebooks of the last session; one that was never saved
    with a kernel (a server stopped before the autosave) asks which kernel to start,
    and a person takes the default."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if not dialog.is_visible():
        return False
    try:
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click(timeout=10_000)  # "Select"
    except PlaywrightTimeoutError:
        # the page's locator handler (run_cell_in_new_notebook) pressed it first, as this
        # click began: the dialog is gone, and the click waited for a button that was too
        if dialog.is_visible():
            raise
    return True


def run_cell_in_new_notebook(page, code: str) -> str:
    """Open a notebook from a new launcher, type `code` in its cell, Shift+Enter; its output."""
    if not getattr(page, "_gpulease_kernel_choice", False):  # once a page
        page.add_locator_handler(page.locator(".jp-Dialog", has_text="Select Kernel"),
                                 lambda _dialog: _accept_kernel_choice(page))
        page._gpulease_kernel_choice = True
    wait_for_jupyterlab(page)
    # a fresh launcher from the "+" of the main area's tabs: the one a restored
    # workspace opened may be hidden behind the notebooks it restored
    page.locator("#jp-main-dock-panel .lm-TabBar-addButton").first.click()
    card = page.locator('.jp-Launcher:visible .jp-LauncherCard[data-category="Notebook"]')
    card.first.click(timeout=LAB_TIMEOUT_MS)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").last
    editor = notebook.locator(".jp-Cell .cm-content").first
    editor.wait_for(state="visible", timeout=LAB_TIMEOUT_MS)
    # as a person waits for the status bar's "Python 3 (ipykernel) | Idle": the
    # notebook's kernel connected (a cell run before that is not sent)
    idle = page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$"))
    deadline = time.monotonic() + LAB_TIMEOUT_MS / 1000
    while _accept_kernel_choice(page) or not idle.is_visible():
        assert time.monotonic() < deadline, "the notebook's kernel never became idle"
        page.wait_for_timeout(200)
    editor.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    output = notebook.locator(".jp-OutputArea-output").first
    output.wait_for(state="visible", timeout=LAB_TIMEOUT_MS)
    return output.inner_text().strip()


DEVICES_CELL = "import os; print('devices=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'))"


def devices_seen_in_lab(page) -> list[str]:
    """The CUDA_VISIBLE_DEVICES a notebook of this server prints, read in the page."""
    text = run_cell_in_new_notebook(page, DEVICES_CELL)
    match = re.fullmatch(r"devices=(\S*)", text)
    assert match, f"the cell printed {text!r}"
    value = match.group(1)
    return [] if value in ("", "-") else value.split(",")
