"""A test double of NVIDIA's DRA driver for GPUs: what it publishes, not how.

The real driver (kubernetes-sigs/dra-driver-nvidia-gpu) is a kubelet plugin on
each GPU node: it reads NVML, publishes the node's full GPUs and MIG devices in
one ResourceSlice (its pool named after the node), and when the kubelet
prepares a pod's claim it writes the CDI spec that puts the devices' nodes in
the container. Its Helm chart installs the DeviceClasses. There are no GPUs
here, so this double writes what the driver would: `node_slice` the slice a
node of a GpuNode shape has (device names, attributes and capacity as the
driver writes them, names from gpulease/core/model/nvidia_dra.py),
`device_classes` the chart's classes, and `publish` both to the API server;
`prepare` is its answer to the kubelet's NodePrepareResources. The kubelet
emulator calls it and stands for the CDI injection: it hands a pod the uuids
of the devices allocated to its claims in DRA_DEVICES_ENV.

A node published here has no nvidia.com/* capacity on its Node object (no
device plugin serves it: the driver and the device plugin must never serve
the same GPUs).

A `dynamic_mig` node is published as the driver's DynamicMIG mode does on
Kubernetes >= 1.35 (driver.go generateSplitResourceSlices, partitions.go): one
pool named after the node, of one slice holding only `sharedCounters` (a
counter set per GPU) and one slice per GPU holding only its `devices` (the
full GPU and every placement of every MIG profile, sorted by name), each
consuming counters of its GPU's set; `pool_slices` writes them, from
gpulease/core/model/mig_geometry.py's placements. Its MIG devices have no uuid
until a claim is prepared (the driver creates the MIG device then).
"""

from __future__ import annotations

import uuid
from typing import Any

from gpulease.core.model import mig_geometry as geo
from gpulease.core.model import nvidia_dra as nv
from gpulease.core.model.gpu_models import GPU_MEMORY, NVML_PRODUCTS, mig_memory_bytes
from tests.cluster.kube import Kube, KubeError
from tests.cluster.nodes import COMPUTE, GpuNode
from tests.cluster.pod_plan import DRA_DEVICES_ENV, PlanError  # noqa: F401 - tests read it

RESOURCE = "/apis/resource.k8s.io/v1"
MIG_SLICES_PER_GPU = 7
# GPU-instance profile ids (NVML's) by compute slices, for the devices' names.
GI_PROFILE_IDS = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}


def _uuid(kind: str, seed: str) -> str:
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_DNS, seed)}"


def _common(spec: GpuNode) -> dict[str, dict[str, Any]]:
    major, minor = COMPUTE.get(spec.model, (9, 0))
    return {nv.PRODUCT_NAME: {"string": NVML_PRODUCTS.get(spec.model, (spec.model,))[0]},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper" if major == 9 else "Ampere"},
            "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
            nv.DRIVER_VERSION: {"version": spec.driver},
            "cudaDriverVersion": {"version": f"{spec.cuda_runtime}.0"}}


def devices(spec: GpuNode) -> list[dict[str, Any]]:
    """The node's devices as the driver publishes them: `spec.gpus` whole GPUs, then GPUs
    in MIG mode carrying `spec.mig`'s slices (filled in order, seven compute slices a GPU;
    a GPU in MIG mode is published only as its MIG devices)."""
    out: list[dict[str, Any]] = []
    common = _common(spec)
    for minor in range(spec.gpus):
        out.append({"name": f"gpu-{minor}", "attributes": {
            nv.TYPE: {"string": nv.TYPE_GPU},
            nv.UUID: {"string": gpu_uuid(spec.name, minor)}, **common},
            "capacity": {"memory": {"value": str(GPU_MEMORY.get(spec.model, 0))}}})
    parent, used = spec.gpus, 0
    for profile, count in sorted(spec.mig.items()):
        slices = int(profile.split("g.", 1)[0])
        for n in range(count):
            if used + slices > MIG_SLICES_PER_GPU:
                parent, used = parent + 1, 0
            name = (f"gpu-{parent}-mig-{profile.replace('.', '').replace('+', '-')}-"
                    f"{GI_PROFILE_IDS.get(slices, 0)}-{used}")
            out.append({"name": name, "attributes": {
                nv.TYPE: {"string": nv.TYPE_MIG},
                nv.UUID: {"string": _uuid("MIG", f"{spec.name}.{profile}.{n}")},
                nv.PARENT_UUID: {"string": gpu_uuid(spec.name, parent)},
                nv.MIG_PROFILE: {"string": profile}, **common},
                "capacity": {"multiprocessors": {"value": str(slices * 16)},
                             "memory": {"value": str(mig_memory_bytes(profile))}}})
            used += slices
    return out


