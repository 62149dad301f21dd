"""One pool of bench/placement_real.py: gpulease's queue in front of one kube-scheduler.

A Lane holds the pool's requests as gpulease's cluster admission does: the
queue (gpulease/core/capacity/cluster_queue.py plan_cluster, the real function), the pods
made and not yet bound (given room first), the bound pods' holds per node
(gpulease/core/capacity/cluster_inventory.py). Its pods are made and deleted through a pool
of threads, each with its own kept-alive HTTPS connection to the API server;
a watch of the lane's namespace reports bindings and deletions. All its state
is changed by the bench's one loop (`step`), from an inbox the threads fill.
"""

from __future__ import annotations

import heapq
import http.client
import json
import queue
import ssl
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, Hold
from gpulease.core.capacity.cluster_queue import plan_cluster
from gpulease.core.capacity.queue import Waiting
from gpulease.core.model.device_request import DeviceRequest

MODEL = "H200"
SLICES = {"1g.18gb": 1, "2g.35gb": 2, "3g.71gb": 3}  # compute slices of 7 per GPU
CPU_PER_GPU_M, MEMORY_PER_GPU_GI = 24000, 224  # a card's share of a 224-CPU, 2 TiB node
PLAN_EVERY_S = 0.05  # at most 20 queue passes a second per lane (it is CPU on a shared box)


@dataclass(frozen=True)
class Request:
    id: int
    t: float  # arrival, s after the start
    mig: str | None  # MIG profile, or None for `count` whole cards
    count: int
    duration: float  # s, from its start (binding)

    @property
    def slices(self) -> int:
        return SLICES[self.mig] if self.mig else 7 * self.count

    @property
    def kind(self) -> str:
        return "mig" if self.mig else "full"

    @property
    def label(self) -> str:
        return self.mig or f"{self.count} GPU" + ("s" if self.count > 1 else "")

    @property
    def resource(self) -> str:
        return f"nvidia.com/mig-{self.mig}" if self.mig else "nvidia.com/gpu"

    def device_request(self) -> DeviceRequest:
        return DeviceRequest(MODEL, self.mig, 1 if self.mig else self.count)


class Api:
    """Kept-alive connections to the API server as its admin, one per thread."""

    def __init__(self, server: str, ca: str, pki: Path):
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname, url.port
        self.context = ssl.create_default_context(cafile=ca)
        self.context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.local = threading.local()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.context, timeout=30)
            try:
                conn.request(method, path, body=json.dumps(body) if body is not None else None,
                             headers={"Content-Type": "application/json",
                                      "Accept": "application/json",
                                      "User-Agent": "gpulease-placement-bench"})
                answer = conn.getresponse()
                return answer.status, json.loads(answer.read() or b"{}")
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def pod_body(request: Request, scheduler: str, pool: str) -> dict:
    share = request.slices / 7  # of a GPU's cpu and memory
    extended = {request.resource: str(1 if request.mig else request.count)}
    spec: dict = {
        "containers": [{"name": "c", "image": "never-run", "resources": {
            "requests": {"cpu": f"{int(CPU_PER_GPU_M * share)}m",
                         "memory": f"{int(MEMORY_PER_GPU_GI * 1024 * share)}Mi", **extended},
            "limits": extended}}],
        "nodeSelector": {"gpulease.test/pool": pool},
        "terminationGracePeriodSeconds": 0}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": f"r{request.id}"}, "spec": spec}


