"""bench/dynamic_mig.py's reduced run on the real kube-scheduler: DynamicMIG against a fixed layout.

The test control plane (tests/cluster/controlplane.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler 1.36, kwok) with two pools side by
side, each one bind-only kwok node (kwok keeps it Ready; nothing runs its
pods: a start is the pod's claim allocated and the pod bound) whose GPUs the
test double of NVIDIA's DRA driver (tests/cluster/dra_driver.py) publishes:

- dynamic: GpuNode(gpus=N, dra=True, dynamic_mig=True): a counter set per GPU
  and the full GPU and every MIG placement as devices consuming it (the
  driver's split slices, by name in GPU order); the real allocator carves;
- fixed: GpuNode(mig={profile: count}, dra=True): the layout's slices as static
  MIG devices. The double fills them onto GPUs in profile order, seven compute
  slices a GPU, so the parent GPU it names may differ from the layout's; the
  allocator only counts a static node's devices (no counters), so any layout
  is expressed exactly by its per-profile counts, which is what is published.

A request's pod asks for a ResourceClaim from a ResourceClaimTemplate of its
profile (spawners/kube/dra_claims.py claim_spec: class mig.nvidia.com, CEL on
productName and device.attributes['gpu.nvidia.com'].profile), as gpulease's
DRA mode does; the controller-manager makes each claim and removes it with its
pod. In front of each pool gpulease's queue decides when a pod is made:
cluster_queue.plan_cluster over the inventory read from the API server
(dra_inventory: the Node, its ResourceSlices, the namespace's claims and
pods), the pods made but not bound yet given room first. Every tick the same
arrivals are offered to both pools. A request still in the queue after its
patience gives up; a pod made but not bound within the patience is deleted and
given up (as kubespawner's start timeout would); a started pod is deleted when
its duration is up. Polled, not watched: pods are listed before claims, so a
pod seen bound has its claim's allocation in the same tick's inventory (the
scheduler writes the allocation before it binds).
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.dynamic_mig_trace import MODEL, SOLD, Request
from bench.placement_real_lane import Api
from gpulease.core.capacity.cluster_queue import plan_cluster
from gpulease.core.capacity.dra_inventory import dra_inventory
from gpulease.core.capacity.queue import Waiting
from gpulease.core.model.profiles import GpuSpec
from spawners.kube.dra_claims import claim_spec, claim_template, pod_claims, template_name
from tests.cluster import dra_driver
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.nodes import GpuNode, node_object

RESOURCE = "/apis/resource.k8s.io/v1"
TICK_S = 0.05  # the loop's pause between ticks (a tick lists and plans both pools)


@dataclass
class RealLane:
    """One pool: its node, gpulease's queue in front, what became of each request."""

    name: str
    namespace: str
    pool: str
    spec: GpuNode
    api: Api
    patience: float
    templates: dict[str, str] = field(default_factory=dict)  # profile -> template name
    node_objects: list[dict] = field(default_factory=list)
    slices: list[dict] = field(default_factory=list)
    waiting: dict[int, Request] = field(default_factory=dict)  # arrival order
    admitted: dict[int, float] = field(default_factory=dict)  # pod made, not bound: when
    requests: dict[int, Request] = field(default_factory=dict)
    bound_at: dict[int, float] = field(default_factory=dict)  # s after the start
    ends: list[tuple[float, int]] = field(default_factory=list)
    gave_up: set[int] = field(default_factory=set)
    unscheduled: int = 0  # made, not bound within the patience: deleted
    refused: int = 0  # plan_cluster's `never` (no node could ever run it)
    passes: int = 0

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        status, answer = self.api.request(method, path, body)
        if status >= 400 and not (method == "DELETE" and status == 404):
            raise RuntimeError(f"{self.name}: {method} {path}: {status} "
                               f"{answer.get('message', '')}")
        return answer

    def set_up(self) -> None:
        self._call("POST", "/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        for profile in SOLD:
            spec = claim_spec(GpuSpec(MODEL, profile))
            self._call("POST", f"{RESOURCE}/namespaces/{self.namespace}/resourceclaimtemplates",
                       claim_template(spec, self.namespace, profile))
            self.templates[profile] = template_name(spec)
        obj = node_object(self.spec)
        obj["metadata"]["labels"][POOL_LABEL] = self.pool
        node = self._call("POST", "/api/v1/nodes", obj)
        for s in dra_driver.pool_slices(self.spec, owner=node["metadata"]["uid"]):
            self._call("POST", f"{RESOURCE}/resourceslices", s)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until kwok has the node Ready and untainted; then its Node and slices are read
        once (nothing changes them during the run)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = self._call("GET", f"/api/v1/nodes/{self.spec.name}")
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in node.get("status", {}).get("conditions", []))
            if ready and not node["spec"].get("taints"):
                self.node_objects = [node]
                self.slices = [s for s in self._call("GET", f"{RESOURCE}/resourceslices")["items"]
                               if s["spec"].get("nodeName") == self.spec.name]
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: node {self.spec.name} not Ready within {timeout} s")

    def arrive(self, request: Request) -> None:
        self.waiting[request.id] = request
        self.requests[request.id] = request

    def _delete(self, rid: int) -> None:
        self._call("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/r{rid}",
                   {"gracePeriodSeconds": 0})

    def step(self, now: float) -> None:
        pods = self._call("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        claims = self._call("GET", f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims")
        for pod in pods:
            rid = int(pod["metadata"]["name"][1:])
            if pod["spec"].get("nodeName") and rid in self.admitted:
                del self.admitted[rid]
                self.bound_at[rid] = now
                heapq.heappush(self.ends, (now + self.requests[rid].duration, rid))
        for rid, request in list(self.waiting.items()):  # oldest first
            if now - request.arrived <= self.patience:
                break
            del self.waiting[rid]
            self.gave_up.add(rid)
        for rid, made in list(self.admitted.items()):
            if now - made > self.patience:
                del self.admitted[rid]
                self.gave_up.add(rid)
                self.unscheduled += 1
                pod = next((p for p in pods if p["metadata"]["name"] == f"r{rid}"), {})
                why = [c.get("message", "") for c in (pod.get("status") or {}).get(
                    "conditions", []) if c.get("type") == "PodScheduled"]
                print(f"  {self.name}: r{rid} ({self.requests[rid].profile}) admitted "
                      f"{now - made:.1f} s ago, not bound: {why or 'no condition yet'}",
                      flush=True)
                self._delete(rid)
        while self.ends and self.ends[0][0] <= now:
            self._delete(heapq.heappop(self.ends)[1])
        if self.waiting:
            self._plan(now, pods, claims["items"])

    def _plan(self, now: float, pods: list[dict], claims: list[dict]) -> None:
        inventory = dra_inventory(self.node_objects, self.slices, claims, pods)
        plan = plan_cluster([Waiting(rid, r.device_request()) for rid, r in self.waiting.items()],
                            inventory,
                            [self.requests[rid].device_request() for rid in self.admitted])
        self.passes += 1
        for rid, _why in plan.never:
            del self.waiting[rid]
            self.gave_up.add(rid)
            self.refused += 1
        for rid, _node in plan.start:
            request = self.waiting.pop(rid)
            self.admitted[rid] = now
            claims_of_pod, container_claims = pod_claims(self.templates[request.profile])
            self._call("POST", f"/api/v1/namespaces/{self.namespace}/pods", {
                "metadata": {"name": f"r{rid}"},
                "spec": {"nodeSelector": {POOL_LABEL: self.pool},
                         "resourceClaims": claims_of_pod,
                         "containers": [{"name": "c", "image": "never-run", "resources": {
                             "requests": {"cpu": "100m", "memory": "128Mi"},
                             "claims": container_claims}}],
                         "terminationGracePeriodSeconds": 0}})

    def tear_down(self) -> None:
        self._call("DELETE", f"/api/v1/namespaces/{self.namespace}/pods",
                   {"gracePeriodSeconds": 0})
        self._call("DELETE", f"/api/v1/namespaces/{self.namespace}")
        self._call("DELETE", f"/api/v1/nodes/{self.spec.name}")  # its slices go with it

    def gpu_hours(self, time_scale: float) -> float:
        """GPU-time started, in the trace's hours (durations are compressed by time_scale)."""
        return sum(self.requests[rid].gpus * self.requests[rid].duration
                   for rid in self.bound_at) * time_scale / 3600


