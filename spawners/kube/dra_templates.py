"""ClaimTemplates: the hub's ResourceClaimTemplates in DRA mode, made and pruned (an adapter).

Each start in DRA mode ensures its profile's template (spawners/kube/dra_claims.py
names it by its spec's hash) before its pod is made; a template no pod of the
servers' namespace names, and no start of this hub is about to use, is
deleted. The hub is the only maker of these templates (one replica, as
JupyterHub), so the starts in flight here are all there are. A start holds its
template until its pod runs (kubespawner's start returns), long after the pod
watch saw the pod made; pruning waits for that watch's first list (a hub just
restarted knows no pod yet).

It also checks, once, that the cluster has the DeviceClass a template asks
for: without NVIDIA's DRA driver installed a pod would wait Pending for ever,
and the researcher is told at once instead.

A template of its name that exists already (a create answered 409) is read
and used only if it is gpulease's and asks for exactly the profile's devices.

Rights (spawners/kube/rbac.py): resourceclaimtemplates create, get, list,
delete in the servers' namespace; deviceclasses get.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable

from kubernetes_asyncio.client import ApiException, ResourceV1Api

from gpulease.spawners.kube.dra_claims import (
    MANAGED_LABEL,
    asks,
    claim_template,
    templates_in_use,
)

log = logging.getLogger("gpulease.cluster")


class MissingDeviceClass(Exception):
    """The cluster has no DeviceClass of that name: NVIDIA's DRA driver is not installed."""


class ForeignTemplate(Exception):
    """A template of gpulease's name exists that is not the one gpulease would make."""


class ClaimTemplates:
    def __init__(self, api: ResourceV1Api, namespace: str,
                 pods: Callable[[], Iterable[dict] | None]):
        self.api = api
        self.namespace = namespace
        # every pod of the servers' namespace, as watched now; None: not listed yet
        self.pods = pods
        self.starting: Counter[str] = Counter()  # templates of starts in flight here
        self._lock = asyncio.Lock()  # ensure and prune, one at a time
        self._classes_seen: set[str] = set()

    async def ensure(self, spec: dict, profile_slug: str) -> str:
        """The template for `spec`, made if missing; held for a start until `release`.

        Under the same lock as `prune`: a prune that decided a template unused cannot
        delete it between a start finding it and that start's pod naming it."""
        template = claim_template(spec, self.namespace, profile_slug)
        name = template["metadata"]["name"]
        for request in spec["devices"]["requests"]:
            await self._check_class(request["exactly"]["deviceClassName"])
        async with self._lock:
            self.starting[name] += 1
            try:
                await self._make_or_check(template, spec)
            except BaseException:
                self.release(name)
                raise
        return name

    async def _make_or_check(self, template: dict, spec: dict) -> None:
        name = template["metadata"]["name"]
        for _ in range(2):  # a template deleted between a 409 and its read: make it again
            try:
                await self.api.create_namespaced_resource_claim_template(self.namespace,
                                                                         template)
                log.info("made the ResourceClaimTemplate %s", name)
                return
            except ApiException as e:
                if e.status != 409:
                    raise
            try:
                await self._check_existing(name, spec)  # 409: one of that name exists
                return
            except ApiException as e:
                if e.status != 404:
                    raise

    async def _check_existing(self, name: str, spec: dict) -> None:
        """The template of our name that exists must be ours, asking for exactly `spec`:
        its name is a hash, not a lock, and anyone able to make templates in the servers'
        namespace could have made one of that name asking for more."""
        found = self.api.api_client.sanitize_for_serialization(
            await self.api.read_namespaced_resource_claim_template(name, self.namespace))
        key, value = MANAGED_LABEL
        ours = (found.get("metadata") or {}).get("labels", {}).get(key) == value
        if not ours or asks((found.get("spec") or {}).get("spec") or {}) != asks(spec) or (
                (found.get("spec") or {}).get("metadata")):
            raise ForeignTemplate(
                f"the ResourceClaimTemplate {name} in namespace {self.namespace} was not "
                "made by gpulease for this profile (it asks for other devices); an "
                "administrator must delete it")

    def release(self, name: str) -> None:
        """A start that ensured `name` made its pod (which now names it) or gave up."""
        self.starting[name] -= 1
        if self.starting[name] <= 0:
            del self.starting[name]

    async def prune(self) -> list[str]:
        """Delete gpulease's templates no pod names and no start here is about to use."""
        async with self._lock:
            pods = self.pods()
            if pods is None:
                return []  # the pods are not known yet: nothing is known unused
            key, value = MANAGED_LABEL
            listed = await self.api.list_namespaced_resource_claim_template(
                self.namespace, label_selector=f"{key}={value}")
            keep = templates_in_use(list(pods)) | set(self.starting)
            deleted = []
            for item in listed.items:
                name = item.metadata.name
                if name in keep:
                    continue
                try:
                    await self.api.delete_namespaced_resource_claim_template(name,
                                                                             self.namespace)
                    deleted.append(name)
                except ApiException as e:
                    if e.status != 404:
                        raise
        if deleted:
            log.info("deleted unused ResourceClaimTemplates: %s", ", ".join(deleted))
        return deleted

    async def _check_class(self, name: str) -> None:
        if name in self._classes_seen:
            return
        try:
            await self.api.read_device_class(name)
        except ApiException as e:
            if e.status == 404:
                raise MissingDeviceClass(
                    f"the cluster has no DeviceClass {name!r}: NVIDIA's DRA driver is not "
                    "installed, or GPUKubeSpawner.dra_gpu_device_class or dra_mig_device_class "
                    "names another (docs/deploy.md, GPUs through DRA)") from None
            raise
        self._classes_seen.add(name)
