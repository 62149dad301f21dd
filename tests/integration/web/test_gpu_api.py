"""PUT api/gpu-readings and GET api/me/gpu (issue 47) over HTTP, in-process: the service's app,
a FAKE hub that only says whose each token is (tests/support/service_app.py), and a SQLite
database.

Who may push (the culler, a gpulease admin; a researcher's token is 403), the 400s field by
field with nothing kept, the folding into the open session, and who may read a server's
GPU and cost: its owner, its own token, never another user.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpulease.core.clock import utcnow
from gpulease.store.db import sessions
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger
from tests.support.service_app import ACCESS, ctx_of, running_service

TOKENS = {
    "culler": {"kind": "service", "name": "gpulease-culler",
               "scopes": ["custom:gpulease:admin", ACCESS]},
    "ada": {"kind": "user", "name": "ada", "admin": False,
            "scopes": ["access:servers!user=ada", "read:users!user=ada", ACCESS]},
    "ada-gpu-server": {"kind": "user", "name": "ada", "admin": False,
                       "scopes": ["access:servers!server=ada/gpu", ACCESS,
                                  "users:activity!user=ada"]},
    "bob": {"kind": "user", "name": "bob", "admin": False,
            "scopes": ["access:servers!user=bob", ACCESS]},
}


@pytest.fixture
async def service(tmp_path, monkeypatch):
    async with running_service(tmp_path, monkeypatch, TOKENS) as (base, app):
        yield base, app


async def call(base: str, method: str, path: str, token: str, body=None):
    r = await AsyncHTTPClient().fetch(
        base + path, method=method, raise_error=False,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        body=None if body is None else (body if isinstance(body, bytes) else json.dumps(body)))
    data = json.loads(r.body) if r.body and r.code != 204 else None
    return r.code, data


# The servers' start as the hub lists it to the culler (before their sessions open).
STARTED = (utcnow() - dt.timedelta(hours=2)).isoformat() + "Z"


def reading(user: str, server: str, activity, used=None, source="nvml", why="",
            started: str = STARTED) -> dict:
    return {"user": user, "server": server, "started": started, "activity": activity,
            "memory_used_bytes": used, "memory_total_bytes": 80 * 2**30, "source": source,
            "why": why}


def gpu_row(engine, user: str, server: str):
    from sqlalchemy import select

    with engine.connect() as conn:
        return conn.execute(select(sessions).where(sessions.c.user_name == user,
                                                   sessions.c.server_name == server)).one()


async def test_only_the_culler_pushes_and_a_bad_entry_keeps_nothing(service):
    base, app = service
    ctx_engine = ctx_of(app).engine
    SessionLedger(ctx_engine).open("ada", "gpu", "h200-1g", "user:ada", 3_600_000, utcnow())
    body = {"servers": [reading("ada", "gpu", 40.0, 2**30)]}

    for token in ("ada", "ada-gpu-server"):
        code, data = await call(base, "PUT", "api/gpu-readings", token, body)
        assert code == 403 and "gpulease admin" in data["message"]
    assert gpu_row(ctx_engine, "ada", "gpu").gpu_activity_samples == 0

    bad = {"servers": [reading("ada", "gpu", 40.0, 2**30),
                       reading("ada", "gpu", 140.0, -1, source="smi"),
                       {"user": 5, "server": "", "extra": True, "why": "x" * 501}]}
    code, data = await call(base, "PUT", "api/gpu-readings", "culler", bad)
    assert code == 400
    fields = {e["field"] for e in data["errors"]}
    assert fields == {"servers[1].activity", "servers[1].memory_used_bytes",
                      "servers[1].source", "servers[2].user", "servers[2].extra",
                      "servers[2].why", "servers[2].started"}
    assert gpu_row(ctx_engine, "ada", "gpu").gpu_activity_samples == 0  # nothing half-written
    code, data = await call(base, "PUT", "api/gpu-readings", "culler", b"{nope")
    assert code == 400 and "not valid JSON" in data["message"]
    code, data = await call(base, "PUT", "api/gpu-readings", "culler", {"servers": {}})
    assert code == 400 and data["errors"][0]["field"] == "servers"

    assert (await call(base, "PUT", "api/gpu-readings", "culler", body))[0] == 204
    later = {"servers": [reading("ada", "gpu", None, 3 * 2**30, why="no GPM on this GPU"),
                         reading("nobody", "", 90.0)]}  # no session: skipped
    assert (await call(base, "PUT", "api/gpu-readings", "culler", later))[0] == 204
    row = gpu_row(ctx_engine, "ada", "gpu")
    assert (row.gpu_activity_samples, row.gpu_activity_sum, row.gpu_activity_peak) == \
        (1, 40.0, 40.0)
    assert row.gpu_memory_peak_bytes == 3 * 2**30 and row.gpu_reading_source == "nvml"

    code, data = await call(base, "GET", "api/usage", "ada")
    assert code == 200
    assert data["sessions"][0]["gpu"] == {"mean_activity": 40.0, "peak_activity": 40.0,
                                          "peak_memory_bytes": 3 * 2**30, "source": "nvml"}
    r = await AsyncHTTPClient().fetch(base + "api/usage?format=csv",
                                      headers={"Authorization": "token ada"})
    header, line = r.body.decode().splitlines()[:2]
    assert header.endswith("gpu_mean_activity,gpu_peak_activity,gpu_peak_memory_bytes,"
                           "gpu_source")
    assert line.endswith(f",40.0,40.0,{3 * 2**30},nvml")


async def test_a_server_and_its_owner_see_its_gpu_and_cost_nobody_else(service):
    base, app = service
    engine = ctx_of(app).engine
    Ledger(engine).grant("user:ada", 10_000_000, note="start", actor="admin")  # 10 credits
    started = utcnow() - dt.timedelta(minutes=30)
    session = SessionLedger(engine).open("ada", "gpu", "h200-1g", "user:ada", 2_000_000,
                                         started)
    SessionLedger(engine).confirm([session.id], started + dt.timedelta(minutes=30))
    pushed = {"servers": [reading("ada", "gpu", 12.5, 2**30), reading("ada", "", 99.0)]}
    assert (await call(base, "PUT", "api/gpu-readings", "culler", pushed))[0] == 204
    pushed = {"servers": [reading("ada", "gpu", 75.0, 2 * 2**30, source="gpm")]}
    assert (await call(base, "PUT", "api/gpu-readings", "culler", pushed))[0] == 204

    own_token = await call(base, "GET", "api/me/gpu", "ada-gpu-server")
    owner = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    assert own_token[0] == owner[0] == 200
    # the same answer, each at its own moment of the service's clock
    assert {**own_token[1], "now": None} == {**owner[1], "now": None}
    data = owner[1]
    assert (data["user"], data["server"], data["profile"]) == ("ada", "gpu", "h200-1g")
    assert data["rate_per_hour"] == "2.000000" and data["cost_so_far"] == "1.000000"
    assert data["balance"] == "9.000000"  # 10 granted, 1 accrued to the last heartbeat
    assert data["runway_s"] == 9 * 3600 // 2
    assert data["reading"]["activity"] == 75.0 and data["reading"]["source"] == "gpm"
    assert data["reading"]["memory_total_bytes"] == 80 * 2**30
    # a point a minute: both readings in one minute (their mean), or one each
    assert [h["activity"] for h in data["history"]] in ([43.8], [12.5, 75.0])

    # The default server was read but has no open session: nothing of it is kept, no cost,
    # the personal balance.
    code, default = await call(base, "GET", "api/me/gpu", "ada")
    assert code == 200 and default["profile"] is None and default["runway_s"] is None
    assert default["reading"] is None and default["history"] == []

    for token, path in [("bob", "api/me/gpu?server=gpu&user=ada"),  # another user's
                        ("ada-gpu-server", "api/me/gpu?server="),  # not this token's server
                        ("culler", "api/me/gpu?server=gpu")]:  # a service: no server of its own
        code, refused = await call(base, "GET", path, token)
        assert code == 403, (token, path, refused)
    # bob asking without user= sees his own (empty) server, never ada's.
    code, his = await call(base, "GET", "api/me/gpu?server=gpu", "bob")
    assert code == 200 and his["user"] == "bob" and his["reading"] is None
    assert his["history"] == [] and his["profile"] is None


async def test_a_restarted_server_shows_and_keeps_nothing_read_for_its_earlier_run(service):
    """The culler reads the servers of its last pass: a server stopped and started again
    since may be read on its earlier run's devices, another researcher's by then."""
    base, app = service
    engine = ctx_of(app).engine
    meter = SessionLedger(engine)
    first_start = utcnow() - dt.timedelta(minutes=20)
    first = meter.open("ada", "gpu", "h200-1g", "user:ada", 1_000_000, first_start)
    read_for_first = (first_start - dt.timedelta(seconds=3)).isoformat() + "Z"
    pushed = {"servers": [reading("ada", "gpu", 10.0, 2**30, started=read_for_first)]}
    assert (await call(base, "PUT", "api/gpu-readings", "culler", pushed))[0] == 204
    meter.close(first.id, utcnow() - dt.timedelta(minutes=1), "user")
    second = meter.open("ada", "gpu", "h200-1g", "user:ada", 1_000_000, utcnow())

    # Nothing of the first run shows on the second...
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    assert code == 200 and data["reading"] is None and data["history"] == []
    # ...nor does a reading taken for the first run, pushed after the restart.
    stale = {"servers": [reading("ada", "gpu", 99.0, 70 * 2**30, started=read_for_first)]}
    assert (await call(base, "PUT", "api/gpu-readings", "culler", stale))[0] == 204
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    assert data["reading"] is None and data["history"] == []
    row = gpu_row_of(engine, second.id)
    assert (row.gpu_activity_samples, row.gpu_memory_peak_bytes) == (0, None)
    # The second run's own reading is shown and kept.
    own = (utcnow() - dt.timedelta(seconds=2)).isoformat() + "Z"
    fresh = {"servers": [reading("ada", "gpu", 33.0, 2**31, started=own)]}
    assert (await call(base, "PUT", "api/gpu-readings", "culler", fresh))[0] == 204
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    assert data["reading"]["activity"] == 33.0
    assert gpu_row_of(engine, second.id).gpu_memory_peak_bytes == 2**31


def gpu_row_of(engine, session_id: int):
    from sqlalchemy import select

    with engine.connect() as conn:
        return conn.execute(select(sessions).where(sessions.c.id == session_id)).one()


async def test_the_runway_counts_the_lab_s_other_sessions_and_the_member_s_cap(service):
    base, app = service
    engine = ctx_of(app).engine
    ledger, meter = Ledger(engine), SessionLedger(engine)
    ledger.grant("group:lab", 12_000_000, note="lab credits", actor="admin")  # 12 credits
    now = utcnow()
    meter.open("ada", "gpu", "h200-1g", "group:lab", 1_000_000, now)  # 1/h
    meter.open("bob", "", "h200-1g", "group:lab", 2_000_000, now)  # 2/h, same account
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    # 12 credits at 3/h: 4 hours, not the 12 ada's own rate alone would say
    assert code == 200 and (data["runway_s"], data["runway_by"]) == (4 * 3600, "balance")
    ledger.set_cap("group:lab", "ada", 500_000)  # half a credit this month, at 1/h
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    assert (data["runway_s"], data["runway_by"]) == (1800, "cap")


async def test_a_free_server_never_runs_out_and_a_long_server_name_is_refused(service):
    base, app = service
    engine = ctx_of(app).engine
    Ledger(engine).grant("group:lab", 1_000_000, note="lab credits", actor="admin")
    now = utcnow()
    SessionLedger(engine).open("ada", "gpu", "h200-1g", "group:lab", 0, now)  # free
    SessionLedger(engine).open("bob", "", "h200-1g", "group:lab", 4_000_000, now)
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    # the lab's balance runs down for bob's server, but ada's is never stopped for money
    assert code == 200 and (data["runway_s"], data["runway_by"]) == (None, None)
    assert data["history_step_s"] == 60 and data["now"].endswith("Z")
    # readings sparser than the chart's step: the points are that far apart
    slow = {"servers": [reading("ada", "gpu", 5.0, 2**30)], "interval_s": 120}
    assert (await call(base, "PUT", "api/gpu-readings", "culler", slow))[0] == 204
    code, data = await call(base, "GET", "api/me/gpu?server=gpu", "ada")
    assert data["history_step_s"] == 120
    code, data = await call(base, "GET", "api/me/gpu?server=" + "x" * 256, "ada")
    assert code == 400 and data["errors"][0]["field"] == "server"
    # control characters count too (they are not whitespace to trim)
    code, data = await call(base, "GET", "api/me/gpu?server=%3E" + "%1E" * 255, "ada")
    assert code == 400 and data["errors"][0]["field"] == "server"
