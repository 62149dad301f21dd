"""The rule for spawns left queued by a previous hub (gpulease.hub.servers.queue_resume.plan_resume).

Pure: the rows, what the new hub knows of each server, the profiles in; what starts
again (in order, with which options) and what is skipped (and why) out. The hub's
own restart is tests/e2e/test_queue_restart.py.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import replace
from decimal import Decimal

from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.hub.servers.queue_resume import Resume, ServerNow, Skip, plan_resume, resume_in_order
from gpulease.store.queue_store import QueuedSpawn, QueueStore

T0 = dt.datetime(2025, 1, 1)
SLICE = Profile(slug="slice", display_name="Slice", description="",
                gpu=GpuSpec("H200", "1g.18gb"), cpu=Decimal("1"), memory_bytes=1 << 30,
                images=("mock",), price_per_hour_ucr=1_000_000, min_run_s=60,
                idle_timeout_s=1800, max_runtime_s=0)
PROFILES = {"slice": SLICE, "lab-only": replace(SLICE, slug="lab-only", groups=("lab",)),
            "off": replace(SLICE, slug="off", enabled=False)}


def row(user: str, server: str = "", profile: str = "slice", position: int = 1) -> QueuedSpawn:
    return QueuedSpawn(user, server, profile, position, T0)


def here(saved: dict | None = None, **kw) -> ServerNow:
    return ServerNow(user_exists=True, saved_options=saved, **kw)


def test_rows_start_again_in_queue_order_with_their_saved_options():
    rows = [row("bob", "w", position=2), row("ada", position=1), row("cy", position=3)]
    saved = {"profile": "slice", "image": "mock", "account": "group:lab"}
    servers = {("ada", ""): here(saved), ("bob", "w"): here({"profile": ["slice"]}),
               ("cy", ""): here({"profile": "cpu"})}
    assert plan_resume(rows, servers, PROFILES) == [
        Resume("ada", "", "slice", saved),  # the image and account chosen too
        Resume("bob", "w", "slice", {"profile": ["slice"]}),  # a form's list of one
        # saved options naming another profile (or none): the row's profile
        Resume("cy", "", "slice", {"profile": "slice"}),
    ]


def test_what_is_skipped_and_why():
    rows = [row(u, s, p, i) for i, (u, s, p) in enumerate([
        ("gone", "", "slice"), ("ada", "deleted", "slice"), ("bob", "", "slice"),
        ("cy", "", "vanished"), ("dee", "", "off"), ("eli", "", "lab-only"),
        ("fay", "", "lab-only")], start=1)]
    servers = {("ada", "deleted"): here(server_exists=False), ("bob", ""): here(active=True),
               ("cy", ""): here(), ("dee", ""): here(), ("eli", ""): here(),
               ("fay", ""): here(user_groups=frozenset({"lab"}))}
    plan = plan_resume(rows, servers, PROFILES)
    assert [(s.user, s.why) for s in plan if isinstance(s, Skip)] == [
        ("gone", "the user no longer exists"),
        ("ada", "the named server no longer exists"),
        ("bob", "the server is running or starting already"),
        ("cy", "profile vanished no longer exists"),
        ("dee", "profile off is disabled"),
        ("eli", "profile lab-only is no longer allowed to eli (groups: lab)"),
    ]
    assert plan[-1] == Resume("fay", "", "lab-only", {"profile": "lab-only"})
    assert plan[0].message() == ("Queued start of gone/(default) (slice), left by the "
                                 "previous hub, is not started again: the user no longer exists")


async def test_each_row_is_decided_at_its_turn_and_only_the_previous_hubs_row_goes(engine, caplog):
    """While ada's start is sent again, bob deletes his named server and cy starts her
    server herself (her spawn waits in the new hub's queue, with a row of its own). bob's
    server is not made again and started; cy's is not started twice, and her new row
    stays (it was removed, so her waiting spawn vanished from the queue's table and from
    the next restart). The real queue table; the hub's side (what its ORM says, the POST)
    are stand-ins: tests/e2e/test_queue_restart.py is the hub's own restart."""
    queue = QueueStore(engine)
    for user, server in (("ada", ""), ("bob", "w"), ("cy", "")):
        queue.add(user, server, "slice")
    left = queue.rows()
    servers = {("ada", ""): here(), ("bob", "w"): here(), ("cy", ""): here()}
    sent: list[Resume] = []

    async def start_again(step: Resume) -> None:  # stand-in for the hub's REST API
        sent.append(step)
        if step.user == "ada":  # meanwhile, on the new hub
            servers["bob", "w"] = here(server_exists=False)
            queue.add("cy", "", "slice")
            servers["cy", ""] = here(active=True)

    await resume_in_order(left, lambda u, s: servers[u, s], queue, lambda: list(PROFILES.values()),
                          start_again, logging.getLogger("test"))
    assert [(s.user, s.server) for s in sent] == [("ada", "")]
    assert [(r.user, r.position) for r in queue.rows()] == [("cy", 1)]  # her spawn's row
    assert "bob/w (slice), left by the previous hub, is not started again: the named " \
        "server no longer exists" in caplog.text
    assert "cy/(default) (slice), left by the previous hub, is not started again: the " \
        "server is running or starting already" in caplog.text
