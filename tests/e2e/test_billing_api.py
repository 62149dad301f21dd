"""End to end: the billing API, CLI and pages of the gpulease service on a real hub.

One hub for the module. Users: admin, alice (member of hub group `lab`), bob,
carol (sessions written straight into the billing database) and audrey (in the
`auditors` group, configured with --GPULeaseHub.auditor_groups).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import time

import pytest
import requests

from gpulease.core.clock import utcnow
from gpulease.hub.service import billing_views as bv
from gpulease.store.db import open_database, sqlite_url
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger
from tests.support.hubproc import ADMIN_PW, HubOptions

pytestmark = pytest.mark.e2e
PW = {name: f"{name}-pw-12345" for name in ("alice", "bob", "carol", "audrey")}
XSS = "<script>alert(1)</script>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(args=['--GPULeaseHub.auditor_groups=["auditors"]'])


@pytest.fixture(scope="module")
def tokens(hub) -> dict[str, str]:
    admin = hub.admin_token
    for name, pw in PW.items():
        r = hub.service("POST", "api/users", admin, {"name": name, "password": pw})
        assert r.status_code == 201, r.text
    for group, members in (("auditors", ["audrey"]), ("lab", ["alice", "carol"])):
        hub.api("POST", f"groups/{group}", admin)  # 409 when it exists already: fine
        r = hub.api("POST", f"groups/{group}/users", admin, {"users": members})
        assert r.status_code == 200, r.text
    return {"admin": admin, **{name: hub.token_for(name, pw) for name, pw in PW.items()}}


@pytest.fixture(scope="module")
def engine(hub):
    eng = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    yield eng
    eng.dispose()


def balance(hub, tokens, account: str) -> str:
    user = account.split(":", 1)[1]
    accounts = hub.service("GET", f"api/balance?user={user}", tokens["admin"]).json()["accounts"]
    return {a["account"]: a["balance"] for a in accounts}.get(account, "0.000000")


def test_anonymous_is_refused_everywhere(hub):
    for method, path in [("GET", "api/balance"), ("GET", "api/usage"), ("POST", "api/credits"),
                         ("POST", "api/adjustments"), ("POST", "api/stop"),
                         ("PUT", "api/accounts/group:lab/caps/alice")]:
        r = requests.request(method, f"{hub.urls.service()}{path}", json={}, timeout=10)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["status"] == 403 and r.json()["message"]


def test_only_admins_write_and_only_auditors_read_others(hub, tokens):
    body = {"account": "user:alice", "amount": "5", "note": "x"}
    for who in ("alice", "audrey"):
        assert hub.service("POST", "api/credits", tokens[who], body).status_code == 403
        assert hub.service("POST", "api/adjustments", tokens[who], body).status_code == 403
        r = hub.service("PUT", "api/accounts/group:lab/caps/alice", tokens[who], {"monthly": "1"})
        assert r.status_code == 403
    assert hub.service("GET", "api/usage?user=bob", tokens["alice"]).status_code == 403
    assert hub.service("GET", "api/balance?user=bob", tokens["alice"]).status_code == 403
    assert hub.service("GET", "api/usage?user=bob", tokens["audrey"]).status_code == 200
    assert hub.service("GET", "api/balance?user=bob", tokens["audrey"]).status_code == 200
    assert hub.service("GET", "api/usage?user=alice", tokens["alice"]).status_code == 200
    assert hub.service("GET", "api/balance?user=nobody", tokens["admin"]).status_code == 404


def test_grants_and_adjustments(hub, tokens):
    r = hub.service("POST", "api/credits", tokens["admin"],
                    {"account": "user:alice", "amount": "10", "note": "welcome"})
    assert r.status_code == 201, r.text
    entry = r.json()
    assert entry["account"] == "user:alice" and entry["kind"] == "grant"
    assert entry["amount"] == "10.000000" and entry["balance"] == "10.000000"
    assert entry["note"] == "welcome" and entry["actor"] == "admin"
    assert entry["created"].endswith("Z") and isinstance(entry["id"], int)
    r = hub.service("POST", "api/credits", tokens["admin"], {"user": "bob", "amount": 1})
    assert r.status_code == 201 and r.json()["account"] == "user:bob"
    r = hub.service("POST", "api/credits", tokens["admin"], {"account": "group:lab", "amount": "50"})
    assert r.status_code == 201 and r.json()["balance"] == "50.000000"
    r = hub.service("POST", "api/adjustments", tokens["admin"],
                    {"account": "bob", "amount": "-0.25", "note": "refund of a mistake"})
    assert r.status_code == 201 and r.json()["balance"] == "0.750000", r.text
    assert r.json()["kind"] == "adjustment" and r.json()["amount"] == "-0.250000"


def _raw(hub, token, path: str, body: str) -> requests.Response:
    return requests.post(f"{hub.urls.service()}{path}", data=body, timeout=30,
                         headers={"Authorization": f"token {token}",
                                  "Content-Type": "application/json"})


def test_a_json_number_stays_exact(hub, tokens):
    before = balance(hub, tokens, "user:bob")
    r = _raw(hub, tokens["admin"], "api/credits",
             '{"account": "user:bob", "amount": 0.1, "note": "float-looking"}')
    assert r.status_code == 201, r.text
    assert r.json()["amount"] == "0.100000"
    whole, frac = before.split(".")
    assert balance(hub, tokens, "user:bob") == f"{whole}.{int(frac) + 100000:06d}"


@pytest.mark.parametrize("path, body, field, words", [
    ("api/credits", {"account": "user:alice", "amount": "0"}, "amount", "zero"),
    ("api/credits", {"account": "user:alice", "amount": 0}, "amount", "zero"),
    ("api/credits", {"account": "user:alice", "amount": "-5"}, "amount", "positive"),
    ("api/credits", {"account": "user:alice", "amount": "ten"}, "amount", "not an amount"),
    ("api/credits", {"account": "user:alice", "amount": "1.0000001"}, "amount", "decimals"),
    ("api/credits", {"account": "user:alice", "amount": "9223372036854.775808"}, "amount", "range"),
    ("api/credits", {"account": "user:alice", "amount": "1e30"}, "amount", ""),
    ("api/credits", {"account": "user:alice"}, "amount", "required"),
    ("api/credits", {"account": "user:nobody", "amount": "5"}, "account", "unknown user nobody"),
    ("api/credits", {"user": "nobody", "amount": "5"}, "user", "unknown user nobody"),
    ("api/credits", {"account": "team:x", "amount": "5"}, "account", "not an account"),
    ("api/adjustments", {"account": "group:nope", "amount": "5", "note": "n"}, "account", "unknown account"),
    ("api/adjustments", {"account": "user:alice", "amount": "-1"}, "note", "note"),
    ("api/adjustments", {"account": "user:alice", "amount": "-1", "note": "  "}, "note", "note"),
    ("api/adjustments", {"account": "user:alice", "amount": "0", "note": "n"}, "amount", "zero"),
    ("api/adjustments", {"account": "user:alice", "amount": "-1.0000001", "note": "n"}, "amount", "decimals"),
])
def test_bad_entries_are_400_and_write_nothing(hub, tokens, engine, path, body, field, words):
    rows = len(Ledger(engine).entries())
    before = balance(hub, tokens, "user:alice")
    r = hub.service("POST", path, tokens["admin"], {"note": "n", **body} if path == "api/credits" else body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["status"] == 400 and words.lower() in err["message"].lower()
    assert [e["field"] for e in err["errors"]] == [field]
    assert len(Ledger(engine).entries()) == rows
    assert balance(hub, tokens, "user:alice") == before


def test_overflowing_sum_is_refused(hub, tokens, engine):
    r = hub.service("POST", "api/credits", tokens["admin"],
                    {"account": "group:big", "amount": "9223372036854.775807"})
    assert r.status_code == 201, r.text
    rows = len(Ledger(engine).entries())
    r = hub.service("POST", "api/credits", tokens["admin"], {"account": "group:big", "amount": "1"})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "amount"
    assert len(Ledger(engine).entries()) == rows


def test_balance_shape_low_and_minutes_left(hub, tokens):
    admin = tokens["admin"]
    base = {"display_name": "Lab CPU", "cpu": 1, "memory": "1Gi", "images": ["pytorch"]}
    for slug, extra in (("lab-cpu", {"price_per_hour": "2", "groups": ["lab"]}),
                        ("free-cpu", {"price_per_hour": "0"})):
        r = hub.service("PUT", f"api/profiles/{slug}", admin, {**base, **extra})
        assert r.status_code in (200, 201), r.text
    alice = hub.service("GET", "api/balance", tokens["alice"]).json()
    assert set(alice) == {"user", "balance", "accounts", "low", "minutes_left"}
    assert alice["user"] == "alice" and alice["balance"] == "10.000000"
    assert alice["accounts"] == [{"account": "user:alice", "balance": "10.000000"},
                                 {"account": "group:lab", "balance": "50.000000"}]
    # 10 credits at 0.10/h, 1.20/h, 8/h and 2/h; free profiles are left out
    assert alice["minutes_left"] == {"cpu": 6000, "h200-1g": 500, "h200-full": 75, "lab-cpu": 300}
    assert alice["low"] is False
    bob = hub.service("GET", "api/balance", tokens["bob"]).json()
    assert bob["accounts"] == [{"account": "user:bob", "balance": "0.850000"}]
    assert "lab-cpu" not in bob["minutes_left"]  # not in the lab group
    assert bob["minutes_left"]["h200-full"] == 6 and bob["low"] is True  # under 10 minutes
    nobody = hub.service("GET", "api/balance", tokens["audrey"]).json()
    assert nobody["balance"] == "0.000000" and nobody["low"] is True
    assert set(nobody["minutes_left"].values()) == {0}


def test_caps(hub, tokens):
    admin, url = tokens["admin"], "api/accounts/group:lab/caps/alice"
    r = hub.service("PUT", url, admin, {"monthly": "5.5"})
    assert r.status_code == 200, r.text
    assert r.json() == {"account": "group:lab", "user": "alice", "monthly": "5.500000"}
    assert hub.service("GET", url, tokens["audrey"]).json()["monthly"] == "5.500000"
    assert hub.service("PUT", url, admin, {"monthly": None}).json()["monthly"] is None
    assert hub.service("GET", url, admin).json()["monthly"] is None
    assert hub.service("PUT", "api/accounts/group:nope/caps/alice", admin, {"monthly": "1"}).status_code == 404
    assert hub.service("PUT", "api/accounts/group:lab/caps/nobody", admin, {"monthly": "1"}).status_code == 404
    for bad in ({"monthly": "-1"}, {"monthly": "x"}, {"monthly": "1.0000001"}):
        r = hub.service("PUT", url, admin, bad)
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == "monthly", r.text
    assert hub.service("PUT", url, admin, {"cap": "1"}).status_code == 400


@pytest.fixture(scope="module")
def carol_sessions(engine):
    """Three closed sessions of carol's, written as the metering would."""
    ledger = SessionLedger(engine)
    now = utcnow().replace(microsecond=0)
    made = []
    for server, profile, account, rate, start, seconds in [
        ("", "h200-1g", "user:carol", 1_200_000, now - dt.timedelta(days=2), 3600.5),
        (XSS, "cpu", "user:carol", 100_000, now - dt.timedelta(days=1), 60),
        ("old", "h200-full", "group:lab", 8_000_000, now - dt.timedelta(days=40), 10),
    ]:
        s = ledger.open("carol", server, profile, account, rate, start)
        made.append(ledger.close(s.id, start + dt.timedelta(seconds=seconds), "idle"))
    return made


