"""gpulease.spawners.kube.pod_start: a server pod's start and end read from its JSON (no cluster)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpulease.spawners.kube import pod_start
from gpulease.spawners.kube.pod_start import (
    PREEMPTED,
    SERVER_DIED,
    START_FAILED,
    ended,
    ended_at,
    exit_description,
    failed_start,
    k8s_time,
    launched_at,
    node_ready,
    ran_and_ended,
    running_still,
    termination_message,
)

T0 = "2026-12-06T10:00:01Z"
T1 = "2026-12-06T10:00:09Z"


def pod(*containers: dict, phase: str = "Running", uid: str = "u1", deleting: bool = False,
        conditions: list[dict] | None = None) -> dict:
    meta = {"name": "jupyter-alice", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = T1
    return {"metadata": meta, "spec": {"nodeName": "n1"},
            "status": {"phase": phase, "containerStatuses": list(containers),
                       "conditions": conditions or []}}


def running(name: str = "notebook", at: str = T0, restarts: int = 0, last: dict | None = None):
    status = {"name": name, "restartCount": restarts, "state": {"running": {"startedAt": at}}}
    if last:
        status["lastState"] = {"terminated": last}
    return status


def terminated(name: str = "notebook", code: int = 7, at: str = T0, finished: str = T1,
               reason: str = "Error"):
    return {"name": name, "restartCount": 0, "state": {"terminated": {
        "exitCode": code, "reason": reason, "startedAt": at, "finishedAt": finished}}}


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "")).replace(tzinfo=None)


def test_kubernetes_times_are_naive_utc():
    assert k8s_time(T0) == dt.datetime(2026, 12, 6, 10, 0, 1)
    assert k8s_time("2026-12-06T11:00:01+01:00") == dt.datetime(2026, 12, 6, 10, 0, 1)
    assert k8s_time(None) is None and k8s_time("soon") is None


def test_launched_at_is_the_notebook_containers_start_not_a_sidecars():
    sidecar = running("sidecar", at="2026-12-06T09:59:00Z")
    assert launched_at(pod(sidecar, running(at=T0))) == utc(T0)
    assert launched_at(pod(terminated(at=T0))) == utc(T0)
    # restarted (restartPolicy OnFailure): the earlier run's start, which ran first
    again = running(at=T1, restarts=1, last={"startedAt": T0, "finishedAt": T0, "exitCode": 1})
    assert launched_at(pod(again)) == utc(T0)
    waiting = {"name": "notebook", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert launched_at(pod(waiting, phase="Pending")) is None
    assert launched_at(None) is None


def test_a_pod_has_ended_when_nothing_of_it_runs():
    assert ended(None)
    assert ended(pod(terminated(), phase="Failed"))
    assert ended(pod(terminated(), terminated("sidecar")))
    assert not ended(pod(terminated(), running("sidecar")))  # its sidecar still runs
    assert not ended(pod(running()))


def test_its_end_is_when_it_was_seen_ended_but_never_past_its_finishedAt_second():
    finished = pod(terminated(finished="2026-12-06T10:00:09Z"), phase="Failed")
    seen_at_once = dt.datetime(2026, 12, 6, 10, 0, 9, 300_000)
    assert ended_at(finished, seen_at_once) == seen_at_once
    seen_late = dt.datetime(2026, 12, 6, 10, 0, 15)  # the hub looked late
    assert ended_at(finished, seen_late) == dt.datetime(2026, 12, 6, 10, 0, 10)
    assert ended_at(None, seen_late) == seen_late  # removed: when it was seen gone


def test_the_run_being_started_still_runs_until_it_ends_restarts_or_is_deleted():
    assert running_still(pod(running()), "u1", 0)
    assert not running_still(pod(running()), "u2", 0)  # another pod of that name
    assert not running_still(pod(running(), deleting=True), "u1", 0)
    assert not running_still(pod(terminated(), phase="Failed"), "u1", 0)
    assert not running_still(pod(running(restarts=1)), "u1", 0)  # it exited, run again
    assert not running_still(None, "u1", 0)


def test_how_its_container_ended_is_told_to_the_researcher():
    assert exit_description(pod(terminated(code=7), phase="Failed")) == \
        "its container exited with status 7"
    assert exit_description(pod(terminated(code=137, reason="OOMKilled"), phase="Failed")) \
        == "its container exited with status 137 (OOMKilled, signal 9)"
    again = running(restarts=1, last={"exitCode": 1, "reason": "Error"})
    assert exit_description(pod(again)) == \
        "its container exited and was restarted with status 1"
    assert exit_description(None) == "its pod is gone"
    assert exit_description(pod(running(), deleting=True)) == "its pod was deleted"


def test_a_container_that_ran_and_ended_before_the_pod_ran_is_the_servers_failure():
    assert ran_and_ended(pod(terminated(code=7), phase="Failed")) == \
        "its container exited with status 7"
    again = running(restarts=1, last={"startedAt": T0, "exitCode": 1})
    assert ran_and_ended(pod(dict(again, state={"waiting": {"reason": "CrashLoopBackOff"}}))) \
        is not None
    # the kubelet refused it: nothing of it ran
    assert ran_and_ended({"metadata": {"uid": "u1"}, "status": {
        "phase": "Failed", "reason": "UnexpectedAdmissionError"}}) is None
    waiting = {"name": "notebook", "state": {"waiting": {"reason": "ErrImagePull"}}}
    assert ran_and_ended(pod(waiting, phase="Pending")) is None
    assert ran_and_ended(pod(terminated(), phase="Failed", deleting=True)) is None
    assert ran_and_ended(pod(running())) is None


def test_the_termination_message_is_the_notebook_containers_current_or_last_runs():
    failed = terminated(code=1)
    failed["state"]["terminated"]["message"] = "ValueError: bad config\n"
    sidecar = terminated(name="sidecar", code=1)
    sidecar["state"]["terminated"]["message"] = "not the server's"
    assert termination_message(pod(sidecar, failed, phase="Failed")) == "ValueError: bad config\n"
    again = running(restarts=1, last={"exitCode": 1, "message": "before the restart"})
    assert termination_message(pod(again)) == "before the restart"
    assert termination_message(pod(terminated(), phase="Failed")) == ""
    assert termination_message(None) == ""


def test_node_readiness():
    def node(status):
        return {"status": {"conditions": [{"type": "Ready", "status": status}]}}
    assert node_ready(node("True")) is True
    assert node_ready(node("Unknown")) is False
    assert node_ready(None) is None and node_ready({"status": {}}) is None


@pytest.mark.parametrize("seen, killed, node, counted, reason", [
    (pod(terminated(), phase="Failed"), False, True, True, START_FAILED),  # it exited
    (pod(running(), deleting=True), True, True, True, START_FAILED),  # killed unanswered
    (pod(running()), True, None, True, START_FAILED),  # node unknown: taken as ready
    (pod(running()), True, False, False, SERVER_DIED),  # its node stopped answering
    (None, False, True, False, SERVER_DIED),  # removed by someone else
    (pod(running(), deleting=True), False, True, False, SERVER_DIED),  # deleted by someone
    (pod(running(), deleting=True, conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": "preempted by a higher priority pod"}]), False, True, False, PREEMPTED),
    (pod(running(), deleting=True, conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]),
     True, True, False, SERVER_DIED),  # evicted from a lost node, as it was being killed
], ids=["exited", "unanswered", "node-unknown", "node-lost", "removed", "deleted",
        "preempted", "evicted"])
def test_a_failed_start_is_counted_only_when_the_servers_own_code_failed_it(
        seen, killed, node, counted, reason):
    verdict = failed_start(seen, killed, node)
    assert (verdict.counted, verdict.reason) == (counted, reason), verdict
    assert bool(verdict.why) == (not counted)


def test_kubernetes_writes_whole_seconds():
    assert pod_start.K8S_TIME_STEP == dt.timedelta(seconds=1)
