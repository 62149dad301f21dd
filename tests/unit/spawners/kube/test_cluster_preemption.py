"""Reading kube-scheduler's preemption of a spot server from its pod
(spawners/kube/cluster_preemption.py): pure, over pods as the watch sees them."""

from __future__ import annotations

import datetime as dt

from gpulease.spawners.kube.cluster_preemption import preempted_pod

DISRUPTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "default-scheduler: preempting to accommodate a higher priority pod",
             "lastTransitionTime": "2026-12-05T08:00:00Z"}


def _pod(tier: str = "spot", namespace: str = "users", conditions=(DISRUPTED,),
         deleted: str | None = None, grace: int = 130, sleep: int = 120) -> dict:
    meta = {"name": "jupyter-sue", "namespace": namespace, "uid": "u-1",
            "labels": {"hub.jupyter.org/username": "sue", "gpulease.io/tier": tier},
            "annotations": {"hub.jupyter.org/username": "sue",
                            "hub.jupyter.org/servername": ""}}
    if deleted:
        meta.update(deletionTimestamp=deleted, deletionGracePeriodSeconds=grace)
    container = {"resources": {"limits": {"nvidia.com/mig-1g.18gb": "1"}},
                 "lifecycle": {"preStop": {"sleep": {"seconds": sleep}}}}
    return {"metadata": meta, "status": {"phase": "Running", "conditions": list(conditions)},
            "spec": {"nodeName": "n1", "containers": [container],
                     "terminationGracePeriodSeconds": grace}}


def test_a_preempted_spot_pod_stops_at_the_end_of_its_pre_stop_sleep():
    got = preempted_pod(_pod(deleted="2026-12-05T08:02:10Z"), "users")
    assert (got.user, got.server, got.pod, got.uid) == ("sue", "", "users/jupyter-sue", "u-1")
    # deleted with 130 s of grace at 08:00:00: SIGTERM after the 120 s sleep
    assert got.deadline == dt.datetime(2026, 12, 5, 8, 2, 0)
    assert got.resources == {"nvidia.com/mig-1g.18gb": 1}
    assert "preempting" in got.why
    # the condition comes before the delete: counted from the condition's time
    assert preempted_pod(_pod(), "users").deadline == dt.datetime(2026, 12, 5, 8, 2, 0)


def test_only_a_spot_server_being_preempted_by_the_scheduler_counts():
    assert preempted_pod(_pod(conditions=()), "users") is None  # not preempted
    assert preempted_pod(_pod(tier="on-demand"), "users") is None
    other = dict(DISRUPTED, reason="EvictionByEvictionAPI")  # a drain, not a preemption
    assert preempted_pod(_pod(conditions=(other,)), "users") is None
    # a pod labelled as sue's spot server outside the servers' namespace is nobody's
    assert preempted_pod(_pod(namespace="batch"), "users") is None
