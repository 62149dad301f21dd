"""The rule for spawns left queued by a previous hub (gpulease.hub.queue_resume.plan_resume).

Pure: the rows, what the new hub knows of each server, the profiles in; what starts
again (in order, with which options) and what is skipped (and why) out. The hub's
own restart is tests/test_e2e_queue_restart.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from decimal import Decimal

from gpulease.hub.profiles import GpuSpec, Profile
from gpulease.hub.queue_resume import Resume, ServerNow, Skip, plan_resume
from gpulease.spawners.queue_store import QueuedSpawn

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
