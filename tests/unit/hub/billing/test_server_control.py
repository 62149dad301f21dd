"""HubServerControl.running: the servers the heartbeat may open a session for.

JupyterHub's in-memory users and spawners are replaced here by stand-ins
(FakeUser, FakeSpawner: plain objects with the few attributes read); the
rule under test is which ready servers are offered for a repair.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from types import SimpleNamespace

from gpulease.hub.billing.server_control import HubServerControl

ANSWERED = dt.datetime(2026, 12, 1, 9, 0, 0, 121_000)


@dataclass
class FakeSpawner:
    name: str
    exit_status: int | None  # None: its process runs
    ready: bool = True
    notified: int = 0
    gpulease_launched_at: dt.datetime = ANSWERED
    gpulease_choice: object = field(default_factory=lambda: SimpleNamespace(
        profile=SimpleNamespace(slug="cpu", price_per_hour_ucr=3_600_000), account="user:u",
        rate_per_hour_ucr=3_600_000, tier="on-demand", reservation_id=None))
    orm_spawner: object = field(default_factory=lambda: SimpleNamespace(started=ANSWERED))

    async def poll_and_notify(self) -> int | None:
        if self.exit_status is not None:
            self.notified += 1  # JupyterHub's callbacks: proxy route removed, user.stop
        return self.exit_status


@dataclass
class FakeUser:
    name: str
    spawners: dict


def control(*spawners: FakeSpawner, metered: dict | None = None) -> HubServerControl:
    app = SimpleNamespace(users={"u": FakeUser("u", {s.name: s for s in spawners})})
    return HubServerControl(app, SimpleNamespace(meter=SimpleNamespace(live=metered or {})))


def test_a_ready_server_whose_process_is_gone_is_not_offered_a_session():
    # Its session was closed by a poll that did not tell JupyterHub (the heartbeat's,
    # a page's): it still counts as ready. A repair would bill the dead server again
    # from its first answer, over the session that already billed it.
    gone, alive = FakeSpawner("gone", exit_status=0), FakeSpawner("alive", exit_status=None)
    found = asyncio.run(control(gone, alive).running())
    assert [s.key for s in found] == [("u", "alive")]
    assert found[0].launched_at == ANSWERED
    assert gone.notified == 1  # JupyterHub is told now, not at its next poll


def test_metered_servers_are_not_polled_here():
    metered = FakeSpawner("metered", exit_status=0)  # the heartbeat polls it already
    found = asyncio.run(control(metered, metered={("u", "metered"): object()}).running())
    assert [s.key for s in found] == [("u", "metered")] and metered.notified == 0