@dataclass
class Lane:
    name: str
    scheduler: str  # "" = the default scheduler
    namespace: str
    pool: str  # the nodes' gpulease.test/pool label
    nodes: tuple[ClusterNode, ...]
    kinds: dict[str, str]  # node -> "mig" | "full"
    api: Api
    max_wait: float
    inbox: queue.Queue = field(default_factory=queue.Queue)
    workers: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(6))
    waiting: dict[int, Request] = field(default_factory=dict)  # in arrival order
    fresh: set[int] = field(default_factory=set)  # arrived since the last queue pass
    queued: set[int] = field(default_factory=set)  # waited in the queue at least one pass
    admitted: dict[int, Request] = field(default_factory=dict)  # pod made, not bound
    admitted_at: dict[int, float] = field(default_factory=dict)  # s after the start
    holds: dict[int, Hold] = field(default_factory=dict)  # bound, until seen gone
    bound_at: dict[int, float] = field(default_factory=dict)  # started (within the wait)
    ends: list[tuple[float, int]] = field(default_factory=list)
    gave_up: set[int] = field(default_factory=set)
    free_samples: list[tuple[int, int]] = field(default_factory=list)
    unscheduled: int = 0  # made, yet not bound within a max wait of it: given up
    dirty: bool = False
    planned_at: float = -1.0
    stopped: threading.Event = field(default_factory=threading.Event)
    measured: list[Request] = field(default_factory=list)
    capacity: dict[str, int] = field(default_factory=dict)
    at_once_share: float = 0.0
    kind_acceptance: dict[str, float] = field(default_factory=dict)
    bind_lags: list[float] = field(default_factory=list)  # s from a pod's create to its binding

    def arrive(self, request: Request) -> None:
        self.waiting[request.id] = request
        self.fresh.add(request.id)
        self.dirty = True

    def _post(self, method: str, path: str, body: dict | None, what: tuple) -> None:
        def call() -> None:
            status, answer = self.api.request(method, path, body)
            if status >= 400 and status != 404:
                self.inbox.put(("refused", *what, status, answer.get("message", "")))
        self.workers.submit(call)

    def _delete(self, rid: int) -> None:
        self._post("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/r{rid}",
                   {"gracePeriodSeconds": 0}, ("delete", rid))

    def step(self, now: float) -> None:
        while True:
            try:
                event = self.inbox.get_nowait()
            except queue.Empty:
                break
            self._handle(event, now)
        for rid, request in list(self.waiting.items()):  # oldest first: stop at the young
            if now - request.t <= self.max_wait:
                break
            del self.waiting[rid]
            self.gave_up.add(rid)
        for rid in list(self.admitted):  # as kubespawner's start_timeout would end it
            if now - self.admitted_at[rid] > self.max_wait:
                del self.admitted[rid]
                self.gave_up.add(rid)
                self.unscheduled += 1
                self._delete(rid)
                self.dirty = True
        while self.ends and self.ends[0][0] <= now:
            _, rid = heapq.heappop(self.ends)
            self._delete(rid)  # its hold goes when the watch sees the pod gone
        if self.dirty and now - self.planned_at >= PLAN_EVERY_S:
            self._plan(now)

    def _handle(self, event: tuple, now: float) -> None:
        what, rid = event[0], event[1]
        if what == "bound" and rid in self.admitted:
            request = self.admitted.pop(rid)
            self.bound_at[rid] = event[3]
            self.holds[rid] = Hold(f"{self.namespace}/r{rid}", event[2],
                                   {request.resource: request.device_request().count})
            heapq.heappush(self.ends, (event[3] + request.duration, rid))
        elif what == "gone":
            if self.holds.pop(rid, None):
                self.dirty = True
        elif what == "refused":
            print(f"  {self.name}: {event[0]} r{rid} refused: {event[2]} {event[3]}", flush=True)
            if self.admitted.pop(rid, None):
                self.gave_up.add(rid)

    def _plan(self, now: float) -> None:
        self.planned_at, self.dirty = now, False
        inventory = ClusterInventory(self.nodes, tuple(self.holds.values()))
        queue_now = [Waiting(rid, r.device_request()) for rid, r in self.waiting.items()]
        plan = plan_cluster(queue_now, inventory,
                            [r.device_request() for r in self.admitted.values()])
        for rid, _node in plan.start:
            request = self.waiting.pop(rid)
            self.admitted[rid] = request
            self.admitted_at[rid] = now
            self._post("POST", f"/api/v1/namespaces/{self.namespace}/pods",
                       pod_body(request, self.scheduler, self.pool), ("create", rid))
        self.queued |= self.fresh & set(self.waiting)
        self.fresh.clear()

    def sample(self) -> None:
        used = {h.node for h in self.holds.values()}
        free = [n.name for n in self.nodes if n.name not in used]
        self.free_samples.append((sum(self.kinds[n] == "full" for n in free),
                                  sum(self.kinds[n] == "mig" for n in free)))

    def stop(self) -> None:
        self.stopped.set()
        self.workers.shutdown(wait=True)

    def outcomes(self) -> dict:
        return {"bound_at": self.bound_at, "queued": sorted(self.queued),
                "gave_up": sorted(self.gave_up)}


def watch_lane(kube, lane: Lane, start: float) -> threading.Thread:
    """Report each of the lane's pods bound ("bound", id, node, t since `start`, monotonic)
    and gone ("gone", id)."""
    path = f"/api/v1/namespaces/{lane.namespace}/pods"

    def follow() -> None:
        seen: set[str] = set()
        version = kube.get(path)["metadata"]["resourceVersion"]
        while not lane.stopped.is_set():
            try:
                for event in kube.watch(path, version, timeout=60):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = kube.get(path)["metadata"]["resourceVersion"]
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    rid = int(name[1:])
                    if event["type"] == "DELETED":
                        lane.inbox.put(("gone", rid))
                    elif obj["spec"].get("nodeName") and name not in seen:
                        seen.add(name)
                        now = time.monotonic() - start
                        if rid in lane.admitted_at:
                            lane.bind_lags.append(now - lane.admitted_at[rid])
                        lane.inbox.put(("bound", rid, obj["spec"]["nodeName"], now))
            except Exception as e:  # noqa: BLE001 - the stream broke: watch again
                print(f"  {lane.name}: watch again after {e}", flush=True)
                time.sleep(0.2)
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread
