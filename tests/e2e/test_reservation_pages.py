"""End to end: the admin page of reservations (admin/reservations) on a real hub.

One hub for the module, with a declared inventory of one H200 in three 1g.18gb
slices and one full H200; the profile `slice` offers reservations at 1.8
credits per unit-hour, `full` offers none. Users: admin, lee (100 credits),
poor (none), bob (a plain user) and audrey (in the `auditors` group:
read-only). Browsers log in through the hub's login form and follow the
service's OAuth redirect, as in tests/e2e/test_admin_pages.py.

Each test reserves in hours of its own (hours from now), so that what one test
holds never decides another's capacity.
"""

from __future__ import annotations

import datetime as dt
import html as htmllib
import re
from urllib.parse import urljoin

import pytest
import requests
from sqlalchemy import func, select, update

from gpulease.core.units import format_credits, parse_credits
from gpulease.store.db import ledger_entries, open_database, reservations, sqlite_url
from tests.support.hubproc import ADMIN_PW, HubOptions, password_of

e2e = pytest.mark.e2e
XSS = "<script>alert(1)</script>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
PAGE = "admin/reservations"
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "mig": ["1g.18gb"] * 3},
    {"model": "H200", "memory": "141Gi"},
]}]}
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "3.6",
     "reserved_price_per_hour": "1.8"},
    {"slug": "full", "display_name": "Full", "gpu": {"model": "H200", "count": 1},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "8"},
]}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, inventory=INVENTORY,
                      args=['--GPULeaseHub.auditor_groups=["auditors"]'],
                      users=["bob", "audrey"], groups={"auditors": ["audrey"]})


@pytest.fixture(scope="module")
def hub(hub):
    """The module's hub (tests/e2e/conftest.py), with lee (100 credits), poor (none) and
    an engine on its database."""
    hub.add_user(hub.admin_token, "lee")
    hub.add_user(hub.admin_token, "poor", credit=None)
    hub.engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    yield hub
    hub.engine.dispose()


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


def get(session: requests.Session, hub, path: str = PAGE) -> requests.Response:
    return session.get(url(hub, path), timeout=30)


def xsrf(page: requests.Response) -> str:
    found = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert found, "the page carries no _xsrf token"
    return htmllib.unescape(found.group(1))


def post(session: requests.Session, hub, data: dict, token: str | None = None):
    """Post a form as a browser does; `token` defaults to the _xsrf cookie's value."""
    if token is None:
        token = next(c.value for c in session.cookies
                     if c.name == "_xsrf" and c.path.startswith("/services/gpulease"))
    return session.post(url(hub, PAGE), data={"_xsrf": token, **data},
                        allow_redirects=False, timeout=30)


def follow(session: requests.Session, hub, r: requests.Response) -> str:
    assert r.status_code == 303, r.text[:1500]
    return session.get(urljoin(hub.urls.service(), r.headers["Location"]), timeout=30).text


def hour(offset: int = 0) -> str:
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    return (now + dt.timedelta(hours=offset)).strftime("%Y-%m-%dT%H:00:00Z")


def add_form(**fields) -> dict:
    return {"form": "add", "account": "user:lee", "profile": "slice", "units": "1",
            "start": hour(1), "end": hour(2), "on_end": "continue", "note": "", **fields}


def reserve(hub, **fields) -> dict:
    body = {"account": "user:lee", "profile": "slice", "units": 1, "start": hour(1),
            "end": hour(2), **fields}
    r = hub.service("POST", "api/reservations", hub.admin_token, body)
    assert r.status_code == 201, r.text
    return r.json()


def balance(hub, user: str = "lee") -> int:
    r = hub.service("GET", f"api/balance?user={user}", hub.admin_token)
    return parse_credits(r.json()["balance"])


def ledger(hub, account: str = "user:lee") -> list[dict]:
    with hub.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(ledger_entries).where(ledger_entries.c.account == account)
            .order_by(ledger_entries.c.id))]


def written(hub) -> tuple[int, int, int]:
    """Rows that a reservation or a cancellation writes: reservations, ledger, audit."""
    with hub.engine.connect() as conn:
        booked = conn.execute(select(func.count()).select_from(reservations)).scalar()
        rows = conn.execute(select(func.count()).select_from(ledger_entries)).scalar()
    audit = hub.service("GET", "api/audit", hub.admin_token).json()["total"]
    return booked, rows, audit


