"""End to end: the admin pages of the gpulease service on a real hub.

One hub for the module, with a declared inventory of one MIG H200 (7 slices)
and one full H200. Users: admin, bob (a plain user) and audrey (in the
`auditors` group: read-only). Browsers log in through the hub's login form
and follow the service's OAuth redirect (requests follows it like a browser).
"""

from __future__ import annotations

import html as htmllib
import re
from urllib.parse import urljoin

import pytest
import requests
import yaml

from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.units import format_credits, parse_credits
from gpulease.host.gpus import discover_inventory
from gpulease.store.assignments import AssignmentStore
from gpulease.store.db import open_database, sqlite_url
from gpulease.store.queue_store import QueueStore
from tests.support.hubproc import ADMIN_PW, HubOptions, password_of
from tests.support.pages import profile_form

e2e = pytest.mark.e2e  # the tests that start a hub (the pure ones below do not)
XSS = "<script>alert(1)</script>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
PAGES = ("admin/profiles", "admin/inventory", "admin/credits", "admin/limits", "admin/audit",
         "admin/report")
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "mig": ["1g.18gb"] * 7},
    {"model": "H200", "memory": "141Gi"},
]}]}
BASE_PROFILE = {"slug": "cpu-small", "display_name": XSS, "cpu": 1, "memory": "2Gi",
                "images": ["pytorch"], "price_per_hour": "0.5"}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles={"profiles": [BASE_PROFILE]}, inventory=INVENTORY,
                      args=['--GPULeaseHub.auditor_groups=["auditors"]'],
                      users=["bob", "audrey"], groups={"auditors": ["audrey"]})


def url(hub, path: str) -> str:
    return f"{hub.urls.service()}{path}"


@pytest.fixture(scope="module")
def admin(hub) -> requests.Session:
    return hub.signed_in("admin", ADMIN_PW)


@pytest.fixture(scope="module")
def bob(hub) -> requests.Session:
    return hub.signed_in("bob", password_of("bob"))


@pytest.fixture(scope="module")
def audrey(hub) -> requests.Session:
    return hub.signed_in("audrey", password_of("audrey"))


def get(session: requests.Session, hub, path: str) -> requests.Response:
    return session.get(url(hub, path), timeout=30)


def xsrf(page: requests.Response) -> str:
    found = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert found, "the form carries no _xsrf token"
    return htmllib.unescape(found.group(1))


def post(session: requests.Session, hub, path: str, data: dict, token: str | None = None):
    """Post a form as a browser does; `token` defaults to the _xsrf cookie's value."""
    fields = {"_xsrf": token if token is not None else _cookie_token(session), **data}
    return session.post(url(hub, path), data=fields, allow_redirects=False, timeout=30)


def _cookie_token(session: requests.Session) -> str:
    # The _xsrf cookie holds the token the forms carry (JupyterHub's scheme).
    return next(c.value for c in session.cookies
                if c.name == "_xsrf" and c.path.startswith("/services/gpulease"))


def audit(hub, target: str) -> list[dict]:
    r = hub.service("GET", f"api/audit?target={target}", hub.admin_token)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def api_profiles(hub) -> dict[str, dict]:
    r = hub.service("GET", "api/profiles", hub.admin_token)
    return {p["slug"]: p for p in r.json()["profiles"]}


# --- who sees what -------------------------------------------------------------------

@e2e
def test_every_page_renders_for_an_admin_with_the_nav(hub, admin):
    for path in PAGES:
        page = get(admin, hub, path)
        assert page.status_code == 200, (path, page.text[:500])
        assert page.headers["Content-Type"].startswith("text/html")
        assert "script-src" not in page.headers["Content-Security-Policy"]
        # No page of the hub's origin (a researcher's server is one) may frame it.
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        assert page.headers["X-Frame-Options"] == "DENY"
        for link in PAGES:
            assert f'href="{hub.urls.service(link)}"' in page.text
    for path in ("admin/profiles/new", "admin/profiles/edit/cpu-small",
                 "admin/profiles/delete/cpu-small"):
        page = get(admin, hub, path)
        assert page.status_code == 200 and 'method="post"' in page.text, path
        xsrf(page)


@e2e
def test_a_plain_user_gets_403_everywhere(hub, bob):
    assert 'admin/profiles"' not in get(bob, hub, "usage").text  # no admin nav
    for path in (*PAGES, "admin/profiles/new", "admin/profiles/edit/cpu-small"):
        page = get(bob, hub, path)
        assert page.status_code == 403 and "Error 403" in page.text, path
    get(bob, hub, "usage")  # a page view sets the _xsrf cookie
    r = post(bob, hub, "admin/credits", {"kind": "grant", "account": "user:bob",
                                         "amount": "5", "note": ""})
    assert r.status_code == 403


