"""GPUKubeSpawner's start between its container's start and its first answer, without a
cluster: the pod watch is a stand-in holding one pod, the meter a recorder
(tests/unit/spawners/kube/test_kube_run_end.py does the same for the end of a run)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kubespawner import KubeSpawner

from gpulease.spawners.kube.pod_kill import POD_END_POLL_S
from gpulease.spawners.kube.pod_start import K8S_TIME_STEP, k8s_time
from gpulease.spawners.kube.reflectors import PodEndReflector
from gpulease.spawners.kube.spawner import GPUKubeSpawner
from gpulease.spawners.start.launch_billing import StartFailed

T0 = "2026-12-06T10:00:01Z"


class RecordingMeter:
    def __init__(self) -> None:
        self.closes: list[tuple[str, str, str]] = []

    def mark_alive(self, user, server, at=None) -> None:
        pass

    def close(self, user, server, reason, ended=None) -> None:
        self.closes.append((user, server, reason))


def pod(state: dict, uid: str = "u1", phase: str = "Running") -> dict:
    return {"metadata": {"name": "jupyter-ada", "namespace": "gpulease", "uid": uid},
            "spec": {"nodeName": "n1"},
            "status": {"phase": phase, "podIP": "10.0.0.9", "containerStatuses": [
                {"name": "notebook", "ready": "running" in state, "restartCount": 0,
                 "state": state}]}}


RUNNING = {"running": {"startedAt": T0}}
EXITED = {"terminated": {"exitCode": 7, "reason": "Error", "startedAt": T0,
                         "finishedAt": T0}}


@pytest.fixture
def spawner(monkeypatch, no_cluster):
    meter = RecordingMeter()
    monkeypatch.setattr(GPUKubeSpawner, "gpulease", property(lambda s: SimpleNamespace(
        meter=meter)))
    pods: dict[str, dict] = {}
    monkeypatch.setattr(GPUKubeSpawner, "pod_reflector", property(
        lambda s: SimpleNamespace(pods=pods)))

    async def stand_in_stop(self, now=False):  # the pod deleted and gone
        await asyncio.sleep(0)
    monkeypatch.setattr(KubeSpawner, "stop", stand_in_stop)

    async def stand_in_poll(self):  # kubespawner's, on a terminated notebook: a stop
        await self.stop(now=True)
        return 7
    monkeypatch.setattr(KubeSpawner, "poll", stand_in_poll)

    async def make() -> GPUKubeSpawner:
        made = GPUKubeSpawner(_mock=True, namespace="gpulease")
        made.user.name = "ada"
        made.pod_name = "jupyter-ada"
        return made
    made = asyncio.run(make())
    made.meter, made.pods = meter, pods
    return made


def test_while_it_starts_a_poll_leaves_its_end_to_the_start(spawner):
    """The heartbeat polls a server whose session is open, and so one still starting: a
    pod whose container ended is the start's to end (start_failed), not a poll's stop
    closing it as server_died."""
    spawner._gpulease_starting = True
    spawner.pods["gpulease/jupyter-ada"] = pod(RUNNING)
    assert asyncio.run(spawner.poll()) is None
    spawner.pods["gpulease/jupyter-ada"] = pod(EXITED, phase="Failed")
    assert asyncio.run(spawner.poll()) == 1
    assert spawner.meter.closes == [] and spawner._gpulease_stops == 0
    spawner._gpulease_starting = False  # started: a poll ends a dead server as before
    assert asyncio.run(spawner.poll()) == 7
    assert spawner.meter.closes == [("ada", spawner.name, "server_died")]


def test_the_run_waited_for_ends_with_its_container_or_its_pod(spawner):
    async def run() -> list[bool]:
        spawner._start_future = asyncio.get_running_loop().create_future()
        spawner.pod_id = "u1"
        spawner.pods["gpulease/jupyter-ada"] = pod(RUNNING)
        still_ours = spawner._run_still_ours()
        seen = [still_ours()]
        spawner.pods["gpulease/jupyter-ada"] = pod(EXITED, phase="Failed")
        seen.append(still_ours())
        assert spawner._exit_description() == "its container exited with status 7"
        spawner.pods["gpulease/jupyter-ada"] = pod(RUNNING, uid="u2")  # another pod
        seen.append(still_ours())
        del spawner.pods["gpulease/jupyter-ada"]
        seen.append(still_ours())
        return seen
    assert asyncio.run(run()) == [True, False, False, False]


def test_a_container_that_exited_before_its_pod_ran_fails_the_start_as_its_own(spawner):
    """kubespawner waits for Running and ready; a container that ran and exited at once
    leaves the pod Failed: the server's failure (billed, counted), not the kubelet's
    refusal (503, not counted)."""
    spawner._start_pending = True
    spawner._gpulease_admitted = True
    with pytest.raises(StartFailed, match=r"exited before it answered \(its container "
                       r"exited with status 7\)"):
        spawner.is_pod_running(pod(EXITED, phase="Failed"))
    assert spawner.is_pod_running(pod(RUNNING)) is True


def test_a_failed_start_shows_its_owner_the_end_of_its_containers_log(spawner, monkeypatch):
    """The kubelet keeps a failed container's last lines in its termination message
    (FallbackToLogsOnError): the start's failure shows them, stripped of what a terminal
    would obey and escaped on the page, and records them with the failed start."""
    recorded = []
    monkeypatch.setattr(GPUKubeSpawner, "_failed_starts", lambda self: SimpleNamespace(
        record=lambda *args: recorded.append(args) and False))
    monkeypatch.setattr(GPUKubeSpawner, "_node_of", lambda self, seen: None)

    async def deleted(self, grace, why):
        return True

    async def unbilled(self):
        return None
    monkeypatch.setattr(GPUKubeSpawner, "_delete_pod", deleted)
    monkeypatch.setattr(GPUKubeSpawner, "_billed_ms_of_failed_start", unbilled)
    ended = {"terminated": {**EXITED["terminated"], "message":
                            "loading config\n\x1b[31mValueError: <bad> setting\x1b[0m\n"}}
    spawner.pods["gpulease/jupyter-ada"] = pod(ended, phase="Failed")
    spawner.gpulease_launched_at = k8s_time(T0)
    picked = SimpleNamespace(profile=SimpleNamespace(slug="cpu"), rate_per_hour_ucr=0)
    error = asyncio.run(spawner._failed_start(picked, StartFailed("it exited before it "
                                                                    "answered")))
    tail = "loading config\nValueError: <bad> setting"
    assert error.status_code == 502 and error.jupyterhub_message.endswith(tail)
    assert "ValueError: &lt;bad&gt; setting</pre>" in error.jupyterhub_html_message
    assert tail not in str(error)  # what JupyterHub logs: gpulease's words only
    assert recorded and recorded[0][-1] == tail


def test_a_pod_watch_keeps_the_last_object_of_a_pod_that_went(no_cluster):
    """kubespawner's watch drops a pod on its DELETED event; ours keeps that last object
    (the one with its containers' finishedAt), and a pod missing from a new list too."""
    async def run() -> None:
        watch = PodEndReflector(namespace="gpulease")
        watch.resources = {"gpulease/jupyter-ada": pod(RUNNING),
                           "gpulease/jupyter-bob": pod(RUNNING, uid="b1")}
        ended = pod(EXITED, phase="Failed")
        watch.resources["gpulease/jupyter-ada"] = ended  # the watch's last MODIFIED
        watch.resources.pop("gpulease/jupyter-ada", None)  # its DELETED, as kubespawner does
        assert "gpulease/jupyter-ada" not in watch.pods
        assert watch.last_seen("gpulease/jupyter-ada", "u1") is ended
        assert watch.last_seen("gpulease/jupyter-ada", "u2") is None  # not that pod
        watch.resources = {}  # a new list (the watch restarted) without bob's pod
        assert watch.last_seen("gpulease/jupyter-bob", "b1")["metadata"]["uid"] == "b1"
        watch.resources = {"gpulease/jupyter-ada": pod(RUNNING, uid="u2")}  # a new one
        assert watch.last_seen("gpulease/jupyter-ada", "u2")["metadata"]["uid"] == "u2"
        assert watch.last_seen("gpulease/jupyter-ada", "u1") is ended
    asyncio.run(run())


def test_a_killed_pod_that_went_between_two_looks_ends_at_its_containers_end(
        spawner, monkeypatch):
    """A killed start's pod is seen "deleting, running", then gone: its end is its
    container's finishedAt from the object it went with, not the moment it was seen gone
    (which billed a killed start past its end)."""
    async def run():
        watch = PodEndReflector(namespace="gpulease")
        monkeypatch.setattr(GPUKubeSpawner, "pod_reflector", property(lambda s: watch))
        deleting = pod(RUNNING)
        deleting["metadata"]["deletionTimestamp"] = T0
        watch.resources = {"gpulease/jupyter-ada": deleting}
        end = asyncio.ensure_future(spawner._pod_end("u1"))
        await asyncio.sleep(POD_END_POLL_S * 3)
        assert not end.done()  # its container still runs
        watch.resources["gpulease/jupyter-ada"] = pod(EXITED, phase="Failed")
        watch.resources.pop("gpulease/jupyter-ada")  # both before the next look
        return await end
    assert asyncio.run(run()) == k8s_time(T0) + K8S_TIME_STEP