def audit(hub, action: str) -> list[dict]:
    r = hub.service("GET", f"api/audit?action={action}", hub.admin_token)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def row_of(page: str, reservation_id: int) -> str:
    found = re.search(rf'<tr data-id="{reservation_id}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"reservation {reservation_id} is not listed"
    return found.group(1)


def cells(row: str) -> list[str]:
    return [" ".join(re.sub(r"<[^>]+>", " ", c).split())
            for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def field_errors(page: str) -> list[str]:
    return [htmllib.unescape(m) for m in re.findall(r'<span class="field-error">([^<]*)</span>',
                                                    page)]


# --- seeing it ---------------------------------------------------------------------------

@e2e
def test_the_page_lists_a_reservation_with_the_prices(hub, admin):
    booked = reserve(hub, start=hour(0), end=hour(2), note=XSS)
    page = get(admin, hub)
    assert page.status_code == 200, page.text[:500]
    assert "script-src" not in page.headers["Content-Security-Policy"]
    text = page.text
    assert XSS not in text and SCRIPT_ESCAPED in text  # the note, as text
    assert cells(row_of(text, booked["id"]))[:12] == [
        str(booked["id"]), "user:lee", "slice", "1", "H200 1g.18gb slices", hour(0), hour(2),
        "2", "3.600000", "continue", "active", SCRIPT_ESCAPED]
    assert "refunds" in row_of(text, booked["id"])  # what cancelling now gives back
    # the price per unit-hour is stated before anything is paid; only reservable profiles
    prices = re.search(r'<table class="compact" id="prices">(.*?)</table>', text, re.S).group(1)
    assert cells(re.search(r'<tr data-slug="slice">(.*?)</tr>', prices, re.S).group(1)) == [
        "slice", "Slice", "1 H200 1g.18gb slice", "1.800000", "3.600000", "3"]
    assert 'data-slug="full"' not in prices
    assert re.search(r'<option value="slice"\s*>slice: 1\.800000 credits per unit-hour', text)
    assert '<option value="full"' not in text
    assert "reserved price per unit-hour × units × hours" in text
    # the nav of every admin page links it
    for path in ("admin/credits", "admin/limits", "admin/profiles", PAGE):
        assert f'href="{hub.urls.service(PAGE)}"' in get(admin, hub, path).text, path


@e2e
def test_past_reservations_show_only_when_asked(hub, admin):
    booked = reserve(hub, start=hour(40), end=hour(41))
    earlier = dt.datetime.now(dt.UTC).replace(tzinfo=None, minute=0, second=0, microsecond=0)
    with hub.engine.begin() as conn:  # time passing: it ended two hours ago
        conn.execute(update(reservations).where(reservations.c.id == booked["id"]).values(
            starts_at=earlier - dt.timedelta(hours=3), ends_at=earlier - dt.timedelta(hours=2)))
    page = get(admin, hub).text
    assert f'data-id="{booked["id"]}"' not in page
    assert f'href="/services/gpulease/{PAGE}?past=true"' in page
    past = get(admin, hub, f"{PAGE}?past=true").text
    row = row_of(past, booked["id"])
    assert cells(row)[10] == "ended" and "Cancel" not in row
    assert get(admin, hub, f"{PAGE}?past=maybe").status_code == 400


# --- making one --------------------------------------------------------------------------

@e2e
def test_adding_through_the_form_charges_one_ledger_row_and_audits(hub, admin):
    page = get(admin, hub)
    assert 'id="add-form"' in page.text
    before, rows_before = balance(hub), len(ledger(hub))
    r = post(admin, hub, add_form(units="2", start=hour(10), end=hour(14), on_end="suspend",
                                  note="course week"), token=xsrf(page))
    done = follow(admin, hub, r)
    new_id = int(re.search(r"added=(\d+)", r.headers["Location"]).group(1))
    cost = 2 * 1_800_000 * 4
    assert (f"Reservation {new_id} made for user:lee: 2 units of slice" in done
            and f"Charged {format_credits(cost)} credits to user:lee" in done
            and "2 units × 1.800000 credits per unit-hour × 4 h" in done), done
    assert balance(hub) == before - cost
    assert f"its balance is now {format_credits(before - cost)}" in done
    rows = ledger(hub)
    assert len(rows) == rows_before + 1
    assert (rows[-1]["kind"], rows[-1]["amount_ucr"], rows[-1]["reservation_id"],
            rows[-1]["actor"]) == ("reservation", -cost, new_id, "admin")
    row = cells(row_of(done, new_id))
    assert row[3] == "2" and row[8] == format_credits(cost) and row[9] == "suspend"
    [entry] = [e for e in audit(hub, "reservation.add") if e["after"]["id"] == new_id]
    assert entry["actor"] == "admin" and entry["target"] == "user:lee"
    assert entry["before"] is None and entry["after"]["cost"] == format_credits(cost)
    assert entry["after"]["note"] == "course week"
    api = hub.service("GET", f"api/reservations/{new_id}", hub.admin_token).json()
    assert api["units"] == 2 and api["on_end"] == "suspend" and api["created_by"] == "admin"


@e2e
def test_a_refused_add_shows_why_beside_its_field_and_writes_nothing(hub, admin):
    reserve(hub, units=2, start=hour(20), end=hour(21))
    refusals = [  # (form fields, status, the field it is shown beside, words)
        ({"units": "4"}, 422, "units", "more than there are: 3"),
        ({"units": "2", "start": hour(20), "end": hour(21)}, 409, "units", "only 1 of 3"),
        ({"start": hour(-2), "end": hour(1)}, 400, "start", "the hour under way"),
        ({"start": hour(1)[:14] + "30:00Z"}, 400, "start", "on a whole hour"),
        ({"end": hour(1)}, 400, "end", "end must be after start"),
        ({"account": "user:poor"}, 402, "account", "has 0.000000 credits"),
        ({"account": "user:nobody"}, 400, "account", "unknown user nobody"),
        ({"units": "two"}, 400, "units", "whole number"),
        ({"profile": "full"}, 422, "profile", "offers no reservations"),
        ({"on_end": "explode"}, 400, "on_end", "on_end is one of continue, suspend"),
    ]
    before = written(hub)
    for fields, status, field, words in refusals:
        form = add_form(**fields)
        r = post(admin, hub, form)
        assert r.status_code == status, (fields, r.status_code, r.text[:800])
        assert "Nothing was reserved or charged" in r.text, fields
        found = re.search(rf'<(input|select) name="{field}"[^>]*>.*?</label>', r.text, re.S)
        assert found and words in htmllib.unescape(found.group(0)), (fields, found)
        assert any(words in m for m in field_errors(r.text)), (fields, field_errors(r.text))
        if field not in ("profile", "on_end"):  # what was typed is kept
            assert f'value="{htmllib.escape(form[field])}"' in r.text, fields
        assert written(hub) == before, fields


# --- cancelling --------------------------------------------------------------------------

@e2e
def test_cancelling_shows_the_refund(hub, admin):
    booked = reserve(hub, start=hour(30), end=hour(32))  # 1 × 1.8 × 2 h, not begun
    page = get(admin, hub)
    row = row_of(page.text, booked["id"])
    assert 'name="form" value="cancel"' in row and "refunds 3.600000 now" in row
    before = balance(hub)
    r = post(admin, hub, {"form": "cancel", "id": str(booked["id"])}, token=xsrf(page))
    done = follow(admin, hub, r)
    assert (f"Reservation {booked['id']} cancelled: refunded 3.600000 credits to user:lee"
            in done), done
    assert balance(hub) == before + 3_600_000
    refund = ledger(hub)[-1]
    assert (refund["kind"], refund["amount_ucr"], refund["reservation_id"]) == (
        "refund", 3_600_000, booked["id"])
    shown = get(admin, hub, f"{PAGE}?past=true").text
    row = row_of(shown, booked["id"])
    assert "cancelled (refunded 3.600000)" in " ".join(cells(row)) and "Cancel</button>" not in row
    entry = next(e for e in audit(hub, "reservation.cancel") if e["after"]["id"] == booked["id"])
    assert entry["actor"] == "admin" and entry["after"]["refund"] == "3.600000"
    assert entry["before"]["state"] == "upcoming" and entry["after"]["state"] == "cancelled"
    # again: refused on the page, nothing written
    before = written(hub)
    again = post(admin, hub, {"form": "cancel", "id": str(booked["id"])})
    assert again.status_code == 409 and "Nothing was cancelled" in again.text
    assert f"reservation {booked['id']} was cancelled at" in again.text
    missing = post(admin, hub, {"form": "cancel", "id": "999999"})
    assert missing.status_code == 404 and "No reservation 999999" in missing.text
    assert post(admin, hub, {"form": "cancel", "id": "x"}).status_code == 400
    assert written(hub) == before


# --- who may ----------------------------------------------------------------------------

@e2e
def test_an_auditor_reads_the_page_without_any_form_and_cannot_post(hub, audrey):
    booked = reserve(hub, start=hour(50), end=hour(51))
    page = get(audrey, hub)
    assert page.status_code == 200
    assert f'data-id="{booked["id"]}"' in page.text and 'id="prices"' in page.text
    assert 'method="post"' not in page.text and "<button" not in page.text
    before = written(hub)
    for data in (add_form(start=hour(52), end=hour(53)),
                 {"form": "cancel", "id": str(booked["id"])}):
        r = post(audrey, hub, data)  # with a valid token: refused for the role
        assert r.status_code == 403 and "gpulease admin" in r.text, data
    assert written(hub) == before


@e2e
def test_a_plain_user_gets_403(hub, bob):
    assert f'href="{hub.urls.service(PAGE)}"' not in get(bob, hub, "usage").text
    page = get(bob, hub)
    assert page.status_code == 403 and "Error 403" in page.text
    before = written(hub)
    r = post(bob, hub, add_form(account="user:bob", start=hour(60), end=hour(61)))
    assert r.status_code == 403
    assert written(hub) == before
    # nor does the API (reservations_by_researchers is off) tell him which accounts exist
    token = hub.token_for("bob", password_of("bob"))
    for account in ("user:lee", "user:nobody", "group:nogroup", "user:bob"):
        r = hub.service("POST", "api/reservations", token, {
            "account": account, "profile": "slice", "units": 1, "start": hour(60),
            "end": hour(61)})
        assert r.status_code == 403 and "reservations_by_researchers" in r.text, (account,
                                                                                   r.text)
    assert written(hub) == before


@e2e
def test_a_post_without_its_form_token_is_refused(hub, admin):
    get(admin, hub)
    before = written(hub)
    for token in ("", "forged"):
        r = post(admin, hub, add_form(start=hour(70), end=hour(71)), token=token)
        assert r.status_code == 403, r.text[:300]
    assert written(hub) == before


# --- in a real browser -------------------------------------------------------------------

@e2e
def test_an_admin_reserves_and_cancels_in_chromium(hub, browser_context):
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "admin")
    page.fill("#password_input", ADMIN_PW)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/.*"))
    page.goto(url(hub, "admin/credits"))
    page.get_by_role("link", name="Reservations").click()
    page.wait_for_url(re.compile(rf".*{PAGE}$"))
    form = page.locator("#add-form")
    form.get_by_label("account (user:NAME").fill("user:lee")
    form.get_by_label("profile").select_option("slice")
    form.get_by_label("units (servers").fill("9")  # more than exist: shown beside the field
    form.get_by_label("start (UTC").fill(hour(80))
    form.get_by_label("end (UTC").fill(hour(82))
    form.get_by_label("at its end").select_option("suspend")
    form.get_by_role("button", name="Reserve and charge").click()
    error = page.locator(".field-error").first
    assert error.is_visible() and "more than there are" in error.inner_text()
    assert page.locator("#add-form").get_by_label("end (UTC").input_value() == hour(82)
    page.locator("#add-form").get_by_label("units (servers").fill("1")
    page.locator("#add-form").get_by_role("button", name="Reserve and charge").click()
    page.wait_for_url(re.compile(r".*added=\d+"))
    assert "Charged 3.600000 credits to user:lee" in page.inner_text("[role=status]")
    new_id = re.search(r"added=(\d+)", page.url).group(1)
    row = page.locator(f'tr[data-id="{new_id}"]')
    assert "suspend" in row.inner_text() and "upcoming" in row.inner_text()
    row.get_by_role("button", name="Cancel").click()
    page.wait_for_url(re.compile(r".*cancelled=\d+"))
    assert (f"Reservation {new_id} cancelled: refunded 3.600000 credits to user:lee"
            in page.inner_text("[role=status]"))
