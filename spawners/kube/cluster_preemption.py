"""Which spot servers kube-scheduler is preempting, from their pods: pure.

In the cluster shape gpulease does not choose the victims: an on-demand pod at
the higher PriorityClass that does not fit makes kube-scheduler's
DefaultPreemption pick lower-priority pods on one node (the fewest, the lowest
priority, the most recently started among equals — the rule of
gpulease/core/capacity/preemption.py, which gpulease's admission mirrors by counting what spot
pods hold as free for an on-demand start). Before it deletes a victim the
scheduler adds the pod condition `DisruptionTarget` (reason
`PreemptionByScheduler`); the delete uses the pod's own grace period, and a spot
pod's preStop sleep keeps the server running until the deadline its user is told
(spawners/kube/pod_spec.py tier_pod). This module reads that from a pod as the watch
sees it; spawners/kube/cluster_runner.py tells the user and the meter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpulease.core.capacity.cluster_inventory import hold_from_pod

DISRUPTION = "DisruptionTarget"
BY_SCHEDULER = "PreemptionByScheduler"


@dataclass(frozen=True)
class PreemptedPod:
    user: str
    server: str
    pod: str  # namespace/name
    uid: str
    deadline: datetime  # UTC, naive: when its server stops (the end of its preStop sleep)
    why: str  # the scheduler's message
    resources: dict[str, int]


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _pre_stop_sleep(spec: dict) -> int:
    containers = spec.get("containers") or [{}]
    sleep = (((containers[0].get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {})
    try:
        return max(0, int(sleep.get("seconds", 0)))
    except (TypeError, ValueError):
        return 0


def preempted_pod(pod: dict, servers_namespace: str | None) -> PreemptedPod | None:
    """The server this pod is, of a preemptible tier (spot), when kube-scheduler is
    preempting it; else None.

    Its deadline: the end of its preStop sleep, counted from its deletion
    (deletionTimestamp less the grace left after the sleep), or from the
    condition's time while the delete has not come yet."""
    hold = hold_from_pod(pod, servers_namespace)
    if hold is None or not hold.user or not hold.preemptible:
        return None
    status = pod.get("status") or {}
    condition = next((c for c in status.get("conditions") or []
                      if c.get("type") == DISRUPTION and c.get("status") == "True"
                      and c.get("reason") == BY_SCHEDULER), None)
    if condition is None:
        return None
    meta, spec = pod["metadata"], pod.get("spec") or {}
    sleep = _pre_stop_sleep(spec)
    deleting = _time(meta.get("deletionTimestamp"))
    if deleting is not None:
        grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"))
        try:
            after_sleep = max(0, int(grace) - sleep)
        except (TypeError, ValueError):
            after_sleep = 0
        deadline = deleting - timedelta(seconds=after_sleep)
    else:
        since = _time(condition.get("lastTransitionTime")) or datetime.now(UTC).replace(
            tzinfo=None)
        deadline = since + timedelta(seconds=sleep)
    return PreemptedPod(hold.user, hold.server, hold.pod, meta.get("uid", ""), deadline,
                        condition.get("message") or "preempted by kube-scheduler",
                        dict(hold.resources))