@e2e
def test_an_auditor_reads_but_sees_no_forms_and_cannot_post(hub, audrey):
    for path in (*PAGES, "admin/profiles/edit/cpu-small"):
        page = get(audrey, hub, path)
        assert page.status_code == 200, path
        assert 'method="post"' not in page.text, path
    assert get(audrey, hub, "admin/profiles/new").status_code == 403
    assert get(audrey, hub, "admin/profiles/delete/cpu-small").status_code == 403
    for path, data in (("admin/profiles/new", profile_form(slug="by-audrey")),
                       ("admin/credits", {"kind": "grant", "account": "user:audrey",
                                          "amount": "5", "note": ""}),
                       ("admin/limits", {"form": "limit", "subject": "user:audrey",
                                         "max_gpus": "9"}),
                       ("admin/profiles/delete/cpu-small", {})):
        r = post(audrey, hub, path, data)  # with a valid token: refused for the role
        assert r.status_code == 403 and "gpulease admin" in r.text, path
    assert "by-audrey" not in api_profiles(hub) and "cpu-small" in api_profiles(hub)


@e2e
def test_a_post_without_its_form_token_is_refused(hub, admin):
    get(admin, hub, "admin/profiles/new")
    for token in ("", "forged"):
        r = post(admin, hub, "admin/profiles/new", profile_form(slug="no-token"), token=token)
        assert r.status_code == 403, r.text[:300]
    assert "no-token" not in api_profiles(hub)


@e2e
def test_an_authorization_header_that_is_no_token_does_not_skip_the_form_token(hub, admin):
    """A browser behind a Basic-auth proxy sends `Authorization: Basic` with every
    request, a cross-site form post included: only a token that authenticates
    the request may skip the XSRF check, never the header's mere presence."""
    get(admin, hub, "admin/profiles/new")
    for header in ("Basic YWRtaW46eA==", "token not-a-real-token", "Bearer", "x" * 4000):
        fields = {"_xsrf": "", **profile_form(slug="basic-auth")}
        r = admin.post(url(hub, "admin/profiles/new"), data=fields, allow_redirects=False,
                       headers={"Authorization": header}, timeout=30)
        assert r.status_code == 403, (header[:20], r.status_code, r.text[:300])
        # the JSON API too: the cookie alone (no _xsrf) must not authenticate a write
        r = admin.put(url(hub, "api/profiles/basic-auth"), json=BASE_PROFILE | {
            "slug": "basic-auth"}, headers={"Authorization": header}, timeout=30)
        assert r.status_code == 403, (header[:20], r.status_code, r.text[:300])
        assert r.json()["status"] == 403
    assert "basic-auth" not in api_profiles(hub)


# --- profiles editor --------------------------------------------------------------------

@e2e
def test_creating_a_profile_through_the_form(hub, admin):
    page = get(admin, hub, "admin/profiles/new")
    r = post(admin, hub, "admin/profiles/new", profile_form(), token=xsrf(page))
    assert r.status_code == 303, r.text[:1000]
    listing = admin.get(urljoin(hub.urls.service(), r.headers["Location"]), timeout=30)
    assert "Profile h200-slice created." in listing.text
    assert 'data-slug="h200-slice"' in listing.text
    made = api_profiles(hub)["h200-slice"]
    assert made["gpu"] == {"model": "H200", "mig": "1g.18gb"}
    assert made["images"] == ["cuda", "pytorch"]  # the default first
    assert made["groups"] == ["vision", "nlp"] and made["price_per_hour"] == "1.2"
    assert made["enabled"] is True and made["memory"] == "32Gi"
    [entry] = audit(hub, "profile:h200-slice")
    assert entry["action"] == "profile.create" and entry["actor"] == "admin"
    assert entry["before"] is None and entry["after"]["display_name"] == "H200 slice"
    copy = get(admin, hub, "admin/profiles/new?copy=h200-slice").text
    assert 'name="slug" value=""' in copy and 'value="H200 slice (copy)"' in copy
    assert 'value="32Gi"' in copy and 'value="vision, nlp"' in copy
    # the same slug again is refused, on the slug field
    again = post(admin, hub, "admin/profiles/new", profile_form(display_name="twice"))
    assert again.status_code == 400 and "exists already" in again.text
    assert api_profiles(hub)["h200-slice"]["display_name"] == "H200 slice"


