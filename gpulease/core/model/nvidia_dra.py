"""NVIDIA's DRA driver for GPUs, as gpulease relies on it: the one table of its facts.

Kubernetes' Dynamic Resource Allocation (`resource.k8s.io/v1`, GA since 1.34)
lets a driver publish devices in ResourceSlices and pods ask for them with
ResourceClaims. NVIDIA's driver (kubernetes-sigs/dra-driver-nvidia-gpu)
publishes each full GPU and each MIG device of a node as a device of driver
`gpu.nvidia.com`, with the attributes below; its Helm chart installs the
DeviceClasses. gpulease asks for a profile's devices with CEL selectors over
these attributes (spawners/kube/dra_claims.py) and counts capacity from the
slices (gpulease/core/capacity/dra_inventory.py). Every name either of them
uses is here, so that a change of the driver is a change of this file.

Read from the driver's source at commit 9593204 (2026-08, vendoring Kubernetes
1.36.0): cmd/gpu-kubelet-plugin/main.go (the driver name), deviceinfo.go,
mig.go and nvlib.go (attributes, device names, static MIG), driver.go (one
slice per node, its pool named after the node), and the chart's
templates/deviceclass-{gpu,mig}.yaml. In the default static-MIG mode a GPU
with MIG enabled publishes only its MIG devices, each carrying its parent's
productName and driverVersion; version attributes are semver ("9.0.0").
"""

from __future__ import annotations

DRIVER = "gpu.nvidia.com"

# DeviceClasses of the driver's chart: full GPUs (`device.attributes['gpu.nvidia.com']
# .type == 'gpu'`, extendedResourceName nvidia.com/gpu) and MIG devices (type 'mig').
GPU_DEVICE_CLASS = "gpu.nvidia.com"
MIG_DEVICE_CLASS = "mig.nvidia.com"
# A pod asking for this extended resource is served by the gpu class's devices (the
# scheduler makes a claim for it), where the cluster enables DRAExtendedResource.
EXTENDED_RESOURCE_NAME = "nvidia.com/gpu"

# Device attributes (a slice writes them unqualified; CEL reads them qualified by the
# driver: device.attributes['gpu.nvidia.com'].productName).
TYPE = "type"  # "gpu" | "mig" (others, e.g. the IMEX channels of other classes, are not sold)
UUID = "uuid"
PRODUCT_NAME = "productName"  # NVML's name, e.g. "NVIDIA H200" (gpu_models.NVML_PRODUCTS)
DRIVER_VERSION = "driverVersion"  # a version attribute, e.g. "580.95.5"
MIG_PROFILE = "profile"  # MIG devices: e.g. "1g.18gb"
PARENT_UUID = "parentUUID"  # MIG devices: the full GPU they are carved from
TYPE_GPU = "gpu"
TYPE_MIG = "mig"

# A ResourceSlice holds at most this many devices where devices use shared counters
# (the MIG partitions of issue 46): a node's devices then span several slices of one
# pool, and only the pool's newest generation counts.
MAX_DEVICES_PER_SLICE_WITH_COUNTERS = 64

# The generated claims' annotation naming the pod's claim entry (the resourceclaim
# controller's), and the request name gpulease's templates use.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
REQUEST_NAME = "gpus"