def test_usage_json_and_csv(hub, tokens, carol_sessions):
    first, second, old = carol_sessions
    # Without a range: the current UTC month only (carol's sessions may straddle its start).
    month = utcnow().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    this_month = hub.service("GET", "api/usage", tokens["carol"]).json()["sessions"]
    assert [s["server"] for s in this_month] == [
        s.server for s in sorted(carol_sessions, key=lambda s: s.started) if s.started >= month]
    # all three: a range that holds them (since inclusive, until left out: the month's end)
    span = f"since={(old.started - dt.timedelta(days=1)).date()}"
    data = hub.service("GET", f"api/usage?{span}", tokens["carol"]).json()
    assert [s["server"] for s in data["sessions"]] == ["old", "", XSS]
    s = data["sessions"][1]
    assert s == {"user": "carol", "server": "", "profile": "h200-1g", "tier": "on-demand",
                 "account": "user:carol",
                 "started": first.started.isoformat() + "Z", "ended": s["ended"],
                 "billed_seconds": 3601, "billed_ms": 3_600_500, "cost": "1.200167",
                 "end_reason": "idle", "reservation": None,  # ceil(3,600,500 ms × 1.2 credits/h)
                 "gpu": {"mean_activity": None, "peak_activity": None,  # no culler readings here
                         "peak_memory_bytes": None, "source": None}}
    assert data["totals"] == {"billed_seconds": 3601 + 60 + 10,
                              "billed_ms": 3_600_500 + 60_000 + 10_000, "cost": "1.224057"}
    since = second.started.isoformat() + "Z"
    recent = hub.service("GET", f"api/usage?user=carol&since={since}", tokens["admin"]).json()
    assert [s["server"] for s in recent["sessions"]] == [XSS]
    until = old.started.isoformat() + "Z"
    assert hub.service("GET", f"api/usage?user=carol&{span}&until={until}", tokens["audrey"]).json()["sessions"] == []
    by_account = hub.service("GET", f"api/usage?account=group:lab&{span}", tokens["audrey"]).json()
    assert [s["server"] for s in by_account["sessions"]] == ["old"]
    assert hub.service("GET", "api/usage", tokens["admin"]).json()["sessions"] == []  # own by default
    bad = hub.service("GET", "api/usage?since=yesterday", tokens["carol"])
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "since"
    r = hub.service("GET", f"api/usage?format=csv&{span}", tokens["carol"])
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in r.headers["Content-Disposition"] and ".csv" in r.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert list(rows[0]) == ["user", "server", "profile", "tier", "account", "started", "ended",
                             "billed_seconds", "billed_ms", "cost", "end_reason", "reservation",
                             "gpu_mean_activity", "gpu_peak_activity", "gpu_peak_memory_bytes",
                             "gpu_source"]
    # the JSON's `gpu` object is the CSV's flat gpu_* columns
    flat = [{k: v for k, v in s.items() if k != "gpu"} for s in bv.csv_rows(data["sessions"])]
    assert [dict(row) for row in rows] == [{k: "" if v is None else str(v) for k, v in s.items()}
                                           for s in flat]


