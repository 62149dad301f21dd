"""GPU Node objects as the NVIDIA device plugin and GPU feature discovery publish them.

A Node here has the capacity the device plugin advertises — `nvidia.com/gpu`
for whole cards, `nvidia.com/mig-<profile>` per MIG profile under the `mixed`
strategy — and GFD's labels (product, memory, count, MIG strategy, CUDA driver
and runtime versions, per-profile MIG facts). Its device IDs, which the
kubelet emulator hands to pods, are in the `gpulease.test/devices` annotation.
kwok keeps it Ready (it carries kwok's `kwok.x-k8s.io/node=fake` annotation;
a `bind_only` node carries `=bind-only`: kwok keeps it Ready, but nothing runs
its pods, which stay bound and Pending, for scheduling tests).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from gpulease.core.model.gpu_models import (
    GFD_PRODUCTS,
    GPU_MEMORY,
    mig_compute_slices,
    mig_memory_bytes,
)
from tests.cluster.components import BIND_ONLY_NODE_ANNOTATION, EMULATED_NODE_ANNOTATION
from tests.cluster.pod_plan import DEVICES_ANNOTATION

MiB = 1024**2
COMPUTE = {"H200": (9, 0), "H100-80GB": (9, 0), "A100-80GB": (8, 0), "A100-40GB": (8, 0),
           "L40S": (8, 9)}
FAMILY = {9: "hopper", 8: "ampere"}
SMS_PER_SLICE = {"H200": 16, "H100-80GB": 16, "A100-80GB": 14, "A100-40GB": 14}


@dataclass(frozen=True)
class GpuNode:
    name: str
    model: str = "H200"
    gpus: int = 0  # whole cards (nvidia.com/gpu)
    mig: dict[str, int] = field(default_factory=dict)  # MIG profile -> slices on this node
    cpu: str = "64"
    memory: str = "512Gi"
    driver: str = "570.133.20"
    cuda_runtime: str = "12.8"
    product: str = ""  # GFD's product value; default: the model's first board
    bind_only: bool = False  # no kubelet emulator: its pods are bound, never run
    # NVIDIA's DRA driver serves its GPUs (tests/cluster/dra_driver.py publishes them):
    # no device plugin, so no nvidia.com/* capacity on the Node
    dra: bool = False
    # Its `gpus` GPUs are published in NVIDIA's DynamicMIG mode (each as a counter set, the
    # full GPU and every MIG placement; dra_driver.pool_slices): needs `dra=True`
    dynamic_mig: bool = False


def _device_id(kind: str, node: str, n: int) -> str:
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{kind}.{n}')}"


def node_object(spec: GpuNode) -> dict:
    """The Node (metadata, labels, capacity) a real GPU node of this shape would have."""
    major, minor, revision = spec.driver.split(".")
    rt_major, rt_minor = spec.cuda_runtime.split(".")
    compute = COMPUTE.get(spec.model, (9, 0))
    labels = {
        "kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "type": "kwok",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec.product or GFD_PRODUCTS.get(spec.model, (spec.model,))[0],
        "nvidia.com/gpu.memory": str(GPU_MEMORY.get(spec.model, 0) // MiB),
        "nvidia.com/gpu.count": str(spec.gpus + (1 if spec.mig else 0)),
        "nvidia.com/gpu.family": FAMILY.get(compute[0], "unknown"),
        "nvidia.com/gpu.compute.major": str(compute[0]),
        "nvidia.com/gpu.compute.minor": str(compute[1]),
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.mode": "compute",
        "nvidia.com/mig.strategy": "mixed" if spec.mig else "none",
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": spec.driver,
        "nvidia.com/cuda.runtime-version.major": rt_major,
        "nvidia.com/cuda.runtime-version.minor": rt_minor,
        "nvidia.com/cuda.runtime-version.full": spec.cuda_runtime,
        # Deprecated, still emitted by GFD.
        "nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": revision,
        "nvidia.com/cuda.runtime.major": rt_major, "nvidia.com/cuda.runtime.minor": rt_minor,
    }
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110",
                "ephemeral-storage": "1Ti"}
    devices: dict[str, list[str]] = {}
    if spec.gpus:
        capacity["nvidia.com/gpu"] = str(spec.gpus)
        devices["nvidia.com/gpu"] = [_device_id("GPU", spec.name, n) for n in range(spec.gpus)]
    for profile, count in sorted(spec.mig.items()):
        resource = f"nvidia.com/mig-{profile}"
        capacity[resource] = str(count)
        devices[resource] = [_device_id("MIG", spec.name + profile, n) for n in range(count)]
        slices = mig_compute_slices(profile)
        prefix = f"nvidia.com/mig-{profile}"
        labels.update({
            f"{prefix}.count": str(count),
            f"{prefix}.memory": str(mig_memory_bytes(profile) // MiB),
            f"{prefix}.multiprocessors": str(slices * SMS_PER_SLICE.get(spec.model, 16)),
            f"{prefix}.slices.gi": str(slices), f"{prefix}.slices.ci": str(slices),
            f"{prefix}.engines.copy": str(slices), f"{prefix}.engines.decoder": str(slices),
        })
    if spec.dra:
        capacity = {k: v for k, v in capacity.items() if not k.startswith("nvidia.com/")}
        devices = {}
    key, value = BIND_ONLY_NODE_ANNOTATION if spec.bind_only else EMULATED_NODE_ANNOTATION
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels,
                     "annotations": {key: value, DEVICES_ANNOTATION: json.dumps(devices),
                                     "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
