"""The culler's pass over a FAKE hub: pagination, 2,000 servers, dead kernel endpoints, stops."""

from __future__ import annotations

from datetime import timedelta

import aiohttp
import pytest

from gpulease.idle_culler.app import make_app
from tests.culler_fakehub import (
    REF,
    STOPPED_KINDS,
    Clock,
    RecordingNotices,
    culler_for,
    free_port,
    make_server,
    start,
)


@pytest.mark.parametrize("images", ["singleuser", "plain", "mixed"])
async def test_one_pass_over_2000_servers_suspends_only_the_idle_ones(images):
    """The same decisions whether servers answer gpulease/activity (one read) or
    only jupyter_server's api/kernels and api/terminals (an image without
    gpulease.singleuser)."""
    decide_at = REF + timedelta(minutes=31)
    servers = [make_server(i, decide_at - timedelta(minutes=1)) for i in range(2000)]
    for i, s in enumerate(servers):
        s.singleuser = images == "singleuser" or (images == "mixed" and i % 7 < 3)
    hub, http, client = await start(servers)
    clock = Clock(REF)
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
    assert by_kind["dead-hang-cpu-idle"].signals["kernels"] == "unknown: no answer in time"
    assert "neither kernels nor CPU" in by_kind["dead-503-cpu-unknown"].reason
    assert by_kind["dead-503-cpu-unknown"].signals["kernels"] == "unknown: HTTP 503"
    assert by_kind["gpu-memory-only"].signals["gpu"].startswith("0.0% compute")
    assert by_kind["hub-recent"].signals["kernels"].startswith("not read")
    # Servers busy by the cheap signals were not asked for their kernels.
    assert report.read == 1400
    # One request per server read where gpulease.singleuser answers; where it
    # does not, the first 404 is remembered and the two plain reads follow.
    plain = {s.key for s in servers if not s.singleuser}
    answered = {s.key for s in servers if not s.kernels_fail
                and not report.decisions[s.key].signals["kernels"].startswith("not read")}
    assert culler.plain_servers == (plain & answered) - expected
    if images == "singleuser":
        assert hub.server_reads <= 2 * 1400
    assert len(culler.memory) == 2000 - len(expected)


async def test_warning_then_activity_cancels_it():
    server = make_server(0, REF)
    hub, http, client = await start([server])
    clock, notices = Clock(REF), RecordingNotices()
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
    assert health["service"] == "gpulease-culler" and health["last_pass"]["servers"] == 10


async def test_a_hung_server_moves_to_the_slow_lane_and_is_never_suspended_unconfirmed():
    hung = make_server(7, REF)  # kernels endpoint hangs
    servers = [hung]
    hub, http, client = await start(servers, hang_s=1.0)
    clock = Clock(REF)
    culler = culler_for(client, servers, clock)
    culler.cpu.values[hung.key] = None  # and its CPU cannot be read either
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(hours=3)
        report = await culler.run_pass()
        decision = report.decisions[hung.key]
        assert decision.action == "keep" and "neither kernels nor CPU" in decision.reason
        assert hung.key in culler.slow
        assert hub.stops == []
        # Once it answers again it leaves the slow lane; its idle kernels confirm the idleness.
        hung.kernels_fail = ""
        report = await culler.run_pass()
        assert hung.key not in culler.slow
        assert report.decisions[hung.key].action == "suspend"
        assert hub.stops == [{"user": "u7", "server": "", "reason": "idle"}]
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
    hub, http, client = await start(servers)
    clock = Clock(REF)
    culler = culler_for(client, servers, clock)
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(minutes=30)
        report = await culler.run_pass()
        assert {k for k, d in report.decisions.items() if d.action == "warn"} >= {
            s.key for s in warned}
        assert all(culler.deadlines[s.key] == REF + timedelta(minutes=33) for s in warned)
        pages, reads, user_reads = hub.pages, hub.server_reads, hub.user_reads
        stopped_before = len(hub.stops)
        clock.now = REF + timedelta(minutes=33, seconds=1)
        due = culler.due_warnings()
        assert set(due) == set(culler.deadlines) and {s.key for s in warned} <= set(due)
        # one warned server became active meanwhile: its re-check keeps it
        warned[0].kernel_state = "busy"
        report = await culler.recheck(due)
        assert hub.pages == pages  # no listing of every user
        assert hub.user_reads - user_reads == len({u for u, _ in due})
        assert hub.server_reads - reads == len(due)
        assert set(report.decisions) == set(due)
        assert report.decisions[warned[0].key].action == "keep"
        assert {(b["user"], b["server"]) for b in hub.stops[stopped_before:]} == {
            k for k in due if k != warned[0].key}
        assert culler.deadlines == {}
    finally:
        http.stop()
        await client.close()