def test_stop_validation_and_permissions(hub, tokens):
    def stop(who: str, **body):
        return hub.service("POST", "api/stop", tokens[who], {"user": "alice", "server": "", **body})

    r = stop("admin", reason="bored")
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "reason"
    assert "out_of_credit" in r.json()["message"] and "idle" in r.json()["message"]
    for wrong, said in ((None, "null (no value)"), (1, "the number 1"), (["idle"], "a list")):
        r = stop("admin", reason=wrong)  # a JSON value named as written, not as Python's repr
        assert r.status_code == 400 and said in r.json()["message"], r.text
        assert "None" not in r.json()["message"] and "['" not in r.json()["message"]
    assert stop("bob", reason="user").status_code == 403  # not bob's server
    assert stop("alice", reason="idle").status_code == 403  # users stop with "user" only
    assert stop("admin", reason="admin", user="nobody").status_code == 404
    assert stop("admin", reason="admin").status_code in (404, 409)  # never started
    assert stop("alice", reason="user", server="nothing-here").status_code == 404


def _wait_usage(hub, token, server: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for s in hub.service("GET", "api/usage", token).json()["sessions"]:
            if s["server"] == server and s["ended"]:
                return s
        time.sleep(0.5)
    raise AssertionError(f"no closed session for {server!r}:\n{hub.log()[-3000:]}")


def test_stop_a_running_server_with_a_reason(hub, tokens):
    alice = tokens["alice"]
    for server, who, reason in (("", "alice", "user"), ("nightly", "admin", "idle")):
        path = "users/alice/server" if not server else f"users/alice/servers/{server}"
        r = hub.api("POST", path, alice, {"user_options": {"profile": "cpu"}})
        assert r.status_code in (201, 202), r.text
        hub.wait_server_ready("alice", alice, server)
        r = hub.service("POST", "api/stop", tokens[who], {"user": "alice", "server": server, "reason": reason})
        assert r.status_code == 202, r.text
        assert r.json() == {"user": "alice", "server": server, "reason": reason}
        hub.wait_server_stopped("alice", alice, server)
        session = _wait_usage(hub, alice, server)
        assert session["end_reason"] == reason and session["profile"] == "cpu"
    r = hub.service("POST", "api/stop", tokens["admin"], {"user": "alice", "server": "nightly", "reason": "admin"})
    assert r.status_code in (404, 409), r.text  # stopped: nothing to stop


def test_cli_credits_and_usage(hub, tokens):
    ok = hub.cli("credits", "grant", "bob", "2.5", "--note", "from the CLI")
    assert ok.returncode == 0, ok.stderr
    assert "2.500000" in ok.stdout and "user:bob" in ok.stdout
    adj = hub.cli("credits", "adjust", "user:bob", "-0.5", "--note", "typo")
    assert adj.returncode == 0 and "-0.500000" in adj.stdout, adj.stderr
    before = balance(hub, tokens, "user:bob")
    for args, words in [(("grant", "bob", "0"), "amount"), (("grant", "bob", "-1"), "amount"),
                        (("grant", "bob", "1.1234567"), "decimals"), (("grant", "ghost", "1"), "unknown user ghost"),
                        (("adjust", "group:nope", "1", "--note", "n"), "unknown account")]:
        bad = hub.cli("credits", *args)
        assert bad.returncode == 1 and words in bad.stderr, (args, bad.stderr)
        assert "HTTP 400" in bad.stderr
    assert hub.cli("credits", "adjust", "bob", "-1").returncode == 2  # --note is required
    assert balance(hub, tokens, "user:bob") == before
    since = (utcnow() - dt.timedelta(days=41)).date().isoformat()  # carol's three sessions
    out = hub.cli("usage", "--user", "carol", "--csv", "--since", since)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == ("user,server,profile,tier,account,started,ended,"
                                          "billed_seconds,billed_ms,cost,end_reason,reservation,"
                                          "gpu_mean_activity,gpu_peak_activity,"
                                          "gpu_peak_memory_bytes,gpu_source")
    assert len(out.stdout.splitlines()) == 4
    everyone = hub.cli("usage", "--csv", "--since", since).stdout  # the CLI's token: every user's
    assert {"carol", "alice"} <= {line.split(",")[0] for line in everyone.splitlines()[1:]}
    table = hub.cli("usage", "--user", "carol", "--since", since)
    assert table.returncode == 0 and table.stdout.splitlines()[-1].split()[-2:] == ["3670.500", "1.224057"]
    assert hub.cli("usage", "--since", "soon").returncode == 1
    too_long = hub.cli("usage", "--since", "2000-01-01")  # until left out: this month's end
    assert too_long.returncode == 1 and "at most 366 days" in too_long.stderr, too_long.stderr


def _browser(hub, user: str, password: str) -> requests.Session:
    browser = hub.login_form(user, password)
    assert browser.login_status == 302
    return browser


def test_usage_page(hub, tokens, carol_sessions):
    r = hub.service("POST", "api/credits", tokens["admin"], {"user": "carol", "amount": "3", "note": XSS})
    assert r.status_code == 201
    anonymous = requests.get(f"{hub.urls.service()}usage", timeout=30)
    assert anonymous.url.startswith(f"{hub.url}/hub/login")  # sent to the hub's login
    page = _browser(hub, "carol", PW["carol"]).get(f"{hub.urls.service()}usage", timeout=30)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    html = page.text
    assert "Usage and balance: carol" in html and "1.200167" in html and "h200-1g" in html
    assert ">3600.500</td>" in html  # billed seconds, to the millisecond
    assert "1.798166" in html  # 3 granted - 1.201834 spent (the lab paid for the third)
    assert XSS not in html and html.count(SCRIPT_ESCAPED) == 2  # server name, grant note
    svg = re.search(r"<svg.*?</svg>", html, re.S).group(0)
    assert svg.count("<rect") == 30
    day = carol_sessions[0].started.date().isoformat()
    assert f"<title>{day}: 1.200167 credits</title>" in svg
    assert "old" not in re.findall(r"<td>([^<]*)</td>", html)  # 40 days ago: not by default


def test_report_page(hub, carol_sessions):
    admin = _browser(hub, "admin", ADMIN_PW)
    page = admin.get(f"{hub.urls.service()}admin/report?since=2000-01-01&until=2100-01-01&by=user", timeout=30)
    assert page.status_code == 200, page.text[:500]
    assert re.search(r"<td>carol</td><td class=\"num\">3</td>", page.text)
    assert "format=csv" in page.text
    by_account = admin.get(f"{hub.urls.service()}admin/report?since=2000-01-01&until=2100-01-01&by=account", timeout=30)
    assert "group:lab" in by_account.text and "user:carol" in by_account.text
    data = admin.get(f"{hub.urls.service()}admin/report?since=2000-01-01&until=2100-01-01&by=profile&format=csv", timeout=30)
    assert data.headers["Content-Type"].startswith("text/csv")
    rows = {r["key"]: r for r in csv.DictReader(io.StringIO(data.text))}
    assert rows["h200-1g"]["cost"] == "1.200167" and rows["h200-full"]["billed_seconds"] == "10"
    assert rows["h200-1g"]["billed_ms"] == "3600500"
    by_profile = admin.get(f"{hub.urls.service()}admin/report?since=2000-01-01&until=2100-01-01&by=profile", timeout=30)
    assert '<td class="num">3600.500</td>' in by_profile.text
    month = admin.get(f"{hub.urls.service()}admin/report", timeout=30)
    assert month.status_code == 200 and utcnow().strftime("%Y-%m-01") in month.text
    assert admin.get(f"{hub.urls.service()}admin/report?by=colour", timeout=30).status_code == 400
    audrey = _browser(hub, "audrey", PW["audrey"])
    assert audrey.get(f"{hub.urls.service()}admin/report", timeout=30).status_code == 200
    bob = _browser(hub, "bob", PW["bob"]).get(f"{hub.urls.service()}admin/report", timeout=30)
    assert bob.status_code == 403 and "Error 403" in bob.text
