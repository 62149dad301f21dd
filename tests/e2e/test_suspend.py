"""End to end: a suspended server shows on the home page and resumes with one click."""

from __future__ import annotations

import re

import pytest

from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e



@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions()


def test_suspended_server_shows_and_resumes_on_its_profile(hub):
    admin = hub.admin_token
    r = hub.service("POST", "api/users", admin, {"name": "rae", "password": "rae-pw-12345"})
    assert r.status_code == 201, r.text
    hub.grant(admin, "user:rae")
    token = hub.token_for("rae", "rae-pw-12345")
    r = hub.api("POST", "users/rae/servers/train", token, {"user_options": {"profile": "h200-1g"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("rae", token, "train")
    # the culler's way of suspending: api/stop with reason idle
    r = hub.service("POST", "api/stop", admin, {"user": "rae", "server": "train", "reason": "idle"})
    assert r.status_code == 202, r.text
    hub.wait_server_stopped("rae", token, "train")
    inv = hub.service("GET", "api/inventory", admin).json()
    assert not [d for n in inv["nodes"] for g in n["gpus"] for d in g["devices"] if d["holder"]]

    browser = hub.login_form("rae", "rae-pw-12345")
    home = browser.get(f"{hub.url}/hub/home", timeout=10).text
    assert "Suspended after 30 min idle" in home
    assert re.search(r'class="btn btn-primary btn-sm gpulease-resume"\s+data-server="train"', home)
    assert "/hub/spawn/rae/train" in home  # another profile, including CPU only

    # Resume = an empty-body start: same profile, same home
    xsrf = browser.cookies.get("_xsrf")
    r = browser.post(f"{hub.url}/hub/api/users/rae/servers/train",
                     headers={"X-XSRFToken": xsrf}, timeout=60)
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("rae", token, "train")
    usage = hub.service("GET", "api/usage", token).json()["sessions"]
    assert [s["profile"] for s in usage] == ["h200-1g", "h200-1g"]
    assert usage[0]["end_reason"] == "idle"
    home = browser.get(f"{hub.url}/hub/home", timeout=10).text
    assert "Suspended after" not in home
    hub.api("DELETE", "users/rae/servers/train", token)
    hub.wait_server_stopped("rae", token, "train")