@e2e
def test_an_invalid_profile_shows_field_errors_and_keeps_the_input(hub, admin):
    before = len(hub.service("GET", "api/audit", hub.admin_token).json()["entries"])
    form = profile_form(slug="broken", gpu_mig="9g.1tb", memory="lots", images=["nope"],
                        default_image="", min_run="soon", display_name=XSS)
    r = post(admin, hub, "admin/profiles/new", form)
    assert r.status_code == 400
    text = r.text
    errors = re.findall(r'<span class="field-error">([^<]*)</span>', text)
    assert len(errors) >= 4, errors
    joined = htmllib.unescape(" ".join(errors))
    assert "'9g.1tb' is not a MIG profile of H200" in joined
    assert "'lots' is not a quantity" in joined
    assert "images: " not in joined and "'nope' is not in the image catalog" in joined
    assert "'soon' is not a duration" in joined
    assert 'value="lots"' in text and 'value="9g.1tb"' in text and 'value="broken"' in text
    assert XSS not in text and f'value="{SCRIPT_ESCAPED}"' in text  # kept, as text
    assert "broken" not in api_profiles(hub)
    after = len(hub.service("GET", "api/audit", hub.admin_token).json()["entries"])
    assert after == before


@e2e
def test_editing_and_deleting_a_profile(hub, admin):
    hub.service("PUT", "api/profiles/edit-me", hub.admin_token,
                {"display_name": "Edit me", "cpu": 2, "memory": "4Gi", "images": ["pytorch"],
                 "price_per_hour": "1"})
    page = get(admin, hub, "admin/profiles/edit/edit-me")
    assert 'value="Edit me"' in page.text and 'value="4Gi"' in page.text
    form = profile_form(slug=None, display_name="Edited", gpu_model="", gpu_mig="",
                        memory="4Gi", cpu="2", images=["pytorch"], default_image="",
                        price_per_hour="2.5", groups="", enabled=None)
    r = post(admin, hub, "admin/profiles/edit/edit-me", form, token=xsrf(page))
    assert r.status_code == 303, r.text[:1000]
    edited = api_profiles(hub)["edit-me"]
    assert edited["price_per_hour"] == "2.5" and edited["enabled"] is False
    assert "gpu" not in edited and edited["display_name"] == "Edited"
    update = audit(hub, "profile:edit-me")[0]
    assert update["action"] == "profile.update" and update["before"]["price_per_hour"] == "1"
    # the audit page shows the change as a diff
    shown = get(admin, hub, "admin/audit?target=profile:edit-me").text
    assert re.search(r"<code>price_per_hour</code></td><td><del>1</del></td><td>→</td>"
                     r"<td><ins>2.5</ins>", shown)
    # delete: a confirmation page first, then the post
    confirm = get(admin, hub, "admin/profiles/delete/edit-me")
    assert "Delete profile edit-me?" in confirm.text and "No server has this profile" in confirm.text
    r = post(admin, hub, "admin/profiles/delete/edit-me", {}, token=xsrf(confirm))
    assert r.status_code == 303
    assert "edit-me" not in api_profiles(hub)
    assert audit(hub, "profile:edit-me")[0]["action"] == "profile.delete"
    assert get(admin, hub, "admin/profiles/edit/edit-me").status_code == 404


@e2e
def test_display_names_stay_text(hub, admin):
    listing = get(admin, hub, "admin/profiles").text
    assert XSS not in listing and SCRIPT_ESCAPED in listing


# --- credits, caps, limits --------------------------------------------------------------

def balance(hub, user: str) -> str:
    return hub.service("GET", f"api/balance?user={user}", hub.admin_token).json()["balance"]


