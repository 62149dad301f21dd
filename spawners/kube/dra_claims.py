"""What a profile asks of Kubernetes in DRA mode: its ResourceClaimTemplate, as plain data.

In DRA mode (GPUKubeSpawner.gpu_allocation = "dra") a server's pod asks for
its GPUs with a ResourceClaim made from a ResourceClaimTemplate, not with the
device plugin's extended resources. The template asks NVIDIA's DeviceClass
(full cards or MIG devices) for exactly the profile's count, with CEL
selectors over the driver's attributes (gpulease/core/model/nvidia_dra.py):
the model by its NVML product names, a slice by its MIG profile.

A template's spec is immutable and profiles change at run time, so a
template is named by a hash of its spec: an edited profile asks for a new
one, an unchanged one finds its own, and profiles asking for the same
devices share one. The adapter that makes and prunes them is
spawners/kube/dra_templates.py. Pure functions; no Kubernetes client.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gpulease.core.model import nvidia_dra as nv
from gpulease.core.model.gpu_models import NVML_PRODUCTS
from gpulease.core.model.profiles import GpuSpec

ALLOCATIONS = ("device-plugin", "dra")  # GPUKubeSpawner.gpu_allocation's values
MANAGED_LABEL = ("app.kubernetes.io/managed-by", "gpulease")
# The pod's entry in spec.resourceClaims, and the notebook container's claim.
POD_CLAIM = "gpus"
RESOURCE_API = "resource.k8s.io/v1"


@dataclass(frozen=True)
class DraClasses:
    """The DeviceClasses a cluster's GPUs are asked from (NVIDIA's chart makes these)."""

    gpu: str = nv.GPU_DEVICE_CLASS
    mig: str = nv.MIG_DEVICE_CLASS


def cel_string(text: str) -> str:
    """A CEL string literal: JSON's escapes are a subset of CEL's, so a product name
    with a quote or backslash cannot end the literal early."""
    return json.dumps(text)


def device_selectors(gpu: GpuSpec) -> list[str]:
    """CEL expressions a device must meet to serve `gpu`: its model, and its MIG profile."""
    products = NVML_PRODUCTS.get(gpu.model)
    if not products:
        raise ValueError(f"GPU model {gpu.model!r} has no NVML product names for NVIDIA's DRA "
                         f"driver's productName: known are {', '.join(sorted(NVML_PRODUCTS))}")
    attrs = f"device.attributes[{cel_string(nv.DRIVER)}]"
    names = ", ".join(cel_string(p) for p in products)
    selectors = [f"{attrs}.{nv.PRODUCT_NAME} in [{names}]"]
    if gpu.mig:
        selectors.append(f"{attrs}.{nv.MIG_PROFILE} == {cel_string(gpu.mig)}")
    return selectors


def claim_spec(gpu: GpuSpec, classes: DraClasses = DraClasses()) -> dict[str, Any]:
    """The ResourceClaim spec of a server with `gpu`: one request, exactly its count."""
    return {"devices": {"requests": [{
        "name": nv.REQUEST_NAME,
        "exactly": {
            "deviceClassName": classes.mig if gpu.mig else classes.gpu,
            "selectors": [{"cel": {"expression": e}} for e in device_selectors(gpu)],
            "allocationMode": "ExactCount",
            "count": gpu.count,
        },
    }]}}


def template_name(spec: dict[str, Any]) -> str:
    """The template's name: a hash of its spec (same spec, same name; 63 characters max)."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return f"gpulease-gpus-{digest}"


def claim_template(spec: dict[str, Any], namespace: str, profile_slug: str) -> dict[str, Any]:
    """The ResourceClaimTemplate object for `spec`, labelled as gpulease's (pruning lists
    by the label), with the profile that first asked for it in an annotation."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(spec), "namespace": namespace,
                         "labels": dict([MANAGED_LABEL]),
                         "annotations": {"gpulease.io/profile": profile_slug}},
            "spec": {"spec": spec}}


# What the API server fills in on a request's `exactly` when it is not given.
EXACTLY_DEFAULTS = {"allocationMode": "ExactCount", "count": 1}


def _pruned(value: Any) -> Any:
    """`value` without empty entries (None, [], {}), recursively."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def asks(spec: dict[str, Any]) -> Any:
    """A claim spec as a comparable value: the whole spec, with the API server's defaults
    filled in and empty fields dropped. Two specs ask for the same devices, on the same
    terms (selectors, tolerations, admin access, constraints, config), when equal."""
    filled = _pruned(spec)
    for request in (filled.get("devices") or {}).get("requests") or []:
        if "exactly" in request:
            request["exactly"] = {**EXACTLY_DEFAULTS, **request["exactly"]}
    return filled


def pod_claims(template: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(the pod's spec.resourceClaims, the notebook container's resources.claims)."""
    return ([{"name": POD_CLAIM, "resourceClaimTemplateName": template}],
            [{"name": POD_CLAIM}])


def templates_in_use(pods: list[dict]) -> set[str]:
    """Templates the pods (of every phase: a claim is made from the template when the
    pod is, and a pending pod's not yet) name in spec.resourceClaims."""
    return {c["resourceClaimTemplateName"] for p in pods
            for c in (p.get("spec") or {}).get("resourceClaims") or []
            if c.get("resourceClaimTemplateName")}
