"""Issue 5's whole scenario in a real headless Chromium, on a real hub.

An admin creates a profile in the editor (its display name is an XSS probe);
a researcher sees it on the spawn page with its price and availability,
starts it, lands in JupyterLab, where a notebook's cell prints the slice the hub assigned,
sees the running cost on the home page, stops it and resumes on another
profile (CPU only: the cell prints no device); the admin sees the server in the inventory, the session in
the usage report and the creation in the audit log. No script from the probe
ever runs (a dialog would be recorded), and its text shows as text.
"""

from __future__ import annotations

import re

import pytest

from tests.support.browser import devices_seen_in_lab
from tests.support.hubproc import HubProcess

ADMIN_PW = "admin-secret-pw"
ADA_PW = "ada-pw-123456"
PROBE = "<script>alert(1)</script>"
SLUG = "lab-slice"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = HubProcess(state=tmp_path_factory.mktemp("scenario") / "state",
                   admin_password=ADMIN_PW).start()
    admin = h.token_for("admin", ADMIN_PW)
    r = h.service("POST", "api/users", admin, {"name": "ada", "password": ADA_PW})
    assert r.status_code == 201, r.text
    h.grant(admin, "user:ada", "20")
    yield h
    h.close()


def log_in(page, hub, user: str, password: str) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))


def watch_dialogs(page, dialogs: list[str]) -> None:
    def record(dialog) -> None:
        if dialog.type == "beforeunload":  # JupyterLab's "leave the page?": a person leaves
            dialog.accept()
            return
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", record)


def home_row(page, hub, server: str = ""):
    page.goto(f"{hub.url}/hub/home")
    return page.locator(f'tr.gpulease-server[data-server-name="{server}"]')


def test_admin_and_researcher_in_chromium(hub, chromium, browser_context, request):
    from tests.support.browser import new_context

    dialogs: list[str] = []
    admin = browser_context.new_page()
    watch_dialogs(admin, dialogs)
    log_in(admin, hub, "admin", ADMIN_PW)

    # 1. the admin creates a profile in the editor
    admin.goto(f"{hub.urls.service()}admin/profiles")
    admin.get_by_role("link", name="New profile").click()
    admin.get_by_label("slug").fill(SLUG)
    admin.get_by_label("display name").fill(f"{PROBE} Lab slice")
    admin.get_by_label("model").select_option("H200")
    admin.get_by_label("MIG").fill("1g.18gb")
    admin.get_by_label("CPU cores").fill("1")
    admin.get_by_label("memory").fill("2Gi")
    admin.get_by_label("price per hour (credits)").fill("0.36")
    admin.get_by_label("images (Ctrl").select_option(["pytorch"])
    admin.get_by_role("button", name="Create profile").click()
    admin.wait_for_url(re.compile(rf".*admin/profiles\?slug={SLUG}.*"))
    row = admin.locator(f'tr[data-slug="{SLUG}"]')
    assert PROBE in row.inner_text()  # shown as text

    # 2. the researcher sees it on the spawn page, with price and availability
    ada = new_context(chromium, request).new_page()
    watch_dialogs(ada, dialogs)
    log_in(ada, hub, "ada", ADA_PW)
    ada.goto(f"{hub.url}/hub/spawn")
    card = ada.locator(".gpulease-profile", has=ada.locator(f'input[value="{SLUG}"]'))
    text = card.inner_text()
    assert PROBE in text
    assert "0.36 credits/h" in text and "0.0001 credits/s" in text
    assert re.search(r"7 of 7 free", text), text
    assert re.search(r"\d+ min", text), text  # what the balance buys on it

    # ... starts it, and sees the running cost on the home page
    card.locator(f'input[value="{SLUG}"]').check()
    ada.locator('form#spawn_form [type="submit"]').click()
    # JupyterLab, and in a notebook's cell the slice the hub assigned
    admin_token = hub.token_for("admin", ADMIN_PW)
    seen = devices_seen_in_lab(ada)
    assert seen == hub.assigned_devices(admin_token, "ada") and seen[0].startswith("MIG-")
    row = home_row(ada, hub)
    assert row.get_attribute("data-state") == "running"
    assert SLUG in row.inner_text()
    assert re.fullmatch(r"\d+\.\d{6}", row.locator(".gpulease-cost").inner_text())

    # 3. the admin sees it held in the inventory
    admin.goto(f"{hub.urls.service()}admin/inventory")
    inventory = admin.inner_text("main")
    assert "ada" in inventory and "1g.18gb" in inventory

    # 4. the researcher stops it, then resumes on another profile (CPU only)
    row.locator("#stop").click()
    ada.wait_for_function(
        "() => { const r = document.querySelector('tr.gpulease-server[data-server-name=\"\"]');"
        " return r && !r.querySelector('#stop:not(.hidden)') }", timeout=60_000)
    row = home_row(ada, hub)
    assert row.get_attribute("data-state") == "stopped"
    row.get_by_role("link", name=re.compile("other profile", re.I)).click()
    ada.locator('input[name="profile"][value="cpu"]').check()
    ada.locator('form#spawn_form [type="submit"]').click()
    assert devices_seen_in_lab(ada) == [] == hub.assigned_devices(admin_token, "ada")
    row = home_row(ada, hub)
    assert row.get_attribute("data-state") == "running"
    assert row.locator(".gpulease-profile").inner_text() == "cpu"

    # 5. the admin sees the session in the usage report and the profile in the audit log
    admin.goto(f"{hub.urls.service()}admin/report")
    assert "ada" in admin.inner_text("main")
    admin.goto(f"{hub.urls.service()}admin/audit")
    audit = admin.inner_text("main")
    assert "profile.create" in audit and f"profile:{SLUG}" in audit and "admin" in audit
    assert PROBE in audit or "&lt;script&gt;" not in audit

    # the hub's menu leads to gpulease's usage page (the session is there)
    ada.goto(f"{hub.url}/hub/home")
    ada.locator("nav").get_by_role("link", name="Usage").click()
    ada.wait_for_url(re.compile(r".*/services/gpulease/usage.*"))
    assert SLUG in ada.inner_text("main")

    # the probe never ran anywhere, and no page answered an error on the way
    assert dialogs == []
    browser_context.http_errors.check()
    ada.context.http_errors.check()
