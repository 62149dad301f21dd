"""DRA mode of GPUKubeSpawner: a server's GPUs as a ResourceClaim from a template (a mixin).

With `gpu_allocation = "dra"` a GPU server's pod asks no extended resource and
no node affinity for its model: it names its profile's ResourceClaimTemplate
(spawners/kube/dra_claims.py), made by the hub before the pod
(spawners/kube/dra_templates.py), and kube-scheduler allocates the devices
NVIDIA's DRA driver publishes. Admission, the queue and the limits count the
same profiles from the driver's ResourceSlices and the allocated claims
(gpulease/core/capacity/dra_inventory.py). The device plugin stays the default.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio.client import (
    ApiException,
    CoreV1ResourceClaim,
    ResourceV1Api,
    V1PodResourceClaim,
)
from traitlets import Unicode, validate
from traitlets.config import Configurable

from gpulease.core.model import nvidia_dra as nv
from gpulease.core.model.profiles import Profile
from gpulease.core.refusal import Refusal
from gpulease.spawners.kube.dra_claims import ALLOCATIONS, DraClasses, claim_spec, pod_claims
from gpulease.spawners.kube.dra_templates import (
    ClaimTemplates,
    ForeignTemplate,
    MissingDeviceClass,
)

_templates: dict[tuple[int, str], ClaimTemplates] = {}  # (api client, namespace) -> one each


class DraClaims(Configurable):
    """The traits and steps of DRA mode (see the module doc)."""

    gpu_allocation = Unicode(
        "device-plugin", config=True,
        help="How GPU pods ask for their devices: device-plugin (extended resources "
        "nvidia.com/gpu and nvidia.com/mig-<profile>, NVIDIA's device plugin) or dra "
        "(a ResourceClaim per server from a template per profile, NVIDIA's DRA driver "
        "for GPUs; Kubernetes 1.34 or newer). One of "
        f"{', '.join(ALLOCATIONS)}.",
    )
    dra_gpu_device_class = Unicode(
        nv.GPU_DEVICE_CLASS, config=True,
        help="DRA mode: the DeviceClass full cards are asked from (NVIDIA's chart makes "
        f"{nv.GPU_DEVICE_CLASS}).",
    )
    dra_mig_device_class = Unicode(
        nv.MIG_DEVICE_CLASS, config=True,
        help="DRA mode: the DeviceClass MIG slices are asked from (NVIDIA's chart makes "
        f"{nv.MIG_DEVICE_CLASS}).",
    )

    _gpulease_claim_template: str = ""  # this start's template, while it makes its pod

    @validate("gpu_allocation")
    def _valid_allocation(self, proposal):
        if proposal["value"] not in ALLOCATIONS:
            raise ValueError(f"GPUKubeSpawner.gpu_allocation {proposal['value']!r}: allowed "
                             f"are {', '.join(ALLOCATIONS)}")
        return proposal["value"]

    @property
    def dra_mode(self) -> bool:
        return self.gpu_allocation == "dra"

    def dra_api(self) -> ResourceV1Api | None:
        """The resource.k8s.io/v1 client on kubespawner's connection, in DRA mode."""
        return ResourceV1Api(self.api.api_client) if self.dra_mode else None

    def _claim_templates(self) -> ClaimTemplates:
        key = (id(self.api.api_client), self.namespace)
        templates = _templates.get(key)
        if templates is None:
            runner = self._queue_runner()
            namespace = self.namespace

            def pods() -> list[dict] | None:
                watch = runner.watch
                if watch is None or not watch.pods.first_list.done():
                    return None
                return [p for p in watch.pods.objects.values()
                        if p["metadata"].get("namespace") == namespace]
            templates = _templates[key] = ClaimTemplates(self.dra_api(), namespace, pods)
        return templates

    async def _ensure_claim_template(self, profile: Profile) -> None:
        """Make (or find) the profile's template before its pod; refuse clearly when the
        cluster cannot serve it."""
        self._gpulease_claim_template = ""
        if not self.dra_mode or profile.gpu is None:
            return
        spec = claim_spec(profile.gpu, DraClasses(self.dra_gpu_device_class,
                                                   self.dra_mig_device_class))
        try:
            name = await self._claim_templates().ensure(spec, profile.slug)
        except (MissingDeviceClass, ForeignTemplate) as e:
            self.refuse(Refusal(f"Cannot start {profile.slug}: {e}.", status=503))
        except ApiException as e:
            e.gpulease_making = "its ResourceClaimTemplate"
            raise
        self._gpulease_claim_template = name

    def _release_claim_template(self) -> None:
        if self._gpulease_claim_template:
            self._claim_templates().release(self._gpulease_claim_template)
            self._gpulease_claim_template = ""

    async def _prune_claim_templates(self) -> None:
        """Delete the templates no pod names any more (a profile edited, its servers gone).
        Best effort: a failure is logged and tried again at the next start or stop."""
        if not self.dra_mode:
            return
        watch = self._queue_runner().watch
        gone = f"{self.namespace}/{self.pod_name}"
        for _ in range(50):  # the pod watch may see this pod's deletion a moment after
            if watch is None or gone not in watch.pods.objects:
                break
            await asyncio.sleep(0.1)
        try:
            await self._claim_templates().prune()
        except Exception as e:  # noqa: BLE001 - never fails a start or a stop
            self.log.warning("pruning ResourceClaimTemplates failed: %s", e)

    def _add_claims(self, pod: Any) -> None:
        """The pod's claim on its template, and the notebook container's use of it."""
        if not self._gpulease_claim_template:
            return
        entries, uses = pod_claims(self._gpulease_claim_template)
        pod.spec.resource_claims = [V1PodResourceClaim(
            name=e["name"], resource_claim_template_name=e["resourceClaimTemplateName"])
            for e in entries]
        resources = pod.spec.containers[0].resources
        resources.claims = [CoreV1ResourceClaim(name=u["name"]) for u in uses]
