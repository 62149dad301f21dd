"""End to end: the billing database (PostgreSQL) goes away while servers run.

The database is reached through a TCP proxy the test cuts, so the machine's
shared PostgreSQL server is never stopped. While it is away: spawns are refused
with a clear message, running servers keep running; when it returns, sessions
are billed up to their last confirmed heartbeat — no lost, no invented seconds.
"""

from __future__ import annotations

import time

import pytest
import requests
from sqlalchemy import make_url

from tests.support.hubproc import HubProcess
from tests.support.tcpproxy import CuttableProxy

pytestmark = pytest.mark.e2e

PW = "admin-secret-pw"
HEARTBEAT = 1.0


@pytest.fixture
def proxied_postgres(postgres_database):
    url = make_url(postgres_database)
    proxy = CuttableProxy((url.host or "127.0.0.1", url.port or 5432)).start()
    yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxy.close()


def usage(hub, token) -> dict[str, dict]:
    r = hub.service("GET", "api/usage", token)
    assert r.status_code == 200, r.text
    return {s["server"]: s for s in r.json()["sessions"]}


def test_database_outage(tmp_path, proxied_postgres):
    proxy, db_url = proxied_postgres
    hub = HubProcess(state=tmp_path / "state", admin_password=PW, extra_args=[
        f"--GPULeaseHub.billing_db_url={db_url}",
        f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1",
    ]).start()
    try:
        admin = hub.token_for("admin", PW)
        hub.grant(admin, "user:admin", "10")
        ready = hub.start_servers("admin", admin, {"long": {"profile": "cpu"},
                                                   "short": {"profile": "cpu"}})
        ready_at = {server: srv["ready_at"] for server, srv in ready.items()}
        asked_at = {server: srv["asked_at"] for server, srv in ready.items()}

        def billed_as_it_ran(session: dict, stopped: float) -> bool:
            """Billed from its launch (after it was asked for, before it was seen ready)
            to its stop, within the client's 0.3 s polling at either end."""
            billed_s = session["billed_ms"] / 1000
            return stopped - ready_at[session["server"]] - 0.7 <= billed_s \
                <= stopped - asked_at[session["server"]] + 0.7
        time.sleep(2 * HEARTBEAT)

        proxy.cut()
        cut_at = time.monotonic()
        # spawns are refused with a clear message, not a bare 500
        r = hub.api("POST", "users/admin/servers/new", admin, {"user_options": {"profile": "cpu"}})
        assert r.status_code == 503, r.text
        assert "database" in r.json()["message"]
        r = hub.service("GET", "api/usage", admin)
        assert r.status_code == 503 and "database" in r.json()["message"], r.text
        # running servers keep running and answer through the proxy
        status = requests.get(hub.server_url("admin", "long", "api/status"),
                              headers={"Authorization": f"token {admin}"}, timeout=10)
        assert status.status_code == 200
        # a server stopped during the outage is billed up to its stop
        assert hub.api("DELETE", "users/admin/servers/short", admin).status_code in (202, 204)
        hub.wait_server_stopped("admin", admin, "short")
        short_stopped = time.monotonic()
        time.sleep(3 * HEARTBEAT)

        proxy.restore()
        time.sleep(3 * HEARTBEAT)
        sessions = usage(hub, admin)
        short = sessions["short"]
        assert short["end_reason"] == "user"
        # Its close waited 3 heartbeats for the database, and was written with the time
        # of the stop (to the millisecond), not of the write.
        assert billed_as_it_ran(short, short_stopped), short
        long_open = sessions["long"]
        assert long_open["ended"] is None
        # confirmed through the outage: the server ran, so its seconds count
        now = time.monotonic()
        assert long_open["billed_ms"] / 1000 >= now - ready_at["long"] - 2 * HEARTBEAT - 1
        assert cut_at - ready_at["long"] < long_open["billed_ms"] / 1000

        assert hub.api("DELETE", "users/admin/servers/long", admin).status_code in (202, 204)
        hub.wait_server_stopped("admin", admin, "long")
        stopped = time.monotonic()
        final = usage(hub, admin)["long"]
        assert billed_as_it_ran(final, stopped), final
    finally:
        hub.close()
