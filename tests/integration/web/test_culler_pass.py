"""The culler's pass over a FAKE hub: pagination, 2,000 servers, pushed state fresh, stale or
missing, stops; never a request to a server."""

from __future__ import annotations

import re
from datetime import timedelta

import aiohttp

from gpulease.idle_culler.app import make_app
from tests.support.culler_fakehub import (
    REF,
    STOPPED_KINDS,
    Clock,
    RecordingNotices,
    culler_for,
    free_port,
    make_server,
    start,
)


async def test_one_pass_over_2000_servers_suspends_only_the_idle_ones():
    """Kernels come from one read of what the servers pushed to the gpulease service;
    a stale push stops counting as busy; a server that never pushed is judged on
    the hub's activity, and its decision says so."""
    decide_at = REF + timedelta(minutes=31)
    servers = [make_server(i, decide_at - timedelta(minutes=1)) for i in range(2000)]
    clock = Clock(REF)
    hub, http, client = await start(servers, clock=clock)
    culler = culler_for(client, servers, clock)
    try:
        first = await culler.run_pass()  # the culler's first sight: nothing is idle yet
        assert first.stops == {} and len(first.decisions) == 2000 and first.errors == {}
        assert hub.pages == 10  # 2,000 users, 200 a page (the hub's maximum)
        clock.now = decide_at
        report = await culler.run_pass()
    finally:
        http.stop()
        await client.close()
    assert report.errors == {}
    assert len(report.decisions) == 2000
    expected = {s.key for s in servers if s.kind in STOPPED_KINDS}
    assert set(report.stops) == expected
    assert all(code == 202 for code in report.stops.values())
    assert {(b["user"], b["server"]) for b in hub.stops} == expected
    assert {b["reason"] for b in hub.stops} == {"idle"}
    by_kind = {s.kind: report.decisions[s.key] for s in servers}
    assert by_kind["busy-kernel"].action == "keep"
    assert "pushed 10s ago" in by_kind["busy-kernel"].signals["kernels"]
    stale = by_kind["stale-busy-push"].signals["kernels"]
    assert stale.startswith("1 kernel(s), 0 busy") and "stale: pushed" in stale
    no_push = by_kind["no-push-cpu-unknown"]
    assert no_push.signals["kernels"].startswith("not pushed: hub activity only")
    assert no_push.signals["cpu"].startswith("unknown") and no_push.action == "suspend"
    assert by_kind["gpu-memory-only"].signals["gpu"].startswith("0.0% compute")
    # One read of the pushed state per pass, whatever the number of servers.
    assert hub.activity_reads == [[], []]
    assert report.kernel_views == {"fresh": 1600, "stale": 200, "not_pushed": 200}
    assert len(culler.memory) == 2000 - len(expected)


async def test_nobody_is_suspended_while_the_pushed_state_is_unknown_or_on_its_way():
    """The service's pushed state unreadable, or the service just restarted (its
    memory of pushes empty): an idle server with idle CPU is kept until it can be told."""
    servers = [make_server(0, REF)]  # idle
    clock = Clock(REF)
    hub, http, client = await start(servers, clock=clock)
    culler = culler_for(client, servers, clock)
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(hours=1)
        hub.activity_fail = True
        report = await culler.run_pass()
        decision = report.decisions[servers[0].key]
        assert decision.action == "keep" and "could not be read (HubError: HTTP 503" in \
            decision.reason
        assert decision.signals["kernels"].startswith("unknown: the gpulease service's")
        # The service restarted a minute ago and this server has not pushed since.
        hub.activity_fail, hub.since = False, clock.now - timedelta(minutes=1)
        servers[0].singleuser = False
        report = await culler.run_pass()
        decision = report.decisions[servers[0].key]
        assert decision.action == "keep" and "no push yet" in decision.reason
        assert report.kernel_views == {"waiting": 1}
        assert hub.stops == []
        # Three minutes after the restart a server that still has not pushed is a
        # server that does not push: the hub's activity decides.
        clock.now += timedelta(minutes=3)
        report = await culler.run_pass()
        assert report.decisions[servers[0].key].action == "suspend"
    finally:
        http.stop()
        await client.close()


