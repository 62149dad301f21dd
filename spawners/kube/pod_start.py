"""A server pod's start and end as the API server shows them: plain decisions over its JSON.

GPUKubeSpawner bills a pod from its notebook container's start and judges a start
that failed from what the pod shows; these are those readings, without I/O:

- `launched_at`: when the server's code could first run, the notebook
  container's `startedAt` (the container runtime's start of its process: after
  scheduling and the image pull). Kubernetes writes it to the whole second,
  truncated, so it is at most a second before the real start: a session opened
  there bills up to a second more than ran, never less.
- `ended_at`: when a pod that ended was last running: the moment the hub saw it
  ended, but no later than a second past its containers' last `finishedAt`
  (also truncated): never before its containers ended, never more than a
  second after, however late the hub looked.
- `running_still`: whether the run being started still runs (the first-answer
  wait ends when it does not).
- `failed_start`: whose doing a start that failed was. Counted for rationing
  only when the server's own code failed it (its container exited before it
  answered, or it did not answer within http_timeout and was killed); a pod
  someone else deleted, preempted or evicted, or one whose node stopped
  answering, is not the researcher's doing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

NOTEBOOK = "notebook"  # kubespawner's name for the server's own container
K8S_TIME_STEP = timedelta(seconds=1)  # Kubernetes' times are whole seconds (truncated)
START_FAILED = "start_failed"
SERVER_DIED = "server_died"
PREEMPTED = "preempted"
# The reasons of a DisruptionTarget condition that say who ended a pod
# (kube-scheduler's preemption, the taint manager's eviction of a lost node's pods).
_DISRUPTED_BY = {"PreemptionByScheduler": PREEMPTED, "PreemptionByKubeScheduler": PREEMPTED}


def k8s_time(text: str | None) -> datetime | None:
    """A Kubernetes RFC 3339 time ("2026-12-06T10:00:01Z") as naive UTC (the meter's
    convention); None when absent or not a time."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def _statuses(pod: dict | None) -> list[dict]:
    return list(((pod or {}).get("status") or {}).get("containerStatuses") or [])


def notebook_status(pod: dict | None) -> dict | None:
    """The notebook container's status (kubespawner names it `notebook`; else the first)."""
    statuses = _statuses(pod)
    for status in statuses:
        if status.get("name") == NOTEBOOK:
            return status
    return statuses[0] if statuses else None


def launched_at(pod: dict | None) -> datetime | None:
    """When the notebook container first started, or None (not started yet).

    Its current run's `startedAt`, or, once it was restarted (restartPolicy
    OnFailure: a server that exited is started again), the earlier run's: the
    start of the code that ran first that the API server still shows."""
    status = notebook_status(pod)
    if status is None:
        return None
    earlier = ((status.get("lastState") or {}).get("terminated") or {}).get("startedAt")
    state = status.get("state") or {}
    now = (state.get("running") or state.get("terminated") or {}).get("startedAt")
    times = [t for t in (k8s_time(earlier), k8s_time(now)) if t is not None]
    return min(times) if times else None


def restarts(pod: dict | None) -> int:
    status = notebook_status(pod)
    return int((status or {}).get("restartCount") or 0)


def _running(status: dict) -> bool:
    return "running" in (status.get("state") or {})


def ended(pod: dict | None) -> bool:
    """Nothing of the pod runs: it is gone, terminal, or none of its containers runs."""
    if pod is None:
        return True
    if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
        return True
    statuses = _statuses(pod)
    return bool(statuses) and not any(_running(s) for s in statuses)


def ended_at(pod: dict | None, seen: datetime) -> datetime:
    """When a pod `seen` ended at `seen` (naive UTC) last ran (see the module doc)."""
    finished = []
    for status in _statuses(pod):
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            moment = k8s_time((state.get("terminated") or {}).get("finishedAt"))
            if moment is not None:
                finished.append(moment)
    if not finished:
        return seen
    return min(seen, max(finished) + K8S_TIME_STEP)


