"""Take the hub-side screenshots of docs/vscode.md: `python scripts/vscode-screenshots.py`.

Starts a throwaway hub (tests/support/hubproc.py's HubProcess, demo inventory) in a
temporary folder, makes a user `vera` with a named server `vscode` that
remembers the H200 slice profile, logs in with a headless system Chromium
(Playwright, never a downloaded browser) and saves 1280x720 PNGs into
docs/images/. Needs what the browser tests need (chromium, playwright) and
configurable-http-proxy (npm install).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.browser import chromium_path  # noqa: E402
from tests.support.hubproc import HubProcess  # noqa: E402

OUT = ROOT / "docs" / "images"
ADMIN_PW = "admin-secret-pw"
USER, PASSWORD = "vera", "vera-pw-12345"
VSCODE_SCOPES = "read:users:name!user read:servers!user servers!user access:servers!user"


def prepare(hub: HubProcess) -> None:
    admin = hub.token_for("admin", ADMIN_PW)
    r = hub.service("POST", "api/users", admin, {"name": USER, "password": PASSWORD})
    r.raise_for_status()
    hub.grant(admin, f"user:{USER}")
    token = hub.token_for(USER, PASSWORD)
    r = hub.service("POST", "api/servers", token,
                    {"name": "vscode", "user_options": {"profile": "h200-1g"}})
    r.raise_for_status()
    r = hub.service("PUT", "api/me/default-profile", token, {"profile": "cpu"})
    r.raise_for_status()


def shoot(hub: HubProcess) -> list[Path]:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    saved = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(),
                                     args=["--no-sandbox", "--disable-dev-shm-usage",
                                           "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", USER)
        page.fill("#password_input", PASSWORD)
        page.click("#login_submit")
        page.wait_for_url("**/hub/**")

        page.goto(f"{hub.url}/hub/home")
        page.fill(".gpulease-new-name", "train")
        page.select_option(".gpulease-new-profile", "h200-1g")
        saved.append(OUT / "vscode-home.png")
        page.screenshot(path=str(saved[-1]))

        page.goto(f"{hub.url}/hub/token")
        page.fill("#token-note", "VS Code")
        page.fill("#token-scopes", VSCODE_SCOPES)
        page.click("#request-token-form button[type=submit]")
        page.wait_for_selector("#token-area", state="visible")
        page.wait_for_function("document.querySelector('#token-result').textContent.length > 0")
        # the token shown is of this throwaway hub only; blur it anyway
        page.eval_on_selector("#token-result", "e => e.style.filter = 'blur(4px)'")
        saved.append(OUT / "vscode-token-made.png")
        page.screenshot(path=str(saved[-1]))
        browser.close()
    return saved


def main() -> None:
    if not chromium_path():
        sys.exit("needs a system Chromium (apt-get install chromium) and playwright")
    with tempfile.TemporaryDirectory() as tmp:
        hub = HubProcess(state=Path(tmp) / "state", admin_password=ADMIN_PW).start()
        try:
            prepare(hub)
            for path in shoot(hub):
                print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB")
        finally:
            hub.close()


if __name__ == "__main__":
    main()