async def test_warning_then_activity_cancels_it():
    server = make_server(0, REF)
    clock, notices = Clock(REF), RecordingNotices()
    hub, http, client = await start([server], clock=clock)
    culler = culler_for(client, [server], clock, notices)
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(minutes=26)
        report = await culler.run_pass()
        assert report.decisions[server.key].action == "warn"
        assert report.decisions[server.key].deadline == REF + timedelta(minutes=30)
        await culler.run_pass()  # a warning is sent once, not every pass
        assert notices.events == [("warn", "u0", "warn")]
        server.kernel_activity = REF + timedelta(minutes=26, seconds=30)
        clock.now = REF + timedelta(minutes=27)
        report = await culler.run_pass()
        assert report.decisions[server.key].action == "keep"
        assert notices.events[-1] == ("cancel", "u0", "")
        assert hub.stops == []
    finally:
        http.stop()
        await client.close()


async def test_max_runtime_stops_busy_servers_and_unreadable_profiles_stop_nothing():
    servers = [make_server(i, REF) for i in (1, 4, 5)]  # busy kernel, CPU, GPU
    hub, http, client = await start(servers, profiles={"h200-1g": ("30m", "2h")})
    clock, notices = Clock(REF - timedelta(minutes=3)), RecordingNotices()
    culler = culler_for(client, servers, clock, notices)
    try:
        report = await culler.run_pass()
        assert {d.action for d in report.decisions.values()} == {"max_runtime_warn"}
        hub.profiles_fail = True
        clock.now = REF + timedelta(minutes=1)
        # The profiles cannot be read now, but the last pass read them: still enforced.
        report = await culler.run_pass()
        assert {b["reason"] for b in hub.stops} == {"max_runtime"} and len(hub.stops) == 3
        assert ("suspended", "u1", "stop_max_runtime") in notices.events
    finally:
        http.stop()
        await client.close()

    servers = [make_server(0, REF)]
    hub, http, client = await start(servers)
    hub.profiles_fail = True
    culler = culler_for(client, servers, Clock(REF + timedelta(hours=5)))
    try:
        report = await culler.run_pass()
        culler.clock = Clock(REF + timedelta(hours=6))
        report = await culler.run_pass()
        decision = report.decisions[servers[0].key]
        assert decision.action == "keep" and "profiles unknown" in decision.reason
        assert hub.stops == []
    finally:
        http.stop()
        await client.close()


async def test_metrics_and_health_are_served():
    servers = [make_server(i, REF) for i in range(10)]
    hub, http, client = await start(servers)
    culler = culler_for(client, servers, Clock(REF))
    port = free_port()
    app_server = make_app(culler, "/services/gpulease-culler/", public_metrics=True).listen(
        port, address="127.0.0.1")
    try:
        await culler.run_pass()
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{port}/services/gpulease-culler"
            async with session.get(f"{base}/metrics") as r:
                text = await r.text()
            async with session.get(f"{base}/") as r:
                health = await r.json()
    finally:
        app_server.stop()
        http.stop()
        await client.close()
    assert 'gpulease_server_cpu_percent{server="",user="u4"} 250.0' in text
    assert 'gpulease_server_gpu_percent{server="",user="u5"} 60.0' in text
    assert 'gpulease_culler_actions_total{action="keep"} 10.0' in text
    assert "gpulease_culler_pass_seconds_count 1.0" in text
    # when the pass ended, for the "culler not running" alert
    shown = re.search(r"^gpulease_culler_last_pass_timestamp_seconds (\S+)$", text, re.M)
    assert shown and float(shown.group(1)) == culler.last_pass[0].timestamp(), text
    assert health["service"] == "gpulease-culler" and health["last_pass"]["servers"] == 10


