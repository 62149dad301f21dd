"""Screenshots of gpulease's pages for the README and docs: `make screenshots`.

Starts a throwaway hub (tests/support/hubproc.py's HubProcess: the demo inventory of H200 slices
and a whole H200, the sample profiles) in a temporary folder, with its admin and a
researcher, ada, who has credit, a stopped CPU server that ran (a session on her
usage page) and a running H200 slice. A headless system Chromium (Playwright, never
a downloaded browser) opens each page at 1280x800 and writes docs/images/<page>.png:

    hub-login, hub-home, hub-spawn, hub-token   the hub's pages (ada)
    usage                                       the service's usage page (ada)
    admin-profiles, admin-inventory,
    admin-credits, admin-audit                  the service's admin pages (admin)
    lab                                         JupyterLab in ada's running server,
                                                a notebook showing her GPU slice

`--out DIR` writes them elsewhere (tests never write into the work tree); `--only
NAME[,NAME]` takes just those. Needs what the browser tests need (chromium,
playwright) and configurable-http-proxy (npm install); a minute or two.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.browser import (  # noqa: E402
    chromium_path,
    run_cell_in_new_notebook,
    wait_for_jupyterlab,
)
from tests.support.hubproc import HubProcess  # noqa: E402

OUT = ROOT / "docs" / "images"
VIEWPORT = {"width": 1280, "height": 800}
ADMIN_PW = "admin-secret-pw"
USER = "ada"
PASSWORD = f"{USER}-pw-12345"  # what HubProcess.add_user gives
LAB_CELL = "import os\nos.environ['CUDA_VISIBLE_DEVICES']"

# name: (who looks, what to open), in the order they are taken
PAGES: dict[str, tuple[str, Callable[[HubProcess], str]]] = {
    "hub-login": ("nobody", lambda hub: hub.urls.hub("login")),
    "hub-home": (USER, lambda hub: hub.urls.hub("home")),
    "hub-spawn": (USER, lambda hub: hub.urls.hub(f"spawn/{USER}/experiment")),
    "hub-token": (USER, lambda hub: hub.urls.hub("token")),
    "usage": (USER, lambda hub: hub.urls.service("usage")),
    "lab": (USER, lambda hub: hub.urls.server(USER, "", "lab")),
    "admin-profiles": ("admin", lambda hub: hub.urls.service("admin/profiles")),
    "admin-inventory": ("admin", lambda hub: hub.urls.service("admin/inventory")),
    "admin-credits": ("admin", lambda hub: hub.urls.service("admin/credits")),
    "admin-audit": ("admin", lambda hub: hub.urls.service("admin/audit")),
}


def prepare(hub: HubProcess, need_servers: bool) -> None:
    """ada with credit and a usage history; her slice running."""
    admin = hub.token_for("admin", ADMIN_PW)
    token = hub.add_user(admin, USER, credit=None)
    r = hub.service("POST", "api/credits", admin,
                    {"account": f"user:{USER}", "amount": "50", "note": "starter credit"})
    r.raise_for_status()
    r = hub.service("PUT", "api/me/default-profile", token, {"profile": "h200-1g"})
    r.raise_for_status()
    if not need_servers:
        return
    # a CPU server that ran and stopped: a billed session on her usage page
    hub.start_servers(USER, token, {"prep": {"profile": "cpu"}}, timeout=180)
    r = hub.api("DELETE", f"users/{USER}/servers/prep", token)
    assert r.status_code in (202, 204), r.text
    # her default server on an H200 slice, running (its cost so far on the home page)
    hub.start_servers(USER, token, {"": {"profile": "h200-1g"}}, timeout=180)
    # the token minted above is this script's, not one she made: off her Token page
    for made in hub.api("GET", f"users/{USER}/tokens", admin).json()["api_tokens"]:
        if made["note"] == "e2e":
            hub.api("DELETE", f"users/{USER}/tokens/{made['id']}", admin)


def log_in(page, hub: HubProcess, user: str, password: str) -> None:
    # to the home page, not to ada's running server (JupyterHub's default after a login)
    page.goto(hub.urls.hub("login") + "?next=" + quote(urlsplit(hub.urls.hub("home")).path))
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url("**/hub/home")


def settle(page, name: str) -> None:
    """Wait for what the page draws after it loads."""
    if name == "lab":
        wait_for_jupyterlab(page)
        news = page.locator(".jp-toast-button", has_text="No")  # "get Jupyter news?"
        if news.count():
            news.first.click()
        # a notebook that shows the GPU slice the hub assigned to this server
        run_cell_in_new_notebook(page, LAB_CELL)
        page.wait_for_timeout(1000)
    elif name == "hub-home":
        page.wait_for_function("window._jupyterhub_page_loaded === true")
    page.wait_for_load_state("networkidle")


def shoot(hub: HubProcess, names: list[str], out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    saved = []
    passwords = {USER: PASSWORD, "admin": ADMIN_PW}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(),
                                     args=["--no-sandbox", "--disable-dev-shm-usage",
                                           "--disable-gpu"])
        contexts: dict[str, object] = {}
        for name in names:
            who, where = PAGES[name]
            if who not in contexts:
                context = browser.new_context(viewport=VIEWPORT)
                context.set_default_timeout(120_000)
                page = context.new_page()
                if who != "nobody":
                    log_in(page, hub, who, passwords[who])
                contexts[who] = page
            page = contexts[who]
            page.goto(where(hub))
            settle(page, name)
            saved.append(out / f"{name}.png")
            page.screenshot(path=str(saved[-1]))
        browser.close()
    return saved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the PNGs go")
    parser.add_argument("--only", default="", help="comma-separated page names")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(PAGES)
    unknown = sorted(set(names) - set(PAGES))
    if unknown:
        parser.error(f"no page {unknown}; the pages: {', '.join(PAGES)}")
    if not chromium_path():
        sys.exit("needs a system Chromium (apt-get install chromium) and playwright")
    with tempfile.TemporaryDirectory() as tmp:
        hub = HubProcess(state=Path(tmp) / "state", admin_password=ADMIN_PW).start()
        try:
            prepare(hub, need_servers=bool({"hub-home", "usage", "lab"} & set(names)))
            for path in shoot(hub, names, args.out):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                print(f"{shown}: {path.stat().st_size // 1024} KiB")
        finally:
            hub.close()


if __name__ == "__main__":
    main()
