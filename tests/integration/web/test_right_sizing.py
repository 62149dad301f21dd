"""Right-sizing advice (issue 47, item 3) over HTTP, in-process: the service's app, a FAKE hub
that says whose each token is and each user's groups, and a SQLite database.

A researcher whose last sessions on a 3g slice peaked at 2 GiB sees the 1g slice and the
exact saving on the usage API and page, and gets one `right_size` notice however often
they look; one whose session did not fit sees none; admins see the per-profile report,
researchers get 403 on it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from sqlalchemy import update
from tornado.httpclient import AsyncHTTPClient

from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import parse_profile
from gpulease.store.db import sessions
from gpulease.store.notices import NoticeStore
from gpulease.store.sessions import SessionLedger
from tests.support.service_app import ACCESS, ctx_of, running_service
from tests.support.sinks import WebhookSink

GiB = 2**30
TOKENS = {
    "admin": {"kind": "user", "name": "root", "admin": True, "groups": [],
              "scopes": ["custom:gpulease:admin", ACCESS]},
    "ada": {"kind": "user", "name": "ada", "admin": False, "groups": [],
            "scopes": ["access:servers!user=ada", "read:users!user=ada", ACCESS]},
    "bob": {"kind": "user", "name": "bob", "admin": False, "groups": [],
            "scopes": ["access:servers!user=bob", ACCESS]},
}


def profile(slug: str, gpu: dict, price: str) -> dict:
    return {"slug": slug, "display_name": slug, "gpu": gpu, "cpu": 4, "memory": "32Gi",
            "images": ["pytorch"], "price_per_hour": price, "min_run": "10m",
            "idle_timeout": "30m", "max_runtime": 0, "groups": [], "enabled": True}


@pytest.fixture
def hook():
    """Where the service sends webhook notifications (a local receiver)."""
    with WebhookSink() as sink:
        yield sink


def user_model(name: str) -> dict | None:
    """The hub's model of a user (the usage page asks for their groups); "gone" is a user
    the hub no longer knows (404)."""
    if name == "gone":
        return None
    return {"name": name, "groups": [], "servers": {}}


@pytest.fixture
async def service(tmp_path, monkeypatch, hook):
    async with running_service(tmp_path, monkeypatch, TOKENS, user_model,
                               GPULEASE_NOTIFY_WEBHOOK_URL=hook.url) as (base, app):
        ctx = ctx_of(app)
        for p in (profile("h200-1g", {"model": "H200", "mig": "1g.18gb"}, "1.20"),
                  profile("h200-3g", {"model": "H200", "mig": "3g.71gb"}, "3.60"),
                  profile("h200-full", {"model": "H200", "count": 1}, "8.00")):
            ctx.profiles.upsert(parse_profile(p, ctx.catalog, slug=p["slug"]))
        yield base, ctx


async def fetch(base: str, path: str, token: str):
    return await AsyncHTTPClient().fetch(base + path, raise_error=False,
                                         headers={"Authorization": f"token {token}"})


async def get_json(base: str, path: str, token: str):
    r = await fetch(base, path, token)
    return r.code, json.loads(r.body)


def closed_session(ctx, user: str, server: str, profile_slug: str, rate: int, hours_ago: float,
                   minutes: int, peak_gib: float, mean: float) -> None:
    """A session of `minutes` on `profile_slug` that ended `hours_ago`, with its readings."""
    # whole seconds: billed_ms exactly 40 minutes, so the saving is exact
    ended = utcnow().replace(microsecond=0) - dt.timedelta(hours=hours_ago)
    started = ended - dt.timedelta(minutes=minutes)
    ledger = SessionLedger(ctx.engine)
    s = ledger.open(user, server, profile_slug, f"user:{user}", rate, started)
    with ctx.engine.begin() as conn:
        conn.execute(update(sessions).where(sessions.c.id == s.id).values(
            gpu_activity_samples=4, gpu_activity_sum=4 * mean, gpu_activity_peak=mean + 5,
            gpu_memory_peak_bytes=int(peak_gib * GiB), gpu_reading_source="nvml",
            # read all along: the rule counts it
            gpu_activity_read_ms=minutes * 60_000, gpu_memory_read_ms=minutes * 60_000))
    ledger.close(s.id, ended, "user")


def three_small_sessions(ctx, user: str, last_peak_gib: float = 2.0) -> None:
    # 40 minutes each: 2.4 credits on the 3g slice, 0.8 on the 1g one: 1.6 saved each.
    for i, peak in enumerate((1.5, 2.0, last_peak_gib)):
        closed_session(ctx, user, "work", "h200-3g", 3_600_000, 48 - 10 * i, 40, peak, 10.0)


async def test_a_researcher_sees_the_smaller_profile_and_the_saving_once_noticed(service):
    base, ctx = service
    three_small_sessions(ctx, "ada")
    code, data = await get_json(base, "api/usage", "ada")
    assert code == 200
    assert len(data["advice"]) == 1
    advice = data["advice"][0]
    assert {k: advice[k] for k in ("profile", "suggest", "saved", "sessions", "slower_up_to",
                                   "speed_known")} == {
        "profile": "h200-3g", "suggest": "h200-1g", "saved": "4.800000", "sessions": 3,
        "slower_up_to": None, "speed_known": True}
    assert advice["hours"] == 2.0
    assert "H200 1g.18gb would have fitted and saved 4.8 credits" in advice["text"]

    page = await fetch(base, "usage", "ada")
    assert page.code == 200
    html = page.body.decode()
    assert "<h2>Advice</h2>" in html and "saved 4.8 credits" in html
    assert html.index("<h2>Advice</h2>") < html.index("<h2>Sessions</h2>")

    # Raised once: the API and the page computed it twice, a third look adds none.
    await get_json(base, "api/usage", "ada")
    told = [n for n in NoticeStore(ctx.engine).active("ada") if n.kind == "right_size"]
    assert len(told) == 1 and told[0].server == "work"
    assert "h200-3g → h200-1g" in told[0].message and "4.8 credits" in told[0].message
    code, notices = await get_json(base, "api/notices", "ada")
    assert [n["kind"] for n in notices["notices"]] == ["right_size"]
    # Dismissed, it is not raised again within the lookback window.
    NoticeStore(ctx.engine).clear("ada", None, ["right_size"])
    await get_json(base, "api/usage", "ada")
    assert NoticeStore(ctx.engine).active("ada") == []


async def test_a_session_that_did_not_fit_means_no_advice_and_no_notice(service):
    base, ctx = service
    three_small_sessions(ctx, "bob", last_peak_gib=40.0)  # over 2g's and 1g's memory
    code, data = await get_json(base, "api/usage", "bob")
    assert code == 200 and data["advice"] == []
    page = await fetch(base, "usage", "bob")
    assert page.code == 200 and "<h2>Advice</h2>" not in page.body.decode()
    assert NoticeStore(ctx.engine).active("bob") == []


async def test_admins_see_the_per_profile_report_and_researchers_do_not(service):
    base, ctx = service
    three_small_sessions(ctx, "ada")
    closed_session(ctx, "bob", "", "h200-full", 8_000_000, 5, 60, 100.0, 2.0)
    code, data = await get_json(base, "api/right-sizing", "admin")
    assert code == 200
    rows = {r["profile"]: r for r in data["profiles"]}
    assert set(rows) == {"h200-3g", "h200-full"}
    assert rows["h200-3g"] == {
        "profile": "h200-3g", "sessions": 3, "hours": 2.0, "mean_activity": 10.0,
        "p95_activity": 10.0, "idle_percent": 0.0, "fits_smaller_percent": 100.0,
        "advice": "h200-1g"}
    assert rows["h200-full"]["idle_percent"] == 100.0  # 2 % mean: idle
    assert rows["h200-full"]["advice"] is None  # one session: too few to advise
    assert data["since"].endswith("Z") and data["until"].endswith("Z")

    page = await fetch(base, "admin/report", "admin")
    assert page.code == 200
    html = page.body.decode()
    assert 'id="right-sizing"' in html and "h200-3g" in html and "h200-1g" in html

    code, data = await get_json(base, "api/right-sizing", "ada")
    assert code == 403
    assert (await fetch(base, "admin/report", "ada")).code == 403


async def test_the_usage_of_a_user_the_hub_no_longer_knows_is_answered_without_advice(service):
    """An admin's `api/usage?user=NAME` needs only the database, as before advice: a user
    deleted from the hub is answered with their sessions and no advice, not 404."""
    base, ctx = service
    led = SessionLedger(ctx.engine)
    s = led.open("gone", "", "h200-1g", "user:gone", 1_000_000, utcnow())
    led.close(s.id, utcnow(), "user")
    code, data = await get_json(base, "api/usage?user=gone", "admin")
    assert code == 200, data
    assert data["advice"] == [] and [x["user"] for x in data["sessions"]] == ["gone"]


async def test_two_advices_on_one_server_are_one_notice_sent_by_the_researcher_s_channel(
        service, hook):
    """Both advices due on the server "work" are told together: a second notice there would
    clear the first before ada saw it. She chose webhook notifications: it is sent once."""
    base, ctx = service
    NoticeStore(ctx.engine).set_prefs("ada", "webhook", "")
    three_small_sessions(ctx, "ada")
    for i in range(3):  # a full card that peaked at 50 GiB, 20 % busy: the 3g slice fits
        closed_session(ctx, "ada", "work", "h200-full", 8_000_000, 30 - 5 * i, 40, 50.0, 20.0)
    code, data = await get_json(base, "api/usage", "ada")
    assert code == 200
    assert {(a["profile"], a["suggest"]) for a in data["advice"]} == {
        ("h200-3g", "h200-1g"), ("h200-full", "h200-3g")}
    (notice,) = NoticeStore(ctx.engine).active("ada")
    assert notice.kind == "right_size" and notice.server == "work"
    assert "h200-3g → h200-1g" in notice.message and "h200-full → h200-3g" in notice.message
    (sent,) = await asyncio.to_thread(hook.wait, 1)
    assert "h200-3g → h200-1g" in json.dumps(sent, ensure_ascii=False)
    # Looked at again: nothing new, nothing sent again.
    await get_json(base, "api/usage", "ada")
    await asyncio.sleep(0.5)
    assert len(hook.bodies) == 1 and len(NoticeStore(ctx.engine).active("ada")) == 1


async def test_a_session_the_readings_barely_covered_is_not_counted(service):
    base, ctx = service
    three_small_sessions(ctx, "ada")
    with ctx.engine.begin() as conn:  # read for a tenth of each: too little to count
        conn.execute(update(sessions).where(sessions.c.user_name == "ada").values(
            gpu_memory_read_ms=sessions.c.billed_ms / 10))
    code, data = await get_json(base, "api/usage", "ada")
    assert code == 200 and data["advice"] == []
    code, report = await get_json(base, "api/right-sizing", "admin")
    (row,) = report["profiles"]
    assert row["fits_smaller_percent"] is None  # nothing read well enough to say


async def test_advice_too_long_for_one_notice_never_fails_the_usage_page(service):
    """Seven advices due on one server do not fit one notice in full (2,000 characters):
    they are told in short, and the usage API and page answer as ever."""
    base, ctx = service
    for i in range(7):
        slug = f"h200-full-interactive-{i}"
        ctx.profiles.upsert(parse_profile(profile(slug, {"model": "H200", "count": 1}, "8.00"),
                                          ctx.catalog, slug=slug))
        for j in range(3):
            # a session of "work" every 3 hours: never two at once
            closed_session(ctx, "ada", "work", slug, 8_000_000, 100 - 10 * i - 3 * j, 40,
                           2.0, 5.0)
    code, data = await get_json(base, "api/usage", "ada")
    assert code == 200 and len(data["advice"]) == 7
    assert (await fetch(base, "usage", "ada")).code == 200
    (notice,) = NoticeStore(ctx.engine).active("ada")
    assert len(notice.message) <= 2000
    assert all(f"h200-full-interactive-{i} →" in notice.message for i in range(7))


async def test_a_later_advice_waits_while_an_unseen_one_is_open(service, hook):
    """A right-sizing notice open on a server is left for a week before later advice
    there replaces it (a second notice would clear the first unseen); the later advice is
    told once that one is dismissed, and nothing is sent twice."""
    base, ctx = service
    NoticeStore(ctx.engine).set_prefs("ada", "webhook", "")
    three_small_sessions(ctx, "ada")
    await get_json(base, "api/usage", "ada")
    (first,) = NoticeStore(ctx.engine).active("ada")
    for i in range(3):  # later, a full card's sessions are due advice too, on "work"
        closed_session(ctx, "ada", "work", "h200-full", 8_000_000, 6 - 1.5 * i, 40, 50.0, 20.0)
    code, data = await get_json(base, "api/usage", "ada")
    assert len(data["advice"]) == 2  # the usage page shows both at once
    assert [n.id for n in NoticeStore(ctx.engine).active("ada")] == [first.id]
    NoticeStore(ctx.engine).clear("ada", None, ["right_size"])  # dismissed on the hub's page
    await get_json(base, "api/usage", "ada")
    (later,) = NoticeStore(ctx.engine).active("ada")
    assert "h200-full → h200-3g" in later.message and "h200-3g → h200-1g" not in later.message
    await asyncio.to_thread(hook.wait, 2)
    await asyncio.sleep(0.3)
    assert len(hook.bodies) == 2  # each advice sent once


async def test_pages_say_no_reading_and_what_may_be_slower(service):
    base, ctx = service
    closed_session(ctx, "bob", "", "h200-full", 8_000_000, 5, 60, 100.0, 2.0)
    with ctx.engine.begin() as conn:  # a profile whose sessions' memory was never read
        conn.execute(update(sessions).values(gpu_memory_read_ms=0, gpu_memory_peak_bytes=None))
    page = await fetch(base, "admin/report", "admin")
    assert page.code == 200
    html = page.body.decode()
    row = html[html.index('id="right-sizing"'):]
    assert "no reading" in row[:row.index("</table>")]
    # Mean activity keeps up on the 1g slice; the peaks (scaled past 100 %) would not.
    for i in range(3):
        closed_session(ctx, "ada", "work", "h200-3g", 3_600_000, 48 - 10 * i, 40, 2.0, 20.0)
    with ctx.engine.begin() as conn:
        conn.execute(update(sessions).where(sessions.c.user_name == "ada")
                     .values(gpu_activity_peak=60.0))
    code, data = await get_json(base, "api/usage", "ada")
    (advice,) = data["advice"]
    assert (advice["suggest"], advice["speed_known"], advice["slower_up_to"]) == (
        "h200-1g", True, 3.0)
    html = (await fetch(base, "usage", "ada")).body.decode()
    # said once, in the advice's own words
    assert html.count("busiest moments may run up to 3× slower") == 1
    assert "not read throughout" not in html