def node_slice(spec: GpuNode, generation: int = 1, owner: str = "") -> dict[str, Any]:
    """The node's one ResourceSlice (pool: the node's name); owned by the Node (uid
    `owner`), as the driver's are, so that it goes with the Node."""
    owners = [{"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": owner,
               "controller": True}] if owner else []
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{spec.name}-{nv.DRIVER}-{generation}",
                         "ownerReferences": owners},
            "spec": {"driver": nv.DRIVER, "nodeName": spec.name,
                     "pool": {"name": spec.name, "generation": generation,
                              "resourceSliceCount": 1},
                     "devices": devices(spec)}}


def _binary_si(value: int) -> str:
    """A count as the driver's resource.NewQuantity(n, BinarySI) serializes it: plain below
    1024, else in the largest power-of-1024 unit that divides it ("141Gi", "18048Mi")."""
    if abs(value) < 1024:
        return str(value)
    suffix = ""
    for unit in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
        if value % 1024:
            break
        value, suffix = value // 1024, unit
    return f"{value}{suffix}"


def _camel(dns_name: str) -> str:
    """A capacity's name (CommonCapacitiesMig: `copyEngines`) from its counter's (the driver
    derives the counter by camelToDNSName: `copy-engines`)."""
    first, *rest = dns_name.split("-")
    return first + "".join(word.title() for word in rest)


def _counters(model: str, profile: str | None, memory_slices: range) -> dict[str, Any]:
    """What a device consumes (or, for the full GPU, the counter set holds): a counter per
    capacity and one per memory slice of its placement, in Go's JSON order (sorted keys)."""
    values = {**geo.capacities(model, profile),
              **{geo.memory_slice_counter(i): 1 for i in memory_slices}}
    return {name: {"value": _binary_si(n)} for name, n in sorted(values.items())}


def _capacity(model: str, profile: str | None) -> dict[str, Any]:
    """A device's capacity (CommonCapacitiesMig's names; the full GPU's are its counter
    set's values, which the driver takes as the largest of its profiles')."""
    return {_camel(name): {"value": _binary_si(n)}
            for name, n in sorted(geo.capacities(model, profile).items())}


def gpu_uuid(node: str, minor: int) -> str:
    return _uuid("GPU", f"{node}.gpu.{minor}")


def dynamic_mig_uuid(node: str, device: str) -> str:
    """The uuid of the MIG device the driver creates when it prepares a claim for `device`
    (made up, but stable: the same placement prepared twice is the same device here)."""
    return _uuid("MIG", f"{node}.{device}")


def dynamic_gpu_devices(spec: GpuNode, minor: int) -> list[dict[str, Any]]:
    """GPU `minor`'s devices in DynamicMIG mode, sorted by name as the driver lists them:
    the full GPU (with its uuid; it consumes the whole counter set) and every placement of
    every MIG profile (no uuid: the MIG device does not exist until it is prepared)."""
    common = _common(spec)
    counter_set = geo.counter_set_name(minor)
    whole = range(geo.MEMORY_SLICES)
    out = [{"name": f"gpu-{minor}",
            "attributes": {nv.TYPE: {"string": nv.TYPE_GPU},
                           nv.UUID: {"string": gpu_uuid(spec.name, minor)}, **common},
            "capacity": _capacity(spec.model, None),
            "consumesCounters": [{"counterSet": counter_set,
                                  "counters": _counters(spec.model, None, whole)}]}]
    for profile, places in geo.placements(spec.model).items():
        for place in places:
            out.append({
                "name": geo.device_name(minor, place),
                "attributes": {nv.TYPE: {"string": nv.TYPE_MIG},
                               nv.PARENT_UUID: {"string": gpu_uuid(spec.name, minor)},
                               nv.MIG_PROFILE: {"string": profile}, **common},
                "capacity": _capacity(spec.model, profile),
                "consumesCounters": [{"counterSet": counter_set, "counters": _counters(
                    spec.model, profile, place.memory_slices)}]})
    return sorted(out, key=lambda d: d["name"])


