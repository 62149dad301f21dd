"""GPUKubeSpawner: the cluster shape's spawner, kubespawner's KubeSpawner with gpulease's path.

gpulease decides whether and when a request may run (GPULeaseSpawnCore: the
options, rights, credit and limits, the first answer and billing); Kubernetes
decides where. What a profile asks of the cluster is a plain decision
(gpulease.spawners.kube.pod_spec): this class only hands it to kubespawner's own
options before kubespawner makes the pod, and adds what gpulease keeps apart
from kubespawner's defaults:

- each user's home is one PersistentVolumeClaim, `claim-{username}`, shared
  by all their servers: a stop deletes the pod and keeps the claim, and
  deleting a named server (or the user) never deletes the home
  (`delete_forever`);
- a GPU pod is made only once gpulease admits it to the cluster's counted
  capacity, at once or from the fair queue (spawners/kube/cluster_runner.py);
- the billing session opens at the notebook container's start (`startedAt`,
  after scheduling and the image pull: the researcher's code runs from there,
  gpulease.spawners.kube.pod_start) and closes when its pod is stopped or found
  gone; the first answer only marks the server ready;
- a start whose code fails it (its container exits before it answers, or it
  does not answer within `http_timeout`: its pod is then deleted with the
  shortest grace that keeps the Pod object, and so its devices counted, until
  the kubelet killed it) is billed for what ran, closed `start_failed` at the
  pod's end, and counted for rationing; a pod deleted, preempted or evicted by
  others, or lost with its node, is not counted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlparse

from kubernetes_asyncio.client import (
    ApiException,
    V1Lifecycle,
    V1LifecycleHandler,
    V1SleepAction,
)
from kubespawner import KubeSpawner
from traitlets import Dict, List, Unicode, default

from gpulease.core.capacity.cluster_availability import Availability, cluster_availability, unknown
from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.policy.options import ServerChoice
from gpulease.core.refusal import Refusal
from gpulease.core.tiers import ON_DEMAND
from gpulease.singleuser import SERVER_SCRIPT
from gpulease.spawners.kube import pod_start
from gpulease.spawners.kube.cluster_runner import ClusterQueueRunner, cluster_runner_for
from gpulease.spawners.kube.dra_claims import DraClasses, claim_spec
from gpulease.spawners.kube.dra_spawner import DraClaims
from gpulease.spawners.kube.pod_kill import (  # noqa: F401 - the tests read these here
    KILL_GRACE_S,
    KUBELET_SILENT_S,
    PodKill,
    kill_grace,
)
from gpulease.spawners.kube.pod_spec import (
    DEFAULT_GPU_TOLERATIONS,
    MIG_STRATEGIES,
    TERMINATION_MESSAGE_POLICY,
    ClusterGpus,
    avoiding,
    kubespawner_traits,
    only_on,
    pod_needs,
    tier_pod,
)
from gpulease.spawners.kube.reflectors import ReflectorUpkeep
from gpulease.spawners.queueing.base import Refused
from gpulease.spawners.spawn_core import GPULeaseSpawnCore
from gpulease.spawners.start.launch_billing import StartFailed

HOME_CLAIM = "claim-{username}"  # one home per user, whatever the server
HOME_MOUNT = "/home/jovyan"
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
# Set while kubespawner's poll runs: a stop it makes then (delete_stopped_pods, on a
# notebook container that terminated) ends a dead server, not a user's stop.
_IN_POLL: ContextVar[bool] = ContextVar("gpulease_kube_in_poll", default=False)
# Set while kubespawner's start makes the pod: a stop it makes then (a pod of that name
# exists: 409) removes a leftover pod, and is no stop of the server.
_IN_CREATE: ContextVar[bool] = ContextVar("gpulease_kube_in_create", default=False)


def pod_options(choice: ServerChoice, cluster: ClusterGpus) -> dict[str, Any]:
    """kubespawner's options for a server of this choice on this cluster."""
    return kubespawner_traits(pod_needs(choice.profile, cluster), choice.image.image)


def api_server_refusal(slug: str, e: ApiException) -> Refusal:
    """A start the API server refused or failed (a 500, a quota's 403): a 502 naming what
    was being made and the API server's own message, not JupyterHub's bare 500."""
    try:
        said = json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        said = e.reason or ""
    making = getattr(e, "gpulease_making", "")
    return Refusal(f"Cannot start {slug}: the Kubernetes API server answered HTTP {e.status}"
                   f"{f' to making {making}' if making else ''} ({said[:300]}); "
                   "try again shortly.", status=502)


class GPUKubeSpawner(DraClaims, ReflectorUpkeep, PodKill, GPULeaseSpawnCore, KubeSpawner):
    """One pod per server, asking for exactly its profile's GPUs (see the module doc)."""

    mig_strategy = Unicode(
        "mixed", config=True,
        help="The NVIDIA device plugin's MIG strategy on this cluster: mixed (a slice is "
        f"nvidia.com/mig-<profile>) or single (a slice is nvidia.com/gpu on a node whose "
        f"product is <model>-MIG-<profile>). One of {', '.join(MIG_STRATEGIES)}.",
    )
    gpu_tolerations = List(
        Dict(), default_value=[dict(t) for t in DEFAULT_GPU_TOLERATIONS], config=True,
        help="Tolerations every GPU pod gets, for the taints of the GPU nodes.",
    )
    packing_scheduler = Unicode(
        "", config=True,
        help="schedulerName of every server's pod (CPU-only ones too, packed on cpu and "
        "memory): gpulease's GPU-packing kube-scheduler when it is deployed; empty: the "
        "cluster's default scheduler.",
    )

    on_demand_priority_class = Unicode(
        "", config=True,
        help="PriorityClass of on-demand servers' pods (the Helm chart makes "
        "<release>-on-demand). With spot_priority_class set, an on-demand start is admitted "
        "when spot pods hold the room it needs, and kube-scheduler preempts them. Empty: "
        "the cluster's default priority, and spot pods are never preempted.",
    )
    cpu_only_priority_class = Unicode(
        "", config=True,
        help="PriorityClass of CPU-only servers' pods: as high as on_demand_priority_class's "
        "but with preemptionPolicy Never (the Helm chart makes <release>-cpu-only), so that "
        "a CPU-only start never preempts anyone for CPU or memory and a GPU start never "
        "preempts it. Empty: the cluster's default priority.",
    )
    spot_priority_class = Unicode(
        "", config=True,
        help="PriorityClass of spot servers' pods, lower than on_demand_priority_class's, "
        "with preemptionPolicy Never (the Helm chart makes <release>-spot). A spot pod "
        "kube-scheduler preempts is told at once and keeps running for spot_grace_period "
        "(a preStop sleep), then is suspended with end reason preempted. Empty: no "
        "preemption in the cluster.",
    )

    tier_priority_classes = Dict(
        key_trait=Unicode(), value_trait=Unicode(), config=True,
        help="PriorityClasses of the tiers registered beyond the built-in ones "
        "(gpulease/core/tiers.py register): the record's priority_class -> the "
        "PriorityClass's name, e.g. {'preview': 'lab-preview'}, with a value between the "
        "spot and on-demand ones where it ranks between them. The built-in tiers' are "
        "on_demand_priority_class's and spot_priority_class's.",
    )

    @default("pvc_name_template")
    def _default_pvc_name_template(self):
        # kubespawner's safe slug of the name: the name itself, except for names with
        # '--', which get a hashed form (docs/cluster.md, Homes)
        return HOME_CLAIM

    @default("storage_pvc_ensure")
    def _default_storage_pvc_ensure(self):
        return True

    @default("delete_pvc")
    def _default_delete_pvc(self):
        return False

    @default("volumes")
    def _default_volumes(self):
        return [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]

    @default("volume_mounts")
    def _default_volume_mounts(self):
        return [{"name": "home", "mountPath": HOME_MOUNT}]

    @default("cmd")
    def _default_cmd(self):
        return [SERVER_SCRIPT]

    def get_env(self):
        """kubespawner's; and a CPU-only server's pod tells the NVIDIA container runtime to
        give it no GPU. Its images are built FROM nvidia/cuda, whose
        NVIDIA_VISIBLE_DEVICES=all the runtime honours in a container that asked the device
        plugin for nothing (where it is the default runtime, as the GPU operator sets it):
        on a GPU node such a pod saw every GPU there, unbilled and uncounted. A GPU pod's
        devices are the device plugin's to name (as the embedded shape's device_env); in
        DRA mode its claim's, which the driver's CDI spec injects whatever the variable
        says, so there it is `void` too."""
        env = KubeSpawner.get_env(self)
        choice = self.gpulease_choice
        if choice is not None and choice.profile.gpu is None:
            env.update(NO_GPU_ENV)
        elif choice is not None and self.dra_mode:
            # No device plugin names its devices: the driver's CDI spec injects them, and
            # the image's `all` must not reach a runtime that still reads the variable.
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    @property
    def spot_preempts(self) -> bool:
        """Whether kube-scheduler may preempt spot pods for on-demand ones here."""
        return bool(self.spot_priority_class and self.on_demand_priority_class)

    async def get_pod_manifest(self):
        """kubespawner's pod, with what the server's tier sets (pod_spec.tier_pod)."""
        pod = await KubeSpawner.get_pod_manifest(self)
        choice = self.gpulease_choice
        tier = tier_pod(choice.tier if choice is not None else ON_DEMAND,
                        self.on_demand_priority_class, self.spot_priority_class,
                        self.spot_grace_period,
                        choice is not None and choice.profile.gpu is not None,
                        self.cpu_only_priority_class,
                        choice.reservation_id if choice is not None else None,
                        self.tier_priority_classes)
        if tier.priority_class:
            pod.spec.priority_class_name = tier.priority_class
        pod.metadata.labels = {**(pod.metadata.labels or {}), **tier.labels}
        self._add_claims(pod)  # DRA mode: its GPUs are its claim's
        # a failed start's last lines, in its status (pod_start.termination_message)
        pod.spec.containers[0].termination_message_policy = TERMINATION_MESSAGE_POLICY
        if tier.pre_stop_sleep_s:
            notebook = pod.spec.containers[0]
            lifecycle = notebook.lifecycle or V1Lifecycle()
            lifecycle.pre_stop = V1LifecycleHandler(
                sleep=V1SleepAction(seconds=tier.pre_stop_sleep_s))
            notebook.lifecycle = lifecycle
            pod.spec.termination_grace_period_seconds = tier.termination_grace_s
        return pod

    def cluster_gpus(self) -> ClusterGpus:
        return ClusterGpus(self.mig_strategy, tuple(dict(t) for t in self.gpu_tolerations),
                           self.packing_scheduler, self.gpu_allocation)

    # --- the start --------------------------------------------------------------

    async def start(self):
        choice = self.gpulease_choice
        if choice is None:  # apply_user_options always runs first in JupyterHub >= 5.3
            self.refuse(Refusal("No profile was resolved for this start"))
        try:
            options = pod_options(choice, self.cluster_gpus())
            if self.dra_mode and choice.profile.gpu is not None:
                claim_spec(choice.profile.gpu, DraClasses())  # a model DRA cannot name
        except ValueError as e:  # a GPU model this cluster's labels cannot name
            self.refuse(Refusal(f"Cannot start {choice.profile.slug}: {e}", status=422))
        self._gpulease_admitted = False
        self.gpulease_answered_at = None
        self.gpulease_launched_at = None
        self.gpulease_admitted_at = None  # set by _admit (spawners/queueing/pending.py)
        self._gpulease_killed = False
        self._gpulease_pod_seen = None
        self._start_future = None  # kubespawner's, made for this start (its progress waits)
        await self._refuse_if_rationed(choice)
        admitted = None
        if choice.profile.gpu is not None:  # room on some node, now or from the queue
            try:
                admitted = await self._admit(choice)
            finally:
                self._gpulease_admitted = True
        self._gpulease_admitted = True
        if admitted is not None:  # never on a node whose driver is too old for the image
            options["node_affinity_required"] = avoiding(options["node_affinity_required"],
                                                         admitted.avoid)
            if admitted.pinned:  # where it goes matters to reserved units: where admitted
                options["node_affinity_required"] = only_on(
                    options["node_affinity_required"], admitted.node)
        for name, value in options.items():
            setattr(self, name, value)
        self._options_to_restore = None
        self._gpulease_starting = True
        try:
            url = await self._make_pod(choice, admitted)
            pod = self._pod()
            self._gpulease_restarts = pod_start.restarts(pod)
            launched = pod_start.launched_at(pod)
            if launched is None:  # Running and ready, so started: never seen without it
                self.log.warning("%s: its pod shows no startedAt; billed from now",
                                 self._log_name)
                launched = utcnow()
            # From its container's start the researcher's code runs (their config, .pth
            # files, startup files): billed from there, until its pod has ended.
            await self._bill_from_launch(choice, launched)
            where = urlparse(url)
            await self._await_first_answer(where.hostname, where.port, choice, admitted)
            return url
        except StartFailed as failed:
            raise await self._failed_start(choice, failed) from None
        finally:
            self._gpulease_starting = False

    async def _make_pod(self, choice: ServerChoice, admitted) -> str:
        """kubespawner's start: the home claim and the pod, made now that the start is
        admitted; returns once the pod runs (its URL). StartFailed when its notebook
        container ran and ended first (is_pod_running)."""
        running = False
        try:
            await self._ensure_claim_template(choice.profile)  # DRA mode: before its pod
            url = await KubeSpawner.start(self)
            running = True
            return url
        except ApiException as e:
            self.refuse(api_server_refusal(choice.profile.slug, e))
        finally:  # it runs (counted until the cluster watch sees its pod), or it failed
            self._release_claim_template()
            if admitted is not None:
                self._queue_runner().done(self.user.name, self.name, running=running)

    async def _make_create_pvc_request(self, pvc, request_timeout):
        try:  # kubespawner's: a 409 or a quota's 403 over a claim that exists is success
            return await KubeSpawner._make_create_pvc_request(self, pvc, request_timeout)
        except ApiException as e:
            e.gpulease_making = f"the home claim {pvc.metadata.name}"
            raise

    async def _make_create_pod_request(self, pod, request_timeout):
        # kubespawner's: a 409 deletes the pod of that name (its own self.stop) and tries
        # again, within this start: not a stop of the server (see stop)
        replacing = _IN_CREATE.set(True)
        try:
            return await KubeSpawner._make_create_pod_request(self, pod, request_timeout)
        except ApiException as e:
            e.gpulease_making = f"the pod {pod.metadata.name}"
            raise
        finally:
            _IN_CREATE.reset(replacing)

    def is_pod_running(self, pod):
        """kubespawner's; and a pod that failed before it ran ends its start at once.

        A pod the kubelet refuses (UnexpectedAdmissionError: its devices still in use,
        e.g. by a pod force-deleted a moment ago) is Failed for good, but kubespawner
        waits for it to run until start_timeout (the queue's wait and more): the user
        waited minutes for an error while the start's admission counted the free
        devices as taken. Only while this spawner's start is in flight (its poll and
        stop read the same pod).

        A pod whose notebook container already ran and ended (exited at once, or was
        restarted after exiting) fails its start as the server's own doing: billed
        from that container's start, counted (start's StartFailed)."""
        status = (pod or {}).get("status") or {}
        starting = self._start_pending and self._gpulease_admitted
        if starting and pod is not None:
            self._gpulease_pod_seen = pod
            ran = pod_start.ran_and_ended(pod)
            if ran is not None:  # its code ran and ended: the server's own failure
                raise StartFailed(f"it exited before it answered ({ran})")
        if starting and status.get("phase") == "Failed" \
                and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            slug = self.gpulease_choice.profile.slug if self.gpulease_choice else "this server"
            said = f"{status.get('reason') or 'Failed'}: {status.get('message') or 'no reason'}"
            self.refuse(Refusal(f"Cannot start {slug}: the node's kubelet refused its pod "
                                f"({said[:300]}); try again shortly.", status=503))
        return KubeSpawner.is_pod_running(self, pod)

    def _queue_runner(self) -> ClusterQueueRunner:
        runner = cluster_runner_for(self.gpulease, self.api, self.node_selector,
                                    self.cluster_gpus().tolerations, self.queue_poll_interval,
                                    namespace=self.namespace, dra=self.dra_api())
        # kube-scheduler does not preempt for DRA devices (docs/cluster.md, GPUs through DRA)
        runner.spot_yields = self.spot_preempts and not self.dra_mode
        runner.claims_preempt = self.spot_preempts and self.dra_mode  # gpulease stops them
        runner.spot_grace_s = runner.claim_preemptions.grace_s = self.spot_grace_period
        return runner

    async def _form_availability(self) -> Callable[[DeviceRequest], Availability]:
        """The start form's availability: the cluster's, as this spawner's runner sees it
        (its nodes, every pod's holds, the starts admitted and waiting), not this host's."""
        runner = self._queue_runner()
        try:
            inventory = await runner.inventory()
        except Refused as away:  # the API server away: the form says so, and still shows
            shown = unknown(away.message)
            return lambda _request: shown
        admitted = tuple(runner.unbound(inventory).values())
        waiting = tuple(t.request for t in runner.waiting)
        return lambda request: cluster_availability(request, inventory, admitted, waiting)

    _gpulease_stops: int = 0  # stops so far: a run a stop ended stays ended

    async def load_user_options(self):
        """Nothing: gpulease resolved the start's options (apply_user_options) and set the
        pod from its profile above. kubespawner's own `profile_list` is not gpulease's
        profiles, and it refused a `profile` option it does not list (a bare 500)."""

    def _run_still_ours(self) -> Callable[[], bool]:
        started, stops = self._start_future, self._gpulease_stops
        uid, restarts = getattr(self, "pod_id", None), self._gpulease_restarts

        def still_ours() -> bool:  # a stop, another start since, or its pod's end ends it
            if self._stopping or self._start_future is not started \
                    or self._gpulease_stops != stops:
                return False
            if self.pod_reflector is None:
                return True
            return pod_start.running_still(self._pod(), uid, restarts)
        return still_ours

    gpulease_launch_words = "its container's start"
    _gpulease_starting: bool = False  # launched or being made, not answered yet
    _gpulease_restarts: int = 0  # its notebook container's restarts at its launch

    async def progress(self):
        """The choice and the queue, the pod's events (scheduling, the image pull) while
        kubespawner makes it, then the moment billing started (its container's start)."""
        async for event in self._admission_progress():
            yield event
        async for event in KubeSpawner.progress(self):
            yield event
        while self._spawn_pending and self.gpulease_launched_at is None:
            await asyncio.sleep(0.05)
        event = self._billed_since_event()
        if event is not None:
            yield event

    # --- kubespawner's watches -------------------------------------------------------

    # --- the end ------------------------------------------------------------------

    async def stop(self, now=False):
        if _IN_CREATE.get():
            # kubespawner's start removing a leftover pod of the same name (a Failed one
            # from a refused start, one still terminating) before it makes this start's:
            # the start goes on, admitted and counted. Ending it here forgot the admission
            # while the start still made its pod, and its refusal check (is_pod_running).
            await KubeSpawner.stop(self, now=now)
            return
        self._stopping = True
        self._gpulease_stops += 1
        died = _IN_POLL.get()  # kubespawner's poll deleting a pod whose server ended
        # JupyterHub stops a server it waited for in vain (no answer below 500 to its own
        # check within http_timeout, though gpulease's probe had one): a failed start of
        # the server's own, its pod killed at once (KILL_GRACE_S), counted.
        failed_wait = bool(getattr(self, "_waiting_for_response", False)) and not died
        if failed_wait:
            await self._delete_pod(KILL_GRACE_S, "JupyterHub's own check had no answer")
        try:
            await KubeSpawner.stop(self, now=now)
        except BaseException:
            # The pod may still run and hold its GPUs: billed on until a poll finds it gone.
            self._stopping = False
            raise
        self._gpulease_admitted = False
        if self.gpulease_choice is not None and self.gpulease_choice.profile.gpu is not None:
            self._queue_runner().done(self.user.name, self.name)  # its pod is gone
        try:  # a death closes at the last moment it was seen alive
            if failed_wait:
                await self._end_billing("start_failed", utcnow())
                await self._count_failed_wait()
            else:
                await self._end_billing(*(("server_died", None) if died else ("user", utcnow())))
        finally:
            self._stopping = False
        await self._prune_claim_templates()

    async def poll(self):
        if self._gpulease_starting:
            # The start in flight ends this run, and closes its session, if it fails: a
            # pod whose container ended is ended here, not stopped (delete_stopped_pods)
            # nor closed as server_died.
            pod = self._pod()
            return 1 if pod is not None and pod_start.ended(pod) else None
        in_poll, stops = _IN_POLL.set(True), self._gpulease_stops
        try:
            status = await KubeSpawner.poll(self)
        finally:
            _IN_POLL.reset(in_poll)
        meter = self.gpulease.meter
        if status is None:
            if meter is not None:
                meter.mark_alive(self.user.name, self.name)
        elif not self._stopping and self._gpulease_stops == stops:  # else its stop closed it
            await self._end_billing("server_died", None)
        return status

    async def delete_forever(self):
        """Keep the home: it is the user's, shared by all their servers; deleting a
        server (or the user) never deletes it. An admin removes a claim deliberately."""
        self.log.info("keeping the home %s of %s", self.pvc_name, self._log_name)
