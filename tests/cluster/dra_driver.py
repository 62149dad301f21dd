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
"""

from __future__ import annotations

import uuid
from typing import Any

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
            nv.UUID: {"string": _uuid("GPU", f"{spec.name}.gpu.{minor}")}, **common},
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
                nv.PARENT_UUID: {"string": _uuid("GPU", f"{spec.name}.gpu.{parent}")},
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


def publish(kube: Kube, spec: GpuNode, owner: str = "") -> dict[str, Any]:
    """The driver's plugin on `spec`'s node (its Node's uid `owner`): its slice, written."""
    return kube.create(f"{RESOURCE}/resourceslices", node_slice(spec, owner=owner))


def unpublish(kube: Kube, node: str) -> None:
    """The plugin gone from `node` (its slices deleted, as the driver does on removal)."""
    listed = kube.get(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.nodeName={node}")
    for item in listed["items"]:
        kube.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")


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
    uuids = {(s["spec"]["pool"]["name"], d["name"]):
             ((d.get("attributes") or {}).get(nv.UUID) or {}).get("string", d["name"])
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
