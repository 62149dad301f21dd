"""ClaimTemplates (spawners/kube/dra_templates.py) against a stand-in of the resource.k8s.io
API's template calls: a prune never deletes a template a start is about to use, a failed
read leaves nothing held, and a template deleted between a start's 409 and its read is
made again. (On the real API server: tests/cluster/test_gpu_kube_spawner.py.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kubernetes_asyncio.client import ApiException

from gpulease.core.model.profiles import GpuSpec
from gpulease.spawners.kube.dra_claims import claim_spec
from gpulease.spawners.kube.dra_templates import ClaimTemplates

SPEC = claim_spec(GpuSpec("H200", count=2))


class StandInApi:
    """The template and DeviceClass calls ClaimTemplates makes, on a dict."""

    def __init__(self) -> None:
        self.templates: dict[str, dict] = {}
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda o: o)
        self.pause_delete: asyncio.Event | None = None
        self.fail_read: int = 0
        self.vanish_before_read = False

    async def read_device_class(self, name):
        return {"metadata": {"name": name}}

    async def create_namespaced_resource_claim_template(self, namespace, body):
        name = body["metadata"]["name"]
        if name in self.templates:
            raise ApiException(status=409)
        self.templates[name] = body

    async def read_namespaced_resource_claim_template(self, name, namespace):
        if self.fail_read:
            raise ApiException(status=self.fail_read)
        if self.vanish_before_read:
            self.vanish_before_read = False
            self.templates.pop(name, None)
        if name not in self.templates:
            raise ApiException(status=404)
        return self.templates[name]

    async def list_namespaced_resource_claim_template(self, namespace, label_selector=""):
        return SimpleNamespace(items=[SimpleNamespace(metadata=SimpleNamespace(name=n))
                                      for n in list(self.templates)])

    async def delete_namespaced_resource_claim_template(self, name, namespace):
        if self.pause_delete is not None:
            await self.pause_delete.wait()
        self.templates.pop(name, None)


async def test_a_start_during_a_prune_keeps_its_template():
    api = StandInApi()
    templates = ClaimTemplates(api, "users", lambda: [])
    name = await templates.ensure(SPEC, "two")
    templates.release(name)  # its server stopped: unused now
    api.pause_delete = asyncio.Event()
    pruning = asyncio.ensure_future(templates.prune())
    await asyncio.sleep(0.01)  # the prune decided, and waits on its delete
    starting = asyncio.ensure_future(templates.ensure(SPEC, "two"))
    await asyncio.sleep(0.01)
    api.pause_delete.set()
    assert await pruning == [name]
    assert await starting == name and name in api.templates  # made again, after the prune
    assert await templates.prune() == []  # held by the start until its pod names it


async def test_a_failed_read_holds_nothing_and_a_vanished_template_is_made_again():
    api = StandInApi()
    templates = ClaimTemplates(api, "users", lambda: [])
    name = await templates.ensure(SPEC, "two")
    templates.release(name)
    api.fail_read = 500
    with pytest.raises(ApiException):
        await templates.ensure(SPEC, "two")  # 409, then the read fails
    assert not templates.starting
    api.fail_read = 0
    api.vanish_before_read = True  # deleted between the 409 and the read
    assert await templates.ensure(SPEC, "two") == name and name in api.templates


async def test_nothing_is_pruned_before_the_pods_are_known():
    api = StandInApi()
    templates = ClaimTemplates(api, "users", lambda: None)
    templates.release(await templates.ensure(SPEC, "two"))
    assert await templates.prune() == [] and len(api.templates) == 1