@e2e
def test_granting_and_adjusting_credits_through_the_forms(hub, admin):
    page = get(admin, hub, "admin/credits")
    assert 'id="grant-form"' in page.text and 'id="adjustment-form"' in page.text
    start, entries = balance(hub, "bob"), len(audit(hub, "user:bob"))
    r = post(admin, hub, "admin/credits", {"kind": "grant", "account": "user:bob",
                                           "amount": "12.5", "note": XSS}, token=xsrf(page))
    assert r.status_code == 303, r.text[:1000]
    done = admin.get(urljoin(hub.urls.service(), r.headers["Location"]), timeout=30).text
    assert "Grant of 12.500000 credits to user:bob recorded" in done
    assert balance(hub, "bob") == format_credits(parse_credits(start) + 12_500_000)
    entry = audit(hub, "user:bob")[0]
    assert entry["action"].startswith("credits.grant") and entry["actor"] == "admin"
    assert entry["after"]["balance"] == balance(hub, "bob")
    shown = get(admin, hub, "admin/audit?target=user:bob").text
    assert XSS not in shown and SCRIPT_ESCAPED in shown  # the note, as text
    # an adjustment needs a note; nothing is written without one
    r = post(admin, hub, "admin/credits", {"kind": "adjustment", "account": "user:bob",
                                           "amount": "-2", "note": " "})
    assert r.status_code == 400 and "needs a note" in r.text and 'value="-2"' in r.text
    r = post(admin, hub, "admin/credits", {"kind": "grant", "account": "user:nobody",
                                           "amount": "1", "note": ""})
    assert r.status_code == 400 and "unknown user nobody" in r.text
    assert len(audit(hub, "user:bob")) == entries + 1
    r = post(admin, hub, "admin/credits", {"kind": "adjustment", "account": "user:bob",
                                           "amount": "-2", "note": "refund mistake"})
    assert r.status_code == 303
    assert balance(hub, "bob") == format_credits(parse_credits(start) + 10_500_000)
    assert audit(hub, "user:bob")[0]["action"].startswith("credits.adjust")


@e2e
@pytest.mark.parametrize("page, field, allowed", [
    ("admin/credits", "kind", "kind must be grant or adjustment"),
    ("admin/limits", "form", "form must be cap or limit"),
    ("admin/reservations", "form", "form must be add or cancel"),
])
def test_a_form_the_page_does_not_have_is_refused_naming_the_ones_it_has(
        hub, admin, page, field, allowed):
    """Every admin page with several forms dispatches the same way (AdminPage.dispatch_form):
    an unknown one is a 400 that names what the page takes, and nothing is written."""
    entries = len(audit(hub, "user:bob"))
    assert get(admin, hub, page).status_code == 200  # the page sets its form token's cookie
    r = post(admin, hub, page, {field: "bogus", "account": "user:bob", "amount": "1"})
    text = htmllib.unescape(r.text)
    assert r.status_code == 400 and allowed in text and "'bogus'" in text, text[-1500:]
    assert len(audit(hub, "user:bob")) == entries


@e2e
def test_caps_and_limits_through_the_forms(hub, admin):
    hub.grant(hub.admin_token, "group:lab", "50")
    page = get(admin, hub, "admin/limits")
    assert '<option value="group:lab"' in page.text
    r = post(admin, hub, "admin/limits", {"form": "cap", "account": "group:lab", "user": "bob",
                                          "monthly": "7.5"}, token=xsrf(page))
    assert r.status_code == 303, r.text[:1000]
    shown = get(admin, hub, "admin/limits").text
    assert re.search(r"<td>group:lab</td><td>bob</td><td class=\"num\">7.500000</td>", shown)
    cap = hub.service("GET", "api/accounts/group:lab/caps/bob", hub.admin_token).json()
    assert cap["monthly"] == "7.500000"
    r = post(admin, hub, "admin/limits", {"form": "cap", "account": "group:lab",
                                          "user": "bob", "monthly": "-1"})
    assert r.status_code == 400 and "must not be negative" in r.text
    r = post(admin, hub, "admin/limits", {"form": "limit", "subject": "user:bob",
                                          "max_gpus": "1", "max_slices": ""})
    assert r.status_code == 303, r.text[:1000]
    shown = get(admin, hub, "admin/limits").text
    assert re.search(r"<td>user:bob</td><td class=\"num\">1</td><td class=\"num\"></td>", shown)
    limit = audit(hub, "user:bob")[0]
    assert limit["action"] == "limits.set"
    assert limit["after"] == {"max_gpus": 1, "max_slices": None}
    r = post(admin, hub, "admin/limits", {"form": "limit", "subject": "team:x",
                                          "max_gpus": "two"})
    assert r.status_code == 400 and "not a limit subject" in r.text
    assert "whole number" in r.text and 'value="two"' in r.text


# --- inventory and audit ----------------------------------------------------------------

