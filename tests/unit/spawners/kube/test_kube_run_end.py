"""GPUKubeSpawner's end of a run: how its billing session closes (spawners/kube/spawner.py).

No cluster here: kubespawner's stop and poll are replaced by stand-ins (named
so) doing what kubespawner's do to the spawner; the meter is a recorder of
closes (tests/cluster/ has a real API server)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kubespawner import KubeSpawner

from gpulease.spawners.kube.spawner import GPUKubeSpawner


class RecordingMeter:
    def __init__(self) -> None:
        self.closes: list[tuple[str, str, str]] = []

    def mark_alive(self, user, server, at=None) -> None:
        pass

    def close(self, user, server, reason, ended=None) -> None:
        self.closes.append((user, server, reason))


@pytest.fixture
def spawner(monkeypatch, no_cluster):
    meter = RecordingMeter()
    monkeypatch.setattr(GPUKubeSpawner, "gpulease", property(lambda s: SimpleNamespace(
        meter=meter)))

    async def stand_in_stop(self, now=False):  # the pod deleted and gone
        await asyncio.sleep(0)
    monkeypatch.setattr(KubeSpawner, "stop", stand_in_stop)

    async def make() -> GPUKubeSpawner:
        made = GPUKubeSpawner(_mock=True, namespace="gpulease")
        made.user.name = "ada"
        return made
    made = asyncio.run(make())
    made.meter = meter
    return made


def test_a_pod_found_dead_closes_as_died_not_as_a_users_stop(spawner, monkeypatch):
    async def stand_in_poll(self):
        # kubespawner's poll, on a notebook container that terminated: it deletes
        # the pod itself (delete_stopped_pods) through self.stop(now=True)
        await self.stop(now=True)
        return 1
    monkeypatch.setattr(KubeSpawner, "poll", stand_in_poll)
    assert asyncio.run(spawner.poll()) == 1
    assert spawner.meter.closes == [("ada", spawner.name, "server_died")]


def test_a_users_stop_closes_as_the_users(spawner):
    asyncio.run(spawner.stop())
    assert spawner.meter.closes == [("ada", spawner.name, "user")]


def test_a_stopped_run_is_no_longer_the_one_a_late_answer_is_waited_for(spawner):
    async def run() -> bool:
        spawner._start_future = asyncio.get_running_loop().create_future()  # a started run
        still_ours = spawner._run_still_ours()
        assert still_ours()
        await spawner.stop()
        return still_ours()
    assert asyncio.run(run()) is False


def test_a_stop_that_fails_keeps_billing_while_the_pod_may_run(spawner, monkeypatch):
    async def failing_stop(self, now=False):  # the API server refused the deletion
        raise TimeoutError("Could not delete pod gpulease/jupyter-ada")
    monkeypatch.setattr(KubeSpawner, "stop", failing_stop)
    with pytest.raises(TimeoutError):
        asyncio.run(spawner.stop())
    assert spawner.meter.closes == []  # billed on: a poll closes it once the pod is gone
    assert spawner._stopping is False


def test_kubespawners_409_replacing_a_leftover_pod_is_no_stop_of_the_start(spawner,
                                                                         monkeypatch):
    """kubespawner's pod create, on a pod of that name (a Failed one a refused start left,
    one still terminating), deletes it through self.stop(True) and tries again, within the
    start: the start stays admitted (counted, its refusal check on), nothing is billed
    as a user's stop, and later stops still count as stops."""
    async def stand_in_create(self, pod, request_timeout):  # kubespawner's, on a 409
        await self.stop(True)
        return False  # exponential_backoff tries again
    monkeypatch.setattr(KubeSpawner, "_make_create_pod_request", stand_in_create)

    async def run() -> None:
        spawner._gpulease_admitted = True
        assert await spawner._make_create_pod_request(SimpleNamespace(), 3) is False
    asyncio.run(run())
    assert spawner._gpulease_admitted is True and spawner._gpulease_stops == 0
    assert spawner.meter.closes == []
    asyncio.run(spawner.stop())  # the contextvar does not outlive the create
    assert spawner.meter.closes == [("ada", spawner.name, "user")]


def test_kill_now_shortens_the_grace_and_removes_at_once_only_a_pod_no_kubelet_kills():
    """kill_grace (pure): 1 s for a pod running or terminating with a longer grace; nothing
    while that 1 s grace runs (the kubelet is killing it; grace 0 would free its devices
    before it has, tests/cluster/test_kill_frees_slice.py); 0 once the pod is still there
    30 s after it (its node's kubelet does not act)."""
    from datetime import UTC, datetime, timedelta

    from gpulease.spawners.kube.spawner import KILL_GRACE_S, KUBELET_SILENT_S, kill_grace

    now = datetime(2026, 1, 1, 12, tzinfo=UTC)

    def deleting(grace: int, ends_ago_s: float) -> dict:
        ends = (now - timedelta(seconds=ends_ago_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"deletionTimestamp": ends, "deletionGracePeriodSeconds": grace}

    assert kill_grace({}, now) == KILL_GRACE_S == 1  # running, or not seen: shorten
    assert kill_grace(deleting(300, -290), now) == 1  # the stop's long grace: shorten it
    assert kill_grace(deleting(1, -1), now) is None  # shortened, the kubelet kills it now
    assert kill_grace(deleting(1, KUBELET_SILENT_S - 5), now) is None
    assert kill_grace(deleting(1, KUBELET_SILENT_S + 5), now) == 0  # no kubelet acts
    assert kill_grace(deleting(0, KUBELET_SILENT_S + 5), now) == 0
    assert kill_grace({"deletionTimestamp": "garbage", "deletionGracePeriodSeconds": 1},
                      now) == 1