def replay(plane: ControlPlane, requests: Sequence[Request], gpus: int,
           fixed_counts: dict[str, int], patience: float) -> dict[str, RealLane]:
    """Offer `requests` (compressed: arrival and duration in real seconds) to a DynamicMIG
    node of `gpus` GPUs and a static one of `fixed_counts` slices, side by side."""
    api = Api(plane.state["server"], plane.state["ca"], plane.root / "pki")
    dra_driver.install(plane.admin())
    tag = uuid.uuid4().hex[:4]
    lanes = {}
    for name, spec in (
            ("dynamic", GpuNode(f"mig-dynamic-{tag}", gpus=gpus, dra=True, dynamic_mig=True,
                                bind_only=True)),
            ("fixed", GpuNode(f"mig-fixed-{tag}", mig=dict(fixed_counts), dra=True,
                              bind_only=True))):
        lanes[name] = RealLane(name, f"bench-mig-{name}-{tag}", f"bench-mig-{name}-{tag}", spec,
                               api, patience)
        lanes[name].set_up()
    try:
        for lane in lanes.values():
            lane.wait_ready()
        start = time.monotonic()
        end = max((r.arrived for r in requests), default=0.0) + patience + 1
        following = 0
        while (now := time.monotonic() - start) < end:
            while following < len(requests) and requests[following].arrived <= now:
                for lane in lanes.values():
                    lane.arrive(requests[following])
                following += 1
            for lane in lanes.values():
                lane.step(now)
            time.sleep(TICK_S)
    finally:
        for lane in lanes.values():
            lane.tear_down()
    return lanes
