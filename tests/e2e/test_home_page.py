"""The home page and the spawn page on a real hub (the server states they show, pure:
tests/unit/core/billing/test_my_servers.py).
"""

from __future__ import annotations

import re
import time

import pytest

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


# --- on a real hub -------------------------------------------------------------------

BEA_PW = "bea-pw-12345"


@pytest.fixture(scope="module")
def tokens(hub):
    admin = hub.admin_token
    r = hub.service("POST", "api/users", admin, {"name": "bea", "password": BEA_PW})
    assert r.status_code == 201, r.text
    hub.grant(admin, "user:bea", "12.5")
    # an admin-written display name must be shown as text, never run
    r = hub.service("PUT", "api/profiles/odd", admin, {
        "display_name": XSS, "description": XSS, "cpu": 1, "memory": "1Gi",
        "images": ["pytorch"], "price_per_hour": "0.05"})
    assert r.status_code == 201, r.text
    return {"admin": admin, "bea": hub.token_for("bea", BEA_PW)}


@pytest.mark.e2e
def test_home_page_shows_cost_suspend_reason_and_default_profile(hub, tokens):
    bea, admin = tokens["bea"], tokens["admin"]
    hub.start_servers("bea", bea, {"train": {"profile": "h200-1g"}, "old": {"profile": "cpu"}})
    r = hub.service("POST", "api/stop", admin, {"user": "bea", "server": "old",
                                                "reason": "idle"})
    assert r.status_code == 202, r.text
    hub.wait_server_stopped("bea", bea, "old")
    time.sleep(1.1)

    browser = hub.login_form("bea", BEA_PW)
    assert browser.login_status == 302
    home = browser.get(f"{hub.url}/hub/home", timeout=10).text
    train = re.search(r'data-server-name="train" data-state="running">(.*?)</tr>', home, re.S)
    assert train, home
    assert '<code class="gpulease-profile">h200-1g</code>' in train.group(1)
    cost = re.search(r'class="gpulease-cost">(\d+\.\d{6})</span> credits so far', train.group(1))
    assert cost and float(cost.group(1)) > 0
    assert "1.20 credits/h" in train.group(1)
    old = re.search(r'data-server-name="old" data-state="suspended">(.*?)</tr>', home, re.S)
    assert old and "Suspended after 30 min idle" in old.group(1)
    assert re.search(r'class="btn btn-primary btn-sm gpulease-resume"\s+data-server="old"', home)
    assert "/hub/spawn/bea/old" in home  # another profile, including CPU only
    assert 'data-server-name="" data-state="stopped"' in home  # the default server
    assert 'class="new-server-name' in home and "new-server-btn" in home  # JupyterHub's own
    assert 'id="stop-train"' in home
    assert XSS not in home and XSS_ESCAPED in home  # the odd profile's name, escaped

    # the default profile: a form post to the hub with its own _xsrf
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', home).group(1)
    url = f"{hub.url}/hub/gpulease/default-profile"
    r = browser.post(url, data={"profile": "h200-1g", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 302 and r.headers["Location"].endswith("/hub/home"), r.text
    assert hub.service("GET", "api/me/default-profile", bea).json()["profile"] == "h200-1g"
    home = browser.get(f"{hub.url}/hub/home", timeout=10).text
    assert re.search(r'<option value="h200-1g" selected>H200 slice', home)
    r = browser.post(url, data={"profile": "nope", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 400 and "choose one of" in r.text
    r = browser.post(url, data={"profile": "cpu"}, allow_redirects=False)  # no _xsrf
    assert r.status_code == 403
    r = browser.post(url, data={"profile": "", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 302
    assert hub.service("GET", "api/me/default-profile", bea).json()["profile"] is None

    # the spawn page: cards with what is free, prices per second, and the balance
    page = browser.get(f"{hub.url}/hub/spawn/bea/next", timeout=10).content.decode()
    assert "6 of 7 free" in page  # train holds one slice
    assert "≈ 0.000333 credits/s" in page
    assert re.search(r'class="gpulease-balance">12\.\d{6}</strong>', page)
    assert XSS not in page and XSS_ESCAPED in page

    hub.api("DELETE", "users/bea/servers/train", bea)
    hub.wait_server_stopped("bea", bea, "train")


@pytest.mark.e2e
def test_home_page_buttons_in_a_browser(hub, tokens, browser_context):
    """Create and start a named server for a profile, then stop it with JupyterHub's button."""
    bea = tokens["bea"]
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", "bea")
    page.fill("input[name=password]", BEA_PW)
    page.click("[type=submit]")
    page.goto(f"{hub.url}/hub/home")
    page.wait_for_function("window._jupyterhub_page_loaded === true")
    page.fill(".gpulease-new-name", "Bad Name")
    page.once("dialog", lambda d: d.dismiss())
    page.click(".gpulease-create-start")
    page.fill(".gpulease-new-name", "quick")
    page.select_option(".gpulease-new-profile", "cpu")
    page.click(".gpulease-create-start")
    page.wait_for_url(re.compile(r".*/(spawn-pending/bea/quick|user/bea/quick/).*"))
    hub.wait_server_ready("bea", bea, "quick")
    model = hub.api("GET", "users/bea", bea).json()
    assert model["servers"]["quick"]["user_options"] == {"profile": "cpu"}

    page.goto(f"{hub.url}/hub/home")
    page.wait_for_function("window._jupyterhub_page_loaded === true")
    row = page.locator('tr[data-server-name="quick"]')
    assert row.get_attribute("data-state") == "running"
    row.locator(".stop-server").click()
    page.wait_for_selector('tr[data-server-name="quick"][data-state="stopped"]', timeout=30_000)
    hub.wait_server_stopped("bea", bea, "quick")
    # stopped with its saved profile: Start runs it again with an empty body
    assert page.locator('tr[data-server-name="quick"] .gpulease-start').count() == 1