def pool_slices(spec: GpuNode, generation: int = 1, owner: str = "") -> list[dict[str, Any]]:
    """The node's ResourceSlices, all of one pool named after it: `node_slice` alone, or
    for a `dynamic_mig` node the split slices (counter sets first, then a slice per GPU).

    The real resourceslice controller names each slice `<node>-<driver>-` plus a random
    suffix, so on a real node the GPUs' slices sort in any order, and that order (slices by
    name) is the order the allocator tries the GPUs in. Here the names are
    `<node>-<driver>-<generation>-<index:02d>`, which sort in GPU order, so that a test can
    name the GPU a first fit lands on; gpulease reads whatever order the names give."""
    if not spec.dynamic_mig:
        return [node_slice(spec, generation, owner)]
    owners = [{"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": owner,
               "controller": True}] if owner else []
    sets = [{"name": geo.counter_set_name(minor),
             "counters": _counters(spec.model, None, range(geo.MEMORY_SLICES))}
            for minor in range(spec.gpus)]
    contents = [{"sharedCounters": sets}] + [{"devices": dynamic_gpu_devices(spec, minor)}
                                             for minor in range(spec.gpus)]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{spec.name}-{nv.DRIVER}-{generation}-{index:02d}",
                          "ownerReferences": owners},
             "spec": {"driver": nv.DRIVER, "nodeName": spec.name,
                      "pool": {"name": spec.name, "generation": generation,
                               "resourceSliceCount": len(contents)},
                      **content}}
            for index, content in enumerate(contents)]


def device_classes() -> list[dict[str, Any]]:
    """The chart's GPU DeviceClasses (full cards with their extended resource name, MIG)."""
    def selector(kind: str) -> list[dict]:
        return [{"cel": {"expression": f"device.driver == '{nv.DRIVER}' && "
                                       f"device.attributes['{nv.DRIVER}'].type == '{kind}'"}}]
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": nv.GPU_DEVICE_CLASS},
         "spec": {"selectors": selector(nv.TYPE_GPU),
                  "extendedResourceName": nv.EXTENDED_RESOURCE_NAME}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": nv.MIG_DEVICE_CLASS}, "spec": {"selectors": selector(nv.TYPE_MIG)}},
    ]


def install(kube: Kube) -> None:
    """The driver's chart: its DeviceClasses (once per cluster)."""
    for cls in device_classes():
        try:
            kube.create(f"{RESOURCE}/deviceclasses", cls)
        except KubeError as e:
            if e.status != 409:
                raise


def publish(kube: Kube, spec: GpuNode, owner: str = "") -> list[dict[str, Any]]:
    """The driver's plugin on `spec`'s node (its Node's uid `owner`): its slices, written."""
    return [kube.create(f"{RESOURCE}/resourceslices", s)
            for s in pool_slices(spec, owner=owner)]


def unpublish(kube: Kube, node: str) -> None:
    """The plugin gone from `node` (its slices deleted, as the driver does on removal)."""
    listed = kube.get(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.nodeName={node}")
    for item in listed["items"]:
        kube.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")


def device_uuid(pool: str, device: dict) -> str:
    """The uuid the driver's CDI spec names for a published device: its uuid attribute; for a
    DynamicMIG placement (none) the MIG device prepared for it; else its name."""
    given = ((device.get("attributes") or {}).get(nv.UUID) or {}).get("string")
    if given:
        return given
    kind = ((device.get("attributes") or {}).get(nv.TYPE) or {}).get("string")
    if kind == nv.TYPE_MIG and device.get("consumesCounters"):
        return dynamic_mig_uuid(pool, device["name"])  # the pool is named after the node
    return device["name"]


def prepare(kube: Kube, pod: dict) -> list[str]:
    """The driver's NodePrepareResources, as the kubelet calls it before a pod's containers
    start: the uuids of the devices allocated to the pod's claims (whose nodes its CDI spec
    would put in the container). A claim not allocated, or not reserved for this pod, fails
    the start, as the kubelet does (PlanError UnexpectedAdmissionError)."""
    meta = pod["metadata"]
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses")
    if statuses is None:  # the watch event may predate the controller's status patch
        fresh = kube.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
        statuses = (fresh.get("status") or {}).get("resourceClaimStatuses") or []
    names = {s["name"]: s.get("resourceClaimName") for s in statuses}
    slices = kube.get(f"{RESOURCE}/resourceslices")["items"]
    uuids = {(s["spec"]["pool"]["name"], d["name"]): device_uuid(s["spec"]["pool"]["name"], d)
             for s in slices for d in s["spec"].get("devices") or []}
    found: list[str] = []
    for entry in pod["spec"]["resourceClaims"]:
        name = entry.get("resourceClaimName") or names.get(entry["name"])
        if not name:
            raise PlanError("UnexpectedAdmissionError",
                            f"claim {entry['name']!r} has no ResourceClaim yet")
        claim = kube.get(f"{RESOURCE}/namespaces/{meta['namespace']}/resourceclaims/{name}")
        status = claim.get("status") or {}
        if meta["uid"] not in {r.get("uid") for r in status.get("reservedFor") or []}:
            raise PlanError("UnexpectedAdmissionError",
                            f"ResourceClaim {name} is not reserved for this pod")
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results")
        found += [uuids.get((r["pool"], r["device"]), r["device"]) for r in results or []
                  if r.get("driver") == nv.DRIVER]
    return found
