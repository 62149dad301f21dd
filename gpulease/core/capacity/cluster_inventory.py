"""The GPU inventory of the cluster shape: pure.

The API server never says which device a pod got, only how many of an
extended resource each pod requests and on which node it is bound. So the
cluster inventory is counted per node and resource: allocatable (the device
plugin's `nvidia.com/gpu` and `nvidia.com/mig-*`), minus what the pods bound
there request, with gpulease's own pods named as holders. Node facts come from
GPU feature discovery's labels (model, MIG strategy, CUDA driver version).

gpulease's admission decides on these (cluster_fit.py, cluster_offer.py). The
watch adapter that keeps these dataclasses current is separate.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpulease.core.capacity.dra_device import DraDevice
from gpulease.core.capacity.partitions import PartitionedNode, carved_rows, free_counts
from gpulease.core.model.drivers import driver_from_labels
from gpulease.core.model.gpu_models import model_key_from_gfd_product
from gpulease.core.tiers import (
    ALL_TIERS,
    ON_DEMAND,
    RESERVATION_LABEL,
    RESERVED,
    SPOT,
    TIER_LABEL,
    is_preemptible,
    yields_to,
)
from gpulease.core.units import parse_quantity

GPU_PREFIX = "nvidia.com/"
USER_LABEL = "hub.jupyter.org/username"
# kubespawner escapes the user name in the label (`a--b` is `a-b---90827a2e` there) and
# writes it as it is in this annotation: gpulease's limits and holders need the name.
USER_ANNOTATION = "hub.jupyter.org/username"
SERVER_ANNOTATION = "hub.jupyter.org/servername"
TERMINAL_PHASES = ("Succeeded", "Failed")
# A node's mig_strategy in DRA mode: its devices come from NVIDIA's DRA driver.
DRA_NODE = "dra"
_EXPONENT = re.compile(r"(\d{1,20})[eE](\d{1,2})")


def whole_count(value: object) -> int | None:
    """An extended resource's count as the API server writes it: any whole quantity
    (`2`, `1k`, `1Ki`, `1e3`; the API server keeps the form it was given), or None
    for one it should never have taken. int() of `1k` raised, and every inventory
    with such a pod in it (anyone's, in any namespace) raised with it."""
    text = str(value)
    exponent = _EXPONENT.fullmatch(text)
    if exponent:
        return int(exponent.group(1)) * 10 ** int(exponent.group(2))
    try:
        return parse_quantity(text)
    except ValueError:
        return None


def _requests(container: dict) -> Counter[str]:
    resources = container.get("resources") or {}
    wanted: Counter[str] = Counter()
    for name, value in {**(resources.get("requests") or {}),
                        **(resources.get("limits") or {})}.items():
        if name.startswith(GPU_PREFIX):
            count = whole_count(value)
            if count:
                wanted[name] += count
    return wanted


def pod_gpu_requests(spec: dict) -> Counter[str]:
    """What kube-scheduler counts a pod as holding of each nvidia.com/* resource: the sum
    of its containers and sidecars (init containers with restartPolicy Always), or the
    most any init container needs while it runs (with the sidecars started before it),
    whichever is larger (Kubernetes' PodRequests). Only the app containers were counted:
    a pod asking its GPUs in an init container held them unseen."""
    sidecars: Counter[str] = Counter()
    init_peak: Counter[str] = Counter()
    for container in spec.get("initContainers") or []:
        wanted = _requests(container)
        if container.get("restartPolicy") == "Always":
            sidecars += wanted
            init_peak = init_peak | sidecars
        else:
            init_peak = init_peak | (wanted + sidecars)
    running: Counter[str] = Counter()
    for container in spec.get("containers") or []:
        running += _requests(container)
    return (running + sidecars) | init_peak


@dataclass(frozen=True)
class ClusterNode:
    name: str
    model: str | None  # gpulease's model key, from nvidia.com/gpu.product
    mig_strategy: str  # the device plugin's: mixed | single | none
    driver: str  # GPU feature discovery's driver labels (drivers.py; "" if not labelled)
    allocatable: dict[str, int]  # nvidia.com/* resource -> count
    schedulable: bool = True  # Ready and not cordoned
    # Under the `single` strategy every nvidia.com/gpu is a slice of this
    # profile (GFD's product reads `<product>-MIG-<profile>`).
    single_profile: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    # NoSchedule / NoExecute taints: (key, value, effect)
    taints: tuple[tuple[str, str, str], ...] = ()
    # DRA mode (mig_strategy "dra"): each device of the node, from its ResourceSlices
    # (dra_inventory.py); `allocatable` counts them by kind.
    devices: tuple[DraDevice, ...] = ()
    # DynamicMIG (dra_partitions.py): its partitionable devices; `allocatable` counts,
    # per kind, how many an idle node could carve, and free() carves by the fit rule.
    partitions: PartitionedNode | None = None


@dataclass(frozen=True)
class Hold:
    """What one pod requests of a node's GPU resources ('' node: admitted, not yet bound)."""

    pod: str  # namespace/name
    node: str
    resources: dict[str, int]
    user: str = ""  # gpulease's pods only
    server: str = ""
    spot: bool = False  # a gpulease spot server's pod (tier spot)
    tier: str = ON_DEMAND  # a gpulease server's (its pod's label); others' pods: on-demand
    reservation: int | None = None  # tier reserved: the reservation whose unit it runs on
    devices: tuple[str, ...] = ()  # DRA mode: the uuids of its claim's devices
    since: str = ""  # DRA mode: its pod's start (ISO, UTC), for preempting the newest first
    leaving: bool = False  # DRA mode: its pod is being deleted or has ended (claim clearing)

    @property
    def on_tier(self) -> str:
        return SPOT if self.spot else self.tier

    @property
    def preemptible(self) -> bool:
        """A gpulease server's pod on a preemptible tier: kube-scheduler may preempt it."""
        return is_preemptible(self.on_tier)


@dataclass(frozen=True)
class ClusterInventory:
    nodes: tuple[ClusterNode, ...] = ()
    holds: tuple[Hold, ...] = ()
    # What is derived once per inventory (it never changes): "free", "index".
    _derived: dict = field(default_factory=dict, compare=False, repr=False)

    def free(self) -> dict[str, dict[str, int]]:
        """node -> resource -> free count, after the bound pods' requests; on a DynamicMIG
        node, of each kind how many could still be carved (partitions.free_counts)."""
        if "free" not in self._derived:
            free = {n.name: dict(n.allocatable) for n in self.nodes}
            carved_from = {n.name: set(n.partitions.resources()) for n in self.nodes
                           if n.partitions is not None}
            for hold in self.holds:
                room = free.get(hold.node)
                if room is not None:
                    for resource, count in hold.resources.items():
                        if resource not in carved_from.get(hold.node, ()):
                            room[resource] = room.get(resource, 0) - count
            for n in self.nodes:
                if n.partitions is not None:
                    free[n.name].update(free_counts(n.partitions, self.allocated_on(n.name)))
            self._derived["free"] = free
        return self._derived["free"]

    def allocated_on(self, node: str) -> set[str]:
        """The devices the holds on `node` name (DRA mode; partitions' keys among them)."""
        return {d for h in self.holds if h.node == node for d in h.devices}

    @property
    def partitioned(self) -> bool:
        """Whether a node has DynamicMIG devices (kinds then share its GPUs)."""
        return any(n.partitions is not None for n in self.nodes)

    def without_spot(self) -> ClusterInventory:
        """The inventory as an on-demand start sees it where spot pods yield."""
        return self.yielding_to(ON_DEMAND)

    def yielding_to(self, tier_name: str) -> ClusterInventory:
        """The inventory as a start on tier `tier_name` sees it where pods yield (their
        PriorityClass is lower): what servers of the tiers it may preempt hold counts as
        free (gpulease/core/tiers.py yields_to)."""
        key = f"yielding to {tier_name}"
        if key not in self._derived:
            self._derived[key] = ClusterInventory(
                self.nodes, tuple(h for h in self.holds if not yields_to(h.on_tier, tier_name)))
        return self._derived[key]

    def rows(self) -> list[dict]:
        """The `api/inventory` cluster form: per node, per resource, who holds how many;
        in DRA mode (a node with devices) also each device, by uuid, and its holder."""
        free = self.free()
        holders: dict[tuple[str, str], list[dict]] = defaultdict(list)
        by_device: dict[str, dict] = {}
        for hold in self.holds:
            who = _holder_row(hold)
            for resource, count in hold.resources.items():
                holders[(hold.node, resource)].append({**who, "count": count})
            for uuid in hold.devices:
                by_device[uuid] = who
        rows = []
        for n in sorted(self.nodes, key=lambda n: n.name):
            row = {"name": n.name, "model": n.model, "mig_strategy": n.mig_strategy,
                   "driver": n.driver, "schedulable": n.schedulable,
                   "resources": [{"resource": r, "allocatable": a,
                                  "free": max(free[n.name][r], 0),
                                  "holders": holders.get((n.name, r), [])}
                                 for r, a in sorted(n.allocatable.items())]}
            if n.mig_strategy == DRA_NODE:
                row["devices"] = [{"name": d.name, "uuid": d.uuid, "type": d.type,
                                   "model": d.model, "profile": d.profile,
                                   "holder": by_device.get(d.uuid)} for d in n.devices]
            if n.partitions is not None:
                row["gpus"] = carved_rows(n.partitions, self.allocated_on(n.name), by_device)
            rows.append(row)
        return rows


def _holder_row(hold: Hold) -> dict:
    """Who holds: a gpulease server ({user, server, tier[, reservation]}) or a pod."""
    if not hold.user:
        return {"pod": hold.pod}
    who: dict = {"user": hold.user, "server": hold.server, "tier": hold.on_tier}
    if hold.reservation is not None:
        who["reservation"] = hold.reservation
    return who


def _ready(obj: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in obj.get("status", {}).get("conditions", []))


def node_from_object(obj: dict) -> ClusterNode:
    """A Node object as the inventory sees it."""
    labels = obj["metadata"].get("labels", {})
    product = labels.get("nvidia.com/gpu.product", "")
    model, profile = model_key_from_gfd_product(product) if product else (None, None)
    allocatable = {name: count for name, value in
                   obj.get("status", {}).get("allocatable", {}).items()
                   if name.startswith(GPU_PREFIX) and (count := whole_count(value)) is not None}
    return ClusterNode(obj["metadata"]["name"], model,
                       labels.get("nvidia.com/mig.strategy", "none"),
                       driver_from_labels(labels), allocatable,
                       _ready(obj) and not obj.get("spec", {}).get("unschedulable", False),
                       profile, dict(labels),
                       tuple((t.get("key", ""), t.get("value", ""), t["effect"])
                             for t in obj.get("spec", {}).get("taints", [])
                             if t.get("effect") in ("NoSchedule", "NoExecute")))


def tolerated(taint: tuple[str, str, str], tolerations: Sequence[Mapping[str, str]]) -> bool:
    """Whether a pod with `tolerations` may be scheduled despite `taint` (Kubernetes' rule)."""
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == key:
                return True
        elif t.get("key") == key and t.get("value", "") == value:
            return True
    return False


def select_nodes(inventory: ClusterInventory, selector: Mapping[str, str],
                 tolerations: Sequence[Mapping[str, str]] = ()) -> ClusterInventory:
    """The nodes a server's pod may run on: those of its node selector, and of these
    the ones with a taint it does not tolerate (a node drained for maintenance)
    unschedulable. Every hold stays."""
    nodes = []
    for n in inventory.nodes:
        if not all(n.labels.get(k) == v for k, v in selector.items()):
            continue
        if n.schedulable and not all(tolerated(t, tolerations) for t in n.taints):
            n = replace(n, schedulable=False)
        nodes.append(n)
    return ClusterInventory(tuple(nodes), inventory.holds)


def hold_from_pod(pod: dict, servers_namespace: str | None = None) -> Hold | None:
    """The GPU resources a live pod requests, or None (no GPU, or it has ended)."""
    if pod.get("status", {}).get("phase") in TERMINAL_PHASES:
        return None
    wanted = pod_gpu_requests(pod["spec"])
    if not wanted:
        return None
    meta = pod["metadata"]
    return Hold(f"{meta['namespace']}/{meta['name']}", pod["spec"].get("nodeName", ""),
                dict(wanted), *pod_holder(pod, servers_namespace))


def pod_holder(pod: dict, servers_namespace: str | None = None
               ) -> tuple[str, str, bool, str, int | None]:
    """(user, server, spot, tier, reservation) of the gpulease server a pod is, or
    ("", "", False, on-demand, None) for anyone else's.

    A pod is gpulease's server (a user's, by its label) only in `servers_namespace`,
    where only the hub makes pods: anyone who may make a pod elsewhere writes its labels,
    and a forged `hub.jupyter.org/username` there would count against that user's limits
    and hide whose GPUs they are. None: every namespace's labels are believed (tests).
    The user is kubespawner's annotation (the name as it is), else its label."""
    meta = pod["metadata"]
    ours = servers_namespace is None or meta.get("namespace") == servers_namespace
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    user = (annotations.get(USER_ANNOTATION) or labels.get(USER_LABEL, "")) if ours else ""
    if not user:
        return "", "", False, ON_DEMAND, None
    tier = labels.get(TIER_LABEL, ON_DEMAND)
    if tier not in ALL_TIERS:
        tier = ON_DEMAND
    reservation = labels.get(RESERVATION_LABEL, "") if tier == RESERVED else ""
    return (user, annotations.get(SERVER_ANNOTATION, ""), tier == SPOT, tier,
            int(reservation) if reservation.isdigit() and len(reservation) < 12 else None)


Kind = tuple[str, "str | None"]  # what a request asks for: (model, MIG profile or None)


def kinds_offered(node: ClusterNode) -> list[tuple[Kind, str]]:
    """(kind, extended resource) pairs a node offers (under its MIG strategy)."""
    if node.model is None:
        return []
    if node.mig_strategy == "single":  # every nvidia.com/gpu is a slice of one profile
        gpus = "nvidia.com/gpu" in node.allocatable
        return [((node.model, node.single_profile), "nvidia.com/gpu")] if gpus else []
    offered = []
    for resource in node.allocatable:
        if resource == "nvidia.com/gpu":
            offered.append(((node.model, None), resource))
        elif resource.startswith("nvidia.com/mig-"):
            offered.append(((node.model, resource.removeprefix("nvidia.com/mig-")), resource))
    return offered
