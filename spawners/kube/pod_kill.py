"""Killing a server's pod: a stop that did not complete, and a start that failed.

A mixin of GPUKubeSpawner (spawners/kube/spawner.py), kept apart so that the spawner's
module stays about kubespawner's path. Both kills delete the pod with
KILL_GRACE_S through one `_delete_pod`: `kill_now` (the heartbeat's, for a stop
that hangs) and a start that did not answer or failed after its pod was made
(`_failed_start`: killed, billed for what ran, and why said). The pure readings
of a pod (when it started and ended, whose doing its failure was) are
spawners/kube/pod_start.py's; this is the I/O around them.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiException, V1DeleteOptions

from gpulease.core.clock import utcnow
from gpulease.core.policy.options import ServerChoice
from gpulease.core.refusal import Refusal
from gpulease.core.server_log import shown_tail
from gpulease.spawners.http_error import http_error
from gpulease.spawners.kube import pod_start
from gpulease.spawners.start.launch_billing import StartFailed

KILL_GRACE_S = 1  # kill_now's grace period: the kubelet kills at its own minimum (2 s)
MIN_KILL_S = 2  # that minimum (kuberuntime's minimumGracePeriodInSeconds)
KUBELET_SILENT_S = 30.0  # a pod still there this long past that grace: removed with grace 0
POD_END_POLL_S = 0.05  # how often a failed start looks for its pod's end (the pod watch)


def kill_grace(pod_meta: dict[str, Any], now: datetime) -> int | None:
    """kill_now's grace period for a pod of this metadata (as the API server shows it):
    KILL_GRACE_S; 0 once a grace that short has been over for KUBELET_SILENT_S and the
    pod is still there (its kubelet does not act); None while that grace runs (the
    kubelet is killing it: nothing to do)."""
    at, grace = pod_meta.get("deletionTimestamp"), pod_meta.get("deletionGracePeriodSeconds")
    if not at or grace is None or int(grace) > KILL_GRACE_S:
        return KILL_GRACE_S
    try:
        ends = datetime.fromisoformat(str(at).replace("Z", "+00:00"))
    except ValueError:
        return KILL_GRACE_S
    return 0 if (now - ends).total_seconds() > KUBELET_SILENT_S else None


class PodKill:
    """See the module doc; GPUKubeSpawner's start calls `_failed_start`, LaunchBilling
    `_kill_unanswered` and `_exit_description`, the heartbeat `kill_now`."""

    _gpulease_killed: bool = False  # this start did not answer, and its pod was deleted
    _gpulease_pod_seen: dict | None = None  # its pod as last seen while it started

    def _pod_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    def _pod(self) -> dict | None:
        """This server's pod as kubespawner's pod watch holds it now (None: not there)."""
        reflector = self.pod_reflector
        return reflector.pods.get(self._pod_key()) if reflector is not None else None

    def _gone_pod(self, uid: str | None) -> dict | None:
        """This server's pod (of `uid`) as it was when the pod watch saw it go (None: not
        seen going, or another pod of that name)."""
        last_seen = getattr(self.pod_reflector, "last_seen", None)
        return last_seen(self._pod_key(), uid) if last_seen is not None and uid else None

    def _node_of(self, pod: dict | None) -> dict | None:
        """The Node `pod` is bound to, as the cluster watch holds it (None: not known)."""
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        watch = getattr(self._queue_runner(), "watch", None) if node else None
        return watch.nodes.objects.get(node) if watch is not None else None

    async def _failed_start(self, choice: ServerChoice, failed: StartFailed) -> Exception:
        """End a start that failed after its pod was made, bill what ran, and say why.

        Its pod is deleted (if it was not: an exited container is restarted by the
        kubelet under kubespawner's restartPolicy OnFailure), and its session closes at
        the pod's end, seen from the pod watch (pod_start.ended_at). Counted for the
        rationing only when its own code failed the start (pod_start.failed_start); the
        error JupyterHub shows is returned."""
        now = self._pod()
        seen = now or self._gpulease_pod_seen
        if self.gpulease_launched_at is None:  # its container ran and ended before Running
            started = pod_start.launched_at(seen)
            if started is not None:
                await self._bill_from_launch(choice, started)
        # gone (removed by someone else), unless this start deleted it
        verdict = pod_start.failed_start(now if not self._gpulease_killed else seen,
                                         self._gpulease_killed,
                                         pod_start.node_ready(self._node_of(seen)))
        if not self._gpulease_killed and now is not None:
            await self._delete_pod(KILL_GRACE_S, "its start failed")
        uid = ((seen or {}).get("metadata") or {}).get("uid")
        ended = await self._pod_end(uid)
        # what its container wrote last, as the kubelet kept it (FallbackToLogsOnError)
        last = self._pod()
        if last is not None and (last.get("metadata") or {}).get("uid") != uid:
            last = None  # another pod of that name
        failed.tail = shown_tail(pod_start.termination_message(
            self._gone_pod(uid) or last or seen).encode())
        billed_ms = None
        if self.gpulease_launched_at is not None:
            await self._end_billing(verdict.reason, ended)
            billed_ms = await self._billed_ms_of_failed_start()
        if verdict.counted:
            return await self._count_failed_start(choice, failed, billed_ms)
        self.log.warning("%s: start failed, not its own doing: %s", self._log_name, verdict.why)
        return http_error(Refusal(f"Cannot start {choice.profile.slug}: {verdict.why}; try "
                                  "again shortly.", status=503))

    async def _pod_end(self, uid: str | None) -> datetime:
        """Wait until this start's pod (of `uid`) has ended (none of its containers runs,
        or it is gone) and return when it last ran (UTC; pod_start.ended_at). A pod whose
        kubelet does nothing for KUBELET_SILENT_S is removed with grace 0, as kill_now
        does."""
        deadline = asyncio.get_running_loop().time() + MIN_KILL_S + KUBELET_SILENT_S
        last = None
        while True:
            pod = self._pod()
            if pod is not None and uid and (pod.get("metadata") or {}).get("uid") != uid:
                pod = None  # another pod of that name: this one is gone
            if pod_start.ended(pod):
                return pod_start.ended_at(pod or self._gone_pod(uid) or last, utcnow())
            last = pod
            if asyncio.get_running_loop().time() > deadline:
                await self._delete_pod(0, "its kubelet did not kill it")
                return utcnow()
            await asyncio.sleep(POD_END_POLL_S)

    async def _kill_unanswered(self) -> str:
        """Have the pod's containers killed at once: deleted with KILL_GRACE_S, the shortest
        grace that keeps the Pod object (and so its devices counted, and its billing open)
        until the kubelet has killed them; its session closes at its end (_failed_start)."""
        self._gpulease_killed = True
        self._gpulease_pod_seen = self._pod()
        await self._delete_pod(KILL_GRACE_S, "it did not answer within http_timeout")
        return (f"its pod deleted with a grace period of {KILL_GRACE_S} s, so that its "
                "containers are killed at once")

    def _exit_description(self) -> str:
        return pod_start.exit_description(self._pod())

    async def _delete_pod(self, grace: int, why: str) -> bool:
        """Delete this server's pod with `grace` seconds; False when refused or not
        answered (logged), True when deleted or already gone."""
        try:
            await asyncio.wait_for(self.api.delete_namespaced_pod(
                name=self.pod_name, namespace=self.namespace,
                body=V1DeleteOptions(grace_period_seconds=grace), grace_period_seconds=grace),
                self.k8s_api_request_timeout)
        except ApiException as e:
            if e.status == 404:
                return True
            self.log.error("cannot delete the pod %s of %s (%s): refused with HTTP %s %s",
                           self._pod_key(), self._log_name, why, e.status, e.reason)
            return False
        except (TimeoutError, OSError, aiohttp.ClientError) as e:
            self.log.error("cannot delete the pod %s of %s (%s): the API server did not "
                           "answer (%s)", self._pod_key(), self._log_name, why,
                           type(e).__name__)
            return False
        self.log.warning("%s: its pod %s deleted with grace %d s: %s", self._log_name,
                         self._pod_key(), grace, why)
        return True

    async def kill_now(self) -> int:
        """Have the pod's containers killed at once: for a stop that did not complete (a
        container that ignores SIGTERM within a long grace period, a stop that hangs). The
        heartbeat calls it (gpulease/core/billing/enforcement.py) on each beat until the
        server is gone, as
        the embedded spawner's SIGKILL.

        The pod is deleted again with a grace period of KILL_GRACE_S: the kubelet kills
        its containers at once (within its own minimum, 2 s), and only then removes the Pod
        object. Until then the pod still counts, for its billing (the stop in flight closes
        the session when the pod is gone, as any stop does) and for its devices. A delete
        with grace 0 removed the object before the kubelet had killed anything: the
        watch saw the devices free, the queue's next start was bound to them, and the
        kubelet refused it (UnexpectedAdmissionError, the devices still in use), so that
        start failed after start_timeout. Only a pod still there KUBELET_SILENT_S after
        its shortened grace (its node's kubelet does not act: the node is down) is removed
        with grace 0, so that its server can end; such a node's devices are not in use by
        anything the API server still knows of. How many pods it asked to delete (0: none
        there, already shortened and waiting for the kubelet, or refused, logged)."""
        pod = self._pod()
        grace = kill_grace((pod or {}).get("metadata") or {}, datetime.now(UTC))
        if grace is None or pod is None:
            return 0  # the kubelet is killing it, or it is gone
        why = (f"its node's kubelet did not kill it within {KUBELET_SILENT_S:.0f} s"
               if grace == 0 else "its stop did not complete (the kubelet kills its "
               "containers now)")
        return 1 if await self._delete_pod(grace, why) else 0