async def test_a_server_that_stops_pushing_counts_as_busy_only_until_its_last_push():
    """Freshness: a push that said 'busy' is believed for stale_after_s; then the
    server is idle from that push and suspended an idle timeout later."""
    server = make_server(1, REF)  # busy kernel, CPU idle
    clock = Clock(REF)
    hub, http, client = await start([server], clock=clock)
    culler = culler_for(client, [server], clock)
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(hours=3)
        report = await culler.run_pass()
        assert report.decisions[server.key].action == "keep"  # busy, pushed 10 s ago
        server.pushed = clock.now  # its last push; then the pushes stop
        clock.now += timedelta(minutes=2)
        report = await culler.run_pass()
        assert report.decisions[server.key].reason == "active now: kernels"
        clock.now += timedelta(minutes=2)  # 4 minutes: stale
        report = await culler.run_pass()
        decision = report.decisions[server.key]
        assert decision.action == "keep" and decision.idle_since == server.pushed
        clock.now = server.pushed + timedelta(minutes=30)
        report = await culler.run_pass()
        assert report.decisions[server.key].action == "suspend"
        assert hub.stops == [{"user": "u1", "server": "", "reason": "idle"}]
    finally:
        http.stop()
        await client.close()


def test_next_pass_comes_just_after_the_earliest_warned_deadline():
    import datetime as dt

    from gpulease.idle_culler.culler import Culler, CullerConfig

    now = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
    culler = Culler.__new__(Culler)
    culler.config = CullerConfig(interval_s=30.0)
    culler.clock = lambda: now
    culler.deadlines = {}
    assert culler.next_wait(28.0) == 28.0
    culler.deadlines[("a", "")] = now + dt.timedelta(seconds=10)
    assert culler.next_wait(28.0) == 10.5
    culler.deadlines[("c", "")] = now + dt.timedelta(seconds=0.1)
    assert culler.next_wait(28.0) == 0.6
    assert culler.due_warnings() == []
    culler.deadlines[("d", "x")] = now - dt.timedelta(seconds=1)
    assert culler.next_wait(28.0) == 0.5
    assert culler.due_warnings() == [("d", "x")]
    assert culler.next_wait(0.0) == 0.0


async def test_a_due_deadline_rechecks_only_the_warned_servers():
    """Between full passes, a warned server's deadline re-reads just its user:
    no listing of every user, no reads of the other servers."""
    decide_at = REF + timedelta(minutes=31)
    servers = [make_server(i, decide_at - timedelta(minutes=1)) for i in range(200)]
    warned = [s for s in servers if s.kind == "idle"][:3]
    for s in warned:  # quiet for 27 of their 30 minutes at the pass below
        s.hub_activity = s.kernel_activity = REF + timedelta(minutes=3)
    clock = Clock(REF)
    hub, http, client = await start(servers, clock=clock)
    culler = culler_for(client, servers, clock)
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(minutes=30)
        report = await culler.run_pass()
        assert {k for k, d in report.decisions.items() if d.action == "warn"} >= {
            s.key for s in warned}
        assert all(culler.deadlines[s.key] == REF + timedelta(minutes=33) for s in warned)
        pages, reads, user_reads = hub.pages, len(hub.activity_reads), hub.user_reads
        stopped_before = len(hub.stops)
        clock.now = REF + timedelta(minutes=33, seconds=1)
        due = culler.due_warnings()
        assert set(due) == set(culler.deadlines) and {s.key for s in warned} <= set(due)
        # one warned server became active meanwhile: its re-check keeps it
        warned[0].kernel_state = "busy"
        report = await culler.recheck(due)
        assert hub.pages == pages  # no listing of every user
        assert hub.user_reads - user_reads == len({u for u, _ in due})
        # one read of the pushed state, of just these users
        assert hub.activity_reads[reads:] == [sorted({u for u, _ in due})]
        assert set(report.decisions) == set(due)
        assert report.decisions[warned[0].key].action == "keep"
        assert {(b["user"], b["server"]) for b in hub.stops[stopped_before:]} == {
            k for k in due if k != warned[0].key}
        assert culler.deadlines == {}
    finally:
        http.stop()
        await client.close()