@e2e
def test_inventory_shows_devices_and_holders(hub, admin, tmp_path):
    engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(INVENTORY))  # the hub's
    try:
        inventory = discover_inventory(str(tmp_path / "inventory.yaml"), "local")
        AssignmentStore(engine).claim("bob", XSS, "h200-slice",
                                      DeviceRequest("H200", "1g.18gb", 1), inventory)
        QueueStore(engine).add("audrey", "big", "h200-full")
        page = get(admin, hub, "admin/inventory").text
        assert re.search(r'<td class="num">1</td><td>audrey</td>\s*<td>big</td><td>h200-full</td>',
                         page)
        assert page.count("<td>1g.18gb</td>") == 7 and "<td>full card</td>" in page
        assert "7 free, 1 held, 0 out of service, 0 gone" in " ".join(page.split())
        held = re.search(r'<td class="state-held">held</td>\s*<td>bob</td>\s*<td>([^<]*)</td>',
                         page)
        assert held and held.group(1) == SCRIPT_ESCAPED
        assert XSS not in page
    finally:
        AssignmentStore(engine).release("bob", XSS, "test")
        QueueStore(engine).remove("audrey", "big")
        engine.dispose()


@e2e
def test_audit_page_filters_and_pages(hub, admin):
    for i in range(3):
        post(admin, hub, "admin/limits", {"form": "limit", "subject": f"user:pager{i}",
                                          "max_gpus": str(i)})
    page = get(admin, hub, "admin/audit?actor=admin&target=user:pager1").text
    assert "Entries 1–1 of 1" in page and "user:pager0" not in page.split('id="audit"')[1]
    everything = get(admin, hub, "admin/audit").text
    assert "newest first" in everything
    assert get(admin, hub, "admin/audit?since=yesterday").status_code == 400
    total = hub.service("GET", "api/audit", hub.admin_token).json()["total"]
    if total > 50:
        second = get(admin, hub, "admin/audit?offset=50").text
        assert "Entries 51–" in second and "← newer" in second


# --- in a real browser -------------------------------------------------------------------

@e2e
def test_an_admin_creates_a_profile_in_chromium(hub, browser_context):
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "admin")
    page.fill("#password_input", ADMIN_PW)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/.*"))
    page.goto(url(hub, "admin/profiles"))
    page.get_by_role("link", name="New profile").click()
    page.get_by_label("slug").press_sequentially("browser-made")
    page.get_by_label("display name").fill("Made in a browser")
    page.get_by_label("model").select_option("H200")
    page.get_by_label("count of whole GPUs").fill("2")
    page.get_by_label("CPU cores").fill("8")
    page.get_by_label("memory").fill("64Gi")
    page.get_by_label("price per hour (credits)").fill("3.5")
    page.get_by_label("images (Ctrl").select_option(["pytorch", "tensorrt-llm"])
    page.get_by_label("groups").fill("vision")
    page.get_by_role("button", name="Create profile").click()
    page.wait_for_url(re.compile(r".*admin/profiles\?slug=browser-made.*"))
    assert "Profile browser-made created." in page.inner_text("main")
    row = page.locator('tr[data-slug="browser-made"]')
    assert "2× H200" in row.inner_text() and "pytorch, tensorrt-llm" in row.inner_text()
    # a mistake shows next to its field, with what was typed kept
    page.get_by_role("link", name="New profile").click()
    page.get_by_label("slug").fill("browser-bad")
    page.get_by_label("display name").fill("Bad")
    page.get_by_label("memory").fill("lots")
    page.get_by_role("button", name="Create profile").click()
    assert page.locator(".field-error").first.is_visible()
    assert page.get_by_label("memory").input_value() == "lots"
    assert "browser-made" in api_profiles(hub) and "browser-bad" not in api_profiles(hub)


@e2e
def test_deleting_a_profile_that_servers_saved_needs_a_confirmation(hub, admin):
    hub.service("PUT", "api/profiles/saved-one", hub.admin_token,
                {"display_name": "Saved", "cpu": 1, "memory": "1Gi", "images": ["pytorch"],
                 "price_per_hour": "0"})
    r = hub.api("PUT", "users/bob/servers/keeper", hub.admin_token,
                {"user_options": {"profile": "saved-one"}})
    assert r.status_code == 201, r.text
    confirm = get(admin, hub, "admin/profiles/delete/saved-one")
    assert "still saved by" in confirm.text
    assert re.search(r"<td>bob</td><td>keeper</td>\s*<td>stopped</td>", confirm.text)
    assert 'name="force"' in confirm.text
    r = post(admin, hub, "admin/profiles/delete/saved-one", {}, token=xsrf(confirm))
    assert r.status_code == 409 and "Not deleted (409)" in r.text
    assert "saved-one" in api_profiles(hub)
    r = post(admin, hub, "admin/profiles/delete/saved-one", {"force": "on"})
    assert r.status_code == 303
    assert "saved-one" not in api_profiles(hub)
    assert audit(hub, "profile:saved-one")[0]["action"] == "profile.delete"