def running_still(pod: dict | None, uid: str | None, restarts_at_launch: int) -> bool:
    """The pod of this `uid` still runs its notebook container's first run: not gone,
    replaced, being deleted, ended or restarted since its launch."""
    if pod is None:
        return False
    meta = pod.get("metadata") or {}
    if uid is not None and meta.get("uid") != uid:
        return False
    if meta.get("deletionTimestamp") or ended(pod):
        return False
    status = notebook_status(pod)
    return status is not None and _running(status) and restarts(pod) == restarts_at_launch


def exit_description(pod: dict | None) -> str:
    """How the notebook container ended, for the researcher ("its container exited with
    status 1")."""
    if pod is None:
        return "its pod is gone"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "its pod was deleted"
    status = notebook_status(pod) or {}
    terminated = (status.get("state") or {}).get("terminated")
    restarted = (status.get("lastState") or {}).get("terminated")
    for info, how in ((terminated, "its container exited"),
                      (restarted, "its container exited and was restarted")):
        if info:
            code = info.get("exitCode")
            reason = info.get("reason") or ""
            signal = f", signal {code - 128}" if isinstance(code, int) and code > 128 else ""
            said = f" ({reason}{signal})" if reason and reason not in ("Error", "Completed") \
                else (f" ({signal[2:]})" if signal else "")
            return f"{how} with status {code}{said}"
    return "its container is no longer running"


def termination_message(pod: dict | None) -> str:
    """What the kubelet kept of the notebook container's end: its termination message,
    which under FallbackToLogsOnError is the tail of the log of a container that failed
    (pod_spec.TERMINATION_MESSAGE_POLICY); its current run's, else the run before a
    restart's. "" when there is none (the server's own text: shown only as shown_text)."""
    status = notebook_status(pod) or {}
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        message = (state.get("terminated") or {}).get("message")
        if message:
            return str(message)
    return ""


def ran_and_ended(pod: dict | None) -> str | None:
    """For a pod not yet running as kubespawner means it (Running and ready): a
    description when its notebook container already ran and ended or was restarted
    (the server's own code failed before it could answer), else None."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status = notebook_status(pod)
    if status is None or launched_at(pod) is None:
        return None
    state = status.get("state") or {}
    if "terminated" in state or restarts(pod) > 0 or (status.get("lastState") or {}).get(
            "terminated"):
        return exit_description(pod)
    return None


def node_ready(node: dict | None) -> bool | None:
    """Whether a Node's Ready condition is True; None when it is not known."""
    if node is None:
        return None
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return None


@dataclass(frozen=True)
class FailedStart:
    """Whose doing a failed start was: `counted` (the server's own code), the end reason of
    its billing session, and what the researcher is told when it is not counted."""

    counted: bool
    reason: str
    why: str = ""


def failed_start(pod: dict | None, killed: bool, node_is_ready: bool | None) -> FailedStart:
    """The verdict on a start that failed after its pod was made. `pod` is the pod as last
    seen before gpulease deleted it; `killed`: gpulease deleted it because it did not
    answer within http_timeout; `node_is_ready`: its node's Ready condition (None:
    unknown, taken as ready)."""
    if node_is_ready is False:
        return FailedStart(False, SERVER_DIED, "its node stopped answering while it started")
    meta = (pod or {}).get("metadata") or {}
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    for condition in conditions:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            reason = _DISRUPTED_BY.get(condition.get("reason") or "", SERVER_DIED)
            said = "preempted" if reason == PREEMPTED else "evicted"
            return FailedStart(False, reason, f"its pod was {said} while it started "
                               f"({condition.get('reason')}: {condition.get('message', '')})")
    if killed:
        return FailedStart(True, START_FAILED)
    if pod is None:
        return FailedStart(False, SERVER_DIED, "its pod was removed while it started")
    if meta.get("deletionTimestamp"):
        return FailedStart(False, SERVER_DIED, "its pod was deleted while it started")
    return FailedStart(True, START_FAILED)
